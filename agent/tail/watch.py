"""Wake the agent's loop when something happens in a tailed folder.

A watchdog observer (inotify on Linux) watches the folder of every glob; any create, modify,
move or delete sets ``changed``, and the loop scans at once instead of at its next poll. Polling
every ``poll_interval_ms`` stays the fallback: when the observer cannot start (no inotify
instances left, an unsupported file system), the agent runs on polling alone and says so.
"""

from __future__ import annotations

import glob
import logging
import threading
from pathlib import Path

from watchdog.events import FileSystemEventHandler
from watchdog.observers import Observer

log = logging.getLogger("docket.agent.watch")


class _Wake(FileSystemEventHandler):
    def __init__(self, changed: threading.Event):
        self.changed = changed

    def on_any_event(self, event) -> None:
        self.changed.set()


def glob_folder(pattern: str) -> Path:
    folder = Path(pattern).parent
    while glob.has_magic(str(folder)):
        folder = folder.parent
    return folder


class FolderWatch:
    def __init__(self, patterns: list[str]):
        self.changed = threading.Event()
        self.observer = None
        folders = sorted({glob_folder(p) for p in patterns})
        if not folders:
            return
        try:
            observer = Observer()
            handler = _Wake(self.changed)
            for folder in folders:
                observer.schedule(handler, str(folder), recursive=False)
            observer.daemon = True
            observer.start()
            self.observer = observer
        except OSError as exc:
            log.warning("file events unavailable (%s): polling only", exc)

    def consume(self) -> bool:
        """True once after any event since the last call."""
        if self.changed.is_set():
            self.changed.clear()
            return True
        return False

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=5)
