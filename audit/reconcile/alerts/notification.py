"""One alert event as the reconciler hands it over, and how it reads to people.

A :class:`Notification` is one event of one alert: ``firing`` or ``resolved``. Its JSON form
(:meth:`Notification.to_json`) is what the outbox stores and what the generic webhook body
carries, with ``"v": 1`` so receivers can tell the format apart from a later one.

Times are milliseconds since the epoch (UTC). ``headline()`` is the one line every channel
leads with (the e-mail subject, the Slack text); ``text()`` is the plain-text account of every
field and every detail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields

from docket_common.formats import utc_iso, utc_minute

VERSION = 1
EVENTS = ("firing", "resolved")
DATA, HEALTH = "data", "health"
CLASSES = (DATA, HEALTH)
# Every kind of alert and its class: data that did not arrive or arrived changed, or the health
# of the audit itself. The reconciler raises them, channels route them, the dashboard lists them.
KIND_CLASSES = {"loss": DATA, "duplication": DATA, "checksum_mismatch": DATA,
                "audit_lag": HEALTH, "silent_producer": HEALTH, "clock_skew": HEALTH}
KINDS = tuple(KIND_CLASSES)
DATA_KINDS = tuple(k for k, c in KIND_CLASSES.items() if c == DATA)
# How urgent each kind is, for routing (Alertmanager's ``severity`` label): data that did not
# arrive, or arrived changed, first; an audit pipeline that cannot tell, next; a fact to fix.
SEVERITIES = {"loss": "critical", "duplication": "critical", "checksum_mismatch": "critical",
              "audit_lag": "warning", "silent_producer": "warning", "clock_skew": "info"}


def idempotency_key(alert_id: int, event: str, channel: str) -> str:
    """The key of one event of one alert on one channel: the same on every attempt and after a
    restart, so a receiver can drop a notification it already has."""
    return f"docket-{alert_id}-{event}-{channel}"


@dataclass(frozen=True)
class Notification:
    alert_id: int
    event: str                 # "firing" | "resolved"
    kind: str                  # one of KINDS
    alert_class: str           # "data" | "health"
    topic: str | None
    window_start: int | None   # ms since epoch (UTC) of the event-time window
    window_ms: int | None
    tier: str | None
    origin: str | None
    owner: str | None
    summary: str               # one line for people
    detail: dict               # JSON-able: expected, actual, missing ranges, reason, ...
    fired_at: int              # ms
    resolved_at: int | None    # ms

    def __post_init__(self):
        problems = []
        if self.event not in EVENTS:
            problems.append(f"event must be one of {EVENTS}, not {self.event!r}")
        if self.kind not in KINDS:
            problems.append(f"kind must be one of {KINDS}, not {self.kind!r}")
        if self.alert_class not in CLASSES:
            problems.append(f"alert_class must be one of {CLASSES}, not {self.alert_class!r}")
        if self.event == "resolved" and self.resolved_at is None:
            problems.append("a resolved event needs resolved_at")
        if "\n" in self.summary:
            problems.append("summary must be one line")
        try:
            json.dumps(self.detail)
        except (TypeError, ValueError) as exc:
            problems.append(f"detail must be JSON-able: {exc}")
        if problems:
            raise ValueError("invalid notification: " + "; ".join(problems))

    @property
    def severity(self) -> str:
        """``critical``, ``warning`` or ``info``: the kind's (``SEVERITIES``)."""
        return SEVERITIES[self.kind]

    # -- JSON ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The fields as they are (``detail`` is not copied: ``asdict``'s deep copy of its
        missing ranges was most of the cost of queuing an alert), and the severity."""
        return {"v": VERSION, **{f.name: getattr(self, f.name) for f in fields(self)},
                "severity": self.severity}

    @classmethod
    def from_json(cls, d: dict) -> Notification:
        """The inverse of :meth:`to_json`. Keys it does not know (``idempotency_key`` of a
        webhook body) are ignored; a missing field or another version is a ``ValueError``."""
        if not isinstance(d, dict):
            raise ValueError(f"a notification is a JSON object, not {type(d).__name__}")
        if d.get("v", VERSION) != VERSION:
            raise ValueError(f"notification version {d.get('v')!r} is not {VERSION}")
        names = [f.name for f in fields(cls)]
        missing = [n for n in names if n not in d]
        if missing:
            raise ValueError(f"notification without {', '.join(missing)}")
        return cls(**{n: d[n] for n in names})

    # -- for people ---------------------------------------------------------------------------
    def headline(self) -> str:
        """``FIRING loss app.events 2026-11-23T07:10Z kafka-local web-42``: what, where, when;
        absent parts left out. A grouped alert of several origins names how many
        (``… kafka-local 120 origins``)."""
        parts = [self.event.upper(), self.kind, self.topic,
                 None if self.window_start is None else utc_minute(self.window_start),
                 self.tier, self.origins() or self.origin]
        return " ".join(p for p in parts if p)

    def origins(self) -> str | None:
        """``120 origins`` for a grouped alert that covers others than the one origin it
        fired for (its detail lists ``members``), else None."""
        n = self.detail.get("origins")
        if not isinstance(n, int) or "members" not in self.detail:
            return None
        return f"{n} origin{'s' if n != 1 else ''}"

    def facts(self) -> list[tuple[str, str]]:
        """(label, value) of every field but the summary and the detail, in reading order."""
        window = "—"
        if self.window_start is not None:
            window = utc_iso(self.window_start)
            if self.window_ms:
                window += (f" to {utc_iso(self.window_start + self.window_ms)}"
                           f" ({self.window_ms} ms)")
        return [
            ("Alert", f"{self.alert_id} ({self.alert_class} alert, {self.severity})"),
            ("Event", self.event),
            ("Kind", self.kind),
            ("Topic", self.topic or "—"),
            ("Window", window),
            ("Tier", self.tier or "—"),
            ("Origin", self.origin or "—"),
            *([("Origins", self.origins())] if self.origins() else []),
            ("Owner", self.owner or "—"),
            ("Fired at", utc_iso(self.fired_at, millis=True)),
            ("Resolved at", "—" if self.resolved_at is None
             else utc_iso(self.resolved_at, millis=True)),
        ]

    def detail_lines(self) -> list[tuple[str, str]]:
        """(key, value) of every detail, in key order; lists and tables as compact JSON."""
        return [(k, v if isinstance(v, str) else json.dumps(v, separators=(",", ":")))
                for k, v in sorted(self.detail.items())]

    def text(self) -> str:
        """A plain-text account of the event: the summary, every field, every detail."""
        width = max(len(label) for label, _ in self.facts()) + 1
        lines = [f"{self.event.upper()}: {self.summary}", ""]
        lines += [f"{label + ':':<{width}} {value}" for label, value in self.facts()]
        if self.detail:
            lines += ["", "Detail:"]
            lines += [f"  {key}: {value}" for key, value in self.detail_lines()]
        return "\n".join(lines) + "\n"


def digest_summary(ns: list[Notification], max_per_period: int, period_ms: int) -> str:
    """``3 alert notifications held back by the rate limit (100 per 600 s): FIRING loss ×2,
    RESOLVED silent_producer ×1``."""
    tally: dict[str, int] = {}
    for n in ns:
        what = f"{n.event.upper()} {n.kind}"
        tally[what] = tally.get(what, 0) + 1
    return (f"{len(ns)} alert notification{'s' if len(ns) != 1 else ''} held back by the rate "
            f"limit ({max_per_period} per {period_ms // 1000} s): "
            + ", ".join(f"{what} ×{count}" for what, count in tally.items()))
