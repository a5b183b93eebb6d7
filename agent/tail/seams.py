"""The file source's only contact with the file system and with time, so tests can replace both.

``FsOps`` is the real implementation. A test subclasses it to run a writer between any two of
the source's calls (a rename between ``stat`` and ``open``, a truncation between a read and its
check) or to stop there as a SIGKILL would (``agent.buffer.seams.SimulatedCrash``). The clock is
the pool's (``agent.buffer.seams.Clock``): monotonic for waits and deadlines, wall time for the
read time of events.

A gzip, xz or bzip2 file is opened as its decompressed bytes (``compressed.Decompressed``):
every read and size the source asks for is of what the file decompresses to, so its content is
told apart, matched to the generation it is a copy of and read from an offset exactly as a plain
file's is (``compression`` says which files these are). A file too short yet to tell is looked
at again until it can be told.
"""

from __future__ import annotations

import glob
import os

from . import compressed


class FsOps:
    def glob(self, pattern: str) -> list[str]:
        return sorted(glob.glob(pattern))

    def listdir(self, folder: str) -> list[str]:
        try:
            with os.scandir(folder) as it:
                return sorted(entry.path for entry in it)
        except OSError:
            return []

    def stat(self, path: str) -> os.stat_result:
        return os.stat(path)            # follows symlinks: identity is the target's

    def open(self, path: str) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._undecided().add(fd)
        return fd

    def fstat(self, fd: int) -> os.stat_result:
        st = os.fstat(fd)
        view = self._view(fd)
        if view is None:
            return st
        fields = list(st)
        fields[6] = view.size()                       # st_size
        return os.stat_result(fields)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        view = self._view(fd)
        return os.pread(fd, n, offset) if view is None else view.pread(n, offset)

    def close(self, fd: int) -> None:
        self._views().pop(fd, None)
        self._undecided().discard(fd)
        os.close(fd)

    def compression(self, fd: int) -> str | None:
        """The compressor whose output ``fd`` is read decompressed from, or None."""
        view = self._view(fd)
        return None if view is None else view.kind

    def compressing(self, fd: int) -> bool:
        """Whether ``fd`` is a compressed file that does not yet end with a whole stream
        (``Decompressed.whole``): its compressor may still be writing it."""
        view = self._view(fd)
        return view is not None and not view.whole()

    # (A test's subclass need not call __init__: the tables are made on first use.)
    def _views(self) -> dict[int, compressed.Decompressed]:
        return self.__dict__.setdefault("_decompressed", {})

    def _undecided(self) -> set[int]:
        return self.__dict__.setdefault("_fds_undecided", set())

    def _view(self, fd: int) -> compressed.Decompressed | None:
        undecided = self._undecided()
        if fd in undecided:
            head = os.pread(fd, compressed.HEAD_BYTES, 0)
            found = compressed.kind(head)
            if found in compressed.READABLE:
                self._views()[fd] = compressed.Decompressed(fd, found)
                undecided.discard(fd)
            elif found != compressed.MAYBE and head:
                undecided.discard(fd)                 # plain
        return self._views().get(fd)

    def mount_points(self) -> set[str]:
        """The mount points ``/etc/fstab`` declares (a folder whose file system may be mounted
        after the agent starts)."""
        try:
            with open("/etc/fstab") as f:
                lines = f.read().splitlines()
        except OSError:
            return set()
        out = set()
        for line in lines:
            fields = line.split()
            if len(fields) >= 2 and not fields[0].startswith("#"):
                out.add(fields[1].replace("\\040", " ").rstrip("/") or "/")
        return out
