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
