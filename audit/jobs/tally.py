"""One origin's audit state at a Spark tier, and how a batch of its records changes it.

``OriginTally`` is what ``audit.jobs.spark.tally_origin`` keeps per origin in the job's checkpointed
state, as two JSON strings (``dump``/``load``):

- ``windows``: ``"topic\\x00window_start"`` → [count, bytes, lo, hi, duplicates, unnumbered],
  cumulative;
- ``spaces``: origin incarnation → the record numbers seen, an ``IntervalSet`` (base64).

Runs in Spark's Python workers with pandas; the tests run it without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import numpy as np

from ..contract.record import MAX_RANGES
from .intervals import IntervalSet, add_numbered, spaces_from_json, spaces_to_json

COLUMNS = ["kind", "origin", "topic", "window_start", "n", "bytes", "lo", "hi", "duplicates",
           "unnumbered", "incarnation", "through", "missing", "missing_total",
           "missing_truncated"]
_SEP = "\x00"


class OriginTally:
    def __init__(self, windows: dict[str, list[int]], spaces: dict[str, IntervalSet]):
        self.windows = windows
        self.spaces = spaces

    @classmethod
    def load(cls, windows: str | None, spaces: str | None) -> OriginTally:
        return cls(json.loads(windows) if windows else {}, spaces_from_json(spaces))

    def dump(self) -> tuple[str, str]:
        return json.dumps(self.windows, separators=(",", ":")), spaces_to_json(self.spaces)

    def add_frames(self, origin: str, frames: Iterable):
        """Add the batch's records (pandas frames with incarnation, seq, topic, window_start,
        len, lo, hi); returns a frame of ``COLUMNS``: the windows and number spaces changed."""
        import pandas as pd

        parts = [f for f in frames if len(f)]
        if not parts:
            return pd.DataFrame({c: [] for c in COLUMNS})
        batch = pd.concat(parts, ignore_index=True)
        seq = batch["seq"].to_numpy(np.int64)
        dup, changed_spaces = add_numbered(self.spaces, batch["incarnation"].to_numpy(object),
                                           seq)
        batch = batch.assign(dup=dup, unnumbered=seq < 0)
        groups = batch.groupby(["topic", "window_start"], sort=True).agg(
            n=("len", "size"), bytes=("len", "sum"), lo=("lo", "sum"), hi=("hi", "sum"),
            duplicates=("dup", "sum"), unnumbered=("unnumbered", "sum"))
        rows = []
        for (topic, window), g in groups.iterrows():
            key = f"{topic}{_SEP}{int(window)}"
            t = self.windows.setdefault(key, [0, 0, 0, 0, 0, 0])
            for i, name in enumerate(("n", "bytes", "lo", "hi", "duplicates", "unnumbered")):
                t[i] += int(g[name])
            rows.append(["count", origin, topic, int(window), *t, "", 0, "", 0, False])
        for inc in changed_spaces:
            space = self.spaces[inc]
            missing, total = space.missing(MAX_RANGES)
            rows.append(["ranges", origin, "", 0, 0, 0, 0, 0, 0, 0, inc, space.through,
                         json.dumps(missing), total, total > sum(b - a + 1 for a, b in missing)])
        return pd.DataFrame(rows, columns=COLUMNS)

    def state_row(self, origin: str, dumped: tuple[str, str]):
        """A ``kind`` = state row: windows (n), intervals (through) and bytes of the state
        (the origin's state after this batch; logged by the job, not an audit record)."""
        import pandas as pd

        intervals = sum(iv.intervals for iv in self.spaces.values())
        return pd.DataFrame([["state", origin, "", 0, len(self.windows),
                              len(dumped[0]) + len(dumped[1]), 0, 0, 0, 0, "", intervals, "",
                              0, False]], columns=COLUMNS)

    def size(self) -> dict:
        """What the state holds: windows, number spaces, intervals, bytes."""
        windows, spaces = self.dump()
        return {"windows": len(self.windows), "spaces": len(self.spaces),
                "intervals": sum(iv.intervals for iv in self.spaces.values()),
                "bytes": len(windows) + len(spaces)}
