"""Killing pytest leaves no Kafka behind. An inner pytest session, started as a user would, with
this project's conftest, starts the real ``kafka`` fixture, says its broker's pid and data
folder, and waits. Then it is killed:

- SIGTERM (CI runners, ``timeout``) and SIGINT (Ctrl-C) end the session in order: pytest exits
  "interrupted" (2) after the fixture's teardown stopped the broker (``down`` removes its pid
  file; the kernel's backstop would not);
- SIGKILL leaves no teardown: the broker dies with its parent (``die_with_parent``).

Either way no process naming the cluster's data folder is left."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INTERRUPTED = 2   # pytest.ExitCode.INTERRUPTED

INNER = '''
import os, time


def test_holds_a_broker(kafka):
    print("BROKER", kafka.cluster.pid(1), kafka.cluster.data_dir, flush=True)
    # Wait to be killed; give up if the outer session dies first, so nothing is left behind.
    outer, deadline = int(os.environ["OUTER_PID"]), time.monotonic() + 300
    while os.getppid() == outer and time.monotonic() < deadline:
        time.sleep(0.2)
'''

# ``python -m pytest``, with SIGINT turned into KeyboardInterrupt as at a terminal even when this
# session runs with SIGINT ignored (a background job of a script inherits it ignored).
INNER_MAIN = ("import signal, sys, pytest; "
              "signal.signal(signal.SIGINT, signal.default_int_handler); "
              "sys.exit(pytest.main(sys.argv[1:]))")


def _running(pid: int) -> bool:
    """Alive and not a zombie (a killed broker whose new parent has not reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _naming(data_dir: str) -> list[int]:
    """Running processes whose command line names ``data_dir`` (the broker, whatever its pid)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if data_dir in cmdline and _running(int(proc.name)):
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL],
                         ids=["sigterm", "sigint", "sigkill"])
def test_a_killed_pytest_leaves_no_kafka_running(tmp_path, sig):
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (tmp_path / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP"}   # its own broker
    inner = subprocess.Popen(
        [sys.executable, "-c", INNER_MAIN, "-s", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "base"),
         str(tmp_path / "test_inner.py")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT), "OUTER_PID": str(os.getpid())},
        start_new_session=True)
    out = b""
    try:
        deadline = time.monotonic() + 180
        while not any(ln.startswith(b"BROKER ") for ln in out.split(b"\n")[:-1]):  # whole lines
            assert inner.poll() is None, out.decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the inner session never started its broker"
            if select.select([inner.stdout], [], [], 1)[0]:
                out += os.read(inner.stdout.fileno(), 65536)
        line = next(ln for ln in out.decode().splitlines() if ln.startswith("BROKER "))
        pid, data_dir = int(line.split()[1]), line.split()[2]
        pid_file = Path(data_dir) / "node-1" / "pid"
        assert _naming(data_dir) == [pid] and pid_file.read_text().strip() == str(pid)

        inner.send_signal(sig)
        rest, _ = inner.communicate(timeout=120)
        out += rest
        deadline = time.monotonic() + 60
        while _naming(data_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _naming(data_dir) == [], f"the broker outlived its pytest ({sig.name})"
        if sig == signal.SIGKILL:
            assert inner.returncode == -signal.SIGKILL
        else:
            assert inner.returncode == INTERRUPTED, out.decode(errors="replace")[-3000:]
            assert not pid_file.exists(), "the broker died, but not by the fixture's teardown"
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
