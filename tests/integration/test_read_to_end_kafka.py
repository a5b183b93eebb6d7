"""The end rule (``docket_common.read_to_end``) on a real broker, with a consumer kept between
reads as the mirror's watcher keeps its own: records that came after a read's ends are not
handed over by that read, and the next read hands them over (they were lost once: the watcher
then waited forever for an offset its mirror had committed)."""

from __future__ import annotations

import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from broker.admin import TopicSpec, ensure_topics
from docket_common.read_to_end import read_to_ends


def test_a_kept_consumer_reads_what_came_after_the_ends_in_its_next_read(kafka, topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=2)])
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for i in range(10):
        p.produce(topic_name, b"%d" % i, partition=i % 2)
    assert p.flush(30) == 0                        # offsets 0..4 on each partition
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": str(uuid.uuid4()),
                  "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic_name, q, OFFSET_BEGINNING) for q in (0, 1)])
        taken: list[tuple[int, int]] = []

        def take(m):
            taken.append((m.partition(), m.offset()))
        # ends taken "before" offsets 2.. of partition 0 and 4 of partition 1 were written
        assert read_to_ends(c, topic_name, {0: 2, 1: 4}, take, 30) == {}
        assert sorted(taken) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (1, 3)]
        taken.clear()
        assert read_to_ends(c, topic_name, {0: 5, 1: 5}, take, 30) == {}
        assert sorted(taken) == [(0, 2), (0, 3), (0, 4), (1, 4)]
    finally:
        c.close()
