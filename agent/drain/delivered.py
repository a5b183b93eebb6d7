"""Which records of the slots found in the pool at start are in Kafka already.

A slot's header keeps how many of its records, from the first on, Kafka acknowledged (its
acknowledged prefix, ``docs/buffer.md``); a start sends it again from there. What was past the
prefix when the agent died may still have landed: records acknowledged out of order (another
partition's batch answered first), and — the larger share — the requests a broker had in its
socket when the agent died, written when it read them (after a pause, thousands of records:
a broker SIGSTOPped with a request in flight, the agent killed meanwhile, wrote it on its
return). Sent again, each is a duplicate under its own record number.

So before the native drain sends anything at start, a thread reads back what each partition
of those slots' topics took since the earliest of their records past the prefix was read
(``offsets_for_times`` at that record's time, less ``TIME_MARGIN_MS``: a record's Kafka
timestamp is its event time, or the broker's clock with ``LogAppendTime``), up to the end the
partition had when the check began, and keeps every record that carries this agent's origin
and incarnation and the number of one of those records, *and* the same value: the same
record, delivered. The drain leaves those out of the send (``NativeDrain._start``). A record
not seen is sent again, as before: the check can only take duplicates away, never a record.

It reads as the agent's probe asks (``probe.probe_conf``: the producer's connection and
credentials, OIDC's token shared); a cluster that refuses it (no ``Read`` on the topics, which
least privilege does not grant the agent) ends it at once, with a warning. Bounded: at most
``broker.delivered_check_s`` from the start (waiting for a cluster that does not answer yet
counts), at most ``MAX_RECORDS`` records read; what it has seen by then counts, and the rest is
sent again. Meanwhile the drain sends nothing (the events wait in the pool, as
they would for the cluster anyway). The Python path and exactly-once do not check: the first
sends every slot whole (no prefix), the second replaces what a crash left open by its
transactions.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from functools import partial

import numpy as np
from confluent_kafka import OFFSET_END, KafkaError, KafkaException, TopicPartition

from docket_common.names import INCARNATION_HEADER, ORIGIN_HEADER, SEQ_HEADER

from ..buffer.framing import iter_blocks
from ..buffer.slots import SealedSlot
from .probe import probe_conf

TIME_MARGIN_MS = 250           # read from this long before the earliest record's time
MAX_RECORDS = 1_000_000        # records read back at most, over every partition
CALL_TIMEOUT_S = 2.0           # one metadata or offsets request; asked again until the budget
OVERDUE_GRACE_S = 10.0         # past the budget, the drain stops waiting for the check
BATCH = 5_000                  # records a consume() call takes at most
# Answers no wait changes: the agent's principal may not read its topics (least privilege
# grants it Write only, docs/security.md) or the cluster refuses its credentials.
REFUSALS = {KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED, KafkaError._AUTHENTICATION,
            KafkaError.SASL_AUTHENTICATION_FAILED}


class Refused(Exception):
    """The cluster will not let this agent read back: the check ends at once."""


class Candidates:
    """The records of one topic's slots past their acknowledged prefixes, by record number:
    a slot's records are numbered in order from its ``first_record`` (one range a slot, no
    entry a record)."""

    def __init__(self, slots: list[SealedSlot]):
        self.slots = sorted(slots, key=lambda s: s.meta.first_record)
        self.firsts = [s.meta.first_record for s in self.slots]
        self._values: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def earliest_ms(self) -> int | None:
        """The earliest event time of a record past a slot's prefix."""
        least = None
        for slot in self.slots:
            index = 0
            for block in iter_blocks(slot.payload):
                n = len(block.offsets)
                if index + n > slot.acked_before:
                    times = block.timestamps[max(0, slot.acked_before - index):]
                    t = int(times.min())
                    least = t if least is None else min(least, t)
                index += n
        return least

    def find(self, number: int, value: bytes | None) -> tuple[SealedSlot, int] | None:
        """The slot and index of record ``number`` when it is past its slot's prefix and its
        value is ``value``; else None."""
        at = bisect.bisect_right(self.firsts, number) - 1
        if at < 0:
            return None
        slot = self.slots[at]
        index = number - slot.meta.first_record
        if not slot.acked_before <= index < slot.record_count:
            return None
        offsets, lengths = self._arrays(slot)
        o, n = int(offsets[index]), int(lengths[index])
        if (value or b"") != slot.payload[o:o + n].tobytes():
            return None
        return slot, index

    def _arrays(self, slot: SealedSlot) -> tuple[np.ndarray, np.ndarray]:
        """Every record's value offset and length in the slot's payload, made once a slot."""
        got = self._values.get(slot.meta.seq)
        if got is None:
            offsets, lengths = [], []
            for block in iter_blocks(slot.payload):
                offsets.append(block.offsets.astype(np.int64))
                lengths.append(block.lengths.astype(np.int64))
            got = (np.concatenate(offsets) if offsets else np.zeros(0, np.int64),
                   np.concatenate(lengths) if lengths else np.zeros(0, np.int64))
            self._values[slot.meta.seq] = got
        return got


class DeliveredCheck:
    """The check, in a thread of its own from construction. ``found`` (slot seq → record
    indices delivered) is complete once ``done`` is set. (The agent's loop looks at every
    turn — 50 ms apart at most while slots wait — rather than being woken: a thread that
    outlives the agent must not write to its descriptors.)"""

    def __init__(self, slots: list[SealedSlot], conf: dict, consumer_factory: Callable,
                 origin: bytes, incarnation: bytes, budget_s: float,
                 max_records: int | None = None):
        self.conf = {**probe_conf(conf), "group.id": "docket-delivered-check",
                     "enable.auto.commit": False, "enable.partition.eof": True,
                     "isolation.level": "read_uncommitted"}
        self.consumer_factory = consumer_factory
        self.origin, self.incarnation = origin, incarnation
        self.budget_s = budget_s
        self.max_records = MAX_RECORDS if max_records is None else max_records
        by_topic: dict[str, list[SealedSlot]] = {}
        for slot in slots:                  # each with records past its prefix (the drain's)
            by_topic.setdefault(slot.topic, []).append(slot)
        self.by_topic = {t: Candidates(s) for t, s in by_topic.items()}
        self.candidates = sum(s.record_count - s.acked_before for s in slots)
        self.found: dict[int, set[int]] = {}
        self._found_count = 0
        self.began = time.monotonic()
        self.read = 0                   # records read back
        self.outcome = "running"
        self.seconds = 0.0
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="docket-delivered-check",
                                        daemon=True)
        self._thread.start()

    @property
    def records_found(self) -> int:
        return self._found_count

    def overdue(self) -> bool:
        """Past its budget and a grace for the calls under way: the drain stops waiting for
        it (a check that does not end costs its findings, never the sends)."""
        return time.monotonic() > self.began + self.budget_s + OVERDUE_GRACE_S

    def _run(self) -> None:
        began = self.began
        try:
            self.outcome = self._check(began + self.budget_s)
        except Refused as exc:
            self.outcome = (f"refused: {exc} (the agent's principal needs Read on its topics "
                            "for this check; or set [broker] delivered_check_s = 0)")
        except Exception as exc:            # a check that fails costs duplicates, nothing else
            self.outcome = f"failed: {exc}"
        self.seconds = time.monotonic() - began
        self.done.set()

    def _check(self, deadline: float) -> str:
        consumer = self.consumer_factory(self.conf)
        try:
            starts = self._starts(consumer, deadline)
            if starts is None:
                return "the cluster did not answer in time"
            if not starts:
                return "done"
            return self._read_back(consumer, starts, deadline)
        finally:
            consumer.close()

    def _starts(self, consumer, deadline: float) -> dict[tuple[str, int], tuple[int, int]] | None:
        """Per partition to read: (first offset, end offset). None: no answer before the
        deadline."""
        out = {}
        for topic, cands in self.by_topic.items():
            earliest = cands.earliest_ms()
            if earliest is None:
                continue
            # asked again while the cluster does not answer or answers with an error (a
            # leader moving, a request timed out), until the deadline
            got = _retry(partial(self._ask_starts, consumer, topic, earliest), deadline)
            if got is None:
                return None
            out.update(got)
        return out

    def _ask_starts(self, consumer, topic: str, earliest_ms: int):
        meta = consumer.list_topics(topic, timeout=CALL_TIMEOUT_S)
        t = meta.topics.get(topic)
        if t is not None and t.error is not None:
            if t.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                return {}                       # no such topic: nothing of it landed
            _refused(t.error)
            raise KafkaException(t.error)
        if t is None or not t.partitions:
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, f"no partitions of {topic}"))
        at = [TopicPartition(topic, p, max(0, earliest_ms - TIME_MARGIN_MS))
              for p in sorted(t.partitions)]
        out = {}
        for tp in consumer.offsets_for_times(at, timeout=CALL_TIMEOUT_S):
            if tp.error is not None:
                _refused(tp.error)
                raise KafkaException(tp.error)
            if tp.offset < 0 or tp.offset == OFFSET_END:
                continue                        # nothing at or after that time
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, tp.partition),
                                                        timeout=CALL_TIMEOUT_S)
            if tp.offset < high:
                out[(topic, tp.partition)] = (tp.offset, high)
        return out

    def _read_back(self, consumer, starts: dict, deadline: float) -> str:
        consumer.assign([TopicPartition(t, p, first) for (t, p), (first, _end) in starts.items()])
        left = {tp: end for tp, (_first, end) in starts.items()}
        while left:
            if time.monotonic() >= deadline:
                return "out of time"
            if self.read >= self.max_records:
                return "read its most"
            if self.records_found == self.candidates:
                return "done (every record found)"
            for msg in consumer.consume(BATCH, timeout=0.5):
                tp, err = (msg.topic(), msg.partition()), msg.error()
                if err is not None:
                    _refused(err)                   # a client's error too (no partition)
                    if err.code() == KafkaError._PARTITION_EOF and tp in left:
                        del left[tp]            # its end (what follows the last record read
                        #                         may be a transaction's marker, never given)
                    continue
                end = left.get(tp)
                if end is None:
                    continue
                self.read += 1
                if msg.offset() + 1 >= end:
                    del left[tp]
                    consumer.pause([TopicPartition(*tp)])
                if msg.offset() < end:
                    self._see(msg)
        return "done"

    def _see(self, msg) -> None:
        origin = incarnation = number = None
        for name, value in msg.headers() or ():
            if name == SEQ_HEADER:
                number = value
            elif name == ORIGIN_HEADER:
                origin = value
            elif name == INCARNATION_HEADER:
                incarnation = value
        if number is None or origin != self.origin or incarnation != self.incarnation \
                or len(number) != 8:
            return
        hit = self.by_topic[msg.topic()].find(int.from_bytes(number, "big"), msg.value())
        if hit is not None:
            slot, index = hit
            got = self.found.setdefault(slot.meta.seq, set())
            if index not in got:
                got.add(index)
                self._found_count += 1

    def describe(self) -> str:
        return (f"{self.records_found} of {self.candidates} record(s) past their slots' "
                f"acknowledged prefixes found in Kafka already, not sent again ({self.read} "
                f"read back in {self.seconds:.1f} s: {self.outcome})")


def _refused(err: KafkaError) -> None:
    if err.code() in REFUSALS:
        raise Refused(err.str())


def _retry(call: Callable, deadline: float):
    """``call()`` until it answers or the deadline passes (None then); a refusal ends it."""
    while True:
        try:
            return call()
        except KafkaException as exc:
            if exc.args and isinstance(exc.args[0], KafkaError):
                _refused(exc.args[0])
            if time.monotonic() + CALL_TIMEOUT_S >= deadline:
                return None
            time.sleep(0.2)
