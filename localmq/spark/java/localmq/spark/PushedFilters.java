package localmq.spark;

import java.io.Serializable;
import java.util.Set;
import java.util.TreeSet;

/**
 * What pushed-down filters allow (LocalMQScanBuilder): topics and queue ids (null: any), queue offsets [lo, hi) (hi
 * null: no end); applied to the parsed options of a batch read as the Python source's pushFilters narrows its own.
 */
final class PushedFilters implements Serializable {
    private static final long serialVersionUID = 1L;

    Set<String> topics;
    Set<Integer> queueIds;
    long offsetLo;
    Long offsetHi;

    /** Narrow {@code opts} (a fresh parse) to these filters. */
    void applyTo(ReadOptions opts) {
        if (topics != null) {
            Set<String> t = new TreeSet<>(topics);
            if (opts.topics != null) {
                t.retainAll(opts.topics);
            }
            opts.topics = t;
            opts.pushed = true;
        }
        if (queueIds != null) {
            opts.queueIds = new TreeSet<>(queueIds);
            opts.pushed = true;
        }
        opts.offsetLo = Math.max(opts.offsetLo, offsetLo);
        if (offsetHi != null) {
            opts.offsetHi = opts.offsetHi == null ? offsetHi : Math.min(opts.offsetHi, offsetHi);
        }
    }
}
