/*
 * The count job's record numbers as runs, aggregated in the JVM (audit/jobs/jvm.py compiles
 * this file against the venv's PySpark jars and registers it as the SQL function
 * docket_seq_runs; audit/jobs/PartitionRuns.java keeps a Runs buffer per group of a partition).
 *
 * docket_seq_runs(seq) over a group gives the group's record numbers (those >= 0; a negative
 * one is "no number") as runs: starts and ends, sorted, disjoint, inclusive, and maximal (two
 * runs never touch), a number given twice in its run once. It is what audit/jobs/spark.py's
 * SQL compaction computes with collect_list, array_sort and two filters, without holding,
 * sorting and shuffling every number: an agent's numbers arrive mostly one after another, so a
 * group's buffer is a few runs and a number costs a comparison. Numbers that come out of order
 * wait in a side list that is sorted and folded in when it grows past the runs, or when the
 * buffer is merged or finished: O(n log n) in the worst order, not O(n^2).
 */
package dev.docket.audit;

import java.io.Serializable;
import java.util.Arrays;

import org.apache.spark.sql.Encoder;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.expressions.Aggregator;

public final class SeqRuns extends Aggregator<Long, SeqRuns.Runs, SeqRuns.Result> {

    /** The numbers of one group so far. A bean: Spark encodes it between the partial and the
     *  final aggregation (a Kryo encoder is not serializable in Spark 4.0's aggregators). The
     *  setters only assign: the order Spark calls them in does not matter. */
    public static final class Runs implements Serializable {
        private long[] starts = new long[4];
        private long[] ends = new long[4];
        private int size;
        private long[] late = new long[0];     // numbers below the last run, not yet folded in
        private int lateSize;

        // Numbers are >= 0, so x - ends[...] cannot overflow where ends[...] + 1 would (at
        // 2^63 - 1, the largest number docket_seq gives).
        /** Add a number; true where it made the buffer longer (a new run, or a number waiting
         *  in the side list): what PartitionRuns bounds. */
        boolean add(long x) {
            if (size == 0 || x - ends[size - 1] > 1) {
                append(x, x);
                return true;
            } else if (x - ends[size - 1] == 1) {
                ends[size - 1] = x;
            } else if (x < starts[size - 1]) {
                if (lateSize == late.length) {
                    late = Arrays.copyOf(late, Math.max(16, lateSize * 2));
                }
                late[lateSize++] = x;
                if (lateSize >= 4096 + size) {
                    fold();
                }
                return true;
            }                                   // else: within the last run, a copy
            return false;
        }

        private void append(long start, long end) {
            if (size == starts.length) {       // a decoded buffer's arrays have no spare room
                starts = Arrays.copyOf(starts, Math.max(4, size * 2));
                ends = Arrays.copyOf(ends, Math.max(4, size * 2));
            }
            starts[size] = start;
            ends[size] = end;
            size++;
        }

        /** Add a run that starts at or after the last one's start, joining the two where they
         *  touch or overlap. */
        private void put(long start, long end) {
            if (size > 0 && start - ends[size - 1] <= 1) {
                ends[size - 1] = Math.max(ends[size - 1], end);
            } else {
                append(start, end);
            }
        }

        /** The late numbers folded into the runs. */
        void fold() {
            if (lateSize == 0) {
                return;
            }
            long[] numbers = Arrays.copyOf(late, lateSize);
            Arrays.sort(numbers);
            late = new long[0];
            lateSize = 0;
            Runs runs = new Runs();
            for (long x : numbers) {
                runs.put(x, x);
            }
            take(merged(this, runs));
        }

        private void take(Runs other) {
            starts = other.starts;
            ends = other.ends;
            size = other.size;
        }

        static Runs merged(Runs a, Runs b) {
            a.fold();
            b.fold();
            Runs out = new Runs();
            int i = 0;
            int j = 0;
            while (i < a.size || j < b.size) {
                if (j == b.size || (i < a.size && a.starts[i] <= b.starts[j])) {
                    out.put(a.starts[i], a.ends[i]);
                    i++;
                } else {
                    out.put(b.starts[j], b.ends[j]);
                    j++;
                }
            }
            return out;
        }

        // The bean's properties, read when Spark encodes a partial buffer for the shuffle: the
        // first one read folds the late numbers in, so only runs cross it, without spare room.
        public long[] getStarts() { fold(); return Arrays.copyOf(starts, size); }
        public void setStarts(long[] v) { starts = v; }
        public long[] getEnds() { fold(); return Arrays.copyOf(ends, size); }
        public void setEnds(long[] v) { ends = v; }
        public int getSize() { fold(); return size; }
        public void setSize(int v) { size = v; }
        public long[] getLate() { fold(); return new long[0]; }
        public void setLate(long[] v) { late = v; }
        public int getLateSize() { fold(); return 0; }
        public void setLateSize(int v) { lateSize = v; }
    }

    /** What the function gives: a struct of the two arrays. */
    public static final class Result implements Serializable {
        private long[] starts;
        private long[] ends;

        public long[] getStarts() { return starts; }
        public void setStarts(long[] v) { starts = v; }
        public long[] getEnds() { return ends; }
        public void setEnds(long[] v) { ends = v; }
    }

    @Override
    public Runs zero() {
        return new Runs();
    }

    @Override
    public Runs reduce(Runs runs, Long seq) {
        if (seq != null && seq >= 0) {
            runs.add(seq);
        }
        return runs;
    }

    @Override
    public Runs merge(Runs a, Runs b) {
        return Runs.merged(a, b);
    }

    @Override
    public Result finish(Runs runs) {
        runs.fold();
        Result result = new Result();
        result.setStarts(Arrays.copyOf(runs.starts, runs.size));
        result.setEnds(Arrays.copyOf(runs.ends, runs.size));
        return result;
    }

    @Override
    public Encoder<Runs> bufferEncoder() {
        return Encoders.bean(Runs.class);
    }

    @Override
    public Encoder<Result> outputEncoder() {
        return Encoders.bean(Result.class);
    }
}
