package localmq.interop;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import java.util.Locale;
import java.util.Properties;
import java.util.Random;
import java.util.stream.Stream;
import net.openhft.chronicle.bytes.Bytes;
import net.openhft.chronicle.queue.ChronicleQueue;
import net.openhft.chronicle.queue.ExcerptAppender;
import net.openhft.chronicle.queue.ExcerptTailer;
import net.openhft.chronicle.wire.DocumentContext;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * The JVM peers of perf/test_jvm_bench.py, timed in one JVM, single thread (no RocketMQ or Chronicle code is copied
 * here: it calls their public classes).
 *
 * <pre>
 * --dir DIR [--count N] [--body BYTES] [--rounds R] [--out FILE]
 * </pre>
 *
 * Each round gets a fresh directory under DIR and a freshly opened store or queue (opening and closing untimed); one
 * untimed warm-up round of each scenario first. Bodies: an 8-byte big-endian index, then a fixed pseudo-random filler
 * (as perf/conftest.py's). After each round the count and the first and last bodies read back are checked.
 * <ul>
 * <li>RocketMQ 4.9.8 DefaultMessageStore, ASYNC_FLUSH, 1 GiB CommitLog segments (its default), no IndexFile
 *     (no keys are put): "put" = N x putMessage of a MessageExtBrokerInner built in the loop (topic "bench",
 *     queue 0, no properties), then wait until the ConsumeQueue dispatch caught up; "read" = getMessage 32 at a
 *     time over the queue, each record decoded with MessageDecoder.decode (body copied), as a consumer sees it;
 *     "read_buffers" = the same getMessage calls, bodies not decoded (the store's own share).</li>
 * <li>Chronicle Queue: "put" = N x appender.writingDocument() writing the body bytes; "read" = a tailer's
 *     readingDocument() loop copying each body into a byte[].</li>
 * </ul>
 * Output: one JSON document (stdout, or --out) with the median round time and msgs/s of each scenario.
 */
public final class JvmBench {
    private JvmBench() {
    }

    interface Round {
        /** Untimed setup of a round in a fresh directory; returns the timed part. */
        Timed open(Path dir) throws Exception;
    }

    interface Timed extends AutoCloseable {
        /** The timed region. */
        void run() throws Exception;

        /** Untimed, after run: [count, first body index, last body index] of what was written or read. */
        long[] check() throws Exception;
    }

    public static void main(String[] args) throws Exception {
        System.setProperty("chronicle.analytics.disable", "true");  // Chronicle would otherwise try to report usage
        Path dir = null;
        int count = 1_000_000;
        int body = 100;
        int rounds = 5;
        String out = null;
        for (int i = 0; i + 1 < args.length; i += 2) {
            switch (args[i]) {
                case "--dir": dir = Paths.get(args[i + 1]); break;
                case "--count": count = Integer.parseInt(args[i + 1]); break;
                case "--body": body = Integer.parseInt(args[i + 1]); break;
                case "--rounds": rounds = Integer.parseInt(args[i + 1]); break;
                case "--out": out = args[i + 1]; break;
                default: usage();
            }
        }
        if (dir == null || args.length % 2 != 0 || body < 8) {
            usage();
        }
        byte[][] bodies = bodies(count, body);
        StringBuilder json = new StringBuilder();
        json.append("{\n  \"count\": ").append(count).append(",\n  \"body_size\": ").append(body)
            .append(",\n  \"rounds\": ").append(rounds).append(",\n  \"java\": \"")
            .append(System.getProperty("java.version")).append("\",\n  \"results\": [\n");
        List<String> rows = new ArrayList<>();
        Properties versions = new Properties();
        try (InputStream in = JvmBench.class.getResourceAsStream("/jvm-bench.properties")) {
            versions.load(in);
        }
        String rmq = "RocketMQ " + versions.getProperty("rocketmq.version") + " DefaultMessageStore";
        String cq = "Chronicle Queue " + versions.getProperty("chronicle.queue.version");
        rows.add(measure(rmq, "put", dir, rounds, count, bodies, d -> rocketPut(d, bodies)));
        rows.add(measure(rmq, "read", dir, rounds, count, bodies, d -> rocketRead(d, bodies, true)));
        rows.add(measure(rmq, "read_buffers", dir, rounds, count, bodies, d -> rocketRead(d, bodies, false)));
        rows.add(measure(cq, "put", dir, rounds, count, bodies, d -> chroniclePut(d, bodies)));
        rows.add(measure(cq, "read", dir, rounds, count, bodies, d -> chronicleRead(d, bodies)));
        json.append(String.join(",\n", rows)).append("\n  ]\n}\n");
        if (out == null) {
            System.out.print(json);
        } else {
            Files.write(Paths.get(out), json.toString().getBytes(StandardCharsets.UTF_8));
        }
        // the store's scheduled executors are not all daemon threads
        System.exit(0);
    }

    static void usage() {
        System.err.println("usage: --dir DIR [--count N] [--body BYTES] [--rounds R] [--out FILE]");
        System.exit(2);
    }

    static byte[][] bodies(int count, int size) {
        byte[] filler = new byte[size];
        new Random(size).nextBytes(filler);
        byte[][] out = new byte[count][];
        for (int i = 0; i < count; i++) {
            byte[] b = filler.clone();
            ByteBuffer.wrap(b).putLong(i);
            out[i] = b;
        }
        return out;
    }

    static String measure(String impl, String scenario, Path base, int rounds, int count, byte[][] bodies, Round round)
        throws Exception {
        double[] seconds = new double[rounds];
        for (int r = -1; r < rounds; r++) {  // round -1: the warm-up, untimed
            Path d = base.resolve(scenario + "-" + impl.replaceAll("[^A-Za-z0-9]", "_") + "-" + (r + 1));
            Files.createDirectories(d);
            try (Timed t = round.open(d)) {
                long t0 = System.nanoTime();
                t.run();
                long t1 = System.nanoTime();
                long[] got = t.check();
                if (got[0] != count || got[1] != 0 || got[2] != count - 1) {
                    throw new IllegalStateException(impl + " " + scenario + ": read back " + Arrays.toString(got));
                }
                if (r >= 0) {
                    seconds[r] = (t1 - t0) / 1e9;
                }
            } finally {
                delete(d);
            }
        }
        double[] sorted = seconds.clone();
        Arrays.sort(sorted);
        double median = rounds % 2 == 1 ? sorted[rounds / 2] : (sorted[rounds / 2 - 1] + sorted[rounds / 2]) / 2;
        StringBuilder s = new StringBuilder();
        s.append("    {\"implementation\": \"").append(impl).append("\", \"scenario\": \"").append(scenario)
            .append("\", \"messages\": ").append(count)
            .append(String.format(Locale.ROOT, ", \"seconds_median\": %.6f, \"msgs_s\": %.1f, \"seconds\": [", median,
                count / median));
        for (int i = 0; i < rounds; i++) {
            s.append(i == 0 ? "" : ", ").append(String.format(Locale.ROOT, "%.6f", seconds[i]));
        }
        return s.append("]}").toString();
    }

    static void delete(Path d) throws IOException {
        if (!Files.exists(d)) {
            return;
        }
        try (Stream<Path> walk = Files.walk(d)) {
            walk.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
        }
    }

    static long index(byte[] b) {
        return ByteBuffer.wrap(b).getLong();
    }

    static DefaultMessageStore openStore(Path d) throws Exception {
        MessageStoreConfig config = new MessageStoreConfig();
        config.setStorePathRootDir(d.toString());
        config.setStorePathCommitLog(d.resolve("commitlog").toString());
        config.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);
        config.setMessageIndexEnable(false);
        config.setHaListenPort(0);
        DefaultMessageStore store = new DefaultMessageStore(config, new BrokerStatsManager("bench", true),
            (topic, queueId, logicOffset, tagsCode, msgStoreTime, filterBitMap, properties) -> { }, new BrokerConfig());
        if (!store.load()) {
            throw new IllegalStateException("DefaultMessageStore.load() failed in " + d);
        }
        store.start();
        return store;
    }

    static final InetSocketAddress BORN = new InetSocketAddress("127.0.0.1", 40000);
    static final InetSocketAddress STORE_HOST = new InetSocketAddress("127.0.0.1", 10911);

    static void put(DefaultMessageStore store, byte[][] bodies) {
        for (byte[] b : bodies) {
            MessageExtBrokerInner msg = new MessageExtBrokerInner();
            msg.setTopic("bench");
            msg.setQueueId(0);
            msg.setBody(b);
            msg.setPropertiesString("");
            msg.setTagsCode(0);
            msg.setBornTimestamp(System.currentTimeMillis());
            msg.setBornHost(BORN);
            msg.setStoreHost(STORE_HOST);
            PutMessageResult r = store.putMessage(msg);
            if (!r.isOk()) {
                throw new IllegalStateException("putMessage: " + r);
            }
        }
        while (store.dispatchBehindBytes() > 0) {
            Thread.onSpinWait();
        }
    }

    static Timed rocketPut(Path d, byte[][] bodies) throws Exception {
        DefaultMessageStore store = openStore(d);
        return new Timed() {
            public void run() {
                put(store, bodies);
            }

            public long[] check() {
                long[] ends = firstLast(store);
                return new long[] {store.getMaxOffsetInQueue("bench", 0), ends[0], ends[1]};
            }

            public void close() {
                store.shutdown();
            }
        };
    }

    /** Index of the first and last body in queue 0 (untimed: after the clock stopped it is the check's). */
    static long[] firstLast(DefaultMessageStore store) {
        long max = store.getMaxOffsetInQueue("bench", 0);
        return new long[] {index(bodyAt(store, 0)), index(bodyAt(store, max - 1))};
    }

    static byte[] bodyAt(DefaultMessageStore store, long offset) {
        GetMessageResult r = store.getMessage("bench", "bench", 0, offset, 1, null);
        try {
            return MessageDecoder.decode(r.getMessageBufferList().get(0), true, false).getBody();
        } finally {
            r.release();
        }
    }

    static Timed rocketRead(Path d, byte[][] bodies, boolean decode) throws Exception {
        DefaultMessageStore store = openStore(d);
        put(store, bodies);  // untimed: written before the clock starts
        return new Timed() {
            private long[] got;

            public void run() {
                long offset = 0;
                long n = 0;
                long first = -1;
                long last = -1;
                long bytes = 0;
                while (true) {
                    GetMessageResult r = store.getMessage("bench", "bench", 0, offset, 32, null);
                    List<ByteBuffer> buffers = r.getMessageBufferList();
                    if (buffers.isEmpty()) {
                        r.release();
                        break;
                    }
                    for (ByteBuffer b : buffers) {
                        if (decode) {
                            MessageExt m = MessageDecoder.decode(b, true, false);
                            byte[] body = m.getBody();
                            bytes += body.length;
                            if (n == 0) {
                                first = index(body);
                            }
                            last = index(body);
                        } else {
                            bytes += b.remaining();
                        }
                        n++;
                    }
                    offset = r.getNextBeginOffset();
                    r.release();
                }
                if (!decode) {
                    long[] ends = firstLast(store);
                    first = ends[0];
                    last = ends[1];
                }
                got = new long[] {bytes > 0 ? n : -1, first, last};
            }

            public long[] check() {
                return got;
            }

            public void close() {
                store.shutdown();
            }
        };
    }

    static Timed chroniclePut(Path d, byte[][] bodies) {
        ChronicleQueue queue = ChronicleQueue.singleBuilder(d.toFile()).build();
        ExcerptAppender appender = queue.createAppender();
        return new Timed() {
            public void run() {
                for (byte[] b : bodies) {
                    try (DocumentContext dc = appender.writingDocument()) {
                        dc.wire().bytes().write(b);
                    }
                }
            }

            public long[] check() {
                return readAll(queue);
            }

            public void close() {
                appender.close();
                queue.close();
            }
        };
    }

    /** [count, first index, last index] of every excerpt, each body copied into a byte[]. */
    static long[] readAll(ChronicleQueue queue) {
        long n = 0;
        long first = -1;
        long last = -1;
        try (ExcerptTailer tailer = queue.createTailer()) {
            while (true) {
                try (DocumentContext dc = tailer.readingDocument()) {
                    if (!dc.isPresent()) {
                        break;
                    }
                    Bytes<?> bytes = dc.wire().bytes();
                    byte[] body = new byte[(int) bytes.readRemaining()];
                    bytes.read(body);
                    if (n == 0) {
                        first = index(body);
                    }
                    last = index(body);
                    n++;
                }
            }
        }
        return new long[] {n, first, last};
    }

    static Timed chronicleRead(Path d, byte[][] bodies) {
        ChronicleQueue queue = ChronicleQueue.singleBuilder(d.toFile()).build();
        try (ExcerptAppender appender = queue.createAppender()) {
            for (byte[] b : bodies) {
                try (DocumentContext dc = appender.writingDocument()) {
                    dc.wire().bytes().write(b);
                }
            }
        }
        return new Timed() {
            private long[] got;

            public void run() {
                got = readAll(queue);
            }

            public long[] check() {
                return got;
            }

            public void close() {
                queue.close();
            }
        };
    }
}
