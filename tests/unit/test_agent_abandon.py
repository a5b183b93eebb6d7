"""``Agent.abandon`` stands in for a SIGKILL in the unit tests: like the kernel, it ends the
threads that would die with the process (the topic check's, the audit rounds'), which hold the
agent's Kafka clients and would otherwise run, connecting, as long as the test session."""

from __future__ import annotations

import threading
import time

from agent.config import parse
from agent.drain.topics import TopicWatch
from agent.service import Agent, Seams
from tests.unit.fakenative import FakeSlotProducer
from tests.unit.fakeproducer import FakeKafka
from tests.unit.tailkit import FakeClock

THREADS = ("docket-topics", "docket-audit-rounds")


def _config(tmp_path):
    return parse({
        "agent": {"id": "t", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * 4096, "slot_size_bytes": 4096,
                   "sync_on_seal": False},
        "broker": {"bootstrap_servers": "127.0.0.1:9"},
        "audit": {"enabled": True},
        "sources": [{"type": "file", "topic": "t", "paths": [str(tmp_path / "app.log")]}],
    })


def _alive(threads: list[threading.Thread], within_s: float) -> list[str]:
    deadline = time.monotonic() + within_s
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t.name for t in threads if t.is_alive()]


def test_an_abandoned_agent_s_own_threads_end(tmp_path, monkeypatch):
    checks = []
    monkeypatch.setattr(TopicWatch, "check", lambda self: checks.append(1) or [])
    (tmp_path / "app.log").write_bytes(b"a line\n")
    kafka = FakeKafka()
    agent = Agent(_config(tmp_path),
                  seams=Seams(clock=FakeClock(), file_events=False,
                              producer_factory=kafka.producer, probe_factory=kafka.admin,
                              native_factory=lambda conf: FakeSlotProducer(conf, kafka)))
    before = set(threading.enumerate())
    agent.audit.start()                      # as AgentLoop.run starts them
    agent.topic_watch.start()
    try:
        ours = [t for t in threading.enumerate() if t not in before and t.name in THREADS]
        assert sorted(t.name for t in ours) == sorted(THREADS)
        deadline = time.monotonic() + 5
        while not checks and time.monotonic() < deadline:
            time.sleep(0.01)
        assert checks, "the topic check's thread never ran"
        agent.abandon()
        assert _alive(ours, 5.0) == [], "threads that a SIGKILL would have ended still run"
        assert agent.topic_watch._admin is None and agent.audit._producer is None
    finally:
        agent.topic_watch.stop()             # (when the test failed: no thread left behind)
        agent.audit.abandon()
