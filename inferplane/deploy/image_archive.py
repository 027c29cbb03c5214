"""What an image archive (`scripts/build-image.sh --archive`) says it holds, and whether
that matches the rendered manifests and this checkout.

The archive is a `docker-archive` tarball (`docker save`, `buildah push docker-archive:`)
or an `oci-archive` (an OCI image layout in a tar). Its image config carries the OCI labels
the build script sets: `org.opencontainers.image.version` (the package version) and
`org.opencontainers.image.revision` (git HEAD, `-dirty` when the image's sources had
uncommitted changes). `render --check DIR --image-archive FILE` warns when the manifests
name a tag of ours the archive does not hold, or the archive was built from another
version or revision than this checkout.
"""

from __future__ import annotations

import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferplane import __version__
from inferplane.errors import InferplaneError

VERSION_LABEL = "org.opencontainers.image.version"
REVISION_LABEL = "org.opencontainers.image.revision"
_FIX = "give a file written by `scripts/build-image.sh --archive FILE` (or docker save)"


@dataclass(frozen=True)
class ArchivedImage:
    """The image in an archive: its tags (repository:tag) and its config labels."""

    tags: tuple[str, ...]
    labels: dict[str, str]


def _json_member(tar: tarfile.TarFile, name: str) -> Any:
    member = tar.extractfile(name)
    if member is None:
        raise KeyError(name)
    return json.loads(member.read())


def _oci_blob(tar: tarfile.TarFile, digest: str) -> Any:
    algorithm, _, value = digest.partition(":")
    return _json_member(tar, f"blobs/{algorithm}/{value}")


def read_archive(path: Path) -> ArchivedImage:
    """The (first) image in a docker-archive or oci-archive tarball."""
    try:
        with tarfile.open(path) as tar:
            names = set(tar.getnames())
            if "manifest.json" in names:  # docker-archive
                entry = _json_member(tar, "manifest.json")[0]
                config = _json_member(tar, entry["Config"])
                tags = tuple(entry.get("RepoTags") or ())
            elif "index.json" in names:  # oci-archive
                index = _json_member(tar, "index.json")
                descriptor = index["manifests"][0]
                manifest = _oci_blob(tar, descriptor["digest"])
                config = _oci_blob(tar, manifest["config"]["digest"])
                name = descriptor.get("annotations", {}).get("org.opencontainers.image.ref.name")
                tags = (name,) if name else ()
            else:
                raise InferplaneError("not an image archive (no manifest.json or index.json)",
                                      field="--image-archive", value=str(path), fix=_FIX)
    except (OSError, tarfile.TarError) as exc:
        raise InferplaneError(f"cannot read the image archive: {exc}", field="--image-archive",
                              value=str(path), fix=_FIX) from exc
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise InferplaneError(f"a broken image archive ({exc!r} missing or invalid)",
                              field="--image-archive", value=str(path), fix=_FIX) from exc
    labels = (config.get("config") or {}).get("Labels") or {}
    return ArchivedImage(tags=tags, labels={str(k): str(v) for k, v in labels.items()})


def checkout_revision(directory: Path | None = None) -> str | None:
    """git HEAD of the checkout inferplane runs from (None outside a git checkout), with
    `-dirty` as the build script writes it."""
    where = directory or Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)  # fmt: skip
        if head.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "-C", str(where), "status", "--porcelain", "--",
             "pyproject.toml", "README.md", "inferplane", "Dockerfile"],
            capture_output=True, text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    dirty = "-dirty" if status.returncode == 0 and status.stdout.strip() else ""
    return head.stdout.strip() + dirty


def archive_warnings(archive: ArchivedImage, where: str, rendered: list[str],
                     revision: str | None) -> list[str]:  # fmt: skip
    """Why the archived image is not what the rendered manifests (`rendered`: our image
    references found there) should run from this checkout (at `revision`)."""
    from inferplane.deploy.images import split_image

    warnings: list[str] = []
    fix = "Fix: rebuild it from this checkout (scripts/build-image.sh --archive FILE)"
    version = archive.labels.get(VERSION_LABEL)
    if version != __version__:
        warnings.append(f"{where}: the archived image has {VERSION_LABEL}={version!r}, this "
                        f"checkout is inferplane {__version__}. {fix}")
    built_from = archive.labels.get(REVISION_LABEL)
    if revision is not None and built_from != revision:
        warnings.append(f"{where}: the archived image was built from revision {built_from!r}, "
                        f"this checkout is at {revision}. {fix}")
    held = set(archive.tags)
    for image in rendered:
        tagged = image if split_image(image)[1] else f"{image}:latest"
        if tagged not in held:
            warnings.append(f"{where}: the manifests run {image}, the archive holds "
                            f"{', '.join(sorted(held)) or 'no tag'}. Fix: build the archive "
                            "with that tag, or render with --gateway-image naming its tag")
    return warnings


def checked_archive_warnings(path: Path, directory: Path) -> list[str]:
    """`render --check DIR --image-archive FILE`: the archive's warnings against the images
    rendered under `directory` that are ours (the project repository, or a repository the
    archive has a tag of) and against this checkout's revision."""
    from inferplane.deploy.images import PROJECT_REPOSITORY, rendered_images, split_image

    archive = read_archive(path)
    repositories = {PROJECT_REPOSITORY, *(split_image(tag)[0] for tag in archive.tags)}
    ours = sorted({image for _, image in rendered_images(directory)
                   if split_image(image)[0] in repositories})  # fmt: skip
    return archive_warnings(archive, path.name, ours, checkout_revision())
