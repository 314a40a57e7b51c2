package localmq.spark;

import java.lang.invoke.MethodHandle;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.MethodType;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;

import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The columnar batch a task fills: writes only the requested columns of parsed records into Spark's column vectors
 * (copies; no view of a mapping outlives a batch). Shared by the segment and the queue readers.
 */
final class RowWriter implements AutoCloseable {
    private static final byte[] HEX = "0123456789ABCDEF".getBytes(StandardCharsets.US_ASCII);
    private static final byte[] KEYS = "KEYS".getBytes(StandardCharsets.UTF_8);
    private static final byte[] TAGS = "TAGS".getBytes(StandardCharsets.UTF_8);
    /**
     * {@code WritableColumnVector.putByteArray(int, ByteBuffer, int, int)}: one copy from the mapping into the vector
     * (a bulk get). Newer Spark versions have it, older ones do not: looked up once, and without it a value goes
     * through the scratch array (two copies). A static final handle, so the JIT inlines the call.
     */
    private static final MethodHandle PUT_FROM_BUFFER = findPutFromBuffer();

    private final Column[] columns;
    private final WritableColumnVector[] vectors;
    final ColumnarBatch batch;
    private final Properties props = new Properties();
    private byte[] scratch = new byte[4096];
    private final byte[] msgId = new byte[56];
    private ByteBuffer buf;

    RowWriter(Column[] columns, StructType schema, int capacity) {
        this.columns = columns;
        vectors = OnHeapColumnVector.allocateColumns(capacity, schema);
        batch = new ColumnarBatch(vectors);
    }

    /** Empty the vectors for the next batch. */
    void reset() {
        for (WritableColumnVector v : vectors) {
            v.reset();
        }
    }

    private static MethodHandle findPutFromBuffer() {
        try {
            return MethodHandles.publicLookup().findVirtual(WritableColumnVector.class, "putByteArray",
                    MethodType.methodType(int.class, int.class, ByteBuffer.class, int.class, int.class));
        } catch (NoSuchMethodException | IllegalAccessException e) {
            return null;
        }
    }

    /** Row {@code row} of {@code v} := the bytes [at, at + len) of the record's buffer. */
    private void putBytes(WritableColumnVector v, int row, int at, int len) {
        if (PUT_FROM_BUFFER != null) {
            try {
                int ignored = (int) PUT_FROM_BUFFER.invokeExact(v, row, buf, at, len);
            } catch (RuntimeException | Error e) {
                throw e;
            } catch (Throwable e) {
                throw new IllegalStateException(e);
            }
        } else {
            v.putByteArray(row, bytes(at, len), 0, len);
        }
    }

    private byte[] bytes(int at, int len) {
        if (scratch.length < len) {
            scratch = new byte[Math.max(len, scratch.length * 2)];
        }
        buf.get(at, scratch, 0, len);
        return scratch;
    }

    /** Write the requested columns of {@code rec} (parsed from {@code buf}, at commit log offset {@code phys}) to row {@code row}. */
    void fill(ByteBuffer buf, CommitLogRecord rec, long phys, int row) {
        this.buf = buf;
        boolean parsed = false;
        for (int c = 0; c < columns.length; c++) {
            WritableColumnVector v = vectors[c];
            switch (columns[c]) {
                case VALUE:
                    putBytes(v, row, rec.bodyPos, rec.bodyLen);
                    break;
                case TOPIC:
                    putBytes(v, row, rec.topicPos, rec.topicLen);
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
                    v.putLong(row, phys);
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
                    v.putByteArray(row, msgId, 0, msgId(rec, phys));
                    break;
                case KEY:
                case TAGS:
                case KEYS:
                case PROPERTIES:
                    if (!parsed) {
                        props.parse(buf, rec.propsPos, rec.propsLen);
                        parsed = true;
                    }
                    fillProperty(rec, columns[c], v, row);
                    break;
                default:
                    throw new IllegalStateException("no decoder for column " + columns[c]);
            }
        }
    }

    private void fillProperty(CommitLogRecord rec, Column column, WritableColumnVector v, int row) {
        switch (column) {
            case KEY:
            case TAGS: {
                int i = props.find(column == Column.KEY ? KEYS : TAGS);
                if (i < 0) {
                    v.putNull(row);
                } else {
                    putBytes(v, row, props.valuePos(i), props.valueLen(i));
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
    private int msgId(CommitLogRecord rec, long phys) {
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
    public void close() {
        batch.close();
    }
}
