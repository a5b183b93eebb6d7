"""The docket audit pipeline: per-tier counts (Spark jobs), the audit record, the reconciler."""
