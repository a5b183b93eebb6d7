"""Container runtimes' log files: their framing removed, partial lines joined, metadata kept.

A file source with ``format = "cri"`` or ``format = "docker"`` reads what a container runtime
writes for a container's stdout and stderr:

- CRI (containerd, CRI-O; the kubelet's ``/var/log/pods``)::

      2026-12-03T21:00:00.123456789Z stdout F the line's text
      <time RFC 3339 nano> <stream> <tag> <content>

  The tag's first part is ``P`` (a partial line: the runtime cut a long line, its rest follows
  on the next lines) or ``F`` (the line's last part); more parts may follow after ``:``.
- docker's ``json-file`` driver (``/var/lib/docker/containers/<id>/<id>-json.log``)::

      {"log":"the line's text\\n","stream":"stdout","time":"2026-12-03T21:00:00.123456789Z"}

  A ``log`` that does not end with a newline is a partial line (docker cuts at 16 KiB).

One *entry* is the line the application wrote, joined from the runtime's parts (``P`` … ``F``)
**per stream**: the runtimes write stdout and stderr to one file, so another stream's lines may
lie between a long line's parts. Without a ``multiline`` rule each entry is one record; with
one, the rule is applied to the entries' text, per stream, so a stack trace the runtime cut
into partial lines and wrote as many lines is one record even with the other stream's lines
between them. Records go in the order of their first lines.

An entry or event still open (its last part a ``P``; with a rule, a stream's last event) is
closed when a line of the file written ``flush_ms`` later by the runtime's clock follows it, or
when the file has held nothing more for ``flush_ms`` (the reader's flush): one stream never
holds the other back for longer. An entry whose last part never came is sent as it is and
counted (``container_entry_unfinished``).

The file is handed to the pool in *groups*: runs of lines that no record crosses (most are one
entry). A checkpoint stands only between groups; every record of a group is taken to begin at
the group's first line, so a group cut by a crash or a full pool is read again whole (its
records before the cut arrive twice: at-least-once) and never in part.

Each record is a JSON object: ``time`` (the runtime's, of the record's first line: also its
event time), ``stream``, ``message`` (the entries' text joined by newlines), and the metadata
the file's path holds, with no API server asked:

- ``/var/log/pods/<namespace>_<pod>_<pod uid>/<container>/<restart>.log`` (rotated names
  ``<restart>.log.<date>`` too): ``namespace``, ``pod``, ``pod_uid``, ``container``,
  ``restart``;
- ``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log``: ``pod``,
  ``namespace``, ``container``, ``container_id``;
- ``.../containers/<container id>/<container id>-json.log``: ``container_id``.

A line that is not the runtime's framing (no time, stream and tag; not a docker JSON object)
is its own entry: shipped with the whole line as its ``message`` and no ``time`` or
``stream``, its event time the read time, counted as ``container_unparsable``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from ..buffer import Chunk
from ..config import CONTAINER_FORMATS
from .multiline import line_bounds

STREAMS = (b"stdout", b"stderr")

_PODS = re.compile(r"/pods/([^/_]+)_([^/_]+)_([^/_]+)/([^/]+)/(\d+)\.log[^/]*$")
_CONTAINERS = re.compile(r"/containers/([^/_]+)_([^/_]+)_(.+)-([0-9a-f]{64})\.log[^/]*$")
_DOCKER = re.compile(r"/([0-9a-f]{64})/\1-json\.log[^/]*$")


def path_fields(path: str) -> dict:
    """The container's metadata the kubelet's or docker's file path holds (empty when none)."""
    m = _PODS.search(path)
    if m:
        ns, pod, uid, container, restart = m.groups()
        return {"namespace": ns, "pod": pod, "pod_uid": uid, "container": container,
                "restart": int(restart)}
    m = _CONTAINERS.search(path)
    if m:
        pod, ns, container, cid = m.groups()
        return {"pod": pod, "namespace": ns, "container": container, "container_id": cid}
    m = _DOCKER.search(path)
    if m:
        return {"container_id": m.group(1)}
    return {}


@dataclass(frozen=True)
class Part:
    """One line of the runtime's file, its framing read."""

    framed: bool                # False: not the runtime's framing (its own entry, unparsed)
    time: str | None            # RFC 3339 as the runtime wrote it
    stream: str | None
    partial: bool               # its entry goes on in the next line
    content: bytes


def _unframed(line: bytes) -> Part:
    return Part(False, None, None, False, line)


_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_SECONDS: dict[str, int] = {}       # "YYYY-MM-DDTHH:MM:SS" → epoch seconds (UTC), recent ones


def time_ms(text: str) -> int | None:
    """Milliseconds since the epoch of an RFC 3339 time with up to nine fraction digits (one
    without a zone taken as UTC). The runtimes' own form (UTC, ``Z``) is read without
    ``datetime`` for a second already seen."""
    if _runtime_form(text):
        head, frac = text[:19], text[20:-1]
        seconds = _SECONDS.get(head)
        if seconds is not None and frac.isascii() and (not frac or frac.isdigit()):
            return seconds * 1000 + int((frac + "00")[:3])
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    if _runtime_form(text):
        if len(_SECONDS) >= 4096:
            _SECONDS.clear()
        _SECONDS[text[:19]] = int(when.replace(microsecond=0).timestamp())
    return int(when.timestamp() * 1000)


@dataclass
class Plan:
    """What the lines of one read make (``Framing.plan``)."""

    groups: np.ndarray          # per line: whether a group begins there (the first always)
    closed: bool                # whether the last group is closed (nothing in it may go on)
    records: list[list[int]]    # each record's lines, in the order of their first lines
    unfinished: list[bool]      # per record: an entry in it whose last part never came


def _runtime_form(text: str) -> bool:
    """``YYYY-MM-DDTHH:MM:SS[.fraction]Z``, by its shape."""
    return len(text) >= 20 and text[-1] == "Z" and (len(text) == 20 or text[19] == ".")


class Framing:
    """One runtime's framing: lines to parts, parts to entries (per stream), entries to events
    (a multiline rule's, per stream), events to records."""

    def __init__(self, kind: str, cutter=None, flush_ms: int = 1000):
        if kind not in CONTAINER_FORMATS:
            raise ValueError(f"no container format {kind!r}")
        self.kind = kind
        self.parse = _cri if kind == "cri" else _docker
        self.cutter = cutter            # multiline.EventCutter, or None
        self.flush_ms = flush_ms

    def parts(self, data: bytes, starts: np.ndarray, ends: np.ndarray) -> list[Part]:
        view = memoryview(data)
        parse = self.parse
        return [parse(bytes(view[s:e])) for s, e in zip(starts.tolist(), ends.tolist(),
                                                          strict=True)]

    def plan(self, parts: list[Part], at_end: bool = True) -> Plan:
        """The records ``parts`` (a read's lines, in order) make, and where groups begin.
        ``at_end``: the lines are all the file holds so far, so a record that may go on keeps
        its group open; False: the lines are one whole group (``records``)."""
        n = len(parts)
        if self.cutter is None and not any(p.partial for p in parts):   # each line whole
            return Plan(np.ones(n, bool), True, [[i] for i in range(n)], [False] * n)
        clock = _clock(parts)
        entries, entry_open = self._entries(parts, clock)
        events = self._events(entries, parts, clock) if self.cutter is not None else \
            [[e] for e in range(len(entries))]
        records, unfinished = [], []
        reach = np.zeros(n, np.int64)                # per line: its record's last line
        latest = int(clock.max()) if n else UNKNOWN
        streams_last: dict = {}
        for r, event in enumerate(events):
            lines = sorted(i for e in event for i in entries[e])
            records.append(lines)
            unfinished.append(any(entry_open[e] for e in event))
            stream = parts[lines[0]].stream if parts[lines[0]].framed else None
            if stream is not None:
                streams_last[stream] = r
        open_records = set()
        if at_end:
            for r, lines in enumerate(records):
                may_go_on = unfinished[r] or (self.cutter is not None and
                                              streams_last.get(parts[lines[0]].stream) == r
                                              and parts[lines[0]].framed)
                last = int(clock[lines[-1]])
                if may_go_on and (last == UNKNOWN or latest < last + self.flush_ms):
                    open_records.add(r)
        for r, lines in enumerate(records):
            reach[lines] = n if r in open_records else lines[-1]
        before = np.maximum.accumulate(reach) if n else reach
        groups = np.ones(n, bool)
        if n:
            groups[1:] = before[:-1] < np.arange(1, n)
        closed = not n or int(before[-1]) < n
        return Plan(groups, closed, records, unfinished)

    def _entries(self, parts: list[Part], clock: np.ndarray) -> tuple[list[list[int]], list]:
        """Each entry's lines: parts of one stream joined from a ``P`` to the next line of that
        stream, unless that line came ``flush_ms`` or more later (the entry then ends
        unfinished); a line that is no framing is an entry of its own."""
        entries: list[list[int]] = []
        entry_open: list[bool] = []
        open_by_stream: dict[str, int] = {}
        for i, p in enumerate(parts):
            if not p.framed:
                entries.append([i])
                entry_open.append(False)
                continue
            e = open_by_stream.pop(p.stream, None)
            if e is not None and _later(clock, i - 1, entries[e][-1], self.flush_ms):
                e = None                              # its last part never came
            if e is None:
                entries.append([i])
                entry_open.append(p.partial)
                e = len(entries) - 1
            else:
                entries[e].append(i)
                entry_open[e] = p.partial
            if p.partial:
                open_by_stream[p.stream] = e
        return entries, entry_open

    def _events(self, entries: list[list[int]], parts: list[Part],
                clock: np.ndarray) -> list[list[int]]:
        """Entries joined into events by the multiline rule, per stream: an entry the rule
        says continues joins its stream's event before it, unless a line came ``flush_ms`` or
        more after that event's last one first."""
        texts = [_joined(parts, lines) for lines in entries]
        text = b"".join(t.replace(b"\n", b" ") + b"\n" for t in texts)   # one line each
        s8, e8 = line_bounds(text, len(text))
        hits = self.cutter.matching(text, s8, e8)
        begins = hits if self.cutter.rule.begins else ~hits
        events: list[list[int]] = []
        last_line: list[int] = []                    # per event: its last line so far
        by_stream: dict[str, int] = {}
        for e, lines in enumerate(entries):
            first = parts[lines[0]]
            if not first.framed:
                events.append([e])
                last_line.append(lines[-1])
                continue
            ev = by_stream.get(first.stream)
            if ev is not None and (begins[e] or _later(clock, lines[0] - 1, last_line[ev],
                                                       self.flush_ms)):
                ev = None
            if ev is None:
                events.append([e])
                last_line.append(lines[-1])
                by_stream[first.stream] = len(events) - 1
            else:
                events[ev].append(e)
                last_line[ev] = max(last_line[ev], lines[-1])
        return events

    def records(self, chunk: Chunk, meta: dict, read_ms: int) -> tuple[Chunk, int, int, int]:
        """``chunk``'s records — each a group of the file's lines (``plan``) — as the
        runtime's entries (or events) in JSON, every one taken to begin where its group
        begins in the file's bytes. Returns the chunk, how many lines were not the runtime's
        framing, how many records held bytes not UTF-8 and how many entries never got their
        last part."""
        values, times, at = [], [], []
        unparsable = invalid = unfinished = 0
        data = chunk.data.tobytes() if len(chunk) else b""
        for g, (s, n) in enumerate(zip(chunk.starts.tolist(), chunk.lengths.tolist(),
                                       strict=True)):
            parts = [self.parse(line) for line in data[s:s + n].split(b"\n")]
            unparsable += sum(not p.framed for p in parts)
            if len(parts) == 1:                     # most groups: one whole line
                made = [[0]]
                unfinished += parts[0].partial      # (a part its rest never followed)
            else:
                plan = self.plan(parts, at_end=False)
                unfinished += sum(plan.unfinished)
                made = plan.records
            for lines in made:
                value, t, bad = self._record(parts, lines, meta, read_ms)
                values.append(value)
                times.append(t)
                at.append(chunk.source_pos(g))
                invalid += bad
        out = Chunk.of_values(values, np.asarray(times, np.int64), continued=chunk.continued,
                              at=np.asarray(at, np.int64), at_end=chunk.source_end)
        return out, unparsable, invalid, unfinished

    def held(self, data: bytes, values: list[bytes]) -> bool:
        """Whether ``data`` (the file's bytes a slot read, from a group's first line) is what
        the slot's records (``values``, other sources' too) were made of. First as they were
        made: the records its lines make, in order, among the slot's (stream, time and
        message each). Where the slot's records were made otherwise (a group cut at the cap,
        a group the slot holds in part, a line the agent ended), line by line: every line's
        text within the slot's messages, its time not after the newest the slot holds. A
        file that lost its tail to a power loss and was written on holds other texts and
        later times there."""
        objs = []
        for value in values:
            try:
                obj = json.loads(value)
            except (ValueError, RecursionError):
                continue
            if isinstance(obj, dict) and isinstance(obj.get("message"), str):
                objs.append(obj)
        body = data[:-1] if data.endswith(b"\n") else data
        parts = [self.parse(line) for line in body.split(b"\n")] if body else []
        made = [self._fields(parts, lines) for lines in self.plan(parts, at_end=False).records]
        k = 0
        for obj in objs:
            if k < len(made) and all(obj.get(f) == v for f, v in made[k].items()
                                     if f != "invalid"):
                k += 1
        if k == len(made):
            return True
        texts = "\n".join(o["message"] for o in objs).encode("utf-8", "replace")
        newest = max((t for o in objs if isinstance(o.get("time"), str)
                      for t in [time_ms(o["time"])] if t is not None), default=None)
        for p in parts:
            if p.content and p.content not in texts:
                return False
            t = time_ms(p.time) if p.framed and p.time else None
            if t is not None and (newest is None or t > newest + self.flush_ms):
                return False
        return True

    def _fields(self, parts: list[Part], lines: list[int]) -> dict:
        """A record's own fields (time and stream when framed, message), as its JSON has
        them; its text not UTF-8 replaced, and ``"invalid"`` set then."""
        first = parts[lines[0]]
        text = bytearray()
        for j, i in enumerate(lines):
            text += parts[i].content
            if j + 1 < len(lines) and not parts[i].partial:
                text += b"\n"                    # the next line begins another entry
        obj: dict = {}
        if first.framed:
            obj["time"] = first.time
            obj["stream"] = first.stream
        try:
            obj["message"] = text.decode("utf-8")
        except UnicodeDecodeError:
            obj["message"] = text.decode("utf-8", "replace")
            obj["invalid"] = True
        return obj

    def _record(self, parts: list[Part], lines: list[int], meta: dict,
                read_ms: int) -> tuple[bytes, int, bool]:
        """One record's JSON, its event time and whether its text was not UTF-8."""
        obj = self._fields(parts, lines)
        bad = obj.pop("invalid", False)
        t = time_ms(obj["time"]) if obj.get("time") else None
        obj.update(meta)
        return _ENCODE(obj).encode("utf-8", "replace"), read_ms if t is None else t, bad


def _joined(parts: list[Part], lines: list[int]) -> bytes:
    return b"".join(parts[i].content for i in lines)


UNKNOWN = -(1 << 62)       # a line without a time the runtime wrote: it closes nothing


def _clock(parts: list[Part]) -> np.ndarray:
    """Per line, the runtime's time (ms) it carries, UNKNOWN without one: each line's own, so
    a group planned alone decides as it did within the read."""
    out = np.full(len(parts), UNKNOWN, np.int64)
    for i, p in enumerate(parts):
        t = time_ms(p.time) if p.framed and p.time else None
        if t is not None:
            out[i] = t
    return out


def _later(clock: np.ndarray, i: int, last: int, flush_ms: int) -> bool:
    """Whether line ``i`` came ``flush_ms`` or more after line ``last`` by the runtime's
    clock (both times known)."""
    return clock[i] != UNKNOWN and clock[last] != UNKNOWN and \
        clock[i] >= clock[last] + flush_ms


def _cri(line: bytes) -> Part:
    """``<time> <stream> <tag> <content>``; a line that is not: its own entry, unparsed."""
    line = line.removesuffix(b"\r")
    fields = line.split(b" ", 3)
    if len(fields) >= 3 and fields[1] in STREAMS:
        tag = fields[2].split(b":", 1)[0]
        if tag in (b"F", b"P") and fields[0][:4].isdigit() and fields[0][10:11] == b"T":
            return Part(True, fields[0].decode("ascii", "replace"), fields[1].decode(),
                        tag == b"P", fields[3] if len(fields) == 4 else b"")
    return _unframed(line)


def _docker(line: bytes) -> Part:
    """docker's JSON object; a line that is not one with a text ``log``: its own entry."""
    line = line.removesuffix(b"\r")
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("log"), str):
        log = obj["log"]
        stream, when = obj.get("stream"), obj.get("time")
        return Part(True, _text(when), _text(stream) or "stdout", not log.endswith("\n"),
                    log.removesuffix("\n").encode("utf-8", "surrogatepass"))
    return _unframed(line)


def _text(value) -> str | None:
    """A string field of docker's as text (a lone surrogate replaced); None if not one."""
    if not isinstance(value, str):
        return None
    return value.encode("utf-8", "replace").decode("utf-8")
