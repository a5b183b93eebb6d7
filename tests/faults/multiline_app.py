"""An application logging events, some of them with a stack trace, to a file that logrotate
rotates with ``create`` and ``compress``.

Usage: python multiline_app.py DIR TOTAL EVENTS_PER_S

Writes TOTAL events to DIR/app.log, a hundredth of a second's events per write: event ``i``
is ``event(i)``, one INFO line, or for every tenth id a stack trace of 5 to 200 lines
(``rotating_writer.trace``). Each write opens whatever file is at DIR/app.log then, holding
``flock`` on DIR/app.lock: logrotate's ``postrotate`` takes the same lock, so once it returns no
write goes to the file rotated away, and ``compress`` gzips a file nobody writes any more (as
an application reopening its log on a signal). Prints "done TOTAL" at the end.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration"))

from rotating_writer import trace  # noqa: E402

TRACE_EVERY = 10


def event(i: int) -> bytes:
    """Event ``i`` as written (newline at the end): the same bytes for an id every time."""
    if i % TRACE_EVERY == 0:
        return trace(i)
    return b"id-%09d INFO [worker] app.Service - handled request %d in %d ms\n" % (i, i, i % 97)


def main() -> None:
    folder, total, rate = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    path = os.path.join(folder, "app.log")
    lock = os.open(os.path.join(folder, "app.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    batch = max(1, int(rate // 100))
    start = time.monotonic()
    written = 0
    while written < total:
        n = min(batch, total - written)
        data = b"".join(event(written + k) for k in range(n))
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        except FileNotFoundError:          # logrotate moved it and has not created the new one
            fcntl.flock(lock, fcntl.LOCK_UN)
            time.sleep(0.001)
            continue
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
            fcntl.flock(lock, fcntl.LOCK_UN)
        written += n
        ahead = written / rate - (time.monotonic() - start)
        if ahead > 0:
            time.sleep(ahead)
    print(f"done {written}", flush=True)


if __name__ == "__main__":
    main()
