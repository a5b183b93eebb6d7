"""The file source: tail every file matching a source's globs into the buffer pool.

The parts, as the data flows (Fluent Bit's in_tail splits scan / file / db the same way):

- ``discovery.py`` lists the globs' files by identity (device, inode);
- ``generations.py`` holds the one model of content and its copies — generations, orphans, held
  copies — and the rules that match a found file to them (read its docstring first);
- ``reader.py`` reads an open file, checking its first bytes after every read;
- this module decides, at every scan, what each found file is, and keeps the state database
  (``agent/state.py``) true: every transition of a generation is one transaction.

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
- **unreadable files**: logged once, shown in status, tried again at every scan.
- **partial last line**: waits for its newline, or ``partial_flush_ms`` of no change.
- **restart**: every inode the database knows resumes at max(sealed checkpoint, pool's recovered
  position), before any new file is considered.

Reads are large (``read_chunk_bytes``) and handed to the pool as whole chunks.
"""

from __future__ import annotations

import errno
import logging
import os

from ..buffer import BufferPool
from ..config import SourceConfig
from ..journal import LossJournal
from ..state import ACTIVE, DONE, FINGERPRINT_BYTES, LOST, ORPHANED, ROTATED, StateDB
from ..telemetry import Metrics
from . import generations as gen
from .discovery import Ident, Settling, find_outside, list_files
from .generations import MATCH, MAYBE, Held, Orphan
from .reader import Reader, ReadStats, Tracked
from .seams import FsOps

log = logging.getLogger("docket.agent.files")

ROTATED_IDLE_S = 5.0          # a rotated file at its end this long is closed
SIZE_PERSIST_S = 1.0          # sizes seen are stored at least this often


class FileSource:
    def __init__(self, cfg: SourceConfig, pool: BufferPool, db: StateDB, journal: LossJournal,
                 metrics: Metrics, recovered: dict[int, int], fs: FsOps | None = None,
                 clock=None):
        self.cfg = cfg
        self.pool = pool
        self.db = db
        self.journal = journal
        self.metrics = metrics
        self.recovered = recovered
        self.fs = fs or FsOps()
        self.clock = clock or pool.clock
        self.tracked: dict[Ident, Tracked] = {}
        self.held: dict[Ident, Held] = {}
        self.settling = Settling(gen.SETTLE_S)
        self.unreadable: dict[str, str] = {}           # path → why, while it stays so
        self._warned: set[tuple[str, str]] = set()
        self._sizes_stored: dict[int, int] = {}
        self._closed: dict[int, int] = {}              # source_id → offset, closed this run
        self._next_size_store = 0.0
        self._started = False
        self.reader = Reader(cfg, pool, self.fs, self.clock, metrics, self._truncated,
                             self._store_fingerprint)
        self.orphans = self._load_orphans()

    # -- helpers ------------------------------------------------------------------------------
    def _now(self) -> float:
        return self.clock.monotonic_ns() / 1e9

    def _bad(self, kind: str, count: int = 1) -> None:
        self.metrics.inc("agent_source_bad_input_total", count, kind=kind, topic=self.cfg.topic)

    def _warn_once(self, kind: str, path: str) -> None:
        if (kind, path) not in self._warned:
            self._warned.add((kind, path))
            self._bad(kind)

    def _rotation(self, kind: str) -> None:
        self.metrics.inc("agent_source_rotations_total", kind=kind, topic=self.cfg.topic)

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
            out.append(Orphan(row["source_id"], row["fingerprint"] or b"",
                              self._resume_offset(row), row["size_seen"], row["tail"] or b"",
                              row["path"], now + gen.COPY_GRACE_S,
                              now + gen.ORPHAN_RETENTION_S - age_s,
                              journaled=row["state"] == LOST, while_stopped=True,
                              reason="unaccounted_bytes"))
        return out

    # -- scanning -----------------------------------------------------------------------------
    def scan(self) -> None:
        # Truncations first, so a copy found below finds the old content's orphan.
        for t in list(self.tracked.values()):
            self.reader.check(t)
        found = list_files(self.fs, self.cfg.paths,
                           lambda path: self._warn_once("not_a_file", path))
        self._follow_tracked(found)
        new = []
        for ident, (path, st) in found.items():
            if ident in self.tracked or ident in self.held:
                continue
            rows = [r for r in self.db.rows_at(self.cfg.index, *ident)
                    if r["state"] in (ACTIVE, ROTATED, DONE)]
            if rows:
                self._open_known(ident, path, st, rows)
            else:
                new.append((ident, path, st))
        if not self._started:
            self._started = True
            self._vanished_while_stopped(found)
        for ident, path, st in new:
            self._consider(ident, path, st)
        self.settling.keep_only(set(found))
        for path in [p for p in self.unreadable if p not in {f[0] for f in found.values()}]:
            del self.unreadable[path]
        self._decide_held()
        self._expire_orphans()
        self._store_sizes()
        self.metrics.set("agent_source_files", len(self.tracked), topic=self.cfg.topic)

    def _follow_tracked(self, found: dict) -> None:
        for ident, t in self.tracked.items():
            hit = found.get(ident)
            if hit is not None:
                if t.rotated or t.path != hit[0]:
                    t.path, t.rotated = hit[0], False
                    self.db.update(t.source_id, state=ACTIVE, path=t.path)
            elif not t.rotated:
                t.rotated = True
                self._rotation("moved_or_deleted")
                self.db.update(t.source_id, state=ROTATED, path=t.path)
        for ident in [i for i in self.held if i not in found]:
            self.fs.close(self.held.pop(ident).fd)

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
        self.settling.forget(ident)
        self._sizes_stored[t.source_id] = t.size_seen

    def _open_known(self, ident: Ident, path: str, st: os.stat_result, rows: list[dict]) -> None:
        """An inode the database knows: the same content resumes; generations it no longer
        holds become orphans."""
        fd = self._open(path, st)
        if fd is None:
            return
        head = self.fs.pread(fd, FINGERPRINT_BYTES, 0)
        same = [r for r in rows if head.startswith(r["fingerprint"] or b"")]
        keep = same[-1] if same else None
        for r in rows:
            if r is not keep and r["state"] in (ACTIVE, ROTATED):
                self._orphan_row(r, "unaccounted_bytes")
        if keep is None:
            self._consider(ident, path, st, fd)
            return
        offset = self._resume_offset(keep)
        self.db.update(keep["source_id"], state=ACTIVE, path=path)
        log.info("resuming %s (inode %d, source %d) at offset %d of %d", path, ident[1],
                 keep["source_id"], offset, st.st_size)
        self._track(ident, Tracked(keep["source_id"], path, fd, *ident,
                                   keep["fingerprint"] or b"", offset, size_seen=st.st_size))

    def _orphan_row(self, row: dict, reason: str) -> None:
        """A generation found at start no longer on its inode."""
        offset = self._resume_offset(row)
        now = self._now()
        self.db.orphan(row["source_id"], row["size_seen"], None)
        self._rotation("truncated")
        log.info("%s (source %d) no longer holds the content read to offset %d: waiting for a "
                 "copy of it", row["path"], row["source_id"], offset)
        self.orphans.append(Orphan(row["source_id"], row["fingerprint"] or b"", offset,
                                   row["size_seen"], b"", row["path"], now + gen.COPY_GRACE_S,
                                   now + gen.ORPHAN_RETENTION_S, while_stopped=True,
                                   reason=reason))

    def _vanished_while_stopped(self, found: dict) -> None:
        """At start: known inodes no glob lists any more were renamed away or deleted while the
        agent was stopped. Read them to their end where they still are; else they are orphans,
        journaled as ``deleted_unread`` unless a copy of them turns up."""
        rows = [r for r in self.db.rows(self.cfg.index, (ACTIVE, ROTATED))
                if (r["dev"], r["ino"]) not in found]
        where = find_outside(self.fs, self.cfg.paths, {(r["dev"], r["ino"]) for r in rows})
        for r in rows:
            ident = (r["dev"], r["ino"])
            hit = where.get(ident)
            if hit is not None and ident not in self.tracked:
                fd = self._open(*hit)
                if fd is not None:
                    if self.fs.pread(fd, FINGERPRINT_BYTES, 0).startswith(r["fingerprint"]
                                                                           or b""):
                        offset = self._resume_offset(r)
                        log.info("resuming %s (inode %d, source %d), renamed out of the globs "
                                 "while the agent was stopped, at offset %d", hit[0], ident[1],
                                 r["source_id"], offset)
                        self.db.update(r["source_id"], state=ROTATED, path=hit[0])
                        self._track(ident, Tracked(r["source_id"], hit[0], fd, *ident,
                                                   r["fingerprint"] or b"", offset,
                                                   size_seen=hit[1].st_size, rotated=True))
                        continue
                    self.fs.close(fd)
            self._orphan_row(r, "deleted_unread")

    def _consider(self, ident: Ident, path: str, st: os.stat_result, fd: int | None = None
                  ) -> None:
        """A file no generation is known on: a copy of an orphan, a copy of a file being
        tailed, one that may be a copy still being written, or new content."""
        if fd is None:
            fd = self._open(path, st)
            if fd is None:
                return
        size = self.fs.fstat(fd).st_size
        head = self.fs.pread(fd, FINGERPRINT_BYTES, 0)

        def read_at(offset: int, n: int) -> bytes:
            return self.fs.pread(fd, n, offset)

        maybe = size == 0
        for o in reversed(self.orphans):                 # the newest first
            verdict = gen.orphan_match(head, read_at, size, o)
            if verdict == MATCH:
                self._continue(o, ident, path, fd, head, size)
                return
            maybe |= verdict == MAYBE
        for t in list(self.tracked.values()):
            verdict = gen.by_head(head, t.fingerprint)
            if verdict == MATCH and self._copy_of_live(t, read_at, size):
                self._hold(t, ident, path, fd, size)
                return
            maybe |= verdict == MAYBE
        if maybe and not self.settling.settled(ident, size, self._now()):
            self.fs.close(fd)                           # perhaps a copy still being written
            return
        source_id = self.db.add_file(self.cfg.index, *ident, head, path, 0, size)
        log.info("tailing %s (inode %d, source %d) from offset 0 of %d", path, ident[1],
                 source_id, size)
        if size == 0:
            self._bad("empty_file")
        self._track(ident, Tracked(source_id, path, fd, *ident, head, 0, size_seen=size))

    def _copy_of_live(self, t: Tracked, read_at, size: int) -> bool:
        if size > self.fs.fstat(t.fd).st_size:
            return False
        return gen.same_end(read_at, lambda offset, n: self.fs.pread(t.fd, n, offset), size)

    def _continue(self, o: Orphan, ident: Ident, path: str, fd: int, head: bytes,
                  size: int) -> None:
        """The file at ``path`` is a copy of orphan ``o``: it continues ``o``'s generation."""
        if o in self.orphans:
            self.orphans.remove(o)
        fingerprint = head if len(head) > len(o.fingerprint) else o.fingerprint
        self.db.update(o.source_id, dev=ident[0], ino=ident[1], path=path, state=ACTIVE,
                       size_seen=size, fingerprint=fingerprint, tail=None, orphaned_ms=None)
        self._rotation("copytruncate_copy")
        log.info("tailing %s (inode %d) as the copy of source %d from offset %d of %d%s", path,
                 ident[1], o.source_id, o.offset, size,
                 "; its unread bytes had been journaled, wrongly" if o.journaled else "")
        self._track(ident, Tracked(o.source_id, path, fd, *ident, fingerprint, o.offset,
                                   size_seen=size, tail=o.tail))

    def _hold(self, t: Tracked, ident: Ident, path: str, fd: int, size: int) -> None:
        log.info("%s (inode %d) is a copy of %s (source %d), which is still being read: "
                 "holding it until that file is truncated or it is left as it is", path,
                 ident[1], t.path, t.source_id)
        self.held[ident] = Held(t.source_id, path, fd, *ident, size,
                                self._now() + gen.COPY_GRACE_S)

    def _decide_held(self) -> None:
        now = self._now()
        for ident, h in list(self.held.items()):
            size = self.fs.fstat(h.fd).st_size
            if size != h.size:                          # still being written
                h.size, h.deadline = size, now + gen.COPY_GRACE_S
                continue
            if now < h.deadline:
                continue
            # The original was not truncated: a plain copy of content read from it. Tail it
            # from its end, as the same content.
            del self.held[ident]
            head = self.fs.pread(h.fd, FINGERPRINT_BYTES, 0)
            source_id = self.db.add_file(self.cfg.index, *ident, head, h.path, size, size)
            log.info("tailing %s (inode %d, source %d) from its end, %d: a copy of content "
                     "read from source %d", h.path, ident[1], source_id, size, h.source_id)
            self._track(ident, Tracked(source_id, h.path, h.fd, *ident, head, size,
                                       size_seen=size))

    def _expire_orphans(self) -> None:
        now = self._now()
        for o in list(self.orphans):
            if not o.journaled and now >= o.deadline:
                o.journaled = True
                self.db.update(o.source_id, state=LOST)
                unread = max(0, o.size_seen - o.offset)
                if unread or o.while_stopped:
                    self._journal_orphan(o, unread)
            if now >= o.expires:
                self.orphans.remove(o)

    def _journal_orphan(self, o: Orphan, unread: int) -> None:
        if o.reason == "deleted_unread":
            what = "deleted or moved away while the agent was stopped; no copy of it found"
        else:
            what = "truncated (copytruncate) with bytes not read, and no copy of it matched " \
                   "the globs"
        if o.while_stopped:
            what += f"; its content after byte {o.size_seen} is unknown"
        log.warning("%s (source %d): %s; journaled bytes %d-%d", o.path, o.source_id, what,
                    o.offset, o.size_seen)
        self.journal.record(o.reason, self.cfg.topic, -1, nbytes=unread, source=o.path,
                            byte_range=(o.offset, max(o.offset, o.size_seen)),
                            source_id=o.source_id, open_ended=o.while_stopped, detail=what)

    # -- truncation ---------------------------------------------------------------------------
    def _truncated(self, t: Tracked, head: bytes) -> None:
        """The inode of ``t`` no longer holds its generation: that generation becomes an orphan
        (continued by a held copy when there is one), and a new generation starts at 0."""
        size = self.fs.fstat(t.fd).st_size
        unread = max(0, t.size_seen - t.offset)
        log.info("%s (inode %d) was truncated after %d bytes read (%d seen unread)", t.path,
                 t.ino, t.offset, unread)
        self._rotation("truncated")
        # Seal what was handed over of the old content: the orphan's offset is then sealed.
        self.pool.seal(self.cfg.topic)
        now = self._now()
        orphan = Orphan(t.source_id, t.fingerprint, t.offset, t.size_seen, t.tail, t.path,
                        now + gen.COPY_GRACE_S, now + gen.ORPHAN_RETENTION_S,
                        reason="unaccounted_bytes")
        new_id = self.db.orphan(t.source_id, t.size_seen, t.tail or None, successor={
            "source_index": self.cfg.index, "dev": t.dev, "ino": t.ino, "fingerprint": head,
            "path": t.path, "size_seen": size})
        t.source_id, t.fingerprint, t.offset, t.tail = new_id, head, 0, b""
        t.size_seen, t.idle_since, t.partial_since, t.partial_size = size, None, None, 0
        self._sizes_stored[new_id] = size
        for ident, h in list(self.held.items()):
            if h.source_id == orphan.source_id:
                del self.held[ident]
                copy_head = self.fs.pread(h.fd, FINGERPRINT_BYTES, 0)
                copy_size = self.fs.fstat(h.fd).st_size
                if gen.orphan_match(copy_head, lambda o, n, fd=h.fd: self.fs.pread(fd, n, o),
                                    copy_size, orphan) == MATCH:
                    self._continue(orphan, ident, h.path, h.fd, copy_head, copy_size)
                    return
                self.fs.close(h.fd)                     # no longer matches: looked at anew
        self.orphans.append(orphan)

    def _store_fingerprint(self, t: Tracked) -> None:
        self.db.update(t.source_id, fingerprint=t.fingerprint)

    # -- reading ------------------------------------------------------------------------------
    def read_some(self, budget_bytes: int) -> ReadStats:
        """Read what is new, old (rotated) files first; stop when the pool pushes back."""
        stats = ReadStats()
        order = sorted(self.tracked.values(), key=lambda t: (not t.rotated, t.source_id))
        for t in order:
            if stats.bytes >= budget_bytes or stats.blocked:
                break
            self.reader.read(t, budget_bytes - stats.bytes, stats)
        self._close_finished()
        return stats

    def _close_finished(self) -> None:
        now = self._now()
        for ident, t in list(self.tracked.items()):
            if t.rotated and t.idle_since is not None and now - t.idle_since >= ROTATED_IDLE_S:
                size = self.fs.fstat(t.fd).st_size
                if size > t.offset:
                    continue                  # grew meanwhile: read on
                self.fs.close(t.fd)
                del self.tracked[ident]
                self._closed[t.source_id] = t.offset
                self.db.update(t.source_id, state=DONE, size_seen=size)
                self._sizes_stored.pop(t.source_id, None)

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
        their copy, copies held."""
        return {"unreadable": dict(self.unreadable),
                "orphans_waiting": [{"path": o.path, "offset": o.offset,
                                     "unread_bytes": max(0, o.size_seen - o.offset),
                                     "journaled": o.journaled} for o in self.orphans],
                "copies_held": [h.path for h in self.held.values()]}

    def abandon(self) -> None:
        """For tests that simulate a SIGKILL: close the descriptors, store nothing."""
        for fd in [t.fd for t in self.tracked.values()] + [h.fd for h in self.held.values()]:
            self.fs.close(fd)
        self.tracked.clear()
        self.held.clear()

    def close(self) -> None:
        self._store_sizes(force=True)
        for t in self.tracked.values():
            self.fs.close(t.fd)
        for h in self.held.values():
            self.fs.close(h.fd)
        self.tracked.clear()
        self.held.clear()

