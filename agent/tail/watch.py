"""Wake the agent's loop when something happens in a tailed folder.

One inotify instance of the agent's own (``WriteWatch``) asks for writes (IN_MODIFY) and for
files created, moved or deleted in the folder of every glob. No thread reads it: the loop
sleeps on its descriptor (``wake_fd``) beside librdkafka's reports, and empties it
(``writes_seen``) before it reads the files. A write ends the sleep, and the file is read at
once; a file or folder that appears, moves or vanishes sets ``changed`` too, and the loop scans
at once instead of at its next poll. The kernel merges a file's writes into one queued event
until they are read: a burst costs one wake-up, not one per write. A truncation
(copytruncate) is found by the read itself. Polling every ``poll_interval_ms`` stays behind
the events.

Where that watch cannot serve — a glob with wildcards in a folder (its files' writes would not
be seen), or no inotify instance or watch left — a watchdog observer (inotify on Linux, in
threads of its own) watches the folders for files created, moved or deleted, and the loop
looks at its files every 2 ms; when the observer cannot start either (an unsupported file
system), the agent runs on polling alone and says so. A folder that does not exist yet (an
agent started at boot before its application) is looked for at every ``consume`` and watched
from when it appears.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import select
import struct
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
IN_MOVED_FROM, IN_MOVED_TO, IN_CREATE, IN_DELETE = 0x040, 0x080, 0x100, 0x200
IN_Q_OVERFLOW, IN_IGNORED = 0x4000, 0x8000       # events lost; a folder's watch gone
CHANGES = IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_Q_OVERFLOW | IN_IGNORED
IN_NONBLOCK, IN_CLOEXEC = os.O_NONBLOCK, os.O_CLOEXEC
EVENT = struct.Struct("iIII")                    # struct inotify_event, before its name


class WriteWatch:
    """An inotify instance asking for writes and for files created, moved or deleted in some
    folders, read by nobody but ``seen``: its descriptor tells a sleeping loop that a file
    there was written or a folder changed."""

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        self._add = libc.inotify_add_watch
        self._add.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
        self.fd = fd
        self.folders: dict[int, Path] = {}      # watch descriptor -> folder
        self.gone: list[Path] = []              # folders whose watch ended (deleted, moved)
        self.paths: set[str] = set()            # files written since ``seen`` was last asked
        self.overflowed = False                 # events were lost: which files is unknown

    def add(self, folder: Path) -> None:
        wd = self._add(self.fd, os.fsencode(folder), IN_MODIFY | CHANGES)
        if wd < 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(folder))
        self.folders[wd] = folder

    def seen(self) -> tuple[bool, bool]:
        """Empty the queue: (a file was written, a file or folder appeared, moved or vanished
        — or events were lost), since the last call."""
        written = changed = False
        while True:
            try:
                buf = os.read(self.fd, 65536)
            except BlockingIOError:
                return written, changed
            except OSError as exc:
                if exc.errno == errno.EINTR:
                    continue
                raise
            pos = 0
            while pos + EVENT.size <= len(buf):
                wd, mask, _cookie, name_len = EVENT.unpack_from(buf, pos)
                name = buf[pos + EVENT.size:pos + EVENT.size + name_len].rstrip(b"\0")
                pos += EVENT.size + name_len
                if mask & IN_MODIFY:
                    written = True
                    folder = self.folders.get(wd)
                    if folder is not None and name:
                        self.paths.add(os.path.join(folder, os.fsdecode(name)))
                self.overflowed |= bool(mask & IN_Q_OVERFLOW)
                changed |= bool(mask & CHANGES)
                if mask & IN_IGNORED and wd in self.folders:
                    self.gone.append(self.folders.pop(wd))

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class FolderWatch:
    """The folders of some globs, watched (``writes``: with the write watch where it can
    serve, else with a watchdog observer; without ``writes``: with the observer alone)."""

    def __init__(self, patterns: list[str], writes: bool = False):
        self.changed = threading.Event()
        self.observer = None
        self.writes: WriteWatch | None = None
        self.handler = _Wake(self.changed)
        self.folders = sorted({glob_folder(p) for p in patterns})
        self.missing = [f for f in self.folders if not f.is_dir()]
        for folder in self.missing:
            log.warning("folder %s does not exist yet; watched until it appears", folder)
        if not self.folders:
            return
        if writes and any(glob_folder(p) != Path(p).parent for p in patterns):
            log.info("a glob with wildcards in a folder: files are looked at every 2 ms")
        elif writes:
            try:
                self.writes = WriteWatch()
            except OSError as exc:
                log.warning("write events unavailable (%s): files are looked at every 2 ms", exc)
            for folder in self.folders:
                if folder not in self.missing:
                    self._watch_writes(folder)
        if self.writes is None:
            self._start_observer()

    def _start_observer(self) -> None:
        """The watchdog observer, for every folder present (once)."""
        if self.observer is not None:
            return
        try:
            observer = Observer()
            for folder in self.folders:
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

    def pending(self) -> bool:
        """A change seen and not yet consumed (the loop scans at its next turn)."""
        return self.changed.is_set()

    @property
    def wake_fd(self) -> int:
        """The write watch's descriptor, -1 without one."""
        return self.writes.fd if self.writes is not None else -1

    def writes_waiting(self) -> bool:
        """Events wait in the write watch (nothing is read from it)."""
        if self.writes is None:
            return False
        return bool(select.select([self.writes.fd], [], [], 0)[0])

    def written_paths(self) -> set[str] | None:
        """The files written since the last call, by path (as the watched folder names them),
        when the write watch sees every folder and lost no event; else None (any file may
        have been written)."""
        w = self.writes
        if w is None or not self.covers_all() or w.overflowed:
            if w is not None:
                w.paths.clear()
                w.overflowed = False
            return None
        paths, w.paths = w.paths, set()
        return paths

    def writes_seen(self) -> bool:
        """Empty the write watch (before the files are read); True if it had events. A file
        or folder created, moved or deleted among them sets ``changed``."""
        if self.writes is None:
            return False
        written, changed = self.writes.seen()
        for folder in self.writes.gone:          # deleted or moved: watched again when back
            log.info("folder %s went away; watched again when it reappears", folder)
            if folder not in self.missing:
                self.missing.append(folder)
        self.writes.gone.clear()
        if changed:
            self.changed.set()
        return written or changed

    def covers_all(self) -> bool:
        """Every folder has the write watch: writes and changes wake the loop, and polling
        is only a safety net (the service polls less often)."""
        return self.writes is not None and not self.missing

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
            self._start_observer()

    def stop(self) -> None:
        if self.observer is not None:
            self.observer.stop()
            self.observer.join(timeout=5)
        if self.writes is not None:
            self.writes.close()
            self.writes = None
