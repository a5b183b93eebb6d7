"""Processes a tool started and keeps by pid (the local cluster's brokers, the demo's parts):
whether one still runs, whether anything of its process group does, and collecting the exit
status of one that is our own child."""

from __future__ import annotations

import os
from pathlib import Path


def process_state(pid: int) -> str:
    """'running', 'paused' (SIGSTOP) or 'stopped' (gone, or a zombie: our own child that exited
    and was not reaped yet)."""
    stat = stat_fields(pid)
    if stat is None or stat[0] in ("Z", "X"):
        return "stopped"
    return "paused" if stat[0] in ("T", "t") else "running"


def group_alive(pgid: int) -> bool:
    """Does any process of group ``pgid`` still run (zombies left out)? A part started in a
    session of its own may leave processes behind its leader: Spark's JVM, its Python workers."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = stat_fields(int(entry.name))
            if stat is not None and stat[0] not in ("Z", "X") and int(stat[2]) == pgid:
                return True
    return False


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command's name: state, ppid, pgrp, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


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
