"""The running agent, wired: sources → buffer pool → drain, the state database and the loss
journal, the audit emitter, the status board (``status``). ``Agent`` opens and connects the
parts; what runs them is its loop (``loop.py``: one thread scans and reads files, seals slots
whose linger passed, writes sealed checkpoints, sends to Kafka and serves delivery reports) and
its control (``control.py``: signals only set flags that the loop acts on — SIGTERM/SIGINT stop:
seal, drain up to ``shutdown_timeout_ms``, persist, exit 0; SIGHUP reloads the source list from
the configuration file). Socket connections and the HTTP status server have threads of their own.

One agent per state folder: before it opens anything there, the agent takes
``flock(LOCK_EX | LOCK_NB)`` on ``state_dir/agent.lock`` (holding its pid, for the message a
second agent gets) and keeps it until it stops; the kernel drops it when the process dies, so a
SIGKILLed agent never blocks the next one. The buffer pool locks its own file the same way.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer

from .audit_emitter import AuditEmitter, RecordNumbers
from .buffer import BufferPool, DropEvent, PoolDamaged, SealedSlot
from .buffer.durable import make_folder
from .buffer.seams import Clock, FileOps
from .config import AgentConfig, source_topics
from .control import AgentControl
from .drain.drain import Drain
from .drain.native import NativeDrain, NativeUnavailable, choose_send_path, native_module
from .drain.native_txn import NativeTransactionalDrain
from .drain.producer import MAX_RECORD_BYTES, producer_config
from .drain.topics import TopicWatch
from .drain.transact import TransactionalDrain
from .errors import StartupError
from .loop import AgentLoop
from .notify import Notifier
from .state.checkpoints import Checkpoints
from .state.db import StateDB
from .state.diskguard import DiskGuard
from .state.folder import (
    Finding,
    PoolWatch,
    examine_state_db,
    pool_damaged,
    pool_of_lost_state,
)
from .state.journal import LossJournal
from .state.numbers import NumberReserve, host_boot_id
from .state.selfcheck import acknowledged_whole, rewind_uncovered
from .status import StatusBoard
from .tail.files import FileSource
from .tail.journald import JournaldSource
from .tail.seams import FsOps
from .tail.sock import SocketSource
from .tail.syslog import SyslogSource
from .tail.watch import FolderWatch
from .telemetry import Metrics
from .wake import LoopWake

log = logging.getLogger("docket.agent")


LOCK_FILE = "agent.lock"                  # in state_dir: flock'ed by the running agent, its pid


class StateDirLocked(StartupError):
    """Another agent holds the state folder's lock: this one must not open anything there."""

    def __init__(self, state_dir: Path, pid: int | None):
        holder = f"pid {pid}" if pid is not None else "pid unknown"
        super().__init__(
            f"state folder {state_dir} is already locked by another docket agent ({holder}, "
            f"lock {state_dir / LOCK_FILE}); this agent touched nothing",
            hint="stop that agent first, or give this one an agent.state_dir (and a "
            "buffer.path) of its own: two agents on one state folder would send and free each "
            "other's slots")
        self.state_dir = state_dir
        self.pid = pid


@dataclass
class Seams:
    """What a test replaces to drive the real agent step by step: time, the file system, the
    pool's file operations (crash points), the Kafka clients (the producers, and the client
    that asks whether the cluster answers), crash points of the state database, and file
    events (off: scans happen on the poll interval alone)."""

    clock: Clock = field(default_factory=Clock)
    fs: FsOps = field(default_factory=FsOps)
    pool_ops: FileOps | None = None
    producer_factory: Callable[[dict], object] | None = None
    native_factory: Callable[[dict], object] | None = None    # the native send path's
    probe_factory: Callable[[dict], object] | None = None     # the drain's "does it answer?"
    # The native drain's start check of what Kafka took (``drain/delivered.py``): a consumer;
    # None with a stand-in extension: no check (a stand-in has no cluster to read back)
    consumer_factory: Callable[[dict], object] | None = None
    txn_crash_point: Callable[[str], None] | None = None      # broker.delivery = "exactly_once"
    db_crash_point: Callable[[str], None] | None = None
    file_events: bool = True
    boot_id: Callable[[], str | None] = host_boot_id     # new at every boot of the host


class Agent(AgentLoop, AgentControl):
    def __init__(self, cfg: AgentConfig, notifier: Notifier | None = None,
                 seams: Seams | None = None):
        self.cfg = cfg
        self.notifier = notifier or Notifier()
        self.seams = seams or Seams()
        self.clock = self.seams.clock
        state = cfg.state_dir
        make_folder(state)
        self._state_lock = lock_state_dir(state)     # before the state DB and the pool
        self.db = self.journal = self.pool = None
        self.file_sources: list[FileSource] = []
        try:
            self._open(cfg)
        except BaseException:
            self.abandon()            # as a process that dies here would: nothing written
            raise

    def _choose_send_path(self, cfg: AgentConfig) -> tuple[str, str]:
        """The send path this agent runs, and why (``broker.send_path``; a test's stand-in
        producer without a stand-in extension is the Python path's)."""
        seams = self.seams
        stand_in = seams.native_factory or seams.producer_factory
        return choose_send_path(cfg["broker.send_path"],
                                installed=seams.native_factory is not None if stand_in else None)

    def _native(self, cfg: AgentConfig):
        """The native extension when the agent sends with it, for the drain and the tally's
        per-record hash; None with the Python path or a test's stand-in producer. Refuses to
        start without it (``send_path = "native"``), before anything opens."""
        if self.send_path != "native" or self.seams.native_factory is not None:
            return None
        try:
            return native_module()
        except NativeUnavailable as exc:
            raise StartupError(str(exc), hint="make native; or [broker] "
                               "send_path = \"auto\"") from exc

    def _open(self, cfg: AgentConfig) -> None:
        self.send_path, self.send_path_why = self._choose_send_path(cfg)
        extension = self._native(cfg)
        self.metrics = Metrics()
        self.exit_code = 0
        self._pool_gone = False          # the pool file was cut short: never touch it again
        lost = examine_state_db(cfg.state_db_path, cfg.journal_path, self.clock.time_ms())
        if lost is not None:
            pool_of_lost_state(cfg.buffer_path, lost, self.clock.time_ms())
        self.db = StateDB(cfg.state_db_path, crash_point=self.seams.db_crash_point,
                          clock=self.clock)
        self.incarnation, next_record = self.db.identity()
        # Never run here before (no state, and not a lost one): ``read_from`` applies.
        self._first_start = self.db.created and lost is None
        # No record of the compressed archives under the globs (a new or lost state, or one of
        # a version that kept none): those the first listing finds are archives, skipped.
        self._archives_first = self.db.created or self.db.skipped_new
        self.audit = AuditEmitter(
            db=self.db, agent_id=cfg.agent_id, topics=source_topics(cfg.sources),
            audit_topic=cfg["audit.topic"],
            window_ms=cfg["audit.window_ms"], interval_ms=cfg["audit.interval_ms"],
            producer_conf=producer_config(cfg, self.send_path), metrics=self.metrics,
            enabled=cfg["audit.enabled"], clock=lambda: self.clock.time_ms() / 1000,
            monotonic=self.monotonic,
            incarnation=self.incarnation,
            numbers=self._numbers if cfg["agent.record_numbers"] and cfg["agent.origin_header"]
            else None,
            native_hashes=extension.value_hashes if extension else None,
            native_tally=getattr(extension, "slot_tally", None))
        self.journal = LossJournal(cfg.journal_path, self.metrics,
                                   on_record=self.audit.dropped, clock=self.clock,
                                   incarnation=self.incarnation)
        # A number a drop took and journalled is never given again, even if the pool's header
        # that counted it was lost with the power (only the journal was synced).
        next_record = max(next_record, self.journal.next_number())
        # Off, nothing counting the numbers given is synced before they go: a bound past them
        # is kept on disk, and a start after the host started again gives none below it (read
        # with the setting on too, when a run with it off left one).
        self.numbers = NumberReserve(cfg.numbers_path, self.incarnation, self.seams.boot_id()) \
            if cfg["agent.record_numbers"] and cfg["agent.origin_header"] and (
                not cfg["buffer.sync_on_seal"] or cfg.numbers_path.exists()) else None
        if lost is not None:
            self._journal_finding(lost)          # now: a start failing below must not lose it
        self.disk = DiskGuard(cfg.state_dir, cfg["agent.disk_reserve_bytes"], self.monotonic,
                              on_change=lambda full: self.metrics.set("agent_disk_full",
                                                                      int(full)))
        self.journal.on_refused = lambda exc: self.disk.refused(exc, "writing the loss journal")
        self.checkpoints = Checkpoints(self.db, self.monotonic,
                                       cfg["agent.locate_retention_ms"], self.disk,
                                       anchors=self._anchors)
        try:
            self.pool = self._open_pool(cfg, next_record)
        except PoolDamaged as exc:
            self._journal_finding(pool_damaged(cfg.buffer_path, exc, self.clock.time_ms()))
            self.pool = self._open_pool(cfg, next_record)
        self.pool_watch = PoolWatch(cfg.buffer_path, self.pool.geometry.file_bytes)
        self.recovered = self.pool.recovered_positions()
        self.db.keep_source_ids_above(self.recovered)
        self.audit.count_recovered(self.pool.sealed())
        self.db.advance_sealed(self.recovered, audit=self.audit.persist,
                               next_record=self.pool.next_record)
        self.audit.persisted()
        self.db.add_inexact_runs([
            (slot.first_record, slot.record_count, slot.topic, src, start, end, False)
            for slot in self.pool.sealed() for src, start, end in slot.meta.positions])
        rewound = rewind_uncovered(self.db, self.pool.sealed())
        if rewound:
            self.metrics.inc("agent_source_rewound_total", len(rewound))
        # Reading resumes at the rewound offset, not after a later slot that survived: the
        # bytes between are read again (those of the later slots twice), never skipped.
        self.recovered.update(rewound)
        self.checkpoints.recovered(self.pool.sealed())
        origin = cfg.agent_id.encode() if cfg["agent.origin_header"] else None
        numbered = cfg["agent.record_numbers"] and origin is not None
        drain_class, native = Drain, {}
        exactly_once = cfg["broker.delivery"] == "exactly_once"
        if self.send_path == "native":
            consumer = self.seams.consumer_factory
            if consumer is None and self.seams.native_factory is None:
                consumer = Consumer
            drain_class, native = NativeDrain, {
                "native_factory": self.seams.native_factory, "delivered_consumer": consumer,
                "delivered_check_s": cfg["broker.delivered_check_s"]}
            if exactly_once:              # the marker says what Kafka holds: no read-back
                drain_class, native = NativeTransactionalDrain, {
                    "native_factory": self.seams.native_factory}
        elif exactly_once:
            drain_class = TransactionalDrain
        if exactly_once:
            native.update({
                "agent_id": cfg.agent_id, "incarnation_id": self.incarnation,
                "progress_topic": cfg["broker.progress_topic"],
                "transaction_ms": cfg["broker.transaction_ms"],
                "max_slots": cfg["broker.transaction_max_slots"],
                "transaction_timeout_ms": cfg["broker.transaction_timeout_ms"],
                "crash_point": self.seams.txn_crash_point})
        self.drain = drain_class(self.pool, producer_config(cfg, self.send_path), self.journal,
                                 self.metrics, cfg.dead_letter_dir, origin,
                                 on_slot_done=self._slot_done, on_dead=self.audit.uncount,
                                 clock=self.clock,
                                 producer_factory=self.seams.producer_factory,
                                 probe_factory=self.seams.probe_factory,
                                 incarnation=self.incarnation.encode() if numbered else None,
                                 **native)
        self.topic_watch = TopicWatch(producer_config(cfg, self.send_path), self._topics,
                                      on_answer=self.drain.cluster_answered)
        self.drain.on_unknown_topic = self.topic_watch.unknown
        self.wake = LoopWake()                  # ends the idle loop's sleep (wake.py)
        self._signals_wake = False
        # The sources with threads of their own (unix socket, syslog, journald), each with a
        # close() and a describe() (status lists them as listeners).
        self.socket_sources: list[SocketSource | SyslogSource | JournaldSource] = []
        self.watch: FolderWatch | None = None
        self._build_sources(cfg, starting=True)
        self._stop = threading.Event()
        self._reload = threading.Event()
        self.shipping = False                   # ready: the first scan done (begin)
        self.board = StatusBoard(self)
        self._next_scan = self._next_gauges = self._next_watchdog = 0.0
        self._wall_mark: tuple[float, float] | None = None   # (wall s, monotonic s) last seen
        self._sources_stale = False      # a file source's write was refused: build them again
        self._last_gauges = self._last_scan = self.monotonic()
        self._writes_for_nothing = False       # the last turn: woken by writes, read nothing
        self._behind = False                   # the last turn left bytes unread
        self._gather_s = cfg["buffer.gather_ms"] / 1000
        self._rate, self._rate_mark = 0.0, (self.clock.monotonic_ns(), 0)   # loop._arrival_rate

    def _open_pool(self, cfg: AgentConfig, next_record: int) -> BufferPool:
        spill = cfg["buffer.spill_max_bytes"]
        # The native path's early sends and seals, not with exactly once
        # (agent/drain/native_txn.py): a transaction holds sealed slots only, and a slot
        # sealed at each caught-up turn joins the open transaction, whose commit then waits
        # for its records too (docs/performance.md).
        early = self.send_path == "native" and cfg["broker.delivery"] != "exactly_once"
        return BufferPool(
            cfg.buffer_path, cfg["buffer.size_bytes"], cfg["buffer.slot_size_bytes"],
            linger_ms=cfg["buffer.linger_ms"], seal_when_idle=cfg["buffer.seal_when_idle"],
            seal_when_caught_up=cfg["buffer.seal_when_caught_up"] and early,
            send_filling=cfg["buffer.send_filling"] and early,
            seal_every_ms=cfg["buffer.seal_every_ms"],
            on_full=cfg["buffer.on_full"],
            oversize=cfg["buffer.oversize"], spill_dir=cfg.spill_dir if spill else None,
            spill_max_bytes=spill, quarantine_dir=cfg.quarantine_dir,
            sync_on_seal=cfg["buffer.sync_on_seal"], on_drop=self._pool_dropped,
            on_seal=self._sealed, max_record_bytes=MAX_RECORD_BYTES, clock=self.clock,
            ops=self.seams.pool_ops, first_record=next_record,
            # A thread seals (the disk's syncs) while the loop reads and sends; a test's
            # stand-in file operations seal at once, in the loop, in the order it chose.
            seal_thread=self.seams.pool_ops is None, free_barrier=self.db.sync_log,
            delivered=self._delivered_before(),
            reserve_records=self.numbers.cover if self.numbers is not None else None,
            numbers_found=self._numbers_found if self.numbers is not None else None)

    def _numbers_found(self, found: int) -> int:
        """At the pool's open, every number it holds counted: the next one to give
        (``NumberReserve.start``), the numbers skipped journalled first."""
        return self.numbers.start(found, lambda skipped: self.journal.unused(
            skipped, "reserved before the host started again, with sync_on_seal = false: "
            "given to events before a power loss undid their count, or to none; never given "
            "again"))

    def _delivered_before(self) -> Callable:
        """For the pool's recovery: whether every record of a slot found at open was
        acknowledged (each of its positions at or below its file's acknowledged offset, which
        the state database has durable before any free: ``BufferPool.free``)."""
        acked = {row["source_id"]: row["acked_offset"] for row in self.db.all_files()}
        return lambda meta: acknowledged_whole(meta.positions, acked)

    def _journal_finding(self, finding: Finding) -> None:
        """A part of the state folder the agent could not keep (``agent/state/folder.py``): a
        loss of unknown size for every configured topic."""
        for topic in source_topics(self.cfg.sources):
            self.journal.record(finding.reason, topic, -1, detail=finding.detail)

    def _topics(self) -> list[str]:
        """Every topic this agent writes: its sources' and, when on, the audit topic."""
        audit = [self.cfg["audit.topic"]] if self.cfg["audit.enabled"] else []
        return sorted({*source_topics(self.cfg.sources), *audit})

    def _numbers(self) -> RecordNumbers:
        """For the audit's records: the last record number given, the highest up to which
        every one is acknowledged or dropped (``BufferPool.record_marks``), and the journalled
        ones (known drops)."""
        through, delivered = self.pool.record_marks()
        return RecordNumbers(through, delivered, self.journal.dropped_numbers())

    def monotonic(self) -> float:
        return self.clock.monotonic_ns() / 1e9

    # -- wiring -------------------------------------------------------------------------------
    def _build_sources(self, cfg: AgentConfig, starting: bool = False) -> None:
        """The sources of ``cfg``. A syslog source that cannot listen, or a journald source
        without journalctl, stops the agent at its start (``StartupError``); at a reload it is
        left out, with an error logged, and the other sources run."""
        patterns = [p for s in cfg.sources if s.type == "file" for p in s.paths]
        self.watch = FolderWatch(patterns if self.seams.file_events else [], writes=True)
        for src in cfg.sources:
            if src.type == "file":
                self.file_sources.append(FileSource(src, self.pool, self.db, self.journal,
                                                    self.metrics, self.recovered,
                                                    fs=self.seams.fs, clock=self.clock,
                                                    first_start=self._first_start,
                                                    archives_first=self._archives_first))
            elif src.type == "syslog":
                try:
                    self.socket_sources.append(SyslogSource(src, self.pool, self.metrics,
                                                            self.journal, self.clock,
                                                            on_data=self.wake.notify))
                except StartupError as exc:
                    if starting:
                        raise
                    log.error("%s; the source is left out until the next reload", exc)
            elif src.type == "journald":
                try:
                    self.socket_sources.append(JournaldSource(
                        src, self.pool, self.db, self.journal, self.metrics, self.recovered,
                        self.clock, on_data=self.wake.notify))
                except StartupError as exc:
                    if starting:
                        raise
                    log.error("%s; the source is left out until the next reload", exc)
            else:
                self.socket_sources.append(SocketSource(src, self.pool, self.metrics, self.clock,
                                                        on_data=self.wake.notify,
                                                        journal=self.journal))
        self._first_start = False                # sources built again (a reload) read all
        self._archives_first = False

    def _close_sources(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        for s in self.socket_sources:
            s.close()
        for f in self.file_sources:
            f.close()
        self.file_sources, self.socket_sources = [], []

    def _pool_dropped(self, ev: DropEvent) -> None:
        if ev.slot is not None:                  # a sealed slot, already counted: uncount it
            self.audit.uncount_slot(ev.slot)
        numbers = None
        if ev.first_record is not None and ev.records > 0:
            numbers = (ev.first_record, ev.first_record + ev.records - 1)
        self.journal.record(ev.reason, ev.topic, ev.records, detail=ev.detail,
                            event_ts_ms=ev.slot.meta.min_ts if ev.slot is not None else None,
                            records=numbers)

    def _sealed(self, slot: SealedSlot) -> None:          # under the pool's lock
        self.audit.count_sealed(slot)
        self.checkpoints.sealed(slot)

    def _flush_checkpoints(self, stopping: bool = False) -> None:
        """Write what the checkpoints noted. ``stopping``: also right after a refused write,
        and a refusal is logged (the next start reads those bytes again) instead of waited
        out."""
        if stopping:
            self.disk.written()                  # one more try, whenever the last one was
        self.checkpoints.flush(lambda: self.pool.next_record, self.audit.persist,
                               self.audit.has_pending(), self.audit.persisted)
        if stopping and self.checkpoints.unwritten():
            log.error("stopping with a full disk: %s not written to the state database; the "
                      "next start reads those bytes again (duplicates, no loss)",
                      self.checkpoints.unwritten())

    def _anchors(self, ends: dict[int, int]) -> dict[int, bytes]:
        """The file sources' anchors at the sealed ends about to be written, and the journald
        sources' cursors."""
        out: dict[int, bytes] = {}
        for f in [*self.file_sources,
                  *(s for s in self.socket_sources if isinstance(s, JournaldSource))]:
            out.update(f.anchors(ends))
        return out

    def _slot_done(self, slot: SealedSlot) -> None:
        """Kafka acknowledged every record of ``slot`` (``Checkpoints.acknowledged``). Sealed
        checkpoints noted since the turn wrote its own (slots a socket source's thread
        collected while it waited for room in a full pool) are written first: the acknowledged
        offset is written before the drain frees the slot only when none waits."""
        if self.checkpoints.sealed_waiting():
            self._flush_checkpoints()
        self.checkpoints.acknowledged(slot, self.pool.unacknowledged_starts(
            slot.seq, self.checkpoints.settling(slot)))


def lock_state_dir(state_dir: Path) -> int:
    """Take the state folder's lock and write this process's pid in the lock file; return the
    fd that holds it (closing it, or the process ending, releases the lock). Raises
    StateDirLocked, having changed nothing, when another process holds it."""
    path = state_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StartupError(f"cannot open the state folder's lock file {path}: {exc.strerror}",
                           hint="agent.state_dir must be writable by the agent's user") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        pid = _pid_in(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StateDirLocked(state_dir, pid) from None
        raise StartupError(f"cannot lock {path}: {exc.strerror}",
                           hint="put agent.state_dir on a local file system") from exc
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _pid_in(fd: int) -> int | None:
    """The pid the lock's holder wrote (None if it has not written it yet)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None
