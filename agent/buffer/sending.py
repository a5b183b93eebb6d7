"""Sending a slot while it fills (``send_filling``): at low rates a reader that caught up would
seal a slot per line, and a seal — its syncs, its state transaction, the slot's way through the
drain and back — cost far more than the line. Instead the lone filling slot is *shown* to the
drain as it grows and sealed whole ``seal_every_ns`` after its first record (or when full, or
when another slot must close first).

Showing keeps every durability rule of a seal: the bytes shown are synced (``sync_on_seal``),
then the slot's header is written as a sealed slot of the records shown so far — its sequence
and record numbers, taken when it began, its sources' positions — and synced, with the file
header's next numbers, before the drain sends them. A crash or a power loss after a show finds
a sealed slot of those records (the start sends it from its acknowledged prefix and reads the
files on from its positions, as after any seal): a number sent is never given to another line.
The checkpoints, the audit's counts and the slot's hand-over to the drain happen once, at the
seal.

A part of ``BufferPool`` (``pool.py``), as a mixin: the state it works on is the pool's,
set up in ``BufferPool.__init__``.
"""

from __future__ import annotations

from .slots import Closing, Filling, SealedSlot


class PoolSending:
    def _send_early(self, topic: str) -> bool:
        """The topic's slot, due to be sealed early, is sent while it fills instead, when
        it is the only slot filling, holds no records a crash keeps (a listener's), nothing
        is being sealed, every sealed slot is on its way and no source hands records over to
        several topics: it takes the next sequence and record numbers now (no other slot
        closes before it does: ``_close_early_first``)."""
        fill = self._current[topic]
        if self._closing or not self._may_go_early(fill):
            return False
        fill.early, fill.seq, fill.first_record = True, self._next_seq, self._next_record
        self._early = (topic, fill)
        return True

    def _may_go_early(self, fill: Filling) -> bool:
        """Whether ``fill`` may be sent while it fills once no slot is being sealed: every
        condition of ``_send_early`` but that one."""
        return (self.send_filling and len(self._current) == 1 and not fill.once
                and not self._pending and len(self._sealed) == len(self._leased))

    def _close_early_first(self, topic: str | None = None) -> None:
        """Seal the slot sent while it fills before another slot of ``topic`` (None: of any
        topic) opens or closes, records are handed to several topics, or a number is taken
        for a record not sealed: it took the next numbers when it began."""
        if self._early is not None and self._early[0] != topic:
            self._seal(self._early[0])

    def _due(self, fill: Filling, now: int) -> bool:
        """Whether ``fill`` is due to be sealed: its linger passed (``_linger_over``), or,
        sent while it fills, ``seal_every_ns`` since its first record."""
        if fill.early:
            return now - fill.first_ns >= self.seal_every_ns
        return self._linger_over(fill, now)

    def filling_send(self) -> tuple[str, Filling] | None:
        """The slot sent while it fills (topic, slot), or None."""
        with self._lock:
            return self._early

    def take_filling(self) -> tuple[Filling, SealedSlot] | None:
        """Lease the slot to send while it fills, when there is one not yet taken: (the slot,
        what it holds so far, shown: ``show_filling``). Once sealed, the slot is the same
        send's (``Filling.sealed``), never handed out by ``take``."""
        with self._lock:
            self._raise_seal_error()
            if self._early is None or self._early[1].taken:
                return None
            fill = self._early[1]
            view = self._show(fill)
            fill.taken = True               # (a show that failed leaves it to be taken)
            return fill, view

    def show_filling(self, fill: Filling) -> SealedSlot | None:
        """What ``fill``, taken to send while it fills, holds now, shown (its header a sealed
        slot of them, synced); None when nothing came since the last show, or when it was
        closed (``fill.sealed`` is its slot once sealed)."""
        with self._lock:
            self._raise_seal_error()
            if self._early is None or self._early[1] is not fill or fill.used == fill.shown:
                return None
            return self._show(fill)

    def _show(self, fill: Filling) -> SealedSlot:
        """Seal ``fill``'s records so far in its header, as a seal would (its bytes synced,
        then the header written and synced), the slot staying open for more; the slot the
        drain sends them from."""
        topic = self._early[0]
        positions = tuple((src, start, end) for src, (start, end) in fill.positions.items())
        if fill.used > fill.shown:
            header, ext = self._header(topic, fill, fill.seq, fill.first_record, positions)
            # as a seal writes it (the first show zeroes ``acked``, later ones keep it)
            self._write_synced(Closing(topic, fill, fill.seq, fill.first_record, positions,
                                       header, ext=ext))
            self.ops.crash_point("show:after_header")
            fill.shown, fill.shown_records = fill.used, fill.records
        return SealedSlot(fill.meta(fill.seq, topic, positions, fill.first_record), fill.index,
                          self._payload_view(fill.index, fill.used))

    def seal_at_ns(self) -> int | None:
        """When the slot sent while it fills is due to be sealed (monotonic ns), or None."""
        with self._lock:
            if self._early is None or self._early[1].first_ns is None:
                return None
            return self._early[1].first_ns + self.seal_every_ns

    def _shown_marks(self) -> tuple[int, int | None]:
        """(the number after the last one the slot sent while it fills has shown, or the next
        number; the first number of it once something is shown, or None)."""
        if self._early is None or not self._early[1].shown:
            return self._next_record, None
        fill = self._early[1]
        return fill.first_record + fill.shown_records, fill.first_record
