"""The agent's producer-tier counts: tallied at seal, persisted with checkpoints, never lost or
counted twice across a restart (no Kafka here: emission is tested end to end)."""

from __future__ import annotations

import numpy as np
import pytest

from agent.audit_emitter import AuditEmitter, tally_slot
from agent.buffer import BufferPool, Chunk
from agent.state.db import StateDB
from agent.telemetry import Metrics
from audit.contract.record import HASH_SEED, value_hash

WINDOW = 600_000
NOW = 1_800_000_000_000


def lines(n: int, first: int = 0) -> tuple[bytes, np.ndarray]:
    data = b"".join(b'{"id": %d, "pad": "%s"}\n' % (i, b"x" * (i % 50)) for i in
                    range(first, first + n))
    ts = NOW - (np.arange(first, first + n) * 7919 % (6 * WINDOW))     # six windows
    return data, ts


def truth(data: bytes, ts: np.ndarray) -> dict[int, tuple[int, int, int]]:
    out: dict[int, list[int]] = {}
    for value, t in zip(data.split(b"\n")[:-1], ts.tolist(), strict=True):
        c = out.setdefault(t // WINDOW * WINDOW, [0, 0, 0])
        c[0] += 1
        c[1] += len(value)
        c[2] = (c[2] + value_hash(value)) % 2**64
    return {w: tuple(c) for w, c in out.items()}


def emitter(db: StateDB) -> AuditEmitter:
    return AuditEmitter(db=db, agent_id="a1", topics=["t"], audit_topic="docket.audit",
                        window_ms=WINDOW,
                        interval_ms=60_000, producer_conf={"bootstrap.servers": "127.0.0.1:9"},
                        metrics=Metrics(), clock=lambda: NOW / 1000)


def sealed(tmp_path, em: AuditEmitter, data: bytes, ts: np.ndarray) -> None:
    """The lines appended to a pool of their own and sealed, each slot counted by ``em``."""
    with BufferPool(tmp_path / "p", 8 << 20, 1 << 20, linger_ms=1e9, sync_on_seal=False,
                    on_seal=em.count_sealed) as pool:
        pool.append("t", Chunk.from_lines(data, ts))
        pool.seal_all()


def as_tuples(em: AuditEmitter) -> dict[int, tuple[int, int, int]]:
    return {w: (t.count, t.bytes, t.checksum) for (_topic, w), t in em.snapshot().items()
            if t.count}


def native_hashes():
    """The native extension's value_hashes, or a skip where it is not built."""
    return pytest.importorskip("docket_native", reason="the native extension is not built "
                               "(make setup builds it with cargo)").value_hashes


def native_tally():
    """The native extension's slot_tally, or a skip where it is not built."""
    return pytest.importorskip("docket_native", reason="the native extension is not built "
                               "(make setup builds it with cargo)").slot_tally


@pytest.mark.parametrize("hashes", ["python", "native", "native_tally"])
def test_tally_of_a_slot_matches_counting_each_record(tmp_path, hashes):
    native = native_hashes() if hashes == "native" else None
    whole = native_tally() if hashes == "native_tally" else None
    data, ts = lines(3000)
    with BufferPool(tmp_path / "p", 8 << 20, 1 << 20, linger_ms=1e9, sync_on_seal=False) as pool:
        pool.append("t", Chunk.from_lines(data, ts))
        pool.seal_all()
        got: dict[int, tuple] = {}
        for slot in pool.sealed():
            for w, t in tally_slot(slot, WINDOW, NOW, native, whole).items():
                c = got.get(w, (0, 0, 0))
                got[w] = (c[0] + t.count, c[1] + t.bytes, (c[2] + t.checksum) % 2**64)
    assert got == truth(data, ts)
    assert len(got) >= 6


def test_counts_persist_with_checkpoints_and_recovered_slots_are_counted_once(tmp_path):
    data, ts = lines(2000)
    more, more_ts = lines(1000, first=2000)
    db = StateDB(tmp_path / "state.db")
    em = emitter(db)
    pool = BufferPool(tmp_path / "p", 8 << 20, 64 << 10, linger_ms=1e9, sync_on_seal=False,
                      on_seal=em.count_sealed)
    pool.append("t", Chunk.from_lines(data, ts))
    pool.seal_all()
    db.advance_sealed({}, audit=em.persist)             # the main loop's flush
    pool.append("t", Chunk.from_lines(more, more_ts))   # sealed, but the agent dies before
    pool.seal_all()                                     # its counts are written
    pool.close()
    db.close()

    db = StateDB(tmp_path / "state.db")
    again = emitter(db)
    assert as_tuples(again) == truth(data, ts)          # what was persisted
    pool = BufferPool(tmp_path / "p", 8 << 20, 64 << 10, linger_ms=1e9, sync_on_seal=False)
    counted = again.count_recovered(pool.sealed())      # only the slots sealed after it
    assert counted == 1000
    db.advance_sealed({}, audit=again.persist)
    assert as_tuples(again) == truth(data + more, np.concatenate([ts, more_ts]))
    pool.close()
    db.close()

    db = StateDB(tmp_path / "state.db")                 # a third start counts nothing again
    third = emitter(db)
    pool = BufferPool(tmp_path / "p", 8 << 20, 64 << 10, linger_ms=1e9, sync_on_seal=False)
    assert third.count_recovered(pool.sealed()) == 0
    pool.close()
    db.close()


def test_dead_letters_leave_count_and_appear_as_dropped(tmp_path):
    data, ts = lines(100)
    db = StateDB(tmp_path / "state.db")
    em = emitter(db)
    sealed(tmp_path, em, data, ts)
    first = data.split(b"\n")[0]
    em.uncount("t", int(ts[0]), first)
    em.dropped("t", "dead_letter", 1, int(ts[0]))
    db.advance_sealed({}, audit=em.persist)
    expected = truth(data[len(first) + 1:], ts[1:])
    assert as_tuples(em) == expected
    w = int(ts[0]) // WINDOW * WINDOW
    assert em.snapshot()[("t", w)].dropped_reasons == {"dead_letter": 1}
    db.close()


def test_a_loss_of_unknown_size_reaches_dropped_unknown_and_survives_a_restart(tmp_path):
    """A file deleted before it was read: the journal knows bytes, not events (-1). The window
    it was found in carries it under dropped_unknown, so the reconciler can flag a possible
    loss although every count agrees."""
    db = StateDB(tmp_path / "state.db")
    em = emitter(db)
    em.dropped("t", "deleted_unread", -1)
    em.dropped("t", "deleted_unread", -1)
    em.dropped("t", "oversize_dropped", 2)
    db.advance_sealed({}, audit=em.persist)
    w = NOW // WINDOW * WINDOW
    t = em.snapshot()[("t", w)]
    assert t.dropped_unknown == {"deleted_unread": 2}
    assert (t.dropped, t.dropped_reasons, t.count) == (2, {"oversize_dropped": 2}, 0)
    db.close()
    db = StateDB(tmp_path / "state.db")
    assert emitter(db).snapshot()[("t", w)].dropped_unknown == {"deleted_unread": 2}
    db.close()


def test_a_round_says_where_the_record_numbers_stand(tmp_path, monkeypatch):
    """Each count record carries ``sealed_through`` and the round's ``ranges`` record
    ``delivered``, both read after the counts were taken: what lets a tier be judged caught
    up with this round by positions alone."""
    from agent import audit_emitter
    from agent.audit_emitter import RecordNumbers
    from audit.contract.record import AuditRecord, Ranges, parse

    sent: list = []

    def deliver(producer, topic, records, timeout_s, timestamp_ms=0):
        sent.extend(parse(value) for _key, value in records)
        return set(range(len(records))), []
    monkeypatch.setattr(audit_emitter, "deliver", deliver)
    monkeypatch.setattr(audit_emitter, "Producer", lambda conf, logger=None: object())
    data, ts = lines(50)
    db = StateDB(tmp_path / "state.db")
    asked = []

    def numbers():
        asked.append(len(em.snapshot()))              # the counts were taken before
        return RecordNumbers(through=49, delivered=39, dropped=[[7, 7]])
    em = AuditEmitter(db=db, agent_id="a1", topics=["t"], audit_topic="docket.audit",
                      window_ms=WINDOW, interval_ms=60_000, producer_conf={},
                      metrics=Metrics(), clock=lambda: NOW / 1000, incarnation="inc-1",
                      numbers=numbers)
    sealed(tmp_path, em, data, ts)
    db.advance_sealed({}, audit=em.persist)
    assert em.emit() == len(truth(data, ts))           # every window (one the heartbeat's)
    counts = [r for r in sent if isinstance(r, AuditRecord)]
    [ranges] = [r for r in sent if isinstance(r, Ranges)]
    assert counts and {r.sealed_through for r in counts} == {49}
    assert (ranges.through, ranges.delivered, ranges.missing) == (49, 39, [[7, 7]])
    assert asked and asked[0] > 0
    db.close()


def test_a_round_with_nothing_acknowledged_gets_a_new_producer_for_the_next(tmp_path,
                                                                         monkeypatch):
    """A producer that had nothing of a round acknowledged (a client left without a broker
    never answers again) is replaced for the next round; one that had some keeps going."""
    from agent import audit_emitter

    answers = iter([False, True, True])      # round 1: nothing acknowledged; then all

    def deliver(producer, topic, records, timeout_s, timestamp_ms=0):
        return (set(range(len(records))) if next(answers) else set()), []
    made: list = []

    class Client:
        def __init__(self, conf, logger=None):
            made.append(self)

        def purge(self):
            pass

        def flush(self, timeout):
            return 0
    monkeypatch.setattr(audit_emitter, "deliver", deliver)
    monkeypatch.setattr(audit_emitter, "Producer", Client)
    db = StateDB(tmp_path / "state.db")
    em = AuditEmitter(db=db, agent_id="a1", topics=["t"], audit_topic="docket.audit",
                      window_ms=WINDOW, interval_ms=60_000, producer_conf={},
                      metrics=Metrics(), clock=lambda: NOW / 1000)
    assert em.emit() == 0 and len(made) == 1
    assert em.emit() == 1 and len(made) == 2          # a new producer, answered
    assert em.emit() == 1 and len(made) == 2          # kept
    db.close()


def test_the_native_tally_of_a_slot_of_many_blocks_keys_and_parts_is_the_python_one(tmp_path):
    """A slot of a block a record (as a slot sent while it fills holds one a turn), some with
    keys, a line split in parts, records late and not: the native walk's tally equals the
    per-block one in every field; a payload that breaks the framing is refused."""
    whole = native_tally()
    rng = np.random.default_rng(3)
    with BufferPool(tmp_path / "p", 8 << 20, 64 << 10, linger_ms=1e9, sync_on_seal=False) as pool:
        for i in range(400):
            data = b"event %d %s\n" % (i, b"y" * int(rng.integers(0, 300)))
            ts = np.array([NOW - int(rng.integers(0, 4 * WINDOW))])
            keys = [b"k%d" % i] if i % 3 == 0 else None
            pool.append("t", Chunk.from_lines(data, ts, keys=keys))
        big = b"z" * (150 << 10) + b"\n"                 # longer than a slot: split in parts
        pool.append("t", Chunk.from_lines(big, np.array([NOW - 5])))
        pool.seal_all()
        edges = np.array([2**63 - 5, -2**63 + 5, 0, -1])     # wrapping as numpy does
        pool.append("t", Chunk.from_lines(b"a\nb\nc\nd\n", edges))
        pool.seal_all()
        slots = pool.sealed()
        assert sum(1 for s in slots for _ in s.blocks()) > 400
        for slot in slots:
            want = tally_slot(slot, WINDOW, NOW - WINDOW)
            assert tally_slot(slot, WINDOW, NOW - WINDOW, native_tally=whole) == want
        payload = np.array(slots[0].payload)
        with pytest.raises(ValueError, match="runs past the payload end"):
            whole(payload[:-8], WINDOW, NOW, HASH_SEED)
        payload[0] ^= 0xFF
        with pytest.raises(ValueError, match="no block magic at payload offset 0"):
            whole(payload, WINDOW, NOW, HASH_SEED)
        with pytest.raises(ValueError, match="window_ms must be positive"):
            whole(np.array(slots[1].payload), 0, NOW, HASH_SEED)


def test_the_native_hash_is_the_audits_and_refuses_what_lies_outside_the_payload():
    value_hashes = native_hashes()
    rng = np.random.default_rng(7)
    payload = rng.integers(0, 256, 5000, dtype=np.uint8)
    offsets = rng.integers(0, 4000, 500)
    lengths = rng.integers(0, 1000, 500).astype("<u4")
    lengths[:3] = 0                                     # empty values hash too
    out = np.empty(500, np.uint64)
    value_hashes(payload, offsets, lengths, HASH_SEED, out)
    raw = payload.tobytes()
    assert out.tolist() == [value_hash(raw[o:o + n]) for o, n in
                            zip(offsets.tolist(), lengths.tolist(), strict=True)]
    with pytest.raises(ValueError, match="record 1: bytes 4990..5010 lie outside"):
        value_hashes(payload, np.array([0, 4990]), np.array([1, 20], "<u4"), HASH_SEED,
                     np.empty(2, np.uint64))
    with pytest.raises(ValueError, match="record 0: bytes -1..0 lie outside"):
        value_hashes(payload, np.array([-1]), np.array([1], "<u4"), HASH_SEED,
                     np.empty(1, np.uint64))
    with pytest.raises(ValueError, match="one entry per record"):
        value_hashes(payload, offsets, lengths[:-1], HASH_SEED, out)
    frozen = np.empty(500, np.uint64)
    frozen.flags.writeable = False
    with pytest.raises((ValueError, BufferError)):
        value_hashes(payload, offsets, lengths, HASH_SEED, frozen)


def test_rounds_keep_their_schedule_when_the_wall_clock_steps_and_stop_with_the_emitter(
        tmp_path):
    """The rounds run on the monotonic clock, in a thread of their own: a wall clock stepped
    back ten minutes (the windows' clock) holds none back; ``stop`` ends them, and no round
    comes after it."""
    import threading
    import time
    db = StateDB(tmp_path / "state.db")
    wall = [NOW / 1000]
    em = AuditEmitter(db=db, agent_id="a1", topics=["t"], audit_topic="docket.audit",
                      window_ms=WINDOW, interval_ms=20, producer_conf={},
                      metrics=Metrics(), clock=lambda: wall[0])
    rounds: list[float] = []
    more = threading.Event()

    def counted(timeout_s=None):
        rounds.append(wall[0])
        if len(rounds) == 2:
            wall[0] -= 600                      # the step back, between two rounds
        if len(rounds) >= 6:
            more.set()
        return 0
    em.emit = counted
    em.start()
    try:
        assert more.wait(30), f"{len(rounds)} round(s) in 30 s at a 20 ms interval"
    finally:
        em.stop(last_round=False)
    assert rounds[0] - rounds[-1] == 600        # rounds came after the step back
    after = len(rounds)
    time.sleep(0.1)                             # five intervals: none may come now
    assert len(rounds) == after and em._rounds is None
    db.close()


def test_a_round_under_way_when_the_agent_is_abandoned_settles_nothing(tmp_path, monkeypatch):
    """``Agent.abandon`` (a SIGKILL in the tests) lands while a round waits for its
    acknowledgements: as after a kill, the round's windows stay marked in the state database
    (the next start sends them again); the round settled them before, whoever had the state
    folder by then."""
    import sqlite3

    from agent import audit_emitter

    def deliver(producer, topic, records, timeout_s, timestamp_ms=0):
        em.abandon()                                 # the kill, while Kafka acknowledges
        return set(range(len(records))), []
    monkeypatch.setattr(audit_emitter, "deliver", deliver)
    monkeypatch.setattr(audit_emitter, "Producer", lambda conf, logger=None: object())
    data, ts = lines(50)
    db = StateDB(tmp_path / "state.db")
    em = emitter(db)
    sealed(tmp_path, em, data, ts)
    db.advance_sealed({}, audit=em.persist)
    marked = "SELECT count(*) FROM audit_windows WHERE dirty = 1"
    with sqlite3.connect(tmp_path / "state.db") as conn:
        before = conn.execute(marked).fetchone()[0]
    assert before > 0
    assert em.emit() == 0
    with sqlite3.connect(tmp_path / "state.db") as conn:
        assert conn.execute(marked).fetchone()[0] == before
    db.close()
