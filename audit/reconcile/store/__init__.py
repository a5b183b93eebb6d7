"""The reconciler's SQLite database, through sqlite-utils: the audit records it applied, the
offsets it applied them up to, and the verdicts and alerts it derived. docs/reconcile.md
documents every table; anyone with ``sqlite3`` reads them. The one gateway to it: the
reconciler's other modules and the dashboard ask ``Store``'s methods and send no SQL of their
own (``tests/unit/test_store_gateway.py``; ``audit/reconcile/figures.py``, a process of its own
that must import no more than the standard library, runs this module's ``PLAIN_QUERY``).

- this module: ``Store``, the schema, applying audit records, the verdicts written.
- ``reads``: what the metrics, ``docket-audit show`` and ``watermark`` and the dashboard ask
  (a mixin of ``Store``).
- ``alerts``: the alert lifecycle's statements on ``alerts`` and ``snoozes`` (a mixin too).
- ``deliveries``: the alert outbox's two tables and its statements (on the dispatcher's own
  connection).

Applying a batch of audit records is one transaction: the records (the newest per identity
wins: highest ``seq``, then latest ``emitted_at``, so the order of arrival does not matter) and
the next offset of each partition they came from. The reconciler resumes from the stored
offsets, so a crash between the transaction and the consumer's commit re-applies nothing new,
and replaying the topic from its start rebuilds the same ``counts``, ``ranges`` and
``progress`` tables.

Input tables: ``counts``, ``ranges``, ``progress``, ``caught_up`` (how far each tier's jobs
have read, in positions), ``caught_up_unvouched`` (the marks a mirror's watcher has not yet
vouched for, ``Store.caught_up``), ``producers`` (when each origin was last heard of, and how
far its clock is off the broker's), ``malformed`` (skipped records by reason), ``offsets``,
``dirty`` (windows changed since their last evaluation: ``apply`` marks them),
``topic_tiers`` (the tiers that reported on each topic). Derived: ``windows`` (one row per
topic, window and tier: state, completeness, ...), ``window_origins`` (the same per origin),
``window_revisions`` (changes after a window was final), ``alerts``, ``snoozes``, and the view
``completeness``.

Every record is kept with the time it *arrived* (``arrived_at``): the broker's append time
when the audit topic stamps it (``LogAppendTime``), else this reconciler's clock when it read
it. Audit lag and silence are measured against arrivals, never against the ``emitted_at`` a
sender's clock wrote.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import fields
from functools import reduce
from operator import itemgetter
from pathlib import Path
from typing import NamedTuple

import sqlite_utils

from audit.contract.errors import AuditError
from audit.contract.record import (
    MIRROR_TIER,
    PRODUCER_TIER,
    AuditRecord,
    CaughtUp,
    Progress,
    Ranges,
    Record,
    checksum_hex,
    newer_sql,
)

from ..figures import PLAIN_QUERY, read_only
from ..verdict import MATCH, UNKNOWN, UNKNOWN_FINAL_MS, Mark, TierVerdict
from .alerts import AlertTables
from .deliveries import ensure_tables
from .reads import StoreReads

_NO_NUMBER = (1 << 63) - 1      # above every record number: "and all those after"
# A progress record's arrival; rows of layout 4 have none: their sender's time stands in.
_ARRIVED = "coalesce(arrived_at, emitted_at)"

log = logging.getLogger("docket.audit.reconcile")

# ``counts`` and ``windows`` are clustered by their keys (layout 4): a window's 9 count rows lie
# together, and so do a topic's verdict rows, in the order they are written.
_COUNTS = """
CREATE TABLE IF NOT EXISTS counts (
    tier TEXT NOT NULL, emitter TEXT NOT NULL, incarnation TEXT NOT NULL, origin TEXT NOT NULL,
    topic TEXT NOT NULL, window_start INTEGER NOT NULL, window_ms INTEGER NOT NULL,
    count INTEGER NOT NULL, bytes INTEGER NOT NULL, checksum TEXT NOT NULL,
    distinct_count INTEGER, duplicates INTEGER, dropped INTEGER NOT NULL,
    dropped_reasons TEXT NOT NULL, dropped_unknown TEXT NOT NULL, late INTEGER NOT NULL,
    seq INTEGER NOT NULL, emitted_at INTEGER NOT NULL, skipped INTEGER,
    sealed_through INTEGER, arrived_at INTEGER,
    PRIMARY KEY (window_start, topic, tier, origin, emitter, incarnation)) WITHOUT ROWID;
"""

_WINDOWS = """
CREATE TABLE IF NOT EXISTS windows (
    topic TEXT NOT NULL, window_start INTEGER NOT NULL, tier TEXT NOT NULL,
    window_ms INTEGER NOT NULL, state TEXT NOT NULL, final INTEGER NOT NULL,
    expected INTEGER NOT NULL, count INTEGER NOT NULL, distinct_count INTEGER,
    duplicates INTEGER, dropped INTEGER NOT NULL, dropped_unknown TEXT NOT NULL,
    completeness REAL, hop_completeness REAL, checksum TEXT, missing INTEGER NOT NULL,
    changed_at INTEGER NOT NULL, final_at INTEGER, revision INTEGER NOT NULL,
    PRIMARY KEY (topic, window_start, tier)) WITHOUT ROWID;
"""

# The marks of each ``caught_up`` row (its job's batch ``seq``) that no mirror's watcher has
# vouched for yet, the ``UNVOUCHED_MARKS`` newest at most (layout 6).
_UNVOUCHED = """
CREATE TABLE IF NOT EXISTS caught_up_unvouched (
    emitter TEXT NOT NULL, incarnation TEXT NOT NULL, tier TEXT NOT NULL, source TEXT NOT NULL,
    source_incarnation TEXT NOT NULL, seq INTEGER NOT NULL, source_seq INTEGER NOT NULL,
    source_delivered INTEGER,
    PRIMARY KEY (emitter, incarnation, tier, source, source_incarnation, seq)) WITHOUT ROWID;
"""
UNVOUCHED_MARKS = 16

SCHEMA = _COUNTS + _WINDOWS + _UNVOUCHED + """
CREATE TABLE IF NOT EXISTS ranges (
    tier TEXT NOT NULL, emitter TEXT NOT NULL, incarnation TEXT NOT NULL, origin TEXT NOT NULL,
    origin_incarnation TEXT NOT NULL, through INTEGER NOT NULL, missing TEXT NOT NULL,
    missing_total INTEGER NOT NULL, missing_truncated INTEGER NOT NULL,
    seq INTEGER NOT NULL, emitted_at INTEGER NOT NULL,
    PRIMARY KEY (tier, emitter, incarnation, origin, origin_incarnation));
CREATE INDEX IF NOT EXISTS ranges_origin ON ranges (tier, origin);
CREATE TABLE IF NOT EXISTS progress (
    tier TEXT NOT NULL, emitter TEXT NOT NULL, batch_id INTEGER NOT NULL,
    input_rows_per_s REAL NOT NULL, processed_rows_per_s REAL NOT NULL,
    batch_duration_ms INTEGER NOT NULL, offsets_behind INTEGER, emitted_at INTEGER NOT NULL,
    arrived_at INTEGER, publishes_caught_up INTEGER, incarnation TEXT,
    PRIMARY KEY (tier, emitter));
CREATE TABLE IF NOT EXISTS caught_up (
    tier TEXT NOT NULL, emitter TEXT NOT NULL, incarnation TEXT NOT NULL, source TEXT NOT NULL,
    source_incarnation TEXT NOT NULL, source_seq INTEGER NOT NULL, source_delivered INTEGER,
    seq INTEGER NOT NULL, emitted_at INTEGER NOT NULL, arrived_at INTEGER NOT NULL,
    vouched_seq INTEGER, vouched_delivered INTEGER,
    PRIMARY KEY (tier, emitter, incarnation, source, source_incarnation)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS producers (
    origin TEXT PRIMARY KEY, last_seen_at INTEGER NOT NULL, emitted_at INTEGER,
    clock_offset_ms INTEGER, clock_offset_at INTEGER);
CREATE TABLE IF NOT EXISTS malformed (
    reason TEXT PRIMARY KEY, records INTEGER NOT NULL, last_error TEXT NOT NULL,
    last_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS offsets (
    topic TEXT NOT NULL, partition INTEGER NOT NULL, next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition));
CREATE TABLE IF NOT EXISTS dirty (
    topic TEXT NOT NULL, window_start INTEGER NOT NULL, PRIMARY KEY (topic, window_start));
-- A count record applied marks its window dirty (``Store.apply``, once per window of a batch).
-- Windows an evaluation took from ``dirty`` (and the windows not final yet), until the
-- transaction that stores each one's verdicts: what a killed evaluation left is taken again.
CREATE TABLE IF NOT EXISTS evaluating (
    topic TEXT NOT NULL, window_start INTEGER NOT NULL,
    PRIMARY KEY (topic, window_start)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS topic_tiers (
    topic TEXT NOT NULL, tier TEXT NOT NULL, PRIMARY KEY (topic, tier)) WITHOUT ROWID;
-- A tier's first count on a topic has the topic's windows of the last UNKNOWN_FINAL_MS (7 days,
-- verdict.py) judged again, final ones too: a window whose every record was lost before the
-- tier first counted the topic gets no count of its own at that tier, and was otherwise never
-- judged there (final at the tiers it had, its loss never called).
CREATE TRIGGER IF NOT EXISTS topic_tiers_dirty AFTER INSERT ON topic_tiers BEGIN
    INSERT INTO dirty SELECT DISTINCT w.topic, w.window_start FROM windows w
    WHERE w.topic = new.topic
      AND w.window_start >= (SELECT max(window_start) FROM windows WHERE topic = new.topic)
                            - UNKNOWN_FINAL_MS
      AND NOT EXISTS (SELECT 1 FROM dirty d WHERE d.topic = w.topic
                      AND d.window_start = w.window_start); END;
-- Windows not final yet, which every evaluation judges again.
CREATE INDEX IF NOT EXISTS windows_not_final ON windows (topic, window_start) WHERE final = 0;
CREATE TABLE IF NOT EXISTS window_origins (
    topic TEXT NOT NULL, window_start INTEGER NOT NULL, tier TEXT NOT NULL,
    origin TEXT NOT NULL, state TEXT NOT NULL, expected INTEGER, count INTEGER NOT NULL,
    distinct_count INTEGER, duplicates INTEGER, missing INTEGER NOT NULL, checksum TEXT,
    reason TEXT NOT NULL, PRIMARY KEY (topic, window_start, tier, origin));
CREATE TABLE IF NOT EXISTS window_revisions (
    topic TEXT NOT NULL, window_start INTEGER NOT NULL, tier TEXT NOT NULL,
    revision INTEGER NOT NULL, at INTEGER NOT NULL, state TEXT NOT NULL,
    count INTEGER NOT NULL, distinct_count INTEGER, completeness REAL,
    previous_state TEXT NOT NULL, previous_count INTEGER NOT NULL,
    PRIMARY KEY (topic, window_start, tier, revision));
CREATE TABLE IF NOT EXISTS alerts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, kind TEXT NOT NULL,
    alert_class TEXT NOT NULL, status TEXT NOT NULL, topic TEXT, window_start INTEGER,
    window_ms INTEGER, tier TEXT, origin TEXT, owner TEXT, summary TEXT NOT NULL,
    detail TEXT NOT NULL, fired_at INTEGER NOT NULL, resolved_at INTEGER,
    notified INTEGER NOT NULL DEFAULT 0, resolved_by TEXT);
CREATE UNIQUE INDEX IF NOT EXISTS alerts_one_open ON alerts (key) WHERE status = 'open';
CREATE INDEX IF NOT EXISTS alerts_status ON alerts (status, notified);
CREATE INDEX IF NOT EXISTS alerts_open_window ON alerts (topic, window_start)
    WHERE status = 'open';
CREATE TABLE IF NOT EXISTS alert_members (
    alert_id INTEGER NOT NULL, origin TEXT NOT NULL, status TEXT NOT NULL,
    summary TEXT NOT NULL, detail TEXT NOT NULL, since INTEGER NOT NULL, cleared_at INTEGER,
    PRIMARY KEY (alert_id, origin)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS alert_members_holding ON alert_members (origin)
    WHERE status = 'holding';
CREATE TABLE IF NOT EXISTS snoozes (
    key TEXT PRIMARY KEY, until INTEGER NOT NULL, by TEXT NOT NULL, at INTEGER NOT NULL);
CREATE VIEW IF NOT EXISTS completeness AS
    SELECT topic, window_start, tier, count, expected AS producer_count, completeness, state,
           final, distinct_count, duplicates, checksum
    FROM windows;
""".replace("UNKNOWN_FINAL_MS", str(UNKNOWN_FINAL_MS))

LAYOUT = 7        # PRAGMA user_version: the tables' layout, for a later change to be told by
# Layout 1 → 2: ``counts.skipped`` (copies a deduplicating tier did not keep), added in place.
# Layout 2 → 3: ``evaluating`` (windows an evaluation took from ``dirty``), created on open: a
# reconciler of layout 2 would not see the windows a killed evaluation left there.
# Layout 3 → 4: ``counts`` and ``windows`` rebuilt clustered by their keys (``WITHOUT ROWID``),
# and ``windows_open`` (every window, by finality) replaced by ``windows_not_final`` (only the
# windows not final): one transaction (``_cluster``), so a kill leaves layout 3 whole.
# Layout 4 → 5: arrival times (``counts.arrived_at``, ``progress.arrived_at``), the producers'
# ``sealed_through`` and clock offsets, and ``caught_up``: columns added in place (``_arrivals``,
# each one looked for first), the table created with the schema.
_LAYOUT_5_COLUMNS = (("counts", "sealed_through INTEGER"), ("counts", "arrived_at INTEGER"),
                     ("progress", "arrived_at INTEGER"),
                     ("progress", "publishes_caught_up INTEGER"),
                     ("progress", "incarnation TEXT"),
                     ("producers", "emitted_at INTEGER"),
                     ("producers", "clock_offset_ms INTEGER"),
                     ("producers", "clock_offset_at INTEGER"))
# Layout 5 → 6: the marks a mirror's watcher vouched for (``caught_up.vouched_seq``,
# ``vouched_delivered``) and those it has not yet (``caught_up_unvouched``): columns added in
# place and filled from the marks a watcher covers already (``_vouches``, each step looked for
# first or repeatable), the table created with them.
_LAYOUT_6_COLUMNS = (("caught_up", "vouched_seq INTEGER"),
                     ("caught_up", "vouched_delivered INTEGER"))
# Layout 6 → 7: ``alert_members``, the origins a grouped alert covers (one alert per kind,
# topic, window and tier, or per producers gone quiet together), created with the schema. The
# per-origin alerts a layout-6 file holds open resolve at their next judgement ("replaced by a
# grouped alert" when their condition still holds, which then fires grouped). And the triggers
# that marked a window dirty per count row stored are dropped: ``apply`` marks each window of
# its batch once (measured on a fleet's records: 122-123 k records/s applied with the triggers,
# 174-175 k without).
_LAYOUT_7_DROPPED = ("counts_dirty_insert", "counts_dirty_update")

# A count row as ``apply`` writes it: the key first (its sort), then the rest.
_ROW_COLUMNS = ("window_start", "topic", "tier", "origin", "emitter", "incarnation",
                "window_ms", "count", "bytes", "checksum", "distinct_count", "duplicates",
                "dropped", "dropped_reasons", "dropped_unknown", "late", "seq", "emitted_at",
                "skipped", "sealed_through", "arrived_at")
# The columns a bare count record (no drops, no late records, no skipped copies: nearly every
# one; not a plain window's, ``PlainWindow``) holds at their defaults, written as constants: a
# value bound from Python costs about 0.1 us, a fleet's day is 57.6 M rows (docs/reconcile.md,
# "A fleet's day").
_BARE_DEFAULTS = {"dropped": "0", "dropped_reasons": "'{}'", "dropped_unknown": "'{}'",
                   "late": "0", "skipped": "NULL"}
_BARE_COLUMNS = tuple(c for c in _ROW_COLUMNS if c not in _BARE_DEFAULTS)
_UPSERT_COUNT_ON = """
ON CONFLICT (window_start, topic, tier, origin, emitter, incarnation) DO UPDATE SET
    window_ms = excluded.window_ms, count = excluded.count, bytes = excluded.bytes,
    checksum = excluded.checksum, distinct_count = excluded.distinct_count,
    duplicates = excluded.duplicates, dropped = excluded.dropped,
    dropped_reasons = excluded.dropped_reasons, dropped_unknown = excluded.dropped_unknown,
    late = excluded.late, seq = excluded.seq, emitted_at = excluded.emitted_at,
    skipped = excluded.skipped, sealed_through = excluded.sealed_through,
    arrived_at = excluded.arrived_at
WHERE """ + newer_sql(AuditRecord, "counts")
_UPSERT_COUNT = (f"INSERT INTO counts ({', '.join(_ROW_COLUMNS)}) "
                 f"VALUES ({', '.join('?' * len(_ROW_COLUMNS))})" + _UPSERT_COUNT_ON)
_UPSERT_BARE_COUNT = (
    f"INSERT INTO counts ({', '.join(_BARE_COLUMNS)}, {', '.join(_BARE_DEFAULTS)}) "
    f"VALUES ({', '.join('?' * len(_BARE_COLUMNS))}, {', '.join(_BARE_DEFAULTS.values())})"
    + _UPSERT_COUNT_ON)

_UPSERT_RANGES = """
INSERT INTO ranges VALUES (:tier, :emitter, :incarnation, :origin, :origin_incarnation,
    :through, :missing, :missing_total, :missing_truncated, :seq, :emitted_at)
ON CONFLICT (tier, emitter, incarnation, origin, origin_incarnation) DO UPDATE SET
    through = excluded.through, missing = excluded.missing,
    missing_total = excluded.missing_total, missing_truncated = excluded.missing_truncated,
    seq = excluded.seq, emitted_at = excluded.emitted_at
WHERE """ + newer_sql(Ranges, "ranges")

_UPSERT_PROGRESS = """
INSERT INTO progress VALUES (:tier, :emitter, :batch_id, :input_rows_per_s,
    :processed_rows_per_s, :batch_duration_ms, :offsets_behind, :emitted_at, :arrived_at,
    :publishes_caught_up, :incarnation)
ON CONFLICT (tier, emitter) DO UPDATE SET
    batch_id = excluded.batch_id, input_rows_per_s = excluded.input_rows_per_s,
    processed_rows_per_s = excluded.processed_rows_per_s,
    batch_duration_ms = excluded.batch_duration_ms, offsets_behind = excluded.offsets_behind,
    emitted_at = excluded.emitted_at, arrived_at = excluded.arrived_at,
    publishes_caught_up = excluded.publishes_caught_up, incarnation = excluded.incarnation
WHERE """ + newer_sql(Progress, "progress")

# A mark only grows: each figure the higher of the stored and the new.
_UPSERT_CAUGHT_UP = """
INSERT INTO caught_up (tier, emitter, incarnation, source, source_incarnation, source_seq,
    source_delivered, seq, emitted_at, arrived_at)
VALUES (:tier, :emitter, :incarnation, :source, :source_incarnation, :source_seq,
    :source_delivered, :seq, :emitted_at, :arrived_at)
ON CONFLICT (tier, emitter, incarnation, source, source_incarnation) DO UPDATE SET
    source_seq = max(source_seq, excluded.source_seq),
    source_delivered = CASE WHEN source_delivered IS NULL THEN excluded.source_delivered
        WHEN excluded.source_delivered IS NULL THEN source_delivered
        ELSE max(source_delivered, excluded.source_delivered) END,
    seq = max(seq, excluded.seq), emitted_at = max(emitted_at, excluded.emitted_at),
    arrived_at = max(arrived_at, excluded.arrived_at)
"""

_UPSERT_UNVOUCHED = """
INSERT INTO caught_up_unvouched VALUES (:emitter, :incarnation, :tier, :source,
    :source_incarnation, :seq, :source_seq, :source_delivered)
ON CONFLICT (emitter, incarnation, tier, source, source_incarnation, seq) DO UPDATE SET
    source_seq = max(source_seq, excluded.source_seq),
    source_delivered = CASE WHEN source_delivered IS NULL THEN excluded.source_delivered
        WHEN excluded.source_delivered IS NULL THEN source_delivered
        ELSE max(source_delivered, excluded.source_delivered) END
"""

# A row's marks of batches up to ``seq`` are vouched for: the highest of each figure is.
_FOLD_VOUCHED = """
UPDATE caught_up SET vouched_seq = max(coalesce(vouched_seq, :seq_), :seq_),
    vouched_delivered = CASE WHEN vouched_delivered IS NULL THEN :delivered
        WHEN :delivered IS NULL THEN vouched_delivered
        ELSE max(vouched_delivered, :delivered) END
WHERE tier = :tier AND emitter = :emitter AND incarnation = :incarnation AND source = :source
    AND source_incarnation = :source_incarnation
"""

# Of a row's unvouched marks, only the ``UNVOUCHED_MARKS`` newest are kept.
_ROW = """emitter = :emitter AND incarnation = :incarnation AND tier = :tier
    AND source = :source AND source_incarnation = :source_incarnation"""
_TRIM_UNVOUCHED = f"""
DELETE FROM caught_up_unvouched WHERE {_ROW} AND seq < (SELECT min(seq) FROM (
    SELECT seq FROM caught_up_unvouched WHERE {_ROW} ORDER BY seq DESC LIMIT :keep))
"""

# An origin last heard of at the newest arrival; its clock's offset from the newest record the
# broker stamped (``clock_offsets``), kept when a later batch has none.
_UPSERT_PRODUCER = """
INSERT INTO producers VALUES (:origin, :arrived_at, :emitted_at, :offset, :offset_at)
ON CONFLICT (origin) DO UPDATE SET
    last_seen_at = max(last_seen_at, excluded.last_seen_at),
    emitted_at = CASE WHEN excluded.last_seen_at >= last_seen_at THEN excluded.emitted_at
        ELSE emitted_at END,
    clock_offset_ms = CASE WHEN excluded.clock_offset_at >= coalesce(clock_offset_at, 0)
        THEN excluded.clock_offset_ms ELSE clock_offset_ms END,
    clock_offset_at = CASE WHEN excluded.clock_offset_at >= coalesce(clock_offset_at, 0)
        THEN excluded.clock_offset_at ELSE clock_offset_at END
"""


class StoreMissing(AuditError):
    """A read-only open of a database file that is not there."""


class Store(StoreReads, AlertTables):
    """The database at ``path``. ``readonly``: a connection that cannot write (the metrics
    endpoint, ``docket-audit show --db``); the file must exist and is left as it is (no
    schema is created)."""

    def __init__(self, path: str | Path, readonly: bool = False):
        self.path = Path(path)
        if readonly:
            if not self.path.is_file():
                raise StoreMissing(f"no reconciler database at {self.path}",
                                   hint="name the --db of docket-audit reconcile")
            self.conn = read_only(self.path)
            self.db = sqlite_utils.Database(self.conn)
            return
        self.db = sqlite_utils.Database(str(self.path))
        self.conn: sqlite3.Connection = self.db.conn
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.execute("PRAGMA busy_timeout = 30000")     # the three loops share the file
        # Measured (docs/reconcile.md, "Measured here"): a day of 1,000 topics applied 13 %
        # and evaluated 5 % faster than with the defaults (2 MiB, 1,000 pages), for 70 MB; a
        # fleet's window (400,000 count rows, about 65 MB of ``counts``) outgrows 64 MiB, and
        # its batches applied in key order need the window's pages held: 256 MiB.
        self.conn.execute("PRAGMA cache_size = -262144")     # KiB: 256 MiB per connection
        self.conn.execute("PRAGMA wal_autocheckpoint = 10000")   # pages: fewer checkpoints
        layout = self.conn.execute("PRAGMA user_version").fetchone()[0]
        # The column and the version are two statements: a kill between them leaves the column
        # added under layout 1, so look for it rather than trust the version.
        columns = {r[1] for r in self.conn.execute("PRAGMA table_info(counts)")}
        if layout == 1 and "skipped" not in columns:
            self.conn.execute("ALTER TABLE counts ADD COLUMN skipped INTEGER")
        elif layout > LAYOUT:
            raise AuditError(f"{path}: layout {layout} is newer than this reconciler's "
                             f"({LAYOUT})", hint="run the docket version that wrote it")
        if columns and layout < 4:
            self._cluster()
        if columns and layout < 5:
            self._arrivals()
        if columns and layout < 6:
            self._vouches()
        self.conn.executescript(SCHEMA)
        for trigger in _LAYOUT_7_DROPPED:
            self.conn.execute(f"DROP TRIGGER IF EXISTS {trigger}")
        if layout != LAYOUT:
            self.conn.execute(f"PRAGMA user_version = {LAYOUT}")
        ensure_tables(self.db)                   # the alerts' outbox lives in the same file

    def close(self) -> None:
        self.conn.close()

    def _cluster(self) -> None:
        """Layout 3 → 4: ``counts`` and ``windows`` copied into tables clustered by their keys,
        and the triggers, the view and the indexes that went with the old tables made again,
        in one transaction with the layout number 4 (a file is at one layout or the other,
        whole; layout 5's columns are then added in place, ``_arrivals``). Measured: 3.9 s for
        a day of 1,000 topics (1.3 M count rows; applying them took 14 s). The old tables'
        pages stay in the file, free, for the rows to come; the write-ahead log, as large as
        the new tables, is emptied after."""
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if conn.execute("PRAGMA user_version").fetchone()[0] >= 4:
                conn.rollback()                       # another opener rebuilt it meanwhile
                return
            log.warning("%s: rebuilding counts and windows clustered by their keys (layout "
                        "4); this runs once", self.path)
            conn.execute("DROP VIEW IF EXISTS completeness")    # they name ``windows``:
            conn.execute("DROP TRIGGER IF EXISTS topic_tiers_dirty")  # made again below
            for name, create in (("counts", _COUNTS), ("windows", _WINDOWS)):
                names = ", ".join(r[1] for r in conn.execute(f"PRAGMA table_info({name})"))
                conn.execute(create.replace(f"EXISTS {name} (", f"EXISTS {name}_clustered ("))
                conn.execute(f"INSERT INTO {name}_clustered ({names}) SELECT {names} FROM {name}")
                conn.execute(f"DROP TABLE {name}")              # its triggers and indexes too
                conn.execute(f"ALTER TABLE {name}_clustered RENAME TO {name}")
            for statement in _statements(SCHEMA):
                conn.execute(statement)
            conn.execute("PRAGMA user_version = 4")    # what follows it is added in place
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def _arrivals(self) -> None:
        """Layout 4 → 5: the columns it adds, each only where it is not there yet (a kill
        between two of them leaves the others to the next open)."""
        for table, column in _LAYOUT_5_COLUMNS:
            have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            if have and column.split()[0] not in have:
                self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")

    def _vouches(self) -> None:
        """Layout 5 → 6: the vouched figures of each mark, from the marks a watcher covers
        already (the newest of its row: layout 5 kept no other); a row's newest mark that no
        watcher covers waits in ``caught_up_unvouched``, as if it had just come. Each step is
        looked for first, or can run again (a kill leaves the rest to the next open)."""
        have = {r[1] for r in self.conn.execute("PRAGMA table_info(caught_up)")}
        if not have:
            return                                 # made by the schema, whole
        for table, column in _LAYOUT_6_COLUMNS:
            if column.split()[0] not in have:
                self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {column}")
        self.conn.executescript(_UNVOUCHED)
        with self.conn:
            marks = [dict(zip(("tier", "emitter", "incarnation", "source", "source_incarnation",
                               "seq", "source_seq", "source_delivered"), row, strict=True))
                     for row in self.conn.execute(
                         "SELECT tier, emitter, incarnation, source, source_incarnation, seq, "
                         "source_seq, source_delivered FROM caught_up WHERE tier != ?",
                         (MIRROR_TIER,))]
            self.conn.executemany(_UPSERT_UNVOUCHED, marks)
            self._fold_vouched(set(), marks)

    def _fold_vouched(self, named: set[tuple[str, str]], marks: list[dict]) -> None:
        """The rows' marks that a watcher now covers (``mirrored``) become their rows' vouched
        figures and leave ``caught_up_unvouched``, for each (emitter, incarnation) that a
        watcher's record ``named`` or that sent ``marks`` (just stored there); of each row
        that got one, the ``UNVOUCHED_MARKS`` newest stay. What this leaves depends on the
        marks and the watchers' records applied, never on the order they came in (different
        partitions: a replay reads them in another): a row's vouched figures are the highest
        of its marks a watcher covers, unless more than ``UNVOUCHED_MARKS`` newer marks of the
        row came before the watcher did (then lower: the older ones are gone)."""
        pairs = named | {(m["emitter"], m["incarnation"]) for m in marks}
        copied = self.mirrored() if pairs else {}
        for emitter, incarnation in sorted(pairs):
            covered = copied.get((emitter, incarnation))
            folded = [] if covered is None else [
                {"tier": tier, "emitter": emitter, "incarnation": incarnation, "source": source,
                 "source_incarnation": source_inc, "seq_": seq, "delivered": delivered}
                for tier, source, source_inc, seq, delivered in self.conn.execute(
                    "SELECT tier, source, source_incarnation, max(source_seq), "
                    "max(source_delivered) FROM caught_up_unvouched WHERE emitter = ? AND "
                    "incarnation = ? AND seq <= ? GROUP BY tier, source, source_incarnation",
                    (emitter, incarnation, covered))]
            if folded:
                self.conn.executemany(_FOLD_VOUCHED, folded)
                self.conn.execute("DELETE FROM caught_up_unvouched WHERE emitter = ? AND "
                                  "incarnation = ? AND seq <= ?", (emitter, incarnation, covered))
        self.conn.executemany(_TRIM_UNVOUCHED, [{**m, "keep": UNVOUCHED_MARKS} for m in marks])

    # -- input ---------------------------------------------------------------------------------
    def apply(self, records: Iterable[Record], malformed: dict[str, tuple[int, str]],
              offsets: dict[tuple[str, int], int], now_iso: str,
              clock_offsets: dict[str, tuple[int, int]] | None = None) -> None:
        """One transaction: the records (each with its ``arrived_at``), the malformed ones'
        tallies, and the offsets they were read up to (``offsets``: (topic, partition) → the
        next offset to read); ``clock_offsets``: origin → (when, how many ms its clock is
        ahead of the broker's) as measured on records the broker stamped. Every window a
        count record of the batch names is marked dirty, once, whether the record was newer
        than the one stored or not (judged again, a window that did not change gives the
        same verdict)."""
        records = records if isinstance(records, list) else list(records)
        counts, bare, ranges, progress, marks = [], [], [], [], []
        producers: dict[str, dict] = {}          # origin → its newest arrival
        for rec in records:
            if isinstance(rec, AuditRecord):
                if rec.dropped or rec.late or rec.skipped is not None or rec.dropped_reasons \
                        or rec.dropped_unknown:
                    counts.append(_count_row(rec))
                else:
                    bare.append(_bare_row(rec))
                if rec.tier == PRODUCER_TIER:
                    arrived = rec.arrived_at if rec.arrived_at is not None else rec.emitted_at
                    seen = producers.get(rec.origin)
                    if seen is None or arrived >= seen["arrived_at"]:
                        producers[rec.origin] = {"origin": rec.origin, "arrived_at": arrived,
                                                 "emitted_at": rec.emitted_at, "offset": None,
                                                 "offset_at": None}
            elif isinstance(rec, Ranges):
                ranges.append({**rec.__dict__, "incarnation": rec.incarnation or "",
                               "missing": json.dumps(rec.missing),
                               "missing_truncated": int(rec.missing_truncated)})
            elif isinstance(rec, CaughtUp):
                marks.append({**rec.__dict__, "arrived_at": rec.arrived_at
                              if rec.arrived_at is not None else rec.emitted_at})
            else:
                progress.append(rec.__dict__)
        for origin, (at, offset) in (clock_offsets or {}).items():
            row = producers.setdefault(origin, {"origin": origin, "arrived_at": at,
                                                "emitted_at": at + offset})
            row["offset"], row["offset_at"] = offset, at
        if counts and bare and _shared_identity(counts, bare):
            # Records of one identity in both lists: one list, so that they are applied in the
            # order they came (of two with the same seq and emitted_at the first is kept).
            counts, bare = [_count_row(r) for r in records if isinstance(r, AuditRecord)], []
        # In the order of the table's key's first two columns (window, topic), so that a batch
        # writes each page of ``counts`` it touches once, not once per row; within them as they
        # came (stable sorts: records of one identity keep their order). Two sorts by one
        # column each cost 0.2 us a row, one by the whole key 0.8 (a fleet's records).
        for rows in (counts, bare):
            rows.sort(key=_TOPIC)
            rows.sort(key=_WINDOW)
        with self.conn:
            self.conn.executemany(_UPSERT_BARE_COUNT, bare)
            self.conn.executemany(_UPSERT_COUNT, counts)
            self.conn.executemany("INSERT OR IGNORE INTO dirty VALUES (?, ?)",
                                  {(row[1], row[0]) for rows in (bare, counts) for row in rows})
            self.conn.executemany("INSERT OR IGNORE INTO topic_tiers VALUES (?, ?)",
                                  {(row[1], row[2]) for rows in (bare, counts) for row in rows})
            self.conn.executemany(_UPSERT_PRODUCER, list(producers.values()))
            self.conn.executemany(_UPSERT_RANGES, ranges)
            self.conn.executemany(_UPSERT_PROGRESS, progress)
            self.conn.executemany(_UPSERT_CAUGHT_UP, marks)
            mine = [m for m in marks if m["tier"] != MIRROR_TIER]
            self.conn.executemany(_UPSERT_UNVOUCHED, mine)
            self._fold_vouched({(m["source"], m["source_incarnation"]) for m in marks
                                if m["tier"] == MIRROR_TIER}, mine)
            for reason, (n, error) in malformed.items():
                self.conn.execute(
                    "INSERT INTO malformed VALUES (?, ?, ?, ?) ON CONFLICT (reason) DO UPDATE "
                    "SET records = records + excluded.records, last_error = excluded.last_error,"
                    " last_at = excluded.last_at", (reason, n, error[:500], now_iso))
            self.conn.executemany(
                "INSERT INTO offsets VALUES (?, ?, ?) ON CONFLICT (topic, partition) DO UPDATE "
                "SET next_offset = max(next_offset, excluded.next_offset)",
                [(t, p, o) for (t, p), o in offsets.items()])

    def offsets(self, topic: str) -> dict[int, int]:
        return dict(self.conn.execute(
            "SELECT partition, next_offset FROM offsets WHERE topic = ?", (topic,)))

    # -- what evaluation reads -----------------------------------------------------------------
    def take_windows_to_evaluate(self) -> list[tuple[str, int]]:
        """The windows changed since their last evaluation, and every window not yet final,
        in order (SQLite's ordering of text is Python's; each topic's name is one object).
        In one transaction they move from ``dirty`` to ``evaluating``, where each stays until
        ``evaluated`` in the transaction that stores its verdicts: a record applied from now
        on marks its window dirty again (for the next evaluation), and what an evaluation that
        was killed left is taken by the next."""
        with self.conn:
            self.conn.execute(
                "INSERT OR IGNORE INTO evaluating SELECT topic, window_start FROM dirty UNION "
                "SELECT topic, window_start FROM windows WHERE final = 0")
            self.conn.execute("DELETE FROM dirty")
        names: dict[str, str] = {}
        return [(names.setdefault(topic, topic), window_start)
                for topic, window_start in self.conn.execute(
                    "SELECT topic, window_start FROM evaluating ORDER BY topic, window_start")]

    def evaluated(self, windows: list[tuple[str, int]]) -> None:
        """``windows``' verdicts are stored by the caller's transaction."""
        self.conn.executemany("DELETE FROM evaluating WHERE topic = ? AND window_start = ?",
                              windows)

    def window_records(self, windows: list[tuple[str, int]]
                       ) -> dict[tuple[str, int], list[AuditRecord]]:
        """The count records of each of ``windows`` (one query per topic among them), each
        window's in the order of their key (two emitters that tie are told apart by name, never
        by the order the records arrived in)."""
        out: dict[tuple[str, int], list[AuditRecord]] = {w: [] for w in windows}
        for topic, starts in windows_by_topic(windows):
            for r in self.conn.execute(
                    f"SELECT {_COLUMNS} FROM counts WHERE topic = ? AND "
                    "window_start IN (SELECT value FROM json_each(?)) "
                    "ORDER BY window_start, tier, origin, emitter, incarnation", (topic, starts)):
                out[(topic, r[3])].append(_count_record(r))
        return out

    def plain_windows(self, windows: list[tuple[str, int]]) -> dict[tuple[str, int], PlainWindow]:
        """What SQLite can tell of each of ``windows`` without making a record of its rows:
        their number, how many (tier, origin) pairs and how many (origin, count, checksum)
        triples they hold, the producer's rows and sums; enough to find the *plain* windows
        (``PlainWindow.plain``), most of them, whose verdicts need no record read."""
        return plain_figures(self.plain_figures_text(windows))

    def plain_figures_text(self, windows: list[tuple[str, int]]) -> str:
        """``plain_windows``' figures as SQLite gives them, one JSON text (``plain_figures``
        makes them into ``PlainWindow`` objects)."""
        return self.conn.execute(PLAIN_QUERY, (json.dumps(windows),)).fetchone()[0]

    def progress(self) -> dict[str, tuple[int, int | None]]:
        """tier → (when its newest progress record arrived, its ``offsets_behind``)."""
        out: dict[str, tuple[int, int | None]] = {}
        for tier, at, behind in self.conn.execute(
                f"SELECT tier, {_ARRIVED} AS at, offsets_behind FROM progress ORDER BY at"):
            out[tier] = (at, behind)
        return out

    def current_progress(self, stale_ms: int) -> dict[str, tuple[int, int | None]]:
        """tier → (arrival, ``offsets_behind``) that the verdicts take as the tier's progress
        when the tier publishes no ``caught_up`` marks (``verdict.Currency``): of all its
        emitters together. A tier can have several (the warehouse: the query landing Kafka's
        records and the one counting the landed files), and it has read everything only when
        each has: the oldest arrival and the largest ``offsets_behind`` of them. Seen: the
        landing query at the end of its input while the counting query had not yet counted the
        files, and whole windows judged lost. An emitter whose progress arrived ``stale_ms``
        before the tier's newest (a query renamed or removed) is left out; the tier's own
        silence is the ``audit_lag`` alert's."""
        rows: dict[str, list[tuple[int, int | None]]] = {}
        for tier, at, behind in self.conn.execute(
                f"SELECT tier, {_ARRIVED}, offsets_behind FROM progress"):
            rows.setdefault(tier, []).append((at, behind))
        out = {}
        for tier, marks in rows.items():
            newest = max(at for at, _ in marks)
            live = [(at, b) for at, b in marks if at >= newest - stale_ms]
            behinds = [b for _, b in live if b is not None]
            out[tier] = (min(at for at, _ in live), max(behinds) if behinds else None)
        return out

    def caught_up(self, stale_ms: int, mirrored: Iterable[str] = ()
                  ) -> dict[str, dict[tuple[str, str], Mark]]:
        """tier → (source emitter, its incarnation) → how far the tier has caught up with it
        (``CaughtUp`` records), for the tiers whose jobs say they publish them
        (``progress.publishes_caught_up``; a tier before its first mark is here, caught up
        with nothing, never judged by its progress alone). Of each such emitter, the marks of
        the incarnation its newest progress names (a job started on a new checkpoint counts
        again from nothing: its predecessor's marks do not speak for its counts); of several
        emitters of a tier, those whose progress arrived within ``stale_ms`` of the tier's
        newest, and a source counts only as far as every one of them has caught up with it.

        A tier whose records come through a mirror (``through_mirrors``; ``mirrored``: tiers
        the caller knows to, from its graph) counts a mark only as far as a watcher has
        vouched for it (``vouched_seq``, ``vouched_delivered``: the highest of its marks of
        batches a watcher covers, ``_fold_vouched``): while the newest batch's counts are on
        their way, the figures vouched for before still hold."""
        emitters: dict[tuple[str, str], tuple[str | None, int]] = {
            (tier, emitter): (incarnation, at) for tier, emitter, incarnation, at in
            self.conn.execute(f"SELECT tier, emitter, incarnation, {_ARRIVED} FROM progress "
                              "WHERE publishes_caught_up")}
        newest: dict[str, int] = {}
        for (tier, _e), (_i, at) in emitters.items():
            newest[tier] = max(at, newest.get(tier, at))
        live = {key: inc for key, (inc, at) in emitters.items() if at >= newest[key[0]] - stale_ms}
        marks: dict[tuple[str, str], dict[tuple[str, str], Mark]] = {key: {} for key in live}
        rows = self.conn.execute(
            "SELECT tier, emitter, incarnation, source, source_incarnation, source_seq, "
            "source_delivered, vouched_seq, vouched_delivered FROM caught_up WHERE tier != ?",
            (MIRROR_TIER,)).fetchall()
        through = self.through_mirrors(set(emitters) | {(r[0], r[1]) for r in rows})
        through |= set(mirrored)
        for tier, emitter, incarnation, source, source_inc, seq, delivered, vouched, \
                vouched_delivered in rows:
            if tier in through:
                if vouched is None:
                    continue      # its counts may still be on their way through the mirror
                seq, delivered = vouched, vouched_delivered
            if (tier, emitter) in live and live[(tier, emitter)] in (None, incarnation):
                marks[(tier, emitter)][(source, source_inc)] = Mark(seq, delivered)
        by_tier: dict[str, list[dict[tuple[str, str], Mark]]] = {}
        for (tier, _emitter), held in marks.items():
            by_tier.setdefault(tier, []).append(held)
        return {tier: {key: reduce(Mark.least, (m[key] for m in rest), mark)
                       for key, mark in first.items() if all(key in m for m in rest)}
                for tier, (first, *rest) in by_tier.items()}

    def through_mirrors(self, emitters: set[tuple[str, str]]) -> set[str]:
        """Of the tiers of ``emitters`` ((tier, emitter) pairs), those whose records come
        through a mirror, as the watchers' records say: a tier that is a watched mirror's
        source (the watcher's emitter ``mirror/SOURCE->TARGET``), or one of whose emitters a
        watcher has vouched for (any incarnation: a new job of the tier, or its first marks,
        wait for their own vouch). A mirror whose watcher has not yet ended a round says
        nothing here: ``caught_up``'s ``mirrored`` can."""
        named, sources = set(), set()
        for emitter, source in self.conn.execute(
                "SELECT DISTINCT emitter, source FROM caught_up WHERE tier = ?", (MIRROR_TIER,)):
            named.add(source)
            flow = emitter.removeprefix(f"{MIRROR_TIER}/")
            sources.add(flow.rsplit("->", 1)[0])
        return {tier for tier, emitter in emitters if emitter in named or tier in sources}

    def mirrored(self) -> dict[tuple[str, str], int]:
        """(emitter, incarnation) → the highest ``seq`` of its records that a mirror's watcher
        says were copied here, with everything appended before them on their cluster
        (``caught_up`` records of tier ``mirror``: docs/topology.md). A tier whose records
        come through a mirror (a local cluster's, read on the aggregate) arrive in no order
        among its partitions: its mark may be here before its counts. Such a mark counts only
        once a watcher vouches for the batch that made it."""
        out: dict[tuple[str, str], int] = {}
        for source, incarnation, seq in self.conn.execute(
                "SELECT source, source_incarnation, source_seq FROM caught_up "
                "WHERE tier = ?", (MIRROR_TIER,)):
            out[(source, incarnation)] = max(seq, out.get((source, incarnation), seq))
        return out

    def tiers_of(self, topics: list[str]) -> dict[str, set[str]]:
        """topic → the tiers that ever reported on it (a tier is judged on a topic it counts),
        for ``topics``."""
        out: dict[str, set[str]] = {}
        for topic, tier in self.conn.execute(
                "SELECT topic, tier FROM topic_tiers WHERE topic IN "
                "(SELECT value FROM json_each(?))", (json.dumps(topics),)):
            out.setdefault(topic, set()).add(tier)
        return out

    def producers(self) -> dict[str, int]:
        """origin → when its newest producer record arrived."""
        return dict(self.conn.execute("SELECT origin, last_seen_at FROM producers"))

    def clock_offsets(self) -> dict[str, tuple[int, int]]:
        """origin → (ms its clock is ahead of the broker's, when that was measured), for the
        origins measured (records the broker stamped)."""
        return {origin: (offset, at) for origin, offset, at in self.conn.execute(
            "SELECT origin, clock_offset_ms, clock_offset_at FROM producers "
            "WHERE clock_offset_ms IS NOT NULL")}

    def missing_ranges(self, tier: str, origin: str, upstream: tuple[str, ...] = ()
                       ) -> tuple[list[list[int]], int]:
        """The record numbers of ``origin`` that ``tier`` has not seen and the producer did not
        journal as dropped (its newest report per number space), and their total. With
        ``upstream`` (the tiers feeding ``tier`` that hold the origin): less those that no
        feeding tier has seen either (lost before the hop: a number one of them has was lost
        at it), so only those lost at the hop. A feeding tier has not seen the numbers its
        newest report calls missing nor those above its ``through``; one without a report on
        the number space says nothing of it."""
        def newest(t: str) -> dict[str, tuple[list, int]]:
            out: dict[str, tuple] = {}
            for oi, missing, through, _at in self.conn.execute(
                    "SELECT origin_incarnation, missing, through, emitted_at FROM ranges "
                    "WHERE tier = ? AND origin = ? ORDER BY emitted_at, seq", (t, origin)):
                out[oi] = (json.loads(missing), through)
            return out
        dropped = {oi: m for oi, (m, _t) in newest("producer").items()}
        unseen: dict[str, list[list[list[int]]]] = {}   # number space → each feeder's
        for feeder in upstream:
            for oi, (m, through) in newest(feeder).items():
                unseen.setdefault(oi, []).append(_union(m, [[through + 1, _NO_NUMBER]]))
        for oi, each in unseen.items():
            dropped[oi] = _union(dropped.get(oi, []), reduce(_intersect, each))
        ranges, total = [], 0
        for oi, (missing, _t) in newest(tier).items():
            for a, b in _subtract(missing, dropped.get(oi, [])):
                ranges.append([a, b])
                total += b - a + 1
        return ranges, total

    # -- verdicts ------------------------------------------------------------------------------
    def previous(self, windows: list[tuple[str, int]]) -> dict[tuple[str, int], dict[str, dict]]:
        """The stored ``windows`` rows of each of ``windows``: (topic, window_start) → tier →
        row (windows never evaluated are absent)."""
        out: dict[tuple[str, int], dict[str, dict]] = {}
        for topic, starts in windows_by_topic(windows):
            cur = self.conn.execute("SELECT * FROM windows WHERE topic = ? AND window_start IN "
                                    "(SELECT value FROM json_each(?))", (topic, starts))
            names = [d[0] for d in cur.description]
            for row in cur:
                r = dict(zip(names, row, strict=True))
                out.setdefault((topic, r["window_start"]), {})[r["tier"]] = r
        return out

    def verdict_writer(self, previous: dict[tuple[str, int], dict[str, dict]],
                       now_ms: int) -> VerdictWriter:
        """Stores the verdicts of a batch of windows whose stored rows are ``previous`` (in
        the caller's transaction; call ``flush`` before it commits)."""
        return VerdictWriter(self.conn, previous, now_ms)


class VerdictWriter:
    """Stores windows' verdicts, a change to a final window also as a revision; rows that did
    not change are not written. Writes are gathered and sent with ``executemany``, each table's
    in the order they were made."""

    def __init__(self, conn: sqlite3.Connection, previous: dict[tuple[str, int], dict[str, dict]],
                 now_ms: int):
        self.conn = conn
        self.previous = previous
        self.now_ms = now_ms
        self.windows: list[tuple] = []
        self.origins: list[tuple] = []
        self.revisions: list[tuple] = []

    def save(self, topic: str, window_start: int, window_ms: int,
             verdicts: list[TierVerdict]) -> None:
        before = self.previous.get((topic, window_start), {})
        for v in verdicts:
            dropped_unknown = json.dumps(v.dropped_unknown, sort_keys=True) \
                if v.dropped_unknown else "{}"
            self._save(topic, window_start, window_ms, before.get(v.tier), (
                v.tier, window_ms, v.state, v.final, v.expected, v.count, v.distinct,
                v.duplicates, v.dropped, dropped_unknown, v.completeness, v.hop_completeness,
                v.checksum, sum(o.missing for o in v.origins)),
                [(topic, window_start, v.tier, o.origin, o.state, o.expected, o.count,
                  o.distinct, o.duplicates, o.missing, o.checksum, o.reason)
                 for o in v.origins if not o.plain])

    def save_plain(self, topic: str, window_start: int, tiers: list[str], plain: PlainWindow,
                   state: str, final: bool) -> None:
        """The verdicts of a window whose records are plain (``Store.plain_windows``): what
        ``judge`` makes of them, without the records: every tier has each origin's producer
        count, distinct, and its checksum (state ``complete`` once the window has ended)."""
        before = self.previous.get((topic, window_start), {})
        p, window_ms = plain.producer_count, plain.min_window_ms
        for tier in tiers:
            self._save(topic, window_start, window_ms, before.get(tier), (
                tier, window_ms, state, final, p, p, p, 0,
                plain.producer_dropped if tier == PRODUCER_TIER else 0, "{}", 1.0, 1.0, MATCH,
                0), [])

    def _save(self, topic: str, window_start: int, window_ms: int, old: dict | None,
              row: tuple, origins: list[tuple]) -> None:
        """One tier's verdict ``row`` (tier, window_ms, state, final, expected, count, distinct,
        duplicates, dropped, dropped_unknown, completeness, hop_completeness, checksum,
        missing) and its origins' rows that are not plain, unless the stored row says the
        same."""
        (tier, window_ms, state, final, expected, count, distinct, duplicates, dropped,
         dropped_unknown, completeness, hop_completeness, checksum, missing) = row
        now_ms = self.now_ms
        if old is not None and (old["state"], old["final"], old["expected"], old["count"],
                                old["distinct_count"], old["duplicates"], old["checksum"],
                                old["missing"], old["dropped"], old["dropped_unknown"]) == \
                (state, int(final), expected, count, distinct, duplicates, checksum, missing,
                 dropped, dropped_unknown):
            return
        revision = old["revision"] if old else 0
        if old is not None and (old["final"] or old["final_at"]):
            revision += 1
            self.revisions.append(
                (topic, window_start, tier, revision, now_ms, state, count, distinct,
                 completeness, old["state"], old["count"]))
        final_at = old["final_at"] if old and old["final_at"] else (now_ms if final else None)
        unknown = state == UNKNOWN or any(o[4] == UNKNOWN for o in origins)
        self.windows.append(
            # A final window stays final, unless it or one of its origins turns ``unknown``
            # (new records: a late producer report, an origin's first copy through a mirror):
            # it is judged again at every evaluation then, as ``unknown`` windows are, until a
            # verdict holds (seen: a window revised to unknown never judged again when the
            # tier caught up, for nothing marks a window changed when a ``caught_up`` record
            # arrives; and an origin unknown beside another's loss, whose own loss never fired).
            (topic, window_start, tier, window_ms, state,
             int(final or (bool(old and old["final"]) and not unknown)), expected, count,
             distinct, duplicates,
             dropped, dropped_unknown, completeness, hop_completeness, checksum, missing,
             now_ms, final_at, revision))
        if old is not None:          # its origins' rows go (written with it, or never)
            self._flush_origins()
            self.conn.execute("DELETE FROM window_origins WHERE topic = ? AND "
                              "window_start = ? AND tier = ?", (topic, window_start, tier))
        self.origins += origins

    def _flush_origins(self) -> None:
        self.conn.executemany(
            "INSERT INTO window_origins VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", self.origins)
        self.origins = []

    def flush(self) -> None:
        self.conn.executemany(
            "INSERT INTO window_revisions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            self.revisions)
        self.conn.executemany(
            "INSERT OR REPLACE INTO windows VALUES "
            "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", self.windows)
        self._flush_origins()
        self.revisions, self.windows = [], []


def _statements(script: str) -> Iterator[str]:
    """The statements of ``script`` one by one, to run in a transaction (``executescript``
    commits first)."""
    statement = ""
    for line in script.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            yield statement
            statement = ""


def windows_by_topic(windows: list[tuple[str, int]]) -> list[tuple[str, str]]:
    """(topic, the JSON array of its window starts) for each topic among ``windows``."""
    starts: dict[str, list[int]] = {}
    for topic, window_start in windows:
        starts.setdefault(topic, []).append(window_start)
    return [(topic, json.dumps(ws)) for topic, ws in starts.items()]


def plain_figures(text: str) -> dict[tuple[str, int], PlainWindow]:
    """``figures.PLAIN_QUERY``'s text made into figures, for the windows that have count rows
    (anything else it might hold: no figures, and the window is judged from its records)."""
    width = len(PlainWindow._fields)
    return {(topic, window_start): PlainWindow(*figures)
            for topic, window_start, figures in json.loads(text)
            if isinstance(figures, list) and len(figures) == width and figures[0]}


class PlainWindow(NamedTuple):
    """One window's figures from ``figures.PLAIN_QUERY`` (a tuple: made for every window of an
    evaluation: 0.6 µs against 2.4 µs for a frozen dataclass of ten fields)."""
    rows: int
    pairs: int
    triples: int
    not_distinct: int
    unknown_loss: int
    producer_rows: int
    producer_count: int | None
    producer_dropped: int | None
    min_window_ms: int
    max_window_ms: int

    def plain(self, tiers: int) -> bool:
        """Are the window's records plain for a topic judged at ``tiers`` tiers: one record
        per tier and producer origin and none other, each origin's count and checksum the
        same at every tier, distinct the count and no duplicates, no loss of unknown size, one
        window length? Then ``judge`` finds every origin complete at every tier, checksums
        matching (``VerdictWriter.save_plain``). Anything else is judged from the records."""
        n = self.producer_rows
        return n > 0 and self.rows == self.pairs == tiers * n and self.triples == n and \
            not self.not_distinct and not self.unknown_loss and \
            self.min_window_ms == self.max_window_ms


# ``counts``' primary key (window_start, topic, tier, origin, emitter, incarnation) is the first
# six columns of a row of ``_count_row`` or ``_bare_row``.
_WINDOW = itemgetter(0)
_TOPIC = itemgetter(1)


def _count_row(rec: AuditRecord) -> tuple:
    """A count record's row: ``_ROW_COLUMNS``."""
    return (rec.window_start, rec.topic, rec.tier, rec.origin, rec.emitter,
            rec.incarnation or "", rec.window_ms, rec.count, rec.bytes,
            checksum_hex(rec.checksum), rec.distinct, rec.duplicates, rec.dropped,
            _json_text(rec.dropped_reasons), _json_text(rec.dropped_unknown), rec.late, rec.seq,
            rec.emitted_at, rec.skipped, rec.sealed_through, rec.arrived_at)


def _bare_row(rec: AuditRecord) -> tuple:
    """A bare count record's row (``_BARE_COLUMNS``: the rest are at their defaults)."""
    return (rec.window_start, rec.topic, rec.tier, rec.origin, rec.emitter,
            rec.incarnation or "", rec.window_ms, rec.count, rec.bytes,
            checksum_hex(rec.checksum), rec.distinct, rec.duplicates, rec.seq, rec.emitted_at,
            rec.sealed_through, rec.arrived_at)


def _shared_identity(rows: list[tuple], others: list[tuple]) -> bool:
    """Whether a row of ``others`` has the key of one of ``rows``."""
    keys = {row[:6] for row in rows}
    return any(row[:6] in keys for row in others)


def _json_text(d: dict) -> str:
    return json.dumps(d, sort_keys=True) if d else "{}"


# A count row's columns as ``window_records`` reads them: in the order of AuditRecord's fields,
# so that a row becomes a record positionally (half the cost of keywords, for millions of rows).
_RECORD_COLUMNS = ("tier", "origin", "topic", "window_start", "window_ms", "count", "bytes",
                   "checksum", "emitter", "seq", "emitted_at", "dropped", "dropped_reasons",
                   "late", "dropped_unknown", "distinct_count", "duplicates", "incarnation",
                   "skipped", "sealed_through", "arrived_at")
_COLUMNS = ", ".join(_RECORD_COLUMNS)
if tuple(f.name for f in fields(AuditRecord)) != tuple(
        "distinct" if c == "distinct_count" else c for c in _RECORD_COLUMNS):
    raise ImportError("AuditRecord's fields changed: update store._RECORD_COLUMNS")


def _count_record(r: tuple) -> AuditRecord:
    (tier, origin, topic, window_start, window_ms, count, nbytes, checksum, emitter, seq,
     emitted_at, dropped, dropped_reasons, late, dropped_unknown, distinct, duplicates,
     incarnation, skipped, sealed_through, arrived_at) = r
    return AuditRecord(tier, origin, topic, window_start, window_ms, count, nbytes,
                       int(checksum, 16), emitter, seq, emitted_at, dropped,
                       {} if dropped_reasons == "{}" else json.loads(dropped_reasons), late,
                       {} if dropped_unknown == "{}" else json.loads(dropped_unknown),
                       distinct, duplicates, incarnation or None, skipped, sealed_through,
                       arrived_at)


def _union(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    """Two lists of sorted, disjoint inclusive ranges as one."""
    out: list[list[int]] = []
    for lo, hi in sorted([*a, *b]):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return out


def _intersect(a: list[list[int]], b: list[list[int]]) -> list[list[int]]:
    """The numbers in both of two lists of sorted, disjoint inclusive ranges."""
    out: list[list[int]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append([lo, hi])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _subtract(ranges: list[list[int]], minus: list[list[int]]) -> list[tuple[int, int]]:
    """Inclusive ranges less the numbers in ``minus`` (both sorted and disjoint)."""
    out: list[tuple[int, int]] = []
    j = 0
    for a, b in ranges:
        while j < len(minus) and minus[j][1] < a:
            j += 1
        k, start = j, a
        while k < len(minus) and minus[k][0] <= b:
            if minus[k][0] > start:
                out.append((start, minus[k][0] - 1))
            start = max(start, minus[k][1] + 1)
            k += 1
        if start <= b:
            out.append((start, b))
    return out
