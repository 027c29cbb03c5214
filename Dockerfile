# The gateway image that `inferplane render` puts in the manifests: inferplane and its
# dependencies on a slim Python, run as a non-root user, `inferplane` as the entry point
# (manifests pass `gateway --fleet ... --backend ...` as arguments; the simulated engines of
# `engine: sim` fleets run from it too).
#
#   docker build -t ghcr.io/inferplane/inferplane:0.1.0 .      # or: bash scripts/build-image.sh
#
# The tag is the package version (pyproject.toml); `inferplane render --check` warns about
# a ghcr.io/inferplane/inferplane tag this checkout does not build. docs/deploy.md.

# Pinned base (full version and Debian release); override with --build-arg PYTHON_IMAGE=
# to pin a digest from your registry mirror.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY inferplane ./inferplane
# Dependencies come from pyproject.toml's bounds (with the tracing extra, so gateway.tracing
# works in the cluster, and k8s, for `gateway --discover kubernetes`); the package itself is
# this checkout.
RUN python -m venv /opt/inferplane \
 && /opt/inferplane/bin/pip install --no-cache-dir ".[tracing,k8s]" \
 && /opt/inferplane/bin/inferplane version

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/inferplane/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/inferplane \
      --create-home --shell /usr/sbin/nologin inferplane
COPY --from=build /opt/inferplane /opt/inferplane
WORKDIR /var/lib/inferplane
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["inferplane"]
CMD ["gateway", "--fleet", "/etc/inferplane/fleet.yaml", "--host", "0.0.0.0"]
