package localmq.spark;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.types.StructType;

/** Builds a scan of the columns a query uses (column pruning: only those are decoded). */
final class LocalMQScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns {
    private final ReadOptions options;
    private StructType required;

    LocalMQScanBuilder(StructType schema, ReadOptions options) {
        this.required = schema;
        this.options = options;
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
        this.required = requiredSchema;
    }

    @Override
    public Scan build() {
        return new LocalMQScan(required, options);
    }
}
