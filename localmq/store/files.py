"""One read-only view of a store directory: segments, ConsumeQueue files, index files, checkpoint and config paths."""

import errno
import os
import re
from collections.abc import Container, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from localmq._mapped_file import MappedFile
from localmq._record import decode_message, scan_record, unknown_format, walk_records
from localmq.config import StoreConfig
from localmq.errors import CorruptFrameError, CorruptStoreError, NotAStoreError
from localmq.layout import (
    ABORT_FILE,
    CHECKPOINT_FILE,
    COMMITLOG_DIR,
    CONFIG_DIR,
    CONSUMEQUEUE_DIR,
    CONSUMEQUEUE_EXT_DIR,
    CQ_BLANK_UNIT_SIZE,
    CQ_DTYPE,
    CQ_UNIT_SIZE,
    GAP_FILE_RE,
    INDEX_DIR,
    INDEX_NAME_DIGITS,
    LOCK_FILE,
    MAX_TOPIC_NAME_BYTES,
    MESSAGE_MAGIC_CODE_V2,
    RECOVERY_DIR,
    SEGMENT_NAME_RE,
    file_name,
    interrupted_creation,
    is_decimal,
)
from localmq.status import RecordStatus
from localmq.store.control_view import committed_end

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "SegmentFile",
    "numbered_files",
    "list_segments",
    "StoreFiles",
    "ConsumeQueueFiles",
    "points_at_records",
    "map_segment",
    "unsafe_entries",
    "numbered_units",
]

DEFAULT_SEGMENT_SIZE = StoreConfig.mapped_file_size_commit_log
# the part of a unit binary searches read: its commit log offset and size (the tags code is not needed)
_CQ_FIELDS = CQ_DTYPE.fields
assert _CQ_FIELDS is not None  # a structured dtype (numpy types ``fields`` as Optional)
_UNIT_HEAD_SIZE = _CQ_FIELDS["tags_code"][1]
_UNIT_HEAD = np.dtype(
    {
        "names": ["offset", "size"],
        "formats": [CQ_DTYPE["offset"], CQ_DTYPE["size"]],
        "offsets": [_CQ_FIELDS["offset"][1], _CQ_FIELDS["size"][1]],
        "itemsize": _UNIT_HEAD_SIZE,
    }
)


# RocketMQ's topic characters, any length: a V2 record may name a topic longer than localmq's names
_LONG_TOPIC_RE = re.compile(rb"[%|a-zA-Z0-9_-]+")


def not_understood(data: "ReadableBuffer", pos: int, status: RecordStatus, end: int) -> tuple[int, int, str] | None:
    """(magic, TOTALSIZE, what) of the record at ``data[pos:]`` (a segment; ``end``: the end of its written data)
    where a walk stopped with ``status`` when localmq does not understand it rather than finds it damaged, else None:
    a record of an unknown format (status "bad magic": ``_record.unknown_format``, README Recovery), or a whole,
    valid V2 record whose topic is longer than MAX_TOPIC_NAME_BYTES, a ConsumeQueue directory name (status "bad
    topic"). Nothing is read for another status (at a hole a read through a mapping may fault)."""
    if status == RecordStatus.BAD_MAGIC:
        magic = unknown_format(data, pos, end)
        if magic is None:
            return None
        size = int.from_bytes(memoryview(data).cast("B")[pos : pos + 4], "big", signed=True)
        return magic, size, "a record of a format localmq does not know"
    if status != RecordStatus.BAD_TOPIC:
        return None
    try:
        m = decode_message(data, pos, check_crc=True, copy=True)
    except CorruptFrameError:
        return None
    if m is None:  # a blank record: no topic (as b"", below)
        return None
    tb = m.topic.encode("utf-8", "surrogateescape")
    if len(tb) <= MAX_TOPIC_NAME_BYTES or _LONG_TOPIC_RE.fullmatch(tb) is None:
        return None
    return (
        MESSAGE_MAGIC_CODE_V2 & 0xFFFFFFFF,
        m.store_size,
        f"a V2 record naming a topic of {len(tb)} bytes, longer than localmq's topic names "
        f"({MAX_TOPIC_NAME_BYTES} bytes, a ConsumeQueue directory name)",
    )


@dataclass(frozen=True)
class SegmentFile:
    """One file named by its 20-digit base offset: ``base``, ``path``, ``size`` (bytes on disk)."""

    base: int
    path: str
    size: int


def numbered_files(directory: str) -> list[SegmentFile]:
    """SegmentFiles of the 20-digit files of ``directory``, sorted by base; [] when it has none or is missing."""
    out = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if SEGMENT_NAME_RE.fullmatch(entry.name) and entry.is_file():
                    out.append(SegmentFile(int(entry.name), entry.path, entry.stat().st_size))
    except FileNotFoundError:
        return []
    out.sort(key=lambda s: s.base)
    return out


def unsafe_entries(root: str | os.PathLike[str], queue_dirs: bool = True) -> list[str]:
    """The store's own entries under ``root`` (commitlog/, consumequeue/ down to the unit files, the ext queues,
    index/, config/, recovery/, checkpoint, abort, lock) that are symlinks or resolve outside ``root``: localmq must
    never write, truncate or delete through them. Returns their paths (empty for a safe store). ``queue_dirs``
    False: consumequeue/ is looked at down to its topic directories only (an open's ConsumeQueueTable refuses a link
    below them as it loads each queue: 100,000 queues are 125,000 directories to list)."""
    root = os.path.realpath(os.fspath(root))
    bad: list[str] = []
    for name in (
        COMMITLOG_DIR,
        CONSUMEQUEUE_DIR,
        CONSUMEQUEUE_EXT_DIR,
        INDEX_DIR,
        CONFIG_DIR,
        RECOVERY_DIR,
        CHECKPOINT_FILE,
        ABORT_FILE,
        LOCK_FILE,
    ):
        top = os.path.join(root, name)
        if not os.path.lexists(top):
            continue
        if os.path.islink(top) or not os.path.realpath(top).startswith(root + os.sep):
            bad.append(top)
            continue
        if not os.path.isdir(top):
            continue
        # the directory entries' own types (d_type): no stat per entry, a store of 100,000 queues has 400,000
        stack = [top]
        shallow = not queue_dirs and name == CONSUMEQUEUE_DIR
        while stack:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    if e.is_symlink():
                        bad.append(e.path)
                    elif e.is_dir(follow_symlinks=False) and not shallow:
                        stack.append(e.path)
            if len(bad) > 100:
                return bad
    return bad


def numbered_units(cq_root: str) -> bool:
    """True when some ``<cq_root>/<topic>/<queue>/`` holds a non-empty 20-digit unit file."""
    try:
        topics = os.listdir(cq_root)
    except FileNotFoundError:
        return False
    for t in topics:
        tdir = os.path.join(cq_root, t)
        if not os.path.isdir(tdir):
            continue
        for q in os.listdir(tdir):
            if any(f.size > 0 for f in numbered_files(os.path.join(tdir, q))):
                return True
    return False


def list_segments(path: str | os.PathLike[str], what: str) -> list[SegmentFile]:
    """SegmentFiles of a directory of 20-digit files, or the one file ``path`` (base: its name when 20 digits,
    else 0). Raises NotAStoreError when the path is missing or the directory holds no such files."""
    path = os.fspath(path)
    if os.path.isdir(path):
        out = numbered_files(path)
        if not out:
            hint = ""
            if what.startswith("commit log") and os.path.isdir(os.path.join(path, COMMITLOG_DIR)):
                hint = f": this is a store's root, pass {os.path.join(path, COMMITLOG_DIR)}"
            raise NotAStoreError(errno.ENOENT, f"no {what} files (20-digit names){hint}", path)
        return out
    if os.path.isfile(path):
        name = os.path.basename(path)
        base = int(name) if SEGMENT_NAME_RE.fullmatch(name) else 0
        return [SegmentFile(base, path, os.stat(path).st_size)]
    raise NotAStoreError(errno.ENOENT, f"no {what} here", path)


def map_segment(path: str, segment_size: int, base: int) -> MappedFile:
    """A read-only MappedFile of the commit log segment at ``path`` (no creation, no lock); close it after use.
    FileNotFoundError when it is gone."""
    return MappedFile(path, segment_size, base, create=False, writable=False)


def points_at_records(units: npt.NDArray[np.void]) -> bool:
    """Whether every unit of a CQ_DTYPE array points at a record (size > 0, not a padding unit)."""
    sizes = units["size"]
    return not ((sizes <= 0).any() or (sizes == CQ_BLANK_UNIT_SIZE).any())


def _segments(
    files: list[SegmentFile], segment_size: int | None, live_end: int | None
) -> tuple[int, list[tuple[int, str]]]:
    """(segment size, [(base, path)]) of a listing of commit log segments, checked: one size (given, or the largest
    file's), names multiples of it, no hole. An empty last file (a creation interrupted or under way) and, in a live
    store (``live_end`` not None), files at or past the segment holding ``live_end`` are left out."""
    if segment_size is None:
        segment_size = max((f.size for f in files), default=0) or DEFAULT_SEGMENT_SIZE
    segment_size = int(segment_size)
    segments: list[tuple[int, str]] = []
    for i, (base, fpath, size) in enumerate((f.base, f.path, f.size) for f in files):
        if interrupted_creation(i, len(files), size):
            continue
        if live_end is not None and base >= live_end and base > 0:
            break  # made ahead of the writer, or being created: nothing committed there yet
        if size != segment_size:
            raise CorruptStoreError(
                f"commit log segment {fpath} is {size} bytes, not the configured {segment_size}: "
                f"pass option mapped_file_size_commit_log={size} if the store was written with that size"
            )
        if base % segment_size:
            raise CorruptStoreError(
                f"commit log segment {fpath}: name is not a multiple of the segment size {segment_size}"
            )
        if segments and base != segments[-1][0] + segment_size:
            raise CorruptStoreError(f"commit log gap: {fpath} follows {segments[-1][1]}")
        segments.append((base, fpath))
    return segment_size, segments


class StoreFiles:
    """The files of a store directory, read-only and without a lock: commit log segments (checked against the
    segment size, given or inferred from the files), ConsumeQueues, index files, checkpoint and config paths.

    ``segments`` holds (base, path) of the commit log segments in order; an empty last segment (a creation
    interrupted or under way) is left out, its path in ``empty_last``. Raises NotAStoreError without a directory or
    its ``commitlog``, CorruptStoreError for segments of another size, misnamed or with gaps.
    """

    def __init__(self, path: str | os.PathLike[str], segment_size: int | None = None) -> None:
        path = os.fspath(path)
        if not os.path.isdir(path):
            if os.path.exists(path):
                raise NotAStoreError(
                    errno.ENOTDIR,
                    "not a localmq / RocketMQ store: a store is a directory, this is "
                    "a file (`localmq dump` reads one segment file)",
                    path,
                )
            raise NotAStoreError(errno.ENOENT, "not a localmq / RocketMQ store: no such directory", path)
        self.root = path
        self.commitlog = os.path.join(path, COMMITLOG_DIR)
        if not os.path.isdir(self.commitlog):
            raise NotAStoreError(errno.ENOENT, "not a localmq / RocketMQ store: it has no commitlog directory", path)
        self.consumequeue = os.path.join(path, CONSUMEQUEUE_DIR)
        self.consumequeue_ext = os.path.join(path, CONSUMEQUEUE_EXT_DIR)
        self.index = os.path.join(path, INDEX_DIR)
        self.config = os.path.join(path, CONFIG_DIR)
        self.checkpoint = os.path.join(path, CHECKPOINT_FILE)
        self.abort = os.path.join(path, ABORT_FILE)
        self.lock = os.path.join(path, LOCK_FILE)
        # A store that processes share grows while it is listed: a listing (readdir) that runs while two segment
        # files are created (the writer's and the one the housekeeper makes ahead) may return the second and miss
        # the first. Segments past the published committed end hold nothing committed and are left out; a hole
        # below it in a live store is listed again (up to 5 times) before it is reported.
        for attempt in range(5):
            files = numbered_files(self.commitlog)
            # processes sharing the store right now publish its committed end: reads stop there (past it a put may
            # be half-copied); None when nobody shares it
            self.live_end = committed_end(path)
            # left out of ``segments`` (layout.interrupted_creation)
            last = len(files) - 1
            self.empty_last = (
                files[-1].path if files and interrupted_creation(last, len(files), files[-1].size) else None
            )
            try:
                self.segment_size, self.segments = _segments(files, segment_size, self.live_end)
                break
            except CorruptStoreError:
                if self.live_end is None or attempt == 4:
                    raise

    # -- paths ----------------------------------------------------------------------------------------------------

    def config_path(self, name: str) -> str:
        """The path of a config file, e.g. ``config_path("consumerOffset.json")``."""
        return os.path.join(self.config, name)

    def segment_path(self, base: int) -> str:
        """The path of the commit log segment starting at ``base`` (whether or not it exists)."""
        return os.path.join(self.commitlog, file_name(base))

    def index_files(self) -> list[SegmentFile]:
        """SegmentFiles of the index files (17-digit creation-time names; ``base`` is that number), by name."""
        out: list[SegmentFile] = []
        try:
            names = sorted(os.listdir(self.index))
        except FileNotFoundError:
            return out
        for name in names:
            p = os.path.join(self.index, name)
            if len(name) == INDEX_NAME_DIGITS and is_decimal(name) and os.path.isfile(p):
                out.append(SegmentFile(int(name), p, os.path.getsize(p)))
        return out

    # -- commit log -----------------------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        """Base of the first segment (0 without segments)."""
        return self.segments[0][0] if self.segments else 0

    def segment_of(self, phys: int) -> tuple[int, str] | None:
        """(base, path) of the segment holding physical offset ``phys``, or None when it is gone."""
        if not self.segments:
            return None
        i = (phys - self.segments[0][0]) // self.segment_size
        if 0 <= i < len(self.segments):
            return self.segments[i]
        return None

    def map_segment(self, base: int, fpath: str) -> MappedFile:
        """A read-only MappedFile of the segment (base, path); close it after use."""
        return map_segment(fpath, self.segment_size, base)

    def store_timestamp(self, phys: int) -> int | None:
        """Store time (ms) of the record at ``phys``; None when its segment is gone. CorruptFrameError when no
        whole record is there."""
        seg = self.segment_of(phys)
        if seg is None:
            return None
        mf = self.map_segment(*seg)
        try:
            msg = decode_message(mf, phys - seg[0], check_crc=False, base_offset=seg[0])
        except CorruptFrameError as exc:
            raise CorruptFrameError(f"no whole record at offset {phys} ({exc})", offset=phys, path=seg[1]) from None
        finally:
            mf.close()
        if msg is None:
            raise CorruptFrameError(f"blank record at offset {phys}, not a message", offset=phys, path=seg[1])
        return msg.store_timestamp

    def gap_offsets(self) -> list[int]:
        """Commit log offsets of the gap records recovery wrote (damaged records whose bytes it copied to
        ``recovery/commitlog-gap-*``; every walker steps over them), sorted."""
        try:
            names = os.listdir(os.path.join(self.root, RECOVERY_DIR))
        except FileNotFoundError:
            return []
        return sorted({int(m.group(1)) for m in map(GAP_FILE_RE.fullmatch, names) if m})

    def walk_end(self, start: int | None = None, known_end: int | None = None) -> int:
        """Physical offset just after the last complete record (walking from ``start``, default the last segment
        that holds data): the end recovery would find.

        Zero bytes or a torn record at the end of the data stop the walk. Trailing segments that begin with zeros
        (made ahead of need, as RocketMQ's AllocateMappedFileService does, and never written) hold no record: the
        walk starts before them. A record of a format localmq does not know (``_record.unknown_format``) is a
        record: the walk steps over it (its TOTALSIZE frames it). An invalid record at or past ``known_end`` (how
        far the ConsumeQueues reach, ``dispatched_end()``; None: nowhere) is what a crash leaves, a torn write
        never dispatched: the log ends there, as in recovery. Below it, it is damage: CorruptFrameError.
        """
        if not self.segments:
            return 0
        if self.live_end is not None and (start is None or start <= self.live_end):
            return self.live_end
        if start is None:
            first = len(self.segments) - 1
            while first > 0 and not self._begins_with_record(*self.segments[first]):
                first -= 1
        else:
            first = max(0, (start - self.min_offset) // self.segment_size)
        end = self.segments[first][0]
        for base, fpath in self.segments[first:]:
            pos = (start - base) if start is not None and start > base else 0
            mf = self.map_segment(base, fpath)
            try:
                # to the end of the data pos lies in: a hole is the end of the records, and is not read (on a full
                # tmpfs a read fault on a hole is a SIGBUS); a gap record that steps over a hole (recovery's, after a
                # power cut) leads into the next run of data, where the walk goes on
                data_end = mf.data_end(pos)
                pos, outcome, _, _, _ = walk_records(mf, pos, data_end, False)
                while True:
                    if outcome == RecordStatus.END and data_end <= pos < self.segment_size and mf.data_end(pos) > pos:
                        data_end = mf.data_end(pos)
                    elif outcome == RecordStatus.BAD_MAGIC and unknown_format(mf, pos, data_end) is not None:
                        pos += int.from_bytes(mf.read(pos, 4), "big", signed=True)
                    else:
                        break
                    pos, outcome, _, _, _ = walk_records(mf, pos, data_end, False)
                if outcome == RecordStatus.BLANK:
                    end = base + self.segment_size
                    continue
                if outcome in (RecordStatus.END, RecordStatus.TORN):
                    return base + pos
                if known_end is not None and base + pos >= known_end:
                    return base + pos
                raise CorruptFrameError(
                    f"{outcome} record at offset {base + pos} of the commit log ({fpath})",
                    offset=base + pos,
                    path=fpath,
                )
            finally:
                mf.close()
        return end

    def _begins_with_record(self, base: int, fpath: str) -> bool:
        """Whether the segment's first 8 bytes are not all zero (a record, or damage, starts there)."""
        mf = self.map_segment(base, fpath)
        try:
            return mf.data_end(0) > 0 and mf.read(0, 8) != bytes(8)
        finally:
            mf.close()

    def dispatched_end(self) -> int:
        """How far the ConsumeQueues reach in the commit log: the end of the record of the last unit of every
        queue, the largest (0 without queues). Records below it were read whole by the dispatcher."""
        end = 0
        for cq in self.queues():
            hi = cq.max_offset()
            u = cq.unit(hi - 1) if hi > cq.first_index else None
            if u is not None and u[1] != CQ_BLANK_UNIT_SIZE:
                end = max(end, u[0] + u[1])
        return end

    def boundary_at(self, target: int, queues: Sequence["ConsumeQueueFiles"] = ()) -> int | None:
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
        mf = self.map_segment(base, fpath)
        try:
            pos, outcome, _, _, _ = walk_records(mf, 0, target - base, False)
            if outcome == RecordStatus.TORN:  # only cut short by ``target``: the boundary is after this record
                status, size = scan_record(mf, pos, False)
                if status == RecordStatus.OK:
                    pos, outcome = pos + size, RecordStatus.END
        finally:
            mf.close()
        if outcome not in (RecordStatus.END, RecordStatus.BLANK):
            raise CorruptFrameError(
                f"{outcome} record at offset {base + pos} of the commit log ({fpath})", offset=base + pos, path=fpath
            )
        return base + pos

    # -- consume queues -------------------------------------------------------------------------------------------

    def queues(self, topics: Container[str] | None = None) -> list["ConsumeQueueFiles"]:
        """ConsumeQueueFiles of every (topic, queue id) directory that holds files, optionally only ``topics``."""
        out: list[ConsumeQueueFiles] = []
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
                if is_decimal(q):
                    cq = ConsumeQueueFiles(topic, int(q), os.path.join(tdir, q))
                    if cq.files:
                        out.append(cq)
        return out


class ConsumeQueueFiles:
    """One ConsumeQueue read with pread (no mapping, no lock): offsets, binary searches, unit ranges.

    ``files``: (base, path) of its non-empty files; ``file_size``: the largest file's size.
    """

    def __init__(self, topic: str, queue_id: int, path: str) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.path = path
        files = numbered_files(path)
        self.file_size = max((f.size for f in files), default=0)
        self.files = [(f.base, f.path) for f in files if f.size > 0]
        for b, p in self.files:
            if b % CQ_UNIT_SIZE:
                raise CorruptStoreError(f"consume queue file {p}: name is not a multiple of {CQ_UNIT_SIZE}")

    def _file_of(self, index: int) -> tuple[int, str] | None:
        if not self.files or self.file_size <= 0:
            return None
        logical = index * CQ_UNIT_SIZE
        i = (logical - self.files[0][0]) // self.file_size
        if 0 <= i < len(self.files):
            base, p = self.files[i]
            if base <= logical < base + self.file_size:
                return base, p
        for base, p in self.files:  # names that do not follow the file size: search them
            if base <= logical < base + self.file_size:
                return base, p
        return None

    @property
    def first_index(self) -> int:
        """The queue offset of the first file's first unit (0 without files)."""
        return self.files[0][0] // CQ_UNIT_SIZE if self.files else 0

    @staticmethod
    def _head(fd: int, at: int) -> tuple[int, int] | None:
        raw = os.pread(fd, _UNIT_HEAD_SIZE, at)
        if len(raw) < _UNIT_HEAD_SIZE:
            return None
        head: tuple[int, int] = np.frombuffer(raw, _UNIT_HEAD)[0].item()
        return head

    def unit(self, index: int) -> tuple[int, int] | None:
        """(physical offset, size) of unit ``index``; None when its file is gone or it is past the end."""
        f = self._file_of(index)
        if f is None:
            return None
        with open(f[1], "rb") as fh:
            return self._head(fh.fileno(), index * CQ_UNIT_SIZE - f[0])

    def unit_runs(self, start: int, end: int) -> Iterator[tuple[int, int, npt.NDArray[np.void] | None]]:
        """Yield (first, stop, units) covering queue offsets [start, end) file by file: ``units`` a CQ_DTYPE array
        of the units read (fewer than stop - first when the file is short), or None when the file is gone."""
        i = start
        while i < end:
            f = self._file_of(i)
            if f is None:
                nxt = next((b // CQ_UNIT_SIZE for b, _ in self.files if b // CQ_UNIT_SIZE > i), end)
                stop = min(nxt, end)
                yield i, stop, None
                i = stop
                continue
            base, path = f
            stop = min(end, (base + self.file_size) // CQ_UNIT_SIZE)
            with open(path, "rb") as fh:
                raw = os.pread(fh.fileno(), (stop - i) * CQ_UNIT_SIZE, i * CQ_UNIT_SIZE - base)
            yield i, stop, np.frombuffer(raw, CQ_DTYPE, count=len(raw) // CQ_UNIT_SIZE)
            i = stop

    def _count_valid(self, base: int, fpath: str) -> int:
        """Units written in one file: a valid prefix (offset >= 0, size > 0) followed by zeros."""
        lo, hi = 0, self.file_size // CQ_UNIT_SIZE
        with open(fpath, "rb") as fh:
            fd = fh.fileno()
            while lo < hi:
                mid = (lo + hi) // 2
                u = self._head(fd, mid * CQ_UNIT_SIZE)
                if u is not None and u[0] >= 0 and u[1] > 0:
                    lo = mid + 1
                else:
                    hi = mid
        return lo

    def max_offset(self) -> int:
        """The queue offset after the last written unit."""
        for base, fpath in reversed(self.files):
            n = self._count_valid(base, fpath)
            if n:
                return base // CQ_UNIT_SIZE + n
        return self.first_index

    def min_offset(self, commitlog_min: int, max_offset: int | None = None) -> int:
        """The first queue offset whose record is still in the commit log (and not a padding unit)."""
        if not self.files:
            return 0
        hi = self.max_offset() if max_offset is None else max_offset
        lo = self.first_index
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is None or u[1] == CQ_BLANK_UNIT_SIZE or u[0] < commitlog_min:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def offset_before(self, phys_bound: int, max_offset: int) -> int:
        """The queue offset after the last unit whose record ends at or below ``phys_bound``."""
        lo, hi = self.first_index, max_offset
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is not None and u[1] != CQ_BLANK_UNIT_SIZE and u[0] + u[1] > phys_bound:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def first_unit_at_or_after(self, phys: int) -> int | None:
        """Physical offset of the first unit at or after ``phys``, or None."""
        hi = self.max_offset()
        lo = self.first_index
        while lo < hi:
            mid = (lo + hi) // 2
            u = self.unit(mid)
            if u is None or u[1] == CQ_BLANK_UNIT_SIZE or u[0] < phys:
                lo = mid + 1
            else:
                hi = mid
        u = self.unit(lo) if lo < self.max_offset() else None
        return None if u is None else u[0]

    def offset_for_time(self, store: StoreFiles, ts: int, lo: int, hi: int) -> int:
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

    def end_phys(self, offset: int) -> int:
        """Physical offset just after the record of unit ``offset - 1`` (0 for an empty range)."""
        u = self.unit(offset - 1) if offset > 0 else None
        return 0 if u is None else u[0] + u[1]
