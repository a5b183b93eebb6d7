"""What docket's command-line tools share on a host and nothing else. The local Kafka cluster
(``broker/``), the Spark jobs (``audit/jobs/``) and the demo use it; none of them borrows from
another for it.

- ``dirs``: where the tools keep their state and their jar caches.
- ``maven``: fetching jars from Maven Central.
- ``procs``: the processes the tools started and keep by pid.
"""
