package localmq.spark;

import java.util.EnumSet;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * A store directory as a table of messages (one row per record a dispatcher indexes): batch reads and micro-batch
 * streams.
 */
final class LocalMQTable implements SupportsRead {
    private final StructType schema;

    LocalMQTable(StructType schema) {
        this.schema = schema;
    }

    @Override
    public String name() {
        return "localmq";
    }

    // deprecated for columns(), whose default derives from it; Spark's V2 read path still asks for it
    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return schema;
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        return new LocalMQScanBuilder(schema, new java.util.HashMap<>(options.asCaseSensitiveMap()));
    }
}
