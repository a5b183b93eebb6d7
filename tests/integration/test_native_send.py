"""The native send path (``docket_native.SlotProducer``, agent/native) against a real broker:
a slot's records arrive whole, with docket's headers and their times, each once; a slot with
mixed outcomes — acknowledged, taken back from librdkafka's queue (to send again), refused as
too large (dead) — is reported once, with every record accounted for by its index."""

from __future__ import annotations

import time

import numpy as np
import pytest

from agent.buffer import BufferPool, Chunk
from broker.admin import TopicSpec, ensure_topics
from docket_common.names import INCARNATION_HEADER, ORIGIN_HEADER, SEQ_HEADER
from tests.kafkautil import read_all

native = pytest.importorskip("docket_native", reason="the native extension is not built "
                             "(make native)")

TS = 1_763_766_000_000
HEADERS = [(ORIGIN_HEADER, b"web-1"), (INCARNATION_HEADER, b"1763766000000-0a1b2c3d")]
PURGE_QUEUE, MSG_SIZE_TOO_LARGE = -152, 10        # librdkafka's codes (rd_kafka_resp_err_t)
INVALID_ARG, UNKNOWN = -186, -1                   # librdkafka's; the extension's own


def sealed_slot(tmp_path, topic: str, lines: list[bytes]):
    pool = BufferPool(tmp_path / "pool", 64 << 20, 4 << 20, linger_ms=0, sync_on_seal=False)
    data = b"".join(line + b"\n" for line in lines)
    chunk = Chunk.from_lines(np.frombuffer(data, np.uint8),
                             np.arange(TS, TS + len(lines), dtype=np.int64))
    assert pool.append(topic, chunk, source=1).complete(chunk)
    pool.seal_all()
    (slot,) = pool.take()
    return pool, slot


def blocks(slot):
    """Per block: (first index, payload view, offsets, lengths, timestamps, numbers)."""
    index, number = 0, slot.first_record
    for block in slot.blocks():
        n = len(block.offsets)
        yield (index, memoryview(slot.payload), block.offsets.astype(np.int64),
               block.lengths.astype(np.int64), block.timestamps.astype(np.int64),
               np.arange(number, number + n, dtype=np.int64))
        index, number = index + n, number + n


def send_all(producer, token, topic, block, failures: list, start=0) -> None:
    """Hand the block over, serving reports between hand-overs (failures kept in
    ``failures``: each is handed back once, by whichever poll serves it)."""
    index, payload, offsets, lengths, times, numbers = block
    done = start
    while done < len(offsets):
        done = producer.send(token, index, topic, payload, offsets, lengths, times, HEADERS,
                             numbers, None, done)
        failed, finished, _errors, _logs = producer.poll(0.01)
        failures += failed
        assert not finished                  # not sealed yet: never done


def wait_done(producer, failures: list, timeout_s: float = 60) -> tuple[list, list]:
    """(the failures, the slots done) served until a slot is done."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        failed, done, _errors, _logs = producer.poll(0.1)
        failures += failed
        if done:
            return failures, done
    raise AssertionError(f"no slot reported done in {timeout_s} s")


def test_a_slot_arrives_whole_with_its_identity_and_times(kafka, tmp_path, topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=3)])
    lines = [b"event %06d " % i + b"x" * (i % 50) for i in range(5000)]
    pool, slot = sealed_slot(tmp_path, topic_name, lines)
    producer = native.SlotProducer({"bootstrap.servers": kafka.bootstrap_servers,
                                    "acks": "all", "enable.idempotence": "true",
                                    "compression.type": "snappy", "linger.ms": "2"})
    failures: list = []
    for block in blocks(slot):
        send_all(producer, 7, topic_name, block, failures)
    producer.seal(7, slot.record_count)
    assert wait_done(producer, failures) == ([], [(7, 5000, 0, 5000)])
    assert producer.poll(0.1)[:2] == ([], []) and len(producer) == 0      # reported once
    got = {}
    for m in read_all(kafka.bootstrap_servers, topic_name):
        headers = dict(m.headers())
        assert headers[ORIGIN_HEADER] == b"web-1"
        assert headers[INCARNATION_HEADER] == HEADERS[1][1]
        number = int.from_bytes(headers[SEQ_HEADER], "big")
        assert number not in got
        got[number] = (m.value(), m.timestamp()[1])
    first = slot.first_record
    assert got == {first + i: (line, TS + i) for i, line in enumerate(lines)}
    pool.close()


def test_a_slot_with_mixed_outcomes_is_reported_once_with_each_failure_by_index(
        kafka, tmp_path, topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    big = {3, 250, 640}                          # too large for this client: refused at once
    lines = [b"y" * 5000 if i in big else b"line %d" % i for i in range(800)]
    pool, slot = sealed_slot(tmp_path, topic_name, lines)
    (block,) = list(blocks(slot))
    index, payload, offsets, lengths, times, numbers = block
    producer = native.SlotProducer({"bootstrap.servers": kafka.bootstrap_servers,
                                    "acks": "all", "message.max.bytes": "4000",
                                    "linger.ms": "30000", "batch.num.messages": "100000"})
    # The first half goes and is acknowledged (flush sends at once, linger or not) ...
    half = 400
    first = (index, payload, offsets[:half], lengths[:half], times[:half], numbers[:half])
    failures: list = []
    send_all(producer, 9, topic_name, first, failures)
    producer.flush(30)
    producer.poll(0)
    assert producer.acked_prefix(9) == 3       # record 3, refused, stops the prefix there
    # ... the second waits in librdkafka's queue (a 30 s linger) and is taken back.
    rest = (half, payload, offsets[half:], lengths[half:], times[half:], numbers[half:])
    send_all(producer, 9, topic_name, rest, failures)
    assert len(producer) > 0
    producer.purge()
    producer.seal(9, len(lines))
    failed, ((token, acked, n_failed, prefix),) = wait_done(producer, failures)
    assert token == 9 and {t for t, *_ in failed} == {9} and n_failed == len(failed)
    assert prefix == 3                  # record 3, too large, never acknowledged: it stops there
    codes = {i: (c, refused) for _t, i, c, refused in failed}
    assert len(codes) == len(failed)                             # each index once
    assert {i for i, c in codes.items() if c == (MSG_SIZE_TOO_LARGE, True)} == big
    assert {i for i, c in codes.items() if c == (PURGE_QUEUE, False)} == \
        set(range(half, 800)) - big
    assert acked == half - len({i for i in big if i < half})
    assert acked + len(failed) == len(lines)
    arrived = sorted(int.from_bytes(dict(m.headers())[SEQ_HEADER], "big") - slot.first_record
                     for m in read_all(kafka.bootstrap_servers, topic_name))
    assert arrived == [i for i in range(half) if i not in big]
    pool.close()


def test_flush_sends_what_lingers_at_once(kafka, tmp_path, topic_name):
    """flush waits for every report with librdkafka's linger set aside: records that would
    linger a minute are sent and acknowledged within its 20 s (it once looked for an
    instant at a time, and what lingered stayed for the whole linger)."""
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    lines = [b"lingering %d" % i for i in range(50)]
    pool, slot = sealed_slot(tmp_path, topic_name, lines)
    (block,) = list(blocks(slot))
    producer = native.SlotProducer({"bootstrap.servers": kafka.bootstrap_servers,
                                    "acks": "all", "linger.ms": "60000"})
    failures: list = []
    send_all(producer, 5, topic_name, block, failures)
    producer.seal(5, len(lines))
    time.sleep(1)                       # the topic is known, the records wait for the linger
    assert producer.flush(20)
    assert len(producer) == 0
    assert producer.poll(0)[:2] == ([], [(5, len(lines), 0, len(lines))])
    arrived = sorted(m.value() for m in read_all(kafka.bootstrap_servers, topic_name))
    assert arrived == sorted(lines)
    pool.close()


def test_bad_buffers_are_refused_with_a_clear_error(kafka):
    producer = native.SlotProducer({"bootstrap.servers": kafka.bootstrap_servers})
    one = np.zeros(1, np.int64)
    with pytest.raises(ValueError, match="outside the payload"):
        producer.send(1, 0, "t", b"abc", np.array([2], np.int64), np.array([5], np.int64), one,
                      [], None, None, 0)
    with pytest.raises(ValueError, match="one item per record"):
        producer.send(1, 0, "t", b"abc", one, np.zeros(2, np.int64), one, [], None, None, 0)
    with pytest.raises(ValueError, match="cannot create the producer"):
        native.SlotProducer({"bootstrap.servers": "x:1", "no.such.property": "1"})


@pytest.mark.parametrize("topic, code", [("t" * 600, INVALID_ARG), ("a\0b", UNKNOWN)],
                         ids=["too-long", "nul"])
def test_a_topic_name_librdkafka_refuses_refuses_every_record_once(kafka, tmp_path, topic,
                                                                  code):
    lines = [b"line %d" % i for i in range(50)]
    pool, slot = sealed_slot(tmp_path, "docket-native-named", lines)
    (block,) = list(blocks(slot))
    index, payload, offsets, lengths, times, numbers = block
    producer = native.SlotProducer({"bootstrap.servers": kafka.bootstrap_servers})
    assert producer.send(4, index, topic, payload, offsets, lengths, times, HEADERS, numbers,
                         None, 10) == len(lines)               # from record 10 on, as asked
    assert len(producer) == 0
    producer.seal(4, len(lines) - 10)
    failed, done = wait_done(producer, [])
    assert done == [(4, 0, len(lines) - 10, 0)]
    assert sorted(failed) == [(4, i, code, True) for i in range(10, len(lines))]
    pool.close()


def test_one_poll_serves_every_report_waiting_across_partitions(kafka, tmp_path, topic_name):
    """Records of many partitions taken back at once: one poll(0) serves every report (one
    event per partition's batch), so nothing is left for a flush to wait for."""
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=4)])
    lines = [b"spread %d" % i for i in range(400)]
    pool, slot = sealed_slot(tmp_path, topic_name, lines)
    producer = native.SlotProducer({"bootstrap.servers": kafka.bootstrap_servers,
                                    "linger.ms": "30000", "batch.num.messages": "100000"})
    keys = [b"k%d" % i for i in range(400)]                   # keys: every partition used
    index, payload, offsets, lengths, times, numbers = next(blocks(slot))
    assert producer.send(3, index, topic_name, payload, offsets, lengths, times, HEADERS,
                         numbers, keys, 0) == 400
    producer.seal(3, 400)
    producer.purge(in_flight=True)
    failed, done, _errors, _logs = producer.poll(0)
    assert len(failed) == 400 and {c for _t, _i, c, _r in failed} == {PURGE_QUEUE}
    assert done == [(3, 0, 400, 0)] and len(producer) == 0 and producer.flush(0)
    pool.close()


def test_records_sent_again_by_index_arrive_under_their_own_numbers(kafka, tmp_path,
                                                                   topic_name):
    """Records picked out of a slot (the ones a purge gave back) go again as one block with
    their slot-wide ``indices``: each arrives with its own number, and a failure would name
    its index in the slot."""
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=2)])
    lines = [b"again %04d" % i for i in range(100)]
    pool, slot = sealed_slot(tmp_path, topic_name, lines)
    (block,) = list(blocks(slot))
    _index, payload, offsets, lengths, times, numbers = block
    picked = np.array([3, 17, 18, 64, 99], np.int64)
    producer = native.SlotProducer({"bootstrap.servers": kafka.bootstrap_servers})
    assert producer.send(7, 0, topic_name, payload, offsets[picked], lengths[picked],
                         times[picked], HEADERS, numbers[picked], None, 0, picked) == 5
    producer.seal(7, 5)
    failures, done = wait_done(producer, [])
    assert failures == [] and done == [(7, 5, 0, 0)]      # not from index 0: no prefix
    got = {int.from_bytes(dict(m.headers())[SEQ_HEADER], "big") - slot.first_record: m.value()
           for m in read_all(kafka.bootstrap_servers, topic_name)}
    assert got == {int(i): lines[i] for i in picked}
    with pytest.raises(ValueError, match="one item per record"):
        producer.send(8, 0, topic_name, payload, offsets[picked], lengths[picked],
                      times[picked], HEADERS, None, None, 0, picked[:2])
    pool.close()


def test_a_send_that_begins_past_an_acknowledged_prefix_reports_the_whole_prefix(
        kafka, tmp_path, topic_name):
    """A slot found at start with its first 60 records acknowledged before the crash goes
    from record 60 on (``begin``): its prefix counts from there, and ends at the slot's end."""
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=2)])
    lines = [b"rest %04d" % i for i in range(100)]
    pool, slot = sealed_slot(tmp_path, topic_name, lines)
    index, payload, offsets, lengths, times, numbers = next(blocks(slot))
    producer = native.SlotProducer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.begin(5, 60)
    assert producer.acked_prefix(5) == 60
    assert producer.send(5, index, topic_name, payload, offsets, lengths, times, HEADERS,
                         numbers, None, 60) == 100
    producer.seal(5, 40)
    assert wait_done(producer, []) == ([], [(5, 40, 0, 100)])
    assert sorted(int.from_bytes(dict(m.headers())[SEQ_HEADER], "big") - slot.first_record
                  for m in read_all(kafka.bootstrap_servers, topic_name)) == list(range(60, 100))
    pool.close()


def test_its_librdkafka_lines_are_handed_over_by_poll(tmp_path):
    """librdkafka's own lines reach the agent's log through ``poll``: from Info up by default,
    every line with a ``debug`` setting (here a broker nobody listens on)."""
    quiet = native.SlotProducer({"bootstrap.servers": "127.0.0.1:9"})
    chatty = native.SlotProducer({"bootstrap.servers": "127.0.0.1:9", "debug": "broker"})
    assert quiet.name() != chatty.name() and "#producer-" in chatty.name()
    seen: dict = {"quiet": [], "chatty": []}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not seen["chatty"]:
        seen["quiet"] += quiet.poll(0.1)[3]
        seen["chatty"] += chatty.poll(0.1)[3]
    assert any(level == 7 and fac in ("BROKER", "CONNECT", "STATE", "BRKMAIN")
               for level, fac, _text in seen["chatty"]), seen["chatty"][:5]
    assert all(level < 7 for level, _fac, _text in seen["quiet"]), seen["quiet"][:5]


def test_transaction_calls_commit_the_marker_whole_and_fencing_comes_back_as_fatal(
        kafka, tmp_path, topic_name):
    """Exactly once on this path (agent/drain/native_txn.py): the progress marker committed
    by the extension is read back whole by the Python client (which takes a committed
    offset's metadata as a C string), and a producer fenced by a newer one of the same
    ``transactional.id`` answers with the error confluent-kafka would raise: fatal."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    progress, txn_id = f"{topic_name}.progress", f"docket-agent-{topic_name}"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(progress, partitions=1)])
    conf = {"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": txn_id}
    first = native.SlotProducer(conf)
    assert first.init_transactions(30) is None and first.begin_transaction() is None
    marker = '{"v":1,"slots":[' + ",".join(f"[{i * 1000},1000,{i}]" for i in range(40)) + "]}"
    assert first.send_offsets_to_transaction(progress, 0, 40_000, marker, txn_id, 30) is None
    assert first.commit_transaction(30) is None
    reader = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": txn_id,
                       "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        [tp] = reader.committed([TopicPartition(progress, 0)], 30)
    finally:
        reader.close()
    assert (tp.offset, tp.metadata) == (40_000, marker)

    second = native.SlotProducer(conf)
    assert second.init_transactions(30) is None             # fences the first
    assert first.begin_transaction() is None                # local: no request yet
    outcome = first.send_offsets_to_transaction(progress, 0, 1, "{}", txn_id, 30)
    assert outcome is not None, "the fenced producer's call succeeded"
    code, text, fatal, _retriable, _abortable = outcome
    assert fatal and code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                              KafkaError.INVALID_PRODUCER_EPOCH), outcome
    assert text
