"""Multiline events: which lines of a file source begin an event, and which continue one.

A source's ``multiline`` table names one rule:

- ``start = REGEX``: a line the pattern matches begins an event; any other line continues the
  event before it;
- ``continue = REGEX``: a line the pattern matches continues the event before it; any other
  line begins one;
- ``preset = NAME``: a ``continue`` rule written here for a common case (``PRESETS``).

The first line read from a position the agent resumes at always begins an event: a checkpoint
only ever stands at an event's boundary (``reader.py``), so the line there began one.

Patterns run on RE2 (``google-re2``): its matching time is linear in the text, so no pattern,
however written, can make the agent hang on a line (Python's ``re`` backtracks: ``(a+)+$`` on
forty ``a`` and a ``b`` takes minutes). RE2 refuses what it cannot do in linear time
(backreferences, lookaround): ``validate`` says so with the key path and exits 78.

A pattern is matched against each line alone, without its newline (``^`` and ``$`` are the
line's start and end). It is searched for over a whole read, one RE2 call per match (the
matches' positions mapped to their lines with numpy), and every match is checked to stay
within its line: a match that runs past its line's end (``\\s`` matches a newline) is tried
again on that line alone and the search goes on from the next line, so the result is what a
match per line would give.
"""

from __future__ import annotations

import numpy as np

from ..patterns import MultilineRule, compile_search


class EventCutter:
    """Finds where events begin among a read's lines, for one source's rule."""

    def __init__(self, rule: MultilineRule):
        self.rule = rule
        self._match = compile_search(rule.pattern)

    def matching(self, data: bytes, line_starts: np.ndarray, line_ends: np.ndarray) -> np.ndarray:
        """Per line (``data[line_starts[i]:line_ends[i]]``, ends exclusive of the newline):
        whether the pattern matches it alone."""
        hits = np.zeros(len(line_starts), bool)
        if not len(line_starts):
            return hits
        search = self._match
        stop = int(line_ends[-1])
        pos = int(line_starts[0])
        while pos <= stop:
            spans = []
            while pos <= stop:                    # every match from pos on, one call each
                a, e = search(data, pos, stop)
                if a < 0:
                    break
                spans.append((a, e))
                pos = e if e > a else a + 1
            if not spans:
                break
            found = np.array(spans, np.int64)
            line = np.searchsorted(line_starts, found[:, 0], "right") - 1
            crossed = np.flatnonzero(found[:, 1] > line_ends[line])
            if not len(crossed):
                hits[line] = True
                break
            # A match ran past its line's end: the matches before it stand, that line alone
            # decides for itself, and the search goes on from the next line.
            k = int(crossed[0])
            hits[line[:k]] = True
            i = int(line[k])
            if search(data, int(line_starts[i]), int(line_ends[i]))[0] >= 0:
                hits[i] = True
            if i + 1 >= len(line_starts):
                break
            pos = int(line_starts[i + 1])
        return hits

    def begins(self, data: bytes, line_starts: np.ndarray, line_ends: np.ndarray) -> np.ndarray:
        """Per line: whether it begins an event. The first line always does."""
        hits = self.matching(data, line_starts, line_ends)
        out = hits if self.rule.begins else ~hits
        if len(out):
            out[0] = True
        return out


def line_bounds(data: bytes, n: int):
    """Starts and ends (newline excluded) of the whole lines of ``data[:n]``."""
    buf = np.frombuffer(data, np.uint8, n)
    newlines = np.flatnonzero(buf == 10)
    starts = np.empty(len(newlines), np.int64)
    starts[:1] = 0
    starts[1:] = newlines[:-1] + 1
    return starts, newlines.astype(np.int64)
