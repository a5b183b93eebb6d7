"""``docket-dashboard`` as a user starts it: a real process on a free 127.0.0.1 port over a
database the reconciler filled, with the reconciler's config; its pages and API answer over
HTTP (the tier graph from that config), it needs the token when given one, and SIGTERM stops
it cleanly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import requests

from audit.reconcile.evaluate import evaluate
from audit.reconcile.store import Store
from tests.unit.reconcilekit import MIN, W, cfg, count

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_dashboard_serves_its_pages_and_stops_on_sigterm(tmp_path):
    now = int(time.time() * 1000)
    t0 = (now - 3 * 3_600_000) // W * W
    db = tmp_path / "r.db"
    store = Store(db)
    store.apply([count("producer", 100, window=t0, at=t0 + W + MIN),
                 count("kafka-local", 90, window=t0, at=t0 + W + MIN)], {}, {}, "t")
    evaluate(store, cfg(), now)
    store.close()
    token = tmp_path / "token"
    token.write_text("a-token-of-twenty-chars\n")
    config = tmp_path / "reconcile.toml"
    config.write_text('[tiers.kafka-local]\nfed_by = ["producer"]\n')
    port = _free_port()
    proc = subprocess.Popen([str(BIN / "docket-dashboard"), "--db", str(db), "--listen",
                             f"127.0.0.1:{port}", "--token-file", str(token),
                             "--config", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=os.environ.copy())
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer a-token-of-twenty-chars"}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                r = requests.get(f"{base}/api/tiers", headers=auth, timeout=2)
                break
            except requests.ConnectionError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline, "the dashboard did not answer in 60 s"
                time.sleep(0.2)
        assert r.json() == {"tiers": ["producer", "kafka-local"],    # the graph of --config
                            "fed_by": {"kafka-local": ["producer"]},
                            "hops": {"kafka-local": "producer → kafka-local"}}
        assert requests.get(f"{base}/", timeout=5).status_code == 401
        page = requests.get(f"{base}/?tier=kafka-local", headers=auth, timeout=5)
        assert page.status_code == 200 and "state-incomplete" in page.text
        assert requests.get(f"{base}/static/docket.css", headers=auth, timeout=5).ok
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"docket dashboard on http://127.0.0.1:{port}/" in out
