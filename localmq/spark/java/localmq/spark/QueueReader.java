package localmq.spark;

import java.io.File;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.util.logging.Logger;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * Reads a {@link QueuePartition} into columnar batches, as the Python source's {@code _read_queue}: the queue's units
 * [start, end), each unit's record read at its commit log offset and checked against it (its size, queue id and
 * queue offset). Units whose ConsumeQueue file or commit log segment is gone, or whose record recovery replaced by a
 * gap record, are lost: an error with {@code failOnDataLoss}, else skipped.
 */
final class QueueReader implements PartitionReader<ColumnarBatch> {
    private static final Logger LOG = Logger.getLogger("localmq.spark");
    private static final int CHUNK = 65536;

    private final QueuePartition part;
    private final ReadOptions options;
    private final RowWriter out;
    private final ConsumeQueueFiles cq;
    private final CommitLogRecord rec = new CommitLogRecord();
    private long next;           // the next queue offset whose units are loaded
    private ByteBuffer units;    // loaded units [unitsFirst, unitsFirst + units.limit() / 20)
    private long unitsFirst;
    private int u;               // the next unit of ``units``
    private long segBase = -1;   // the mapped segment
    private MappedByteBuffer buf;
    private final TagFilter tags;  // the tag subscription, or null
    private final SqlRows sql;     // the SQL92 filter, or null

    QueueReader(QueuePartition part, Column[] columns, StructType schema, ReadOptions options) {
        this.part = part;
        this.options = options;
        this.out = new RowWriter(columns, schema, options.batchSize);
        this.cq = new ConsumeQueueFiles(part.topic, part.queueId, new File(part.cqPath));
        this.next = part.start;
        this.tags = part.tagNames == null ? null : new TagFilter(part.tagNames);
        this.sql = part.sql == null ? null : new SqlRows(part.sql);
    }

    /** Load the next run of units; false at the end of the partition. */
    private boolean load() {
        while (next < part.end) {
            long stop = cq.runEnd(next, Math.min(part.end, next + CHUNK));
            ByteBuffer b = cq.units(next, stop);
            if (b == null) {
                lost(next, stop, "its ConsumeQueue file is gone");
                next = stop;
                continue;
            }
            boolean valid = b.limit() / ConsumeQueueFiles.UNIT_SIZE >= stop - next;
            for (int i = 0; valid && i < stop - next; i++) {
                int size = b.getInt(i * ConsumeQueueFiles.UNIT_SIZE + 8);
                valid = size > 0 && size != ConsumeQueueFiles.BLANK_UNIT_SIZE;
            }
            if (!valid) {
                throw new IllegalStateException("consume queue " + part.cqPath + ": units " + next + ".." + stop
                        + " planned to be read are missing or invalid");
            }
            units = b;
            unitsFirst = next;
            u = 0;
            next = stop;
            return true;
        }
        return false;
    }

    private void lost(long first, long stop, String why) {
        String msg = part.topic + " queue " + part.queueId + ": offsets " + first + ".." + stop + " are gone (" + why + ")";
        if (options.failOnDataLoss) {
            throw new DataLossException(msg + "; set failOnDataLoss=false to skip them");
        }
        LOG.warning(msg + "; skipping them");
    }

    @Override
    public boolean next() {
        out.reset();
        int rows = 0;
        while (rows < options.batchSize) {
            if ((units == null || u >= units.limit() / ConsumeQueueFiles.UNIT_SIZE) && !load()) {
                break;
            }
            int at = u * ConsumeQueueFiles.UNIT_SIZE;
            long qoff = unitsFirst + u;
            long phys = units.getLong(at);
            int size = units.getInt(at + 8);
            if (tags != null && !tags.unitMayMatch(units.getLong(at + 12))) {
                u++;  // dropped by its tags code before its record is read, as a broker does
                continue;
            }
            long base = Math.floorDiv(phys, part.segmentSize) * part.segmentSize;
            if (base != segBase) {
                StoreFiles.unmap(buf);
                segBase = base;
                buf = StoreFiles.map(new File(part.commitlog, String.format("%020d", base)).getPath(),
                        (int) part.segmentSize);
            }
            if (buf == null) {
                // the run of units in the gone segment
                int n = units.limit() / ConsumeQueueFiles.UNIT_SIZE;
                int k = u;
                while (k < n && Math.floorDiv(units.getLong(k * ConsumeQueueFiles.UNIT_SIZE), part.segmentSize)
                        * part.segmentSize == base) {
                    k++;
                }
                lost(qoff, unitsFirst + k, "commit log segment " + new File(part.commitlog, String.format("%020d", base))
                        + " is gone");
                u = k;
                continue;
            }
            int pos = (int) (phys - base);
            CommitLogRecord.Status st = pos < buf.limit() ? rec.parse(buf, pos, buf.limit(), options.checkCrc)
                    : CommitLogRecord.Status.TORN;
            if (st == CommitLogRecord.Status.GAP && rec.totalSize == size) {
                lost(qoff, qoff + 1, "the message was lost to damage in the commit log: a gap record stands at offset "
                        + phys);
                u++;
                continue;
            }
            if (st != CommitLogRecord.Status.OK || rec.totalSize != size) {
                String reason = st == CommitLogRecord.Status.OK ? "a record of " + rec.totalSize + " bytes"
                        : CommitLogRecord.describe(st);
                throw new CorruptRecordException("consume queue " + part.cqPath + " unit " + qoff + " points at offset "
                        + phys + ", where there is no record of its size (" + reason + ")", phys,
                        new File(part.commitlog, String.format("%020d", base)).getPath());
            }
            if (rec.queueOffset != qoff || rec.queueId != part.queueId) {
                throw new IllegalStateException("consume queue " + part.cqPath + ": units " + qoff + ".." + qoff
                        + " point at records of another queue or offset");
            }
            if ((tags == null || tags.matches(buf, rec)) && (sql == null || sql.matches(buf, rec))) {
                out.fill(buf, rec, phys, rows++);
            }
            u++;
        }
        out.batch.setNumRows(rows);
        return rows > 0;
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
