package localmq.interop;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import com.alibaba.fastjson.serializer.SerializerFeature;
import java.io.File;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.QueryMessageResult;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * Drives RocketMQ 4.9.8's own DefaultMessageStore for tests/interop (no RocketMQ code is copied here).
 *
 * <pre>
 * write &lt;storeDir&gt; &lt;manifest.json&gt; &lt;seed&gt;   put a seeded workload, read it back, write the manifest
 * read  &lt;storeDir&gt; &lt;out.json&gt; [topic key]...  recover a store (load + start), read every queue, query keys
 * </pre>
 *
 * Both modes use the same small sizes: 64 KiB CommitLog segments, 300-unit ConsumeQueue files, 5,000 hash slots
 * and 20,000 items per IndexFile (localmq's side of the tests opens its stores with the same sizes).
 */
public final class StoreHarness {
    static final int COMMIT_LOG_SIZE = 64 * 1024;
    static final int CONSUME_QUEUE_SIZE = 20 * 300;
    static final int MAX_HASH_SLOT_NUM = 5000;
    static final int MAX_INDEX_NUM = 20000;
    static final String[] TOPICS = {"orders", "audit_log-1", "T%RETRY%x"};
    static final String[] TAGS = {"created", "paid", "tag with space", "ünïcode-✓"};
    static final String GROUP = "interop";

    private StoreHarness() {
    }

    public static void main(String[] args) {
        try {
            run(args);
        } catch (Throwable t) {
            t.printStackTrace();
            System.exit(1);
        }
        // the store's executors (BrokerStatsThread...) are not daemon threads
        System.exit(0);
    }

    static void run(String[] args) throws Exception {
        if (args.length >= 4 && args[0].equals("write")) {
            write(args[1], args[2], Long.parseLong(args[3]));
        } else if (args.length >= 3 && args[0].equals("read")) {
            read(args[1], args[2], Arrays.copyOfRange(args, 3, args.length));
        } else {
            System.err.println("usage: write <storeDir> <manifest.json> <seed> | read <storeDir> <out.json> [topic key]...");
            System.exit(2);
        }
    }

    static DefaultMessageStore open(String dir) throws Exception {
        MessageStoreConfig config = new MessageStoreConfig();
        config.setStorePathRootDir(dir);
        config.setStorePathCommitLog(dir + File.separator + "commitlog");
        config.setMappedFileSizeCommitLog(COMMIT_LOG_SIZE);
        config.setMappedFileSizeConsumeQueue(CONSUME_QUEUE_SIZE);
        config.setMaxHashSlotNum(MAX_HASH_SLOT_NUM);
        config.setMaxIndexNum(MAX_INDEX_NUM);
        config.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);
        config.setHaListenPort(0);  // an ephemeral port: two harnesses may run at once
        DefaultMessageStore store = new DefaultMessageStore(config, new BrokerStatsManager("interop", true),
            (topic, queueId, logicOffset, tagsCode, msgStoreTime, filterBitMap, properties) -> { }, new BrokerConfig());
        if (!store.load()) {
            // RocketMQ logs the reason nowhere here: list the files (a segment of another length fails load)
            StringBuilder files = new StringBuilder();
            try (java.util.stream.Stream<java.nio.file.Path> walk = Files.walk(Paths.get(dir))) {
                walk.filter(Files::isRegularFile).forEach(f -> files.append('\n').append(f).append(' ').append(f.toFile().length()));
            }
            throw new IllegalStateException("DefaultMessageStore.load() failed for " + dir + files);
        }
        store.start();
        return store;
    }

    static void waitDispatched(DefaultMessageStore store) throws InterruptedException {
        long deadline = System.currentTimeMillis() + 30_000;
        while (store.dispatchBehindBytes() > 0) {
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("dispatch did not catch up: " + store.dispatchBehindBytes() + " bytes behind");
            }
            Thread.sleep(5);
        }
    }

    static byte[] body(Random rnd, int i) {
        int size;
        if (i == 5) {
            size = 0;
        } else if (i == 7) {
            size = 20 * 1024;
        } else {
            size = rnd.nextInt(3000);
        }
        byte[] b = new byte[size];
        rnd.nextBytes(b);
        return b;
    }

    static void write(String dir, String manifestPath, long seed) throws Exception {
        Random rnd = new Random(seed);
        DefaultMessageStore store = open(dir);
        JSONArray puts = new JSONArray();
        int count = 240;
        for (int i = 0; i < count; i++) {
            MessageExtBrokerInner msg = new MessageExtBrokerInner();
            String topic = TOPICS[rnd.nextInt(TOPICS.length)];
            int queueId = rnd.nextInt(4);
            msg.setTopic(topic);
            msg.setQueueId(queueId);
            msg.setBody(body(rnd, i));
            msg.setFlag(0);
            if (i % 5 != 0) {
                msg.setTags(TAGS[rnd.nextInt(TAGS.length)]);
            }
            if (i % 3 == 0) {
                msg.setKeys(i % 6 == 0 ? "k-" + i : "k-" + i + " shared-key");
            }
            if (i % 4 == 0) {
                msg.putUserProperty("color", i % 8 == 0 ? "red" : "blue");
                msg.putUserProperty("ünï_ñame", "välue ✓ =:;,\"'{}[] \t end 😀");
                msg.putUserProperty("n", Integer.toString(i));
            }
            msg.setPropertiesString(MessageDecoder.messageProperties2String(msg.getProperties()));
            msg.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(msg.getTags()));
            msg.setBornTimestamp(1_700_000_000_000L + i);
            msg.setBornHost(new InetSocketAddress("10.0.0." + (1 + i % 200), 40000 + i));
            msg.setStoreHost(new InetSocketAddress("192.168.1.7", 10911));
            msg.setSysFlag(0);
            msg.setReconsumeTimes(0);
            PutMessageResult r = store.putMessage(msg);
            if (!r.isOk()) {
                throw new IllegalStateException("put " + i + " failed: " + r);
            }
            JSONObject p = new JSONObject(true);
            p.put("status", r.getPutMessageStatus().name());
            p.put("topic", topic);
            p.put("queueId", queueId);
            p.put("queueOffset", r.getAppendMessageResult().getLogicsOffset());
            p.put("commitLogOffset", r.getAppendMessageResult().getWroteOffset());
            p.put("storeSize", r.getAppendMessageResult().getWroteBytes());
            p.put("msgId", r.getAppendMessageResult().getMsgId());
            puts.add(p);
        }
        waitDispatched(store);
        JSONArray messages = new JSONArray();
        for (int i = 0; i < count; i++) {
            JSONObject p = puts.getJSONObject(i);
            List<JSONObject> got = readQueue(store, p.getString("topic"), p.getIntValue("queueId"),
                p.getLongValue("queueOffset"), 1);
            if (got.size() != 1) {
                throw new IllegalStateException("message " + i + " not read back: " + got);
            }
            JSONObject m = got.get(0);
            m.put("put", p);
            messages.add(m);
        }
        store.shutdown();
        JSONObject out = new JSONObject(true);
        out.put("seed", seed);
        out.put("mappedFileSizeCommitLog", COMMIT_LOG_SIZE);
        out.put("mappedFileSizeConsumeQueue", CONSUME_QUEUE_SIZE);
        out.put("maxHashSlotNum", MAX_HASH_SLOT_NUM);
        out.put("maxIndexNum", MAX_INDEX_NUM);
        out.put("messages", messages);
        writeJson(manifestPath, out);
    }

    static void read(String dir, String outPath, String[] keys) throws Exception {
        DefaultMessageStore store = open(dir);
        waitDispatched(store);
        JSONObject queues = new JSONObject(true);
        File[] topicDirs = new File(dir, "consumequeue").listFiles(File::isDirectory);
        Arrays.sort(topicDirs == null ? new File[0] : topicDirs);
        for (File topicDir : topicDirs == null ? new File[0] : topicDirs) {
            File[] qdirs = topicDir.listFiles(File::isDirectory);
            Map<Integer, File> byId = new TreeMap<>();
            for (File q : qdirs == null ? new File[0] : qdirs) {
                byId.put(Integer.parseInt(q.getName()), q);
            }
            for (int queueId : byId.keySet()) {
                String topic = topicDir.getName();
                long min = store.getMinOffsetInQueue(topic, queueId);
                long max = store.getMaxOffsetInQueue(topic, queueId);
                JSONObject q = new JSONObject(true);
                q.put("minOffset", min);
                q.put("maxOffset", max);
                q.put("messages", readQueue(store, topic, queueId, min, max - min));
                queues.put(topic + "/" + queueId, q);
            }
        }
        JSONObject queried = new JSONObject(true);
        for (int i = 0; i + 1 < keys.length; i += 2) {
            QueryMessageResult r = store.queryMessage(keys[i], keys[i + 1], 64, 0, Long.MAX_VALUE);
            JSONArray offsets = new JSONArray();
            for (ByteBuffer b : r.getMessageBufferList()) {
                offsets.add(MessageDecoder.decode(b, false, false).getCommitLogOffset());
            }
            r.release();
            queried.put(keys[i] + "/" + keys[i + 1], offsets);
        }
        JSONObject out = new JSONObject(true);
        out.put("maxPhyOffset", store.getMaxPhyOffset());
        out.put("queues", queues);
        out.put("queried", queried);
        store.shutdown();
        writeJson(outPath, out);
    }

    /** Reads up to count messages of one queue from offset with getMessage; stops early at a status other than FOUND. */
    static List<JSONObject> readQueue(DefaultMessageStore store, String topic, int queueId, long offset, long count) {
        List<JSONObject> out = new ArrayList<>();
        long next = offset;
        while (out.size() < count) {
            GetMessageResult r = store.getMessage(GROUP, topic, queueId, next, 32, null);
            try {
                if (r.getMessageBufferList().isEmpty()) {
                    JSONObject stop = new JSONObject(true);
                    stop.put("getStatus", r.getStatus().name());
                    stop.put("queueOffset", next);
                    out.add(stop);
                    break;
                }
                for (ByteBuffer b : r.getMessageBufferList()) {
                    if (out.size() < count) {
                        out.add(describe(MessageDecoder.decode(b, true, false), r.getStatus().name()));
                    }
                }
                next = r.getNextBeginOffset();
            } finally {
                r.release();
            }
        }
        return out;
    }

    static JSONObject describe(MessageExt m, String status) {
        JSONObject o = new JSONObject(true);
        o.put("getStatus", status);
        o.put("topic", m.getTopic());
        o.put("queueId", m.getQueueId());
        o.put("queueOffset", m.getQueueOffset());
        o.put("commitLogOffset", m.getCommitLogOffset());
        o.put("storeSize", m.getStoreSize());
        o.put("bodyCRC", Integer.toUnsignedLong(m.getBodyCRC()));
        o.put("flag", m.getFlag());
        o.put("sysFlag", m.getSysFlag());
        o.put("bornTimestamp", m.getBornTimestamp());
        o.put("storeTimestamp", m.getStoreTimestamp());
        o.put("bornHost", hostString((InetSocketAddress) m.getBornHost()));
        o.put("storeHost", hostString((InetSocketAddress) m.getStoreHost()));
        o.put("reconsumeTimes", m.getReconsumeTimes());
        o.put("preparedTransactionOffset", m.getPreparedTransactionOffset());
        o.put("body", Base64.getEncoder().encodeToString(m.getBody() == null ? new byte[0] : m.getBody()));
        o.put("tags", m.getTags());
        o.put("keys", m.getKeys());
        o.put("properties", new TreeMap<>(m.getProperties() == null ? new LinkedHashMap<>() : m.getProperties()));
        return o;
    }

    static String hostString(InetSocketAddress a) {
        return a.getAddress().getHostAddress() + ":" + a.getPort();
    }

    static void writeJson(String path, JSONObject o) throws Exception {
        String s = JSON.toJSONString(o, SerializerFeature.PrettyFormat, SerializerFeature.WriteMapNullValue,
            SerializerFeature.BrowserCompatible);
        Files.write(Paths.get(path), s.getBytes(StandardCharsets.UTF_8));
    }
}
