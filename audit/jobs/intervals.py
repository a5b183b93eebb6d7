"""Sets of record numbers as sorted, disjoint, non-adjacent intervals, in numpy.

What a tier has seen of one origin's numbers (``docket-seq``) is almost always "0 to N, less a
few gaps": kept as intervals, it costs memory per gap, not per record. ``add`` takes a batch of
numbers (any order, repeats allowed) and says which of them were seen before — in the set, or
earlier in the same batch — so the caller can count duplicates where they belong; ``add_runs``
and ``add_groups`` take numbers already as runs (the count job's compacted batches) and say how
many the set held.

``add_numbered`` adds a batch to the sets of its number spaces (one per origin incarnation), as
``land --dedup``'s step does; ``spaces_to_json``/``spaces_from_json`` are the sets as its
checkpointed state keeps them.

Light on purpose (numpy and the standard library only): the count job's driver and ``land
--dedup``'s Python workers run it, and the tests run it without Spark.
"""

from __future__ import annotations

import base64
import json

import numpy as np

_EMPTY = np.empty(0, np.int64)


class IntervalSet:
    __slots__ = ("starts", "ends")

    def __init__(self, starts: np.ndarray = _EMPTY, ends: np.ndarray = _EMPTY):
        self.starts = np.asarray(starts, np.int64)      # inclusive
        self.ends = np.asarray(ends, np.int64)          # inclusive

    def __len__(self) -> int:
        """How many numbers the set holds."""
        return int((self.ends - self.starts + 1).sum())

    @property
    def intervals(self) -> int:
        return len(self.starts)

    @property
    def through(self) -> int:
        """The highest number in the set, -1 when empty."""
        return int(self.ends[-1]) if len(self.ends) else -1

    def contains(self, numbers: np.ndarray) -> np.ndarray:
        """A boolean per number: is it in the set?"""
        numbers = np.asarray(numbers, np.int64)
        if not len(self.starts):
            return np.zeros(len(numbers), bool)
        i = np.searchsorted(self.starts, numbers, side="right") - 1
        inside = i >= 0
        inside[inside] = numbers[inside] <= self.ends[i[inside]]
        return inside

    def add(self, numbers: np.ndarray) -> np.ndarray:
        """Add ``numbers``; returns, per number in the order given, True when it was already
        seen (in the set, or earlier in ``numbers``): a duplicate."""
        numbers = np.asarray(numbers, np.int64)
        if not len(numbers):
            return np.zeros(0, bool)
        order = np.argsort(numbers, kind="stable")
        s = numbers[order]
        first = np.empty(len(s), bool)
        first[0] = True
        np.not_equal(s[1:], s[:-1], out=first[1:])
        seen = self.contains(s)
        dup_sorted = ~first | seen
        dup = np.empty(len(s), bool)
        dup[order] = dup_sorted
        fresh = s[~dup_sorted]
        if len(fresh):
            self._merge(*_runs(fresh))
        return dup

    def add_runs(self, starts: np.ndarray, ends: np.ndarray) -> int:
        """Add the numbers of disjoint inclusive runs (sorted by start); returns how many of
        them the set held already (duplicates)."""
        starts, ends = np.asarray(starts, np.int64), np.asarray(ends, np.int64)
        if not len(starts):
            return 0
        held = int((self._count_to(ends) - self._count_to(starts - 1)).sum())
        self._merge(starts, ends)
        return held

    def add_groups(self, groups: list[tuple[np.ndarray, np.ndarray]]) -> list[int]:
        """``add_runs`` for each group of runs in turn (a number of an earlier group is held
        for a later one); one merge for all of them where no two groups share a number."""
        if len(groups) < 2:
            return [self.add_runs(s, e) for s, e in groups]
        starts = np.concatenate([s for s, _e in groups])
        ends = np.concatenate([e for _s, e in groups])
        if not len(starts):
            return [0] * len(groups)
        order = np.argsort(starts, kind="stable")
        if (starts[order][1:] <= ends[order][:-1]).any():
            return [self.add_runs(s, e) for s, e in groups]    # groups that share numbers
        which = np.repeat(np.arange(len(groups)), [len(s) for s, _e in groups])
        held = self._count_to(ends) - self._count_to(starts - 1)
        self._merge(starts[order], ends[order])
        return np.bincount(which, weights=held, minlength=len(groups)).astype(np.int64).tolist()

    def _count_to(self, x: np.ndarray) -> np.ndarray:
        """Per number in ``x``: how many numbers of the set are at most it."""
        if not len(self.starts):
            return np.zeros(len(x), np.int64)
        sizes = np.cumsum(self.ends - self.starts + 1)
        i = np.searchsorted(self.starts, x, side="right") - 1
        at = np.maximum(i, 0)
        before = np.where(at > 0, sizes[at - 1], 0)
        within = np.minimum(x, self.ends[at]) - self.starts[at] + 1
        return np.where(i >= 0, before + within, 0)

    def _merge(self, starts: np.ndarray, ends: np.ndarray) -> None:
        """Union with disjoint intervals ``starts``/``ends`` (sorted)."""
        a = np.concatenate([self.starts, starts])
        b = np.concatenate([self.ends, ends])
        order = np.argsort(a, kind="stable")
        a, b = a[order], b[order]
        reach = np.maximum.accumulate(b)
        # A new interval begins where the start is past everything before it by more than 1.
        begins = np.empty(len(a), bool)
        begins[0] = True
        np.greater(a[1:], reach[:-1] + 1, out=begins[1:])
        idx = np.flatnonzero(begins)
        self.starts = a[idx]
        self.ends = reach[np.r_[idx[1:] - 1, len(a) - 1]]

    def missing(self, limit: int) -> tuple[list[list[int]], int]:
        """The numbers from 0 to ``through`` not in the set: at most ``limit`` inclusive ranges,
        smallest first, and how many numbers are missing in all."""
        if not len(self.starts):
            return [], 0
        gap_starts = np.r_[0, self.ends[:-1] + 1]
        gap_ends = self.starts - 1
        keep = gap_ends >= gap_starts
        gap_starts, gap_ends = gap_starts[keep], gap_ends[keep]
        total = int((gap_ends - gap_starts + 1).sum())
        return np.stack([gap_starts[:limit], gap_ends[:limit]], 1).tolist(), total

    def to_bytes(self) -> bytes:
        return np.stack([self.starts, self.ends], 1).astype("<i8").tobytes()

    @classmethod
    def from_bytes(cls, raw: bytes | None) -> IntervalSet:
        if not raw:
            return cls()
        pairs = np.frombuffer(raw, "<i8").reshape(-1, 2)
        return cls(pairs[:, 0].copy(), pairs[:, 1].copy())


def add_numbered(spaces: dict[str, IntervalSet], incarnations: np.ndarray,
                 seq: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Add a batch's record numbers to the sets of their number spaces (``spaces``: origin
    incarnation → the numbers seen; a record without a number has ``seq`` -1 and is left out).
    Returns, per record, whether its number was seen before (in the set, or earlier in the
    batch): a copy; and the number spaces that changed, in the order first met."""
    numbered = seq >= 0
    copy = np.zeros(len(seq), bool)
    changed: list[str] = []
    if numbered.any():
        for inc in dict.fromkeys(incarnations[numbered].tolist()):
            at = np.flatnonzero(numbered & (incarnations == inc))
            copy[at] = spaces.setdefault(str(inc), IntervalSet()).add(seq[at])
            changed.append(str(inc))
    return copy, changed


def spaces_to_json(spaces: dict[str, IntervalSet]) -> str:
    """Number spaces as a job's state keeps them: JSON of incarnation → base64 intervals."""
    return json.dumps({inc: base64.b64encode(iv.to_bytes()).decode()
                       for inc, iv in spaces.items()}, separators=(",", ":"))


def spaces_from_json(text: str | None) -> dict[str, IntervalSet]:
    return {inc: IntervalSet.from_bytes(base64.b64decode(raw))
            for inc, raw in (json.loads(text) if text else {}).items()}


def _runs(sorted_unique: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Consecutive runs of sorted distinct numbers, as (starts, ends)."""
    breaks = np.flatnonzero(np.diff(sorted_unique) != 1)
    starts = sorted_unique[np.r_[0, breaks + 1]]
    ends = sorted_unique[np.r_[breaks, len(sorted_unique) - 1]]
    return starts, ends
