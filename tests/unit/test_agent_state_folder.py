"""A damaged state folder (``agent/state/folder.py``): the pool file watched under a running
agent, and a state database the agent's user may not open refused with exit 78 (systemd does
not restart that in a loop)."""

from __future__ import annotations

import os
import sqlite3

import pytest

from agent.cli import main as agent_main
from agent.config import EX_CONFIG
from agent.errors import StartupError
from agent.state.folder import PoolWatch, StateFolderRefused, examine_state_db


def test_the_pool_watch_sees_a_pool_file_deleted_replaced_or_cut_short(tmp_path):
    pool = tmp_path / "buffer.pool"
    pool.write_bytes(b"\0" * 8192)
    watch = PoolWatch(pool, 8192)
    assert watch.check() is None
    os.truncate(pool, 4096)
    assert watch.check() == "truncated"
    os.truncate(pool, 8192)
    other = tmp_path / "other"
    other.write_bytes(b"\0" * 8192)
    os.replace(other, pool)
    assert watch.check() == "replaced"
    watch.close()
    watch = PoolWatch(pool, 8192)
    pool.unlink()
    assert watch.check() == "deleted"
    watch.close()


def test_no_finding_on_a_first_start_and_state_lost_where_the_agent_ran_before(tmp_path):
    db, journal = tmp_path / "state.db", tmp_path / "loss-journal.jsonl"
    assert examine_state_db(db, journal, 1) is None
    journal.write_text("")
    finding = examine_state_db(db, journal, 1)
    assert finding is not None and finding.reason == "state_lost"


def test_a_state_database_this_user_may_not_open_is_refused_with_78(tmp_path, monkeypatch):
    state = tmp_path / "state"
    state.mkdir()
    (state / "state.db").write_bytes(b"")
    monkeypatch.setattr("agent.state.folder.os.access", lambda path, mode: False)
    with pytest.raises(StateFolderRefused, match="cannot be read and written"):
        examine_state_db(state / "state.db", state / "loss-journal.jsonl", 1)
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nid = "t"\nstate_dir = "{state}"\n'
                      '[broker]\nbootstrap_servers = "127.0.0.1:9"\n'
                      '[status]\nlisten = "127.0.0.1:0"\n'
                      f'[[sources]]\ntype = "file"\ntopic = "t"\npaths = ["{tmp_path}/*.log"]\n')
    assert agent_main(["run", "--config", str(config)]) == EX_CONFIG
    assert (state / "state.db").exists()                # refused: nothing moved or made


def test_an_empty_state_database_where_the_agent_ran_before_is_a_lost_one(tmp_path):
    db, journal = tmp_path / "state.db", tmp_path / "loss-journal.jsonl"
    db.write_bytes(b"")
    journal.write_text("")
    finding = examine_state_db(db, journal, 1)
    assert finding is not None and finding.reason == "state_lost" and not db.exists()


def test_a_locked_healthy_state_database_is_never_moved_aside(tmp_path, monkeypatch):
    """Only SQLite's "not a database" and "corrupt" move a database aside: a lock held by
    another process (or an I/O error) stops the start, the file untouched."""
    monkeypatch.setattr("agent.state.folder.LOCK_WAIT_S", 0.2)
    db = tmp_path / "state.db"
    holder = sqlite3.connect(db)
    holder.execute("CREATE TABLE t (x)")
    holder.commit()
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StartupError, match="cannot read the state database"):
            examine_state_db(db, tmp_path / "loss-journal.jsonl", 1)
    finally:
        holder.rollback()
        holder.close()
    assert db.exists() and not list(tmp_path.glob("state.db.damaged-*"))


def test_a_pool_beside_a_lost_state_database_is_moved_aside_with_it(tmp_path):
    """Its slots name files by the lost database's ids, which a new database gives to other
    files: kept, they would move the new files' checkpoints."""
    from tests.unit.fakeproducer import FakeKafka
    from tests.unit.test_agent_disk_full import agent_on, lines, turns
    agent = agent_on(tmp_path, FakeKafka())
    (tmp_path / "logs" / "app.log").write_bytes(lines(0, 20))
    turns(agent, 5)
    agent.abandon()
    state = tmp_path / "state"
    for name in ("state.db", "state.db-wal", "state.db-shm"):
        (state / name).unlink(missing_ok=True)
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    assert len(list(state.glob("buffer.pool.damaged-*"))) == 1
    reasons = [e["reason"] for e in agent.journal.entries()]
    assert reasons == ["state_lost"], reasons
    assert "buffer pool moved to" in agent.journal.entries()[0]["detail"]
    turns(agent, 10)
    assert len(kafka.log) == 20                  # the file read again from its start
    agent.abandon()


def test_an_error_of_the_system_with_no_file_leaves_where_it_came_from_in_the_log(
        tmp_path, monkeypatch, capfd):
    """An OSError with no file name out of the agent is logged with its traceback, and out of
    a running one (ready, shipping) not as "cannot start". Two CI runs ended on "cannot start:
    Operation not permitted" and nothing else; the traceback named the call the next time (a
    reload's closed write watch, ``test_idle_loop.py``)."""
    import errno

    from agent.service import Agent

    def refused(self):
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(Agent, "run", refused)
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nid = "t"\nstate_dir = "{tmp_path / "state"}"\n'
                      '[broker]\nbootstrap_servers = "127.0.0.1:9"\n'
                      '[status]\nlisten = "127.0.0.1:0"\n'
                      f'[[sources]]\ntype = "file"\ntopic = "t"\npaths = ["{tmp_path}/*.log"]\n')
    assert agent_main(["run", "--config", str(config)]) == 1
    err = capfd.readouterr().err
    assert "cannot start: Operation not permitted" in err
    assert "Traceback" in err and "in refused" in err, err

    def refused_running(self):
        self.shipping = True
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(Agent, "run", refused_running)
    config.write_text(config.read_text().replace('state"', 'state2"'))  # the first one's is locked
    assert agent_main(["run", "--config", str(config)]) == 1
    err = capfd.readouterr().err
    assert "stopped by an error: Operation not permitted" in err and "cannot start" not in err
    assert "in refused_running" in err, err
