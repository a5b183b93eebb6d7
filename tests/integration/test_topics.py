"""Topic administration against the real local Kafka."""

from __future__ import annotations

import pytest

from broker.admin import (
    AUDIT_TOPIC_CONFIG,
    TopicSpec,
    admin_client,
    describe,
    ensure_audit_topic,
    ensure_topics,
    list_topics,
)
from broker.errors import BrokerError, TopicConflict


def test_ensure_creates_once_and_then_finds_the_topic(kafka, topic_name):
    spec = TopicSpec(topic_name, partitions=4, replication_factor=1)
    assert ensure_topics(kafka.bootstrap_servers, [spec]) == [topic_name]
    assert ensure_topics(kafka.bootstrap_servers, [spec]) == []
    assert list_topics(kafka.bootstrap_servers)[topic_name] == (4, 1)


def test_a_topic_with_other_partitions_is_a_conflict_not_a_silent_reuse(kafka, topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=2)])
    with pytest.raises(TopicConflict, match="exists with 2 partition"):
        ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=5)])


def test_describing_a_missing_topic_does_not_create_it(kafka, topic_name):
    admin = admin_client(kafka.bootstrap_servers)
    assert describe(admin, topic_name) is None
    assert describe(admin, topic_name) is None
    assert topic_name not in list_topics(kafka.bootstrap_servers)


def test_impossible_replication_factor_names_the_broker_count(kafka, topic_name):
    with pytest.raises(BrokerError) as info:
        ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, replication_factor=3)])
    assert "1 broker(s)" in info.value.hint


def test_audit_topic_gets_its_retention(kafka):
    name = "docket.audit.test"
    ensure_audit_topic(kafka.bootstrap_servers, name=name)
    admin = admin_client(kafka.bootstrap_servers)
    from confluent_kafka.admin import ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, name)
    configs = admin.describe_configs([res])[res].result(timeout=10)
    for key, value in AUDIT_TOPIC_CONFIG.items():
        assert configs[key].value == value
