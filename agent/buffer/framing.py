"""Framing records into a slot's payload, in bulk, and reading them back.

A *chunk* is what a source hands the pool: the bytes as read plus, per record, its start, its
length (without the line terminator) and its event time. Finding the records in the bytes is
vectorised (``Chunk.from_lines``); framing writes one *block* per run of records that fits::

    Block (8-byte aligned)
        magic       u32   "BLCK"
        n           u32   records in the block
        flags       u16   bit 0: keys present; bit 1: its one record continues an event
                          cut at ``multiline.max_event_bytes`` (header ``docket-continued``);
                          bit 2: its records came from a source that cannot give them again
                          (a listener): a crash keeps them from a filling slot
        part_index  u16   for one part of a split oversized line: its index, and
        part_count  u16   the number of parts (0/0 for whole records)
        pad         u16
        data_len    u32   bytes of the data area
        keys_len    u32   bytes of the key area
        ts          i64[n]  event time, ms since the epoch
        length      u32[n]  value length
        offset      u32[n]  value offset in the data area
        [key_length u16[n] (0xFFFF: no key), padded to 8; keys, padded to 8]   when flags bit 0
        data        the chunk's bytes from the first record's start to the last record's end,
                    terminators included but not referenced; padded to 8

Every array above is written with one numpy assignment; nothing loops per record.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from crc32c import crc32c

from .errors import PoolCorrupt

BLOCK_MAGIC = 0x4B434C42          # b"BLCK"
HAS_KEYS = 1
CONTINUED = 2
ONCE = 4
NO_KEY = 0xFFFF
BLOCK_HEADER = np.dtype([
    ("magic", "<u4"), ("n", "<u4"), ("flags", "<u2"), ("part_index", "<u2"),
    ("part_count", "<u2"), ("pad", "<u2"), ("data_len", "<u4"), ("keys_len", "<u4"),
])
BLOCK_HEADER_BYTES = BLOCK_HEADER.itemsize      # 24
_BLOCK_HEADER_STRUCT = struct.Struct("<IIHHHHII")
assert _BLOCK_HEADER_STRUCT.size == BLOCK_HEADER_BYTES
PER_RECORD_BYTES = 16                            # ts + length + offset
MAX_KEY_BYTES = NO_KEY - 1


def pad8(n):
    return (n + 7) & ~7


@dataclass
class Chunk:
    """Records to append: the bytes as read, and where each record lies in them."""

    data: np.ndarray                 # uint8, 1-D
    starts: np.ndarray               # int64, record start offsets in data
    lengths: np.ndarray              # int64, record lengths, terminators excluded
    timestamps: np.ndarray           # int64 event times (ms), one per record
    keys: Sequence[bytes | None] | None = None
    end: int | None = None           # bytes of data this chunk accounts for (default: all)
    continued: bool = False          # its first record continues an event cut before it
    # Where each record starts, and where the chunk ends, in the source's own bytes when
    # ``data`` is not those bytes (a source transcoded to UTF-8); None: the same as in data.
    at: np.ndarray | None = None
    at_end: int | None = None

    def __post_init__(self):
        self.data = np.frombuffer(self.data, np.uint8) if not isinstance(self.data, np.ndarray) \
            else self.data
        self.starts = np.asarray(self.starts, np.int64)
        self.lengths = np.asarray(self.lengths, np.int64)
        ts = np.asarray(self.timestamps, np.int64)
        # One time for all records (the read time): min/max need no scan.
        self.uniform_ts = int(ts) if ts.ndim == 0 else None
        self.timestamps = np.full(len(self.starts), ts, np.int64) if ts.ndim == 0 else ts
        if self.end is None:
            self.end = len(self.data)
        if not (len(self.starts) == len(self.lengths) == len(self.timestamps)):
            raise ValueError("starts, lengths and timestamps must have one entry per record")
        if self.keys is not None and len(self.keys) != len(self.starts):
            raise ValueError("keys must have one entry per record")

    def __len__(self) -> int:
        return len(self.starts)

    def source_pos(self, i: int) -> int:
        """Where record ``i`` starts in the source's bytes (the checkpoint before it)."""
        return int(self.starts[i] if self.at is None else self.at[i])

    @property
    def source_end(self) -> int:
        """Where the chunk ends in the source's bytes."""
        return self.end if self.at_end is None else self.at_end

    @property
    def ends(self) -> np.ndarray:
        return self.starts + self.lengths

    def value(self, i: int) -> bytes:
        s = int(self.starts[i])
        return self.data[s:s + int(self.lengths[i])].tobytes()

    @classmethod
    def from_lines(cls, data, timestamp_ms, keys=None) -> Chunk:
        """Records = the newline-terminated lines of ``data``; a trailing partial line is left
        out (``end`` stops before it). A CR before the LF is not part of the record."""
        buf = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
        return cls.from_newlines(buf, np.flatnonzero(buf == 10), timestamp_ms, keys)

    @classmethod
    def of_values(cls, values: Sequence[bytes], timestamp_ms, keys=None, **rest) -> Chunk:
        """Records = ``values`` (made by the caller, not as read), written one after another,
        each followed by a newline; ``rest``: the other fields (``continued``, ``at``, ...)."""
        lengths = np.fromiter(map(len, values), np.int64, len(values))
        starts = np.zeros(len(values), np.int64)
        np.cumsum(lengths[:-1] + 1, out=starts[1:])
        data = b"\n".join(values) + b"\n" if values else b""
        return cls(data, starts, lengths, timestamp_ms, keys, len(data), **rest)

    @classmethod
    def from_newlines(cls, buf: np.ndarray, newlines: np.ndarray, timestamp_ms,
                      keys=None) -> Chunk:
        """``from_lines`` with the newlines' positions already found (ascending)."""
        starts = np.empty(len(newlines), np.int64)
        starts[:1] = 0
        starts[1:] = newlines[:-1] + 1
        ends = newlines.astype(np.int64)
        if len(ends):
            before = np.maximum(ends - 1, 0)
            cr = (buf[before] == 13) & (ends > starts)
            ends = ends - cr
        end = int(newlines[-1]) + 1 if len(newlines) else 0
        return cls(buf, starts, ends - starts, timestamp_ms, keys, end)


def block_bytes(n: int, data_len: int, keys_len: int = 0, keyed: bool = False) -> int:
    size = BLOCK_HEADER_BYTES + PER_RECORD_BYTES * n + pad8(data_len)
    if keyed:
        size += pad8(2 * n) + pad8(keys_len)
    return size


class BlockPlanner:
    """Answers, for a chunk, how many records from index ``a`` fit in ``space`` bytes.

    cost(a, b) = (c[b] - c[a]) + header + padding, with c[k] = bytes of the first k records'
    columns + the data span up to record k's end; c grows with k, so a binary search finds b.
    """

    def __init__(self, chunk: Chunk):
        n = len(chunk)
        self.keyed = chunk.keys is not None
        self.per = PER_RECORD_BYTES + (2 if self.keyed else 0)
        self.starts = chunk.starts
        self.cum_keys = None
        # c_end[b-1]: cost of the records before b, up to the end of record b-1's value.
        self.c_end = np.arange(self.per, self.per * (n + 1), self.per, dtype=np.int64)
        self.c_end += chunk.starts
        self.c_end += chunk.lengths
        if self.keyed:
            key_lens = np.array([0 if k is None else len(k) for k in chunk.keys], np.int64)
            self.cum_keys = np.concatenate(([0], np.cumsum(key_lens)))
            self.c_end += self.cum_keys[1:]
        self.fixed = BLOCK_HEADER_BYTES + (7 + 7 + 7 if self.keyed else 7)

    def fit(self, a: int, limit: int, space: int) -> int:
        """Largest b in [a, limit] such that records [a, b) fit in ``space`` bytes."""
        c_start = self.per * a + int(self.starts[a])     # cost before record a
        if self.keyed:
            c_start += int(self.cum_keys[a])
        budget = space - self.fixed + c_start
        return int(np.searchsorted(self.c_end[a:limit], budget, side="right")) + a


def write_block(dest: np.ndarray, at: int, chunk: Chunk, a: int, b: int, crc: int,
                part: tuple[int, int] = (0, 0),
                value_slice: tuple[int, int] | None = None,
                flags: int = 0) -> tuple[int, int]:
    """Frame records [a, b) of ``chunk`` into ``dest`` at offset ``at``.

    Returns the block's size and ``crc`` continued over the block's bytes. The data area's CRC is
    taken from the chunk before the copy: the same bytes, and the copy then reads them from cache.
    ``value_slice`` (start, length), for a single record, frames only that part of its value:
    one part of a split line, or the kept head of a truncated one.
    """
    n = b - a
    if value_slice is None:
        starts, lengths = chunk.starts[a:b], chunk.lengths[a:b]
        span_start = int(starts[0])
        span_end = int(starts[-1]) + int(lengths[-1])
        offsets = starts
    else:
        span_start, length = value_slice
        span_end = span_start + length
        lengths = np.array([length], np.int64)
        offsets = np.array([span_start], np.int64)
    data_len = span_end - span_start
    keyed = chunk.keys is not None
    keys = [chunk.keys[i] for i in range(a, b)] if keyed else []
    key_blob = b"".join(k for k in keys if k is not None)
    size = block_bytes(n, data_len, len(key_blob), keyed)

    _BLOCK_HEADER_STRUCT.pack_into(dest.data, at, BLOCK_MAGIC, n,
                                   flags | (HAS_KEYS if keyed else 0),
                                   part[0], part[1], 0, data_len, len(key_blob))
    o = at + BLOCK_HEADER_BYTES
    if chunk.uniform_ts is not None:
        dest[o:o + 8 * n].view("<i8").fill(chunk.uniform_ts)
    else:
        dest[o:o + 8 * n].view("<i8")[:] = chunk.timestamps[a:b]
    o += 8 * n
    dest[o:o + 4 * n].view("<u4")[:] = lengths
    o += 4 * n
    np.subtract(offsets, span_start, out=dest[o:o + 4 * n].view("<u4"), casting="unsafe")
    o += 4 * n
    if keyed:
        dest[o:o + 2 * n].view("<u2")[:] = [NO_KEY if k is None else len(k) for k in keys]
        o += pad8(2 * n)
        dest[o:o + len(key_blob)] = np.frombuffer(key_blob, np.uint8)
        o += pad8(len(key_blob))
    crc = crc32c(dest[at:o], crc)
    source = chunk.data[span_start:span_end]
    crc = crc32c(source, crc)
    dest[o:o + data_len] = source
    o += data_len
    tail = at + size
    if tail > o:
        dest[o:tail] = 0          # padding is deterministic, so the CRC is too
        crc = crc32c(dest[o:tail], crc)
    return size, crc


@dataclass
class Block:
    """One framed block, read back as views over the payload (no copies)."""

    timestamps: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray          # absolute offsets of the values within the payload
    keys: list[bytes | None] | None
    part_index: int
    part_count: int
    payload: np.ndarray
    continued: bool = False      # its record continues an event cut before it (CONTINUED)

    def __len__(self) -> int:
        return len(self.lengths)

    def value(self, i: int) -> memoryview:
        o = int(self.offsets[i])
        return memoryview(self.payload[o:o + int(self.lengths[i])])


def block_spans(payload: np.ndarray, at: int = 0) -> Iterator[tuple[int, int, np.void]]:
    """(offset, size, header) of each block of ``payload`` (the used bytes only), in order,
    from the one at byte ``at`` on."""
    end = len(payload)
    while at < end:
        if at + BLOCK_HEADER_BYTES > end:
            raise PoolCorrupt(f"block header at {at} runs past the payload end {end}")
        h = payload[at:at + BLOCK_HEADER_BYTES].view(BLOCK_HEADER)[0]
        if int(h["magic"]) != BLOCK_MAGIC:
            raise PoolCorrupt(f"no block magic at payload offset {at}")
        size = block_bytes(int(h["n"]), int(h["data_len"]), int(h["keys_len"]),
                           bool(h["flags"] & HAS_KEYS))
        if at + size > end:
            raise PoolCorrupt(f"block at {at} of {size} bytes runs past the payload end {end}")
        yield at, size, h
        at += size


def iter_blocks(payload: np.ndarray, start: int = 0) -> Iterator[Block]:
    """Walk the blocks of a sealed payload (``payload`` = the used bytes only), from the one
    at byte ``start`` on."""
    for at, _size, h in block_spans(payload, start):
        n, data_len, keys_len = int(h["n"]), int(h["data_len"]), int(h["keys_len"])
        keyed = bool(h["flags"] & HAS_KEYS)
        o = at + BLOCK_HEADER_BYTES
        ts = payload[o:o + 8 * n].view("<i8")
        o += 8 * n
        lengths = payload[o:o + 4 * n].view("<u4")
        o += 4 * n
        offsets = payload[o:o + 4 * n].view("<u4")
        o += 4 * n
        keys = None
        if keyed:
            key_lens = payload[o:o + 2 * n].view("<u2")
            o += pad8(2 * n)
            keys, ko = [], o
            for kl in key_lens.tolist():
                if kl == NO_KEY:
                    keys.append(None)
                else:
                    keys.append(payload[ko:ko + kl].tobytes())
                    ko += kl
            o += pad8(keys_len)
        if n and int((offsets.astype(np.int64) + lengths).max()) > data_len:
            raise PoolCorrupt(f"a record of the block at {at} points past its data")
        yield Block(ts, lengths, offsets.astype(np.int64) + o, keys,
                    int(h["part_index"]), int(h["part_count"]), payload,
                    bool(h["flags"] & CONTINUED))
