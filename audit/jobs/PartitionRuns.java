/*
 * The count job's compaction of a micro-batch done within each partition, without a shuffle
 * (audit/jobs/jvm.py compiles this file with the others; audit/jobs/spark.py's compacted calls
 * PartitionRuns.compact through py4j).
 *
 * compact(rows, maxRuns, ratio) takes count_rows's columns (origin, incarnation, seq, topic,
 * window_start, len, lo, hi) and gives, for each partition of the batch (a Kafka partition's records), a row per
 * (origin, incarnation, topic, window_start) it holds: n, bytes, lo, hi, unnumbered and the
 * record numbers as runs (starts, ends: sorted, disjoint, inclusive, a number given twice in
 * its run once), as SeqRuns makes them. A group read from several partitions is several rows;
 * the driver adds them up (audit/jobs/tally.py: a number in two of them is held for the
 * second, a copy), so the batch needs one stage where the SQL aggregation needed two and the
 * shuffle between them: on a standalone cluster that shuffle and its second stage cost a
 * batch of 500,000 records more than the rest of the counting (docs/performance.md).
 *
 * That holds where a partition's numbers come in runs: an agent sends a slot's records to one
 * partition at a time. Records with a key of their own are spread over the partitions one by
 * one, and each partition's numbers are then nearly as many runs as records, which only the
 * shuffle would join again before they reach the driver; and a partition holding a little of
 * many groups (a fleet's hosts, each a few records) gives a row for each, in every partition,
 * where the shuffle gives one a group. So a partition whose groups and runs pass maxRuns, or
 * pass MIN_HELD and one for every ratio (RATIO) records read, stops and gives one row alone,
 * n = -1: the batch is then compacted by the aggregation (docket_seq_runs) instead, and the
 * driver's rows stay at most one for every RATIO records either way.
 */
package dev.docket.audit;

import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Objects;

import org.apache.spark.api.java.function.MapPartitionsFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;

public final class PartitionRuns {

    /** The rows compact gives: what audit/jobs/spark.py's SQL compaction gives, per partition. */
    public static final StructType SCHEMA = new StructType()
            .add("origin", DataTypes.StringType, true)
            .add("incarnation", DataTypes.StringType, true)
            .add("topic", DataTypes.StringType, true)
            .add("window_start", DataTypes.LongType, true)
            .add("n", DataTypes.LongType, false)
            .add("bytes", DataTypes.LongType, false)
            .add("lo", DataTypes.LongType, false)
            .add("hi", DataTypes.LongType, false)
            .add("unnumbered", DataTypes.LongType, false)
            .add("starts", DataTypes.createArrayType(DataTypes.LongType, false), false)
            .add("ends", DataTypes.createArrayType(DataTypes.LongType, false), false);

    private static final String[] COLUMNS =
            {"origin", "incarnation", "seq", "topic", "window_start", "len", "lo", "hi"};

    /** Groups and runs a partition may give (about 1 MiB of them) before it gives up. */
    public static final int MAX_RUNS = 1 << 16;
    /** A partition's groups and runs are checked against its records past this many. */
    public static final int MIN_HELD = 4096;
    /** Records a partition must have read for each of its groups and runs. */
    public static final int RATIO = 64;

    /** ratio 0: no check against the records read (tests of the rows themselves). */
    public static Dataset<Row> compact(Dataset<Row> rows, int maxRuns, int ratio) {
        StructType in = rows.schema();
        int[] at = new int[COLUMNS.length];
        for (int i = 0; i < COLUMNS.length; i++) {
            at[i] = in.fieldIndex(COLUMNS[i]);
        }
        return rows.mapPartitions(new Fold(at, maxRuns, ratio), Encoders.row(SCHEMA));
    }

    /** One group's key. */
    private record Key(String origin, String incarnation, String topic, Long window) {

        /** Whether a record of these fields belongs to this key's group. */
        boolean holds(String origin, String incarnation, String topic, Long window) {
            return Objects.equals(this.window, window) && Objects.equals(this.origin, origin)
                    && Objects.equals(this.topic, topic)
                    && Objects.equals(this.incarnation, incarnation);
        }
    }

    /** One group's figures so far. A null sum term (none in count_rows's rows) adds nothing,
     *  as SQL's sum leaves it out. */
    private static final class Group {
        long n;
        long bytes;
        long lo;
        long hi;
        long unnumbered;
        final SeqRuns.Runs runs = new SeqRuns.Runs();
    }

    private static final class Fold implements MapPartitionsFunction<Row, Row> {
        private final int[] at;
        private final int maxRuns;
        private final int ratio;

        Fold(int[] at, int maxRuns, int ratio) {
            this.at = at;
            this.maxRuns = maxRuns;
            this.ratio = ratio;
        }

        private static long orZero(Row r, int i) {
            return r.isNullAt(i) ? 0L : r.getLong(i);
        }

        @Override
        public Iterator<Row> call(Iterator<Row> input) {
            Map<Key, Group> groups = new HashMap<>();
            Key last = null;
            Group group = null;
            long held = 0;                      // groups and runs (an upper bound: see add)
            long records = 0;
            while (input.hasNext()) {
                Row r = input.next();
                String origin = r.getString(at[0]);
                String incarnation = r.getString(at[1]);
                String topic = r.getString(at[3]);
                Long window = r.isNullAt(at[4]) ? null : r.getLong(at[4]);
                // a partition's records come in runs of a key: a key is made only where one ends
                if (last == null || !last.holds(origin, incarnation, topic, window)) {
                    last = new Key(origin, incarnation, topic, window);
                    group = groups.get(last);
                    if (group == null) {
                        group = new Group();
                        groups.put(last, group);
                        held++;
                    }
                }
                group.n++;
                group.bytes += orZero(r, at[5]);
                group.lo += orZero(r, at[6]);
                group.hi += orZero(r, at[7]);
                long seq = r.isNullAt(at[2]) ? -1L : r.getLong(at[2]);
                if (seq >= 0) {
                    if (group.runs.add(seq)) {
                        held++;
                    }
                } else {
                    group.unnumbered++;
                }
                records++;
                if (held > maxRuns || (held > MIN_HELD && held * ratio > records)) {
                    // no runs here, or too little of each group: the aggregation's turn
                    return Collections.singletonList(RowFactory.create(null, null, null, null,
                            -1L, 0L, 0L, 0L, 0L, new long[0], new long[0])).iterator();
                }
            }
            List<Row> out = new ArrayList<>(groups.size());
            for (Map.Entry<Key, Group> e : groups.entrySet()) {
                Key k = e.getKey();
                Group g = e.getValue();
                out.add(RowFactory.create(k.origin(), k.incarnation(), k.topic(), k.window(), g.n,
                        g.bytes, g.lo, g.hi, g.unnumbered, g.runs.getStarts(),
                        g.runs.getEnds()));
            }
            return out.iterator();
        }
    }
}
