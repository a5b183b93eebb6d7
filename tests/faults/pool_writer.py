"""Child process for the SIGKILL test: appends numbered lines to a pool in a tight loop.

Usage: python pool_writer.py POOL_PATH FIRST_ID
Reports on stdout, flushed, *after* each action completed:
    R                      pool opened (recovery done)
    S seq first last       a slot was sealed holding ids first..last
    F seq last             about to free the slot whose last id is `last` (reported before)
Lines are 41 bytes (`id-%08d ` padded, newline), so id i starts at source offset 41 * i.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agent.buffer import BufferPool  # noqa: E402
from tests.unit.poolkit import SIZE, SLOT, chunk_of, ids_of  # noqa: E402

WIDTH = 40


def main() -> None:
    path, next_id = sys.argv[1], int(sys.argv[2])
    pool = BufferPool(path, 4 * SIZE, SLOT, linger_ms=2, sync_on_seal=False)
    out = sys.stdout
    out.write("R\n")
    out.flush()
    known = {s.seq for s in pool.sealed()}
    step = 0
    while True:
        step += 1
        n = 1 + (step * 7919) % 97
        ids = range(next_id, next_id + n)
        res = pool.append("t", chunk_of(ids, width=WIDTH), source=1,
                          source_start=next_id * (WIDTH + 1))
        next_id += res.records
        if step % 5 == 0:
            pool.seal_due()
        for slot in pool.sealed():
            if slot.seq not in known:
                got = ids_of(v for _, _, v in slot.records())
                known.add(slot.seq)
                out.write(f"S {slot.seq} {got[0]} {got[-1]}\n")
        out.flush()
        while pool.stats()["free_slots"] < 8 and pool.sealed():
            oldest = pool.sealed()[0]
            last = ids_of(v for _, _, v in oldest.records())[-1]
            out.write(f"F {oldest.seq} {last}\n")
            out.flush()
            pool.free(oldest)


if __name__ == "__main__":
    main()
