"""The docket audit pipeline: the contract every tier shares (``audit.contract``), the Spark
jobs that count the cluster and warehouse tiers (``audit.jobs``), the reconciler that compares
the tiers and alerts (``audit.reconcile``, delivery in ``audit.alerts``) and ``docket-audit``."""
