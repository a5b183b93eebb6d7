"""What the drain does with each Kafka answer, through the fake producer at the transport seam
(``tests/unit/fakeproducer.py``): acknowledged records are counted in bulk, retriable ones go
again, a record refused as too large goes again alone and is dead-lettered only when it is
refused alone, and a slot is freed once, when every record in it is acknowledged or
dead-lettered."""

from __future__ import annotations

import base64
import json
import logging
from collections import Counter

import numpy as np
import pytest
from confluent_kafka import KafkaError

from tests.unit.fakeproducer import HOLD, NEVER, OK
from tests.unit.poolkit import fake_drain

# Each test runs with both send paths of the drain (Python, native).
pytestmark = pytest.mark.usefixtures("send_path")

T0 = 1_795_000_000_000
ORIGIN = [("docket-origin", b"agent-7"), ("docket-incarnation", b"1-test")]
RETRIABLE = KafkaError(KafkaError.NOT_ENOUGH_REPLICAS, retriable=True)
TOO_LARGE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)


def _slot(tmp_path, lines: list[bytes]):
    """One sealed slot of ``lines``, each with its own time; a list of the slots freed."""
    times = np.arange(T0, T0 + len(lines) * 1000, 1000)
    data = b"".join(v + b"\n" for v in lines)
    drain, pool, kafka = fake_drain(tmp_path, data, times, origin=b"agent-7")
    assert len(pool.sealed()) == 1
    frees = []
    drain.on_slot_done = frees.append
    return drain, pool, kafka, frees, dict(zip(lines, times.tolist(), strict=True))


def _events(n: int) -> list[bytes]:
    return [b"event %d" % i for i in range(n)]


def _pump(drain, pool, turns: int = 20) -> None:
    for _ in range(turns):
        drain.pump()
        if not pool.sealed():
            return


def _dead_letters(tmp_path) -> list[dict]:
    path = tmp_path / "dead" / "dead-letter.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _assert_kafka_holds(kafka, time_of: dict, values) -> None:
    """Each of ``values`` exactly once, with its own timestamp, the origin and incarnation
    headers, and its own record number (the line's place in the slot: ``time_of`` is in line
    order), however often it went."""
    assert Counter(kafka.values()) == Counter(values)
    number_of = {v: i for i, v in enumerate(time_of)}
    for topic, value, key, ts, headers in kafka.log:
        seq = ("docket-seq", number_of[value].to_bytes(8, "big"))
        assert (topic, key, ts, headers) == ("t", None, time_of[value], [*ORIGIN, seq])


def test_a_slot_with_mixed_outcomes_is_freed_once_when_its_retried_record_is_acked(tmp_path):
    lines = _events(60)
    drain, pool, kafka, frees, time_of = _slot(tmp_path, lines)
    kafka.script(b"event 10", RETRIABLE, HOLD)      # fails, then waits in flight
    kafka.script(b"event 20", TOO_LARGE, TOO_LARGE)  # with its batch, then alone
    drain.pump()
    assert len(kafka.log) == 58 and drain.settled == drain.handed      # a zero point ...
    drain.pump()
    for _ in range(5):
        drain.pump()
    assert frees == [] and len(pool.sealed()) == 1  # ... but "event 10" is not acknowledged
    lone = kafka.lones[0]
    assert lone.conf["batch.num.messages"] == 1 and lone.produced == [b"event 20"]

    for p in kafka.producers:                       # wherever "event 10" waits
        p.release(OK)
    _pump(drain, pool)
    for _ in range(3):
        drain.pump()
    assert len(frees) == 1 and not pool.sealed()
    assert drain.metrics.get("agent_drain_slots_freed_total") == 1
    assert drain.metrics.get("agent_drain_sent_events_total") == 59
    _assert_kafka_holds(kafka, time_of, [v for v in lines if v != b"event 20"])

    [dead] = _dead_letters(tmp_path)
    assert base64.b64decode(dead["value_b64"]) == b"event 20"
    assert dead["code"] == "MSG_SIZE_TOO_LARGE" and dead["timestamp_ms"] == time_of[b"event 20"]
    number = list(time_of).index(b"event 20")
    assert dead["headers"] == [[k, base64.b64encode(v).decode()] for k, v in
                               [*ORIGIN, ("docket-seq", number.to_bytes(8, "big"))]]
    [entry] = drain.journal.entries()
    assert (entry["reason"], entry["events"]) == ("kafka_msg_size_too_large", 1)
    assert entry["records"] == [number, number]     # the hole downstream is journalled
    assert drain.metrics.get("agent_dropped_events_total", reason="kafka_msg_size_too_large",
                             topic="t", intentional="false") == 1
    assert drain.metrics.get("agent_drain_retried_events_total", reason="kafka_not_enough_replicas",
                             topic="t") == 1
    drain.close()
    pool.close()


def test_records_refused_with_their_batch_as_too_large_go_again_alone(tmp_path, caplog):
    """The broker refuses a whole batch over the topic's max.message.bytes: every record in it
    is reported too large (seen with librdkafka 2.16), though each fits alone."""
    lines = _events(40)
    drain, pool, kafka, frees, time_of = _slot(tmp_path, lines)
    for v in lines:
        kafka.script(v, TOO_LARGE)
    with caplog.at_level(logging.WARNING, logger="docket.agent.drain"):
        _pump(drain, pool)
    assert len(frees) == 1 and not pool.sealed()
    assert _dead_letters(tmp_path) == [] and drain.journal.entries() == []
    _assert_kafka_holds(kafka, time_of, lines)
    assert sorted(kafka.lones[0].produced) == sorted(lines)     # all of them, alone
    assert drain.metrics.get("agent_drain_retried_events_total",
                             reason="kafka_msg_size_too_large", topic="t") == 40
    assert drain.metrics.get("agent_drain_sent_events_total") == 40
    assert "batch.size" in caplog.text                  # the operator is told why it is slow
    drain.close()
    pool.close()


def test_a_record_out_alone_when_the_producer_is_replaced_goes_again(tmp_path):
    """Its report would have come from the lone producer, which a fatal error replaced."""
    lines = _events(30)
    drain, pool, kafka, frees, time_of = _slot(tmp_path, lines)
    kafka.script(b"event 5", TOO_LARGE, NEVER)
    drain.pump()
    drain.pump()
    assert drain.inflight[0].alone_out == 1
    kafka.senders[0].fail_fatally()
    _pump(drain, pool)
    assert len(frees) == 1
    assert set(kafka.values()) == set(lines)            # every one (some twice)
    assert _dead_letters(tmp_path) == []
    drain.close()
    pool.close()


def test_a_slot_sent_again_after_rebuilds_leaves_out_only_its_dead_lettered_record(
        tmp_path, send_path):
    """Two records alike (value, key, time): one is dead-lettered, the other acknowledged. Two
    fatal errors later, the slot has gone again twice, each time with one of them, and the
    dead one is in the dead letter once. The native path leaves out the acknowledged prefix
    too (events 0-6: event 7's report is lost), and still counts it as sent."""
    lines = _events(30)
    twin = b"twin"
    times = np.arange(T0, T0 + 32 * 1000, 1000)
    times[31] = times[30]
    data = b"".join(v + b"\n" for v in [*lines, twin, twin])
    drain, pool, kafka = fake_drain(tmp_path, data, times, origin=b"agent-7")
    frees = []
    drain.on_slot_done = frees.append
    kafka.script(twin, TOO_LARGE, OK, TOO_LARGE)        # one refused alone, the other taken
    kafka.script(b"event 7", NEVER, NEVER)              # a report lost at each rebuild
    drain.pump()
    drain.pump()
    assert len(_dead_letters(tmp_path)) == 1
    kafka.senders[0].fail_fatally()
    drain.pump()
    kafka.senders[-1].fail_fatally()
    _pump(drain, pool)
    assert len(frees) == 1
    last = kafka.senders[-1]
    prefix = 7 if send_path == "native" else 0
    assert len(last.produced) == 31 - prefix and last.produced.count(twin) == 1
    assert last.produced[0] == b"event %d" % prefix
    assert set(kafka.values()) == {*lines, twin}
    assert len(_dead_letters(tmp_path)) == 1 and len(drain.journal.entries()) == 1
    assert drain.metrics.get("agent_drain_sent_events_total") == 31
    drain.close()
    pool.close()


def test_a_failed_record_with_a_twin_in_its_slot_never_takes_the_twins_number(tmp_path):
    """A failed report carries no headers: when the slot holds the same value twice (numbers 5
    and 20), the report cannot say which of them failed. Both go again — a twin that had arrived
    arrives twice under its own number — and no number goes missing."""
    lines = _events(30)
    lines[20] = lines[5]
    drain, pool, kafka, frees, _time_of = _slot(tmp_path, lines)
    kafka.script(b"event 5", RETRIABLE)              # the first hand-over of the value fails
    _pump(drain, pool)
    for _ in range(3):
        drain.pump()
    assert len(frees) == 1 and not pool.sealed()
    numbers = {}
    for _topic, value, _key, _ts, headers in kafka.log:
        numbers.setdefault(int.from_bytes(dict(headers)["docket-seq"], "big"), set()).add(value)
    assert sorted(numbers) == list(range(30))       # number 5 is not lost to number 20
    assert numbers[5] == numbers[20] == {b"event 5"}
    drain.close()
    pool.close()


def test_a_pump_without_reports_hands_a_slot_over_and_finishes_none(tmp_path):
    """The service's first pump of a turn (before it writes the checkpoints) produces the slot
    just sealed and serves no report: Kafka may have acknowledged every record, yet no slot is
    finished or freed until a full pump serves the reports."""
    lines = _events(30)
    drain, pool, kafka, frees, time_of = _slot(tmp_path, lines)
    assert drain.pump(reports=False) == 30
    assert drain._outstanding() == 30 and len(drain.inflight) == 1     # handed over
    for _ in range(3):
        assert drain.pump(reports=False) == 0
    assert drain._outstanding() == 30                    # no report served
    assert frees == [] and len(pool.sealed()) == 1
    _pump(drain, pool)
    assert len(frees) == 1 and pool.sealed() == []
    _assert_kafka_holds(kafka, time_of, lines)
