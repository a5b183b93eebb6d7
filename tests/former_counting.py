"""The count job's counting as it was before 2026-12-05, to make a checkpoint of it: per origin a
stateful step (``applyInPandasWithState``) keeping the tallies in Spark's state as two JSON
strings — ``windows`` ("topic\\x00window_start" → [count, bytes, lo, hi, duplicates,
unnumbered]) and ``spaces`` (origin incarnation → base64 intervals) — over the job's own Kafka
source, in the checkpoint folder the job uses (``DIR/count``). The count job of today must take
such a checkpoint over (``audit.jobs.tally.ensure_tallies``).

    python tests/former_counting.py BOOTSTRAP TOPICS_REGEX AUDIT_TOPIC CHECKPOINT_DIR BATCH

Reads what the topics hold now (``availableNow``) and writes nothing to the audit topic.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from audit.jobs.intervals import add_numbered, spaces_from_json, spaces_to_json  # noqa: E402
from audit.jobs.spark import (  # noqa: E402
    JobOptions,
    count_rows,
    data_records,
    kafka_stream,
    spark_session,
    with_origin,
)


def former_step(key, frames, state):
    """One origin's batch added to its state, as the former job's worker step did."""
    import numpy as np
    import pandas as pd

    windows, spaces = (json.loads(state.get[0]), spaces_from_json(state.get[1])) \
        if state.exists else ({}, {})
    batch = pd.concat([f for f in frames if len(f)] or [pd.DataFrame(
        {c: [] for c in ("incarnation", "seq", "topic", "window_start", "len", "lo", "hi")})],
        ignore_index=True)
    seq = batch["seq"].to_numpy(np.int64)
    dup, _ = add_numbered(spaces, batch["incarnation"].to_numpy(object), seq)
    batch = batch.assign(dup=dup, unnumbered=seq < 0)
    for (topic, window), g in batch.groupby(["topic", "window_start"]):
        t = windows.setdefault(f"{topic}\x00{int(window)}", [0] * 6)
        for i, v in enumerate((len(g), g["len"].sum(), g["lo"].sum(), g["hi"].sum(),
                               g["dup"].sum(), g["unnumbered"].sum())):
            t[i] += int(v)
    state.update((json.dumps(windows), spaces_to_json(spaces)))
    yield pd.DataFrame({"origin": [key[0]]})


def main(argv: list[str]) -> None:
    from pyspark.sql.streaming.state import GroupStateTimeout

    bootstrap, topics, audit_topic, checkpoint, batch = argv
    opts = JobOptions(bootstrap_servers=bootstrap, topics=topics, audit_topic=audit_topic,
                      once=True, max_offsets_per_trigger=int(batch),
                      checkpoint_dir=Path(checkpoint))
    spark = spark_session("docket-former-counting", opts)
    rows = count_rows(with_origin(data_records(kafka_stream(spark, opts), audit_topic)),
                      opts.window_ms)
    query = (rows.groupBy("origin").applyInPandasWithState(
                former_step, "origin STRING", "windows STRING, spaces STRING", "update",
                GroupStateTimeout.NoTimeout)
             .writeStream.outputMode("update").foreachBatch(lambda df, _id: df.count())
             .option("checkpointLocation", str(Path(checkpoint) / "count"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
