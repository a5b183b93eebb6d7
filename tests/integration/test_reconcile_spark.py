"""The reconciler fed by the real Spark count job: a loss the job sees is alerted with the
record numbers it names; the job stopped raises ``audit_lag`` and leaves a window it has not
read ``unknown`` (never ``loss``); restarted on its checkpoint, both resolve.

The producer tier's records come from a test producer (what the agents would say); the cluster
tier's from `docket-audit count` over records with `docket-seq` headers written to Kafka."""

from __future__ import annotations

import re
import sqlite3
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from audit.contract.record import Progress, Ranges
from audit.contract.record import parse as parse_record
from audit.reconcile.config import parse
from audit.reconcile.service import Reconciler
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from tests.auditkit import AuditJob, Clock
from tests.integration.test_reconcile import Receiver, count, send

pytestmark = pytest.mark.slow

W = 600_000
MIN = 60_000
LOST = (300, 309)                     # web-2's numbers never written to Kafka


def write(bootstrap: str, topic: str, window: int, origin: str, numbers: range) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for n in numbers:
        if origin == "web-2" and LOST[0] <= n <= LOST[1]:
            continue
        p.produce(topic, b'{"n": %d}' % n, timestamp=window + n % W, headers=[
            ("docket-origin", origin.encode()), ("docket-incarnation", b"inc"),
            ("docket-seq", n.to_bytes(8, "big"))])
    assert p.flush(30) == 0


def producer_reports(topic: str, window: int, first: int, n: int, seq: int) -> list:
    """What two agents say they accepted for ``window``: ``n`` records each, numbered from
    ``first``."""
    out = []
    for origin in ("web-1", "web-2"):
        out.append(count("producer", topic, origin, n, window=window, seq=seq,
                         at=int(time.time() * 1000)))
        out.append(Ranges.of(tier="producer", origin=origin, origin_incarnation="inc",
                             emitter=f"{origin}/agent", seq=seq, through=first + n - 1,
                             missing=[], incarnation="i1"))
    return out


def test_the_count_job_stopped_raises_audit_lag_leaves_windows_unknown_and_both_resolve(
        kafka, tmp_path):
    prefix = f"rspark{uuid.uuid4().hex[:6]}"
    topic, audit_topic = f"{prefix}.app", f"{prefix}.audit"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic, partitions=2)])
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    now = int(time.time() * 1000)
    w1 = (now - 3 * 3_600_000) // W * W          # past grace and final
    w2 = w1 + W
    receiver = Receiver()
    cfg = parse({"reconcile": {"bootstrap_servers": kafka.bootstrap_servers,
                               "audit_topic": audit_topic},
                 "windows": {"tiers": ["producer", "kafka-local"], "settle_ms": 1000},
                 "alerts": {"default_channels": ["ops"], "silent_ms": 8 * 3_600_000,
                            "lag_ms": 10 * MIN},
                 "channels": {"ops": {"type": "webhook", "url": receiver.url}}})
    db = tmp_path / "r.db"
    job_args = ["count", "--cluster", "kafka-local", "--bootstrap-servers",
                kafka.bootstrap_servers, "--audit-topic", audit_topic,
                "--topics", re.escape(topic), "--trigger-s", "2",
                "--checkpoint-dir", str(tmp_path / "ckpt")]

    def events():
        return [(b["event"], b["kind"], b["tier"], b["origin"]) for b in receiver.bodies]

    def window_state(window: int) -> str:
        conn = sqlite3.connect(db)
        try:
            return conn.execute("SELECT state FROM windows WHERE window_start = ? AND "
                                "tier = 'kafka-local'", (window,)).fetchone()[0]
        finally:
            conn.close()

    try:
        # 1. Window 1: 1,000 records from each agent, ten of web-2's never reach Kafka.
        write(kafka.bootstrap_servers, topic, w1, "web-1", range(1000))
        write(kafka.bootstrap_servers, topic, w1, "web-2", range(1000))
        send(kafka.bootstrap_servers, audit_topic, producer_reports(topic, w1, 0, 1000, 1))
        clock_mark = time.time() - time.monotonic()
        job = AuditJob(job_args, tmp_path / "count1.log").start()
        _reconcile_until(cfg, db, Clock(), lambda: ("firing", "loss", "kafka-local", "web-2")
                         in events(), job)
        # A step back of the wall clock since the job started may stamp later records earlier.
        stepped_back_ms = max(0, clock_mark - (time.time() - time.monotonic())) * 1000
        _assert_announced_before_counting(kafka.bootstrap_servers, audit_topic, "kafka-local",
                                          stepped_back_ms)
        loss = next(b for b in receiver.bodies if b["kind"] == "loss")
        assert (loss["detail"]["expected"], loss["detail"]["actual"]) == (1000, 990)
        assert loss["detail"]["missing_ranges"] == [list(LOST)]
        assert job.stopped_cleanly()

        # 2. The job is stopped. Window 2's records reach Kafka and the agents report them.
        write(kafka.bootstrap_servers, topic, w2, "web-1", range(1000, 1500))
        write(kafka.bootstrap_servers, topic, w2, "web-2", range(1000, 1500))
        send(kafka.bootstrap_servers, audit_topic, producer_reports(topic, w2, 1000, 500, 2))
        Reconciler(cfg, db, clock=Clock(11 * MIN)).run_once()     # 11 min later, no progress
        assert ("firing", "audit_lag", "kafka-local", None) in events()
        assert window_state(w2) == "unknown"
        assert [e for e in events() if e[1] == "loss"] == \
            [("firing", "loss", "kafka-local", "web-2")]           # no loss for window 2

        # 3. Restarted on its checkpoint: it reads window 2, its progress is fresh again.
        job = AuditJob(job_args, tmp_path / "count2.log").start()
        _reconcile_until(cfg, db, Clock(), lambda: ("resolved", "audit_lag", "kafka-local",
                                                    None) in events() and
                         window_state(w2) == "complete", job)
        assert job.stopped_cleanly()
    finally:
        receiver.close()
    assert [e for e in events() if e[1] == "loss"] == [("firing", "loss", "kafka-local",
                                                        "web-2")]


def _assert_announced_before_counting(bootstrap: str, audit_topic: str, tier: str,
                                      slack_ms: float = 0) -> None:
    """The job's first audit record is its announcement (a progress record saying it
    publishes ``caught_up`` records, batch -1), stamped by the broker before any of its
    counts (within ``slack_ms``: how far the wall clock stepped back meanwhile): a reconciler
    never sees its counts without knowing it."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    md = c.list_topics(audit_topic, timeout=30).topics[audit_topic]
    c.assign([TopicPartition(audit_topic, p, 0) for p in md.partitions])
    firsts: dict[str, int] = {}
    ends = set()
    try:
        while len(ends) < len(md.partitions):
            for msg in c.consume(1000, timeout=1):
                if msg.error():
                    ends.add(msg.partition())
                    continue
                rec = parse_record(msg.value())
                if rec.tier != tier:
                    continue
                kind = "announced" if isinstance(rec, Progress) and rec.batch_id == -1 else \
                    type(rec).__name__
                at = msg.timestamp()[1]
                firsts[kind] = min(at, firsts.get(kind, at))
    finally:
        c.close()
    assert "announced" in firsts and \
        firsts["announced"] <= firsts["AuditRecord"] + slack_ms, (firsts, slack_ms)


def _reconcile_until(cfg, db, clock, done, job, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if job.proc.poll() is not None:
            raise AssertionError(f"the count job exited:\n{job.log_text()}")
        Reconciler(cfg, db, clock=clock).run_once()
        if done():
            return
        time.sleep(0.5)
    raise AssertionError(f"not reconciled in {timeout_s} s:\n{job.log_text()}")
