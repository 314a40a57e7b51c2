package localmq.spark;

import java.util.Arrays;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * One task's share of the commit log: one {@link SegmentRange}, or the end of a segment and the start of the next
 * (or more), read in order (the Python source's SegmentRange / SegmentRanges). Executors open the files by path.
 */
final class SegmentPartition implements InputPartition {
    private static final long serialVersionUID = 2L;

    final SegmentRange[] ranges;

    SegmentPartition(SegmentRange... ranges) {
        this.ranges = ranges;
    }

    @Override
    public String toString() {
        return "SegmentPartition" + Arrays.toString(ranges);
    }
}
