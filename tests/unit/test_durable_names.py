"""Names that survive a power loss (``agent/buffer/durable.py``): every file the agent makes in
its state folder (the pool, the state database, the loss journal, a dead-letter file) and every
folder it makes is followed by an ``fsync`` of the folder holding its name, and so is every
move (a damaged database or pool moved aside)."""

from __future__ import annotations

import os
from pathlib import Path

from confluent_kafka import KafkaError

from agent.drain.deadletter import write_dead_letter
from agent.service import Agent, Seams
from agent.state.folder import move_aside
from tests.unit.fakeproducer import FakeKafka
from tests.unit.tailkit import FakeClock
from tests.unit.test_native_path import config


def _folder_syncs(monkeypatch) -> list[tuple[Path, set[str]]]:
    """Each ``fsync`` of a folder from now on: the folder, and the names it held then."""
    seen: list[tuple[Path, set[str]]] = []
    real = os.fsync

    def fsync(fd):
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        if path.is_dir():
            seen.append((path, set(os.listdir(path))))
        return real(fd)
    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def _synced_with(seen, folder: Path, name: str) -> bool:
    return any(path == folder and name in names for path, names in seen)


def test_a_first_start_makes_its_folders_and_files_durable_by_name(tmp_path, monkeypatch):
    seen = _folder_syncs(monkeypatch)
    work = tmp_path / "host"
    work.mkdir()
    (work / "app.log").write_bytes(b"")
    cfg = config(work)                         # state folder host/state, made by the agent
    kafka = FakeKafka()
    agent = Agent(cfg, seams=Seams(clock=FakeClock(), file_events=False,
                                   producer_factory=kafka.producer))
    try:
        state = work / "state"
        assert _synced_with(seen, work, "state"), "the state folder made, by name"
        for name in ("buffer.pool", "state.db", "loss-journal.jsonl"):
            assert _synced_with(seen, state, name), f"{name}: never synced into its folder"
    finally:
        agent.abandon()


def test_a_file_moved_aside_stays_moved(tmp_path, monkeypatch):
    db = tmp_path / "state.db"
    db.write_bytes(b"not a database")
    seen = _folder_syncs(monkeypatch)
    target = move_aside(db, 1234)
    assert _synced_with(seen, tmp_path, target.name)
    assert not any("state.db" in names for _path, names in seen)


def test_a_dead_letter_file_made_is_synced_into_its_folder_once(tmp_path, monkeypatch):
    seen = _folder_syncs(monkeypatch)
    folder = tmp_path / "dead-letter"
    record = ("t", b"value", None, 0, [])
    for _ in range(3):
        write_dead_letter(folder, record, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), 7)
    assert _synced_with(seen, tmp_path, "dead-letter")
    made = [names for path, names in seen if path == folder]
    assert len(made) == 1 and made[0], "synced when the file was made, not at each append"
