package localmq.spark;

import java.io.Serializable;
import java.util.Map;
import java.util.Set;

/**
 * Records whose start lies in [start, end) of one commit log segment (a record boundary both ends), as the Python
 * source's {@code SegmentRange}: walked to the blank record that ends the segment, to zero bytes, or to {@code end}.
 * Row filters: {@code topics} kept (null: all); {@code bounds}, per (topic, queue id), the queue offsets [first, end)
 * rows must fall in (an end < 0: no end; a queue not named: no bound; null: no per-queue bound); store times
 * [minTs, maxTs) in ms (null: none), for stores read without ConsumeQueues; tags (a subscription's).
 */
final class SegmentRange implements Serializable {
    private static final long serialVersionUID = 1L;

    final String path;
    /** Absolute commit log offset of the segment's first byte (its 20-digit name). */
    final long base;
    /** Bytes of the segment file. */
    final int size;
    /** Position of the first record read. */
    final int start;
    /** Position where the walk stops (exclusive). */
    final int end;
    final Set<String> topics;
    final Map<QueueKey, long[]> bounds;
    final Long minTs;
    final Long maxTs;
    /** Rows whose TAGS is one of these (null: every row). */
    final Set<String> tagNames;
    /** Rows whose properties match this SQL92 expression (null: every row). */
    final String sql;

    SegmentRange(String path, long base, int size, int start, int end, Set<String> topics, Map<QueueKey, long[]> bounds,
                 Long minTs, Long maxTs, Set<String> tagNames, String sql) {
        this.path = path;
        this.base = base;
        this.size = size;
        this.start = start;
        this.end = end;
        this.topics = topics;
        this.bounds = bounds;
        this.minTs = minTs;
        this.maxTs = maxTs;
        this.tagNames = tagNames;
        this.sql = sql;
    }

    @Override
    public String toString() {
        return "SegmentRange(" + path + " [" + start + ", " + end + "))";
    }
}
