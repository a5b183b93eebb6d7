"""The agent's state database (SQLite under ``state_dir``): file checkpoints.

Table ``files``, one row per *generation*: a stream of file content, from its first byte. A file
that is truncated in place (copytruncate) starts a new generation on the same inode; a copy of
old content found later continues the old generation (its row moves to the copy's inode)::

    source_id      INTEGER PRIMARY KEY  — the id the buffer pool records in slot positions
    source_index   which [[sources]] block found it
    dev, ino       the inode holding the content now
    fingerprint    the content's first bytes (up to FINGERPRINT_BYTES); it always covers at
                   least min(sealed_offset, FINGERPRINT_BYTES) bytes: it is stored before the
                   bytes it covers are handed to the pool
    path           where it was last seen
    sealed_offset  bytes of the content that are in sealed slots: tailing resumes here
    acked_offset   bytes Kafka acknowledged (for lag; never ahead of sealed_offset)
    size_seen      the content's size when last looked at (stored at least every second)
    state          see STATES
    tail           for an orphan: the bytes just before where reading stopped (a copy must
                   hold them at the same offset), when known
    orphaned_ms    when the content lost its inode (state orphaned or lost)
    orphan_reason  the loss journal's reason if no copy of it turns up: ``unaccounted_bytes``
                   (truncated in place) or ``deleted_unread`` (gone while the agent was stopped)
    updated_ms
    anchors        offsets the content was sealed to, each with the CRC-32 of the bytes before
                   it, newest last: whether the file still holds what was read below its
                   checkpoint (``agent/tail/anchors.py``)

Table ``identity``, one row: the agent's *incarnation* (created once with the database: its
creation time in ms and a random part) and ``next_record``, the record number the next sealed
record takes (stored with every checkpoint; the pool's header keeps it too, the larger wins).
Record numbers (``docket-seq``) are per (origin, incarnation): an agent whose state was lost
starts a new incarnation at 0, and nothing of the old one is taken for it. ``next_source_id``:
the source id the next row of ``files`` takes; an id is never given twice, not even one whose
row was deleted (``_insert``).

Table ``skipped``: the first bytes (decompressed) of each compressed file skipped without
being a generation's copy (``compressed = "skip"``: archives found at the agent's first start);
with the generations' fingerprints they say whether a compressed file found later holds content
never seen (``knows_content``).

Table ``locate``, one row per run of records sealed from one source (an append)::

    first_record   INTEGER  the first record number of the run
    records        how many (numbered on, consecutive)
    topic
    source_id      the file generation (NULL for a socket source)
    path, ino      where that generation was when the run was sealed
    start, end     the bytes of the source holding exactly those records
    exact          0 when only the slot's span per source is known (a slot found at start
                   whose runs were never stored): then the records of [first_record, +records)
                   lie somewhere in [start, end) of each source listed with the same first_record
    sealed_ms

Rows older than ``agent.locate_retention_ms`` are deleted (``docket-agent locate``).

Checkpoints only move forward, and only once data is sealed (``advance_sealed``) — but for the
start self-check (``agent/state/selfcheck.py``), which moves one back when the pool lost bytes it
counted as sealed.

The producer tier's tallies (``agent/audit_emitter.py``) live here too, written in the
checkpoints' transaction (``advance_sealed``). Table ``audit_windows``, one row per (topic,
window)::

    topic, window_start   PRIMARY KEY
    count, bytes, late, dropped
    checksum              the sum mod 2^64 of the values' hashes, as 16 hex digits
    dropped_reasons       JSON: reason → events dropped
    dropped_unknown       JSON: reason → loss-journal entries of unknown size
    dirty                 1 until a round delivered these figures to the audit topic
    updated_ms            the emitter's clock

Delivered windows older than the emitter's retention are deleted. Table ``audit_meta``, name →
value: ``seq`` (the last emission round's, stored before the round) and ``counted_seq`` (the
pool sequence number of the last slot counted). Emission rounds run in the emitter's thread, on
a connection of their own (``audit_round``).
"""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

from audit.contract.record import checksum_hex

from ..buffer.durable import make_folder, sync_folder
from ..buffer.seams import Clock

FINGERPRINT_BYTES = 1024
LOCK_WAIT_S = 60.0        # how long a write waits for the other connection's (see StateDB)
PAGE_BYTES = 1024         # the page size of a new state database (see StateDB)

# Generation states.
PENDING = "pending"      # a file just found: open, not read until it is known to be new content
#                          (not a copy of content read or awaited); at most seconds
ACTIVE = "active"        # at (dev, ino), found under the globs, tailed
ROTATED = "rotated"      # its inode is no longer under the globs: read to its end through the fd
DONE = "done"            # read to its end and closed; resumed if the content shows up again
ORPHANED = "orphaned"    # its inode no longer holds it (truncated in place, or reused): what was
#                          not read can only come from a copy, awaited for COPY_GRACE
LOST = "lost"            # an orphan no copy was found for: journaled; a late copy still resumes it
GONE = "gone"            # vanished while the agent was stopped: journaled
JOURNAL = "journal"      # not a file: a journald source's entries, numbered as it hands them
#                          over; its anchors are cursors (``agent/tail/journald.py``)
STATES = (PENDING, ACTIVE, ROTATED, DONE, ORPHANED, LOST, GONE, JOURNAL)
# Names written by earlier versions, read as today's.
_LEGACY = {"truncated": ORPHANED, "copied": DONE}

# Table ``files`` as the agent creates it, and the columns added since its first version (a
# database from then gets them at start).
_FILES_COLUMNS = {"source_id": "INTEGER PRIMARY KEY", "source_index": "INTEGER",
                  "dev": "INTEGER", "ino": "INTEGER", "fingerprint": "BLOB", "path": "TEXT",
                  "sealed_offset": "INTEGER", "acked_offset": "INTEGER", "size_seen": "INTEGER",
                  "state": "TEXT", "tail": "BLOB", "orphaned_ms": "INTEGER",
                  "orphan_reason": "TEXT", "updated_ms": "INTEGER", "anchors": "BLOB",
                  "renamed": "INTEGER"}
_NEW_COLUMNS = {name: _FILES_COLUMNS[name]
                for name in ("tail", "orphaned_ms", "orphan_reason", "anchors", "renamed")}


def _set_audit_meta(conn: sqlite3.Connection, name: str, value: int) -> None:
    """One ``audit_meta`` value, rewritten in place: a row replaced whole would rewrite the
    name's index page too, with every checkpoint."""
    conn.execute("INSERT INTO audit_meta VALUES (?, ?) "
                 "ON CONFLICT (name) DO UPDATE SET value = excluded.value", (name, value))


class AuditWindow(NamedTuple):
    """A row of ``audit_windows``: the producer tier's tally of one (topic, window)."""

    topic: str
    window_start: int
    count: int
    bytes: int
    checksum: int                       # mod 2^64
    late: int
    dropped: int
    dropped_reasons: dict[str, int]
    dropped_unknown: dict[str, int]
    updated_ms: int
    dirty: bool = True


class AuditUpdate(NamedTuple):
    """What the tally writes with a checkpoint: the windows that changed, and the sequence
    number of the last slot counted (None: none counted yet)."""

    windows: list[AuditWindow]
    counted_seq: int | None


class StateDB:
    def __init__(self, path: Path, crash_point: Callable[[str], None] | None = None,
                 clock: Clock | None = None):
        make_folder(path.parent)
        self.path = path
        self.created = not path.exists()  # made by this open (a first start, or a lost state)
        self.clock = clock or Clock()
        # The emitter's thread writes with a connection of its own (``AuditRound``); a write
        # that must wait for it waits as long as it would (SQLite's default is 5 s, and a
        # loaded host has taken longer: an agent died of "database is locked").
        self.conn = sqlite3.connect(path, timeout=LOCK_WAIT_S)
        # Pages of 1 KiB, not SQLite's 4 KiB: a slot's checkpoint rewrites about eight pages
        # whole in the write-ahead log, and the checkpoints that sync the log stall the loop
        # in proportion (docs/performance.md). SQLite sets this only for a database not yet
        # written; one created before keeps its pages.
        self.conn.execute(f"PRAGMA page_size={PAGE_BYTES}")
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self._crash_point = crash_point or (lambda name: None)
        have = {row[1] for row in self.conn.execute("PRAGMA table_info(files)")}
        with self.conn:
            if not have:
                columns = ", ".join(f'"{name}" {kind}' for name, kind in _FILES_COLUMNS.items())
                self.conn.execute(f"CREATE TABLE files ({columns})")
            else:
                for name, kind in _NEW_COLUMNS.items():
                    if name not in have:
                        self.conn.execute(f"ALTER TABLE files ADD COLUMN {name} {kind}")
                for old, new in _LEGACY.items():
                    self.conn.execute("UPDATE files SET state = ? WHERE state = ?", (new, old))
            # Either way: SQLite commits each CREATE alone, and a stop between the two would
            # leave the table without its index.
            self.conn.execute('CREATE INDEX IF NOT EXISTS "idx_files_dev_ino" '
                              'ON files ("dev", "ino")')
        with self.conn:
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS identity (id INTEGER PRIMARY KEY CHECK (id = 0), "
                "incarnation TEXT NOT NULL, created_ms INTEGER NOT NULL, "
                "next_record INTEGER NOT NULL, next_source_id INTEGER NOT NULL DEFAULT 0)")
            if "next_source_id" not in {row[1] for row in
                                        self.conn.execute("PRAGMA table_info(identity)")}:
                self.conn.execute("ALTER TABLE identity ADD COLUMN next_source_id INTEGER "
                                  "NOT NULL DEFAULT 0")
            self.conn.execute(
                "CREATE TABLE IF NOT EXISTS locate (first_record INTEGER NOT NULL, "
                "records INTEGER NOT NULL, topic TEXT NOT NULL, source_id INTEGER, path TEXT, "
                "ino INTEGER, start INTEGER, end INTEGER, exact INTEGER NOT NULL, "
                "sealed_ms INTEGER NOT NULL, PRIMARY KEY (first_record, source_id))")
            self.conn.execute("CREATE INDEX IF NOT EXISTS locate_sealed ON locate (sealed_ms)")
            # Made now (a new database, or one of a version before it): the archives under the
            # globs are not known yet (see ``FileSource``'s ``archives_first``).
            self.skipped_new = self.conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'skipped'"
            ).fetchone() is None
            self.conn.execute("CREATE TABLE IF NOT EXISTS skipped (fingerprint BLOB PRIMARY KEY, "
                              "seen_ms INTEGER NOT NULL)")
            if not self.conn.execute("SELECT 1 FROM identity").fetchone():
                now = self.clock.time_ms()
                self.conn.execute("INSERT INTO identity (id, incarnation, created_ms, "
                                  "next_record) VALUES (0, ?, ?, 0)",
                                  (f"{now}-{secrets.token_hex(4)}", now))
        self._create_audit_tables()
        if self.created:                 # the database and its log, by name
            sync_folder(path.parent)

    def _create_audit_tables(self) -> None:
        conn = self.conn
        with conn:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS audit_windows (topic TEXT NOT NULL, "
                "window_start INTEGER NOT NULL, count INTEGER NOT NULL, bytes INTEGER NOT NULL, "
                "checksum TEXT NOT NULL, late INTEGER NOT NULL, dropped INTEGER NOT NULL, "
                "dropped_reasons TEXT NOT NULL, dirty INTEGER NOT NULL, "
                "updated_ms INTEGER NOT NULL, dropped_unknown TEXT NOT NULL DEFAULT '{}', "
                "PRIMARY KEY (topic, window_start))")
            columns = {row[1] for row in conn.execute("PRAGMA table_info(audit_windows)")}
            if "dropped_unknown" not in columns:          # a database of an earlier version
                conn.execute("ALTER TABLE audit_windows ADD COLUMN dropped_unknown TEXT "
                             "NOT NULL DEFAULT '{}'")
            conn.execute("CREATE TABLE IF NOT EXISTS audit_meta (name TEXT PRIMARY KEY, "
                         "value INTEGER NOT NULL)")

    # -- reading ------------------------------------------------------------------------------
    def knows_content(self, head: bytes, but: int | None = None) -> bool:
        """Whether content whose first bytes are ``head`` (up to ``FINGERPRINT_BYTES``) was
        seen before: a generation's fingerprint (any state, any source; not row ``but``'s, the
        file's own) or a skipped compressed file's start is all of ``FINGERPRINT_BYTES`` and
        begins ``head``, or is ``head`` itself (content that short, whole). A shorter one says
        nothing: a header line every file starts with, a file just made."""
        if not head:
            return False
        match = ("(length(fingerprint) >= ?3 AND substr(?1, 1, length(fingerprint)) = "
                 "fingerprint) OR fingerprint = ?1")
        return self.conn.execute(
            f"SELECT 1 FROM files WHERE source_id IS NOT ?2 AND ({match}) UNION ALL "
            f"SELECT 1 FROM skipped WHERE {match} LIMIT 1",
            (head, but, FINGERPRINT_BYTES)).fetchone() is not None

    def add_skipped(self, fingerprint: bytes) -> None:
        """A compressed file skipped as content not to be read (found at the agent's first
        start): its start, so a later look knows it (``knows_content``)."""
        if fingerprint:
            with self.conn:
                self.conn.execute("INSERT OR IGNORE INTO skipped VALUES (?, ?)",
                                  (fingerprint, self.clock.time_ms()))

    def identity(self) -> tuple[str, int]:
        """(incarnation, next_record)."""
        inc, nxt = self.conn.execute("SELECT incarnation, next_record FROM identity").fetchone()
        return inc, nxt

    def locate(self, first: int, last: int) -> list[dict]:
        return self.runs_between(self.conn, first, last)

    @staticmethod
    def runs_between(conn: sqlite3.Connection, first: int, last: int) -> list[dict]:
        """The runs holding any record number in [first, last], in number order (also on a
        read-only connection: ``docket-agent locate``)."""
        cur = conn.execute(
            "SELECT * FROM locate WHERE first_record <= ? AND first_record + records > ? "
            "ORDER BY first_record, source_id", (last, first))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]

    def audit_windows(self) -> list[AuditWindow]:
        """Every tally stored (``audit_windows``)."""
        return [AuditWindow(topic, w, count, nbytes, int(checksum, 16), late, dropped,
                            json.loads(reasons), json.loads(unknown), updated, bool(dirty))
                for topic, w, count, nbytes, checksum, late, dropped, reasons, unknown, dirty,
                updated in self.conn.execute(
                    "SELECT topic, window_start, count, bytes, checksum, late, dropped, "
                    "dropped_reasons, dropped_unknown, dirty, updated_ms FROM audit_windows")]

    def audit_meta(self) -> dict[str, int]:
        """``audit_meta``: ``seq`` and ``counted_seq``, when stored."""
        return dict(self.conn.execute("SELECT name, value FROM audit_meta"))

    def audit_round(self) -> AuditRound:
        """A connection of its own for one emission round (the emitter's thread)."""
        return AuditRound(self.path)

    def _files(self, where: str = "", params: Iterable = ()) -> list[dict]:
        """Rows of ``files`` as dicts, by ``source_id``."""
        cur = self.conn.execute(f"SELECT * FROM files {where} ORDER BY source_id", list(params))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row, strict=True)) for row in cur]

    def all_files(self) -> list[dict]:
        return self._files()

    def rows(self, source_index: int, states: Iterable[str]) -> list[dict]:
        states = list(states)
        marks = ", ".join("?" * len(states))
        return self._files(f"WHERE source_index = ? AND state IN ({marks})",
                           [source_index, *states])

    def rows_at(self, source_index: int, dev: int, ino: int) -> list[dict]:
        """The generations recorded on one inode, oldest first."""
        return self._files("WHERE source_index = ? AND dev = ? AND ino = ?",
                           [source_index, dev, ino])

    def get(self, source_id: int) -> dict:
        rows = self._files("WHERE source_id = ?", [source_id])
        if not rows:
            raise KeyError(f"no file generation {source_id} in {self.path}")
        return rows[0]

    # -- writing ------------------------------------------------------------------------------
    def add_file(self, source_index: int, dev: int, ino: int, fingerprint: bytes, path: str,
                 start_offset: int = 0, size_seen: int = 0, state: str = ACTIVE,
                 anchors: bytes | None = None) -> int:
        """A new row; ``anchors`` written with it (a journald source's first cursor: a row
        without it would be read from the journal's start)."""
        self._crash_point("db:add_file")
        with self.conn:
            sid = self._insert(source_index, dev, ino, fingerprint, path, start_offset,
                               size_seen, state)
            if anchors is not None:
                self.conn.execute("UPDATE files SET anchors = ? WHERE source_id = ?",
                                  (anchors, sid))
            return sid

    def _insert(self, source_index, dev, ino, fingerprint, path, start_offset, size_seen,
                state=ACTIVE) -> int:
        """A new row under a source id never given before: SQLite would give the highest id
        plus one, so a row deleted while the agent still holds its file (a skipped compressed
        file) would lend its id to the next file, and what the agent then writes for the one
        would land on the other's row."""
        (source_id,) = self.conn.execute(
            "SELECT MAX(next_source_id, (SELECT IFNULL(MAX(source_id), 0) + 1 FROM files)) "
            "FROM identity").fetchone()
        self.conn.execute("UPDATE identity SET next_source_id = ?", (source_id + 1,))
        self.conn.execute(
            "INSERT INTO files (source_id, source_index, dev, ino, fingerprint, path, "
            "sealed_offset, acked_offset, size_seen, state, updated_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (source_id, source_index, dev, ino, fingerprint, path, start_offset, start_offset,
             size_seen, state, self.clock.time_ms()))
        return source_id

    def update(self, source_id: int, **fields) -> None:
        self._crash_point("db:update")
        fields["updated_ms"] = self.clock.time_ms()
        names = ", ".join(f"{k} = ?" for k in fields)
        with self.conn:
            self.conn.execute(f"UPDATE files SET {names} WHERE source_id = ?",
                              [*fields.values(), source_id])

    def orphan(self, source_id: int, size_seen: int, tail: bytes | None, reason: str,
               successor: dict | None = None, now_ms: int | None = None) -> int | None:
        """Mark a generation orphaned at ``now_ms`` (the agent's clock: its age decides how
        long a copy is still matched) and, in the same transaction, start the generation that
        now occupies its inode (``successor``: source_index, dev, ino, fingerprint, path,
        size_seen). Returns the successor's source_id."""
        self._crash_point("db:orphan")
        now = self.clock.time_ms() if now_ms is None else now_ms
        with self.conn:
            self.conn.execute(
                "UPDATE files SET state = ?, size_seen = MAX(size_seen, ?), tail = ?, "
                "orphaned_ms = ?, orphan_reason = ?, updated_ms = ? WHERE source_id = ?",
                (ORPHANED, size_seen, tail, now, reason, now, source_id))
            if successor is None:
                return None
            s = successor
            return self._insert(s["source_index"], s["dev"], s["ino"], s["fingerprint"],
                                s["path"], 0, s["size_seen"])

    def relocate(self, source_id: int, dev: int, ino: int, path: str, size_seen: int,
                 fingerprint: bytes, replaces: int | None) -> None:
        """A copy of an orphan was found: the orphan's generation now lives on the copy's
        inode, and the copy's own pending row goes, in one transaction."""
        self._crash_point("db:relocate")
        with self.conn:
            self.conn.execute(
                "UPDATE files SET dev = ?, ino = ?, path = ?, state = ?, size_seen = ?, "
                "fingerprint = ?, tail = NULL, orphaned_ms = NULL, orphan_reason = NULL, "
                "updated_ms = ? WHERE source_id = ?",
                (dev, ino, path, ACTIVE, size_seen, fingerprint, self.clock.time_ms(),
                 source_id))
            if replaces is not None:
                self.conn.execute("DELETE FROM files WHERE source_id = ?", (replaces,))

    def start(self, source_id: int, state: str, offset: int, fingerprint: bytes, path: str,
              size_seen: int, anchors: bytes | None = None) -> None:
        """A pending file is decided: tailed from ``offset`` (0, or its end for a plain copy
        of content read elsewhere), with ``anchors`` if given (``agent/tail/anchors.py``)."""
        self._crash_point("db:start")
        with self.conn:
            self.conn.execute(
                "UPDATE files SET state = ?, sealed_offset = MAX(sealed_offset, ?), "
                "acked_offset = MAX(acked_offset, ?), fingerprint = ?, path = ?, "
                "size_seen = ?, updated_ms = ?, anchors = COALESCE(?, anchors) "
                "WHERE source_id = ?",
                (state, offset, offset, fingerprint, path, size_seen, self.clock.time_ms(),
                 anchors, source_id))

    def keep_source_ids_above(self, source_ids: Iterable[int]) -> None:
        """No new row takes any of ``source_ids`` (the pool's slots name them: a power cut
        may have taken a row whose slots survived, and its id would be given again)."""
        top = max(source_ids, default=0)
        with self.conn:
            self.conn.execute("UPDATE identity SET next_source_id = MAX(next_source_id, ?)",
                              (top + 1,))

    def adopt(self, row_id: int, source_id: int) -> None:
        """Row ``row_id`` takes ``source_id``, an id no row has: the pool's slots of that id
        are its file's lines (``FileSource._pool_source_of``). What it had seen is what they
        read: the size the new row noted at this start may hold lines written since the cut,
        which a cut back would journal as seen and never read."""
        with self.conn:
            self.conn.execute("UPDATE files SET source_id = ?, size_seen = 0 WHERE "
                              "source_id = ?", (source_id, row_id))

    def has(self, source_id: int) -> bool:
        return self.conn.execute("SELECT 1 FROM files WHERE source_id = ?",
                                 (source_id,)).fetchone() is not None

    def rewind(self, source_id: int, offset: int, state: str) -> None:
        """Move a sealed checkpoint *back* (the start self-check, ``agent/state/selfcheck.py``):
        the only way it ever moves back."""
        with self.conn:
            self.conn.execute(
                "UPDATE files SET sealed_offset = ?, acked_offset = MIN(acked_offset, ?), "
                "state = ?, updated_ms = ? WHERE source_id = ?",
                (offset, offset, state, self.clock.time_ms(), source_id))

    def delete(self, source_id: int) -> None:
        self._crash_point("db:delete")
        with self.conn:
            self.conn.execute("DELETE FROM files WHERE source_id = ?", (source_id,))

    def set_sizes(self, sizes: dict[int, int]) -> None:
        if not sizes:
            return
        self._crash_point("db:set_sizes")
        now = self.clock.time_ms()
        with self.conn:
            self.conn.executemany(
                "UPDATE files SET size_seen = ?, updated_ms = ? WHERE source_id = ?",
                [(size, now, sid) for sid, size in sizes.items()])

    def advance_sealed(self, positions: dict[int, int],
                       audit: Callable[[], AuditUpdate | None] | None = None,
                       next_record: int | None = None, runs: list[tuple] = (),
                       anchors: dict[int, bytes] | None = None) -> None:
        """Move sealed checkpoints forward (never back) in one transaction, with the next
        record number, the locate rows of the runs sealed (first_record, records, topic,
        source_id, start, end, exact), the generations' anchors (``agent/tail/anchors.py``)
        and the tallies ``audit`` gives, called inside the transaction (the audit counts of
        the slots these positions were sealed in)."""
        def write(conn: sqlite3.Connection) -> None:
            if anchors:
                conn.executemany("UPDATE files SET anchors = ? WHERE source_id = ?",
                                 [(blob, sid) for sid, blob in anchors.items()])
            if next_record is not None:
                conn.execute("UPDATE identity SET next_record = MAX(next_record, ?)",
                             (next_record,))
            if runs:
                self._add_runs(conn, runs)
            if audit is not None:
                update = audit()
                if update is not None:
                    self._write_audit(conn, update)
        self._advance("sealed_offset = MAX(sealed_offset, ?)", positions, write)

    @staticmethod
    def _write_audit(conn: sqlite3.Connection, update: AuditUpdate) -> None:
        conn.executemany(
            "INSERT INTO audit_windows (topic, window_start, count, bytes, checksum, late, "
            "dropped, dropped_reasons, dropped_unknown, dirty, updated_ms) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (topic, window_start) DO UPDATE SET count = excluded.count, "
            "bytes = excluded.bytes, checksum = excluded.checksum, late = excluded.late, "
            "dropped = excluded.dropped, dropped_reasons = excluded.dropped_reasons, "
            "dropped_unknown = excluded.dropped_unknown, dirty = excluded.dirty, "
            "updated_ms = excluded.updated_ms",
            [(w.topic, w.window_start, w.count, w.bytes, checksum_hex(w.checksum), w.late,
              w.dropped,
              json.dumps(w.dropped_reasons, sort_keys=True),
              json.dumps(w.dropped_unknown, sort_keys=True), int(w.dirty), w.updated_ms)
             for w in update.windows])
        if update.counted_seq is not None:
            _set_audit_meta(conn, "counted_seq", update.counted_seq)

    def _add_runs(self, conn: sqlite3.Connection, runs: list[tuple]) -> None:
        ids = {r[3] for r in runs if r[3] is not None}
        where = {}
        if ids:
            marks = ", ".join("?" * len(ids))
            where = {sid: (path, ino) for sid, path, ino in conn.execute(
                f"SELECT source_id, path, ino FROM files WHERE source_id IN ({marks})",
                list(ids))}
        now = self.clock.time_ms()
        conn.executemany(
            "INSERT OR IGNORE INTO locate VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(first, n, topic, sid, *where.get(sid, (None, None)), start, end, int(exact), now)
             for first, n, topic, sid, start, end, exact in runs])

    def add_inexact_runs(self, runs: list[tuple]) -> None:
        """Runs of slots found at start, unless the runs of their numbers are stored."""
        keep = [r for r in runs if not self.conn.execute(
            "SELECT 1 FROM locate WHERE first_record = ? AND exact = 1", (r[0],)).fetchone()]
        if keep:
            with self.conn:
                self._add_runs(self.conn, keep)

    def forget_runs(self, retention_ms: int) -> int:
        """Delete the locate rows sealed more than ``retention_ms`` ago (wall clock, as
        ``sealed_ms``)."""
        with self.conn:
            return self.conn.execute("DELETE FROM locate WHERE sealed_ms < ?",
                                     (self.clock.time_ms() - retention_ms,)).rowcount

    def touch(self) -> None:
        """A one-row write (the next record number, unchanged): whether writes pass again
        after one was refused for lack of space (``agent/state/diskguard.py``)."""
        with self.conn:
            self.conn.execute("UPDATE identity SET next_record = next_record")

    def advance_acked(self, positions: dict[int, int]) -> None:
        """Move acknowledged offsets forward, never past what is sealed."""
        self._advance("acked_offset = MIN(sealed_offset, MAX(acked_offset, ?))", positions)

    def _advance(self, assignment: str, positions: dict[int, int],
                 also: Callable[[sqlite3.Connection], None] | None = None) -> None:
        if not positions and also is None:
            return
        self._crash_point("db:advance")
        now = self.clock.time_ms()
        with self.conn:
            if positions:
                self.conn.executemany(
                    f"UPDATE files SET {assignment}, updated_ms = ? WHERE source_id = ?",
                    [(end, now, sid) for sid, end in positions.items()],
                )
            if also is not None:
                also(self.conn)

    def sync_log(self) -> None:
        """Make every transaction committed so far durable. With ``synchronous = NORMAL`` a
        commit reaches the write-ahead log, and the disk only at the next checkpoint; an
        ``fsync`` of the log makes it durable (the pool's frees wait for this:
        ``BufferPool.free``)."""
        try:
            fd = os.open(self.path.with_name(self.path.name + "-wal"), os.O_RDONLY)
        except FileNotFoundError:
            return                        # no log: every commit is in the database file
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self) -> None:
        self.conn.close()


class AuditRound:
    """The state database as one emission round of the audit emitter sees it: a connection
    of its own, opened and used in the emitter's thread (the main connection stays in the main
    thread), closed at the end of the round."""

    def __init__(self, path: Path):
        self.conn = sqlite3.connect(path, timeout=LOCK_WAIT_S)

    def __enter__(self) -> AuditRound:
        return self

    def __exit__(self, *_exc) -> None:
        self.conn.close()

    def save_seq(self, seq: int) -> None:
        """Store the round's ``seq`` before its records are sent: it only grows."""
        with self.conn:
            _set_audit_meta(self.conn, "seq", seq)

    def settle(self, delivered: Iterable[tuple[str, int, int, int, int]],
               forget_before_ms: int) -> None:
        """In one transaction: clear the mark of each window delivered (topic, window_start,
        checksum, count, dropped) unless its figures changed since, and delete the delivered
        windows that start before ``forget_before_ms``."""
        with self.conn:
            self.conn.executemany(
                "UPDATE audit_windows SET dirty = 0 WHERE topic = ? AND window_start = ? AND "
                "checksum = ? AND count = ? AND dropped = ?",
                [(topic, w, checksum_hex(checksum), count, dropped)
                 for topic, w, checksum, count, dropped in delivered])
            self.conn.execute("DELETE FROM audit_windows WHERE dirty = 0 AND window_start < ?",
                              (forget_before_ms,))
