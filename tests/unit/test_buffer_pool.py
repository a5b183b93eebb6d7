"""The buffer pool: framing, sealing, ordering, policies, and every crash and corruption case.

No processes and no network: a fake clock drives linger, and CrashingOps raises a simulated
crash at the pool's named crash points. After a "crash" the pool object is abandoned without
closing (``abandon()`` drops its file lock, as the kernel does for a killed process, and writes
nothing), and a new one opens the same file — as a restarted agent would find it.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import threading
import time

import numpy as np
import pytest

from agent.buffer import (
    BufferPool,
    Chunk,
    PoolBusy,
    PoolDiskTooSmall,
    PoolFormatError,
    PoolGeometryMismatch,
    seams,
)
from agent.buffer import layout as L
from agent.buffer.seams import SimulatedCrash
from agent.buffer.slots import FREE_SETTLE_S
from tests.unit.poolkit import (
    ENOSPC,
    SIZE,
    SLOT,
    CrashingOps,
    FakeClock,
    chunk_of,
    ids_of,
    line,
    values,
)


def open_pool(tmp_path, **kw) -> BufferPool:
    kw.setdefault("linger_ms", 1e9)
    kw.setdefault("sync_on_seal", False)
    return BufferPool(tmp_path / "buffer.pool", kw.pop("size", SIZE), kw.pop("slot", SLOT), **kw)


def slot_header_offset(pool: BufferPool, index: int) -> int:
    return pool.geometry.slot_headers_offset + index * L.SLOT_HEADER_BYTES


def flip_byte(path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


# -- framing and order ---------------------------------------------------------------------------

def test_records_come_back_in_order_with_their_event_times(tmp_path):
    pool = open_pool(tmp_path)
    ts = np.arange(500, dtype=np.int64) + 1_700_000_000_000
    data = b"".join(line(i) + b"\n" for i in range(500))
    chunk = Chunk.from_lines(data, 0)
    chunk = Chunk(chunk.data, chunk.starts, chunk.lengths, ts)
    res = pool.append("app.events", chunk, source=7)
    assert res.complete(chunk) and res.end == len(data)
    pool.seal_all()
    recs = [r for s in pool.sealed() for r in s.records()]
    assert [r[0] for r in recs] == ts.tolist()
    assert ids_of(r[2] for r in recs) == list(range(500))
    seqs = [s.seq for s in pool.sealed()]
    assert seqs == sorted(seqs) and len(seqs) > 1
    first = pool.sealed()[0].meta
    assert first.min_ts == ts[0] and first.topic == "app.events"


def test_keys_are_kept_per_record_including_missing_ones(tmp_path):
    pool = open_pool(tmp_path)
    base = chunk_of(range(6))
    keys = [b"u1", None, b"", b"u4" * 10, None, b"k"]
    pool.append("t", Chunk(base.data, base.starts, base.lengths, 5, keys), source=1)
    pool.seal_all()
    assert [k for s in pool.sealed() for _, k, _ in s.records()] == keys


def test_crlf_and_empty_lines_frame_without_their_terminators(tmp_path):
    pool = open_pool(tmp_path)
    chunk = Chunk.from_lines(b"a\r\n\nb\n\r\nlast-without-newline", 1)
    assert chunk.end == len(b"a\r\n\nb\n\r\n")
    pool.append("t", chunk)
    pool.seal_all()
    assert values(pool) == [b"a", b"", b"b", b""]


def test_topics_fill_separate_slots(tmp_path):
    pool = open_pool(tmp_path)
    pool.append("a", chunk_of(range(0, 10)))
    pool.append("b", chunk_of(range(10, 20)))
    pool.append("a", chunk_of(range(20, 30)))
    pool.seal_all()
    assert ids_of(values(pool, "a")) == list(range(0, 10)) + list(range(20, 30))
    assert ids_of(values(pool, "b")) == list(range(10, 20))


def test_linger_seals_a_slot_once_linger_ms_has_passed(tmp_path):
    clock = FakeClock()
    pool = open_pool(tmp_path, linger_ms=5, clock=clock, seal_when_idle=False)
    pool.append("t", chunk_of(range(3)))
    assert pool.seal_due() == 0 and pool.sealed() == []
    clock.advance_ms(5)
    assert pool.seal_due() == 1
    assert ids_of(values(pool)) == [0, 1, 2]
    pool.take()                                  # the drain took it
    # An append after the linger also seals the old slot first.
    pool.append("t", chunk_of(range(3, 5)))
    clock.advance_ms(6)
    pool.append("t", chunk_of(range(5, 6)))
    assert ids_of(values(pool)) == [0, 1, 2, 3, 4]


def test_an_idle_drain_gets_the_records_at_once_a_busy_one_after_linger(tmp_path):
    clock = FakeClock()
    pool = open_pool(tmp_path, linger_ms=5, clock=clock)
    assert pool.seal_due() == 0                  # nothing to seal
    pool.append("t", chunk_of(range(3)))
    assert pool.seal_due() == 1                  # nothing waits for Kafka: sealed at once
    (first,) = pool.take()
    pool.append("t", chunk_of(range(3, 6)))
    clock.advance_ms(4)
    assert pool.seal_due() == 0                  # the first slot in flight: the rest gather
    clock.advance_ms(1)
    assert pool.seal_due() == 1                  # ... until linger
    pool.append("t", chunk_of(range(6, 8)))
    pool.free(first)
    assert pool.seal_due() == 0                  # the second slot still unacknowledged
    for slot in pool.take():
        pool.free(slot)
    assert pool.seal_due() == 1                  # idle again
    assert ids_of(values(pool)) == [6, 7]


def test_a_reader_that_caught_up_seals_at_once_while_the_drain_keeps_up(tmp_path):
    """Read to the end with a slot in flight: sealed at once (the record does not wait for the
    acknowledgement of the slot before it), up to CAUGHT_UP_IN_FLIGHT slots on their way and
    never while a sealed slot waits to be taken; off, records gather until linger."""
    from agent.buffer.slots import CAUGHT_UP_IN_FLIGHT

    clock = FakeClock()
    pool = open_pool(tmp_path, linger_ms=5, clock=clock)
    pool.append("t", chunk_of(range(1)))
    assert pool.seal_due(caught_up=True) == 1
    pool.take()
    pool.append("t", chunk_of(range(1, 2)))
    assert pool.seal_due() == 0                  # in flight, more may come: gather
    assert pool.seal_due(caught_up=True) == 1    # nothing more this turn: at once
    pool.append("t", chunk_of(range(2, 3)))
    assert pool.seal_due(caught_up=True) == 0    # the slot sealed before is not taken yet
    for _ in range(CAUGHT_UP_IN_FLIGHT - 2):
        pool.take()
        pool.append("t", chunk_of(range(1)))
        assert pool.seal_due(caught_up=True) == 1
    pool.take()
    assert len(pool.sealed()) == CAUGHT_UP_IN_FLIGHT
    pool.append("t", chunk_of(range(1)))
    assert pool.seal_due(caught_up=True) == 0    # enough on their way: gather until linger
    clock.advance_ms(5)
    assert pool.seal_due(caught_up=True) == 1

    (tmp_path / "off").mkdir()
    off = open_pool(tmp_path / "off", linger_ms=5, clock=clock, seal_when_caught_up=False)
    off.append("t", chunk_of(range(1)))
    assert off.seal_due(caught_up=True) == 1     # idle: at once, as before
    off.take()
    off.append("t", chunk_of(range(1, 2)))
    assert off.seal_due(caught_up=True) == 0     # in flight: until linger
    clock.advance_ms(5)
    assert off.seal_due(caught_up=True) == 1


def test_linger_waits_while_a_sealed_slot_waits_for_the_drain(tmp_path):
    clock = FakeClock()
    pool = open_pool(tmp_path, linger_ms=5, clock=clock)
    pool.append("t", chunk_of(range(3)))
    clock.advance_ms(5)
    assert pool.seal_due() == 1                  # nothing waiting: linger seals
    pool.append("t", chunk_of(range(3, 6)))
    clock.advance_ms(50)
    assert pool.seal_due() == 0                  # slot 1 not taken yet: keep filling
    pool.append("t", chunk_of(range(6, 9)))
    assert len(pool.sealed()) == 1
    pool.take()
    assert pool.seal_due() == 1
    assert ids_of(values(pool)) == list(range(9))


def test_a_slot_seals_when_the_next_record_does_not_fit(tmp_path):
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(400)))      # 400 × 57 bytes framed > 4 KiB slots
    sealed = pool.sealed()
    assert len(sealed) >= 4
    assert all(s.meta.used_bytes <= SLOT for s in sealed)
    assert all(SLOT - s.meta.used_bytes < 24 + 16 + 48 for s in sealed)


def test_free_slots_are_handed_out_most_recently_freed_first(tmp_path):
    pool = open_pool(tmp_path)
    for k in range(4):
        pool.append("t", chunk_of(range(k * 10, k * 10 + 10)))
        pool.seal("t")
    slots = pool.sealed()
    pool.free(slots[2])
    pool.free(slots[0])
    pool.append("t", chunk_of(range(100, 101)))
    pool.seal("t")
    assert pool.sealed()[-1].index == slots[0].index
    pool.append("t", chunk_of(range(101, 102)))
    pool.seal("t")
    assert pool.sealed()[-1].index == slots[2].index


def test_more_than_eight_sources_in_one_slot_seal_it_first(tmp_path):
    pool = open_pool(tmp_path)
    for src in range(9):
        pool.append("t", chunk_of([src]), source=src, source_start=100 * src)
    pool.seal_all()
    first, second = pool.sealed()
    assert [p[0] for p in first.meta.positions] == list(range(8))
    assert second.meta.positions == ((8, 800, 800 + len(line(8)) + 1),)


def _starts_by_scan(pool, except_seq=None) -> dict[int, int]:
    """Where each source's oldest bytes begin, from every sealed slot's and fill's
    positions (what ``unacknowledged_starts`` answers from its index)."""
    out: dict[int, int] = {}
    for slot in pool.sealed():
        if slot.seq != except_seq:
            for src, start, _end in slot.meta.positions:
                out[src] = min(start, out.get(src, start))
    for fill in [c.fill for c in pool._closing] + list(pool._current.values()):
        for src, (start, _end) in fill.positions.items():
            out[src] = min(start, out.get(src, start))
    return out


def test_the_oldest_bytes_per_source_follow_seals_frees_spills_and_a_reopen(tmp_path):
    pool = open_pool(tmp_path, spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    offsets = dict.fromkeys(range(12), 0)
    for k in range(30):                         # slots of 1-9 sources each, some sources
        for src in range(k % 12, k % 12 + 1 + k % 9):   # in many slots
            src %= 12
            n = len(line(k)) + 1
            pool.append("t", chunk_of([k]), source=src, source_start=offsets[src])
            offsets[src] += n
        if k % 3:
            pool.seal_all()
    sealed = pool.sealed()
    assert len(sealed) > 20
    for slot in sealed[:6:2]:                   # freed out of order
        pool.free(slot)
    with pool._lock:
        pool._spill_oldest()                    # an in-pool slot replaced by its spilled form
    for seq in [None] + [s.seq for s in pool.sealed()]:
        want = _starts_by_scan(pool, seq)
        assert pool.unacknowledged_starts(seq) == want
        for few in ({0}, {3, 7, 11}, {99}):
            assert pool.unacknowledged_starts(seq, few) == \
                {s: v for s, v in want.items() if s in few}
    pool.seal_all()
    pool.close()
    again = open_pool(tmp_path, spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    assert again.unacknowledged_starts() == _starts_by_scan(again) != {}
    again.close()


# -- recovery ------------------------------------------------------------------------------------

def test_sealed_slots_survive_a_reopen_in_sequence_order(tmp_path):
    pool = open_pool(tmp_path)
    for k in range(5):
        pool.append("t", chunk_of(range(k * 20, k * 20 + 20)), source=1, source_start=k * 820)
        pool.seal("t")
    pool.free(pool.sealed()[1])
    before = [(s.seq, s.topic, list(s.records())) for s in pool.sealed()]
    pool.close()
    again = open_pool(tmp_path)
    assert [(s.seq, s.topic, list(s.records())) for s in again.sealed()] == before
    assert again.recovered_positions() == {1: 5 * 820}
    again.append("t", chunk_of([999]))
    again.seal("t")
    assert again.sealed()[-1].seq == before[-1][0] + 1


def test_a_filling_slot_is_discarded_and_sources_resume_after_the_last_sealed_data(tmp_path):
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(10)), source=3, source_start=0)
    pool.seal("t")
    end_sealed = 10 * 41
    pool.append("t", chunk_of(range(10, 15)), source=3, source_start=end_sealed)   # filling
    del pool                                                   # crash: nothing closed or sealed
    again = open_pool(tmp_path)
    assert ids_of(values(again)) == list(range(10))
    assert again.recovered_positions() == {3: end_sealed}
    assert again.counters["filling_discarded"] == 1
    assert again.stats()["free_slots"] == again.geometry.slot_count - 1


def test_a_torn_header_is_quarantined_and_reported_and_the_rest_replays(tmp_path):
    events = []
    pool = open_pool(tmp_path)
    for k in range(3):
        pool.append("t", chunk_of(range(k * 10, k * 10 + 10)))
        pool.seal("t")
    victim = pool.sealed()[1]
    pool.close()
    # record_count of the middle slot: the header CRC no longer matches.
    flip_byte(tmp_path / "buffer.pool", slot_header_offset(pool, victim.index) + 16)
    again = open_pool(tmp_path, on_drop=events.append)
    assert ids_of(values(again)) == list(range(10)) + list(range(20, 30))
    assert [e.reason for e in events] == ["corrupt"]
    assert events[0].records == -1 and "torn header" in events[0].detail
    assert list((tmp_path / "quarantine").iterdir())[0].stat().st_size == L.SLOT_HEADER_BYTES + SLOT


def test_a_torn_payload_is_quarantined_with_its_record_count(tmp_path):
    events = []
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(10)))
    pool.seal("t")
    slot = pool.sealed()[0]
    pool.close()
    # The second half of the payload never reached the disk: zeros.
    start = pool.geometry.slot_offset(slot.index) + slot.meta.used_bytes // 2
    with open(tmp_path / "buffer.pool", "r+b") as f:
        f.seek(start)
        f.write(b"\0" * (slot.meta.used_bytes // 2))
    again = open_pool(tmp_path, on_drop=events.append)
    assert again.sealed() == []
    assert [(e.reason, e.topic, e.records) for e in events] == [("corrupt", "t", 10)]
    assert "torn payload" in events[0].detail
    assert again.counters["slots_quarantined"] == 1


def test_a_bad_crc_in_the_middle_of_the_pool_spares_the_slots_around_it(tmp_path):
    pool = open_pool(tmp_path)
    for k in range(7):
        pool.append("t", chunk_of(range(k * 10, k * 10 + 10)))
        pool.seal("t")
    middle = pool.sealed()[3]
    pool.close()
    flip_byte(tmp_path / "buffer.pool", pool.geometry.slot_offset(middle.index) + 200)
    again = open_pool(tmp_path)
    assert ids_of(values(again)) == [i for i in range(70) if not 30 <= i < 40]
    assert [s.seq for s in again.sealed()] == [0, 1, 2, 4, 5, 6]
    assert again.drop_events[0].records == 10


def test_a_crash_between_payload_write_and_header_write_discards_the_slot(tmp_path):
    ops = CrashingOps(at="seal:before_header")
    pool = open_pool(tmp_path, ops=ops)
    pool.append("t", chunk_of(range(10)), source=1)
    with pytest.raises(SimulatedCrash):
        pool.seal("t")
    pool.abandon()
    again = open_pool(tmp_path)
    assert again.sealed() == [] and again.recovered_positions() == {}
    assert again.counters["filling_discarded"] == 1 and again.drop_events == []


def test_a_crash_after_the_header_but_before_the_state_byte_finds_the_slot_sealed(tmp_path):
    """The header is written whole (data synced first), then the state byte: a header that
    passes its CRC on a filling slot is that slot's seal, not a former one's (a slot handed
    out gets its fill mark in the header first)."""
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(5)))
    pool.seal("t")
    ops = CrashingOps(at="seal:before_state")
    pool.ops = ops
    pool.append("t", chunk_of(range(5, 10)))
    with pytest.raises(SimulatedCrash):
        pool.seal("t")
    pool.abandon()
    again = open_pool(tmp_path)
    assert ids_of(values(again)) == list(range(10))
    assert again.counters["seal_finished"] == 1
    assert [s.first_record for s in again.sealed()] == [0, 5]
    again.append("t", chunk_of([10]))
    again.seal("t")
    assert [s.seq for s in again.sealed()] == [0, 1, 2]
    assert again.sealed()[-1].first_record == 10


def test_a_listeners_records_in_a_filling_slot_are_kept_at_a_crash(tmp_path):
    """Records appended ``once`` (a listener's: nobody can send them again) in a slot not yet
    sealed when the process dies are sealed at the next open, after every slot found sealed,
    with numbers after theirs; a file's records beside them are left to be read again."""
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(5)), once=True)
    pool.seal("t")
    pool.append("t", chunk_of(range(5, 8)), once=True)
    pool.append("t", chunk_of(range(100, 104)), source=7, source_start=0)   # a file's
    pool.append("t", chunk_of(range(8, 10), ts=2_000), once=True)
    pool.append("u", chunk_of(range(200, 203)), source=8)                  # a file's alone
    pool.abandon()
    again = open_pool(tmp_path)
    assert ids_of(values(again)) == list(range(10))
    kept = again.sealed()[-1]
    assert (kept.seq, kept.first_record, kept.record_count) == (1, 5, 5)
    assert (kept.meta.min_ts, kept.meta.max_ts, kept.meta.positions) == (1_000, 2_000, ())
    assert again.recovered_positions() == {}            # the files' bytes are read again
    assert again.counters["filling_kept"] == 1 and again.counters["filling_discarded"] == 1
    assert again.drop_events == []
    again.abandon()
    third = open_pool(tmp_path)                          # sealed now: kept once, not twice
    assert ids_of(values(third)) == list(range(10)) and third.counters["filling_kept"] == 0
    third.append("t", chunk_of([10]))
    third.seal("t")
    assert third.sealed()[-1].first_record == 10


def test_a_slot_filled_within_an_append_covers_its_own_records_below_what_is_pending(
        tmp_path):
    """A source handing a batch over topic by topic says where the records it has not yet
    appended begin (``pending``): a slot that fills within the append covers its own
    records, never past that; after the append the pending position stays at the lower of
    that and the chunk's end."""
    pool = open_pool(tmp_path, slot=4096)
    chunk = chunk_of(range(300))
    whole = chunk.source_end
    pool.pending(1, 0)
    res = pool.append("t", chunk, source=1, source_start=100, pending=100 + whole)
    assert res.complete(chunk)
    full = pool.sealed()
    assert len(full) >= 2
    spans = [p for s in full for p in s.meta.positions]
    assert spans[0][1] == 100 and [a[2] for a in spans[:-1]] == [b[1] for b in spans[1:]]
    assert all(start < end for _src, start, end in spans)
    pool.seal_all()
    assert pool.sealed()[-1].meta.positions[0][2] == 100 + whole
    pool.append("t", chunk_of(range(300, 400)), source=1, source_start=100 + whole,
                pending=150)                    # another topic's records from 150 on
    pool.seal_all()
    assert max(e for s in pool.sealed() for _src, _a, e in s.meta.positions) == 100 + whole
    assert pool._pending[1] == 150
    pool.close()


def test_kept_slots_are_sealed_in_the_order_they_were_filled(tmp_path):
    """A listener's slot closed but not yet sealed (the sealing thread had not come to it)
    and the one it fills next, both unsealed at the crash: sealed in fill order, though the
    second lies lower in the file (the free list hands out the slot freed last first)."""
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(3)))
    pool.seal("t")
    [first] = pool.take()
    pool.append("t", chunk_of(range(3, 6)), once=True)
    older = pool._current.pop("t").index         # closed; its seal never came
    pool.free(first)
    pool.append("t", chunk_of(range(6, 8)), once=True)
    newer = pool._current["t"].index
    assert newer < older
    pool.abandon()
    again = open_pool(tmp_path)
    assert ids_of(values(again)) == list(range(3, 8))
    assert [s.index for s in again.sealed()] == [older, newer]
    assert [s.first_record for s in again.sealed()] == [3, 6]


def test_kept_blocks_after_a_files_block_are_copied_to_a_free_slot_and_survive_a_crash(
        tmp_path):
    """A file's block before a listener's: the listener's are copied to a free slot (kept
    there first), so a crash at the open's seal keeps them for the next open."""
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(100, 104)), source=7, source_start=0)   # a file's
    pool.append("t", chunk_of(range(5)), once=True)
    pool.append("t", chunk_of(range(5, 8)), once=True)
    pool.abandon()
    with pytest.raises(SimulatedCrash):
        open_pool(tmp_path, ops=CrashingOps(at="seal:before_header"))
    again = open_pool(tmp_path)
    assert ids_of(values(again)) == list(range(8))
    assert again.counters["filling_kept"] == 1 and again.drop_events == []
    assert again.recovered_positions() == {}
    again.close()


def test_kept_blocks_at_the_slots_start_are_sealed_where_they_are(tmp_path):
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(5)), once=True)
    index = pool._current["t"].index
    pool.append("t", chunk_of(range(100, 104)), source=7, source_start=0)   # a file's after
    pool.abandon()
    again = open_pool(tmp_path)
    [kept] = again.sealed()
    assert kept.index == index and ids_of(values(again)) == list(range(5))


def test_a_kept_prefix_torn_or_left_by_a_former_fill_is_not_kept(tmp_path):
    """The kept prefix counts only when its check matches this fill's mark over every byte
    of it: a byte changed (a power loss tore it) or another mark (a former fill's prefix)
    and the slot is discarded as before — never sent half right."""
    for harm in ("payload", "mark"):
        folder = tmp_path / harm
        pool = open_pool(folder)
        pool.append("t", chunk_of(range(5)), once=True)
        index = pool._current["t"].index
        if harm == "payload":
            pool._mm[pool.geometry.slot_offset(index) + 30] ^= 1
        else:
            pool._hdr[index]["first_record"] += 1
        pool.abandon()
        again = open_pool(folder)
        assert again.sealed() == [] and again.counters["filling_discarded"] == 1, harm
        assert again.counters["filling_kept"] == 0


def test_a_slot_handed_out_again_forgets_the_prefix_of_its_former_fill(tmp_path):
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(5)), once=True)
    pool.seal("t")
    pool.free(pool.sealed()[0])
    pool.append("t", chunk_of(range(100, 103)), source=1)     # a file's, in the same slot
    pool.abandon()
    again = open_pool(tmp_path)
    assert again.sealed() == [] and again.counters["filling_kept"] == 0


def test_a_freed_slot_handed_out_again_is_not_taken_for_its_former_seal(tmp_path):
    """A freed slot keeps its former header (only the state byte changes): handed out again
    and the agent killed before anything is written, the header must not pass as sealed."""
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(5)))
    pool.seal("t")
    pool.free(pool.sealed()[0])
    pool._filling_for("t", b"t", None, 0.0)       # handed out; killed before the first write
    pool.abandon()
    again = open_pool(tmp_path)
    assert again.sealed() == [] and again.counters["filling_discarded"] == 1


def test_a_crash_right_after_the_state_byte_keeps_the_slot(tmp_path):
    pool = open_pool(tmp_path, ops=CrashingOps(at="seal:after_state"))
    pool.append("t", chunk_of(range(5)), source=2)
    with pytest.raises(SimulatedCrash):
        pool.seal("t")
    pool.abandon()
    again = open_pool(tmp_path)
    assert ids_of(values(again)) == list(range(5))
    assert again.recovered_positions() == {2: 5 * 41}


@pytest.mark.parametrize("crash", [True, False])
def test_a_crash_during_free_leaves_the_slot_sealed_or_free_never_corrupt(tmp_path, crash):
    pool = open_pool(tmp_path, ops=CrashingOps(at="free:before_state" if crash else None))
    for k in range(2):
        pool.append("t", chunk_of(range(k * 5, k * 5 + 5)))
        pool.seal("t")
    first = pool.sealed()[0]
    if crash:
        with pytest.raises(SimulatedCrash):
            pool.free(first)
    else:
        pool.free(first)
    pool.abandon()                                             # killed right after
    again = open_pool(tmp_path)
    expected = list(range(10)) if crash else list(range(5, 10))   # sent again, or gone
    assert ids_of(values(again)) == expected
    assert again.drop_events == []


def test_sequence_numbers_wrap_around_and_keep_their_order(tmp_path):
    top = (1 << 64) - 3
    pool = open_pool(tmp_path, first_seq=top)
    for k in range(6):
        pool.append("t", chunk_of(range(k * 3, k * 3 + 3)))
        pool.seal("t")
    assert [s.seq for s in pool.sealed()] == [top, top + 1, top + 2, 0, 1, 2]
    pool.free(pool.sealed()[0])
    pool.close()
    again = open_pool(tmp_path)
    assert [s.seq for s in again.sealed()] == [top + 1, top + 2, 0, 1, 2]
    assert ids_of(values(again)) == list(range(3, 18))
    again.append("t", chunk_of([99]))
    again.seal("t")
    assert again.sealed()[-1].seq == 3


def test_a_pool_reopened_with_another_geometry_is_refused_not_reformatted(tmp_path):
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(3)))
    pool.seal("t")
    pool.close()
    with pytest.raises(PoolGeometryMismatch) as info:
        open_pool(tmp_path, slot=2 * SLOT, size=2 * SIZE)
    assert "16 slots of 4096 bytes" in str(info.value)
    assert "buffer.slot_size_bytes" in info.value.hint
    assert ids_of(values(open_pool(tmp_path))) == [0, 1, 2]


def test_a_file_that_is_not_a_pool_is_refused(tmp_path):
    (tmp_path / "buffer.pool").write_bytes(b"some other file" * 1000)
    with pytest.raises(PoolFormatError, match="not a docket buffer pool"):
        open_pool(tmp_path)


def test_a_damaged_file_header_is_refused(tmp_path):
    open_pool(tmp_path).close()
    flip_byte(tmp_path / "buffer.pool", 16)          # slot_bytes
    with pytest.raises(PoolFormatError, match="fails its CRC"):
        open_pool(tmp_path)


def test_a_disk_too_small_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(PoolDiskTooSmall) as info:
        open_pool(tmp_path, ops=CrashingOps(free_bytes=SIZE - 1))
    assert str(SIZE) in str(info.value) and "size_bytes" in info.value.hint
    assert not (tmp_path / "buffer.pool").exists()


def test_a_failed_reservation_removes_the_partial_file(tmp_path):
    with pytest.raises(PoolDiskTooSmall, match="No space left"):
        open_pool(tmp_path, ops=CrashingOps(reserve_errno=ENOSPC))
    assert not (tmp_path / "buffer.pool").exists()


def test_a_slot_size_that_is_not_a_page_multiple_is_refused(tmp_path):
    with pytest.raises(PoolGeometryMismatch, match="multiple of 4096"):
        open_pool(tmp_path, slot=5000)
    with pytest.raises(PoolGeometryMismatch, match="fewer than 2 slots"):
        open_pool(tmp_path, size=SLOT)


# -- one pool per file ---------------------------------------------------------------------------

def test_a_second_pool_on_an_open_pool_file_is_refused_and_changes_nothing(tmp_path):
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(10)), source=1)
    pool.seal("t")
    pool.append("t", chunk_of(range(10, 15)), source=1, source_start=10 * 41)   # filling
    before = (tmp_path / "buffer.pool").read_bytes()
    with pytest.raises(PoolBusy) as info:
        open_pool(tmp_path)
    assert "buffer.pool is in use by another buffer pool" in str(info.value)
    assert "buffer.path" in info.value.hint
    # Not recovered by the second: the filling slot was not discarded, nothing quarantined.
    assert (tmp_path / "buffer.pool").read_bytes() == before
    assert not (tmp_path / "quarantine").exists()
    pool.seal("t")                                   # the first goes on as if alone
    assert ids_of(values(pool)) == list(range(15))
    pool.close()
    again = open_pool(tmp_path)                      # closed: the file is free again
    assert ids_of(values(again)) == list(range(15))
    again.close()


def test_a_pool_file_locked_elsewhere_is_refused_until_the_lock_goes(tmp_path):
    open_pool(tmp_path).close()
    # Another open file holding the lock: what another agent process does.
    fd = os.open(tmp_path / "buffer.pool", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(PoolBusy):
            open_pool(tmp_path)
    finally:
        os.close(fd)                                 # as the kernel does when it dies
    open_pool(tmp_path).close()


def test_abandon_drops_the_lock_and_writes_nothing(tmp_path):
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(10)), source=1)
    pool.seal("t")
    pool.append("t", chunk_of(range(10, 15)), source=1, source_start=10 * 41)   # filling
    before = (tmp_path / "buffer.pool").read_bytes()
    pool.abandon()
    assert (tmp_path / "buffer.pool").read_bytes() == before
    again = open_pool(tmp_path)
    assert ids_of(values(again)) == list(range(10))
    assert again.counters["filling_discarded"] == 1
    again.close()


def test_a_pool_refused_for_its_contents_leaves_the_file_unlocked(tmp_path):
    open_pool(tmp_path).close()
    with pytest.raises(PoolGeometryMismatch) as info:   # `info` keeps the refused pool object
        open_pool(tmp_path, slot=2 * SLOT, size=2 * SIZE)   # alive, through its traceback
    assert "buffer.slot_size_bytes" in info.value.hint
    open_pool(tmp_path).close()


# -- oversized lines -----------------------------------------------------------------------------

def big_line_chunk(pool: BufferPool, factor: float = 2.5) -> tuple[Chunk, bytes]:
    big = bytes(range(32, 127)) * int(pool.max_value_bytes * factor / 95)
    data = line(0) + b"\n" + big + b"\n" + line(2) + b"\n"
    return Chunk.from_lines(data, 9), big


def test_an_oversized_line_is_split_into_consecutive_marked_parts(tmp_path):
    pool = open_pool(tmp_path)
    chunk, big = big_line_chunk(pool)
    res = pool.append("t", chunk)
    pool.seal_all()
    assert res.complete(chunk) and res.split_lines == 1
    parts = [(b.part_index, b.part_count, bytes(b.value(0))) for s in pool.sealed()
             for b in s.blocks() if b.part_count]
    assert [(i, n) for i, n, _ in parts] == [(0, 3), (1, 3), (2, 3)]
    assert b"".join(p for _, _, p in parts) == big
    assert ids_of([values(pool)[0], values(pool)[-1]]) == [0, 2]
    assert pool.counters["oversize_split"] == 1


def test_a_split_record_cut_short_by_a_full_pool_goes_on_from_its_first_part_not_sealed(
        tmp_path):
    """A listener's record longer than a slot, the pool full after two of its three parts:
    the append says so (``parts``), and the next call, given them back, appends the third
    only — each part once, where before the whole record came again."""
    pool = BufferPool(tmp_path / "pool", 8192 + 4 * 4096, 4096, linger_ms=1e9,
                      sync_on_seal=False)
    pool.append("other", chunk_of([900]))            # holds one of the four slots
    big = b"r" * (pool.max_value_bytes * 2 + 100)    # three parts
    chunk = Chunk.from_lines(big + b"\n", 9)
    taken = pool.take()                               # nothing sealed yet
    assert taken == []
    pool.append("t", chunk_of([1]), once=True)        # and one more: two slots left
    pool.seal("t")
    [first] = pool.take()
    res = pool.append("t", chunk, once=True, timeout_s=0.0)
    assert (res.records, res.parts) == (0, 2)
    parts = pool.take()

    def sent(slots) -> list[tuple[int, bytes]]:
        return [(b.part_index, bytes(b.value(0))) for s in slots for b in s.blocks()
                if b.part_count]

    got = sent(parts)
    assert [i for i, _ in got] == [0, 1]
    for s in (first, *parts):
        pool.free(s)
    res = pool.append("t", chunk, once=True, timeout_s=0.0, parts_done=res.parts)
    assert res.complete(chunk)
    pool.seal_all()
    got += sent(pool.take())
    assert [i for i, _ in got] == [0, 1, 2]
    assert b"".join(v for _, v in got) == big
    pool.close()


def test_a_keyed_record_split_by_one_call_is_cut_at_the_same_bytes_by_the_next(tmp_path):
    """The parts of a record are cut by its own key's room, not by the chunk's longest key:
    the call that goes on with it (a chunk without the records before it) cuts it where the
    first did, so the parts join to the record. And a keyed record as long as its limit
    fits an empty slot whole (it waited for room forever before)."""
    pool = BufferPool(tmp_path / "pool", 8192 + 4 * 4096, 4096, linger_ms=1e9,
                      sync_on_seal=False)
    pool.append("other", chunk_of([900]))            # holds one of the four slots
    big = b"r" * 12_144
    chunk = Chunk.of_values([b"x", big], 9, [b"k" * 200, b"q"])
    res = pool.append("t", chunk, once=True, timeout_s=0.0)
    assert (res.records, res.parts) == (1, 2)
    got = [bytes(b.value(0)) for s in pool.take() for b in s.blocks() if b.part_count]
    for s in pool.sealed():
        pool.free(s)
    rest = Chunk.of_values([big], 9, [b"q"])
    res = pool.append("t", rest, once=True, timeout_s=0.0, parts_done=res.parts)
    assert res.complete(rest)
    pool.seal_all()
    got += [bytes(b.value(0)) for s in pool.take() for b in s.blocks() if b.part_count]
    assert b"".join(got) == big
    limit = int(pool._value_limits(rest)[0])
    whole = Chunk.of_values([b"v" * limit], 9, [b"q"])
    assert pool.append("t", whole, timeout_s=0.0).split_lines == 0
    pool.close()


def test_an_oversized_line_can_be_truncated_and_is_counted(tmp_path):
    events = []
    pool = open_pool(tmp_path, oversize="truncate", on_drop=events.append)
    chunk, big = big_line_chunk(pool)
    pool.append("t", chunk)
    pool.seal_all()
    assert values(pool)[1] == big[:pool.max_value_bytes]
    assert len(values(pool)) == 3
    assert [e.reason for e in events] == ["oversize_truncated"]


def test_an_oversized_line_can_be_dropped_and_is_counted(tmp_path):
    events = []
    pool = open_pool(tmp_path, oversize="drop", on_drop=events.append)
    chunk, _ = big_line_chunk(pool)
    res = pool.append("t", chunk)
    pool.seal_all()
    assert res.dropped == 1 and res.complete(chunk)
    assert ids_of(values(pool)) == [0, 2]
    assert [(e.reason, e.records) for e in events] == [("oversize_dropped", 1)]


# -- a full pool ---------------------------------------------------------------------------------

def fill_up(pool: BufferPool) -> int:
    """Append numbered lines until the pool refuses; return how many went in."""
    i = 0
    while True:
        res = pool.append("t", chunk_of(range(i, i + 50)))
        i += res.records
        if res.records < 50:
            return i


def test_a_full_pool_under_block_takes_what_fits_and_says_where_to_resume(tmp_path):
    pool = open_pool(tmp_path)
    taken = fill_up(pool)
    res = pool.append("t", chunk_of(range(taken, taken + 50)), timeout_s=0.05)
    assert res.records == 0 and res.end == 0
    pool.free(pool.sealed()[0])
    res = pool.append("t", chunk_of(range(taken, taken + 50)))
    assert res.records > 0


def test_a_blocked_append_resumes_when_the_drain_frees_a_slot(tmp_path):
    pool = open_pool(tmp_path)
    taken = fill_up(pool)
    first = pool.sealed()[0]
    timer = threading.Timer(0.2, pool.free, args=(first,))
    timer.start()
    res = pool.append("t", chunk_of(range(taken, taken + 50)), timeout_s=30)
    timer.join()
    assert res.records == 50


def test_drop_oldest_drops_the_oldest_sealed_slot_not_in_flight_and_counts_it(tmp_path):
    events = []
    pool = open_pool(tmp_path, on_full="drop_oldest", on_drop=events.append)
    taken = fill_up_drop(pool)
    in_flight = pool.take(1)[0]
    oldest_unleased = pool.sealed()[1]
    res = pool.append("t", chunk_of(range(taken, taken + 150)))   # needs two more slots
    assert res.records == 150
    sealed = pool.sealed()
    assert sealed[0] is in_flight and oldest_unleased not in sealed
    assert events[0].reason == "buffer_full" and events[0].records == oldest_unleased.record_count
    assert f"seq {oldest_unleased.seq} dropped" in events[0].detail
    assert pool.counters["buffer_full_dropped"] == sum(e.records for e in events)
    pool.seal_all()
    kept = ids_of(values(pool))
    assert kept == sorted(kept) and kept[-1] == taken + 149


def fill_up_drop(pool: BufferPool) -> int:
    i = 0
    while pool.stats()["free_slots"] > 0:
        i += pool.append("t", chunk_of(range(i, i + 10))).records
    return i


def test_sealed_slots_spill_to_disk_and_come_back_in_order(tmp_path):
    pool = open_pool(tmp_path, spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    n = 0
    for _ in range(3 * pool.geometry.slot_count):
        n += pool.append("t", chunk_of(range(n, n + 40))).records
    pool.seal_all()
    stats = pool.stats()
    assert stats["spilled_slots"] > 0 and stats["spill_bytes"] > 0
    assert ids_of(values(pool)) == list(range(n))
    pool.close()
    again = open_pool(tmp_path, spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    assert ids_of(values(again)) == list(range(n))
    for slot in again.sealed():
        again.free(slot)
    assert list((tmp_path / "spill").iterdir()) == []


def test_a_corrupt_spill_file_is_quarantined_and_the_rest_replays(tmp_path):
    pool = open_pool(tmp_path, spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    n = 0
    for _ in range(2 * pool.geometry.slot_count):
        n += pool.append("t", chunk_of(range(n, n + 40))).records
    pool.seal_all()
    spilled = sorted((tmp_path / "spill").iterdir())
    pool.close()
    spilled[0].write_bytes(spilled[0].read_bytes()[:-10])
    again = open_pool(tmp_path, spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    assert again.drop_events[0].reason == "corrupt"
    assert (tmp_path / "quarantine" / spilled[0].name).exists()
    got = ids_of(values(again))
    assert got == sorted(got) and len(got) < n



def test_a_spilled_slot_whose_free_a_power_cut_undid_is_not_taken_for_a_loss(tmp_path):
    """A slot is spilled (its file synced), marked free and filled again; a power cut keeps
    its sealed header from before the spill beside the new bytes. The spill file holds its
    records: they are sent from there, once, and the slot is free — not quarantined as a torn
    payload (a false loss: what the code did before)."""
    spill = dict(spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    pool = open_pool(tmp_path, **spill)
    n = pool.append("t", chunk_of(range(40))).records
    pool.seal("t")
    [first] = pool.sealed()
    header = pool._hdr_bytes[first.index].copy()          # as the seal wrote it
    while first.index not in {s.index for s in pool.sealed() if s.seq != first.seq}:
        n += pool.append("t", chunk_of(range(n, n + 40))).records
        pool.seal("t")                                    # spilled, its slot used again
    assert first.seq in {m.seq for m in pool.spill.metas()}
    [reused] = [s for s in pool.sealed() if s.index == first.index]
    # that slot's new seal never reached the disk: its records are read again from the file
    gone = set(ids_of([v for _, _, v in reused.records()]))
    want = [i for i in range(n) if i not in gone]
    pool.abandon()
    raw = np.memmap(tmp_path / "buffer.pool", np.uint8, "r+")
    at = slot_header_offset(pool, first.index)
    raw[at:at + L.SLOT_HEADER_BYTES] = header             # what the disk kept of the header
    raw.flush()
    del raw
    again = open_pool(tmp_path, **spill, quarantine_dir=tmp_path / "q")
    assert again.counters["slots_quarantined"] == 0 and again.counters["spill_freed"] == 1
    assert ids_of(values(again)) == want                  # the spilled slot's records once
    again.close()


def fill_until_spilled(pool: BufferPool) -> tuple[int, int]:
    """Lines of one file (source 1) sealed 40 to a slot until one slot is spilled: (the lines
    written, the file's bytes read)."""
    n = at = 0
    while pool.stats()["spilled_slots"] < 1:
        chunk = chunk_of(range(n, n + 40))
        n += pool.append("t", chunk, source=1, source_start=at).records
        at += chunk.end
        pool.seal("t")
    return n, at


def test_a_spilled_slot_acknowledged_whole_is_not_sent_again_when_its_removal_was_lost(
        tmp_path):
    """A spilled slot is acknowledged and freed: the state database has its file's offset past
    it (the free's barrier) and its spill file is unlinked — a name gone, not yet durable when
    the power goes. The file found again at the next open holds records Kafka has: not sent
    again (they were, every one a duplicate), and the file removed."""
    from agent.state.selfcheck import acknowledged_whole

    spill = dict(spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    pool = open_pool(tmp_path, **spill)
    n, at = fill_until_spilled(pool)
    [path] = (tmp_path / "spill").iterdir()
    kept = path.read_bytes()
    [first] = pool.take(1)
    assert first.index is None                            # the spilled slot, sent first
    [(_, _, end)] = first.meta.positions
    gone = ids_of([v for _, _, v in first.records()])
    pool.free(first)
    assert not path.exists()
    pool.abandon()
    path.write_bytes(kept)                                # its unlink lost with the power
    again = open_pool(tmp_path, **spill, quarantine_dir=tmp_path / "q",
                      delivered=lambda meta: acknowledged_whole(meta.positions, {1: end}))
    got = ids_of(values(again))
    assert gone and not set(gone) & set(got) and got == list(range(gone[-1] + 1, n))
    assert again.counters["acknowledged_freed"] == 1 and not path.exists()
    assert again.drop_events == []
    again.close()


def test_what_delivered_reads_is_made_durable_before_a_free_at_open(tmp_path, monkeypatch):
    """``delivered`` reads acknowledged offsets that, after a SIGKILL, may be commits in the
    page cache only. A spill file removed (or a slot freed) at open on that word must wait for
    the free's barrier, or a power cut during the open keeps the removal without the offsets:
    the bytes are read again, under new numbers. The barrier came after the removal before."""
    from agent.buffer.spill import SpillStore

    spill = dict(spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    pool = open_pool(tmp_path, sync_on_seal=True, **spill)
    n, at = fill_until_spilled(pool)
    pool.abandon()          # killed after the acknowledgement's commit, before its barrier
    events = []
    real = SpillStore.remove
    monkeypatch.setattr(SpillStore, "remove",
                        lambda self, seq: (events.append("unlink"), real(self, seq)))
    again = open_pool(tmp_path, sync_on_seal=True, **spill, quarantine_dir=tmp_path / "q",
                      free_barrier=lambda: events.append("barrier"),
                      delivered=lambda meta: meta.seq == 0)
    assert again.counters["acknowledged_freed"] == 1 and "unlink" in events
    assert events.index("barrier") < events.index("unlink"), events
    again.close()


def test_a_spilled_slot_removed_at_open_keeps_its_number_from_being_given_again(tmp_path):
    """The header's ``next_seq`` is not synced without ``sync_on_seal``; a power cut can take
    it back below a spilled slot's number while the spill file (synced) stays. A spill file
    removed at open as acknowledged must still move the numbering past it: its number was
    given, and the audit's ``counted_seq`` may be past it (a slot under it again would be taken
    for one counted already)."""
    from agent.state.selfcheck import acknowledged_whole

    spill = dict(spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    pool = open_pool(tmp_path, **spill)
    n, at = fill_until_spilled(pool)
    [spilled] = [m.seq for m in pool.spill.metas()]
    highest = max(s.seq for s in pool.sealed())
    pool.abandon()
    raw = np.memmap(tmp_path / "buffer.pool", np.uint8, "r+")
    fh = raw[:L.FILE_HEADER.itemsize].view(L.FILE_HEADER)
    fh[0]["next_seq"] = spilled                          # the header's number as a cut left it
    raw.flush()
    del raw
    # every slot acknowledged: the pool frees them and removes the spill file
    again = open_pool(tmp_path, **spill, quarantine_dir=tmp_path / "q",
                      delivered=lambda meta: acknowledged_whole(meta.positions, {1: at}))
    assert again.sealed() == [] and not list((tmp_path / "spill").iterdir())
    again.append("t", chunk_of(range(n, n + 10)))
    again.seal("t")
    [new] = again.sealed()
    assert new.seq > highest >= spilled, (new.seq, highest, spilled)
    again.close()


@pytest.mark.parametrize("acknowledged", [False, True])
def test_a_torn_spill_file_whose_slot_the_pool_still_holds_is_not_reported_lost(tmp_path,
                                                                                acknowledged):
    """A slot is spilled and marked free; the power goes before the free reaches the disk and
    before the slot is used again, so the pool keeps it sealed and whole. Its spill file is
    found torn: nothing is lost (the slot is sent from the pool, or, acknowledged whole before
    the stop, freed), and no drop is reported — before, the file was reported as a loss of
    unknown size."""
    spill = dict(spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    pool = open_pool(tmp_path, **spill)
    n = pool.append("t", chunk_of(range(40))).records
    pool.seal("t")
    [first] = pool.sealed()
    ids = ids_of([v for _, _, v in first.records()])
    g = pool.geometry
    head_at, body_at = slot_header_offset(pool, first.index), g.slot_offset(first.index)
    raw = np.memmap(tmp_path / "buffer.pool", np.uint8, "r")
    header = raw[head_at:head_at + L.SLOT_HEADER_BYTES].copy()
    body = raw[body_at:body_at + g.slot_bytes].copy()     # the slot as the seal left it
    del raw
    while first.seq not in {m.seq for m in pool.spill.metas()}:
        n += pool.append("t", chunk_of(range(n, n + 40))).records
        pool.seal("t")
    [reused] = [s for s in pool.sealed() if s.index == first.index]
    # that slot's seal never reached the disk: its records are read again from the file
    gone = set(ids_of([v for _, _, v in reused.records()]))
    pool.abandon()
    raw = np.memmap(tmp_path / "buffer.pool", np.uint8, "r+")
    raw[head_at:head_at + L.SLOT_HEADER_BYTES] = header   # what the disk kept of the slot
    raw[body_at:body_at + g.slot_bytes] = body
    raw.flush()
    del raw
    path = tmp_path / "spill" / f"{first.seq:020d}.spill"
    path.write_bytes(path.read_bytes()[:-10])
    again = open_pool(tmp_path, **spill, quarantine_dir=tmp_path / "q",
                      delivered=lambda meta: acknowledged and meta.seq == first.seq)
    got = ids_of(values(again))
    want = [i for i in range(n) if i not in gone and not (acknowledged and i in ids)]
    assert got == want                                    # the first slot's records once
    assert again.counters["acknowledged_freed"] == acknowledged
    assert again.drop_events == [] and again.counters["slots_quarantined"] == 0
    assert (tmp_path / "q" / path.name).exists() and not path.exists()
    again.close()


def test_spill_files_beside_a_pool_made_new_are_set_aside_not_taken_for_its_slots(tmp_path):
    """The pool file moved aside (damaged, or its state lost): a new one numbers its slots
    from 0 again, beside the old pool's spill files. Those are moved to quarantine and
    reported when the new pool is made; the new pool's slots, under the same numbers, are
    its own at every later open (they were freed as the spill files' slots: lost silently)."""
    spill = dict(spill_dir=tmp_path / "spill", spill_max_bytes=1 << 20)
    old = open_pool(tmp_path, **spill)
    n = 0
    while old.stats()["spilled_slots"] < 2:
        n += old.append("t", chunk_of(range(n, n + 40))).records
    old.seal_all()
    old.close()
    (tmp_path / "buffer.pool").unlink()             # moved aside
    new = open_pool(tmp_path, **spill, quarantine_dir=tmp_path / "q")
    assert new.counters["slots_quarantined"] >= 2 and not list((tmp_path / "spill").iterdir())
    assert all(e.reason == "corrupt" for e in new.drop_events)
    assert len(list((tmp_path / "q").iterdir())) == new.counters["slots_quarantined"]
    for k in range(3):
        new.append("t", chunk_of(range(10_000 + 40 * k, 10_040 + 40 * k)))
        new.seal("t")
    assert [s.seq for s in new.sealed()] == [0, 1, 2]
    new.abandon()
    again = open_pool(tmp_path, **spill, quarantine_dir=tmp_path / "q")
    assert ids_of(values(again)) == list(range(10_000, 10_120))
    assert again.counters["spill_freed"] == 0
    again.close()


# -- the sealing thread (``seal_thread``) ------------------------------------------------------

class HeldSyncs(CrashingOps):
    """File ops whose syncs of slot data wait for ``go`` (those of the headers do not), or
    fail with ``fail``; ``synced`` lists the data ranges synced, in order, ``headers`` the
    header syncs' (offset, length)."""

    def __init__(self, data_from: int, fail: OSError | None = None):
        super().__init__()
        self.data_from, self.fail = data_from, fail
        self.go, self.waiting = threading.Event(), threading.Event()
        self.synced: list[int] = []
        self.headers: list[tuple[int, int]] = []

    def msync(self, mm, offset: int, length: int) -> None:
        if offset < self.data_from:
            self.headers.append((offset, length))
        else:
            self.waiting.set()
            assert self.go.wait(10), "the test never let the sync go"
            if self.fail is not None:
                raise self.fail
            self.synced.append(offset)
        super().msync(mm, offset, length)


def threaded_pool(tmp_path, fail: OSError | None = None, **kw) -> tuple[BufferPool, HeldSyncs]:
    probe = open_pool(tmp_path / "probe")
    ops = HeldSyncs(probe.geometry.slot_offset(0), fail)
    probe.close()
    return open_pool(tmp_path, sync_on_seal=True, seal_thread=True, ops=ops, **kw), ops


def until(condition, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "not within 10 s"
        time.sleep(0.01)


def test_the_sealing_thread_seals_in_order_while_appends_go_on(tmp_path):
    """Slots closed while the disk syncs the first are sealed after it, in order: none is
    handed out, nor its numbers called settled or stored, before its data and then its header
    are synced; the appender is not held up meanwhile. A slot sealed on disk is handed to the
    drain by the caller's next call, after ``on_seal`` in the caller's thread: the agent writes
    what ``on_seal`` noted (checkpoints, counts) before its drain can take the slot. (With
    ``on_seal`` on the sealing thread, a slot sealed just after the loop wrote its checkpoints
    was sent, acknowledged and freed before they were written; a SIGKILL then had its bytes
    read again under new record numbers.)"""
    (tmp_path / "probe").mkdir()
    noted: list[tuple[int, str]] = []
    pool, ops = threaded_pool(tmp_path, on_seal=lambda slot: noted.append(
        (slot.seq, threading.current_thread().name)))
    pool.append("t", chunk_of(range(300)), source=1)   # slots close as they fill up
    assert ops.waiting.wait(10)                        # the first one's data sync waits
    closed = len(pool._closing)
    assert closed >= 3
    pool.append("t", chunk_of(range(1000, 1010)))
    assert pool.sealed() == [] and ops.synced == []
    assert pool.next_record == 0 and pool.record_marks()[1] == -1
    assert pool.filling() and pool.stats()["filling_slots"] == closed + 1
    first = pool._closing[0].fill.index
    assert int(pool._hdr[first]["state"]) == L.FILLING
    ops.go.set()
    until(lambda: not pool._unsynced)                 # sealed on disk, not yet collected:
    assert pool.sealed() == [] and pool.take() == []   # the caller's next turn hands them out
    assert noted == []
    pool.seal_due()
    assert [seq for seq, _ in noted] == [s.seq for s in pool.sealed()] == list(range(closed))
    pool.seal_all()
    assert {name for _, name in noted} == {threading.current_thread().name}
    seqs = [s.seq for s in pool.sealed()]
    assert seqs == sorted(seqs) and len(seqs) == pool.stats()["slots_sealed"]
    assert len(seqs) == len(ops.synced) == closed + 1 and ops.synced == sorted(ops.synced)
    # a round seals every slot closed so far, their headers in one sync with the file's: the
    # ones closed before the first sync, then those closed while it waited, then the last
    assert 2 <= len(ops.headers) <= 3 < closed + 1 and all(o == 0 for o, _ in ops.headers)
    last = max(s.index for s in pool.sealed())
    assert max(n for _, n in ops.headers) == \
        pool.geometry.slot_headers_offset + (last + 1) * L.SLOT_HEADER_BYTES
    assert sorted(ids_of(values(pool, "t"))) == list(range(300)) + list(range(1000, 1010))
    assert pool.next_record == pool.stats()["next_record"] == \
        sum(s.record_count for s in pool.sealed())
    assert all(int(pool._hdr[s.index]["state"]) == L.SEALED for s in pool.sealed())
    pool.close()
    again = open_pool(tmp_path)
    assert [s.seq for s in again.sealed()] == seqs
    again.close()


def _pages_mapped(mm, offset: int, length: int) -> int:
    """Pages of ``mm`` in ``[offset, offset + length)`` the process maps now
    (``/proc/self/pagemap``: bit 63 of each page's entry, present)."""
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))   # the export ends at once
    page = mmap.PAGESIZE
    with open("/proc/self/pagemap", "rb") as f:
        f.seek((base + offset) // page * 8)
        raw = f.read(length // page * 8)
    return sum(int.from_bytes(raw[k:k + 8], "little") >> 63 for k in range(0, len(raw), 8))


class UnmapsSeen(HeldSyncs):
    """``HeldSyncs`` noting, per closed slot, its pages mapped before and after the drop of
    its mapping, and when its data sync came."""

    def __init__(self, data_from: int):
        super().__init__(data_from)
        self.order: list[tuple[str, int, int]] = []

    def unmap(self, mm, offset: int, length: int) -> None:
        self.order.append(("mapped", offset, _pages_mapped(mm, offset, length)))
        super().unmap(mm, offset, length)
        self.order.append(("after", offset, _pages_mapped(mm, offset, length)))

    def msync(self, mm, offset: int, length: int) -> None:
        if offset >= self.data_from:
            self.order.append(("sync", offset, 0))
        super().msync(mm, offset, length)


def test_the_sealing_thread_unmaps_a_closed_slot_before_its_sync_and_loses_nothing(tmp_path):
    """Each closed slot's pages leave the agent's mapping before its data is synced (so the
    sync has no page to write-protect and no TLB to flush per page), and nothing of it is
    lost: read back through the mapping after the seal, and from the file after a reopen."""
    probe = open_pool(tmp_path / "probe")
    ops = UnmapsSeen(probe.geometry.slot_offset(0))
    probe.close()
    pool = open_pool(tmp_path, sync_on_seal=True, seal_thread=True, ops=ops)
    pool.append("t", chunk_of(range(300)), source=1)   # slots close as they fill up
    assert ops.waiting.wait(10)
    ops.go.set()
    pool.seal_all()
    sealed = pool.sealed()
    assert len(sealed) >= 4
    for s in sealed:
        at = pool.geometry.slot_offset(s.index)
        mine = [(what, n) for what, o, n in ops.order if o == at]
        assert [what for what, _ in mine] == ["mapped", "after", "sync"], mine
        assert mine[0][1] > 0 and mine[1][1] == 0     # written through the map, then dropped
    assert sorted(ids_of(values(pool, "t"))) == list(range(300))
    seqs = [s.seq for s in sealed]
    pool.close()
    again = open_pool(tmp_path)
    assert [s.seq for s in again.sealed()] == seqs
    assert sorted(ids_of(values(again, "t"))) == list(range(300))
    again.close()


def test_a_dropped_mapping_is_widened_to_the_kernels_pages(monkeypatch):
    """Slots are aligned to 4 KiB; a kernel's page may be 16 or 64 KiB, where madvise refuses
    a start inside a page (EINVAL, raised from the sealing thread to every later call): the
    range is widened to whole pages, never past the map's end."""
    seen = []

    class Map:
        def __len__(self):
            return 80 << 10

        def madvise(self, advice, start, length):
            seen.append((advice, start, length))

    monkeypatch.setattr(mmap, "PAGESIZE", 16 << 10)
    seams.FileOps().unmap(Map(), 12 << 10, 20 << 10)  # 12-32 KiB: pages 0-16 and 16-32
    seams.FileOps().unmap(Map(), 68 << 10, 8 << 10)   # 68-76 KiB: the last page, 64-80
    assert seen == [(mmap.MADV_DONTNEED, 0, 32 << 10), (mmap.MADV_DONTNEED, 64 << 10, 16 << 10)]


def test_a_pool_abandoned_while_its_thread_syncs_keeps_nothing_of_the_closed_slot(tmp_path):
    """Killed while a closed slot's data syncs: its header was never written, so the slot is
    discarded as filling and its record numbers are given again (none reached Kafka)."""
    (tmp_path / "probe").mkdir()
    pool, ops = threaded_pool(tmp_path)
    pool.append("t", chunk_of(range(100)), source=1)   # the first slot closes, full
    assert ops.waiting.wait(10)
    pool.abandon()
    ops.go.set()                                       # the old thread stops where it is
    sealer = pool._sealer
    sealer.join(10)
    assert not sealer.is_alive()
    again = open_pool(tmp_path)
    assert again.sealed() == [] and again.counters["filling_discarded"] == 2
    assert again.next_record == 0
    again.close()


def test_a_sync_that_fails_on_the_sealing_thread_is_raised_to_the_appender(tmp_path):
    (tmp_path / "probe").mkdir()
    pool, ops = threaded_pool(tmp_path, fail=OSError(errno.EIO, "Input/output error"))
    pool.append("t", chunk_of(range(100)), source=1)   # the first slot closes, full
    ops.go.set()
    until(lambda: pool._seal_error is not None)
    with pytest.raises(OSError, match="Input/output error"):
        pool.append("t", chunk_of(range(10, 20)), source=1)
    with pytest.raises(OSError, match="Input/output error"):
        pool.take()
    assert pool.sealed() == [] and pool.next_record == 0
    pool.abandon()


def test_a_reader_that_caught_up_seals_a_lone_slot_itself_at_once(tmp_path):
    """With the sealing thread, a slot sealed early for latency (the reader caught up, no
    other slot closed) is sealed by the caller: handed to the drain when ``seal_due`` returns,
    without the two threads' turns in its latency."""
    (tmp_path / "probe").mkdir()
    pool, ops = threaded_pool(tmp_path)
    ops.go.set()
    pool.append("t", chunk_of(range(10)), source=1)
    assert pool.seal_due(caught_up=True) == 1
    assert [s.record_count for s in pool.sealed()] == [10] and ops.synced
    pool.close()


# -- frees after the acknowledgement is durable ------------------------------------------------
def test_a_freed_slot_is_marked_free_only_after_the_barrier(tmp_path):
    """With ``sync_on_seal`` and a ``free_barrier``, ``free`` keeps the slot's header sealed
    until the barrier ran (at most every ``FREE_SETTLE_S``, or at once when no slot is free):
    the header page may reach the disk any moment after it changes. Without ``sync_on_seal``
    nothing is promised across a power loss and the header is marked at once."""
    clock = FakeClock()
    header_at_barrier = []
    pool = open_pool(tmp_path, sync_on_seal=True, clock=clock,
                     free_barrier=lambda: header_at_barrier.append(
                         [int(pool._hdr[i]["state"]) for i in range(2)]))
    pool.append("t", chunk_of(range(0, 5)))
    pool.seal("t")
    pool.append("t", chunk_of(range(5, 10)))
    pool.seal("t")
    first, second = pool.take()
    pool.free(first)
    pool.free(second)
    assert [int(pool._hdr[s.index]["state"]) for s in (first, second)] == [L.SEALED] * 2
    assert pool.stats()["settling_slots"] == 2 and pool.freeing()
    assert pool.settle_frees() == 2            # the last barrier was long ago
    assert header_at_barrier == [[L.SEALED, L.SEALED]]
    assert [int(pool._hdr[s.index]["state"]) for s in (first, second)] == [L.FREE] * 2
    pool.append("t", chunk_of(range(10, 15)))
    pool.seal("t")
    [third] = pool.take()
    pool.free(third)
    assert pool.settle_frees() == 0 and pool.freeing()     # within FREE_SETTLE_S: waits
    clock.advance_ms(FREE_SETTLE_S * 1000)
    assert pool.settle_frees() == 1 and len(header_at_barrier) == 2
    pool.close()

    quick = open_pool(tmp_path / "off", sync_on_seal=False, free_barrier=lambda: 1 / 0)
    quick.append("t", chunk_of(range(5)))
    quick.seal("t")
    [slot] = quick.take()
    quick.free(slot)
    assert int(quick._hdr[slot.index]["state"]) == L.FREE and not quick.freeing()
    quick.close()


def test_a_full_pool_runs_the_barrier_at_once_for_room(tmp_path):
    clock = FakeClock()
    barriers = []
    pool = open_pool(tmp_path, sync_on_seal=True, clock=clock,
                     free_barrier=lambda: barriers.append(clock.now))
    for k in range(pool.geometry.slot_count):
        pool.append("t", chunk_of(range(k * 5, k * 5 + 5)))
        pool.seal("t")
    slots = pool.take()
    pool.settle_frees(force=True)                 # nothing freed: no barrier
    for slot in slots:
        pool.free(slot)
    assert pool.settle_frees() == len(slots) and len(barriers) == 1
    for k in range(pool.geometry.slot_count):     # every slot used again
        pool.append("t", chunk_of(range(1000 + k * 5, 1000 + k * 5 + 5)))
        pool.seal("t")
    for slot in pool.take():
        pool.free(slot)
    pool.append("t", chunk_of(range(2000, 2005)), timeout_s=0)   # no slot free but settling
    assert len(barriers) == 2 and pool.stats()["filling_records"] == 5
    pool.close()


def test_a_slots_acknowledged_prefix_survives_a_crash_and_is_zero_when_the_slot_is_used_again(
        tmp_path):
    """``note_acked`` keeps in a sealed slot's header how many records from its first on Kafka
    acknowledged; a pool opened after a crash hands the slot over with it (``acked_before``).
    It only grows, is ignored for a slot freed (or sealed again since), and a slot handed out
    again starts from zero: a header can never say more than its own records' fate."""
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(0, 40)))
    pool.seal("t")
    pool.append("t", chunk_of(range(40, 60)))
    pool.seal("t")
    first, second = pool.take()
    pool.note_acked(first, 25)
    pool.note_acked(first, 12)                       # an older figure: never goes back
    pool.note_acked(second, 500)                     # capped at the slot's records
    pool.abandon()                                   # a crash: the page cache keeps the header
    again = open_pool(tmp_path)
    first, second = sorted(again.take(), key=lambda s: s.seq)
    assert (first.acked_before, second.acked_before) == (25, 20)
    again.free(second)
    again.note_acked(second, 10)                     # freed: nothing written
    assert L.acked_of(again._hdr_bytes[second.index], 20) == 20
    again.append("t", chunk_of(range(60, 70)))     # the freed slot is filling again ...
    assert L.acked_of(again._hdr_bytes[second.index], 10) == 0
    again.seal("t")
    [third] = again.take()
    assert third.index == second.index and third.acked_before == 0
    again.note_acked(second, 5)                      # the old send's figure: not this slot's
    again.abandon()
    last = open_pool(tmp_path)
    assert sorted((s.record_count, s.acked_before) for s in last.take()) == [(10, 0), (40, 25)]
    last.close()


def stamp_version(path, version: int) -> None:
    """Write ``version`` into the pool file's header (its CRC with it), as an agent of that
    version left it."""
    with open(path, "r+b") as f:
        header = np.frombuffer(f.read(L.FILE_HEADER.itemsize), L.FILE_HEADER).copy()
        header[0]["version"] = version
        header[0]["geometry_crc"] = L.geometry_crc(header)
        f.seek(0)
        f.write(header.tobytes())


def test_a_version_2_pool_is_upgraded_in_place_its_slots_kept_and_their_acked_bytes_zeroed(
        tmp_path):
    """Version 2 had padding where ``acked`` is; an agent of version 2 neither clears nor
    reads it, so a version 3 pool is refused by it (never a slot sealed beside a stale prefix),
    and a version 2 pool is upgraded: its sealed slots kept, every ``acked`` zeroed first."""
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(0, 20)))
    pool.seal("t")
    [slot] = pool.take()
    pool.note_acked(slot, 15)
    pool.abandon()
    path = tmp_path / "buffer.pool"
    stamp_version(path, 2)                           # as a version 2 agent left it
    again = open_pool(tmp_path)
    [kept] = again.take()
    assert (kept.record_count, kept.acked_before) == (20, 0)
    again.close()
    raw = np.fromfile(path, np.uint8, L.FILE_HEADER.itemsize).view(L.FILE_HEADER)
    assert int(raw[0]["version"]) == L.VERSION == 5


def test_a_version_3_pool_is_upgraded_and_its_filling_slots_are_not_taken_for_sealed(tmp_path):
    """Version 3 agents handed a slot out without the fill's mark: a slot freed and handed
    out again kept its former seal's header whole. Upgraded, its sealed slots are kept and its
    filling ones discarded as version 3 did — never sent again as if sealed."""
    pool = open_pool(tmp_path)
    pool.append("t", chunk_of(range(5)))
    pool.seal("t")
    pool.append("t", chunk_of(range(5, 8)))
    pool.seal("t")
    old, _ = pool.take()
    pool.free(old)
    path = tmp_path / "buffer.pool"
    pool._hdr[old.index]["state"] = L.FILLING    # as a version 3 agent hands it out again:
    pool.abandon()                               # its former header left as it was
    stamp_version(path, 3)
    again = open_pool(tmp_path)
    assert ids_of(values(again)) == [5, 6, 7]
    assert again.counters["filling_discarded"] == 1 and again.counters["seal_finished"] == 0
    again.close()
    raw = np.fromfile(path, np.uint8, L.FILE_HEADER.itemsize).view(L.FILE_HEADER)
    assert int(raw[0]["version"]) == L.VERSION == 5


def test_the_first_parts_of_a_split_line_are_not_taken_for_acknowledged_at_the_next_open(
        tmp_path):
    """A line longer than a slot is split into parts, a slot each; the parts before the last
    cover no byte of the file past the line's start (the checkpoint must not pass the line), so
    their span is empty. With nothing of the line acknowledged (the file's acknowledged offset
    at the line's start), a crash before they were sent must leave them to be sent — not freed
    as acknowledged (they would be lost: the file is read on after the line)."""
    from agent.state.selfcheck import acknowledged_whole

    geometry = dict(linger_ms=1e9, sync_on_seal=False)
    pool = BufferPool(tmp_path / "pool", 8192 + 16 * 4096, 4096, **geometry)
    pool.append("t", Chunk.from_lines(b"x" * 10_000 + b"\nafter\n", 1), source=1,
                source_start=500)
    pool.seal_all()
    sealed = [s.meta.positions for s in pool.sealed()]
    assert len(sealed) >= 3 and sealed[0] == ((1, 500, 500),), sealed
    pool.abandon()
    again = BufferPool(tmp_path / "pool", 8192 + 16 * 4096, 4096, **geometry,
                       delivered=lambda meta: acknowledged_whole(meta.positions, {1: 500}))
    assert [s.meta.positions for s in again.sealed()] == sealed
    assert again.counters["acknowledged_freed"] == 0
    again.close()
    # Acknowledged past the line's start (every part was): the parts are freed unsent.
    last = BufferPool(tmp_path / "pool", 8192 + 16 * 4096, 4096, **geometry,
                      delivered=lambda meta: acknowledged_whole(meta.positions, {1: 10_507}))
    assert last.sealed() == [] and last.counters["acknowledged_freed"] == len(sealed)
    last.close()


def test_a_source_in_two_filling_slots_seals_no_checkpoint_past_the_other(tmp_path):
    """A source whose records go to two topics (routing by field) has them in two filling
    slots: sealing one must not put the source's sealed end past the first record the other
    still holds, or a crash that takes the other skips its records. After the kill, the pool
    says to read again from that record."""
    pool = BufferPool(tmp_path / "pool", 8192 + 16 * 4096, 4096, linger_ms=1e9,
                      sync_on_seal=False)
    x = Chunk.of_values([b"x0", b"x1"], 1, at=[0, 20], at_end=30)     # records at 0 and 20
    y = Chunk.of_values([b"y0"], 1, at=[0], at_end=10)                 # the record at 10
    pool.append("X", x, source=7, source_start=0)
    pool.append("Y", y, source=7, source_start=10)
    pool.seal("X")
    [sealed] = pool.sealed()
    assert sealed.meta.positions == ((7, 0, 10),)    # not (7, 0, 30): 10-20 is in Y's slot
    pool.abandon()                                   # Y's filling slot lost with the kill
    again = BufferPool(tmp_path / "pool", 8192 + 16 * 4096, 4096, linger_ms=1e9,
                       sync_on_seal=False)
    assert again.recovered_positions() == {7: 10}
    again.close()
    # Records of the source not in any slot yet (the other topic's turn comes next): a slot
    # sealed meanwhile ends at or below where they begin.
    held = BufferPool(tmp_path / "held", 8192 + 16 * 4096, 4096, linger_ms=1e9,
                      sync_on_seal=False)
    held.pending(7, 0)
    held.append("X", x, source=7, source_start=0)
    held.seal("X")
    held.append("Y", y, source=7, source_start=10)
    held.pending(7, None)
    held.seal("Y")
    # The last slot of the source to close, none other filling, ends where X read to: every
    # byte below 30 is in X or Y, and X is sealed before it (not 20: 20-30 read again).
    assert [s.meta.positions for s in held.sealed()] == [((7, 0, 0),), ((7, 10, 30),)]
    held.close()
    # Alone, a slot's positions are its own.
    alone = BufferPool(tmp_path / "alone", 8192 + 16 * 4096, 4096, linger_ms=1e9,
                       sync_on_seal=False)
    alone.append("X", x, source=7, source_start=0)
    alone.seal("X")
    assert alone.sealed()[0].meta.positions == ((7, 0, 30),)
    alone.close()
