"""The whole audit against a secured cluster, each part as its own least-privilege user: an agent
(`agent`), the Spark count job (`count`) and land job (`land`) with `--kafka-config`, and the
reconciler (`reconcile`), over SASL_SSL with SCRAM-SHA-512 and over mutual TLS. Every window is
``complete`` at every tier with the agents' true counts, nothing alerted, and no password is in
any log, status or process argument list."""

from __future__ import annotations

import json
import re
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from audit.reconcile.config import parse
from audit.reconcile.service import Reconciler
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.cluster import LocalCluster
from broker.security import Scope, grant, role_acls
from tests.agentkit import AgentProcess, write_config
from tests.auditkit import AuditJob

pytestmark = pytest.mark.slow

W = 600_000
ORIGINS = ("sec-1", "sec-2")
LINES = 2_000                              # per origin, over two past windows
TIERS = ("producer", "kafka-local", "warehouse")


@pytest.fixture(params=["kafka_sasl", "kafka_mtls"])
def secured(request) -> LocalCluster:
    """The session's SASL_SSL cluster, then its mutual-TLS one (tests/conftest.py)."""
    return request.getfixturevalue(request.param).cluster


def settings(cluster: LocalCluster, user: str) -> dict:
    """The security keys of ``user`` (a role's user), as every docket client takes them."""
    security = cluster.security()
    out = {"ssl_ca_file": str(security.ca_file)}
    if security.mode == "sasl_ssl":
        out.update(security_protocol="sasl_ssl", sasl_username=user,
                   sasl_password_file=str(security.password_file(user)))
    else:
        out.update(security_protocol="ssl", ssl_certificate_file=str(security.cert_file(user)),
                   ssl_key_file=str(security.key_file(user)))
    return out


def secrets(cluster: LocalCluster) -> list[str]:
    """What must appear nowhere: every user's password, every private key's body."""
    security = cluster.security()
    out = []
    for user in ("agent", "count", "land", "reconcile"):
        if security.mode == "sasl_ssl":
            out.append(security.password(user).strip())
        else:
            key = security.key_file(user).read_text().splitlines()
            out.append(max(key, key=len))                    # a line of the key itself
    return out


@pytest.mark.timeout(1200)      # two Spark jobs started and stopped on a loaded host
def test_every_tier_is_complete_with_each_part_as_its_own_least_privilege_user(secured,
                                                                               tmp_path):
    admin_conf = secured.client_settings("admin")
    bootstrap = admin_conf["bootstrap.servers"]
    options = {k: v for k, v in admin_conf.items() if k != "bootstrap.servers"}
    prefix = f"secaudit{uuid.uuid4().hex[:6]}"
    topic, audit_topic = f"{prefix}.app", f"{prefix}.audit"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=2)], client=options)
    ensure_audit_topic(bootstrap, audit_topic, client=options)
    scope = Scope(topics=(topic,), audit_topic=audit_topic)
    admin = AdminClient(admin_conf)
    for role in ("agent", "count", "land", "reconcile"):
        grant(admin, role_acls(role, f"User:{role}", scope))

    w0 = (int(time.time() * 1000) - 3 * 3_600_000) // W * W
    agents, jobs = [], []
    try:
        for origin in ORIGINS:
            home = tmp_path / origin
            (home / "logs").mkdir(parents=True)
            config = write_config(
                home / "agent.toml", bootstrap, home / "state",
                [{"type": "file", "paths": [str(home / "logs" / "app.log")], "topic": topic,
                  "timestamp_field": "ts"}],
                agent={"id": origin}, buffer={"size_bytes": 16 << 20, "slot_size_bytes": 1 << 18},
                broker=settings(secured, "agent"),
                audit={"topic": audit_topic, "interval_ms": 2000})
            agents.append(AgentProcess(config, home / "agent.log").start())
            with open(home / "logs" / "app.log", "w") as f:
                f.writelines(json.dumps({"ts": w0 + i * (2 * W // LINES), "id": f"{origin}-{i}"})
                             + "\n" for i in range(LINES))

        def kafka_config(user: str) -> Path:
            path = tmp_path / f"{user}.toml"
            path.write_text("[kafka]\n" + "".join(f"{k} = {json.dumps(v)}\n"
                                                 for k, v in settings(secured, user).items()))
            return path
        common = ["--bootstrap-servers", bootstrap, "--audit-topic", audit_topic,
                  "--topics", re.escape(topic), "--trigger-s", "2"]
        jobs.append(AuditJob(["count", "--cluster", "kafka-local", *common, "--kafka-config",
                              str(kafka_config("count")), "--checkpoint-dir",
                              str(tmp_path / "ckpt-count")], tmp_path / "count.log").start())
        jobs.append(AuditJob(["land", "--warehouse", str(tmp_path / "warehouse"), *common,
                              "--kafka-config", str(kafka_config("land")), "--checkpoint-dir",
                              str(tmp_path / "ckpt-land")], tmp_path / "land.log").start())
        cfg = parse({"reconcile": {"bootstrap_servers": bootstrap, "audit_topic": audit_topic,
                                   **settings(secured, "reconcile")},
                     "windows": {"tiers": list(TIERS), "settle_ms": 1000},
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
        deadline = time.monotonic() + 480
        while judged() != want:
            assert time.monotonic() < deadline, f"{judged()}\n" + \
                "\n".join(j.log_text() for j in jobs)
            for j in jobs:
                assert j.proc.poll() is None, j.log_text()
            Reconciler(cfg, db).run_once()
            time.sleep(2)
        conn = sqlite3.connect(db)
        alerts = conn.execute("SELECT kind FROM alerts").fetchall()
        conn.close()
        assert alerts == []

        # No secret anywhere a person or another user could see it.
        seen = [a.whole_log() + json.dumps(a.status()) for a in agents]
        seen += [j.whole_log() for j in jobs]
        for proc in Path("/proc").iterdir():
            if proc.name.isdigit():
                try:
                    seen.append((proc / "cmdline").read_bytes().decode(errors="replace"))
                except OSError:
                    pass
        for secret in secrets(secured):
            assert not any(secret in text for text in seen)
        for j in jobs:
            assert j.stopped_cleanly()
        jobs.clear()
    finally:
        for a in agents:
            if a.alive():
                a.stop()
        for j in jobs:
            j.stop()
