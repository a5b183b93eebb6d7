"""``make demo`` as a newcomer runs it, in a fresh clone of this repository: it sets itself up,
every topic gets a final, complete window at every tier, the records-deleted drill of ``make
demo-fault`` turns into a loss alert at the demo's receiver, and ``make demo-down`` stops
everything — no process it started is left and no port it used stays bound.

It runs the committed HEAD (a clone sees no uncommitted change) with its own folder and ports
(``DEMO_ARGS=--dir … --base-port …``). Bounded: 30 minutes in all, each wait its own limit."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
TIERS = ("producer", "kafka-local", "warehouse")
TOPICS = ("app.events", "web.access", "pay.transactions")


def _free_base() -> int:
    """A base port whose demo ports (Kafka's two, then base+12 … base+17) are all free."""
    for _ in range(50):
        base = random.randrange(20_000, 32_000, 20)     # below the ephemeral range
        if all(_bindable(p) for p in _ports(base)):
            return base
    raise AssertionError("no free port range found")


def _ports(base: int) -> list[int]:
    return [base, base + 1, *range(base + 12, base + 18)]


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _processes_under(*paths: Path) -> list[str]:
    """Processes whose command line or working folder names one of ``paths``."""
    found, marks = [], [str(p) for p in paths]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        if any(m in cmd or cwd.startswith(m) for m in marks):
            found.append(f"{entry.name}: {cmd[:200]}")
    return found


def _final_complete_everywhere(base: str) -> tuple[bool, dict]:
    seen = {}
    for tier in TIERS:
        view = requests.get(f"{base}/api/completeness", params={"tier": tier, "range": "1h"},
                            timeout=10).json()
        for topic in TOPICS:
            cells = view["topics"].get(topic, {}).values()
            seen[(tier, topic)] = any(c["final"] and c["state"] == "complete" for c in cells)
    return all(seen.values()), seen


@pytest.mark.timeout(1800)
def test_make_demo_in_a_fresh_clone_catches_a_loss_and_stops_clean(tmp_path):
    clone, d = tmp_path / "clone", tmp_path / "demo"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True)
    base_port = _free_base()
    args = f"DEMO_ARGS=--dir {d} --base-port {base_port}"
    dashboard = f"http://127.0.0.1:{base_port + 12}"
    out: list[str] = []
    demo = subprocess.Popen(["make", "--no-print-directory", "demo", args], cwd=clone,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    reader = threading.Thread(target=lambda: out.extend(demo.stdout), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 900            # make setup in the clone, then up
        while not any("docket demo running" in line for line in out):
            assert demo.poll() is None, "make demo ended:\n" + "".join(out[-60:])
            assert time.monotonic() < deadline, "make demo did not start in 15 min"
            time.sleep(2)
        assert dashboard + "/" in "".join(out)

        deadline, seen = time.monotonic() + 900, {}
        while True:                                  # a window ends, then is final 4 min later
            try:
                done, seen = _final_complete_everywhere(dashboard)
            except (requests.RequestException, ValueError):
                done = False
            if done:
                break
            assert demo.poll() is None, "make demo ended:\n" + "".join(out[-60:])
            assert time.monotonic() < deadline, f"no final complete window in 15 min: {seen}"
            time.sleep(10)

        fault = subprocess.run(["make", "--no-print-directory", "demo-fault",
                                f"{args} --only delete-records --wait-s 480"], cwd=clone,
                               capture_output=True, text=True, timeout=900)
        assert fault.returncode == 0, fault.stdout + fault.stderr
        assert "deleted app.events partition 0 up to offset" in fault.stdout
        alerts = requests.get(f"http://127.0.0.1:{base_port + 13}/alerts", timeout=10).json()
        losses = [a["alert"] for a in alerts if a["alert"].get("event") == "firing"
                  and a["alert"].get("kind") == "loss"
                  and a["alert"].get("tier") == "warehouse"]
        assert losses and all(a["topic"] == "app.events" for a in losses), alerts
        assert any(a["alert"].get("origin") in ("web-1", "web-2", "web-3") for a in alerts)
    finally:
        down = subprocess.run(["make", "--no-print-directory", "demo-down", args], cwd=clone,
                              capture_output=True, text=True, timeout=300)
        try:
            demo.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
        reader.join(10)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped Kafka" in down.stdout
    assert demo.returncode == 0, "".join(out[-40:])
    assert "the demo was stopped" in "".join(out[-5:])
    time.sleep(2)
    left = _processes_under(clone, d)
    assert not left, f"processes left by the demo: {left}"
    bound = [p for p in _ports(base_port) if not _bindable(p)]
    assert not bound, f"ports still bound after make demo-down: {bound}"
