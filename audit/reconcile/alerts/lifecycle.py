"""Alerts from verdicts: each condition fires once, stays open while it holds, resolves when it
no longer does (late data caught up, a job came back), and can be snoozed.

Data alerts, per (topic, window, tier, origin), judged only once a window is past its grace:

- ``loss``: the origin is ``incomplete`` at the tier (names expected, actual, the missing
  count and, when records carry ``docket-seq``, the missing record numbers); at the producer
  tier, a loss of unknown size the agent journalled (the reason says which);
- ``duplication``: the tier counted duplicates of the origin's records, or more records than
  the producer accepted; at a hop (a tier fed by tiers), only the duplicates beyond those its
  feeding tiers hold (``hop_duplicates``: a mirror copies the copies it finds along), or more
  than they hold;
- ``checksum_mismatch``: the counts agree, the content does not.

An origin whose state is ``unknown`` (a tier that has not read that far, a missing report)
neither fires nor resolves a data alert: a broken audit is not a loss, and not a recovery.

Audit-health alerts: ``audit_lag`` (a tier's newest progress record arrived more than
``lag_ms`` ago), ``silent_producer`` (an origin's newest producer record arrived more than
``silent_ms`` ago) and ``clock_skew`` (an origin that is heard from has a clock further than
``clock_skew_ms`` from the broker's: a fact worth fixing, of low severity, never a loss).
Arrivals are the broker's append times (or the reconciler's clock when it read a record), so a
producer whose clock is off is neither silent nor lagging for it.

Grouped: a data alert covers every origin its condition holds for at one (kind, topic, window,
tier), and a ``silent_producer`` alert every producer gone quiet in the same window (its newest
record arrived within it) — a broker that loses a partition's tail, or a data centre gone dark,
is one alert naming how many origins and the worst of them, not one per host. Each origin is a
*member* (``alert_members``), with its own figures (for ``loss``, its missing numbers and
``locate`` commands): it joins while the alert is open when its condition starts to hold, and
clears when judged without it; the alert resolves when its last member has cleared. A member
whose state is unknown neither clears nor resolves, as before. ``clock_skew`` and
``audit_lag`` stay one alert per origin and per tier.

A notification is queued in the outbox for every routed channel when an alert fires (or, when
its key is snoozed, when the snooze ends while it is still open) and when it resolves (only if
its firing was notified). Queuing happens in the same transaction as the alert's row, so a
restart neither loses nor repeats one. Members that join or clear an open alert change its
summary and detail (the dashboard, and the resolved notification, show them), not its
notifications.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass

from audit.contract.record import PRODUCER_TIER
from docket_common.formats import utc_iso as _iso

from ..config import ReconcileConfig
from ..store import Store, windows_by_topic
from ..tiers import hop_label
from ..verdict import COMPLETE, INCOMPLETE, MISMATCH, OVERCOUNT, UNKNOWN, TierVerdict
from .notification import DATA_KINDS, KIND_CLASSES, Notification
from .outbox import enqueue

log = logging.getLogger("docket.audit.reconcile")

MAX_RANGES_IN_ALERT = 50
FOREVER = (1 << 63) - 1           # a snooze set by resolving by hand: until the condition clears


GROUPED_KINDS = (*DATA_KINDS, "silent_producer")
SHOWN_MEMBERS = 20                # the origins a grouped alert's detail names, the worst first
REPLACED = "replaced by a grouped alert"


@dataclass
class Condition:
    """Something alert-worthy that holds now: of one origin (``group`` names the key of the
    grouped alert it is a member of), of a group (``members``: origin → its condition), or
    neither (``audit_lag``, ``clock_skew``)."""
    kind: str
    topic: str | None
    window_start: int | None
    window_ms: int | None
    tier: str | None
    origin: str | None
    summary: str
    detail: dict
    group: str | None = None
    at: str = ""                  # where, without the origin: what a group's summary names
    members: dict[str, Condition] | None = None

    @property
    def key(self) -> str:
        if self.members is not None:
            return self.group
        return alert_key(self.kind, self.topic, self.window_start, self.tier, self.origin)


def alert_key(kind: str, topic, window_start, tier, origin) -> str:
    return json.dumps([kind, topic, window_start, tier, origin])


def grouped(holds: list[Condition]) -> list[Condition]:
    """The conditions with a ``group`` gathered into one condition per group; the others as
    they are."""
    out, groups = [], {}
    for c in holds:
        if c.group is None:
            out.append(c)
        else:
            groups.setdefault(c.group, {})[c.origin] = c
    out += [_group_of(key, members) for key, members in groups.items()]
    return out


def _group_of(key: str, members: dict[str, Condition]) -> Condition:
    """The condition of a group from its members' (origin → condition)."""
    first = next(iter(members.values()))
    origin = first.origin if len(members) == 1 else None
    summary, detail = group_text(first.kind, first.at,
                                 {o: (m.summary, m.detail) for o, m in members.items()}, origin)
    return Condition(first.kind, first.topic, first.window_start, first.window_ms, first.tier,
                     origin, summary, detail, group=key, at=first.at, members=members)


def member_key(c: Condition, origin: str) -> str:
    """The key of one member of a group (what resolving the group by hand snoozes, per
    origin; the key its alert had before alerts were grouped)."""
    return alert_key(c.kind, c.topic, c.window_start, c.tier, origin)


def _holds_for(groups: dict[str, Condition], kind: str, topic, window_start, tier: str,
               origin: str) -> bool:
    """Whether ``origin`` is a member of a group of (kind, topic, window, tier) that holds
    (for ``silent_producer``: of any window it went quiet in)."""
    return any(origin in c.members for c in groups.values()
               if c.members and (c.kind, c.tier) == (kind, tier)
               and (kind == "silent_producer" or (c.topic, c.window_start) == (topic,
                                                                               window_start)))


def _without(groups: dict[str, Condition], by_hand: set[str]) -> dict[str, Condition]:
    """The groups without their members resolved by hand (whose condition has not cleared
    since); a group left with none is left out."""
    out = {}
    for key, c in groups.items():
        if c.members is None:
            out[key] = c
            continue
        kept = {o: m for o, m in c.members.items() if member_key(c, o) not in by_hand}
        if len(kept) == len(c.members):
            out[key] = c
        elif kept:
            out[key] = _group_of(key, kept)
    return out


def _weight(detail: dict) -> int:
    """How bad one member is, to rank them: events missing, copies added, or how long quiet."""
    if "missing" in detail:
        return detail["missing"]
    if "extra" in detail:
        return detail["extra"]
    if "last_seen_at" in detail:
        return -detail["last_seen_at"]
    return sum((detail.get("dropped_unknown") or {}).values())


def group_text(kind: str, at: str, members: dict[str, tuple[str, dict]],
               origin: str | None) -> tuple[str, dict]:
    """A grouped alert's summary and detail from its members (origin → (summary, detail)).
    ``origin``: the alert's own (the one origin it fired for, or None). Its one member being
    that origin: the member's own, with ``origins`` 1, ``worst_origin`` and ``at``. Otherwise:
    totals, the worst member's figures and the worst ``SHOWN_MEMBERS`` origins (``members``)."""
    ranked = sorted(members.items(), key=lambda m: (-_weight(m[1][1]), m[0]))
    worst, (worst_summary, worst_detail) = ranked[0]
    if len(ranked) == 1 and worst == origin:
        return worst_summary, {**worst_detail, "origins": 1, "worst_origin": worst, "at": at}
    n = len(ranked)
    some = f"{n} origin{'s' if n != 1 else ''}"
    detail = {"origins": n, "worst_origin": worst, "at": at, "worst": worst_detail,
              "members": [o for o, _ in ranked[:SHOWN_MEMBERS]]}
    hops = {d.get("hop") for _s, d in members.values()}
    if len(hops) == 1 and None not in hops:      # the hop every member's loss is at
        detail["hop"] = hops.pop()
    if kind == "loss" and "missing" in worst_detail:
        detail["missing"] = sum(d.get("missing", 0) for _s, d in members.values())
        summary = (f"{detail['missing']} events missing from {some} at {at} "
                   f"(worst {worst}: {worst_detail['missing']})")
    elif kind == "loss":
        summary = (f"possible loss of unknown size from {some} at {at} "
                   f"(first {worst}: {worst_detail.get('reason')})")
    elif kind == "duplication":
        detail["extra"] = sum(d.get("extra", 0) for _s, d in members.values())
        summary = (f"{detail['extra']} extra records from {some} at {at} "
                   f"(worst {worst}: {worst_detail['extra']})")
    elif kind == "checksum_mismatch":
        summary = f"counts agree but the content differs for {some} at {at}"
    else:                                            # silent_producer
        summary = (f"{n} producer{'s' if n != 1 else ''} went quiet in the window of {at}: "
                   f"their last audit counts arrived there (the longest quiet: {worst})")
    return summary, detail




def window_conditions(store: Store, verdicts: list[TierVerdict], window_ms: int,
                      ranges: dict | None = None) -> tuple[list[Condition], set[tuple[str, str]]]:
    """The data conditions that hold for one window, and the (tier, origin) pairs it has
    *judged* (an alert of the window's on a judged pair that no longer holds resolves; others
    are left as they are). ``ranges`` caches ``store.missing_ranges`` within a transaction."""
    holds: list[Condition] = []
    judged: set[tuple[str, str]] = set()
    ranges = {} if ranges is None else ranges
    for v in verdicts:
        if not v.judged:
            continue
        for o in v.origins:
            if o.state == UNKNOWN:
                continue
            judged.add((v.tier, o.origin))
            loss = o.state == INCOMPLETE
            duplication = bool(o.hop_duplicates) or o.state == OVERCOUNT
            mismatch = o.checksum == MISMATCH and o.state == COMPLETE
            if not (loss or duplication or mismatch):
                continue
            mirrored = v.fed_by != (PRODUCER_TIER,)
            feeders = o.feeders or v.fed_by          # of several, those holding the origin
            hop = hop_label(v.tier, feeders)
            at = f"{v.topic} window {_iso(v.window_start)} " + \
                (f"hop {hop}" if mirrored else f"tier {v.tier}")
            where = f"{at} origin {o.origin}"
            base = {"expected": o.expected, "actual": o.actual, "count": o.count,
                    "distinct": o.distinct, "duplicates": o.duplicates}
            if mirrored:
                base.update(hop=hop, hop_expected=o.hop_expected,
                            hop_duplicates=o.hop_duplicates)


            def cond(kind: str, summary: str, v=v, o=o, base=base, at=at,
                     **extra) -> Condition:
                return Condition(kind, v.topic, v.window_start, window_ms, v.tier, o.origin,
                                 summary, {**base, **extra},
                                 group=alert_key(kind, v.topic, v.window_start, v.tier, None),
                                 at=at)
            if loss and v.tier == PRODUCER_TIER:
                holds.append(cond("loss", f"possible loss of unknown size at {where}: "
                                  f"{o.reason}", reason=o.reason,
                                  dropped_unknown=o.dropped_unknown))
            elif loss:
                key = (v.tier, o.origin, feeders)
                if key not in ranges:
                    ranges[key] = store.missing_ranges(
                        v.tier, o.origin, () if not mirrored else feeders)
                missing, total = ranges[key]
                holds.append(cond(
                    "loss", f"{o.missing} of {o.at_hop} events missing at {where}",
                    missing=o.missing, missing_ranges=missing[:MAX_RANGES_IN_ALERT],
                    missing_ranges_total=total,
                    locate=[f"docket-agent locate --seq {a}-{b}"
                            for a, b in missing[:MAX_RANGES_IN_ALERT]]))
            if duplication:             # at a hop, the copies it added (not its feeders')
                extra = o.hop_duplicates if o.hop_duplicates else o.actual - (o.at_hop or 0)
                holds.append(cond("duplication", f"{extra} extra records at {where}",
                                  extra=extra))
            if mismatch:
                holds.append(cond("checksum_mismatch",
                                  f"counts agree but the content differs at {where}"))
    return holds, judged


@dataclass
class WindowAlerts:
    """A batch of windows' alerts as ``apply_window_conditions`` needs them, read in the
    batch's transaction: per window, its open alerts (key → id, notified) and the keys of its
    alerts resolved by hand whose condition has not cleared since."""
    open: dict[tuple[str, int], dict[str, tuple[int, int]]]
    by_hand: dict[tuple[str, int], set[str]]


def window_alerts(store: Store, windows: list[tuple[str, int]]) -> WindowAlerts:
    opened: dict[tuple[str, int], dict[str, tuple[int, int]]] = {}
    for topic, starts in windows_by_topic(windows):
        for key, window_start, alert_id, notified in store.open_alerts_of(topic, starts):
            opened.setdefault((topic, window_start), {})[key] = (alert_id, notified)
    by_hand: dict[tuple[str, int], set[str]] = {}
    for key in store.snoozed_keys(FOREVER):
        _kind, topic, window_start, _tier, _origin = json.loads(key)
        if topic is not None:
            by_hand.setdefault((topic, window_start), set()).add(key)
    return WindowAlerts(opened, by_hand)


def apply_window_conditions(store: Store, cfg: ReconcileConfig, window: tuple[str, int],
                            holds: list[Condition], judged: set[tuple[str, str]],
                            alerts: WindowAlerts, now_ms: int) -> tuple[int, int]:
    """``apply_conditions`` for one window, from ``window_conditions`` and its batch's
    ``window_alerts``. In the caller's transaction. Returns (fired, resolved)."""
    if not holds and window not in alerts.open and window not in alerts.by_hand:
        return 0, 0                              # nothing to fire, resolve or clear
    open_rows = dict(alerts.open.get(window, {}))
    by_hand = alerts.by_hand.get(window, set())
    judged_tiers = {tier for tier, _origin in judged}
    judged_keys = set()
    for key in set(open_rows) | by_hand:
        kind, _topic, _window_start, tier, origin = json.loads(key)
        # a grouped alert is judged where its tier is; each member where its origin is
        if kind in DATA_KINDS and ((tier, origin) in judged
                                   or (origin is None and tier in judged_tiers)):
            judged_keys.add(key)
    return _apply(store, cfg, {c.key: c for c in grouped(holds)}, judged_keys, open_rows,
                  by_hand, now_ms, lambda tier, origin: (tier, origin) in judged)


def health_conditions(store: Store, cfg: ReconcileConfig,
                      now_ms: int) -> tuple[list[Condition], set[str]]:
    holds: list[Condition] = []
    judged: set[str] = set()
    for tier, (at, _behind) in store.progress().items():
        key = alert_key("audit_lag", None, None, tier, None)
        judged.add(key)
        if now_ms - at > cfg["alerts.lag_ms"]:
            holds.append(Condition("audit_lag", None, None, None, tier, None,
                                   f"audit tier {tier} last reported progress "
                                   f"{(now_ms - at) // 1000} s ago",
                                   {"last_progress_at": at, "lag_ms": cfg["alerts.lag_ms"]}))
    offsets = store.clock_offsets()
    bound = cfg["alerts.clock_skew_ms"]
    window_ms = cfg["windows.window_ms"]
    judged.update(store.open_keys_of_kind("silent_producer"))    # every producer is judged
    for origin, at in store.producers().items():
        judged.add(alert_key("clock_skew", None, None, PRODUCER_TIER, origin))
        if now_ms - at > cfg["alerts.silent_ms"]:
            quiet = at - at % window_ms              # gone quiet together: in one window
            group = alert_key("silent_producer", None, quiet, PRODUCER_TIER, None)
            judged.add(group)
            holds.append(Condition("silent_producer", None, None, None, PRODUCER_TIER, origin,
                                   f"producer {origin}'s last audit counts arrived "
                                   f"{(now_ms - at) // 1000} s ago",
                                   {"last_seen_at": at, "silent_ms": cfg["alerts.silent_ms"]},
                                   group=group, at=_iso(quiet)))
            continue
        offset, measured_at = offsets.get(origin, (0, None))
        if abs(offset) > bound:
            holds.append(Condition(
                "clock_skew", None, None, None, PRODUCER_TIER, origin,
                f"producer {origin}'s clock is {abs(offset) / 1000:.0f} s "
                f"{'ahead of' if offset > 0 else 'behind'} the broker's (more than "
                f"{bound // 1000} s): its events land in the windows its clock names",
                {"clock_offset_ms": offset, "measured_at": measured_at,
                 "clock_skew_ms": bound}))
    return holds, judged


def apply_conditions(store: Store, cfg: ReconcileConfig, holds: list[Condition],
                     judged: set[str], now_ms: int) -> tuple[int, int]:
    """Fire what holds and is not open; resolve what is open, judged and no longer holds; queue
    the notifications due. In the caller's transaction. Returns (fired, resolved)."""
    holding = {c.key: c for c in grouped(holds)}
    keys = set(holding) | judged
    open_rows = {k: (i, notified) for k in keys for i, notified in store.open_alert(k)}
    by_hand = {k for k in keys if store.snoozed_until(k, FOREVER)} | {
        k for k in store.snoozed_keys(FOREVER) if json.loads(k)[0] == "silent_producer"}
    return _apply(store, cfg, holding, judged, open_rows, by_hand, now_ms,
                  lambda _tier, _origin: True)


def _apply(store: Store, cfg: ReconcileConfig, holding: dict[str, Condition], judged: set[str],
           open_rows: dict[str, tuple[int, int]], by_hand: set[str], now_ms: int,
           origin_judged: Callable[[str, str], bool]) -> tuple[int, int]:
    """``open_rows``: the open alerts (key → id, notified) among the keys ``holding`` or
    ``judged``, or more; ``by_hand``: the keys resolved by hand whose condition has not cleared
    since, among those or more; ``origin_judged(tier, origin)``: whether a member of a grouped
    alert was judged now (one not holding and not judged stays a member)."""
    fired = resolved = 0
    raw, holding = holding, _without(holding, by_hand)
    cleared = []
    for k in by_hand:
        kind, topic, window_start, tier, origin = json.loads(k)
        if origin is not None and kind in GROUPED_KINDS:   # one member resolved by hand
            if origin_judged(tier, origin) and not _holds_for(raw, kind, topic, window_start,
                                                              tier, origin):
                cleared.append(k)
        elif k in judged and k not in holding:
            cleared.append(k)
    if cleared:
        store.clear_snoozes(cleared)
    fresh = set()
    for key, c in holding.items():
        if key in open_rows or key in by_hand:
            continue
        owner, _channels = cfg.route(c.topic)
        alert_id = store.fire(key, c.kind, KIND_CLASSES[c.kind], c.topic, c.window_start,
                              c.window_ms, c.tier, c.origin, owner, c.summary,
                              json.dumps(c.detail, sort_keys=True), now_ms)
        if c.members is not None:
            store.hold_members(alert_id, _member_rows(c.members), now_ms)
        fired += 1
        log.warning("alert %s fired: %s", c.kind, c.summary)
        open_rows[key] = (alert_id, 0)
        fresh.add(key)
    for key, (alert_id, notified) in open_rows.items():
        if key not in judged or key in fresh:
            continue
        kind, topic, window_start, tier, origin = json.loads(key)
        by = "condition cleared"
        if origin is None and kind in GROUPED_KINDS:
            if _regroup(store, alert_id, kind, tier, holding.get(key), origin_judged, now_ms):
                continue
        elif key in holding:
            continue
        elif origin is not None and kind in GROUPED_KINDS and _holds_for(
                raw, kind, topic, window_start, tier, origin):
            by = REPLACED              # a per-origin alert of layout 6, now in a grouped one
        store.resolve(alert_id, now_ms, by)
        resolved += 1
        log.info("alert %s resolved", kind)
        if notified:
            _enqueue(store, cfg, alert_id, "resolved", now_ms)
    notify_due(store, cfg, now_ms, [open_rows[k][0] for k in holding
                                     if k in open_rows and not open_rows[k][1]])
    return fired, resolved


def _member_rows(members: dict[str, Condition]) -> list[tuple[str, str, str]]:
    return [(origin, m.summary, json.dumps(m.detail, sort_keys=True))
            for origin, m in members.items()]


def _regroup(store: Store, alert_id: int, kind: str, tier: str, c: Condition | None,
             origin_judged: Callable[[str, str], bool], now_ms: int) -> bool:
    """Bring an open grouped alert's members up to date: those ``c`` holds for join or stay
    (with their figures now), those judged without it clear, the others stay as they were.
    Its summary and detail follow when they changed. False when no member is left: the alert
    resolves."""
    held = store.holding_members(alert_id)
    now = c.members if c is not None else {}
    gone = [o for o in held if o not in now and origin_judged(tier, o)]
    if gone:
        store.clear_members(alert_id, gone, now_ms)
    # a member's figures, not its summary (a silent one's says how many seconds ago)
    rows = [r for r in _member_rows(now) if r[0] not in held or held[r[0]][1] != r[2]]
    if rows:
        store.hold_members(alert_id, rows, now_ms)
    if len(gone) == len(held) and not now:
        return False
    if gone or rows:
        remaining = {o: (summary, json.loads(detail)) for o, (summary, detail) in held.items()
                     if o not in gone}
        remaining.update({o: (m.summary, m.detail) for o, m in now.items()})
        row = store.alert_row(alert_id)
        at = c.at if c is not None else json.loads(row["detail"])["at"]
        summary, detail = group_text(kind, at, remaining, row["origin"])
        store.update_alert(alert_id, summary, json.dumps(detail, sort_keys=True))
    return True


def notify_due(store: Store, cfg: ReconcileConfig, now_ms: int,
                ids: list[int] | None = None) -> None:
    """Queue the firing notification of the open alerts not yet notified (those of ``ids``,
    or all) whose key is not snoozed now."""
    for alert_id in store.unnotified_due(now_ms, ids):
        _enqueue(store, cfg, alert_id, "firing", now_ms)
        store.mark_notified(alert_id)


def _enqueue(store: Store, cfg: ReconcileConfig, alert_id: int, event: str, now_ms: int) -> None:
    n = notification(store, alert_id, event)
    _owner, channels = cfg.route(n.topic)
    if channels:
        enqueue(store.db, n, list(channels), now_ms)


def notification(store: Store, alert_id: int, event: str) -> Notification:
    r = store.alert_row(alert_id)
    if r is None:
        raise LookupError(f"no alert with id {alert_id}")
    return Notification(alert_id=alert_id, event=event, kind=r["kind"],
                        alert_class=r["alert_class"], topic=r["topic"],
                        window_start=r["window_start"], window_ms=r["window_ms"], tier=r["tier"],
                        origin=r["origin"], owner=r["owner"], summary=r["summary"],
                        detail=json.loads(r["detail"]), fired_at=r["fired_at"],
                        resolved_at=r["resolved_at"])


# -- reading the alerts: the dashboard, docket-audit alerts and the metrics ask here -----------
STATUSES = ("open", "resolved", "snoozed", "all")


def alerts(store: Store, status: str, now_ms: int, *, newest_first: bool = True,
           limit: int | None = None) -> list[dict]:
    """Alerts by ``status`` (``open``, ``resolved``, ``snoozed``: open with a snooze still
    running at ``now_ms``, ``all``), each with its ``detail`` (a dict), its snooze and its
    deliveries."""
    where = {"open": "a.status = 'open'", "resolved": "a.status = 'resolved'", "all": "1",
             "snoozed": "a.status = 'open' AND s.until > :now"}[status]
    rows = store.alert_list(where, now_ms, newest_first, limit)
    if rows:
        deliveries: dict[int, list] = {}
        for d in store.deliveries_of([r["id"] for r in rows]):
            deliveries.setdefault(d["alert_id"], []).append(d)
        for r in rows:
            r["detail"] = json.loads(r["detail"] or "{}")
            r["deliveries"] = deliveries.get(r["id"], [])
    return rows


def alerts_of_window(store: Store, topic: str, window_start: int) -> list[dict]:
    """The alerts one window raised, oldest first (a window's page), each with its
    ``members``: every origin it covers, those still holding first, each with its own
    ``detail`` (a dict: for a loss, its missing numbers and ``locate`` commands)."""
    rows = store.alerts_of_window(topic, window_start)
    members: dict[int, list[dict]] = {}
    for m in store.members_of([r["id"] for r in rows]):
        m["detail"] = json.loads(m["detail"])
        members.setdefault(m["alert_id"], []).append(m)
    for r in rows:
        r["members"] = members.get(r["id"], [])
    return rows


def open_producer_alerts(store: Store) -> dict[str, list[str]]:
    """origin → the kinds of its open health alerts (``silent_producer``, ``clock_skew``)."""
    out: dict[str, list[str]] = {}
    for origin, kind in store.open_health_kinds(PRODUCER_TIER):
        out.setdefault(origin, []).append(kind)
    return out


def open_counts(store: Store) -> dict[tuple[str, str], int]:
    """(kind, class) → how many alerts are open."""
    return store.open_alert_counts()


def snooze(store: Store, alert_id: int, until_ms: int, by: str, now_ms: int) -> str:
    """Snooze the condition of alert ``alert_id`` (its key) until ``until_ms``."""
    key = store.alert_key(alert_id)
    if key is None:
        raise LookupError(f"no alert with id {alert_id}")
    with store.conn:
        store.snooze_key(key, until_ms, by, now_ms)
    return key


def resolve_by_hand(store: Store, cfg: ReconcileConfig, alert_id: int, by: str,
                    now_ms: int) -> None:
    """Resolve an open alert; its condition does not fire again until it has cleared once. Of
    a grouped alert, each origin it covers then: the others' condition fires (grouped) as
    it comes."""
    with store.conn:
        row = store.alert_state(alert_id)
        if row is None:
            raise LookupError(f"no alert with id {alert_id}")
        if row[0] != "open":
            return
        store.resolve(alert_id, now_ms, by)
        members = store.holding_members(alert_id)
        if members:
            a = store.alert_row(alert_id)
            for origin in members:
                store.snooze_key(alert_key(a["kind"], a["topic"], a["window_start"], a["tier"],
                                           origin), FOREVER, by, now_ms)
        else:
            store.snooze_key(store.alert_key(alert_id), FOREVER, by, now_ms)
        if row[1]:
            _enqueue(store, cfg, alert_id, "resolved", now_ms)
