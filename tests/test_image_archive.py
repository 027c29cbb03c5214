"""Reading an image archive's tags and labels (issue 32) and `render --check
--image-archive` warning when it does not hold what the manifests run from this checkout.

The archives here are written by the test in the two formats the readers accept (the
layouts of `docker save` and of an OCI image layout); tests/test_image_container.py reads
the one the build script really writes."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from inferplane import __version__
from inferplane.cli.main import _register_commands, app
from inferplane.deploy.image_archive import (
    REVISION_LABEL,
    VERSION_LABEL,
    ArchivedImage,
    archive_warnings,
    checkout_revision,
    read_archive,
)
from inferplane.deploy.images import PROJECT_IMAGE
from inferplane.errors import InferplaneError

REPO = Path(__file__).resolve().parent.parent


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def _config(labels: dict[str, str]) -> bytes:
    return json.dumps({"architecture": "amd64", "os": "linux",
                       "config": {"User": "10001:10001", "Labels": labels}}).encode()  # fmt: skip


def docker_archive(path: Path, tags: list[str], labels: dict[str, str]) -> Path:
    with tarfile.open(path, "w") as tar:
        _add(tar, "abc.json", _config(labels))
        _add(tar, "manifest.json", json.dumps(
            [{"Config": "abc.json", "RepoTags": tags, "Layers": []}]).encode())
    return path


def oci_archive(path: Path, ref: str, labels: dict[str, str]) -> Path:
    def blob(tar: tarfile.TarFile, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        _add(tar, f"blobs/sha256/{digest}", data)
        return f"sha256:{digest}"

    with tarfile.open(path, "w") as tar:
        config = blob(tar, _config(labels))
        manifest = blob(tar, json.dumps({"schemaVersion": 2, "config": {"digest": config},
                                         "layers": []}).encode())  # fmt: skip
        _add(tar, "index.json", json.dumps({"schemaVersion": 2, "manifests": [
            {"digest": manifest, "annotations": {"org.opencontainers.image.ref.name": ref}}]})
            .encode())  # fmt: skip
        _add(tar, "oci-layout", b'{"imageLayoutVersion": "1.0.0"}')
    return path


LABELS = {VERSION_LABEL: __version__, REVISION_LABEL: "abc123"}


def test_both_archive_formats_give_tags_and_labels(tmp_path: Path) -> None:
    docker = read_archive(docker_archive(tmp_path / "d.tar", [PROJECT_IMAGE], LABELS))
    assert docker == ArchivedImage(tags=(PROJECT_IMAGE,), labels=LABELS)
    oci = read_archive(oci_archive(tmp_path / "o.tar", PROJECT_IMAGE, LABELS))
    assert oci == ArchivedImage(tags=(PROJECT_IMAGE,), labels=LABELS)


def test_what_is_not_an_image_archive_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "text").write_text("hello")
    with tarfile.open(tmp_path / "empty.tar", "w") as tar:
        _add(tar, "README", b"x")
    with tarfile.open(tmp_path / "broken.tar", "w") as tar:
        _add(tar, "manifest.json", b"[]")
    for name, words in (("missing", "cannot read"), ("text", "cannot read"),
                        ("empty.tar", "not an image archive"), ("broken.tar", "broken")):
        with pytest.raises(InferplaneError) as err:
            read_archive(tmp_path / name)
        assert err.value.field == "--image-archive" and words in err.value.message
        assert err.value.fix and "build-image.sh" in err.value.fix


def test_warnings_for_version_revision_and_tags() -> None:
    held = ArchivedImage(tags=(PROJECT_IMAGE,), labels=LABELS)
    assert archive_warnings(held, "a.tar", [PROJECT_IMAGE], "abc123") == []
    assert archive_warnings(held, "a.tar", [PROJECT_IMAGE], None) == []  # not a checkout
    (stale,) = archive_warnings(held, "a.tar", [PROJECT_IMAGE], "def456")
    assert "abc123" in stale and "def456" in stale and "Fix:" in stale
    (other,) = archive_warnings(held, "a.tar", ["ghcr.io/inferplane/inferplane:0.0.9"],
                                "abc123")  # fmt: skip
    assert "0.0.9" in other and PROJECT_IMAGE in other
    untagged = archive_warnings(held, "a.tar", ["ghcr.io/inferplane/inferplane"], "abc123")
    assert len(untagged) == 1  # `latest` is not what the archive holds
    old = ArchivedImage(tags=(PROJECT_IMAGE,), labels={VERSION_LABEL: "0.0.9"})
    (version,) = archive_warnings(old, "a.tar", [PROJECT_IMAGE], None)
    assert "'0.0.9'" in version and __version__ in version


def test_checkout_revision_is_git_head_or_none(tmp_path: Path) -> None:
    import subprocess

    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True)  # fmt: skip
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    got = checkout_revision(REPO)
    assert got is not None and got.removesuffix("-dirty") == head.stdout.strip()
    assert checkout_revision(tmp_path) is None


def test_render_check_reads_the_archive(tmp_path: Path) -> None:
    _register_commands()
    runner = CliRunner()
    text = (REPO / "examples" / "demo.yaml").read_text().replace(
        "source: ../tests/", f"source: {REPO}/tests/")
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(text)
    out = tmp_path / "out"
    done = runner.invoke(app, ["render", str(fleet), "--target", "compose", "--out", str(out)])
    assert done.exit_code == 0, done.output
    revision = checkout_revision() or "abc123"
    good = docker_archive(tmp_path / "good.tar", [PROJECT_IMAGE],
                          {VERSION_LABEL: __version__, REVISION_LABEL: revision})
    checked = runner.invoke(app, ["render", "--check", str(out), "--json",
                                  "--image-archive", str(good)])  # fmt: skip
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.output)["warnings"] == []
    mine = docker_archive(tmp_path / "mine.tar", ["registry.example.com/inferplane:1"],
                          {VERSION_LABEL: __version__, REVISION_LABEL: "0" * 40})
    checked = runner.invoke(app, ["render", "--check", str(out), "--json",
                                  "--image-archive", str(mine)])  # fmt: skip
    assert checked.exit_code == 0, checked.output  # warnings, not failures
    warnings = json.loads(checked.output)["warnings"]
    assert any("registry.example.com/inferplane:1" in w and PROJECT_IMAGE in w
               for w in warnings)  # fmt: skip
    if checkout_revision() is not None:
        assert any("0" * 40 in w for w in warnings)
    bad = runner.invoke(app, ["render", "--check", str(out), "--image-archive",
                              str(tmp_path / "nope.tar")])  # fmt: skip
    assert isinstance(bad.exception, InferplaneError)  # main() turns it into exit 2
    assert bad.exception.field == "--image-archive"
    alone = runner.invoke(app, ["render", str(fleet), "--out", str(out), "--image-archive",
                                str(good)])  # fmt: skip
    assert isinstance(alone.exception, InferplaneError) and "--check" in str(alone.exception)
