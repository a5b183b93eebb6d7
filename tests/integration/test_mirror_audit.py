"""The audit across a mirror, as the seed ran it: a local cluster, MirrorMaker 2 copying the
data and the audit topic to an aggregate cluster, the real count job on each cluster, and the
reconciler reading the audit records *from the aggregate*, with the tier graph producer →
local → aggregate.

A clean window is ``complete`` at every tier. Then the seed's first example: the aggregate's
count job stopped, a window's records copied to the aggregate and 50 of them deleted there
before the job reads them: while the job is away the aggregate is ``unknown`` (never loss);
restarted, it is a ``loss`` at the hop local → aggregate naming the origin and exactly those
record numbers, while the local tier stays ``complete``.

The producer tier's records come from a test producer (what the agents would say)."""

from __future__ import annotations

import re
import sqlite3
import time
import uuid

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from audit.contract.record import AuditRecord, Ranges, value_hash
from audit.reconcile.config import parse
from audit.reconcile.service import Reconciler
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from broker.mirror import Mirror, MirrorSpec
from tests.auditkit import AuditJob
from tests.integration.test_mirror import _end_offsets
from tests.integration.test_reconcile import Receiver, send
from tests.integration.test_reconcile_spark import Clock

pytestmark = pytest.mark.slow

W = 600_000
ORIGINS = ("web-1", "web-2", "web-3")
LOST = (1200, 1249)                   # web-2's numbers deleted on the aggregate in window 2


def _partition(origin: str, n: int) -> int:
    """Partition 0 holds only the records the test deletes on the aggregate."""
    return 0 if origin == "web-2" and LOST[0] <= n <= LOST[1] else 1


def write(bootstrap: str, topic: str, window: int, numbers: range) -> int:
    from confluent_kafka import Producer
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for origin in ORIGINS:
        for n in numbers:
            p.produce(topic, b'{"n": %d}' % n, partition=_partition(origin, n),
                      timestamp=window + n % W, headers=[
                          ("docket-origin", origin.encode()), ("docket-incarnation", b"inc"),
                          ("docket-seq", n.to_bytes(8, "big"))])
    assert p.flush(30) == 0
    return len(ORIGINS) * len(numbers)


def reports(topic: str, window: int, numbers: range, seq: int) -> list:
    """What the three agents say they accepted for ``window``."""
    out = []
    payloads = [b'{"n": %d}' % n for n in numbers]
    checksum = sum(value_hash(v) for v in payloads) % 2**64
    for origin in ORIGINS:
        out.append(AuditRecord(
            tier="producer", origin=origin, topic=topic, window_start=window, window_ms=W,
            count=len(numbers), bytes=sum(len(v) for v in payloads), checksum=checksum,
            emitter=f"{origin}/agent", seq=seq, emitted_at=int(time.time() * 1000),
            incarnation="i1"))
        out.append(Ranges.of(tier="producer", origin=origin, origin_incarnation="inc",
                             emitter=f"{origin}/agent", seq=seq, through=numbers[-1],
                             missing=[], incarnation="i1"))
    return out


def test_a_mirror_is_judged_per_hop_and_a_loss_inside_it_is_located_to_the_hop(
        kafka, aggregate, tmp_path):
    prefix = f"maudit{uuid.uuid4().hex[:6]}"
    topic, audit_topic = f"{prefix}.app", f"{prefix}.audit"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(topic, partitions=2)])
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    now = int(time.time() * 1000)
    w1 = (now - 3 * 3_600_000) // W * W          # past grace and final
    w2 = w1 + W
    receiver = Receiver()
    cfg = parse({"reconcile": {"bootstrap_servers": aggregate.bootstrap_servers,
                               "audit_topic": audit_topic},
                 "windows": {"tiers": ["producer", "local", "aggregate"], "settle_ms": 1000},
                 "tiers": {"local": {"fed_by": ["producer"]},
                           "aggregate": {"fed_by": ["local"]}},
                 "alerts": {"default_channels": ["ops"], "silent_ms": 8 * 3_600_000},
                 "channels": {"ops": {"type": "webhook", "url": receiver.url}}})
    db = tmp_path / "r.db"
    mirror = Mirror(tmp_path / "mirror", die_with_parent=True)

    def job(cluster: str, bootstrap: str, log: str, *extra: str) -> AuditJob:
        return AuditJob(["count", "--cluster", cluster, "--bootstrap-servers", bootstrap,
                         "--audit-topic", audit_topic, "--topics", re.escape(topic),
                         "--trigger-s", "2", "--checkpoint-dir", str(tmp_path / cluster),
                         *extra], tmp_path / log).start()

    def states(window: int) -> dict[str, str]:
        conn = sqlite3.connect(db)
        try:
            return dict(conn.execute("SELECT tier, state FROM windows WHERE window_start = ?",
                                     (window,)).fetchall())
        finally:
            conn.close()

    def alerts() -> list[tuple]:
        return [(b["event"], b["kind"], b["tier"], b["origin"]) for b in receiver.bodies]

    def reconcile_until(done, jobs, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for j in jobs:
                assert j.proc.poll() is None, f"a count job exited:\n{j.log_text()}"
            Reconciler(cfg, db, clock=Clock()).run_once()
            if done():
                return
            time.sleep(2)
        raise AssertionError(f"not reconciled in {timeout_s} s: {states(w1)} {states(w2)} "
                             f"{alerts()}\n{mirror.log_tail()}")

    everywhere = {"producer": "complete", "local": "complete", "aggregate": "complete"}
    local_job = aggregate_job = None
    try:
        # 1. A clean window: 3 agents × 1,000 records, complete at every tier.
        write(kafka.bootstrap_servers, topic, w1, range(1000))
        send(kafka.bootstrap_servers, audit_topic, reports(topic, w1, range(1000), 1))
        mirror.up(MirrorSpec("local", "aggregate", kafka.bootstrap_servers,
                             aggregate.bootstrap_servers, topics=re.escape(topic),
                             audit_topic=audit_topic))
        assert mirror.status()["watch_state"] == "running"
        local_job = job("local", kafka.bootstrap_servers, "local.log")
        aggregate_job = job("aggregate", aggregate.bootstrap_servers, "aggregate.log",
                            "--mirror-target", "aggregate")
        reconcile_until(lambda: states(w1) == everywhere, [local_job, aggregate_job])
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
        admin = AdminClient({"bootstrap.servers": aggregate.bootstrap_servers})
        held = LOST[1] - LOST[0] + 1
        for future in admin.delete_records([TopicPartition(topic, 0, held)]).values():
            assert future.result(30).low_watermark == held        # the fault really happened
        reconcile_until(lambda: states(w2).get("local") == "complete", [local_job])
        assert states(w2)["aggregate"] == "unknown"                # not read: never loss
        assert alerts() == []

        # 3. Restarted on its checkpoint: a loss at the hop local → aggregate, with the numbers.
        aggregate_job = job("aggregate", aggregate.bootstrap_servers, "aggregate2.log",
                            "--mirror-target", "aggregate")
        reconcile_until(lambda: ("firing", "loss", "aggregate", "web-2") in alerts(),
                        [local_job, aggregate_job])
        [loss] = [b for b in receiver.bodies if b["kind"] == "loss"]
        detail = loss["detail"]
        assert (loss["topic"], loss["window_start"]) == (topic, w2)
        assert (detail["hop"], detail["hop_expected"], detail["actual"], detail["missing"]) \
            == ("local → aggregate", 500, 450, 50)
        assert detail["missing_ranges"] == [list(LOST)]
        assert "hop local → aggregate origin web-2" in loss["summary"]
        assert states(w2) == {"producer": "complete", "local": "complete",
                              "aggregate": "incomplete"}
        assert states(w1) == everywhere
        assert [a for a in alerts() if a[1] == "loss"] == [("firing", "loss", "aggregate",
                                                             "web-2")]
        assert local_job.stopped_cleanly() and aggregate_job.stopped_cleanly()
    finally:
        for j in (local_job, aggregate_job):
            if j is not None:
                j.stop()
        mirror.down()
        receiver.close()
