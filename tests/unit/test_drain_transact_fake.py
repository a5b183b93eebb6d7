"""The exactly-once drain over a fake transactional cluster (``TxKafka``, beside
``fakeproducer.FakeKafka``): what a read_committed reader would see when a topic is refused for
a while, and when a record is too large; deterministic, where the real cluster
(tests/faults/test_exactly_once.py) shows the crash points."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from confluent_kafka import KafkaError, TopicPartition

import agent.drain.transact as transact
from agent.buffer import BufferPool, Chunk
from agent.drain.drain import DENIED_RETRY_S, OUTAGE_AFTER_S
from agent.drain.native_txn import NativeTransactionalDrain
from agent.drain.transact import TransactionalDrain
from agent.state.journal import LossJournal
from agent.telemetry import Metrics
from tests.unit.fakenative import FakeSlotProducer
from tests.unit.fakeproducer import FakeKafka, FakeProducer
from tests.unit.test_drain_denied import DENIED, StoppedClock

TOO_LARGE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")


class TxKafka(FakeKafka):
    """``log`` is what a read_uncommitted reader sees; ``committed`` a read_committed one's;
    ``marker`` the progress marker committed last."""

    def __init__(self):
        super().__init__()
        self.committed: list[tuple] = []
        self.marker: str | None = None
        self.transactions: list[tuple[int, int]] = []   # (records, batch.num.messages)
        self.commit_gate: threading.Event | None = None  # a commit waits for it

    def producer(self, conf: dict, role: str = "main") -> TxProducer:
        p = TxProducer(conf, self)
        self.producers.append(p)
        return p

    def consumer(self, conf: dict) -> TxConsumer:
        return TxConsumer(self)


class TxProducer(FakeProducer):
    def init_transactions(self, timeout: float) -> None:
        self.txn_start: int | None = None

    def begin_transaction(self) -> None:
        self.txn_start = len(self.kafka.log)

    def send_offsets_to_transaction(self, offsets, group, timeout: float) -> None:
        self.marker = offsets[0].metadata

    def commit_transaction(self, timeout: float) -> None:
        if self.kafka.commit_gate is not None:        # a coordinator that does not answer
            assert self.kafka.commit_gate.wait(30)
        records = self.kafka.log[self.txn_start:]
        self.kafka.committed.extend(records)
        self.kafka.marker = self.marker
        # (the native producer's settings are text)
        self.kafka.transactions.append((len(records),
                                        int(self.conf.get("batch.num.messages", 0))))
        self.txn_start = None


class TxConsumer:
    def __init__(self, kafka: TxKafka):
        self.kafka = kafka

    def committed(self, partitions, timeout: float):
        if self.kafka.marker is None:           # none committed: offset unset, no metadata
            return [TopicPartition(p.topic, p.partition, -1001) for p in partitions]
        return [TopicPartition(p.topic, p.partition, 0, metadata=self.kafka.marker)
                for p in partitions]

    def consumer_group_metadata(self):
        return None

    def close(self) -> None:
        pass


@pytest.fixture(autouse=True)
def no_topic_creation(monkeypatch):
    monkeypatch.setattr(transact, "ensure_topics", lambda *a, **k: [])


@pytest.fixture(params=["python", "native"])
def send_path(request):
    """Every test on both send paths: the native one's drain over a stand-in extension whose
    records and transaction calls go to the same fake cluster."""
    return request.param


def _drain(tmp_path, kafka: TxKafka, topics: dict[str, int], clock, send_path: str):
    """A pool with ``topics`` (name → records, 16 KiB slots) sealed, under the exactly-once
    drain of the test's send path; the order the slots are freed in is kept in ``freed``."""
    metrics = Metrics()
    pool = BufferPool(tmp_path / "p", 4 << 20, 16 << 10, linger_ms=1e9, sync_on_seal=False)
    for topic, n in topics.items():
        data = b"".join(b"%s event %06d %s\n" % (topic.encode(), i, b"x" * 60) for i in range(n))
        pool.append(topic, Chunk.from_lines(data, np.full(n, 1_795_000_000_000)))
        pool.seal_all()
    freed: list = []
    native = {"native_factory": lambda conf: FakeSlotProducer(conf, kafka)}
    drain_class = {"python": TransactionalDrain, "native": NativeTransactionalDrain}[send_path]
    drain = drain_class(pool, {"bootstrap.servers": "127.0.0.1:1"},
                               LossJournal(tmp_path / "j", metrics), metrics, tmp_path / "dead",
                               b"a", on_slot_done=freed.append,
                               producer_factory=kafka.producer, incarnation=b"1-test",
                               clock=clock, agent_id="a", incarnation_id="1-test",
                               consumer_factory=kafka.consumer,
                               **(native if drain_class is NativeTransactionalDrain else {}))
    return drain, pool, freed


def _pump_until(drain, done, clock, advance_s: float = 0.0, turns: int = 20_000) -> None:
    for _ in range(turns):
        if done():
            return
        drain.pump()
        if drain.job is not None:
            drain.job.done.wait(5)
        clock.now += advance_s
    raise AssertionError("the drain made no progress")


def _aborts(drain) -> float:
    return drain.metrics.get("agent_drain_transactions_aborted_total")


def _values(records) -> list[bytes]:
    return [value for _t, value, _k, _ts, _h in records]


def test_a_refused_topic_waits_aside_the_others_commit_and_it_follows_in_order(
        tmp_path, send_path):
    kafka, clock = TxKafka(), StoppedClock()
    drain, pool, freed = _drain(tmp_path, kafka, {"refused": 1500, "open": 1500}, clock, send_path)
    refused = [s.seq for s in pool.sealed() if s.topic == "refused"]
    assert len(refused) >= 4
    first = b"refused event 000000 " + b"x" * 60
    kafka.script(first, DENIED, DENIED, DENIED)      # refused three times, then granted
    _pump_until(drain, lambda: not pool.sealed(), clock, advance_s=0.05)
    got = _values(kafka.committed)
    assert len(got) == len(set(got)) == 3000           # each once, read_committed
    assert drain.broker_state == "up" and not drain._denied
    # The refused topic's slots were freed in the pool's order (its offsets contiguous) and
    # after the open topic's had gone.
    order = [s.seq for s in freed if s.topic == "refused"]
    assert order == refused
    assert [s.topic for s in freed].index("refused") > 0
    assert _aborts(drain) == 3 and kafka.answer(first) == "ok"


def test_a_refused_topic_is_tried_once_per_retry_interval_not_in_a_loop(tmp_path, send_path):
    kafka, clock = TxKafka(), StoppedClock()
    drain, pool, freed = _drain(tmp_path, kafka, {"refused": 1500}, clock, send_path)
    first = b"refused event 000000 " + b"x" * 60
    kafka.script(first, *[DENIED] * 100)
    _pump_until(drain, lambda: _aborts(drain) >= 1, clock)
    for _ in range(200):                               # no time passes: no second try
        drain.pump()
        if drain.job is not None:
            drain.job.done.wait(5)
    assert _aborts(drain) == 1 and kafka.committed == []
    clock.now += DENIED_RETRY_S
    _pump_until(drain, lambda: _aborts(drain) >= 2, clock)
    assert drain.broker_state.startswith("not authorised")


def test_a_record_too_large_alone_is_dead_lettered_and_the_rest_commit_once(tmp_path, send_path):
    kafka, clock = TxKafka(), StoppedClock()
    drain, pool, freed = _drain(tmp_path, kafka, {"t": 3000}, clock, send_path)
    largest = max(s.record_count for s in pool.sealed())
    big = b"t event 001234 " + b"x" * 60
    kafka.script(big, *[TOO_LARGE] * 50)               # in a batch, alone: always
    _pump_until(drain, lambda: not pool.sealed(), clock)
    got = _values(kafka.committed)
    assert big not in got and len(got) == len(set(got)) == 2999
    assert (tmp_path / "dead").exists()
    # One record per batch for one slot at a time: each such transaction commits at most a
    # slot's records; the others went in batches.
    lone = [n for n, one in kafka.transactions if one == 1]
    assert lone and max(lone) <= largest
    assert any(one != 1 for _n, one in kafka.transactions)
    assert not drain.lone_mode


def test_a_restart_frees_the_slots_the_marker_names_without_sending_them(tmp_path, send_path):
    kafka, clock = TxKafka(), StoppedClock()
    drain, pool, freed = _drain(tmp_path, kafka, {"t": 1500}, clock, send_path)
    # A transaction of the first two slots committed by a previous producer, then a crash
    # before they were freed: the marker names them.
    first_two = pool.sealed()[:2]
    kafka.marker = transact.marker_value("1-test", first_two)
    skipped = {v for s in first_two for v in _slot_values(s)}
    _pump_until(drain, lambda: not pool.sealed(), clock)
    assert [s.seq for s in freed[:2]] == [s.seq for s in first_two]
    assert drain.metrics.get("agent_drain_committed_found_total") == 2
    sent = _values(kafka.log)                          # every attempt, aborted or not
    assert not skipped & set(sent)
    assert len(sent) == len(set(sent)) == 1500 - len(skipped)


def _slot_values(slot) -> list[bytes]:
    payload = bytes(slot.payload)
    return [payload[o:o + n] for block in slot.blocks()
            for o, n in zip(block.offsets.tolist(), block.lengths.tolist(), strict=True)]


def test_a_commit_waiting_for_a_cluster_that_does_not_answer_is_said_unreachable(
        tmp_path, send_path):
    """One transaction call can wait 30 s and more (librdkafka's request timeout) for a paused
    broker: status must say the cluster is unreachable meanwhile, not "up" (seen in CI: a
    broker paused 30 s during a commit), and "up" again once the commit returns."""
    kafka, clock = TxKafka(), StoppedClock()
    kafka.commit_gate = threading.Event()
    drain, pool, _freed = _drain(tmp_path, kafka, {"t": 300}, clock, send_path)
    for _ in range(1000):
        drain.pump()
        if drain.job is not None and drain.job.name == "commit":
            break
        if drain.job is not None:
            drain.job.done.wait(5)
    assert drain.job.name == "commit" and drain.broker_state == "up"
    clock.now += OUTAGE_AFTER_S
    deadline = time.monotonic() + 30            # the probe's client waits 1 s for an answer
    while drain.broker_state != "unreachable":
        assert time.monotonic() < deadline, drain.broker_state
        drain.pump()
        time.sleep(0.05)
    assert drain.metrics.get("agent_drain_broker_up") == 0
    assert drain.metrics.get("agent_drain_outages_total") == 1
    kafka.commit_gate.set()
    _pump_until(drain, lambda: not pool.sealed(), clock)
    assert drain.broker_state == "up" and drain.metrics.get("agent_drain_broker_up") == 1
    got = _values(kafka.committed)
    assert len(got) == len(set(got)) == 300


def test_a_native_producer_refused_its_transactional_id_is_replaced_after_the_retry_interval(
        tmp_path):
    """librdkafka keeps a producer's fatal error for its life: taken once, an ACL missing waits
    ``DENIED_RETRY_S`` and a new producer tries again (read at every pump, it put the agent
    back to waiting for good)."""
    kafka, clock = TxKafka(), StoppedClock()
    drain, pool, _freed = _drain(tmp_path, kafka, {"t": 300}, clock, "native")
    refused = drain.native
    refused.fatal = (KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                     "Broker: Transactional Id authorization failed")
    for _ in range(50):
        drain.pump()
        if drain.job is not None:
            drain.job.done.wait(5)
    assert drain.native is refused and drain.broker_state.startswith("transactions refused")
    clock.now += DENIED_RETRY_S
    _pump_until(drain, lambda: not pool.sealed(), clock)
    assert drain.native is not refused
    assert drain._fatal_taken_from is not refused      # let go of, not held
    got = _values(kafka.committed)
    assert len(got) == len(set(got)) == 300
