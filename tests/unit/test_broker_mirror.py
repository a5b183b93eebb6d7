"""MirrorMaker 2's properties as ``docket-broker mirror`` writes them, without starting it."""

from __future__ import annotations

import re

import pytest

from broker.errors import BrokerError
from broker.mirror import POLICY, Mirror, MirrorSpec


def _props(text: str) -> dict[str, str]:
    """The properties as Java reads them: a backslash escapes the character after it."""
    def unescape(v: str) -> str:
        return re.sub(r"\\(.)", lambda m: {"n": "\n", "r": "\r", "t": "\t"}.get(
            m.group(1), m.group(1)), v)
    return {k.strip(): unescape(v.strip()) for k, v in
            (line.split("=", 1) for line in text.splitlines() if line)}


def spec(**kw) -> MirrorSpec:
    return MirrorSpec(**{"source": "local", "target": "aggregate",
                         "source_bootstrap": "127.0.0.1:9092",
                         "target_bootstrap": "127.0.0.1:9192", "topics": r"app\..*", **kw})


def test_one_flow_local_to_aggregate_under_the_identity_policy():
    props = _props(spec(audit_topic="docket.audit").properties_text())
    assert props["clusters"] == "local, aggregate"
    assert props["local.bootstrap.servers"] == "127.0.0.1:9092"
    assert props["aggregate.bootstrap.servers"] == "127.0.0.1:9192"
    assert props["local->aggregate.enabled"] == "true"
    assert props["aggregate->local.enabled"] == "false"
    assert props["replication.policy.class"] == POLICY
    assert props["aggregate.producer.enable.idempotence"] == "true"
    assert props["sync.topic.acls.enabled"] == "false"
    # The audit topic is copied with the data; its dots match dots only.
    pattern = re.compile(props["local->aggregate.topics"])
    assert pattern.fullmatch("app.events") and pattern.fullmatch("docket.audit")
    assert not pattern.fullmatch("docketXaudit") and not pattern.fullmatch("web.events")
    assert not pattern.fullmatch("app-other")


def test_a_target_of_three_brokers_gets_three_replicas_of_what_the_mirror_creates():
    props = _props(spec(replication_factor=3).properties_text())
    assert props["replication.factor"] == "3"
    assert props["offset.storage.replication.factor"] == "3"
    assert props["heartbeats.topic.replication.factor"] == "3"


def test_properties_given_are_set_over_docket_s_and_the_spec_survives_json():
    s = spec(properties={"tasks.max": "4"}, audit_topic=None)
    assert _props(s.properties_text())["tasks.max"] == "4"
    assert _props(s.properties_text())["local->aggregate.topics"] == r"app\..*"
    assert MirrorSpec.from_json(s.to_json()) == s


@pytest.mark.parametrize("kw, message", [
    ({"target": "local"}, "two clusters"),
    ({"topics": ""}, "needs --topics"),
    ({"source": "Local DC"}, "cannot name a cluster"),
    ({"refresh_s": 0}, "at least 1"),
    ({"topics": "app(.*"}, "not a regular expression"),
])
def test_a_mirror_that_cannot_be_is_refused_plainly(kw, message):
    with pytest.raises(BrokerError, match=message):
        spec(**kw)


def test_a_process_caught_while_it_execs_is_asked_again_not_taken_for_gone(monkeypatch,
                                                                         tmp_path):
    """/proc/PID/cmdline is empty for a moment while ``setpriv`` execs the watcher: seen, a
    watcher just started reported stopped. The pid file's process, alive, is asked again."""
    import os

    from broker import mirror as mirror_module
    from broker.mirror import Mirror, MirrorSpec
    m = Mirror(tmp_path)
    m.spec_file.write_text(MirrorSpec("local", "aggregate", "a:1", "b:1", topics="x",
                                      audit_topic="docket.audit").to_json())
    m.watch_folder.mkdir()
    (m.watch_folder / "pid").write_text(f"{os.getpid()}\n")      # alive, for the test
    answers = [b"", b"", b"python\0-m\0audit.jobs.mirrored\0--flow\0local->aggregate\0"]
    monkeypatch.setattr(mirror_module, "_read_cmdline", lambda pid: answers.pop(0))
    assert m.watch_pid() == os.getpid() and answers == []
    monkeypatch.setattr(mirror_module, "_read_cmdline", lambda pid: b"python\0other\0")
    assert m.watch_pid() is None                                  # another program's pid


def test_secured_ends_get_their_java_settings_under_their_alias_and_the_watcher_its_files(
        tmp_path):
    password = tmp_path / "mirror.password"
    password.write_text("pw-of-the-mirror\n")
    password.chmod(0o600)
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n")
    cert, key = tmp_path / "mirror.pem", tmp_path / "mirror.key"
    cert.write_text("-----BEGIN CERTIFICATE-----\nc\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nk\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    s = spec(audit_topic="docket.audit",
             source_security={"security_protocol": "ssl", "ssl_ca_file": str(ca),
                              "ssl_certificate_file": str(cert), "ssl_key_file": str(key)},
             target_security={"security_protocol": "sasl_ssl", "sasl_username": "mirror",
                              "sasl_password_file": str(password), "ssl_ca_file": str(ca)})
    props = _props(s.properties_text(tmp_path / "secrets"))
    assert props["local.security.protocol"] == "SSL"
    assert props["local.ssl.keystore.type"] == "PEM"
    assert props["local.ssl.truststore.location"] == str(ca)
    assert props["aggregate.security.protocol"] == "SASL_SSL"
    assert props["aggregate.sasl.jaas.config"].startswith(
        'org.apache.kafka.common.security.scram.ScramLoginModule required username="mirror" ')
    assert not any(k.startswith(("security", "sasl", "ssl")) for k in props)
    # mirror.json holds the files, never what is in them; the watcher's settings likewise
    assert "pw-of-the-mirror" not in s.to_json() and MirrorSpec.from_json(s.to_json()) == s
    assert s.client_conf("target")["sasl.password"] == "pw-of-the-mirror"
    assert s.client_conf("source")["ssl.key.location"] == str(key)


def test_a_mirror_s_security_settings_are_checked_before_anything_starts():
    from docket_common.settings import ConfigError

    with pytest.raises(ConfigError) as e:
        spec(target_security={"security_protocol": "sasl_ssl", "sasl_username": "mirror"})
    assert e.value.path == "mirror.target.sasl_password_file"
    with pytest.raises(ConfigError) as e:
        spec(source_security={"security_protocol": "ssl", "sasl_password": "inline"})
    assert e.value.path == "mirror.source.sasl_password"


def test_the_watcher_refuses_a_kafka_config_it_cannot_use_with_a_clear_error(tmp_path, capsys):
    from audit.jobs.mirrored import main

    bad = tmp_path / "target.toml"
    bad.write_text('[kafka]\nsecurity_protocol = "sasl_ssl"\nsasl_username = "mirror"\n'
                   f'sasl_password_file = "{tmp_path / "missing"}"\n')
    rc = main(["--source", "local", "--target", "aggregate", "--source-bootstrap", "x:1",
               "--target-bootstrap", "y:1", "--topics", "app", "--target-kafka-config",
               str(bad)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "kafka.sasl_password_file" in err and "cannot read" in err


def test_mirror_up_takes_a_kafka_config_only_with_bootstrap_servers(tmp_path, capsys):
    from broker.cli import main

    conf = tmp_path / "k.toml"
    conf.write_text('[kafka]\nsecurity_protocol = "plaintext"\n')
    rc = main(["mirror", "up", "--source", "local", "--target", "aggregate", "--topics", "a",
               "--source-kafka-config", str(conf)])
    assert rc == 1
    assert "--source-kafka-config goes with --source-bootstrap" in capsys.readouterr().err


def test_a_secured_mirror_refers_to_its_secrets_and_never_writes_them_in_its_properties(
        tmp_path):
    """MirrorMaker 2 keeps its connectors' settings, unresolved, in a Kafka topic: a password
    or key in mm2.properties would be stored in clear on the clusters. Each is a reference to a
    private copy instead, resolved by Kafka's DirectoryConfigProvider."""
    password = tmp_path / "mirror.password"
    password.write_text('p"w-of-the-mirror\nsecond line ignored\n')
    password.chmod(0o600)
    ca, cert, key = tmp_path / "ca.pem", tmp_path / "mirror.pem", tmp_path / "mirror.key"
    ca.write_text("-----BEGIN CERTIFICATE-----\nca\n-----END CERTIFICATE-----\n")
    cert.write_text("-----BEGIN CERTIFICATE-----\nc\n-----END CERTIFICATE-----\n")
    key.write_text("-----BEGIN PRIVATE KEY-----\nthe-key-itself\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    s = spec(source_security={"security_protocol": "ssl", "ssl_ca_file": str(ca),
                              "ssl_certificate_file": str(cert), "ssl_key_file": str(key)},
             target_security={"security_protocol": "sasl_ssl", "sasl_username": "mirror",
                              "sasl_password_file": str(password), "ssl_ca_file": str(ca)})
    folder = tmp_path / "mirror"
    secrets = folder / "secrets"
    Mirror(folder).write_config(s)
    text = (folder / "mm2.properties").read_text()
    assert text == s.properties_text(secrets)
    assert "the-key-itself" not in text and "w-of-the-mirror" not in text
    assert "the-key-itself" not in (folder / "mirror.json").read_text()
    props = _props(text)
    assert props["config.providers"] == "dir"
    assert props["config.providers.dir.class"].endswith("DirectoryConfigProvider")
    assert props["local.ssl.keystore.key"] == f"${{dir:{secrets}:source.key}}"
    assert props["local.ssl.keystore.certificate.chain"] == f"${{dir:{secrets}:source.certificate}}"
    assert props["aggregate.sasl.jaas.config"].endswith(
        f'password="${{dir:{secrets}:target.password}}";')
    # The copies: the key whole, the password's first line as the JAAS line quotes it; the
    # properties name no file that is not written.
    assert (secrets / "source.key").read_text() == key.read_text()
    assert (secrets / "target.password").read_text() == 'p\\"w-of-the-mirror'
    assert sorted(f.name for f in secrets.iterdir()) == sorted(s.secret_files(secrets))
    assert oct(secrets.stat().st_mode & 0o777) == "0o700"
    assert all(oct(f.stat().st_mode & 0o777) == "0o600" for f in secrets.iterdir())
    # Rendering the text writes nothing.
    elsewhere = tmp_path / "elsewhere"
    s.properties_text(elsewhere)
    assert not elsewhere.exists()
    with pytest.raises(BrokerError, match="folder for the secrets"):
        s.properties_text()


def test_an_oauthbearer_end_logs_in_with_its_secret_by_reference_and_its_endpoint_allowed(
        tmp_path):
    """A side logging in with OAUTHBEARER: the client secret, like a password, is a reference
    to a private copy; MirrorMaker 2's JVM (a Kafka 4 client) may ask that side's token
    endpoint only when it is allowed by name; a spec without one adds no JVM option."""
    secret = tmp_path / "mirror.client-secret"
    secret.write_text("the-client-secret\n")
    secret.chmod(0o600)
    url = "http://127.0.0.1:8080/token"
    s = spec(target_security={"security_protocol": "sasl_ssl", "sasl_mechanism": "OAUTHBEARER",
                              "sasl_oauthbearer_token_endpoint_url": url,
                              "sasl_oauthbearer_client_id": "mirror",
                              "sasl_oauthbearer_client_secret_file": str(secret)})
    secrets = tmp_path / "secrets"
    props = _props(s.properties_text(secrets))
    assert "the-client-secret" not in s.properties_text(secrets)
    assert props["aggregate.sasl.mechanism"] == "OAUTHBEARER"
    assert props["aggregate.sasl.oauthbearer.token.endpoint.url"] == url
    assert props["aggregate.sasl.jaas.config"].endswith(
        f'clientId="mirror" clientSecret="${{dir:{secrets}:target.password}}";')
    assert s.secret_files(secrets) == {"target.password": "the-client-secret"}
    assert s.java_options() == [f"-Dorg.apache.kafka.sasl.oauthbearer.allowed.urls={url}"]
    assert spec().java_options() == []
    assert s.client_conf("target")["sasl.oauthbearer.client.secret"] == "the-client-secret"
