"""Processes a tool started and keeps by pid (the local cluster's brokers, the demo's parts):
whether one still runs, and collecting the exit status of one that is our own child."""

from __future__ import annotations

import os
from pathlib import Path


def process_state(pid: int) -> str:
    """'running', 'paused' (SIGSTOP) or 'stopped' (gone, or a zombie: our own child that exited
    and was not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return "stopped"
    state = stat.rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        return "stopped"
    return "paused" if state in ("T", "t") else "running"


def alive(pid: int) -> bool:
    """Running or paused."""
    return process_state(pid) != "stopped"


def reap(pid: int) -> None:
    """Collect the exit status of ``pid`` if it is our own child that has exited, so it leaves
    no zombie; nothing otherwise."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
