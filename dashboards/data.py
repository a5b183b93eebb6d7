"""What the dashboard shows, read from the reconciler's SQLite database (read-only: the
reconciler is the only writer of verdicts; the dashboard writes only a snooze or a hand
resolution, through ``audit.reconcile.alerts.lifecycle``).

Every function takes an open read-only ``Store`` and returns plain data (dicts and lists), which
the pages render and ``/api/`` serves as JSON unchanged. What feeds each tier is not in the
database (the verdicts are, not the graph they were judged on): it comes from the reconciler's
configuration, as a ``Graph``.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from audit.contract.record import PRODUCER_TIER
from audit.reconcile.alerts import lifecycle
from audit.reconcile.config import ReconcileConfig
from audit.reconcile.config import parse as parse_config
from audit.reconcile.store import Store
from audit.reconcile.tiers import feeders_first, feeders_of, hop_label, tier_order
from audit.reconcile.verdict import (
    COMPLETE,
    MATCH,
    current_by_origin,
)
from audit.reconcile.watermark import watermark
from docket_common.formats import utc_iso
from docket_common.settings import load_toml


@dataclass(frozen=True)
class Graph:
    """What the dashboard knows of the tier graph, from the reconciler's configuration
    (``docket-dashboard --config``): the display order (``windows.tiers``) and what feeds each
    tier (``[tiers.NAME] fed_by``; a tier not declared is fed by the producer, as the
    reconciler judges it). Without one (``fed_by`` None) the order is the default (producer,
    the clusters by name, warehouse) and what feeds a tier is not known."""
    order: tuple[str, ...] = ()
    fed_by: dict[str, tuple[str, ...]] | None = None

    @classmethod
    def of(cls, config: ReconcileConfig | None) -> Graph:
        if config is None:
            return cls()
        return cls(tuple(config["windows.tiers"]), dict(config.graph))

    @classmethod
    def read(cls, path: str | Path) -> Graph:
        """The graph of the reconciler's configuration file at ``path``: ``windows.tiers`` and
        the ``[tiers.*]`` tables, checked as the reconciler checks them (a ``ConfigError``
        names the key). Nothing else of it is read: its Kafka credentials (files, systemd
        credentials) belong to the reconciler's service, not to this one."""
        raw = load_toml(path)
        part = {"tiers": raw.get("tiers", {})}
        windows = raw.get("windows", {})
        if isinstance(windows, dict) and "tiers" in windows:
            part["windows"] = {"tiers": windows["tiers"]}
        return cls.of(parse_config(part))

    def arrange(self, seen: Iterable[str]) -> dict:
        """The tiers among ``seen`` in graph order (each after the tiers feeding it), and of
        each tier but the producer what feeds it and the hop's label (None: not known). As
        the reconciler does for a topic, a declared feeder not among ``seen`` is skipped for
        its own feeders (``tiers.feeders_of``)."""
        seen = set(seen)
        if not seen:
            return {"tiers": [], "fed_by": {}, "hops": {}}
        order = tier_order(seen, list(self.order))
        if self.fed_by is None:
            feeders: dict[str, list[str] | None] = {t: None for t in order if t != PRODUCER_TIER}
        else:
            feeders = {t: list(f) for t, f in feeders_of(order, self.fed_by).items()}
            order = feeders_first(order, feeders)
        return {"tiers": order, "fed_by": {t: feeders[t] for t in order if t in feeders},
                "hops": {t: hop_label(t, feeders[t]) for t in order if t in feeders}}


NOT_KNOWN = Graph()           # no configuration: the default order, what feeds a tier not known


def tiers(store: Store, graph: Graph = NOT_KNOWN) -> dict:
    """Every tier with a verdict, in graph order, with what feeds each (``Graph.arrange``)."""
    return graph.arrange(store.judged_tiers())


def _topic_tiers(store: Store, topic: str, graph: Graph, seen: set[str]) -> dict:
    """The tiers of ``seen`` (those with verdicts shown) arranged by ``graph``, each fed as the
    reconciler judged it on ``topic``: among the tiers that reported on the topic."""
    arranged = graph.arrange(store.tiers_of([topic]).get(topic, set()) | seen)
    return {"tiers": [t for t in arranged["tiers"] if t in seen],
            "fed_by": {t: f for t, f in arranged["fed_by"].items() if t in seen},
            "hops": {t: h for t, h in arranged["hops"].items() if t in seen}}


def completeness(store: Store, since_ms: int, tier: str | None = None,
                 topic: str | None = None, page: int = 0, per_page: int = 0,
                 graph: Graph = NOT_KNOWN) -> dict:
    """The overview: per (topic, window) of ``tier`` (default: the last tier of the graph)
    its state, completeness (end to end), completeness over its hop and finality, since
    ``since_ms``; per tier the windows by state over the same time, and what feeds it. With
    ``per_page``, the topics of page ``page`` only (sorted by name; ``topics_total`` counts
    them all), the totals still over every topic."""
    arranged = tiers(store, graph)
    all_tiers = arranged["tiers"]
    tier = tier or (all_tiers[-1] if all_tiers else None)
    totals: dict[str, Counter] = {t: Counter() for t in all_tiers}
    for t, state, n in store.state_totals(since_ms, topic):
        totals.setdefault(t, Counter())[state] += n
    names = store.topics_at(tier, since_ms, topic)
    shown = names[page * per_page:(page + 1) * per_page] if per_page else names
    cells: dict[str, dict[int, dict]] = {}
    windows: set[int] = set()
    for (_t, name, ws, state, final, expected, count, distinct, dups, comp, hop, missing,
         checksum) in store.overview_rows(tier, shown, since_ms):
        windows.add(ws)
        cells.setdefault(name, {})[ws] = {
            "state": state, "final": bool(final), "expected": expected, "count": count,
            "distinct": distinct, "duplicates": dups, "completeness": comp,
            "hop_completeness": hop, "missing": missing, "checksum": checksum}
    return {"tier": tier, "tiers": all_tiers, "fed_by": arranged["fed_by"],
            "hops": arranged["hops"], "since_ms": since_ms,
            "windows": sorted(windows), "topics": cells, "topics_total": len(names),
            "page": page, "per_page": per_page,
            "totals": {t: dict(c) for t, c in totals.items()}}


def topic_history(store: Store, topic: str, since_ms: int, graph: Graph = NOT_KNOWN) -> dict:
    """The correlation view of one topic: its tiers in graph order with what feeds each; per
    window each tier's count, distinct, completeness and completeness over the hop before it;
    per tier its watermark; the producer's known drops by reason."""
    rows: dict[int, dict[str, dict]] = {}
    seen: set[str] = set()
    for (ws, t, state, final, expected, count, distinct, dups, dropped, dropped_unknown,
         comp, hop) in store.history_rows(topic, since_ms):
        seen.add(t)
        rows.setdefault(ws, {})[t] = {
            "state": state, "final": bool(final), "expected": expected, "count": count,
            "distinct": distinct, "duplicates": dups, "dropped": dropped,
            "dropped_unknown": json.loads(dropped_unknown or "{}"), "completeness": comp,
            "hop_completeness": hop}
    arranged = _topic_tiers(store, topic, graph, seen) if seen else graph.arrange(())
    order = arranged["tiers"]
    drops: Counter = Counter()
    for reasons in store.producer_drop_reasons(topic, since_ms):
        for reason, n in json.loads(reasons or "{}").items():
            drops[reason] += n
    marks = {}
    for t in order:
        mark = watermark(store, topic, t)
        marks[t] = {"watermark_ms": mark, "watermark": None if mark is None else utc_iso(mark)}
    return {"topic": topic, "tiers": order, "fed_by": arranged["fed_by"],
            "hops": arranged["hops"], "since_ms": since_ms,
            "windows": [{"window_start": ws, "window_start_iso": utc_iso(ws), "tiers": tiers_}
                        for ws, tiers_ in sorted(rows.items())],
            "watermarks": marks, "known_drops": dict(drops)}


SHOWN_ORIGINS = 20          # the origins a window's page lists unless asked for all


def _badness(by_tier: dict[str, dict]) -> tuple[int, int]:
    """How far an origin is from complete in a window, to rank the worst first: events
    missing and copies added over its tiers, then whether any tier judged it other than
    complete."""
    return (sum((o["missing"] or 0) + (o["duplicates"] or 0) for o in by_tier.values()),
            sum(o["state"] != COMPLETE for o in by_tier.values()))


def window_detail(store: Store, topic: str, window_start: int,
                  graph: Graph = NOT_KNOWN, shown: int | None = None) -> dict | None:
    """One window: each tier's verdict (in graph order, with what feeds it), per origin what
    each tier counted and is missing (with the missing record numbers where a tier reported
    them), the revisions, the alerts. ``shown``: list only that many origins, the worst first
    (``origins_total`` and ``origins_not_complete`` count them all); None: every origin, by
    name."""
    tiers_ = {r["tier"]: r for r in store.window_tiers(topic, window_start)}
    if not tiers_:
        return None
    arranged = _topic_tiers(store, topic, graph, set(tiers_))
    order = arranged["tiers"]
    origins: dict[str, dict[str, dict]] = {}
    for r in store.window_origin_rows(topic, window_start):
        origins.setdefault(r["origin"], {})[r["tier"]] = {
            "state": r["state"], "expected": r["expected"], "count": r["count"],
            "distinct": r["distinct_count"], "duplicates": r["duplicates"],
            "missing": r["missing"], "checksum": r["checksum"], "reason": r["reason"]}
    # An origin that had exactly what its producer accepted at a tier has no row of its own
    # (``OriginVerdict.plain``): its figures were its producer's count, which are the count
    # records' now unless the window changed since it was judged (then those are left out).
    records = [] if store.changed_since_judged(topic, window_start) else \
        store.window_records([(topic, window_start)])[(topic, window_start)]
    producer = current_by_origin(records).get(PRODUCER_TIER, {})
    for origin, rec in producer.items():
        for t in order:
            if t in tiers_ and t not in origins.get(origin, {}):
                origins.setdefault(origin, {})[t] = {
                    "state": COMPLETE, "expected": rec.count, "count": rec.count,
                    "distinct": rec.count, "duplicates": 0, "missing": 0, "checksum": MATCH,
                    "reason": ""}
    origins_total = len(origins)
    badness = {origin: _badness(by_tier) for origin, by_tier in origins.items()}
    not_complete = sum(1 for b in badness.values() if b != (0, 0))
    if shown is None:
        origins = dict(sorted(origins.items()))
    else:
        worst = sorted(origins.items(), key=lambda kv: (*(-b for b in badness[kv[0]]), kv[0]))
        origins = dict(worst[:shown])
    ranges: dict[str, dict[str, dict]] = {}
    for origin, by_tier in origins.items():          # the numbers no tier may lack: what the
        for t, o in by_tier.items():                 # producer journalled as dropped is not
            if t == "producer" or not o["missing"]:  # listed (store.missing_ranges)
                continue
            missing, total = store.missing_ranges(t, origin)
            if missing:
                ranges.setdefault(origin, {})[t] = {"ranges": missing[:20], "total": total}
    revisions = store.revisions(topic, window_start)
    alerts = lifecycle.alerts_of_window(store, topic, window_start)
    return {"topic": topic, "window_start": window_start, "window_start_iso":
            utc_iso(window_start), "tiers": order, "fed_by": arranged["fed_by"],
            "hops": arranged["hops"],
            "verdicts": {t: {k: v for k, v in tiers_[t].items() if k not in ("topic",)}
                         for t in order},
            "origins": origins, "origins_total": origins_total,
            "origins_not_complete": not_complete,
            "missing_ranges": ranges, "revisions": revisions,
            "alerts": alerts}


def alerts(store: Store, status: str = "open", now_ms: int | None = None) -> list[dict]:
    """Alerts by status (``lifecycle.alerts``), the newest 500 first, each with its
    deliveries."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    return lifecycle.alerts(store, status, now_ms, limit=500)


def health(store: Store, now_ms: int, graph: Graph = NOT_KNOWN) -> list[dict]:
    """Per tier: the newest window it reported on, and its jobs' progress and lag (since their
    newest progress record arrived)."""
    out = {}
    for tier, newest in store.newest_counted():
        out[tier] = {"tier": tier, "newest_window": utc_iso(newest), "jobs": []}
    for r in store.progress_rows():
        entry = out.setdefault(r["tier"], {"tier": r["tier"], "newest_window": None,
                                           "jobs": []})
        arrived = r["arrived_at"] if r["arrived_at"] is not None else r["emitted_at"]
        entry["jobs"].append({"emitter": r["emitter"], "batch_id": r["batch_id"],
                              "lag_s": round((now_ms - arrived) / 1000, 1),
                              "offsets_behind": r["offsets_behind"],
                              "processed_rows_per_s": r["processed_rows_per_s"]})
    return [out[t] for t in graph.arrange(out)["tiers"] if t in out]


def producers(store: Store, now_ms: int) -> list[dict]:
    """Per origin: how long ago its newest audit record arrived, how far its clock is from
    the broker's (None: not measured), and its open health alerts (``silent_producer``,
    ``clock_skew``): a clock that is off is a fact shown here, not a loss."""
    open_alerts = lifecycle.open_producer_alerts(store)
    offsets = store.clock_offsets()
    return [{"origin": origin, "last_seen_s": round((now_ms - at) / 1000, 1),
             "clock_offset_s": None if origin not in offsets
             else round(offsets[origin][0] / 1000, 1),
             "alerts": open_alerts.get(origin, [])}
            for origin, at in sorted(store.producers().items())]
