"""A damaged state folder: what the agent finds at start, and the pool file under a running agent.

At start, before anything is opened (``examine``):

- **The state database unreadable as a database** (not SQLite, or failing ``PRAGMA
  quick_check``): moved aside as ``state.db.damaged-<ms>`` (with its ``-wal`` and ``-shm``), and
  the agent goes on as below. One it may not open (permissions) is refused:
  ``StateFolderRefused``, exit 78, so systemd does not restart it in a loop.
- **The state database missing** where the agent ran before (the loss journal is there): a new
  database, so a new incarnation (``agent/state/db.py``); every file under the globs is read again
  from its start — events already delivered arrive again (duplicates, never a loss) — and what
  came and went while the database was missing (files rotated away and deleted) cannot be
  known.
  A pool file beside a lost database is moved aside too (``buffer.pool.damaged-<ms>``): its
  slots name files by the lost database's ids, which the new database gives to other files.
- **The pool file damaged** (cut short, its header failing its CRC: ``PoolDamaged``): moved
  aside as ``buffer.pool.damaged-<ms>`` (``docket-agent pool inspect`` reads it); a new pool is
  created, and the start self-check (``agent/state/selfcheck.py``) reads again from the files the
  bytes the old pool held unacknowledged. Records of a socket source it held are lost.

Each such finding is logged at ERROR and journalled (``LossJournal``) as a loss of unknown size
(``events = -1``, reason ``state_lost`` or ``pool_damaged``) for every configured topic: the
agent can no longer vouch for what the damaged part held, and the audit shows the windows as
possibly incomplete (``dropped_unknown``) instead of silently complete.

While running (``PoolWatch``): the pool file deleted or replaced under the agent (its open file
has no link any more, or the path names another file) → the agent stops as on SIGTERM (seal,
send what it can within ``shutdown_timeout_ms``, checkpoints) and exits 1, so systemd starts it
again with a new pool; the pool file cut short → the agent stops at once without touching the
pool again (a page past the file's end would kill it with SIGBUS) and exits 1; the next start
finds it damaged (above). The kernel kills a process that touches a mapped page past the end of
its file, so a cut made between two looks can still kill the agent: the next start is the same.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ..buffer.durable import sync_folder
from ..errors import StartupError

log = logging.getLogger("docket.agent.statefolder")

STATE_LOST = "state_lost"
LOCK_WAIT_S = 5.0          # a database another process holds this long is not damaged: refused
POOL_DAMAGED = "pool_damaged"


class StateFolderRefused(StartupError):
    """The state folder holds something the agent may not touch: a restart cannot help
    (exit 78: systemd's ``RestartPreventExitStatus``)."""


@dataclass
class Finding:
    """Something of the state folder the agent could not keep; journalled once it is open."""
    reason: str            # STATE_LOST or POOL_DAMAGED
    detail: str


def move_aside(path: Path, now_ms: int) -> Path:
    """Rename ``path`` (and SQLite's ``-wal``/``-shm`` beside it) to ``<name>.damaged-<ms>``."""
    target = path.with_name(f"{path.name}.damaged-{now_ms}")
    os.replace(path, target)
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            os.replace(side, target.with_name(target.name + suffix))
    sync_folder(path.parent)          # moved aside for good: a power loss must not undo it
    return target


def examine_state_db(db_path: Path, journal_path: Path, now_ms: int) -> Finding | None:
    """Before the state database is opened: move a damaged one aside; say when it is missing
    (or empty) where the agent ran before. Raises StateFolderRefused when it may not be opened,
    StartupError when it cannot be read now for another reason (locked, an I/O error: a
    restart may do; a healthy database is never moved aside for it)."""
    ran_before = journal_path.exists()
    if db_path.exists() and db_path.stat().st_size == 0 and ran_before:
        db_path.unlink()                    # an empty file: as good as missing
    if not db_path.exists():
        if ran_before:
            log.error("the state database %s is missing, but the agent ran in this state folder "
                      "before (%s is there): where each file was read up to is lost; a new "
                      "incarnation starts and every file is read again from its start (events "
                      "delivered before arrive again)", db_path, journal_path.name)
            return Finding(STATE_LOST, f"state database {db_path} missing at start; files "
                                       "read again from their start")
        return None
    if not os.access(db_path, os.R_OK | os.W_OK):
        raise StateFolderRefused(
            f"the state database {db_path} cannot be read and written by this user",
            hint="give the agent's user (docket) the state folder back: chown -R docket: "
            f"{db_path.parent}")
    problem = _damage(db_path)
    if problem is None:
        return None
    moved = move_aside(db_path, now_ms)
    log.error("the state database %s is damaged (%s): moved to %s; a new incarnation starts "
              "and every file is read again from its start (events delivered before arrive "
              "again)", db_path, problem, moved)
    return Finding(STATE_LOST, f"state database {db_path} damaged ({problem}), moved to "
                               f"{moved}; files read again from their start")


# What SQLite says of a file that is not a database (any more): only these move it aside.
SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26


def _damage(db_path: Path) -> str | None:
    """What is wrong with the SQLite file at ``db_path`` (not a database, corrupt, failing
    ``quick_check``), or None. Raises StartupError for any other error (locked, I/O)."""
    try:
        conn = sqlite3.connect(db_path.as_uri() + "?mode=ro", uri=True, timeout=LOCK_WAIT_S)
        try:
            result = conn.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            conn.close()
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", None) in (SQLITE_CORRUPT, SQLITE_NOTADB) or \
                isinstance(exc, sqlite3.DatabaseError) and (
                    "not a database" in str(exc) or "malformed" in str(exc)):
            return str(exc)
        raise StartupError(f"cannot read the state database {db_path}: {exc}",
                           hint="another process may hold it, or the disk failed; the agent "
                           "moved nothing: it tries again when started again") from exc
    return None if result == "ok" else f"quick_check: {result}"


def pool_of_lost_state(pool_path: Path, finding: Finding, now_ms: int) -> None:
    """The state database was lost (``finding``): a pool file beside it is moved aside too. Its
    slots name files by the lost database's ids, which the new one gives again to other files:
    kept, they would move the new files' checkpoints. The files are read again from their
    start anyway; records of a socket source it held are lost (the finding says so)."""
    if not pool_path.exists() or pool_path.stat().st_size == 0:
        return
    moved = move_aside(pool_path, now_ms)
    log.error("the buffer pool %s belongs to the lost state database: moved to %s (its slots' "
              "files are read again from their start)", pool_path, moved)
    finding.detail += f"; the buffer pool moved to {moved} (records of socket sources in it lost)"


def pool_damaged(pool_path: Path, exc: Exception, now_ms: int) -> Finding:
    """The pool at ``pool_path`` failed its checks as damaged (``PoolDamaged``): moved aside."""
    moved = move_aside(pool_path, now_ms)
    log.error("the buffer pool %s is damaged (%s): moved to %s; a new pool is created and the "
              "bytes it held unacknowledged are read again from their files", pool_path, exc,
              moved)
    return Finding(POOL_DAMAGED, f"buffer pool damaged ({exc}), moved to {moved}")


class PoolWatch:
    """Looks at the pool file under the running agent: ``check`` returns None, or what
    happened to it (``"deleted"``, ``"replaced"``, ``"truncated"``)."""

    def __init__(self, path: Path, file_bytes: int):
        self.path = path
        self.file_bytes = file_bytes
        self._fd = os.open(path, os.O_RDONLY)
        st = os.fstat(self._fd)
        self._ident = (st.st_dev, st.st_ino)

    def check(self) -> str | None:
        st = os.fstat(self._fd)
        if st.st_size < self.file_bytes:
            return "truncated"
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return "deleted"
        except OSError:
            return None                     # cannot look now (permissions, a stale mount)
        if (now.st_dev, now.st_ino) != self._ident:
            return "replaced"
        return "deleted" if st.st_nlink == 0 else None

    def close(self) -> None:
        os.close(self._fd)
