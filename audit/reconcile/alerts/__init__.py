"""The reconciler's alerts, in one package: fired and resolved from the verdicts (``lifecycle``),
then sent through webhooks, e-mail and Alertmanager (the rest).

The lifecycle decides *that* an alert fires or resolves (its tables, ``alerts`` and
``snoozes``, are in the store's schema, its statements in ``store/alerts.py``); the outbox makes
sure people hear of it. It owns two tables in the reconciler's SQLite database (created if
missing; their schema and statements in ``store/deliveries.py``)::

    alert_deliveries            one row per (alert, event, channel)
        id               INTEGER PRIMARY KEY
        alert_id         the reconciler's alert
        event            'firing' | 'resolved'
        channel          the configured channel's name ([channels.NAME])
        notification     the Notification as JSON, {"v": 1, ...}: what is sent, fixed at enqueue
        status           'pending' | 'delivered' | 'gave_up'
        attempts         sends tried
        next_attempt_at  ms: not sent before this
        last_error       the last failure, as the channel put it
        created_at       ms: enqueued
        delivered_at     ms: the send that worked returned
        UNIQUE (alert_id, event, channel)

    alert_delivery_attempts     one row per send tried (a digest: one per row it carried)
        delivery_id      alert_deliveries.id
        at               ms: the send began
        ok               1 | 0
        error            the failure (NULL when ok)
        duration_ms      how long the send took (monotonic clock)

    channel_sends               one row per message a rate-limited channel delivered, kept
        channel, at      a period: what its ``max_per_period`` counts
        notifications    1, or how many a digest carried

Invariants:

- A (alert, event, channel) is enqueued at most once; enqueueing it again changes nothing.
- A row leaves ``pending`` only for ``delivered`` or ``gave_up``, and never leaves either.
- A row is ``delivered`` only if one of its sends returned; every send whose outcome was
  committed has exactly one attempt row; ``attempts`` counts them.
- On one channel, an alert's ``resolved`` event is not sent while its ``firing`` event is still
  pending, so no receiver sees an alert resolve and then fire (a digest may carry both, the
  firing one first).
- A rate-limited channel delivers at most ``max_per_period`` messages in any ``period_ms``;
  what is due beyond that is carried by one digest, or waits: nothing is dropped.

Recovery: nothing to do. A crash before an outcome is committed leaves the row ``pending``
with its old ``next_attempt_at``, so the next dispatcher sends it again. If the crash fell
between a send that worked and its commit, the receiver gets that event twice, with the same
idempotency key (``docket-{alert_id}-{event}-{channel}``): delivery is at least once to every
channel, and exactly once where the receiver drops keys it has seen (``Idempotency-Key``
header, e-mail ``Message-ID``; Alertmanager merges alerts by their labels by itself).

Modules (docs/alerts.md is the reference):

- ``lifecycle``: alerts from verdicts: fired once, resolved, snoozed, resolved by hand; the
  reads the dashboard, ``docket-audit alerts`` and the metrics make of them.
- ``notification``: the event and how it reads.
- ``channels``: the three transports and their ok / retry / give-up outcomes.
- ``outbox``: the tables above, ``enqueue`` and the ``Dispatcher``.
"""

from ..channel_settings import ChannelConfigError
from .channels import (
    AlertmanagerChannel,
    Channel,
    DeliveryFailed,
    EmailChannel,
    WebhookChannel,
    channel_from_config,
)
from .notification import Notification, idempotency_key
from .outbox import Dispatcher, DispatchStats, enqueue, ensure_tables

__all__ = ["AlertmanagerChannel", "Channel", "ChannelConfigError", "DeliveryFailed",
           "DispatchStats", "Dispatcher", "EmailChannel", "Notification", "WebhookChannel",
           "channel_from_config", "enqueue", "ensure_tables", "idempotency_key"]
