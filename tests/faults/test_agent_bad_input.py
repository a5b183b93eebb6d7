"""Bad input of every kind in the tailed folder: the agent keeps running, counts each case, and
ships what is shippable — a 10 MiB line as consecutive parts that reassemble exactly."""

from __future__ import annotations

import os
import random
import time

import pytest

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import AgentProcess, write_config
from tests.kafkautil import read_all

# Root reads any file; without these capabilities a mode-000 file is unreadable to the agent.
NO_OVERRIDE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]


def wait_for(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.mark.slow
def test_bad_input_is_counted_and_the_agent_keeps_running(kafka, tmp_path, topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    logs = tmp_path / "logs"
    logs.mkdir()
    rng = random.Random(7)
    garbage = bytes(rng.getrandbits(8) for _ in range(200_000))
    (logs / "garbage.log").write_bytes(garbage + b"\n")
    (logs / "latin1.log").write_bytes("café au lait\nnaïve\n".encode("latin-1"))
    (logs / "crlf.log").write_bytes(b"windows line 1\r\nwindows line 2\r\n")
    (logs / "empty-lines.log").write_bytes(b"\n\nbetween\n\n")
    huge = bytes(rng.choice(b"abcdefghij") for _ in range(10 << 20))
    (logs / "huge.log").write_bytes(b"before huge\n" + huge + b"\nafter huge\n")
    (logs / "zero.log").write_bytes(b"")
    (logs / "dir.log").mkdir()
    secret = logs / "secret.log"
    secret.write_bytes(b"you cannot read me\n")
    secret.chmod(0o000)
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")],
                            "topic": topic_name}])
    agent = AgentProcess(config, tmp_path / "agent.log", prefix=NO_OVERRIDE).start()
    expected_records = garbage.count(b"\n") + 1 + 2 + 2 + 4 + 2 + 11   # huge: 11 parts
    try:
        wait_for(lambda: agent.metric("agent_drain_sent_events_total") >= expected_records, 120,
                 "every shippable record to be acknowledged")

        def bad(kind):
            return agent.metric("agent_source_bad_input_total", kind=kind)

        # An empty file may be a copy being written: it is opened once it kept its size 1 s.
        wait_for(lambda: bad("empty_file"), 30, "the empty file to be counted")
        counts = {k: bad(k) for k in ("binary_nul", "invalid_utf8", "crlf_line", "empty_line",
                                      "not_a_file", "unreadable", "empty_file")}
        split = agent.metric("agent_buffer_oversize_lines_total", policy="split")
        unreadable = agent.status()["files_waiting"]["unreadable"]
        # After all that, a good line still goes through.
        with open(logs / "crlf.log", "ab") as f:
            f.write(b"still alive\n")
        wait_for(lambda: agent.metric("agent_drain_sent_events_total") >= expected_records + 1,
                 60, "a good line after the bad input")
        assert agent.alive()
    finally:
        rc = agent.stop()
        secret.chmod(0o600)
    assert rc == 0
    assert counts["binary_nul"] >= 1 and counts["invalid_utf8"] >= 3   # garbage + 2 latin-1
    assert counts["crlf_line"] >= 2 and counts["empty_line"] >= 3
    assert counts["not_a_file"] == 1 and counts["unreadable"] == 1 and counts["empty_file"] == 1
    assert split == 1
    # The file it may not read is in status and logged once, though every scan tries it again.
    assert unreadable == {str(secret): "Permission denied"}
    assert agent.log.read_text().count(f"cannot read {secret}") == 1

    records = read_all(kafka.bootstrap_servers, topic_name)
    values = [r.value() for r in records]
    assert len(records) == expected_records + 1
    assert b"windows line 1" in values and b"still alive" in values
    assert b"caf\xe9 au lait" in values
    parts = [r for r in records if dict(r.headers() or []).get("docket-part")]
    assert [dict(r.headers())["docket-part"] for r in parts] == \
        [f"{i}/11".encode() for i in range(11)]
    assert b"".join(r.value() for r in parts) == huge
    assert all(dict(r.headers())["docket-origin"] == b"test-agent" for r in records)
    assert not os.path.exists(tmp_path / "state" / "dead-letter")
