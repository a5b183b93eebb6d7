"""Appending: chunks of records framed into the filling slot of their topic, a free slot taken (or
space made: spill, drop_oldest, waiting), oversized records split, truncated or dropped.

A part of ``BufferPool`` (``pool.py``), as a mixin: the state it works on is the pool's,
set up in ``BufferPool.__init__``.
"""

from __future__ import annotations

import numpy as np

from . import layout as L
from .framing import (
    BLOCK_HEADER_BYTES,
    CONTINUED,
    ONCE,
    PER_RECORD_BYTES,
    BlockPlanner,
    Chunk,
    write_block,
)
from .slots import (
    AppendResult,
    DropEvent,
    Filling,
    SealedSlot,
)
from .spill import SlotMeta


class PoolWriter:
    # -- appending -----------------------------------------------------------------------------
    def append(self, topic: str, chunk: Chunk, source: int | None = None, source_start: int = 0,
               timeout_s: float = 0.0, once: bool = False,
               pending: int | None = None, parts_done: int = 0) -> AppendResult:
        """Frame ``chunk``'s records into slots of ``topic``.

        Returns how far it got. Fewer records than the chunk holds means the pool was full for
        ``timeout_s`` (policy ``block``): the caller keeps the rest, from ``result.end``, and
        tries again later — the data waits in the source. ``once``: the source cannot give
        these records again (a listener's): a crash before their slot is sealed keeps them
        (the slot's kept prefix, ``recovery.py``), where a file's are read again.
        ``pending``: the first position of ``source`` whose records the caller has not yet
        handed over, this chunk's aside (``pending()``, set for the call): a slot sealed
        meanwhile ends at or below it and at or below this chunk's first record not yet
        written, so one that fills within the chunk covers its own records; after the call the
        source's pending position stays at the lower of the two. ``parts_done``: the chunk's
        first record is one longer than a slot whose first parts an earlier call sealed
        before the pool stayed full (``result.parts``): they are not appended again.
        """
        tb = topic.encode()
        if not tb or len(tb) > L.MAX_TOPIC_BYTES:
            raise ValueError(f"topic must be 1..{L.MAX_TOPIC_BYTES} bytes: {topic!r}")
        n = len(chunk)
        result = AppendResult()
        if n == 0:
            result.end = chunk.source_end
            return result
        planner = BlockPlanner(chunk)
        limits = self._value_limits(chunk)
        oversized = np.flatnonzero(chunk.lengths > limits).tolist()
        oversized.append(n)
        continued = chunk.continued and oversized[0] != 0      # record 0: a block of its own
        kept = ONCE if once else 0
        tracked = pending is not None and source is not None

        def handed(a: int) -> None:           # the source's records from ``a`` on: in no slot
            if tracked:
                self._pending[source] = min(pending, source_start + (
                    chunk.source_pos(a) if a < n else chunk.source_end))

        with self._lock:
            self._raise_seal_error()
            if tracked:                 # handed to several topics: none is sent filling
                self._close_early_first()
            a, next_big = 0, 0
            handed(a)
            while a < n:
                if a == oversized[next_big]:
                    cap = int(limits if chunk.keys is None else limits[a])
                    if not self._append_oversized(topic, chunk, a, cap, source,
                                                  source_start, result, timeout_s, kept,
                                                  parts_done if a == 0 else 0, handed):
                        break
                    next_big += 1
                    a += 1
                    handed(a)
                    continue
                limit = 1 if continued and a == 0 else oversized[next_big]
                fill = self._filling_for(topic, tb, source, timeout_s, bool(kept))
                if fill is None:
                    break
                space = self.geometry.payload_bytes - fill.used
                b = planner.fit(a, limit, space)
                if b == a:
                    self._seal(topic)
                    continue
                self._write(fill, chunk, a, b, source, source_start,
                            chunk.source_pos(b) if b < n else chunk.source_end,
                            flags=kept | (CONTINUED if continued and a == 0 else 0))
                a = b
                handed(a)
                if self.geometry.payload_bytes - fill.used < \
                        BLOCK_HEADER_BYTES + PER_RECORD_BYTES + 8:
                    self._seal(topic)
            result.records = a
            result.end = chunk.source_end if a == n else chunk.source_pos(a)
            self.counters["records_appended"] += a - result.dropped
        return result

    def _value_limits(self, chunk: Chunk) -> int | np.ndarray:
        """The largest value each record of ``chunk`` may have to fit an empty slot alone,
        its own key beside it: what the block planner counts for a keyed block (its paddings
        at their most, and the key's length column) taken off. Each record's own: a record
        split by one call and gone on with by the next (a chunk without the records before
        it) is cut at the same bytes."""
        if chunk.keys is None:
            return self.max_value_bytes
        keys = np.fromiter((0 if k is None else len(k) for k in chunk.keys), np.int64,
                           len(chunk.keys))
        return self.max_value_bytes - 16 - (keys + 7) // 8 * 8

    def _filling_for(self, topic: str, tb: bytes, source: int | None,
                     timeout_s: float, once: bool = False) -> Filling | None:
        """The topic's filling slot, opened when there is none (``once``: for records a
        crash keeps, which a slot sent while it fills does not take: ``sending.py``)."""
        fill = self._current.get(topic)
        if fill is None:
            self._close_early_first(topic)      # a second slot filling: one at a time
        if fill is not None:
            expired = self._due(fill, self.clock.monotonic_ns()) or (once and fill.early)
            full_sources = source is not None and source not in fill.positions and \
                len(fill.positions) >= self.geometry.max_sources
            if expired or full_sources:
                self._seal(topic)
                fill = None
        if fill is None:
            index = self._acquire(timeout_s)
            if index is None:
                return None
            self._fill_mark = (self._fill_mark + 1) % L.SEQ_MOD or 1
            fill = Filling(index, mark=self._fill_mark)
            self._current[topic] = fill
            r = self._hdr[index]
            r["magic"] = L.SLOT_MAGIC
            r["acked"] = 0                  # before the slot counts as anything but free
            # What a crash may keep of it (``L.KEPT_OFFSET``): the mark makes a former seal's
            # header fail its CRC, and no prefix yet.
            r["first_record"] = fill.mark
            r["max_ts"] = 0
            r["topic_len"], r["topic"] = len(tb), tb
            r["state"] = L.FILLING
        return fill

    def _acquire(self, timeout_s: float) -> int | None:
        """A free slot index, making room per policy; None when the pool stayed full."""
        deadline = None
        while not self._free:
            if self._freeing:
                self._settle()
                continue
            self._collect()                     # a slot just sealed may be spilled or dropped
            if self._spill_oldest() or (self.on_full == "drop_oldest" and self._drop_oldest()):
                continue
            if deadline is None:
                deadline = self.clock.monotonic_ns() + int(timeout_s * 1e9)
            remaining = (deadline - self.clock.monotonic_ns()) / 1e9
            if remaining <= 0:
                return None
            self._space.wait(remaining)
        return self._free.pop()

    def _oldest_unleased_in_pool(self) -> SealedSlot | None:
        for seq, slot in self._sealed.items():
            if slot.index is not None and seq not in self._leased:
                return slot
        return None

    def _spill_oldest(self) -> bool:
        if self.spill is None:
            return False
        slot = self._oldest_unleased_in_pool()
        if slot is None or not self.spill.put(slot.meta, slot.payload):
            return False
        index = slot.index
        self._sealed[slot.seq] = self._spilled_slot(slot.meta)
        self._hdr[index]["state"] = L.FREE
        self._free.append(index)
        self.counters["slots_spilled"] += 1
        return True

    def _spilled_slot(self, meta: SlotMeta) -> SealedSlot:
        return SealedSlot(meta, None, None, lambda seq=meta.seq: self.spill.load(seq))

    def _drop_oldest(self) -> bool:
        slot = self._oldest_unleased_in_pool()
        if slot is None:
            return False
        self._report(DropEvent("buffer_full", slot.topic, slot.record_count,
                               f"slot seq {slot.seq} dropped: pool full (on_full = drop_oldest)",
                               slot, slot.first_record))   # reported before its space is reused
        self._release(slot)
        self.counters["buffer_full_dropped"] += slot.record_count
        return True

    def _write(self, fill: Filling, chunk: Chunk, a: int, b: int, source: int | None,
               source_start: int, chunk_stop: int, part=(0, 0), value_slice=None,
               flags: int = 0) -> None:
        o = self.geometry.slot_offset(fill.index)
        dest = self._mm[o:o + self.geometry.slot_bytes]
        size, fill.crc = write_block(dest, fill.used, chunk, a, b, fill.crc, part, value_slice,
                                     flags)
        fill.used += size
        fill.records += b - a
        fill.blocks += 1
        if flags & ONCE:                        # the prefix a crash keeps reaches past it now
            fill.once = True
            L.store_kept(self._hdr_bytes[fill.index], fill.used, L.kept_check(fill.mark, fill.crc))
        if chunk.uniform_ts is not None:
            lo = hi = chunk.uniform_ts
        else:
            ts = chunk.timestamps[a:b]
            lo, hi = int(ts.min()), int(ts.max())
        fill.min_ts = min(fill.min_ts, lo)
        fill.max_ts = max(fill.max_ts, hi)
        if fill.first_ns is None:
            fill.first_ns = self.clock.monotonic_ns()
        if source is not None:
            begin = source_start + (chunk.source_pos(a) if a else 0)
            span = fill.positions.setdefault(source, [begin, begin])
            span[1] = max(span[1], source_start + chunk_stop)
            end = source_start + chunk_stop
        else:
            begin = end = None
        runs = fill.segments
        if runs and runs[-1][2] == source and runs[-1][4] == begin:
            runs[-1][1] += b - a                # continues the last run: one row
            runs[-1][4] = end
        else:
            runs.append([fill.records - (b - a), b - a, source, begin, end])

    def _append_oversized(self, topic, chunk, i, limit, source, source_start, result,
                          timeout_s, kept, parts_done=0, handed=None) -> bool:
        """Record ``i`` of ``chunk``, longer than ``limit`` (its own, ``_value_limits``):
        split into a slot a part, truncated or dropped, per ``oversize``."""
        length = int(chunk.lengths[i])
        start = int(chunk.starts[i])
        stop = chunk.source_pos(i + 1) if i + 1 < len(chunk) else chunk.source_end
        if self.oversize == "drop":
            result.dropped += 1
            self.counters["oversize_dropped"] += 1
            # The line keeps a number, so the numbers stay dense. Taken before the journal
            # entry: a crash between the two leaves a hole no entry explains — reported as the
            # loss it is — rather than a journalled number given again to another line.
            number = self._take_records(1)
            self._report(DropEvent("oversize_dropped", topic, 1,
                                   f"a {length}-byte line over the {limit}-byte record limit",
                                   first_record=number))
            return True
        if self.oversize == "truncate":
            pieces = [(start, limit)]
        else:
            pieces = [(s, min(limit, start + length - s)) for s in range(start, start + length,
                                                                          limit)]
        for k, piece in enumerate(pieces):
            if k < parts_done:
                continue                   # sealed by an earlier call
            self._seal(topic)              # each piece takes a slot of its own
            fill = self._filling_for(topic, topic.encode(), source, timeout_s, bool(kept))
            if fill is None:
                result.parts = k           # a file re-reads from the line's start next time
                return False
            last = k == len(pieces) - 1
            part = (k, len(pieces)) if self.oversize == "split" else (0, 0)
            self._write(fill, chunk, i, i + 1, source, source_start,
                        stop if last else chunk.source_pos(i), part, piece, kept)
            if last and handed is not None:
                handed(i + 1)              # the record whole: its last part covers it
            self._seal(topic)
        if self.oversize == "truncate":
            result.truncated += 1
            self.counters["oversize_truncated"] += 1
            self._report(DropEvent("oversize_truncated", topic, 0,
                                   f"a {length}-byte line cut to {limit} bytes"))
        else:
            result.split_lines += 1
            self.counters["oversize_split"] += 1
        return True
