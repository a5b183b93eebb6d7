"""The verdict on a window, from audit records and a clock: each state, and what is alerted.

Records are built as each tier would send them; ``judge`` is pure, so every case is a sentence
with its inputs and the verdict it must give."""

from __future__ import annotations

from audit.contract.record import AuditRecord
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
    tier_order,
)

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
