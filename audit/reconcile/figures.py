"""The plain figures (``Store.plain_windows``) of the windows an evaluation judges, read in a
process of its own while the evaluation judges and stores the batch before.

In a thread of the reconciler the read was as fast, but the two connections, sharing one
process, slowed each other inside SQLite: the verdicts' inserts took 2.5 times as long beside
the reading thread as alone (docs/reconcile.md, "Measured here").

``python -m audit.reconcile.figures DB`` reads batches of windows from stdin, one JSON array of
[topic, window_start] per line, and writes each batch's figures to stdout, one line each, in the
same order: the text ``Store.plain_figures_text`` returns. It ends at the end of its input.
``FiguresProcess`` is the reconciler's side.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from .store import Store

log = logging.getLogger("docket.audit.reconcile")


class FiguresProcess:
    """A reading process for ``batches``, all sent to it at once by a thread of ours (the
    process reads ahead of the evaluation as far as the pipe back holds). ``next_text()``
    returns the next batch's figures; ``None`` when the process ended before giving them
    (killed, or failed: its error is on our stderr), and the caller reads them itself."""

    def __init__(self, path: Path, batches: list[list[tuple[str, int]]]):
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parents[2])        # where ``audit`` is
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "audit.reconcile.figures", str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self._sender = threading.Thread(target=self._send, args=(batches,),
                                        name="docket-figures-send", daemon=True)
        self._sender.start()

    def _send(self, batches: list[list[tuple[str, int]]]) -> None:
        try:
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


def main(argv: list[str] | None = None) -> int:
    [path] = argv if argv is not None else sys.argv[1:]
    store = Store(path, readonly=True)
    out = sys.stdout.buffer
    try:
        for line in sys.stdin.buffer:
            windows = [(topic, window_start) for topic, window_start in json.loads(line)]
            out.write(store.plain_figures_text(windows).encode() + b"\n")
            out.flush()
    except BrokenPipeError:                   # the reconciler stopped reading: its choice
        pass
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
