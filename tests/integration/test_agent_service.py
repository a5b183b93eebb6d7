"""Operating the agent: the systemd notify protocol, status (CLI, JSON, Prometheus), SIGHUP
reload of the sources, SIGTERM drain and exit 0 — all on a real agent process."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time

from agent.telemetry import METRICS
from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import BIN, AgentProcess, consume_counts, write_config


def test_notify_status_reload_and_graceful_stop(kafka, tmp_path, topic_name):
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic_name, partitions=1)])
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    sources = [{"type": "file", "paths": [str(first / "*.log")], "topic": topic_name}]
    config = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state",
                          sources)
    notify = NotifyListener(tmp_path / "notify.sock")
    agent = AgentProcess(config, tmp_path / "agent.log",
                         env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
                              "WATCHDOG_USEC": "200000"})
    (first / "one.log").write_bytes(b"one 1\none 2\n")
    agent.start()
    try:
        notify.wait_for("WATCHDOG=1")
        assert "READY=1" in notify.messages[0]
        assert "STATUS=recovered 0 sealed slot(s)" in notify.messages[0]

        deadline = time.monotonic() + 60
        while agent.metric("agent_drain_sent_events_total") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)

        table = subprocess.run([str(BIN / "docket-agent"), "status", "--config", str(config)],
                               capture_output=True, text=True, timeout=30)
        assert table.returncode == 0, table.stderr
        for word in ("rates", "pool", "backlog", "broker    up", "one.log"):
            assert word in table.stdout
        as_json = subprocess.run([str(BIN / "docket-agent"), "status", "--json", "--config",
                                  str(config)], capture_output=True, text=True, timeout=30)
        status = json.loads(as_json.stdout)
        assert status["agent_id"] == "test-agent" and status["broker"]["state"] == "up"
        assert status["pool"]["slot_count"] > 0 and "oldest_unacked_age_s" in status["backlog"]

        exposition = agent.metrics()
        for name in ("agent_source_read_events_total", "agent_drain_sent_events_total",
                     "agent_buffer_slots", "agent_drain_broker_up"):
            assert f"# TYPE {name} " in exposition
        assert all(f"# HELP {name} " in exposition for name in METRICS)

        # SIGHUP: a second folder joins the sources.
        write_config(config, kafka.bootstrap_servers, tmp_path / "state",
                     sources + [{"type": "file", "paths": [str(second / "*.log")],
                                 "topic": topic_name}],
                     status={"listen": agent.listen})
        agent.proc.send_signal(signal.SIGHUP)
        (second / "two.log").write_bytes(b"two 1\n")
        (first / "one.log").open("ab").write(b"one 3\n")
        counts = consume_counts(kafka.bootstrap_servers, topic_name, 4, 60)
        assert counts == {b"one 1": 1, b"one 2": 1, b"one 3": 1, b"two 1": 1}
        notify.wait_for("STATUS=reloaded 2 source(s)")
        reload_at = next(i for i, m in enumerate(notify.messages) if "RELOADING=1" in m)
        ready = [i for i, m in enumerate(notify.messages) if "READY=1" in m]
        assert "MONOTONIC_USEC=" in notify.messages[reload_at]
        assert ready[0] < reload_at < ready[1], notify.messages
        assert "STATUS=reloaded 2 source(s)" in notify.messages[ready[1]]
    finally:
        rc = agent.stop()
    assert rc == 0
    assert "stopped: everything acknowledged" in agent.whole_log()
    notify.wait_for("STOPPING=1")


class NotifyListener:
    """What systemd would be: a datagram socket whose messages a thread collects."""

    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[str] = []
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                continue
            except OSError:
                return

    def wait_for(self, text: str, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(text in m for m in self.messages):
            assert time.monotonic() < deadline, f"no {text!r} in {self.messages[-5:]}"
            time.sleep(0.05)


def test_status_says_plainly_when_no_agent_answers(tmp_path):
    res = subprocess.run([str(BIN / "docket-agent"), "status", "--url", "http://127.0.0.1:9"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 3 and "no agent answers" in res.stderr
