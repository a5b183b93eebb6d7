"""The file source: tail every file matching a source's globs into the buffer pool.

The parts, as the data flows (Fluent Bit's in_tail splits scan / file / db the same way):

- ``discovery.py`` lists the globs' files by identity (device, inode);
- ``generations.py`` holds the one model of content and its copies — generations, orphans, held
  copies — and the rules that match a found file to them (read its docstring first);
- ``reader.py`` reads an open file, checking its first bytes after every read;
- this module decides, at every scan, what each found file is, and keeps the state database
  (``agent/state/db.py``) true: every transition of a generation is one transaction.

What it handles, and how:

- **rename-and-create rotation**: the old inode is no longer at its path; it stays open and is
  read to its end (old files are read before new ones), then closed.
- **copytruncate**: the generation on the truncated inode becomes an orphan and a new generation
  starts there at 0. Its copy, when the globs match it, continues the orphan where reading
  stopped — also when the copy was seen first (it is held until the truncation) and when both
  happened while the agent was stopped. Unread bytes no copy accounts for are journaled
  (``unaccounted_bytes``).
- **deleted or renamed away while the agent was stopped**: at start the inode is looked for in
  the globs' folders under any name and read to its end; if it is nowhere, the generation is an
  orphan (a copy may still hold it) and is then journaled as ``deleted_unread``, open-ended: its
  content after the last known size is unknown.
- **a race between listing and opening**: the descriptor is checked to be the inode listed.
- **symlinks**: globs are resolved; identity is the target's.
- **a folder away at start** (missing, or under an fstab mount point not mounted yet): its known
  files wait for it up to ``FOLDER_AWAY_MAX_S``, neither orphaned nor journaled, and resume from
  their checkpoints when it is back.
- **unreadable files**: logged once, shown in status, tried again at every scan.
- **partial last line**: waits for its newline, or ``partial_flush_ms`` of no change.
- **restart**: every inode the database knows resumes at max(sealed checkpoint, pool's recovered
  position), before any new file is considered.

Reads are large (``read_chunk_bytes``) and handed to the pool as whole chunks.
"""

from __future__ import annotations

import errno
import fnmatch
import glob
import logging
import os
import re
import time
from collections import defaultdict

from ..buffer import BufferPool
from ..config import SourceConfig
from ..state.db import (
    ACTIVE,
    DONE,
    FINGERPRINT_BYTES,
    LOST,
    ORPHANED,
    PENDING,
    ROTATED,
    StateDB,
)
from ..state.journal import LossJournal
from ..telemetry import Metrics
from . import anchors, compressed
from . import generations as gen
from .discovery import Ident, excluded, find_outside, list_files
from .generations import MATCH, MAYBE, NO, Orphan, Pending
from .reader import Reader, ReadStats, Tracked
from .seams import FsOps

log = logging.getLogger("docket.agent.files")

LAST_LINE_LOOK_BYTES = 1 << 20    # read_from = "end" looks this far back for a line's end
TAIL_CHECK_BYTES = 4096        # bytes before a recovered end checked against its slot's records
#                                (whole units of any wide encoding; more than the last line's
#                                end alone, which many lines of one log share)
PROOF_BYTES = 1 << 16          # bytes of stretches held as read looked at for two lines

ROTATED_DELETED = "rotated_deleted"   # an orphan's reason: see _orphan_row
ROTATED_IDLE_S = 5.0          # a rotated file at its end this long is closed
# Files are looked at for closing (rotated and read, idle ``close_idle_ms``) at most this often,
# not every read: the look goes over every open file (100 files at 1,000 lines/s: a tenth of
# the main thread, every turn). Beyond ``max_open_files`` they are looked at every read.
CLOSE_CHECK_S = 0.25
SIZE_PERSIST_S = 1.0          # sizes seen are stored at least this often
FOLDER_AWAY_MAX_S = 600.0     # known files wait this long for their folder (a late mount)
# A glob's folder changed more recently than this is listed at every scan (see _folder_marks).
FOLDER_MARK_MARGIN_NS = 1_000_000_000


HEAD_KEY = 16                    # bytes of a file's start the decisions index files by
STARTS_LOGGED = 20               # new (or resumed) files logged one line each per scan; then
#                                  a summary


class HeadIndex:
    """Files by the first ``HEAD_KEY`` bytes of their fingerprint: a file found is compared
    only with those it may copy (``gen.by_head`` is NO for any other). Comparing every file
    found with every file tailed took 17 ms a file with 10,000 files under one glob."""

    def __init__(self, tracked):
        self.keyed: dict[bytes, list[Tracked]] = defaultdict(list)
        self.short: list[Tracked] = []           # fingerprints shorter than the key
        for t in tracked:
            self.add(t)

    def add(self, t: Tracked) -> None:
        if len(t.fingerprint) >= HEAD_KEY:
            self.keyed[t.fingerprint[:HEAD_KEY]].append(t)
        else:
            self.short.append(t)

    def candidates(self, head: bytes, everyone) -> list[Tracked]:
        if len(head) < HEAD_KEY:
            return list(everyone)
        return self.keyed.get(head[:HEAD_KEY], []) + self.short


class FileSource:
    def __init__(self, cfg: SourceConfig, pool: BufferPool, db: StateDB, journal: LossJournal,
                 metrics: Metrics, recovered: dict[int, int], fs: FsOps | None = None,
                 clock=None, first_start: bool = False, archives_first: bool | None = None):
        self.cfg = cfg
        self.pool = pool
        self.db = db
        self.journal = journal
        self.metrics = metrics
        self.recovered = recovered
        self.fs = fs or FsOps()
        self.clock = clock or pool.clock
        self.tracked: dict[Ident, Tracked] = {}
        self._by_source: dict[int, Tracked] = {}       # the same, by source_id
        self._heads: HeadIndex | None = None           # the same, by their first bytes
        self._pending_index: dict | None = None        # see _pending_like
        self._started = 0                              # new files decided this round
        self._resumed = 0                              # known files resumed this scan
        self._resumed_quietly = 0                      # ... of them not logged one by one
        self._quiet: set[Ident] = set()                # read to their end: wait for a write
        self._quiet_paths: dict[str, Ident] = {}       # their paths, as the watch names them
        self._next_close_check = 0.0                   # monotonic s: ``_close_finished``
        self.pending: dict[Ident, Pending] = {}
        self.unreadable: dict[str, str] = {}           # path → why, while it stays so
        self._warned: set[tuple[str, str]] = set()
        self._compressed_seen: set[str] = set()       # compressed files logged (once each)
        self._sizes_stored: dict[int, int] = {}
        self._closed: dict[int, int] = {}              # source_id → offset, closed this run
        self._unplaced: list[bytes] = []               # see _decide_pending
        self._unclaimed: set[int] | None = None        # see _pool_source_of
        self.folders_away: dict[str, str] = {}         # folder → why its known files wait
        self._away_since: dict[str, float] = {}        # folder → first seen away (monotonic)
        self._gave_up: set[str] = set()                # ... waited FOLDER_AWAY_MAX_S for
        self._next_size_store = 0.0
        self.reader = Reader(cfg, pool, self.fs, self.clock, metrics, self._truncated,
                             self._store_fingerprint, self._compressed)
        self.orphans = self._load_orphans()
        # The agent's very first start here: the first scan's new files honour ``read_from``.
        self._first_scan_from_end = first_start and cfg.read_from == "end"
        # ``archives_first`` (default: ``first_start``): the compressed files the first listing
        # finds are archives, skipped — the agent's first start, a lost state database, or one
        # of a version that recorded no skipped archive.
        self._first_listing = first_start if archives_first is None else archives_first
        self._archives: set[Ident] = set()             # files that listing found
        self.ignored_older: dict[Ident, int] = {}      # not opened: too old; size when seen
        # Closed while idle (close_idle_ms, max_open_files): ident → (source_id, size,
        # mtime_ns) when closed; opened again when a scan finds either changed.
        self.idle_closed: dict[Ident, tuple[int, int, int]] = {}
        self._idle_paths: dict[str, Ident] = {}        # their paths, as the watch names them
        self.rescan = False                            # a closed file was written: scan now
        self._marks: dict[str, tuple] | None = None    # the globs' folders at the last listing
        self.over_cap = 0                              # busy files open beyond the cap

    # -- helpers ------------------------------------------------------------------------------
    def _now(self) -> float:
        return self.clock.monotonic_ns() / 1e9

    def _bad(self, kind: str, count: int = 1) -> None:
        self.reader.lines.bad(kind, count)

    def _warn_once(self, kind: str, path: str) -> None:
        if (kind, path) not in self._warned:
            self._warned.add((kind, path))
            self._bad(kind)

    def _rotation(self, kind: str) -> None:
        self.metrics.inc("agent_source_rotations_total", kind=kind, topic=self.cfg.label)

    def _resume_offset(self, row: dict) -> int:
        """Where reading of a generation goes on: after what is sealed (the checkpoint, or a
        slot recovered from the pool), or what this run handed over before closing it."""
        sid = row["source_id"]
        return max(row["sealed_offset"], self.recovered.get(sid, 0), self._closed.get(sid, 0))

    def _load_orphans(self) -> list[Orphan]:
        """Orphans of earlier runs wait again for their copies; journaled ones are still matched
        until their retention ends."""
        now, now_ms = self._now(), self.clock.time_ms()
        out = []
        for row in self.db.rows(self.cfg.index, (ORPHANED, LOST)):
            age_s = max(0.0, (now_ms - (row["orphaned_ms"] or now_ms)) / 1000)
            if age_s >= gen.ORPHAN_RETENTION_S:
                continue
            offset = self._resume_offset(row)
            out.append(Orphan(row["source_id"], row["fingerprint"] or b"", offset,
                              max(offset, row["size_seen"]), row["tail"] or b"",
                              row["path"], now + gen.COPY_GRACE_S,
                              now + gen.ORPHAN_RETENTION_S - age_s,
                              journaled=row["state"] == LOST, while_stopped=True,
                              reason=row["orphan_reason"] or "unaccounted_bytes"))
        return out

    # -- scanning -----------------------------------------------------------------------------
    def scan(self, safety: bool = False) -> None:
        """List the globs and decide on every file found. ``safety``: the loop's timed scan
        behind a write watch that covers every folder (events wake the other scans): when no
        folder of the globs changed since the last listing (``_folders_unchanged``), nothing
        was created, moved or deleted there, so the listing is left out and only the files
        open are looked at again (10,000 idle files under one glob cost 0.15-0.27 CPU-s a
        listing)."""
        if safety and self._folders_unchanged():
            self._look_at_open_files()
            self._expire_orphans()
            self._store_sizes()
            return
        marks = self._folder_marks()         # before the listing: a change during it counts
        found = self._scan()
        # A file listed through a link may be written in a folder the watch does not see:
        # only a listing catches that write once the file is closed while idle.
        self._marks = None if any(os.path.islink(path) for path, _st in found.values()) \
            else marks

    def _folder_marks(self) -> dict[str, tuple] | None:
        """Each glob's folder's identity and times, when every glob names its folder without
        wildcards and none was modified within the last ``FOLDER_MARK_MARGIN_NS`` (a file
        created in the same clock tick as an earlier change leaves the times as they were);
        else None."""
        marks = {}
        now = time.time_ns()
        for pattern in self.cfg.paths:
            folder = os.path.dirname(pattern)
            if glob.has_magic(folder):
                return None
            try:
                st = self.fs.stat(folder)
            except OSError:
                return None
            if not _local_fs(st.st_dev):
                return None                  # another host's writes raise no event here
            mtime = _mtime_ns(st)
            if now - mtime < FOLDER_MARK_MARGIN_NS:
                return None
            # The change time too: a folder whose time was set back after a change (``touch
            # -d``, an archive extracted) has the same modification time, not the same ctime.
            marks[folder] = (st.st_dev, st.st_ino, mtime, _ctime_ns(st))
        return marks

    def _folders_unchanged(self) -> bool:
        """Whether a listing now would find what the last one found: every glob's folder as it
        was then, and nothing that only a listing decides waiting (files not decided on,
        orphans, folders away, unreadable files or files too old, whose writes the watch does
        not report as such; a file closed while idle is written: ``rescan``)."""
        if self._marks is None or self.rescan or self.settling() or self.unreadable \
                or self.ignored_older:
            return False
        return self._folder_marks() == self._marks

    def _look_at_open_files(self) -> None:
        """Every open file is read at the next turn, and checked for a truncation now."""
        self._quiet.clear()
        self._quiet_paths.clear()
        for t in list(self.tracked.values()):
            self.reader.check(t)

    def _scan(self) -> dict:
        self._resumed = self._resumed_quietly = 0
        try:
            return self._list_and_decide()
        finally:
            if self._resumed_quietly:
                log.info("resuming %d more file(s) of topic %s where their reading stopped (one "
                         "line each for the first %d)", self._resumed_quietly, self.cfg.label,
                         STARTS_LOGGED)
            self._resumed = self._resumed_quietly = 0

    def _list_and_decide(self) -> dict:
        self.rescan = False
        # Truncations first, so a copy decided on below finds the old content's orphan.
        self._look_at_open_files()
        found = list_files(self.fs, self.cfg.paths,
                           lambda path: self._warn_once("not_a_file", path), self.cfg.exclude)
        self._follow_tracked(found)
        self._gone_while_closed(found)
        fresh = []
        for ident, (path, st) in found.items():
            if ident in self.tracked or ident in self.pending:
                continue
            if self._still_closed(ident, path, st):
                continue
            rows = [r for r in self.db.rows_at(self.cfg.index, *ident)
                    if r["state"] in (PENDING, ACTIVE, ROTATED, DONE)]
            if rows:
                self._open_known(ident, path, st, rows)
            else:
                fresh.append((ident, path, st))
        self._place_unplaced(found)
        for ident, path, st in fresh:
            start_at = self._too_old(ident, st)
            if start_at is None:
                continue
            if self._first_scan_from_end:
                start_at = self._last_line_end(path, st)
            self._open_new(ident, path, st, start_at)
        self._first_scan_from_end = False
        if self._first_listing:
            self._archives = set(found)
            self._first_listing = False
        for ident in [i for i in self.ignored_older if i not in found]:
            del self.ignored_older[ident]                  # gone
        listed = {f[0] for f in found.values()}
        for path in [p for p in self.unreadable if p not in listed]:
            del self.unreadable[path]
        self._decide_pending(found)
        self._expire_orphans()
        self._store_sizes()
        self.metrics.set("agent_source_files", len(self.tracked), topic=self.cfg.label)
        return found

    def _still_closed(self, ident: Ident, path: str, st: os.stat_result) -> bool:
        """A file closed while idle stays closed while its size and time are unchanged."""
        closed = self.idle_closed.get(ident)
        if closed is None:
            return False
        if (st.st_size, _mtime_ns(st)) == closed[1:]:
            self._idle_paths[path] = ident
            return True
        del self.idle_closed[ident]
        return False                            # changed: opened again, from its checkpoint

    def _gone_while_closed(self, found: dict) -> None:
        """Files closed while idle that the globs no longer list: deleted or rotated away
        read to their end (a write would have opened them again first): done."""
        for ident in [i for i in self.idle_closed if i not in found]:
            sid = self.idle_closed.pop(ident)[0]
            self.db.update(sid, state=DONE)
        self._idle_paths = {p: i for p, i in self._idle_paths.items() if i in self.idle_closed}

    def _follow_tracked(self, found: dict) -> None:
        for ident, t in self.tracked.items():
            hit = found.get(ident)
            if hit is not None:
                if t.rotated or t.path != hit[0]:
                    # Renamed while read (its writer rolled over to a new file, as a handler
                    # or logrotate's rename does): noted for a deletion while stopped.
                    renamed = {"renamed": 1} if t.path != hit[0] else {}
                    t.path, t.rotated = hit[0], False
                    self.db.update(t.source_id, state=ACTIVE, path=t.path, **renamed)
            elif not t.rotated:
                t.rotated = True
                self._rotation("moved_or_deleted")
                log.info("%s (inode %d, source %d) rotated: no longer under the globs; read "
                         "to its end from offset %d", t.path, ident[1], t.source_id, t.offset)
                self.db.update(t.source_id, state=ROTATED, path=t.path)

    def _open(self, path: str, st: os.stat_result) -> int | None:
        """A descriptor on the inode that was listed at ``path``, or None."""
        try:
            fd = self.fs.open(path)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                if path not in self.unreadable:
                    log.warning("cannot read %s: %s; trying again at every scan", path,
                                exc.strerror)
                    self._bad("unreadable")
                self.unreadable[path] = exc.strerror or "permission denied"
            return None
        self.unreadable.pop(path, None)
        fst = self.fs.fstat(fd)
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            # Replaced between the listing and the open (a rename-and-create): the next scan
            # sees both files as they are now.
            self.fs.close(fd)
            return None
        return fd

    def _track(self, ident: Ident, t: Tracked) -> None:
        self.tracked[ident] = t
        if self._heads is not None:
            self._heads.add(t)
        self._by_source[t.source_id] = t
        self._sizes_stored[t.source_id] = t.size_seen

    def _open_known(self, ident: Ident, path: str, st: os.stat_result, rows: list[dict]) -> None:
        """An inode the database knows: the same content resumes; generations it no longer
        holds become orphans; one still pending, or one whose fingerprint is too short to
        tell, is decided on like a new file."""
        fd = self._open(path, st)
        if fd is None:
            return
        head = self.fs.pread(fd, FINGERPRINT_BYTES, 0)
        # A pending row the pool holds slots of was started and read: the commit that
        # started it did not reach the disk before a power cut, the slots' seal did.
        same = [r for r in rows if (r["state"] != PENDING or self.recovered.get(r["source_id"]))
                and head.startswith(r["fingerprint"] or b"")]
        # Of the generations the file starts like, the longest fingerprint says the most.
        keep = max(same, key=lambda r: (len(r["fingerprint"] or b""), r["source_id"]),
                   default=None)
        pending = next((r for r in reversed(rows) if r["state"] == PENDING), None)
        for r in rows:
            if r is keep or (r is pending and keep is None):
                continue
            if r["state"] in (ACTIVE, ROTATED):
                # Other content on this inode: the generation was truncated in place, or —
                # rotated away or found under another name — deleted, and its inode given to
                # a new file (a handler that deletes its oldest backup, then creates the log).
                reused = r["state"] == ROTATED or r.get("renamed") or r["path"] != path
                self._orphan_row(r, "deleted_unread" if reused else "unaccounted_bytes")
            elif r["state"] == PENDING:
                self.db.delete(r["source_id"])         # superseded: never read
        if keep is None or len(keep["fingerprint"] or b"") < FINGERPRINT_BYTES:
            if keep is not None:
                row_id = keep["source_id"]
            elif pending is not None:
                row_id = pending["source_id"]
            else:
                row_id = self.db.add_file(self.cfg.index, *ident, head, path, 0, st.st_size,
                                          state=PENDING)
            self.pending[ident] = Pending(row_id, path, fd, *ident, -1, self._now(), weak=keep)
            return
        self._resume(ident, keep, path, fd, head, st.st_size, rotated=False)

    def _resume(self, ident: Ident, row: dict, path: str, fd: int, head: bytes, size: int,
                rotated: bool, why: str = "") -> None:
        """Read on a generation the database knows, on the inode it is on, from where its
        reading stopped. The file starts with its fingerprint; what the file holds now beyond
        it becomes the fingerprint (as the next look would make it)."""
        offset = self._resume_offset(row)
        coarse, fine = anchors.unpack_split(row["anchors"])
        kept = anchors.merged(coarse, fine)
        back = anchors.resume_at(lambda off, n: self.fs.pread(fd, n, off), offset, kept)
        held = anchors.below(kept, offset)
        # the newest anchor below the checkpoint; none kept yet (the pool's slots are all
        # that was read: a power cut took every commit since the file was started): its start
        floor = held[-1][0] if held else None if kept else 0
        skip: list[tuple[int, int]] = []
        if back is not None:
            # the newest anchor the file still holds: the pool's slots may tell where after it
            back, skip = self._still_held(row["source_id"], fd, back, offset,
                                          row["acked_offset"] or 0, kept)
        elif floor is not None and self.reader.routes.by_line and \
                self.recovered.get(row["source_id"], 0) > floor:
            # the pool read past the newest anchor, in slots each holding one topic's lines
            # among the others': what they read cannot be checked line for line
            offset = self._again_from_anchor(row, path, offset, floor)
            coarse, fine = anchors.below(coarse, offset), anchors.below(fine, offset)
        elif floor is not None and floor < offset and \
                self._pool_read_differs(row["source_id"], fd, offset):
            # the pool read past the newest anchor what the file no longer holds all of
            back, skip = self._still_held(row["source_id"], fd, floor, offset,
                                          row["acked_offset"] or 0, kept)
        if back is not None:
            offset = self._cut_back(row, path, offset, back, size, skip)
            coarse, fine = anchors.below(coarse, offset), anchors.below(fine, offset)
        fingerprint = row["fingerprint"] or b""
        if len(head) > len(fingerprint):
            fingerprint = head
        renamed = {"renamed": 1} if row["path"] not in (None, path) else {}
        self.db.update(row["source_id"], state=ROTATED if rotated else ACTIVE, path=path,
                       fingerprint=fingerprint, **renamed)
        self._resumed += 1
        if self._resumed <= STARTS_LOGGED or why or back is not None:
            log.info("resuming %s (inode %d, source %d)%s at offset %d of %d", path, ident[1],
                     row["source_id"], why, offset, size)
        else:
            self._resumed_quietly += 1
        self._track(ident, Tracked(row["source_id"], path, fd, *ident, fingerprint, offset,
                                   size_seen=size, rotated=rotated, anchors=coarse, fine=fine,
                                   skip=skip))

    def _pool_read_differs(self, sid: int, fd: int, offset: int) -> bool:
        """Whether the file no longer holds, just before ``offset``, what a slot the pool
        recovered, ending there, read (an anchor at ``offset`` the state database never kept:
        ``anchors.tail_read``). No slot ending there (the checkpoint is the database's own)
        cannot tell: False. A source in another encoding than UTF-8 has its bytes transcoded
        as its records were; a container runtime's file has the records the slot's whole
        groups make compared (``container.Framing.held``)."""
        ending = [(slot, start) for start, _end, slot in self._read_by_pool(sid, offset - 1,
                                                                             offset)]
        if not ending:
            return False
        if self.reader.container is not None:       # with the slots before (a group's rest)
            return not any(self.reader.container.held(
                self.fs.pread(fd, offset - start, start),
                [v for _s, _e, s in self._read_by_pool(sid, start - 1, offset)
                 for _t, _k, v in s.records()]) for _slot, start in ending)
        codec = self.reader.lines.codec
        units = self.reader.lines.units(self.fs.pread(fd, 4, 0)) if codec else None
        for slot, start in ending:      # the file's bytes this slot read, at most the last 4 KiB
            lo = max(start, offset - TAIL_CHECK_BYTES)
            tail = self.fs.pread(fd, offset - lo, lo)
            if len(tail) < offset - lo:
                return True             # the file ends below what was read
            if codec is not None:
                text = tail.decode(units.codec if units else codec, errors="replace")
                tail = (text[1:] if lo == 0 and text.startswith("\ufeff") else text).encode()
            tail = tail.replace(b"\r\n", b"\n")      # a record ends before a CR before its LF
            if anchors.tail_read(tail, [v for _t, _k, v in slot.records()]):
                return False
        return True

    def _still_held(self, sid: int, fd: int, newest: int, offset: int, acked: int = 0,
                    anchored: list[tuple[int, int]] = ()) -> tuple[int, list[tuple[int, int]]]:
        """Where reading resumes in a file cut back past ``newest`` (the newest anchor it
        holds), and what it need not read again from there. The first: the first record, from
        ``newest`` on, of the pool's slots of this source that the file no longer holds as it
        was read (each record with its newline after it, the last one's perhaps not yet
        written); the records before it are in the pool, under their numbers. ``newest`` where
        that cannot be told: records made from the lines rather than being them (another
        encoding than UTF-8, a container runtime's framing), a stretch no slot covers, or a
        record that no line is (a long line's parts); of a slot holding other files' records too
        (a rotation within it), the blocks that read this file (``_own_blocks``), or where
        they cannot be told apart, the slot is passed when the file holds every one of its
        records (``_holds_all``), else reading goes again from where that slot's part begins. The
        second: the stretches after it, line starts to line ends, that the file still holds
        as those slots read them (``_held_beyond``): a cut that kept a later page of the log
        and dropped an earlier one leaves a hole, and the lines after it are the pool's
        already. Ascending; none with a multiline rule.

        Between ``newest`` and the first slot the pool still holds lie the lines of slots
        acknowledged and freed since (the state database keeps an anchor per few hand-overs,
        not every line): when the database's acknowledged offset (``acked``) reaches that slot
        and the file holds the stretch as lines (no zeros a dropped page left, a line's end
        just before the slot) and no anchor (``anchored``) lies in it — the file holds none
        above ``newest``: one there would say the cut came below the slot —, the slot is
        checked from its start — its first record held as read says the cut came after it —
        and that stretch is not read again under new numbers. A first record the file does
        not hold there sends reading back to ``newest``. Where a page the cut dropped left
        zeros in that stretch (or at that first record), and records after them, two different
        lines among them (``_two_lines_in``), are where the file holds them as read, what the
        file holds before them, zeros aside, was on the disk before the cut, as read
        (``_before_zeros``): reading resumes at the end of the last whole line before the first
        zero, and the whole lines after it are passed; with no such records (new lines after
        an earlier cut, a line holding a zero of its own, one line repeated in its place),
        from ``newest``."""
        if self.reader.lines.rewrites or self.reader.routes.by_line:
            return newest, []            # (a line's slot holds other topics' lines between)
        back: int | None = None
        gap: list[tuple[int, int]] = []     # old lines between a dropped page's zeros
        zeros = False       # reading resumes past freed slots' lines on the word of zeros
        at = newest
        bridged: int | None = None          # the slot start reached over freed slots' lines
        slots = self._read_by_pool(sid, newest, offset)
        for start, end, slot in slots:
            if start > at:
                if at != newest or start > acked:
                    break
                freed = self.fs.pread(fd, start - at, at)
                if not self.reader.grouped:
                    found = self._before_zeros(fd, freed, at, start, anchored)
                    if found is not None:
                        (back, gap), zeros = found, True    # a page the cut dropped there
                        break
                if any(newest < a <= start for a, _c in anchored) or \
                        not _lines_held(freed, start - at):
                    break
                at = bridged = start
            data = self.fs.pread(fd, end - start, start)
            own = _own_blocks(slot, sid, start, end)
            if own is None:
                # the file's lines among another's (a rotation within the slot), its blocks
                # not told apart: when the file holds every one of them, on; else from there
                if _holds_all(data, end - start, (v for _t, _k, v in slot.records())):
                    at = max(at, end)
                    continue
                back = newest if start == bridged else at
                break
            pos = 0
            for value, place in _values_placed(own):
                n = len(value)
                ended = _line_end(data, pos + n)
                step = n + ended if ended else \
                    n if pos + n == end - start else None      # a partial line at the end
                if data[pos:pos + n] != value or step is None:
                    if place is not None and start + pos + place <= at and \
                            b"\0" in data[pos:pos + place] and \
                            data[pos + place - 1:pos + place] in (b"\n", b"\0"):
                        # wholly below the newest anchor the file holds, a page a cut
                        # dropped there (zeros): what follows the anchor is what counts
                        pos += place
                        continue
                    back = max(at, start + pos) if start + pos < offset else newest
                    if start + pos == bridged:
                        # the stretch before it is not proven, but by zeros here and a
                        # record held as read after them (below)
                        zeros = b"\0" in data[pos:pos + n + 1]
                        back = back if zeros else newest
                    break
                pos += step
            if back is not None or pos < end - start:
                break                               # bytes no record is (parts, a dropped line)
            at = max(at, end)
        back = newest if back is None else back
        if self.reader.grouped:
            return newest if zeros else back, []
        ahead = [s for s in slots if s[0] < offset]
        beyond = self._held_beyond(sid, fd, back, ahead)
        if zeros and not self._two_lines_in(fd, beyond):
            # no record after the zeros is where the file holds it as read (or only one line,
            # which new content may repeat in its place): the lines before them may be new
            # ones, written after an earlier cut (no telling)
            back, gap = newest, []
            beyond = self._held_beyond(sid, fd, back, ahead)
        return back, gap + beyond

    def _two_lines_in(self, fd: int, stretches: list[tuple[int, int]]) -> bool:
        """Whether the file's ``stretches`` (held as the pool read them: ``_held_beyond``)
        hold two different lines, in their first ``PROOF_BYTES``. One line, or the same line
        again and again (a health check's), may be content written after a cut that repeats
        the old in its place; two different lines in their places are what was read."""
        seen: set[bytes] = set()
        budget = PROOF_BYTES
        for start, end in stretches:
            n = min(end - start, budget)
            seen.update(self.fs.pread(fd, n, start).split(b"\n")[:-1])  # (no part of a line)
            budget -= n
            if len(seen) > 1 or budget <= 0:
                break
        return len(seen) > 1

    def _before_zeros(self, fd: int, data: bytes, start: int, end: int,
                      anchored: list[tuple[int, int]]) -> tuple[int, list] | None:
        """Where zeros lie in ``data``, what the file holds of ``[start, end)`` (the freed
        slots' lines, acknowledged): where reading would resume — the end of the last whole
        line before the first zero — and the stretches of whole lines after it, between zeros
        and up to ``end``, not to be read again. That holds only when records after them, two
        different lines among them, are where the file holds them as the pool read them (the
        caller's look, ``_held_beyond`` and ``_two_lines_in``): a cut that took the file back
        below them would have left other content or zeros there, so what the file holds
        before them, zeros aside, was on the disk before the cut, as read. None when there
        are no zeros, or an anchor in the stretch whose bytes the file holds without zeros is
        not held (other content than was read)."""
        first = data.find(b"\0")
        if first < 0:
            return None
        for at, crc in anchored:
            if start < at <= end:
                window = data[max(0, at - start - anchors.SPAN):at - start]
                if b"\0" not in window and anchors.checksum(
                        lambda off, n: self.fs.pread(fd, n, off), at) != crc:
                    return None
        gap = []
        for run in re.finditer(rb"[^\0]+", data[first:]):
            a, b = first + run.start(), first + run.end()
            head = data.find(b"\n", a, b) + 1          # a hole's rest is read with it
            tail = data.rfind(b"\n", a, b) + 1
            if 0 < head < tail:
                gap.append((start + head, start + tail))
        return start + data.rfind(b"\n", 0, first) + 1, gap

    def _held_beyond(self, sid: int, fd: int, back: int,
                     slots: list[tuple[int, int, object]]) -> list[tuple[int, int]]:
        """The stretches after ``back`` where the file holds, line for line, what the slots
        (``(start, end, slot)`` of this file, ascending; of a slot shared with other files, its
        blocks that read this one: ``_own_blocks``) read, past a hole: a cut that dropped
        a page of the log and kept a later one leaves zeros, and the lines of the kept page are
        the pool's already. Each record is looked for at the place its slot's layout gives it,
        with a newline after it in the file and a newline or a hole's zero before it (the hole
        then ends as a record of its own there: ``Reader.read``); only after zeros were seen
        since ``back`` (in a record's place, or where no slot of the source reaches), and not
        after a record the file holds other content for without zeros (content written after
        the cut may repeat a line at its very place). A record the file no longer holds is
        passed by its length in its block; a block's last one, whose line end the block does
        not keep, by its length and the line end seen last (a slot sent while it fills holds a
        block per hand-over: the rest of the slot was left out there before). Merged,
        ascending."""
        out: list[list[int]] = []
        hole, seen = False, back
        ending = 1                      # the newest line end seen: a newline, or a CR and one
        for start, end, slot in slots:
            own = _own_blocks(slot, sid, start, end) if end > back else None
            if own is None:
                continue
            if start > seen:                  # no slot of the source reaches here: zeros?
                hole = hole or b"\0" in self.fs.pread(fd, start - seen, seen)
            seen = max(seen, end)
            data = self.fs.pread(fd, end - start + 1, start - 1) if start else \
                b"\n" + self.fs.pread(fd, end, 0)         # with the byte before the slot's first
            pos = 1
            for block in own:
                if block.part_count:
                    break                               # a long line's parts: no lines
                offsets = block.offsets.tolist()
                lengths = block.lengths.tolist()
                for i, n in enumerate(lengths):
                    ended = _line_end(data, pos + n)
                    if ended:
                        ending = ended
                    step = n + ended if ended else None
                    same = step is not None and n > 0 and data[pos - 1:pos] in (b"\n", b"\0") \
                        and data[pos:pos + n] == block.value(i)
                    here = start + pos - 1
                    if same and hole and here >= back:
                        if out and out[-1][1] == here:
                            out[-1][1] = here + step
                        else:
                            out.append([here, here + step])
                    elif not same and here + n >= back:
                        hole = b"\0" in data[pos:pos + n + 1]
                    if not same and i + 1 < len(lengths):
                        step = offsets[i + 1] - offsets[i]
                        ending = step - n
                    elif not same:
                        # a block's last record, not held: its terminator is not in the block;
                        # the next block's first line begins after it, ended as the lines
                        # before (a wrong guess finds no line where it looks: nothing passed)
                        step = n + ending
                    pos += step
                else:
                    continue
                break
        return [(x, y) for x, y in out]

    def _read_by_pool(self, sid: int, after: int, through: int) -> list[tuple[int, int, object]]:
        """(start, end, slot) of what the pool's sealed slots read of source ``sid`` ending past
        ``after`` and at most at ``through``, in the file's order."""
        return sorted(((start, end, slot) for slot in self.pool.sealed()
                       for s, start, end in slot.meta.positions
                       if s == sid and after < end <= through), key=lambda x: x[:2])

    def _again_from_anchor(self, row: dict, path: str, offset: int, anchor: int) -> int:
        """A file routed by its lines' fields whose pool read past the newest anchor the state
        database kept (its commits are synced at most every 0.2 s; the pool at each seal): were
        the file cut back meanwhile (a power loss) and written on, the lines below ``offset``
        would be skipped, and a slot's records, one topic's among the others' lines, cannot
        be matched to the file's bytes. Read again from the anchor: the lines from there
        arrive twice, under new numbers, and none is skipped; nothing is journalled (whatever
        the file holds past the anchor is read)."""
        log.info("%s (source %d, routed by its lines' fields): the pool read to offset %d, past "
                 "the newest anchor the state database kept; reading again from offset %d "
                 "(lines between may arrive twice)", path, row["source_id"], offset, anchor)
        return self._read_again_from(row, anchor)

    def _read_again_from(self, row: dict, back: int) -> int:
        """The generation's sealed checkpoint moved back to ``back``, where reading resumes:
        what the pool recovered past it, or this run handed over before closing it, no longer
        says where."""
        sid = row["source_id"]
        self.db.rewind(sid, back, row["state"])
        self.recovered.pop(sid, None)
        self._closed.pop(sid, None)
        return back

    def _cut_back(self, row: dict, path: str, offset: int, back: int, size: int,
                  skip: list[tuple[int, int]] = ()) -> int:
        """The file no longer holds, below the checkpoint ``offset``, what was read there (a
        power loss took the application's unsynced tail, and it wrote on from the cut): read
        again from ``back``, the newest anchor it still holds or the first record of the pool
        it no longer holds, so no line written since the cut is skipped (those from ``back`` to
        the cut arrive twice), but for ``skip``: the lines after ``back`` it still holds as the
        pool read them. What was seen beyond the checkpoint and never read is gone with the old
        tail: journaled."""
        sid = row["source_id"]
        passed = sum(b - a for a, b in skip)
        log.warning("%s (source %d) no longer holds what was read before offset %d (cut back "
                    "while the agent was stopped: a power loss?); reading again from offset "
                    "%d of %d (lines before the cut may arrive twice)%s", path, sid, offset, back,
                    size, f"; {passed} byte(s) in {len(skip)} stretch(es) after it that it "
                          "still holds as the pool read them are not read again"
                    if skip else "")
        self._rotation("cut_back")
        unread = max(0, (row["size_seen"] or 0) - offset)
        if unread:
            self.journal.record("cut_back_unread", self.reader.routes.of(path).topic, -1,
                                nbytes=unread,
                                source=path, byte_range=(offset, offset + unread),
                                source_id=sid, open_ended=True,
                                detail=f"{path} was cut back below offset {offset} while the "
                                       f"agent was stopped: {unread} byte(s) seen after it "
                                       "were never read and are gone")
        return self._read_again_from(row, back)

    def _open_new(self, ident: Ident, path: str, st: os.stat_result, start_at: int = 0) -> None:
        """A file no generation is known on: opened and recorded now, decided on below
        (``start_at``: where it is read from if it turns out to be new content)."""
        fd = self._open(path, st)
        if fd is None:
            return
        head = self.fs.pread(fd, FINGERPRINT_BYTES, 0)
        row_id = self.db.add_file(self.cfg.index, *ident, head, path, 0, st.st_size,
                                  state=PENDING)
        self.pending[ident] = Pending(row_id, path, fd, *ident, -1, self._now(),
                                      start_at=start_at)

    def _too_old(self, ident: Ident, st: os.stat_result) -> int | None:
        """``ignore_older_ms``: None while a new file is older than that (not opened);
        else where it is read from — the size it had when first ignored, or 0."""
        limit = self.cfg.ignore_older_ms
        if not limit:
            return 0
        if self.clock.time_ms() - st.st_mtime * 1000 > limit:
            if ident not in self.ignored_older:
                self.ignored_older[ident] = st.st_size
                if len(self.ignored_older) == 1 or len(self.ignored_older) % 1000 == 0:
                    log.info("%d file(s) under the globs of topic %s last changed over %d ms "
                             "ago: not opened (ignore_older_ms); read once they change",
                             len(self.ignored_older), self.cfg.label, limit)
            return None
        return self.ignored_older.pop(ident, 0)

    def _last_line_end(self, path: str, st: os.stat_result) -> int:
        """Where ``read_from = "end"`` starts: after the last newline of the file's last
        MiB (its size when none)."""
        size = st.st_size
        lo = max(0, size - LAST_LINE_LOOK_BYTES)
        try:
            with open(path, "rb") as f:
                units = self.reader.lines.units(f.read(4))
                if units:
                    lo -= lo % units.width          # a wide encoding's units from byte 0
                f.seek(lo)
                tail = f.read(size - lo)
        except OSError:
            return size
        end = units.last_end(tail) if units else tail.rfind(b"\n") + 1
        if end:
            return lo + end
        return units.whole(size) if units else size

    def _orphan_row(self, row: dict, reason: str) -> None:
        """A generation found at start no longer on its inode. One deleted after it was
        rotated away (``ROTATED``: no glob path led to it at the last look, so its writer had
        moved on), or renamed while it was read (``renamed``: rotated under the globs, as
        ``app.log.1`` under ``app.log*``), is ``rotated_deleted``: journaled only for bytes
        seen and not read."""
        if reason == "deleted_unread" and (row["state"] == ROTATED or row.get("renamed")):
            reason = "rotated_deleted"
        offset = self._resume_offset(row)
        now = self._now()
        self.db.orphan(row["source_id"], row["size_seen"], None, reason,
                       now_ms=self.clock.time_ms())
        self._rotation("truncated" if reason == "unaccounted_bytes" else "moved_or_deleted")
        log.info("%s (source %d) no longer holds the content read to offset %d: waiting for a "
                 "copy of it", row["path"], row["source_id"], offset)
        self.orphans.append(Orphan(row["source_id"], row["fingerprint"] or b"", offset,
                                   max(offset, row["size_seen"]), b"", row["path"],
                                   now + gen.COPY_GRACE_S,
                                   now + gen.ORPHAN_RETENTION_S, while_stopped=True,
                                   reason=reason))

    def _place_unplaced(self, found: dict) -> None:
        """Known generations neither read nor listed: at start, those renamed away or deleted
        while the agent was stopped; later, one whose file was replaced between the listing
        and the open and then left the globs. Read them to their end where they still are
        (in a glob's folder under another name); else they are orphans, journaled as
        ``deleted_unread`` unless a copy of them turns up."""
        held = {t.source_id for t in self.tracked.values()} | \
            {p.row_id for p in self.pending.values()} | \
            {c[0] for c in self.idle_closed.values()}
        rows = [r for r in self.db.rows(self.cfg.index, (PENDING, ACTIVE, ROTATED))
                if (r["dev"], r["ino"]) not in found and r["source_id"] not in held]
        if not rows:
            if self.folders_away:
                self._folders_away([])       # every file placed: no folder is awaited
            return
        where = find_outside(self.fs, self.cfg.paths, {(r["dev"], r["ino"]) for r in rows})
        away = self._folders_away([r for r in rows if (r["dev"], r["ino"]) not in where])
        for r in rows:
            ident = (r["dev"], r["ino"])
            hit = where.get(ident)
            if hit is None and os.path.dirname(r["path"]) in away:
                continue                     # its folder is not there to be looked in: wait
            fd = self._open(*hit) if hit is not None and ident not in self.tracked \
                and ident not in self.pending else None
            if fd is not None:
                head = self.fs.pread(fd, FINGERPRINT_BYTES, 0)
                fingerprint = r["fingerprint"] or b""
                if r["state"] == PENDING or (head.startswith(fingerprint)
                                             and len(fingerprint) < FINGERPRINT_BYTES):
                    # Decided on like any file: a short fingerprint says little (the inode
                    # number may be a deleted file's, reused by a copy of other content).
                    weak = None if r["state"] == PENDING else r
                    self.pending[ident] = Pending(r["source_id"], hit[0], fd, *ident, -1,
                                                  self._now(), weak=weak)
                    continue
                if head.startswith(fingerprint):
                    self._resume(ident, r, hit[0], fd, head, hit[1].st_size, rotated=True,
                                 why=", renamed out of the globs while the agent was stopped,")
                    continue
                self.fs.close(fd)
            self._orphan_row(r, "deleted_unread")

    def _folders_away(self, rows: list[dict]) -> dict[str, str]:
        """The folders of unplaced generations, found nowhere, that are not there to be looked
        in: missing, or under a mount point ``/etc/fstab`` declares that is not mounted yet (on
        the same device as its parent). Their files wait, neither orphaned nor journaled, for
        up to ``FOLDER_AWAY_MAX_S`` from when this run first saw the folder away: the agent
        cannot tell a late mount from a deletion, and a false loss report followed by the same
        events read again is worse than waiting. After that they are taken as deleted (and a
        copy of them, should the folder come back, still continues them). A folder that is
        there, on whatever device, is looked in as always: a file system mounted again with a
        new device number shows its files as copies of the orphans, continued where reading
        stopped."""
        away: dict[str, str] = {}
        now = self._now()
        mounts: set[str] | None = None
        for folder in sorted({os.path.dirname(r["path"]) for r in rows}):
            why = None
            try:
                self.fs.stat(folder)
            except (FileNotFoundError, NotADirectoryError):
                why = "missing"
            except OSError as e:
                why = f"not to be looked in ({e.strerror})"
            else:
                if mounts is None:
                    mounts = self.fs.mount_points()
                point = self._unmounted(folder, mounts)
                if point is not None:
                    why = f"under {point}, a mount point in /etc/fstab not mounted yet"
            if why is None or folder in self._gave_up:
                continue
            since = self._away_since.setdefault(folder, now)
            if now - since >= FOLDER_AWAY_MAX_S:
                self._gave_up.add(folder)
                log.warning("folder %s is still %s after %.0f s: its known files are taken as "
                            "deleted", folder, why, now - since)
                continue
            away[folder] = why
        for folder, why in away.items():
            if self.folders_away.get(folder) != why:
                count = sum(os.path.dirname(r["path"]) == folder for r in rows)
                log.warning("folder %s is %s: its %d known file(s) wait for it up to %.0f s, "
                            "nothing is journaled meanwhile", folder, why, count,
                            FOLDER_AWAY_MAX_S)
        for folder in set(self.folders_away) - set(away):
            log.info("folder %s is no longer away", folder)
        self.folders_away = away
        return away

    def _unmounted(self, folder: str, mounts: set[str]) -> str | None:
        """The fstab mount point holding ``folder`` when it is not mounted now, else None."""
        path = folder.rstrip("/") or "/"
        while True:
            if path in mounts and path != "/":
                try:
                    here = self.fs.stat(path).st_dev
                    parent = self.fs.stat(os.path.dirname(path)).st_dev
                except OSError:
                    return path
                return path if here == parent else None
            if path == "/":
                return None
            path = os.path.dirname(path)

    def _decide_pending(self, found: dict) -> None:
        now = self._now()
        self._pending_index = None          # this round's look at the pending files
        self._started = 0
        try:
            self._decide_each(found, now)
        finally:
            if self._started > STARTS_LOGGED:
                log.info("tailing %d more new file(s) of topic %s (one line each for the "
                         "first %d)", self._started - STARTS_LOGGED, self.cfg.label,
                         STARTS_LOGGED)

    def _decide_each(self, found: dict, now: float) -> None:
        if self.pending:
            # Known generations this scan did not place (their inode was not found where it
            # was listed, or could not be opened): a pending file may be their copy.
            placed = {t.source_id for t in self.tracked.values()}
            self._unplaced = [r["fingerprint"] for r in self.db.rows(self.cfg.index,
                                                                   (ACTIVE, ROTATED))
                              if r["source_id"] not in placed and r["fingerprint"]]
        for ident, p in list(self.pending.items()):
            listed = found.get(ident)
            if listed is not None:
                p.path = listed[0]
            size = self.fs.fstat(p.fd).st_size
            if size != p.size:
                p.size, p.since = size, now
            head = self.fs.pread(p.fd, FINGERPRINT_BYTES, 0)
            if p.weak is not None and not head.startswith(p.weak["fingerprint"] or b""):
                # Truncated and written again since it was opened: the known row's content
                # is no longer here; the file is new content, pending in a row of its own.
                if p.weak["state"] in (ACTIVE, ROTATED):
                    self._orphan_row(p.weak, "unaccounted_bytes")
                p.weak = None
                p.row_id = self.db.add_file(self.cfg.index, *ident, head, p.path, 0, size,
                                            state=PENDING)
            orphan, original, maybe = self._classify(p, head, size)
            waited = now - p.since
            # (A file no longer listed waits too: its descriptor holds it.)
            if maybe and waited < gen.SETTLE_S:
                continue                    # perhaps a copy still being written: wait
            if orphan is None and original is None and self._compressing(p, size, now):
                # A compressor still writing it (a loaded host's gzip can take seconds): what
                # it holds so far is not yet what it is a copy of. Decided once its stream is
                # whole, or COMPRESSING_WAIT_S after it was found (a file written compressed
                # for good is then decided on as it is).
                continue
            if orphan is not None:
                self._continue(orphan, ident, p, head, size)
                continue
            if original is not None:
                if waited < gen.COPY_GRACE_S:
                    if p.copy_of != original.source_id:
                        p.copy_of = original.source_id
                        log.info("%s (inode %d) is a copy of %s (source %d), which is still "
                                 "being read: holding it until that file is truncated or it "
                                 "is left as it is", p.path, ident[1], original.path,
                                 original.source_id)
                    continue
                self._start(ident, p, head, size, size, listed is not None,
                            f"a copy of content read from source {original.source_id}")
            elif p.weak is not None:
                del self.pending[ident]
                self._resume(ident, p.weak, p.path, p.fd, head, size, rotated=listed is None)
            elif (sid := self._pool_source_of(p)) is not None:
                del self.pending[ident]
                self.db.adopt(p.row_id, sid)
                self._resume(ident, self.db.get(sid), p.path, p.fd, head, size,
                             rotated=listed is None, why=": its lines are the pool's slots of "
                             "a row a power cut took from the state database")
            else:
                self._start(ident, p, head, size, min(p.start_at, size), listed is not None,
                            "read_from = end" if p.start_at and self.cfg.read_from == "end"
                            else "changed after it was ignored as old" if p.start_at else "")

    def _pool_source_of(self, p: Pending) -> int | None:
        """The source id of the pool's slots that read this new file from its first byte,
        when no row of the state database has it (a power cut took the row and the commits
        after it; the slots' seal was synced): the file holds, from byte 0, the first of their
        records as they were read, or zeros (the cut dropped its first page) and then some of
        their lines in place (``_held_beyond``); the rest is checked as after any power cut
        (``_resume``). Read from 0, their lines would go again under new numbers. Not for a
        source that rewrites its lines or routes them to topics (no line is a record as
        read), nor for slots of another topic."""
        if p.start_at or self.reader.lines.rewrites or self.reader.routes.by_line:
            return None
        if self._unclaimed is None:
            self._unclaimed = {sid for sid in self.recovered if not self.db.has(sid)}
        for sid in sorted(self._unclaimed):
            # (another source may have taken it since; its slots may be freed since)
            slots = self._read_by_pool(sid, -1, self.recovered[sid]) \
                if sid in self.recovered else []
            if not slots or self.db.has(sid):
                self._unclaimed.discard(sid)
                continue
            if slots[0][0] != 0 or slots[0][2].topic != self.cfg.topic:
                continue
            _start, end, slot = slots[0]
            own = _own_blocks(slot, sid, 0, end)
            found = False
            if own is not None:
                first = next(_values(own), b"")
                data = self.fs.pread(p.fd, len(first) + 2, 0)
                found = bool(first) and data.startswith(first) and \
                    bool(_line_end(data, len(first))) or \
                    data[:1] == b"\0" and bool(self._held_beyond(sid, p.fd, 0, slots))
            if not found and len(slot.meta.positions) != 1:
                # the file's first lines among another's, whole (its blocks not told apart)
                found = _holds_all(self.fs.pread(p.fd, end, 0), end,
                                   (v for _t, _k, v in slot.records()))
            if found:
                self._unclaimed.discard(sid)    # (its slots are checked by ``_resume``)
                return sid
        return None

    def _classify(self, p: Pending, head: bytes, size: int
                  ) -> tuple[Orphan | None, Tracked | None, bool]:
        """What the pending file's content is a copy of: an orphan, a file being tailed, or
        nothing yet known; and whether a longer match may still come (the file is so far a
        strict prefix of a longer fingerprint: perhaps a copy being written). Of every match
        the one with the most evidence wins (``generations``), then the newest orphan."""
        def read_at(offset: int, n: int) -> bytes:
            return self.fs.pread(p.fd, n, offset)

        # A known row on this inode (``weak``) competes with its own fingerprint's length.
        known = len(p.weak["fingerprint"] or b"") if p.weak is not None else -1
        for attempt in range(2):
            orphan, original, best, longest_maybe, stale = None, None, known, -1, []
            for o in reversed(self.orphans):                 # the newest first
                verdict, evidence = gen.orphan_match(head, read_at, size, o)
                if verdict == MATCH and evidence > best:
                    orphan, best = o, evidence
                elif verdict == MAYBE:
                    longest_maybe = max(longest_maybe, len(o.fingerprint))
            for t in self._candidates(head):
                verdict = gen.by_head(head, t.fingerprint)
                if verdict == MAYBE:
                    longest_maybe = max(longest_maybe, len(t.fingerprint))
                evidence = gen.live_evidence(t.fingerprint, size)
                if verdict != MATCH or evidence <= best:
                    continue
                if self._copy_of_live(t, read_at, size):
                    orphan, original, best = None, t, evidence
                else:
                    stale.append(t)          # starts like it, no longer matches: truncated?
            for fingerprint in self._unplaced:         # wait until they are placed
                if gen.by_head(head, fingerprint) != NO:
                    longest_maybe = max(longest_maybe, len(fingerprint))
            maybe = size == 0 or longest_maybe > best or \
                (orphan is None and original is None and self._copy_of_pending(p, size))
            if not stale or attempt:                     # (stale ones beat the best match)
                return orphan, original, maybe
            # The original may have been truncated since this scan looked at it: look again
            # before taking its copy for new content (its orphan is then matched).
            for t in stale:
                self.reader.check(t)
        return orphan, original, maybe

    def _start(self, ident: Ident, p: Pending, head: bytes, size: int, offset: int,
               listed: bool, why: str) -> None:
        del self.pending[ident]
        if p.weak is not None:
            offset = max(offset, self._resume_offset(p.weak))
        # Started past its first byte (read_from = "end", a copy of content read elsewhere):
        # the start is an anchor, below which a power cut that took every later commit never
        # sends reading back (``_resume``: else the file's start, and what was left out goes)
        first = []
        if offset > 0:
            crc = anchors.checksum(lambda off, n: self.fs.pread(p.fd, n, off), offset)
            first = [(offset, crc)] if crc is not None else []
        self.db.start(p.row_id, ACTIVE if listed else ROTATED, offset, head, p.path, size,
                      anchors.pack(first) if first else None)
        self._started += 1
        if self._started <= STARTS_LOGGED:
            log.info("tailing %s (inode %d, source %d) from offset %d of %d%s", p.path,
                     ident[1], p.row_id, offset, size, f": {why}" if why else "")
        if size == 0:
            self._bad("empty_file")
        t = Tracked(p.row_id, p.path, p.fd, *ident, head, offset, size_seen=size,
                    rotated=not listed, anchors=first)
        self._track(ident, t)
        packed = self.fs.compression(p.fd)
        if packed is not None and self.cfg.compressed == "skip":
            if self._unseen(ident, p.row_id, head, packed):
                # Written, rotated and compressed while the agent was stopped (or between two
                # of its looks): the only form its content has left. Read whole.
                self._rotation("compressed_unseen")
                log.info("%s is %s-compressed content this agent never saw (written, rotated "
                         "and compressed while it was stopped): read whole, decompressed",
                         p.path, packed)
                return
            t.compressed = packed           # not the compressed form of a file being read
            self._compressed(t, packed)

    def _unseen(self, ident: Ident, row_id: int, head: bytes, packed: str) -> bool:
        """Whether a compressed file that is no generation's copy holds content never seen:
        not found by the agent's first listing (archives there before it are skipped), and
        neither a generation nor a skipped file starts like it (a copy of content read to its
        end, or an archive, is skipped)."""
        return packed in compressed.READABLE and ident not in self._archives \
            and len(head) > 0 and not self.db.knows_content(head, but=row_id)

    def _compressing(self, p: Pending, size: int, now: float) -> bool:
        """Whether a compressor may still be writing the pending file ``p``, found less than
        ``COMPRESSING_WAIT_S`` ago: its bytes do not yet end with a whole stream, or it is
        empty under a compressed file's name (gzip makes its output file before it writes a
        byte to it)."""
        if now - p.found >= gen.COMPRESSING_WAIT_S:
            return False
        return self.fs.compressing(p.fd) or (size == 0 and compressed.named(p.path))

    def _copy_of_pending(self, p: Pending, size: int) -> bool:
        """Is ``p`` so far a copy of another file not decided on yet (an original and its
        copy found in one scan)? Then the original is decided first, and ``p`` is judged
        against it. Of two equal files, the one found later waits."""
        def read_p(offset: int, n: int) -> bytes:
            return self.fs.pread(p.fd, n, offset)

        if size == 0:
            return False
        for q, q_size in self._pending_like(read_p(0, min(size, HEAD_KEY))):
            if q is p:
                continue
            if q_size < size or (q_size == size and q.row_id > p.row_id):
                continue
            if gen.same_end(read_p, lambda offset, n, fd=q.fd: self.fs.pread(fd, n, offset),
                            size) and read_p(0, min(size, FINGERPRINT_BYTES)) == \
                    self.fs.pread(q.fd, min(size, FINGERPRINT_BYTES), 0):
                return True
        return False

    def _pending_like(self, key: bytes) -> list[tuple[Pending, int]]:
        """The files pending now, with their sizes, whose first ``HEAD_KEY`` bytes are
        ``key`` (every one when ``key`` is shorter), looked at once per decision round."""
        if self._pending_index is None:
            self._pending_index = defaultdict(list)
            for q in self.pending.values():
                q_key = self.fs.pread(q.fd, HEAD_KEY, 0)
                self._pending_index[q_key].append((q, self.fs.fstat(q.fd).st_size))
        found = [e for es in self._pending_index.values() for e in es] \
            if len(key) < HEAD_KEY else self._pending_index.get(key, [])
        return [e for e in found if self.pending.get((e[0].dev, e[0].ino)) is e[0]]

    def _copy_of_live(self, t: Tracked, read_at, size: int) -> bool:
        if size > self.fs.fstat(t.fd).st_size:
            return False
        return gen.same_end(read_at, lambda offset, n: self.fs.pread(t.fd, n, offset), size)

    def _continue(self, o: Orphan, ident: Ident, p: Pending, head: bytes, size: int) -> None:
        """The pending file ``p`` is a copy of orphan ``o``: it continues ``o``'s generation."""
        self.orphans.remove(o)
        del self.pending[ident]
        fingerprint = head if len(head) > len(o.fingerprint) else o.fingerprint
        if p.weak is not None and p.weak["state"] in (ACTIVE, ROTATED):
            self._orphan_row(p.weak, "unaccounted_bytes")   # this inode holds other content
        self.db.relocate(o.source_id, ident[0], ident[1], p.path, size, fingerprint,
                         None if p.weak is not None else p.row_id)
        packed = self.fs.compression(p.fd)
        self._rotation("compressed_copy" if packed else "copytruncate_copy")
        log.info("tailing %s (inode %d) as the %scopy of source %d from offset %d of %d%s",
                 p.path, ident[1], f"{packed}-compressed " if packed else "", o.source_id,
                 o.offset, size,
                 "; its unread bytes had been journaled, wrongly" if o.journaled else "")
        self._track(ident, Tracked(o.source_id, p.path, p.fd, *ident, fingerprint, o.offset,
                                   size_seen=size, tail=o.tail))

    def _expire_orphans(self) -> None:
        now = self._now()
        compressing = None
        for o in list(self.orphans):
            if not o.journaled and now >= o.deadline and compressing is None:
                # A compressed file still being written may be this orphan's copy: none is
                # given up while one is (up to COMPRESSING_WAIT_S after it was found). Looked
                # at once, and only when an orphan is due.
                compressing = any(self._compressing(p, self.fs.fstat(p.fd).st_size, now)
                                  for p in self.pending.values())
            if not o.journaled and now >= o.deadline and not compressing:
                o.journaled = True
                self.db.update(o.source_id, state=LOST)
                self._rotation("copy_not_found")
                unread = max(0, o.size_seen - o.offset)
                if unread or (o.while_stopped and o.reason != ROTATED_DELETED):
                    self._journal_orphan(o, unread)
                elif o.reason == ROTATED_DELETED:
                    self._rotation("deleted_read")
                    log.info("%s (source %d): rotated away, read to its end (%d bytes) and "
                             "deleted while the agent was stopped: nothing of it is owed",
                             o.path, o.source_id, o.offset)
                else:
                    log.info("%s (source %d): no copy of it found; every byte seen of it had "
                             "been read", o.path, o.source_id)
            if now >= o.expires:
                self.orphans.remove(o)

    def _journal_orphan(self, o: Orphan, unread: int) -> None:
        reason = "deleted_unread" if o.reason == ROTATED_DELETED else o.reason
        if reason == "deleted_unread":
            what = "deleted or moved away while the agent was stopped; no copy of it found"
        elif o.while_stopped:
            # Found so at start: truncated in place, or deleted and its inode number given to
            # a new file at the same path — which, the agent cannot tell.
            what = "no longer on its inode when the agent started (truncated in place, or " \
                   "deleted and its inode given to a new file) with bytes not read, and no " \
                   "copy of it matched the globs"
        else:
            what = "truncated (copytruncate) with bytes not read, and no copy of it matched " \
                   "the globs"
        # What was written after the last look, before the truncation or deletion, is unknown.
        what += f"; its content after byte {o.size_seen} is unknown"
        log.warning("%s (source %d): %s; journaled bytes %d-%d", o.path, o.source_id, what,
                    o.offset, o.size_seen)
        self.journal.record(reason, self.reader.routes.of(o.path).topic, -1, nbytes=unread,
                            source=o.path,
                            byte_range=(o.offset, max(o.offset, o.size_seen)),
                            source_id=o.source_id, open_ended=True, detail=what)

    # -- truncation ---------------------------------------------------------------------------
    def _truncated(self, t: Tracked, head: bytes) -> None:
        """The inode of ``t`` no longer holds its generation: that generation becomes an orphan
        (a copy of it found now or later continues it), and a new generation starts at 0."""
        size = self.fs.fstat(t.fd).st_size
        unread = max(0, t.size_seen - t.offset)
        log.info("%s (inode %d) was truncated after %d bytes read (%d seen unread)", t.path,
                 t.ino, t.offset, unread)
        self._rotation("truncated")
        # Seal what was handed over of the old content: the orphan's offset is then sealed.
        self.pool.seal(self.reader.routes.of(t.path).topic)
        now = self._now()
        self.orphans.append(Orphan(t.source_id, t.fingerprint, t.offset, t.size_seen, t.tail,
                                   t.path, now + gen.COPY_GRACE_S,
                                   now + gen.ORPHAN_RETENTION_S))
        new_id = self.db.orphan(t.source_id, t.size_seen, t.tail or None, "unaccounted_bytes",
                                successor={"source_index": self.cfg.index, "dev": t.dev,
                                           "ino": t.ino, "fingerprint": head, "path": t.path,
                                           "size_seen": size}, now_ms=self.clock.time_ms())
        self._by_source.pop(t.source_id, None)
        t.source_id, t.fingerprint, t.offset, t.tail = new_id, head, 0, b""
        t.anchors, t.fine, t.anchor_since, t.skip = [], [], float("-inf"), []
        t.handed.clear()
        self._heads = None                              # its fingerprint changed
        self._by_source[new_id] = t
        t.size_seen, t.idle_since, t.partial_since, t.partial_size = size, None, None, 0
        # A new generation: its own looks, and no event of the old one open or cut (an event
        # never spans two generations; the old one's wait would flush the new one's early).
        t.size_since, t.event_since, t.event_size, t.cut_open = None, None, 0, False
        self._sizes_stored[new_id] = size

    def anchors(self, ends: dict[int, int]) -> dict[int, bytes]:
        """Of the sealed ends about to be written (source_id → offset), those of files this
        source reads: each generation's anchors with the newest hand-over at or below its end
        as the newest (``anchors.py``)."""
        out = {}
        now = self._now()
        for sid, end in ends.items():
            t = self._by_source.get(sid)
            if t is None:
                continue
            passed = []
            while t.handed and t.handed[0][0] <= end:
                passed.append(t.handed.popleft())
            if not passed:
                continue
            fresh = now - t.anchor_since < anchors.EVERY_S
            if not fresh:
                t.anchor_since = now
            t.anchors = anchors.add(t.anchors, passed[-1], fresh)
            t.fine = anchors.add_fine(t.fine, passed)
            out[sid] = anchors.pack(t.anchors, t.fine)
        return out

    def _compressed(self, t: Tracked, kind: str) -> None:
        """``t`` is compressed and not the compressed form of content being read, and
        ``compressed = "skip"``: not read (``compressed.py``)."""
        if t.path not in self._compressed_seen:
            self._compressed_seen.add(t.path)
            log.warning("%s is %s-compressed and not the compressed form of a file being read: "
                        "not read (compressed = \"%s\")", t.path, kind, self.cfg.compressed)
        self._bad("compressed")
        # Forgotten by the database: none of its bytes is owed, so neither its deletion nor a
        # rotation while the agent is stopped may journal them as unread. Its start is kept:
        # found again, it is not taken for content never seen (``_unseen``).
        self.db.add_skipped(t.fingerprint)
        self.db.delete(t.source_id)

    def _candidates(self, head: bytes) -> list[Tracked]:
        """The tracked files whose fingerprint ``head`` may start with or be a prefix of
        (``gen.by_head`` is NO for every other): compared with one file found at a time."""
        if self._heads is None:
            self._heads = HeadIndex(self.tracked.values())
        return [t for t in self._heads.candidates(head, self.tracked.values())
                if self.tracked.get((t.dev, t.ino)) is t]

    def _store_fingerprint(self, t: Tracked) -> None:
        self._heads = None                              # its key may have changed
        self.db.update(t.source_id, fingerprint=t.fingerprint)

    # -- reading ------------------------------------------------------------------------------
    def settling(self) -> bool:
        """Something only a later scan decides: files found and not yet decided on (a copy
        still being written?), content truncated or deleted whose copy is awaited for
        ``COPY_GRACE_S``, known files whose folder is away; the service keeps scanning at
        ``poll_interval_ms`` meanwhile."""
        return bool(self.pending or self.folders_away
                    or any(not o.journaled for o in self.orphans))

    def due(self) -> float | None:
        """When (monotonic s) an open multiline event or a partial last line is next to be
        flushed, if one waits: the loop's idle wait ends then."""
        return min((d for d in map(self.reader.due, self.tracked.values()) if d is not None),
                   default=None)

    def read_some(self, budget_bytes: int, written: set[str] | None = None) -> ReadStats:
        """Read what is new, old (rotated) files first; stop when the pool pushes back.
        ``written``: the files written since the last call, by path, when the caller knows
        them (the write watch: ``FolderWatch.written_paths``); a file read to its end with
        nothing waiting is then not looked at again until it is written, a scan runs or a
        write names a file this source does not know (the loop's cost then follows the
        files written, not the files open: 10,000 idle files cost 0.24 core before). None:
        every file is looked at."""
        stats = ReadStats()
        if written is None:
            self._quiet.clear()
        elif written:
            for path in written:
                if path in self._idle_paths:
                    self.rescan = True          # a file closed while idle: open it again
                    continue
                ident = self._quiet_paths.get(path)
                if ident is None:
                    if self._matches(path):
                        self._quiet.clear()         # a file not known by that name
                        break
                    continue
                self._quiet.discard(ident)
        order = sorted((t for i, t in self.tracked.items() if i not in self._quiet),
                       key=lambda t: (not t.rotated, t.source_id))
        for t in order:
            if t.compressed:
                continue
            if stats.bytes >= budget_bytes or stats.blocked:
                break
            self.reader.read(t, budget_bytes - stats.bytes, stats)
            ident = (t.dev, t.ino)
            if t.offset >= t.size_seen and t.partial_since is None and not t.rotated \
                    and self.tracked.get(ident) is t:
                self._quiet.add(ident)
                self._quiet_paths[t.path] = ident
        self._close_finished()
        return stats

    def _matches(self, path: str) -> bool:
        """Whether ``path`` is one this source would tail (its globs, not its excludes)."""
        return any(fnmatch.fnmatchcase(path, p) for p in self.cfg.paths) and \
            not excluded(path, self.cfg.exclude)

    def _close_finished(self) -> None:
        now = self._now()
        if now < self._next_close_check and self._over_cap() <= 0:
            return
        self._next_close_check = now + CLOSE_CHECK_S
        self._close_idle(now)
        for ident, t in list(self.tracked.items()):
            if t.rotated and t.idle_since is not None and now - t.idle_since >= ROTATED_IDLE_S:
                size = self.fs.fstat(t.fd).st_size
                if size > t.offset and not t.compressed:
                    continue                  # grew meanwhile: read on
                self.fs.close(t.fd)
                del self.tracked[ident]
                self._by_source.pop(t.source_id, None)
                self._closed[t.source_id] = t.offset
                self.db.update(t.source_id, state=DONE, size_seen=size)
                self._sizes_stored.pop(t.source_id, None)

    def _idle_for(self, t: Tracked, now: float) -> float | None:
        """How long ``t`` has been read to its end with nothing held back (None: it is not)."""
        if t.idle_since is None or t.rotated or t.compressed or t.partial_since is not None \
                or t.event_since is not None or t.offset < t.size_seen \
                or self.fs.compression(t.fd) is not None:
            return None
        return now - t.idle_since

    def _close_idle(self, now: float) -> None:
        """Close files idle ``close_idle_ms``, and beyond ``max_open_files`` the files idle
        longest; a cap every open file is too busy for is exceeded, and said."""
        limit = self.cfg.close_idle_ms / 1e3 if self.cfg.close_idle_ms else None
        if limit is None and not self.cfg.max_open_files:
            return
        idle = sorted(((d, ident) for ident, t in self.tracked.items()
                       if (d := self._idle_for(t, now)) is not None), reverse=True)
        over = self._over_cap()
        for k, (d, ident) in enumerate(idle):
            if k >= over and (limit is None or d < limit):
                break
            self._close_one(ident)
        over = self._over_cap()
        if over > 0 and not self.over_cap:
            log.warning("topic %s: %d file(s) open, over max_open_files = %d, and none of them "
                        "idle: kept open (closing a file being written would leave it unread)",
                        self.cfg.label, len(self.tracked), self.cfg.max_open_files)
        self.over_cap = max(0, over)

    def _over_cap(self) -> int:
        """Files open beyond ``max_open_files`` (0 without a cap)."""
        cap = self.cfg.max_open_files
        return len(self.tracked) - cap if cap else 0

    def _close_one(self, ident: Ident) -> None:
        t = self.tracked.pop(ident)
        st = self.fs.fstat(t.fd)
        self.fs.close(t.fd)
        self._by_source.pop(t.source_id, None)
        self._heads = None
        self._quiet.discard(ident)
        self._quiet_paths.pop(t.path, None)
        self._closed[t.source_id] = t.offset
        self.idle_closed[ident] = (t.source_id, st.st_size, _mtime_ns(st))
        self._idle_paths[t.path] = ident
        self._sizes_stored.pop(t.source_id, None)     # read to its end: its size is stored

    def _store_sizes(self, force: bool = False) -> None:
        """Sizes seen reach the database at least every SIZE_PERSIST_S, so after a SIGKILL a
        file deleted meanwhile is journaled with what it had that was not read."""
        now = self._now()
        if not force and now < self._next_size_store:
            return
        self._next_size_store = now + SIZE_PERSIST_S
        changed = {t.source_id: t.size_seen for t in self.tracked.values()
                   if self._sizes_stored.get(t.source_id) != t.size_seen}
        self.db.set_sizes(changed)
        self._sizes_stored.update(changed)

    # -- status -------------------------------------------------------------------------------
    def lag(self) -> dict[str, int]:
        return {t.path: max(0, t.size_seen - t.offset) for t in self.tracked.values()}

    def waiting(self) -> dict:
        """What status shows beside the lag: files that cannot be read, orphans waiting for
        their copy, copies held, files not yet decided on."""
        return {"unreadable": dict(self.unreadable),
                "orphans_waiting": [{"path": o.path, "offset": o.offset,
                                     "unread_bytes": max(0, o.size_seen - o.offset),
                                     "journaled": o.journaled} for o in self.orphans],
                "copies_held": [p.path for p in self.pending.values() if p.copy_of is not None],
                "folders_away": dict(self.folders_away),
                "compressed": sorted(t.path for t in self.tracked.values() if t.compressed),
                "ignored_older": len(self.ignored_older),
                "idle_closed": len(self.idle_closed),
                "over_max_open_files": self.over_cap,
                "pending": [p.path for p in self.pending.values() if p.copy_of is None]}

    def _descriptors(self) -> list[int]:
        return [t.fd for t in self.tracked.values()] + [p.fd for p in self.pending.values()]

    def abandon(self) -> None:
        """For tests that simulate a SIGKILL: close the descriptors, store nothing."""
        for fd in self._descriptors():
            self.fs.close(fd)
        self.tracked.clear()
        self._by_source.clear()
        self.pending.clear()

    def close(self) -> None:
        self._store_sizes(force=True)
        for fd in self._descriptors():
            self.fs.close(fd)
        self.tracked.clear()
        self._by_source.clear()
        self.pending.clear()


def _mtime_ns(st: os.stat_result) -> int:
    """A stat's modification time in ns (a stat built from its first ten fields has none)."""
    return st.st_mtime_ns if st.st_mtime_ns is not None else int(st.st_mtime * 1e9)


# File systems whose every write raises an inotify event on this host (not a network file
# system's, nor a FUSE one's whose writes may come from elsewhere).
LOCAL_FS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "tmpfs", "overlay", "zfs", "f2fs",
                      "jfs", "reiserfs", "ramfs", "bcachefs", "nilfs2"})
_fs_types: dict[int, str | None] = {}


def _local_fs(dev: int) -> bool:
    """Whether device ``dev`` holds a file system of ``LOCAL_FS`` (``/proc/self/mountinfo``;
    looked up once per device)."""
    if dev not in _fs_types:
        _fs_types[dev] = None
        try:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    fields = line.split()
                    major, minor = fields[2].split(":")
                    if os.makedev(int(major), int(minor)) == dev and " - " in line:
                        _fs_types[dev] = line.split(" - ", 1)[1].split()[0]
                        break
        except (OSError, ValueError, IndexError):
            pass
    return _fs_types[dev] in LOCAL_FS


def _ctime_ns(st: os.stat_result) -> int:
    """A stat's change time in ns (as ``_mtime_ns``)."""
    return st.st_ctime_ns if st.st_ctime_ns is not None else int(st.st_ctime * 1e9)


def _own_blocks(slot, sid: int, start: int, end: int) -> list | None:
    """The blocks of ``slot`` that read bytes ``start`` to ``end`` of source ``sid`` (its
    part of the slot): all of a slot of one source; of a slot holding other files' lines too
    (a rotation within it), its first blocks when that source wrote to it first, its last
    when last (the header keeps the sources in the order they first wrote), whose lines span
    just those bytes — each block is one read of one file, and a file rotated is read to its
    end before the next —; None when that cannot be told (a source between others, sums that
    do not meet the part's length, a long line's parts)."""
    blocks = list(slot.blocks())
    positions = slot.meta.positions
    if len(positions) == 1:
        return blocks
    at = [i for i, (s, a, b) in enumerate(positions) if (s, a, b) == (sid, start, end)]
    if at == [0]:
        order = blocks
    elif at == [len(positions) - 1]:
        order = blocks[::-1]
    else:
        return None
    total = 0
    for k, block in enumerate(order):
        if block.part_count:
            return None
        total += _block_bytes(block)
        if total == end - start:
            return order[:k + 1] if at == [0] else order[k::-1]
        if total > end - start:
            return None
    return None


def _values_placed(blocks: list):
    """(value, bytes to the next record's start) of each record of ``blocks``, in order: the
    step its block's layout gives (its line end included), the block's last one's line end as
    the lines' before it; None for a part of a long line or a lone record, whose line end the
    block does not tell."""
    for block in blocks:
        offsets, lengths = block.offsets.tolist(), block.lengths.tolist()
        last = _last_line_end(block)
        for i, n in enumerate(lengths):
            if block.part_count:
                place = None
            elif i + 1 < len(lengths):
                place = offsets[i + 1] - offsets[i]
            else:
                place = None if last is None else n + last
            yield bytes(block.value(i)), place


def _lines_held(data: bytes, span: int) -> bool:
    """Whether ``data``, a file's bytes of a stretch of ``span`` bytes, holds it as lines:
    every byte there, none a zero a dropped page left, a line's end at its end."""
    return len(data) == span and b"\0" not in data and data.endswith(b"\n")


def _values(blocks: list):
    """The records' values of ``blocks``, in order (copies)."""
    return (bytes(b.value(i)) for b in blocks for i in range(len(b)))


def _block_bytes(block) -> int:
    """The bytes of its file a block of lines read: from its first line's start to its last
    one's end, that line's end as long as the one before it (a newline, alone)."""
    if not len(block):
        return 0
    offsets, lengths = block.offsets, block.lengths
    last = _last_line_end(block)
    return int(offsets[-1]) - int(offsets[0]) + int(lengths[-1]) + (1 if last is None else last)


def _last_line_end(block) -> int | None:
    """The line end of a block's last line, which the block does not keep: as long as the one
    before it (None with one record: nothing tells)."""
    offsets, lengths = block.offsets, block.lengths
    if len(offsets) < 2:
        return None
    return int(offsets[-1]) - int(offsets[-2]) - int(lengths[-2])


def _holds_all(data: bytes, span: int, values) -> bool:
    """Whether ``data`` — the file's bytes where a slot read ``span`` bytes of it, the slot
    holding other files' records too — is the slot's records of that file whole, line after
    line: each record is taken for the file's when the file holds it where the last one
    ended, for another's otherwise. Only a whole match says yes: a cut inside, a record that
    no line is, or a file that holds less than ``span`` there (its bytes all matched would
    say nothing of the rest) says no."""
    if len(data) != span:
        return False
    pos = 0
    for value in values:
        if pos == len(data):
            return True
        n = len(value)
        if data[pos:pos + n] != value:
            continue
        ended = _line_end(data, pos + n)
        if ended:
            pos += n + ended
        elif pos + n == len(data):                  # a partial line at the end
            pos += n
    return pos == len(data)


def _line_end(data: bytes, at: int) -> int | None:
    """The length of the line ending ``data`` holds at ``at`` (a record's end): 1 for a
    newline, 2 for a CR before it; None for none."""
    after = data[at:at + 2]
    return 1 if after[:1] == b"\n" else 2 if after == b"\r\n" else None
