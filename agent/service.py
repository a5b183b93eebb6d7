"""The running agent: sources → buffer pool → drain, in one loop; its status (``status``).

One thread runs the loop: scan and read files, seal slots whose linger passed, write sealed
checkpoints, send to Kafka and serve delivery reports. Socket connections and the HTTP status
server have threads of their own. Signals only set flags that the loop acts on:
SIGTERM/SIGINT stop (seal, drain up to ``shutdown_timeout_ms``, persist, exit 0), SIGHUP reloads
the source list from the configuration file.

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
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .audit_emitter import AuditEmitter, RecordNumbers
from .buffer import BufferPool, DropEvent, PoolDamaged, SealedSlot
from .buffer.durable import make_folder
from .buffer.seams import Clock, FileOps
from .buffer.slots import FREE_SETTLE_S
from .config import AgentConfig, ConfigError, load
from .drain.drain import PUMP_BUDGET, Drain
from .drain.native import NativeDrain, NativeUnavailable, choose_send_path, native_module
from .drain.producer import MAX_RECORD_BYTES, producer_config
from .drain.topics import TopicWatch
from .drain.transact import TransactionalDrain
from .errors import StartupError
from .logs import flush_held
from .notify import Notifier
from .state.checkpoints import Checkpoints
from .state.db import StateDB
from .state.diskguard import DiskGuard, disk_full
from .state.folder import (
    Finding,
    PoolWatch,
    examine_state_db,
    pool_damaged,
    pool_of_lost_state,
)
from .state.journal import LossJournal
from .state.selfcheck import acknowledged_whole, rewind_uncovered
from .status import StatusBoard
from .tail.files import FileSource
from .tail.seams import FsOps
from .tail.sock import SocketSource
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


READ_BUDGET_BYTES = 8 << 20      # per loop turn, across file sources
GAUGE_INTERVAL_S = 1.0
EVENT_SCAN_MIN_S = 0.05          # file events trigger a scan at most this often
WATCHED_SCAN_S = 10.0            # the poll behind the write watch, when it sees every folder
IDLE_WAIT_S = 0.002              # nothing read or sent: wait this long for delivery reports
IDLE_WAIT_WATCHED_S = 0.05      # ... or this long when a write wakes the wait (watch.py)
IDLE_WAIT_BLOCKED_S = 0.05       # ... and this long when the pool is full
IDLE_WAIT_QUIET_S = 1.0          # ... and up to this long with nothing to send (wake.py)
# Settings a reload (SIGHUP) cannot change: they choose the drain (docs/agent.md)
RESTART_SETTINGS = ("broker.send_path", "broker.delivery")
CLOCK_STEP_S = 2.0               # the wall clock moving this much more or less than the
#                                  monotonic one between two looks (a second apart) is a step


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
    txn_crash_point: Callable[[str], None] | None = None      # broker.delivery = "exactly_once"
    db_crash_point: Callable[[str], None] | None = None
    file_events: bool = True


class Agent:
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
        return choose_send_path(cfg["broker.send_path"], cfg["broker.delivery"],
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
            db=self.db, agent_id=cfg.agent_id, topics=_topics(cfg.sources),
            audit_topic=cfg["audit.topic"],
            window_ms=cfg["audit.window_ms"], interval_ms=cfg["audit.interval_ms"],
            producer_conf=producer_config(cfg, self.send_path), metrics=self.metrics,
            enabled=cfg["audit.enabled"], clock=lambda: self.clock.time_ms() / 1000,
            incarnation=self.incarnation,
            numbers=self._numbers if cfg["agent.record_numbers"] and cfg["agent.origin_header"]
            else None,
            native_hashes=extension.value_hashes if extension else None)
        self.journal = LossJournal(cfg.journal_path, self.metrics,
                                   on_record=self.audit.dropped, clock=self.clock,
                                   incarnation=self.incarnation)
        # A number a drop took and journalled is never given again, even if the pool's header
        # that counted it was lost with the power (only the journal was synced).
        next_record = max(next_record, self.journal.next_number())
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
        if self.send_path == "native":
            drain_class, native = NativeDrain, {"native_factory": self.seams.native_factory}
        elif cfg["broker.delivery"] == "exactly_once":
            drain_class, native = TransactionalDrain, {
                "agent_id": cfg.agent_id, "incarnation_id": self.incarnation,
                "progress_topic": cfg["broker.progress_topic"],
                "transaction_ms": cfg["broker.transaction_ms"],
                "max_slots": cfg["broker.transaction_max_slots"],
                "transaction_timeout_ms": cfg["broker.transaction_timeout_ms"],
                "crash_point": self.seams.txn_crash_point}
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
        self.socket_sources: list[SocketSource] = []
        self.watch: FolderWatch | None = None
        self._build_sources(cfg)
        self._stop = threading.Event()
        self._reload = threading.Event()
        self.board = StatusBoard(self)
        self._next_scan = self._next_gauges = self._next_watchdog = 0.0
        self._wall_mark: tuple[float, float] | None = None   # (wall s, monotonic s) last seen
        self._sources_stale = False      # a file source's write was refused: build them again
        self._last_gauges = self._last_scan = self.monotonic()
        self._writes_for_nothing = False       # the last turn: woken by writes, read nothing
        self._behind = False                   # the last turn left bytes unread
        self._gather_s = cfg["buffer.gather_ms"] / 1000

    def _open_pool(self, cfg: AgentConfig, next_record: int) -> BufferPool:
        spill = cfg["buffer.spill_max_bytes"]
        return BufferPool(
            cfg.buffer_path, cfg["buffer.size_bytes"], cfg["buffer.slot_size_bytes"],
            linger_ms=cfg["buffer.linger_ms"], seal_when_idle=cfg["buffer.seal_when_idle"],
            seal_when_caught_up=cfg["buffer.seal_when_caught_up"]
            and self.send_path == "native",
            on_full=cfg["buffer.on_full"],
            oversize=cfg["buffer.oversize"], spill_dir=cfg.spill_dir if spill else None,
            spill_max_bytes=spill, quarantine_dir=cfg.quarantine_dir,
            sync_on_seal=cfg["buffer.sync_on_seal"], on_drop=self._pool_dropped,
            on_seal=self._sealed, max_record_bytes=MAX_RECORD_BYTES, clock=self.clock,
            ops=self.seams.pool_ops, first_record=next_record,
            # A thread seals (the disk's syncs) while the loop reads and sends; a test's
            # stand-in file operations seal at once, in the loop, in the order it chose.
            seal_thread=self.seams.pool_ops is None, free_barrier=self.db.sync_log,
            delivered=self._delivered_before())

    def _delivered_before(self) -> Callable:
        """For the pool's recovery: whether every record of a slot found at open was
        acknowledged (each of its positions at or below its file's acknowledged offset, which
        the state database has durable before any free: ``BufferPool.free``)."""
        acked = {row["source_id"]: row["acked_offset"] for row in self.db.all_files()}
        return lambda meta: acknowledged_whole(meta.positions, acked)

    def _journal_finding(self, finding: Finding) -> None:
        """A part of the state folder the agent could not keep (``agent/state/folder.py``): a
        loss of unknown size for every configured topic."""
        for topic in _topics(self.cfg.sources):
            self.journal.record(finding.reason, topic, -1, detail=finding.detail)

    def _topics(self) -> list[str]:
        """Every topic this agent writes: its sources' and, when on, the audit topic."""
        audit = [self.cfg["audit.topic"]] if self.cfg["audit.enabled"] else []
        return sorted({*_topics(self.cfg.sources), *audit})

    def _numbers(self) -> RecordNumbers:
        """For the audit's records: the last record number given, the highest up to which
        every one is acknowledged or dropped (``BufferPool.record_marks``), and the journalled
        ones (known drops)."""
        through, delivered = self.pool.record_marks()
        return RecordNumbers(through, delivered, self.journal.dropped_numbers())

    def monotonic(self) -> float:
        return self.clock.monotonic_ns() / 1e9

    # -- wiring -------------------------------------------------------------------------------
    def _build_sources(self, cfg: AgentConfig) -> None:
        patterns = [p for s in cfg.sources if s.type == "file" for p in s.paths]
        self.watch = FolderWatch(patterns if self.seams.file_events else [], writes=True)
        for src in cfg.sources:
            if src.type == "file":
                self.file_sources.append(FileSource(src, self.pool, self.db, self.journal,
                                                    self.metrics, self.recovered,
                                                    fs=self.seams.fs, clock=self.clock,
                                                    first_start=self._first_start,
                                                    archives_first=self._archives_first))
            else:
                self.socket_sources.append(SocketSource(src, self.pool, self.metrics, self.clock,
                                                        on_data=self.wake.notify))
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
        """The file sources' anchors at the sealed ends about to be written."""
        out: dict[int, bytes] = {}
        for f in self.file_sources:
            out.update(f.anchors(ends))
        return out

    def _slot_done(self, slot: SealedSlot) -> None:
        """Kafka acknowledged every record of ``slot`` (``Checkpoints.acknowledged``). Sealed
        checkpoints noted since the turn wrote its own (slots a socket source's thread
        collected while it waited for room in a full pool) are written first: the acknowledged
        offset is written before the drain frees the slot only when none waits."""
        if self.checkpoints.sealed_waiting():
            self._flush_checkpoints()
        self.checkpoints.acknowledged(slot, self.drain.in_flight_slots(),
                                      self.pool.unacknowledged_starts(slot.seq))

    # -- running ------------------------------------------------------------------------------
    def install_signals(self) -> None:
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        signal.signal(signal.SIGHUP, lambda *_: self._reload.set())
        # A signal also ends the loop's sleep (``agent/wake.py``), on whatever thread it lands.
        signal.set_wakeup_fd(self.wake.write_fd, warn_on_full_buffer=False)
        self._signals_wake = True

    def stop(self) -> None:
        self._stop.set()
        self.wake.notify()

    def status(self) -> dict:
        """The ``/status`` document (``StatusBoard.document``)."""
        return self.board.document()

    def run(self) -> int:
        self.board.serve(self.cfg["status.listen"])
        self.audit.start()
        self.topic_watch.start()
        self.begin()
        while not self._stop.is_set():
            read, sent, blocked = self.turn()
            if not self._behind and sent < PUMP_BUDGET:
                # Nothing left unread or unsent by this turn: the next one waits for a
                # write, a report or a duty (``_idle_wait``), as after a turn that did nothing.
                self.drain.wait(*self._idle_wait(blocked))
        return self.shutdown()

    def _idle_wait(self, blocked: bool) -> tuple[float, int]:
        """How long an idle turn may wait for delivery reports, and the descriptor that ends
        the wait (-1: none; ``agent/wake.py``: a file written, a folder changed, a stop, a
        signal):

        - while the pool pushes back, ``IDLE_WAIT_BLOCKED_S``;
        - when every source can end the wait (the write watch on the file sources' folders; a
          socket source's threads wake it when they append) and no record waits for its
          linger: until the next duty (a scan, the gauges, the watchdog), up to
          ``IDLE_WAIT_QUIET_S``, when nothing is sealed or on its way (the Python path too: no
          report can come); ``IDLE_WAIT_WATCHED_S`` when something is, on the native path
          (its wait ends on a report as well);
        - else a turn every ``IDLE_WAIT_S`` (the Python path's poll cannot end on a
          descriptor while reports may come).

        A turn woken by writes that read nothing (another file of a watched folder, written
        busily) waits ``IDLE_WAIT_S`` deaf to them: never more turns than the 2 ms look."""
        if blocked:
            return IDLE_WAIT_BLOCKED_S, -1
        if self._writes_for_nothing or (self.file_sources and self.watch.wake_fd < 0):
            return IDLE_WAIT_S, -1
        native = self.drain.WAKES_ON_FD
        if self.pool.filling():
            return IDLE_WAIT_S, self.wake.fd(self.watch.writes) if native else -1
        if self.drain.idle():
            return self._until_next_duty(), self.wake.fd(self.watch.writes)
        if native:
            return IDLE_WAIT_WATCHED_S, self.wake.fd(self.watch.writes)
        return IDLE_WAIT_S, -1

    def _until_next_duty(self) -> float:
        """Seconds until the loop has something to do with nothing arriving: a scan (or the
        one a folder's change asks for), the gauges, the watchdog, a multiline event or a
        partial line to flush, a journal write to try again; at least ``IDLE_WAIT_S``, at
        most ``IDLE_WAIT_QUIET_S``."""
        if self.journal.waiting():
            return IDLE_WAIT_WATCHED_S
        if any(f.rescan for f in self.file_sources):
            return IDLE_WAIT_S                   # a file closed while idle was written
        due = [self._next_scan, self._next_gauges]
        if self.pool.freeing():
            due.append(self.monotonic() + FREE_SETTLE_S)
        if self.notifier.watchdog_interval_s:
            due.append(self._next_watchdog)
        if self.watch.pending():
            due.append(self._last_scan + EVENT_SCAN_MIN_S)
        due.extend(d for d in (f.due() for f in self.file_sources) if d is not None)
        return min(IDLE_WAIT_QUIET_S, max(IDLE_WAIT_S, min(due) - self.monotonic()))

    def begin(self) -> None:
        """The first scan (every file the state database knows, and what vanished while the
        agent was stopped), then READY=1."""
        for f in self.file_sources:
            f.scan()
        self._last_scan = self.monotonic()
        sealed = self.pool.stats()["sealed_slots"]
        self.notifier.ready(f"recovered {sealed} sealed slot(s); shipping")
        log.info("agent %s ready: %d sealed slot(s) recovered; send path %s (%s)",
                 self.cfg.agent_id, sealed, self.drain.describe(), self.send_path_why)

    def turn(self) -> tuple[int, int, bool]:
        """One turn of the loop: scan when due, read, seal what lingered, send it, checkpoint, serve
        delivery reports and send on.
        Returns (bytes read, records sent, whether the pool pushed back)."""
        now = self.monotonic()
        damage = self.pool_watch.check()
        if damage is not None:
            self._pool_lost(damage)
            return 0, 0, False
        if self._reload.is_set():
            self._reload.clear()
            try:
                self._do_reload()
            except Exception as exc:
                if not disk_full(exc):
                    raise
                log.error("reload cut short by a full disk (%s): the running sources are "
                          "built again once there is room; reload again then", exc)
                self.disk.refused(exc, "reloading")
                self._sources_stale = True
        read, blocked, caught_up = 0, False, False
        self.wake.clear()
        self._gather()
        written = self.watch.writes_seen()       # before the reads: a later write wakes the wait
        if self.journal.waiting() and self.disk.write_due() and self.journal.retry():
            self.disk.written()
        if self.disk.check():                    # no room for what reading writes: wait
            blocked = True
        elif self._sources_stale:
            self._renew_sources()
        else:
            try:
                read, blocked, caught_up = self._read(now)
            except Exception as exc:
                if not disk_full(exc):
                    raise
                self.disk.refused(exc, "reading the sources (a state database write)")
                self._sources_stale = True
        self._writes_for_nothing = written and not read
        self._behind = read > 0 and not caught_up
        self.pool.seal_due(caught_up)
        # A slot just sealed goes to Kafka before the checkpoints are written (their SQLite
        # transaction is off its path); no report is served before they are, so no slot is
        # acknowledged and freed with its sealed checkpoint unwritten.
        sent = self.drain.pump(reports=False)
        self._flush_checkpoints()
        sent += self.drain.pump()
        self.pool.settle_frees()
        if now >= self._next_gauges:
            flush_held()
            self._watch_wall_clock()
            self.board.update_gauges(now - self._last_gauges)
            self._last_gauges, self._next_gauges = now, now + GAUGE_INTERVAL_S
        if self.notifier.watchdog_interval_s and now >= self._next_watchdog:
            self._feed_watchdog()
            self._next_watchdog = now + self.notifier.watchdog_interval_s
        return read, sent, blocked

    def _gather(self) -> None:
        """``buffer.gather_ms``: a turn that a write woke (every source read to its end the
        turn before, nothing filling) first waits that long, deaf to more writes and serving
        delivery reports, so the lines written meanwhile share its read, its slot, its syncs
        and its transaction."""
        if not self._gather_s or self._behind or self.watch.wake_fd < 0 \
                or self.pool.filling() or not self.watch.writes_waiting():
            return
        until = self.clock.monotonic_ns() + int(self._gather_s * 1e9)
        while (left := until - self.clock.monotonic_ns()) > 0:
            self.drain.wait(left / 1e9)

    def _feed_watchdog(self) -> None:
        """WATCHDOG=1, from the loop alone (a loop that stops turning stops it), and only
        while the drain is not wedged: replaced producers that still had nothing acknowledged
        (``Drain.wedged``) leave it unfed, so systemd restarts the agent (WatchdogSec); the pool
        keeps every slot for the next start."""
        if self.drain.wedged():
            return
        self.notifier.watchdog()

    def _watch_wall_clock(self) -> None:
        """Compare the wall clock's progress with the monotonic clock's since the last look: a
        difference over ``CLOCK_STEP_S`` is a step (NTP, an operator). Waits and deadlines run
        on the monotonic clock and event times are what the wall clock said when each event was
        read, so only the audit's wall-clock schedule needs telling."""
        wall, now = self.clock.time_ms() / 1000, self.monotonic()     # read together
        if self._wall_mark is not None:
            step = (wall - self._wall_mark[0]) - (now - self._wall_mark[1])
            if abs(step) > CLOCK_STEP_S:
                log.warning("the wall clock stepped %+.1f s: event times follow it; the audit "
                            "rounds start again from now", step)
                self.metrics.inc("agent_clock_steps_total")
                self.audit.clock_stepped()
        self._wall_mark = (wall, now)

    def _pool_lost(self, damage: str) -> None:
        """The pool file was deleted, replaced or cut short under the agent: stop, exit 1
        (``agent/state/folder.py``)."""
        self.exit_code = 1
        self._stop.set()
        if damage == "truncated":
            self._pool_gone = True
            log.error("the buffer pool %s was cut short under the running agent: stopping at "
                      "once without touching it again; the next start moves it aside and reads "
                      "again from the files what it held unacknowledged", self.cfg.buffer_path)
        else:
            log.error("the buffer pool %s was %s under the running agent: stopping (sending what "
                      "it holds first, up to agent.shutdown_timeout_ms); the next start creates "
                      "a new pool and reads again from the files what was not acknowledged",
                      self.cfg.buffer_path, damage)

    def _renew_sources(self) -> None:
        """A write of a file source was refused for lack of space: what it holds in memory
        may be ahead of the state database. Once writes pass, the file sources are built again
        from the database, as a reload does (what was read is sealed and checkpointed first)."""
        try:
            self.pool.seal_all()
            self._flush_checkpoints()
            if self.disk.refusing:
                return
            self._close_sources()
            self.recovered = {}
            self._build_sources(self.cfg)
        except Exception as exc:
            if not disk_full(exc):
                raise
            self.disk.refused(exc, "building the file sources again")
            return
        self._sources_stale = False
        log.info("file sources built again from the state database after the full disk")

    def _read(self, now: float) -> tuple[int, bool, bool]:
        """Scan when due, then read every file source within the turn's budget. Returns (bytes
        read, whether the pool pushed back, whether every file source was read to its end)."""
        rescan = any(f.rescan for f in self.file_sources) or \
            (now - self._last_scan >= EVENT_SCAN_MIN_S and self.watch.consume())
        if rescan or now >= self._next_scan:
            # The timed scan behind a watch of every folder is a safety net: it lists only
            # folders that changed (``FileSource.scan``).
            safety = not rescan and self.watch.covers_all()
            self._last_scan = now
            for f in self.file_sources:
                f.scan(safety=safety)
            every = min((f.cfg.poll_interval_ms for f in self.file_sources), default=250) / 1000
            if self.watch.covers_all() and not any(f.settling() for f in self.file_sources):
                every = max(every, WATCHED_SCAN_S)       # events wake the scans: a safety net
            self._next_scan = now + every
        read, blocked, caught_up = 0, False, bool(self.file_sources)
        written = self.watch.written_paths()     # None: any file may have been written
        for f in self.file_sources:
            got = f.read_some(READ_BUDGET_BYTES, written)
            read += got.bytes
            blocked |= got.blocked
            caught_up &= got.bytes < READ_BUDGET_BYTES
        return read, blocked, caught_up and not blocked

    def abandon(self) -> None:
        """For tests that simulate a SIGKILL: let go of every descriptor, lock and mapping as
        the kernel would, writing nothing (no seal, no checkpoint, no size stored)."""
        for f in self.file_sources:
            f.abandon()
        if getattr(self, "watch", None) is not None:
            self.watch.stop()
        if getattr(self, "wake", None) is not None:
            self._close_wake()
        if self.pool is not None:
            self.pool.abandon()
        if getattr(self, "pool_watch", None) is not None:
            self.pool_watch.close()
        if self.db is not None:
            self.db.close()                      # an open transaction rolls back
        if self.journal is not None:
            self.journal.close()
        os.close(self._state_lock)

    def _close_wake(self) -> None:
        if self._signals_wake:
            signal.set_wakeup_fd(-1)
            self._signals_wake = False
        self.wake.close()

    def _do_reload(self) -> None:
        self.notifier.reloading()
        try:
            cfg = load(self.cfg.file)
        except ConfigError as exc:
            log.error("reload refused, keeping the running sources: %s", exc.render())
            self.notifier.ready("reload refused, running sources kept")
            return
        for key in RESTART_SETTINGS:
            if cfg[key] != self.cfg[key]:
                log.warning("reload: %s = %r takes effect at the next start; this agent goes "
                            "on with %r (send path %s)", key, cfg[key], self.cfg[key],
                            self.send_path)
        try:
            conf = producer_config(cfg, self.send_path)       # the secret files, read again
        except ConfigError as exc:
            log.error("reload refused, keeping the running settings: %s", exc.render())
            self.notifier.ready("reload refused, running settings kept")
            return
        if conf != self.drain.conf or self.drain.broker_state != "up":
            # Credentials (read again from their files) or the cluster changed, or the
            # cluster refuses us: every Kafka client starts afresh with what the files say.
            # (the settings a reload cannot change stay as the agent runs them)
            self.cfg.values = {**self.cfg.values, **{
                k: v for k, v in cfg.values.items()
                if k.startswith("broker.") and k not in RESTART_SETTINGS}}
            self.drain.reconfigure(conf)
            self.topic_watch.reconfigure(conf)
            self.audit.reconfigure(conf)
            log.info("reloaded: Kafka clients rebuilt (%s)", cfg.security.describe())
        self.pool.seal_all()
        self._flush_checkpoints()
        self._close_sources()
        self.recovered = {}
        self.cfg.sources = cfg.sources
        self.audit.topics = _topics(cfg.sources)     # heartbeats follow the sources
        self._build_sources(cfg)
        log.info("reloaded: %d source(s)", len(cfg.sources))
        self.notifier.ready(f"reloaded {len(cfg.sources)} source(s)")

    def shutdown(self) -> int:
        self.notifier.stopping()
        for s in self.socket_sources:
            s.close()
        if self._pool_gone:
            return self._stop_without_pool()
        self.pool.seal_all()
        self._flush_checkpoints(stopping=True)
        deadline = self.monotonic() + self.cfg["agent.shutdown_timeout_ms"] / 1000
        if self.drain.reachable:
            emptied = self.drain.drain_until(deadline)
        else:
            log.warning("stopping while the cluster is %s: not waiting for it; what is not "
                        "acknowledged stays in the pool for the next start",
                        self.drain.broker_state)
            emptied = self.drain.idle()
        reachable = self.drain.reachable
        self.topic_watch.stop()
        self.drain.close()
        self._flush_checkpoints(stopping=True)   # dead letters found while draining
        # A last round of counts, unless the cluster does not answer: the counts are persisted
        # and the next start sends them.
        self.audit.stop(last_round=reachable)
        left = self.pool.stats()
        log.info("stopped: %s", "everything acknowledged" if emptied else
                 f"{left['sealed_records']} record(s) stay in the pool for the next start")
        for f in self.file_sources:
            try:
                f.close()                        # stores the sizes last seen
            except Exception as exc:
                if not disk_full(exc):
                    raise
                log.error("stopping with a full disk: %s's last sizes not stored (%s)",
                          f.cfg.topic, exc)
        self.watch.stop()
        self._close_wake()
        self.board.close()
        self.pool.close()
        self.pool_watch.close()
        self.journal.close()
        self.db.close()
        os.close(self._state_lock)              # the next agent may start
        return self.exit_code

    def _stop_without_pool(self) -> int:
        """Stop when the pool file was cut short: the checkpoints noted so far are written,
        the pool's mapping is left alone (a page past the file's end is SIGBUS), as is the
        drain (its slots live there); the process ends."""
        self._flush_checkpoints()
        self.topic_watch.stop()
        self.audit.stop(last_round=False)
        self.watch.stop()
        self._close_wake()
        self.board.close()
        self.pool.abandon()
        self.pool_watch.close()
        self.journal.close()
        self.db.close()
        os.close(self._state_lock)
        log.info("stopped: the buffer pool was cut short; what it held is read again at the "
                 "next start")
        return self.exit_code


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


def _topics(sources) -> list[str]:
    """The topics of the configured sources: each gets an audit heartbeat."""
    return sorted({s.topic for s in sources})
