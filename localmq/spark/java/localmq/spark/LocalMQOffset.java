package localmq.spark;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.Map;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.read.streaming.Offset;

/**
 * A stream's position: the next queue offset of every queue, as JSON {@code {"topic": {"queueId": offset}}}, the
 * Python source's and Kafka's format, so that a checkpoint written by either reader resumes in the other.
 */
final class LocalMQOffset extends Offset {
    private static final ObjectMapper JSON = new ObjectMapper();

    /** {(topic, qid): next offset}, ordered by topic then queue id. */
    final TreeMap<QueueKey, Long> offsets;

    LocalMQOffset(Map<QueueKey, Long> offsets) {
        this.offsets = new TreeMap<>(offsets);
    }

    /** Parse an offset JSON (written by this reader or by the Python source). */
    static LocalMQOffset parse(String json) {
        TreeMap<QueueKey, Long> out = new TreeMap<>();
        try {
            JsonNode doc = JSON.readTree(json);
            for (Map.Entry<String, JsonNode> topic : doc.properties()) {
                for (Map.Entry<String, JsonNode> q : topic.getValue().properties()) {
                    out.put(new QueueKey(topic.getKey(), Integer.parseInt(q.getKey())), q.getValue().asLong());
                }
            }
        } catch (IOException | RuntimeException e) {
            throw new IllegalArgumentException("not a localmq stream offset (JSON {\"topic\": {\"queueId\": offset}}): "
                    + json, e);
        }
        return new LocalMQOffset(out);
    }

    @Override
    public String json() {
        ObjectNode doc = JSON.createObjectNode();
        for (Map.Entry<QueueKey, Long> e : offsets.entrySet()) {
            JsonNode t = doc.get(e.getKey().topic());
            ObjectNode queues = t == null ? doc.putObject(e.getKey().topic()) : (ObjectNode) t;
            queues.put(Integer.toString(e.getKey().queueId()), e.getValue());
        }
        try {
            return JSON.writeValueAsString(doc);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }
}
