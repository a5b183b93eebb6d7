"""The send path alone: sealed slots to Kafka by the agent's drain (its Python path) and by the
native extension (``agent/native``, ``docket_native.SlotProducer``), same slots, same broker,
same client settings, same run.

Prints one JSON line. 2 million 100-byte lines are appended to a pool of 1 MiB slots and
sealed; then, from the moment the first slot is taken until the last is freed with every record
acknowledged:
- python_events_s, python_cpu_us_per_event: ``Drain.pump`` (confluent-kafka ``produce()`` per
  record, delivery reports only for failures, completion at zero points);
- native_events_s, native_cpu_us_per_event: each slot's blocks handed to ``SlotProducer.send``
  (the record loop and every delivery report in native code, the GIL released), the slot freed
  when its per-slot report says every record was acknowledged; at most 8 slots in flight, as
  the drain;
- cpu_native_vs_python and events_native_vs_python; librdkafka's version each path runs.
CPU is the whole process's (librdkafka's threads included) over the sending only. Each path
runs twice, alternately, on a pool filled afresh; the best run of each is reported. Both send
the agent's headers (origin, incarnation, each record's number). Records arriving are checked
by count on each run's topic. Uses ``KAFKA_BOOTSTRAP`` when set, else starts a 1-broker
cluster. Needs the extension built (``make native``).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from agent.buffer import BufferPool, Chunk  # noqa: E402
from agent.drain.drain import MAX_INFLIGHT_SLOTS, Drain  # noqa: E402
from agent.state.journal import LossJournal  # noqa: E402
from agent.telemetry import Metrics  # noqa: E402
from broker.admin import TopicSpec, ensure_topics  # noqa: E402
from docket_common.names import INCARNATION_HEADER, ORIGIN_HEADER  # noqa: E402
from tests.kafkautil import bench_kafka, high_watermarks  # noqa: E402

LINES = 2_000_000
LINE = 100
TS = 1_763_766_000_000
ROUNDS = 2
ORIGIN, INCARNATION = b"bench", b"1763766000000-0a1b2c3d"
TIMEOUT_S = 600


def conf(bootstrap: str) -> dict:
    """The agent's producer settings (``agent.drain.producer``) for 1 MiB slots."""
    return {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "compression.type": "snappy", "linger.ms": 2.0, "batch.size": 1 << 20,
            "queue.buffering.max.kbytes": 64 * 1024, "queue.buffering.max.messages": 500_000,
            "message.max.bytes": 1_064_536}


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fill(folder: Path, topic: str) -> BufferPool:
    """A fresh pool holding LINES lines of ``topic``, every slot sealed."""
    pool = BufferPool(folder, 512 << 20, 1 << 20, linger_ms=0, sync_on_seal=False)
    per = (1 << 20) // LINE
    for start in range(0, LINES, per):
        data = b"".join((b"id-%09d " % i).ljust(LINE - 1, b"x") + b"\n"
                        for i in range(start, min(start + per, LINES)))
        chunk = Chunk.from_lines(np.frombuffer(data, np.uint8), TS)
        assert pool.append(topic, chunk, source=1).complete(chunk)
    pool.seal_all()
    return pool


def python_path(bootstrap: str, topic: str, folder: Path) -> tuple[float, float]:
    pool = fill(folder / "pool", topic)
    metrics = Metrics()
    drain = Drain(pool, conf(bootstrap), LossJournal(folder / "journal.jsonl", metrics),
                  metrics, folder / "dead", ORIGIN, incarnation=INCARNATION)
    c0, t0 = cpu(), time.perf_counter()
    deadline = time.monotonic() + TIMEOUT_S
    while not drain.idle():
        if drain.pump() == 0:
            drain.wait(0.001)
        assert time.monotonic() < deadline, "the drain did not finish in time"
    elapsed, used = time.perf_counter() - t0, cpu() - c0
    drain.close()
    pool.close()
    return LINES / elapsed, used / LINES * 1e6


def native_path(bootstrap: str, topic: str, folder: Path) -> tuple[float, float]:
    from docket_native import SlotProducer

    pool = fill(folder / "pool", topic)
    producer = SlotProducer({k: str(v).lower() if isinstance(v, bool) else str(v)
                             for k, v in conf(bootstrap).items()})
    headers = [(ORIGIN_HEADER, ORIGIN), (INCARNATION_HEADER, INCARNATION)]
    inflight: dict[int, object] = {}
    c0, t0 = cpu(), time.perf_counter()
    deadline = time.monotonic() + TIMEOUT_S
    while inflight or pool.sealed():
        assert time.monotonic() < deadline, "the native path did not finish in time"
        while len(inflight) < MAX_INFLIGHT_SLOTS and (taken := pool.take(1)):
            slot = taken[0]
            token, index, number = slot.seq & 0xFFFFFFFF, 0, slot.meta.first_record
            payload = memoryview(slot.payload)
            for block in slot.blocks():
                n = len(block.offsets)
                numbers = np.arange(number, number + n, dtype=np.int64)
                done = 0
                while done < n:
                    done = producer.send(token, index, topic, payload,
                                         block.offsets.astype(np.int64, copy=False),
                                         block.lengths.astype(np.int64, copy=False),
                                         block.timestamps.astype(np.int64, copy=False),
                                         headers, numbers, None, done)
                    if done < n:
                        producer.poll(0.001)
                index, number = index + n, number + n
            producer.seal(token, index)
            inflight[token] = slot
        failed, done, _errors, _logs = producer.poll(0.001)
        assert not failed, failed[:3]
        for token, acked, *_ in done:
            slot = inflight.pop(token)
            assert acked == slot.record_count, (acked, slot.record_count)
            pool.free(slot)
    elapsed, used = time.perf_counter() - t0, cpu() - c0
    producer.flush(10)
    pool.close()
    return LINES / elapsed, used / LINES * 1e6


def main() -> None:
    import docket_native

    with tempfile.TemporaryDirectory(prefix="bench-native-") as d:
        work = Path(d)
        with bench_kafka(work) as bootstrap:
            topics = [f"bench.native.{os.getpid()}.{way}.{k}" for way in ("py", "native")
                      for k in range(ROUNDS)]
            ensure_topics(bootstrap, [TopicSpec(t, partitions=3) for t in topics])
            py_runs, native_runs = [], []
            for k in range(ROUNDS):
                py_runs.append(python_path(bootstrap, topics[k], work / f"py{k}"))
                native_runs.append(native_path(bootstrap, topics[ROUNDS + k],
                                               work / f"native{k}"))
            arrived = {t: sum(high_watermarks(bootstrap, t).values()) for t in topics}
    assert all(n == LINES for n in arrived.values()), arrived
    from confluent_kafka import libversion

    py_s, py_cpu = max(py_runs)
    nat_s, nat_cpu = max(native_runs)
    print(json.dumps({
        "bench": "send_path_native_vs_python", "lines": LINES, "line_bytes": LINE,
        "python_events_s": round(py_s), "python_cpu_us_per_event": round(py_cpu, 3),
        "native_events_s": round(nat_s), "native_cpu_us_per_event": round(nat_cpu, 3),
        "python_runs_events_s": [round(r[0]) for r in py_runs],
        "native_runs_events_s": [round(r[0]) for r in native_runs],
        "events_native_vs_python": round(nat_s / py_s, 3),
        "cpu_native_vs_python": round(nat_cpu / py_cpu, 3),
        "librdkafka": {"python": libversion()[0], "native": docket_native.LIBRDKAFKA_VERSION},
        "records_in_kafka_per_run": list(arrived.values()),
    }))


if __name__ == "__main__":
    main()
