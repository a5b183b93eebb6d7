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

Writes wake the loop another way, when its send path can wait on a descriptor (the native one,
``writes=True``): ``wake_fd`` is an inotify instance of the agent's own asking for IN_MODIFY in
the same folders, which no thread reads. The loop sleeps on it beside librdkafka's reports and
empties it (``writes_seen``) before it reads the files, so a later write to a file of a watched
folder ends the next sleep (writes elsewhere wait for the next look: docs/agent.md). The
kernel merges a file's writes into one queued event until they are read: a burst costs one
wake-up, not one per write. Without it (the Python path, or no inotify) the
loop looks at its files every 2 ms.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import threading
from pathlib import Path

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


IN_MODIFY = 0x00000002
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC


class WriteWatch:
    """An inotify instance asking for IN_MODIFY in some folders, read by nobody but
    ``seen``: its descriptor tells a sleeping loop that a file there was written."""

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.fd = fd

    def add(self, folder: Path) -> None:
        if self._add(self.fd, os.fsencode(folder), IN_MODIFY) < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(folder))

    def seen(self) -> bool:
        """Empty the queue; True if anything was written since the last call."""
        seen = False
        while True:
            try:
                seen |= bool(os.read(self.fd, 65536))
            except BlockingIOError:
                return seen
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FolderWatch:
    def __init__(self, patterns: list[str], writes: bool = False):
        self.changed = threading.Event()
        self.observer = None
        self.writes: WriteWatch | None = None
        self.handler = _Wake(self.changed)
        folders = sorted({glob_folder(p) for p in patterns})
        self.missing = [f for f in folders if not f.is_dir()]
        for folder in self.missing:
            log.warning("folder %s does not exist yet; watched until it appears", folder)
        if not folders:
            return
        if writes and any(glob_folder(p) != Path(p).parent for p in patterns):
            log.info("a glob with wildcards in a folder: files are looked at every 2 ms")
        elif writes:
            try:
                self.writes = WriteWatch()
            except OSError as exc:
                log.warning("write events unavailable (%s): files are looked at every 2 ms", exc)
            for folder in folders:
                if folder not in self.missing:
                    self._watch_writes(folder)
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
            self._watch_writes(folder)
        if appeared:
            self.changed.clear()
            return True
        if self.changed.is_set():
            self.changed.clear()
            return True
        return False

    @property
    def wake_fd(self) -> int:
        """The write watch's descriptor, -1 without one."""
        return self.writes.fd if self.writes is not None else -1

    def writes_seen(self) -> bool:
        """Empty the write watch (before the files are read); True if it had events."""
        return self.writes is not None and self.writes.seen()

    def _watch_writes(self, folder: Path) -> None:
        if self.writes is None:
            return
        try:
            self.writes.add(folder)
        except OSError as exc:
            log.warning("write events unavailable for %s (%s): files are looked at every "
                        "2 ms", folder, exc)
            self.writes.close()
            self.writes = None

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=5)
        if self.writes is not None:
            self.writes.close()
            self.writes = None
