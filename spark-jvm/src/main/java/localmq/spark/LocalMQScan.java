package localmq.spark;

import java.util.List;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.types.StructType;

/**
 * A batch scan of a store: partitions planned when the query runs, per queue range or per commit log segment range,
 * exactly as the Python source plans them ({@link Planner}).
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
        return "localmq " + options;
    }

    @Override
    public Batch toBatch() {
        return this;
    }

    @Override
    public InputPartition[] planInputPartitions() {
        // planned when the query runs, over what the store holds then (the Python source's plan_batch)
        List<InputPartition> parts = Planner.planBatch(options);
        return parts.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new LocalMQReaderFactory(Column.of(schema), schema, options);
    }
}
