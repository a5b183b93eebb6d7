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


def _spaced(offs: list[int]) -> None:
    """Ascending and distinct; every hand-over within ``FINE_RATIO`` of the newest; further
    back, each gap less than twice ``d / FINE_RATIO`` (``d``: below the newest)."""
    newest = offs[-1]
    assert offs == sorted(set(offs)) and len(offs) <= A.FINE_KEPT
    assert offs[-A.FINE_RATIO - 1:] == list(range(newest - A.FINE_RATIO, newest + 1))
    for a, b in zip(offs, offs[1:], strict=False):
        assert A.FINE_RATIO * (b - a) < 2 * (newest - a) or b - a == 1, (a, b)


def test_the_hand_overs_the_seals_pass_are_fine_anchors_all_near_the_newest_thinner_back():
    fine = A.add_fine([], [(10, 1), (20, 2)])
    assert fine == [(10, 1), (20, 2)]
    passed = [(1000 + i, i) for i in range(2000)]              # hand-overs a byte apart
    fine = A.add_fine(fine, passed)
    assert fine[-1] == (2999, 1999) and len(fine) == A.FINE_KEPT     # the newest always
    _spaced([a[0] for a in fine])
    assert 2999 - fine[0][0] > 6 * A.FINE_KEPT                  # they reach far back
    assert A.add_fine(fine, [(15, 0)]) == fine                  # never below the newest
    assert A.add_fine(fine, []) == fine                         # thinned already: as it was
    # A hand-over per seal (a quiet file): each seal thins what the ones before kept
    fine = []
    for at in range(1, 5001):
        fine = A.add_fine(fine, [(at, 0)])
        if at in (100, 1000, 5000):
            _spaced([a[0] for a in fine])
    assert len(fine) == A.FINE_KEPT and 5000 - fine[0][0] > 8 * A.FINE_KEPT
    assert A.merged([(5, 1), (1000, 0)], [(1000, 0), (1010, 0)]) == \
        [(5, 1), (1000, 0), (1010, 0)]


def test_the_two_kinds_are_stored_apart_and_read_back_apart():
    coarse, fine = [(10, 1), (500, 2)], [(480, 3), (490, 4), (500, 2)]
    blob = A.pack(coarse, fine)
    assert A.unpack_split(blob) == (coarse, fine)
    assert A.unpack(blob) == [(10, 1), (480, 3), (490, 4), (500, 2)]
    assert A.unpack_split(A.pack(coarse)) == (coarse, [])          # an older agent's form
    assert A.unpack_split(A.pack([], fine)) == ([], fine)
    # What an agent that knows no fine anchors makes of the new form: one anchor more, past
    # any checkpoint, so never checked.
    assert A.below(A._entries(blob), 1 << 62) == coarse + fine


def test_an_agent_that_knows_no_fine_anchors_goes_on_adding_its_own_after_a_downgrade():
    """After a downgrade, the older agent reads the stored form as one list (its ``unpack``:
    every entry, in order), adds each seal's anchor after its last entry (``add``), and at a
    start checks the newest at or below the checkpoint (``resume_at``): it must go on adding
    (with the mark last it added none, and checked a stale anchor: lines skipped unseen), and
    find a cut below its checkpoint. Upgraded again, the newer agent reads what it left."""
    older_unpack = A._entries                                     # the older agent's unpack
    data = bytearray(b"".join(b"line %05d\n" % i for i in range(400)))   # 11 bytes a line
    crc_at = {off: A.checksum(lambda lo, n: bytes(data[lo:lo + n]), off)
              for off in range(11, len(data) + 1, 11)}
    coarse = [(110, crc_at[110]), (1100, crc_at[1100])]
    fine = [(off, crc_at[off]) for off in range(1012, 1101, 11)]
    kept = older_unpack(A.pack(coarse, fine))
    for off in range(1111, 2201, 110):                            # the older agent's seals
        kept = A.add(kept, (off, crc_at[off]), fresh=False)
        assert kept[-1] == (off, crc_at[off])
    blob = A.pack(kept)                                           # its pack: entries as they are
    read_at = lambda lo, n: bytes(data[lo:lo + n])                # noqa: E731
    assert A.resume_at(read_at, 2200, older_unpack(blob)) is None     # the file holds it all
    del data[1700:]                                               # a power cut at byte 1700
    data += b"after cut %03d\n" % 0 * 60                         # written on from there
    assert A.resume_at(read_at, 2200, older_unpack(blob)) == 1661     # the newest still held
    coarse_after, fine_after = A.unpack_split(blob)               # upgraded again
    assert A.merged(coarse_after, fine_after)[-1] == (2101, crc_at[2101])
    assert A.add(coarse_after, (2211, 7), fresh=False)[-1] == (2211, 7)
