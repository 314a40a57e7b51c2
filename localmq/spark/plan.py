"""Read-only planning over a store's files: segments, ConsumeQueue offsets, option parsing and partitions."""

import bisect
import errno
import json
import logging
import math
import os
import re
import struct
from dataclasses import dataclass, field

from localmq._record import scan_record, walk_records
from localmq._mapped_file import MappedFile
from localmq.errors import ConfigError, CorruptFrameError, CorruptStoreError, NotAStoreError

__all__ = [
    "StoreFiles", "ConsumeQueueFiles", "ReadOptions", "SegmentRange", "SegmentRanges", "QueueRange",
    "OffsetRangeError", "plan_batch", "resolve_offsets", "queue_partitions", "queue_state", "store_state",
    "writer_active", "Tail", "offset_for_time", "split_ranges", "tail_partitions", "check_offsets_json",
]

log = logging.getLogger("localmq.spark")

NAME = re.compile(r"\d{20}")
CQ_UNIT = 20
CQ_BLANK_SIZE = 0x7FFFFFFF          # a padding unit (offset 0, size MAX) that a queue may start with
DEFAULT_SEGMENT = 1024 * 1024 * 1024
EARLIEST = -2
LATEST = -1
_UNIT = struct.Struct(">qi")
_REC_HEAD = 76                      # enough bytes of a record header to reach the store timestamp (IPv6 born host)


class OffsetRangeError(CorruptStoreError):
    """Requested offsets that retention already removed (``failOnDataLoss`` true), or an ending before a start."""


# ---------------------------------------------------------------------------------------------- options


def _bool(value, name):
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"option {name} must be true or false, not {value!r}")


def _int(value, name, minimum=None):
    try:
        out = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, not {value!r}") from None
    if minimum is not None and out < minimum:
        raise ConfigError(f"option {name} must be >= {minimum}, not {out}")
    return out


def _offsets_spec(value, name):
    """"earliest", "latest" or a JSON {"topic": {"queueId": offset}} (-2 earliest, -1 latest)."""
    if value is None:
        return None
    text = str(value).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        spec = json.loads(text)
    except ValueError:
        raise ConfigError(f"option {name} must be 'earliest', 'latest' or JSON like "
                          f'{{"topic":{{"0":23}}}}, not {value!r}') from None
    if not isinstance(spec, dict) or not all(isinstance(v, dict) for v in spec.values()):
        raise ConfigError(f'option {name}: JSON must map topics to {{"queueId": offset}} objects, not {value!r}')
    out = {}
    for topic, queues in spec.items():
        for qid, off in queues.items():
            out[(str(topic), _int(qid, f"{name} queue id of {topic}", 0))] = _int(off, f"{name} offset", -2)
    return out


@dataclass
class ReadOptions:
    """Parsed reader options (names as Spark's Kafka source where one exists; case-insensitive)."""

    path: str
    topics: tuple = None
    starting: object = "earliest"       # "earliest" | "latest" | {(topic, qid): offset}
    ending: object = "latest"
    starting_timestamp: int = None
    ending_timestamp: int = None
    max_offsets_per_trigger: int = None
    fail_on_data_loss: bool = True
    segment_size: int = DEFAULT_SEGMENT
    batch_size: int = 65536
    min_partitions: int = None
    partitioning: str = "auto"          # "auto" | "segment" | "queue"
    check_crc: bool = False
    include_undispatched: object = "auto"   # "auto" | True | False: records past the ConsumeQueues (see Tail)
    # pushed-down filters (batch, spark.sql.python.filterPushdown.enabled): queue ids, offsets [lo, hi)
    queue_ids: frozenset = None
    offset_lo: int = 0
    offset_hi: int = None
    pushed: bool = False                    # filters narrowed the topics or queues read

    @classmethod
    def parse(cls, options, *, streaming=False):
        """Build from a Spark options mapping. Raises ConfigError for unknown values, NotAStoreError without a path."""
        opts = {str(k).lower(): v for k, v in dict(options or {}).items()}
        path = opts.get("path")
        if not path:
            raise NotAStoreError(errno.ENOENT, "no path given: use .load(path) or .option('path', ...)", "")
        topics = None
        if opts.get("topics"):
            topics = tuple(t.strip() for t in str(opts["topics"]).split(",") if t.strip())
        for kafka_only in ("subscribe", "subscribepattern", "assign"):
            if kafka_only in opts:
                raise ConfigError(f"option {kafka_only} is Kafka's; localmq takes 'topics' (a comma list)")
        out = cls(path=os.fspath(path), topics=topics)
        out.starting = _offsets_spec(opts.get("startingoffsets"), "startingOffsets") or (
            "latest" if streaming else "earliest")
        out.ending = _offsets_spec(opts.get("endingoffsets"), "endingOffsets") or "latest"
        if streaming and "endingoffsets" in opts:
            raise ConfigError("endingOffsets is for batch reads only")
        if out.ending == "earliest":
            raise ConfigError("endingOffsets cannot be 'earliest'")
        if isinstance(out.ending, dict) and any(v == EARLIEST for v in out.ending.values()):
            raise ConfigError("endingOffsets cannot use -2 (earliest)")
        if isinstance(out.starting, dict) and any(v == LATEST for v in out.starting.values()) and not streaming:
            raise ConfigError("startingOffsets of a batch read cannot use -1 (latest)")
        if out.starting == "latest" and not streaming:
            raise ConfigError("startingOffsets of a batch read cannot be 'latest'")
        if "startingtimestamp" in opts:
            out.starting_timestamp = _int(opts["startingtimestamp"], "startingTimestamp", 0)
        if "endingtimestamp" in opts:
            if streaming:
                raise ConfigError("endingTimestamp is for batch reads only")
            out.ending_timestamp = _int(opts["endingtimestamp"], "endingTimestamp", 0)
        if "maxoffsetspertrigger" in opts:
            out.max_offsets_per_trigger = _int(opts["maxoffsetspertrigger"], "maxOffsetsPerTrigger", 1)
        if "failondataloss" in opts:
            out.fail_on_data_loss = _bool(opts["failondataloss"], "failOnDataLoss")
        if "mapped_file_size_commit_log" in opts:
            out.segment_size = _int(opts["mapped_file_size_commit_log"], "mapped_file_size_commit_log", 4096)
        if "batchsize" in opts:
            out.batch_size = _int(opts["batchsize"], "batchSize", 1)
        if "minpartitions" in opts:
            out.min_partitions = _int(opts["minpartitions"], "minPartitions", 1)
        if "partitioning" in opts:
            out.partitioning = str(opts["partitioning"]).strip().lower()
            if out.partitioning not in ("auto", "segment", "queue"):
                raise ConfigError("option partitioning must be auto, segment or queue")
        if out.topics is None:
            # offsets JSON without a topics option: the JSON's topics are the ones read (as Kafka's "assign")
            named = {t for spec in (out.starting, out.ending) if isinstance(spec, dict) for t, _ in spec}
            if named:
                out.topics = tuple(sorted(named))
        if "pushfilters" in opts:
            _bool(opts["pushfilters"], "pushFilters")  # used by LocalMQDataSource.reader; checked here
        if "checkcrc" in opts:
            out.check_crc = _bool(opts["checkcrc"], "checkCRC")
        if "includeundispatched" in opts:
            value = str(opts["includeundispatched"]).strip().lower()
            out.include_undispatched = "auto" if value == "auto" else _bool(value, "includeUndispatched")
        return out

    @property
    def target_partitions(self):
        return self.min_partitions or max(2, os.cpu_count() or 2)


# ---------------------------------------------------------------------------------------------- files


def _numbered_files(directory):
    """(base, path, size) of the 20-digit files of a directory, sorted; [] when it has none."""
    out = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if NAME.fullmatch(entry.name) and entry.is_file():
                    out.append((int(entry.name), entry.path, entry.stat().st_size))
    except FileNotFoundError:
        return []
    out.sort()
    return out


class StoreFiles:
    """The commit log segments of a store, checked against the configured segment size (read-only, no lock)."""

    def __init__(self, path, segment_size=DEFAULT_SEGMENT):
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise NotAStoreError(errno.ENOENT, "not a localmq / RocketMQ store: no such directory", path)
        self.root = path
        self.commitlog = os.path.join(path, "commitlog")
        if not os.path.isdir(self.commitlog):
            raise NotAStoreError(errno.ENOENT, "not a localmq / RocketMQ store: it has no commitlog directory",
                                 path)
        self.consumequeue = os.path.join(path, "consumequeue")
        self.segment_size = int(segment_size)
        files = _numbered_files(self.commitlog)
        segments = []
        for i, (base, fpath, size) in enumerate(files):
            if size == 0 and i == len(files) - 1:
                continue  # a segment whose creation was interrupted or is under way: no data yet
            if size != self.segment_size:
                raise CorruptStoreError(
                    f"commit log segment {fpath} is {size} bytes, not the configured {self.segment_size}: "
                    f"pass option mapped_file_size_commit_log={size} if the store was written with that size")
            if base % self.segment_size:
                raise CorruptStoreError(f"commit log segment {fpath}: name is not a multiple of the segment size "
                                        f"{self.segment_size}")
            if segments and base != segments[-1][0] + self.segment_size:
                raise CorruptStoreError(f"commit log gap: {fpath} follows {segments[-1][1]}")
            segments.append((base, fpath))
        self.segments = segments

    @property
    def min_offset(self):
        return self.segments[0][0] if self.segments else 0

    def segment_of(self, phys):
        """(base, path) of the segment holding physical offset ``phys``, or None when it is gone."""
        if not self.segments:
            return None
        i = (phys - self.segments[0][0]) // self.segment_size
        if 0 <= i < len(self.segments):
            return self.segments[i]
        return None

    def store_timestamp(self, phys):
        """Store time (ms) of the record at ``phys``; None when its segment is gone."""
        seg = self.segment_of(phys)
        if seg is None:
            return None
        with open(seg[1], "rb") as f:
            head = os.pread(f.fileno(), _REC_HEAD, phys - seg[0])
        if len(head) < 64:
            raise CorruptFrameError(f"record at offset {phys} is cut short", offset=phys, path=seg[1])
        sys_flag = struct.unpack_from(">i", head, 36)[0]
        at = 68 if sys_flag & 0x10 else 56
        return struct.unpack_from(">q", head, at)[0]

    def walk_end(self, start=None):
        """Physical offset just after the last complete record (walking from ``start``, default the last segment).

        Zero bytes or a torn record at the end of the data stop the walk; a damaged record with data after it
        raises CorruptFrameError.
        """
        if not self.segments:
            return 0
        first = len(self.segments) - 1 if start is None else max(0, (start - self.min_offset) // self.segment_size)
        end = self.segments[first][0]
        for base, fpath in self.segments[first:]:
            pos = (start - base) if start is not None and start > base else 0
            mf = MappedFile(fpath, self.segment_size, base, create=False, writable=False)
            try:
                pos, outcome, _, _, _ = walk_records(mf, pos, -1, False)
                if outcome == "blank":
                    end = base + self.segment_size
                    continue
                if outcome in ("end", "torn"):
                    return base + pos
                raise CorruptFrameError(f"{outcome} record at offset {base + pos} of the commit log ({fpath})",
                                        offset=base + pos, path=fpath)
            finally:
                mf.close()
        return end

    def boundary_at(self, target, queues=()):
        """The first record boundary at or after physical offset ``target`` (from ConsumeQueues, else a walk)."""
        best = None
        for q in queues:
            u = q.first_unit_at_or_after(target)
            if u is not None and (best is None or u < best):
                best = u
        if queues:
            return best
        seg = self.segment_of(target)
        if seg is None:
            return None
        base, fpath = seg
        mf = MappedFile(fpath, self.segment_size, base, create=False, writable=False)
        try:
            pos, outcome, _, _, _ = walk_records(mf, 0, target - base, False)
            if outcome == "torn":  # only cut short by ``target``: the boundary is after this record
                status, size = scan_record(mf, pos, False)
                if status == "ok":
                    pos, outcome = pos + size, "end"
        finally:
            mf.close()
        if outcome not in ("end", "blank"):
            raise CorruptFrameError(f"{outcome} record at offset {base + pos} of the commit log ({fpath})",
                                    offset=base + pos, path=fpath)
        return base + pos

    def queues(self, topics=None):
        """ConsumeQueueFiles of every (topic, queue id) directory, optionally only ``topics``."""
        out = []
        try:
            topic_names = sorted(os.listdir(self.consumequeue))
        except FileNotFoundError:
            return out
        for topic in topic_names:
            if topics is not None and topic not in topics:
                continue
            tdir = os.path.join(self.consumequeue, topic)
            if not os.path.isdir(tdir):
                continue
            for q in sorted(os.listdir(tdir)):
                if q.isdigit():
                    cq = ConsumeQueueFiles(topic, int(q), os.path.join(tdir, q))
                    if cq.files:
                        out.append(cq)
        return out


class ConsumeQueueFiles:
    """One ConsumeQueue read with pread (no mapping, no lock): offsets, binary searches, unit ranges."""

    def __init__(self, topic, queue_id, path):
        self.topic = topic
        self.queue_id = queue_id
        self.path = path
        files = _numbered_files(path)
        self.file_size = max((s for _, _, s in files), default=0)
        self.files = [(b, p) for b, p, s in files if s > 0]
        for b, p in self.files:
            if b % CQ_UNIT:
                raise CorruptStoreError(f"consume queue file {p}: name is not a multiple of {CQ_UNIT}")

    def _file_of(self, index):
        if not self.files or self.file_size <= 0:
            return None
        logical = index * CQ_UNIT
        i = (logical - self.files[0][0]) // self.file_size
        if 0 <= i < len(self.files):
            base, p = self.files[i]
            if base <= logical < base + self.file_size:
                return base, p
        for base, p in self.files:  # names that do not follow the file size: search them
            if base <= logical < base + self.file_size:
                return base, p
        return None

    def unit(self, index):
        """(physical offset, size) of unit ``index``; None when its file is gone or it is past the end."""
        f = self._file_of(index)
        if f is None:
            return None
        with open(f[1], "rb") as fh:
            raw = os.pread(fh.fileno(), 12, index * CQ_UNIT - f[0])
        if len(raw) < 12:
            return None
        return _UNIT.unpack(raw)

    def _count_valid(self, base, fpath):
        """Units written in one file: a valid prefix (offset >= 0, size > 0) followed by zeros."""
        n = self.file_size // CQ_UNIT
        lo, hi = 0, n
        with open(fpath, "rb") as fh:
            fd = fh.fileno()
            while lo < hi:
                mid = (lo + hi) // 2
                raw = os.pread(fd, 12, mid * CQ_UNIT)
                if len(raw) == 12:
                    off, size = _UNIT.unpack(raw)
                    ok = off >= 0 and size > 0
                else:
                    ok = False
                if ok:
                    lo = mid + 1
                else:
                    hi = mid
        return lo

    def max_offset(self):
        """The queue offset after the last written unit."""
        for base, fpath in reversed(self.files):
            n = self._count_valid(base, fpath)
            if n:
                return base // CQ_UNIT + n
        return self.files[0][0] // CQ_UNIT if self.files else 0

    def min_offset(self, commitlog_min, max_offset=None):
        """The first queue offset whose record is still in the commit log (and not a padding unit)."""
        if not self.files:
            return 0
        hi = self.max_offset() if max_offset is None else max_offset
        lo = self.files[0][0] // CQ_UNIT
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is None or u[1] == CQ_BLANK_SIZE or u[0] < commitlog_min:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def offset_before(self, phys_bound, max_offset):
        """The queue offset after the last unit whose record ends at or below ``phys_bound``."""
        lo, hi = self.files[0][0] // CQ_UNIT if self.files else 0, max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is not None and u[1] != CQ_BLANK_SIZE and u[0] + u[1] > phys_bound:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def first_unit_at_or_after(self, phys):
        """Physical offset of the first unit at or after ``phys``, or None."""
        hi = self.max_offset()
        lo = self.files[0][0] // CQ_UNIT if self.files else 0
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is None or u[1] == CQ_BLANK_SIZE or u[0] < phys:
                lo = mid + 1
            else:
                hi = mid
        u = self.unit(lo) if lo < self.max_offset() else None
        return None if u is None else u[0]

    def offset_for_time(self, store, ts, lo, hi):
        """The first queue offset in [lo, hi) whose record's store time is >= ``ts`` (``hi`` when none)."""
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            t = None if u is None else store.store_timestamp(u[0])
            if t is None or t < ts:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def end_phys(self, offset):
        """Physical offset just after the record of unit ``offset - 1`` (0 for an empty range)."""
        u = self.unit(offset - 1) if offset > 0 else None
        return 0 if u is None else u[0] + u[1]


# ---------------------------------------------------------------------------------------------- partitions


@dataclass(frozen=True)
class SegmentRange:
    """Records whose start lies in [start, end) of one commit log segment (a record boundary both ends).

    ``bounds``: {(topic, queue id): (first offset, end offset)} rows must fall in (None: no per-queue bound);
    ``topics``: topics kept (None: all); timestamps: store-time filter (ms, end exclusive), for stores read
    without ConsumeQueues.
    """

    path: str
    base: int
    size: int
    start: int
    end: int
    topics: tuple = None
    bounds: dict = None
    min_ts: int = None
    max_ts: int = None
    check_crc: bool = False


@dataclass(frozen=True)
class SegmentRanges:
    """One partition over the end of a segment and the start of the next (or more): SegmentRanges read in order."""

    ranges: tuple


@dataclass(frozen=True)
class QueueRange:
    """Queue offsets [start, end) of one (topic, queue id), read through its ConsumeQueue."""

    topic: str
    queue_id: int
    cq_path: str
    commitlog: str
    segment_size: int
    start: int
    end: int
    fail_on_data_loss: bool = True
    check_crc: bool = False


@dataclass
class Plan:
    """What a batch read will return: per-queue offsets (when ConsumeQueues exist) and the partitions."""

    partitions: list
    offsets: dict = field(default_factory=dict)    # {(topic, qid): (start, end)}
    mode: str = "segment"
    bound: int = 0


def queue_state(store, topics):
    """{(topic, qid): (cq, min, max)} consistent with one commit-log bound (two passes, see below).

    The dispatcher indexes the log in order, so every record below the furthest unit end seen in a first
    pass is indexed by the time the pass ends; a second pass counts, per queue, the units below that bound.
    Records past it are left for a later read.
    """
    first = store.queues(topics if topics is None else set(topics))
    bound = 0
    for cq in first:
        m = cq.max_offset()
        if m > 0:
            bound = max(bound, cq.end_phys(m))
    state = {}
    for cq in store.queues(topics if topics is None else set(topics)):
        m = cq.offset_before(bound, cq.max_offset())
        lo = cq.min_offset(store.min_offset, m)
        state[(cq.topic, cq.queue_id)] = (cq, lo, max(lo, m))
    return state, bound


def writer_active(root):
    """Whether a process on this host holds the store's ``lock`` file (a localmq writer or a RocketMQ broker).

    Read from /proc/locks, so the lock file is never opened: closing a descriptor of it would drop this process's
    own POSIX lock if it is the writer. Returns None when that cannot be told (no /proc/locks); a writer on
    another host of a shared filesystem is not seen.
    """
    try:
        st = os.stat(os.path.join(root, "lock"))
    except FileNotFoundError:
        return False
    except OSError:
        return None
    ident = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        with open("/proc/locks") as f:
            return any(ident in line.split() for line in f)
    except OSError:
        return None


@dataclass
class Tail:
    """Records the commit log holds past the furthest record the ConsumeQueues index: never dispatched (a
    broker or writer that stopped before its dispatcher caught up). Their queue offsets are in their headers.

    ``queues``: {(topic, qid): (first offset, end offset)}; ``times``: {(topic, qid): (offsets, store times)}
    as numpy arrays, for offset-by-time.
    """

    start: int
    end: int
    queues: dict = field(default_factory=dict)
    times: dict = field(default_factory=dict)


def scan_tail(store, start, with_times=False):
    """Walk and decode the records from ``start`` to the end of the complete records (Tail); ``times`` is only
    filled ``with_times`` (16 bytes a record, for offset-by-time)."""
    import numpy as np

    from localmq._columns import decode_range, RecordColumns, topic_codes

    start = max(start, store.min_offset)
    end = store.walk_end(start)
    tail = Tail(start, max(start, end))
    found = {}
    for base, fpath in store.segments:
        s, e = max(start, base), min(end, base + store.segment_size)
        if s >= e:
            continue
        mf = MappedFile(fpath, store.segment_size, base, create=False, writable=False)
        try:
            pos = s - base
            while pos < e - base:
                cols = RecordColumns(65536)
                n, pos, reason = decode_range(mf, cols, pos, e - base, base, False)
                if n:
                    codes, names = topic_codes(cols)
                    keep = np.flatnonzero(_dispatched(cols["sys_flag"]))
                    key = (codes.astype(np.int64) << 32 | cols["queue_id"].astype(np.int64))[keep]
                    qoff, ts = cols["queue_offset"][keep], cols["store_timestamp"][keep]
                    for k in np.unique(key).tolist():
                        m = key == k
                        q = qoff[m]
                        found.setdefault((names[k >> 32], k & 0xFFFFFFFF), []).append(
                            (int(q.min()), int(q.max()) + 1, (q, ts[m]) if with_times else None))
                if reason != "full":
                    break  # blank (end of this segment) or the end walked to above
        finally:
            mf.close()
    for k, parts in found.items():
        tail.queues[k] = (min(a for a, _, _ in parts), max(b for _, b, _ in parts))
        if with_times:
            tail.times[k] = (np.concatenate([t[0] for _, _, t in parts]), np.concatenate([t[1] for _, _, t in parts]))
    return tail


def _dispatched(sys_flag):
    """Rows a dispatcher indexes: all but PREPARED and ROLLBACK transactional records (RocketMQ's rule)."""
    txn = sys_flag & 0xC
    return (txn != 0x4) & (txn != 0xC)


def store_state(store, opts):
    """(state, bound, tail): ``queue_state`` plus, when ``opts.include_undispatched`` allows (auto: no writer holds
    the store), the records past the ConsumeQueues, whose queues' ends are moved past them; a queue that only
    the tail has gets state (None, first, end). ``tail`` is None when not read.
    """
    state, bound = queue_state(store, opts.topics)
    state = _pushed_queues(state, opts)
    want = opts.include_undispatched
    if want == "auto":
        want = writer_active(store.root) is False
    if not want or not store.segments or not store.queues():
        return state, bound, None  # (a bare commit log, without ConsumeQueues, is read with row filters instead)
    with_times = opts.starting_timestamp is not None or opts.ending_timestamp is not None
    tail = scan_tail(store, bound, with_times)
    if not tail.queues:
        return state, bound, None
    for key, (first, stop) in tail.queues.items():
        if opts.topics is not None and key[0] not in opts.topics:
            continue
        if opts.queue_ids is not None and key[1] not in opts.queue_ids:
            continue
        cq, lo, hi = state.get(key, (None, first, first))
        state[key] = (cq, lo, max(hi, stop))
    return state, bound, tail


def _pushed_queues(state, opts):
    if opts.queue_ids is not None:
        for key in [k for k in state if k[1] not in opts.queue_ids]:
            del state[key]
    return state


def _cq_end(state, tail, key):
    """The end of what ``key``'s ConsumeQueue covers (where its tail part begins)."""
    cq, lo, hi = state[key]
    if tail is not None and key in tail.queues:
        return max(lo, min(hi, tail.queues[key][0])) if cq is not None else lo
    return hi


def offset_for_time(store, state, tail, key, ts):
    """The first offset of ``key`` whose store time is >= ``ts`` (its end when none): ConsumeQueue, then tail."""
    import numpy as np

    cq, lo, hi = state[key]
    cq_hi = _cq_end(state, tail, key)
    if cq is not None and lo < cq_hi:
        o = cq.offset_for_time(store, ts, lo, cq_hi)
        if o < cq_hi:
            return o
    if tail is not None and key in tail.times:
        qoff, times = tail.times[key]
        hit = np.flatnonzero((times >= ts) & (qoff >= cq_hi))
        if len(hit):
            return int(qoff[hit].min())
    return hi


def split_ranges(state, tail, offsets):
    """Split per-queue [start, end) into the part the ConsumeQueues cover and the part only the tail has."""
    covered, beyond = {}, {}
    for key, (s, e) in offsets.items():
        cq_hi = _cq_end(state, tail, key)
        if state[key][0] is not None and s < min(e, cq_hi):
            covered[key] = (s, min(e, cq_hi))
        if e > max(s, cq_hi):
            beyond[key] = (max(s, cq_hi), e)
    return covered, beyond


def tail_partitions(store, tail, beyond, opts, parts_wanted):
    """SegmentRange partitions over the tail keeping only the rows in ``beyond``'s per-queue ranges."""
    if not beyond:
        return []
    bounds = {key: beyond.get(key, (0, 0)) for key in tail.queues}
    bounds.update(beyond)
    return segment_partitions(store, tail.start, tail.end, opts, parts_wanted, (), bounds)


def resolve_offsets(store, opts, state, starting=None, ending=None, tail=None):
    """Per-queue [start, end) offsets for ``opts`` (earliest / latest / JSON / timestamps), checking data loss.

    A JSON ``startingOffsets`` / ``endingOffsets`` must name every queue of the topics read (Kafka's rule), so
    that a queue left out is an error rather than a silent default; -2 / -1 stand for earliest / latest.
    """
    for spec, name in ((starting if starting is not None else opts.starting, "startingOffsets"),
                       (ending if ending is not None else opts.ending, "endingOffsets")):
        if isinstance(spec, dict):
            check_offsets_json(spec, state, name, narrowed=opts.pushed)
    starting = opts.starting if starting is None else starting
    ending = opts.ending if ending is None else ending
    out = {}
    for key, (_cq, lo, hi) in state.items():
        s = lo if starting == "earliest" else hi if starting == "latest" else starting[key]
        e = hi if ending == "latest" else ending[key]
        s = lo if s == EARLIEST else hi if s == LATEST else s
        e = hi if e == LATEST else e
        if opts.starting_timestamp is not None:
            s = offset_for_time(store, state, tail, key, opts.starting_timestamp)
        if opts.ending_timestamp is not None:
            e = offset_for_time(store, state, tail, key, opts.ending_timestamp)
        if s < lo:
            msg = (f"{key[0]} queue {key[1]}: offsets {s}..{lo} were removed by retention (the earliest is {lo})")
            if opts.fail_on_data_loss:
                raise OffsetRangeError(msg + "; set failOnDataLoss=false to skip them")
            log.warning("%s; skipping them", msg)
            s = lo
        if e > hi:
            e = hi  # an end past the data: everything there is
        if e < s:
            raise OffsetRangeError(f"{key[0]} queue {key[1]}: ending offset {e} is before starting offset {s}")
        # pushed-down offset filters narrow the range (Spark still applies them to the rows)
        s = max(s, opts.offset_lo)
        e = max(s, e if opts.offset_hi is None else min(e, opts.offset_hi))
        out[key] = (s, e)
    return out


def check_offsets_json(spec, state, name, narrowed=False):
    """A JSON offsets spec names exactly the queues being read (Kafka: "you must specify all TopicPartitions")."""
    def show(keys):
        return ", ".join(f"{t}/{q}" for t, q in sorted(keys))

    missing = [k for k in state if k not in spec]
    unknown = [] if narrowed else [k for k in spec if k not in state]
    if missing:
        raise ConfigError(f"{name} JSON must give every queue of the topics read (-2 earliest, -1 latest); "
                          f"missing: {show(missing)}")
    if unknown:
        raise ConfigError(f"{name} names queues the store does not have (or topics not read): {show(unknown)}")


def queue_partitions(store, state, offsets, opts, parts_wanted):
    """QueueRange partitions: each queue's range split so the whole read spreads over ``parts_wanted`` tasks."""
    total = sum(e - s for s, e in offsets.values())
    if total == 0:
        return []
    per = max(4096, math.ceil(total / max(1, parts_wanted)))
    out = []
    for key, (s, e) in sorted(offsets.items()):
        cq = state[key][0]
        while s < e:
            stop = min(e, s + per)
            out.append(QueueRange(cq.topic, cq.queue_id, cq.path, store.commitlog, store.segment_size, s, stop,
                                  opts.fail_on_data_loss, opts.check_crc))
            s = stop
    return out


def segment_partitions(store, lo_phys, hi_phys, opts, parts_wanted, queues=(), bounds=None, with_ts=False):
    """Partitions covering records in [lo_phys, hi_phys), cut at record boundaries into equal byte shares.

    The count is a multiple of ``parts_wanted`` (each task of a wave gets the same share) and no share exceeds
    a segment; a share that crosses a segment end is a SegmentRanges, else a SegmentRange. (One partition per
    core, where one per segment piece left a third, short task for 1.5 segments on 2 cores: +9 % rows/s.)
    """
    total = hi_phys - lo_phys
    if total <= 0:
        return []
    wanted = max(1, parts_wanted)
    count = wanted * math.ceil(total / (wanted * store.segment_size))
    piece = max(4096, math.ceil(total / count))
    cuts = []
    target = lo_phys + piece
    while target < hi_phys - piece // 4:
        b = store.boundary_at(target, queues)
        if b is None or b >= hi_phys:
            break
        if b > (cuts[-1] if cuts else lo_phys):
            cuts.append(b)
        target = max(target + piece, b + 1)
    groups = [[] for _ in range(len(cuts) + 1)]
    topics = opts.topics
    for base, fpath in store.segments:
        s, e = max(lo_phys, base), min(hi_phys, base + store.segment_size)
        if s >= e:
            continue
        inside = [c for c in cuts if s < c < e]
        for a, b in zip([s] + inside, inside + [e]):
            groups[bisect.bisect_right(cuts, a)].append(
                SegmentRange(fpath, base, store.segment_size, a - base, b - base, topics, bounds,
                             opts.starting_timestamp if with_ts else None,
                             opts.ending_timestamp if with_ts else None, opts.check_crc))
    return [g[0] if len(g) == 1 else SegmentRanges(tuple(g)) for g in groups if g]


def plan_batch(opts):
    """Plan a batch read of ``opts.path``: a consistent prefix of the store as it is now.

    With ConsumeQueues, per-queue offsets come from them and the commit log is read up to the furthest record
    they index; records past it (never dispatched) are read too when no writer holds the store (see
    ``store_state``). Without ConsumeQueues, the last segment is walked to the end of its complete records and
    offsets come from the records. Raises NotAStoreError, CorruptStoreError (wrong segment size, gaps),
    CorruptFrameError, OffsetRangeError or ConfigError.
    """
    store = StoreFiles(opts.path, opts.segment_size)
    parts_wanted = opts.target_partitions
    if not store.segments:
        return Plan([], {}, "segment", 0)
    state, bound, tail = store_state(store, opts)
    if not state and not store.queues():
        # no ConsumeQueues (a bare commit log): scan it, with offsets and times as row filters
        if isinstance(opts.starting, dict) or isinstance(opts.ending, dict):
            bounds = {}
            for key, s in (opts.starting.items() if isinstance(opts.starting, dict) else ()):
                bounds[key] = (max(s, 0), -1)
            for key, e in (opts.ending.items() if isinstance(opts.ending, dict) else ()):
                bounds[key] = (bounds.get(key, (0, -1))[0], e)
        else:
            bounds = None
        end = store.walk_end()
        parts = segment_partitions(store, store.min_offset, end, opts, parts_wanted, (), bounds, with_ts=True)
        return Plan(parts, {}, "segment", end)
    if not state:
        return Plan([], {}, "queue", bound)  # the store indexes its topics, none of those asked for
    offsets = resolve_offsets(store, opts, state, tail=tail)
    covered, beyond = split_ranges(state, tail, offsets)
    selected = sum(e - s for s, e in covered.values())
    whole = sum(_cq_end(state, tail, k) - lo for k, (cq, lo, _) in state.items() if cq is not None)
    rest = sum(e - s for s, e in beyond.values())
    tail_parts = max(1, round(parts_wanted * rest / max(1, selected + rest))) if rest else 0
    parts = tail_partitions(store, tail, beyond, opts, tail_parts) if rest else []
    parts_wanted = max(1, parts_wanted - tail_parts)
    mode = opts.partitioning
    if mode == "auto":
        mode = "segment" if selected * 2 >= whole else "queue"
    if mode == "queue":
        return Plan(queue_partitions(store, state, covered, opts, parts_wanted) + parts, offsets, "queue", bound)
    exact = all(covered.get(k) == (lo, _cq_end(state, tail, k)) for k, (cq, lo, _) in state.items()
                if cq is not None and lo < _cq_end(state, tail, k))
    lo_phys, hi_phys = None, 0
    for key, (s, e) in covered.items():
        cq = state[key][0]
        u = cq.unit(s)
        lo_phys = u[0] if lo_phys is None else min(lo_phys, u[0])
        hi_phys = max(hi_phys, cq.end_phys(e))
    if lo_phys is None:
        return Plan(parts, offsets, "segment", bound)
    # every queue read whole up to the bound: no row filter; else each row is checked against its queue's range
    bounds = None if exact else dict(covered)
    queues = [cq for cq, _, _ in state.values() if cq is not None]
    return Plan(segment_partitions(store, lo_phys, hi_phys, opts, parts_wanted, queues, bounds) + parts, offsets,
                "segment", bound)
