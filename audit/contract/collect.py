"""Read the audit topic into the newest record per identity, skipping malformed ones.

The identity of a count is (tier, emitter, incarnation, origin, topic, window_start); the newest
record wins (``record.newer``: the highest ``seq``, then the latest ``emitted_at``), so reading
the topic from its start in any order of partitions gives the same state. The incarnations of
an emitter are summed (``by_tier``). Malformed records are counted by reason and logged,
never fatal.
Progress records are kept apart, the newest per (tier, emitter); ``ranges`` records the newest
per (tier, emitter, incarnation, origin, origin incarnation); ``caught_up`` records the newest
per key (each says as much as any before it).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from confluent_kafka import Consumer, KafkaException, TopicPartition

from docket_common.read_to_end import read_to_ends

from .errors import AuditError, BrokerUnreachable, MalformedRecord
from .record import (
    PRODUCER_TIER,
    AuditRecord,
    CaughtUp,
    Progress,
    Ranges,
    Record,
    combined,
    newer,
    parse,
)

log = logging.getLogger("docket.audit.collect")
# librdkafka's own lines (a broker that refuses connections, one line per retry) go here, not to
# stderr; docket-audit shows them only with --log-level debug.
librdkafka_log = logging.getLogger("docket.audit.collect.librdkafka")


@dataclass
class AuditState:
    counts: dict[tuple, AuditRecord] = field(default_factory=dict)
    progress: dict[tuple[str, str], Progress] = field(default_factory=dict)
    ranges: dict[tuple, Ranges] = field(default_factory=dict)
    caught_up: dict[str, CaughtUp] = field(default_factory=dict)
    malformed: Counter = field(default_factory=Counter)
    read: int = 0

    def add(self, value: bytes | None, where: str = "") -> Record | None:
        self.read += 1
        try:
            rec = parse(value)
        except MalformedRecord as exc:
            self.malformed[exc.reason] += 1
            log.warning("skipping a malformed audit record%s: %s", f" at {where}" if where
                        else "", exc)
            return None
        if isinstance(rec, Progress):
            key = (rec.tier, rec.emitter)
            old = self.progress.get(key)
            if old is None or newer(rec, old):
                self.progress[key] = rec
            return rec
        if isinstance(rec, CaughtUp):
            old = self.caught_up.get(rec.key)
            if old is None or (rec.source_seq, rec.seq) >= (old.source_seq, old.seq):
                self.caught_up[rec.key] = rec
            return rec
        table = self.ranges if isinstance(rec, Ranges) else self.counts
        old = table.get(rec.identity)
        if old is None or newer(rec, old):
            table[rec.identity] = rec
        return rec

    def by_tier(self) -> dict[str, dict[tuple[str, int, str], AuditRecord]]:
        """tier → (topic, window_start, origin) → the record. One emitter per (tier, origin)
        is the contract: emitters are not summed (the newest emitter wins).

        Incarnations: an agent's are summed — its counts live in its state, so a new
        incarnation (state lost) counts on from 0 and its counts add to the old ones'. A
        record without an incarnation (an agent before incarnations) is superseded, not
        summed, by an incarnation's record with a higher ``seq``: the audit ``seq`` survived,
        so it is the same state, counted on. A Spark tier counts again from Kafka under a new
        incarnation (a new checkpoint), so only its newest incarnation is taken."""
        return current_counts(self.counts.values())


def current_counts(records: Iterable[AuditRecord]) -> dict[str, dict[tuple[str, int, str],
                                                                      AuditRecord]]:
    """tier → (topic, window_start, origin) → the one record that counts, from the newest
    record per identity (see ``AuditState.by_tier``; the reconciler calls this too).

    A tally of copies skipped (kind ``skipped``, ``AuditRecord.is_skip_tally``) never competes
    with the tier's counts: its ``skipped`` is added to the record that counts."""
    groups: dict[tuple, dict[str, list]] = {}
    skips: dict[tuple, dict[str, list]] = {}
    for rec in records:
        into = skips if rec.is_skip_tally else groups
        at = into.setdefault((rec.tier, rec.topic, rec.window_start, rec.origin), {})
        at.setdefault(rec.emitter, []).append(rec)
    out: dict[str, dict] = {}
    for (tier, topic, window, origin), emitters in groups.items():
        # The emitter with the newest record; of two as new, the first by name, whatever the
        # order the records came in.
        newest = max((emitters[e] for e in sorted(emitters)),
                     key=lambda recs: max(r.emitted_at for r in recs))
        out.setdefault(tier, {})[(topic, window, origin)] = combined(_current(newest))
    for (tier, topic, window, origin), emitters in skips.items():
        tallies = [r for recs in emitters.values() for r in _current(recs)]
        counted = out.setdefault(tier, {}).get((topic, window, origin))
        if counted is None:
            out[tier][(topic, window, origin)] = combined(tallies)
        else:
            out[tier][(topic, window, origin)] = replace(
                counted, skipped=(counted.skipped or 0) + sum(r.skipped for r in tallies))
    return out


def _current(records: list[AuditRecord]) -> list[AuditRecord]:
    """The records of one emitter's incarnations that count (see ``AuditState.by_tier``)."""
    if len(records) == 1:
        return records
    if records[0].tier != PRODUCER_TIER:                # ties: the first incarnation by name
        return [max(sorted(records, key=lambda r: r.incarnation or ""),
                    key=lambda r: (r.emitted_at, r.seq))]
    known = [r for r in records if r.incarnation]
    top = max((r.seq for r in known), default=-1)
    return known + [r for r in records if not r.incarnation and r.seq >= top]


def read_audit_topic(bootstrap: str, topic: str, state: AuditState | None = None,
                     timeout_s: float = 60, conf: dict | None = None,
                     connect_timeout_s: float | None = None) -> AuditState:
    """Read ``topic`` from its start to its current end. Raises BrokerUnreachable when no
    broker answers within ``connect_timeout_s`` (default: ``timeout_s``), AuditError when the
    topic is not read to its end within ``timeout_s``."""
    state = state or AuditState()
    connect_timeout_s = timeout_s if connect_timeout_s is None else connect_timeout_s
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"docket-read-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", **(conf or {})},
                        logger=librdkafka_log)
    try:
        try:
            meta = consumer.list_topics(topic, timeout=connect_timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise BrokerUnreachable(
                f"no answer from the Kafka cluster at {bootstrap} within "
                f"{connect_timeout_s:g} s ({exc.args[0].str()})",
                hint="is it up (docket-broker status)? check --bootstrap-servers; "
                "docket-audit show --db FILE reads the reconciler's database instead") from None
        if meta is None or meta.error is not None:
            return state
        ends = {}
        for p in meta.partitions:
            _lo, hi = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)
            if hi > 0:
                ends[p] = hi
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        ends = read_to_ends(consumer, topic, ends,
                            lambda msg: state.add(msg.value(), f"{msg.partition()}@{msg.offset()}"),
                            timeout_s,
                            on_error=lambda err: log.warning("audit topic read error: %s", err))
        if ends:
            raise AuditError(f"audit topic {topic}: partitions {sorted(ends)} not read to "
                             f"their end in {timeout_s:g} s",
                             hint="is the cluster overloaded or the topic very large? "
                             "docket-audit show --db FILE reads the reconciler's database")
    finally:
        consumer.close()
    return state
