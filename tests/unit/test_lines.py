"""The line cutter every source shares: records, the cap, and the oddities counted by kind."""

from __future__ import annotations

import numpy as np
import pytest

from agent.config import SourceConfig
from agent.tail.lines import LineCutter
from agent.telemetry import Metrics
from tests.unit.tailkit import Harness

ODD = (b'{"ts": 1700000000000, "k": "a"}\n'     # fine
       b"\n"                                   # empty
       b"crlf\r\n"                             # CRLF
       b"\r\n"                                 # CRLF and empty
       b"nul\x00in\x00it\n"                    # two NULs, one line
       b"\x00\n"                               # a NUL alone
       b"latin-1 caf\xe9\n"                    # not UTF-8
       b"tab\tand caf\xc3\xa9\n"               # UTF-8, a tab (a low byte that is not a newline)
       b"\xff\xfe\n")                          # not UTF-8

KINDS = ("empty_line", "crlf_line", "binary_nul", "invalid_utf8")


def cutter(**fields) -> LineCutter:
    return LineCutter(SourceConfig(index=0, type="file", topic="t", **fields), Metrics())


def counts(c: LineCutter) -> dict[str, float]:
    return {k: c.metrics.get("agent_source_bad_input_total", kind=k, topic="t") for k in KINDS}


@pytest.mark.parametrize("fields", [{}, {"timestamp_field": "ts"}, {"key_field": "k"}])
def test_oddities_are_counted_per_line_with_or_without_fields(fields):
    c = cutter(**fields)
    chunk = c.frame(ODD, len(ODD), 5)
    values = [chunk.value(i) for i in range(len(chunk))]
    assert values == [v.rstrip(b"\r") for v in ODD.split(b"\n")[:-1]]
    assert counts(c) == {"empty_line": 2, "crlf_line": 2, "binary_nul": 2, "invalid_utf8": 2}
    if fields.get("timestamp_field"):
        assert chunk.timestamps[0] == 1_700_000_000_000 and (chunk.timestamps[1:] == 5).all()
        assert c.metrics.get("agent_source_bad_input_total", kind="timestamp_unparsable",
                             topic="t") == len(chunk) - 1
    if fields.get("key_field"):
        assert chunk.keys[0] == b"a" and chunk.keys[1:] == [None] * (len(chunk) - 1)


@pytest.mark.parametrize(("end", "nul_lines"), [(len(ODD), 2), (ODD.index(b"\x00\n") + 2, 2),
                                                 (ODD.index(b"nul"), 0)])
def test_newlines_found_by_the_caller_frame_and_count_as_the_framings_own(end, nul_lines):
    """The multiline path hands over the newlines it found: the same records, the same
    oddities counted (its NUL bytes found without the walk that finds the newlines), with a
    read that ends before, just after and long after the NUL bytes."""
    own, given = cutter(), cutter()
    newlines = np.flatnonzero(np.frombuffer(ODD, np.uint8, end) == 10)
    a, b = own.frame(ODD, end, 5), given.frame(ODD, end, 5, newlines=newlines)
    assert [a.value(i) for i in range(len(a))] == [b.value(i) for i in range(len(b))]
    assert counts(given) == counts(own)
    assert counts(own)["binary_nul"] == nul_lines


def test_a_json_line_after_a_byte_order_mark_keeps_its_time_and_key():
    c = cutter(timestamp_field="ts", key_field="k")
    data = b'\xef\xbb\xbf{"ts": 1700000000000, "k": "a"}\n{"ts": 1700000000001}\n'
    chunk = c.frame(data, len(data), 5)
    assert chunk.timestamps.tolist() == [1_700_000_000_000, 1_700_000_000_001]
    assert chunk.keys == [b"a", None]
    assert c.metrics.get("agent_source_bad_input_total", kind="timestamp_unparsable",
                         topic="t") == 0


def test_a_line_nested_deeper_than_json_parses_has_no_time_or_key_and_stops_nothing():
    """``json.loads`` raises RecursionError, not ValueError, for a line of 2,500 brackets: it
    stopped the agent (and again at every start, reading the same line)."""
    c = cutter(timestamp_field="ts", key_field="k")
    data = b"[" * 2_500 + b'\n{"ts": 1700000000000, "k": "a"}\n'
    chunk = c.frame(data, len(data), 5)
    assert chunk.timestamps.tolist() == [5, 1_700_000_000_000] and chunk.keys == [None, b"a"]
    assert c.metrics.get("agent_source_bad_input_total", kind="timestamp_unparsable",
                         topic="t") == 1


def test_frame_reads_only_to_its_end():
    c = cutter()
    data = b"one\ntwo\n\xff\x00partial"
    chunk = c.frame(data, 8, 1)
    assert [chunk.value(i) for i in range(len(chunk))] == [b"one", b"two"] and chunk.end == 8
    assert counts(c) == dict.fromkeys(KINDS, 0)


def test_clean_ascii_and_utf8_count_nothing():
    c = cutter()
    data = "plain\nnaïve 日本\n\ttabbed\n".encode()
    assert len(c.frame(data, len(data), 1)) == 3
    assert counts(c) == dict.fromkeys(KINDS, 0)


def test_a_stream_is_cut_at_whole_lines_and_at_the_cap():
    c = cutter()
    c.max_line_bytes = 8
    assert c.split_stream(b"ab\ncd") == (b"ab\n", b"cd")
    assert c.split_stream(b"abcdefg") == (None, b"abcdefg")
    assert c.split_stream(b"abcdefghij") == (b"abcdefgh\n", b"ij")
    assert c.metrics.get("agent_source_bad_input_total", kind="line_forced", topic="t") == 1


def test_the_file_reader_cuts_a_runaway_line_at_the_same_cap(tmp_path):
    h = Harness(tmp_path, read_chunk_bytes=4)
    h.src.reader.lines.max_line_bytes = 8
    h.app.write_bytes(b"abcdefghijkl\nnext\n")
    h.step()
    h.drain_all()
    assert h.delivered == [b"abcdefgh", b"ijkl", b"next"]
    assert h.metrics.get("agent_source_bad_input_total", kind="line_forced", topic="t") == 1
