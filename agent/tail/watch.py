"""Wake the agent's loop when something happens in a tailed folder.

A watchdog observer (inotify on Linux) watches the folder of every glob; a file or folder
created, moved or deleted sets ``changed``, and the loop scans at once instead of at its next
poll. Writes to a file are not watched (inotify is asked for no IN_MODIFY): the loop reads every
open file each turn, and it finds a truncation (copytruncate) by the read itself; an event per
write cost the agent at 1,000 lines/s a fifth of its CPU in the observer's threads. Polling
every ``poll_interval_ms`` stays the fallback: when the observer cannot start (no inotify
instances left, an unsupported file system), the agent runs on polling alone and says so. A
folder that does not exist yet (an agent started at boot before its application) is looked for
at every ``consume`` and watched from when it appears.
"""

from __future__ import annotations

import logging
import threading

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileMovedEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from ..globs import glob_folder

log = logging.getLogger("docket.agent.watch")

# What a scan may find new: files and folders appearing, moving, vanishing (no writes).
EVENTS = [FileCreatedEvent, FileDeletedEvent, FileMovedEvent, DirCreatedEvent, DirDeletedEvent,
          DirMovedEvent]


class _Wake(FileSystemEventHandler):
    def __init__(self, changed: threading.Event):
        self.changed = changed

    def on_any_event(self, event) -> None:
        self.changed.set()


class FolderWatch:
    def __init__(self, patterns: list[str]):
        self.changed = threading.Event()
        self.observer = None
        self.handler = _Wake(self.changed)
        folders = sorted({glob_folder(p) for p in patterns})
        self.missing = [f for f in folders if not f.is_dir()]
        for folder in self.missing:
            log.warning("folder %s does not exist yet; watched until it appears", folder)
        if not folders:
            return
        try:
            observer = Observer()
            for folder in folders:
                if folder not in self.missing:
                    observer.schedule(self.handler, str(folder), recursive=False,
                                      event_filter=EVENTS)
            observer.daemon = True
            observer.start()
            self.observer = observer
        except OSError as exc:
            log.warning("file events unavailable (%s): polling only", exc)

    def consume(self) -> bool:
        """True once after any event since the last call, or when a folder awaited appeared."""
        appeared = [f for f in self.missing if f.is_dir()]
        for folder in appeared:
            self.missing.remove(folder)
            log.info("folder %s appeared; reading its files", folder)
            if self.observer is not None:
                try:
                    self.observer.schedule(self.handler, str(folder), recursive=False,
                                           event_filter=EVENTS)
                except OSError as exc:
                    log.warning("file events unavailable for %s (%s): polling it", folder, exc)
        if appeared:
            self.changed.clear()
            return True
        if self.changed.is_set():
            self.changed.clear()
            return True
        return False

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=5)
