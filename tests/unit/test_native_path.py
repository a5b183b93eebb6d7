"""Choosing the native send path: an agent told ``broker.send_path = "native"`` on a host
without the extension refuses to start and names the way out; with it, the agent's drain is
the native path's."""

from __future__ import annotations

import sys

import pytest

from agent.config import parse
from agent.drain.native import NativeDrain, NativeUnavailable, native_module
from agent.errors import StartupError
from agent.service import Agent, Seams
from tests.unit.fakenative import FakeSlotProducer
from tests.unit.fakeproducer import FakeKafka
from tests.unit.tailkit import FakeClock


def config(tmp_path):
    return parse({
        "agent": {"id": "t", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * 4096, "slot_size_bytes": 4096,
                   "sync_on_seal": False},
        "broker": {"bootstrap_servers": "127.0.0.1:9", "send_path": "native"},
        "audit": {"enabled": False},
        "sources": [{"type": "file", "topic": "t", "paths": [str(tmp_path / "app.log")]}],
    })


def test_without_the_extension_the_agent_refuses_to_start_and_says_how(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "docket_native", None)      # import fails: not built
    with pytest.raises(NativeUnavailable, match="make native"):
        native_module()
    with pytest.raises(StartupError) as e:
        Agent(config(tmp_path), seams=Seams(clock=FakeClock(), file_events=False,
                                            producer_factory=FakeKafka().producer))
    assert "docket_native" in str(e.value) and "send_path" in e.value.hint


def test_with_it_the_drain_is_the_native_path_s(tmp_path):
    kafka = FakeKafka()
    agent = Agent(config(tmp_path), seams=Seams(
        clock=FakeClock(), file_events=False, producer_factory=kafka.producer,
        native_factory=lambda conf: FakeSlotProducer(conf, kafka)))
    try:
        assert isinstance(agent.drain, NativeDrain)
        assert [p.role for p in kafka.producers] == ["main", "native"]
    finally:
        agent.abandon()
