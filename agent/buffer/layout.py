"""Byte layout of the pool file: numpy dtypes for the headers and the geometry arithmetic.

The design docstring in ``__init__.py`` shows the same layout as a pseudo-struct.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from crc32c import crc32c

from .errors import PoolGeometryMismatch

MAGIC = b"DOCKETBP"
VERSION = 5
# Version 1 had no record numbers (no first_record / next_record); an empty one is upgraded.
# Version 2 had no acknowledged prefix (``acked`` was padding, zero): upgraded in place, its
# sealed slots kept. Version 3 is refused by agents that read version 2, so an older agent
# never seals a slot beside an ``acked`` it would not clear. Version 3 handed a slot out
# without the fill's mark (``KEPT_OFFSET``): upgraded in place, its filling slots discarded as
# before at that open; version 4 is refused by agents that read version 3. Version 5 lets a
# slot of 64 KiB or more hold the positions of up to ``MAX_SOURCES`` sources (the header's
# last entry then points at a page at the slot's end, ``ext_offset``); a version 4 pool is
# one of version 5 whose slots hold at most 8, upgraded in place (the number only), and
# version 5 is refused by agents that read version 4 (they would take such a header for a
# damaged one).
V1_STATE_OFFSET = 500
PAGE = 4096
FILE_HEADER_BYTES = PAGE
SLOT_HEADER_BYTES = 512
SLOT_MAGIC = 0x544F4C53            # b"SLOT" little-endian
MAX_POSITIONS = 8                  # the header's entries
# A slot of ``EXT_MIN_SLOT_BYTES`` or more keeps its last ``EXT_BYTES`` for the positions of
# sources beyond the header's: two pages, used in turn, so that a header on the disk never
# names the page being written (a slot sent while it fills shows its header again and again).
# The header's last entry then says (``EXT_TAG``, which page, its CRC) and ``n_positions``
# counts every source; the page holds the positions from the header's seventh on.
EXT_AREAS = 2
EXT_BYTES = EXT_AREAS * PAGE
EXT_MIN_SLOT_BYTES = 16 * PAGE
EXT_TAG = (1 << 64) - 1
MAX_SOURCES = 128                  # 121 on the page: 2,904 of its bytes
MAX_TOPIC_BYTES = 256
SEQ_MOD = 1 << 64

FREE, FILLING, SEALED = 0, 1, 2
STATE_NAMES = {FREE: "free", FILLING: "filling", SEALED: "sealed"}

FILE_HEADER = np.dtype([
    ("magic", "S8"),
    ("version", "<u4"),
    ("header_bytes", "<u4"),
    ("slot_bytes", "<u8"),
    ("slot_count", "<u8"),
    ("slot_header_bytes", "<u4"),
    ("geometry_crc", "<u4"),
    ("next_seq", "<u8"),
    ("next_record", "<u8"),
])
# Bytes of FILE_HEADER covered by geometry_crc: everything before it.
GEOMETRY_CRC_SPAN = FILE_HEADER.fields["geometry_crc"][1]

SLOT_HEADER = np.dtype([
    ("magic", "<u4"),
    ("topic_len", "<u2"),
    ("n_positions", "<u2"),
    ("seq", "<u8"),
    ("record_count", "<u4"),
    ("used_bytes", "<u4"),
    ("min_ts", "<i8"),
    ("max_ts", "<i8"),
    ("payload_crc", "<u4"),
    ("block_count", "<u4"),
    ("first_record", "<u8"),
    ("positions", "<u8", (MAX_POSITIONS, 3)),
    ("topic", f"S{MAX_TOPIC_BYTES}"),
    ("header_crc", "<u4"),
    ("state", "u1"),
    ("acked", "u1", (3,)),        # records acknowledged from the first on (24 bits, little-endian)
])
assert SLOT_HEADER.itemsize == SLOT_HEADER_BYTES
HEADER_CRC_SPAN = SLOT_HEADER.fields["header_crc"][1]
STATE_OFFSET = SLOT_HEADER.fields["state"][1]
ACKED_OFFSET = SLOT_HEADER.fields["acked"][1]
ACKED_MAX = (1 << 24) - 1
# While a slot fills, two fields a seal writes later tell what a crash may keep of it (records
# of a source that cannot give them again, a listener's: ``recovery.py``): ``first_record``
# holds the fill's mark (a number of its own, written as the slot is handed out), ``max_ts``
# the kept prefix: its bytes (low 32 bits) and a check (high 32 bits) = CRC32C of the mark,
# continued from the prefix's CRC32C — one 8-byte store after each such block.
KEPT_OFFSET = SLOT_HEADER.fields["max_ts"][1]


def ext_crc(seq: int, positions: bytes) -> int:
    """The check of a slot's positions page: CRC32C of its positions, continued from the
    slot's sequence number (a page a former use of the slot left never matches)."""
    return crc32c(positions, crc32c(seq.to_bytes(8, "little")))


def split_positions(positions, seq: int, area: int) -> tuple[np.ndarray, bytes | None]:
    """The header's ``positions`` entries for ``positions`` ((source, start, end) each), and
    the bytes of the positions page (``area``) when they do not fit in the header."""
    entries = np.zeros((MAX_POSITIONS, 3), np.uint64)
    if len(positions) <= MAX_POSITIONS:
        if positions:
            entries[:len(positions)] = positions
        return entries, None
    keep = MAX_POSITIONS - 1
    entries[:keep] = positions[:keep]
    page = np.asarray(positions[keep:], "<u8").tobytes()
    entries[keep] = (EXT_TAG, area, ext_crc(seq, page))
    return entries, page


def joined_positions(entries: np.ndarray, n: int, seq: int, page_of) -> tuple | None:
    """A header's positions: its ``n`` entries, or (``n`` > 8) its first seven and the rest
    from the page its last entry names (``page_of(area)``: that page's bytes); None when the
    entry or the page fails its check."""
    if n <= MAX_POSITIONS:
        return tuple(map(tuple, entries[:n].tolist()))
    keep = MAX_POSITIONS - 1
    tag, area, check = (int(x) for x in entries[keep])
    if page_of is None or n > MAX_SOURCES or tag != EXT_TAG or area >= EXT_AREAS:
        return None
    page = bytes(page_of(area)[:(n - keep) * 24])
    if ext_crc(seq, page) != check:
        return None
    rest = np.frombuffer(page, "<u8").reshape(-1, 3)
    return tuple(map(tuple, entries[:keep].tolist() + rest.tolist()))


def store_acked(header_bytes: np.ndarray, n: int) -> None:
    """Write ``n`` into a slot header's ``acked``, low byte first: a process killed between
    the three stores leaves a value between the old one and ``n`` (never above ``n``)."""
    header_bytes[ACKED_OFFSET] = n & 0xFF
    header_bytes[ACKED_OFFSET + 1] = n >> 8 & 0xFF
    header_bytes[ACKED_OFFSET + 2] = n >> 16 & 0xFF


def acked_of(header_bytes: np.ndarray, record_count: int) -> int:
    """The acknowledged prefix a slot header's bytes say (at most its record count)."""
    a = header_bytes[ACKED_OFFSET:ACKED_OFFSET + 3].astype(np.int64)
    return min(int(a[0] | a[1] << 8 | a[2] << 16), record_count)


def kept_check(mark: int, prefix_crc: int) -> int:
    """The check of a filling slot's kept prefix: the mark's CRC32C continued from the
    prefix's, so a prefix a former fill of the slot left (another mark) never matches."""
    return crc32c(mark.to_bytes(8, "little"), prefix_crc)


def store_kept(header_bytes: np.ndarray, used: int, check: int) -> None:
    header_bytes[KEPT_OFFSET:KEPT_OFFSET + 8].view("<u8")[0] = used | check << 32


def kept_of(header_bytes: np.ndarray) -> tuple[int, int]:
    """(bytes, check) of a filling slot's kept prefix."""
    v = int(header_bytes[KEPT_OFFSET:KEPT_OFFSET + 8].view("<u8")[0])
    return v & 0xFFFFFFFF, v >> 32


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


@dataclass(frozen=True)
class Geometry:
    slot_bytes: int
    slot_count: int

    @property
    def slot_headers_offset(self) -> int:
        return FILE_HEADER_BYTES

    @property
    def payload_offset(self) -> int:
        return FILE_HEADER_BYTES + _round_up(self.slot_count * SLOT_HEADER_BYTES, PAGE)

    @property
    def file_bytes(self) -> int:
        return self.payload_offset + self.slot_count * self.slot_bytes

    def slot_offset(self, index: int) -> int:
        return self.payload_offset + index * self.slot_bytes

    @property
    def extended(self) -> bool:
        """Whether a slot keeps pages for the positions of more sources than its header's."""
        return self.slot_bytes >= EXT_MIN_SLOT_BYTES

    @property
    def payload_bytes(self) -> int:
        """The bytes of a slot that blocks may fill (a version 4 pool's slots sealed before
        its upgrade may fill every byte: ``slot_bytes`` bounds what a header may say)."""
        return self.slot_bytes - EXT_BYTES if self.extended else self.slot_bytes

    @property
    def max_sources(self) -> int:
        """Sources whose records one slot may hold."""
        return MAX_SOURCES if self.extended else MAX_POSITIONS

    def ext_offset(self, index: int, area: int) -> int:
        """Where the positions page ``area`` of slot ``index`` begins in the file."""
        return self.slot_offset(index) + self.slot_bytes - EXT_BYTES + area * PAGE

    @classmethod
    def fit(cls, size_bytes: int, slot_bytes: int) -> Geometry:
        """The largest pool of ``slot_bytes`` slots whose file is at most ``size_bytes``."""
        if slot_bytes < PAGE or slot_bytes % PAGE:
            raise PoolGeometryMismatch(
                f"slot_size_bytes = {slot_bytes} is not a positive multiple of {PAGE}",
                hint=f"use a multiple of {PAGE}, e.g. 1048576",
            )
        if slot_bytes >= 1 << 32:
            raise PoolGeometryMismatch(f"slot_size_bytes = {slot_bytes} exceeds 4 GiB - 1")
        count = max(0, (size_bytes - FILE_HEADER_BYTES) // (slot_bytes + SLOT_HEADER_BYTES))
        while count and cls(slot_bytes, count).file_bytes > size_bytes:
            count -= 1
        if count < 2:
            raise PoolGeometryMismatch(
                f"size_bytes = {size_bytes} holds fewer than 2 slots of {slot_bytes} bytes",
                hint=f"raise size_bytes to at least {cls(slot_bytes, 2).file_bytes}",
            )
        return cls(slot_bytes, count)


def geometry_crc(header: np.ndarray) -> int:
    return crc32c(header.tobytes()[:GEOMETRY_CRC_SPAN])


def header_crc(slot_header: np.ndarray) -> int:
    """CRC32C of one slot header record, up to (not including) header_crc and state."""
    return crc32c(slot_header.tobytes()[:HEADER_CRC_SPAN])


def seq_order_key(seqs: list[int]):
    """A sort key ordering 64-bit sequence numbers by serial arithmetic (RFC 1982 style).

    Every live sequence is within 2^63 of the others, so distances from any one of them,
    read as signed 64-bit numbers, order them correctly across a wrap-around.
    """
    if not seqs:
        return lambda s: 0
    base = seqs[0]

    def key(seq: int) -> int:
        d = (seq - base) % SEQ_MOD
        return d - SEQ_MOD if d >= SEQ_MOD // 2 else d

    return key
