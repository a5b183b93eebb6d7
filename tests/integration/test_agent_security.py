"""The agent against a secured cluster (SASL_SSL with SCRAM-SHA-512, the agent's least-privilege
ACLs; and OAUTHBEARER, tokens from an OpenID Connect endpoint): a wrong password, a refused
client secret and a missing Write ACL are outages with a named cause. The events wait
in the pool, status and one log line say why, the agent does not spin, and delivery resumes
once the password file is fixed and the agent reloaded (SIGHUP), or by itself once the ACL is
granted. Every id is counted; the password is in no log, status or argument list."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.cluster import LocalCluster
from broker.security import Scope, grant, revoke, role_acls
from tests.agentkit import AgentProcess, write_config

pytestmark = pytest.mark.slow

LINES = 20_000
FAILURE_S = 20                          # how long the refusal is kept up and measured
CPU_SHARE = 0.5                         # the outage bound (tests/faults: broker paused)


@pytest.fixture
def secured(kafka_sasl) -> LocalCluster:
    return kafka_sasl.cluster


def _admin_conf(cluster: LocalCluster) -> dict:
    return cluster.client_settings("admin")


def _setup(cluster: LocalCluster, tmp_path: Path, password: str, send_path: str = "python",
           broker: dict | None = None, oauth=None, kerberos: tuple | None = None):
    """A topic and an audit topic, the agent's ACLs, and an agent config whose password file
    holds ``password`` (``broker``: further ``[broker]`` settings; ``oauth``: an identity
    provider, ``tests/oidckit.py``, the agent logging in with OAUTHBEARER as its client
    ``agent``, ``password`` its secret; ``kerberos``: a realm, ``tests/krbkit.py``, and a
    principal of it, the agent logging in with GSSAPI as that principal, its keytab the
    realm's, ``password`` unused).
    Returns (topic, audit topic, config, password file)."""
    conf = _admin_conf(cluster)
    bootstrap = conf["bootstrap.servers"]
    prefix = f"sec{uuid.uuid4().hex[:6]}"
    topic, audit_topic = f"{prefix}.app", f"{prefix}.audit"
    options = {k: v for k, v in conf.items() if k != "bootstrap.servers"}
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=2)], client=options)
    ensure_audit_topic(bootstrap, audit_topic, client=options)
    security = cluster.security()
    user = "User:agent" if kerberos is None else f"User:{kerberos[1]}"
    grant(AdminClient(conf), role_acls("agent", user,
                                       Scope(topics=(topic,), audit_topic=audit_topic)))
    secret = tmp_path / "kafka.password"
    secret.write_text(password + "\n")
    secret.chmod(0o600)
    (tmp_path / "logs").mkdir()
    login = {"sasl_username": "agent", "sasl_password_file": str(secret)} if oauth is None else \
        {"sasl_mechanism": "OAUTHBEARER", "sasl_oauthbearer_token_endpoint_url": oauth.token_url,
         "sasl_oauthbearer_client_id": "agent", "sasl_oauthbearer_client_secret_file": str(secret),
         "sasl_oauthbearer_ca_file": str(oauth.ca_file)}
    if kerberos is not None:
        realm, name = kerberos
        login = {"sasl_mechanism": "GSSAPI", "sasl_kerberos_principal": realm.principal(name),
                 "sasl_kerberos_keytab_file": str(realm.keytab(name))}
    config = write_config(
        tmp_path / "agent.toml", bootstrap, tmp_path / "state",
        [{"type": "file", "paths": [str(tmp_path / "logs" / "app.log")], "topic": topic}],
        agent={"id": "secured-host"}, buffer={"size_bytes": 32 << 20, "slot_size_bytes": 1 << 18},
        broker={"security_protocol": "sasl_ssl", **login, "ssl_ca_file": str(security.ca_file),
                "send_path": send_path, **(broker or {})},
        audit={"topic": audit_topic, "interval_ms": 2000})
    return topic, audit_topic, config, secret


def _write(path: Path, n: int) -> None:
    with open(path, "a") as f:
        f.writelines(json.dumps({"id": i, "pad": "x" * (i % 60)}) + "\n" for i in range(n))


def _ids(conf: dict, topic: str, want: int, timeout_s: float) -> Counter:
    """Every id ``topic`` holds, read as the admin from the start until ``want`` distinct
    ones came (or the time is up)."""
    c = Consumer({**conf, "group.id": f"check-{uuid.uuid4()}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    ids: Counter = Counter()
    deadline = time.monotonic() + timeout_s
    try:
        while len(ids) < want and time.monotonic() < deadline:
            for m in c.consume(1000, timeout=1):
                if not m.error():
                    ids[json.loads(m.value())["id"]] += 1
    finally:
        c.close()
    return ids


def _wait_state(agent: AgentProcess, prefix: str, timeout_s: float = 90) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = agent.status()
        if st and st["broker"]["state"].startswith(prefix):
            return st
        assert agent.alive(), agent.log_text()
        time.sleep(0.5)
    raise AssertionError(f"broker state never {prefix!r}: {agent.status()}\n{agent.log_text()}")


def _no_secret_anywhere(agent: AgentProcess, password: str) -> None:
    assert password not in agent.whole_log()
    assert password not in json.dumps(agent.status())
    assert password not in agent.metrics()
    args = Path(f"/proc/{agent.proc.pid}/cmdline").read_bytes().decode(errors="replace")
    assert password not in args


def _refused_for_a_while(agent: AgentProcess, cluster: LocalCluster, topic: str) -> tuple:
    """The agent refused its login for ``FAILURE_S``: still ``authentication failed``, every
    event waiting in the pool, nothing in ``topic``, said in one log line, CPU within the
    outage bound. Returns (its status when refused, CPU seconds, the line)."""
    st = _wait_state(agent, "authentication failed")
    cpu0 = agent.cpu_seconds(children=True)
    time.sleep(FAILURE_S)
    cpu = agent.cpu_seconds(children=True) - cpu0
    now = agent.status()
    assert now["broker"]["state"] == "authentication failed"
    assert now["backlog"]["events"] == LINES            # every event waits in the pool
    assert _ids(_admin_conf(cluster), topic, 1, 5) == Counter()
    said = [line for line in agent.whole_log().splitlines()
            if "broker: authentication failed" in line]
    assert len(said) == 1, said
    assert cpu < CPU_SHARE * FAILURE_S, f"{cpu:.1f} CPU s in {FAILURE_S} s of refusal"
    return st, cpu, said[0]


def test_a_wrong_password_waits_in_the_pool_and_a_reload_with_the_right_one_delivers_all(
        secured, tmp_path, agent_send_path):
    right = secured.security().password("agent")
    topic, _audit, config, secret = _setup(secured, tmp_path, "not-the-password",
                                           agent_send_path)
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        _write(tmp_path / "logs" / "app.log", LINES)
        st, cpu, said = _refused_for_a_while(agent, secured, topic)
        assert st["broker"]["security"] == "sasl_ssl, SCRAM-SHA-512 user agent"
        assert "sasl_password_file" in said, said

        secret.write_text(right + "\n")                    # fixed, then reloaded
        agent.proc.send_signal(signal.SIGHUP)
        ids = _ids(_admin_conf(secured), topic, LINES, 120)
        assert set(ids) == set(range(LINES))               # 0 lost
        assert max(ids.values()) == 1                      # nothing had reached Kafka
        _wait_state(agent, "up", 60)
        _no_secret_anywhere(agent, right)
        print(f"wrong password: {cpu:.2f} CPU s in {FAILURE_S} s, then all {LINES} ids once")
    finally:
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()


def test_a_missing_write_acl_waits_in_the_pool_and_delivery_resumes_once_it_is_granted(
        secured, tmp_path, agent_send_path):
    topic, audit_topic, config, _secret = _setup(secured, tmp_path,
                                                 secured.security().password("agent"),
                                                 agent_send_path)
    admin = AdminClient(_admin_conf(secured))
    write = [a for a in role_acls("agent", "User:agent", Scope(topics=(topic,),
                                                               audit_topic=audit_topic))
             if a.operation == "Write" and a.name == topic]
    assert len(write) == 1
    assert revoke(admin, write) == 1                       # the fault really happened
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        _write(tmp_path / "logs" / "app.log", LINES)
        st = _wait_state(agent, "not authorised")
        assert st["broker"]["state"] == \
            f"not authorised: TOPIC_AUTHORIZATION_FAILED on topic {topic}"
        cpu0 = agent.cpu_seconds()
        time.sleep(FAILURE_S)
        cpu = agent.cpu_seconds() - cpu0
        assert agent.status()["backlog"]["events"] == LINES
        said = [line for line in agent.whole_log().splitlines()
                if f"not authorised to write topic {topic}" in line]
        assert len(said) == 1, said
        assert not (tmp_path / "state" / "dead-letter").exists()   # refused is not dead
        assert cpu < CPU_SHARE * FAILURE_S, f"{cpu:.1f} CPU s in {FAILURE_S} s of refusal"

        grant(admin, write)                                # no reload: it goes by itself
        ids = _ids(_admin_conf(secured), topic, LINES, 120)
        assert set(ids) == set(range(LINES)) and max(ids.values()) == 1
        _wait_state(agent, "up", 60)
        assert agent.metric("agent_dropped_events_total") == 0
        print(f"missing Write ACL: {cpu:.2f} CPU s in {FAILURE_S} s, then all {LINES} ids once")
    finally:
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()


def test_exactly_once_without_its_acls_waits_and_delivers_each_id_once_once_granted(
        secured, tmp_path):
    """``broker.delivery = "exactly_once"`` with the agent's plain ACLs, and no Write on a
    second topic: the cluster refuses its transactions, the events wait in the pool and status
    names the ACLs. Once ``acl grant --role agent --exactly-once``'s ACLs are granted, the first
    topic's events go (a read_committed reader sees each id once) while the second topic's wait
    aside, refused; once Write on it is granted, they go too, each once. Not reloaded."""
    progress = f"progress.{uuid.uuid4().hex[:6]}"
    admin_conf = _admin_conf(secured)
    admin = AdminClient(admin_conf)
    client = {k: v for k, v in admin_conf.items() if k != "bootstrap.servers"}
    ensure_topics(admin_conf["bootstrap.servers"], [TopicSpec(progress, partitions=1)],
                  client=client)
    topic, audit_topic, config, _secret = _setup(
        secured, tmp_path, secured.security().password("agent"),
        broker={"delivery": "exactly_once", "progress_topic": progress})
    second = f"{topic}.refused"                            # no Write ACL on it yet
    ensure_topics(admin_conf["bootstrap.servers"], [TopicSpec(second, partitions=2)],
                  client=client)
    with open(config, "a") as f:
        f.write(f'[[sources]]\ntype = "file"\npaths = ["{tmp_path / "logs" / "other.log"}"]\n'
                f'topic = "{second}"\n')
    scope = Scope(topics=(topic,), audit_topic=audit_topic, progress_topic=progress)
    extra = sorted(set(role_acls("agent", "User:agent", scope))
                   - set(role_acls("agent", "User:agent",
                                   Scope(topics=(topic,), audit_topic=audit_topic))))
    assert [(a.resource, a.operation) for a in extra] == [
        ("group", "Read"), ("topic", "Read"), ("transactional-id", "Write")], extra
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        _write(tmp_path / "logs" / "app.log", LINES)
        _write(tmp_path / "logs" / "other.log", LINES)
        st = _wait_state(agent, "transactions refused")
        assert "docket-agent-secured-host" in st["broker"]["state"], st["broker"]
        time.sleep(FAILURE_S / 2)
        assert agent.status()["backlog"]["events"] == 2 * LINES
        assert _ids(admin_conf, topic, 1, 5) == Counter()

        grant(admin, extra)                                # the mode's ACLs
        ids = _ids(admin_conf, topic, LINES, 120)
        assert set(ids) == set(range(LINES)) and max(ids.values()) == 1
        st = _wait_state(agent, "not authorised")
        assert _ids(admin_conf, second, 1, 5) == Counter()     # waits aside, refused
        assert agent.status()["backlog"]["events"] == LINES

        grant(admin, [a for a in role_acls("agent", "User:agent", Scope(topics=(second,)))
                      if a.name == second])
        ids = _ids(admin_conf, second, LINES, 120)
        assert set(ids) == set(range(LINES)) and max(ids.values()) == 1
        _wait_state(agent, "up", 60)
        assert agent.metric("agent_drain_transactions_committed_total") >= 2
        assert agent.metric("agent_dropped_events_total") == 0
        assert not (tmp_path / "state" / "dead-letter").exists()
        print(f"exactly once without its ACLs: refused; granted, {LINES} ids once while "
              f"{LINES} of a refused topic waited; then those too, once")
    finally:
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()


# -- OAUTHBEARER ----------------------------------------------------------------------------------
# OpenID Connect's client credentials grant against a token endpoint on 127.0.0.1
# (tests/oidckit.py); the brokers check each token against the provider's key set, the principal
# the token's subject (User:agent, with the agent's least-privilege ACLs).
def test_a_refused_client_secret_waits_in_the_pool_and_a_reload_with_the_right_one_delivers_all(
        kafka_sasl, idp, tmp_path, agent_send_path):
    cluster = kafka_sasl.cluster
    right = idp.clients["agent"]
    topic, _audit, config, secret = _setup(cluster, tmp_path, "not-the-secret", agent_send_path,
                                           oauth=idp)
    refused0, issued0 = idp.refused["agent"], idp.issued["agent"]
    agent = AgentProcess(config, tmp_path / "agent.log").start()
    try:
        _write(tmp_path / "logs" / "app.log", LINES)
        st, cpu, said = _refused_for_a_while(agent, cluster, topic)
        assert st["broker"]["security"] == f"sasl_ssl, OAUTHBEARER client agent from " \
                                           f"{idp.token_url}"
        assert idp.refused["agent"] > refused0             # the endpoint really refused it
        assert idp.issued["agent"] == issued0              # and issued it nothing
        assert "sasl_oauthbearer_client_secret_file" in said, said

        secret.write_text(right + "\n")                    # fixed, then reloaded
        agent.proc.send_signal(signal.SIGHUP)
        ids = _ids(_admin_conf(cluster), topic, LINES, 120)
        assert set(ids) == set(range(LINES))               # 0 lost
        assert max(ids.values()) == 1                      # nothing had reached Kafka
        _wait_state(agent, "up", 60)
        assert idp.issued["agent"] > issued0               # through tokens the endpoint issued
        _no_secret_anywhere(agent, right)
        print(f"refused secret ({agent_send_path}): {idp.refused['agent'] - refused0} "
              f"refusals, {cpu:.2f} CPU s in {FAILURE_S} s; then all {LINES} ids once with "
              f"{idp.issued['agent'] - issued0} token(s)")
    finally:
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()


def test_tokens_the_brokers_find_expired_wait_in_the_pool_and_valid_ones_deliver_all_unasked(
        kafka_sasl, idp, tmp_path, agent_send_path):
    """The provider hands out tokens already expired (its clock behind the brokers'): every
    login is refused, the events wait, one line says so, no spin; once its tokens are valid
    again the agent's next token logs it in — no reload — and every id arrives once."""
    cluster = kafka_sasl.cluster
    topic, _audit, config, _secret = _setup(cluster, tmp_path, idp.clients["agent"],
                                            agent_send_path, oauth=idp)
    expired0, issued0 = idp.expired_issued["agent"], idp.issued["agent"]
    idp.expired = True
    agent = AgentProcess(config, tmp_path / "agent.log")
    try:
        agent.start()
        _write(tmp_path / "logs" / "app.log", LINES)
        _st, cpu, said = _refused_for_a_while(agent, cluster, topic)
        asked = idp.expired_issued["agent"] - expired0
        assert asked >= 2 and idp.issued["agent"] == issued0     # only expired tokens, again

        idp.expired = False                                # no reload: the next token works
        ids = _ids(_admin_conf(cluster), topic, LINES, 120)
        assert set(ids) == set(range(LINES)) and max(ids.values()) == 1
        _wait_state(agent, "up", 60)
        assert idp.issued["agent"] > issued0
        print(f"expired tokens ({agent_send_path}): {asked} asked for in {FAILURE_S} s, "
              f"{cpu:.2f} CPU s; then all {LINES} ids once, unasked; said: {said[-160:]}")
    finally:
        idp.expired = False
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()


def test_the_outage_probes_share_one_token_and_are_answered_with_it(kafka_sasl, idp, tmp_path):
    """The drain's probe is a new client at each question (``agent/drain/probe.py``): with
    OAUTHBEARER each would ask the identity provider for a token — once a second per agent for
    a whole outage. They share one instead, and the cluster answers them with it."""
    from agent.config import load
    from agent.drain.probe import cluster_answers, probe_conf
    from agent.drain.producer import producer_config

    _topic, _audit, config, _secret = _setup(kafka_sasl.cluster, tmp_path, idp.clients["agent"],
                                             oauth=idp)
    conf = producer_config(load(config), "python")
    issued0 = idp.issued["agent"]
    assert all(cluster_answers(conf) for _ in range(5))
    assert idp.issued["agent"] - issued0 == 1, idp.issued
    assert "oauth_cb" in probe_conf(conf) and not any(
        k.startswith("sasl.oauthbearer.") for k in probe_conf(conf))


# -- GSSAPI (Kerberos) --------------------------------------------------------------------------
# MIT's KDC on 127.0.0.1 (tests/krbkit.py); each test its own principal (its key changed at
# will), mapped by the brokers' default rule to User:<name>, with the agent's ACLs.
def _kerberos_agent(realm, config: Path, tmp_path: Path, cache: bool = True) -> AgentProcess:
    """The agent reaching ``realm`` through its configuration: its ticket cache the one
    ``KRB5CCNAME`` names (``cache``), else the one docket chooses (under ``tmp_path``)."""
    env = {**realm.env(), "KRB5CCNAME": f"FILE:{tmp_path / 'krb5cc'}"} if cache else \
        {**realm.env(), "KRB5CCNAME": "", "TMPDIR": str(tmp_path)}
    return AgentProcess(config, tmp_path / "agent.log", env=env)


def test_kerberos_delivers_every_event_once_on_a_ticket_from_the_kdc(
        kafka_sasl, krb, tmp_path, agent_send_path):
    cluster = kafka_sasl.cluster
    name = f"agent-{uuid.uuid4().hex[:6]}"
    krb.add(name)
    topic, _audit, config, _secret = _setup(cluster, tmp_path, "", agent_send_path,
                                            kerberos=(krb, name))
    agent = _kerberos_agent(krb, config, tmp_path, cache=False).start()
    try:
        _write(tmp_path / "logs" / "app.log", LINES)
        ids = _ids(_admin_conf(cluster), topic, LINES, 120)
        assert set(ids) == set(range(LINES)) and max(ids.values()) == 1
        st = _wait_state(agent, "up", 60)
        assert st["broker"]["security"] == f"sasl_ssl, GSSAPI principal {krb.principal(name)}"
        assert krb.requests(name) >= 1                     # a ticket the KDC really issued
        # in the cache docket chose for the principal, in a folder of its user's alone
        folder = tmp_path / f"docket-krb5-{os.getuid()}"
        (cache,) = folder.glob(f"{name}_DOCKET.TEST-*")
        assert cache.stat().st_size > 0 and folder.stat().st_mode & 0o077 == 0
        print(f"kerberos ({agent_send_path}): all {LINES} ids once, "
              f"{krb.requests(name)} ticket(s) issued")
    finally:
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()


def test_a_stale_keytab_waits_in_the_pool_and_a_reload_with_the_current_key_delivers_all(
        kafka_sasl, krb, tmp_path, agent_send_path):
    """The principal's key was changed at the KDC, the agent's keytab not: every kinit is
    refused (counted in the KDC's log), no ticket, no login; the events wait, status and one
    line say why, no spin. The current key exported to the keytab and the agent reloaded,
    every id arrives once."""
    cluster = kafka_sasl.cluster
    name = f"agent-{uuid.uuid4().hex[:6]}"
    keytab = krb.add(name)
    krb.change_key(name)                                   # the keytab is now stale
    topic, _audit, config, _secret = _setup(cluster, tmp_path, "", agent_send_path,
                                            kerberos=(krb, name))
    agent = _kerberos_agent(krb, config, tmp_path).start()
    try:
        _write(tmp_path / "logs" / "app.log", LINES)
        st, cpu, said = _refused_for_a_while(agent, cluster, topic)
        assert st["broker"]["security"] == f"sasl_ssl, GSSAPI principal {krb.principal(name)}"
        assert "sasl_kerberos_keytab_file" in said, said
        refused = krb.refusals(name)
        assert refused >= 1 and krb.requests(name) == 0   # the KDC refused it, issued nothing
        # fewer than one a second over the outage: the probes' kinit is rationed (each of
        # them ran its own before: 52-56 in these ~25 s)
        assert refused < FAILURE_S, refused

        krb.kadmin(f"ktadd -norandkey -k {keytab} {name}")   # fixed, then reloaded
        agent.proc.send_signal(signal.SIGHUP)
        ids = _ids(_admin_conf(cluster), topic, LINES, 120)
        assert set(ids) == set(range(LINES))               # 0 lost
        assert max(ids.values()) == 1                      # nothing had reached Kafka
        _wait_state(agent, "up", 60)
        assert krb.requests(name) >= 1
        print(f"stale keytab ({agent_send_path}): {refused} refusals, {cpu:.2f} CPU s in "
              f"{FAILURE_S} s; then all {LINES} ids once; said: {said[-200:]}")
    finally:
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()


def test_no_ticket_while_the_kdc_is_down_waits_in_the_pool_and_delivers_all_once_it_answers(
        kafka_sasl, krb, tmp_path, agent_send_path):
    """The KDC does not answer when the agent starts: no ticket, no login; the events wait,
    status and one line say why, no spin. Once the KDC answers again the agent's next kinit
    gets a ticket — no reload — and every id arrives once."""
    cluster = kafka_sasl.cluster
    name = f"agent-{uuid.uuid4().hex[:6]}"
    krb.add(name)
    topic, _audit, config, _secret = _setup(cluster, tmp_path, "", agent_send_path,
                                            kerberos=(krb, name))
    agent = _kerberos_agent(krb, config, tmp_path)
    krb.stop()
    try:
        agent.start()
        _write(tmp_path / "logs" / "app.log", LINES)
        _st, cpu, said = _refused_for_a_while(agent, cluster, topic)
        assert "sasl_kerberos_keytab_file" in said and "the KDC answers" in said, said

        krb.serve()                                        # no reload
        ids = _ids(_admin_conf(cluster), topic, LINES, 120)
        assert set(ids) == set(range(LINES)) and max(ids.values()) == 1
        _wait_state(agent, "up", 60)
        assert krb.requests(name) >= 1
        print(f"KDC down ({agent_send_path}): {cpu:.2f} CPU s in {FAILURE_S} s; then all "
              f"{LINES} ids once, unasked; said: {said[-160:]}")
    finally:
        if not krb.serving():
            krb.serve()
        if agent.alive():
            assert agent.stop() == 0, agent.log_text()
