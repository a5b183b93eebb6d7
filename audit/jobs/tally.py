"""What a Spark tier has counted, kept by the counting query's driver in SQLite.

Each micro-batch reaches the driver compacted in Spark (``audit.jobs.spark.compacted``): rows
of (origin, origin incarnation, topic, window) — one per group, or one per group and partition
where each partition was compacted alone — with its count, bytes, checksum halves, records
without a number, and its record numbers as runs (sorted, disjoint ``starts``/``ends``, a
number given twice inside a row counted once). ``TallyStore.apply`` adds them to:

- ``windows``: per (origin, topic, window) the cumulative count, bytes, checksum halves,
  duplicates and records without a number;
- ``spaces``: per origin incarnation, the record numbers seen, an ``IntervalSet``.

A number seen before — in the set, earlier in the batch (another row of its group
included), or twice in its own row — is a duplicate of the window its group falls in (groups
are taken in (origin, incarnation, topic, window) order, so which of two windows a number given
in both is a copy of is fixed).

``apply`` runs in a transaction that also records the batch id; the caller writes the batch's
audit records, then ``commit``s (or ``rollback``s when they could not be written). A batch run
again after a crash is therefore either not applied yet (applied, written and committed again,
the same records under the same ``seq``) or applied and written (``apply`` returns None).

Light on purpose (numpy, sqlite3 and the standard library): the tests run it without Spark.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from ..contract.errors import AuditError
from ..contract.record import MASK64, MAX_RANGES
from .intervals import IntervalSet

log = logging.getLogger("docket.audit")

FIGURES = ("n", "bytes", "lo", "hi", "duplicates", "unnumbered")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS windows (
    origin TEXT NOT NULL, topic TEXT NOT NULL, window_start INTEGER NOT NULL,
    n INTEGER NOT NULL, bytes INTEGER NOT NULL, lo INTEGER NOT NULL, hi INTEGER NOT NULL,
    duplicates INTEGER NOT NULL, unnumbered INTEGER NOT NULL,
    PRIMARY KEY (origin, topic, window_start)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS spaces (
    origin TEXT NOT NULL, incarnation TEXT NOT NULL, intervals BLOB NOT NULL,
    PRIMARY KEY (origin, incarnation)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS applied (
    one INTEGER PRIMARY KEY CHECK (one = 1), batch_id INTEGER NOT NULL);
"""


class TallyError(AuditError):
    pass


class TallyStore:
    """One counting query's tallies (``path``: a SQLite file beside its checkpoint)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Spark calls foreachBatch on a thread of its own, one batch at a time
        self.conn = sqlite3.connect(str(self.path), isolation_level=None,
                                    check_same_thread=False)
        self.conn.execute("PRAGMA synchronous = FULL")
        self.conn.executescript(_SCHEMA)

    def applied(self) -> int:
        """The last batch id applied, -1 before the first."""
        row = self.conn.execute("SELECT batch_id FROM applied").fetchone()
        return -1 if row is None else int(row[0])

    def apply(self, batch_id: int, groups: Iterable) -> list[dict] | None:
        """Add a compacted batch (rows with origin, incarnation, topic, window_start, n, bytes,
        lo, hi, unnumbered, starts, ends) in a transaction left open; returns the changed
        windows' cumulative figures (``kind`` count) and the changed number spaces (``kind``
        ranges), or None when ``batch_id`` was applied before (its records were written)."""
        last = self.applied()
        if batch_id <= last:
            return None
        if batch_id != last + 1:
            raise TallyError(
                f"{self.path}: batch {batch_id} comes after batch {last}: the counts of the "
                f"batches between are not in this file (removed, or replaced by an older "
                f"copy?); counting on would leave them out. Count again with a new "
                f"--checkpoint-dir")
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            return self._apply(batch_id, sorted(groups, key=_order))
        except BaseException:
            self.rollback()
            raise

    def commit(self) -> None:
        self.conn.execute("COMMIT")

    def rollback(self) -> None:
        if self.conn.in_transaction:        # SQLite may have ended it itself (a full disk)
            self.conn.execute("ROLLBACK")

    def close(self) -> None:
        self.conn.close()

    def _apply(self, batch_id: int, groups: list) -> list[dict]:
        batch: dict[tuple[str, str, int], list[int]] = {}
        numbered: dict[tuple[str, str], list[tuple[tuple, np.ndarray, np.ndarray]]] = {}
        for g in groups:
            key = (str(g["origin"]), str(g["topic"]), int(g["window_start"]))
            n, unnumbered = int(g["n"]), int(g["unnumbered"])
            t = batch.setdefault(key, [0] * len(FIGURES))
            for i, v in enumerate((n, int(g["bytes"] or 0), int(g["lo"] or 0),
                                   int(g["hi"] or 0), 0, unnumbered)):
                t[i] += v
            if g["starts"]:
                starts = np.asarray(g["starts"], np.int64)
                ends = np.asarray(g["ends"], np.int64)
                t[4] += n - unnumbered - int((ends - starts + 1).sum())   # copies in the group
                numbered.setdefault((key[0], str(g["incarnation"])), []).append(
                    (key, starts, ends))
        spaces = {}
        for (origin, inc), runs in numbered.items():
            space = spaces[(origin, inc)] = self._space(origin, inc)
            for key, held in zip((k for k, _s, _e in runs), space.add_groups(
                    [(s, e) for _k, s, e in runs]), strict=True):
                batch[key][4] += held
        rows = self._add_windows(batch)
        self.conn.executemany(
            "INSERT OR REPLACE INTO spaces VALUES (?, ?, ?)",
            [(*k, iv.to_bytes()) for k, iv in spaces.items()])
        self.conn.execute("INSERT OR REPLACE INTO applied VALUES (1, ?)", (batch_id,))
        return rows + [_ranges_row(origin, inc, iv) for (origin, inc), iv in spaces.items()]

    def _add_windows(self, batch: dict[tuple[str, str, int], list[int]]) -> list[dict]:
        """The batch's figures added to the windows' (the checksum halves carried into one
        64-bit sum, which is all ``combine_halves`` keeps: no total outgrows SQLite's
        integers); returns the changed windows' new figures."""
        self.conn.execute("CREATE TEMP TABLE IF NOT EXISTS changed (origin TEXT, topic TEXT, "
                          "window_start INTEGER)")
        self.conn.execute("DELETE FROM changed")
        self.conn.executemany("INSERT INTO changed VALUES (?, ?, ?)", list(batch))
        for row in self.conn.execute(
                f"SELECT origin, topic, window_start, {', '.join(FIGURES)} FROM changed "
                f"JOIN windows USING (origin, topic, window_start)"):
            t = batch[row[:3]]
            for i, v in enumerate(row[3:]):
                t[i] += v
        out = []
        for (origin, topic, window), t in sorted(batch.items()):
            checksum = ((t[3] << 32) + t[2]) & MASK64
            t[2], t[3] = checksum & 0xFFFFFFFF, checksum >> 32
            out.append({"kind": "count", "origin": origin, "topic": topic,
                        "window_start": window, **dict(zip(FIGURES, t, strict=True))})
        self.conn.executemany(
            "INSERT OR REPLACE INTO windows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(r["origin"], r["topic"], r["window_start"], *(r[f] for f in FIGURES))
             for r in out])
        return out

    def take_over(self, batch_id: int,
                  origins: Iterable[tuple[str, dict, dict]]) -> tuple[int, int]:
        """Tallies kept elsewhere through ``batch_id`` (the former counting's Spark state: per
        origin, its windows as {"topic\\0window": figures} and its number spaces as
        {incarnation: ``IntervalSet`` bytes}) into this empty store, in one transaction.
        Returns (windows, number spaces) taken."""
        if self.applied() != -1:
            raise TallyError(f"{self.path} already holds batches up to {self.applied()}: "
                             f"tallies from elsewhere would count them twice")
        windows = spaces = 0
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            for origin, origin_windows, origin_spaces in origins:
                for key, figures in origin_windows.items():
                    topic, window = key.split("\x00")
                    self.conn.execute("INSERT INTO windows VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                                      (origin, topic, int(window), *figures))
                    windows += 1
                for inc, raw in origin_spaces.items():
                    self.conn.execute("INSERT INTO spaces VALUES (?, ?, ?)", (origin, inc, raw))
                    spaces += 1
            self.conn.execute("INSERT OR REPLACE INTO applied VALUES (1, ?)", (batch_id,))
        except BaseException:
            self.rollback()
            raise
        self.commit()
        return windows, spaces

    def _space(self, origin: str, incarnation: str) -> IntervalSet:
        row = self.conn.execute("SELECT intervals FROM spaces WHERE origin = ? AND "
                                "incarnation = ?", (origin, incarnation)).fetchone()
        return IntervalSet.from_bytes(row[0] if row else None)

    def size(self) -> dict:
        """What the file holds: number spaces, their intervals, bytes (the windows are left
        uncounted: a count of a fleet's months of windows would take a while every batch)."""
        spaces, raw = self.conn.execute("SELECT count(*), coalesce(sum(length(intervals)), 0) "
                                        "FROM spaces").fetchone()
        return {"spaces": spaces, "intervals": raw // 16, "bytes": self.path.stat().st_size}


def _order(g) -> tuple:
    return (str(g["origin"]), str(g["incarnation"]), str(g["topic"]), int(g["window_start"]))


def _ranges_row(origin: str, incarnation: str, space: IntervalSet) -> dict:
    missing, total = space.missing(MAX_RANGES)
    return {"kind": "ranges", "origin": origin, "incarnation": incarnation,
            "through": space.through, "missing": json.dumps(missing), "missing_total": total,
            "missing_truncated": total > sum(b - a + 1 for a, b in missing)}


TALLY_FILE = "count-tally.sqlite"       # beside the counting query's checkpoint
SPARK_STATE_READ = "state-read-into-tallies"   # Spark's former state, once read into them


def batch_ids(log_folder: Path) -> list[int]:
    """The batch ids a Spark checkpoint's log folder (``offsets``, ``commits``) holds."""
    try:
        return sorted(int(p.name) for p in log_folder.iterdir() if p.name.isdigit())
    except FileNotFoundError:
        return []


def ensure_tallies(spark, checkpoint: Path, store: TallyStore) -> None:
    """Before the counting query starts on ``checkpoint``: ``store`` must hold every batch
    Spark committed there and none it has not begun. A checkpoint of the counting that kept
    its tallies in Spark's own state (before they moved to the driver) has them read into
    ``store`` once (Spark's state reader, at its last committed batch)."""
    committed = batch_ids(checkpoint / "commits")
    begun = batch_ids(checkpoint / "offsets")
    last_commit = committed[-1] if committed else -1
    last_begun = begun[-1] if begun else -1
    applied = store.applied()
    if applied > last_begun:
        raise TallyError(
            f"{store.path} holds batches up to {applied}, but the checkpoint {checkpoint} "
            f"only {last_begun + 1}: the checkpoint was removed or replaced while the tallies "
            f"were kept; restore the checkpoint, or count again with a new --checkpoint-dir")
    spark_state = checkpoint / "state"
    if applied < last_commit and applied == -1 and spark_state.is_dir():
        _read_spark_state(spark, checkpoint, last_commit, store)
        applied = last_commit
    if applied >= last_commit:
        if spark_state.is_dir():
            # Spark refuses a query whose checkpoint holds another query's state operators;
            # the state read (this start or one cut short after the read) is kept beside it
            spark_state.rename(checkpoint / SPARK_STATE_READ)
            log.warning("Spark's former state in %s moved to %s", spark_state,
                        checkpoint / SPARK_STATE_READ)
        return
    raise TallyError(
        f"{store.path} holds batches up to {applied}, but the checkpoint {checkpoint} "
        f"committed {last_commit}: the counts between are lost; count again with a new "
        f"--checkpoint-dir")


def _read_spark_state(spark, checkpoint: Path, batch_id: int, store: TallyStore) -> None:
    """The per-origin state the counting kept in Spark (windows and number spaces as JSON,
    ``audit.jobs.tally`` before 2026-12-05) at ``batch_id``, into ``store``."""
    import base64

    try:
        state = (spark.read.format("statestore").option("batchId", batch_id)
                 .load(str(checkpoint)).select("key.origin", "value.groupState.windows",
                                               "value.groupState.spaces"))
    except Exception as exc:                # Spark's AnalysisException, py4j's errors
        raise TallyError(
            f"the checkpoint {checkpoint} holds Spark state that is not the former counting's "
            f"(a checkpoint made with --no-identity, or by another job?): "
            f"{str(exc).splitlines()[0][:300]}; count with the options it was made with, or "
            f"count again with a new --checkpoint-dir") from exc
    windows, spaces = store.take_over(batch_id, (
        (row["origin"], json.loads(row["windows"] or "{}"),
         {inc: base64.b64decode(raw) for inc, raw in json.loads(row["spaces"] or "{}").items()})
        for row in state.toLocalIterator()))
    log.warning("the tallies of %s (%d window(s), %d number space(s), through batch %d) were "
                "read from Spark's state into %s; the counting keeps them there from now on",
                checkpoint, windows, spaces, batch_id, store.path)
