"""The tests' shared Kafka helpers without a cluster: ``records_held`` while a topic a mirror
just made elects its partitions' leaders (a CI run of the secured mirror test failed on the
NOT_LEADER_FOR_PARTITION such a partition answered between its metadata and its watermarks,
the wait taking the answer for a failure instead of "not yet")."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import KafkaError, KafkaException

from tests.kafkautil import records_held


class Electing:
    """A consumer whose topic ``t`` has two partitions of 10 records each, which answer
    ``code`` for their watermarks the first ``times`` asks."""

    def __init__(self, code: int, times: int, exists: bool = True):
        self.code, self.left, self.exists = code, times, exists
        self.asks = 0

    def list_topics(self, topic, timeout=None):
        md = SimpleNamespace(partitions={0: None, 1: None}, error=None)
        return SimpleNamespace(topics={topic: md} if self.exists else {})

    def get_watermark_offsets(self, tp, timeout=None):
        self.asks += 1
        if self.left:
            self.left -= 1
            raise KafkaException(KafkaError(self.code))
        return 0, 10


@pytest.mark.parametrize("code", [KafkaError.NOT_LEADER_FOR_PARTITION,
                                  KafkaError.LEADER_NOT_AVAILABLE,
                                  KafkaError.UNKNOWN_TOPIC_OR_PART])
def test_a_partition_electing_its_leader_is_asked_again(code):
    consumer = Electing(code, times=3)
    assert records_held(consumer, "t", pause_s=0) == 20
    assert consumer.asks == 3 + 2


def test_a_topic_not_made_yet_holds_nothing():
    assert records_held(Electing(KafkaError.NOT_LEADER_FOR_PARTITION, 0, exists=False), "t") == 0


def test_another_error_is_raised_and_a_leader_that_never_comes_fails_the_wait():
    with pytest.raises(KafkaException):
        records_held(Electing(KafkaError.TOPIC_AUTHORIZATION_FAILED, 1), "t", pause_s=0)
    with pytest.raises(AssertionError, match="no leader after 5 tries"):
        records_held(Electing(KafkaError.NOT_LEADER_FOR_PARTITION, 99), "t", tries=5,
                     pause_s=0)
