"""The agent under control: signals, a reload of the source list (SIGHUP), a graceful stop
(SIGTERM: seal, drain up to ``shutdown_timeout_ms``, persist), a stop without its pool, a pool
lost under the running agent, and ``abandon`` (the tests' crash).

A part of ``Agent`` (``service.py``, the wiring), as a mixin over the parts it wires.
"""

from __future__ import annotations

import logging
import os
import signal

from .config import ConfigError, load, source_topics
from .drain.producer import producer_config
from .state.diskguard import disk_full

log = logging.getLogger("docket.agent")

# Settings a reload (SIGHUP) cannot change: they choose the drain (docs/agent.md)
RESTART_SETTINGS = ("broker.send_path", "broker.delivery")


class AgentControl:
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

    def abandon(self) -> None:
        """For tests that simulate a SIGKILL: let go of every descriptor, lock and mapping as
        the kernel would, writing nothing (no seal, no checkpoint, no size stored). The
        threads that would die with the process are told to end (the topic check's, the
        audit rounds'), none waited for: each holds the agent's Kafka clients, which would
        otherwise stay alive, connecting, as long as the process."""
        if getattr(self, "topic_watch", None) is not None:
            self.topic_watch.stop()
        if getattr(self, "audit", None) is not None:
            self.audit.abandon()
        for f in self.file_sources:
            f.abandon()
        for s in getattr(self, "socket_sources", []):
            s.abandon()                          # listeners end appending nothing more
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
        self.audit.topics = source_topics(cfg.sources)     # heartbeats follow the sources
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
                          f.cfg.label, exc)
        self.watch.stop()
        self._close_wake()
        self.board.close()
        given = self.pool.next_record
        self.pool.close()                       # synced: the file header counts every number
        if self.numbers is not None:
            self.numbers.stopped(given, journalled=not self.journal.waiting())
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
