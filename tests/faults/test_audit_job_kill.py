"""The audit jobs SIGKILLed mid-stream (driver and JVM at once) and started again on the same
checkpoint: the final counts are exact, nothing lost, nothing counted twice — and so are the
record-identity figures (distinct, duplicates, missing ranges) of a numbered stream with a
known gap and known records sent twice. ``land --dedup`` killed the same way still lands each
(origin, seq) exactly once, read back from its Parquet."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter

import pandas as pd
import pytest
from confluent_kafka import Producer

from audit.contract.collect import read_audit_topic
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics
from tests.auditkit import (
    WINDOW_MS,
    AuditJob,
    known_stream,
    tier_counts,
    truth,
    wait_for_tier,
)

pytestmark = pytest.mark.slow

RECORDS = 90_000
RATE = 3_000                  # records/s: the stream lasts ~30 s, the jobs start inside it
ORIGINS = ["host-1", "host-2", "host-3"]
GAP = ("host-1", 500, 1499)           # numbers given but never sent: a loss
TWICE = ("host-2", 97)                # every 97th number of host-2 is sent twice


def _in_order(stream: dict) -> list[tuple[str, str, bytes]]:
    todo = [(o, t, line) for (o, t), lines in stream.items() for line in lines]
    todo.sort(key=lambda x: json.loads(x[2])["id"].split("-")[-1].zfill(9))
    return todo


def _numbered(stream: dict) -> tuple[dict, dict, Counter]:
    """Number each origin's lines in sending order; leave out the GAP's numbers and send the
    TWICE ones twice. Returns the stream as sent, line → number, numbers given per origin."""
    numbers: dict[bytes, int] = {}
    given: Counter = Counter()
    sent: dict = {k: [] for k in stream}
    for origin, topic, line in _in_order(stream):
        n = given[origin]
        given[origin] += 1
        if origin == GAP[0] and GAP[1] <= n <= GAP[2]:
            continue
        numbers[line] = n
        sent[(origin, topic)].append(line)
        if origin == TWICE[0] and n % TWICE[1] == 0:
            sent[(origin, topic)].append(line)
    return sent, numbers, given


def _produce(bootstrap: str, stream: dict, numbers: dict, failures: list) -> None:
    """Interleave the origins' lines at RATE, each with its identity headers and event time."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "linger.ms": 5})
    todo = _in_order(stream)
    start = time.monotonic()
    for i, (origin, topic, line) in enumerate(todo):
        p.produce(topic, line, timestamp=json.loads(line)["ts"],
                  headers=[("docket-origin", origin.encode()),
                           ("docket-incarnation", b"inc-" + origin.encode()),
                           ("docket-seq", numbers[line].to_bytes(8, "big"))],
                  on_delivery=lambda err, _m: err and failures.append(err))
        if i % 500 == 0:
            p.poll(0)
            ahead = i / RATE - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
    if p.flush(60):
        failures.append("not all records acknowledged")


def _progress_batch(folder) -> int:
    try:
        return json.loads((folder / "progress.json").read_text())["batch_id"]
    except (OSError, ValueError, KeyError):
        return -1


# The count job in CI; the land job, with and without dedup, under `make soak` (the same kill
# and restart on a job of the same checkpointing, 2–4 minutes each).
@pytest.mark.parametrize("job", ["count", pytest.param("land", marks=pytest.mark.soak),
                                 pytest.param("land-dedup", marks=pytest.mark.soak)])
def test_job_killed_mid_stream_and_restarted_counts_exactly(kafka, tmp_path, job):
    prefix = f"kill{uuid.uuid4().hex[:6]}"
    topics = [f"{prefix}.t{i}" for i in range(3)]
    audit_topic = f"{prefix}.audit"
    ensure_topics(kafka.bootstrap_servers, [TopicSpec(t, partitions=3) for t in topics])
    ensure_audit_topic(kafka.bootstrap_servers, audit_topic)
    stream, numbers, given = _numbered(known_stream(RECORDS, topics, ORIGINS, windows=4, seed=11))
    dedup = job == "land-dedup"
    # --dedup lands each record once: the tier counts the stream without its copies
    expected = truth({k: list(dict.fromkeys(v)) for k, v in stream.items()} if dedup
                     else stream)
    tier = "kafka-local" if job == "count" else "warehouse"
    ckpt = tmp_path / "ckpt"
    args = ([job.split("-")[0]] + (["--cluster", "kafka-local"] if job == "count" else
                                   ["--warehouse", str(tmp_path / "warehouse")])
            + (["--dedup"] if dedup else [])
            + ["--bootstrap-servers", kafka.bootstrap_servers, "--audit-topic", audit_topic,
               "--topics", rf"{prefix}\.t[0-9]+", "--trigger-s", "1",
               "--max-offsets-per-trigger", "4000", "--checkpoint-dir", str(ckpt)])
    progress_dir = ckpt       # count: its query; land: the query counting what landed

    failures: list = []
    writer = threading.Thread(target=_produce, args=(kafka.bootstrap_servers, stream, numbers,
                                                     failures))
    writer.start()
    first = AuditJob(args, tmp_path / "job-1.log").start()
    deadline = time.monotonic() + 240
    while _progress_batch(progress_dir) < 2:
        assert first.proc.poll() is None, first.log_text()
        assert time.monotonic() < deadline, first.log_text()
        time.sleep(0.2)
    killed_at = _progress_batch(progress_dir)
    still_writing = writer.is_alive()
    first.kill()
    partial = tier_counts(read_audit_topic(kafka.bootstrap_servers, audit_topic), tier,
                          set(topics))
    print(f"\n{job}: SIGKILLed after batch {killed_at}, writer still writing: {still_writing}, "
          f"{sum(c for c, _b, _h in partial.values())} of {RECORDS} records reported so far")

    second = AuditJob(args, tmp_path / "job-2.log").start()
    writer.join(timeout=120)
    assert not writer.is_alive() and not failures, failures[:3]
    try:
        got = wait_for_tier(kafka.bootstrap_servers, audit_topic, tier, expected, 300, second)
    finally:
        assert second.stop() in (0, -9), second.log_text()
    wrong = {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v}
    print(f"{job}: after the restart {sum(c for c, _b, _h in got.values())} records in "
          f"{len(got)} groups; {len(wrong)} groups differ from the stream")
    assert got == expected, list(wrong.items())[:5]

    # Identity: per group distinct and duplicates, per origin the missing ranges, exact.
    distinct: Counter = Counter()
    for (origin, topic), lines in stream.items():
        for line in set(lines):
            ts = json.loads(line)["ts"]
            distinct[(topic, ts // WINDOW_MS * WINDOW_MS, origin)] += 1
    state = read_audit_topic(kafka.bootstrap_servers, audit_topic)
    records = {k: r for k, r in state.by_tier()[tier].items() if k[0] in topics}
    off = {k: (r.distinct, r.duplicates) for k, r in records.items()
           if (r.distinct, r.duplicates) != (distinct[k], r.count - distinct[k])}
    assert not off, list(off.items())[:5]
    sent_twice = sum(len(v) - len(set(v)) for v in stream.values())
    duplicates = sum(r.duplicates for r in records.values())
    if dedup:
        skipped = sum(r.skipped or 0 for r in records.values())
        assert (duplicates, skipped) == (0, sent_twice), (duplicates, skipped)
        # The table itself, record by record: each (origin, seq) exactly once.
        table = pd.read_parquet(tmp_path / "warehouse" / "data", columns=["origin", "seq"])
        ids = list(zip(table["origin"], table["seq"], strict=True))
        assert len(ids) == len(set(ids)) == sum(len(set(v)) for v in stream.values())
        assert set(ids) == {(o, numbers[line]) for (o, _t), v in stream.items() for line in v}
        duplicates = skipped
    else:
        assert duplicates == sent_twice > 0
    spaces = {r.origin: r for r in state.ranges.values() if r.tier == tier}
    for origin in ORIGINS:
        want = [[GAP[1], GAP[2]]] if origin == GAP[0] else []
        assert (spaces[origin].through, spaces[origin].missing) == (given[origin] - 1, want)
    print(f"{job}: {duplicates} {'copies skipped' if dedup else 'duplicates'}, missing "
          f"{spaces[GAP[0]].missing} — exact")
