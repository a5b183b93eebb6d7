/*
 * A record's docket-seq header as a number, in the JVM (audit/jobs/jvm.py compiles this file
 * with the jobs' other Java and registers it as the SQL function docket_seq).
 *
 * docket_seq(value) is the 8 bytes read as a big-endian number; null (no number) where the
 * value is null, not 8 bytes long, or 2^63 or more (not a number docket gives). Spark SQL
 * cannot cast bytes to a long, so without it the job goes through text:
 * try_cast(conv(hex(value), 16, 10) as bigint), which makes two strings a record.
 */
package dev.docket.audit;

import org.apache.spark.sql.api.java.UDF1;

public final class SeqNumber implements UDF1<byte[], Long> {

    @Override
    public Long call(byte[] value) {
        if (value == null || value.length != 8 || value[0] < 0) {
            return null;
        }
        long n = 0;
        for (byte b : value) {
            n = (n << 8) | (b & 0xFF);
        }
        return n;
    }
}
