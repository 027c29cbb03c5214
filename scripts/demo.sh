#!/usr/bin/env bash
# The main job in one command: install, bring the simulated demo fleet up behind the
# gateway, answer one chat request through it, and stop everything again.
# Needs only Python >= 3.11 and pip. Usage: scripts/demo.sh   (from anywhere)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
if [ ! -x .venv/bin/inferplane ]; then
  echo "--- first run: creating .venv and installing inferplane and its dependencies"
  echo "    (pip install -e .: ~40 s from a wheel cache, a few minutes when downloading;"
  echo "    one line per package fetched)"
  python3 -m venv .venv
  # pip's own output, cut to one line per package: silence for minutes reads as a hang.
  .venv/bin/pip install --disable-pip-version-check --progress-bar off -e . 2>&1 \
    | awk '/^Collecting /{print "    fetching " $2; fflush()}
           /^Successfully installed/{print "    installed"; fflush()}
           /^ERROR/{print; fflush()}'
fi
STATE_DIR="${STATE_DIR:-.inferplane-demo}"
PORT="${PORT:-8000}"
echo "--- inferplane up examples/demo.yaml --detach: 5 simulated engines, gateway on :$PORT"
.venv/bin/inferplane up examples/demo.yaml --detach --state-dir "$STATE_DIR" \
  --gateway-port "$PORT"
trap '.venv/bin/inferplane down --state-dir "$STATE_DIR"' EXIT
echo "--- POST http://127.0.0.1:$PORT/v1/chat/completions"
# Python's urllib instead of curl: a fresh machine may have only Python and pip.
.venv/bin/python - "$PORT" <<'PY'
import json, sys, urllib.request
body = {"model": "gpt-4o-mini", "max_tokens": 16,
        "messages": [{"role": "user", "content": "Say hello"}]}
request = urllib.request.Request(
    f"http://127.0.0.1:{sys.argv[1]}/v1/chat/completions",
    data=json.dumps(body).encode(), headers={"content-type": "application/json"})
with urllib.request.urlopen(request, timeout=30) as response:
    print("answer:", json.load(response)["choices"][0]["message"]["content"])
PY
echo "--- demo took $(( $(date +%s) - start )) s (until the answer)"
