"""Send sealed slots to Kafka in sequence order; free each slot once all its records are
acknowledged; keep librdkafka from burning a core while the cluster is unreachable.

Acknowledgements without a Python call per record: the client runs with
``delivery.report.only.error``, so a record's callback runs only when it failed (a report
classified RETRY keeps the record for sending again; DEAD writes it to ``dead-letter/`` and the
loss journal). Success is known in bulk: when ``len(producer)`` is 0 after a poll, every record
handed to librdkafka so far has been acknowledged or reported failed. The drain numbers the
records it hands over; a slot whose records were all handed over before such a *zero point*, and
that has none waiting to go again, is complete. To reach zero points under a steady load the
drain stops taking slots once ``MAX_INFLIGHT_SLOTS`` are in flight and resumes when they
complete (measured here: a success callback per record costs 0.4–0.8 µs of the ~2.5 µs a
record costs the client in all).

Liveness (outages and stalls): librdkafka 2.16 with idempotence spins its broker thread at 100%
of a core while messages wait for an unreachable broker (measured here: 14.5 CPU-seconds in a
15 s pause, 0.02 with an empty queue). So when no delivery report has arrived for
``OUTAGE_AFTER_S`` while records are outstanding, the drain asks whether the cluster answers at
all — a new client's metadata request (``probe.Probe``), never its own producer's, which may be
the part that stopped. If the cluster does not answer, this is an outage: the drain purges
librdkafka's queue (not the requests in flight, which finish when the broker is back; purged
records come back as RETRY reports, and their data never left its slot), stops producing, and a
background thread asks again every ``PROBE_INTERVAL_S``. When it answers, sending resumes.
Measured with the queue purged: 0.01 CPU-seconds in 12 s of outage.

If the cluster answers while the producer has nothing acknowledged, librdkafka may be riding
out a failover (a leader moving, an in-sync replica being dropped after
``replica.lag.time.max.ms``, 30 s by Kafka's default), so the drain waits — but not for ever:
after ``STALL_AFTER_S`` without a report while the cluster answers, or ``RESUME_STALL_S`` when
the producer lived through an outage that just ended, the producer is *stalled*. It is
replaced like one after a fatal error (below: slots whose records it never reported go again
whole, under the same record numbers), status says ``stalled`` with how long and since when,
and ``agent_drain_producer_replacements_total{reason="stalled"}`` counts it. Seen here before
this rule: after a 30 s broker pause, a metadata answer given while the resuming broker was
fenced listed no broker, librdkafka dropped the only one its producer knew, and that producer
never connected again, while status said ``up`` (docs/agent.md, "Outages and stalls"); a
producer replaced once is held to ``STALL_AFTER_S`` again. ``RESTART_AFTER_STALLS`` replacements
in a row with nothing acknowledged make ``wedged()`` true: the service then stops feeding
systemd's watchdog, and systemd starts the agent again (every slot waits in the pool).

Too large, alone or with its batch: the broker checks ``max.message.bytes`` against a whole
batch and refuses all of it, so a MSG_SIZE_TOO_LARGE report from the batching producer says
nothing about one record (measured with librdkafka 2.16: a topic limit of 16 KiB under a
batch.size of 1 MiB, and 20,000 records of 100 bytes all came back too large). Such a record is
sent again *alone*, by a second producer that puts one record in each batch
(``batch.num.messages`` = 1); only a record refused when alone is dead-lettered.

A fatal error replaces the producer. Its reports served within ``PURGE_WAIT_S`` are used; a
slot with a record handed over after the last zero point, or sent alone and not yet reported,
has no known completion: it is sent again whole (but for the records already dead-lettered, and
on the native path the prefix Kafka acknowledged) by a new ``SlotSend``, and the old one is
retired, so a late report of the old producer changes nothing. Duplicates after a fatal error,
never a slot freed on a guess.
"""

from __future__ import annotations

import collections
import functools
import logging
import select
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException, Producer

from docket_common.names import (
    CONTINUED_HEADER,
    INCARNATION_HEADER,
    ORIGIN_HEADER,
    PART_HEADER,
    SEQ_HEADER,
)

from ..buffer import BufferPool, SealedSlot
from ..buffer.layout import Geometry
from ..buffer.seams import Clock
from ..state.diskguard import disk_full
from ..state.journal import LossJournal
from ..telemetry import Metrics
from .deadletter import write_dead_letter
from .headers import BlockHeaders, Record, record_number
from .outcome import Outcome, classify, reason
from .probe import Probe, admin_client, cluster_answers
from .slotsend import SlotSend

OUTAGE_AFTER_S = 2.0
PROBE_INTERVAL_S = 1.0
# Nothing acknowledged this long while the cluster answers a new client: the producer is
# stalled (a failover librdkafka rides out takes less: a leader moved, or an in-sync replica
# dropped after Kafka's replica.lag.time.max.ms, 30 s, while our requests time out after 10 s
# and go again: socket.timeout.ms, producer.py).
STALL_AFTER_S = 45.0
# ... or this long after an outage ended: the producer lived through it, and the cluster just
# answered (catch-up after a 30 s pause takes 1-4 s here, its first acknowledgement well under
# a second).
RESUME_STALL_S = 5.0
# Replacements in a row with nothing acknowledged before ``wedged()``: the service stops
# feeding systemd's watchdog, which restarts the agent.
RESTART_AFTER_STALLS = 3
PURGE_WAIT_S = 2.0
MAX_INFLIGHT_SLOTS = 8
# The native path hears of each slot when it is done (no zero point to reach): it takes slots
# while those on their way hold less than ``MAX_INFLIGHT_SLOTS`` full ones' bytes, up to this
# many — and up to a quarter of the pool's slots (at least ``MAX_INFLIGHT_SLOTS``): a slot on
# its way cannot be spilled or dropped to make room, however little it holds. Eight slots at a
# time kept about 200 small slots waiting (a second of latency) at 10,000 lines/s over 100
# files, each slot holding a few files' lines; 64 kept none waiting.
NATIVE_MAX_INFLIGHT_SLOTS = 64
PUMP_BUDGET = 20000               # records one pump produces at most
# A topic the cluster refuses this client (an ACL missing): its records wait in their slots
# and go again this often, so a granted ACL takes effect by itself (outcome.DENIED).
DENIED_RETRY_S = 5.0
# produce() takes its arguments positionally here: (topic, value, key, partition, on_delivery,
# callback, timestamp, headers), the order of confluent-kafka's C keyword list. Keywords cost
# ~0.5 µs per call in argument parsing (measured here: 2.2 µs → 1.5 µs per produce with a
# header, a timestamp and a callback); tests/unit/test_drain_produce.py pins the order.
NO_PARTITION = -1

log = logging.getLogger("docket.agent.drain")

def _real_producer(conf: dict) -> Producer:
    """The transport: a confluent-kafka Producer logging through docket's logger."""
    return Producer(conf, logger=logging.getLogger("docket.agent.librdkafka"))


def _credentials_keys(conf: dict) -> str:
    """The settings that hold this client's SASL credentials, for the refusal's line."""
    if conf.get("sasl.mechanism") == "OAUTHBEARER":
        return ("[broker] sasl_oauthbearer_client_id and sasl_oauthbearer_client_secret_file, "
                f"and that {conf.get('sasl.oauthbearer.token.endpoint.url')} grants them an "
                "unexpired token (a valid token, once granted, needs no reload)")
    if conf.get("sasl.mechanism") == "GSSAPI":
        return ("[broker] sasl_kerberos_principal and sasl_kerberos_keytab_file (the key of "
                f"{conf.get('sasl.kerberos.principal')} in that keytab, as the KDC of "
                "krb5.conf holds it), that the KDC answers (once it does, its ticket needs no "
                "reload), and the brokers' service principal (sasl_kerberos_service_name "
                f"{conf.get('sasl.kerberos.service.name')!r})")
    return "[broker] sasl_username and sasl_password_file"


def _certificate_refused(err: KafkaError) -> bool:
    """A broker that refuses this client's certificate (mutual TLS) closes the handshake:
    librdkafka reports a transport error whose text names the certificate."""
    return err.code() == KafkaError._TRANSPORT and "certificate" in err.str().lower()


def room_in_flight(held: list[int], geometry: Geometry, native: bool) -> bool:
    """Whether the drain takes another slot while slots holding ``held`` bytes (each one's,
    as taken) are on their way, in a pool of ``geometry``."""
    if not native:
        return len(held) < MAX_INFLIGHT_SLOTS
    most = max(MAX_INFLIGHT_SLOTS, min(NATIVE_MAX_INFLIGHT_SLOTS, geometry.slot_count // 4))
    return len(held) < most and sum(held) < MAX_INFLIGHT_SLOTS * geometry.slot_bytes


def in_flight_at_most(used: list[int], geometry: Geometry, native: bool) -> int:
    """How many of the oldest sealed slots (``used``: their bytes, oldest first) the drain
    can have on their way at once: it takes them in sequence order while there is room."""
    n = 0
    while n < len(used) and room_in_flight(used[:n], geometry, native):
        n += 1
    return n


class Drain:
    WAKES_ON_FD = False        # ``wait`` cannot end early on a descriptor (confluent-kafka's poll)
    REPORTS_PER_SLOT = False   # success is known at zero points only (module docstring)

    def __init__(self, pool: BufferPool, producer_conf: dict, journal: LossJournal,
                 metrics: Metrics, dead_letter_dir: Path, origin: bytes | None,
                 on_slot_done: Callable[[SealedSlot], None] | None = None,
                 on_dead: Callable[[str, int, bytes], None] | None = None,
                 producer_factory: Callable[[dict], Producer] | None = None,
                 incarnation: bytes | None = None, clock: Clock | None = None,
                 probe_factory: Callable[[dict], object] | None = None):
        self.pool = pool
        self.clock = clock or Clock()
        self.producer_factory = producer_factory or _real_producer
        self.probe_factory = probe_factory or admin_client     # asks whether the cluster answers
        self.conf = dict(producer_conf)
        self.journal = journal
        self.metrics = metrics
        self.dead_letter_dir = dead_letter_dir
        # Identity: the origin, and with an incarnation the record number of every record.
        self.origin_headers = [(ORIGIN_HEADER, origin)] if origin is not None else []
        self.numbered = origin is not None and incarnation is not None
        if self.numbered:
            self.origin_headers.append((INCARNATION_HEADER, incarnation))
        self.on_slot_done = on_slot_done
        self.on_dead = on_dead                  # the audit emitter takes the record out again
        self.inflight: collections.deque[SlotSend] = collections.deque()
        self.producer = self._new_producer()
        self.lone: Producer | None = None       # sends records alone; built when first needed
        self._took_alone: set[str] = set()     # topics warned about
        self._dead_letters_waiting = False     # a dead letter refused for lack of space
        self.outage = False
        self._fatal: KafkaError | None = None
        self._progress_mark = (0, self._now())   # (reports so far, when they last moved)
        self._failures = 0                # failure reports so far (``failed``)
        self._failures_seen = 0           # ... when the reports last moved
        self._resume_owed = 0             # records in flight when an outage ended, not yet
        #                                   acknowledged: their acknowledgements prove nothing
        self._stall_probe: Probe | None = None
        self._next_probe = 0.0           # ... not asked again before this (the answer was yes)
        self._resumed = False            # an outage ended, nothing acknowledged since
        self._replace_why: str | None = None     # "stalled": a new producer at the next pump
        self.stall: dict | None = None   # the stall being handled (status): since, replacements
        self.stalls_in_a_row = 0         # replacements with nothing acknowledged in between
        self.handed = 0                 # records handed to librdkafka so far
        self.settled = 0                # ... of which every one is acknowledged or reported
        self.handed_alone = 0           # records handed to the lone producer so far
        self._probe_ok = threading.Event()
        self._probe_thread: threading.Thread | None = None
        self.broker_state = "up"
        self._denied: dict[str, float] = {}    # topic refused → when to try it again
        self._reconfigured = False
        self.on_unknown_topic: Callable[[str], None] | None = None   # see topics.TopicWatch
        metrics.set("agent_drain_broker_up", 1)

    # -- the client ---------------------------------------------------------------------------
    def _new_producer(self) -> Producer:
        return self.producer_factory({**self.conf, "error_cb": self._on_error,
                                      "delivery.report.only.error": True})

    def _lone_producer(self) -> Producer:
        """The producer for records that must go alone: one record per batch, every report
        served (they are few), so each is counted exactly."""
        if self.lone is None:
            self.lone = self.producer_factory({
                **self.conf, "error_cb": self._on_error, "batch.num.messages": 1,
                "linger.ms": 0, "delivery.report.only.error": False})
        return self.lone

    def _producers(self) -> list[Producer]:
        return [p for p in (self.producer, self.lone) if p is not None]

    def _outstanding(self) -> int:
        return sum(len(p) for p in self._producers())

    def _poll(self, timeout_s: float = 0) -> None:
        """Serve reports; at a zero point, everything handed over so far is settled."""
        if self.producer is not None:
            self.producer.poll(timeout_s)
        if self.lone is not None:
            self.lone.poll(0)
        if self.producer is None or len(self.producer) == 0:
            self.settled = self.handed

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err
        elif err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED,
                            KafkaError._SSL) or _certificate_refused(err):
            self._not_authenticated(err)
        elif err.code() == KafkaError._ALL_BROKERS_DOWN and not self._refused():
            self.broker_state = "all brokers down"

    def _refused(self) -> bool:
        """The cluster answers but refuses this client: the state names why, and no passing
        transport report replaces that."""
        return self.broker_state.startswith(("authentication failed", "not authorised"))

    def _not_authenticated(self, err: KafkaError) -> None:
        """The brokers refuse this client's credentials (or its TLS handshake): the events wait
        in the pool (the outage guard stops librdkafka retrying in a loop), said once."""
        if self.broker_state.startswith("authentication failed"):
            return
        tls = err.code() == KafkaError._SSL or _certificate_refused(err)
        self.broker_state = "authentication failed" + (" (TLS)" if tls else "")
        self.metrics.set("agent_drain_broker_up", 0)
        log.error("broker: authentication failed: %s. Events wait in the pool. Check %s, "
                  "then reload the agent (SIGHUP, systemctl reload docket-agent)", err.str(),
                  "[broker] ssl_ca_file, ssl_certificate_file and ssl_key_file (trusted, not "
                  "expired)" if tls else _credentials_keys(self.conf))

    def _deny(self, topic: str, err: KafkaError) -> None:
        """The cluster refuses this client ``topic`` (DENIED): its records wait, and go again
        in ``DENIED_RETRY_S``. Said once per refusal, until the topic is accepted again."""
        first = topic not in self._denied
        self._denied[topic] = self._now() + DENIED_RETRY_S
        if not first:
            return
        if err.code() in (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED):
            self._not_authenticated(err)
            return
        self.broker_state = f"not authorised: {err.name()} on topic {topic}"
        log.error("broker: not authorised to write topic %s (%s): its events wait in the pool "
                  "and go again every %.0f s. Grant the agent's principal Write on "
                  "the topic (docs/security.md, \"ACLs per role\")", topic, err.str(),
                  DENIED_RETRY_S)

    def _may_go_on(self, send: SlotSend, due: set[str]) -> bool:
        """Whether ``send``'s records not yet handed over may go now: any send's while its
        topic is accepted; while it is refused, only those of a send that had begun (it is
        the one trying the topic again, with its records refused so far), when the topic is
        tried again (``due``: this pump, with the records it had refused). A send whose slot
        grew after the refusal (sent while it fills) could otherwise never end, and its
        topic, accepted again only when one of its slots is acknowledged whole, never be:
        seen in CI, 19,368 of 20,000 lines held after the ACL was granted."""
        topic = send.slot.topic
        if topic not in self._denied:
            return True
        return (send.bi, send.ri) != (0, 0) and topic in due

    def _held(self, topic: str) -> bool:
        """Is ``topic`` refused, and not yet due to be tried again?"""
        until = self._denied.get(topic)
        return until is not None and self._now() < until

    def _accepted(self, topic: str) -> None:
        """A slot of ``topic`` was acknowledged whole: a refusal is over."""
        if self._denied.pop(topic, None) is not None:
            log.warning("broker: topic %s is accepted again: its waiting events go", topic)
            if not self._denied and self.broker_state.startswith("not authorised"):
                self.broker_state = "up"
                self.metrics.set("agent_drain_broker_up", 0 if self.outage else 1)
        elif self.broker_state.startswith("authentication failed"):
            log.warning("broker: authenticated again: waiting events go")
            self.broker_state = "up"
            self.metrics.set("agent_drain_broker_up", 0 if self.outage else 1)

    def reconfigure(self, producer_conf: dict) -> None:
        """New client settings (a reload: credentials read again): the producers are replaced
        at the next ``pump``, as after a fatal error."""
        self.conf = dict(producer_conf)
        self._reconfigured = True

    def block_lists(self, slot: SealedSlot) -> Iterator[tuple]:
        """Per block: value offsets, lengths, times, keys (or None) and the records' headers
        (``BlockHeaders``). Record numbers follow the records' order in the slot from its
        ``first_record``, the same at every send of the slot."""
        number = slot.meta.first_record
        for block in slot.blocks():
            yield (block.offsets.tolist(), block.lengths.tolist(), block.timestamps.tolist(),
                   block.keys, BlockHeaders(self.block_headers(block) or None,
                                            number if self.numbered else None))
            number += len(block.offsets)

    def block_headers(self, block) -> list[tuple[str, bytes]]:
        """The headers every record of ``block`` carries: the origin's (and incarnation's),
        ``docket-part`` for the parts of a split line, ``docket-continued`` for the rest of a
        multiline event cut at its size limit."""
        if not block.part_count and not block.continued:
            return self.origin_headers
        extra = [(CONTINUED_HEADER, b"1")] if block.continued else []
        if block.part_count:
            extra.append((PART_HEADER, f"{block.part_index}/{block.part_count}".encode()))
        return [*self.origin_headers, *extra]

    # -- outcomes -----------------------------------------------------------------------------
    def _report(self, send: SlotSend, err, msg) -> None:
        """A record's report, via poll(): only failures reach Python code (successes are
        counted in bulk at zero points)."""
        if err is None or send.retired:
            return
        for record in send.failed_records(msg):
            self.failed(send, record, err)

    def _report_record(self, send: SlotSend, record: Record, err, msg) -> None:
        """The report of a record sent again: it knows its record (resends are few)."""
        if err is not None and not send.retired:
            self.failed(send, record, err)

    def _report_alone(self, send: SlotSend, record: Record, err, msg) -> None:
        """The report, failed or not, of a record sent alone."""
        if send.retired:
            return
        send.alone_out -= 1
        if err is not None:
            self.failed(send, record, err, alone=True)
        else:
            self.took_alone(record[0])

    def failed(self, send: SlotSend, record: Record, err: KafkaError,
               alone: bool = False) -> None:
        """A delivery report, or ``produce()`` itself, said ``err`` for ``record``.
        ``alone``: about this record only (it was sent alone, or ``produce()`` refused it),
        not about a batch it travelled in."""
        if err.code() in (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART) \
                and self.on_unknown_topic is not None:
            self.on_unknown_topic(record[0])
        self._failures += 1
        outcome = classify(err, alone=alone)
        if outcome is Outcome.DEAD:
            if self._dead_letter(send, record, err):
                return
            outcome = Outcome.RETRY      # no room to keep it as a dead letter: it waits
        if outcome is Outcome.DENIED:
            self._deny(record[0], err)
        (send.alone if outcome is Outcome.ALONE else send.retry).append(record)
        self.metrics.inc("agent_drain_retried_events_total", reason=reason(err),
                         topic=record[0])

    def took_alone(self, topic: str) -> None:
        """A record refused with its batch as too large was taken alone: the topic's
        ``max.message.bytes`` is below the batch size. Correct but slow: say so, once."""
        if topic not in self._took_alone:
            self._took_alone.add(topic)
            log.warning("topic %s refused a batch as too large but takes its records one by "
                        "one: its max.message.bytes is below batch.size (%s). Such records "
                        "now go one per batch, which is slow; set "
                        "[broker.librdkafka_options] \"batch.size\" to at most the topic's "
                        "max.message.bytes", topic, self.conf.get("batch.size", "default"))

    def _dead_letter(self, send: SlotSend, record: Record, err: KafkaError) -> bool:
        """Keep ``record`` in the dead-letter file and journal it; False when the file system
        refused the line for lack of space (the record then goes again, refused again, until
        there is room: never dropped unkept)."""
        topic, value, key, ts, headers = record
        try:
            write_dead_letter(self.dead_letter_dir, record, err, send.slot.seq)
        except OSError as exc:
            if not disk_full(exc):
                raise
            if not self._dead_letters_waiting:
                log.error("cannot write the dead-letter file in %s (%s): records Kafka refuses "
                          "for good wait in the pool until there is room", self.dead_letter_dir,
                          exc)
            self._dead_letters_waiting = True
            return False
        self._dead_letters_waiting = False
        if self.on_dead is not None:
            self.on_dead(topic, ts, value or b"")
        number = record_number(headers)
        self.journal.record(reason(err), topic, 1, nbytes=len(value or b""),
                            source=f"slot {send.slot.seq}",
                            detail=f"{err.str()}; kept in {self.dead_letter_dir}",
                            event_ts_ms=ts,
                            records=(number, number) if number is not None else None)
        send.dead_records.append(record)
        return True

    # -- sending ------------------------------------------------------------------------------
    def pump(self, budget: int = PUMP_BUDGET, reports: bool = True) -> int:
        """Produce up to ``budget`` records, serve delivery reports, free finished slots.
        ``reports=False``: only produce, serving no report, so no slot is finished (the service
        hands a slot just sealed to Kafka before it writes the checkpoints, then pumps in
        full); a producer to rebuild or an outage waits for the full pump."""
        if not reports and (self._to_replace() or self.outage):
            return 0
        if self._to_replace():
            self._rebuild()
        if reports:
            self._poll()
            self._complete()
        if self.outage:
            if not self._probe_ok.is_set():
                return 0
            self._end_outage()
        sent = 0
        due = {topic for topic in self._denied if not self._held(topic)}   # tried again now
        for send in list(self.inflight):
            topic = send.slot.topic
            if send.retry and sent < budget and not self._held(topic):
                if topic in self._denied:        # one slot tries a refused topic again
                    self._denied[topic] = self._now() + DENIED_RETRY_S
                sent += self._resend(send, budget - sent)
            if send.alone and sent < budget:
                sent += self._send_alone(send, budget - sent)
        while sent < budget:
            send = next((s for s in self.inflight if s.unsent and self._may_go_on(s, due)),
                        None)
            if send is None:
                if not self._room_in_flight():
                    break                   # until slots on their way complete
                taken = self.pool.take(1)
                if not taken:
                    break
                send = self._start(taken[0])
                self.inflight.append(send)
                if send.slot.topic in self._denied:
                    continue                # waits until its topic is accepted again
            n, blocked = self._produce_new(send, budget - sent)
            sent += n
            if send.slot.topic in self._denied:  # the slot trying a refused topic again
                self._denied[send.slot.topic] = self._now() + DENIED_RETRY_S
            if blocked:
                break
        if reports:
            self._poll()
            self._complete()
            self._watch_progress()
        return sent

    def _start(self, slot: SealedSlot) -> SlotSend:
        """A send of ``slot`` from its first record. The records become plain lists, so the
        send loop does no numpy work per record, over a copy of the payload: the pool's pages
        can leave memory."""
        send = SlotSend(slot, bytes(slot.payload), list(self.block_lists(slot)))
        self.pool.release_pages(slot)
        return send

    def wait(self, timeout_s: float, wake_fd: int = -1) -> None:
        """Nothing to do but wait for reports (the service's idle turn). ``wake_fd``: a
        descriptor that ends the wait when readable — for this drain only when nothing is on
        its way (confluent-kafka's poll cannot end on one: the wait is a ``select`` then, and
        no report can come meanwhile)."""
        if wake_fd < 0:
            self._poll(timeout_s)
            return
        select.select([wake_fd], [], [], timeout_s)
        self._poll(0)

    def _produce_new(self, send: SlotSend, budget: int) -> tuple[int, bool]:
        """The hot loop: one ``produce`` per record, nothing else per record but slicing."""
        n = self._pending_first(send)
        if n is None:
            return 0, True
        produce, cb, topic, payload = self.producer.produce, \
            functools.partial(self._report, send), send.slot.topic, send.payload
        while send.bi < len(send.blocks) and n < budget:
            offsets, lengths, times, keys, bh = send.blocks[send.bi]
            i, stop = send.ri, min(len(offsets), send.ri + budget - n)
            first = i
            headers, numbers = bh.base, None
            if bh.numbers is not None:          # one list, its last entry set per record
                headers, numbers = [*(bh.base or ()), None], bh.values(i, stop)
                last = len(headers) - 1
            while i < stop:
                o = offsets[i]
                key = keys[i] if keys else None
                if numbers is not None:
                    headers[last] = (SEQ_HEADER, numbers[i - first])
                try:
                    produce(topic, payload[o:o + lengths[i]], key, NO_PARTITION, cb, None, times[i],
                            headers)
                except BufferError:
                    n += i - send.ri
                    send.ri = i
                    self.handed += i - first
                    send.handed = self.handed
                    return n, True
                except KafkaException as exc:
                    self.handed -= 1            # refused at once: never handed over
                    self.failed(send, (topic, payload[o:o + lengths[i]], key, times[i],
                                       bh.of(i)), exc.args[0], alone=True)
                i += 1
            n += i - send.ri
            self.handed += i - first
            send.handed = self.handed
            if i == len(offsets):
                send.bi, send.ri = send.bi + 1, 0
            else:
                send.ri = i
        return n, False

    def _pending_first(self, send: SlotSend) -> int | None:
        """The record a full queue refused goes first: 1 when it went, 0 when there was none,
        None when the queue is still full."""
        if send.pending is None:
            return 0
        record, send.pending = send.pending, None
        return 1 if self._produce_one(send, record) else None

    def _produce_one(self, send: SlotSend, record: Record) -> bool:
        topic, value, key, ts, headers = record
        try:
            self.producer.produce(topic, value, key, NO_PARTITION,
                                  functools.partial(self._report_record, send, record), None,
                                  ts, headers)
        except BufferError:
            send.pending = record
            return False
        except KafkaException as exc:
            self.failed(send, record, exc.args[0], alone=True)
            return True
        self.handed += 1
        send.handed = self.handed
        return True

    def _resend(self, send: SlotSend, budget: int) -> int:
        """Produce a slot's records that came back RETRY, before anything new."""
        todo, send.retry = send.retry, []
        n = 0
        for i, record in enumerate(todo):
            if n >= budget:
                send.retry = todo[i:] + send.retry
                return n
            if not self._produce_one(send, record):     # local queue full: it waits in pending
                send.retry = [send.pending] + todo[i + 1:] + send.retry
                send.pending = None
                return n
            n += 1
        return n

    def _send_alone(self, send: SlotSend, budget: int) -> int:
        """Produce, one per batch, a slot's records refused with their batch as too large:
        the broker's answer is then about the record. Their reports come one by one."""
        lone = self._lone_producer()
        todo, send.alone = send.alone, []
        for i, record in enumerate(todo):
            if i >= budget:
                send.alone = todo[i:] + send.alone
                return i
            topic, value, key, ts, headers = record
            try:
                lone.produce(topic, value, key, NO_PARTITION,
                             functools.partial(self._report_alone, send, record), None, ts,
                             headers)
            except BufferError:
                send.alone = todo[i:] + send.alone
                return i
            except KafkaException as exc:
                self.failed(send, record, exc.args[0], alone=True)
                continue
            send.alone_out += 1
            self.handed_alone += 1
        return len(todo)

    def _complete(self) -> None:
        """Free every finished slot that no older slot still on its way shares a source with.
        A later slot of a source is kept (acknowledged) until the older ones are: the state
        database's acknowledged offset of a source only moves over contiguous bytes, so bytes
        freed ahead of it would be neither acknowledged nor in the pool after a crash, and the
        start's self-check would read them again as new records (seen in the soak: 11,942
        ids sent twice with two record numbers, outside the in-flight bound). Slots of other
        sources still go out of order: one stuck slot holds back only its own sources."""
        held: set[int] = set()              # sources of the older slots not freed
        for send in list(self.inflight):
            sources = {src for src, _s, _e in send.slot.meta.positions}
            if send.finished(self.settled) and not sources & held:
                self.inflight.remove(send)
                self._finish(send)
            else:
                held |= sources

    def _finish(self, send: SlotSend) -> None:
        if self._refused():
            self._accepted(send.slot.topic)
        self.metrics.inc("agent_drain_sent_events_total", send.acked, topic=send.slot.topic)
        self.metrics.inc("agent_drain_slots_freed_total")
        if self.on_slot_done is not None:
            self.on_slot_done(send.slot)
        self.pool.free(send.slot)

    # -- liveness: outages and stalls -----------------------------------------------------------
    def _acked_now(self) -> int:
        """Records librdkafka is done with (acknowledged or reported): progress, in bulk."""
        return self.handed + self.handed_alone - self._outstanding()

    def _watch_progress(self) -> None:
        """Nothing reported for ``OUTAGE_AFTER_S`` while records are out: ask a new client
        whether the cluster answers. No: an outage. Yes: wait (a failover), asking again when
        the stall bound is reached; then the producer is replaced (module docstring)."""
        now = self._now()
        acked = self._acked_now()
        if acked != self._progress_mark[0] or self._outstanding() == 0:
            # Acknowledgements among the reports. Failure reports (requests that timed out in
            # an outage, reported after it) are no sign the producer works, nor are the
            # acknowledgements of requests in flight since before an outage ended (the broker
            # answering them as it wakes): they move the mark, the resume bound stays.
            ok = acked - self._progress_mark[0] - (self._failures - self._failures_seen)
            owed = min(max(ok, 0), self._resume_owed)
            self._resume_owed -= owed
            if ok - owed > 0:
                self._progressed()
            self._failures_seen = self._failures
            self._progress_mark = (acked, now)
            self._stall_probe, self._next_probe = None, 0.0
            return
        silent = now - self._progress_mark[1]
        if silent < OUTAGE_AFTER_S:
            return
        if self._stall_probe is None:
            if now >= self._next_probe:
                self._stall_probe = Probe(self.conf, self.probe_factory)
            return
        answered = self._stall_probe.answered
        if answered is None:
            return
        self._stall_probe = None
        if not answered:
            self._begin_outage()
            return
        bound = RESUME_STALL_S if self._resumed else STALL_AFTER_S
        if silent >= bound:
            self._stalled(silent)
        else:                           # a failover, perhaps: asked again at the bound
            self._next_probe = self._progress_mark[1] + bound

    def _progressed(self) -> None:
        """A report came: whatever stopped them is over."""
        if self.broker_state == "all brokers down":
            self.broker_state = "up"             # acknowledgements again
        self._resumed = False
        self.stalls_in_a_row = 0
        if self.stall is not None:
            log.warning("acknowledgements again, %.1f s after the last one before the stall "
                        "(%d producer replacement(s))",
                        self._now() - self.stall["monotonic"], self.stall["replacements"])
            self.stall = None
            if self.broker_state.startswith("stalled"):
                self.broker_state = "up"

    def _stalled(self, silent: float) -> None:
        """The cluster answers a new client, this producer has had nothing acknowledged for
        ``silent`` seconds: replace it (at the next pump) and send the slots in flight again
        under their record numbers."""
        self.stalls_in_a_row += 1
        if self.stall is None:
            since = self._progress_mark[1]
            self.stall = {"monotonic": since,
                          "since_ms": self.clock.time_ms() - int((self._now() - since) * 1000),
                          "replacements": 0}
        self.stall["replacements"] += 1
        self.broker_state = (f"stalled: nothing acknowledged for {silent:.0f} s while the "
                             "cluster answers; producer replaced")
        log.error("send path stalled: nothing acknowledged for %.1f s while the cluster answers "
                  "a new client%s: replacing the producer and sending the %d slot(s) in flight "
                  "again under their record numbers (replacement %d in a row)", silent,
                  " (since the outage ended)" if self._resumed else "", len(self.inflight),
                  self.stalls_in_a_row)
        if self.wedged():
            log.error("%d producer replacements in a row and nothing acknowledged: the agent no "
                      "longer feeds systemd's watchdog (WatchdogSec restarts it; the pool keeps "
                      "every slot)", self.stalls_in_a_row)
        self._replace_why = "stalled"          # the next pump replaces the producers

    def wedged(self) -> bool:
        """Replaced ``RESTART_AFTER_STALLS`` times in a row with nothing acknowledged: the
        service stops feeding systemd's watchdog, so systemd restarts the agent."""
        return self.stalls_in_a_row >= RESTART_AFTER_STALLS

    def unacknowledged_s(self) -> float:
        """Seconds since a report last came while records are out (0 when none are out): the
        gauge ``agent_drain_unacknowledged_seconds``."""
        if self._outstanding() == 0:
            return 0.0
        return max(0.0, self._now() - self._progress_mark[1])

    def _begin_outage(self) -> None:
        log.warning("no acknowledgement for %.0f s and the cluster does not answer: purging "
                    "librdkafka's queue, the pool keeps the data; asking the cluster every "
                    "%.0f s", OUTAGE_AFTER_S, PROBE_INTERVAL_S)
        self.outage = True
        if not self._refused():
            self.broker_state = "unreachable"
        self.metrics.set("agent_drain_broker_up", 0)
        self.metrics.inc("agent_drain_outages_total")
        self._purge()
        self._probe_ok.clear()
        self._probe_thread = threading.Thread(target=self._probe, name="docket-probe",
                                              daemon=True)
        self._probe_thread.start()

    def _purge(self, in_flight: bool = False) -> None:
        """Empty librdkafka's queue; purged records come back as RETRY reports. Requests
        already in flight are left to finish (the spin needs a queue; an in-flight record
        purged would be sent twice if the broker had written it)."""
        for producer in self._producers():
            producer.purge(in_queue=True, in_flight=in_flight)
        before, deadline = -1, self._now() + PURGE_WAIT_S
        while self._outstanding() != before and self._now() < deadline:
            before = self._outstanding()
            self._poll(0.05)
        for send in self.inflight:       # records never handed to librdkafka go again too
            if send.pending is not None:
                send.retry.append(send.pending)
                send.pending = None

    def _probe(self) -> None:
        """During an outage: a new client asks every ``PROBE_INTERVAL_S`` until answered."""
        while self.outage:
            try:
                answered = cluster_answers(self.conf, self.probe_factory, PROBE_INTERVAL_S)
            except Exception:            # a client that cannot even be made: ask again
                log.warning("cannot ask the cluster whether it answers", exc_info=True)
                answered = False
                self.clock.sleep(PROBE_INTERVAL_S)
            if answered:
                self._probe_ok.set()
                return
            self.clock.sleep(0.05)

    def _end_outage(self) -> None:
        log.warning("the cluster answers again: resuming")
        self.outage = False
        if not self.broker_state.startswith("not authorised"):
            self.broker_state = "up"          # it answered: authenticated (again)
        self.metrics.set("agent_drain_broker_up", 1)
        self._fresh_start()
        self._resumed = True                 # its producer must show progress soon
        self._resume_owed = self._outstanding()  # ... on records sent since

    def _to_replace(self) -> bool:
        """A fatal error, new settings or a stall: new producers at the next pump."""
        return self._fatal is not None or self._reconfigured or self._replace_why is not None

    def _rebuild(self) -> None:
        """Replace the producers: after a fatal error, for new settings, or stalled. A report
        the old ones never served must not pass for an acknowledgement at the new one's first
        zero point: every slot whose completion is not known goes again from its first
        record."""
        if self._fatal is not None:
            why = "fatal"
            log.error("fatal producer error (%s): rebuilding the producer", self._fatal)
        elif self._replace_why is not None:
            why = self._replace_why
        else:
            why = "settings"
            log.warning("new client settings: replacing the producer")
        self.metrics.inc("agent_drain_producer_replacements_total", reason=why)
        self._fatal, self._reconfigured, self._replace_why = None, False, None
        self._purge(in_flight=True)     # what the old producers still report is known
        unknown = [s for s in self.inflight if self._unreported(s)]
        if unknown:
            log.warning("%d slot(s) in flight had records not reported by the old producer: "
                        "sent again (duplicates possible)", len(unknown))
            for s in unknown:            # every record sent again counts as retried
                self.metrics.inc("agent_drain_retried_events_total", s.to_send_again,
                                 reason="producer_replaced", topic=s.slot.topic)
        self.inflight = collections.deque(self._again(s) if s in unknown else s
                                          for s in self.inflight)
        self._new_producers()
        self._fresh_start()

    def _fresh_start(self) -> None:
        """The stall bound counts from now (new producers: what the old ones held out no longer
        counts as outstanding, which is no acknowledgement; a new producer did not live through
        the last outage)."""
        self._progress_mark = (self._acked_now(), self._now())
        self._failures_seen = self._failures
        self._stall_probe, self._next_probe = None, 0.0
        self._resumed = False
        self._resume_owed = 0

    def _unreported(self, send: SlotSend) -> bool:
        """Has ``send`` records whose reports the producers being replaced never served?"""
        return send.handed > self.settled or bool(send.alone_out)

    def _again(self, send: SlotSend) -> SlotSend:
        """A send of ``send``'s slot from its first record, but for its dead records."""
        return SlotSend(send.slot, previous=send)

    def _new_producers(self) -> None:
        self.producer = self._new_producer()
        self.lone = None

    def _now(self) -> float:
        """Seconds of the monotonic clock (``Clock``: a simulation drives it)."""
        return self.clock.monotonic_ns() / 1e9

    def describe(self) -> str:
        """The send path, for the agent's ready line."""
        return f"python (confluent-kafka, librdkafka {confluent_kafka.libversion()[0]})"

    def _room_in_flight(self) -> bool:
        """Another slot may go on its way (``room_in_flight``): at most
        ``MAX_INFLIGHT_SLOTS`` where success is known at zero points only, so that they come
        under a steady load; more small ones where each slot's report comes."""
        return room_in_flight([s.slot.meta.used_bytes for s in self.inflight],
                              self.pool.geometry, native=self.REPORTS_PER_SLOT)

    # -- stopping -----------------------------------------------------------------------------
    def idle(self) -> bool:
        return not self.inflight and not self.pool.sealed()

    def waits_for_seal(self) -> bool:
        """Nothing is on its way but records of the slot sent while it fills, all handed
        over: their acknowledgements need no turn of the loop, only a failure does, and
        that ends a wait (the native path's; this one sends sealed slots only)."""
        return False

    def drain_until(self, deadline: float) -> bool:
        """Send until nothing is sealed or in flight, the ``deadline`` (on ``self.clock``'s
        monotonic seconds) passes, or an outage
        begins (waiting for a cluster that does not answer only delays the stop: the pool
        keeps the data). True if empty."""
        while self._now() < deadline and not self.outage:
            self.pump()
            if self.idle():
                return True
            self._poll(0.01)
        return self.idle()

    @property
    def reachable(self) -> bool:
        """Not in an outage (declared only after acknowledgements stalled and a metadata
        probe went unanswered: a passing "all brokers down" report does not count)."""
        return not self.outage

    def cluster_answered(self) -> None:
        """Something else (the topic check) heard from the cluster: a passing "all brokers
        down" report is over, although nothing was sent since."""
        if self.broker_state == "all brokers down":
            self.broker_state = "up"

    def close(self) -> None:
        """Give up on what is in flight: it stays in its slots for the next start."""
        self.outage = False
        for producer in self._producers():
            producer.purge(in_queue=True, in_flight=True)
            producer.poll(0)
            producer.flush(0)
