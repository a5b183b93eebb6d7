"""`docket-broker` driven from a shell exactly as a user types it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def broker(data_dir: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKET_BROKER_DIR": str(data_dir)}
    exe = shutil.which("docket-broker", path=str(BIN)) or "docket-broker"
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.cluster3
def test_up_status_down_as_a_user_types_them(tmp_path):
    data = tmp_path / "cluster"
    try:
        up = broker(data, "up", "--brokers", "3", "--base-port", "0")
        assert up.returncode == 0, up.stderr
        last = up.stdout.strip().splitlines()[-1]
        assert last.startswith("bootstrap_servers=127.0.0.1:")
        servers = last.split("=", 1)[1].split(",")
        assert len(servers) == 3

        status = broker(data, "status", "--json")
        assert status.returncode == 0, status.stderr
        rows = json.loads(status.stdout)["brokers"]
        assert [r["state"] for r in rows] == ["running"] * 3
        assert sorted(f"127.0.0.1:{r['port']}" for r in rows) == sorted(servers)
        assert all(isinstance(r["pid"], int) for r in rows)

        table = broker(data, "status")
        assert table.stdout.count("running") == 3

        again = broker(data, "up", "--brokers", "3")
        assert again.returncode == 1
        assert "already running" in again.stderr and "docket-broker down" in again.stderr
        assert "Traceback" not in again.stderr

        # Another data dir asking for the same ports: the ports are busy, said plainly.
        first_port = rows[0]["port"]
        other = broker(tmp_path / "other", "up", "--brokers", "1", "--base-port", str(first_port))
        assert other.returncode == 1
        assert f"{first_port}" in other.stderr and "already in use" in other.stderr
        assert "Traceback" not in other.stderr

        topic = broker(data, "topic", "ensure", "docket.audit", "--audit")
        assert topic.returncode == 0 and "created: docket.audit" in topic.stdout
        listing = broker(data, "topic", "list")
        assert "docket.audit\tpartitions=3\treplication_factor=3" in listing.stdout
    finally:
        down = broker(data, "down")
    assert down.returncode == 0 and "stopped 3 broker(s)" in down.stdout
    pids = [r["pid"] for r in rows]
    assert all(not Path(f"/proc/{pid}").exists() or
               Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z" for pid in pids)

    twice = broker(data, "down")
    assert twice.returncode == 0 and "no broker running" in twice.stdout

    stopped = broker(data, "status", "--json")
    assert stopped.returncode == 3
    assert [r["state"] for r in json.loads(stopped.stdout)["brokers"]] == ["stopped"] * 3


def test_bad_arguments_are_refused_with_a_message(tmp_path):
    nonempty = tmp_path / "notes"
    nonempty.mkdir()
    (nonempty / "keep.txt").write_text("mine")
    res = broker(nonempty, "up", "--base-port", "0")
    assert res.returncode == 1
    assert "holds no docket-broker cluster" in res.stderr
    assert (nonempty / "keep.txt").read_text() == "mine"

    res = broker(tmp_path / "x", "topic", "list")
    assert res.returncode == 1 and "no local cluster is running" in res.stderr

    res = broker(tmp_path / "x", "up", "--brokers", "2")
    assert res.returncode == 2 and "invalid choice" in res.stderr


def test_version_names_the_kafka_it_runs():
    res = subprocess.run([str(BIN / "docket-broker"), "--version"], capture_output=True, text=True)
    assert res.returncode == 0 and "Apache Kafka 4.1.1" in res.stdout


@pytest.mark.slow
def test_two_named_clusters_and_a_mirror_as_a_user_types_them(tmp_path):
    """``--name local`` and ``--name aggregate`` side by side, listed and stopped by name,
    and ``mirror up / status / down`` between them."""
    env = {**os.environ, "DOCKET_CLUSTERS_DIR": str(tmp_path / "clusters"),
           "DOCKET_MIRRORS_DIR": str(tmp_path / "mirrors")}
    exe = shutil.which("docket-broker", path=str(BIN)) or "docket-broker"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([exe, *args], env=env, capture_output=True, text=True,
                              timeout=180)
    try:
        servers = {}
        for name in ("local", "aggregate"):
            up = run("--name", name, "up", "--base-port", "0")
            assert up.returncode == 0, up.stderr
            servers[name] = up.stdout.strip().splitlines()[-1].split("=", 1)[1]
        assert servers["local"] != servers["aggregate"]
        listing = run("list").stdout
        for name in ("local", "aggregate"):
            assert f"{name}\t{servers[name]}\t1/1 broker(s) running" in listing
        made = run("--name", "local", "topic", "ensure", "app.events")
        assert made.returncode == 0 and "created: app.events" in made.stdout, made.stderr

        mirror = run("mirror", "up", "--source", "local", "--target", "aggregate",
                     "--topics", r"app\..*")
        assert mirror.returncode == 0, mirror.stderr
        status = run("mirror", "status", "--json")
        [row] = json.loads(status.stdout)["mirrors"]
        assert status.returncode == 0 and row["state"] == "running", status.stdout
        assert (row["source"], row["target"]) == ("local", "aggregate")
        # The audit topic was made on the aggregate before the mirror started.
        topics = run("--name", "aggregate", "topic", "list").stdout
        assert "docket.audit\tpartitions=3" in topics

        again = run("mirror", "up", "--source", "local", "--target", "aggregate",
                    "--topics", "x")
        assert again.returncode == 1 and "already running" in again.stderr
        unknown = run("mirror", "up", "--source", "local", "--target", "nowhere",
                      "--topics", "x")
        assert unknown.returncode == 1 and "no cluster named 'nowhere'" in unknown.stderr
        assert "Traceback" not in again.stderr + unknown.stderr
    finally:
        stopped = run("mirror", "down", "--source", "local", "--target", "aggregate")
        downs = [run("--name", name, "down") for name in ("local", "aggregate")]
    assert stopped.returncode == 0 and "stopped the mirror" in stopped.stdout
    assert run("mirror", "status").returncode == 3
    assert all(d.returncode == 0 and "stopped 1 broker(s)" in d.stdout for d in downs)
    assert "0/1 broker(s) running" in run("list").stdout
