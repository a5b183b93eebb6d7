"""What record identity costs the cluster count job, and what its state holds.

Prints one JSON line. In one run, on one local broker, 2 million numbered records (three origins,
ten 10-minute windows, ``docket-seq`` per origin with 20 numbers left out and 1% sent twice) are
written straight to Kafka in two halves:
- the count job (``docket-audit count --once``, micro-batches of 250,000) reads the first half,
  then, started again on the same checkpoint, the second: its state (per origin: window tallies
  and the number intervals seen) is logged after every batch — state_after_1m and
  state_after_2m show it does not grow with the records, only with windows and gaps;
- job_identity_records_s: the median processedRowsPerSecond of the batches after each run's
  first (JIT warm-up), with identity; job_plain_records_s: the same over all 2 million with
  ``--no-identity`` (plain SQL counts), in the same run; ratio = identity / plain;
- the figures are checked: the job must report exactly the distinct records, the duplicates and
  the 20 missing numbers written.
Uses ``KAFKA_BOOTSTRAP`` when set, else starts a 1-broker local cluster for the run.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import Producer  # noqa: E402

from audit.contract.collect import read_audit_topic  # noqa: E402
from broker.admin import TopicSpec, ensure_audit_topic, ensure_topics  # noqa: E402
from tests.auditkit import AuditJob  # noqa: E402
from tests.kafkautil import bench_kafka  # noqa: E402

RECORDS = 2_000_000
ORIGINS = ["o1", "o2", "o3"]
WINDOWS = 10
WINDOW_MS = 600_000
BATCH = 250_000


def produce_half(bootstrap: str, topic: str, rng: random.Random, numbers: dict,
                 truth: dict) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1 << 20,
                  "compression.type": "snappy", "queue.buffering.max.messages": 1_000_000})
    w0 = (int(time.time() * 1000) // WINDOW_MS - WINDOWS - 1) * WINDOW_MS
    n = RECORDS // 2
    value = b"x" * 100
    for i in range(n):
        origin = ORIGINS[i % 3]
        seq = numbers[origin]
        numbers[origin] += 1
        if seq % 50_000 == 777:                      # left out: a gap
            truth["missing"].append((origin, seq))
            continue
        ts = w0 + i * (WINDOWS * WINDOW_MS) // n      # each half over the same ten windows
        headers = [("docket-origin", origin.encode()), ("docket-incarnation", b"bench"),
                   ("docket-seq", seq.to_bytes(8, "big"))]
        copies = 2 if rng.random() < 0.01 else 1
        for _ in range(copies):
            while True:
                try:
                    p.produce(topic, value, timestamp=ts, headers=headers)
                    break
                except BufferError:
                    p.poll(0.05)
        truth["records"] += copies
        truth["duplicates"] += copies - 1
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(120) == 0


def run_job(bootstrap: str, topic: str, audit_topic: str, ckpt: Path, log: Path,
            *extra: str) -> tuple[list[dict], list[dict]]:
    job = AuditJob(["count", "--cluster", "bench", "--bootstrap-servers", bootstrap,
                    "--audit-topic", audit_topic, "--topics", topic.replace(".", r"\."),
                    "--once", "--max-offsets-per-trigger", str(BATCH),
                    "--checkpoint-dir", str(ckpt), *extra], log).start()
    assert job.wait(1200) == 0, job.log_text()
    lines = log.read_text().splitlines()
    progress = [json.loads(x.split(" progress ", 1)[1]) for x in lines
                if "docket.audit: progress {" in x]
    states = [json.loads(x.split(": ", 2)[2]) for x in lines if "tallies after batch" in x]
    return [p for p in progress if p["num_input_rows"]], states


def median_warm(batches: list[dict]) -> float:
    rates = sorted(b["processed_rows_per_s"] for b in batches[1:]) or \
        [b["processed_rows_per_s"] for b in batches]
    return rates[len(rates) // 2]


def main() -> None:
    rng = random.Random(5)
    numbers = dict.fromkeys(ORIGINS, 0)
    truth = {"records": 0, "duplicates": 0, "missing": []}
    with tempfile.TemporaryDirectory(prefix="bench-identity-") as d:
        work = Path(d)
        with bench_kafka(work) as bootstrap:
            topic = f"bench.ident.{os.getpid()}"
            audit_topic, plain_topic = f"{topic}.counts", f"{topic}.plain"
            ensure_topics(bootstrap, [TopicSpec(topic, partitions=3)])
            for t in (audit_topic, plain_topic):
                ensure_audit_topic(bootstrap, t)
            runs = []
            for half in (0, 1):
                produce_half(bootstrap, topic, rng, numbers, truth)
                runs.append(run_job(bootstrap, topic, audit_topic, work / "ckpt",
                                    work / f"job-{half}.log"))
            plain, _ = run_job(bootstrap, topic, plain_topic, work / "ckpt-plain",
                               work / "job-plain.log", "--no-identity")
            state = read_audit_topic(bootstrap, audit_topic)
    counts = [r for r in state.counts.values() if r.tier == "bench"]
    ranges = [r for r in state.ranges.values() if r.tier == "bench"]
    got = {"records": sum(r.count for r in counts),
           "duplicates": sum(r.duplicates for r in counts),
           "missing": sorted((r.origin, n) for r in ranges for a, b in r.missing
                             for n in range(a, b + 1))}
    assert got == {**truth, "missing": sorted(truth["missing"])}, (got, truth)
    identity_batches = runs[0][0][1:] + runs[1][0][1:]
    ident_s = median_warm([runs[0][0][0]] + identity_batches)
    plain_s = median_warm(plain)
    print(json.dumps({
        "bench": "audit_identity_state_and_cost",
        "records": truth["records"], "origins": len(ORIGINS), "windows": WINDOWS,
        "duplicates": truth["duplicates"], "missing_numbers": len(truth["missing"]),
        "state_after_1m": runs[0][1][-1], "state_after_2m": runs[1][1][-1],
        "job_identity_records_s": round(ident_s), "job_plain_records_s": round(plain_s),
        "ratio_identity_vs_plain": round(ident_s / plain_s, 3),
        "job_identity_batches": len(runs[0][0]) + len(runs[1][0]),
        "job_plain_batches": len(plain),
    }))


if __name__ == "__main__":
    main()
