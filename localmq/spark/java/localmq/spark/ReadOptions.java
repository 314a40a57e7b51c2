package localmq.spark;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * The reader options, parsed and checked as the Python data source's {@code localmq/spark/options.py} parses them:
 * the same names (case-insensitive, as Spark hands them over), defaults, checks in the same order and the same
 * messages, so that a bad option fails the same way in both readers. {@code ConfigError} there is
 * {@link IllegalArgumentException} here.
 *
 * <p>Taken: {@code path}, {@code topics}, {@code startingOffsets}, {@code endingOffsets}, {@code startingTimestamp},
 * {@code endingTimestamp}, {@code maxOffsetsPerTrigger} (streaming only, as there), {@code failOnDataLoss},
 * {@code mapped_file_size_commit_log}, {@code batchSize}, {@code minPartitions}, {@code partitioning},
 * {@code pushFilters}, {@code checkCRC}, {@code includeUndispatched}, {@code tags} and {@code sql}: every option
 * the Python source takes.
 */
final class ReadOptions implements Serializable {
    private static final long serialVersionUID = 2L;

    /** Every option either reader takes, by its lower-cased name (options.py OPTION_NAMES). */
    private static final List<String> OPTION_NAMES = Arrays.asList(
            "path", "topics", "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
            "maxOffsetsPerTrigger", "failOnDataLoss", "mapped_file_size_commit_log", "batchSize", "minPartitions",
            "partitioning", "pushFilters", "checkCRC", "includeUndispatched", "tags", "sql",
            "subscribe", "subscribePattern", "assign");
    private static final List<String> KAFKA_ONLY = Arrays.asList("subscribe", "subscribepattern", "assign");

    /** -2 in an offsets JSON: the queue's earliest offset. */
    static final long EARLIEST = -2;
    /** -1 in an offsets JSON: the queue's latest offset. */
    static final long LATEST = -1;

    final String path;
    /** Topic names read (null: every topic); pushed-down topic filters narrow it, possibly to none. */
    Set<String> topics;
    /** Per-queue starting offsets of a JSON startingOffsets; null: earliest, or latest when startingLatest. */
    final Map<QueueKey, Long> starting;
    /** startingOffsets "latest" (a stream's default). */
    final boolean startingLatest;
    /** A stream's cap on the rows of a micro-batch (null: none). */
    final Long maxOffsetsPerTrigger;
    /** Per-queue ending offsets of a JSON endingOffsets; null: latest. */
    final Map<QueueKey, Long> ending;
    final Long startingTimestamp;
    final Long endingTimestamp;
    final boolean checkCrc;
    final boolean failOnDataLoss;
    /** Commit log segment size; null: the store's settings record, else the size of its segment files. */
    final Long segmentSize;
    /** Rows per columnar batch at most. */
    final int batchSize;
    final Integer minPartitions;
    /** "auto", "segment" or "queue". */
    final String partitioning;
    /** Whether the scan takes topic / partition / offset filters (default true: no Spark setting gates it here). */
    final boolean pushFilters;
    /** "auto" (null), or true / false: read the records past the ConsumeQueues. */
    final Boolean includeUndispatched;
    /** Rows whose TAGS is one of these (a subscription's "a || b"); null: every row. */
    final Set<String> tagNames;
    /** Rows whose properties match this SQL92 expression (checked when parsed); null: every row. */
    final String sql;
    // pushed-down filters: queue ids (null: all), queue offsets [offsetLo, offsetHi) (null: no end)
    Set<Integer> queueIds;
    long offsetLo;
    Long offsetHi;
    /** Filters narrowed the topics or queues read (a JSON may then name queues that are not read). */
    boolean pushed;

    private ReadOptions(String path, Set<String> topics, Map<QueueKey, Long> starting, boolean startingLatest,
                        Long maxOffsetsPerTrigger, Map<QueueKey, Long> ending, Long startingTimestamp, Long endingTimestamp, boolean checkCrc, boolean failOnDataLoss,
                        Long segmentSize, int batchSize, Integer minPartitions, String partitioning,
                        boolean pushFilters, Boolean includeUndispatched, Set<String> tagNames, String sql) {
        this.path = path;
        this.topics = topics;
        this.starting = starting;
        this.startingLatest = startingLatest;
        this.maxOffsetsPerTrigger = maxOffsetsPerTrigger;
        this.ending = ending;
        this.startingTimestamp = startingTimestamp;
        this.endingTimestamp = endingTimestamp;
        this.checkCrc = checkCrc;
        this.failOnDataLoss = failOnDataLoss;
        this.segmentSize = segmentSize;
        this.batchSize = batchSize;
        this.minPartitions = minPartitions;
        this.partitioning = partitioning;
        this.pushFilters = pushFilters;
        this.includeUndispatched = includeUndispatched;
        this.tagNames = tagNames;
        this.sql = sql;
    }

    /** Partitions a read aims at: {@code minPartitions}, else the driver's CPU count (at least 2). */
    int targetPartitions() {
        return minPartitions != null ? minPartitions : Math.max(2, Runtime.getRuntime().availableProcessors());
    }

    /**
     * Parse Spark's options (keys in any case) of a batch read ({@code streaming} false) or of a stream.
     *
     * @throws IllegalArgumentException an unknown option, a bad value, no path (options.py's ConfigError and
     *         NotAStoreError)
     */
    static ReadOptions parse(Map<String, String> options, boolean streaming) {
        Map<String, String> opts = new LinkedHashMap<>();
        for (Map.Entry<String, String> e : options.entrySet()) {
            opts.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        }
        checkOptionNames(opts);
        String path = opts.get("path");
        if (path == null || path.isEmpty()) {
            throw new IllegalArgumentException("no path given: use .load(path) or .option('path', ...)");
        }
        Set<String> topics = null;
        String t = opts.get("topics");
        if (t != null && !t.isEmpty()) {
            topics = new TreeSet<>();
            for (String name : t.split(",", -1)) {
                if (!name.trim().isEmpty()) {
                    topics.add(name.trim());
                }
            }
        }
        for (String k : KAFKA_ONLY) {
            if (opts.containsKey(k)) {
                throw new IllegalArgumentException("option " + k + " is Kafka's; localmq takes 'topics' (a comma list)");
            }
        }
        Spec starting = offsetsSpec(opts.get("startingoffsets"), "startingOffsets");
        Spec ending = offsetsSpec(opts.get("endingoffsets"), "endingOffsets");
        if (streaming && opts.containsKey("endingoffsets")) {
            throw new IllegalArgumentException("endingOffsets is for batch reads only");
        }
        if (ending != null && "earliest".equals(ending.word)) {
            throw new IllegalArgumentException("endingOffsets cannot be 'earliest'");
        }
        if (ending != null && ending.offsets != null && ending.offsets.containsValue(EARLIEST)) {
            throw new IllegalArgumentException("endingOffsets cannot use -2 (earliest)");
        }
        if (starting != null && starting.offsets != null && starting.offsets.containsValue(LATEST) && !streaming) {
            throw new IllegalArgumentException("startingOffsets of a batch read cannot use -1 (latest)");
        }
        boolean startingLatest = starting == null ? streaming : "latest".equals(starting.word);
        if (startingLatest && !streaming) {
            throw new IllegalArgumentException("startingOffsets of a batch read cannot be 'latest'");
        }
        Long startingTimestamp = null;
        if (opts.containsKey("startingtimestamp")) {
            startingTimestamp = integer(opts.get("startingtimestamp"), "startingTimestamp", 0L);
        }
        Long endingTimestamp = null;
        if (opts.containsKey("endingtimestamp")) {
            if (streaming) {
                throw new IllegalArgumentException("endingTimestamp is for batch reads only");
            }
            endingTimestamp = integer(opts.get("endingtimestamp"), "endingTimestamp", 0L);
        }
        Long maxOffsetsPerTrigger = null;
        if (opts.containsKey("maxoffsetspertrigger")) {
            maxOffsetsPerTrigger = integer(opts.get("maxoffsetspertrigger"), "maxOffsetsPerTrigger", 1L);
        }
        boolean failOnDataLoss = bool(opts, "failondataloss", "failOnDataLoss", true);
        Long segmentSize = null;
        if (opts.containsKey("mapped_file_size_commit_log")) {
            segmentSize = integer(opts.get("mapped_file_size_commit_log"), "mapped_file_size_commit_log", 4096L);
        }
        int batchSize = 4096;
        if (opts.containsKey("batchsize")) {
            batchSize = (int) Math.min(Integer.MAX_VALUE, integer(opts.get("batchsize"), "batchSize", 1L));
        }
        Integer minPartitions = null;
        if (opts.containsKey("minpartitions")) {
            minPartitions = (int) Math.min(Integer.MAX_VALUE, integer(opts.get("minpartitions"), "minPartitions", 1L));
        }
        String partitioning = "auto";
        if (opts.containsKey("partitioning")) {
            partitioning = String.valueOf(opts.get("partitioning")).trim().toLowerCase(Locale.ROOT);
            if (!partitioning.equals("auto") && !partitioning.equals("segment") && !partitioning.equals("queue")) {
                throw new IllegalArgumentException("option partitioning must be auto, segment or queue");
            }
        }
        Map<QueueKey, Long> startMap = starting == null ? null : starting.offsets;
        Map<QueueKey, Long> endMap = ending == null ? null : ending.offsets;
        if (topics == null) {
            // offsets JSON without a topics option: the JSON's topics are the ones read (as Kafka's "assign")
            Set<String> named = new TreeSet<>();
            for (Map<QueueKey, Long> m : Arrays.asList(startMap, endMap)) {
                if (m != null) {
                    for (QueueKey k : m.keySet()) {
                        named.add(k.topic());
                    }
                }
            }
            if (!named.isEmpty()) {
                topics = named;
            }
        }
        boolean pushFilters = bool(opts, "pushfilters", "pushFilters", true);
        boolean checkCrc = bool(opts, "checkcrc", "checkCRC", true);
        Boolean includeUndispatched = null;
        if (opts.containsKey("includeundispatched")) {
            String v = String.valueOf(opts.get("includeundispatched")).trim().toLowerCase(Locale.ROOT);
            includeUndispatched = v.equals("auto") ? null : boolValue(v, "includeUndispatched", opts.get("includeundispatched"));
        }
        Set<String> tagNames = opts.containsKey("tags") ? tagNames(opts.get("tags")) : null;
        String sql = opts.get("sql");
        if (sql != null) {
            try {
                Sql92Filter.compile(sql);
            } catch (Sql92Filter.SyntaxError e) {
                throw new IllegalArgumentException("option sql: " + e.getMessage(), e);
            }
        }
        return new ReadOptions(path, topics, startMap, startingLatest, maxOffsetsPerTrigger, endMap, startingTimestamp, endingTimestamp, checkCrc,
                failOnDataLoss, segmentSize, batchSize, minPartitions, partitioning, pushFilters,
                includeUndispatched, tagNames, sql);
    }

    /**
     * The tags a tag expression names, as RocketMQ's FilterAPI.buildSubscriptionData (localmq.filter.tag_names): null
     * (every tag) for "" and "*"; else the trimmed, non-empty parts of "a || b" (none: nothing matches).
     *
     * @throws IllegalArgumentException an expression of separators only (Python's FilterSyntaxError)
     */
    static Set<String> tagNames(String tags) {
        if (tags == null || tags.isEmpty() || tags.equals("*")) {
            return null;
        }
        String[] parts = tags.split("\\|\\|");  // as Java's client: trailing empty parts dropped
        if (parts.length == 0) {
            throw new IllegalArgumentException("a tag expression of separators only names nothing at position 0\n    "
                    + tags + "\n    ^");
        }
        Set<String> out = new TreeSet<>();
        for (String t : parts) {
            if (!t.strip().isEmpty()) {
                out.add(t.strip());
            }
        }
        return out;
    }

    /** "earliest" / "latest" (word) or per-queue offsets of a startingOffsets / endingOffsets option. */
    private static final class Spec {
        final String word;
        final Map<QueueKey, Long> offsets;

        Spec(String word, Map<QueueKey, Long> offsets) {
            this.word = word;
            this.offsets = offsets;
        }
    }

    /** "earliest", "latest" or a JSON {"topic": {"queueId": offset}} (-2 earliest, -1 latest); null when absent. */
    private static Spec offsetsSpec(String value, String name) {
        if (value == null) {
            return null;
        }
        String text = value.trim();
        String lower = text.toLowerCase(Locale.ROOT);
        if (lower.equals("earliest") || lower.equals("latest")) {
            return new Spec(lower, null);
        }
        JsonNode spec;
        try {
            spec = new ObjectMapper().readTree(text);
        } catch (java.io.IOException e) {
            spec = null;
        }
        if (spec == null || spec.isMissingNode()) {
            throw new IllegalArgumentException("option " + name + " must be 'earliest', 'latest' or JSON like "
                    + "{\"topic\":{\"0\":23}}, not " + repr(value));
        }
        boolean shaped = spec.isObject();
        if (shaped) {
            for (Map.Entry<String, JsonNode> topic : spec.properties()) {
                shaped &= topic.getValue().isObject();
            }
        }
        if (!shaped) {
            throw new IllegalArgumentException("option " + name + ": JSON must map topics to {\"queueId\": offset} "
                    + "objects, not " + repr(value));
        }
        Map<QueueKey, Long> out = new LinkedHashMap<>();
        for (Map.Entry<String, JsonNode> topic : spec.properties()) {
            for (Map.Entry<String, JsonNode> e : topic.getValue().properties()) {
                long qid = integer(e.getKey(), name + " queue id of " + topic.getKey(), 0L);
                JsonNode off = e.getValue();
                // a JSON string is quoted in a message, a number or true is not (Python's repr)
                String text2 = off.isTextual() ? off.textValue() : off.isBoolean() ? (off.booleanValue() ? "True" : "False")
                        : off.isIntegralNumber() ? off.asText() : off.toString();
                long v = integer(text2, name + " offset", -2L, off.isTextual());
                if (qid > Integer.MAX_VALUE) {
                    throw new IllegalArgumentException("option " + name + " queue id of " + topic.getKey()
                            + " must be a queue id, not " + qid);
                }
                out.put(new QueueKey(topic.getKey(), (int) qid), v);
            }
        }
        return new Spec(null, out);
    }

    /** Python's repr of a str option value: single quotes unless the text holds one. */
    static String repr(String v) {
        return v.indexOf('\'') >= 0 && v.indexOf('"') < 0 ? "\"" + v + "\"" : "'" + v + "'";
    }

    private static boolean bool(Map<String, String> opts, String key, String name, boolean dflt) {
        String v = opts.get(key);
        return v == null ? dflt : boolValue(v, name, v);
    }

    private static boolean boolValue(String v, String name, String given) {
        String text = v.trim().toLowerCase(Locale.ROOT);
        if (text.equals("true") || text.equals("1") || text.equals("yes")) {
            return true;
        }
        if (text.equals("false") || text.equals("0") || text.equals("no")) {
            return false;
        }
        throw new IllegalArgumentException("option " + name + " must be true or false, not " + repr(given));
    }

    private static long integer(String v, String name, Long minimum) {
        return integer(v, name, minimum, true);
    }

    private static long integer(String v, String name, Long minimum, boolean quoted) {
        long out;
        try {
            String text = v.trim();
            out = Long.parseLong(text.startsWith("+") ? text.substring(1) : text);
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("option " + name + " must be an integer, not " + (quoted ? repr(v) : v));
        }
        if (minimum != null && out < minimum) {
            throw new IllegalArgumentException("option " + name + " must be >= " + minimum + ", not " + out);
        }
        return out;
    }

    /**
     * IllegalArgumentException for an option name the reader does not take, naming the closest known one (Python's
     * {@code difflib.get_close_matches(n=1, cutoff=0.6)}, so both readers suggest the same name).
     */
    private static void checkOptionNames(Map<String, String> opts) {
        Map<String, String> known = new HashMap<>();
        for (String n : OPTION_NAMES) {
            known.put(n.toLowerCase(Locale.ROOT), n);
        }
        List<String> hints = new ArrayList<>();
        for (String k : opts.keySet()) {
            if (!known.containsKey(k)) {
                String close = closeMatch(k, known.keySet());
                hints.add(repr(k) + (close == null ? "" : " (did you mean " + repr(known.get(close)) + "?)"));
            }
        }
        if (!hints.isEmpty()) {
            List<String> names = new ArrayList<>(OPTION_NAMES);
            names.sort(String.CASE_INSENSITIVE_ORDER);
            throw new IllegalArgumentException("unknown localmq option(s): " + String.join(", ", hints)
                    + "; the options are: " + String.join(", ", names));
        }
    }

    /** The best of {@code names} whose Ratcliff-Obershelp ratio to {@code word} is >= 0.6 (ties: the larger name). */
    private static String closeMatch(String word, Set<String> names) {
        String best = null;
        double bestScore = -1;
        for (String n : names) {
            double r = ratio(n, word);
            if (r >= 0.6 && (r > bestScore || (r == bestScore && n.compareTo(best) > 0))) {
                best = n;
                bestScore = r;
            }
        }
        return best;
    }

    /** difflib.SequenceMatcher(None, a, b).ratio() for short strings (no junk; autojunk needs 200 characters). */
    static double ratio(String a, String b) {
        int total = a.length() + b.length();
        return total == 0 ? 1.0 : 2.0 * matches(a, 0, a.length(), b, 0, b.length()) / total;
    }

    private static int matches(String a, int alo, int ahi, String b, int blo, int bhi) {
        // find_longest_match: the longest block, earliest in a, then earliest in b; then recurse on both sides
        int besti = alo;
        int bestj = blo;
        int bestsize = 0;
        int[] len = new int[bhi - blo + 1];
        for (int i = alo; i < ahi; i++) {
            int[] next = new int[bhi - blo + 1];
            for (int j = blo; j < bhi; j++) {
                if (a.charAt(i) == b.charAt(j)) {
                    int k = len[j - blo] + 1;
                    next[j - blo + 1] = k;
                    if (k > bestsize) {
                        besti = i - k + 1;
                        bestj = j - k + 1;
                        bestsize = k;
                    }
                }
            }
            len = next;
        }
        if (bestsize == 0) {
            return 0;
        }
        return bestsize + matches(a, alo, besti, b, blo, bestj)
                + matches(a, besti + bestsize, ahi, b, bestj + bestsize, bhi);
    }

    @Override
    public String toString() {
        List<String> parts = new ArrayList<>();
        parts.add(path);
        if (topics != null) {
            parts.add("topics=" + topics);
        }
        if (starting != null) {
            parts.add("startingOffsets=" + starting);
        }
        if (ending != null) {
            parts.add("endingOffsets=" + ending);
        }
        if (queueIds != null) {
            parts.add("partitions=" + queueIds);
        }
        if (offsetLo > 0 || offsetHi != null) {
            parts.add("offsets=[" + offsetLo + ", " + (offsetHi == null ? "" : offsetHi) + ")");
        }
        if (tagNames != null) {
            parts.add("tags=" + tagNames);
        }
        if (sql != null) {
            parts.add("sql=" + sql);
        }
        parts.add("checkCRC=" + checkCrc);
        return String.join(" ", parts);
    }
}
