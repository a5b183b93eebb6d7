"""The file source on real files in a temp folder, with a real pool and state database:
rotation both ways, copies, restarts, deletions and partial lines. No Kafka: what reaches the
pool is what would be sent."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from agent.buffer import BufferPool
from agent.config import SourceConfig
from agent.journal import LossJournal
from agent.state import StateDB
from agent.tail import files as files_mod
from agent.tail.files import FileSource
from agent.telemetry import Metrics


def line(i: int) -> bytes:
    return (b"id-%09d " % i).ljust(59, b"x") + b"\n"


def lines(a: int, b: int) -> bytes:
    return b"".join(line(i) for i in range(a, b))


class Harness:
    def __init__(self, tmp, pattern="app.log*", **cfg):
        self.tmp = tmp
        self.logs = tmp / "logs"
        self.logs.mkdir(exist_ok=True)
        self.cfg = SourceConfig(index=0, type="file", topic="t",
                                paths=[str(self.logs / pattern)], **cfg)
        self.open()

    def open(self):
        self.metrics = Metrics()
        self.pool = BufferPool(self.tmp / "pool", 64 << 20, 1 << 20, linger_ms=1e9,
                               sync_on_seal=False)
        self.db = StateDB(self.tmp / "state.db")
        self.journal = LossJournal(self.tmp / "journal.jsonl", self.metrics)
        recovered = self.pool.recovered_positions()
        self.db.advance_sealed(recovered)
        self.src = FileSource(self.cfg, self.pool, self.db, self.journal, self.metrics,
                              recovered)

    def step(self, times: int = 2):
        for _ in range(times):
            self.src.scan()
            self.src.read_some(64 << 20)

    def ids(self) -> list[int]:
        self.pool.seal_all()
        out = [int(v[3:12]) for s in self.pool.sealed() for _, _, v in s.records()]
        # Checkpoint what is sealed, as the agent loop does.
        ends = {}
        for s in self.pool.sealed():
            for src, _a, e in s.meta.positions:
                ends[src] = max(e, ends.get(src, 0))
        self.db.advance_sealed(ends)
        return out

    def restart(self):
        self.src.close()
        self.pool.close()
        self.db.close()
        self.journal.close()
        self.open()

    def start_again(self):
        """After the source and the pool were closed or dropped, as a stopped agent leaves them."""
        self.db.close()
        self.journal.close()
        self.open()

    def drain_all(self):
        for s in self.pool.sealed():
            self.pool.free(s)


def test_rename_rotation_reads_the_old_file_to_its_end_then_the_new_one(tmp_path):
    h = Harness(tmp_path, pattern="app.log")           # the rotated name does not match
    app = h.logs / "app.log"
    app.write_bytes(lines(0, 100))
    h.step()
    with open(app, "ab") as f:
        f.write(lines(100, 150))                        # written, then rotated before a read
    os.rename(app, h.logs / "app.log.1")
    app.write_bytes(lines(150, 200))
    h.step(3)
    assert h.ids() == list(range(200))


def test_copytruncate_with_the_copy_in_the_glob_sends_each_line_once(tmp_path):
    h = Harness(tmp_path)
    app = h.logs / "app.log"
    app.write_bytes(lines(0, 100))
    h.step()
    with open(app, "ab") as f:
        f.write(lines(100, 130))                        # not read yet when the copy is made
    shutil.copyfile(app, h.logs / "app.log.1")
    os.truncate(app, 0)
    with open(app, "ab") as f:
        f.write(lines(130, 400))                        # regrows past the old offset
    h.step(3)
    assert sorted(h.ids()) == list(range(400))
    assert h.metrics.get("agent_source_rotations_total", kind="copytruncate_copy",
                         topic="t") == 1
    assert h.journal.entries() == []


def test_copytruncate_without_a_copy_journals_the_unread_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(files_mod, "COPY_GRACE_S", 0.0)
    h = Harness(tmp_path, pattern="app.log")
    app = h.logs / "app.log"
    app.write_bytes(lines(0, 100))
    h.step()
    with open(app, "ab") as f:
        f.write(lines(100, 130))
    h.src.scan()                                         # sees the growth, does not read it
    os.truncate(app, 0)
    app.write_bytes(lines(130, 140))
    h.step(3)
    assert h.ids() == list(range(100)) + list(range(130, 140))
    [entry] = h.journal.entries()
    assert entry["reason"] == "unaccounted_bytes" and entry["bytes"] == 30 * 60
    assert entry["range"] == [100 * 60, 130 * 60]


def test_a_restart_resumes_after_the_sealed_data_without_duplicates(tmp_path):
    h = Harness(tmp_path)
    app = h.logs / "app.log"
    app.write_bytes(lines(0, 100))
    h.step()
    first = h.ids()
    h.drain_all()                                        # acknowledged and freed
    with open(app, "ab") as f:
        f.write(lines(100, 150))
    h.restart()
    h.step()
    assert first + h.ids() == list(range(150))


def test_a_restart_rereads_what_was_only_in_a_filling_slot(tmp_path):
    h = Harness(tmp_path)
    app = h.logs / "app.log"
    app.write_bytes(lines(0, 50))
    h.step()
    h.ids()                                              # sealed 0..49
    with open(app, "ab") as f:
        f.write(lines(50, 80))
    h.step()                                             # 50..79 only in a filling slot
    h.src.close()
    del h.pool                                           # killed: nothing sealed or closed
    h.start_again()
    h.step()
    assert h.ids() == list(range(80))


def test_a_file_deleted_with_unread_bytes_while_stopped_is_journaled(tmp_path):
    h = Harness(tmp_path)
    app = h.logs / "app.log"
    app.write_bytes(lines(0, 10))
    h.step()
    h.ids()
    with open(app, "ab") as f:
        f.write(lines(10, 20))
    h.src.scan()                                         # saw 20 lines' size, read 10
    h.restart()
    app.unlink()
    h.step()
    [entry] = h.journal.entries()
    assert entry["reason"] == "deleted_unread" and entry["bytes"] == 10 * 60


def test_a_partial_last_line_waits_for_its_newline(tmp_path):
    h = Harness(tmp_path)
    app = h.logs / "app.log"
    app.write_bytes(lines(0, 3) + b"id-000000003 half")
    h.step()
    assert h.ids() == [0, 1, 2]
    with open(app, "ab") as f:
        f.write(b" and the rest\n")
    h.step()
    assert h.ids() == [0, 1, 2, 3]


def test_a_partial_line_is_flushed_after_partial_flush_ms(tmp_path):
    h = Harness(tmp_path, partial_flush_ms=1)
    app = h.logs / "app.log"
    app.write_bytes(b"id-000000000 no newline ever, not even at the end")
    h.step()
    assert h.ids() == []                                 # the first look only notes it
    time.sleep(0.01)
    h.step()
    assert h.ids() == [0]
    assert h.metrics.get("agent_source_bad_input_total", kind="partial_line_flushed",
                         topic="t") == 1


@pytest.mark.parametrize("name", ["current.log"])
def test_a_symlinked_path_is_followed_to_its_target(tmp_path, name):
    h = Harness(tmp_path, pattern=name)
    target = tmp_path / "real.log"
    target.write_bytes(lines(0, 5))
    (h.logs / name).symlink_to(target)
    h.step()
    assert h.ids() == list(range(5))


def _read_100_lines_then_stop(tmp_path) -> tuple[Harness, object, list[int]]:
    """100 lines read, sealed and sent; the agent stopped; 20 more lines written meanwhile."""
    h = Harness(tmp_path)
    app = h.logs / "app.log"
    app.write_bytes(lines(0, 100))
    h.step()
    first = h.ids()
    h.drain_all()
    h.src.close()
    h.pool.close()
    with open(app, "ab") as f:
        f.write(lines(100, 120))
    return h, app, first


def test_a_copytruncate_while_the_agent_was_stopped_resumes_the_copy_where_reading_stopped(
        tmp_path):
    h, app, first = _read_100_lines_then_stop(tmp_path)
    shutil.copyfile(app, h.logs / "app.log.1")          # rotated while the agent was down
    os.truncate(app, 0)
    with open(app, "ab") as f:
        f.write(lines(120, 300))
    h.start_again()
    h.step()
    assert sorted(first + h.ids()) == list(range(300))
    assert h.journal.entries() == []


def test_a_copy_found_before_the_truncation_starts_after_the_sealed_data(tmp_path):
    h = Harness(tmp_path)
    app = h.logs / "app.log"
    app.write_bytes(lines(0, 100))
    h.step()                                             # read, in a filling slot
    shutil.copyfile(app, h.logs / "app.log.1")
    h.src.scan()                                         # the copy is seen first: seals
    assert [r for s in h.pool.sealed() for r in s.records()][-1][2].startswith(b"id-000000099")
    os.truncate(app, 0)
    app.write_bytes(lines(100, 150))
    h.step(3)
    assert sorted(h.ids()) == list(range(150))


def test_a_copy_found_while_still_being_written_is_not_taken_for_a_truncation(tmp_path):
    h = Harness(tmp_path)
    app = h.logs / "app.log"
    content = lines(0, 200)
    app.write_bytes(content)
    h.step()                                             # all 200 lines read
    copy = h.logs / "app.log.1"
    copy.write_bytes(content[:5000])                     # the copy, a fortieth written so far
    h.step()                                             # matched: starts at 200 lines' offset
    with open(copy, "ab") as f:
        f.write(content[5000:])
    os.truncate(app, 0)
    app.write_bytes(lines(200, 250))
    h.step(3)
    assert sorted(h.ids()) == list(range(250))
    assert h.metrics.get("agent_source_rotations_total", kind="truncated", topic="t") == 1


def test_a_copytruncate_then_a_rename_while_stopped_resumes_the_copy_where_reading_stopped(
        tmp_path):
    """While the agent was down, app.log was copied to app.log.1 and truncated, then renamed
    to app.log.2 and a new app.log begun. app.log.1 sorts before app.log.2, where the old inode
    now is: the copy must still start where reading of the old content stopped."""
    h, app, first = _read_100_lines_then_stop(tmp_path)
    shutil.copyfile(app, h.logs / "app.log.1")          # copytruncate ...
    os.truncate(app, 0)
    with open(app, "ab") as f:
        f.write(lines(120, 200))
    os.rename(app, h.logs / "app.log.2")                 # ... then rename-and-create
    app.write_bytes(lines(200, 250))
    h.start_again()
    h.step()
    assert sorted(first + h.ids()) == list(range(250))
    assert h.journal.entries() == []
