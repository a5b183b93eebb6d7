"""At start, before any file is read: is every byte the checkpoints call sealed still accounted for?

A generation's bytes ``[0, sealed_offset)`` were handed to the pool and sealed. Those below
``acked_offset`` Kafka acknowledged (the drain advances it only over contiguous acknowledged
slots, so nothing below it waits in the pool). Those in ``[acked_offset, sealed_offset)`` must
therefore be in a sealed slot of the pool, to be sent again. When they are not — the pool file
was moved away or replaced, or damaged beyond what recovery quarantines and journals — they
would be lost without a trace. So the checkpoint goes back to the first such byte: the bytes
are read again from the source if it is still there (some may then arrive twice), and if it is
not, the generation's loss is journaled from there like any file gone while the agent was
stopped (``agent/tail/files.py``).
"""

from __future__ import annotations

import logging

from ..buffer import SealedSlot
from .db import DONE, ROTATED, StateDB

log = logging.getLogger("docket.agent.selfcheck")


def first_gap(lo: int, hi: int, spans: list[tuple[int, int]]) -> int | None:
    """The first byte of ``[lo, hi)`` no span covers, or None."""
    at = lo
    for start, end in sorted(spans):
        if start > at:
            break
        at = max(at, end)
        if at >= hi:
            return None
    return at if at < hi else None


def acknowledged_whole(positions, acked: dict[int, int]) -> bool:
    """Whether a slot of ``positions`` (source, start, end) lies wholly within its sources'
    acknowledged offsets ``acked`` (source → offset): Kafka acknowledged every record of it.
    A slot without positions (a socket source's) cannot tell: False. A span of no bytes holds
    parts of the record that begins there (the parts of a line longer than a slot, before its
    last: the checkpoint must not pass the line): acknowledged only once the offset is past
    it, which the last part's acknowledgement makes it."""
    return bool(positions) and all(end < acked.get(src, -1) if end == start
                                   else end <= acked.get(src, -1)
                                   for src, start, end in positions)


def rewind_uncovered(db: StateDB, sealed: list[SealedSlot]) -> dict[int, int]:
    """Move back the sealed checkpoint of every generation whose unacknowledged bytes are not
    all in ``sealed`` (the pool's slots after recovery). Returns {source_id: new offset}."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for slot in sealed:
        for source, start, end in slot.meta.positions:
            spans.setdefault(source, []).append((start, end))
    moved = {}
    for row in db.all_files():
        gap = first_gap(row["acked_offset"], row["sealed_offset"],
                        spans.get(row["source_id"], []))
        if gap is None:
            continue
        log.warning("%s (source %d): bytes %d-%d were sealed but are neither acknowledged nor "
                    "in the pool (was the pool file replaced?): reading them again from %d",
                    row["path"], row["source_id"], gap, row["sealed_offset"], gap)
        # A closed file is looked for again at start, so its bytes are read or journaled.
        state = ROTATED if row["state"] == DONE else row["state"]
        db.rewind(row["source_id"], gap, state)
        moved[row["source_id"]] = gap
    return moved

