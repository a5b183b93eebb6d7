"""The folder watch of the file sources: a folder that does not exist when the agent starts
(at boot, before its application) is watched from when it appears."""

from __future__ import annotations

import time

from agent.tail.watch import FolderWatch


def _eventually(watch: FolderWatch, timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if watch.consume():
            return True
        time.sleep(0.02)
    return False


def test_a_folder_that_appears_later_is_reported_then_watched(tmp_path):
    later = tmp_path / "app"
    watch = FolderWatch([str(later / "*.log")])
    try:
        assert watch.missing == [later] and not watch.consume()
        later.mkdir()
        assert watch.consume(), "the folder's appearance must wake the loop"
        assert watch.missing == [] and not watch.consume()
        (later / "a.log").write_text("x\n")
        assert _eventually(watch), "a file written in the new folder must wake the loop"
    finally:
        watch.stop()


def test_existing_folders_are_watched_at_once(tmp_path):
    watch = FolderWatch([str(tmp_path / "*.log")])
    try:
        assert watch.missing == []
        (tmp_path / "b.log").write_text("y\n")
        assert _eventually(watch)
    finally:
        watch.stop()
