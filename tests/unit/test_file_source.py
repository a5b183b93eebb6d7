"""The file source on real files in a temp folder, with a real pool and state database, a fake
clock and a scriptable file-system seam: rotation both ways, copies, restarts, deletions and
partial lines — and one test per interleaving that once lost or doubled lines. No Kafka: what
reaches the pool is what would be sent.

Each test states what was written and asserts, by id, what was read: every id exactly once,
unless the test says why some cannot be (and then the loss journal must say so)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time

import pytest

from agent.state.db import FINGERPRINT_BYTES, LOST, ORPHANED
from agent.state.selfcheck import first_gap
from agent.tail import files
from tests.unit.tailkit import LINE, Harness, lines


def test_rename_rotation_reads_the_old_file_to_its_end_then_the_new_one(tmp_path, caplog):
    h = Harness(tmp_path, pattern="app.log")           # the rotated name does not match
    h.write(0, 100)
    h.step()
    h.write(100, 150)                                   # written, then rotated before a read
    os.rename(h.app, h.logs / "app.log.1")
    h.write(150, 200)
    with caplog.at_level(logging.INFO, logger="docket.agent.files"):
        h.step(3)
    assert h.ids() == list(range(200))
    rotated = [r for r in caplog.records if "rotated" in r.getMessage()]
    assert [r.levelname for r in rotated] == ["INFO"]      # an operator sees rotations
    assert f"{h.app} (inode" in rotated[0].getMessage()


def test_copytruncate_with_the_copy_in_the_glob_sends_each_line_once(tmp_path):
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    h.write(100, 130)                                   # not read yet when the copy is made
    shutil.copyfile(h.app, h.logs / "app.log.1")
    os.truncate(h.app, 0)
    h.write(130, 400)                                   # regrows past the old offset
    h.step(3)
    assert sorted(h.ids()) == list(range(400))
    assert h.metrics.get("agent_source_rotations_total", kind="copytruncate_copy",
                         topic="t") == 1
    assert h.journal_entries() == []


def test_copytruncate_without_a_copy_journals_the_unread_bytes(tmp_path):
    h = Harness(tmp_path, pattern="app.log")
    h.write(0, 100)
    h.step()
    h.write(100, 130)
    h.src.scan()                                         # sees the growth, does not read it
    os.truncate(h.app, 0)
    h.write(130, 140)
    h.step(3)
    assert h.journal_entries() == []                     # a copy may still turn up
    h.past_grace()
    assert h.ids() == list(range(100)) + list(range(130, 140))
    [entry] = h.journal_entries()
    assert entry["reason"] == "unaccounted_bytes" and entry["bytes"] == 30 * LINE
    assert entry["range"] == [100 * LINE, 130 * LINE] and entry["events"] == -1
    assert entry["open_ended"]              # what came after its last look is unknown
    assert h.metrics.get("agent_loss_journal_entries_total", reason="unaccounted_bytes",
                         topic="t", size="unknown") == 1


def test_a_restart_resumes_after_the_sealed_data_without_duplicates(tmp_path):
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    h.drain_all()                                        # acknowledged and freed
    h.write(100, 150)
    h.restart()
    h.step()
    assert h.ids() == list(range(150))


def test_a_restart_rereads_what_was_only_in_a_filling_slot(tmp_path):
    h = Harness(tmp_path)
    h.write(0, 50)
    h.step()
    h.checkpoint()                                       # sealed 0..49
    h.write(50, 80)
    h.step()                                             # 50..79 only in a filling slot
    h.restart(crash=True)
    h.step()
    assert h.ids() == list(range(80))


def test_a_partial_last_line_waits_for_its_newline(tmp_path):
    h = Harness(tmp_path)
    h.app.write_bytes(lines(0, 3) + b"id-000000003 half")
    h.step()
    assert h.ids() == [0, 1, 2]
    with open(h.app, "ab") as f:
        f.write(b" and the rest\n")
    h.step()
    assert h.ids() == [0, 1, 2, 3]


def test_a_partial_line_is_flushed_after_partial_flush_ms(tmp_path):
    h = Harness(tmp_path, partial_flush_ms=10)
    h.app.write_bytes(b"id-000000000 no newline ever, not even at the end")
    h.step()
    assert h.ids() == []                                 # the first look only notes it
    h.step(1, advance_s=0.02)
    assert h.ids() == [0]
    assert h.metrics.get("agent_source_bad_input_total", kind="partial_line_flushed",
                         topic="t") == 1


def test_a_symlinked_path_is_followed_to_its_target(tmp_path):
    h = Harness(tmp_path, pattern="current.log")
    target = tmp_path / "real.log"
    target.write_bytes(lines(0, 5))
    (h.logs / "current.log").symlink_to(target)
    h.step()
    assert h.ids() == list(range(5))


def _read_100_lines_then_stop(tmp_path, pattern="app.log*") -> Harness:
    """100 lines read, sealed and sent; the agent stopped; 20 more lines written meanwhile."""
    h = Harness(tmp_path, pattern=pattern)
    h.write(0, 100)
    h.step()
    h.drain_all()
    h.stop()
    h.write(100, 120)
    return h


def test_a_copytruncate_while_the_agent_was_stopped_resumes_the_copy_where_reading_stopped(
        tmp_path):
    h = _read_100_lines_then_stop(tmp_path)
    shutil.copyfile(h.app, h.logs / "app.log.1")         # rotated while the agent was down
    os.truncate(h.app, 0)
    h.write(120, 300)
    h.open()
    h.step()
    h.past_grace()
    assert sorted(h.ids()) == list(range(300))
    assert h.journal_entries() == []


def test_a_copy_seen_before_the_truncation_is_held_and_continues_the_original(tmp_path):
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()                                             # read, in a filling slot
    h.write(100, 110)                                    # not read yet
    shutil.copyfile(h.app, h.logs / "app.log.1")
    h.src.scan()                                         # the copy is seen first: held
    assert h.src.waiting()["copies_held"] == [str(h.logs / "app.log.1")]
    os.truncate(h.app, 0)
    h.write(110, 150)
    h.step(3)
    assert sorted(h.ids()) == list(range(150))
    assert not h.src.pending and h.journal_entries() == []


def test_a_plain_copy_of_a_file_being_read_is_not_read_again(tmp_path):
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    shutil.copyfile(h.app, h.logs / "app.log.bak")       # a copy, and no truncation follows
    h.write(100, 120)
    h.step()
    h.past_grace()                                        # the copy is left as it is
    h.write(120, 130, path=h.logs / "app.log.bak")       # ... and later written to
    h.write(130, 140)
    h.step(3)
    assert sorted(h.ids()) == list(range(140))


def test_a_copy_found_while_still_being_written_is_not_taken_for_a_truncation(tmp_path):
    h = Harness(tmp_path)
    content = lines(0, 200)
    h.app.write_bytes(content)
    h.step()                                             # all 200 lines read
    copy = h.logs / "app.log.1"
    copy.write_bytes(content[:5000])                     # the copy, a fortieth written so far
    h.step()
    with open(copy, "ab") as f:
        f.write(content[5000:])
    os.truncate(h.app, 0)
    h.write(200, 250)
    h.step(3)
    h.past_grace()
    assert sorted(h.ids()) == list(range(250))
    assert h.metrics.get("agent_source_rotations_total", kind="truncated", topic="t") == 1
    assert h.journal_entries() == []


def test_a_copytruncate_then_a_rename_while_stopped_resumes_the_copy_where_reading_stopped(
        tmp_path):
    """While the agent was down, app.log was copied to app.log.1 and truncated, then renamed
    to app.log.2 and a new app.log begun. app.log.1 sorts before app.log.2, where the old inode
    now is: the copy must still start where reading of the old content stopped."""
    h = _read_100_lines_then_stop(tmp_path)
    shutil.copyfile(h.app, h.logs / "app.log.1")          # copytruncate ...
    os.truncate(h.app, 0)
    h.write(120, 200)
    os.rename(h.app, h.logs / "app.log.2")                # ... then rename-and-create
    h.write(200, 250)
    h.open()
    h.step()
    h.past_grace()
    assert sorted(h.ids()) == list(range(250))
    assert h.journal_entries() == []


# -- defects found in review, one deterministic test each ---------------------------------------

def test_a_file_truncated_before_its_first_read_is_checked_like_any_other(tmp_path):
    """D1, the 5-SIGKILL run's loss: a file opened at offset 0 but not read yet is copytruncated
    and written again; its first read must not take the new content for the old (which then
    loses the old content's first bytes and reads the new content's twice)."""
    h = Harness(tmp_path)
    h.write(0, 50)
    h.src.scan()                                          # opened at 0, not read
    shutil.copyfile(h.app, h.logs / "app.log.12")
    os.truncate(h.app, 0)
    h.write(50, 60)
    h.src.read_some(64 << 20)
    h.step(3)
    assert sorted(h.ids()) == list(range(60))
    assert h.journal_entries() == []


def test_a_truncation_between_the_check_and_the_read_is_caught_after_the_read(tmp_path):
    """D1's window: the file is copytruncated and written again after the source looked at it
    and before it read: the bytes read are the new content's and must not go under the old."""
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    h.write(100, 200)

    def copytruncate_and_write():
        shutil.copyfile(h.app, h.logs / "app.log.1")
        os.truncate(h.app, 0)
        h.write(200, 400)                                 # longer than the old offset

    h.fs.before_read_at[100 * LINE] = copytruncate_and_write   # at the read of 100..199
    h.src.read_some(64 << 20)
    h.step(3)
    assert sorted(h.ids()) == list(range(400))
    assert h.journal_entries() == []


def test_a_file_replaced_between_listing_and_opening_is_not_read_under_the_old_inode(tmp_path):
    """D2: app.log is listed, then rotated (rename-and-create) before the source opens it. The
    descriptor is then the new file's: it must not be filed under the old file's identity."""
    h = Harness(tmp_path)
    h.write(0, 50)

    def rotate():
        os.rename(h.app, h.logs / "app.log.1")
        h.write(50, 60)

    h.fs.before["open"] = [rotate]
    h.step(3)
    assert sorted(h.ids()) == list(range(60))


def test_a_known_file_that_is_briefly_short_after_a_restart_is_not_deferred(tmp_path):
    """D3: while the agent was down app.log was copytruncated and got a few bytes of a new
    line. A known inode is never deferred for being short: its old content becomes an orphan
    before the copy is looked at, and the copy resumes it instead of being read from 0."""
    h = _read_100_lines_then_stop(tmp_path)
    shutil.copyfile(h.app, h.logs / "app.log.1")
    os.truncate(h.app, 0)
    with open(h.app, "ab") as f:
        f.write(b"id-000")                                # 6 bytes of line 120
    h.open()
    h.step()
    with open(h.app, "ab") as f:
        f.write(lines(120, 121)[6:] + lines(121, 130))
    h.step()
    h.past_grace()
    assert sorted(h.ids()) == list(range(130))
    assert h.journal_entries() == []


def test_a_new_file_sharing_a_header_is_not_taken_for_a_copy(tmp_path):
    """Two CSV files start with the same header. The second, seen while it holds only the
    header, must not be taken for a copy of the first and started at the first's offset."""
    h = Harness(tmp_path, pattern="*.csv")
    header = b"timestamp,host,level,message,request_id\n"
    a = h.logs / "a.csv"
    a.write_bytes(header + lines(0, 50))
    h.step()
    b = h.logs / "b.csv"
    b.write_bytes(header)
    h.step()
    with open(b, "ab") as f:
        f.write(lines(50, 100))
    h.step(2, advance_s=0.6)
    assert sorted(h.ids()) == list(range(100))
    assert h.values().count(header.rstrip(b"\n")) == 2


def test_a_new_file_sharing_a_header_with_a_truncated_one_is_not_its_copy(tmp_path):
    """The same with the first file copytruncated (its copy not in the globs): its orphan's
    fingerprint is the header and its first rows; the new file holds the header at the same
    place but not the orphan's last bytes before its offset, so it is read from 0."""
    h = Harness(tmp_path, pattern="*.csv")
    header = b"timestamp,host,level,message,request_id\n"
    a = h.logs / "a.csv"
    a.write_bytes(header + lines(0, 10))                  # shorter than a fingerprint
    h.step()
    os.truncate(a, 0)                                     # copied elsewhere, then emptied
    h.step()
    b = h.logs / "b.csv"
    b.write_bytes(header + lines(50, 60))
    h.step()
    h.past_grace()
    assert sorted(h.ids()) == list(range(10)) + list(range(50, 60))
    assert h.values().count(header.rstrip(b"\n")) == 2


def test_an_empty_generation_never_takes_a_copy_for_its_own(tmp_path):
    h = Harness(tmp_path)
    h.app.write_bytes(b"")
    h.wait(2)                                             # an empty file, settled, tracked
    os.truncate(h.app, 0)
    h.write(0, 10, path=h.logs / "app.log.x")             # an unrelated file in the glob
    h.write(10, 20)
    h.step(3)
    assert sorted(h.ids()) == list(range(20))


def test_a_new_file_on_the_inode_of_one_deleted_while_stopped_is_read_from_zero(tmp_path):
    """A file deleted while the agent was down, and a new one that got its inode number: the
    old row must not resume on the new content (its offset would skip the new lines)."""
    h = Harness(tmp_path, pattern="app.log")
    h.write(0, 100)
    h.step()
    h.drain_all()
    old_ino = os.stat(h.app).st_ino
    h.stop()
    h.app.unlink()
    h.write(100, 180)
    h.fs.inodes[os.stat(h.app).st_ino] = old_ino         # the inode number is reused
    h.open()
    h.step()
    h.past_grace()
    assert sorted(h.ids()) == list(range(180))


def test_a_file_missing_from_one_listing_is_resumed_not_read_again(tmp_path):
    """A listing taken during renames can miss a file once. The source must not then read it
    from 0 when it is listed again (it was marked rotated, then closed when idle)."""
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    h.fs.hidden = {str(h.app)}
    h.src.scan()                                          # not listed: taken as rotated
    h.clock.advance(10)
    h.src.read_some(64 << 20)                             # idle at its end: closed
    assert not h.src.tracked
    h.write(100, 120)
    h.step(3)
    assert h.ids() == list(range(120))


def test_a_copy_found_after_the_grace_continues_its_orphan_and_is_not_read_twice(tmp_path):
    h = Harness(tmp_path, pattern="app.log*")
    h.write(0, 100)
    h.step()
    os.truncate(h.app, 0)                                 # copied to a name not listed yet
    h.step()
    h.past_grace()
    h.write(100, 110)
    late = tmp_path / "app.log.1"
    late.write_bytes(lines(0, 100))
    os.rename(late, h.logs / "app.log.1")                 # the copy arrives in the glob late
    h.step(3)
    assert sorted(h.ids()) == list(range(110))
    assert h.journal_entries() == []                      # nothing was unread when truncated


def test_sizes_are_stored_while_running_so_a_deletion_after_a_kill_is_journaled(tmp_path):
    """size_seen was only stored on close: after a SIGKILL, a file deleted meanwhile was
    journaled with 0 unread bytes though the agent had seen 20 more lines."""
    h = Harness(tmp_path, pattern="app.log")
    h.write(0, 100)
    h.step()
    h.drain_all()
    h.write(100, 120)
    h.clock.advance(2)
    h.src.scan()                                          # sees them (and stores the size),
    h.restart(crash=True)                                 # reads nothing before a SIGKILL
    h.app.unlink()
    h.step()
    h.past_grace()
    [entry] = h.journal_entries()
    assert entry["reason"] == "deleted_unread" and entry["open_ended"]
    assert entry["range"] == [100 * LINE, 120 * LINE] and entry["bytes"] == 20 * LINE


def test_a_file_deleted_while_stopped_is_journaled_open_ended_even_when_all_was_read(tmp_path):
    """logrotate's `rotate 0` while the agent was stopped: appended to, then deleted. The agent
    cannot know how much was written after it stopped, but must say that something may be."""
    h = _read_100_lines_then_stop(tmp_path, pattern="app.log")
    h.app.unlink()
    h.open()
    h.step()
    h.past_grace()
    [entry] = h.journal_entries()
    assert entry["reason"] == "deleted_unread" and entry["events"] == -1
    assert entry["open_ended"] and entry["range"] == [100 * LINE, 100 * LINE]
    assert h.db.get(entry["source_id"])["state"] == LOST


def test_a_rotated_backup_read_to_its_end_and_deleted_while_stopped_is_not_a_loss(tmp_path):
    """RotatingFileHandler: app.log renamed to app.log.1 (still under ``app.log*``) while
    read, read to its end, then deleted while the agent was stopped, and its inode number
    given to the new app.log. Nothing of it is owed: no journal entry, and no claim that a
    file was truncated (there was 8 of each kind per run before)."""
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    old_ino = os.stat(h.app).st_ino
    os.rename(h.app, h.logs / "app.log.1")                  # the handler's rollover
    h.write(100, 150)
    h.step()
    h.drain_all()
    h.stop()
    (h.logs / "app.log.1").unlink()                          # its oldest backup deleted
    os.rename(h.app, h.logs / "app.log.1")
    h.write(150, 160)
    h.fs.inodes[os.stat(h.app).st_ino] = old_ino             # the freed inode number reused
    h.open()
    h.step()
    h.past_grace()
    assert sorted(h.ids()) == list(range(160))
    assert h.journal_entries() == []
    assert h.metrics.get("agent_source_rotations_total", kind="deleted_read", topic="t") == 1
    assert not h.metrics.get("agent_source_rotations_total", kind="truncated", topic="t")


def test_a_renamed_backup_deleted_with_bytes_seen_unread_is_journaled_with_them(tmp_path):
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    os.rename(h.app, h.logs / "app.log.1")
    h.step()
    h.drain_all()
    with open(h.logs / "app.log.1", "ab") as f:              # the writer had not reopened
        f.write(lines(100, 130))
    h.clock.advance(2)
    h.src.scan()                                             # seen, not read
    h.restart(crash=True)
    (h.logs / "app.log.1").unlink()
    h.step()
    h.past_grace()
    [entry] = h.journal_entries()
    assert entry["reason"] == "deleted_unread" and entry["bytes"] == 30 * LINE
    assert entry["range"] == [100 * LINE, 130 * LINE]


def test_a_file_renamed_out_of_the_globs_while_stopped_is_read_to_its_end(tmp_path):
    h = _read_100_lines_then_stop(tmp_path, pattern="app.log")
    os.rename(h.app, h.logs / "app.log.1")                # rotated while the agent was down
    h.write(120, 150)
    h.open()
    h.step()
    h.past_grace()
    assert h.ids() == list(range(150))
    assert h.journal_entries() == []


def test_known_files_in_a_folder_missing_at_start_wait_for_it_and_resume(tmp_path):
    """A late mount: the agent starts before the file system holding its logs is mounted. The
    files it has checkpoints for are not deleted; they must neither be journaled as lost nor
    read again from the start when the folder comes back."""
    h = _read_100_lines_then_stop(tmp_path, pattern="app.log*")
    os.rename(h.logs, tmp_path / "unmounted")
    h.open()
    h.step()
    h.past_grace()
    h.past_grace()
    assert h.journal_entries() == []
    assert h.src.waiting()["folders_away"] == {str(h.logs): "missing"}
    assert {r["state"] for r in h.db.all_files()} <= {"active", "rotated", "done"}
    os.rename(tmp_path / "unmounted", h.logs)             # mounted; the application wrote on
    h.write(120, 150)
    h.step()
    h.past_grace()
    assert h.ids() == list(range(150))
    assert h.journal_entries() == []
    assert h.src.waiting()["folders_away"] == {}


def test_known_files_under_a_mount_point_not_yet_mounted_wait_for_it(tmp_path):
    """The folder is there (the empty mount point /etc/fstab declares, on its parent's device)
    but its file system is not mounted yet: the known files wait too, and resume once the
    mount shows them."""
    h = _read_100_lines_then_stop(tmp_path, pattern="app.log*")
    os.rename(h.logs, tmp_path / "unmounted")
    h.logs.mkdir()                                        # the mount point, empty
    h.fs.fstab = {str(h.logs)}
    h.open()
    h.step()
    h.past_grace()
    assert h.journal_entries() == []
    [(folder, why)] = h.src.waiting()["folders_away"].items()
    assert folder == str(h.logs) and "mount point in /etc/fstab not mounted yet" in why
    h.logs.rmdir()
    os.rename(tmp_path / "unmounted", h.logs)             # mounted: the files are listed
    h.write(120, 130)
    h.step()
    h.past_grace()
    assert h.ids() == list(range(130))
    assert h.journal_entries() == []


def test_a_mounted_folder_on_another_device_is_looked_in_as_always(tmp_path):
    """A folder that is there is not "away" whatever its device (a network file system
    mounted again gets a new device number): a file deleted from it is journaled as before."""
    h = _read_100_lines_then_stop(tmp_path, pattern="app.log")
    h.app.unlink()
    h.fs.devices[str(h.logs)] = os.stat(tmp_path).st_dev + 1
    h.fs.fstab = {str(h.logs)}                           # a mount point, mounted
    h.open()
    h.step()
    h.past_grace()
    [entry] = h.journal_entries()
    assert entry["reason"] == "deleted_unread"
    assert h.src.waiting()["folders_away"] == {}


def test_a_file_moved_to_another_globbed_folder_whose_own_folder_is_gone_is_read(tmp_path):
    """While the agent was stopped the file was rotated into another folder of the globs and
    its own folder removed: it is found and read to its end, not left waiting."""
    h = Harness(tmp_path, pattern="app.log")
    archive = tmp_path / "archive"
    archive.mkdir()
    h.cfg.paths.append(str(archive / "*.log"))
    h.write(0, 100)
    h.step()
    h.drain_all()
    h.stop()
    h.write(100, 120)
    os.rename(h.app, archive / "app.log.1")
    os.rmdir(h.logs)
    h.open()
    h.step()
    h.past_grace()
    assert h.ids() == list(range(120))
    assert h.journal_entries() == []
    assert h.src.waiting()["folders_away"] == {}


def test_a_folder_away_for_longer_than_the_wait_is_taken_as_deleted(tmp_path):
    h = _read_100_lines_then_stop(tmp_path, pattern="app.log")
    shutil.rmtree(h.logs)
    h.open()
    h.step()
    h.past_grace()
    assert h.journal_entries() == []
    h.wait(files.FOLDER_AWAY_MAX_S + 1)
    h.past_grace()
    [entry] = h.journal_entries()
    assert entry["reason"] == "deleted_unread" and entry["open_ended"]
    assert h.src.waiting()["folders_away"] == {}


def test_an_orphan_waits_for_its_copy_across_a_restart(tmp_path):
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    h.write(100, 130)
    h.src.scan()
    os.truncate(h.app, 0)                                 # truncated; the copy not there yet
    h.step()
    [row] = [r for r in h.db.all_files() if r["state"] == ORPHANED]
    assert row["tail"] == lines(0, 100)[-512:]
    h.restart(crash=True)
    (h.logs / "app.log.1").write_bytes(lines(0, 130))     # the copy, found by the next run
    h.step()
    h.past_grace()
    assert sorted(h.ids()) == list(range(130))
    assert h.journal_entries() == []


def test_an_unreadable_file_is_reported_and_read_once_it_can_be(tmp_path):
    h = Harness(tmp_path)
    h.write(0, 10)
    h.fs.refused.add(str(h.app))
    h.step()
    h.step()
    assert h.src.waiting()["unreadable"] == {str(h.app): "Permission denied"}
    assert h.metrics.get("agent_source_bad_input_total", kind="unreadable", topic="t") == 1
    h.fs.refused.clear()
    h.step()
    assert h.src.waiting()["unreadable"] == {}
    assert h.ids() == list(range(10))


# -- the start self-check -----------------------------------------------------------------------

def test_first_gap_finds_the_first_byte_no_slot_holds():
    assert first_gap(0, 100, [(0, 40), (40, 100)]) is None
    assert first_gap(0, 100, [(0, 40), (50, 100)]) == 40
    assert first_gap(10, 100, [(0, 40), (40, 90)]) == 90
    assert first_gap(0, 100, []) == 0
    assert first_gap(100, 100, []) is None


def test_sealed_bytes_the_pool_lost_are_read_again_at_start(tmp_path):
    """The checkpoint says 100 lines are sealed, Kafka acknowledged none, and the pool file
    is gone (moved away by an operator): they must not be skipped."""
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    h.checkpoint()                                       # sealed, never sent
    h.stop()
    (tmp_path / "pool").unlink()
    h.write(100, 120)
    h.open()
    h.step()
    assert h.ids() == list(range(120))
    assert h.db.all_files()[0]["sealed_offset"] == 120 * LINE


def test_sealed_bytes_the_pool_lost_are_journaled_when_their_file_is_gone_too(tmp_path):
    h = Harness(tmp_path, pattern="app.log")
    h.write(0, 100)
    h.step()
    h.drain_all()                                        # 0..99 acknowledged
    h.write(100, 150)
    h.step()
    h.checkpoint()                                       # 100..149 sealed, never sent
    h.stop()
    (tmp_path / "pool").unlink()
    h.app.unlink()
    h.open()
    h.step()
    h.past_grace()
    [entry] = h.journal_entries()
    assert entry["reason"] == "deleted_unread" and entry["open_ended"]
    assert entry["range"][0] == 100 * LINE


def test_a_file_emptied_before_its_first_read_is_a_truncation_with_its_bytes_journaled(tmp_path):
    """Found, its size seen, not read yet, then truncated to 0 (its copy outside the globs):
    the read that finds it empty must take that for a truncation, not a smaller size seen, or
    the bytes never read vanish without a journal entry."""
    h = Harness(tmp_path, pattern="app.log")
    h.write(0, 20)
    h.src.scan()                                          # decided on, tracked at 0, not read
    os.truncate(h.app, 0)
    h.src.read_some(64 << 20)                             # finds it empty
    h.write(20, 30)
    h.step(3)
    h.past_grace()
    assert h.ids() == list(range(20, 30))
    [entry] = h.journal_entries()
    assert entry["reason"] == "unaccounted_bytes" and entry["range"] == [0, 20 * LINE]


def test_one_size_look_per_read_turn_and_a_head_check_per_read(tmp_path):
    """A turn reading 5 MiB in reads of 1 MiB looks at the size once (it used to be before
    every read) and checks the first bytes after every read; lines written during the turn
    are read in the next one."""
    h = Harness(tmp_path)
    n = (5 << 20) // LINE
    h.write(0, n)
    h.src.scan()
    fstats, preads = [], []
    h.fs.before["fstat"] = [lambda: fstats.append(1)] * 50
    real_pread = h.fs.pread

    def pread(fd, size, offset):
        preads.append((size, offset))
        if len(preads) == 3:
            h.write(n, n + 100)                     # written during the turn
        return real_pread(fd, size, offset)

    h.fs.pread = pread
    h.src.read_some(64 << 20)
    assert len(fstats) == 1, fstats
    data = [p for p in preads if p[1] > 0 or p[0] > FINGERPRINT_BYTES]
    heads = [p for p in preads if p == (FINGERPRINT_BYTES, 0)]
    assert len(data) >= 5 and len(heads) == len(data), preads    # a look after each read
    assert sorted(h.ids()) == list(range(n))
    h.step()
    assert sorted(h.ids()) == list(range(n + 100))


def test_a_truncation_at_a_later_read_of_a_turn_is_caught_by_that_read(tmp_path):
    """With one size look per turn, a copytruncate and rewrite that happens between the third
    and fourth reads of a 5 MiB turn is caught by the look at the first bytes after the fourth
    read: what the first three read stays the old generation's, the rest goes to the copy and
    the new file, each line once."""
    h = Harness(tmp_path)
    n = (5 << 20) // LINE
    h.write(0, n)
    h.src.scan()
    real_pread = h.fs.pread
    data_reads = []

    def pread(fd, size, offset):
        if size > FINGERPRINT_BYTES or offset > 0:
            data_reads.append(offset)
            if len(data_reads) == 4:
                shutil.copyfile(h.app, h.logs / "app.log.1")
                os.truncate(h.app, 0)
                h.write(n, n + 2000)                # the new generation, other first bytes
        return real_pread(fd, size, offset)

    h.fs.pread = pread
    h.src.read_some(64 << 20)
    assert len(data_reads) >= 4, data_reads
    h.fs.pread = real_pread
    h.step(3)
    h.wait(60)
    assert sorted(h.ids()) == list(range(n + 2000))
    assert h.journal_entries() == []


# -- compressed files and exclude ----------------------------------------------------------------
def _gzip_of(data: bytes) -> bytes:
    import gzip
    return gzip.compress(data)


def test_a_compressed_rotation_under_the_glob_is_never_read_as_lines(tmp_path, caplog):
    """logrotate's ``compress`` leaves ``app.log.1.gz`` beside the log, and ``app.log*``
    matches it: its bytes are not lines. Of every compressor's magic (gzip, zstd, xz, bzip2)
    nothing is read; the file is logged once, counted, listed in status, and forgotten by the
    state database (its deletion journals nothing); a file whose first bytes only begin a
    magic waits for more before it is decided on."""
    import bz2
    import lzma
    h = Harness(tmp_path)
    h.write(0, 100)
    h.step()
    (h.logs / "app.log.1.gz").write_bytes(_gzip_of(lines(0, 100)))
    (h.logs / "app.log.2.xz").write_bytes(lzma.compress(lines(0, 50)))
    (h.logs / "app.log.3.bz2").write_bytes(bz2.compress(lines(0, 50)))
    (h.logs / "app.log.4.zst").write_bytes(_zstd(lines(0, 50)))
    (h.logs / "app.log.5").write_bytes(b"BZh")             # maybe bzip2: wait
    h.write(100, 150)
    with caplog.at_level(logging.WARNING, logger="docket.agent.files"):
        h.wait(6, steps=6)
        h.step(3)
    assert sorted(h.ids()) == list(range(150))
    assert h.metrics.get("agent_source_bad_input_total", kind="compressed", topic="t") == 4
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"
              and "-compressed and not the compressed form of a file being read: not read"
              in r.getMessage()]
    assert len(warned) == 4
    assert sorted(p.rsplit("/", 1)[1] for p in h.src.waiting()["compressed"]) == \
        ["app.log.1.gz", "app.log.2.xz", "app.log.3.bz2", "app.log.4.zst"]
    with open(h.logs / "app.log.5", "ab") as f:               # not bzip2 after all: a line
        f.write(b"ello id-000000150\n")
    h.wait(6, steps=6)
    assert h.values()[-1] == b"BZhello id-000000150"
    h.stop()
    (h.logs / "app.log.1.gz").unlink()                          # deleted while stopped
    h.open()
    h.wait(20, steps=10)
    for name in ("app.log.2.xz", "app.log.3.bz2", "app.log.4.zst"):
        (h.logs / name).unlink()                               # and while running
    h.wait(20, steps=10)
    h.restart()
    h.wait(20, steps=10)
    assert h.journal_entries() == [], "nothing of a compressed file is owed"


def _stopped_with_unread(h, end: int) -> bytes:
    """Lines 0-999 read and acknowledged, 1,000 to ``end`` written and not read (their size
    seen), the agent stopped: returns what app.log holds."""
    h.write(0, 1000)
    h.step()
    h.drain_all()
    h.write(1000, end)
    h.src.scan()
    h.stop()
    return h.app.read_bytes()


def _zstd(data: bytes) -> bytes:
    """What the zstd command makes of ``data`` (logrotate's ``compresscmd /usr/bin/zstd``)."""
    return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True,
                          timeout=60).stdout


@pytest.mark.parametrize("packer", ["gzip", "zstd", "xz", "bzip2"])
def test_a_rotation_compressed_while_the_agent_is_stopped_is_read_on_from_its_checkpoint(
        tmp_path, packer):
    """logrotate (``compress``, no ``delaycompress``) runs while the agent is stopped with
    lines unread: app.log becomes app.log.1.gz (or .zst, .xz, .bz2) and the plain file is gone.
    The compressed file is the rest of a generation being read: it is read on, decompressed,
    from the checkpoint, once; nothing is journaled (the issue measured 25,000 lines lost and a
    0-byte entry)."""
    import bz2
    import gzip
    import lzma
    pack = {"gzip": gzip.compress, "xz": lzma.compress, "bzip2": bz2.compress,
            "zstd": _zstd}[packer]
    h = Harness(tmp_path)
    (h.logs / "app.log.1.gz").write_bytes(pack(_stopped_with_unread(h, 3000)))
    h.app.unlink()
    h.write(3000, 3100)                                   # the new app.log
    h.open()
    h.wait(3, steps=6)
    assert sorted(h.ids()) == list(range(3100))
    assert h.journal_entries() == []
    assert h.metrics.get("agent_source_rotations_total", kind="compressed_copy", topic="t") == 1
    assert h.metrics.get("agent_source_bad_input_total", kind="compressed", topic="t") == 0
    # A restart in the middle changes nothing: the compressed file resumes at its checkpoint.
    h.restart()
    h.wait(3, steps=6)
    assert sorted(h.ids()) == list(range(3100))


def test_a_compressed_copy_found_while_the_original_is_read_is_not_read_twice(tmp_path):
    """The agent running: app.log.1 is compressed to app.log.1.gz, then deleted. The plain
    file is read to its end through its open descriptor; the compressed copy adds nothing."""
    h = Harness(tmp_path)
    h.write(0, 500)
    h.step()
    os.rename(h.app, h.logs / "app.log.1")
    h.write(500, 600)
    (h.logs / "app.log.1.gz").write_bytes(_gzip_of((h.logs / "app.log.1").read_bytes()))
    h.step(1)
    (h.logs / "app.log.1").unlink()
    h.wait(8, steps=8)
    assert sorted(h.ids()) == list(range(600))
    assert h.journal_entries() == []


def test_compressed_read_reads_a_compressed_file_that_is_no_copy_whole(tmp_path):
    h = Harness(tmp_path, compressed="read")
    h.write(0, 10)
    (h.logs / "app.log.7.gz").write_bytes(_gzip_of(lines(100, 300)))
    h.wait(3, steps=6)
    assert sorted(h.ids()) == [*range(10), *range(100, 300)]


def test_a_gzip_file_still_being_written_is_read_as_it_grows(tmp_path):
    """gzip writing the compressed form of a stopped agent's unread tail, block by block (a
    flush per 400 lines) while the agent looks every 0.2 s: what its bytes decompress to so
    far is read, the rest as it comes; nothing is journaled."""
    import zlib
    h = Harness(tmp_path)
    plain = _stopped_with_unread(h, 5000)
    h.app.unlink()
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    gz = h.logs / "app.log.1.gz"
    gz.write_bytes(b"")
    h.open()
    seen = []
    for k in range(0, 5000, 400):
        with open(gz, "ab") as f:
            f.write(packer.compress(plain[k * LINE:(k + 400) * LINE])
                    + packer.flush(zlib.Z_SYNC_FLUSH))
        h.step(1, advance_s=0.2)
        seen.append(len(h.ids()))
    with open(gz, "ab") as f:
        f.write(packer.flush())
    h.wait(3, steps=6)
    assert sorted(h.ids()) == list(range(5000))
    assert any(1000 < n < 5000 for n in seen), seen       # read while it was being written
    assert h.journal_entries() == []


def test_exclude_keeps_matching_files_out_but_a_tailed_file_renamed_to_it_is_read_to_its_end(
        tmp_path):
    h = Harness(tmp_path, exclude=["*.gz", str(tmp_path / "logs" / "skip-*")])
    h.write(0, 100)
    (h.logs / "app.log.9.gz").write_bytes(b"plain text, but excluded\n")
    (h.logs / "skip-me").write_bytes(b"excluded by its whole path\n")
    h.cfg.paths.append(str(h.logs / "skip-*"))
    h.step()
    h.write(100, 120)
    os.rename(h.app, h.logs / "app.log.1.gz")                  # renamed to an excluded name
    h.write(120, 150)
    h.step(3)
    assert sorted(h.ids()) == list(range(150))
    assert h.metrics.get("agent_source_bad_input_total", kind="compressed", topic="t") == 0


# -- where new files are read from ---------------------------------------------------------------
def test_read_from_end_skips_what_files_held_at_the_very_first_start_only(tmp_path):
    """``read_from = "end"``: the files found at the agent's very first start are read from
    their last whole line's end (a partial last line is read whole once it ends); a file that
    appears later, and every file of a later start, are read as always."""
    (tmp_path / "logs").mkdir()
    app = tmp_path / "logs" / "app.log"
    app.write_bytes(lines(0, 100) + b"id-000000100 par")
    h = Harness(tmp_path, first_start=True, read_from="end")
    h.wait(3, steps=3)
    with open(app, "ab") as f:
        f.write(lines(100, 101)[len(b"id-000000100 par"):])
    h.write(101, 150)
    h.write(500, 520, path=h.logs / "app.log.new")              # appears later
    h.wait(3, steps=3)
    assert sorted(h.ids()) == [*range(100, 150), *range(500, 520)]
    h.restart()
    h.write(150, 160)
    h.wait(3, steps=3)
    assert sorted(h.ids()) == [*range(100, 160), *range(500, 520)]


def test_read_from_end_does_not_apply_after_a_lost_state(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "app.log").write_bytes(lines(0, 100))
    h = Harness(tmp_path, first_start=False, read_from="end")     # the agent ran here before
    h.wait(3, steps=3)
    assert sorted(h.ids()) == list(range(100))


def test_ignore_older_leaves_old_files_closed_until_they_change(tmp_path):
    """``ignore_older_ms``: a file not known yet and last changed longer ago is not opened,
    only counted in status; once it changes it is read from the size it had when ignored."""
    (tmp_path / "logs").mkdir()
    old = tmp_path / "logs" / "app.log.old"
    old.write_bytes(lines(0, 100))
    h = Harness(tmp_path, ignore_older_ms=24 * 3600 * 1000)
    day_s = 24 * 3600
    os.utime(old, (h.clock.wall_ms / 1000 - 3 * day_s,) * 2)
    h.write(1000, 1010)
    os.utime(h.app, (h.clock.wall_ms / 1000,) * 2)
    h.wait(3, steps=3)
    assert sorted(h.ids()) == list(range(1000, 1010))
    assert h.src.waiting()["ignored_older"] == 1 and len(h.src.tracked) == 1
    h.write(100, 120, path=old)                                  # it changes
    os.utime(old, (h.clock.wall_ms / 1000,) * 2)
    h.wait(3, steps=3)
    assert sorted(h.ids()) == [*range(100, 120), *range(1000, 1010)]
    assert h.src.waiting()["ignored_older"] == 0


# -- many files ----------------------------------------------------------------------------------
def test_files_read_to_their_end_are_not_looked_at_until_written(tmp_path, caplog):
    """With the write watch naming the files written (``read_some(written=…)``), a file read
    to its end with nothing waiting is skipped until a write names it; a write naming a file
    the source does not know, or a scan, has every file looked at again. New files found in
    one scan are logged one line each for the first 20, then in one summary line."""
    (tmp_path / "logs").mkdir()
    for i in range(30):
        (tmp_path / "logs" / f"f{i:02d}.log").write_bytes(lines(i, i + 1))
    h = Harness(tmp_path, pattern="f*.log")
    with caplog.at_level(logging.INFO, logger="docket.agent.files"):
        h.wait(3, steps=3)
    tailing = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tailing")]
    assert len(tailing) == 21 and "10 more new file(s)" in tailing[-1]
    assert sorted(h.ids()) == list(range(30))
    looked = []
    fstat = h.fs.fstat
    h.fs.fstat = lambda fd: (looked.append(fd), fstat(fd))[1]
    h.src.read_some(1 << 20, set())
    assert looked == [], "quiet files are not looked at"
    target = h.logs / "f07.log"
    h.write(107, 108, path=target)
    h.src.read_some(1 << 20, {str(target)})
    assert len(looked) == 1 and 107 in h.ids()
    looked.clear()
    h.src.read_some(1 << 20, {str(h.logs / "f99.log")})     # a file it does not know yet
    assert len(looked) == 30
    looked.clear()
    h.src.read_some(1 << 20, None)                          # no watch: every file
    assert len(looked) == 30


# -- encodings ------------------------------------------------------------------------------------
def test_a_latin_1_log_arrives_as_utf8_and_its_checkpoints_stay_in_its_own_bytes(tmp_path):
    h = Harness(tmp_path, encoding="latin-1")
    text = [f"id-{i:09d} café crème brûlée {'é' * (i % 7)}" for i in range(200)]
    h.app.write_bytes("".join(t + "\n" for t in text[:120]).encode("latin-1"))
    h.step()
    h.drain_all()
    assert h.db.get(1)["acked_offset"] == len("".join(t + "\n" for t in text[:120])
                                              .encode("latin-1"))
    h.restart()
    with open(h.app, "ab") as f:
        f.write("".join(t + "\n" for t in text[120:]).encode("latin-1"))
    h.step()
    assert h.values() == [t.encode("utf-8") for t in text]      # each once, as UTF-8
    assert not h.metrics.get("agent_source_bad_input_total", kind="invalid_encoding", topic="t")


def test_a_latin_1_log_with_a_key_field_keeps_its_checkpoints_in_its_own_bytes(tmp_path):
    """The key taken from a transcoded record keeps where the record lies in the file: a
    checkpoint past the file's end would skip what is written next."""
    h = Harness(tmp_path, encoding="latin-1", key_field="k")
    text = [f'{{"k": "clé-{i}", "v": "{"é" * (i % 5)}"}}' for i in range(50)]
    raw = "".join(t + "\n" for t in text).encode("latin-1")
    h.app.write_bytes(raw[:len(raw) // 2 + 3])
    h.step()
    h.drain_all()
    done = len(h.delivered)
    assert h.db.get(1)["acked_offset"] == len("".join(t + "\n" for t in text[:done])
                                              .encode("latin-1"))
    h.restart()
    h.app.write_bytes(raw)
    h.step(2, advance_s=0.1)
    h.drain_all()
    assert h.delivered == [t.encode("utf-8") for t in text]
    assert h.db.get(1)["acked_offset"] == len(raw)


def test_bytes_a_codec_cannot_decode_are_replaced_and_counted(tmp_path):
    h = Harness(tmp_path, encoding="windows-1252")
    h.app.write_bytes(b"id-000000000 \x80 euro\r\nid-000000001 \x81 undefined\n")
    h.step()
    assert h.values() == ["id-000000000 € euro".encode(), "id-000000001 \ufffd undefined".encode()]
    assert h.metrics.get("agent_source_bad_input_total", kind="invalid_encoding", topic="t") == 1


def test_an_unknown_codec_or_utf_16_on_a_socket_is_refused_with_its_key_path(tmp_path):
    from agent.config import ConfigError, parse
    for src, why in (({"type": "file", "paths": [str(tmp_path / "*.log")],
                       "encoding": "no-such-codec"}, "no codec"),
                     ({"type": "socket", "path": str(tmp_path / "s.sock"),
                       "encoding": "utf-16"}, "no file")):
        with pytest.raises(ConfigError) as e:
            parse({"broker": {"bootstrap_servers": "127.0.0.1:9092"},
                   "sources": [{"topic": "t", **src}]})
        assert e.value.path == "sources[0].encoding" and why in str(e.value)


# Text whose characters hold the byte 0x0A inside a code unit (U+010A: 0A 01 in UTF-16LE,
# 01 0A in BE; U+0A0D), and one outside the basic plane (a surrogate pair in UTF-16).
WIDE_TEXT = [f"id-{i:09d} Ċ ਍ 😀 {'é' * (i % 5)}" for i in range(300)]


@pytest.mark.parametrize("encoding, bom", [("utf-16", "\ufeff"), ("utf-16", ""),
                                           ("utf-16-be", ""), ("utf-16-le", "\ufeff"),
                                           ("utf-32", "\ufeff"), ("utf-32-be", "")])
def test_a_utf_16_or_32_log_arrives_as_utf8_line_by_line_with_checkpoints_in_its_bytes(
        tmp_path, encoding, bom):
    """Lines end at a newline code unit only (never at a 0x0A byte inside a character); the
    byte order mark is no part of the first record and gives ``utf-16``/``utf-32`` the
    order (big-endian here when named so, little-endian without a mark); a restart reads on
    from the checkpoint in the file's bytes: each line once."""
    if encoding[-3:] in ("-le", "-be"):
        codec = encoding
    else:                                             # the mark written big-endian, or none
        codec = f"{encoding}-be" if bom else f"{encoding}-le"
    h = Harness(tmp_path, encoding=encoding)
    first = (bom + "".join(t + "\n" for t in WIDE_TEXT[:120])).encode(codec)
    h.app.write_bytes(first)
    h.step()
    h.drain_all()
    assert h.db.get(1)["acked_offset"] == len(first)
    h.restart()
    with open(h.app, "ab") as f:
        f.write("".join(t + "\n" for t in WIDE_TEXT[120:]).encode(codec))
    h.step()
    assert h.values() == [t.encode("utf-8") for t in WIDE_TEXT]
    assert not h.metrics.get("agent_source_bad_input_total", kind="invalid_encoding", topic="t")


def test_a_utf_16_partial_line_waits_for_its_newline_unit_and_is_flushed_in_whole_units(
        tmp_path):
    """Half a code unit (a writer between two bytes) is never handed over: a partial line is
    flushed without it, and the line's rest, the half unit's other byte first, follows."""
    h = Harness(tmp_path, encoding="utf-16-le", partial_flush_ms=10)
    line = "id-000000000 partial".encode("utf-16-le")
    h.app.write_bytes(line + b"x")                    # 0x78: half of the unit 'x'
    h.step()
    h.step(1, advance_s=0.02)
    assert h.values() == [b"id-000000000 partial"]
    with open(h.app, "ab") as f:
        f.write(b"\x00" + "y\r\nid-000000001 next\n\n".encode("utf-16-le"))
    h.step()
    assert h.values() == [b"id-000000000 partial", b"xy", b"id-000000001 next", b""]
    got = {k: h.metrics.get("agent_source_bad_input_total", kind=k, topic="t")
           for k in ("partial_line_flushed", "crlf_line", "empty_line")}
    assert got == {"partial_line_flushed": 1, "crlf_line": 1, "empty_line": 1}


def test_a_utf_16_file_holding_only_its_byte_order_mark_is_never_flushed_as_a_line(tmp_path):
    h = Harness(tmp_path, encoding="utf-16", partial_flush_ms=10)
    h.app.write_bytes("\ufeff".encode("utf-16-be"))
    h.step()
    h.step(1, advance_s=0.02)
    assert h.values() == []
    with open(h.app, "ab") as f:
        f.write("hello\n".encode("utf-16-be"))
    h.step()
    assert h.values() == [b"hello"]
    assert not h.metrics.get("agent_source_bad_input_total", kind="empty_line", topic="t")


def test_utf_16_takes_its_byte_order_from_the_file_s_first_bytes_read_not_a_short_look(
        tmp_path):
    """The file found with one byte of its mark written: the order is taken from what is read
    from byte 0 once a line is there, not from the one byte seen first."""
    h = Harness(tmp_path, encoding="utf-16")
    h.app.write_bytes(b"\xfe")
    h.step()
    with open(h.app, "ab") as f:
        f.write(b"\xff" + "big-endian\n".encode("utf-16-be"))
    h.step()
    assert h.values() == [b"big-endian"]


def test_utf_16_multiline_events_are_joined_by_their_text(tmp_path):
    h = Harness(tmp_path, encoding="utf-16", multiline={"preset": "java", "flush_ms": 500})
    text = ("\ufeff2026-12-02 ERROR first failed\njava.lang.IllegalStateException: Ċ\n"
            "\tat app.Main.run(Main.java:1)\n2026-12-02 INFO second\n"
            "2026-12-02 ERROR third\n\tat app.Main.x(Main.java:2)\n")
    h.app.write_bytes(text.encode("utf-16-le"))
    h.step()
    h.wait(1, steps=2)
    assert h.values() == ["2026-12-02 ERROR first failed\njava.lang.IllegalStateException: "
                          "Ċ\n\tat app.Main.run(Main.java:1)".encode(),
                          b"2026-12-02 INFO second",
                          b"2026-12-02 ERROR third\n\tat app.Main.x(Main.java:2)"]


def test_read_from_end_in_utf_16_starts_after_the_last_newline_unit(tmp_path):
    (tmp_path / "logs").mkdir()
    app = tmp_path / "logs" / "app.log"
    app.write_bytes("\ufeffold Ċ\nold two\nnew ".encode("utf-16-be"))
    h = Harness(tmp_path, first_start=True, read_from="end", encoding="utf-16")
    h.wait(1, steps=2)
    with open(app, "ab") as f:
        f.write("line Ċ\nafter\n".encode("utf-16-be"))
    h.step()
    assert h.values() == ["new line Ċ".encode(), b"after"]


# -- closing idle files ---------------------------------------------------------------------------
def test_an_idle_file_is_closed_and_opened_again_when_it_changes(tmp_path):
    h = Harness(tmp_path, close_idle_ms=1000)
    h.write(0, 50)
    h.step()
    h.wait(2, steps=4)
    assert not h.src.tracked and len(h.src.idle_closed) == 1       # its descriptor given back
    h.wait(20, steps=4)                                             # scans leave it closed
    assert not h.src.tracked
    h.write(50, 80)
    h.step()
    assert len(h.src.tracked) == 1
    assert sorted(h.ids()) == list(range(80))                       # from its checkpoint
    assert h.journal_entries() == []


def test_a_write_the_watch_names_asks_for_a_scan(tmp_path):
    h = Harness(tmp_path, close_idle_ms=1000)
    h.write(0, 10)
    h.step()
    h.wait(2, steps=4)
    assert h.src.idle_closed and not h.src.rescan
    h.write(10, 12)
    h.src.read_some(1 << 20, {str(h.app)})
    assert h.src.rescan                                             # the loop scans at once


def test_an_idle_closed_file_deleted_journals_nothing_and_one_deleted_while_stopped_does(
        tmp_path):
    h = Harness(tmp_path, close_idle_ms=1000)
    h.write(0, 10)
    h.step()
    h.wait(2, steps=4)
    h.app.unlink()
    h.wait(10, steps=4)
    assert h.journal_entries() == [] and not h.src.idle_closed
    # Written after it was closed, the agent stopped, deleted: what came after the last
    # look is unknown, as for any file the writer was writing when the agent stopped.
    h.write(100, 110)
    h.step()
    h.wait(2, steps=4)
    h.stop()
    h.app.unlink()
    h.open()
    h.step()
    h.past_grace()
    [entry] = h.journal_entries()
    assert entry["reason"] == "deleted_unread" and entry["open_ended"]


def test_max_open_files_closes_the_files_idle_longest_and_says_when_it_cannot(tmp_path):
    h = Harness(tmp_path, pattern="*.log", close_idle_ms=0, max_open_files=3)
    for k in range(6):
        (h.logs / f"f{k}.log").write_bytes(lines(k * 10, k * 10 + 10))
        h.step(1, advance_s=0.1)
    h.step(2, advance_s=0.1)
    assert len(h.src.tracked) <= 3 and len(h.src.idle_closed) >= 3
    assert sorted(h.ids()) == list(range(60))
    assert h.src.waiting()["over_max_open_files"] == 0


def test_a_skipped_compressed_files_source_id_is_never_given_to_another_file(tmp_path):
    """A compressed file that is no generation being read is skipped and its row deleted, but
    the agent still holds it (by its source id) while it stays under the glob. Its id must never
    go to a file found later: SQLite gives a new row the highest id plus one, so the deleted
    row's id came back for the next file, and the skipped file's later moves were written onto
    that file's row (seen under logrotate ``compress``: a copy read again whole from offset 0
    under the wrong generation, and the generation it belonged to journaled as deleted)."""
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "app.log.9.gz").write_bytes(_gzip_of(lines(90_000, 90_100)))
    h = Harness(tmp_path, first_start=True)               # an archive: skipped, row deleted
    h.write(0, 500)
    h.step()
    h.drain_all()
    os.rename(h.app, h.logs / "app.log.1")                # a rotation: a new app.log
    h.write(500, 600)
    h.step()
    h.past_grace()
    ids = {t.source_id for t in h.src.tracked.values()}
    assert len(ids) == len(h.src.tracked), f"two files under one source id: {h.src.tracked}"
    os.rename(h.logs / "app.log.9.gz", h.logs / "app.log.10.gz")   # logrotate's renumbering
    os.rename(h.logs / "app.log.1", h.logs / "app.log.2")
    h.write(600, 700)
    h.wait(3, steps=6)
    h.restart(crash=True)
    h.write(700, 800)
    h.wait(3, steps=6)
    h.past_grace()
    assert sorted(h.ids()) == list(range(800))
    assert h.journal_entries() == []


def _age_folder(folder, seconds: float = 30) -> None:
    """Set a folder's times back, as a folder nothing was created in for a while."""
    past = time.time() - seconds
    os.utime(folder, (past, past))


def test_a_safety_scan_of_folders_unchanged_since_the_last_listing_lists_nothing(tmp_path):
    """The timed scan behind a write watch (``scan(safety=True)``): when the globs' folders are
    as the last listing found them, nothing was created, moved or deleted there, so nothing
    is listed — and the files open are still looked at again (a write the watch missed is
    read). A folder changed since, or changed too recently to be told apart from a change in
    the same clock tick, is listed again."""
    h = Harness(tmp_path)
    for k in range(3):
        h.write(100 * k, 100 * k + 50, h.logs / f"app.log.{k}")
    _age_folder(h.logs)
    h.step()
    listings = []
    h.fs.before["glob"] = [lambda: listings.append(1) for _ in range(10)]
    h.src.scan(safety=True)
    assert listings == [], "an unchanged folder was listed"
    h.write(50, 60, h.logs / "app.log.0")              # a write no event reported
    h.src.read_some(1 << 20, written=set())
    assert sorted(h.ids()) == sorted([*range(0, 60), *range(100, 150), *range(200, 250)])
    h.write(300, 310, h.logs / "app.log.9")            # a new file: the folder changed
    h.src.scan(safety=True)
    assert listings == [1], "a changed folder was not listed"
    h.step()
    assert 300 in h.ids()
    before = len(listings)
    h.src.scan(safety=True)                              # changed within the margin: listed
    assert len(listings) == before + 1


def test_a_compressed_copy_still_being_written_at_start_is_waited_for(tmp_path):
    """logrotate ``compress`` ran while the agent was stopped with lines unread, and gzip is
    still writing app.log.1.gz when the agent starts (a loaded host): what the file holds so
    far is a prefix of a gzip stream. It is not decided on — neither as a new file (skipped,
    forgotten) nor by the orphan journaled — while its stream is not whole, even after it
    stopped growing for longer than the copy grace; once gzip ends it, it continues the
    generation from its checkpoint: every line once, nothing journaled (seen under logrotate
    with a busy loop on the other core: a 0-byte .gz skipped, its generation journaled as
    deleted, 21,200 events lost)."""
    import gzip
    h = Harness(tmp_path)
    packed = gzip.compress(_stopped_with_unread(h, 20_000))
    gz = h.logs / "app.log.1.gz"
    gz.write_bytes(packed[:20])                           # gzip has written its header so far
    h.app.unlink()
    h.write(20_000, 20_100)                               # the new app.log
    h.open()
    h.wait(files.gen.COPY_GRACE_S + 2, steps=8)           # longer than the grace, no growth
    assert h.journal_entries() == []
    assert h.metrics.get("agent_source_bad_input_total", kind="compressed", topic="t") == 0
    with open(gz, "ab") as f:                             # gzip ends the stream
        f.write(packed[20:])
    h.wait(3, steps=6)
    h.past_grace()
    assert sorted(h.ids()) == list(range(20_100))
    assert h.journal_entries() == []
    assert h.metrics.get("agent_source_rotations_total", kind="compressed_copy", topic="t") == 1


def test_an_empty_compressed_file_found_at_start_is_waited_for(tmp_path):
    """The same with gzip not having written a byte yet: app.log.1.gz is empty when the agent
    starts, and stays so for longer than the settling and the copy grace. It is not started as
    a new (empty) file, nor is the generation it will hold journaled; once gzip has written it,
    it continues that generation."""
    import gzip
    h = Harness(tmp_path)
    packed = gzip.compress(_stopped_with_unread(h, 5_000))
    gz = h.logs / "app.log.1.gz"
    gz.touch()
    h.app.unlink()
    h.write(5_000, 5_100)
    h.open()
    h.wait(files.gen.COPY_GRACE_S + 2, steps=8)
    assert h.journal_entries() == []
    gz.write_bytes(packed)
    h.wait(3, steps=6)
    h.past_grace()
    assert sorted(h.ids()) == list(range(5_100))
    assert h.journal_entries() == []
    assert h.metrics.get("agent_source_rotations_total", kind="compressed_copy", topic="t") == 1


def test_a_generation_written_and_compressed_while_stopped_is_read_whole(tmp_path):
    """Two compressing rotations while the agent is stopped: app.log (read to its end) becomes
    app.log.2.gz, and a whole generation the agent never saw — written, rotated and compressed
    meanwhile — is app.log.1.gz. That file is the only form its content has left: read whole,
    decompressed (before: skipped as "not the compressed form of a file being read", its lines
    lost without a journal entry). The copy of what was read adds nothing."""
    import gzip
    h = Harness(tmp_path)
    h.write(0, 1000)
    h.step()
    h.drain_all()
    h.stop()
    (h.logs / "app.log.2.gz").write_bytes(gzip.compress(h.app.read_bytes()))
    h.app.unlink()
    (h.logs / "app.log.1.gz").write_bytes(gzip.compress(lines(1000, 3000)))
    h.write(3000, 3100)
    h.open()
    h.wait(3, steps=6)
    h.past_grace()
    assert sorted(h.ids()) == list(range(3100))
    assert h.journal_entries() == []
    assert h.metrics.get("agent_source_rotations_total", kind="compressed_unseen", topic="t") == 1
    h.restart()                                         # read, it is known: not read again
    h.wait(3, steps=6)
    h.past_grace()
    assert sorted(h.ids()) == list(range(3100))


def test_compressed_archives_found_at_the_first_start_stay_skipped(tmp_path):
    """Archives under the glob before the agent ever ran are skipped at its first start — and
    after a restart too, when their rows are gone: their starts are kept (``skipped``)."""
    import gzip
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "app.log.3.gz").write_bytes(gzip.compress(lines(900_000, 900_500)))
    h = Harness(tmp_path, first_start=True)
    h.write(0, 100)
    h.wait(3, steps=6)
    assert sorted(h.ids()) == list(range(100))
    os.rename(h.logs / "app.log.3.gz", h.logs / "app.log.4.gz")
    h.restart()
    h.wait(3, steps=6)
    h.past_grace()
    assert sorted(h.ids()) == list(range(100))
    assert h.metrics.get("agent_source_rotations_total", kind="compressed_unseen", topic="t") == 0


def test_a_safety_scan_lists_folders_whose_files_are_links(tmp_path):
    """A file listed through a link (``/var/log/containers/*.log``) is written in a folder the
    watch may not see: once it is closed while idle, only a listing finds its writes. So the
    safety scan lists such a folder every time, changed or not."""
    h = Harness(tmp_path, close_idle_ms=1000)
    real = tmp_path / "elsewhere"
    real.mkdir()
    h.write(0, 50, real / "pod.log")
    os.symlink(real / "pod.log", h.logs / "app.log")
    _age_folder(h.logs)
    h.step()
    h.wait(2, steps=4)                                   # closed while idle
    assert h.src.idle_closed
    listings = []
    h.fs.before["glob"] = [lambda: listings.append(1) for _ in range(10)]
    h.write(50, 60, real / "pod.log")                    # no event names app.log
    h.src.scan(safety=True)
    assert listings == [1]
    h.step()
    assert sorted(h.ids()) == list(range(60))


def test_a_compressed_file_never_whole_is_decided_on_after_the_wait_and_the_loss_told(tmp_path):
    """A compressed file whose stream never ends (gzip killed mid-file) is waited for at most
    ``COMPRESSING_WAIT_S`` after it was found, growing or not: then it is decided on as it is,
    and the generation it did not continue is journaled — never an orphan forgotten unsaid."""
    import gzip
    h = Harness(tmp_path)
    packed = gzip.compress(_stopped_with_unread(h, 5_000))
    gz = h.logs / "app.log.1.gz"
    gz.write_bytes(packed[:20])
    h.app.unlink()
    h.open()
    for _ in range(int(files.gen.COMPRESSING_WAIT_S // 5) + 2):
        with open(gz, "ab") as f:                        # it grows, a byte at a time
            f.write(b"\x00")
        h.wait(5, steps=2)
    h.past_grace()
    [entry] = h.journal_entries()
    assert entry["reason"] == "deleted_unread"


def test_archives_are_skipped_after_a_start_without_their_record(tmp_path):
    """A start with no record of the archives (a lost state database, or one of a version that
    kept none: ``archives_first``) takes the compressed files its first listing finds for
    archives, skipped — not for content never seen, read whole."""
    import gzip
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "app.log.7.gz").write_bytes(gzip.compress(lines(800_000, 800_300)))
    h = Harness(tmp_path)
    h.src.close()
    h.src = files.FileSource(h.cfg, h.pool, h.db, h.journal, h.metrics, {}, fs=h.fs,
                             archives_first=True)
    h.write(0, 100)
    h.wait(3, steps=6)
    h.past_grace()
    assert sorted(h.ids()) == list(range(100))
    assert h.metrics.get("agent_source_rotations_total", kind="compressed_unseen", topic="t") == 0
