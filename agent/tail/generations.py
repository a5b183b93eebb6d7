"""Generations of file content, and how a file found under the globs is matched to one.

A *generation* is a stream of content from its first byte (one row of the state database,
``agent/state/db.py``). Its identity is its inode plus its first bytes (the *fingerprint*), and
the inode holding it may change: copytruncate copies the content to a new inode and empties the
old one, which then holds a new generation. The one model of "old content waiting for its copy"
is the **orphan**: a generation whose inode no longer holds it. What was read of it is sealed;
what was not (from ``offset`` on) can only come from a copy. A file found later that *is* such a
copy continues the orphan's row at its offset: its checkpoints, its positions in the pool and
its audit counts stay one stream, whatever inode holds the bytes.

How a found file is classified. Every file the globs list is opened and recorded at once, in
state ``pending`` (its descriptor then follows it through renames, and a kill leaves a row that
says it existed); it is not read until it is decided, at this scan or a later one:

Matches are ranked by their evidence, the bytes compared: a fingerprint (the longer the
better: a header shared by many files, or a file that was empty, says little) plus the bytes a
copy was found to share beyond it (an orphan's tail, an original's last bytes).

1. Its inode is one the database knows and it still starts with that generation's whole
   fingerprint (``FINGERPRINT_BYTES``): the same content; reading resumes at the checkpoint (max
   of sealed offset and the pool's recovered position). Known inodes are never deferred,
   whatever their size. A known row whose fingerprint is shorter (the file was empty, or held
   only a header, when last looked at) says little — the inode number may since have been
   reused by a copy of other content that starts the same way — so such a file is classified
   like a new one, and its row resumed only if nothing below explains the file better.
2. It is a copy of an orphan: it starts with the orphan's whole fingerprint and, where it is
   long enough, holds the orphan's *tail* (the bytes just before where reading stopped) at the
   same offset. It continues the orphan at the orphan's offset, and its pending row goes.
3. It is a copy of content still being tailed on another inode (a copytruncate caught before the
   truncation): it starts with that generation's fingerprint and its last bytes equal the
   original's at the same offsets. It is *held*, not read: if the original is truncated, the
   copy matches the orphan that leaves (rule 2) and continues it (the bytes not yet read are in
   the copy); if the copy keeps its size for ``COPY_GRACE_S`` without that, it was a plain copy
   of content read from the original, and it is tailed from its end.
4. A file that is so far a strict prefix of such a fingerprint may be a copy still being written
   (``cp`` creates the file, then fills it): it waits until it is longer or has kept its size
   for ``SETTLE_S``; then, still a strict prefix, it is new (read from 0: at worst a few
   duplicates, never a loss). An empty file waits likewise.
5. Anything else is a new generation, read from 0.

A pending file that leaves the globs (renamed away, deleted) is decided on by the same rules,
and read through its descriptor.

Why the tail: a fingerprint alone cannot tell a copy from a new file that starts with the same
header (a CSV header, a banner). The bytes just before the resume offset can: a copy holds them
there, a different file does not.

An orphan's unread bytes ``[offset, size_seen)`` are journaled when no copy has matched it within
``COPY_GRACE_S``; it stays matchable for ``ORPHAN_RETENTION_S`` after that, so a late copy
(renamed into the globs later, or missed by a listing) still continues it instead of being read
twice. Orphans live in the database (state ``orphaned``/``lost``), so a restart or a reload keeps
waiting for their copies.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

COPY_GRACE_S = 5.0              # an orphan's unread bytes are journaled after this without a copy
ORPHAN_RETENTION_S = 3600.0     # ... and it is still matched to a late copy this long
SETTLE_S = 1.0                  # a file that may be a copy in progress waits this long unchanged
COMPRESSING_WAIT_S = 60.0       # a compressed file not yet ending with a whole stream waits at
#                                 most this long after it was found (gzip finishing a rotation)
TAIL_BYTES = 512                # bytes before the resume offset a copy must hold

MATCH, MAYBE, NO = "match", "maybe", "no"


@dataclass
class Orphan:
    """A generation whose inode no longer holds it."""

    source_id: int
    fingerprint: bytes
    offset: int                 # where reading of it stopped: everything before is sealed
    size_seen: int              # its size when last looked at: [offset, size_seen) unread
    tail: bytes                 # content just before offset (b"" when not known)
    path: str
    deadline: float             # monotonic s: journal the unread bytes then
    expires: float              # monotonic s: no longer matched after this
    journaled: bool = False
    while_stopped: bool = False  # found so at start: anything after size_seen is unknown too
    reason: str = "unaccounted_bytes"    # the loss journal's reason if no copy turns up


@dataclass
class Pending:
    """A file found and opened, not yet decided on (see the rules above)."""

    row_id: int                 # its row in the state database (state pending)
    path: str
    fd: int
    dev: int
    ino: int
    size: int                   # its size at the last look ...
    since: float                # ... unchanged since (monotonic s)
    copy_of: int | None = None  # held: the generation it copies, still being read elsewhere
    weak: dict | None = None    # a known row on this inode whose short fingerprint the file
    #                             starts with: resumed if nothing explains the file better
    start_at: int = 0           # where a new file is read from if nothing known explains it
    #                             (``read_from = "end"``, a file ignored while it was old)
    found: float | None = None  # when it was found (monotonic s; ``since`` at first)

    def __post_init__(self):
        if self.found is None:
            self.found = self.since


def by_head(head: bytes, fingerprint: bytes) -> str:
    """Does content starting with ``head`` (up to FINGERPRINT_BYTES of it) start with
    ``fingerprint``? MAYBE while ``head`` is a strict prefix of it (perhaps a copy being
    written)."""
    if not head:
        return MAYBE
    n = min(len(head), len(fingerprint))
    if head[:n] != fingerprint[:n]:
        return NO
    return MAYBE if len(head) < len(fingerprint) else MATCH


def tail_evidence(read_at: Callable[[int, int], bytes], size: int, offset: int,
                  tail: bytes) -> int | None:
    """How many bytes of ``tail`` a file of ``size`` bytes holds just before ``offset`` (as far
    as it reaches: 0 when it is too short to reach them); None when it holds others."""
    lo = offset - len(tail)
    if not tail or size <= lo:
        return 0
    n = min(size, offset) - lo
    return n if read_at(lo, n) == tail[:n] else None


def same_end(read_copy: Callable[[int, int], bytes], read_original: Callable[[int, int], bytes],
             size: int) -> bool:
    """A copy of ``size`` bytes ends with the same bytes as the original at the same offsets."""
    n = min(size, TAIL_BYTES)
    want = read_copy(size - n, n)
    return len(want) == n and read_original(size - n, n) == want


def orphan_match(head: bytes, read_at: Callable[[int, int], bytes], size: int,
                 orphan: Orphan) -> tuple[str, int]:
    """The verdict for a file as a copy of ``orphan``, and the evidence for a MATCH: the bytes
    compared (its fingerprint, and of its tail what the file reaches)."""
    if not orphan.fingerprint:
        return NO, 0            # nothing was read of it: a copy is read from 0 all the same
    verdict = by_head(head, orphan.fingerprint)
    if verdict != MATCH:
        return verdict, 0
    tail = tail_evidence(read_at, size, orphan.offset, orphan.tail)
    return (NO, 0) if tail is None else (MATCH, len(orphan.fingerprint) + tail)


def live_evidence(fingerprint: bytes, size: int) -> int:
    """The bytes compared when a file of ``size`` bytes is found to start with ``fingerprint``
    and to end with the same TAIL_BYTES as the original (``same_end``)."""
    return len(fingerprint) + max(0, min(TAIL_BYTES, size - len(fingerprint)))
