"""Secured local clusters (``docket-broker up --security sasl_ssl|mtls``) and each role's
least-privilege ACLs, with real Kafka clients: confluent-kafka as docket's agent, Spark jobs
and reconciler use it, MirrorMaker 2 from Kafka's jars, and PySpark's Kafka source.

Each role's *workload* sends the Kafka requests that docket's component sends (produce,
read to the end in a group of the component's name, commit), as the role's user. The
least-privilege test grants the role its ACLs (the workload then succeeds), and takes away
each ACL in turn: the workload must then fail with the authorisation error of that resource.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from broker.cluster import LocalCluster
from broker.mirror import Mirror, MirrorSpec
from broker.security import BROKER, USERS, Scope, grant, list_acls, revoke, role_acls
from tests.conftest import SecuredKafka
from tests.kafkautil import records_held

BIN = Path(sys.executable).parent
SEED = 10                       # records the admin writes into each topic first
# librdkafka's word that a broker is unreachable for now (it retries): not an outcome
PASSING = frozenset({"_TRANSPORT", "_ALL_BROKERS_DOWN"})


# -- helpers ------------------------------------------------------------------------------------
def _admin(kafka) -> AdminClient:
    return AdminClient(kafka.settings("admin"))


def _create_topics(kafka, names, partitions: int = 3, config: dict | None = None) -> None:
    """As the admin user (a super user): docket's own admin work."""
    admin = _admin(kafka)              # kept until the futures are done: they die with it
    futures = admin.create_topics(
        [NewTopic(n, num_partitions=partitions, replication_factor=-1, config=config or {})
         for n in names], operation_timeout=30, request_timeout=30)
    for fut in futures.values():
        fut.result()


def produce(kafka, user: str, topics, values=(b"x",), timeout_s: float = 30) -> set[str]:
    """Produce ``values`` to each topic as ``user`` with the agent's producer settings
    (idempotent, all replicas); the error names of what failed."""
    errors: set[str] = set()
    producer = Producer({**kafka.settings(user), "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5, "error_cb": lambda e: errors.add(e.name())})

    def delivered(err, msg):
        if err is not None:
            errors.add(err.name())

    try:
        for topic in topics:
            for value in values:
                producer.produce(topic, value, on_delivery=delivered)
        if producer.flush(timeout_s):
            errors.add("NOT_DELIVERED_IN_TIME")
    except KafkaException as exc:      # a fatal error (the idempotent producer's id refused)
        errors.add(exc.args[0].name())
    return errors - PASSING


def read_to_end(kafka, user: str, topics, group: str, *, commit: bool = False,
                ignore: frozenset = frozenset(), timeout_s: float = 30) -> tuple[set[str], list]:
    """Read ``topics`` from their start to their current end as ``user`` in ``group`` (assigned
    partitions, as docket's readers do), committing the ends when ``commit``; the error names
    (less ``ignore``) and the values read."""
    errors: set[str] = set()
    consumer = Consumer({**kafka.settings(user), "group.id": group, "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed",
                         "error_cb": lambda e: errors.add(e.name())})
    values = []
    try:
        ends = {}
        for topic in topics:
            md = consumer.list_topics(topic, timeout=10).topics[topic]
            if md.error is not None:
                errors.add(md.error.name())
                continue
            for p in md.partitions:
                try:
                    ends[(topic, p)] = consumer.get_watermark_offsets(
                        TopicPartition(topic, p), timeout=10)[1]
                except KafkaException as exc:
                    errors.add(exc.args[0].name())
        consumer.assign([TopicPartition(t, p, 0) for t, p in ends])
        pending = set(ends)
        deadline = time.monotonic() + timeout_s
        settle_until = None
        while time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.3):
                err = msg.error()
                if err is None:
                    values.append(msg.value())
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                else:
                    errors.add(err.name())
            if errors - ignore:
                break
            if not pending:            # a moment more: a group lookup may fail after the data
                if "GROUP_AUTHORIZATION_FAILED" in ignore:     # (unless that is ignored)
                    break
                settle_until = settle_until or time.monotonic() + 1.0
                if time.monotonic() > settle_until:
                    break
        else:
            errors.add("NOT_READ_IN_TIME")
        if commit and ends and not errors - ignore:
            try:
                consumer.commit(offsets=[TopicPartition(t, p, end) for (t, p), end in
                                         ends.items()], asynchronous=False)
            except KafkaException as exc:
                errors.add(exc.args[0].name())
    finally:
        consumer.close()
    return errors - ignore - PASSING, values


@dataclass
class Env:
    """One test's topics on a secured cluster: two data topics under one prefix and its own
    audit topic, each seeded by the admin."""
    kafka: object
    prefix: str
    topics: tuple[str, str]
    audit: str

    @classmethod
    def make(cls, kafka) -> Env:
        tag = uuid.uuid4().hex[:8]
        prefix = f"app.{tag}."
        env = cls(kafka, prefix, (f"{prefix}events", f"{prefix}clicks"), f"audit.{tag}")
        _create_topics(kafka, [*env.topics, env.audit])
        assert produce(kafka, "admin", [*env.topics, env.audit],
                       [b"seed-%d" % i for i in range(SEED)]) == set()
        return env

    def scope(self, role: str) -> Scope:
        if role == "agent":            # its topics by name; the jobs' by prefix
            return Scope(topics=(self.topics[0],), audit_topic=self.audit)
        return Scope(topic_prefixes=(self.prefix,), audit_topic=self.audit)


# What each component does on Kafka, as its role's user. librdkafka looks up the coordinator
# of any consumer's group; Spark's Java consumers (assigned partitions, nothing committed) never
# do, which is why the Spark-like reader ignores a group error (test_spark_reads_... below
# runs Spark's own Kafka source).
def agent_work(env: Env, user: str) -> set[str]:
    return produce(env.kafka, user, [env.topics[0], env.audit], [b"event"])


def spark_job_work(env: Env, user: str) -> set[str]:
    data, _ = read_to_end(env.kafka, user, env.topics,
                          f"spark-kafka-source-{uuid.uuid4()}-executor",
                          ignore=frozenset({"GROUP_AUTHORIZATION_FAILED"}))
    caught_up, _ = read_to_end(env.kafka, user, [env.audit], f"docket-caught-up-{uuid.uuid4()}")
    return data | caught_up | produce(env.kafka, user, [env.audit], [b"counts"])


def reconcile_work(env: Env, user: str) -> set[str]:
    return read_to_end(env.kafka, user, [env.audit], "docket-reconcile", commit=True)[0]


WORK = {"agent": agent_work, "count": spark_job_work, "land": spark_job_work,
        "reconcile": reconcile_work}
DENIED = {"topic": "TOPIC_AUTHORIZATION_FAILED", "group": "GROUP_AUTHORIZATION_FAILED",
          "cluster": "CLUSTER_AUTHORIZATION_FAILED"}


def denial(acl, acls) -> str:
    """The error a client reports without ``acl``: its resource's authorisation error, but an
    idempotent producer left without Write on any topic is refused its producer id first
    (InitProducerId needs Write on some topic or IdempotentWrite on the cluster: KIP-679)."""
    if acl.operation == "Write" and not any(a.operation == "Write" and a != acl for a in acls):
        return "CLUSTER_AUTHORIZATION_FAILED"
    return DENIED[acl.resource]


@pytest.fixture(params=["sasl_ssl", "mtls"])
def secured(request, kafka_sasl, kafka_mtls):
    return {"sasl_ssl": kafka_sasl, "mtls": kafka_mtls}[request.param]


# -- the clusters come up and authenticate ------------------------------------------------------
def test_a_secured_cluster_comes_up_and_its_admin_creates_topics(secured):
    env = Env.make(secured)
    listed = _admin(secured).list_topics(timeout=10).topics
    assert set(env.topics) | {env.audit} <= set(listed)
    layout = secured.cluster.layout()
    assert layout.security == secured.security
    assert [r["state"] for r in secured.cluster.status()] == ["running"]


def test_the_agent_writes_and_the_count_job_reads_with_their_acls_only(secured):
    env = Env.make(secured)
    admin = _admin(secured)
    agent = role_acls("agent", "User:agent", env.scope("agent"))
    count = role_acls("count", "User:count", env.scope("count"))
    grant(admin, agent + count)
    try:
        mark = f"hello-{uuid.uuid4()}".encode()
        assert produce(secured, "agent", [env.topics[0]], [mark]) == set()
        errors, values = read_to_end(secured, "count", [env.topics[0]],
                                     f"spark-kafka-source-{uuid.uuid4()}-executor",
                                     ignore=frozenset({"GROUP_AUTHORIZATION_FAILED"}))
        assert errors == set() and mark in values and len(values) == SEED + 1
        # and not the other way round: the count job may not write data, the agent not read
        assert produce(secured, "count", [env.topics[0]]) == {"TOPIC_AUTHORIZATION_FAILED"}
        errors, _ = read_to_end(secured, "agent", [env.topics[0]], f"docket-caught-up-{mark}")
        assert "TOPIC_AUTHORIZATION_FAILED" in errors
    finally:
        revoke(admin, agent + count)


# The count and land roles run a Spark job per ACL (17 s each); their ACLs do not depend on how
# the principal authenticated, so CI runs them over SASL and `make soak` over mTLS too.
@pytest.mark.parametrize("secured,role", [
    pytest.param(security, role, marks=[pytest.mark.soak] if (security, role) in {
        ("mtls", "count"), ("mtls", "land")} else [], id=f"{security}-{role}")
    for security in ("sasl_ssl", "mtls") for role in ("agent", "count", "land", "reconcile")],
    indirect=["secured"])
def test_each_role_works_with_its_acls_and_fails_without_any_one_of_them(secured, role):
    env = Env.make(secured)
    admin = _admin(secured)
    acls = role_acls(role, f"User:{role}", env.scope(role))
    # The cluster is the session's, and other tests leave this user ACLs of their own (the
    # secured audit's count and land keep Write on its audit topic; when it revoked its grants
    # at its end, the mirror's check below once saw its mirror's user refused on its topics).
    # Any Write elsewhere gives an idempotent producer its id (KIP-679) and changes what each
    # refusal looks like: the check starts from none.
    revoke(admin, list_acls(admin, f"User:{role}"))
    assert list_acls(admin, f"User:{role}") == []
    work = WORK[role]
    nothing = work(env, role)
    assert nothing & set(DENIED.values()), f"{role} worked with no ACL at all: {nothing}"
    grant(admin, acls)
    try:
        assert work(env, role) == set()
        for acl in acls:
            revoke(admin, [acl])
            try:
                errors = work(env, role)
            finally:
                grant(admin, [acl])
            assert denial(acl, acls) in errors, \
                f"without {acl.describe()} the {role} still worked: {errors or 'no error'}"
        assert work(env, role) == set()
    finally:
        revoke(admin, acls)


def test_acls_are_listed_by_principal_and_revoked_exactly(kafka_sasl):
    env = Env.make(kafka_sasl)
    admin = _admin(kafka_sasl)
    principal = f"User:someone-{uuid.uuid4().hex[:6]}"
    acls = role_acls("reconcile", principal, env.scope("reconcile"))
    grant(admin, acls)
    grant(admin, acls)                                 # twice is fine
    assert list_acls(admin, principal) == sorted(acls)
    assert revoke(admin, acls[:1]) == 1
    assert list_acls(admin, principal) == sorted(acls[1:])
    assert revoke(admin, acls) == len(acls) - 1
    assert list_acls(admin, principal) == []


def test_a_wrong_password_is_an_authentication_error_in_bounded_time(kafka_sasl):
    errors = []
    producer = Producer({**kafka_sasl.settings("agent"), "sasl.password": "not-the-password",
                         "error_cb": lambda e: errors.append(e)})
    producer.produce("whatever", b"x")
    start = time.monotonic()
    while not errors and time.monotonic() - start < 30:
        producer.poll(0.2)
    elapsed = time.monotonic() - start
    assert errors, "no error within 30 s"
    err = errors[0]
    assert err.code() == KafkaError._AUTHENTICATION, err
    assert "invalid credentials" in err.str() and "SCRAM-SHA-512" in err.str()
    assert not err.retriable()
    print(f"authentication error after {elapsed:.1f}s: {err.str()}")
    log = kafka_sasl.cluster.node_dir(1) / "logs" / "server.log"
    assert "Failed authentication with /127.0.0.1" in log.read_text()


@pytest.mark.parametrize("certificate", ["none", "another CA's"])
def test_an_mtls_client_without_the_clusters_certificate_is_refused(kafka_mtls, tmp_path,
                                                                    certificate):
    conf = {k: v for k, v in kafka_mtls.settings("admin").items()
            if not k.startswith(("ssl.certificate", "ssl.key"))}
    if certificate != "none":       # a self-signed certificate claiming to be the admin
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(tmp_path / "k"),
                        "-out", str(tmp_path / "c"), "-subj", "/CN=admin", "-days", "1"],
                       check=True, capture_output=True)
        conf.update({"ssl.certificate.location": str(tmp_path / "c"),
                     "ssl.key.location": str(tmp_path / "k")})
    errors = []
    producer = Producer({**conf, "error_cb": lambda e: errors.append(e)})
    producer.produce("whatever", b"x")
    start = time.monotonic()
    while not errors and time.monotonic() - start < 30:
        producer.poll(0.2)
    assert errors, "no error within 30 s"
    assert errors[0].code() == KafkaError._TRANSPORT, errors[0]
    assert "bad certificate" in errors[0].str()
    with pytest.raises(KafkaException):
        AdminClient(conf).list_topics(timeout=5)


def test_no_secret_is_on_a_command_line_or_in_a_readable_file(kafka_sasl, kafka_mtls):
    sec = kafka_sasl.cluster.security()
    passwords = {u: sec.password(u).encode() for u in (*USERS, BROKER)}
    assert all(len(p) >= 32 for p in passwords.values())
    for node in kafka_sasl.cluster.running_nodes():
        cmdline = Path(f"/proc/{kafka_sasl.cluster.pid(node)}/cmdline").read_bytes()
        assert not any(p in cmdline for p in passwords.values())
    # the passwords are in their files and nowhere else under the data dir (logs, configs)
    def holds_one(f: Path) -> bool:
        try:
            return any(p in f.read_bytes() for p in passwords.values())
        except FileNotFoundError:                  # a log segment deleted meanwhile
            return False

    holders = {f for f in kafka_sasl.cluster.data_dir.rglob("*") if f.is_file() and holds_one(f)}
    assert holders == {sec.password_file(u) for u in passwords}
    assert not list(kafka_sasl.cluster.data_dir.rglob("format.args"))
    for cluster in (kafka_sasl.cluster, kafka_mtls.cluster):
        folder = cluster.security_dir
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        for f in folder.rglob("*"):
            if f.is_file() and f.suffix in (".password", ".key", ".pem"):
                assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        assert stat.S_IMODE((folder / "ca.key").stat().st_mode) == 0o600


# -- as a user types it -------------------------------------------------------------------------
def _broker_cli(clusters: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCKET_CLUSTERS_DIR": str(clusters)}
    exe = shutil.which("docket-broker", path=str(BIN)) or "docket-broker"
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_up_secured_by_name_prints_the_settings_and_a_restart_keeps_the_credentials(tmp_path):
    clusters = tmp_path / "clusters"

    def run(*args):
        return _broker_cli(clusters, "--name", "sec", *args)

    try:
        up = run("up", "--security", "sasl_ssl", "--base-port", "0", "--timeout-s", "300")
        assert up.returncode == 0, up.stderr
        cluster = LocalCluster(clusters / "sec")
        sec = cluster.security()
        users = sec.users_dir
        assert "security: sasl_ssl" in up.stdout
        assert f"sasl.password=<the contents of {users}/agent.password>" in up.stdout
        assert f"ssl.ca.location={sec.ca_file}" in up.stdout
        assert up.stdout.strip().splitlines()[-1].startswith("bootstrap_servers=127.0.0.1:")
        printed = up.stdout + up.stderr
        status = run("status", "--json")
        settings = run("settings", "--user", "count", "--java")
        granted = run("acl", "grant", "--role", "agent", "--topic", "app.events")
        assert granted.returncode == 0, granted.stderr
        printed += status.stdout + settings.stdout + granted.stdout
        assert '"security": "sasl_ssl"' in status.stdout and status.returncode == 0
        assert "granted: User:agent Write on topic app.events" in granted.stdout
        assert not any(sec.password(u) in printed for u in USERS)

        assert run("down").returncode == 0
        again = run("up", "--timeout-s", "300")        # no --security: the cluster's own
        assert again.returncode == 0, again.stderr
        assert "security: sasl_ssl" in again.stdout
        listed = run("acl", "list", "--principal", "User:agent")
        assert "User:agent Write on topic app.events" in listed.stdout
        md = AdminClient(cluster.client_settings("agent")).list_topics(timeout=30)
        assert len(md.brokers) == 1                    # the same password still authenticates
        created = run("topic", "ensure", "app.events", "--partitions", "1")   # as admin
        assert created.returncode == 0 and "created: app.events" in created.stdout, \
            created.stderr
        listing = run("topic", "list")                 # as admin too
        assert listing.returncode == 0, listing.stderr
        assert "app.events\tpartitions=1\treplication_factor=1" in listing.stdout
    finally:
        down = run("down")
    assert down.returncode == 0
    other = run("up", "--security", "mtls")
    assert other.returncode == 1 and "secured as sasl_ssl; asked for mtls" in other.stderr


@pytest.mark.soak           # three secured brokers of its own, one restarted: `make soak`
@pytest.mark.cluster3
def test_three_secured_brokers_replicate_and_a_restarted_broker_rejoins(tmp_path):
    cluster = LocalCluster(tmp_path / "c", die_with_parent=True)
    layout = cluster.up(brokers=3, base_port=0, security="sasl_ssl", timeout_s=300)
    try:
        kafka = SecuredKafka(layout.bootstrap_servers, cluster, "sasl_ssl")
        env = Env.make(kafka)
        md = _admin(kafka).list_topics(timeout=10).topics[env.topics[0]]
        assert all(len(p.replicas) == 3 for p in md.partitions.values())
        admin = _admin(kafka)
        grant(admin, role_acls("agent", "User:agent", env.scope("agent"))
              + role_acls("count", "User:count", env.scope("count")))
        cluster.kill_node(2)
        assert agent_work(env, "agent") == set()       # acks=all, min.insync.replicas=2
        cluster.start_node(2, timeout_s=300)
        assert cluster.security().mode == layout.security == "sasl_ssl"
        assert spark_job_work(env, "count") == set()
        deadline = time.monotonic() + 120               # node 2 catches up over SASL_SSL
        while True:
            md = _admin(kafka).list_topics(timeout=10).topics[env.topics[0]]
            if all(len(p.isrs) == 3 for p in md.partitions.values()):
                break
            assert time.monotonic() < deadline, "node 2 did not rejoin the ISRs"
            time.sleep(1)
    finally:
        cluster.down()


# -- the mirror and Spark, with Kafka's and Spark's own clients ------------------------------------
def _log_size(cluster: LocalCluster) -> int:
    return (cluster.node_dir(1) / "logs" / "server.log").stat().st_size


def _denied(cluster: LocalCluster, principal: str, since: int) -> list[str]:
    """The authorizer's denials of ``principal`` in the broker's log after offset ``since``."""
    with open(cluster.node_dir(1) / "logs" / "server.log", "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if f"Principal = {principal} is Denied" in line]


def _count(kafka, topic: str) -> int:
    consumer = Consumer({**kafka.settings("admin"), "group.id": "docket-tests-count"})
    try:
        return records_held(consumer, topic)     # a topic the mirror just made: its leaders
    finally:
        consumer.close()


def _values(kafka, topic: str, timeout_s: float = 60) -> list[bytes]:
    """Every record's value in ``topic``, read as the admin from the start to its end."""
    consumer = Consumer({**kafka.settings("admin"), "group.id": "docket-tests-values",
                         "enable.auto.commit": False})
    try:
        md = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            return []
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in md.partitions}
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        out, deadline = [], time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(
                tp.offset < ends[tp.partition] for tp in consumer.position(
                    [TopicPartition(topic, p) for p in ends])):
            out += [m.value() or b"" for m in consumer.consume(500, timeout=1)
                    if m.error() is None]
        return out
    finally:
        consumer.close()


def _wait_for(what: str, check, timeout_s: float = 180):
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:.0f}s"
        time.sleep(1)
    return value


@pytest.mark.slow
def test_the_mirror_copies_between_secured_clusters_with_its_acls_and_stops_without_read(
        kafka_mtls, kafka_sasl, tmp_path):
    """`docket-broker mirror`'s MirrorMaker 2 and watcher, as the mirror's user on both ends:
    a client certificate on the source (mutual TLS), a password on the target (SASL_SSL)."""
    source, target = kafka_mtls, kafka_sasl
    tag = uuid.uuid4().hex[:8]
    data, audit = f"mm.{tag}.events", f"audit-{tag}"
    _create_topics(source, [data, audit])
    spec_args = dict(topic_prefixes=(f"mm.{tag}.",), audit_topic=audit, mirror_source="local",
                     mirror_target="aggregate")
    source_acls = role_acls("mirror", "User:mirror", Scope(side="source", **spec_args))
    target_acls = role_acls("mirror", "User:mirror", Scope(side="target", **spec_args))
    grant(_admin(source), source_acls)
    grant(_admin(target), target_acls)
    assert produce(source, "admin", [data, audit], [b"r-%d" % i for i in range(20)]) == set()

    spec = MirrorSpec("local", "aggregate", source.bootstrap_servers, target.bootstrap_servers,
                      rf"mm\.{tag}\..*", audit_topic=audit,
                      source_security=source.cluster.security().docket_settings("mirror"),
                      target_security=target.cluster.security().docket_settings("mirror"))
    marks = {"source": _log_size(source.cluster), "target": _log_size(target.cluster)}
    mirror = Mirror(tmp_path / "mirror", die_with_parent=True)
    # the audit topic on the target is the admin's to create, as `mirror up` does
    mirror.up(spec, admin=target.settings("admin"))
    try:
        assert mirror.status()["watch_state"] == "running"
        _wait_for("the 20 records on the target", lambda: _count(target, data) == 20, 300)
        _wait_for("the audit records on the target", lambda: _count(target, audit) == 20)
        _wait_for("heartbeats copied", lambda: _count(target, "local.heartbeats") > 0)
        assert _denied(source.cluster, "User:mirror", marks["source"]) == []
        assert _denied(target.cluster, "User:mirror", marks["target"]) == []
        assert mirror.watch_pid() is not None, mirror.log_tail()
        watch_log = (mirror.watch_folder / "stdout.log").read_text()
        assert "ERROR" not in watch_log and "AUTHORIZATION" not in watch_log, watch_log
        # MirrorMaker 2 keeps its connectors' settings in its config topics, on both clusters:
        # there, each secret is a reference to the mirror's copy, never the secret itself.
        key = max(source.cluster.security().key_file("mirror").read_text().splitlines(),
                  key=len)
        password = target.cluster.security().password("mirror").strip()
        stored = _values(target, "mm2-configs.local.internal") + \
            _values(source, "mm2-configs.aggregate.internal")
        assert any(b"${dir:" in v for v in stored), stored[:2]
        assert not any(key.encode() in v or password.encode() in v for v in stored)

        # Without Read on the source's topics, the copying stops, and the source says why.
        read = [a for a in source_acls if a.name == f"mm.{tag}." and a.operation == "Read"]
        revoke(_admin(source), read)
        assert produce(source, "admin", [data], [b"later-%d" % i for i in range(5)]) == set()
        denial = _wait_for("a denied Read of the data topic", lambda: [
            line for line in _denied(source.cluster, "User:mirror", marks["source"])
            if "operation = READ" in line and f"Topic:LITERAL:{data}" in line])
        assert "for request = Fetch" in denial[0]
        assert _count(target, data) == 20
        grant(_admin(source), read)
        _wait_for("the copying resumed", lambda: _count(target, data) == 25)
    finally:
        mirror.down()
        revoke(_admin(source), source_acls)
        revoke(_admin(target), target_acls)


@pytest.mark.slow
def test_spark_reads_with_the_count_acls_and_a_pattern_silently_loses_a_topic_without_them(
        kafka_sasl, tmp_path):
    pyspark = pytest.importorskip("pyspark.sql")
    from audit.jobs.sparklibs import ensure_spark_kafka_libs

    env = Env.make(kafka_sasl)
    admin = _admin(kafka_sasl)
    acls = role_acls("count", "User:count", env.scope("count"))
    grant(admin, acls)
    spark = (pyspark.SparkSession.builder.appName("docket-acl-test").master("local[1]")
             .config("spark.jars", ",".join(str(j) for j in ensure_spark_kafka_libs()))
             .config("spark.ui.enabled", "false")
             .config("spark.local.dir", str(tmp_path))
             .config("spark.sql.shuffle.partitions", "1").getOrCreate())
    java = kafka_sasl.cluster.security().java_client_properties("count")

    def read(**subscription) -> int:
        reader = (spark.read.format("kafka")
                  .option("kafka.bootstrap.servers", kafka_sasl.bootstrap_servers))
        for key, value in {**subscription, **{f"kafka.{k}": v for k, v in java.items()}}.items():
            reader = reader.option(key, value)
        return reader.load().count()

    pattern = {"subscribePattern": re.escape(env.prefix) + ".*"}
    mark = _log_size(kafka_sasl.cluster)
    try:
        assert read(**pattern) == 2 * SEED                # both topics, no group ACL needed
        assert _denied(kafka_sasl.cluster, "User:count", mark) == []
        topic_read = [a for a in acls if a.name == env.prefix]
        revoke(admin, topic_read)
        assert read(**pattern) == 0       # a pattern sees no topic it may not read: no error
        with pytest.raises(Exception, match="TopicAuthorization|Not authorized to access topics"):
            read(subscribe=",".join(env.topics))
        grant(admin, topic_read)
        assert read(subscribe=",".join(env.topics)) == 2 * SEED
    finally:
        spark.stop()
        revoke(admin, acls)

