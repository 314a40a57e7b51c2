package localmq.spark;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.Set;

/**
 * A tag subscription's checks, as the Python source's {@code _content_rows} and {@code _tag_units}: a record's TAGS
 * property must be one of the names exactly (bytes compared; no TAGS, no match), and a ConsumeQueue unit may only
 * hold such a record when its tags code is one of the names' Java hash codes or a ConsumeQueueExt address.
 */
final class TagFilter {
    /** Tags codes at or below this are ConsumeQueueExt addresses, no hash code (layout.py CQ_EXT_ADDRESS_MAX). */
    static final long CQ_EXT_ADDRESS_MAX = -2147483649L;
    private static final byte[] TAGS = "TAGS".getBytes(StandardCharsets.UTF_8);

    private final byte[][] names;
    private final int[] codes;
    private final Properties props = new Properties();

    TagFilter(Set<String> tagNames) {
        names = new byte[tagNames.size()][];
        codes = new int[tagNames.size()];
        int i = 0;
        for (String t : tagNames) {
            names[i] = t.getBytes(StandardCharsets.UTF_8);
            codes[i++] = t.hashCode();
        }
    }

    /** Whether a unit of this tags code may hold a wanted record. */
    boolean unitMayMatch(long tagsCode) {
        if (tagsCode <= CQ_EXT_ADDRESS_MAX) {
            return true;
        }
        for (int c : codes) {
            if (c == (int) tagsCode) {
                return true;
            }
        }
        return false;
    }

    /** Whether the record just parsed into {@code rec} from {@code buf} has one of the wanted TAGS. */
    boolean matches(ByteBuffer buf, CommitLogRecord rec) {
        props.parse(buf, rec.propsPos, rec.propsLen);
        int i = props.find(TAGS);
        if (i < 0) {
            return false;
        }
        int at = props.valuePos(i);
        int len = props.valueLen(i);
        outer:
        for (byte[] n : names) {
            if (n.length != len) {
                continue;
            }
            for (int k = 0; k < len; k++) {
                if (buf.get(at + k) != n[k]) {
                    continue outer;
                }
            }
            return true;
        }
        return false;
    }
}
