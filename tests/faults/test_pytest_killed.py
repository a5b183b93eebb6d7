"""Killing pytest leaves no Kafka behind: SIGTERM ends the session with its teardown (the
brokers stopped), and SIGKILL takes the brokers with it (they die with their parent). An
inner pytest session starts the real ``kafka`` fixture, says the broker's pid, and waits."""

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

INNER = '''
import sys, time


def test_holds_a_broker(kafka):
    print("BROKER", kafka.cluster.pid(1), kafka.cluster.data_dir, flush=True)
    time.sleep(300)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] \
        if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_killed_pytest_leaves_no_kafka_running(tmp_path, sig):
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F401,F403\n")
    (tmp_path / "test_inner.py").write_text(INNER)
    inner = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "--basetemp", str(tmp_path / "base"),
         str(tmp_path / "test_inner.py")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    out = b""
    deadline = time.monotonic() + 180
    try:
        while not any(ln.startswith(b"BROKER") for ln in out.split(b"\n")[:-1]):  # whole
            assert inner.poll() is None, out.decode(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the inner session never started its broker"
            if select.select([inner.stdout], [], [], 1)[0]:
                out += os.read(inner.stdout.fileno(), 65536)
        line = next(ln for ln in out.decode().splitlines() if ln.startswith("BROKER"))
        pid, data_dir = int(line.split()[1]), line.split()[2]
        assert data_dir in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
        inner.send_signal(sig)
        inner.wait(timeout=120)
        deadline = time.monotonic() + 60
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(pid), f"broker {pid} outlived its pytest ({sig.name})"
    finally:
        if inner.poll() is None:
            inner.kill()
            inner.wait()
