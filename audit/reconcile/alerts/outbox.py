"""The delivery outbox: one row per (alert, event, channel) in SQLite, sent by a dispatcher.

The tables, their invariants and the recovery rules are described in the package docstring
(``audit/reconcile/alerts/__init__.py``). In short: :func:`enqueue` adds rows (in the caller's
transaction when one is open, so an alert's state change and its deliveries commit together);
:meth:`Dispatcher.run_once` sends every due row, records every attempt, and marks a row
delivered in a transaction right after its send succeeded.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import sqlite_utils

from ..store import deliveries
from ..store.deliveries import ensure_tables
from .channels import Channel, DeliveryFailed
from .notification import Notification, digest_summary, idempotency_key

log = logging.getLogger("docket.audit.reconcile.alerts")

PENDING, DELIVERED, GAVE_UP = "pending", "delivered", "gave_up"

def enqueue(db: sqlite_utils.Database, n: Notification, channels: Iterable[str],
            now_ms: int) -> int:
    """Add one pending delivery of ``n`` per channel, due at once; returns the rows added. A
    (alert, event, channel) already in the outbox is left as it is, so enqueueing again is a
    no-op. Inside an open transaction the rows commit with it; otherwise they commit here."""
    body = json.dumps(n.to_json(), sort_keys=True, separators=(",", ":"))
    added = 0
    with db.atomic():
        ensure_tables(db)
        for channel in dict.fromkeys(channels):
            added += deliveries.add(db, n.alert_id, n.event, channel, body, now_ms)
    return added


@dataclass
class DispatchStats:
    """What one :meth:`Dispatcher.run_once` did."""
    attempted: int = 0        # sends tried
    delivered: int = 0
    retrying: int = 0         # failed, another attempt scheduled
    gave_up: int = 0          # failed for good (not retryable, or too long)
    deferred: int = 0         # due but left for the next run: their channel failed earlier in
    #                           this run or has no rate left, or the firing event of the same
    #                           alert is still pending
    digests: int = 0          # digests tried: notifications a rate limit held back, sent as one
    unconfigured: int = 0     # due but their channel is not configured (left pending)
    next_due_at: int | None = None   # ms: when run_once has something to send next (None:
    #                                  nothing pending on a configured channel)


class Dispatcher:
    """Sends the outbox's due rows through the configured channels.

    One dispatcher per database: two would send the same rows. It uses ``db`` from the thread
    that calls :meth:`run_once`, outside any open transaction (each outcome commits).
    ``clock`` returns seconds (``time.time``); ``rng`` draws the back-off jitter.
    """

    def __init__(self, db: sqlite_utils.Database, channels: Mapping[str, Channel],
                 clock: Callable[[], float] = time.time, backoff_initial_ms: int = 5000,
                 backoff_max_ms: int = 300_000, give_up_after_ms: int = 24 * 3600 * 1000,
                 rng: random.Random | None = None):
        if not 0 < backoff_initial_ms <= backoff_max_ms:
            raise ValueError("need 0 < backoff_initial_ms <= backoff_max_ms")
        self.db, self.channels, self.clock = db, dict(channels), clock
        self.backoff_initial_ms, self.backoff_max_ms = backoff_initial_ms, backoff_max_ms
        self.give_up_after_ms = give_up_after_ms
        self._rng = rng or random.Random()
        self._told_unconfigured: set[str] = set()
        ensure_tables(db)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def backoff_ms(self, attempts: int, retry_after_ms: int | None = None) -> int:
        """The wait after the ``attempts``-th failed attempt: the initial back-off doubled per
        attempt, capped at the maximum, drawn uniformly from its upper half (jitter, so rows
        that failed together spread out); never less than the receiver's ``Retry-After``
        (itself capped at the maximum)."""
        full = min(self.backoff_max_ms, self.backoff_initial_ms << min(attempts - 1, 40))
        wait = full // 2 + int(self._rng.random() * (full - full // 2))
        if retry_after_ms is not None:
            wait = max(wait, min(retry_after_ms, self.backoff_max_ms))
        return wait

    def run_once(self) -> DispatchStats:
        """Try every pending row that is due, oldest first, and record each outcome. A channel
        with a rate limit (``max_per_period``) sends singly while its budget lasts; when more
        rows are due than it has left, the rest go as one digest; with none left, they wait
        until the period lets one more through."""
        stats = DispatchStats()
        now = self.now_ms()
        due = deliveries.due(self.db, now)
        firing_pending = {(r["alert_id"], r["channel"]) for r in deliveries.pending(self.db)
                          if r["event"] == "firing"}
        held: dict[str, int] = {}        # channel failed in this run → the retry time it got
        by_channel: dict[str, list[dict]] = {}
        for row in due:
            name = row["channel"]
            if name not in self.channels:
                stats.unconfigured += 1
                if name not in self._told_unconfigured:
                    self._told_unconfigured.add(name)
                    log.warning("alert deliveries to channel %s wait: no such channel is "
                                "configured (they stay pending until it is)", name)
                continue
            by_channel.setdefault(name, []).append(row)
        for name, rows in by_channel.items():
            channel = self.channels[name]
            budget, frees_at = self._budget(channel, now)
            if budget is not None and budget <= 0:
                stats.deferred += len(rows)
                held[name] = frees_at
                continue
            singles = len(rows) if budget is None or len(rows) <= budget else budget - 1
            for row in rows[:singles]:
                if name in held or (row["event"] == "resolved"
                                    and (row["alert_id"], name) in firing_pending):
                    stats.deferred += 1
                    continue
                status, retry_at = self._attempt(row, channel, stats)
                if status != PENDING:
                    firing_pending.discard((row["alert_id"], name))
                else:
                    held[name] = retry_at
            rest = rows[singles:]
            if not rest:
                continue
            if name in held:
                stats.deferred += len(rest)
                continue
            in_digest = {(r["alert_id"], name) for r in rest if r["event"] == "firing"}
            waiting = [r for r in rest if r["event"] == "resolved" and (
                r["alert_id"], name) in firing_pending - in_digest]
            stats.deferred += len(waiting)
            retry_at = self._attempt_digest([r for r in rest if r not in waiting], channel,
                                            stats)
            if retry_at is not None:
                held[name] = retry_at
        stats.next_due_at = self._next_due(held)
        return stats

    def _budget(self, channel: Channel, now: int) -> tuple[int | None, int]:
        """(messages ``channel`` may still send in its period, or None: no limit; when the
        oldest of those it sent leaves the period)."""
        limit, period = getattr(channel, "max_per_period", 0), getattr(channel, "period_ms", 0)
        if limit <= 0:
            return None, now
        sent = deliveries.sent_since(self.db, channel.name, now - period)
        return limit - len(sent), (sent[0] + period if sent else now)

    # -- one row ------------------------------------------------------------------------------
    def _attempt(self, row: dict, channel: Channel,
                 stats: DispatchStats) -> tuple[str, int | None]:
        """Send one row and commit its outcome; returns the row's new status and, when it
        stays pending, the time of its next attempt."""
        key = idempotency_key(row["alert_id"], row["event"], row["channel"])
        what = f"alert {row['alert_id']} {row['event']} to channel {row['channel']}"
        attempts = row["attempts"] + 1
        n = self._read(row, what, stats)
        if n is None:
            return GAVE_UP, None
        at, duration_ms, error, retryable, retry_after = self._send(
            lambda: channel.send(n, key), what, stats)
        now = self.now_ms()
        if error is None:
            with self.db.atomic():
                self._settle(row["id"], DELIVERED, attempts,
                             attempt=(at, True, None, duration_ms), delivered_at=now)
                if getattr(channel, "max_per_period", 0) > 0:
                    deliveries.record_send(self.db, channel.name, now, 1)
            stats.delivered += 1
            log.info("%s delivered (attempt %d)", what, attempts)
            return DELIVERED, None
        return self._failed(row, attempts, (at, False, error, duration_ms), retryable,
                            retry_after, what, stats)

    def _attempt_digest(self, rows: list[dict], channel: Channel,
                        stats: DispatchStats) -> int | None:
        """Send ``rows`` as one digest and commit each one's outcome; returns when the
        channel may be tried again after a failure (None: delivered)."""
        what = f"a digest of {len(rows)} notifications to channel {channel.name}"
        readable = [(row, n) for row in rows
                    if (n := self._read(row, f"alert {row['alert_id']} {row['event']} to "
                                         f"channel {row['channel']}", stats)) is not None]
        if not readable:
            return None
        ns = [n for _row, n in readable]
        key = f"docket-digest-{readable[0][0]['id']}-{len(ns)}-{channel.name}"
        stats.digests += 1
        at, duration_ms, error, retryable, retry_after = self._send(
            lambda: channel.send_digest(ns, key), what, stats)
        now = self.now_ms()
        if error is None:
            with self.db.atomic():
                for row, _n in readable:
                    self._settle(row["id"], DELIVERED, row["attempts"] + 1,
                                 attempt=(at, True, None, duration_ms), delivered_at=now)
                deliveries.record_send(self.db, channel.name, now, len(ns))
            stats.delivered += len(ns)
            log.warning("%s delivered (the channel's rate limit held them back): %s", what,
                        digest_summary(ns, channel.max_per_period, channel.period_ms))
            return None
        wait = self.backoff_ms(min(row["attempts"] for row, _n in readable) + 1, retry_after)
        retries = [self._failed(row, row["attempts"] + 1, (at, False, error, duration_ms),
                                retryable, retry_after, what, stats, wait_ms=wait)[1]
                   for row, _n in readable]           # one wait: they stay one digest
        return min((r for r in retries if r is not None), default=None)

    def _send(self, send: Callable[[], None], what: str, stats: DispatchStats
              ) -> tuple[int, int, str | None, bool, int | None]:
        """One send, timed: (when it began, ms; how long it took, ms; error, None when
        delivered; whether it may be retried; the receiver's Retry-After, ms)."""
        at = self.now_ms()
        started = time.monotonic()
        stats.attempted += 1
        try:
            send()
            error, retryable, retry_after = None, False, None
        except DeliveryFailed as exc:
            error, retryable, retry_after = exc.message, exc.retryable, exc.retry_after_ms
        except Exception as exc:        # a fault in a channel: keep the row, say what broke
            log.exception("%s: the channel raised an unexpected error", what)
            error, retryable, retry_after = f"{type(exc).__name__}: {exc}", True, None
        return at, int((time.monotonic() - started) * 1000), error, retryable, retry_after

    def _read(self, row: dict, what: str, stats: DispatchStats) -> Notification | None:
        """The row's notification; None when it cannot be read (the row is given up)."""
        try:
            return Notification.from_json(json.loads(row["notification"]))
        except (ValueError, TypeError) as exc:
            log.error("%s: gave up, its stored notification cannot be read: %s", what, exc)
            self._settle(row["id"], GAVE_UP, row["attempts"],
                         last_error=f"unreadable notification: {exc}")
            stats.gave_up += 1
            return None

    def _failed(self, row: dict, attempts: int, attempt: tuple[int, bool, str, int],
                retryable: bool, retry_after: int | None, what: str, stats: DispatchStats,
                wait_ms: int | None = None) -> tuple[str, int | None]:
        """A failed send of ``row``: another attempt later, or given up (not retryable, or
        too long since it was enqueued)."""
        error = attempt[2]
        now = self.now_ms()
        deadline = row["created_at"] + self.give_up_after_ms
        if not retryable or now >= deadline:
            why = "not retryable" if not retryable else \
                f"still failing {self.give_up_after_ms} ms after it was enqueued"
            self._settle(row["id"], GAVE_UP, attempts, attempt=attempt, last_error=error)
            stats.gave_up += 1
            log.error("%s: gave up after %d attempt(s), %s: %s", what, attempts, why, error)
            return GAVE_UP, None
        if wait_ms is None:
            wait_ms = self.backoff_ms(attempts, retry_after)
        next_at = min(now + wait_ms, deadline)
        self._settle(row["id"], PENDING, attempts, attempt=attempt, last_error=error,
                     next_attempt_at=next_at)
        stats.retrying += 1
        log.warning("%s failed (attempt %d), trying again in %d ms: %s", what, attempts,
                    next_at - now, error)
        return PENDING, next_at

    def _settle(self, delivery_id: int, status: str, attempts: int, **outcome) -> None:
        """Record one attempt and the row's new state in one transaction
        (``store.deliveries.settle``)."""
        deliveries.settle(self.db, delivery_id, status, attempts, **outcome)

    def _next_due(self, held: dict[str, int]) -> int | None:
        """When the next send can happen: the earliest due pending row of a configured
        channel, where a resolved row waits for its pending firing row and a channel that
        failed in this run waits for the retry of the row that failed (``held``)."""
        pending = [r for r in deliveries.pending(self.db) if r["channel"] in self.channels]
        firing_due = {(r["alert_id"], r["channel"]): r["next_attempt_at"]
                      for r in pending if r["event"] == "firing"}
        due = [max(r["next_attempt_at"], held.get(r["channel"], 0),
                   firing_due.get((r["alert_id"], r["channel"]), 0)
                   if r["event"] == "resolved" else 0)
               for r in pending]
        return min(due, default=None)

