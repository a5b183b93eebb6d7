"""The two Spark jobs of the audit pipeline.

``count``: the tier of one Kafka cluster. Reads every record of every data topic (Spark's Kafka
source, ``read_committed``), counts per (topic, window, origin) and writes the figures of the
windows that changed to the audit topic each trigger, ``tier`` = the cluster's name.

``land``: the warehouse tier. One query lands every data topic as Parquet under
``DIR/data/topic=T/date=YYYY-MM-DD/hour=H`` through Spark's file sink (exactly once: a file is
part of the table only once the sink's log commits it). A second query reads that table back as
a stream, which sees committed files only, and counts them: the ``warehouse`` tier counts what
landed, not what was read from Kafka.

Both keep their progress in ``--checkpoint-dir``: stopped or killed at any point and started
again, they neither lose nor count twice.
"""

from __future__ import annotations

import logging
from pathlib import Path

from .record import WAREHOUSE_TIER
from .spark import (
    AuditWriter,
    JobOptions,
    count_by_window,
    emit_batch,
    kafka_stream,
    make_progress_listener,
    spark_session,
    with_origin,
)

log = logging.getLogger("docket.audit")

LANDED_SCHEMA = ("`partition` INT, `offset` BIGINT, `timestamp` TIMESTAMP, `key` BINARY, "
                 "`value` BINARY, `origin` STRING, `topic` STRING, `date` STRING, `hour` INT")


def _trigger(opts: JobOptions) -> dict:
    return {"availableNow": True} if opts.once else {"processingTime": f"{opts.trigger_s} seconds"}


def run_count(cluster: str, opts: JobOptions) -> None:
    spark = spark_session(f"docket-audit-count-{cluster}", opts)
    ckpt = opts.checkpoint_dir
    ckpt.mkdir(parents=True, exist_ok=True)
    writer = AuditWriter(opts, tier=cluster, emitter=f"{cluster}/count")
    name = f"docket-count-{cluster}"
    spark.streams.addListener(make_progress_listener({name: (writer, writer.emitter, ckpt)}))
    counts = count_by_window(with_origin(kafka_stream(spark, opts)), opts.window_ms)
    query = (counts.writeStream.queryName(name).outputMode("update")
             .option("checkpointLocation", str(ckpt / "count"))
             .foreachBatch(emit_batch(writer))
             .trigger(**_trigger(opts))
             .start())
    log.info("counting cluster %s (%s) into %s every %s", cluster, opts.bootstrap_servers,
             opts.audit_topic, "run (once)" if opts.once else f"{opts.trigger_s} s")
    try:
        query.awaitTermination()
    finally:
        writer.close()
        spark.stop()


def run_land(warehouse: Path, opts: JobOptions) -> None:
    from pyspark.sql import functions as F

    spark = spark_session("docket-audit-land", opts)
    ckpt = opts.checkpoint_dir
    ckpt.mkdir(parents=True, exist_ok=True)
    data = warehouse / "data"
    data.mkdir(parents=True, exist_ok=True)
    writer = AuditWriter(opts, tier=WAREHOUSE_TIER, emitter=f"{WAREHOUSE_TIER}/land")
    land_name, count_name = "docket-land", "docket-land-count"
    (ckpt / "write").mkdir(exist_ok=True)
    spark.streams.addListener(make_progress_listener({
        count_name: (writer, writer.emitter, ckpt),
        land_name: (writer, f"{WAREHOUSE_TIER}/land-write", ckpt / "write")}))

    rows = (with_origin(kafka_stream(spark, opts))
            .select("partition", "offset", "timestamp", "key", "value", "origin", "topic",
                    F.date_format("timestamp", "yyyy-MM-dd").alias("date"),
                    F.hour("timestamp").alias("hour")))
    land = (rows.writeStream.queryName(land_name).format("parquet")
            .option("path", str(data))
            .option("checkpointLocation", str(ckpt / "land"))
            .partitionBy("topic", "date", "hour")
            .trigger(**_trigger(opts)))

    def start_counting():
        landed = spark.readStream.schema(LANDED_SCHEMA).parquet(str(data))
        return (count_by_window(landed, opts.window_ms)
                .writeStream.queryName(count_name).outputMode("update")
                .option("checkpointLocation", str(ckpt / "count"))
                .foreachBatch(emit_batch(writer))
                .trigger(**_trigger(opts))
                .start())

    log.info("landing %s into %s; counting what landed into %s", opts.bootstrap_servers, data,
             opts.audit_topic)
    try:
        if opts.once:
            land.start().awaitTermination()       # land everything there is, then count it
            start_counting().awaitTermination()
        else:
            land.start()
            start_counting()
            spark.streams.awaitAnyTermination()
    finally:
        for q in spark.streams.active:
            q.stop()
        writer.close()
        spark.stop()
