package localmq.spark;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

/**
 * The commit log segments of a store directory, listed and checked as localmq's {@code store/files.py} does: one
 * size for every segment (the option, else the store's settings record {@code config/localmq.json}, else the
 * largest file's), names that are multiples of it, no hole; an empty last file (a creation interrupted) is left
 * out. Read-only: nothing is opened for writing and no lock is taken.
 */
final class StoreSegments {
    /** RocketMQ's and localmq's default {@code mapped_file_size_commit_log}. */
    static final long DEFAULT_SEGMENT_SIZE = 1L << 30;

    private StoreSegments() {
    }

    /**
     * The segments of the store at {@code opts.path}, in order.
     *
     * @throws IllegalArgumentException not a store (no directory, no commitlog directory)
     * @throws IllegalStateException segments of another size than configured (naming the right one), misnamed
     *         or with a hole; a segment size a Java mapping cannot hold
     */
    static List<SegmentPartition> list(ReadOptions opts) {
        File root = new File(opts.path);
        if (!root.isDirectory()) {
            throw new IllegalArgumentException("not a localmq / RocketMQ store: "
                    + (root.exists() ? "a store is a directory, this is a file" : "no such directory") + ": " + root);
        }
        File commitlog = new File(root, "commitlog");
        if (!commitlog.isDirectory()) {
            throw new IllegalArgumentException("not a localmq / RocketMQ store: it has no commitlog directory: " + root);
        }
        File[] found = commitlog.listFiles((dir, name) -> name.length() == 20 && name.chars().allMatch(Character::isDigit));
        List<File> files = new ArrayList<>(Arrays.asList(found == null ? new File[0] : found));
        files.removeIf(f -> !f.isFile());
        files.sort((a, b) -> a.getName().compareTo(b.getName()));
        Long size = opts.segmentSize != null ? opts.segmentSize : recordedSegmentSize(root);
        if (size == null) {
            long largest = 0;
            for (File f : files) {
                largest = Math.max(largest, f.length());
            }
            size = largest > 0 ? largest : DEFAULT_SEGMENT_SIZE;
        }
        List<SegmentPartition> out = new ArrayList<>();
        long prev = -1;
        String prevPath = null;
        for (int i = 0; i < files.size(); i++) {
            File f = files.get(i);
            long base = Long.parseLong(f.getName());
            long len = f.length();
            if (len == 0 && i == files.size() - 1) {
                continue;  // a segment whose creation was interrupted: no data yet
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
            if (prev >= 0 && base != prev + size) {
                throw new IllegalStateException("commit log gap: " + f + " follows " + prevPath);
            }
            if (size > Integer.MAX_VALUE) {
                throw new IllegalStateException("commit log segments of " + size + " bytes: the JVM reader maps a "
                        + "segment at once and takes segments below 2 GiB");
            }
            out.add(new SegmentPartition(f.getPath(), base, (int) (long) size, 0, (int) (long) size));
            prev = base;
            prevPath = f.getPath();
        }
        return out;
    }

    /**
     * The segments cut into about {@code wanted} equal shares of the data (a multiple of it, none larger than a
     * segment; the Python source's rule), at record boundaries the ConsumeQueues give. Records past the furthest
     * one they index fall in the last share. Without ConsumeQueues a share is a segment.
     */
    static List<SegmentPartition> split(List<SegmentPartition> segments, File root, int wanted) {
        if (segments.isEmpty()) {
            return segments;
        }
        try (ConsumeQueueIndex cq = new ConsumeQueueIndex(root)) {
            if (cq.isEmpty()) {
                return segments;
            }
            long segSize = segments.get(0).size;
            long lo = segments.get(0).base;
            long hi = Math.min(cq.indexedEnd(), segments.get(segments.size() - 1).base + segSize);
            long total = hi - lo;
            if (total <= 0) {
                return segments;
            }
            long count = wanted * ((total + wanted * segSize - 1) / (wanted * segSize));
            long piece = Math.max(4096, (total + count - 1) / count);
            List<Long> cuts = new ArrayList<>();
            long target = lo + piece;
            while (target < hi - piece / 4) {
                long b = cq.boundaryAtOrAfter(target);
                if (b < 0 || b >= hi) {
                    break;
                }
                if (b > (cuts.isEmpty() ? lo : cuts.get(cuts.size() - 1))) {
                    cuts.add(b);
                }
                target = Math.max(target + piece, b + 1);
            }
            List<SegmentPartition> out = new ArrayList<>();
            for (SegmentPartition seg : segments) {
                int start = 0;
                for (long c : cuts) {
                    if (c > seg.base && c < seg.base + seg.size) {
                        out.add(new SegmentPartition(seg.path, seg.base, seg.size, start, (int) (c - seg.base)));
                        start = (int) (c - seg.base);
                    }
                }
                out.add(new SegmentPartition(seg.path, seg.base, seg.size, start, seg.size));
            }
            return out;
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
