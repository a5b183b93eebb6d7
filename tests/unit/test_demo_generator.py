"""The demo's log-writing application: lines the agent can read, rotated as logrotate does."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime

from agent.tail.events import parse_time
from demo.generator import RotatingFile, access_event, app_event, payment_event


def test_events_carry_a_time_the_agent_parses_and_a_user():
    rng = random.Random(1)
    now = datetime(2026, 11, 22, 4, 0, 0, 123000, tzinfo=UTC)
    for make in (app_event, access_event, payment_event):
        event = json.loads(json.dumps(make(rng, now)))
        assert parse_time(event["ts"]) == int(now.timestamp() * 1000)
        assert event["user"].startswith("u")


def test_rotation_renames_keeps_three_and_loses_no_line(tmp_path):
    f = RotatingFile(tmp_path / "app.log", rotate_lines=10)
    for i in range(55):
        f.write(b"line %d\n" % i)
    f.flush()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["app.log", "app.log.1", "app.log.2", "app.log.3"]
    kept = b"".join((tmp_path / n).read_bytes() for n in ("app.log.3", "app.log.2", "app.log.1",
                                                         "app.log"))
    assert kept == b"".join(b"line %d\n" % i for i in range(20, 55))


def test_sigusr1_rotates_every_file_and_the_writer_goes_on(tmp_path):
    """The demo's log-deletion drill rotates the files at once, then deletes a rotated one."""
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "demo.generator", str(tmp_path), "--rate",
                             "2000", "--seed", "3"])
    try:
        deadline = time.monotonic() + 30
        while not all((tmp_path / n).exists() and (tmp_path / n).stat().st_size
                      for n in ("app.log", "access.log", "payments.log")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGUSR1)
        while not all((tmp_path / f"{n}.1").exists()
                      for n in ("app.log", "access.log", "payments.log")):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
    for name in ("app.log.1", "access.log.1", "payments.log.1"):
        lines = (tmp_path / name).read_bytes().splitlines()
        assert lines and all(json.loads(x)["user"].startswith("u") for x in lines)
