package localmq.spark;

import java.nio.ByteBuffer;
import java.util.zip.CRC32;

/**
 * One CommitLog record (RocketMQ 4.x V1 or 5.x V2) parsed in place from a big-endian buffer: the fields the reader
 * needs and where the body, topic and properties lie. Written from docs/spec section 1 (rocketmq-store.md), the same
 * rules as localmq's C decoder {@code _record.parse_record}; one instance is reused record after record.
 */
final class CommitLogRecord {
    // magic codes (spec 1.4) and localmq's gap record (layout.py GAP_SIGNATURE: "LMQ.GAP!")
    static final int MESSAGE_MAGIC_CODE = 0xDAA320A7;
    static final int MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB;
    static final int BLANK_MAGIC_CODE = 0xCBD43194;
    static final long GAP_SIGNATURE = 0x4C4D512E47415021L;
    static final int GAP_RECORD_SIZE = 16;
    // field offsets (spec 1.1) and sizes
    static final int BODY_CRC = 8;
    static final int QUEUE_ID = 12;
    static final int FLAG = 16;
    static final int QUEUE_OFFSET = 20;
    static final int PHYSICAL_OFFSET = 28;
    static final int SYS_FLAG = 36;
    static final int BORN_TIMESTAMP = 40;
    static final int BORN_HOST = 48;
    static final int HOST_V4_SIZE = 8;
    static final int HOST_V6_SIZE = 20;
    /** A V1 record with IPv4 hosts and empty body, topic and properties. */
    static final int MIN_SIZE = 91;
    // sysflag bits (spec 1.3)
    static final int SYSFLAG_TRANSACTION_MASK = 0xC;
    static final int SYSFLAG_TRANSACTION_PREPARED = 0x4;
    static final int SYSFLAG_TRANSACTION_ROLLBACK = 0xC;
    static final int SYSFLAG_BORNHOST_V6 = 0x10;
    static final int SYSFLAG_STOREHOST_V6 = 0x20;

    /** Outcomes of {@link #parse}, as localmq's REC_* codes. */
    enum Status { OK, BLANK, END, TORN, BAD_MAGIC, BAD_LENGTH, BAD_CRC, GAP }

    int totalSize;
    int magic;
    int bodyCrc;
    int queueId;
    int flag;
    long queueOffset;
    int sysFlag;
    long bornTimestamp;
    long storeTimestamp;
    int storeHostPos;
    int storeHostLen;
    int reconsumeTimes;
    int bodyPos;
    int bodyLen;
    int topicPos;
    int topicLen;
    int propsPos;
    int propsLen;

    private final CRC32 crc = new CRC32();

    /**
     * Parse the record at {@code pos}, reading no byte at or past {@code end}.
     *
     * @param checkCrc verify the body CRC (CRC-32 masked with 0x7FFFFFFF, spec 1.6)
     * @return the outcome; {@link Status#GAP} and {@link Status#BLANK} set {@link #totalSize} only
     */
    Status parse(ByteBuffer buf, int pos, int end, boolean checkCrc) {
        int avail = end - pos;
        if (avail < 8) {
            for (int i = pos; i < end; i++) {
                if (buf.get(i) != 0) {
                    return Status.TORN;
                }
            }
            return Status.END;
        }
        totalSize = buf.getInt(pos);
        magic = buf.getInt(pos + 4);
        if (magic == BLANK_MAGIC_CODE) {
            // a gap record shares the blank magic (RocketMQ takes it for one) but carries localmq's signature and its
            // own length; a blank runs to the segment's end
            if (totalSize >= GAP_RECORD_SIZE && avail >= GAP_RECORD_SIZE && buf.getLong(pos + 8) == GAP_SIGNATURE) {
                return Status.GAP;
            }
            return Status.BLANK;
        }
        int topicLenSize;
        if (magic == MESSAGE_MAGIC_CODE) {
            topicLenSize = 1;
        } else if (magic == MESSAGE_MAGIC_CODE_V2) {
            topicLenSize = 2;
        } else {
            return totalSize == 0 && magic == 0 ? Status.END : Status.BAD_MAGIC;
        }
        if (totalSize < MIN_SIZE) {
            return Status.BAD_LENGTH;
        }
        if (totalSize > avail) {
            return Status.TORN;
        }
        bodyCrc = buf.getInt(pos + BODY_CRC);
        queueId = buf.getInt(pos + QUEUE_ID);
        flag = buf.getInt(pos + FLAG);
        queueOffset = buf.getLong(pos + QUEUE_OFFSET);
        sysFlag = buf.getInt(pos + SYS_FLAG);
        bornTimestamp = buf.getLong(pos + BORN_TIMESTAMP);
        int at = BORN_HOST + ((sysFlag & SYSFLAG_BORNHOST_V6) == 0 ? HOST_V4_SIZE : HOST_V6_SIZE);
        storeTimestamp = buf.getLong(pos + at);
        at += 8;
        storeHostPos = pos + at;
        storeHostLen = (sysFlag & SYSFLAG_STOREHOST_V6) == 0 ? HOST_V4_SIZE : HOST_V6_SIZE;
        at += storeHostLen;
        // what is left of the fixed part: reconsume times 4, prepared offset 8, body length 4, topic length 1 or 2
        if (at + 16 + topicLenSize > totalSize) {
            return Status.BAD_LENGTH;
        }
        reconsumeTimes = buf.getInt(pos + at);
        bodyLen = buf.getInt(pos + at + 12);
        at += 16;
        if (bodyLen < 0 || (long) at + bodyLen + topicLenSize + 2 > totalSize) {
            return Status.BAD_LENGTH;
        }
        bodyPos = pos + at;
        at += bodyLen;
        topicLen = topicLenSize == 1 ? buf.get(pos + at) : buf.getShort(pos + at);
        at += topicLenSize;
        if (topicLen < 0 || at + topicLen + 2 > totalSize) {
            return Status.BAD_LENGTH;
        }
        topicPos = pos + at;
        at += topicLen;
        propsLen = buf.getShort(pos + at);
        at += 2;
        if (propsLen < 0 || at + propsLen != totalSize) {
            return Status.BAD_LENGTH;
        }
        propsPos = pos + at;
        if (expectedSize() != totalSize) {
            return Status.BAD_LENGTH;
        }
        if (checkCrc) {
            crc.reset();
            crc.update(buf.slice(bodyPos, bodyLen));
            if ((int) (crc.getValue() & 0x7FFFFFFFL) != bodyCrc) {
                return Status.BAD_CRC;
            }
        }
        return Status.OK;
    }

    /** TOTALSIZE as the fields give it (spec 1.2, calMsgLength; a V2 topic length takes 2 bytes). */
    private long expectedSize() {
        long extra = magic == MESSAGE_MAGIC_CODE_V2 ? 1 : 0;
        if ((sysFlag & SYSFLAG_BORNHOST_V6) != 0) {
            extra += HOST_V6_SIZE - HOST_V4_SIZE;
        }
        if ((sysFlag & SYSFLAG_STOREHOST_V6) != 0) {
            extra += HOST_V6_SIZE - HOST_V4_SIZE;
        }
        return MIN_SIZE + extra + bodyLen + topicLen + propsLen;
    }

    /** A status as localmq's RecordStatus prints it ("bad crc", "torn", ...). */
    static String describe(Status st) {
        return st.name().toLowerCase(java.util.Locale.ROOT).replace('_', ' ');
    }

    /** Whether a dispatcher indexes this record: all but transactional PREPARED and ROLLBACK ones. */
    boolean dispatched() {
        int txn = sysFlag & SYSFLAG_TRANSACTION_MASK;
        return txn != SYSFLAG_TRANSACTION_PREPARED && txn != SYSFLAG_TRANSACTION_ROLLBACK;
    }
}
