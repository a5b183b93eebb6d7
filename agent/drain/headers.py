"""The headers of the records the drain sends: docket's record identity (origin, incarnation,
part, and each record's number, ``docket-seq``), built per block of a slot without a list per
record.
"""

from __future__ import annotations

import numpy as np

from docket_common.names import SEQ_HEADER

Record = tuple  # (topic, value, key, timestamp_ms, headers)


def record_numbers(first: int, n: int) -> list[bytes]:
    """``docket-seq`` values of ``n`` records from ``first``: 8-byte big-endian, built in numpy
    (one Python object per record, no arithmetic per record)."""
    return np.arange(first, first + n, dtype=np.uint64).astype(">u8").view("V8").tolist()


class BlockHeaders:
    """The headers of a block's records: ``base`` (origin, incarnation, part; shared) and, when
    records are numbered, each record's ``docket-seq``: ``numbers`` is the first record's
    number (the block's records follow on) or a list of them (a block less dead records).

    No list per record is kept: the send loop sets the number into one list it reuses, which
    ``produce()`` copies at once (a list and a tuple per record cost ~0.7 µs, most of it in
    the garbage collector, measured here)."""

    __slots__ = ("base", "numbers")

    def __init__(self, base: list | None, numbers: int | list[int] | None):
        self.base = base
        self.numbers = numbers

    def number(self, i: int) -> int | None:
        n = self.numbers
        return n if n is None else (n + i if isinstance(n, int) else n[i])

    def of(self, i: int) -> list | None:
        """Record ``i``'s headers, as a list of its own."""
        n = self.number(i)
        if n is None:
            return self.base
        return [*(self.base or ()), (SEQ_HEADER, n.to_bytes(8, "big"))]

    def values(self, a: int, b: int) -> list[bytes]:
        """The ``docket-seq`` values of records [a, b)."""
        n = self.numbers
        if isinstance(n, int):
            return record_numbers(n + a, b - a)
        return np.array(n[a:b], np.uint64).astype(">u8").view("V8").tolist()

    def subset(self, keep: list[int]) -> BlockHeaders:
        if self.numbers is None:
            return self
        return BlockHeaders(self.base, [self.number(i) for i in keep])


def record_number(headers) -> int | None:
    for name, value in headers or ():
        if name == SEQ_HEADER:
            return int.from_bytes(value, "big")
    return None
