"""The file source's only contact with the file system and with time, so tests can replace both.

``FsOps`` is the real implementation. A test subclasses it to run a writer between any two of
the source's calls (a rename between ``stat`` and ``open``, a truncation between a read and its
check) or to stop there as a SIGKILL would (``agent.buffer.seams.SimulatedCrash``). The clock is
the pool's (``agent.buffer.seams.Clock``): monotonic for waits and deadlines, wall time for the
read time of events.
"""

from __future__ import annotations

import glob
import os


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
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def fstat(self, fd: int) -> os.stat_result:
        return os.fstat(fd)

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return os.pread(fd, n, offset)

    def close(self, fd: int) -> None:
        os.close(fd)

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
