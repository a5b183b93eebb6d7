"""Sealing: a filling slot closed (numbered) and sealed — its data, then its header synced — at
once or by the sealing thread, collected in order; record numbers handed out.

A part of ``BufferPool`` (``pool.py``), as a mixin: the state it works on is the pool's,
set up in ``BufferPool.__init__``.
"""

from __future__ import annotations

import logging
import mmap

import numpy as np
from crc32c import crc32c

from . import layout as L
from .slots import (
    CAUGHT_UP_IN_FLIGHT,
    RESIDENT_WAITING_SLOTS,
    Closing,
    Filling,
    SealedSlot,
)

log = logging.getLogger("docket.agent.buffer")


class PoolSealer:
    # -- sealing -------------------------------------------------------------------------------
    def pending(self, source: int, position: int | None) -> None:
        """A source handing records over to several topics, one topic after another: from
        ``position`` on, some are in no slot yet (None: all are now)."""
        with self._lock:
            if position is None:
                self._pending.pop(source, None)
            else:
                self._close_early_first()
                self._pending[source] = position

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
        sealed (closed, with the sealing thread).

        With ``send_filling``, a lone filling slot that would be sealed early is sent while
        it fills instead (``_send_early``); it is sealed ``seal_every_ns`` after its first
        record. While another slot is being sealed it waits for a later turn (or its linger)
        instead of being sealed at once."""
        now = self.clock.monotonic_ns()
        with self._lock:
            self._raise_seal_error()
            self._collect()
            idle = self.seal_when_idle and not self._sealed and not self._closing
            early = idle or (caught_up and self.seal_when_caught_up
                             and len(self._sealed) == len(self._leased)
                             and len(self._sealed) + len(self._closing) < CAUGHT_UP_IN_FLIGHT)
            due = [t for t, f in self._current.items()
                   if self._due(f, now) or (early and f.records and not f.early)]
            if early and len(due) == 1 and not self._current[due[0]].early:
                fill = self._current[due[0]]
                if self._send_early(due[0]):
                    due = []
                elif self._may_go_early(fill) and not self._due(fill, now):
                    # Refused only because a slot is being sealed (the sealing thread syncs
                    # it): this one is sent while it fills at a turn after that, not sealed at
                    # once now — else each turn's slot, sealed while the one before it is,
                    # keeps the next from going early (over 100 files, a seal every 2.5
                    # lines). Its linger bounds the wait while the drain keeps up.
                    due = []
            for topic in due:
                self._seal(topic, at_once=early)
            return len(due)

    def _linger_over(self, fill: Filling, now: int) -> bool:
        """Linger bounds latency only while the drain keeps up: with a sealed slot still waiting
        to be taken (an outage, a slow cluster) sealing early would not send anything sooner,
        and small slots would use up the pool's slot count long before its bytes."""
        if fill.first_ns is None or now - fill.first_ns < self.linger_ns:
            return False
        return len(self._sealed) == len(self._leased)

    def filling(self) -> bool:
        """Records wait in a filling slot (for their linger, or the next ``seal_due``), or in
        a closed one not yet sealed; not the slot sent while it fills (its records are on
        their way already)."""
        with self._lock:
            return bool(self._closing) or any(f.records and not f.early
                                              for f in self._current.values())

    def seal_all(self) -> int:
        """Seal every filling slot, and wait until every closed one is sealed."""
        with self._lock:
            topics = sorted(self._current, key=lambda t: self._current[t] is not (
                self._early[1] if self._early else None))      # the one sent early first
            n = sum(self._seal(t) is not None for t in topics)
            self._wait_sealed()
            return n

    def _seal(self, topic: str, at_once: bool = False) -> int | None:
        """Close the topic's filling slot and seal it: at once, or (``seal_thread``) by the
        sealing thread, in order. ``at_once``: by the caller even with the thread, when no
        other closed slot waits — a reader that caught up seals early for latency, and handing
        a lone slot to the thread and back only adds the two threads' turns to it (1,000
        lines/s: p50 9.0-9.9 ms against 5.7-6.9 sealed at once). Returns its sequence number."""
        self._close_early_first(topic)
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
                if fill.early:                  # still the slot sent while it fills
                    self._early = (topic, fill)
            raise
        return closing.seq

    def _close(self, topic: str, fill: Filling) -> Closing:
        """Number the slot and build its header aside; nothing is written to its header yet."""
        seq = self._next_seq
        first_record = self._next_record
        if fill.early:
            assert (fill.seq, fill.first_record) == (seq, first_record), \
                "a slot closed before the one sent while it filled"
            self._early = None
        positions = tuple(_below_filling(fill.positions, self._current.values(),
                                         self._pending, self._clamped))
        header, ext = self._header(topic, fill, seq, first_record, positions)
        self._next_seq = (seq + 1) % L.SEQ_MOD
        self._next_record = first_record + fill.records
        return Closing(topic, fill, seq, first_record, positions, header, ext=ext)

    def _header(self, topic: str, fill: Filling, seq: int, first_record: int,
                positions) -> tuple[np.ndarray, tuple[int, bytes] | None]:
        """A header's bytes up to its state, for ``fill`` as it is now, and (more sources
        than the header holds) its positions page: (which, its bytes), the page after the
        one the slot's last header written named (``_ext_last``, set as a header is written:
        a show whose sync failed leaves it), written before this header is."""
        tb = topic.encode()
        area = 1 - int(self._ext_last[fill.index]) if len(positions) > L.MAX_POSITIONS else 0
        pos, page = L.split_positions(positions, seq, area)
        self._scratch[0] = (L.SLOT_MAGIC, len(tb), len(positions), seq, fill.records, fill.used,
                            fill.min_ts, fill.max_ts, fill.crc, fill.blocks, first_record, pos, tb,
                            0, L.FILLING, 0)
        self._scratch[0]["header_crc"] = crc32c(self._scratch_bytes[:L.HEADER_CRC_SPAN])
        return self._scratch_bytes[:L.STATE_OFFSET].copy(), \
            None if page is None else (area, page)

    def _seal_closed(self, c: Closing) -> None:
        """Seal the oldest closed slot ``c`` at once, under the lock (without ``seal_thread``,
        or ``at_once`` with nothing else closed): its data synced, then its header, then the
        header synced."""
        self._write_synced(c)
        c.synced = True
        self._sealed_now(c)

    def _write_synced(self, c: Closing) -> None:
        """``c``'s data synced, then its header written, then the headers synced (with
        ``sync_on_seal``; else only written): a seal at once, a kept slot's at open, a show
        of a slot sent while it fills (``sending.py``)."""
        self._write_ext(c)
        synced = self.sync_on_seal or not self._covered(c.first_record + c.fill.records)
        if synced:
            self._sync_data(self._map._mmap, c)
        self._write_header(c)
        if synced:
            self._sync_headers(self._map._mmap, c.fill.index)

    def _covered(self, needed: int) -> bool:
        """Without ``sync_on_seal``: whether the durable bound now covers every number below
        ``needed`` (``reserve_records``); False when it could not be written (an I/O error):
        the caller then syncs the header that counts them, as ``sync_on_seal`` does."""
        if self._reserve_records is None:
            return True
        try:
            self._reserve_records(needed)
        except OSError as exc:
            if not self._cover_failed:
                log.error("the record-number bound cannot be written (%s): every seal is "
                          "synced until it can be", exc)
                self._cover_failed = True
            return False
        if self._cover_failed:
            log.info("the record-number bound is written again: seals are no longer synced")
            self._cover_failed = False
        return True

    def _write_ext(self, c: Closing) -> None:
        """``c``'s positions page, when its header names one, into its place."""
        if c.ext is not None:
            area, page = c.ext
            at = self.geometry.ext_offset(c.fill.index, area)
            self._mm[at:at + len(page)] = np.frombuffer(page, np.uint8)

    def _sync_data(self, mm: mmap.mmap, c: Closing) -> None:
        """Sync ``c``'s data, and its positions page with it (one ``msync``: the pages
        between are clean)."""
        o = self.geometry.slot_offset(c.fill.index)
        end = c.fill.used if c.ext is None else \
            self.geometry.ext_offset(c.fill.index, c.ext[0]) + len(c.ext[1]) - o
        self.ops.msync(mm, o, end)

    def _unmap_closed(self, c: Closing) -> None:
        """Before a closed slot's data is synced, drop the agent's mapping of it (nothing
        writes it again before it is freed). A sync of pages the process maps writable
        write-protects them one by one, each with a flush of the TLB of every CPU the
        agent's threads run on — an interrupt to each, and a wait for it, per page (on this
        project's 2-CPU virtual machine 18 % of the agent's own CPU in a bulk run). With no
        mapping the sync has nothing to protect, and the drop is one flush for the whole
        slot; the reads that follow (the audit's tally, the send) map the pages again from
        the page cache. docs/buffer.md, "Sealing"."""
        self._release_pages(c.fill.index)

    def _write_header(self, c: Closing) -> None:
        """Store every byte of the header but the state in one copy, then the state."""
        self.ops.crash_point("seal:before_header")
        if not c.fill.shown:            # a slot sent while it filled keeps its acknowledgements
            self._hdr_bytes[c.fill.index, L.ACKED_OFFSET:] = 0
        self._hdr_bytes[c.fill.index, :L.STATE_OFFSET] = c.header
        if c.ext is not None:           # the page this header names: the next one is the other
            self._ext_last[c.fill.index] = c.ext[0]
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

    def _sealed_now(self, c: Closing) -> None:
        """The oldest closed slot ``c`` is sealed on disk: hand it to the drain."""
        self.ops.crash_point("seal:after_state")
        self._closing.popleft()
        fill, index = c.fill, c.fill.index
        meta = fill.meta(c.seq, c.topic, c.positions, c.first_record)
        segments = tuple((c.first_record + k, n, src, b, e) for k, n, src, b, e in fill.segments)
        slot = self._sealed[c.seq] = SealedSlot(meta, index, self._payload_view(index, fill.used),
                                                segments=segments)
        if fill.taken:                  # its send is on its way: it goes on with the slot
            self._leased.add(c.seq)
            fill.sealed = slot
        self.counters["slots_sealed"] += 1
        if self._on_seal is not None:
            self._on_seal(slot)                     # while its pages are in the page cache
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
                    self._write_ext(c)
                    self._unmap_closed(c)
                    self._sync_data(mm, c)
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

    def _abandoned(self, c: Closing) -> bool:
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
        are sealed first: the header never counts past numbers of a slot not yet on disk; so
        is a slot sent while it fills (it took the next numbers when it began)."""
        self._close_early_first()
        self._wait_sealed()
        first = self._next_record
        self._next_record += n
        self._fh[0]["next_record"] = self._next_record
        if not self.sync_on_seal and not self._covered(self._next_record):
            self.ops.msync(self._map._mmap, 0, L.FILE_HEADER.itemsize)
        return first

    @property
    def next_record(self) -> int:
        """The number the next sealed record gets: every lower one was given out, and is in a
        sealed slot or journalled (a closed slot's numbers count once it is sealed; those of
        a slot sent while it fills once shown, ``sending.py``)."""
        with self._lock:
            return self._closing[0].first_record if self._closing else self._shown_marks()[0]

    def record_marks(self) -> tuple[int, int]:
        """(the last record number given, the highest number up to which every one is
        settled), read together: a number is settled once its slot was freed (Kafka
        acknowledged every record of it, or the slot was dropped and journalled) or when it
        was never sealed (a dropped line's number, journalled). Numbers of sealed slots that
        are waiting, in flight or spilled are not, nor those a slot sent while it fills
        showed."""
        with self._lock:
            given, shown_from = self._shown_marks()
            waiting = min((s.first_record for s in self._sealed.values() if s.record_count),
                          default=given)
            if self._closing:
                waiting = min(waiting, self._closing[0].first_record)
            if shown_from is not None:
                waiting = min(waiting, shown_from)
            return given - 1, min(waiting, given) - 1


def _below_filling(spans: dict[int, list[int]], filling, pending: dict[int, int],
                   clamped: dict[int, int]) -> list[tuple[int, int, int]]:
    """A closing slot's (source, start, end) positions, each end kept at or below the first
    byte of its source that another slot still filling holds: a source whose records go to
    several topics (routing by field) has them in several slots at once, and a sealed
    checkpoint past such a byte would skip it after a crash that took the filling slot (the
    records between are read again instead: duplicates); nor past the first position of
    records such a source is still handing over (``pending``: a batch goes to its topics one
    after another, so the others' records are in no slot yet). Without routing no other slot
    holds the source, and the positions are the slot's own.

    A slot whose end was kept lower notes its own end in ``clamped``; the next slot of the
    source to close with none other filling and nothing pending ends at the highest of those
    too (slots are sealed in the order they close, so every one closed before it is on disk
    by then, and every byte below is in one of them): a source's last slots do not leave its
    sealed checkpoint below what they hold, to be read again at the next start."""
    floor: dict[int, int] = dict(pending)
    for other in filling:
        for src, (start, _end) in other.positions.items():
            floor[src] = min(start, floor.get(src, start))
    out = []
    for src, (start, end) in spans.items():
        if src in floor and floor[src] < end:
            clamped[src] = max(end, clamped.get(src, end))
            end = floor[src]
            start = min(start, end)
        elif src not in floor:
            end = max(end, clamped.pop(src, end))
        else:                   # what is still filling or pending lies above every end noted
            end = max(end, min(clamped.get(src, end), floor[src]))
        out.append((src, start, end))
    return out
