"""The reconciler's database file: a new one is stamped with its layout, and its count
records are keyed by window first (a window's records, arriving topic after topic, go to the
end of one index)."""

from __future__ import annotations

from audit.reconcile.store import LAYOUT, Store


def test_a_new_file_has_the_current_layout(tmp_path):
    store = Store(tmp_path / "r.db")
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT
    [(sql,)] = store.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'counts'")
    assert "PRIMARY KEY (window_start, topic, tier, origin, emitter, incarnation)" in sql
    store.close()


def test_a_layout_1_file_gains_skipped_and_keeps_its_records(tmp_path):
    """Layout 1 had no ``counts.skipped``: opened, the column is added in place, the stored
    records are still read, and a record saying ``skipped`` is kept whole."""
    from audit.contract.record import AuditRecord

    path = tmp_path / "r.db"
    store = Store(path)
    store.conn.execute("ALTER TABLE counts DROP COLUMN skipped")
    store.conn.execute("INSERT INTO counts VALUES ('warehouse', 'warehouse/land', '', 'o', "
                       "'t', 0, 600000, 5, 50, '0000000000000001', 5, 0, 0, '{}', '{}', 0, "
                       "1, 1)")
    store.conn.execute("PRAGMA user_version = 1")
    store.conn.commit()
    store.close()

    store = Store(path)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT == 2
    rec = AuditRecord(tier="warehouse", origin="o", topic="t", window_start=0,
                      window_ms=600000, count=0, bytes=0, checksum=0,
                      emitter="warehouse/land-dedup", seq=4, distinct=0, duplicates=0,
                      skipped=3)
    store.apply([rec], {}, {}, "2026-11-23T00:00:00Z")
    rows = store.conn.execute("SELECT emitter, count, skipped FROM counts ORDER BY emitter")
    assert rows.fetchall() == [("warehouse/land", 5, None), ("warehouse/land-dedup", 0, 3)]
    store.close()


def test_a_migration_killed_after_adding_the_column_completes_on_the_next_open(tmp_path):
    path = tmp_path / "r.db"
    Store(path).close()
    store = Store(path)
    store.conn.execute("PRAGMA user_version = 1")        # the column is there, the version not
    store.conn.commit()
    store.close()
    store = Store(path)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT
    store.close()
