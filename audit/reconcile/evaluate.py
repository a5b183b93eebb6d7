"""One evaluation of the reconciler: every window that changed or is not final judged from
the database, its verdicts stored, its alerts fired or resolved and their notifications queued;
then the audit-health alerts. It reads and writes the database alone (no Kafka): the consuming
thread of ``service`` calls it between two batches, ``docket-audit reconcile --once`` once, the
tests with a database of their own.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from audit.contract.record import PRODUCER_TIER

from .alerts.lifecycle import (
    apply_conditions,
    apply_window_conditions,
    health_conditions,
    notify_due,
    window_alerts,
    window_conditions,
)
from .config import ReconcileConfig
from .figures import FiguresProcess
from .store import Store, plain_figures
from .tiers import tier_order
from .verdict import (
    Currency,
    Timing,
    complete_phase,
    current_by_origin,
    judge,
    producer_reports,
)

log = logging.getLogger("docket.audit.reconcile")

EVALUATE_BATCH_WINDOWS = 500      # windows per evaluation transaction (the consumer waits)
FIGURES_PROCESS_BATCHES = 4       # from this many batches on, their figures are read apart


@dataclass
class Evaluation:
    windows: int = 0
    fired: int = 0
    resolved: int = 0


def evaluate(store: Store, cfg: ReconcileConfig, now_ms: int) -> Evaluation:
    """Judge every window that changed or is not final (taken first, in one transaction:
    ``Store.take_windows_to_evaluate``), ``EVALUATE_BATCH_WINDOWS`` windows per transaction,
    which stores their verdicts, fires or resolves their alerts and queues the notifications.
    A *plain* window (``Store.plain_windows``: every tier holds each origin's producer count
    once, with its checksum; most windows) gets the verdicts ``judge`` would give it from SQL
    figures alone, unless it has alerts open or resolved by hand; the others are judged from
    their records. Then the audit-health alerts. Deterministic for a given database and
    ``now_ms``."""
    timing = Timing(cfg["windows.window_ms"], cfg["windows.grace_ms"], cfg["windows.final_ms"],
                    cfg["windows.settle_ms"])
    currency = Currency(store.caught_up(cfg["alerts.lag_ms"]),
                        store.current_progress(cfg["alerts.lag_ms"]), cfg["windows.settle_ms"])
    configured = cfg["windows.tiers"]
    out = Evaluation()
    phases: dict[int, tuple[str, bool]] = {}     # window_start → a plain window's phase
    pending = store.take_windows_to_evaluate()
    batches = [pending[i:i + EVALUATE_BATCH_WINDOWS]
               for i in range(0, len(pending), EVALUATE_BATCH_WINDOWS)]
    for batch, plain in _with_plain_figures(store, batches):
        with store.conn, _cycle_collector_paused():
            store.evaluated(batch)
            # The topics' tiers as of now, in the batch's transaction: at least those of the
            # figures, read before (a tier new to a topic is in both, or only here).
            tiers_by_topic = store.tiers_of(list(dict.fromkeys(t for t, _w in batch)))
            writer = store.verdict_writer(store.previous(batch), now_ms)
            alerts = window_alerts(store, batch)
            rest, orders = [], {}
            for window in batch:             # plain windows: no record to read, nothing to alert
                topic, window_start = window
                tiers = orders.get(topic)
                if tiers is None:
                    tiers = orders[topic] = tier_order(tiers_by_topic.get(topic, set()),
                                                       configured)
                shape = plain.get(window)
                if shape is None or not shape.plain(len(tiers)) or window in alerts.open or \
                        window in alerts.by_hand:
                    rest.append(window)
                    continue
                phase = phases.get(window_start)
                if phase is None:
                    phase = phases[window_start] = complete_phase(window_start, timing, now_ms)
                writer.save_plain(topic, window_start, tiers, shape, *phase)
            records = store.window_records(rest)
            ranges: dict = {}
            for window in rest:
                topic, window_start = window
                window_records = records[window]
                counts = current_by_origin(window_records)
                tiers = tier_order(set(counts) | tiers_by_topic.get(topic, set()), configured)
                window_ms = next((r.window_ms for r in window_records if r.tier == PRODUCER_TIER),
                                 window_records[0].window_ms if window_records
                                 else timing.window_ms)
                reports = producer_reports(window_records)
                verdicts = judge(topic, window_start, counts,
                                 lambda tier, origin, r=reports: currency.current(
                                     tier, r.get(origin, [])), tiers, timing, now_ms,
                                 cfg.graph, lambda tier, origin, r=reports: currency.claims(
                                     tier, r.get(origin, [])))
                writer.save(topic, window_start, window_ms, verdicts)
                holds, judged = window_conditions(store, verdicts, window_ms, ranges)
                fired, resolved = apply_window_conditions(store, cfg, window, holds, judged,
                                                          alerts, now_ms)
                out.fired += fired
                out.resolved += resolved
            writer.flush()
        out.windows += len(batch)
    with store.conn:
        holds, judged = health_conditions(store, cfg, now_ms)
        fired, resolved = apply_conditions(store, cfg, holds, judged, now_ms)
        notify_due(store, cfg, now_ms)              # snoozes that ended
    out.fired += fired
    out.resolved += resolved
    return out


def _with_plain_figures(store: Store, batches: list[list[tuple[str, int]]]
                        ) -> Iterator[tuple[list[tuple[str, int]], dict]]:
    """Each batch with its ``Store.plain_windows``. With ``FIGURES_PROCESS_BATCHES`` batches or
    more (and a database file), they are read ahead by a process of their own
    (``figures.FiguresProcess``) while the caller judges and stores the batch before: reading
    them is most of a plain batch's time. The windows were taken
    (``take_windows_to_evaluate``) before any of them is read: figures read later are as new
    as that, or newer. Should the process end early, the rest are read here."""
    if len(batches) < FIGURES_PROCESS_BATCHES or not store.path.is_file():
        for batch in batches:
            yield batch, store.plain_windows(batch)
        return
    try:
        reader: FiguresProcess | None = FiguresProcess(store.path, batches)
    except OSError as exc:
        log.warning("cannot start the process reading the windows' figures (reading them "
                    "here): %s", exc)
        reader = None
    try:
        for batch in batches:
            text = reader.next_text() if reader is not None else None
            if text is None:
                if reader is not None:
                    reader.close()
                    log.warning("the process reading the windows' figures ended early (exit "
                                "status %s): reading the rest here", reader.proc.returncode)
                    reader = None
                yield batch, store.plain_windows(batch)
            else:
                yield batch, plain_figures(text)
    finally:
        if reader is not None:
            reader.close()


@contextmanager
def _cycle_collector_paused():
    """A batch makes millions of short-lived objects (records, verdicts, rows), none in a
    reference cycle, all freed as it goes: the cyclic collector's passes over them cost a sixth
    of the evaluation of a day (docs/reconcile.md, "Measured here"). Paused for one batch."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
