"""Syslog on the wire: frames out of a TCP stream (RFC 6587) and messages into fields.

**Framing.** A TCP sender either counts octets (``LEN SP MSG``, RFC 6587 3.4.1: what
``logger --octet-count`` and rsyslog's ``omfwd`` with ``TCP_Framing="octet-counted"`` send) or
ends each message with a newline (3.4.2, the older and commoner way). Senders do not announce
which, and a relay may forward both on one connection, so each frame is looked at on its own: one
starting with a digit run and a space is counted, any other ends at its newline (a line that
starts with digits not followed by a space too). A count over the cap is read as a
newline-ended frame (counted as ``syslog_bad_frame``: its bytes still go, nothing is skipped).
A newline right after a counted frame (some senders add one) is no frame of its own. A read
in which no frame can be counted (none begins with 1-9) is cut at its newlines in one pass.

**Messages.** RFC 5424 (``<PRI>1 TIMESTAMP HOST APP PROCID MSGID SD MSG``) and RFC 3164
(``<PRI>Mmm dd hh:mm:ss HOST TAG[PID]: MSG``, and its common variants: an RFC 3339 timestamp
in its place, as rsyslog's ``RSYSLOG_ForwardFormat`` writes, no host, no timestamp, a tag a
space ends) become one dict of fields. A message that is neither (no ``<PRI>``, a bad version
or structured data) raises ``Unparsable``; the caller ships it whole with the reason.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, tzinfo

import numpy as np

FACILITIES = ("kern", "user", "mail", "daemon", "auth", "syslog", "lpr", "news", "uucp", "cron",
              "authpriv", "ftp", "ntp", "security", "console", "solaris-cron",
              *(f"local{i}" for i in range(8)))
SEVERITIES = ("emerg", "alert", "crit", "err", "warning", "notice", "info", "debug")
BOM = "\ufeff"
MAX_COUNT_DIGITS = 10         # RFC 6587 counts up to 10 digits (and no leading zero)


class Unparsable(ValueError):
    """A message neither RFC 5424 nor RFC 3164: why, in a few words."""


FAST_BYTES = 1 << 20          # more pending (a long line coming): frame by frame, as before


def _newline_ended(data: bytes, max_bytes: int) -> tuple[list[bytes], int] | None:
    """The frames of ``data`` cut in one pass, and the bytes they took, when none of them can
    be counted — none begins with 1-9, at the start or after a newline — and what follows the
    last newline is shorter than the cap (it waits); None otherwise (frame by frame then)."""
    a = np.frombuffer(data, np.uint8)
    newlines = np.flatnonzero(a == 0x0A)
    if not len(newlines) or len(data) - int(newlines[-1]) - 1 >= max_bytes:
        return None
    starts = newlines + 1
    firsts = a[starts[starts < len(data)]]
    if 0x31 <= a[0] <= 0x39 or ((firsts >= 0x31) & (firsts <= 0x39)).any():
        return None
    end = int(newlines[-1])
    return data[:end].split(b"\n"), end + 1


class Frames:
    """One TCP connection's frames, in order, whichever of the two framings each one uses."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.pending = bytearray()
        self.bad_frames = 0       # octet counts over the cap
        self.cut = 0              # newline-ended frames cut at the cap (no newline within it)
        self._after_count = False  # the last frame was counted: a newline after it is no frame

    def feed(self, data: bytes) -> list[bytes]:
        """The whole frames ``data`` completes (their framing removed)."""
        self.pending += data
        buf = self.pending
        if buf and not self._after_count and len(buf) <= FAST_BYTES:
            cut = _newline_ended(bytes(buf), self.max_bytes)
            if cut is not None:
                del self.pending[:cut[1]]
                return cut[0]
        out = []
        at = 0
        while at < len(buf):
            size = self._counted(buf, at)
            if size == -1:                         # a count not yet whole: wait for more
                break
            if size is not None and size > self.max_bytes:
                size, bad = None, True             # read as a line, counted when it is whole
            else:
                bad = False
            if size is not None:
                digits = buf.index(b" ", at) - at
                start = at + digits + 1
                if len(buf) - start < size:
                    break
                out.append(bytes(buf[start:start + size]))
                at = start + size
                self._after_count = True
                continue
            if self._after_count:                  # some senders end a counted frame with a
                self._after_count = False          # newline too: not an empty frame
                if buf[at] == 0x0A:
                    at += 1
                    continue
                if buf[at] == 0x0D and at + 1 < len(buf) and buf[at + 1] == 0x0A:
                    at += 2
                    continue
            end = buf.find(b"\n", at)
            if end < 0:
                if len(buf) - at >= self.max_bytes:       # no newline within the cap: cut
                    out.append(bytes(buf[at:at + self.max_bytes]))
                    self.cut += 1
                    self.bad_frames += bad
                    at += self.max_bytes
                    continue
                break
            out.append(bytes(buf[at:end]))
            self.bad_frames += bad
            at = end + 1
        del self.pending[:at]
        return out

    def rest(self) -> bytes:
        """What the sender left unended when it closed (a last frame without its newline)."""
        rest, self.pending = bytes(self.pending), bytearray()
        return rest

    def _counted(self, buf: bytearray, at: int) -> int | None:
        """The octet count of the frame at ``at`` (over the cap too); None when it is
        newline-ended; -1 when its count is not whole yet."""
        if not 0x31 <= buf[at] <= 0x39:            # 1-9: a count has no leading zero
            return None
        i = at
        while i < len(buf) and i - at < MAX_COUNT_DIGITS and 0x30 <= buf[i] <= 0x39:
            i += 1
        if i == len(buf):                          # the count (or the line) goes on
            return -1
        if buf[i] != 0x20:
            return None                            # digits, then no space: a line, not a count
        return int(buf[at:i])


def strip_frame(frame: bytes) -> bytes:
    """A message without the line ending or NUL some senders leave after it."""
    return frame.rstrip(b"\r\n\x00")


def parse(message: bytes, now: datetime, local: tzinfo) -> dict:
    """The fields of one syslog message. ``now`` (aware) and ``local``: the receiver's time and
    zone, which an RFC 3164 timestamp (no year, no zone) is read in."""
    text = message.decode("utf-8", errors="replace")
    m = _PRI.match(text)
    if not m:
        raise Unparsable("no <PRI> at the start")
    pri = int(m.group(1))
    if pri > 191:
        raise Unparsable(f"<PRI> {pri} is over 191")
    fields = {"facility": FACILITIES[pri >> 3], "severity": SEVERITIES[pri & 7]}
    rest = text[m.end():]
    if _VERSION.match(rest):
        fields.update(_rfc5424(rest))
    else:
        fields.update(_rfc3164(rest, now, local))
    return fields


_PRI = re.compile(r"<(\d{1,3})>")
_VERSION = re.compile(r"[1-9]\d? ")
_TS5424 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")
_SD_PARAM = re.compile(r' ([^ ="\]]{1,32})="((?:[^"\\\]]|\\.)*)"', re.S)
_SD_ESCAPE = re.compile(r"\\([\"\\\]])")


def _rfc5424(rest: str) -> dict:
    parts = rest.split(" ", 6)
    if len(parts) < 7:
        raise Unparsable("RFC 5424 header cut short")
    _version, stamp, host, app, procid, msgid, tail = parts
    if stamp != "-" and not _TS5424.match(stamp):
        raise Unparsable(f"RFC 5424 timestamp {stamp[:40]!r} is not RFC 3339")
    sd, message = _structured_data(tail)
    if message.startswith(BOM):
        message = message[1:]
    nil = None
    return {"timestamp": nil if stamp == "-" else stamp.replace("z", "Z"),
            "host": nil if host == "-" else host, "app": nil if app == "-" else app,
            "procid": nil if procid == "-" else procid, "msgid": nil if msgid == "-" else msgid,
            "structured_data": sd, "message": message, "protocol": "rfc5424"}


def _structured_data(tail: str) -> tuple[dict, str]:
    """RFC 5424's STRUCTURED-DATA (``-`` or ``[id k="v" ...]...``) and the message after it."""
    if tail.startswith("-"):
        if len(tail) > 1 and tail[1] != " ":
            raise Unparsable("RFC 5424 structured data: '-' followed by text")
        return {}, tail[2:]
    sd: dict[str, dict[str, str | list[str]]] = {}
    at = 0
    while at < len(tail) and tail[at] == "[":
        end_id = at + 1
        while end_id < len(tail) and tail[end_id] not in " ]":
            end_id += 1
        sd_id = tail[at + 1:end_id]
        if not sd_id or end_id == len(tail):
            raise Unparsable("RFC 5424 structured data: an element without its id or ']'")
        params: dict[str, str] = {}
        at = end_id
        while True:
            p = _SD_PARAM.match(tail, at)
            if not p:
                break
            name, value = p.group(1), _SD_ESCAPE.sub(r"\1", p.group(2))
            if name not in params:
                params[name] = value
            else:                             # a name given again (origin's ip): a list
                before = params[name]
                params[name] = [*before, value] if isinstance(before, list) else [before, value]
            at = p.end()
        if at >= len(tail) or tail[at] != "]":
            raise Unparsable(f"RFC 5424 structured data: element {sd_id[:32]!r} not closed")
        sd[sd_id] = {**sd.get(sd_id, {}), **params}     # an id given twice (it must not be)
        at += 1
    if at == 0:
        raise Unparsable("RFC 5424 structured data: neither '-' nor '['")
    if at < len(tail) and tail[at] != " ":
        raise Unparsable("RFC 5424 structured data: text right after ']'")
    return sd, tail[at + 1:]


_TS3164 = re.compile(r"(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ([ \d]\d) "
                     r"(\d\d):(\d\d):(\d\d) ")
_MONTHS = {name: i + 1 for i, name in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))}
_TS3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|z|[+-]\d\d:\d\d)) ")
_TAG = re.compile(r"([^\s\[\]:]{1,48})(?:\[([^\]\s]{0,128})\])?: ?")
_BARE_TAG = re.compile(r"([^\s\[\]:]{1,48})(?:\[([^\]\s]{0,128})\])? ")


def _rfc3164(rest: str, now: datetime, local: tzinfo) -> dict:
    stamp = None
    m = _TS3164.match(rest)
    if m:
        stamp = _year_of(m, now, local)
        rest = rest[m.end():]
    else:                                    # rsyslog's RSYSLOG_ForwardFormat: RFC 3339 there
        m = _TS3339.match(rest)
        if m:
            stamp = m.group(1).replace("z", "Z")
            rest = rest[m.end():]
    host = None
    first, _, after = rest.partition(" ")
    if m and first and after and not first.endswith(":"):
        # after a timestamp, a first word that does not end with ':' is the host (an IPv6
        # address holds ':' inside), then the tag, which may end at a space (RFC 3164 4.1.3:
        # any character not alphanumeric ends it)
        host, rest = first, after
        tag = _TAG.match(rest) or _BARE_TAG.match(rest)
    else:
        tag = _TAG.match(rest)
    app = procid = None
    if tag:
        app, procid = tag.group(1), tag.group(2) or None
        rest = rest[tag.end():]
    return {"timestamp": stamp, "host": host, "app": app, "procid": procid, "msgid": None,
            "structured_data": None, "message": rest, "protocol": "rfc3164"}


def _year_of(m: re.Match, now: datetime, local: tzinfo) -> str | None:
    """An RFC 3164 time (no year, the sender's zone unknown: the receiver's) in RFC 3339: this
    year's, or last year's when this year's would lie more than a day ahead (December's lines
    read in January)."""
    month, day = _MONTHS[m.group(1)], int(m.group(2))
    hour, minute, second = int(m.group(3)), int(m.group(4)), int(m.group(5))
    here = now.astimezone(local)
    for year in (here.year, here.year - 1):
        try:
            t = datetime(year, month, day, hour, minute, second, tzinfo=local)
        except ValueError:                   # Feb 29 of a year that has none, or 31 Nov
            continue
        if t - here <= timedelta(days=1):
            return t.isoformat()
    return None
