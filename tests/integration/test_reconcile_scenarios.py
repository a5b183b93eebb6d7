"""The reconciler's alert scenarios end to end: audit records through the real local Kafka, the
reconciler reading and judging them (``run_once`` with a clock the test sets), and each alert
delivered to real receivers on 127.0.0.1 — an HTTP webhook, an aiosmtpd SMTP server and, when
installed, a real Alertmanager — routed by topic owner.

Windows lie a few hours back; the clock moves the reconciler past grace and finality. The audit
topic here keeps the time its senders wrote (``CreateTime``), so each record *arrives* when
the reconciler reads it, at the clock the test sets: "sent at" is "put, then read at". (On
docket's own audit topic the broker stamps arrivals; ``test_clock_skew.py`` runs that way.)"""

from __future__ import annotations

import time

import pytest
import requests

from audit.reconcile.config import parse
from audit.reconcile.service import Reconciler
from broker.admin import AUDIT_TOPIC_CONFIG, TopicSpec, ensure_topics
from tests.integration.test_alert_delivery import (  # noqa: F401  (fixtures)
    alertmanager,
    receiver,
    smtp_server,
    wait_for,
)
from tests.integration.test_reconcile import caught_up, progress, send
from tests.integration.test_reconcile import count as _count

W = 600_000
HOUR = 3_600_000
MIN = 60_000
NOW = int(time.time() * 1000)
T0 = (NOW - 3 * HOUR) // W * W
END = T0 + W


def count(*args, window: int = T0, **kw):
    """An audit count record, of this module's window unless told."""
    return _count(*args, window=window, **kw)


class Clock:
    def __init__(self, ms: int):
        self.ms = ms

    def __call__(self) -> float:
        return self.ms / 1000


@pytest.fixture
def setup(kafka, tmp_path, topic_name, receiver, smtp_server):   # noqa: F811
    """(send records, reconcile at a time, the webhook's events, the mailbox)."""
    audit_topic = f"{topic_name}.audit"
    sender_stamped_audit_topic(kafka.bootstrap_servers, audit_topic)
    hook = receiver()
    box, port = smtp_server()
    db = tmp_path / "r.db"

    def put(*records):
        send(kafka.bootstrap_servers, audit_topic, records)

    def at(ms: int, silent_ms: int = 8 * HOUR):
        cfg = parse({
            "reconcile": {"bootstrap_servers": kafka.bootstrap_servers,
                          "audit_topic": audit_topic},
            "windows": {"tiers": ["producer", "kafka-local"]},
            "alerts": {"default_channels": ["ops"], "health_channels": ["ops"],
                       "silent_ms": silent_ms},
            "owners": [{"topics": ["pay.*"], "owner": "payments", "channels": ["mail"]}],
            "channels": {"ops": {"type": "webhook", "url": hook.url},
                         "mail": {"type": "email", "host": "127.0.0.1", "port": port,
                                  "sender": "docket@example.com",
                                  "recipients": ["payments@example.com"]}}})
        return Reconciler(cfg, db, clock=Clock(ms)).run_once()

    def events():
        return [(b["event"], b["kind"], b["tier"], b["origin"]) for b in hook.bodies()]

    return put, at, events, box


def sender_stamped_audit_topic(bootstrap: str, name: str) -> None:
    spec = TopicSpec(name, 3, -1, {**AUDIT_TOPIC_CONFIG, "message.timestamp.type": "CreateTime"})
    ensure_topics(bootstrap, [spec])


def test_a_stopped_count_job_raises_audit_lag_windows_go_unknown_and_both_resolve(setup):
    put, at, events, _box = setup
    put(count("producer", "app", "web-1", 1000, at=END + MIN),
        count("kafka-local", "app", "web-1", 400, at=END - MIN), progress("kafka-local",
                                                                          at=END - MIN))
    at(END - MIN)                                       # they arrive
    at(END + 45 * MIN)
    assert events() == [("firing", "audit_lag", "kafka-local", None)]
    put(count("kafka-local", "app", "web-1", 1000, seq=2, at=END + 46 * MIN),
        progress("kafka-local", at=END + 46 * MIN, batch=101))
    at(END + 47 * MIN)
    assert events() == [("firing", "audit_lag", "kafka-local", None),
                        ("resolved", "audit_lag", "kafka-local", None)]


def test_duplicates_raise_duplication_and_other_content_raises_checksum_mismatch(setup):
    put, at, events, _box = setup
    put(count("producer", "app", "web-1", 1000), count("producer", "app", "web-2", 1000),
        count("kafka-local", "app", "web-1", 1030, distinct=1000),
        count("kafka-local", "app", "web-2", 1000, checksum=8),
        progress("kafka-local", at=END + 35 * MIN))
    at(END + 40 * MIN)
    assert sorted(events()) == [("firing", "checksum_mismatch", "kafka-local", "web-2"),
                                ("firing", "duplication", "kafka-local", "web-1")]


def test_an_agent_that_stops_its_heartbeats_raises_silent_producer(setup):
    put, at, events, _box = setup
    put(count("producer", "app", "web-1", 10, at=END), count("producer", "app", "web-2", 10,
                                                                 at=END))
    at(END, silent_ms=30 * MIN)                         # both heard from at the window's end
    put(count("producer", "app", "web-1", 0, window=T0 + 5 * W, at=END + 50 * MIN),
        count("kafka-local", "app", "web-1", 10), count("kafka-local", "app", "web-2", 10),
        progress("kafka-local", at=END + 50 * MIN))
    at(END + 50 * MIN, silent_ms=30 * MIN)              # web-1's heartbeat; web-2 quiet
    assert events() == [("firing", "silent_producer", "producer", "web-2")]
    at(END + 55 * MIN, silent_ms=30 * MIN)
    assert events() == [("firing", "silent_producer", "producer", "web-2")]


def test_host_clocks_skewed_by_five_minutes_raise_nothing(setup):
    """Reports and heartbeats written by clocks 5 minutes off arrive when they arrive: nobody
    is silent, and the counts agree."""
    put, at, events, _box = setup
    for i, now in enumerate((END + MIN, END + 20 * MIN, END + 40 * MIN, END + 60 * MIN)):
        for skew, origin in ((-5 * MIN, "slow"), (5 * MIN, "fast")):
            put(count("producer", "app", origin, 500, seq=1 + i, at=now + skew),
                count("producer", "app", origin, 0, window=T0 + 6 * W, seq=1 + i,
                      at=now + skew),
                count("kafka-local", "app", origin, 500, seq=1 + i, at=now))
        put(progress("kafka-local", at=now, batch=200 + i))
        at(now, silent_ms=30 * MIN)
    assert events() == []


def test_a_loss_of_unknown_size_the_agent_journalled_raises_loss_though_every_tier_agrees(
        setup):
    put, at, events, _box = setup
    put(count("producer", "app", "web-1", 100, dropped_unknown={"deleted_unread": 1}),
        count("kafka-local", "app", "web-1", 100), progress("kafka-local", at=END + 35 * MIN))
    at(END + 40 * MIN)
    assert events() == [("firing", "loss", "producer", "web-1")]


def test_a_loss_on_an_owned_topic_is_mailed_to_its_owner(setup):
    put, at, events, box = setup
    put(count("producer", "pay.cards", "web-1", 2000),
        count("kafka-local", "pay.cards", "web-1", 1990),
        progress("kafka-local", at=END + 35 * MIN, marks=True),
        caught_up("kafka-local", "web-1"))
    at(END + 40 * MIN)
    assert events() == []                               # not the default channel
    [mail] = box.messages
    assert mail["to"] == ["payments@example.com"]
    subject = mail["message"]["Subject"]
    assert "loss" in subject and "pay.cards" in subject and "kafka-local" in subject
    body = mail["message"].get_content()
    assert "payments" in body and "1990" in body and "2000" in body


def test_alertmanager_gets_the_loss_with_its_labels(kafka, tmp_path, topic_name,
                                                    alertmanager):   # noqa: F811
    url, _hook = alertmanager
    audit_topic = f"{topic_name}.audit"
    sender_stamped_audit_topic(kafka.bootstrap_servers, audit_topic)
    send(kafka.bootstrap_servers, audit_topic,
         [count("producer", "app", "web-3", 5000), count("kafka-local", "app", "web-3", 4975),
          progress("kafka-local", at=END + 35 * MIN, marks=True),
          caught_up("kafka-local", "web-3")])
    cfg = parse({"reconcile": {"bootstrap_servers": kafka.bootstrap_servers,
                               "audit_topic": audit_topic},
                 "windows": {"tiers": ["producer", "kafka-local"]},
                 "alerts": {"default_channels": ["am"], "silent_ms": 8 * HOUR},
                 "channels": {"am": {"type": "alertmanager", "url": url}}})
    Reconciler(cfg, tmp_path / "r.db", clock=Clock(END + 40 * MIN)).run_once()

    def listed():
        alerts = requests.get(f"{url}/api/v2/alerts", timeout=5).json()
        return [a["labels"] for a in alerts]

    wait_for(lambda: listed(), 10, "the alert in Alertmanager")
    [labels] = listed()
    assert labels["alertname"] == "DocketLoss"
    assert (labels["topic"], labels["tier"], labels["origin"]) == ("app", "kafka-local",
                                                                    "web-3")
