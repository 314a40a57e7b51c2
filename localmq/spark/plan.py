"""Read-only planning of a read over a store's files (store.files): per-queue offsets and partitions."""

import bisect
import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Union

from localmq.errors import ConfigError, CorruptStoreError
from localmq.layout import (
    LOCK_FILE,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from localmq.spark.options import DEFAULT_SEGMENT, EARLIEST, LATEST, Offsets, OffsetSpec, ReadOptions
from localmq.status import Stop
from localmq.store.files import ConsumeQueueFiles, StoreFiles
from localmq.store.settings import read_settings

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "StoreFiles",
    "ConsumeQueueFiles",
    "ReadOptions",
    "SegmentRange",
    "SegmentRanges",
    "QueueRange",
    "OffsetRangeError",
    "plan_batch",
    "resolve_offsets",
    "queue_partitions",
    "queue_state",
    "store_state",
    "writer_active",
    "Tail",
    "offset_for_time",
    "split_ranges",
    "tail_partitions",
    "check_offsets_json",
    "open_store_files",
    "dispatched",
    "DEFAULT_SEGMENT",
    "EARLIEST",
    "LATEST",
]

log = logging.getLogger("localmq.spark")

Key = tuple[str, int]  # (topic, queue id)
Ranges = dict[Key, tuple[int, int]]  # {(topic, queue id): (start, end)} of queue offsets
# {(topic, queue id): (ConsumeQueue or None when only the tail has the queue, first offset, end offset)}
State = dict[Key, tuple[ConsumeQueueFiles | None, int, int]]


class OffsetRangeError(CorruptStoreError):
    """Requested offsets that retention already removed (``failOnDataLoss`` true), or an ending before a start."""


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
    topics: tuple[str, ...] | None = None
    bounds: Ranges | None = None
    min_ts: int | None = None
    max_ts: int | None = None
    check_crc: bool = True
    tag_names: frozenset[str] | None = None  # rows whose TAGS is one of these (None: every row)
    sql: str | None = None  # rows whose properties match this SQL92 expression (None: every row)


@dataclass(frozen=True)
class SegmentRanges:
    """One partition over the end of a segment and the start of the next (or more): SegmentRanges read in order."""

    ranges: tuple[SegmentRange, ...]


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
    check_crc: bool = True
    tag_names: frozenset[str] | None = None  # units whose tags code is one of these tags' hash codes, then rows
    sql: str | None = None  # rows whose properties match this SQL92 expression


# one planned partition: what a task reads
Partition = Union[SegmentRange, SegmentRanges, QueueRange]


@dataclass
class Plan:
    """What a batch read will return: per-queue offsets (when ConsumeQueues exist) and the partitions."""

    partitions: list["Partition"]
    offsets: Ranges = field(default_factory=dict)  # {(topic, qid): (start, end)}
    mode: str = "segment"
    bound: int = 0


def queue_state(store: StoreFiles, topics: Iterable[str] | None) -> tuple[State, int]:
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
    state: State = {}
    for cq in store.queues(topics if topics is None else set(topics)):
        m = cq.offset_before(bound, cq.max_offset())
        lo = cq.min_offset(store.min_offset, m)
        state[(cq.topic, cq.queue_id)] = (cq, lo, max(lo, m))
    return state, bound


def writer_active(root: str) -> bool | None:
    """Whether a process on this host holds the store's ``lock`` file (a localmq writer or a RocketMQ broker).

    Read from /proc/locks, so the lock file is never opened: closing a descriptor of it would drop this process's
    own POSIX lock if it is the writer. Returns None when that cannot be told (no /proc/locks); a writer on
    another host of a shared filesystem is not seen.
    """
    try:
        st = os.stat(os.path.join(root, LOCK_FILE))
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
    queues: Ranges = field(default_factory=dict)
    times: "dict[Key, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]" = field(default_factory=dict)


def scan_tail(store: StoreFiles, start: int, with_times: bool = False) -> Tail:
    """Walk and decode the records from ``start`` to the end of the complete records (Tail); ``times`` is only
    filled ``with_times`` (16 bytes a record, for offset-by-time)."""
    import numpy as np

    from localmq._columns import RecordColumns, decode_range, topic_codes

    start = max(start, store.min_offset)
    end = store.walk_end(start, known_end=start)  # a torn write past the queues ends the log, as in recovery
    tail = Tail(start, max(start, end))
    found: dict[Key, list[tuple[int, int, tuple[npt.NDArray[Any], npt.NDArray[Any]] | None]]] = {}
    for base, fpath in store.segments:
        s, e = max(start, base), min(end, base + store.segment_size)
        if s >= e:
            continue
        mf = store.map_segment(base, fpath)
        try:
            pos = s - base
            while pos < e - base:
                cols = RecordColumns(65536)
                n, pos, reason = decode_range(mf, cols, pos, e - base, base, False)
                if n:
                    codes, names = topic_codes(cols)
                    keep = np.flatnonzero(dispatched(cols["sys_flag"]))
                    key = (codes.astype(np.int64) << 32 | cols["queue_id"].astype(np.int64))[keep]
                    qoff, ts = cols["queue_offset"][keep], cols["store_timestamp"][keep]
                    for k in np.unique(key).tolist():
                        m = key == k
                        q = qoff[m]
                        found.setdefault((names[k >> 32], k & 0xFFFFFFFF), []).append(
                            (int(q.min()), int(q.max()) + 1, (q, ts[m]) if with_times else None)
                        )
                if reason != Stop.FULL:
                    break  # blank (end of this segment) or the end walked to above
        finally:
            mf.close()
    for k, parts in found.items():
        tail.queues[k] = (min(a for a, _, _ in parts), max(b for _, b, _ in parts))
        if with_times:
            runs = [t for _, _, t in parts if t is not None]  # all of them: found with_times
            tail.times[k] = (np.concatenate([q for q, _ in runs]), np.concatenate([ts for _, ts in runs]))
    return tail


def dispatched(sys_flag: "npt.NDArray[np.integer[Any]]") -> "npt.NDArray[np.bool_]":
    """Rows a dispatcher indexes (a bool array of a sys_flag array): all but PREPARED and ROLLBACK transactional
    records (RocketMQ's rule)."""
    txn = sys_flag & SYSFLAG_TRANSACTION_MASK
    keep: npt.NDArray[np.bool_] = (txn != SYSFLAG_TRANSACTION_PREPARED) & (txn != SYSFLAG_TRANSACTION_ROLLBACK)
    return keep


def store_state(store: StoreFiles, opts: ReadOptions) -> tuple[State, int, Tail | None]:
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


def _pushed_queues(state: State, opts: ReadOptions) -> State:
    if opts.queue_ids is not None:
        for key in [k for k in state if k[1] not in opts.queue_ids]:
            del state[key]
    return state


def _cq_end(state: State, tail: Tail | None, key: Key) -> int:
    """The end of what ``key``'s ConsumeQueue covers (where its tail part begins)."""
    cq, lo, hi = state[key]
    if tail is not None and key in tail.queues:
        return max(lo, min(hi, tail.queues[key][0])) if cq is not None else lo
    return hi


def offset_for_time(store: StoreFiles, state: State, tail: Tail | None, key: Key, ts: int) -> int:
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


def split_ranges(state: State, tail: Tail | None, offsets: Ranges) -> tuple[Ranges, Ranges]:
    """Split per-queue [start, end) into the part the ConsumeQueues cover and the part only the tail has."""
    covered: Ranges = {}
    beyond: Ranges = {}
    for key, (s, e) in offsets.items():
        cq_hi = _cq_end(state, tail, key)
        if state[key][0] is not None and s < min(e, cq_hi):
            covered[key] = (s, min(e, cq_hi))
        if e > max(s, cq_hi):
            beyond[key] = (max(s, cq_hi), e)
    return covered, beyond


def tail_partitions(
    store: StoreFiles, tail: Tail | None, beyond: Ranges, opts: ReadOptions, parts_wanted: int
) -> list[Partition]:
    """SegmentRange partitions over the tail keeping only the rows in ``beyond``'s per-queue ranges."""
    if not beyond:
        return []
    assert tail is not None  # split_ranges finds offsets beyond the ConsumeQueues only in a tail
    bounds = {key: beyond.get(key, (0, 0)) for key in tail.queues}
    bounds.update(beyond)
    return segment_partitions(store, tail.start, tail.end, opts, parts_wanted, (), bounds)


def resolve_offsets(
    store: StoreFiles,
    opts: ReadOptions,
    state: State,
    starting: OffsetSpec | None = None,
    ending: Literal["latest"] | Offsets | None = None,
    tail: Tail | None = None,
) -> Ranges:
    """Per-queue [start, end) offsets for ``opts`` (earliest / latest / JSON / timestamps), checking data loss.

    A JSON ``startingOffsets`` / ``endingOffsets`` must name every queue of the topics read (Kafka's rule), so
    that a queue left out is an error rather than a silent default; -2 / -1 stand for earliest / latest.
    """
    for spec, name in (
        (starting if starting is not None else opts.starting, "startingOffsets"),
        (ending if ending is not None else opts.ending, "endingOffsets"),
    ):
        if isinstance(spec, dict):
            check_offsets_json(spec, state, name, narrowed=opts.pushed)
    starting = opts.starting if starting is None else starting
    ending = opts.ending if ending is None else ending
    out: Ranges = {}
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
            msg = f"{key[0]} queue {key[1]}: offsets {s}..{lo} were removed by retention (the earliest is {lo})"
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


def check_offsets_json(spec: Offsets, state: State, name: str, narrowed: bool = False) -> None:
    """A JSON offsets spec names exactly the queues being read (Kafka: "you must specify all TopicPartitions")."""

    def show(keys: Iterable[Key]) -> str:
        return ", ".join(f"{t}/{q}" for t, q in sorted(keys))

    missing = [k for k in state if k not in spec]
    unknown = [] if narrowed else [k for k in spec if k not in state]
    if missing:
        raise ConfigError(
            f"{name} JSON must give every queue of the topics read (-2 earliest, -1 latest); missing: {show(missing)}"
        )
    if unknown:
        raise ConfigError(f"{name} names queues the store does not have (or topics not read): {show(unknown)}")


def queue_partitions(
    store: StoreFiles, state: State, offsets: Ranges, opts: ReadOptions, parts_wanted: int
) -> list[Partition]:
    """QueueRange partitions: each queue's range split so the whole read spreads over ``parts_wanted`` tasks."""
    total = sum(e - s for s, e in offsets.values())
    if total == 0:
        return []
    per = max(4096, math.ceil(total / max(1, parts_wanted)))
    out: list[Partition] = []
    for key, (s, e) in sorted(offsets.items()):
        cq = state[key][0]
        while s < e:
            assert cq is not None  # the offsets are ranges ConsumeQueues cover (split_ranges)
            stop = min(e, s + per)
            out.append(
                QueueRange(
                    cq.topic,
                    cq.queue_id,
                    cq.path,
                    store.commitlog,
                    store.segment_size,
                    s,
                    stop,
                    opts.fail_on_data_loss,
                    opts.check_crc,
                    opts.tag_names,
                    opts.sql,
                )
            )
            s = stop
    return out


def segment_partitions(
    store: StoreFiles,
    lo_phys: int,
    hi_phys: int,
    opts: ReadOptions,
    parts_wanted: int,
    queues: Sequence[ConsumeQueueFiles] = (),
    bounds: Ranges | None = None,
    with_ts: bool = False,
) -> list[Partition]:
    """Partitions covering records in [lo_phys, hi_phys), cut at record boundaries into equal byte shares.

    The count is a multiple of ``parts_wanted`` (each task of a wave gets the same share) and no share exceeds
    a segment; a share that crosses a segment end is a SegmentRanges, else a SegmentRange. (One partition per
    core, where one per segment piece left a third, short task for 1.5 segments on 2 cores: +9 % rows/s.)
    """
    total = hi_phys - lo_phys
    if total <= 0:
        return []
    gaps = [g for g in store.gap_offsets() if lo_phys <= g < hi_phys]
    if gaps:
        # messages there were lost to damage (recovery replaced them by gap records, which the walk steps over)
        msg = (
            f"the commit log range read holds {len(gaps)} gap record(s) where damaged messages were (offsets "
            f"{gaps[:5]}{'...' if len(gaps) > 5 else ''}; the damaged bytes are in {store.root}/recovery)"
        )
        if opts.fail_on_data_loss:
            raise OffsetRangeError(msg + "; set failOnDataLoss=false to read past them")
        log.warning("%s; reading past them", msg)
    wanted = max(1, parts_wanted)
    count = wanted * math.ceil(total / (wanted * store.segment_size))
    piece = max(4096, math.ceil(total / count))
    cuts: list[int] = []
    target = lo_phys + piece
    while target < hi_phys - piece // 4:
        b = store.boundary_at(target, queues)
        if b is None or b >= hi_phys:
            break
        if b > (cuts[-1] if cuts else lo_phys):
            cuts.append(b)
        target = max(target + piece, b + 1)
    groups: list[list[SegmentRange]] = [[] for _ in range(len(cuts) + 1)]
    topics = opts.topics
    for base, fpath in store.segments:
        s, e = max(lo_phys, base), min(hi_phys, base + store.segment_size)
        if s >= e:
            continue
        inside = [c for c in cuts if s < c < e]
        for a, b in zip([s] + inside, inside + [e]):
            groups[bisect.bisect_right(cuts, a)].append(
                SegmentRange(
                    fpath,
                    base,
                    store.segment_size,
                    a - base,
                    b - base,
                    topics,
                    bounds,
                    opts.starting_timestamp if with_ts else None,
                    opts.ending_timestamp if with_ts else None,
                    opts.check_crc,
                    opts.tag_names,
                    opts.sql,
                )
            )
    return [g[0] if len(g) == 1 else SegmentRanges(tuple(g)) for g in groups if g]


def open_store_files(opts: ReadOptions) -> StoreFiles:
    """StoreFiles of ``opts.path`` with the segment size from ``mapped_file_size_commit_log``, else the store's
    settings record (config/localmq.json), else the size of its segment files: a store written with other sizes
    needs no option."""
    size = opts.segment_size
    if size is None and os.path.isdir(opts.path):
        size = (read_settings(opts.path) or {}).get("mapped_file_size_commit_log")
    return StoreFiles(opts.path, size)


def plan_batch(opts: ReadOptions) -> Plan:
    """Plan a batch read of ``opts.path``: a consistent prefix of the store as it is now.

    With ConsumeQueues, per-queue offsets come from them and the commit log is read up to the furthest record
    they index; records past it (never dispatched) are read too when no writer holds the store (see
    ``store_state``). Without ConsumeQueues, the last segment is walked to the end of its complete records and
    offsets come from the records. Raises NotAStoreError, CorruptStoreError (wrong segment size, gaps),
    CorruptFrameError, OffsetRangeError or ConfigError.
    """
    store = open_store_files(opts)
    parts_wanted = opts.target_partitions
    if not store.segments:
        return Plan([], {}, "segment", 0)
    state, bound, tail = store_state(store, opts)
    if not state and not store.queues():
        # no ConsumeQueues (a bare commit log): scan it, with offsets and times as row filters
        if isinstance(opts.starting, dict) or isinstance(opts.ending, dict):
            bounds: Ranges | None
            bounds = {}
            for key, s in opts.starting.items() if isinstance(opts.starting, dict) else ():
                bounds[key] = (max(s, 0), -1)
            for key, e in opts.ending.items() if isinstance(opts.ending, dict) else ():
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
    exact = all(
        covered.get(k) == (lo, _cq_end(state, tail, k))
        for k, (cq, lo, _) in state.items()
        if cq is not None and lo < _cq_end(state, tail, k)
    )
    lo_phys: int | None = None
    hi_phys = 0
    for key, (s, e) in covered.items():
        cq = state[key][0]
        assert cq is not None  # covered: ranges of queues with a ConsumeQueue (split_ranges)
        u = cq.unit(s)
        if u is None:  # no file of the queue holds unit s (a file missing among its names): was a TypeError here
            raise CorruptStoreError(f"consume queue {cq.path}: unit {s}, the first planned to be read, is missing")
        lo_phys = u[0] if lo_phys is None else min(lo_phys, u[0])
        hi_phys = max(hi_phys, cq.end_phys(e))
    if lo_phys is None:
        return Plan(parts, offsets, "segment", bound)
    # every queue read whole up to the bound: no row filter; else each row is checked against its queue's range
    bounds = None if exact else dict(covered)
    queues = [cq for cq, _, _ in state.values() if cq is not None]
    return Plan(
        segment_partitions(store, lo_phys, hi_phys, opts, parts_wanted, queues, bounds) + parts,
        offsets,
        "segment",
        bound,
    )
