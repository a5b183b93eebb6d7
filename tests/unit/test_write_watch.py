"""The write watch that wakes the native path's idle loop (``agent/tail/watch.py``): a write to
a file in a watched folder makes its descriptor readable until ``writes_seen`` empties it; a
burst of writes is one wake-up; folders that appear later are watched from then; a glob with
wildcards in a folder gets no write watch (its files' writes would not be seen)."""

from __future__ import annotations

import os
import select

from agent.tail.watch import FolderWatch


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0.2)[0])


def test_a_write_in_a_watched_folder_wakes_until_seen(tmp_path):
    log = tmp_path / "app.log"
    log.write_bytes(b"")
    watch = FolderWatch([str(tmp_path / "*.log")], writes=True)
    try:
        assert watch.wake_fd >= 0
        assert not readable(watch.wake_fd) and not watch.writes_seen()
        with open(log, "ab") as f:
            for i in range(100):                   # a burst: the kernel merges the events
                f.write(b"line %d\n" % i)
                f.flush()
        assert readable(watch.wake_fd)
        assert watch.writes_seen()
        assert not readable(watch.wake_fd) and not watch.writes_seen()
        (tmp_path / "other.txt").write_bytes(b"x")  # the folder's: a wake-up, never a loss
        assert watch.writes_seen()
    finally:
        watch.stop()
    assert watch.wake_fd == -1


def test_a_folder_that_appears_later_is_watched_for_writes(tmp_path):
    later = tmp_path / "later"
    watch = FolderWatch([str(later / "*.log")], writes=True)
    try:
        assert watch.wake_fd >= 0 and not watch.consume()
        later.mkdir()
        assert watch.consume()                      # appeared: scanned, and watched
        fd = os.open(later / "a.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        watch.writes_seen()
        os.write(fd, b"x\n")
        os.close(fd)
        assert readable(watch.wake_fd) and watch.writes_seen()
    finally:
        watch.stop()


def test_no_write_watch_without_asking_or_with_wildcard_folders(tmp_path):
    (tmp_path / "a").mkdir()
    for patterns, writes in (([str(tmp_path / "*.log")], False),
                             ([str(tmp_path / "*" / "app.log")], True)):
        watch = FolderWatch(patterns, writes=writes)
        try:
            assert watch.wake_fd == -1 and not watch.writes_seen()
        finally:
            watch.stop()
