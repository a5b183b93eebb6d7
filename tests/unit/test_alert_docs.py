"""docs/alerts.md shows what a real alert sends: its examples are checked against a loss alert
the reconciler raises from records with the documented figures (12,345 events accepted by
web-42 for app.events in the window of 07:10, 11,344 counted at kafka-local, numbers
1000-1999 and 5000 missing), evaluated 123 ms after the window's end with no grace."""

from __future__ import annotations

import json
import re
from pathlib import Path

from audit.contract.record import AuditRecord, CaughtUp, Ranges
from audit.reconcile.alerts.channels import WebhookChannel, alertmanager_alert, slack_body
from audit.reconcile.alerts.lifecycle import notification
from audit.reconcile.config import parse
from audit.reconcile.evaluate import evaluate
from audit.reconcile.store import Store

DOC = Path(__file__).resolve().parents[2] / "docs" / "alerts.md"
W = 600_000
WINDOW = 1_795_417_800_000                  # 2026-11-23T07:10:00Z
HOLD_MS = 7 * 24 * 3_600_000


def examples(heading: str) -> list[str]:
    """The code blocks of docs/alerts.md under ``heading`` (to the next heading)."""
    text = DOC.read_text()
    part = text[text.index(heading) + len(heading):]
    part = part[:part.index("\n#")] if "\n#" in part else part
    return re.findall(r"```json\n(.*?)```", part, re.S)


def real_loss(tmp_path):
    store = Store(tmp_path / "r.db")
    cfg = parse({"windows": {"tiers": ["producer", "kafka-local"], "grace_ms": 0},
                 "owners": [{"topics": ["app.*"], "owner": "team-a", "channels": ["ops"]}],
                 "channels": {"ops": {"type": "webhook", "url": "http://127.0.0.1:9/hook"}},
                 "alerts": {"silent_ms": 3_600_000}})

    def counted(tier, n, distinct, **kw):
        return AuditRecord(tier=tier, origin="web-42", topic="app.events", window_start=WINDOW,
                           window_ms=W, count=n, bytes=n * 100, checksum=n, seq=17,
                           emitter="web-42/agent" if tier == "producer" else f"{tier}/count",
                           emitted_at=WINDOW + W, incarnation="i1", distinct=distinct,
                           duplicates=n - distinct, **kw)
    store.apply([counted("producer", 12345, 12345, sealed_through=13344),
                 counted("kafka-local", 11344, 11344),
                 Ranges.of(tier="kafka-local", origin="web-42", origin_incarnation="i1",
                           emitter="kafka-local/count", seq=4, through=13344,
                           missing=[[1000, 1999], [5000, 5000]], incarnation="k1"),
                 CaughtUp(tier="kafka-local", emitter="kafka-local/count", incarnation="k1",
                          seq=4, source="web-42/agent", source_incarnation="i1", source_seq=17,
                          source_delivered=13344, emitted_at=WINDOW + W)],
                {}, {}, "t")
    evaluate(store, cfg, WINDOW + W + 123)
    [(alert_id,)] = store.conn.execute("SELECT id FROM alerts").fetchall()
    n = notification(store, alert_id, "firing")
    store.close()
    return n


def test_the_documented_webhook_body_is_what_a_real_loss_alert_sends(tmp_path):
    n = real_loss(tmp_path)
    [documented] = examples('### Webhook, `format = "json"`')
    body = WebhookChannel("ops", "http://127.0.0.1:9/hook").body(n, f"docket-{n.alert_id}-"
                                                                  "firing-ops")
    assert json.loads(documented) == body


def test_the_documented_alertmanager_alert_is_what_a_real_loss_alert_sends(tmp_path):
    n = real_loss(tmp_path)
    [documented] = examples("### Alertmanager")
    [alert] = json.loads(documented)
    real = alertmanager_alert(n, now_ms=n.fired_at + 877, firing_hold_ms=HOLD_MS)
    assert alert == real


def test_the_documented_slack_message_is_what_a_real_loss_alert_sends(tmp_path):
    n = real_loss(tmp_path)
    [documented] = examples('### Webhook, `format = "slack"`')
    shown = json.loads(documented)
    real = slack_body(n)
    assert shown["text"] == real["text"]
    [attachment] = shown["attachments"]
    fields = {f["title"]: f for f in real["attachments"][0]["fields"]}
    for field in attachment["fields"]:           # the ones shown, as they are sent
        if field != "…":
            assert fields[field["title"]] == field, field["title"]
    assert {k: v for k, v in attachment.items() if k != "fields"} == \
        {k: v for k, v in real["attachments"][0].items() if k != "fields"}
