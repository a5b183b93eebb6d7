"""The reconciler: the audit topic into SQLite, every (topic, window) judged tier by tier, alerts
raised and delivered. docs/reconcile.md is the reference.

- ``service``: ``docket-audit reconcile`` running: the consumer, when to evaluate, the delivery.
- ``evaluate``: one evaluation: the windows judged, verdicts stored, alerts fired and resolved.
- ``store``: the SQLite database, its one gateway: audit records applied, offsets, verdicts,
  alerts, and what the readers ask (``store.reads``).
- ``verdict``: the verdict on one window, per tier and origin; pure (records and a clock in).
- ``tiers``: the tier graph: a topic's tiers in order, what feeds each, how a hop is named —
  for the verdicts, the alerts and the dashboard alike.
- ``alerts``: the alerts, one package: fired once from the verdicts, resolved, snoozed,
  resolved by hand (``alerts.lifecycle``), and delivered through the outbox to webhooks,
  e-mail and Alertmanager.
- ``figures``: the plain windows' figures, read in a process of their own during an evaluation.
- ``config``: the reconciler's settings, declared once; the owners' routing, the tier graph.
- ``channel_settings``: the alert channels' settings (``[channels.NAME]``), declared once,
  below the config that checks them and the alerts that use them.
- ``metrics``: ``/metrics`` on ``reconcile.listen``.
- ``view``: the verdicts as a person reads them (``docket-audit show --db``).
- ``watermark``: the completeness watermark of a topic at a tier.
- ``commands``: the reconciler's commands of ``docket-audit`` (reconcile, watermark, validate,
  alerts).
"""
