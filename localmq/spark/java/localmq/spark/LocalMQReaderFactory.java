package localmq.spark;

import java.io.IOException;
import java.util.Iterator;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Creates, in each task, the reader of one partition (segment ranges or a queue range); columnar reads always (Spark takes the batches as they are). */
final class LocalMQReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    private final Column[] columns;
    private final StructType schema;
    private final ReadOptions options;

    LocalMQReaderFactory(Column[] columns, StructType schema, ReadOptions options) {
        this.columns = columns;
        this.schema = schema;
        this.options = options;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
        return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
        return open(partition);
    }

    /** Rows of the same batches, for a caller that asks for rows (Spark does not while columnar reads are on). */
    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
        PartitionReader<ColumnarBatch> batches = open(partition);
        return new PartitionReader<InternalRow>() {
            private Iterator<InternalRow> rows;
            private InternalRow current;

            @Override
            public boolean next() throws IOException {
                while (rows == null || !rows.hasNext()) {
                    if (!batches.next()) {
                        return false;
                    }
                    rows = batches.get().rowIterator();
                }
                current = rows.next();
                return true;
            }

            @Override
            public InternalRow get() {
                return current;
            }

            @Override
            public void close() throws IOException {
                batches.close();
            }
        };
    }

    private PartitionReader<ColumnarBatch> open(InputPartition partition) {
        if (partition instanceof QueuePartition) {
            return new QueueReader((QueuePartition) partition, columns, schema, options);
        }
        return new SegmentReader((SegmentPartition) partition, columns, schema, options);
    }
}
