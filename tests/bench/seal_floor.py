"""The least CPU one seal can cost under the agent's durability rules, measured outside the
agent: what ``bench_rates.py`` sets beside rsyslog's CPU per line to say how many lines a seal
must carry before any agent, in any language, can match rsyslog at a rate.

A seal with ``sync_on_seal`` on (``docs/buffer.md``) is, at the least:

- ``disk``: a line copied into a slot of a preallocated mmap'd file, its page synced, a header
  written and its page synced (the two ``msync`` of a seal);
- ``state``: two SQLite transactions in WAL mode with ``synchronous = NORMAL`` (the sealed
  checkpoint, then the acknowledged one), one row each;
- ``kafka``: one record produced (acks=all, linger 0, snappy) and its delivery report waited
  for.

Each part runs ``n`` times in a loop of its own with nothing else in the process; CPU is the
process's (every thread: librdkafka's too) from ``getrusage``, per seal. No Python of the
agent's own runs here: the figures are a floor for the agent's design, not for Python.
"""

from __future__ import annotations

import mmap
import os
import resource
import sqlite3
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PAGE = 4096


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _per_op(n: int, op: Callable[[int], None]) -> float:
    """CPU-µs per call of ``op(i)`` over ``n`` calls (after 20 to warm up)."""
    for i in range(20):
        op(i)
    c0 = _cpu_s()
    for i in range(n):
        op(i)
    return (_cpu_s() - c0) / n * 1e6


def _disk(folder: Path, n: int) -> float:
    path = folder / "pool"
    slots = 64
    with open(path, "wb") as f:
        f.truncate(PAGE * (slots + 1))
    fd = os.open(path, os.O_RDWR)
    mm = mmap.mmap(fd, PAGE * (slots + 1))
    line = b"x" * 120 + b"\n"

    def seal(i: int) -> None:
        at = PAGE * (1 + i % slots)
        mm[at:at + len(line)] = line
        mm.flush(at, PAGE)
        mm[(i % slots) * 64:(i % slots) * 64 + 8] = i.to_bytes(8, "little")
        mm.flush(0, PAGE)

    try:
        return _per_op(n, seal)
    finally:
        mm.close()
        os.close(fd)


def _state(folder: Path, n: int) -> float:
    conn = sqlite3.connect(folder / "state.db")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    with conn:
        conn.execute("CREATE TABLE files (id INTEGER PRIMARY KEY, sealed INTEGER, acked INTEGER)")
        conn.execute("INSERT INTO files VALUES (1, 0, 0)")

    def two_commits(i: int) -> None:
        with conn:
            conn.execute("UPDATE files SET sealed = ? WHERE id = 1", (i,))
        with conn:
            conn.execute("UPDATE files SET acked = ? WHERE id = 1", (i,))

    try:
        return _per_op(n, two_commits)
    finally:
        conn.close()


def _kafka(bootstrap: str, topic: str, n: int) -> float:
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                         "compression.type": "snappy", "enable.idempotence": True})
    done: list = []
    value = b"x" * 120

    def send(_i: int) -> None:
        want = len(done) + 1
        producer.produce(topic, value, on_delivery=lambda err, msg: done.append(err))
        deadline = time.monotonic() + 10
        while len(done) < want and time.monotonic() < deadline:
            producer.poll(0.1)

    producer.produce(topic, value)                   # the connection and metadata, first
    producer.flush(10)
    try:
        us = _per_op(n, send)
    finally:
        producer.flush(10)
    if len(done) != n + 20 or any(done):
        raise RuntimeError(f"seal floor: {len(done)} of {n + 20} records acknowledged "
                           f"({sum(1 for e in done if e)} with an error)")
    return us


def seal_floor(bootstrap: str, topic: str, n: int = 2000) -> dict:
    """CPU-µs per seal of each part, and their sum."""
    with tempfile.TemporaryDirectory(prefix="docket-seal-floor-") as tmp:
        parts = {"disk": _disk(Path(tmp), n), "state": _state(Path(tmp), n),
                 "kafka": _kafka(bootstrap, topic, n)}
    out = {f"{k}_us": round(v, 1) for k, v in parts.items()}
    out["total_us"] = round(sum(parts.values()), 1)
    out["seals"] = n
    return out
