"""The audit jobs' baselines in ``bench_audit.py``: the same Kafka source as the audit jobs (the
session of ``audit.jobs.spark``, its source options, the same micro-batches), each batch only
counted (``df.count()``: the count job's baseline) or written to Parquet with Spark's file sink
partitioned as the land job's table is (``--parquet DIR``: the land job's baseline) — what Spark
itself needs, with none of the jobs' work (identity, windows, tallies, the audit records).

    python tests/bench/spark_bare.py BOOTSTRAP TOPIC AUDIT_TOPIC MASTER BATCH CHECKPOINT_DIR
        [--parquet DIR]

Prints one JSON line: the rows read and Spark's processedRowsPerSecond of every batch that
read at least a tenth of BATCH rows, in order.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from audit.jobs.spark import JobOptions, data_records, kafka_stream, spark_session  # noqa: E402


def main(argv: list[str]) -> None:
    bootstrap, topic, audit_topic, master, batch, checkpoint, *parquet = argv
    opts = JobOptions(bootstrap_servers=bootstrap, audit_topic=audit_topic,
                      topics=re.escape(topic), master=master, once=True,
                      max_offsets_per_trigger=int(batch), checkpoint_dir=Path(checkpoint))
    spark = spark_session("docket-bench-bare-read", opts)
    records = data_records(kafka_stream(spark, opts), audit_topic)
    if parquet:
        from pyspark.sql import functions as F

        writer = (records.select("partition", "offset", "timestamp", "key", "value", "topic",
                                 F.date_format("timestamp", "yyyy-MM-dd").alias("date"),
                                 F.hour("timestamp").alias("hour"))
                  .writeStream.format("parquet").option("path", parquet[1])
                  .partitionBy("topic", "date", "hour"))
    else:
        writer = records.writeStream.foreachBatch(lambda df, _batch_id: counted.append(df.count()))
    counted: list[int] = []
    query = (writer.option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    # a batch of a few rows (the audit topic's records after the data) is not a rate
    rates = [p["processedRowsPerSecond"] for p in query.recentProgress
             if p["numInputRows"] >= int(batch) // 10]
    rows = spark.read.parquet(parquet[1]).count() if parquet else sum(counted)
    spark.stop()
    print(json.dumps({"rows": rows, "rates": rates}))


if __name__ == "__main__":
    main(sys.argv[1:])
