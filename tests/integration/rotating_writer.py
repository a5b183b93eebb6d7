"""A log writer that rotates its own file, as an application under logrotate would.

Usage: python rotating_writer.py DIR TOTAL ROTATE_EVERY LINES_PER_S [FIRST_ID [TRACES]]

Writes TOTAL lines ``id-%09d <filler>`` (100 bytes with the newline) to DIR/app.log, 1,000 per
write call (below 10,000 lines/s, a hundredth of a second's lines per call: one line at a time at
100 lines/s, as a quiet application writes). Every ROTATE_EVERY lines it rotates, alternating:
- rename-and-create: app.log → app.log.K, then a new app.log;
- copytruncate: app.log copied to app.log.K, then app.log truncated to 0 (the writer keeps
  its O_APPEND descriptor, so the next line lands at offset 0).
The writer rotates between its own writes, so no line falls between copy and truncate.
LINES_PER_S = 0 writes as fast as it can. Prints "done TOTAL" at the end.

With TRACES = 1 each of the TOTAL "lines" is an event of 5 to 200 lines instead, as Logback
writes an exception: its first line ``id-%09d ERROR ...``, then ``java.lang.IllegalStateException
...``, frames (``\tat ...``), ``Caused by: ...`` and ``\t... N more`` (``trace(i)``: the same
bytes for an id every time, so a reader can check that each record is its event, whole);
ROTATE_EVERY and LINES_PER_S then count events.
"""

from __future__ import annotations

import os
import shutil
import sys
import time

LINE_BYTES = 100
BATCH = 1000


def line(i: int) -> bytes:
    head = b"id-%09d " % i
    return head + b"x" * (LINE_BYTES - 1 - len(head)) + b"\n"


def trace(i: int) -> bytes:
    """Event ``i`` as a multiline stack trace of 5 to 200 lines (newline at the end)."""
    frames = (i * 7919) % 196 + 1
    out = [b"id-%09d ERROR [worker] app.Service - request failed" % i,
           b"java.lang.IllegalStateException: request %d" % i]
    out += [b"\tat app.layer%d.Handler.handle(Handler.java:%d)" % (k, k + 10)
            for k in range(frames)]
    out += [b"Caused by: java.io.IOException: closed", b"\t... %d more" % frames]
    return b"\n".join(out) + b"\n"


def main() -> None:
    folder, total, every, rate = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
        float(sys.argv[4])
    first = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    make = trace if len(sys.argv) > 6 and sys.argv[6] == "1" else line
    path = os.path.join(folder, "app.log")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    start = time.monotonic()
    rotation = 0
    written = 0
    batch = BATCH if rate <= 0 or rate >= 10_000 else max(1, int(rate // 100))
    while written < total:
        n = min(batch, total - written, every - written % every)
        os.write(fd, b"".join(make(first + written + k) for k in range(n)))
        written += n
        if written % every == 0 and written < total:
            rotation += 1
            rotated = f"{path}.{rotation}"
            if rotation % 2:
                os.close(fd)
                os.rename(path, rotated)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            else:
                shutil.copyfile(path, rotated)
                os.truncate(path, 0)
        if rate > 0:
            ahead = written / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    os.close(fd)
    print(f"done {written}", flush=True)


if __name__ == "__main__":
    main()
