"""The audit contract: what every tier shares, and all an agent host needs of ``audit/``.

- ``record``: the audit record, its key, its checksum, parsing (DESIGN.md, "Audit record").
- ``names``: the audit topic's default name, the default window, the record headers.
- ``delivery``: writing a handful of audit records to Kafka, learning which were acknowledged.
- ``collect``: reading the audit topic into the newest record per identity.
- ``errors``: ``DocketError`` (a message and a hint), the base of every docket error, and
  ``print_error``, which every CLI prints them with; the audit package's errors.
- ``settings``: settings declared once (``Setting``), the machinery every docket configuration
  file shares: parsing TOML against the declarations, the reference tables, exit code 78.
- ``kafka_security``: how every Kafka client authenticates (TLS, SASL): the keys declared
  once, secrets read from files, the files checked, the client properties built.

Light on purpose: the standard library, xxhash and confluent-kafka, never PySpark.
"""
