"""The syslog source's JSON form made by the native extension (``docket_native.SyslogJson``)
against the Python parse and ``json.dumps`` it stands in for: on every message it takes on, the
same bytes; on every message the Python parse refuses, no answer (the Python path then counts
it). Messages from the RFCs' and the tools' shapes, then 20,000 more built from their parts and
cut, doubled or spoiled at random (fixed seeds), read at several times and zones."""

from __future__ import annotations

import json
import random
from datetime import datetime, timedelta, timezone

import pytest

from agent.tail.syslog_format import FACILITIES, SEVERITIES, Unparsable, parse

native = pytest.importorskip("docket_native")
if not hasattr(native, "SyslogJson"):
    pytest.skip("the installed native extension predates SyslogJson (make native)",
                allow_module_level=True)

ADDED = {"env": "prod", "dc": 'a"b\\c'}


def _python(message: bytes, peer: str, now: datetime, added: dict) -> bytes | None:
    """What the source makes without the extension (None: unparsable, which it counts and
    ships whole)."""
    try:
        fields = parse(message, now, now.tzinfo)
    except Unparsable:
        return None
    fields["peer"] = peer
    fields.update(added)
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()


def _renderer(added: dict):
    suffix = json.dumps(added, ensure_ascii=False, separators=(",", ":"))[1:-1]
    return native.SyslogJson(list(FACILITIES), list(SEVERITIES), "," + suffix if suffix else "")


def _now(read_ms: int, offset_s: int) -> datetime:
    return datetime.fromtimestamp(read_ms / 1000, timezone(timedelta(seconds=offset_s)))


def _compare(messages: list[bytes], read_ms: int, offset_s: int, added: dict) -> int:
    """Each message rendered both ways; returns how many the extension made."""
    peers = [f"192.0.2.{i % 250}" for i in range(len(messages))]
    got = _renderer(added).render(messages, [json.dumps(p) for p in peers], read_ms * 1000,
                                  offset_s)
    now = _now(read_ms, offset_s)
    made = 0
    for m, peer, g in zip(messages, peers, got, strict=True):
        want = _python(m, peer, now, added)
        if g is not None:
            assert want is not None, f"the Python parse refuses {m!r}; native made {g!r}"
            assert g == want, f"{m!r}:\n native {g!r}\n python {want!r}"
            made += 1
    return made


COMMON = [
    b'<155>1 2026-12-03T17:21:04.006985+00:00 vm root - ID47 [timeQuality tzKnown="1" '
    b'isSynced="0"][zoo@123 tiger="hungry"] first line',
    b'<13>1 - h a - - [origin ip="192.0.2.1" ip="192.0.2.2" ip="192.0.2.3"] m',
    rb'<165>1 - - - - - [ex@1 a="q\"uote" b="back\\slash" c="br\]acket" d="\n\x"]',
    b"<34>1 2003-10-11T22:14:15.003Z mymachine.example.com su - ID47 - 'su root' failed",
    b"<13>1 2003-08-24T05:14:15.000003-07:00 192.0.2.1 myproc 8710 - - %% It's time",
    b"<0>1 - - - - - -",
    b"<191>99 - - - - - - \"quoted\" and \\ back",
    b"<13>1 - h  a - - - empty procid field",
    b"<13>Dec  3 17:21:04 vm myapp[11402]: first line",
    b"<30>Dec 13 01:02:03 sshd: accepted",
    b"<30>cron[7]: job ran",
    b"<30>just words, no tag",
    b"<13>2026-12-03T17:21:04.123456+00:00 vm relayed: id-000001",
    b"<13>2026-12-03T17:21:04z vm relayed: lower z",
    b"<133>Dec  3 17:34:37 vm relayed id-000001 relayed",
    b"<13>Oct 11 22:14:15 2001:db8::1 sshd[12]: hi",
    b"<13>Feb 29 12:00:00 h leap: a day only some years have",
    b"<13>Nov 31 12:00:00 h a: no such day",
    b"<13>Dec 31 23:59:60 h a: a leap second",
    b"<13>Jan  1 00:00:00 h a[]: empty pid",
    b"<13>Jan  1 00:00:00 h app[1 2]: a space in the pid",
    b"<013>Jan  1 00:00:00 host",
    b"<13>Jan  1 00:00:00 host ",
    b"<13>",
    b"<13>1 ",
]

REFUSED = [
    b"no priority here", b"<192>1 - - - - - - x", b"<13>1 yesterday h a - - - x",
    b"<13>1 - h a - -", b'<13>1 - h a - - [unclosed a="1" x', b'<13>1 - h a - - [a@1 x="1"]text',
    b"<1234>x", b"<>x", b'<13>1 - h a - - [a b="1"][a c="2"] an id twice', b"<13>1 - - - - - -x",
]

TIMES = [  # (wall ms, zone east of UTC in s)
    (1_796_403_600_123, 0),            # 2026-12-04 in UTC
    (1_796_403_600_999, 3_600),        # CET
    (1_798_761_900_000, -18_000),      # 2027-01-01 00:05 at UTC-5 is still 2026 in UTC
    (1_798_762_000_500, 0),            # the first minutes of 2027 (December lines: last year's)
    (1_709_208_000_000, 19_800),       # 2024-02-29 at +05:30: a leap year
    (1_740_787_200_000, -34_200),      # 2025-03-01 at -09:30
]


@pytest.mark.parametrize("read_ms, offset_s", TIMES)
def test_the_shapes_of_the_rfcs_and_tools_the_same_bytes(read_ms, offset_s):
    made = _compare(COMMON, read_ms, offset_s, ADDED)
    assert made >= len(COMMON) - 2          # all but a date or two this zone cannot resolve
    assert _compare(COMMON, read_ms, offset_s, {}) == made


def test_what_the_python_parse_refuses_gets_no_answer():
    got = _renderer({}).render(REFUSED, ['"p"'], TIMES[0][0] * 1000, 0)
    assert got == [None] * len(REFUSED)


def test_what_is_not_printable_ascii_is_left_to_python():
    for m in (b"<13>1 - h a - - - caf\xe9", b"<13>1 - h a - - - \xef\xbb\xbfbom",
              b"<13>1 - h a - - - tab\there", b"<13>Dec  3 17:21:04 vm a: caf\xc3\xa9",
              b"<13>1 - h a - - - del\x7f"):
        assert _renderer({}).render([m], ['"p"'], TIMES[0][0] * 1000, 0) == [None]


def test_one_peer_for_all_or_one_each_else_refused():
    r = _renderer({})
    assert r.render([COMMON[0], COMMON[1]], ['"a"'], 0, 0)[1].endswith(b',"peer":"a"}')
    with pytest.raises(ValueError, match="one for all, or one each"):
        r.render([COMMON[0], COMMON[1], COMMON[2]], ['"a"', '"b"'], 0, 0)


# -- built at random ------------------------------------------------------------------------
def _word(rnd: random.Random, alphabet: str, lo: int, hi: int) -> str:
    return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(lo, hi)))


PRINTABLE = "".join(chr(c) for c in range(0x20, 0x7F))
TAGGY = "abcXYZ09-_./@" + "[]: \"=\\"


def _stamp5424(rnd: random.Random) -> str:
    t = f"{rnd.randint(1990, 2030):04}-{rnd.randint(0, 13):02}-{rnd.randint(0, 32):02}T" \
        f"{rnd.randint(0, 24):02}:{rnd.randint(0, 60):02}:{rnd.randint(0, 60):02}"
    t += rnd.choice(["", "." + "1" * rnd.randint(0, 11)])
    return t + rnd.choice(["Z", "z", "+01:00", "-07:30", "+0100", "", "+01:0"])


def _sd(rnd: random.Random) -> str:
    if rnd.random() < 0.3:
        return rnd.choice(["-", "-x", ""])
    out = ""
    for _ in range(rnd.randint(1, 3)):
        out += "[" + _word(rnd, "abc@12=\"", 0, 6)
        for _ in range(rnd.randint(0, 3)):
            name = _word(rnd, "abcip", 1, 3) if rnd.random() < 0.9 else "n" * rnd.randint(31, 34)
            value = "".join(rnd.choice(['a', ' ', '\\"', '\\\\', '\\]', '\\n', ']', '"', '='])
                            for _ in range(rnd.randint(0, 5)))
            out += f' {name}="{value}"' if rnd.random() < 0.95 else f" {name}={value}"
        out += rnd.choice(["]", "]", "]", "", " ]"])
    return out


def _rfc5424(rnd: random.Random) -> str:
    parts = [rnd.choice(["1", "12", "0", "1x"]),
             rnd.choice(["-", _stamp5424(rnd), _stamp5424(rnd)]),
             rnd.choice(["-", "host", "", "h.example.com"]), rnd.choice(["-", "app", "a b"]),
             rnd.choice(["-", "1234", ""]), rnd.choice(["-", "ID47"]), _sd(rnd)]
    text = " ".join(parts[:rnd.randint(5, 7)])
    if rnd.random() < 0.8:
        text += rnd.choice(["", " "]) + _word(rnd, PRINTABLE, 0, 30)
    return text


def _rfc3164(rnd: random.Random) -> str:
    months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
              "Dec", "Foo"]
    day = rnd.choice([f"{rnd.randint(0, 32):2}", f"{rnd.randint(0, 32):02}", "x1"])
    stamp = rnd.choice([
        f"{rnd.choice(months)} {day} {rnd.randint(0, 24):02}:{rnd.randint(0, 60):02}:"
        f"{rnd.randint(0, 61):02} ",
        _stamp5424(rnd) + " ", ""])
    host = rnd.choice(["", "vm ", "2001:db8::1 ", "host: ", "h"])
    name = rnd.choice([_word(rnd, TAGGY, 0, 6), "t" * rnd.randint(47, 50)])
    pid = rnd.choice(["", f"[{_word(rnd, '0123 ]x[', 0, 5)}]", "[" + "9" * rnd.randint(127, 130)
                      + "]"])
    tag = name + pid + rnd.choice([": ", ":", " ", "", ":  "])
    return stamp + host + tag + _word(rnd, PRINTABLE, 0, 20)


def _spoiled(rnd: random.Random, text: str) -> str:
    roll = rnd.random()
    if roll < 0.1 and text:
        i = rnd.randrange(len(text))
        return text[:i]
    if roll < 0.2 and text:
        i = rnd.randrange(len(text))
        return text[:i] + rnd.choice(PRINTABLE) + text[i:]
    if roll < 0.25 and text:
        i = rnd.randrange(len(text))
        return text[:i] + text[i + 1:]
    return text


@pytest.mark.parametrize("seed", range(4))
def test_twenty_thousand_built_at_random_the_same_bytes_or_no_answer(seed):
    rnd = random.Random(seed)
    messages = []
    for _ in range(5_000):
        pri = str(rnd.randint(0, 191)) if rnd.random() < 0.85 else \
            rnd.choice(["191", "192", "0013", "", "x"])
        body = _rfc5424(rnd) if rnd.random() < 0.5 else _rfc3164(rnd)
        messages.append(_spoiled(rnd, f"<{pri}>" + body).encode())
    read_ms, offset_s = TIMES[seed % len(TIMES)]
    made = _compare(messages, read_ms, offset_s, ADDED if seed % 2 else {})
    refused = sum(1 for m in messages if _python(m, "p", _now(read_ms, offset_s), {}) is None)
    # most are made natively, and what the Python parse refuses is a real part of the mix
    assert made > 0.5 * len(messages) and refused > 0.05 * len(messages), (made, refused)


@pytest.mark.parametrize("maker", ["native", "python"])
def test_empty_frames_are_counted_and_the_rest_keep_their_own_senders(tmp_path, maker):
    from agent.buffer import BufferPool
    from agent.config import SourceConfig
    from agent.state.journal import LossJournal
    from agent.tail.syslog import SyslogSource
    from agent.telemetry import Metrics
    from tests.agentkit import free_port

    pool = BufferPool(tmp_path / "pool", 16 << 20, 1 << 20, linger_ms=1e9, sync_on_seal=False)
    metrics = Metrics()
    cfg = SourceConfig(index=0, type="syslog", topic="t", protocol="udp",
                       listen=f"127.0.0.1:{free_port()}")
    src = SyslogSource(cfg, pool, metrics, LossJournal(tmp_path / "journal.jsonl", metrics))
    try:
        if maker == "python":
            src._native = None
        src._deliver([b"<13>1 - h a - - - one\n", b"\r\n", b"<13>1 - h a - - - two\x00", b""],
                     ["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"])
        src._deliver([b"\n", b"\x00"], ["192.0.2.5", "192.0.2.6"])
    finally:
        src.close()
    pool.seal_all()
    got = [json.loads(v) for s in pool.sealed() for _t, _k, v in s.records()]
    assert [(f["message"], f["peer"]) for f in got] == [("one", "192.0.2.1"), ("two", "192.0.2.3")]
    assert metrics.get("agent_source_bad_input_total", kind="empty_line", topic="t") == 4
    pool.close()
