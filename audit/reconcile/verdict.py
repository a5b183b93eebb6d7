"""The verdict on one (topic, window): for each tier, and within it for each origin, how much of
what the producers accepted arrived, and what that means. Pure: records and a clock in,
verdicts out; the store and the alerting are elsewhere.

Per origin, at a tier T other than the producer (``expected`` = the producer's ``count``, which
already leaves out the events the agent dropped on purpose; ``actual`` = T's ``distinct`` when
T knows it, else its ``count``):

- no producer report for the origin              → ``unknown`` (an audit fault, never loss);
- ``actual`` < ``expected``, T current           → ``incomplete`` (loss);
- ``actual`` < ``expected``, T not current       → ``unknown`` (T may not have read it yet);
- ``actual`` > ``expected``                      → ``overcount``;
- otherwise                                      → ``complete`` (duplicates shown apart).

T is *current* for an origin's window (:class:`Currency`) when it has caught up with the
producer's report on the window, in positions, never in clocks: T's jobs have read past a
report of that origin whose ``delivered`` reaches the window report's ``sealed_through`` (every
record the count holds was in Kafka before it), or, for reports without record numbers, past
the window report itself (``caught_up`` records, ``Store.caught_up``). A tier that publishes
no ``caught_up`` marks is current when its newest progress (of each of its emitters:
``Store.current_progress``) *arrived* at least ``settle_ms`` after the origin's report arrived
(one clock: the broker's, or the reconciler's) and said it was at the end of its input; a tier
that publishes neither is judged on its counts alone, once the grace is over. When T counted
more distinct records than the producer reported (whatever its copies), the producer's report
is behind (its next one will have them): ``unknown`` again, not an overcount. The checksum is
compared when the counts agree and T saw no duplicates.

**Hops.** A tier is *fed* by other tiers (``[tiers.NAME] fed_by``, docs/topology.md): a local
cluster by the producer, an aggregate cluster by the local clusters its mirrors copy, the
warehouse by the cluster it lands. Every tier is fed by the producer unless declared (the
judgement above). A tier fed by other tiers is judged on its hop: per origin, ``expected`` at
the hop is the sum of what its feeding tiers hold of the origin, like with like: their
``distinct`` at a tier with record identity (a feeder without: its count, up to what it should
hold), their ``count`` at a tier without. So a loss inside a mirror is the mirror's hop, never
the producer's. An origin that a feeding tier has not judged yet (``unknown`` there), or that
no feeding tier holds, is ``unknown`` at the hop: every origin the producer reported is judged
there. More than the feeding tiers hold, but no more than the producer accepted, with T
current, is ``complete`` at the hop: records lost in a feeding tier after the mirror copied
them, that tier's loss. Completeness stays end to end (against the producer);
``hop_completeness`` is against the hop's expected; ``hop_duplicates`` are the duplicates
beyond those the feeding tiers hold (the tier's ``duplicates`` count them all).

Several tiers fed by the producer (one local cluster per data centre), when they are declared
so (``fed_by = ["producer"]``), each judge the origins they hold: those whose agents' reports
their job has read (its ``caught_up`` marks name the agent) or that they counted. An origin
that none of them holds (no job has read its reports, nothing of it counted; a tier without
marks cannot say an origin is not its) is ``unknown`` at each, never left out: its records
would vanish from every tier's expected, and the window could go final complete. (Unless one
of them does not count the topic at all: the origin may be that one's, and the hop after it
judges the origin by the producer. And an origin that reported nothing needs no holder.) With
one such tier, or for a tier not declared, every origin is its.

At the producer tier an origin whose agent journalled a loss of unknown size
(``dropped_unknown``: a file deleted or truncated before it was read) is ``incomplete``: a
*possible* loss that no count downstream can show.

The window's phase comes first: ``open`` until it ends; within ``grace_ms`` after its end
``pending`` unless already ``complete``; then the verdict. ``final`` from ``final_ms`` after
its end, unless the verdict is ``unknown`` (a tier that comes back must still be able to call a
loss): those windows are final only ``UNKNOWN_FINAL_MS`` after their end. A tier's state is
the worst of its origins' (incomplete, unknown, overcount, complete, in that order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from audit.contract.collect import current_counts
from audit.contract.record import PRODUCER_TIER, AuditRecord
from docket_common.names import NO_INCARNATION

from .tiers import feeders_first, feeders_of, hop_label

OPEN, PENDING = "open", "pending"
COMPLETE, INCOMPLETE, OVERCOUNT, UNKNOWN = "complete", "incomplete", "overcount", "unknown"
STATES = (OPEN, PENDING, COMPLETE, INCOMPLETE, OVERCOUNT, UNKNOWN)
# Every state, the worst first: what a row of tiers or origins shows is its worst one's.
WORST_FIRST = (INCOMPLETE, UNKNOWN, OVERCOUNT, PENDING, OPEN, COMPLETE)
MATCH, MISMATCH = "match", "mismatch"          # checksum states; None: not comparable
UNKNOWN_FINAL_MS = 7 * 24 * 3600 * 1000        # an unknown verdict is final only after this


@dataclass(frozen=True)
class Timing:
    window_ms: int
    grace_ms: int
    final_ms: int
    settle_ms: int


@dataclass(frozen=True)
class Mark:
    """How far a tier has caught up with one emitter: the highest ``seq`` of its audit records
    read past, and of its ``ranges`` records the highest ``delivered`` (an agent's; None:
    none said)."""

    seq: int
    delivered: int | None = None

    def least(self, other: Mark) -> Mark:
        """As far as both have caught up (a tier of several emitters)."""
        delivered = None if self.delivered is None or other.delivered is None else \
            min(self.delivered, other.delivered)
        return Mark(min(self.seq, other.seq), delivered)

    def past(self, report: AuditRecord) -> bool:
        """Has the tier read every record ``report`` counts (or lost it)?"""
        if report.sealed_through is not None:
            return self.delivered is not None and self.delivered >= report.sealed_through
        return self.seq >= report.seq


@dataclass(frozen=True)
class Currency:
    """The caught-up rule, for one evaluation. ``marks``: tier → (emitter, incarnation) →
    ``Mark`` (``Store.caught_up``); ``progress``: tier → (arrival, ``offsets_behind``) of its
    newest progress (``Store.current_progress``), for the tiers without marks."""

    marks: dict[str, dict[tuple[str, str], Mark]]
    progress: dict[str, tuple[int, int | None]]
    settle_ms: int

    def current(self, tier: str, reports: list[AuditRecord]) -> bool:
        """Has ``tier`` read everything the producer's ``reports`` (of one origin and window,
        one per incarnation) count?"""
        marks = self.marks.get(tier)
        if marks is not None:
            return bool(reports) and all(
                (m := marks.get((r.emitter, r.incarnation or NO_INCARNATION))) is not None
                and m.past(r) for r in reports)
        progress = self.progress.get(tier)
        if progress is None:
            return True                           # judged on its counts alone
        at, behind = progress
        arrived = max((r.arrived_at if r.arrived_at is not None else r.emitted_at
                       for r in reports), default=None)
        return arrived is not None and at >= arrived + self.settle_ms and not behind


    def claims(self, tier: str, reports: list[AuditRecord]) -> bool | None:
        """Has ``tier``'s job read an audit record of the agents behind ``reports`` (its
        ``caught_up`` marks name one of them)? None: the tier publishes no marks."""
        marks = self.marks.get(tier)
        if marks is None:
            return None
        emitters = {r.emitter for r in reports}
        return any(emitter in emitters for emitter, _incarnation in marks)


@dataclass
class OriginVerdict:
    origin: str
    state: str
    expected: int | None           # the producer's count; None: no producer report
    count: int                     # records this tier counted (0 when it reported none)
    distinct: int | None
    duplicates: int | None
    checksum: str | None           # match / mismatch / None (not comparable)
    reason: str = ""
    dropped: int = 0               # the producer's known drops (producer tier only)
    dropped_unknown: dict[str, int] = field(default_factory=dict)
    hop_expected: int | None = None  # what the feeding tiers hold of it; None: as expected
    feeders: tuple[str, ...] = ()    # the feeding tiers that hold it (a tier fed by tiers)
    feeder_duplicates: int | None = None  # the copies its feeding tiers hold (at a hop)

    @property
    def actual(self) -> int:
        return self.distinct if self.distinct is not None else self.count

    @property
    def at_hop(self) -> int | None:
        """What this tier should hold of the origin: its feeding tiers' (the producer's)."""
        return self.hop_expected if self.hop_expected is not None else self.expected

    @property
    def hop_duplicates(self) -> int | None:
        """Duplicates this tier's hop added: at a hop, those beyond the copies its feeding
        tiers hold already (a mirror copies duplicates along); else all of them."""
        if self.duplicates is None or self.feeder_duplicates is None:
            return self.duplicates
        return max(0, self.duplicates - self.feeder_duplicates)

    @property
    def missing(self) -> int:
        """Records lost at this tier's hop (not those its feeding tiers lost already)."""
        return max(0, (self.at_hop or 0) - self.actual)

    @property
    def plain(self) -> bool:
        """Exactly what the producer accepted, each record once, the same content: nothing to
        say beyond the producer's count (such an origin has no ``window_origins`` row)."""
        return self.state == COMPLETE and self.checksum == MATCH and not self.duplicates and \
            self.distinct == self.count == self.expected


@dataclass
class TierVerdict:
    topic: str
    window_start: int
    tier: str
    state: str
    final: bool
    expected: int
    count: int
    distinct: int | None
    duplicates: int | None
    dropped: int
    dropped_unknown: dict[str, int]
    completeness: float | None     # actual / expected (end to end)
    hop_completeness: float | None  # actual / what its feeding tiers hold
    checksum: str | None           # mismatch if any origin's is, match if all are
    origins: list[OriginVerdict]
    fed_by: tuple[str, ...] = (PRODUCER_TIER,)

    @property
    def hop(self) -> str:
        """``kafka-local → aggregate``: the hop this tier's verdict is about."""
        return hop_label(self.tier, self.fed_by)

    @property
    def actual(self) -> int:
        return self.distinct if self.distinct is not None else self.count

    @property
    def judged(self) -> bool:
        """Past the grace: the verdict is what the counts say, alerts may fire."""
        return self.state not in (OPEN, PENDING)


def judge(topic: str, window_start: int, counts: dict[str, dict[str, AuditRecord]],
          current: Callable[[str, str], bool], tiers: list[str], timing: Timing,
          now_ms: int, graph: dict[str, tuple[str, ...]] | None = None,
          claims: Callable[[str, str], bool | None] | None = None) -> list[TierVerdict]:
    """Verdicts of every tier in ``tiers`` on one window, in that order. ``counts``: tier →
    origin → the record that counts (``audit.contract.collect.current_counts``);
    ``current(tier, origin)``: has the tier caught up with the origin's report on the window
    (``Currency.current``)? ``graph``: tier → the tiers it is fed by (``feeders_of``);
    ``claims(tier, origin)``: has a tier fed by the producer read the origin's agent's reports
    (``Currency.claims``), asked when several tiers are fed by the producer."""
    producer = counts.get(PRODUCER_TIER, {})
    end = window_start + timing.window_ms
    feeders = feeders_of(tiers, graph or {})
    local = [t for t, f in (graph or {}).items() if f == (PRODUCER_TIER,)]  # declared
    # Several tiers fed by the producer (a local cluster per data centre) each judge the
    # origins they hold; one that none holds is unknown at each, unless a declared one does
    # not count the topic (it may be that one's: the hop after judges it by the producer).
    holders = _holders(producer, counts, local, claims) \
        if claims is not None and len(local) >= 2 else None
    all_count = all(t in tiers for t in local)
    judged: dict[str, TierVerdict] = {}
    for tier in feeders_first(tiers, feeders):
        records = counts.get(tier, {})
        fed = feeders.get(tier, ())
        if tier == PRODUCER_TIER:
            verdicts = [_producer_origin(o, producer[o]) for o in sorted(producer)]
        elif fed == (PRODUCER_TIER,):
            verdicts = []
            for o in sorted(set(producer) | set(records)):
                held = None if holders is None or tier not in local else holders.get(o)
                if held is None or tier in held:
                    verdicts.append(_origin(o, producer.get(o), records.get(o),
                                            o in producer and current(tier, o)))
                elif not held and all_count and producer[o].count:
                    verdicts.append(_unclaimed(o, producer[o], claims(tier, o) is None))
        else:
            # A declared feeder that does not count the topic stands for its own feeders: the
            # producer, for the origins no other feeder holds (never summed with them). Every
            # origin the producer reported is here: one that no feeder holds is unknown.
            tiers_fed = [f for f in fed if f != PRODUCER_TIER]
            upstream = [{o.origin: o for o in judged[f].origins} for f in tiers_fed]
            origins = set(records).union(*upstream)
            origins |= {o for o, p in producer.items() if p.count or PRODUCER_TIER in fed}
            verdicts = []
            for o in sorted(origins):
                held = [(f, u[o]) for f, u in zip(tiers_fed, upstream, strict=True) if o in u]
                by_producer = not held and PRODUCER_TIER in fed
                v = _origin(o, producer.get(o), records.get(o),
                            o in producer and current(tier, o), None if by_producer else held)
                if by_producer:
                    v.feeders = (PRODUCER_TIER,)
                verdicts.append(v)
        v = _tier(topic, window_start, tier, False, verdicts, fed or (PRODUCER_TIER,))
        v.state = _phase(v.state, now_ms, end, timing)
        # An origin still unknown (the tier has not read past its report) holds the window
        # open as an unknown tier does, whatever another origin's verdict made of the tier:
        # nothing marks a final window changed when the tier's mark for that origin comes.
        held = UNKNOWN if any(o.state == UNKNOWN for o in verdicts) else v.state
        v.final = _final(held, now_ms, end, timing)
        judged[tier] = v
    return [judged[t] for t in tiers]


def _holders(producer: dict[str, AuditRecord], counts: dict[str, dict[str, AuditRecord]],
             local: list[str], claims: Callable[[str, str], bool | None]
             ) -> dict[str, set[str]]:
    """Of several declared tiers fed by the producer (``local``), origin → those that hold it:
    whose job has read its agent's reports (``claims``) or that counted it. A tier that
    publishes no marks (``claims`` None: it cannot say) holds only what it counted."""
    return {o: {t for t in local if o in counts.get(t, {}) or claims(t, o)}
            for o in producer}


def _unclaimed(origin: str, p: AuditRecord, cannot_say: bool) -> OriginVerdict:
    """An origin that no tier fed by the producer holds (none has read its agent's reports
    or counted it), at each of them: ``unknown``, never left out (its records would vanish
    from every tier's expected) and never a loss (which tier lost it?)."""
    v = _origin(origin, p, None, False)
    v.reason = "no tier fed by the producer holds it yet: " + (
        "this one publishes no caught_up marks, so cannot say it is not its" if cannot_say
        else "no job has read its agent's reports")
    return v


def current_by_origin(records: list[AuditRecord]) -> dict[str, dict[str, AuditRecord]]:
    """tier → origin → the record that counts, of one window's records: each record itself
    when it is the only one of its tier and origin, else ``current_counts``."""
    counts: dict[str, dict[str, AuditRecord]] = {}
    for rec in records:
        by_origin = counts.setdefault(rec.tier, {})
        if rec.origin in by_origin or rec.is_skip_tally:
            counts = {}
            for tier, by_key in current_counts(records).items():
                counts[tier] = {origin: r for (_t, _w, origin), r in by_key.items()}
            return counts
        by_origin[rec.origin] = rec
    return counts


def producer_reports(records: list[AuditRecord]) -> dict[str, list[AuditRecord]]:
    """origin → the producer's count records of one window, one per emitter incarnation (the
    newest of each): what ``Currency.current`` asks a tier to have caught up with."""
    out: dict[str, list[AuditRecord]] = {}
    for rec in records:
        if rec.tier == PRODUCER_TIER and not rec.is_skip_tally:
            out.setdefault(rec.origin, []).append(rec)
    return out


def _producer_origin(origin: str, rec: AuditRecord) -> OriginVerdict:
    lossy = bool(rec.dropped_unknown)
    return OriginVerdict(
        origin, INCOMPLETE if lossy else COMPLETE, rec.count, rec.count, rec.count, 0, MATCH,
        reason=("possible loss of unknown size: " + ", ".join(
            f"{n} {reason}" for reason, n in sorted(rec.dropped_unknown.items()))) if lossy
        else "", dropped=rec.dropped, dropped_unknown=dict(rec.dropped_unknown))


def _origin(origin: str, p: AuditRecord | None, r: AuditRecord | None, current: bool,
            upstream: list[tuple[str, OriginVerdict]] | None = None) -> OriginVerdict:
    """One origin at a tier: against the producer's report ``p``, or, for a tier fed by other
    tiers, against what ``upstream`` (feeding tier, its verdict on the origin) holds."""
    count = r.count if r else 0
    distinct = r.distinct if r else (0 if current else None)
    duplicates = r.duplicates if r else (0 if current else None)
    v = OriginVerdict(origin, UNKNOWN, p.count if p else None, count, distinct, duplicates, None)
    if p is None:
        v.reason = "no producer report for this origin"
        return v
    expected, source = p.count, "the producer's report"
    if upstream is not None:
        if not upstream:
            v.reason = "no feeding tier holds it yet"
            return v
        blind = [f for f, u in upstream if u.state == UNKNOWN]
        if blind:
            v.reason = f"{', '.join(blind)} has not judged it yet"
            return v
        # Like with like: a tier without record identity holds its feeders' records with
        # their copies; one with identity holds each once (a feeder without identity: at
        # most what that feeder should hold).
        plain = r is not None and r.distinct is None
        expected = v.hop_expected = sum(u.count if plain else _distinct(u) for _f, u in upstream)
        v.feeder_duplicates = sum(u.count - _distinct(u) for _f, u in upstream)
        v.feeders = tuple(f for f, _u in upstream)
        source = " + ".join(v.feeders)
    if r is None and not current:
        v.reason = "the tier has not reported it yet"
        return v
    if v.actual < expected:
        v.state = INCOMPLETE if current else UNKNOWN
        v.reason = f"{expected - v.actual} missing" if current else \
            f"{expected - v.actual} not seen yet; the tier has not read past the producer's report"
    elif v.actual > expected and upstream and v.actual <= p.count:
        # More than the feeding tiers hold now, no more than the producer accepted: records
        # lost there after they were copied here. The loss is the feeding tier's.
        v.state = COMPLETE if current else UNKNOWN
        v.reason = f"{v.actual - expected} more than {source} holds: lost there after they " \
            "were copied" if current else f"{v.actual - expected} more than {source} holds; " \
            "the tier has not read past the producer's report"
    elif v.actual > expected and r is not None and r.distinct is not None:
        # More *distinct* records than expected: never copies (those are duplicates, apart),
        # so records the report did not count yet.
        v.reason = f"{v.actual - p.count} more distinct records than the producer's report " \
            "says: its next report will have them"
    elif v.actual > expected:
        v.state = OVERCOUNT
        v.reason = f"{v.actual - expected} more than {source} holds" if upstream else \
            f"{v.actual - expected} more than the producer accepted"
    else:
        v.state = COMPLETE
    if r is not None and r.count == p.count and not r.duplicates:
        v.checksum = MATCH if r.checksum == p.checksum else MISMATCH
        if v.checksum == MISMATCH:
            v.reason = "counts agree, content differs (checksum)"
    elif r is None and p.count == 0:
        v.checksum = MATCH
    return v


def _distinct(u: OriginVerdict) -> int:
    """Records of an origin a feeding tier holds, each once: its ``distinct``, or, without
    record identity, its count up to what it should hold (more are copies, or not the
    hop's)."""
    if u.distinct is not None:
        return u.distinct
    return u.count if u.at_hop is None else min(u.count, u.at_hop)


def _tier(topic: str, window_start: int, tier: str, final: bool,
          origins: list[OriginVerdict], fed_by: tuple[str, ...]) -> TierVerdict:
    known = [o for o in origins if o.expected is not None]
    expected = sum(o.expected for o in known)
    count = sum(o.count for o in origins)
    distinct = None if any(o.distinct is None for o in origins) else \
        sum(o.distinct for o in origins)
    duplicates = None if distinct is None else count - distinct
    states = {o.state for o in origins}
    state = next((s for s in WORST_FIRST if s in states), COMPLETE)
    checks = {o.checksum for o in origins}
    checksum = MISMATCH if MISMATCH in checks else (MATCH if checks <= {MATCH} else None)
    actual = distinct if distinct is not None else count
    dropped_unknown: dict[str, int] = {}
    for o in origins:
        for reason, n in o.dropped_unknown.items():
            dropped_unknown[reason] = dropped_unknown.get(reason, 0) + n
    at_hop = [o.at_hop for o in origins if o.at_hop is not None]
    return TierVerdict(
        topic, window_start, tier, state, final, expected, count, distinct, duplicates,
        sum(o.dropped for o in origins), dropped_unknown,
        completeness=_ratio(actual, expected),
        hop_completeness=_ratio(sum(o.actual for o in origins if o.at_hop is not None),
                                sum(at_hop)),
        checksum=checksum, origins=origins, fed_by=fed_by)


def _ratio(actual: int, expected: int) -> float | None:
    if expected:
        return actual / expected
    return 1.0 if actual == 0 else None


def complete_phase(window_start: int, timing: Timing, now_ms: int) -> tuple[str, bool]:
    """The state and finality ``judge`` gives a window whose every origin is complete at
    every tier (a plain window: ``Store.plain_windows``)."""
    end = window_start + timing.window_ms
    state = _phase(COMPLETE, now_ms, end, timing)
    return state, _final(state, now_ms, end, timing)


def _final(state: str, now_ms: int, end: int, timing: Timing) -> bool:
    return now_ms >= end + (UNKNOWN_FINAL_MS if state == UNKNOWN else timing.final_ms)


def _phase(state: str, now_ms: int, end: int, timing: Timing) -> str:
    if now_ms < end:
        return OPEN
    if now_ms < end + timing.grace_ms and state != COMPLETE:
        return PENDING
    return state
