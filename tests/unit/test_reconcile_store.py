"""The reconciler's database file across a change of its layout: a file written before counts
were keyed by window is rebuilt once when opened, with the same rows in the same order."""

from __future__ import annotations

import sqlite3

from audit.contract.record import AuditRecord
from audit.reconcile.store import LAYOUT, Store

W = 600_000
T0 = 1_763_766_000_000

LAYOUT_0_COUNTS = """
CREATE TABLE counts (
    tier TEXT NOT NULL, emitter TEXT NOT NULL, incarnation TEXT NOT NULL, origin TEXT NOT NULL,
    topic TEXT NOT NULL, window_start INTEGER NOT NULL, window_ms INTEGER NOT NULL,
    count INTEGER NOT NULL, bytes INTEGER NOT NULL, checksum TEXT NOT NULL,
    distinct_count INTEGER, duplicates INTEGER, dropped INTEGER NOT NULL,
    dropped_reasons TEXT NOT NULL, dropped_unknown TEXT NOT NULL, late INTEGER NOT NULL,
    seq INTEGER NOT NULL, emitted_at INTEGER NOT NULL,
    PRIMARY KEY (tier, emitter, incarnation, origin, topic, window_start));
CREATE INDEX counts_window ON counts (topic, window_start);
"""


def count(tier, topic, window, n, seq=1):
    return AuditRecord(tier=tier, origin="web-1", topic=topic, window_start=T0 + window * W,
                       window_ms=W, count=n, bytes=n, checksum=n,
                       emitter=f"{tier}/x", seq=seq, emitted_at=T0 + (window + 1) * W,
                       distinct=n, duplicates=0, incarnation="i")


def rows(path):
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT rowid, * FROM counts ORDER BY rowid").fetchall()
    finally:
        conn.close()


def test_a_file_from_before_counts_were_keyed_by_window_is_rebuilt_with_the_same_rows(tmp_path):
    path = tmp_path / "r.db"
    conn = sqlite3.connect(path)
    conn.executescript(LAYOUT_0_COUNTS)
    for i, (tier, topic, window) in enumerate([("warehouse", "b", 1), ("producer", "a", 2),
                                               ("kafka", "a", 0), ("producer", "b", 0)]):
        conn.execute("INSERT INTO counts VALUES (?, ?, 'i', 'web-1', ?, ?, ?, ?, ?, ?, ?, 0, 0,"
                     " '{}', '{}', 0, 1, ?)", (tier, f"{tier}/x", topic, T0 + window * W, W,
                                               10 + i, 10 + i, f"{10 + i:016x}", 10 + i, T0))
    conn.commit()
    conn.close()
    before = rows(path)

    store = Store(path)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT
    assert rows(path) == before                            # rows and rowids
    assert store.conn.execute("SELECT name FROM sqlite_master WHERE name = 'counts_window'"
                              ).fetchone() is None
    store.apply([count("producer", "a", 2, 99, seq=2)], {}, {("audit", 0): 1}, "t")
    assert [r[8] for r in rows(path)] == [10, 99, 12, 13]  # updated in place, not added
    assert store.conn.execute("SELECT * FROM dirty").fetchall() == [("a", T0 + 2 * W)]
    assert [r.count for r in store.window_records([("b", T0), ("a", T0 + 2 * W)])[
        ("a", T0 + 2 * W)]] == [99]
    store.close()
    Store(path).close()                                    # opened again: nothing to do
    assert rows(path)[1][8] == 99


def test_a_new_file_has_the_current_layout(tmp_path):
    store = Store(tmp_path / "r.db")
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT
    [(sql,)] = store.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'counts'")
    assert "PRIMARY KEY (window_start, topic, tier, origin, emitter, incarnation)" in sql
    store.close()
