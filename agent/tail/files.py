"""The file source: tail every file matching a source's globs into the buffer pool.

Identity is (device, inode) plus the file's first bytes (its *fingerprint*), so a renamed file is
the same file and a reused inode is not. What it handles, and how:

- **rename-and-create rotation**: the old inode is no longer at its path; it stays open and is
  read to its end before it is closed (old files are read before new ones).
- **copytruncate**: the file shrinks below what was read: reading restarts at 0. When the glob
  also matches the copy (a new inode whose fingerprint equals the old content's), the copy is
  read from the old read offset on — only what had not been read. Bytes seen written but never
  read, and not found in a copy within ``COPY_GRACE_S``, are journaled as ``unaccounted_bytes``.
- **symlinks**: globs are resolved; identity is the target's.
- **late files**: every scan (file events through ``watch.FolderWatch``, and polling every
  ``poll_interval_ms`` behind them) finds them; one shorter than
  ``MIN_FINGERPRINT`` bytes waits until it is longer or has not changed for ``SETTLE_S`` (it may
  be a copy still being written).
- **deleted files**: an open file is read to its end even after it is unlinked. A file the state
  database knows but that vanished with unread bytes while the agent was down is journaled as
  ``deleted_unread``.
- **partial last line**: waits for its newline, or ``partial_flush_ms`` of no change.
- **restart**: reading resumes at max(sealed checkpoint, pool's recovered position). Files the
  state database knows are opened before new ones, so a copy made while the agent was stopped
  finds the old content's offset even when the original was renamed to a later name since.

Reads are large (``read_chunk_bytes``) and handed to the pool as whole chunks.
"""

from __future__ import annotations

import errno
import glob
import logging
import os
import stat
import time
from dataclasses import dataclass

import numpy as np

from ..buffer import BufferPool, Chunk
from ..config import SourceConfig
from ..journal import LossJournal
from ..state import FINGERPRINT_BYTES, StateDB
from ..telemetry import Metrics
from .events import apply_fields

log = logging.getLogger("docket.agent.files")

MIN_FINGERPRINT = 32          # shorter first bytes cannot tell one file from another
COPY_GRACE_S = 5.0            # how long a truncated file's unread bytes wait for their copy
MAX_LINE_BYTES = 64 << 20     # a line longer than this is cut here (counted as line_forced)
ROTATED_IDLE_S = 1.0          # a rotated file at its end this long is closed
SETTLE_S = 1.0                # a new file shorter than MIN_FINGERPRINT is read once this still


@dataclass
class Tracked:
    source_id: int
    path: str
    fd: int
    dev: int
    ino: int
    fingerprint: bytes
    offset: int                      # bytes handed to the pool (whole lines)
    size_seen: int = 0
    rotated: bool = False            # no glob path leads to this inode any more
    idle_since: float | None = None  # at EOF since (monotonic)
    partial_since: float | None = None
    partial_size: int = 0
    copied_at: int | None = None     # a copy of this content was matched at this offset:
    copy_deadline: float = 0.0       # hold reading until the truncation that should follow


@dataclass
class _Truncation:
    fingerprint: bytes
    offset: int
    unread: int
    path: str
    deadline: float
    source_id: int


@dataclass
class ReadStats:
    bytes: int = 0
    events: int = 0
    blocked: bool = False


def _same_content(stored: bytes, current: bytes) -> bool:
    """The file still starts as it did: a file only grows, so its first bytes only lengthen."""
    return len(current) >= len(stored) and current.startswith(stored)


def _prefix_match(a: bytes, b: bytes) -> bool:
    n = min(len(a), len(b))
    return n >= MIN_FINGERPRINT and a[:n] == b[:n]


class FileSource:
    def __init__(self, cfg: SourceConfig, pool: BufferPool, db: StateDB, journal: LossJournal,
                 metrics: Metrics, recovered: dict[int, int]):
        self.cfg = cfg
        self.pool = pool
        self.db = db
        self.journal = journal
        self.metrics = metrics
        self.recovered = recovered
        self.tracked: dict[tuple[int, int], Tracked] = {}
        self._truncations: list[_Truncation] = []
        self._young: dict[tuple[int, int], tuple[int, float]] = {}   # ident → (size, since)
        self._warned: set[tuple[str, str]] = set()
        rows = [r for r in db.all_files() if r["source_index"] == cfg.index]
        self._known_rows = {(r["dev"], r["ino"]): r for r in rows
                            if r["state"] in ("active", "rotated")}
        # Old generations of truncated files: a copy of one found after a restart starts where
        # the reading of that generation stopped.
        self._old_generations = [r for r in rows if r["state"] == "truncated"]
        self._startup_checked = False

    # -- discovery ----------------------------------------------------------------------------
    def _bad(self, kind: str, count: int = 1) -> None:
        self.metrics.inc("agent_source_bad_input_total", count, kind=kind, topic=self.cfg.topic)

    def _warn_once(self, kind: str, path: str) -> None:
        if (kind, path) not in self._warned:
            self._warned.add((kind, path))
            self._bad(kind)

    def scan(self) -> None:
        # Truncations first, so a copytruncate's copy found below matches the old content.
        for t in self.tracked.values():
            self._check_truncated(t)
        seen: set[tuple[int, int]] = set()
        found: list[tuple[str, os.stat_result]] = []
        for pattern in self.cfg.paths:
            for path in sorted(glob.glob(pattern)):
                try:
                    st = os.stat(path)          # follows symlinks: identity is the target's
                except OSError:
                    continue                    # vanished between glob and stat
                if not stat.S_ISREG(st.st_mode):
                    self._warn_once("not_a_file", path)
                    continue
                ident = (st.st_dev, st.st_ino)
                seen.add(ident)
                t = self.tracked.get(ident)
                if t is not None:
                    t.path, t.rotated = path, False
                    continue
                if self._old_enough(ident, st):
                    found.append((path, st))
        # Files the state database knows first: one truncated while the agent was stopped then
        # leaves its old content's offset for a copy of it, whatever names the two have now
        # (a copy app.log.1 of content now renamed to app.log.2).
        found.sort(key=lambda f: (f[1].st_dev, f[1].st_ino) not in self._known_rows)
        for path, st in found:
            self._open(path, st)
        for ident, t in self.tracked.items():
            if ident not in seen and not t.rotated:
                t.rotated = True
                self.metrics.inc("agent_source_rotations_total", kind="moved_or_deleted",
                                 topic=self.cfg.topic)
                self.db.update(t.source_id, state="rotated", path=t.path)
        if not self._startup_checked:
            self._startup_checked = True
            self._journal_vanished(seen)
        self._expire_truncations()
        self.metrics.set("agent_source_files", len(self.tracked), topic=self.cfg.topic)

    def _old_enough(self, ident: tuple[int, int], st: os.stat_result) -> bool:
        """A new file shorter than a fingerprint cannot be told apart yet: it may be a copy
        being written (copytruncate). Wait until it is long enough, or has kept its size for
        SETTLE_S (a small file that stays small)."""
        if st.st_size >= MIN_FINGERPRINT:
            self._young.pop(ident, None)
            return True
        now = time.monotonic()
        size, since = self._young.get(ident, (None, now))
        if size != st.st_size:
            self._young[ident] = (st.st_size, now)
            return False
        if now - since >= SETTLE_S:
            del self._young[ident]
            return True
        return False

    def _open(self, path: str, st: os.stat_result) -> None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EPERM):
                self._warn_once("unreadable", path)
            return
        self._warned.discard(("unreadable", path))
        fingerprint = os.pread(fd, FINGERPRINT_BYTES, 0)
        ident = (st.st_dev, st.st_ino)
        row = self._known_rows.pop(ident, None)
        if row is not None and not _same_content(row["fingerprint"], fingerprint):
            # Truncated (and perhaps written again) while the agent was stopped: the old content
            # is an old generation, which a copy of it found later resumes.
            old_offset = max(row["sealed_offset"], self.recovered.get(row["source_id"], 0))
            self.db.update(row["source_id"], state="truncated")
            self._old_generations.append({**row, "sealed_offset": old_offset})
            self._truncations.append(_Truncation(
                row["fingerprint"], old_offset, max(0, row["size_seen"] - old_offset), path,
                time.monotonic() + COPY_GRACE_S, row["source_id"]))
            self.metrics.inc("agent_source_rotations_total", kind="truncated",
                             topic=self.cfg.topic)
            log.info("%s (inode %d) was truncated while the agent was stopped, after %d bytes "
                     "read", path, st.st_ino, old_offset)
            row = None
        if row is not None:
            source_id = row["source_id"]
            offset = max(row["sealed_offset"], self.recovered.get(source_id, 0))
            self.db.update(source_id, state="active", path=path)
            log.info("resuming %s (inode %d, source %d) at offset %d of %d", path, st.st_ino,
                     source_id, offset, st.st_size)
        else:
            offset = self._copy_offset(fingerprint)
            source_id = self.db.add_file(self.cfg.index, st.st_dev, st.st_ino, fingerprint,
                                         path, offset)
            log.info("tailing %s (inode %d, source %d) from offset %d of %d%s", path, st.st_ino,
                     source_id, offset, st.st_size,
                     " (a copy of content already read)" if offset else "")
        if st.st_size == 0:
            self._bad("empty_file")
        self.tracked[ident] = Tracked(source_id, path, fd, st.st_dev, st.st_ino, fingerprint,
                                      offset, size_seen=st.st_size)

    def _copy_offset(self, fingerprint: bytes) -> int:
        """A new file that is a copy of content already read starts where that reading stopped."""
        for i, tr in enumerate(self._truncations):
            if _prefix_match(tr.fingerprint, fingerprint):
                del self._truncations[i]
                self._old_generations = [r for r in self._old_generations
                                         if r["source_id"] != tr.source_id]
                self.db.update(tr.source_id, state="copied")
                self.metrics.inc("agent_source_rotations_total", kind="copytruncate_copy",
                                 topic=self.cfg.topic)
                return tr.offset
        for i, row in enumerate(self._old_generations):
            if _prefix_match(row["fingerprint"], fingerprint):
                del self._old_generations[i]
                self.db.update(row["source_id"], state="copied")
                self.metrics.inc("agent_source_rotations_total", kind="copytruncate_copy",
                                 topic=self.cfg.topic)
                return max(row["sealed_offset"], self.recovered.get(row["source_id"], 0))
        for t in self.tracked.values():
            if _prefix_match(t.fingerprint, fingerprint):
                # Copied before the original was truncated (we may not have seen it shrink yet).
                # Seal first: the copy starts where the original's *sealed* data ends, so a
                # crash now re-reads nothing twice and loses nothing.
                self.pool.seal(self.cfg.topic)
                self.metrics.inc("agent_source_rotations_total", kind="copytruncate_copy",
                                 topic=self.cfg.topic)
                t.copied_at = t.offset
                t.copy_deadline = time.monotonic() + COPY_GRACE_S
                return t.offset
        return 0

    def _journal_vanished(self, seen: set) -> None:
        for ident, row in list(self._known_rows.items()):
            if ident in seen:
                continue
            unread = row["size_seen"] - row["sealed_offset"]
            if unread > 0:
                self.journal.record("deleted_unread", self.cfg.topic, -1, nbytes=unread,
                                    source=row["path"],
                                    byte_range=(row["sealed_offset"], row["size_seen"]),
                                    detail="no longer found under the globs after the agent "
                                    "was stopped, with bytes it had not read")
            self.db.update(row["source_id"], state="gone")
            del self._known_rows[ident]

    def _journal_unaccounted(self, path: str, nbytes: int, detail: str,
                             byte_range=None) -> None:
        self.journal.record("unaccounted_bytes", self.cfg.topic, -1, nbytes=nbytes, source=path,
                            byte_range=byte_range, detail=detail)

    def _expire_truncations(self) -> None:
        now = time.monotonic()
        keep = []
        for tr in self._truncations:
            if now < tr.deadline:
                keep.append(tr)
            elif tr.unread > 0:
                self._journal_unaccounted(
                    tr.path, tr.unread,
                    "file truncated (copytruncate) with bytes written but not read, and no copy "
                    "of it matched the globs", (tr.offset, tr.offset + tr.unread))
        self._truncations = keep

    # -- reading ------------------------------------------------------------------------------
    def read_some(self, budget_bytes: int) -> ReadStats:
        """Read what is new, old (rotated) files first; stop when the pool pushes back."""
        stats = ReadStats()
        order = sorted(self.tracked.values(), key=lambda t: (not t.rotated, t.source_id))
        for t in order:
            if stats.bytes >= budget_bytes or stats.blocked:
                break
            self._read_file(t, budget_bytes - stats.bytes, stats)
        self._close_finished()
        return stats

    def _check_truncated(self, t: Tracked) -> int:
        """Detect a truncation — the file shrank below the read offset, or its first bytes
        changed (truncated and written again past the old offset between two looks) — and
        return the current size."""
        size = os.fstat(t.fd).st_size
        # A shrink only counts once the file had reached the offset: a copy still being
        # written starts beyond its current end, and grows.
        shrank = t.offset > size and t.size_seen >= t.offset
        if t.offset and (shrank or not _same_content(
                t.fingerprint, os.pread(t.fd, len(t.fingerprint), 0))):
            self._truncated(t)
        elif len(t.fingerprint) < FINGERPRINT_BYTES and size > len(t.fingerprint):
            t.fingerprint = os.pread(t.fd, FINGERPRINT_BYTES, 0)
            self.db.update(t.source_id, fingerprint=t.fingerprint)
        t.size_seen = size
        return size

    def _read_file(self, t: Tracked, budget: int, stats: ReadStats) -> None:
        self._check_truncated(t)
        if t.copied_at is not None:
            if time.monotonic() < t.copy_deadline and os.fstat(t.fd).st_size >= t.offset:
                return             # the copy holds what follows; the truncation is due
            if time.monotonic() >= t.copy_deadline:
                t.copied_at = None     # no truncation came: it was a plain copy; read on
        while budget > 0:
            size = os.fstat(t.fd).st_size
            if size < t.offset:
                size = self._check_truncated(t)
            t.size_seen = size
            if size <= t.offset:
                if t.idle_since is None:
                    t.idle_since = time.monotonic()
                return
            want = min(self.cfg.read_chunk_bytes, size - t.offset)
            data = os.pread(t.fd, want, t.offset)
            if not data:
                return
            t.idle_since = None
            last_nl = data.rfind(b"\n")
            forced = False
            if last_nl < 0:
                data, forced = self._long_or_partial(t, data, size)
                if data is None:
                    return
                last_nl = len(data) - 1
            t.partial_since = None
            consumed, done = self._hand_over(t, memoryview(data)[:last_nl + 1], stats, forced)
            budget -= consumed
            if not done:
                stats.blocked = True
                return

    def _long_or_partial(self, t: Tracked, data: bytes, size: int) -> tuple[bytes | None, bool]:
        """No newline in what was read: a line longer than a read, or a partial last line.

        Returns the bytes to hand over (ending in a newline) and whether that newline was added
        by the agent, or None when the line must wait."""
        if t.offset + len(data) < size or len(data) >= self.cfg.read_chunk_bytes:
            # More bytes follow: read on until a newline (or the line cap).
            want = min(size - t.offset, MAX_LINE_BYTES)
            data = os.pread(t.fd, want, t.offset)
            nl = data.find(b"\n")
            if nl >= 0:
                return data[:nl + 1], False
            if len(data) >= MAX_LINE_BYTES:
                self._bad("line_forced")
                return data + b"\n", True
        # A partial last line: wait for its newline, or flush it after partial_flush_ms.
        now = time.monotonic()
        if t.partial_size != len(data) or t.partial_since is None:
            t.partial_size, t.partial_since = len(data), now
            return None, False
        if self.cfg.partial_flush_ms and now - t.partial_since >= self.cfg.partial_flush_ms / 1e3:
            self._bad("partial_line_flushed")
            return data + b"\n", True
        return None, False

    def _hand_over(self, t: Tracked, view, stats: ReadStats, forced: bool) -> tuple[int, bool]:
        buf = np.frombuffer(view, np.uint8)
        read_ms = int(time.time() * 1000)
        chunk = Chunk.from_lines(buf, read_ms)
        self._count_oddities(buf, chunk, t)
        chunk, unparsable = apply_fields(chunk, self.cfg.timestamp_field, self.cfg.key_field,
                                         read_ms)
        if unparsable:
            self._bad("timestamp_unparsable", unparsable)
        res = self.pool.append(self.cfg.topic, chunk, source=t.source_id, source_start=t.offset)
        end = res.end
        if forced and res.complete(chunk):
            end -= 1                      # the newline we added is not in the file
        t.offset += end
        stats.bytes += end
        stats.events += res.records
        self.metrics.inc("agent_source_read_bytes_total", end, topic=self.cfg.topic)
        self.metrics.inc("agent_source_read_events_total", res.records - res.dropped,
                         topic=self.cfg.topic)
        return end, res.complete(chunk)

    def _count_oddities(self, buf: np.ndarray, chunk: Chunk, t: Tracked) -> None:
        n = len(chunk)
        if not n:
            return
        empty = int(np.count_nonzero(chunk.lengths == 0))
        if empty:
            self._bad("empty_line", empty)
        nl = chunk.ends
        crlf = int(np.count_nonzero(buf[np.minimum(nl, len(buf) - 1)] == 13))
        if crlf:
            self._bad("crlf_line", crlf)
        try:
            bytes(buf).decode("utf-8")
        except UnicodeDecodeError:
            bad = 0
            for i in range(n):
                try:
                    chunk.value(i).decode("utf-8")
                except UnicodeDecodeError:
                    bad += 1
            self._bad("invalid_utf8", bad)
        if np.any(buf == 0):
            self._bad("binary_nul", sum(1 for i in range(n) if b"\0" in chunk.value(i)))

    def _truncated(self, t: Tracked) -> None:
        """copytruncate: restart at 0 as a new generation. The bytes seen written but not read
        wait COPY_GRACE_S for a copy to appear, else are journaled."""
        unread = max(0, t.size_seen - t.offset)
        log.info("%s (inode %d) was truncated after %d bytes read (%d seen unread)", t.path,
                 t.ino, t.offset, unread)
        self.metrics.inc("agent_source_rotations_total", kind="truncated", topic=self.cfg.topic)
        # Seal what was read of the old content: the offset a copy resumes from is then sealed.
        self.pool.seal(self.cfg.topic)
        if t.copied_at is None:
            self._truncations.append(_Truncation(t.fingerprint, t.offset, unread, t.path,
                                                 time.monotonic() + COPY_GRACE_S, t.source_id))
        old_state = "truncated" if t.copied_at is None else "copied"   # its copy is known
        t.copied_at = None
        t.offset = 0
        t.fingerprint = os.pread(t.fd, FINGERPRINT_BYTES, 0)
        # The new content is a new generation with its own id: checkpoints only move forward,
        # and the old generation's positions in the pool must not apply to it.
        self.db.update(t.source_id, state=old_state)
        t.source_id = self.db.add_file(self.cfg.index, t.dev, t.ino, t.fingerprint, t.path, 0)

    def _close_finished(self) -> None:
        now = time.monotonic()
        for ident, t in list(self.tracked.items()):
            if t.rotated and t.idle_since is not None and now - t.idle_since >= ROTATED_IDLE_S:
                size = os.fstat(t.fd).st_size
                if size > t.offset:
                    continue                  # grew meanwhile: read on
                os.close(t.fd)
                del self.tracked[ident]
                self.db.update(t.source_id, state="done", size_seen=size)

    def lag(self) -> dict[str, int]:
        return {t.path: max(0, t.size_seen - t.offset) for t in self.tracked.values()}

    def close(self) -> None:
        for t in self.tracked.values():
            os.close(t.fd)
            self.db.update(t.source_id, size_seen=t.size_seen)
        self.tracked.clear()
