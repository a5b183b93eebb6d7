"""``docket-audit show --db``: the reconciler's verdicts as a person reads them. One row per
(topic, window) with the tiers side by side, in the order of the tier graph, and a verdict:
the worst tier's state, its completeness and what is missing. Read from the database only
(a read-only connection; no Kafka).

The worst tier: the worst state (incomplete, unknown, overcount, pending, open, complete),
then the lowest completeness, then the first in the graph. Completeness is shown rounded
down to a tenth of a percent, so a loss never shows as 100.0%.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from docket_common.formats import percent_of, utc_iso, window_label

from .store import Store
from .tiers import tier_order
from .verdict import (
    COMPLETE,
    INCOMPLETE,
    MISMATCH,
    WORST_FIRST,
)

MAX_ORIGINS_SHOWN = 3


@dataclass
class TierCell:
    tier: str
    state: str
    final: bool
    expected: int
    count: int
    distinct: int | None
    duplicates: int | None
    completeness: float | None
    missing: int
    checksum: str | None

    @property
    def actual(self) -> int:
        return self.distinct if self.distinct is not None else self.count

    def text(self) -> str:
        """Its count, and distinct/duplicates when the tier knows them."""
        if self.distinct is None:
            return str(self.count)
        return f"{self.count} ({self.distinct}/{self.duplicates})"


@dataclass
class OriginNote:
    origin: str
    state: str
    missing: int
    reason: str


@dataclass
class Verdict:
    state: str                     # the worst tier's
    tier: str
    expected: int
    actual: int
    completeness: float | None
    origins: list[OriginNote] = field(default_factory=list)   # the tier's origins not complete
    notes: list[str] = field(default_factory=list)      # duplicates, checksum mismatches

    def text(self) -> str:
        """``incomplete 99.0% kafka-local: 100 missing from web-2``"""
        parts = [self.state, percent_of(self.actual, self.expected)]
        shown = [_origin_text(o) for o in self.origins[:MAX_ORIGINS_SHOWN]]
        if len(self.origins) > MAX_ORIGINS_SHOWN:
            shown.append(f"{len(self.origins) - MAX_ORIGINS_SHOWN} more origins")
        if shown:
            parts.append(f"{self.tier}: " + ", ".join(shown))
        return " ".join(parts) + "".join(f"; {n}" for n in self.notes)


@dataclass
class WindowRow:
    topic: str
    window_start: int
    window_ms: int
    tiers: list[TierCell | None]          # in graph order; None: the tier has no verdict here
    verdict: Verdict

    def to_dict(self) -> dict:
        return {"topic": self.topic, "window_start": self.window_start,
                "window_start_iso": utc_iso(self.window_start), "window_ms": self.window_ms,
                "tiers": [asdict(c) for c in self.tiers if c is not None],
                "verdict": {**asdict(self.verdict), "text": self.verdict.text()}}


@dataclass
class TopicRows:
    topic: str
    tiers: list[str]                      # the tier graph: the columns
    rows: list[WindowRow]


def window_rows(store: Store, since_ms: int, topic: str | None = None,
                include_empty: bool = False,
                configured_tiers: list[str] | None = None) -> list[TopicRows]:
    """Per topic, the rows of the windows that started at ``since_ms`` or later, oldest
    first; windows every tier counted 0 in (heartbeats only) are left out unless
    ``include_empty``."""
    cells: dict[tuple[str, int], dict[str, TierCell]] = {}
    window_ms: dict[tuple[str, int], int] = {}
    for r in store.window_rows(since_ms, topic):
        key = (r["topic"], r["window_start"])
        window_ms[key] = r["window_ms"]
        cells.setdefault(key, {})[r["tier"]] = TierCell(
            r["tier"], r["state"], bool(r["final"]), r["expected"], r["count"],
            r["distinct_count"], r["duplicates"], r["completeness"], r["missing"],
            r["checksum"])
    tiers_of: dict[str, set[str]] = {}
    for (t, _w), by_tier in cells.items():
        tiers_of.setdefault(t, set()).update(by_tier)
    out: dict[str, TopicRows] = {}
    for (t, w), by_tier in cells.items():
        if t not in out:
            out[t] = TopicRows(t, tier_order(tiers_of[t], configured_tiers or []), [])
        row_cells = [by_tier.get(tier) for tier in out[t].tiers]
        if not include_empty and all(c is None or c.count == 0 for c in row_cells):
            continue
        out[t].rows.append(WindowRow(t, w, window_ms[(t, w)], row_cells,
                                     _verdict(store, t, w, row_cells)))
    return [v for v in out.values() if v.rows]


def _verdict(store: Store, topic: str, window_start: int,
             cells: list[TierCell | None]) -> Verdict:
    present = [c for c in cells if c is not None]
    worst = min(present, key=lambda c: (
        WORST_FIRST.index(c.state),
        c.actual * 1000 // c.expected if c.expected else 1000,
        present.index(c)))
    v = Verdict(worst.state, worst.tier, worst.expected, worst.actual, worst.completeness)
    if worst.state != COMPLETE:
        for origin, state, missing, reason in store.origins_short(topic, window_start,
                                                                  worst.tier, COMPLETE):
            v.origins.append(OriginNote(origin, state, missing, reason))
    for c in present:
        if c.duplicates:
            v.notes.append(f"{c.tier}: {c.duplicates} duplicates")
        if c.checksum == MISMATCH:
            v.notes.append(f"{c.tier}: checksum mismatch")
    return v


def _origin_text(o: OriginNote) -> str:
    if o.missing and o.state == INCOMPLETE:
        return f"{o.missing} missing from {o.origin}"
    if o.missing:
        return f"{o.missing} not seen yet from {o.origin}"
    return f"{o.origin}: {o.reason or o.state}"


def render_text(topics: list[TopicRows]) -> str:
    """One table per topic: the window, each tier's count (distinct/duplicates when known),
    the verdict."""
    blocks = []
    for t in topics:
        table = [["window", *t.tiers, "verdict"]]
        for r in t.rows:
            table.append([window_label(r.window_start),
                          *("-" if c is None else c.text() for c in r.tiers),
                          r.verdict.text()])
        widths = [max(len(line[i]) for line in table) for i in range(len(table[0]) - 1)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)) +
                 "  " + line[-1] for line in table]
        blocks.append("\n".join([t.topic, *lines]))
    return "\n\n".join(blocks)


def render_json(topics: list[TopicRows]) -> str:
    return json.dumps([r.to_dict() for t in topics for r in t.rows])
