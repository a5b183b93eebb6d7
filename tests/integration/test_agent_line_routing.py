"""A plain file routed by its lines' fields (``topic = "T.{service}"``), against the real local
Kafka: the agent process reads a JSON-lines log that rotates, is SIGKILLed once mid-stream and
started again; every line arrives in the topic its fields make, with its key and identity
headers, none lost, and the agent's audit counts each routed topic."""

from __future__ import annotations

import json
import time
from collections import Counter

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import AgentProcess, wait_until, write_config
from tests.kafkautil import read_all

SERVICES = ("pay", "ship", "mail")
TOTAL = 6_000


def line(i: int) -> bytes:
    service = SERVICES[0] if i % 10 < 7 else SERVICES[1 + i % 2]     # one busy, two quiet
    return json.dumps({"id": i, "service": service, "order": f"o{i % 97}"}).encode() + b"\n"


def test_each_line_in_its_topic_once_or_more_none_lost_across_a_kill_and_audited(
        kafka, tmp_path, topic_name):
    topics = [f"{topic_name}.{s}" for s in SERVICES] + [f"{topic_name}.other"]
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=2) for t in topics])
    logs = tmp_path / "logs"
    logs.mkdir()
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state", [
        {"type": "file", "paths": [str(logs / "events.jsonl*")],
         "topic": topic_name + ".{service}", "fallback_topic": f"{topic_name}.other",
         "key": "{order}"}], audit={"interval_ms": 1000})
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    log_file = logs / "events.jsonl"
    odd = b"no json here\n"
    killed = False
    try:
        for k in range(TOTAL // 200):
            with open(log_file, "ab") as f:
                f.write(b"".join(line(i) for i in range(k * 200, (k + 1) * 200)))
                if k == 5:
                    f.write(odd)
            if k == 14:
                log_file.rename(logs / "events.jsonl.1")           # rotated
            if k == 20 and not killed:
                agent.kill()                                       # mid-stream
                killed = True
                agent.start()
            time.sleep(0.02)
        wait_until("every line in Kafka", lambda: len(_ids(kafka, topic_name)) == TOTAL, 90,
                   agent)
        time.sleep(2.5)                                  # an audit round past the last record
    finally:
        assert agent.stop() == 0
    ids: Counter = Counter()
    for service in SERVICES:
        for r in read_all(kafka.bootstrap_servers, f"{topic_name}.{service}"):
            obj = json.loads(r.value())
            assert obj["service"] == service
            assert r.key() == f"o{obj['id'] % 97}".encode()
            headers = dict(r.headers() or [])
            assert {"docket-origin", "docket-incarnation", "docket-seq"} <= set(headers)
            ids[obj["id"]] += 1
    other = read_all(kafka.bootstrap_servers, f"{topic_name}.other")
    assert {r.value() for r in other} == {odd[:-1]} and other[0].key() is None
    missing = [i for i in range(TOTAL) if not ids[i]]
    assert not missing, f"{len(missing)} line(s) lost, first {missing[:5]}"
    assert killed and len(ids) == TOTAL
    from audit.contract.collect import read_audit_topic
    from tests.auditkit import tier_counts
    counted = tier_counts(read_audit_topic(kafka.bootstrap_servers, "docket.audit"),
                          "producer", set(topics))
    per_topic: Counter = Counter()
    for (topic, _window, _origin), (count, _bytes, _checksum) in counted.items():
        per_topic[topic] += count
    held = {t: len({(h["docket-origin"], h["docket-incarnation"], h["docket-seq"])
                    for h in (dict(r.headers()) for r in read_all(kafka.bootstrap_servers, t))})
            for t in topics}
    assert per_topic == held, "the producer tier counts every record of each routed topic"


def _ids(kafka, topic_name: str) -> set[int]:
    return {json.loads(r.value())["id"] for s in SERVICES
            for r in read_all(kafka.bootstrap_servers, f"{topic_name}.{s}")}
