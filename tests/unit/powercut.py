"""A power-cut model of the pool file and the state database, for ``test_power_cut_model.py``.

- ``PowerCutOps`` (the pool's ``FileOps``) keeps the pool file's *durable image*: what each
  ``msync`` made durable (whole pages, as the kernel writes them). ``image`` is the file as a
  power cut leaves it: the durable image plus any subset of the sectors written since and not
  synced (the kernel may have written any of them back, in any order); a cut inside an msync
  is the same image taken before that msync returned (``cut_in_msync``).
- ``DbSnapshots`` copies the state database's files at each of its real sync points (the
  ``free_barrier``: ``StateDB.sync_log``); after a cut the database is that copy, or — every
  commit since having reached the disk — the files as they are. (SQLite in WAL mode comes back
  at a commit boundary at or after its last sync; commits between the two ends are not
  modelled one by one.)
"""

from __future__ import annotations

import mmap
import random
from pathlib import Path

import numpy as np

from agent.buffer.seams import FileOps, SimulatedCrash

SECTOR = 512
REGION = 16 << 10            # the model's slot size: a slot's pages, written back together


class CutNow(SimulatedCrash):
    """Raised inside an msync chosen for a cut; ``image`` is the pool file as the cut left it."""

    def __init__(self, image: bytes):
        super().__init__("power cut inside an msync")
        self.image = image


class PowerCutOps(FileOps):
    def __init__(self, rnd: random.Random, durable: bytes):
        self.rnd = rnd
        self.durable = bytearray(durable)
        self.mm: mmap.mmap | None = None
        self.cut_in_msync = -1           # msyncs to let pass before a cut inside one (-1: none)
        self.header_zone = 0             # bytes before the first slot (the file's headers)
        self.msyncs = 0

    def msync(self, mm: mmap.mmap, offset: int, length: int) -> None:
        self.mm = mm
        if self.cut_in_msync == 0:
            self.cut_in_msync = -1
            raise CutNow(self.image())
        if self.cut_in_msync > 0:
            self.cut_in_msync -= 1
        super().msync(mm, offset, length)
        a = offset - offset % mmap.PAGESIZE
        e = min(len(self.durable), offset + length)
        self.durable[a:e] = mm[a:e]
        self.msyncs += 1

    def image(self) -> bytes:
        """The pool file after a power cut now: the durable image, and of what was written
        since and not synced, what the kernel had written back — chosen per cut: nothing,
        everything, each page or each sector at random (a share drawn per cut), or whole
        regions (``REGION`` bytes: a slot's pages written back together, regions in any
        order), so that a later slot can survive an earlier one as well as half a slot."""
        dur = np.frombuffer(bytes(self.durable), np.uint8).copy()
        if self.mm is None:
            return dur.tobytes()
        cur = np.frombuffer(self.mm, np.uint8)[:len(dur)]
        share = self.rnd.choice((0.0, 1.0, 0.5, 0.9, self.rnd.random()))
        # The headers (one page of many slots' headers) torn at sectors; the slots' pages
        # at the unit drawn.
        self._write_back(dur, cur, 0, self.header_zone, SECTOR, share)
        unit = self.rnd.choice((SECTOR, mmap.PAGESIZE, REGION))
        self._write_back(dur, cur, self.header_zone, len(dur), unit, share)
        del cur
        return dur.tobytes()

    def _write_back(self, dur: np.ndarray, cur: np.ndarray, start: int, end: int, unit: int,
                    share: float) -> None:
        n = (end - start) // unit
        a, b = dur[start:start + n * unit], cur[start:start + n * unit]
        dirty = np.flatnonzero((a.reshape(n, unit) != b.reshape(n, unit)).any(axis=1))
        for u in dirty:
            if self.rnd.random() < share:
                a[u * unit:(u + 1) * unit] = b[u * unit:(u + 1) * unit]


class DbSnapshots:
    """The state database's files at its last sync point."""

    def __init__(self, path: Path):
        self.path = path
        self.synced = self._copy()

    def _files(self) -> list[Path]:
        return [self.path, self.path.with_name(self.path.name + "-wal")]

    def _copy(self) -> dict[str, bytes | None]:
        return {p.name: p.read_bytes() if p.exists() else None for p in self._files()}

    def synced_now(self) -> None:
        self.synced = self._copy()

    def after_cut(self, rnd: random.Random) -> dict[str, bytes | None]:
        return self.synced if rnd.random() < 0.5 else self._copy()

    @staticmethod
    def write(folder: Path, files: dict[str, bytes | None]) -> None:
        for name, data in files.items():
            if data is not None:
                (folder / name).write_bytes(data)
