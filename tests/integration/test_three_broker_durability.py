"""A 3-broker cluster (replication 3, min.insync.replicas 2) keeps every acknowledged record
when one broker is SIGKILLed mid-stream."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from broker.admin import TopicSpec, admin_client, ensure_topics
from tests.kafkautil import high_watermarks, read_all

RECORDS = 100_000
KILL_AT = 40_000


def _leader_of_partition_zero(bootstrap: str, topic: str, timeout_s: float = 60) -> int:
    """The leader of the topic's partition 0, once the broker asked knows it: a topic just
    created is in the controller's metadata before every broker's (one run asked a broker that
    did not have it yet: a KeyError)."""
    admin = admin_client(bootstrap)
    deadline = time.monotonic() + timeout_s
    while True:
        meta = admin.list_topics(topic, timeout=10).topics.get(topic)
        if meta is not None and meta.error is None and 0 in meta.partitions \
                and meta.partitions[0].leader >= 0:
            return meta.partitions[0].leader
        assert time.monotonic() < deadline, f"{topic}: no leader of partition 0 known " \
            f"after {timeout_s:g} s ({meta.error if meta is not None else 'not listed'})"
        time.sleep(0.2)


@pytest.mark.cluster3
def test_idempotent_producer_loses_nothing_when_one_of_three_brokers_is_killed(kafka3, topic_name):
    cluster = kafka3.controlled()
    ensure_topics(kafka3.bootstrap_servers, [TopicSpec(topic_name, partitions=6,
                                                       replication_factor=3)])
    victim = _leader_of_partition_zero(kafka3.bootstrap_servers, topic_name)
    producer = Producer({
        "bootstrap.servers": kafka3.bootstrap_servers,
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": "snappy",
        "linger.ms": 5,
    })
    failures = []
    acked = 0

    def on_delivery(err, msg):
        nonlocal acked
        if err is not None:
            failures.append(err)
        else:
            acked += 1

    try:
        for i in range(RECORDS):
            if i == KILL_AT:   # records are in flight: no flush before the kill
                cluster.kill_node(victim)
            while True:
                try:
                    producer.produce(topic_name, key=str(i % 97).encode(),
                                     value=f"id-{i:07d}".encode(), on_delivery=on_delivery)
                    break
                except BufferError:   # local queue full: serve callbacks, then retry
                    producer.poll(0.05)
            producer.poll(0)
        remaining = producer.flush(120)
        assert remaining == 0, f"{remaining} records still unacknowledged after 120 s"
        assert failures == [], f"delivery failures: {failures[:5]}"
        assert acked == RECORDS

        ids = [m.value().decode() for m in read_all(kafka3.bootstrap_servers, topic_name)]
        assert len(ids) == RECORDS, f"read {len(ids)} records, produced {RECORDS}"
        assert set(ids) == {f"id-{i:07d}" for i in range(RECORDS)}
        assert sum(high_watermarks(kafka3.bootstrap_servers, topic_name).values()) == RECORDS
    finally:
        cluster.start_node(victim)
