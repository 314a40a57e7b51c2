package localmq.spark;

import java.nio.ByteBuffer;

/**
 * The kept {@code name 0x01 value} pairs of one record's properties string, by RocketMQ's parsing rules (spec 1.7):
 * split on 0x02; a segment shorter than 3 bytes is skipped, and one whose first 0x01 is its first or last byte
 * (an empty name or value) is dropped. Positions point into the segment buffer; reused record after record.
 */
final class Properties {
    private int[] spans = new int[64];  // per pair: key position, key length, value position, value length
    private int count;
    private ByteBuffer buf;

    /** Parse the {@code len} bytes at {@code at} of {@code buf}. */
    void parse(ByteBuffer buf, int at, int len) {
        this.buf = buf;
        count = 0;
        int stop = at + len;
        int s = at;
        while (s < stop) {
            int end = s;
            while (end < stop && buf.get(end) != 2) {
                end++;
            }
            if (end - s >= 3) {
                int sep = s;
                while (sep < end && buf.get(sep) != 1) {
                    sep++;
                }
                if (sep > s && sep < end - 1) {
                    add(s, sep - s, sep + 1, end - sep - 1);
                }
            }
            s = end + 1;
        }
    }

    private void add(int keyPos, int keyLen, int valuePos, int valueLen) {
        if (count * 4 + 4 > spans.length) {
            spans = java.util.Arrays.copyOf(spans, spans.length * 2);
        }
        spans[count * 4] = keyPos;
        spans[count * 4 + 1] = keyLen;
        spans[count * 4 + 2] = valuePos;
        spans[count * 4 + 3] = valueLen;
        count++;
    }

    int count() {
        return count;
    }

    int keyPos(int i) {
        return spans[i * 4];
    }

    int keyLen(int i) {
        return spans[i * 4 + 1];
    }

    int valuePos(int i) {
        return spans[i * 4 + 2];
    }

    int valueLen(int i) {
        return spans[i * 4 + 3];
    }

    /** The index of the first pair named {@code name}, or -1. */
    int find(byte[] name) {
        outer:
        for (int i = 0; i < count; i++) {
            if (keyLen(i) != name.length) {
                continue;
            }
            int p = keyPos(i);
            for (int j = 0; j < name.length; j++) {
                if (buf.get(p + j) != name[j]) {
                    continue outer;
                }
            }
            return i;
        }
        return -1;
    }
}
