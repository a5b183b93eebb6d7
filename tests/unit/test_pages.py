"""The page server the agent and the reconciler share: pages, 404, 500, and serving on."""

from __future__ import annotations

import logging

import pytest
import requests

from docket_common.pages import Page, PageServer


def test_pages_errors_and_a_page_that_raises_leave_the_server_serving(caplog):
    calls = []

    def flaky() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the database is locked\nmore detail")
        return b"ok %d" % len(calls)

    server = PageServer("127.0.0.1:0", {"/a": Page("text/plain", flaky)}, "test-pages",
                        logging.getLogger("test.pages")).start()
    base = f"http://{server.host}:{server.port}"
    try:
        failed = requests.get(f"{base}/a", timeout=5)
        assert failed.status_code == 500 and "the database is locked" in failed.reason
        assert "/a failed: the database is locked" in caplog.text
        page = requests.get(f"{base}/a", timeout=5)
        assert page.status_code == 200 and page.text == "ok 2"
        assert page.headers["Content-Type"] == "text/plain"
        missing = requests.get(f"{base}/b", timeout=5)
        assert missing.status_code == 404 and "try /a" in missing.text
    finally:
        server.stop()
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{base}/a", timeout=2)


def test_a_port_taken_is_an_oserror_for_the_caller_to_explain():
    first = PageServer("127.0.0.1:0", {}, "test-pages", logging.getLogger("test.pages"))
    try:
        with pytest.raises(OSError):
            PageServer(f"127.0.0.1:{first.port}", {}, "test-pages",
                       logging.getLogger("test.pages"))
    finally:
        first.stop()
