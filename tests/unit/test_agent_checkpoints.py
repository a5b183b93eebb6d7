"""The agent's checkpoints, driven turn by turn (``Agent.turn``) with a fake clock, the real file
source, pool and state database, and a fake Kafka at the transport seam."""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import threading
from pathlib import Path

import numpy as np
import pytest
from confluent_kafka import KafkaError

from agent.buffer import Chunk
from agent.buffer import layout as L
from agent.buffer.seams import FileOps
from agent.config import parse
from agent.service import Agent, Seams
from agent.state.db import (
    FINGERPRINT_BYTES,
    LOCK_WAIT_S,
    PAGE_BYTES,
    AuditUpdate,
    AuditWindow,
    StateDB,
)
from agent.tail import files
from docket_common.names import SEQ_HEADER
from tests.unit.fakeproducer import HOLD, FakeKafka
from tests.unit.tailkit import FakeClock, id_of, keep_state_db, lines, put_back_state_db

SLOT = 4096


def agent_on(tmp_path, kafka: FakeKafka, sync_on_seal: bool = False,
             pool_ops: FileOps | None = None, encoding: str = "utf-8",
             source: dict | None = None) -> Agent:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    cfg = parse({
        "agent": {"id": "t", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * SLOT, "slot_size_bytes": SLOT,
                   "linger_ms": 5, "sync_on_seal": sync_on_seal},
        "broker": {"bootstrap_servers": "127.0.0.1:9"},
        "audit": {"enabled": False},
        "sources": [{"type": "file", "topic": "t", "paths": [str(logs / "app.log")],
                     **({"format": "cri"} if encoding == "cri" else {"encoding": encoding}),
                     **(source or {})}],
    })
    agent = Agent(cfg, seams=Seams(clock=FakeClock(), producer_factory=kafka.producer,
                                   file_events=False, pool_ops=pool_ops))
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


def test_a_turn_hands_a_slot_over_then_writes_its_checkpoints_then_serves_reports(tmp_path):
    """The order within one turn (``Agent.turn``): the slot just sealed is produced before the
    checkpoints' transaction (off its latency), and no delivery report is served before that
    transaction, so no slot is acknowledged and freed with its sealed checkpoint unwritten."""
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    steps: list[str] = []
    producer = agent.drain.producer
    produce, poll = producer.produce, producer.poll
    producer.produce = lambda *a, **k: (steps.append("produce"), produce(*a, **k))[1]
    producer.poll = lambda *a, **k: (steps.append("poll"), poll(*a, **k))[1]
    agent.db._crash_point = lambda name: steps.append(name) if name == "db:advance" else None
    (tmp_path / "logs" / "app.log").write_bytes(lines(0, 3))
    agent.clock.advance(0.3)
    agent.turn()
    assert steps.count("produce") == 3
    written = steps.index("db:advance")
    assert steps[:written] == ["produce"] * 3                  # nothing served before
    assert "poll" in steps[written:]                           # served after, in the turn
    for _ in range(5):
        agent.clock.advance(0.3)
        agent.turn()
    [row] = agent.db.all_files()
    assert row["acked_offset"] == row["sealed_offset"] == len(lines(0, 3))
    assert agent.metrics.get("agent_drain_slots_freed_total") == 1
    agent.abandon()


def test_a_slot_acknowledged_while_another_slots_checkpoint_waits_is_freed_written(tmp_path):
    """A socket source's thread waiting for room in a full pool collects the slots sealed so
    far, file slots too: their positions are noted after the turn wrote its checkpoints. A
    slot acknowledged in that turn's pump must still have its acknowledged offset written
    before the drain frees it (were the agent killed then, the start would find the bytes
    neither acknowledged nor in the pool, and read them again under new numbers): the noted
    checkpoints are written first."""
    kafka = FakeKafka()
    first, second = lines(0, 1), lines(1, 2)
    kafka.script(first[:-1], HOLD)
    agent = agent_on(tmp_path, kafka)
    log = tmp_path / "logs" / "app.log"
    log.write_bytes(first)
    agent.clock.advance(0.3)
    agent.turn()                                        # sealed, sent, checkpoint written
    [row] = agent.db.all_files()
    assert (row["sealed_offset"], row["acked_offset"]) == (len(first), 0)
    log.write_bytes(first + second)
    agent._read(agent.monotonic())                      # what a socket thread's collection
    agent.clock.advance(0.3)                            # does between the turn's write and
    agent.pool.seal_due(False)                          # its pump: a slot sealed, noted
    assert agent.checkpoints.unwritten()
    kafka.producers[0].release()
    agent.drain.pump()                                  # the first slot acknowledged, freed
    assert agent.metrics.get("agent_drain_slots_freed_total") >= 1
    [row] = agent.db.all_files()
    assert row["acked_offset"] >= len(first)            # written before the free
    assert row["sealed_offset"] == len(first + second)  # the noted checkpoint first
    agent.abandon()


def test_a_state_write_waits_for_the_emitters_connection_as_long_as_a_loaded_host_needs(
        tmp_path):
    """Seen on a loaded host: the agent's main loop died of "database is locked" while the
    audit emitter's connection wrote (SQLite's default wait is 5 s). Both connections wait
    ``LOCK_WAIT_S``; a write held 6 s by the other one is waited for, not fatal."""
    db = StateDB(tmp_path / "state.db")
    assert db.conn.execute("PRAGMA busy_timeout").fetchone()[0] == LOCK_WAIT_S * 1000
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


def _started_again(tmp_path, turns: int, encoding: str = "utf-8") -> tuple[FakeKafka, Agent]:
    """The next start on the same state folder, with a Kafka of its own, ``turns`` turns on
    (the metrics of the start are kept: the self-check's among them)."""
    again = FakeKafka()
    agent = agent_on(tmp_path, again, encoding=encoding)
    for _ in range(turns):
        agent.clock.advance(0.3)
        agent.turn()
    return again, agent


def _oldest_slot_waiting(tmp_path) -> tuple[FakeKafka, Agent, bytes]:
    """400 lines whose first record fails (retriable) again and again: the oldest slot waits
    for Kafka while later slots are acknowledged (and kept: see above)."""
    kafka = FakeKafka()
    content = lines(0, 400)
    kafka.script(lines(0, 1)[:-1], *[KafkaError(KafkaError._MSG_TIMED_OUT)] * 50)
    agent = agent_on(tmp_path, kafka)
    (tmp_path / "logs" / "app.log").write_bytes(content)
    for _ in range(15):
        agent.clock.advance(0.3)
        agent.turn()
    return kafka, agent, content


def test_a_crash_while_an_older_slot_waits_reads_nothing_again(tmp_path):
    """As above, then the agent dies (nothing written) while the oldest slot waits and later
    slots are acknowledged: the next start finds every byte either acknowledged or in the pool
    — nothing to read again — and sends again only the pool's slots."""
    kafka, agent, content = _oldest_slot_waiting(tmp_path)
    held = kafka.values()
    assert len(held) > 100 and lines(0, 1)[:-1] not in held   # later slots acknowledged
    agent.abandon()                                          # SIGKILL

    again, agent = _started_again(tmp_path, 30)
    assert agent.metrics.get("agent_source_rewound_total") == 0
    [row] = agent.db.all_files()
    assert row["acked_offset"] == row["sealed_offset"] == len(content)
    values = content.split(b"\n")[:-1]
    assert set(kafka.values()) | set(again.values()) == set(values)
    assert len(again.values()) == len(set(again.values()))       # each once after the start
    agent.abandon()


def _wal_pages_since(wal: Path, offset: int) -> tuple[list[int], int]:
    """The database pages written to the write-ahead log ``wal`` after byte ``offset`` (its
    frames, in order), and the log's size now."""
    data = wal.read_bytes()
    page_bytes = struct.unpack(">I", data[8:12])[0]
    pages, at = [], max(offset, 32)                   # 32: the log's header
    while at + 24 + page_bytes <= len(data):
        pages.append(struct.unpack(">I", data[at:at + 4])[0])
        at += 24 + page_bytes
    return pages, len(data)


def test_a_slots_sealed_checkpoint_writes_few_small_pages(tmp_path):
    """Every slot's sealed checkpoint rewrites its pages whole in SQLite's log, and the
    checkpoints that sync the log stall the agent's loop: at 1,000 lines/s every line is a
    slot. A new database takes 1 KiB pages; the slot's transaction writes the file's row (with
    a whole fingerprint it spills into an overflow page: only that page, where the offsets
    are), the next record number, its locate run (row and two index entries), its tally window
    and the last slot counted — that one in place, not its name's index page too. (An offset
    that grows into a longer integer, at 32 KiB, 8 MiB, 2 GiB, rewrites the row whole, once.)"""
    db = StateDB(tmp_path / "state.db")
    assert db.conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_BYTES == 1024
    source = db.add_file(0, 1, 2, b"f" * FINGERPRINT_BYTES, "/var/log/app/events.log")

    def seal(seq: int) -> None:              # 1,000-byte slots: offsets of two bytes each
        window = AuditWindow("t", 600_000, seq, 1000 * seq, seq, 0, 0, {}, {}, seq)
        db.advance_sealed({source: 1000 * seq}, audit=lambda: AuditUpdate([window], seq),
                          next_record=seq, runs=[(seq - 1, 1, "t", source, 1000 * seq - 1000,
                                                  1000 * seq, True)])
    seal(1)
    _, end = _wal_pages_since(tmp_path / "state.db-wal", 0)
    seal(2)
    pages, _ = _wal_pages_since(tmp_path / "state.db-wal", end)
    names = dict(db.conn.execute("SELECT pageno, name FROM dbstat"))
    written = sorted(names[p] for p in pages)
    assert len(pages) == 7, written
    assert written == sorted(["files", "identity", "locate", "sqlite_autoindex_locate_1",
                              "locate_sealed", "audit_windows", "audit_meta"])
    assert db.audit_meta() == {"counted_seq": 2}
    db.close()


def test_a_state_database_created_before_keeps_its_pages_and_works(tmp_path):
    """SQLite cannot change the page size of a database in WAL mode without rewriting it:
    one created with 4 KiB pages keeps them, and every write and read works as before."""
    old = sqlite3.connect(tmp_path / "state.db")
    old.execute("PRAGMA page_size=4096")
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE audit_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    old.execute("INSERT INTO audit_meta VALUES ('seq', 7)")
    old.commit()
    old.close()
    db = StateDB(tmp_path / "state.db")
    assert db.conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    source = db.add_file(0, 1, 2, b"fp", "/x.log")
    db.advance_sealed({source: 10}, audit=lambda: AuditUpdate([], 3), next_record=4)
    with db.audit_round() as round_:
        round_.save_seq(8)
    assert db.audit_meta() == {"seq": 8, "counted_seq": 3}
    assert db.get(source)["sealed_offset"] == 10 and db.identity()[1] == 4
    db.close()


def test_a_slot_lost_before_a_later_one_that_survives_is_read_again(tmp_path):
    """The start's self-check moves a file's sealed offset back to the first byte no
    surviving slot covers; reading must resume there, not after the highest slot that
    survived (which skipped the lost slot's bytes: neither read again nor journalled). The
    oldest slot waits for Kafka (its first record fails again and again) while later slots
    are acknowledged and kept; the agent dies; the oldest slot's header is damaged in the
    pool file (a power cut that kept later headers, not its own). Every line must arrive."""
    kafka, agent, content = _oldest_slot_waiting(tmp_path)
    slots = agent.pool.sealed()
    oldest = min(slots, key=lambda s: s.meta.positions[0][1])
    assert oldest.meta.positions[0][1] == 0 and len(slots) > 2
    at = agent.pool.geometry.slot_headers_offset + oldest.index * L.SLOT_HEADER_BYTES
    agent.abandon()                                          # SIGKILL
    with open(tmp_path / "state" / "buffer.pool", "r+b") as f:   # its header, cut short
        f.seek(at + 8)
        f.write(b"\xff" * 8)

    again, agent = _started_again(tmp_path, 40)
    assert agent.metrics.get("agent_source_rewound_total") == 1
    values = content.split(b"\n")[:-1]
    delivered = set(kafka.values()) | set(again.values())
    missing = [v for v in values if v not in delivered]
    assert not missing, f"{len(missing)} line(s) never delivered, first {missing[:2]}"
    agent.abandon()


def _encoded(data: bytes, encoding: str, at_start: bool = False) -> bytes:
    """Lines as a file in ``encoding`` holds them (UTF-16 little-endian behind a byte order
    mark at the file's start; ``cri``: each line as containerd writes it, its time from its
    id)."""
    if encoding == "utf-8":
        return data
    if encoding == "cri":
        return b"".join(b"2026-12-03T21:%02d:%02d.%09dZ stdout F %s\n" % (
            id_of(x) // 60 % 60, id_of(x) % 60, id_of(x), x) for x in data.split(b"\n")[:-1])
    return (b"\xff\xfe" if at_start else b"") + data.decode().encode("utf-16-le")


def _four_batches_read(tmp_path, encoding: str = "utf-8") -> tuple[FakeKafka, Agent, Path]:
    """Four batches of 100 lines, read a second and more apart (each batch's end an anchor),
    every line acknowledged: (Kafka, the agent, the log file)."""
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka, encoding=encoding)
    log_file = tmp_path / "logs" / "app.log"
    for batch in range(4):
        with open(log_file, "ab") as f:
            f.write(_encoded(lines(batch * 100, batch * 100 + 100), encoding, batch == 0))
        for _ in range(5):
            agent.clock.advance(0.3)
            agent.turn()
    return kafka, agent, log_file


def _read_in_batches(agent: Agent, log_file: Path, first: int, last: int, gap_s: float) -> None:
    """Batches ``first`` to ``last`` (exclusive) of ten lines each written, a turn ``gap_s``
    after each; then five turns 0.3 s apart, so that every line is acknowledged."""
    for batch in range(first, last):
        with open(log_file, "ab") as f:
            f.write(lines(batch * 10, batch * 10 + 10))
        agent.clock.advance(gap_s)
        agent.turn()
    for _ in range(5):
        agent.clock.advance(0.3)
        agent.turn()


def _cut_back_and_written_on(log_file: Path, kept_lines: int, new: bytes) -> None:
    """What a power cut leaves of the application's log: its first ``kept_lines`` lines, then
    ``new`` written on from the cut."""
    with open(log_file, "r+b") as f:
        f.truncate(len(lines(0, kept_lines)))
    with open(log_file, "ab") as f:
        f.write(new)


def _cut_back_run(tmp_path, seen_beyond: int = 0):
    """Four batches of 100 lines, read a second and more apart (each batch's end an anchor),
    every line acknowledged; a SIGKILL; the file cut back to 217 lines (a power loss took the
    application's unsynced tail) and 300 new lines appended from there, reaching past the old
    checkpoint; the agent starts again. ``seen_beyond``: bytes the first agent had seen past
    its checkpoint and not read. Returns (every value delivered, the journal's entries, the
    second agent's Kafka)."""
    kafka, agent, log_file = _four_batches_read(tmp_path)
    [row] = agent.db.all_files()
    assert row["acked_offset"] == row["sealed_offset"] == len(lines(0, 400))
    if seen_beyond:
        agent.db.set_sizes({row["source_id"]: row["sealed_offset"] + seen_beyond})
    agent.abandon()                                               # the power cut
    _cut_back_and_written_on(log_file, 217, lines(1000, 1300))
    again, agent = _started_again(tmp_path, 20)
    entries = [json.loads(x) for x in (tmp_path / "state" / "loss-journal.jsonl").read_text()
               .splitlines()] if (tmp_path / "state" / "loss-journal.jsonl").exists() else []
    agent.abandon()
    return kafka.values() + again.values(), entries, again


def test_a_file_cut_back_below_its_checkpoint_and_written_on_loses_no_new_line(tmp_path):
    """Resuming at the checkpoint would skip the new lines written below it (offsets 13,020
    to 24,000): the newest anchor the file still holds (the second batch's end) is where
    reading resumes instead. The lines from there to the cut arrive twice; nothing was lost,
    so nothing is journaled."""
    delivered, entries, _ = _cut_back_run(tmp_path)
    new = lines(1000, 1300).split(b"\n")[:-1]
    missing = [v for v in new if v not in delivered]
    assert not missing, f"{len(missing)} new line(s) never delivered, first {missing[:2]}"
    twice = [v for v in set(delivered) if delivered.count(v) > 1]
    assert 0 < len(twice) <= 100 and all(200 <= id_of(v) < 217 for v in twice), \
        "only the lines from the newest anchor held to the cut go twice"
    assert entries == []


def test_a_cut_back_within_the_last_second_read_is_read_again_from_the_hand_over_below_it(
        tmp_path):
    """Forty batches of ten lines read 20 ms apart — under a second in all, so the anchors a
    second apart hold only the first batch's end and the newest —, every line acknowledged; a
    power cut takes the file back to 217 lines and 300 new lines follow. Reading resumes at
    the newest hand-over the file still holds (the end of line 209), not a second back: only
    the lines of the batch the cut fell in arrive twice (with a second's anchors alone, the
    newest replacing the one before within the second: all 217 from the file's start, under
    new record numbers)."""
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    log_file = tmp_path / "logs" / "app.log"
    _read_in_batches(agent, log_file, 0, 40, 0.02)
    [row] = agent.db.all_files()
    assert row["acked_offset"] == row["sealed_offset"] == len(lines(0, 400))
    agent.abandon()                                               # the power cut
    _cut_back_and_written_on(log_file, 217, lines(1000, 1300))
    again, agent = _started_again(tmp_path, 20)
    agent.abandon()
    delivered = kafka.values() + again.values()
    missing = [v for v in lines(1000, 1300).split(b"\n")[:-1] if v not in delivered]
    assert not missing, f"{len(missing)} new line(s) never delivered, first {missing[:2]}"
    twice = sorted(id_of(v) for v in set(delivered) if delivered.count(v) > 1)
    assert twice == list(range(210, 217)), twice


def test_a_restart_keeps_the_anchors_a_second_apart_beside_the_fine_ones(tmp_path):
    """150 batches read 0.3 s apart (45 s), a clean stop and start, five more batches; then a
    power cut takes the file back to line 700 (some 24 s before the restart). The anchors a
    second apart survive the restart beside the fine ones (stored apart), so reading resumes
    at the one just below the cut: only the lines from it to the cut arrive twice (before
    they were stored apart, the start took the fine ones for anchors a second apart and kept
    only the newest 48 of all: reading resumed at the file's start)."""
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    log_file = tmp_path / "logs" / "app.log"
    _read_in_batches(agent, log_file, 0, 150, 0.3)
    agent.shutdown()
    second = FakeKafka()
    agent = agent_on(tmp_path, second)
    _read_in_batches(agent, log_file, 150, 155, 0.3)
    agent.abandon()                                               # the power cut
    _cut_back_and_written_on(log_file, 700, lines(5000, 5100))
    again, agent = _started_again(tmp_path, 20)
    agent.abandon()
    delivered = kafka.values() + second.values() + again.values()
    missing = [v for v in lines(5000, 5100).split(b"\n")[:-1] if v not in delivered]
    assert not missing, f"{len(missing)} new line(s) never delivered"
    twice = sorted(id_of(v) for v in set(delivered) if delivered.count(v) > 1)
    assert twice and twice[-1] == 699 and len(twice) <= 40, (len(twice), twice[:3])


def _read_then_power_cut(agent: Agent, log_file: Path, data: bytes, saved: Path,
                         turns: int) -> None:
    """``data`` written and read (its slots held in the pool by a record Kafka holds); a power
    cut: the agent gone, the state database as ``saved`` kept it."""
    with open(log_file, "ab") as f:
        f.write(data)
    for _ in range(turns):
        agent.clock.advance(0.3)
        agent.turn()
    assert agent.pool.sealed(), "the held record's slot waits for Kafka"
    agent.abandon()                                           # the power cut
    put_back_state_db(log_file.parent.parent / "state", saved)


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16", "cri"])
def test_a_cut_back_is_found_where_the_pool_holds_more_than_the_state_database_anchored(
        tmp_path, encoding):
    """The power-cut file system's finding: the pool (synced at each seal) holds a slot read
    past the checkpoint the state database last made durable (its commits are synced at most
    every 0.2 s), so the newest anchor lies below where reading resumes. The application's
    log lost its unsynced tail in the same cut and was written on past the old end before the
    agent started. The file still holds the newest anchor; the stretch from there to the
    recovered end no longer holds what the slot read, and must be read again — before, the
    agent resumed at the slot's end, in the middle of the new lines: the new lines below it
    never arrived and a fragment of one did, nothing journaled. Reading resumes at the first line
    the file no longer holds as the slot read it (line 430), not at the anchor (400): the lines
    between arrive once, from the pool. A UTF-16 log is checked through its records'
    transcoding (and read again from the anchor); a container's (CRI) through the records the
    slot's lines make (their times and texts)."""
    kafka, agent, log_file = _four_batches_read(tmp_path, encoding)
    saved = tmp_path / "durable"
    keep_state_db(tmp_path / "state", saved)   # what the last log sync made
    held = lines(450, 451)[:-1]
    kafka.script(held if encoding != "cri" else json.dumps(
        {"time": "2026-12-03T21:07:30.000000450Z", "stream": "stdout",
         "message": held.decode()}, separators=(",", ":")).encode(), HOLD)   # stays in the pool
    _read_then_power_cut(agent, log_file, _encoded(lines(400, 500), encoding), saved, 5)
    with open(log_file, "r+b") as f:
        f.truncate(len(_encoded(lines(0, 430), encoding, True)))      # the lost tail
    with open(log_file, "ab") as f:
        f.write(_encoded(lines(1000, 1300), encoding))        # written on past the old end
    again, agent = _started_again(tmp_path, 20, encoding)
    try:
        delivered = [json.loads(v)["message"].encode() if encoding == "cri" else v
                     for v in kafka.values() + again.values()]
        new = lines(1000, 1300).split(b"\n")[:-1]
        missing = [v for v in new if v not in delivered]
        assert not missing, f"{len(missing)} new line(s) never delivered, first {missing[:2]}"
        assert all(v.startswith(b"id-") and len(v) == len(new[0]) for v in delivered), \
            "a fragment of a line was delivered"
        assert agent.metrics.get("agent_source_rotations_total", kind="cut_back", topic="t") == 1
        if encoding == "utf-8":     # read again from the first line the file no longer holds
            kept = lines(400, 430).split(b"\n")[:-1]
            second = again.values()
            assert all(second.count(v) == 1 for v in kept), \
                "lines the file still held as the pool's slot read them were read again"
    finally:
        agent.abandon()


def _every_new_line_once_and_no_old_one_renumbered(delivered: list[bytes], *kafkas) -> None:
    """Lines 1000–1099 (written after the cut) all delivered, and no line delivered under two
    record numbers (sent again from the pool keeps its number; read again takes a new one)."""
    new = lines(1000, 1100).split(b"\n")[:-1]
    missing = [v for v in new if v not in delivered]
    assert not missing, f"{len(missing)} new line(s) never delivered, first {missing[:2]}"
    numbers: dict[bytes, set] = {}
    for kafka in kafkas:
        for _topic, value, _key, _ts, headers in kafka.log:
            numbers.setdefault(value, set()).add(dict(headers)[SEQ_HEADER])
    renumbered = sorted(id_of(v) for v, n in numbers.items() if len(n) > 1)
    assert renumbered == [], \
        f"{len(renumbered)} line(s) read again under new numbers: {renumbered[:5]}"


def _one_read_over_slots(tmp_path) -> tuple[FakeKafka, Agent, Path]:
    """``_four_batches_read``, then lines 400-499 in one read that fills several slots: the
    first acknowledged and freed, the last waiting for Kafka (line 499 held)."""
    kafka, agent, log_file = _four_batches_read(tmp_path)
    kafka.script(lines(499, 500)[:-1], HOLD)
    with open(log_file, "ab") as f:
        f.write(lines(400, 500))
    for _ in range(8):
        agent.clock.advance(0.3)
        agent.turn()
    return kafka, agent, log_file


def test_a_cut_back_past_a_read_that_filled_slots_reads_nothing_acknowledged_again(tmp_path):
    """The power-cut file system's finding (after slots sent while they fill grew larger than
    a turn's read): one read of 100 lines fills more than one slot, so the slots' ends fall
    inside it and the state database's anchors stop at the read before (line 400's end) and
    the read's own end (line 500's). The first slots are acknowledged and freed, the last
    waits for Kafka (line 499 held); the power cut takes the log back to line 480 and new
    lines follow. The file no longer holds the newest anchor; the one below it, 400, lies
    before the first slot the pool still holds. Before, reading went again from there: every
    line of the freed slots arrived a second time under a new record number. Now, with the
    acknowledged offset past those slots and the file holding their stretch as lines, the
    held slot is checked from its start: reading resumes at line 480, each old line once."""
    kafka, agent, log_file = _one_read_over_slots(tmp_path)
    [held] = agent.pool.sealed()
    [(_sid, first, _end)] = held.meta.positions
    [row] = agent.db.all_files()
    assert len(lines(0, 400)) < first <= row["acked_offset"] < len(lines(0, 480)), \
        (first, row["acked_offset"])             # freed slots' lines between anchor and pool
    agent.abandon()                                                # the power cut
    _cut_back_and_written_on(log_file, 480, lines(1000, 1100))
    again, agent = _started_again(tmp_path, 20)
    try:
        _every_new_line_once_and_no_old_one_renumbered(kafka.values() + again.values(), kafka,
                                                        again)
        assert agent.metrics.get("agent_source_rotations_total", kind="cut_back", topic="t") == 1
    finally:
        agent.abandon()


def test_a_cut_back_inside_the_freed_slots_lines_reads_them_again_and_loses_no_new_line(
        tmp_path):
    """The same, the cut inside the freed slots' stretch (line 430), new lines written on from
    there past where the held slot begins: its first record is not where the file holds
    what it read, so nothing before it is taken for held — reading goes again from the anchor
    (line 400) and every new line arrives (taking the stretch for held would skip the new
    lines written over it)."""
    kafka, agent, log_file = _one_read_over_slots(tmp_path)
    agent.abandon()
    _cut_back_and_written_on(log_file, 430, lines(1000, 1100))
    again, agent = _started_again(tmp_path, 20)
    try:
        delivered = kafka.values() + again.values()
        new = lines(1000, 1100).split(b"\n")[:-1]
        missing = [v for v in new if v not in delivered]
        assert not missing, f"{len(missing)} new line(s) never delivered, first {missing[:2]}"
    finally:
        agent.abandon()


def test_a_hole_below_the_newest_anchor_held_does_not_send_reading_back_to_it(tmp_path):
    """The power-cut file system's finding: lines 400–439 read in five reads within the
    linger, the last four into one slot (a block a read), each read's end an anchor (408,
    416, 424, 432, 440); the slots stay in the pool behind line 405, which Kafka holds. The
    cut drops the page of lines 410–413 (zeros) and keeps the rest to line 436, and new lines
    follow. The newest anchor the file holds is line 432's, inside the slot; checked from the
    slot's start, its records meet the zeros below the anchor. Before, that stopped the check
    at the anchor: lines 432–435 were read again under new numbers. Records wholly below the
    anchor are passed by their places in the slot: reading resumes at line 436, each old line
    under one number."""
    kafka, agent, log_file = _four_batches_read(tmp_path)
    kafka.script(lines(405, 406)[:-1], HOLD)
    for part in range(5):
        with open(log_file, "ab") as f:
            f.write(lines(400 + 8 * part, 408 + 8 * part))
        agent.clock.advance(0.001)
        agent.turn()
    for _ in range(8):
        agent.clock.advance(0.3)
        agent.turn()
    slots = [s.meta.positions for s in agent.pool.sealed()]
    assert ((1, len(lines(0, 408)), len(lines(0, 440))),) in slots, slots    # one slot, 4 reads
    agent.abandon()                                                # the power cut
    _cut_back_and_written_on(log_file, 436, lines(1000, 1100))
    with open(log_file, "r+b") as f:
        f.seek(len(lines(0, 410)))
        f.write(b"\0" * len(lines(410, 414)))                      # a page dropped below
    again, agent = _started_again(tmp_path, 20)
    try:
        delivered = kafka.values() + again.values()
        _every_new_line_once_and_no_old_one_renumbered(delivered, kafka, again)
        assert agent.metrics.get("agent_source_rotations_total", kind="cut_back", topic="t") == 1
    finally:
        agent.abandon()


@pytest.mark.parametrize("pages", ["among_the_freed_lines", "from_the_held_slots_start"])
def test_pages_dropped_inside_the_freed_slots_lines_read_no_line_of_them_again(tmp_path, pages):
    """The power-cut file system's finding after the change above (167 and 75 lines under new
    numbers in 10-cut runs): the same read of several slots, the first freed, the last held;
    the cut takes the log's tail from line 480 (new lines written on from there) and, of the
    pages before, drops two (a disk writes back any subset of a file's pages): one among the
    freed slots' lines, one from three lines before the held slot to two lines into it —
    zeros. The stretch between the anchor and the held slot is no longer lines throughout, so
    reading went again from the anchor: every line of it the file still holds a second time,
    under a new number. What the file holds before its last zero was on the disk before the
    cut (the application writes on past the file's end), as read, and acknowledged: reading
    resumes at the end of the last line before the zeros, the lines between them are passed,
    and so are the held slot's lines after them (the pool holds them); the two lines the
    zeros cut into are two records with a hole. The same with one page dropped from the held
    slot's first line: the stretch before it is lines throughout, and the slot's first record
    not held there sent reading back to the anchor — zeros there say the cut came after the
    stretch."""
    kafka, agent, log_file = _one_read_over_slots(tmp_path)
    [held] = agent.pool.sealed()
    [(_sid, first, _end)] = held.meta.positions
    agent.abandon()                                                # the power cut
    width = len(lines(0, 1))
    holes = [(len(lines(0, 410)) + 7, len(lines(0, 413)) + 20),
             (first - 3 * width + 7, first + 2 * width + 5)] if pages == "among_the_freed_lines" \
        else [(first, first + 2 * width + 5)]
    assert holes[0][0] > len(lines(0, 400)) + width and holes[-1][1] < len(lines(0, 480))
    _cut_back_and_written_on(log_file, 480, lines(1000, 1100))
    with open(log_file, "r+b") as f:
        for a, b in holes:
            f.seek(a)
            f.write(b"\0" * (b - a))
    again, agent = _started_again(tmp_path, 20)
    try:
        _every_new_line_once_and_no_old_one_renumbered(kafka.values() + again.values(), kafka,
                                                        again)
        old = lines(0, 500)
        rests = [old[b:].split(b"\n")[0] for _a, b in holes]
        holed = [v for v in again.values() if b"\0" in v]
        assert len(holed) == len(holes), holed
        assert all(v.endswith(r) for v, r in zip(holed, rests, strict=True)), holed
        assert agent.metrics.get("agent_source_rotations_total", kind="cut_back", topic="t") == 1
    finally:
        agent.abandon()


@pytest.mark.parametrize("zeros", ["a_page_below_and_a_new_line_holding_one",
                                   "a_later_cut_among_the_new_lines",
                                   "at_the_held_slots_start_over_new_lines"])
def test_zeros_with_no_record_held_after_them_prove_no_line_old(tmp_path, zeros):
    """The other side of the test above (a review's finding): the cut inside the freed slots'
    stretch (line 430), new lines written on from there past the held slot's start, and
    zeros — a dropped page below the cut with a zero in one new line, a page of new lines
    dropped by a second cut before the agent started, or the held slot's first line's place
    zeroed over new lines. Zeros alone would say the lines before them were read: with no
    record after them where the file holds it as read, they prove nothing, and reading goes
    again from the anchor — every new line the zeros left arrives (taken for read on the
    word of the zeros alone, 23, 10 and 23 new lines were skipped silently)."""
    kafka, agent, log_file = _one_read_over_slots(tmp_path)
    [held] = agent.pool.sealed()
    [(_sid, first, _end)] = held.meta.positions
    agent.abandon()
    width, cut = len(lines(0, 1)), len(lines(0, 430))
    new = lines(1000, 1100).split(b"\n")[:-1]
    holes = []
    if zeros == "a_page_below_and_a_new_line_holding_one":
        new[25] = new[25][:10] + b"\0" + new[25][11:]
        holes = [(len(lines(0, 410)) + 7, len(lines(0, 413)) + 20)]
    elif zeros == "a_later_cut_among_the_new_lines":
        holes = [(cut + 10 * width + 7, cut + 13 * width + 20)]
    else:
        holes = [(first, first + 2 * width + 5)]
    assert cut < first < cut + len(new) * width
    _cut_back_and_written_on(log_file, 430, b"".join(v + b"\n" for v in new))
    with open(log_file, "r+b") as f:
        for a, b in holes:
            f.seek(a)
            f.write(b"\0" * (b - a))
    left = [v for k, v in enumerate(new)
            if not any(a < cut + (k + 1) * width and cut + k * width < b for a, b in holes)]
    again, agent = _started_again(tmp_path, 20)
    try:
        delivered = set(kafka.values() + again.values())
        missing = [v for v in left if v not in delivered]
        assert not missing, f"{len(missing)} new line(s) never delivered, first {missing[:2]}"
    finally:
        agent.abandon()


def test_a_line_repeated_in_its_place_after_two_cuts_proves_nothing(tmp_path):
    """A review's case for the rule above: a log of one line written again and again
    (``GET /health``, all of one width) with now and then another. One read of 100 lines
    fills several slots, the last held; a first cut takes the log back inside the freed
    slots' stretch, and new lines follow — the same line, and one other among them —; a second
    cut, before the agent starts, drops a page of them below the held slot. The line at the
    held slot's start is then the same as the one the pool read there, in its place, though
    written after the first cut: one line repeated proves nothing (taken for proof, the
    other new line before the zeros was skipped silently). A stretch held as read proves the
    file was not cut back below it only when it holds two different lines."""
    kafka, agent, log_file = _four_batches_read(tmp_path)
    width = len(lines(0, 1))
    same = b"GET /health 200".ljust(width - 1, b".")
    last = b"id-000000499".ljust(width - 1, b"!")
    kafka.script(last, HOLD)
    with open(log_file, "ab") as f:
        f.write((same + b"\n") * 99 + last + b"\n")
    for _ in range(8):
        agent.clock.advance(0.3)
        agent.turn()
    [held] = agent.pool.sealed()
    [(_sid, first, _end)] = held.meta.positions
    agent.abandon()
    cut = len(lines(0, 410))
    other = b"id-000001000 another line".ljust(width - 1, b"~")
    assert first - cut > 10 * width and (first - cut) % width == 0
    with open(log_file, "r+b") as f:
        f.truncate(cut)                                            # the first cut
    with open(log_file, "ab") as f:
        f.write((same + b"\n") * 2 + other + b"\n" + (same + b"\n") * 60)
    with open(log_file, "r+b") as f:                               # the second
        f.seek(cut + 5 * width + 3)
        f.write(b"\0" * (4 * width))
    again, agent = _started_again(tmp_path, 20)
    try:
        assert other in again.values(), "a line written after the first cut never delivered"
    finally:
        agent.abandon()


def test_bytes_seen_and_never_read_before_a_cut_back_are_journaled_with_their_range(tmp_path):
    delivered, entries, _ = _cut_back_run(tmp_path, seen_beyond=6000)
    end = len(lines(0, 400))
    assert [(e["reason"], e["bytes"], e["range"], e["open_ended"]) for e in entries] == \
        [("cut_back_unread", 6000, [end, end + 6000], True)]
    assert all(v in delivered for v in lines(1000, 1300).split(b"\n")[:-1])


def test_a_slot_is_marked_free_only_after_its_acknowledged_offset_is_durable(tmp_path,
                                                                             monkeypatch):
    """With ``sync_on_seal`` (the default) the state database commits without syncing
    (``synchronous = NORMAL``); a slot's header marked free could reach the disk before the
    acknowledged offset did, and a power loss would then leave bytes neither acknowledged nor
    in the pool (read again as new records). Every free must come after the write-ahead log
    was synced, and that after the acknowledged offset it carries was committed."""
    events: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (
        events.append("sync") if os.readlink(f"/proc/self/fd/{fd}").endswith("-wal") else None,
        real_fsync(fd))[1])

    class Ops(FileOps):
        def crash_point(self, name):
            if name == "free:before_state":
                events.append("free")
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka, sync_on_seal=True, pool_ops=Ops())
    logs = tmp_path / "logs"
    advance_acked = agent.db.advance_acked
    monkeypatch.setattr(agent.db, "advance_acked",
                        lambda positions: (events.append("acked"), advance_acked(positions)))
    try:
        for k in range(6):
            with open(logs / "app.log", "ab") as f:
                f.write(lines(k * 50, k * 50 + 50))
            for _ in range(4):
                agent.clock.advance(0.1)
                agent.turn()
        assert len(kafka.values()) == 300
        assert events.count("free") >= 6
        for i, e in enumerate(events):
            if e == "free":
                last_acked = max(j for j in range(i) if events[j] == "acked")
                assert "sync" in events[last_acked:i], events[:i + 1]
    finally:
        agent.abandon()


def test_a_slot_whose_free_was_lost_is_not_journalled_as_lost(tmp_path):
    """A slot acknowledged and freed, then filling again, when the power goes: the disk may
    still hold its old sealed header (the free's byte never written back) beside new bytes.
    Its payload fails its CRC at the next start; its records were acknowledged (its positions
    are within the acknowledged offsets): freed, not quarantined and journalled as a loss."""
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    headers = {}
    agent.pool._on_seal = lambda slot, seal=agent.pool._on_seal: (
        headers.setdefault(slot.index, agent.pool._hdr_bytes[slot.index].copy()), seal(slot))
    (tmp_path / "logs" / "app.log").write_bytes(lines(0, 100))
    for _ in range(10):
        agent.clock.advance(0.3)
        agent.turn()
    assert len(kafka.values()) == 100 and agent.pool.stats()["sealed_slots"] == 0
    reused = agent.pool._free[-1]                  # the next slot to fill: freed last
    assert reused in headers
    agent.pool.append("t", Chunk.from_lines(lines(5000, 5010), 1), source=None)
    at = agent.pool.geometry.slot_headers_offset + reused * L.SLOT_HEADER_BYTES
    agent.abandon()                                # the power cut: the free's byte is lost
    with open(tmp_path / "state" / "buffer.pool", "r+b") as f:
        f.seek(at)
        f.write(headers[reused].tobytes())

    again, agent = _started_again(tmp_path, 10)
    assert agent.pool.counters["stale_freed"] == 1
    assert agent.pool.counters["slots_quarantined"] == 0
    journal = tmp_path / "state" / "loss-journal.jsonl"
    assert not journal.exists() or journal.read_text() == "", "nothing was lost"
    assert again.values() == []                    # nothing to send again
    agent.abandon()


def test_the_tail_a_slot_read_is_matched_by_its_records_in_order():
    from agent.tail.anchors import tail_read

    records = [b"alpha one", b"beta two", b"gamma three", b"other file's line"]
    assert tail_read(b"one\nbeta two\ngamma three\n", records)
    assert tail_read(b"a two\ngamma three\n", records)                # a line in part
    assert not tail_read(b"one\nbeta TWO\ngamma three\n", records)    # other content
    assert not tail_read(b"gamma three\nbeta two\n", records)         # out of order
    assert tail_read(b"beta two\ngamma three", records)               # a partial line flushed
    assert tail_read(b"alpha one\n", [b"alpha one"])                  # the slot's first record
    assert not tail_read(b"xxxx\nalpha one\n", [b"alpha one"])        # bytes it never read
    assert tail_read(b"two lines\nof an event\n", [b"two lines\nof an event"])   # multiline
    assert not tail_read(b"new line 1000\n", records)
    assert tail_read(b"one\nbeta two\ngamma three\n",                 # another source's
                     [b"alpha one", b"elsewhere", b"beta two", b"too", b"gamma three"])
    assert not tail_read(b"alpha one\nbeta two\n", [b"beta two", b"alpha one"])
    alike = [b"x"] * 100_000
    assert tail_read(b"x\n" * 2048, alike)
    assert not tail_read(b"y\n" + b"x\n" * 2047, alike)


def _past_the_database(tmp_path, extra: bytes | list[bytes], hold: bytes,
                       cut_to: int | None = None, new: bytes = b"",
                       hole: tuple[int, int] | None = None, blocks: list | None = None
                       ) -> tuple[FakeKafka, FakeKafka, Agent]:
    """Four batches read and acknowledged, the state database saved (its last durable
    commit); ``extra`` written and read (a list: each part read in a turn of its own, within
    the linger, so that a slot holds a block per part), its record ``hold`` held so that its
    slot stays in the pool; the agent killed and the saved database put back (the pool read
    past what it kept); the log cut to ``cut_to`` bytes and ``new`` appended, if given, with
    zeros from ``hole``'s start to its end (a page the cut dropped below one it kept); a new
    start. ``blocks``, if given, gets the ids of each block of each slot the pool holds at
    the cut. Returns (the first Kafka, the second, the second agent)."""
    kafka, agent, log_file = _four_batches_read(tmp_path)
    saved = tmp_path / "durable"
    keep_state_db(tmp_path / "state", saved)
    kafka.script(hold, HOLD)
    for part in [extra] if isinstance(extra, bytes) else extra:
        with open(log_file, "ab") as f:
            f.write(part)
        agent.clock.advance(0.001)
        agent.turn()
    for _ in range(8):
        agent.clock.advance(0.3)
        agent.turn()
    assert agent.pool.sealed(), "the held record's slot waits for Kafka"
    if blocks is not None:
        blocks.extend([[id_of(bytes(b.value(i))) for i in range(len(b))] for b in s.blocks()]
                      for s in agent.pool.sealed())
    agent.abandon()
    put_back_state_db(tmp_path / "state", saved)
    if cut_to is not None:
        with open(log_file, "r+b") as f:
            f.truncate(cut_to)
            if hole is not None:
                f.seek(hole[0])
                f.write(b"\0" * (hole[1] - hole[0]))
        with open(log_file, "ab") as f:
            f.write(new)
    again, agent = _started_again(tmp_path, 30)
    return kafka, again, agent


def test_lines_a_power_cut_kept_after_a_hole_are_not_read_again(tmp_path):
    """A cut that dropped a page of the log and kept a later one (the power-cut file system's
    finding): zeros where lines 460-464 were, lines 465-479 as they were, the rest gone, and
    new lines written on from there. Reading goes again from below the hole — the zeros
    become a record of their own (``hole_ended``) where the first kept line begins — but
    passes lines 465-479: the pool holds them as the file does (their slots wait for Kafka
    behind the held line 450), so they arrive once, under their numbers (before, they were
    read again under new ones: duplicates no tier can tell from new events). Every new line
    arrives; the first new one, where line 480 was, is not taken for a kept line."""
    hole = (len(lines(0, 460)), len(lines(0, 465)))
    kafka, again, agent = _past_the_database(
        tmp_path, lines(400, 500), lines(450, 451)[:-1], cut_to=len(lines(0, 480)),
        new=lines(1000, 1100), hole=hole)
    try:
        second = again.values()
        delivered = kafka.values() + second
        new = lines(1000, 1100).split(b"\n")[:-1]
        missing = [v for v in new if v not in delivered]
        assert not missing, f"{len(missing)} new line(s) never delivered, first {missing[:2]}"
        kept = lines(465, 480).split(b"\n")[:-1]
        assert [second.count(v) for v in kept] == [1] * len(kept), \
            "lines the cut kept after the hole were read again"
        assert [v for v in second if b"\0" in v] == [b"\0" * (hole[1] - hole[0])]
        assert agent.metrics.get("agent_source_bad_input_total", kind="hole_ended",
                                 topic="t") == 1
        assert agent.metrics.get("agent_source_rotations_total", kind="cut_back",
                                 topic="t") == 1
        assert all(v in (lines(0, 500) + lines(1000, 1100)).split(b"\n")
                   for v in second if b"\0" not in v), "a fragment of a line was delivered"
    finally:
        agent.abandon()


@pytest.mark.parametrize("end", [b"\n", b"\r\n"])
def test_lines_a_power_cut_kept_after_a_hole_over_a_blocks_last_line_are_not_read_again(
        tmp_path, end):
    """The 10-cut power test's finding (a slot sent while it fills holds a block per
    hand-over): lines 400-499 read ten at a time into slots of several blocks each, the cut's
    hole over lines 438-441 — the last lines of one block and the first of the next, inside
    one slot — and lines 442-479 kept after it. The kept lines are the pool's, past the block
    whose last line the file no longer holds: they arrive once (before, the rest of the slot
    was left out at that block's end and lines 442-459 were read again under new numbers).
    The same for lines ended by a CR and a newline: the guessed line end is the one seen."""
    def ended(a: int, b: int) -> bytes:
        return lines(a, b).replace(b"\n", end)

    hole = (len(lines(0, 400) + ended(400, 438)), len(lines(0, 400) + ended(400, 442)))
    parts = [ended(k, k + 10) for k in range(400, 500, 10)]
    slots: list[list[list[int]]] = []
    kafka, again, agent = _past_the_database(
        tmp_path, parts, lines(400, 401)[:-1], cut_to=len(lines(0, 400) + ended(400, 480)),
        new=lines(1000, 1100), hole=hole, blocks=slots)
    try:
        assert any(ids[-1] in range(438, 442) for blocks in slots for ids in blocks[:-1]), \
            f"no block but a slot's last ends inside the hole: {slots}"
        second = again.values()
        delivered = kafka.values() + second
        missing = [v for v in lines(1000, 1100).split(b"\n")[:-1] if v not in delivered]
        assert not missing, f"{len(missing)} new line(s) never delivered, first {missing[:2]}"
        kept = lines(442, 480).split(b"\n")[:-1]
        assert [second.count(v) for v in kept] == [1] * len(kept), \
            "lines the cut kept after the hole were read again"
    finally:
        agent.abandon()


def _numbered(*kafkas: FakeKafka) -> dict[bytes, set[bytes]]:
    """Each value the ``kafkas`` hold, with the record numbers it came under."""
    numbers: dict[bytes, set[bytes]] = {}
    for kafka in kafkas:
        for _t, value, _k, _ts, headers in kafka.log:
            numbers.setdefault(value, set()).add(dict(headers)[SEQ_HEADER])
    return numbers


def test_a_file_started_at_its_end_is_never_read_again_from_its_start_after_a_power_cut(
        tmp_path):
    """``read_from = "end"`` at the first start: the 100 lines the log held are left out. A
    power cut then took every commit after the start's (the first seal's anchors with them)
    while the pool kept the slots of the lines read since (waiting for Kafka), and the log's
    unsynced tail with it (cut to 150 lines, new ones written from there). With no anchor
    kept, the file's start stood for one: the pool's first slot begins past it, so reading
    went again from byte 0 — the lines read_from had left out shipped. The start is an anchor
    now: the slots are checked from there, and only new lines are read."""
    kafka = FakeKafka()
    log_file = tmp_path / "logs" / "app.log"
    log_file.parent.mkdir()
    log_file.write_bytes(lines(0, 100))
    agent = agent_on(tmp_path, kafka, source={"read_from": "end"})
    [row] = agent.db.all_files()
    assert row["sealed_offset"] == len(lines(0, 100))
    saved = tmp_path / "durable"
    keep_state_db(tmp_path / "state", saved)         # the start's commit, none after it
    kafka.script(lines(100, 101)[:-1], HOLD)         # the slots stay in the pool
    _read_then_power_cut(agent, log_file, lines(100, 200), saved, 10)
    _cut_back_and_written_on(log_file, 150, lines(1000, 1100))
    again, agent = _started_again(tmp_path, 20)
    try:
        numbers = _numbered(kafka, again)
        left_out = sorted(id_of(v) for v in numbers if id_of(v) < 100)
        assert left_out == [], f"{len(left_out)} line(s) from before the start shipped"
        wanted = (lines(100, 150) + lines(1000, 1100)).split(b"\n")[:-1]
        missing = [v for v in wanted if v not in numbers]
        assert not missing, f"{len(missing)} line(s) never delivered, first {missing[:2]}"
        renumbered = sorted(id_of(v) for v, n in numbers.items() if len(n) > 1)
        assert renumbered == [], f"{len(renumbered)} line(s) sent again under new numbers"
    finally:
        agent.abandon()


@pytest.mark.parametrize("cut_to", [None, 130, "hole"])
@pytest.mark.parametrize("row", ["pending", "none"])
def test_a_new_file_read_before_its_start_was_durable_resumes_from_the_pool(tmp_path, cut_to,
                                                                          row):
    """The power-cut tests' findings: a new log, found empty (its row waits in the state
    database as pending: perhaps a copy being written), then written, started and read; a
    power cut took the state database's commits since the row was added (``pending``; they
    are synced at most every 0.2 s) or since before the file was found (``none``: the row
    itself is gone), while the pool kept the slots of the file's lines (synced at their
    seal), waiting for Kafka. At the next start the file was taken for new: read from its
    first byte, every line already sent went again under a new number (4,475 lines in one of
    10 cuts; 8,499 in one of 200). It resumes where the pool's slots read to, as any file
    whose checkpoint is older than the pool — a file with no row takes the id its slots name,
    which no other new file is given —; and where the same cut took the log's unsynced tail
    too (``cut_to`` lines kept, new lines written from there), the pool's slots are checked
    against the file first, with its start for the anchor: no new line is skipped. With a
    ``hole`` (the cut dropped the file's first page and kept lines 5-129 after it, the rest
    gone, new lines written on) the kept lines are the slots' too: passed, not read again."""
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    log_file = tmp_path / "logs" / "app.log"
    saved = tmp_path / "durable"
    if row == "none":
        keep_state_db(tmp_path / "state", saved)      # what the last log sync made
    log_file.write_bytes(b"")
    for _ in range(2):
        agent.clock.advance(0.3)
        agent.turn()
    [found] = agent.db.all_files()
    assert found["state"] == "pending", found
    if row == "pending":
        keep_state_db(tmp_path / "state", saved)
    kafka.script(lines(0, 1)[:-1], HOLD)              # the slots stay in the pool
    log_file.write_bytes(lines(0, 200))
    for _ in range(10):
        agent.clock.advance(0.3)
        agent.turn()
    assert agent.pool.sealed(), "the held line's slot waits for Kafka"
    assert agent.db.all_files()[0]["state"] == "active"
    agent.abandon()                                   # the power cut
    put_back_state_db(tmp_path / "state", saved)
    new = lines(1000, 1100) if cut_to is not None else b""
    if cut_to is not None:
        _cut_back_and_written_on(log_file, 130, new)
    if cut_to == "hole":
        with open(log_file, "r+b") as f:
            f.write(b"\0" * len(lines(0, 5)))
    again, agent = _started_again(tmp_path, 20)
    try:
        numbers = _numbered(kafka, again)
        renumbered = sorted(id_of(v) for v, n in numbers.items() if len(n) > 1)
        kept = lines(0, 200 if cut_to is None else 130)
        missing = [v for v in (kept + new).split(b"\n")[:-1] if v not in numbers]
        assert not missing, f"{len(missing)} line(s) never delivered, first {missing[:2]}"
        assert renumbered == [], f"{len(renumbered)} line(s) sent again under new numbers"
        [now] = agent.db.all_files()
        assert now["source_id"] == found["source_id"], "the slots' id is the file's"
        (next_id,) = agent.db.conn.execute("SELECT next_source_id FROM identity").fetchone()
        assert next_id > found["source_id"], "a new file would take the slots' id"
    finally:
        agent.abandon()


class _Lines:
    """A block of ``n`` lines of ``size`` bytes each, newline included (``_own_blocks``)."""

    part_count = 0

    def __init__(self, n: int, size: int = 60):
        self.offsets = np.arange(n, dtype=np.uint32) * size
        self.lengths = np.full(n, size - 1, dtype=np.uint32)

    def __len__(self) -> int:
        return len(self.lengths)


class _Shared:
    def __init__(self, blocks: list, positions: tuple):
        self._blocks, self.meta = blocks, type("Meta", (), {"positions": positions})()

    def blocks(self):
        return iter(self._blocks)


def test_a_shared_slot_s_blocks_of_a_file_are_its_first_or_last_as_it_wrote_first_or_last():
    """Each block is one read of one file: of a slot holding two files' lines, a file's
    blocks are the first ones when it wrote to the slot first, the last ones when last — also
    when the other file's first blocks span as many bytes as its part (a review's finding:
    the first blocks were tried for both files, and the new log was compared with the old
    one's lines); none for a file between two others, or when no run of blocks spans its
    part."""
    old, new = [_Lines(2), _Lines(3)], [_Lines(5)]         # 300 bytes each
    slot = _Shared(old + new, ((1, 1000, 1300), (2, 0, 300)))
    assert files._own_blocks(slot, 1, 1000, 1300) == old
    assert files._own_blocks(slot, 2, 0, 300) == new
    assert files._own_blocks(_Shared(new, ((2, 0, 300),)), 2, 0, 300) == new
    three = _Shared(old + new + [_Lines(1)], ((1, 1000, 1300), (2, 0, 300), (3, 0, 60)))
    assert files._own_blocks(three, 2, 0, 300) is None
    assert files._own_blocks(three, 3, 0, 60)[0] is three._blocks[-1]
    assert files._own_blocks(_Shared(old + new, ((1, 1000, 1290), (2, 0, 300))),
                             1, 1000, 1290) is None


@pytest.mark.parametrize("cut", ["tail", "inside", "hole"])
@pytest.mark.parametrize("row", ["kept", "none"])
def test_a_new_log_whose_first_slot_holds_the_rotated_ones_last_lines_resumes_from_the_pool(
        tmp_path, row, cut):
    """The 200-cut power test's findings: a rotation inside one slot (a slot sent while it
    fills takes every file's lines until it is sealed) — the old log's last lines, then the
    new log's first — and a power cut that took the new log's tail (lines 160-199 gone, new
    lines written from there) with the state database's commits since the rotation
    (``none``: the new log's row too) or since just after it (``kept``: its row, no anchor).
    The new log's part of the slot is passed, its lines the file holds whole; reading goes
    again from the first line the file no longer holds as read (before: from the new log's
    first byte, every line in between under a new number — 4,778 and 8,240 lines in one
    200-cut run). A file with no row takes the slots' id when that slot holds its first
    lines. ``inside``: the cut left only lines 100-119, inside that slot's part, and the
    agent starts before anything more is written: the part is not taken for held (the file
    holds all it has of it, but not all of it) — resuming past it skipped the lines written
    after the start silently (a review's finding). ``hole``: the cut dropped the page of lines
    120-124 and kept lines 125-159 after it: reading goes again from line 120, and the kept
    lines of that slot's part are passed as well (its blocks that read the new log are its
    last ones: each block is one read of one file). Before, a slot holding two files' lines
    was left out there, and its lines read again under new numbers (4,254 lines in one
    200-cut run)."""
    inside = cut == "inside"
    kafka = FakeKafka()
    agent = agent_on(tmp_path, kafka)
    logs = tmp_path / "logs"
    log_file = logs / "app.log"
    kafka.script(lines(0, 1)[:-1], HOLD)              # every slot stays in the pool
    log_file.write_bytes(lines(0, 20))
    for _ in range(3):
        agent.clock.advance(0.3)
        agent.turn()
    saved = tmp_path / "durable"
    if row == "none":
        keep_state_db(tmp_path / "state", saved)
    with open(log_file, "ab") as f:
        f.write(lines(20, 25))
    agent.clock.advance(0.001)
    agent.turn()                                      # lines 20-24 in a slot filling
    log_file.rename(logs / "app.log.1")
    (logs / "app.log").write_bytes(lines(100, 130))
    agent.clock.advance(0.001)
    for source in agent.file_sources:
        source.scan()                                 # found within the linger
    agent.turn()                                      # the new log's first lines beside them
    if row == "kept":
        keep_state_db(tmp_path / "state", saved)
    for k in range(130, 200, 10):
        with open(log_file, "ab") as f:
            f.write(lines(k, k + 10))
        agent.clock.advance(0.3)
        agent.turn()
    for _ in range(3):
        agent.clock.advance(0.3)
        agent.turn()
    shared = [s for s in agent.pool.sealed() if len(s.meta.positions) == 2]
    assert any(b"id-000000100" in bytes(v) for s in shared for _t, _k, v in s.records()), \
        "no slot holds the old log's last lines and the new log's first"
    new_id = max(r["source_id"] for r in agent.db.all_files())       # the new log's
    agent.abandon()                                   # the power cut
    put_back_state_db(tmp_path / "state", saved)
    _cut_back_and_written_on(log_file, 0, b"")
    kept = lines(100, 120 if inside else 160)
    log_file.write_bytes(kept if inside else kept + lines(1000, 1050))
    if cut == "hole":
        with open(log_file, "r+b") as f:
            f.seek(len(lines(100, 120)))
            f.write(b"\0" * len(lines(120, 125)))      # the dropped page: zeros
    again, agent = _started_again(tmp_path, 20)
    if inside:
        with open(log_file, "ab") as f:
            f.write(lines(1000, 1050))                # written on once the agent runs
        for _ in range(10):
            agent.clock.advance(0.3)
            agent.turn()
    try:
        numbers = _numbered(kafka, again)
        want = (lines(0, 25) + kept + lines(1000, 1050)).split(b"\n")[:-1]
        if cut == "hole":
            assert [v for v in numbers if v.startswith(b"\0")], "the zeros: a record"
        missing = [v for v in want if v not in numbers]
        assert not missing, f"{len(missing)} line(s) never delivered, first {missing[:2]}"
        renumbered = sorted(id_of(v) for v, n in numbers.items() if len(n) > 1)
        if inside:          # read again from the new log's start: its twenty lines, at most
            assert set(renumbered) <= set(range(100, 120)), renumbered
            return
        assert renumbered == [], f"{len(renumbered)} line(s) sent again under new numbers"
        ino = os.stat(log_file).st_ino
        assert [r["source_id"] for r in agent.db.all_files() if r["ino"] == ino] == [new_id]
    finally:
        agent.abandon()


def test_lines_written_after_a_cut_that_repeat_old_ones_in_place_are_read(tmp_path):
    """As above, but the cut kept lines 465-469 only, and the application wrote on from
    there a line of its own, then lines 471-479 again, byte for byte where they were: after
    the other content without zeros the file holds what was written since the cut, and the
    repeated lines are new events — read, not passed for the pool's."""
    hole = (len(lines(0, 460)), len(lines(0, 465)))
    written = lines(2000, 2001) + lines(471, 480) + lines(1000, 1010)
    kafka, again, agent = _past_the_database(
        tmp_path, lines(400, 500), lines(450, 451)[:-1], cut_to=len(lines(0, 470)),
        new=written, hole=hole)
    try:
        second = again.values()
        assert [second.count(v) for v in lines(465, 470).split(b"\n")[:-1]] == [1] * 5
        assert [second.count(v) for v in lines(471, 480).split(b"\n")[:-1]] == [2] * 9, \
            "lines written after the cut were taken for the pool's"
        assert all(second.count(v) == 1 for v in lines(1000, 1010).split(b"\n")[:-1])
    finally:
        agent.abandon()


def test_a_crlf_log_the_pool_read_past_the_database_is_not_taken_for_cut_back(tmp_path):
    """Records end before a CR before their LF: the bytes a recovered slot read are matched
    with that in mind. Before, every CRLF log with a slot past the newest anchor after a
    crash was taken for cut back: read again from the anchor, a false `cut_back_unread`."""
    extra = lines(400, 500).replace(b"\n", b"\r\n")
    kafka, again, agent = _past_the_database(tmp_path, extra, lines(450, 451)[:-1])
    try:
        assert agent.metrics.get("agent_source_rotations_total", kind="cut_back",
                                 topic="t") == 0
        second = again.values()
        assert all(second.count(v) == 1 for v in lines(400, 500).split(b"\n")[:-1])
        assert agent.journal.entries() == []
    finally:
        agent.abandon()


def test_a_long_line_in_parts_past_the_database_and_a_cut_back_start_the_agent(tmp_path):
    """A line split into three or more parts leaves slots at one position alike ((L, L)):
    ordering them must not compare the slots themselves (a TypeError at every start, before).
    The line before it is held, so the parts' slots stay in the pool (a file's slots are freed
    in order). The cut falls inside the long line: the first new line is glued to what is left
    of it (as the file holds them); every other new line is delivered."""
    long_line = b"L" * (3 * SLOT) + b"\n"
    extra = lines(400, 401) + long_line + lines(401, 420)
    base = len(lines(0, 401))
    new = lines(1000, 1100)
    kafka, again, agent = _past_the_database(tmp_path, extra, lines(400, 401)[:-1],
                                             cut_to=base + SLOT, new=new)
    try:
        delivered = kafka.values() + again.values()
        assert all(v in delivered for v in new.split(b"\n")[1:-1])
        assert agent.metrics.get("agent_source_rotations_total", kind="cut_back",
                                 topic="t") == 1
    finally:
        agent.abandon()
