"""Every Kafka result, reduced to one of three outcomes, in one place.

- OK: acknowledged by the cluster (acks=all).
- RETRY: the record is sent again; the data stays in its slot meanwhile, without limit.
- ALONE: the batch the record travelled in was refused as too large. The broker checks
  ``max.message.bytes`` against a whole batch, so this says nothing about the record: it is
  sent again alone (one record per batch), and only a too-large answer then is DEAD.
- DENIED: the client is not authorised to write the topic (an ACL missing) or not
  authenticated. Nothing is wrong with the record: it waits in its slot, the drain names the
  cause (status, one log line) and sends the topic's records again every ``DENIED_RETRY_S``,
  so delivery resumes by itself once the ACL is granted (or the credential fixed and the
  agent reloaded). docs/security.md.
- DEAD: the cluster will never take this record (too large, invalid): it goes to the
  dead-letter file with the error and is counted as dropped with that reason.
"""

from __future__ import annotations

import enum

from confluent_kafka import KafkaError


class Outcome(enum.Enum):
    OK = "ok"
    RETRY = "retry"
    ALONE = "alone"
    DENIED = "denied"
    DEAD = "dead"

# Answers about a whole batch when they come in a delivery report of a batching producer.
_TOO_LARGE_CODES = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE}


_DEAD_CODES = {
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE, KafkaError.INVALID_RECORD,
    KafkaError.RECORD_LIST_TOO_LARGE, KafkaError.TOPIC_EXCEPTION,
    KafkaError.POLICY_VIOLATION, KafkaError._INVALID_ARG,
    KafkaError.UNSUPPORTED_FOR_MESSAGE_FORMAT, KafkaError.INVALID_REQUIRED_ACKS,
}


_DENIED_CODES = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._AUTHENTICATION,
}


def classify(err: KafkaError | None, alone: bool = False) -> Outcome:
    """``alone``: the answer is about this record only (it was the only record of its batch,
    or ``produce()`` refused it), not about a batch it travelled in."""
    if err is None:
        return Outcome.OK
    code = err.code()
    if code in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
        return Outcome.RETRY          # our own outage guard emptied librdkafka's queue
    if code in _TOO_LARGE_CODES and not alone:
        return Outcome.ALONE
    if code in _DENIED_CODES:
        return Outcome.DENIED
    if code in _DEAD_CODES:
        return Outcome.DEAD
    # Everything else — timeouts, transport, leadership changes, not enough replicas, unknown
    # topic (it may be created), a fatal idempotence error (the producer is rebuilt) — retries.
    return Outcome.RETRY


def reason(err: KafkaError) -> str:
    """The dropped-event reason for a DEAD outcome, e.g. ``kafka_msg_size_too_large``."""
    return "kafka_" + err.name().lstrip("_").lower()
