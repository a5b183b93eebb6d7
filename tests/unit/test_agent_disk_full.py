"""A full disk under the state folder, driven turn by turn (``Agent.turn``): the state
database refusing writes with SQLite's "database or disk is full", the free space below the
reserve, a loss-journal line cut short by ENOSPC. Real pool, file source and state database; a
fake Kafka and a fake clock at the seams."""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import types

from agent.config import parse
from agent.service import Agent, Seams
from agent.state.db import StateDB
from agent.state.diskguard import CHECK_EVERY_S, disk_full
from agent.state.journal import LossJournal
from agent.telemetry import Metrics
from tests.unit.fakeproducer import FakeKafka
from tests.unit.tailkit import FakeClock, id_of, lines

SLOT = 4096
FULL = sqlite3.OperationalError("database or disk is full")


def agent_on(tmp_path, kafka: FakeKafka, reserve: int = 0) -> Agent:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    cfg = parse({
        "agent": {"id": "t", "state_dir": str(tmp_path / "state"),
                  "disk_reserve_bytes": reserve},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * SLOT, "slot_size_bytes": SLOT,
                   "linger_ms": 5, "sync_on_seal": False},
        "broker": {"bootstrap_servers": "127.0.0.1:9"},
        "sources": [{"type": "file", "topic": "t", "paths": [str(logs / "app.log")]}],
    })
    agent = Agent(cfg, seams=Seams(clock=FakeClock(), producer_factory=kafka.producer,
                                   file_events=False))
    agent.begin()
    return agent


def turns(agent: Agent, n: int, step_s: float = 0.1) -> None:
    for _ in range(n):
        agent.clock.advance(step_s)
        agent.turn()


def test_the_errors_that_mean_no_space_and_no_others():
    assert disk_full(FULL)
    assert disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not disk_full(sqlite3.OperationalError("database is locked"))
    assert not disk_full(OSError(errno.EIO, "Input/output error"))


def test_refused_writes_pause_reading_keep_sending_and_lose_no_checkpoint_or_count(
        tmp_path, monkeypatch):
    """While every write of sealed checkpoints and counts is refused: the agent does not
    raise, says disk full, stops reading after what it had sealed, sends what the pool holds;
    once writes pass again, the checkpoints, the acknowledged offsets and the producer tier's
    counts are all stored, and reading goes on to the end of the file."""
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    refusing = {"on": False, "refused": 0}
    real_write_audit = StateDB._write_audit

    def write_audit(conn, update):              # inside advance_sealed's transaction
        if refusing["on"]:
            refusing["refused"] += 1
            raise FULL
        real_write_audit(conn, update)
    monkeypatch.setattr(StateDB, "_write_audit", staticmethod(write_audit))
    real_acked = agent.db.advance_acked

    def advance_acked(positions):
        if refusing["on"]:
            refusing["refused"] += 1
            raise FULL
        real_acked(positions)
    monkeypatch.setattr(agent.db, "advance_acked", advance_acked)

    log = tmp_path / "logs" / "app.log"
    log.write_bytes(lines(0, 100))
    refusing["on"] = True
    turns(agent, 10)
    assert refusing["refused"] > 0
    assert agent.disk.full and agent.status()["disk"]["state"] == "full"
    assert "refused" in agent.status()["disk"]["reason"]
    [row] = agent.db.all_files()
    assert row["sealed_offset"] == 0                     # rolled back, whole
    sent = {id_of(m[1]) for m in kafka.log}
    assert sent == set(range(100))                       # what was sealed went on
    read = agent.metrics.get("agent_source_read_events_total")
    with open(log, "ab") as f:
        f.write(lines(100, 300))
    turns(agent, 20)
    assert agent.metrics.get("agent_source_read_events_total") == read   # paused
    tries = refusing["refused"]
    assert tries <= 20 * 0.1 / CHECK_EVERY_S + 2, tries   # not one try per turn

    refusing["on"] = False
    turns(agent, 30)
    assert not agent.disk.full
    assert {id_of(m[1]) for m in kafka.log} == set(range(300))
    [row] = agent.db.all_files()
    assert row["sealed_offset"] == row["acked_offset"] == len(lines(0, 300))
    stored = sum(w.count for w in agent.db.audit_windows())
    assert stored == 300, stored
    agent.abandon()


def test_free_space_below_the_reserve_pauses_reading_until_it_is_back(tmp_path, monkeypatch):
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka, reserve=1 << 20)
    free = {"bytes": 10 << 20}
    real_statvfs = os.statvfs

    def statvfs(path):
        st = real_statvfs(path)
        return types.SimpleNamespace(f_bavail=free["bytes"] // st.f_frsize,
                                     f_frsize=st.f_frsize)
    monkeypatch.setattr("agent.state.diskguard.os.statvfs", statvfs)
    log = tmp_path / "logs" / "app.log"
    log.write_bytes(lines(0, 50))
    turns(agent, 10)
    assert {id_of(m[1]) for m in kafka.log} == set(range(50))
    free["bytes"] = 4096
    turns(agent, 10)
    assert agent.disk.full and agent.metrics.get("agent_disk_full") == 1
    with open(log, "ab") as f:
        f.write(lines(50, 80))
    turns(agent, 20)
    assert len(kafka.log) == 50
    free["bytes"] = 10 << 20
    turns(agent, 20)
    assert not agent.disk.full
    assert {id_of(m[1]) for m in kafka.log} == set(range(80))
    agent.abandon()


def test_a_journal_line_cut_short_by_enospc_is_cut_off_and_written_later(tmp_path,
                                                                        monkeypatch):
    """The file system takes half a line, then refuses: no half line stays in the file, the
    entry counts at once, and the next write puts both lines in order."""
    path = tmp_path / "loss-journal.jsonl"
    journal = LossJournal(path, Metrics())
    refused = []
    journal.on_refused = refused.append
    room = {"bytes": 40}

    def write(fd, data):
        if room["bytes"] is None:
            return os.write(fd, data)
        if room["bytes"] == 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(room["bytes"], len(data))
        room["bytes"] -= n
        return os.write(fd, data[:n])
    calls = {k: getattr(os, k) for k in dir(os) if not k.startswith("__")}
    monkeypatch.setattr("agent.state.journal.os",
                        types.SimpleNamespace(**{**calls, "write": write}))
    journal.record("buffer_full", "t", 3, records=(10, 12))
    assert refused and path.read_bytes() == b""
    assert journal.waiting() == 1
    assert journal.dropped_numbers() == [[10, 12]]       # it counts at once
    journal.record("buffer_full", "t", 2, records=(13, 14))
    assert path.read_bytes() == b"" and journal.waiting() == 2
    room["bytes"] = None
    assert journal.retry()
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["records"] for e in entries] == [[10, 12], [13, 14]]
    assert journal.waiting() == 0
    journal.close()


def test_a_refused_write_inside_a_file_source_rebuilds_the_sources_from_the_database(
        tmp_path, monkeypatch):
    """A new file's row refused (``add_file``): the file sources' memory may be ahead of the
    database, so once writes pass they are built again from it; the new file is then found,
    stored and read whole, once."""
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    log = tmp_path / "logs" / "app.log"
    refusing = {"on": True}
    real_add = agent.db.add_file

    def add_file(*args, **kwargs):
        if refusing["on"]:
            raise FULL
        return real_add(*args, **kwargs)
    monkeypatch.setattr(agent.db, "add_file", add_file)
    log.write_bytes(lines(0, 60))
    turns(agent, 10)
    assert agent.disk.full and agent._sources_stale
    assert kafka.log == []
    refusing["on"] = False
    turns(agent, 30)
    assert not agent.disk.full and not agent._sources_stale
    sent = [id_of(m[1]) for m in kafka.log]
    assert sorted(sent) == list(range(60))
    [row] = agent.db.all_files()
    assert row["sealed_offset"] == len(lines(0, 60))
    agent.abandon()


def test_a_stop_during_a_full_disk_says_what_stays_unwritten_and_exits_0(tmp_path, monkeypatch,
                                                                        caplog):
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    log = tmp_path / "logs" / "app.log"
    log.write_bytes(lines(0, 30))
    turns(agent, 5)
    def refuse(*_args, **_kwargs):
        raise FULL
    monkeypatch.setattr(StateDB, "_write_audit", staticmethod(refuse))
    for name in ("advance_acked", "touch", "update"):
        monkeypatch.setattr(agent.db, name, refuse)
    with open(log, "ab") as f:
        f.write(lines(30, 60))
    turns(agent, 5)
    assert agent.disk.full
    assert agent.shutdown() == 0
    assert "stopping with a full disk" in caplog.text
