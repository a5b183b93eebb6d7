"""Append cost with a 5 GB backlog: does a pool holding 5 GB that Kafka has not acknowledged
(a long outage) append as fast as an empty one?

Prints one JSON line. A pool of 5.5 GiB in 1 MiB slots (sync_on_seal as the agent's default,
on) takes 100-byte lines in ~1 MB chunks, as the tail hands them over; nothing is freed, as
when the cluster is unreachable. Figures:
- empty_mb_s: append (framing and seals) of the first 200 MB, the pool otherwise empty;
- backlog_mb_s: append of 200 MB more once 5 GB are held (sealed, never freed);
- ratio = backlog_mb_s / empty_mb_s (target >= 0.9: append is O(1) in the backlog; both are
  measured in the same run, 20 s apart, on a shared machine), each after ``os.sync()``: the
  5 GB just written leave the kernel throttling writers until its dirty pages are on disk
  (measured without the sync: ratios of 0.25–0.80), a cost of the disk, not of the pool;
- empty/backlog_user_cpu_us_per_mb and cpu_ratio: the process's user CPU per MB appended, the
  pool's own work; and the system CPU per MB (page faults, msync, madvise: the kernel's).
- rss_mb_at_5gb: the process's resident memory with 5 GB held (the pool releases the pages of
  slots waiting beyond the next few, so it stays flat), and its peak.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.buffer import BufferPool, Chunk  # noqa: E402
from tests.bench.bench_buffer import LINE, chunk_bytes  # noqa: E402

MEASURE_CHUNKS = 200            # 200 MB per measurement
BACKLOG_BYTES = 5 * 10**9
POOL_BYTES = 5632 << 20         # 5.5 GiB


def chunk() -> Chunk:
    return Chunk.from_lines(np.frombuffer(chunk_bytes(), np.uint8), 1_763_766_000_000)


def append(pool: BufferPool, c: Chunk, n: int) -> tuple[float, float, float]:
    """``n`` appends of ``c``: (MB/s, user CPU µs per MB: the pool's own work, system CPU µs
    per MB: page faults, msync, madvise)."""
    r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(n):
        assert pool.append("bench", c, source=1).complete(c)
    elapsed, r1 = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF)
    mb = n * len(c.data) / 1e6
    return (mb / elapsed, (r1.ru_utime - r0.ru_utime) / mb * 1e6,
            (r1.ru_stime - r0.ru_stime) / mb * 1e6)


def measured(pool: BufferPool, c: Chunk) -> tuple[float, float, float]:
    """``append`` of MEASURE_CHUNKS, the kernel's dirty pages written out first: 5 GB just
    written through the map leave the page cache throttling every writer (balance_dirty_pages)
    for a while, which is the disk's cost, not the pool's."""
    os.sync()
    return append(pool, c, MEASURE_CHUNKS)


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    c = chunk()
    with tempfile.TemporaryDirectory(prefix="bench-backlog-") as d:
        pool = BufferPool(Path(d) / "pool", POOL_BYTES, 1 << 20, linger_ms=1e9,
                          sync_on_seal=True)
        empty, empty_cpu, empty_sys = measured(pool, c)
        while pool.stats()["sealed_slots"] * (1 << 20) < BACKLOG_BYTES:
            append(pool, c, 100)
        held = pool.stats()["sealed_slots"]
        rss = rss_mb()
        backlog, backlog_cpu, backlog_sys = measured(pool, c)
        pool.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({
        "bench": "pool_append_with_backlog",
        "line_bytes": LINE, "chunk_bytes": len(c.data), "pool_bytes": POOL_BYTES,
        "backlog_slots_held": held, "backlog_bytes_held": held << 20,
        "empty_mb_s": round(empty), "backlog_mb_s": round(backlog),
        "ratio": round(backlog / empty, 3),
        "empty_user_cpu_us_per_mb": round(empty_cpu),
        "backlog_user_cpu_us_per_mb": round(backlog_cpu),
        "cpu_ratio": round(backlog_cpu / empty_cpu, 3),
        "empty_sys_cpu_us_per_mb": round(empty_sys),
        "backlog_sys_cpu_us_per_mb": round(backlog_sys),
        "rss_mb_at_5gb": round(rss, 1), "peak_rss_mb": round(peak, 1),
        "targets": {"ratio": 0.9, "cpu_ratio_at_most": 1.1},
    }))


if __name__ == "__main__":
    main()
