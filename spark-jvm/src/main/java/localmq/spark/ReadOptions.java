package localmq.spark;

import java.io.Serializable;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

/**
 * The reader options, parsed and checked: names and meanings as the Python data source's
 * ({@code localmq/spark/options.py}); case-insensitive, as Spark hands them over.
 *
 * <p>This first step of the JVM reader takes {@code path}, {@code topics}, {@code checkCRC},
 * {@code failOnDataLoss}, {@code mapped_file_size_commit_log} and {@code batchSize}. The Python source's other
 * options are refused by name rather than ignored, so that a query never returns other rows than it asked for.
 */
final class ReadOptions implements Serializable {
    private static final long serialVersionUID = 1L;

    private static final List<String> TAKEN = Arrays.asList(
            "path", "topics", "checkCRC", "failOnDataLoss", "mapped_file_size_commit_log", "batchSize");
    private static final List<String> NOT_YET = Arrays.asList(
            "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp", "maxOffsetsPerTrigger",
            "minPartitions", "partitioning", "pushFilters", "includeUndispatched", "tags", "sql");
    private static final List<String> KAFKA_ONLY = Arrays.asList("subscribe", "subscribePattern", "assign");

    final String path;
    /** Topic names kept (null: every topic). */
    final Set<String> topics;
    final boolean checkCrc;
    final boolean failOnDataLoss;
    /** Commit log segment size; null: the store's settings record, else the size of its segment files. */
    final Long segmentSize;
    /** Rows per columnar batch at most. */
    final int batchSize;

    private ReadOptions(String path, Set<String> topics, boolean checkCrc, boolean failOnDataLoss, Long segmentSize,
                        int batchSize) {
        this.path = path;
        this.topics = topics;
        this.checkCrc = checkCrc;
        this.failOnDataLoss = failOnDataLoss;
        this.segmentSize = segmentSize;
        this.batchSize = batchSize;
    }

    /**
     * Parse Spark's options (keys in any case).
     *
     * @throws IllegalArgumentException an unknown option, a bad value, no path
     * @throws UnsupportedOperationException an option of the Python source that this reader does not take yet
     */
    static ReadOptions parse(Map<String, String> options) {
        java.util.HashMap<String, String> opts = new java.util.HashMap<>();
        for (Map.Entry<String, String> e : options.entrySet()) {
            opts.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        }
        for (String k : opts.keySet()) {
            if (contains(KAFKA_ONLY, k)) {
                throw new IllegalArgumentException("option " + k + " is Kafka's; localmq takes 'topics' (a comma list)");
            }
            if (contains(NOT_YET, k)) {
                throw new UnsupportedOperationException("option " + k + " is not supported by localmq's JVM reader yet; "
                        + "use format(\"localmq\") (the Python data source) for it");
            }
            if (!contains(TAKEN, k)) {
                throw new IllegalArgumentException("unknown localmq option '" + k + "'; the JVM reader takes: "
                        + String.join(", ", TAKEN));
            }
        }
        String path = opts.get("path");
        if (path == null || path.isEmpty()) {
            throw new IllegalArgumentException("no path given: use .load(path) or .option('path', ...)");
        }
        Set<String> topics = null;
        String t = opts.get("topics");
        if (t != null && !t.trim().isEmpty()) {
            topics = new TreeSet<>();
            for (String name : t.split(",")) {
                if (!name.trim().isEmpty()) {
                    topics.add(name.trim());
                }
            }
        }
        boolean checkCrc = bool(opts, "checkcrc", "checkCRC", true);
        boolean failOnDataLoss = bool(opts, "failondataloss", "failOnDataLoss", true);
        Long segmentSize = null;
        if (opts.containsKey("mapped_file_size_commit_log")) {
            segmentSize = integer(opts.get("mapped_file_size_commit_log"), "mapped_file_size_commit_log", 4096);
        }
        int batchSize = 4096;
        if (opts.containsKey("batchsize")) {
            batchSize = (int) Math.min(Integer.MAX_VALUE, integer(opts.get("batchsize"), "batchSize", 1));
        }
        return new ReadOptions(path, topics, checkCrc, failOnDataLoss, segmentSize, batchSize);
    }

    private static boolean contains(List<String> names, String lower) {
        for (String n : names) {
            if (n.toLowerCase(Locale.ROOT).equals(lower)) {
                return true;
            }
        }
        return false;
    }

    private static boolean bool(Map<String, String> opts, String key, String name, boolean dflt) {
        String v = opts.get(key);
        if (v == null) {
            return dflt;
        }
        String text = v.trim().toLowerCase(Locale.ROOT);
        if (text.equals("true") || text.equals("1") || text.equals("yes")) {
            return true;
        }
        if (text.equals("false") || text.equals("0") || text.equals("no")) {
            return false;
        }
        throw new IllegalArgumentException("option " + name + " must be true or false, not '" + v + "'");
    }

    private static long integer(String v, String name, long minimum) {
        long out;
        try {
            out = Long.parseLong(v.trim());
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("option " + name + " must be an integer, not '" + v + "'");
        }
        if (out < minimum) {
            throw new IllegalArgumentException("option " + name + " must be >= " + minimum + ", not " + out);
        }
        return out;
    }
}
