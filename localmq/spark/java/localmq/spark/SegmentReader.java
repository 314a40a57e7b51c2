package localmq.spark;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.MappedByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads a {@link SegmentPartition} into columnar batches: walks the records of each range in turn (V1 and V2 records;
 * a blank record ends the segment; a gap record is stepped over, or fails the read with {@code failOnDataLoss};
 * PREPARED and ROLLBACK transactional records are no rows, as a dispatcher never indexes them), keeps the rows the
 * range's filters keep (topics, per-queue offset bounds, store times) and writes only the requested columns, from a
 * read-only mapping of each file. Damage inside a range fails the read, as the Python source's {@code _range_done}.
 */
final class SegmentReader implements PartitionReader<ColumnarBatch> {
    private final SegmentRange[] ranges;
    private final ReadOptions options;
    private final RowWriter out;
    private final CommitLogRecord rec = new CommitLogRecord();
    private byte[][] topics;  // the current range's wanted topics' bytes, or null for every topic
    private TagFilter tags;   // the current range's tag subscription, or null
    private SqlRows sql;      // the current range's SQL92 filter, or null
    private int r = -1;       // the current range
    private SegmentRange part;
    private MappedByteBuffer buf;
    private int pos;
    private boolean rangeDone = true;
    // the last topic decoded for a bounds lookup, as bytes and as text
    private byte[] lastTopic = new byte[0];
    private String lastTopicName = "";

    SegmentReader(SegmentPartition partition, Column[] columns, StructType schema, ReadOptions options) {
        this.ranges = partition.ranges;
        this.options = options;
        this.out = new RowWriter(columns, schema, options.batchSize);
    }

    /** Map the next range; false when there is none. */
    private boolean nextRange() {
        StoreFiles.unmap(buf);
        buf = null;
        if (++r >= ranges.length) {
            return false;
        }
        part = ranges[r];
        buf = StoreFiles.map(part.path, part.size);
        if (buf == null) {
            throw new UncheckedIOException("cannot map commit log segment " + part.path,
                    new IOException(new File(part.path) + ": no such file"));
        }
        Set<String> wanted = part.topics;
        if (wanted == null) {
            topics = null;
        } else {
            topics = new byte[wanted.size()][];
            int i = 0;
            for (String t : wanted) {
                topics[i++] = t.getBytes(StandardCharsets.UTF_8);
            }
        }
        tags = part.tagNames == null ? null : new TagFilter(part.tagNames);
        sql = part.sql == null ? null : new SqlRows(part.sql);
        pos = part.start;
        rangeDone = false;
        return true;
    }

    @Override
    public boolean next() {
        out.reset();
        int rows = 0;
        while (rows < options.batchSize) {
            if (rangeDone && !nextRange()) {
                break;
            }
            int end = Math.min(part.end, buf.limit());
            if (pos >= part.end) {
                rangeDone = true;
                continue;
            }
            CommitLogRecord.Status st = rec.parse(buf, pos, end, options.checkCrc);
            switch (st) {
                case OK:
                    if (rec.dispatched() && keep()) {
                        out.fill(buf, rec, part.base + pos, rows++);
                    }
                    pos += rec.totalSize;
                    break;
                case GAP:
                    if (options.failOnDataLoss) {
                        throw new DataLossException("the commit log holds a gap record at offset " + (part.base + pos)
                                + " where damaged messages were (" + part.path + "; the damaged bytes are in the "
                                + "store's recovery directory); set failOnDataLoss=false to read past it");
                    }
                    pos += rec.totalSize;
                    break;
                case BLANK:
                    rangeDone = true;
                    break;
                case END:
                    if (pos < part.end && part.end <= buf.limit()) {
                        throw new CorruptRecordException("zero bytes at offset " + (part.base + pos) + " of the commit "
                                + "log, inside the range planned to read (" + part.path + ")", part.base + pos, part.path);
                    }
                    rangeDone = true;
                    break;
                default:
                    String what = st == CommitLogRecord.Status.TORN ? "a torn record"
                            : "a corrupt record (" + CommitLogRecord.describe(st) + ")";
                    throw new CorruptRecordException(what + " at offset " + (part.base + pos) + " of the commit log, "
                            + "inside the range planned to read (" + part.path + ")", part.base + pos, part.path);
            }
        }
        out.batch.setNumRows(rows);
        return rows > 0 || r < ranges.length;
    }

    /** Whether the range's row filters keep the record just parsed. */
    private boolean keep() {
        if (topics != null && !topicWanted()) {
            return false;
        }
        if (part.minTs != null && rec.storeTimestamp < part.minTs) {
            return false;
        }
        if (part.maxTs != null && rec.storeTimestamp >= part.maxTs) {
            return false;
        }
        Map<QueueKey, long[]> bounds = part.bounds;
        if (bounds != null && !bounds.isEmpty()) {
            long[] b = bounds.get(new QueueKey(topicName(), rec.queueId));
            if (b != null && (rec.queueOffset < b[0] || (b[1] >= 0 && rec.queueOffset >= b[1]))) {
                return false;
            }
        }
        return (tags == null || tags.matches(buf, rec)) && (sql == null || sql.matches(buf, rec));
    }

    private String topicName() {
        boolean same = lastTopic.length == rec.topicLen;
        for (int i = 0; same && i < rec.topicLen; i++) {
            same = buf.get(rec.topicPos + i) == lastTopic[i];
        }
        if (!same) {
            lastTopic = new byte[rec.topicLen];
            buf.get(rec.topicPos, lastTopic);
            lastTopicName = new String(lastTopic, StandardCharsets.UTF_8);
        }
        return lastTopicName;
    }

    private boolean topicWanted() {
        outer:
        for (byte[] t : topics) {
            if (t.length != rec.topicLen) {
                continue;
            }
            for (int i = 0; i < t.length; i++) {
                if (buf.get(rec.topicPos + i) != t[i]) {
                    continue outer;
                }
            }
            return true;
        }
        return false;
    }

    @Override
    public ColumnarBatch get() {
        return out.batch;
    }

    @Override
    public void close() {
        out.close();
        StoreFiles.unmap(buf);
        buf = null;
    }
}
