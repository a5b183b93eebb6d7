"""The reconciler's configuration and its commands at the edge: `docket-audit validate` exits 78
naming the key at fault, routing follows the first matching owner, and the watermark stops at
the first window that is not final and complete."""

from __future__ import annotations

import pytest

from audit.cli import main
from audit.reconcile.config import parse
from docket_common.settings import ConfigError

GOOD = """
[reconcile]
bootstrap_servers = "127.0.0.1:9092"

[windows]
tiers = ["producer", "kafka-local", "warehouse"]

[alerts]
default_channels = ["ops"]

[[owners]]
topics = ["pay.*", "billing"]
owner = "payments"
channels = ["mail"]

[channels.ops]
type = "webhook"
url = "http://127.0.0.1:9/hook"

[channels.mail]
type = "email"
host = "127.0.0.1"
port = 25
sender = "docket@example.com"
recipients = ["payments@example.com"]
"""


@pytest.mark.parametrize("change,path,words", [
    ('grace_ms = "30m"', "windows.grace_ms", "expected an integer"),
    ("colour = 1", "windows.colour", "unknown key"),
    ('tiers = ["kafka-local"]', "windows.tiers", "starts at 'producer'"),
    ("final_ms = 1000", "windows.final_ms", "cannot be final before its grace ends"),
])
def test_validate_exits_78_naming_the_key_at_fault(tmp_path, capsys, change, path, words):
    text = GOOD.replace("[windows]\n", f"[windows]\n{change}\n")
    if change.startswith("tiers"):
        text = text.replace('tiers = ["producer", "kafka-local", "warehouse"]\n', "")
    (tmp_path / "r.toml").write_text(text)
    assert main(["validate", "--config", str(tmp_path / "r.toml")]) == 78
    err = capsys.readouterr().err
    assert f"Error in configuration at '{path}'" in err and words in err, err


def test_a_channel_named_but_not_defined_and_a_bad_channel_key_are_config_errors(tmp_path,
                                                                                capsys):
    (tmp_path / "r.toml").write_text(GOOD.replace('default_channels = ["ops"]',
                                                  'default_channels = ["pager"]'))
    assert main(["validate", "--config", str(tmp_path / "r.toml")]) == 78
    assert "'alerts.default_channels'" in capsys.readouterr().err
    (tmp_path / "r.toml").write_text(GOOD.replace('url = "http://127.0.0.1:9/hook"',
                                                  'url = "ftp://x"'))
    assert main(["validate", "--config", str(tmp_path / "r.toml")]) == 78
    assert "'channels.ops.url'" in capsys.readouterr().err


def test_a_good_config_validates_and_routes_by_the_first_matching_owner(tmp_path, capsys):
    (tmp_path / "r.toml").write_text(GOOD)
    assert main(["validate", "--config", str(tmp_path / "r.toml")]) == 0
    assert "OK" in capsys.readouterr().out
    import tomllib
    cfg = parse(tomllib.loads(GOOD))
    assert cfg.route("pay.cards") == ("payments", ["mail"])
    assert cfg.route("billing") == ("payments", ["mail"])
    assert cfg.route("app.events") == (None, ["ops"])
    assert cfg.route(None) == (None, ["ops"])              # health: the default channels


def test_the_watermark_stops_at_the_first_window_not_final_and_complete(tmp_path, capsys):
    from audit.reconcile.store import Store
    store = Store(tmp_path / "r.db")
    W = 600_000
    rows = [(0, "complete", 1), (W, "complete", 1), (2 * W, "incomplete", 1),
            (3 * W, "complete", 1)]
    with store.conn:
        for start, state, final in rows:
            store.conn.execute(
                "INSERT INTO windows VALUES (?, ?, ?, ?, ?, ?, 0, 0, 0, 0, 0, '{}', 1.0, 1.0, "
                "'match', 0, 0, 0, 0)", ("app", start, "warehouse", W, state, final))
    store.close()
    assert main(["watermark", "--db", str(tmp_path / "r.db"), "--topic", "app", "--tier",
                 "warehouse", "--json"]) == 0
    assert '"watermark": 1200000' in capsys.readouterr().out


def test_the_stop_signals_are_handled_before_the_database_is_opened(tmp_path, monkeypatch):
    """A SIGTERM that comes while ``docket-audit reconcile`` opens its database (seen in the
    kill test: stopped right after its start, it died of the signal, exit -15) must stop it
    cleanly: the handlers are in place before the reconciler is made, and a stop asked for
    then ends its run at once."""
    import signal

    from audit.reconcile import service

    seen = {}

    class Recorder:
        def __init__(self, cfg, db, stop_event=None):
            seen["handler"] = signal.getsignal(signal.SIGTERM)
            if callable(seen["handler"]):                 # (not with the default: it would
                signal.raise_signal(signal.SIGTERM)       # end this test run) the stop,
            self.stop_event = stop_event                  # while "opening"

        def run(self):
            seen["stopped"] = self.stop_event is not None and self.stop_event.is_set()

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    monkeypatch.setattr(service, "Reconciler", Recorder)
    cfg = tmp_path / "r.toml"
    cfg.write_text('[reconcile]\nbootstrap_servers = "127.0.0.1:1"\n')
    try:
        assert main(["reconcile", "--db", str(tmp_path / "r.db"), "--config", str(cfg)]) == 0
    finally:
        signal.signal(signal.SIGTERM, before[0])
        signal.signal(signal.SIGINT, before[1])
    assert seen["handler"] not in (signal.SIG_DFL, signal.SIG_IGN, None)
    assert seen["stopped"] is True


@pytest.mark.parametrize("listen", ["9465", "127.0.0.1:", "127.0.0.1:70000", "h:x"])
def test_a_listen_address_that_is_not_host_port_is_a_config_error(listen):
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse({"reconcile": {"listen": listen}})
    assert parse({"reconcile": {"listen": "[::1]:0"}})["reconcile.listen"] == "[::1]:0"


def _graph_errors(tiers: dict) -> str:
    with pytest.raises(ConfigError) as e:
        parse({"tiers": tiers})
    return str(e.value)


def test_the_tier_graph_is_read_from_tiers_tables_and_checked():
    cfg = parse({"tiers": {"dc1": {"fed_by": ["producer"]}, "dc2": {"fed_by": ["producer"]},
                           "aggregate": {"fed_by": ["dc1", "dc2"]},
                           "warehouse": {"fed_by": ["aggregate"]}}})
    assert cfg.graph == {"dc1": ("producer",), "dc2": ("producer",),
                         "aggregate": ("dc1", "dc2"), "warehouse": ("aggregate",)}
    assert parse({}).graph == {}
    assert "tiers.aggregate.fed_by" in _graph_errors({"aggregate": {"fed_by": ["local"]}})
    assert "'local' is not declared" in _graph_errors({"aggregate": {"fed_by": ["local"]}})
    assert "cycle" in _graph_errors({"a": {"fed_by": ["b"]}, "b": {"fed_by": ["a"]}})
    assert "cycle" in _graph_errors({"a": {"fed_by": ["a"]}})
    assert "cannot be declared" in _graph_errors({"producer": {"fed_by": ["producer"]}})
    assert "missing" in _graph_errors({"a": {}})
    assert "unknown key" in _graph_errors({"a": {"fed_by": ["producer"], "from": "x"}})
    assert "named twice" in _graph_errors({"a": {"fed_by": ["producer", "producer"]}})
    assert "nothing else" in _graph_errors({"a": {"fed_by": ["producer"]},
                                            "b": {"fed_by": ["producer", "a"]}})
    assert "one table per tier" in _graph_errors({"a": 1})
