package localmq.spark;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownFilters;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.EqualTo;
import org.apache.spark.sql.sources.Filter;
import org.apache.spark.sql.sources.GreaterThan;
import org.apache.spark.sql.sources.GreaterThanOrEqual;
import org.apache.spark.sql.sources.In;
import org.apache.spark.sql.sources.LessThan;
import org.apache.spark.sql.sources.LessThanOrEqual;
import org.apache.spark.sql.types.StructType;

/**
 * Builds a scan of the columns a query uses (column pruning: only those are decoded) and of the topics, queues and
 * queue offsets its filters allow (filter pushdown, as the Python source's {@code LocalMQFilteringReader.pushFilters}:
 * {@code topic} = / IN, {@code partition} = / IN, {@code offset} = &lt; &lt;= &gt; &gt;=). Pruning only skips what
 * cannot match, and every filter is handed back to Spark, which still applies it to the rows: the result is exact.
 * Unlike the Python source, no Spark setting gates it; option {@code pushFilters=false} turns it off.
 */
final class LocalMQScanBuilder implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownFilters {
    private final Map<String, String> options;
    private final PushedFilters narrowed = new PushedFilters();
    private StructType required;
    private Filter[] pushed = new Filter[0];

    /** {@code options} as Spark gave them: parsed when the scan becomes a batch read or a stream. */
    LocalMQScanBuilder(StructType schema, Map<String, String> options) {
        this.required = schema;
        this.options = options;
    }

    @Override
    public void pruneColumns(StructType requiredSchema) {
        this.required = requiredSchema;
    }

    @Override
    public Filter[] pushFilters(Filter[] filters) {
        // Spark pushes filters into batch scans only: the options are a batch read's (bad ones fail here)
        if (!ReadOptions.parse(options, false).pushFilters) {
            return filters;
        }
        List<Filter> used = new ArrayList<>();
        PushedFilters opts = narrowed;
        for (Filter f : filters) {
            String[] refs = f.references();
            String col = refs.length == 1 && (f instanceof EqualTo || f instanceof In || f instanceof GreaterThan
                    || f instanceof GreaterThanOrEqual || f instanceof LessThan || f instanceof LessThanOrEqual)
                    ? refs[0] : null;
            if ("topic".equals(col) && (f instanceof EqualTo || f instanceof In)) {
                Set<String> wanted = new TreeSet<>();
                for (Object v : values(f)) {
                    if (v instanceof String) {
                        wanted.add((String) v);
                    }
                }
                if (opts.topics != null) {
                    wanted.retainAll(opts.topics);
                }
                opts.topics = wanted;
                used.add(f);
            } else if ("partition".equals(col) && (f instanceof EqualTo || f instanceof In)) {
                Set<Integer> wanted = new TreeSet<>();
                for (Object v : values(f)) {
                    if (v instanceof Integer) {
                        wanted.add((Integer) v);
                    }
                }
                if (opts.queueIds != null) {
                    wanted.retainAll(opts.queueIds);
                }
                opts.queueIds = wanted;
                used.add(f);
            } else if ("offset".equals(col) && !(f instanceof In)) {
                Object v = f instanceof EqualTo ? ((EqualTo) f).value() : f instanceof GreaterThan
                        ? ((GreaterThan) f).value() : f instanceof GreaterThanOrEqual ? ((GreaterThanOrEqual) f).value()
                        : f instanceof LessThan ? ((LessThan) f).value() : ((LessThanOrEqual) f).value();
                if (!(v instanceof Long || v instanceof Integer)) {
                    continue;
                }
                long x = ((Number) v).longValue();
                long lo = 0;
                Long hi = null;
                if (f instanceof EqualTo) {
                    lo = x;
                    hi = x + 1;
                } else if (f instanceof GreaterThan) {
                    lo = x + 1;
                } else if (f instanceof GreaterThanOrEqual) {
                    lo = x;
                } else if (f instanceof LessThan) {
                    hi = x;
                } else {
                    hi = x + 1;
                }
                opts.offsetLo = Math.max(opts.offsetLo, lo);
                if (hi != null) {
                    opts.offsetHi = opts.offsetHi == null ? hi : Math.min(opts.offsetHi, hi);
                }
                used.add(f);
            }
        }
        pushed = used.toArray(new Filter[0]);
        return filters;  // Spark applies them all to the rows as well
    }

    private static Object[] values(Filter f) {
        return f instanceof EqualTo ? new Object[] {((EqualTo) f).value()} : ((In) f).values();
    }

    @Override
    public Filter[] pushedFilters() {
        return pushed;
    }

    @Override
    public Scan build() {
        return new LocalMQScan(required, options, narrowed);
    }
}
