"""Debian's logrotate rotating an application's log under the agent, with ``compress`` and
``delaycompress``, ``rotate 2`` (older rotations deleted) and ``create``, while the agent tails
the README's kind of glob (``app.log*``, which matches the compressed rotations too) without an
``exclude``: every application line arrives, no record is anything but an application line
(the compressed files are skipped, not shipped as gzip bytes), nothing is journalled."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.agentkit import consume_counts
from tests.integration.test_agent_end_to_end import setup_agent

LOGROTATE = shutil.which("logrotate") or "/usr/sbin/logrotate"
RATE = 5000                     # lines per second
SECONDS = 8
ROTATIONS = 6                   # one a second, from the second second


def _line(i: int) -> bytes:
    """An application line; its filler varies as real lines do, so that the compressed
    rotations hold newline bytes (a run of one letter compresses to a stream without any, and
    such a file would never have been shipped even as bytes)."""
    return b"id-%09d %s\n" % (i, hashlib.sha256(b"%d" % i).hexdigest()[:48].encode())


def _write(app: Path, total: int, stop: threading.Event) -> None:
    """The application: 50 lines every 10 ms, each batch to whatever file is at ``app`` now
    (as a program that opens its log per write; it waits while logrotate moved the file away
    and has not made the new one yet)."""
    start = time.monotonic()
    i = 0
    while i < total and not stop.is_set():
        due = min(total, int((time.monotonic() - start) * RATE) + 50)
        if due > i:
            try:
                fd = os.open(app, os.O_WRONLY | os.O_APPEND)
            except FileNotFoundError:
                time.sleep(0.001)
                continue
            try:
                os.write(fd, b"".join(_line(k) for k in range(i, due)))
            finally:
                os.close(fd)
            i = due
        time.sleep(0.01)


@pytest.mark.skipif(not os.path.exists(LOGROTATE), reason="logrotate not installed "
                    "(make setup installs Debian's logrotate)")
def test_logrotate_compress_under_the_glob_ships_only_the_applications_lines(
        kafka, tmp_path, topic_name):
    bootstrap = kafka.bootstrap_servers
    agent, logs = setup_agent(tmp_path, bootstrap, topic_name, partitions=1)
    app = logs / "app.log"
    app.touch()
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{app} {{\n  rotate 2\n  compress\n  delaycompress\n  missingok\n"
                    "  create 0644\n}\n")
    agent.start()
    total = RATE * SECONDS
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(app, total, stop))
    writer.start()
    runs = []
    try:
        for _ in range(ROTATIONS):
            time.sleep(1)
            runs.append(subprocess.run([LOGROTATE, "-f", "-s", str(tmp_path / "lr.state"),
                                        str(conf)], capture_output=True, text=True))
        writer.join(60)
        counts = consume_counts(bootstrap, topic_name, total, 90,
                                lambda v: v if not v.startswith(b"id-") else int(v[3:12]))
        compressed = agent.metric("agent_source_bad_input_total", kind="compressed")
    finally:
        stop.set()
        writer.join(10)
        assert agent.stop() == 0
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    gz = sorted(p.name for p in logs.iterdir() if p.name.endswith(".gz"))
    assert gz, "logrotate compressed nothing: the test did not test it"
    foreign = [k for k in counts if not isinstance(k, int)]
    assert not foreign, f"{len(foreign)} record(s) that are no application line, e.g. " \
        f"{foreign[0][:40]!r}"
    missing = [i for i in range(total) if counts[i] == 0]
    assert not missing, f"{len(missing)} line(s) never arrived, first {missing[:5]}"
    assert max(counts.values()) == 1, "no line twice: the agent was never killed"
    assert compressed >= 1
    journal = tmp_path / "state" / "loss-journal.jsonl"
    assert not journal.exists() or journal.read_text() == ""


@pytest.mark.skipif(not os.path.exists(LOGROTATE), reason="logrotate not installed "
                    "(make setup installs Debian's logrotate)")
def test_logrotate_compress_while_the_agent_is_stopped_reads_the_unread_tail_decompressed(
        kafka, tmp_path, topic_name):
    """The agent stopped with 20,000 lines unread; logrotate (``compress`` without
    ``delaycompress``, ``rotate 1``, ``create``) turns app.log into app.log.1.gz and deletes
    it; the application writes on into the new app.log. At restart the compressed file is
    recognised as the rest of the generation being read (by its decompressed head) and read
    on from the checkpoint: every line once, nothing journalled (before: 20,000 lines lost,
    a 0-byte ``deleted_unread`` entry)."""
    bootstrap = kafka.bootstrap_servers
    agent, logs = setup_agent(tmp_path, bootstrap, topic_name, partitions=1)
    app = logs / "app.log"
    app.write_bytes(b"".join(_line(i) for i in range(5_000)))
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{app} {{\n  rotate 1\n  compress\n  missingok\n  create 0644\n}}\n")
    agent.start()
    try:
        assert len(consume_counts(bootstrap, topic_name, 5_000, 60, lambda v: v)) == 5_000
    finally:
        assert agent.stop() == 0
    with open(app, "ab") as f:                                 # written while stopped
        f.write(b"".join(_line(i) for i in range(5_000, 25_000)))
    run = subprocess.run([LOGROTATE, "-f", "-s", str(tmp_path / "lr.state"), str(conf)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in logs.iterdir()) == ["app.log", "app.log.1.gz"]
    with open(app, "ab") as f:
        f.write(b"".join(_line(i) for i in range(25_000, 30_000)))
    agent.start()
    try:
        counts = consume_counts(bootstrap, topic_name, 30_000, 120, lambda v: int(v[3:12]))
        rotations = agent.metric("agent_source_rotations_total", kind="compressed_copy")
    finally:
        assert agent.stop() == 0
    missing = [i for i in range(30_000) if counts[i] == 0]
    assert not missing, f"{len(missing)} line(s) never arrived, first {missing[:5]}"
    assert set(counts) == set(range(30_000)) and max(counts.values()) == 1
    assert rotations == 1
    journal = tmp_path / "state" / "loss-journal.jsonl"
    assert not journal.exists() or journal.read_text() == ""
