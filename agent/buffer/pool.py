"""``BufferPool``: append chunks into slots, seal, hand sealed slots out in order, free, recover.

See the package docstring for the file layout, invariants and recovery rules.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import logging
import mmap
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from crc32c import crc32c

from . import layout as L
from .durable import make_folder, moved, sync_folder
from .errors import (
    PoolBusy,
    PoolCorrupt,
    PoolDamaged,
    PoolDiskTooSmall,
    PoolFormatError,
    PoolGeometryMismatch,
)
from .framing import (
    BLOCK_HEADER_BYTES,
    CONTINUED,
    PER_RECORD_BYTES,
    Block,
    BlockPlanner,
    Chunk,
    iter_blocks,
    pad8,
    write_block,
)
from .seams import Clock, FileOps
from .spill import SlotMeta, SpillStore

log = logging.getLogger("docket.agent.buffer")

ON_FULL = ("block", "drop_oldest")
# Pages the agent keeps mapped: the most recently freed slots (reused next, KAFKA-1955's warm
# pages) and the sealed slots next in line for the drain. Other slots' pages are released from
# the process (MADV_DONTNEED; on a shared file mapping the data stays in the page cache and the
# file), so resident memory does not grow with the backlog.
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
class _Filling:
    index: int
    used: int = 0
    crc: int = 0
    records: int = 0
    blocks: int = 0
    min_ts: int = 2**63 - 1
    max_ts: int = -(2**63)
    first_ns: int | None = None
    positions: dict[int, list[int]] = field(default_factory=dict)
    segments: list[list] = field(default_factory=list)   # see SealedSlot; offsets in the slot


@dataclass
class _Closing:
    """A slot closed for appends and given its sequence and record numbers, not yet sealed:
    its data is being made durable (``seal_thread``), its header not yet written."""

    topic: str
    fill: _Filling
    seq: int
    first_record: int
    positions: tuple            # (source, start, end) of each source in it
    header: np.ndarray          # the header's bytes up to its state, built when it closed
    synced: bool = False        # sealed on disk; handed to the drain once collected


def slot_meta(h: np.ndarray, geometry: L.Geometry) -> SlotMeta | None:
    """The header of one slot (a 1-row view of SLOT_HEADER), or None when it fails its checks."""
    r = h[0]
    if int(r["magic"]) != L.SLOT_MAGIC or int(r["header_crc"]) != L.header_crc(h):
        return None
    n_pos, topic_len = int(r["n_positions"]), int(r["topic_len"])
    if n_pos > L.MAX_POSITIONS or topic_len > L.MAX_TOPIC_BYTES or \
            int(r["used_bytes"]) > geometry.slot_bytes:
        return None
    return SlotMeta(
        seq=int(r["seq"]), topic=bytes(r["topic"])[:topic_len].decode("utf-8", "replace"),
        record_count=int(r["record_count"]), used_bytes=int(r["used_bytes"]),
        min_ts=int(r["min_ts"]), max_ts=int(r["max_ts"]), payload_crc=int(r["payload_crc"]),
        block_count=int(r["block_count"]),
        positions=tuple(tuple(int(x) for x in p) for p in r["positions"][:n_pos]),
        first_record=int(r["first_record"]),
    )


class BufferPool:
    def __init__(
        self,
        path: str | Path,
        size_bytes: int,
        slot_size_bytes: int,
        *,
        linger_ms: float = 5,
        seal_when_idle: bool = True,
        seal_when_caught_up: bool = True,
        on_full: str = "block",
        oversize: str = "split",
        spill_dir: str | Path | None = None,
        spill_max_bytes: int = 0,
        quarantine_dir: str | Path | None = None,
        sync_on_seal: bool = True,
        clock: Clock | None = None,
        ops: FileOps | None = None,
        on_drop: Callable[[DropEvent], None] | None = None,
        on_seal: Callable[[SealedSlot], None] | None = None,
        max_record_bytes: int | None = None,
        first_seq: int = 0,
        first_record: int = 0,
        seal_thread: bool = False,
        free_barrier: Callable[[], None] | None = None,
        delivered: Callable[[SlotMeta], bool] | None = None,
    ):
        if on_full not in ON_FULL:
            raise ValueError(f"on_full must be one of {ON_FULL}, not {on_full!r}")
        if oversize not in OVERSIZE:
            raise ValueError(f"oversize must be one of {OVERSIZE}, not {oversize!r}")
        self.path = Path(path)
        self.linger_ns = int(linger_ms * 1_000_000)
        self.seal_when_idle = seal_when_idle
        self.seal_when_caught_up = seal_when_caught_up
        self.on_full = on_full
        self.oversize = oversize
        self.sync_on_seal = sync_on_seal
        self.clock = clock or Clock()
        self.ops = ops or FileOps()
        self._on_drop = on_drop
        self._on_seal = on_seal
        self.quarantine_dir = Path(quarantine_dir or self.path.parent / "quarantine")
        self.counters: dict[str, int] = {
            "records_appended": 0, "slots_sealed": 0, "slots_freed": 0, "slots_spilled": 0,
            "slots_quarantined": 0, "filling_discarded": 0, "oversize_split": 0,
            "oversize_truncated": 0, "oversize_dropped": 0, "buffer_full_dropped": 0,
            "stale_freed": 0, "acknowledged_freed": 0,
        }
        self.drop_events: list[DropEvent] = []
        self._lock = threading.RLock()
        self._space = threading.Condition(self._lock)
        self._current: dict[str, _Filling] = {}
        self._sealed: dict[int, SealedSlot] = {}       # seq → slot, in-pool and spilled
        self._leased: set[int] = set()
        self._free: list[int] = []                      # a stack: last freed is handed out first
        # Acknowledged slots wait here until ``free_barrier`` made what was written of their
        # acknowledgement durable (``free``); only with ``sync_on_seal``.
        self._free_barrier = free_barrier if sync_on_seal else None
        # Whether every record of a slot found at open was acknowledged before (the agent:
        # its positions are all at or below their files' acknowledged offsets).
        self._delivered = delivered
        self._freeing: list[SealedSlot] = []
        self._settled_ns = 0
        self._recovered_positions: dict[int, int] = {}
        # Sealing in two steps: a full slot is *closed* (numbered, no more appends) by the
        # appender, then *sealed* (its data synced, its header written and synced) in order —
        # by a thread of its own with ``seal_thread``, so reading and sending go on while the
        # disk syncs; else at once, by the caller. A slot the thread sealed is *collected* by
        # the pool's caller (``seal_due``, ``seal``, ``seal_all``): only then is it handed to
        # the drain, after ``on_seal`` in the caller's thread, as a slot sealed at once is
        # (the agent writes what ``on_seal`` noted before its drain takes the slot).
        self._closing: deque[_Closing] = deque()        # closed, not yet collected
        self._unsynced: deque[_Closing] = deque()       # closed, not yet sealed on disk
        self._closed = threading.Condition(self._lock)   # a closed slot sealed, or failed
        self._seal_error: BaseException | None = None
        self._sealer: threading.Thread | None = None
        self._sealer_stop = False

        self.geometry = L.Geometry.fit(size_bytes, slot_size_bytes)
        self._unlock: weakref.finalize | None = None    # closes the fd holding the file's flock
        try:
            self._open(first_seq, first_record, spill_dir, spill_max_bytes)
        except BaseException:
            self._release_file_lock()        # a refused open leaves the file to the next opener
            raise
        # Record capacity: the largest value one record may have in an empty slot, or less.
        self.max_value_bytes = self.geometry.slot_bytes - BLOCK_HEADER_BYTES - PER_RECORD_BYTES - 8
        if max_record_bytes is not None:
            self.max_value_bytes = min(self.max_value_bytes, max_record_bytes)
        if seal_thread and sync_on_seal:
            self._sealer = threading.Thread(target=self._seal_loop, name="docket-seal",
                                            daemon=True)
            self._sealer.start()

    # -- opening -------------------------------------------------------------------------------
    def _open(self, first_seq: int, first_record: int, spill_dir: str | Path | None,
              spill_max_bytes: int) -> None:
        """Lock and map the file, then recover it (or start a new one's free list)."""
        created = self._open_file(first_seq)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r+",
                              shape=(self.geometry.file_bytes,))
        # Slicing a plain ndarray view costs far less than slicing the memmap subclass.
        self._mm = self._map.view(np.ndarray)
        self._fh = self._mm[:L.FILE_HEADER.itemsize].view(L.FILE_HEADER)
        g = self.geometry
        self._hdr = self._mm[g.slot_headers_offset:
                             g.slot_headers_offset + g.slot_count * L.SLOT_HEADER_BYTES
                             ].view(L.SLOT_HEADER)
        self._hdr_bytes = self._hdr.view(np.uint8).reshape(g.slot_count, L.SLOT_HEADER_BYTES)
        self._scratch = np.zeros(1, L.SLOT_HEADER)
        self._scratch_bytes = self._scratch.view(np.uint8)
        self.spill = SpillStore(spill_dir, spill_max_bytes, self.ops) if spill_dir else None
        self._next_seq = int(self._fh[0]["next_seq"])
        # Record numbers: never below the caller's (the state database's) nor the header's.
        self._next_record = max(first_record, int(self._fh[0]["next_record"]))
        if created:
            self._free = list(range(g.slot_count - 1, -1, -1))
        else:
            self._recover()

    def _open_file(self, first_seq: int) -> bool:
        """Lock the file, then check it, or create and preallocate it. True when created."""
        g = self.geometry
        if self.path.exists() and self.path.stat().st_size > 0:
            self._lock_file(os.open(self.path, os.O_RDWR))
            self._check_existing()
            return False
        make_folder(self.path.parent)
        available = self.ops.free_bytes(self.path.parent)
        if available < g.file_bytes:
            raise PoolDiskTooSmall(
                f"the buffer pool needs {g.file_bytes} bytes at {self.path}; "
                f"the file system has {available} free",
                hint="lower buffer.size_bytes or move buffer.path to a larger file system",
            )
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._lock_file(fd)                  # the fd stays open: it holds the lock
        if os.fstat(fd).st_size > 0:         # another pool created it between our look and lock
            self._check_existing()
            return False
        try:
            self.ops.reserve(fd, g.file_bytes)
        except OSError as exc:
            self.path.unlink(missing_ok=True)
            raise PoolDiskTooSmall(
                f"reserving {g.file_bytes} bytes for {self.path} failed: {exc.strerror}",
                hint="free space, lower buffer.size_bytes or move buffer.path",
            ) from exc
        header = np.zeros(1, L.FILE_HEADER)
        header[0] = (L.MAGIC, L.VERSION, L.FILE_HEADER_BYTES, g.slot_bytes, g.slot_count,
                     L.SLOT_HEADER_BYTES, 0, first_seq % L.SEQ_MOD, 0)
        header[0]["geometry_crc"] = L.geometry_crc(header)
        os.pwrite(fd, header.tobytes(), 0)
        os.fsync(fd)
        sync_folder(self.path.parent)        # its name: the file is durable only with it
        return True

    def _lock_file(self, fd: int) -> None:
        """Hold ``flock(LOCK_EX | LOCK_NB)`` on the pool file through ``fd`` until close(),
        abandon() or the process ends. The lock belongs to the open file, so a second open in
        this process conflicts like another process does. If the object is dropped without
        either (a test simulating a crash), garbage collection closes the fd."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise PoolBusy(
                f"{self.path} is in use by another buffer pool (another docket agent, or a "
                "pool still open in this process); nothing was read or written",
                hint="give each agent a buffer.path of its own, or stop the agent that uses "
                "this pool first",
            ) from None
        self._unlock = weakref.finalize(self, os.close, fd)

    def _release_file_lock(self) -> None:
        if self._unlock is not None:
            self._unlock()                   # closing the fd drops the lock; runs once

    def _check_existing(self) -> None:
        with open(self.path, "rb") as f:
            raw = f.read(L.FILE_HEADER.itemsize)
        if len(raw) < L.FILE_HEADER.itemsize:
            raise PoolDamaged(f"{self.path} is too short to be a buffer pool",
                              hint="move the file away; the agent creates a new pool")
        header = np.frombuffer(raw, L.FILE_HEADER)
        h = header[0]
        if not any(raw):
            raise PoolDamaged(f"{self.path} has a header of zeros (an agent killed while it "
                              "created the pool?)", hint="move it away; the agent creates a "
                              "new pool")
        if bytes(h["magic"]) != L.MAGIC:
            raise PoolFormatError(f"{self.path} is not a docket buffer pool (bad magic)",
                                  hint="point buffer.path at another file")
        if int(h["version"]) == 1 and int(h["geometry_crc"]) == L.geometry_crc(header):
            self._upgrade_v1(header)
            return
        if int(h["version"]) == 2 and int(h["geometry_crc"]) == L.geometry_crc(header):
            self._upgrade_v2(header)
            return self._check_existing()
        if int(h["version"]) != L.VERSION:
            raise PoolFormatError(
                f"{self.path} has pool format version {int(h['version'])}; this agent reads "
                f"version {L.VERSION}", hint="drain it with the agent version that wrote it")
        if int(h["geometry_crc"]) != L.geometry_crc(header):
            raise PoolDamaged(f"{self.path}: the file header fails its CRC",
                              hint="the file is damaged; move it away to start a new pool")
        found = (int(h["slot_bytes"]), int(h["slot_count"]))
        want = (self.geometry.slot_bytes, self.geometry.slot_count)
        if found != want:
            raise PoolGeometryMismatch(
                f"{self.path} holds {found[1]} slots of {found[0]} bytes; the configuration asks "
                f"for {want[1]} slots of {want[0]} bytes",
                hint="restore the old buffer.size_bytes and buffer.slot_size_bytes until the "
                "pool has drained, or move the file away (its unsent events would be lost)",
            )
        if self.path.stat().st_size < self.geometry.file_bytes:
            raise PoolDamaged(f"{self.path} is shorter than its header says",
                              hint="the file was truncated; move it away")

    def _upgrade_v2(self, header: np.ndarray) -> None:
        """A version 2 pool becomes version 3 in place, its slots kept: every slot's ``acked``
        (padding then) zeroed and synced before the version changes."""
        g = self.geometry
        found = (int(header[0]["slot_bytes"]), int(header[0]["slot_count"]))
        if found != (g.slot_bytes, g.slot_count):
            raise PoolGeometryMismatch(
                f"{self.path} (pool format version 2) holds {found[1]} slots of {found[0]} "
                f"bytes; the configuration asks for {g.slot_count} slots of {g.slot_bytes} bytes",
                hint="restore the old buffer.size_bytes and buffer.slot_size_bytes until the "
                "pool has drained, or move the file away (its unsent events would be lost)")
        with open(self.path, "r+b") as f:
            for index in range(g.slot_count):
                f.seek(g.slot_headers_offset + index * L.SLOT_HEADER_BYTES + L.ACKED_OFFSET)
                f.write(bytes(L.SLOT_HEADER_BYTES - L.ACKED_OFFSET))
            f.flush()
            os.fsync(f.fileno())
            new = header.copy()
            new[0]["version"] = L.VERSION
            new[0]["geometry_crc"] = L.geometry_crc(new)
            f.seek(0)
            f.write(new.tobytes())
            f.flush()
            os.fsync(f.fileno())
        log.info("%s: pool format version 2 upgraded to %d in place (its slots kept)",
                 self.path, L.VERSION)

    def _upgrade_v1(self, header: np.ndarray) -> None:
        """A version 1 pool (no record numbers) is rewritten as version 2 when no slot of it
        is sealed: nothing in it is kept anyway. One with sealed slots is refused."""
        g = self.geometry
        if (int(header[0]["slot_bytes"]), int(header[0]["slot_count"])) != \
                (g.slot_bytes, g.slot_count):
            raise PoolGeometryMismatch(
                f"{self.path} (pool format version 1) holds other slots than configured",
                hint="restore the old buffer settings and drain it with the agent version that "
                "wrote it, or move it away (its unsent events would be lost)")
        with open(self.path, "r+b") as f:
            f.seek(g.slot_headers_offset)
            raw = f.read(g.slot_count * L.SLOT_HEADER_BYTES)
            states = np.frombuffer(raw, np.uint8).reshape(g.slot_count, L.SLOT_HEADER_BYTES)[
                :, L.V1_STATE_OFFSET]
            if (states == L.SEALED).any():
                raise PoolFormatError(
                    f"{self.path} has pool format version 1 with {int((states == L.SEALED).sum())}"
                    " sealed slot(s); this agent numbers records and reads version 2",
                    hint="drain it with the agent version that wrote it (stop sources, let it "
                    "send), then start this version")
            new = np.zeros(1, L.FILE_HEADER)
            new[0] = (L.MAGIC, L.VERSION, L.FILE_HEADER_BYTES, g.slot_bytes, g.slot_count,
                      L.SLOT_HEADER_BYTES, 0, int(header[0]["next_seq"]), 0)
            new[0]["geometry_crc"] = L.geometry_crc(new)
            f.seek(g.slot_headers_offset)
            f.write(bytes(g.slot_count * L.SLOT_HEADER_BYTES))      # every slot free
            f.seek(0)
            f.write(new.tobytes())
            f.flush()
            os.fsync(f.fileno())

    def _recover(self) -> None:
        hdr = self._hdr
        states = hdr["state"]
        sealed_seqs = []
        for index in range(self.geometry.slot_count):
            state = int(states[index])
            if state == L.FREE:
                continue
            if state == L.FILLING:
                self.counters["filling_discarded"] += 1
                states[index] = L.FREE
                continue
            meta = self._meta_if_valid(index) if state == L.SEALED else None
            if meta is None:
                why = f"torn header (state {state})" if state == L.SEALED else \
                    f"unknown state {state}"
                self._quarantine(index, why)
                continue
            payload = self._payload_view(index, meta.used_bytes)
            if crc32c(payload) != meta.payload_crc:
                if self._delivered is not None and self._delivered(meta):
                    # Acknowledged and freed; the free was lost (a power loss) and the slot
                    # was filling again: its payload is new, unsealed bytes (read again from
                    # their files), not a loss.
                    log.info("slot %d (seq %d): its records were acknowledged before; its free "
                             "did not reach the disk and the slot was filling again: freed",
                             index, meta.seq)
                    states[index] = L.FREE
                    self.counters["stale_freed"] += 1
                    continue
                self._quarantine(index, "torn payload (payload CRC mismatch)", meta)
                continue
            if self._delivered is not None and self._delivered(meta):
                # Acknowledged whole before the stop, its free not yet written (frees wait
                # for their barrier: ``free``): not sent again.
                states[index] = L.FREE
                self.counters["acknowledged_freed"] += 1
                continue
            self._sealed[meta.seq] = SealedSlot(
                meta, index, payload,
                acked_before=L.acked_of(self._hdr_bytes[index], meta.record_count))
            sealed_seqs.append(meta.seq)
        if self.counters["acknowledged_freed"]:
            log.info("%d slot(s) whose records were all acknowledged before the stop: freed, "
                     "not sent again", self.counters["acknowledged_freed"])
        if self.spill is not None:
            for path, why in self.spill.recover():
                self._quarantine_file(path, why)
            for meta in self.spill.metas():
                self._sealed[meta.seq] = self._spilled_slot(meta)
                sealed_seqs.append(meta.seq)
        numbered = [s.meta.first_record + s.record_count for s in self._sealed.values()
                    if s.meta.first_record is not None]
        self._next_record = max([self._next_record, *numbered])
        self._free = [i for i in range(self.geometry.slot_count - 1, -1, -1)
                      if int(states[i]) == L.FREE]
        self._reorder()
        for seq, slot in self._sealed.items():        # spilled before records had numbers
            if slot.meta.first_record is None:
                meta = dataclasses.replace(slot.meta, first_record=self._take_records(
                    slot.record_count))
                self.spill.renumber(meta)         # the same numbers at every later start
                self._sealed[seq] = self._spilled_slot(meta)
        if sealed_seqs:
            last = next(reversed(self._sealed))
            nxt = (last + 1) % L.SEQ_MOD
            key = L.seq_order_key([last])
            if key(nxt) > key(self._next_seq):   # the header's next_seq may lag one seal
                self._next_seq = nxt
        for slot in self._sealed.values():
            for source, _start, end in slot.meta.positions:
                if end > self._recovered_positions.get(source, -1):
                    self._recovered_positions[source] = end

    def _reorder(self) -> None:
        key = L.seq_order_key(list(self._sealed))
        self._sealed = dict(sorted(self._sealed.items(), key=lambda kv: key(kv[0])))

    def _meta_if_valid(self, index: int) -> SlotMeta | None:
        return slot_meta(self._hdr[index:index + 1], self.geometry)

    def _payload_view(self, index: int, used: int) -> np.ndarray:
        o = self.geometry.slot_offset(index)
        return self._mm[o:o + used]

    def _quarantine(self, index: int, why: str, meta: SlotMeta | None = None) -> None:
        """Copy a slot that failed its checks out of the pool, report it, and free it."""
        g = self.geometry
        make_folder(self.quarantine_dir)
        ho = g.slot_headers_offset + index * L.SLOT_HEADER_BYTES
        o = g.slot_offset(index)
        blob = self._mm[ho:ho + L.SLOT_HEADER_BYTES].tobytes() \
            + self._mm[o:o + g.slot_bytes].tobytes()
        seq = int(self._hdr[index]["seq"])
        if meta is not None:              # its numbers were given: never give them again
            self._next_record = max(self._next_record, meta.first_record + meta.record_count)
        self.ops.write_file(self.quarantine_dir / f"slot-{index:06d}-seq-{seq}.bin", blob)
        self._hdr[index]["state"] = L.FREE
        self.counters["slots_quarantined"] += 1
        self._report(DropEvent("corrupt", meta.topic if meta else "",
                               meta.record_count if meta else -1,
                               f"slot {index} seq {seq}: {why}; copied to {self.quarantine_dir}",
                               first_record=meta.first_record if meta else None))

    def _quarantine_file(self, path: Path, why: str) -> None:
        make_folder(self.quarantine_dir)
        moved(path, self.quarantine_dir / path.name)
        self.counters["slots_quarantined"] += 1
        self._report(DropEvent("corrupt", "", -1, f"{why}; moved to {self.quarantine_dir}"))

    def _report(self, event: DropEvent) -> None:
        self.drop_events.append(event)
        if self._on_drop is not None:
            self._on_drop(event)

    # -- appending -----------------------------------------------------------------------------
    def append(self, topic: str, chunk: Chunk, source: int | None = None, source_start: int = 0,
               timeout_s: float = 0.0) -> AppendResult:
        """Frame ``chunk``'s records into slots of ``topic``.

        Returns how far it got. Fewer records than the chunk holds means the pool was full for
        ``timeout_s`` (policy ``block``): the caller keeps the rest, from ``result.end``, and
        tries again later — the data waits in the source.
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
        oversized = np.flatnonzero(chunk.lengths > self._max_value(chunk)).tolist()
        oversized.append(n)
        continued = chunk.continued and oversized[0] != 0      # record 0: a block of its own
        with self._lock:
            self._raise_seal_error()
            a, next_big = 0, 0
            while a < n:
                if a == oversized[next_big]:
                    if not self._append_oversized(topic, chunk, a, source, source_start,
                                                  result, timeout_s):
                        break
                    next_big += 1
                    a += 1
                    continue
                limit = 1 if continued and a == 0 else oversized[next_big]
                fill = self._filling_for(topic, source, timeout_s)
                if fill is None:
                    break
                space = self.geometry.slot_bytes - fill.used
                b = planner.fit(a, limit, space)
                if b == a:
                    self._seal(topic)
                    continue
                self._write(fill, chunk, a, b, source, source_start,
                            chunk.source_pos(b) if b < n else chunk.source_end,
                            flags=CONTINUED if continued and a == 0 else 0)
                a = b
                if self.geometry.slot_bytes - fill.used < BLOCK_HEADER_BYTES + PER_RECORD_BYTES + 8:
                    self._seal(topic)
            result.records = a
            result.end = chunk.source_end if a == n else chunk.source_pos(a)
            self.counters["records_appended"] += a - result.dropped
        return result

    def _max_value(self, chunk: Chunk) -> int:
        if chunk.keys is None:
            return self.max_value_bytes
        longest_key = max((len(k) for k in chunk.keys if k is not None), default=0)
        return self.max_value_bytes - 8 - pad8(longest_key)

    def _filling_for(self, topic: str, source: int | None, timeout_s: float) -> _Filling | None:
        fill = self._current.get(topic)
        if fill is not None:
            expired = self._linger_over(fill, self.clock.monotonic_ns())
            full_sources = source is not None and source not in fill.positions and \
                len(fill.positions) >= L.MAX_POSITIONS
            if expired or full_sources:
                self._seal(topic)
                fill = None
        if fill is None:
            index = self._acquire(timeout_s)
            if index is None:
                return None
            fill = _Filling(index)
            self._current[topic] = fill
            r = self._hdr[index]
            r["magic"] = L.SLOT_MAGIC
            r["acked"] = 0                  # before the slot counts as anything but free
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

    def _write(self, fill: _Filling, chunk: Chunk, a: int, b: int, source: int | None,
               source_start: int, chunk_stop: int, part=(0, 0), value_slice=None,
               flags: int = 0) -> None:
        o = self.geometry.slot_offset(fill.index)
        dest = self._mm[o:o + self.geometry.slot_bytes]
        size, fill.crc = write_block(dest, fill.used, chunk, a, b, fill.crc, part, value_slice,
                                     flags)
        fill.used += size
        fill.records += b - a
        fill.blocks += 1
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

    def _append_oversized(self, topic, chunk, i, source, source_start, result, timeout_s) -> bool:
        length = int(chunk.lengths[i])
        start = int(chunk.starts[i])
        stop = chunk.source_pos(i + 1) if i + 1 < len(chunk) else chunk.source_end
        limit = self._max_value(chunk)
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
            self._seal(topic)              # each piece takes a slot of its own
            fill = self._filling_for(topic, source, timeout_s)
            if fill is None:
                return False               # re-read from the line's start next time
            last = k == len(pieces) - 1
            part = (k, len(pieces)) if self.oversize == "split" else (0, 0)
            self._write(fill, chunk, i, i + 1, source, source_start,
                        stop if last else chunk.source_pos(i), part, piece)
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

    # -- sealing -------------------------------------------------------------------------------
    def seal(self, topic: str) -> int | None:
        """Seal the topic's filling slot now, and wait until it is (with every slot closed
        before it); returns its sequence number (None if empty)."""
        with self._lock:
            seq = self._seal(topic)
            self._wait_sealed()
            return seq

    def seal_due(self, caught_up: bool = False) -> int:
        """Seal every filling slot whose linger has passed, or every one holding records when
        no sealed slot waits for Kafka (``seal_when_idle``: a drain with nothing in flight
        gains nothing by the wait), or when the caller read its sources to their ends
        (``caught_up`` and ``seal_when_caught_up``: nothing more is coming this turn) while
        the drain keeps up (every sealed slot taken) and fewer than ``CAUGHT_UP_IN_FLIGHT``
        slots are on their way. Otherwise records gather until linger, as Nagle's rule does
        for a socket. Waiting for the slot in flight to be acknowledged put that whole round
        trip into each record's latency (issue 30: p50 9.7 ms at 1,000 lines/s, 4.3 ms
        without the wait). Called once a turn after the sources were read; first hands the
        drain what the sealing thread sealed since (``_collect``). Returns how many were
        sealed (closed, with the sealing thread)."""
        now = self.clock.monotonic_ns()
        with self._lock:
            self._raise_seal_error()
            self._collect()
            idle = self.seal_when_idle and not self._sealed and not self._closing
            early = idle or (caught_up and self.seal_when_caught_up
                             and len(self._sealed) == len(self._leased)
                             and len(self._sealed) + len(self._closing) < CAUGHT_UP_IN_FLIGHT)
            due = [t for t, f in self._current.items()
                   if (early and f.records) or self._linger_over(f, now)]
            for topic in due:
                self._seal(topic, at_once=early)
            return len(due)

    def _linger_over(self, fill: _Filling, now: int) -> bool:
        """Linger bounds latency only while the drain keeps up: with a sealed slot still waiting
        to be taken (an outage, a slow cluster) sealing early would not send anything sooner,
        and small slots would use up the pool's slot count long before its bytes."""
        if fill.first_ns is None or now - fill.first_ns < self.linger_ns:
            return False
        return len(self._sealed) == len(self._leased)

    def filling(self) -> bool:
        """Records wait in a filling slot (for their linger, or the next ``seal_due``), or in
        a closed one not yet sealed."""
        with self._lock:
            return bool(self._closing) or any(f.records for f in self._current.values())

    def seal_all(self) -> int:
        """Seal every filling slot, and wait until every closed one is sealed."""
        with self._lock:
            topics = list(self._current)
            n = sum(self._seal(t) is not None for t in topics)
            self._wait_sealed()
            return n

    def _seal(self, topic: str, at_once: bool = False) -> int | None:
        """Close the topic's filling slot and seal it: at once, or (``seal_thread``) by the
        sealing thread, in order. ``at_once``: by the caller even with the thread, when no
        other closed slot waits — a reader that caught up seals early for latency, and handing
        a lone slot to the thread and back only adds the two threads' turns to it (1,000
        lines/s: p50 9.0-9.9 ms against 5.7-6.9 sealed at once). Returns its sequence number."""
        fill = self._current.get(topic)
        if fill is None or fill.records == 0:
            return None
        del self._current[topic]
        closing = self._close(topic, fill)
        self._closing.append(closing)
        if self._sealer is not None and not (at_once and len(self._closing) == 1):
            self._unsynced.append(closing)
            self._closed.notify_all()
            return closing.seq
        try:
            self._seal_closed(closing)
        except BaseException:
            if self._closing and self._closing[-1] is closing:   # as it was: still filling
                self._closing.pop()
                self._current[topic] = fill
                self._next_seq, self._next_record = closing.seq, closing.first_record
            raise
        return closing.seq

    def _close(self, topic: str, fill: _Filling) -> _Closing:
        """Number the slot and build its header aside; nothing is written to its header yet."""
        seq = self._next_seq
        first_record = self._next_record
        tb = topic.encode()
        positions = tuple((src, s, e) for src, (s, e) in fill.positions.items())
        pos = np.zeros((L.MAX_POSITIONS, 3), np.uint64)
        if positions:
            pos[:len(positions)] = positions
        self._scratch[0] = (L.SLOT_MAGIC, len(tb), len(positions), seq, fill.records, fill.used,
                            fill.min_ts, fill.max_ts, fill.crc, fill.blocks, first_record, pos, tb,
                            0, L.FILLING, 0)
        self._scratch[0]["header_crc"] = crc32c(self._scratch_bytes[:L.HEADER_CRC_SPAN])
        self._next_seq = (seq + 1) % L.SEQ_MOD
        self._next_record = first_record + fill.records
        return _Closing(topic, fill, seq, first_record, positions,
                        self._scratch_bytes[:L.STATE_OFFSET].copy())

    def _seal_closed(self, c: _Closing) -> None:
        """Seal the oldest closed slot ``c`` at once, under the lock (without ``seal_thread``,
        or ``at_once`` with nothing else closed): its data synced, then its header, then the
        header synced."""
        if self.sync_on_seal:
            self.ops.msync(self._map._mmap, self.geometry.slot_offset(c.fill.index), c.fill.used)
        self._write_header(c)
        if self.sync_on_seal:
            self._sync_headers(self._map._mmap, c.fill.index)
        c.synced = True
        self._sealed_now(c)

    def _write_header(self, c: _Closing) -> None:
        """Store every byte of the header but the state in one copy, then the state."""
        self.ops.crash_point("seal:before_header")
        self._hdr_bytes[c.fill.index, L.ACKED_OFFSET:] = 0
        self._hdr_bytes[c.fill.index, :L.STATE_OFFSET] = c.header
        self.ops.crash_point("seal:before_state")
        self._hdr_bytes[c.fill.index, L.STATE_OFFSET] = L.SEALED
        self._fh[0]["next_seq"] = (c.seq + 1) % L.SEQ_MOD
        self._fh[0]["next_record"] = max(int(self._fh[0]["next_record"]),
                                         c.first_record + c.fill.records)

    def _sync_headers(self, mm: mmap.mmap, last_index: int) -> None:
        """Sync the file header and the slot headers up to ``last_index``'s in one ``msync``
        (one flush of the disk's cache; only dirty pages are written). A power loss during it
        may keep the file header without a slot header (numbers skipped, as before) or a slot
        header without the file header (``_recover`` takes the larger of them)."""
        self.ops.msync(mm, 0, self.geometry.slot_headers_offset
                       + (last_index + 1) * L.SLOT_HEADER_BYTES)

    def _collect(self) -> None:
        """Hand the slots the sealing thread sealed to the drain, in order (under the lock)."""
        while self._closing and self._closing[0].synced:
            self._sealed_now(self._closing[0])

    def _sealed_now(self, c: _Closing) -> None:
        """The oldest closed slot ``c`` is sealed on disk: hand it to the drain."""
        self.ops.crash_point("seal:after_state")
        self._closing.popleft()
        fill, index = c.fill, c.fill.index
        meta = SlotMeta(c.seq, c.topic, fill.records, fill.used, fill.min_ts, fill.max_ts,
                        fill.crc, fill.blocks, c.positions, c.first_record)
        segments = tuple((c.first_record + k, n, src, b, e) for k, n, src, b, e in fill.segments)
        slot = self._sealed[c.seq] = SealedSlot(meta, index, self._payload_view(index, fill.used),
                                                segments=segments)
        self.counters["slots_sealed"] += 1
        if self._on_seal is not None:
            self._on_seal(slot)                     # while its pages are still in memory
        if len(self._sealed) - len(self._leased) > RESIDENT_WAITING_SLOTS:
            self._release_pages(index)

    def _seal_loop(self) -> None:
        """The sealing thread (``seal_thread``): seals the closed slots on disk in order,
        syncing without the lock, so appends go on meanwhile. A round takes every slot closed
        so far: their data synced one by one, then their headers written and synced in one
        ``msync`` (a group commit: k slots cost k + 1 flushes). The pool's caller collects them
        (``_collect``). A sync that fails stops it; the error is raised to the pool's next
        caller (``_raise_seal_error``)."""
        try:
            while True:
                with self._lock:
                    while not self._unsynced and not self._sealer_stop:
                        self._closed.wait()
                    if not self._unsynced:
                        return
                    batch, mm = list(self._unsynced), self._map._mmap
                for c in batch:
                    self.ops.msync(mm, self.geometry.slot_offset(c.fill.index), c.fill.used)
                with self._lock:
                    if self._abandoned(batch[0]):
                        return
                    for c in batch:
                        self._write_header(c)
                self._sync_headers(mm, max(c.fill.index for c in batch))
                with self._lock:
                    if self._abandoned(batch[0]):
                        return
                    for c in batch:
                        self._unsynced.popleft()
                        c.synced = True
                    self._closed.notify_all()
                    self._space.notify_all()        # a sealed slot may be spilled or dropped
        except BaseException as exc:          # noqa: BLE001 (handed to the appender)
            with self._lock:
                self._seal_error = exc
                self._closed.notify_all()
                self._space.notify_all()

    def _abandoned(self, c: _Closing) -> bool:
        """The pool was abandoned while the thread synced ``c`` (``abandon`` cleared it)."""
        return not self._unsynced or self._unsynced[0] is not c

    def _raise_seal_error(self) -> None:
        if self._seal_error is not None:
            raise self._seal_error

    def _wait_sealed(self) -> None:
        """Until every closed slot is sealed, and collected (under the lock)."""
        while self._closing:
            self._raise_seal_error()
            if self._closing[0].synced:
                self._collect()
            else:
                self._closed.wait()

    def _take_records(self, n: int) -> int:
        """Take ``n`` record numbers for records that are not sealed (a dropped line, a spilled
        slot from before numbering); the header keeps the count, as a seal does. Closed slots
        are sealed first: the header never counts past numbers of a slot not yet on disk."""
        self._wait_sealed()
        first = self._next_record
        self._next_record += n
        self._fh[0]["next_record"] = self._next_record
        return first

    @property
    def next_record(self) -> int:
        """The number the next sealed record gets: every lower one was given out, and is in a
        sealed slot or journalled (a closed slot's numbers count once it is sealed)."""
        with self._lock:
            return self._closing[0].first_record if self._closing else self._next_record

    def record_marks(self) -> tuple[int, int]:
        """(the last record number given, the highest number up to which every one is
        settled), read together: a number is settled once its slot was freed (Kafka
        acknowledged every record of it, or the slot was dropped and journalled) or when it
        was never sealed (a dropped line's number, journalled). Numbers of sealed slots that
        are waiting, in flight or spilled are not."""
        with self._lock:
            waiting = min((s.first_record for s in self._sealed.values() if s.record_count),
                          default=self._next_record)
            if self._closing:
                waiting = min(waiting, self._closing[0].first_record)
            return self._next_record - 1, min(waiting, self._next_record) - 1

    # -- draining ------------------------------------------------------------------------------
    def sealed(self) -> list[SealedSlot]:
        """Every sealed slot, in sequence order (in flight or not)."""
        with self._lock:
            return list(self._sealed.values())

    def take(self, limit: int | None = None) -> list[SealedSlot]:
        """Lease the oldest sealed slots not yet leased, in sequence order, for sending."""
        with self._lock:
            self._raise_seal_error()
            out = []
            for seq, slot in self._sealed.items():
                if seq in self._leased:
                    continue
                if limit is not None and len(out) >= limit:
                    break
                self._leased.add(seq)
                out.append(slot)
            return out

    def free(self, slot: SealedSlot) -> None:
        """Kafka acknowledged every record of ``slot``: give its space back. With a
        ``free_barrier`` (and ``sync_on_seal``) its header is marked free only after the
        barrier made the caller's record of the acknowledgement durable (the agent's: the
        acknowledged offsets its state database committed, ``StateDB.sync_log``): the kernel
        may write a header page back at any moment, and a free durable before the offset
        would leave bytes neither acknowledged nor in the pool after a power loss — read
        again as new records. The barrier runs for every slot freed since the last one, at
        most every ``FREE_SETTLE_S`` (``settle_frees``), and at once when no slot is free."""
        with self._lock:
            if self._sealed.get(slot.seq) is not slot:
                raise ValueError(f"slot seq {slot.seq} is not sealed in this pool")
            self._release(slot)
            self.counters["slots_freed"] += 1

    def _release(self, slot: SealedSlot) -> None:
        del self._sealed[slot.seq]
        self._leased.discard(slot.seq)
        if self._free_barrier is not None:
            self._freeing.append(slot)
            return
        self._give_back(slot)

    def settle_frees(self, force: bool = False) -> int:
        """Give back the slots freed since the last barrier, after a barrier, when
        ``FREE_SETTLE_S`` passed since it (or ``force``). Returns how many."""
        with self._lock:
            if not self._freeing or (not force and self.clock.monotonic_ns() - self._settled_ns
                                     < FREE_SETTLE_S * 1e9):
                return 0
            return self._settle()

    def freeing(self) -> bool:
        """Slots freed wait for their barrier (``settle_frees``)."""
        with self._lock:
            return bool(self._freeing)

    def _settle(self) -> int:
        batch, self._freeing = self._freeing, []
        try:
            self._free_barrier()
        except BaseException:
            self._freeing[:0] = batch
            raise
        self._settled_ns = self.clock.monotonic_ns()
        for slot in batch:
            self._give_back(slot)
        return len(batch)

    def _give_back(self, slot: SealedSlot) -> None:
        if slot.index is None:
            self.spill.remove(slot.seq)
        else:
            self.ops.crash_point("free:before_state")
            self._hdr[slot.index]["state"] = L.FREE     # one byte: cannot tear
            self._free.append(slot.index)
            if len(self._free) > HOT_FREE_SLOTS:
                self._release_pages(self._free[-HOT_FREE_SLOTS - 1])
        self._space.notify_all()

    def note_acked(self, slot: SealedSlot, records: int) -> None:
        """Kafka acknowledged the first ``records`` records of ``slot``: kept in its header
        (outside the CRC; not synced on its own: any copy that reaches the disk is true), so
        that a start after a crash sends it from there."""
        if slot.index is None:
            return
        with self._lock:
            h = self._hdr_bytes[slot.index]
            if self._hdr[slot.index]["state"] != L.SEALED or \
                    int(self._hdr[slot.index]["seq"]) != slot.seq:
                return                                  # freed (and perhaps used again)
            n = min(records, L.ACKED_MAX)
            if n > L.acked_of(h, slot.record_count):
                L.store_acked(h, n)

    def release_pages(self, slot: SealedSlot) -> None:
        """The caller copied what it needs of ``slot``: unmap its pages until they are used."""
        if slot.index is not None:
            with self._lock:
                self._release_pages(slot.index)

    def _release_pages(self, index: int) -> None:
        self._map._mmap.madvise(mmap.MADV_DONTNEED, self.geometry.slot_offset(index),
                                self.geometry.slot_bytes)

    # -- inspection ----------------------------------------------------------------------------
    def unacknowledged_starts(self, except_seq: int | None = None) -> dict[int, int]:
        """Per source, where the oldest bytes the pool holds begin — in its sealed slots
        (``except_seq`` left out: the one just acknowledged), its slots being sealed and its
        filling ones: an acknowledged offset must not pass them. After a start that read
        bytes again below a slot that survived, that later slot can be acknowledged before
        the earlier bytes are even sealed."""
        out: dict[int, int] = {}

        def note(source: int, start: int) -> None:
            if start < out.get(source, start + 1):
                out[source] = start

        with self._lock:
            for seq, slot in self._sealed.items():
                if seq != except_seq:
                    for source, start, _end in slot.meta.positions:
                        note(source, start)
            fills = [c.fill for c in self._closing] + list(self._current.values())
            for fill in fills:
                for source, (start, _end) in fill.positions.items():
                    note(source, start)
        return out

    def recovered_positions(self) -> dict[int, int]:
        """Per source, the end offset of the data found sealed at open: re-read from there."""
        return dict(self._recovered_positions)

    def stats(self) -> dict:
        with self._lock:
            in_pool = [s for s in self._sealed.values() if s.index is not None]
            return {
                "slot_count": self.geometry.slot_count,
                "slot_size_bytes": self.geometry.slot_bytes,
                "free_slots": len(self._free) + sum(1 for s in self._freeing
                                                    if s.index is not None),
                "settling_slots": len(self._freeing),     # free, waiting for the barrier
                "filling_slots": len(self._current) + len(self._closing),
                "sealed_slots": len(in_pool),
                "spilled_slots": len(self._sealed) - len(in_pool),
                "leased_slots": len(self._leased),
                # in the pool and being sent (so free + filling + waiting + sending = slots)
                "sending_slots": sum(1 for s in in_pool if s.seq in self._leased),
                "waiting_slots": sum(1 for s in in_pool if s.seq not in self._leased),
                "filling_records": sum(f.records for f in self._filling_slots()),
                "filling_bytes": sum(f.used for f in self._filling_slots()),
                "sealed_records": sum(s.record_count for s in self._sealed.values()),
                "sealed_bytes": sum(s.meta.used_bytes for s in self._sealed.values()),
                "spill_bytes": self.spill.used_bytes if self.spill else 0,
                "next_seq": self._next_seq,
                "next_record": self._next_record,
                **self.counters,
            }

    def _filling_slots(self) -> list[_Filling]:
        return [*self._current.values(), *(c.fill for c in self._closing)]

    def verify(self, slot: SealedSlot) -> None:
        """Check a slot's payload against its CRC (raises PoolCorrupt)."""
        if crc32c(slot.payload) != slot.meta.payload_crc:
            raise PoolCorrupt(f"slot seq {slot.seq} fails its payload CRC")

    def close(self) -> None:
        """Unmap the file and release its lock. Filling slots are not sealed (call seal_all()
        first to keep them); closed ones are."""
        self._stop_sealer()
        with self._lock:
            if self._mm is None:
                return
            if self._freeing:
                self._settle()
            self._sealed.clear()
            self._current.clear()
            self._hdr = self._fh = self._mm = None
            mm, self._map = self._map, None
            try:
                mm.flush()
                mm._mmap.close()
            finally:
                self._release_file_lock()

    def abandon(self) -> None:
        """For tests that simulate a crash: release the file's lock as a killed process would,
        writing nothing — nothing sealed, flushed or unmapped; filling slots stay ``filling``.
        A new pool may then open the file. Do not use this object afterwards. The sealing
        thread stops where it is, as a killed process's would."""
        with self._lock:
            self._closing.clear()
            self._unsynced.clear()
            self._sealer_stop = True
            self._closed.notify_all()
        self._release_file_lock()

    def _stop_sealer(self) -> None:
        """Let the sealing thread seal what was closed, then end it."""
        if self._sealer is None:
            return
        with self._lock:
            self._sealer_stop = True
            self._closed.notify_all()
        self._sealer.join()
        self._sealer = None
        self._raise_seal_error()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
