"""The drain frees a slot only at a zero point: when librdkafka's queue has been empty since the
slot's last record was handed over. Against an address where no broker answers, nothing may
be freed: the records sit in librdkafka's queue, then come back as RETRY when purged."""

from __future__ import annotations

import numpy as np

from agent.drain.drain import MAX_INFLIGHT_SLOTS
from tests.unit.poolkit import unreachable_drain


def _drain(tmp_path, records: int):
    data = b"".join(b"event %d\n" % i for i in range(records))
    return unreachable_drain(tmp_path, data, np.full(records, 1_795_000_000_000))


def test_no_slot_is_freed_while_librdkafka_holds_its_records(tmp_path):
    drain, pool = _drain(tmp_path, 3000)
    slots = len(pool.sealed())
    assert slots > 1
    for _ in range(5):
        drain.pump()
    assert drain.handed == sum(s.total for s in drain.inflight) > 0
    assert len(drain.producer) > 0 and drain.settled == 0
    assert not any(s.done for s in drain.inflight)
    assert len(pool.sealed()) == slots                   # nothing freed
    drain._purge()                                       # as at the start of an outage
    assert drain.settled == drain.handed                 # a zero point: all reported ...
    assert all(s.retry and not s.done for s in drain.inflight)   # ... as failed, to go again
    drain._complete()
    assert len(pool.sealed()) == slots
    drain.close()
    pool.close()


def test_the_window_of_slots_in_flight_is_bounded(tmp_path):
    drain, pool = _drain(tmp_path, 20_000)
    assert len(pool.sealed()) > MAX_INFLIGHT_SLOTS
    for _ in range(5):
        drain.pump()
    assert len(drain.inflight) == MAX_INFLIGHT_SLOTS     # no zero point: no more are taken
    drain.close()
    pool.close()
