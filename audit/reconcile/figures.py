"""The plain figures (``Store.plain_windows``) of the windows an evaluation judges, read in a
process of its own while the evaluation judges and stores the batch before.

In a thread of the reconciler the read was as fast, but the two connections, sharing one
process, slowed each other inside SQLite: the verdicts' inserts took 2.5 times as long beside
the reading thread as alone (docs/reconcile.md, "Measured here").

``python -m audit.reconcile.figures DB`` reads from stdin, one JSON text per line, the query
(the reconciler's own ``PLAIN_QUERY``: a process started from files a package upgrade replaced
still runs the query its reconciler parses), then batches of windows, each an array of
[topic, window_start], and writes each batch's figures to stdout, one line each, in the same
order: the text ``Store.plain_figures_text`` returns. It ends at the end of its input, or when
its output is closed; it ignores SIGINT and SIGTERM, which reach it with its reconciler (a
terminal's Ctrl-C, systemd's stop): the reconciler ends it.
``FiguresProcess`` is the reconciler's side. The process imports nothing but the standard
library (``store`` brings sqlite-utils, and with it pandas: 0.7 s a start).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

# Per window of a JSON array of [topic, window_start]: rows; (tier, origin) pairs (length-
# prefixed; were two pairs ever one text, pairs would fall short of rows: not plain, judged
# from the records); (origin, count, checksum) triples (count and checksum hold no '|'); rows
# whose distinct is not their count or that say duplicates; whether a producer row journalled
# a loss of unknown size; the producer's rows, count and known drops; the window lengths. One
# JSON array of them all: one step of SQLite. An aggregate per window rather than one GROUP BY
# of the batch: the join's rows are not sorted through a temporary B-tree (a fifth faster).
# (``json(…)``: a subquery's value loses its JSON subtype in SQLite 3.54, and would be nested as
# a string.)
PLAIN_QUERY = """
SELECT json_group_array(json_array(json_extract(w.value, '$[0]'), json_extract(w.value, '$[1]'),
    json((SELECT json_array(count(*),
        count(DISTINCT length(c.tier) || ':' || c.tier || c.origin),
        count(DISTINCT c.origin || '|' || c.count || '|' || c.checksum),
        sum(c.distinct_count IS NOT c.count OR c.duplicates IS NOT 0),
        max(c.dropped_unknown != '{}'), sum(c.tier = 'producer'),
        sum(CASE WHEN c.tier = 'producer' THEN c.count END),
        sum(CASE WHEN c.tier = 'producer' THEN c.dropped END),
        min(c.window_ms), max(c.window_ms))
    FROM counts AS c
    WHERE c.window_start = json_extract(w.value, '$[1]')
        AND c.topic = json_extract(w.value, '$[0]')))))
FROM json_each(?) AS w
"""


class FiguresProcess:
    """A reading process for ``batches``, all sent to it at once by a thread of ours (the
    process reads ahead of the evaluation as far as the pipe back holds). ``next_text()``
    returns the next batch's figures; ``None`` when the process ended before giving them
    (killed, or failed: its error is on our stderr), and the caller reads them itself."""

    def __init__(self, path: Path, batches: list[list[tuple[str, int]]]):
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parents[2])        # where ``audit`` is
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(                 # -P: not the working directory first
            [sys.executable, "-P", "-m", "audit.reconcile.figures", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._sender = threading.Thread(target=self._send, args=(batches,),
                                        name="docket-figures-send", daemon=True)
        self._sender.start()

    def _send(self, batches: list[list[tuple[str, int]]]) -> None:
        try:
            self.proc.stdin.write(json.dumps(PLAIN_QUERY).encode() + b"\n")
            for batch in batches:
                self.proc.stdin.write(json.dumps(batch).encode() + b"\n")
            self.proc.stdin.close()
        except (BrokenPipeError, ValueError, OSError):
            pass                              # it ended (or was stopped): next_text says so

    def next_text(self) -> str | None:
        line = self.proc.stdout.readline()
        if not line.endswith(b"\n"):
            return None
        return line.decode()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._sender.join()
        self.proc.stdout.close()
        try:
            self.proc.stdin.close()
        except OSError:                           # what was left unsent
            pass


def read_only(path: Path) -> sqlite3.Connection:
    """A connection to the database at ``path`` that cannot write (``Store`` opened read-only
    uses it too), waiting up to 30 s for a writer's lock."""
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    conn.execute("PRAGMA busy_timeout = 30000")
    return conn


def main(argv: list[str] | None = None) -> int:
    [path] = argv if argv is not None else sys.argv[1:]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    conn = read_only(Path(path))
    lines, out = sys.stdin.buffer, sys.stdout.buffer
    try:
        query = json.loads(lines.readline() or "null")
        if query is None:
            return 0
        for line in lines:
            out.write(conn.execute(query, (line.decode(),)).fetchone()[0].encode() + b"\n")
            out.flush()
    except BrokenPipeError:                   # the reconciler stopped reading: its choice
        pass
    finally:
        conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
