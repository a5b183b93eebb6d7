""""The newest record wins", one rule (``record.newer``) for the topic's reader and the
reconciler's database: fed the same records in every order, both keep the same one."""

from __future__ import annotations

import itertools
from operator import attrgetter

import pytest

from audit.contract.collect import AuditState
from audit.contract.record import AuditRecord, Ranges
from audit.reconcile.store import Store
from tests.unit.reconcilekit import END, MIN, T0, W, count, progress


def ranges(seq, at, through):
    return Ranges.of(tier="kafka-local", origin="web-1", origin_incarnation="i",
                     emitter="kafka-local/count", seq=seq, through=through, missing=[],
                     incarnation="k", emitted_at=at)


# Each: three records of one identity, as (seq or batch, emitted_at) pairs that make the order
# matter: a higher seq with an older clock, and a tie on the first field.
CASES = {
    "counts": [count("kafka-local", n, seq=s, at=a) for n, s, a in
               ((10, 5, END + 3 * MIN), (20, 6, END + MIN), (30, 6, END + 2 * MIN))],
    "ranges": [ranges(s, a, t) for s, a, t in
               ((5, END + 3 * MIN, 10), (6, END + MIN, 20), (6, END + 2 * MIN, 30))],
    "progress": [progress(a, batch=b) for b, a in
                 ((9, END + 2 * MIN), (0, END + 3 * MIN), (4, END + 3 * MIN))],
}
# counts and ranges: the highest seq (6), then the later time; progress: the later time (its
# clock, whatever the batch: a job on a new checkpoint counts from 0), then the higher batch.
WINNER = {"counts": 30, "ranges": 30, "progress": 4}


def figure(rec) -> int:
    if isinstance(rec, AuditRecord):
        return rec.count
    if isinstance(rec, Ranges):
        return rec.through
    return rec.batch_id


def stored(store: Store, kind: str) -> int:
    column = {"counts": "count", "ranges": "through", "progress": "batch_id"}[kind]
    rows = store.conn.execute(f"SELECT {column} FROM {kind}").fetchall()
    assert len(rows) == 1
    return rows[0][0]


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_reader_and_the_database_keep_the_same_record_in_any_order(kind, tmp_path):
    expected = WINNER[kind]
    for k, order in enumerate(itertools.permutations(CASES[kind])):
        state = AuditState()
        for rec in order:
            state.add(rec.encode()[1])
        held = {"counts": state.counts, "ranges": state.ranges, "progress": state.progress}[kind]
        assert len(held) == 1 and figure(next(iter(held.values()))) == expected
        store = Store(tmp_path / f"{kind}-{k}.db")
        for rec in order:
            store.apply([rec], {}, {}, "t")
        assert stored(store, kind) == expected
        store.close()


# A bare count record (no drops, late records or skipped copies) and others of its identity:
# ``Store.apply`` writes the two kinds with two statements, and must still keep the newest, and
# of a tie the first to arrive, as the reader does.
MIXED = [count("kafka-local", 10, seq=6, at=END + MIN),
         count("kafka-local", 20, seq=6, at=END + MIN, late=3),
         count("kafka-local", 30, seq=5, at=END + 3 * MIN, dropped=2,
               dropped_reasons={"too_large": 2}),
         count("kafka-local", 40, seq=6, at=END + MIN, dropped_unknown={"deleted_unread": 1})]


@pytest.mark.parametrize("k", range(24))
def test_bare_and_other_records_of_one_identity_in_one_batch_keep_the_first_of_a_tie(k,
                                                                                      tmp_path):
    order = list(itertools.permutations(MIXED))[k]
    state = AuditState()
    for rec in order:
        state.add(rec.encode()[1])
    [held] = state.counts.values()
    assert held.count == next(r.count for r in order if r.seq == 6)   # the first of the tie
    store = Store(tmp_path / "mixed.db")
    store.apply(list(order), {}, {}, "t")
    [got] = store.window_records([("app", held.window_start)])[("app", held.window_start)]
    assert got == held
    store.close()


def test_a_batch_of_bare_and_other_records_stores_every_field_of_each(tmp_path):
    records = [count("producer", 100, "web-1", sealed_through=99),
               count("kafka-local", 90, "web-1", distinct=88, late=2),
               count("kafka-local", 50, "web-2", dropped=1, dropped_reasons={"huge": 1},
                     dropped_unknown={"cut_back_unread": 2}),
               count("warehouse", 0, "web-2", distinct=0, skipped=4),
               count("producer", 60, "web-2", checksum=(1 << 64) - 1),
               count("aggregate", 70, "web-3", window=T0 + W, arrived_at=END + 5 * MIN),
               count("kafka-local", 80, "web-3", late=1, arrived_at=END + 6 * MIN)]
    store = Store(tmp_path / "fields.db")
    store.apply(iter(records), {}, {}, "t")       # any iterable, as the consumer's batch
    got = store.window_records([("app", T0), ("app", T0 + W)])
    key = attrgetter("tier", "origin")
    got = sorted(got[("app", T0)] + got[("app", T0 + W)], key=key)
    assert got == sorted(records, key=key)
    # arrived_at is left out of a record's equality
    assert [r.arrived_at for r in got] == [r.arrived_at for r in sorted(records, key=key)]
    store.close()
