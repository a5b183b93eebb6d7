"""The demo's alert receiver: where the reconciler's webhook notifications arrive.

``python -m demo.receiver PORT FILE`` listens on 127.0.0.1:PORT. Every POST body (the
reconciler's JSON notification) is appended to FILE as one line ``{"received_at": ms, "alert":
body}`` and printed as one readable line; ``GET /alerts`` answers with every one received so
far. A body that is not JSON is kept as text: nothing sent here is lost. SIGTERM stops it.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MAX_BODY = 1 << 20


def describe(alert) -> str:
    if not isinstance(alert, dict):
        return f"(not JSON) {str(alert)[:200]}"
    return (f"{alert.get('event', '?')} {alert.get('kind', '?')}: "
            f"{alert.get('summary') or alert.get('text') or json.dumps(alert)[:200]}")


def serve(port: int, out: Path) -> ThreadingHTTPServer:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length") or 0)
            if not 0 <= length <= MAX_BODY:
                self.send_error(413, f"at most {MAX_BODY} bytes")
                return
            raw = self.rfile.read(length)
            try:
                alert = json.loads(raw)
            except ValueError:
                alert = raw.decode("utf-8", "replace")
            line = {"received_at": int(time.time() * 1000), "alert": alert}
            with lock, open(out, "a") as f:
                f.write(json.dumps(line) + "\n")
            print(f"alert received: {describe(alert)}", flush=True)
            self.send_response(204)
            self.end_headers()

        def do_GET(self):  # noqa: N802
            if self.path != "/alerts":
                self.send_error(404, "try GET /alerts")
                return
            with lock:
                text = out.read_text() if out.exists() else ""
            body = json.dumps([json.loads(x) for x in text.splitlines() if x]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def received(path: Path) -> list[dict]:
    """The alerts in a receiver's FILE, oldest first."""
    if not path.exists():
        return []
    return [json.loads(x)["alert"] for x in path.read_text().splitlines() if x.strip()]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[0].isdigit():
        print("usage: python -m demo.receiver PORT FILE", file=sys.stderr)
        return 64
    server = serve(int(args[0]), Path(args[1]))
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"alert receiver on http://127.0.0.1:{args[0]}/ writing {args[1]}", flush=True)
    server.serve_forever()
    server.server_close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
