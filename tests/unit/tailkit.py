"""Helpers for the file-source tests: numbered lines, a fake clock, a file-system seam a test
can script (run a writer's step at a chosen call, hide a file from a listing, refuse an open,
give inodes numbers of its choosing), and a harness of the real file source, pool, state
database and loss journal on real files in a temp folder."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from agent.buffer import BufferPool
from agent.config import SourceConfig
from agent.state.db import StateDB
from agent.state.journal import LossJournal
from agent.state.selfcheck import rewind_uncovered
from agent.tail import generations
from agent.tail.files import FileSource
from agent.tail.seams import FsOps
from agent.telemetry import Metrics

LINE = 60


def keep_state_db(state: Path, saved: Path) -> None:
    """The state database as its last durable commit left it, copied to ``saved``: a power cut
    later takes what was committed since (``put_back_state_db``)."""
    saved.mkdir()
    for p in state.glob("state.db*"):
        shutil.copy2(p, saved / p.name)


def put_back_state_db(state: Path, saved: Path) -> None:
    """The state database of ``keep_state_db`` back in place of what the agent wrote since."""
    for p in state.glob("state.db*"):
        p.unlink()
    for p in saved.iterdir():
        shutil.copy2(p, state / p.name)


def line(i: int) -> bytes:
    return (b"id-%09d " % i).ljust(LINE - 1, b"x") + b"\n"


def lines(a: int, b: int) -> bytes:
    return b"".join(line(i) for i in range(a, b))


def id_of(value: bytes) -> int:
    return int(value[3:12])


class FakeClock:
    """Monotonic and wall time that move only when told (and on ``sleep``)."""

    def __init__(self):
        self.ns = 1_000_000_000_000
        self.wall_ms = 1_795_000_000_000

    def monotonic_ns(self) -> int:
        return self.ns

    def time_ms(self) -> int:
        return self.wall_ms

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)
        self.wall_ms += int(seconds * 1000)

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


class ScriptedFs(FsOps):
    """The real file system, with hooks:

    - ``before[name]``: a list of callables run (and removed) just before the next call of
      ``name`` (``glob``, ``stat``, ``open``, ``fstat``, ``pread``) — a writer acting between
      two of the source's calls;
    - ``before_read_at[offset]``: a callable run (and removed) just before the next ``pread``
      at that offset (the read of data there, not a look at the first bytes);
    - ``hidden``: paths the next listing leaves out (as a listing racing a rename may);
    - ``refused``: paths whose open fails with EACCES;
    - ``inodes``: real inode → the inode number reported (to make one reused);
    - ``devices``: path → the device number its ``stat`` reports;
    - ``fstab``: the mount points ``mount_points`` reports (``/etc/fstab``'s)."""

    def __init__(self):
        self.before: dict[str, list[Callable[[], None]]] = {}
        self.before_read_at: dict[int, Callable[[], None]] = {}
        self.hidden: set[str] = set()
        self.refused: set[str] = set()
        self.inodes: dict[int, int] = {}
        self.devices: dict[str, int] = {}
        self.fstab: set[str] = set()

    def _run(self, name: str) -> None:
        todo = self.before.get(name)
        if todo:
            todo.pop(0)()

    def _fake(self, st: os.stat_result) -> os.stat_result:
        ino = self.inodes.get(st.st_ino)
        if ino is None:
            return st
        fields = list(st)
        fields[1] = ino
        return os.stat_result(fields)

    def glob(self, pattern):
        self._run("glob")
        found = [p for p in super().glob(pattern) if p not in self.hidden]
        self.hidden = set()
        return found

    def listdir(self, folder):
        self._run("listdir")
        return super().listdir(folder)

    def stat(self, path):
        self._run("stat")
        st = self._fake(super().stat(path))
        if str(path) in self.devices:
            fields = list(st)
            fields[2] = self.devices[str(path)]
            st = os.stat_result(fields)
        return st

    def open(self, path):
        self._run("open")
        if path in self.refused:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return super().open(path)

    def mount_points(self):
        return set(self.fstab)

    def fstat(self, fd):
        self._run("fstat")
        return self._fake(super().fstat(fd))

    def pread(self, fd, n, offset):
        self._run("pread")
        action = self.before_read_at.pop(offset, None)
        if action is not None:
            action()
        return super().pread(fd, n, offset)


class Harness:
    """The real file source on real files in ``tmp/logs``, with a real pool, state database
    and loss journal, a fake clock and a scripted file system."""

    def __init__(self, tmp, pattern="app.log*", first_start: bool = False,
                 slot_bytes: int = 1 << 20, **cfg):
        self.tmp = tmp
        self.slot_bytes = slot_bytes
        self.first_start = first_start       # the first open is the agent's very first start
        self.logs = tmp / "logs"
        self.logs.mkdir(exist_ok=True)
        self.app = self.logs / "app.log"
        cfg.setdefault("topic", "t")
        self.cfg = SourceConfig(index=0, type="file", paths=[str(self.logs / pattern)], **cfg)
        self.clock = FakeClock()
        self.fs = ScriptedFs()
        self.delivered: list[bytes] = []   # values of slots "sent and freed" (drain_all)
        self.open()

    def open(self):
        self.metrics = Metrics()
        self.pool = BufferPool(self.tmp / "pool", 64 << 20, self.slot_bytes, linger_ms=1e9,
                               sync_on_seal=False, clock=self.clock)
        self.db = StateDB(self.tmp / "state.db")
        self.journal = LossJournal(self.tmp / "journal.jsonl", self.metrics)
        recovered = self.pool.recovered_positions()
        self.db.advance_sealed(recovered)
        rewind_uncovered(self.db, self.pool.sealed())         # as the agent does at start
        self.src = FileSource(self.cfg, self.pool, self.db, self.journal, self.metrics,
                              recovered, fs=self.fs, first_start=self.first_start)
        self.first_start = False

    def write(self, a: int, b: int, path=None) -> None:
        with open(path or self.app, "ab") as f:
            f.write(lines(a, b))

    def step(self, times: int = 2, advance_s: float = 0.0):
        for _ in range(times):
            self.clock.advance(advance_s)
            self.src.scan()
            self.src.read_some(64 << 20)

    def wait(self, seconds: float, steps: int = 2):
        """Let ``seconds`` pass across a few scans (grace periods, settling, idle closes)."""
        for _ in range(steps):
            self.step(1, seconds / steps)

    def checkpoint(self) -> None:
        """Seal and checkpoint what is read, as the agent loop does each turn."""
        self.pool.seal_all()
        ends = {}
        for s in self.pool.sealed():
            for src, _a, e in s.meta.positions:
                ends[src] = max(e, ends.get(src, 0))
        self.db.advance_sealed(ends)

    def values(self) -> list[bytes]:
        """Every value delivered so far plus every value sealed in the pool, in order."""
        self.checkpoint()
        return self.delivered + [v for s in self.pool.sealed() for _, _, v in s.records()]

    def ids(self) -> list[int]:
        """The ids of ``values()`` (values that are not numbered lines left out)."""
        return [id_of(v) for v in self.values() if v.startswith(b"id-")]

    def drain_all(self):
        """Kafka acknowledged everything sealed: free it."""
        self.checkpoint()
        for s in self.pool.sealed():
            self.delivered += [v for _, _, v in s.records()]
            self.db.advance_acked({src: e for src, _a, e in s.meta.positions})
            self.pool.free(s)

    def stop(self):
        """SIGTERM: seal, checkpoint, close everything."""
        self.checkpoint()
        self.src.close()
        self.pool.close()
        self.db.close()
        self.journal.close()

    def crash(self):
        """SIGKILL: nothing sealed, checkpointed or closed cleanly; descriptors go."""
        self.src.abandon()
        self.pool.abandon()
        self.db.close()
        self.journal.close()

    def restart(self, crash: bool = False):
        self.crash() if crash else self.stop()
        self.open()

    def journal_entries(self) -> list[dict]:
        return self.journal.entries()

    def past_grace(self):
        self.wait(generations.COPY_GRACE_S + 0.5)
