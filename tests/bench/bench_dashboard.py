"""How long the dashboard's overview takes over 2,000 topics × 144 windows.

Prints one JSON line. In one run, on a SQLite file in a temporary directory: the audit records
of a day of N topics (``--topics``, default 2,000) × 144 ten-minute windows × 3 tiers × 3
origins, made and applied as ``bench_reconcile.py`` makes them (with its losses, duplicates and
checksum mismatches), then evaluated once by the reconciler (every window final). Then, in
process through Starlette's test client (no socket, no browser):
- overview_server_s: the median of 5 requests of ``/?tier=warehouse&range=24h`` (the heatmap's
  first page, 100 topics × all 144 windows, with every topic's totals), from request to the last
  byte of HTML; overview_html_mb its size;
- api_completeness_s: the median of 5 requests of ``/api/completeness`` for every topic at once
  (``cells``: all N × 144);
- baseline_select_s: in the same run, a bare ``SELECT`` of the same rows of ``windows`` (no
  object, no HTML per row): the floor under both;
- browser_load_s: the same page served by uvicorn on a free 127.0.0.1 port and opened in
  Debian's headless chromium (Playwright): the median of 3 loads, from navigation start to the
  load event (request, HTML parsed, styles and scripts run, heatmap laid out); null when
  chromium is not installed.
Fill and evaluation take a few minutes at 2,000 topics (their figures are printed too).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from starlette.testclient import TestClient  # noqa: E402

from audit.reconcile.service import evaluate  # noqa: E402
from audit.reconcile.store import Store  # noqa: E402
from dashboards.app import create_app  # noqa: E402
from tests.bench import fleet  # noqa: E402
from tests.bench.bench_reconcile import (  # noqa: E402
    DAY_END,
    FIRST_EVALUATION,
    T0,
    WINDOWS,
    _apply_batches,
    apply_all,
    config,
    fleet_config,
)

REPEAT = 5


def _median_s(fetch) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(REPEAT):
        t = time.perf_counter()
        r = fetch()
        times.append(time.perf_counter() - t)
        assert r.status_code == 200, r.text[:300]
        size = len(r.content)
    return statistics.median(times), size


def _browser_load_s(app, path: str) -> float | None:
    """The median time from navigation start to the load event of ``path`` in chromium."""
    chromium = shutil.which("chromium")
    if chromium is None:
        return None
    import uvicorn
    from playwright.sync_api import sync_playwright

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=[
                "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            page = browser.new_page()
            loads = []
            for _ in range(3):
                page.goto(f"http://127.0.0.1:{port}{path}", wait_until="load", timeout=120_000)
                loads.append(page.evaluate(
                    "(() => { const n = performance.getEntriesByType('navigation')[0];"
                    " return n.loadEventEnd - n.startTime; })()") / 1000)
            browser.close()
    finally:
        server.should_exit = True
        thread.join(10)
    return statistics.median(loads)


FLEET_TARGET_S = 1.0          # server time of the overview and of a window's page


def fleet_pages(origins: int, windows: int) -> dict:
    """A fleet whose every origin writes each of 5 topics (``origins`` per window of a topic),
    its day judged; then the overview and two window pages: one of an ordinary window, one
    whose partition's tail every origin lost (one alert of ``origins`` members). Each page
    must name the 20 worst origins, not all."""
    shape = fleet.Fleet(origins=origins, topics=5, per_origin=5, windows=windows)
    day_end = fleet.T0 + windows * fleet.WINDOW_MS
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "reconcile.db"
        store = Store(db)
        t = time.perf_counter()
        applied, _ = _apply_batches(store, shape.records())
        fill_s = time.perf_counter() - t
        t = time.perf_counter()
        evaluate(store, fleet_config(), day_end + 61 * 60_000)
        evaluation_s = time.perf_counter() - t
        store.close()
        client = TestClient(create_app(db, clock=lambda: day_end / 1000),
                            base_url="http://127.0.0.1")
        topic, lossy = shape.whole_loss
        pages = {"overview": "/?tier=warehouse&range=24h",
                 "window": f"/window/fleet.t{topic:04d}/{fleet.T0 + (lossy - 1) * 600_000}",
                 "window_whole_loss": f"/window/fleet.t{topic:04d}/"
                                      f"{fleet.T0 + lossy * 600_000}"}
        out = {}
        for name, path in pages.items():
            took, size = _median_s(lambda path=path: client.get(path))
            out[f"{name}_server_s"] = round(took, 3)
            out[f"{name}_html_kb"] = round(size / 1000)
            html = client.get(path).text
            if name != "overview":
                table = html[html.index('id="origins"'):html.index("</table>",
                                                                   html.index('id="origins"'))]
                out[f"{name}_origin_rows"] = table.count("<tr><th>") - 1    # the header
                out[f"{name}_says"] = html[html.index('id="origins-shown">') + 19:
                                           html.index("<a href", html.index("origins-shown"))
                                           ].strip() if "origins-shown" in html else None
    return {"bench": "dashboard_fleet", "origins_per_topic_window": origins, "topics": 5,
            "windows": windows, "records_applied": applied, "fill_s": round(fill_s, 1),
            "first_evaluation_s": round(evaluation_s, 1), **out,
            "target_s": FLEET_TARGET_S,
            "target_met": all(v <= FLEET_TARGET_S for k, v in out.items()
                              if k.endswith("_server_s")),
            "note": "server times in process (Starlette test client, no socket), median of 5"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--topics", type=int, default=2000)
    p.add_argument("--fleet", action="store_true",
                   help="a fleet's window pages instead: --origins per window (default 5,000)")
    p.add_argument("--origins", type=int, default=5000)
    p.add_argument("--windows", type=int, default=24)
    args = p.parse_args()
    logging.basicConfig(level=logging.ERROR)
    if args.fleet:
        print(json.dumps(fleet_pages(args.origins, args.windows)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "reconcile.db"
        store = Store(db)
        t = time.perf_counter()
        applied, _ = apply_all(store, args.topics)
        fill_s = time.perf_counter() - t
        t = time.perf_counter()
        evaluate(store, config(), FIRST_EVALUATION)
        evaluation_s = time.perf_counter() - t
        t = time.perf_counter()
        rows = store.conn.execute(
            "SELECT topic, window_start, state, final, expected, count, distinct_count, "
            "duplicates, completeness, missing, checksum FROM windows WHERE tier = ? AND "
            "window_start >= ?", ("warehouse", T0)).fetchall()
        baseline_s = time.perf_counter() - t
        store.close()
        client = TestClient(create_app(db, clock=lambda: DAY_END / 1000),
                            base_url="http://127.0.0.1")
        overview_s, html_bytes = _median_s(
            lambda: client.get("/?tier=warehouse&range=24h"))
        api_s, _ = _median_s(lambda: client.get("/api/completeness?tier=warehouse&range=24h"))
        shown = client.get("/api/completeness?tier=warehouse&range=24h").json()
        browser_s = _browser_load_s(create_app(db, clock=lambda: DAY_END / 1000),
                                    "/?tier=warehouse&range=24h")
    cells = sum(len(w) for w in shown["topics"].values())
    print(json.dumps({
        "topics": args.topics, "windows": WINDOWS, "records_applied": applied,
        "cells": cells, "rows_selected": len(rows),
        "fill_s": round(fill_s, 1), "first_evaluation_s": round(evaluation_s, 1),
        "overview_server_s": round(overview_s, 3),
        "overview_html_mb": round(html_bytes / 1e6, 2),
        "api_completeness_s": round(api_s, 3), "baseline_select_s": round(baseline_s, 3),
        "browser_load_s": None if browser_s is None else round(browser_s, 3),
        "note": "server times in process (Starlette test client, no socket); the browser "
                "load over uvicorn on 127.0.0.1 in headless chromium",
    }))


if __name__ == "__main__":
    main()
