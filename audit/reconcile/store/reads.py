"""What the reconciler's readers ask of its database: the metrics, ``docket-audit show`` and
``watermark``, the dashboard. Each question is a method of ``Store`` (this mixin), so the SQL of
the database stays in its package and a change of a table changes one place: the readers take
rows back as tuples or dicts and shape them themselves.

A part of ``Store`` (``store/__init__.py``), as a mixin: ``self.conn`` is its ``sqlite3``
connection, ``self.db`` the same through sqlite-utils.
"""

from __future__ import annotations

from . import deliveries

# The columns of a window's row the dashboard's overview shows, in its order.
OVERVIEW_COLUMNS = ("tier", "topic", "window_start", "state", "final", "expected", "count",
                    "distinct_count", "duplicates", "completeness", "hop_completeness",
                    "missing", "checksum")
# ... and the topic history's.
HISTORY_COLUMNS = ("window_start", "tier", "state", "final", "expected", "count",
                   "distinct_count", "duplicates", "dropped", "dropped_unknown", "completeness",
                   "hop_completeness")


class StoreReads:
    # -- the windows ----------------------------------------------------------------------------
    def window_states(self) -> dict[tuple[str, str, int], int]:
        """(tier, state, final) → how many windows are in it."""
        return {(tier, state, final): n for tier, state, final, n in self.conn.execute(
            "SELECT tier, state, final, count(*) FROM windows GROUP BY tier, state, final")}

    def window_rows(self, since_ms: int, topic: str | None = None) -> list[dict]:
        """Every tier's row of the windows that started at ``since_ms`` or later (of ``topic``
        only, when given), by topic and window."""
        where, params = "window_start >= ?", [since_ms]
        if topic is not None:
            where += " AND topic = ?"
            params.append(topic)
        return list(self.db.query(f"SELECT * FROM windows WHERE {where} "
                                  "ORDER BY topic, window_start", params))

    def origins_short(self, topic: str, window_start: int, tier: str, complete: str
                      ) -> list[tuple[str, str, int, str]]:
        """(origin, state, missing, reason) of each origin not ``complete`` at ``tier`` in the
        window, the most missing first."""
        return self.conn.execute(
            "SELECT origin, state, missing, reason FROM window_origins WHERE topic = ? "
            "AND window_start = ? AND tier = ? AND state != ? ORDER BY missing DESC, origin",
            (topic, window_start, tier, complete)).fetchall()

    def tier_runs(self, topic: str, tier: str) -> list[tuple[int, int, str, int, str]]:
        """(window start, window length, state, final, checksum) of the topic's windows at
        ``tier``, oldest first: what a watermark is read from."""
        return self.conn.execute(
            "SELECT window_start, window_ms, state, final, checksum FROM windows "
            "WHERE topic = ? AND tier = ? ORDER BY window_start", (topic, tier)).fetchall()

    def judged_tiers(self) -> list[str]:
        """Every tier that reported on some topic."""
        return [r[0] for r in self.conn.execute("SELECT DISTINCT tier FROM topic_tiers")]

    def state_totals(self, since_ms: int, topic: str | None = None
                     ) -> list[tuple[str, str, int]]:
        """(tier, state, windows) since ``since_ms`` (of ``topic`` only, when given)."""
        where, args = self._since(since_ms, topic)
        return self.conn.execute("SELECT tier, state, count(*) FROM windows WHERE " + where
                                 + " GROUP BY tier, state", args).fetchall()

    def topics_at(self, tier: str, since_ms: int, topic: str | None = None) -> list[str]:
        """The topics with windows at ``tier`` since ``since_ms``, by name."""
        where, args = self._since(since_ms, topic)
        return [r[0] for r in self.conn.execute(
            "SELECT DISTINCT topic FROM windows WHERE tier = ? AND " + where + " ORDER BY topic",
            [tier, *args])]

    def overview_rows(self, tier: str, topics: list[str], since_ms: int) -> list[tuple]:
        """``OVERVIEW_COLUMNS`` of the windows of ``topics`` at ``tier`` since ``since_ms``."""
        if not topics:
            return []
        marks = ",".join("?" * len(topics))
        return self.conn.execute(
            f"SELECT {', '.join(OVERVIEW_COLUMNS)} FROM windows "
            f"WHERE tier = ? AND topic IN ({marks}) AND window_start >= ? "
            "ORDER BY topic, window_start", [tier, *topics, since_ms]).fetchall()

    def history_rows(self, topic: str, since_ms: int) -> list[tuple]:
        """``HISTORY_COLUMNS`` of every tier's windows of ``topic`` since ``since_ms``."""
        return self.conn.execute(
            f"SELECT {', '.join(HISTORY_COLUMNS)} FROM windows "
            "WHERE topic = ? AND window_start >= ? ORDER BY window_start",
            (topic, since_ms)).fetchall()

    def producer_drop_reasons(self, topic: str, since_ms: int) -> list[str | None]:
        """The producers' ``dropped_reasons`` (JSON) of ``topic``'s windows since ``since_ms``."""
        return [r[0] for r in self.conn.execute(
            "SELECT dropped_reasons FROM counts WHERE topic = ? AND tier = 'producer' AND "
            "window_start >= ?", (topic, since_ms))]

    def window_tiers(self, topic: str, window_start: int) -> list[dict]:
        """Each tier's row of one window."""
        return list(self.db.query("SELECT * FROM windows WHERE topic = ? AND window_start = ?",
                                  (topic, window_start)))

    def window_origin_rows(self, topic: str, window_start: int) -> list[dict]:
        """Each (origin, tier)'s row of one window, by origin."""
        return list(self.db.query("SELECT * FROM window_origins WHERE topic = ? AND "
                                  "window_start = ? ORDER BY origin", (topic, window_start)))

    def changed_since_judged(self, topic: str, window_start: int) -> bool:
        """Whether the window changed since it was last judged (or is being judged now)."""
        return self.conn.execute(
            "SELECT 1 FROM dirty WHERE topic = ? AND window_start = ? UNION ALL "
            "SELECT 1 FROM evaluating WHERE topic = ? AND window_start = ?",
            (topic, window_start, topic, window_start)).fetchone() is not None

    def revisions(self, topic: str, window_start: int) -> list[dict]:
        """The window's changes after it was final, oldest first."""
        return list(self.db.query(
            "SELECT tier, revision, at, state FROM window_revisions WHERE topic = ? AND "
            "window_start = ? ORDER BY at, tier", (topic, window_start)))

    def newest_counted(self) -> list[tuple[str, int]]:
        """(tier, the newest window it counted something in)."""
        return self.conn.execute("SELECT tier, max(window_start) FROM windows WHERE count > 0 "
                                 "GROUP BY tier").fetchall()

    def progress_rows(self) -> list[dict]:
        """Every job's newest progress record, by tier and emitter."""
        return list(self.db.query("SELECT * FROM progress ORDER BY tier, emitter"))

    # -- what was skipped, what was delivered ----------------------------------------------------
    def malformed_counts(self) -> list[tuple[str, int]]:
        """(reason, records skipped for it)."""
        return self.conn.execute("SELECT reason, records FROM malformed ORDER BY reason"
                                 ).fetchall()

    def delivery_statuses(self) -> dict[str, int]:
        """The alert outbox's rows by status."""
        return deliveries.by_status(self.db)

    @staticmethod
    def _since(since_ms: int, topic: str | None) -> tuple[str, list]:
        where, args = "window_start >= ?", [since_ms]
        if topic:
            where += " AND topic = ?"
            args.append(topic)
        return where, args
