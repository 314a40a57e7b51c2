package localmq.spark;

import java.util.List;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.types.StructType;

/** A batch scan of a closed store: one partition per commit log segment, listed when the query plans. */
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
        List<SegmentPartition> parts = StoreSegments.list(options);
        return parts.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new LocalMQReaderFactory(Column.of(schema), schema, options);
    }
}
