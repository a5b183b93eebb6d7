"""Choosing the native send path: an agent told ``broker.send_path = "native"`` on a host
without the extension refuses to start and names the way out; with it, the agent's drain is
the native path's."""

from __future__ import annotations

import dataclasses
import logging
import select
import sys
import threading
import time

import pytest

from agent.config import load, parse, to_toml
from agent.drain.drain import Drain
from agent.drain.native import NativeDrain, NativeUnavailable, extension_installed, native_module
from agent.drain.native_txn import NativeTransactionalDrain
from agent.drain.producer import NATIVE_LINGER_MS
from agent.drain.transact import TransactionalDrain
from agent.errors import StartupError
from agent.service import Agent, Seams
from tests.unit.fakenative import FakeSlotProducer
from tests.unit.fakeproducer import FakeKafka
from tests.unit.tailkit import FakeClock


def config(tmp_path, send_path="native", **broker):
    return parse({
        "agent": {"id": "t", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * 4096, "slot_size_bytes": 4096,
                   "sync_on_seal": False},
        "broker": {"bootstrap_servers": "127.0.0.1:9", "send_path": send_path, **broker},
        "audit": {"enabled": False},
        "sources": [{"type": "file", "topic": "t", "paths": [str(tmp_path / "app.log")]}],
    })


def test_without_the_extension_the_agent_refuses_to_start_and_says_how(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "docket_native", None)      # import fails: not built
    with pytest.raises(NativeUnavailable, match="make native"):
        native_module()
    with pytest.raises(StartupError) as e:
        Agent(config(tmp_path), seams=Seams(clock=FakeClock(), file_events=False,
                                            producer_factory=FakeKafka().producer))
    assert "docket_native" in str(e.value) and "send_path" in e.value.hint


def test_auto_without_the_extension_runs_the_python_path_and_says_why(tmp_path, monkeypatch,
                                                                    caplog):
    """The default: no stand-in producer, the real clients (to a port nobody listens on)."""
    monkeypatch.setitem(sys.modules, "docket_native", None)
    agent = Agent(config(tmp_path, "auto"), seams=Seams(clock=FakeClock(), file_events=False))
    try:
        assert agent.send_path == "python" and type(agent.drain) is Drain
        assert not agent.pool.seal_when_caught_up
        with caplog.at_level(logging.INFO, logger="docket.agent"):
            agent.begin()
        ready = [r.getMessage() for r in caplog.records if " ready: " in r.getMessage()]
        assert len(ready) == 1 and "send path python (confluent-kafka" in ready[0]
        assert "not installed" in ready[0] and "make native" in ready[0]
    finally:
        agent.abandon()


@pytest.mark.skipif(not extension_installed(), reason="the native extension is not built here")
def test_auto_with_the_extension_runs_the_native_path_and_says_why(tmp_path, caplog):
    agent = Agent(config(tmp_path, "auto"), seams=Seams(clock=FakeClock(), file_events=False))
    try:
        assert agent.send_path == "native" and isinstance(agent.drain, NativeDrain)
        assert agent.drain.conf["linger.ms"] == NATIVE_LINGER_MS
        with caplog.at_level(logging.INFO, logger="docket.agent"):
            agent.begin()
        ready = [r.getMessage() for r in caplog.records if " ready: " in r.getMessage()]
        assert len(ready) == 1 and "send path native (docket_native, librdkafka" in ready[0]
        assert "auto: the native extension is installed" in ready[0]
        broker = agent.board.document()["broker"]
        assert (broker["send_path"], broker["send_path_why"]) == (
            "native", "auto: the native extension is installed")
    finally:
        agent.abandon()


def test_exactly_once_runs_transactions_on_the_path_auto_chooses(tmp_path):
    """Without the extension (a stand-in producer alone) the Python path's transactions; with
    it the native path's, whose pool sends no slot while it fills (a transaction holds sealed
    slots only)."""
    cfg = config(tmp_path, "auto")
    cfg.values = {**cfg.values, "broker.delivery": "exactly_once"}
    agent = Agent(cfg, seams=Seams(clock=FakeClock(), file_events=False,
                                   producer_factory=FakeKafka().producer))
    try:
        assert agent.send_path == "python" and type(agent.drain) is TransactionalDrain
    finally:
        agent.abandon()
    cfg = config(tmp_path / "native", "auto")
    cfg.values = {**cfg.values, "broker.delivery": "exactly_once"}
    agent, _kafka = _with_stand_ins(cfg)
    try:
        assert agent.send_path == "native" and type(agent.drain) is NativeTransactionalDrain
        assert agent.drain.native.conf["transactional.id"] == agent.drain.txn_id
        assert not agent.pool.send_filling and agent.drain._check is None
        assert not agent.pool.seal_when_caught_up      # its slots would keep the commit back
    finally:
        agent.abandon()
    plain, _kafka = _with_stand_ins(config(tmp_path / "plain", "auto"))
    try:                                 # at least once: the slot filling is sent
        assert type(plain.drain) is NativeDrain and plain.pool.send_filling
        assert plain.pool.seal_when_caught_up
    finally:
        plain.abandon()


def _with_stand_ins(cfg, file_events=False):
    """An agent over a fake Kafka with a stand-in of the extension, and the fake."""
    kafka = FakeKafka()
    agent = Agent(cfg, seams=Seams(clock=FakeClock(), file_events=file_events,
                                   producer_factory=kafka.producer, probe_factory=kafka.admin,
                                   native_factory=lambda conf: FakeSlotProducer(conf, kafka)))
    return agent, kafka


def _started(agent, turns: int) -> None:
    """The agent begun and turned ``turns`` times, 0.3 s apart: what the start found, read
    and sent."""
    agent.begin()
    for _ in range(turns):
        agent.clock.advance(0.3)
        agent.turn()


def test_with_it_the_drain_is_the_native_path_s_and_sends_through_one_producer_only(tmp_path):
    """The native path has one client that carries records: no Python producer beside it
    (records sent again go through the native one; only a record too large with its batch
    goes alone, through a lone producer built when first needed)."""
    agent, kafka = _with_stand_ins(config(tmp_path))
    try:
        assert isinstance(agent.drain, NativeDrain)
        assert [p.role for p in kafka.producers] == ["native"]
        assert agent.drain.producer is None
    finally:
        agent.abandon()


def test_the_idle_wait_sleeps_on_file_writes_and_never_turns_faster_for_other_files(tmp_path):
    """With the native path and nothing to send, an idle turn sleeps until the loop's next duty
    (at most ``IDLE_WAIT_QUIET_S``) on the loop's wake descriptor, which a write to a watched
    file makes readable; a line written is read at the next turn and sealed at once (the reader
    caught up); a turn woken by writes to another file of the folder, which reads nothing, is
    followed by a plain 2 ms wait without the descriptor, then the long wait again."""
    from agent.loop import IDLE_WAIT_QUIET_S, IDLE_WAIT_S

    (tmp_path / "app.log").write_bytes(b"")
    agent, _ = _with_stand_ins(config(tmp_path), file_events=True)
    try:
        agent.begin()
        agent.turn()
        wait, fd = agent._idle_wait(False)
        assert fd >= 0 and IDLE_WAIT_S <= wait <= IDLE_WAIT_QUIET_S
        assert not select.select([fd], [], [], 0)[0]
        with open(tmp_path / "app.log", "ab") as f:
            f.write(b"one\n")
        assert select.select([fd], [], [], 1)[0], "a write must end the idle sleep"
        clock = agent.clock
        read = 0
        for _ in range(5):                       # (the file is picked up at the next scan)
            clock.advance(0.3)
            read += agent.turn()[0]
        assert read == 4 and not agent.pool.filling()       # sealed at once: caught up
        assert agent._idle_wait(False)[1] == fd
        agent.turn()
        (tmp_path / "other.txt").write_bytes(b"busy\n")
        read, _sent, _blocked = agent.turn()
        assert read == 0 and agent._idle_wait(False) == (IDLE_WAIT_S, -1)
        agent.turn()
        assert agent._idle_wait(False)[1] == fd
    finally:
        agent.abandon()


def test_a_reload_keeps_the_send_path_and_says_that_a_change_waits_for_the_next_start(
        tmp_path, caplog):
    file = tmp_path / "agent.toml"
    values = {"agent.id": "t", "agent.state_dir": str(tmp_path / "state"),
              "buffer.size_bytes": 4096 + 4096 + 16 * 4096, "buffer.slot_size_bytes": 4096,
              "buffer.sync_on_seal": False, "broker.bootstrap_servers": "127.0.0.1:9",
              "audit.enabled": False}
    sources = [{"type": "file", "topic": "t", "paths": [str(tmp_path / "app.log")]}]
    file.write_text(to_toml(values, sources))
    agent, _ = _with_stand_ins(load(file))
    try:
        agent.begin()
        assert agent.send_path == "native"
        file.write_text(to_toml({**values, "broker.send_path": "python"}, sources))
        agent._reload.set()
        with caplog.at_level(logging.WARNING, logger="docket.agent"):
            agent.turn()
        said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert said == ["reload: broker.send_path = 'python' takes effect at the next start; "
                        "this agent goes on with 'auto' (send path native)"]
        assert agent.send_path == "native" and isinstance(agent.drain, NativeDrain)
        caplog.clear()
        file.write_text(to_toml(values, sources))          # back as it started: nothing said
        agent._reload.set()
        with caplog.at_level(logging.WARNING, logger="docket.agent"):
            agent.turn()
        assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    finally:
        agent.abandon()


def test_the_native_client_s_lines_reach_the_agent_s_log_at_their_level(tmp_path, caplog):
    agent, _kafka = _with_stand_ins(config(tmp_path))
    try:
        caplog.set_level(logging.DEBUG, logger="docket.agent.librdkafka")
        agent.drain.native.logs += [(4, "FAIL", "[thrd:x]: x/1: connection refused"),
                                    (7, "STATE", "[thrd:x]: x/1: Broker changed state")]
        agent.drain.pump()
        got = [(r.levelno, r.getMessage()) for r in caplog.records
               if r.name == "docket.agent.librdkafka"]
        assert got == [(logging.WARNING, "FAIL [native fake#native] [thrd:x]: x/1: connection "
                                         "refused"),
                       (logging.DEBUG, "STATE [native fake#native] [thrd:x]: x/1: Broker "
                                       "changed state")]
    finally:
        agent.abandon()


def test_a_slot_in_flight_at_a_crash_goes_again_from_its_acknowledged_prefix_only(tmp_path):
    """30 lines in one slot; Kafka acknowledges lines 0–9 and 11–29 and holds line 10's
    answer; the agent dies. Its slot's header says 10 records were acknowledged from the first
    on, so the next agent sends lines 10–29 (line 10 and the 19 after it acknowledged out of
    order: what was in flight unacknowledged from the prefix on), never lines 0–9 again."""
    from tests.unit.fakeproducer import HOLD

    lines = [b"line %02d" % i for i in range(30)]
    (tmp_path / "app.log").write_bytes(b"".join(v + b"\n" for v in lines))
    agent, kafka = _with_stand_ins(config(tmp_path))
    kafka.script(lines[10], HOLD)
    try:
        _started(agent, 6)
        assert sorted(kafka.values()) == lines[:10] + lines[11:]
        [slot] = agent.pool.sealed()
        assert slot.record_count == 30
    finally:
        agent.abandon()                                  # killed: line 10 never answered
    again, kafka2 = _with_stand_ins(config(tmp_path))
    try:
        _started(again, 6)
        assert kafka2.values() == lines[10:]
        assert again.metrics.get("agent_drain_skipped_acknowledged_total", topic="t") == 10
    finally:
        again.abandon()


def _landed_after_a_crash(tmp_path, check_s: float, land=None):
    """30 lines in one slot; Kafka acknowledges lines 0–9, lines 10–29 are in flight with no
    answer when the agent dies, and the broker writes lines 10–19 all the same (requests it
    read from its socket after their sender died). The next agent (``delivered_check_s`` =
    ``check_s``) starts on the same cluster: what it sends, and its metrics. ``land(kafka,
    held)``: what the broker writes instead."""
    from tests.unit.fakeproducer import HOLD

    lines = [b"line %02d" % i for i in range(30)]
    (tmp_path / "app.log").write_bytes(b"".join(v + b"\n" for v in lines))
    agent, kafka = _with_stand_ins(config(tmp_path))
    for line in lines[10:]:
        kafka.script(line, HOLD)
    try:
        _started(agent, 6)
        assert kafka.values() == lines[:10]
    finally:
        agent.abandon()                                  # killed: lines 10–29 unanswered
    held = kafka.senders[0].held
    assert [m.value for m in held] == lines[10:]
    (land or (lambda k, h: k.land(h[:10])))(kafka, held)
    again = Agent(config(tmp_path, delivered_check_s=check_s), seams=Seams(
        clock=FakeClock(), file_events=False, producer_factory=kafka.producer,
        probe_factory=kafka.admin, consumer_factory=kafka.consumer,
        native_factory=lambda conf: FakeSlotProducer(conf, kafka)))
    try:
        again.begin()
        deadline = time.monotonic() + 10
        while again.drain.checking() and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(6):
            again.clock.advance(0.3)
            again.turn()
        # the slot done whole: nothing left in flight or sealed
        assert again.drain.idle(), (again.drain.inflight, again.pool.sealed())
        return kafka.values()[20:], lines, again.metrics
    finally:
        again.abandon()


def test_records_past_the_prefix_that_landed_all_the_same_are_not_sent_again(tmp_path):
    """The start's check reads lines 10–19 back (this agent's origin, incarnation, numbers and
    values): the next agent sends lines 20–29 only, none twice."""
    sent, lines, metrics = _landed_after_a_crash(tmp_path, 30)
    assert sent == lines[20:]
    assert metrics.get("agent_drain_found_delivered_total", topic="t") == 10
    assert metrics.get("agent_drain_skipped_acknowledged_total", topic="t") == 10


def test_without_the_check_the_records_that_landed_are_sent_twice(tmp_path):
    """``delivered_check_s = 0``: lines 10–29 go again, lines 10–19 a second time."""
    sent, lines, metrics = _landed_after_a_crash(tmp_path, 0)
    assert sent == lines[10:]
    assert metrics.get("agent_drain_found_delivered_total", topic="t") == 0


def test_records_that_landed_out_of_order_are_left_out_one_by_one(tmp_path):
    """Every other one of lines 10–29 landed (another partition's batches answered, say): the
    slot's block goes as its runs of the records not found — the other ten, in order."""
    sent, lines, metrics = _landed_after_a_crash(
        tmp_path, 30, land=lambda kafka, held: kafka.land(held[::2]))
    assert sent == lines[11::2]
    assert metrics.get("agent_drain_found_delivered_total", topic="t") == 10


def _changed(msgs, **what):
    """Copies of ``msgs`` with their value or one header replaced."""
    out = []
    for m in msgs:
        m = dataclasses.replace(m)
        if "value" in what:
            m.value = what["value"]
        for name in ("docket-origin", "docket-incarnation"):
            if name in what:
                m.headers = [(k, what[name] if k == name else v) for k, v in m.headers]
        out.append(m)
    return out


@pytest.mark.parametrize("what", [{"docket-origin": b"another-host"},
                                  {"docket-incarnation": b"another-incarnation"},
                                  {"value": b"not this line"}])
def test_a_record_is_taken_for_delivered_only_with_this_agent_s_identity_and_its_value(
        tmp_path, what):
    """Records in Kafka under the same numbers but another origin, another incarnation or
    another value are not this agent's records: lines 10–29 all go again."""
    sent, lines, metrics = _landed_after_a_crash(
        tmp_path, 30, land=lambda kafka, held: kafka.land(_changed(held[:10], **what)))
    assert sent == lines[10:]
    assert metrics.get("agent_drain_found_delivered_total", topic="t") == 0


def test_a_cluster_that_does_not_answer_the_check_costs_its_wait_and_duplicates_only(tmp_path):
    """The check's cluster does not answer: after ``delivered_check_s`` the slot goes from
    its prefix as before (lines 10–29), nothing lost, the wait bounded."""
    def land(kafka, held):
        kafka.land(held[:10])
        kafka.reachable = False
        threading.Timer(1.5, setattr, (kafka, "reachable", True)).start()

    began = time.monotonic()
    sent, lines, metrics = _landed_after_a_crash(tmp_path, 0.5, land=land)
    assert sent == lines[10:] and time.monotonic() - began < 5
    assert metrics.get("agent_drain_found_delivered_total", topic="t") == 0


def test_a_cluster_that_refuses_the_read_back_ends_the_check_at_once_and_says_why(tmp_path,
                                                                                  caplog):
    """The agent's principal may not read its topics (least privilege: Write only): the check
    ends at its first answer, not after ``delivered_check_s``, says what to grant or set, and
    lines 10–29 go again."""
    def land(kafka, held):
        kafka.land(held[:10])
        kafka.read_refused = True

    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="docket.agent.drain"):
        sent, lines, metrics = _landed_after_a_crash(tmp_path, 30, land=land)
    assert sent == lines[10:] and time.monotonic() - began < 10
    said = [r.getMessage() for r in caplog.records if "start: " in r.getMessage()]
    assert len(said) == 1 and "refused" in said[0] and "Read" in said[0] \
        and "delivered_check_s" in said[0], said


def test_a_check_that_never_ends_holds_the_sends_no_longer_than_its_bound(tmp_path,
                                                                          monkeypatch, caplog):
    """The check's first request never comes back (a client stuck in a call): the drain
    stops waiting for it once its budget and the grace have passed, says so, and lines 10–29
    go again — the sends are never held for good (the watchdog would not see it)."""
    from tests.unit.fakeproducer import FakeConsumer

    stuck = threading.Event()
    monkeypatch.setattr(FakeConsumer, "list_topics", lambda self, *a, **k: stuck.wait(30))
    monkeypatch.setattr("agent.drain.delivered.OVERDUE_GRACE_S", 0.5)
    began = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING, logger="docket.agent.drain"):
            sent, lines, _metrics = _landed_after_a_crash(tmp_path, 0.3)
    finally:
        stuck.set()
    assert sent == lines[10:] and time.monotonic() - began < 10
    assert any("did not end within" in r.getMessage() for r in caplog.records)


def test_the_check_reads_back_at_most_its_bound_and_takes_what_it_saw(tmp_path, monkeypatch):
    """``MAX_RECORDS`` read: what was seen by then counts, the rest goes again. (The read
    begins at the slot's earliest record past its prefix, less a margin: with the fake's
    clock, at lines 0–9 too, so 14 records read are lines 0–13.)"""
    monkeypatch.setattr("agent.drain.delivered.MAX_RECORDS", 14)
    monkeypatch.setattr("agent.drain.delivered.BATCH", 7)
    sent, lines, metrics = _landed_after_a_crash(tmp_path, 30)
    assert metrics.get("agent_drain_found_delivered_total", topic="t") == 4
    assert sent == lines[14:]


def test_a_new_producer_counts_on_from_the_prefix_the_old_one_acknowledged(tmp_path):
    """A slot sent while it fills (``buffer.send_filling``): lines 0–4 go out and are
    acknowledged, new settings replace the producer, lines 5–9 go out through the new one and
    are acknowledged too. The slot's header must say 10 records were acknowledged from the
    first on — the new producer counting on from the 5 the old one counted — not stay at 5:
    a crash before the seal then sends none of them again."""
    (tmp_path / "app.log").write_bytes(b"")
    agent, kafka = _with_stand_ins(config(tmp_path))
    try:
        _started(agent, 5)
        for batch in (range(5), range(5, 10)):
            for i in batch:
                with open(tmp_path / "app.log", "ab") as f:
                    f.write(b"line %02d\n" % i)
                agent.clock.advance(0.01)
                agent.turn()
            if batch.start == 0:
                agent.drain.reconfigure(dict(agent.drain.conf))
        assert len(kafka.senders) == 2 and len(kafka.values()) == 10
        assert agent.pool.stats()["slots_sealed"] == 0, "still filling: nothing sealed yet"
    finally:
        agent.abandon()                                  # killed before the seal
    again, _kafka = _with_stand_ins(config(tmp_path))
    try:
        [slot] = again.pool.sealed()
        assert (slot.record_count, slot.acked_before) == (10, 10)
    finally:
        again.abandon()
