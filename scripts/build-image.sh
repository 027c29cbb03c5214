#!/usr/bin/env bash
# Build the gateway image with the tag `inferplane render` uses by default
# (ghcr.io/inferplane/inferplane:VERSION, VERSION from pyproject.toml); push it, or retag
# it for your registry and render with --gateway-image / gateway.image. docs/deploy.md.
# Usage: scripts/build-image.sh [IMAGE]   (builder: $BUILDER, else docker, podman or buildah)
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)
image="${1:-ghcr.io/inferplane/inferplane:$version}"
builder="${BUILDER:-}"
if [ -z "$builder" ]; then
  for candidate in docker podman buildah; do
    if command -v "$candidate" >/dev/null; then builder=$candidate; break; fi
  done
fi
if [ -z "$builder" ]; then
  echo "error: no container builder found. Fix: install docker, podman or buildah" >&2
  exit 2
fi
echo "--- $builder build -t $image ."
if [ "$builder" = buildah ]; then
  exec buildah bud -t "$image" .
fi
exec "$builder" build -t "$image" .
