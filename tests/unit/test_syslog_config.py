"""A syslog source's settings, and a journald source's: what each needs, what only it takes,
and each mistake refused with the setting's path; the packaged default config shows one of
each commented out."""

from __future__ import annotations

import tomllib

import pytest

from agent.config import (
    EXAMPLE_JOURNALD_SOURCE,
    EXAMPLE_SYSLOG_SOURCE,
    ConfigError,
    default_toml,
    parse,
    split_listen,
)


def _config(**source) -> dict:
    return {"broker": {"bootstrap_servers": "127.0.0.1:9092"},
            "sources": [{"type": "syslog", "topic": "sys", **source}]}


def test_a_syslog_source_with_its_defaults():
    src = parse(_config(listen="127.0.0.1:5514")).sources[0]
    assert (src.protocol, src.format, src.receive_buffer_bytes) == ("tcp", "json", 0)
    assert split_listen("[::1]:514") == ("::1", 514)


@pytest.mark.parametrize("source, where, says", [
    ({}, "sources[0].listen", "needs an address"),
    ({"listen": "5514"}, "sources[0].listen", "not an address"),
    ({"listen": "localhost:5514"}, "sources[0].listen", "not an address"),
    ({"listen": "::1:5514"}, "sources[0].listen", "not an address"),
    ({"listen": "127.0.0.1:70000"}, "sources[0].listen", "not an address"),
    ({"listen": "127.0.0.1:5514", "protocol": "sctp"}, "sources[0].protocol", "sctp"),
    ({"listen": "127.0.0.1:5514", "paths": ["/var/log/*.log"]}, "sources[0].paths",
     "does not take"),
    ({"listen": "127.0.0.1:5514", "multiline": {"preset": "java"}}, "sources[0].multiline",
     "does not take"),
    ({"listen": "127.0.0.1:5514", "format": "raw", "key_field": "host"},
     "sources[0].key_field", "not JSON"),
    ({"listen": "127.0.0.1:5514", "protocol": "udp", "ssl_certificate_file": "/etc/hosts",
      "ssl_key_file": "/etc/hosts"}, "sources[0].ssl_certificate_file", "tcp"),
    ({"listen": "127.0.0.1:5514", "ssl_certificate_file": "/etc/hosts"},
     "sources[0].ssl_key_file", "both"),
    ({"listen": "127.0.0.1:5514", "ssl_certificate_file": "/nonexistent.pem",
      "ssl_key_file": "/etc/hosts"}, "sources[0].ssl_certificate_file", "no file"),
    ({"listen": "127.0.0.1:5514", "topic": "s.{app}"}, "sources[0].fallback_topic",
     "needs a fallback"),
    ({"listen": "127.0.0.1:5514", "topic": "s.{app}", "fallback_topic": "s other"},
     "sources[0].fallback_topic", "not a Kafka topic name"),
    ({"listen": "127.0.0.1:5514", "fallback_topic": "s.other"}, "sources[0].fallback_topic",
     "only a topic that names fields"),
    ({"listen": "127.0.0.1:5514", "topic": "s.{application}", "fallback_topic": "s.o"},
     "sources[0].topic", "not a field"),
    ({"listen": "127.0.0.1:5514", "format": "raw", "topic": "s.{app}", "fallback_topic": "s.o"},
     "sources[0].topic", "need the message.s fields"),
    ({"listen": "127.0.0.1:5514", "key": "{host}", "key_field": "host"}, "sources[0].key",
     "not both"),
    ({"listen": "127.0.0.1:5514", "add_fields": {"host": "x"}}, "sources[0].add_fields.host",
     "is a field"),
    ({"listen": "127.0.0.1:5514", "add_fields": {"tags": ["a"]}}, "sources[0].add_fields.tags",
     "expected text"),
    ({"listen": "127.0.0.1:5514", "add_fields": {"x": float("nan")}},
     "sources[0].add_fields.x", "expected text"),
    ({"listen": "127.0.0.1:5514", "topic": "s.{app-name}"}, "sources[0].topic",
     "no placeholder"),
    ({"listen": "127.0.0.1:5514", "topic": "s logs"}, "sources[0].topic", "not a Kafka topic"),
    ({"listen": "127.0.0.1:5514", "receive_buffer_bytes": 2**31}, "sources[0].receive_buffer_bytes",
     "at most"),
])
def test_mistakes_are_refused_with_the_settings_path(source, where, says):
    with pytest.raises(ConfigError, match=says) as err:
        parse(_config(**source))
    assert err.value.path == where


def test_syslog_settings_on_a_file_source_and_two_listeners_on_one_port_are_refused():
    raw = {"broker": {"bootstrap_servers": "127.0.0.1:9092"},
           "sources": [{"type": "file", "topic": "a", "paths": ["/tmp/x/*.log"],
                        "listen": "127.0.0.1:5514"}]}
    with pytest.raises(ConfigError, match="only syslog sources"):
        parse(raw)
    raw["sources"] = [{"type": "syslog", "topic": "a", "listen": "127.0.0.1:5514"},
                      {"type": "syslog", "topic": "b", "listen": "127.0.0.1:5514"}]
    with pytest.raises(ConfigError, match="one address and protocol"):
        parse(raw)
    raw["sources"][1]["protocol"] = "udp"                 # the same port over UDP is another
    assert len(parse(raw).sources) == 2


def test_a_routed_source_is_heard_of_by_its_fallback_topic_and_may_name_added_fields():
    from agent.config import source_topics
    cfg = parse(_config(listen="127.0.0.1:5514", topic="s.{dc}.{app}", fallback_topic="s.o",
                        add_fields={"dc": "eu1"}, key="{host}"))
    assert source_topics(cfg.sources) == ["s.o"]
    raw = _config()
    raw["sources"] = [{"type": "file", "topic": "f.{app}", "paths": ["/tmp/x/*.log"],
                       "format": "docker", "fallback_topic": "f.other"}]
    with pytest.raises(ConfigError, match=r"\{app\} is not a field of the file"):
        parse(raw)


def test_the_default_config_shows_a_syslog_and_a_journald_source_commented_out():
    text = default_toml()
    tables = []
    for block in text.split("# [[sources]]\n")[1:]:
        block = block.split("\n\n")[0]
        uncommented = "\n".join(line.removeprefix("# ") for line in block.splitlines())
        tables.append(tomllib.loads("[[sources]]\n" + uncommented)["sources"][0])
    assert tables == [EXAMPLE_SYSLOG_SOURCE, EXAMPLE_JOURNALD_SOURCE]
    for table in tables:
        assert parse({"broker": {"bootstrap_servers": "b:9092"}, "sources": [table]}).sources


def test_a_port_held_stops_the_listener_with_a_startup_error_over_udp_too():
    import socket

    from agent.errors import StartupError
    from agent.tail.syslog import _listen

    for kind, protocol in ((socket.SOCK_DGRAM, "udp"), (socket.SOCK_STREAM, "tcp")):
        with socket.socket(socket.AF_INET, kind) as held:
            held.bind(("127.0.0.1", 0))
            if protocol == "tcp":
                held.listen(1)
            port = held.getsockname()[1]
            src = parse(_config(listen=f"127.0.0.1:{port}", protocol=protocol)).sources[0]
            with pytest.raises(StartupError, match="Address already in use"):
                _listen(src)


def _journald(**source) -> dict:
    return {"broker": {"bootstrap_servers": "127.0.0.1:9092"},
            "sources": [{"type": "journald", "topic": "j", **source}]}


def test_a_journald_source_with_its_defaults_and_its_filters(tmp_path):
    src = parse(_journald()).sources[0]
    assert (src.format, src.read_from, src.units, src.priority) == ("json", "beginning", [],
                                                                     None)
    src = parse(_journald(units=["a.service"], identifiers=["cron"], priority="err..warning",
                          matches=["_TRANSPORT=stdout", "+", "PRIORITY=3"], format="message",
                          journal_directory=str(tmp_path), key_field="_HOSTNAME")).sources[0]
    assert (src.format, src.journal_directory) == ("message", str(tmp_path))


@pytest.mark.parametrize("source, where, says", [
    ({"paths": ["/var/log/*.log"]}, "sources[0].paths", "does not take"),
    ({"listen": "127.0.0.1:5514"}, "sources[0].listen", "only syslog"),
    ({"format": "raw"}, "sources[0].format", "does not take format"),
    ({"timestamp_field": "ts"}, "sources[0].timestamp_field", "does not take"),
    ({"priority": "loud"}, "sources[0].priority", "not a priority"),
    ({"priority": "9"}, "sources[0].priority", "not a priority"),
    ({"priority": "err..warning..info"}, "sources[0].priority", "not a priority"),
    ({"matches": ["nginx"]}, "sources[0].matches[0]", "FIELD=value"),
    ({"matches": ["unit=x"]}, "sources[0].matches[0]", "FIELD=value"),
    ({"units": [""]}, "sources[0].units[0]", "expected a name"),
    ({"journal_directory": "/nonexistent/journal"}, "sources[0].journal_directory",
     "no folder"),
    ({"topic": "journal.{_SYSTEMD_UNIT}"}, "sources[0].fallback_topic", "needs a fallback"),
    ({"add_fields": {"dc": "eu1"}, "format": "message"}, "sources[0].add_fields",
     "need the message's fields"),
    ({"add_fields": {"_HOSTNAME": "x"}}, "sources[0].add_fields._HOSTNAME", "journal's own"),
    ({"listen": "127.0.0.1:5514", "fallback_topic": "x"}, "sources[0].listen", "only syslog"),
])
def test_a_journald_sources_mistakes_are_refused_with_their_path(source, where, says):
    with pytest.raises(ConfigError) as err:
        parse(_journald(**source))
    assert err.value.path == where and says in str(err.value), str(err.value)


@pytest.mark.parametrize("key, value", [("units", ["a.service"]), ("priority", "info"),
                                        ("journal_directory", "/var/log/journal"),
                                        ("matches", ["A=b"]), ("identifiers", ["x"])])
def test_only_a_journald_source_takes_its_filters(key, value):
    raw = {"broker": {"bootstrap_servers": "127.0.0.1:9092"},
           "sources": [{"type": "file", "paths": ["/var/log/*.log"], "topic": "t",
                        key: value}]}
    with pytest.raises(ConfigError) as err:
        parse(raw)
    assert err.value.path == f"sources[0].{key}" and "only journald" in str(err.value)


def test_two_journald_sources_taking_the_same_entries_into_one_topic_are_refused():
    raw = _journald(units=["a.service"])
    raw["sources"].append({**raw["sources"][0], "format": "message"})
    with pytest.raises(ConfigError) as err:
        parse(raw)
    assert err.value.path == "sources" and "same entries" in str(err.value)
    raw["sources"][1]["topic"] = "other"
    assert len(parse(raw).sources) == 2


def test_a_journald_source_routes_by_any_field_of_the_entry():
    src = parse(_journald(topic="journal.{_SYSTEMD_UNIT}", fallback_topic="journal.other",
                          key="{_HOSTNAME}", format="message")).sources[0]
    assert (src.topic, src.fallback_topic, src.key) == ("journal.{_SYSTEMD_UNIT}",
                                                        "journal.other", "{_HOSTNAME}")
