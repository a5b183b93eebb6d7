"""The agent end to end, started as a user would, against the real local Kafka: a writer that
rotates its file (rename-and-create and copytruncate alternately), every id exactly once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker.admin import TopicSpec, ensure_topics
from tests.agentkit import AgentProcess, consume_counts, write_config

WRITER = Path(__file__).with_name("rotating_writer.py")
TOTAL = 1_000_000
ROTATE_EVERY = 50_000


def parse_id(value: bytes) -> int:
    return int(value[3:12])


def start_writer(folder: Path, total: int, every: int, rate: float,
                 first: int = 0, traces: bool = False) -> subprocess.Popen:
    """``rotating_writer.py``: ``total`` numbered lines (``traces``: multiline events)."""
    return subprocess.Popen([sys.executable, str(WRITER), str(folder), str(total), str(every),
                             str(rate), str(first), "1" if traces else "0"],
                            stdout=subprocess.PIPE, text=True)


def setup_agent(tmp_path: Path, bootstrap: str, topic: str, partitions: int = 3,
                replication: int = -1, source: dict | None = None,
                **sections) -> tuple[AgentProcess, Path]:
    """An agent tailing ``tmp_path/logs/app.log*`` into ``topic`` (``source``: further
    settings of that source)."""
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=partitions,
                                        replication_factor=replication)])
    logs = tmp_path / "logs"
    logs.mkdir()
    config = write_config(tmp_path / "agent.toml", bootstrap, tmp_path / "state",
                          [{"type": "file", "paths": [str(logs / "app.log*")], "topic": topic,
                            **(source or {})}],
                          **sections)
    return AgentProcess(config, tmp_path / "agent.log"), logs


def file_decisions(agent_log: Path) -> str:
    """The agent's decisions about each file (new, resumed, truncated): shown on a failure."""
    return "\n".join(line for line in agent_log.read_text(errors="replace").splitlines()
                     if any(w in line for w in ("tailing", "resuming", "truncated", "ready")))


def assert_exactly_once(counts, total: int, agent_log: Path | None = None) -> None:
    missing = [i for i in range(total) if counts.get(i, 0) == 0]
    dups = {i: c for i, c in counts.items() if c > 1}
    extra = set(counts) - set(range(total))
    if agent_log is not None and (missing or dups or extra):
        print(file_decisions(agent_log))
    assert not missing, f"{len(missing)} ids missing, first {missing[:10]}"
    assert not extra, f"ids never written arrived: {sorted(extra)[:10]}"
    assert not dups, f"{len(dups)} ids arrived more than once, e.g. {list(dups.items())[:5]}"


@pytest.mark.slow
def test_a_million_lines_rotated_every_50k_arrive_exactly_once(kafka, tmp_path, topic_name):
    agent, logs = setup_agent(tmp_path, kafka.bootstrap_servers, topic_name)
    agent.start()
    # 100k lines/s: the agent keeps up, so it sees most rotations happen rather than after.
    writer = start_writer(logs, TOTAL, ROTATE_EVERY, 100_000)
    try:
        assert writer.wait(timeout=600) == 0
        counts = consume_counts(kafka.bootstrap_servers, topic_name, TOTAL, 600, parse_id)
        status = agent.status()
        truncations = agent.metric("agent_source_rotations_total", kind="truncated")
        copies = agent.metric("agent_source_rotations_total", kind="copytruncate_copy")
    finally:
        rc = agent.stop()
    assert rc == 0
    assert_exactly_once(counts, TOTAL, tmp_path / "agent.log")
    assert status["dropped_events"] == 0
    # 19 rotations: 10 renames, 9 copytruncates. A truncation the agent saw happen is followed
    # by the copy being recognised by its fingerprint (one it only found afterwards is two
    # distinct files by then).
    print(f"copytruncates seen live: {truncations:.0f} of 9, copies recognised: {copies:.0f}")
    assert truncations >= 1 and copies >= truncations
    journal = tmp_path / "state" / "loss-journal.jsonl"
    assert not journal.exists() or journal.read_text() == ""
