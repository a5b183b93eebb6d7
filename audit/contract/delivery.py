"""Write a handful of audit records to Kafka and learn which ones it acknowledged.

Shared by the agent's emitter and the Spark jobs' writer. Light: confluent-kafka only, which
every docket host has. A record without a report in time counts as not acknowledged (audit
records are cumulative: sending one again is harmless). When reports are missing the producer's
queue is purged, so an idempotent producer does not spin on it while the cluster is away.
"""

from __future__ import annotations

from confluent_kafka import KafkaException, Producer


def deliver(producer: Producer, topic: str, records: list[tuple[bytes, bytes]],
            timeout_s: float, settle_s: float = 0.0,
            timestamp_ms: int = 0) -> tuple[set[int], list[str]]:
    """Produce every (key, value) of ``records`` and wait up to ``timeout_s``. Returns the
    indices Kafka acknowledged and the errors reported. After a purge, ``settle_s`` more for
    requests already in flight. ``timestamp_ms`` 0: the time of sending."""
    acked: set[int] = set()
    errors: list[str] = []

    def report(i: int):
        def on_delivery(err, _msg):
            if err is None:
                acked.add(i)
            else:
                errors.append(err.str())
        return on_delivery

    for i, (key, value) in enumerate(records):
        while True:
            try:
                producer.produce(topic, value, key, on_delivery=report(i), timestamp=timestamp_ms)
                break
            except BufferError:                 # the local queue is full: serve reports
                producer.poll(0.1)
            except KafkaException as exc:
                errors.append(str(exc))
                break
    if producer.flush(timeout_s):
        producer.purge(in_queue=True, in_flight=False)
        producer.flush(settle_s)
    return acked, errors
