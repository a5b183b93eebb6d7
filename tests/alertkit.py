"""Helpers of the alert delivery tests: a notification as the reconciler hands one over, and a
clock the tests move."""

from __future__ import annotations

from audit.reconcile.alerts import Notification

T0 = 1_795_418_400_000            # 2026-11-23T07:20:00Z


def notification(alert_id=12, event="firing", **over) -> Notification:
    fields = dict(alert_id=alert_id, event=event, kind="loss", alert_class="data",
                  topic="app.events", window_start=T0 - 600_000, window_ms=600_000,
                  tier="kafka-local", origin="web-42", owner="team-a",
                  summary="1001 events missing at kafka-local",
                  detail={"expected": 12345, "actual": 11344,
                          "missing": [[1000, 1999], [5000, 5000]]},
                  fired_at=T0 + 123, resolved_at=T0 + 900_000 if event == "resolved" else None)
    fields.update(over)
    return Notification(**fields)


class FakeClock:
    """Seconds, as ``time.time`` gives them, from a time in ms the test sets."""

    def __init__(self, ms: int = T0):
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000

    def to(self, ms: int | None) -> None:
        assert ms is not None
        self.ms = max(self.ms, ms)


def rows(db) -> list[dict]:
    """The outbox's deliveries, in order."""
    return list(db.query("SELECT * FROM alert_deliveries ORDER BY id"))


def attempts(db) -> list[dict]:
    """Every delivery attempt recorded, in order."""
    return list(db.query("SELECT * FROM alert_delivery_attempts ORDER BY rowid"))
