"""Topic administration against the real local Kafka."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import ConfigResource

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
from docket_common.procs import stat_fields
from tests.kafkautil import read_all


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


def test_a_record_of_a_year_ago_outlives_the_test_clusters_retention_checks(kafka, topic_name):
    """Tests write records with fixed event times of past days; the clusters the tests start keep
    them (``tests/kafkautil.TEST_BROKER_PROPS``). Read back after the broker's retention task has
    run — first 30 s after the broker started, then every second: under Kafka's default 7-day
    retention it deletes such a record, and a test's read found nothing (``read_all``)."""
    cluster = kafka.controlled()
    admin = admin_client(kafka.bootstrap_servers)
    (configs,) = admin.describe_configs([ConfigResource("broker", "1")]).values()
    settings = configs.result()
    assert int(settings["log.retention.check.interval.ms"].value) <= 1000   # the checks run
    assert int(settings["log.retention.ms"].value) == -1
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    year_ago = int(time.time() * 1000) - 365 * 86_400_000
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    producer.produce(topic_name, b"a year ago", timestamp=year_ago)
    assert producer.flush(30) == 0
    written = time.monotonic()
    started = int(stat_fields(cluster.pid(1))[19]) / os.sysconf("SC_CLK_TCK")   # since boot
    with open("/proc/uptime") as f:
        up_s = float(f.read().split()[0]) - started
    time.sleep(max(0.0, 33 - up_s, 3 - (time.monotonic() - written)))
    (record,) = read_all(kafka.bootstrap_servers, topic_name, timeout_s=30)
    assert (record.value(), record.timestamp()[1]) == (b"a year ago", year_ago)
