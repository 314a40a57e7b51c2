package localmq.interop;

import com.alibaba.fastjson.JSON;
import com.alibaba.fastjson.JSONArray;
import com.alibaba.fastjson.JSONObject;
import com.alibaba.fastjson.serializer.SerializerFeature;
import java.io.File;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.SocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.Collection;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.MQVersion;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.constant.PermName;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.namesrv.NamesrvConfig;
import org.apache.rocketmq.namesrv.NamesrvController;
import org.apache.rocketmq.remoting.netty.NettyClientConfig;
import org.apache.rocketmq.remoting.netty.NettyServerConfig;
import org.apache.rocketmq.remoting.protocol.RemotingCommand;
import org.apache.rocketmq.store.config.FlushDiskType;
import org.apache.rocketmq.store.config.MessageStoreConfig;

/**
 * A NameServer and a Broker (RocketMQ 4.9.7) in one JVM on a store localmq wrote, for tests/interop (no RocketMQ
 * code is copied here: it calls RocketMQ's public classes).
 *
 * <pre>
 * &lt;storeDir&gt; &lt;workDir&gt; &lt;out.json&gt; &lt;expected&gt; &lt;produce&gt; &lt;seed&gt;
 * </pre>
 *
 * <ol>
 * <li>Starts a NameServer and a Broker on 127.0.0.1 (ports picked free here and printed), the Broker's
 *     storePathRootDir = storeDir, with the store harness's small segment sizes.</li>
 * <li>Declares every topic found under storeDir/consumequeue (as many queues as the highest queue id + 1), and one
 *     more topic for the producer, through the Broker's TopicConfigManager before initialize(): it writes them to
 *     storeDir/config/topics.json, which initialize() loads, so the Broker's first registration with the name server
 *     carries them (what `mqadmin updateTopic` does on a running Broker). localmq itself writes no broker
 *     configuration. autoCreateTopicEnable is off: no topic exists that was not declared here.</li>
 * <li>A DefaultLitePullConsumer (every queue assigned, each sought to offset 0) and then a DefaultMQPushConsumer
 *     (CONSUME_FROM_FIRST_OFFSET, every topic subscribed with "*") each read until they hold {@code expected}
 *     distinct messages.</li>
 * <li>Every key of the pulled messages is looked up through the Broker (queryMessage: its IndexFiles, which localmq
 *     wrote).</li>
 * <li>A DefaultMQProducer sends {@code produce} seeded messages, to the new topic and to a topic localmq wrote.</li>
 * <li>Everything shuts down cleanly, then out.json gets what each consumer received and what the producer sent.</li>
 * </ol>
 * A watchdog halts the JVM (exit 3) after {@code localmq.interop.timeoutSeconds} (default 100) seconds.
 */
public final class BrokerHarness {
    static final int COMMIT_LOG_SIZE = 64 * 1024;
    static final int CONSUME_QUEUE_SIZE = 20 * 300;
    static final int MAX_HASH_SLOT_NUM = 5000;
    static final int MAX_INDEX_NUM = 20000;
    static final String BROKER_NAME = "localmq-broker";
    static final String PRODUCED_TOPIC = "from_java";
    static final int PRODUCED_QUEUES = 2;
    static final String[] TAGS = {"sent", "tag with space", "ünïcode-✓"};

    private BrokerHarness() {
    }

    public static void main(String[] args) {
        // before any client class: the client logs through slf4j (logback.xml: warnings, stderr), not ~/logs
        System.setProperty("rocketmq.client.logUseSlf4j", "true");
        // as BrokerStartup and NamesrvStartup do: without it the Broker's requests carry version 0, and the name
        // server takes its registration for a pre-3.0.11 one and drops the topic table
        System.setProperty(RemotingCommand.REMOTING_VERSION_KEY, Integer.toString(MQVersion.CURRENT_VERSION));
        long timeout = Long.getLong("localmq.interop.timeoutSeconds", 100);
        Thread watchdog = new Thread(() -> {
            try {
                Thread.sleep(timeout * 1000);
            } catch (InterruptedException e) {
                return;
            }
            System.err.println("BrokerHarness: timed out after " + timeout + " s, halting");
            Runtime.getRuntime().halt(3);
        }, "watchdog");
        watchdog.setDaemon(true);
        watchdog.start();
        try {
            if (args.length != 6) {
                System.err.println("usage: <storeDir> <workDir> <out.json> <expected> <produce> <seed>");
                System.exit(2);
            }
            run(args[0], args[1], args[2], Integer.parseInt(args[3]), Integer.parseInt(args[4]),
                Long.parseLong(args[5]));
        } catch (Throwable t) {
            t.printStackTrace();
            System.exit(1);
        }
        // the broker's and the clients' executors are not all daemon threads
        System.exit(0);
    }

    static void step(String what) {
        System.out.println("BrokerHarness: " + what);
        System.out.flush();
    }

    /** A port nobody listens on now; the Broker also binds port - 2 (its "fast" server), so both are checked. */
    static int freePort(boolean withFast) throws Exception {
        for (int attempt = 0; attempt < 50; attempt++) {
            int port;
            try (ServerSocket s = new ServerSocket(0)) {
                port = s.getLocalPort();
            }
            if (!withFast) {
                return port;
            }
            try (ServerSocket s = new ServerSocket(port - 2)) {
                return port;
            } catch (java.io.IOException busy) {
                // try another
            }
        }
        throw new IllegalStateException("no free port pair found");
    }

    /** topic -> number of queues (highest queue id + 1) of every topic the store holds a ConsumeQueue for. */
    static Map<String, Integer> storedTopics(File root) {
        Map<String, Integer> topics = new TreeMap<>();
        File[] topicDirs = new File(root, "consumequeue").listFiles(File::isDirectory);
        for (File t : topicDirs == null ? new File[0] : topicDirs) {
            File[] qdirs = t.listFiles(File::isDirectory);
            int max = -1;
            for (File q : qdirs == null ? new File[0] : qdirs) {
                max = Math.max(max, Integer.parseInt(q.getName()));
            }
            if (max >= 0) {
                topics.put(t.getName(), max + 1);
            }
        }
        return topics;
    }

    static void run(String storeDir, String workDir, String outPath, int expected, int produce, long seed)
        throws Exception {
        File root = new File(storeDir);
        Map<String, Integer> topics = storedTopics(root);
        int namesrvPort = freePort(false);
        int brokerPort = freePort(true);
        String namesrvAddr = "127.0.0.1:" + namesrvPort;
        step("namesrv " + namesrvAddr + ", broker 127.0.0.1:" + brokerPort + ", topics " + topics);

        NamesrvConfig namesrvConfig = new NamesrvConfig();
        namesrvConfig.setRocketmqHome(workDir);
        namesrvConfig.setKvConfigPath(workDir + File.separator + "namesrv" + File.separator + "kvConfig.json");
        namesrvConfig.setConfigStorePath(workDir + File.separator + "namesrv" + File.separator + "namesrv.properties");
        NettyServerConfig namesrvNetty = new NettyServerConfig();
        namesrvNetty.setListenPort(namesrvPort);
        NamesrvController namesrv = new NamesrvController(namesrvConfig, namesrvNetty);
        if (!namesrv.initialize()) {
            throw new IllegalStateException("NamesrvController.initialize() failed");
        }
        namesrv.start();

        BrokerConfig brokerConfig = new BrokerConfig();
        brokerConfig.setRocketmqHome(workDir);
        brokerConfig.setBrokerClusterName("localmq");
        brokerConfig.setBrokerName(BROKER_NAME);
        brokerConfig.setBrokerIP1("127.0.0.1");
        brokerConfig.setBrokerIP2("127.0.0.1");
        brokerConfig.setNamesrvAddr(namesrvAddr);
        brokerConfig.setAutoCreateTopicEnable(false);
        NettyServerConfig brokerNetty = new NettyServerConfig();
        brokerNetty.setListenPort(brokerPort);
        MessageStoreConfig storeConfig = new MessageStoreConfig();
        storeConfig.setStorePathRootDir(storeDir);
        storeConfig.setStorePathCommitLog(storeDir + File.separator + "commitlog");
        storeConfig.setMappedFileSizeCommitLog(COMMIT_LOG_SIZE);
        storeConfig.setMappedFileSizeConsumeQueue(CONSUME_QUEUE_SIZE);
        storeConfig.setMaxHashSlotNum(MAX_HASH_SLOT_NUM);
        storeConfig.setMaxIndexNum(MAX_INDEX_NUM);
        storeConfig.setFlushDiskType(FlushDiskType.ASYNC_FLUSH);
        storeConfig.setHaListenPort(0);  // ephemeral: no slave connects
        BrokerController broker = new BrokerController(brokerConfig, brokerNetty, new NettyClientConfig(), storeConfig);
        int perm = PermName.PERM_READ | PermName.PERM_WRITE;
        for (Map.Entry<String, Integer> t : topics.entrySet()) {
            broker.getTopicConfigManager().updateTopicConfig(new TopicConfig(t.getKey(), t.getValue(), t.getValue(), perm));
        }
        broker.getTopicConfigManager().updateTopicConfig(new TopicConfig(PRODUCED_TOPIC, PRODUCED_QUEUES, PRODUCED_QUEUES, perm));
        if (!broker.initialize()) {
            throw new IllegalStateException("BrokerController.initialize() failed (store load) for " + storeDir);
        }
        broker.start();
        step("broker started");

        JSONObject out = new JSONObject(true);
        out.put("namesrvPort", namesrvPort);
        out.put("brokerPort", brokerPort);
        out.put("topics", topics);
        out.put("pulled", pull(namesrvAddr, topics, expected));
        step("pulled");
        out.put("pushed", push(namesrvAddr, topics, expected));
        step("pushed");
        out.put("queried", query(namesrvAddr, out.getJSONObject("pulled").getJSONArray("messages")));
        step("queried");
        out.put("produced", produce(namesrvAddr, produce, seed));
        step("produced");

        broker.shutdown();
        namesrv.shutdown();
        step("shut down");
        writeJson(outPath, out);
    }

    static JSONObject pull(String namesrvAddr, Map<String, Integer> topics, int expected) throws Exception {
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer("localmq_interop_pull");
        consumer.setNamesrvAddr(namesrvAddr);
        consumer.setInstanceName("pull");
        consumer.setAutoCommit(false);
        consumer.setPullBatchSize(32);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.start();
        Received got = new Received();
        try {
            List<MessageQueue> queues = new ArrayList<>();
            for (String topic : topics.keySet()) {
                queues.addAll(route(consumer, topic));
            }
            consumer.assign(queues);
            for (MessageQueue mq : queues) {
                consumer.seek(mq, 0);
            }
            long deadline = System.currentTimeMillis() + 30_000;
            while (got.distinct() < expected && System.currentTimeMillis() < deadline) {
                got.addAll(consumer.poll(500));
            }
            JSONObject o = got.toJson();
            o.put("queues", queues.size());
            return o;
        } finally {
            consumer.shutdown();
        }
    }

    /** The topic's queues as the name server routes them, waited for (the Broker registers while it starts). */
    static Collection<MessageQueue> route(DefaultLitePullConsumer consumer, String topic) throws Exception {
        long deadline = System.currentTimeMillis() + 20_000;
        while (true) {
            try {
                return consumer.fetchMessageQueues(topic);
            } catch (Exception e) {
                if (System.currentTimeMillis() > deadline) {
                    throw e;
                }
                Thread.sleep(200);
            }
        }
    }

    static JSONObject push(String namesrvAddr, Map<String, Integer> topics, int expected) throws Exception {
        DefaultMQPushConsumer consumer = new DefaultMQPushConsumer("localmq_interop_push");
        consumer.setNamesrvAddr(namesrvAddr);
        consumer.setInstanceName("push");
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        for (String topic : topics.keySet()) {
            consumer.subscribe(topic, "*");
        }
        Received got = new Received();
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
            got.addAll(msgs);
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
        });
        consumer.start();
        try {
            long deadline = System.currentTimeMillis() + 30_000;
            while (got.distinct() < expected && System.currentTimeMillis() < deadline) {
                Thread.sleep(50);
            }
            return got.toJson();
        } finally {
            consumer.shutdown();
        }
    }

    /**
     * Every (topic, key) of the pulled messages looked up through the Broker's index (its IndexFiles, which localmq
     * wrote): "topic/key" -> the commit log offsets found.
     */
    static JSONObject query(String namesrvAddr, JSONArray pulled) throws Exception {
        Map<String, List<String>> keys = new TreeMap<>();
        for (int i = 0; i < pulled.size(); i++) {
            JSONObject m = pulled.getJSONObject(i);
            String k = m.getString("keys");
            if (k != null) {
                for (String key : k.split(MessageConst.KEY_SEPARATOR)) {
                    keys.computeIfAbsent(m.getString("topic") + "/" + key, x -> new ArrayList<>());
                }
            }
        }
        DefaultMQProducer admin = new DefaultMQProducer("localmq_interop_query");
        admin.setNamesrvAddr(namesrvAddr);
        admin.setInstanceName("query");
        admin.start();
        JSONObject out = new JSONObject(true);
        try {
            for (String topicKey : keys.keySet()) {
                int slash = topicKey.indexOf('/');
                @SuppressWarnings("deprecation")
                List<MessageExt> found = admin.queryMessage(topicKey.substring(0, slash), topicKey.substring(slash + 1),
                    64, 0, Long.MAX_VALUE).getMessageList();
                JSONArray offsets = new JSONArray();
                for (MessageExt m : found) {
                    offsets.add(m.getCommitLogOffset());
                }
                out.put(topicKey, offsets);
            }
        } finally {
            admin.shutdown();
        }
        return out;
    }

    static JSONArray produce(String namesrvAddr, int count, long seed) throws Exception {
        DefaultMQProducer producer = new DefaultMQProducer("localmq_interop_producer");
        producer.setNamesrvAddr(namesrvAddr);
        producer.setInstanceName("producer");
        producer.start();
        Random rnd = new Random(seed);
        JSONArray sent = new JSONArray();
        try {
            for (int i = 0; i < count; i++) {
                // every other message to a topic localmq wrote (queue i % 4), the rest to the new topic
                String topic = i % 2 == 0 ? PRODUCED_TOPIC : "orders";
                int queueId = i % 2 == 0 ? (i / 2) % PRODUCED_QUEUES : (i / 2) % 4;
                byte[] body;
                if (i == 3) {
                    // over the producer's compressMsgBodyOverHowmuch (4 KiB): stored zlib-compressed, sysFlag bit 0
                    body = "compressible body ".repeat(400).getBytes(StandardCharsets.UTF_8);
                } else {
                    body = new byte[1 + rnd.nextInt(2000)];
                    rnd.nextBytes(body);
                }
                Message msg = new Message(topic, body);
                if (i % 5 != 0) {
                    msg.setTags(TAGS[i % TAGS.length]);
                }
                if (i % 3 == 0) {
                    msg.setKeys(Arrays.asList("j-" + i, "java-shared"));
                }
                if (i % 4 == 0) {
                    msg.putUserProperty("from", "java");
                    msg.putUserProperty("ünï_ñame", "välue ✓ =:;,\"'{}[] \t end 😀");
                    msg.putUserProperty("n", Integer.toString(i));
                }
                SendResult r = producer.send(msg, new MessageQueue(topic, BROKER_NAME, queueId), 10_000);
                JSONObject s = new JSONObject(true);
                s.put("sendStatus", r.getSendStatus().name());
                s.put("topic", r.getMessageQueue().getTopic());
                s.put("queueId", r.getMessageQueue().getQueueId());
                s.put("queueOffset", r.getQueueOffset());
                s.put("msgId", r.getMsgId());
                s.put("offsetMsgId", r.getOffsetMsgId());
                s.put("body", Base64.getEncoder().encodeToString(body));
                s.put("tags", msg.getTags());
                s.put("keys", msg.getKeys());
                s.put("userProperties", userProperties(msg.getProperties()));
                sent.add(s);
            }
        } finally {
            producer.shutdown();
        }
        return sent;
    }

    static Map<String, String> userProperties(Map<String, String> props) {
        Map<String, String> user = new TreeMap<>();
        if (props != null) {
            for (Map.Entry<String, String> e : props.entrySet()) {
                if (!MessageConst.STRING_HASH_SET.contains(e.getKey())) {
                    user.put(e.getKey(), e.getValue());
                }
            }
        }
        return user;
    }

    /** What one consumer received, keyed by (topic, queue id, queue offset); a redelivery is counted, not kept. */
    static final class Received {
        private final Map<String, JSONObject> messages = new LinkedHashMap<>();
        private final AtomicInteger deliveries = new AtomicInteger();

        synchronized void addAll(List<MessageExt> msgs) {
            for (MessageExt m : msgs) {
                deliveries.incrementAndGet();
                messages.putIfAbsent(m.getTopic() + "/" + m.getQueueId() + "/" + m.getQueueOffset(), describe(m));
            }
        }

        synchronized int distinct() {
            return messages.size();
        }

        synchronized JSONObject toJson() {
            JSONObject o = new JSONObject(true);
            o.put("deliveries", deliveries.get());
            o.put("messages", new JSONArray(new ArrayList<>(messages.values())));
            return o;
        }
    }

    static JSONObject describe(MessageExt m) {
        JSONObject o = new JSONObject(true);
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
        o.put("bornHost", hostString(m.getBornHost()));
        o.put("storeHost", hostString(m.getStoreHost()));
        o.put("reconsumeTimes", m.getReconsumeTimes());
        o.put("msgId", m.getMsgId());
        o.put("body", Base64.getEncoder().encodeToString(m.getBody() == null ? new byte[0] : m.getBody()));
        o.put("tags", m.getTags());
        o.put("keys", m.getKeys());
        o.put("userProperties", userProperties(m.getProperties()));
        o.put("properties", new TreeMap<>(m.getProperties() == null ? new LinkedHashMap<>() : m.getProperties()));
        return o;
    }

    static String hostString(SocketAddress a) {
        InetSocketAddress s = (InetSocketAddress) a;
        return s.getAddress().getHostAddress() + ":" + s.getPort();
    }

    static void writeJson(String path, JSONObject o) throws Exception {
        String s = JSON.toJSONString(o, SerializerFeature.PrettyFormat, SerializerFeature.WriteMapNullValue,
            SerializerFeature.BrowserCompatible);
        Files.write(Paths.get(path), s.getBytes(StandardCharsets.UTF_8));
    }
}
