"""A randomized simulation of the agent on one host, for ``test_agent_simulation.py``.

The real agent — file source, buffer pool, state database, loss journal, drain — runs turn by
turn (``Agent.turn``) with a fake clock, a scripted file system, and a fake Kafka whose
producers deliver a random part of what they hold at each poll. Beside it, an application
writes numbered lines to ``app.log`` and rotates it the ways logrotate does: rename-and-create
(sometimes to a name outside the glob), copytruncate (sometimes copied outside the glob,
sometimes slowly, over several steps), deletion of old files, a new file that starts with the
same header as others, an inode number reused. A kill can come at any call the agent makes
to the file system, the pool's crash points, the state database or Kafka (``SimulatedCrash``);
the agent is then abandoned as the kernel would leave it and started again, after the writer
has perhaps done more while it was down. Writer steps also run *inside* the agent's calls
(between a listing and an open, between a read and its check).

The writer knows, for every id, which content stream (generation) holds it and at which byte
offset, and on which inodes that content has lived. At the end every id must have reached
Kafka, or lie in a loss-journal entry that covers its generation's bytes; and an id may arrive
more than once only as often as it was in a slot that could have been in flight at a kill (one
of the oldest sealed slots the drain can have on their way, ``in_flight_at_most``, in the pool
file, read without recovery: a slot sent while it fills, ``buffer.send_filling``, is sealed
there as far as it was sent).

Record numbers (``docket-seq``): every record reaches Kafka numbered; a number always stands for
the same id (never given to two events, across every kill); an id arrives under one number
(copies of it are the same record sent again, never the line read twice); and the numbers that
arrived, with those the loss journal holds, are every number from 0 to the highest.
"""

from __future__ import annotations

import os
import random
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from agent.buffer.inspect import inspect_pool
from agent.buffer.seams import FileOps, SimulatedCrash
from agent.config import parse
from agent.drain.drain import in_flight_at_most
from agent.service import Agent, Seams
from tests.unit.fakeproducer import FakeKafka, FakeProducer
from tests.unit.tailkit import FakeClock, ScriptedFs

LINE_BYTES = 40
HEADER = b"time,host,level,message,request\n"          # shared by several files
SLOT = 4096


def line(i: int) -> bytes:
    return (b"id-%09d " % i).ljust(LINE_BYTES - 1, b"x") + b"\n"


def id_of(value: bytes) -> int | None:
    return int(value[3:12]) if value.startswith(b"id-") else None


class Crasher:
    """Counts the agent's calls at its seams; the ``at``-th one raises SimulatedCrash."""

    def __init__(self):
        self.at: int | None = None
        self.calls = 0
        self.where = ""

    def arm(self, after: int) -> None:
        self.at = self.calls + after

    def tick(self, name: str) -> None:
        self.calls += 1
        if self.at is not None and self.calls >= self.at:
            self.at = None
            self.where = name
            raise SimulatedCrash(name)


# -- the content the writer made --------------------------------------------------------------
@dataclass
class Gen:
    """One content stream: a file from its first byte (a copy holds a prefix of it)."""

    key: int
    inodes: set[int] = field(default_factory=set)      # (virtual) inodes it has lived on
    ids: list[tuple[int, int]] = field(default_factory=list)   # (id, byte offset)
    size: int = 0
    header: bool = False

    def first_bytes(self) -> bytes:
        out = HEADER if self.header else b""
        for i, _ in self.ids:
            if len(out) >= 1024:
                break
            out += line(i)
        return out[:1024]


class SimFs(ScriptedFs):
    """The scripted file system of the file-source tests, whose every call is also where a kill
    may come and where a writer step may run (``pending``: call name, countdown, action); the
    writer chooses the inode numbers (``inodes``)."""

    def __init__(self, crasher: Crasher):
        super().__init__()
        self.crasher = crasher
        self.pending: list[tuple[str, int, object]] = []

    def _run(self, name: str) -> None:
        self.crasher.tick(name)
        for i, (call, countdown, action) in enumerate(self.pending):
            if call == name:
                if countdown <= 0:
                    del self.pending[i]
                    action()
                else:
                    self.pending[i] = (call, countdown - 1, action)
                break


class CrashOps(FileOps):
    def __init__(self, crasher: Crasher):
        self.crasher = crasher

    def crash_point(self, name: str) -> None:
        self.crasher.tick(name)


class SimProducer(FakeProducer):
    """Delivers a random share of what it holds at each poll, so records are in flight when a
    kill comes; every call can be where the kill comes."""

    rng: random.Random
    crasher: Crasher

    def produce(self, *args, **kwargs) -> None:
        self.crasher.tick("produce")
        super().produce(*args, **kwargs)

    def poll(self, timeout: float = 0) -> int:
        self.crasher.tick("poll")
        n = len(self.queued)
        k = n if self.rng.random() < 0.6 else self.rng.randint(0, n)
        later, self.queued = self.queued[k:], self.queued[:k]
        served = super().poll(timeout)
        self.queued = later + self.queued
        return served


class SimKafka(FakeKafka):
    def __init__(self, rng: random.Random, crasher: Crasher):
        super().__init__()
        self.rng, self.crasher = rng, crasher

    def producer(self, conf: dict, role: str = "main") -> FakeProducer:
        p = SimProducer(conf, self)
        p.rng, p.crasher = self.rng, self.crasher
        p.role = "lone" if conf.get("batch.num.messages") == 1 else role
        self.producers.append(p)
        return p


# -- the application and its logrotate ---------------------------------------------------------
class Writer:
    def __init__(self, logs: Path, rng: random.Random, fs: SimFs):
        self.logs = logs
        self.rng = rng
        self.fs = fs
        self.app = logs / "app.log"
        self.next_id = 0
        self.gens: dict[int, Gen] = {}
        self.by_path: dict[str, Gen] = {}       # file → the generation it holds (a prefix of)
        self.rotations = 0
        self.freed: list[tuple[int, int]] = []  # deleted files: (number reported, real inode)
        self.inode_numbers = 1000
        self.copy: tuple[Path, bytes, int] | None = None   # a slow copy under way
        self.log: list[str] = []
        self._new_generation(self.app)

    # files
    def _ino(self, path: Path) -> int:
        st = os.stat(path)
        return self.fs.inodes.get(st.st_ino, st.st_ino)

    def _create(self, path: Path) -> None:
        """A new file. Every file gets an inode number of the writer's choosing, unique among
        live files; sometimes that of a file deleted before (an inode number reused)."""
        path.write_bytes(b"")
        reusable = self._reusable() if self.rng.random() < 0.3 else []
        if reusable:
            number = reusable[0]
            self.freed = [f for f in self.freed if f[0] != number]
        else:
            self.inode_numbers += 1
            number = self.inode_numbers
        self.fs.inodes[os.stat(path).st_ino] = number

    def _reusable(self) -> list[int]:
        """Numbers of deleted files that no descriptor holds any more: as on a real file system,
        an inode still open (the agent reading a deleted file to its end) is not reused."""
        open_now = set()
        for fd in os.listdir("/proc/self/fd"):
            try:
                open_now.add(os.fstat(int(fd)).st_ino)
            except OSError:
                continue
        return [number for number, real in self.freed if real not in open_now]

    def _new_generation(self, path: Path, header: bool | None = None) -> Gen:
        if not path.exists():
            self._create(path)
        g = Gen(key=len(self.gens), header=self.rng.random() < 0.3 if header is None else header)
        self.gens[g.key] = g
        g.inodes.add(self._ino(path))
        self.by_path[str(path)] = g
        if g.header:
            with open(path, "ab") as f:
                f.write(HEADER)
            g.size = len(HEADER)
        return g

    def _append(self, path: Path, n: int) -> None:
        g = self.by_path[str(path)]
        data = bytearray()
        for _ in range(n):
            g.ids.append((self.next_id, g.size + len(data)))
            data += line(self.next_id)
            self.next_id += 1
        with open(path, "ab") as f:
            f.write(data)
        g.size += len(data)

    def _delete(self, path: Path) -> None:
        self.freed.append((self._ino(path), os.stat(path).st_ino))
        path.unlink()
        self.by_path.pop(str(path), None)


    # steps
    def step(self) -> None:
        if self.copy is not None:
            self._continue_copy()
            return
        r = self.rng.random()
        if r < 0.55:
            self._append(self.app, self.rng.randint(1, 60))
        elif r < 0.65:
            self._rename_rotate()
        elif r < 0.75:
            self._start_copytruncate()
        elif r < 0.82:
            self._delete_old()
        elif r < 0.88:
            self._side_file()
        elif r < 0.94:
            sides = [Path(p) for p in self.by_path if "side" in p and Path(p).exists()]
            if sides:
                self._append(self.rng.choice(sides), self.rng.randint(1, 20))
        # else: the application is quiet

    def _rename_rotate(self) -> None:
        self.rotations += 1
        inside = self.rng.random() < 0.75
        dest = self.logs / (f"app.log.{self.rotations}" if inside else f"old-{self.rotations}")
        os.rename(self.app, dest)
        self.by_path[str(dest)] = self.by_path.pop(str(self.app))
        self._new_generation(self.app)
        self.log.append(f"rename app.log -> {dest.name}")

    def _start_copytruncate(self) -> None:
        self.rotations += 1
        inside = self.rng.random() < 0.8
        dest = self.logs / (f"app.log.{self.rotations}" if inside else f"copy-{self.rotations}")
        content = self.app.read_bytes()
        self._create(dest)
        g = self.by_path[str(self.app)]
        g.inodes.add(self._ino(dest))
        self.by_path[str(dest)] = g
        parts = 1 if self.rng.random() < 0.6 else self.rng.randint(2, 4)
        self.copy = (dest, content, parts)
        self.log.append(f"copytruncate app.log -> {dest.name} in {parts} part(s)")
        self._continue_copy()

    def _continue_copy(self) -> None:
        dest, content, parts = self.copy
        have = dest.stat().st_size
        take = len(content) if parts <= 1 else have + (len(content) - have) // parts
        with open(dest, "ab") as f:
            f.write(content[have:take])
        if parts > 1:
            self.copy = (dest, content, parts - 1)
            return
        self.copy = None
        os.truncate(self.app, 0)                        # the truncation follows the copy
        self._new_generation_in_place()

    def _new_generation_in_place(self) -> None:
        g = Gen(key=len(self.gens), header=self.rng.random() < 0.3)
        self.gens[g.key] = g
        g.inodes.add(self._ino(self.app))
        self.by_path[str(self.app)] = g
        if g.header:
            with open(self.app, "ab") as f:
                f.write(HEADER)
            g.size = len(HEADER)

    def _delete_old(self) -> None:
        old = [Path(p) for p in self.by_path if Path(p) != self.app and Path(p).exists()]
        keep = self.rng.randint(0, 3)
        for p in old[:max(0, len(old) - keep)]:
            if self.copy is not None and p == self.copy[0]:
                continue
            self._delete(p)

    def _side_file(self) -> None:
        path = self.logs / f"app.log.side-{len(self.gens)}"
        self._new_generation(path, header=True)
        self._append(path, self.rng.randint(0, 30))

    def finish(self) -> None:
        while self.copy is not None:
            self._continue_copy()


# -- one run -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    seed: int
    written: int
    delivered: Counter
    allowance: Counter
    lost: list[int]
    excess: dict[int, tuple[int, int]]
    kills: int
    crash_sites: list[str]
    journal: list[dict]
    story: list[str]
    numbering: list[str] = field(default_factory=list)     # broken record-number rules

    @property
    def ok(self) -> bool:
        return not self.lost and not self.excess and not self.numbering

    def summary(self) -> str:
        return (f"seed {self.seed}: {self.written} ids, {len(self.lost)} lost "
                f"(first {self.lost[:8]}), {len(self.excess)} over their duplicate bound "
                f"(e.g. {list(self.excess.items())[:4]}), numbering {self.numbering[:4]}, "
                f"{self.kills} kills at "
                f"{self.crash_sites}; journal "
                f"{[(j['reason'], j['range'], j['source_id']) for j in self.journal]}"
                f"\n  story: {'; '.join(self.story[-40:])}")


class Simulation:
    def __init__(self, tmp: Path, seed: int, steps: int = 60, send_path: str = "python"):
        self.tmp = tmp
        self.seed = seed
        self.send_path = send_path
        self.steps = steps
        self.rng = random.Random(seed)
        self.crasher = Crasher()
        self.clock = FakeClock()
        self.fs = SimFs(self.crasher)
        # Kafka's answers draw from a stream of their own: how often the drain polls while
        # stopping depends on real time, and must not change the writer's or the kills' draws.
        self.kafka = SimKafka(random.Random(seed * 7919 + 1), self.crasher)
        self.logs = tmp / "logs"
        self.logs.mkdir()
        self.state = tmp / "state"
        self.writer = Writer(self.logs, self.rng, self.fs)
        self.allowance: Counter = Counter()
        self.kills = 0
        self.crash_sites: list[str] = []
        self.cfg = parse({
            "agent": {"id": "sim", "state_dir": str(self.state), "shutdown_timeout_ms": 2000},
            "buffer": {"size_bytes": 4096 + 4096 + 16 * SLOT, "slot_size_bytes": SLOT,
                       "linger_ms": 5, "sync_on_seal": False},
            "broker": {"bootstrap_servers": "127.0.0.1:9", "send_path": send_path},
            "audit": {"enabled": False},
            "sources": [{"type": "file", "topic": "t", "paths": [str(self.logs / "app.log*")],
                         "poll_interval_ms": 100}],
        })
        self.agent: Agent | None = None

    def _start(self) -> None:
        native = None
        if self.send_path == "native":      # the native path's contract, over the same Kafka
            from tests.unit.fakenative import FakeSlotProducer

            native = lambda conf: FakeSlotProducer(conf, self.kafka)   # noqa: E731
        seams = Seams(clock=self.clock, fs=self.fs, pool_ops=CrashOps(self.crasher),
                      producer_factory=self.kafka.producer, native_factory=native,
                      probe_factory=self.kafka.admin, db_crash_point=self.crasher.tick,
                      file_events=False)
        while True:
            try:
                self.agent = Agent(self.cfg, seams=seams)
                self.agent.begin()
                return
            except SimulatedCrash:
                self._killed()                # killed while starting: start again

    def _killed(self) -> None:
        """The agent died at a crash point: note what may have been in flight, let go of it."""
        self.kills += 1
        self.crash_sites.append(self.crasher.where)
        view = inspect_pool(self.cfg.buffer_path) if self.cfg.buffer_path.exists() else None
        n = 0 if view is None else in_flight_at_most(
            [s.meta.used_bytes for s in view.sealed], view.geometry,
            native=self.send_path == "native")
        for slot in (view.sealed[:n] if view else []):
            for _ts, _key, value in slot.records():
                i = id_of(value)
                if i is not None:
                    self.allowance[i] += 1
        if self.agent is not None:
            self.agent.abandon()
        self.agent = None
        self.writer.log.append(f"KILL at {self.crasher.where}")

    def _turn(self) -> None:
        self.clock.advance(self.rng.choice((0.0, 0.005, 0.02, 0.1, 0.3)))
        try:
            self.agent.turn()
        except SimulatedCrash:
            self._killed()
            for _ in range(self.rng.randint(0, 3)):      # the application goes on meanwhile
                self.writer.step()
            self.clock.advance(self.rng.choice((0.5, 2.0, 10.0)))
            self._start()

    def _race(self) -> None:
        """A writer step inside one of the agent's coming calls."""
        call = self.rng.choice(("stat", "open", "fstat", "pread", "glob"))
        self.fs.pending.append((call, self.rng.randint(0, 6), self.writer.step))

    def run(self) -> Outcome:
        self._start()
        for _ in range(self.steps):
            r = self.rng.random()
            if r < 0.08:
                self.crasher.arm(self.rng.randint(1, 120))
            elif r < 0.13:
                self._race()
            elif r < 0.16:
                self.writer.log.append("SIGTERM")
                try:
                    self.agent.shutdown()
                    self.agent = None
                except SimulatedCrash:                   # killed while stopping
                    self._killed()
                self.clock.advance(1.0)
                self._start()
            self.writer.step()
            for _ in range(self.rng.randint(0, 4)):
                self._turn()
        # The application stops; the agent catches up, its waits (grace, idle) run out.
        self.crasher.at = None
        self.fs.pending.clear()
        self.writer.finish()
        for _ in range(40):
            self.clock.advance(0.5)
            self.agent.turn()
        for _ in range(2000):
            self.clock.advance(0.05)
            self.agent.turn()
            if self.agent.drain.idle() and not any(f.lag() and any(f.lag().values())
                                                     for f in self.agent.file_sources):
                break
        self.agent.shutdown()
        return self._outcome()

    def _outcome(self) -> Outcome:
        delivered = Counter(i for i in map(id_of, self.kafka.values()) if i is not None)
        journal = _journal(self.state / "loss-journal.jsonl")
        rows = self._rows()
        covered = self._covered(journal, rows) | self._never_observable(rows)
        lost = [i for i in range(self.writer.next_id) if not delivered[i] and i not in covered]
        excess = {i: (c, self.allowance[i]) for i, c in delivered.items()
                  if c - 1 > self.allowance[i]}
        return Outcome(self.seed, self.writer.next_id, delivered, self.allowance, lost, excess,
                       self.kills, self.crash_sites, journal, self.writer.log,
                       self._numbering(journal))

    def _numbering(self, journal: list[dict]) -> list[str]:
        broken = []
        ids_of: dict[int, set] = {}
        numbers_of: dict[int, set] = {}
        for _topic, value, _key, _ts, headers in self.kafka.log:
            h = dict(headers or ())
            if "docket-seq" not in h:
                broken.append(f"no docket-seq on {value[:20]!r}")
                continue
            n = int.from_bytes(h["docket-seq"], "big")
            ids_of.setdefault(n, set()).add(id_of(value))
            i = id_of(value)
            if i is not None:
                numbers_of.setdefault(i, set()).add(n)
        broken += [f"number {n} given to ids {sorted(ids, key=str)}"
                   for n, ids in ids_of.items() if len(ids) > 1]
        broken += [f"id {i} arrived as numbers {sorted(ns)}"
                   for i, ns in numbers_of.items() if len(ns) > 1]
        seen = set(ids_of)
        for e in journal:
            if e.get("records"):
                seen.update(range(e["records"][0], e["records"][1] + 1))
        top = max(seen, default=-1)
        holes = sorted(set(range(top + 1)) - seen)
        if holes:
            broken.append(f"{len(holes)} number(s) neither arrived nor journalled: "
                          f"{holes[:6]}")
        return broken

    def _never_observable(self, rows: dict) -> set[int]:
        """Ids the agent cannot have known of: past everything its state database recorded of
        their content (sizes seen, sealed offsets; a look that a kill cut off before it was
        stored is not knowledge), in content no file under the glob holds any more (written,
        then copied or moved out of the glob or deleted, before the agent recorded it). Nothing
        else may be missing without a journal entry."""
        in_glob = {id(g) for path, g in self.writer.by_path.items()
                   if Path(path).name.startswith("app.log") and Path(path).exists()}
        out = set()
        for g in self.writer.gens.values():
            if id(g) in in_glob:
                continue
            first = g.first_bytes()
            known = max((max(size, sealed) for ino, fp, size, sealed in rows.values()
                         if ino in g.inodes and fp and first.startswith(fp)), default=0)
            out.update(i for i, offset in g.ids if offset >= known)
        return out

    def _rows(self) -> dict[int, tuple]:
        import sqlite3
        db = sqlite3.connect(self.state / "state.db")
        try:
            return {sid: (ino, bytes(fp or b""), size, sealed) for sid, ino, fp, size, sealed in
                    db.execute("SELECT source_id, ino, fingerprint, size_seen, sealed_offset "
                               "FROM files")}
        finally:
            db.close()

    def _covered(self, journal: list[dict], rows: dict) -> set[int]:
        """Ids inside the byte ranges of loss-journal entries (open-ended: and after)."""
        out: set[int] = set()
        for entry in journal:
            if entry.get("source_id") is None or entry["range"] is None:
                continue
            ino, fp, _size, _sealed = rows[entry["source_id"]]
            start, end = entry["range"]
            for g in self.writer.gens.values():
                if ino in g.inodes and g.first_bytes().startswith(fp):
                    out.update(i for i, o in g.ids
                               if o >= start and (entry.get("open_ended") or o < end))
        return out


def _journal(path: Path) -> list[dict]:
    import json
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def run_seed(tmp: Path, seed: int, steps: int = 60, send_path: str = "python") -> Outcome:
    folder = tmp / f"seed-{seed}-{send_path}"
    folder.mkdir()
    try:
        return Simulation(folder, seed, steps, send_path).run()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
