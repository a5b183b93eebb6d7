"""The evaluation's plain path (``Store.plain_windows``, ``VerdictWriter.save_plain``) must store
exactly what judging the records stores. The same random day of audit records (every kind of
window the verdicts tell apart, late records, alerts that fire and resolve) is evaluated twice:
as the reconciler does, and with every window judged from its records. The tables must be the
same, and each path must really have been taken."""

from __future__ import annotations

import dataclasses
import json
import random
import sqlite3

import pytest

from audit.contract.record import AuditRecord, Progress
from audit.reconcile import evaluate as evaluation
from audit.reconcile import store as store_module
from audit.reconcile.config import parse
from audit.reconcile.evaluate import evaluate
from audit.reconcile.figures import PLAIN_QUERY
from audit.reconcile.store import Store

W = 600_000
T0 = 1_763_766_000_000
MIN = 60_000
TIERS = ["producer", "kafka-local", "warehouse"]
ORIGINS = ["web-1", "web-2", "web-3"]
TOPICS = [f"app.{i}" for i in range(5)]
WINDOWS = 12
KINDS = ["plain", "plain", "plain", "loss", "copies", "content", "no_report", "stranger",
         "two_emitters", "no_distinct", "unknown_size", "empty", "other_length", "zero",
         "skipped", "tier_absent", "twin"]
TABLES = ("windows", "window_origins", "window_revisions", "alerts", "alert_deliveries")


def config():
    return parse({"channels": {"ops": {"type": "webhook", "url": "http://127.0.0.1:9/x"}},
                  "alerts": {"default_channels": ["ops"], "silent_ms": 24 * 3_600_000},
                  "windows": {"tiers": TIERS}})


def rec(tier, origin, topic, w, n, *, distinct=None, checksum=None, seq=1, at=None,
        emitter=None, incarnation="i", window_ms=W, **kw):
    start = T0 + w * W
    distinct = n if distinct is None else (None if distinct == "none" else distinct)
    return AuditRecord(
        tier=tier, origin=origin, topic=topic, window_start=start, window_ms=window_ms,
        count=n, bytes=n * 10, checksum=(n * 7 + 3) if checksum is None else checksum,
        emitter=emitter or (f"{origin}/agent" if tier == "producer" else f"{tier}/count"),
        seq=seq, emitted_at=start + W + (at if at is not None else MIN), distinct=distinct,
        duplicates=None if distinct is None else n - distinct, incarnation=incarnation, **kw)


def window_records(rng: random.Random, topic: str, w: int, kind: str) -> list:
    """One (topic, window)'s records of ``kind``, and what makes it so."""
    out = []
    odd_tier = rng.choice(TIERS[1:])
    odd_origin = rng.choice(ORIGINS)
    for tier in TIERS:
        for origin in ORIGINS:
            n = 100 + ORIGINS.index(origin) + w if kind != "zero" else 0
            odd = tier == odd_tier and origin == odd_origin
            if kind == "tier_absent" and tier == odd_tier:
                continue
            if kind in ("no_report", "twin") and odd:
                continue
            if kind == "no_report" and tier == "producer" and origin == odd_origin:
                continue                       # known to the tiers, not to the producer
            args: dict = {}
            if odd and kind == "loss":
                n -= 3
            elif odd and kind == "copies":
                args["distinct"] = n
                n += 4
            elif odd and kind == "content":
                args["checksum"] = 1
            elif odd and kind == "no_distinct":
                args["distinct"] = "none"
            elif odd and kind == "other_length":
                args["window_ms"] = W // 2
            elif tier == "producer" and origin == odd_origin and kind == "unknown_size":
                args["dropped_unknown"] = {"deleted_unread": 1}
            elif tier == "producer" and origin == odd_origin and kind == "empty":
                args["dropped"] = 7
            out.append(rec(tier, origin, topic, w, n, **args))
            if odd and kind == "two_emitters":   # a second incarnation of the tier's emitter
                out.append(rec(tier, origin, topic, w, 0, incarnation="j"))
            if kind == "twin" and tier == odd_tier and \
                    origin == ORIGINS[ORIGINS.index(odd_origin) - 1]:
                # the missing origin's place taken by a second incarnation's same figures
                out.append(rec(tier, origin, topic, w, n, incarnation="j"))
            if odd and kind == "skipped":        # a deduplicating tier's skip tally
                out.append(rec(tier, origin, topic, w, 0, emitter=f"{tier}/land-dedup",
                               skipped=3))
    if kind == "stranger":                       # an origin no producer reported
        out.append(rec(odd_tier, "web-9", topic, w, 10))
    return out


def day(seed: int) -> tuple[list, list]:
    """(the records of a day, late ones: losses caught up and faults arriving after the first
    evaluation)."""
    rng = random.Random(seed)
    first, late = [], []
    for topic in TOPICS:
        for w in range(WINDOWS):
            kind = rng.choice(KINDS)
            records = window_records(rng, topic, w, kind)
            first += records
            if kind == "loss" and rng.random() < 0.5:      # the lost records arrive late
                late += [dataclasses.replace(r, count=r.count + 3, distinct=r.distinct + 3,
                                             checksum=(r.count + 3) * 7 + 3, seq=2)
                         for r in records if r.tier != "producer" and
                         r.count != 100 + ORIGINS.index(r.origin) + w]
            elif kind == "plain" and rng.random() < 0.3:   # a plain window goes wrong late
                r = rng.choice([r for r in records if r.tier != "producer"])
                late.append(dataclasses.replace(r, count=r.count - 1, distinct=r.distinct - 1,
                                                seq=2))
    rng.shuffle(first)
    return first, late


def progress(tier, at, behind=0):
    return Progress(tier=tier, emitter=f"{tier}/count", batch_id=at, input_rows_per_s=1.0,
                    processed_rows_per_s=1.0, batch_duration_ms=1, offsets_behind=behind,
                    emitted_at=at)


def run(tmp_path, name, seed) -> dict:
    first, late = day(seed)
    store = Store(tmp_path / f"{name}.db")
    cfg = config()
    half = WINDOWS // 2
    mid = T0 + half * W + MIN            # windows from ``half`` on are still open
    store.apply(first + [progress(t, mid) for t in TIERS[1:]], {}, {("a", 0): 1}, "t")
    evaluate(store, cfg, mid)
    later = T0 + (WINDOWS + 6) * W        # every window past its grace, and final
    store.apply([progress(t, later) for t in TIERS[1:]], {}, {("a", 0): 2}, "t")
    evaluate(store, cfg, later)
    store.apply(late + [progress(t, later + MIN) for t in TIERS[1:]], {}, {("a", 0): 3}, "t")
    evaluate(store, cfg, later + MIN)     # late records: revisions, alerts fired and resolved
    evaluate(store, cfg, later + 2 * MIN)
    store.close()
    conn = sqlite3.connect(tmp_path / f"{name}.db")
    try:
        return {t: sorted(conn.execute(f"SELECT * FROM {t}")) for t in TABLES}
    finally:
        conn.close()


@pytest.mark.parametrize("seed,batch", [(1, 500), (2, 500), (3, 7)])
def test_the_plain_path_stores_what_judging_the_records_stores(tmp_path, monkeypatch, seed,
                                                               batch):
    """(A batch of 7 windows: the figures are read by a process of their own.)"""
    monkeypatch.setattr(evaluation, "EVALUATE_BATCH_WINDOWS", batch)
    started = []

    class Counted(evaluation.FiguresProcess):
        def __init__(self, *args):
            super().__init__(*args)
            started.append(0)

        def next_text(self):
            text = super().next_text()
            assert text is not None                      # the process gave every batch's
            started[-1] += 1
            return text

    monkeypatch.setattr(evaluation, "FiguresProcess", Counted)
    taken = {"plain": 0, "judged": 0}
    real = store_module.PlainWindow.plain

    def counted(self, tiers):
        out = real(self, tiers)
        taken["plain" if out else "judged"] += 1
        return out

    monkeypatch.setattr(store_module.PlainWindow, "plain", counted)
    fast = run(tmp_path, "fast", seed)
    assert taken["plain"] > 20 and taken["judged"] > 20, taken   # both paths really ran
    assert bool(started) == (batch == 7) and all(n >= 4 for n in started), started

    monkeypatch.setattr(store_module.PlainWindow, "plain", lambda self, tiers: False)
    judged = run(tmp_path, "judged", seed)
    assert fast == judged
    assert fast["alerts"] and fast["window_revisions"] and fast["window_origins"]
    kinds = {row[2] for row in fast["alerts"]}
    assert {"loss", "duplication", "checksum_mismatch"} <= kinds, kinds


def test_figures_the_reading_process_did_not_give_are_read_by_the_evaluation(
        tmp_path, monkeypatch, caplog):
    """The process reading the figures is killed after giving those of the first batch: the
    evaluation reads the rest itself and stores what it stores when the process lives."""
    monkeypatch.setattr(evaluation, "EVALUATE_BATCH_WINDOWS", 7)
    killed = []

    class Dying(evaluation.FiguresProcess):
        def _send(self, batches):
            # The first batch only, and the pipe left open: the process answers it, then waits
            # for more, alive when it is killed. (Sent every batch, it could answer them all and
            # exit before the kill: then it ends with 0 and nothing ended early.)
            if not killed:
                self.proc.stdin.write(json.dumps(PLAIN_QUERY).encode() + b"\n")
                self.proc.stdin.write(json.dumps(batches[0]).encode() + b"\n")
                self.proc.stdin.flush()
            else:
                super()._send(batches)

        def next_text(self):
            text = super().next_text()
            if not killed:
                self.proc.kill()
                killed.append(self.proc.wait())
            return text

    with caplog.at_level("WARNING", logger="docket.audit.reconcile"):
        living = run(tmp_path, "living", 4)
    assert "ended early" not in caplog.text
    monkeypatch.setattr(evaluation, "FiguresProcess", Dying)
    with caplog.at_level("WARNING", logger="docket.audit.reconcile"):
        dying = run(tmp_path, "dying", 4)
    assert killed and killed[0] != 0
    assert "ended early" in caplog.text
    assert dying == living


def _plain_day(store: Store) -> None:
    """Two topics × 12 windows, every window plain."""
    store.apply([rec(tier, origin, topic, w, 100)
                 for topic in TOPICS[:2] for w in range(WINDOWS) for tier in TIERS
                 for origin in ORIGINS], {}, {("a", 0): 1}, "t")


def _states(store: Store) -> dict:
    return {(t, w, tier): state for t, w, tier, state in store.conn.execute(
        "SELECT topic, window_start, tier, state FROM windows")}


def test_a_record_applied_during_an_evaluation_is_judged_by_the_next(tmp_path, monkeypatch):
    """A window is taken at the start of an evaluation; a record the consumer applies after
    that (here after the window's figures were read, before its batch's transaction) marks it
    dirty again, and the next evaluation judges it with that record."""
    monkeypatch.setattr(evaluation, "EVALUATE_BATCH_WINDOWS", 5)
    store = Store(tmp_path / "r.db")
    consumer = Store(tmp_path / "r.db")                  # its own connection, as in the service
    _plain_day(store)
    now = T0 + (WINDOWS + 6) * W
    key = (TOPICS[1], T0 + 3 * W, "kafka-local")
    late = rec("kafka-local", "web-1", TOPICS[1], 3, 90, seq=2)       # a loss shows up
    real = evaluation._with_plain_figures
    batches = []

    def applying_before_its_batch(st, all_batches):
        for batch, figures in real(st, all_batches):
            batches.append(batch)
            if key[:2] in batch:
                consumer.apply([late], {}, {("a", 0): 2}, "t")
            yield batch, figures

    monkeypatch.setattr(evaluation, "_with_plain_figures", applying_before_its_batch)
    evaluate(store, config(), now)
    assert len(batches) > 4 and key[:2] not in batches[0]
    assert _states(store)[key] == "complete"             # judged as its figures were
    assert store.conn.execute("SELECT count(*) FROM dirty").fetchone()[0] == 1
    monkeypatch.setattr(evaluation, "_with_plain_figures", real)
    evaluate(store, config(), now + MIN)
    assert _states(store)[key] == "incomplete"
    assert store.conn.execute("SELECT count(*) FROM dirty").fetchone()[0] == 0
    consumer.close()


def test_windows_an_evaluation_killed_midway_did_not_store_are_judged_by_the_next(
        tmp_path, monkeypatch):
    monkeypatch.setattr(evaluation, "EVALUATE_BATCH_WINDOWS", 5)
    store = Store(tmp_path / "r.db")
    _plain_day(store)
    now = T0 + (WINDOWS + 6) * W
    real = evaluation.window_alerts
    calls = []

    def dying(st, batch):
        calls.append(batch)
        if len(calls) == 3:
            raise KeyboardInterrupt("killed")
        return real(st, batch)

    monkeypatch.setattr(evaluation, "window_alerts", dying)
    with pytest.raises(KeyboardInterrupt):
        evaluate(store, config(), now)
    stored = {(t, w) for t, w, _tier in _states(store)}
    assert len(stored) == 10                             # two batches of 5 stored
    left = store.conn.execute("SELECT count(*) FROM evaluating").fetchone()[0]
    assert left == 2 * WINDOWS - 10
    assert store.conn.execute("SELECT count(*) FROM dirty").fetchone()[0] == 0
    monkeypatch.setattr(evaluation, "window_alerts", real)
    evaluate(store, config(), now)
    assert len({(t, w) for t, w, _tier in _states(store)}) == 2 * WINDOWS
    assert store.conn.execute("SELECT count(*) FROM evaluating").fetchone()[0] == 0


@pytest.mark.parametrize("when", ["before_the_take", "after_the_figures"])
def test_a_tier_new_to_a_topic_during_an_evaluation_is_judged_with_it(tmp_path, monkeypatch,
                                                                     when):
    """The topic's first warehouse record arrives while an evaluation runs: before it takes
    its windows, or after the window's figures were read (the next batch's, in the thread).
    The window then has 2 rows for 2 tiers (producer, warehouse), which looks plain at the
    tiers known before it (producer, kafka-local): kafka-local, which lost the window's
    records, must still be judged incomplete, with a loss alert."""
    monkeypatch.setattr(evaluation, "EVALUATE_BATCH_WINDOWS", 1)
    store = Store(tmp_path / "r.db")
    consumer = Store(tmp_path / "r.db")
    now = T0 + 20 * W
    store.apply([rec("producer", "web-1", "app.0", 0, 100),
                 rec("kafka-local", "web-1", "app.0", 0, 100),
                 rec("producer", "web-1", "app.0", 1, 100),
                 progress("kafka-local", now)], {}, {("a", 0): 1}, "t")
    first_warehouse = rec("warehouse", "web-1", "app.0", 1, 100)
    window = ("app.0", T0 + W)
    if when == "before_the_take":
        real_take = store.take_windows_to_evaluate

        def take():
            consumer.apply([first_warehouse], {}, {("a", 0): 2}, "t")
            return real_take()
        monkeypatch.setattr(store, "take_windows_to_evaluate", take)
    else:
        real = evaluation._with_plain_figures

        def applying(st, batches):
            for batch, figures in real(st, batches):
                if window in batch:
                    assert figures[window].rows == 1     # read before the record came
                    consumer.apply([first_warehouse], {}, {("a", 0): 2}, "t")
                yield batch, figures
        monkeypatch.setattr(evaluation, "_with_plain_figures", applying)
    evaluate(store, config(), now)
    states = _states(store)
    assert states[(*window, "kafka-local")] == "incomplete"
    assert states[(*window, "warehouse")] == "complete"
    assert ("loss", "kafka-local") in {(r[2], r[8]) for r in store.conn.execute(
        "SELECT * FROM alerts WHERE window_start = ?", (T0 + W,))}
    consumer.close()


def test_the_dashboard_shows_plain_origins_only_as_they_were_judged(tmp_path):
    from dashboards.data import window_detail

    store = Store(tmp_path / "r.db")
    store.apply([rec(tier, "web-1", "app.0", 0, 100) for tier in TIERS], {}, {("a", 0): 1}, "t")
    evaluate(store, config(), T0 + 20 * W)
    detail = window_detail(store, "app.0", T0)
    assert detail["origins"]["web-1"]["kafka-local"]["count"] == 100     # from the producer
    assert store.conn.execute("SELECT count(*) FROM window_origins").fetchone() == (0,)
    store.apply([rec("producer", "web-1", "app.0", 0, 103, seq=2),
                 rec("producer", "web-2", "app.0", 0, 50)], {}, {("a", 0): 2}, "t")
    assert window_detail(store, "app.0", T0)["origins"] == {}          # not judged yet
    evaluate(store, config(), T0 + 20 * W + MIN)
    origins = window_detail(store, "app.0", T0)["origins"]
    assert origins["web-1"]["kafka-local"]["state"] == "incomplete"
    assert origins["web-2"]["kafka-local"]["count"] == 0
    assert origins["web-2"]["producer"] == {
        "state": "complete", "expected": 50, "count": 50, "distinct": 50, "duplicates": 0,
        "missing": 0, "checksum": "match", "reason": ""}


def test_the_figures_process_imports_only_the_standard_library():
    """It starts at every large evaluation: importing sqlite-utils (and with it pandas) would
    cost it 0.6 s each time."""
    import subprocess
    import sys

    code = ("import sys, audit.reconcile.figures\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & "
            "{'sqlite_utils', 'pandas', 'numpy', 'confluent_kafka', 'apscheduler'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_figures_that_are_not_what_the_query_gives_make_no_plain_window():
    """A window without count rows, and figures nested as a string (what SQLite 3.54 makes of
    a subquery's JSON without ``json(…)``), give no figures: the window is judged from its
    records."""
    from audit.reconcile.store import plain_figures

    ok = [9, 9, 3, 0, 0, 3, 300, 0, 600000, 600000]
    text = (f'[["a", 0, {ok}], ["b", 0, [0, 0, 0, null, null, null, null, null, null, null]], '
            f'["c", 0, "{ok}"]]')
    assert list(plain_figures(text)) == [("a", 0)]
