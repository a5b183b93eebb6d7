"""The security settings every Kafka client of docket shares: declared once, secrets read from
files (never the configuration), the files checked before anything connects, and the client
properties librdkafka and Spark's Kafka source take."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import parse as _parse
from agent.drain.producer import producer_config
from docket_common.kafka_security import KafkaSecurity, redact
from docket_common.settings import ConfigError


def parse_agent(raw: dict):
    """An agent config with one file source beside ``raw``'s sections."""
    return _parse({**raw, "sources": [{"type": "file", "paths": ["/tmp/*.log"],
                                       "topic": "app.events"}]})

PASSWORD = "s3cr3t-p@ss\"word"


@pytest.fixture
def files(tmp_path):
    pw = tmp_path / "kafka.password"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    cert = tmp_path / "client.pem"
    cert.write_text("-----BEGIN CERTIFICATE-----\nc\n-----END CERTIFICATE-----\n")
    key = tmp_path / "client.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\nk\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    return {"password": pw, "ca": ca, "cert": cert, "key": key}


def _sasl(files, **more) -> dict:
    return {"broker": {"security_protocol": "sasl_ssl", "sasl_username": "agent",
                       "sasl_password_file": str(files["password"]),
                       "ssl_ca_file": str(files["ca"]), **more}}


def test_sasl_ssl_reads_the_password_from_its_file_into_the_producer(files):
    cfg = parse_agent(_sasl(files))
    conf = producer_config(cfg, "python")
    assert conf["security.protocol"] == "SASL_SSL"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (conf["sasl.username"], conf["sasl.password"]) == ("agent", PASSWORD)
    assert conf["ssl.ca.location"] == str(files["ca"])
    assert PASSWORD not in str(cfg.values) and PASSWORD not in cfg.security.describe()
    assert redact(conf)["sasl.password"] == "(redacted)"


def test_a_changed_password_file_is_read_again(files):
    cfg = parse_agent(_sasl(files))
    before = producer_config(cfg, "python")["sasl.password"]
    files["password"].write_text("the new one\n")
    assert (before, producer_config(cfg, "python")["sasl.password"]) == (PASSWORD, "the new one")


def test_mutual_tls_names_the_certificate_and_key(files):
    cfg = parse_agent({"broker": {"security_protocol": "ssl", "ssl_ca_file": str(files["ca"]),
                                  "ssl_certificate_file": str(files["cert"]),
                                  "ssl_key_file": str(files["key"])}})
    conf = producer_config(cfg, "python")
    assert conf["security.protocol"] == "SSL"
    assert conf["ssl.certificate.location"] == str(files["cert"])
    assert conf["ssl.key.location"] == str(files["key"])
    assert "sasl.username" not in conf


def test_a_password_file_every_user_can_read_is_refused(files):
    files["password"].chmod(0o644)
    with pytest.raises(ConfigError) as e:
        parse_agent(_sasl(files))
    assert e.value.path == "broker.sasl_password_file"
    assert "readable by every user (mode 0644)" in e.value.problem
    assert "chmod 600" in e.value.render()


def test_a_key_every_user_can_read_is_refused(files):
    files["key"].chmod(0o644)
    with pytest.raises(ConfigError) as e:
        parse_agent({"broker": {"security_protocol": "ssl",
                                "ssl_certificate_file": str(files["cert"]),
                                "ssl_key_file": str(files["key"])}})
    assert e.value.path == "broker.ssl_key_file"


@pytest.mark.parametrize("key, problem", [
    ("sasl_password_file", "cannot read"), ("ssl_ca_file", "cannot read")])
def test_a_missing_file_is_named_with_its_key(files, key, problem):
    raw = _sasl(files)
    raw["broker"][key] = str(files["ca"]) + ".missing"
    with pytest.raises(ConfigError) as e:
        parse_agent(raw)
    assert e.value.path == f"broker.{key}" and problem in e.value.problem


def test_sasl_without_a_user_or_password_file_is_refused(files):
    with pytest.raises(ConfigError) as e:
        parse_agent({"broker": {"security_protocol": "sasl_ssl", "sasl_username": "agent"}})
    assert e.value.path == "broker.sasl_password_file"
    with pytest.raises(ConfigError) as e:
        parse_agent({"broker": {"security_protocol": "sasl_ssl",
                                "sasl_password_file": str(files["password"])}})
    assert e.value.path == "broker.sasl_username"


def test_settings_that_do_not_fit_the_protocol_are_refused(files):
    with pytest.raises(ConfigError) as e:
        parse_agent({"broker": {"sasl_username": "agent"}})
    assert e.value.path == "broker.sasl_username"
    with pytest.raises(ConfigError) as e:
        parse_agent({"broker": {"security_protocol": "ssl",
                                "ssl_certificate_file": str(files["cert"])}})
    assert e.value.path == "broker.ssl_key_file"


def test_a_secret_among_the_pass_through_options_is_refused(files):
    with pytest.raises(ConfigError) as e:
        parse_agent({"broker": {"librdkafka_options": {"sasl.password": PASSWORD}}})
    assert e.value.path == "broker.librdkafka_options.sasl.password"
    assert "sasl_password_file" in e.value.render()
    with pytest.raises(ConfigError) as e:
        parse_agent({"broker": {**_sasl(files)["broker"],
                                "librdkafka_options": {"security.protocol": "SSL"}}})
    assert e.value.path == "broker.librdkafka_options.security.protocol"


def test_systemd_credentials_are_found_in_their_folder(files, monkeypatch):
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(files["password"].parent))
    cfg = parse_agent(_sasl(files, sasl_password_file="${CREDENTIALS_DIRECTORY}/kafka.password"))
    assert producer_config(cfg, "python")["sasl.password"] == PASSWORD
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError) as e:
        parse_agent(_sasl(files, sasl_password_file="${CREDENTIALS_DIRECTORY}/kafka.password"))
    assert "LoadCredential" in e.value.render()


def test_spark_gets_a_jaas_line_with_the_password_escaped(files):
    security = KafkaSecurity("kafka", "sasl_ssl", "SCRAM-SHA-512", "count",
                             str(files["password"]), str(files["ca"]))
    opts = security.spark_options()
    assert opts["kafka.security.protocol"] == "SASL_SSL"
    assert opts["kafka.sasl.mechanism"] == "SCRAM-SHA-512"
    jaas = opts["kafka.sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.scram.ScramLoginModule required ")
    assert 'username="count"' in jaas and 'password="s3cr3t-p@ss\\"word";' in jaas
    assert opts["kafka.ssl.truststore.type"] == "PEM"
    assert opts["kafka.ssl.truststore.location"] == str(files["ca"])
    assert all(v == "(redacted)" for k, v in redact(opts).items() if "jaas" in k)


def test_plaintext_adds_nothing():
    cfg = parse_agent({})
    conf = producer_config(cfg, "python")
    assert not any(k.startswith(("security.", "sasl.", "ssl.")) for k in conf)
    assert cfg.security.describe() == "plaintext"


def test_the_spark_jobs_take_the_settings_from_a_file_never_the_command_line(files, tmp_path):
    from audit.cli import _kafka_options
    from audit.contract.errors import AuditError
    from audit.jobs.spark import JobOptions
    from docket_common.kafka_security import read_kafka_config

    conf = tmp_path / "kafka.toml"
    conf.write_text(f'[kafka]\nsecurity_protocol = "sasl_ssl"\nsasl_username = "count"\n'
                    f'sasl_password_file = "{files["password"]}"\n'
                    f'ssl_ca_file = "{files["ca"]}"\n')
    opts = JobOptions("127.0.0.1:9093", security=read_kafka_config(conf),
                      kafka_options={"fetch.max.bytes": "1000"})
    source = opts.source_options()
    assert source["kafka.security.protocol"] == "SASL_SSL"
    assert 'username="count"' in source["kafka.sasl.jaas.config"]
    assert source["kafka.fetch.max.bytes"] == "1000"
    client = opts.client_conf()
    assert (client["sasl.username"], client["sasl.password"]) == ("count", PASSWORD)
    assert client["fetch.max.bytes"] == "1000"
    with pytest.raises(AuditError) as e:
        _kafka_options(["sasl.jaas.config=x"])
    assert "ps shows it" in str(e.value)
    conf.write_text('[kafka]\nsecurity_protocol = "sasl_ssl"\nsasl_username = "count"\n')
    with pytest.raises(ConfigError) as e:
        read_kafka_config(conf)
    assert e.value.path == "kafka.sasl_password_file"


def test_the_reconciler_checks_its_files_where_it_connects_and_the_dashboard_never(files):
    """The dashboard reads the reconciler's configuration without its credentials (they are
    the reconciler service's): parsing checks the settings' form; `validate` and `reconcile`
    check the files."""
    from audit.reconcile.config import parse as parse_reconcile

    raw = {"reconcile": {"security_protocol": "sasl_ssl", "sasl_username": "reconcile",
                         "sasl_password_file": "${CREDENTIALS_DIRECTORY}/kafka-password"}}
    cfg = parse_reconcile(raw)                       # no credentials here: parsed all the same
    with pytest.raises(ConfigError) as e:
        cfg.security.check_files()
    assert "CREDENTIALS_DIRECTORY" in e.value.render()
    with pytest.raises(ConfigError) as e:
        parse_reconcile({"reconcile": {"security_protocol": "sasl_ssl"}})
    assert e.value.path == "reconcile.sasl_username"
    raw["reconcile"]["sasl_password_file"] = str(files["password"])
    conf = parse_reconcile(raw).security.librdkafka_properties()
    assert (conf["sasl.username"], conf["sasl.password"]) == ("reconcile", PASSWORD)


def test_a_kafka_config_file_written_from_settings_reads_back_the_same(files, tmp_path):
    from docket_common.kafka_security import kafka_config_text, read_kafka_config

    for security in (KafkaSecurity("kafka", "sasl_ssl", "SCRAM-SHA-256", "mirror",
                                   str(files["password"]), str(files["ca"])),
                     KafkaSecurity("kafka", "ssl", ca_file=str(files["ca"]),
                                   certificate_file=str(files["cert"]),
                                   key_file=str(files["key"]))):
        path = tmp_path / "kafka.toml"
        path.write_text(kafka_config_text(security))
        assert read_kafka_config(path) == security
        assert PASSWORD not in path.read_text()
        assert KafkaSecurity.from_table(security.table()) == security
    with pytest.raises(ConfigError) as e:
        KafkaSecurity.from_table({"security_protocol": "sasl_ssl", "sasl_password": "x"})
    assert e.value.path == "kafka.sasl_password"
    with pytest.raises(ConfigError) as e:
        KafkaSecurity.from_table({"security_protocol": "sasl_ssl", "sasl_username": "u"},
                                 "mirror.source")
    assert e.value.path == "mirror.source.sasl_password_file"


def test_redact_hides_a_secret_under_any_prefix(files):
    security = KafkaSecurity("kafka", "sasl_ssl", "SCRAM-SHA-512", "count",
                             str(files["password"]), str(files["ca"]))
    for conf in (security.java_properties(), security.spark_options(),
                 {f"aggregate.{k}": v for k, v in security.java_properties().items()}):
        shown = redact(conf)
        assert not any(PASSWORD.split('"')[0] in str(v) for v in shown.values()), shown
        assert any(v == "(redacted)" for v in shown.values())


def _oauth(files, **more) -> dict:
    return {"broker": {"security_protocol": "sasl_ssl", "sasl_mechanism": "OAUTHBEARER",
                       "sasl_oauthbearer_token_endpoint_url": "https://idp.test/oauth2/token",
                       "sasl_oauthbearer_client_id": "agent",
                       "sasl_oauthbearer_client_secret_file": str(files["password"]),
                       "ssl_ca_file": str(files["ca"]), **more}}


@pytest.mark.parametrize("path", ["python", "native"])
def test_oauthbearer_asks_the_token_endpoint_with_the_secret_from_its_file(files, path):
    cfg = parse_agent(_oauth(files, sasl_oauthbearer_scope="kafka produce"))
    conf = producer_config(cfg, path)
    assert (conf["sasl.mechanism"], conf["sasl.oauthbearer.method"]) == ("OAUTHBEARER", "oidc")
    assert conf["sasl.oauthbearer.token.endpoint.url"] == "https://idp.test/oauth2/token"
    assert (conf["sasl.oauthbearer.client.id"], conf["sasl.oauthbearer.client.secret"]) == \
        ("agent", PASSWORD)
    assert conf["sasl.oauthbearer.scope"] == "kafka produce"
    assert "sasl.username" not in conf and "sasl.password" not in conf
    assert PASSWORD not in cfg.security.describe() and "OAUTHBEARER" in cfg.security.describe()
    assert redact(conf)["sasl.oauthbearer.client.secret"] == "(redacted)"


def test_oauthbearer_for_java_clients_logs_in_through_the_oidc_handler(files):
    security = KafkaSecurity("kafka", "sasl_ssl", "OAUTHBEARER", ca_file=str(files["ca"]),
                             token_endpoint_url="http://127.0.0.1:9/token", client_id="count",
                             client_secret_file=str(files["password"]))
    opts = security.spark_options()
    assert opts["kafka.sasl.mechanism"] == "OAUTHBEARER"
    assert opts["kafka.sasl.login.callback.handler.class"].endswith(
        "oauthbearer.OAuthBearerLoginCallbackHandler")
    assert opts["kafka.sasl.oauthbearer.token.endpoint.url"] == "http://127.0.0.1:9/token"
    jaas = opts["kafka.sasl.jaas.config"]
    assert jaas.startswith("org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule "
                           "required ")
    assert 'clientId="count"' in jaas and 'clientSecret="s3cr3t-p@ss\\"word";' in jaas
    assert "scope=" not in jaas
    assert all(v == "(redacted)" for k, v in redact(opts).items() if "jaas" in k)
    refs = {}
    by_ref = security.java_properties(lambda name, value: refs.setdefault(name, value) and
                                      f"${{dir:/s:{name}}}")
    assert refs == {"password": 's3cr3t-p@ss\\"word'}
    assert 'clientSecret="${dir:/s:password}"' in by_ref["sasl.jaas.config"]


@pytest.mark.parametrize("more, key, problem", [
    ({"sasl_oauthbearer_client_id": None}, "sasl_oauthbearer_client_id", "missing"),
    ({"sasl_oauthbearer_client_secret_file": None}, "sasl_oauthbearer_client_secret_file",
     "missing"),
    ({"sasl_oauthbearer_token_endpoint_url": "idp.test/token"},
     "sasl_oauthbearer_token_endpoint_url", "not an http(s) URL"),
    ({"sasl_username": "agent"}, "sasl_username", "OAUTHBEARER"),
    ({"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "agent",
      "sasl_password_file": "/nonexistent"}, "sasl_oauthbearer_token_endpoint_url",
     "not \"OAUTHBEARER\""),
    ({"security_protocol": "ssl"}, "sasl_oauthbearer_token_endpoint_url",
     "security_protocol is 'ssl'"),
    ({"sasl_oauthbearer_token_endpoint_url": "https://"}, "sasl_oauthbearer_token_endpoint_url",
     "with a host"),
    ({"sasl_oauthbearer_token_endpoint_url": "https://me:pw@idp.test/token"},
     "sasl_oauthbearer_token_endpoint_url", "user or password"),
    ({"sasl_oauthbearer_token_endpoint_url": "https://idp.test/a,https://b/"},
     "sasl_oauthbearer_token_endpoint_url", "comma or a space"),
    ({"sasl_oauthbearer_token_endpoint_url": "http://idp.test/token"},
     "sasl_oauthbearer_token_endpoint_url", "unencrypted to another host"),
    ({"sasl_oauthbearer_token_endpoint_url": "http://10.0.0.7:8080/token"},
     "sasl_oauthbearer_token_endpoint_url", "unencrypted to another host"),
])
def test_oauthbearer_settings_that_do_not_fit_are_refused_by_key(files, more, key, problem):
    _refused_by_key(_oauth(files), more, key, problem)


def _refused_by_key(raw: dict, more: dict, key: str, problem: str) -> None:
    """``raw`` with ``more`` over its ``[broker]`` (None: the key removed) is refused at
    ``broker.KEY``, saying ``problem``."""
    raw["broker"].update(more)
    raw["broker"] = {k: v for k, v in raw["broker"].items() if v is not None}
    with pytest.raises(ConfigError) as e:
        parse_agent(raw).security.check()
    assert e.value.path == f"broker.{key}" and problem in e.value.problem


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080/token", "http://[::1]/token",
                                 "http://localhost/token", "https://idp.test/token"])
def test_a_token_endpoint_over_https_or_on_this_host_is_taken(files, url):
    raw = _oauth(files)
    raw["broker"]["sasl_oauthbearer_token_endpoint_url"] = url
    parse_agent(raw).security.check()


def test_an_oauthbearer_secret_every_user_can_read_is_refused(files):
    files["password"].chmod(0o644)
    with pytest.raises(ConfigError) as e:
        parse_agent(_oauth(files)).security.check()
    assert e.value.path == "broker.sasl_oauthbearer_client_secret_file"


def test_an_oauthbearer_kafka_config_file_reads_back_the_same(files, tmp_path):
    from docket_common.kafka_security import kafka_config_text, read_kafka_config

    security = KafkaSecurity("kafka", "sasl_ssl", "OAUTHBEARER", ca_file=str(files["ca"]),
                             token_endpoint_url="https://idp.test/token", client_id="land",
                             client_secret_file=str(files["password"]), scope="kafka")
    path = tmp_path / "kafka.toml"
    path.write_text(kafka_config_text(security))
    assert read_kafka_config(path) == security
    assert PASSWORD not in path.read_text()


@pytest.mark.parametrize("path", ["python", "native"])
def test_validate_asks_no_token_endpoint(files, path):
    """A client made with OIDC asks for its token at once, and one whose endpoint does not
    answer takes 20 s to destroy: the configuration check makes none — the endpoint (one that
    accepts and never answers) is never called."""
    import socket
    import time

    from agent.drain.native import extension_installed
    from agent.preflight import check_producer

    if path == "native" and not extension_installed():
        pytest.skip("the native extension is not built here")
    endpoint = socket.socket()
    endpoint.bind(("127.0.0.1", 0))
    endpoint.listen(8)
    endpoint.setblocking(False)
    url = f"http://127.0.0.1:{endpoint.getsockname()[1]}/token"
    try:
        raw = _oauth(files, sasl_oauthbearer_token_endpoint_url=url, send_path=path)
        del raw["broker"]["ssl_ca_file"]      # the system's CAs (the fixture's is no PEM)
        check_producer(parse_agent(raw))
        time.sleep(0.5)                       # a token request would have connected by now
        with pytest.raises(BlockingIOError):
            endpoint.accept()
    finally:
        endpoint.close()


def test_an_https_token_endpoint_is_trusted_by_its_ca_file_or_the_systems(files, monkeypatch):
    """librdkafka takes the endpoint's CA from ``https.ca.location`` (the build confluent-kafka
    ships looks for Red Hat's bundle by default, missing on Debian); Java from SSL options of
    the JAAS line."""
    from docket_common import kafka_security as K

    security = KafkaSecurity("kafka", "sasl_ssl", "OAUTHBEARER",
                             token_endpoint_url="https://idp.test/token", client_id="count",
                             client_secret_file=str(files["password"]),
                             oauth_ca_file=str(files["ca"]))
    assert security.librdkafka_properties()["https.ca.location"] == str(files["ca"])
    jaas = security.java_properties()["sasl.jaas.config"]
    assert f'ssl.truststore.type="PEM" ssl.truststore.location="{files["ca"]}";' in jaas
    system = files["ca"].parent / "bundle.crt"
    system.write_text("")
    monkeypatch.setattr(K, "SYSTEM_CA_BUNDLES", ("/nonexistent/ca.crt", str(system)))
    plain = KafkaSecurity("kafka", "sasl_ssl", "OAUTHBEARER",
                          token_endpoint_url="https://idp.test/token", client_id="count",
                          client_secret_file=str(files["password"]))
    assert plain.librdkafka_properties()["https.ca.location"] == str(system)
    assert "ssl.truststore" not in plain.java_properties()["sasl.jaas.config"]
    insecure = KafkaSecurity("kafka", "sasl_ssl", "OAUTHBEARER",
                             token_endpoint_url="http://127.0.0.1:8080/token", client_id="x",
                             client_secret_file=str(files["password"]))
    assert "https.ca.location" not in insecure.librdkafka_properties()


# -- GSSAPI (Kerberos) ------------------------------------------------------------------------
def _kerberos(files, **more) -> dict:
    keytab = files["password"].parent / "agent.keytab"
    keytab.write_bytes(b"\x05\x02keys")
    keytab.chmod(0o600)
    return {"broker": {"security_protocol": "sasl_ssl", "sasl_mechanism": "GSSAPI",
                       "sasl_kerberos_principal": "docket-agent/host1.example.com@EXAMPLE.COM",
                       "sasl_kerberos_keytab_file": str(keytab),
                       "ssl_ca_file": str(files["ca"]), **more}}


@pytest.mark.parametrize("path", ["python", "native"])
def test_kerberos_hands_librdkafka_the_principal_and_keytab_and_a_ticket_cache_of_its_own(
        files, path, monkeypatch, tmp_path):
    monkeypatch.setenv("KRB5CCNAME", "")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    cfg = parse_agent(_kerberos(files))
    cfg.security.check()
    conf = producer_config(cfg, path)
    assert conf["sasl.mechanism"] == "GSSAPI"
    assert conf["sasl.kerberos.principal"] == "docket-agent/host1.example.com@EXAMPLE.COM"
    assert conf["sasl.kerberos.keytab"] == str(files["password"].parent / "agent.keytab")
    assert conf["sasl.kerberos.service.name"] == "kafka"
    assert "sasl.username" not in conf and "sasl.password" not in conf
    import os
    cache = os.environ["KRB5CCNAME"]
    folder = tmp_path / f"docket-krb5-{os.getuid()}"
    assert cache.startswith(f"FILE:{folder}/docket-agent_host1.example.com_EXAMPLE.COM-")
    assert oct(folder.stat().st_mode & 0o777) == oct(0o700)
    assert cfg.security.describe() == \
        "sasl_ssl, GSSAPI principal docket-agent/host1.example.com@EXAMPLE.COM"


def test_a_ticket_cache_its_user_named_is_kept_and_one_docket_chose_is_replaced(
        files, monkeypatch, tmp_path):
    from docket_common.kafka_security import own_ticket_cache
    monkeypatch.setenv("KRB5CCNAME", "FILE:/run/user/1000/krb5cc")
    assert own_ticket_cache("agent@EXAMPLE.COM") == "FILE:/run/user/1000/krb5cc"
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setenv("KRB5CCNAME", "")
    first = own_ticket_cache("mirror@EXAMPLE.COM")                  # inherited by a child …
    assert own_ticket_cache("reconcile@EXAMPLE.COM") != first       # … which holds its own
    assert "/reconcile_EXAMPLE.COM-" in own_ticket_cache("reconcile@EXAMPLE.COM")
    # one file per principal, within the folder, whatever the principal's characters
    caches = {own_ticket_cache(p) for p in ("a/b@R", "a_b@R", "..", ".")}
    assert len(caches) == 4
    assert all(c.rsplit("/", 1)[0] == first.rsplit("/", 1)[0] for c in caches)


def test_a_ticket_cache_folder_others_may_enter_is_refused(files, monkeypatch, tmp_path):
    import os
    import tempfile

    from docket_common.kafka_security import own_ticket_cache
    monkeypatch.setenv("KRB5CCNAME", "")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)
    folder = tmp_path / f"docket-krb5-{os.getuid()}"
    folder.mkdir(mode=0o777)
    folder.chmod(0o777)
    with pytest.raises(ConfigError) as e:
        own_ticket_cache("agent@EXAMPLE.COM")
    assert e.value.path == "KRB5CCNAME" and "alone" in e.value.problem


def test_kerberos_for_java_clients_logs_in_from_the_keytab(files):
    security = KafkaSecurity("kafka", "sasl_ssl", "GSSAPI", ca_file=str(files["ca"]),
                             kerberos_principal="count@EXAMPLE.COM",
                             keytab_file="/etc/docket/count.keytab", service_name="kafka-prod")
    opts = security.spark_options()
    assert opts["kafka.sasl.mechanism"] == "GSSAPI"
    assert opts["kafka.sasl.kerberos.service.name"] == "kafka-prod"
    assert opts["kafka.sasl.jaas.config"] == (
        'com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true storeKey=true '
        'doNotPrompt=true keyTab="/etc/docket/count.keytab" principal="count@EXAMPLE.COM";')
    assert security.table()["sasl_kerberos_service_name"] == "kafka-prod"


@pytest.mark.parametrize("more, key, problem", [
    ({"sasl_kerberos_principal": None}, "sasl_kerberos_principal", "missing"),
    ({"sasl_kerberos_keytab_file": None}, "sasl_kerberos_keytab_file", "missing"),
    ({"sasl_username": "agent"}, "sasl_username", "\"GSSAPI\""),
    ({"sasl_kerberos_principal": "agent; rm -rf /"}, "sasl_kerberos_principal",
     "a character"),
    ({"sasl_kerberos_principal": "agent$(id)@X"}, "sasl_kerberos_principal", "a character"),
    ({"sasl_kerberos_principal": "-t/etc/krb5.keytab"}, "sasl_kerberos_principal",
     "starts with -"),
    ({"sasl_kerberos_service_name": "kafka x"}, "sasl_kerberos_service_name", "not a service"),
    ({"sasl_kerberos_service_name": "kafka/b@R"}, "sasl_kerberos_service_name",
     "not a service"),
    ({"sasl_kerberos_keytab_file": "${CREDENTIALS_DIRECTORY}/$x.keytab"},
     "sasl_kerberos_keytab_file", "a quote"),
    ({"sasl_kerberos_keytab_file": '/etc/"x".keytab'}, "sasl_kerberos_keytab_file",
     "a quote"),
    ({"sasl_kerberos_keytab_file": "/etc/$HOME.keytab"}, "sasl_kerberos_keytab_file",
     "a quote"),
    ({"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "agent",
      "sasl_password_file": "/nonexistent"}, "sasl_kerberos_principal", "not \"sasl_ssl\""),
    ({"sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "agent",
      "sasl_password_file": "/nonexistent", "sasl_kerberos_principal": None,
      "sasl_kerberos_keytab_file": None, "sasl_kerberos_service_name": "kafka-prod"},
     "sasl_kerberos_service_name", "not \"sasl_ssl\""),
])
def test_kerberos_settings_that_do_not_fit_are_refused_by_key(files, more, key, problem):
    _refused_by_key(_kerberos(files), more, key, problem)


def test_a_keytab_from_systemd_credentials_is_taken(files, monkeypatch):
    keytab = files["password"].parent / "agent.keytab"
    raw = _kerberos(files, sasl_kerberos_keytab_file="${CREDENTIALS_DIRECTORY}/agent.keytab")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(keytab.parent))
    monkeypatch.setenv("KRB5CCNAME", "FILE:/tmp/unused")
    cfg = parse_agent(raw)
    cfg.security.check()
    assert producer_config(cfg, "python")["sasl.kerberos.keytab"] == str(keytab)
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", '/run/"x"')     # what it resolves to, checked
    with pytest.raises(ConfigError) as e:
        producer_config(cfg, "python")
    assert e.value.path == "broker.sasl_kerberos_keytab_file"


def test_one_process_with_two_kerberos_principals_is_refused(files):
    from docket_common.kafka_security import check_one_principal

    def side(section, principal):
        return KafkaSecurity(section, "sasl_ssl", "GSSAPI", kerberos_principal=principal,
                             keytab_file="/k")
    check_one_principal((side("mirror.source", "m@A"), side("mirror.target", "m@A"), None),
                        "the watcher")
    with pytest.raises(ConfigError) as e:
        check_one_principal((side("mirror.source", "m@A"), side("mirror.target", "m@B")),
                            "the mirror's watcher")
    assert e.value.path == "mirror.target.sasl_kerberos_principal"
    assert "m@A and m@B" in e.value.problem


def test_a_keytab_every_user_can_read_is_refused(files):
    raw = _kerberos(files)
    keytab = files["password"].parent / "agent.keytab"
    keytab.chmod(0o644)
    with pytest.raises(ConfigError) as e:
        parse_agent(raw).security.check()
    assert e.value.path == "broker.sasl_kerberos_keytab_file"


def test_kerberos_without_gssapi_in_librdkafka_or_kinit_is_refused_saying_which(
        files, monkeypatch):
    from docket_common import kafka_security
    cfg = parse_agent(_kerberos(files))
    monkeypatch.setattr(kafka_security, "gssapi_refused",
                        lambda: "No provider for SASL mechanism GSSAPI")
    with pytest.raises(ConfigError) as e:
        producer_config(cfg, "python")
    assert e.value.path == "broker.sasl_mechanism" and "No provider" in e.value.problem
    monkeypatch.setattr(kafka_security, "gssapi_refused", lambda: None)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError) as e:
        producer_config(cfg, "python")
    assert "kinit" in e.value.problem and "krb5-user" in e.value.hint
    monkeypatch.undo()
    monkeypatch.setattr(kafka_security, "SASL_PLUGIN_DIRS", ("/nonexistent",))
    with pytest.raises(ConfigError) as e:
        producer_config(cfg, "python")
    assert "GSSAPI module" in e.value.problem and "gssapi-mit" in e.value.hint


def test_the_librdkafka_make_setup_builds_takes_gssapi():
    """make setup's build (packaging/build_kafka_client.py): Kerberos, in both send paths'
    one librdkafka."""
    from docket_common.kafka_security import gssapi_refused
    assert gssapi_refused() is None


def test_the_installed_client_finds_librdkafka_beside_it_and_nowhere_else():
    """The run path of the installed confluent-kafka's extension is its own library folder
    alone: the build machine's interpreter folder in it would let another librdkafka win."""
    import importlib.util

    import confluent_kafka.cimpl

    script = Path(__file__).parents[2] / "packaging" / "build_kafka_client.py"
    spec = importlib.util.spec_from_file_location("build_kafka_client", script)
    build = importlib.util.module_from_spec(spec)    # (``packaging`` is also PyPI's package)
    spec.loader.exec_module(build)
    assert build.RUN_PATH == "$ORIGIN/../confluent_kafka.libs"
    assert build.run_path(Path(confluent_kafka.cimpl.__file__)) == build.RUN_PATH
