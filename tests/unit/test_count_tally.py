"""``audit.jobs.tally.TallyStore``, the counting query's tallies on the driver, against a
record-by-record model: batches compacted as Spark's ``compact`` does (a row per origin,
incarnation, topic and window, numbers as runs) give exactly the counts, duplicates (within a
group, across groups of a batch, across batches), records without numbers and missing ranges
of counting every record; a batch is applied once, whatever happens between the store's commit
and Spark's; a store and a checkpoint that disagree are refused."""

from __future__ import annotations

import json
import random

import pytest

from audit.contract.record import combine_halves
from audit.jobs.tally import TallyError, TallyStore, ensure_tallies


def compacted(records: list[tuple]) -> list[dict]:
    """What ``audit.jobs.spark.compact`` makes of records (origin, incarnation, seq, topic,
    window_start, len, lo, hi), in Python."""
    groups: dict[tuple, dict] = {}
    for origin, inc, seq, topic, window, length, lo, hi in records:
        g = groups.setdefault((origin, inc, topic, window), {
            "origin": origin, "incarnation": inc, "topic": topic, "window_start": window,
            "n": 0, "bytes": 0, "lo": 0, "hi": 0, "unnumbered": 0, "seqs": []})
        g["n"] += 1
        g["bytes"] += length
        g["lo"] += lo
        g["hi"] += hi
        if seq < 0:
            g["unnumbered"] += 1
        else:
            g["seqs"].append(seq)
    out = []
    for g in groups.values():
        s = sorted(g.pop("seqs"))
        g["starts"] = [n for i, n in enumerate(s) if i == 0 or n - s[i - 1] > 1]
        g["ends"] = [n for i, n in enumerate(s) if i == len(s) - 1 or s[i + 1] - n > 1]
        out.append(g)
    random.Random(len(out)).shuffle(out)          # Spark gives them in no order
    return out


class Model:
    """Every record counted one by one: a batch's records in (origin, incarnation, topic,
    window) order, a number seen before a duplicate of the window it comes in."""

    def __init__(self):
        self.windows: dict[tuple, list[int]] = {}
        self.seen: dict[tuple, set[int]] = {}

    def add(self, records: list[tuple]) -> None:
        for origin, inc, seq, topic, window, length, lo, hi in sorted(
                records, key=lambda r: (r[0], r[1], r[3], r[4])):
            t = self.windows.setdefault((origin, topic, window), [0] * 6)
            seen = self.seen.setdefault((origin, inc), set())
            dup = seq >= 0 and seq in seen
            if seq >= 0:
                seen.add(seq)
            for i, v in enumerate((1, length, lo, hi, int(dup), int(seq < 0))):
                t[i] += v

    def missing(self, origin: str, inc: str) -> tuple[int, list[int]]:
        seen = self.seen[(origin, inc)]
        return max(seen), [n for n in range(max(seen)) if n not in seen]


def batch(rng: random.Random, next_seq: dict, size: int) -> list[tuple]:
    records = []
    for _ in range(size):
        origin = rng.choice(["a", "b", "c"])
        inc = rng.choice(["i1", "i2"]) if origin == "c" else "i1"
        r = rng.random()
        if r < 0.05:
            seq = -1                                    # no number
        elif r < 0.15 and next_seq.get((origin, inc)):
            seq = rng.randrange(next_seq[(origin, inc)])    # again: a copy
        else:
            seq = next_seq.get((origin, inc), 0)
            next_seq[(origin, inc)] = seq + rng.choice([1, 1, 1, 2, 5])  # some left out
        records.append((origin, inc, seq, rng.choice(["t1", "t2"]),
                        rng.choice([0, 600_000, 1_200_000]), rng.randrange(200),
                        rng.randrange(1 << 32), rng.randrange(1 << 32)))
    return records


def in_partitions(records: list[tuple], rng: random.Random, parts: int) -> list[dict]:
    """What the jobs' Java makes of records read from ``parts`` partitions
    (``PartitionRuns.java``): each partition compacted alone, a group in several of them as
    several rows, a number copied across two of them in both."""
    split: list[list[tuple]] = [[] for _ in range(parts)]
    for r in records:
        split[rng.randrange(parts)].append(r)
    return [g for part in split for g in compacted(part)]


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("seed", range(20))
def test_compacted_batches_count_exactly_what_counting_each_record_counts(tmp_path, seed,
                                                                          parts):
    rng = random.Random(seed)
    store, model, next_seq = TallyStore(tmp_path / "t.sqlite"), Model(), {}
    emitted: dict[tuple, dict] = {}
    ranges: dict[tuple, dict] = {}
    for batch_id in range(12):
        records = batch(rng, next_seq, rng.randrange(0, 300))
        if batch_id % 4 == 3 and records:
            records += records[: len(records) // 3]     # a batch with copies inside it
        model.add(records)
        rows = store.apply(batch_id, in_partitions(records, rng, parts))
        store.commit()
        for r in rows:
            if r["kind"] == "count":
                emitted[(r["origin"], r["topic"], r["window_start"])] = r
            else:
                ranges[(r["origin"], r["incarnation"])] = r
        if seed % 3 == 0:                               # the store closed and opened again
            store.close()
            store = TallyStore(tmp_path / "t.sqlite")
    assert set(emitted) == set(model.windows)
    for key, t in model.windows.items():
        r = emitted[key]
        assert [r[f] for f in ("n", "bytes", "duplicates", "unnumbered")] == \
            [t[0], t[1], t[4], t[5]], key
        assert combine_halves(r["lo"], r["hi"]) == combine_halves(t[2], t[3]), key
    assert set(ranges) == set(model.seen)
    for (origin, inc), r in ranges.items():
        through, gaps = model.missing(origin, inc)
        assert r["through"] == through
        assert r["missing_total"] == len(gaps)
        listed = [n for a, b in json.loads(r["missing"]) for n in range(a, b + 1)]
        assert listed == gaps[: len(listed)]
    assert sum(t[4] for t in model.windows.values()) > 0       # copies were there to count


def test_a_batch_rolled_back_is_applied_again_the_same_and_one_committed_is_not(tmp_path):
    store = TallyStore(tmp_path / "t.sqlite")
    first = [("a", "i", s, "t", 0, 10, 1, 2) for s in range(100)]
    assert store.apply(0, compacted(first)) is not None
    store.commit()
    second = [("a", "i", s, "t", 0, 10, 1, 2) for s in range(50, 150)]
    rows = store.apply(1, compacted(second))
    store.rollback()                                    # its records could not be written
    assert store.applied() == 0
    assert store.apply(1, compacted(second)) == rows   # run again: the same figures
    store.commit()
    assert store.apply(1, compacted(second)) is None    # Spark runs it again after a stop
    counted = [r for r in rows if r["kind"] == "count"][0]
    assert (counted["n"], counted["duplicates"]) == (200, 50)


def test_checksum_halves_past_what_an_integer_holds_keep_the_checksum(tmp_path):
    """A long window's sums of 32-bit halves outgrow SQLite's 64-bit integers (about 2^31
    records): the stored halves are carried into the one 64-bit sum the checksum keeps."""
    store = TallyStore(tmp_path / "t.sqlite")
    lo = hi = 0
    for batch_id in range(40):
        big = (1 << 62) + batch_id            # a batch's sums as Spark gives them
        group = {"origin": "a", "incarnation": "i", "topic": "t", "window_start": 0, "n": 1,
                 "bytes": 1, "lo": big, "hi": big, "unnumbered": 1, "starts": [], "ends": []}
        rows = store.apply(batch_id, [group])
        store.commit()
        lo, hi = lo + big, hi + big
        (r,) = rows
        assert 0 <= r["lo"] < 1 << 32 and 0 <= r["hi"] < 1 << 32
        assert combine_halves(r["lo"], r["hi"]) == combine_halves(lo, hi)
    assert lo > 1 << 63


def test_a_batch_after_a_gap_is_refused(tmp_path):
    store = TallyStore(tmp_path / "t.sqlite")
    store.apply(0, [])
    store.commit()
    with pytest.raises(TallyError, match="batch 2 comes after batch 0"):
        store.apply(2, [])
    assert store.applied() == 0


def _checkpoint(folder, begun: int, committed: int, state: bool = False):
    for name, last in (("offsets", begun), ("commits", committed)):
        (folder / name).mkdir(parents=True, exist_ok=True)
        for i in range(last + 1):
            (folder / name / str(i)).write_text("v1\n")
            (folder / name / f".{i}.crc").write_text("")
    if state:
        (folder / "state").mkdir()
    return folder


def test_a_store_and_a_checkpoint_that_disagree_are_refused(tmp_path):
    store = TallyStore(tmp_path / "t.sqlite")
    for i in range(3):
        store.apply(i, [])
        store.commit()
    ensure_tallies(None, _checkpoint(tmp_path / "same", 2, 2), store)
    ensure_tallies(None, _checkpoint(tmp_path / "uncommitted", 2, 1), store)  # Spark's next
    with pytest.raises(TallyError, match="the checkpoint was removed or replaced"):
        ensure_tallies(None, tmp_path / "none", store)
    with pytest.raises(TallyError, match="committed 5: the counts between are lost"):
        ensure_tallies(None, _checkpoint(tmp_path / "ahead", 5, 5), store)
    fresh = TallyStore(tmp_path / "fresh.sqlite")
    with pytest.raises(TallyError, match="committed 1"):
        ensure_tallies(None, _checkpoint(tmp_path / "no-state", 1, 1), fresh)
    ensure_tallies(None, tmp_path / "new", fresh)        # a new job: nothing to hold


def test_tallies_taken_over_count_on_as_if_counted_here(tmp_path):
    """The former counting's tallies (per origin: windows and number spaces, as Spark's state
    kept them) taken over at their batch, then the next batch applied: the same figures as
    counting both batches here — and taken over only into an empty store."""
    first = [("a", "i", s, "t", 0, 10, 1, 2) for s in range(100)]
    second = [("a", "i", s, "t", 0, 10, 1, 2) for s in range(50, 150)]
    here = TallyStore(tmp_path / "here.sqlite")
    for batch_id, records in enumerate((first, second)):
        expected = here.apply(batch_id, compacted(records))
        here.commit()
    windows = {f"{topic}\x00{window}": list(figures) for _o, topic, window, *figures in
               here.conn.execute("SELECT * FROM windows")}
    taken = TallyStore(tmp_path / "taken.sqlite")
    former = TallyStore(tmp_path / "former.sqlite")
    former.apply(0, compacted(first))
    former.commit()
    state = [("a", {f"{t}\x00{w}": list(f) for _o, t, w, *f in
                    former.conn.execute("SELECT * FROM windows")},
              {inc: raw for _o, inc, raw in former.conn.execute("SELECT * FROM spaces")})]
    assert taken.take_over(0, state) == (1, 1)
    assert taken.applied() == 0
    assert taken.apply(1, compacted(second)) == expected
    taken.commit()
    assert {f"{t}\x00{w}": list(f) for _o, t, w, *f in
            taken.conn.execute("SELECT * FROM windows")} == windows
    with pytest.raises(TallyError, match="already holds batches up to 1"):
        taken.take_over(1, state)
