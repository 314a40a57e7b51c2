package localmq.interop5;

import java.io.File;
import java.io.PrintWriter;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Base64;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageExtBrokerInner;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.GetMessageStatus;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.QueryMessageResult;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * Drives RocketMQ 5.3.1's own DefaultMessageStore for tests/interop/test_rocketmq5_v2.py (no RocketMQ code is copied
 * here). Default record settings: autoMessageVersionOnTopicLen=true, so a topic over 127 characters is stored as a
 * V2 record; maxTopicLength is raised to 255 (its default, 127, refuses such a topic at put).
 *
 * <pre>
 * write &lt;storeDir&gt; &lt;out.tsv&gt; &lt;count&gt; &lt;topic&gt;...  put count messages round-robin over the topics and queues
 *                                                   0..1 (KEYS k&lt;i&gt;, TAGS t&lt;i%3&gt;), one line per put
 * read  &lt;storeDir&gt; &lt;out.tsv&gt; &lt;topic&gt;...            recover (load + start), read queues 0..7 of every topic,
 *                                                   query every key k&lt;i&gt; found; one line per message / query
 * </pre>
 * With {@code -Dlocalmq.interop5.propCRC=true} the store has enabledAppendPropCRC on (the 5.x {@code __CRC32#} tail).
 * Lines: {@code M topic queueId queueOffset commitLogOffset storeSize base64(body) keys tags} and
 * {@code Q topic key hits}. 64 KiB CommitLog segments, 300-unit ConsumeQueue files, 5,000 slots / 20,000 items
 * (RocketMQ's defaults with -Dlocalmq.interop.index=default).
 */
public final class Store5Harness {
    static final int COMMIT_LOG_SIZE = 64 * 1024;
    static final int CONSUME_QUEUE_SIZE = 20 * 300;
    /** -Dlocalmq.interop.index=default: RocketMQ's default IndexFile geometry (5,000,000 slots, 20,000,000 items). */
    static final boolean DEFAULT_INDEX = "default".equals(System.getProperty("localmq.interop.index", ""));

    private Store5Harness() {
    }

    public static void main(String[] args) {
        try {
            if (args.length >= 4 && args[0].equals("write")) {
                write(args[1], args[2], Integer.parseInt(args[3]), java.util.Arrays.copyOfRange(args, 4, args.length));
            } else if (args.length >= 3 && args[0].equals("read")) {
                read(args[1], args[2], java.util.Arrays.copyOfRange(args, 3, args.length));
            } else {
                System.err.println("usage: write <dir> <out.tsv> <count> <topic>... | read <dir> <out.tsv> <topic>...");
                System.exit(2);
            }
        } catch (Throwable t) {
            t.printStackTrace();
            System.exit(1);
        }
        System.exit(0);  // the store's executors are not daemon threads
    }

    static DefaultMessageStore open(String dir) throws Exception {
        MessageStoreConfig config = new MessageStoreConfig();
        config.setStorePathRootDir(dir);
        config.setStorePathCommitLog(dir + File.separator + "commitlog");
        config.setMappedFileSizeCommitLog(COMMIT_LOG_SIZE);
        config.setMappedFileSizeConsumeQueue(CONSUME_QUEUE_SIZE);
        if (!DEFAULT_INDEX) {
            config.setMaxHashSlotNum(5000);
            config.setMaxIndexNum(20000);
        }
        config.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);
        config.setHaListenPort(0);
        config.setMaxTopicLength(255);
        // -Dlocalmq.interop5.propCRC=true: RocketMQ appends its __CRC32# property tail to every record it writes
        config.setEnabledAppendPropCRC(Boolean.getBoolean("localmq.interop5.propCRC"));
        DefaultMessageStore store = new DefaultMessageStore(config, new BrokerStatsManager("interop5", true),
            (topic, queueId, logicOffset, tagsCode, msgStoreTime, filterBitMap, properties) -> { }, new BrokerConfig(),
            new ConcurrentHashMap<>());
        if (!store.load()) {
            throw new IllegalStateException("DefaultMessageStore.load() failed for " + dir);
        }
        store.start();
        return store;
    }

    static void waitDispatched(DefaultMessageStore store) throws InterruptedException {
        long deadline = System.currentTimeMillis() + 30_000;
        while (store.dispatchBehindBytes() > 0) {
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("dispatch did not catch up");
            }
            Thread.sleep(5);
        }
        Thread.sleep(500);  // the index service builds the index files after dispatch
    }

    static String line(MessageExt m, String topic) {
        String keys = m.getKeys() == null ? "" : m.getKeys();
        String tags = m.getTags() == null ? "" : m.getTags();
        return "M\t" + topic + "\t" + m.getQueueId() + "\t" + m.getQueueOffset() + "\t" + m.getCommitLogOffset() + "\t"
            + m.getStoreSize() + "\t" + Base64.getEncoder().encodeToString(m.getBody()) + "\t" + keys + "\t" + tags;
    }

    static void write(String dir, String out, int count, String[] topics) throws Exception {
        DefaultMessageStore store = open(dir);
        try (PrintWriter w = new PrintWriter(out, StandardCharsets.UTF_8)) {
            for (int i = 0; i < count; i++) {
                MessageExtBrokerInner msg = new MessageExtBrokerInner();
                String topic = topics[i % topics.length];
                msg.setTopic(topic);
                msg.setQueueId((i / topics.length) % 2);
                msg.setBody(("rocketmq5-" + i + "-").repeat(1 + i % 7).getBytes(StandardCharsets.UTF_8));
                msg.setKeys("k" + i);
                msg.setTags("t" + (i % 3));
                msg.setBornTimestamp(System.currentTimeMillis());
                msg.setBornHost(new InetSocketAddress("127.0.0.1", 40000));
                msg.setStoreHost(new InetSocketAddress("127.0.0.1", 10911));
                msg.setPropertiesString(MessageDecoder.messageProperties2String(msg.getProperties()));
                msg.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(msg.getTags()));
                PutMessageResult r = store.putMessage(msg);
                if (!r.isOk()) {
                    throw new IllegalStateException("put " + i + " to " + topic + " failed: " + r);
                }
                w.println("P\t" + topic + "\t" + msg.getQueueId() + "\t" + r.getAppendMessageResult().getLogicsOffset()
                    + "\t" + r.getAppendMessageResult().getWroteOffset() + "\t" + r.getAppendMessageResult().getWroteBytes()
                    + "\t" + Base64.getEncoder().encodeToString(msg.getBody()) + "\t" + msg.getKeys() + "\t" + msg.getTags());
            }
            waitDispatched(store);
        } finally {
            store.shutdown();
        }
    }

    static void read(String dir, String out, String[] topics) throws Exception {
        DefaultMessageStore store = open(dir);
        try (PrintWriter w = new PrintWriter(out, StandardCharsets.UTF_8)) {
            waitDispatched(store);
            for (String topic : topics) {
                java.util.List<String> keys = new java.util.ArrayList<>();
                for (int q = 0; q < 8; q++) {
                    long offset = 0;
                    while (true) {
                        GetMessageResult r = store.getMessage("interop5", topic, q, offset, 32, null);
                        if (r == null || r.getStatus() != GetMessageStatus.FOUND) {
                            if (r != null) {
                                offset = r.getNextBeginOffset();
                            }
                            if (r != null && r.getStatus() == GetMessageStatus.MESSAGE_WAS_REMOVING) {
                                continue;
                            }
                            break;
                        }
                        for (ByteBuffer bb : r.getMessageBufferList()) {
                            MessageExt m = MessageDecoder.decode(bb, true, false);
                            if (m == null) {
                                throw new IllegalStateException("undecodable record in " + topic + "-" + q);
                            }
                            w.println(line(m, topic));
                            if (m.getKeys() != null) {
                                keys.add(m.getKeys());
                            }
                        }
                        offset = r.getNextBeginOffset();
                        r.release();
                    }
                }
                for (String key : keys) {
                    QueryMessageResult qr = store.queryMessage(topic, key, 32, 0, Long.MAX_VALUE);
                    w.println("Q\t" + topic + "\t" + key + "\t" + qr.getMessageBufferList().size());
                    qr.release();
                }
            }
        } finally {
            store.shutdown();
        }
    }
}
