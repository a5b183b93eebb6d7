"""A damaged state folder: what the agent finds at start, and the pool file under a running agent.

At start, before anything is opened (``examine``):

- **The state database unreadable as a database** (not SQLite, or failing ``PRAGMA
  quick_check``): moved aside as ``state.db.damaged-<ms>`` (with its ``-wal`` and ``-shm``), and
  the agent goes on as below. One it may not open (permissions) is refused:
  ``StateFolderRefused``, exit 78, so systemd does not restart it in a loop.
- **The state database missing** where the agent ran before (the loss journal is there): a new
  database, so a new incarnation (``agent/state.py``); every file under the globs is read again
  from its start — events already delivered arrive again (duplicates, never a loss) — and what
  came and went while the database was missing (files rotated away and deleted) cannot be
  known.
- **The pool file damaged** (cut short, its header failing its CRC: ``PoolDamaged``): moved
  aside as ``buffer.pool.damaged-<ms>`` (``docket-agent pool inspect`` reads it); a new pool is
  created, and the start self-check (``agent/selfcheck.py``) reads again from the files the
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

from .errors import StartupError

log = logging.getLogger("docket.agent.statefolder")

STATE_LOST = "state_lost"
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
    return target


def examine_state_db(db_path: Path, journal_path: Path, now_ms: int) -> Finding | None:
    """Before the state database is opened: move a damaged one aside; say when it is missing
    where the agent ran before. Raises StateFolderRefused when it may not be opened."""
    if not db_path.exists():
        if journal_path.exists():
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


def _damage(db_path: Path) -> str | None:
    """What is wrong with the SQLite file at ``db_path``, or None."""
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        return str(exc)
    try:
        result = conn.execute("PRAGMA quick_check").fetchone()[0]
        return None if result == "ok" else f"quick_check: {result}"
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        conn.close()


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
        if (now.st_dev, now.st_ino) != self._ident:
            return "replaced"
        return "deleted" if st.st_nlink == 0 else None

    def close(self) -> None:
        os.close(self._fd)
