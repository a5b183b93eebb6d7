"""The docket audit pipeline.

- ``contract``: what every tier shares (the audit record, its names, writing and reading the
  audit topic, the errors and settings machinery); all an agent host needs of ``audit/``.
- ``jobs``: the Spark jobs that count the cluster and warehouse tiers.
- ``reconcile``: the reconciler, which compares the tiers, judges windows, raises alerts and
  delivers them through webhooks, e-mail and Alertmanager (``reconcile.alerts``).
- ``cli``: the ``docket-audit`` command.
"""
