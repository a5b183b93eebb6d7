"""The docket audit pipeline: the contract every tier shares (``audit.contract``), the Spark
jobs that count the cluster and warehouse tiers (``audit.jobs``) and ``docket-audit``; the
reconciler is to come."""
