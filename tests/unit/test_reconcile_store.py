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
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT == 3
    assert store.conn.execute("SELECT count(*) FROM evaluating").fetchone() == (0,)
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


def test_a_tier_is_current_only_when_each_of_its_emitters_is(tmp_path):
    """The warehouse's landing query at the end of its input while its counting query had not
    yet counted the landed files: judged on the first alone, whole windows showed as lost."""
    from audit.contract.record import Progress
    from audit.reconcile.service import evaluate
    from tests.unit.reconcilekit import END, JUDGED, MIN, T0, cfg, count

    def progress(emitter, at, behind):
        return Progress(tier="kafka-local", emitter=emitter, batch_id=1, input_rows_per_s=1.0,
                        processed_rows_per_s=1.0, batch_duration_ms=1, offsets_behind=behind,
                        emitted_at=at)

    store = Store(tmp_path / "r.db")
    reported = END + MIN
    store.apply([count("producer", 1000, at=reported), count("kafka-local", 0, at=reported),
                 progress("kafka-local/land-write", JUDGED - MIN, 0),      # read it all
                 progress("kafka-local/land", reported - MIN, None)],       # counted before
                {}, {}, "t")
    assert store.current_progress(3_600_000)["kafka-local"] == (reported - MIN, 0)
    assert store.current_progress(1000)["kafka-local"] == (JUDGED - MIN, 0)   # stale left out
    evaluate(store, cfg(), JUDGED)
    state = store.conn.execute("SELECT state FROM windows WHERE tier = 'kafka-local' AND "
                               "window_start = ?", (T0,)).fetchone()[0]
    assert state == "unknown"
    store.apply([progress("kafka-local/land", JUDGED, None)], {}, {}, "t")   # counted now
    evaluate(store, cfg(), JUDGED + MIN)
    state = store.conn.execute("SELECT state FROM windows WHERE tier = 'kafka-local' AND "
                               "window_start = ?", (T0,)).fetchone()[0]
    assert state == "incomplete"
    store.close()
