"""The whole audit across a mirror between two secured clusters, each part as its own least-
privilege user: the local cluster takes mutual TLS (``kafka_mtls``), the aggregate SASL_SSL
with OAUTHBEARER tokens or Kerberos tickets (``kafka_sasl``). Agents write to the local cluster
(`agent`); a count job counts each cluster (`count`, with ``--kafka-config``); MirrorMaker 2
and its watcher copy the data and the audit topic as `mirror` (a client certificate on one end,
a token on the other); the land job reads the aggregate (`land`); the reconciler reads the
aggregate (`reconcile`). On the aggregate every client — MirrorMaker 2 and the count and land
jobs (Java), the watcher, the reconciler and `docket-audit show` (librdkafka) — logs in with
OpenID Connect tokens its client credentials get from a token endpoint on 127.0.0.1
(``tests/oidckit.py``), which the test checks issued each of them its tokens; then, in a second
run, with Kerberos as its own principal (``tests/krbkit.py``: MIT's KDC on 127.0.0.1), the
KDC's log showing each principal's tickets. Every window is ``complete`` at every tier with the
agents' true counts, nothing alerted, and no password, client secret or private key is in any
log, status, process argument list or file other users can read."""

from __future__ import annotations

import json
import re
import sqlite3
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from audit.reconcile.config import parse
from audit.reconcile.service import Reconciler
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.cluster import LocalCluster
from broker.mirror import Mirror, MirrorSpec
from broker.security import Scope, grant, role_acls
from docket_common.kafka_security import KafkaSecurity, kafka_config_text
from tests.agentkit import AgentProcess, write_config
from tests.auditkit import AuditJob, all_stopped_cleanly

# Three Spark jobs and MirrorMaker 2, all secured: 3.5 minutes, in CI's audit group (run beside
# the agent's tests: tests/run_groups.py).
pytestmark = pytest.mark.slow

W = 600_000
ORIGINS = ("sec-1", "sec-2")
LINES = 2_000                              # per origin, over two past windows
GRAPH = {"kafka-local": ["producer"], "kafka-aggregate": ["kafka-local"],
         "warehouse": ["kafka-aggregate"]}
TIERS = ("producer", *GRAPH)
BIN = Path(sys.executable).parent


def settings(cluster: LocalCluster, user: str) -> dict:
    """The security keys of ``user`` (a role's user), as every docket client takes them."""
    return cluster.security().docket_settings(user)


def oauth_settings(cluster: LocalCluster, idp, user: str, folder: Path) -> dict:
    """The security keys of ``user`` logging in with OAUTHBEARER (tokens of ``idp``), its
    client secret in a file of its own under ``folder``."""
    secret = folder / f"{user}.client-secret"
    secret.write_text(idp.clients[user] + "\n")
    secret.chmod(0o600)
    return {"security_protocol": "sasl_ssl", "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauthbearer_token_endpoint_url": idp.token_url,
            "sasl_oauthbearer_client_id": user, "sasl_oauthbearer_client_secret_file": str(secret),
            "sasl_oauthbearer_ca_file": str(idp.ca_file),
            "ssl_ca_file": str(cluster.security().ca_file)}


def kerberos_settings(cluster: LocalCluster, realm, user: str) -> dict:
    """The security keys of ``user`` logging in with GSSAPI as ``user@REALM`` of ``realm``
    (tests/krbkit.py), with the keytab the realm exported for it."""
    return {"security_protocol": "sasl_ssl", "sasl_mechanism": "GSSAPI",
            "sasl_kerberos_principal": realm.principal(user),
            "sasl_kerberos_keytab_file": str(realm.keytab(user)),
            "ssl_ca_file": str(cluster.security().ca_file)}


class Logins:
    """The aggregate's sign-in for the test's roles: OAUTHBEARER tokens of ``idp``, or
    Kerberos tickets of ``realm``; ``granted(user)`` counts what the provider or the KDC issued
    ``user``, ``refused(user)`` what it refused."""

    def __init__(self, kind: str, cluster: LocalCluster, folder: Path, idp=None, realm=None):
        self.kind, self.idp, self.realm = kind, idp, realm
        users = ("mirror", "count", "land", "reconcile")
        self.settings = {u: oauth_settings(cluster, idp, u, folder) if kind == "oauthbearer"
                         else kerberos_settings(cluster, realm, u) for u in users}

    def granted(self, user: str) -> int:
        return self.idp.issued[user] if self.kind == "oauthbearer" else \
            self.realm.requests(user)

    def refused(self, user: str) -> int:
        return self.idp.refused[user] if self.kind == "oauthbearer" else \
            self.realm.refusals(user)

    def secrets(self) -> list[str]:
        """The client secrets (a keytab holds keys, not text: its file is checked instead)."""
        return [self.idp.clients[u] for u in self.settings] if self.kind == "oauthbearer" \
            else []


def kafka_config(path: Path, keys: dict) -> Path:
    """A Spark job's ``--kafka-config`` file holding the security ``keys``."""
    path.write_text(kafka_config_text(KafkaSecurity.from_table(keys)))
    return path


def secrets(cluster: LocalCluster, users) -> list[str]:
    """What must appear nowhere: each user's password, or a line of its private key."""
    security = cluster.security()
    out = []
    for user in users:
        if security.mode == "sasl_ssl":
            out.append(security.password(user).strip())
        else:
            key = security.key_file(user).read_text().splitlines()
            out.append(max(key, key=len))                    # a line of the key itself
    return out


def admin_of(cluster: LocalCluster) -> tuple[str, dict]:
    conf = cluster.client_settings("admin")
    return conf["bootstrap.servers"], {k: v for k, v in conf.items() if k != "bootstrap.servers"}


@pytest.mark.timeout(1200)      # three Spark jobs and MirrorMaker 2 on a two-core host
@pytest.mark.parametrize("login", ["oauthbearer", "kerberos"])
def test_every_tier_is_complete_through_a_secured_mirror_each_part_as_its_own_user(
        kafka_mtls, kafka_sasl, idp, tmp_path, login, request, monkeypatch):
    local, aggregate = kafka_mtls.cluster, kafka_sasl.cluster
    realm = request.getfixturevalue("krb") if login == "kerberos" else None
    if realm is not None:
        # The realm's krb5.conf for every client: librdkafka's through KRB5_CONFIG (the
        # reconciler here, the watcher and `show` as children), the JVMs' (the Spark jobs,
        # MirrorMaker 2) through a system property.
        monkeypatch.setenv("KRB5_CONFIG", str(realm.krb5_conf))
        monkeypatch.setenv("JAVA_TOOL_OPTIONS", " ".join(realm.java_options()))
        monkeypatch.setenv("KRB5CCNAME", "")          # docket's own, per principal; undone after
    logins = Logins(login, aggregate, tmp_path, idp=idp, realm=realm)
    signin = logins.settings
    issued0 = {user: logins.granted(user) for user in signin}
    prefix = f"secaudit{uuid.uuid4().hex[:6]}"
    topic, audit_topic = f"{prefix}.app", f"{prefix}.audit"
    local_bootstrap, local_admin = admin_of(local)
    aggregate_bootstrap, aggregate_admin = admin_of(aggregate)
    ensure_topics(local_bootstrap, [TopicSpec(topic, partitions=2)], client=local_admin)
    ensure_audit_topic(local_bootstrap, audit_topic, client=local_admin)
    flow = dict(topics=(topic,), audit_topic=audit_topic, mirror_source="local",
                mirror_target="aggregate")
    grants = {local: [("agent", Scope(**flow)), ("count", Scope(**flow)),
                      ("mirror", Scope(side="source", **flow))],
              aggregate: [("mirror", Scope(side="target", **flow)), ("count", Scope(**flow)),
                          ("land", Scope(**flow)), ("reconcile", Scope(**flow))]}
    for cluster, roles in grants.items():
        admin = AdminClient(cluster.client_settings("admin"))
        for role, scope in roles:
            grant(admin, role_acls(role, f"User:{role}", scope))

    w0 = (int(time.time() * 1000) - 3 * 3_600_000) // W * W
    agents, jobs = [], []
    mirror = Mirror(tmp_path / "mirror", die_with_parent=True)
    try:
        # MirrorMaker 2 and its watcher as `mirror` on both ends; the audit topic created on
        # the aggregate by its admin, as `docket-broker mirror up` does for named clusters.
        mirror.up(MirrorSpec("local", "aggregate", local_bootstrap, aggregate_bootstrap,
                             re.escape(topic), audit_topic=audit_topic,
                             source_security=settings(local, "mirror"),
                             target_security=signin["mirror"]),
                  admin=aggregate.client_settings("admin"))
        assert mirror.status()["watch_state"] == "running"
        for origin in ORIGINS:
            home = tmp_path / origin
            (home / "logs").mkdir(parents=True)
            config = write_config(
                home / "agent.toml", local_bootstrap, home / "state",
                [{"type": "file", "paths": [str(home / "logs" / "app.log")], "topic": topic,
                  "timestamp_field": "ts"}],
                agent={"id": origin}, buffer={"size_bytes": 16 << 20, "slot_size_bytes": 1 << 18},
                broker=settings(local, "agent"),
                audit={"topic": audit_topic, "interval_ms": 2000})
            agents.append(AgentProcess(config, home / "agent.log").start())
            with open(home / "logs" / "app.log", "w") as f:
                f.writelines(json.dumps({"ts": w0 + i * (2 * W // LINES), "id": f"{origin}-{i}"})
                             + "\n" for i in range(LINES))

        common = ["--audit-topic", audit_topic, "--topics", re.escape(topic), "--trigger-s", "2"]
        jobs.append(AuditJob(["count", "--cluster", "kafka-local", "--bootstrap-servers",
                              local_bootstrap, *common, "--kafka-config",
                              str(kafka_config(tmp_path / "local-count.toml",
                                               settings(local, "count"))),
                              "--checkpoint-dir", str(tmp_path / "ckpt-local")],
                             tmp_path / "count-local.log").start())
        jobs.append(AuditJob(["count", "--cluster", "kafka-aggregate", "--bootstrap-servers",
                              aggregate_bootstrap, *common, "--mirror-target", "aggregate",
                              "--kafka-config", str(kafka_config(
                                  tmp_path / "aggregate-count.toml", signin["count"])),
                              "--checkpoint-dir", str(tmp_path / "ckpt-aggregate")],
                             tmp_path / "count-aggregate.log").start())
        jobs.append(AuditJob(["land", "--warehouse", str(tmp_path / "warehouse"),
                              "--bootstrap-servers", aggregate_bootstrap, *common,
                              "--mirror-target", "aggregate", "--kafka-config",
                              str(kafka_config(tmp_path / "land.toml", signin["land"])),
                              "--checkpoint-dir", str(tmp_path / "ckpt-land")],
                             tmp_path / "land.log").start())
        cfg = parse({"reconcile": {"bootstrap_servers": aggregate_bootstrap,
                                   "audit_topic": audit_topic,
                                   **signin["reconcile"]},
                     "windows": {"tiers": list(TIERS), "settle_ms": 1000},
                     "tiers": {tier: {"fed_by": fed_by} for tier, fed_by in GRAPH.items()},
                     "alerts": {"silent_ms": 8 * 3_600_000, "lag_ms": 3_600_000}})
        cfg.security.check_files()
        db = tmp_path / "r.db"

        def judged() -> dict:
            if not db.exists():
                return {}
            conn = sqlite3.connect(db)
            try:
                return {(t, w): (st, n) for t, w, st, n in conn.execute(
                    "SELECT tier, window_start, state, distinct_count FROM windows "
                    "WHERE topic = ? AND expected > 0", (topic,))}
            finally:
                conn.close()
        want = {(t, w): ("complete", LINES // 2 * len(ORIGINS))
                for t in TIERS for w in (w0, w0 + W)}
        deadline = time.monotonic() + 600
        while judged() != want:
            assert time.monotonic() < deadline, f"{judged()}\n{mirror.log_tail()}\n" + \
                "\n".join(j.log_text() for j in jobs)
            for j in jobs:
                assert j.proc.poll() is None, j.log_text()
            assert mirror.pid() is not None and mirror.watch_pid() is not None, \
                mirror.log_tail()
            Reconciler(cfg, db).run_once()
            time.sleep(0.5)
        conn = sqlite3.connect(db)
        alerts = conn.execute("SELECT kind FROM alerts").fetchall()
        conn.close()
        assert alerts == []
        before_show = logins.granted("reconcile")
        # `docket-audit show` reads the aggregate's audit topic as the reconciler's user.
        shown = subprocess.run(
            [str(BIN / "docket-audit"), "show", "--bootstrap-servers", aggregate_bootstrap,
             "--audit-topic", audit_topic, "--topic", topic, "--json", "--kafka-config",
             str(kafka_config(tmp_path / "reconcile.toml", signin["reconcile"]))],
            capture_output=True, text=True, timeout=120)
        assert shown.returncode == 0, shown.stderr
        counted = {}
        for row in json.loads(shown.stdout)["counts"]:
            if row["count"] == 0:                 # an empty window's heartbeat
                continue
            key = (row["tier"], row["window_start"])
            counted[key] = counted.get(key, 0) + row["count"]
        assert counted == {(t, w): LINES // 2 * len(ORIGINS)
                           for t in TIERS for w in (w0, w0 + W)}, counted
        # Each client had its tokens from the endpoint, or its tickets from the KDC (`show`
        # its own), and none was refused.
        granted = {user: logins.granted(user) - issued0[user] for user in signin}
        assert all(n > 0 for n in granted.values()), granted
        assert logins.granted("reconcile") > before_show
        assert not any(logins.refused(user) for user in signin)

        # No secret anywhere a person or another user could see it: logs, status, process
        # arguments; the mirror's files holding one are its owner's alone.
        seen = [a.whole_log() + json.dumps(a.status()) for a in agents]
        seen += [j.whole_log() for j in jobs]
        seen += [f.read_text(errors="replace") for f in mirror.folder.rglob("*.log")]
        seen += [f.read_text() for f in (mirror.spec_file, mirror.folder / "mm2.properties",
                                         *mirror.watch_folder.glob("*.toml"))]
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    seen.append((proc / "cmdline").read_bytes().decode(errors="replace"))
                except OSError:
                    pass
        hidden = secrets(local, ("agent", "count", "mirror")) + logins.secrets()
        for secret in hidden:
            assert not any(secret in text for text in seen)
        copies = sorted((mirror.folder / "secrets").iterdir())    # what the references name
        assert any(s in f.read_text() for f in copies for s in hidden)
        for private in (mirror.folder / "mm2.properties", *copies,
                        *mirror.watch_folder.glob("*.toml")):
            assert stat.S_IMODE(private.stat().st_mode) == 0o600, private
        assert all_stopped_cleanly(*jobs)
        jobs.clear()
        print(f"every tier complete, the aggregate by {login}: {granted} granted")
    finally:
        for a in agents:
            if a.alive():
                a.stop()
        for j in jobs:
            j.stop()
        mirror.down()
