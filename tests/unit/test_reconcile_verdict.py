"""The verdict on a window, from audit records and a clock: each state, and what is alerted.

Records are built as each tier would send them; ``judge`` is pure, so every case is a sentence
with its inputs and the verdict it must give."""

from __future__ import annotations

from audit.contract.record import AuditRecord
from audit.reconcile.tiers import tier_order
from audit.reconcile.verdict import (
    COMPLETE,
    INCOMPLETE,
    MATCH,
    MISMATCH,
    OPEN,
    OVERCOUNT,
    PENDING,
    UNKNOWN,
    Currency,
    Mark,
    Timing,
    current_by_origin,
    judge,
    producer_reports,
)
from docket_common.names import NO_INCARNATION as NO_INC

W = 600_000
T0 = 1_763_766_000_000                  # a window start
END = T0 + W
TIMING = Timing(window_ms=W, grace_ms=1_800_000, final_ms=3_600_000, settle_ms=60_000)
AFTER_GRACE = END + 1_800_000
TIERS = ["producer", "kafka-local", "warehouse"]


def rec(tier: str, count: int, origin: str = "web-1", *, distinct: int | None = -1,
        checksum: int = 1000, emitted_at: int = END + 60_000, seq: int = 1,
        **kw) -> AuditRecord:
    if distinct == -1:
        distinct = count
    return AuditRecord(tier=tier, origin=origin, topic="app", window_start=T0, window_ms=W,
                       count=count, bytes=count * 100, checksum=checksum,
                       emitter=f"{origin}/agent" if tier == "producer" else f"{tier}/count",
                       seq=seq, emitted_at=emitted_at, distinct=distinct,
                       duplicates=None if distinct is None else count - distinct, **kw)


def current(counts: list[AuditRecord], currency: Currency):
    """``judge``'s question, as the evaluation asks it: of the producer's reports."""
    reports = producer_reports(counts)
    return lambda tier, origin: currency.current(tier, reports.get(origin, []))


def verdicts(counts: list, now: int = AFTER_GRACE, progress: dict | None = None,
             marks: dict | None = None) -> dict:
    """``progress``: tier → when its last progress arrived, at the end of its input (a tier
    without ``caught_up`` marks); ``marks``: tier → (emitter, incarnation) → ``Mark``."""
    by_tier = current_by_origin(counts)
    progress = {t: (at, 0) for t, at in (progress or {}).items()}
    currency = Currency(marks or {}, progress, TIMING.settle_ms)
    out = judge("app", T0, by_tier, current(counts, currency), TIERS, TIMING, now)
    return {v.tier: v for v in out}


def test_every_tier_equal_to_the_producer_is_complete_with_its_checksum_matching():
    v = verdicts([rec("producer", 100), rec("kafka-local", 100), rec("warehouse", 100)])
    for tier in TIERS:
        assert (v[tier].state, v[tier].completeness, v[tier].checksum) == (COMPLETE, 1.0, MATCH)
    assert v["warehouse"].hop_completeness == 1.0


def test_a_window_not_ended_is_open_and_a_short_one_within_the_grace_is_pending():
    counts = [rec("producer", 100), rec("kafka-local", 99)]
    assert verdicts(counts, now=END - 1)["kafka-local"].state == OPEN
    assert verdicts(counts, now=END + 1)["kafka-local"].state == PENDING
    assert verdicts(counts, now=AFTER_GRACE)["kafka-local"].state == INCOMPLETE


def test_a_complete_window_is_complete_within_its_grace_already():
    assert verdicts([rec("producer", 5), rec("kafka-local", 5)],
                    now=END + 1)["kafka-local"].state == COMPLETE


def test_a_shortfall_is_loss_only_once_the_tier_read_past_the_producers_report():
    counts = [rec("producer", 1000, emitted_at=END + 60_000), rec("kafka-local", 995)]
    behind = verdicts(counts, progress={"kafka-local": END + 90_000})["kafka-local"]
    assert behind.state == UNKNOWN
    past = verdicts(counts, progress={"kafka-local": END + 200_000})["kafka-local"]
    assert past.state == INCOMPLETE and past.origins[0].missing == 5
    assert past.completeness == 0.995


def test_a_tier_silent_about_an_origin_counts_zero_only_when_current():
    counts = [rec("producer", 10, "a"), rec("producer", 10, "b"), rec("kafka-local", 10, "a")]
    v = verdicts(counts, progress={"kafka-local": END})["kafka-local"]
    assert {o.origin: o.state for o in v.origins} == {"a": COMPLETE, "b": UNKNOWN}
    assert v.state == UNKNOWN
    v = verdicts(counts, progress={"kafka-local": END + 600_000})["kafka-local"]
    assert {o.origin: o.state for o in v.origins} == {"a": COMPLETE, "b": INCOMPLETE}
    assert (v.state, v.expected, v.actual) == (INCOMPLETE, 20, 10)


def test_duplicates_are_not_loss_and_distinct_decides_completeness():
    v = verdicts([rec("producer", 100), rec("kafka-local", 130, distinct=100)])["kafka-local"]
    assert (v.state, v.completeness, v.duplicates) == (COMPLETE, 1.0, 30)


def test_duplicates_hiding_a_loss_are_loss():
    v = verdicts([rec("producer", 100), rec("kafka-local", 104, distinct=98)])["kafka-local"]
    assert (v.state, v.count, v.actual, v.duplicates) == (INCOMPLETE, 104, 98, 6)


def test_a_tier_behind_its_input_is_not_current_however_recent_its_progress():
    counts = [rec("producer", 1000), rec("kafka-local", 400)]
    by_tier = {"producer": {"web-1": counts[0]}, "kafka-local": {"web-1": counts[1]}}
    currency = Currency({}, {"kafka-local": (AFTER_GRACE, 5_000_000)}, TIMING.settle_ms)
    [_p, v] = judge("app", T0, by_tier, current(counts, currency), TIERS[:2], TIMING,
                    AFTER_GRACE)
    assert v.state == UNKNOWN and not v.final


def test_a_tier_with_marks_is_current_once_it_read_past_a_report_delivering_the_windows():
    """The producer's report counts records numbered up to 999 (``sealed_through``); the tier
    is current once it has read past a report of that agent saying every number up to 999 was
    acknowledged (``delivered``), whatever the times its records carry."""
    report = rec("producer", 1000, sealed_through=999, incarnation="a1",
                 emitted_at=END - 20 * 60_000)            # a clock 20 minutes behind
    counts = [report, rec("kafka-local", 995)]
    key = ("web-1/agent", "a1")

    def state(mark: Mark | None) -> str:
        marks = {"kafka-local": {key: mark} if mark else {}}
        return verdicts(counts, marks=marks)["kafka-local"].state
    assert state(None) == UNKNOWN                   # not read past any of its reports
    assert state(Mark(seq=5, delivered=998)) == UNKNOWN  # one record may still be on its way
    assert state(Mark(seq=5, delivered=None)) == UNKNOWN
    assert state(Mark(seq=5, delivered=999)) == INCOMPLETE
    # The progress records, whatever they say, do not count for a tier that has marks.
    marks = {"kafka-local": {key: Mark(seq=5, delivered=998)}}
    assert verdicts(counts, marks=marks, progress={"kafka-local": END + 3_600_000}
                    )["kafka-local"].state == UNKNOWN


def test_a_report_without_record_numbers_is_read_past_by_its_own_seq():
    counts = [rec("producer", 1000, incarnation="a1", seq=7), rec("kafka-local", 995)]
    key = ("web-1/agent", "a1")
    for seq, state in ((6, UNKNOWN), (7, INCOMPLETE), (9, INCOMPLETE)):
        marks = {"kafka-local": {key: Mark(seq=seq)}}
        assert verdicts(counts, marks=marks)["kafka-local"].state == state, seq


def test_every_incarnation_of_an_origin_must_be_read_past():
    counts = [rec("producer", 600, incarnation="a1", sealed_through=599),
              rec("producer", 400, incarnation="a2", sealed_through=399),
              rec("kafka-local", 990)]
    one = {("web-1/agent", "a1"): Mark(3, 599)}
    both = {**one, ("web-1/agent", "a2"): Mark(1, 399)}
    assert verdicts(counts, marks={"kafka-local": one})["kafka-local"].state == UNKNOWN
    v = verdicts(counts, marks={"kafka-local": both})["kafka-local"]
    assert (v.state, v.expected, v.actual) == (INCOMPLETE, 1000, 990)


def test_a_tier_of_several_emitters_has_caught_up_as_far_as_the_least_of_them():
    assert Mark(5, 100).least(Mark(7, 90)) == Mark(5, 90)
    assert Mark(5, 100).least(Mark(7, None)) == Mark(5, None)


def test_an_unknown_verdict_is_not_final_so_a_tier_that_comes_back_can_still_call_a_loss():
    counts = [rec("producer", 1000), rec("kafka-local", 990)]
    late = END + 5 * 3_600_000
    assert not verdicts(counts, now=late, progress={"kafka-local": END})["kafka-local"].final
    back = verdicts(counts, now=late, progress={"kafka-local": late})["kafka-local"]
    assert (back.state, back.final) == (INCOMPLETE, True)


def test_more_distinct_records_than_the_producer_reported_means_its_report_is_behind():
    v = verdicts([rec("producer", 1000), rec("kafka-local", 1050)])["kafka-local"]
    assert v.state == UNKNOWN and "next report" in v.origins[0].reason


def test_more_records_than_accepted_without_record_numbers_is_an_overcount():
    v = verdicts([rec("producer", 100), rec("kafka-local", 104, distinct=None)])["kafka-local"]
    assert (v.state, v.distinct, v.checksum) == (OVERCOUNT, None, None)


def test_equal_counts_with_other_content_are_a_checksum_mismatch():
    v = verdicts([rec("producer", 100), rec("kafka-local", 100, checksum=999)])["kafka-local"]
    assert (v.state, v.checksum) == (COMPLETE, MISMATCH)


def test_a_tier_reporting_an_origin_the_producer_did_not_is_unknown_not_loss():
    v = verdicts([rec("kafka-local", 100, "ghost")])["kafka-local"]
    assert v.state == UNKNOWN and "no producer report" in v.origins[0].reason


def test_a_loss_of_unknown_size_marks_the_producer_tier_incomplete():
    counts = [rec("producer", 100, dropped_unknown={"deleted_unread": 1}),
              rec("kafka-local", 100)]
    v = verdicts(counts)
    assert v["producer"].state == INCOMPLETE
    assert "possible loss of unknown size" in v["producer"].origins[0].reason
    assert v["kafka-local"].state == COMPLETE


def test_a_window_is_final_from_final_ms_after_its_end():
    counts = [rec("producer", 1), rec("kafka-local", 1)]
    assert not verdicts(counts, now=END + 3_599_999)["kafka-local"].final
    assert verdicts(counts, now=END + 3_600_000)["kafka-local"].final


def test_the_tier_graph_puts_the_producer_first_and_the_warehouse_last():
    assert tier_order({"warehouse", "b", "producer", "a"}, []) == \
        ["producer", "a", "b", "warehouse"]
    assert tier_order({"x", "y"}, ["producer", "y"]) == ["producer", "y", "x"]
    assert tier_order({"x"}, ["producer", "y"]) == ["producer", "x"]   # y does not count it


# -- hops: tiers fed by other tiers (docs/topology.md) -------------------------------------------
CHAIN = ["producer", "local", "aggregate", "warehouse"]
GRAPH = {"local": ("producer",), "aggregate": ("local",), "warehouse": ("aggregate",)}


def hops(counts: list, tiers=CHAIN, graph=GRAPH, marks: dict | None = None,
         progress: dict | None = None) -> dict:
    """Verdicts of a window past its grace; the tiers without ``progress`` or ``marks`` are
    judged on their counts alone."""
    by_tier = current_by_origin(counts)
    currency = Currency(marks or {}, {t: (at, 0) for t, at in (progress or {}).items()},
                        TIMING.settle_ms)
    reports = producer_reports(counts)
    out = judge("app", T0, by_tier, current(counts, currency), tiers, TIMING, AFTER_GRACE,
                graph, lambda tier, origin: currency.claims(tier, reports.get(origin, [])))
    assert [v.tier for v in out] == tiers                 # in the order asked, whatever the graph
    return {v.tier: v for v in out}


def test_a_loss_inside_the_mirror_is_the_hops_and_the_tiers_after_it_are_complete_at_theirs():
    v = hops([rec("producer", 1000), rec("local", 1000), rec("aggregate", 990),
              rec("warehouse", 990)])
    assert (v["local"].state, v["aggregate"].state, v["warehouse"].state) == \
        (COMPLETE, INCOMPLETE, COMPLETE)
    [o] = v["aggregate"].origins
    assert (o.expected, o.hop_expected, o.missing, o.reason) == (1000, 1000, 10, "10 missing")
    assert v["aggregate"].hop == "local → aggregate"
    # Completeness end to end, the hop's against what the aggregate fed the warehouse.
    assert (v["warehouse"].completeness, v["warehouse"].hop_completeness) == (0.99, 1.0)
    assert v["warehouse"].origins[0].missing == 0


def test_a_loss_before_the_mirror_is_the_local_tiers_alone():
    v = hops([rec("producer", 1000), rec("local", 997), rec("aggregate", 997),
              rec("warehouse", 997)])
    assert [v[t].state for t in CHAIN] == [COMPLETE, INCOMPLETE, COMPLETE, COMPLETE]
    assert v["local"].origins[0].missing == 3 and v["aggregate"].origins[0].missing == 0
    assert v["aggregate"].completeness == 0.997


def test_copies_a_mirror_resent_are_duplicates_at_the_hop_never_an_overcount():
    v = hops([rec("producer", 1000), rec("local", 1000), rec("aggregate", 1300, distinct=1000),
              rec("warehouse", 1000)])
    agg = v["aggregate"]
    assert (agg.state, agg.duplicates, agg.origins[0].missing) == (COMPLETE, 300, 0)


def test_a_hop_whose_feeding_tier_has_not_judged_the_origin_is_unknown_not_loss():
    report = rec("producer", 1000, sealed_through=999, incarnation="a1")
    key = ("web-1/agent", "a1")
    caught = {t: {key: Mark(seq=1, delivered=999)} for t in ("aggregate", "warehouse")}
    v = hops([report, rec("local", 400), rec("aggregate", 400), rec("warehouse", 400)],
             marks={"local": {}, **caught})                 # local has not read the report yet
    assert (v["local"].state, v["aggregate"].state) == (UNKNOWN, UNKNOWN)
    assert v["aggregate"].origins[0].reason == "local has not judged it yet"
    # The aggregate behind (the mirror stopped): unknown there, the tiers fed by it too.
    v = hops([report, rec("local", 1000), rec("aggregate", 400), rec("warehouse", 400)],
             marks={"local": {key: Mark(1, 999)}, "aggregate": {}, "warehouse": caught[
                 "warehouse"]})
    assert [v[t].state for t in CHAIN] == [COMPLETE, COMPLETE, UNKNOWN, UNKNOWN]


def test_two_local_clusters_feed_one_aggregate_whose_expected_count_is_their_sum():
    """web-1 writes to dc1, web-2 to dc2; each local tier holds the origins its job read
    reports of; the aggregate expects both. A loss in dc2's mirror is located there."""
    tiers = ["producer", "dc1", "dc2", "aggregate"]
    graph = {"dc1": ("producer",), "dc2": ("producer",), "aggregate": ("dc1", "dc2")}
    marks = {"dc1": {("web-1/agent", NO_INC): Mark(1)}, "dc2": {("web-2/agent", NO_INC): Mark(1)},
             "aggregate": {("web-1/agent", NO_INC): Mark(1), ("web-2/agent", NO_INC): Mark(1)}}
    counts = [rec("producer", 100, "web-1"), rec("producer", 50, "web-2"),
              rec("dc1", 100, "web-1"), rec("dc2", 50, "web-2"),
              rec("aggregate", 100, "web-1"), rec("aggregate", 45, "web-2")]
    v = hops(counts, tiers, graph, marks)
    assert [o.origin for o in v["dc1"].origins] == ["web-1"]     # web-2 is not dc1's
    assert [o.origin for o in v["dc2"].origins] == ["web-2"]
    assert (v["dc1"].state, v["dc2"].state) == (COMPLETE, COMPLETE)
    agg = v["aggregate"]
    assert (agg.state, agg.expected, agg.actual, agg.hop) == \
        (INCOMPLETE, 150, 145, "dc1 + dc2 → aggregate")
    assert {o.origin: (o.state, o.hop_expected, o.missing, o.feeders) for o in agg.origins} \
        == {"web-1": (COMPLETE, 100, 0, ("dc1",)), "web-2": (INCOMPLETE, 50, 5, ("dc2",))}


def test_a_declared_feeder_that_does_not_count_the_topic_is_skipped_for_its_own():
    from audit.reconcile.tiers import feeders_of
    assert feeders_of(["producer", "aggregate", "warehouse"], GRAPH) == {
        "aggregate": ("producer",), "warehouse": ("aggregate",)}
    assert feeders_of(["producer", "warehouse"], GRAPH) == {"warehouse": ("producer",)}
    assert feeders_of(["producer", "kafka-local", "warehouse"], {}) == {
        "kafka-local": ("producer",), "warehouse": ("producer",)}


def test_a_data_centre_that_does_not_count_the_topic_adds_nothing_to_the_hops_expected():
    """dc1 counts no record of this topic: the aggregate expects what dc2 holds of web-2
    (never dc2's and the producer's summed), and web-1, which no feeder holds, against the
    producer; dc2, still one of two declared local tiers, judges only the origins it holds."""
    graph = {"dc1": ("producer",), "dc2": ("producer",), "aggregate": ("dc1", "dc2")}
    tiers = ["producer", "dc2", "aggregate"]
    marks = {"dc2": {("web-2/agent", NO_INC): Mark(1)},
             "aggregate": {("web-1/agent", NO_INC): Mark(1), ("web-2/agent", NO_INC): Mark(1)}}
    v = hops([rec("producer", 50, "web-2"), rec("producer", 30, "web-1"),
              rec("dc2", 50, "web-2"), rec("aggregate", 50, "web-2"),
              rec("aggregate", 30, "web-1")], tiers, graph, marks)
    assert [o.origin for o in v["dc2"].origins] == ["web-2"]
    agg = {o.origin: o for o in v["aggregate"].origins}
    assert (v["aggregate"].state, v["aggregate"].fed_by) == (COMPLETE, ("producer", "dc2"))
    assert (agg["web-2"].hop_expected, agg["web-2"].feeders) == (50, ("dc2",))
    assert (agg["web-1"].state, agg["web-1"].at_hop, agg["web-1"].feeders) == \
        (COMPLETE, 30, ("producer",))


def test_more_distinct_records_than_reported_are_not_an_overcount_whatever_the_copies():
    """The tier holds copies (a mirror resent) and records the producer's report does not
    count yet: unknown until the next report, not an overcount."""
    v = verdicts([rec("producer", 100), rec("kafka-local", 130, distinct=110)])["kafka-local"]
    assert (v.state, v.duplicates) == (UNKNOWN, 20)
    assert "next report" in v.origins[0].reason


# -- after review: origins no tier holds, losses upstream of a hop, like with like ---------------
DCS = ["producer", "dc1", "dc2", "aggregate"]
DC_GRAPH = {"dc1": ("producer",), "dc2": ("producer",), "aggregate": ("dc1", "dc2")}


def test_an_origin_that_reached_no_tier_is_unknown_at_every_tier_never_left_out():
    """web-3 reported 50 records; no data centre's job has read its reports and no tier holds
    any of them. Left out, every tier was complete and the aggregate expected 100."""
    marks = {"dc1": {("web-1/agent", NO_INC): Mark(1)}, "dc2": {},
             "aggregate": {("web-1/agent", NO_INC): Mark(1)}}
    counts = [rec("producer", 100, "web-1"), rec("producer", 50, "web-3"),
              rec("dc1", 100, "web-1"), rec("aggregate", 100, "web-1")]
    v = hops(counts, DCS, DC_GRAPH, marks)
    assert (v["dc1"].state, v["dc2"].state, v["aggregate"].state) == (UNKNOWN,) * 3
    assert not any(v[t].final for t in DCS)
    for tier in ("dc1", "dc2"):
        [o] = [o for o in v[tier].origins if o.origin == "web-3"]
        assert o.state == UNKNOWN and "no tier fed by the producer holds it" in o.reason
    assert [o.origin for o in v["dc2"].origins] == ["web-3"]      # web-1 is dc1's
    agg = {o.origin: o for o in v["aggregate"].origins}
    assert (v["aggregate"].expected, agg["web-3"].state) == (150, UNKNOWN)
    assert agg["web-1"].state == COMPLETE


def test_an_origin_no_tier_holds_is_judged_when_a_tiers_job_reads_its_reports():
    """The same window once dc2's job has read web-3's reports: dc2 holds nothing of it, a
    loss there; the aggregate is complete at its hop (it holds what dc2 holds)."""
    marks = {"dc1": {("web-1/agent", NO_INC): Mark(1)}, "dc2": {("web-3/agent", NO_INC): Mark(1)},
             "aggregate": {("web-1/agent", NO_INC): Mark(1), ("web-3/agent", NO_INC): Mark(1)}}
    counts = [rec("producer", 100, "web-1"), rec("producer", 50, "web-3"),
              rec("dc1", 100, "web-1"), rec("aggregate", 100, "web-1")]
    v = hops(counts, DCS, DC_GRAPH, marks)
    assert [o.origin for o in v["dc1"].origins] == ["web-1"]
    [o] = v["dc2"].origins
    assert (o.origin, o.state, o.missing) == ("web-3", INCOMPLETE, 50)
    agg = {o.origin: o for o in v["aggregate"].origins}
    assert (agg["web-3"].state, agg["web-3"].hop_expected) == (COMPLETE, 0)


def test_a_tier_without_marks_cannot_say_an_origin_is_not_its():
    """Neither data centre publishes caught_up marks (``claims`` says None): an origin none
    of them counted is unknown at each, not left out; an origin another one counted is its."""
    counts = [rec("producer", 100, "web-1"), rec("producer", 60, "web-2"),
              rec("producer", 50, "web-3"), rec("dc1", 100, "web-1"), rec("dc2", 60, "web-2"),
              rec("aggregate", 100, "web-1"), rec("aggregate", 60, "web-2")]
    v = hops(counts, DCS, DC_GRAPH)
    assert [o.origin for o in v["dc1"].origins] == ["web-1", "web-3"]
    assert [o.origin for o in v["dc2"].origins] == ["web-2", "web-3"]
    assert {v[t].origins[-1].state for t in ("dc1", "dc2")} == {UNKNOWN}
    assert v["aggregate"].state == UNKNOWN and v["aggregate"].expected == 210


def test_an_origin_that_reported_nothing_needs_no_tier_to_hold_it():
    """An agent's heartbeat (count 0) that no data centre claims yet is nothing to lose."""
    marks = {"dc1": {("web-1/agent", NO_INC): Mark(1)}, "dc2": {},
             "aggregate": {("web-1/agent", NO_INC): Mark(1)}}
    counts = [rec("producer", 100, "web-1"), rec("producer", 0, "web-9"),
              rec("dc1", 100, "web-1"), rec("aggregate", 100, "web-1")]
    v = hops(counts, DCS, DC_GRAPH, marks)
    assert [v[t].state for t in DCS] == [COMPLETE] * 4


def test_a_hop_includes_every_producer_origin_so_one_no_feeder_holds_is_unknown():
    """A feeder whose verdict leaves an origin out (here: its reports were read by a tier
    that does not feed the aggregate) does not make it vanish at the hop."""
    tiers = ["producer", "dc1", "dc2", "dc3", "aggregate"]
    graph = {"dc1": ("producer",), "dc2": ("producer",), "dc3": ("producer",),
             "aggregate": ("dc1", "dc2")}
    marks = {"dc1": {("web-1/agent", NO_INC): Mark(1)}, "dc2": {},
             "dc3": {("web-3/agent", NO_INC): Mark(1)},
             "aggregate": {("web-1/agent", NO_INC): Mark(1), ("web-3/agent", NO_INC): Mark(1)}}
    counts = [rec("producer", 100, "web-1"), rec("producer", 50, "web-3"),
              rec("dc1", 100, "web-1"), rec("dc3", 50, "web-3"), rec("aggregate", 100, "web-1")]
    v = hops(counts, tiers, graph, marks)
    agg = {o.origin: o for o in v["aggregate"].origins}
    assert (agg["web-3"].state, agg["web-3"].reason) == (UNKNOWN, "no feeding tier holds it yet")
    assert v["aggregate"].state == UNKNOWN


def test_a_loss_at_the_local_tier_after_the_mirror_copied_is_the_local_tiers_alone():
    """Records deleted on the local cluster after MirrorMaker 2 copied them: local counts 90,
    the aggregate holds 100. The loss is the local tier's; the aggregate is complete at its
    hop (it was unknown for 7 days, waiting for a report that would never come)."""
    v = hops([rec("producer", 100), rec("local", 90), rec("aggregate", 100),
              rec("warehouse", 100)])
    assert [v[t].state for t in CHAIN] == [COMPLETE, INCOMPLETE, COMPLETE, COMPLETE]
    agg = v["aggregate"].origins[0]
    assert (agg.hop_expected, agg.missing, agg.checksum) == (90, 0, MATCH)
    assert "local" in agg.reason
    # Not read past the report yet: unknown, not complete.
    report = rec("producer", 100, sealed_through=99, incarnation="a1")
    key = ("web-1/agent", "a1")
    v = hops([report, rec("local", 90), rec("aggregate", 100)], ["producer", "local",
             "aggregate"], marks={"local": {key: Mark(1, 99)}, "aggregate": {}})
    assert v["aggregate"].state == UNKNOWN
    # More distinct records than the producer reported: its report is behind, unknown.
    v = hops([rec("producer", 100), rec("local", 90), rec("aggregate", 105)],
             ["producer", "local", "aggregate"])
    assert v["aggregate"].state == UNKNOWN and "next report" in v["aggregate"].origins[0].reason


def test_a_feeder_without_record_identity_gives_no_false_loss_at_an_identity_hop():
    """local counts without identity (1,010: 10 copies an agent resent), the aggregate with:
    1,000 distinct. Against local's count, 10 were 'lost' at the hop."""
    v = hops([rec("producer", 1000), rec("local", 1010, distinct=None),
              rec("aggregate", 1010, distinct=1000)], ["producer", "local", "aggregate"])
    assert v["local"].state == OVERCOUNT
    agg = v["aggregate"].origins[0]
    assert (agg.state, agg.hop_expected, agg.missing) == (COMPLETE, 1000, 0)


def test_a_hop_tier_without_record_identity_is_compared_with_its_feeders_counts():
    """The aggregate counts without identity: it holds local's 1,010 records (10 copies), not
    an overcount against local's 1,000 distinct; 5 fewer are lost at the hop."""
    v = hops([rec("producer", 1000), rec("local", 1010, distinct=1000),
              rec("aggregate", 1010, distinct=None)], ["producer", "local", "aggregate"])
    agg = v["aggregate"].origins[0]
    assert (agg.state, agg.hop_expected) == (COMPLETE, 1010)
    v = hops([rec("producer", 1000), rec("local", 1010, distinct=1000),
              rec("aggregate", 1005, distinct=None)], ["producer", "local", "aggregate"])
    agg = v["aggregate"].origins[0]
    assert (agg.state, agg.missing) == (INCOMPLETE, 5)


def test_a_hops_own_duplicates_leave_out_those_its_feeders_hold():
    v = hops([rec("producer", 1000), rec("local", 1100, distinct=1000),
              rec("aggregate", 1150, distinct=1000)], ["producer", "local", "aggregate"])
    agg = v["aggregate"].origins[0]
    assert (agg.duplicates, agg.hop_duplicates) == (150, 50)
    assert v["aggregate"].duplicates == 150                 # the tier's, in the tables
    assert v["local"].origins[0].hop_duplicates == 100
