"""The three tiers agree: agents (producer), the Spark count job (cluster), the Spark land job
(warehouse), over a known stream, exactly, per (topic, window, origin)."""

from __future__ import annotations

import sqlite3
import time
import uuid

import pytest
from confluent_kafka import Producer

from audit.contract.collect import read_audit_topic
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from tests.agentkit import AgentProcess, write_config
from tests.auditkit import AuditJob, all_done, known_stream, tier_counts, truth

pytestmark = pytest.mark.slow

RECORDS = 200_000
ORIGINS = ["origin-a", "origin-b", "origin-c"]


def _malformed(bootstrap: str, audit_topic: str) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    for value in [b"this is not json", b'{"v": 1, "tier": "producer"}',
                  b'{"v": 1, "tier": "producer", "origin": "o", "topic": "t", '
                  b'"window_start": 0, "window_ms": 600000, "count": "many", "bytes": 0, '
                  b'"checksum": "0000000000000000", "emitter": "e", "seq": 1, '
                  b'"emitted_at": 0}',
                  b'{"v": 1, "pad": "' + b"x" * 200_000 + b'"}']:
        p.produce(audit_topic, value, b"junk")
    assert p.flush(30) == 0


def _run_agents(kafka, tmp_path, topics, audit_topic, stream) -> dict[str, AgentProcess]:
    agents = {}
    for origin in ORIGINS:
        d = tmp_path / origin
        (d / "logs").mkdir(parents=True)
        cfg = write_config(
            d / "agent.toml", kafka.bootstrap_servers, d / "state",
            [{"type": "file", "paths": [str(d / "logs" / f"{t}.log")], "topic": t,
              "timestamp_field": "ts"} for t in topics],
            agent={"id": origin}, buffer={"size_bytes": 64 << 20},
            audit={"topic": audit_topic, "interval_ms": 1000})
        agents[origin] = AgentProcess(cfg, d / "agent.log").start()
    for (origin, topic), lines in stream.items():
        with open(tmp_path / origin / "logs" / f"{topic}.log", "wb") as f:
            f.write(b"".join(line + b"\n" for line in lines))
    for origin, agent in agents.items():
        want = sum(len(v) for (o, _t), v in stream.items() if o == origin)
        deadline = time.monotonic() + 180
        while agent.metric("agent_drain_sent_events_total") < want:
            assert time.monotonic() < deadline, agent.log_text()
            time.sleep(0.5)
    for agent in agents.values():
        assert agent.stop() == 0, agent.log_text()           # SIGTERM: a last audit round
    return agents


def test_producer_cluster_and_warehouse_tiers_agree_exactly(kafka, tmp_path):
    prefix = f"aud{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}.t{i}" for i in range(5)]
    audit_topic = f"{prefix}.audit"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=3) for t in topics])
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    stream = known_stream(RECORDS, topics, ORIGINS)
    expected = truth(stream)
    windows = {k[1] for k in expected}
    print(f"\n{RECORDS} records, {len(topics)} topics, {len(windows)} windows, "
          f"{len(ORIGINS)} origins: {len(expected)} (topic, window, origin) groups")
    assert len(windows) >= 6 and len(expected) >= 5 * 6 * 3

    agents = _run_agents(kafka, tmp_path, topics, audit_topic, stream)
    _malformed(kafka.bootstrap_servers, audit_topic)

    common = ["--bootstrap-servers", kafka.bootstrap_servers, "--audit-topic", audit_topic,
              "--topics", rf"{prefix}\.t[0-9]+", "--once"]
    count = AuditJob(["count", "--cluster", "kafka-local", *common, "--checkpoint-dir",
                      str(tmp_path / "ckpt-count")], tmp_path / "count.log").start()
    land = AuditJob(["land", "--warehouse", str(tmp_path / "warehouse"), *common],
                    tmp_path / "land.log").start()   # beside count: neither counts the other's
    all_done(count, land, timeout_s=600)

    state = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    tiers = {t: tier_counts(state, t, set(topics)) for t in ("producer", "kafka-local",
                                                              "warehouse")}
    for tier, got in tiers.items():
        wrong = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
        extra = set(got) - set(expected)
        print(f"{tier}: {len(got)} groups, {sum(c for c, _b, _h in got.values())} records, "
              f"{len(wrong)} differ from the stream, {len(extra)} extra")
        assert not wrong and not extra, (tier, list(wrong.items())[:5], list(extra)[:5])
    assert state.malformed == {"not_json": 1, "missing_field": 1, "wrong_type": 1, "huge": 1}
    producer = state.by_tier()["producer"]
    assert sum(r.late for k, r in producer.items() if k[0] in topics) == RECORDS  # past windows
    assert list((tmp_path / "warehouse" / "data").glob(f"topic={prefix}.t0/date=*/hour=*"))
    # Identity at the producer tier: each record counted once, under the agent's incarnation;
    # its ranges record says every number it gave, none journalled.
    for origin in ORIGINS:
        db = sqlite3.connect(tmp_path / origin / "state" / "state.db")
        [(incarnation, next_record)] = db.execute(
            "SELECT incarnation, next_record FROM identity").fetchall()
        db.close()
        mine = [r for k, r in producer.items() if k[2] == origin and k[0] in topics]
        assert all((r.distinct, r.duplicates, r.incarnation) == (r.count, 0, incarnation)
                   for r in mine)
        [numbers] = [r for r in state.ranges.values()
                     if (r.tier, r.origin) == ("producer", origin)]
        assert numbers.origin_incarnation == incarnation and numbers.missing == []
        assert numbers.through + 1 == next_record == sum(r.count for r in mine)

    # An agent that restarts re-emits its cumulative counts (here: every window of origin-a,
    # as after a crash between a delivered round and clearing its marks): nothing changes.
    # The windows the agent keeps counts for (a heartbeat-only window is not stored, and is not
    # sent again once the clock has moved past it).
    db = sqlite3.connect(tmp_path / "origin-a" / "state" / "state.db")
    with db:
        stored = db.execute("SELECT topic, window_start FROM audit_windows").fetchall()
        marked = db.execute("UPDATE audit_windows SET dirty = 1").rowcount
    db.close()
    seqs = {(t, w, "origin-a"): producer[(t, w, "origin-a")].seq for t, w in stored}
    assert len(seqs) == 30
    agent = agents["origin-a"].start()
    deadline = time.monotonic() + 60
    while agent.metric("agent_audit_emitted_records_total") < marked:
        assert time.monotonic() < deadline, agent.log_text()
        time.sleep(0.5)
    assert agent.stop() == 0
    again = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    for tier, before in tiers.items():
        assert tier_counts(again, tier, set(topics)) == before, tier
    resent = again.by_tier()["producer"]
    assert all(resent[k].seq > seq for k, seq in seqs.items())
    print(f"origin-a re-emitted {marked} windows with higher seq; every tier's figures unchanged")


def test_every_source_type_is_counted_alike_by_the_producer_and_cluster_tiers(kafka, tmp_path):
    """Records from a syslog listener (util-linux ``logger`` over TCP), a journal
    (systemd-journal-remote's files, when it is installed), a CRI container file with entries
    cut into partial lines, a docker json-file and a plain file, through one agent: the count
    job's figures per (topic, window, origin) equal the agent's, and both equal what was
    written."""
    import subprocess

    from tests.agentkit import free_port, wait_until
    from tests.journalkit import entry, journal_tools, write_journal
    prefix = f"src{uuid.uuid4().hex[:6]}"
    kinds = ("syslog", "cri", "docker", "lines") + (("journald",) if journal_tools() else ())
    print(f"source types: {kinds}")
    topics = {k: f"{prefix}.{k}" for k in kinds}
    audit_topic = f"{prefix}.audit"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=2) for t in topics.values()])
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    cfg = write_config(tmp_path / "agent.toml", kafka.bootstrap_servers, tmp_path / "state", [
        {"type": "syslog", "listen": f"127.0.0.1:{port}", "topic": topics["syslog"]},
        {"type": "file", "format": "cri", "paths": [str(logs / "cri.log")],
         "topic": topics["cri"]},
        {"type": "file", "format": "docker", "paths": [str(logs / "docker.log")],
         "topic": topics["docker"]},
        {"type": "file", "paths": [str(logs / "app.log")], "topic": topics["lines"]},
    ] + ([{"type": "journald", "journal_directory": str(logs), "topic": topics["journald"]}]
         if "journald" in topics else []), audit={"topic": audit_topic, "interval_ms": 1000})
    n = 2_000
    if "journald" in topics:
        write_journal(logs / "remote.journal", [entry(i, MESSAGE=f"id-{i} journal")
                                                for i in range(n)])
    agent = AgentProcess(cfg, tmp_path / "agent.log").start()
    stamp = "2026-12-03T21:00:00.000000001Z"
    try:
        subprocess.run(["logger", "-n", "127.0.0.1", "-P", str(port), "-T", "-t", "app"],
                       input="".join(f"id-{i} syslog\n" for i in range(n)).encode(),
                       check=True, timeout=60)
        with open(logs / "cri.log", "wb") as f:
            for i in range(n):
                f.write(f"{stamp} stdout P id-{i} cut\n{stamp} stdout F  here\n".encode()
                        if i % 3 == 0 else f"{stamp} stderr F id-{i} whole\n".encode())
        with open(logs / "docker.log", "wb") as f:
            for i in range(n):
                f.write(b'{"log":"id-%d docker\\n","stream":"stdout","time":"%s"}\n'
                        % (i, stamp.encode()))
        (logs / "app.log").write_bytes(b"".join(b"id-%d line\n" % i for i in range(n)))
        wait_until("every record sent", lambda: agent.metric(
            "agent_drain_sent_events_total") >= len(topics) * n, 120, agent)
    finally:
        assert agent.stop() == 0, agent.log_text()          # SIGTERM: a last audit round
    count = AuditJob(["count", "--cluster", "kafka-local", "--bootstrap-servers",
                      kafka.bootstrap_servers, "--audit-topic", audit_topic,
                      "--topics", rf"{prefix}\.({'|'.join(kinds)})", "--once",
                      "--checkpoint-dir", str(tmp_path / "ckpt")], tmp_path / "count.log").start()
    all_done(count, timeout_s=600)
    state = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    producer = tier_counts(state, "producer", set(topics.values()))
    cluster = tier_counts(state, "kafka-local", set(topics.values()))
    assert producer == cluster
    per_topic = {t: 0 for t in topics.values()}
    for (topic, _window, _origin), (c, _b, _h) in cluster.items():
        per_topic[topic] += c
    assert per_topic == dict.fromkeys(topics.values(), n)
    cri_windows = {w for (t, w, _o) in cluster if t == topics["cri"]}
    assert cri_windows == {1796331600000 // 600_000 * 600_000}      # the runtime's time
