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


def test_the_idle_wait_sleeps_on_file_writes_and_never_turns_faster_for_other_files(tmp_path):
    """With the native path an idle turn waits up to 50 ms on the write watch's descriptor; a
    line written is read at the next turn and sealed at once (the reader caught up); a turn
    woken by writes to another file of the folder, which reads nothing, is followed by a plain
    2 ms wait without the descriptor, then the long wait again."""
    from agent.service import IDLE_WAIT_S, IDLE_WAIT_WATCHED_S

    (tmp_path / "app.log").write_bytes(b"")
    kafka = FakeKafka()
    agent = Agent(config(tmp_path), seams=Seams(
        clock=FakeClock(), file_events=True, producer_factory=kafka.producer,
        native_factory=lambda conf: FakeSlotProducer(conf, kafka)))
    try:
        agent.begin()
        agent.turn()
        wait, fd = agent._idle_wait(False)
        assert fd >= 0 and fd == agent.watch.wake_fd and wait == IDLE_WAIT_WATCHED_S
        with open(tmp_path / "app.log", "ab") as f:
            f.write(b"one\n")
        clock = agent.clock
        read = 0
        for _ in range(5):                       # (the file is picked up at the next scan)
            clock.advance(0.3)
            read += agent.turn()[0]
        assert read == 4 and not agent.pool.filling()       # sealed at once: caught up
        assert agent._idle_wait(False) == (IDLE_WAIT_WATCHED_S, fd)
        agent.turn()
        (tmp_path / "other.txt").write_bytes(b"busy\n")
        read, _sent, _blocked = agent.turn()
        assert read == 0 and agent._idle_wait(False) == (IDLE_WAIT_S, -1)
        agent.turn()
        assert agent._idle_wait(False) == (IDLE_WAIT_WATCHED_S, fd)
    finally:
        agent.abandon()
