#!/usr/bin/env bash
# Build the gateway image with the tag `inferplane render` uses by default
# (ghcr.io/inferplane/inferplane:VERSION, VERSION from pyproject.toml); push it, or retag
# it for your registry and render with --gateway-image / gateway.image. docs/deploy.md.
#
# Usage: scripts/build-image.sh [--archive FILE] [--sbom DIR] [IMAGE]
#   --archive FILE  also write the image as a docker-archive tarball (`docker load -i`,
#                   `podman load -i`)
#   --sbom DIR      also write what is inside: pip-inspect.json (`pip inspect` of the
#                   image's venv) and dpkg.txt (the base's Debian packages, when it has dpkg)
#
# Builder ($BUILDER, else the first that works): docker (when its daemon answers), then
# buildah with no daemon and no registry: the base is Debian's own python3 from
# `debootstrap --variant=minbase` (cached under $INFERPLANE_IMAGE_CACHE), imported as a
# local image and passed to the unchanged Dockerfile as PYTHON_IMAGE. Set PYTHON_IMAGE to
# build on another base (e.g. the registry's python:3.11.13-slim-bookworm) instead.
# Every build carries the OCI labels version, source and revision (git HEAD, "-dirty"
# when the files the image is built from have uncommitted changes).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  echo "error: $1. Fix: scripts/build-image.sh [--archive FILE] [--sbom DIR] [IMAGE]" >&2
  exit 2
}
archive="" sbom="" image=""
while [ $# -gt 0 ]; do
  case "$1" in
    --archive) [ $# -ge 2 ] || usage "--archive needs a file"; archive=$2; shift 2 ;;
    --sbom) [ $# -ge 2 ] || usage "--sbom needs a directory"; sbom=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    -*) usage "unknown option $1" ;;
    *) [ -z "$image" ] || usage "a second IMAGE ($1)"; image=$1; shift ;;
  esac
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)
image="${image:-ghcr.io/inferplane/inferplane:$version}"
started=$(date +%s)
say() { echo "--- [$(( $(date +%s) - started )) s] $*" >&2; }

# The Debian release and Python minor of the Dockerfile's default base: the daemonless base
# must match them (python:3.11.13-slim-bookworm -> bookworm, 3.11).
default_base=$(sed -n 's/^ARG PYTHON_IMAGE=//p' Dockerfile)
release=${default_base##*-}
py_minor=$(echo "$default_base" | sed -n 's/^python:\([0-9]*\.[0-9]*\)\..*/\1/p')

revision=unknown
if git rev-parse --git-dir >/dev/null 2>&1; then
  revision=$(git rev-parse HEAD)
  if [ -n "$(git status --porcelain -- pyproject.toml README.md inferplane Dockerfile)" ]; then
    revision="$revision-dirty"
  fi
fi
labels=(--label "org.opencontainers.image.version=$version"
        --label "org.opencontainers.image.source=https://github.com/inferplane/inferplane"
        --label "org.opencontainers.image.revision=$revision"
        --label "org.opencontainers.image.title=inferplane")

builder="${BUILDER:-}"
if [ -z "$builder" ]; then
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    builder=docker
  elif command -v buildah >/dev/null; then
    builder=buildah
  fi
fi
case "$builder" in
  docker|podman|buildah) ;;
  "") echo "error: no container builder: no docker daemon answers and buildah is not" \
        "installed. Fix: start docker, or apt-get install buildah debootstrap" >&2; exit 2 ;;
  *) echo "error: BUILDER=$builder is not docker, podman or buildah. Fix: unset it" >&2; exit 2 ;;
esac
command -v "$builder" >/dev/null || { echo "error: BUILDER=$builder is not on PATH" >&2; exit 2; }

# buildah: vfs works everywhere (also inside another container's overlay filesystem)
storage=(--storage-driver "${STORAGE_DRIVER:-vfs}")

debian_base() {  # prints the local base image, building (and caching) it when missing
  local packages="python3,python3-venv,python-is-python3,ca-certificates"
  local key; key=$(printf '%s %s %s' "$release" "$packages" "trim-1" | sha256sum | cut -c1-12)
  local base="localhost/inferplane-base:$release-py$py_minor-$key"
  if buildah "${storage[@]}" inspect --type image "$base" >/dev/null 2>&1; then
    say "base $base (cached image)"; echo "$base"; return
  fi
  local cache="${INFERPLANE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inferplane/image}"
  local tarball="$cache/debian-$release-minbase-$key.tar"
  mkdir -p "$cache"
  if [ ! -s "$tarball" ]; then
    command -v debootstrap >/dev/null || {
      echo "error: debootstrap is not installed. Fix: apt-get install debootstrap" \
           "(or set PYTHON_IMAGE to a base your registry serves)" >&2; exit 2; }
    local root; root=$(mktemp -d "$cache/rootfs.XXXXXX")
    say "debootstrap --variant=minbase $release ($packages)"
    debootstrap --variant=minbase --include="$packages" "$release" "$root" \
      "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$root.log" 2>&1 || {
      tail -n 20 "$root.log" >&2; echo "error: debootstrap failed (log: $root.log)" >&2; exit 1; }
    local got; got=$(chroot "$root" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [ "$got" != "$py_minor" ]; then
      echo "error: Debian $release has Python $got, the Dockerfile's base $default_base" \
           "has $py_minor. Fix: pin the matching Debian release here" >&2; exit 1
    fi
    # what an image does not need: downloaded packages, package lists, docs
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/cache/apt/*.bin \
      "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* \
      "$root"/usr/share/locale/* "$root"/usr/share/info/*
    tar -C "$root" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' \
      --exclude='./sys/*' -cf "$tarball.tmp" .
    mv "$tarball.tmp" "$tarball"
    rm -rf "$root" "$root.log"
  else
    say "base root filesystem $tarball (cached)"
  fi
  local ctr; ctr=$(buildah "${storage[@]}" from scratch)
  buildah "${storage[@]}" add "$ctr" "$tarball" / >/dev/null
  buildah "${storage[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 \
    --label "org.opencontainers.image.description=Debian $release minbase with python3 $py_minor" \
    "$ctr" >/dev/null
  buildah "${storage[@]}" commit --rm --quiet "$ctr" "$base" >/dev/null
  say "imported the base as $base"
  echo "$base"
}

case "$builder" in
  buildah)
    base_args=()
    if [ -n "${PYTHON_IMAGE:-}" ]; then
      base_args=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
    else
      base_args=(--build-arg "PYTHON_IMAGE=$(debian_base)")
    fi
    # pip inside the build trusts what this machine trusts (a TLS-inspecting proxy's CA):
    # mounted for the RUN steps only, never part of the image
    ca=(); bundle=${BUILD_CA_BUNDLE-/etc/ssl/certs/ca-certificates.crt}
    [ -z "$bundle" ] || [ ! -f "$bundle" ] || ca=(-v "$bundle:/etc/ssl/certs/ca-certificates.crt:ro")
    say "buildah bud ${base_args[*]} -t $image ."
    buildah "${storage[@]}" bud --isolation "${BUILDAH_ISOLATION:-chroot}" "${ca[@]}" \
      "${base_args[@]}" "${labels[@]}" -t "$image" .
    ;;
  *)
    base_args=()
    [ -z "${PYTHON_IMAGE:-}" ] || base_args=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
    say "$builder build ${base_args[*]} -t $image ."
    "$builder" build "${base_args[@]}" "${labels[@]}" -t "$image" .
    ;;
esac
say "built $image (revision $revision)"

if [ -n "$sbom" ]; then
  # one working container for both listings (a vfs container is a full copy of the image)
  mkdir -p "$sbom"
  case "$builder" in
    buildah)
      ctr=$(buildah "${storage[@]}" from --quiet "$image")
      in_image=(buildah "${storage[@]}" run --isolation "${BUILDAH_ISOLATION:-chroot}" "$ctr" --) ;;
    *) ctr=""; in_image=("$builder" run --rm --entrypoint env "$image") ;;
  esac
  rc=0
  "${in_image[@]}" /opt/inferplane/bin/pip inspect --local >"$sbom/pip-inspect.json.tmp" || rc=$?
  [ "$rc" != 0 ] || mv "$sbom/pip-inspect.json.tmp" "$sbom/pip-inspect.json"
  if "${in_image[@]}" dpkg-query -W -f '${Package}=${Version}\n' >"$sbom/dpkg.txt.tmp" 2>/dev/null
  then mv "$sbom/dpkg.txt.tmp" "$sbom/dpkg.txt"; else rm -f "$sbom/dpkg.txt.tmp"; fi
  [ -z "$ctr" ] || buildah "${storage[@]}" rm "$ctr" >/dev/null
  [ "$rc" = 0 ] || { echo "error: pip inspect in the image failed (exit $rc)" >&2; exit 1; }
  say "SBOM in $sbom: $(ls "$sbom" | tr '\n' ' ')"
fi

if [ -n "$archive" ]; then
  mkdir -p "$(dirname "$archive")"
  rm -f "$archive.tmp"
  case "$builder" in
    docker) docker save -o "$archive.tmp" "$image" ;;
    podman) podman save --format docker-archive -o "$archive.tmp" "$image" ;;
    buildah) buildah "${storage[@]}" push --quiet "$image" "docker-archive:$archive.tmp:$image" ;;
  esac
  mv "$archive.tmp" "$archive"
  say "archive $archive, $(du -m "$archive" | cut -f1) MiB (docker load -i / podman load -i)"
fi
case "$builder" in
  buildah) size=$(buildah "${storage[@]}" images --format '{{.Size}}' "$image" | head -n1) ;;
  *) size=$("$builder" image inspect -f '{{.Size}}' "$image" | awk '{printf "%d MiB", $1/1048576}') ;;
esac
say "done: image $image, $size"
