package localmq.interop;

import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentMap;
import java.util.stream.Stream;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.logging.InternalLoggerFactory;
import org.apache.rocketmq.logging.inner.Appender;
import org.apache.rocketmq.logging.inner.Level;
import org.apache.rocketmq.logging.inner.Logger;
import org.apache.rocketmq.logging.inner.LoggingBuilder;
import org.apache.rocketmq.store.ConsumeQueue;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.GetMessageStatus;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * RocketMQ 4.9.8's DefaultMessageStore under perf/many_queues.py's workload (issue 27): N topics x 4 queues, one
 * 100-byte message per queue. One phase per JVM, driven by perf/many_queues_peers.py:
 *
 * <pre>
 * java -cp target/jvm-bench.jar localmq.interop.ManyQueuesBench write|reopen DIR TOPICS [--stall-s S]
 * </pre>
 *
 * <ul>
 * <li>write: a store on an empty DIR (constructor + load() + start(): open_s), putMessage to every queue (put_s),
 *     then wait until the ConsumeQueue dispatch caught up, dispatchBehindBytes() == 0 (put_dispatch_s), then
 *     shutdown() (close_s).</li>
 * <li>reopen: constructor + load() (load_s) + start() (start_s) over the same DIR, then getMessage of offset 0 of
 *     every queue, each decoded and its body checked (read_all_s), then shutdown().</li>
 * </ul>
 * Settings: MessageStoreConfig's defaults (ASYNC_FLUSH, ConsumeQueue files of 300,000 x 20 = 6,000,000 bytes, the
 * message index on) except a 64 MiB CommitLog segment (default 1 GiB) and HA listen port 0 (an ephemeral port instead
 * of 10912, so that two runs never clash). Descriptors, mappings and VmRSS are read from /proc/self after each step
 * and reported as growth over a baseline taken once the store's classes are loaded. The store logs (RocketMQ's own
 * logger, WARN and above) go to stderr. Output: one JSON line on stdout; exit status 0, or 3 when the phase did not
 * complete (status "failed", "stalled" or "error", with how far it got).
 */
public final class ManyQueuesBench {
    private ManyQueuesBench() {
    }

    static final int TOPIC_QUEUES = 4;
    static final byte[] BODY = "x".repeat(100).getBytes(StandardCharsets.US_ASCII);
    static final int COMMIT_LOG_SEGMENT = 64 << 20;
    static final InetSocketAddress BORN = new InetSocketAddress("127.0.0.1", 40000);
    static final InetSocketAddress STORE_HOST = new InetSocketAddress("127.0.0.1", 10911);

    public static void main(String[] args) throws Exception {
        // RocketMQ 4.x logs through slf4j by default, which has no binding on this class path (every line dropped):
        // its own "inner" logger must be chosen before any store class creates its static logger.
        InternalLoggerFactory.setCurrentLoggerType(InternalLoggerFactory.LOGGER_INNER);
        Appender console = LoggingBuilder.newAppenderBuilder().withConsoleAppender(LoggingBuilder.SYSTEM_ERR)
            .withLayout(LoggingBuilder.newLayoutBuilder().withDefaultLayout().build()).build();
        Logger.getRootLogger().addAppender(console);
        Logger.getRootLogger().setLevel(Level.WARN);

        if (args.length < 3 || !(args[0].equals("write") || args[0].equals("reopen"))) {
            System.err.println("usage: write|reopen DIR TOPICS [--stall-s S]");
            System.exit(2);
        }
        Path dir = Paths.get(args[1]);
        int topics = Integer.parseInt(args[2]);
        double stallSeconds = 60;
        for (int i = 3; i + 1 < args.length; i += 2) {
            if (args[i].equals("--stall-s")) {
                stallSeconds = Double.parseDouble(args[i + 1]);
            }
        }
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("phase", args[0]);
        out.put("topics", topics);
        out.put("queues", topics * TOPIC_QUEUES);
        Properties versions = new Properties();
        try (InputStream in = ManyQueuesBench.class.getResourceAsStream("/jvm-bench.properties")) {
            versions.load(in);
        }
        out.put("rocketmq", versions.getProperty("rocketmq.version"));
        out.put("java", System.getProperty("java.version"));
        out.put("status", "ok");
        out.put("fd_limit", fdLimit());
        int rc = 0;
        try {
            rc = args[0].equals("write") ? write(dir, topics, stallSeconds, out) : reopen(dir, topics, out);
        } catch (Throwable e) {
            out.put("status", "error");
            out.put("error", e.toString());
            rc = 3;
            e.printStackTrace();
        }
        System.out.println(json(out));
        System.out.flush();
        // the store's scheduled executors are not all daemon threads; after a failed phase some may still retry
        System.exit(rc);
    }

    /** The store over DIR with the settings of the class comment (not yet loaded). */
    static DefaultMessageStore newStore(Path dir, BrokerStatsManager stats, Map<String, Object> out) throws IOException {
        MessageStoreConfig config = new MessageStoreConfig();
        config.setStorePathRootDir(dir.toString());
        config.setStorePathCommitLog(dir.resolve("commitlog").toString());
        config.setMappedFileSizeCommitLog(COMMIT_LOG_SEGMENT);
        config.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);  // the default already; stated for the reader
        config.setHaListenPort(0);
        Map<String, Object> c = new LinkedHashMap<>();
        c.put("commit_log_segment", config.getMappedFileSizeCommitLog());
        c.put("consume_queue_file", config.getMappedFileSizeConsumeQueue());
        c.put("flush", config.getFlushDiskType().toString());
        c.put("message_index", config.isMessageIndexEnable());
        c.put("transient_store_pool", config.isTransientStorePoolEnable());
        c.put("warm_mapped_file", config.isWarmMapedFileEnable());
        out.put("config", c);
        // the broker's arrival listener (long polling) has nothing to wake here
        return new DefaultMessageStore(config, stats,
            (topic, queueId, logicOffset, tagsCode, msgStoreTime, filterBitMap, properties) -> { }, new BrokerConfig());
    }

    /** Loads the classes a store uses (and so opens their jars) before the baseline is taken. */
    static BrokerStatsManager warmClasses() throws ClassNotFoundException {
        for (Class<?> c : Arrays.asList(DefaultMessageStore.class, ConsumeQueue.class, MessageDecoder.class,
            MessageExtBrokerInner.class, GetMessageResult.class)) {
            Class.forName(c.getName(), true, ManyQueuesBench.class.getClassLoader());
        }
        Class.forName("org.apache.rocketmq.store.MappedFile");
        Class.forName("org.apache.rocketmq.store.CommitLog");
        return new BrokerStatsManager("bench", true);
    }

    static int write(Path dir, int topics, double stallSeconds, Map<String, Object> out) throws Exception {
        BrokerStatsManager stats = warmClasses();
        long[] base = proc();
        out.put("base", held(new long[] {0, 0, 0}, base));  // absolute, for the record
        long t0 = System.nanoTime();
        DefaultMessageStore store = newStore(dir, stats, out);
        if (!store.load()) {
            throw new IllegalStateException("DefaultMessageStore.load() failed in " + dir);
        }
        store.start();
        out.put("open_s", seconds(t0));
        int queues = topics * TOPIC_QUEUES;
        int putsOk = 0;
        String putError = null;
        t0 = System.nanoTime();
        outer:
        for (int i = 0; i < topics; i++) {
            String topic = "t" + i;
            for (int q = 0; q < TOPIC_QUEUES; q++) {
                MessageExtBrokerInner msg = new MessageExtBrokerInner();
                msg.setTopic(topic);
                msg.setQueueId(q);
                msg.setBody(BODY);
                msg.setPropertiesString("");
                msg.setTagsCode(0);
                msg.setBornTimestamp(System.currentTimeMillis());
                msg.setBornHost(BORN);
                msg.setStoreHost(STORE_HOST);
                PutMessageResult r = store.putMessage(msg);
                if (!r.isOk()) {
                    putError = "putMessage t" + i + "/" + q + ": " + r.getPutMessageStatus();
                    break outer;
                }
                putsOk++;
            }
        }
        out.put("put_s", seconds(t0));
        out.put("puts_ok", putsOk);
        // the ConsumeQueue entries are written by the store's ReputMessageService thread, behind the puts;
        // dispatchBehindBytes() is the CommitLog bytes it has not dispatched yet
        long behind = store.dispatchBehindBytes();
        long lastProgress = System.nanoTime();
        while (behind > 0) {
            Thread.sleep(1);
            long now = store.dispatchBehindBytes();
            if (now < behind) {
                behind = now;
                lastProgress = System.nanoTime();
            } else if (seconds(lastProgress) > stallSeconds) {
                break;
            }
        }
        out.put("put_dispatch_s", seconds(t0));
        out.put("dispatch_behind_bytes", behind);
        int dispatched = dispatchedQueues(store);
        out.put("queues_dispatched", dispatched);
        out.put("running_flags", store.getRunningFlags().getFlagBits());
        // a ConsumeQueue that cannot be written (its file not created or not mapped) is retried 30 times a second
        // apart, then the whole store is flagged "logics queue error" and later dispatches skip every queue
        out.put("logics_queue_error", store.getRunningFlags().isLogicsQueueError());
        if (putError != null || behind > 0 || dispatched != queues) {
            out.put("status", behind > 0 && putError == null ? "stalled" : "failed");
            out.put("error", putError != null ? putError
                : behind > 0 ? "dispatch made no progress for " + stallSeconds + " s"
                : "only " + dispatched + " of " + queues + " queues have their message in a ConsumeQueue");
        }
        out.put("us_per_queue", (double) out.get("put_dispatch_s") * 1e6 / Math.max(putsOk, 1));
        out.putAll(held(base, proc()));
        return close(store, base, out) && "ok".equals(out.get("status")) ? 0 : 3;
    }

    static int reopen(Path dir, int topics, Map<String, Object> out) throws Exception {
        BrokerStatsManager stats = warmClasses();
        long[] base = proc();
        out.put("base", held(new long[] {0, 0, 0}, base));  // absolute, for the record
        out.put("had_abort_file", Files.exists(dir.resolve("abort")));  // present: the last shutdown was not clean
        long t0 = System.nanoTime();
        DefaultMessageStore store = newStore(dir, stats, out);
        // load(): the CommitLog segments and every ConsumeQueue file are opened and mapped, then recovered
        boolean loaded = store.load();
        out.put("load_s", seconds(t0));
        if (!loaded) {
            out.put("status", "error");
            out.put("error", "DefaultMessageStore.load() returned false");
            out.putAll(held(base, proc()));
            close(store, base, out);
            return 3;
        }
        long t1 = System.nanoTime();
        store.start();
        out.put("start_s", seconds(t1));
        out.put("open_s", seconds(t0));
        out.put("after_open", held(base, proc()));
        t0 = System.nanoTime();
        int ok = 0;
        String readError = null;
        outer:
        for (int i = 0; i < topics; i++) {
            String topic = "t" + i;
            for (int q = 0; q < TOPIC_QUEUES; q++) {
                GetMessageResult r = store.getMessage("bench", topic, q, 0, 1, null);
                try {
                    if (r.getStatus() != GetMessageStatus.FOUND || r.getMessageBufferList().size() != 1
                        || !Arrays.equals(MessageDecoder.decode(r.getMessageBufferList().get(0), true, false)
                            .getBody(), BODY)) {
                        readError = topic + "/" + q + ": " + r.getStatus() + ", " + r.getMessageCount() + " messages";
                        break outer;
                    }
                } finally {
                    r.release();
                }
                ok++;
            }
        }
        out.put("read_all_s", seconds(t0));
        out.put("queues_read", ok);
        if (readError != null) {
            out.put("status", "error");
            out.put("error", "getMessage " + readError);
        }
        out.putAll(held(base, proc()));
        return close(store, base, out) && readError == null ? 0 : 3;
    }

    /** shutdown(), timed, on another thread so that a store stuck in a failed dispatch cannot hang the phase. */
    static boolean close(DefaultMessageStore store, long[] base, Map<String, Object> out) throws InterruptedException {
        long t0 = System.nanoTime();
        Thread t = new Thread(store::shutdown, "bench-shutdown");
        t.start();
        t.join(120_000);
        if (t.isAlive()) {
            out.put("close_error", "shutdown() did not return within 120 s");
            return false;
        }
        // shutdown() sleeps 1 s itself (after stopping its scheduled executors), then stops and flushes services
        out.put("close_s", seconds(t0));
        // the ConsumeQueue files stay open and mapped after shutdown(): only destroy() would release them
        out.put("after_close", held(base, proc()));
        return true;
    }

    static int dispatchedQueues(DefaultMessageStore store) {
        int n = 0;
        ConcurrentMap<String, ConcurrentMap<Integer, ConsumeQueue>> table = store.getConsumeQueueTable();
        for (ConcurrentMap<Integer, ConsumeQueue> byId : table.values()) {
            for (ConsumeQueue cq : byId.values()) {
                if (cq.getMaxOffsetInQueue() > 0) {
                    n++;
                }
            }
        }
        return n;
    }

    /** The soft RLIMIT_NOFILE of this process (the JVM raises it to the hard limit at start-up), -1 if unknown. */
    static long fdLimit() {
        try (Stream<String> s = Files.lines(Paths.get("/proc/self/limits"))) {
            return s.filter(l -> l.startsWith("Max open files")).mapToLong(l -> Long.parseLong(l.split("\\s+")[3]))
                .findFirst().orElse(-1);
        } catch (IOException | RuntimeException e) {
            return -1;
        }
    }

    static double seconds(long t0) {
        return (System.nanoTime() - t0) / 1e9;
    }

    /**
     * A descriptor opened before the baseline and closed when /proc can no longer be read for want of a descriptor
     * (the store took every one the limit allows), so that the figures can still be read; counted as held after.
     */
    static FileInputStream reserve;

    /** [descriptors, mappings, VmRSS KiB] of this process; -1 where /proc could not be read (no descriptor left). */
    static long[] proc() {
        long fds = -1;
        long maps = -1;
        long rss = -1;
        try {
            if (reserve == null) {
                reserve = new FileInputStream("/dev/null");
            }
            try (Stream<Path> s = Files.list(Paths.get("/proc/self/fd"))) {
                fds = s.count();
            } catch (IOException | RuntimeException e) {
                if (reserve.getFD().valid()) {
                    System.err.println("/proc/self/fd: " + e + "; the reserved descriptor released");
                    reserve.close();
                    try (Stream<Path> s = Files.list(Paths.get("/proc/self/fd"))) {
                        fds = s.count();
                    }
                }
            }
            if (fds >= 0 && !reserve.getFD().valid()) {
                fds++;  // the reserve, released, was part of the baseline
            }
        } catch (IOException | RuntimeException e) {
            System.err.println("/proc/self/fd: " + e);
        }
        try (Stream<String> s = Files.lines(Paths.get("/proc/self/maps"))) {
            maps = s.count();
        } catch (IOException | RuntimeException e) {
            System.err.println("/proc/self/maps: " + e);
        }
        try (Stream<String> s = Files.lines(Paths.get("/proc/self/status"))) {
            rss = s.filter(l -> l.startsWith("VmRSS:")).mapToLong(l -> Long.parseLong(l.split("\\s+")[1]))
                .findFirst().orElse(-1);
        } catch (IOException | RuntimeException e) {
            System.err.println("/proc/self/status: " + e);
        }
        return new long[] {fds, maps, rss};
    }

    static Map<String, Object> held(long[] base, long[] now) {
        Map<String, Object> m = new LinkedHashMap<>();
        String[] names = {"fds", "maps", "rss_kib"};
        for (int i = 0; i < 3; i++) {
            m.put(names[i], now[i] < 0 ? -1 : now[i] - base[i]);
        }
        return m;
    }

    /** A flat JSON object of numbers, booleans, strings and nested maps. */
    static String json(Map<String, Object> m) {
        StringBuilder s = new StringBuilder("{");
        for (Map.Entry<String, Object> e : m.entrySet()) {
            if (s.length() > 1) {
                s.append(", ");
            }
            s.append(quote(e.getKey())).append(": ");
            Object v = e.getValue();
            if (v instanceof Map) {
                @SuppressWarnings("unchecked")
                Map<String, Object> inner = (Map<String, Object>) v;
                s.append(json(inner));
            } else if (v instanceof Double) {
                s.append(String.format(Locale.ROOT, "%.6f", (Double) v));
            } else if (v instanceof Number || v instanceof Boolean) {
                s.append(v);
            } else {
                s.append(quote(String.valueOf(v)));
            }
        }
        return s.append("}").toString();
    }

    static String quote(String v) {
        StringBuilder s = new StringBuilder("\"");
        for (char c : v.toCharArray()) {
            if (c == '"' || c == '\\') {
                s.append('\\').append(c);
            } else if (c < 0x20) {
                s.append(String.format(Locale.ROOT, "\\u%04x", (int) c));
            } else {
                s.append(c);
            }
        }
        return s.append('"').toString();
    }
}
