"""The pool's only contact with time and the file system, so tests can replace both.

``FileOps`` is the real implementation. Tests subclass it to shrink the disk, fail an
allocation, or raise :class:`SimulatedCrash` at a named *crash point* — the pool calls
``ops.crash_point(name)`` between the steps whose order makes it crash-safe.
"""

from __future__ import annotations

import errno
import mmap
import os
import time
from pathlib import Path

from .durable import sync_folder


class SimulatedCrash(BaseException):
    """Raised by a test's FileOps at a crash point. BaseException, so no handler swallows it."""


class Clock:
    def monotonic_ns(self) -> int:
        return time.monotonic_ns()

    def time_ms(self) -> int:
        """Wall time in ms: the read time given to events without one of their own."""
        return time.time_ns() // 1_000_000

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class FileOps:
    # Crash points, in the order a seal passes them.
    SEAL_POINTS = ("seal:before_header", "seal:before_state", "seal:after_state")

    def free_bytes(self, path: Path) -> int:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize

    def reserve(self, fd: int, size: int) -> None:
        """Give the file its full size, then reserve the blocks so later writes cannot ENOSPC."""
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            # The file system cannot reserve blocks; the pool stays sparse.

    def msync(self, mm: mmap.mmap, offset: int, length: int) -> None:
        start = offset - offset % mmap.PAGESIZE
        mm.flush(start, offset + length - start)

    def write_file(self, path: Path, data: bytes) -> None:
        """Write a whole file durably: temp file, fsync, rename, fsync the folder."""
        tmp = path.with_name(path.name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        sync_folder(path.parent)

    def crash_point(self, name: str) -> None:
        """Nothing happens here in production; a test's FileOps may raise SimulatedCrash."""
