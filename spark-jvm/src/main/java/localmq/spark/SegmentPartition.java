package localmq.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * The records of one commit log segment file whose starts lie in [start, end), read by one task: to the blank record
 * that ends the segment, or to zero bytes (the end of the written data in the last one), or to {@code end}. Both
 * ends are record boundaries (0, a ConsumeQueue unit's offset, the segment's size). Executors open the file by path.
 */
final class SegmentPartition implements InputPartition {
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

    SegmentPartition(String path, long base, int size, int start, int end) {
        this.path = path;
        this.base = base;
        this.size = size;
        this.start = start;
        this.end = end;
    }

    @Override
    public String toString() {
        return "SegmentPartition(" + path + " [" + start + ", " + end + "))";
    }
}
