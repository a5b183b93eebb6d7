"""The loss journal: every event the agent does not deliver, durably, with why.

``state_dir/loss-journal.jsonl``, one JSON object per line, fsync'd as it is written::

    {"ts_ms": ..., "reason": "oversize_dropped" | "oversize_truncated" | "buffer_full" |
     "corrupt" | "kafka_<error>" | "deleted_unread" | "unaccounted_bytes" |
     "cut_back_unread" | "udp_dropped" | "listener_stopped" | "numbers_unused",
     "topic": ... (null for "numbers_unused"), "events": N (or -1 if unknown), "bytes": N,
     "source": path or slot,
     "range": [start, end] (bytes of the source) or null,
     "source_id": the file generation's id in the state database, or null,
     "open_ended": true when bytes after ``range`` may have existed too and are unknown,
     "records": [first, last] (the events' record numbers, ``docket-seq``, inclusive) or null,
     "incarnation": the number space ``records`` belongs to (absent in entries of earlier
                    versions),
     "detail": "..."}

``records`` is set for every drop of events that had, or took, record numbers: a record
dead-lettered, a slot dropped under ``drop_oldest`` or quarantined with a readable header, an
oversized line dropped (it takes a number so the numbers stay dense). So every hole in an
origin's numbers downstream is either in the journal or a loss. ``numbers_unused`` (zero
events) holds numbers a start skipped and gives to no event (``agent/state/numbers.py``).
Bytes never read (a file deleted or truncated before reading) never had numbers: they are
journalled by byte range.

An entry with ``events`` = -1 is a loss of unknown size: the bytes are gone before the agent
could count their lines (a file deleted or truncated before it was read). Such entries reach the
audit as ``dropped_unknown`` of the window they were found in, so the reconciler can flag that
window as a possible loss although every count agrees.

A line the file system refuses for lack of space (``agent/state/diskguard.py``) is cut back off the
file (no half line is left) and kept in memory, in order, to be written before the next entry
or at the next ``retry``; the entry counts at once (metrics, audit, record numbers), since the
events were not delivered either way. Only a crash while such lines wait loses them.

``LossJournal.record`` is the one function that both writes the entry and counts it in the
agent's metrics (``agent_dropped_events_total{reason}`` for events,
``agent_loss_journal_entries_total{reason}`` for entries), so no counter exists without its entry.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from ..buffer.durable import make_folder, open_created
from ..buffer.seams import Clock
from ..telemetry import Metrics
from .diskguard import disk_full

log = logging.getLogger("docket.agent.journal")


class LossJournal:
    def __init__(self, path: Path, metrics: Metrics,
                 on_record: Callable[..., None] | None = None, clock: Clock | None = None,
                 incarnation: str | None = None):
        make_folder(path.parent)
        self.incarnation = incarnation   # stamped on each entry: whose record numbers
        self.clock = clock or Clock()
        self.path = path
        self.metrics = metrics
        self._lock = threading.Lock()
        self._on_record = on_record      # the audit emitter: drops per (topic, window)
        self._unwritten: list[bytes] = []   # lines refused for lack of space, in order
        self._refused_logged = False
        self.on_refused: Callable[[BaseException], None] | None = None    # the disk guard
        self._fd = open_created(path, os.O_WRONLY | os.O_APPEND, 0o640)
        size = os.fstat(self._fd).st_size
        if size:                          # a line a crash cut short: end it, so the next
            with open(path, "rb") as f:   # entry starts on a line of its own
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    os.write(self._fd, b"\n")
                    os.fsync(self._fd)
        # The record numbers journalled in this number space (an entry of another incarnation
        # names numbers of a lost state's), kept in memory (the audit asks every round).
        self._numbers = [tuple(e["records"]) for e in self.entries() if e.get("records")
                         and e.get("incarnation", incarnation) == incarnation]

    def record(self, reason: str, topic: str, events: int, *, nbytes: int = 0,
               source: str = "", byte_range: tuple[int, int] | None = None,
               detail: str = "", event_ts_ms: int | None = None, source_id: int | None = None,
               open_ended: bool = False, records: tuple[int, int] | None = None) -> None:
        self._append(reason, topic, events, nbytes=nbytes, source=source, byte_range=byte_range,
                     detail=detail, source_id=source_id, open_ended=open_ended,
                     records=records)
        self.metrics.dropped(reason, topic, max(events, 0), intentional=reason in INTENTIONAL,
                             nbytes=nbytes)
        self.metrics.inc("agent_loss_journal_entries_total", reason=reason, topic=topic,
                         size="unknown" if events < 0 else "known")
        # One WARNING per entry, never held back (each names what it lost).
        log.warning("loss journal: %s event(s) of topic %s not delivered (%s)%s; entry in %s",
                    "an unknown number of" if events < 0 else events, topic, reason,
                    f" from {source}" if source else "", self.path)
        if self._on_record is not None:
            self._on_record(topic, reason, events, event_ts_ms)

    def unused(self, records: tuple[int, int], detail: str) -> bool:
        """Record numbers no event is given from now on (``numbers_unused``, zero events): a
        start skipped them (``agent/state/numbers.py``). Some may have gone to events Kafka
        took before a power loss undid their count, the rest to none; no event is lost for
        them, but the numbers would be holes downstream, so the entry holds them as a drop's
        does (the audit's ``missing``, ``next_number``) and no tier takes them for a loss.
        Whether the entry is on the disk now (not waiting for room)."""
        written = self._append("numbers_unused", None, 0, detail=detail, records=records)
        log.info("loss journal: record numbers %d-%d given to nothing (%s); entry in %s",
                 records[0], records[1], detail, self.path)
        return written

    def _append(self, reason: str, topic: str | None, events: int, *, nbytes: int = 0,
                source: str = "", byte_range: tuple[int, int] | None = None, detail: str = "",
                source_id: int | None = None, open_ended: bool = False,
                records: tuple[int, int] | None = None) -> bool:
        """Write one entry (after any waiting for room) and note its numbers; whether every
        entry is on the disk now."""
        entry = {"ts_ms": self.clock.time_ms(), "reason": reason, "topic": topic,
                 "events": events, "bytes": nbytes, "source": source,
                 "range": list(byte_range) if byte_range else None, "source_id": source_id,
                 "open_ended": open_ended, "records": list(records) if records else None,
                 "detail": detail}
        if self.incarnation is not None:
            entry["incarnation"] = self.incarnation
        line = (json.dumps(entry, sort_keys=True) + "\n").encode()
        with self._lock:
            self._unwritten.append(line)
            self._write_unwritten()
            if records:
                self._numbers.append(tuple(records))
            return not self._unwritten

    def retry(self) -> bool:
        """Write the lines a full disk refused; True when there were some and all are
        written now."""
        with self._lock:
            if not self._unwritten:
                return False
            self._write_unwritten()
            return not self._unwritten

    def _write_unwritten(self) -> None:
        """Append the waiting lines, oldest first, each whole or not at all (under the lock)."""
        while self._unwritten:
            line = self._unwritten[0]
            size = os.fstat(self._fd).st_size
            try:
                done = os.write(self._fd, line)
                if done < len(line):
                    raise OSError(errno.ENOSPC, "No space left on device (a short write)")
                os.fsync(self._fd)
            except OSError as exc:
                if not disk_full(exc):
                    raise
                os.ftruncate(self._fd, size)       # no half line stays behind
                if not self._refused_logged:       # once until they are written
                    log.error("loss journal: entries wait in memory until there is room: %s",
                              exc)
                    self._refused_logged = True
                if self.on_refused is not None:
                    self.on_refused(exc)
                return
            self._unwritten.pop(0)
        self._refused_logged = False

    def waiting(self) -> int:
        """Lines a full disk refused, waiting in memory."""
        return len(self._unwritten)

    def dropped_numbers(self) -> list[list[int]]:
        """The record-number ranges journalled, sorted and merged (inclusive pairs)."""
        with self._lock:
            ranges = sorted(self._numbers)
        out: list[list[int]] = []
        for a, b in ranges:
            if out and a <= out[-1][1] + 1:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return out

    def next_number(self) -> int:
        """One past the highest record number journalled in this number space (0 if none).
        An entry is fsync'ed before the drop it names is reported; the pool's own count of
        numbers given (its file header) is synced only at the next seal, so after a power loss
        the journal may be the one place that knows a number was given."""
        with self._lock:
            return max((b for _a, b in self._numbers), default=-1) + 1

    def entries(self) -> list[dict]:
        """Every entry (``read_entries``)."""
        return read_entries(self.path)

    def close(self) -> None:
        for line in self._unwritten:        # the last place they can be kept
            log.error("loss journal: an entry the full disk refused, not written: %s",
                      line.decode().strip())
        os.close(self._fd)


def read_entries(path: Path) -> list[dict]:
    """Every entry of the journal at ``path`` (none when there is no file); a line a crash cut
    short (no newline, not JSON) is skipped."""
    out = []
    try:
        f = open(path)
    except FileNotFoundError:
        return []
    with f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if isinstance(entry, dict):
                out.append(entry)
    return out


# Reasons a configured policy chose; the others are failures.
INTENTIONAL = {"oversize_dropped", "oversize_truncated", "buffer_full"}
