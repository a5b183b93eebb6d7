"""``make soak``'s lowest priority for the long runs beside the pause matrix
(``tests/run_groups.keep_nice``): a process a test starts in a session of its own — as the
brokers, agents and Spark JVMs are — is held at the nice, its own and its session's autogroup's
(where the kernel has autogroups, a nice weighs only within one)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from tests import run_groups


def wait_until(check, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def _nice(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def test_a_process_in_a_session_of_its_own_below_the_group_is_held_at_its_nice():
    # a parent (the group's pytest) whose child starts a session of its own (a test's broker)
    parent = subprocess.Popen(
        [sys.executable, "-c", "import subprocess, sys; subprocess.Popen(['sleep', '60'], "
         "start_new_session=True).wait()"], start_new_session=True)
    stop = threading.Event()
    try:
        wait_until(lambda: len(run_groups._descendants(parent.pid)) == 2, timeout=10)
        child = run_groups._descendants(parent.pid)[1]
        threading.Thread(target=run_groups.keep_nice, args=(parent.pid, 19, stop, 0.05),
                         daemon=True).start()
        autogroup = Path(f"/proc/{child}/autogroup")
        wait_until(lambda: _nice(parent.pid) == _nice(child) == 19, timeout=10)
        if autogroup.exists():
            wait_until(lambda: autogroup.read_text().split()[-1] == "19", timeout=10)
    finally:
        stop.set()
        for pid in run_groups._descendants(parent.pid)[1:]:
            subprocess.run(["kill", str(pid)], check=False)
        parent.kill()
        parent.wait()
