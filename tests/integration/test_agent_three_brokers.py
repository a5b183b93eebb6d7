"""The agent against a 3-broker cluster (replication 3): one broker SIGKILLed mid-stream."""

from __future__ import annotations

import time

import pytest

from tests.agentkit import consume_counts
from tests.integration.test_agent_end_to_end import (
    assert_exactly_once,
    parse_id,
    setup_agent,
    start_writer,
)


@pytest.mark.cluster3
@pytest.mark.slow
def test_one_of_three_brokers_killed_mid_stream_loses_nothing(kafka3, tmp_path, topic_name,
                                                             agent_send_path):
    counts, resent = kill_one_broker_run(kafka3, tmp_path, topic_name,
                                         {"send_path": agent_send_path})
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    # No agent was killed: a duplicate can only be a record the drain sent again after a
    # report it could not trust (a timeout while the broker died may hide a write): no more
    # duplicates than records sent again.
    assert duplicates <= resent
    if duplicates == 0:
        assert_exactly_once(counts, total=len(counts))


@pytest.mark.cluster3
@pytest.mark.slow
def test_one_of_three_brokers_killed_exactly_once_no_duplicate(kafka3, tmp_path, topic_name):
    """``broker.delivery = "exactly_once"``: a read_committed reader sees each id once."""
    counts, _ = kill_one_broker_run(kafka3, tmp_path, topic_name,
                                    {"delivery": "exactly_once"})
    assert_exactly_once(counts, total=len(counts))


def kill_one_broker_run(kafka3, tmp_path, topic_name, broker: dict,
                        total: int = 300_000) -> tuple:
    """300,000 lines at 50,000 lines/s, broker 2 SIGKILLed 2 s in; every id must arrive.
    Returns the counts by id (read_committed) and the records the drain sent again."""
    cluster = kafka3.controlled()
    agent, logs = setup_agent(tmp_path, kafka3.bootstrap_servers, topic_name, partitions=6,
                              replication=3, broker=broker)
    agent.start()
    writer = start_writer(logs, total, 100_000, 50_000)
    victim = 2
    try:
        time.sleep(2)
        cluster.kill_node(victim)
        assert writer.wait(timeout=600) == 0
        counts = consume_counts(kafka3.bootstrap_servers, topic_name, total, 600, parse_id)
        resent = agent.metric("agent_drain_retried_events_total")
        aborted = agent.metric("agent_drain_transactions_aborted_total")
    finally:
        rc = agent.stop()
        cluster.start_node(victim)
    assert rc == 0
    missing = [i for i in range(total) if counts.get(i, 0) == 0]
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    print(f"one broker killed ({broker}): {len(missing)} missing, {duplicates} duplicates, "
          f"{resent:.0f} records sent again after a failure report, {aborted:.0f} "
          f"transactions aborted")
    assert not missing, f"first missing: {missing[:10]}"
    assert set(counts) <= set(range(total))
    return counts, resent
