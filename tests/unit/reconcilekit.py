"""Helpers of the reconciler's unit tests: audit records as the agents and the count jobs
write them, about one 10-minute window (``T0``) and one origin by default, and a config with
the tier graph producer → kafka-local and one webhook channel."""

from __future__ import annotations

import json

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from audit.contract.record import AuditRecord, CaughtUp, Progress
from audit.reconcile.config import parse

W = 600_000
T0 = 1_763_766_000_000
END = T0 + W
JUDGED = END + 1_800_000 + 1          # past the default grace
MIN = 60_000


def cfg(tiers: dict | None = None, **alerts):
    """``tiers``: the ``[tiers.NAME]`` tables (the tier graph), none by default."""
    alerts = {"silent_ms": 6 * 3_600_000, **alerts}      # the tests send no heartbeats
    return parse({"channels": {"ops": {"type": "webhook", "url": "http://127.0.0.1:9/x"}},
                  "alerts": {"default_channels": ["ops"], **alerts},
                  "windows": {"tiers": ["producer", "kafka-local"]}, "tiers": tiers or {}})


def count(tier, n, origin="web-1", *, distinct=None, seq=1, at=END + MIN, checksum=5,
          window=T0, topic="app", **kw):
    distinct = n if distinct is None else distinct
    return AuditRecord(tier=tier, origin=origin, topic=topic, window_start=window, window_ms=W,
                       count=n, bytes=n, checksum=checksum,
                       emitter=f"{origin}/agent" if tier == "producer" else f"{tier}/count",
                       seq=seq, emitted_at=at, distinct=distinct, duplicates=n - distinct,
                       incarnation="i", **kw)


def lossy_window(window, at):
    """One window of topic ``app``: web-1 complete (1,000), web-2 short by 100 at kafka-local
    (500 sent, 400 counted)."""
    return [count("producer", 1000, "web-1", window=window, at=at),
            count("producer", 500, "web-2", window=window, at=at),
            count("kafka-local", 1000, "web-1", window=window, at=at),
            count("kafka-local", 400, "web-2", window=window, at=at)]


def caught_up(origin="web-1", seq=1, delivered=None, tier="kafka-local"):
    """``tier``'s job has read past ``origin``'s audit records up to ``seq`` (and numbers up to
    ``delivered``)."""
    return CaughtUp(tier=tier, emitter=f"{tier}/count", incarnation="j", seq=1,
                    source=f"{origin}/agent", source_incarnation="i", source_seq=seq,
                    source_delivered=delivered)


def progress(at, batch=1, marks=False, tier="kafka-local"):
    """The count job at ``at``; with ``marks``, a job that publishes ``caught_up`` marks (in
    its incarnation ``j``, as ``caught_up`` above): judged caught up by them alone."""
    return Progress(tier=tier, emitter=f"{tier}/count", batch_id=batch,
                    input_rows_per_s=1.0, processed_rows_per_s=1.0, batch_duration_ms=1,
                    offsets_behind=0, emitted_at=at, publishes_caught_up=marks,
                    incarnation="j" if marks else None)


class Message:
    """One audit record as the reconciler's consumer gets it from Kafka, stamped by the broker
    when it was appended (``LogAppendTime``): at ``appended_at``, by default the record's own
    ``emitted_at`` (a sender whose clock is true)."""

    def __init__(self, partition: int, offset: int, value: bytes,
                 appended_at: int | None = None):
        self._p, self._o, self._v = partition, offset, value
        self._t = json.loads(value)["emitted_at"] if appended_at is None else appended_at

    def error(self):
        return None

    def topic(self):
        return "docket.audit"

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def value(self):
        return self._v

    def timestamp(self):
        return TIMESTAMP_LOG_APPEND_TIME, self._t
