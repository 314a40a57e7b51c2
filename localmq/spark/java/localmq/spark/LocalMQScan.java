package localmq.spark;

import java.util.List;
import java.util.Map;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;

/**
 * A scan of a store: as a batch read, partitions planned when the query runs, per queue range or per commit log
 * segment range, exactly as the Python source plans them ({@link Planner}); as a stream, micro-batches of queue
 * offsets ({@link LocalMQMicroBatchStream}). The options are parsed for the one or the other (their defaults and
 * checks differ, as in options.py).
 */
final class LocalMQScan implements Scan, Batch {
    private final StructType schema;
    private final Map<String, String> rawOptions;
    private final PushedFilters pushed;
    private ReadOptions options;  // the batch read's, once toBatch ran

    LocalMQScan(StructType schema, Map<String, String> rawOptions, PushedFilters pushed) {
        this.schema = schema;
        this.rawOptions = rawOptions;
        this.pushed = pushed;
    }

    @Override
    public StructType readSchema() {
        return schema;
    }

    @Override
    public String description() {
        return "localmq " + (options != null ? options.toString() : rawOptions.getOrDefault("path", ""));
    }

    @Override
    public Batch toBatch() {
        ReadOptions opts = ReadOptions.parse(rawOptions, false);
        pushed.applyTo(opts);
        options = opts;
        return this;
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        return new LocalMQMicroBatchStream(schema, ReadOptions.parse(rawOptions, true));
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
