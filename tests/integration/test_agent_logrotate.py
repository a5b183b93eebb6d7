"""Debian's logrotate rotating an application's log under the agent, which tails the README's
kind of glob (``app.log*``, matching the rotations and the compressed ones too) without an
``exclude``: ``create``, ``copytruncate``, ``compress`` with and without ``delaycompress``,
``dateext``, ``rotate N`` deleting older rotations, each while the agent runs and while it is
stopped. Every application line arrives once, no record is anything but an application line
(compressed files are read decompressed where they hold unread lines, skipped otherwise, never
shipped as gzip bytes), nothing is journalled.

``copytruncate`` loses, by its nature, what the application writes between logrotate's copy
and its truncation (the lines are in neither file afterwards): those tests require every line
that is on disk at the end, in any file, to have arrived, and count the ones logrotate lost."""

from __future__ import annotations

import gzip
import hashlib
import os
import re
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


# name -> (logrotate directives, rotation kind the stopped case must count, or None)
RUNNING = {
    "copytruncate": "rotate 20\n  copytruncate",
    "copytruncate_compress": "rotate 20\n  copytruncate\n  compress",
    "dateext": "rotate 20\n  dateext\n  dateformat -%Y%m%d-%s\n  create 0644",
    "dateext_compress_rotate_2": "rotate 2\n  dateext\n  dateformat -%Y%m%d-%s\n  compress\n"
                                 "  create 0644",
}
STOPPED = {
    "copytruncate": ("rotate 1\n  copytruncate", "copytruncate_copy"),
    "copytruncate_compress": ("rotate 1\n  copytruncate\n  compress", "compressed_copy"),
    "copytruncate_zstd": ("rotate 1\n  copytruncate\n  compress\n  compresscmd /usr/bin/zstd\n"
                          "  uncompresscmd /usr/bin/unzstd\n  compressext .zst\n"
                          "  compressoptions -q", "compressed_copy"),
    "dateext": ("rotate 2\n  dateext\n  create 0644", None),
    "create_delaycompress": ("rotate 2\n  compress\n  delaycompress\n  create 0644", None),
}


def _kept(directives: str) -> int:
    """The N of ``rotate N``."""
    return int(re.search(r"rotate (\d+)", directives).group(1))


def _on_disk(logs: Path) -> set[int]:
    """The ids of the application lines in every file under ``logs``, decompressed."""
    ids = set()
    for p in logs.iterdir():
        data = p.read_bytes()
        if p.name.endswith(".gz"):
            data = gzip.decompress(data)
        ids.update(int(line[3:12]) for line in data.splitlines() if line.startswith(b"id-"))
    return ids


def _rotate(conf: Path, state: Path) -> subprocess.CompletedProcess:
    return subprocess.run([LOGROTATE, "-f", "-s", str(state), str(conf)],
                          capture_output=True, text=True)


@pytest.mark.skipif(not os.path.exists(LOGROTATE), reason="logrotate not installed "
                    "(make setup installs Debian's logrotate)")
@pytest.mark.parametrize("name", sorted(RUNNING))
def test_logrotate_while_the_agent_runs_ships_every_line_on_disk_once(
        kafka, tmp_path, topic_name, name):
    """Six rotations, 1.1 s apart, while the application writes 5,000 lines/s."""
    bootstrap = kafka.bootstrap_servers
    agent, logs = setup_agent(tmp_path, bootstrap, topic_name, partitions=1)
    app = logs / "app.log"
    app.touch()
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{app} {{\n  {RUNNING[name]}\n  missingok\n}}\n")
    agent.start()
    total = RATE * SECONDS
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(app, total, stop))
    writer.start()
    runs = []
    try:
        for _ in range(ROTATIONS):
            time.sleep(1.1)
            runs.append(_rotate(conf, tmp_path / "lr.state"))
        writer.join(60)
        # With every rotation kept, what is on disk; with older ones deleted (create, which
        # loses nothing), every line written.
        on_disk = _on_disk(logs) if _kept(RUNNING[name]) > ROTATIONS else set(range(total))
        counts = consume_counts(bootstrap, topic_name, len(on_disk), 90,
                                lambda v: v if not v.startswith(b"id-") else int(v[3:12]))
        rotated = {p.name for p in logs.iterdir()} - {"app.log"}
    finally:
        stop.set()
        writer.join(10)
        assert agent.stop() == 0
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    expected = min(ROTATIONS, _kept(RUNNING[name]))
    assert len(rotated) >= expected, f"logrotate made {sorted(rotated)}: the test did not test it"
    if "compress" in RUNNING[name]:
        assert any(n.endswith(".gz") for n in rotated)
    foreign = [k for k in counts if not isinstance(k, int)]
    assert not foreign, f"{len(foreign)} record(s) that are no application line, e.g. " \
        f"{foreign[0][:40]!r}"
    missing = sorted(on_disk - set(counts))
    assert not missing, f"{len(missing)} line(s) on disk never arrived, first {missing[:5]}"
    assert not set(counts) - set(range(total))
    assert max(counts.values()) == 1, "no line twice: the agent was never killed"
    lost_by_logrotate = total - len(on_disk)
    print(f"{name}: {len(counts)} lines arrived, {lost_by_logrotate} written between "
          f"logrotate's copy and its truncation (in no file)")
    journal = tmp_path / "state" / "loss-journal.jsonl"
    assert not journal.exists() or journal.read_text() == ""


@pytest.mark.skipif(not os.path.exists(LOGROTATE), reason="logrotate not installed "
                    "(make setup installs Debian's logrotate)")
@pytest.mark.parametrize("name", sorted(STOPPED))
def test_logrotate_while_the_agent_is_stopped_reads_the_unread_tail_once(
        kafka, tmp_path, topic_name, name):
    """The agent stopped with 20,000 lines unread; logrotate runs (twice for the modes that
    keep two rotations, so one rotated file moves on again); the application writes on. At
    restart every line arrives once, nothing journalled."""
    directives, kind = STOPPED[name]
    bootstrap = kafka.bootstrap_servers
    agent, logs = setup_agent(tmp_path, bootstrap, topic_name, partitions=1)
    app = logs / "app.log"
    app.write_bytes(b"".join(_line(i) for i in range(5_000)))
    conf = tmp_path / "logrotate.conf"
    conf.write_text(f"{app} {{\n  {directives}\n  missingok\n}}\n")
    agent.start()
    try:
        assert len(consume_counts(bootstrap, topic_name, 5_000, 60, lambda v: v)) == 5_000
    finally:
        assert agent.stop() == 0
    state = tmp_path / "lr.state"
    with open(app, "ab") as f:                                 # written while stopped
        f.write(b"".join(_line(i) for i in range(5_000, 25_000)))
    run = _rotate(conf, state)
    assert run.returncode == 0, run.stderr
    total = 30_000
    if _kept(directives) == 2:
        with open(app, "ab") as f:
            f.write(b"".join(_line(i) for i in range(25_000, 30_000)))
        if "dateext" in directives:
            time.sleep(1.1)        # a name of another second (dateformat's default is a day)
            conf.write_text(f"{app} {{\n  {directives}\n  dateformat -%Y%m%d-%s\n"
                            "  missingok\n}\n")
        run = _rotate(conf, state)
        assert run.returncode == 0, run.stderr
        total = 35_000
    with open(app, "ab") as f:
        f.write(b"".join(_line(i) for i in range(total - 5_000, total)))
    names = sorted(p.name for p in logs.iterdir())
    assert len(names) >= 2, names
    if "zstd" in directives:
        assert "app.log.1.zst" in names, names
    agent.start()
    try:
        counts = consume_counts(bootstrap, topic_name, total, 120, lambda v: int(v[3:12]))
        rotations = agent.metric("agent_source_rotations_total", kind=kind) if kind else 0
    finally:
        assert agent.stop() == 0
    missing = [i for i in range(total) if counts[i] == 0]
    assert not missing, f"{len(missing)} line(s) never arrived, first {missing[:5]} ({names})"
    assert set(counts) == set(range(total)) and max(counts.values()) == 1
    if kind:
        assert rotations == 1, f"the rotation was not seen as {kind}"
    journal = tmp_path / "state" / "loss-journal.jsonl"
    assert not journal.exists() or journal.read_text() == ""
