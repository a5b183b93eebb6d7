"""The one end rule of every "read to the end" of docket (``docket_common.read_to_end``),
against a consumer that plays a partition's log: records, a transaction's marker that no
consumer is handed, an end reported after records were deleted, an end reported short of the
asked offset, records newer than the ends."""

from __future__ import annotations

from confluent_kafka import KafkaError

from docket_common.read_to_end import read_to_ends


class Msg:
    def __init__(self, partition: int, offset: int, eof: bool = False, topic: str = "t",
                 code: int | None = None):
        self._p, self._o, self._t = partition, offset, topic
        self._err = KafkaError(KafkaError._PARTITION_EOF) if eof else \
            KafkaError(code) if code is not None else None

    def error(self):
        return self._err

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def topic(self):
        return self._t


class Pos:
    def __init__(self, partition: int, offset: int):
        self.partition, self.offset = partition, offset


class PlayedLog:
    """Hands out ``batches`` one per ``consume``; ``position`` of a partition is one past the
    last offset handed (or what ``jump`` says once its batch is handed: a marker skipped)."""

    def __init__(self, batches: list[list[Msg]], jumps: dict[int, dict[int, int]] | None = None):
        self.batches, self.jumps = list(batches), jumps or {}
        self.handed = 0
        self.at: dict[int, int] = {}
        self.clock = 0.0
        self.sought: list[tuple[int, int]] = []
        self.paused: set[int] = set()
        self.resumed: list[int] = []

    def seek(self, tp):
        self.sought.append((tp.partition, tp.offset))
        self.at[tp.partition] = tp.offset

    def pause(self, tps):
        self.paused |= {tp.partition for tp in tps}

    def resume(self, tps):
        self.resumed += [tp.partition for tp in tps]
        self.paused -= {tp.partition for tp in tps}

    def position(self, tps):
        return [Pos(tp.partition, self.at.get(tp.partition, -1001)) for tp in tps]

    def consume(self, n, timeout):
        self.clock += timeout
        if not self.batches:
            return []
        batch = [m for m in self.batches.pop(0) if m.partition() not in self.paused]
        for m in batch:
            if m.error() is None:
                self.at[m.partition()] = m.offset() + 1
        self.at.update(self.jumps.get(self.handed, {}))
        self.handed += 1
        return batch


def read(log: PlayedLog, ends: dict[int, int], timeout_s: float = 5.0):
    taken: list[tuple[int, int]] = []
    owed = read_to_ends(log, "t", ends, lambda m: taken.append((m.partition(), m.offset())),
                        timeout_s, clock=lambda: log.clock)
    return taken, owed


def test_a_partition_is_read_when_its_position_reaches_the_end_even_past_a_marker():
    # offsets 0..2 records, 3 a transaction's commit marker: position 4 after the batch
    log = PlayedLog([[Msg(0, 0), Msg(0, 1), Msg(0, 2)]], jumps={0: {0: 4}})
    taken, owed = read(log, {0: 4})
    assert taken == [(0, 0), (0, 1), (0, 2)] and owed == {}


def test_without_the_marker_jump_the_same_read_stays_owed():
    log = PlayedLog([[Msg(0, 0), Msg(0, 1), Msg(0, 2)]])
    taken, owed = read(log, {0: 4})
    assert owed == {0: 4} and len(taken) == 3


def test_an_end_reported_at_or_past_the_asked_offset_ends_it_records_deleted():
    log = PlayedLog([[Msg(1, 7, eof=True)], [Msg(2, 9, eof=True)]])
    taken, owed = read(log, {1: 5, 2: 9})
    assert taken == [] and owed == {}


def test_an_end_reported_short_of_the_asked_offset_does_not_end_it():
    # an open transaction's records, or a truncated log: the partition is owed at the deadline
    log = PlayedLog([[Msg(0, 0), Msg(0, 1, eof=True)]])
    taken, owed = read(log, {0: 3}, timeout_s=2.0)
    assert taken == [(0, 0)] and owed == {0: 3}


def test_records_at_or_past_their_end_and_of_other_partitions_are_not_taken():
    log = PlayedLog([[Msg(0, 0), Msg(0, 1), Msg(0, 2), Msg(1, 0), Msg(0, 3, topic="other")]])
    taken, owed = read(log, {0: 2})
    assert taken == [(0, 0), (0, 1)] and owed == {}


def test_a_record_past_its_end_puts_the_partition_back_on_it_for_the_next_read():
    # a consumer kept between reads (the mirror's watcher): offset 2 came after the ends were
    # taken; it is not handed over now, and the partition is put back on it, paused meanwhile
    # (its other records of this read not fetched), and resumed for the next read
    log = PlayedLog([[Msg(0, 0), Msg(0, 1), Msg(0, 2), Msg(1, 0)], [Msg(0, 3), Msg(1, 1)]])
    taken, owed = read(log, {0: 2, 1: 2})
    assert taken == [(0, 0), (0, 1), (1, 0), (1, 1)] and owed == {}
    assert log.sought == [(0, 2)] and log.resumed == [0] and not log.paused
    log.batches = [[Msg(0, 2), Msg(0, 3)]]
    taken, owed = read(log, {0: 4})
    assert taken == [(0, 2), (0, 3)] and owed == {}


def test_partitions_with_nothing_below_their_end_are_not_waited_for():
    log = PlayedLog([])
    assert read(log, {0: 0, 1: -1}) == ([], {})
    assert log.clock == 0.0                     # not one wait


def test_other_errors_go_to_the_callers_hook_and_the_read_goes_on():
    log = PlayedLog([[Msg(0, 0, code=KafkaError._TRANSPORT)], [Msg(0, 0)]])
    seen = []
    owed = read_to_ends(log, "t", {0: 1}, lambda m: None, 5.0, on_error=seen.append,
                        clock=lambda: log.clock)
    assert owed == {} and [e.code() for e in seen] == [KafkaError._TRANSPORT]
