package localmq.spark;

import java.util.Locale;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * The reader's columns, names and Spark SQL types exactly as the Python data source's
 * ({@code localmq/spark/decode.py} COLUMNS): Kafka's source columns first, then RocketMQ's.
 */
enum Column {
    KEY("key", "binary"),
    VALUE("value", "binary"),
    TOPIC("topic", "string"),
    PARTITION("partition", "int"),
    OFFSET("offset", "bigint"),
    TIMESTAMP("timestamp", "timestamp"),
    TIMESTAMP_TYPE("timestampType", "int"),
    TAGS("tags", "string"),
    KEYS("keys", "array<string>"),
    PROPERTIES("properties", "map<string,string>"),
    PHYSICAL_OFFSET("physical_offset", "bigint"),
    BORN_TIMESTAMP("born_timestamp", "timestamp"),
    RECONSUME_TIMES("reconsume_times", "int"),
    SYS_FLAG("sys_flag", "int"),
    MSG_ID("msg_id", "string");

    /** Kafka's timestampType: 1 LogAppendTime (the store time the broker or localmq set on append). */
    static final int TIMESTAMP_TYPE_LOG_APPEND = 1;

    final String sqlName;
    final String sqlType;

    Column(String sqlName, String sqlType) {
        this.sqlName = sqlName;
        this.sqlType = sqlType;
    }

    /** The full schema, every column in order. */
    static StructType fullSchema() {
        StringBuilder ddl = new StringBuilder();
        for (Column c : values()) {
            if (ddl.length() > 0) {
                ddl.append(", ");
            }
            ddl.append('`').append(c.sqlName).append("` ").append(c.sqlType);
        }
        return StructType.fromDDL(ddl.toString());
    }

    /** The column named {@code name} (exactly, as the Python source), or null. */
    static Column named(String name) {
        for (Column c : values()) {
            if (c.sqlName.equals(name)) {
                return c;
            }
        }
        return null;
    }

    /**
     * The columns of a requested schema, checked as the Python source checks a given schema.
     *
     * @throws IllegalArgumentException a name the source does not have, or a type other than its own
     */
    static Column[] of(StructType schema) {
        Column[] out = new Column[schema.fields().length];
        StructType full = fullSchema();
        for (int i = 0; i < out.length; i++) {
            StructField f = schema.fields()[i];
            Column c = named(f.name());
            if (c == null) {
                StringBuilder names = new StringBuilder();
                for (Column k : values()) {
                    names.append(names.length() > 0 ? ", " : "").append(k.sqlName);
                }
                throw new IllegalArgumentException(String.format(Locale.ROOT,
                        "localmq has no column '%s' (columns: %s)", f.name(), names));
            }
            DataType want = full.apply(c.sqlName).dataType();
            if (!f.dataType().simpleString().equals(want.simpleString())) {
                throw new IllegalArgumentException(String.format(Locale.ROOT, "localmq column '%s' is %s, not %s",
                        c.sqlName, want.simpleString(), f.dataType().simpleString()));
            }
            out[i] = c;
        }
        return out;
    }
}
