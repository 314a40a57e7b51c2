package localmq.spark;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

/**
 * A partition's SQL92 filter on its rows, as the Python source's {@code _content_rows}: the expression on the
 * record's properties parsed as {@code _record.parse_properties} parses them (the bytes decoded as UTF-8, split on
 * 0x02, {@code name 0x01 value} pairs with both non-empty kept, a later pair of a name winning).
 */
final class SqlRows {
    private final Sql92Filter filter;
    private byte[] scratch = new byte[256];

    SqlRows(String sql) {
        this.filter = Sql92Filter.compile(sql);
    }

    boolean matches(ByteBuffer buf, CommitLogRecord rec) {
        if (scratch.length < rec.propsLen) {
            scratch = new byte[Math.max(rec.propsLen, scratch.length * 2)];
        }
        buf.get(rec.propsPos, scratch, 0, rec.propsLen);
        String raw = new String(scratch, 0, rec.propsLen, StandardCharsets.UTF_8);
        Map<String, String> props = new HashMap<>();
        for (String seg : raw.split("\u0002", -1)) {
            if (seg.length() < 3) {
                continue;
            }
            int i = seg.indexOf('\u0001');
            if (i > 0 && i < seg.length() - 1) {
                props.put(seg.substring(0, i), seg.substring(i + 1));
            }
        }
        return filter.matches(props);
    }
}
