"""Syslog on the wire (``agent/tail/syslog_format.py``): RFC 6587's two framings frame by frame,
and RFC 5424 / RFC 3164 messages as their senders write them (util-linux ``logger``'s own
output among them) into fields; what is neither, refused with the reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from agent.tail.syslog_format import Frames, Unparsable, parse, strip_frame

NOW = datetime(2026, 12, 3, 17, 21, 5, tzinfo=UTC)
CET = timezone(timedelta(hours=1))


# -- framing ---------------------------------------------------------------------------------
def test_newline_ended_frames_come_whole_whatever_the_reads_cut():
    f = Frames(1024)
    assert f.feed(b"<13>1 - a b - - - one\n<13>1 - a") == [b"<13>1 - a b - - - one"]
    assert f.feed(b" b - - - two\n") == [b"<13>1 - a b - - - two"]
    assert f.feed(b"") == []
    assert f.rest() == b""


def test_octet_counted_frames_may_hold_newlines_and_need_no_terminator():
    msg1, msg2 = b"<13>1 - h a - - - line one\nline two", b"<14>1 - h a - - - next"
    wire = b"%d %s%d %s" % (len(msg1), msg1, len(msg2), msg2)
    f = Frames(1024)
    got = []
    for i in range(0, len(wire), 7):               # read in pieces, a count cut in two too
        got += f.feed(wire[i:i + 7])
    assert got == [msg1, msg2]
    assert f.bad_frames == 0 and f.rest() == b""


def test_the_two_framings_mixed_on_one_connection_each_frame_on_its_own():
    f = Frames(1024)
    assert f.feed(b"5 hello<13>plain line\n3 abc") == [b"hello", b"<13>plain line", b"abc"]


def test_a_digit_run_without_its_space_is_a_line_and_a_count_over_the_cap_counted_once():
    f = Frames(100)
    assert f.feed(b"123abc\n2026-01-01 boot\n") == [b"123abc", b"2026-01-01 boot"]
    assert f.bad_frames == 0
    assert f.feed(b"999 " + b"x" * 20) == []           # waits for its newline, over reads
    assert f.feed(b"x" * 20) == []
    assert f.feed(b"\n") == [b"999 " + b"x" * 40]
    assert f.bad_frames == 1


def test_a_ten_digit_count_cut_between_reads_and_a_newline_after_a_counted_frame():
    f = Frames(100)
    assert f.feed(b"1234567890") == []                 # the count's end not read yet
    assert f.feed(b" abc\n") == [b"1234567890 abc"]    # over the cap: a line, counted once
    assert f.bad_frames == 1
    msg = b"<13>1 - h a - - - x"
    g = Frames(100)
    assert g.feed(b"%d %s\n5 hello\r\n" % (len(msg), msg)) == [msg, b"hello"]
    assert g.feed(b"%d %s" % (len(msg), msg)) == [msg]
    assert g.feed(b"\n") == []                          # the newline after it, read apart
    assert g.feed(b"<13>next\n") == [b"<13>next"] and g.bad_frames == 0


def test_a_line_longer_than_the_cap_is_cut_not_held_forever():
    f = Frames(10)
    assert f.feed(b"a" * 25) == [b"a" * 10, b"a" * 10]
    assert f.cut == 2 and f.rest() == b"a" * 5


def test_a_frame_left_unended_at_close_is_the_rest():
    f = Frames(1024)
    assert f.feed(b"<13>one\n<13>two") == [b"<13>one"]
    assert f.rest() == b"<13>two"


def test_strip_frame_removes_line_endings_and_nuls_only_at_the_end():
    assert strip_frame(b"a\r\nb\r\n\x00") == b"a\r\nb"


# -- RFC 5424 --------------------------------------------------------------------------------
def test_logger_rfc5424_with_structured_data_and_msgid():
    msg = (b'<155>1 2026-12-03T17:21:04.006985+00:00 vm root - ID47 [timeQuality tzKnown="1" '
           b'isSynced="0"][zoo@123 tiger="hungry"] first line')
    assert parse(msg, NOW, UTC) == {
        "facility": "local3", "severity": "err", "timestamp": "2026-12-03T17:21:04.006985+00:00",
        "host": "vm", "app": "root", "procid": None, "msgid": "ID47",
        "structured_data": {"timeQuality": {"tzKnown": "1", "isSynced": "0"},
                            "zoo@123": {"tiger": "hungry"}},
        "message": "first line", "protocol": "rfc5424"}


def test_a_parameter_given_again_is_a_list_and_an_escaped_newline_is_kept():
    fields = parse(b'<13>1 - h a - - [origin ip="192.0.2.1" ip="192.0.2.2" x="a\\\nb"] m',
                   NOW, UTC)
    assert fields["structured_data"] == {"origin": {"ip": ["192.0.2.1", "192.0.2.2"],
                                                    "x": "a\\\nb"}}


def test_rfc5424_examples_of_the_rfc_nil_values_escapes_and_a_bom():
    fields = parse(b"<34>1 2003-10-11T22:14:15.003Z mymachine.example.com su - ID47 - "
                   b"\xef\xbb\xbf'su root' failed for lonvick on /dev/pts/8", NOW, UTC)
    assert (fields["facility"], fields["severity"]) == ("auth", "crit")
    assert fields["structured_data"] == {} and fields["procid"] is None
    assert fields["message"] == "'su root' failed for lonvick on /dev/pts/8"
    fields = parse(rb'<165>1 - - - - - [ex@1 a="q\"uote" b="back\\slash" c="br\]acket"]',
                   NOW, UTC)
    assert fields["timestamp"] is None and fields["message"] == ""
    assert fields["structured_data"] == {"ex@1": {"a": 'q"uote', "b": "back\\slash",
                                                  "c": "br]acket"}}


@pytest.mark.parametrize("msg, why", [
    (b"no priority here", "no <PRI>"),
    (b"<192>1 - - - - - - x", "over 191"),
    (b"<13>1 yesterday h a - - - x", "not RFC 3339"),
    (b"<13>1 - h a - -", "cut short"),
    (b"<13>1 - h a - - [unclosed a=\"1\" x", "not closed"),
    (b"<13>1 - h a - - [a@1 x=\"1\"]text", "right after"),
])
def test_what_is_not_syslog_is_refused_with_the_reason(msg, why):
    with pytest.raises(Unparsable, match=why):
        parse(msg, NOW, UTC)


# -- RFC 3164 --------------------------------------------------------------------------------
def test_logger_rfc3164_with_host_tag_and_pid_in_the_receivers_zone():
    fields = parse(b"<13>Dec  3 17:21:04 vm myapp[11402]: first line", NOW, CET)
    assert fields == {"facility": "user", "severity": "notice",
                      "timestamp": "2026-12-03T17:21:04+01:00", "host": "vm", "app": "myapp",
                      "procid": "11402", "msgid": None, "structured_data": None,
                      "message": "first line", "protocol": "rfc3164"}


def test_rfc3164_without_host_or_without_timestamp_or_tag():
    assert parse(b"<30>Dec 13 01:02:03 sshd: accepted", NOW, UTC)["app"] == "sshd"
    assert parse(b"<30>Dec 13 01:02:03 sshd: accepted", NOW, UTC)["host"] is None
    fields = parse(b"<30>cron[7]: job ran", NOW, UTC)
    assert (fields["timestamp"], fields["app"], fields["procid"], fields["message"]) == \
        (None, "cron", "7", "job ran")
    fields = parse(b"<30>just words, no tag", NOW, UTC)
    assert (fields["app"], fields["message"]) == (None, "just words, no tag")


def test_rfc3164_with_an_rfc3339_timestamp_as_rsyslogs_forward_format_writes():
    fields = parse(b"<13>2026-12-03T17:21:04.123456+00:00 vm relayed: id-000001", NOW, UTC)
    assert (fields["timestamp"], fields["host"], fields["app"], fields["message"]) == \
        ("2026-12-03T17:21:04.123456+00:00", "vm", "relayed", "id-000001")
    # a tag that a space ends (rsyslog's imfile Tag without a colon)
    fields = parse(b"<133>Dec  3 17:34:37 vm relayed id-000001 relayed", NOW, UTC)
    assert (fields["host"], fields["app"], fields["message"]) == \
        ("vm", "relayed", "id-000001 relayed")


def test_rfc3164_with_an_ipv6_host():
    fields = parse(b"<13>Oct 11 22:14:15 2001:db8::1 sshd[12]: hi", NOW, UTC)
    assert (fields["host"], fields["app"], fields["procid"], fields["message"]) == \
        ("2001:db8::1", "sshd", "12", "hi")


def test_rfc3164_december_read_in_january_is_last_years():
    january = datetime(2027, 1, 1, 0, 5, tzinfo=UTC)
    assert parse(b"<13>Dec 31 23:59:58 h a: x", january, UTC)["timestamp"] == \
        "2026-12-31T23:59:58+00:00"
    assert parse(b"<13>Jan  1 00:04:00 h a: x", january, UTC)["timestamp"] == \
        "2027-01-01T00:04:00+00:00"


def test_invalid_utf8_is_replaced_not_refused():
    assert parse(b"<13>1 - h a - - - caf\xe9", NOW, UTC)["message"] == "caf\ufffd"


@pytest.mark.parametrize("seed", range(6))
def test_frames_cut_in_one_pass_are_the_frames_cut_one_by_one(seed, monkeypatch):
    """Newline-ended frames are cut in one pass when no frame of a read can be counted; random
    streams of both framings (counts, lines starting with digits, a newline after a count,
    empty lines, a line over a small cap), cut into random reads: the same frames at every
    read, the same rest and the same counts as frame by frame."""
    import random

    from agent.tail import syslog_format

    rnd = random.Random(seed)
    parts = []
    for i in range(3_000):
        roll = rnd.random() if i % 200 < 100 else 0.0     # runs of plain lines, then a mix
        msg = b"<13>1 - h a - - - id-%06d" % i + b"x" * rnd.randint(0, 40)
        if roll < 0.7:
            parts.append(msg + rnd.choice([b"\n", b"\r\n", b"\x00\n"]))
        elif roll < 0.8:
            parts.append(b"%d %s" % (len(msg), msg) + rnd.choice([b"", b"\n", b"\r\n"]))
        elif roll < 0.85:
            parts.append(b"12345 digits then no space\n")
        elif roll < 0.9:
            parts.append(b"\n")
        elif roll < 0.95:
            parts.append(b"%d %s" % (len(msg) + 900, msg))          # a count over the cap
        else:
            parts.append(b"y" * rnd.randint(150, 400) + b"\n")      # a line over the cap
    stream = b"".join(parts)
    cuts = sorted(rnd.sample(range(1, len(stream)), 400))
    reads = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]

    real, passes = syslog_format._newline_ended, []

    def counted(data, cap):
        cut = real(data, cap)
        passes.append(cut is not None)
        return cut

    def run(one_pass: bool) -> tuple:
        monkeypatch.setattr(syslog_format, "_newline_ended",
                            counted if one_pass else lambda data, cap: None)
        frames = Frames(200)
        out = [frames.feed(r) for r in reads]
        monkeypatch.undo()
        return out, frames.rest(), frames.bad_frames, frames.cut

    fast, slow = run(True), run(False)
    assert fast == slow
    assert sum(map(len, fast[0])) > 2_500 and fast[2] > 0 and fast[3] > 0
    assert sum(passes) > 50 and passes.count(False) > 50, "both ways taken"
