"""Helpers for the audit tests: a known stream and its true counts, the Spark jobs as processes,
waiting for a tier to report."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

from audit.contract.collect import AuditState, read_audit_topic
from audit.contract.record import value_hash
from audit.reconcile.config import parse as reconcile_settings
from audit.reconcile.service import Reconciler
from tests.agentkit import BIN

WINDOW_MS = 600_000
LATE_MS = 15 * 60 * 1000

Key = tuple[str, int, str]          # (topic, window_start, origin)


def known_stream(n: int, topics: list[str], origins: list[str], windows: int = 6,
                 late_share: float = 0.02, seed: int = 7) -> dict[tuple[str, str], list[bytes]]:
    """``n`` JSON lines with unique ids, spread over ``windows`` past windows in event-time
    order, a ``late_share`` of them stamped 15 minutes before their neighbours (they arrive
    late). Returns (origin, topic) → lines (without newlines), in writing order."""
    rng = random.Random(seed)
    w0 = (int(time.time() * 1000) // WINDOW_MS - windows - 1) * WINDOW_MS
    span = windows * WINDOW_MS - LATE_MS
    out: dict[tuple[str, str], list[bytes]] = {(o, t): [] for o in origins for t in topics}
    for i in range(n):
        ts = w0 + LATE_MS + span * i // n
        if rng.random() < late_share:
            ts -= LATE_MS
        origin, topic = rng.choice(origins), rng.choice(topics)
        pad = "x" * rng.randrange(0, 120)
        out[(origin, topic)].append(json.dumps({"ts": ts, "id": f"{origin}-{i}",
                                                "pad": pad}).encode())
    return out


def truth(stream: dict[tuple[str, str], list[bytes]]) -> dict[Key, tuple[int, int, int]]:
    """(topic, window, origin) → (count, bytes, checksum), computed from the lines themselves."""
    acc: dict[Key, list[int]] = {}
    for (origin, topic), lines in stream.items():
        for line in lines:
            ts = json.loads(line)["ts"]
            c = acc.setdefault((topic, ts // WINDOW_MS * WINDOW_MS, origin), [0, 0, 0])
            c[0] += 1
            c[1] += len(line)
            c[2] = (c[2] + value_hash(line)) % 2**64
    return {k: tuple(v) for k, v in acc.items()}


def tier_counts(state: AuditState, tier: str, topics: set[str]) -> dict[Key, tuple[int, int, int]]:
    return {k: (r.count, r.bytes, r.checksum) for k, r in state.by_tier().get(tier, {}).items()
            if k[0] in topics and r.count}


class AuditJob:
    """``docket-audit count|land ...`` in a session of its own (SIGKILL takes its JVM too)."""

    def __init__(self, args: list[str], log: Path):
        self.args = args
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.signalled = False                    # SIGTERM sent (it is sent once)

    def start(self) -> AuditJob:
        self.signalled = False
        out = open(self.log, "ab")
        self.proc = subprocess.Popen([str(BIN / "docket-audit"), *self.args], stdout=out,
                                     stderr=out, start_new_session=True, env=os.environ.copy())
        out.close()
        return self

    def wait(self, timeout_s: float) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"docket-audit {self.args[0]} still running after "
                                 f"{timeout_s}s:\n{self.log_text()}") from None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=60)

    def stop(self, timeout_s: float = 60) -> int:
        if self.proc.poll() is not None:          # ended already (its group may be gone)
            return self.proc.returncode
        if not self.signalled:                    # once: a second SIGTERM could land in the
            os.killpg(self.proc.pid, signal.SIGTERM)      # interpreter's own shutdown
            self.signalled = True
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9

    def log_text(self) -> str:
        """The log's tail, for a failed assertion's message."""
        return self.log.read_text(errors="replace")[-5000:]

    def whole_log(self) -> str:
        """The whole log, to count or find lines in (the tail may have scrolled past them)."""
        return self.log.read_text(errors="replace")

    def signal_stop(self) -> None:
        """SIGTERM to its process group, as a service manager stops it (``stop`` waits)."""
        if self.proc.poll() is None and not self.signalled:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.signalled = True

    def stopped_cleanly(self) -> bool:
        """Stopped (``stop``: SIGTERM to its process group, as a service manager does) with
        exit status 0 and no traceback, nor any error of Spark's, in its whole log."""
        code = self.stop()
        text = self.log.read_text(errors="replace")
        problems = [line for line in text.splitlines()
                    if line.startswith("Traceback") or " ERROR " in line]
        assert code == 0 and not problems, f"exit {code}: {problems[:5]}\n{self.log_text()}"
        return True


def all_stopped_cleanly(*jobs: AuditJob) -> bool:
    """``stopped_cleanly`` for each job, all sent SIGTERM first: they stop side by side."""
    for job in jobs:
        job.signal_stop()
    return all(job.stopped_cleanly() for job in jobs)


def all_done(*jobs: AuditJob, timeout_s: float) -> None:
    """Wait for jobs started side by side (``--once``) to end, each with exit status 0."""
    for job in jobs:
        assert job.wait(timeout_s) == 0, job.log_text()


def wait_for_tier(bootstrap: str, audit_topic: str, tier: str,
                  expected: dict[Key, tuple[int, int, int]], timeout_s: float,
                  job: AuditJob | None = None) -> dict[Key, tuple[int, int, int]]:
    """Read the audit topic until ``tier`` reports exactly ``expected`` (or time runs out);
    returns the last figures seen."""
    topics = {k[0] for k in expected}
    deadline = time.monotonic() + timeout_s
    got: dict = {}
    while time.monotonic() < deadline:
        got = tier_counts(read_audit_topic(bootstrap, audit_topic), tier, topics)
        if got == expected:
            return got
        if job is not None and job.proc.poll() is not None:
            raise AssertionError(f"the {tier} job exited {job.proc.returncode}:\n"
                                 f"{job.log_text()}")
        time.sleep(1)                  # each look reads the whole audit topic
    return got


class Clock:
    """A reconciler's clock ``ahead_ms`` ahead of the true time (windows judged as later)."""

    def __init__(self, ahead_ms: int = 0):
        self.ahead_ms = ahead_ms

    def __call__(self) -> float:
        return time.time() + self.ahead_ms / 1000


def judged_windows(bootstrap: str, audit_topic: str, topic: str, db: Path) -> dict:
    """The reconciler's state of each window of ``topic`` at the cluster tier, judged with its
    clock three hours ahead (every window closed and past its grace)."""
    cfg = reconcile_settings({
        "reconcile": {"bootstrap_servers": bootstrap, "audit_topic": audit_topic},
        "windows": {"tiers": ["producer", "kafka-local"], "settle_ms": 1000}})
    Reconciler(cfg, db, clock=Clock(3 * 3_600_000)).run_once()
    conn = sqlite3.connect(db)
    try:
        return {str(w): st for w, st in conn.execute(
            "SELECT window_start, state FROM windows WHERE tier = 'kafka-local' AND topic = ?",
            (topic,))}
    finally:
        conn.close()
