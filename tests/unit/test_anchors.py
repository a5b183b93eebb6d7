"""Anchors (``agent/tail/anchors.py``): which offset a generation resumes at when the file no
longer holds, below its checkpoint, what was read there."""

from __future__ import annotations

from agent.tail import anchors as A


def _reader(data: bytes):
    return lambda off, n: data[off:off + n]


def _anchored(data: bytes, offsets: list[int]) -> list[A.Anchor]:
    return [(off, A.checksum(_reader(data), off)) for off in offsets]


def test_the_newest_anchor_follows_the_checkpoint_and_older_ones_are_kept_once_a_second():
    kept: list[A.Anchor] = []
    kept = A.add(kept, (10, 1), fresh=False)
    kept = A.add(kept, (20, 2), fresh=True)            # within the second: replaces
    assert kept == [(20, 2)]
    kept = A.add(kept, (30, 3), fresh=False)           # a second later: kept beside it
    assert kept == [(20, 2), (30, 3)]
    assert A.add(kept, (25, 9), fresh=False) == kept   # never below the newest
    for off in range(40, 40 + 10 * A.KEPT, 10):
        kept = A.add(kept, (off, 0), fresh=False)
    assert len(kept) == A.KEPT and kept[-1][0] == 30 + 10 * A.KEPT
    assert A.unpack(A.pack(kept)) == kept
    assert A.unpack(b"") == [] and A.unpack(b"\x00" * 5) == []


def test_a_file_that_holds_its_newest_anchor_resumes_at_its_checkpoint():
    data = b"".join(b"line %03d\n" % i for i in range(100))
    kept = _anchored(data, [90, 450, 900])
    assert A.resume_at(_reader(data), 900, kept) is None
    assert A.resume_at(_reader(data), 900, []) is None                  # nothing to check
    assert A.resume_at(_reader(data), 40, kept) is None                 # none at or below


def test_a_file_cut_back_resumes_at_the_newest_anchor_it_still_holds():
    data = b"".join(b"line %03d\n" % i for i in range(100))
    kept = _anchored(data, [90, 450, 900])
    cut = data[:500] + b"".join(b"new! %03d\n" % i for i in range(100))
    assert A.resume_at(_reader(cut), 900, kept) == 450
    short = data[:300]                                   # cut, nothing written since
    assert A.resume_at(_reader(short), 900, kept) == 90
    other = b"x" * len(data)
    assert A.resume_at(_reader(other), 900, kept) == 0   # holds none: from the start
