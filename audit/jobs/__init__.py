"""The audit pipeline's Spark side: the jobs that count a Kafka cluster and the warehouse.

- ``run``: the two jobs, ``count`` (a cluster's tier) and ``land`` (the warehouse tier), from
  start to stop.
- ``spark``: what they share: the session, the Kafka source, the counting, the writer of their
  records to the audit topic.
- ``tally`` and ``intervals``: one origin's state at a Spark tier (window counts, the record
  numbers seen as intervals), run in Spark's Python workers.
- ``sparklibs``: the jars of Spark's Kafka connector (``pom.xml`` beside it).

Only audit hosts install PySpark: nothing here is imported by the agent, and PySpark itself is
imported inside the functions that need it.
"""
