"""``make demo`` as a newcomer runs it, in a fresh clone of this repository: it sets itself up
and runs LinkedIn's topology — agents writing to a ``local`` cluster, MirrorMaker 2 copying the
data and the audit topic to an ``aggregate`` cluster, a count job on each, the warehouse landing
from the aggregate, the reconciler reading the aggregate with the graph producer → kafka-local
→ kafka-aggregate → warehouse. Every topic gets a final, complete window at every tier; ``make
demo-fault`` runs every drill and each real loss turns into its alert at the demo's receiver:
records deleted on the aggregate a ``loss`` at the warehouse's hop, a log deleted unread a
``loss`` at the producer, and the mirror stopped while web-2's records are deleted on the local
cluster a ``loss`` at the hop kafka-local → kafka-aggregate in exactly the windows and the
numbers of the records deleted uncopied — web-2's only, never while the mirror was stopped;
and ``make demo-down`` stops everything, the mirror and both clusters included — no process it
started is left and no port it used stays bound.

It runs the committed HEAD (a clone sees no uncommitted change) with its own folder and ports
(``DEMO_ARGS=--dir … --base-port …``). Bounded: 30 minutes in all, each wait its own limit."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from demo.run import Ports

REPO = Path(__file__).resolve().parents[2]
TIERS = ("producer", "kafka-local", "kafka-aggregate", "warehouse")
TOPICS = ("app.events", "web.access", "pay.transactions")
MIRROR_HOP = "kafka-local → kafka-aggregate"


def _free_base() -> int:
    """A base port whose demo ports (both clusters', then base+12 … base+17) are all free."""
    for _ in range(50):
        base = random.randrange(20_000, 32_000, 20)     # below the ephemeral range
        if all(_bindable(p) for p in Ports.plan(base).all()):
            return base
    raise AssertionError("no free port range found")


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


def _complete_everywhere(base: str, final: bool) -> tuple[bool, dict]:
    """Has every topic a complete window (``final``: a final one) at every tier?"""
    seen = {}
    for tier in TIERS:
        view = requests.get(f"{base}/api/completeness", params={"tier": tier, "range": "1h"},
                            timeout=10).json()
        for topic in TOPICS:
            cells = view["topics"].get(topic, {}).values()
            seen[(tier, topic)] = any(c["state"] == "complete" and (c["final"] or not final)
                                      for c in cells)
    return all(seen.values()), seen


def _hop_red(base: str, window: int) -> bool:
    """Does the window page say web-2 is complete at kafka-local and lost at kafka-aggregate?
    (A window being judged again shows no complete origin: asked again then.)"""
    view = requests.get(f"{base}/api/window", params={"topic": "app.events", "start": window},
                        timeout=10).json()
    web2 = view["origins"].get("web-2", {})
    states = {t: web2.get(t, {}).get("state") for t in ("kafka-local", "kafka-aggregate")}
    return states == {"kafka-local": "complete", "kafka-aggregate": "incomplete"}


def _until(done, what: str, timeout_s: float, demo: subprocess.Popen, out: list[str]):
    """``done()``'s first true answer, asked every 10 s; the demo must keep running."""
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        try:
            last = done()
        except (requests.RequestException, ValueError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        assert demo.poll() is None, "make demo ended:\n" + "".join(out[-60:])
        assert time.monotonic() < deadline, f"{what} not within {timeout_s:.0f} s: {last}"
        time.sleep(10)


@pytest.mark.soak       # a fresh clone set up, two clusters, a mirror, three drills: `make soak`
@pytest.mark.timeout(1800)
def test_make_demo_in_a_fresh_clone_mirrors_to_an_aggregate_catches_each_loss_and_stops_clean(
        tmp_path):
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
        _until(lambda: any("docket demo running" in line for line in out),
               "make demo (make setup in the clone, then up)", 900, demo, out)
        text = "".join(out)
        assert dashboard + "/" in text
        assert f"Kafka local      127.0.0.1:{base_port}" in text
        assert f"Kafka aggregate  127.0.0.1:{base_port + 2}" in text
        # The pipeline flows: a complete window at every tier of every topic (final later).
        _until(lambda: _complete_everywhere(dashboard, final=False)[0],
               "a complete window at every tier", 900, demo, out)
        assert re.search(r"mirror +up +local → aggregate, watcher up", "".join(out)), \
            "".join(out[-30:])

        started = time.monotonic()
        fault = subprocess.run(["make", "--no-print-directory", "demo-fault",
                                f"{args} --wait-s 600"], cwd=clone,
                               capture_output=True, text=True, timeout=1500)
        print(f"make demo-fault: {time.monotonic() - started:.0f} s\n{fault.stdout}")
        assert fault.returncode == 0, fault.stdout + fault.stderr
        assert re.search(r"deleted app\.events partition 0 up to offset \d+ \(\d+ records\) "
                         r"on the aggregate cluster", fault.stdout)
        assert re.search(r"mirror has been stopped \d+ s: no loss", fault.stdout)
        assert f"at the hop {MIRROR_HOP}:" in fault.stdout
        drill = json.loads((d / "mirror-drill.json").read_text())
        lost = {int(w): ns for w, ns in drill["lost"].items()}
        assert lost and (drill["origin"], drill["topic"]) == ("web-2", "app.events")

        def alerts() -> list[dict]:
            got = requests.get(f"http://127.0.0.1:{base_port + 13}/alerts", timeout=10).json()
            return [a["alert"] for a in got if a["alert"].get("event") == "firing"]

        def at_hop() -> dict[int, dict]:
            return {a["window_start"]: a for a in alerts()
                    if (a["kind"], a["tier"]) == ("loss", "kafka-aggregate")}

        # Each window the mirror lost records of is a loss at its hop, web-2's, exactly those.
        _until(lambda: set(at_hop()) >= set(lost), "a loss at the hop in every lost window",
               360, demo, out)
        losses = alerts()
        numbers = {n for ns in lost.values() for n in ns}
        for window, alert in at_hop().items():
            assert window in lost, (window, sorted(lost))
            assert (alert["topic"], alert["origin"]) == ("app.events", "web-2"), alert
            assert alert["detail"]["hop"] == MIRROR_HOP
            assert alert["detail"]["missing"] == len(lost[window]), (alert, lost[window])
            # The numbers missing at the hop, lowest first: the oldest are those deleted (the
            # newest may still be on their way through the mirror).
            listed = {n for a, b in alert["detail"]["missing_ranges"] for n in range(a, b + 1)}
            assert listed & numbers and min(listed) == min(numbers), alert["detail"]
            _until(lambda w=window: _hop_red(dashboard, w), f"window {window} red at the hop",
                   60, demo, out)
        assert not [a for a in losses if (a["kind"], a["tier"]) == ("loss", "kafka-local")]
        graph = requests.get(f"{dashboard}/api/tiers", timeout=10).json()   # its --config
        assert graph["tiers"] == list(TIERS) and graph["hops"]["kafka-aggregate"] == MIRROR_HOP
        warehouse = [a for a in losses if (a["kind"], a["tier"]) == ("loss", "warehouse")]
        assert warehouse and all(a["topic"] == "app.events" and a["detail"]["hop"] ==
                                 "kafka-aggregate → warehouse" for a in warehouse), warehouse
        assert any((a["kind"], a["tier"], a["origin"]) == ("loss", "producer", "web-3")
                   for a in losses)

        # The windows before the drills are final, and complete at every tier.
        _until(lambda: _complete_everywhere(dashboard, final=True)[0],
               "a final complete window at every tier", 600, demo, out)
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
    for stopped in ("stopped the mirror local → aggregate", "stopped Kafka local",
                    "stopped Kafka aggregate"):
        assert stopped in down.stdout, down.stdout
    assert demo.returncode == 0, "".join(out[-40:])
    assert "the demo was stopped" in "".join(out[-5:])
    time.sleep(2)
    left = _processes_under(clone, d)
    assert not left, f"processes left by the demo: {left}"
    bound = [p for p in Ports.plan(base_port).all() if not _bindable(p)]
    assert not bound, f"ports still bound after make demo-down: {bound}"
