"""A small HTTP server of read-only pages, from a thread: the agent's ``/status`` and
``/metrics``, the reconciler's ``/metrics``.

Each page is a path, a content type and a function that renders it at every GET. A path not
served gets 404 naming the ones that are; a page whose function raises gets 500 with the first
line of the error, and the server keeps serving. Requests are not logged (a scraper every few
seconds would fill the journal).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Page:
    content_type: str
    render: Callable[[], bytes]


class PageServer:
    """Serves ``pages`` (path → Page) at ``listen`` (``host:port``; port 0 takes a free one,
    ``port`` tells which). Raises OSError when it cannot listen: the caller says which setting
    to change."""

    def __init__(self, listen: str, pages: dict[str, Page], name: str, log: logging.Logger):
        host, _, port = listen.rpartition(":")
        hint = "try " + " or ".join(sorted(pages))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's naming)
                page = pages.get(self.path)
                if page is None:
                    self.send_error(404, hint)
                    return
                try:
                    body = page.render()
                except Exception as exc:   # noqa: BLE001 — say it to the client, keep serving
                    log.warning("%s failed: %s", self.path, exc, exc_info=True)
                    self.send_error(500, str(exc).splitlines()[0] if str(exc) else None)
                    return
                self.send_response(200)
                self.send_header("Content-Type", page.content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.http = ThreadingHTTPServer((host, int(port)), Handler)
        self.host, self.port = self.http.server_address[:2]
        self._thread = threading.Thread(target=self.http.serve_forever, name=name, daemon=True)

    def start(self) -> PageServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread.is_alive():
            self.http.shutdown()
            self._thread.join()
        self.http.server_close()
