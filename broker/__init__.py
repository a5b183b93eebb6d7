"""Everything docket knows about a Kafka cluster.

- ``libs``: the Apache Kafka jars, resolved from Maven Central with ``mvn`` (see ``pom.xml``).
- ``cluster``: a real local Apache Kafka in KRaft mode (1 or 3 brokers on 127.0.0.1) for
  development, the demo and the tests; driven by ``docket-broker up / down / status``.
- ``admin``: creating and checking data topics and the audit topic.
- ``mirror``: MirrorMaker 2 between two named clusters (``docket-broker mirror``), and the
  watcher that says in the target's audit topic how far it has copied.
- ``security``: a secured local cluster (SASL_SSL with SCRAM, mutual TLS): its CA, certificates
  and users, and each role's least-privilege ACLs (``docket-broker acl``).
- ``errors``: the named errors of this package.
- ``cli``: the ``docket-broker`` command.
"""
