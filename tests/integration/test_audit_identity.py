"""Record identity at the Spark tiers: a known stream with ``docket-seq`` headers from three
origins goes straight to Kafka — one origin with known ranges left out, one with a known set
sent twice, some records 15 minutes late, some without any identity — and the count and land
jobs must report exactly the injected duplicates and missing ranges, with ``distinct`` equal to
the truth for every (topic, window, origin). ``land --dedup`` lands each (origin, seq) once:
its Parquet is read back and checked record by record, and its counts say how many copies it
skipped."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest
from confluent_kafka import Producer

from audit.contract.collect import read_audit_topic
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from tests.auditkit import LATE_MS, WINDOW_MS, AuditJob, all_done
from tests.sparkcluster import StandaloneSpark

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

RECORDS = 30_000                       # numbered, over three origins
ORIGINS = ["origin-a", "origin-b", "origin-c"]
LEFT_OUT = {"origin-a": [(1000, 1999), (5000, 5000), (7777, 7780)]}
TWICE = {"origin-b": set(range(2000, 2500)) | {3, 4444, 9000}}
UNNUMBERED = 300                        # records without headers (another producer)


def identity_stream(topics: list[str], seed: int = 11):
    """[(topic, ts, value, headers)] in sending order, and the truth: per (topic, window, origin)
    [count, distinct], per origin its numbers sent."""
    rng = random.Random(seed)
    w0 = (int(time.time() * 1000) // WINDOW_MS - 7) * WINDOW_MS
    span = 6 * WINDOW_MS - LATE_MS
    numbers = dict.fromkeys(ORIGINS, 0)
    sent: list[tuple] = []
    for i in range(RECORDS):
        ts = w0 + LATE_MS + span * i // RECORDS
        if rng.random() < 0.02:
            ts -= LATE_MS                                   # late: an earlier window
        origin, topic = rng.choice(ORIGINS), rng.choice(topics)
        n = numbers[origin]
        numbers[origin] += 1
        if any(a <= n <= b for a, b in LEFT_OUT.get(origin, [])):
            continue
        value = json.dumps({"ts": ts, "id": f"{origin}-{n}",
                            "pad": "x" * rng.randrange(0, 80)}).encode()
        headers = [("docket-origin", origin.encode()),
                   ("docket-incarnation", f"inc-{origin}".encode()),
                   ("docket-seq", n.to_bytes(8, "big"))]
        sent.append((topic, ts, value, headers))
        if n in TWICE.get(origin, ()):
            sent.append((topic, ts, value, headers))       # the same record, again, later
    for i in range(UNNUMBERED):
        ts = w0 + LATE_MS + span * i // UNNUMBERED
        sent.append((topics[i % len(topics)], ts, b"plain %d" % i, None))
    rng.shuffle(sent)                                       # any order in Kafka
    truth: dict[tuple, list[int]] = {}
    seen: set[tuple] = set()
    for topic, ts, _value, headers in sent:
        h = dict(headers or ())
        origin = h.get("docket-origin", b"-").decode()
        c = truth.setdefault((topic, ts // WINDOW_MS * WINDOW_MS, origin), [0, 0])
        c[0] += 1
        ident = (origin, h.get("docket-seq"))
        if headers is not None and ident not in seen:
            seen.add(ident)
            c[1] += 1
    return sent, truth, numbers


def _written(kafka, name: str, seed: int):
    """Two fresh topics and an audit topic, the identity stream written to them: (prefix,
    topics, audit topic, what ``identity_stream`` returns)."""
    prefix = f"{name}{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}.t{i}" for i in range(2)]
    audit_topic = f"{prefix}.audit"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=3) for t in topics])
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    stream = identity_stream(topics, seed=seed)
    _produce(kafka.bootstrap_servers, stream[0])
    return prefix, topics, audit_topic, stream


def test_every_tier_reports_the_injected_duplicates_and_missing_ranges(kafka, tmp_path):
    prefix, topics, audit_topic, (sent, truth, numbers) = _written(kafka, "ident", seed=11)

    common = ["--bootstrap-servers", kafka.bootstrap_servers, "--audit-topic", audit_topic,
              "--topics", rf"{prefix}\.t[0-9]+", "--once"]
    # Several batches (each ~4,000 records): duplicates and gaps span batches, so they are
    # found through the checkpointed state, not within one batch.
    count = AuditJob(["count", "--cluster", "kafka-local", *common, "--checkpoint-dir",
                      str(tmp_path / "ckpt-count"), "--max-offsets-per-trigger", "4000"],
                     tmp_path / "count.log").start()
    land = AuditJob(["land", "--warehouse", str(tmp_path / "warehouse"), *common,
                     "--checkpoint-dir", str(tmp_path / "ckpt-land"),
                     "--max-offsets-per-trigger", "4000"],
                    tmp_path / "land.log").start()   # beside count: neither counts the other's
    all_done(count, land, timeout_s=600)

    state = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    assert not state.malformed
    batches = count.whole_log().count("audit record(s) written for tier kafka-local")
    assert batches >= 5, batches
    for tier in ("kafka-local", "warehouse"):
        _assert_exact(state, tier, topics, truth, numbers)


def _assert_exact(state, tier: str, topics: list[str], truth: dict, numbers: dict) -> None:
    """``tier`` reported exactly the stream's truth: count, distinct and duplicates per
    (topic, window, origin), the left-out ranges as missing per origin."""
    got = {k: r for k, r in state.by_tier()[tier].items() if k[0] in topics}
    assert set(got) == set(truth), tier
    for key, (n, distinct) in truth.items():
        r = got[key]
        if key[2] == "-":                               # no identity: never guessed
            assert (r.count, r.distinct, r.duplicates) == (n, None, None), (tier, key)
        else:
            assert (r.count, r.distinct, r.duplicates) == (n, distinct, n - distinct), \
                (tier, key, r)
    spaces = {r.origin: r for r in state.ranges.values() if r.tier == tier}
    assert set(spaces) == set(ORIGINS), tier
    for origin in ORIGINS:
        r = spaces[origin]
        assert r.origin_incarnation == f"inc-{origin}"
        assert r.through == numbers[origin] - 1 or \
            any(b == numbers[origin] - 1 for _a, b in LEFT_OUT.get(origin, []))
        assert r.missing == [list(g) for g in LEFT_OUT.get(origin, [])], (tier, origin)
        assert r.missing_total == sum(b - a + 1 for a, b in LEFT_OUT.get(origin, []))
    dups = sum(r.duplicates for k, r in got.items() if k[2] != "-")
    assert dups == sum(len(s) for s in TWICE.values()), tier
    print(f"{tier}: {len(got)} groups, {sum(r.count for r in got.values())} records, "
          f"{dups} duplicates, missing {[(o, spaces[o].missing) for o in ORIGINS]}")


def test_a_checkpoint_of_the_former_counting_is_taken_over_exactly(kafka, tmp_path):
    """The first half of the stream counted by the counting as it was (its tallies in Spark's
    state: ``tests/former_counting.py``), the second by ``docket-audit count`` on the same
    checkpoint: the job reads the former state over once and reports the whole stream exactly."""
    prefix = f"former{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}.t{i}" for i in range(2)]
    audit_topic = f"{prefix}.audit"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=3) for t in topics])
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    sent, truth, numbers = identity_stream(topics, seed=13)
    pattern, ckpt = rf"{prefix}\.t[0-9]+", tmp_path / "ckpt"
    half = len(sent) // 2
    _produce(kafka.bootstrap_servers, sent[:half])
    former = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "former_counting.py"), kafka.bootstrap_servers,
         pattern, audit_topic, str(ckpt), "4000"], capture_output=True, text=True, timeout=600)
    assert former.returncode == 0, former.stderr[-3000:]
    assert (ckpt / "count" / "state").is_dir()
    _produce(kafka.bootstrap_servers, sent[half:])
    count = AuditJob(["count", "--cluster", "kafka-local", "--bootstrap-servers",
                      kafka.bootstrap_servers, "--audit-topic", audit_topic, "--topics", pattern,
                      "--once", "--checkpoint-dir", str(ckpt), "--max-offsets-per-trigger",
                      "4000"], tmp_path / "count.log").start()
    assert count.wait(600) == 0, count.log_text()
    assert "were read from Spark's state into" in count.whole_log()
    assert (ckpt / "count" / "state-read-into-tallies").is_dir()
    state = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    assert not state.malformed
    _assert_exact(state, "kafka-local", topics, truth, numbers)


def _produce(bootstrap: str, records: list[tuple]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for topic, ts, value, headers in records:
        p.produce(topic, value, timestamp=ts, headers=headers)
        p.poll(0)
    assert p.flush(60) == 0


@pytest.mark.soak           # a Spark master and worker started for it: minutes; `make soak`
def test_count_job_on_a_spark_standalone_cluster_is_exact(kafka, tmp_path):
    """The count job on a real standalone cluster (a master and two workers of one core each,
    started from the venv's PySpark): the topics' six partitions are read by executors in both
    workers, and the counts are as exact as in local mode."""
    prefix, topics, audit_topic, (sent, truth, numbers) = _written(kafka, "standalone", seed=13)
    cluster = StandaloneSpark(tmp_path / "spark", workers=2).up()
    try:
        count = AuditJob(["count", "--cluster", "kafka-sa", "--bootstrap-servers",
                          kafka.bootstrap_servers, "--audit-topic", audit_topic,
                          "--topics", rf"{prefix}\.t[0-9]+", "--once",
                          "--master", cluster.url, "--checkpoint-dir", str(tmp_path / "ckpt"),
                          "--max-offsets-per-trigger", "8000"],
                         tmp_path / "count.log").start()
        assert count.wait(600) == 0, count.log_text()
        state = cluster.state() or {}
        apps = state.get("completedapps", []) + state.get("activeapps", [])
        logs = cluster.executor_logs()
    finally:
        cluster.down()
    assert [a["name"] for a in apps] == ["docket-audit-count-kafka-sa"], apps
    # One application, an executor in each worker, and each executor ran tasks.
    (executors,) = logs.values()
    assert len(executors) == 2, logs
    for stderr in executors:
        assert "Running task" in stderr.read_text(errors="replace"), stderr
    state = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    assert not state.malformed
    _assert_exact(state, "kafka-sa", topics, truth, numbers)


def test_land_dedup_lands_each_record_once_and_says_what_it_skipped(kafka, tmp_path):
    prefix, topics, audit_topic, (sent, truth, numbers) = _written(kafka, "dedup", seed=12)

    warehouse = tmp_path / "warehouse"
    land = AuditJob(["land", "--dedup", "--warehouse", str(warehouse),
                     "--bootstrap-servers", kafka.bootstrap_servers, "--audit-topic",
                     audit_topic, "--topics", rf"{prefix}\.t[0-9]+", "--once",
                     "--checkpoint-dir", str(tmp_path / "ckpt"),
                     "--max-offsets-per-trigger", "4000"], tmp_path / "land.log").start()
    assert land.wait(600) == 0, land.log_text()
    assert land.whole_log().count("file(s) landed") >= 5, land.log_text()  # several batches

    # The table, record by record: each numbered record once, every unnumbered one.
    table = pd.read_parquet(warehouse / "data")
    numbered = table[table["seq"] >= 0]
    ids = list(zip(numbered["origin"], numbered["incarnation"], numbered["seq"], strict=True))
    assert len(ids) == len(set(ids))
    want = {(h["docket-origin"].decode(), h["docket-incarnation"].decode(),
             int.from_bytes(h["docket-seq"], "big"))
            for _t, _ts, _v, hs in sent if hs for h in [dict(hs)]}
    assert set(ids) == want
    assert (table["seq"] < 0).sum() == UNNUMBERED
    values = {(t, v) for t, _ts, v, _h in sent}
    assert set(zip(table["topic"].astype(str), table["value"].map(bytes), strict=True)) == values

    state = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    assert not state.malformed
    got = {k: r for k, r in state.by_tier()["warehouse"].items() if k[0] in topics}
    assert set(got) == set(truth)
    for key, (n, distinct) in truth.items():
        r = got[key]
        if key[2] == "-":
            assert (r.count, r.distinct, r.skipped) == (n, None, None), key
        else:
            assert (r.count, r.distinct, r.duplicates, r.skipped or 0) == \
                (distinct, distinct, 0, n - distinct), (key, r)
    skipped = sum(r.skipped or 0 for r in got.values())
    assert skipped == sum(len(s) for s in TWICE.values())
    spaces = {r.origin: r for r in state.ranges.values() if r.tier == "warehouse"}
    for origin in ORIGINS:
        assert spaces[origin].missing == [list(g) for g in LEFT_OUT.get(origin, [])], origin
    print(f"land --dedup: {len(table)} rows landed for {len(sent)} sent, {skipped} copies "
          f"skipped, each (origin, seq) once")
