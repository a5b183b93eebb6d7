"""A slot sent while it fills (``buffer.send_filling``, ``agent/buffer/sending.py``): at low
rates each line goes to Kafka as it is read, from the one filling slot, which is sealed once
``seal_every_ms`` after its first record instead of once per line. Before anything of it is
sent the pool *shows* it — its records so far sealed in its header — so a crash finds the
records sent under the numbers they were sent with; no other slot opens, closes or takes a
number while it fills."""

from __future__ import annotations

import errno

import pytest

from agent.buffer import BufferPool, Chunk
from agent.buffer.seams import FileOps
from agent.buffer.slots import CAUGHT_UP_IN_FLIGHT
from agent.config import parse
from agent.service import Agent, Seams
from tests.unit.fakenative import FakeSlotProducer
from tests.unit.fakeproducer import FakeKafka
from tests.unit.poolkit import SIZE, SLOT, FakeClock, chunk_of, ids_of
from tests.unit.tailkit import FakeClock as AgentClock
from tests.unit.test_buffer_pool import threaded_pool, until

SEQ = "docket-seq"


def _pool(tmp_path, **kw) -> BufferPool:
    return BufferPool(tmp_path / "pool", SIZE, SLOT, linger_ms=1e9, send_filling=True,
                      seal_every_ms=1000, clock=FakeClock(), **kw)


def _ids(slot) -> list[int]:
    return ids_of(v for _, _, v in slot.records())


# -- the pool ----------------------------------------------------------------------------------
def test_a_shown_slot_survives_a_crash_sealed_with_the_records_sent_under_their_numbers(
        tmp_path):
    pool = _pool(tmp_path, first_record=100)
    pool.append("t", chunk_of(range(3)), source=7, source_start=0)
    pool.seal_due(caught_up=True)                   # a reader that caught up: sent filling
    assert pool.stats()["slots_sealed"] == 0
    fill, view = pool.take_filling()
    assert (view.first_record, _ids(view)) == (100, [0, 1, 2])
    pool.note_acked(view, 2)                        # Kafka acknowledged the first two
    pool.append("t", chunk_of(range(3, 5)), source=7, source_start=3 * 41)
    view = pool.show_filling(fill)
    assert _ids(view) == [0, 1, 2, 3, 4] and view.seq == fill.seq
    assert pool.show_filling(fill) is None          # nothing new since
    assert pool.record_marks() == (104, 99)         # numbers 100-104 given, none settled
    pool.append("t", chunk_of(range(5, 7)), source=7, source_start=5 * 41)   # not shown
    pool.abandon()                                  # a crash: the slot is still filling

    again = _pool(tmp_path)
    [slot] = again.sealed()
    assert (slot.seq, slot.first_record, _ids(slot)) == (fill.seq, 100, [0, 1, 2, 3, 4])
    assert slot.acked_before == 2                   # sent on from the third record
    assert slot.meta.positions == ((7, 0, 5 * 41),)   # the file is read on from line 5
    assert again.next_record == 105                 # no number sent is given again
    again.close()


def test_its_seal_keeps_the_numbers_and_the_acknowledged_prefix_and_goes_to_its_send(tmp_path):
    sealed = []
    pool = _pool(tmp_path, on_seal=sealed.append)
    pool.append("t", chunk_of(range(2)), source=1, source_start=0)
    pool.seal_due(caught_up=True)
    fill, view = pool.take_filling()
    pool.note_acked(view, 1)
    pool.append("t", chunk_of(range(2, 4)), source=1, source_start=2 * 41)
    pool.clock.advance_ms(999)
    pool.seal_due(caught_up=True)
    assert not sealed and pool.seal_at_ns() == pool.clock.now + 1_000_000
    pool.clock.advance_ms(1)
    pool.seal_due(caught_up=True)                   # seal_every_ms after its first record
    [slot] = sealed
    assert fill.sealed is slot and _ids(slot) == [0, 1, 2, 3] and slot.first_record == 0
    assert pool.take() == [], "its send goes on with it: never handed out again"
    assert pool.filling_send() is None and pool.next_record == 4
    pool.close()
    again = BufferPool(tmp_path / "pool", SIZE, SLOT, clock=FakeClock())
    assert again.sealed()[0].acked_before == 1      # the seal did not wipe the prefix
    again.close()


def test_no_other_slot_opens_closes_or_takes_a_number_before_it_is_sealed(tmp_path):
    sealed = []
    pool = _pool(tmp_path, on_seal=sealed.append, oversize="drop")
    pool.append("a", chunk_of(range(3)), source=1, source_start=0)
    pool.seal_due(caught_up=True)
    pool.take_filling()
    pool.append("b", chunk_of(range(10, 12)), source=2, source_start=0)   # another topic
    assert [(s.topic, s.first_record, s.record_count) for s in sealed] == [("a", 0, 3)]
    pool.seal_all()
    assert [(s.topic, s.first_record) for s in sealed] == [("a", 0), ("b", 3)]

    pool.take()                                     # both on their way
    pool.append("a", chunk_of(range(20, 22)), source=1, source_start=3 * 41)
    pool.seal_due(caught_up=True)
    assert pool.take_filling() is not None
    pool.append("a", Chunk.from_lines(b"x" * (2 * SLOT) + b"\n", 1_000), source=1,
                source_start=5 * 41)            # a dropped line takes a number: sealed first
    assert [(s.first_record, s.record_count) for s in sealed[2:]] == [(5, 2)]
    assert pool.next_record == 8

    pool.take()
    pool.append("a", chunk_of(range(30, 32)), source=1, source_start=0)
    pool.seal_due(caught_up=True)
    fill, _view = pool.take_filling()
    pool.append("a", chunk_of(range(40, 41)), once=True)    # a listener's: kept by a crash
    assert fill.sealed is not None and pool.filling_send() is None
    pool.seal_due(caught_up=True)
    assert pool.filling_send() is None, "records a crash keeps never go out filling"
    assert [_ids(s) for s in sealed[-2:]] == [[30, 31], [40]]   # sealed at once instead
    pool.close()


def test_it_is_sent_filling_only_when_alone_and_every_sealed_slot_is_on_its_way(tmp_path):
    pool = _pool(tmp_path)
    pool.append("a", chunk_of(range(2)), source=1, source_start=0)
    pool.seal("a")                                  # a sealed slot not yet taken
    pool.append("a", chunk_of(range(2, 4)), source=1, source_start=2 * 41)
    pool.seal_due(caught_up=True)
    assert pool.filling_send() is None and pool.stats()["slots_sealed"] == 1
    pool.take()
    pool.seal_due(caught_up=True)
    assert pool.filling_send() is not None
    pool.close()


def test_a_slot_due_early_while_another_is_being_sealed_waits_to_be_sent_filling(tmp_path):
    """While the sealing thread syncs closed slots, a lone slot due early (the reader caught up)
    is not sealed at once: it stays filling, and once they are sealed it is sent while it
    fills. Sealed at once, each turn's slot was being sealed when the next turn came, so none
    went early again (over 100 files: 0.39 seals a line at 1,000 lines/s, the slot closing at
    its ninth source; 0.005 on one file)."""
    (tmp_path / "probe").mkdir()
    pool, ops = threaded_pool(tmp_path, send_filling=True, seal_every_ms=1000)
    pool.append("t", chunk_of(range(300)), source=1)   # slots close as they fill up
    assert ops.waiting.wait(10)                        # the first one's data sync waits
    closing = len(pool._closing)
    assert 1 <= closing < CAUGHT_UP_IN_FLIGHT
    kept = pool._current["t"].records                 # the last of them, in a slot filling
    pool.append("t", chunk_of(range(1000, 1002)), source=2)
    pool.seal_due(caught_up=True)
    assert len(pool._closing) == closing, "sealed at once while another was being sealed"
    assert pool.filling_send() is None and pool._current["t"].records == kept + 2
    ops.go.set()
    until(lambda: not pool._unsynced)
    pool.seal_due(caught_up=True)                      # hands the sealed ones out: still one
    for slot in pool.take():                           # on its way each (the drain's take)
        assert slot.record_count
    pool.seal_due(caught_up=True)
    assert pool.filling_send() is not None, "sent while it fills once the others are sealed"
    pool.close()


def test_a_slot_that_cannot_be_sent_filling_is_sealed_at_once_while_another_is_sealed(tmp_path):
    """The wait above is only for a slot that will go early once the others are sealed: one
    holding a listener's records (kept by a crash, never sent while it fills) is sealed at
    once, as before, not held back for nothing."""
    (tmp_path / "probe").mkdir()
    pool, ops = threaded_pool(tmp_path, send_filling=True, seal_every_ms=1000)
    pool.append("t", chunk_of(range(300)), source=1)
    assert ops.waiting.wait(10)
    closing = len(pool._closing)
    assert 1 <= closing < CAUGHT_UP_IN_FLIGHT
    pool.append("t", chunk_of(range(1000, 1002)), once=True)
    pool.seal_due(caught_up=True)
    assert len(pool._closing) == closing + 1 and "t" not in pool._current
    ops.go.set()
    until(lambda: not pool._unsynced)
    pool.close()


# -- the agent ---------------------------------------------------------------------------------
def _agent(tmp_path, kafka: FakeKafka) -> Agent:
    (tmp_path / "app.log").write_bytes(b"")
    cfg = parse({
        "agent": {"id": "t", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * 4096, "slot_size_bytes": 4096,
                   "sync_on_seal": False, "seal_every_ms": 1000},
        "broker": {"bootstrap_servers": "127.0.0.1:9", "send_path": "native"},
        "audit": {"enabled": False},
        "sources": [{"type": "file", "topic": "t", "paths": [str(tmp_path / "app.log")]}],
    })
    agent = Agent(cfg, seams=Seams(clock=AgentClock(), file_events=False,
                                   producer_factory=kafka.producer, probe_factory=kafka.admin,
                                   native_factory=lambda conf: FakeSlotProducer(conf, kafka)))
    agent.begin()
    for _ in range(5):
        agent.clock.advance(0.3)
        agent.turn()
    return agent


def _write(tmp_path, *lines: bytes) -> None:
    with open(tmp_path / "app.log", "ab") as f:
        f.write(b"".join(line + b"\n" for line in lines))


def _numbers(kafka: FakeKafka) -> list[tuple[bytes, int]]:
    return [(value, int.from_bytes(dict(headers)[SEQ], "big"))
            for _t, value, _k, _ts, headers in kafka.log]


def test_each_line_goes_out_as_it_is_read_and_its_slot_is_sealed_once(tmp_path):
    kafka = FakeKafka()
    agent = _agent(tmp_path, kafka)
    try:
        for k in range(3):
            _write(tmp_path, b"line %d" % k)
            agent.clock.advance(0.2)
            agent.turn()
            assert _numbers(kafka)[-1] == (b"line %d" % k, k), "sent as soon as read"
        stats = agent.pool.stats()
        assert stats["slots_sealed"] == 0 and stats["filling_records"] == 3
        assert agent.drain.waits_for_seal()          # the loop sleeps until the seal is due
        agent.clock.advance(0.7)
        agent.turn()                                 # a second after the first line
        agent.turn()
        stats = agent.pool.stats()
        assert (stats["slots_sealed"], stats["slots_freed"]) == (1, 1)
        [row] = agent.db.all_files()
        assert row["acked_offset"] == row["sealed_offset"] == len(b"line 0\n") * 3
        _write(tmp_path, b"line 3")
        agent.clock.advance(0.2)
        agent.turn()
        assert _numbers(kafka) == [(b"line %d" % k, k) for k in range(4)]
    finally:
        agent.abandon()


def test_a_line_refused_while_its_slot_fills_goes_again_and_the_slot_ends(tmp_path):
    from confluent_kafka import KafkaError

    kafka = FakeKafka()
    agent = _agent(tmp_path, kafka)
    try:
        kafka.script(b"line 1", KafkaError(KafkaError.REQUEST_TIMED_OUT))
        for k in range(3):
            _write(tmp_path, b"line %d" % k)
            agent.clock.advance(0.2)
            agent.turn()
        agent.clock.advance(1.0)
        for _ in range(3):
            agent.turn()
        assert sorted(_numbers(kafka)) == [(b"line %d" % k, k) for k in range(3)]
        assert agent.pool.stats()["slots_freed"] == 1
    finally:
        agent.abandon()


class _FailingSync(FileOps):
    """An msync that fails (EIO) while ``failing`` is set."""

    failing = False

    def msync(self, mm, offset: int, length: int) -> None:
        if self.failing:
            raise OSError(errno.EIO, "Input/output error")
        super().msync(mm, offset, length)


def test_a_failed_show_or_seal_leaves_the_slot_to_send_while_it_fills(tmp_path):
    """A show whose sync fails leaves the slot untaken (no send owns it otherwise, and sealed
    it would be leased to nobody); a seal whose sync fails leaves it the slot sent while it
    fills (else another slot could take its numbers)."""
    ops = _FailingSync()
    pool = _pool(tmp_path, ops=ops)
    pool.append("t", chunk_of(range(2)), source=1, source_start=0)
    pool.seal_due(caught_up=True)
    ops.failing = True
    with pytest.raises(OSError):
        pool.take_filling()
    ops.failing = False
    fill, view = pool.take_filling()
    assert _ids(view) == [0, 1]
    ops.failing = True
    with pytest.raises(OSError):
        pool.seal("t")
    ops.failing = False
    assert pool.filling_send() == ("t", fill)
    pool.append("u", chunk_of(range(9, 10)), source=2, source_start=0)   # another topic
    assert fill.sealed is not None and fill.sealed.first_record == 0
    pool.seal_all()
    assert [s.first_record for s in pool.sealed()] == [0, 2]
    pool.close()


def test_a_slot_refused_while_it_fills_goes_on_once_its_topic_is_accepted(tmp_path):
    """Its topic refused (an ACL missing) after its first lines went, the slot sent while it
    fills grows with lines not yet handed over; once the ACL is granted every line goes and
    the topic is accepted again. (CI: the grown slot's new lines waited for the topic to be
    accepted, which waited for that slot: 19,368 of 20,000 lines held for good.)"""
    from confluent_kafka import KafkaError

    import agent.drain.drain as drain_module

    kafka = FakeKafka()
    agent = _agent(tmp_path, kafka)
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed")
    try:
        kafka.script(b"line 0", denied)             # refused; granted before it goes again
        for k in range(6):
            _write(tmp_path, b"line %d" % k)
            agent.clock.advance(0.05)
            agent.turn()
        assert agent.drain.broker_state.startswith("not authorised") and not kafka.log
        assert sum(len(p.produced) for p in kafka.senders) == 1, "the rest wait in the slot"
        agent.clock.advance(drain_module.DENIED_RETRY_S)
        for _ in range(4):
            agent.clock.advance(0.3)
            agent.turn()
        assert sorted(_numbers(kafka)) == [(b"line %d" % k, k) for k in range(6)]
        assert agent.drain.broker_state == "up" and agent.pool.stats()["slots_freed"] == 1
    finally:
        agent.abandon()
