package localmq.spark;

import java.io.File;
import java.util.List;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.types.StructType;

/**
 * A batch scan of a closed store: the commit log segments, listed when the query plans, cut into shares at record
 * boundaries from the ConsumeQueues (a segment each without them).
 */
final class LocalMQScan implements Scan, Batch {
    private final StructType schema;
    private final ReadOptions options;

    LocalMQScan(StructType schema, ReadOptions options) {
        this.schema = schema;
        this.options = options;
    }

    @Override
    public StructType readSchema() {
        return schema;
    }

    @Override
    public String description() {
        return "localmq " + options.path + (options.topics == null ? "" : " topics=" + options.topics)
                + " checkCRC=" + options.checkCrc;
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
        // one share per core of the driver at least 2, as the Python source's default minPartitions
        int wanted = Math.max(2, Runtime.getRuntime().availableProcessors());
        List<SegmentPartition> parts = StoreSegments.split(StoreSegments.list(options), new File(options.path), wanted);
        return parts.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new LocalMQReaderFactory(Column.of(schema), schema, options);
    }
}
