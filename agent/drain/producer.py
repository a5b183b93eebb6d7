"""The confluent-kafka producer configuration the agent runs with.

acks=all and idempotence always; compression from ``broker.compression``; a short linger (the
pool's ``linger_ms`` is the batching wait); the batch size from the slot size, capped at
``BATCH_MAX_BYTES``; librdkafka's own queue kept small (the pool is the buffer, not
librdkafka's memory); the security settings (``broker.security_protocol`` …, the password
read from its file now: a reload reads it again); ``broker.librdkafka_options`` last, so an
operator can override any of it.
"""

from __future__ import annotations

from ..config import AgentConfig

# The largest record value the drain sends; the pool splits or truncates longer lines to this.
# Kafka's default max.message.bytes is 1048588 for the whole batch, headers and framing included.
MAX_RECORD_BYTES = 1_000_000
# The broker refuses a whole batch over the topic's max.message.bytes (measured with librdkafka
# 2.16: every record of it comes back MSG_SIZE_TOO_LARGE); librdkafka keeps a batch within
# batch.size but for a single record larger than it, which goes alone. So batches stay within
# Kafka's default limit whatever the slot size; a topic with a lower limit needs batch.size
# lowered to it through broker.librdkafka_options (else its records go one by one).
BATCH_MAX_BYTES = 1 << 20
# The pool already waits ``buffer.linger_ms`` before it seals a slot: a slot is the batch. A
# second 5 ms linger in librdkafka delayed each sealed slot again. Measured here
# (tests/bench/bench_latency.py, 1,000 lines/s, linger_ms = 5; bench_agent.py, 2 M lines):
# linger.ms 5: append → consumer p50 12.7 ms, p99 23.3 ms; 354 k events/s at 3.44 CPU-µs each;
# 0.5: p50 8.7, p99 16.1; 323–328 k events/s at 3.6–3.7 µs (more, smaller requests);
# 2: p50 9.4, p99 14.4; 356 k events/s at 3.40 µs. Batches still fill while a request is in
# flight, so the throughput does not need the longer wait.
PRODUCER_LINGER_MS = 2.0
# The native send path hands librdkafka a sealed slot's records in one native loop, so a batch
# is there at once; its wait is pure delay at low rates. Measured with it (2026-11-27,
# docs/performance.md, alternating with 2 ms): 1,000 lines/s, p50 4.03-4.17 ms against
# 4.37-4.96, p99 10.2-12.5 against 10.5-15.0 (three rounds each); 1,000,000 lines as fast as
# they go, median 3.05 CPU-µs per event at 334 k events/s against 3.15 at 321 k (six each).
NATIVE_LINGER_MS = 1.0

# How long a request may go unanswered (librdkafka's ``socket.timeout.ms``, default 60 s). A
# broker cut off by the network without a reset (a partition, a host gone) keeps its TCP
# connection up; the ProduceRequest in flight to it then holds its partitions — the idempotent
# producer cannot move them to their new leader — until the request times out. Measured in
# the fleet test (tests/faults/test_fleet.py, one of three brokers partitioned away 60 s): with
# the default, agents had nothing acknowledged for the whole 60 s while the other two brokers
# led every partition. After one timed-out request librdkafka closes the connection
# (``socket.max.fails`` = 1) and finds the new leader; the records go again under the same
# producer id and sequence numbers, so the broker keeps one copy.
SOCKET_TIMEOUT_MS = 10_000
# Then connections are closed during an outage, and the way back is a new connection: a connect
# waits for its SYN to be answered up to ``socket.connection.setup.timeout.ms`` (librdkafka:
# 30 s; the Java client: 10 s), and failed connects back off up to ``reconnect.backoff.max.ms``
# (librdkafka: 10 s; Java: 1 s). With librdkafka's, the fleet's catch-up after every broker
# came back at once took 12.6 s, against 6.6–6.8 s before the shorter request timeout.
CONNECT_TIMEOUT_MS = 10_000
RECONNECT_BACKOFF_MAX_MS = 2_000


def producer_config(cfg: AgentConfig, send_path: str) -> dict:
    """librdkafka's settings for the agent's producers; ``send_path``: the path the agent runs
    (``native.choose_send_path``), whose linger differs."""
    conf = {
        "bootstrap.servers": cfg["broker.bootstrap_servers"],
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": cfg["broker.compression"],
        "linger.ms": NATIVE_LINGER_MS if send_path == "native" else PRODUCER_LINGER_MS,
        "batch.size": min(cfg["buffer.slot_size_bytes"], BATCH_MAX_BYTES),
        "queue.buffering.max.kbytes": 64 * 1024,
        "queue.buffering.max.messages": 500_000,
        "message.max.bytes": MAX_RECORD_BYTES + 64 * 1024,
        "client.id": f"docket-agent-{cfg.agent_id}",
        "socket.timeout.ms": SOCKET_TIMEOUT_MS,
        "socket.connection.setup.timeout.ms": CONNECT_TIMEOUT_MS,
        "reconnect.backoff.max.ms": RECONNECT_BACKOFF_MAX_MS,
    }
    conf.update(cfg.security.librdkafka_properties())
    conf.update(cfg["broker.librdkafka_options"])
    return conf
