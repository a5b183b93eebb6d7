"""The audit across a mirror, as the seed ran it: a local cluster, MirrorMaker 2 copying the
data and the audit topic to an aggregate cluster, the real count job on each cluster, and the
reconciler reading the audit records *from the aggregate*, with the tier graph producer →
local → aggregate.

A clean window is ``complete`` at every tier. Then the seed's first example: the aggregate's
count job stopped, a window's records copied to the aggregate and 50 of them deleted there
before the job reads them: while the job is away the aggregate is ``unknown`` (never loss);
restarted, it is a ``loss`` at the hop local → aggregate naming the origin and exactly those
record numbers, while the local tier stays ``complete``. Then MirrorMaker 2 is SIGKILLed twice
while a window is written: the aggregate reports exactly the duplicates it holds (checked by id
against its topic), nothing missing, ``complete``.

The producer tier's records come from a test producer (what the agents would say)."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from audit.contract.collect import read_audit_topic
from audit.contract.record import AuditRecord, Ranges, value_hash
from audit.reconcile.config import parse
from audit.reconcile.service import Reconciler
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.mirror import Mirror, MirrorSpec
from tests.agentkit import AgentProcess, write_config
from tests.auditkit import AuditJob, Clock, all_stopped_cleanly, tier_counts
from tests.integration.test_mirror import _end_offsets
from tests.integration.test_reconcile import Receiver, send

pytestmark = pytest.mark.slow

W = 600_000
ORIGINS = ("web-1", "web-2", "web-3")
LOST = (1200, 1249)                   # web-2's numbers deleted on the aggregate in window 2
PER_ORIGIN = 20_000                   # window 3's records per origin, written as MM2 is killed
AGENT_LINES = 1_000                   # lines per agent and window, real agents
LAG_MS = 120_000                      # audit_lag: a tier silent this long (the stopped job)


def _partition(origin: str, n: int) -> int:
    """Partition 0 holds only the records the test deletes on the aggregate."""
    return 0 if origin == "web-2" and LOST[0] <= n <= LOST[1] else 1


def write(bootstrap: str, topic: str, window: int, numbers: range,
          pace_s: float = 0.0, origins: tuple[str, ...] = ORIGINS) -> int:
    """Each origin's records ``numbers``; with ``pace_s``, a pause after every 100 numbers
    (3 origins: about 3,000 records a second at 0.1)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for i, n in enumerate(numbers):
        for origin in origins:
            p.produce(topic, b'{"n": %d}' % n, partition=_partition(origin, n),
                      timestamp=window + n % W, headers=[
                          ("docket-origin", origin.encode()), ("docket-incarnation", b"inc"),
                          ("docket-seq", n.to_bytes(8, "big"))])
        if pace_s and i % 100 == 99:
            p.flush(30)
            time.sleep(pace_s)
    assert p.flush(30) == 0
    return len(origins) * len(numbers)


def read_all(bootstrap: str, topic: str, timeout_s: float = 120) -> list:
    """Every record ``topic`` holds now, to each partition's end."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4()}",
                  "enable.auto.commit": False})
    parts = c.list_topics(topic, timeout=30).topics[topic].partitions
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30) for p in parts}
    todo = {p: high for p, (low, high) in ends.items() if high > low}
    c.assign([TopicPartition(topic, p, low) for p, (low, _high) in ends.items()])
    out = []
    deadline = time.monotonic() + timeout_s
    try:
        while todo:
            assert time.monotonic() < deadline, f"{topic} not read to its end: {todo}"
            for m in c.consume(1000, timeout=1):
                if m.error():
                    continue
                out.append(m)
                if m.offset() >= todo.get(m.partition(), 0) - 1:
                    todo.pop(m.partition(), None)
    finally:
        c.close()
    return out


def reports(topic: str, window: int, numbers: range, seq: int,
            origins: tuple[str, ...] = ORIGINS) -> list:
    """What the agents say they accepted for ``window``: ``numbers`` each."""
    out = []
    payloads = [b'{"n": %d}' % n for n in numbers]
    checksum = sum(value_hash(v) for v in payloads) % 2**64
    for origin in origins:
        out.append(AuditRecord(
            tier="producer", origin=origin, topic=topic, window_start=window, window_ms=W,
            count=len(numbers), bytes=sum(len(v) for v in payloads), checksum=checksum,
            emitter=f"{origin}/agent", seq=seq, emitted_at=int(time.time() * 1000),
            incarnation="i1"))
        out.append(Ranges.of(tier="producer", origin=origin, origin_incarnation="inc",
                             emitter=f"{origin}/agent", seq=seq, through=numbers[-1],
                             missing=[], incarnation="i1"))
    return out


class Audit:
    """The reconciler on the aggregate (tier graph ``graph``), a webhook receiver, and the count
    jobs it starts, all on one data topic and audit topic of this test's."""

    def __init__(self, tmp_path, aggregate, graph: dict[str, list[str]], *locals_,
                 lag_ms: int = 30 * 60_000):
        prefix = f"maudit{uuid.uuid4().hex[:6]}"
        self.topic, self.audit_topic = f"{prefix}.app", f"{prefix}.audit"
        for bootstrap in locals_:
            ensure_topics(bootstrap, [TopicSpec(self.topic, partitions=2)])
            ensure_audit_topic(bootstrap, self.audit_topic)
        self.tmp_path = tmp_path
        self.receiver = Receiver()
        self.cfg = parse({
            "reconcile": {"bootstrap_servers": aggregate.bootstrap_servers,
                          "audit_topic": self.audit_topic},
            "windows": {"tiers": ["producer", *graph], "settle_ms": 1000},
            "tiers": {tier: {"fed_by": fed_by} for tier, fed_by in graph.items()},
            "alerts": {"default_channels": ["ops"], "silent_ms": 8 * 3_600_000,
                       "lag_ms": lag_ms},
            "channels": {"ops": {"type": "webhook", "url": self.receiver.url}}})
        self.db = tmp_path / "r.db"
        self.jobs: list[AuditJob] = []
        self.mirrors: list[Mirror] = []

    def mirror(self, source: str, bootstrap: str, aggregate) -> Mirror:
        m = Mirror(self.tmp_path / f"mirror-{source}", die_with_parent=True)
        self.mirrors.append(m)
        m.up(MirrorSpec(source, "aggregate", bootstrap, aggregate.bootstrap_servers,
                        topics=re.escape(self.topic), audit_topic=self.audit_topic))
        assert m.status()["watch_state"] == "running"
        return m

    def job(self, cluster: str, bootstrap: str, log: str, *extra: str) -> AuditJob:
        j = AuditJob(["count", "--cluster", cluster, "--bootstrap-servers", bootstrap,
                      "--audit-topic", self.audit_topic, "--topics", re.escape(self.topic),
                      "--trigger-s", "2", "--checkpoint-dir", str(self.tmp_path / cluster),
                      *extra], self.tmp_path / log).start()
        self.jobs.append(j)
        return j

    def states(self, window: int, table: str = "windows") -> dict:
        """tier → state of ``window`` (``window_origins``: (tier, origin) → state)."""
        conn = sqlite3.connect(self.db)
        try:
            if table == "windows":
                return dict(conn.execute("SELECT tier, state FROM windows WHERE "
                                         "window_start = ?", (window,)).fetchall())
            return {(t, o): st for t, o, st in conn.execute(
                "SELECT tier, origin, state FROM window_origins WHERE window_start = ?",
                (window,))}
        finally:
            conn.close()

    def alerts(self) -> list[tuple]:
        return [(b["event"], b["kind"], b["tier"], b["origin"]) for b in self.receiver.bodies]

    def until(self, done, *running: AuditJob, timeout_s: float = 300) -> None:
        """Reconcile until ``done()``; the ``running`` jobs must stay up."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for j in running:
                assert j.proc.poll() is None, f"a count job exited:\n{j.log_text()}"
            Reconciler(self.cfg, self.db, clock=Clock()).run_once()
            if done():
                return
            time.sleep(0.5)
        raise AssertionError(f"not reconciled in {timeout_s} s: {self.alerts()}\n"
                             f"{self.table()}\n{self.evidence(running)}\n"
                             + "\n".join(m.log_tail() for m in self.mirrors))

    def evidence(self, running: tuple[AuditJob, ...]) -> str:
        """What tells a tier left ``unknown`` apart: each origin's verdict and reason, the
        tiers' caught-up marks (vouched or not by the mirror's watcher) and progress, and the
        running jobs' last lines."""
        conn = sqlite3.connect(self.db)
        out = []
        try:
            for title, sql in (
                    ("origins", "SELECT window_start, tier, origin, state, expected, count, "
                     "reason FROM window_origins ORDER BY window_start, tier, origin"),
                    ("caught_up", "SELECT * FROM caught_up ORDER BY tier, emitter"),
                    ("caught_up_unvouched", "SELECT * FROM caught_up_unvouched"),
                    ("progress", "SELECT tier, emitter, batch_id, offsets_behind, emitted_at, "
                     "publishes_caught_up, incarnation FROM progress"),
                    ("dirty", "SELECT * FROM dirty"), ("evaluating", "SELECT * FROM evaluating")):
                out.append(f"-- {title}:")
                out += [str(row) for row in conn.execute(sql)]
        except sqlite3.OperationalError as exc:
            out.append(f"({exc})")
        finally:
            conn.close()
        for j in running:
            out.append(f"-- {j.log}:")
            out += j.log_text().splitlines()[-25:]
        return "\n".join(out)

    def table(self) -> str:
        """Every (window, tier) judged: state, expected, count, distinct (a failure's text)."""
        if not self.db.exists():
            return "(no database yet)"
        conn = sqlite3.connect(self.db)
        try:
            return "\n".join(map(str, conn.execute(
                "SELECT window_start, tier, state, expected, count, distinct_count FROM windows "
                "ORDER BY window_start, tier")))
        except sqlite3.OperationalError as exc:
            return f"(no windows: {exc})"
        finally:
            conn.close()

    def close(self) -> None:
        for j in self.jobs:
            j.stop()
        for m in self.mirrors:
            m.down()
        self.receiver.close()


# In CI (~7 min, in the audit group beside the agent's tests: tests/run_groups.py): seed 003's
# first Audit UI example, a loss located to the hop.
def test_a_mirror_is_judged_per_hop_and_a_loss_inside_it_is_located_to_the_hop(
        kafka, aggregate, tmp_path):
    audit = Audit(tmp_path, aggregate, {"local": ["producer"], "aggregate": ["local"]},
                  kafka.bootstrap_servers)
    topic, audit_topic = audit.topic, audit.audit_topic
    now = int(time.time() * 1000)
    w1 = (now - 3 * 3_600_000) // W * W          # past grace and final
    w2 = w1 + W
    states, alerts = audit.states, audit.alerts
    everywhere = {"producer": "complete", "local": "complete", "aggregate": "complete"}
    try:
        # 1. A clean window: 3 agents × 1,000 records, complete at every tier.
        write(kafka.bootstrap_servers, topic, w1, range(1000))
        send(kafka.bootstrap_servers, audit_topic, reports(topic, w1, range(1000), 1))
        mirror = audit.mirror("local", kafka.bootstrap_servers, aggregate)
        local_job = audit.job("local", kafka.bootstrap_servers, "local.log")
        aggregate_job = audit.job("aggregate", aggregate.bootstrap_servers, "aggregate.log",
                                  "--mirror-target", "aggregate")
        audit.until(lambda: states(w1) == everywhere, local_job, aggregate_job)
        assert alerts() == []

        # 2. The aggregate's job stops; window 2 is copied there, and 50 of web-2's records
        #    are deleted on the aggregate before the job reads them.
        assert aggregate_job.stopped_cleanly()
        written = write(kafka.bootstrap_servers, topic, w2, range(1000, 1500))
        send(kafka.bootstrap_servers, audit_topic, reports(topic, w2, range(1000, 1500), 2))
        deadline = time.monotonic() + 120
        while _end_offsets(aggregate.bootstrap_servers, topic) < 3000 + written:
            assert time.monotonic() < deadline, "the mirror did not copy window 2"
            time.sleep(1)
        _delete_block(aggregate.bootstrap_servers, topic)
        audit.until(lambda: states(w2).get("local") == "complete", local_job)
        assert states(w2)["aggregate"] == "unknown"                # not read: never loss
        assert alerts() == []

        # 3. Restarted on its checkpoint: a loss at the hop local → aggregate, with the numbers.
        aggregate_job = audit.job("aggregate", aggregate.bootstrap_servers, "aggregate2.log",
                                  "--mirror-target", "aggregate")
        audit.until(lambda: ("firing", "loss", "aggregate", "web-2") in alerts(), local_job,
                    aggregate_job)
        _assert_one_loss_at_the_hop(audit, w2, "local → aggregate", 500)
        assert states(w2) == {"producer": "complete", "local": "complete",
                              "aggregate": "incomplete"}
        assert states(w1) == everywhere

        # 4. MirrorMaker 2 SIGKILLed twice while window 3 is written: what it copies again
        #    is duplicates at the aggregate, exactly as many as it holds, and nothing missing.
        w3 = w2 + W
        before = _end_offsets(aggregate.bootstrap_servers, topic)
        numbers = range(1500, 1500 + PER_ORIGIN)
        writer = threading.Thread(target=write, args=(kafka.bootstrap_servers, topic, w3,
                                                      numbers), kwargs={"pace_s": 0.1})
        writer.start()
        kills = []
        for share in (1, 2):
            deadline = time.monotonic() + 120
            while _end_offsets(aggregate.bootstrap_servers, topic) - before < \
                    share * len(ORIGINS) * PER_ORIGIN // 3:
                assert time.monotonic() < deadline, f"the mirror stopped copying: {kills}"
                time.sleep(0.2)
            kills.append(mirror.pid())
            mirror.kill()
            mirror.start()
        writer.join(120)
        assert not writer.is_alive() and None not in kills and kills[0] != kills[1]
        send(kafka.bootstrap_servers, audit_topic, reports(topic, w3, numbers, 3))
        audit.until(lambda: states(w3).get("aggregate") == "complete" and
                    states(w3).get("local") == "complete", local_job, aggregate_job)
        copies = Counter()
        for m in read_all(aggregate.bootstrap_servers, topic):
            h = dict(m.headers() or [])
            if w3 <= m.timestamp()[1] < w3 + W:
                copies[(h["docket-origin"].decode(), int.from_bytes(h["docket-seq"],
                                                                    "big"))] += 1
        held = {o: {n for (origin, n) in copies if origin == o} for o in ORIGINS}
        assert all(held[o] == set(numbers) for o in ORIGINS)        # every id, nothing lost
        resent = {o: sum(c for (origin, _n), c in copies.items() if origin == o) - PER_ORIGIN
                  for o in ORIGINS}
        conn = sqlite3.connect(audit.db)
        try:
            judged = dict(conn.execute(
                "SELECT origin, duplicates FROM window_origins WHERE window_start = ? AND "
                "tier = 'aggregate'", (w3,)).fetchall())
        finally:
            conn.close()
        assert {o: judged.get(o, 0) for o in ORIGINS} == resent, (judged, resent, kills)
        print(f"mirror killed twice: {sum(resent.values())} copies resent {resent}")
        assert [a for a in alerts() if a[1] == "loss"] == [("firing", "loss", "aggregate",
                                                             "web-2")]
        assert all_stopped_cleanly(local_job, aggregate_job)
    finally:
        audit.close()


def _delete_block(bootstrap: str, topic: str) -> None:
    """Delete partition 0 of ``topic``: it holds only web-2's records numbered ``LOST``."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    held = LOST[1] - LOST[0] + 1
    for future in admin.delete_records([TopicPartition(topic, 0, held)]).values():
        assert future.result(30).low_watermark == held        # the fault really happened


def _assert_one_loss_at_the_hop(audit: Audit, window: int, hop: str, expected: int) -> None:
    """Exactly one loss alert: web-2's ``LOST`` records in ``window``, at ``hop``."""
    [loss] = [b for b in audit.receiver.bodies if b["kind"] == "loss"]
    detail = loss["detail"]
    assert (loss["topic"], loss["window_start"], loss["tier"], loss["origin"]) == \
        (audit.topic, window, "aggregate", "web-2")
    assert (detail["hop"], detail["hop_expected"], detail["actual"], detail["missing"]) \
        == (hop, expected, expected - 50, 50)
    assert detail["missing_ranges"] == [list(LOST)]
    assert f"hop {hop} origin web-2" in loss["summary"]


@pytest.mark.soak       # three clusters, two mirrors, three Spark jobs (~6 min): `make soak`
def test_two_local_clusters_feed_one_aggregate_and_a_loss_is_located_to_one_mirror(
        kafka, second_local, aggregate, tmp_path):
    """A second data centre: web-1 and web-3 write to dc1, web-2 to dc2, a mirror from each
    into the aggregate. The aggregate expects what both hold; records lost inside dc2's mirror
    (deleted on dc2 after its job counted them, before the stopped mirror copied them) are a
    loss at the hop dc2 → aggregate, every other tier complete."""
    audit = Audit(tmp_path, aggregate, {"dc1": ["producer"], "dc2": ["producer"],
                                        "aggregate": ["dc1", "dc2"]},
                  kafka.bootstrap_servers, second_local.bootstrap_servers)
    topic, audit_topic, states = audit.topic, audit.audit_topic, audit.states
    dcs = {"dc1": (kafka.bootstrap_servers, ("web-1", "web-3")),
           "dc2": (second_local.bootstrap_servers, ("web-2",))}
    w1 = (int(time.time() * 1000) - 3 * 3_600_000) // W * W
    w2 = w1 + W
    everywhere = {"producer": "complete", "dc1": "complete", "dc2": "complete",
                  "aggregate": "complete"}
    try:
        for bootstrap, origins in dcs.values():
            write(bootstrap, topic, w1, range(1000), origins=origins)
            send(bootstrap, audit_topic, reports(topic, w1, range(1000), 1, origins))
        mirrors = {dc: audit.mirror(dc, bootstrap, aggregate)
                   for dc, (bootstrap, _o) in dcs.items()}
        jobs = [audit.job(dc, bootstrap, f"{dc}.log") for dc, (bootstrap, _o) in dcs.items()]
        jobs.append(audit.job("aggregate", aggregate.bootstrap_servers, "aggregate.log",
                              "--mirror-target", "aggregate"))
        audit.until(lambda: states(w1) == everywhere, *jobs)
        conn = sqlite3.connect(audit.db)
        try:
            figures = {t: (e, d) for t, e, d in conn.execute(
                "SELECT tier, expected, distinct_count FROM windows WHERE window_start = ?",
                (w1,))}
        finally:
            conn.close()
        # Each local tier holds its own hosts; the aggregate expects (and holds) their sum.
        assert figures == {"producer": (3000, 3000), "dc1": (2000, 2000),
                           "dc2": (1000, 1000), "aggregate": (3000, 3000)}
        assert audit.alerts() == []

        # dc2's mirror stops; window 2 is written in both; dc2's job counts it; 50 of web-2's
        # records are deleted on dc2 before the mirror, started again, could copy them.
        mirrors["dc2"].down()
        for bootstrap, origins in dcs.values():
            write(bootstrap, topic, w2, range(1000, 1500), origins=origins)
            send(bootstrap, audit_topic, reports(topic, w2, range(1000, 1500), 2, origins))
        deadline = time.monotonic() + 300
        while tier_counts(read_audit_topic(second_local.bootstrap_servers, audit_topic), "dc2",
                          {topic}).get((topic, w2, "web-2"), (0,))[0] < 500:
            assert time.monotonic() < deadline, f"dc2 did not count window 2:\n" \
                f"{jobs[1].log_text()}"
            time.sleep(0.5)
        _delete_block(second_local.bootstrap_servers, topic)
        mirrors["dc2"].start()
        audit.until(lambda: ("firing", "loss", "aggregate", "web-2") in audit.alerts(), *jobs)
        _assert_one_loss_at_the_hop(audit, w2, "dc2 → aggregate", 500)
        audit.until(lambda: states(w2) == {**everywhere, "aggregate": "incomplete"}, *jobs)
        assert [a for a in audit.alerts() if a[1] == "loss"] == \
            [("firing", "loss", "aggregate", "web-2")]
        assert all_stopped_cleanly(*jobs)
    finally:
        audit.close()


@pytest.mark.soak   # three agents, three Spark jobs and a mirror, waiting out LAG_MS: `make soak`
@pytest.mark.timeout(1500)        # four Spark-judged phases, one of them waits out LAG_MS
def test_three_agents_through_a_mirror_are_complete_at_every_tier_and_a_stopped_aggregate_job_is_lag_not_loss(  # noqa: E501
        kafka, aggregate, tmp_path):
    """Three real agents write to the local cluster; MirrorMaker 2 copies the data and the
    audit topic to the aggregate; the count job on each cluster and the land job reading the
    aggregate (the warehouse) report there, where the reconciler reads. A clean window is
    ``complete`` at producer, local, aggregate and warehouse. Then the seed's second example:
    the aggregate's count job is stopped while the agents write three more windows: those
    windows are ``unknown`` at the aggregate, ``audit_lag`` fires for the aggregate alone, no
    ``loss``; restarted on its checkpoint, every window is ``complete`` at every tier and the
    lag resolves. Every id reaches the aggregate once."""
    graph = {"local": ["producer"], "aggregate": ["local"], "warehouse": ["aggregate"]}
    audit = Audit(tmp_path, aggregate, graph, kafka.bootstrap_servers, lag_ms=LAG_MS)
    topic, audit_topic, states, alerts = audit.topic, audit.audit_topic, audit.states, \
        audit.alerts
    w0 = (int(time.time() * 1000) - 3 * 3_600_000) // W * W     # past grace and final
    windows = [w0 + i * W for i in range(4)]                     # 1 clean, 3 while stopped
    everywhere = {t: "complete" for t in ("producer", *graph)}
    agents: list[AgentProcess] = []
    try:
        mirror = audit.mirror("local", kafka.bootstrap_servers, aggregate)
        local_job = audit.job("local", kafka.bootstrap_servers, "local.log")
        aggregate_job = audit.job("aggregate", aggregate.bootstrap_servers, "aggregate.log",
                                  "--mirror-target", "aggregate")
        land = AuditJob(["land", "--warehouse", str(tmp_path / "warehouse"),
                         "--bootstrap-servers", aggregate.bootstrap_servers,
                         "--audit-topic", audit_topic, "--topics", re.escape(topic),
                         "--trigger-s", "2", "--checkpoint-dir", str(tmp_path / "ckpt-land"),
                         "--mirror-target", "aggregate"], tmp_path / "land.log").start()
        audit.jobs.append(land)
        for origin in ORIGINS:
            home = tmp_path / origin
            (home / "logs").mkdir(parents=True)
            config = write_config(
                home / "agent.toml", kafka.bootstrap_servers, home / "state",
                [{"type": "file", "paths": [str(home / "logs" / "app.log")], "topic": topic,
                  "timestamp_field": "ts"}],
                agent={"id": origin}, buffer={"size_bytes": 16 << 20, "slot_size_bytes": 1 << 18},
                audit={"topic": audit_topic, "interval_ms": 2000})
            agents.append(AgentProcess(config, home / "agent.log"))
            agents[-1].start()

        def write_window(window: int) -> None:
            for origin in ORIGINS:
                with open(tmp_path / origin / "logs" / "app.log", "a") as f:
                    f.writelines(json.dumps({"ts": window + i * 60, "id": f"{origin}-{window}-{i}",
                                             "pad": "x" * (i % 40)}) + "\n"
                                 for i in range(AGENT_LINES))

        def data_alerts() -> list:
            return [a for a in alerts() if a[1] in ("loss", "duplication", "checksum_mismatch")]

        def lag_open(tier: str) -> bool:
            """Is an audit_lag alert of ``tier`` firing now? (A job slowed by a loaded host
            may lag a while and resolve: only the stopped one must lag and stay lagging.)"""
            events = [a[0] for a in alerts() if a[1:3] == ("audit_lag", tier)]
            return bool(events) and events[-1] == "firing"

        # 1. A clean window from three agents: complete at every tier, no data alert.
        write_window(windows[0])
        audit.until(lambda: states(windows[0]) == everywhere, local_job, aggregate_job, land,
                    timeout_s=600)
        assert data_alerts() == []

        # 2. The aggregate's count job stops while the agents write three more windows: the
        #    local tier judges them, the aggregate is unknown and lags, alone; never loss.
        assert aggregate_job.stopped_cleanly()
        for window in windows[1:]:
            write_window(window)
        audit.until(lambda: lag_open("aggregate") and not lag_open("local") and
                    all(states(w).get("local") == "complete" for w in windows[1:]),
                    local_job, land, timeout_s=600)
        for window in windows[1:]:
            assert states(window)["aggregate"] == "unknown", states(window)
            assert states(window)["producer"] == "complete", states(window)
        assert data_alerts() == []

        # 3. Restarted on its checkpoint: every window complete at every tier, the lag resolved.
        aggregate_job = audit.job("aggregate", aggregate.bootstrap_servers, "aggregate2.log",
                                  "--mirror-target", "aggregate")
        audit.until(lambda: all(states(w) == everywhere for w in windows) and
                    not lag_open("aggregate"), local_job, aggregate_job, land, timeout_s=600)
        assert data_alerts() == []
        conn = sqlite3.connect(audit.db)
        try:
            figures = conn.execute(
                "SELECT tier, sum(expected), sum(distinct_count), sum(duplicates) FROM windows "
                "WHERE topic = ? GROUP BY tier ORDER BY tier", (topic,)).fetchall()
        finally:
            conn.close()
        total = len(ORIGINS) * len(windows) * AGENT_LINES
        assert figures == [(t, total, total, 0) for t in sorted(everywhere)], figures

        # Every id reached the aggregate, once.
        ids = Counter(json.loads(m.value())["id"] for m in read_all(aggregate.bootstrap_servers,
                                                                    topic))
        assert len(ids) == total and max(ids.values()) == 1
        assert mirror.status()["state"] == "running"
        assert all_stopped_cleanly(local_job, aggregate_job, land)
    finally:
        for agent in agents:
            if agent.alive():
                agent.stop()
        audit.close()
