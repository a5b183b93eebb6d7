"""The socket source and JSON fields: events pushed over a unix socket arrive with their event
time and key; with the pool full the client's writes block instead of losing anything."""

from __future__ import annotations

import grp
import json
import socket
import threading
import time

import pytest

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import AgentProcess, write_config
from tests.kafkautil import read_all


def test_json_events_over_the_socket_keep_their_time_and_key(kafka, tmp_path, topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    sock_path = tmp_path / "events.sock"
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "socket", "path": str(sock_path), "topic": topic_name,
                            "timestamp_field": "ts", "key_field": "user", "group": "adm"}])
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    st = sock_path.stat()                     # writers connect by the source's group
    assert (st.st_mode & 0o777, st.st_gid) == (0o660, grp.getgrnam("adm").gr_gid)
    events = [
        {"ts": 1763766012345, "user": "u1", "n": 0},          # epoch milliseconds
        {"ts": 1763766013, "user": "u2", "n": 1},             # epoch seconds
        {"ts": "2025-11-21T23:00:14.500Z", "user": 42, "n": 2},   # RFC 3339; a numeric key
        {"ts": "yesterday", "n": 3},                          # unparsable: the read time
    ]
    before_wall, before = time.time(), time.monotonic()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(sock_path))
            s.sendall(b"".join(json.dumps(e).encode() + b"\n" for e in events)
                      + b"not json at all\n")
        deadline = time.monotonic() + 60
        while agent.metric("agent_drain_sent_events_total") < 5:
            assert time.monotonic() < deadline, agent.log_text()
            time.sleep(0.1)
        unparsable = agent.metric("agent_source_bad_input_total", kind="timestamp_unparsable")
    finally:
        assert agent.stop() == 0
    records = read_all(kafka.bootstrap_servers, topic_name)
    assert [r.timestamp()[1] for r in records[:3]] == [1763766012345, 1763766013000,
                                                       1763766014500]
    # Read after the events were sent, on the wall clock even if it stepped back meanwhile.
    before_ms = int(min(before_wall, time.time() - (time.monotonic() - before)) * 1000) - 1000
    assert all(r.timestamp()[1] >= before_ms for r in records[3:])
    assert [r.key() for r in records] == [b"u1", b"u2", b"42", None, None]
    assert records[4].value() == b"not json at all"
    assert unparsable == 2


@pytest.mark.slow
def test_a_full_pool_blocks_the_socket_client_instead_of_dropping(kafka, tmp_path, topic_name):
    cluster = kafka.controlled()
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    sock_path = tmp_path / "events.sock"
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "socket", "path": str(sock_path), "topic": topic_name}],
                          buffer={"size_bytes": 4096 + 8192 + 4 * 65536,
                                  "slot_size_bytes": 65536})
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    total = 20_000                                   # ~2 MB: far more than the 4 slots hold
    payload = b"".join(b"ev-%08d " % i + b"y" * 88 + b"\n" for i in range(total))
    sent = {"bytes": 0}

    def client():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(sock_path))
            for k in range(0, len(payload), 4096):
                s.sendall(payload[k:k + 4096])
                sent["bytes"] = k + 4096

    cluster.pause_node(1)
    try:
        t = threading.Thread(target=client, daemon=True)
        t.start()
        time.sleep(8)                                 # the outage guard purges; the pool fills
        stuck_at = sent["bytes"]
        status = agent.status()
        assert t.is_alive() and stuck_at < len(payload), "the client should be blocked"
        assert status["pool"]["free_slots"] == 0
    finally:
        cluster.resume_node(1)
    t.join(timeout=120)
    assert not t.is_alive()
    deadline = time.monotonic() + 120
    while agent.metric("agent_drain_sent_events_total") < total:
        assert time.monotonic() < deadline, agent.log_text()
        time.sleep(0.2)
    assert agent.stop() == 0
    values = [r.value() for r in read_all(kafka.bootstrap_servers, topic_name)]
    ids = sorted({int(v[3:11]) for v in values})
    assert ids == list(range(total))
    print(f"socket client blocked at {stuck_at} of {len(payload)} bytes while the pool was full; "
          f"{len(values) - total} duplicates after the outage")
