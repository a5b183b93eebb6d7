"""``docket-agent`` with a crash point in its transactions (``broker.delivery =
"exactly_once"``), for tests/faults/test_exactly_once.py: the process SIGKILLs itself at a
named step of a transaction, deterministically, as a kill from outside could only by chance.

``DOCKET_TEST_CRASH_AT="<step>:<n>"``: die at the n-th time the drain reaches ``<step>``
(``txn:produced``, ``txn:before_commit``, ``txn:committed``, ``txn:freed``; see
agent/drain/transact.py). ``DOCKET_TEST_CRASH_HANDSHAKE=<folder>``: instead of dying at once,
write ``<folder>/at-step``, wait for ``<folder>/go`` (the test pauses the broker meanwhile), go
on into the step, and die ``DOCKET_TEST_CRASH_DELAY_S`` later: the commit's request is then
written to a broker that does not answer before the process is gone ("during the commit").
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.cli import main  # noqa: E402
from agent.service import Seams  # noqa: E402


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_point() -> callable:
    step, nth = os.environ["DOCKET_TEST_CRASH_AT"].rsplit(":", 1)
    handshake = os.environ.get("DOCKET_TEST_CRASH_HANDSHAKE")
    delay = float(os.environ.get("DOCKET_TEST_CRASH_DELAY_S", "1"))
    seen = {"n": 0}

    def at(name: str) -> None:
        if name != step:
            return
        seen["n"] += 1
        if seen["n"] != int(nth):
            return
        print(f"crash point {name} reached ({nth})", flush=True)
        if handshake is None:
            _die()
        folder = Path(handshake)
        (folder / "at-step").write_text(name)
        while not (folder / "go").exists():
            time.sleep(0.01)
        threading.Timer(delay, _die).start()

    return at


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], seams=Seams(txn_crash_point=crash_point())))
