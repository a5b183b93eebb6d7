"""A Hypothesis state machine runs append / seal / free / linger / crash / reopen against a plain
model of the pool: per topic, the queue of records not yet sealed, and the sealed slots by
sequence number. After every step the live pool agrees with the model; after every crash or
reopen the recovered pool holds exactly the model's sealed slots, records and order. Topic
``b`` is a listener's (``once``): what its filling slot holds at a crash is kept, sealed after
the others; topic ``a``'s is discarded (a file's, read again)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from agent.buffer import BufferPool
from agent.buffer.seams import FileOps, SimulatedCrash
from tests.unit.poolkit import SIZE, SLOT, CrashingOps, FakeClock, chunk_of, ids_of

TOPICS = ("a", "b")
ONCE = "b"                          # records a source cannot give again: kept at a crash
FIRST_SEQ = (1 << 64) - 20          # so that runs cross the sequence wrap-around


class PoolMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="pool-model-"))
        self.clock = FakeClock()
        self.next_id = 0
        self.queue = {t: [] for t in TOPICS}        # appended, not yet sealed
        self.sealed: dict[int, tuple[str, list[int]]] = {}
        self.next_seq = FIRST_SEQ
        self.pool = self._open()

    def _open(self, ops: FileOps | None = None) -> BufferPool:
        return BufferPool(self.dir / "pool", SIZE, SLOT, linger_ms=10, clock=self.clock,
                          sync_on_seal=False, ops=ops or FileOps(), first_seq=FIRST_SEQ)

    def teardown(self):
        self.pool.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _adopt_new_seals(self):
        """Slots the pool sealed on its own (full, linger) must hold the queue's head, in order."""
        for slot in self.pool.sealed():
            if slot.seq in self.sealed:
                continue
            ids = ids_of(v for _, _, v in slot.records())
            q = self.queue[slot.topic]
            assert ids == q[:len(ids)], f"slot {slot.seq} holds {ids[:5]}…, queue head {q[:5]}…"
            del q[:len(ids)]
            assert slot.seq == self.next_seq
            self.sealed[slot.seq] = (slot.topic, ids)
            self.next_seq = (self.next_seq + 1) % (1 << 64)

    def _restart(self, clean: bool):
        if clean:
            self.pool.close()
        else:   # abandoned mid-operation, as a killed process leaves its map; the lock goes
            self.pool.abandon()
        if self.queue[ONCE]:                          # its filling slot is kept, sealed
            self.sealed[self.next_seq] = (ONCE, list(self.queue[ONCE]))
            self.next_seq = (self.next_seq + 1) % (1 << 64)
        self.pool = self._open()
        for q in self.queue.values():
            q.clear()                                 # the others' are discarded on open
        got = {s.seq: (s.topic, ids_of(v for _, _, v in s.records())) for s in self.pool.sealed()}
        assert got == self.sealed
        assert [s.seq for s in self.pool.sealed()] == list(self.sealed)
        assert self.pool.drop_events == []

    @rule(topic=st.sampled_from(TOPICS), n=st.integers(1, 150))
    def append(self, topic, n):
        ids = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        res = self.pool.append(topic, chunk_of(ids), once=topic == ONCE)
        assert res.records == n, "the pool is sized so that the model never fills it"
        self.queue[topic].extend(ids)
        self._adopt_new_seals()

    @rule(topic=st.sampled_from(TOPICS))
    def seal(self, topic):
        seq = self.pool.seal(topic)
        assert (seq is None) == (not self.queue[topic])
        self._adopt_new_seals()

    @rule(ms=st.integers(0, 20))
    def time_passes(self, ms):
        self.clock.advance_ms(ms)
        self.pool.seal_due()
        self._adopt_new_seals()

    @precondition(lambda self: self.sealed)
    @rule(k=st.integers(0, 100))
    def free(self, k):
        slots = self.pool.sealed()
        slot = slots[k % len(slots)]
        self.pool.free(slot)
        del self.sealed[slot.seq]

    @rule()
    def crash(self):
        self._restart(clean=False)

    @rule()
    def reopen(self):
        self._restart(clean=True)

    @rule(topic=st.sampled_from(TOPICS), point=st.sampled_from(FileOps.SEAL_POINTS))
    def crash_while_sealing(self, topic, point):
        if not self.queue[topic]:
            return
        self.pool.ops = CrashingOps(at=point)
        try:
            self.pool.seal(topic)
        except SimulatedCrash:
            pass
        if point != "seal:before_header":   # the header was written: the slot counts
            self.sealed[self.next_seq] = (topic, list(self.queue[topic]))
            self.next_seq = (self.next_seq + 1) % (1 << 64)
            self.queue[topic].clear()
        self._restart(clean=False)

    @invariant()
    def pool_is_never_full(self):
        # Keep within the pool: free the oldest slots when few are left (a drain's job).
        while self.pool.stats()["free_slots"] < 6 and self.sealed:
            oldest = self.pool.sealed()[0]
            self.pool.free(oldest)
            del self.sealed[oldest.seq]

    @invariant()
    def live_pool_matches_model(self):
        assert [s.seq for s in self.pool.sealed()] == list(self.sealed)


PoolMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_pool_matches_its_model_through_appends_frees_and_crashes = PoolMachine.TestCase
