"""Every Kafka result, reduced to one of three outcomes, in one place.

- OK: acknowledged by the cluster (acks=all).
- RETRY: the record is sent again; the data stays in its slot meanwhile, without limit.
- DEAD: the cluster will never take this record (too large, invalid, not authorised): it goes to
  the dead-letter file with the error and is counted as dropped with that reason.
"""

from __future__ import annotations

import enum

from confluent_kafka import KafkaError


class Outcome(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    DEAD = "dead"


_DEAD_CODES = {
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.INVALID_RECORD,
    KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError.TOPIC_EXCEPTION,
    KafkaError.POLICY_VIOLATION, KafkaError._INVALID_ARG,
    KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT, KafkaError.INVALID_REQUIRED_ACKS,
}


def classify(err: KafkaError | None) -> Outcome:
    if err is None:
        return Outcome.OK
    code = err.code()
    if code in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
        return Outcome.RETRY          # our own outage guard emptied librdkafka's queue
    if code in _DEAD_CODES:
        return Outcome.DEAD
    # Everything else — timeouts, transport, leadership changes, not enough replicas, unknown
    # topic (it may be created), a fatal idempotence error (the producer is rebuilt) — retries.
    return Outcome.RETRY


def reason(err: KafkaError) -> str:
    """The dropped-event reason for a DEAD outcome, e.g. ``kafka_msg_size_too_large``."""
    return "kafka_" + err.name().lstrip("_").lower()
