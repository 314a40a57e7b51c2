package localmq.spark;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.logging.Logger;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.apache.spark.sql.types.StructType;

/**
 * Micro-batches of a store, as the Python source's {@code LocalMQStreamReader}: offsets are
 * {@code {"topic": {"queueId": next offset}}} (Kafka's semantics), one partition per queue range. New queues are
 * read from their earliest offset; {@code maxOffsetsPerTrigger} caps a micro-batch, shared out over the queues in
 * proportion to their lag; {@code trigger(availableNow=True)} stops at the offsets the store had when the query
 * started. Offsets retention removed, or planned ones that are gone, fail the query with {@code failOnDataLoss}.
 */
final class LocalMQMicroBatchStream implements MicroBatchStream, SupportsAdmissionControl, SupportsTriggerAvailableNow {
    private static final Logger LOG = Logger.getLogger("localmq.spark");

    private final StructType schema;
    private final ReadOptions opts;
    private Map<QueueKey, Long> target;  // availableNow: the ends when the query started

    LocalMQMicroBatchStream(StructType schema, ReadOptions opts) {
        this.schema = schema;
        this.opts = opts;
    }

    @Override
    public Offset initialOffset() {
        Planner p = Planner.ofState(opts, false);
        if (opts.starting != null) {
            p.checkOffsetsJson(opts.starting, "startingOffsets");
        }
        Map<QueueKey, Long> out = new LinkedHashMap<>();
        for (Map.Entry<QueueKey, Planner.QState> e : p.state().entrySet()) {
            QueueKey key = e.getKey();
            long lo = e.getValue().lo();
            long hi = e.getValue().hi();
            if (opts.startingTimestamp != null) {
                out.put(key, p.offsetForTime(key, opts.startingTimestamp));
            } else if (opts.starting == null) {
                out.put(key, opts.startingLatest ? hi : lo);
            } else {
                long s = opts.starting.get(key);
                out.put(key, s == ReadOptions.EARLIEST ? lo : s == ReadOptions.LATEST ? hi : s);
            }
        }
        return new LocalMQOffset(out);
    }

    /** {(topic, qid): {first, end}} of the store now. */
    private Map<QueueKey, long[]> latest() {
        Map<QueueKey, long[]> out = new LinkedHashMap<>();
        for (Map.Entry<QueueKey, Planner.QState> e : Planner.ofState(opts, false).state().entrySet()) {
            out.put(e.getKey(), new long[] {e.getValue().lo(), e.getValue().hi()});
        }
        return out;
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        return opts.maxOffsetsPerTrigger != null ? ReadLimit.maxRows(opts.maxOffsetsPerTrigger) : ReadLimit.allAvailable();
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        target = new LinkedHashMap<>();
        for (Map.Entry<QueueKey, long[]> e : latest().entrySet()) {
            target.put(e.getKey(), e.getValue()[1]);
        }
    }

    @Override
    public Offset reportLatestOffset() {
        Map<QueueKey, Long> out = new LinkedHashMap<>();
        for (Map.Entry<QueueKey, long[]> e : latest().entrySet()) {
            out.put(e.getKey(), e.getValue()[1]);
        }
        return new LocalMQOffset(out);
    }

    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException("localmq streams take latestOffset(start, limit)");
    }

    @Override
    public Offset latestOffset(Offset startOffset, ReadLimit limit) {
        Map<QueueKey, Long> begin = ((LocalMQOffset) startOffset).offsets;
        Map<QueueKey, long[]> latest = latest();
        Map<QueueKey, Long> end = new LinkedHashMap<>();
        for (Map.Entry<QueueKey, long[]> e : latest.entrySet()) {
            QueueKey key = e.getKey();
            long hi = e.getValue()[1];
            if (target != null) {
                if (!target.containsKey(key)) {
                    continue;  // a queue created after availableNow started: not this query's
                }
                hi = Math.min(hi, target.get(key));
            }
            long s = begin.getOrDefault(key, e.getValue()[0]);
            end.put(key, Math.max(s, hi));
        }
        for (Map.Entry<QueueKey, Long> e : begin.entrySet()) {
            end.putIfAbsent(e.getKey(), e.getValue());  // a queue whose files are gone keeps its offset
        }
        if (limit instanceof ReadMaxRows) {
            long max = ((ReadMaxRows) limit).maxRows();
            Map<QueueKey, Long> lags = new LinkedHashMap<>();
            long total = 0;
            for (Map.Entry<QueueKey, Long> e : end.entrySet()) {
                QueueKey k = e.getKey();
                long from = begin.containsKey(k) ? begin.get(k) : latest.containsKey(k) ? latest.get(k)[0] : e.getValue();
                lags.put(k, e.getValue() - from);
                total += e.getValue() - from;
            }
            if (total > max) {
                Map<QueueKey, Long> share = new LinkedHashMap<>();
                long given = 0;
                for (Map.Entry<QueueKey, Long> e : lags.entrySet()) {
                    long sh = (long) Math.floor((double) (e.getValue() * max) / total);
                    share.put(e.getKey(), sh);
                    given += sh;
                }
                // the rows left go to the largest remainders (a stable sort, as Python's sorted(reverse=True))
                List<QueueKey> order = new ArrayList<>(lags.keySet());
                order.sort((a, b) -> Long.compare(lags.get(b) - share.get(b), lags.get(a) - share.get(a)));
                for (int i = 0; i < Math.min(order.size(), max - given); i++) {
                    share.put(order.get(i), share.get(order.get(i)) + 1);
                }
                for (QueueKey k : end.keySet()) {
                    end.put(k, end.get(k) - lags.get(k) + share.get(k));
                }
            }
        }
        return new LocalMQOffset(end);
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        Map<QueueKey, Long> begin = ((LocalMQOffset) start).offsets;
        Map<QueueKey, Long> stop = ((LocalMQOffset) end).offsets;
        Planner p = Planner.ofState(opts, false);
        Map<QueueKey, Planner.QState> state = p.state();
        boolean beyond = false;
        for (Map.Entry<QueueKey, Long> e : stop.entrySet()) {
            beyond |= !state.containsKey(e.getKey()) || e.getValue() > state.get(e.getKey()).hi();
        }
        if (beyond) {
            // planned from records a dispatcher had not indexed, and still has not: read them from the log
            p = Planner.ofState(opts, true);
            state = p.state();
        }
        Map<QueueKey, long[]> offsets = new LinkedHashMap<>();
        for (Map.Entry<QueueKey, Long> en : stop.entrySet()) {
            QueueKey key = en.getKey();
            long e = en.getValue();
            String name = key.topic() + " queue " + key.queueId();
            if (!state.containsKey(key)) {
                if (begin.containsKey(key) && e > begin.get(key)) {
                    lost(name + ": offsets " + begin.get(key) + ".." + e + " are gone (no ConsumeQueue any more)");
                }
                continue;
            }
            long lo = state.get(key).lo();
            long hi = state.get(key).hi();
            if (e > hi) {
                lost(name + ": offsets " + hi + ".." + e + " planned for this batch are gone from the log");
                e = hi;
            }
            long s = begin.getOrDefault(key, lo);
            if (s < lo) {
                lost(name + ": offsets " + s + ".." + lo + " were removed by retention (the earliest is " + lo + ")");
                s = lo;
            }
            if (e > s) {
                offsets.put(key, new long[] {s, e});
            }
        }
        Map<QueueKey, long[]> covered = new LinkedHashMap<>();
        Map<QueueKey, long[]> past = new LinkedHashMap<>();
        p.splitRanges(offsets, covered, past);
        List<InputPartition> parts = p.queuePartitions(covered, opts.targetPartitions());
        parts.addAll(p.tailPartitions(past, 1));
        return parts.toArray(new InputPartition[0]);
    }

    private void lost(String msg) {
        if (opts.failOnDataLoss) {
            throw new OffsetRangeException(msg + "; set failOnDataLoss=false to skip them");
        }
        LOG.warning(msg + "; skipping them");
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new LocalMQReaderFactory(Column.of(schema), schema, opts);
    }

    @Override
    public Offset deserializeOffset(String json) {
        return LocalMQOffset.parse(json);
    }

    @Override
    public void commit(Offset end) {
        // read-only: nothing to release
    }

    @Override
    public void stop() {
        // nothing held between micro-batches
    }
}
