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


def test_a_file_created_moved_or_deleted_is_a_change_that_asks_for_a_scan(tmp_path):
    """The write watch is the folder watch too: no watchdog observer runs beside it, and a
    file created, renamed or deleted in a watched folder wakes the loop and sets ``changed``
    (the loop scans at once); a plain write does not."""
    log = tmp_path / "app.log"
    log.write_bytes(b"")
    watch = FolderWatch([str(tmp_path / "*.log")], writes=True)
    try:
        assert watch.observer is None and watch.covers_all()
        with open(log, "ab") as f:
            f.write(b"x\n")
        assert watch.writes_seen() and not watch.pending() and not watch.consume()
        for change in (lambda: (tmp_path / "new.log").write_bytes(b""),
                       lambda: log.rename(tmp_path / "app.log.1"),
                       lambda: (tmp_path / "app.log.1").unlink()):
            change()
            assert readable(watch.wake_fd)
            assert watch.writes_seen() and watch.pending()
            assert watch.consume() and not watch.pending()
    finally:
        watch.stop()


def test_a_folder_deleted_and_made_again_is_watched_again(tmp_path):
    """Its watch ends with it (the kernel's IN_IGNORED): the folder is awaited again, and once
    back its writes wake the loop as before, without a reload."""
    folder = tmp_path / "logs"
    folder.mkdir()
    watch = FolderWatch([str(folder / "*.log")], writes=True)
    try:
        folder.rmdir()
        assert readable(watch.wake_fd) and watch.writes_seen()
        assert watch.missing == [folder] and not watch.covers_all()
        folder.mkdir()
        assert watch.consume() and watch.covers_all()
        watch.writes_seen()
        (folder / "a.log").write_bytes(b"back\n")
        assert readable(watch.wake_fd) and watch.writes_seen()
    finally:
        watch.stop()


def test_without_the_write_watch_the_observer_watches_the_folders(tmp_path):
    """A glob with wildcards in a folder: the watchdog observer serves instead."""
    (tmp_path / "a").mkdir()
    watch = FolderWatch([str(tmp_path / "*" / "app.log")], writes=True)
    try:
        assert watch.wake_fd == -1 and watch.observer is not None and not watch.covers_all()
    finally:
        watch.stop()
