"""Everything docket knows about a Kafka cluster.

- ``libs``: the Apache Kafka jars, resolved from Maven Central with ``mvn`` (see ``pom.xml``).
- ``cluster``: a real local Apache Kafka in KRaft mode (1 or 3 brokers on 127.0.0.1) for
  development, the demo and the tests; driven by ``docket-broker up / down / status``.
- ``admin``: creating and checking data topics and the audit topic.
- ``cli``: the ``docket-broker`` command.
"""
