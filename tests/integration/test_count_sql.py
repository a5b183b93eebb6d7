"""The count job's SQL, run in a real Spark on rows made here (no Kafka): the identity read from
the headers (``with_origin``) by position where docket wrote them, searched otherwise, the first
of each name, a malformed number as none; and each batch's compaction (``compact``) equal, group
by group and run by run, to what counting record by record in Python makes
(``test_count_tally.compacted``), both ways it is made: by Spark SQL's built-ins, and within
each partition by the jobs' Java (``audit/jobs/PartitionRuns.java`` with
``audit/jobs/SeqRuns.java``; a group's rows added up as the driver does), whatever order the
numbers come in.

Its Spark runs in the test process, without the Kafka connector's jars: like ``test_window_sql.py``
it belongs to the ``agent`` group (``tests/run_groups.py``), whose session starts no other
Spark. In the ``audit`` group it came first and ``test_broker_security.py``'s Spark, in the same
process and JVM, then found no ``kafka`` source (jars named after a JVM starts are not on its
driver's classpath)."""

from __future__ import annotations

import random

import pytest

from tests.unit.test_count_tally import compacted

ORG, INC, SEQ = "docket-origin", "docket-incarnation", "docket-seq"


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    """A session with the jobs' Java built (``audit.jobs.jvm``) and on its classpath: this
    file's is the first Spark of its group's process (files run in name order), so the jar is
    there when the JVM starts."""
    pyspark = pytest.importorskip("pyspark.sql")
    from audit.jobs.jvm import ensure_jar

    jar = ensure_jar()
    assert jar is not None, "make setup installs a JDK; the Java compaction must be built here"
    session = (pyspark.SparkSession.builder.appName("docket-count-sql-test").master("local[2]")
               .config("spark.ui.enabled", "false")
               .config("spark.jars", str(jar))
               .config("spark.local.dir", str(tmp_path_factory.mktemp("spark")))
               .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    yield session
    session.stop()


@pytest.fixture(params=["sql", "jvm", "partitions"])
def in_jvm(request, spark) -> bool | str:
    """Every way: Spark SQL's built-ins; the jobs' Java aggregation (``docket_seq`` and
    ``docket_seq_runs`` registered here); and the compaction within each partition
    (``PartitionRuns.java``: a group read from several partitions is several rows, added up
    as the driver adds them, ``merged``)."""
    from audit.jobs.jvm import register

    if request.param == "sql":
        return False
    assert register(spark), "the jobs' Java could not be registered"
    return True if request.param == "jvm" else "partitions"


def compacted_by(df, way: bool | str) -> list[dict]:
    from audit.jobs.spark import compact, in_partitions

    if way == "partitions":      # the rows themselves: no check against the records read
        rows = [r.asDict() for r in in_partitions(df, ratio=0).collect()]
        assert all(r["n"] >= 0 for r in rows), "every partition's numbers were to be runs"
        return rows
    return [r.asDict() for r in compact(df, way).collect()]


def n8(n: int) -> bytes:
    return n.to_bytes(8, "big")


HEADERS = [   # headers → (origin, incarnation, seq)
    ([(ORG, b"h1"), (INC, b"i1"), (SEQ, n8(7))], ("h1", "i1", 7)),                # docket's order
    ([(SEQ, n8(9)), (ORG, b"h2"), (INC, b"i2")], ("h2", "i2", 9)),                # another order
    ([(ORG, b"h3"), (INC, b"i3"), (SEQ, n8(1)), (SEQ, n8(2))], ("h3", "i3", 1)),   # the first one
    ([(ORG, b"h4"), (ORG, b"h5"), (INC, b"i4"), (SEQ, n8(3))], ("h4", "i4", 3)),    # the first one
    ([(INC, b"i6"), (INC, b"i7"), (SEQ, n8(4)), (ORG, b"h6")], ("h6", "i6", 4)),
    ([(ORG, b"h7"), (INC, b"i8"), (SEQ, b"\x01\x02")], ("h7", "i8", -1)),         # not 8 bytes
    ([(ORG, b"h8"), (INC, b"i9"), (SEQ, b"\xff" * 8)], ("h8", "i9", -1)),         # over 2^63
    ([(ORG, b"h11"), (INC, b"i11"), (SEQ, n8(2**63 - 1))], ("h11", "i11", 2**63 - 1)),
    ([(ORG, b"h12"), (INC, b"i12"), (SEQ, bytes.fromhex("00ff80ff7f0180fe"))],   # bytes >= 0x80
     ("h12", "i12", 0x00ff80ff7f0180fe)),
    ([(ORG, b"h13"), (INC, b"i13"), (SEQ, b"\x00" * 9)], ("h13", "i13", -1)),    # 9 bytes
    ([(ORG, b"h14"), (INC, b"i14"), (SEQ, b"")], ("h14", "i14", -1)),
    ([(ORG, b"h9")], ("h9", "-", -1)),
    ([("traceparent", b"x"), (ORG, b"h10"), (INC, b"i10"), (SEQ, n8(5))], ("h10", "i10", 5)),
    ([], ("-", "-", -1)),
    (None, ("-", "-", -1)),
]


def test_the_identity_is_read_by_position_where_docket_wrote_it_and_searched_elsewhere(spark,
                                                                                      in_jvm):
    from audit.jobs.spark import with_origin

    rows = [(i, h) for i, (h, _want) in enumerate(HEADERS)]
    df = spark.createDataFrame(rows, "i INT, headers ARRAY<STRUCT<key: STRING, value: BINARY>>")
    got = {r["i"]: (r["origin"], r["incarnation"], r["seq"])
           for r in with_origin(df, in_jvm).collect()}
    assert got == {i: want for i, (_h, want) in enumerate(HEADERS)}


COLUMNS = ("origin STRING, incarnation STRING, seq LONG, topic STRING, window_start LONG, "
           "len LONG, lo LONG, hi LONG")
KEY = ("origin", "incarnation", "topic", "window_start")


def by_key(groups):
    return {tuple(g[k] for k in KEY): {f: (list(g[f]) if f in ("starts", "ends") else g[f])
                                       for f in ("n", "bytes", "lo", "hi", "unnumbered",
                                                 "starts", "ends")}
            for g in merged(groups)}


def merged(groups) -> list[dict]:
    """Rows of one key added up: sums summed, runs joined (sorted, disjoint, a number in two
    rows once). One row per key stays as it was."""
    out: dict[tuple, dict] = {}
    for g in groups:
        key = tuple(g[k] for k in KEY)
        if key not in out:
            out[key] = dict(g)
            continue
        have = out[key]
        for f in ("n", "bytes", "lo", "hi", "unnumbered"):
            have[f] += g[f]
        runs = sorted([*zip(have["starts"], have["ends"], strict=True),
                       *zip(g["starts"], g["ends"], strict=True)])
        joined: list[list[int]] = []
        for a, b in runs:
            if joined and a - joined[-1][1] <= 1:
                joined[-1][1] = max(joined[-1][1], b)
            else:
                joined.append([a, b])
        have["starts"], have["ends"] = [a for a, _ in joined], [b for _, b in joined]
    return list(out.values())


def test_the_compaction_within_partitions_splits_a_group_read_from_several(spark):
    """Within partitions, a group read from four partitions is four rows (which ``merged``
    and the driver add up), and each row's runs are its partition's numbers alone."""
    from audit.jobs.jvm import register
    from audit.jobs.spark import compacted as in_spark

    assert register(spark)
    records = [("a", "i1", n, "t", 0, 1, 1, 1) for n in range(1000)]
    df = spark.createDataFrame(records, COLUMNS).repartition(4)
    rows = [r.asDict() for r in in_spark(df, True)]
    assert len(rows) == 4 and sum(r["n"] for r in rows) == 1000
    assert by_key(rows) == by_key(compacted(records))


def test_numbers_spread_over_the_partitions_one_by_one_are_joined_by_the_shuffle(spark):
    """Records with keys of their own go to the partitions one by one: each partition's
    numbers are as many runs as records, which within partitions would all reach the driver.
    A partition past ``max_runs`` gives up (one row, n -1) and the batch is compacted by the
    aggregation: one row, one run, the same figures."""
    from audit.jobs.jvm import register
    from audit.jobs.spark import compacted as in_spark
    from audit.jobs.spark import in_partitions

    assert register(spark)
    records = [("a", "i1", n, "t", 0, 1, 1, 1) for n in range(20_000)]
    df = spark.createDataFrame(records, COLUMNS).repartition(4)      # round robin
    spread = [r.asDict() for r in in_partitions(df, ratio=0).collect()]
    assert sum(len(r["starts"]) for r in spread) > 10_000           # runs of a record or two
    gave_up = [r.asDict() for r in in_partitions(df, 1000).collect()]
    assert [r["n"] for r in gave_up] == [-1] * 4
    rows = [r.asDict() for r in in_spark(df, True, max_runs=1000)]
    assert len(rows) == 1 and rows[0]["starts"] == [0] and rows[0]["ends"] == [19_999]
    assert by_key(rows) == by_key(compacted(records))


def test_a_partition_holding_little_of_many_groups_leaves_the_batch_to_the_shuffle(spark):
    """A fleet's hosts, a few records each, in every partition: within partitions a row for
    each group in each partition, where the shuffle gives one a group. A partition past 4,096
    groups and runs and one for every 64 records it read gives up; the batch goes by the
    aggregation, a row a group, the same figures."""
    from audit.jobs.jvm import register
    from audit.jobs.spark import compacted as in_spark
    from audit.jobs.spark import in_partitions

    assert register(spark)
    records = [(f"host-{h}", "i1", n, "t", 0, 1, 1, 1) for h in range(5000) for n in range(4)]
    df = spark.createDataFrame(records, COLUMNS).repartition(2)
    assert [r["n"] for r in in_partitions(df).collect()] == [-1, -1]
    assert len(in_partitions(df, ratio=0).collect()) > 5000          # a row a group and part
    rows = [r.asDict() for r in in_spark(df, True)]
    assert len(rows) == 5000
    assert by_key(rows) == by_key(compacted(records))


def test_a_partition_path_that_fails_leaves_the_batch_to_the_shuffle(spark, monkeypatch,
                                                                      caplog):
    """The partition path failing (its rows past ``spark.driver.maxResultSize``, say): a
    WARNING, and the batch compacted by the aggregation, the same figures."""
    import audit.jobs.spark as jobs
    from audit.jobs.jvm import register

    assert register(spark)

    def fails(*_a, **_k):
        raise RuntimeError(next(messages))

    messages = iter(["Total size of serialized results is bigger than maxResultSize", ""])

    monkeypatch.setattr(jobs, "in_partitions", fails)
    records = [("a", "i1", n, "t", 0, 1, 1, 1) for n in range(100)]
    df = spark.createDataFrame(records, COLUMNS).repartition(2)
    for _ in range(2):                  # the second failure without a message
        rows = [r.asDict() for r in jobs.compacted(df, True)]
        assert by_key(rows) == by_key(compacted(records)) and len(rows) == 1
    assert "maxResultSize" in caplog.text and "(RuntimeError)" in caplog.text


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_compacted_in_spark_is_the_batch_compacted_record_by_record(spark, in_jvm,
                                                                          seed):

    rng = random.Random(seed)
    records, counters = [], {}
    for _ in range(20_000):       # as agents write: slots of one topic, numbers one after another
        origin, inc = rng.choice(["a", "b", "c", "d"]), rng.choice(["i1", "i1", "i1", "i2"])
        seq = counters.get((origin, inc), 0)
        counters[(origin, inc)] = seq + rng.choice([1] * 30 + [2, 9])      # some never come
        r = rng.random()
        if r < 0.03:
            seq = -1                                                        # no number
        elif r < 0.06:
            seq = rng.randrange(seq + 1)                                    # again: a copy
        records.append((origin, inc, seq, ["t1", "t2", "t3"][(seq // 200) % 3],
                        0 if seq < 1500 else 600_000, rng.randrange(300), rng.randrange(1 << 32),
                        rng.randrange(1 << 32)))
    df = spark.createDataFrame(records, COLUMNS).repartition(4)
    got = by_key(compacted_by(df, in_jvm))
    assert got == by_key(compacted(records))
    assert sum(len(g["starts"]) for g in got.values()) < len(records) / 2    # runs, not records


@pytest.mark.parametrize("order", ["backwards", "shuffled", "interleaved"])
def test_numbers_out_of_order_make_the_same_runs(spark, in_jvm, order):
    """The Java buffer's slow path: numbers below its last run wait in a side list, folded in
    when it grows past the runs (here many times: 30,000 late numbers), on a merge and at the
    end. Every order gives the runs counting record by record gives."""

    rng = random.Random(order)
    numbers = [n for n in range(40_000) if rng.random() > 0.02]       # gaps
    numbers += rng.sample(numbers, 3_000)                              # copies
    if order == "backwards":
        numbers.sort(reverse=True)
    elif order == "shuffled":
        rng.shuffle(numbers)
    else:                            # two senders, one far ahead: the other's are all late
        numbers.sort()
        numbers = numbers[20_000:] + numbers[:20_000]
    records = [("a", "i1", n, "t", 0, 10, n & 0xFFFF, 1) for n in numbers]
    records += [("a", "i1", -1, "t", 0, 3, 5, 1)] * 7                  # none
    df = spark.createDataFrame(records, COLUMNS).coalesce(1)           # one buffer sees all
    got = by_key(compacted_by(df, in_jvm))
    assert got == by_key(compacted(records))
    assert len(got[("a", "i1", "t", 0)]["starts"]) > 100


def test_numbers_at_the_top_of_the_range_make_the_same_runs(spark, in_jvm):
    """2^63 - 1 is the largest number ``docket_seq`` gives: a run ending there is not followed
    by a run of its own (``end + 1`` would wrap), and a copy of it is a copy."""

    top = 2**63 - 1
    numbers = [top, top, 5, top - 1, top - 3, 0, top, 4, top - 2, 9]
    records = [("a", "i1", n, "t", 0, 1, 1, 1) for n in numbers]
    records += [("b", "i1", n, "t", 0, 1, 1, 1) for n in (top, 3, top)]
    df = spark.createDataFrame(records, COLUMNS).repartition(3)
    got = by_key(compacted_by(df, in_jvm))
    assert got == by_key(compacted(records))
    assert got[("a", "i1", "t", 0)]["starts"] == [0, 4, 9, top - 3]
    assert got[("b", "i1", "t", 0)]["ends"] == [3, top]
