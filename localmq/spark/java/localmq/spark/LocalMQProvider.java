package localmq.spark;

/**
 * {@code spark.read.format("localmq")} when this jar is on the session: the same reader as
 * {@link LocalMQTableProvider} under the name users write (Spark 4 resolves a short name to a registered JVM source
 * before a Python data source of the same name, so this one wins over {@code pyspark_localmq}'s while the jar is there).
 */
public final class LocalMQProvider extends LocalMQTableProvider {
    /** The name for {@code format(...)}, shared with the Python data source. */
    public static final String DEFAULT_NAME = "localmq";

    @Override
    public String shortName() {
        return DEFAULT_NAME;
    }
}
