"""``agent.config.to_toml``: a config file written through the agent's own declarations (what
the demo uses), parsed back the same; a key the agent does not have is refused."""

from __future__ import annotations

import tomllib

import pytest

from agent.config import ConfigError, parse, to_toml


def test_values_and_sources_come_back_as_written(tmp_path):
    text = to_toml({"agent.id": 'web "42" é', "agent.state_dir": str(tmp_path),
                    "buffer.size_bytes": 64 << 20, "buffer.linger_ms": 2.5,
                    "agent.record_numbers": False,
                    "broker.librdkafka_options": {"socket.timeout.ms": 1000, "debug": "msg"}},
                   [{"type": "file", "paths": [str(tmp_path / "a*.log")], "topic": "t",
                     "timestamp_field": "ts"}])
    cfg = parse(tomllib.loads(text))
    assert cfg["agent.id"] == 'web "42" é' and cfg["buffer.linger_ms"] == 2.5
    assert cfg["agent.record_numbers"] is False and cfg["buffer.size_bytes"] == 64 << 20
    assert cfg["broker.librdkafka_options"] == {"socket.timeout.ms": 1000, "debug": "msg"}
    assert [(s.type, s.paths, s.topic) for s in cfg.sources] == \
        [("file", [str(tmp_path / "a*.log")], "t")]


@pytest.mark.parametrize("values, sources, where", [
    ({"agent.nope": 1}, [], "agent.nope"),
    ({}, [{"type": "file", "topic": "t", "paths": ["/x/*.log"], "glob": "x"}], "sources[0].glob"),
    ({"buffer.size_bytes": "big"}, [], "buffer.size_bytes"),           # parsed back: refused
])
def test_what_the_agent_would_refuse_is_refused_here(values, sources, where):
    with pytest.raises(ConfigError) as err:
        to_toml(values, sources)
    assert where in str(err.value)


def test_the_demo_agent_config_is_a_valid_agent_config(tmp_path):
    from agent.config import load
    from demo.run import TOPICS, agent_config

    cfg = load(agent_config(tmp_path, "127.0.0.1:19092", "web-2", 19466))
    assert cfg.agent_id == "web-2" and cfg["broker.bootstrap_servers"] == "127.0.0.1:19092"
    assert cfg["status.listen"] == "127.0.0.1:19466"
    assert cfg.state_dir == tmp_path / "hosts" / "web-2" / "agent"
    assert {s.topic for s in cfg.sources} == set(TOPICS)
