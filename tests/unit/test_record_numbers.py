"""Record numbers (``docket-seq``): given in seal order, dense from 0, kept in the slot so a slot
sent again carries the same numbers, never given twice across crashes, kept by known drops;
and the map from numbers to files and byte ranges (``docket-agent locate``)."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from agent.buffer import BufferPool, PoolFormatError
from agent.buffer import layout as L
from agent.buffer.seams import SimulatedCrash
from agent.cli import main as agent_main
from agent.state.db import StateDB
from tests.unit.fakeproducer import FakeKafka
from tests.unit.poolkit import SIZE, SLOT, CrashingOps, chunk_of, ids_of
from tests.unit.tailkit import FakeClock, id_of, lines


def _pool(tmp_path, **kw) -> BufferPool:
    return BufferPool(tmp_path / "pool", SIZE, SLOT, linger_ms=1e9, sync_on_seal=False, **kw)


def _numbered(pool: BufferPool) -> dict[int, int]:
    """record number → id, over the pool's sealed slots."""
    out = {}
    for slot in pool.sealed():
        vals = [v for _t, _k, v in slot.records()]
        for k, i in enumerate(ids_of(vals)):
            out[slot.first_record + k] = i
    return out


def test_numbers_are_dense_in_seal_order_across_topics(tmp_path):
    pool = _pool(tmp_path)
    pool.append("a", chunk_of(range(0, 30)))
    pool.append("b", chunk_of(range(100, 110)))
    pool.seal("b")                                  # b seals first: it gets the first numbers
    pool.append("a", chunk_of(range(30, 300)))      # a fills and seals several slots
    pool.seal_all()
    slots = sorted(pool.sealed(), key=lambda s: s.first_record)
    assert slots[0].topic == "b" and slots[0].first_record == 0
    at = 0
    for s in slots:
        assert s.first_record == at
        at += s.record_count
    assert at == 310 == pool.next_record
    assert pool.stats()["next_record"] == 310
    pool.close()


@pytest.mark.parametrize("point", ["seal:before_header", "seal:before_state", "seal:after_state",
                                   "free:before_state"])
def test_no_number_is_given_twice_across_a_crash(tmp_path, point):
    """Slot A is sealed (numbers 0..), acknowledged and freed, and being reused when the agent
    dies at ``point`` of the next seal or free; the state database's count is lost too (a
    fresh ``first_record`` of 0). The numbers a new pool gives must start after every number
    any earlier slot had — the freed slot's included — and a slot found sealed keeps its own."""
    pool = _pool(tmp_path)
    pool.append("t", chunk_of(range(0, 50)))
    pool.seal("t")
    [a] = pool.take()
    given = _numbered(pool)
    pool.free(a)
    ops = CrashingOps(at=point)
    pool.ops = ops
    pool.append("t", chunk_of(range(50, 80)))       # reuses A's slot (last freed, first out)
    try:
        if point.startswith("free"):
            pool.seal("t")
            given |= _numbered(pool)
            [b] = pool.take()
            pool.free(b)
        else:
            pool.seal("t")
            given |= _numbered(pool)
    except SimulatedCrash:
        pass
    else:
        raise AssertionError(f"no crash at {point}")
    pool.abandon()
    again = _pool(tmp_path, first_record=0)
    found = _numbered(again)
    for n, i in found.items():                      # a slot found sealed keeps its numbers
        assert given.get(n, i) == i
    top = max([*given, *found]) + 1 if (given or found) else 0
    if point == "seal:before_header" or point == "seal:before_state":
        top = max(given) + 1                        # the slot being sealed gave nothing
    assert again.next_record >= top
    again.append("t", chunk_of(range(80, 90)))
    again.seal("t")
    fresh = {n for n in _numbered(again) if n not in found}
    assert min(fresh) >= top and not fresh & set(given)
    again.close()


def test_an_oversized_line_dropped_keeps_its_number(tmp_path):
    drops = []
    pool = _pool(tmp_path, oversize="drop", on_drop=drops.append)
    data = b"".join([b"a\n", b"x" * (SLOT * 2) + b"\n", b"b\n"])
    pool.append("t", _chunk(data))
    pool.seal_all()
    [drop] = drops
    assert drop.reason == "oversize_dropped" and drop.first_record is not None
    numbers = sorted(n for s in pool.sealed()
                     for n in range(s.first_record, s.first_record + s.record_count))
    assert sorted([*numbers, drop.first_record]) == [0, 1, 2]   # dense, the drop included
    pool.close()


def _chunk(data: bytes):
    from agent.buffer import Chunk
    return Chunk.from_lines(data, 1_000)


def test_a_version_1_pool_is_upgraded_when_empty_and_refused_when_it_holds_sealed_slots(
        tmp_path):
    pool = _pool(tmp_path)
    pool.close()
    path = tmp_path / "pool"

    def make_v1(sealed: bool) -> None:
        raw = bytearray(path.read_bytes())
        header = np.frombuffer(bytes(raw[:L.FILE_HEADER.itemsize]), L.FILE_HEADER).copy()
        header[0]["version"] = 1
        header[0]["geometry_crc"] = L.geometry_crc(header)
        raw[:L.FILE_HEADER.itemsize] = header.tobytes()
        raw[L.FILE_HEADER_BYTES + L.V1_STATE_OFFSET] = L.SEALED if sealed else L.FREE
        path.write_bytes(bytes(raw))

    make_v1(sealed=True)
    with pytest.raises(PoolFormatError, match="version 1 with 1 sealed slot"):
        _pool(tmp_path)
    make_v1(sealed=False)
    pool = _pool(tmp_path)
    pool.append("t", chunk_of(range(3)))
    pool.seal("t")
    pool.close()
    header = np.frombuffer(path.read_bytes()[:L.FILE_HEADER.itemsize], L.FILE_HEADER)
    assert int(header[0]["version"]) == L.VERSION and int(header[0]["next_record"]) == 3


# -- through the agent ---------------------------------------------------------------------------
def _agent(tmp_path, kafka: FakeKafka, boot: str = "boot-1", **buffer):
    from agent.config import parse
    from agent.service import Agent, Seams

    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    conf = {
        "agent": {"id": "h1", "state_dir": str(tmp_path / "state")},
        "buffer": {"size_bytes": 4096 + 4096 + 16 * SLOT, "slot_size_bytes": SLOT,
                   "linger_ms": 5, "sync_on_seal": False, **buffer},
        "broker": {"bootstrap_servers": "127.0.0.1:9"},
        "audit": {"enabled": False},
        "sources": [{"type": "file", "topic": "t", "paths": [str(logs / "*.log")]}],
    }
    (tmp_path / "agent.toml").write_text(_toml(conf))
    agent = Agent(parse(conf), seams=Seams(clock=FakeClock(), producer_factory=kafka.producer,
                                           file_events=False, boot_id=lambda: boot))
    agent.begin()
    return agent


def _toml(conf: dict) -> str:
    out = []
    for table, values in conf.items():
        if table == "sources":
            continue
        out.append(f"[{table}]")
        out += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    for src in conf["sources"]:
        out.append("[[sources]]")
        out += [f"{k} = {json.dumps(v)}" for k, v in src.items()]
    return "\n".join(out) + "\n"


def _run(agent, turns: int = 40, wait_for_seals: bool = True) -> None:
    """``turns`` turns of the fake clock. With ``sync_on_seal`` the pool seals on a thread
    of its own, on real time: each turn waits for the seals it began (unless
    ``wait_for_seals`` is off), so what the turns send does not depend on how fast that thread
    gets the CPU."""
    for _ in range(turns):
        agent.clock.advance(0.3)
        agent.turn()
        if wait_for_seals:
            _sealing_done(agent)


def _sealing_done(agent, timeout_s: float = 60.0) -> None:
    """Until the pool's sealing thread (if it runs) has sealed every slot closed so far."""
    pool = agent.pool
    deadline = time.monotonic() + timeout_s
    with pool._lock:
        while pool._unsynced and pool._seal_error is None:
            left = deadline - time.monotonic()
            assert left > 0, f"{len(pool._unsynced)} slots still being sealed after {timeout_s} s"
            pool._closed.wait(left)


def _arrived(kafka: FakeKafka) -> dict[int, int]:
    """record number → id, from what the fake Kafka holds (every copy must agree)."""
    out: dict[int, int] = {}
    for _topic, value, _key, _ts, headers in kafka.log:
        h = dict(headers)
        n = int.from_bytes(h["docket-seq"], "big")
        assert out.setdefault(n, id_of(value)) == id_of(value)
        assert h["docket-origin"] == b"h1"
    return out


def test_numbers_survive_a_restart_and_locate_names_file_and_bytes(tmp_path, capsys):
    kafka = FakeKafka()
    agent = _agent(tmp_path, kafka)
    logs = tmp_path / "logs"
    (logs / "a.log").write_bytes(lines(0, 150))
    (logs / "b.log").write_bytes(lines(1000, 1100))
    _run(agent)
    incarnation = agent.incarnation
    agent.shutdown()
    with open(logs / "a.log", "ab") as f:
        f.write(lines(150, 200))
    agent = _agent(tmp_path, kafka)
    assert agent.incarnation == incarnation         # the same state: the same number space
    _run(agent)
    agent.shutdown()
    arrived = _arrived(kafka)
    assert sorted(arrived) == list(range(300))      # dense from 0, over the restart
    assert sorted(arrived.values()) == [*range(200), *range(1000, 1100)]

    # Every number maps back to the very line: file and byte range.
    for first, last in [(0, 299), (7, 7), (120, 260)]:
        capsys.readouterr()
        assert agent_main(["locate", "--config", str(tmp_path / "agent.toml"),
                           "--seq", f"{first}-{last}", "--json"]) == 0
        runs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
        covered = set()
        for run in runs:
            assert run["exact"] == 1
            data = (logs / run["path"].rsplit("/", 1)[1]).read_bytes()[run["start"]:run["end"]]
            ids = [id_of(x + b"\n") for x in data.split(b"\n")[:-1]]
            numbers = range(run["first_record"], run["first_record"] + run["records"])
            assert len(ids) == run["records"]
            assert [arrived[n] for n in numbers] == ids
            covered.update(numbers)
        assert set(range(first, last + 1)) <= covered
    capsys.readouterr()
    assert agent_main(["locate", "--config", str(tmp_path / "agent.toml"),
                       "--seq", "290-400"]) == 0
    out = capsys.readouterr().out
    assert "a.log" in out and "300-400  not given yet" in out
    with pytest.raises(SystemExit) as exit_:
        agent_main(["locate", "--config", str(tmp_path / "agent.toml"), "--seq", "9-3"])
    assert exit_.value.code == 2 and "0 <= A <= B" in capsys.readouterr().err


def test_a_lost_state_starts_a_new_incarnation(tmp_path):
    db = StateDB(tmp_path / "one.db")
    inc, nxt = db.identity()
    assert nxt == 0 and inc == db.identity()[0]
    db.advance_sealed({}, next_record=500)
    db.advance_sealed({}, next_record=400)          # never back
    db.close()
    db = StateDB(tmp_path / "one.db")
    assert db.identity() == (inc, 500)
    other = StateDB(tmp_path / "two.db")
    assert other.identity()[0] != inc


def test_a_slot_spilled_before_numbering_gets_its_numbers_once_for_good(tmp_path):
    """A spill file without ``first_record`` (written by an agent before record numbers) is
    numbered at recovery and written again: every later start finds the same numbers."""
    import json as _json
    import struct

    import snappy

    spill = tmp_path / "spill"
    pool = _pool(tmp_path, spill_dir=spill, spill_max_bytes=1 << 20)
    n = 0
    while not list(spill.glob("*.spill")):
        n += pool.append("t", chunk_of(range(n, n + 40))).records
    pool.seal_all()
    pool.close()
    for path in spill.glob("*.spill"):                  # as an older agent wrote them
        blob = path.read_bytes()
        magic, version, head_len = struct.unpack_from("<8sII", blob)
        head = _json.loads(blob[16:16 + head_len])
        del head["first_record"]
        new_head = _json.dumps(head).encode()
        path.write_bytes(struct.pack("<8sII", magic, version, len(new_head)) + new_head
                         + blob[16 + head_len:])
        assert snappy.decompress(blob[16 + head_len:])
    seen = []
    for _ in range(3):
        again = _pool(tmp_path, spill_dir=spill, spill_max_bytes=1 << 20)
        seen.append(sorted(_numbered(again).items()))
        again.close()
    assert seen[0] == seen[1] == seen[2]
    numbers = [k for k, _ in seen[0]]
    assert len(numbers) == len(set(numbers)) == n


def test_a_quarantined_slots_numbers_are_never_given_again(tmp_path):
    """The file header's count lags the seal (as after a crash just after the state byte);
    the slot's payload is torn: it is quarantined and its numbers journalled — and the next
    numbers start after them."""
    drops = []
    pool = _pool(tmp_path)
    pool.append("t", chunk_of(range(10)))
    pool.seal("t")
    slot = pool.sealed()[0]
    pool.close()
    with open(tmp_path / "pool", "r+b") as f:
        header = np.frombuffer(f.read(L.FILE_HEADER.itemsize), L.FILE_HEADER).copy()
        header[0]["next_record"] = 0
        f.seek(0)
        f.write(header.tobytes())
        f.seek(pool.geometry.slot_offset(slot.index) + 8)
        f.write(b"\xff" * 16)                            # the payload no longer fits its CRC
    again = _pool(tmp_path, on_drop=drops.append)
    assert [(d.reason, d.first_record, d.records) for d in drops] == [("corrupt", 0, 10)]
    assert again.next_record == 10
    again.close()


def test_a_cut_journal_line_neither_stops_the_journal_nor_hides_numbers(tmp_path):
    from agent.state.journal import LossJournal
    from agent.telemetry import Metrics

    path = tmp_path / "loss-journal.jsonl"
    journal = LossJournal(path, Metrics())
    journal.record("buffer_full", "t", 5, records=(10, 14))
    journal.close()
    with open(path, "a") as f:
        f.write('{"ts_ms": 1, "reason": "kafka_x", "rec')     # a crash mid-write
    journal = LossJournal(path, Metrics())
    journal.record("kafka_msg_size_too_large", "t", 1, records=(15, 15))
    assert journal.dropped_numbers() == [[10, 15]]
    assert len(journal.entries()) == 2


def test_numbers_are_settled_up_to_the_oldest_slot_not_yet_freed(tmp_path):
    """``record_marks``: (the last number given, the highest up to which every number is
    acknowledged or dropped). A slot freed out of order settles nothing past an older one
    still in flight; a spilled slot is not settled; a dropped one is."""
    pool = _pool(tmp_path)
    pool.append("a", chunk_of(range(0, 10)))
    pool.seal("a")
    pool.append("b", chunk_of(range(10, 30)))
    pool.seal("b")
    pool.append("c", chunk_of(range(30, 35)))
    pool.seal("c")
    first, second, third = sorted(pool.take(), key=lambda s: s.first_record)
    assert pool.record_marks() == (34, -1)                # nothing acknowledged yet
    pool.free(second)                                     # acknowledged out of order
    assert pool.record_marks() == (34, -1)
    pool.free(first)
    assert pool.record_marks() == (34, 29)                # up to the third slot
    pool.free(third)
    assert pool.record_marks() == (34, 34)
    pool.append("a", chunk_of(range(35, 40)))             # filling: no numbers given yet
    assert pool.record_marks() == (34, 34)
    pool.close()


def test_a_dropped_slot_is_settled_and_a_spilled_one_is_not(tmp_path):
    dropped = _pool(tmp_path / "d", on_full="drop_oldest")
    for i in range(0, 10_000, 100):                       # more than the pool holds
        dropped.append("a", chunk_of(range(i, i + 100)))
        dropped.seal("a")
    oldest = min(s.first_record for s in dropped.sealed())
    assert oldest > 0                                     # the first slots were dropped
    assert dropped.record_marks() == (dropped.next_record - 1, oldest - 1)
    dropped.close()
    spilling = _pool(tmp_path / "s", spill_dir=tmp_path / "spill", spill_max_bytes=64 << 20)
    for i in range(0, 10_000, 100):
        spilling.append("a", chunk_of(range(i, i + 100)))
        spilling.seal("a")
    assert spilling.stats()["slots_spilled"] > 0
    assert spilling.record_marks() == (spilling.next_record - 1, -1)
    spilling.close()


def test_a_number_a_drop_took_is_never_given_again_after_a_power_loss(tmp_path):
    """An oversized line dropped takes a number: the pool's file header counts it (synced only
    at the next seal) and the loss journal names it (fsync'ed at once). A power loss that keeps
    the journal entry but neither the header's count nor the state database's, and a start
    that does not read that line again (its file deleted meanwhile), must not give that number
    to another record: the journal names it as dropped."""
    kafka = FakeKafka()
    agent = _agent(tmp_path, kafka, oversize="drop")
    logs = tmp_path / "logs"
    (logs / "a.log").write_bytes(lines(0, 10))
    _run(agent)
    (logs / "b.log").write_bytes(b"id-000000010 " + b"y" * (2 * SLOT) + b"\n")
    _run(agent)
    [entry] = agent.journal.entries()
    assert entry["reason"] == "oversize_dropped" and entry["records"] == [10, 10]
    assert entry["incarnation"] == agent.incarnation
    agent.abandon()                               # the power cut, then what it undid:
    pool_file = tmp_path / "state" / "buffer.pool"
    header = np.frombuffer(pool_file.read_bytes()[:L.FILE_HEADER.itemsize], L.FILE_HEADER).copy()
    header[0]["next_record"] = 10
    with open(pool_file, "r+b") as f:
        f.write(header.tobytes())
    db = StateDB(tmp_path / "state" / "state.db")
    db.conn.execute("UPDATE identity SET next_record = 10")
    db.conn.commit()
    db.close()
    (logs / "b.log").unlink()                     # the dropped line is not read again
    with open(logs / "a.log", "ab") as f:
        f.write(lines(11, 20))
    agent = _agent(tmp_path, kafka, oversize="drop")
    _run(agent)
    agent.shutdown()
    arrived = _arrived(kafka)
    assert 10 not in arrived, f"number 10 given to id {arrived.get(10)}, journalled as dropped"
    assert sorted(arrived.values()) == [*range(10), *range(11, 20)]


def test_journalled_numbers_count_only_in_their_own_number_space(tmp_path):
    """After a lost state (a new incarnation) the old entries' numbers are another number
    space's: they neither mark numbers of the new one as dropped nor hold its numbering back.
    Entries written before entries carried their incarnation count as before."""
    from agent.state.journal import LossJournal
    from agent.telemetry import Metrics

    path = tmp_path / "loss-journal.jsonl"
    old = LossJournal(path, Metrics(), incarnation="1-old")
    old.record("oversize_dropped", "t", 1, records=(500, 500))
    old.close()
    with open(path, "a") as f:                       # an entry of an earlier version
        f.write(json.dumps({"reason": "oversize_dropped", "topic": "t", "events": 1,
                            "records": [7, 7]}) + "\n")
    new = LossJournal(path, Metrics(), incarnation="2-new")
    assert new.dropped_numbers() == [[7, 7]] and new.next_number() == 8
    again = LossJournal(path, Metrics(), incarnation="1-old")
    assert again.dropped_numbers() == [[7, 7], [500, 500]] and again.next_number() == 501


def _reserved(agent) -> int | None:
    """The bound ``record-numbers`` holds for the agent's incarnation."""
    from agent.state.numbers import NumberReserve

    return NumberReserve(agent.cfg.numbers_path, agent.incarnation, None).reserved


def _numbers_unused(agent) -> list[list[int]]:
    return [e["records"] for e in agent.journal.entries() if e["reason"] == "numbers_unused"]


@pytest.mark.parametrize("sync_after", [False, True])
def test_a_power_loss_with_sync_on_seal_off_gives_no_number_kafka_took_to_another_line(
        tmp_path, sync_after):
    """``sync_on_seal = false``: nothing counting the numbers given is synced before a slot
    goes. A power loss that takes the pool file and the state database back to the agent's
    start (nothing of them synced since) would let the next start give numbers Kafka took for
    one line to another — here to a file that came meanwhile. The reservation on disk
    (``agent/state/numbers.py``) makes a start under another boot id give numbers past every
    one reserved, and journals those it skips, so the audit counts none of them as lost —
    also when the agent is started again with ``sync_on_seal`` on."""
    kafka = FakeKafka()
    agent = _agent(tmp_path, kafka)
    state, logs = tmp_path / "state", tmp_path / "logs"
    image = {name: (state / name).read_bytes() for name in ("buffer.pool", "state.db",
                                                            "state.db-wal")
             if (state / name).exists()}
    (logs / "b.log").write_bytes(lines(0, 150))
    _run(agent)
    assert sorted(_arrived(kafka).values()) == list(range(150))
    reserved = _reserved(agent)
    assert reserved >= 150
    agent.abandon()                                   # the power cut, and what it undid:
    for name in ("buffer.pool", "state.db", "state.db-wal"):
        (state / name).unlink(missing_ok=True)
    for name, data in image.items():
        (state / name).write_bytes(data)
    (logs / "a.log").write_bytes(lines(1000, 1100))   # sorts first: read first after the cut
    agent = _agent(tmp_path, kafka, boot="boot-2", sync_on_seal=sync_after)
    _run(agent)
    arrived = _arrived(kafka)                         # asserts one line per number
    assert set(arrived.values()) == {*range(150), *range(1000, 1100)}
    assert min(n for n, i in arrived.items() if i >= 1000) >= reserved
    assert _numbers_unused(agent) == [[0, reserved - 1]]
    assert agent._numbers().dropped == [[0, reserved - 1]]     # the audit's missing
    agent.shutdown()


def test_turns_that_outrun_the_sealing_thread_lose_and_duplicate_nothing(tmp_path,
                                                                         monkeypatch, request):
    """What a loaded host does to the start after a power cut (``sync_on_seal`` on, numbers
    past the reservation): the sealing thread gets no CPU while the agent turns. Held here at
    its first sync: every turn goes on without it, nothing sealed is sent, and once it runs
    again every line arrives once, under numbers past the reservation."""
    kafka = FakeKafka()
    agent = _agent(tmp_path, kafka)
    logs = tmp_path / "logs"
    (logs / "b.log").write_bytes(lines(0, 150))
    _run(agent)
    reserved = _reserved(agent)
    agent.abandon()
    agent = _agent(tmp_path, kafka, boot="boot-2", sync_on_seal=True)
    pool, gate, held = agent.pool, threading.Event(), threading.Event()
    request.addfinalizer(gate.set)                    # a failure below lets the thread go too
    sync_data = pool._sync_data

    def held_sync(mm, c):
        if threading.current_thread() is pool._sealer:   # a seal made at once is not held
            held.set()
            assert gate.wait(60), "the test never let the sealing thread go on"
        sync_data(mm, c)

    monkeypatch.setattr(pool, "_sync_data", held_sync)
    (logs / "a.log").write_bytes(lines(1000, 1100))  # only after: its every seal is held
    before = len(kafka.log)
    _run(agent, wait_for_seals=False)
    assert held.wait(60) and pool._unsynced, "the sealing thread was never held"
    _run(agent, wait_for_seals=False)                 # turns go on while it is held
    assert pool._unsynced, "a seal went past the held sync"
    assert not {id_of(v) for _t, v, *_ in kafka.log[before:]} & set(range(1000, 1100))
    produced = [v for p in kafka.producers for v in p.produced]
    assert not {id_of(v) for v in produced} & set(range(1000, 1100)), "sent before sealed"
    gate.set()
    _run(agent)
    arrived = _arrived(kafka)                         # asserts one line per number
    assert set(arrived.values()) == {*range(150), *range(1000, 1100)}
    assert min(n for n, i in arrived.items() if i >= 1000) >= reserved
    counts = [id_of(v) for _t, v, *_ in kafka.log]
    assert all(counts.count(i) == 1 for i in range(1000, 1100))
    agent.shutdown()


def test_a_process_crash_or_a_clean_stop_skips_no_number(tmp_path):
    """The page cache outlives a killed process (same boot id): the numbers go on densely from
    what the start found. A clean stop gives the rest of the reservation back: a start after
    the host started again skips nothing either."""
    kafka = FakeKafka()
    agent = _agent(tmp_path, kafka)
    logs = tmp_path / "logs"
    (logs / "a.log").write_bytes(lines(0, 50))
    _run(agent)
    agent.abandon()                                   # SIGKILL
    with open(logs / "a.log", "ab") as f:
        f.write(lines(50, 80))
    agent = _agent(tmp_path, kafka)
    _run(agent)
    agent.shutdown()
    assert _reserved(agent) == 80
    with open(logs / "a.log", "ab") as f:
        f.write(lines(80, 100))
    agent = _agent(tmp_path, kafka, boot="boot-2")
    _run(agent)
    assert _numbers_unused(agent) == []
    agent.shutdown()
    assert _arrived(kafka) == {i: i for i in range(100)}


def _start(reserve, found: int) -> tuple[int, tuple[int, int] | None]:
    """``NumberReserve.start`` with what it skipped: (next, (first, last) or None)."""
    skipped = []
    nxt = reserve.start(found, lambda numbers: skipped.append(numbers) or True)
    return nxt, (skipped or [None])[0]


@pytest.mark.parametrize("content", [b"{not json", b"DKRN\x01" + bytes(range(200)),
                                     b"DKRN\x02" + bytes(100), bytes(512) + b"DKRN"])
def test_a_reservation_file_not_valid_is_not_taken(tmp_path, caplog, content):
    from agent.state.numbers import STEP, NumberReserve

    path = tmp_path / "record-numbers"
    path.write_bytes(content)
    reserve = NumberReserve(path, "inc", "boot-2")
    assert reserve.reserved is None and "is not valid" in caplog.text
    assert _start(reserve, 7) == (7, None)
    reserve.cover(8)                                   # the file is whole again
    assert _start(NumberReserve(path, "inc", "boot-4"), 9) == (8 + STEP, (9, 8 + STEP - 1))
    assert path.stat().st_size == 1024


def test_a_reservation_write_cut_short_leaves_the_bound_before_it(tmp_path, caplog):
    """Two sectors written in turn: a write the power cut short fails its checksum, and the
    other sector's bound — the one every header written so far was covered by — is taken."""
    from agent.state.numbers import SECTOR, STEP, NumberReserve

    path = tmp_path / "record-numbers"
    reserve = NumberReserve(path, "inc", "boot-1")
    assert _start(reserve, 0) == (0, None)             # write 1
    reserve.cover(5)                                   # write 2: 5 + STEP
    reserve.cover(STEP + 10)                           # write 3: 2 * STEP + 10, in sector 1
    data = bytearray(path.read_bytes())
    data[SECTOR + 40] ^= 0xFF
    path.write_bytes(bytes(data))
    assert _start(NumberReserve(path, "inc", "boot-2"), 3) == (5 + STEP, (3, 4 + STEP))
    assert "the other record is taken" in caplog.text


def test_a_reservation_of_another_incarnation_is_not_taken(tmp_path):
    from agent.state.numbers import NumberReserve

    path = tmp_path / "record-numbers"
    NumberReserve(path, "1-old", "boot-1").cover(10)
    assert _start(NumberReserve(path, "2-new", "boot-2"), 0) == (0, None)


def test_a_listeners_kept_slot_takes_its_numbers_past_the_reservation(tmp_path):
    """A slot a listener was filling survives a power loss unsealed and is sealed at open,
    taking numbers then. It must take them past the bound: the header's count found on the
    disk may be below numbers Kafka already holds (here 0-99, sealed and sent after the
    image the power loss left)."""
    from agent.state.numbers import NumberReserve

    reserve = NumberReserve(tmp_path / "record-numbers", "inc", "boot-1")
    reserve.start(0)
    pool = BufferPool(tmp_path / "pool", SIZE, SLOT, linger_ms=1e9, sync_on_seal=False,
                      reserve_records=reserve.cover, numbers_found=reserve.start)
    pool.append("t", chunk_of(range(0, 5), width=12), once=True)   # a listener's, filling
    pool._map.flush()
    image = (tmp_path / "pool").read_bytes()           # what the power loss leaves
    pool.append("u", chunk_of(range(1000, 1100), width=12))
    pool.seal("u")
    assert [(s.first_record, s.record_count) for s in pool.sealed()] == [(0, 100)]
    pool.abandon()
    (tmp_path / "pool").write_bytes(image)
    skipped = []
    again = NumberReserve(tmp_path / "record-numbers", "inc", "boot-2")
    pool = BufferPool(tmp_path / "pool", SIZE, SLOT, linger_ms=1e9, sync_on_seal=False,
                      reserve_records=again.cover,
                      numbers_found=lambda found: again.start(
                          found, lambda numbers: skipped.append(numbers) or True))
    [kept] = pool.sealed()
    assert kept.topic == "t" and kept.first_record >= 100, \
        f"the kept slot took numbers {kept.first_record}-{kept.first_record + 4}"
    assert skipped == [(0, kept.first_record - 1)]
    pool.close()


def test_a_bound_that_cannot_be_written_has_each_seal_synced(tmp_path, caplog):
    """A full disk refusing the bound's write does not stop the seal: its data and header
    are synced as with ``sync_on_seal``, so the header on the disk counts its numbers; once
    a write succeeds, seals are no longer synced."""
    from agent.buffer.seams import FileOps
    from agent.state.numbers import NumberReserve

    class Counting(FileOps):
        syncs = 0

        def msync(self, mm, offset, length):
            self.syncs += 1
            super().msync(mm, offset, length)

    reserve = NumberReserve(tmp_path / "record-numbers", "inc", "boot-1")
    full = [True]

    def cover(needed: int) -> None:
        if full[0]:
            raise OSError(28, "No space left on device")
        reserve.cover(needed)

    pool = BufferPool(tmp_path / "pool", SIZE, SLOT, linger_ms=1e9, sync_on_seal=False,
                      ops=(ops := Counting()), reserve_records=cover)
    pool.append("t", chunk_of(range(0, 10)))
    pool.seal("t")
    assert ops.syncs == 2 and "every seal is synced until it can be" in caplog.text
    full[0] = False
    pool.append("t", chunk_of(range(10, 20)))
    pool.seal("t")
    assert ops.syncs == 2 and reserve.reserved >= 20
    pool.close()


def test_a_start_counts_the_numbers_of_slots_it_frees_and_keeps_its_answer(tmp_path):
    """Slots freed at open as acknowledged still count their numbers (the header's count
    lost), what the start decides is written into the file header at once (a kill before the
    next seal goes on from there), and a start asked twice never answers lower."""
    from agent.state.numbers import NumberReserve

    pool = _pool(tmp_path)
    pool.append("t", chunk_of(range(0, 30)))
    pool.seal("t")
    pool.abandon()
    pool_file = tmp_path / "pool"
    header = np.frombuffer(pool_file.read_bytes()[:L.FILE_HEADER.itemsize], L.FILE_HEADER).copy()
    header[0]["next_record"] = 0
    with open(pool_file, "r+b") as f:
        f.write(header.tobytes())
    found = []

    def numbers_found(n: int) -> int:
        found.append(n)
        return 500

    pool = _pool(tmp_path, delivered=lambda meta: True, numbers_found=numbers_found)
    assert found == [30] and not pool.sealed() and pool.counters["acknowledged_freed"] == 1
    pool.abandon()
    assert _pool(tmp_path).next_record == 500
    reserve = NumberReserve(tmp_path / "record-numbers", "inc", "boot-1")
    assert reserve.start(40) == 40 and reserve.start(10) == 40


def test_skipped_numbers_not_journalled_yet_are_skipped_again(tmp_path):
    """The entry of the numbers skipped waits in memory (a full disk): this boot's id is not
    written — nor by the seals after, which move the bound on — so the next start after a
    crash, under the same boot id, skips and journals them again."""
    from agent.state.numbers import STEP, NumberReserve

    path = tmp_path / "record-numbers"
    NumberReserve(path, "inc", "boot-1").cover(10)
    waiting = NumberReserve(path, "inc", "boot-2")
    assert waiting.start(3, lambda skipped: False) == 10 + STEP
    waiting.cover(20 + STEP)                            # a seal, then a crash
    assert waiting.reserved == 20 + 2 * STEP
    again = []
    assert NumberReserve(path, "inc", "boot-2").start(
        3, lambda numbers: again.append(numbers) or True) == 20 + 2 * STEP
    assert again == [(3, 19 + 2 * STEP)]
    assert NumberReserve(path, "inc", "boot-2").start(3) == 3     # journalled: this boot's
    assert NumberReserve(path, "inc", "boot-2").reserved == 20 + 2 * STEP
