"""How far a tier has read, in positions: the ``caught_up`` records of a Spark job.

The jobs read the audit topic of the cluster they count along with its data topics (one Kafka
source, so one snapshot of end offsets per micro-batch), and leave its records out of what they
count or land. A batch that read its data to the end offsets Kafka gave at its start
(``offsets_behind`` 0) has read every data record appended before any audit record it read:
the tier has *caught up* with those records' emitters up to their ``seq``, and with an agent's
records numbered up to the highest ``delivered`` its ``ranges`` records said. No clock is
compared: an agent whose clock is ten minutes off is caught up with exactly when it is.

After each batch of the query that reads Kafka, the worker here reads that batch's range of
the audit topic (the offsets come from the query's progress) with a consumer of its own and
keeps, per (emitter, incarnation), the highest ``seq`` and ``delivered``. They are *proven*
by the first batch from then on with nothing behind. The count job publishes them then: its
counts of that batch were written before its progress was posted. The land job counts what it
landed with a second query, over the files: there a mark is published once a counting batch
that *started* after the landing batch had been committed (both times read in this one
process) has ended, or a trigger of the counting query that started after it found no new
file (Spark's idle event: the landing batches of audit records alone make no files). Marks are
published, as ``CaughtUp`` records, when they grow.

A batch range that cannot be read within ``READ_TIMEOUT_S`` (the cluster away) gives no marks:
marks only ever say less than the truth, and the next rounds of the emitters say it again.

**A cluster fed by a mirror** (``mirror_target``: the job reads the target of MirrorMaker 2
flows, ``docket-broker mirror``) holds its audit records in no order with its data: the mirror
copies each partition in order, the partitions among them in no order, and the audit topic's
few records can arrive long before the data they count. There the job's marks go only as far as
the mirrors': the ``caught_up`` records a mirror's watcher (``audit.jobs.mirrored``) appends
to this cluster's audit topic once every data record of the source that came before an audit
record is copied. Read in a batch, such a record proves the data it vouches for is in that
batch's snapshot; a source no mirror has vouched for gets no mark.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from docket_common.names import NO_INCARNATION
from docket_common.read_to_end import read_to_ends

from ..contract.errors import MalformedRecord
from ..contract.record import (
    MIRROR_TIER,
    PRODUCER_TIER,
    AuditRecord,
    CaughtUp,
    Progress,
    Ranges,
    parse,
)

log = logging.getLogger("docket.audit")

READ_TIMEOUT_S = 60.0
CLOSE_TIMEOUT_S = 30.0

Source = tuple[str, str]                       # (emitter, incarnation)


@dataclass
class Mark:
    seq: int
    delivered: int | None = None

    def merge(self, other: Mark) -> bool:
        """Take the higher of each; True when this mark grew."""
        grew = other.seq > self.seq or (other.delivered is not None and (
            self.delivered is None or other.delivered > self.delivered))
        self.seq = max(self.seq, other.seq)
        if other.delivered is not None:
            self.delivered = max(self.delivered if self.delivered is not None else -1,
                                 other.delivered)
        return grew


@dataclass
class Batch:
    """What a query's progress says, as the worker needs it."""

    query: str
    batch_id: int
    started_ms: int                    # the trigger's start, this process's clock
    ended_ms: int                      # when the progress reached this process
    behind: int | None
    audit_ranges: dict[int, tuple[int | None, int]] = field(default_factory=dict)


def audit_ranges(sources, audit_topic: str) -> dict[int, tuple[int | None, int]]:
    """partition → (start offset or None for the log's start, end offset) of the audit topic
    in one batch's Kafka sources (their offsets as Spark reports them: JSON text)."""
    out: dict[int, tuple[int | None, int]] = {}
    for s in sources:
        try:
            end = json.loads(s.endOffset) if s.endOffset else {}
        except (TypeError, ValueError):
            continue
        try:                        # a query's first batch has none (PySpark says "None")
            start = json.loads(s.startOffset) if s.startOffset else {}
        except (TypeError, ValueError):
            start = {}
        if not isinstance(end, dict) or not isinstance(end.get(audit_topic), dict):
            continue
        begun = start.get(audit_topic, {}) if isinstance(start, dict) else {}
        for part, off in end[audit_topic].items():
            first = begun.get(part) if isinstance(begun, dict) else None
            out[int(part)] = (None if first is None or first < 0 else int(first), int(off))
    return out


def mirror_emitter(source: str, target: str) -> str:
    """The emitter name of the watcher of the mirror ``source`` → ``target`` (cluster names)."""
    return f"mirror/{source}->{target}"


def vouched_by_mirrors(records, target: str) -> dict[Source, Mark]:
    """Of audit records, the mirrors' ``caught_up`` records about copies to ``target``: per
    (source emitter, incarnation), how far the mirrors have copied its cluster's data."""
    out: dict[Source, Mark] = {}
    for rec in records:
        if isinstance(rec, CaughtUp) and rec.tier == MIRROR_TIER and \
                rec.emitter.endswith(f"->{target}"):
            _keep_highest(out, (rec.source, rec.source_incarnation),
                          Mark(rec.source_seq, rec.source_delivered))
    return out


def capped(mark: Mark, cap: Mark) -> Mark:
    """As far as both ``mark`` and ``cap`` go."""
    delivered = None if mark.delivered is None or cap.delivered is None else \
        min(mark.delivered, cap.delivered)
    return Mark(min(mark.seq, cap.seq), delivered)


def marks_of(records, own_emitter: str) -> dict[Source, Mark]:
    """The highest ``seq`` (and an agent's highest ``delivered``) per (emitter, incarnation)
    among audit records (``Progress`` records name no incarnation: left out)."""
    out: dict[Source, Mark] = {}
    for rec in records:
        if not isinstance(rec, (AuditRecord, Ranges, CaughtUp)) or rec.emitter == own_emitter:
            continue
        delivered = rec.delivered if isinstance(rec, Ranges) and \
            rec.tier == PRODUCER_TIER else None
        _keep_highest(out, (rec.emitter, rec.incarnation or NO_INCARNATION),
                      Mark(rec.seq, delivered))
    return out


def _keep_highest(marks: dict[Source, Mark], key: Source, mark: Mark) -> None:
    if key in marks:
        marks[key].merge(mark)
    else:
        marks[key] = mark


def merge_marks(marks: dict[Source, Mark], more: dict[Source, Mark]) -> None:
    """Into ``marks``, the higher of each of ``more``'s (copied: ``more`` stays as it is)."""
    for key, mark in more.items():
        _keep_highest(marks, key, Mark(mark.seq, mark.delivered))


def grown_marks(published: dict[Source, Mark], marks: dict[Source, Mark]
                ) -> dict[Source, Mark]:
    """Of ``marks``, those that go past what was ``published``, each as far as both go
    together: what to publish next."""
    grown: dict[Source, Mark] = {}
    for key, mark in marks.items():
        old = published.get(key)
        new = Mark(old.seq, old.delivered) if old is not None else Mark(mark.seq,
                                                                        mark.delivered)
        if old is None or new.merge(mark):
            grown[key] = new
    return grown


class CatchUp:
    """The ``caught_up`` records of one job. ``reading``: the query that reads Kafka;
    ``counting``: the query that counts what it landed (the land job), or None when the
    reading query counts (the count job). ``publish`` sends the records (``AuditWriter.send``
    of the encoded records: it retries, or raises)."""

    def __init__(self, *, tier: str, emitter: str, incarnation: str, audit_topic: str,
                 reading: str, counting: str | None, publish, read=None,
                 bootstrap_servers: str = "", client_options: dict | None = None,
                 mirror_target: str | None = None):
        """``read(ranges)``: the audit records of a batch's ranges (partition → (start or
        None, end)), None when they could not be read; by default an ``AuditRangeReader`` on
        ``bootstrap_servers``. ``mirror_target``: the cluster read is this mirror target's
        (its marks go only as far as the mirrors vouch)."""
        self.mirror_target = mirror_target
        self._vouched: dict[Source, Mark] = {}      # read, not yet proven
        self._held: dict[Source, Mark] = {}         # proven, of a mirrored cluster
        self._copied: dict[Source, Mark] = {}       # the mirrors', proven
        self.tier, self.emitter, self.incarnation = tier, emitter, incarnation
        self.audit_topic = audit_topic
        self.reading, self.counting = reading, counting
        self.publish = publish
        self._reader = read or AuditRangeReader(audit_topic, bootstrap_servers, client_options)
        self._unproven: dict[Source, Mark] = {}
        self._proven: list[tuple[int, int, dict[Source, Mark]]] = []  # (ended, batch, marks)
        self._published: dict[Source, Mark] = {}
        self._seen: dict[str, int] = {}        # query → the last batch id handled
        self._events: queue.Queue = queue.Queue()
        self._done = threading.Condition()
        self._worker = threading.Thread(target=self._run, name="docket-caught-up",
                                        daemon=True)
        self._worker.start()

    def announce(self) -> None:
        """Before the job counts anything: a progress record saying that this emitter, in this
        incarnation, publishes ``caught_up`` records. The reconciler then holds the tier's
        counts (and those of a new incarnation, against the old one's marks) not caught up
        with anything until this job's first mark, instead of judging them on their own
        (seen: a count job's first batch, read before the agents' last records, judged a loss
        in the second between its counts and its first progress record)."""
        self.publish([Progress(tier=self.tier, emitter=self.emitter, batch_id=-1,
                               input_rows_per_s=0.0, processed_rows_per_s=0.0,
                               batch_duration_ms=0, offsets_behind=None,
                               publishes_caught_up=True, incarnation=self.incarnation
                               ).encode()])

    # -- the listener's side (Spark's listener thread: quick) ----------------------------------
    def progressed(self, progress, behind: int | None) -> None:
        """A query's progress (``StreamingQueryProgress``); ``behind`` its offsets behind."""
        if progress.name not in (self.reading, self.counting):
            return
        self._events.put(Batch(
            progress.name, int(progress.batchId), _epoch_ms(progress.timestamp),
            int(time.time() * 1000), behind,
            audit_ranges(progress.sources, self.audit_topic)
            if progress.name == self.reading else {}))

    def idle(self, query: str, timestamp: str) -> None:
        """``query`` found nothing new at the trigger that started at ``timestamp``: for the
        counting query, every file landed before then is counted, as by a batch (the landing
        query keeps landing the audit topic's batches, which make no files)."""
        if query == self.counting:
            self._events.put(Batch(query, -1, _epoch_ms(timestamp), int(time.time() * 1000),
                                   0))

    def settle(self, query: str, batch_id: int, timeout_s: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait until the progress of ``query``'s batch ``batch_id`` was handled (a job run
        ``--once`` ends right after its last batch)."""
        deadline = time.monotonic() + timeout_s
        with self._done:
            while self._seen.get(query, -1) < batch_id:
                left = deadline - time.monotonic()
                if left <= 0 or not self._worker.is_alive():
                    return False
                self._done.wait(left)
        return True

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        self._events.put(None)
        self._worker.join(timeout_s)

    # -- the worker ----------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while (batch := self._events.get()) is not None:
                try:
                    if batch.query == self.reading:
                        self._read(batch)
                    else:
                        self._counted(batch)
                except Exception:            # noqa: BLE001 — marks say less, never wrong
                    log.exception("caught-up marks of %s batch %d not taken", batch.query,
                                  batch.batch_id)
                with self._done:
                    self._seen[batch.query] = max(batch.batch_id,
                                                  self._seen.get(batch.query, -1))
                    self._done.notify_all()
        finally:
            close = getattr(self._reader, "close", None)
            if close is not None:
                close()

    def _read(self, batch: Batch) -> None:
        records = self._reader(batch.audit_ranges)
        if records is not None:
            merge_marks(self._unproven, marks_of(records, self.emitter))
            if self.mirror_target is not None:
                merge_marks(self._vouched, vouched_by_mirrors(records, self.mirror_target))
        if batch.behind != 0 or not (self._unproven or self._vouched):
            return
        proven, self._unproven = self._unproven, {}
        if self.mirror_target is not None:
            merge_marks(self._held, proven)
            merge_marks(self._copied, self._vouched)
            self._vouched = {}
            proven = {key: capped(mark, self._copied[key])
                      for key, mark in self._held.items() if key in self._copied}
            if not proven:
                return
        if self.counting is None:
            self._send(batch.batch_id, proven)
        else:
            self._proven.append((batch.ended_ms, batch.batch_id, proven))

    def _counted(self, batch: Batch) -> None:
        """A counting batch ended: publish what was landed before it started."""
        due = [p for p in self._proven if p[0] < batch.started_ms]
        if not due:
            return
        self._proven = [p for p in self._proven if p[0] >= batch.started_ms]
        merged: dict[Source, Mark] = {}
        for _ended, _batch, marks in due:
            merge_marks(merged, marks)
        self._send(due[-1][1], merged)

    def _send(self, batch_id: int, marks: dict[Source, Mark]) -> None:
        """Publish the marks that grew; remembered as published once Kafka has them."""
        grown = grown_marks(self._published, marks)
        if not grown:
            return
        now = int(time.time() * 1000)
        self.publish([CaughtUp(tier=self.tier, emitter=self.emitter,
                               incarnation=self.incarnation, seq=batch_id, source=emitter,
                               source_incarnation=incarnation, source_seq=mark.seq,
                               source_delivered=mark.delivered, emitted_at=now).encode()
                      for (emitter, incarnation), mark in sorted(grown.items())])
        self._published.update(grown)
        log.info("batch %d: caught up with %d emitter(s)", batch_id, len(grown))


class AuditRangeReader:
    """Reads ranges of the audit topic with a consumer of its own (made at the first call)."""

    def __init__(self, audit_topic: str, bootstrap_servers: str,
                 client_options: dict | None = None):
        self.audit_topic = audit_topic
        self._conf = {"bootstrap.servers": bootstrap_servers,
                      "group.id": f"docket-caught-up-{uuid.uuid4()}",
                      "enable.auto.commit": False, "enable.partition.eof": True,
                      "isolation.level": "read_committed", **(client_options or {})}
        self._consumer: Consumer | None = None

    def __call__(self, ranges: dict[int, tuple[int | None, int]]):
        """The audit records in ``ranges`` (malformed ones left out), or None when they were
        not all read within ``READ_TIMEOUT_S``."""
        todo = {p: end for p, (start, end) in ranges.items() if start is None or start < end}
        if not todo:
            return []
        if self._consumer is None:
            self._consumer = Consumer(self._conf, logger=log)
        consumer = self._consumer
        consumer.assign([TopicPartition(self.audit_topic, p,
                                        OFFSET_BEGINNING if ranges[p][0] is None
                                        else ranges[p][0]) for p in todo])
        out = []

        def take(msg) -> None:                   # below the batch's end: what it proves
            try:
                out.append(parse(msg.value()))
            except MalformedRecord:
                pass
        try:
            todo = read_to_ends(consumer, self.audit_topic, todo, take, READ_TIMEOUT_S)
        finally:
            consumer.unassign()
        if todo:
            log.warning("audit topic %s partitions %s not read in %.0f s: no caught-up marks "
                        "from this batch", self.audit_topic, sorted(todo), READ_TIMEOUT_S)
            return None
        return out

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()


def _epoch_ms(timestamp: str) -> int:
    """A progress timestamp (``2026-11-24T10:00:00.123Z``) in ms since the epoch."""
    return int(datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() * 1000)
