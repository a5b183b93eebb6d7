"""The agent as an SRE runs it: exact /metrics after 10 MB, a broker outage that leaves a short
log and a status whose backlog is events read minus events sent, a SIGTERM during the outage
that stops at once with the data kept, a SIGTERM during the first scan of ten thousand files
that stops at once (the next start ships every line once and logs a summary of the files it
resumes), and a topic missing on a cluster that does not create topics, named in status and
logs until it is created.

The outage and missing-topic tests run against a 1-broker cluster of their own started with
``auto.create.topics.enable=false`` (a production setting), so they can kill its broker."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import pytest

from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.cluster import LocalCluster
from tests.agentkit import BIN, AgentProcess, consume_counts, wait_until, write_config
from tests.kafkautil import TEST_BROKER_PROPS

LINE_BYTES = 100


def _lines(a: int, b: int) -> bytes:
    return b"".join((b"id-%08d " % i).ljust(LINE_BYTES - 1, b"x") + b"\n" for i in range(a, b))


def _id(value: bytes) -> int:
    return int(value[3:11])


@pytest.fixture(scope="module")
def strict_kafka(tmp_path_factory):
    cluster = LocalCluster(tmp_path_factory.mktemp("strict"), die_with_parent=True,
                           broker_props={**TEST_BROKER_PROPS,
                                         "auto.create.topics.enable": "false"})
    layout = cluster.up(brokers=1, base_port=0)
    try:
        yield cluster, layout.bootstrap_servers
    finally:
        cluster.down()


def test_metrics_are_exact_after_10_mb(kafka, topic_name, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    n = 100_000                                          # 10,000,000 bytes
    (logs / "app.log").write_bytes(_lines(0, n))
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")], "topic": topic_name}],
                          audit={"interval_ms": 1000})
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        wait_until("every event sent", lambda: agent.metric("agent_drain_sent_events_total") == n,
              120, agent)
        wait_until("an audit emission", lambda: agent.metric(
            "agent_audit_last_emission_timestamp_seconds") > 0, 30, agent)
        text = agent.metrics()
        status = agent.status()
    finally:
        assert agent.stop() == 0
    series = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            series[name_labels] = value
    read_bytes = [v for k, v in series.items() if k.startswith("agent_source_read_bytes_total")]
    assert read_bytes == [str(n * LINE_BYTES)], read_bytes       # "10000000", not "1e+07"
    events = [v for k, v in series.items() if k.startswith("agent_source_read_events_total")]
    assert events == [str(n)]
    assert status["totals"]["read_bytes"] == n * LINE_BYTES
    assert status["totals"]["read_events"] == status["totals"]["sent_events"] == n
    emitted = series["agent_audit_last_emission_timestamp_seconds"]
    assert "e" not in emitted and abs(float(emitted) - time.time()) < 120, emitted
    slots = {re.search(r'state="(\w+)"', k).group(1): int(v) for k, v in series.items()
             if k.startswith("agent_buffer_slots{")}
    in_pool = sum(c for state, c in slots.items() if state != "spilled")
    assert in_pool == status["pool"]["slot_count"], slots
    assert status["backlog"]["events"] == 0


def _log_lines(agent: AgentProcess, since: int) -> list[str]:
    return agent.log.read_bytes()[since:].decode(errors="replace").splitlines()


def test_an_outage_logs_little_and_sigterm_during_it_stops_at_once_keeping_the_data(
        strict_kafka, topic_name, tmp_path):
    cluster, bootstrap = strict_kafka
    ensure_topics(bootstrap, [TopicSpec(topic_name, partitions=1)])
    ensure_audit_topic(bootstrap)
    logs = tmp_path / "logs"
    logs.mkdir()
    app = logs / "app.log"
    app.write_bytes(_lines(0, 1000))
    config = write_config(tmp_path / "agent.toml", bootstrap, tmp_path / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")], "topic": topic_name}],
                          audit={"interval_ms": 2000, "window_ms": 60000})
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        wait_until("1000 sent", lambda: agent.metric("agent_drain_sent_events_total") == 1000, 60,
              agent)
        cluster.kill_node(1)
        mark = agent.log.stat().st_size
        with open(app, "ab") as f:
            f.write(_lines(1000, 2000))
        wait_until("the outage seen", lambda: agent.status()["broker"]["state"] != "up", 60, agent)
        time.sleep(60)                                 # a minute of outage
        status = agent.status()
        lines = _log_lines(agent, mark)
        print(f"log lines during a 60 s broker outage: {len(lines)}", *lines, sep="\n  ")
        assert 0 < len(lines) <= 30, "\n".join(lines[:80])
        totals = status["totals"]
        assert totals["read_events"] == 2000 and totals["sent_events"] == 1000, totals
        assert status["backlog"]["events"] == totals["read_events"] - totals["sent_events"]
        started = time.monotonic()
        rc = agent.stop(timeout_s=60)
        took = time.monotonic() - started
        print(f"SIGTERM during the outage: exited {rc} in {took:.2f} s")
        assert rc == 0 and took < 5, agent.log_text()
        assert "stopping while the cluster is" in agent.whole_log()
    finally:
        if agent.alive():
            agent.kill()
        cluster.start_node(1)
    # The pool kept what was not acknowledged: the next start sends it.
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        counts = consume_counts(bootstrap, topic_name, 2000, 120, parse=_id)
    finally:
        assert agent.stop() == 0
    assert sorted(counts) == list(range(2000)), sorted(set(range(2000)) - set(counts))[:20]
    assert max(counts.values()) <= 2


def test_a_missing_topic_on_a_cluster_that_does_not_create_topics_is_named_until_created(
        strict_kafka, topic_name, tmp_path):
    cluster, bootstrap = strict_kafka
    ensure_audit_topic(bootstrap)
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.log").write_bytes(_lines(0, 100))
    config = write_config(tmp_path / "agent.toml", bootstrap, tmp_path / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")], "topic": topic_name}])
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        broker = wait_until("the missing topic in status",
                       lambda: (b := agent.status()["broker"])["missing_topics"] and b, 60, agent)
        assert broker["missing_topics"] == [topic_name] and broker["auto_create_topics"] is False
        assert re.search(rf"WARNING .*topic {re.escape(topic_name)} does not exist on the "
                         r"cluster \(auto.create.topics.enable=false\)", agent.whole_log())
        shown = subprocess.run([str(BIN / "docket-agent"), "status", "--config", str(config)],
                               capture_output=True, text=True, timeout=30)
        assert f"topic     {topic_name}: not on the cluster; its events wait in the pool" \
            in shown.stdout, shown.stdout
        assert agent.metric("agent_drain_sent_events_total") == 0
        ensure_topics(bootstrap, [TopicSpec(topic_name, partitions=1)])
        counts = consume_counts(bootstrap, topic_name, 100, 120, parse=_id)
        assert sorted(counts) == list(range(100))
        wait_until("the topic no longer missing",
              lambda: not agent.status()["broker"]["missing_topics"], 60, agent)
        assert f"topic {topic_name} exists now" in agent.whole_log()
    finally:
        assert agent.stop() == 0


def test_weakened_delivery_accepted_on_purpose_is_warned_and_shown_and_logs_can_be_json(
        kafka, topic_name, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "app.log").write_bytes(_lines(0, 10))
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")], "topic": topic_name}],
                          broker={"unsafe_weaker_delivery": True})
    with open(config, "a") as f:
        f.write('[broker.librdkafka_options]\n"acks" = "1"\n"enable.idempotence" = false\n')
    agent = AgentProcess(config, tmp_path / "agent.log", args=["--log-format", "json"]).start()
    try:
        wait_until("10 sent", lambda: agent.metric("agent_drain_sent_events_total") == 10, 60,
                   agent)
        assert agent.status()["broker"]["weakened_delivery"] == ["acks", "enable.idempotence"]
        shown = subprocess.run([str(BIN / "docket-agent"), "status", "--config", str(config)],
                               capture_output=True, text=True, timeout=30)
        assert "delivery  WEAKENED by librdkafka_options acks, enable.idempotence" in shown.stdout
    finally:
        assert agent.stop() == 0
    lines = [json.loads(x) for x in agent.log.read_text().splitlines()]
    warned = [x for x in lines if x["level"] == "WARNING" and "unsafe_weaker_delivery" in
              x["message"]]
    assert [x["message"].split(":")[0] for x in warned] == \
        ["config broker.librdkafka_options.acks",
         "config broker.librdkafka_options.enable.idempotence"], warned
    assert any("ready" in x["message"] for x in lines)


FILES = 10_000


def test_sigterm_during_the_first_scan_of_ten_thousand_files_stops_at_once_and_loses_nothing(
        kafka, topic_name, tmp_path):
    """Ten thousand one-line files under one glob: a SIGTERM that lands while the agent's
    first scan decides on them (after its first "tailing" line, before "ready") stops it at
    once with exit 0 — what it read is sent and checkpointed first; a start after it ships
    every line, each once, and logs the files it resumes as a summary, not a line each."""
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=2)])
    logs = tmp_path / "logs"
    logs.mkdir()
    for i in range(FILES):
        (logs / f"req-{i:05d}.log").write_bytes(_lines(i, i + 1))
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")],
                            "topic": topic_name}])
    agent = AgentProcess(config, tmp_path / "agent.log").start(awaited=False)
    try:
        wait_until("the first scan's first file", lambda: "tailing " in agent.log.read_text(
            errors="replace") or not agent.alive(), 60, agent, step_s=0.005)
        assert agent.alive(), agent.log_text()
        before = agent.whole_log()             # read first: "ready" not in it, the scan runs
        t0 = time.monotonic()
        agent.proc.send_signal(signal.SIGTERM)
        rc = agent.proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        if agent.alive():
            agent.kill()
    log = agent.whole_log()
    assert " ready: " not in before, "the SIGTERM came after the first scan"      # the fault
    assert rc == 0, log[-3000:]
    assert took < 10, f"{took:.1f} s from SIGTERM to exit\n{log[-3000:]}"
    assert "stopped" in log.rsplit(" ready: ", 1)[-1], log[-3000:]

    again = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        counts = consume_counts(kafka.bootstrap_servers, topic_name, FILES, 120, _id)
    finally:
        assert again.stop() == 0, again.log_text()
    assert set(counts) == set(range(FILES)), f"{FILES - len(counts)} lines lost"
    assert max(counts.values()) == 1, sum(n - 1 for n in counts.values())
    # The start after it resumed the files the first scan took: a summary, not a line each.
    second = agent.whole_log()[len(log):]
    resumed = second.count("INFO docket.agent.files: resuming /")
    summary = re.search(r"resuming (\d+) more file\(s\) of topic", second)
    assert resumed <= 20 and summary, second[:3000]
    print(f"SIGTERM during the first scan of {FILES} files: exit {rc} in {took:.2f} s; then "
          f"every line once; the next start logged {resumed} resumed files and a summary of "
          f"{summary.group(1)} more")
