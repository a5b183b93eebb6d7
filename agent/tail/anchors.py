"""Anchors: what a generation held just before points it was sealed to, so that a start can tell
whether the file still holds, below its checkpoint, the content that was read there.

A power loss takes the application's unsynced writes with it: its log comes back shorter, its
head unchanged, and the application writes on from the cut. The agent, which read those lost
bytes from the page cache before the cut and sealed them, would resume at its checkpoint —
beyond the cut, in the middle of the new lines — and skip every new line written below it,
without a trace. Sizes cannot tell (the file may have grown past the checkpoint again by the
time the agent starts); content can.

So with each sealed checkpoint the state database keeps, per generation, up to ``KEPT``
anchors: an offset the generation was handed to the pool up to (always a line's end; the newest
such offset at or below the sealed one) and the CRC-32 of the ``SPAN`` bytes before it, as they
were read (the reader notes each hand-over: a file rewritten between the read and the seal must
not make a false anchor). The newest follows the checkpoint; an older one is kept at most
every ``EVERY_S`` seconds, so the anchors reach back about ``KEPT * EVERY_S`` seconds of
reading. Beside them, ``FINE_KEPT`` of the hand-overs the seals passed are anchors too, every
one near the newest and thinner further back (``add_fine``): where a power cut is likeliest to
have cut the file — in the last fraction of a second of its writing, behind the read by the
application's last sync — reading resumes within a few hand-overs of the cut (where a second's
spacing re-read up to a second's lines under new record numbers); the two kinds are stored
apart (``pack``), so a start keeps both. A generation started past its first byte (a copy of
content read elsewhere, ``read_from = "end"``) has its start for an anchor. At start
(``resume_at``) the newest anchor at or below the checkpoint is checked against the file; if
the file no longer holds it, the newest anchor it still holds is where reading resumes (the
lines from there to the cut arrive twice; none is skipped), or the
generation's start when it holds none.

The pool is synced at each seal, the state database's commits at most every 0.2 s: after a
power cut the pool may hold slots read past the newest anchor the database kept, and reading
resumes at their end. The bytes from that anchor to there are checked against what the slot
ending there read (``tail_read``: its last records, as the file held them before that end);
a file that no longer holds them was cut back, and is read again from the first record of those
slots it no longer holds as read (``FileSource._still_held``), or from the anchor. Past a hole
(zeros where a cut dropped a page below one it kept), the lines the file still holds as the
pool's slots read them are passed unread (``FileSource._held_beyond``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

SPAN = 64                  # bytes before an anchor's offset its checksum covers
KEPT = 48                  # anchors kept per generation, a second or more apart
EVERY_S = 1.0              # an older anchor kept at most this often (monotonic s)
FINE_KEPT = 64             # hand-overs kept as anchors besides: every one near the newest,
FINE_RATIO = 16            # thinner further back, d bytes below it about d / FINE_RATIO apart
HANDED_KEPT = 256          # hand-overs remembered until a seal reaches them (then the oldest
#                            go: an anchor a little older than the seal is still exact)
_ENTRY = struct.Struct("<QI")
# The stored form, with fine anchors: this offset with the count of the anchors a second apart,
# then those, then the fine ones; without (an older agent's form), every anchor is a coarse one.
# An agent that knows no fine anchors (after a downgrade) reads the mark as an anchor past any
# checkpoint, never checked, and its last entry as the newest anchor, after which it adds its
# own: a mark at the end stopped it adding any, and a power cut then skipped lines unseen.
_FINE_MARK = (1 << 64) - 1

Anchor = tuple[int, int]   # (offset, CRC-32 of the SPAN bytes before it)


def _entries(blob: bytes | None) -> list[Anchor]:
    if not blob or len(blob) % _ENTRY.size:
        return []
    return [_ENTRY.unpack_from(blob, i) for i in range(0, len(blob), _ENTRY.size)]


def unpack_split(blob: bytes | None) -> tuple[list[Anchor], list[Anchor]]:
    """The stored anchors as (those a second apart, the fine ones)."""
    entries = _entries(blob)
    if entries and entries[0][0] == _FINE_MARK and entries[0][1] < len(entries):
        n = entries[0][1]
        rest = [a for a in entries[1 + n:] if a[0] != _FINE_MARK]
        return entries[1:1 + n], rest
    return [a for a in entries if a[0] != _FINE_MARK], []


def unpack(blob: bytes | None) -> list[Anchor]:
    """Every stored anchor, ascending by offset."""
    return merged(*unpack_split(blob))


def pack(anchors: list[Anchor], fine: list[Anchor] | None = None) -> bytes:
    """The stored form of ``anchors`` (a second apart) and ``fine`` (``unpack_split``'s
    inverse)."""
    entries = [(_FINE_MARK, len(anchors)), *anchors, *fine] if fine else list(anchors)
    return b"".join(_ENTRY.pack(off, crc) for off, crc in entries)


def checksum(read_at: Callable[[int, int], bytes], offset: int) -> int | None:
    """The CRC-32 of the bytes before ``offset`` (up to ``SPAN``), None when the file does not
    hold them all."""
    lo = max(0, offset - SPAN)
    data = read_at(lo, offset - lo)
    return zlib.crc32(data) if len(data) == offset - lo else None


def add(anchors: list[Anchor], anchor: Anchor, fresh: bool) -> list[Anchor]:
    """``anchors`` with ``anchor`` (at a higher offset than any) as the newest: it replaces
    the newest unless that one is older than ``EVERY_S`` (``fresh`` False), keeping at most
    ``KEPT``."""
    if anchors and anchor[0] <= anchors[-1][0]:
        return anchors
    kept = anchors[:-1] if anchors and fresh else anchors
    return (kept + [anchor])[-KEPT:]


def tail_read(tail: bytes, values: list[bytes]) -> bool:
    """Whether ``tail`` (the file's bytes just before an offset a slot was read to, from no
    earlier than where the slot's reading of it began, its first line perhaps in part) is
    what the records of ``values`` (the slot's, in order) read: its lines, in order, lines of
    the records (an event's lines each), the last perhaps one the agent flushed before its
    newline was written. Records of the slot's other sources may lie between: the lines are
    matched from the end, each to the next record line that is it, skipping the rest."""
    lines = tail.split(b"\n")
    if tail.endswith(b"\n"):
        lines.pop()
    j = len(lines) - 1
    for value in reversed(values):
        for line in reversed(value.split(b"\n")):
            if j < 0:
                return True
            if line == lines[j] or (j == 0 and line.endswith(lines[0])):
                j -= 1
    return j < 0


def add_fine(fine: list[Anchor], handed: list[Anchor]) -> list[Anchor]:
    """``fine`` with the hand-overs a seal passed (``handed``, ascending), thinned from the
    newest (kept always) back, up to ``FINE_KEPT``: one ``d`` bytes below the newest goes when
    it lies less than ``d / FINE_RATIO`` below the one kept before it and the next older one
    lies less than ``2 d / FINE_RATIO`` below that one (it takes its place: each seal thins
    again what the seals before kept, and the gaps grow as the newest moves away). So every
    hand-over near the newest is an anchor, the rest about ``d / FINE_RATIO`` to twice that
    apart, and a cut ``d`` bytes below the newest anchor resumes within that of it. (Up to 16
    of each seal's hand-overs spread evenly reached four seals back; but a slot sent while it
    fills is one seal of a mebibyte: 64 KiB apart, and up to 874 lines read again under new
    numbers after one power cut.)"""
    merged = fine + [a for a in handed if not fine or a[0] > fine[-1][0]]
    if not merged:
        return merged
    newest = merged[-1][0]
    kept = [merged[-1]]
    for i in range(len(merged) - 2, -1, -1):
        if len(kept) == FINE_KEPT:
            break
        at, last = merged[i][0], kept[-1][0]
        if FINE_RATIO * (last - at) < newest - at and i > 0 and \
                FINE_RATIO * (last - merged[i - 1][0]) < 2 * (newest - merged[i - 1][0]):
            continue                    # too close, and the next older one can stand for it
        kept.append(merged[i])
    return kept[::-1]


def merged(coarse: list[Anchor], fine: list[Anchor]) -> list[Anchor]:
    """Both kinds in one list, ascending by offset (what the state database keeps)."""
    return sorted(dict(coarse + fine).items())


def below(anchors: list[Anchor], offset: int) -> list[Anchor]:
    """The anchors at or below ``offset``, oldest first (the newest last)."""
    return [a for a in anchors if a[0] <= offset]


def resume_at(read_at: Callable[[int, int], bytes], offset: int,
              anchors: list[Anchor]) -> int | None:
    """Where a generation checkpointed at ``offset`` resumes: None when the file still holds
    the newest anchor at or below ``offset`` (or none is known: nothing to check); else the
    offset of the newest anchor it still holds, or 0."""
    held = below(anchors, offset)
    if not held:
        return None
    for i, (off, crc) in enumerate(reversed(held)):
        if checksum(read_at, off) == crc:
            return None if i == 0 else off
    return 0
