"""What ``faults/test_power_cut_fs.py`` reads back, sorted: each record by the application's
line id it holds and by its record number (``docket-seq``).

A line arrives again either under the number it had (its slot sent again: the at-least-once
repeat every tier tells from a new event) or under a new one (read again from its file after
a cut: no tier can tell it from a new line). ``renumbered`` counts the second kind exactly, per
id — the distinct numbers an id arrived under, less one — whatever the record holds besides
the line: a record with what a cut left of the log before its line (a hole's zeros, a line's
first bytes) sent again under its number is a repeat, not a renumbering.
"""

from __future__ import annotations

import re
from collections import Counter

LINE_BYTES = 53                 # an application line without its newline
LINE_AT_END = re.compile(rb"id-(\d{9}) [0-9a-f]{40}\Z")
LINE_START = re.compile(rb"i|id|id-\d{0,9}|id-\d{9} [0-9a-f]{0,39}")   # a line's first bytes


def line_id(value: bytes):
    """A record's id: a line of the application's, whole, or at the end of a record that holds
    what a cut left of the log before it. A cut that keeps a later page of the log and drops an
    earlier one leaves zeros there; one that keeps a page ending inside a line leaves that part;
    neither ends in a newline, so the next line written (after the cut, or in a kept page) is
    one record with them. A record with no whole line at its end is returned as it is."""
    found = LINE_AT_END.search(value)
    return int(found.group(1)) if found else value


class Tally:
    def __init__(self):
        self.numbers: Counter = Counter()       # record number → copies
        self.foreign: list[bytes] = []          # records that are no line the application wrote
        self.after_a_hole: list[bytes] = []     # zeros a cut left, then a line
        self.glued: list[bytes] = []            # a line's first bytes, then a line
        self._first: dict[int, tuple] = {}      # id → (number, offset, value) of its first record
        self._under: dict[int, set] = {}        # id seen again → every number it came under
        self.again: list[tuple] = []            # (id, its first record, this one), each repeat

    def see(self, seq, offset: int, value: bytes) -> None:
        self.numbers[seq] += 1
        got = line_id(value)
        if isinstance(got, int):
            this = (seq, offset, value[:200])
            first = self._first.get(got)
            if first is None:
                # a plain line keeps its number alone (millions of them in a soak)
                self._first[got] = this if len(value) != LINE_BYTES else (seq,)
            else:
                self.again.append((got, first, this))
                self._under.setdefault(got, {first[0]}).add(seq)
        if len(value) == LINE_BYTES and isinstance(got, int):
            return
        if b"\0" in value:
            self.after_a_hole.append(value)
        elif isinstance(got, int) and LINE_START.fullmatch(value[:-LINE_BYTES]):
            self.glued.append(value)
        else:
            self.foreign.append(value)

    def renumbered(self) -> int:
        """Copies of lines under a number other than their first: one per extra number."""
        return sum(len(under) - 1 for under in self._under.values())

    def renumbered_records(self) -> list[tuple]:
        """(id, first record, this record) for each copy under a number not its first."""
        return [(i, a, b) for i, a, b in self.again if a[0] != b[0]]

    def figures(self) -> dict:
        return {
            "duplicates_same_number": sum(c - 1 for c in self.numbers.values() if c > 1),
            "renumbered": self.renumbered(),
            "foreign_records": len(self.foreign), "records_with_a_hole": len(self.after_a_hole),
            "lines_after_a_partial_line": len(self.glued),
        }
