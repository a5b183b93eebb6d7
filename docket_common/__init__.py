"""The ground floor: what docket's tools share on a host and nothing else. The agent, the local
Kafka cluster (``broker/``), the audit and the dashboard use it; none of them borrows from
another for it, and it imports nothing of theirs (``tests/unit/test_layers.py``).

- ``errors``: ``DocketError`` (a message and a hint), the base of every docket error (the tree
  is drawn there), and ``print_error``, which every CLI prints them with.
- ``settings``: settings declared once (``Setting``), the machinery every docket configuration
  file shares: parsing TOML against the declarations, the reference tables, exit code 78.
- ``kafka_security``: how every Kafka client authenticates (TLS, SASL): the keys declared
  once, secrets read from files, the files checked, the client properties built.
- ``names``: the audit topic's default name, the reconciler's group, the default window, the
  record headers — the names every tier agrees on.
- ``window``: the audit window, one concept for every tier: its setting, declared once, and
  its floor (in Python and numpy for the agent and the reconciler, in Spark SQL for the jobs).
- ``read_to_end``: reading Kafka partitions to given end offsets within a deadline, with the
  one end rule every reader that must know it read *up to* a point shares.
- ``dirs``: where the tools keep their state and their jar caches.
- ``formats``: times and percentages as people read them.
- ``maven``: fetching jars from Maven Central.
- ``pages``: a small HTTP server of read-only pages (the agent's status, the reconciler's metrics).
- ``procs``: the processes the tools started and keep by pid.
"""
