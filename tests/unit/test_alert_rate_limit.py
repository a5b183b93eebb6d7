"""A channel's rate limit: at most ``max_per_period`` messages in any ``period_ms``; what is due
beyond it goes as one digest once the period lets one more through, and nothing is dropped.
Against a scripted channel on a fake clock, and the digest's forms on a real HTTP receiver and
in an e-mail."""

from __future__ import annotations

import json
import threading
from email import message_from_bytes
from email.policy import default as default_policy
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
import sqlite_utils

from audit.reconcile.alerts import DeliveryFailed, Dispatcher, EmailChannel, WebhookChannel, enqueue
from audit.reconcile.alerts.notification import Notification
from tests.alertkit import T0, FakeClock, attempts, notification, rows

PERIOD = 600_000


class Limited:
    """A channel allowed ``limit`` messages per period, answering from a script ("ok",
    "retry"), recording each message: ("one", alert_id, event) or ("digest", [(alert_id,
    event), ...])."""

    def __init__(self, limit: int, *script):
        self.name, self.max_per_period, self.period_ms = "ops", limit, PERIOD
        self.script, self.messages = list(script), []

    def _answer(self) -> None:
        if (self.script.pop(0) if self.script else "ok") == "retry":
            raise DeliveryFailed("503 try later", True)

    def send(self, n: Notification, key: str) -> None:
        self.messages.append(("one", n.alert_id, n.event))
        self._answer()

    def send_digest(self, ns: list[Notification], key: str) -> None:
        self.messages.append(("digest", [(n.alert_id, n.event) for n in ns]))
        self._answer()


@pytest.fixture
def db(tmp_path):
    return sqlite_utils.Database(tmp_path / "reconcile.db")


def storm(db, ids, event="firing", at=T0):
    for alert_id in ids:
        enqueue(db, notification(alert_id, event), ["ops"], at)


def test_a_storm_beyond_the_limit_goes_as_singles_then_one_digest(db):
    clock, ops = FakeClock(), Limited(3)
    storm(db, range(1, 11))
    stats = Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert ops.messages == [("one", 1, "firing"), ("one", 2, "firing"),
                            ("digest", [(i, "firing") for i in range(3, 11)])]
    assert (stats.delivered, stats.digests, stats.attempted) == (10, 1, 3)
    assert {r["status"] for r in rows(db)} == {"delivered"}
    assert len(attempts(db)) == 10                          # one per notification
    # the budget is spent: what comes next waits for the period to let one more through
    clock.to(T0 + 1000)
    storm(db, [11, 12], at=T0 + 1000)
    stats = Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert stats.deferred == 2 and len(ops.messages) == 3
    assert stats.next_due_at == T0 + PERIOD                 # when the first send leaves it
    clock.to(stats.next_due_at + 1)                         # the whole budget is back
    Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert ops.messages[3:] == [("one", 11, "firing"), ("one", 12, "firing")]
    assert {r["status"] for r in rows(db)} == {"delivered"}


def test_within_the_limit_every_notification_goes_on_its_own(db):
    clock, ops = FakeClock(), Limited(3)
    storm(db, [1, 2, 3])
    Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert [m[0] for m in ops.messages] == ["one"] * 3


def test_no_limit_never_digests(db):
    clock, ops = FakeClock(), Limited(0)
    storm(db, range(1, 31))
    Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert [m[0] for m in ops.messages] == ["one"] * 30


def test_a_failed_digest_keeps_every_row_pending_and_is_sent_again(db):
    clock, ops = FakeClock(), Limited(1, "retry")
    storm(db, range(1, 6))
    stats = Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert stats.retrying == 5 and stats.delivered == 0
    assert {r["status"] for r in rows(db)} == {"pending"}
    clock.to(stats.next_due_at)
    Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert ops.messages == [("digest", [(i, "firing") for i in range(1, 6)])] * 2
    assert {(r["status"], r["attempts"]) for r in rows(db)} == {("delivered", 2)}


def test_a_resolved_event_goes_in_the_digest_with_its_firing_one(db):
    clock, ops = FakeClock(), Limited(1)
    storm(db, [1, 2])
    enqueue(db, notification(1, "resolved"), ["ops"], T0)
    Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert ops.messages == [("digest", [(1, "firing"), (2, "firing"), (1, "resolved")])]


def test_the_limit_holds_across_dispatchers(db):
    """The sends are counted in the database: a restarted reconciler keeps the budget."""
    clock = FakeClock()
    storm(db, [1, 2])
    Dispatcher(db, {"ops": Limited(2)}, clock=clock).run_once()
    storm(db, [3], at=T0 + 10)
    ops = Limited(2)
    clock.to(T0 + 10)
    assert Dispatcher(db, {"ops": ops}, clock=clock).run_once().deferred == 1
    assert ops.messages == []


class Receiver(BaseHTTPRequestHandler):
    bodies: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Receiver.bodies.append((self.headers["Idempotency-Key"], json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("fmt", ["json", "slack"])
def test_a_digest_reaches_a_real_webhook_receiver(db, fmt):
    Receiver.bodies = []
    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        hook = WebhookChannel("ops", f"http://127.0.0.1:{server.server_port}/hook", format=fmt,
                              max_per_period=1)
        storm(db, [1, 2, 3])
        enqueue(db, notification(4, "resolved", kind="silent_producer", alert_class="health",
                                 topic=None, window_start=None, window_ms=None), ["ops"], T0)
        Dispatcher(db, {"ops": hook}, clock=FakeClock()).run_once()
    finally:
        server.shutdown()
        server.server_close()
    [(key, body)] = Receiver.bodies
    first_row = rows(db)[0]["id"]
    assert key == f"docket-digest-{first_row}-4-ops"
    summary = ("4 alert notifications held back by the rate limit (1 per 600 s): FIRING loss ×3, "
               "RESOLVED silent_producer ×1")
    if fmt == "json":
        assert (body["digest"], body["held_back"], body["summary"]) == (True, 4, summary)
        assert [Notification.from_json(n).alert_id for n in body["notifications"]] == [1, 2, 3, 4]
    else:
        assert body["text"] == summary
        assert body["attachments"][0]["text"].count("\n") == 3
        assert "RESOLVED silent_producer" in body["attachments"][0]["text"]


def test_a_digest_by_e_mail_holds_every_notification():
    mail = EmailChannel("mail", "127.0.0.1", 25, "docket@example.com", ["ops@example.com"],
                        max_per_period=5)
    ns = [notification(i) for i in (7, 8)]
    msg = message_from_bytes(mail.digest_message(ns, "docket-digest-3-2-mail").as_bytes(),
                             policy=default_policy)
    assert msg["Subject"] == ("[docket] 2 alert notifications held back by the rate limit "
                              "(5 per 600 s): FIRING loss ×2")
    assert msg["Message-ID"] == "<docket-digest-3-2-mail@example.com>"
    assert msg.get_content().count("FIRING: 1001 events missing at kafka-local") == 2
