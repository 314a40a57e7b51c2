package localmq.spark;

import java.io.Serializable;

/** One queue of a store: (topic, queue id), as the Python source's {@code Key}; ordered by topic, then queue id. */
record QueueKey(String topic, int queueId) implements Serializable, Comparable<QueueKey> {
    @Override
    public int compareTo(QueueKey o) {
        int c = topic.compareTo(o.topic);
        return c != 0 ? c : Integer.compare(queueId, o.queueId);
    }

    @Override
    public String toString() {
        return topic + "/" + queueId;
    }
}
