"""What a mirror has copied, in positions: the ``caught_up`` records of a MirrorMaker 2 flow.

MirrorMaker 2 copies each partition in order, and the partitions among them in no order: on
the target, an agent's audit record can be there long before the data it counts (the audit
topic is small, the data topics are not). A count job on the target that read the record has
then *not* read the data, and its marks (``audit.jobs.catchup``) would call a loss that is only
a mirror behind. The watcher here, started with each mirror (``docket-broker mirror up``), says
in the target's audit topic how far the mirror has copied, in positions, each round:

1. read the source's audit topic to its end offsets, keeping per (emitter, incarnation) the
   highest ``seq`` and an agent's highest ``delivered`` (``catchup.marks_of``);
2. then take the end offsets of every source topic the mirror copies;
3. wait until the mirror has copied every one of those records: its offset store on the target
   (``mm2-offsets.<source>.internal``, Kafka Connect's, where MirrorMaker 2 commits, per source
   partition, the offset of the last record the target acknowledged) reaches them;
4. append to the target's audit topic a ``caught_up`` record (tier ``mirror``, emitter
   ``mirror/<source>-><target>``) per emitter whose mark grew.

Every data record an audit record read in 1 counts was appended to the source before it, so
before the offsets of 2, so it is on the target before the ``caught_up`` record of 4 is
appended there: a count job that has read that record in a batch has the data in the same
batch (``CatchUp`` with ``mirror_target``). No clock is compared. The watcher keeps no state:
started again, it reads the source's audit topic from its start and says it all again (the
reconciler keeps the newest).

Run as ``python -m audit.jobs.mirrored --source local --target aggregate ...``; it stops on
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from docket_common.errors import print_error
from docket_common.kafka_security import check_one_principal, read_kafka_config
from docket_common.names import AUDIT_TOPIC
from docket_common.read_to_end import read_to_ends
from docket_common.settings import ConfigError

from ..contract.errors import MalformedRecord
from ..contract.record import MIRROR_TIER, CaughtUp, parse
from .catchup import Mark, Source, grown_marks, marks_of, merge_marks, mirror_emitter

log = logging.getLogger("docket.mirror")

# The topics MirrorMaker 2 never copies, whatever its pattern (its default topics.exclude).
EXCLUDED = re.compile(r".*[\-\.]internal|.*\.replica|__.*")
TIMEOUT_S = 10.0
SLOW_LOG_S = 60.0


def offset_store(source: str) -> str:
    """The topic on the target where MirrorMaker 2 (dedicated mode) commits what it copied."""
    return f"mm2-offsets.{source}.internal"


class MirrorWatch:
    """The watcher of the mirror ``source`` → ``target`` copying the topics ``pattern`` matches
    (a regular expression matched against whole names, as MirrorMaker 2 does)."""

    def __init__(self, *, source: str, target: str, source_bootstrap: str,
                 target_bootstrap: str, pattern: str, audit_topic: str = AUDIT_TOPIC,
                 source_options: dict | None = None, target_options: dict | None = None):
        """``source_options``, ``target_options``: further librdkafka settings reaching each
        cluster (a secured one's, ``KafkaSecurity.librdkafka_properties``)."""
        self.source, self.target = source, target
        self.pattern = re.compile(pattern)
        self.audit_topic = audit_topic
        self.emitter = mirror_emitter(source, target)
        self.incarnation = uuid.uuid4().hex[:12]
        base = {"enable.auto.commit": False, "enable.partition.eof": True,
                "group.id": f"docket-mirror-watch-{self.incarnation}"}
        source = {"bootstrap.servers": source_bootstrap, **(source_options or {})}
        target = {"bootstrap.servers": target_bootstrap, **(target_options or {})}
        self._audit = Consumer({**source, "isolation.level": "read_committed", **base},
                               logger=log)
        self._store = Consumer({**target, **base}, logger=log)
        self._source_admin = AdminClient(source, logger=log)
        self._target_admin = AdminClient(target, logger=log)
        self._producer = Producer({**target, "acks": "all", "enable.idempotence": True,
                                   "linger.ms": 5, "client.id": f"docket-{self.emitter}"},
                                  logger=log)
        self.held: dict[Source, Mark] = {}          # read in the source's audit topic
        self.published: dict[Source, Mark] = {}
        self.copied: dict[tuple[str, int], int] = {}  # (topic, partition) → last offset copied
        self._assigned: dict[str, set[int]] = {}     # consumer's topic → partitions assigned
        self._waiting: tuple[dict[Source, Mark], dict[tuple[str, int], int]] | None = None
        self._waiting_since = 0.0
        self._said_slow = False
        self.rounds = 0

    # -- one round -----------------------------------------------------------------------------
    def step(self) -> int | None:
        """Go on with the round: the number of marks appended when the mirror has copied
        everything the round waits for, else None (call again)."""
        if self._waiting is None:
            self._read_store()
            ends = self._read_audit()
            self._waiting = ({k: Mark(m.seq, m.delivered) for k, m in self.held.items()},
                             self._source_ends())
            for tp, end in self._waiting[1].items():
                if self.copied.get(tp, -1) >= end:    # committed before these ends were
                    del self.copied[tp]              # taken, yet past them: an older topic
                    # of that name (deleted, made again), whose copies say nothing of this one
            self._waiting_since, self._said_slow = time.monotonic(), False
            log.debug("round %d: audit topic read to %s", self.rounds + 1, ends)
        marks, ends = self._waiting
        self._read_store()
        behind = {tp: end for tp, end in ends.items() if self.copied.get(tp, -1) < end - 1}
        if behind:
            if not self._said_slow and time.monotonic() - self._waiting_since > SLOW_LOG_S:
                self._said_slow = True
                log.warning("the mirror %s -> %s has not copied %d partition(s) for %.0f s, "
                            "e.g. %s", self.source, self.target, len(behind), SLOW_LOG_S,
                            ", ".join(f"{t}[{p}] to {e}"
                                      for (t, p), e in sorted(behind.items())[:3]))
            return None
        self.rounds += 1
        sent = self._publish(marks)
        self._waiting = None
        return sent

    def _read_audit(self) -> dict[int, int]:
        """Read the source's audit topic to its end offsets (taken first); merge its marks."""
        parts = self._partitions(self._audit, self.audit_topic)
        self._assign(self._audit, self.audit_topic, parts)
        ends = {p: high for (_t, p), (_low, high) in _offsets(
            self._source_admin, [(self.audit_topic, p) for p in parts]).items()}
        records: list = []
        try:
            _read_to(self._audit, self.audit_topic, ends, _parse, records)
        finally:                                     # what was read counts, even if not all
            merge_marks(self.held, marks_of([r for r in records if r is not None], ""))
        return ends

    def _source_ends(self) -> dict[tuple[str, int], int]:
        """(topic, partition) → end offset of every source partition the mirror copies that
        holds records."""
        copied = [(topic, p) for topic, meta in
                  self._audit.list_topics(timeout=TIMEOUT_S).topics.items()
                  if not EXCLUDED.fullmatch(topic) and self.pattern.fullmatch(topic)
                  for p in meta.partitions]
        return {tp: high for tp, (low, high) in _offsets(self._source_admin, copied).items()
                if high > low}

    def _read_store(self) -> None:
        """Read the mirror's offset store on the target to its end: the offset of the last
        record copied of each source partition."""
        topic = offset_store(self.source)
        parts = self._partitions(self._store, topic)
        if not parts:
            return                                  # the mirror has not started yet
        self._assign(self._store, topic, parts)
        ends = {p: high for (_t, p), (_low, high) in _offsets(
            self._target_admin, [(topic, p) for p in parts]).items()}
        for key, value in _read_to(self._store, topic, ends, lambda m: (m.key(), m.value()),
                                   []):
            copied = _copied(key, value, self.source)
            if copied is not None:          # the newest commit (a topic made again starts
                (tp, offset) = copied          # low: its old offsets say nothing)
                self.copied[tp] = offset

    def _publish(self, marks: dict[Source, Mark]) -> int:
        grown = grown_marks(self.published, marks)
        if not grown:
            return 0
        now = int(time.time() * 1000)
        for (emitter, incarnation), mark in sorted(grown.items()):
            key, value = CaughtUp(
                tier=MIRROR_TIER, emitter=self.emitter, incarnation=self.incarnation,
                seq=self.rounds, source=emitter, source_incarnation=incarnation,
                source_seq=mark.seq, source_delivered=mark.delivered, emitted_at=now).encode()
            self._producer.produce(self.audit_topic, value, key)
        left = self._producer.flush(TIMEOUT_S)
        if left:
            raise RuntimeError(f"{left} caught_up record(s) not acknowledged by {self.target} "
                               f"within {TIMEOUT_S:.0f} s")
        self.published.update(grown)
        log.info("round %d: the mirror %s -> %s has copied what %d emitter(s) counted",
                 self.rounds, self.source, self.target, len(grown))
        return len(grown)

    # -- Kafka ---------------------------------------------------------------------------------
    def _partitions(self, consumer: Consumer, topic: str) -> list[int]:
        meta = consumer.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        return sorted(meta.partitions)

    def _assign(self, consumer: Consumer, topic: str, parts: list[int]) -> None:
        """Assign the partitions not yet assigned (new ones from the log's start)."""
        new = [p for p in parts if p not in self._assigned.get(topic, set())]
        if new:
            consumer.incremental_assign([TopicPartition(topic, p, OFFSET_BEGINNING)
                                         for p in new])
            self._assigned.setdefault(topic, set()).update(new)

    def close(self) -> None:
        self._producer.flush(TIMEOUT_S)
        self._audit.close()
        self._store.close()


def _parse(msg):
    try:
        return parse(msg.value())
    except MalformedRecord:
        return None                                 # the reconciler reports those


def _offsets(admin: AdminClient, partitions: list[tuple[str, int]]
             ) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, partition) → (first offset, end offset) of each of ``partitions``, asked in two
    requests (one per partition takes a round trip each)."""
    if not partitions:
        return {}
    out: dict[tuple[str, int], list[int]] = {tp: [0, 0] for tp in partitions}
    for i, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
        asked = admin.list_offsets({TopicPartition(t, p): spec for t, p in partitions},
                                   request_timeout=TIMEOUT_S)
        for tp, future in asked.items():
            out[(tp.topic, tp.partition)][i] = future.result(TIMEOUT_S).offset
    return {tp: (low, high) for tp, (low, high) in out.items()}


def _read_to(consumer: Consumer, topic: str, ends: dict[int, int], convert, out: list) -> list:
    """``out`` with what ``consumer`` (assigned to ``topic``'s partitions) reads below each
    partition's end offset in ``ends`` (``docket_common.read_to_end``'s rule), each message made
    by ``convert``; raises TimeoutError after ``TIMEOUT_S`` (``out`` holds what was read)."""
    owed = read_to_ends(consumer, topic, ends, lambda msg: out.append(convert(msg)), TIMEOUT_S)
    if owed:
        raise TimeoutError(f"{topic} partitions {sorted(owed)} not read to their end in "
                           f"{TIMEOUT_S:.0f} s")
    return out


def _copied(key: bytes | None, value: bytes | None, source: str
            ) -> tuple[tuple[str, int], int] | None:
    """A record of the mirror's offset store: ((topic, partition), offset copied) when it is
    the source connector's about ``source``, else None."""
    try:
        connector, part = json.loads(key or b"null")
        offset = json.loads(value or b"null")
    except (TypeError, ValueError):
        return None
    if connector != "MirrorSourceConnector" or not isinstance(part, dict) or \
            part.get("cluster") != source or not isinstance(offset, dict):
        return None
    try:
        return (str(part["topic"]), int(part["partition"])), int(offset["offset"])
    except (KeyError, TypeError, ValueError):
        return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m audit.jobs.mirrored", description=(
        "Says in the target's audit topic how far a MirrorMaker 2 flow has copied."))
    ap.add_argument("--flow", default=None, help="SOURCE->TARGET: names the process in ps")
    ap.add_argument("--source", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--source-bootstrap", required=True)
    ap.add_argument("--target-bootstrap", required=True)
    ap.add_argument("--topics", required=True, help="the mirror's topic pattern")
    ap.add_argument("--audit-topic", default=AUDIT_TOPIC)
    ap.add_argument("--interval-s", type=float, default=2.0)
    for side in ("source", "target"):
        ap.add_argument(f"--{side}-kafka-config", type=Path, default=None, metavar="FILE",
                        help=f"how to reach the {side} cluster: a TOML file's [kafka] table "
                        "(docs/security.md), as the Spark jobs' --kafka-config")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        sides = {side: read_kafka_config(path) if path else None
                 for side, path in (("source", args.source_kafka_config),
                                    ("target", args.target_kafka_config))}
        check_one_principal(sides.values(), "the mirror's watcher")
        options = {side: security.librdkafka_properties() if security else {}
                   for side, security in sides.items()}
    except ConfigError as exc:
        print_error(exc, "docket mirror watcher: error")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    watch = MirrorWatch(source=args.source, target=args.target,
                        source_bootstrap=args.source_bootstrap,
                        target_bootstrap=args.target_bootstrap, pattern=args.topics,
                        audit_topic=args.audit_topic, source_options=options["source"],
                        target_options=options["target"])
    log.info("watching the mirror %s -> %s (topics %s)", args.source, args.target, args.topics)
    try:
        while not stop.is_set():
            try:
                if watch.step() is None:
                    stop.wait(min(args.interval_s, 1.0))
                    continue
            except Exception as exc:  # noqa: BLE001 — a cluster away: try again
                log.warning("mirror %s -> %s: %s (trying again)", args.source, args.target, exc)
            stop.wait(args.interval_s)
    finally:
        watch.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
