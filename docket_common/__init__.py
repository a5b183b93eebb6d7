"""What docket's command-line tools share on a host and nothing else: where they keep their
state and their jar caches (``dirs``), and fetching jars from Maven Central (``maven``). The
local Kafka cluster (``broker/``), the Spark jobs (``audit/jobs/``) and the demo use it; none of
them borrows from another for it."""
