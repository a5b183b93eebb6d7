"""The audit contract: what every tier shares, and all an agent host needs of ``audit/``.

- ``record``: the audit record, its key, its checksum, parsing (DESIGN.md, "Audit record").
- ``delivery``: writing a handful of audit records to Kafka, learning which were acknowledged.
- ``collect``: reading the audit topic into the newest record per identity.
- ``errors``: the audit package's errors (under ``docket_common.errors``' base).

The names every tier shares (the audit topic's default name, the default window, the record
headers), the settings machinery and Kafka client security are one floor down, in
``docket_common`` (``names``, ``settings``, ``kafka_security``): the broker tooling and the
dashboard use them without depending on the audit.

Light on purpose: the standard library, xxhash and confluent-kafka, never PySpark.
"""
