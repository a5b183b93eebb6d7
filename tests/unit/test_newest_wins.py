""""The newest record wins", one rule (``record.newer``) for the topic's reader and the
reconciler's database: fed the same records in every order, both keep the same one."""

from __future__ import annotations

import itertools

import pytest

from audit.contract.collect import AuditState
from audit.contract.record import AuditRecord, Ranges
from audit.reconcile.store import Store
from tests.unit.reconcilekit import END, MIN, count, progress


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
