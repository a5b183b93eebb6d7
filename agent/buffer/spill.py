"""Sealed slots spilled to disk, snappy-compressed, when the pool runs out of free slots.

One file per slot, ``spill/{seq:020d}.spill``, written whole (temp file, fsync, rename)::

    magic     char[8]  "DOCKSPIL"
    version   u32      1
    meta_len  u32
    meta      JSON: seq, topic, record_count, used_bytes, min/max ts, payload_crc,
              block_count, positions
    payload   python-snappy compressed slot payload (used bytes only)

A spilled slot is read back, in sequence order with the slots still in the pool, when the drain
reaches it; its CRC32C is checked again after decompression. Spilling never exceeds
``spill_max_bytes`` of files.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import snappy
from crc32c import crc32c

from .durable import make_folder
from .errors import PoolCorrupt
from .seams import FileOps

SPILL_MAGIC = b"DOCKSPIL"
SPILL_VERSION = 1
_PREFIX = struct.Struct("<8sII")


@dataclass(frozen=True)
class SlotMeta:
    """What a sealed slot's header says, wherever the slot lives."""

    seq: int
    topic: str
    record_count: int
    used_bytes: int
    min_ts: int
    max_ts: int
    payload_crc: int
    block_count: int
    positions: tuple[tuple[int, int, int], ...]
    # The record number of the slot's first record (its records are numbered on from it);
    # None in a spill file written before records were numbered: numbered at recovery.
    first_record: int | None = None


class SpillStore:
    def __init__(self, directory: Path, max_bytes: int, ops: FileOps):
        self.dir = Path(directory)
        self.max_bytes = max_bytes
        self.ops = ops
        make_folder(self.dir)
        self._sizes: dict[int, int] = {}
        self._metas: dict[int, SlotMeta] = {}

    @property
    def used_bytes(self) -> int:
        return sum(self._sizes.values())

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:020d}.spill"

    def put(self, meta: SlotMeta, payload) -> bool:
        """Spill one slot; False (nothing written) when it would exceed ``max_bytes``."""
        body = snappy.compress(bytes(payload))
        head = json.dumps(asdict(meta)).encode()
        blob = _PREFIX.pack(SPILL_MAGIC, SPILL_VERSION, len(head)) + head + body
        if self.used_bytes + len(blob) > self.max_bytes:
            return False
        self.ops.write_file(self._path(meta.seq), blob)
        self._sizes[meta.seq] = len(blob)
        self._metas[meta.seq] = meta
        return True

    def renumber(self, meta: SlotMeta) -> None:
        """Write a spilled slot again with ``meta`` (its numbers, given at recovery to a slot
        spilled before records had numbers), so the next start finds the same numbers."""
        payload = self.load(meta.seq)
        head = json.dumps(asdict(meta)).encode()
        blob = _PREFIX.pack(SPILL_MAGIC, SPILL_VERSION, len(head)) + head + \
            snappy.compress(payload)
        self.ops.write_file(self._path(meta.seq), blob)
        self._sizes[meta.seq] = len(blob)
        self._metas[meta.seq] = meta

    def metas(self) -> list[SlotMeta]:
        return list(self._metas.values())

    def load(self, seq: int) -> bytes:
        payload = self._read(self._path(seq))[1]
        return payload

    def remove(self, seq: int) -> None:
        self._path(seq).unlink(missing_ok=True)
        self._sizes.pop(seq, None)
        self._metas.pop(seq, None)

    def _read(self, path: Path) -> tuple[SlotMeta, bytes]:
        blob = path.read_bytes()
        if len(blob) < _PREFIX.size:
            raise PoolCorrupt(f"{path} is truncated")
        magic, version, head_len = _PREFIX.unpack_from(blob)
        if magic != SPILL_MAGIC or version != SPILL_VERSION:
            raise PoolCorrupt(f"{path} is not a version {SPILL_VERSION} spill file")
        try:
            raw = json.loads(blob[_PREFIX.size:_PREFIX.size + head_len])
            meta = SlotMeta(**{**raw, "positions": tuple(tuple(p) for p in raw["positions"])})
            payload = snappy.decompress(blob[_PREFIX.size + head_len:])
        except Exception as exc:   # any decoding failure of the file is corruption
            raise PoolCorrupt(f"{path} cannot be decoded: {exc}") from exc
        if len(payload) != meta.used_bytes or crc32c(payload) != meta.payload_crc:
            raise PoolCorrupt(f"{path} fails its CRC32C")
        return meta, payload

    def paths(self) -> list[Path]:
        """The spill files in the folder, in sequence order."""
        return sorted(self.dir.glob("*.spill"))

    def recover(self) -> list[tuple[Path, str]]:
        """Index the spill files left by a previous run; return the corrupt ones (path, why)."""
        bad = []
        for path in self.paths():
            try:
                meta, _ = self._read(path)
            except PoolCorrupt as exc:
                bad.append((path, str(exc)))
                continue
            self._sizes[meta.seq] = path.stat().st_size
            self._metas[meta.seq] = meta
        for tmp in self.dir.glob("*.tmp"):   # a spill that crashed before its rename
            tmp.unlink()
        return bad
