"""Record numbers reserved on disk ahead of use, for ``sync_on_seal = false``.

With ``sync_on_seal`` on, the pool's file header — the count of numbers given — is synced at
every seal before any record of the slot is sent, so a start after a power loss never gives a
number that went to Kafka to another line. Off, nothing is synced: a power loss may take the
header, the state database and the slots back to any earlier moment, and numbers already in
Kafka would be given again to other lines (a consumer deduplicating by (origin, incarnation,
number) would then drop a real event). This file keeps a bound past every number given:

``state_dir/record-numbers``, 1,024 bytes allocated when it is made, so no later write needs
new room on the disk (a copy-on-write file system may still refuse one): two records of one
512-byte sector each, written in turn (the write count's parity picks the sector) and
``fdatasync``'ed::

    magic    4 bytes   "DKRN"
    version  1 byte    1
    crc      4 bytes   CRC-32C of the body
    length   2 bytes   of the body, little-endian
    body     JSON      {"n": write count, "incarnation": "...", "boot_id": "...",
                        "reserved": N}
    zeros    to the sector's end

The valid record with the highest ``n`` is the reservation: a write the power cut short fails
its CRC, and the other sector still holds the bound before it — true, since nothing needing the
new one was written before its sync returned.

Rules:

- **No number at or above ``reserved`` is written into a slot's header** (the moment a number
  can reach Kafka). The pool asks for more before (``cover``): the bound moves ``STEP``
  numbers past the need, one durable write per ``STEP`` numbers.
- **A start under another boot id** (``/proc/sys/kernel/random/boot_id``: the host started
  again, so the page cache may be gone; where the kernel gives none, every start counts as
  one) gives numbers from ``reserved`` on. The pool asks at its open, once it has counted
  every number it finds (header, slots, the database's and the journal's) and before a slot
  it keeps takes any (``BufferPool(numbers_found=…)``). The numbers between are written in
  the loss journal as ``numbers_unused`` (zero events) before the new boot id is, so the
  audit's ``missing`` holds them and no tier takes them for a loss. A start under the same
  boot id (a process crash: the page cache kept every write) goes on from what it found.
- **A bound that cannot be written** (an I/O error, a full copy-on-write file system, a file
  that cannot be read or made) is not waited for: the
  pool syncs each seal's header (and a dropped line's count) as ``sync_on_seal`` does until
  a write succeeds, so the header on the disk counts every number sent.
- **A clean stop gives the rest back** (``stopped``): the pool closed and synced, the bound is
  the next number exactly, so a host restarted after it skips none.
- The file of another incarnation (a state database lost and made anew) or one not readable is
  not taken: numbering goes on from what the start found (with a WARNING for the latter).
- With ``sync_on_seal`` on it is used only where one exists (a power loss with the setting
  off, the agent started again with it on): read, written for this boot at start and given
  back at a clean stop, never moved on by seals.

What this does not give back with ``sync_on_seal = false``: a line Kafka took whose number and
file offset were lost with the power is read again and sent under a new number (the audit sees
a second copy); only the syncs of ``sync_on_seal`` keep a line under one number.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from crc32c import crc32c

from ..buffer.durable import open_created

log = logging.getLogger("docket.agent.numbers")

MAGIC = b"DKRN"
VERSION = 1
SECTOR = 512                       # one record; the file holds two
_HEAD = 11                         # magic, version, crc, length
STEP = 1 << 20                     # numbers reserved per durable write
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def host_boot_id() -> str | None:
    """This host's boot id (new at every boot), or None where the kernel does not say."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


class NumberReserve:
    def __init__(self, path: Path, incarnation: str, boot: str | None):
        self.path = Path(path)
        self.incarnation = incarnation
        self.boot = boot
        self._lock = threading.Lock()
        self.reserved: int | None = None       # the bound: no number at or above it given
        self.rebooted = False                  # the file was written under another boot id
        self._n = 0                            # writes so far
        self._started: int | None = None       # ``start``'s answer
        # The boot id each write stores: this boot's once ``start`` journalled what it
        # skipped; until then the file's own, so a start after a crash skips them again.
        self._boot_on_disk = boot
        found = self._read_or_make()
        if found is not None:
            self._n = found["n"]
            if found["incarnation"] == incarnation:
                self.reserved = found["reserved"]
                self.rebooted = boot is None or found["boot_id"] != boot
                self._boot_on_disk = found["boot_id"]

    def _read_or_make(self) -> dict | None:
        """The newest valid record; None for a file just made (zeros), made now (its 1,024
        bytes allocated), or not readable."""
        try:
            data = self.path.read_bytes() if self.path.exists() else b""
            if len(data) < 2 * SECTOR:           # made now, or its making was cut short
                fd = open_created(self.path, os.O_WRONLY, 0o640)
                try:
                    os.posix_fallocate(fd, 0, 2 * SECTOR)
                    os.fsync(fd)
                finally:
                    os.close(fd)
        except OSError as exc:
            log.warning("the record-number reservation %s cannot be read or made (%s): "
                        "numbering goes on from what the pool and the state database hold",
                        self.path, exc)
            # A record it holds may count more writes than this agent knows: its own must
            # count past any, or the older record would be taken for the newer one.
            self._n = 1 << 40
            return None
        records, why = [], []
        for at in (0, SECTOR):
            sector = data[at:at + SECTOR]
            if not sector.strip(b"\0"):
                continue
            try:
                records.append(_unpack(sector))
            except ValueError as exc:
                why.append(f"bytes {at}-{at + SECTOR - 1}: {exc}")
        if why:
            log.warning("the record-number reservation %s is not valid (%s): %s", self.path,
                        "; ".join(why), "the other record is taken" if records else
                        "numbering goes on from what the pool and the state database hold")
        return max(records, key=lambda r: r["n"], default=None)

    def start(self, found: int,
              on_skipped: Callable[[tuple[int, int]], bool] | None = None) -> int:
        """The next number to give, given the highest next number the start ``found`` (before
        it gives any). Numbers it skips go to ``on_skipped`` as (first, last) — the journal's
        entry, which says whether it is on the disk — and only once it is does the file take
        this boot's id (``stopped`` may give it later); until then a start after a crash
        skips them (and journals them) again. Asked again (a pool opened a second time), the
        larger of ``found`` and the first answer."""
        with self._lock:
            nxt = max(found, self._started or 0)
            journalled = True
            if self.rebooted and self.reserved is not None and self.reserved > nxt:
                skipped, nxt = (nxt, self.reserved - 1), self.reserved
                if on_skipped is not None and not on_skipped(skipped):
                    journalled = False
                    log.error("the record numbers %d-%d skipped are not journalled yet (the "
                              "entry waits for room): a start after a crash skips them again",
                              *skipped)
            self._started = nxt
            if journalled:
                self._boot_on_disk = self.boot
            self.rebooted = False
            try:
                self._write(max(nxt, self.reserved or 0))
            except OSError as exc:      # the pool syncs its seals until a write succeeds
                log.error("the record-number reservation %s cannot be written (%s)",
                          self.path, exc)
            return nxt

    def cover(self, needed: int) -> None:
        """Every number below ``needed`` may now be written into a header: the bound first
        moves past it, durably (the pool calls this before it writes such a header)."""
        if self.reserved is not None and needed <= self.reserved:
            return
        with self._lock:
            if self.reserved is None or needed > self.reserved:
                self._write(needed + STEP)

    def stopped(self, next_record: int, journalled: bool = True) -> None:
        """A clean stop, the pool closed (synced): the numbers reserved and not given go back;
        this boot's id is written when nothing waits to be journalled."""
        with self._lock:
            if journalled:
                self._boot_on_disk = self.boot
            try:
                self._write(next_record)
            except OSError as exc:
                log.warning("the record-number reservation %s cannot be written at the stop "
                            "(%s): a start after the host started again skips up to %s",
                            self.path, exc, self.reserved)

    def _write(self, reserved: int) -> None:
        """The bound, durable, in the sector the older record holds (the newer one is kept
        until this write's sync returned)."""
        n = self._n + 1
        record = _pack({"n": n, "incarnation": self.incarnation,
                        "boot_id": self._boot_on_disk, "reserved": reserved})
        fd = os.open(self.path, os.O_WRONLY)
        try:
            if os.pwrite(fd, record, (n % 2) * SECTOR) != SECTOR:
                raise OSError(f"a short write to {self.path}")
            os.fdatasync(fd)
        finally:
            os.close(fd)
        self._n, self.reserved = n, reserved


def _pack(doc: dict) -> bytes:
    body = json.dumps(doc, sort_keys=True).encode()
    if len(body) > SECTOR - _HEAD:
        raise ValueError(f"a reservation record of {len(body)} bytes is over its sector")
    head = MAGIC + bytes([VERSION]) + crc32c(body).to_bytes(4, "little") \
        + len(body).to_bytes(2, "little")
    return (head + body).ljust(SECTOR, b"\0")


def _unpack(sector: bytes) -> dict:
    if len(sector) < _HEAD or sector[:4] != MAGIC or sector[4] != VERSION:
        raise ValueError(f"not a version-{VERSION} reservation record")
    length = int.from_bytes(sector[9:11], "little")
    body = sector[_HEAD:_HEAD + length]
    if length > SECTOR - _HEAD or crc32c(body) != int.from_bytes(sector[5:9], "little"):
        raise ValueError("its checksum fails (a write cut short)")
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"its body is not JSON ({exc})") from None
    if not isinstance(doc, dict) or any(
            not isinstance(doc.get(k), int) or isinstance(doc[k], bool) or doc[k] < 0
            for k in ("n", "reserved")) or not isinstance(doc.get("incarnation"), str) \
            or not isinstance(doc.get("boot_id"), str | None):
        raise ValueError("its fields are not a reservation's")
    return doc
