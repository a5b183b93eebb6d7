"""journalctl's export format: cut into entries by ``agent/tail/journal_export.py`` and by the
native extension (``docket_native.JournalExport``), and made records by the journald source —
the native records must be the Python code's, byte for byte, on random entries read in random
pieces."""

from __future__ import annotations

import json
import random
import threading

import pytest

from agent.buffer.framing import MAX_KEY_BYTES
from agent.buffer.seams import Clock
from agent.config import SourceConfig
from agent.tail import journal_export
from agent.tail.journald import JournaldSource, message_fields
from agent.telemetry import Metrics
from tests.agentkit import native_built
from tests.journalkit import export

NAMES = ["MESSAGE", "PRIORITY", "_HOSTNAME", "ROLE", "CODE_FILE", "X_Y"]
VALUES = [b"plain", b"", b"caf\xc3\xa9 \xe2\x82\xac", b"tab\there", b"two\nlines", b"nul\x00",
          b"q\"uo\\te", b"\x7f\x1f\x08\x0c\r", b"caf\xe9", b"\xff\xfe", b"[1,2]", b"x=y"]


class Stopped(Clock):
    def time_ms(self) -> int:
        return 1_800_000_000_000


def source(fmt: str, key_field: str | None = None, native: bool = False) -> JournaldSource:
    """A journald source with no reader (its record making only)."""
    src = object.__new__(JournaldSource)
    src.cfg = SourceConfig(index=0, type="journald", topic="j", format=fmt, key_field=key_field)
    src.metrics, src.clock, src.label = Metrics(), Stopped(), "j"
    src._stop = threading.Event()
    src._topic = src._key = None
    src._routed, src._keyed = False, key_field is not None
    src._native = src._native_maker() if native else None
    shown = message_fields(src.cfg)
    src._shown = None if shown is None else frozenset(shown)
    return src


def random_entry(rng: random.Random, i: int) -> list[tuple[str, bytes]]:
    fields = []
    if rng.random() > 0.02:
        fields.append(("__CURSOR", b"s=abc;i=%x;b=0;m=1;t=2;x=3" % i))
    stamp = rng.choice([b"1790000000%06d" % i] * 20 + [b"", b"12a", b"+5", b"0012",
                                                       b"1234567890123456789"])
    if rng.random() > 0.02:
        fields.append(("__REALTIME_TIMESTAMP", stamp))
    if rng.random() > 0.05:
        fields.append(("MESSAGE", rng.choice(VALUES[:8])))
    for _ in range(rng.randint(0, 8)):
        value = rng.choice(VALUES) if rng.random() < 0.97 else bytes(
            rng.randrange(256) for _ in range(rng.randint(0, 12)))
        fields.append((rng.choice(NAMES), value))
    return fields


def stream(entries: list[list[tuple[str, bytes]]]) -> bytes:
    """The export form of ``entries`` (a name may come twice, as journalctl prints it)."""
    out = bytearray()
    for e in entries:
        for name, value in e:
            out += export([{name: value}])[:-1]        # one field, without its blank line
        out += b"\n"
    return bytes(out)


def read(src: JournaldSource, data: bytes, rng: random.Random) -> list:
    """Every (cursor, record) of ``data``, read in random pieces as a pipe hands them over."""
    items, held, at = [], b"", 0
    while at < len(data):
        step = rng.choice([1, 7, 64, 1000, 1 << 20])
        buf = held + data[at:at + step]
        at += step
        got, lacking, begin = src._cut(buf)
        src._finish(got, lacking, {})         # as if none of them were read again
        items += got
        held = buf[begin:]
    assert held == b""
    return items


@pytest.mark.skipif(not native_built(), reason="the native extension is not built (make native)")
@pytest.mark.parametrize("fmt,key_field", [("json", None), ("message", None), ("json", "ROLE"),
                                           ("message", "_HOSTNAME")])
def test_native_records_are_the_python_codes_byte_for_byte(fmt, key_field):
    rng = random.Random(f"{fmt}{key_field}")
    entries = [random_entry(rng, i) for i in range(3_000)]
    data = stream(entries)
    python, native = source(fmt, key_field), source(fmt, key_field, native=True)
    assert native._native is not None
    mine, theirs = read(python, data, random.Random(1)), read(native, data, random.Random(2))
    assert theirs == mine
    assert len(mine) == sum(1 for e in entries if any(k == "__CURSOR" for k, _ in e))
    assert native.metrics.snapshot() == python.metrics.snapshot()
    taken = sum(1 for _b, _e, item in native._native.cut(data, 0)[1] if item is not None)
    assert len(entries) // 10 < taken < len(mine)        # both makers had their share


def test_an_entry_is_its_fields_in_order_a_name_given_twice_a_list():
    data = stream([[("__CURSOR", b"c1"), ("__REALTIME_TIMESTAMP", b"1790000000001000"),
                    ("MESSAGE", b"one\ntwo"), ("TAG", b"a"), ("TAG", b"b"), ("BIN", b"\xff")]])
    (b, e, fields), = journal_export.cut(data)[0]
    assert (b, e) == (0, len(data))
    entry = journal_export.fields_of(fields)
    assert entry == {"__CURSOR": b"c1", "__REALTIME_TIMESTAMP": b"1790000000001000",
                     "MESSAGE": b"one\ntwo", "TAG": [b"a", b"b"], "BIN": b"\xff"}
    src = source("json")
    (cursor, (topic, value, key, ts)), = src._cut(data)[0]
    assert (cursor, topic, key, ts) == ("c1", "j", None, 1_790_000_000_001)
    assert json.loads(value) == {"__CURSOR": "c1", "__REALTIME_TIMESTAMP": "1790000000001000",
                                 "MESSAGE": "one\ntwo", "TAG": ["a", "b"], "BIN": "\ufffd"}
    assert src.metrics.get("agent_source_bad_input_total", kind="invalid_utf8", topic="j") == 1


@pytest.mark.parametrize("native", [False, True])
def test_a_stream_out_of_step_is_refused_not_waited_on(native):
    if native and not native_built():
        pytest.skip("the native extension is not built (make native)")
    src = source("json", native=native)
    huge = b"__CURSOR=c\nMESSAGE\n" + (1 << 40).to_bytes(8, "little") + b"x"
    unended = b"__CURSOR=c\nMESSAGE\n" + (3).to_bytes(8, "little") + b"abcX\n\n"
    for data in (huge, unended):
        with pytest.raises(ValueError, match="not the export format"):
            src._cut(data)
    whole = stream([[("__CURSOR", b"c"), ("__REALTIME_TIMESTAMP", b"1000"), ("MESSAGE", b"m")]])
    assert src._cut(whole[:-1]) == ([], [], 0)               # not yet whole: kept, not refused
    assert len(src._cut(whole)[0]) == 1


def test_keys_are_cut_to_the_longest_a_record_may_carry():
    data = stream([[("__CURSOR", b"c"), ("__REALTIME_TIMESTAMP", b"1000"), ("MESSAGE", b"m"),
                    ("ROLE", b"r" * (MAX_KEY_BYTES + 50))]])
    for native in [False, True][:1 + native_built()]:
        (_c, (_t, _v, key, _ts)), = source("message", "ROLE", native)._cut(data)[0]
        assert key == b"r" * MAX_KEY_BYTES


def test_entries_without_a_message_are_made_from_what_was_read_again_and_counted_once():
    """``_finish``: an entry read again with its message ships it (the other fields' oddities
    counted once, not once per reading); one read again without, or not read again, ships as
    its fields, counted ``journal_no_message``; a stopped source counts nothing."""
    def fields(c: bytes, message: bool) -> list[tuple[str, bytes]]:
        return [("__CURSOR", c), ("__REALTIME_TIMESTAMP", b"1790000000001000"),
                *([("MESSAGE", b"m " + c)] if message else []), ("_HOSTNAME", b"caf\xe9")]

    data = stream([fields(c, False) for c in (b"c1", b"c2", b"c3")])
    again = {c: journal_export.fields_of(journal_export.cut(stream([fields(c.encode(), m)]))[0]
                                         [0][2]) for c, m in (("c1", True), ("c2", False))}
    for native in [False, True][:1 + native_built()]:
        src = source("message", native=native)
        got, lacking, _ = src._cut(data)
        assert [c for c, record in got] == ["c1", "c2", "c3"] and len(lacking) == 3
        assert all(record is None for _c, record in got)
        src._finish(got, lacking, again)
        assert got[0][1][1] == b"m c1"
        assert [json.loads(r[1])["_HOSTNAME"] for _c, r in got[1:]] == ["caf\ufffd"] * 2
        bad = {k: src.metrics.get("agent_source_bad_input_total", kind=k, topic="j")
               for k in ("journal_no_message", "invalid_utf8")}
        assert bad == {"journal_no_message": 2, "invalid_utf8": 2}, bad   # c1 made once
        assert [src.metrics.get("agent_source_journal_read_again_total", outcome=o, topic="j")
                for o in ("whole", "none", "unread")] == [1, 1, 1]
        stopped = source("message", native=native)
        stopped._stop.set()
        got, lacking, _ = stopped._cut(data)
        stopped._finish(got, lacking, {})
        assert all(record is not None for _c, record in got)
        assert stopped.metrics.get("agent_source_bad_input_total", kind="journal_no_message",
                                   topic="j") == 0
