"""The two Spark jobs of the audit pipeline.

``count``: the tier of one Kafka cluster. Reads every record of every data topic (Spark's Kafka
source, ``read_committed``), counts per (topic, window, origin) and writes the figures of the
windows that changed to the audit topic each trigger, ``tier`` = the cluster's name.

``land``: the warehouse tier. One query lands every data topic as Parquet under
``DIR/data/topic=T/date=YYYY-MM-DD/hour=H`` through Spark's file sink (exactly once: a file is
part of the table only once the sink's log commits it). A second query reads that table back as
a stream, which sees committed files only, and counts them: the ``warehouse`` tier counts what
landed, not what was read from Kafka.

``land --dedup`` lands each record (origin, origin incarnation, ``docket-seq``) once, however
often Kafka holds it: a stateful step per origin (``audit.jobs.dedup``) lets through the numbers
it has not landed yet, and each batch is committed by ``audit.jobs.landing`` (Spark's file sink
cannot also take the copies' tallies). The warehouse tier then counts no duplicates, and
records of the emitter ``warehouse/land-dedup`` say per (topic, window, origin) how many copies
were ``skipped``.

Both keep their progress in ``--checkpoint-dir``: stopped or killed at any point and started
again, they neither lose nor count twice.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

from ..contract.record import WAREHOUSE_TIER
from .catchup import CatchUp
from .dedup import LANDED_COLUMNS, LANDED_SCHEMA
from .jvm import register
from .landing import DEDUP_MODE, FILE_SINK_MODE, BatchLanding, claim_mode
from .spark import (
    AuditWriter,
    JobOptions,
    count_batch,
    count_plain,
    count_rows,
    data_records,
    dedup_by_origin,
    emit_batch,
    kafka_stream,
    make_progress_listener,
    spark_session,
    with_origin,
)
from .tally import TALLY_FILE, TallyStore, ensure_tallies

log = logging.getLogger("docket.audit")

BETWEEN_BATCHES_WAIT_S = 30.0     # at a stop: how long a batch under way may take to end



def _stop_on_signals() -> threading.Event:
    """SIGTERM/SIGINT ask the job to stop between batches (the checkpoint keeps its place)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _await(spark, stop: threading.Event, query=None) -> None:
    """Wait for ``query`` (or any query) to end, or for a stop signal."""
    while not stop.is_set():
        try:
            done = (query.awaitTermination(1) if query is not None
                    else spark.streams.awaitAnyTermination(1))
        except Exception:
            if stop.is_set():               # the JVM got the signal too and went first
                break
            raise
        if done:
            return
    log.info("stopping on a signal; the checkpoint keeps the place")


def _trigger(opts: JobOptions) -> dict:
    return {"availableNow": True} if opts.once else {"processingTime": f"{opts.trigger_s} seconds"}


def _start_counting(rows, name: str, writer: AuditWriter, opts: JobOptions, in_jvm: bool):
    """The counting query both jobs run: ``rows`` (topic, timestamp, value, origin,
    incarnation, seq) counted per (topic, window, origin) with their record numbers, the
    changed groups and number spaces written to the audit topic each trigger. With identity
    the tallies are the driver's (``audit.jobs.tally``, beside the checkpoint); without, Spark's
    own aggregation state. ``in_jvm``: the jobs' Java is registered (``audit.jobs.jvm``)."""
    checkpoint = opts.checkpoint_dir / "count"
    if opts.identity:
        store = TallyStore(opts.checkpoint_dir / TALLY_FILE)
        ensure_tallies(rows.sparkSession, checkpoint, store)
        sink = count_batch(store, writer, in_jvm)
        counted, mode = count_rows(rows, opts.window_ms), "append"
    else:
        counted, mode, sink = count_plain(rows, opts.window_ms), "update", emit_batch(writer)
    return (counted.writeStream.queryName(name).outputMode(mode)
            .option("checkpointLocation", str(checkpoint))
            .foreachBatch(sink)
            .trigger(**_trigger(opts))
            .start())


def _catch_up(opts: JobOptions, writer: AuditWriter, reading: str,
              counting: str | None) -> CatchUp:
    """The job's ``caught_up`` records (``audit.jobs.catchup``): the audit topic is read on
    the cluster the job counts, where the data is. The caller announces it
    (``CatchUp.announce``) before the job counts anything."""
    catch_up = CatchUp(tier=writer.tier, emitter=writer.emitter,
                       incarnation=writer.incarnation, audit_topic=opts.audit_topic,
                       bootstrap_servers=opts.bootstrap_servers, reading=reading,
                       counting=counting, publish=writer.send,
                       client_options=opts.client_conf(), mirror_target=opts.mirror_target)
    return catch_up


def _settle(catch_up: CatchUp, query) -> None:
    """A job run ``--once``: its last batch's marks published before it stops."""
    last = query.lastProgress
    if last is not None and not catch_up.settle(query.name, int(last["batchId"])):
        log.warning("the caught-up marks of %s's last batch were not published", query.name)


def run_count(cluster: str, opts: JobOptions) -> None:
    stop = _stop_on_signals()
    spark = spark_session(f"docket-audit-count-{cluster}", opts)
    in_jvm = register(spark)
    ckpt = opts.checkpoint_dir
    ckpt.mkdir(parents=True, exist_ok=True)
    writer = AuditWriter(opts, tier=cluster, emitter=f"{cluster}/count")
    name = f"docket-count-{cluster}"
    catch_up = _catch_up(opts, writer, name, None)
    spark.streams.addListener(make_progress_listener({name: (writer, writer.emitter, ckpt)},
                                                     catch_up))
    try:
        catch_up.announce()
        records = data_records(kafka_stream(spark, opts), opts.audit_topic)
        query = _start_counting(with_origin(records, in_jvm), name, writer, opts, in_jvm)
        log.info("counting cluster %s (%s) into %s every %s", cluster, opts.bootstrap_servers,
                 opts.audit_topic, "run (once)" if opts.once else f"{opts.trigger_s} s")
        _await(spark, stop, query)
        if not stop.is_set() and query.exception() is not None:
            raise query.exception()
        if opts.once and not stop.is_set():
            _settle(catch_up, query)
    finally:
        catch_up.close()
        _shut_down(spark, writer, stopping=stop.is_set())


def run_land(warehouse: Path, opts: JobOptions, dedup: bool = False) -> None:
    from pyspark.sql import functions as F

    claim_mode(warehouse, DEDUP_MODE if dedup else FILE_SINK_MODE)
    stop = _stop_on_signals()
    spark = spark_session("docket-audit-land", opts)
    in_jvm = register(spark)
    ckpt = opts.checkpoint_dir
    ckpt.mkdir(parents=True, exist_ok=True)
    data = warehouse / "data"
    data.mkdir(parents=True, exist_ok=True)
    writer = AuditWriter(opts, tier=WAREHOUSE_TIER, emitter=f"{WAREHOUSE_TIER}/land")
    land_name, count_name = "docket-land", "docket-land-count"
    (ckpt / "write").mkdir(exist_ok=True)
    catch_up = _catch_up(opts, writer, land_name, count_name)
    spark.streams.addListener(make_progress_listener({
        count_name: (writer, writer.emitter, ckpt),
        land_name: (writer, f"{WAREHOUSE_TIER}/land-write", ckpt / "write")}, catch_up))

    rows = (with_origin(data_records(kafka_stream(spark, opts), opts.audit_topic), in_jvm)
            .select("partition", "offset", "timestamp", "key", "value", "origin", "incarnation",
                    "seq", "topic",
                    F.date_format("timestamp", "yyyy-MM-dd").alias("date"),
                    F.hour("timestamp").alias("hour")))
    if dedup:
        skips = AuditWriter(opts, tier=WAREHOUSE_TIER, emitter=f"{WAREHOUSE_TIER}/land-dedup")
        landing = BatchLanding(warehouse, ckpt / "land", writer.incarnation)
        land = (dedup_by_origin(rows, opts.window_ms).writeStream.queryName(land_name)
                .option("checkpointLocation", str(ckpt / "land"))
                .foreachBatch(land_batch(landing, skips))
                .trigger(**_trigger(opts)))
    else:
        skips = None
        land = (rows.writeStream.queryName(land_name).format("parquet")
                .option("path", str(data))
                .option("checkpointLocation", str(ckpt / "land"))
                .partitionBy("topic", "date", "hour")
                .trigger(**_trigger(opts)))

    def start_counting():
        landed = spark.readStream.schema(LANDED_SCHEMA).parquet(str(data))
        return _start_counting(landed, count_name, writer, opts, in_jvm)

    log.info("landing %s into %s%s; counting what landed into %s", opts.bootstrap_servers,
             data, " (each record once)" if dedup else "", opts.audit_topic)
    try:
        catch_up.announce()
        if opts.once:                              # land everything there is, then count it
            for start in (land.start, start_counting):
                query = start()
                _await(spark, stop, query)
                if stop.is_set():
                    break
                if query.exception() is not None:
                    raise query.exception()
                _settle(catch_up, query)
        else:
            queries = [land.start(), start_counting()]
            _await(spark, stop)
            for q in queries:
                if not stop.is_set() and q.exception() is not None:
                    raise q.exception()
    finally:
        catch_up.close()
        if skips is not None:
            skips.close()
        _shut_down(spark, writer, stopping=stop.is_set())


def land_batch(landing: BatchLanding, skips: AuditWriter):
    """``land --dedup``'s ``foreachBatch``: the batch's new records into the table (once, see
    ``audit.jobs.landing``), then the tallies of the copies it skipped to the audit topic."""
    from pyspark.sql import functions as F

    def run(batch_df, batch_id: int) -> None:
        batch_df.persist()
        try:
            def write(folder: Path) -> None:
                (batch_df.where(F.col("kind") == "row").select(*LANDED_COLUMNS)
                 .write.partitionBy("topic", "date", "hour").parquet(str(folder)))

            moved = landing.land(batch_id, write)
            tallies = batch_df.where(F.col("kind") == "skipped").select(
                "origin", "topic", "window_start", "skipped").collect()
        finally:
            batch_df.unpersist()
        records = skips.skipped_records(tallies, batch_id)
        skips.send([r.encode() for r in records])
        log.info("batch %d: %s; %d copies skipped in %d window(s)", batch_id,
                 "landed before" if moved is None else f"{moved} file(s) landed",
                 sum(r.skipped for r in records), len(records))
    return run


def _shut_down(spark, writer, stopping: bool) -> None:
    """Stop the queries, each between two batches when one ends within
    ``BETWEEN_BATCHES_WAIT_S``, then the session. A query that is always busy (its batches
    take longer than its trigger) is stopped in a batch: Spark cuts it short and runs it again
    at the next start (the checkpoint is consistent at every point), and what Spark and py4j
    would log of the batch they interrupted is not logged — on a stop asked for, it says
    nothing. The JVM ignores SIGTERM (``spark.spark_session``); should it be gone all the
    same (killed), there is nothing left to stop, and that is fine."""
    writer.close()
    try:
        if stopping and spark.streams.active:
            log.info("stopping the queries; a batch under way is cut short and runs again at "
                     "the next start")
            spark.sparkContext.setLogLevel("OFF")
            logging.getLogger("py4j").setLevel(logging.CRITICAL)
        for q in spark.streams.active:
            deadline = time.monotonic() + BETWEEN_BATCHES_WAIT_S
            while q.status.get("isTriggerActive") and time.monotonic() < deadline:
                time.sleep(0.05)
            q.stop()
        spark.stop()
    except Exception as exc:
        if not stopping:
            raise
        log.info("the Spark JVM was already stopping: %s", str(exc).splitlines()[0])
