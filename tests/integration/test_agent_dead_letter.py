"""Records Kafka refuses for good, end to end: the real agent, the real local Kafka, a topic whose
``max.message.bytes`` is 16 KiB, a file of small lines and a few incompressible lines of ~40 KB
(over the topic's limit, under a slot). Only the large lines may be dead-lettered.

The broker refuses a whole batch over the limit, and librdkafka then reports every record of it
MSG_SIZE_TOO_LARGE. With the agent's default batch.size (1 MiB) every batch of small lines is
over 16 KiB, so all of them come back too large at first; with batch.size at the topic's limit
only the large lines, which librdkafka puts in batches of their own, do. Either way each small
line must arrive, and each large one be in the dead letter, the loss journal and the dropped
count, by its unique id."""

from __future__ import annotations

import base64
import json
import os
import time
from collections import Counter
from pathlib import Path

import pytest

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import consume_counts
from tests.integration.test_agent_end_to_end import parse_id, setup_agent

LIMIT = 16384
BIG_FIRST = 1_000_000          # ids of the large lines; the small ones count from 0


def small(i: int) -> bytes:
    return (b"id-%09d small " % i).ljust(100, b"s")


def large(i: int) -> bytes:
    """~40 KB that snappy cannot shrink below the limit (the broker checks compressed size)."""
    return b"id-%09d BIG " % i + base64.b64encode(os.urandom(30_000))


def write_lines(path: Path, small_ids: range, large_ids: list[int]) -> None:
    """The small lines with the large ones spread among them, appended in one write."""
    every = len(small_ids) // len(large_ids)
    lines = []
    for n, i in enumerate(small_ids):
        lines.append(small(i))
        if n % every == every // 2 and n // every < len(large_ids):
            lines.append(large(large_ids[n // every]))
    with open(path, "ab") as f:
        f.write(b"".join(v + b"\n" for v in lines))


def wait_for(what, predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not seen within {timeout_s:.0f} s: {what}")
        time.sleep(0.2)


@pytest.mark.parametrize("batch_size, delivery, send_path",
                         [(None, "at_least_once", "auto"), (LIMIT, "at_least_once", "auto"),
                          (None, "exactly_once", "auto"), (None, "exactly_once", "python")],
                         ids=["default_batch_size", "batch_size_at_the_topic_limit",
                              "exactly_once", "exactly_once_python_path"])
def test_only_records_too_large_on_their_own_are_dead_lettered(kafka, tmp_path, topic_name,
                                                                 batch_size, delivery,
                                                                 send_path):
    ensure_topics(kafka.bootstrap_servers,
                  [TopicSpec(topic_name, partitions=3, config={"max.message.bytes": str(LIMIT)})])
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name,
                              broker={"delivery": delivery, "send_path": send_path})
    if batch_size is not None:
        with open(agent.config, "a") as f:
            f.write(f'[broker.librdkafka_options]\n"batch.size" = {batch_size}\n')
    reason = "kafka_msg_size_too_large"
    first_small, first_large = range(0, 3000), [BIG_FIRST + k for k in range(6)]
    then_small, then_large = range(3000, 4000), [BIG_FIRST + k for k in range(6, 8)]
    small_ids = [*first_small, *then_small]
    large_ids = [*first_large, *then_large]
    agent.start()
    try:
        write_lines(logs / "app.log", first_small, first_large)
        wait_for("the first large lines dead-lettered",
                 lambda: agent.metric("agent_dropped_events_total", reason=reason) >= 6, 120)
        write_lines(logs / "app.log", then_small, then_large)      # the agent goes on
        wait_for("all large lines dead-lettered",
                 lambda: agent.metric("agent_dropped_events_total", reason=reason) >= 8, 120)
        counts = consume_counts(kafka.bootstrap_servers, topic_name, len(small_ids), 120,
                                parse_id)
        wait_for("every slot freed",
                 lambda: (agent.status() or {}).get("backlog", {}).get("events") == 0, 30)
        dropped = agent.metric("agent_dropped_events_total")
        dropped_too_large = agent.metric("agent_dropped_events_total", reason=reason)
        alive = agent.alive()
    finally:
        rc = agent.stop()
    assert alive and rc == 0
    said = (tmp_path / "agent.log").read_text()
    if delivery == "exactly_once":     # the transaction went again, one record per batch
        assert "one record per batch" in said
        # ... and each failed one went again at once: none waited for records the client
        # queued again after its purge (seen: 45 s, until the stall watch replaced it)
        assert "send path stalled" not in said
    elif batch_size is None:           # the operator is told why the topic goes slowly
        assert "refused a batch as too large" in said

    missing = [i for i in small_ids if counts.get(i, 0) == 0]
    assert not missing, f"{len(missing)} small lines missing, first {missing[:10]}"
    assert not set(counts) - set(small_ids), "a large line or an unknown id arrived"
    dups = {i: n for i, n in counts.items() if n > 1}
    assert not dups, f"{len(dups)} small lines arrived more than once"

    state = tmp_path / "state"
    dead = [json.loads(x) for x in
            (state / "dead-letter" / "dead-letter.jsonl").read_text().splitlines()]
    assert Counter(parse_id(base64.b64decode(d["value_b64"])) for d in dead) == \
        Counter(large_ids)
    assert {d["code"] for d in dead} == {"MSG_SIZE_TOO_LARGE"}
    journal = [json.loads(x) for x in (state / "loss-journal.jsonl").read_text().splitlines()]
    assert {e["reason"] for e in journal} == {reason}
    assert sum(e["events"] for e in journal) == len(large_ids)
    assert dropped == dropped_too_large == len(large_ids)
