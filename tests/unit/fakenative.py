"""A fake ``docket_native.SlotProducer`` over the same ``FakeKafka`` as the fake confluent-kafka
producer (``fakeproducer.py``): the native send path's seam, for the drain's unit tests and the
simulation.

It keeps the extension's contract (agent/native/src/lib.rs): ``send`` hands records [start, n)
of a block over and returns how many went (fewer when the queue is full); each record's report
counts per slot, a failure is handed back by the next ``poll`` as (token, index, error code,
refused by produce); once ``seal`` said how many records a slot holds and that many reports are
in, ``poll`` returns (token, acknowledged, failed, prefix) once for it; until then ``acked_prefix``
says how many of its records from the first on (or from where ``begin`` said the send began)
are acknowledged. The transaction calls go to the inner producer where it has them (a
``TxProducer``, tests/unit/test_drain_transact_fake.py), answered as the extension answers:
None, or (code, text, fatal, retriable, requires abort).
The records go through a ``FakeProducer`` (every report served), so a test's script — values
that fail, are held, or never answered — applies to both paths alike.
"""

from __future__ import annotations

from confluent_kafka import KafkaException, TopicPartition

from docket_common.names import SEQ_HEADER
from tests.unit.fakeproducer import FakeKafka, FakeProducer


class FakeSlotProducer:
    def __init__(self, conf: dict, kafka: FakeKafka):
        self.conf = conf
        self.inner: FakeProducer = kafka.producer(
            {**conf, "delivery.report.only.error": False, "error_cb": self._error}, "native")
        self.slots: dict[int, dict] = {}
        self.done: list[tuple] = []
        self.failures: list[tuple] = []
        self.errors: list[tuple] = []
        self.logs: list[tuple] = []                # (syslog level, facility, text)
        self.served = 0
        self.fatal: tuple[int, str] | None = None

    def _error(self, err) -> None:
        """librdkafka's error callback, inside the extension: a fatal one is kept for
        ``fatal_error`` (``FakeProducer.fail_fatally`` calls it), any other handed back by
        ``poll``."""
        if err.fatal():
            self.fatal = (err.code(), err.str())
        else:
            self.errors.append((err.code(), err.str()))

    def _slot(self, token: int) -> dict:
        return self.slots.setdefault(token, {"total": None, "acked": 0, "failed": 0,
                                             "prefix": 0, "seen": set()})

    def _count(self, token: int, index: int, err, refused: bool = False) -> None:
        self.served += 1
        slot = self._slot(token)
        if err is None:
            slot["acked"] += 1
            slot["seen"].add(index)
            while slot["prefix"] in slot["seen"]:
                slot["prefix"] += 1
        else:
            slot["failed"] += 1
            self.failures.append((token, index, err.code(), refused))
        self._settle(token)

    def _settle(self, token: int) -> None:
        s = self.slots.get(token)
        if s is not None and s["total"] == s["acked"] + s["failed"]:
            del self.slots[token]
            self.done.append((token, s["acked"], s["failed"], s["prefix"]))

    # -- the extension's methods --------------------------------------------------------------
    def send(self, token, first_index, topic, payload, offsets, lengths, timestamps, headers,
             numbers, keys, start, indices=None) -> int:
        n = len(offsets)
        for i in range(start, n):
            o, ln = int(offsets[i]), int(lengths[i])
            value = bytes(payload[o:o + ln])
            h = list(headers)
            if numbers is not None:
                h.append((SEQ_HEADER, int(numbers[i]).to_bytes(8, "big")))
            index = first_index + i if indices is None else int(indices[i])

            def report(err, msg, token=token, index=index):
                self._count(token, index, err)
            try:
                self.inner.produce(topic, value, keys[i] if keys else None, -1, report, None,
                                   int(timestamps[i]), h or None)
            except BufferError:
                return i
            except KafkaException as exc:
                self._count(token, index, exc.args[0], refused=True)
        return n

    def seal(self, token: int, total: int) -> None:
        self._slot(token)["total"] = total
        self._settle(token)

    def begin(self, token: int, first: int) -> None:
        self._slot(token)["prefix"] = first

    def acked_prefix(self, token: int) -> int:
        s = self.slots.get(token)
        return 0 if s is None else s["prefix"]

    def poll(self, timeout_s: float = 0, wake_fd: int = -1
             ) -> tuple[list[tuple], list[tuple], list[tuple], list[tuple]]:
        self.inner.poll(0)
        out = (self.failures, self.done, self.errors, self.logs)
        self.failures, self.done, self.errors, self.logs = [], [], [], []
        return out

    def name(self) -> str:
        return "fake#native"

    def reported(self, token: int) -> int:
        s = self.slots.get(token)
        return 0 if s is None else s["acked"] + s["failed"]

    def reports(self) -> int:
        return self.served

    def __len__(self) -> int:
        return len(self.inner)

    def purge(self, in_flight: bool = False) -> None:
        self.inner.purge(in_queue=True, in_flight=in_flight)

    def fatal_error(self) -> tuple[int, str] | None:
        return self.fatal

    def flush(self, timeout_s: float = 0) -> bool:
        return self.inner.flush(timeout_s) == 0

    # -- transactions (the inner producer's, where it has them) -------------------------------
    @staticmethod
    def _txn(call) -> tuple | None:
        try:
            call()
        except KafkaException as exc:
            e = exc.args[0]
            return e.code(), e.str(), e.fatal(), e.retriable(), e.txn_requires_abort()
        return None

    def init_transactions(self, timeout_s: float) -> tuple | None:
        return self._txn(lambda: self.inner.init_transactions(timeout_s))

    def begin_transaction(self) -> tuple | None:
        return self._txn(self.inner.begin_transaction)

    def send_offsets_to_transaction(self, topic: str, partition: int, offset: int,
                                    metadata: str, group: str, timeout_s: float
                                    ) -> tuple | None:
        marker = [TopicPartition(topic, partition, offset, metadata=metadata)]
        return self._txn(lambda: self.inner.send_offsets_to_transaction(marker, group,
                                                                         timeout_s))

    def commit_transaction(self, timeout_s: float) -> tuple | None:
        return self._txn(lambda: self.inner.commit_transaction(timeout_s))

    def abort_transaction(self, timeout_s: float) -> tuple | None:
        return self._txn(lambda: self.inner.abort_transaction(timeout_s))
