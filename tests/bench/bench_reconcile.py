"""Can the reconciler judge a day of a large installation in a minute?

Prints one JSON line. In one run, on a SQLite file in a temporary directory, no Kafka (what the
consumer reads is handed to ``Store.apply``, in batches of 50,000 records as the consumer applies
them; ``"input": "Store.apply, no Kafka"`` in the output):
- the audit records of N topics (``--topics``, default 10,000) × 144 windows (one day of
  10-minute windows) × 3 tiers (producer, kafka-local, warehouse) × 3 origins: one count record
  per (tier, origin, topic, window), 9 per window, in the order the emitters send them (window
  by window, each emitter all its topics). About 1 in 1,000 origin windows loses 5 records at
  kafka-local (and so at the warehouse), 1 in 1,000 is counted twice at the warehouse in part
  (duplicates), 1 in 1,000 has equal counts with another checksum at the warehouse; each tier
  sends a ``ranges`` record per origin naming the lost numbers, and progress records that make
  both tiers current (the jobs keep up; the last one a minute before each evaluation);
- apply_s / records_per_s: ``Store.apply`` of all of them (the time in ``Store.apply`` only);
- parse_us_per_record: ``audit.contract.record.parse`` of the encoded values of a sample of
  50,000 of the records: the consumer's parsing cost per record, on top of apply (timed apart);
- first_evaluation_s: ``evaluate`` once with ``now`` an hour after the last window ended (every
  window final): every window judged, its verdicts stored, the alerts fired and queued;
- steady_evaluation_s: ``evaluate`` a minute later: nothing dirty, nothing not final;
- baseline_select_counts_s: in the same run, a bare ``SELECT`` of every count row (no Python
  object per row): the floor under the evaluation's reading;
- target_s = 60 for the first evaluation of 10,000 topics (the reconciler catching up a whole
  day at once); target_met says whether it did, as a figure, not an assert (null for another
  number of topics). Agents' heartbeats are not
  simulated: ``alerts.silent_ms`` is 3 hours. The reconciler's log is kept to errors (it logs
  every alert fired).
peak_rss_mb is ``ru_maxrss`` after the evaluations (before the parse sample);
figures_process_peak_rss_mb the largest VmHWM of the processes that read the evaluation's figures
(``audit.reconcile.figures``), read from /proc every 64 batches while they run (a forked
child's ``ru_maxrss`` would count the parent's pages it shared before its ``exec``).
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from audit.contract.record import AuditRecord, Progress, Ranges, parse  # noqa: E402
from audit.reconcile import figures, service  # noqa: E402
from audit.reconcile.config import parse as parse_config  # noqa: E402
from audit.reconcile.service import BATCH_RECORDS, evaluate  # noqa: E402
from audit.reconcile.store import Store  # noqa: E402
from tests.bench import fleet  # noqa: E402

WINDOW_MS = 600_000
WINDOWS = 144
T0 = 1_763_683_200_000                     # 2025-11-21T00:00:00Z
DAY_END = T0 + WINDOWS * WINDOW_MS
MIN = 60_000
FIRST_EVALUATION = DAY_END + 60 * MIN + 1  # every window final (windows.final_ms: an hour)
TIERS = ["producer", "kafka-local", "warehouse"]
ORIGINS = ["web-1", "web-2", "web-3"]
EVENTS = 1000                              # per origin, topic and window, about
LOST = 5                                   # records a loss takes
SAMPLE = 50_000
TARGET_S = 60.0                            # the first evaluation of TARGET_TOPICS topics
TARGET_TOPICS = 10_000


FIGURES_HWM_KB: list[int] = []


class MeasuredFigures(figures.FiguresProcess):
    """The figures process, its peak resident memory sampled every 64 batches."""
    given = 0

    def next_text(self):
        self.given += 1
        if self.given % 64 == 1:
            try:
                status = Path(f"/proc/{self.proc.pid}/status").read_text()
                FIGURES_HWM_KB.extend(int(line.split()[1]) for line in status.splitlines()
                                      if line.startswith("VmHWM:"))
            except OSError:
                pass
        return super().next_text()


def config():
    return parse_config({
        "channels": {"ops": {"type": "webhook", "url": "http://127.0.0.1:9/alerts"}},
        "alerts": {"default_channels": ["ops"], "silent_ms": 3 * 3_600_000},
        "windows": {"tiers": TIERS}})


def _fault(topic: int, window: int, origin: int) -> str | None:
    i = (topic * WINDOWS + window) * len(ORIGINS) + origin
    return {0: "loss", 1: "duplicates", 2: "checksum"}.get(i * 7919 % 1000)


def records(topics: int) -> Iterator[AuditRecord | Ranges | Progress]:
    """Every record of the day, in the order the emitters send them."""
    lost: dict[str, list[list[int]]] = {o: [] for o in ORIGINS}
    numbered = dict.fromkeys(ORIGINS, 0)         # each origin's record numbers so far
    for w in range(WINDOWS):
        start = T0 + w * WINDOW_MS
        end = start + WINDOW_MS
        for tier in TIERS:
            for o, origin in enumerate(ORIGINS):
                producer = tier == "producer"
                emitter = f"{origin}/agent" if producer else f"{tier}/count"
                for t in range(topics):
                    n = EVENTS + (t * 31 + w * 17 + o) % 97
                    checksum = (t * 1_000_003 + w * 10_007 + o * 101) << 20
                    fault = _fault(t, w, o)
                    count = distinct = n
                    if producer:
                        if fault == "loss":
                            first = numbered[origin] + 100
                            lost[origin].append([first, first + LOST - 1])
                        numbered[origin] += n
                    elif fault == "loss":
                        count = distinct = n - LOST
                    elif fault == "duplicates" and tier == "warehouse":
                        count = n + 12
                    elif fault == "checksum" and tier == "warehouse":
                        checksum += 1
                    yield AuditRecord(
                        tier=tier, origin=origin, topic=f"bench.t{t:05d}", window_start=start,
                        window_ms=WINDOW_MS, count=count, bytes=count * 100, checksum=checksum,
                        emitter=emitter, seq=1, emitted_at=end + (MIN if producer else 2 * MIN),
                        distinct=distinct, duplicates=count - distinct,
                        incarnation=f"{origin}-i1" if producer else f"{tier}-c1")
        for tier in TIERS[1:]:                   # the jobs keep up
            yield Progress(tier=tier, emitter=f"{tier}/count", batch_id=w,
                           input_rows_per_s=1e5, processed_rows_per_s=1e5,
                           batch_duration_ms=1000, offsets_behind=0, emitted_at=end + 3 * MIN)
    for tier in TIERS[1:]:
        for origin in ORIGINS:
            yield Ranges.of(tier=tier, origin=origin, origin_incarnation=f"{origin}-i1",
                            emitter=f"{tier}/count", seq=1, through=numbered[origin] - 1,
                            missing=lost[origin], incarnation=f"{tier}-c1",
                            emitted_at=DAY_END + 3 * MIN)
        yield Progress(tier=tier, emitter=f"{tier}/count", batch_id=WINDOWS,
                       input_rows_per_s=1e5, processed_rows_per_s=1e5, batch_duration_ms=1000,
                       offsets_behind=0, emitted_at=FIRST_EVALUATION - MIN)


def apply_all(store: Store, topics: int) -> tuple[int, float]:
    """(records applied, seconds in ``Store.apply``: building the records is left out)."""
    return _apply_batches(store, records(topics))


def parse_cost(topics: int) -> float:
    """µs per record of ``parse`` on the encoded values of the first ``SAMPLE`` records."""
    values = []
    for rec in records(topics):
        values.append(rec.encode()[1])
        if len(values) == SAMPLE:
            break
    t = time.perf_counter()
    for v in values:
        parse(v)
    return (time.perf_counter() - t) / len(values) * 1e6


def _apply_batches(store: Store, recs, applied: int = 0) -> tuple[int, float]:
    """Apply ``recs`` in the consumer's batches: (records applied in all, seconds in
    ``Store.apply``)."""
    batch: list = []
    spent = 0.0
    for rec in recs:
        batch.append(rec)
        if len(batch) == BATCH_RECORDS:
            applied += len(batch)
            t = time.perf_counter()
            store.apply(batch, {}, {("docket.audit", 0): applied}, "2025-11-22T01:00:00+00:00")
            spent += time.perf_counter() - t
            batch = []
    applied += len(batch)
    t = time.perf_counter()
    store.apply(batch, {}, {("docket.audit", 0): applied}, "2025-11-22T01:00:00+00:00")
    return applied, spent + time.perf_counter() - t


FLEET_TARGETS = {"day_s": 600.0, "steady_evaluation_s": 30.0, "peak_rss_mb": 2048}


def fleet_config():
    """The reconciler's config for the fleet: its tier graph; no heartbeats are simulated."""
    return parse_config({
        "channels": {"ops": {"type": "webhook", "url": "http://127.0.0.1:9/alerts"}},
        "alerts": {"default_channels": ["ops"], "silent_ms": 3 * 3_600_000,
                   "lag_ms": 3 * 3_600_000},
        "windows": {"tiers": fleet.TIERS}, "tiers": fleet.GRAPH})


def fleet_day(shape: fleet.Fleet) -> dict:
    """The fleet's day applied and judged, then a fresh window applied and judged; the alerts
    it raised against what it must raise (``fleet.Fleet.expected``)."""
    cfg = fleet_config()
    day_end = fleet.T0 + shape.windows * fleet.WINDOW_MS
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as d:
        path = Path(d) / "reconcile.db"
        store = Store(path)
        applied, apply_s = _apply_batches(store, shape.records())
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        t = time.perf_counter()
        first = evaluate(store, cfg, day_end + 60 * MIN + 1)
        first_s = time.perf_counter() - t
        # a fresh window: applied, then judged once past its grace
        fresh = range(shape.windows, shape.windows + 1)
        more, fresh_apply_s = _apply_batches(store, shape.records(fresh), applied)
        t = time.perf_counter()
        steady = evaluate(store, cfg, day_end + fleet.WINDOW_MS + 31 * MIN)
        steady_s = time.perf_counter() - t
        whole_topic, whole_window = shape.whole_loss
        whole = [(tier, json.loads(detail).get("origins")) for tier, detail in store.conn.execute(
            "SELECT tier, detail FROM alerts WHERE kind = 'loss' AND topic = ? AND "
            "window_start = ?", (f"fleet.t{whole_topic:04d}",
                                 fleet.T0 + whole_window * fleet.WINDOW_MS))]
        by_kind_tier = {f"{k} {t}": n for k, t, n in store.conn.execute(
            "SELECT kind, tier, count(*) FROM alerts GROUP BY kind, tier")}
        per_key = store.conn.execute(
            "SELECT max(n) FROM (SELECT count(*) AS n FROM alerts WHERE topic IS NOT NULL "
            "GROUP BY kind, topic, window_start, tier)").fetchone()[0]
        queued = store.conn.execute("SELECT count(*) FROM alert_deliveries").fetchone()[0]
        members = store.conn.execute("SELECT count(*) FROM alert_members").fetchone()[0]
        store.close()
        db_bytes = sum(p.stat().st_size for p in Path(d).iterdir())
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    day_s = apply_s + first_s
    want = shape.expected(extra_windows=1)
    as_expected = (by_kind_tier == {"loss kafka-local": want["loss_alerts"],
                                    "duplication aggregate": want["duplication_alerts"]}
                   and whole == [("kafka-local", want["whole_loss_origins"])] and per_key == 1)
    return {
        "bench": "reconcile_fleet_day", "input": "Store.apply, no Kafka",
        "origins": shape.origins, "topics": shape.topics, "topics_per_origin": shape.per_origin,
        "windows": shape.windows, "tiers": len(fleet.TIERS), "records": applied,
        "apply_s": round(apply_s, 1), "records_per_s": round(applied / apply_s),
        "first_evaluation_s": round(first_s, 1), "windows_judged": first.windows,
        "day_s": round(day_s, 1),
        "fresh_window_records": more - applied, "fresh_window_apply_s": round(fresh_apply_s, 1),
        "steady_evaluation_s": round(steady_s, 2), "steady_windows_judged": steady.windows,
        "alerts_by_kind_tier": by_kind_tier, "expected": want,
        "alerts_as_expected": as_expected,
        "whole_partition_loss_alerts": whole, "max_alerts_per_kind_topic_window_tier": per_key,
        "alert_members": members, "notifications_queued": queued,
        "peak_rss_mb": round(peak_rss_mb),
        "figures_process_peak_rss_mb": round(max(FIGURES_HWM_KB, default=0) / 1024),
        "db_bytes": db_bytes, "targets": FLEET_TARGETS,
        "targets_met": {"alerts_as_expected": as_expected,
                        "day_s": day_s <= FLEET_TARGETS["day_s"],
                        "steady_evaluation_s": steady_s <= FLEET_TARGETS["steady_evaluation_s"],
                        "peak_rss_mb": peak_rss_mb <= FLEET_TARGETS["peak_rss_mb"]},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--topics", type=int, default=10_000)
    ap.add_argument("--fleet", action="store_true",
                    help="the fleet's day instead (tests/bench/fleet.py): many origins, few "
                    "topics each, four tiers")
    ap.add_argument("--origins", type=int, default=fleet.Fleet.origins)
    ap.add_argument("--fleet-topics", type=int, default=fleet.Fleet.topics)
    ap.add_argument("--windows", type=int, default=fleet.Fleet.windows)
    args = ap.parse_args()
    logging.getLogger("docket").setLevel(logging.ERROR)     # one line per alert fired otherwise
    if args.fleet:
        service.FiguresProcess = MeasuredFigures
        print(json.dumps(fleet_day(fleet.Fleet(origins=args.origins, topics=args.fleet_topics,
                                               windows=args.windows))))
        return
    cfg = config()
    service.FiguresProcess = MeasuredFigures
    with tempfile.TemporaryDirectory(prefix="bench-reconcile-") as d:
        path = Path(d) / "reconcile.db"
        store = Store(path)
        applied, apply_s = apply_all(store, args.topics)
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        t = time.perf_counter()
        first = evaluate(store, cfg, FIRST_EVALUATION)
        first_s = time.perf_counter() - t
        t = time.perf_counter()
        steady = evaluate(store, cfg, FIRST_EVALUATION + MIN)
        steady_s = time.perf_counter() - t
        t = time.perf_counter()
        rows = sum(1 for _ in store.conn.execute("SELECT * FROM counts"))
        select_s = time.perf_counter() - t
        store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        kinds = dict(store.conn.execute("SELECT kind, count(*) FROM alerts GROUP BY kind"))
        queued = store.conn.execute("SELECT count(*) FROM alert_deliveries").fetchone()[0]
        store.close()
        db_bytes = sum(p.stat().st_size for p in Path(d).iterdir())
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children_rss_mb = max(FIGURES_HWM_KB, default=0) / 1024
    print(json.dumps({
        "bench": "reconcile_day", "input": "Store.apply, no Kafka",
        "topics": args.topics, "windows": args.topics * WINDOWS, "tiers": len(TIERS),
        "origins": len(ORIGINS), "records": applied, "count_rows": rows,
        "apply_s": round(apply_s, 1), "records_per_s": round(applied / apply_s),
        "parse_us_per_record": round(parse_cost(args.topics), 2),
        "first_evaluation_s": round(first_s, 1), "windows_judged": first.windows,
        "steady_evaluation_s": round(steady_s, 3), "steady_windows_judged": steady.windows,
        "alerts_fired": first.fired + steady.fired, "alerts_by_kind": kinds,
        "notifications_queued": queued,
        "baseline_select_counts_s": round(select_s, 1),
        "peak_rss_mb": round(peak_rss_mb),
        "figures_process_peak_rss_mb": round(children_rss_mb), "db_bytes": db_bytes,
        "target_s": TARGET_S, "target_topics": TARGET_TOPICS,
        "target_met": first_s <= TARGET_S if args.topics == TARGET_TOPICS else None,
    }))


if __name__ == "__main__":
    main()
