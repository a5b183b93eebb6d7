"""Free space on the state folder's file system: the agent reads only what it can keep.

The pool file is preallocated (``fallocate``), so appending to it never runs out of space. What
does write as the agent reads is the state database (checkpoints, the record-number map, the
producer tier's counts) and the loss journal. When the file system holding the state folder has
less than ``agent.disk_reserve_bytes`` free — or a write was refused for lack of space — the
agent stops reading (files stay where they are, unread: backpressure, as with a full pool), keeps
sending and acknowledging what the pool holds, and looks again every ``CHECK_EVERY_S``. Reading
resumes once a write succeeds again and the reserve is free. The reserve is what the writes of
sending need meanwhile (acknowledged offsets, the checkpoints of slots already sealed, audit
rounds); a write refused anyway is kept in memory and written later (``Checkpoints``,
``LossJournal``): SQLite rolls the refused transaction back whole, the journal cuts a line it
could not finish, so neither is left torn.

``disk_full(exc)`` says whether an error is one of these: SQLite's ``SQLITE_FULL`` ("database or
disk is full") and the write errors its unix layer reports for a quota or a failed write, sync
or shared-memory growth (``SQLITE_IOERR_WRITE``, ``_FSYNC``, ``_SHMSIZE``: the errno is not
kept), or ``ENOSPC``/``EDQUOT`` from the system. Pausing and trying again is right for each.

Reading resumes only once the free space is ``RESUME_MARGIN`` above the reserve (an eighth of
it, at least 1 MiB), so free space hovering at the reserve does not turn reading on and off
every half second. While a refused write waits, ``Checkpoints`` tries a one-row write when a
try is due (``probe``), so reading resumes within ``CHECK_EVERY_S`` of the space coming back
even when nothing else is to be written.
"""

from __future__ import annotations

import errno
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("docket.agent.disk")

CHECK_EVERY_S = 0.5
SQLITE_FULL = 13
SQLITE_IOERR_WRITE, SQLITE_IOERR_FSYNC, SQLITE_IOERR_SHMSIZE = 778, 1034, 4874


def disk_full(exc: BaseException) -> bool:
    """True for an error that means "no space left" (or "over quota", or a write the disk
    refused)."""
    if isinstance(exc, sqlite3.Error):
        return (getattr(exc, "sqlite_errorcode", None) in (
            SQLITE_FULL, SQLITE_IOERR_WRITE, SQLITE_IOERR_FSYNC, SQLITE_IOERR_SHMSIZE)
            or "database or disk is full" in str(exc))
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def resume_margin(reserve_bytes: int) -> int:
    """How far above the reserve the free space must be for reading to resume."""
    return max(reserve_bytes // 8, 1 << 20) if reserve_bytes else 0


class DiskGuard:
    """Whether the agent may read: ``full`` is False while the state folder's file system has
    ``reserve_bytes`` free and no write was refused since the last successful one."""

    def __init__(self, folder: Path, reserve_bytes: int, now: Callable[[], float],
                 on_change: Callable[[bool], None] | None = None):
        self.folder = folder
        self.reserve_bytes = reserve_bytes
        self.now = now
        self.on_change = on_change
        self.full = False
        self.free_bytes: int | None = None
        self.since: float | None = None      # monotonic s: full since
        self.reason = ""
        self._refused = False                # a write was refused: full until one succeeds
        self._next_check = 0.0
        self._retry_at = 0.0                 # monotonic s: the next write worth trying
        self._lock = threading.Lock()

    def check(self) -> bool:
        """Look at the free space when due; True while reading must wait."""
        now = self.now()
        if now < self._next_check:
            return self.full
        self._next_check = now + CHECK_EVERY_S
        try:
            st = os.statvfs(self.folder)
            self.free_bytes = st.f_bavail * st.f_frsize
        except OSError as exc:
            log.warning("cannot look at the free space of %s: %s", self.folder, exc.strerror)
            return self.full
        with self._lock:
            if self.free_bytes < self.reserve_bytes:
                self._set(True, f"{self.free_bytes} bytes free on the state folder's file "
                                f"system, below agent.disk_reserve_bytes = {self.reserve_bytes}")
            elif not self._refused and (
                    not self.full or
                    self.free_bytes >= self.reserve_bytes + resume_margin(self.reserve_bytes)):
                self._set(False, "")
            return self.full

    def refused(self, exc: BaseException, what: str) -> None:
        """A write (``what``) was refused for lack of space: reading waits until one succeeds."""
        with self._lock:            # the journal's writers may be other threads
            self._refused = True
            self._next_check = 0.0
            self._retry_at = self.now() + CHECK_EVERY_S
            self._set(True, f"{what} refused: {exc}")

    @property
    def refusing(self) -> bool:
        """A write was refused and none has passed since."""
        return self._refused

    def write_due(self) -> bool:
        """False for a moment after a refused write: the next try waits ``CHECK_EVERY_S``
        (every turn of the loop would try in vain)."""
        return not self._refused or self.now() >= self._retry_at

    def written(self) -> None:
        """A write that had been refused went through: the space check alone decides again."""
        with self._lock:
            if self._refused:
                self._refused = False
                self._next_check = 0.0

    def _set(self, full: bool, reason: str) -> None:
        if full == self.full:
            if full:
                self.reason = reason
            return
        self.full, self.reason = full, reason
        self.since = self.now() if full else None
        if full:
            log.error("disk full: %s; reading paused (files stay unread), sending what the "
                      "pool holds; resuming when %d bytes are free", reason, self.reserve_bytes)
        else:
            log.info("disk space back (%s bytes free): reading resumed", self.free_bytes)
        if self.on_change is not None:
            self.on_change(full)

    def describe(self) -> dict:
        """The status document's ``disk``."""
        return {"state": "full" if self.full else "ok", "free_bytes": self.free_bytes,
                "reserve_bytes": self.reserve_bytes, "reason": self.reason or None}
