"""``docket_common.procs``: a process group whose leader has ended but a member still runs is
alive (the demo's stop waited for the leader alone and returned with Spark's JVM running)."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from docket_common.procs import alive, group_alive, process_state, reap


def _wait(condition, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_group_outlives_its_leader_until_its_last_member_ends():
    # The leader ends on SIGTERM; the member it started ignores SIGTERM. The member's pid is
    # printed once the leader heeds SIGTERM again: printed before, a SIGTERM sent on reading it
    # could come while the leader still ignored it (seen once in CI on a loaded host).
    leader = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; sleep 30 & pid=$!; trap - TERM; echo $pid; wait"],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    member = int(leader.stdout.readline())
    try:
        assert process_state(leader.pid) == "running" and group_alive(leader.pid)
        os.killpg(leader.pid, signal.SIGTERM)
        assert _wait(lambda: not alive(leader.pid))        # a zombie, not reaped: stopped
        reap(leader.pid)
        assert alive(member) and group_alive(leader.pid)   # what the leader left behind
        os.killpg(leader.pid, signal.SIGKILL)
        assert _wait(lambda: not group_alive(leader.pid))
    finally:
        try:
            os.killpg(leader.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        leader.wait()
        leader.stdout.close()
