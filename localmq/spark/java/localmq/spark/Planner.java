package localmq.spark;

import java.nio.MappedByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.logging.Logger;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * Plans a batch read on the driver exactly as the Python source's {@code localmq/spark/plan.py plan_batch}: the same
 * per-queue offsets (earliest / JSON / timestamps, data-loss checks, pushed-down filters), the same choice between
 * per-queue and per-segment-range partitions and the same cuts, the records past the ConsumeQueues
 * (includeUndispatched), and the same errors. Method names follow the Python functions'.
 */
final class Planner {
    private static final Logger LOG = Logger.getLogger("localmq.spark");

    /** A queue's ConsumeQueue (null when only the tail has the queue), first offset and end offset. */
    record QState(ConsumeQueueFiles cq, long lo, long hi) {
    }

    /**
     * Records the commit log holds past the furthest record the ConsumeQueues index (never dispatched): per queue
     * the first and end offsets found in their headers, and (offsets, store times) for offset-by-time.
     */
    static final class Tail {
        final long start;
        final long end;
        final Map<QueueKey, long[]> queues = new LinkedHashMap<>();
        final Map<QueueKey, long[][]> times = new LinkedHashMap<>();

        Tail(long start, long end) {
            this.start = start;
            this.end = end;
        }
    }

    private final StoreFiles store;
    private final ReadOptions opts;
    /** Read the records past the ConsumeQueues unless includeUndispatched is false (a stream's planned offsets). */
    private final boolean forceTail;
    private Map<QueueKey, QState> state;
    private Tail tail;

    private Planner(ReadOptions opts, boolean forceTail) {
        this.opts = opts;
        this.forceTail = forceTail;
        this.store = new StoreFiles(opts);
    }

    /**
     * The store's queues now, for a stream (datasource.py {@code _state}): {(topic, qid): (cq, first, end)},
     * the records past the ConsumeQueues included as includeUndispatched says, or (forceTail) unless it is false.
     */
    static Planner ofState(ReadOptions opts, boolean forceTail) {
        Planner p = new Planner(opts, forceTail);
        p.storeState();
        return p;
    }

    Map<QueueKey, QState> state() {
        return state;
    }

    /**
     * The partitions of a batch read of {@code opts.path}: a consistent prefix of the store as it is now.
     *
     * @throws IllegalArgumentException not a store; a JSON offsets option that does not name the queues read
     * @throws IllegalStateException segments of another size, a missing unit
     * @throws OffsetRangeException offsets retention removed or gap records in the range (failOnDataLoss), an
     *         ending offset before a starting one
     * @throws CorruptRecordException damage where the plan needs a record
     */
    static List<InputPartition> planBatch(ReadOptions opts) {
        return new Planner(opts, false).plan();
    }

    private List<InputPartition> plan() {
        int partsWanted = opts.targetPartitions();
        if (!store.hasSegments()) {
            return new ArrayList<>();
        }
        long bound = storeState();
        if (state.isEmpty() && store.queues(null).isEmpty()) {
            // no ConsumeQueues (a bare commit log): scan it, with offsets and times as row filters
            Map<QueueKey, long[]> bounds = null;
            if (opts.starting != null || opts.ending != null) {
                bounds = new LinkedHashMap<>();
                if (opts.starting != null) {
                    for (Map.Entry<QueueKey, Long> e : opts.starting.entrySet()) {
                        bounds.put(e.getKey(), new long[] {Math.max(e.getValue(), 0), -1});
                    }
                }
                if (opts.ending != null) {
                    for (Map.Entry<QueueKey, Long> e : opts.ending.entrySet()) {
                        long[] b = bounds.get(e.getKey());
                        bounds.put(e.getKey(), new long[] {b == null ? 0 : b[0], e.getValue()});
                    }
                }
            }
            long end = store.walkEnd(null, null);
            return segmentPartitions(store.minOffset(), end, partsWanted, List.of(), bounds, true);
        }
        if (state.isEmpty()) {
            return new ArrayList<>();  // the store indexes its topics, none of those asked for
        }
        Map<QueueKey, long[]> offsets = resolveOffsets();
        Map<QueueKey, long[]> covered = new LinkedHashMap<>();
        Map<QueueKey, long[]> beyond = new LinkedHashMap<>();
        splitRanges(offsets, covered, beyond);
        long selected = 0;
        long whole = 0;
        long rest = 0;
        for (long[] r : covered.values()) {
            selected += r[1] - r[0];
        }
        for (Map.Entry<QueueKey, QState> e : state.entrySet()) {
            if (e.getValue().cq() != null) {
                whole += cqEnd(e.getKey()) - e.getValue().lo();
            }
        }
        for (long[] r : beyond.values()) {
            rest += r[1] - r[0];
        }
        // Python's round(): half to even
        int tailParts = rest > 0
                ? (int) Math.max(1, Math.rint((double) partsWanted * rest / Math.max(1, selected + rest))) : 0;
        List<InputPartition> parts = rest > 0 ? tailPartitions(beyond, tailParts) : new ArrayList<>();
        partsWanted = Math.max(1, partsWanted - tailParts);
        String mode = opts.partitioning;
        if (mode.equals("auto")) {
            mode = selected * 2 >= whole ? "segment" : "queue";
        }
        List<InputPartition> out;
        if (mode.equals("queue")) {
            out = queuePartitions(covered, partsWanted);
        } else {
            out = segmentPartitionsOf(covered, partsWanted);
        }
        out.addAll(parts);
        return out;
    }

    /** Segment partitions over the commit log range the covered queue ranges span. */
    private List<InputPartition> segmentPartitionsOf(Map<QueueKey, long[]> covered, int partsWanted) {
        boolean exact = true;
        for (Map.Entry<QueueKey, QState> e : state.entrySet()) {
            QState q = e.getValue();
            long cqHi = cqEnd(e.getKey());
            if (q.cq() != null && q.lo() < cqHi) {
                long[] c = covered.get(e.getKey());
                exact &= c != null && c[0] == q.lo() && c[1] == cqHi;
            }
        }
        long loPhys = -1;
        long hiPhys = 0;
        for (Map.Entry<QueueKey, long[]> e : covered.entrySet()) {
            ConsumeQueueFiles cq = state.get(e.getKey()).cq();
            long s = e.getValue()[0];
            long[] u = cq.unit(s);
            if (u == null) {
                throw new IllegalStateException("consume queue " + cq.path + ": unit " + s
                        + ", the first planned to be read, is missing");
            }
            loPhys = loPhys < 0 ? u[0] : Math.min(loPhys, u[0]);
            hiPhys = Math.max(hiPhys, cq.endPhys(e.getValue()[1]));
        }
        if (loPhys < 0) {
            return new ArrayList<>();
        }
        // every queue read whole up to the bound: no row filter; else each row is checked against its queue's range
        List<ConsumeQueueFiles> queues = new ArrayList<>();
        for (QState q : state.values()) {
            if (q.cq() != null) {
                queues.add(q.cq());
            }
        }
        return segmentPartitions(loPhys, hiPhys, partsWanted, queues, exact ? null : covered, false);
    }

    /**
     * {(topic, qid): (cq, min, max)} consistent with one commit-log bound (queue_state), narrowed by pushed-down
     * queue ids, plus the tail when includeUndispatched allows (store_state); returns the bound.
     */
    private long storeState() {
        long bound = 0;
        for (ConsumeQueueFiles cq : store.queues(opts.topics)) {
            long m = cq.maxOffset();
            if (m > 0) {
                bound = Math.max(bound, cq.endPhys(m));
            }
        }
        state = new LinkedHashMap<>();
        for (ConsumeQueueFiles cq : store.queues(opts.topics)) {
            long m = cq.offsetBefore(bound, cq.maxOffset());
            long lo = cq.minOffset(store.minOffset(), m);
            state.put(new QueueKey(cq.topic, cq.queueId), new QState(cq, lo, Math.max(lo, m)));
        }
        if (opts.queueIds != null) {
            state.keySet().removeIf(k -> !opts.queueIds.contains(k.queueId()));
        }
        Boolean want = opts.includeUndispatched;
        if (forceTail && want == null) {
            want = true;
        }
        if (want == null) {
            want = Boolean.FALSE.equals(store.writerActive());
        }
        if (!want || !store.hasSegments() || store.queues(null).isEmpty()) {
            return bound;  // (a bare commit log, without ConsumeQueues, is read with row filters instead)
        }
        Tail t = scanTail(bound, opts.startingTimestamp != null || opts.endingTimestamp != null);
        if (t.queues.isEmpty()) {
            return bound;
        }
        tail = t;
        for (Map.Entry<QueueKey, long[]> e : t.queues.entrySet()) {
            QueueKey key = e.getKey();
            if (opts.topics != null && !opts.topics.contains(key.topic())) {
                continue;
            }
            if (opts.queueIds != null && !opts.queueIds.contains(key.queueId())) {
                continue;
            }
            QState q = state.get(key);
            long first = e.getValue()[0];
            if (q == null) {
                q = new QState(null, first, first);
            }
            state.put(key, new QState(q.cq(), q.lo(), Math.max(q.hi(), e.getValue()[1])));
        }
        return bound;
    }

    /** Walk and decode the records from {@code start} to the end of the complete records (scan_tail). */
    private Tail scanTail(long start, boolean withTimes) {
        start = Math.max(start, store.minOffset());
        long end = store.walkEnd(start, start);  // a torn write past the queues ends the log, as in recovery
        Tail t = new Tail(start, Math.max(start, end));
        Map<QueueKey, List<long[]>> times = new LinkedHashMap<>();
        CommitLogRecord rec = new CommitLogRecord();
        for (int i = 0; i < store.bases.length; i++) {
            long base = store.bases[i];
            long s = Math.max(start, base);
            long e = Math.min(end, base + store.segmentSize);
            if (s >= e) {
                continue;
            }
            MappedByteBuffer buf = store.map(i);
            if (buf == null) {
                continue;
            }
            try {
                int pos = (int) (s - base);
                int stop = (int) Math.min(buf.limit(), e - base);
                while (pos < stop) {
                    CommitLogRecord.Status st = rec.parse(buf, pos, stop, false);
                    if (st == CommitLogRecord.Status.GAP) {
                        pos += rec.totalSize;
                        continue;
                    }
                    if (st != CommitLogRecord.Status.OK) {
                        break;  // blank (end of this segment) or the end walked to above
                    }
                    if (rec.dispatched()) {
                        byte[] topic = new byte[rec.topicLen];
                        buf.get(rec.topicPos, topic);
                        QueueKey key = new QueueKey(new String(topic, StandardCharsets.UTF_8), rec.queueId);
                        long[] r = t.queues.get(key);
                        if (r == null) {
                            t.queues.put(key, new long[] {rec.queueOffset, rec.queueOffset + 1});
                        } else {
                            r[0] = Math.min(r[0], rec.queueOffset);
                            r[1] = Math.max(r[1], rec.queueOffset + 1);
                        }
                        if (withTimes) {
                            times.computeIfAbsent(key, k -> new ArrayList<>())
                                    .add(new long[] {rec.queueOffset, rec.storeTimestamp});
                        }
                    }
                    pos += rec.totalSize;
                }
            } finally {
                StoreFiles.unmap(buf);
            }
        }
        for (Map.Entry<QueueKey, List<long[]>> e : times.entrySet()) {
            List<long[]> l = e.getValue();
            long[] q = new long[l.size()];
            long[] ts = new long[l.size()];
            for (int k = 0; k < q.length; k++) {
                q[k] = l.get(k)[0];
                ts[k] = l.get(k)[1];
            }
            t.times.put(e.getKey(), new long[][] {q, ts});
        }
        return t;
    }

    /** The end of what {@code key}'s ConsumeQueue covers (where its tail part begins). */
    private long cqEnd(QueueKey key) {
        QState q = state.get(key);
        if (tail != null && tail.queues.containsKey(key)) {
            return q.cq() != null ? Math.max(q.lo(), Math.min(q.hi(), tail.queues.get(key)[0])) : q.lo();
        }
        return q.hi();
    }

    /** The first offset of {@code key} whose store time is >= {@code ts} (its end when none): queue, then tail. */
    long offsetForTime(QueueKey key, long ts) {
        QState q = state.get(key);
        long cqHi = cqEnd(key);
        if (q.cq() != null && q.lo() < cqHi) {
            long o = q.cq().offsetForTime(store, ts, q.lo(), cqHi);
            if (o < cqHi) {
                return o;
            }
        }
        if (tail != null && tail.times.containsKey(key)) {
            long[][] qt = tail.times.get(key);
            long best = Long.MAX_VALUE;
            for (int i = 0; i < qt[0].length; i++) {
                if (qt[1][i] >= ts && qt[0][i] >= cqHi) {
                    best = Math.min(best, qt[0][i]);
                }
            }
            if (best != Long.MAX_VALUE) {
                return best;
            }
        }
        return q.hi();
    }

    /** Split per-queue [start, end) into the part the ConsumeQueues cover and the part only the tail has. */
    void splitRanges(Map<QueueKey, long[]> offsets, Map<QueueKey, long[]> covered,
                             Map<QueueKey, long[]> beyond) {
        for (Map.Entry<QueueKey, long[]> e : offsets.entrySet()) {
            long s = e.getValue()[0];
            long end = e.getValue()[1];
            long cqHi = cqEnd(e.getKey());
            if (state.get(e.getKey()).cq() != null && s < Math.min(end, cqHi)) {
                covered.put(e.getKey(), new long[] {s, Math.min(end, cqHi)});
            }
            if (end > Math.max(s, cqHi)) {
                beyond.put(e.getKey(), new long[] {Math.max(s, cqHi), end});
            }
        }
    }

    List<InputPartition> tailPartitions(Map<QueueKey, long[]> beyond, int partsWanted) {
        if (beyond.isEmpty()) {
            return new ArrayList<>();
        }
        Map<QueueKey, long[]> bounds = new LinkedHashMap<>();
        for (QueueKey key : tail.queues.keySet()) {
            bounds.put(key, beyond.getOrDefault(key, new long[] {0, 0}));
        }
        bounds.putAll(beyond);
        return segmentPartitions(tail.start, tail.end, partsWanted, List.of(), bounds, false);
    }

    /** Per-queue [start, end) for the options (earliest / JSON / timestamps / pushed filters), data loss checked. */
    private Map<QueueKey, long[]> resolveOffsets() {
        if (opts.starting != null) {
            checkOffsetsJson(opts.starting, "startingOffsets");
        }
        if (opts.ending != null) {
            checkOffsetsJson(opts.ending, "endingOffsets");
        }
        Map<QueueKey, long[]> out = new LinkedHashMap<>();
        for (Map.Entry<QueueKey, QState> e : state.entrySet()) {
            QueueKey key = e.getKey();
            long lo = e.getValue().lo();
            long hi = e.getValue().hi();
            long s = opts.starting == null ? lo : opts.starting.get(key);
            long end = opts.ending == null ? hi : opts.ending.get(key);
            s = s == ReadOptions.EARLIEST ? lo : s == ReadOptions.LATEST ? hi : s;
            end = end == ReadOptions.LATEST ? hi : end;
            if (opts.startingTimestamp != null) {
                s = offsetForTime(key, opts.startingTimestamp);
            }
            if (opts.endingTimestamp != null) {
                end = offsetForTime(key, opts.endingTimestamp);
            }
            if (s < lo) {
                String msg = key.topic() + " queue " + key.queueId() + ": offsets " + s + ".." + lo
                        + " were removed by retention (the earliest is " + lo + ")";
                if (opts.failOnDataLoss) {
                    throw new OffsetRangeException(msg + "; set failOnDataLoss=false to skip them");
                }
                LOG.warning(msg + "; skipping them");
                s = lo;
            }
            end = Math.min(end, hi);  // an end past the data: everything there is
            if (end < s) {
                throw new OffsetRangeException(key.topic() + " queue " + key.queueId() + ": ending offset " + end
                        + " is before starting offset " + s);
            }
            // pushed-down offset filters narrow the range (Spark still applies them to the rows)
            s = Math.max(s, opts.offsetLo);
            end = Math.max(s, opts.offsetHi == null ? end : Math.min(end, opts.offsetHi));
            out.put(key, new long[] {s, end});
        }
        return out;
    }

    /** A JSON offsets spec names exactly the queues being read (Kafka: "you must specify all TopicPartitions"). */
    void checkOffsetsJson(Map<QueueKey, Long> spec, String name) {
        List<QueueKey> missing = new ArrayList<>();
        for (QueueKey k : state.keySet()) {
            if (!spec.containsKey(k)) {
                missing.add(k);
            }
        }
        List<QueueKey> unknown = new ArrayList<>();
        if (!opts.pushed) {
            for (QueueKey k : spec.keySet()) {
                if (!state.containsKey(k)) {
                    unknown.add(k);
                }
            }
        }
        if (!missing.isEmpty()) {
            throw new IllegalArgumentException(name + " JSON must give every queue of the topics read (-2 earliest, "
                    + "-1 latest); missing: " + show(missing));
        }
        if (!unknown.isEmpty()) {
            throw new IllegalArgumentException(name + " names queues the store does not have (or topics not read): "
                    + show(unknown));
        }
    }

    private static String show(List<QueueKey> keys) {
        List<QueueKey> sorted = new ArrayList<>(keys);
        sorted.sort(null);
        List<String> out = new ArrayList<>();
        for (QueueKey k : sorted) {
            out.add(k.toString());
        }
        return String.join(", ", out);
    }

    /** QueuePartitions: each queue's range split so the whole read spreads over {@code partsWanted} tasks. */
    List<InputPartition> queuePartitions(Map<QueueKey, long[]> offsets, int partsWanted) {
        List<InputPartition> out = new ArrayList<>();
        long total = 0;
        for (long[] r : offsets.values()) {
            total += r[1] - r[0];
        }
        if (total == 0) {
            return out;
        }
        long per = Math.max(4096, (total + Math.max(1, partsWanted) - 1) / Math.max(1, partsWanted));
        for (Map.Entry<QueueKey, long[]> e : new TreeMap<>(offsets).entrySet()) {
            ConsumeQueueFiles cq = state.get(e.getKey()).cq();
            long s = e.getValue()[0];
            long end = e.getValue()[1];
            while (s < end) {
                long stop = Math.min(end, s + per);
                out.add(new QueuePartition(cq.topic, cq.queueId, cq.path, store.commitlog.getPath(), store.segmentSize,
                        s, stop, opts.tagNames, opts.sql));
                s = stop;
            }
        }
        return out;
    }

    /**
     * Partitions covering records in [loPhys, hiPhys), cut at record boundaries into equal byte shares: a multiple of
     * {@code partsWanted}, none larger than a segment (segment_partitions).
     */
    private List<InputPartition> segmentPartitions(long loPhys, long hiPhys, int partsWanted,
                                                   List<ConsumeQueueFiles> queues, Map<QueueKey, long[]> bounds,
                                                   boolean withTs) {
        long total = hiPhys - loPhys;
        if (total <= 0) {
            return new ArrayList<>();
        }
        List<Long> gaps = new ArrayList<>();
        for (long g : store.gapOffsets()) {
            if (loPhys <= g && g < hiPhys) {
                gaps.add(g);
            }
        }
        if (!gaps.isEmpty()) {
            // messages there were lost to damage (recovery replaced them by gap records, which the walk steps over)
            String msg = "the commit log range read holds " + gaps.size() + " gap record(s) where damaged messages "
                    + "were (offsets " + gaps.subList(0, Math.min(5, gaps.size())) + (gaps.size() > 5 ? "..." : "")
                    + "; the damaged bytes are in " + store.root + "/recovery)";
            if (opts.failOnDataLoss) {
                throw new DataLossException(msg + "; set failOnDataLoss=false to read past them");
            }
            LOG.warning(msg + "; reading past them");
        }
        long segSize = store.segmentSize;
        long wanted = Math.max(1, partsWanted);
        long count = wanted * ((total + wanted * segSize - 1) / (wanted * segSize));
        long piece = Math.max(4096, (total + count - 1) / count);
        List<Long> cuts = new ArrayList<>();
        long target = loPhys + piece;
        while (target < hiPhys - piece / 4) {
            long b = store.boundaryAt(target, queues);
            if (b < 0 || b >= hiPhys) {
                break;
            }
            if (b > (cuts.isEmpty() ? loPhys : cuts.get(cuts.size() - 1))) {
                cuts.add(b);
            }
            target = Math.max(target + piece, b + 1);
        }
        List<List<SegmentRange>> groups = new ArrayList<>();
        for (int i = 0; i <= cuts.size(); i++) {
            groups.add(new ArrayList<>());
        }
        for (int i = 0; i < store.bases.length; i++) {
            long base = store.bases[i];
            long s = Math.max(loPhys, base);
            long e = Math.min(hiPhys, base + segSize);
            if (s >= e) {
                continue;
            }
            List<Long> edges = new ArrayList<>();
            edges.add(s);
            for (long c : cuts) {
                if (s < c && c < e) {
                    edges.add(c);
                }
            }
            edges.add(e);
            for (int k = 0; k + 1 < edges.size(); k++) {
                long a = edges.get(k);
                int g = bisectRight(cuts, a);
                groups.get(g).add(new SegmentRange(store.paths[i], base, (int) segSize, (int) (a - base),
                        (int) (edges.get(k + 1) - base), opts.topics, bounds,
                        withTs ? opts.startingTimestamp : null, withTs ? opts.endingTimestamp : null, opts.tagNames,
                        opts.sql));
            }
        }
        List<InputPartition> out = new ArrayList<>();
        for (List<SegmentRange> g : groups) {
            if (!g.isEmpty()) {
                out.add(new SegmentPartition(g.toArray(new SegmentRange[0])));
            }
        }
        return out;
    }

    private static int bisectRight(List<Long> sorted, long x) {
        int lo = 0;
        int hi = sorted.size();
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (x < sorted.get(mid)) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        return lo;
    }
}
