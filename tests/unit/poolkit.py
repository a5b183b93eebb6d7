"""Helpers for the buffer pool tests: chunks of numbered lines, a fake clock, crashing file ops;
and for the drain tests, a drain of a small sealed pool toward an address with no broker or
into a fake producer."""

from __future__ import annotations

import errno

import pytest

from agent.buffer import BufferPool, Chunk
from agent.buffer.seams import FileOps, SimulatedCrash

SLOT = 4096
SIZE = 4096 + 512 * 16 + 16 * SLOT   # room for 16 slots of 4 KiB (the page-rounded headers fit)


def line(i: int, width: int = 40) -> bytes:
    return (b"id-%08d " % i).ljust(width, b"x")


def chunk_of(ids, ts=1_000, width: int = 40) -> Chunk:
    return Chunk.from_lines(b"".join(line(i, width) + b"\n" for i in ids), ts)


def values(pool: BufferPool, topic: str | None = None) -> list[bytes]:
    return [v for s in pool.sealed() if topic in (None, s.topic) for _, _, v in s.records()]


def ids_of(vals) -> list[int]:
    return [int(v[3:11]) for v in vals]


class FakeClock:
    def __init__(self):
        self.now = 1_000_000_000

    def monotonic_ns(self) -> int:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += int(ms * 1_000_000)

    def sleep(self, seconds: float) -> None:
        self.advance_ms(seconds * 1000)


class CrashingOps(FileOps):
    """Raises SimulatedCrash the ``nth`` time the pool passes crash point ``at``."""

    def __init__(self, at: str | None = None, nth: int = 1, free_bytes: int | None = None,
                 reserve_errno: int | None = None):
        self.at, self.nth = at, nth
        self._free_bytes = free_bytes
        self._reserve_errno = reserve_errno
        self.passed: list[str] = []

    def crash_point(self, name: str) -> None:
        self.passed.append(name)
        if name == self.at:
            self.nth -= 1
            if self.nth == 0:
                raise SimulatedCrash(name)

    def free_bytes(self, path) -> int:
        return super().free_bytes(path) if self._free_bytes is None else self._free_bytes

    def reserve(self, fd: int, size: int) -> None:
        if self._reserve_errno is not None:
            raise OSError(self._reserve_errno, "No space left on device")
        super().reserve(fd, size)


ENOSPC = errno.ENOSPC


def unreachable_drain(tmp_path, data: bytes, times, origin: bytes = b"a",
                      incarnation: bytes | None = b"1-test"):
    """The lines of ``data`` (one time each, or one for all) sealed in 16 KiB slots of a small
    pool, and a ``Drain`` of it toward 127.0.0.1:9, where no broker answers: what is produced
    stays in librdkafka's queue until purged. Returns (drain, pool)."""
    return sealed_drain(tmp_path, data, times, origin, {"bootstrap.servers": "127.0.0.1:9"},
                        incarnation=incarnation)


def fake_drain(tmp_path, data: bytes, times, origin: bytes = b"a",
               incarnation: bytes | None = b"1-test", clock=None):
    """The same pool, drained into a ``FakeKafka`` (``tests/unit/fakeproducer.py``), which
    answers as the test scripts it. Returns (drain, pool, kafka)."""
    from tests.unit.fakeproducer import FakeKafka

    kafka = FakeKafka()
    drain, pool = sealed_drain(tmp_path, data, times, origin,
                               {"queue.buffering.max.messages": 500_000}, kafka.producer,
                               incarnation, clock)
    return drain, pool, kafka


# Which send path the drain helpers build: "python" (``Drain``) or "native" (``NativeDrain``);
# the ``send_path`` fixture (tests/unit/conftest.py) runs a test with each.
SEND_PATH = "python"


def sealed_drain(tmp_path, data: bytes, times, origin: bytes | None, conf: dict,
                 producer_factory=None, incarnation: bytes | None = None, clock=None):
    from agent.drain.drain import Drain
    from agent.state.journal import LossJournal
    from agent.telemetry import Metrics

    metrics = Metrics()
    pool = BufferPool(tmp_path / "p", 1 << 20, 16 << 10, linger_ms=1e9, sync_on_seal=False)
    pool.append("t", Chunk.from_lines(data, times))
    pool.seal_all()
    args = (pool, conf, LossJournal(tmp_path / "j", metrics), metrics, tmp_path / "dead",
            origin)
    kwargs = {"producer_factory": producer_factory, "incarnation": incarnation, "clock": clock}
    kafka = getattr(producer_factory, "__self__", None)
    if kafka is not None:                       # a FakeKafka: its probe's clients too
        kwargs["probe_factory"] = kafka.admin
    if SEND_PATH == "python":
        return Drain(*args, **kwargs), pool
    from agent.drain.native import NativeDrain

    if kafka is not None:                       # a FakeKafka: the fake extension over it
        from tests.unit.fakenative import FakeSlotProducer

        kwargs["native_factory"] = lambda conf: FakeSlotProducer(conf, kafka)
    else:
        pytest.importorskip("docket_native", reason="the native extension is not built")
    return NativeDrain(*args, **kwargs), pool
