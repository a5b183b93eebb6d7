"""Latency: how long a line waits between its append to a file and a consumer's receipt.

A writer appends 1,000 lines a second (each written alone, stamped with its write time in ns);
``docket-agent run`` (``linger_ms = 5``, defaults otherwise) tails the file to a 1-partition
topic; a consumer (``fetch.wait.max.ms = 1``) stamps each record's receipt. Same machine, same
clock. Prints one JSON line:

- agent_p50_ms, agent_p99_ms, agent_p999_ms, agent_max_ms: append → receipt through the agent,
  over SECONDS of steady writing after WARMUP_S;
- direct_p50_ms … : the baseline, in the same run against the same broker and consumer: the
  writer's process producing each line itself with confluent-kafka (``linger.ms = 5``,
  acks=all, idempotence) — Kafka's own share of the latency, with no file in between;
- agent_lost, direct_lost: lines sent and never received (must be 0);
- agent_tail_…: the lines at or above the p99.9, how many, where their time went (median of
  write → the record's timestamp, which the agent sets when it hands the line to its pool —
  whole milliseconds, so up to 1 ms low — and of the timestamp → receipt) and the seconds
  after the warm-up they were written in; for ``direct`` the timestamp is the produce call's;
- targets: agent p50 <= 10 ms, p99 <= 50 ms (issue 16).

Uses ``KAFKA_BOOTSTRAP`` when set, else starts a 1-broker local cluster for the run.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from tests.agentkit import (  # noqa: E402
    AgentProcess,
    compile_sources,
    native_built,
    write_config,
)
from tests.kafkautil import bench_kafka  # noqa: E402

RATE = 1000                 # lines per second
SECONDS = 20
WARMUP_S = 2
LINE = 100
NAGLE_OFF = os.environ.get("BENCH_NAGLE_OFF", "1") == "1"
RUN = uuid.uuid4().hex[:8]      # in topic names: a cluster of $KAFKA_BOOTSTRAP keeps earlier runs'


def _line(i: int) -> bytes:
    return (b"id-%09d t=%019d " % (i, time.time_ns())).ljust(LINE - 1, b"x") + b"\n"


class Receiver(threading.Thread):
    """Reads the topic from the start; per id, the receipt time minus the stamped write time."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lat-{topic}",
                                  "enable.auto.commit": False, "fetch.wait.max.ms": 1,
                                  "fetch.min.bytes": 1, "socket.nagle.disable": True,
                                  "isolation.level": "read_committed"})
        self.consumer.assign([TopicPartition(topic, 0, 0)])
        self.latency_ms: dict[int, float] = {}
        # Per id: write → the record's timestamp (the shipper's: docket stamps the read), ms.
        self.before_stamp_ms: dict[int, float] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        # poll(), not consume(n): consume waits for n records or its whole timeout.
        while not self.stop.is_set():
            msg = self.consumer.poll(0.05)
            now = time.time_ns()
            if msg is None or msg.error():
                continue
            value = msg.value()
            i, stamp = int(value[3:12]), int(value[15:34])
            self.latency_ms.setdefault(i, (now - stamp) / 1e6)
            self.before_stamp_ms.setdefault(i, msg.timestamp()[1] - stamp / 1e6)
        self.consumer.close()


def _paced(send) -> int:
    """Call ``send(i)`` RATE times a second for WARMUP_S + SECONDS; returns how many."""
    total = RATE * (WARMUP_S + SECONDS)
    start = time.monotonic()
    for i in range(total):
        due = start + i / RATE
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        send(i)
    return total


def _figures(prefix: str, recv: Receiver, total: int, stamped_at_read: bool = True) -> dict:
    steady = sorted(v for i, v in recv.latency_ms.items() if i >= WARMUP_S * RATE)

    def q(p: float) -> float:
        return round(steady[min(len(steady) - 1, int(p * len(steady)))], 2)

    return {f"{prefix}_p50_ms": q(0.5), f"{prefix}_p99_ms": q(0.99),
            f"{prefix}_p999_ms": q(0.999), f"{prefix}_max_ms": round(steady[-1], 2),
            f"{prefix}_lost": total - len(recv.latency_ms),
            **_tail(prefix, recv, q(0.999), stamped_at_read)}


def _tail(prefix: str, recv: Receiver, bound_ms: float, split: bool) -> dict:
    """Where the slowest lines (at or above ``bound_ms``, the p99.9) spent their time: the
    median of write → the record's timestamp (the shipper reading and stamping it) and of the
    timestamp → receipt (sealing, the client, the broker, the consumer); and the seconds
    after the warm-up they were written in, to tell one stall from a steady share."""
    slow = [i for i, v in recv.latency_ms.items()
            if i >= WARMUP_S * RATE and v >= bound_ms and i in recv.before_stamp_ms]
    if not slow:
        return {}
    out = {f"{prefix}_tail_lines": len(slow),
           f"{prefix}_tail_seconds": sorted({(i - WARMUP_S * RATE) // RATE for i in slow})}
    if split:
        before = sorted(recv.before_stamp_ms[i] for i in slow)
        after = sorted(recv.latency_ms[i] - recv.before_stamp_ms[i] for i in slow)
        out[f"{prefix}_tail_write_to_stamp_ms"] = round(before[len(before) // 2], 2)
        out[f"{prefix}_tail_stamp_to_receipt_ms"] = round(after[len(after) // 2], 2)
    return out


def _drain(recv: Receiver, total: int) -> None:
    deadline = time.monotonic() + 30
    while len(recv.latency_ms) < total and time.monotonic() < deadline:
        time.sleep(0.1)
    recv.stop.set()
    recv.join(10)


def run_agent(bootstrap: str, work: Path, send_path: str = "python",
              broker: dict | None = None, prefix: str | None = None) -> dict:
    """The agent tailing a file at RATE lines/s; its figures named ``agent`` (the Python send
    path) or ``agent_native``, or ``prefix``; ``broker``: further ``[broker]`` settings."""
    prefix = prefix or ("agent" if send_path == "python" else f"agent_{send_path}")
    topic = f"lat.{prefix}.{RUN}"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=1)])
    logs = work / "logs"
    logs.mkdir(parents=True)
    app = logs / "app.log"
    app.touch()
    config = write_config(work / "agent.toml", bootstrap, work / "state",
                          [{"type": "file", "paths": [str(logs / "*.log")], "topic": topic}],
                          buffer={"linger_ms": 5, "size_bytes": 256 << 20},
                          broker={"send_path": send_path, **(broker or {})})
    agent = AgentProcess(config, work / "agent.log").start()
    try:
        return tail_latency(bootstrap, topic, app, prefix, settle_s=1)
    finally:
        agent.stop()


def tail_latency(bootstrap: str, topic: str, app: Path, prefix: str, settle_s: float,
                 stamped_at_read: bool = True) -> dict:
    """With a shipper tailing ``app`` to ``topic``: the paced writer and the receiver, after
    ``settle_s`` for the shipper to start watching; the figures named ``prefix``_….
    ``stamped_at_read``: the shipper sets each record's timestamp when it reads the line
    (docket), so the slowest lines' time can be split there; rsyslog's omkafka stamps its
    message's time, whole seconds, which splits nothing."""
    recv = Receiver(bootstrap, topic)
    recv.start()
    fd = os.open(app, os.O_WRONLY | os.O_APPEND)
    try:
        time.sleep(settle_s)
        total = _paced(lambda i: os.write(fd, _line(i)))
        _drain(recv, total)
    finally:
        os.close(fd)
    return _figures(prefix, recv, total, stamped_at_read)


def run_direct(bootstrap: str) -> dict:
    topic = f"lat.direct.{RUN}"
    ensure_topics(bootstrap, [TopicSpec(topic, partitions=1)])
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 5,
                         "compression.type": "snappy", "socket.nagle.disable": NAGLE_OFF})
    recv = Receiver(bootstrap, topic)
    recv.start()
    time.sleep(1)

    def send(i: int) -> None:
        producer.produce(topic, _line(i)[:-1])
        producer.poll(0)

    total = _paced(send)
    producer.flush(30)
    _drain(recv, total)
    return _figures("direct", recv, total)


def main() -> None:
    compile_sources()
    with tempfile.TemporaryDirectory(prefix="docket-bench-latency-") as tmp:
        work = Path(tmp)
        with bench_kafka(work) as bootstrap:
            out = {"bench": "latency", "rate_lines_s": RATE, "seconds": SECONDS,
                   "linger_ms": 5}
            out.update(run_direct(bootstrap))
            agent_work = work / "agent"
            agent_work.mkdir()
            out.update(run_agent(bootstrap, agent_work))
            if native_built():
                out.update(run_agent(bootstrap, work / "agent-native", "native"))
            out["target_p50_ms"], out["target_p99_ms"] = 10, 50
            print(json.dumps(out))


if __name__ == "__main__":
    main()
