package localmq.spark;

import java.io.IOException;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.Set;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.storage.StorageUtils;

/**
 * Reads one commit log segment into columnar batches: walks its records from position 0 (V1 and V2 records; a
 * blank record or zero bytes end the data; a gap record is stepped over by its length, or fails the read with
 * {@code failOnDataLoss}; PREPARED and ROLLBACK transactional records are no rows, as a dispatcher never indexes
 * them) and writes only the requested columns into the vectors, from a read-only mapping of the file.
 */
final class SegmentReader implements PartitionReader<ColumnarBatch> {
    private static final byte[] HEX = "0123456789ABCDEF".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] KEYS = "KEYS".getBytes(StandardCharsets.UTF_8);
    private static final byte[] TAGS = "TAGS".getBytes(StandardCharsets.UTF_8);

    private final SegmentPartition part;
    private final Column[] columns;
    private final ReadOptions options;
    private final byte[][] topics;  // the wanted topics' bytes, or null for every topic
    private final MappedByteBuffer buf;
    private final WritableColumnVector[] vectors;
    private final ColumnarBatch batch;
    private final CommitLogRecord rec = new CommitLogRecord();
    private final Properties props = new Properties();
    private byte[] scratch = new byte[4096];
    private final byte[] msgId = new byte[56];
    private int pos;
    private boolean done;

    SegmentReader(SegmentPartition part, Column[] columns, StructType schema, ReadOptions options) throws IOException {
        this.part = part;
        this.columns = columns;
        this.options = options;
        Set<String> wanted = options.topics;
        if (wanted == null) {
            topics = null;
        } else {
            topics = new byte[wanted.size()][];
            int i = 0;
            for (String t : wanted) {
                topics[i++] = t.getBytes(StandardCharsets.UTF_8);
            }
        }
        try (FileChannel ch = FileChannel.open(Paths.get(part.path), StandardOpenOption.READ)) {
            // the mapping outlives the channel; a segment shorter than planned is damage, reported by the walk
            buf = ch.map(FileChannel.MapMode.READ_ONLY, 0, Math.min(ch.size(), part.size));
        }
        vectors = OnHeapColumnVector.allocateColumns(options.batchSize, schema);
        pos = part.start;
        batch = new ColumnarBatch(vectors);
    }

    @Override
    public boolean next() {
        if (done) {
            return false;
        }
        for (WritableColumnVector v : vectors) {
            v.reset();
        }
        int rows = 0;
        int limit = buf.limit();
        int end = Math.min(part.end, limit);
        while (rows < options.batchSize && !done) {
            CommitLogRecord.Status st = rec.parse(buf, pos, limit, options.checkCrc);
            if (pos == part.start && part.start > 0 && st != CommitLogRecord.Status.OK) {
                throw new CorruptRecordException("no record at offset " + (part.base + pos) + " of the commit log ("
                        + part.path + "), where a ConsumeQueue unit cut the read: " + st, part.base + pos, part.path);
            }
            switch (st) {
                case OK:
                    if (rec.dispatched() && topicWanted()) {
                        fill(rows++);
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
                case END:
                    done = true;
                    break;
                default:
                    throw new CorruptRecordException("a " + st.name().toLowerCase(java.util.Locale.ROOT).replace('_', ' ')
                            + " record at offset " + (part.base + pos) + " of the commit log (" + part.path + ")",
                            part.base + pos, part.path);
            }
            if (pos >= end) {
                done = true;
                if (pos > end && end < limit) {
                    // the next share starts at ``end``: a walk that steps over it would read records twice
                    throw new CorruptRecordException("a record runs over offset " + (part.base + end) + " of the commit "
                            + "log (" + part.path + "), where a ConsumeQueue unit says a record starts",
                            part.base + end, part.path);
                }
            }
        }
        batch.setNumRows(rows);
        return rows > 0 || !done;
    }

    private boolean topicWanted() {
        if (topics == null) {
            return true;
        }
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

    private byte[] bytes(int at, int len) {
        if (scratch.length < len) {
            scratch = new byte[Math.max(len, scratch.length * 2)];
        }
        buf.get(at, scratch, 0, len);
        return scratch;
    }

    private void fill(int row) {
        boolean parsed = false;
        for (int c = 0; c < columns.length; c++) {
            WritableColumnVector v = vectors[c];
            switch (columns[c]) {
                case VALUE:
                    v.putByteArray(row, bytes(rec.bodyPos, rec.bodyLen), 0, rec.bodyLen);
                    break;
                case TOPIC:
                    v.putByteArray(row, bytes(rec.topicPos, rec.topicLen), 0, rec.topicLen);
                    break;
                case PARTITION:
                    v.putInt(row, rec.queueId);
                    break;
                case OFFSET:
                    v.putLong(row, rec.queueOffset);
                    break;
                case TIMESTAMP:
                    v.putLong(row, rec.storeTimestamp * 1000);
                    break;
                case TIMESTAMP_TYPE:
                    v.putInt(row, Column.TIMESTAMP_TYPE_LOG_APPEND);
                    break;
                case PHYSICAL_OFFSET:
                    v.putLong(row, part.base + pos);
                    break;
                case BORN_TIMESTAMP:
                    v.putLong(row, rec.bornTimestamp * 1000);
                    break;
                case RECONSUME_TIMES:
                    v.putInt(row, rec.reconsumeTimes);
                    break;
                case SYS_FLAG:
                    v.putInt(row, rec.sysFlag);
                    break;
                case MSG_ID:
                    v.putByteArray(row, msgId, 0, msgId(part.base + pos));
                    break;
                case KEY:
                case TAGS:
                case KEYS:
                case PROPERTIES:
                    if (!parsed) {
                        props.parse(buf, rec.propsPos, rec.propsLen);
                        parsed = true;
                    }
                    fillProperty(columns[c], v, row);
                    break;
                default:
                    throw new IllegalStateException("no decoder for column " + columns[c]);
            }
        }
    }

    private void fillProperty(Column column, WritableColumnVector v, int row) {
        switch (column) {
            case KEY:
            case TAGS: {
                int i = props.find(column == Column.KEY ? KEYS : TAGS);
                if (i < 0) {
                    v.putNull(row);
                } else {
                    v.putByteArray(row, bytes(props.valuePos(i), props.valueLen(i)), 0, props.valueLen(i));
                }
                break;
            }
            case KEYS: {
                // the KEYS value split on spaces, empty keys dropped; no KEYS: an empty list
                WritableColumnVector child = v.arrayData();
                int first = child.getElementsAppended();
                int i = props.find(KEYS);
                if (i >= 0) {
                    int p = props.valuePos(i);
                    int stop = p + props.valueLen(i);
                    while (p < stop) {
                        while (p < stop && buf.get(p) == ' ') {
                            p++;
                        }
                        int s = p;
                        while (p < stop && buf.get(p) != ' ') {
                            p++;
                        }
                        if (p > s) {
                            child.appendByteArray(bytes(s, p - s), 0, p - s);
                        }
                    }
                }
                v.putArray(row, first, child.getElementsAppended() - first);
                break;
            }
            case PROPERTIES: {
                WritableColumnVector keys = v.getChild(0);
                WritableColumnVector values = v.getChild(1);
                int first = keys.getElementsAppended();
                for (int i = 0; i < props.count(); i++) {
                    keys.appendByteArray(bytes(props.keyPos(i), props.keyLen(i)), 0, props.keyLen(i));
                    values.appendByteArray(bytes(props.valuePos(i), props.valueLen(i)), 0, props.valueLen(i));
                }
                v.putArray(row, first, props.count());
                break;
            }
            default:
                throw new IllegalStateException("not a property column: " + column);
        }
    }

    /** The offset message id (spec 1.8: store host address and port, then the physical offset; uppercase hex). */
    private int msgId(long phys) {
        int n = 0;
        for (int i = 0; i < rec.storeHostLen; i++) {
            int b = buf.get(rec.storeHostPos + i) & 0xFF;
            msgId[n++] = HEX[b >>> 4];
            msgId[n++] = HEX[b & 15];
        }
        for (int shift = 56; shift >= 0; shift -= 8) {
            int b = (int) (phys >>> shift) & 0xFF;
            msgId[n++] = HEX[b >>> 4];
            msgId[n++] = HEX[b & 15];
        }
        return n;
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() {
        batch.close();
        StorageUtils.dispose(buf);  // unmap now rather than at a later GC: the batch holds copies, no view
    }
}
