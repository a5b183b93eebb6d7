"""The alert outbox's two tables (``alert_deliveries``, ``alert_delivery_attempts``; drawn with
their invariants in ``audit/reconcile/alerts/__init__.py``) and every statement sent to them.
The outbox (``alerts/outbox.py``) decides what to send and when; it reads and writes its rows
here. Each function takes the ``sqlite_utils.Database`` it works on: the dispatcher has a
connection of its own, in its own thread.
"""

from __future__ import annotations

import sqlite_utils

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS alert_deliveries (
        id INTEGER PRIMARY KEY,
        alert_id INTEGER NOT NULL,
        event TEXT NOT NULL CHECK (event IN ('firing', 'resolved')),
        channel TEXT NOT NULL,
        notification TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'delivered', 'gave_up')),
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at INTEGER NOT NULL,
        last_error TEXT,
        created_at INTEGER NOT NULL,
        delivered_at INTEGER,
        UNIQUE (alert_id, event, channel))""",
    "CREATE INDEX IF NOT EXISTS alert_deliveries_due "
    "ON alert_deliveries (status, next_attempt_at)",
    """CREATE TABLE IF NOT EXISTS alert_delivery_attempts (
        delivery_id INTEGER NOT NULL REFERENCES alert_deliveries (id),
        at INTEGER NOT NULL,
        ok INTEGER NOT NULL,
        error TEXT,
        duration_ms INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS alert_delivery_attempts_delivery "
    "ON alert_delivery_attempts (delivery_id)",
    # every message a rate-limited channel delivered (one notification, or a digest of those
    # held back), for its limit; kept one period
    """CREATE TABLE IF NOT EXISTS channel_sends (
        channel TEXT NOT NULL,
        at INTEGER NOT NULL,
        notifications INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS channel_sends_at ON channel_sends (channel, at)",
)


def ensure_tables(db: sqlite_utils.Database) -> None:
    """Create the outbox tables and indexes if missing (inside the caller's transaction when
    one is open)."""
    with db.atomic():
        for statement in SCHEMA:
            db.execute(statement)


def add(db: sqlite_utils.Database, alert_id: int, event: str, channel: str, body: str,
        now_ms: int) -> int:
    """One pending row for (alert, event, channel), due at once, unless it is there already:
    the rows added (1 or 0)."""
    return db.execute(
        "INSERT INTO alert_deliveries (alert_id, event, channel, notification, status, "
        "attempts, next_attempt_at, created_at) VALUES (?, ?, ?, ?, 'pending', 0, ?, ?) "
        "ON CONFLICT (alert_id, event, channel) DO NOTHING",
        (alert_id, event, channel, body, now_ms, now_ms)).rowcount


def due(db: sqlite_utils.Database, now_ms: int) -> list[dict]:
    """The pending rows due at ``now_ms``, oldest first."""
    return list(db.query(
        "SELECT id, alert_id, event, channel, notification, attempts, created_at "
        "FROM alert_deliveries WHERE status = 'pending' AND next_attempt_at <= ? "
        "ORDER BY id", (now_ms,)))


def pending(db: sqlite_utils.Database) -> list[dict]:
    """(alert_id, event, channel, next_attempt_at) of every pending row."""
    return list(db.query("SELECT alert_id, event, channel, next_attempt_at FROM "
                         "alert_deliveries WHERE status = 'pending'"))


def settle(db: sqlite_utils.Database, delivery_id: int, status: str, attempts: int, *,
           attempt: tuple[int, bool, str | None, int] | None = None,
           last_error: str | None = None, next_attempt_at: int | None = None,
           delivered_at: int | None = None) -> None:
    """Record one attempt (at, ok, error, duration_ms) and the row's new state in one
    transaction."""
    with db.atomic():
        if attempt is not None:
            at, ok, error, duration_ms = attempt
            db.execute(
                "INSERT INTO alert_delivery_attempts (delivery_id, at, ok, error, "
                "duration_ms) VALUES (?, ?, ?, ?, ?)",
                (delivery_id, at, int(ok), error, duration_ms))
        db.execute(
            "UPDATE alert_deliveries SET status = ?, attempts = ?, "
            "next_attempt_at = COALESCE(?, next_attempt_at), "
            "last_error = COALESCE(?, last_error), delivered_at = ? WHERE id = ?",
            (status, attempts, next_attempt_at, last_error, delivered_at, delivery_id))


def sent_since(db: sqlite_utils.Database, channel: str, since_ms: int) -> list[int]:
    """When ``channel`` delivered each message after ``since_ms``, oldest first; older ones are
    forgotten here."""
    with db.atomic():
        db.execute("DELETE FROM channel_sends WHERE channel = ? AND at <= ?",
                   (channel, since_ms))
        return [at for (at,) in db.execute(
            "SELECT at FROM channel_sends WHERE channel = ? ORDER BY at", (channel,))]


def record_send(db: sqlite_utils.Database, channel: str, at_ms: int, notifications: int) -> None:
    with db.atomic():
        db.execute("INSERT INTO channel_sends VALUES (?, ?, ?)", (channel, at_ms, notifications))


def of_alerts(db: sqlite_utils.Database, alert_ids: list[int]) -> list[dict]:
    """(alert_id, event, channel, status, attempts) of the rows of ``alert_ids``, oldest
    first."""
    if not alert_ids:
        return []
    return list(db.query(
        "SELECT alert_id, event, channel, status, attempts FROM alert_deliveries "
        f"WHERE alert_id IN ({','.join('?' * len(alert_ids))}) ORDER BY id", alert_ids))


def by_status(db: sqlite_utils.Database) -> dict[str, int]:
    """The rows by status."""
    return dict(db.execute("SELECT status, count(*) FROM alert_deliveries GROUP BY status"
                           ).fetchall())
