"""The agent's state database (SQLite under ``state_dir``): file checkpoints.

Table ``files``, one row per file identity the agent has read::

    source_id      INTEGER PRIMARY KEY  — the id the buffer pool records in slot positions
    source_index   which [[sources]] block found it
    dev, ino       identity on disk (with the fingerprint, to tell a reused inode apart)
    fingerprint    the file's first bytes (up to FINGERPRINT_BYTES)
    path           where it was last seen
    sealed_offset  bytes of the file that are in sealed slots: tailing resumes here
    acked_offset   bytes of the file Kafka acknowledged (for lag; never ahead of sealed_offset)
    size_seen      the file's size when last looked at
    state          active | rotated | done | gone | truncated (an old generation of a file
                   that was truncated) | copied (that generation's copy was found)
    updated_ms

Checkpoints only move forward, and only once data is sealed (``advance_sealed``). The audit
emitter keeps its tables (``audit_windows``, ``audit_meta``) in the same database and writes them
in the checkpoints' transaction (agent/audit.py).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import sqlite_utils

FINGERPRINT_BYTES = 1024


class StateDB:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite_utils.Database(path)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.files = self.db["files"]
        if not self.files.exists():
            self.files.create({
                "source_id": int, "source_index": int, "dev": int, "ino": int,
                "fingerprint": bytes, "path": str, "sealed_offset": int, "acked_offset": int,
                "size_seen": int, "state": str, "updated_ms": int,
            }, pk="source_id")
            self.files.create_index(["dev", "ino"])

    def all_files(self) -> list[dict]:
        return list(self.files.rows)

    def add_file(self, source_index: int, dev: int, ino: int, fingerprint: bytes, path: str,
                 start_offset: int = 0) -> int:
        row = {"source_index": source_index, "dev": dev, "ino": ino, "fingerprint": fingerprint,
               "path": path, "sealed_offset": start_offset, "acked_offset": start_offset,
               "size_seen": 0, "state": "active", "updated_ms": _now_ms()}
        return self.files.insert(row).last_pk

    def update(self, source_id: int, **fields) -> None:
        fields["updated_ms"] = _now_ms()
        self.files.update(source_id, fields)

    def advance_sealed(self, positions: dict[int, int],
                       also: Callable[[sqlite3.Connection], None] | None = None) -> None:
        """Move sealed checkpoints forward (never back) in one transaction; ``also`` writes
        in the same transaction (the audit counts of the slots these positions were sealed in)."""
        self._advance("sealed_offset = MAX(sealed_offset, ?)", positions, also)

    def advance_acked(self, positions: dict[int, int]) -> None:
        """Move acknowledged offsets forward, never past what is sealed."""
        self._advance("acked_offset = MIN(sealed_offset, MAX(acked_offset, ?))", positions)

    def _advance(self, assignment: str, positions: dict[int, int],
                 also: Callable[[sqlite3.Connection], None] | None = None) -> None:
        if not positions and also is None:
            return
        now = _now_ms()
        with self.db.conn:
            if positions:
                self.db.conn.executemany(
                    f"UPDATE files SET {assignment}, updated_ms = ? WHERE source_id = ?",
                    [(end, now, sid) for sid, end in positions.items()],
                )
            if also is not None:
                also(self.db.conn)

    def close(self) -> None:
        self.db.conn.close()


def _now_ms() -> int:
    return int(time.time() * 1000)
