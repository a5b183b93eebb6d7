"""``docket-audit reconcile``: the audit topic into SQLite, windows judged, alerts raised and
delivered.

Two threads; the consumer, each evaluation and each delivery run use a SQLite connection of
their own (WAL: readers never wait for the writer):

- the consuming thread (the main thread, ``Reconciler.step`` in a loop) reads the audit topic
  from the offsets stored in the database and applies each batch in one transaction with the
  offsets it reaches, then commits those offsets to the consumer group (for lag monitoring
  only: the database is what it resumes from). After a batch, once
  ``reconcile.evaluate_interval_ms`` has passed since the last evaluation, the same thread
  evaluates (``evaluate.evaluate``): it judges the windows that changed or are not final
  yet, stores the verdicts and fires or resolves alerts, queuing their notifications in the
  outbox in the same transaction. It evaluates only with every partition read to the end it
  had when the evaluation fell due (asked at most every ``CATCH_UP_CHECK_S``; after
  ``CATCH_UP_WAIT_S`` behind, it evaluates anyway, with a warning), so a tier's counts and its
  progress, on different partitions, are judged together; nothing is applied while windows are
  judged. A failed evaluation is logged and tried again at the next interval.
- an apscheduler job every ``reconcile.deliver_interval_ms``, in apscheduler's thread, sends
  due notifications, so a channel that is down or slow never delays the consumer or the
  evaluation.

``--once`` (``Reconciler.run_once``) reads the topic to the ends it has when its partitions
are found, evaluates, delivers once and returns. Malformed audit records are counted by reason
(table ``malformed``), logged and skipped. While it runs, ``/metrics`` on ``reconcile.listen``
serves its metrics (``metrics.py``, from threads of its own).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from audit.contract.errors import AuditError, MalformedRecord
from audit.contract.record import PRODUCER_TIER, AuditRecord, Ranges, parse
from docket_common.formats import utc_iso

from .alerts.channels import channel_from_config
from .alerts.outbox import Dispatcher
from .config import ReconcileConfig
from .evaluate import Evaluation, evaluate
from .metrics import MetricsServer
from .store import Store

log = logging.getLogger("docket.audit.reconcile")

# Records per consumer batch, applied in one transaction: a batch of a fleet's records touches
# pages all over a window's part of ``counts``, each written once per batch (docs/reconcile.md).
BATCH_RECORDS = 50_000
METADATA_EVERY_S = 30.0
# Windows are evaluated once every record on the audit topic has been applied (see
# ``Reconciler.step``); a topic that never stands still for this long is evaluated anyway.
CATCH_UP_WAIT_S = 600.0
CATCH_UP_CHECK_S = 1.0


class Reconciler:
    def __init__(self, cfg: ReconcileConfig, db_path, clock=time.time,
                 stop_event: threading.Event | None = None):
        self.cfg = cfg
        self.db_path = db_path
        self.clock = clock
        self.stop_event = stop_event or threading.Event()    # set: stop at the next turn
        self.store = Store(db_path)              # the consumer's connection
        self.topic = cfg["reconcile.audit_topic"]
        self.channels = {name: channel_from_config(name, table)
                         for name, table in cfg.channels.items()}
        self.consumer: Consumer | None = None
        self.partitions: set[int] = set()
        self.applied = 0                         # audit records applied since start
        self.last_evaluation_ms: int | None = None
        self._evaluate_due: float | None = None    # monotonic time of the next evaluation
        self._next_catch_up_check = 0.0
        self._due_ends: dict[int, int] | None = None  # partition → its end when evaluation fell due
        self._held: list = []                  # records read past those ends, applied after it
        self._paused: set[int] = set()         # partitions read to those ends, until then
        self._unstamped_said = False           # the warning about a topic without LogAppendTime
        self._windows_said: set[tuple] = set()  # (tier, emitter, window_ms) refused and said
        self.metrics: MetricsServer | None = None

    # -- consuming -----------------------------------------------------------------------------
    def _consumer(self) -> Consumer:
        conf = {"bootstrap.servers": self.cfg["reconcile.bootstrap_servers"],
                "group.id": self.cfg["reconcile.group_id"], "enable.auto.commit": False,
                "enable.partition.eof": True, "isolation.level": "read_committed",
                # An offset below the log's start (retention) restarts at the oldest record:
                # never at the end, which would skip what is there.
                "auto.offset.reset": "earliest",
                **self.cfg.security.librdkafka_properties(),
                **self.cfg["reconcile.librdkafka_options"]}
        return Consumer(conf, logger=logging.getLogger("docket.audit.librdkafka"))

    def _assign_new_partitions(self, timeout_s: float = 10.0) -> None:
        try:
            meta = self.consumer.list_topics(self.topic, timeout=timeout_s).topics.get(
                self.topic)
        except KafkaException as exc:
            log.warning("cannot read the metadata of %s (trying again): %s", self.topic, exc)
            return
        if meta is None or meta.error is not None:
            return
        stored = self.store.offsets(self.topic)
        new = [TopicPartition(self.topic, p, stored.get(p, 0))
               for p in sorted(meta.partitions) if p not in self.partitions]
        if new:
            self.consumer.incremental_assign(new)
            self.partitions |= {tp.partition for tp in new}
            if self._due_ends is not None:     # the ends to read to must name it too
                self._due_ends = None
                self._release_held()
            log.info("reading %s partitions %s from offsets %s", self.topic,
                     [tp.partition for tp in new], [tp.offset for tp in new])

    def consume_batch(self, timeout_s: float = 0.5) -> tuple[int, bool]:
        """Apply one batch; returns (records read, whether every partition is at its end).
        Each record is applied with the time it arrived: the broker's append time when the
        audit topic stamps its records (``LogAppendTime``), else now on this reconciler's
        clock. A producer record the broker stamped also measures its origin's clock: how far
        its ``emitted_at`` is ahead of the broker's time."""
        messages = self.consumer.consume(BATCH_RECORDS, timeout=timeout_s)
        at_end = not any(m.error() is None for m in messages)
        if self._due_ends is not None:
            messages = self._hold_past_due_ends(messages)
        return self._apply_messages(messages), at_end

    def _hold_past_due_ends(self, messages: list) -> list:
        """Of a batch read while an evaluation waits for the ends it took, the records at or
        past a partition's end are held back (and the partition paused) until the evaluation
        is done: a tier's progress written after the ends must not be judged without its
        counts, which may sit unread in a slower partition."""
        ends, keep = self._due_ends, []
        for msg in messages:
            p = msg.partition() if msg.error() is None else None
            if p is not None and p in ends and msg.offset() >= ends[p]:
                self._held.append(msg)
                if p not in self._paused:
                    self._paused.add(p)
                    self.consumer.pause([TopicPartition(self.topic, p)])
            else:
                keep.append(msg)
        return keep

    def _release_held(self) -> None:
        """After an evaluation (or when its ends are given up): apply what was held back and
        read the paused partitions on."""
        held, self._held = self._held, []
        if held:
            self._apply_messages(held)
        if self._paused:
            self.consumer.resume([TopicPartition(self.topic, p) for p in sorted(self._paused)])
            self._paused.clear()

    def _apply_messages(self, messages: list) -> int:
        records, malformed, offsets = [], {}, {}
        clock_offsets: dict[str, tuple[int, int]] = {}
        bad: Counter = Counter()
        now_ms = int(self.clock() * 1000)
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("audit topic read error: %s", err)
                continue
            offsets[(msg.topic(), msg.partition())] = msg.offset() + 1
            try:
                rec = parse(msg.value())
                self._check_window(rec)
            except MalformedRecord as exc:
                bad[exc.reason] += 1
                malformed[exc.reason] = (bad[exc.reason], f"{msg.partition()}@{msg.offset()}: "
                                         f"{exc}")
                if exc.reason != "window_mismatch":
                    log.warning("skipping a malformed audit record at %s@%s: %s",
                                msg.partition(), msg.offset(), exc)
                continue
            stamp, ts = msg.timestamp()
            stamped = stamp == TIMESTAMP_LOG_APPEND_TIME
            if not stamped and not self._unstamped_said:
                self._unstamped_said = True
                log.warning("the audit topic %s keeps the time its senders wrote (not "
                            "message.timestamp.type=LogAppendTime): audit lag and silence are "
                            "measured from when this reconciler reads each record, and the "
                            "producers' clock offsets are not measured", self.topic)
            if not isinstance(rec, Ranges):
                rec.arrived_at = ts if stamped else now_ms
            if stamped and isinstance(rec, AuditRecord) and rec.tier == PRODUCER_TIER and \
                    ts >= clock_offsets.get(rec.origin, (ts, 0))[0]:
                clock_offsets[rec.origin] = (ts, rec.emitted_at - ts)
            records.append(rec)
        if offsets:
            self.apply(records, malformed, offsets, clock_offsets)
            try:
                self.consumer.commit(offsets=[TopicPartition(t, p, o)
                                              for (t, p), o in offsets.items()],
                                     asynchronous=True)
            except Exception as exc:   # noqa: BLE001 — the database is the record of truth
                log.debug("offset commit failed: %s", exc)
        return len(records) + sum(bad.values())

    def _check_window(self, rec) -> None:
        """Refuse a count record cut in windows of another length than this reconciler judges
        (``docket_common.window``): its tier's counts and the producers' would not cover the
        same time. An error the first time a (tier, emitter, length) is seen, then counted
        (``malformed``, reason ``window_mismatch``)."""
        window_ms = self.cfg["windows.window_ms"]
        if not isinstance(rec, AuditRecord) or rec.window_ms == window_ms:
            return
        exc = MalformedRecord(
            "window_mismatch", f"tier {rec.tier} (emitter {rec.emitter}) counts {rec.topic} in "
            f"windows of {rec.window_ms} ms, this reconciler judges windows of {window_ms} ms")
        key = (rec.tier, rec.emitter, rec.window_ms)
        if key not in self._windows_said:
            self._windows_said.add(key)
            log.error("refusing the audit records of tier %s (emitter %s): it counts in windows "
                      "of %d ms, this reconciler judges windows of %d ms (windows.window_ms) — "
                      "give every tier the same window (the agents' audit.window_ms, the jobs' "
                      "--window-ms); counted in reconcile_records_malformed_total"
                      "{reason=\"window_mismatch\"}", rec.tier, rec.emitter, rec.window_ms,
                      window_ms)
        raise exc

    def apply(self, records: list, malformed: dict[str, tuple[int, str]],
              offsets: dict[tuple[str, int], int],
              clock_offsets: dict[str, tuple[int, int]] | None = None) -> None:
        """One batch as read from the audit topic, in one transaction (``Store.apply``)."""
        self.store.apply(records, malformed, offsets, utc_iso(int(self.clock() * 1000)),
                         clock_offsets)
        self.applied += len(records)

    def ends(self) -> dict[int, int]:
        """Each assigned partition's current end (high watermark), asked of the brokers."""
        return {p: self.consumer.get_watermark_offsets(TopicPartition(self.topic, p),
                                                       timeout=10)[1] for p in self.partitions}

    def caught_up(self, ends: dict[int, int]) -> bool:
        """Every assigned partition read to ``ends`` (partition → an end taken before,
        ``ends()``). Positions, not the last offset applied: a transaction marker can end a
        partition."""
        if not self.partitions:
            return False
        stored = self.store.offsets(self.topic)
        positions = self.consumer.position([TopicPartition(self.topic, p)
                                            for p in self.partitions])
        for tp in positions:
            hi = ends.get(tp.partition, 0)
            at = tp.offset if tp.offset >= 0 else stored.get(tp.partition, 0)  # none fetched
            if at < hi:
                return False
        return True

    # -- the jobs ------------------------------------------------------------------------------
    def evaluate_job(self) -> Evaluation:
        store = Store(self.db_path)
        now_ms = int(self.clock() * 1000)
        try:
            result = evaluate(store, self.cfg, now_ms)
        finally:
            store.close()
        self.last_evaluation_ms = now_ms
        if result.fired or result.resolved:
            log.info("evaluated %d windows: %d alerts fired, %d resolved", result.windows,
                     result.fired, result.resolved)
        return result

    def deliver_job(self):
        store = Store(self.db_path)
        try:
            return Dispatcher(store.db, self.channels,
                              clock=self.clock).run_once()
        finally:
            store.close()

    # -- running -------------------------------------------------------------------------------
    def open(self) -> None:
        self.consumer = self._consumer()
        self._assign_new_partitions()

    def close(self) -> None:
        if self.consumer is not None:
            self.consumer.close()
        self.store.close()

    def run_once(self, timeout_s: float = 120.0) -> Evaluation:
        """Read the audit topic to its end as it is when the partitions are found (records
        that come meanwhile wait for the next run: a topic the agents keep writing to is never
        chased), evaluate, deliver once."""
        self.open()
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                self._assign_new_partitions()
                if self._due_ends is None and self.partitions:
                    self._due_ends = self.ends()   # what is read past them waits for next run
                if self._due_ends is not None and self.caught_up(self._due_ends):
                    break
                if time.monotonic() > deadline:
                    raise AuditError(f"the audit topic {self.topic} was not read to its end in "
                                     f"{timeout_s:g} s", hint="is the broker reachable? "
                                     "check --bootstrap-servers")
                self.consume_batch()
            result = self.evaluate_job()
            self.deliver_job()
            return result
        finally:
            self.close()

    def step(self) -> Evaluation | None:
        """Apply a batch of the audit topic; then, when an evaluation is due, evaluate — only
        with every partition read to the end it had when the evaluation fell due. A tier's
        counts and its progress record go to different partitions: judged in between, a tier
        whose progress says it is current but whose counts are still unread would show as a
        loss (seen: a reconciler restarted on a backlog fired and resolved a loss alert).
        The ends are taken once per evaluation, never chased: agents that write a round every
        few seconds keep the topic's *current* end ahead of any reader, and an evaluation
        that waited for it was put off until they stopped (seen: five agents on a loaded host,
        no window judged for 7 minutes). Records written after the ends were taken wait for
        the next evaluation. Evaluated here, in the consuming thread, nothing is applied while
        windows are judged. Whether the ends are reached is asked at most every
        ``CATCH_UP_CHECK_S``; a failed question or a failed evaluation is logged and tried
        again, never fatal."""
        self.consume_batch()
        now = time.monotonic()
        if self._evaluate_due is None:
            self._evaluate_due = now
        if now < self._evaluate_due or now < self._next_catch_up_check:
            return None
        behind_for = now - self._evaluate_due
        if self.partitions and not self._read_to_due_ends():
            if behind_for < CATCH_UP_WAIT_S:
                self._next_catch_up_check = now + CATCH_UP_CHECK_S
                return None
            log.warning("the audit topic has not been read to its end for %.0f s: evaluating "
                        "anyway (a tier's counts not yet read may show as missing)", behind_for)
        self._evaluate_due = now + self.cfg["reconcile.evaluate_interval_ms"] / 1000
        try:
            return self.evaluate_job()
        except Exception:                    # noqa: BLE001 — the next evaluation tries again
            log.exception("evaluation failed; trying again in %.0f s",
                          self.cfg["reconcile.evaluate_interval_ms"] / 1000)
            return None
        finally:
            self._due_ends = None
            self._release_held()

    def _read_to_due_ends(self) -> bool:
        """Every partition read to the end it had when this evaluation fell due (taken at the
        first question, and again when a partition was assigned since)."""
        try:
            if self._due_ends is None:
                self._due_ends = self.ends()
            return self.caught_up(self._due_ends)
        except KafkaException as exc:
            log.warning("cannot tell whether the audit topic is read to its end: %s", exc)
            return False

    def run(self) -> None:
        listen = self.cfg["reconcile.listen"]
        if listen:
            self.metrics = MetricsServer(listen, self).start()
            log.info("metrics on http://%s:%d/metrics", self.metrics.host, self.metrics.port)
        try:
            self._run()
        finally:
            if self.metrics is not None:
                self.metrics.stop()
                self.metrics = None

    def _run(self) -> None:
        from apscheduler.schedulers.background import BackgroundScheduler
        self.open()
        scheduler = BackgroundScheduler(timezone=dt.UTC)
        every = {"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        scheduler.add_job(self.deliver_job, "interval", id="deliver", **every,
                          seconds=self.cfg["reconcile.deliver_interval_ms"] / 1000)
        scheduler.start()
        log.info("reconciling %s into %s", self.topic, self.db_path)
        next_metadata = time.monotonic() + METADATA_EVERY_S
        try:
            while not self.stop_event.is_set():
                self.step()
                if time.monotonic() >= next_metadata:
                    self._assign_new_partitions()
                    next_metadata = time.monotonic() + METADATA_EVERY_S
        finally:
            scheduler.shutdown(wait=True)
            self.close()
            log.info("stopped after applying %d audit records", self.applied)
