"""Reading one open file into the buffer pool: whole lines, large reads, checked after the fact.

Every read is followed by a look at the file's first bytes. If they no longer start with the
generation's fingerprint, the file was truncated (and perhaps written again) since the last
look — possibly between that look and the read — so what was just read may be the *new*
content: it is discarded, and the truncation is handled before anything else is read
(``on_truncated``). A file that shrank below the read offset, having reached it, was truncated
too. Checking after the read, not only before, closes the window between the check and the
read; checking from offset 0 on (a file not read yet is no exception) means a generation is
never read under another's row.

While the fingerprint is shorter than ``FINGERPRINT_BYTES`` it grows with what is *read* from
the start of the file (those bytes must agree with the part it already holds), never from a
look alone: the file may hold another generation by then (truncated and written again). The
longer one is stored (``on_fingerprint``) before the bytes it covers are handed to the pool: a
stored fingerprint always covers min(sealed offset, FINGERPRINT_BYTES) bytes, so after a restart
content that starts with it is the content the checkpoint counts.
"""

from __future__ import annotations

import logging
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..buffer import AppendResult, BufferPool, Chunk
from ..buffer.framing import MAX_KEY_BYTES
from ..buffer.seams import Clock
from ..config import FILE_FIELDS, SourceConfig
from ..patterns import DEFAULT_FLUSH_MS, DEFAULT_MAX_EVENT_BYTES, MultilineRule
from ..routing import FileRoutes, topic_groups
from ..state.db import FINGERPRINT_BYTES
from ..telemetry import Metrics
from . import anchors, compressed, container
from .generations import TAIL_BYTES
from .lines import LineCutter, Units
from .multiline import EventCutter, line_bounds
from .seams import FsOps

log = logging.getLogger("docket.agent.files")


@dataclass
class Tracked:
    """A file open for reading, and the generation being read from it."""

    source_id: int
    path: str
    fd: int
    dev: int
    ino: int
    fingerprint: bytes
    offset: int                      # bytes of the generation handed to the pool (whole lines)
    size_seen: int = 0
    tail: bytes = b""                # the last bytes handed over (up to TAIL_BYTES)
    rotated: bool = False            # no glob path leads to this inode any more
    idle_since: float | None = None  # at its end since (monotonic s)
    partial_since: float | None = None
    partial_size: int = 0
    anchors: list = field(default_factory=list)   # (offset, crc) sealed to (anchors.py)
    anchor_since: float = float("-inf")          # when the newest one was first kept
    fine: list = field(default_factory=list)     # the newest hand-overs sealed to, as anchors
    skip: list = field(default_factory=list)     # (start, end) ahead that the pool holds as
    #                                              the file does (a cut back: FileSource._resume)
    compressed: str | None = None    # its first bytes are a compressor's: never read (why)
    handed: deque = field(default_factory=lambda: deque(maxlen=anchors.HANDED_KEPT))
    #                                  (offset, crc) at each hand-over not yet sealed to
    event_since: float | None = None  # multiline: an event open at the end since (monotonic s)
    event_size: int = 0               # ... with the file this size
    size_since: float | None = None   # when a look first found the file ``size_seen`` long
    #                                   (monotonic s): an open event's flush counts from then
    cut_open: bool = False            # multiline: the next record continues a cut event


@dataclass
class ReadStats:
    bytes: int = 0
    events: int = 0
    blocked: bool = False


class Reader:
    def __init__(self, cfg: SourceConfig, pool: BufferPool, fs: FsOps, clock: Clock,
                 metrics: Metrics, on_truncated: Callable[[Tracked, bytes], None],
                 on_fingerprint: Callable[[Tracked], None],
                 on_compressed: Callable[[Tracked, str], None] = lambda t, kind: None):
        self.cfg = cfg
        self.pool = pool
        self.fs = fs
        self.clock = clock
        self.metrics = metrics
        self.on_truncated = on_truncated
        self.on_fingerprint = on_fingerprint
        self.on_compressed = on_compressed
        self.events = EventCutter(MultilineRule.from_table(cfg.multiline)) \
            if cfg.multiline else None
        rule = self.events.rule if self.events else None
        self.flush_ms = rule.flush_ms if rule else DEFAULT_FLUSH_MS
        self.lines = LineCutter(cfg, metrics, self.events, self.flush_ms)
        self.container = self.lines.container         # a runtime's framing (container.py)
        # Each file's topic and key (templates over its fields, else the source's topic).
        self.routes = FileRoutes(cfg.topic, cfg.fallback_topic, cfg.key, cfg.add_fields,
                                 container.path_fields if self.container is not None else None,
                                 own=None if self.container is not None else frozenset(
                                     FILE_FIELDS))
        # Lines are grouped into records (held while the last may go on) by a multiline rule,
        # a container runtime's partial lines, or both.
        self.grouped = self.events is not None or self.container is not None
        # A container file's group (an entry, or lines no record crosses: with a rule, one
        # stream's open event holds the other's lines in it) is capped as a line is.
        self.max_event_bytes = self.lines.max_line_bytes if self.container is not None else \
            rule.max_event_bytes if rule else DEFAULT_MAX_EVENT_BYTES

    def _now(self) -> float:
        return self.clock.monotonic_ns() / 1e9

    # -- checks -------------------------------------------------------------------------------
    def head(self, t: Tracked) -> bytes:
        return self.fs.pread(t.fd, FINGERPRINT_BYTES, 0)

    def check(self, t: Tracked) -> None:
        """A look between reads: handle a truncation, note the size."""
        size = self.fs.fstat(t.fd).st_size
        head = self.head(t)
        if self._shrank(t, size) or not head.startswith(t.fingerprint):
            self.on_truncated(t, head)
            return
        self._saw_size(t, size)

    def _saw_size(self, t: Tracked, size: int) -> None:
        """Note the size a look found, and when a look first found it. (Where ``size_seen``
        is set otherwise — a file opened, a truncation — ``size_since`` is None: the next look
        starts it.)"""
        if size != t.size_seen or t.size_since is None:
            t.size_since = self._now()
        t.size_seen = size

    def _shrank(self, t: Tracked, size: int) -> bool:
        """Within a generation a file only grows: smaller than seen is a truncation, read
        offset or not. (A copy that continues an orphan may be shorter than where its
        content was read to: its size seen starts at its own size.)"""
        return size < t.size_seen

    @staticmethod
    def _grown(t: Tracked, data: bytes) -> bytes | None:
        """The fingerprint with ``data`` (read at ``t.offset``) added where it reaches into the
        first FINGERPRINT_BYTES; None when ``data`` disagrees with the fingerprint it overlaps
        (the file holds other content than the generation's)."""
        fp = t.fingerprint
        if len(fp) >= FINGERPRINT_BYTES or t.offset >= FINGERPRINT_BYTES:
            return fp
        overlap = fp[t.offset:t.offset + len(data)]
        if data[:len(overlap)] != overlap:
            return None
        return max(fp, (fp[:t.offset] + data)[:FINGERPRINT_BYTES], key=len)

    # -- reading ------------------------------------------------------------------------------
    def read(self, t: Tracked, budget: int, stats: ReadStats) -> None:
        """Read up to ``budget`` bytes, no further than the size one ``fstat`` shows at the
        start of the turn (what is written meanwhile waits for the next turn, which comes at
        once while there is work). Each read is still followed by its look at the first bytes:
        the truncation check is per read, the size look per turn."""
        size = self.fs.fstat(t.fd).st_size
        if self._shrank(t, size):
            self.on_truncated(t, self.head(t))
            return
        self._saw_size(t, size)
        while budget > 0:
            if t.skip and t.offset >= t.skip[0][0]:
                self._pass(t, *t.skip.pop(0))
                continue
            if size <= t.offset:
                if t.idle_since is None:
                    t.idle_since = self._now()
                return
            want = min(self.cfg.read_chunk_bytes, size - t.offset)
            if t.skip:
                want = min(want, t.skip[0][0] - t.offset)
            data = self.fs.pread(t.fd, want, t.offset)
            if not data:
                return
            if t.offset == 0:
                found = compressed.kind(data[:compressed.HEAD_BYTES])
                if found == compressed.MAYBE:
                    return                       # too few bytes to tell yet
                if found is not None:
                    t.compressed, t.idle_since = found, self._now()
                    self.on_compressed(t, found)
                    return
            units = self.lines.units(data if t.offset == 0 else t.fingerprint)
            last_nl = _last_end(data, units) - 1
            forced = False
            if last_nl < 0 and t.skip and (t.offset + len(data) == t.skip[0][0]
                                           or not data.strip(b"\0")):
                # a power cut's hole of zeros, up to a line the pool holds already: a record
                # (a hole longer than a read: a record a read long, each)
                data, forced = self.lines.force(data, "hole_ended", units), True
                last_nl = len(data) - 1
            elif last_nl < 0:
                data, forced = self._long_or_partial(t, data, size, units)
                if data is None:
                    t.idle_since = None
                    return
                last_nl = len(data) - 1
            # The look after the read: were these bytes the generation's?
            added = len(units.newline) if units and forced else int(forced)
            fingerprint = self._grown(t, data[:len(data) - added])         # the file's bytes
            head = self.head(t)
            if fingerprint is None or not head.startswith(fingerprint):
                self.on_truncated(t, head)
                return
            if fingerprint != t.fingerprint:
                t.fingerprint = fingerprint
                self.on_fingerprint(t)
            t.idle_since = None
            t.partial_since = None
            if self.grouped:
                consumed, done = self._hand_over_events(t, data, last_nl + 1, size, stats,
                                                        forced, units)
                if consumed == 0 and done:
                    return                       # an event still open: wait for its end
            else:
                consumed, done = self._hand_over(t, data, last_nl + 1, stats, forced,
                                                 units=units)
            budget -= consumed
            if not done:
                stats.blocked = True
                return

    def _pass(self, t: Tracked, start: int, end: int) -> None:
        """Go past ``start``..``end`` unread: lines the pool holds already, as the file does.
        The slot filling with what was read before is sealed first: a slot's records lie end
        to end in its source, as a later start's look at them takes them to
        (``FileSource._still_held``)."""
        if t.offset < end:
            self.pool.seal(self.routes.of(t.path).topic)
            t.offset = end
            t.tail = self.fs.pread(t.fd, min(TAIL_BYTES, end), end - min(TAIL_BYTES, end))

    def _long_or_partial(self, t: Tracked, data: bytes, size: int,
                         units: Units | None) -> tuple[bytes | None, bool]:
        """No newline in what was read: a line longer than a read, or a partial last line.

        Returns the bytes to hand over (ending in a newline) and whether that newline was added
        by the agent, or None when the line must wait."""
        if t.offset + len(data) < size or len(data) >= self.cfg.read_chunk_bytes:
            # More bytes follow: read on until a newline (or the line cap).
            want = min(size - t.offset, self.lines.max_line_bytes)
            data = self.fs.pread(t.fd, want, t.offset)
            end = units.first_end(data) if units else data.find(b"\n") + 1
            if end > 0:
                return data[:end], False
            if len(data) >= self.lines.max_line_bytes:
                return self.lines.force(data, "line_forced", units), True
        # A partial last line: wait for its newline, or flush it after partial_flush_ms.
        now = self._now()
        if t.partial_size != len(data) or t.partial_since is None:
            t.partial_size, t.partial_since = len(data), now
            return None, False
        if units:
            data = data[:units.whole(len(data))]     # half a character waits for its rest
            if t.offset == 0 and data == units.bom:
                data = b""                           # a byte order mark alone is no line
        if data and self.cfg.partial_flush_ms and \
                now - t.partial_since >= self.cfg.partial_flush_ms / 1e3:
            return self.lines.force(data, "partial_line_flushed", units), True
        return None, False

    # -- multiline events ---------------------------------------------------------------------
    def _hand_over_events(self, t: Tracked, data: bytes, n: int, size: int, stats: ReadStats,
                          forced: bool, units: Units | None) -> tuple[int, bool]:
        """Give the whole events among the whole lines ``data[:n]`` (read at ``t.offset``, an
        event's first byte) to the pool. The last event stays in the file while it may go on:
        it is handed over when a line beginning another follows it, when the file has held
        nothing after it but a partial line, at the same size, for ``flush_ms``, or in parts
        (cut) as it reaches ``max_event_bytes``. Returns the bytes the pool took (0 with
        nothing to hand over) and whether it took all that was offered."""
        while True:
            starts, ends = units.lines(data, n) if units else line_bounds(data, n)
            begins, closed = self._begins(data, n, starts, ends, units)
            firsts = starts[begins]
            cuts = _cut_points(firsts, starts, n, self.max_event_bytes)
            open_at = n if closed else max(int(firsts[-1]), cuts[-1] if cuts else 0)
            at_end = t.offset + len(data) >= size
            if open_at > 0 or forced or at_end:
                break
            # One open event fills what was read and the file holds more: read further.
            want = min(size - t.offset, self.max_event_bytes + self.cfg.read_chunk_bytes)
            if want <= len(data):
                break
            bigger = self.fs.pread(t.fd, want, t.offset)
            last = _last_end(bigger, units)
            if last <= n or bigger[:n] != data[:n]:
                break                           # nothing whole added (or the file changed)
            data, n = bigger, last
        end = open_at
        if forced or (at_end and self._flush_due(t, size)):
            end = n                             # nothing followed the open event: close it
        if end == 0:
            return 0, True
        t.event_since = None
        cut_set = set(cuts)
        # Each record's first byte (ascending: line starts, and cuts at line starts).
        records = np.union1d(firsts, np.asarray(cuts, np.int64)) if cuts else firsts
        pieces = [0, *(c for c in cuts if 0 < c < end), end]
        taken = 0
        for a, b in zip(pieces[:-1], pieces[1:], strict=True):
            lo, hi = np.searchsorted(records, (a, b)).tolist()
            mine = records[lo:hi] - a
            # The newlines of the piece, found above: the framing does not look again (a
            # wide encoding's are its own units', found there).
            lo, hi = np.searchsorted(ends, (a, b)).tolist()
            got, done = self._hand_over(t, data if a == 0 else data[a:], b - a, stats,
                                        forced and b == n, continued=t.cut_open, records=mine,
                                        units=units,
                                        newlines=None if units else ends[lo:hi] - a)
            taken += got
            if got:
                t.cut_open = False
            if not done:
                return taken, False
            t.cut_open = b in cut_set           # the next part continues an event cut here
            if t.cut_open:
                self.lines.bad("multiline_event_cut")
        return taken, True

    def _begins(self, data: bytes, n: int, starts: np.ndarray, ends: np.ndarray,
                units: Units | None) -> tuple[np.ndarray, bool]:
        """Per line of ``data[:n]``: whether it begins an event; and whether the last line
        closes its event (a container file's group that nothing in it may go on from). A wide
        encoding's lines are matched as UTF-8 text (decoding keeps every newline and adds
        none: a character it cannot decode is replaced alone). A container file's records
        begin where its groups do, its rule matched against its entries' text per stream
        (container.py)."""
        if self.container is not None:                  # records begin where groups do
            plan = self.container.plan(self.container.parts(data, starts, ends))
            return plan.groups, plan.closed
        if units is None:
            return self.events.begins(data, starts, ends), False
        text = bytes(data[:n]).decode(units.codec, "replace").encode()
        s8, e8 = line_bounds(text, len(text))
        if len(s8) != len(starts):            # not expected; every line its own event then
            return np.ones(len(starts), bool), False
        return self.events.begins(text, s8, e8), False

    def _flush_due(self, t: Tracked, size: int) -> bool:
        """Whether the open event at the file's end is to be closed: the file the same size
        for ``flush_ms``, counted from the first look that found it so — not from the read
        that reached the event, which may come later (a file read from behind: its size
        was looked at when the reading began). Notes when the wait began."""
        if t.event_since is None or t.event_size != size:
            seen = t.size_since if t.size_seen == size and t.size_since is not None \
                else self._now()
            t.event_since, t.event_size = seen, size
        return self._now() - t.event_since >= self.flush_ms / 1e3

    def due(self, t: Tracked) -> float | None:
        """When (monotonic s) the open event or partial line of ``t`` is to be flushed."""
        out = []
        if self.grouped and t.event_since is not None:
            out.append(t.event_since + self.flush_ms / 1e3)
        if self.cfg.partial_flush_ms and t.partial_since is not None:
            out.append(t.partial_since + self.cfg.partial_flush_ms / 1e3)
        return min(out, default=None)

    def _hand_over(self, t: Tracked, data: bytes, n: int, stats: ReadStats,
                   forced: bool, continued: bool = False,
                   records: np.ndarray | None = None,
                   units: Units | None = None,
                   newlines: np.ndarray | None = None) -> tuple[int, bool]:
        """Give the whole lines ``data[:n]`` to the pool; returns the bytes it took and whether
        it took them all. With multiline events, ``records`` are where each event in
        ``data[:n]`` begins (``continued``: the first continues an event cut before it), and
        ``newlines`` the newlines of ``data[:n]``, found already."""
        skip = len(units.bom) if units and t.offset == 0 and data.startswith(units.bom) else 0
        route = self.routes.of(t.path)
        chunk = self.lines.frame(data, n, self.clock.time_ms(), records, units, skip,
                                 route.meta if self.container is not None else None,
                                 newlines=newlines)
        chunk.continued = continued
        if self.routes.by_line:
            res = self._append_by_line(t, chunk)
        else:
            if route.key is not None:
                chunk.keys = [route.key[:MAX_KEY_BYTES]] * len(chunk)
            res = self.pool.append(route.topic, chunk, source=t.source_id,
                                   source_start=t.offset)
            if res.records and route.fallback:
                self.lines.bad("routed_to_fallback", res.records)
            if res.records and route.key_unmatched:
                self.lines.bad("key_template_unmatched", res.records)
        end = res.end if res.records or not skip else 0     # not past a mark nothing covers
        if end:
            t.tail = (t.tail + data[max(0, end - TAIL_BYTES):end])[-TAIL_BYTES:]
        if forced and res.complete(chunk):
            added = len(units.newline) if units else 1
            end -= added                  # the newline we added is not in the file
            t.tail = t.tail[:-added]
        t.offset += end
        if end and len(t.tail) >= min(anchors.SPAN, t.offset):
            # What was read, not what the file holds by the time it is sealed (a truncation
            # and new content meanwhile would make a false anchor).
            t.handed.append((t.offset, zlib.crc32(t.tail[-anchors.SPAN:])))
        stats.bytes += end
        stats.events += res.records
        self.metrics.inc("agent_source_read_bytes_total", end, topic=route.topic)
        self.metrics.inc("agent_source_read_events_total", res.records - res.dropped,
                         topic=route.topic)
        return end, res.complete(chunk)

    def _append_by_line(self, t: Tracked, chunk: Chunk) -> AppendResult:
        """``chunk``'s records, each to the topic (and with the key) its line's fields make,
        one topic after another in the order they first come: each topic's records are one
        chunk of their own, placed at their lines in the file, so a topic's slot spans the
        other topics' lines between its records too; the pool keeps a sealed end below what
        another topic's slot still fills and below the first line of a topic not yet appended
        (``pending``), so no checkpoint passes a line in no sealed slot. What the chunk's
        first record not appended (the pool full) and everything after it is read again: the
        records of the topics appended before it that lie after it go twice. The result as
        ``BufferPool.append`` gives it, for the whole chunk."""
        n = len(chunk)
        values = [chunk.value(i) for i in range(n)]
        topics, keys, to_fallback, unmatched, not_json = self.routes.of_lines(t.path, values)

        def pos(i: int) -> int:
            return chunk.source_pos(i) if i < n else chunk.source_end

        out = AppendResult()
        left = n
        for topic, idx, later in topic_groups(topics):
            at = np.fromiter((pos(i) for i in idx), np.int64, len(idx))
            part = Chunk.of_values([values[i] for i in idx], chunk.timestamps[idx],
                                   [None if keys[i] is None else keys[i][:MAX_KEY_BYTES]
                                    for i in idx] if keys is not None else None,
                                   at=at - at[0], at_end=pos(idx[-1] + 1) - int(at[0]))
            res = self.pool.append(topic, part, source=t.source_id,
                                   source_start=t.offset + int(at[0]),
                                   pending=t.offset + pos(later))
            out.dropped += res.dropped
            if res.records < len(idx):
                left = min(idx[res.records], later)
                break
        # Cut short (the pool full): the lines from ``left`` on are in no slot, though records
        # of topics appended before lie past them; no slot may seal past them until a later
        # hand-over has them all in (as journald's source keeps it).
        self.pool.pending(t.source_id, None if left == n else t.offset + pos(left))
        out.records, out.end = left, pos(left)
        for kind, flags in (("routed_to_fallback", to_fallback), ("key_template_unmatched",
                                                                  unmatched),
                            ("line_not_json", not_json)):
            count = sum(flags[:left])
            if count:
                self.lines.bad(kind, count)
        return out


def _last_end(data: bytes, units: Units | None) -> int:
    """Where the last whole line of ``data`` ends (after its newline); 0 without one."""
    return units.last_end(data) if units else data.rfind(b"\n") + 1


def _cut_points(firsts: np.ndarray, starts: np.ndarray, n: int, limit: int) -> list[int]:
    """Line starts where an event longer than ``limit`` bytes is cut (none for most reads):
    each part ends at the last line end within ``limit`` bytes of its start, or after its
    first line when that line alone is longer."""
    bounds = np.append(firsts, n)
    if not len(firsts) or int(np.diff(bounds).max()) <= limit:
        return []
    cuts = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        while b - a > limit:
            i = int(np.searchsorted(starts, a + limit, "right")) - 1   # last line start <= limit
            c = int(starts[i]) if int(starts[i]) > a else \
                (int(starts[i + 1]) if i + 1 < len(starts) and starts[i + 1] < b else b)
            if c >= b:
                break
            cuts.append(c)
            a = c
    return cuts
