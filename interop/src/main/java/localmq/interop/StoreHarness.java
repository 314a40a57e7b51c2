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
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageExtBatch;
import org.apache.rocketmq.common.sysflag.MessageSysFlag;
import org.apache.rocketmq.store.ConsumeQueue;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.MessageExtBrokerInner;
import org.apache.rocketmq.store.PutMessageResult;
import org.apache.rocketmq.store.QueryMessageResult;
import org.apache.rocketmq.store.SelectMappedBufferResult;
import org.apache.rocketmq.store.config.BrokerRole;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;
import org.apache.rocketmq.store.stats.BrokerStatsManager;

/**
 * Drives RocketMQ 4.9.8's own DefaultMessageStore for tests/interop (no RocketMQ code is copied here).
 *
 * <pre>
 * write &lt;storeDir&gt; &lt;manifest.json&gt; &lt;seed&gt;   put a seeded workload (plain, IPv6 hosts, batches, delayed
 *                                            messages partly delivered by RocketMQ's ScheduleMessageService, retry
 *                                            and dead-letter send-backs), reopen, read every queue, write the manifest
 * read  &lt;storeDir&gt; &lt;out.json&gt; [topic key]...  recover a store (load + start), read every queue (its messages
 *                                            and ConsumeQueue units), query keys
 * flood &lt;storeDir&gt;                           put messages until killed, printing "put N" after every 100 (the
 *                                            crash tests SIGKILL it mid-run and look at the store it leaves)
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
    /**
     * The IndexFile geometry: -Dlocalmq.interop.index=default gives RocketMQ's own default (5,000,000 hash slots,
     * 20,000,000 items: what a broker with default settings maps), =SLOTS/ITEMS another one; without it the small
     * one above.
     */
    static final String INDEX = System.getProperty("localmq.interop.index", "");
    static final boolean DEFAULT_INDEX = "default".equals(INDEX);
    static final int INDEX_SLOTS = INDEX.contains("/") ? Integer.parseInt(INDEX.split("/")[0]) : MAX_HASH_SLOT_NUM;
    static final int INDEX_ITEMS = INDEX.contains("/") ? Integer.parseInt(INDEX.split("/")[1]) : MAX_INDEX_NUM;
    static final String[] TOPICS = {"orders", "audit_log-1", "T%RETRY%x"};
    static final String[] TAGS = {"created", "paid", "tag with space", "ünïcode-✓"};
    static final String GROUP = "interop";
    /** The consumer group whose send-backs (retry and dead-letter records) the write workload holds. */
    static final String GROUP_RETRY = "billing";
    static final String BATCH_TOPIC = "batched";
    static final String DELAYED_TOPIC = "remind";
    /** Short levels, so RocketMQ's ScheduleMessageService delivers level 1 during the run and not level 2. */
    static final String DELAY_LEVELS = "1s 5s";

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
        } else if (args.length >= 2 && args[0].equals("flood")) {
            flood(args[1]);
        } else {
            System.err.println("usage: write <storeDir> <manifest.json> <seed> | read <storeDir> <out.json> [topic key]..."
                + " | flood <storeDir>");
            System.exit(2);
        }
    }

    static DefaultMessageStore open(String dir, String delayLevels) throws Exception {
        MessageStoreConfig config = new MessageStoreConfig();
        if (delayLevels != null) {
            config.setMessageDelayLevel(delayLevels);
        }
        config.setStorePathRootDir(dir);
        config.setStorePathCommitLog(dir + File.separator + "commitlog");
        config.setMappedFileSizeCommitLog(COMMIT_LOG_SIZE);
        config.setMappedFileSizeConsumeQueue(CONSUME_QUEUE_SIZE);
        if (!DEFAULT_INDEX) {
            config.setMaxHashSlotNum(INDEX_SLOTS);
            config.setMaxIndexNum(INDEX_ITEMS);
        }
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

    static InetSocketAddress v6(String addr, int port) throws Exception {
        return new InetSocketAddress(java.net.InetAddress.getByName(addr), port);
    }

    /** Fills the fields a broker sets on a single put (properties string and tags code from the properties). */
    static void seal(MessageExtBrokerInner msg) {
        msg.setPropertiesString(MessageDecoder.messageProperties2String(msg.getProperties()));
        msg.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(msg.getTags()));
    }

    static JSONObject put(DefaultMessageStore store, MessageExtBrokerInner msg, String kind) {
        String topic = msg.getTopic();  // before the store rewrites a delayed message's topic and queue
        int queueId = msg.getQueueId();
        PutMessageResult r = store.putMessage(msg);
        if (!r.isOk()) {
            throw new IllegalStateException("put of a " + kind + " message to " + topic + " failed: " + r);
        }
        return putResult(r, kind, topic, queueId);
    }

    static JSONObject putResult(PutMessageResult r, String kind, String topic, int queueId) {
        JSONObject p = new JSONObject(true);
        p.put("kind", kind);
        p.put("status", r.getPutMessageStatus().name());
        p.put("topic", topic);
        p.put("queueId", queueId);
        p.put("queueOffset", r.getAppendMessageResult().getLogicsOffset());
        p.put("commitLogOffset", r.getAppendMessageResult().getWroteOffset());
        p.put("storeSize", r.getAppendMessageResult().getWroteBytes());
        p.put("msgNum", r.getAppendMessageResult().getMsgNum());
        p.put("msgId", r.getAppendMessageResult().getMsgId());
        return p;
    }

    /** A broker's consumer send-back of msg (semantics 1.2): to %RETRY%group with DELAY=level, or to %DLQ%group. */
    static MessageExtBrokerInner sendBack(MessageExtBrokerInner old, String oldMsgId, String group, int reconsumeTimes,
                                          int delayLevel) {
        MessageExtBrokerInner m = new MessageExtBrokerInner();
        boolean dlq = delayLevel <= 0;
        m.setTopic((dlq ? "%DLQ%" : "%RETRY%") + group);
        m.setQueueId(0);
        m.setBody(old.getBody());
        m.setFlag(old.getFlag());
        MessageAccessor.setProperties(m, new java.util.HashMap<>(old.getProperties()));
        MessageAccessor.putProperty(m, "RETRY_TOPIC", old.getTopic());
        MessageAccessor.putProperty(m, "WAIT", "false");
        MessageAccessor.putProperty(m, "ORIGIN_MESSAGE_ID", oldMsgId);
        MessageAccessor.putProperty(m, "DELAY", Integer.toString(dlq ? 0 : delayLevel));
        m.setSysFlag(old.getSysFlag());
        m.setBornTimestamp(old.getBornTimestamp());
        m.setBornHost(old.getBornHost());
        m.setStoreHost(old.getStoreHost());
        m.setReconsumeTimes(reconsumeTimes);
        seal(m);
        return m;
    }

    static MessageExtBrokerInner delayed(Random rnd, int n, int level) throws Exception {
        MessageExtBrokerInner m = new MessageExtBrokerInner();
        m.setTopic(DELAYED_TOPIC);
        m.setQueueId(n % 2);
        byte[] b = new byte[20 + rnd.nextInt(400)];
        rnd.nextBytes(b);
        m.setBody(b);
        m.setFlag(n % 3);
        m.setTags("remind");
        m.setKeys("d-" + n);
        m.putUserProperty("n", Integer.toString(n));
        m.setDelayTimeLevel(level);
        m.setBornTimestamp(1_700_000_100_000L + n);
        m.setSysFlag(0);
        if (n % 4 == 1) {
            m.setBornHost(v6("2001:db8::d:" + n, 41000 + n));
            m.setStoreHost(v6("2001:db8:0:7::1", 10911));
            m.setBornHostV6Flag();
            m.setStoreHostAddressV6Flag();
        } else {
            m.setBornHost(new InetSocketAddress("10.0.1." + (1 + n), 41000 + n));
            m.setStoreHost(new InetSocketAddress("192.168.1.7", 10911));
        }
        seal(m);
        return m;
    }

    /** A transactional producer's half message as the broker stores it: REAL_TOPIC/REAL_QID, NOT_TYPE sysflag. */
    static MessageExtBrokerInner transactional(Random rnd, int n) throws Exception {
        MessageExtBrokerInner m = new MessageExtBrokerInner();
        m.setTopic("RMQ_SYS_TRANS_HALF_TOPIC");
        m.setQueueId(0);
        byte[] b = new byte[10 + rnd.nextInt(300)];
        rnd.nextBytes(b);
        m.setBody(b);
        m.setFlag(0);
        m.setTags("tx");
        m.setKeys("tx-" + n);
        MessageAccessor.putProperty(m, "TRAN_MSG", "true");
        MessageAccessor.putProperty(m, "PGROUP", "tx-producers");
        MessageAccessor.putProperty(m, "UNIQ_KEY", String.format("0A0000020000%020X", n));
        MessageAccessor.putProperty(m, "WAIT", "true");
        MessageAccessor.putProperty(m, "REAL_TOPIC", "payments");
        MessageAccessor.putProperty(m, "REAL_QID", Integer.toString(n % 2));
        m.setBornTimestamp(1_700_000_300_000L + n);
        if (n == 1) {
            m.setBornHost(v6("2001:db8::7:" + n, 43000 + n));
            m.setBornHostV6Flag();
        } else {
            m.setBornHost(new InetSocketAddress("10.0.3." + (1 + n), 43000 + n));
        }
        m.setStoreHost(new InetSocketAddress("192.168.1.7", 10911));
        m.setSysFlag(MessageSysFlag.resetTransactionValue(m.getSysFlag(), MessageSysFlag.TRANSACTION_NOT_TYPE));
        seal(m);
        return m;
    }

    /** A MessageExtBatch as 4.9.8's SendMessageProcessor.asyncSendBatchMessage builds one from a client's batch. */
    static MessageExtBatch batch(Random rnd, int n, boolean ipv6) throws Exception {
        List<Message> list = new ArrayList<>();
        int size = 1 + rnd.nextInt(6);
        for (int j = 0; j < size; j++) {
            byte[] b = new byte[j == 0 && n == 1 ? 0 : rnd.nextInt(1500)];
            rnd.nextBytes(b);
            Message m = new Message(BATCH_TOPIC, j % 2 == 0 ? "batched" : null, "b-" + n + "-" + j, b);
            m.setFlag(j);
            m.putUserProperty("j", Integer.toString(j));
            if (j % 2 == 1) {
                m.putUserProperty("ünï", "v ✓ " + j);
            }
            MessageAccessor.putProperty(m, "UNIQ_KEY", String.format("0A000001%08X%016X", n, j + 0x1000L * n));
            list.add(m);
        }
        MessageExtBatch batch = new MessageExtBatch();
        batch.setTopic(BATCH_TOPIC);
        batch.setQueueId(n % 2);
        batch.setSysFlag(0);
        batch.setFlag(0);
        batch.setBody(MessageDecoder.encodeMessages(list));
        batch.setBornTimestamp(1_700_000_200_000L + n);
        if (ipv6) {
            batch.setBornHost(v6("2001:db8::b:" + n, 42000 + n));
            batch.setBornHostV6Flag();
            batch.setStoreHost(v6("2001:db8:0:7::1", 10911));
            batch.setStoreHostAddressV6Flag();
        } else {
            batch.setBornHost(new InetSocketAddress("10.0.2." + (1 + n), 42000 + n));
            batch.setStoreHost(new InetSocketAddress("192.168.1.7", 10911));
        }
        batch.setReconsumeTimes(0);
        MessageAccessor.putProperty(batch, "CLUSTER", "interop-cluster");  // the broker adds its cluster name
        return batch;
    }

    static void write(String dir, String manifestPath, long seed) throws Exception {
        Random rnd = new Random(seed);
        DefaultMessageStore store = open(dir, DELAY_LEVELS);
        store.handleScheduleMessageService(BrokerRole.ASYNC_MASTER);  // RocketMQ's own ScheduleMessageService runs
        JSONArray puts = new JSONArray();
        List<MessageExtBrokerInner> orders = new ArrayList<>();
        List<String> orderIds = new ArrayList<>();
        int count = 240;
        for (int i = 0; i < count; i++) {
            MessageExtBrokerInner msg = new MessageExtBrokerInner();
            String topic = TOPICS[rnd.nextInt(TOPICS.length)];
            int queueId = rnd.nextInt(4);
            msg.setTopic(topic);
            msg.setQueueId(queueId);
            msg.setBody(body(rnd, i));
            msg.setFlag(i % 10 == 9 ? i : 0);
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
            msg.setBornTimestamp(1_700_000_000_000L + i);
            msg.setSysFlag(0);
            // IPv6 born hosts on every 7th message, IPv6 store hosts on every 11th (both on some)
            if (i % 7 == 3) {
                msg.setBornHost(v6("2001:db8::" + Integer.toHexString(i), 40000 + i));
                msg.setBornHostV6Flag();
            } else {
                msg.setBornHost(new InetSocketAddress("10.0.0." + (1 + i % 200), 40000 + i));
            }
            if (i % 11 == 3) {
                msg.setStoreHost(v6("fd00::7:" + Integer.toHexString(i), 10911));
                msg.setStoreHostAddressV6Flag();
            } else {
                msg.setStoreHost(new InetSocketAddress("192.168.1.7", 10911));
            }
            msg.setReconsumeTimes(0);
            seal(msg);
            JSONObject p = put(store, msg, "plain");
            if (topic.equals("orders")) {
                orders.add(msg);
                orderIds.add(p.getString("msgId"));
            }
            puts.add(p);
        }
        // batches, as a broker stores a client's MessageBatch: one put, consecutive records and queue offsets
        for (int n = 0; n < 8; n++) {
            MessageExtBatch b = batch(rnd, n, n % 3 == 2);
            PutMessageResult r = store.putMessages(b);
            if (!r.isOk()) {
                throw new IllegalStateException("batch " + n + " failed: " + r);
            }
            puts.add(putResult(r, "batch", BATCH_TOPIC, b.getQueueId()));
        }
        // delayed messages (level 1: delivered by RocketMQ below), retries (send-backs) of three orders
        int early = 0;
        for (int n = 0; n < 5; n++) {
            puts.add(put(store, delayed(rnd, n, 1), "delayed"));
            early++;
        }
        for (int n = 0; n < 3; n++) {
            puts.add(put(store, sendBack(orders.get(n), orderIds.get(n), GROUP_RETRY, 1, 1), "retry"));
            early++;
        }
        // dead letters: the broker path (reconsume times past the maximum: DELAY=0, no schedule detour)
        for (int n = 3; n < 5; n++) {
            puts.add(put(store, sendBack(orders.get(n), orderIds.get(n), GROUP_RETRY, 17, 0), "dlq"));
        }
        // transactions as a 4.9.8 broker stores them (semantics 4.3, 4.4): half records; commits (0, 1) with their
        // real record and an op record, a rollback (2) with its op record only, one left pending (3)
        for (int n = 0; n < 4; n++) {
            MessageExtBrokerInner half = transactional(rnd, n);
            JSONObject hp = put(store, half, "half");
            puts.add(hp);
            if (n < 2) {
                MessageExtBrokerInner c = new MessageExtBrokerInner();
                c.setTopic(half.getProperty("REAL_TOPIC"));
                c.setQueueId(Integer.parseInt(half.getProperty("REAL_QID")));
                c.setBody(half.getBody());
                c.setFlag(half.getFlag());
                c.setBornTimestamp(half.getBornTimestamp());
                c.setBornHost(half.getBornHost());
                c.setStoreHost(half.getStoreHost());
                c.setReconsumeTimes(half.getReconsumeTimes());
                c.setSysFlag(MessageSysFlag.resetTransactionValue(half.getSysFlag(), MessageSysFlag.TRANSACTION_COMMIT_TYPE));
                c.setPreparedTransactionOffset(hp.getLongValue("commitLogOffset"));
                MessageAccessor.setProperties(c, new java.util.HashMap<>(half.getProperties()));
                c.setPropertiesString(half.getPropertiesString());  // the half record's string, unchanged
                c.setTagsCode(MessageExtBrokerInner.tagsString2tagsCode(c.getTags()));
                puts.add(put(store, c, "commit"));
            }
            if (n < 3) {
                MessageExtBrokerInner op = new MessageExtBrokerInner();
                op.setTopic("RMQ_SYS_TRANS_OP_HALF_TOPIC");
                op.setQueueId(0);
                op.setBody(Long.toString(hp.getLongValue("queueOffset")).getBytes(StandardCharsets.UTF_8));
                op.setTags("d");
                MessageAccessor.putProperty(op, "WAIT", "true");
                op.setBornTimestamp(1_700_000_400_000L + n);
                op.setBornHost(new InetSocketAddress("192.168.1.7", 10911));
                op.setStoreHost(new InetSocketAddress("192.168.1.7", 10911));
                op.setSysFlag(0);
                seal(op);
                puts.add(put(store, op, "op"));
            }
        }
        long deadline = System.currentTimeMillis() + 30_000;
        while (delayOffset(store, 1) < early) {
            if (System.currentTimeMillis() > deadline) {
                throw new IllegalStateException("level 1 not delivered: " + store.getScheduleMessageService().encode());
            }
            Thread.sleep(20);
        }
        // level 2 (5 s): still waiting when the store shuts down, a few seconds later; level 9 is clamped to 2 by the store
        for (int n = 5; n < 9; n++) {
            puts.add(put(store, delayed(rnd, n, n == 8 ? 9 : 2), "delayed"));
        }
        for (int n = 5; n < 7; n++) {
            puts.add(put(store, sendBack(orders.get(n), orderIds.get(n), GROUP_RETRY, 1, 2), "retry"));
        }
        waitDispatched(store);
        // the broker's ConsumerOffsetManager file (config/consumerOffset.json): the group has read all of orders
        Map<String, Map<Integer, Long>> offsets = new TreeMap<>();
        Map<Integer, Long> ordersOffsets = new TreeMap<>();
        for (int q = 0; q < 4; q++) {
            ordersOffsets.put(q, store.getMaxOffsetInQueue("orders", q));
        }
        offsets.put("orders@" + GROUP_RETRY, ordersOffsets);
        store.shutdown();
        Files.write(Paths.get(dir, "config", "consumerOffset.json"),
            ("{\"offsetTable\":" + JSON.toJSONString(offsets) + "}").getBytes(StandardCharsets.UTF_8));

        // reopened without the schedule service: every record of every queue as RocketMQ reads it
        store = open(dir, DELAY_LEVELS);
        waitDispatched(store);
        JSONObject queues = readAll(store, dir, true);
        JSONObject queried = new JSONObject(true);
        for (Object qo : queues.values()) {
            for (Object mo : ((JSONObject) qo).getJSONArray("messages")) {
                JSONObject m = (JSONObject) mo;
                List<String> keys = new ArrayList<>();
                if (m.getString("keys") != null) {
                    keys.addAll(Arrays.asList(m.getString("keys").split(" ")));
                }
                String uniq = m.getJSONObject("properties").getString("UNIQ_KEY");
                if (uniq != null) {
                    keys.add(uniq);
                }
                for (String k : keys) {
                    String name = m.getString("topic") + "/" + k;
                    if (!queried.containsKey(name)) {
                        queried.put(name, query(store, m.getString("topic"), k));
                    }
                }
            }
        }
        long maxPhy = store.getMaxPhyOffset();
        store.shutdown();
        JSONObject out = new JSONObject(true);
        out.put("seed", seed);
        out.put("mappedFileSizeCommitLog", COMMIT_LOG_SIZE);
        out.put("mappedFileSizeConsumeQueue", CONSUME_QUEUE_SIZE);
        out.put("maxHashSlotNum", DEFAULT_INDEX ? new MessageStoreConfig().getMaxHashSlotNum() : INDEX_SLOTS);
        out.put("maxIndexNum", DEFAULT_INDEX ? new MessageStoreConfig().getMaxIndexNum() : INDEX_ITEMS);
        out.put("messageDelayLevel", DELAY_LEVELS);
        out.put("maxPhyOffset", maxPhy);
        out.put("delayOffset", JSON.parseObject(new String(Files.readAllBytes(Paths.get(dir, "config", "delayOffset.json")),
            StandardCharsets.UTF_8)));
        out.put("puts", puts);
        out.put("queues", queues);
        out.put("queried", queried);
        writeJson(manifestPath, out);
    }

    static long delayOffset(DefaultMessageStore store, int level) {
        JSONObject table = JSON.parseObject(store.getScheduleMessageService().encode()).getJSONObject("offsetTable");
        return table == null || table.getLong(Integer.toString(level)) == null ? 0 : table.getLong(Integer.toString(level));
    }

    static JSONArray query(DefaultMessageStore store, String topic, String key) {
        QueryMessageResult r = store.queryMessage(topic, key, 64, 0, Long.MAX_VALUE);
        JSONArray offsets = new JSONArray();
        for (ByteBuffer b : r.getMessageBufferList()) {
            offsets.add(MessageDecoder.decode(b, false, false).getCommitLogOffset());
        }
        r.release();
        return offsets;
    }

    /** Every queue of the store (consumequeue/ directories): min/max offsets, its messages, optionally its units. */
    static JSONObject readAll(DefaultMessageStore store, String dir, boolean units) {
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
                if (units) {
                    q.put("units", units(store.findConsumeQueue(topic, queueId), min, max));
                }
                queues.put(topic + "/" + queueId, q);
            }
        }
        return queues;
    }

    /** The ConsumeQueue units [commit-log offset, size, tags code] from min to max, as RocketMQ's ConsumeQueue has them. */
    static JSONArray units(ConsumeQueue cq, long min, long max) {
        JSONArray out = new JSONArray();
        for (long i = min; i < max; i++) {
            SelectMappedBufferResult r = cq.getIndexBuffer(i);
            try {
                ByteBuffer b = r.getByteBuffer();
                JSONArray u = new JSONArray();
                u.add(b.getLong());
                u.add(b.getInt());
                u.add(b.getLong());
                out.add(u);
            } finally {
                r.release();
            }
        }
        return out;
    }

    /** Puts messages of random sizes to two topics x 4 queues, with keys, until the process is killed. */
    static void flood(String dir) throws Exception {
        Random rnd = new Random(7);
        DefaultMessageStore store = open(dir, null);
        for (int i = 0; ; i++) {
            MessageExtBrokerInner msg = new MessageExtBrokerInner();
            msg.setTopic(TOPICS[i % 2]);
            msg.setQueueId(i % 4);
            msg.setBody(body(rnd, i));
            msg.setTags(TAGS[i % TAGS.length]);
            msg.setKeys("flood-" + i);
            msg.setBornTimestamp(System.currentTimeMillis());
            msg.setBornHost(new InetSocketAddress("10.0.0.1", 40000));
            msg.setStoreHost(new InetSocketAddress("10.0.0.2", 10911));
            seal(msg);
            put(store, msg, "flood");
            if (i % 100 == 99) {
                System.out.println("put " + (i + 1));
                System.out.flush();
            }
        }
    }

    static void read(String dir, String outPath, String[] keys) throws Exception {
        DefaultMessageStore store = open(dir, null);
        waitDispatched(store);
        JSONObject queues = readAll(store, dir, true);
        JSONObject queried = new JSONObject(true);
        for (int i = 0; i + 1 < keys.length; i += 2) {
            queried.put(keys[i] + "/" + keys[i + 1], query(store, keys[i], keys[i + 1]));
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
        o.put("msgId", m.getMsgId());  // MessageDecoder's offset message id (store host + commit-log offset)
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

    /** "ip:port", or "[ipv6]:port" (Java's uncompressed text of the address: compare parsed addresses). */
    static String hostString(InetSocketAddress a) {
        if (a.getAddress() instanceof java.net.Inet6Address) {
            return "[" + a.getAddress().getHostAddress() + "]:" + a.getPort();
        }
        return a.getAddress().getHostAddress() + ":" + a.getPort();
    }

    static void writeJson(String path, JSONObject o) throws Exception {
        String s = JSON.toJSONString(o, SerializerFeature.PrettyFormat, SerializerFeature.WriteMapNullValue,
            SerializerFeature.BrowserCompatible);
        Files.write(Paths.get(path), s.getBytes(StandardCharsets.UTF_8));
    }
}
