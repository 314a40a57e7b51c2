package localmq.spark;

import java.io.File;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import org.apache.spark.storage.StorageUtils;

/**
 * The files of a store directory, read-only and without a lock, as the Python source's {@code store/files.py
 * StoreFiles}: commit log segments checked as there (one size for every segment: the option, else the store's
 * settings record {@code config/localmq.json}, else the largest file's; names that are multiples of it, no hole; an
 * empty last file, a creation interrupted, left out), its ConsumeQueues, the gap records recovery wrote, and walks
 * of the log. Nothing is opened for writing.
 *
 * <p>A store that live processes share publishes its committed end in its control file ({@code mpctl}): reads stop
 * there ({@link #liveEnd}, files.py's {@code live_end}), as past it a put may be half-copied.
 */
final class StoreFiles {
    /** RocketMQ's and localmq's default {@code mapped_file_size_commit_log}. */
    static final long DEFAULT_SEGMENT_SIZE = 1L << 30;
    private static final Pattern GAP_FILE = Pattern.compile("commitlog-gap-(\\d{20})-\\d+\\.bin");
    // the control file of a shared store (layout.py CTL_*): its size, header and the committed end's cell
    private static final String CTL_FILE = "mpctl";
    private static final int CTL_HEADER_SIZE = 4096;
    private static final int CTL_MAGIC = 0x4C4D5143;
    private static final int CTL_VERSION = 4;
    private static final int CTL_H_MAGIC = 0;
    private static final int CTL_H_VERSION = 4;
    private static final int CTL_S_READY = 512;
    private static final int CTL_S_WPOS = 520;
    private static final long CTL_LOCK_BYTE_OPEN = 0;

    final File root;
    final File commitlog;
    final long segmentSize;
    /** Bases and paths of the segments, in order. */
    final long[] bases;
    final String[] paths;
    /** The committed end live processes sharing the store publish, or null when nobody shares it. */
    final Long liveEnd;

    /**
     * @throws IllegalArgumentException not a store (no directory, no commitlog directory)
     * @throws IllegalStateException segments of another size than configured (naming the right one), misnamed or
     *         with a hole; a segment size a Java mapping cannot hold
     */
    StoreFiles(ReadOptions opts) {
        root = new File(opts.path);
        if (!root.isDirectory()) {
            throw new IllegalArgumentException("not a localmq / RocketMQ store: "
                    + (root.exists() ? "a store is a directory, this is a file" : "no such directory") + ": " + root);
        }
        commitlog = new File(root, "commitlog");
        if (!commitlog.isDirectory()) {
            throw new IllegalArgumentException("not a localmq / RocketMQ store: it has no commitlog directory: " + root);
        }
        // A store that processes share grows while it is listed: a listing that runs while two segment files are
        // created may return the second and miss the first. Segments past the published committed end hold nothing
        // committed and are left out; a hole below it in a live store is listed again (up to 5 times).
        Long live = null;
        long size = 0;
        List<File> kept = null;
        for (int attempt = 0; ; attempt++) {
            live = committedEnd(root);
            try {
                List<File> files = numbered(commitlog);
                size = segmentSize(opts, files);
                kept = checked(files, size, live);
                break;
            } catch (IllegalStateException e) {
                if (live == null || attempt == 4) {
                    throw e;
                }
            }
        }
        liveEnd = live;
        segmentSize = size;
        bases = new long[kept.size()];
        paths = new String[kept.size()];
        for (int i = 0; i < bases.length; i++) {
            bases[i] = Long.parseLong(kept.get(i).getName());
            paths[i] = kept.get(i).getPath();
        }
    }

    private long segmentSize(ReadOptions opts, List<File> files) {
        Long size = opts.segmentSize != null ? opts.segmentSize : recordedSegmentSize(root);
        if (size == null) {
            long largest = 0;
            for (File f : files) {
                largest = Math.max(largest, f.length());
            }
            size = largest > 0 ? largest : DEFAULT_SEGMENT_SIZE;
        }
        return size;
    }

    /** The segments of a listing, checked (files.py {@code _segments}). */
    private static List<File> checked(List<File> files, long size, Long live) {
        List<File> kept = new ArrayList<>();
        for (int i = 0; i < files.size(); i++) {
            File f = files.get(i);
            long base = Long.parseLong(f.getName());
            long len = f.length();
            if (len == 0 && i == files.size() - 1) {
                continue;  // a segment whose creation was interrupted or is under way: no data yet
            }
            if (live != null && base >= live && base > 0) {
                break;  // made ahead of the writer, or being created: nothing committed there yet
            }
            if (len != size) {
                throw new IllegalStateException("commit log segment " + f + " is " + len + " bytes, not the configured "
                        + size + ": pass option mapped_file_size_commit_log=" + len
                        + " if the store was written with that size");
            }
            if (base % size != 0) {
                throw new IllegalStateException("commit log segment " + f
                        + ": name is not a multiple of the segment size " + size);
            }
            if (!kept.isEmpty() && base != Long.parseLong(kept.get(kept.size() - 1).getName()) + size) {
                throw new IllegalStateException("commit log gap: " + f + " follows " + kept.get(kept.size() - 1));
            }
            if (size > Integer.MAX_VALUE) {
                throw new IllegalStateException("commit log segments of " + size + " bytes: the JVM reader maps a "
                        + "segment at once and takes segments below 2 GiB");
            }
            kept.add(f);
        }
        return kept;
    }

    /**
     * The committed end of the commit log that the live processes sharing the store at {@code root} publish in its
     * control file, or null when no process shares it (control_view.py {@code committed_end}): the file must be
     * whole, some process must hold a lock on its "attached" byte (seen in /proc/locks: no lock is taken here, as a
     * lock of this process would look like an attached one), and its header must say it is ready.
     */
    static Long committedEnd(File root) {
        Path ctl = new File(root, CTL_FILE).toPath();
        String ident = fileIdent(ctl);
        if (ident == null || !lockedByte(ident, CTL_LOCK_BYTE_OPEN)) {
            return null;
        }
        try (FileChannel ch = FileChannel.open(ctl, StandardOpenOption.READ)) {
            if (ch.size() < CTL_HEADER_SIZE) {
                return null;
            }
            // the header page only: the cells read here lie there in every version that has this magic
            MappedByteBuffer mm = ch.map(FileChannel.MapMode.READ_ONLY, 0, CTL_HEADER_SIZE);
            try {
                mm.order(java.nio.ByteOrder.nativeOrder());  // the control file holds native-endian cells
                if (mm.getInt(CTL_H_MAGIC) != CTL_MAGIC) {
                    return null;
                }
                int version = mm.getInt(CTL_H_VERSION);
                if (version != CTL_VERSION) {
                    // a live store of another localmq version: its committed end is not known here, and reading
                    // past it would take a put being copied for damage
                    throw new IllegalStateException("the control file " + ctl + " is version " + version
                            + ", this reader knows version " + CTL_VERSION + ": read the store with the localmq "
                            + "version that shares it, or once its processes have closed it");
                }
                if (mm.getLong(CTL_S_READY) != 1) {
                    return null;
                }
                return mm.getLong(CTL_S_WPOS);
            } finally {
                unmap(mm);
            }
        } catch (NoSuchFileException e) {
            return null;
        } catch (IOException e) {
            throw new UncheckedIOException("cannot read the control file " + ctl, e);
        }
    }

    /** "maj:min:inode" of a file as /proc/locks names it (glibc's gnu_dev_major / minor); null when it is gone. */
    private static String fileIdent(Path p) {
        try {
            long dev = ((Number) Files.getAttribute(p, "unix:dev")).longValue();
            long ino = ((Number) Files.getAttribute(p, "unix:ino")).longValue();
            long major = ((dev >>> 8) & 0xfff) | ((dev >>> 32) & ~0xfffL);
            long minor = (dev & 0xff) | ((dev >>> 12) & ~0xffL);
            return String.format(java.util.Locale.ROOT, "%02x:%02x:%d", major, minor, ino);
        } catch (IOException | UnsupportedOperationException | IllegalArgumentException e) {
            return null;
        }
    }

    /** Whether a process holds a POSIX lock over byte {@code at} of the file {@code ident} (from /proc/locks). */
    private static boolean lockedByte(String ident, long at) {
        try {
            for (String line : Files.readAllLines(Path.of("/proc/locks"), StandardCharsets.UTF_8)) {
                String[] f = line.trim().split("\\s+");
                // "1: POSIX ADVISORY READ 1234 08:01:5678 0 0"; a waiter's line has "->" after the number
                if (f.length < 8 || f[1].equals("->") || !f[5].equals(ident)) {
                    continue;
                }
                long start = Long.parseLong(f[6]);
                boolean toEnd = f[7].equals("EOF");
                if (start <= at && (toEnd || at <= Long.parseLong(f[7]))) {
                    return true;
                }
            }
            return false;
        } catch (IOException | NumberFormatException e) {
            return false;
        }
    }

    static List<File> numbered(File dir) {
        File[] found = dir.listFiles((d, name) -> name.length() == 20 && name.chars().allMatch(Character::isDigit));
        List<File> files = new ArrayList<>(Arrays.asList(found == null ? new File[0] : found));
        files.removeIf(f -> !f.isFile());
        files.sort((a, b) -> a.getName().compareTo(b.getName()));
        return files;
    }

    boolean hasSegments() {
        return bases.length > 0;
    }

    /** Base of the first segment (0 without segments). */
    long minOffset() {
        return bases.length > 0 ? bases[0] : 0;
    }

    /** Index of the segment holding {@code phys}, or -1 when it is gone. */
    int segmentOf(long phys) {
        if (bases.length == 0) {
            return -1;
        }
        long i = Math.floorDiv(phys - bases[0], segmentSize);
        return i >= 0 && i < bases.length ? (int) i : -1;
    }

    /** A read-only mapping of segment {@code i} (its written size at most); {@link #unmap} it after use. */
    MappedByteBuffer map(int i) {
        return map(paths[i], (int) segmentSize);
    }

    static MappedByteBuffer map(String path, int size) {
        try (FileChannel ch = FileChannel.open(Path.of(path), StandardOpenOption.READ)) {
            // the mapping outlives the channel; a segment shorter than planned is damage, reported by the walk
            return ch.map(FileChannel.MapMode.READ_ONLY, 0, Math.min(ch.size(), size));
        } catch (NoSuchFileException e) {
            return null;
        } catch (IOException e) {
            throw new UncheckedIOException("cannot map commit log segment " + path, e);
        }
    }

    static void unmap(MappedByteBuffer buf) {
        if (buf != null) {
            StorageUtils.dispose(buf);  // now rather than at a later GC
        }
    }

    /** Store time (ms) of the record at {@code phys}; null when its segment is gone. */
    Long storeTimestamp(long phys) {
        int i = segmentOf(phys);
        if (i < 0) {
            return null;
        }
        MappedByteBuffer buf = map(i);
        if (buf == null) {
            return null;
        }
        try {
            CommitLogRecord rec = new CommitLogRecord();
            int pos = (int) (phys - bases[i]);
            CommitLogRecord.Status st = pos < buf.limit() ? rec.parse(buf, pos, buf.limit(), false)
                    : CommitLogRecord.Status.END;
            if (st == CommitLogRecord.Status.BLANK) {
                throw new CorruptRecordException("blank record at offset " + phys + ", not a message", phys, paths[i]);
            }
            if (st != CommitLogRecord.Status.OK) {
                throw new CorruptRecordException("no whole record at offset " + phys + " (" + CommitLogRecord.describe(st) + ")",
                        phys, paths[i]);
            }
            return rec.storeTimestamp;
        } finally {
            unmap(buf);
        }
    }

    /** Commit log offsets of the gap records recovery wrote (its {@code recovery/commitlog-gap-*} files), sorted. */
    List<Long> gapOffsets() {
        String[] names = new File(root, "recovery").list();
        Set<Long> out = new TreeSet<>();
        for (String n : names == null ? new String[0] : names) {
            Matcher m = GAP_FILE.matcher(n);
            if (m.matches()) {
                out.add(Long.parseLong(m.group(1)));
            }
        }
        return new ArrayList<>(out);
    }

    /**
     * Commit log offset just after the last complete record, walking from {@code start} (null: the last segment
     * that begins with a record): zero bytes or a torn record end it, a blank record leads to the next segment, a
     * gap record is stepped over. An invalid record at or past {@code knownEnd} (how far the ConsumeQueues reach;
     * null: nowhere) is what a crash leaves and ends the log, as in recovery; below it, it is damage.
     *
     * @throws CorruptRecordException damage below {@code knownEnd}
     */
    long walkEnd(Long start, Long knownEnd) {
        if (bases.length == 0) {
            return 0;
        }
        if (liveEnd != null && (start == null || start <= liveEnd)) {
            return liveEnd;
        }
        int first;
        if (start == null) {
            first = bases.length - 1;
            while (first > 0 && !beginsWithRecord(first)) {
                first--;
            }
        } else {
            first = (int) Math.max(0, (start - minOffset()) / segmentSize);
        }
        long end = bases[first];
        CommitLogRecord rec = new CommitLogRecord();
        for (int i = first; i < bases.length; i++) {
            long base = bases[i];
            int pos = start != null && start > base ? (int) (start - base) : 0;
            MappedByteBuffer buf = map(i);
            if (buf == null) {
                return base;
            }
            try {
                while (true) {
                    CommitLogRecord.Status st = rec.parse(buf, pos, buf.limit(), false);
                    if (st == CommitLogRecord.Status.OK || st == CommitLogRecord.Status.GAP) {
                        pos += rec.totalSize;
                    } else if (st == CommitLogRecord.Status.BLANK) {
                        end = base + segmentSize;
                        break;
                    } else if (st == CommitLogRecord.Status.END || st == CommitLogRecord.Status.TORN) {
                        return base + pos;
                    } else if (knownEnd != null && base + pos >= knownEnd) {
                        return base + pos;
                    } else {
                        throw new CorruptRecordException(CommitLogRecord.describe(st) + " record at offset " + (base + pos)
                                + " of the commit log (" + paths[i] + ")", base + pos, paths[i]);
                    }
                }
            } finally {
                unmap(buf);
            }
        }
        return end;
    }

    private boolean beginsWithRecord(int i) {
        MappedByteBuffer buf = map(i);
        try {
            return buf != null && buf.limit() >= 8 && buf.getLong(0) != 0;
        } finally {
            unmap(buf);
        }
    }

    /** The first record boundary at or after {@code target} (from ConsumeQueues, else a walk); -1 when none. */
    long boundaryAt(long target, List<ConsumeQueueFiles> queues) {
        if (!queues.isEmpty()) {
            long best = -1;
            for (ConsumeQueueFiles q : queues) {
                long u = q.firstUnitAtOrAfter(target);
                if (u >= 0 && (best < 0 || u < best)) {
                    best = u;
                }
            }
            return best;
        }
        int i = segmentOf(target);
        if (i < 0) {
            return -1;
        }
        MappedByteBuffer buf = map(i);
        if (buf == null) {
            return -1;
        }
        try {
            CommitLogRecord rec = new CommitLogRecord();
            int pos = 0;
            long stop = target - bases[i];
            while (pos < stop) {
                CommitLogRecord.Status st = rec.parse(buf, pos, buf.limit(), false);
                if (st == CommitLogRecord.Status.OK || st == CommitLogRecord.Status.GAP) {
                    pos += rec.totalSize;
                } else if (st == CommitLogRecord.Status.END || st == CommitLogRecord.Status.BLANK) {
                    break;
                } else {
                    throw new CorruptRecordException(CommitLogRecord.describe(st) + " record at offset " + (bases[i] + pos)
                            + " of the commit log (" + paths[i] + ")", bases[i] + pos, paths[i]);
                }
            }
            return bases[i] + pos;
        } finally {
            unmap(buf);
        }
    }

    /** The ConsumeQueues of every (topic, queue id) directory that holds files, only {@code topics} unless null. */
    List<ConsumeQueueFiles> queues(Set<String> topics) {
        List<ConsumeQueueFiles> out = new ArrayList<>();
        String[] names = new File(root, "consumequeue").list();
        if (names == null) {
            return out;
        }
        Arrays.sort(names);
        for (String topic : names) {
            if (topics != null && !topics.contains(topic)) {
                continue;
            }
            File tdir = new File(new File(root, "consumequeue"), topic);
            String[] qs = tdir.list();
            if (qs == null) {
                continue;
            }
            Arrays.sort(qs);
            for (String q : qs) {
                if (!q.isEmpty() && q.chars().allMatch(c -> c >= '0' && c <= '9') && q.length() < 10) {
                    ConsumeQueueFiles cq = new ConsumeQueueFiles(topic, Integer.parseInt(q), new File(tdir, q));
                    if (cq.hasFiles()) {
                        out.add(cq);
                    }
                }
            }
        }
        return out;
    }

    /**
     * Whether a process on this host holds the store's {@code lock} file (a localmq writer or a RocketMQ broker), from
     * /proc/locks, so the lock file is never opened; null when that cannot be told.
     */
    Boolean writerActive() {
        Path lock = new File(root, "lock").toPath();
        String ident = fileIdent(lock);
        if (ident == null) {
            return Files.exists(lock) ? null : Boolean.FALSE;  // no lock file: no writer; else cannot tell
        }
        try {
            for (String line : Files.readAllLines(Path.of("/proc/locks"), StandardCharsets.UTF_8)) {
                for (String field : line.trim().split("\\s+")) {
                    if (field.equals(ident)) {
                        return true;
                    }
                }
            }
            return false;
        } catch (IOException e) {
            return null;
        }
    }

    /** {@code mapped_file_size_commit_log} of the store's settings record, or null without one. */
    private static Long recordedSegmentSize(File root) {
        File rec = new File(new File(root, "config"), "localmq.json");
        if (!rec.isFile()) {
            return null;
        }
        try {
            JsonNode size = new ObjectMapper().readTree(rec).path("settings").path("mapped_file_size_commit_log");
            return size.canConvertToLong() ? size.asLong() : null;
        } catch (IOException e) {
            throw new IllegalStateException("unreadable settings record " + rec + ": " + e.getMessage(), e);
        }
    }
}
