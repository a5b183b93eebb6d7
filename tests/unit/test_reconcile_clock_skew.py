"""The caught-up rule on a deterministic timeline whose clocks disagree by ±10 minutes.

Three agents report one window: ``slow`` (its clock 10 minutes behind), ``fast`` (10 minutes
ahead) and ``true``. The audit records go through the reconciler's consumer as Kafka hands them
over, each stamped by the broker when it was appended (``LogAppendTime``). The count job's
first batch took its snapshot of Kafka before the agents' last records of the window were
there, and ended after their reports: its progress is newer than every report's ``emitted_at``
but one, yet it has read past none of them. Its second batch has read past all three: one of
``fast``'s records really is lost.

A rule comparing the job's progress time with each agent's ``emitted_at`` calls ``slow`` and
``true`` lost after the first batch, misses ``fast``'s real loss after the second, and finds
``slow`` silent. Positions decide here: a tier is caught up with an agent's report when it has
read past a report of that agent saying that every record the window's count holds was
acknowledged by Kafka."""

from __future__ import annotations

import json

from audit.reconcile.config import parse
from audit.reconcile.evaluate import evaluate
from audit.reconcile.service import Reconciler
from audit.reconcile.store import Store
from tests.unit.reconcilekit import Message, cfg, count
from tests.unit.reconcilekit import progress as job_progress

MIN = 60_000
W = 10 * MIN
T0 = 1_763_766_000_000
END = T0 + W
SKEW = {"slow": -10 * MIN, "fast": 10 * MIN, "true": 0}
JOB = {"tier": "kafka-local", "emitter": "kafka-local/count", "incarnation": "job-1"}


class Broker:
    """The audit topic's single partition as the reconciler's consumer sees it."""

    def __init__(self):
        self.log: list[Message] = []
        self.next = 0

    def append(self, at: int, *bodies: dict) -> None:
        for body in bodies:
            self.log.append(Message(0, len(self.log), json.dumps({"v": 1, **body}).encode(),
                                    at))

    def consume(self, n, timeout):
        out = self.log[self.next:self.next + n]
        self.next += len(out)
        return out

    def position(self, tps):
        for tp in tps:
            tp.offset = self.next
        return tps

    def get_watermark_offsets(self, tp, timeout=None):
        return 0, len(self.log)

    def commit(self, offsets=None, asynchronous=True):
        pass

    def close(self):
        pass


def report(origin: str, at: int, count: int, seq: int, sealed_through: int,
           delivered: int) -> list[dict]:
    """What the agent ``origin`` sends at true time ``at``, stamped by its own clock: its
    window's count and its record numbers (the last sealed, the last acknowledged)."""
    clock = at + SKEW[origin]
    emitter = {"emitter": f"{origin}/agent", "incarnation": "a1", "seq": seq,
               "emitted_at": clock}
    return [{"tier": "producer", "origin": origin, "topic": "app", "window_start": T0,
             "window_ms": W, "count": count, "bytes": count, "checksum": f"{count:016x}",
             "distinct": count, "duplicates": 0, "sealed_through": sealed_through, **emitter},
            {"kind": "ranges", "tier": "producer", "origin": origin, "origin_incarnation": "a1",
             "through": sealed_through, "delivered": delivered, "missing": [],
             "missing_total": 0, "missing_truncated": False, **emitter}]


def counted(origin: str, at: int, count: int, batch: int) -> dict:
    return {"origin": origin, "topic": "app", "window_start": T0, "window_ms": W,
            "count": count, "bytes": count, "checksum": f"{count:016x}", "distinct": count,
            "duplicates": 0, "seq": batch, "emitted_at": at, **JOB}


def progress(at: int, batch: int) -> dict:
    """The job's progress: it publishes ``caught_up`` records (batch -1: its announcement at
    start, before it counted anything)."""
    return {"kind": "progress", "tier": JOB["tier"], "emitter": JOB["emitter"],
            "incarnation": JOB["incarnation"], "batch_id": batch, "input_rows_per_s": 1.0,
            "processed_rows_per_s": 1.0, "batch_duration_ms": 2 * MIN, "offsets_behind": 0,
            "emitted_at": at, "publishes_caught_up": True}


def caught_up(origin: str, at: int, batch: int, seq: int, delivered: int) -> dict:
    """The job has read every record Kafka held when ``origin``'s report ``seq`` (which said
    ``delivered``) was there."""
    return {"kind": "caught_up", "seq": batch, "emitted_at": at, "source": f"{origin}/agent",
            "source_incarnation": "a1", "source_seq": seq, "source_delivered": delivered, **JOB}


def ranges(origin: str, at: int, batch: int, through: int, missing: list) -> dict:
    return {"kind": "ranges", "origin": origin, "origin_incarnation": "a1", "seq": batch,
            "emitted_at": at, "through": through, "missing": missing,
            "missing_total": sum(b - a + 1 for a, b in missing), "missing_truncated": False,
            **JOB}


def reconciled(cfg, db, broker: Broker, now: int) -> list[tuple]:
    """The reconciler run once at ``now`` over what ``broker`` holds: every alert, by id
    (kind, origin, status, detail)."""
    rec = Reconciler(cfg, db, clock=lambda: now / 1000)
    rec.consumer = broker
    rec.partitions = {0}
    while rec.consume_batch(timeout_s=0)[0]:
        pass
    rec.evaluate_job()
    rec.close()
    store = Store(db, readonly=True)
    try:
        return store.conn.execute(
            "SELECT kind, origin, status, detail FROM alerts ORDER BY id").fetchall()
    finally:
        store.close()


def test_caught_up_is_decided_by_positions_when_the_clocks_disagree_by_ten_minutes(tmp_path):
    cfg = parse({"windows": {"tiers": ["producer", "kafka-local"], "settle_ms": MIN},
                 "alerts": {"silent_ms": 35 * MIN, "lag_ms": 60 * MIN}})
    broker = Broker()
    db = tmp_path / "r.db"

    def evaluate(now: int) -> list[tuple]:
        return reconciled(cfg, db, broker, now)

    def states() -> dict[str, str]:
        store = Store(db, readonly=True)
        try:
            return dict(store.conn.execute(
                "SELECT origin, state FROM window_origins WHERE tier = 'kafka-local'"))
        finally:
            store.close()

    # The count job starts: it announces itself. An earlier round of every agent, numbers
    # 0-899 sealed and acknowledged: the job's first batch (its snapshot at END + 30 s) read
    # past it and every record it vouched for.
    broker.append(END - MIN, progress(END - MIN, -1))
    for origin in SKEW:
        broker.append(END, *report(origin, END, 900, 1, 899, 899))
    # END + 2 min: each agent's last round for the window: 1,000 records (numbers to 999), all
    # acknowledged. The job's first batch ends after it (END + 3 min), having counted 900.
    for origin in SKEW:
        broker.append(END + 2 * MIN, *report(origin, END + 2 * MIN, 1000, 2, 999, 999))
    for origin in SKEW:
        broker.append(END + 3 * MIN, counted(origin, END + 3 * MIN, 900, 1),
                      caught_up(origin, END + 3 * MIN, 1, 1, 899))
    broker.append(END + 3 * MIN, progress(END + 3 * MIN, 1))

    alerts = evaluate(END + 31 * MIN)                # past the grace: no data alert, and
    assert [a for a in alerts if a[0] != "clock_skew"] == []   # no one silent
    assert set(states().values()) == {"unknown"}     # not read that far: not lost, not known

    # END + 4 min: the second batch has read past the last reports; 100 of fast's are lost.
    broker.append(END + 4 * MIN, counted("slow", END + 4 * MIN, 1000, 2),
                  counted("true", END + 4 * MIN, 1000, 2), counted("fast", END + 4 * MIN, 900, 2),
                  ranges("fast", END + 4 * MIN, 2, 999, [[900, 999]]),
                  *(caught_up(origin, END + 4 * MIN, 2, 2, 999) for origin in SKEW),
                  progress(END + 4 * MIN, 2))
    alerts = evaluate(END + 32 * MIN)
    assert states() == {"fast": "incomplete"}        # slow and true: plain, complete
    losses = [a for a in alerts if a[0] == "loss"]
    assert [(k, o, s) for k, o, s, _d in losses] == [("loss", "fast", "open")]
    detail = json.loads(losses[0][3])
    assert (detail["expected"], detail["actual"], detail["missing_ranges"]) == \
        (1000, 900, [[900, 999]])
    # Their reports came in 30 minutes ago by the broker's clock: not silent. Their clocks are
    # off by 10 minutes: a fact, raised apart.
    assert [a for a in alerts if a[0] == "silent_producer"] == []
    assert sorted(o for k, o, s, _d in alerts if k == "clock_skew") == ["fast", "slow"]


def test_a_job_that_publishes_marks_is_caught_up_with_nothing_before_its_first(tmp_path):
    """Its progress says it publishes ``caught_up`` records: until the first comes, its tier
    is not judged by the progress records' arrival (a new count job's first batch, read before
    the agents' last records, is not a loss); a job that does not say so is."""
    for publishes, state in ((True, "unknown"), (False, "incomplete")):
        store = Store(tmp_path / f"{publishes}.db")
        report = count("producer", 1000, at=END + MIN)
        report.arrived_at = END + MIN
        counted = count("kafka-local", 900, at=END + 29 * MIN)
        made = job_progress(END + 29 * MIN)
        made.publishes_caught_up, made.arrived_at = publishes, END + 30 * MIN
        store.apply([report, counted, made], {}, {}, "t")
        evaluate(store, cfg(), END + 31 * MIN)
        assert store.conn.execute("SELECT state FROM window_origins WHERE tier = "
                                  "'kafka-local'").fetchone() == (state,), publishes
        store.close()


def test_a_jobs_first_counts_before_its_first_progress_are_not_a_loss(tmp_path):
    """Seen under load: a count job's first batch (read before the agent's last records) was
    applied and judged in the second before the job's first progress record came, and the
    tier, with no progress at all, was judged on its counts alone: a loss that was not. The
    job announces itself before it counts anything; the reconciler judged here between the
    counts and the first progress finds the tier caught up with nothing yet."""
    for announced, state in ((True, "unknown"), (False, "incomplete")):
        broker = Broker()
        if announced:
            broker.append(END - MIN, progress(END - MIN, -1))
        broker.append(END + MIN, *report("true", END + MIN, 1000, 2, 999, 999))
        broker.append(END + 2 * MIN, counted("true", END + 2 * MIN, 600, 0))
        rec = Reconciler(cfg(), tmp_path / f"{announced}.db",
                         clock=lambda: (END + 40 * MIN) / 1000)
        rec.consumer, rec.partitions = broker, {0}
        while rec.consume_batch(timeout_s=0)[0]:
            pass
        rec.evaluate_job()
        assert rec.store.conn.execute("SELECT state FROM window_origins WHERE tier = "
                                      "'kafka-local'").fetchone() == (state,), announced
        rec.close()


def test_a_mark_vouches_for_the_counts_sent_before_it_and_judges_none_sent_after(tmp_path):
    """The jobs acknowledge a batch's counts before they publish the marks of it: a reconciler
    that evaluates between a report and the counts of it finds the tier's marks older than the
    report, and the window waits. A mark sent before its counts vouches for counts not there
    yet: the tier is judged on the counts it holds, a loss fires and resolves when they come.
    (A fault test whose feed sent its marks first fired such alerts when the reconciler took
    its ends between a report and the count of it, on another partition.)"""
    cfg = parse({"windows": {"tiers": ["producer", "kafka-local"]}})
    for marks_first, fired in ((False, []), (True, [("loss", "true", "resolved")])):
        broker, db = Broker(), tmp_path / f"{marks_first}.db"
        broker.append(END - MIN, progress(END - MIN, -1))
        broker.append(END, *report("true", END, 500, 1, 499, 499))
        broker.append(END + MIN, counted("true", END + MIN, 500, 1),
                      caught_up("true", END + MIN, 1, 1, 499), progress(END + MIN, 1))
        broker.append(END + 2 * MIN, *report("true", END + 2 * MIN, 1000, 2, 999, 999))
        mark = caught_up("true", END + 3 * MIN, 2, 2, 999)
        if marks_first:
            broker.append(END + 3 * MIN, mark)
        state, alerts = _judge(cfg, broker, db, END + 31 * MIN)   # round 2's counts not yet
        assert (state, alerts) == ((("incomplete",), [("loss", "true", "open")])
                                   if marks_first else (("unknown",), [])), marks_first
        broker.append(END + 3 * MIN, counted("true", END + 3 * MIN, 1000, 2))
        if not marks_first:
            broker.append(END + 3 * MIN, mark)
        state, alerts = _judge(cfg, broker, db, END + 32 * MIN)
        assert (state, alerts) == (None, fired), marks_first     # complete: a plain origin


def _judge(cfg, broker: Broker, db, now: int) -> tuple:
    """A reconciler at ``now`` reads what ``broker`` holds and evaluates: the kafka-local
    state of the origin's window (None: plain) and the loss alerts."""
    rec = Reconciler(cfg, db, clock=lambda: now / 1000)
    rec.consumer, rec.partitions = broker, {0}
    while rec.consume_batch(timeout_s=0)[0]:
        pass
    rec.evaluate_job()
    state = rec.store.conn.execute("SELECT state FROM window_origins WHERE tier = "
                                   "'kafka-local'").fetchone()
    alerts = rec.store.conn.execute("SELECT kind, origin, status FROM alerts "
                                    "WHERE kind = 'loss'").fetchall()
    rec.close()
    return state, alerts


def test_a_window_lost_whole_before_a_tier_first_counted_its_topic_is_judged_at_that_tier(
        tmp_path):
    """A host whose clock is behind (or a topic new to a count job) reports a window that is
    final at the producer before any count job has counted the topic; every record of that
    window is then lost from Kafka. The job never writes a count for the window (it saw no
    record of it), and a final window was judged again only when a count of its own came: the
    loss was never called (the clock-skew test's `Counter()`). The first count of a tier on a
    topic now has the topic's windows judged again at that tier."""
    cfg = parse({"windows": {"tiers": ["producer", "kafka-local"], "settle_ms": MIN,
                             "grace_ms": MIN, "final_ms": 2 * MIN},
                 "alerts": {"silent_ms": 60 * MIN, "lag_ms": 60 * MIN}})
    broker = Broker()
    db = tmp_path / "r.db"
    w1, w2 = T0, T0 + W

    def produced(window_start: int, at: int, n: int, seq: int, through: int) -> list[dict]:
        body = report("true", at, n, seq, through, through)
        for b in body:
            b["topic"] = "lost"
        body[0]["window_start"] = window_start
        return body

    def run(now: int) -> list[tuple]:
        return [a for a in reconciled(cfg, db, broker, now) if a[0] == "loss"]

    broker.append(w2, *produced(w1, w2, 200, 1, 199))                 # numbers 0-199
    broker.append(w2 + W, *produced(w2, w2 + W, 100, 2, 299))         # numbers 200-299
    assert run(w2 + W + 5 * MIN) == []          # both final, at the producer tier alone
    # The count job starts; W1's records are gone from Kafka, W2's are all there.
    at = w2 + W + 6 * MIN
    job_count = counted("true", at, 100, 1)
    job_count.update(topic="lost", window_start=w2)
    job_ranges = ranges("true", at, 1, 299, [[0, 199]])
    broker.append(at, progress(at - MIN, -1), job_count, job_ranges,
                  caught_up("true", at, 1, 2, 299), progress(at, 1))
    losses = run(at + MIN)
    assert [(k, o, s) for k, o, s, _d in losses] == [("loss", "true", "open")]
    detail = json.loads(losses[0][3])
    assert (detail["expected"], detail["actual"]) == (200, 0)
