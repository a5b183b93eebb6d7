"""``audit.jobs.intervals.IntervalSet`` against a plain Python set: the same members, duplicates
flagged exactly, gaps listed and totalled, state that round-trips, size in gaps not records."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.jobs.intervals import IntervalSet

batches = st.lists(st.lists(st.integers(0, 300), max_size=80), max_size=8)


@settings(max_examples=300, deadline=None)
@given(batches, st.integers(1, 5))
def test_agrees_with_a_set(batches, limit):
    iv, model = IntervalSet(), set()
    for batch in batches:
        dup = iv.add(np.array(batch, np.int64))
        expected = []
        for n in batch:
            expected.append(n in model)
            model.add(n)
        assert dup.tolist() == expected
        iv = IntervalSet.from_bytes(iv.to_bytes())          # as through a checkpoint
    assert len(iv) == len(model)
    assert iv.through == (max(model) if model else -1)
    assert iv.contains(np.arange(302)).tolist() == [n in model for n in range(302)]
    gaps = [n for n in range(iv.through + 1) if n not in model]
    listed, total = iv.missing(limit)
    assert total == len(gaps)
    flat = [n for a, b in listed for n in range(a, b + 1)]
    assert flat == gaps[:len(flat)] and len(listed) <= limit
    starts, ends = iv.starts, iv.ends
    assert (starts <= ends).all() and (starts[1:] > ends[:-1] + 1).all()   # disjoint, apart


def test_size_grows_with_gaps_not_records():
    iv = IntervalSet()
    rng = np.random.default_rng(1)
    numbers = np.arange(2_000_000)
    numbers = numbers[~np.isin(numbers, [10, 500_000, 1_999_998])]   # three holes
    for chunk in np.array_split(rng.permutation(numbers), 50):
        iv.add(chunk)
    assert iv.intervals == 4 and len(iv.to_bytes()) == 64
    assert iv.missing(10) == ([[10, 10], [500_000, 500_000], [1_999_998, 1_999_998]], 3)


def _runs(numbers: set[int]) -> tuple[np.ndarray, np.ndarray]:
    s = sorted(numbers)
    starts = [n for i, n in enumerate(s) if i == 0 or n - s[i - 1] > 1]
    ends = [n for i, n in enumerate(s) if i == len(s) - 1 or s[i + 1] - n > 1]
    return np.array(starts, np.int64), np.array(ends, np.int64)


@settings(max_examples=300, deadline=None)
@given(batches)
def test_runs_added_say_how_many_numbers_the_set_held(batches):
    iv, model = IntervalSet(), set()
    for batch in batches:
        held = iv.add_runs(*_runs(set(batch)))
        assert held == len(set(batch) & model)
        model |= set(batch)
        assert len(iv) == len(model)
    assert iv.contains(np.arange(302)).tolist() == [n in model for n in range(302)]


@settings(max_examples=300, deadline=None)
@given(st.lists(batches, max_size=4))
def test_groups_of_runs_count_a_number_of_an_earlier_group_as_held(rounds):
    iv, model = IntervalSet(), set()
    for groups in rounds:
        held = iv.add_groups([_runs(set(g)) for g in groups])
        expected = []
        for g in groups:
            expected.append(len(set(g) & model))
            model |= set(g)
        assert held == expected
        assert len(iv) == len(model)
