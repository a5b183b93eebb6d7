"""The count job's baseline in ``bench_audit.py``: the same Kafka source as the audit jobs (the
session of ``audit.jobs.spark``, its source options, the same micro-batches), each batch only
counted (``df.count()``) — what Spark itself needs to read the topic, with none of the job's
work (identity, windows, state, the audit records written).

    python tests/bench/spark_bare.py BOOTSTRAP TOPIC AUDIT_TOPIC MASTER BATCH CHECKPOINT_DIR

Prints one JSON line: the rows counted and Spark's processedRowsPerSecond of every batch that
read rows, in order.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from audit.jobs.spark import JobOptions, data_records, kafka_stream, spark_session  # noqa: E402


def main(argv: list[str]) -> None:
    bootstrap, topic, audit_topic, master, batch, checkpoint = argv
    opts = JobOptions(bootstrap_servers=bootstrap, audit_topic=audit_topic,
                      topics=re.escape(topic), master=master, once=True,
                      max_offsets_per_trigger=int(batch), checkpoint_dir=Path(checkpoint))
    spark = spark_session("docket-bench-bare-read", opts)
    rows = []

    def count(df, _batch_id: int) -> None:
        rows.append(df.count())

    query = (data_records(kafka_stream(spark, opts), audit_topic).writeStream
             .foreachBatch(count).option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    rates = [p["processedRowsPerSecond"] for p in query.recentProgress if p["numInputRows"]]
    spark.stop()
    print(json.dumps({"rows": sum(rows), "rates": rates}))


if __name__ == "__main__":
    main(sys.argv[1:])
