"""Slots that hold the lines of many files: a slot of 64 KiB or more keeps the positions of up
to ``MAX_SOURCES`` sources (pool format version 5), the header's last entry naming one of two
pages at the slot's end, written in turn; smaller slots keep eight, in the header alone."""

from __future__ import annotations

import random

import numpy as np
import pytest

from agent.buffer import BufferPool, Chunk
from agent.buffer import layout as L
from agent.buffer.inspect import inspect_pool
from agent.buffer.seams import SimulatedCrash
from tests.unit.powercut import CutNow, PowerCutOps
from tests.unit.tailkit import FakeClock

SLOT = 64 << 10
SIZE = 4096 + 16 * 4096 + 8 * SLOT


def line(src: int, i: int = 0) -> bytes:
    return b"source %04d line %04d\n" % (src, i)


def open_pool(path, **kw) -> BufferPool:
    kw.setdefault("linger_ms", 1e9)
    kw.setdefault("sync_on_seal", False)
    return BufferPool(path, kw.pop("size", SIZE), kw.pop("slot", SLOT), **kw)


def append(pool: BufferPool, src: int, i: int = 0) -> None:
    data = line(src, i)
    res = pool.append("t", Chunk.from_lines(data, 1), source=src, source_start=i * len(data))
    assert res.records == 1


@pytest.mark.parametrize("sealing", [{}, {"sync_on_seal": True, "seal_thread": True}],
                         ids=["at once", "sealing thread"])
def test_a_slot_holds_the_lines_of_a_hundred_files_and_a_start_finds_every_position(tmp_path,
                                                                                    sealing):
    pool = open_pool(tmp_path / "pool", **sealing)
    for i in range(2):
        for src in range(1, 101):
            append(pool, src, i)
    pool.seal_all()
    [slot] = pool.sealed()
    width = len(line(0))
    want = tuple((src, 0, 2 * width) for src in range(1, 101))
    assert slot.meta.positions == want and slot.record_count == 200
    entry = pool._hdr[slot.index]["positions"][L.MAX_POSITIONS - 1]
    assert int(entry[0]) == L.EXT_TAG
    pool.abandon()
    again = open_pool(tmp_path / "pool")
    [found] = again.sealed()
    assert found.meta.positions == want and again.counters["slots_quarantined"] == 0
    assert again.recovered_positions() == {src: 2 * width for src in range(1, 101)}
    again.close()
    [seen] = inspect_pool(tmp_path / "pool").sealed
    assert seen.meta.positions == want


def test_the_source_past_the_bound_seals_the_slot_and_small_slots_keep_eight(tmp_path):
    pool = open_pool(tmp_path / "big")
    for src in range(1, L.MAX_SOURCES + 2):
        append(pool, src)
    assert [len(s.meta.positions) for s in pool.sealed()] == [L.MAX_SOURCES]
    pool.close()
    small = open_pool(tmp_path / "small", size=4096 + 4096 + 16 * 4096, slot=4096)
    assert small.geometry.max_sources == L.MAX_POSITIONS
    assert small.geometry.payload_bytes == 4096
    for src in range(1, 10):
        append(small, src)
    assert [len(s.meta.positions) for s in small.sealed()] == [8]
    small.close()


def test_blocks_stop_before_the_positions_pages(tmp_path):
    """A slot's blocks never reach its last two pages: the positions written there at a seal
    cannot overwrite a record."""
    pool = open_pool(tmp_path / "pool")
    data = b"".join(b"%07d %s\n" % (i, b"x" * 200) for i in range(2000))
    pool.append("t", Chunk.from_lines(data, 1), source=1, source_start=0)
    pool.seal_all()
    slots = pool.sealed()
    assert len(slots) > 1
    assert max(s.meta.used_bytes for s in slots) <= SLOT - L.EXT_BYTES
    assert sum(s.record_count for s in slots) == 2000
    pool.close()


def test_a_header_whose_page_fails_its_check_is_not_taken(tmp_path):
    pool = open_pool(tmp_path / "pool")
    for src in range(1, 21):
        append(pool, src)
    pool.seal("t")
    [slot] = pool.sealed()
    area = int(pool._hdr[slot.index]["positions"][L.MAX_POSITIONS - 1][1])
    at = pool.geometry.ext_offset(slot.index, area)
    pool._mm[at + 5] ^= 0xFF                     # a byte of the page changed
    pool.abandon()
    again = open_pool(tmp_path / "pool", quarantine_dir=tmp_path / "q")
    assert again.sealed() == [] and again.counters["slots_quarantined"] == 1
    again.close()


def test_a_slot_used_again_writes_the_page_its_last_header_did_not_name(tmp_path):
    """The page each slot's header named last is read at open: the next header of that slot
    names the other one, so that a header a start could still find (a free that did not
    reach the disk) keeps its page."""
    pool = open_pool(tmp_path / "pool", size=4096 + 4096 + 2 * SLOT)
    for src in range(1, 21):
        append(pool, src)
    pool.seal("t")
    [first] = pool.sealed()
    named = int(pool._hdr[first.index]["positions"][L.MAX_POSITIONS - 1][1])
    pool.abandon()
    again = open_pool(tmp_path / "pool", size=4096 + 4096 + 2 * SLOT)
    [slot] = again.take()
    again.free(slot)
    again.settle_frees()
    for round_ in range(3):                      # both slots used again, in turn
        for src in range(1, 21):
            append(again, src, round_ + 1)
        again.seal("t")
        for s in again.take():
            if s.index == first.index:
                now = int(again._hdr[s.index]["positions"][L.MAX_POSITIONS - 1][1])
                assert now != named
                named = now
            again.free(s)
        again.settle_frees()
    again.close()


def test_a_version_4_pool_is_upgraded_in_place_and_its_slots_kept(tmp_path):
    path = tmp_path / "pool"
    pool = open_pool(path)
    for src in range(1, 6):
        append(pool, src)
    pool.seal("t")
    pool.abandon()
    with open(path, "r+b") as f:                 # as an agent of version 4 left it
        header = np.frombuffer(f.read(L.FILE_HEADER.itemsize), L.FILE_HEADER).copy()
        header[0]["version"] = 4
        header[0]["geometry_crc"] = L.geometry_crc(header)
        f.seek(0)
        f.write(header.tobytes())
    again = open_pool(path)
    [slot] = again.sealed()
    assert [p[0] for p in slot.meta.positions] == [1, 2, 3, 4, 5]
    again.close()
    raw = np.fromfile(path, np.uint8, L.FILE_HEADER.itemsize).view(L.FILE_HEADER)
    assert int(raw[0]["version"]) == L.VERSION == 5


@pytest.mark.parametrize("seed", range(60))
def test_a_power_cut_while_a_slot_of_many_files_is_shown_keeps_a_whole_header(tmp_path, seed):
    """A slot sent while it fills shows its header again at every turn, each time naming the
    other positions page: a cut inside any of its syncs (the page and data synced, the header
    not) or between them leaves the header of the show before, whose page is intact — every
    source it named found, the slot never taken for damaged. (With one page written over
    again, the cut after a page's sync and before its header's leaves the old header naming
    new bytes: the slot was quarantined, its records journalled as lost.)"""
    rnd = random.Random(seed)
    init = tmp_path / "init"
    open_pool(init).close()
    image = init.read_bytes()
    (tmp_path / "pool").write_bytes(image)
    ops = PowerCutOps(rnd, image)
    pool = open_pool(tmp_path / "pool", sync_on_seal=True, send_filling=True,
                     seal_every_ms=1e9, clock=FakeClock(), ops=ops)
    ops.header_zone, ops.mm = pool.geometry.slot_offset(0), pool._map._mmap
    ops.cut_in_msync = rnd.randint(18, 119)     # two a show: once more than 8 files
    shown: list[tuple] = []                      # the positions of each show that returned
    showing = None                               # ... and of the show under way
    lines = dict.fromkeys(range(1, 61), 0)
    try:
        for src in range(1, 61):
            for s in (src, rnd.randint(1, src)):     # a new file, and one read before
                append(pool, s, lines[s])
                lines[s] += 1
            pool.seal_due(caught_up=True)
            showing = tuple((s, a, b) for s, (a, b) in pool._current["t"].positions.items())
            taken = pool.take_filling()
            if taken is not None:
                fill, view = taken
            else:
                view = pool.show_filling(fill)
            assert view.meta.positions == showing
            shown.append(showing)
        image = ops.image()
        showing = None
    except CutNow as now:
        image = now.image
    pool.abandon()
    (tmp_path / "after").write_bytes(image)
    again = open_pool(tmp_path / "after", sync_on_seal=True, quarantine_dir=tmp_path / "q")
    assert again.counters["slots_quarantined"] == 0
    found = [s.meta.positions for s in again.sealed()]
    # the last show that returned, or the one under way at the cut
    assert found in ([shown[-1]] if shown else [], [showing])
    if showing is not None:                      # cut: while the pages were in play
        assert len(shown[-1]) > L.MAX_POSITIONS
    again.close()


class Durable(PowerCutOps):
    """The model's file ops (``durable``: what the syncs made durable, the file after a power
    cut that wrote nothing back; ``cut_in_msync``: syncs let through before a kill or a cut),
    whose ``fail_at``-th sync from now fails (EIO)."""

    def __init__(self, durable: bytes):
        super().__init__(random.Random(0), durable)
        self.fail_at = 0

    def msync(self, mm, offset: int, length: int) -> None:
        if self.fail_at:
            self.fail_at -= 1
            if not self.fail_at:
                raise OSError(5, "EIO")
        super().msync(mm, offset, length)


def fill_all(pool: BufferPool, sources, i: int) -> None:
    for src in sources:
        append(pool, src, i)


def test_a_kill_before_a_header_sync_then_a_cut_in_the_next_use_keeps_the_header(tmp_path):
    """Killed after a seal wrote its header and before it synced it, the agent's next open
    reads that header (the page cache's), the disk holding the one before, naming the other
    page. Its open makes the headers it read durable: used again, the slot writes the page
    neither names, and a power cut before that seal's header sync finds a whole header
    (without it, the header on the disk named the page just written over: quarantined, a
    false loss)."""
    path, small = tmp_path / "pool", dict(size=4096 + 4096 + 2 * SLOT, sync_on_seal=True)
    open_pool(path, **small).close()
    ops = Durable(path.read_bytes())
    pool = open_pool(path, ops=ops, **small)
    fill_all(pool, range(1, 21), 0)
    pool.seal("t")                               # its header names page 0, synced
    [slot] = pool.take()
    pool.free(slot)
    fill_all(pool, range(1, 21), 1)
    ops.cut_in_msync = 1                         # the data synced, the headers' sync: killed
    with pytest.raises(SimulatedCrash):
        pool.seal("t")
    pool.abandon()
    ops = Durable(bytes(ops.durable))            # the page cache as it was, the disk apart
    again = open_pool(path, ops=ops, **small)
    [slot] = again.take()
    again.free(slot)
    fill_all(again, range(1, 21), 2)
    ops.cut_in_msync = 1                         # a power cut before the header's sync
    with pytest.raises(SimulatedCrash):
        again.seal("t")
    again.abandon()
    (tmp_path / "after").write_bytes(bytes(ops.durable))
    found = open_pool(tmp_path / "after", quarantine_dir=tmp_path / "q", **small,
                      delivered=lambda meta: True)
    assert found.counters["slots_quarantined"] == 0 and found.drop_events == []
    found.close()


def test_a_show_whose_sync_failed_does_not_turn_the_next_to_the_page_on_the_disk(tmp_path):
    """A show whose data sync fails (EIO) wrote no header: the slot's header on the disk still
    names the page before. The next show writes the other page again, not that one, so a cut
    before its header's sync finds the header before whole (turned at the failed show, the
    next one wrote over the page the disk's header names: quarantined)."""
    path = tmp_path / "pool"
    opts = dict(sync_on_seal=True, send_filling=True, seal_every_ms=1e9, clock=FakeClock())
    open_pool(path).close()
    ops = Durable(path.read_bytes())
    pool = open_pool(path, ops=ops, **opts)
    fill_all(pool, range(1, 21), 0)
    pool.seal_due(caught_up=True)
    fill, first = pool.take_filling()
    assert len(first.meta.positions) == 20       # shown: its header names a page, synced
    append(pool, 15, 1)                          # a file the page holds grows
    ops.fail_at = 1
    with pytest.raises(OSError):
        pool.show_filling(fill)
    append(pool, 16, 1)
    ops.cut_in_msync = 1                         # the page and data synced, the header not
    with pytest.raises(SimulatedCrash):
        pool.show_filling(fill)
    pool.abandon()
    (tmp_path / "after").write_bytes(bytes(ops.durable))
    found = open_pool(tmp_path / "after", quarantine_dir=tmp_path / "q", sync_on_seal=True)
    assert found.counters["slots_quarantined"] == 0
    assert [s.meta.positions for s in found.sealed()] == [first.meta.positions]
    found.close()
