"""Append cost with a 5 GB backlog: does a pool holding 5 GB that Kafka has not acknowledged
(a long outage) append as fast as an empty one?

Prints one JSON line. A pool of 5.5 GiB in 1 MiB slots (sync_on_seal as the agent's default,
on) takes 100-byte lines in ~1 MB chunks, as the tail hands them over; nothing is freed, as
when the cluster is unreachable. Figures:
- empty_mb_s: append (framing and seals) of the first 200 MB, the pool otherwise empty;
- backlog_mb_s: append of 200 MB more once 5 GB are held (sealed, never freed);
- ratio = backlog_mb_s / empty_mb_s (target >= 0.9: append is O(1) in the backlog; both are
  measured in the same run, 20 s apart, on a shared machine);
- rss_mb_at_5gb: the process's resident memory with 5 GB held (the pool releases the pages of
  slots waiting beyond the next few, so it stays flat), and its peak.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.buffer import BufferPool, Chunk  # noqa: E402

LINE = 100
CHUNK_LINES = 10_000            # ~1 MB per append, as one read of the tail
MEASURE_CHUNKS = 200            # 200 MB per measurement
BACKLOG_BYTES = 5 * 10**9
POOL_BYTES = 5632 << 20         # 5.5 GiB


def chunk() -> Chunk:
    one = b"".join(b"%08d " % i + b"x" * (LINE - 10) + b"\n" for i in range(CHUNK_LINES))
    return Chunk.from_lines(np.frombuffer(one, np.uint8), 1_763_766_000_000)


def append(pool: BufferPool, c: Chunk, n: int) -> float:
    """MB/s of ``n`` appends of ``c``."""
    t = time.perf_counter()
    for _ in range(n):
        assert pool.append("bench", c, source=1).complete(c)
    return n * len(c.data) / (time.perf_counter() - t) / 1e6


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
        empty = append(pool, c, MEASURE_CHUNKS)
        while pool.stats()["sealed_slots"] * (1 << 20) < BACKLOG_BYTES:
            append(pool, c, 100)
        held = pool.stats()["sealed_slots"]
        rss = rss_mb()
        backlog = append(pool, c, MEASURE_CHUNKS)
        pool.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({
        "bench": "pool_append_with_backlog",
        "line_bytes": LINE, "chunk_bytes": len(c.data), "pool_bytes": POOL_BYTES,
        "backlog_slots_held": held, "backlog_bytes_held": held << 20,
        "empty_mb_s": round(empty), "backlog_mb_s": round(backlog),
        "ratio": round(backlog / empty, 3),
        "rss_mb_at_5gb": round(rss, 1), "peak_rss_mb": round(peak, 1),
        "targets": {"ratio": 0.9},
    }))


if __name__ == "__main__":
    main()
