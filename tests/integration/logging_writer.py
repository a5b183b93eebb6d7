"""An application logging through Python's own rotating handlers.

Usage: python logging_writer.py DIR TOTAL LINES_PER_S size|time

Logs TOTAL lines ``id-%09d <filler>`` (100 bytes with the newline) to DIR/app.log through
``logging.handlers.RotatingFileHandler`` (``size``: 1 MB, ``backupCount`` 16: app.log.1 …
app.log.16, the oldest deleted at each rollover) or ``TimedRotatingFileHandler`` (``time``:
every second, ``backupCount`` 8, dated names): at 20,000 lines/s a file lives about 8 s after
its rotation, longer than an agent stays down in the test, so what it was not read of is
still there when the agent is back. Neither handler ever truncates a file. Prints
"done TOTAL" at the end.
"""

from __future__ import annotations

import logging
import logging.handlers
import os
import sys
import time

LINE_BYTES = 100
BATCH = 200


def main() -> None:
    folder, total, rate, kind = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
    path = os.path.join(folder, "app.log")
    if kind == "size":
        handler = logging.handlers.RotatingFileHandler(path, maxBytes=1 << 20, backupCount=16)
    else:
        handler = logging.handlers.TimedRotatingFileHandler(path, when="S", interval=1,
                                                            backupCount=8)
    handler.setFormatter(logging.Formatter("%(message)s"))
    log = logging.getLogger("app")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
    start = time.monotonic()
    for i in range(total):
        head = f"id-{i:09d} "
        log.info(head + "x" * (LINE_BYTES - 1 - len(head)))
        if (i + 1) % BATCH == 0:
            ahead = (i + 1) / rate - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    handler.close()
    print(f"done {total}", flush=True)


if __name__ == "__main__":
    main()
