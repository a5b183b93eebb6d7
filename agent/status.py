"""What the running agent says of itself: its gauges, each ``GAUGE_INTERVAL_S`` of its loop
(``telemetry.Metrics``, served as Prometheus text at ``/metrics``), the ``/status`` JSON
document (``docket-agent status`` prints it; docs/agent.md lists its fields), the systemd
status line, and the HTTP server at ``status.listen`` that serves both.

The board reads the agent's parts (pool, drain, sources, journal, audit emitter) and changes
none of them; the server has a thread of its own.
"""

from __future__ import annotations

import json
import logging
from importlib.metadata import version
from typing import TYPE_CHECKING, Protocol

from docket_common.formats import utc_iso
from docket_common.pages import Page, PageServer

from .config import weakened_delivery
from .errors import StartupError

if TYPE_CHECKING:
    from .audit_emitter import AuditEmitter
    from .buffer import BufferPool
    from .buffer.seams import Clock
    from .config import AgentConfig
    from .drain.drain import Drain
    from .drain.topics import TopicWatch
    from .notify import Notifier
    from .state.checkpoints import Checkpoints
    from .state.diskguard import DiskGuard
    from .state.journal import LossJournal
    from .tail.files import FileSource
    from .telemetry import Metrics

log = logging.getLogger("docket.agent.status")


class Listening(Protocol):
    """A source that listens (the unix socket, syslog): what status shows of it."""

    def describe(self) -> dict: ...


class Observed(Protocol):
    """What the board reads of the running agent (``service.Agent`` is one), and only reads."""

    cfg: AgentConfig
    clock: Clock
    pool: BufferPool
    drain: Drain
    file_sources: list[FileSource]
    socket_sources: list[Listening]
    checkpoints: Checkpoints
    journal: LossJournal
    disk: DiskGuard
    audit: AuditEmitter
    topic_watch: TopicWatch
    notifier: Notifier
    metrics: Metrics
    send_path: str
    send_path_why: str

    def monotonic(self) -> float: ...


class StatusBoard:
    """The status of ``agent``: gauges, the status document, the HTTP server."""

    def __init__(self, agent: Observed):
        self.agent = agent
        self.started = agent.monotonic()         # uptime on the monotonic clock: steps
        #                                          of the wall clock do not change it
        self.rates = {"in_events_s": 0.0, "out_events_s": 0.0}
        self._prev_counts = (0.0, 0.0)          # events read / sent at the last gauge update
        self._http: PageServer | None = None

    # -- gauges ---------------------------------------------------------------------------------
    def update_gauges(self, elapsed: float) -> None:
        """Set the gauges from the pool and the sources, the rates over ``elapsed`` seconds,
        and the systemd status line."""
        a = self.agent
        m = a.metrics
        st = a.pool.stats()
        m.set("agent_buffer_size_bytes", a.pool.geometry.file_bytes)
        m.set("agent_disk_full", int(a.disk.full))
        if a.disk.free_bytes is not None:
            m.set("agent_state_free_bytes", a.disk.free_bytes)
        # Each pool slot in one state (they add up to the pool's slot count); spilled slots
        # are outside the pool, on disk.
        for state, key in (("free", "free_slots"), ("filling", "filling_slots"),
                           ("sealed", "waiting_slots"), ("in_flight", "sending_slots"),
                           ("spilled", "spilled_slots")):
            m.set("agent_buffer_slots", st[key], state=state)
        for policy in ("split", "truncated", "dropped"):
            m.set("agent_buffer_oversize_lines_total", st[f"oversize_{policy}"], policy=policy)
        m.set("agent_buffer_quarantined_slots_total", st["slots_quarantined"])
        events, nbytes = backlog(st)
        m.set("agent_buffer_backlog_bytes", nbytes)
        m.set("agent_buffer_backlog_events", events)
        m.set("agent_buffer_oldest_unacked_age_seconds",
              self.oldest_unacked_age(a.pool.sealed()))
        m.set("agent_drain_unacknowledged_seconds", round(a.drain.unacknowledged_s(), 3))
        m.clear("agent_source_lag_bytes")
        for f in a.file_sources:
            for path, lag in f.lag().items():
                m.set("agent_source_lag_bytes", lag, path=path)
        ins = m.get("agent_source_read_events_total")
        outs = m.get("agent_drain_sent_events_total")
        if elapsed > 0:
            self.rates = {"in_events_s": (ins - self._prev_counts[0]) / elapsed,
                          "out_events_s": (outs - self._prev_counts[1]) / elapsed}
        self._prev_counts = (ins, outs)
        a.notifier.status(f"in {self.rates['in_events_s']:.0f}/s, out "
                          f"{self.rates['out_events_s']:.0f}/s, backlog "
                          f"{events} events, broker {a.drain.broker_state}")

    def oldest_unacked_age(self, sealed: list) -> float:
        """Seconds since the oldest sealed slot not yet acknowledged was sealed."""
        if not sealed:
            return 0.0
        t = self.agent.checkpoints.seal_time(sealed[0].seq)
        return self.agent.monotonic() - t if t is not None else 0.0

    # -- the document ---------------------------------------------------------------------------
    def document(self) -> dict:
        a = self.agent
        st = a.pool.stats()
        m = a.metrics
        events, nbytes = backlog(st)
        sealed = a.pool.sealed()
        oldest_event_ms = min((s.meta.min_ts for s in sealed), default=None)
        return {
            "agent_id": a.cfg.agent_id,
            "version": version("docket"),
            "uptime_s": round(a.monotonic() - self.started, 1),
            "rates": {k: round(v, 1) for k, v in self.rates.items()},
            "totals": {"read_events": m.get("agent_source_read_events_total"),
                       "read_bytes": m.get("agent_source_read_bytes_total"),
                       "sent_events": m.get("agent_drain_sent_events_total"),
                       "retried_events": m.get("agent_drain_retried_events_total")},
            "pool": {"path": str(a.cfg.buffer_path),
                     "file_bytes": a.pool.geometry.file_bytes,
                     "configured_bytes": a.cfg["buffer.size_bytes"],
                     "occupancy": round(1 - st["free_slots"] / st["slot_count"], 4), **st},
            "backlog": {"bytes": nbytes, "events": events,
                        "sealed_events": st["sealed_records"],
                        "filling_events": st["filling_records"],
                        "oldest_unacked_age_s": round(self.oldest_unacked_age(sealed), 3),
                        "oldest_unacked_event_age_s": round(
                            (a.clock.time_ms() - oldest_event_ms) / 1000, 3)
                        if oldest_event_ms is not None else None},
            "files": {p: {"lag_bytes": lag} for f in a.file_sources
                      for p, lag in f.lag().items()},
            "files_waiting": _merge_waiting(f.waiting() for f in a.file_sources),
            "listeners": [s.describe() for s in a.socket_sources],
            "broker": {"state": a.drain.broker_state,
                       "bootstrap_servers": a.cfg["broker.bootstrap_servers"],
                       "security": a.cfg.security.describe(),
                       "send_path": a.send_path, "send_path_why": a.send_path_why,
                       "outages": m.get("agent_drain_outages_total"),
                       "stall": _stall(a.drain.stall),
                       "unacknowledged_s": round(a.drain.unacknowledged_s(), 1),
                       "producer_replacements": m.by("agent_drain_producer_replacements_total",
                                                     "reason"),
                       "missing_topics": list(a.topic_watch.missing),
                       "topics_checked": a.topic_watch.checked,
                       "auto_create_topics": a.topic_watch.auto_create,
                       "weakened_delivery": [k for k, _ in weakened_delivery(
                           a.cfg["broker.librdkafka_options"])]},
            "disk": a.disk.describe(),
            "dropped_events": m.get("agent_dropped_events_total"),
            "loss_journal": {
                "path": str(a.journal.path),
                "entries": m.total("agent_loss_journal_entries_total"),
                "unknown_size": m.total("agent_loss_journal_entries_total", size="unknown"),
                "waiting_in_memory": a.journal.waiting()},
            "audit": {"enabled": a.cfg["audit.enabled"], "topic": a.cfg["audit.topic"],
                      "last_emission_ms": a.audit.last_emission_ms,
                      "seq": a.audit.seq},
        }

    # -- the HTTP server ------------------------------------------------------------------------
    def serve(self, listen: str) -> None:
        """Serve ``/metrics`` and ``/status`` at ``listen`` (``host:port``) from a thread."""
        pages = {"/metrics": Page("text/plain; version=0.0.4",
                                  lambda: self.agent.metrics.prometheus().encode()),
                 "/status": Page("application/json",
                                 lambda: json.dumps(self.document()).encode())}
        try:
            self._http = PageServer(listen, pages, "docket-status", log).start()
        except OSError as exc:
            raise StartupError(f"cannot listen on status.listen = {listen}: {exc.strerror}",
                               hint="choose a free port in [status] listen") from exc

    def close(self) -> None:
        if self._http is not None:
            self._http.stop()


def backlog(st: dict) -> tuple[int, int]:
    """Events and bytes accepted and not yet acknowledged: sealed (waiting or in flight, in
    the pool or spilled) and in the slots still filling — events read minus events sent,
    drops aside."""
    return (st["sealed_records"] + st["filling_records"],
            st["sealed_bytes"] + st["filling_bytes"])


def _stall(stall: dict | None) -> dict | None:
    """The stall being handled (``Drain.stall``) as status shows it: since when nothing was
    acknowledged (RFC 3339, UTC) and how many producers were replaced since."""
    if stall is None:
        return None
    return {"since": utc_iso(stall["since_ms"], millis=True),
            "replacements": stall["replacements"]}


def _merge_waiting(parts) -> dict:
    out: dict = {"unreadable": {}, "orphans_waiting": [], "copies_held": [], "folders_away": {},
                 "compressed": [], "ignored_older": 0, "idle_closed": 0,
                 "over_max_open_files": 0}
    for part in parts:
        out["ignored_older"] += part["ignored_older"]
        out["idle_closed"] += part["idle_closed"]
        out["over_max_open_files"] += part["over_max_open_files"]
        out["unreadable"].update(part["unreadable"])
        out["compressed"] += part["compressed"]
        out["folders_away"].update(part["folders_away"])
        out["orphans_waiting"] += part["orphans_waiting"]
        out["copies_held"] += part["copies_held"]
    return out
