"""Event time and key of each line, when the source names JSON fields for them.

Without ``timestamp_field`` every line of a chunk gets the read time, with no per-line work.
With it, each line is parsed as JSON (the slow path, per line): the field may hold RFC 3339 text,
or epoch seconds or milliseconds (numbers above 10^11 are taken as milliseconds). A line that is
not JSON, lacks the field or holds something unparsable keeps the time it had (the read time,
or the container runtime's) and is counted.
"""

from __future__ import annotations

import json
from datetime import datetime

from ..buffer import Chunk
from ..buffer.framing import MAX_KEY_BYTES

_MS_THRESHOLD = 10**11
BOM = "\ufeff"           # a line that starts with one is still JSON (as json.loads(bytes) took it)


def parse_time(value) -> int | None:
    """Milliseconds since the epoch, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        if value != value or value < 0:
            return None
        return int(value) if value >= _MS_THRESHOLD else int(value * 1000)
    if isinstance(value, str):
        text = value.strip()
        if not text:
            return None
        try:
            return parse_time(float(text)) if text.replace(".", "", 1).isdigit() else \
                int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
        except (ValueError, OverflowError):
            return None
    return None


def apply_fields(chunk: Chunk, timestamp_field: str | None,
                 key_field: str | None) -> tuple[Chunk, int, int]:
    """Return the chunk with per-record times/keys from JSON fields, the unparsable count and
    the count of lines that are not UTF-8 (each line is decoded once, and parsed from that)."""
    if not timestamp_field and not key_field:
        return chunk, 0, 0
    n = len(chunk)
    ts = chunk.timestamps.copy()          # the read time, or times the source set (containers)
    keys: list[bytes | None] | None = [None] * n if key_field else \
        (list(chunk.keys) if chunk.keys is not None else None)   # keys set before: kept
    unparsable = invalid = 0
    data = memoryview(chunk.data)
    for i, (s, ln) in enumerate(zip(chunk.starts.tolist(), chunk.lengths.tolist(), strict=True)):
        try:
            obj = json.loads(str(data[s:s + ln], "utf-8").removeprefix(BOM))
        except UnicodeDecodeError:
            invalid += 1
            obj = None
        except (ValueError, RecursionError):      # not JSON, or nested deeper than it parses
            obj = None
        if not isinstance(obj, dict):
            unparsable += bool(timestamp_field)
            continue
        if timestamp_field:
            t = parse_time(obj.get(timestamp_field))
            if t is None:
                unparsable += 1
            else:
                ts[i] = t
        if key_field:
            k = obj.get(key_field)
            if k is not None:
                kb = (k if isinstance(k, str) else json.dumps(k)).encode()
                keys[i] = kb if len(kb) <= MAX_KEY_BYTES else None
    return Chunk(chunk.data, chunk.starts, chunk.lengths, ts, keys, chunk.end, chunk.continued,
                 chunk.at, chunk.at_end), unparsable, invalid
