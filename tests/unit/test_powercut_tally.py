"""The power-cut test's sorting of what it reads back (``faults/powercut_tally.py``): a line
under a second record number is counted as renumbered once per extra number, and a repeat
under the same number is not — also when the record holds what a cut left before the line.
The count before this was the duplicates by id less the repeats of numbers held by whole lines:
a glued record sent twice under its one number (its slot sent again after a second cut) came
out as a line read again under a new number."""

from __future__ import annotations

from tests.faults.powercut_tally import LINE_BYTES, Tally, line_id


def line(i: int) -> bytes:
    value = b"id-%09d " % i + b"%040x" % i
    assert len(value) == LINE_BYTES
    return value


def test_a_line_is_its_id_whole_or_at_the_end_of_what_a_cut_left():
    assert line_id(line(7)) == 7
    assert line_id(line(6)[:20] + line(7)) == 7           # a partial line, glued
    assert line_id(b"\0" * 100 + line(7)) == 7            # a hole's zeros
    assert line_id(b"no line here") == b"no line here"


def test_a_repeat_under_its_number_is_not_a_renumbering_whatever_the_record_holds():
    tally = Tally()
    for seq, value in [(b"1", line(1)), (b"2", line(2)[:9] + line(3)),
                       (b"2", line(2)[:9] + line(3)),     # the glued record's slot sent again
                       (b"1", line(1)), (b"4", b"\0" * 64 + line(4)), (b"4", b"\0" * 64 + line(4))]:
        tally.see(seq, 0, value)
    figures = tally.figures()
    assert figures["renumbered"] == 0 and tally.renumbered_records() == []
    assert figures["duplicates_same_number"] == 3
    assert figures["lines_after_a_partial_line"] == 2 and figures["records_with_a_hole"] == 2
    assert figures["foreign_records"] == 0


def test_each_number_more_a_line_came_under_is_one_renumbering():
    tally = Tally()
    for seq, value in [(b"1", line(1)), (b"9", line(1)), (b"9", line(1)), (b"12", line(1)),
                       (b"2", line(2)[:9] + line(3)), (b"5", line(3)), (b"6", line(6))]:
        tally.see(seq, 0, value)
    assert tally.figures()["renumbered"] == 3             # id 1 under 9 and 12, id 3 under 5
    assert [(i, a[0], b[0]) for i, a, b in tally.renumbered_records()] == \
        [(1, b"1", b"9"), (1, b"1", b"9"), (1, b"1", b"12"), (3, b"2", b"5")]


def test_what_is_no_line_of_the_application_is_foreign():
    tally = Tally()
    tally.see(b"1", 0, b"gzip bytes \x1f\x8b")
    tally.see(b"2", 0, b"xyz" + line(4))                  # not a line's first bytes
    assert tally.figures()["foreign_records"] == 2
