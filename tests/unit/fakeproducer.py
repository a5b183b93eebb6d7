"""A fake confluent-kafka ``Producer`` for the drain's unit tests: the transport seam.

A test makes one ``FakeKafka`` (what the cluster holds, and how it will answer) and passes its
``producer`` method as ``Drain(producer_factory=...)``: every producer the drain builds (the
first, a replacement after a fatal error, the one that sends records alone) shares it.

Each message's answer is scripted by its value (``FakeKafka.script``), one outcome per time that
value is handed to any producer; unscripted hand-overs are acknowledged:

- ``OK``: acknowledged. The message is appended to ``FakeKafka.log`` (what Kafka holds) as
  ``(topic, value, key, timestamp_ms, headers)``.
- a ``KafkaError``: reported failed. As librdkafka does, the report carries neither the
  timestamp (``(TIMESTAMP_NOT_AVAILABLE, -1)``) nor the headers (``None``).
- ``HOLD``: in flight with no answer yet: ``release()`` lets it be answered at the next poll,
  ``purge(in_flight=True)`` reports it ``_PURGE_INFLIGHT``.
- ``NEVER``: in flight, and its report never comes, not even after a purge (a report lost
  with a producer that is replaced). ``answer_lost()`` makes it come all the same, late.

``poll()`` sends every queued message and serves every report due, as a librdkafka whose
broker answers at once. With ``delivery.report.only.error`` in the configuration only failures
call back, as with librdkafka. ``len()`` counts the messages not yet reported (queued, in
flight, or with a report waiting for a poll). ``purge(in_queue=True)`` reports the messages
not yet sent as ``_PURGE_QUEUE``; the reports are served by the next poll. ``produce`` raises
``BufferError`` when ``queue.buffering.max.messages`` are outstanding.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

OK = "ok"
HOLD = "hold"
NEVER = "never"


@dataclass
class _Msg:
    topic: str
    value: bytes | None
    key: bytes | None
    timestamp: int
    headers: list | None
    on_delivery: Callable | None
    outcome: object = None


@dataclass
class FakeKafka:
    log: list[tuple] = field(default_factory=list)        # acknowledged, in order
    producers: list[FakeProducer] = field(default_factory=list)
    reachable: bool = True                                 # does list_topics answer?
    read_refused: bool = False                             # may a consumer read? (ACLs)
    probes: int = 0                                        # clients the probe made
    _script: dict = field(default_factory=lambda: collections.defaultdict(collections.deque))

    def admin(self, conf: dict) -> FakeAdmin:
        """The drain's ``probe_factory``: a new client asking whether the cluster answers
        (``reachable``), as a new admin client does."""
        self.probes += 1
        return FakeAdmin(self)

    def consumer(self, conf: dict) -> FakeConsumer:
        """A consumer of what the cluster holds (``log``): one partition a topic, offsets in
        the order acknowledged (the native drain's start check, ``delivered.py``)."""
        self.probes += 1
        return FakeConsumer(self)

    def land(self, msgs: list[_Msg]) -> None:
        """``msgs`` (in flight, unanswered) written all the same: a broker that read them
        from its socket after their sender died."""
        self.log.extend((m.topic, m.value, m.key, m.timestamp, m.headers) for m in msgs)

    def producer(self, conf: dict, role: str = "main") -> FakeProducer:
        """The ``producer_factory``: a new producer over this cluster. ``role``: "main" (the
        drain's producer), "native" (inside the fake extension, ``fakenative.py``); one that
        puts a record in each batch is "lone"."""
        p = FakeProducer(conf, self)
        p.role = "lone" if conf.get("batch.num.messages") == 1 else role
        self.producers.append(p)
        return p

    @property
    def senders(self) -> list[FakeProducer]:
        """The producers that sent slots first, oldest first: the native path's when the drain
        has one, else the drain's own (a rebuild adds one)."""
        native = [p for p in self.producers if p.role == "native"]
        return native or [p for p in self.producers if p.role == "main"]

    @property
    def lones(self) -> list[FakeProducer]:
        return [p for p in self.producers if p.role == "lone"]

    def script(self, value: bytes, *outcomes) -> None:
        """The answers to the next hand-overs of ``value``, in order; after them, OK."""
        self._script[value].extend(outcomes)

    def answer(self, value: bytes | None):
        todo = self._script.get(value)
        return todo.popleft() if todo else OK

    def values(self) -> list[bytes]:
        return [value for _topic, value, _key, _ts, _headers in self.log]


class FakeProducer:
    def __init__(self, conf: dict, kafka: FakeKafka):
        self.conf = conf
        self.kafka = kafka
        self.role = "main"
        self.only_error = bool(conf.get("delivery.report.only.error", False))
        self.max_messages = int(conf.get("queue.buffering.max.messages", 100_000))
        self.produced: list[bytes | None] = []     # every value handed to this producer
        self.queued: list[_Msg] = []
        self.held: list[_Msg] = []
        self.lost: list[_Msg] = []
        self.reports: list[tuple[_Msg, KafkaError | None]] = []

    # -- the Producer methods the drain uses -----------------------------------------------
    def produce(self, topic, value=None, key=None, partition=-1, on_delivery=None,
                callback=None, timestamp=0, headers=None) -> None:
        if len(self) >= self.max_messages:
            raise BufferError("Local: Queue full")
        self.produced.append(value)
        # librdkafka copies the headers at produce(): the caller may reuse its list.
        headers = list(headers) if headers is not None else None
        self.queued.append(_Msg(topic, value, key, timestamp, headers, on_delivery or callback))

    def poll(self, timeout: float = 0) -> int:
        sending, self.queued = self.queued, []
        for msg in sending:
            outcome = self.kafka.answer(msg.value) if msg.outcome is None else msg.outcome
            if isinstance(outcome, KafkaError):     # (== with a str sets a TypeError in C)
                self.reports.append((msg, outcome))
            elif outcome is HOLD:
                self.held.append(msg)
            elif outcome is NEVER:
                self.lost.append(msg)
            else:
                assert outcome is OK, outcome
                self.kafka.log.append((msg.topic, msg.value, msg.key, msg.timestamp,
                                       msg.headers))
                self.reports.append((msg, None))
        due, self.reports = self.reports, []
        served = 0
        for msg, err in due:
            if msg.on_delivery is not None and (err is not None or not self.only_error):
                msg.on_delivery(err, _report(msg, err))
                served += 1
        return served

    def __len__(self) -> int:
        return len(self.queued) + len(self.held) + len(self.lost) + len(self.reports)

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        if in_queue:
            self.reports += [(m, KafkaError(KafkaError._PURGE_QUEUE)) for m in self.queued]
            self.queued = []
        if in_flight:
            self.reports += [(m, KafkaError(KafkaError._PURGE_INFLIGHT)) for m in self.held]
            self.held = []

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return len(self)

    def list_topics(self, topic: str | None = None, timeout: float = -1):
        raise AssertionError("the drain asked its own producer whether the cluster answers: "
                             "a producer that stopped would answer for itself (agent/drain/"
                             "probe.py); a new client (FakeKafka.admin) must be asked")

    # -- what a test does to it --------------------------------------------------------------
    def release(self, outcome=None) -> None:
        """The messages held in flight are answered at the next poll: ``outcome``, or their
        next scripted answer."""
        for msg in self.held:
            msg.outcome = outcome
        self.queued, self.held = self.held + self.queued, []

    def answer_lost(self, outcome) -> None:
        """The reports that were never to come come after all, at the next poll."""
        for msg in self.lost:
            msg.outcome = outcome
        self.queued, self.lost = self.lost + self.queued, []

    def fail_fatally(self, code: int = KafkaError._FATAL) -> None:
        """librdkafka raised a fatal error: the client must be replaced."""
        self.conf["error_cb"](KafkaError(code, fatal=True))


class FakeAdmin:
    """A new client's metadata request: answered while the cluster is ``reachable``."""

    def __init__(self, kafka: FakeKafka):
        self.kafka = kafka

    def list_topics(self, topic: str | None = None, timeout: float = -1):
        if not self.kafka.reachable:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return object()


class FakeConsumer:
    """What a consumer assigned to partitions reads of ``FakeKafka.log``: metadata, offsets by
    time, watermarks and records with their offsets, while the cluster is ``reachable``."""

    def __init__(self, kafka: FakeKafka):
        self.kafka = kafka
        self.at: dict[str, int] = {}           # topic → next offset, once assigned
        self.closed = False

    def _held(self, topic: str) -> list[tuple]:
        if not self.kafka.reachable:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        if self.kafka.read_refused:
            raise KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
        return [r for r in self.kafka.log if r[0] == topic]

    def list_topics(self, topic: str, timeout: float = -1):
        held = self._held(topic)
        error = None if held else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
        t = type("TopicMetadata", (), {"error": error, "partitions": {0: None} if held else {}})
        return type("ClusterMetadata", (), {"topics": {topic: t}})

    def offsets_for_times(self, tps: list, timeout: float = -1) -> list:
        out = []
        for tp in tps:
            held = self._held(tp.topic)
            offset = next((i for i, r in enumerate(held) if r[3] >= tp.offset), -1)
            out.append(TopicPartition(tp.topic, tp.partition, offset))
        return out

    def get_watermark_offsets(self, tp, timeout: float = -1) -> tuple[int, int]:
        return 0, len(self._held(tp.topic))

    def assign(self, tps: list) -> None:
        self.at = {tp.topic: tp.offset for tp in tps}

    def pause(self, tps: list) -> None:
        for tp in tps:
            self.at.pop(tp.topic, None)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        out = []
        for topic, at in list(self.at.items()):
            held = self._held(topic)
            end = min(len(held), at + num_messages - len(out))
            for offset in range(at, end):
                _t, value, key, ts, headers = held[offset]
                out.append(Message(topic=topic, value=value, key=key, headers=headers,
                                   partition=0, offset=offset,
                                   timestamp=(TIMESTAMP_CREATE_TIME, ts)))
            self.at[topic] = max(at, end)
        return out

    def close(self) -> None:
        self.closed = True


def _report(msg: _Msg, err: KafkaError | None) -> Message:
    if err is not None:        # what librdkafka gives for a failed message
        return Message(topic=msg.topic, value=msg.value, key=msg.key, headers=None,
                       timestamp=(TIMESTAMP_NOT_AVAILABLE, -1), error=err)
    return Message(topic=msg.topic, value=msg.value, key=msg.key, headers=msg.headers,
                   timestamp=(TIMESTAMP_CREATE_TIME, msg.timestamp))
