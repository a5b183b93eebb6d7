"""Landing each record once (``land --dedup``): the stateful step that decides, per origin,
which records are new and which are copies of records already landed.

Kafka is at least once: a slot the agent sent again after a crash is in Kafka twice, with the
same identity (origin, origin incarnation, ``docket-seq``). ``OriginDedup`` keeps, per origin
incarnation, the numbers landed so far as an ``IntervalSet`` (its size grows with the gaps, not
with the records) and lets through only the records whose number it has not seen, in this
batch or before. Records without a number (another producer) cannot be told apart from their
copies: they all pass.

What it skipped it counts per (topic, window), cumulative, so the job can say in its audit
records how many copies it did not land (``skipped``).

State (in the job's checkpoint, two JSON strings, ``dump``/``load``): ``spaces``, origin
incarnation → numbers landed (base64 of the intervals); ``skipped``, ``"topic\\x00window"`` →
copies skipped. Runs in Spark's Python workers with pandas; the tests run it without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from .intervals import IntervalSet, add_numbered, spaces_from_json, spaces_to_json

# What lands: the Kafka record, its identity and the table's partition columns.
LANDED_COLUMNS = ["partition", "offset", "timestamp", "key", "value", "origin", "incarnation",
                  "seq", "topic", "date", "hour"]
LANDED_SCHEMA = ("`partition` INT, `offset` BIGINT, `timestamp` TIMESTAMP, `key` BINARY, "
                 "`value` BINARY, `origin` STRING, `incarnation` STRING, `seq` BIGINT, "
                 "`topic` STRING, `date` STRING, `hour` INT")
# The step's output: landed rows (kind "row") and the changed skip tallies (kind "skipped":
# origin, topic, window_start and the cumulative copies skipped in ``skipped``).
DEDUP_SCHEMA = LANDED_SCHEMA + ", `kind` STRING, `window_start` BIGINT, `skipped` BIGINT"
DEDUP_STATE = "spaces STRING, skipped STRING"
_SEP = "\x00"


class OriginDedup:
    def __init__(self, spaces: dict[str, IntervalSet], skipped: dict[str, int]):
        self.spaces = spaces
        self.skipped = skipped

    @classmethod
    def load(cls, spaces: str | None, skipped: str | None) -> OriginDedup:
        return cls(spaces_from_json(spaces), json.loads(skipped) if skipped else {})

    def dump(self) -> tuple[str, str]:
        return spaces_to_json(self.spaces), json.dumps(self.skipped, separators=(",", ":"))

    def keep(self, origin: str, frames: Iterable, done: Callable[[], None] = lambda: None
             ) -> Iterator:
        """The batch's records of ``origin`` (pandas frames of ``LANDED_COLUMNS`` plus
        ``window_start``) → frames of ``DEDUP_SCHEMA``: per input frame the records to land
        (one frame at a time in memory, in the order given), then one frame of ``skipped``
        rows, one per (topic, window) whose tally this batch changed (cumulative).
        ``done()`` is called before that last frame, when the state is final."""
        changed: set[str] = set()
        for frame in frames:
            if not len(frame):
                continue
            copy, _changed = add_numbered(self.spaces, frame["incarnation"].to_numpy(object),
                                          frame["seq"].to_numpy(np.int64))
            if copy.any():
                counts = frame[copy].groupby(["topic", "window_start"], sort=True).size()
                for (topic, window), n in counts.items():
                    key = f"{topic}{_SEP}{int(window)}"
                    self.skipped[key] = self.skipped.get(key, 0) + int(n)
                    changed.add(key)
            if not copy.all():
                yield _frame(frame[~copy], [])
        done()
        tallies = []
        for key in sorted(changed):
            topic, window = key.rsplit(_SEP, 1)
            tallies.append((origin, topic, int(window), self.skipped[key]))
        yield _frame([], tallies)

    def size(self) -> dict:
        spaces, skipped = self.dump()
        return {"spaces": len(self.spaces), "windows": len(self.skipped),
                "intervals": sum(iv.intervals for iv in self.spaces.values()),
                "bytes": len(spaces) + len(skipped)}


def _frame(kept, tallies: list[tuple[str, str, int, int]]):
    """``kept`` rows as kind "row", then ``tallies`` as kind "skipped" rows (their record
    columns empty: zeros, empty strings, no timestamp, no bytes)."""
    import pandas as pd

    rows = pd.DataFrame({c: (kept[c] if len(kept) else []) for c in LANDED_COLUMNS})
    rows["kind"] = "row"
    rows["window_start"] = 0
    rows["skipped"] = 0
    if tallies:
        origin, topic, window, skipped = zip(*tallies, strict=True)
        n = len(tallies)
        extra = pd.DataFrame({
            "partition": [0] * n, "offset": [0] * n,
            "timestamp": pd.Series([pd.NaT] * n, dtype="datetime64[ns]"),
            "key": [None] * n, "value": [None] * n, "origin": list(origin),
            "incarnation": [""] * n, "seq": [-1] * n, "topic": list(topic), "date": [""] * n,
            "hour": [0] * n, "kind": ["skipped"] * n, "window_start": list(window),
            "skipped": list(skipped)})
        rows = pd.concat([rows, extra], ignore_index=True) if len(rows) else extra
    return rows.reset_index(drop=True)
