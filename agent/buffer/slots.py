"""What the pool's parts share: the slots as the pool hands them out (``SealedSlot``), a slot
being filled or closed, a slot header read, what an append did, and the pool's tunings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from . import layout as L
from .framing import (
    Block,
    Chunk,
    iter_blocks,
)
from .spill import SlotMeta

ON_FULL = ("block", "drop_oldest")
# Pages the agent keeps mapped: the most recently freed slots (reused next, KAFKA-1955's warm
# pages) and the sealed slots next in line for the drain. Other slots' pages are released from
# the process (MADV_DONTNEED; on a shared file mapping the data stays in the page cache and the
# file), so resident memory does not grow with the backlog. (The sealing thread drops a closed
# slot's mapping before its sync, ``PoolSealer._unmap_closed``: its reads map it again, read-only.)
HOT_FREE_SLOTS = 8
RESIDENT_WAITING_SLOTS = 16
OVERSIZE = ("split", "truncate", "drop")
# Slots on their way below which a reader that caught up seals at once (``seal_due``): enough
# to keep librdkafka's pipeline busy at a steady trickle, few enough that tiny slots never use
# up the pool's slot count.
CAUGHT_UP_IN_FLIGHT = 8
# Acknowledged slots are given back (their headers marked free) after a barrier at most this
# often (``free``): one fsync of the agent's state log per period, not per slot.
FREE_SETTLE_S = 0.2


class SealedSlots(dict):
    """The pool's sealed slots by sequence number (in-pool and spilled, in the order the pool
    keeps them), with an index kept beside them: per source, the start of its bytes in each
    slot holding some (``starts``). Asking where a few sources' oldest bytes begin then costs
    their slots, not every slot's positions: over a hundred files each slot done asked it of
    hundreds of sealed slots, and the agent fell behind at 10,000 lines/s.

    Only item assignment, ``del`` and ``clear`` change it (what the pool uses)."""

    def __init__(self, items=()) -> None:
        super().__init__()
        self.starts: dict[int, dict[int, int]] = {}          # source → seq → start
        for seq, slot in items:
            self[seq] = slot

    def __setitem__(self, seq: int, slot: SealedSlot) -> None:
        if seq in self:
            self._unindex(seq, self[seq])                    # its spilled form replaces it
        super().__setitem__(seq, slot)
        for source, start, _end in slot.meta.positions:
            by_seq = self.starts.setdefault(source, {})
            by_seq[seq] = min(start, by_seq.get(seq, start))

    def __delitem__(self, seq: int) -> None:
        self._unindex(seq, self[seq])
        super().__delitem__(seq)

    def clear(self) -> None:
        super().clear()
        self.starts.clear()

    def _unindex(self, seq: int, slot: SealedSlot) -> None:
        for source, _start, _end in slot.meta.positions:
            by_seq = self.starts.get(source)
            if by_seq is not None:
                by_seq.pop(seq, None)
                if not by_seq:
                    del self.starts[source]

    def update(self, *args, **kwargs):               # would pass the index by
        raise NotImplementedError("assign each slot (the index follows item assignment)")

    setdefault = pop = popitem = update


@dataclass(frozen=True)
class DropEvent:
    """Events the pool did not keep, on purpose or by corruption. One per occurrence."""

    reason: str          # oversize_dropped | oversize_truncated | buffer_full | corrupt
    topic: str
    records: int         # -1 when unknown (a slot whose header is torn)
    detail: str = ""
    slot: SealedSlot | None = None      # buffer_full: the sealed slot dropped, still readable
    first_record: int | None = None     # the record numbers the events had, from here on


@dataclass
class AppendResult:
    records: int = 0          # records of the chunk now in the pool (or dropped by policy)
    end: int = 0              # chunk bytes accounted for: re-read from here if records < len
    split_lines: int = 0
    truncated: int = 0
    dropped: int = 0
    # Parts of the first record not appended (one longer than a slot, split) already sealed:
    # a caller that cannot read the record again passes them back (``append(parts_done=)``)
    parts: int = 0

    def complete(self, chunk: Chunk) -> bool:
        return self.records == len(chunk)


@dataclass(eq=False)
class SealedSlot:
    """A sealed slot: its header, and its payload as a view into the pool (or a spill file)."""

    meta: SlotMeta
    index: int | None                 # slot index in the pool, None when spilled
    _payload: np.ndarray | None = None
    _loader: Callable[[], bytes] | None = None
    # Where the records came from, as sealed: (first record number, records, source, start,
    # end) per append, the bytes [start, end) of the source holding exactly those records.
    # Empty for a slot found at open (its positions say which sources, not which records).
    segments: tuple = ()
    # Records from the first on that Kafka acknowledged before the pool was opened (its
    # header's ``acked``): a send takes the slot from there.
    acked_before: int = 0

    @property
    def first_record(self) -> int:
        return self.meta.first_record

    @property
    def seq(self) -> int:
        return self.meta.seq

    @property
    def topic(self) -> str:
        return self.meta.topic

    @property
    def record_count(self) -> int:
        return self.meta.record_count

    @property
    def payload(self) -> np.ndarray:
        if self._payload is None:
            self._payload = np.frombuffer(self._loader(), np.uint8)
        return self._payload

    def blocks(self) -> Iterator[Block]:
        return iter_blocks(self.payload)

    def records(self) -> Iterator[tuple[int, bytes | None, bytes]]:
        """(event time, key, value) per record; copies, for tests and slow paths."""
        for block in self.blocks():
            keys = block.keys
            for i, ts in enumerate(block.timestamps.tolist()):
                yield ts, (keys[i] if keys else None), bytes(block.value(i))


@dataclass
class Filling:
    index: int
    mark: int = 0                # the fill's own number (``L.KEPT_OFFSET``)
    used: int = 0
    crc: int = 0
    records: int = 0
    blocks: int = 0
    min_ts: int = 2**63 - 1
    max_ts: int = -(2**63)
    first_ns: int | None = None
    positions: dict[int, list[int]] = field(default_factory=dict)
    segments: list[list] = field(default_factory=list)   # see SealedSlot; offsets in the slot
    once: bool = False           # holds records a crash keeps (``ONCE``: a listener's)
    # Sent while it fills (``BufferPool.send_filling``, ``sending.py``): its sequence and
    # record numbers are taken when it begins (``seq``, ``first_record``); ``shown`` bytes
    # (``shown_records`` records) of it are sealed in its header as it fills, each time
    # before the drain sends them; ``taken``: the drain sends it; ``sealed``: the slot once
    # it is sealed whole (that send goes on with it: the pool does not hand it out again).
    early: bool = False
    seq: int = 0
    first_record: int = 0
    shown: int = 0
    shown_records: int = 0
    taken: bool = False
    sealed: SealedSlot | None = None

    def meta(self, seq: int, topic: str, positions: tuple, first_record: int) -> SlotMeta:
        """Its header's fields as they are now, under ``seq`` and numbered from
        ``first_record``."""
        return SlotMeta(seq, topic, self.records, self.used, self.min_ts, self.max_ts, self.crc,
                        self.blocks, positions, first_record)


@dataclass
class Closing:
    """A slot closed for appends and given its sequence and record numbers, not yet sealed:
    its data is being made durable (``seal_thread``), its header not yet written."""

    topic: str
    fill: Filling
    seq: int
    first_record: int
    positions: tuple            # (source, start, end) of each source in it
    header: np.ndarray          # the header's bytes up to its state, built when it closed
    synced: bool = False        # sealed on disk; handed to the drain once collected
    ext: tuple[int, bytes] | None = None    # its positions page (which, bytes), if any


def slot_meta(h: np.ndarray, geometry: L.Geometry, page_of=None) -> SlotMeta | None:
    """The header of one slot (a 1-row view of SLOT_HEADER), or None when it fails its checks;
    ``page_of(area)``: the bytes of the slot's positions page ``area`` (``L.ext_offset``),
    read when the header names one."""
    r = h[0]
    if int(r["magic"]) != L.SLOT_MAGIC or int(r["header_crc"]) != L.header_crc(h):
        return None
    n_pos, topic_len = int(r["n_positions"]), int(r["topic_len"])
    if n_pos > geometry.max_sources or topic_len > L.MAX_TOPIC_BYTES or \
            int(r["used_bytes"]) > geometry.slot_bytes:
        return None
    positions = L.joined_positions(r["positions"], n_pos, int(r["seq"]), page_of)
    if positions is None:
        return None
    if n_pos > L.MAX_POSITIONS and int(r["used_bytes"]) > geometry.payload_bytes:
        return None
    return SlotMeta(
        seq=int(r["seq"]), topic=bytes(r["topic"])[:topic_len].decode("utf-8", "replace"),
        record_count=int(r["record_count"]), used_bytes=int(r["used_bytes"]),
        min_ts=int(r["min_ts"]), max_ts=int(r["max_ts"]), payload_crc=int(r["payload_crc"]),
        block_count=int(r["block_count"]),
        positions=positions, first_record=int(r["first_record"]),
    )
