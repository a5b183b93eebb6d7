"""One agent per state folder and per buffer pool, on real agent processes.

A second agent started on the state folder (or the buffer pool) of a running one refuses with
an error line naming the folder and the pid that holds it, plus a hint, exits 1 and touches
nothing: the running agent's pool file is byte for byte what it was and its status still
answers with the same slots. The lock is the kernel's (flock), so a SIGKILLed agent does not
block the next one. No broker is needed: with nothing listening at the bootstrap address the
agent runs and its sealed slots wait in the pool.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path

from tests.agentkit import BIN, AgentProcess, write_config

NO_BROKER = "127.0.0.1:9"          # nothing listens there
LINES = 100
SETTINGS = {
    "agent": {"shutdown_timeout_ms": 1000},
    "buffer": {"size_bytes": 8 << 20, "slot_size_bytes": 1 << 20},
    "audit": {"enabled": False},
}
POOL_FIGURES = ("sealed_slots", "sealed_records", "sealed_bytes", "filling_slots", "next_seq",
                "slots_quarantined", "filling_discarded")


def config(tmp_path: Path, name: str, state_dir: Path, **sections) -> Path:
    """An agent tailing tmp_path/logs toward no broker; each call gets its own status port."""
    merged = {k: dict(v) for k, v in SETTINGS.items()}
    for k, v in sections.items():
        merged.setdefault(k, {}).update(v)
    sources = [{"type": "file", "paths": [str(tmp_path / "logs" / "*.log")],
                "topic": "app.events"}]
    return write_config(tmp_path / f"{name}.toml", NO_BROKER, state_dir, sources, **merged)


def write_events(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "app.log").write_bytes(
        b"".join(b"event %03d\n" % i for i in range(LINES)))


def wait_for(what, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while not (got := what()):
        assert time.monotonic() < deadline, "not reached within the time allowed"
        time.sleep(0.1)
    return got


def settled_pool(agent: AgentProcess) -> dict | None:
    """The pool's figures once every line is in a sealed slot (waiting: no broker)."""
    status = agent.status()
    if status is None:
        return None
    pool = status["pool"]
    if pool["sealed_records"] != LINES or pool["filling_slots"] != 0:
        return None
    return {k: pool[k] for k in POOL_FIGURES}


def pool_figures(agent: AgentProcess) -> dict:
    return {k: agent.status()["pool"][k] for k in POOL_FIGURES}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_refused(config_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "docket-agent"), "run", "--config", str(config_path)],
                          capture_output=True, text=True, timeout=60)


def test_a_second_agent_on_the_state_folder_of_a_running_one_refuses_and_touches_nothing(
        tmp_path):
    write_events(tmp_path)
    state = tmp_path / "state"
    first = AgentProcess(config(tmp_path, "first", state), tmp_path / "first.log").start()
    try:
        held = wait_for(lambda: settled_pool(first))
        pool_before = digest(state / "buffer.pool")
        files_before = sorted(str(p.relative_to(state)) for p in state.rglob("*"))

        res = run_refused(config(tmp_path, "second", state))      # another status port

        assert res.returncode == 1, res.stderr
        error, hint = res.stderr.splitlines()
        assert error.startswith(f"docket-agent: error: state folder {state} is already locked "
                                "by another docket agent")
        assert f"(pid {first.proc.pid}, lock {state / 'agent.lock'})" in error
        assert hint.startswith("  hint: stop that agent first") and "agent.state_dir" in hint
        assert first.alive()
        assert pool_figures(first) == held                         # its status still answers
        assert digest(state / "buffer.pool") == pool_before
        assert sorted(str(p.relative_to(state)) for p in state.rglob("*")) == files_before
        assert (state / "agent.lock").read_text() == f"{first.proc.pid}\n"
    finally:
        first.kill()

    # SIGKILLed: the kernel dropped its lock; the next agent starts on the folder and finds
    # the slot the killed one sealed.
    third = AgentProcess(config(tmp_path, "third", state), tmp_path / "third.log").start()
    try:
        wait_for(lambda: "ready: 1 sealed slot(s) recovered" in third.whole_log())
        assert pool_figures(third)["sealed_records"] == LINES
        assert (state / "agent.lock").read_text() == f"{third.proc.pid}\n"
    finally:
        rc = third.stop()
    assert rc == 0


def test_a_second_agent_on_the_buffer_pool_of_a_running_one_refuses(tmp_path):
    write_events(tmp_path)
    shared = {"buffer": {"path": str(tmp_path / "shared.pool")}}
    first = AgentProcess(config(tmp_path, "first", tmp_path / "state-a", **shared),
                         tmp_path / "first.log").start()
    try:
        held = wait_for(lambda: settled_pool(first))
        pool_before = digest(tmp_path / "shared.pool")

        res = run_refused(config(tmp_path, "second", tmp_path / "state-b", **shared))

        assert res.returncode == 1, res.stderr
        error, hint = res.stderr.splitlines()
        assert error.startswith(f"docket-agent: error: {tmp_path / 'shared.pool'} is in use by "
                                "another buffer pool")
        assert hint.startswith("  hint: give each agent a buffer.path of its own")
        assert first.alive() and pool_figures(first) == held
        assert digest(tmp_path / "shared.pool") == pool_before
    finally:
        first.kill()
