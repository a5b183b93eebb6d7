"""Every tier cuts time in the same windows (``docket_common.window``): the reconciler refuses
the count records of a tier whose window length differs from the one it judges — with an
error naming the tier and both lengths, once per (tier, emitter, length), each refused record
counted as malformed (``window_mismatch``) — instead of storing counts that cover other spans
of time than the producers'."""

from __future__ import annotations

import logging
import time
from dataclasses import replace

from audit.reconcile.service import Reconciler
from tests.unit.reconcilekit import MIN, T0, W, cfg, count
from tests.unit.test_reconcile_catch_up import ScriptedConsumer


def test_a_tier_counting_in_other_windows_is_refused_and_said_once(tmp_path, caplog):
    now = int(time.time() * 1000)
    at = T0 + W + MIN
    log = [count("producer", 500, "web-3", at=at).encode()[1],
           replace(count("kafka-local", 250, "web-3", at=at), window_ms=W // 2).encode()[1],
           replace(count("kafka-local", 250, "web-3", at=at, window=T0 + W // 2),
                   window_ms=W // 2).encode()[1],
           count("kafka-local", 500, "web-4", at=at).encode()[1]]
    rec = Reconciler(cfg(), tmp_path / "r.db", clock=lambda: now / 1000)
    rec.consumer, rec.partitions = ScriptedConsumer({0: log}), {0}
    with caplog.at_level(logging.ERROR, logger="docket.audit"):
        for _ in range(len(log) + 1):
            rec.step()
    stored = sorted((r["tier"], r["origin"], r["window_ms"])
                    for r in rec.store.db.query("SELECT tier, origin, window_ms FROM counts"))
    malformed = {r["reason"]: r["records"] for r in rec.store.db.query(
        "SELECT reason, records FROM malformed")}
    offsets = rec.store.offsets(rec.topic)
    rec.store.close()
    assert stored == [("kafka-local", "web-4", W), ("producer", "web-3", W)]
    assert malformed == {"window_mismatch": 2}
    assert offsets == {0: len(log)}                     # read past, nothing held up
    said = [r.getMessage() for r in caplog.records if "refusing" in r.getMessage()]
    assert len(said) == 1, said
    assert "kafka-local" in said[0] and f"{W // 2} ms" in said[0] and f"{W} ms" in said[0]
