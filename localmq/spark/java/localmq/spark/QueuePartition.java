package localmq.spark;

import org.apache.spark.sql.connector.read.InputPartition;

/**
 * Queue offsets [start, end) of one (topic, queue id), read through its ConsumeQueue: each unit's record, checked
 * against the unit (size, queue id, offset), as the Python source's {@code QueueRange}.
 */
final class QueuePartition implements InputPartition {
    private static final long serialVersionUID = 1L;

    final String topic;
    final int queueId;
    /** The queue's directory. */
    final String cqPath;
    /** The store's commitlog directory. */
    final String commitlog;
    final long segmentSize;
    final long start;
    final long end;
    /** Rows whose TAGS is one of these (null: every row); units are first dropped by their tags code. */
    final java.util.Set<String> tagNames;
    /** Rows whose properties match this SQL92 expression (null: every row). */
    final String sql;

    QueuePartition(String topic, int queueId, String cqPath, String commitlog, long segmentSize, long start, long end,
                   java.util.Set<String> tagNames, String sql) {
        this.topic = topic;
        this.queueId = queueId;
        this.cqPath = cqPath;
        this.commitlog = commitlog;
        this.segmentSize = segmentSize;
        this.start = start;
        this.end = end;
        this.tagNames = tagNames;
        this.sql = sql;
    }

    @Override
    public String toString() {
        return "QueuePartition(" + topic + "/" + queueId + " [" + start + ", " + end + "))";
    }
}
