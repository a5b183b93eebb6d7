"""What a producer host does to the agent, against the real local Kafka: the state folder's
disk fills up under traffic; the pool file or the state database is damaged or deleted."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.agentkit import consume_counts, stop_with_writer, wait_until
from tests.integration.test_agent_end_to_end import (
    assert_exactly_once,
    parse_id,
    setup_agent,
    start_writer,
)


@pytest.fixture
def small_fs(tmp_path):
    """A 48 MiB tmpfs for the state folder, mounted for this test alone."""
    where = tmp_path / "small-fs"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system for the state folder needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(folder: Path) -> Path:
    """Fill ``folder``'s file system to its last byte; the filler file is returned."""
    filler = folder / "filler"
    chunk = b"\0" * (1 << 20)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                if os.write(fd, chunk) < len(chunk):
                    break
            except OSError:
                break
        for size in (4096, 512, 1):                    # what a 1 MiB write could not take
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError:
                    break
    finally:
        os.close(fd)
    return filler


def free_bytes(folder: Path) -> int:
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


@pytest.mark.slow
def test_a_full_disk_pauses_reading_keeps_sending_and_resumes_losing_nothing(
        kafka, tmp_path, topic_name, small_fs):
    """The state folder on a 48 MiB file system (the 16 MiB pool preallocated in it), 200,000
    lines at 20,000 lines/s. 2 s in the broker is paused (a backlog gathers in the pool), at 4 s
    the file system is filled to its last byte, at 6 s the broker resumes: the agent has paused
    reading (status and one log line say so), sends what its pool holds meanwhile (a checkpoint
    write the full disk refuses waits in memory), and reads on once the space is back, 10 s
    later. Every id arrives; the state database passes SQLite's integrity check and no
    loss-journal line is torn."""
    total, rate = 200_000, 20_000
    state = small_fs / "state"
    cluster = kafka.controlled()
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name,
                              buffer={"size_bytes": 16 << 20, "slot_size_bytes": 1 << 20},
                              agent={"state_dir": str(state), "disk_reserve_bytes": 4 << 20})
    agent.start()
    writer = start_writer(logs, total, 50_000, rate)
    reasons = set()
    try:
        time.sleep(2)
        cluster.pause_node(1)
        try:
            time.sleep(2)
            filler = fill(small_fs)
            assert free_bytes(small_fs) < 4096, "the file system was not filled"
            paused = wait_until("status disk full", lambda: (s := agent.status())
                              and s["disk"]["state"] == "full" and s, 10)
            time.sleep(2)
        finally:
            cluster.resume_node(1)
        cpu0, read0 = agent.cpu_seconds(), paused["totals"]["read_events"]
        sent0, held = paused["totals"]["sent_events"], paused["backlog"]["events"]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            during = agent.status()
            assert during is not None and agent.alive(), \
                f"the agent died on a full disk:\n{agent.log_text()}"
            assert during["disk"]["state"] == "full", during["disk"]
            reasons.add(during["disk"]["reason"].split(":")[0])
            time.sleep(0.5)
        cpu_full = agent.cpu_seconds() - cpu0
        assert agent.metric("agent_disk_full") == 1
        # It stopped reading (after the pause began at most the turn that saw it: one read
        # budget) and sent what its pool held.
        read_full = during["totals"]["read_events"] - read0
        sent_full = during["totals"]["sent_events"] - sent0
        assert read_full <= (8 << 20) // 100, read_full
        assert held > 0, "no backlog was held when the disk filled: the test proves nothing"
        assert sent_full >= held, (sent_full, held)
        assert during["backlog"]["events"] == 0
        filler.unlink()
        resumed = time.monotonic()
        wait_until("status disk ok",
                   lambda: (s := agent.status()) and s["disk"]["state"] == "ok", 10)
        assert writer.wait(timeout=300) == 0
        counts = consume_counts(kafka.bootstrap_servers, topic_name, total, 300, parse_id)
        catch_up = time.monotonic() - resumed
        retried = agent.metric("agent_drain_retried_events_total")
    finally:
        rc = stop_with_writer(agent, writer)
    assert rc == 0, agent.log_text()
    # Whether a write is also refused depends on the room SQLite's WAL file already has (a
    # reset WAL is written over in place): the JSON line says which it was; the unit tests
    # (tests/unit/test_agent_disk_full.py) refuse writes on purpose.
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    assert duplicates <= retried                  # no agent was killed
    if duplicates == 0:
        assert_exactly_once(counts, total=total)
    assert len(counts) == total, f"{total - len(counts)} ids lost"
    log = agent.whole_log()
    assert log.count("disk full:") == 1, log[-3000:]
    assert "reading resumed" in log
    with sqlite3.connect(state / "state.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    journal = state / "loss-journal.jsonl"
    for line in journal.read_text().splitlines() if journal.exists() else []:
        json.loads(line)
    print(json.dumps({"fault": "disk_full", "events": total, "lost": total - len(counts),
                      "duplicates": duplicates, "backlog_when_full": held,
                      "read_while_full": read_full, "sent_while_full": sent_full,
                      "agent_cpu_s_while_full": round(cpu_full, 2),
                      "catch_up_s": round(catch_up, 1), "full_because": sorted(reasons)}))


NO_ROTATION = 10**9


def counts_within(counts, total: int, most: int) -> int:
    """Every id of ``range(total)`` arrived, none more than ``most`` times, none unknown;
    returns the duplicates."""
    missing = [i for i in range(total) if counts.get(i, 0) == 0]
    assert not missing, f"{len(missing)} ids lost, first {missing[:10]}"
    assert not set(counts) - set(range(total)), "ids never written arrived"
    over = {i: c for i, c in counts.items() if c > most}
    assert not over, f"{len(over)} ids arrived more than {most} times: {list(over.items())[:5]}"
    return sum(c - 1 for c in counts.values())


def journal_reasons(state: Path) -> list[str]:
    path = state / "loss-journal.jsonl"
    return [json.loads(line)["reason"] for line in path.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["deleted", "garbage"])
def test_a_state_database_lost_while_stopped_starts_a_new_incarnation_and_says_so(
        kafka, tmp_path, topic_name, damage):
    """20,000 lines delivered, the agent stopped, its state database deleted (or overwritten
    with bytes that are not SQLite) and 10,000 more lines written: the agent starts (no crash,
    nothing silent): an ERROR line, the damaged file moved aside, a ``state_lost`` journal
    entry of unknown size; every file is read again from its start, so all 30,000 ids arrive,
    the first 20,000 twice at most."""
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name)
    state = tmp_path / "state"
    agent.start()
    writer = start_writer(logs, 20_000, NO_ROTATION, 20_000)
    assert writer.wait(timeout=60) == 0
    consume_counts(kafka.bootstrap_servers, topic_name, 20_000, 120, parse_id)
    assert agent.stop() == 0
    db = state / "state.db"
    if damage == "deleted":
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            (state / name).unlink(missing_ok=True)
    else:
        db.write_bytes(b"this is not an SQLite database\n" * 512)
    writer = start_writer(logs, 10_000, NO_ROTATION, 20_000, first=20_000)
    assert writer.wait(timeout=60) == 0
    agent.start()
    try:
        counts = consume_counts(kafka.bootstrap_servers, topic_name, 30_000, 180, parse_id)
        status = agent.status()
    finally:
        rc = agent.stop()
    assert rc == 0, agent.log_text()
    duplicates = counts_within(counts, 30_000, 2)
    log = agent.whole_log()
    assert ("is missing" if damage == "deleted" else "is damaged") in log, log[-3000:]
    if damage == "garbage":
        assert len(list(state.glob("state.db.damaged-*"))) == 1
    assert journal_reasons(state).count("state_lost") == 1
    assert status["loss_journal"]["unknown_size"] == 1
    print(json.dumps({"fault": f"state_db_{damage}", "events": 30_000, "lost": 0,
                      "duplicates": duplicates}))


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_pool_file_deleted_or_cut_short_under_the_agent_stops_it_and_the_restart_recovers(
        kafka, tmp_path, topic_name, damage):
    """100,000 lines at 20,000 lines/s; 2 s in the pool file is deleted (or cut to 4 KiB):
    the agent says so and exits 1 (deleted: after sending what it held; cut short: at once,
    or killed by SIGBUS if it touched a page past the end first); started again, as systemd
    would, it runs (a cut-short pool moved aside, journalled ``pool_damaged``) and every id
    arrives, none more than twice."""
    total = 100_000
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name)
    state = tmp_path / "state"
    pool = state / "buffer.pool"
    agent.start()
    writer = start_writer(logs, total, NO_ROTATION, 20_000)
    try:
        time.sleep(2)
        if damage == "deleted":
            pool.unlink()
        else:
            os.truncate(pool, 4096)
        rc = agent.proc.wait(timeout=60)
        first_log = agent.whole_log()
        agent.start()
        assert writer.wait(timeout=120) == 0
        counts = consume_counts(kafka.bootstrap_servers, topic_name, total, 180, parse_id)
    finally:
        if writer.poll() is None:
            writer.kill()
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()
    if damage == "deleted":
        assert rc == 1, first_log[-3000:]
        assert "was deleted under the running agent" in first_log
    else:
        assert rc in (1, -7), first_log[-3000:]         # -7: SIGBUS
        assert len(list(state.glob("buffer.pool.damaged-*"))) == 1
        assert journal_reasons(state).count("pool_damaged") == 1
    duplicates = counts_within(counts, total, 2)
    print(json.dumps({"fault": f"pool_{damage}", "events": total, "lost": 0,
                      "duplicates": duplicates, "first_exit": rc}))
