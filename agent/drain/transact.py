"""Exactly once into Kafka (``broker.delivery = "exactly_once"``): sealed slots go in Kafka
transactions, each carrying the agent's progress marker, so a restart knows which slots
Kafka committed and a read_committed consumer sees every event once.

One transaction at a time, over a bounded group of slots: slots join it while it is younger
than ``transaction_ms`` and holds fewer than ``max_slots``; it commits when all its records are
handed over and reported, and either it is old or full or the agent has caught up (no other
sealed slot waits: at low rates a record does not wait out ``transaction_ms``). With its
records, the transaction commits the **progress marker**: an offset of the agent's own
consumer group (``transactional.id`` and group id are both ``docket-agent-<agent id>``) on
partition 0 of the progress topic, whose metadata names the slots of the transaction (their
first record number and record count) and the agent's incarnation. Offsets committed in a
transaction become visible with it, atomically with the records (Kafka's ``TxnOffsetCommit``).

Slots are freed (and their files' positions acknowledged) only after the commit returned,
before the next transaction begins: so at any moment the only slots Kafka committed that the
pool may still hold are those the marker names. The crash points, and what a restart does:

- before the commit (records written, marker sent or not): ``init_transactions`` of the new
  producer fences the old one and aborts its open transaction; the marker still names the
  previous transaction, whose slots are gone from the pool: every slot found is sent again.
  read_committed readers never see the aborted copies.
- during the commit (the request sent, the answer not heard): the coordinator either wrote
  its decision or not; ``init_transactions`` completes a commit it decided and aborts one it
  did not; the marker read afterwards (read_committed) says which, and the slots it names are
  freed without being sent.
- after the commit, before or while the slots were freed: the marker names them; those still
  in the pool are freed without being sent.

A producer that a fatal error replaced, or whose commit ended with an unknown outcome, is
followed by the same reading of the marker. Any failed record (a retriable error, a purge in
an outage, a topic refused) makes the transaction abortable: a new producer takes over (its
``init_transactions`` aborts the transaction and fences the old one) and the slots are sent
again in the next transaction, but for records dead-lettered (they are journaled as in the
at-least-once mode). A record refused with its batch as too large sends the group again from
a producer that puts one record in each batch, once; a record refused alone is dead. A topic
refused (an ACL missing) holds its slots aside, tried again every ``DENIED_RETRY_S``, while
the other topics go on.

The client calls that wait for the cluster (``init_transactions``, the marker's read,
``send_offsets_to_transaction`` with ``commit_transaction``) run in a
thread of their own (``_Job``), one at a time; the agent's loop keeps reading files into the
pool meanwhile and only waits for the job to end before it produces again.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from broker.admin import TopicSpec, ensure_topics
from broker.security import AGENT_TXN_PREFIX

from ..buffer import SealedSlot
from .drain import DENIED_RETRY_S, OUTAGE_AFTER_S, PROBE_INTERVAL_S, PUMP_BUDGET, Drain
from .probe import cluster_answers
from .slotsend import SlotSend
from .topics import connection_conf

log = logging.getLogger("docket.agent.drain")

PROGRESS_TOPIC = "docket.progress"
MARKER_PARTITION = 0
MARKER_VERSION = 1
CALL_TIMEOUT_S = 10.0           # one wait of a transaction call for the cluster
PURGE_AGAIN_S = 0.5             # a failed transaction's queue purged again this often
RETRY_PAUSE_S = 0.5             # between a call's retriable failures


# Answers that say "ask again": the coordinator is moving or loading (a broker restarted).
_COORDINATOR_MOVING = {KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                       KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                       KafkaError.CONCURRENT_TRANSACTIONS, KafkaError.REQUEST_TIMED_OUT,
                       KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                       KafkaError._ALL_BROKERS_DOWN, KafkaError._WAIT_COORD}
# The cluster refuses this agent what the mode needs: an ACL missing (docs/security.md).
_REFUSALS = {KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
             KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED,
             KafkaError.CLUSTER_AUTHORIZATION_FAILED}
# A call still unanswered this long while a new client's metadata request is answered: the
# producer is wedged (seen here after a 30 s broker pause: its metadata requests timed out for
# minutes while other clients were answered). A new producer fences it and goes on.
WEDGED_AFTER_S = 15.0


def transactional_id(agent_id: str) -> str:
    """The agent's ``transactional.id``, also the group its progress marker is committed in
    (``broker.security.AGENT_TXN_PREFIX``: the ACLs of ``acl grant --exactly-once``)."""
    return f"{AGENT_TXN_PREFIX}{agent_id}"


def let_go(producer) -> None:
    """Drop a replaced producer in a thread of its own: destroying a client whose connection
    does not answer can wait for it, and the agent's loop must not."""
    holder = [producer]
    del producer                       # the caller lets go of its own reference at once
    threading.Timer(1.0, holder.clear).start()


class TransactionsRefused(Exception):
    """The cluster refuses this agent transactions or its marker (an ACL, the topic): said in
    status and the log; tried again every ``DENIED_RETRY_S``."""


class _Job:
    """One blocking client call (or a few in a row) in a thread of its own."""

    def __init__(self, name: str, fn: Callable[[], object]):
        self.name = name
        self.result: object = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(fn,), daemon=True,
                         name=f"docket-txn-{name}").start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            self.result = fn()
        except BaseException as exc:          # handed to the agent's loop, which decides
            self.error = exc
        finally:
            self.done.set()

    def kafka_error(self) -> KafkaError | None:
        if isinstance(self.error, KafkaException):
            return self.error.args[0]
        return None


def marker_value(incarnation: str, slots: list[SealedSlot]) -> str:
    """The metadata of the progress marker: which slots (first record number, record count,
    and the slot's sequence number, for people) the transaction holds."""
    return json.dumps({"v": MARKER_VERSION, "incarnation": incarnation,
                       "slots": [[s.first_record, s.record_count, s.seq] for s in slots]},
                      separators=(",", ":"))


def parse_marker(text: str | None, incarnation: str) -> set[tuple[int, int]]:
    """The slots (first record, count) a committed marker names for this incarnation; none
    for another incarnation's (the state was recreated: its numbers mean other records)."""
    if not text:
        return set()
    try:
        doc = json.loads(text)
        if doc.get("v") != MARKER_VERSION or doc.get("incarnation") != incarnation:
            return set()
        return {(int(first), int(count)) for first, count, *_ in doc["slots"]}
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        log.error("progress marker unreadable (%s): %r; every slot in the pool is sent again "
                  "(duplicates possible)", exc, text[:200])
        return set()


class TransactionalDrain(Drain):
    """The drain of ``broker.delivery = "exactly_once"``. ``crash_point``: a test's hook,
    called with the name of each step of a transaction (``txn:produced``,
    ``txn:before_commit``, ``txn:committed``, ``txn:freed``)."""

    def __init__(self, *args, agent_id: str, incarnation_id: str,
                 progress_topic: str = PROGRESS_TOPIC, transaction_ms: float = 250.0,
                 max_slots: int = 32, transaction_timeout_ms: int = 60_000,
                 consumer_factory: Callable[[dict], Consumer] | None = None,
                 crash_point: Callable[[str], None] | None = None, **kwargs):
        self.txn_id = transactional_id(agent_id)
        self.incarnation_id = incarnation_id
        self.progress_topic = progress_topic
        self.transaction_s = transaction_ms / 1000
        self.max_slots = max_slots
        self.transaction_timeout_ms = transaction_timeout_ms
        self.consumer_factory = consumer_factory or Consumer
        self.crash_point = crash_point or (lambda _name: None)
        self.job: _Job | None = None
        self.ready = False               # transactions initialised and the marker read
        self.began: float | None = None  # the open transaction's first hand-over
        self.broken = False              # a record of it failed: abort, then send again
        self._purge_again_at = 0.0       # ... its queue purged again at this time
        self.lone_mode = False           # this attempt sends one record per batch
        self.aside: list[SlotSend] = []  # taken, out of the transaction: a refused topic's,
        #                                  or waiting behind a slot sent one record per batch;
        #                                  in the pool's order, taken again before new slots
        self._consumer: Consumer | None = None
        self._closing = False
        self._job_began = 0.0
        self._job_probe: _Job | None = None      # does the cluster answer, a job waiting?
        self._down_from: str | None = None       # the state before a job said unreachable
        self._rebuild_later = False      # transactions refused: a new producer at ...
        self._retry_init_at = 0.0        # ... this time
        super().__init__(*args, **kwargs)
        self.broker_state = "initialising transactions"

    # -- the client ---------------------------------------------------------------------------
    def _new_producer(self):
        return self.producer_factory({**self.conf, "error_cb": self._on_error,
                                      "delivery.report.only.error": True,
                                      **self._producer_overrides()})

    def _lone_producer(self):
        raise AssertionError("the transactional drain sends records alone by lone_mode")

    def _producer_overrides(self) -> dict:
        """The settings a transactional producer adds to the agent's (both send paths)."""
        extra = {"transactional.id": self.txn_id,
                 "transaction.timeout.ms": self.transaction_timeout_ms,
                 # a record waits at most the transaction's life: then the transaction aborts
                 # and its slot goes again (the pool keeps the data meanwhile)
                 "message.timeout.ms": self.transaction_timeout_ms}
        if self.lone_mode:
            extra.update({"batch.num.messages": 1, "linger.ms": 0})
        return extra

    # The client of the transaction calls, and what the drain does to its producer: the
    # Python path's here; the native path's in ``native_txn.py``.
    def _txn(self):
        """The client the transaction calls go to: confluent-kafka's calls and errors."""
        return self.producer

    def _group_metadata(self):
        """The progress marker's group, as ``send_offsets_to_transaction`` takes it."""
        return self._marker_consumer().consumer_group_metadata()

    def _purge_queued(self) -> None:
        """Take back what waits in the client's queue (a failed transaction sends no more)."""
        self.producer.purge(in_queue=True, in_flight=False)

    def _swap_producer(self) -> None:
        """A new producer in place of the old one, let go of without waiting for it."""
        old = self.producer
        try:
            old.purge(in_queue=True, in_flight=True)
            old.poll(0)
        except KafkaException:             # a producer in a fatal state: let it go as it is
            pass
        self.producer = self._new_producer()
        let_go(old)
        del old

    def _abort_open(self) -> None:
        """At stop: the open transaction's records purged, the transaction aborted."""
        self.producer.purge(in_queue=True, in_flight=True)
        self.producer.poll(0)
        self.producer.abort_transaction(CALL_TIMEOUT_S)

    def _flush_at_stop(self) -> None:
        self.producer.flush(0)

    def _marker_consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = self.consumer_factory({
                **connection_conf(self.conf), "group.id": self.txn_id,
                "enable.auto.commit": False, "isolation.level": "read_committed"})
        return self._consumer

    # -- jobs ---------------------------------------------------------------------------------
    def _run_job(self, name: str, fn: Callable[[], object]) -> None:
        self.job = _Job(name, fn)
        self._job_began = self._now()

    def _watch_job(self) -> None:
        """A job waiting long: does the cluster answer another client? If not, say so (one
        call can wait 30 s and more for a broker that does not answer: librdkafka's own
        request timeout)."""
        if self._now() - self._job_began < OUTAGE_AFTER_S or self._down_from is not None:
            return
        if self._job_probe is None:
            self._job_probe = _Job("probe", self._cluster_answers)
        elif self._job_probe.done.is_set():
            answered, self._job_probe = self._job_probe.result, None
            if answered is False:
                self._unreachable(f"{self.job.name}: no answer for "
                                  f"{self._now() - self._job_began:.0f} s")

    def _unreachable(self, why: str) -> None:
        """The cluster does not answer while a transaction call waits: said as the outage
        guard says it (status, metrics), once."""
        if self._down_from is not None:
            return
        self._down_from = self.broker_state
        log.warning("%s; the pool keeps the data, trying again", why)
        self.broker_state = "unreachable"
        self.metrics.set("agent_drain_broker_up", 0)
        self.metrics.inc("agent_drain_outages_total")

    def _answers_again(self) -> None:
        if self._down_from is None:
            return
        before, self._down_from = self._down_from, None
        log.warning("the cluster answers again: resuming")
        refused = before.startswith(("not authorised", "authentication failed"))
        self.broker_state = before if refused else "up"
        self.metrics.set("agent_drain_broker_up", 1)

    def _retrying(self, call: Callable[[], object], what: str) -> object:
        """``call`` until it succeeds or fails for good; retriable failures (the cluster does
        not answer, a coordinator moving) are waited out, the agent's loop running on."""
        began = self._now()
        while not self._closing:
            try:
                result = call()
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal() or err.txn_requires_abort() or not (
                        err.retriable() or err.code() in _COORDINATOR_MOVING):
                    raise
                waited = self._now() - began
                if self._down_from is not None and waited >= WEDGED_AFTER_S \
                        and self._cluster_answers():
                    raise KafkaException(KafkaError(
                        KafkaError._TIMED_OUT, f"{what}: no answer for {waited:.0f} s while "
                        f"the cluster answers a new client: the producer is replaced")) from exc
                if waited >= OUTAGE_AFTER_S:
                    self._unreachable(f"{what}: no answer for {waited:.0f} s ({err.str()})")
                self.clock.sleep(RETRY_PAUSE_S)
                continue
            self._answers_again()
            return result
        raise KafkaException(KafkaError(KafkaError._DESTROY, "the agent is stopping"))

    def _init(self) -> set[tuple[int, int]]:
        """Fence the previous producer of this ``transactional.id`` (its open transaction is
        aborted, or completed if its commit was decided), make sure the progress topic
        exists, then read the committed marker."""
        producer = self._txn()
        self._retrying(lambda: producer.init_transactions(CALL_TIMEOUT_S),
                       "initialising transactions")
        self._ensure_progress_topic()
        consumer = self._marker_consumer()
        [tp] = self._retrying(lambda: consumer.committed(
            [TopicPartition(self.progress_topic, MARKER_PARTITION)], CALL_TIMEOUT_S),
            "reading the progress marker")
        if tp.error is not None:
            raise KafkaException(tp.error)
        return parse_marker(tp.metadata, self.incarnation_id)

    def _ensure_progress_topic(self) -> None:
        try:
            ensure_topics(self.conf["bootstrap.servers"],
                          [TopicSpec(self.progress_topic, partitions=1)],
                          timeout_s=CALL_TIMEOUT_S, client={
                              k: v for k, v in connection_conf(self.conf).items()
                              if k != "bootstrap.servers"})
        except Exception as exc:
            raise TransactionsRefused(
                f"the progress topic {self.progress_topic} is missing and could not be "
                f"created ({exc}). Create it (docket-broker topic ensure "
                f"{self.progress_topic} --partitions 1) or let the agent create it") from exc

    def _commit(self, slots: list[SealedSlot], through: int) -> None:
        self.crash_point("txn:produced")
        marker = TopicPartition(self.progress_topic, MARKER_PARTITION, through,
                                metadata=marker_value(self.incarnation_id, slots))
        group = self._group_metadata()
        producer = self._txn()
        self._retrying(lambda: producer.send_offsets_to_transaction(
            [marker], group, CALL_TIMEOUT_S), "sending the progress marker")
        self.crash_point("txn:before_commit")
        self._retrying(lambda: producer.commit_transaction(CALL_TIMEOUT_S),
                       "committing a transaction")

    def _job_ended(self, job: _Job) -> None:
        """The agent's loop takes the outcome of a job."""
        self._job_probe = None
        err = job.kafka_error()
        if job.error is None:
            self._answers_again()
        if job.error is not None and err is None:
            if isinstance(job.error, TransactionsRefused):
                self._refuse_for_now(str(job.error))
                return
            raise job.error                   # a crash point's, or a bug: not hidden
        if job.name == "init":
            if err is not None:
                self._init_failed(err)
                return
            self._initialised(job.result)
        elif job.name == "commit":
            if err is None:
                self._committed()
            elif err.txn_requires_abort():
                self._abort_and_send_again(f"commit refused: {err.str()}")
            else:                              # fatal, or the outcome unknown
                self._fatal = err

    def _init_failed(self, err: KafkaError) -> None:
        if not self._refused_by_acl(err):
            self._fatal = err

    def _refused_by_acl(self, err: KafkaError) -> bool:
        """An ACL the exactly-once mode needs is missing: said, and tried again later."""
        if err.code() not in _REFUSALS:
            return False
        self._refuse_for_now(
            f"{err.name()}: the agent's principal needs Write on transactional id "
            f"{self.txn_id}, Read on group {self.txn_id} and Read on topic "
            f"{self.progress_topic} (docket-broker acl grant --role agent --exactly-once; "
            f"docs/security.md)")
        return True

    def _poll(self, timeout_s: float = 0) -> None:
        """As the drain's; a fatal error that poll raises (a transactional producer's) is
        taken as the error callback's."""
        try:
            super()._poll(timeout_s)
        except KafkaException as exc:
            err = exc.args[0]
            if not err.fatal():
                raise
            self._fatal = err

    def _refuse_for_now(self, why: str) -> None:
        """Transactions cannot start: events wait in the pool; tried again later."""
        if self.broker_state != f"transactions refused: {why}":
            log.error("broker: transactions refused: %s. Events wait in the pool; trying "
                      "again every %.0f s", why, DENIED_RETRY_S)
        self.broker_state = f"transactions refused: {why}"
        self.metrics.set("agent_drain_broker_up", 0)
        self._retry_init_at = self._now() + DENIED_RETRY_S
        self._rebuild_later = True

    def _initialised(self, covered: set[tuple[int, int]]) -> None:
        """The previous producer fenced; free the slots its last committed transaction
        holds (they are in Kafka), and send the rest."""
        self.ready = True
        if self.broker_state.startswith("transactions refused"):
            log.warning("broker: transactions accepted: waiting events go")
        if not self._refused():              # a refused topic stays said until accepted
            self.broker_state = "up"
            self.metrics.set("agent_drain_broker_up", 1)
        freed = [s for s in self.pool.sealed() if self._covers(covered, s)]
        seqs = {s.seq for s in freed}
        for send in [*self.inflight, *self.aside]:   # sent or set aside before: not again
            if send.slot.seq in seqs:
                (self.inflight if send in self.inflight else self.aside).remove(send)
                send.retired = True
        for slot in freed:
            self._free_committed(slot)
        if freed:
            log.warning("%d slot(s) found committed by the last transaction (%d records): "
                        "freed without sending them again", len(freed),
                        sum(s.record_count for s in freed))
            self.metrics.inc("agent_drain_committed_found_total", len(freed))

    @staticmethod
    def _covers(covered: set[tuple[int, int]], slot: SealedSlot) -> bool:
        return slot.record_count > 0 and (slot.first_record, slot.record_count) in covered

    # -- sending ------------------------------------------------------------------------------
    def pump(self, budget: int = PUMP_BUDGET, reports: bool = True) -> int:
        """``reports=False`` hands nothing over: every step of a transaction serves reports."""
        if not reports:
            return 0
        if self.job is not None:
            self._poll()
            if not self.job.done.is_set():
                self._watch_job()
                return 0
            job, self.job = self.job, None
            self._job_ended(job)
        if self._rebuild_later:
            if self._now() < self._retry_init_at:
                return 0
            self._rebuild_later = False
            self._replace_why = "transactions_refused"
        if self._fatal is not None and self._refused_by_acl(self._fatal):
            self._fatal = None
            return 0
        if self._to_replace():
            self._rebuild()
        if not self.ready:
            self._run_job("init", self._init)
            return 0
        self._poll()
        if self.outage:
            if self._probe_ok.is_set():
                self._end_outage()          # a new producer at the next turn
            return 0
        if self.inflight and self.broken:
            # A failed transaction sends nothing more (librdkafka holds its queue until the
            # records time out): purged, the requests in flight answer, then it goes again.
            # Records the client queues again after a purge (those of a request in flight
            # answered with an error it retries) would wait out their timeout too: the queue
            # is purged again while records are out, every PURGE_AGAIN_S.
            if self._outstanding() and self._now() >= self._purge_again_at:
                self._purge_queued()
                self._purge_again_at = self._now() + PURGE_AGAIN_S
                self._poll()
            if self._outstanding() == 0:
                self._abort_and_send_again("a record failed")
            else:
                self._watch_progress()
            return 0
        if self._fatal is not None:
            return 0                          # a new producer at the next turn
        sent = self._produce(budget)
        self._poll()
        if self.broken:
            return sent
        if self._due(caught_up=sent < budget) and self._outstanding() == 0:
            self._begin_commit()
        else:
            self._watch_progress()
        return sent

    def _produce(self, budget: int) -> int:
        """Hand over the open transaction's records, taking slots into it while it is young
        and not full."""
        sent = 0
        while sent < budget:
            send = next((s for s in self.inflight if s.unsent), None)
            if send is None:
                if not self._room():
                    break
                send = self._next_send()
                if send is None:
                    break
            if self.began is None:
                try:
                    self._txn().begin_transaction()
                except KafkaException as exc:     # a fatal error not yet served
                    self._fatal = exc.args[0]
                    break
                self.began = self._now()
            n, blocked = self._produce_new(send, budget - sent)
            sent += n
            if blocked:
                break
        return sent

    def _room(self) -> bool:
        most = 1 if self.lone_mode else self.max_slots
        return len(self.inflight) < most and (
            self.began is None or self._now() - self.began < self.transaction_s)

    def _next_send(self) -> SlotSend | None:
        """The next slot for the open transaction: the oldest set aside whose topic is not
        refused (a refused topic's goes again once per ``DENIED_RETRY_S``, its oldest slot
        first), else the oldest sealed slot (one of a refused topic is set aside). Slots of a
        topic, so of a source, thus commit in the pool's order: the acknowledged offsets stay
        contiguous (``Drain._complete``)."""
        tried: set[str] = set()
        for send in self.aside:
            topic = send.slot.topic
            if topic in tried:
                continue                      # an older slot of it waits: not this one
            tried.add(topic)
            if not self._held(topic):
                self.aside.remove(send)
                if topic in self._denied:     # still refused: one try per DENIED_RETRY_S
                    self._denied[topic] = self._now() + DENIED_RETRY_S
                self.inflight.append(send)
                return send
        while True:
            taken = self.pool.take(1)
            if not taken:
                return None
            send = self._start(taken[0])
            if send.slot.topic in tried or self._held(send.slot.topic):
                self._set_aside([send])
                continue
            self.inflight.append(send)
            return send

    def _set_aside(self, sends: list[SlotSend]) -> None:
        """Out of the transaction, kept in the pool's order."""
        order = {slot.seq: i for i, slot in enumerate(self.pool.sealed())}
        self.aside.extend(sends)
        self.aside.sort(key=lambda s: order.get(s.slot.seq, -1))

    def _due(self, caught_up: bool) -> bool:
        if not self.inflight or any(s.unsent for s in self.inflight):
            return False
        return caught_up or not self._room()

    def _begin_commit(self) -> None:
        slots = [s.slot for s in self.inflight]
        through = max(s.first_record + s.record_count for s in slots)
        self._run_job("commit", lambda: self._commit(slots, through))

    def _committed(self) -> None:
        """The transaction is in Kafka: free its slots, oldest first, before anything else."""
        self.crash_point("txn:committed")
        self.metrics.inc("agent_drain_transactions_committed_total")
        done, self.inflight = list(self.inflight), collections.deque()
        self.began, self.broken = None, False
        for send in done:
            self._finish(send)
            self.crash_point("txn:freed")
        if self.lone_mode:                   # the records refused with their batch went
            self.lone_mode = False
            self._replace_why = "one_per_batch_done"

    def _free_committed(self, slot: SealedSlot) -> None:
        """A slot the marker names, found in the pool after a restart or a new producer (as
        the pool holds it now: a socket source's thread may have spilled it meanwhile)."""
        slot = next((s for s in self.pool.sealed() if s.seq == slot.seq), None)
        if slot is None:
            return                            # dropped meanwhile (journaled by the pool)
        if self.on_slot_done is not None:
            self.on_slot_done(slot)
        self.pool.free(slot)

    def _finish(self, send: SlotSend) -> None:
        if send.slot.topic in self._denied:  # a refused topic took a transaction: accepted
            self._accepted(send.slot.topic)
        super()._finish(send)

    def _abort_and_send_again(self, why: str) -> None:
        """Abort the open transaction; its slots go again in the next one, from their first
        record but for the dead-lettered ones. Reports still coming for them are ignored."""
        old = list(self.inflight)
        lone = any(s.alone for s in old) and not self.lone_mode
        log.warning("transaction aborted (%s): its %d slot(s) go again%s", why, len(old),
                    ", one record per batch" if lone else "")
        again = [self._again(s) for s in old]
        self.began, self.broken, self._purge_again_at = None, False, 0.0
        self.lone_mode = self.lone_mode or lone
        # The next transaction: in one record per batch, only the oldest slot (each such
        # transaction commits one slot at least, and none outlives its timeout); the rest,
        # and a refused topic's slots, wait aside in order.
        keep = [s for s in again if s.slot.topic not in self._denied]
        keep = keep[:1] if self.lone_mode else keep
        self.inflight = collections.deque(keep)
        self._set_aside([s for s in again if s not in keep])
        # A new producer: its init_transactions aborts the open transaction (and gives a new
        # epoch). Aborting with the same producer, then producing on, was seen to leave the
        # next transaction's records unsent until their timeout (librdkafka 2.16, after an
        # error that "requires epoch bump").
        self._replace_why = "transaction_aborted"
        self.metrics.inc("agent_drain_transactions_aborted_total")

    # -- outcomes -----------------------------------------------------------------------------
    def failed(self, send: SlotSend, record, err: KafkaError, alone: bool = False) -> None:
        """A record failed: the transaction cannot commit. Dead records are dead-lettered now
        (they are left out when the slot goes again); the rest go again with their slot."""
        if send.retired:
            return
        self.broken = True
        super().failed(send, record, err, alone=alone or self.lone_mode)

    def _begin_outage(self) -> None:
        super()._begin_outage()
        self.broken = bool(self.inflight)     # purged records: the transaction must abort

    def _cluster_answers(self) -> bool:
        """Does the cluster answer a metadata request of a new client? (After a long pause the
        producer's own requests may stay unanswered while the cluster is back.)"""
        return cluster_answers(self.conf, self.probe_factory, PROBE_INTERVAL_S)

    def _end_outage(self) -> None:
        """The cluster is back: a new producer fences the old one (aborting its transaction,
        whose records were purged) and the marker is read again."""
        super()._end_outage()
        self._replace_why = "outage_ended"

    def _rebuild(self) -> None:
        """A new producer (after a fatal error, new settings, or to send records alone):
        the old one's open transaction is aborted by the new one's ``init_transactions``,
        which also completes a commit the coordinator had decided; the marker read then says
        whether the open group was committed."""
        if self._fatal is not None:
            why = "fatal"
            log.error("fatal producer error (%s): a new transactional producer fences the old "
                      "one", self._fatal)
        else:
            why = self._replace_why or "settings"
        self.metrics.inc("agent_drain_producer_replacements_total", reason=why)
        self._fatal, self._reconfigured, self._replace_why = None, False, None
        self.inflight = collections.deque(self._again(s) for s in self.inflight)
        self.began, self.broken, self.ready, self._purge_again_at = None, False, False, 0.0
        self._swap_producer()
        if self._consumer is not None:        # new settings (a reload) reach it too
            self._consumer.close()
            self._consumer = None
        self._fresh_start()

    # -- stopping -----------------------------------------------------------------------------
    def idle(self) -> bool:
        return self.job is None and not self.inflight and not self.aside \
            and not self.pool.sealed()

    def close(self) -> None:
        """Stop: an open transaction is aborted (bounded), so read_committed readers are not
        held up until its timeout; its slots stay in the pool for the next start."""
        self._closing = True
        if self.job is not None and not self.job.done.wait(2 * CALL_TIMEOUT_S + RETRY_PAUSE_S):
            log.warning("a transaction call still waits for the cluster at stop: not waiting "
                        "for it (what it covers stays in the pool for the next start)")
            return
        if self.began is not None and self.ready:
            try:
                self._abort_open()
            except KafkaException as exc:
                log.warning("open transaction not aborted at stop (%s): read_committed "
                            "readers wait for its timeout (%d ms) or the next start",
                            exc.args[0].str(), self.transaction_timeout_ms)
        self._flush_at_stop()
        if self._consumer is not None:
            self._consumer.close()

    def describe(self) -> str:
        return super().describe() + f", exactly once (transactional.id {self.txn_id})"
