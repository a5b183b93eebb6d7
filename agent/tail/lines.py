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
"""

from __future__ import annotations

import codecs

import numpy as np

from ..buffer import Chunk
from ..config import SourceConfig
from ..telemetry import Metrics
from .events import apply_fields

MAX_LINE_BYTES = 64 << 20     # a line longer than this is cut here (counted as line_forced)

NUL, LF, CR = 0, 10, 13


class LineCutter:
    """Cuts one source's bytes into chunks of records and counts its oddities by kind."""

    def __init__(self, cfg: SourceConfig, metrics: Metrics):
        self.cfg = cfg
        self.metrics = metrics
        self.max_line_bytes = MAX_LINE_BYTES
        name = codecs.lookup(cfg.encoding).name
        self.codec = None if name == "utf-8" else name      # records transcoded from it

    def bad(self, kind: str, count: int = 1) -> None:
        self.metrics.inc("agent_source_bad_input_total", count, kind=kind, topic=self.cfg.topic)

    def force(self, data: bytes, kind: str) -> bytes:
        """A line the agent ends itself (``line_forced`` at the cap, ``partial_line_flushed``
        when its writer stopped): its bytes with a newline added, counted under ``kind``."""
        self.bad(kind)
        return data + b"\n"

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
              records: np.ndarray | None = None) -> Chunk:
        """The records of ``data[:end]`` (whole lines: ``data[end - 1]`` is a newline), with
        their event times and keys when the source names the fields; oddities counted.
        ``records``: where each record begins when a record is more than one line (multiline
        events, ascending, the first at 0); each then ends with the last line before the
        next."""
        buf = np.frombuffer(data, np.uint8, end)
        low = np.flatnonzero(buf <= LF)                              # walk 1
        newlines = low[buf[low] == LF] if len(low) else low
        chunk = Chunk.from_newlines(buf, newlines, read_ms)
        self._count_shapes(buf, chunk, newlines, low)
        if records is not None and len(records) != len(chunk):
            chunk = _joined(chunk, records, read_ms)
        invalid = 0
        if self.codec is not None:
            chunk, replaced = _transcoded(chunk, self.codec)
            if replaced:
                self.bad("invalid_encoding", replaced)
        if self.cfg.timestamp_field or self.cfg.key_field:           # walk 2, per line
            chunk, unparsable, invalid = apply_fields(chunk, self.cfg.timestamp_field,
                                                      self.cfg.key_field, read_ms)
            if unparsable:
                self.bad("timestamp_unparsable", unparsable)
        elif self.codec is None:                                     # walk 2, whole read
            invalid = 0 if _valid_utf8(data, end) else _invalid_lines(chunk)
        if invalid:
            self.bad("invalid_utf8", invalid)
        return chunk

    def _count_shapes(self, buf: np.ndarray, chunk: Chunk, newlines: np.ndarray,
                      low: np.ndarray) -> None:
        """Empty lines, CRLF endings and lines holding NUL bytes: from what walk 1 found."""
        if not len(chunk):
            return
        empty = int(np.count_nonzero(chunk.lengths == 0))
        if empty:
            self.bad("empty_line", empty)
        crlf = int(np.count_nonzero(buf[chunk.ends] == CR))     # a CRLF record ends at its CR
        if crlf:
            self.bad("crlf_line", crlf)
        if len(low) > len(newlines):
            nuls = low[buf[low] == NUL]
            if len(nuls):
                self.bad("binary_nul", len(np.unique(np.searchsorted(newlines, nuls))))


def _joined(lines: Chunk, records: np.ndarray, read_ms: int) -> Chunk:
    """``lines`` joined into records beginning at ``records``: each runs to the end of the
    last line before the next (its newlines inside, its own last terminator not)."""
    first = np.searchsorted(lines.starts, records)
    last = np.append(first[1:], len(lines)) - 1
    ends = lines.ends[last]
    return Chunk(lines.data, records, ends - records, read_ms, None, lines.end)


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
    lengths = np.fromiter(map(len, out), np.int64, len(out))
    starts = np.zeros(len(out), np.int64)
    np.cumsum(lengths[:-1] + 1, out=starts[1:])
    joined = b"\n".join(out) + b"\n" if out else b""
    ts = chunk.uniform_ts if chunk.uniform_ts is not None else chunk.timestamps
    return Chunk(joined, starts, lengths, ts, None, len(joined), chunk.continued,
                 at=chunk.starts.copy(), at_end=chunk.end), replaced


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
