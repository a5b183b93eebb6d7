"""``land --dedup`` without Spark: the per-origin step that lets each record through once, and
the batch commit that lands each batch once however often it runs or wherever it dies."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pandas as pd
import pytest

from audit.contract.record import AuditRecord, combined, parse
from audit.jobs.dedup import LANDED_COLUMNS, OriginDedup
from audit.jobs.landing import (
    DEDUP_MODE,
    FILE_SINK_MODE,
    BatchLanding,
    LandingError,
    claim_mode,
)

W = 600_000


def keep(d: OriginDedup, frames: list) -> pd.DataFrame:
    outs = list(d.keep("o", frames))
    return pd.concat([f for f in outs if len(f)] or outs[-1:], ignore_index=True)


def frame(rows: list[tuple[str, int, str, int]]) -> pd.DataFrame:
    """(incarnation, seq, topic, window index) → the step's input columns."""
    n = len(rows)
    return pd.DataFrame({
        "partition": [0] * n, "offset": list(range(n)),
        "timestamp": pd.to_datetime([w * W + 1 for _i, _s, _t, w in rows], unit="ms"),
        "key": [None] * n, "value": [f"{i}:{s}".encode() for i, s, _t, _w in rows],
        "origin": ["o"] * n, "incarnation": [i for i, _s, _t, _w in rows],
        "seq": [s for _i, s, _t, _w in rows], "topic": [t for _i, _s, t, _w in rows],
        "date": ["1970-01-01"] * n, "hour": [0] * n,
        "window_start": [w * W for _i, _s, _t, w in rows]})


def test_each_number_passes_once_across_batches_and_incarnations():
    d = OriginDedup.load(None, None)
    first = keep(d, [frame([("a", 0, "t", 0), ("a", 1, "t", 0), ("a", 1, "t", 0),
                                ("b", 1, "t", 0), ("a", -1, "t", 0), ("a", -1, "t", 0)])])
    rows = first[first["kind"] == "row"]
    # a/1 twice in one batch: once; b/1 is another number space; unnumbered records all pass
    assert sorted(zip(rows["incarnation"], rows["seq"], strict=True)) == \
        [("a", -1), ("a", -1), ("a", 0), ("a", 1), ("b", 1)]
    assert list(rows.columns[:len(LANDED_COLUMNS)]) == LANDED_COLUMNS
    tallies = first[first["kind"] == "skipped"]
    assert tallies[["topic", "window_start", "skipped"]].values.tolist() == [["t", 0, 1]]

    # The state goes through its text form, as Spark keeps it between batches.
    d = OriginDedup.load(*d.dump())
    second = keep(d, [frame([("a", 0, "t", 0), ("a", 2, "t", 1), ("b", 1, "u", 1)]),
                          frame([("a", 1, "t", 0)])])
    rows = second[second["kind"] == "row"]
    assert list(zip(rows["incarnation"], rows["seq"], strict=True)) == [("a", 2)]
    tallies = second[second["kind"] == "skipped"]
    # cumulative per (topic, window): t/0 had 1 copy before, 2 now
    assert sorted(tallies[["topic", "window_start", "skipped"]].values.tolist()) == \
        [["t", 0, 3], ["u", W, 1]]
    assert d.size()["intervals"] == 2            # a: 0-2, b: 1


def test_a_batch_of_copies_only_lands_nothing_and_tallies_them():
    d = OriginDedup.load(None, None)
    keep(d, [frame([("a", s, "t", 0) for s in range(100)])])
    out = keep(d, [frame([("a", s, "t", 0) for s in range(50, 100)])])
    assert (out["kind"] == "skipped").all() and out["skipped"].tolist() == [50]
    assert keep(d, []).empty


def test_frames_are_taken_one_at_a_time_and_the_state_is_final_before_the_tallies():
    """A batch comes as several frames: each is answered before the next is read (memory: one
    frame), a copy in a later frame of the same batch is still a copy, and ``done`` (where the
    job saves the state) runs before the tallies are yielded."""
    d = OriginDedup.load(None, None)
    read, events = [], []

    def frames():
        for part in ([("a", 0, "t", 0), ("a", 1, "t", 0)], [("a", 1, "t", 0), ("a", 2, "t", 0)]):
            read.append(len(part))
            yield frame(part)

    outs = d.keep("o", frames(), done=lambda: events.append(("done", len(read))))
    first = next(outs)
    assert len(read) == 1 and first["seq"].tolist() == [0, 1]
    second = next(outs)
    assert second["seq"].tolist() == [2]
    last = next(outs)
    assert events == [("done", 2)]
    assert last[["kind", "skipped"]].values.tolist() == [["skipped", 1]]
    assert list(outs) == []


def _writer(rows_by_partition: dict[str, int], fail_after: int | None = None):
    """A stand-in for Spark's batch write: partition folders of files named anew by every
    attempt (as Spark's are), then _SUCCESS (not reached when ``fail_after`` files were
    written)."""
    def write(folder: Path) -> None:
        written = 0
        attempt = uuid.uuid4().hex[:8]
        for part, n in rows_by_partition.items():
            (folder / part).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                if fail_after is not None and written == fail_after:
                    raise RuntimeError("the job died while writing")
                (folder / part / f"part-{i:05d}-{attempt}.parquet").write_text(f"{part} {i}")
                (folder / part / f".part-{i:05d}.parquet.crc").write_text("crc")
                written += 1
        (folder / "_SUCCESS").write_text("")
    return write


def _table(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / "data").rglob("*") if p.is_file())


def test_a_batch_lands_once_however_often_it_runs(tmp_path):
    landing = BatchLanding(tmp_path / "wh", tmp_path / "ckpt", "inc1")
    write = _writer({"topic=t/date=d/hour=1": 2, "topic=u/date=d/hour=1": 1})
    assert landing.land(0, write) == 3
    table = _table(tmp_path / "wh")
    assert [t.split("-part")[0] for t in table] == [
        "data/topic=t/date=d/hour=1/inc1-b0", "data/topic=t/date=d/hour=1/inc1-b0",
        "data/topic=u/date=d/hour=1/inc1-b0"]
    assert landing.land(0, write) is None         # run again: landed before
    assert landing.land(1, _writer({"topic=t/date=d/hour=2": 1})) == 1
    assert len(_table(tmp_path / "wh")) == 4
    assert not list((tmp_path / "wh" / "_staging").iterdir())


def test_a_write_that_died_is_written_again_and_nothing_of_it_landed(tmp_path):
    landing = BatchLanding(tmp_path / "wh", tmp_path / "ckpt", "inc1")
    with pytest.raises(RuntimeError):
        landing.land(0, _writer({"topic=t/date=d/hour=1": 3}, fail_after=2))
    assert _table(tmp_path / "wh") == []
    assert landing.land(0, _writer({"topic=t/date=d/hour=1": 3})) == 3
    # the first attempt's two files were removed, not landed beside the second's three
    assert len(_table(tmp_path / "wh")) == 3


def test_moves_cut_short_are_finished_not_redone(tmp_path, monkeypatch):
    """The job dies after moving one of three files: the run again moves the other two, and
    never writes the batch again (new file names would land its rows twice)."""
    landing = BatchLanding(tmp_path / "wh", tmp_path / "ckpt", "inc1")
    real_rename = os.rename
    calls = []

    def dying_rename(src, dst):
        if len(calls) == 1:
            raise KeyboardInterrupt("SIGKILL stand-in")
        calls.append(dst)
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", dying_rename)
    with pytest.raises(KeyboardInterrupt):
        landing.land(0, _writer({"topic=t/date=d/hour=1": 3}))
    monkeypatch.setattr(os, "rename", real_rename)
    assert len(_table(tmp_path / "wh")) == 1
    assert landing.committed() == -1

    def must_not_write(folder):
        raise AssertionError("a batch with _SUCCESS in staging was written again")

    assert landing.land(0, must_not_write) == 2
    assert len(_table(tmp_path / "wh")) == 3 and landing.committed() == 0


@pytest.mark.parametrize("dies", ["before_marker", "before_clean"])
def test_a_kill_after_the_last_move_lands_nothing_twice(tmp_path, monkeypatch, dies):
    """Killed after every file moved but before the marker (the batch is staged with
    _SUCCESS and empty: the run again moves nothing and commits), or after the marker but
    before the staging folder went (the run again is a no-op and the folder is cleaned by the
    next batch)."""
    landing = BatchLanding(tmp_path / "wh", tmp_path / "ckpt", "inc1")
    target = {"before_marker": Path, "before_clean": BatchLanding}[dies]
    name = {"before_marker": "replace", "before_clean": "_clean"}[dies]
    real = getattr(target, name)

    def dying(*a, **k):
        raise KeyboardInterrupt("SIGKILL stand-in")

    monkeypatch.setattr(target, name, dying)
    with pytest.raises(KeyboardInterrupt):
        landing.land(0, _writer({"topic=t/date=d/hour=1": 3}))
    monkeypatch.setattr(target, name, real)
    assert len(_table(tmp_path / "wh")) == 3

    def must_not_write(folder):
        raise AssertionError("written again")

    again = BatchLanding(tmp_path / "wh", tmp_path / "ckpt", "inc1")
    assert again.land(0, must_not_write) == (0 if dies == "before_marker" else None)
    assert again.committed() == 0 and len(_table(tmp_path / "wh")) == 3
    again.land(1, _writer({"topic=t/date=d/hour=2": 1}))
    assert not list((tmp_path / "wh" / "_staging").iterdir())
    assert len(_table(tmp_path / "wh")) == 4


def test_a_new_query_checkpoint_lands_its_batches_beside_the_old_ones(tmp_path):
    """The land query's checkpoint started again (its batch ids from 0, a new query id): its
    batch 0 is landed, not taken for the old batch 0, and replaces no file."""
    qdir = tmp_path / "ckpt" / "land"
    qdir.mkdir(parents=True)
    (qdir / "metadata").write_text('{"id":"11111111-aaaa"}')
    BatchLanding(tmp_path / "wh", qdir, "inc1").land(0, _writer({"topic=t/date=d/hour=1": 2}))
    import shutil
    shutil.rmtree(qdir)
    qdir.mkdir()
    (qdir / "metadata").write_text('{"id":"22222222-bbbb"}')
    assert BatchLanding(tmp_path / "wh", qdir, "inc1").land(
        0, _writer({"topic=t/date=d/hour=1": 2})) == 2
    table = _table(tmp_path / "wh")
    assert len(table) == 4
    assert sum("inc1-11111111-b0" in t for t in table) == 2


def test_another_checkpoint_never_collides_with_the_first(tmp_path):
    for inc, ckpt in (("inc1", "c1"), ("inc2", "c2")):
        BatchLanding(tmp_path / "wh", tmp_path / ckpt, inc).land(
            0, _writer({"topic=t/date=d/hour=1": 1}))
    assert len(_table(tmp_path / "wh")) == 2


def test_a_table_is_landed_one_way(tmp_path):
    wh = tmp_path / "wh"
    wh.mkdir()
    claim_mode(wh, DEDUP_MODE)
    claim_mode(wh, DEDUP_MODE)
    with pytest.raises(LandingError, match="with --dedup"):
        claim_mode(wh, FILE_SINK_MODE)
    old = tmp_path / "old"
    (old / "data" / "_spark_metadata").mkdir(parents=True)      # landed before the mode file
    with pytest.raises(LandingError, match="without --dedup"):
        claim_mode(old, DEDUP_MODE)


def test_skipped_is_an_optional_field_summed_across_emitters():
    landed = AuditRecord(tier="warehouse", origin="o", topic="t", window_start=0, window_ms=W,
                         count=10, bytes=100, checksum=5, emitter="warehouse/land", seq=3,
                         distinct=10, duplicates=0)
    skips = AuditRecord(tier="warehouse", origin="o", topic="t", window_start=0, window_ms=W,
                        count=0, bytes=0, checksum=0, emitter="warehouse/land-dedup", seq=7,
                        distinct=0, duplicates=0, skipped=4)
    assert "skipped" not in landed.to_dict()              # only a deduplicating tier says it
    key, value = skips.encode()
    assert key == b"skipped|warehouse|o|t|0" and b'"kind":"skipped"' in value
    back = parse(value)
    assert back.skipped == 4 and back.is_skip_tally
    both = combined([landed, back])
    assert (both.count, both.distinct, both.duplicates, both.skipped) == (10, 10, 0, 4)
    with pytest.raises(Exception, match="negative"):
        parse(value.replace(b'"skipped":4', b'"skipped":-1'))
    # skipped only in its own kind, and a tally never counts records
    with pytest.raises(Exception, match="kind skipped"):
        parse(value.replace(b'"kind":"skipped",', b""))
    with pytest.raises(Exception, match="kind skipped"):
        parse(value.replace(b'"count":0', b'"count":3').replace(b'"distinct":0',
                                                                 b'"distinct":3'))


def test_a_skip_tally_adds_to_the_tier_record_and_never_wins_over_it():
    from audit.contract.collect import current_counts

    def rec(emitter, count, seq, at, skipped=None):
        return AuditRecord(tier="warehouse", origin="o", topic="t", window_start=0,
                           window_ms=W, count=count, bytes=count, checksum=count,
                           emitter=emitter, seq=seq, emitted_at=at, distinct=count,
                           duplicates=0, skipped=skipped, incarnation="i")

    landed = rec("warehouse/land", 10, 3, 100)
    tally = rec("warehouse/land-dedup", 0, 9, 900, skipped=4)   # the newer emitter
    got = current_counts([landed, tally])["warehouse"][("t", 0, "o")]
    assert (got.count, got.distinct, got.skipped, got.emitter) == (10, 10, 4, "warehouse/land")
    only = current_counts([tally])["warehouse"][("t", 0, "o")]
    assert (only.count, only.skipped) == (0, 4)
