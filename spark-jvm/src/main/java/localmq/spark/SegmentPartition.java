package localmq.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One commit log segment file read whole by one task: every record from position 0 to the blank record that ends
 * the segment, or to zero bytes (the end of the written data in the last one). Executors open the file by path.
 */
final class SegmentPartition implements InputPartition {
    private static final long serialVersionUID = 1L;

    final String path;
    /** Absolute commit log offset of the segment's first byte (its 20-digit name). */
    final long base;
    /** Bytes of the segment file read. */
    final int size;

    SegmentPartition(String path, long base, int size) {
        this.path = path;
        this.base = base;
        this.size = size;
    }

    @Override
    public String toString() {
        return "SegmentPartition(" + path + ")";
    }
}
