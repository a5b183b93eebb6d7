"""Alert delivery without a network: the outbox and dispatcher against scripted channels (the
transport seam) and a fake clock, the notification's forms, and the channel settings.

Real receivers (HTTP, SMTP, Alertmanager) are in tests/integration/test_alert_delivery.py.
"""

from __future__ import annotations

import inspect
import json
import random
from email import message_from_bytes
from email.policy import default as default_policy
from pathlib import Path

import pytest
import sqlite_utils
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.reconcile.alerts import (
    AlertmanagerChannel,
    ChannelConfigError,
    DeliveryFailed,
    Dispatcher,
    EmailChannel,
    Notification,
    WebhookChannel,
    channel_from_config,
    enqueue,
)
from audit.reconcile.alerts.channels import alertmanager_alert, slack_body
from audit.reconcile.channel_settings import SETTINGS, reference_markdown
from tests.alertkit import T0, FakeClock, attempts, notification, rows


@pytest.fixture
def db(tmp_path):
    return sqlite_utils.Database(tmp_path / "reconcile.db")


DOCS = Path(__file__).resolve().parents[2] / "docs"


class Scripted:
    """A channel that answers from a script: "ok", "retry", "fatal" (then "ok" forever),
    records what it was asked to send, and can crash after sending."""

    def __init__(self, name: str, *script, retry_after_ms=None):
        self.name, self.script, self.retry_after_ms = name, list(script), retry_after_ms
        self.sent: list[tuple[int, str, str, str]] = []    # (alert_id, event, key, outcome)
        self.crash_after_send = False

    def send(self, n: Notification, idempotency_key: str) -> None:
        outcome = self.script.pop(0) if self.script else "ok"
        self.sent.append((n.alert_id, n.event, idempotency_key, outcome))
        if outcome == "retry":
            raise DeliveryFailed("503 try later", True, self.retry_after_ms)
        if outcome == "fatal":
            raise DeliveryFailed("400 bad request", False)
        if outcome == "bug":
            raise KeyError("oops")
        if self.crash_after_send:
            raise SimulatedCrash()

    def delivered(self) -> list[tuple[int, str]]:
        return [(a, e) for a, e, _, outcome in self.sent if outcome == "ok"]


class SimulatedCrash(BaseException):
    """The process dies here: nothing after it runs."""


# -- the notification ---------------------------------------------------------------------------


def test_a_notification_round_trips_through_json_and_ignores_the_webhook_key():
    n = notification(event="resolved")
    body = json.loads(json.dumps({**n.to_json(), "idempotency_key": "docket-12-resolved-x"}))
    assert body["v"] == 1
    assert Notification.from_json(body) == n


@pytest.mark.parametrize("over,problem", [
    ({"event": "fired"}, "event must be one of"),
    ({"kind": "lost"}, "kind must be one of"),
    ({"alert_class": "ops"}, "alert_class must be one of"),
    ({"event": "resolved", "resolved_at": None}, "a resolved event needs resolved_at"),
    ({"summary": "two\nlines"}, "summary must be one line"),
    ({"detail": {"at": object()}}, "detail must be JSON-able"),
])


def test_a_notification_that_breaks_the_contract_is_refused(over, problem):
    with pytest.raises(ValueError, match=problem):
        notification(**over)


def test_a_stored_notification_of_another_version_is_refused():
    with pytest.raises(ValueError, match="version 2"):
        Notification.from_json({**notification().to_json(), "v": 2})


def test_the_headline_says_event_kind_topic_window_tier_origin():
    assert notification().headline() == \
        "FIRING loss app.events 2026-11-23T07:10Z kafka-local web-42"
    health = notification(kind="audit_lag", alert_class="health", topic=None, window_start=None,
                          window_ms=None, origin=None, event="resolved")
    assert health.headline() == "RESOLVED audit_lag kafka-local"


def test_the_text_names_every_field_and_every_detail():
    text = notification().text()
    for expected in ("FIRING: 1001 events missing at kafka-local", "Topic:", "app.events",
                     "2026-11-23T07:10:00Z to 2026-11-23T07:20:00Z (600000 ms)", "team-a",
                     "2026-11-23T07:20:00.123Z", "expected: 12345", "actual: 11344",
                     "missing: [[1000,1999],[5000,5000]]"):
        assert expected in text


# -- the bodies ---------------------------------------------------------------------------------


def test_the_webhook_json_body_is_the_notification_plus_its_key():
    body = WebhookChannel("ops", "http://x").body(notification(), "docket-12-firing-ops")
    assert body == {**notification().to_json(), "idempotency_key": "docket-12-firing-ops"}


def test_the_slack_body_escapes_names_from_the_data():
    body = slack_body(notification(topic="<!channel>&co", summary="a <b> & c"))
    assert "<!channel>" not in json.dumps(body)
    assert body["text"].startswith("FIRING loss &lt;!channel&gt;&amp;co ")
    fields = {f["title"]: f["value"] for f in body["attachments"][0]["fields"]}
    assert fields["Topic"] == "&lt;!channel&gt;&amp;co"
    assert fields["missing"] == "[[1000,1999],[5000,5000]]"


def test_alertmanager_labels_identify_the_alert_and_endsat_follows_the_event():
    firing = alertmanager_alert(notification(), now_ms=T0 + 5000, firing_hold_ms=3_600_000)
    assert firing["labels"] == {"alertname": "DocketLoss", "alert_class": "data",
                                "severity": "critical", "topic": "app.events",
                                "window": "2026-11-23T07:10:00Z", "tier": "kafka-local",
                                "origin": "web-42", "owner": "team-a"}
    assert firing["startsAt"] == "2026-11-23T07:20:00.123Z"
    assert firing["endsAt"] == "2026-11-23T08:20:05.000Z"        # sent + hold
    assert json.loads(firing["annotations"]["description"])["expected"] == 12345
    resolved = alertmanager_alert(notification(event="resolved"), T0 + 10**7, 3_600_000)
    assert resolved["labels"] == firing["labels"]
    assert resolved["endsAt"] == "2026-11-23T07:35:00.000Z"      # resolved_at
    lag = alertmanager_alert(notification(kind="checksum_mismatch", owner=None, origin=None),
                             T0, 60_000)
    assert lag["labels"]["alertname"] == "DocketChecksumMismatch"
    assert "owner" not in lag["labels"] and "origin" not in lag["labels"]


def test_the_email_has_the_subject_message_id_and_thread_of_its_alert():
    ch = EmailChannel("ops", "127.0.0.1", 25, "Docket <docket@example.com>", ["a@example.com"])
    firing = message_from_bytes(bytes(ch.message(notification(), "docket-12-firing-ops")),
                                policy=default_policy)
    assert firing["Subject"] == \
        "[docket] FIRING loss app.events 2026-11-23T07:10Z kafka-local web-42"
    assert firing["Message-ID"] == "<docket-12-firing-ops@example.com>"
    assert "missing: [[1000,1999],[5000,5000]]" in firing.get_content()
    resolved = ch.message(notification(event="resolved"), "docket-12-resolved-ops")
    assert resolved["In-Reply-To"] == "<docket-12-firing-ops@example.com>"


# -- enqueue ------------------------------------------------------------------------------------


def test_enqueueing_twice_adds_one_row_per_channel(db):
    assert enqueue(db, notification(), ["ops", "mail"], T0) == 2
    assert enqueue(db, notification(), ["ops", "mail", "ops"], T0 + 1) == 0
    assert enqueue(db, notification(), ["ops", "pager"], T0 + 2) == 1
    assert [(r["channel"], r["status"], r["next_attempt_at"]) for r in rows(db)] == \
        [("ops", "pending", T0), ("mail", "pending", T0), ("pager", "pending", T0 + 2)]
    assert Notification.from_json(json.loads(rows(db)[0]["notification"])) == notification()


def test_enqueue_inside_the_callers_transaction_commits_or_rolls_back_with_it(db):
    enqueue(db, notification(alert_id=1), ["ops"], T0)         # creates the tables
    with pytest.raises(RuntimeError), db.atomic():
        db.execute("CREATE TABLE alerts_seen (id INTEGER)")
        enqueue(db, notification(alert_id=2), ["ops"], T0)
        raise RuntimeError("the reconciler failed before committing its alert")
    assert [r["alert_id"] for r in rows(db)] == [1]
    with db.atomic():
        enqueue(db, notification(alert_id=3), ["ops"], T0)
    assert [r["alert_id"] for r in rows(db)] == [1, 3]


# -- the dispatcher -----------------------------------------------------------------------------


def test_a_delivered_row_records_one_attempt_and_its_key(db):
    clock, ops = FakeClock(), Scripted("ops")
    enqueue(db, notification(), ["ops"], clock.ms)
    stats = Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert (stats.attempted, stats.delivered, stats.next_due_at) == (1, 1, None)
    assert ops.sent == [(12, "firing", "docket-12-firing-ops", "ok")]
    [row] = rows(db)
    assert (row["status"], row["attempts"], row["delivered_at"]) == ("delivered", 1, T0)
    assert [(a["delivery_id"], a["ok"], a["error"]) for a in attempts(db)] == [(1, 1, None)]


def test_a_retryable_failure_backs_off_exponentially_with_jitter_up_to_the_cap(db):
    clock, ops = FakeClock(), Scripted("ops", *["retry"] * 12)
    enqueue(db, notification(), ["ops"], clock.ms)
    d = Dispatcher(db, {"ops": ops}, clock=clock, backoff_initial_ms=1000,
                   backoff_max_ms=60_000, rng=random.Random(7))
    waits = []
    for _ in range(12):
        stats = d.run_once()
        assert stats.retrying == 1
        waits.append(stats.next_due_at - clock.ms)
        assert d.run_once().attempted == 0                    # not due before its time
        clock.to(stats.next_due_at)
    for i, wait in enumerate(waits):
        full = min(60_000, 1000 * 2 ** i)
        assert full // 2 <= wait <= full, (i, wait)
    assert len(set(waits[-4:])) > 1                           # jittered, even at the cap
    assert d.run_once().delivered == 1
    assert [a["ok"] for a in attempts(db)] == [0] * 12 + [1]
    assert rows(db)[0]["attempts"] == 13


def test_retry_after_from_the_receiver_is_honoured_within_the_cap(db):
    clock, ops = FakeClock(), Scripted("ops", "retry", "retry", retry_after_ms=120_000)
    enqueue(db, notification(), ["ops"], clock.ms)
    d = Dispatcher(db, {"ops": ops}, clock=clock, backoff_initial_ms=1000, backoff_max_ms=90_000)
    assert d.run_once().next_due_at == T0 + 90_000


def test_a_row_still_failing_after_give_up_after_ms_gives_up_at_the_deadline(db, caplog):
    clock, ops = FakeClock(), Scripted("ops", *["retry"] * 100)
    enqueue(db, notification(), ["ops"], clock.ms)
    d = Dispatcher(db, {"ops": ops}, clock=clock, backoff_initial_ms=1000,
                   backoff_max_ms=8000, give_up_after_ms=30_000)
    last_try = None
    while (stats := d.run_once()).gave_up == 0:
        last_try = clock.ms
        clock.to(stats.next_due_at)
    assert clock.ms == T0 + 30_000 and last_try < clock.ms   # the last try is at the deadline
    [row] = rows(db)
    assert (row["status"], row["last_error"]) == ("gave_up", "503 try later")
    assert row["attempts"] == len(attempts(db)) == len(ops.sent)
    assert "gave up after" in caplog.text and "ERROR" in [r.levelname for r in caplog.records]
    clock.to(T0 + 10**9)
    assert d.run_once().attempted == 0


def test_a_failure_that_cannot_be_retried_gives_up_at_once_and_is_logged_as_an_error(db, caplog):
    clock, ops = FakeClock(), Scripted("ops", "fatal")
    enqueue(db, notification(), ["ops"], clock.ms)
    stats = Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert (stats.attempted, stats.gave_up, stats.next_due_at) == (1, 1, None)
    assert (rows(db)[0]["status"], rows(db)[0]["last_error"]) == ("gave_up", "400 bad request")
    [err] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert "not retryable" in err.getMessage() and "channel ops" in err.getMessage()


def test_a_fault_inside_a_channel_is_retried_and_logged_with_its_traceback(db, caplog):
    clock, ops = FakeClock(), Scripted("ops", "bug")
    enqueue(db, notification(), ["ops"], clock.ms)
    d = Dispatcher(db, {"ops": ops}, clock=clock)
    assert d.run_once().retrying == 1
    assert rows(db)[0]["last_error"] == "KeyError: 'oops'"
    assert any(r.exc_info for r in caplog.records)
    clock.to(d.run_once().next_due_at)
    assert d.run_once().delivered == 1


def test_rows_of_an_unconfigured_channel_stay_pending_and_are_logged_once(db, caplog):
    clock = FakeClock()
    enqueue(db, notification(alert_id=1), ["gone", "ops"], clock.ms)
    enqueue(db, notification(alert_id=2), ["gone"], clock.ms)
    ops = Scripted("ops")
    d = Dispatcher(db, {"ops": ops}, clock=clock)
    for _ in range(3):
        stats = d.run_once()
    assert (stats.unconfigured, stats.next_due_at) == (2, None)
    assert [r["status"] for r in rows(db)] == ["pending", "delivered", "pending"]
    assert sum("channel gone" in r.getMessage() for r in caplog.records) == 1
    gone = Scripted("gone")
    assert Dispatcher(db, {"gone": gone}, clock=clock).run_once().delivered == 2


def test_a_failing_channel_costs_one_attempt_per_run_and_holds_up_no_other(db):
    clock = FakeClock()
    down, ops = Scripted("down", *["retry"] * 10), Scripted("ops")
    for alert_id in (1, 2, 3):
        enqueue(db, notification(alert_id=alert_id), ["down", "ops"], clock.ms)
    stats = Dispatcher(db, {"down": down, "ops": ops}, clock=clock).run_once()
    assert (stats.attempted, stats.delivered, stats.retrying, stats.deferred) == (4, 3, 1, 2)
    assert ops.delivered() == [(1, "firing"), (2, "firing"), (3, "firing")]
    assert [(a, e) for a, e, _, _ in down.sent] == [(1, "firing")]
    retry_at = rows(db)[0]["next_attempt_at"]
    assert retry_at > T0 and stats.next_due_at == retry_at   # the channel waits as a whole


def test_resolved_waits_for_its_firing_on_the_same_channel(db):
    clock = FakeClock()
    ops, mail = Scripted("ops", "retry"), Scripted("mail")
    enqueue(db, notification(), ["ops", "mail"], clock.ms)
    enqueue(db, notification(event="resolved"), ["ops", "mail"], clock.ms)
    d = Dispatcher(db, {"ops": ops, "mail": mail}, clock=clock)
    stats = d.run_once()
    assert mail.delivered() == [(12, "firing"), (12, "resolved")]
    assert ops.delivered() == [] and (stats.retrying, stats.deferred) == (1, 1)
    clock.to(stats.next_due_at)
    assert d.run_once().delivered == 2
    assert ops.delivered() == [(12, "firing"), (12, "resolved")]


def test_resolved_goes_ahead_when_its_firing_gave_up(db):
    clock, ops = FakeClock(), Scripted("ops", "fatal")
    enqueue(db, notification(), ["ops"], clock.ms)
    enqueue(db, notification(event="resolved"), ["ops"], clock.ms)
    stats = Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    assert (stats.gave_up, stats.delivered) == (1, 1)
    assert ops.delivered() == [(12, "resolved")]


def test_a_restarted_dispatcher_does_not_send_delivered_rows_again(db, tmp_path):
    clock, ops = FakeClock(), Scripted("ops", "ok", "retry")
    enqueue(db, notification(alert_id=1), ["ops"], clock.ms)
    enqueue(db, notification(alert_id=2), ["ops"], clock.ms)
    Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    db.close()
    again = sqlite_utils.Database(tmp_path / "reconcile.db")
    clock.to(clock.ms + 3_600_000)
    stats = Dispatcher(again, {"ops": ops}, clock=clock).run_once()
    assert (stats.attempted, stats.delivered) == (1, 1)
    assert [(a, outcome) for a, _, _, outcome in ops.sent] == [(1, "ok"), (2, "retry"),
                                                               (2, "ok")]


def test_a_crash_between_send_and_commit_sends_again_with_the_same_key(db, tmp_path):
    """The at-least-once window: the receiver got the event, the outbox never learnt it."""
    clock, ops = FakeClock(), Scripted("ops")
    enqueue(db, notification(), ["ops"], clock.ms)
    ops.crash_after_send = True
    with pytest.raises(SimulatedCrash):
        Dispatcher(db, {"ops": ops}, clock=clock).run_once()
    db.close()
    ops.crash_after_send = False
    again = sqlite_utils.Database(tmp_path / "reconcile.db")
    assert Dispatcher(again, {"ops": ops}, clock=clock).run_once().delivered == 1
    assert [key for _, _, key, _ in ops.sent] == ["docket-12-firing-ops"] * 2
    assert len(attempts(again)) == 1


@settings(max_examples=60, deadline=None)
@given(script=st.lists(st.sampled_from(["ok", "ok", "retry", "fatal"]), max_size=40),
       seed=st.integers(0, 2**32))


def test_any_mix_of_answers_ends_delivered_or_given_up_and_every_send_is_recorded(script, seed):
    db = sqlite_utils.Database(memory=True)
    clock = FakeClock()
    rng = random.Random(seed)
    channels = {name: Scripted(name, *[s for s in script if rng.random() < 0.7])
                for name in ("a", "b")}
    for alert_id in (1, 2, 3):
        enqueue(db, notification(alert_id=alert_id), list(channels), clock.ms)
        enqueue(db, notification(alert_id=alert_id, event="resolved"), list(channels),
                clock.ms)
    d = Dispatcher(db, channels, clock=clock, backoff_initial_ms=1000, backoff_max_ms=4000,
                   give_up_after_ms=20_000, rng=rng)
    for _ in range(200):
        stats = d.run_once()
        if stats.next_due_at is None:
            break
        clock.to(stats.next_due_at)
    final = rows(db)
    assert {r["status"] for r in final} <= {"delivered", "gave_up"}
    sends = sum(len(ch.sent) for ch in channels.values())
    assert sends == len(attempts(db)) == sum(r["attempts"] for r in final)
    for name, ch in channels.items():
        delivered = ch.delivered()
        assert sorted(delivered) == sorted(
            (r["alert_id"], r["event"]) for r in final
            if r["channel"] == name and r["status"] == "delivered")
        assert len(delivered) == len(set(delivered))                  # each once
        for alert_id in (1, 2, 3):                    # never resolved before its firing
            events = [e for a, e in delivered if a == alert_id]
            assert events in ([], ["firing"], ["resolved"], ["firing", "resolved"])


# -- configuration ------------------------------------------------------------------------------


def test_channel_tables_build_their_channels():
    hook = channel_from_config("ops", {"type": "webhook", "url": "https://h.example/x",
                                       "format": "slack", "headers": {"Authorization": "t"}})
    assert isinstance(hook, WebhookChannel)
    assert (hook.name, hook.format, hook.timeout_ms, hook.headers) == \
        ("ops", "slack", 5000, {"Authorization": "t"})
    mail = channel_from_config("mail", {"type": "email", "host": "smtp.example", "port": 587,
                                        "sender": "docket@example.com", "starttls": True,
                                        "recipients": ["a@example.com"], "username": "u",
                                        "password": "p"})
    assert isinstance(mail, EmailChannel) and (mail.port, mail.starttls) == (587, True)
    am = channel_from_config("am", {"type": "alertmanager", "url": "http://am:9093/"})
    assert isinstance(am, AlertmanagerChannel) and am.url == "http://am:9093"


@pytest.mark.parametrize("name,table,path,problem", [
    ("ops", {"url": "http://x"}, "channels.ops.type", "missing"),
    ("ops", {"type": "pager"}, "channels.ops.type", "expected one of 'webhook', 'email'"),
    ("ops", {"type": "webhook"}, "channels.ops.url", "missing"),
    ("ops", {"type": "webhook", "url": "http://x", "timeout": 5}, "channels.ops.timeout",
     "unknown key for a webhook channel"),
    ("ops", {"type": "webhook", "url": "http://x", "timeout_ms": "5s"},
     "channels.ops.timeout_ms", "expected an integer, found '5s' (string)"),
    ("ops", {"type": "webhook", "url": "http://x", "timeout_ms": True},
     "channels.ops.timeout_ms", "expected an integer, found True (boolean)"),
    ("ops", {"type": "webhook", "url": "http://x", "timeout_ms": 0},
     "channels.ops.timeout_ms", "must be at least 1"),
    ("ops", {"type": "webhook", "url": "ftp://x"}, "channels.ops.url", "expected an http://"),
    ("ops", {"type": "webhook", "url": "http://x", "format": "teams"}, "channels.ops.format",
     "expected one of 'json', 'slack'"),
    ("ops", {"type": "webhook", "url": "http://x", "headers": {"Idempotency-Key": "k"}},
     "channels.ops.headers.Idempotency-Key", "docket sets this header itself"),
    ("ops", {"type": "webhook", "url": "http://x", "headers": {"X-N": 1}},
     "channels.ops.headers", "expected a table of strings"),
    ("mail", {"type": "email", "host": "h", "port": 25, "sender": "d@x", "recipients": "a@x"},
     "channels.mail.recipients", "expected a list of strings, found 'a@x' (string)"),
    ("mail", {"type": "email", "host": "h", "port": 25, "sender": "d@x", "recipients": []},
     "channels.mail.recipients", "expected at least one entry"),
    ("mail", {"type": "email", "host": "h", "port": 25, "sender": "docket",
              "recipients": ["a@x"]}, "channels.mail.sender", "expected an e-mail address"),
    ("mail", {"type": "email", "host": "h", "port": 70000, "sender": "d@x",
              "recipients": ["a@x"]}, "channels.mail.port", "must be at most 65535"),
    ("mail", {"type": "email", "host": "h", "sender": "d@x", "recipients": ["a@x"]},
     "channels.mail.port", "missing"),
    ("mail", {"type": "email", "host": "h", "port": 25, "sender": "d@x", "recipients": ["a@x"],
              "username": "u"}, "channels.mail.password", "missing: username is set"),
    ("am", {"type": "alertmanager", "url": "http://am", "firing_hold_ms": 1000},
     "channels.am.firing_hold_ms", "must be at least 60000"),
    ("a.b", {"type": "webhook", "url": "http://x"}, "channels.a.b", "a channel name may hold"),
    ("ops", "http://x", "channels.ops", "expected a table, found 'http://x' (string)"),
])


def test_a_bad_channel_table_names_the_key_path(name, table, path, problem):
    with pytest.raises(ChannelConfigError) as err:
        channel_from_config(name, table)
    assert err.value.path == path
    assert problem in err.value.problem
    assert str(err.value) == f"Error in configuration at '{path}': {err.value.problem}"
    assert err.value.hint


def test_an_unknown_key_suggests_the_right_one():
    with pytest.raises(ChannelConfigError) as err:
        channel_from_config("ops", {"type": "webhook", "url": "http://x", "timout_ms": 5})
    assert err.value.hint.startswith("did you mean 'timeout_ms'?")


@pytest.mark.parametrize("kind,cls", [("webhook", WebhookChannel), ("email", EmailChannel),
                                      ("alertmanager", AlertmanagerChannel)])


def test_constructor_defaults_match_the_declarations(kind, cls):
    params = inspect.signature(cls).parameters
    for s in SETTINGS[kind]:
        if s.required:
            assert params[s.key].default is inspect.Parameter.empty, s.key
        else:
            default = params[s.key].default
            assert (default if default is not None or s.type is not dict else {}) == \
                s.default, s.key


def test_every_channel_setting_is_in_docs_alerts_md():
    assert reference_markdown() in (DOCS / "alerts.md").read_text(), \
        "paste audit.reconcile.channel_settings.reference_markdown() into docs/alerts.md, " \
        "\"Settings\""
