"""The audit record: encoding, validation of everything a topic can hold, checksum arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest
import xxhash

from audit.contract.collect import AuditState
from audit.contract.errors import MalformedRecord
from audit.contract.record import (
    MAX_RANGES,
    MAX_RECORD_BYTES,
    AuditRecord,
    CaughtUp,
    Progress,
    Ranges,
    checksum_hex,
    combine_halves,
    parse,
    value_hash,
)
from docket_common.window import window_start


def record(**kw) -> AuditRecord:
    base = dict(tier="producer", origin="web-42", topic="app.events",
                window_start=1_763_766_000_000, window_ms=600_000, count=12345,
                bytes=1_234_500, checksum=0x9F3A51C0D2E4B117,
                emitter="web-42/agent", seq=17, emitted_at=1_763_766_612_345)
    return AuditRecord(**{**base, **kw})


def test_encodes_the_design_example_and_parses_it_back():
    key, value = record(dropped=2, dropped_reasons={"oversize_dropped": 2}, late=3).encode()
    assert key == b"producer|web-42|app.events|1763766000000"
    obj = json.loads(value)
    assert obj["v"] == 1 and obj["checksum"] == "9f3a51c0d2e4b117"
    assert parse(value) == record(dropped=2, dropped_reasons={"oversize_dropped": 2}, late=3)


def test_losses_of_unknown_size_round_trip_and_old_records_read_as_none():
    r = record(dropped_unknown={"deleted_unread": 1})
    assert parse(r.encode()[1]) == r
    old = json.loads(record().encode()[1])
    del old["dropped_unknown"]                      # a record from an earlier agent
    assert parse(json.dumps(old).encode()).dropped_unknown == {}
    with pytest.raises(MalformedRecord, match="dropped_unknown"):
        parse(json.dumps({**old, "dropped_unknown": {"x": -1}}).encode())


def test_progress_round_trips():
    p = Progress(tier="kafka-local", emitter="kafka-local/count", batch_id=4,
                 input_rows_per_s=10.5, processed_rows_per_s=20, batch_duration_ms=300,
                 offsets_behind=None, emitted_at=5)
    key, value = p.encode()
    assert key == b"progress|kafka-local|kafka-local/count"
    assert parse(value) == p


def test_a_progress_record_says_whether_its_job_publishes_caught_up_records():
    p = Progress(tier="warehouse", emitter="warehouse/land", batch_id=4, input_rows_per_s=1.0,
                 processed_rows_per_s=1.0, batch_duration_ms=3, offsets_behind=None,
                 emitted_at=5, publishes_caught_up=True)
    assert parse(p.encode()[1]) == p
    old = json.loads(p.encode()[1])
    del old["publishes_caught_up"]                  # a job before caught_up records
    assert parse(json.dumps(old).encode()).publishes_caught_up is False


def test_caught_up_records_round_trip_and_are_checked():
    c = CaughtUp(tier="kafka-local", emitter="kafka-local/count", incarnation="j1", seq=42,
                 source="web-42/agent", source_incarnation="a1", source_seq=18,
                 source_delivered=1234000, emitted_at=7)
    key, value = c.encode()
    assert key == b"caught_up|kafka-local|kafka-local/count|web-42/agent|a1"
    assert parse(value) == c
    assert "arrived_at" not in json.loads(value)
    body = json.loads(value)
    for change, reason in (({"source_seq": -1}, "bad_value"), ({"source": ""}, "bad_value"),
                           ({"source_delivered": "9"}, "wrong_type"),
                           ({"incarnation": None}, "wrong_type")):
        with pytest.raises(MalformedRecord) as exc:
            parse(json.dumps({**body, **change}).encode())
        assert exc.value.reason == reason, change
    del body["source_delivered"]
    assert parse(json.dumps(body).encode()).source_delivered is None


def test_the_agents_record_numbers_round_trip_and_delivered_cannot_pass_through():
    r = record(sealed_through=1233)
    assert parse(r.encode()[1]) == r
    assert "sealed_through" not in json.loads(record().encode()[1])   # only when said
    ranges = Ranges.of(tier="producer", origin="web-42", origin_incarnation="a1",
                       emitter="web-42/agent", seq=3, through=99, delivered=90, missing=[],
                       incarnation="a1")
    assert parse(ranges.encode()[1]) == ranges
    body = json.loads(ranges.encode()[1])
    with pytest.raises(MalformedRecord, match="delivered"):
        parse(json.dumps({**body, "delivered": 100}).encode())
    with pytest.raises(MalformedRecord, match="sealed_through"):
        parse(json.dumps({**json.loads(r.encode()[1]), "sealed_through": -2}).encode())


def _bad(obj) -> bytes:
    return json.dumps(obj).encode()


GOOD = json.loads(record().encode()[1])


@pytest.mark.parametrize("value, reason", [
    (b"not json {", "not_json"),
    (b"\xff\xfe\x00", "not_json"),
    (None, "not_json"),
    (b"[1, 2]", "not_object"),
    (_bad({**GOOD, "v": 2}), "version"),
    (_bad({k: v for k, v in GOOD.items() if k != "count"}), "missing_field"),
    (_bad({**GOOD, "count": "12"}), "wrong_type"),
    (_bad({**GOOD, "count": True}), "wrong_type"),
    (_bad({**GOOD, "count": 1.5}), "wrong_type"),
    (_bad({**GOOD, "count": -1}), "bad_value"),
    (_bad({**GOOD, "window_start": 1_763_766_000_001}), "bad_value"),
    (_bad({**GOOD, "window_ms": 0}), "bad_value"),
    (_bad({**GOOD, "checksum": "xyz"}), "bad_value"),
    (_bad({**GOOD, "checksum": "9F3A51C0D2E4B117"}), "bad_value"),
    (_bad({**GOOD, "tier": ""}), "bad_value"),
    (_bad({**GOOD, "dropped_reasons": {"x": "1"}}), "wrong_type"),
    (_bad({**GOOD, "dropped_reasons": [1]}), "wrong_type"),
    (_bad({**GOOD, "pad": "x" * MAX_RECORD_BYTES}), "huge"),
    (_bad({"v": 1, "kind": "progress", "tier": "t"}), "missing_field"),
])
def test_malformed_records_are_refused_with_a_reason(value, reason):
    with pytest.raises(MalformedRecord) as exc:
        parse(value)
    assert exc.value.reason == reason


def test_state_keeps_the_highest_seq_and_counts_malformed_records():
    state = AuditState()
    newer = record(seq=18, count=20)
    for value in [record(seq=17, count=10).encode()[1], newer.encode()[1], b"{",
                  record(seq=16, count=5).encode()[1], _bad({**GOOD, "count": "x"})]:
        state.add(value)
    assert state.counts[newer.identity].count == 20
    assert state.malformed == {"not_json": 1, "wrong_type": 1}
    assert state.read == 5
    # Same seq: the later emission wins; replay order does not matter.
    a, b = record(seq=30, count=1, emitted_at=1), record(seq=30, count=2, emitted_at=2)
    for order in ([a, b], [b, a]):
        s = AuditState()
        for r in order:
            s.add(r.encode()[1])
        assert s.counts[a.identity].count == 2


def test_checksum_is_xxh64_seed_42_summed_mod_2_64():
    values = [b"", b"a", b"x" * 1000, "é漢".encode()]
    assert [value_hash(v) for v in values] == [xxhash.xxh64_intdigest(v, 42) for v in values]
    total = sum(value_hash(v) for v in values)
    assert checksum_hex(total) == f"{total % 2**64:016x}"
    lo = sum(value_hash(v) & 0xFFFFFFFF for v in values)
    hi = sum(value_hash(v) >> 32 for v in values)
    assert combine_halves(lo, hi) == total % 2**64


def test_windows_are_utc_floors():
    assert window_start(1_763_766_599_999) == 1_763_766_000_000
    assert window_start(1_763_766_600_000) == 1_763_766_600_000
    assert window_start(1_763_766_600_000, 60_000) == 1_763_766_600_000
    assert window_start(-1) == -600_000          # a floor: before 1970 too, as Python's //
    times = np.array([-600_001, -1, 0, 599_999, 1_763_766_599_999], np.int64)
    assert window_start(times).tolist() == [window_start(int(t)) for t in times]


# -- record identity: distinct, duplicates, incarnations, ranges --------------------------------
def ranges(**kw) -> Ranges:
    base = dict(tier="kafka-local", origin="web-42", origin_incarnation="1-a",
                emitter="kafka-local/count", incarnation="9-z", seq=3, emitted_at=7,
                through=5999, missing=[[1000, 1999], [5000, 5000]])
    return Ranges.of(**{**base, **kw})


def test_distinct_and_duplicates_round_trip_and_are_unknown_in_old_records():
    r = record(distinct=12000, duplicates=345, incarnation="5-b")
    assert parse(r.encode()[1]) == r
    assert parse(_bad(GOOD)).distinct is None and parse(_bad(GOOD)).duplicates is None
    assert parse(_bad({**GOOD, "distinct": None, "duplicates": None})).distinct is None


def test_ranges_round_trip_with_the_design_example():
    r = ranges()
    key, value = r.encode()
    assert key == b"ranges|kafka-local|web-42|1-a"
    assert r.missing_total == 1001 and not r.missing_truncated
    assert parse(value) == r


def test_ranges_list_at_most_a_thousand_and_total_them_all():
    many = [[k * 10, k * 10 + 1] for k in range(1500)]
    r = ranges(missing=many, through=20_000)
    assert len(r.missing) == MAX_RANGES and r.missing_truncated and r.missing_total == 3000
    assert parse(r.encode()[1]) == r


RANGES = json.loads(ranges().encode()[1])


@pytest.mark.parametrize("value", [
    _bad({**GOOD, "distinct": 12346, "duplicates": -1}),              # more than count
    _bad({**GOOD, "distinct": 12000, "duplicates": 0}),               # not count - distinct
    _bad({**GOOD, "distinct": 12000}),                                # one without the other
    _bad({**GOOD, "distinct": -1, "duplicates": 12346}),
    _bad({**GOOD, "kind": "something"}),
    _bad({**RANGES, "through": -2}),
    _bad({**RANGES, "missing": [[1999, 1000]]}),                      # not first <= last
    _bad({**RANGES, "missing": [[5000, 5000], [1000, 1999]]}),        # not ascending
    _bad({**RANGES, "missing": [[1000, 1999], [1999, 2000]]}),        # overlapping
    _bad({**RANGES, "missing": [[1000, 6000]]}),                      # past through
    _bad({**RANGES, "missing": [[1, "2"]]}),
    _bad({**RANGES, "missing": [[k, k] for k in range(0, 2002, 2)]}),  # over 1,000 listed
    _bad({**RANGES, "missing_total": 5}),                             # fewer than listed
    _bad({**RANGES, "missing_total": 2000}),                          # more, not truncated
    _bad({**RANGES, "origin_incarnation": ""}),
    _bad({k: v for k, v in RANGES.items() if k != "through"}),
])
def test_malformed_identity_fields_are_refused(value):
    with pytest.raises(MalformedRecord):
        parse(value)


def test_an_emitters_incarnations_are_summed_not_hidden_by_the_older_seq():
    """An agent whose state was lost emits again from seq 1 under a new incarnation: its counts
    add to its former self's, whose seq is higher."""
    state = AuditState()
    old = record(seq=40, count=100, distinct=100, duplicates=0, incarnation="1-a",
                 checksum=5)
    new = record(seq=1, count=30, distinct=30, duplicates=0, incarnation="2-b", checksum=7)
    for r in (old, new, record(seq=39, count=90, distinct=90, duplicates=0,
                               incarnation="1-a")):
        state.add(r.encode()[1])
    [got] = state.by_tier()["producer"].values()
    assert (got.count, got.distinct, got.duplicates, got.checksum) == (130, 130, 0, 12)
    state.add(record(seq=2, count=40, incarnation="2-b").encode()[1])   # distinct unknown
    [got] = state.by_tier()["producer"].values()
    assert got.count == 140 and got.distinct is None and got.duplicates is None


def test_ranges_keep_the_newest_per_number_space():
    state = AuditState()
    state.add(ranges(seq=3, through=10, missing=[[2, 3]]).encode()[1])
    state.add(ranges(seq=5, through=20, missing=[]).encode()[1])
    state.add(ranges(seq=4, through=15, missing=[[1, 1]]).encode()[1])
    state.add(ranges(seq=1, origin_incarnation="2-b", through=3, missing=[]).encode()[1])
    spaces = {r.origin_incarnation: (r.through, r.missing) for r in state.ranges.values()}
    assert spaces == {"1-a": (20, []), "2-b": (3, [])}


def test_records_from_before_incarnations_are_superseded_by_the_same_state_not_added():
    """An agent upgraded: its state (and audit seq) survive, its records now carry an
    incarnation. The window's newer record replaces the old one."""
    state = AuditState()
    state.add(record(seq=40, count=100).encode()[1])                       # no incarnation
    state.add(record(seq=41, count=120, distinct=120, duplicates=0,
                     incarnation="1-a").encode()[1])
    [got] = state.by_tier()["producer"].values()
    assert got.count == 120


def test_a_spark_tier_takes_its_newest_incarnation_only():
    """A new checkpoint counts again from Kafka: adding it to the old one would double."""
    state = AuditState()
    for inc, at in (("1-a", 100), ("2-b", 200)):
        state.add(record(tier="kafka-local", emitter="kafka-local/count", seq=3, count=50,
                         incarnation=inc, emitted_at=at).encode()[1])
    [got] = state.by_tier()["kafka-local"].values()
    assert got.count == 50 and got.incarnation == "2-b"


@pytest.mark.parametrize("reverse", [False, True])
def test_ties_are_broken_by_name_whatever_the_order_of_arrival(reverse):
    """Two emitters of one tier and origin whose newest records are as new, and two
    incarnations of a Spark tier's emitter as new: the first by name counts, in whichever order
    the records came (the reconciler reads a window's rows in key order, ``docket-audit show``
    in the topic's)."""
    from audit.contract.collect import current_counts

    emitters = [record(tier="kafka-local", emitter=e, seq=3, count=n, emitted_at=100)
                for e, n in (("kafka-local/a", 10), ("kafka-local/b", 20))]
    incarnations = [record(tier="warehouse", emitter="warehouse/land", seq=3, count=n,
                           incarnation=i, emitted_at=100) for i, n in (("1-a", 30), ("2-b", 40))]
    records = emitters + incarnations
    got = current_counts(records[::-1] if reverse else records)
    assert [r.count for r in got["kafka-local"].values()] == [10]
    assert [r.count for r in got["warehouse"].values()] == [30]
