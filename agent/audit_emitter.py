"""The producer tier of the audit: what this agent accepted, per (topic, event-time window).

Counted when a slot is sealed (the moment the agent owns the events), from the slot itself:
records, value bytes, the XXH64 checksum (``audit.contract.record``) and late events (read after
their window had ended). Events the agent then fails to deliver on purpose or by error
(dead-lettered, dropped from a full pool) are taken out of ``count`` again and shown under
``dropped`` with their reason; drops of events never counted (oversized lines) only add to
``dropped``. A loss of unknown size (a file deleted or truncated before it was read: the loss
journal knows its bytes, not its events) adds one to ``dropped_unknown[reason]`` of the window it
was found in. So ``count`` is what Kafka should hold, and ``dropped_unknown`` says where it may be
short of what the applications wrote.

Durability: the tallies of sealed slots are written to the state database (``agent/state/db.py``,
which owns the tables) in the same transaction as the file checkpoints they belong to, together
with the pool sequence number of the last slot counted. A slot sealed but not yet counted when
the agent died is found sealed at the next start and counted then (``count_recovered``).
Nothing is counted twice, nothing missed.

Emission: a round every ``audit.interval_ms`` on the agent's monotonic clock, in a thread of its
own (and one at shutdown), sends a record for every window that changed since its last confirmed
delivery, plus a heartbeat for the current window of every configured topic. A step of the wall
clock moves the windows events fall in, never the schedule: no round is held back or hurried.
Records are cumulative, so sending again is harmless; a round that Kafka does not acknowledge
leaves its windows marked and the next round sends them again.
``seq`` is persisted before each round, so it only grows across restarts.

With record numbers on, each round also says where its numbers stand, read after the counts
were taken: every count record carries ``sealed_through`` (the last number given: no record it
counts has a higher one), and the round's ``ranges`` record ``delivered`` (every number up to it
is acknowledged by Kafka or journalled). A tier that has read past a round whose ``delivered``
reaches a window's ``sealed_through`` holds every record of that count, or has lost it: that,
not any clock, is how the reconciler knows the tier has caught up (docs/reconcile.md).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from confluent_kafka import Producer

from audit.contract.delivery import deliver
from audit.contract.record import (
    HASH_SEED,
    PRODUCER_TIER,
    AuditRecord,
    Ranges,
    value_hash,
    value_hashes,
)
from docket_common.window import window_start

from .buffer import SealedSlot
from .buffer.layout import seq_order_key
from .state.db import AuditUpdate, AuditWindow, StateDB
from .telemetry import Metrics

log = logging.getLogger("docket.agent.audit")

RETENTION_MS = 7 * 24 * 3600 * 1000      # delivered windows older than this leave the database
DELIVERY_TIMEOUT_S = 10.0
# At stop: a round under way gets this long to end before it is cut short, and the last round
# this long for its acknowledgements; with the purges, the audit's part of a stop stays within
# STOP_BUDGET_S (agent.config keeps shutdown_timeout_ms + this within the unit's stop timeout).
ROUND_UNDER_WAY_S = 2.0
LAST_ROUND_S = 5.0
STOP_BUDGET_S = ROUND_UNDER_WAY_S + LAST_ROUND_S + 1.0


@dataclass(frozen=True)
class RecordNumbers:
    """Where an agent's record numbers stand, read at once (``AgentService._numbers``)."""

    through: int                       # the last number given
    delivered: int                     # every number up to it acknowledged or dropped
    dropped: list[list[int]]           # the journalled ones, inclusive ranges


@dataclass
class Tally:
    """Counts of one (topic, window)."""

    count: int = 0
    bytes: int = 0
    checksum: int = 0            # kept mod 2^64
    late: int = 0
    dropped: int = 0
    dropped_reasons: dict[str, int] = field(default_factory=dict)
    dropped_unknown: dict[str, int] = field(default_factory=dict)   # entries, by reason

    def add(self, other: Tally) -> None:
        self.count += other.count
        self.bytes += other.bytes
        self.checksum = (self.checksum + other.checksum) % (1 << 64)
        self.late += other.late


# (payload, offsets, lengths, seed, out): the native extension's value_hashes
NativeHashes = Callable[[np.ndarray, np.ndarray, np.ndarray, int, np.ndarray], None]
# (payload, window_ms, now_ms, seed) -> [(window start, count, bytes, checksum, late)]: the
# native extension's slot_tally
NativeTally = Callable[[np.ndarray, int, int, int], list[tuple[int, int, int, int, int]]]


def tally_slot(slot: SealedSlot, window_ms: int, now_ms: int,
               native_hashes: NativeHashes | None = None,
               native_tally: NativeTally | None = None) -> dict[int, Tally]:
    """Per window start, the counts of a sealed slot's records (each split part is a record,
    as it is in Kafka). ``native_tally``: the native extension's walk of the whole slot
    (``docket_native.slot_tally``: one call, whatever its blocks; a slot sent while it fills
    has one a turn); else per block, with ``native_hashes`` its pass over a block's values
    (``docket_native.value_hashes``, the same XXH64) where the extension is installed."""
    if native_tally is not None:
        return {w: Tally(count, nbytes, checksum, late) for w, count, nbytes, checksum, late
                in native_tally(slot.payload, window_ms, now_ms, HASH_SEED)}
    out: dict[int, Tally] = {}
    payload = memoryview(slot.payload)
    for block in slot.blocks():
        windows = window_start(block.timestamps, window_ms)
        if native_hashes is not None:
            hashes = np.empty(len(block), np.uint64)
            native_hashes(slot.payload, block.offsets, block.lengths, HASH_SEED, hashes)
        else:
            values = map(payload.__getitem__, map(slice, block.offsets.tolist(),
                                                  (block.offsets + block.lengths).tolist()))
            hashes = np.fromiter(value_hashes(values), np.uint64, len(block))
        late = windows + window_ms <= now_ms
        first, last = int(windows[0]), int(windows[-1])
        if first == last and (windows == first).all():       # the usual case: one window
            _merge(out, first, len(block), int(block.lengths.sum()),
                   int(hashes.sum(dtype=np.uint64)), int(late.sum()))
            continue
        starts, inverse = np.unique(windows, return_inverse=True)
        counts = np.bincount(inverse, minlength=len(starts))
        nbytes = np.bincount(inverse, weights=block.lengths, minlength=len(starts))
        sums = np.zeros(len(starts), np.uint64)
        np.add.at(sums, inverse, hashes)                    # uint64: wraps mod 2^64
        lates = np.bincount(inverse, weights=late, minlength=len(starts))
        for i, w in enumerate(starts.tolist()):
            _merge(out, w, int(counts[i]), int(nbytes[i]), int(sums[i]), int(lates[i]))
    return out


def _merge(out: dict[int, Tally], window: int, count: int, nbytes: int, checksum: int,
           late: int) -> None:
    t = out.setdefault(window, Tally())
    t.add(Tally(count, nbytes, checksum, late))


class AuditEmitter:
    def __init__(self, *, db: StateDB, agent_id: str, topics: list[str], audit_topic: str,
                 window_ms: int, interval_ms: int, producer_conf: dict, metrics: Metrics,
                 enabled: bool = True,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, incarnation: str | None = None,
                 numbers: Callable[[], RecordNumbers] | None = None,
                 native_hashes: NativeHashes | None = None,
                 native_tally: NativeTally | None = None):
        self.db = db                             # the agent's state database
        self.native_hashes = native_hashes
        self.native_tally = native_tally
        self.agent_id = agent_id
        self.topics = list(topics)
        self.audit_topic = audit_topic
        self.window_ms = window_ms
        self.interval_ms = interval_ms
        self.metrics = metrics
        self.enabled = enabled
        self.clock = clock                       # wall seconds: event windows, ``emitted_at``
        self.monotonic = monotonic               # seconds: the rounds' schedule
        self.incarnation = incarnation
        # where the record numbers stand: a ``ranges`` record each round
        self.numbers = numbers
        self._lock = threading.Lock()
        self._emit_lock = threading.Lock()
        self._windows: dict[tuple[str, int], Tally] = {}
        self._version: dict[tuple[str, int], int] = {}     # bumped on every change
        self._dirty: set[tuple[str, int]] = set()
        self._pending: list[tuple[int, dict[tuple[str, int], Tally]]] = []   # (slot seq, tallies)
        self._pending_drops: list[tuple[tuple[str, int], str, int]] = []
        # windows changed since the state database last stored them (``persisted``): a write
        # refused for lack of space leaves them here for the next one
        self._unwritten: set[tuple[str, int]] = set()
        self.last_emission_ms: int | None = None
        self._producer_conf = _audit_producer_conf(producer_conf, agent_id)
        self._new_conf: dict | None = None    # a reload's, taken by the next round
        self._producer: Producer | None = None
        self._rounds: threading.Thread | None = None
        self._rounds_stop = threading.Event()
        self._abandoned = False                  # Agent.abandon: a SIGKILL in the tests
        self._load()

    def _load(self) -> None:
        for w in self.db.audit_windows():
            key = (w.topic, w.window_start)
            self._windows[key] = Tally(w.count, w.bytes, w.checksum, w.late, w.dropped,
                                       w.dropped_reasons, w.dropped_unknown)
            self._version[key] = 0
            if w.dirty:
                self._dirty.add(key)
        meta = self.db.audit_meta()
        self.seq = meta.get("seq", 0)
        self.counted_seq: int | None = meta.get("counted_seq")

    # -- counting (any thread; persisted by the main loop) ------------------------------------
    def count_sealed(self, slot: SealedSlot) -> None:
        """A slot was just sealed: tally it while its pages are in memory."""
        if not self.enabled:
            return
        tallies = tally_slot(slot, self.window_ms, int(self.clock() * 1000),
                             self.native_hashes, self.native_tally)
        with self._lock:
            self._pending.append((slot.seq, {(slot.topic, w): t for w, t in tallies.items()}))

    def count_recovered(self, sealed: list[SealedSlot]) -> int:
        """Slots found sealed at start that were sealed after the last persisted count."""
        if not self.enabled:
            return 0
        counted = 0
        if self.counted_seq is None:
            newer = sealed
        else:
            order = seq_order_key([self.counted_seq] + [s.seq for s in sealed])
            newer = [s for s in sealed if order(s.seq) > order(self.counted_seq)]
        for slot in newer:
            self.count_sealed(slot)
            counted += slot.record_count
        if counted:
            log.info("counted %d event(s) of %d slot(s) sealed before the last stop but not yet "
                     "in the audit counts", counted, len(newer))
        return counted

    def uncount(self, topic: str, ts_ms: int, value: bytes) -> None:
        """A counted record will not be delivered (dead-lettered): take it out of ``count``."""
        if not self.enabled:
            return
        t = Tally(1, len(value), value_hash(value))
        with self._lock:
            self._pending.append((None, {(topic, window_start(ts_ms, self.window_ms)):
                                         _negated(t)}))

    def uncount_slot(self, slot: SealedSlot) -> None:
        """A counted slot was dropped (pool full under ``drop_oldest``)."""
        if not self.enabled:
            return
        tallies = tally_slot(slot, self.window_ms, int(self.clock() * 1000),
                             self.native_hashes, self.native_tally)
        with self._lock:
            self._pending.append((None, {(slot.topic, w): _negated(t)
                                         for w, t in tallies.items()}))

    def dropped(self, topic: str, reason: str, events: int, ts_ms: int | None = None) -> None:
        """A drop the loss journal recorded: shown under ``dropped`` of its window, or, when
        its size is unknown (``events`` < 0), under ``dropped_unknown``."""
        if events == 0 or not self.enabled:
            return
        ts = ts_ms if ts_ms is not None else int(self.clock() * 1000)
        with self._lock:
            self._pending_drops.append(((topic, window_start(ts, self.window_ms)), reason,
                                        events))

    def has_pending(self) -> bool:
        return bool(self._pending or self._pending_drops or self._unwritten)

    def persist(self) -> AuditUpdate | None:
        """Apply what was counted since the last call; returns what the state database
        writes, inside the transaction that also moves the file checkpoints (it calls this:
        ``StateDB.advance_sealed``), with every window not yet stored (``persisted``). None:
        nothing was counted."""
        with self._lock:
            pending, self._pending = self._pending, []
            drops, self._pending_drops = self._pending_drops, []
            if not pending and not drops and not self._unwritten:
                return None
            changed: set[tuple[str, int]] = set()
            for seq, tallies in pending:
                for key, t in tallies.items():
                    self._windows.setdefault(key, Tally()).add(t)
                    changed.add(key)
                if seq is not None:
                    self.counted_seq = seq
            for key, reason, events in drops:
                t = self._windows.setdefault(key, Tally())
                if events < 0:
                    t.dropped_unknown[reason] = t.dropped_unknown.get(reason, 0) + 1
                else:
                    t.dropped += events
                    t.dropped_reasons[reason] = t.dropped_reasons.get(reason, 0) + events
                changed.add(key)
            for key in changed:
                self._version[key] = self._version.get(key, 0) + 1
                self._dirty.add(key)
            self._unwritten |= changed
            windows = [AuditWindow(k[0], k[1], t.count, t.bytes, t.checksum, t.late, t.dropped,
                                   dict(t.dropped_reasons), dict(t.dropped_unknown),
                                   self._now_ms())
                       for k in sorted(self._unwritten) if k in self._windows
                       for t in (self._windows[k],)]     # (a round may have retired one)
            return AuditUpdate(windows, self.counted_seq)

    def persisted(self) -> None:
        """The transaction holding the last ``persist``'s windows committed."""
        with self._lock:
            self._unwritten.clear()

    # -- emitting (the rounds' thread, its own database connection) --------------------------
    def start(self) -> None:
        if not self.enabled:
            return
        self._rounds_stop.clear()
        self._rounds = threading.Thread(target=self._round_loop, name="docket-audit-rounds",
                                        daemon=True)
        self._rounds.start()

    def _round_loop(self) -> None:
        """A round every ``interval_ms`` from the start, on the monotonic clock; a round that
        outlasts the interval is followed by the next one an interval after it ends (rounds
        never pile up)."""
        period = self.interval_ms / 1000
        due = self.monotonic() + period
        while not self._rounds_stop.wait(max(0.0, due - self.monotonic())):
            self.emit()
            due += period
            if due <= self.monotonic():
                due = self.monotonic() + period
        if self._abandoned:
            self._producer = None                   # as the process's end would

    def abandon(self) -> None:
        """As a SIGKILL would (``Agent.abandon``): no round starts from now on and none is
        waited for; a round under way settles nothing it sends from now on (what it sent stays
        marked, as after a kill), and the rounds' thread lets go of its producer as it ends."""
        self._abandoned = True
        self._rounds_stop.set()
        self._rounds = None

    def stop(self, last_round: bool = True) -> None:
        """Stop the rounds and send a last one (after the final counts were persisted),
        within ``STOP_BUDGET_S`` in all: a round under way gets ``ROUND_UNDER_WAY_S`` to end,
        then is cut short by purging its records, and the last round waits at most
        ``LAST_ROUND_S`` for its acknowledgements. ``last_round`` False (the cluster does not
        answer): no wait and no last round. Records not acknowledged stay counted and go at
        the next start."""
        if self._rounds is not None:
            self._rounds_stop.set()
            self._rounds.join(ROUND_UNDER_WAY_S if last_round else 0)
            while self._rounds.is_alive():
                producer = self._producer
                if producer is not None:
                    producer.purge(in_queue=True, in_flight=True)
                self._rounds.join(0.1)
            self._rounds = None
        if self.enabled and last_round:
            self.emit(LAST_ROUND_S)
        if self._producer is not None:
            self._producer.purge()
            self._producer.flush(0)
            self._producer = None

    def emit(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> int:
        """One round: changed windows plus heartbeats. Returns the records Kafka acknowledged."""
        with self._emit_lock:
            try:
                return self._emit(timeout_s)
            except Exception:                       # never let a round end the rounds
                log.exception("audit emission failed; the next round sends the counts again")
                self.metrics.inc("agent_audit_emit_failures_total")
                return 0

    def _emit(self, timeout_s: float) -> int:
        now = self._now_ms()
        current = window_start(now, self.window_ms)
        with self._lock:
            keys = set(self._dirty) | {(t, current) for t in self.topics}
            snapshot = {k: (_copy(self._windows.get(k, Tally())), self._version.get(k, 0))
                        for k in keys}
        if not snapshot:
            return 0
        seq = self.seq + 1
        with self.db.audit_round() as db:
            db.save_seq(seq)
            self.seq = seq
            delivered = self._send(snapshot, seq, now, timeout_s)
            if self._abandoned:
                return 0                            # a kill here would have settled nothing
            with self._lock:
                done = [k for k in delivered if self._version.get(k, 0) == snapshot[k][1]]
                self._dirty.difference_update(done)
            db.settle([(k[0], k[1], snapshot[k][0].checksum, snapshot[k][0].count,
                        snapshot[k][0].dropped) for k in done], current - RETENTION_MS)
        with self._lock:
            for k in [k for k in self._windows if k[1] < current - RETENTION_MS
                      and k not in self._dirty]:
                del self._windows[k]
                self._version.pop(k, None)
        self.last_emission_ms = now
        self.metrics.set("agent_audit_last_emission_timestamp_seconds", now / 1000)
        return len(delivered)

    def reconfigure(self, producer_conf: dict) -> None:
        """New client settings (a reload): the next round sends with a new producer."""
        self._new_conf = _audit_producer_conf(producer_conf, self.agent_id)

    def _send(self, snapshot: dict, seq: int, now: int,
              timeout_s: float) -> list[tuple[str, int]]:
        if self._new_conf is not None:
            self._producer_conf, self._new_conf = self._new_conf, None
            if self._producer is not None:
                self._producer.purge()
                self._producer.flush(0)
                self._producer = None
        if self._producer is None:
            self._producer = Producer(self._producer_conf,
                                      logger=logging.getLogger("docket.agent.librdkafka"))
        keys = list(snapshot)
        # Read after the counts were taken: no record they count has a number past ``through``.
        numbers = self.numbers() if self.numbers is not None and self.incarnation is not None \
            else None
        records = [AuditRecord(tier=PRODUCER_TIER, origin=self.agent_id, topic=key[0],
                               window_start=key[1], window_ms=self.window_ms, count=t.count,
                               bytes=t.bytes, checksum=t.checksum,
                               emitter=f"{self.agent_id}/agent", seq=seq, emitted_at=now,
                               dropped=t.dropped, dropped_reasons=dict(t.dropped_reasons),
                               dropped_unknown=dict(t.dropped_unknown), late=t.late,
                               distinct=t.count, duplicates=0, incarnation=self.incarnation,
                               sealed_through=numbers.through if numbers else None).encode()
                   for key, (t, _version) in snapshot.items()]
        if numbers is not None:
            records.append(Ranges.of(
                tier=PRODUCER_TIER, origin=self.agent_id, origin_incarnation=self.incarnation,
                emitter=f"{self.agent_id}/agent", incarnation=self.incarnation, seq=seq,
                emitted_at=now, through=numbers.through, delivered=numbers.delivered,
                missing=[r for r in numbers.dropped if r[1] <= numbers.through]).encode())
        # The windows of records not acknowledged stay marked for the next round.
        acked, errors = deliver(self._producer, self.audit_topic, records, timeout_s,
                                timestamp_ms=now)
        delivered = [keys[i] for i in sorted(acked) if i < len(keys)]
        self.metrics.inc("agent_audit_emitted_records_total", len(delivered))
        if len(delivered) < len(keys):
            self.metrics.inc("agent_audit_emit_failures_total")
            log.warning("audit round %d: %d of %d record(s) not acknowledged (%s); they go "
                        "again next round%s", seq, len(keys) - len(delivered), len(keys),
                        errors[0] if errors else "no answer in time",
                        ", with a new producer" if not acked else "")
        if not acked:
            # Nothing acknowledged: the next round makes a new producer. A client can be left
            # without a broker for good (seen for the drain's producer after a broker pause:
            # agent/drain/drain.py, "Liveness"); a new one starts from the bootstrap servers.
            self._producer.purge()
            self._producer.flush(0)
            self._producer = None
        return delivered

    def snapshot(self) -> dict[tuple[str, int], Tally]:
        with self._lock:
            return {k: _copy(t) for k, t in self._windows.items()}

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)


def _negated(t: Tally) -> Tally:
    """The opposite of ``t`` (``late`` stays: those events did arrive late at the agent)."""
    return Tally(-t.count, -t.bytes, (-t.checksum) % (1 << 64), 0)


def _copy(t: Tally) -> Tally:
    return Tally(t.count, t.bytes, t.checksum, t.late, t.dropped, dict(t.dropped_reasons),
                 dict(t.dropped_unknown))


def _audit_producer_conf(producer_conf: dict, agent_id: str) -> dict:
    """The audit records' producer: the drain's connection and security, its own batching."""
    conf = {**producer_conf, "acks": "all", "enable.idempotence": True, "linger.ms": 50,
            "message.timeout.ms": int(DELIVERY_TIMEOUT_S * 1000) - 500,
            "client.id": f"docket-agent-{agent_id}-audit"}
    for k in ("batch.size", "queue.buffering.max.kbytes", "queue.buffering.max.messages"):
        conf.pop(k, None)
    return conf
