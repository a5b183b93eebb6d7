"""A damaged state folder (``agent/statefolder.py``): the pool file watched under a running
agent, and a state database the agent's user may not open refused with exit 78 (systemd does
not restart that in a loop)."""

from __future__ import annotations

import os

import pytest

from agent.cli import main as agent_main
from agent.config import EX_CONFIG
from agent.statefolder import PoolWatch, StateFolderRefused, examine_state_db


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
    monkeypatch.setattr("agent.statefolder.os.access", lambda path, mode: False)
    with pytest.raises(StateFolderRefused, match="cannot be read and written"):
        examine_state_db(state / "state.db", state / "loss-journal.jsonl", 1)
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nid = "t"\nstate_dir = "{state}"\n'
                      '[broker]\nbootstrap_servers = "127.0.0.1:9"\n'
                      '[status]\nlisten = "127.0.0.1:0"\n'
                      f'[[sources]]\ntype = "file"\ntopic = "t"\npaths = ["{tmp_path}/*.log"]\n')
    assert agent_main(["run", "--config", str(config)]) == EX_CONFIG
    assert (state / "state.db").exists()                # refused: nothing moved or made
