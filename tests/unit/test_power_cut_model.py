"""The pool and the state database through power cuts (``powercut.py``): a run of appends,
seals, checkpoints, acknowledgements and frees in the agent's order, cut at random moments —
between steps and inside an msync — and started again as the agent starts (recovery, the
acknowledged slots freed, the sealed offsets rewound to what survives, reading resumed at the
rewound offset). After every cut:

- no silent loss: every line before the offset reading resumes at was acknowledged before the
  cut or is in a slot the pool recovered;
- one number per line: a line acknowledged before the cut that a recovered slot holds again
  holds it under the same record number, and no record number ever stands for two lines;
- with ``sync_on_seal``, every slot whose seal returned before the cut is recovered whole
  unless it was acknowledged.

- nothing skipped unsent: a recovered slot's acknowledged prefix (``acked_before``, what a
  send of it leaves out) holds only records Kafka acknowledged before the cut, each under the
  number it holds.

Each send path as the pool sees it: the Python path acknowledges a slot whole; the native
path (``agent/drain/native.py``) also keeps a growing acknowledged prefix in a slot's header
(``BufferPool.note_acked``) while the rest of the slot is in flight, and a start sends a
recovered slot from that prefix on; and it sends the lone filling slot while it fills
(``send_filling``): each time the pool *shows* it (its records so far sealed in its header)
and some of them are acknowledged — a shown slot must survive as a sealed one does. 500
cuts for each of ``sync_on_seal`` on and off and each send path. Off, the first rule, the
last and one number per line hold: a slot not synced may be lost and its lines read again
under new numbers (the run prints how many: what ``sync_on_seal = false`` gives up,
docs/buffer.md), but the numbers it had — the pool's header that counted them not synced
either — are never given to other lines: every start is taken for a host started again and
goes on past the durable reservation (``agent/state/numbers.py``), kept through the cuts.
The model covers the pool file and the database; the producer client, the sources and the
application's own file are the simulation's and the integration tests'
(``test_agent_cut_back.py`` for a log cut back).
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from agent.buffer import BufferPool, Chunk
from agent.buffer.slots import CAUGHT_UP_IN_FLIGHT
from agent.state.checkpoints import Checkpoints
from agent.state.db import StateDB
from agent.state.numbers import NumberReserve
from agent.state.selfcheck import acknowledged_whole, rewind_uncovered
from tests.unit.powercut import CutNow, DbSnapshots, PowerCutOps
from tests.unit.tailkit import FakeClock

LINE = 64
SLOT = 16 << 10
SLOTS = 24
CUTS = 500
TOPIC = "t"


def line(i: int) -> bytes:
    return (b"%09d " % i).ljust(LINE - 1, b"x") + b"\n"


def id_of(value: bytes) -> int:
    return int(value[:9])


class Run:
    """One host's agent, as far as the pool and the database go, on a virtual log of numbered
    lines (line ``i`` at bytes ``[i * LINE, (i + 1) * LINE)``)."""

    def __init__(self, folder: Path, rnd: random.Random, sync_on_seal: bool, native: bool,
                 reserve: bool = True):
        self.folder, self.rnd, self.sync, self.native = folder, rnd, sync_on_seal, native
        # Off, the agent keeps a durable bound past every number given (``NumberReserve``);
        # ``reserve=False`` runs the pool without it, as before it was made.
        self.reserving = reserve and not sync_on_seal
        self.unused = 0                          # numbers a start skipped (never given)
        self.clock = FakeClock()
        self.acked: dict[int, int] = {}          # line → the record number it was acked under
        self.delivered: set[tuple[int, int]] = set()     # (line, record number) acknowledged
        self.prefix: dict[int, int] = {}         # slot seq → records acknowledged from the first
        self.skipped = 0                         # records a start left out: acknowledged prefixes
        self.owner: dict[int, int] = {}          # record number → the line it stood for
        self.sealed_returned: dict[int, list[int]] = {}   # slot seq → lines (seal returned)
        self.cuts = 0
        self.shows = 0                           # a slot sent while it fills, shown
        self.cut_while_shown = 0                 # ... and cut before its seal
        self.renumbered = 0                      # lines delivered under a second number
        self.clashes = 0                         # numbers delivered for a second line
        self.live: Path | None = None
        folder.mkdir(parents=True)
        db = StateDB(folder / "state.db", clock=self.clock)
        self.sid = db.add_file(0, 1, 1, b"", "/virtual/app.log")
        db.sync_log()
        db.close()
        BufferPool(folder / "pool", SLOTS * SLOT, SLOT, clock=self.clock).close()
        self._start((folder / "pool").read_bytes(), None)

    # -- starting, as the agent does -------------------------------------------------------------
    def _start(self, pool_image: bytes, db_files: dict | None) -> None:
        live = self.folder / f"live{self.cuts}"
        live.mkdir()
        (live / "pool").write_bytes(pool_image)
        if self.live is not None and (self.live / "record-numbers").exists():
            shutil.copy(self.live / "record-numbers", live)    # written whole, fsync'ed
        self.live = live
        if db_files is None:
            for name in ("state.db", "state.db-wal"):
                if (self.folder / name).exists():
                    shutil.copy(self.folder / name, live / name)
        else:
            DbSnapshots.write(live, db_files)
        self.db = StateDB(live / "state.db", clock=self.clock)
        self.snaps = DbSnapshots(live / "state.db")
        self.ops = PowerCutOps(self.rnd, pool_image)
        acked = {r["source_id"]: r["acked_offset"] for r in self.db.all_files()}
        inc, next_record = self.db.identity()
        # Every start follows a power cut: the host started again, under a new boot id.
        self.reserve = NumberReserve(live / "record-numbers", inc, f"boot-{self.cuts}") \
            if self.reserving else None
        self.checkpoints = Checkpoints(self.db, lambda: self.clock.monotonic_ns() / 1e9,
                                       3_600_000)
        self.pool = BufferPool(live / "pool", SLOTS * SLOT, SLOT, linger_ms=1e9,
                               send_filling=self.native, seal_every_ms=1e9,
                               sync_on_seal=self.sync, clock=self.clock, ops=self.ops,
                               first_record=next_record, free_barrier=self._barrier,
                               delivered=lambda meta: acknowledged_whole(meta.positions, acked),
                               quarantine_dir=live / "quarantine",
                               on_seal=self.checkpoints.sealed,
                               reserve_records=self.reserve and self.reserve.cover,
                               numbers_found=self.reserve and self._numbers_found)
        self.ops.header_zone = self.pool.geometry.slot_offset(0)
        self.ops.mm = self.pool._map._mmap        # its unsynced pages too (no msync off)
        recovered = self.pool.recovered_positions()
        self.db.advance_sealed(recovered, next_record=self.pool.next_record)
        recovered.update(rewind_uncovered(self.db, self.pool.sealed()))
        self.checkpoints.recovered(self.pool.sealed())
        self.prefix = {s.seq: s.acked_before for s in self.pool.sealed()}
        self.fill = None                         # the slot sent while it fills, taken
        row = self.db.get(self.sid)
        self.offset = max(row["sealed_offset"], recovered.get(self.sid, 0))
        self._check_after_cut(row)

    def _numbers_found(self, found: int) -> int:
        """As ``Agent._numbers_found``: past the reservation, the numbers skipped counted."""
        def skipped(numbers: tuple[int, int]) -> bool:
            self.unused += numbers[1] - numbers[0] + 1
            return True                          # journalled (fsync'ed)
        return self.reserve.start(found, skipped)

    def _barrier(self) -> None:
        self.db.sync_log()
        self.snaps.synced_now()

    # -- the agent's steps ----------------------------------------------------------------------
    def append(self) -> None:
        n = self.rnd.randint(1, 120)
        first = self.offset // LINE
        data = b"".join(line(i) for i in range(first, first + n))
        res = self.pool.append(TOPIC, Chunk.from_lines(data, self.clock.time_ms()),
                               source=self.sid, source_start=self.offset)
        self.offset += res.end

    def seal(self) -> None:
        if self.pool.filling_send() is not None and self.rnd.random() < 0.8:
            return              # a slot sent while it fills is sealed later (seal_every_ms)
        self.pool.seal_all()
        self._checkpoint()

    def _checkpoint(self) -> None:
        """The agent's turn's write: the sealed positions noted (``Checkpoints.flush``)."""
        for slot in self.pool.sealed():
            if slot.seq not in self.sealed_returned:
                self.sealed_returned[slot.seq] = [id_of(v) for _, _, v in slot.records()]
        self.checkpoints.flush(lambda: self.pool.next_record, lambda: None, False)

    def _deliver(self, slot, upto: int) -> None:
        """Kafka acknowledged ``slot``'s records up to ``upto`` (from where its send began:
        the prefix acknowledged before, which a send leaves out)."""
        records = list(slot.records())
        for k in range(self.prefix.get(slot.seq, 0), upto):
            i, number = id_of(records[k][2]), slot.first_record + k
            self.delivered.add((i, number))
            if self.acked.setdefault(i, number) != number:
                self.renumbered += 1
            if self.owner.setdefault(number, i) != i:
                self.clashes += 1
            assert not self.sync or not self.renumbered, \
                f"line {i} delivered as {self.acked[i]} and {number}"
            assert not (self.sync or self.reserving) or not self.clashes, \
                f"number {number} stood for line {self.owner[number]} and line {i}"
        self.prefix[slot.seq] = max(upto, self.prefix.get(slot.seq, 0))

    def acknowledge_part(self) -> None:
        """The native path: Kafka acknowledged the first records of a slot in flight; the
        prefix goes into its header (``NativeDrain._note``), not synced on its own."""
        slots = self.pool.sealed()[:3]
        if not slots:
            return
        slot = self.rnd.choice(slots)
        done = self.prefix.get(slot.seq, 0)
        if done < slot.record_count - 1:
            upto = self.rnd.randint(done + 1, slot.record_count - 1)
            self._deliver(slot, upto)
            self.pool.note_acked(slot, upto)

    def show(self) -> None:
        """The native path with ``send_filling``: the lone filling slot goes out while it
        fills — the pool shows it (seals what it holds so far in its header) each time the
        drain takes more of it — and Kafka acknowledges some of what was sent; as sealed
        slots do, each shown slot must survive a cut with every record shown, under the
        numbers it was sent with."""
        while len(self.pool.sealed()) >= CAUGHT_UP_IN_FLIGHT:
            self.acknowledge()           # the drain keeps up, as at the rates this is for
        self.pool.take()                 # every sealed slot on its way, as the drain holds them
        if self.pool.filling_send() is None:
            self.pool.seal_due(caught_up=True)
            self._checkpoint()           # a seal at once, when it could not go out filling
        taken = self.pool.take_filling()
        if taken is not None:
            self.fill, view = taken
        elif self.fill is not None and self.fill.sealed is None:
            view = self.pool.show_filling(self.fill)
        else:
            return
        if view is None:
            return
        self.shows += 1
        self.sealed_returned[view.seq] = [id_of(v) for _, _, v in view.records()]
        done = self.prefix.get(view.seq, 0)
        if done < view.record_count:
            upto = self.rnd.randint(done, view.record_count)
            self._deliver(view, upto)
            self.pool.note_acked(view, upto)

    def acknowledge(self) -> None:
        """Kafka acknowledged the oldest sealed slots: their lines are delivered, in the
        agent's order (``Agent._slot_done``: sealed positions waiting are written first,
        then the acknowledgement, never past bytes the pool still holds; then the free)."""
        for slot in self.pool.sealed()[:self.rnd.randint(1, 3)]:
            self._deliver(slot, slot.record_count)
            if self.checkpoints.sealed_waiting():
                self._checkpoint()
            self.checkpoints.acknowledged(slot, self.pool.unacknowledged_starts(slot.seq))
            self.pool.free(slot)
            self.sealed_returned.pop(slot.seq, None)
            self.prefix.pop(slot.seq, None)
        self.pool.settle_frees(force=self.rnd.random() < 0.5)

    # -- a cut ----------------------------------------------------------------------------------
    def cut(self, image: bytes | None = None) -> None:
        if self.fill is not None and self.fill.shown and self.fill.sealed is None:
            self.cut_while_shown += 1
        image = image if image is not None else self.ops.image()
        db_files = self.snaps.after_cut(self.rnd)
        self.pool.abandon()
        self.db.close()
        self.cuts += 1
        self._start(image, db_files)

    def _check_after_cut(self, row: dict) -> None:
        if not self.cuts:
            return
        held: dict[int, int] = {}
        for slot in self.pool.sealed():
            for k, (_ts, _key, value) in enumerate(slot.records()):
                held[id_of(value)] = slot.first_record + k
        lost = [i for i in range(self.offset // LINE) if i not in self.acked and i not in held]
        assert not lost, f"cut {self.cuts}: lines {lost[:5]}… ({len(lost)}) neither " \
            f"acknowledged nor in the pool, and reading resumes at line {self.offset // LINE}"
        for slot in self.pool.sealed():
            skipped = [(id_of(v), slot.first_record + k)
                       for k, (_ts, _key, v) in enumerate(slot.records())][:slot.acked_before]
            unsent = [pair for pair in skipped if pair not in self.delivered]
            assert not unsent, f"cut {self.cuts}: slot {slot.seq} recovered with " \
                f"{slot.acked_before} records acknowledged, but (line, number) {unsent[:3]} " \
                f"never were: a send from there leaves them out"
            assert self.native or not slot.acked_before, "a prefix nobody noted"
            self.skipped += slot.acked_before
        for i, number in held.items():
            # Off, a slot not synced may be lost: its lines go again, renumbered; but a
            # number is never another line's (the reservation).
            if self.sync and i in self.acked:
                assert number == self.acked[i], \
                    f"cut {self.cuts}: line {i} acked as {self.acked[i]}, held as {number}"
            assert not (self.sync or self.reserving) or self.owner.get(number, i) == i, \
                f"cut {self.cuts}: number {number} is line {self.owner[number]} and line {i}"
        if not self.sync:
            return
        survived = {s.seq for s in self.pool.sealed()}
        gone = [seq for seq in self.sealed_returned if seq not in survived]
        assert not gone, f"cut {self.cuts}: slots {gone} sealed (seal returned) are lost"
        # What a slot that did not survive held is read again, under new numbers; what was
        # sealed and survived keeps its own.
        self.sealed_returned = {s.seq: [id_of(v) for _, _, v in s.records()]
                                for s in self.pool.sealed()}

    def step(self) -> None:
        r = self.rnd.random()
        try:
            if r < 0.45:
                self.append()
            elif r < 0.7:
                self.seal()
            elif r < 0.8:
                self.acknowledge()
            elif r < 0.9:
                if not self.native:
                    self.acknowledge()
                elif r < 0.83:
                    self.acknowledge_part()
                else:
                    self.show()
            else:
                if self.rnd.random() < 0.5:
                    self.ops.cut_in_msync = self.rnd.randint(0, 3)
                else:
                    self.cut()
        except CutNow as now:
            self.cut(now.image)

    def close(self) -> None:
        self.pool.close()
        self.db.close()


@pytest.mark.parametrize("send_path", ["python", "native"])
@pytest.mark.parametrize("sync_on_seal", [True, False])
def test_power_cuts_lose_no_line_silently_and_give_no_line_two_numbers(tmp_path, sync_on_seal,
                                                                       send_path):
    native = send_path == "native"
    run = Run(tmp_path / "run", random.Random(52 + sync_on_seal + 2 * native), sync_on_seal,
              native)
    try:
        while run.cuts < CUTS:
            run.step()
    finally:
        run.close()
    assert run.cuts == CUTS
    assert len(run.acked) > 10 * CUTS, "the run must deliver, not only cut"
    assert not native or run.skipped > CUTS, "prefixes must survive cuts, or nothing is tested"
    assert not native or run.cut_while_shown > CUTS // 10, \
        f"cuts must find slots shown and not sealed, or nothing is tested ({run.shows} shows)"
    print(json.dumps({"sync_on_seal": sync_on_seal, "send_path": send_path, "cuts": run.cuts,
                      "shows": run.shows, "cut_while_shown": run.cut_while_shown,
                      "lines_delivered": len(run.acked), "renumbered": run.renumbered,
                      "number_clashes": run.clashes, "skipped_by_prefix": run.skipped,
                      "numbers_unused": run.unused}))
    assert sync_on_seal or run.unused, "starts must skip reserved numbers, or nothing is tested"


@pytest.mark.parametrize("send_path", ["python", "native"])
def test_without_the_reservation_power_cuts_give_numbers_to_two_lines(tmp_path, send_path):
    """``sync_on_seal = false`` as it was before the durable reservation of numbers: the
    model finds numbers Kafka took for one line given to another after a cut — what the
    reservation (checked above, same seeds) prevents."""
    native = send_path == "native"
    run = Run(tmp_path / "run", random.Random(52 + 2 * native), False, native, reserve=False)
    try:
        while run.cuts < CUTS // 5 and not run.clashes:
            run.step()
    finally:
        run.close()
    assert run.clashes, f"{run.cuts} cuts and no number given twice"


def test_an_acknowledgement_never_passes_bytes_read_again_below_a_surviving_slot(tmp_path):
    """After a start that found a slot lost and a later one of the same file surviving,
    reading goes on from the lost slot's first byte while the survivor is sent. The
    survivor's acknowledgement must not move the file's acknowledged offset past the bytes
    read again: they are in a filling (or a younger sealed) slot, not acknowledged, and a
    power cut losing that slot would leave them taken for delivered (found by the model with
    ``sync_on_seal`` off before the pool told the checkpoints what it holds)."""
    clock = FakeClock()
    db = StateDB(tmp_path / "state.db", clock=clock)
    sid = db.add_file(0, 1, 1, b"", "/virtual/app.log")
    checkpoints = Checkpoints(db, lambda: clock.monotonic_ns() / 1e9, 3_600_000)
    pool = BufferPool(tmp_path / "pool", SLOTS * SLOT, SLOT, linger_ms=1e9, clock=clock,
                      on_seal=checkpoints.sealed)
    later = b"".join(line(i) for i in range(100, 150))
    pool.append(TOPIC, Chunk.from_lines(later, 0), source=sid, source_start=100 * LINE)
    pool.seal_all()                                   # the survivor: lines 100-149
    checkpoints.flush(lambda: pool.next_record, lambda: None, False)
    again = b"".join(line(i) for i in range(60, 100))
    pool.append(TOPIC, Chunk.from_lines(again, 0), source=sid, source_start=60 * LINE)
    [survivor] = pool.sealed()                        # lines 60-99 read again, filling
    for held in ({}, pool.unacknowledged_starts(survivor.seq)):
        checkpoints.acknowledged(survivor, held)
        if not held:                                  # as before: past the filling bytes
            assert db.get(sid)["acked_offset"] == 150 * LINE
            db.conn.execute("UPDATE files SET acked_offset = 0")
            db.conn.commit()
    assert pool.unacknowledged_starts(survivor.seq) == {sid: 60 * LINE}
    assert db.get(sid)["acked_offset"] <= 60 * LINE
    pool.close()
    db.close()
