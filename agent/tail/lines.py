"""Bytes into records, for every source: where lines end, where one is cut, what is odd in them.

The file reader and the socket source hand their bytes here; both cut a runaway line at
``MAX_LINE_BYTES`` and count the same oddities under ``agent_source_bad_input_total``.

A line's bytes are walked twice between the read and the pool:

1. one comparison over the whole read finds every byte <= 0x0A: the newlines (where records end)
   and, among the few others, the NUL bytes (which lines hold binary);
2. one UTF-8 check: over the whole read when no event fields are named (an ASCII or valid read
   costs one pass; only a read that fails is looked at line by line), or per line while the
   event's fields are parsed (the line is decoded once, and the JSON read from that text).

Framing into the slot (CRC and copy, ``buffer.framing``) is the pool's, after these.

UTF-16 and UTF-32 (``Units``) write every character, the newline too, as code units of two or
four bytes: a line ends at a newline *unit* on a unit boundary counted from the file's first
byte, never at a byte 0x0A inside another character. Their records are found among the units,
then transcoded to UTF-8 like any other codec's; a byte order mark at the file's start belongs
to no record, and ``utf-16``/``utf-32`` take the file's byte order from it (little-endian when a
file has none).
"""

from __future__ import annotations

import codecs

import numpy as np

from ..buffer import Chunk
from ..config import CONTAINER_FORMATS, WIDE_ENCODINGS, SourceConfig
from ..telemetry import Metrics
from .container import Framing
from .events import apply_fields

MAX_LINE_BYTES = 64 << 20     # a line longer than this is cut here (counted as line_forced)

NUL, LF, CR = 0, 10, 13


class Units:
    """The code units of a wide encoding in one byte order: where its lines end."""

    def __init__(self, codec: str):
        self.codec = codec                        # with its byte order: utf-16-le, ...
        self.width = WIDE_ENCODINGS[codec]
        self.dtype = np.dtype(("<" if codec.endswith("-le") else ">") + f"u{self.width}")
        self.newline = "\n".encode(codec)
        self.bom = "\ufeff".encode(codec)

    def newlines(self, data: bytes, n: int) -> np.ndarray:
        """Where each newline unit of ``data[:n]`` begins (a byte position), ascending."""
        units = np.frombuffer(data, self.dtype, n // self.width)
        return np.flatnonzero(units == LF) * self.width

    def last_end(self, data: bytes) -> int:
        """Where the last whole line of ``data`` ends (after its newline); 0 without one."""
        found = self.newlines(data, len(data))
        return int(found[-1]) + self.width if len(found) else 0

    def first_end(self, data: bytes) -> int:
        """Where the first line of ``data`` ends (after its newline); 0 without one."""
        units = np.frombuffer(data, self.dtype, len(data) // self.width)
        at = int(np.argmax(units == LF)) if len(units) else 0
        return (at + 1) * self.width if len(units) and units[at] == LF else 0

    def whole(self, n: int) -> int:
        """``n`` bytes cut back to whole units."""
        return n - n % self.width

    def lines(self, data: bytes, n: int, skip: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Starts and ends (newline excluded) of the whole lines of ``data[:n]``, the first
        starting at ``skip`` (after a byte order mark)."""
        newlines = self.newlines(data, n)
        starts = np.empty(len(newlines), np.int64)
        starts[:1] = skip
        starts[1:] = newlines[:-1] + self.width
        return starts, newlines.astype(np.int64)


class LineCutter:
    """Cuts one source's bytes into chunks of records and counts its oddities by kind."""

    def __init__(self, cfg: SourceConfig, metrics: Metrics, cutter=None, flush_ms: int = 1000):
        self.cfg = cfg
        self.metrics = metrics
        self.max_line_bytes = MAX_LINE_BYTES
        name = codecs.lookup(cfg.encoding).name
        self.codec = None if name == "utf-8" else name      # records transcoded from it
        self.wide = name if name in WIDE_ENCODINGS else None
        self._orders = {c: Units(c) for c in (f"{name}-le", f"{name}-be")} \
            if name in ("utf-16", "utf-32") else {name: Units(name)} if self.wide else {}
        # A container runtime's framing (``cutter``: the source's multiline rule, applied to
        # the runtime's entries; ``flush_ms``: how long an entry or event may stay open).
        self.container = Framing(cfg.format, cutter, flush_ms) if cfg.format in CONTAINER_FORMATS \
            else None

    @property
    def rewrites(self) -> bool:
        """Whether records are made from the source's bytes rather than being them
        (transcoded, or a container runtime's framing removed)."""
        return self.codec is not None or self.container is not None

    def units(self, head: bytes) -> Units | None:
        """The code units of a file whose first bytes are ``head`` (its byte order from its
        byte order mark, for ``utf-16`` and ``utf-32``); None for an encoding whose newline is
        the byte 0x0A."""
        if not self.wide:
            return None
        if len(self._orders) == 1:
            return next(iter(self._orders.values()))
        be = self._orders[f"{self.wide}-be"]
        return be if head.startswith(be.bom) else self._orders[f"{self.wide}-le"]

    def bad(self, kind: str, count: int = 1) -> None:
        self.metrics.inc("agent_source_bad_input_total", count, kind=kind, topic=self.cfg.label)

    def force(self, data: bytes, kind: str, units: Units | None = None) -> bytes:
        """A line the agent ends itself (``line_forced`` at the cap, ``partial_line_flushed``
        when its writer stopped): its bytes with a newline added, counted under ``kind``."""
        self.bad(kind)
        return data + (units.newline if units else b"\n")

    def split_stream(self, pending: bytes) -> tuple[bytes | None, bytes]:
        """For a stream (the socket): the whole lines at the front of ``pending`` (None when
        there is none yet) and the rest. A line reaching the cap with no newline is cut there."""
        last = pending.rfind(b"\n")
        if last >= 0:
            return pending[:last + 1], pending[last + 1:]
        cap = self.max_line_bytes
        if len(pending) >= cap:
            return self.force(pending[:cap], "line_forced"), pending[cap:]
        return None, pending

    def frame(self, data: bytes, end: int, read_ms: int,
              records: np.ndarray | None = None, units: Units | None = None,
              skip: int = 0, meta: dict | None = None,
              newlines: np.ndarray | None = None) -> Chunk:
        """The records of ``data[:end]`` (whole lines: ``data[end - 1]`` is a newline), with
        their event times and keys when the source names the fields; oddities counted.
        ``records``: where each record begins when a record is more than one line (multiline
        events, ascending, the first at 0); each then ends with the last line before the
        next. ``units``: a wide encoding's (``skip``: the byte order mark's bytes before the
        first line). ``meta``: with a container runtime's framing, the fields its file's
        path holds (container.py). ``newlines``: every newline of ``data[:end]``, ascending,
        when the caller found them already (the multiline path): not looked for again."""
        if units is not None:
            chunk = self._wide_lines(data, end, read_ms, units, skip)
        else:
            buf = np.frombuffer(data, np.uint8, end)
            if newlines is None:
                low = np.flatnonzero(buf <= LF)                      # walk 1
                newlines = low[buf[low] == LF] if len(low) else low
                nuls = low[buf[low] == NUL] if len(low) > len(newlines) else None
            else:
                nuls = np.flatnonzero(buf == NUL) if data.find(b"\0", 0, end) >= 0 else None
            chunk = Chunk.from_newlines(buf, newlines, read_ms)
            self._count_shapes(buf, chunk, newlines, nuls)
        if records is not None and len(records) != len(chunk):
            chunk = _joined(chunk, records, read_ms)
        invalid = 0
        if self.container is not None:
            chunk, unframed, invalid, unfinished = self.container.records(chunk, meta or {},
                                                                          read_ms)
            if unframed:
                self.bad("container_unparsable", unframed)
            if unfinished:
                self.bad("container_entry_unfinished", unfinished)
        elif self.codec is not None:
            chunk, replaced = _transcoded(chunk, units.codec if units else self.codec)
            if replaced:
                self.bad("invalid_encoding", replaced)
        if self.cfg.timestamp_field or self.cfg.key_field:           # walk 2, per line
            chunk, unparsable, not_utf8 = apply_fields(chunk, self.cfg.timestamp_field,
                                                       self.cfg.key_field)
            invalid += not_utf8
            if unparsable:
                self.bad("timestamp_unparsable", unparsable)
        elif self.codec is None and self.container is None:          # walk 2, whole read
            invalid = 0 if _valid_utf8(data, end) else _invalid_lines(chunk)
        if invalid:
            self.bad("invalid_utf8", invalid)
        return chunk

    def _wide_lines(self, data: bytes, end: int, read_ms: int, units: Units,
                    skip: int) -> Chunk:
        """A wide encoding's lines as records (in the source's bytes; a CR unit before the
        newline not part of one), its empty, CRLF and NUL-holding lines counted."""
        starts, ends = units.lines(data, end, skip)
        codes = np.frombuffer(data, units.dtype, end // units.width)
        w = units.width
        cr = (ends > starts) & (codes[np.maximum(ends // w - 1, 0)] == CR)
        if len(ends):
            if int(np.count_nonzero(cr)):
                self.bad("crlf_line", int(np.count_nonzero(cr)))
            ends = ends - cr * w
            empty = int(np.count_nonzero(ends == starts))
            if empty:
                self.bad("empty_line", empty)
            nuls = np.flatnonzero(codes == NUL) * w
            if len(nuls):
                self.bad("binary_nul", len(np.unique(np.searchsorted(ends, nuls))))
        return Chunk(np.frombuffer(data, np.uint8, end), starts, ends - starts, read_ms, None,
                     end)

    def _count_shapes(self, buf: np.ndarray, chunk: Chunk, newlines: np.ndarray,
                      nuls: np.ndarray | None) -> None:
        """Empty lines, CRLF endings and lines holding NUL bytes (``nuls``: where the NUL
        bytes are, None for none)."""
        if not len(chunk):
            return
        empty = int(np.count_nonzero(chunk.lengths == 0))
        if empty:
            self.bad("empty_line", empty)
        crlf = int(np.count_nonzero(buf[chunk.ends] == CR))     # a CRLF record ends at its CR
        if crlf:
            self.bad("crlf_line", crlf)
        if nuls is not None and len(nuls):
            self.bad("binary_nul", len(np.unique(np.searchsorted(newlines, nuls))))


def _joined(lines: Chunk, records: np.ndarray, read_ms: int) -> Chunk:
    """``lines`` joined into records beginning at ``records``: each runs to the end of the
    last line before the next (its newlines inside, its own last terminator not)."""
    first = np.searchsorted(lines.starts, records)       # the first at 0: at a mark's end
    last = np.append(first[1:], len(lines)) - 1
    starts, ends = lines.starts[first], lines.ends[last]
    return Chunk(lines.data, starts, ends - starts, read_ms, None, lines.end)


def _transcoded(chunk: Chunk, codec: str) -> tuple[Chunk, int]:
    """``chunk``'s records decoded from ``codec`` and written as UTF-8 (bytes it cannot
    decode replaced by U+FFFD); where each starts in the source's bytes kept in ``at``.
    Returns the new chunk and how many records had bytes replaced."""
    out, replaced = [], 0
    data = chunk.data
    for s, n in zip(chunk.starts.tolist(), chunk.lengths.tolist(), strict=True):
        text = bytes(data[s:s + n]).decode(codec, errors="replace")
        if "\ufffd" in text:
            replaced += 1
        out.append(text.encode("utf-8"))
    ts = chunk.uniform_ts if chunk.uniform_ts is not None else chunk.timestamps
    return Chunk.of_values(out, ts, continued=chunk.continued, at=chunk.starts.copy(),
                           at_end=chunk.end), replaced


def _valid_utf8(data: bytes, end: int) -> bool:
    if end == len(data):
        if data.isascii():
            return True
        try:
            data.decode("utf-8")
            return True
        except UnicodeDecodeError:
            return False
    try:
        str(memoryview(data)[:end], "utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _invalid_lines(chunk: Chunk) -> int:
    """Lines that are not UTF-8 (only for a read that failed the whole check)."""
    bad = 0
    for i in range(len(chunk)):
        try:
            chunk.value(i).decode("utf-8")
        except UnicodeDecodeError:
            bad += 1
    return bad
