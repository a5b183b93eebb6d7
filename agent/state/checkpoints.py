"""Where each source stands, as the state database keeps it: the bytes *sealed* (in a slot of
the pool, so a restart reads on from there) and the bytes *acknowledged* (Kafka holds every
record of them), per source, with the map from record numbers to files (``locate``).

The pool seals a slot under its lock, in the agent's loop or a socket source's thread
(``sealed``: the slot's source positions and record runs are noted, under a lock of their own,
nothing is written); the agent's loop writes what was noted in one transaction each
turn (``flush``), with the producer tier's counts, the next record number and the files'
anchors (``agent/tail/anchors.py``); the drain reports
each slot Kafka acknowledged whole (``acknowledged``). A source's acknowledged offset moves only
over contiguous acknowledged bytes: never past the start of an older slot of that source still
in flight, or in the pool at all (``BufferPool.unacknowledged_starts``: every slot on its
way is still sealed there, or being sealed, or filling).

A write the file system refuses for lack of space (``agent/state/diskguard.py``) is rolled back by
SQLite whole; what it carried stays noted here and goes with the next flush that may write, and
the guard pauses reading meanwhile. Nothing noted is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ..buffer import SealedSlot
from .db import StateDB
from .diskguard import DiskGuard, disk_full

FORGET_EVERY_S = 60.0              # the locate map's retention is applied this often


class Checkpoints:
    """The sealed and acknowledged positions of every source of one agent, on their way into
    ``db``. ``now`` is the agent's monotonic clock in seconds."""

    def __init__(self, db: StateDB, now: Callable[[], float], locate_retention_ms: int,
                 guard: DiskGuard | None = None,
                 anchors: Callable[[dict[int, int]], dict[int, bytes]] | None = None):
        self.db = db
        self.anchors = anchors       # sealed ends → the generations' anchors to store with them
        self.guard = guard
        self.now = now
        self.locate_retention_ms = locate_retention_ms
        self._noted = threading.Lock()              # the two lists below: socket sources'
        #                                             threads add to them too
        self._sealed_positions: list[tuple] = []    # of slots sealed since the last flush
        self._sealed_runs: list[tuple] = []         # their locate rows
        self._acked_ahead: dict[int, int] = {}      # source → end acknowledged, not yet
        #                                             contiguous (an older slot in flight)
        self._acked_unwritten: dict[int, int] = {}  # source → acknowledged end to write
        self._seal_times: dict[int, float] = {}     # slot seq → when it was sealed
        self._next_forget = 0.0

    def recovered(self, slots: Iterable[SealedSlot]) -> None:
        """Slots found sealed in the pool at start: waiting for Kafka from now."""
        for slot in slots:
            self._seal_times[slot.seq] = self.now()

    def sealed(self, slot: SealedSlot) -> None:
        """The pool sealed ``slot`` (under its lock): noted, written at the next ``flush``."""
        runs = [(first, n, slot.topic, src, start, end, True)
                for first, n, src, start, end in slot.segments]
        with self._noted:
            self._sealed_positions.append(slot.meta.positions)
            self._sealed_runs.extend(runs)
        self._seal_times[slot.seq] = self.now()

    def seal_time(self, seq: int) -> float | None:
        """When the slot ``seq`` was sealed, if it still waits for Kafka."""
        return self._seal_times.get(seq)

    def flush(self, next_record: Callable[[], int], audit_persist, audit_pending: bool,
              audit_written: Callable[[], None] = lambda: None) -> None:
        """Write the sealed positions and record runs noted since the last flush, with the
        audit's counts (``audit_persist``; ``audit_written`` once they are stored) and the
        pool's next record number, in one transaction; then the acknowledged offsets; apply the
        locate map's retention once a minute. ``next_record`` is read after the noted slots are
        taken: a slot sealed meanwhile (a socket source's thread) waits for the next flush, and
        the number stored is never below a run stored with it. Sealed before acknowledged: an
        acknowledged offset is never stored past a sealed one still unwritten (the database
        would clamp it, and the start's self-check would then read the bytes again)."""
        if self.guard is not None and not self.guard.write_due():
            return                               # a write was refused a moment ago
        if self.guard is not None and self.guard.refusing \
                and not self._write(self.db.touch, "a probe"):
            return                               # still no room: nothing else is tried
        now = self.now()
        if now >= self._next_forget:
            self._next_forget = now + FORGET_EVERY_S
            if not self._write(lambda: self.db.forget_runs(self.locate_retention_ms),
                               "the record-number map's retention"):
                return
        if self._sealed_positions or audit_pending:
            with self._noted:
                batch, self._sealed_positions = self._sealed_positions, []
                runs, self._sealed_runs = self._sealed_runs, []
            ends: dict[int, int] = {}
            for positions in batch:
                for source, _start, end in positions:
                    ends[source] = max(end, ends.get(source, 0))
            anchors = self.anchors(ends) if self.anchors is not None and ends else None
            if not self._write(lambda: self.db.advance_sealed(
                    ends, audit=audit_persist, next_record=next_record(), runs=runs,
                    anchors=anchors), "the sealed checkpoints"):
                with self._noted:
                    self._sealed_positions[:0] = batch
                    self._sealed_runs[:0] = runs
                return
            audit_written()
        self._write_acked()

    def sealed_waiting(self) -> bool:
        """Whether sealed positions were noted since the last write that passed."""
        with self._noted:
            return bool(self._sealed_positions)

    def unwritten(self) -> str:
        """What waits to be written (a refused write), for a log line; empty when nothing."""
        parts = []
        if self._sealed_positions:
            parts.append(f"the sealed checkpoints of {len(self._sealed_positions)} slot(s)")
        if self._acked_unwritten:
            parts.append(f"the acknowledged offsets of {len(self._acked_unwritten)} file(s)")
        return " and ".join(parts)

    def _write_acked(self) -> None:
        if not self._acked_unwritten:
            return
        acked, self._acked_unwritten = self._acked_unwritten, {}
        if not self._write(lambda: self.db.advance_acked(acked), "the acknowledged offsets"):
            for src, end in acked.items():
                self._acked_unwritten[src] = max(end, self._acked_unwritten.get(src, 0))

    def _write(self, write: Callable[[], None], what: str) -> bool:
        """Run one database write; False when the file system refused it for lack of space
        (the guard is told; SQLite rolled it back)."""
        try:
            write()
        except Exception as exc:
            if self.guard is None or not disk_full(exc):
                raise
            self.guard.refused(exc, f"writing {what} to the state database")
            return False
        if self.guard is not None:
            self.guard.written()
        return True

    def settling(self, slot: SealedSlot) -> set[int]:
        """The sources ``acknowledged(slot, …)`` moves (the slot's, and those whose
        acknowledged offset waits for an older slot): the ``held`` it needs, of those alone."""
        return set(self._acked_ahead) | {src for src, _s, _e in slot.meta.positions}

    def acknowledged(self, slot: SealedSlot, held: dict[int, int]) -> None:
        """Kafka acknowledged every record of ``slot``; ``held``: per source (at least those
        of ``settling``), where the oldest bytes the pool still holds begin
        (``BufferPool.unacknowledged_starts``, ``slot`` left out) — older slots in flight, and
        more: after a start that read bytes again below a slot that survived, those bytes are
        in younger slots, or not sealed yet, when the survivor is acknowledged. The
        acknowledged offset passes none of them (were it written past them, a power cut
        losing their slots would leave them taken for delivered)."""
        self._seal_times.pop(slot.seq, None)
        ahead = self._acked_ahead
        for src, _s, end in slot.meta.positions:
            ahead[src] = max(end, ahead.get(src, 0))
        ends = dict(ahead)
        for src, start in held.items():           # per source, the first byte still owed
            if src in ends and start < ends[src]:
                ends[src] = start
        for src, end in ends.items():
            if end >= ahead[src]:
                del ahead[src]                  # contiguous again
        for src, end in ends.items():
            self._acked_unwritten[src] = max(end, self._acked_unwritten.get(src, 0))
        # Written now, before the drain frees the slot (a SIGKILL after the free must find
        # the offset moved), unless sealed checkpoints wait to be written (disk full): the
        # database would clamp the offset to them.
        if not self._sealed_positions and (self.guard is None or self.guard.write_due()):
            self._write_acked()
