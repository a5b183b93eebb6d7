"""Read Kafka partitions to given end offsets within a deadline: one end rule for every reader
of docket that must know it has read *everything up to* a point — the audit topic read whole
(``audit.contract.collect``), a batch's range of it (``audit.jobs.catchup``), the mirror's
watcher (``audit.jobs.mirrored``), the demo's look at a partition (``demo/run.py``).

The end rule. A partition is read to its end offset ``e`` when

- the consumer's *position* reaches ``e`` — a position, not the last offset seen: the last
  offset of a log may be a transaction's marker, which no consumer is handed; or
- the consumer reports the partition's end (an EOF event, ``enable.partition.eof``) at an
  offset at or past ``e``: the records below it were deleted meanwhile (retention), nothing
  more will come.

An end reported *below* ``e`` does not end it: the log ends short of what was asked (an open
transaction's records not readable yet under ``read_committed``, or the log truncated by an
unclean leader election). Such a partition is still owed when the deadline passes, and the
caller says what that means to it (an error, or no conclusion from this read).

Only records below their partition's end are handed over: those at or past it are newer than
the ends the caller took, and whatever it concludes holds up to the ends only. They are not
lost to a consumer the caller keeps between reads (the mirror's watcher does): the first one
met puts the partition back on it (a seek) and pauses it for the rest of this read, so the
next read, resumed there, hands it over. (They were dropped once, and the watcher, which never
saw an offset its mirror committed just after a round took its ends, waited for it forever.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, TopicPartition

log = logging.getLogger("docket.read_to_end")

POLL_S = 0.5          # the longest single wait for records


def read_to_ends(consumer, topic: str, ends: dict[int, int], take: Callable,
                 timeout_s: float, on_error: Callable | None = None,
                 clock: Callable[[], float] = time.monotonic) -> dict[int, int]:
    """Read ``topic`` with ``consumer`` (already assigned, each partition from where the
    caller wants it read) until every partition ``p`` of ``ends`` is read to ``ends[p]``
    (exclusive; partitions with an end of 0 or less hold nothing to wait for), handing each
    record below its end to ``take``; a consumer error other than an end goes to ``on_error``
    (default: a DEBUG line; the client retries by itself). Returns the partitions still owed,
    with their ends, when ``timeout_s`` passed (empty when all were read)."""
    owed = {p: e for p, e in ends.items() if e > 0}
    parked: list[TopicPartition] = []      # put back on their first record past the end
    deadline = clock() + timeout_s
    try:
        while owed:
            for tp in consumer.position([TopicPartition(topic, p) for p in owed]):
                if tp.offset >= owed[tp.partition]:
                    del owed[tp.partition]
            left = deadline - clock()
            if not owed or left <= 0:
                break
            for msg in consumer.consume(1000, timeout=min(POLL_S, left)):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF \
                            and msg.offset() >= owed.get(msg.partition(), msg.offset() + 1):
                        del owed[msg.partition()]
                    elif err.code() != KafkaError._PARTITION_EOF:
                        (on_error or (lambda e: log.debug("%s: %s", topic, e)))(err)
                    continue
                p, offset = msg.partition(), msg.offset()
                if msg.topic() != topic or p not in ends:
                    continue
                if offset < ends[p]:
                    take(msg)
                elif all(tp.partition != p for tp in parked):
                    owed.pop(p, None)              # past its end: everything below was read
                    back = TopicPartition(topic, p, offset)
                    consumer.seek(back)
                    consumer.pause([back])
                    parked.append(back)
    finally:
        if parked:
            consumer.resume(parked)
    return owed
