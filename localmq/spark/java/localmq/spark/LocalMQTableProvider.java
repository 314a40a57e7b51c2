package localmq.spark;

import java.util.HashMap;
import java.util.Map;

import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.read.format("localmq-jvm").load(path)}: localmq's reader in the JVM (DataSource V2, columnar batches
 * filled straight from read-only mappings of the commit log segments).
 *
 * <p>The jar registers two short names: {@code localmq-jvm}, always this reader, and {@code localmq}
 * ({@link LocalMQProvider}), the name users write. Spark 4 looks a name up among the JVM's registered sources before the
 * Python data sources, so with this jar on a session {@code format("localmq")} is this reader and without it the
 * Python source (found through the installed {@code pyspark_localmq} module); the Python source stays reachable as
 * {@code localmq-python}. The full class name {@code localmq.spark.LocalMQTableProvider} works too. The columns, their names and types, and the options this
 * reader takes mean what they mean to the Python source; a schema given with {@code .schema(...)} names a subset of
 * the columns (each with its type), as there.
 */
public class LocalMQTableProvider implements TableProvider, DataSourceRegister {
    /** The name for {@code format(...)}. */
    public static final String SHORT_NAME = "localmq-jvm";

    @Override
    public String shortName() {
        return SHORT_NAME;
    }

    /**
     * The full schema; fails here, at {@code load()}, for a path that is not a store or a wrong segment size, as the
     * Python source's {@code schema()} does (the other options are checked by the batch read or the stream: they
     * differ between the two).
     */
    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        Map<String, String> given = new HashMap<>();
        if (options.get("path") != null) {
            given.put("path", options.get("path"));
        }
        if (options.get("mapped_file_size_commit_log") != null) {
            given.put("mapped_file_size_commit_log", options.get("mapped_file_size_commit_log"));
        }
        new StoreFiles(ReadOptions.parse(given, false));
        return Column.fullSchema();
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        Column.of(schema);  // a given schema is checked when the query is defined, not in a task
        return new LocalMQTable(schema);
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }
}
