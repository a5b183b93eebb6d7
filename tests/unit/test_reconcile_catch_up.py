"""The reconciler judges windows only with the audit topic read to its end. A scripted consumer
(two partitions; one message per ``consume``) stands in for Kafka: the producer's count is in
partition 0, the cluster's count and a progress record saying it is current in partition 1,
the way their keys spread them. Evaluated between the two, the cluster would show a loss it
does not have (seen in the kill test: a reconciler restarted on a backlog fired and resolved a
loss alert)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from confluent_kafka import KafkaError, TopicPartition

from audit.reconcile.service import Reconciler
from tests.unit.reconcilekit import MIN, T0, Message, W, cfg, count, progress


class ScriptedConsumer:
    """Partitions of encoded records, handed out one message per ``consume``."""

    def __init__(self, partitions: dict[int, list[bytes]]):
        self.logs = partitions
        self.next = dict.fromkeys(partitions, 0)

    paused: frozenset = frozenset()

    def consume(self, n, timeout):
        for p, log in self.logs.items():
            if self.next[p] < len(log) and p not in self.paused:
                self.next[p] += 1
                return [Message(p, self.next[p] - 1, log[self.next[p] - 1])]
        return []

    def position(self, tps):
        return [TopicPartition(tp.topic, tp.partition, self.next[tp.partition]) for tp in tps]

    def get_watermark_offsets(self, tp, timeout=None):
        return 0, len(self.logs[tp.partition])

    def commit(self, offsets=None, asynchronous=True):
        pass

    def pause(self, tps):
        self.paused = self.paused | {tp.partition for tp in tps}

    def resume(self, tps):
        self.paused = self.paused - {tp.partition for tp in tps}


assert KafkaError  # (the real consumer's EOF errors are not scripted: consume returns [])


class Growing(ScriptedConsumer):
    """A topic the agents keep writing to: a record more in partition 0 after every read, as
    five agents sending a round every 3 s keep it on a loaded host."""

    def __init__(self, partitions: dict[int, list[bytes]], more: bytes):
        super().__init__(partitions)
        self.more = more
        self.turn = 0

    def consume(self, n, timeout):
        order = sorted(self.logs)                      # the partitions in turn, as a fetch
        self.turn += 1                                 # of several partitions serves them
        out = []
        for p in order[self.turn % len(order):] + order[:self.turn % len(order)]:
            if self.next[p] < len(self.logs[p]) and p not in self.paused:
                self.next[p] += 1
                out = [Message(p, self.next[p] - 1, self.logs[p][self.next[p] - 1])]
                break
        self.logs[0].append(self.more)
        return out

    def list_topics(self, topic, timeout=None):
        return SimpleNamespace(topics={topic: SimpleNamespace(
            partitions=dict.fromkeys(self.logs), error=None)})

    def incremental_assign(self, tps):
        pass

    def close(self):
        pass


def test_windows_are_judged_only_with_every_partition_read_to_its_end(tmp_path):
    now = int(time.time() * 1000)
    window = T0                                        # long over: judged and final at once
    at = window + W + MIN
    p0 = [count("producer", 500, "web-3", window=window, at=at).encode()[1]]
    p1 = [count("producer", 1, "web-9", window=window, at=at).encode()[1],  # read first
          count("kafka-local", 1, "web-9", window=window, at=at).encode()[1],
          progress(now).encode()[1],
          count("kafka-local", 500, "web-3", window=window, at=at).encode()[1]]
    rec = Reconciler(cfg(), tmp_path / "r.db", clock=lambda: now / 1000)
    rec.consumer = ScriptedConsumer({0: p0, 1: p1})
    rec.partitions = {0, 1}
    evaluations = []
    for _ in range(len(p0) + len(p1) + 2):
        rec._evaluate_due = time.monotonic()          # an evaluation is due at every step,
        rec._next_catch_up_check = 0.0                 # and the brokers may be asked
        result = rec.step()
        if result is not None:
            evaluations.append(rec.consumer.next.copy())
    assert evaluations and all(e == {0: 1, 1: 4} for e in evaluations), evaluations
    alerts = list(rec.store.db.query("SELECT kind, origin FROM alerts WHERE alert_class = "
                                     "'data'"))
    states = {(r["tier"], r["state"]) for r in rec.store.db.query("SELECT tier, state FROM "
                                                                  "windows")}
    rec.store.close()
    assert alerts == [] and states == {("producer", "complete"), ("kafka-local", "complete")}


def test_a_topic_never_read_to_its_end_is_evaluated_after_the_wait(tmp_path, monkeypatch):
    from audit.reconcile import service

    now = int(time.time() * 1000)
    rec = Reconciler(cfg(), tmp_path / "r.db", clock=lambda: now / 1000)
    endless = ScriptedConsumer({0: [progress(now).encode()[1]] * 1000})
    rec.consumer, rec.partitions = endless, {0}
    rec._evaluate_due = time.monotonic()
    assert rec.step() is None                          # behind, within the wait
    monkeypatch.setattr(service, "CATCH_UP_WAIT_S", 0.0)
    rec._next_catch_up_check = 0.0
    assert rec.step() is not None                      # behind past the wait: evaluated
    rec.store.close()


def test_evaluations_follow_the_interval_and_survive_failures(tmp_path, monkeypatch):
    """The first step evaluates (nothing to read), the next not before the interval; a broker
    that cannot answer whether the topic is read, or an evaluation that fails, is logged and
    tried again — the reconciler keeps running."""
    from confluent_kafka import KafkaException

    now = int(time.time() * 1000)
    rec = Reconciler(cfg(), tmp_path / "r.db", clock=lambda: now / 1000)
    rec.consumer, rec.partitions = ScriptedConsumer({0: []}), {0}
    assert rec.step() is not None                      # due at once, caught up
    assert rec.step() is None                          # the interval (60 s) has not passed

    rec._evaluate_due = time.monotonic()

    def no_answer(*a, **k):
        raise KafkaException("timed out")

    monkeypatch.setattr(rec.consumer, "get_watermark_offsets", no_answer)
    assert rec.step() is None                          # unknown: not judged, not fatal
    assert rec.step() is None                          # asked again only after a second
    monkeypatch.undo()

    def broken(*a, **k):
        raise RuntimeError("database is locked")

    rec._evaluate_due, rec._next_catch_up_check = time.monotonic(), 0.0
    monkeypatch.setattr(rec, "evaluate_job", broken)
    assert rec.step() is None                          # logged; the next one is scheduled
    assert rec._evaluate_due > time.monotonic() + 50
    rec.store.close()


def test_once_reads_the_topic_to_its_end_as_found_and_never_chases_it(tmp_path, monkeypatch):
    """``--once`` on a topic the agents keep writing to (a record more after every read, as
    seen with five agents on a loaded host): it reads to the end the partitions had when it
    found them, and ends."""
    now = int(time.time() * 1000)
    heartbeat = count("producer", 0, "web-1", window=T0, at=now).encode()[1]
    growing = Growing({0: [heartbeat] * 3}, heartbeat)
    rec = Reconciler(cfg(), tmp_path / "r.db", clock=lambda: now / 1000)
    monkeypatch.setattr(rec, "_consumer", lambda: growing)
    rec.run_once(timeout_s=30)
    assert growing.next[0] == 3 and len(growing.logs[0]) > 3


# -- the mirror's processes (broker/mirror.py) ---------------------------------------------------
# (Here for now: its own tests' file, tests/unit/test_broker_mirror.py, was not ours to edit.)
def test_stopping_a_mirror_process_that_ended_meanwhile_is_no_error():
    """``mirror down`` checks the pid, then signals it: a process that exits in between is
    gone, as asked (it raised ProcessLookupError)."""
    import subprocess
    import sys

    from broker.mirror import _terminate
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()                                            # ended and reaped: no such process
    _terminate(proc.pid, timeout_s=1.0)


def test_a_topic_the_agents_keep_writing_to_is_judged_at_the_ends_it_had_when_due(tmp_path):
    """The running reconciler on a topic whose end moves after every read: it evaluates once it
    has read to the ends the partitions had when the evaluation fell due — everything written
    before then, the cluster's count in the other partition included — and never waits for the
    agents to stop (seen: no window judged for 7 minutes while five agents wrote)."""
    now = int(time.time() * 1000)
    window = T0
    at = window + W + MIN
    heartbeat = count("producer", 0, "web-1", window=T0 + 5 * W, at=now).encode()[1]
    growing = Growing({0: [count("producer", 500, "web-3", window=window, at=at).encode()[1],
                           heartbeat],
                       1: [progress(now).encode()[1],
                           count("kafka-local", 500, "web-3", window=window, at=at).encode()[1]]},
                      heartbeat)
    rec = Reconciler(cfg(), tmp_path / "r.db", clock=lambda: now / 1000)
    rec.consumer, rec.partitions = growing, {0, 1}
    rec._evaluate_due = time.monotonic()
    ends = {p: len(log) for p, log in growing.logs.items()}   # when the evaluation falls due
    evaluated_at = None
    for _ in range(20):
        rec._next_catch_up_check = 0.0                # the brokers may be asked at every step
        if rec.step() is not None:
            evaluated_at = growing.next.copy()
            break
    assert evaluated_at is not None, "never judged while the topic grew"
    assert all(evaluated_at[p] >= ends[p] for p in ends), (evaluated_at, ends)
    assert len(growing.logs[0]) > evaluated_at[0]     # the end had moved on meanwhile
    states = {(r["tier"], r["state"]) for r in rec.store.db.query(
        "SELECT tier, state FROM windows WHERE window_start = ?", [window])}
    rec.store.close()
    assert states == {("producer", "complete"), ("kafka-local", "complete")}


def test_records_past_the_due_ends_wait_until_the_evaluation_is_done(tmp_path):
    """The cluster's count (partition 0) and then its progress saying it is current
    (partition 1) are written just after the ends were taken; partition 1 is read first. The
    progress, past its partition's end, is held back until the evaluation is done: judged with
    it and without the count, the cluster would show a loss it does not have. Then both are
    applied and the next evaluation finds the window complete."""
    now = int(time.time() * 1000)
    window, report_at = T0, now - 10 * MIN

    class Late(ScriptedConsumer):
        written = False

        def get_watermark_offsets(self, tp, timeout=None):
            end = super().get_watermark_offsets(tp, timeout)
            if tp.partition == 1 and not self.written:    # right after the ends were taken
                self.written = True
                self.logs[0].append(
                    count("kafka-local", 500, "web-3", window=window, at=now).encode()[1])
                self.logs[1].append(progress(now).encode()[1])
            return end

    late = Late({1: [progress(now - 20 * MIN).encode()[1]],       # served first
                 0: [count("producer", 500, "web-3", window=window, at=report_at).encode()[1],
                     count("producer", 1, "web-9", window=window, at=report_at).encode()[1],
                     count("kafka-local", 1, "web-9", window=window, at=report_at).encode()[1]]})
    rec = Reconciler(cfg(), tmp_path / "r.db", clock=lambda: now / 1000)
    rec.consumer, rec.partitions = late, {0, 1}
    evaluations = 0
    for _ in range(30):
        rec._next_catch_up_check = 0.0
        if evaluations < 2:
            rec._evaluate_due = time.monotonic()          # due at every step until judged twice
        if rec.step() is not None:
            evaluations += 1
            alerts = list(rec.store.db.query("SELECT kind, origin FROM alerts"))
            assert alerts == [], (evaluations, alerts)
    assert late.written and evaluations == 2
    assert late.next == {0: 4, 1: 2} and not late.paused
    states = {(r["tier"], r["state"]) for r in rec.store.db.query(
        "SELECT tier, state FROM windows WHERE window_start = ?", [window])}
    rec.store.close()
    assert states == {("producer", "complete"), ("kafka-local", "complete")}
