"""MirrorMaker 2 from Kafka's own jars between two real clusters (``docket-broker mirror``):
topics by pattern and the audit topic copied under their own names, each record's headers,
timestamp and partition kept; killed twice mid-stream, it loses nothing and its resends are
copies of records it had copied (by record identity)."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import ConfigResource

from broker.admin import TopicSpec, admin_client, ensure_audit_topic, ensure_topics
from broker.mirror import Mirror, MirrorSpec
from tests.kafkautil import records_held

N = 6_000
# Event times an hour back: within the topics' retention (older ones would be deleted).
T0 = int(time.time() * 1000) - 3_600_000


def _spec(kafka, aggregate, prefix: str, audit_topic: str) -> MirrorSpec:
    return MirrorSpec("local", "aggregate", kafka.bootstrap_servers, aggregate.bootstrap_servers,
                      topics=re.escape(prefix) + r"\..*", audit_topic=audit_topic)


def _send(bootstrap: str, topic: str, first: int, n: int, pace_s: float = 0.0,
          every: int = 500, hold: tuple[int, threading.Event] | None = None) -> None:
    """Records ``first`` .. ``first + n - 1`` with docket's identity headers, a pause of
    ``pace_s`` after each ``every`` of them; ``hold`` (seq, event): record ``seq`` and those
    after it wait for the event (at most 240 s)."""
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                  "linger.ms": 5})
    for seq in range(first, first + n):
        if hold is not None and seq == hold[0]:
            p.flush(30)
            hold[1].wait(240)
        p.produce(topic, f"event {seq}".encode(), partition=seq % 2,
                  timestamp=T0 + seq,
                  headers=[("docket-origin", b"web-1"), ("docket-incarnation", b"i1"),
                           ("docket-seq", seq.to_bytes(8, "big"))])
        if pace_s and seq % every == every - 1:
            p.flush(30)
            time.sleep(pace_s)
    assert p.flush(30) == 0


def _read(bootstrap: str, topic: str, want: int, timeout_s: float) -> list:
    """Every record of ``topic`` once ``want`` distinct seqs are there (or the time is up)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}-{time.time()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    out, seqs = [], set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(seqs) < want and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error():
                continue
            out.append(m)
            h = dict(m.headers() or [])
            if "docket-seq" in h:
                seqs.add(int.from_bytes(h["docket-seq"], "big"))
    finally:
        c.close()
    return out


def _end_offsets(bootstrap: str, topic: str) -> int:
    """How many records ``topic`` holds (0 before the mirror created it; asked again while
    its new partitions elect their leader)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets"})
    try:
        return records_held(c, topic)
    finally:
        c.close()


@pytest.mark.slow
def test_the_mirror_copies_topics_and_the_audit_topic_with_headers_timestamps_partitions(
        kafka, aggregate, tmp_path, topic_name):
    prefix, audit_topic = topic_name, f"{topic_name}-audit"
    events = f"{prefix}.events"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(events, 2)])
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic, partitions=2)
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(f"{topic_name}-other", 1)])
    _send(kafka.bootstrap_servers, events, 0, N)
    _send(kafka.bootstrap_servers, audit_topic, 0, 10)
    _send(kafka.bootstrap_servers, f"{topic_name}-other", 0, 10)   # matches no pattern
    mirror = Mirror(tmp_path / "mirror", die_with_parent=True)
    mirror.up(_spec(kafka, aggregate, prefix, audit_topic))
    try:
        got = _read(aggregate.bootstrap_servers, events, N, 180)
        audit = _read(aggregate.bootstrap_servers, audit_topic, 10, 60)
        time.sleep(2)
        topics = admin_client(aggregate.bootstrap_servers).list_topics(timeout=10).topics
    finally:
        mirror.down()
    assert mirror.pid() is None
    # Each record once, under its own name, in its own partition, headers and timestamp kept.
    seqs = Counter(int.from_bytes(dict(m.headers())["docket-seq"], "big") for m in got)
    assert set(seqs) == set(range(N)) and max(seqs.values()) == 1
    for m in got:
        seq = int.from_bytes(dict(m.headers())["docket-seq"], "big")
        assert m.topic() == events and m.partition() == seq % 2
        assert m.timestamp() == (1, T0 + seq)                          # CreateTime, as sent
        assert m.value() == f"event {seq}".encode()
        assert dict(m.headers())["docket-origin"] == b"web-1"
    # The audit topic: copied, and stamped by the aggregate's brokers as it arrives there.
    assert len(audit) == 10 and all(m.timestamp()[0] == 2 for m in audit)  # LogAppendTime
    admin = admin_client(aggregate.bootstrap_servers)
    cfg = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, audit_topic)])
    [entries] = [f.result(timeout=30) for f in cfg.values()]
    assert entries["message.timestamp.type"].value == "LogAppendTime"
    assert f"{topic_name}-other" not in topics
    # The identity policy: the same names there (only MirrorMaker 2's own heartbeats topic
    # is copied as local.heartbeats).
    assert {events, audit_topic} <= set(topics)
    assert not {f"local.{events}", f"local.{audit_topic}"} & set(topics)


@pytest.mark.slow
def test_a_mirror_killed_twice_mid_stream_loses_nothing_and_resends_only_copies(
        kafka, aggregate, tmp_path, topic_name):
    prefix, audit_topic = topic_name, f"{topic_name}-audit"
    events = f"{prefix}.events"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(events, 2)])
    mirror = Mirror(tmp_path / "mirror", die_with_parent=True)
    mirror.up(_spec(kafka, aggregate, prefix, audit_topic))
    # The stream is written at ~300 records/s all along (about a minute); the mirror is killed
    # once the aggregate holds a third of it, and again at two thirds. Its last sixth waits for
    # the second kill: a mirror slowed by a loaded host (once 4,400 records behind when the
    # stream ended) is still killed while the stream is written.
    both_killed = threading.Event()
    sender = threading.Thread(target=_send, args=(kafka.bootstrap_servers, events, 0, 3 * N),
                              kwargs={"pace_s": 0.1, "every": 30,
                                      "hold": (5 * N // 2, both_killed)})
    sender.start()
    kills = []
    try:
        for third in (1, 2):
            deadline = time.monotonic() + 180
            while _end_offsets(aggregate.bootstrap_servers, events) < third * N and \
                    time.monotonic() < deadline:
                time.sleep(0.1)
            copied = _end_offsets(aggregate.bootstrap_servers, events)
            kills.append((mirror.pid(), copied, _end_offsets(kafka.bootstrap_servers, events)))
            mirror.kill()
            mirror.start()
        both_killed.set()
        sender.join(180)
        got = _read(aggregate.bootstrap_servers, events, 3 * N, 240)
    finally:
        both_killed.set()
        sender.join(180)
        mirror.down()
    # Both kills happened, each while the stream was still being written (what the aggregate
    # held then counts the resent copies too).
    assert len(kills) == 2 and kills[0][0] and kills[1][0] and kills[0][0] != kills[1][0]
    assert all(third * N <= copied and written < 3 * N for third, (_p, copied, written) in
               zip((1, 2), kills, strict=True)), kills
    seqs = Counter(int.from_bytes(dict(m.headers())["docket-seq"], "big") for m in got)
    assert set(seqs) == set(range(3 * N)), sorted(set(range(3 * N)) - set(seqs))[:20]
    resent = sum(seqs.values()) - 3 * N
    print(f"kills at (pid, copied, written) {kills}: {resent} copies resent, at most "
          f"{max(seqs.values())} of one record")
    assert max(seqs.values()) <= 3                  # a record is resent at most once per kill
    for m in got:                                   # a resend is a copy of the same record
        seq = int.from_bytes(dict(m.headers())["docket-seq"], "big")
        assert m.value() == f"event {seq}".encode() and m.partition() == seq % 2
