"""A stand-in for real vLLM's process tree (issue 23): the API server process starts a
child that, like vLLM's EngineCore and worker processes, shares its stdout and outlives it.

    python forking_engine.py PORT SERVED_NAME STATE_FILE

Serves /health and /v1/models. Every start appends `start <server pid> <child pid>` to
STATE_FILE. Killing the server (kill -9) leaves the child running, holding the log pipe.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

CHILD = "import sys, time\nprint('engine core up', flush=True)\nwhile True: time.sleep(1)"


def main() -> None:
    port, served, state = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    # inherits stdout (the supervisor's pipe) and the process group, as EngineCore does
    child = subprocess.Popen([sys.executable, "-c", CHILD])
    with state.open("a") as fh:
        fh.write(f"start {os.getpid()} {child.pid}\n")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_GET(self) -> None:
            if self.path == "/health":
                code, body = 200, {}
            elif self.path == "/v1/models":
                code, body = 200, {"object": "list", "data": [{"id": served}]}
            else:
                code, body = 404, {}
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
