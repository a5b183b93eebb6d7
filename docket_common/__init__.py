"""What docket's command-line tools share on a host and nothing else: where they keep their
state and their jar caches (``dirs``), fetching jars from Maven Central (``maven``), and the
processes they started and keep by pid (``procs``). The
local Kafka cluster (``broker/``), the Spark jobs (``audit/jobs/``) and the demo use it; none of
them borrows from another for it."""
