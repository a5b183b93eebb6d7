"""The pool's only contact with time and the file system, so tests can replace both.

``FileOps`` is the real implementation. Tests subclass it to shrink the disk, fail an
allocation, or raise :class:`SimulatedCrash` at a named *crash point* — the pool calls
``ops.crash_point(name)`` between the steps whose order makes it crash-safe.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import time
from pathlib import Path

from .durable import sync_folder

# msync(2) called through ctypes, which lets go of the GIL for the call: ``mmap.flush`` holds it
# for as long as the disk takes (CPython 3.11), and every other thread of the agent — the loop,
# a listener's reader — stood still while the sealing thread synced (half the GIL's time in a
# syslog run, by py-spy --gil).
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_LIBC.msync.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.msync.restype = ctypes.c_int
MS_SYNC = 4                               # Linux's <sys/mman.h> (x86-64, arm64)


def msync(mm: mmap.mmap, start: int, length: int) -> None:
    """``mm.flush(start, length)`` (``start`` a page's) without holding the GIL meanwhile. The
    map must stay mapped until it returns: the pool unmaps only after its sealing thread ended
    (``BufferPool.close``), and a sync of a range no longer mapped fails (ENOMEM)."""
    try:
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))   # the export ends at once
    except TypeError:                                           # a read-only map: as before
        mm.flush(start, length)
        return
    if _LIBC.msync(base + start, length, MS_SYNC) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


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
        msync(mm, start, offset + length - start)

    def unmap(self, mm: mmap.mmap, offset: int, length: int) -> None:
        """Drop the process's mapping of ``length`` bytes from ``offset``, widened to whole
        pages of the system's size (a slot is aligned to 4 KiB, a kernel's page may be 16 or
        64 KiB): their contents stay in the page cache, dirty where they were written, and a
        later access maps them again from there (``MADV_DONTNEED`` on a shared file mapping:
        nothing is lost, nothing is written), a neighbour's pages in a widened page too."""
        start = offset - offset % mmap.PAGESIZE
        end = min(len(mm), -(-(offset + length) // mmap.PAGESIZE) * mmap.PAGESIZE)
        mm.madvise(mmap.MADV_DONTNEED, start, end - start)

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
