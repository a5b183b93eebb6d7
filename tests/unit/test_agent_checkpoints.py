"""The agent's checkpoints, driven turn by turn (``Agent.turn``) with a fake clock, the real file
source, pool and state database, and a fake Kafka at the transport seam."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from confluent_kafka import KafkaError

from agent.config import parse
from agent.service import Agent, Seams
from agent.state import LOCK_WAIT_S, StateDB
from tests.unit.fakeproducer import FakeKafka
from tests.unit.tailkit import FakeClock, lines

SLOT = 4096


def agent_on(tmp_path, kafka: FakeKafka) -> Agent:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    cfg = parse({
        "agent": {"id": "t", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * SLOT, "slot_size_bytes": SLOT,
                   "linger_ms": 5, "sync_on_seal": False},
        "broker": {"bootstrap_servers": "127.0.0.1:9"},
        "audit": {"enabled": False},
        "sources": [{"type": "file", "topic": "t", "paths": [str(logs / "app.log")]}],
    })
    agent = Agent(cfg, seams=Seams(clock=FakeClock(), producer_factory=kafka.producer,
                                   file_events=False))
    agent.begin()
    return agent


def test_the_acknowledged_offset_never_passes_an_older_slot_still_in_flight(tmp_path):
    """The first record of a file fails (retriable) three times; the records after it, in
    later slots, are acknowledged meanwhile. The file's acknowledged offset must stay before
    the oldest slot's bytes (were the pool then lost, the start self-check would take them for
    acknowledged and skip them), and the later slots stay in the pool until the oldest is
    acknowledged: freed, their bytes would be neither acknowledged nor in the pool after a
    crash, and read again as new records."""
    kafka = FakeKafka()
    content = lines(0, 400)
    kafka.script(lines(0, 1)[:-1], *[KafkaError(KafkaError._MSG_TIMED_OUT)] * 3)
    agent = agent_on(tmp_path, kafka)
    (tmp_path / "logs" / "app.log").write_bytes(content)
    out_of_order = 0
    for _ in range(30):
        agent.clock.advance(0.3)
        agent.turn()
        waiting = [s for s in agent.drain.inflight if not s.finished(agent.drain.settled)]
        [row] = agent.db.all_files()
        if waiting:
            oldest = min(start for s in waiting for _src, start, _e in s.slot.meta.positions)
            assert row["acked_offset"] <= oldest, (row["acked_offset"], oldest)
            assert agent.metrics.get("agent_drain_slots_freed_total") == 0
            out_of_order += any(s.finished(agent.drain.settled) for s in agent.drain.inflight)
    [row] = agent.db.all_files()
    assert out_of_order, "the test needs later slots acknowledged while an older one waits"
    assert row["acked_offset"] == row["sealed_offset"] == len(content)
    assert sorted(kafka.values()) == sorted(content.split(b"\n")[:-1])
    agent.abandon()


def test_a_state_write_waits_for_the_emitters_connection_as_long_as_a_loaded_host_needs(
        tmp_path):
    """Seen on a loaded host: the agent's main loop died of "database is locked" while the
    audit emitter's connection wrote (SQLite's default wait is 5 s). Both connections wait
    ``LOCK_WAIT_S``; a write held 6 s by the other one is waited for, not fatal."""
    db = StateDB(tmp_path / "state.db")
    assert db.db.conn.execute("PRAGMA busy_timeout").fetchone()[0] == LOCK_WAIT_S * 1000
    with db.audit_round() as round_:
        assert round_.conn.execute("PRAGMA busy_timeout").fetchone()[0] == LOCK_WAIT_S * 1000
    other = sqlite3.connect(tmp_path / "state.db", check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    released = threading.Event()

    def release():
        other.commit()
        released.set()
    threading.Timer(6.0, release).start()
    impatient = sqlite3.connect(tmp_path / "state.db", timeout=0)
    with pytest.raises(sqlite3.OperationalError, match="locked"):    # the lock is held
        impatient.execute("BEGIN IMMEDIATE")
    impatient.close()
    source = db.add_file(0, 1, 2, b"fp", "/x.log")         # waits for the lock, then writes
    assert released.is_set() and db.get(source)["path"] == "/x.log"
    other.close()
    db.close()


def test_a_crash_while_an_older_slot_waits_reads_nothing_again(tmp_path):
    """As above, then the agent dies (nothing written) while the oldest slot waits and later
    slots are acknowledged: the next start finds every byte either acknowledged or in the pool
    — nothing to read again — and sends again only the pool's slots."""
    kafka = FakeKafka()
    content = lines(0, 400)
    kafka.script(lines(0, 1)[:-1], *[KafkaError(KafkaError._MSG_TIMED_OUT)] * 50)
    agent = agent_on(tmp_path, kafka)
    (tmp_path / "logs" / "app.log").write_bytes(content)
    for _ in range(15):
        agent.clock.advance(0.3)
        agent.turn()
    held = kafka.values()
    assert len(held) > 100 and lines(0, 1)[:-1] not in held   # later slots acknowledged
    agent.abandon()                                          # SIGKILL

    again = FakeKafka()
    agent = agent_on(tmp_path, again)
    assert agent.metrics.get("agent_source_rewound_total") == 0
    for _ in range(30):
        agent.clock.advance(0.3)
        agent.turn()
    [row] = agent.db.all_files()
    assert row["acked_offset"] == row["sealed_offset"] == len(content)
    values = content.split(b"\n")[:-1]
    assert set(kafka.values()) | set(again.values()) == set(values)
    assert len(again.values()) == len(set(again.values()))       # each once after the start
    agent.abandon()
