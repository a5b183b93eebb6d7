"""The pool's msync lets go of the GIL: the sealing thread syncs a slot while the loop and the
listeners' readers go on (``mmap.flush`` holds the GIL for as long as the disk takes: every
other thread of the agent stood still meanwhile)."""

from __future__ import annotations

import mmap
import os
import threading
import time

import pytest

from agent.buffer.seams import FileOps, msync


def _sync_while_counting(path, mb: int, sync) -> tuple[float, float]:
    """(how long ``sync`` of ``mb`` MiB of dirty pages took, the longest another thread went
    without running meanwhile)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, mb << 20)
        mm = mmap.mmap(fd, mb << 20)
        mm.write(b"x" * (mb << 20))
        stamps: list[float] = []
        stop = threading.Event()

        def count():
            while not stop.is_set():
                stamps.append(time.monotonic())

        counter = threading.Thread(target=count)
        counter.start()
        time.sleep(0.05)
        t0 = time.monotonic()
        sync(mm)
        t1 = time.monotonic()
        stop.set()
        counter.join()
        mm.close()
    finally:
        os.close(fd)
        os.unlink(path)
    inside = [s for s in stamps if t0 <= s <= t1]
    return t1 - t0, max(b - a for a, b in zip([t0, *inside], [*inside, t1], strict=True))


def test_other_threads_run_while_a_slot_is_synced(tmp_path):
    for mb in (64, 128, 256):
        took, gap = _sync_while_counting(tmp_path / "pool", mb, lambda mm: msync(mm, 0, len(mm)))
        if took >= 0.04:
            break
    else:
        pytest.skip(f"syncing {mb} MiB took {took * 1000:.1f} ms here: too fast to tell")
    assert gap < took / 2, (took, gap)


def test_a_sync_reaches_the_file_and_a_bad_range_is_an_error(tmp_path):
    path = tmp_path / "pool"
    with open(path, "wb") as f:
        f.truncate(1 << 20)
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 1 << 20)
        mm[5000:5005] = b"hello"
        FileOps().msync(mm, 4999, 10)           # rounded down to its page, as the pool asks
        with pytest.raises(OSError):
            msync(mm, 1, 10)                   # not a page's start
        mm.close()
    assert path.read_bytes()[5000:5005] == b"hello"
