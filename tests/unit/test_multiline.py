"""Multiline events: the rule's parsing and checks, the per-line matching, and the file source
joining lines into events (real files, pool and state database, a fake clock): one record per
event, the open event held in the file until it ends or its flush is due, checkpoints only at
event boundaries (a restart or a crash mid-event reads the event again whole), a cut at
``max_event_bytes`` marked, and an event never spanning two generations of a file."""

from __future__ import annotations

import os
import random
import re

import numpy as np
import pytest

from agent.buffer.framing import CONTINUED
from agent.config import ConfigError, parse
from agent.patterns import PRESETS, MultilineRule, PatternError
from agent.tail.multiline import EventCutter, line_bounds, rust_pattern
from tests.agentkit import native_built
from tests.unit.tailkit import Harness

JAVA = {"preset": "java", "flush_ms": 500}


def trace(i: int, frames: int) -> bytes:
    """An event as Logback writes it: the message line, the exception, its frames, a cause."""
    out = [b"2026-12-02 11:00:00.000 [main] ERROR app.Main - event %d failed" % i,
           b"java.lang.IllegalStateException: boom %d" % i]
    out += [b"\tat app.Worker.step%d(Worker.java:%d)" % (k, k + 10) for k in range(frames)]
    if frames:
        out += [b"Caused by: java.io.IOException: disk %d" % i, b"\t... %d more" % frames]
    return b"\n".join(out) + b"\n"


def events(h: Harness) -> list[bytes]:
    return h.values()


def test_the_rule_names_one_of_preset_start_continue():
    assert MultilineRule.from_table({"preset": "python"}).pattern == PRESETS["python"]
    assert MultilineRule.from_table({"start": "^\\d"}).begins
    assert not MultilineRule.from_table({"continue": "^\\s"}).begins
    with pytest.raises(PatternError, match="exactly one"):
        MultilineRule.from_table({"start": "^a", "continue": "^b"})
    with pytest.raises(PatternError) as e:
        MultilineRule.from_table({"preset": "cobol"})
    assert e.value.key == "preset"
    with pytest.raises(PatternError) as e:
        MultilineRule.from_table({"start": "^a", "max_event_bytes": 10})
    assert e.value.key == "max_event_bytes"


@pytest.mark.parametrize("pattern", [r"(a)\1", r"(?=x)y", "(unclosed"])
def test_a_pattern_re2_refuses_is_a_config_error_with_its_key_path(tmp_path, pattern):
    raw = {"broker": {"bootstrap_servers": "127.0.0.1:9092"},
           "sources": [{"type": "file", "topic": "t", "paths": [str(tmp_path / "*.log")],
                        "multiline": {"start": pattern}}]}
    with pytest.raises(ConfigError) as e:
        parse(raw)
    assert e.value.path == "sources[0].multiline.start"
    assert "RE2" in str(e.value)


def test_multiline_on_a_socket_source_is_refused(tmp_path):
    raw = {"broker": {"bootstrap_servers": "127.0.0.1:9092"},
           "sources": [{"type": "socket", "topic": "t", "path": str(tmp_path / "s.sock"),
                        "multiline": {"preset": "java"}}]}
    with pytest.raises(ConfigError) as e:
        parse(raw)
    assert e.value.path == "sources[0].multiline"


def test_a_pattern_that_backtracks_for_ever_in_python_runs_in_linear_time():
    """``(a+)+$`` on a line of a's ending in b takes Python's re exponential time; RE2
    answers at once (a hang here would stop the suite at its timeout)."""
    cutter = EventCutter(MultilineRule.from_table({"start": "(a+)+$"}))
    data = b"a" * 5000 + b"b\n" + b"aaa\n"
    starts, ends = line_bounds(data, len(data))
    assert cutter.matching(data, starts, ends).tolist() == [False, True]


@pytest.mark.parametrize("pattern", [r"^\s+at ", r"\s*$", r"^\s", r"x\s+y", r"^$", r"b$",
                                     r"\bat\b", r"^(?:\s|Caused by:)", PRESETS["java"],
                                     PRESETS["python"], PRESETS["go"], PRESETS["ruby"]])
def test_matching_a_whole_read_equals_matching_each_line_alone(pattern):
    """RE2's search over a whole read (one call per matching line) decides as a match of each
    line alone would, also for patterns whose match can run across a newline."""
    rnd = random.Random(7)
    pieces = ["", " ", "\t", "  at x", "at", "x y", "x", "y", "b", "Caused by: e",
              "\tat a.b(C.java:1)", "java.lang.Error: e", "Traceback (most recent call last):",
              "ValueError: v", "goroutine 1 [running]:", "main.main()", "\tfrom /a.rb:1:in `m'",
              "x  \t"]
    cutter = EventCutter(MultilineRule.from_table({"start": pattern}), native=False)
    alone = re.compile(pattern)
    for _ in range(200):
        text = [rnd.choice(pieces) + rnd.choice(pieces) for _ in range(rnd.randint(1, 12))]
        data = ("\n".join(text) + "\n").encode()
        starts, ends = line_bounds(data, len(data))
        want = [alone.search(line) is not None for line in text]
        assert cutter.matching(data, starts, ends).tolist() == want, text


def test_stack_traces_become_one_record_each_and_the_last_waits_for_its_flush(tmp_path):
    h = Harness(tmp_path, multiline=JAVA)
    written = [trace(i, i % 7) for i in range(50)]
    h.app.write_bytes(b"".join(written))
    h.step()
    assert events(h) == [e[:-1] for e in written[:49]]     # the last may go on
    h.step(1, advance_s=0.3)
    assert len(events(h)) == 49
    assert h.src.due() is not None
    h.step(1, advance_s=0.3)                               # 0.6 s unchanged > flush_ms
    assert events(h) == [e[:-1] for e in written]
    assert h.src.due() is None


def test_an_event_written_in_pieces_is_one_record(tmp_path):
    h = Harness(tmp_path, multiline=JAVA)
    event = trace(1, 40)
    lines = event.splitlines(keepends=True)
    with open(h.app, "ab") as f:
        for line in lines:
            f.write(line[:7])
            f.flush()
            h.step(1, advance_s=0.1)
            f.write(line[7:])
            f.flush()
            h.step(1, advance_s=0.1)
        f.write(trace(2, 0))
    h.step(1, advance_s=0.1)
    assert events(h) == [event[:-1]]
    h.step(2, advance_s=0.4)
    assert events(h) == [event[:-1], trace(2, 0)[:-1]]


def test_a_file_growing_between_looks_is_not_flushed_mid_event(tmp_path):
    """The flush waits for the file to keep one size for flush_ms: a trace written slowly
    (a line every 0.3 s with flush_ms 500) stays one event."""
    h = Harness(tmp_path, multiline=JAVA)
    event = trace(3, 12)
    with open(h.app, "ab") as f:
        for line in event.splitlines(keepends=True):
            f.write(line)
            f.flush()
            h.step(1, advance_s=0.3)
    assert events(h) == []
    h.step(3, advance_s=0.3)
    assert events(h) == [event[:-1]]


@pytest.mark.parametrize("grows", [False, True])
def test_a_file_read_from_behind_counts_its_flush_from_the_first_look_at_its_size(tmp_path,
                                                                                 grows):
    """A file longer than a turn's read: its last event's flush_ms counts from the first look
    that found the file its size, not from the read that reached the event — a file that
    stopped growing that long ago sends its last event with that read. A file that grew
    meanwhile counts from the look that saw it grow."""
    h = Harness(tmp_path, multiline=JAVA, read_chunk_bytes=16384)
    written = [trace(i, 20) for i in range(200)]
    h.app.write_bytes(b"".join(written))
    budget = h.app.stat().st_size // 4 + 1            # four turns to its end

    def turn(advance_s: float) -> int:
        h.clock.advance(advance_s)
        h.src.scan()
        return h.src.read_some(budget).bytes

    assert turn(0) > 0                                 # the first look at its size
    assert 0 < len(events(h)) < 150
    turn(0.2)
    if grows:
        more = trace(200, 3)
        written.append(more)
        with open(h.app, "ab") as f:
            f.write(more)
    turn(0.2)                                          # 0.4 s after the first look
    turn(0.2)
    turn(0.0)                                          # the end is reached
    if not grows:
        assert events(h) == [e[:-1] for e in written]  # 0.6 s unchanged > flush_ms: at once
        return
    assert events(h) == [e[:-1] for e in written[:-1]]  # 0.2 s since it grew
    assert h.src.due() is not None
    turn(0.2)
    assert len(events(h)) == len(written) - 1           # 0.4 s
    turn(0.2)
    assert events(h) == [e[:-1] for e in written]


@pytest.mark.parametrize("empty", [False, True])
def test_a_truncation_leaves_the_old_generations_open_event_behind(tmp_path, empty):
    """A file cut back (copytruncate) while an event was open at its end: the new
    generation's open event waits flush_ms from its own first look, even at the old one's
    size (the old wait flushed it early), and a file left empty asks for no wake-up (the old
    one's flush time stayed due: a turn every 2 ms for good)."""
    h = Harness(tmp_path, multiline=JAVA)
    old = trace(1, 8)
    h.app.write_bytes(old)
    h.step(1)                                       # open at the end: the wait begins
    assert events(h) == [] and h.src.due() is not None
    h.clock.advance(0.3)
    new = b"" if empty else trace(2, 8)              # another event, the old one's size
    assert empty or (len(new) == len(old) and new != old)
    with open(h.app, "r+b") as f:
        f.truncate(0)
        f.write(new)
    h.step(1)                                       # the cut found; the new size looked at
    h.step(1, advance_s=0.25)                       # 0.55 s after the old wait began
    if empty:
        assert events(h) == [] and h.src.due() is None
        return
    assert events(h) == []                          # 0.25 s after its own first look
    h.step(1, advance_s=0.3)
    assert events(h) == [new[:-1]]


@pytest.mark.parametrize("crash", [False, True])
def test_a_restart_mid_event_reads_the_event_again_whole(tmp_path, crash):
    h = Harness(tmp_path, multiline=JAVA)
    first, second = trace(1, 5), trace(2, 30)
    head = second[:len(second) // 2]
    head = head[:head.rfind(b"\n") + 1]
    h.app.write_bytes(first + head)
    h.step()
    h.drain_all()                                          # the first is acknowledged
    h.restart(crash=crash)
    with open(h.app, "ab") as f:
        f.write(second[len(head):] + trace(3, 0))
    h.step()
    assert events(h) == [first[:-1], second[:-1]]
    assert h.journal_entries() == []


def test_an_event_over_max_event_bytes_is_cut_at_a_line_end_and_its_rest_marked(tmp_path):
    h = Harness(tmp_path, multiline={"preset": "java", "max_event_bytes": 2048})
    big = trace(1, 200)                                    # about 7 KiB
    h.app.write_bytes(big + trace(2, 1))
    h.step()
    h.step(1, advance_s=1.1)                               # the last one's flush
    h.checkpoint()
    blocks = [(b.continued, bytes(b.value(i))) for s in h.pool.sealed() for b in s.blocks()
              for i in range(len(b))]
    parts = [v for _, v in blocks[:-1]]
    assert b"\n".join(parts) + b"\n" == big                 # nothing lost at the cuts
    assert all(len(p) <= 2048 for p in parts) and len(parts) >= 4
    assert [c for c, _ in blocks[:-1]] == [False] + [True] * (len(parts) - 1)
    assert blocks[-1] == (False, trace(2, 1)[:-1])
    assert h.metrics.get("agent_source_bad_input_total", kind="multiline_event_cut",
                         topic="t") == len(parts) - 1


def test_the_continued_flag_is_framed_in_its_block(tmp_path):
    h = Harness(tmp_path, multiline={"preset": "java", "max_event_bytes": 1024})
    h.app.write_bytes(trace(1, 60) + trace(2, 0))
    h.step()
    h.checkpoint()
    flags = []
    for s in h.pool.sealed():
        for b in s.blocks():
            flags.append(b.continued)
    assert any(flags) and not flags[0]
    assert CONTINUED == 2


def test_rotation_closes_the_open_event_at_the_old_generations_end(tmp_path):
    h = Harness(tmp_path, pattern="app.log", multiline=JAVA)
    h.app.write_bytes(trace(1, 3) + trace(2, 4))
    h.step()
    os.rename(h.app, h.logs / "app.log.1")
    h.app.write_bytes(b"\tat a.continuation.that.belongs.to.nobody(X.java:1)\n" + trace(3, 0))
    h.step(2, advance_s=0.3)
    h.step(2, advance_s=0.3)
    # The new file's first line would continue event 2, were the two one file; its events may
    # go before event 2, whose end the old generation's flush decides.
    assert sorted(events(h)) == sorted([
        trace(1, 3)[:-1], trace(2, 4)[:-1],
        b"\tat a.continuation.that.belongs.to.nobody(X.java:1)", trace(3, 0)[:-1]])


def test_start_rule_joins_lines_until_the_next_start(tmp_path):
    h = Harness(tmp_path, multiline={"start": r"^\d{4}-\d{2}-\d{2} ", "flush_ms": 100})
    text = (b"2026-12-02 a\nmore a\n\n2026-12-02 b\n2026-12-02 c\r\ncont c\r\n")
    h.app.write_bytes(text)
    h.step(2, advance_s=0.2)
    assert events(h) == [b"2026-12-02 a\nmore a\n", b"2026-12-02 b", b"2026-12-02 c\r\ncont c"]


def test_many_events_per_read_cost_one_search_per_matching_line():
    """RE2's search (without the native extension, or a pattern it leaves to RE2): a read of
    10,000 one-line events and a 'continue' rule: no line matches, one search; with a 'start'
    rule every line matches: one search per line, and none more."""
    data = b"".join(b"2026-12-02 INFO line %d\n" % i for i in range(10_000))
    starts, ends = line_bounds(data, len(data))
    for rule, calls_wanted in (({"preset": "java"}, 1), ({"start": r"^\d{4}-"}, 10_001)):
        cutter = EventCutter(MultilineRule.from_table(rule), native=False)
        calls = []
        real = cutter._match

        def counting(*a, real=real, calls=calls):
            calls.append(a[1:])
            return real(*a)

        cutter._match = counting
        assert np.all(cutter.begins(data, starts, ends))
        assert len(calls) == calls_wanted


# Patterns the native matcher takes on: the presets, the benchmark's start rule, and what
# differs between the engines where nothing is spelled out (Perl classes, word boundaries,
# case folding, the dot over characters beyond ASCII and bytes that are not UTF-8).
SAME_BOTH_WAYS = [r"^\d{4}-\d{2}-\d{2} ", r"^\s+at ", r"\s*$", r"^\s", r"x\s+y", r"^$", r"b$",
                  r"\bat\b", r"\Bt", r"(?i)^caused BY:", r"^[^\t ]", r"é+", r"^.{3}$", r"^.+$",
                  r"[\w$]+\.", r"\S\s\S", r"^\W", r"[[:digit:]]{2}", r"\x{e9}",
                  r"(?i:at) x", r"\<a", r"a\>", r"x{2}", r"^.$", r"(?s)^.$", r"^[^a]$",
                  r"^[[:^alpha:]]$", r"^\S+$", r"^\D$", r"^\W$", r"[]a-]", r"(?i)[a-z]+",
                  *PRESETS.values()]


@pytest.mark.skipif(not native_built(), reason="the native extension is not built (make native)")
@pytest.mark.parametrize("pattern", SAME_BOTH_WAYS)
def test_the_native_matcher_decides_each_line_as_re2_does(pattern):
    """The regex crate's matching of each line (``docket_native.LineMatcher``, the pattern as
    ``rust_pattern`` spells it) against RE2's, on random lines of ASCII, UTF-8 beyond it, bytes
    that are not UTF-8, vertical tabs and carriage returns."""
    rule = MultilineRule.from_table({"start": pattern})
    native, re2_only = EventCutter(rule), EventCutter(rule, native=False)
    assert native.native is not None and re2_only.native is None
    pieces = [b"", b" ", b"\t", b"\x0b", b"\r", b"\x0c", b"at", b"x y", b"2026-12-02 ", b"b",
              b"caf\xc3\xa9", b"\xff", b"\xc3", b"\xe2\x80\xa8", b"\xc2\xa0", b"STRASSE",
              b"stra\xc3\x9fe", b"Caused By:", b"java.lang.Error: e", b"\tat a.b(C.java:1)",
              b"\xd9\xa3\xd9\xa4", b"_$", b".", b"abc", b"\xe2\x84\xaa", b"Traceback",
              b"\t... 3 more", b"{", b"<a>", b"^", b"-", b"]", b"a{2, 3}", b"aa",
              b"\xea\x9f\x8b", b"\xc9\xa4", b"\xed\xa0\x80", b"\xe0\x80\x80",
              b"\xf4\x90\x80\x80", b"main.f(\xed\xa0\xbd\xed\xb8\x80)", b"/a.rb:3:in `x'"]
    rnd = random.Random(pattern)
    for _ in range(300):
        lines = [b"".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 4)))
                 for _ in range(rnd.randint(1, 12))]
        data = b"\n".join(lines) + b"\n"
        starts, ends = line_bounds(data, len(data))
        assert native.matching(data, starts, ends).tolist() == \
            re2_only.matching(data, starts, ends).tolist(), lines


# Pieces of patterns and of lines where the two engines' readings part unless spelled out.
ATOMS = [r"a", r"b", r"\d", r"\w", r"\s", r"\D", r"\W", r"\S", r".", r"\b", r"\B", r"^", r"$",
         r"[a-c]", r"[^a]", r"[\w-]", r"[]a]", r"[^]]", r"[[:alpha:]]", r"[[:^digit:]]", r"\.",
         r"\x41", r"\x{e9}", r"é", r"\t", r"\v", r"\f", r"\r", r" ", r"-", r"<", r"\<", r"\>",
         r"{", r"}", r"\{", r",", r"[\s\d]", r"[a\-z]", r"[\]x]", r"[\^a]", r"(?i)", r"(?s)",
         r"(?U)", r"K", r"k", r"\x{212a}", r"ſ", r"(?i:k)", r"#", r"\a", r"[[:word:]]"]
QUANTIFIERS = ["", "", "", "*", "+", "?", "{2}", "{1,}", "{0,2}", "*?", "+?"]
LINE_PIECES = [b"", b" ", b"\t", b"\x0b", b"\r", b"\x0c", b"a", b"b", b"ab", b"A", b"1", b"_",
               b"-", b"]", b"^", b"{", b"}", b"<", b">", b",", b".", b"#", b"caf\xc3\xa9",
               b"\xe2\x84\xaa", b"k", b"K", b"\xc5\xbf", b"s", b"\xd9\xa3", b"\xc2\xa0",
               b"\xe2\x80\xa8", b"\x00", b"\x07", b"\xff", b"\xed\xa0\x80"]


@pytest.mark.skipif(not native_built(), reason="the native extension is not built (make native)")
def test_random_patterns_are_decided_alike_by_both_engines_or_left_to_re2():
    """Random patterns of the pieces where the engines part (``\\<``, ``{``, ``[]``, case
    folding, Perl classes, the dot), each on random lines: wherever ``rust_pattern`` hands one
    to the native matcher, it decides every line as RE2 does (77 of 2,354 did not before the
    review's fixes)."""
    rnd = random.Random(20261206)
    native_count = 0
    for _ in range(600):
        pattern = "".join(
            (f"({rnd.choice(ATOMS)}|{rnd.choice(ATOMS)})" if rnd.random() < 0.2 else
             rnd.choice(ATOMS)) + rnd.choice(QUANTIFIERS) for _ in range(rnd.randint(1, 5)))
        try:
            rule = MultilineRule.from_table({"start": pattern})
        except PatternError:
            continue
        native, re2_only = EventCutter(rule), EventCutter(rule, native=False)
        if native.native is None:
            continue
        native_count += 1
        for _ in range(10):
            lines = [b"".join(rnd.choice(LINE_PIECES) for _ in range(rnd.randint(0, 5)))
                     for _ in range(8)]
            data = b"\n".join(lines) + b"\n"
            starts, ends = line_bounds(data, len(data))
            assert native.matching(data, starts, ends).tolist() == \
                re2_only.matching(data, starts, ends).tolist(), (pattern, lines)
    assert native_count > 300


@pytest.mark.parametrize("pattern", [r"\pL", r"\p{Greek}", r"[\D]", r"\Aa", r"a\z", r"\C",
                                     r"\Qa.b\E", r"[a&&b]", r"[a--b]", r"[[a]]", r"(?-m)^a",
                                     r"(?x) a", r"x{,3}", r"[\w-z]", r"\101", "a\\",
                                     r"[]-a]", r"[^]-a]", r"a{2, 3}", r"a{ 2}", r"a{x}",
                                     r"(?i)\x{264}", r"(?i)é", r"(?i:é)", r"(?i)straße"])
def test_what_the_engines_might_read_apart_is_left_to_re2(pattern):
    assert rust_pattern(pattern) is None


@pytest.mark.skipif(not native_built(), reason="the native extension is not built (make native)")
def test_a_read_not_utf8_throughout_is_left_to_re2():
    """RE2 takes a surrogate's bytes for a character, the regex crate does not: the native
    matcher declines such a read, writing nothing, and RE2 decides it."""
    from docket_native import LineMatcher

    for data, native in ((b"ok\n\xed\xa0\x80\n", False), (b"ok\ncaf\xc3\xa9\n", True)):
        starts, ends = line_bounds(data, len(data))
        out = np.full(len(starts), 7, np.uint8)
        assert LineMatcher(r"^.+$").matching(data, starts, ends, out) is native
        assert out.tolist() == ([1, 1] if native else [7, 7])
    with pytest.raises(ValueError, match="overlap"):
        buf = bytearray(b"a\n")
        LineMatcher("a").matching(buf, np.array([0]), np.array([1]),
                                  np.frombuffer(buf, np.uint8)[:1])


def test_the_presets_and_perl_classes_are_spelled_for_the_native_engine():
    assert rust_pattern(r"^\d{4} \w+\s") == r"^[0-9]{4} [0-9A-Za-z_]+[\t\n\f\r ]"
    assert rust_pattern(r"[\w$-]\b") == r"[0-9A-Za-z_$-](?-u:\b)"
    assert rust_pattern(r"\<a\>") == "<a>"                  # RE2's characters, not word edges
    assert all(rust_pattern(p) is not None for p in PRESETS.values())
