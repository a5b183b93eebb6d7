"""The reconciler's metrics: ``/metrics`` on ``reconcile.listen``, in the Prometheus text format.

Every value is computed when it is asked for: from the database, through a read-only
connection of the request's own (the loops' connections are never shared), and from what the
running reconciler keeps in memory (records applied since it started, when it last evaluated).
The names are declared once, in ``METRICS``, and described in docs/telemetry.md ("Reconciler
metrics"). Values are printed exactly: integers as integers, floats as Python's ``repr``.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Protocol

from audit.contract.errors import AuditError
from docket_common.pages import Page, PageServer

from .alerts.lifecycle import open_counts
from .alerts.notification import KIND_CLASSES
from .alerts.outbox import DELIVERED, GAVE_UP, PENDING
from .store import Store
from .verdict import COMPLETE, INCOMPLETE, OVERCOUNT, STATES, UNKNOWN

log = logging.getLogger("docket.audit.reconcile")

# name → (type, help). The single list of what the reconciler measures.
METRICS: dict[str, tuple[str, str]] = {
    "reconcile_windows": ("gauge", "Verdicts stored (rows of the windows table: one per topic, "
                          "window and tier), by tier, state and final (0 or 1)."),
    "reconcile_alerts_open": ("gauge", "Open alerts, by kind and alert_class (data, health)."),
    "reconcile_audit_lag_seconds": ("gauge", "Per tier, how long ago its newest progress "
                                    "record arrived (the broker's append time)."),
    "reconcile_producer_last_seen_seconds": ("gauge", "Per origin, how long ago its newest "
                                             "producer record arrived (now minus "
                                             "last_seen_at)."),
    "reconcile_producer_clock_offset_seconds": ("gauge", "Per origin, how far its clock is "
                                                "ahead of the broker's (negative: behind), "
                                                "measured on its newest audit record the "
                                                "broker stamped."),
    "reconcile_records_applied_total": ("counter", "Audit records applied to the database "
                                        "since the reconciler started."),
    "reconcile_records_malformed_total": ("counter", "Malformed audit records skipped, by "
                                          "reason (the malformed table: since the database "
                                          "was created)."),
    "reconcile_notifications": ("gauge", "Alert notifications in the outbox, by status "
                                "(pending, delivered, gave_up)."),
    "reconcile_last_evaluation_timestamp_seconds": ("gauge", "When the windows were last "
                                                    "evaluated (Unix time); absent until the "
                                                    "first evaluation after start."),
}

FINAL_STATES = (COMPLETE, INCOMPLETE, OVERCOUNT, UNKNOWN)   # open and pending are never final
NOTIFICATION_STATUSES = (PENDING, DELIVERED, GAVE_UP)

Sample = tuple[dict[str, str], int | float]


class Tally(Protocol):
    """What the running reconciler keeps in memory (``service.Reconciler``)."""

    db_path: str | Path
    applied: int
    last_evaluation_ms: int | None

    def clock(self) -> float: ...


class MetricsListenError(AuditError):
    """``reconcile.listen`` names an address the server cannot bind."""


def collect(store: Store, applied: int, last_evaluation_ms: int | None,
            now_ms: int) -> dict[str, list[Sample]]:
    """Every metric's samples, from ``store`` and the reconciler's in-memory figures.
    Series that can be zero are listed with 0 (a state no window is in, a kind of alert that
    is not open), so a graph or a rule never sees them vanish."""
    out: dict[str, list[Sample]] = {name: [] for name in METRICS}
    windows = {(tier, state, str(final)): n
               for (tier, state, final), n in store.window_states().items()}
    for tier in sorted({t for t, _s, _f in windows}):
        keys = [(tier, s, "0") for s in STATES] + [(tier, s, "1") for s in FINAL_STATES]
        keys += sorted(k for k in windows if k[0] == tier and k not in keys)
        out["reconcile_windows"] += [({"tier": t, "state": s, "final": f}, windows.get(
            (t, s, f), 0)) for t, s, f in keys]
    open_alerts = open_counts(store)
    for kind, cls in sorted({*KIND_CLASSES.items(), *open_alerts}):
        out["reconcile_alerts_open"].append(({"kind": kind, "alert_class": cls},
                                             open_alerts.get((kind, cls), 0)))
    for tier, at in sorted(store.progress().items()):
        out["reconcile_audit_lag_seconds"].append(({"tier": tier}, (now_ms - at[0]) / 1000))
    for origin, at in sorted(store.producers().items()):
        out["reconcile_producer_last_seen_seconds"].append(({"origin": origin},
                                                            (now_ms - at) / 1000))
    for origin, (offset, _at) in sorted(store.clock_offsets().items()):
        out["reconcile_producer_clock_offset_seconds"].append(({"origin": origin},
                                                               offset / 1000))
    out["reconcile_records_applied_total"].append(({}, applied))
    for reason, n in store.malformed_counts():
        out["reconcile_records_malformed_total"].append(({"reason": reason}, n))
    statuses = store.delivery_statuses()
    for status in sorted({*NOTIFICATION_STATUSES, *statuses}):
        out["reconcile_notifications"].append(({"status": status}, statuses.get(status, 0)))
    if last_evaluation_ms is not None:
        out["reconcile_last_evaluation_timestamp_seconds"].append(({},
                                                                   last_evaluation_ms / 1000))
    return out


def render(samples: dict[str, list[Sample]]) -> str:
    """The Prometheus text format (version 0.0.4) of ``samples``."""
    lines = []
    for name, (kind, help_text) in METRICS.items():
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples.get(name, []):
            shown = ",".join(f'{k}="{escape(v)}"' for k, v in labels.items())
            lines.append(f"{name}{{{shown}}} {number(value)}" if shown else
                         f"{name} {number(value)}")
    return "\n".join(lines) + "\n"


def number(value: int | float) -> str:
    """A sample's value, exactly: an integer as one, a float as ``repr`` gives it."""
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def escape(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote, newline escaped."""
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


class MetricsServer:
    """The threaded HTTP server on ``listen`` (HOST:PORT; port 0 takes a free one, ``port``
    tells which) that answers ``GET /metrics`` from ``tally``'s database and figures."""

    def __init__(self, listen: str, tally: Tally):
        self.tally = tally
        page = Page("text/plain; version=0.0.4; charset=utf-8", lambda: self.page().encode())
        try:
            self.http = PageServer(listen, {"/metrics": page}, "docket-reconcile-metrics", log)
        except OSError as exc:
            raise MetricsListenError(
                f"cannot listen on reconcile.listen = {listen}: {exc.strerror}",
                hint='choose a free port in [reconcile] listen, or listen = "" for no '
                "metrics server") from exc
        self.host, self.port = self.http.host, self.http.port

    def page(self) -> str:
        store = Store(self.tally.db_path, readonly=True)
        try:
            samples = collect(store, self.tally.applied, self.tally.last_evaluation_ms,
                              int(self.tally.clock() * 1000))
        finally:
            store.close()
        return render(samples)

    def start(self) -> MetricsServer:
        self.http.start()
        return self

    def stop(self) -> None:
        self.http.stop()
