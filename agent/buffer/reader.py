"""Handing sealed slots out in order, and freeing them once acknowledged (after the free barrier);
the acknowledged prefix kept in a slot's header.

A part of ``BufferPool`` (``pool.py``), as a mixin: the state it works on is the pool's,
set up in ``BufferPool.__init__``.
"""

from __future__ import annotations

from . import layout as L
from .slots import (
    FREE_SETTLE_S,
    HOT_FREE_SLOTS,
    SealedSlot,
)


class PoolReader:
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
        self.ops.unmap(self._map._mmap, self.geometry.slot_offset(index),
                       self.geometry.slot_bytes)
