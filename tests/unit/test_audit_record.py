"""The audit record: encoding, validation of everything a topic can hold, checksum arithmetic."""

from __future__ import annotations

import json

import pytest
import xxhash

from audit.collect import AuditState
from audit.errors import MalformedRecord
from audit.record import (
    MAX_RECORD_BYTES,
    AuditRecord,
    Progress,
    checksum_hex,
    combine_halves,
    parse,
    value_hash,
    window_start,
)


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
