"""The gateway image built and run for real (issue 32), with no Docker daemon and no
registry: `scripts/build-image.sh` (buildah on a debootstrap base), its docker-archive
loaded by `podman load` into an empty store, and the gateway and a simulated engine run
from that loaded image with `buildah run` (chroot isolation, the host's network).

Marked `image` (not in the default run): it needs root, buildah, podman and debootstrap
(`.ci/run` installs them) and builds for minutes. With INFERPLANE_TEST_IMAGE_ARCHIVE (and
INFERPLANE_TEST_IMAGE_SBOM) naming what `build-image.sh --archive/--sbom` wrote, it tests
that build instead of building again.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferplane import __version__
from inferplane.deploy.image_archive import REVISION_LABEL, VERSION_LABEL, checkout_revision
from inferplane.deploy.images import PROJECT_IMAGE

pytestmark = pytest.mark.image
REPO = Path(__file__).resolve().parent.parent
IMAGE_UID = 10001  # the Dockerfile's USER


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(docker-archive, SBOM directory) of the image built from this checkout."""
    missing = [t for t in ("buildah", "podman", "debootstrap") if not shutil.which(t)]
    if os.geteuid() != 0:
        missing.insert(0, "root")
    if missing:  # asked for with -m image: a missing tool is a failure, not a skip
        pytest.fail(f"the image test needs {', '.join(missing)}. Fix: run it as root after "
                    "apt-get install buildah podman debootstrap crun")
    given = os.environ.get("INFERPLANE_TEST_IMAGE_ARCHIVE")
    if given:
        return Path(given), Path(os.environ.get("INFERPLANE_TEST_IMAGE_SBOM", ""))
    out = tmp_path_factory.mktemp("image")
    subprocess.run(["bash", str(REPO / "scripts" / "build-image.sh"), "--archive",
                    str(out / "image.tar"), "--sbom", str(out / "sbom")],
                   check=True, env={**os.environ, "BUILDER": "buildah"}, timeout=1500)  # fmt: skip
    return out / "image.tar", out / "sbom"


@pytest.fixture(scope="module")
def store(built: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Storage flags of a fresh container store holding only the loaded archive."""
    root = tmp_path_factory.mktemp("store")
    flags = ["--root", str(root / "root"), "--runroot", str(root / "run"),
             "--storage-driver", "vfs"]  # fmt: skip
    loaded = subprocess.run(["podman", *flags, "load", "-i", str(built[0])],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert loaded.returncode == 0, loaded.stdout + loaded.stderr
    assert PROJECT_IMAGE in loaded.stdout
    return flags


def test_the_loaded_archive_has_our_labels_user_and_entry_point(store: list[str]) -> None:
    out = subprocess.run(["podman", *store, "image", "inspect", PROJECT_IMAGE],
                         capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
    config = json.loads(out.stdout)[0]["Config"]
    labels = config["Labels"]
    assert labels[VERSION_LABEL] == __version__
    assert labels["org.opencontainers.image.source"].startswith("https://")
    revision = checkout_revision()
    if revision is not None:
        assert labels[REVISION_LABEL] == revision
    assert config["User"] == f"{IMAGE_UID}:{IMAGE_UID}"
    assert config["Entrypoint"] == ["inferplane"]


def test_the_sbom_lists_what_the_image_runs(built: tuple[Path, Path]) -> None:
    report = json.loads((built[1] / "pip-inspect.json").read_text())
    installed = {d["metadata"]["name"].lower(): d["metadata"]["version"]
                 for d in report["installed"]}  # fmt: skip
    assert installed["inferplane"] == __version__
    assert "opentelemetry-sdk" in installed  # the tracing extra
    assert "fastapi" in installed or "starlette" in installed or "uvicorn" in installed
    debian = (built[1] / "dpkg.txt").read_text().splitlines()
    assert any(line.startswith("python3.11=") for line in debian)


class _InImage:
    """One command run from the image in its own working container (`buildah run`)."""

    def __init__(self, store: list[str], argv: list[str], log: Path) -> None:
        self.store = store
        self.ctr = subprocess.run(["buildah", *store, "from", "--quiet", PROJECT_IMAGE],
                                  capture_output=True, text=True, check=True,
                                  timeout=300).stdout.strip()  # fmt: skip
        self.log = log
        self.proc = subprocess.Popen(
            ["buildah", *store, "run", "--isolation", "chroot", self.ctr, "--", *argv],
            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                break
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                continue
        subprocess.run(["buildah", *self.store, "rm", self.ctr], capture_output=True,
                       timeout=120)  # fmt: skip


def _pids_with(argument: str) -> list[int]:
    """Host processes whose command line has `argument` (the image's processes run in
    the host's process table: chroot isolation)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argument.encode() in argv and b"/opt/inferplane/bin/inferplane" in argv:
            pids.append(int(entry.name))
    return pids


def _uids(pid: int) -> list[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("Uid:"))
    return [int(v) for v in line.split()[1:]]


def _wait_healthy(url: str, runs: _InImage, deadline_s: float = 180.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if runs.proc.poll() is not None:
            pytest.fail(f"exited {runs.proc.returncode}:\n{runs.output()}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"{url} not healthy after {deadline_s} s:\n{runs.output()}")


@pytest.fixture
def fleet(store: list[str], tmp_path: Path) -> Iterator[tuple[str, _InImage, _InImage]]:
    """`inferplane sim` and `inferplane gateway` in front of it, both from the image."""
    sim_port, gw_port = _free_port(), _free_port()
    sim = _InImage(store, ["inferplane", "sim", "--model", "m", "--host", "127.0.0.1",
                           "--port", str(sim_port)], tmp_path / "sim.log")  # fmt: skip
    gateway = None
    try:
        _wait_healthy(f"http://127.0.0.1:{sim_port}/health", sim)
        gateway = _InImage(store, ["inferplane", "gateway", "--backend",
                                   f"m=http://127.0.0.1:{sim_port}", "--no-tenancy",
                                   "--host", "127.0.0.1", "--port", str(gw_port)],
                           tmp_path / "gateway.log")  # fmt: skip
        _wait_healthy(f"http://127.0.0.1:{gw_port}/health", gateway)
        yield f"http://127.0.0.1:{gw_port}", sim, gateway
    finally:
        if gateway is not None:
            gateway.stop()
        sim.stop()


def test_the_gateway_from_the_image_answers_through_a_simulated_engine(
    fleet: tuple[str, _InImage, _InImage],
) -> None:
    url, _, gateway = fleet
    reply = httpx.post(f"{url}/v1/chat/completions", timeout=60.0, json={
        "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["choices"][0]["message"]["content"] and body["usage"]["completion_tokens"] > 0
    health = httpx.get(f"{url}/health", timeout=10.0)
    assert health.status_code == 200
    metrics = httpx.get(f"{url}/metrics", timeout=10.0)
    assert metrics.status_code == 200 and "inferplane_" in metrics.text
    port = url.rsplit(":", 1)[1]
    pids = _pids_with(port)
    assert pids, f"no inferplane process with --port {port} on the host:\n{gateway.output()}"
    for pid in pids:  # real, effective, saved and filesystem uid
        assert _uids(pid) == [IMAGE_UID] * 4, (pid, _uids(pid))


def test_render_check_finds_the_archive_built_from_this_checkout(
    built: tuple[Path, Path], tmp_path: Path,
) -> None:
    text = (REPO / "examples" / "demo.yaml").read_text().replace(
        "source: ../tests/", f"source: {REPO}/tests/")
    (tmp_path / "fleet.yaml").write_text(text)
    cli = [str(REPO / ".venv" / "bin" / "inferplane")]
    if not Path(cli[0]).exists():
        cli = ["inferplane"]
    subprocess.run([*cli, "render", str(tmp_path / "fleet.yaml"), "--target", "k8s",
                    "--out", str(tmp_path / "out")], check=True, timeout=300)  # fmt: skip
    checked = subprocess.run([*cli, "render", "--check", str(tmp_path / "out"), "--json",
                              "--image-archive", str(built[0])],
                             capture_output=True, text=True, timeout=600)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert json.loads(checked.stdout)["warnings"] == []
