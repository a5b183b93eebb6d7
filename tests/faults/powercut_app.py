"""The application of ``faults/test_power_cut_fs.py``: lines ``id-NNNNNNNNN ...`` at a steady
rate into ``LOGS/app.log`` in batches every 10 ms, the log synced every ``SYNC_MS`` (and before a
rotation), renamed to ``app.log.K`` and started again every ``ROTATE_EVERY`` lines. A new log's
name (and the rename before it) is made durable by syncing the folder only ``FOLDER_SYNC_S``
after it was made (or at the next rotation, if sooner): until then a file system that forgets
names may take the new file, synced lines and all, and the lines in it are never noted synced.

Before each batch it notes ``w FIRST END`` in ``SIDE`` (a file on the host's own disk, which a
power cut of the test's file system does not touch), and ``s END`` once the log is synced
through it: after a cut, lines noted written but not synced may be gone with the log's unsynced
tail; every other line must reach Kafka. A restart goes on from the last id noted written, so
a lost tail's ids are never written again with other content.

    python powercut_app.py LOGS SIDE RATE TOTAL ROTATE_EVERY SYNC_MS
"""

from __future__ import annotations

import hashlib
import os
import sys
import time

FOLDER_SYNC_S = 1.0


def line(i: int) -> bytes:
    return b"id-%09d %s\n" % (i, hashlib.sha256(b"%d" % i).hexdigest()[:40].encode())


def resume(side: str) -> tuple[int, int]:
    """(the next id, the next rotation number) after what ``side`` says was written."""
    nxt, rotations = 0, 0
    try:
        with open(side) as f:
            for entry in f:
                parts = entry.split()
                if len(parts) == 3 and parts[0] == "w":
                    nxt = max(nxt, int(parts[2]))
                elif len(parts) == 2 and parts[0] == "r":
                    rotations = max(rotations, int(parts[1]))
    except FileNotFoundError:
        pass
    return nxt, rotations


def _opened(app: str) -> int:
    return os.open(app, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def main() -> None:
    logs, side, rate, total, rotate_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), \
        int(sys.argv[4]), int(sys.argv[5])
    sync_s = int(sys.argv[6]) / 1000
    app = os.path.join(logs, "app.log")
    i, rotations = resume(side)
    notes = open(side, "a", buffering=1)
    named = os.path.exists(app)         # after a cut, what is there is durable
    fd = _opened(app)
    folder = os.open(logs, os.O_RDONLY | os.O_DIRECTORY)
    start, first = time.monotonic(), i
    synced_at = made_at = start
    while i < total:
        due = min(total, first + int((time.monotonic() - start) * rate) + 1)
        if due > i:
            end = min(due, (i // rotate_every + 1) * rotate_every)
            notes.write(f"w {i} {end}\n")
            os.write(fd, b"".join(line(k) for k in range(i, end)))
            i = end
            rotating = i % rotate_every == 0 and i < total
            if rotating or time.monotonic() - synced_at >= sync_s:
                os.fsync(fd)
                if not named and (rotating or time.monotonic() - made_at >= FOLDER_SYNC_S):
                    os.fsync(folder)
                    named = True
                if named:
                    notes.write(f"s {end}\n")
                synced_at = time.monotonic()
            if rotating:
                rotations += 1
                notes.write(f"r {rotations}\n")         # before: a name is never used twice
                os.rename(app, f"{app}.{rotations}")
                os.close(fd)
                fd = _opened(app)
                named, made_at = False, time.monotonic()
        time.sleep(0.01)
    os.close(fd)
    os.close(folder)


if __name__ == "__main__":
    main()
