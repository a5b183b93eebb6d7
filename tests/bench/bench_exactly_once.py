"""What ``broker.delivery = "exactly_once"`` costs, against the at-least-once agent on the same
send path, in the same run, on the same broker.

Throughput: 2 million 100-byte lines written beforehand, shipped by ``docket-agent run`` (the
throughput configuration of bench_agent.py) once in each mode on each send path
(``BENCH_EOS_PATHS``, default ``python,native``; the native one where its extension is built),
alternately, ROUNDS times; the best run of each is kept. Figures: events/s (from the agent
answering until Kafka acknowledged — in exactly_once, committed — the last record), CPU-µs per
event and peak RSS of the whole process; the records a read_committed reader finds (must be
the lines written, each once); per path, ratio_events and ratio_cpu (exactly_once over
at_least_once; goals: on the Python path events >= 0.8, on the native one events >= 0.9 at
CPU <= 1.15). The Python path's keys are the modes' names alone (as before the native path
did transactions); the native path's begin with ``native_``.

Latency (bench_latency.py's writer, 1,000 lines/s, each line stamped with its write time): append
→ receipt by a read_committed consumer, p50/p99/p99.9, in each mode. In exactly_once a record is
visible at its transaction's commit.

Prints one JSON line. Uses ``KAFKA_BOOTSTRAP`` when set, else starts a 1-broker local cluster.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402

from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from tests.agentkit import compile_sources, native_built  # noqa: E402
from tests.bench.bench_agent import LINES, ROUNDS, agent_run, write_file  # noqa: E402
from tests.bench.bench_latency import run_agent  # noqa: E402
from tests.kafkautil import bench_kafka  # noqa: E402

MODES = ("at_least_once", "exactly_once")
PATHS = [p for p in os.environ.get("BENCH_EOS_PATHS", "python,native").split(",")
         if p != "native" or native_built()]
GOALS = {"python": {"ratio_events": 0.8}, "native": {"ratio_events": 0.9, "ratio_cpu": 1.15}}


def name(path: str, mode: str) -> str:
    return mode if path == "python" else f"{path}_{mode}"


def committed_ids(bootstrap: str, topic: str, want: int, timeout_s: float = 120) -> Counter:
    """Every id a read_committed reader finds in ``topic`` (until ``want`` records came)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"eos-{topic}",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    md = consumer.list_topics(topic, timeout=30).topics[topic]
    consumer.assign([TopicPartition(topic, p, 0) for p in md.partitions])
    ids: Counter = Counter()
    n, deadline = 0, time.monotonic() + timeout_s
    try:
        while n < want and time.monotonic() < deadline:
            for msg in consumer.consume(10_000, timeout=0.5):
                if not msg.error():
                    ids[int(msg.value()[3:12])] += 1
                    n += 1
    finally:
        consumer.close()
    return ids


def main() -> None:
    compile_sources()
    with tempfile.TemporaryDirectory(prefix="bench-eos-") as d:
        work = Path(d)
        with bench_kafka(work) as bootstrap:
            runs_of = [name(p, m) for p in PATHS for m in MODES]
            topics = {(r, k): f"bench.eos.{r}.{k}.{os.getpid()}"
                      for r in runs_of for k in range(ROUNDS)}
            ensure_topics(bootstrap, [TopicSpec(t, partitions=3) for t in topics.values()])
            data = work / "events.log"
            write_file(data)
            runs: dict[str, list] = {r: [] for r in runs_of}
            for k in range(ROUNDS):
                for path in PATHS:
                    for mode in MODES:
                        r = name(path, mode)
                        runs[r].append(agent_run(bootstrap, topics[(r, k)], work / f"{r}{k}",
                                                 data, send_path=path,
                                                 broker={"delivery": mode}))
            found = {}
            for (r, k), topic in topics.items():
                ids = committed_ids(bootstrap, topic, LINES)
                found[f"{r}.{k}"] = {"distinct": len(ids),
                                     "duplicates": sum(ids.values()) - len(ids)}
            latency = {}
            for path in PATHS:
                for mode in MODES:
                    r = name(path, mode)
                    latency.update(run_agent(bootstrap, work / f"lat-{r}", send_path=path,
                                             broker={"delivery": mode}, prefix=r))
    best = {r: max(runs[r], key=lambda x: x[0]) for r in runs_of}
    out = {"bench": "exactly_once", "lines": LINES, "rounds": ROUNDS, "paths": PATHS}
    for r in runs_of:
        events_s, cpu_us, _exec, rss = best[r]
        out |= {f"{r}_events_s": round(events_s), f"{r}_cpu_us_per_event": round(cpu_us, 2),
                f"{r}_peak_rss_mb": round(rss["VmHWM"], 1),
                f"{r}_runs_events_s": [round(x[0]) for x in runs[r]]}
    for path in PATHS:
        eos, alo = best[name(path, "exactly_once")], best[name(path, "at_least_once")]
        prefix = "" if path == "python" else f"{path}_"
        out |= {f"{prefix}ratio_events": round(eos[0] / alo[0], 3),
                f"{prefix}ratio_cpu": round(eos[1] / alo[1], 3),
                **{f"{prefix}goal_{k}": v for k, v in GOALS[path].items()}}
    out |= {"read_committed": found, **latency}
    print(json.dumps(out))
    assert all(f["distinct"] == LINES for f in found.values()), found
    assert all(f["duplicates"] == 0 for k, f in found.items() if "exactly" in k), found


if __name__ == "__main__":
    main()
