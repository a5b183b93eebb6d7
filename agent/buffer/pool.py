"""``BufferPool``: append chunks into slots, seal, hand sealed slots out in order, free, recover.

See the package docstring for the file layout, invariants and recovery rules.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from crc32c import crc32c

from . import layout as L
from .errors import PoolCorrupt
from .framing import (
    BLOCK_HEADER_BYTES,
    PER_RECORD_BYTES,
)
from .reader import PoolReader
from .recovery import PoolRecovery
from .sealer import PoolSealer
from .seams import Clock, FileOps
from .sending import PoolSending
from .slots import (
    ON_FULL,
    OVERSIZE,
    AppendResult,
    Closing,
    DropEvent,
    Filling,
    SealedSlot,
    SealedSlots,
    slot_meta,
)
from .spill import SlotMeta
from .writer import PoolWriter

__all__ = ["AppendResult", "BufferPool", "DropEvent", "SealedSlot", "slot_meta"]


class BufferPool(PoolRecovery, PoolWriter, PoolSealer, PoolSending, PoolReader):
    def __init__(
        self,
        path: str | Path,
        size_bytes: int,
        slot_size_bytes: int,
        *,
        linger_ms: float = 5,
        seal_when_idle: bool = True,
        seal_when_caught_up: bool = True,
        send_filling: bool = False,
        seal_every_ms: float = 1000,
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
        reserve_records: Callable[[int], None] | None = None,
        numbers_found: Callable[[int], int] | None = None,
    ):
        if on_full not in ON_FULL:
            raise ValueError(f"on_full must be one of {ON_FULL}, not {on_full!r}")
        if oversize not in OVERSIZE:
            raise ValueError(f"oversize must be one of {OVERSIZE}, not {oversize!r}")
        self.path = Path(path)
        self.linger_ns = int(linger_ms * 1_000_000)
        self.seal_when_idle = seal_when_idle
        self.seal_when_caught_up = seal_when_caught_up
        # A slot that would be sealed early (``seal_when_idle``, ``seal_when_caught_up``) is
        # sent while it fills instead, and sealed ``seal_every_ms`` after its first record
        # (or when full, or when another slot closes): one seal for every line that came
        # meanwhile, not one per line (``sending.py``).
        self.send_filling = send_filling
        self.seal_every_ns = int(seal_every_ms * 1_000_000)
        self._early: tuple[str, Filling] | None = None
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
            "stale_freed": 0, "spill_freed": 0, "acknowledged_freed": 0, "filling_kept": 0,
            "seal_finished": 0,
        }
        self.drop_events: list[DropEvent] = []
        self._lock = threading.RLock()
        self._space = threading.Condition(self._lock)
        self._current: dict[str, Filling] = {}
        # source → the first position of records it is handing over to several topics, not yet
        # all in a slot (``pending``): no slot sealed meanwhile takes an end past it.
        self._pending: dict[int, int] = {}
        # Per source, the highest end a slot closed while another slot of it still filled
        # had (its recorded end kept below that one's start): ``_below_filling``.
        self._clamped: dict[int, int] = {}
        self._sealed = SealedSlots()                     # seq → slot, in-pool and spilled
        self._leased: set[int] = set()
        self._free: list[int] = []                      # a stack: last freed is handed out first
        # Acknowledged slots wait here until ``free_barrier`` made what was written of their
        # acknowledgement durable (``free``); only with ``sync_on_seal``.
        self._free_barrier = free_barrier if sync_on_seal else None
        # Without ``sync_on_seal``: called with one past the last number a header (or a
        # dropped line) takes before it is written, so a durable bound covers every number
        # that may reach Kafka (``agent/state/numbers.py``); one that raises ``OSError``
        # (an I/O error) has that seal synced as ``sync_on_seal`` would.
        self._reserve_records = None if sync_on_seal else reserve_records
        self._cover_failed = False
        # At open, before any number is taken: given the highest next number found (the
        # caller's, the header's, the slots'), the next one to give (``NumberReserve.start``).
        self._numbers_found = numbers_found
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
        self._closing: deque[Closing] = deque()        # closed, not yet collected
        self._unsynced: deque[Closing] = deque()       # closed, not yet sealed on disk
        self._closed = threading.Condition(self._lock)   # a closed slot sealed, or failed
        self._seal_error: BaseException | None = None
        self._sealer: threading.Thread | None = None
        self._sealer_stop = False
        # Each slot handed out gets the next mark (``L.KEPT_OFFSET``); a random start, so no
        # fill is marked as one of a former run.
        self._fill_mark = int.from_bytes(os.urandom(8), "little")

        self.geometry = L.Geometry.fit(size_bytes, slot_size_bytes)
        self._unlock: weakref.finalize | None = None    # closes the fd holding the file's flock
        try:
            self._open(first_seq, first_record, spill_dir, spill_max_bytes)
        except BaseException:
            self._release_file_lock()        # a refused open leaves the file to the next opener
            raise
        # Record capacity: the largest value one record may have in an empty slot, or less.
        self.max_value_bytes = self.geometry.payload_bytes - BLOCK_HEADER_BYTES \
            - PER_RECORD_BYTES - 8
        if max_record_bytes is not None:
            self.max_value_bytes = min(self.max_value_bytes, max_record_bytes)
        if seal_thread and sync_on_seal:
            self._sealer = threading.Thread(target=self._seal_loop, name="docket-seal",
                                            daemon=True)
            self._sealer.start()

    # -- inspection ----------------------------------------------------------------------------
    def unacknowledged_starts(self, except_seq: int | None = None,
                              sources: Iterable[int] | None = None) -> dict[int, int]:
        """Per source (of ``sources``; None: every one), where the oldest bytes the pool
        holds begin — in its sealed slots (``except_seq`` left out: the one just
        acknowledged), its slots being sealed and its filling ones: an acknowledged offset
        must not pass them. After a start that read bytes again below a slot that survived,
        that later slot can be acknowledged before the earlier bytes are even sealed."""
        out: dict[int, int] = {}

        def note(source: int, start: int) -> None:
            if start < out.get(source, start + 1):
                out[source] = start

        wanted = None if sources is None else set(sources)
        with self._lock:
            starts = self._sealed.starts
            for source in (starts if wanted is None else wanted):
                for seq, start in starts.get(source, {}).items():
                    if seq != except_seq:
                        note(source, start)
            fills = [c.fill for c in self._closing] + list(self._current.values())
            for fill in fills:
                for source, (start, _end) in fill.positions.items():
                    if wanted is None or source in wanted:
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

    def _filling_slots(self) -> list[Filling]:
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
