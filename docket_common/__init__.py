"""What docket's command-line tools share on a host and nothing else. The agent, the local Kafka
cluster (``broker/``), the audit and the dashboard use it; none of them borrows from another
for it.

- ``dirs``: where the tools keep their state and their jar caches.
- ``formats``: times and percentages as people read them.
- ``maven``: fetching jars from Maven Central.
- ``pages``: a small HTTP server of read-only pages (the agent's status, the reconciler's metrics).
- ``procs``: the processes the tools started and keep by pid.
"""
