"""The agent's loop: one thread that scans and reads the sources, seals what lingered, writes
the sealed checkpoints, sends to Kafka and serves delivery reports, turn after turn, and sleeps
on one descriptor when there is nothing to do (``wake.py``).

A part of ``Agent`` (``service.py``, the wiring), as a mixin over the parts it wires.
"""

from __future__ import annotations

import logging

from .buffer.slots import FREE_SETTLE_S
from .drain.drain import PUMP_BUDGET
from .logs import flush_held
from .state.diskguard import disk_full

log = logging.getLogger("docket.agent")

READ_BUDGET_BYTES = 8 << 20      # per loop turn, across file sources
GAUGE_INTERVAL_S = 1.0
EVENT_SCAN_MIN_S = 0.05          # file events trigger a scan at most this often
WATCHED_SCAN_S = 10.0            # the poll behind the write watch, when it sees every folder
IDLE_WAIT_S = 0.002              # nothing read or sent: wait this long for delivery reports
IDLE_WAIT_WATCHED_S = 0.05      # ... or this long when a write wakes the wait (watch.py)
IDLE_WAIT_BLOCKED_S = 0.05       # ... and this long when the pool is full
IDLE_WAIT_QUIET_S = 1.0          # ... and up to this long with nothing to send (wake.py)
RATE_WINDOW_NS = 1_000_000_000   # the arrival rate that decides a gather: over a second
GATHER_LIKELY = 0.5              # records expected within a gather's wait for it to wait
GATHER_WAITS = 16                # a gather's waits, each ended by the time or a report
CLOCK_STEP_S = 2.0               # the wall clock moving this much more or less than the
#                                  monotonic one between two looks (a second apart) is a step


class AgentLoop:
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
          linger: until the next duty (a scan, the gauges, the watchdog, the seal of the slot
          sent while it fills), up to ``IDLE_WAIT_QUIET_S``, when nothing is sealed or on its
          way (the Python path too: no report can come) or only that slot's records, all
          handed over (their acknowledgements need no turn; a failure ends the wait);
          ``IDLE_WAIT_WATCHED_S`` when something is, on the native path (its wait ends on a
          report as well);
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
        if self.drain.idle() or self.drain.waits_for_seal():
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
        if (seal := self.pool.seal_at_ns()) is not None:
            due.append(seal / 1e9)               # the slot sent while it fills
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
        self.shipping = True
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
        and its transaction — when the last second's records say another is likely within
        the wait (``GATHER_LIKELY``: at least one per two ``gather_ms``, ``_arrival_rate``).
        Slower, the wait would add its latency and save nothing. (Records, not writes: a
        writer of many lines at once, seldom, has its writes waited for, a latency that costs
        nothing.) A report ends a wait early; the gather waits on, at most ``GATHER_WAITS``
        times."""
        if not self._gather_s:
            return
        rate = self._arrival_rate()
        if self._behind or self.watch.wake_fd < 0 or self.pool.filling() \
                or not self.watch.writes_waiting() or rate * self._gather_s < GATHER_LIKELY:
            return
        until = self.clock.monotonic_ns() + int(self._gather_s * 1e9)
        for _ in range(GATHER_WAITS):
            left = until - self.clock.monotonic_ns()
            if left <= 0:
                break
            self.drain.wait(left / 1e9)

    def _arrival_rate(self) -> float:
        """Records appended to the pool per second, measured at most once a second, at a turn
        (so over the second before, or over a longer wait with nothing to do: a first write
        after a quiet spell finds a low rate and is read at once); 0 until a second has
        passed."""
        now, appended = self.clock.monotonic_ns(), self.pool.counters["records_appended"]
        since, before = self._rate_mark
        if now - since >= RATE_WINDOW_NS:
            self._rate = (appended - before) * 1e9 / (now - since)
            self._rate_mark = (now, appended)
        return self._rate

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
        read, so nothing needs telling: the audit's rounds run on the monotonic clock too."""
        wall, now = self.clock.time_ms() / 1000, self.monotonic()     # read together
        if self._wall_mark is not None:
            step = (wall - self._wall_mark[0]) - (now - self._wall_mark[1])
            if abs(step) > CLOCK_STEP_S:
                log.warning("the wall clock stepped %+.1f s: event times follow it (the "
                            "schedules do not)", step)
                self.metrics.inc("agent_clock_steps_total")
        self._wall_mark = (wall, now)

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
