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
