"""A secured local cluster's generated settings and each role's ACLs, without starting Kafka
(or openssl: the credentials a test needs are written by hand)."""

from __future__ import annotations

import re
import stat
from pathlib import Path

import pytest

from broker import cluster as cluster_mod
from broker import security
from broker.cli import main as broker_main
from broker.cluster import Layout, LocalCluster, Node
from broker.errors import BrokerError, SecuritySetupFailed
from broker.security import (
    ADMIN,
    BROKER,
    MTLS,
    PLAINTEXT,
    PRINCIPAL_RULES,
    SASL_SSL,
    USERS,
    Acl,
    Scope,
    Security,
    grants_table,
    kafka_acls_lines,
    role_acls,
    write_argument_file,
)

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _props(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if line)


def _fake_passwords(folder: Path) -> dict[str, str]:
    """What Security.create writes for sasl_ssl, minus openssl: one password file per user."""
    users = folder / "users"
    users.mkdir(parents=True)
    out = {}
    for user in (*USERS, BROKER):
        out[user] = f"pw-{user}-0123456789"
        (users / f"{user}.password").write_text(out[user])
        (users / f"{user}.password").chmod(0o600)
    return out


def _secured_cluster(tmp_path: Path, mode: str, brokers: int = 1) -> tuple[LocalCluster, Layout]:
    cluster = LocalCluster(tmp_path)
    layout = cluster._plan(brokers, 20000, mode)
    cluster.layout_file.write_text(layout.to_json())
    return cluster, layout


# -- the brokers' settings ---------------------------------------------------------------------
def test_a_plaintext_cluster_keeps_its_plain_listeners_and_no_authorizer(tmp_path):
    cluster, layout = _secured_cluster(tmp_path, PLAINTEXT)
    cluster._write_node_files(layout, layout.nodes[0])
    props = _props((cluster.node_dir(1) / "server.properties").read_text())
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:20000,CONTROLLER://127.0.0.1:20001"
    assert props["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert props["inter.broker.listener.name"] == "PLAINTEXT"
    assert not any(k.startswith(("ssl.", "sasl.", "authorizer", "super.")) for k in props)


def test_a_sasl_ssl_cluster_authenticates_with_scram_over_tls_and_enforces_acls(tmp_path):
    cluster, layout = _secured_cluster(tmp_path, SASL_SSL)
    passwords = _fake_passwords(cluster.security_dir)
    cluster._write_node_files(layout, layout.nodes[0])
    text = (cluster.node_dir(1) / "server.properties").read_text()
    props = _props(text)
    assert props["listeners"] == "SASL_SSL://127.0.0.1:20000,CONTROLLER://127.0.0.1:20001"
    assert props["advertised.listeners"] == "SASL_SSL://127.0.0.1:20000"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SSL"
    assert props["inter.broker.listener.name"] == "SASL_SSL"
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert props["sasl.mechanism.inter.broker.protocol"] == "SCRAM-SHA-512"
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert "ssl.client.auth" not in props          # clients authenticate with SCRAM
    assert props["authorizer.class.name"] == \
        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["super.users"] == "User:admin;User:broker"
    assert props["ssl.keystore.type"] == props["ssl.truststore.type"] == "PEM"
    assert props["ssl.truststore.location"] == str(cluster.security_dir / "ca.crt")
    # the brokers' own password is read from its file by Kafka, never written here
    jaas = props["listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config"]
    assert f'password="${{dir:{cluster.security_dir / "users"}:broker.password}}"' in jaas
    assert props["config.providers.dir.class"].endswith("DirectoryConfigProvider")
    assert not any(pw in text for pw in passwords.values())


def test_an_mtls_cluster_requires_client_certificates_and_names_users_by_their_cn(tmp_path):
    cluster, layout = _secured_cluster(tmp_path, MTLS, brokers=3)
    cluster._write_node_files(layout, layout.nodes[2])
    props = _props((cluster.node_dir(3) / "server.properties").read_text())
    assert props["listeners"] == "SSL://127.0.0.1:20002,CONTROLLER://127.0.0.1:20005"
    assert props["listener.security.protocol.map"] == "SSL:SSL,CONTROLLER:SSL"
    assert props["inter.broker.listener.name"] == "SSL"
    assert props["ssl.client.auth"] == "required"
    assert props["ssl.principal.mapping.rules"] == PRINCIPAL_RULES
    assert not any(k.startswith("sasl.") for k in props)
    assert props["default.replication.factor"] == "3"


@pytest.mark.parametrize("dn,principal", [
    ("CN=agent", "agent"), ("CN=count,O=docket", "count"),
    ("CN=land,OU=audit,O=docket,C=DE", "land"), ("O=docket,CN=agent", None)])
def test_the_principal_of_a_certificate_is_its_common_name(dn, principal):
    # Kafka's rule: RULE:<java regex>/<replacement>/ then DEFAULT (the whole DN)
    rule = re.fullmatch(r"RULE:(.*)/(.*)/,DEFAULT", PRINCIPAL_RULES)
    pattern, replacement = rule.group(1), rule.group(2).replace("$1", r"\1")
    match = re.fullmatch(pattern, dn)
    assert (match.expand(replacement) if match else None) == principal


def test_scram_users_are_every_user_and_the_brokers(tmp_path):
    passwords = _fake_passwords(tmp_path)
    args = Security(SASL_SSL, tmp_path).scram_arguments()
    assert args[0::2] == ["--add-scram"] * (len(USERS) + 1)
    assert set(args[1::2]) == {f"SCRAM-SHA-512=[name={u},password={passwords[u]}]"
                               for u in (*USERS, BROKER)}
    assert Security(MTLS, tmp_path).scram_arguments() == []


def test_formatting_passes_the_scram_passwords_in_an_argument_file_never_on_the_command_line(
        tmp_path, monkeypatch):
    cluster, layout = _secured_cluster(tmp_path, SASL_SSL)
    passwords = _fake_passwords(cluster.security_dir)
    cluster._write_node_files(layout, layout.nodes[0])
    seen = {}

    def run(cmd, **kw):
        argfile = Path(cmd[1][1:])
        seen.update(cmd=cmd, mode=stat.S_IMODE(argfile.stat().st_mode), text=argfile.read_text())
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(cluster_mod.subprocess, "run", run)
    cluster._format(Path("/libs"), layout.nodes[0], layout)
    assert len(seen["cmd"]) == 2 and seen["cmd"][1].startswith("@")
    assert not any(pw in " ".join(seen["cmd"]) for pw in passwords.values())
    assert seen["mode"] == 0o600
    assert '"kafka.tools.StorageTool"' in seen["text"]
    assert f'"SCRAM-SHA-512=[name=agent,password={passwords["agent"]}]"' in seen["text"]
    assert not Path(seen["cmd"][1][1:]).exists()      # removed once the tool has run


def test_a_plaintext_cluster_formats_with_the_plain_command(tmp_path, monkeypatch):
    cluster, layout = _secured_cluster(tmp_path, PLAINTEXT)
    cluster._write_node_files(layout, layout.nodes[0])
    seen = []

    def run(cmd, **kw):
        seen.append(cmd)
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(cluster_mod.subprocess, "run", run)
    cluster._format(Path("/libs"), layout.nodes[0], layout)
    assert "kafka.tools.StorageTool" in seen[0] and "--add-scram" not in seen[0]


def test_an_argument_file_quotes_what_the_java_launcher_would_split(tmp_path):
    write_argument_file(tmp_path / "a", ["-cp", "/a b/*", 'say "hi"', "back\\slash"])
    assert (tmp_path / "a").read_text() == \
        '"-cp"\n"/a b/*"\n"say \\"hi\\""\n"back\\\\slash"\n'
    assert stat.S_IMODE((tmp_path / "a").stat().st_mode) == 0o600


def test_a_restart_refuses_credentials_that_went_missing(tmp_path):
    _fake_passwords(tmp_path)
    (tmp_path / "users" / "agent.password").unlink()
    with pytest.raises(SecuritySetupFailed, match="agent.password"):
        Security(SASL_SSL, tmp_path).check()
    Security(PLAINTEXT, tmp_path / "nothing").check()      # plaintext needs no files


def test_up_refuses_to_change_the_security_of_an_existing_cluster(tmp_path):
    cluster, _ = _secured_cluster(tmp_path, SASL_SSL)
    with pytest.raises(BrokerError, match="secured as sasl_ssl; asked for mtls") as err:
        cluster.up(brokers=1, security=MTLS)
    assert "--fresh" in err.value.hint


def test_the_security_mode_survives_a_json_round_trip_and_old_layouts_are_plaintext():
    layout = Layout("abc", "4.1.1", (Node(1, 1, 2),), MTLS)
    assert Layout.from_json(layout.to_json()) == layout
    old = '{"cluster_id": "abc", "kafka_version": "4.1.1", "nodes": [{"node_id": 1, ' \
          '"port": 1, "controller_port": 2}]}'
    assert Layout.from_json(old).security == PLAINTEXT


def test_an_unknown_mode_is_refused(tmp_path):
    with pytest.raises(BrokerError, match="not one of plaintext, sasl_ssl, mtls"):
        LocalCluster(tmp_path)._plan(1, 20000, "ssl")


# -- clients' settings --------------------------------------------------------------------------
def test_a_sasl_client_reads_its_password_from_the_file_and_prints_only_the_file(tmp_path):
    passwords = _fake_passwords(tmp_path)
    sec = Security(SASL_SSL, tmp_path)
    conf = sec.client_settings("127.0.0.1:1", "agent")
    assert conf == {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SASL_SSL",
                    "ssl.ca.location": str(tmp_path / "ca.crt"),
                    "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "agent",
                    "sasl.password": passwords["agent"]}
    recipe = sec.client_recipe("127.0.0.1:1", "agent")
    assert recipe["sasl.password"] == f"<the contents of {tmp_path / 'users/agent.password'}>"
    java = sec.java_client_properties("count")
    assert "${dir:" in java["sasl.jaas.config"] and 'username="count"' in java["sasl.jaas.config"]
    assert not any(pw in str(recipe) + str(java) for pw in passwords.values())


def test_an_mtls_client_names_its_certificate_and_key(tmp_path):
    sec = Security(MTLS, tmp_path)
    conf = sec.client_settings("127.0.0.1:1", "reconcile")
    assert conf == {"bootstrap.servers": "127.0.0.1:1", "security.protocol": "SSL",
                    "ssl.ca.location": str(tmp_path / "ca.crt"),
                    "ssl.certificate.location": str(tmp_path / "users/reconcile.crt"),
                    "ssl.key.location": str(tmp_path / "users/reconcile.key")}
    assert sec.java_client_properties("reconcile")["ssl.keystore.location"] == \
        str(tmp_path / "users/reconcile.pem")
    assert Security(PLAINTEXT, tmp_path).client_settings("h:1") == {"bootstrap.servers": "h:1"}


@pytest.mark.parametrize("mode", [SASL_SSL, MTLS])
def test_the_settings_printed_for_docket_pass_its_own_security_check(tmp_path, capsys, mode):
    from docket_common.kafka_security import check_settings, settings
    from docket_common.settings import load_toml, parse_sections

    cluster, _ = _secured_cluster(tmp_path, mode)
    sec = cluster.security()
    _fake_passwords(sec.folder)
    sec.ca_file.write_text("not checked here")
    for user in USERS:                   # mtls: what Security.create makes, minus openssl
        for f in (sec.cert_file(user), sec.key_file(user)):
            f.write_text("pem")
            f.chmod(0o600)
    assert broker_main(["--data-dir", str(tmp_path), "settings", "--user", "agent",
                        "--toml"]) == 0
    printed = capsys.readouterr().out
    (tmp_path / "kafka.toml").write_text("[kafka]\n" + printed)
    values = parse_sections(load_toml(tmp_path / "kafka.toml"), settings("kafka"))
    checked = check_settings(values, "kafka", "kafka.librdkafka_options")
    assert checked.librdkafka_properties()["security.protocol"] == sec.listener
    assert "pw-agent" not in printed


def test_an_unknown_user_is_refused(tmp_path):
    with pytest.raises(BrokerError, match="no user 'root'"):
        Security(MTLS, tmp_path).client_settings("h:1", "root")


# -- ACLs --------------------------------------------------------------------------------------
def _names(acls):
    return {(a.resource, a.name, a.pattern, a.operation) for a in acls}


def test_the_agent_may_write_its_topics_and_the_audit_topic_and_nothing_else():
    acls = role_acls("agent", "User:agent", Scope(topics=("app.events",),
                                                  topic_prefixes=("web.",)))
    assert _names(acls) == {("topic", "app.events", "literal", "Write"),
                            ("topic", "web.", "prefixed", "Write"),
                            ("topic", "docket.audit", "literal", "Write")}
    assert {a.principal for a in acls} == {"User:agent"}


def test_older_brokers_also_get_idempotent_write_on_the_cluster():
    scope = Scope(topics=("app.events",), legacy_brokers=True)
    for role in ("agent", "count", "land"):
        assert ("cluster", "kafka-cluster", "literal", "IdempotentWrite") in \
            _names(role_acls(role, f"User:{role}", scope))
    assert not any(a.resource == "cluster" for a in role_acls("reconcile", "User:r", scope))


@pytest.mark.parametrize("role", ["count", "land"])
def test_the_spark_jobs_read_their_topics_and_read_and_write_the_audit_topic(role):
    acls = role_acls(role, f"User:{role}", Scope(topic_prefixes=("app.",)))
    assert _names(acls) == {("topic", "app.", "prefixed", "Read"),
                            ("topic", "docket.audit", "literal", "Read"),
                            ("topic", "docket.audit", "literal", "Write"),
                            ("group", "docket-caught-up-", "prefixed", "Describe")}
    spark = role_acls(role, f"User:{role}", Scope(topic_prefixes=("app.",),
                                                  group_prefixes=("spark-kafka-source",)))
    assert ("group", "spark-kafka-source", "prefixed", "Read") in _names(spark)


def test_the_reconciler_reads_the_audit_topic_in_its_group():
    assert _names(role_acls("reconcile", "User:reconcile", Scope())) == {
        ("topic", "docket.audit", "literal", "Read"),
        ("group", "docket-reconcile", "literal", "Read")}
    other = role_acls("reconcile", "User:r", Scope(audit_topic="a.audit", groups=("recon-2",)))
    assert _names(other) == {("topic", "a.audit", "literal", "Read"),
                             ("group", "recon-2", "literal", "Read")}


def test_the_mirror_gets_what_mirrormaker_2_touches_on_each_end_of_its_flow():
    scope = Scope(topic_prefixes=("app.",), mirror_source="local", mirror_target="aggregate")
    source = _names(role_acls("mirror", "User:mirror", Scope(**{**scope.__dict__,
                                                                "side": "source"})))
    target = _names(role_acls("mirror", "User:mirror", Scope(**{**scope.__dict__,
                                                                "side": "target"})))
    assert ("topic", "app.", "prefixed", "Read") in source
    assert ("topic", "app.", "prefixed", "Write") not in source
    assert ("topic", "mm2-offset-syncs.aggregate.internal", "literal", "Write") in source
    assert ("group", "aggregate-mm2", "literal", "Read") in source
    assert {("topic", f"mm2-{k}.aggregate.internal", "literal", "Create")
            for k in ("configs", "offsets", "status")} <= source
    assert ("topic", "app.", "prefixed", "Create") in target
    assert ("topic", "app.", "prefixed", "Read") not in target
    assert ("topic", "local.heartbeats", "literal", "AlterConfigs") in target
    assert ("group", "local-mm2", "literal", "Read") in target
    assert ("topic", "mm2-offsets.local.internal", "literal", "Read") in target
    assert ("group", "docket-mirror-watch-", "prefixed", "Describe") in source & target


@pytest.mark.parametrize("role,scope,message", [
    ("agent", Scope(), "needs its topics"),
    ("mirror", Scope(topics=("a",)), "needs its flow"),
    ("mirror", Scope(topics=("a",), mirror_source="a", mirror_target="b"), "which end|end of"),
    ("admin", Scope(), "no role 'admin'"),
])
def test_a_role_without_what_its_acls_need_is_refused(role, scope, message):
    with pytest.raises(BrokerError, match=message):
        role_acls(role, f"User:{role}", scope)


def test_a_principal_must_be_type_and_name():
    with pytest.raises(BrokerError, match="TYPE:NAME"):
        role_acls("reconcile", "reconcile", Scope())


def test_every_acl_survives_the_admin_clients_binding():
    scopes = [Scope(topics=("t",), topic_prefixes=("p.",), group_prefixes=("g",),
                    legacy_brokers=True, mirror_source="a", mirror_target="b", side=side)
              for side in ("source", "target")]
    for role in security.ROLES:
        for scope in scopes:
            for acl in role_acls(role, f"User:{role}", scope):
                assert security._from_binding(security._binding(acl)) == acl


def test_kafka_acls_lines_group_operations_per_resource():
    acls = role_acls("count", "User:count", Scope(topic_prefixes=("app.",), legacy_brokers=True))
    lines = kafka_acls_lines(acls, "h:9093", "admin.properties")
    assert ("kafka-acls.sh --bootstrap-server h:9093 --command-config admin.properties --add "
            "--allow-principal User:count --operation Read --operation Write --topic "
            "docket.audit") in lines
    assert ("kafka-acls.sh --bootstrap-server h:9093 --command-config admin.properties --add "
            "--allow-principal User:count --operation Read --topic app. "
            "--resource-pattern-type prefixed") in lines
    assert any(line.endswith("--operation IdempotentWrite --cluster") for line in lines)
    assert len(lines) == 4
    removing = kafka_acls_lines([Acl("topic", "t", "literal", "Write", "User:a")],
                                action="--remove")
    assert removing == ["kafka-acls.sh --bootstrap-server BOOTSTRAP --command-config "
                        "admin.properties --remove --allow-principal User:a --operation Write "
                        "--topic t --force"]


def test_docs_security_holds_the_acl_table_of_the_code():
    assert grants_table() in (DOCS / "security.md").read_text(), \
        "docs/security.md's ACL table differs from broker.security's grants: paste " \
        "grants_table()"


def test_acl_grant_print_needs_no_cluster(tmp_path, capsys):
    code = broker_main(["--data-dir", str(tmp_path / "none"), "acl", "grant", "--role", "agent",
                        "--topic", "app.events", "--print"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out == [
        "kafka-acls.sh --bootstrap-server BOOTSTRAP --command-config admin.properties --add "
        "--allow-principal User:agent --operation Write --topic app.events",
        "kafka-acls.sh --bootstrap-server BOOTSTRAP --command-config admin.properties --add "
        "--allow-principal User:agent --operation Write --topic docket.audit"]


def test_acl_grant_for_the_mirror_takes_the_side_from_the_clusters_name(tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.setenv("DOCKET_CLUSTERS_DIR", str(tmp_path))
    code = broker_main(["--name", "aggregate", "acl", "grant", "--role", "mirror",
                        "--topic-prefix", "app.", "--flow", "local->aggregate", "--print"])
    out = capsys.readouterr().out
    assert code == 0
    assert "--topic local.heartbeats" in out and "--group local-mm2" in out


def test_acls_on_a_plaintext_cluster_are_refused_with_a_hint(tmp_path, capsys, monkeypatch):
    cluster, _ = _secured_cluster(tmp_path, PLAINTEXT)
    monkeypatch.setattr(LocalCluster, "running_nodes", lambda self: [1])
    code = broker_main(["--data-dir", str(tmp_path), "acl", "list"])
    err = capsys.readouterr().err
    assert code == 1
    assert "plaintext: it has no authorizer" in err and "--security sasl_ssl" in err


def test_admin_is_a_super_user_and_a_client():
    assert ADMIN in USERS and ADMIN in security.SUPER_USERS
    assert BROKER in security.SUPER_USERS and BROKER not in USERS
