"""The drain with the native send path (``broker.send_path`` ``auto``, where the extension is
installed, or ``native``; ``choose_send_path`` below): a slot's blocks are handed to
``docket_native.SlotProducer`` (agent/native) as the pool frames them, and the record loop and
every delivery report run in native code. The drain hears of each failure by its index
in the slot (no search for its record among twins), and once per slot that every record of it
was reported: the slot is complete when that report is in and nothing of it waits to go again
(no zero points for it). So more slots may be on their way than on the Python path: up to
``NATIVE_MAX_INFLIGHT_SLOTS`` (and a quarter of the pool's slots), holding together no more
than ``MAX_INFLIGHT_SLOTS`` full slots' bytes (``drain.room_in_flight``) — small slots, a few
files' lines each, no longer wait in line.

Everything else is the drain's (``Drain``), unchanged: a failure is classified as in the Python
path (RETRY, ALONE, DENIED, DEAD) and handled by the same code — records to send again go back
through the native producer, block by block under a token of their own (``_resend``), records
too large with their batch go alone through the lone producer (a Python one, built when first
needed), dead ones to the dead-letter folder and the journal; the liveness watch sees the
native reports move and purges the native queue too; a fatal error, new settings or a stall
replace the producers, and a slot whose report is not in is sent again from its acknowledged
prefix on (``_again``), but for its dead records. At start, a check reads back what Kafka
took of the slots past their prefixes before anything goes (``delivered.py``). There is no other
producer: one client that can stop answering, not two (the Python producer that carried the
resends here before, and that the outage probe asked, was the one found stuck after a 30 s
broker pause, holding its slots and making the probe say the cluster was gone).

The payload is read from the pool's map while its blocks are handed over (librdkafka copies
each value); the slot's pages are then released, and read again only for a failure.
"""

from __future__ import annotations

import bisect
import logging

import numpy as np
from confluent_kafka import KafkaError

from docket_common.names import INCARNATION_HEADER, ORIGIN_HEADER, SEQ_HEADER

from ..buffer import SealedSlot
from ..buffer.framing import iter_blocks
from .delivered import OVERDUE_GRACE_S, DeliveredCheck
from .drain import PUMP_BUDGET, Drain, in_flight_at_most
from .headers import Record
from .slotsend import SendState

log = logging.getLogger("docket.agent.drain")
# librdkafka's own lines, under the logger the Python path's client logs to (agent/logs.py
# quiets its bursts); syslog levels as confluent-kafka maps them.
rdlog = logging.getLogger("docket.agent.librdkafka")
SYSLOG_LEVELS = {0: logging.CRITICAL, 1: logging.CRITICAL, 2: logging.CRITICAL, 3: logging.ERROR,
                 4: logging.WARNING, 5: logging.INFO, 6: logging.INFO, 7: logging.DEBUG}


class NativeUnavailable(Exception):
    """``broker.send_path = "native"`` on a host without the extension."""


def native_module():
    try:
        import docket_native
    except ImportError as exc:
        state = "is installed but does not load" if _present() else "is not installed here"
        raise NativeUnavailable(
            "broker.send_path = \"native\" needs the native extension (docket_native), which "
            f"{state} ({exc}); build it with `make native`, or set "
            "send_path = \"auto\" (the Python path where it is not installed)") from exc
    return docket_native


def native_refusal(conf: dict) -> str | None:
    """Why the extension's librdkafka refuses the producer settings ``conf``, or None: a
    producer made and dropped (it contacts nobody when ``conf`` names no bootstrap servers)."""
    try:
        native_module().SlotProducer(_native_conf(conf))
    except ValueError as exc:
        return str(exc)
    return None


def extension_installed() -> bool:
    try:
        native_module()
    except NativeUnavailable:
        return False
    return True


def choose_send_path(setting: str, installed: bool | None = None) -> tuple[str, str]:
    """The send path an agent runs for ``broker.send_path`` = ``setting``, and why (for its
    ready line). ``auto`` is the native path wherever the extension imports, the Python path
    where it does not (said, with how to build it), with either delivery (exactly once:
    ``native_txn.py``); an explicit ``native`` or ``python`` is taken as it is.
    ``installed``: whether the extension is there (None: try to import it)."""
    if setting != "auto":
        return setting, "set by broker.send_path"
    if extension_installed() if installed is None else installed:
        return "native", "auto: the native extension is installed"
    broken = None if installed is not None else _load_failure()
    if broken is not None:
        return "python", (f"auto: the native extension (docket_native) is installed but does "
                          f"not load ({broken}); `make native` builds it again")
    return "python", ("auto: the native extension (docket_native) is not installed here; "
                      "`make native` builds it")


def _present() -> bool:
    """Whether the extension is installed, whether or not it imports."""
    import importlib.util

    return importlib.util.find_spec("docket_native") is not None


def _load_failure() -> str | None:
    """Why an installed extension does not import (its librdkafka gone, e.g. after
    confluent-kafka was upgraded without building it again); None when none is installed."""
    if not _present():
        return None
    try:
        import docket_native  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


def _native_conf(conf: dict) -> dict[str, str]:
    """librdkafka's properties as text (the Python client takes Python values); the drain's
    callbacks are the Python producer's own."""
    out = {}
    for k, v in conf.items():
        if callable(v):
            continue
        out[k] = str(v).lower() if isinstance(v, bool) else str(v)
    return out


class NativeSend(SendState):
    """One sealed slot on its way through the native producer: a cursor over its blocks, and
    what became of its records. The drain's handlers use it as they use a ``SlotSend``."""

    def __init__(self, slot: SealedSlot, token: int, blocks: list[tuple],
                 previous: NativeSend | None = None, skipped: int = 0,
                 found: frozenset[int] = frozenset()):
        self.slot = slot
        self.token = token
        self.skipped = skipped          # records before the first block: acknowledged before
        # Records past that prefix found in Kafka at start (``delivered.py``): left out
        self.found = found if previous is None else previous.found
        self.total = slot.record_count - skipped - len(self.found)
        self.noted = skipped            # the acknowledged prefix last kept in the slot's header
        self.carried = 0                # of ``skipped``: acknowledged in this process, to the
        #                                 sends this one replaced (counted as sent with it)
        self.blocks = blocks            # (first index, offsets, lengths, times, numbers, keys,
        #                                  headers), arrays of the slot's records, in order
        self.firsts = [b[0] for b in blocks]
        self.bi = self.ri = 0
        self.sealed = False             # every block handed over, and the producer told so
        self.handed_native = 0
        self.tokens: dict[int, int] = {}        # token → records handed under it, its report
        #                                         not in: the send's own, and its resends'
        self.retry: list[Record] = []
        self.alone: list[Record] = []
        self.alone_out = 0
        self.pending: Record | None = None
        self.handed = 0                 # the drain's hand-over number of its last resend
        self.retired = False
        self.index_of: dict[int, int] = {}      # id(record) → its index, for records made here
        # A slot sent while it fills (``BufferPool.take_filling``): its ``Filling`` until it
        # is sealed (``closed`` then), and the bytes of it whose blocks ``blocks`` holds.
        self.begin_at = 0               # counted as acknowledged by the next producer
        self.fill = None if previous is None else previous.fill
        self.parsed = slot.meta.used_bytes if previous is None else previous.parsed
        self.closed = True if previous is None else previous.closed
        if previous is None:
            self.dead_records: list[Record] = []
            self.dead_index: set[int] = set()
        else:
            previous.retired = True
            self.dead_records = previous.dead_records
            self.dead_index = previous.dead_index
            self.carried = previous.carried + skipped - previous.skipped

    @property
    def acked(self) -> int:
        return self.total - self.dead + self.carried

    @property
    def to_send_again(self) -> int:
        """Records a send in its place would carry: past the acknowledged prefix, not dead."""
        return self.total - self.dead - (self.noted - self.skipped)

    @property
    def open(self) -> bool:
        """Records handed to the native producer whose report is not in."""
        return bool(self.tokens)

    def finished(self, settled: int) -> bool:
        return (self.closed and not self.unsent and not self.open and not self.waiting()
                and self.handed <= settled)

    def grow(self, slot: SealedSlot, blocks: list[tuple]) -> None:
        """The slot sent while it fills holds more: ``slot`` (what it holds now, or the slot
        sealed) with ``blocks``, those of its records past the ones this send has."""
        self.slot = slot
        self.blocks.extend(blocks)
        self.firsts.extend(b[0] for b in blocks)
        self.total = slot.record_count - self.skipped - len(self.found)
        self.parsed = slot.meta.used_bytes

    def _locate(self, index: int) -> tuple[tuple, int]:
        """The block holding record ``index`` of the slot, and the record's place in it."""
        b = bisect.bisect_right(self.firsts, index) - 1
        return self.blocks[b], index - self.blocks[b][0]

    def record(self, index: int) -> Record:
        """Record ``index`` of the slot, as the drain's Python code takes records."""
        (first, offsets, lengths, times, numbers, keys, headers), i = self._locate(index)
        o = int(offsets[i])
        value = self.slot.payload[o:o + int(lengths[i])].tobytes()
        h = list(headers) if headers else []
        if numbers is not None:
            h.append((SEQ_HEADER, int(numbers[i]).to_bytes(8, "big")))
        rec = (self.slot.topic, value, keys[i] if keys else None, int(times[i]), h or None)
        self.index_of[id(rec)] = index
        return rec

    def resend_blocks(self, records: list[Record]) -> list[tuple[list[Record], tuple]]:
        """``records`` (this send's, to go again) grouped by the block of the slot that holds
        them, in the slot's order: per block, (its records, (indices, offsets, lengths, times,
        numbers or None, keys or None, headers)), the arrays as the native producer takes
        them."""
        groups: dict[int, list[tuple[int, Record]]] = {}
        for index, record in sorted(((self.index_of[id(r)], r) for r in records),
                                    key=lambda pair: pair[0]):
            groups.setdefault(self._locate(index)[0][0], []).append((index, record))
        out = []
        for pairs in groups.values():
            (first, offsets, lengths, times, numbers, keys, headers), _ = \
                self._locate(pairs[0][0])
            indices = np.fromiter((i for i, _r in pairs), dtype=np.int64, count=len(pairs))
            at = indices - first
            out.append(([r for _i, r in pairs],
                        (indices, offsets[at], lengths[at], times[at],
                         numbers[at] if numbers is not None else None,
                         [keys[i] for i in at.tolist()] if keys else None, headers)))
        return out


class NativeDrain(Drain):
    """``Drain`` with the records of each slot sent by ``docket_native.SlotProducer``."""

    WAKES_ON_FD = True         # the extension's poll sleeps on a descriptor of the caller's too
    REPORTS_PER_SLOT = True    # no zero point needed: more small slots may be on their way
    NOTES_ACKED = True         # a slot's header keeps its acknowledged prefix (not with
    #                            transactions: an acknowledged record is not yet committed)

    def __init__(self, *args, native_factory=None, delivered_consumer=None,
                 delivered_check_s: float = 0.0, **kwargs):
        self.native_factory = native_factory or (lambda conf: native_module().SlotProducer(conf))
        super().__init__(*args, **kwargs)
        # At start: which records past the slots' acknowledged prefixes are in Kafka already
        # (``delivered.py``); nothing is sent until it is done.
        self._found: dict[int, set[int]] = {}
        self._check: DeliveredCheck | None = None
        if delivered_consumer is not None and delivered_check_s > 0 and self.numbered:
            # The drain takes slots in sequence order while there is room: only the oldest
            # that many can have been on their way when the agent stopped.
            sealed = sorted(self.pool.sealed(), key=lambda s: s.meta.seq)
            window = sealed[:in_flight_at_most([s.meta.used_bytes for s in sealed],
                                               self.pool.geometry, native=True)]
            slots = [s for s in window if s.acked_before < s.record_count]
            if slots:
                ids = dict(self.origin_headers)
                self._check = DeliveredCheck(
                    slots, self.conf, delivered_consumer, ids[ORIGIN_HEADER],
                    ids[INCARNATION_HEADER], delivered_check_s)
        self.native = self.native_factory(self._native_producer_conf())
        self.native_name = _client_name(self.native)
        self._sends: dict[int, NativeSend] = {}        # token → the send its reports are for
        self._filling: NativeSend | None = None         # the send of the slot filling
        self._tokens = 0
        self._reports_before = 0        # reports served by native producers since replaced

    def _producer_overrides(self) -> dict:
        """Settings a mode adds to the agent's producer settings (exactly once's)."""
        return {}

    def _native_producer_conf(self) -> dict[str, str]:
        return _native_conf({**self.conf, **self._producer_overrides()})

    def _new_producer(self) -> None:
        """No Python producer: every record of a slot goes through the native one, resends
        too (only records too large with their batch go alone, through the lone producer)."""
        return None

    def describe(self) -> str:
        try:
            version = native_module().LIBRDKAFKA_VERSION
        except NativeUnavailable:               # a test's stand-in producer
            version = "?"
        return f"native (docket_native, librdkafka {version})"

    # -- blocks as arrays --------------------------------------------------------------------
    def block_arrays(self, slot: SealedSlot, leave_out: set[int] | frozenset[int] = frozenset(),
                     skip: int = 0, at: tuple[int, int] = (0, 0)) -> list[tuple]:
        """Per block: (first index, offsets, lengths, times, numbers or None, keys or None,
        headers), the arrays as the native producer takes them; records in ``leave_out``
        (dead-lettered before this send, or found in Kafka at start) and the first ``skip``
        (acknowledged before it) left out — a block with some left out goes as its runs of
        kept records. ``at``: (byte, index) of the block to begin with — a slot sent while it
        fills goes on from the blocks its send has."""
        out = []
        left = np.array(sorted(leave_out), dtype=np.int64) if leave_out else None
        index, number = at[1], slot.meta.first_record + at[1]
        for block in iter_blocks(slot.payload, at[0]):
            n = len(block.offsets)
            if index + n <= skip:
                index, number = index + n, number + n
                continue
            headers = self.block_headers(block)
            numbers = np.arange(number, number + n, dtype=np.int64) if self.numbered else None
            arrays = (block.offsets.astype(np.int64), block.lengths.astype(np.int64),
                      block.timestamps.astype(np.int64), numbers, block.keys)
            if skip > index:                    # the block the acknowledged prefix ends in
                cut = skip - index
                arrays = tuple(a[cut:] if a is not None else None for a in arrays)
                index, number, n = skip, number + cut, n - cut
            lo, hi = np.searchsorted(left, (index, index + n)) if left is not None else (0, 0)
            if hi > lo:
                kept = np.ones(n, dtype=np.int8)
                kept[left[lo:hi] - index] = 0
                edges = np.flatnonzero(np.diff(np.concatenate(([0], kept, [0]))))
                for a, b in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
                    out.append((index + a, *(x[a:b] if x is not None else None
                                             for x in arrays), headers))
            else:
                out.append((index, *arrays, headers))
            index, number = index + n, number + n
        return out

    # -- sending ------------------------------------------------------------------------------
    def _start(self, slot: SealedSlot) -> NativeSend:
        """A slot found in the pool at start goes from its acknowledged prefix on, less the
        records past it that the start's check found in Kafka (``delivered.py``)."""
        skip = slot.acked_before
        found = frozenset(self._found.pop(slot.meta.seq, ()))
        send = NativeSend(slot, self._next_token(), self.block_arrays(slot, found, skip=skip),
                          skipped=skip, found=found)
        if skip:
            self.native.begin(send.token, skip)
            self.metrics.inc("agent_drain_skipped_acknowledged_total", skip,
                             topic=slot.topic)
        if found:
            self.metrics.inc("agent_drain_found_delivered_total", len(found), topic=slot.topic)
        return self._register(send)

    def _send_filling(self) -> None:
        """The pool's slot sent while it fills (``BufferPool.send_filling``): what it holds
        goes on one send, begun once every slot sealed before it is on its way (the pool
        chose it then) and grown as it fills, each time after the pool showed it (sealed in
        its header what it holds so far); once it is sealed whole the send goes on with the
        sealed slot and ends as any other."""
        send = self._filling
        if send is not None and not send.retired:
            fill = send.fill
            view = self.pool.show_filling(fill)
            if view is None:
                if fill.sealed is None:
                    return                  # nothing new, or closed and not yet sealed
                view = fill.sealed
                send.fill, send.closed, self._filling = None, True, None
            if view.meta.used_bytes > send.parsed:
                send.grow(view, self.block_arrays(view, at=(send.parsed,
                                                            send.slot.record_count)))
            else:
                send.slot = view
            if send.closed:
                self._handed_all(send)      # when every block of it went before it was sealed
            return
        if self.outage or self._fatal is not None or not self._room_in_flight():
            return
        early = self.pool.filling_send()
        if early is None or early[0] in self._denied:
            return                  # a refused topic's slot is sealed first, and waits
        taken = self.pool.take_filling()
        if taken is None:
            return
        fill, view = taken
        send = NativeSend(view, self._next_token(), self.block_arrays(view))
        send.fill, send.closed = fill, False
        self._filling = self._register(send)
        self.inflight.append(send)

    def waits_for_seal(self) -> bool:
        send = self._filling
        return (send is not None and len(self.inflight) == 1 and self.inflight[0] is send
                and not send.unsent and not send.waiting())

    def _next_token(self) -> int:
        self._tokens = (self._tokens + 1) & 0xFFFFFFFF
        return self._tokens

    def _register(self, send: NativeSend) -> NativeSend:
        """``send``'s reports are looked up by its token."""
        self._sends[send.token] = send
        return send

    def _produce_new(self, send, budget: int) -> tuple[int, bool]:
        if not isinstance(send, NativeSend):
            return super()._produce_new(send, budget)
        n = self._pending_first(send)
        if n is None:
            return 0, True
        payload = send.slot.payload
        while send.bi < len(send.blocks) and n < budget:
            first, offsets, lengths, times, numbers, keys, headers = send.blocks[send.bi]
            stop = min(len(offsets), send.ri + budget - n)
            done = self.native.send(send.token, first, send.slot.topic, payload,
                                    offsets[:stop], lengths[:stop], times[:stop], headers,
                                    numbers[:stop] if numbers is not None else None,
                                    keys[:stop] if keys else None, send.ri)
            n += done - send.ri
            send.handed_native += done - send.ri
            send.tokens[send.token] = send.handed_native
            if done < stop:                     # librdkafka's queue is full
                send.ri = done
                return n, True
            if stop == len(offsets):
                send.bi, send.ri = send.bi + 1, 0
            else:
                send.ri = stop
        self._handed_all(send)
        return n, False

    def _handed_all(self, send: NativeSend) -> None:
        """Once every record of a sealed slot was handed over, the native producer is told
        how many: it reports the slot done when that many are reported."""
        if not send.unsent and not send.sealed and send.closed:
            send.sealed = True
            self.native.seal(send.token, send.handed_native)
            self.pool.release_pages(send.slot)       # librdkafka holds its copies now

    def _resend(self, send, budget: int) -> int:
        """A slot's records that came back RETRY go again through the native producer (the
        one client of this path: no second producer to go quiet with them), under a token of
        their own, block by block, before anything new."""
        if not isinstance(send, NativeSend):
            return super()._resend(send, budget)
        todo, send.retry = send.retry[:budget], send.retry[budget:]
        groups = send.resend_blocks(todo)
        n = 0
        for g, (records, (indices, offsets, lengths, times, numbers, keys, headers)) in \
                enumerate(groups):
            token = self._next_token()
            done = self.native.send(token, 0, send.slot.topic, send.slot.payload, offsets,
                                    lengths, times, headers, numbers, keys, 0, indices)
            for record in records[:done]:
                del send.index_of[id(record)]
            if done:
                self._sends[token] = send
                send.tokens[token] = done
                self.native.seal(token, done)
                n += done
            if done < len(records):             # librdkafka's queue is full: the rest later
                later = records[done:] + [r for rs, _ in groups[g + 1:] for r in rs]
                send.retry = later + send.retry
                break
        return n

    def wait(self, timeout_s: float, wake_fd: int = -1) -> None:
        self._poll(timeout_s, wake_fd)

    def _poll(self, timeout_s: float = 0, wake_fd: int = -1) -> None:
        failures, done, errors, lines = self.native.poll(timeout_s, wake_fd)
        for level, fac, text in lines:
            rdlog.log(SYSLOG_LEVELS.get(level, logging.INFO), "%s [%s] %s", fac,
                      self.native_name, text)
        for code, text in errors:             # the client's own (transport, authentication)
            self._on_error(KafkaError(code, text))
        for token, index, code, refused in failures:
            send = self._sends.get(token)
            if send is not None and not send.retired:
                self.failed(send, send.record(index), KafkaError(code), alone=refused)
        for token, _acked, _failed, prefix in done:
            send = self._sends.pop(token, None)
            if send is not None:
                send.tokens.pop(token, None)
                if token == send.token and not send.retired and prefix > send.noted \
                        and self.NOTES_ACKED:
                    self.pool.note_acked(send.slot, prefix)
                    send.noted = prefix
        self._note_acked()
        super()._poll(0)

    def _note_acked(self) -> None:
        """Each slot in flight keeps in its header how many of its records, from the first
        on, Kafka acknowledged: a start after a crash sends it from there."""
        if not self.NOTES_ACKED:
            return
        for token, send in self._sends.items():
            if token != send.token or send.retired:
                continue                        # a resend's token, or a send replaced
            prefix = self.native.acked_prefix(token)
            if prefix > send.noted:
                self.pool.note_acked(send.slot, prefix)
                send.noted = prefix

    def _dead_letter(self, send, record: Record, err: KafkaError) -> bool:
        if not super()._dead_letter(send, record, err):
            return False
        if isinstance(send, NativeSend) and id(record) in send.index_of:
            send.dead_index.add(send.index_of[id(record)])
        return True

    # -- what is outstanding, outages, rebuilding -----------------------------------------------
    def _python_outstanding(self) -> int:
        return super()._outstanding()

    def _outstanding(self) -> int:
        return self._python_outstanding() + len(self.native)

    def _acked_now(self) -> int:
        return (self.handed + self.handed_alone - self._python_outstanding()
                + self._reports_before + self.native.reports())

    def pump(self, budget: int = PUMP_BUDGET, reports: bool = True) -> int:
        if self._check is not None and not self._checked():
            return 0
        fatal = self.native.fatal_error()
        if fatal is not None and self._fatal is None:
            self._fatal = KafkaError(fatal[0], fatal[1], fatal=True)
        self._send_filling()
        return super().pump(budget, reports)

    def _checked(self) -> bool:
        """Whether the start's check is over (its findings taken, and said, once)."""
        check = self._check
        if not check.done.is_set():
            if not check.overdue():
                return False
            self._check, self._found = None, {}
            log.warning("start: the check of what Kafka took did not end within its %.0f s "
                        "(and %.0f s more): the slots go again from their prefixes",
                        check.budget_s, OVERDUE_GRACE_S)
            return True
        self._check, self._found = None, check.found
        refused = check.outcome.startswith(("refused", "failed"))
        log.log(logging.WARNING if refused else logging.INFO, "start: %s", check.describe())
        return True

    def checking(self) -> bool:
        """The start's check is under way: nothing goes until it is over (or overdue)."""
        return self._check is not None and not self._check.done.is_set() \
            and not self._check.overdue()

    def drain_until(self, deadline: float) -> bool:
        """A stop while the start's check is under way sends nothing: every slot stays in the
        pool for the next start (which checks again)."""
        if self.checking():
            return self.idle()
        return super().drain_until(deadline)

    def _purge(self, in_flight: bool = False) -> None:
        self.native.purge(in_flight=in_flight)
        super()._purge(in_flight=in_flight)

    def _unreported(self, send) -> bool:
        """A native send is unreported when a record it handed over (under its own token, or
        a resend's) has no report (every report served by the purge before the rebuild counts:
        a send cut off by the budget or a full queue, all of whose records were reported, goes
        on from its cursor)."""
        if isinstance(send, NativeSend) and any(
                self.native.reported(token) < handed for token, handed in send.tokens.items()):
            return True
        return super()._unreported(send)

    def _again(self, send):
        """A native send whose report is not in goes again, but for its dead records and its
        acknowledged prefix."""
        if not isinstance(send, NativeSend):
            return super()._again(send)
        skip = max(send.skipped, send.noted)         # acknowledged from the first on
        again = NativeSend(send.slot, self._next_token(),
                           self.block_arrays(send.slot, send.dead_index | send.found,
                                             skip=skip),
                           previous=send, skipped=skip)
        again.begin_at = skip           # told to the producer that replaces this one
        if self._filling is send:
            self._filling = again
        return self._register(again)

    def _new_producers(self) -> None:
        super()._new_producers()
        self._sends = {t: s for t, s in self._sends.items() if not s.retired}
        # How many records of each send, from its first on, count as acknowledged on the new
        # producer: what the old one counted for a send that goes on (every record it handed
        # over was reported), where a send made again begins; else a slot's acknowledged
        # prefix stopped growing at the rebuild (more sent twice after a later crash).
        begins = {t: max(self.native.acked_prefix(t), s.begin_at)
                  for t, s in self._sends.items() if t == s.token}
        self._reports_before += self.native.reports()
        self.native = self.native_factory(self._native_producer_conf())
        self.native_name = _client_name(self.native)
        for token, first in begins.items():
            if first:
                self.native.begin(token, first)
        for send in self._sends.values():
            if send.open:               # every record it handed over was reported: the new
                send.tokens.clear()     # producer takes it from its cursor
                send.sealed = False
                send.handed_native = 0

    def close(self) -> None:
        self.native.purge(in_flight=True)
        self.native.poll(0)              # serves every report the purge made
        self.native.flush(0)             # (what is left stays in its slots for the next start)
        super().close()


def _client_name(producer) -> str:
    """How the native client is named in the agent's log: librdkafka's name for it, which
    counts clients per librdkafka copy (the Python path's client in the same process can have
    the same), marked as the native one's."""
    return f"native {producer.name()}"
