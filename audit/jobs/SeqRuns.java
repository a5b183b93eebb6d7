/*
 * A group's record numbers as runs, in the JVM (audit/jobs/jvm.py compiles this file with the
 * others; audit/jobs/PartitionRuns.java keeps one per group of a partition).
 *
 * The numbers added (those >= 0; a negative one is "no number") come out as runs: starts and
 * ends, sorted, disjoint, inclusive, and maximal (two runs never touch), a number given twice
 * in its run once. It is what audit/jobs/spark.py's SQL compaction computes with collect_list,
 * array_sort and two filters, without holding and sorting every number: an agent's numbers
 * arrive mostly one after another, so a buffer is a few runs and a number costs a comparison.
 * Numbers that come out of order wait in a side list that is sorted and folded in when it grows
 * past the runs, or when the runs are read: O(n log n) in the worst order, not O(n^2).
 */
package dev.docket.audit;

import java.util.Arrays;

public final class SeqRuns {

    /** The numbers of one group so far. */
    public static final class Runs {
        private long[] starts = new long[4];
        private long[] ends = new long[4];
        private int size;
        private long[] late = new long[0];     // numbers below the last run, not yet folded in
        private int lateSize;

        // Numbers are >= 0, so x - ends[...] cannot overflow where ends[...] + 1 would (at
        // 2^63 - 1, the largest number docket_seq gives).
        void add(long x) {
            if (size == 0 || x - ends[size - 1] > 1) {
                append(x, x);
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
            }                                   // else: within the last run, a copy
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

        /** The runs' starts, then ends (the late numbers folded in first). */
        public long[] getStarts() { fold(); return Arrays.copyOf(starts, size); }
        public long[] getEnds() { fold(); return Arrays.copyOf(ends, size); }
    }
}
