"""What ``broker.delivery = "exactly_once"`` costs, against the default at-least-once agent in
the same run, on the same broker.

Throughput: 2 million 100-byte lines written beforehand, shipped by ``docket-agent run`` (the
throughput configuration of bench_agent.py) once in each mode, alternately, ROUNDS times; the
best run of each is kept. Figures: events/s (from the agent answering until Kafka
acknowledged — in exactly_once, committed — the last record), CPU-µs per event and peak RSS
of the whole process; the records a read_committed reader finds (must be the lines written,
each once); ratio_events and ratio_cpu (exactly_once over at_least_once; goal: events >= 0.8).

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
from tests.agentkit import compile_sources  # noqa: E402
from tests.bench.bench_agent import LINES, ROUNDS, agent_run, write_file  # noqa: E402
from tests.bench.bench_latency import run_agent  # noqa: E402
from tests.kafkautil import bench_kafka  # noqa: E402

MODES = ("at_least_once", "exactly_once")


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
            topics = {(m, k): f"bench.eos.{m}.{k}.{os.getpid()}"
                      for m in MODES for k in range(ROUNDS)}
            ensure_topics(bootstrap, [TopicSpec(t, partitions=3) for t in topics.values()])
            data = work / "events.log"
            write_file(data)
            runs: dict[str, list] = {m: [] for m in MODES}
            for k in range(ROUNDS):
                for mode in MODES:
                    runs[mode].append(agent_run(bootstrap, topics[(mode, k)],
                                                work / f"{mode}{k}", data,
                                                broker={"delivery": mode}))
            found = {}
            for (mode, k), topic in topics.items():
                ids = committed_ids(bootstrap, topic, LINES)
                found[f"{mode}.{k}"] = {"distinct": len(ids),
                                        "duplicates": sum(ids.values()) - len(ids)}
            latency = {}
            for mode in MODES:
                latency.update(run_agent(bootstrap, work / f"lat-{mode}",
                                         broker={"delivery": mode}, prefix=mode))
    best = {m: max(runs[m], key=lambda r: r[0]) for m in MODES}
    out = {"bench": "exactly_once", "lines": LINES, "rounds": ROUNDS}
    for mode in MODES:
        events_s, cpu_us, _exec, rss = best[mode]
        out |= {f"{mode}_events_s": round(events_s), f"{mode}_cpu_us_per_event": round(cpu_us, 2),
                f"{mode}_peak_rss_mb": round(rss["VmHWM"], 1),
                f"{mode}_runs_events_s": [round(r[0]) for r in runs[mode]]}
    out |= {"ratio_events": round(best["exactly_once"][0] / best["at_least_once"][0], 3),
            "ratio_cpu": round(best["exactly_once"][1] / best["at_least_once"][1], 3),
            "goal_ratio_events": 0.8, "read_committed": found, **latency}
    print(json.dumps(out))
    assert all(f["distinct"] == LINES for f in found.values()), found
    assert all(f["duplicates"] == 0 for k, f in found.items() if k.startswith("exactly")), found


if __name__ == "__main__":
    main()
