"""Opening the pool file and recovering what it holds: the lock, the format's checks and upgrades,
every slot header read, torn or stale slots quarantined or freed.

A part of ``BufferPool`` (``pool.py``), as a mixin: the state it works on is the pool's,
set up in ``BufferPool.__init__``.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import logging
import os
import weakref
from pathlib import Path

import numpy as np
from crc32c import crc32c

from . import layout as L
from .durable import make_folder, moved, sync_folder
from .errors import (
    PoolBusy,
    PoolCorrupt,
    PoolDamaged,
    PoolDiskTooSmall,
    PoolFormatError,
    PoolGeometryMismatch,
)
from .framing import ONCE, block_spans, iter_blocks
from .slots import (
    DropEvent,
    Filling,
    SealedSlot,
    SealedSlots,
    slot_meta,
)
from .spill import SlotMeta, SpillStore

log = logging.getLogger("docket.agent.buffer")


class PoolRecovery:
    # -- opening -------------------------------------------------------------------------------
    def _open(self, first_seq: int, first_record: int, spill_dir: str | Path | None,
              spill_max_bytes: int) -> None:
        """Lock and map the file, then recover it (or start a new one's free list)."""
        # Whether the slots were handed out by an agent that writes the fill's mark first
        # (format version 4 on): only then is a filling slot's whole header its own seal's.
        self._fill_marks = True
        self._older: int | None = None      # the format version found, when upgraded here
        created = self._open_file(first_seq)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r+",
                              shape=(self.geometry.file_bytes,))
        # Slicing a plain ndarray view costs far less than slicing the memmap subclass.
        self._mm = self._map.view(np.ndarray)
        self._fh = self._mm[:L.FILE_HEADER.itemsize].view(L.FILE_HEADER)
        g = self.geometry
        self._hdr = self._mm[g.slot_headers_offset:
                             g.slot_headers_offset + g.slot_count * L.SLOT_HEADER_BYTES
                             ].view(L.SLOT_HEADER)
        self._hdr_bytes = self._hdr.view(np.uint8).reshape(g.slot_count, L.SLOT_HEADER_BYTES)
        self._scratch = np.zeros(1, L.SLOT_HEADER)
        self._scratch_bytes = self._scratch.view(np.uint8)
        self.spill = SpillStore(spill_dir, spill_max_bytes, self.ops) if spill_dir else None
        self._next_seq = int(self._fh[0]["next_seq"])
        # Record numbers: never below the caller's (the state database's) nor the header's.
        self._next_record = max(first_record, int(self._fh[0]["next_record"]))
        # The positions page each slot's header named last (``sealer._header``): the next
        # one written is the other, so that a header on the disk never names a page being
        # written (1 where none was: the first is page 0).
        entry = self._hdr["positions"][:, L.MAX_POSITIONS - 1]
        self._ext_last = np.where(entry[:, 0] == np.uint64(L.EXT_TAG),
                                  np.minimum(entry[:, 1], 1), 1).astype(np.int8)
        if created:
            self._free = list(range(g.slot_count - 1, -1, -1))
            self._foreign_spill()
            self._found_numbers()
        else:
            self._recover()
            if self._older is not None:
                self._upgrade_in_place(self._older)
            self._headers_durable()

    def _found_numbers(self) -> None:
        """Every number given that the open can find is counted: the caller may move the next
        one on (``numbers_found``: past a bound reserved before the host started again)."""
        if self._numbers_found is not None:
            self._next_record = max(self._next_record, self._numbers_found(self._next_record))
            # In the file header at once: a process killed before the next seal leaves the
            # next start (under the same boot id) going on from here.
            self._fh[0]["next_record"] = max(int(self._fh[0]["next_record"]),
                                             self._next_record)

    def _foreign_spill(self) -> None:
        """Spill files beside a pool file just made are an earlier pool's (moved aside as
        damaged, or lost with the state): their numbers are not this pool's, which gives the
        same numbers again. Each is moved to ``quarantine/`` and reported (its records may
        or may not have been sent), never read as this pool's."""
        if self.spill is None:
            return
        for path in self.spill.paths():
            self._quarantine_file(path, f"{path.name}: a spill file of an earlier pool file "
                                  f"(this one was made new)")

    def _headers_durable(self) -> None:
        """Make the headers read at open the ones on the disk (``sync_on_seal``): a process
        killed between a seal's header write and its sync left a header the disk does not
        have yet, and ``_ext_last`` follows the one read; a slot used again would write the
        page the header on the disk names, and a power cut before its next header sync left
        that header naming new bytes (quarantined, a false loss). What recovery freed
        (acknowledged slots) becomes durable with them: the acknowledgement is first, as at
        every free (``free_barrier``)."""
        if not self.sync_on_seal:
            return
        if self._free_barrier is not None:
            self._free_barrier()
        self.ops.msync(self._map._mmap, 0, self.geometry.payload_offset)

    def _open_file(self, first_seq: int) -> bool:
        """Lock the file, then check it, or create and preallocate it. True when created."""
        g = self.geometry
        if self.path.exists() and self.path.stat().st_size > 0:
            self._lock_file(os.open(self.path, os.O_RDWR))
            self._check_existing()
            return False
        make_folder(self.path.parent)
        available = self.ops.free_bytes(self.path.parent)
        if available < g.file_bytes:
            raise PoolDiskTooSmall(
                f"the buffer pool needs {g.file_bytes} bytes at {self.path}; "
                f"the file system has {available} free",
                hint="lower buffer.size_bytes or move buffer.path to a larger file system",
            )
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        self._lock_file(fd)                  # the fd stays open: it holds the lock
        if os.fstat(fd).st_size > 0:         # another pool created it between our look and lock
            self._check_existing()
            return False
        try:
            self.ops.reserve(fd, g.file_bytes)
        except OSError as exc:
            self.path.unlink(missing_ok=True)
            raise PoolDiskTooSmall(
                f"reserving {g.file_bytes} bytes for {self.path} failed: {exc.strerror}",
                hint="free space, lower buffer.size_bytes or move buffer.path",
            ) from exc
        header = np.zeros(1, L.FILE_HEADER)
        header[0] = (L.MAGIC, L.VERSION, L.FILE_HEADER_BYTES, g.slot_bytes, g.slot_count,
                     L.SLOT_HEADER_BYTES, 0, first_seq % L.SEQ_MOD, 0)
        header[0]["geometry_crc"] = L.geometry_crc(header)
        os.pwrite(fd, header.tobytes(), 0)
        os.fsync(fd)
        sync_folder(self.path.parent)        # its name: the file is durable only with it
        return True

    def _lock_file(self, fd: int) -> None:
        """Hold ``flock(LOCK_EX | LOCK_NB)`` on the pool file through ``fd`` until close(),
        abandon() or the process ends. The lock belongs to the open file, so a second open in
        this process conflicts like another process does. If the object is dropped without
        either (a test simulating a crash), garbage collection closes the fd."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise PoolBusy(
                f"{self.path} is in use by another buffer pool (another docket agent, or a "
                "pool still open in this process); nothing was read or written",
                hint="give each agent a buffer.path of its own, or stop the agent that uses "
                "this pool first",
            ) from None
        self._unlock = weakref.finalize(self, os.close, fd)

    def _release_file_lock(self) -> None:
        if self._unlock is not None:
            self._unlock()                   # closing the fd drops the lock; runs once

    def _check_existing(self) -> None:
        with open(self.path, "rb") as f:
            raw = f.read(L.FILE_HEADER.itemsize)
        if len(raw) < L.FILE_HEADER.itemsize:
            raise PoolDamaged(f"{self.path} is too short to be a buffer pool",
                              hint="move the file away; the agent creates a new pool")
        header = np.frombuffer(raw, L.FILE_HEADER)
        h = header[0]
        if not any(raw):
            raise PoolDamaged(f"{self.path} has a header of zeros (an agent killed while it "
                              "created the pool?)", hint="move it away; the agent creates a "
                              "new pool")
        if bytes(h["magic"]) != L.MAGIC:
            raise PoolFormatError(f"{self.path} is not a docket buffer pool (bad magic)",
                                  hint="point buffer.path at another file")
        if int(h["version"]) == 1 and int(h["geometry_crc"]) == L.geometry_crc(header):
            self._upgrade_v1(header)
            return
        if int(h["version"]) == 2 and int(h["geometry_crc"]) == L.geometry_crc(header):
            self._upgrade_v2(header)
            return self._check_existing()
        if int(h["version"]) == 3 and int(h["geometry_crc"]) == L.geometry_crc(header):
            # Version 3 agents handed a slot out without the fill's mark: this open takes no
            # filling slot for sealed or kept, and writes version 5 once it has recovered
            # (``_upgrade_in_place``), so an open refused before then finds version 3 again.
            self._fill_marks = False
            self._older = 3
        elif int(h["version"]) == 4:
            self._older = 4                  # every slot of it holds at most 8 sources
        elif int(h["version"]) != L.VERSION:
            raise PoolFormatError(
                f"{self.path} has pool format version {int(h['version'])}; this agent reads "
                f"version {L.VERSION}", hint="drain it with the agent version that wrote it")
        if int(h["geometry_crc"]) != L.geometry_crc(header):
            raise PoolDamaged(f"{self.path}: the file header fails its CRC",
                              hint="the file is damaged; move it away to start a new pool")
        found = (int(h["slot_bytes"]), int(h["slot_count"]))
        want = (self.geometry.slot_bytes, self.geometry.slot_count)
        if found != want:
            raise PoolGeometryMismatch(
                f"{self.path} holds {found[1]} slots of {found[0]} bytes; the configuration asks "
                f"for {want[1]} slots of {want[0]} bytes",
                hint="restore the old buffer.size_bytes and buffer.slot_size_bytes until the "
                "pool has drained, or move the file away (its unsent events would be lost)",
            )
        if self.path.stat().st_size < self.geometry.file_bytes:
            raise PoolDamaged(f"{self.path} is shorter than its header says",
                              hint="the file was truncated; move it away")

    def _upgrade_in_place(self, found: int) -> None:
        """A version 3 or 4 pool, recovered, becomes version 5 in place: only the number
        changes (synced). An agent that reads version 3 refuses version 4 (its filling slots
        would leave a former seal's header looking whole), one that reads version 4 refuses
        version 5 (a header naming a positions page would look damaged to it)."""
        self._fh[0]["version"] = L.VERSION
        self._fh[0]["geometry_crc"] = L.geometry_crc(self._fh)
        self.ops.msync(self._map._mmap, 0, L.FILE_HEADER_BYTES)
        log.info("%s: pool format version %d upgraded to %d in place (its slots kept)",
                 self.path, found, L.VERSION)

    def _upgrade_v2(self, header: np.ndarray) -> None:
        """A version 2 pool becomes version 3 in place, its slots kept: every slot's ``acked``
        (padding then) zeroed and synced before the version changes (then 3 becomes 4)."""
        g = self.geometry
        found = (int(header[0]["slot_bytes"]), int(header[0]["slot_count"]))
        if found != (g.slot_bytes, g.slot_count):
            raise PoolGeometryMismatch(
                f"{self.path} (pool format version 2) holds {found[1]} slots of {found[0]} "
                f"bytes; the configuration asks for {g.slot_count} slots of {g.slot_bytes} bytes",
                hint="restore the old buffer.size_bytes and buffer.slot_size_bytes until the "
                "pool has drained, or move the file away (its unsent events would be lost)")
        with open(self.path, "r+b") as f:
            for index in range(g.slot_count):
                f.seek(g.slot_headers_offset + index * L.SLOT_HEADER_BYTES + L.ACKED_OFFSET)
                f.write(bytes(L.SLOT_HEADER_BYTES - L.ACKED_OFFSET))
            f.flush()
            os.fsync(f.fileno())
            new = header.copy()
            new[0]["version"] = 3
            new[0]["geometry_crc"] = L.geometry_crc(new)
            f.seek(0)
            f.write(new.tobytes())
            f.flush()
            os.fsync(f.fileno())
        log.info("%s: pool format version 2 upgraded to 3 in place (its slots kept)",
                 self.path)

    def _upgrade_v1(self, header: np.ndarray) -> None:
        """A version 1 pool (no record numbers) is rewritten as version 2 when no slot of it
        is sealed: nothing in it is kept anyway. One with sealed slots is refused."""
        g = self.geometry
        if (int(header[0]["slot_bytes"]), int(header[0]["slot_count"])) != \
                (g.slot_bytes, g.slot_count):
            raise PoolGeometryMismatch(
                f"{self.path} (pool format version 1) holds other slots than configured",
                hint="restore the old buffer settings and drain it with the agent version that "
                "wrote it, or move it away (its unsent events would be lost)")
        with open(self.path, "r+b") as f:
            f.seek(g.slot_headers_offset)
            raw = f.read(g.slot_count * L.SLOT_HEADER_BYTES)
            states = np.frombuffer(raw, np.uint8).reshape(g.slot_count, L.SLOT_HEADER_BYTES)[
                :, L.V1_STATE_OFFSET]
            if (states == L.SEALED).any():
                raise PoolFormatError(
                    f"{self.path} has pool format version 1 with {int((states == L.SEALED).sum())}"
                    " sealed slot(s); this agent numbers records and reads version 2",
                    hint="drain it with the agent version that wrote it (stop sources, let it "
                    "send), then start this version")
            new = np.zeros(1, L.FILE_HEADER)
            new[0] = (L.MAGIC, L.VERSION, L.FILE_HEADER_BYTES, g.slot_bytes, g.slot_count,
                      L.SLOT_HEADER_BYTES, 0, int(header[0]["next_seq"]), 0)
            new[0]["geometry_crc"] = L.geometry_crc(new)
            f.seek(g.slot_headers_offset)
            f.write(bytes(g.slot_count * L.SLOT_HEADER_BYTES))      # every slot free
            f.seek(0)
            f.write(new.tobytes())
            f.flush()
            os.fsync(f.fileno())

    def _recover(self) -> None:
        hdr = self._hdr
        states = hdr["state"]
        # The slots spilled (each file synced before its slot was marked free): a slot header
        # still sealed under one of their numbers is the spilled slot's, its free lost.
        spilled: dict[int, SlotMeta] = {}
        torn_spills: list[tuple[Path, str]] = []
        if self.spill is not None:
            torn_spills = self.spill.recover()
            spilled = {meta.seq: meta for meta in self.spill.metas()}
        kept: list[tuple[int, list]] = []           # filling slots holding a listener's records
        freed_seqs: list[int] = []                  # sealed slots freed here, spilled or not
        numbered: list[int] = []                    # one past each slot's numbers, freed too
        accounted: dict[int, str] = {}              # for a torn spill file: ``_torn_spill``
        if self._delivered is not None and self._free_barrier is not None:
            # What ``delivered`` reads (the acknowledged offsets) durable before any free or
            # spill removal below: after a SIGKILL they may be commits in the page cache only,
            # and a free on the disk without them is bytes read again under new numbers.
            self._free_barrier()
        for index in range(self.geometry.slot_count):
            state = int(states[index])
            if state == L.FREE:
                continue
            if state == L.FILLING:
                meta = self._meta_if_valid(index) if self._fill_marks else None
                if meta is None or crc32c(self._payload_view(index, meta.used_bytes)) \
                        != meta.payload_crc:
                    spans = self._kept_spans(index) if self._fill_marks else None
                    if spans:
                        kept.append((index, spans))
                    else:
                        self.counters["filling_discarded"] += 1
                        states[index] = L.FREE
                    continue
                # Its seal wrote the header (after syncing the data) and the stop came before
                # the state byte: it is sealed. (The header a former seal left fails its CRC:
                # a slot handed out gets its mark there first.)
                states[index] = state = L.SEALED
                self.counters["seal_finished"] += 1
            meta = self._meta_if_valid(index) if state == L.SEALED else None
            if meta is None:
                why = f"torn header (state {state})" if state == L.SEALED else \
                    f"unknown state {state}"
                self._quarantine(index, why)
                continue
            if _same_slot(meta, spilled.get(meta.seq)):
                # Spilled, and its free did not reach the disk (a power loss): the spill file
                # holds its records (sent from there), whatever its payload holds now (new
                # bytes, when the slot was filling again).
                log.info("slot %d (seq %d): spilled before the stop; its free did not reach "
                         "the disk: freed, its records sent from the spill file", index, meta.seq)
                states[index] = L.FREE
                self.counters["spill_freed"] += 1
                continue
            payload = self._payload_view(index, meta.used_bytes)
            if crc32c(payload) != meta.payload_crc:
                if self._delivered is not None and self._delivered(meta):
                    # Acknowledged and freed; the free was lost (a power loss) and the slot
                    # was filling again: its payload is new, unsealed bytes (read again from
                    # their files), not a loss.
                    log.info("slot %d (seq %d): its records were acknowledged before; its free "
                             "did not reach the disk and the slot was filling again: freed",
                             index, meta.seq)
                    states[index] = L.FREE
                    self.counters["stale_freed"] += 1
                    freed_seqs.append(meta.seq)
                    _note_numbers(numbered, meta)
                    continue
                self._quarantine(index, "torn payload (payload CRC mismatch)", meta)
                accounted[meta.seq] = "the pool's copy of its slot is reported as dropped"
                continue
            if self._delivered is not None and self._delivered(meta):
                # Acknowledged whole before the stop, its free not yet written (frees wait
                # for their barrier: ``free``): not sent again.
                states[index] = L.FREE
                self.counters["acknowledged_freed"] += 1
                freed_seqs.append(meta.seq)
                _note_numbers(numbered, meta)
                continue
            self._sealed[meta.seq] = SealedSlot(
                meta, index, payload,
                acked_before=L.acked_of(self._hdr_bytes[index], meta.record_count))
        if self.spill is not None:
            accounted.update((seq, "its records were acknowledged before the stop")
                             for seq in freed_seqs)
            for path, why in torn_spills:
                self._torn_spill(path, why, accounted)
            for meta in self.spill.metas():
                _note_numbers(numbered, meta)
                if self._delivered is not None and self._delivered(meta):
                    # Acknowledged whole; its removal did not reach the disk (a power loss
                    # after the free's barrier): not sent again.
                    self.spill.remove(meta.seq)
                    self.counters["acknowledged_freed"] += 1
                    freed_seqs.append(meta.seq)
                    continue
                self._sealed[meta.seq] = self._spilled_slot(meta)
        if self.counters["acknowledged_freed"]:
            log.info("%d slot(s) whose records were all acknowledged before the stop: freed, "
                     "not sent again", self.counters["acknowledged_freed"])
        numbered += [s.meta.first_record + s.record_count for s in self._sealed.values()
                     if s.meta.first_record is not None]
        self._next_record = max([self._next_record, *numbered])
        self._found_numbers()                 # before the kept and spilled slots take theirs
        self._free = [i for i in range(self.geometry.slot_count - 1, -1, -1)
                      if int(states[i]) == L.FREE]
        self._reorder()
        for seq, slot in self._sealed.items():        # spilled before records had numbers
            if slot.meta.first_record is None:
                meta = dataclasses.replace(slot.meta, first_record=self._take_records(
                    slot.record_count))
                self.spill.renumber(meta)         # the same numbers at every later start
                self._sealed[seq] = self._spilled_slot(meta)
        # A slot freed here as acknowledged counts too: its number was given (and the audit's
        # counted_seq may be past it), whatever the header kept.
        seen = [*self._sealed, *freed_seqs]
        if seen:
            key = L.seq_order_key(seen)
            nxt = (max(seen, key=key) + 1) % L.SEQ_MOD
            if key(nxt) > key(self._next_seq):   # the header's next_seq may lag one seal
                self._next_seq = nxt
            # Written back at once: were the slot freed and the agent stopped before its next
            # seal, a lagging header would give its number again (the audit's counted_seq
            # would then take a later slot for one counted already).
            self._fh[0]["next_seq"] = self._next_seq
            self._fh[0]["next_record"] = max(int(self._fh[0]["next_record"]), self._next_record)
        # In the order they were filled (their marks count up as slots are handed out): a
        # listener's records keep their order when two of its slots were left unsealed.
        mark = L.seq_order_key([int(self._hdr[i]["first_record"]) for i, _ in kept])
        for index, spans in sorted(kept, key=lambda k: mark(int(self._hdr[k[0]]["first_record"]))):
            self._seal_kept(index, spans)
        for slot in self._sealed.values():
            for source, _start, end in slot.meta.positions:
                if end > self._recovered_positions.get(source, -1):
                    self._recovered_positions[source] = end

    def _kept_spans(self, index: int) -> list[tuple[int, int]] | None:
        """The blocks of a filling slot a crash keeps: those of a source that cannot give its
        records again (``ONCE``) within the slot's kept prefix (``L.KEPT_OFFSET``), when the
        prefix is whole — the fill's mark and every byte of it as written. (offset, size) each;
        None when there are none. Blocks of files are left: they are read again."""
        used, check = L.kept_of(self._hdr_bytes[index])
        if not used or used > self.geometry.slot_bytes:
            return None
        payload = self._payload_view(index, used)
        mark = int(self._hdr[index]["first_record"])
        if L.kept_check(mark, crc32c(payload)) != check:
            return None                 # torn by a power loss, or a former fill's
        try:
            spans = [(at, size) for at, size, h in block_spans(payload) if h["flags"] & ONCE]
        except PoolCorrupt:
            return None
        return spans or None

    def _seal_kept(self, index: int, spans: list[tuple[int, int]]) -> None:
        """Seal a filling slot with only its kept blocks, numbered after every slot found
        sealed: they were never sealed, so never sent nor counted. Blocks that are the slot's
        first bytes already are sealed where they are; others (a file's blocks between them)
        are copied to the start of a free slot, kept there under a mark of its own before this
        one is freed, so a crash during the open keeps them still (at worst in both: sent
        twice, never lost). Without a free slot they are moved within this one."""
        r = self._hdr[index]
        topic_len = int(r["topic_len"])
        topic = bytes(r["topic"])[:topic_len].decode("utf-8", "replace")
        o = self.geometry.slot_offset(index)
        size = sum(n for _at, n in spans)
        ends = [at + n for at, n in spans]
        in_place = spans[0][0] == 0 and [at for at, _n in spans[1:]] == ends[:-1]
        if not in_place:
            blocks = b"".join(self._mm[o + at:o + at + n].tobytes() for at, n in spans)
            if self._free:
                index = self._kept_elsewhere(index, topic, blocks)
                o = self.geometry.slot_offset(index)
            else:
                self._mm[o:o + size] = np.frombuffer(blocks, np.uint8)
        payload = self._payload_view(index, size)
        fill = Filling(index, used=size, crc=crc32c(payload), blocks=len(spans))
        for block in iter_blocks(payload):
            fill.records += len(block)
            fill.min_ts = min(fill.min_ts, int(block.timestamps.min()))
            fill.max_ts = max(fill.max_ts, int(block.timestamps.max()))
        if not topic_len or not fill.records:
            self.counters["filling_discarded"] += 1
            self._hdr[index]["state"] = L.FREE
            self._free.append(index)
            return
        c = self._close(topic, fill)
        self._write_synced(c)
        self._sealed[c.seq] = SealedSlot(fill.meta(c.seq, topic, (), c.first_record), index,
                                         payload)
        self.counters["filling_kept"] += 1
        log.warning("slot %d: %d record(s) of topic %s a listener had read were in a slot not "
                    "yet sealed at the stop: kept, sealed as seq %d", index, fill.records,
                    topic, c.seq)

    def _kept_elsewhere(self, index: int, topic: str, blocks: bytes) -> int:
        """Copy ``blocks`` into a free slot as its kept prefix under the same mark (a filling
        slot of its own, synced before anything else changes), then free ``index``; the new
        slot's index."""
        to = self._free.pop()
        o = self.geometry.slot_offset(to)
        self._mm[o:o + len(blocks)] = np.frombuffer(blocks, np.uint8)
        mark = int(self._hdr[index]["first_record"])   # its place among the fills kept
        r = self._hdr[to]
        r["magic"] = L.SLOT_MAGIC
        r["acked"] = 0
        r["first_record"] = mark
        tb = topic.encode()
        r["topic_len"], r["topic"] = len(tb), tb
        L.store_kept(self._hdr_bytes[to], len(blocks), L.kept_check(mark, crc32c(blocks)))
        r["state"] = L.FILLING
        if self.sync_on_seal:
            self.ops.msync(self._map._mmap, o, len(blocks))
            self._sync_headers(self._map._mmap, max(to, index))
        self._hdr[index]["state"] = L.FREE
        self._free.append(index)
        return to

    def _reorder(self) -> None:
        key = L.seq_order_key(list(self._sealed))
        self._sealed = SealedSlots(sorted(self._sealed.items(), key=lambda kv: key(kv[0])))

    def _meta_if_valid(self, index: int) -> SlotMeta | None:
        g = self.geometry
        return slot_meta(self._hdr[index:index + 1], g,
                         lambda area: self._mm[g.ext_offset(index, area):][:L.PAGE])

    def _payload_view(self, index: int, used: int) -> np.ndarray:
        o = self.geometry.slot_offset(index)
        return self._mm[o:o + used]

    def _quarantine(self, index: int, why: str, meta: SlotMeta | None = None) -> None:
        """Copy a slot that failed its checks out of the pool, report it, and free it."""
        g = self.geometry
        make_folder(self.quarantine_dir)
        ho = g.slot_headers_offset + index * L.SLOT_HEADER_BYTES
        o = g.slot_offset(index)
        blob = self._mm[ho:ho + L.SLOT_HEADER_BYTES].tobytes() \
            + self._mm[o:o + g.slot_bytes].tobytes()
        seq = int(self._hdr[index]["seq"])
        if meta is not None:              # its numbers were given: never give them again
            self._next_record = max(self._next_record, meta.first_record + meta.record_count)
        self.ops.write_file(self.quarantine_dir / f"slot-{index:06d}-seq-{seq}.bin", blob)
        self._hdr[index]["state"] = L.FREE
        self.counters["slots_quarantined"] += 1
        self._report(DropEvent("corrupt", meta.topic if meta else "",
                               meta.record_count if meta else -1,
                               f"slot {index} seq {seq}: {why}; copied to {self.quarantine_dir}",
                               first_record=meta.first_record if meta else None))

    def _torn_spill(self, path: Path, why: str, accounted: dict[int, str]) -> None:
        """A spill file that cannot be read. Its slot may still be in the pool (spilled, and
        the slot's free did not reach the disk): sealed and intact, it is sent from there;
        freed here as acknowledged, or quarantined and reported with its record count, it is
        accounted for (``accounted``: number → how). Then the file goes to ``quarantine/``
        without a drop of its own; otherwise it is reported as one."""
        seq = _seq_of(path)
        held = self._sealed.get(seq)
        if held is not None and held.index is not None:
            how = "the pool still holds its slot, sent from there"
        elif seq in accounted:
            how = accounted[seq]
        else:
            self._quarantine_file(path, why)
            return
        self._set_aside(path)
        log.warning("%s; slot seq %d: %s; moved to %s", why, seq, how, self.quarantine_dir)

    def _set_aside(self, path: Path) -> None:
        """Move a file the pool cannot use into ``quarantine/``."""
        make_folder(self.quarantine_dir)
        moved(path, self.quarantine_dir / path.name)

    def _quarantine_file(self, path: Path, why: str) -> None:
        """Set a file aside and report it as a drop of unknown size."""
        self._set_aside(path)
        self.counters["slots_quarantined"] += 1
        self._report(DropEvent("corrupt", "", -1, f"{why}; moved to {self.quarantine_dir}"))

    def _report(self, event: DropEvent) -> None:
        self.drop_events.append(event)
        if self._on_drop is not None:
            self._on_drop(event)


def _seq_of(path: Path) -> int | None:
    """The slot number a spill file's name gives (``SpillStore._path``)."""
    try:
        return int(path.stem)
    except ValueError:
        return None


def _note_numbers(numbered: list[int], meta: SlotMeta) -> None:
    """One past ``meta``'s record numbers, when it has them."""
    if meta.first_record is not None:
        numbered.append(meta.first_record + meta.record_count)


def _same_slot(meta: SlotMeta, spilled: SlotMeta | None) -> bool:
    """Whether a slot header found sealed is the slot a spill file holds: the same number,
    topic, records and payload checksum (a spill file keeps the header's fields as they
    were); a spill file that only shares the number is another slot's."""
    return spilled is not None and (meta.seq, meta.topic, meta.record_count,
                                    meta.payload_crc, meta.first_record) == \
        (spilled.seq, spilled.topic, spilled.record_count, spilled.payload_crc,
         spilled.first_record)
