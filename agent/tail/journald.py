"""The journald source: the entries of the systemd journal, each one record.

**The reader** is ``journalctl --output=export --all --follow`` as a child of the agent, read by
a thread of the source's own: journalctl is the journal's own reader, maintained with the file
format (compact mode, compression, the files journald rotates and vacuums), and it needs no
binding to libsystemd (whose Python binding is not on PyPI in a maintained form, and whose C
library would be the agent's second native dependency). Its export format
(``agent/tail/journal_export.py``) costs it about a quarter of its JSON and needs no decoding:
where the native extension is installed it cuts the entries and makes the records
(``docket_native.JournalExport``, the same records), leaving the few it does not take on to
the Python code.

**The record**: ``format = "message"`` ships the entry's ``MESSAGE`` as it is; ``format =
"json"`` (the default) the entry's fields as one JSON object, names in the entry's order, a
field given more than once as the list of its values, values not UTF-8 decoded with
replacement (counted; a name not UTF-8, which journald does not write, is replaced
uncounted). An entry that comes without a message is read again by its cursor (journalctl
skips a field whose data the journal's writer is still linking: ``_complete``); one that has
none is shipped as its JSON in either format, counted (``journal_no_message``). Event time:
``__REALTIME_TIMESTAMP``. ``key_field`` names a field of the entry (``_HOSTNAME``,
``_SYSTEMD_UNIT``) whose value is the record's key.

**The checkpoint is the cursor**, advancing only as the pool seals. The pool's positions are
offsets, so the source numbers the entries it hands over (entry ``n`` covers the offsets
``n`` to ``n + 1`` of the source's row in the state database, a generation of its own with
the state ``journal``) and keeps the cursor of each entry until a seal passes it. With each
sealed offset the state database keeps the cursor it stands for (the row's ``anchors``: pairs
of offset and cursor, newest last; ``Cursors``). A start resumes after the newest kept cursor
at or below where the source stands (its sealed offset, a slot the pool recovered beyond it,
or where the start's self-check rewound it): entries between that cursor and a later slot the
pool kept are read again (duplicates, never a gap). The pairs kept always reach back to the
acknowledged offset, so a rewind finds one.

**Entries gone before they were read** (journald vacuumed or rotated away the files holding
them while the agent was stopped or behind): at a start from a cursor whose entry the journal no
longer holds, the gap is a loss-journal entry (``journal_entries_gone``) with its count when
the next entry's sequence number tells it (the same journal's numbering), open-ended when not.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import select
import shutil
import subprocess
import threading
from collections import deque
from collections.abc import Callable

import numpy as np

from ..buffer import BufferPool, Chunk
from ..buffer.framing import MAX_KEY_BYTES
from ..buffer.seams import Clock
from ..config import SourceConfig
from ..errors import StartupError
from ..routing import Template, topic_groups
from ..state.db import JOURNAL, StateDB
from ..state.journal import LossJournal
from ..telemetry import Metrics
from . import journal_export

log = logging.getLogger("docket.agent.journald")
JOURNALCTL = "journalctl"
READ_BYTES = 1 << 20
PIPE_BYTES = 1 << 20                    # journalctl's pipe (the kernel's default: 64 KiB)
BATCH_ENTRIES = 2_000                   # handed to the pool in one append at most
RESTART_S = 1.0                         # a journalctl that ended is started again after this
KEPT = 64                               # cursor pairs kept above the acknowledged offset


def journal_name(cfg: SourceConfig) -> str:
    """The row's path: which journal the source reads."""
    return f"journald:{cfg.journal_directory or 'local'}"


def match_args(cfg: SourceConfig) -> list[str]:
    """journalctl's filters for the source's settings."""
    args = []
    for unit in cfg.units:
        args += ["--unit", unit]
    for ident in cfg.identifiers:
        args += ["--identifier", ident]
    if cfg.priority is not None:
        args += ["--priority", str(cfg.priority)]
    return args + list(cfg.matches)


def base_args(cfg: SourceConfig, output: str = "json") -> list[str]:
    args = [JOURNALCTL, f"--output={output}", "--all", "--no-pager", "--quiet"]
    if cfg.journal_directory:
        args += ["--directory", cfg.journal_directory]
    return args


# With ``format = "message"`` an entry without a message is shipped as these fields (and the
# ones a key or a template names; the cursor, the times and the boot, which journalctl always
# prints). journalctl prints only them where the Python code cuts the entries (fewer fields to
# cut: 5 CPU-µs an entry of ~25 fields against 14); where the native extension does, every
# field: journalctl's filter costs it more than it saves (5.5 CPU-µs an entry against 4.4,
# measured) and the native cut skips fields at about 0.02 µs each.
MESSAGE_FIELDS = ("MESSAGE", "PRIORITY", "SYSLOG_IDENTIFIER", "_SYSTEMD_UNIT", "_PID",
                  "_HOSTNAME", "_TRANSPORT")


def message_fields(cfg: SourceConfig) -> list[str] | None:
    """The fields an entry of a ``format = "message"`` source is shipped with when it has no
    message; None with ``format = "json"`` (every field)."""
    if cfg.format != "message":
        return None
    named = [f for text in (cfg.topic, cfg.key) if text for f in Template(text).fields]
    return list(dict.fromkeys([*MESSAGE_FIELDS, *([cfg.key_field] if cfg.key_field else []),
                               *named]))


def output_fields(cfg: SourceConfig, native: bool = False) -> list[str]:
    """journalctl's --output-fields for the source: none with ``format = "json"`` or where the
    native extension cuts the entries (every field)."""
    wanted = message_fields(cfg)
    return [] if wanted is None or native else ["--output-fields=" + ",".join(wanted)]


def parse_cursor(cursor: str) -> tuple[str, int] | None:
    """(sequence number id, sequence number) of a cursor, None when it has none."""
    parts = dict(p.split("=", 1) for p in cursor.split(";") if "=" in p)
    try:
        return parts["s"], int(parts["i"], 16)
    except (KeyError, ValueError):
        return None


def _first_entry(args: list[str], timeout_s: float = 30) -> tuple[dict | None, bool]:
    """The first entry journalctl prints for ``args`` (without --follow), or None when it
    printed none; and whether journalctl answered (False: it failed or timed out, and nothing
    can be said)."""
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as proc:
        try:
            ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
            line = proc.stdout.readline() if ready else None
            answered = line is not None and (bool(line) or proc.wait(timeout_s) == 0)
        except subprocess.TimeoutExpired:
            line, answered = None, False
        finally:
            proc.kill()
    try:
        return (json.loads(line) if line else None), answered
    except ValueError:
        return None, False


def _child(args: list[str]) -> list[str]:
    """``args`` run so that the child dies with the reader thread that started it (util-linux
    ``setpriv --pdeathsig``: a SIGKILLed agent leaves no journalctl behind); as they are where
    setpriv is missing."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *args] if setpriv else args


class Cursors:
    """The (offset, cursor) pairs a journald source's row keeps, newest last; cursor None:
    the journal's head. Pruned to those at or above the newest at or below the acknowledged
    offset (always kept), thinned to ``KEPT`` (a thinned pair only makes a restart read more
    again, never less)."""

    def __init__(self, pairs: list[tuple[int, str | None]]):
        self.pairs = pairs

    @classmethod
    def load(cls, blob: bytes | None) -> Cursors:
        try:
            pairs = [(int(o), c) for o, c in json.loads(blob)] if blob else []
        except (ValueError, TypeError):
            pairs = []
        return cls(pairs)

    def dump(self) -> bytes:
        return json.dumps(self.pairs, separators=(",", ":")).encode()

    def at_or_below(self, offset: int) -> tuple[int, str | None] | None:
        found = [p for p in self.pairs if p[0] <= offset]
        return found[-1] if found else None

    def add(self, offset: int, cursor: str, acked: int) -> None:
        if self.pairs and offset <= self.pairs[-1][0]:
            return
        floor = self.at_or_below(acked)
        kept = [p for p in self.pairs if floor is None or p[0] >= floor[0]]
        kept.append((offset, cursor))
        while len(kept) > KEPT:                      # every other one between the ends goes
            kept = kept[:1] + kept[1:-1:2] + kept[-1:]
        self.pairs = kept


class JournaldSource:
    def __init__(self, cfg: SourceConfig, pool: BufferPool, db: StateDB, journal: LossJournal,
                 metrics: Metrics, recovered: dict[int, int], clock: Clock | None = None,
                 on_data: Callable[[], None] | None = None):
        if shutil.which(JOURNALCTL) is None:
            raise StartupError(f"journald source {cfg.index}: no {JOURNALCTL} on the PATH",
                               hint="install systemd (journalctl reads the journal)")
        self.cfg = cfg
        self.pool = pool
        self.db = db
        self.journal = journal
        self.metrics = metrics
        self.clock = clock or Clock()
        self.on_data = on_data or (lambda: None)
        self.name = journal_name(cfg)
        self._filtered = bool(match_args(cfg))
        self.label = cfg.fallback_topic or cfg.topic    # a routed source's counts go here
        routed = Template(cfg.topic)
        self._topic = None if routed.is_static else routed   # topic = "journal.{_SYSTEMD_UNIT}"
        self._key = Template(cfg.key) if cfg.key is not None else None
        self._routed = self._topic is not None or self._key is not None
        self._keyed = self._key is not None or bool(cfg.key_field)
        self._native = self._native_maker()
        shown = message_fields(cfg)
        self._shown = None if shown is None else frozenset(shown)
        self._lock = threading.Lock()         # _handed and _last: the reader thread and the loop
        self._handed: deque[tuple[int, str]] = deque()   # (end offset, cursor) not yet sealed
        self._stop = threading.Event()
        self._proc: subprocess.Popen | None = None
        self._repeat: str | None = None      # the cursor journalctl resumes at, read before
        self.read_entries = 0
        self.sid, self.offset, cursor = self._place(recovered)
        # No slot of this source seals an end past what it has handed over whole: a batch goes
        # to its topics one after another, a stop may cut one short, and a slot of the source's
        # run before a reload may hold entries past where the new one resumes.
        pool.pending(self.sid, self.offset)
        self._last = cursor                   # the newest cursor handed over (None: the head)
        self._thread = threading.Thread(target=self._run, name=f"docket-journald-{cfg.index}",
                                        daemon=True)
        self._thread.start()

    # -- where to start ----------------------------------------------------------------------
    def fingerprint(self) -> bytes:
        """What a row's numbering depends on: the entries a source takes (its journal is the
        row's path; its filters) and what it makes of them (topic, format, key)."""
        return json.dumps([self.cfg.topic, match_args(self.cfg), self.cfg.format,
                           self.cfg.key_field, self.cfg.key]).encode()

    def _place(self, recovered: dict[int, int]) -> tuple[int, int, str | None]:
        """The source's row, the offset it resumes at and the cursor it reads from; a gap
        behind that cursor is journalled. A row numbers the entries of one journal, topic,
        filters, format and key: the numbers mean the same entries at every start (a slot the
        pool kept and the offsets Kafka acknowledged stand for the entries read again under
        them). When this source's settings change (a row at its place in the configuration,
        on its journal), a new row numbers on from the old row's newest cursor (the old row's
        slots are still sent); a source moved to another place in the configuration keeps its
        row; a source new to its journal starts where ``read_from`` says."""
        mine = self.fingerprint()
        rows = [r for r in self.db.all_files()
                if r["state"] == JOURNAL and r["path"] == self.name]
        same = [r for r in rows if r["fingerprint"] == mine]
        if same:
            return self._resume(same[-1], recovered)
        former = [r for r in rows if r["source_index"] == self.cfg.index]
        cursor, why = None, "its start"
        if former:
            pair = Cursors.load(former[-1]["anchors"]).at_or_below(former[-1]["sealed_offset"])
            cursor = pair[1] if pair else None
            why = "the last entry read with its former settings"
        elif self.cfg.read_from == "end":
            tail, answered = _first_entry(base_args(self.cfg) + ["--lines=1", "--reverse",
                                                                  *match_args(self.cfg)])
            if not answered:
                raise StartupError(f"journald source {self.cfg.index}: journalctl could not "
                                   f"read {self.name}", hint="check that the agent's user may "
                                   "read the journal (group systemd-journal)")
            cursor = tail.get("__CURSOR") if tail else None
            why = "its end"
        sid = self.db.add_file(self.cfg.index, 0, 0, mine, self.name, state=JOURNAL,
                               anchors=Cursors([(0, cursor)]).dump())
        log.info("journald source %d: %s read from %s", self.cfg.index, self.name, why)
        return sid, 0, cursor

    def _resume(self, row: dict, recovered: dict[int, int]) -> tuple[int, int, str | None]:
        sid = row["source_id"]
        at = max(row["sealed_offset"], recovered.get(sid, 0))
        pairs = Cursors.load(row["anchors"])
        pair = pairs.at_or_below(at) or (0, None)
        if pair[0] < at:
            log.warning("journald source %d: the entries %d-%d are in the pool but their cursor "
                        "was not stored: they are read again (duplicates, no loss)",
                        self.cfg.index, pair[0], at)
        if pair[1] is not None and self._gone(pair[1], sid):
            # Entries after the cursor are gone: numbered from it again, the old numbers would
            # stand for other entries than the pool's slots and Kafka's acknowledgements mean.
            sid = self.db.add_file(self.cfg.index, 0, 0, row["fingerprint"], self.name,
                                   state=JOURNAL, anchors=Cursors([(0, pair[1])]).dump())
            return sid, 0, pair[1]
        log.info("journald source %d: %s resumes after entry %d", self.cfg.index, self.name,
                 pair[0])
        return sid, pair[0], pair[1]

    def _gone(self, cursor: str, sid: int) -> bool:
        """Whether the journal no longer holds the entry of ``cursor``; the entries after it
        that it no longer holds are journalled. A journalctl that does not answer says
        nothing: not gone (reading from the cursor finds out again)."""
        at, answered = _first_entry(base_args(self.cfg) + ["--cursor", cursor])
        if not answered:
            log.warning("journald source %d: journalctl did not answer whether the journal "
                        "still holds the entry read last", self.cfg.index)
            return False
        if at is not None and at.get("__CURSOR") == cursor:
            return False                               # still there: everything after it too
        detail = "the journal no longer holds the entry read last"
        if at is None:
            detail = "the journal holds no entry at or after the one read last"
        mine, theirs = parse_cursor(cursor), parse_cursor(at["__CURSOR"]) if at else None
        events, open_ended = -1, True
        if mine and theirs and mine[0] == theirs[0] and theirs[1] > mine[1]:
            events, open_ended = theirs[1] - mine[1] - 1, False
            if self._filtered:                          # of every unit: an upper bound
                detail += f"; {events} entries of the whole journal, not only those matched"
        if events == 0:
            return True                                # gone, and nothing after it with it
        log.error("journald source %d: entries after the last one read are gone from the "
                  "journal (vacuumed or rotated away before they were read): %s", self.cfg.index,
                  f"{events} entries" if events > 0 else "how many is unknown")
        self.journal.record("journal_entries_gone", self.label, events, source=self.name,
                            source_id=sid, detail=f"{detail} (after cursor {cursor})",
                            open_ended=open_ended)
        return True

    # -- reading -----------------------------------------------------------------------------
    def _command(self) -> list[str]:
        # --follow alone: the last 10 entries, and of the newest boot only (also from a
        # cursor: the unread rest of the boot before a reboot would be skipped unsaid);
        # --merge lifts the boot, --no-tail the 10.
        args = base_args(self.cfg, "export") + ["--follow", "--no-tail", "--merge"]
        with self._lock:
            last = self._last
        # At the cursor, not after it: --after-cursor skips the first entry at the cursor's
        # place even when it is another (the cursor's own vacuumed away): one entry lost unsaid.
        # The cursor's own entry, if it comes, is dropped (``_hand``).
        self._repeat = last
        if last is not None:
            args.append(f"--cursor={last}")
        return args + output_fields(self.cfg, self._native is not None) + match_args(self.cfg)

    def _run(self) -> None:
        first = True
        while not self._stop.is_set():
            try:
                with self._lock:
                    last = self._last
                if not first and last is not None:
                    self._gone(last, self.sid)      # vacuumed while it was down: journalled
                first = False                       # (read on: the numbers go on, not again)
                self._follow()
            except Exception:
                log.exception("journald source %d: reading the journal failed", self.cfg.index)
            if not self._stop.wait(RESTART_S):
                log.warning("journald source %d: journalctl ended; started again after the "
                            "last entry read", self.cfg.index)

    def _follow(self) -> None:
        proc = subprocess.Popen(_child(self._command()), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        self._proc = proc
        out, err = proc.stdout.fileno(), proc.stderr.fileno()
        os.set_blocking(out, False)
        try:                                  # fewer, fuller reads (and fewer switches)
            fcntl.fcntl(out, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            pass                              # above the host's pipe-max-size: as it is
        os.set_blocking(err, False)
        held, said = b"", b""
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([out, err], [], [], 0.2)
                if err in ready:                # read as it comes: a full pipe would stop it
                    said = (said + os.read(err, READ_BYTES))[-4096:]
                    *lines, said = said.split(b"\n")
                    for line in lines:
                        log.warning("journald source %d: journalctl: %s", self.cfg.index,
                                    line.decode(errors="replace"))
                if out not in ready:
                    continue
                data = os.read(out, READ_BYTES)
                if not data:
                    break
                buf = held + data if held else data
                entries, lacking, begin = self._cut(buf)
                held = buf[begin:]
                if lacking:
                    self._complete(entries, lacking)
                for i in range(0, len(entries), BATCH_ENTRIES):
                    self._hand(entries[i:i + BATCH_ENTRIES])
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
            proc.stderr.close()
            self._proc = None
        if not self._stop.is_set():
            log.error("journald source %d: journalctl ended (exit %s)%s", self.cfg.index,
                      proc.returncode, f": {said.decode(errors='replace')}" if said else "")

    def _cut(self, buf: bytes) -> tuple[list[tuple[str, tuple | None]], list[tuple], int]:
        """The whole entries of ``buf`` as (cursor, (topic, value, key, event time)), made by
        the native extension where it takes them on, here where not; an entry that came
        without a message is (cursor, None) there, and (its place, its fields, its bytes) in
        the second list, to be made by ``_complete``; and where the first entry not yet whole
        begins. An entry without a cursor is counted and left out."""
        out: list[tuple[str, tuple | None]] = []
        lacking: list[tuple] = []
        if self._native is None:
            cut, begin = journal_export.cut(buf)
            for b, e, fields in cut:
                self._make(out, lacking, journal_export.fields_of(fields), buf, b, e)
            return out, lacking, begin
        begin, cut = self._native.cut(buf, 0)
        for b, e, item in cut:
            if item is None:          # the native extension leaves every entry without a message
                entry = journal_export.fields_of(journal_export.cut(buf[b:e])[0][0][2])
                self._make(out, lacking, entry, buf, b, e)
            else:
                out.append(item)
        return out, lacking, begin

    def _make(self, out: list[tuple[str, tuple | None]], lacking: list[tuple],
              entry: dict[str, bytes | list[bytes]], buf: bytes, begin: int, end: int) -> None:
        """``entry`` made (``_made``) and put at the end of ``out``; one without a message
        only noted (``_cut``)."""
        if "MESSAGE" not in entry:
            cursor = self._cursor(entry)
            if cursor is not None:
                lacking.append((len(out), entry, buf[begin:end]))
                out.append((cursor, None))
            return
        item = self._made(entry, buf, begin, end)
        if item is not None:
            out.append(item)

    def _made(self, entry: dict[str, bytes | list[bytes]], buf: bytes, begin: int,
              end: int) -> tuple[str, tuple] | None:
        """(cursor, record) of the entry ``entry`` (``journal_export.fields_of``;
        ``buf[begin:end]``: the entry as it came), None when it has no cursor (counted)."""
        cursor = self._cursor(entry)
        if cursor is None:
            return None
        try:
            return cursor, self._record(entry)
        except Exception:                   # never wedge on one entry: shipped as it came
            log.exception("journald source %d: an entry could not be made a record; "
                          "shipped in the export format", self.cfg.index)
            self._bad("journal_unparsable")
            return cursor, (self.label, buf[begin:end], None, self.clock.time_ms())

    def _cursor(self, entry: dict[str, bytes | list[bytes]]) -> str | None:
        """The entry's cursor; None, counted ``journal_unparsable``, when it has none (or
        more than one)."""
        cursor = entry.get("__CURSOR")
        if not isinstance(cursor, bytes):
            self._bad("journal_unparsable")
            return None
        return cursor.decode("utf-8", "replace")

    def _complete(self, entries: list[tuple[str, tuple | None]], lacking: list[tuple]) -> None:
        """The entries ``lacking`` (``_cut``) came without a message: each is read again by its
        cursor and made from what it holds now. journalctl skips a field of an entry whose
        data the journal's writer is still linking (systemd's reader takes the field's object
        for damaged for an instant: "data object is bad, skipping over it", said at debug
        level only), so an entry read as it is being written may come without its message; a
        moment later it is whole. One journalctl for them all, from the first to the last."""
        cursors = [entries[i][0] for i, _e, _r in lacking]
        self._finish(entries, lacking, self._read_again(cursors[0], set(cursors)))

    def _finish(self, entries: list[tuple[str, tuple | None]], lacking: list[tuple],
                again: dict[str, dict]) -> None:
        """Make the entries ``lacking`` in their places of ``entries``: each as ``again`` holds
        it where it has a message there (``outcome="whole"``), else as it came, shipped as its
        fields and counted ``journal_no_message`` (``none``: read again without one;
        ``unread``: not read again). Nothing is counted once the source stops (nothing more
        is handed over: the next start reads them again)."""
        for i, entry, raw in lacking:
            newer = again.get(entries[i][0])
            whole = newer is not None and "MESSAGE" in newer
            # Both have their cursor (``_make`` noted only such entries; ``again`` is keyed by
            # it), so the entry is made.
            entries[i] = self._made(newer if whole else entry, raw, 0, len(raw))
            if self._stop.is_set():
                continue
            outcome = "whole" if whole else "none" if newer is not None else "unread"
            self.metrics.inc("agent_source_journal_read_again_total", outcome=outcome,
                             topic=self.label)
            if not whole:
                self._bad("journal_no_message")

    def _read_again(self, first: str, cursors: set[str],
                    timeout_s: float = 10.0) -> dict[str, dict]:
        """The entries of ``cursors`` (``journal_export.fields_of`` each), read by a
        journalctl of its own from ``first`` on, ended once it printed them all; those it did
        not print within ``timeout_s`` (or before a stop, or a journalctl that failed) are
        left out."""
        args = (base_args(self.cfg, "export") + ["--merge", f"--cursor={first}"]
                + output_fields(self.cfg, self._native is not None) + match_args(self.cfg))
        found: dict[str, dict] = {}
        held = b""
        deadline = self.clock.monotonic_ns() / 1e9 + timeout_s
        proc = None
        try:
            proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            out = proc.stdout.fileno()
            while len(found) < len(cursors) and not self._stop.is_set():
                left = deadline - self.clock.monotonic_ns() / 1e9
                if left <= 0:
                    log.warning("journald source %d: journalctl did not read the entries that "
                                "came without a message again within %.0f s", self.cfg.index,
                                timeout_s)
                    break
                if not select.select([out], [], [], min(left, 0.2))[0]:
                    continue
                data = os.read(out, READ_BYTES)
                if not data:
                    break
                buf = held + data
                cut, begin = journal_export.cut(buf)
                held = buf[begin:]
                for _b, _e, fields in cut:
                    entry = journal_export.fields_of(fields)
                    cursor = entry.get("__CURSOR")
                    if isinstance(cursor, bytes):
                        text = cursor.decode("utf-8", "replace")
                        if text in cursors:
                            found[text] = entry
        except (OSError, ValueError) as exc:  # ValueError: ExportError, a descriptor too high
            log.warning("journald source %d: reading again the entries that came without a "
                        "message failed: %s", self.cfg.index, exc)
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
                proc.stdout.close()
        return found

    def _hand(self, entries: list[tuple[str, tuple]]) -> None:
        """Append ``entries`` ((cursor, record) each), each to its topic, waiting while the
        pool is full; their cursors kept until a seal passes them. Once the source stops
        nothing more is handed over (what a stop cut short is read again)."""
        if self._stop.is_set() or not entries:
            return
        repeat, self._repeat = self._repeat, None
        if entries[0][0] == repeat:
            entries = entries[1:]             # the entry read last, where journalctl resumed
        cursors = [c for c, _r in entries]
        records = [r for _c, r in entries]
        if not records:
            return
        base = self.offset
        with self._lock:
            self._handed.extend((base + i + 1, c) for i, c in enumerate(cursors))
        left = len(records)                   # the first entry of the batch not handed over
        for topic, idx, later in topic_groups([r[0] for r in records]):
            done = self._append(topic, records, idx, base, base + later)
            if done < len(idx):
                # Stopped: this topic's rest and every later topic's records are read again
                # (none of them appended: no seal passes the first of them).
                left = min(idx[done], later)
                break
        self.offset = base + left
        self.pool.pending(self.sid, self.offset)
        with self._lock:
            self._last = cursors[left - 1] if left else self._last
            if left < len(records):
                while self._handed and self._handed[-1][0] > self.offset:
                    self._handed.pop()
        self.read_entries += left

    def _append(self, topic: str, records: list[tuple], idx: list[int], base: int,
                later: int) -> int:
        """The records ``idx`` of the batch to ``topic``, positioned at their entries' numbers
        (a topic's slot spans the entries between its records too: the pool keeps the sealed
        end below what another topic's slot still fills, and below ``later``, the first
        entry of a topic not yet appended); returns how many were appended. A slot that
        fills within the batch covers its own entries (were its end held at the batch's
        start, a kill after Kafka acknowledged it would read them again, unsaid)."""
        first = idx[0]
        chunk = Chunk.of_values([records[i][1] for i in idx], [records[i][3] for i in idx],
                                [records[i][2] for i in idx] if self._keyed else None,
                                at=np.array(idx, np.int64) - first,
                                at_end=idx[-1] + 1 - first)
        done = parts = 0
        while done < len(idx):
            part = chunk if done == 0 else _from(chunk, done)
            res = self.pool.append(topic, part, source=self.sid,
                                   source_start=base + idx[done], pending=later,
                                   timeout_s=0.0 if self._stop.is_set() else 0.5,
                                   parts_done=parts)
            done += res.records
            parts = res.parts                 # an entry longer than a slot: on from its part
            self.on_data()
            if self._stop.is_set() and done < len(idx):
                break
        self.metrics.inc("agent_source_read_events_total", done, topic=topic)
        self.metrics.inc("agent_source_read_bytes_total",
                         sum(len(records[i][1]) for i in idx[:done]), topic=topic)
        return done

    def _record(self, entry: dict) -> tuple[str, bytes, bytes | None, int]:
        """(topic, value, key, event time) of one entry (``journal_export.fields_of``)."""
        try:
            ts = int(entry.get("__REALTIME_TIMESTAMP")) // 1000
        except (TypeError, ValueError):
            self._bad("timestamp_unparsable")
            ts = self.clock.time_ms()
        message = entry.get("MESSAGE")
        if self._shown is not None and not isinstance(message, bytes):
            # The message form ships this entry as fields (no message, or two): the ones
            # journalctl prints with --output-fields, whichever of the two cut it.
            entry = {k: v for k, v in entry.items()
                     if k in self._shown or k.startswith("__") or k == "_BOOT_ID"}
        fields = None
        if self.cfg.format == "json" or message is None or self._routed:
            fields = {k: self._text(v) for k, v in entry.items()}
            if self.cfg.add_fields:
                fields.update(self.cfg.add_fields)
        topic = self.cfg.topic
        if self._topic is not None:
            topic = self._topic.topic(fields)
            if topic is None:
                self._bad("routed_to_fallback")
                topic = self.cfg.fallback_topic
        key = None
        if self._key is not None:
            rendered = self._key.render(fields)
            if rendered is None:
                self._bad("key_template_unmatched")
            else:
                key = rendered.encode()[:MAX_KEY_BYTES]
        elif self.cfg.key_field:
            raw = self._text(entry.get(self.cfg.key_field))
            if isinstance(raw, list):            # the field given more than once: the first
                raw = raw[0] if raw and isinstance(raw[0], str) else None
            if raw is None:
                self._bad("key_field_missing")
            else:
                key = str(raw).encode()[:MAX_KEY_BYTES]
        if self.cfg.format == "message" and isinstance(message, bytes):
            return topic, message, key, ts
        if fields is None:
            fields = {k: self._text(v) for k, v in entry.items()}
        return topic, json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode(), \
            key, ts

    def _text(self, value):
        """A field's value as text (decoded, replaced where not UTF-8, counted); a field given
        more than once: the list of its values."""
        if isinstance(value, list):
            return [self._text(v) for v in value]
        if value is None:
            return None
        try:
            return value.decode()
        except UnicodeDecodeError:
            self._bad("invalid_utf8")
            return value.decode(errors="replace")

    def _native_maker(self):
        """The native extension's reader of this source's entries (``JournalExport``: the same
        records), or None where it is not installed or cannot make them: with a topic or key
        template, or fields added to the JSON form."""
        if self._routed or (self.cfg.format == "json" and self.cfg.add_fields):
            return None
        try:
            from docket_native import JournalExport
        except ImportError:
            return None
        return JournalExport(self.cfg.topic, self.cfg.format == "json", self.cfg.key_field,
                             MAX_KEY_BYTES)

    def _bad(self, kind: str, count: int = 1) -> None:
        self.metrics.inc("agent_source_bad_input_total", count, kind=kind, topic=self.label)

    # -- checkpoints -------------------------------------------------------------------------
    def anchors(self, ends: dict[int, int]) -> dict[int, bytes]:
        """The row's cursor pairs with the cursor the sealed end stands for (the loop, before
        the state database writes the sealed offsets)."""
        end = ends.get(self.sid)
        if end is None:
            return {}
        with self._lock:
            while self._handed and self._handed[0][0] < end:
                self._handed.popleft()
            if not self._handed or self._handed[0][0] != end:
                return {}
            cursor = self._handed[0][1]       # kept: a refused write asks again
        row = self.db.get(self.sid)
        pairs = Cursors.load(row["anchors"])
        pairs.add(end, cursor, row["acked_offset"])
        return {self.sid: pairs.dump()}

    def describe(self) -> dict:
        """For ``/status``."""
        return {"source": self.cfg.index, "type": "journald", "journal": self.name,
                "topic": self.cfg.topic, "entries_read": self.read_entries,
                "reader": "running" if self._proc is not None else "starting",
                "records": "python" if self._native is None else "native"}

    def abandon(self) -> None:
        """For tests that simulate a SIGKILL: a stopped source hands nothing more over (what it
        had read is read again from its cursor), so this is ``close``."""
        self.close()

    def close(self) -> None:
        """Stop reading: journalctl ends, the reader thread ends (within a second: it waits
        on nothing longer)."""
        self._stop.set()
        self._thread.join(timeout=10)
        if self._thread.is_alive():
            log.error("journald source %d: its reader did not stop within 10 s", self.cfg.index)


def _from(chunk: Chunk, k: int) -> Chunk:
    """The records of ``chunk`` from the k-th on, positioned from there."""
    keys = chunk.keys[k:] if chunk.keys is not None else None
    at = chunk.at[k:] - chunk.at[k]
    return Chunk(chunk.data, chunk.starts[k:], chunk.lengths[k:], chunk.timestamps[k:], keys,
                 chunk.end, at=at, at_end=chunk.at_end - int(chunk.at[k]))
