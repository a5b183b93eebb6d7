"""What the two Spark jobs share: the session, the Kafka source, the counting, the emitting.

Counting: Spark SQL computes per record its window, value length and the checksum terms (the
low and the high 32 bits of ``xxhash64(value)``, summed apart so no long overflows; the driver
joins the halves, ``audit.contract.record.combine_halves``), and reads its identity from the headers
(``docket-origin``, ``docket-incarnation``, ``docket-seq``). Each micro-batch is then compacted
in the JVM (``compacted``): within each partition where its numbers are runs, else over the
whole batch, a row per (origin, origin incarnation, topic, window) — and partition — with its
count, bytes, checksum halves, records without a number and its record numbers as runs. Only
those rows reach Python, on the driver, where ``audit.jobs.tally`` adds them to the tallies it
keeps in SQLite beside the checkpoint (no watermark, so however late a record comes it is counted):

- per (origin, topic, window): count, bytes, the checksum halves, duplicates, and records
  without a number (their window's ``distinct`` is then unknown);
- per origin incarnation: the set of record numbers seen, as intervals
  (``audit.jobs.intervals``): its size grows with the gaps, not with the records. A number seen
  before is a duplicate of the window it falls in (the same record has the same timestamp).

Every trigger emits the cumulative figures of the windows that changed, and a ``ranges`` record
per origin incarnation that changed (highest number seen, missing ranges), written to the audit
topic with an idempotent ``acks=all`` producer before the tallies commit; ``seq`` is the
micro-batch id, which the checkpoint keeps, so a batch run again after a crash writes the same
records with the same ``seq`` (idempotent for the reconciler), and one whose tallies committed is
not counted again.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaException, Producer

from docket_common.kafka_security import KafkaSecurity
from docket_common.names import (
    AUDIT_TOPIC,
    INCARNATION_HEADER,
    NO_INCARNATION,
    ORIGIN_HEADER,
    SEQ_HEADER,
)
from docket_common.window import DEFAULT_WINDOW_MS, window_start_sql

from ..contract.delivery import deliver
from ..contract.errors import AuditError
from ..contract.record import AuditRecord, Progress, Ranges, combine_halves

log = logging.getLogger("docket.audit")

NO_ORIGIN = "-"                       # records without a docket-origin header
NO_SEQ = -1                           # records without a (valid) docket-seq header
DELIVERY_DEADLINE_S = 600.0           # a batch whose counts Kafka refuses this long fails


@dataclass
class JobOptions:
    bootstrap_servers: str
    audit_topic: str = AUDIT_TOPIC
    audit_bootstrap_servers: str | None = None     # default: the cluster being counted
    topics: str = ".*"                              # Java regex of the data topics
    window_ms: int = DEFAULT_WINDOW_MS
    trigger_s: float = 60.0
    once: bool = False                              # read what is there now, then stop
    checkpoint_dir: Path = Path(".")
    master: str = "local[*]"
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    identity: bool = True                           # number sets; False: plain counts
    kafka_options: dict | None = None               # passed as kafka.<name>
    spark_conf: dict | None = None
    mirror_target: str | None = None                # the cluster read is this mirror target's
    security: KafkaSecurity | None = None           # --kafka-config's [kafka] table

    def client_conf(self) -> dict:
        """confluent-kafka properties of the job's own clients (the audit producer, the
        catch-up reader): the security settings, then ``--kafka-option``."""
        conf = self.security.librdkafka_properties() if self.security else {}
        return {**conf, **(self.kafka_options or {})}

    def source_options(self) -> dict:
        """Spark's Kafka source options for the same: ``kafka.``-prefixed Java properties."""
        opts = self.security.spark_options() if self.security else {}
        return {**opts, **{f"kafka.{k}": v for k, v in (self.kafka_options or {}).items()}}


class SparkJobError(AuditError):
    pass


def spark_session(app: str, opts: JobOptions):
    """A session for one job, with the connector jars; Python workers run this interpreter."""
    from pyspark.sql import SparkSession

    from .jvm import ensure_jar
    from .sparklibs import ensure_spark_kafka_libs

    # Spark starts Python workers with PYSPARK_PYTHON; without it they run whatever "python3"
    # is on PATH, outside the venv, and fail to connect back.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    jars = [*ensure_spark_kafka_libs(), *filter(None, [ensure_jar()])]
    builder = (SparkSession.builder.appName(app).master(opts.master)
               .config("spark.jars", ",".join(str(j) for j in jars))
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.streaming.stateStore.providerClass",
                       "org.apache.spark.sql.execution.streaming.state."
                       "RocksDBStateStoreProvider")
               .config("spark.driver.extraJavaOptions", "-Dlog4j2.level=WARN")
               # A query that finds nothing new says so (the idle event: the land job's marks
               # wait for it) at most this often; Spark's default, 10 s, is longer than a
               # short trigger. At most once per trigger, then.
               .config("spark.sql.streaming.noDataProgressEventInterval",
                       f"{int(min(opts.trigger_s, 10.0) * 1000)}ms"))
    for k, v in (opts.spark_conf or {}).items():
        builder = builder.config(k, v)
    # The JVM is started with SIGTERM ignored, which it keeps (HotSpot leaves an inherited
    # SIG_IGN of its shutdown signals alone): a SIGTERM to the job's process group (a service
    # manager stopping it, Ctrl-C's cousin) reaches the driver alone, which stops the queries
    # and then the JVM. Otherwise the JVM shuts down under the driver's feet, mid-call, and
    # the stop is a page of py4j tracebacks. (Its stdin closing still ends it if the driver
    # dies.) The caller installs the job's own handler after.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        spark = builder.getOrCreate()
    finally:
        signal.signal(signal.SIGTERM, previous)
    spark.sparkContext.setLogLevel("WARN")
    return spark


def source_pattern(topics: str, audit_topic: str) -> str:
    """What the jobs subscribe to: the data topics (``topics``, less the audit topic and
    Kafka's internal topics) and the audit topic, read in one source so that each batch has
    one snapshot of both (``audit.jobs.catchup``). Anchored: Spark filters topic names with a
    partial match (``findFirstIn``), so without ``^`` a name would match from any letter on."""
    audit = re.escape(audit_topic)
    return f"^(?:{audit}|(?!{audit}$)(?!__)(?:{topics}))$"


def data_records(df, audit_topic: str):
    """The source's records without the audit topic's: what a tier counts and lands."""
    from pyspark.sql import functions as F

    return df.where(F.col("topic") != F.lit(audit_topic))


def kafka_stream(spark, opts: JobOptions):
    """The Kafka source of a job: the data topics and the audit topic (``source_pattern``);
    ``data_records`` leaves the audit topic's out."""
    reader = (spark.readStream.format("kafka")
              .option("kafka.bootstrap.servers", opts.bootstrap_servers)
              .option("subscribePattern", source_pattern(opts.topics, opts.audit_topic))
              .option("startingOffsets", opts.starting_offsets)
              .option("includeHeaders", "true")
              .option("kafka.isolation.level", "read_committed")
              # Records gone before the job read them (retention, deleted records, a topic
              # recreated) are the loss this tier exists to report: the job goes on from what
              # Kafka still holds (Spark logs a warning) and the missing record numbers show
              # at this tier, instead of the job dying and the tier going blind.
              .option("failOnDataLoss", "false"))
    if opts.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(opts.max_offsets_per_trigger))
    for k, v in opts.source_options().items():
        reader = reader.option(k, v)
    return reader.load()


def with_origin(df, in_jvm: bool = False):
    """Add the record's identity: ``origin`` (the first ``docket-origin`` header as text, ``-``
    without one), ``incarnation`` (``docket-incarnation``, ``-`` without one) and ``seq`` (the
    8-byte big-endian ``docket-seq`` as a long, -1 without one). A record whose first three
    headers are these three, in this order (as docket's agent writes them), has them read by
    position; any other is searched (the same first header of each name). ``in_jvm``: the
    number read by ``docket_seq`` (``audit.jobs.jvm``, registered in the session), else through
    text with Spark SQL built-ins."""
    from pyspark.sql import functions as F

    from .jvm import NUMBER_FUNCTION

    names = (ORIGIN_HEADER, INCARNATION_HEADER, SEQ_HEADER)
    # get(): null, not an error (ANSI), where a header is absent
    docket_layout = " AND ".join(f"get(headers, {i}).key = '{n}'" for i, n in enumerate(names))

    def header(name: str) -> str:
        at = names.index(name)
        return (f"CASE WHEN {docket_layout} THEN get(headers, {at}).value "
                f"ELSE get(filter(headers, h -> h.key = '{name}'), 0).value END")

    seq = header(SEQ_HEADER)
    if in_jvm:
        number = F.expr(f"{NUMBER_FUNCTION}({seq})")
    else:
        # try_cast: a number of 2^63 or more (not one docket gives) is "no number", not an error
        number = F.when(F.length(F.expr(seq)) == 8,
                        F.expr(f"try_cast(conv(hex({seq}), 16, 10) as bigint)"))
    return (df.withColumn("origin", F.coalesce(F.expr(header(ORIGIN_HEADER)).cast("string"),
                                               F.lit(NO_ORIGIN)))
            .withColumn("incarnation", F.coalesce(
                F.expr(header(INCARNATION_HEADER)).cast("string"), F.lit(NO_INCARNATION)))
            .withColumn("seq", F.coalesce(number, F.lit(NO_SEQ).cast("long"))))


TALLY_SCHEMA = ("kind STRING, origin STRING, topic STRING, window_start LONG, n LONG, "
                "bytes LONG, lo LONG, hi LONG, duplicates LONG, unnumbered LONG, "
                "incarnation STRING, through LONG, missing STRING, missing_total LONG, "
                "missing_truncated BOOLEAN")


def count_plain(df, window_ms: int):
    """Counts without identity (``--no-identity``): one SQL aggregation per (topic, window,
    origin), in ``TALLY_SCHEMA`` rows whose records are all taken as unnumbered."""
    from pyspark.sql import functions as F

    value = F.coalesce(F.col("value"), F.lit(b"").cast("binary"))
    h = F.xxhash64(value)
    return (df
            .withColumn("window_start",
                        F.expr(window_start_sql("unix_millis(timestamp)", window_ms)))
            .groupBy("topic", "window_start", "origin")
            .agg(F.count(F.lit(1)).alias("n"),
                 F.sum(F.length(value).cast("long")).alias("bytes"),
                 F.sum(h.bitwiseAND(F.lit(0xFFFFFFFF))).alias("lo"),
                 F.sum(F.shiftrightunsigned(h, 32)).alias("hi"))
            .select(F.lit("count").alias("kind"), "origin", "topic", "window_start", "n",
                    "bytes", "lo", "hi", F.lit(0).cast("long").alias("duplicates"),
                    F.col("n").alias("unnumbered"), F.lit("").alias("incarnation"),
                    F.lit(0).cast("long").alias("through"), F.lit("").alias("missing"),
                    F.lit(0).cast("long").alias("missing_total"),
                    F.lit(False).alias("missing_truncated")))


def count_rows(df, window_ms: int):
    """Per record what the counting needs (origin, incarnation, seq, topic, window_start, len,
    lo, hi); ``df`` has topic, timestamp, value, origin, incarnation, seq. A missing value
    counts as empty bytes, as the agent's hash of b"" does."""
    from pyspark.sql import functions as F

    value = F.coalesce(F.col("value"), F.lit(b"").cast("binary"))
    h = F.xxhash64(value)
    return df.select(
        "origin", "incarnation", "seq", "topic",
        F.expr(window_start_sql("unix_millis(timestamp)", window_ms)).alias("window_start"),
        F.length(value).cast("long").alias("len"),
        h.bitwiseAND(F.lit(0xFFFFFFFF)).alias("lo"),
        F.shiftrightunsigned(h, 32).alias("hi"))


def compact(rows, in_jvm: bool = False):
    """One micro-batch of ``count_rows`` compacted in the JVM: a row per (origin, incarnation,
    topic, window_start) with n, bytes, lo, hi, unnumbered and the record numbers as runs
    (``starts``, ``ends``: sorted, disjoint, inclusive; a number given twice is in one run
    once). ``in_jvm``: the runs made by ``docket_seq_runs`` (``audit.jobs.jvm``, registered in
    the session), else by Spark SQL built-ins, which hold, sort and shuffle every number of a
    group. Two stages, a shuffle between them (``compacted`` tries one first)."""
    from pyspark.sql import functions as F

    from .jvm import RUNS_FUNCTION

    numbered = F.coalesce(F.col("seq") >= 0, F.lit(False))       # a null number is none
    sums = (F.count(F.lit(1)).alias("n"), F.sum("len").alias("bytes"),
            F.sum("lo").alias("lo"), F.sum("hi").alias("hi"),
            F.count(F.when(~numbered, 1)).alias("unnumbered"))
    key = ("origin", "incarnation", "topic", "window_start")
    columns = (*key, "n", "bytes", "lo", "hi", "unnumbered")
    if in_jvm:
        groups = rows.groupBy(*key).agg(*sums, F.expr(f"{RUNS_FUNCTION}(seq)").alias("runs"))
        return groups.select(*columns, F.col("runs.starts").alias("starts"),
                             F.col("runs.ends").alias("ends"))
    groups = rows.groupBy(*key).agg(
        *sums, F.array_sort(F.collect_list(F.when(numbered, F.col("seq")))).alias("s"))
    # A run starts where a number is more than one past the one before it, and ends where the
    # next is more than one past it (equal neighbours, a copy, neither start nor end one).
    return groups.select(
        *columns,
        F.expr("filter(s, (x, i) -> i = 0 OR x - get(s, i - 1) > 1)").alias("starts"),
        F.expr("filter(s, (x, i) -> i = size(s) - 1 OR get(s, i + 1) - x > 1)").alias("ends"))


def in_partitions(rows, max_runs: int | None = None, ratio: int | None = None):
    """``compact``'s rows made within each partition by ``PartitionRuns`` (``audit.jobs.jvm``;
    its classes loaded in the session): one stage, no shuffle, a row per group and partition
    (the driver adds up a group's rows: a number in two of them is held for the second, a
    copy). A partition whose groups and runs pass ``max_runs``, or pass 4,096 and one for
    every ``ratio`` records it read (``PartitionRuns.MAX_RUNS`` and ``RATIO`` when None; a
    ratio of 0 checks no ratio), gives one row alone with ``n`` -1 instead: its numbers are no
    runs (records with keys of their own, spread over the partitions one by one), or it holds
    a little of many groups."""
    from pyspark.sql import DataFrame

    from .jvm import COMPACT_CLASS, java_class

    spark = rows.sparkSession
    cls = java_class(spark, COMPACT_CLASS)
    return DataFrame(cls.compact(rows._jdf, cls.MAX_RUNS if max_runs is None else max_runs,
                                 cls.RATIO if ratio is None else ratio), spark)


def compacted(rows, in_jvm: bool = False, max_runs: int | None = None) -> list:
    """A micro-batch's compacted rows, collected: within partitions (``in_partitions``) where
    the Java is there and every partition's numbers are runs, else by ``compact``. A
    partition path that fails (the rows past ``spark.driver.maxResultSize``, say) is logged and
    the batch compacted by ``compact``, which fails in its turn where the cause is not the
    path's own."""
    if in_jvm:
        try:
            got = in_partitions(rows, max_runs).collect()
        except Exception as e:      # py4j's Py4JJavaError: a failed Spark job
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:500]
            log.warning("compacting the batch within its partitions failed (%s): the batch is "
                        "compacted with a shuffle", why)
        else:
            if all(r["n"] >= 0 for r in got):
                return got
            log.info("a partition's record numbers are no runs, or it holds little of many "
                     "groups: the batch is compacted with a shuffle")
    return compact(rows, in_jvm).collect()


def count_batch(store, writer: AuditWriter, in_jvm: bool = False) -> Callable:
    """The identity counting's ``foreachBatch`` function: the batch compacted (``compact``),
    added to ``store`` (``audit.jobs.tally.TallyStore``), the changed windows and number spaces
    written to the audit topic, then the store committed; a batch applied before (the job
    stopped between the commit and Spark's) is not applied or written again."""
    def run(batch_df, batch_id: int) -> None:
        if store.applied() >= batch_id:
            log.info("batch %d: counted before", batch_id)
            return
        began = time.monotonic()
        groups = compacted(batch_df, in_jvm)
        counted = time.monotonic()
        rows = store.apply(batch_id, groups)
        tallied = time.monotonic()
        try:
            records = writer.records(rows, batch_id)
            writer.send([r.encode() for r in records])
        except BaseException:
            store.rollback()
            raise
        store.commit()
        log.info("tallies after batch %d: %s", batch_id, json.dumps(store.size()))
        log.info("batch %d: %d audit record(s) written for tier %s (%d group(s); %.2f s "
                 "reading and compacting, %.2f s adding to the tallies, %.2f s writing)",
                 batch_id, len(records), writer.tier, len(groups), counted - began,
                 tallied - counted, time.monotonic() - tallied)
    return run


def dedup_by_origin(df, window_ms: int):
    """``land --dedup``'s step: ``df`` (the landed columns, ``audit.jobs.dedup.LANDED_COLUMNS``)
    → the records seen for the first time, and per origin the changed tallies of copies
    skipped (``DEDUP_SCHEMA``). Append mode: a record is emitted once, when first seen."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    from .dedup import DEDUP_SCHEMA, DEDUP_STATE

    rows = df.withColumn(
        "window_start", F.expr(window_start_sql("unix_millis(timestamp)", window_ms)))
    return rows.groupBy("origin").applyInPandasWithState(
        dedup_origin, DEDUP_SCHEMA, DEDUP_STATE, "append", GroupStateTimeout.NoTimeout)


def dedup_origin(key, frames, state):
    """The stateful step of one origin under ``--dedup`` (runs in a Python worker)."""
    from .dedup import OriginDedup

    dedup = OriginDedup.load(*(state.get if state.exists else (None, None)))
    yield from dedup.keep(key[0], frames, done=lambda: state.update(dedup.dump()))


class AuditWriter:
    """Writes a tier's counts and progress to the audit topic from the driver."""

    def __init__(self, opts: JobOptions, tier: str, emitter: str):
        self.tier = tier
        self.emitter = emitter
        self.incarnation = incarnation_of(opts.checkpoint_dir)
        self.window_ms = opts.window_ms
        self.topic = opts.audit_topic
        self.producer = Producer({
            "bootstrap.servers": opts.audit_bootstrap_servers or opts.bootstrap_servers,
            "acks": "all", "enable.idempotence": True, "linger.ms": 20,
            "client.id": f"docket-audit-{emitter}", **opts.client_conf()})

    def records(self, rows, batch_id: int) -> list[AuditRecord | Ranges]:
        now = int(time.time() * 1000)
        out: list[AuditRecord | Ranges] = []
        for r in rows:
            if r["kind"] == "ranges":
                out.append(Ranges(
                    tier=self.tier, origin=r["origin"], origin_incarnation=r["incarnation"],
                    emitter=self.emitter, incarnation=self.incarnation, seq=batch_id,
                    emitted_at=now, through=int(r["through"]),
                    missing=json.loads(r["missing"]), missing_total=int(r["missing_total"]),
                    missing_truncated=bool(r["missing_truncated"])))
                continue
            n, dups = int(r["n"]), int(r["duplicates"])
            known = int(r["unnumbered"]) == 0
            out.append(AuditRecord(
                tier=self.tier, origin=r["origin"], topic=r["topic"],
                window_start=int(r["window_start"]), window_ms=self.window_ms, count=n,
                bytes=int(r["bytes"] or 0),
                checksum=combine_halves(int(r["lo"] or 0), int(r["hi"] or 0)),
                emitter=self.emitter, seq=batch_id, emitted_at=now,
                distinct=n - dups if known else None, duplicates=dups if known else None,
                incarnation=self.incarnation))
        return out

    def skipped_records(self, rows, batch_id: int) -> list[AuditRecord]:
        """``land --dedup``'s tallies of copies skipped (rows with origin, topic, window_start,
        skipped): count records that add nothing to the tier's count and say ``skipped``."""
        now = int(time.time() * 1000)
        return [AuditRecord(
            tier=self.tier, origin=r["origin"], topic=r["topic"],
            window_start=int(r["window_start"]), window_ms=self.window_ms, count=0, bytes=0,
            checksum=0, emitter=self.emitter, seq=batch_id, emitted_at=now, distinct=0,
            duplicates=0, incarnation=self.incarnation, skipped=int(r["skipped"]))
            for r in rows]

    def send(self, encoded: list[tuple[bytes, bytes]]) -> None:
        """Deliver every (key, value) or raise: the batch then fails and runs again."""
        todo = list(encoded)
        deadline = time.monotonic() + DELIVERY_DEADLINE_S
        delay = 0.5
        while todo:
            todo, errors = self._send_round(todo)
            if not todo:
                return
            if time.monotonic() > deadline:
                raise SparkJobError(f"{len(todo)} audit record(s) not acknowledged by the "
                                    f"audit topic {self.topic!r}: {errors[0]}")
            log.warning("%d audit record(s) not acknowledged (%s); trying again in %.1f s",
                        len(todo), errors[0], delay)
            time.sleep(delay)
            delay = min(delay * 2, 30)

    def _send_round(self, todo: list[tuple[bytes, bytes]]) -> tuple[list, list[str]]:
        """One attempt at every record; returns the ones not acknowledged and why."""
        acked, errors = deliver(self.producer, self.topic, todo, timeout_s=30, settle_s=5)
        failed = [kv for i, kv in enumerate(todo) if i not in acked]
        return failed, errors or ["no answer in time"]

    def progress(self, p: Progress) -> None:
        try:
            key, value = p.encode()
            self.producer.produce(self.topic, value, key)
            self.producer.poll(0)
        except (BufferError, KafkaException) as exc:     # progress is best effort
            log.warning("progress record not sent: %s", exc)

    def close(self) -> None:
        self.producer.flush(30)


def incarnation_of(checkpoint_dir: Path) -> str:
    """The job's incarnation: created once with its checkpoint (a new checkpoint starts its
    batch ids, the records' ``seq``, at 0 again)."""
    path = Path(checkpoint_dir) / "incarnation"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        value = f"{int(time.time() * 1000)}-{os.urandom(4).hex()}"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(value + "\n")
        tmp.replace(path)
        return value


def emit_batch(writer: AuditWriter) -> Callable:
    """The plain counting's ``foreachBatch`` function: the changed groups of one trigger (Spark
    keeps their state) → the audit topic."""
    def run(batch_df, batch_id: int) -> None:
        records = writer.records(batch_df.collect(), batch_id)
        writer.send([r.encode() for r in records])
        log.info("batch %d: %d audit record(s) written for tier %s", batch_id, len(records),
                 writer.tier)
    return run


def make_progress_listener(queries: dict[str, tuple[AuditWriter, str, Path]],
                           catch_up=None):
    """A listener publishing each query's progress (query name → writer, the emitter name to
    publish it under, the folder for ``progress.json``), and handing it to ``catch_up``
    (``audit.jobs.catchup.CatchUp``)."""
    from pyspark.sql.streaming import StreamingQueryListener

    names: dict[str, str] = {}              # query id → name (an idle event has no name)

    class ProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event):   # noqa: N802 (Spark's names)
            names[str(event.id)] = event.name

        def onQueryProgress(self, event):  # noqa: N802
            p = event.progress
            target = queries.get(p.name)
            if target is None:
                return
            writer, emitter, folder = target
            rec = Progress(tier=writer.tier, emitter=emitter, batch_id=p.batchId,
                           input_rows_per_s=float(p.inputRowsPerSecond or 0.0),
                           processed_rows_per_s=float(p.processedRowsPerSecond or 0.0),
                           batch_duration_ms=int(p.batchDuration or 0),
                           offsets_behind=offsets_behind(p.sources),
                           publishes_caught_up=catch_up is not None and
                           emitter == catch_up.emitter, incarnation=writer.incarnation)
            if catch_up is not None:
                catch_up.progressed(p, rec.offsets_behind)
            writer.progress(rec)
            body = {**rec.to_dict(), "query": p.name, "num_input_rows": p.numInputRows}
            tmp = folder / "progress.json.tmp"
            tmp.write_text(json.dumps(body) + "\n")
            tmp.replace(folder / "progress.json")
            log.info("progress %s", json.dumps(body))

        def onQueryIdle(self, event):      # noqa: N802
            name = names.get(str(event.id))
            if catch_up is not None and name is not None:
                catch_up.idle(name, event.timestamp)

        def onQueryTerminated(self, event):  # noqa: N802
            pass

    return ProgressListener()


def offsets_behind(sources) -> int | None:
    """Records between where a Kafka source read to and the end of its topics, or None for a
    source that is not Kafka."""
    total = None
    for s in sources:
        try:
            end = json.loads(s.endOffset) if s.endOffset else {}
            latest = json.loads(s.latestOffset) if s.latestOffset else {}
        except (TypeError, ValueError):
            continue
        if not isinstance(latest, dict) or not isinstance(end, dict):
            continue
        for topic, parts in latest.items():
            if not isinstance(parts, dict):
                continue
            for part, off in parts.items():
                total = (total or 0) + max(0, int(off) - int(end.get(topic, {}).get(part, 0)))
    return total
