"""The audit pipeline's Spark side: the jobs that count a Kafka cluster and the warehouse.

- ``run``: the two jobs, ``count`` (a cluster's tier) and ``land`` (the warehouse tier), from
  start to stop.
- ``spark``: what they share: the session, the Kafka source, the counting, the writer of their
  records to the audit topic.
- ``tally``: what a Spark tier has counted (window counts, record numbers seen), kept by the
  counting query's driver in SQLite beside the checkpoint, from batches compacted in the JVM.
- ``intervals``: the record numbers seen as an interval set, sized in gaps, not records.
- ``jvm``: the jobs' own Java (``*.java`` here: a record's number, a group's numbers as runs),
  built with ``javac`` against PySpark's jars and registered in a job's session.
- ``dedup``: ``land --dedup``'s step that lets each record through once per origin.
- ``landing``: each micro-batch of ``land --dedup`` landed in the table once, however often
  it runs.
- ``catchup``: how far a job has read, in positions: its ``caught_up`` records.
- ``mirrored``: what a mirror has copied, in positions: the mirror watcher's ``caught_up``
  records.
- ``settings``: the jobs' settings, declared once: flags, ``--config``'s ``[job]`` table,
  docs/jobs-config.md.
- ``sparklibs``: the jars of Spark's Kafka connector (``pom.xml`` beside it).

Only audit hosts install PySpark: nothing here is imported by the agent, and PySpark itself is
imported inside the functions that need it.
"""
