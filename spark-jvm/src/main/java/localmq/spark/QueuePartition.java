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

    QueuePartition(String topic, int queueId, String cqPath, String commitlog, long segmentSize, long start, long end) {
        this.topic = topic;
        this.queueId = queueId;
        this.cqPath = cqPath;
        this.commitlog = commitlog;
        this.segmentSize = segmentSize;
        this.start = start;
        this.end = end;
    }

    @Override
    public String toString() {
        return "QueuePartition(" + topic + "/" + queueId + " [" + start + ", " + end + "))";
    }
}
