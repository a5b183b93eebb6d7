"""The drain calls ``Producer.produce`` positionally (it is faster): pin the argument order of
the installed confluent-kafka, so an upgrade that changes it fails here. (That the timestamp and
the ``docket-origin`` header arrive in Kafka is checked end to end: the audit tiers test buckets
by both.)"""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaError, Producer

from agent.drain.drain import NO_PARTITION


def _producer() -> Producer:
    return Producer({"bootstrap.servers": "127.0.0.1:9"}, logger=logging.getLogger("quiet"))


def test_positional_produce_calls_the_fifth_argument_back():
    p = _producer()
    reports = []
    p.produce("t", b"value", b"key", NO_PARTITION, lambda err, msg: reports.append((err, msg)),
              None, 1_795_000_000_123, [("docket-origin", b"o")])
    p.purge(in_queue=True, in_flight=True)
    p.poll(1)
    assert len(reports) == 1
    err, msg = reports[0]
    assert err.code() == KafkaError._PURGE_QUEUE
    assert (msg.value(), msg.key()) == (b"value", b"key")


def test_seventh_is_the_timestamp_and_eighth_the_headers():
    p = _producer()
    with pytest.raises(TypeError):                      # a timestamp must be an integer
        p.produce("t", b"v", None, NO_PARTITION, None, None, "not a time", None)
    with pytest.raises(TypeError):                      # headers must be a list or a dict
        p.produce("t", b"v", None, NO_PARTITION, None, None, 1, 42)
    p.produce("t", b"v", None, NO_PARTITION, None, None, 1, [("h", b"x")])
    p.purge(in_queue=True, in_flight=True)


@pytest.mark.usefixtures("send_path")          # with both send paths of the drain
def test_records_that_fail_go_again_with_their_own_time_and_headers(tmp_path):
    """librdkafka's failed reports have no timestamp and no headers: the drain must take them
    from the slot, or records resent after an outage lose their window and their origin."""
    from collections import Counter

    import numpy as np

    from tests.unit.poolkit import unreachable_drain

    lines = [b"event %d" % i for i in range(300)] + [b"y" * 40_000]      # the last one splits
    data = b"".join(v + b"\n" for v in lines)
    times = np.arange(1_795_000_000_000, 1_795_000_000_000 + len(lines) * 1000, 1000)
    drain, pool = unreachable_drain(tmp_path, data, times, origin=b"agent-7")
    expected = Counter()
    for slot in pool.sealed():
        payload = bytes(slot.payload)
        for offsets, lengths, ts, _keys, headers in drain.block_lists(slot):
            for i, (o, n, t) in enumerate(zip(offsets, lengths, ts, strict=True)):
                expected[(payload[o:o + n], t, tuple(headers.of(i)))] += 1
    assert any(len(h) == 4 for _v, _t, h in expected)        # docket-part headers are there
    numbers = sorted(int.from_bytes(dict(h)["docket-seq"], "big") for _v, _t, h in expected)
    assert numbers == list(range(len(expected)))             # each record its own number
    drain.pump(budget=100_000)                               # all queued: the broker is away
    drain._purge()                                           # as at the start of an outage
    resent = Counter((v, ts, tuple(h)) for send in drain.inflight
                     for _topic, v, _k, ts, h in send.retry)
    assert resent == expected
    drain.close()
    pool.close()
