"""The reconciler's database file: a new one is stamped with its layout, and its count
records are keyed by window first (a window's records, arriving topic after topic, go to the
end of one index); files of older layouts are brought to the current one, keeping what they
hold."""

from __future__ import annotations

import sqlite3

import pytest

from audit.reconcile import store as store_module
from audit.reconcile.store import LAYOUT, Store


def test_a_new_file_has_the_current_layout(tmp_path):
    store = Store(tmp_path / "r.db")
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT
    [(sql,)] = store.conn.execute("SELECT sql FROM sqlite_master WHERE name = 'counts'")
    assert "PRIMARY KEY (window_start, topic, tier, origin, emitter, incarnation)) " \
        "WITHOUT ROWID" in sql
    store.close()


def test_a_layout_1_file_gains_skipped_and_keeps_its_records(tmp_path):
    """Layout 1 had no ``counts.skipped``: opened, the column is added in place, the stored
    records are still read, and a record saying ``skipped`` is kept whole."""
    from audit.contract.record import AuditRecord

    path = tmp_path / "r.db"
    store = Store(path)
    for column in ("skipped", "sealed_through", "arrived_at"):
        store.conn.execute(f"ALTER TABLE counts DROP COLUMN {column}")
    store.conn.execute("INSERT INTO counts VALUES ('warehouse', 'warehouse/land', '', 'o', "
                       "'t', 0, 600000, 5, 50, '0000000000000001', 5, 0, 0, '{}', '{}', 0, "
                       "1, 1)")
    store.conn.execute("PRAGMA user_version = 1")
    store.conn.commit()
    store.close()

    store = Store(path)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT == 7
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
    from audit.reconcile.evaluate import evaluate
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


# Layout 3's two tables that layout 4 clusters, as layout 3 made them.
_LAYOUT_3 = """
CREATE TABLE counts (
    tier TEXT NOT NULL, emitter TEXT NOT NULL, incarnation TEXT NOT NULL, origin TEXT NOT NULL,
    topic TEXT NOT NULL, window_start INTEGER NOT NULL, window_ms INTEGER NOT NULL,
    count INTEGER NOT NULL, bytes INTEGER NOT NULL, checksum TEXT NOT NULL,
    distinct_count INTEGER, duplicates INTEGER, dropped INTEGER NOT NULL,
    dropped_reasons TEXT NOT NULL, dropped_unknown TEXT NOT NULL, late INTEGER NOT NULL,
    seq INTEGER NOT NULL, emitted_at INTEGER NOT NULL, skipped INTEGER,
    PRIMARY KEY (window_start, topic, tier, origin, emitter, incarnation));
CREATE TABLE windows (
    topic TEXT NOT NULL, window_start INTEGER NOT NULL, tier TEXT NOT NULL,
    window_ms INTEGER NOT NULL, state TEXT NOT NULL, final INTEGER NOT NULL,
    expected INTEGER NOT NULL, count INTEGER NOT NULL, distinct_count INTEGER,
    duplicates INTEGER, dropped INTEGER NOT NULL, dropped_unknown TEXT NOT NULL,
    completeness REAL, hop_completeness REAL, checksum TEXT, missing INTEGER NOT NULL,
    changed_at INTEGER NOT NULL, final_at INTEGER, revision INTEGER NOT NULL,
    PRIMARY KEY (topic, window_start, tier));
CREATE INDEX windows_open ON windows (final, topic, window_start);
CREATE TABLE dirty (
    topic TEXT NOT NULL, window_start INTEGER NOT NULL, PRIMARY KEY (topic, window_start));
CREATE TRIGGER counts_dirty_insert AFTER INSERT ON counts BEGIN
    INSERT INTO dirty SELECT new.topic, new.window_start WHERE NOT EXISTS (
        SELECT 1 FROM dirty WHERE topic = new.topic AND window_start = new.window_start); END;
CREATE TRIGGER counts_dirty_update AFTER UPDATE ON counts BEGIN
    INSERT INTO dirty SELECT new.topic, new.window_start WHERE NOT EXISTS (
        SELECT 1 FROM dirty WHERE topic = new.topic AND window_start = new.window_start); END;
CREATE VIEW completeness AS
    SELECT topic, window_start, tier, count, expected AS producer_count, completeness, state,
           final, distinct_count, duplicates, checksum
    FROM windows;
"""


def _layout_3_file(path):
    """A layout-3 file holding two count rows and two verdict rows, one of them not final."""
    conn = sqlite3.connect(path)
    conn.executescript(_LAYOUT_3)
    for i, (topic, final) in enumerate((("a", 1), ("b", 0))):
        conn.execute("INSERT INTO counts VALUES ('producer', 'o/agent', 'i1', 'o', ?, 0, "
                     "600000, ?, 50, '0000000000000001', ?, 0, 0, '{}', '{}', 0, 1, 1, NULL)",
                     (topic, 5 + i, 5 + i))
        conn.execute("INSERT INTO windows VALUES (?, 0, 'producer', 600000, 'complete', ?, "
                     "?, ?, ?, 0, 0, '{}', 1.0, 1.0, 'match', 0, 1, NULL, 0)",
                     (topic, final, 5 + i, 5 + i, 5 + i))
    conn.execute("DELETE FROM dirty")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    return [(t, n) for t, n in (("a", 5), ("b", 6))]


_LAYOUT_3_COLUMNS = {
    "counts": "tier, emitter, incarnation, origin, topic, window_start, window_ms, count, "
              "bytes, checksum, distinct_count, duplicates, dropped, dropped_reasons, "
              "dropped_unknown, late, seq, emitted_at, skipped",
    "windows": "*"}


def _rows(conn) -> dict:
    """Every row of ``counts`` and ``windows``, the columns layout 3 had."""
    return {t: conn.execute(f"SELECT {columns} FROM {t} ORDER BY topic").fetchall()
            for t, columns in _LAYOUT_3_COLUMNS.items()}


def _table_sql(store, name):
    return store.conn.execute("SELECT sql FROM sqlite_master WHERE name = ?",
                              (name,)).fetchone()


def test_a_layout_3_file_is_clustered_and_keeps_its_rows(tmp_path):
    """Opened, a layout-3 file's ``counts`` and ``windows`` become clustered tables holding the
    same rows; ``windows_open`` gives way to ``windows_not_final``; the triggers and the view
    that went with the old tables work again."""
    path = tmp_path / "r.db"
    held = _layout_3_file(path)
    conn = sqlite3.connect(path)
    before = _rows(conn)
    conn.close()
    store = Store(path)
    assert _rows(store.conn) == before
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT == 7
    for name in ("counts", "windows"):
        assert _table_sql(store, name)[0].endswith("WITHOUT ROWID")
    assert _table_sql(store, "windows_open") is None
    assert _table_sql(store, "windows_not_final") is not None
    assert store.conn.execute("SELECT topic, count FROM counts ORDER BY topic").fetchall() == held
    assert store.conn.execute("SELECT topic, producer_count FROM completeness "
                              "ORDER BY topic").fetchall() == held
    assert store.take_windows_to_evaluate() == [("b", 0)]       # not final: judged again
    store.evaluated([("b", 0)])
    from audit.contract.record import AuditRecord
    store.apply([AuditRecord(tier="producer", origin="o", topic="c", window_start=0,
                             window_ms=600000, count=1, bytes=1, checksum=1, emitter="o/agent",
                             seq=1, distinct=1, duplicates=0)], {}, {}, "t")
    assert store.conn.execute("SELECT topic FROM dirty").fetchall() == [("c",)]   # marked by apply
    assert _table_sql(store, "counts_dirty_insert") is None      # layout 7: no trigger
    store.close()


def test_a_layout_3_file_is_left_whole_when_the_rebuild_fails(tmp_path, monkeypatch):
    """The rebuild is one transaction: failing after ``counts`` was rebuilt (here: ``windows``'
    copy cannot be made), the file is still layout 3 with both old tables, and a later open
    rebuilds it."""
    path = tmp_path / "r.db"
    held = _layout_3_file(path)
    monkeypatch.setattr(store_module, "_WINDOWS", "CREATE TABLE IF NOT EXISTS windows (x)")
    with pytest.raises(sqlite3.OperationalError):
        Store(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    assert "WITHOUT ROWID" not in conn.execute(
        "SELECT sql FROM sqlite_master WHERE name = 'counts'").fetchone()[0]
    assert conn.execute("SELECT name FROM sqlite_master WHERE name LIKE '%clustered'"
                        ).fetchall() == []
    conn.close()
    monkeypatch.undo()
    store = Store(path)
    assert store.conn.execute("SELECT topic, count FROM counts ORDER BY topic").fetchall() == held
    assert store.conn.execute("SELECT count(*) FROM windows").fetchone() == (2,)
    store.close()


def test_a_file_another_opener_rebuilt_meanwhile_is_not_rebuilt_again(tmp_path):
    """Two openers read layout 3; the second to get the write lock finds layout 4 and leaves
    the tables as the first made them (rebuilt again, they would be new tables, and the
    running reconciler's count records would meanwhile mark no window dirty)."""
    path = tmp_path / "r.db"
    _layout_3_file(path)
    late = Store.__new__(Store)                 # an opener that read layout 3, then waited
    first = Store(path)

    def roots():
        return first.conn.execute("SELECT name, rootpage FROM sqlite_master WHERE name IN "
                                  "('counts', 'windows') ORDER BY name").fetchall()
    made = roots()
    late.path, late.conn = path, sqlite3.connect(path)
    late._cluster()
    assert roots() == made
    late.conn.close()
    first.close()


def test_a_rebuilt_file_is_whole_without_the_schema_run_after(tmp_path, monkeypatch):
    """Killed after the rebuild's commit, before the open's own ``executescript``: the file
    already has the view and the indexes of layout 4 (the counts' dirty triggers are gone
    since layout 7: ``apply`` marks the windows)."""
    path = tmp_path / "r.db"
    _layout_3_file(path)
    store = Store.__new__(Store)
    store.path, store.conn = path, sqlite3.connect(path)
    store._cluster()
    names = {r[0] for r in store.conn.execute("SELECT name FROM sqlite_master")}
    assert {"completeness", "windows_not_final", "evaluating"} <= names
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == 4
    store.conn.close()


def test_a_tier_has_caught_up_as_far_as_the_least_of_its_live_emitters_current_incarnations(
        tmp_path):
    """Marks per tier whose jobs say they publish them: of each job emitter the incarnation its
    newest progress names (a job on a new checkpoint is caught up with nothing until its own
    first mark, whatever its predecessor's said), of several emitters those whose progress
    arrived within ``stale_ms`` of the tier's newest, each source as far as all of them have
    caught up with it; a tier whose jobs have sent no mark yet is caught up with nothing."""
    from audit.contract.record import CaughtUp, Progress
    from audit.reconcile.verdict import Mark

    def mark(emitter, incarnation, source, seq, delivered, tier="warehouse"):
        return CaughtUp(tier=tier, emitter=emitter, incarnation=incarnation, seq=1,
                        source=source, source_incarnation="a1", source_seq=seq,
                        source_delivered=delivered, emitted_at=1, arrived_at=1)

    def announced(emitter, incarnation, at, tier="warehouse"):
        return Progress(tier=tier, emitter=emitter, batch_id=-1, input_rows_per_s=0.0,
                        processed_rows_per_s=0.0, batch_duration_ms=0, offsets_behind=None,
                        emitted_at=at, publishes_caught_up=True, incarnation=incarnation,
                        arrived_at=at)
    store = Store(tmp_path / "r.db")
    store.apply([
        mark("w/land", "old", "web-1/agent", 90, 900),             # an older checkpoint's
        mark("w/land", "new", "web-1/agent", 5, 50),
        mark("w/land", "new", "web-2/agent", 7, None),
        mark("w/land", "new", "web-1/agent", 4, 60),               # each figure only grows
        mark("w/other", "x", "web-1/agent", 3, 70),
        mark("w/gone", "y", "web-1/agent", 1, 1),
        announced("w/land", "new", 5000), announced("w/other", "x", 4900),
        announced("w/gone", "y", 100),                             # silent: left out
        announced("kafka-local/count", "k", 5000, tier="kafka-local")], {}, {}, "t")
    assert store.caught_up(stale_ms=1000) == {
        "warehouse": {("web-1/agent", "a1"): Mark(3, 60)},         # web-2: not by w/other
        "kafka-local": {}}
    assert store.caught_up(stale_ms=10_000)["warehouse"] == {("web-1/agent", "a1"): Mark(1, 1)}
    store.apply([announced("w/land", "newer", 6000)], {}, {}, "t")     # a new checkpoint
    assert store.caught_up(stale_ms=1000) == {"warehouse": {}, "kafka-local": {}}
    store.close()


# -- marks that come through a mirror (docs/topology.md, "Caught up, across a mirror") ----------
def _local_mark(batch, source_seq, delivered=None, emitter="kafka-local/count", incarnation="j"):
    """kafka-local's job, in its batch ``batch``, has read web-1's reports up to
    ``source_seq``; read on the aggregate, where it came through the mirror."""
    from audit.contract.record import CaughtUp
    return CaughtUp(tier="kafka-local", emitter=emitter, incarnation=incarnation, seq=batch,
                    source="web-1/agent", source_incarnation="i", source_seq=source_seq,
                    source_delivered=delivered, emitted_at=batch, arrived_at=batch)


def _vouch(seq, source="kafka-local/count", incarnation="j", flow="local->aggregate"):
    """The mirror's watcher: every record ``source`` wrote up to its ``seq`` was copied."""
    from audit.contract.record import CaughtUp
    return CaughtUp(tier="mirror", emitter=f"mirror/{flow}", incarnation="w", seq=seq,
                    source=source, source_incarnation=incarnation, source_seq=seq,
                    emitted_at=seq, arrived_at=seq)


def _announced(emitter="kafka-local/count", incarnation="j", at=1):
    from audit.contract.record import Progress
    return Progress(tier="kafka-local", emitter=emitter, batch_id=-1, input_rows_per_s=0.0,
                    processed_rows_per_s=0.0, batch_duration_ms=0, offsets_behind=None,
                    emitted_at=at, publishes_caught_up=True, incarnation=incarnation,
                    arrived_at=at)


def test_a_mirrored_mark_keeps_its_vouched_value_while_its_newest_batch_is_on_its_way(tmp_path):
    """The caught_up row holds the newest batch's figures: while the watcher has vouched only
    for an older batch, the figures it vouched for still count (they were dropped, and every
    verdict of the tier flapped to unknown each time its mark grew)."""
    from audit.reconcile.verdict import Mark
    store = Store(tmp_path / "r.db")
    store.apply([_announced(), _local_mark(1, 3, 30), _vouch(1)], {}, {}, "t")
    assert store.caught_up(1000)["kafka-local"] == {("web-1/agent", "i"): Mark(3, 30)}
    store.apply([_local_mark(2, 5, 50)], {}, {}, "t")            # batch 2's counts on their way
    assert store.caught_up(1000)["kafka-local"] == {("web-1/agent", "i"): Mark(3, 30)}
    store.apply([_vouch(2)], {}, {}, "t")
    assert store.caught_up(1000)["kafka-local"] == {("web-1/agent", "i"): Mark(5, 50)}
    store.close()


def test_a_vouched_mark_is_the_same_whichever_order_the_marks_and_the_vouch_came_in(tmp_path):
    """kafka-local's marks and the watcher's records come in different partitions: a replay
    reads them in another order than the reconciler did, and must rebuild the same rows (here
    batch 2's mark came before the watcher's record for batch 1, or after it, or both after)."""
    from audit.reconcile.verdict import Mark
    m1, m2, v1 = [_local_mark(1, 3, 30)], [_local_mark(2, 5, 50)], [_vouch(1)]
    states = []
    for n, order in enumerate(([m1, m2, v1], [m1, v1, m2], [v1, m1, m2], [m1 + m2 + v1])):
        store = Store(tmp_path / f"r{n}.db")
        for batch in [[_announced()], *order]:
            store.apply(batch, {}, {}, "t")
        states.append((store.conn.execute("SELECT * FROM caught_up ORDER BY tier").fetchall(),
                       store.conn.execute("SELECT * FROM caught_up_unvouched").fetchall(),
                       store.caught_up(1000)))
        store.close()
    assert all(state == states[0] for state in states)
    assert states[0][2]["kafka-local"] == {("web-1/agent", "i"): Mark(3, 30)}


def test_a_row_keeps_its_newest_unvouched_marks_only(tmp_path):
    """Marks no watcher vouches for (a tier read where it is counted, or a watcher far
    behind) do not pile up: each row keeps the ``UNVOUCHED_MARKS`` newest."""
    from audit.reconcile.store import UNVOUCHED_MARKS
    from audit.reconcile.verdict import Mark
    store = Store(tmp_path / "r.db")
    store.apply([_announced(), *(_local_mark(b, b, b) for b in range(1, 21))], {}, {}, "t")
    store.apply([_local_mark(21, 21, 21)], {}, {}, "t")
    assert [b for (b,) in store.conn.execute("SELECT seq FROM caught_up_unvouched")] == \
        list(range(22 - UNVOUCHED_MARKS, 22))
    store.apply([_vouch(19)], {}, {}, "t")
    assert store.caught_up(1000)["kafka-local"] == {("web-1/agent", "i"): Mark(19, 19)}
    assert [b for (b,) in store.conn.execute("SELECT seq FROM caught_up_unvouched")] == [20, 21]
    store.close()


def test_a_new_job_of_a_tier_that_comes_through_a_mirror_waits_for_its_first_vouch(tmp_path):
    """kafka-local's records come through a mirror (its watcher named kafka-local/count). A
    new job of that tier (another emitter) is not named yet: its first marks must wait too
    (trusted, they judged a loss before its counts had come through)."""
    store = Store(tmp_path / "r.db")
    store.apply([_announced(at=1), _local_mark(1, 3, 30), _vouch(1)], {}, {}, "t")
    store.apply([_announced("kafka-local/count-b", "k", at=100_000),
                 _local_mark(1, 9, 90, emitter="kafka-local/count-b", incarnation="k")],
                {}, {}, "t")
    assert store.caught_up(1000)["kafka-local"] == {}
    store.apply([_vouch(1, "kafka-local/count-b", "k")], {}, {}, "t")
    assert list(store.caught_up(1000)["kafka-local"].values())[0].seq == 9
    store.close()


def test_a_tier_named_by_a_mirror_is_mirrored_before_its_job_is_vouched_for(tmp_path):
    """The watcher of the mirror kafka-local -> aggregate has vouched for the agents, not yet
    for kafka-local's job (started after its last round): that job's marks wait."""
    store = Store(tmp_path / "r.db")
    store.apply([_vouch(4, "web-1/agent", "i", flow="kafka-local->aggregate"), _announced(),
                 _local_mark(1, 3, 30)], {}, {}, "t")
    assert store.caught_up(1000)["kafka-local"] == {}
    store.close()


def test_tiers_said_to_come_through_a_mirror_wait_for_a_vouch_before_any_watcher_record(
        tmp_path):
    """The reconciler's graph can say which tiers come through a mirror (a mirror just added:
    its watcher's first round not done yet)."""
    store = Store(tmp_path / "r.db")
    store.apply([_announced(), _local_mark(1, 3, 30)], {}, {}, "t")
    assert store.caught_up(1000)["kafka-local"] != {}                # nothing says otherwise
    assert store.caught_up(1000, mirrored={"kafka-local"})["kafka-local"] == {}
    store.close()


def test_a_layout_5_file_gains_the_vouched_marks(tmp_path):
    """Layout 5 kept no vouched figures: opened, the columns are added in place and filled
    from the marks the watcher covers already."""
    from audit.reconcile.verdict import Mark
    path = tmp_path / "r.db"
    store = Store(path)
    store.apply([_announced(), _local_mark(1, 3, 30), _vouch(1)], {}, {}, "t")
    for column in ("vouched_seq", "vouched_delivered"):
        store.conn.execute(f"ALTER TABLE caught_up DROP COLUMN {column}")
    store.conn.execute("PRAGMA user_version = 5")
    store.conn.commit()
    store.close()
    store = Store(path)
    assert store.conn.execute("PRAGMA user_version").fetchone()[0] == LAYOUT == 7
    store.apply([_local_mark(2, 5, 50)], {}, {}, "t")
    assert store.caught_up(1000)["kafka-local"] == {("web-1/agent", "i"): Mark(3, 30)}
    store.close()


def test_numbers_lost_before_a_hop_of_several_feeders_are_those_no_feeder_has(tmp_path):
    """web-1 moved from dc1 to dc2 within its numbers: dc1 saw 0..49, dc2 50..99 less 70..72.
    The aggregate misses 10..14 and 60..64 (lost at the hop: a feeder had them) and 70..72
    (lost before it: no feeder had them). A union of the feeders' holes hid the first two."""
    from audit.contract.record import Ranges

    def ranges(tier, through, missing):
        return Ranges.of(tier=tier, origin="web-1", origin_incarnation="o",
                         emitter=f"{tier}/count", seq=1, through=through, missing=missing)
    store = Store(tmp_path / "r.db")
    store.apply([ranges("producer", 99, []), ranges("dc1", 49, []),
                 ranges("dc2", 99, [[0, 49], [70, 72]]),
                 ranges("aggregate", 99, [[10, 14], [60, 64], [70, 72]])], {}, {}, "t")
    assert store.missing_ranges("aggregate", "web-1", ("dc1", "dc2")) == \
        ([[10, 14], [60, 64]], 10)
    assert store.missing_ranges("aggregate", "web-1", ("dc2",)) == ([[60, 64]], 5)   # one
    assert store.missing_ranges("aggregate", "web-1") == ([[10, 14], [60, 64], [70, 72]], 13)
    store.close()
