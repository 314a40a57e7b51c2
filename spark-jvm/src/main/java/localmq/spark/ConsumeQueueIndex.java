package localmq.spark;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import org.apache.spark.storage.StorageUtils;

/**
 * The store's ConsumeQueues as a source of record boundaries, to cut a segment into several partitions (the Python
 * source's {@code StoreFiles.boundary_at}): every unit (commit log offset int64, size int32, tags code int64,
 * big-endian, 20 bytes) names where a record starts, and a queue's units rise with the log. Read on the driver,
 * read-only; closed after planning.
 */
final class ConsumeQueueIndex implements AutoCloseable {
    static final int UNIT_SIZE = 20;
    /** A padding unit a queue may start with (offset 0, this size). */
    static final int BLANK_UNIT_SIZE = 0x7FFFFFFF;

    private final List<MappedByteBuffer[]> queues = new ArrayList<>();

    ConsumeQueueIndex(File root) {
        File[] topics = new File(root, "consumequeue").listFiles(File::isDirectory);
        for (File topic : topics == null ? new File[0] : topics) {
            File[] qids = topic.listFiles(File::isDirectory);
            for (File q : qids == null ? new File[0] : qids) {
                File[] files = q.listFiles((d, n) -> n.length() == 20 && n.chars().allMatch(Character::isDigit));
                if (files == null || files.length == 0) {
                    continue;
                }
                Arrays.sort(files, (a, b) -> a.getName().compareTo(b.getName()));
                MappedByteBuffer[] maps = new MappedByteBuffer[files.length];
                for (int i = 0; i < files.length; i++) {
                    try (FileChannel ch = FileChannel.open(files[i].toPath(), StandardOpenOption.READ)) {
                        maps[i] = ch.map(FileChannel.MapMode.READ_ONLY, 0, ch.size() / UNIT_SIZE * UNIT_SIZE);
                    } catch (IOException e) {
                        throw new UncheckedIOException("cannot map consume queue file " + files[i], e);
                    }
                }
                queues.add(maps);
            }
        }
    }

    boolean isEmpty() {
        return queues.isEmpty();
    }

    /** The end of the furthest record the queues index (offset + size of their last units), or -1. */
    long indexedEnd() {
        long end = -1;
        for (MappedByteBuffer[] q : queues) {
            long n = count(q);
            int i = (int) Math.min(Integer.MAX_VALUE, firstAtOrAfter(q, Long.MAX_VALUE));
            if (i > 0 && i <= n) {
                long[] u = unit(q, i - 1);
                if (u[1] > 0 && u[1] != BLANK_UNIT_SIZE) {
                    end = Math.max(end, u[0] + u[1]);
                }
            }
        }
        return end;
    }

    /** The first record start at or after {@code target} that some queue indexes, or -1 when none does. */
    long boundaryAtOrAfter(long target) {
        long best = -1;
        for (MappedByteBuffer[] q : queues) {
            long i = firstAtOrAfter(q, target);
            if (i < count(q)) {
                long[] u = unit(q, i);
                if (u[1] > 0 && u[1] != BLANK_UNIT_SIZE && (best < 0 || u[0] < best)) {
                    best = u[0];
                }
            }
        }
        return best;
    }

    private static long count(MappedByteBuffer[] q) {
        long n = 0;
        for (MappedByteBuffer m : q) {
            n += m.limit() / UNIT_SIZE;
        }
        return n;
    }

    private static long[] unit(MappedByteBuffer[] q, long i) {
        for (MappedByteBuffer m : q) {
            long n = m.limit() / UNIT_SIZE;
            if (i < n) {
                int at = (int) (i * UNIT_SIZE);
                return new long[] {m.getLong(at), m.getInt(at + 8)};
            }
            i -= n;
        }
        throw new IndexOutOfBoundsException("unit " + i);
    }

    /** Index of the first unit whose offset is >= target; units past the written ones (size 0) count as beyond. */
    private static long firstAtOrAfter(MappedByteBuffer[] q, long target) {
        long lo = 0;
        long hi = count(q);
        while (lo < hi) {
            long mid = (lo + hi) >>> 1;
            long[] u = unit(q, mid);
            boolean after = u[1] <= 0 || (u[1] != BLANK_UNIT_SIZE && u[0] >= target);
            if (after) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        return lo;
    }

    @Override
    public void close() {
        for (MappedByteBuffer[] q : queues) {
            for (MappedByteBuffer m : q) {
                StorageUtils.dispose(m);
            }
        }
    }
}
