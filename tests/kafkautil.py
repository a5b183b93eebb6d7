"""Small helpers the Kafka tests share: read a topic to its end, bounded in time."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from broker.cluster import LocalCluster

# Server settings of the clusters the test fixtures and kits start (those a test starts as a
# user would, with `docket-broker up`, keep Kafka's defaults). Tests write records with fixed
# event times of past days (the same windows and figures every run); Kafka's default retention
# (7 days, checked every 5 minutes) deletes such records when its check falls between a test's
# write and its read (a CI run's test_native_send: "read 0 records; partitions still short",
# after 120 s). Test clusters keep every record whatever its time, and check every second, so
# that test_topics shows that they do.
TEST_BROKER_PROPS = {"log.retention.ms": -1, "log.retention.check.interval.ms": 1000}


def watermarks(bootstrap: str, topic: str, timeout_s: float = 30) -> dict[int, tuple[int, int]]:
    """Per partition, (log start offset, high watermark)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "docket-tests-watermarks",
                         "enable.auto.commit": False})
    try:
        md = consumer.list_topics(topic, timeout=timeout_s).topics[topic]
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
                for p in md.partitions}
    finally:
        consumer.close()


# What a partition of a topic just made answers while it elects its leader: asked again.
ELECTING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
            KafkaError.UNKNOWN_TOPIC_OR_PART}


def records_held(consumer, topic: str, tries: int = 50, pause_s: float = 0.2) -> int:
    """How many records ``topic`` holds (its partitions' high watermarks summed) through
    ``consumer``: 0 before it exists; asked again while its new partitions elect their
    leaders (a topic a mirror just made answers NOT_LEADER_FOR_PARTITION for a moment, which
    a wait polling this must take for "not yet", not for a failure)."""
    for _ in range(tries):
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return 0
        try:
            return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                       for p in md.partitions)
        except KafkaException as exc:
            if exc.args[0].code() not in ELECTING:
                raise
            time.sleep(pause_s)
    raise AssertionError(f"{topic}: its partitions had no leader after {tries} tries")


def high_watermarks(bootstrap: str, topic: str, timeout_s: float = 30) -> dict[int, int]:
    return {p: high for p, (_low, high) in watermarks(bootstrap, topic, timeout_s).items()}


class Held:
    """How many records Kafka holds of ``topic`` (the sum of its partitions' high watermarks),
    looked at again and again through one consumer kept open (a benchmark's end): a consumer
    made for each look (``high_watermarks``) took about 60 ms, a look of this kind a
    millisecond or two a partition."""

    def __init__(self, bootstrap: str, topic: str):
        self.consumer = Consumer({"bootstrap.servers": bootstrap,
                                  "group.id": "docket-tests-held",
                                  "enable.auto.commit": False})
        self.topic = topic
        self.partitions: list[TopicPartition] = []

    def __call__(self) -> int:
        if not self.partitions:             # (a topic not made yet holds nothing)
            md = self.consumer.list_topics(self.topic, timeout=30).topics.get(self.topic)
            self.partitions = [TopicPartition(self.topic, p)
                               for p in (md.partitions if md is not None else ())]
        return sum(self.consumer.get_watermark_offsets(tp, timeout=30, cached=False)[1]
                   for tp in self.partitions)

    def close(self) -> None:
        self.consumer.close()


def read_all(bootstrap: str, topic: str, timeout_s: float = 120) -> list:
    """Every record of ``topic`` from offset 0 to the current high watermarks."""
    ends = high_watermarks(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "docket-tests-reader",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    remaining = {p: end for p, end in ends.items() if end > 0}
    records = []
    deadline = time.monotonic() + timeout_s
    try:
        while remaining:
            if time.monotonic() > deadline:
                deleted = {p: low for p, (low, _high) in watermarks(bootstrap, topic).items()
                           if low > 0}
                raise AssertionError(f"read {len(records)} records; partitions still short: "
                                     f"{remaining}" + (f"; the broker deleted records below "
                                                       f"offsets {deleted}" if deleted else ""))
            for msg in consumer.consume(num_messages=10000, timeout=1.0):
                if msg.error():
                    raise AssertionError(f"consume error: {msg.error()}")
                records.append(msg)
                if msg.offset() + 1 >= remaining.get(msg.partition(), 0):
                    remaining.pop(msg.partition(), None)
    finally:
        consumer.close()
    return records


@contextlib.contextmanager
def bench_kafka(work: Path) -> Iterator[str]:
    """For a benchmark: ``$KAFKA_BOOTSTRAP`` when set, else a 1-broker local cluster in
    ``work`` for the length of the block. Yields the bootstrap servers."""
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP")
    if bootstrap:
        yield bootstrap
        return
    cluster = LocalCluster(work / "kafka", broker_props=TEST_BROKER_PROPS)
    try:
        yield cluster.up(brokers=1, base_port=0).bootstrap_servers
    finally:
        cluster.down()
