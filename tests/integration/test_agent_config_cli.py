"""`docket-agent validate` on bad configurations: the key path, a hint, exit code 78."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.agentkit import BIN, native_built

GOOD = """
[agent]
id = "web-42"
state_dir = "{tmp}/state"
[buffer]
size_bytes = 67108864
slot_size_bytes = 1048576
[broker]
bootstrap_servers = "127.0.0.1:9092"
[broker.librdkafka_options]
"socket.keepalive.enable" = true
[[sources]]
type = "file"
paths = ["{tmp}/logs/*.log"]
topic = "app.events"
timestamp_field = "ts"
[audit]
window_ms = 600000
[status]
listen = "127.0.0.1:9464"
"""

PREFLIGHT = [
    ('"socket.keepalive.enable" = true', '"linger.msx" = 5', "broker.librdkafka_options.linger.msx",
     "No such configuration property"),
    ('state_dir = "{tmp}/state"', 'state_dir = "{tmp}/agent.toml/state"', "agent.state_dir",
     "is not a folder"),
    ('state_dir = "{tmp}/state"', 'state_dir = "{tmp}/locked/state"', "agent.state_dir",
     "is not writable"),
    ("size_bytes = 67108864", "size_bytes = 1125899906842624", "buffer.size_bytes",
     "free"),
]

CASES = [
    # (what is replaced, by what, the key path in the message, a word of the problem or hint)
    ("slot_size_bytes = 1048576", 'slot_size_bytes = "1M"', "buffer.slot_size_bytes",
     "without quotes or units"),
    ("slot_size_bytes = 1048576", "slot_size_bytes = 134217728", "buffer.slot_size_bytes",
     "raise buffer.size_bytes"),
    ("slot_size_bytes = 1048576", "slot_size_bytes = 1000000", "buffer.slot_size_bytes",
     "multiple of 4096"),
    ("[buffer]", "[buffer]\nlinger_ms = -1", "buffer.linger_ms", "at least 0"),
    ("[buffer]", '[buffer]\non_full = "wait"', "buffer.on_full", "'block', 'drop_oldest'"),
    ("[agent]", "[agent]\nshutdown_timeout = 5", "agent.shutdown_timeout",
     "did you mean 'shutdown_timeout_ms'?"),
    ("[status]", "[stats]", "stats", "unknown section"),
    ('topic = "app.events"', "", "sources[0].topic", "missing"),
    ('paths = ["{tmp}/logs/*.log"]', 'paths = ["{tmp}/agent.toml/*.log"]', "sources[0].paths[0]",
     "not a folder"),
    ('paths = ["{tmp}/logs/*.log"]', 'paths = ["{tmp}/locked/*.log"]', "sources[0].paths[0]",
     "not readable"),
    ('paths = ["{tmp}/logs/*.log"]', 'paths = ["logs/*.log"]', "sources[0].paths[0]",
     "absolute path"),
    ('type = "file"', 'type = "tcp"', "sources[0].type", "'file', 'socket'"),
    ('listen = "127.0.0.1:9464"', 'listen = "9464"', "status.listen", "HOST:PORT"),
    ('"socket.keepalive.enable" = true', '"socket.keepalive.enable" = [1]',
     "broker.librdkafka_options.socket.keepalive.enable", "string, number or boolean"),
    ("[agent]", "[agent\n", "", "not valid TOML"),
    ('bootstrap_servers = "127.0.0.1:9092"', 'bootstrap_servers = ["a:9092", "b:9092"]',
     "broker.bootstrap_servers", 'one comma-separated string: "a:9092,b:9092"'),
    # What only the run used to find (a traceback, then a restart every 2 s under systemd):
    *PREFLIGHT,
    # Options that would weaken at-least-once delivery without a word.
    ('"socket.keepalive.enable" = true', '"acks" = "1"', "broker.librdkafka_options.acks",
     "unsafe_weaker_delivery = true"),
    ('"socket.keepalive.enable" = true', '"enable.idempotence" = false',
     "broker.librdkafka_options.enable.idempotence", "duplicate or reorder"),
]


def validate(path: Path, *prefix: str) -> subprocess.CompletedProcess:
    return subprocess.run([*prefix, str(BIN / "docket-agent"), "validate", "--config",
                           str(path)], capture_output=True, text=True, timeout=60)


@pytest.fixture
def tmp(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "locked").mkdir(mode=0o000)
    return tmp_path


def test_a_source_folder_not_there_yet_is_a_warning_not_an_error(tmp):
    """An agent started at boot before its application must come up (ExecStartPre=validate)."""
    path = tmp / "agent.toml"
    path.write_text(GOOD.format(tmp=tmp).replace("/logs/", "/later/"))
    res = validate(path)
    assert res.returncode == 0, res.stderr
    assert f"warning: sources[0].paths[0]: folder {tmp}/later does not exist yet" in res.stderr


def test_the_good_configuration_validates(tmp):
    path = tmp / "agent.toml"
    path.write_text(GOOD.format(tmp=tmp))
    res = validate(path)
    assert res.returncode == 0, res.stderr
    assert "ok (1 source(s), agent id web-42, pool 63 slots of 1,048,576 bytes: a file of " \
        in res.stdout
    native = native_built()
    assert f"; send path {'native' if native else 'python'}: auto: the native extension " \
        f"{'is installed' if native else '(docket_native) is not installed here'}" in res.stdout


@pytest.mark.parametrize("old,new,key,words", CASES, ids=[c[2] or "toml" for c in CASES])
def test_each_bad_configuration_names_its_key_and_exits_78(tmp, old, new, key, words):
    text = GOOD.replace(old, new, 1).format(tmp=tmp)
    assert text != GOOD.format(tmp=tmp)
    path = tmp / "agent.toml"
    path.write_text(text)
    # Without the capabilities that let root read anything: an unreadable folder is unreadable.
    res = validate(path, "setpriv", "--bounding-set=-dac_override,-dac_read_search")
    assert res.returncode == 78, res.stdout + res.stderr
    assert f"Error in configuration at '{key}" in res.stderr
    assert words in res.stderr
    assert "Traceback" not in res.stderr


def test_run_refuses_a_bad_configuration_the_same_way(tmp):
    path = tmp / "agent.toml"
    path.write_text(GOOD.replace("[agent]", "[agent]\nbogus = 1").format(tmp=tmp))
    res = subprocess.run([str(BIN / "docket-agent"), "run", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 78 and "'agent.bogus': unknown key" in res.stderr


@pytest.mark.parametrize("old,new,key,words", PREFLIGHT, ids=[c[2] for c in PREFLIGHT])
def test_run_refuses_what_validate_refuses_without_a_traceback(tmp, old, new, key, words):
    """``ExecStartPre=validate`` protects the service only if ``run`` fails on nothing else."""
    path = tmp / "agent.toml"
    path.write_text(GOOD.replace(old, new, 1).format(tmp=tmp))
    res = subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                          str(BIN / "docket-agent"), "run", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 78, res.stdout + res.stderr
    assert f"Error in configuration at '{key}" in res.stderr and words in res.stderr
    assert "Traceback" not in res.stderr


def test_the_configuration_defaults_to_where_the_package_installs_it(tmp):
    if Path("/etc/docket/agent.toml").exists():
        pytest.skip("docket-agent is installed on this machine")
    res = subprocess.run([str(BIN / "docket-agent"), "validate"], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 78
    assert "Error in configuration at '/etc/docket/agent.toml': cannot read the file" in res.stderr
