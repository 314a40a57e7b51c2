package localmq.spark;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

/**
 * One ConsumeQueue read with positional reads (no mapping, no lock), as the Python source's
 * {@code store/files.py ConsumeQueueFiles}: offsets, binary searches, units. A unit is the commit log offset
 * (int64), the record's size (int32) and a tags code (int64), big-endian, 20 bytes; a padding unit (size
 * 0x7FFFFFFF) may start a queue.
 */
final class ConsumeQueueFiles {
    static final int UNIT_SIZE = 20;
    static final int BLANK_UNIT_SIZE = 0x7FFFFFFF;

    final String topic;
    final int queueId;
    final String path;
    /** The largest file's size. */
    final long fileSize;
    /** Base (bytes) and path of the non-empty files, by base. */
    final long[] bases;
    final String[] paths;

    ConsumeQueueFiles(String topic, int queueId, File dir) {
        this.topic = topic;
        this.queueId = queueId;
        this.path = dir.getPath();
        File[] found = dir.listFiles((d, n) -> n.length() == 20 && n.chars().allMatch(Character::isDigit));
        List<File> files = new ArrayList<>(Arrays.asList(found == null ? new File[0] : found));
        files.removeIf(f -> !f.isFile());
        files.sort((a, b) -> a.getName().compareTo(b.getName()));
        long size = 0;
        List<File> nonEmpty = new ArrayList<>();
        for (File f : files) {
            size = Math.max(size, f.length());
            if (f.length() > 0) {
                nonEmpty.add(f);
            }
        }
        fileSize = size;
        bases = new long[nonEmpty.size()];
        paths = new String[nonEmpty.size()];
        for (int i = 0; i < bases.length; i++) {
            bases[i] = Long.parseLong(nonEmpty.get(i).getName());
            paths[i] = nonEmpty.get(i).getPath();
            if (bases[i] % UNIT_SIZE != 0) {
                throw new IllegalStateException("consume queue file " + paths[i] + ": name is not a multiple of "
                        + UNIT_SIZE);
            }
        }
    }

    boolean hasFiles() {
        return bases.length > 0;
    }

    /** Index into bases/paths of the file holding unit {@code index}, or -1. */
    int fileOf(long index) {
        if (bases.length == 0 || fileSize <= 0) {
            return -1;
        }
        long logical = index * UNIT_SIZE;
        long i = Math.floorDiv(logical - bases[0], fileSize);
        if (i >= 0 && i < bases.length && bases[(int) i] <= logical && logical < bases[(int) i] + fileSize) {
            return (int) i;
        }
        for (int k = 0; k < bases.length; k++) {  // names that do not follow the file size: search them
            if (bases[k] <= logical && logical < bases[k] + fileSize) {
                return k;
            }
        }
        return -1;
    }

    /** The queue offset of the first file's first unit (0 without files). */
    long firstIndex() {
        return bases.length > 0 ? bases[0] / UNIT_SIZE : 0;
    }

    /**
     * {commit log offset, size} of unit {@code index}; null when its file is gone or it is past the end.
     */
    long[] unit(long index) {
        int f = fileOf(index);
        if (f < 0) {
            return null;
        }
        ByteBuffer b = read(paths[f], index * UNIT_SIZE - bases[f], 12);
        return b == null || b.remaining() < 12 ? null : new long[] {b.getLong(0), b.getInt(8)};
    }

    /**
     * The units [first, stop) of one file as a big-endian buffer of 20-byte units (fewer when the file is short),
     * or null when the file holding {@code first} is gone; {@code stop} is capped at that file's end.
     */
    ByteBuffer units(long first, long stop) {
        int f = fileOf(first);
        if (f < 0) {
            return null;
        }
        long end = Math.min(stop, (bases[f] + fileSize) / UNIT_SIZE);
        ByteBuffer b = read(paths[f], first * UNIT_SIZE - bases[f], (int) ((end - first) * UNIT_SIZE));
        return b == null ? ByteBuffer.allocate(0) : b;
    }

    /** The end of the run of units of the file holding {@code first}, capped at {@code stop}; the next file's first
     * unit when no file holds it. */
    long runEnd(long first, long stop) {
        int f = fileOf(first);
        if (f >= 0) {
            return Math.min(stop, (bases[f] + fileSize) / UNIT_SIZE);
        }
        for (long b : bases) {
            if (b / UNIT_SIZE > first) {
                return Math.min(stop, b / UNIT_SIZE);
            }
        }
        return stop;
    }

    private static ByteBuffer read(String file, long at, int len) {
        try (FileChannel ch = FileChannel.open(new File(file).toPath(), StandardOpenOption.READ)) {
            ByteBuffer b = ByteBuffer.allocate(len);
            while (b.hasRemaining()) {
                int n = ch.read(b, at + b.position());
                if (n < 0) {
                    break;
                }
            }
            b.flip();
            return b;
        } catch (NoSuchFileException e) {
            return null;
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read consume queue file " + file, e);
        }
    }

    /** Units written in one file: a valid prefix (offset >= 0, size > 0) followed by zeros. */
    private long countValid(int f) {
        long lo = 0;
        long hi = fileSize / UNIT_SIZE;
        while (lo < hi) {
            long mid = (lo + hi) >>> 1;
            ByteBuffer b = read(paths[f], mid * UNIT_SIZE, 12);
            if (b != null && b.remaining() >= 12 && b.getLong(0) >= 0 && b.getInt(8) > 0) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo;
    }

    /** The queue offset after the last written unit. */
    long maxOffset() {
        for (int f = bases.length - 1; f >= 0; f--) {
            long n = countValid(f);
            if (n > 0) {
                return bases[f] / UNIT_SIZE + n;
            }
        }
        return firstIndex();
    }

    /** The first queue offset whose record is still in the commit log (and not a padding unit). */
    long minOffset(long commitlogMin, long maxOffset) {
        if (bases.length == 0) {
            return 0;
        }
        long lo = firstIndex();
        long hi = maxOffset;
        while (lo < hi) {
            long mid = (lo + hi) >>> 1;
            long[] u = unit(mid);
            if (u == null || u[1] == BLANK_UNIT_SIZE || u[0] < commitlogMin) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo;
    }

    /** The queue offset after the last unit whose record ends at or below {@code physBound}. */
    long offsetBefore(long physBound, long maxOffset) {
        long lo = firstIndex();
        long hi = maxOffset;
        while (lo < hi) {
            long mid = (lo + hi) >>> 1;
            long[] u = unit(mid);
            if (u != null && u[1] != BLANK_UNIT_SIZE && u[0] + u[1] > physBound) {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        return lo;
    }

    /** Commit log offset of the first unit at or after {@code phys}, or -1. */
    long firstUnitAtOrAfter(long phys) {
        long max = maxOffset();
        long lo = firstIndex();
        long hi = max;
        while (lo < hi) {
            long mid = (lo + hi) >>> 1;
            long[] u = unit(mid);
            if (u == null || u[1] == BLANK_UNIT_SIZE || u[0] < phys) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        long[] u = lo < max ? unit(lo) : null;
        return u == null ? -1 : u[0];
    }

    /** The first queue offset in [lo, hi) whose record's store time is >= {@code ts} ({@code hi} when none). */
    long offsetForTime(StoreFiles store, long ts, long lo, long hi) {
        while (lo < hi) {
            long mid = (lo + hi) >>> 1;
            long[] u = unit(mid);
            Long t = u == null ? null : store.storeTimestamp(u[0]);
            if (t == null || t < ts) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        return lo;
    }

    /** Commit log offset just after the record of unit {@code offset - 1} (0 for an empty range). */
    long endPhys(long offset) {
        long[] u = offset > 0 ? unit(offset - 1) : null;
        return u == null ? 0 : u[0] + u[1];
    }
}
