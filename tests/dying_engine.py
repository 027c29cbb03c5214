"""A tiny stand-in for a vLLM server that dies the way real vLLM does (issue 23): it serves
/health and /v1/models, then its "engine core" dies: /health answers 503 for a moment and
the process exits with code 0.

    python dying_engine.py PORT SERVED_NAME STATE_FILE DIE_AFTER_S MODELS_READY_AFTER_S

Every start appends a line to STATE_FILE; only the first start dies (later ones serve on),
so a supervisor that restarts it sees it ready again. /v1/models answers 503 until
MODELS_READY_AFTER_S have passed since the start (readiness needs its first success).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def main() -> None:
    port, served, state = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    die_after_s, models_after_s = float(sys.argv[4]), float(sys.argv[5])
    with state.open("a") as fh:
        fh.write("start\n")
    first = state.read_text().count("start") == 1
    started = time.monotonic()
    dead = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _send(self, code: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(503 if dead.is_set() else 200, {})
            elif self.path == "/v1/models":
                if time.monotonic() - started < models_after_s or dead.is_set():
                    self._send(503, {"error": "loading"})
                else:
                    self._send(200, {"object": "list", "data": [{"id": served}]})
            else:
                self._send(404, {})

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if first:
        time.sleep(die_after_s)
        dead.set()  # the engine core died: /health turns 503 ...
        time.sleep(1.0)
        server.shutdown()
        sys.exit(0)  # ... and the API server exits with code 0
    threading.Event().wait()


if __name__ == "__main__":
    main()
