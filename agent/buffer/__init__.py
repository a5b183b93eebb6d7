"""The agent's buffer pool: one preallocated, memory-mapped file cut into batch-size slots.

Lines read by the sources are framed into slots; a slot is *sealed* when full or when its linger
has passed, drained to Kafka in sequence order, and *freed* only when Kafka acknowledged every
record in it. The file outlives the process: after a crash, every sealed slot comes back.

On-disk layout (little-endian; every offset a multiple of 8)::

    FileHeader (4096 bytes, at 0)                       layout.FILE_HEADER
        magic        char[8]  "DOCKETBP"
        version      u32      5 (1: before record numbers, rewritten when it has no sealed slot;
                              2, 3 and 4 upgraded in place: layout.py)
        header_bytes u32      4096
        slot_bytes   u64      slot_size_bytes (a multiple of 4096: the batch-size limit)
        slot_count   u64
        slot_header_bytes u32 512
        geometry_crc u32      CRC32C of the fields above
        next_seq     u64      sequence number the next seal takes (updated at every seal)
        next_record  u64      record number the next sealed record takes (updated at every seal
                              and when a dropped line takes one)

    SlotHeader[slot_count] (512 bytes each, at 4096)     layout.SLOT_HEADER
        magic        u32      "SLOT"
        topic_len    u16
        n_positions  u16
        seq          u64      pool-wide sequence, compared modulo 2^64 (serial arithmetic)
        record_count u32
        used_bytes   u32      payload bytes holding blocks
        min_ts       i64      event time bounds of the records, ms
        max_ts       i64      (while filling: the kept prefix, bytes | check << 32)
        payload_crc  u32      CRC32C of payload[0:used_bytes]
        block_count  u32
        first_record u64      the record number of the slot's first record (docket-seq)
                              (while filling: the fill's mark)
        positions    (u64 source, u64 start, u64 end)[8]   source bytes the slot covers;
                              with n_positions > 8 (slots of 64 KiB or more, up to 128), the
                              first 7 and (EXT_TAG, page, CRC32C of the page's positions
                              continued from seq): the rest are in that page
        topic        char[256]
        header_crc   u32      CRC32C of every byte above (state is not covered)
        state        u8       0 free, 1 filling, 2 sealed
        acked        u8[3]    records Kafka acknowledged from the first on (not covered)

    Payload[slot_count] (slot_bytes each, page aligned after the headers)
        Block*       see framing.py: one block per append, columnar:
                     header, ts i64[n], value length u32[n], value offset u32[n],
                     [key length u16[n], keys], then the appended bytes as read
        Positions[2] (slots of 64 KiB or more: their last two pages, no block in them)
                     (u64 source, u64 start, u64 end)[n_positions - 7], the header's 8th
                     entry naming which; written in turn, each synced before its header

Deviation from the design's record framing: instead of a (length, time, key) prefix before each
record, each block keeps those fields as columns followed by the lines exactly as read (their
terminators stay, unreferenced). The fields per record are the same; the bytes are copied with
one memcpy per block, and reading a block back takes no per-record parsing.

Sealing: a slot is sealed when the next record does not fit, when a source past the slot's
bound (128 sources; 8 in slots under 64 KiB) has records for it, or when
``linger_ms`` has passed since its first record *and* no sealed slot is waiting to be taken by
the drain (while slots wait, sealing early sends nothing sooner and wastes slots). It is first
*closed* (numbered, in memory; no more records), then sealed, in closing order: at once by the
caller, or by the pool's sealing thread (``seal_thread``) while the caller goes on, and then
collected by the caller (``on_seal`` in its thread, then the drain may take it). Nothing
counts a closed slot as sealed: not the drain, nor ``next_record``, nor ``record_marks``.

Invariants
- The state byte is the only field whose change makes a slot count: free → filling when it is
  handed out (before any payload is written), filling → sealed after the payload and the rest of
  the header (with ``header_crc``) are written, sealed → free when Kafka acknowledged the slot.
  A one-byte store cannot tear, so a crash during free leaves the slot sealed (sent again) or free.
- ``acked``: how many of a sealed slot's records, from its first on, Kafka acknowledged
  (``note_acked``, written as reports come in, not synced on its own). It is zero from the
  moment a slot is handed out until it is sealed, and only ever grows while it is sealed, so
  whichever copy of the header survives a crash or a power loss tells the truth: a start sends
  the slot from there (fewer duplicates), never past a record not acknowledged. A header lies
  within one 512-byte sector, written whole or not at all.
- Sequence numbers are assigned at seal, strictly increasing modulo 2^64; sealed slots are
  replayed in that order. Every live sequence lies within 2^63 of the others.
- Free slots are handed out most recently freed first, so a steady pool reuses warm pages.

- Record numbers are given at seal, dense: a slot's records are numbered from its
  ``first_record`` in slot order. The highest number given lives in the file header and, until
  the slot is sealed again, in its slot header; a slot torn before its state byte gave nothing.

- A slot sent while it fills (``send_filling``, ``sending.py``) takes its sequence and record
  numbers when it begins; no other slot opens, closes or takes a number until it is sealed.
  Before the drain sends what came into it, the pool *shows* it: the new bytes synced, then the
  header written as a sealed slot of every record so far (state sealed from the first show on;
  the header rewritten whole, in its own sector, at each later show; ``acked`` kept), with the
  file header's next numbers, and synced. Whatever a crash or a power loss keeps is a sealed
  slot of records that were at most sent, never a number sent and given again. Its seal, at
  ``seal_every_ms``, writes the header a last time and runs what a seal runs (``on_seal``).

- A slot's positions page (more than 8 sources) is written, and synced with the payload,
  before the header that names it; a slot's next header names the other page (``_ext_last``:
  the page of the last header written, read from every header at open), so a header on the
  disk never names a page being written. An open makes the headers it read durable (after
  the free barrier) before any slot is used again: a kill between a header's write and its
  sync left the disk one header behind the page cache.

- A slot handed out gets, before its state byte says filling, a mark of its own in
  ``first_record`` (so the header a former seal left fails its CRC), its topic, and an empty
  kept prefix in ``max_ts``. Each block of records a source cannot give again (``append(...,
  once=True)``: a listener's; block flag ``ONCE``) moves the kept prefix past it: its bytes and
  a check (CRC32C of the mark, continued from the prefix's CRC32C) in one 8-byte store.

Recovery (``BufferPool.open`` on an existing file)
- filling with a header that passes its CRC and a payload that passes its ``payload_crc`` →
  sealed: its seal wrote the header and the stop came before the state byte
  (``seal_finished``).
- filling with a kept prefix whose check holds → its ``ONCE`` blocks moved to the slot's start
  and sealed, numbered after every slot found sealed (``filling_kept``); its other blocks are
  files' records, read again.
- any other filling slot → discarded (made free); the sources re-read from
  ``recovered_positions()``, the highest end offset per source among the sealed slots.
- sealed with a bad magic or ``header_crc``, or a positions page that fails its check (torn
  header), or a bad ``payload_crc`` (torn payload)
  → header and payload copied to ``quarantine/``, reported as dropped with reason ``corrupt``,
  made free. Every other sealed slot is replayed, in sequence order, from its ``acked`` prefix
  on.
- any other state value → treated as a torn header.
- sealed, and the slot a spill file holds (its number, topic, record count, first record and
  payload CRC) → free (``spill_freed``): the slot was spilled and its free did not reach the
  disk; its records go from the spill file.
- spill files beside a pool file made new → moved to ``quarantine/``, reported: an earlier
  pool's, whose numbers the new pool gives again.
- a spill file that cannot be read → moved to ``quarantine/``; reported as dropped unless the
  pool accounts for its slot (sealed and intact: sent from there; freed as acknowledged; or
  quarantined and reported with its record count).
- a spill file acknowledged whole (``delivered``) → removed, not sent again
  (``acknowledged_freed``): its unlink was lost with the power.

Locking
- A pool holds ``flock(LOCK_EX | LOCK_NB)`` on its file from before the first read of it until
  ``close()`` (or ``abandon()``, or process death). Another holder — another process, or another
  open ``BufferPool`` in this one, since the lock belongs to the open file — makes the open fail
  with ``PoolBusy`` before anything is read, recovered or written: two writers on one pool would
  send, free or quarantine each other's slots.

Modules
- ``pool``: ``BufferPool``: its state and settings, and the parts it is made of (each a mixin
  over that state, as a disk buffer splits its ledger, writer and reader):
- ``recovery``: opening the file, its checks and upgrades, every slot header recovered.
- ``writer``: appending: records framed into the filling slot of their topic, space made.
- ``sealer``: sealing: a slot closed and numbered, its data then its header synced, in order.
- ``sending``: a slot sent while it fills, shown to the drain (sealed in its header) as it grows.
- ``reader``: sealed slots handed out in order and freed once acknowledged.
- ``slots``: what those parts share: ``SealedSlot``, a filling or closing slot, the tunings.
- ``layout``: the headers above as numpy dtypes, and the geometry arithmetic.
- ``framing``: records framed into a slot's payload in blocks, and read back.
- ``spill``: sealed slots spilled to disk, compressed, when no slot is free.
- ``inspect``: a pool file read without opening it as a pool (no lock, recovery or write).
- ``seams``: the pool's only contact with time and the file system (``FileOps``, crash points).
- ``durable``: names that survive a power loss: folders synced after a file is made or moved.
- ``errors``: the pool's named failures.
"""

from .errors import (
    PoolBusy,
    PoolCorrupt,
    PoolDamaged,
    PoolDiskTooSmall,
    PoolError,
    PoolFormatError,
    PoolGeometryMismatch,
)
from .framing import Chunk
from .pool import AppendResult, BufferPool, DropEvent, SealedSlot

__all__ = [
    "AppendResult", "BufferPool", "Chunk", "DropEvent", "PoolBusy", "PoolCorrupt",
    "PoolDamaged", "PoolDiskTooSmall", "PoolError", "PoolFormatError", "PoolGeometryMismatch",
    "SealedSlot",
]
