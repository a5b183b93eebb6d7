"""Exactly once on the native send path (``broker.delivery = "exactly_once"`` where the
extension is installed): the transactions of ``transact.py`` — the progress marker, fencing,
aborts and sending again, refused topics, one record per batch — with each slot's records
handed to ``docket_native.SlotProducer`` as ``native.py`` hands them, and the transaction
calls made on that producer (``init_transactions`` … ``abort_transaction``, the extension's,
answering with librdkafka's errors as confluent-kafka's ``KafkaError``: the same rules decide).

What the native path does that a transaction must not:

- a slot's acknowledged prefix is not kept in its header (``NOTES_ACKED``): an acknowledged
  record is in Kafka but not yet committed, and an abort takes it back; a start sends every
  slot the marker does not name from its first record (a prefix that an at-least-once run
  kept is still honoured: those records are in Kafka outside any transaction);
- no slot is sent while it fills (the service turns that off): a transaction holds sealed
  slots only, and the marker names each by its first record and count;
- no read-back of what Kafka took at start (``delivered.py``): the marker says it.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from .drain import PUMP_BUDGET
from .native import NativeDrain
from .transact import CALL_TIMEOUT_S, TransactionalDrain, let_go

JOB_WAIT_S = 0.002              # a wait while a transaction call runs (the loop's IDLE_WAIT_S)


def _raised(outcome) -> None:
    """The extension's answer to a transaction call: None, or (code, text, fatal, retriable,
    requires abort), raised as confluent-kafka raises it."""
    if outcome is not None:
        code, text, fatal, retriable, abortable = outcome
        raise KafkaException(KafkaError(code, text, fatal=fatal, retriable=retriable,
                                        txn_requires_abort=abortable))


class NativeTransactions:
    """A native producer's transaction calls in confluent-kafka's shape (``transact.py``
    calls them): errors raised as ``KafkaException``; the group of the marker is its id."""

    def __init__(self, native):
        self.native = native

    def init_transactions(self, timeout_s: float) -> None:
        _raised(self.native.init_transactions(timeout_s))

    def begin_transaction(self) -> None:
        _raised(self.native.begin_transaction())

    def send_offsets_to_transaction(self, offsets, group: str, timeout_s: float) -> None:
        for tp in offsets:
            _raised(self.native.send_offsets_to_transaction(
                tp.topic, tp.partition, tp.offset, tp.metadata or "", group, timeout_s))

    def commit_transaction(self, timeout_s: float) -> None:
        _raised(self.native.commit_transaction(timeout_s))

    def abort_transaction(self, timeout_s: float) -> None:
        _raised(self.native.abort_transaction(timeout_s))


class NativeTransactionalDrain(TransactionalDrain, NativeDrain):
    """``TransactionalDrain``'s rules over ``NativeDrain``'s sending (the order of the bases:
    the transactions' pump, the native path's hand-over, reports and sends again)."""

    NOTES_ACKED = False

    def __init__(self, *args, **kwargs):
        self._fatal_taken_from = None    # the producer whose fatal error was taken (once)
        super().__init__(*args, **kwargs)

    def _new_producer(self) -> None:
        return None                     # no Python producer: the native one sends it all

    def _txn(self) -> NativeTransactions:
        return NativeTransactions(self.native)

    def _group_metadata(self) -> str:
        return self.txn_id

    def _poll(self, timeout_s: float = 0, wake_fd: int = -1) -> None:
        NativeDrain._poll(self, timeout_s, wake_fd)

    def _init_failed(self, err: KafkaError) -> None:
        """librdkafka keeps an init's fatal error (an ACL refused) as the producer's: taken
        here, not again at the next pump (which would refuse it a second time)."""
        self._fatal_taken_from = self.native
        super()._init_failed(err)

    def _purge_queued(self) -> None:
        self.native.purge(in_flight=False)

    def _swap_producer(self) -> None:
        """Every send of the old producer was made again (retired) before this: the reports
        its purge makes are for none of them."""
        old = self.native
        old.purge(in_flight=True)
        self._poll(0)
        self._new_producers()
        self._fatal_taken_from = None    # held, it would keep the old producer alive
        let_go(old)
        del old

    def _abort_open(self) -> None:
        self.native.purge(in_flight=True)
        self._poll(0)
        self._txn().abort_transaction(CALL_TIMEOUT_S)

    def _flush_at_stop(self) -> None:
        self.native.flush(0)

    def wait(self, timeout_s: float, wake_fd: int = -1) -> None:
        """While a transaction call runs (its end comes with no report to end the wait), at
        most ``JOB_WAIT_S``: the Python path's turn, so a commit is taken up at once."""
        if self.job is not None:
            timeout_s = min(timeout_s, JOB_WAIT_S)
        NativeDrain.wait(self, timeout_s, wake_fd)

    def pump(self, budget: int = PUMP_BUDGET, reports: bool = True) -> int:
        """A producer's fatal error is taken once (librdkafka keeps it for the producer's
        life): one refused for a missing ACL waits ``DENIED_RETRY_S`` and is replaced."""
        fatal = self.native.fatal_error()
        if fatal is not None and self._fatal is None \
                and self._fatal_taken_from is not self.native:
            self._fatal_taken_from = self.native
            self._fatal = KafkaError(fatal[0], fatal[1], fatal=True)
        return TransactionalDrain.pump(self, budget, reports)
