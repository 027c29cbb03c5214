"""The gateway image: what this checkout builds (the repository's Dockerfile), and which
rendered image references point at a tag of ours that nothing builds.

`inferplane render` defaults to `PROJECT_IMAGE` (`ghcr.io/inferplane/inferplane:VERSION`,
the package version, the tag `scripts/build-image.sh` gives the Dockerfile's image); the
fleet file's `gateway.image` or `--gateway-image` replace it. `render --check` warns (it
does not fail) on a `ghcr.io/inferplane/inferplane` reference with another tag, or none:
that image was built by another version of inferplane, or by nobody.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inferplane import __version__

PROJECT_REPOSITORY = "ghcr.io/inferplane/inferplane"
PROJECT_IMAGE = f"{PROJECT_REPOSITORY}:{__version__}"


def split_image(image: str) -> tuple[str, str | None]:
    """(repository, tag or None); a digest (`@sha256:...`) counts as a tag."""
    if "@" in image:
        repo, digest = image.split("@", 1)
        return repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo, digest
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = image.rsplit(":", 1)
        return repo, tag
    return image, None


def image_warning(image: str, where: str) -> str | None:
    """Why `image` (found at `where`) is not an image this checkout builds, or None."""
    repo, tag = split_image(image)
    if repo != PROJECT_REPOSITORY or tag == __version__:
        return None
    got = f"tag {tag!r}" if tag else "no tag (latest)"
    return (
        f"{where}: image {image} has {got}, but this checkout builds {PROJECT_IMAGE} "
        "(Dockerfile). Fix: build and push it (scripts/build-image.sh), or render with "
        "--gateway-image / gateway.image naming the image you built"
    )


def _images(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "image" and isinstance(value, str):
                yield value
            else:
                yield from _images(value)
    elif isinstance(node, list):
        for item in node:
            yield from _images(item)


def rendered_images(directory: Path) -> list[tuple[str, str]]:
    """(file relative to `directory`, image) for every distinct image reference per
    rendered file (Kubernetes manifests, compose files). Unreadable files are left to the
    schema checks."""
    import yaml

    found: list[tuple[str, str]] = []
    for path in sorted([*directory.rglob("*.yaml"), *directory.rglob("*.yml")]):
        try:
            docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
        except (OSError, yaml.YAMLError):
            continue
        seen: set[str] = set()
        for doc in docs:
            for image in _images(doc):
                if image not in seen:
                    seen.add(image)
                    found.append((str(path.relative_to(directory)), image))
    return found


def image_warnings(directory: Path) -> list[str]:
    """Warnings for every rendered image reference under `directory` that names one of our
    tags nothing builds."""
    warnings: list[str] = []
    for where, image in rendered_images(directory):
        warning = image_warning(image, where)
        if warning:
            warnings.append(warning)
    return warnings
