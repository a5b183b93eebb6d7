"""Read a pool file without opening it as a pool: no lock, no recovery, no write.

``BufferPool`` runs recovery when it opens a file (filling slots freed, damaged slots
quarantined) and takes the file's lock; something that only wants to *look* — a test counting
the records a killed agent may have had in flight, an operator asking what is buffered — must do
neither. ``inspect_pool`` maps the file read-only and reports every slot's state, and the sealed
slots whose header and payload pass their CRCs, in sequence order. A slot changing under it (the
pool of a running agent) fails its CRC and is reported as such, never misread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from crc32c import crc32c

from . import layout as L
from .errors import PoolFormatError
from .slots import SealedSlot, slot_meta


@dataclass
class PoolView:
    path: Path
    geometry: L.Geometry
    next_seq: int
    states: dict[str, int] = field(default_factory=dict)    # state name → slots
    sealed: list[SealedSlot] = field(default_factory=list)   # valid, in sequence order
    damaged: list[int] = field(default_factory=list)         # slot indexes failing a check


def inspect_pool(path: str | Path) -> PoolView:
    path = Path(path)
    raw = np.fromfile(path, dtype=np.uint8, count=L.FILE_HEADER.itemsize)
    if len(raw) < L.FILE_HEADER.itemsize:
        raise PoolFormatError(f"{path} is too short to be a buffer pool")
    h = raw.view(L.FILE_HEADER)
    if bytes(h[0]["magic"]) != L.MAGIC or int(h[0]["geometry_crc"]) != L.geometry_crc(h):
        raise PoolFormatError(f"{path} is not a docket buffer pool (bad magic or header CRC)")
    geometry = L.Geometry(int(h[0]["slot_bytes"]), int(h[0]["slot_count"]))
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(geometry.file_bytes,))
    try:
        view = PoolView(path, geometry, int(h[0]["next_seq"]))
        hdr = np.array(mm[geometry.slot_headers_offset:geometry.slot_headers_offset
                          + geometry.slot_count * L.SLOT_HEADER_BYTES]).view(L.SLOT_HEADER)
        for index in range(geometry.slot_count):
            state = int(hdr[index]["state"])
            name = L.STATE_NAMES.get(state, "unknown")
            view.states[name] = view.states.get(name, 0) + 1
            if state != L.SEALED:
                continue
            meta = slot_meta(hdr[index:index + 1], geometry, lambda area, i=index: np.array(
                mm[geometry.ext_offset(i, area):][:L.PAGE]))
            o = geometry.slot_offset(index)
            payload = np.array(mm[o:o + meta.used_bytes]) if meta is not None else None
            if meta is None or crc32c(payload) != meta.payload_crc:
                view.damaged.append(index)
                continue
            view.sealed.append(SealedSlot(meta, index, payload, acked_before=L.acked_of(
                hdr[index:index + 1].view(np.uint8), meta.record_count)))
    finally:
        mm._mmap.close()
    if view.sealed:
        key = L.seq_order_key([s.seq for s in view.sealed])
        view.sealed.sort(key=lambda s: key(s.seq))
    return view
