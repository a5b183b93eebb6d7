"""A child appending in a tight loop is SIGKILLed 50 times at random moments; after each kill the
reopened pool holds every slot any run of the child reported sealed (and no run had begun to
free) and nothing else, intact (CRC-verified, no quarantine, the same ids) and in order, and
sources resume exactly after the sealed data."""

from __future__ import annotations

import os
import random
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.buffer import BufferPool
from tests.unit.poolkit import SIZE, SLOT, ids_of

WRITER = Path(__file__).with_name("pool_writer.py")
KILLS = 50
LINE_BYTES = 41


def run_child_until_killed(pool_path: Path, first_id: int, rng: random.Random) -> list[str]:
    """Run the writer, SIGKILL it a random time after it opened the pool; return its lines."""
    child = subprocess.Popen([sys.executable, str(WRITER), str(pool_path), str(first_id)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    fd = child.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + 60
    kill_at = None
    while child.poll() is None:
        now = time.monotonic()
        if kill_at is not None and now >= kill_at:
            child.send_signal(signal.SIGKILL)
            break
        if now > deadline:
            child.kill()
            raise AssertionError("the writer did not start within 60 s")
        if select.select([fd], [], [], 0.005)[0]:
            buf += os.read(fd, 1 << 16)
            if kill_at is None and b"R\n" in buf:
                kill_at = time.monotonic() + rng.uniform(0.02, 0.6)
    child.wait(timeout=30)
    while chunk := os.read(fd, 1 << 16):      # what it wrote before dying
        buf += chunk
    err = child.stderr.read().decode(errors="replace")
    child.stdout.close()
    child.stderr.close()
    assert child.returncode == -signal.SIGKILL, f"writer died on its own: {err}"
    return buf.decode().split("\n")


@pytest.mark.slow
def test_sigkill_at_random_moments_never_loses_or_reorders_a_sealed_record(tmp_path):
    rng = random.Random(1955)
    pool_path = tmp_path / "buffer.pool"
    next_id = 0
    freed_up_to = -1
    sealed_total = 0
    alive: dict[int, tuple[int, int]] = {}    # every run's sealed slots not yet being freed
    ever_freeing: set[int] = set()
    for kill in range(KILLS):
        lines = run_child_until_killed(pool_path, next_id, rng)
        reported, freeing = {}, set()
        for tok in (ln.split() for ln in lines):
            if len(tok) != (4 if tok[:1] == ["S"] else 3 if tok[:1] == ["F"] else 1):
                continue                   # a line the kill cut short: its action never ran
            if tok[0] == "S":
                reported[int(tok[1])] = (int(tok[2]), int(tok[3]))
            elif tok[0] == "F":
                freeing.add(int(tok[1]))
                freed_up_to = max(freed_up_to, int(tok[2]))
        pool = BufferPool(pool_path, 4 * SIZE, SLOT, sync_on_seal=False)
        try:
            assert pool.drop_events == [], f"kill {kill}: {pool.drop_events}"
            found = {}
            previous = freed_up_to if not pool.sealed() else -1
            for slot in pool.sealed():
                pool.verify(slot)
                ids = ids_of(v for _, _, v in slot.records())
                assert ids == list(range(ids[0], ids[0] + len(ids))), f"kill {kill}: gap in slot"
                assert ids[0] > previous, f"kill {kill}: slot {slot.seq} out of order"
                previous = ids[-1]
                found[slot.seq] = (ids[0], ids[-1])
            alive.update(reported)
            ever_freeing |= freeing
            for seq in freeing:
                alive.pop(seq, None)
            for seq, span in alive.items():       # sealed in this run or any before
                assert found.get(seq) == span, f"kill {kill}: reported slot {seq} {span} missing"
            # Beyond those, only slots whose free the kill cut short (sealed or free, never
            # torn) and slots sealed after the last report (killed before it).
            extra = set(found) - set(alive) - ever_freeing
            newest = max(list(alive) + list(ever_freeing) + list(reported), default=-1)
            assert all(seq > newest for seq in extra), \
                f"kill {kill}: slots {sorted(extra)} found that nobody sealed"
            alive.update({seq: found[seq] for seq in extra})   # checked at every kill after
            sealed_total += len(reported)
            # Resume where a restarted source would: after the last sealed (or freed) record.
            end = pool.recovered_positions().get(1)
            next_id = max(end // LINE_BYTES if end is not None else 0, freed_up_to + 1)
            if found:
                assert next_id == max(last for _, last in found.values()) + 1
        finally:
            pool.close()
    assert sealed_total > KILLS, "the writer should have sealed many slots across the kills"
