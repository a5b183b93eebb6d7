"""Every statement sent to the alerts' own tables, ``alerts``, ``alert_members`` (the origins a
grouped alert covers) and ``snoozes`` (their schema is the store's, ``store/__init__.py``): the
lifecycle (``alerts/lifecycle.py``) decides what fires, resolves, is snoozed or resolved by
hand, and reads and writes its rows here. In the caller's transaction, as the lifecycle runs in
an evaluation's.

A part of ``Store`` (``store/__init__.py``), as a mixin: ``self.conn`` is its ``sqlite3``
connection, ``self.db`` the same through sqlite-utils.
"""

from __future__ import annotations

import json

from . import deliveries


class AlertTables:
    # -- the lifecycle's reads -----------------------------------------------------------------
    def open_alerts_of(self, topic: str, starts_json: str) -> list[tuple[str, int, int, int]]:
        """(key, window start, id, notified) of the open alerts of ``topic``'s windows that
        start at one of ``starts_json`` (a JSON list), oldest first."""
        return self.conn.execute(
            "SELECT key, window_start, id, notified FROM alerts WHERE status = 'open' AND "
            "topic = ? AND window_start IN (SELECT value FROM json_each(?)) ORDER BY id",
            (topic, starts_json)).fetchall()

    def open_alert(self, key: str) -> list[tuple[int, int]]:
        """(id, notified) of the open alert of ``key`` (none or one)."""
        return self.conn.execute("SELECT id, notified FROM alerts WHERE status = 'open' AND "
                                 "key = ?", (key,)).fetchall()

    def snoozed_keys(self, until: int) -> list[str]:
        """The keys snoozed until exactly ``until`` (the lifecycle's "for ever": resolved by
        hand)."""
        return [r[0] for r in self.conn.execute("SELECT key FROM snoozes WHERE until = ?",
                                                (until,))]

    def snoozed_until(self, key: str, until: int) -> bool:
        return self.conn.execute("SELECT 1 FROM snoozes WHERE key = ? AND until = ?",
                                 (key, until)).fetchone() is not None

    def unnotified_due(self, now_ms: int, ids: list[int] | None = None) -> list[int]:
        """The open alerts not notified yet (of ``ids``, or all) whose key is not snoozed at
        ``now_ms``."""
        query = ("SELECT a.id FROM alerts a LEFT JOIN snoozes s ON s.key = a.key WHERE "
                 "a.status = 'open' AND a.notified = 0 AND (s.until IS NULL OR s.until <= ?)")
        if ids is None:
            return [i for (i,) in self.conn.execute(query, (now_ms,))]
        return [i for alert_id in ids
                for (i,) in self.conn.execute(query + " AND a.id = ?", (now_ms, alert_id))]

    def alert_row(self, alert_id: int) -> dict | None:
        return next(iter(self.db.query("SELECT * FROM alerts WHERE id = ?", (alert_id,))),
                    None)

    def alert_state(self, alert_id: int) -> tuple[str, int] | None:
        """(status, notified) of an alert; None when there is none of that id."""
        return self.conn.execute("SELECT status, notified FROM alerts WHERE id = ?",
                                 (alert_id,)).fetchone()

    def alert_key(self, alert_id: int) -> str | None:
        row = self.conn.execute("SELECT key FROM alerts WHERE id = ?", (alert_id,)).fetchone()
        return None if row is None else row[0]

    # -- the lifecycle's writes ----------------------------------------------------------------
    def clear_snoozes(self, keys: list[str]) -> None:
        self.conn.executemany("DELETE FROM snoozes WHERE key = ?", [(k,) for k in keys])

    def fire(self, key: str, kind: str, alert_class: str, topic: str | None,
             window_start: int | None, window_ms: int | None, tier: str | None,
             origin: str | None, owner: str | None, summary: str, detail_json: str,
             now_ms: int) -> int:
        """A new open alert; its id."""
        return self.conn.execute(
            "INSERT INTO alerts (key, kind, alert_class, status, topic, window_start, "
            "window_ms, tier, origin, owner, summary, detail, fired_at) "
            "VALUES (?, ?, ?, 'open', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (key, kind, alert_class, topic, window_start, window_ms, tier, origin, owner,
             summary, detail_json, now_ms)).lastrowid

    def resolve(self, alert_id: int, now_ms: int, by: str) -> None:
        self.conn.execute("UPDATE alerts SET status = 'resolved', resolved_at = ?, "
                          "resolved_by = ? WHERE id = ?", (now_ms, by, alert_id))

    def mark_notified(self, alert_id: int) -> None:
        self.conn.execute("UPDATE alerts SET notified = 1 WHERE id = ?", (alert_id,))

    def update_alert(self, alert_id: int, summary: str, detail_json: str) -> None:
        """An open grouped alert's text after its members changed."""
        self.conn.execute("UPDATE alerts SET summary = ?, detail = ? WHERE id = ?",
                          (summary, detail_json, alert_id))

    # -- a grouped alert's members: the origins it covers -------------------------------------
    def holding_members(self, alert_id: int) -> dict[str, tuple[str, str]]:
        """origin → (summary, detail JSON) of the members of ``alert_id`` whose condition still
        holds, as last seen."""
        return {origin: (summary, detail) for origin, summary, detail in self.conn.execute(
            "SELECT origin, summary, detail FROM alert_members WHERE alert_id = ? AND "
            "status = 'holding'", (alert_id,))}

    def hold_members(self, alert_id: int, members: list[tuple[str, str, str]],
                     now_ms: int) -> None:
        """(origin, summary, detail JSON) of members that hold now: added, or their figures
        brought up to date (a member that cleared and holds again holds since now)."""
        self.conn.executemany(
            "INSERT INTO alert_members VALUES (?, ?, 'holding', ?, ?, ?, NULL) "
            "ON CONFLICT (alert_id, origin) DO UPDATE SET summary = excluded.summary, "
            "detail = excluded.detail, since = CASE WHEN status = 'holding' THEN since "
            "ELSE excluded.since END, status = 'holding', cleared_at = NULL",
            [(alert_id, origin, summary, detail, now_ms) for origin, summary, detail in members])

    def clear_members(self, alert_id: int, origins: list[str], now_ms: int) -> None:
        self.conn.executemany(
            "UPDATE alert_members SET status = 'cleared', cleared_at = ? WHERE alert_id = ? "
            "AND origin = ?", [(now_ms, alert_id, origin) for origin in origins])

    def members_of(self, alert_ids: list[int]) -> list[dict]:
        """The members of ``alert_ids``, each alert's holding ones first, then by origin."""
        return list(self.db.query(
            "SELECT * FROM alert_members WHERE alert_id IN (SELECT value FROM json_each(?)) "
            "ORDER BY alert_id, status DESC, origin", (json.dumps(alert_ids),)))

    def snooze_key(self, key: str, until: int, by: str, now_ms: int) -> None:
        self.conn.execute("INSERT OR REPLACE INTO snoozes VALUES (?, ?, ?, ?)",
                          (key, until, by, now_ms))

    # -- what the dashboard, docket-audit alerts and the metrics read --------------------------
    def alert_list(self, status_where: str, now_ms: int, newest_first: bool,
                   limit: int | None) -> list[dict]:
        """The alerts matching ``status_where`` (a condition on ``a``, the alert, and ``s``,
        its snooze, with ``:now``; the lifecycle's own, never a user's text), each with its
        snooze still running at ``now_ms``."""
        return list(self.db.query(
            "SELECT a.*, CASE WHEN s.until > :now THEN s.until END AS snoozed_until, "
            "CASE WHEN s.until > :now THEN s.by END AS snoozed_by FROM alerts a "
            f"LEFT JOIN snoozes s ON s.key = a.key WHERE {status_where} "
            f"ORDER BY a.id {'DESC' if newest_first else 'ASC'}"
            + ("" if limit is None else f" LIMIT {int(limit)}"), {"now": now_ms}))

    def deliveries_of(self, alert_ids: list[int]) -> list[dict]:
        return deliveries.of_alerts(self.db, alert_ids)

    def alerts_of_window(self, topic: str, window_start: int) -> list[dict]:
        """The alerts one window raised, oldest first."""
        return list(self.db.query(
            "SELECT id, kind, status, tier, origin, summary, fired_at, resolved_at FROM alerts "
            "WHERE topic = ? AND window_start = ? ORDER BY id", (topic, window_start)))

    def open_health_kinds(self, tier: str) -> list[tuple[str, str]]:
        """(origin, kind) of the open health alerts (``silent_producer``, ``clock_skew``) of
        ``tier``, by kind: an alert's own origin, or each member of a grouped one that still
        holds."""
        return self.conn.execute(
            "SELECT DISTINCT coalesce(m.origin, a.origin), a.kind FROM alerts a "
            "LEFT JOIN alert_members m ON m.alert_id = a.id AND m.status = 'holding' "
            "WHERE a.status = 'open' AND a.tier = ? AND a.kind IN "
            "('silent_producer', 'clock_skew') AND coalesce(m.origin, a.origin) IS NOT NULL "
            "ORDER BY a.kind", (tier,)).fetchall()

    def open_keys_of_kind(self, kind: str) -> list[str]:
        return [k for (k,) in self.conn.execute(
            "SELECT key FROM alerts WHERE status = 'open' AND kind = ?", (kind,))]

    def open_alert_counts(self) -> dict[tuple[str, str], int]:
        """(kind, class) → how many alerts are open."""
        return {(kind, cls): n for kind, cls, n in self.conn.execute(
            "SELECT kind, alert_class, count(*) FROM alerts WHERE status = 'open' "
            "GROUP BY kind, alert_class")}
