"""IndexFile and IndexService: RocketMQ's hash index of message keys by "topic#key" and time (spec section 3).

Files: ``<root>/index/<yyyyMMddHHmmssSSS>`` (creation time, local time zone, as RocketMQ names them; a name is
bumped by 1 ms when two files would be created in the same millisecond), each a MappedFile of
``40 + max_hash_slot_num*4 + max_index_num*20`` bytes (420,000,040 with the defaults), blocks reserved at
creation (fallocate) so that indexing never SIGBUSes on a full disk. Layout, hashing and the insert and query
rules are RocketMQ 4.x's byte for byte (see localmq._index): a broker with the same ``maxHashSlotNum`` /
``maxIndexNum`` reads these files, and localmq reads the broker's.

Geometry of a file that is loaded: RocketMQ takes it from its config for every file. localmq uses the config
when the file has the configured size; otherwise it infers it from the size, assuming RocketMQ's ratio of 4
items per slot (the defaults, 5M/20M, and IndexFileTest's 100/400 both have it): ``slots = (size - 40) / 84``.
A size that fits neither raises CorruptStoreError; ``IndexFile.open`` also takes an explicit geometry.

Design choices:
- One writer thread (the index dispatch service, localmq.services.index) inserts keys with a C loop over
  decoded records (``localmq._index.index_rows``) without the GIL; queries run in any thread concurrently.
  The list of files is replaced whole under ``lock`` (roll, retention, recovery); a query takes a snapshot and
  reads each file through a buffer export, so retention can never unmap a file under it.
- Rolling: a file is full when indexCount reaches max_index_num; the next file starts with the previous one's
  end offset and time, the full file is flushed and ``checkpoint.index_msg_timestamp`` is set to its end
  time, then the checkpoint is flushed (RocketMQ's IndexService.flush). A record's keys may span two files.
- Recovery (``load``): after a clean exit every file is kept. After an unclean exit (``abort`` present), as
  RocketMQ's ``IndexService.load(lastExitOK=false)``, files whose endTimestamp is past the checkpoint's index
  timestamp are deleted, and so is a file that is not full (the one being written: its counts may be torn;
  this also covers a file whose end time equals the checkpoint's). Files whose entries point at or past the
  commit log's end (a log cut back by recovery) are deleted too. Unlike RocketMQ, the index is then rebuilt
  from the log: indexing resumes at the last kept file's endPhyOffset (``resume_offset``), so what was
  deleted is indexed again (``message_index_safe`` is therefore not needed for a complete index).
- Retention: ``delete_expired_file(min_offset)`` deletes files (never the last) whose endPhyOffset is below the
  commit log's min offset, oldest first, as RocketMQ's IndexService.deleteExpiredFile (destroy, 3 s forcibly).
- Queries: RocketMQ's queryOffset walk (files newest first, those whose time range meets [begin, end], stop
  after a file that begins before ``begin``), returning candidate offsets newest first. Item times have
  second precision (begin + whole seconds, never later than the real store time), so callers that filter by
  the record's real store time widen ``begin`` by one second (``query_offsets`` does).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional

import numpy as np
import numpy.typing as npt

from localmq import _index
from localmq._mapped_file import MappedFile
from localmq._native import fsync_dir
from localmq.errors import ConfigError, CorruptStoreError, StoreClosedError
from localmq.layout import (
    INDEX_DIR,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    INDEX_ITEM_SIZE,
    INDEX_ITEMS_PER_SLOT,
    INDEX_MAX_FILE_SIZE,
    INDEX_NAME_DIGITS,
    INDEX_SLOT_SIZE,
    is_decimal,
)
from localmq.status import Stop
from localmq.store.durable_names import makedirs_durable
from localmq.store.get import read_record

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    from localmq._columns import RecordColumns
    from localmq._record import Message
    from localmq.store.checkpoint import StoreCheckpoint

log = logging.getLogger("localmq.index")

__all__ = [
    "IndexHeader",
    "IndexFile",
    "IndexService",
    "index_file_size",
    "infer_geometry",
    "geometry_from_content",
    "torn_index_write",
    "INDEX_DIR",
]

# IndexService.deleteExpiredFile destroys with a 3 s forcible interval
DESTROY_FORCIBLY_MS = 3000


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """Bytes of an index file: 40 + slots * 4 + items * 20."""
    return INDEX_HEADER_SIZE + hash_slot_num * INDEX_SLOT_SIZE + index_num * INDEX_ITEM_SIZE


def check_geometry(hash_slot_num: int, index_num: int) -> None:
    """Raise ConfigError unless slots >= 1, items >= 2 and the file fits RocketMQ's int32 positions."""
    if hash_slot_num < 1 or index_num < 2:
        raise ConfigError("max_hash_slot_num must be >= 1 and max_index_num >= 2 (item 0 is never used)")
    if index_file_size(hash_slot_num, index_num) > INDEX_MAX_FILE_SIZE:
        raise ConfigError("an index file must stay below 2 GiB (40 + slots*4 + items*20): RocketMQ uses int positions")


def infer_geometry(size: int, hash_slot_num: Optional[int] = None, index_num: Optional[int] = None) -> tuple[int, int]:
    """(slots, items) of an index file of ``size`` bytes.

    With both given they must match the size. Otherwise: the given one fixes the other; with neither,
    RocketMQ's ratio of 4 items per slot is assumed (``slots = (size - 40) / 84``).
    Raises CorruptStoreError when no whole geometry fits.
    """
    body = size - INDEX_HEADER_SIZE
    if hash_slot_num is not None and index_num is not None:
        if index_file_size(hash_slot_num, index_num) != size:
            raise CorruptStoreError(
                f"an index file of {size} bytes does not have {hash_slot_num} slots and {index_num} items"
            )
        return hash_slot_num, index_num
    if hash_slot_num is not None:
        rest = body - hash_slot_num * INDEX_SLOT_SIZE
        if rest >= 2 * INDEX_ITEM_SIZE and rest % INDEX_ITEM_SIZE == 0:
            return hash_slot_num, rest // INDEX_ITEM_SIZE
    elif index_num is not None:
        rest = body - index_num * INDEX_ITEM_SIZE
        if rest >= INDEX_SLOT_SIZE and rest % INDEX_SLOT_SIZE == 0:
            return rest // INDEX_SLOT_SIZE, index_num
    else:
        per = INDEX_SLOT_SIZE + INDEX_ITEMS_PER_SLOT * INDEX_ITEM_SIZE
        if body >= per and body % per == 0:
            return body // per, INDEX_ITEMS_PER_SLOT * (body // per)
    raise CorruptStoreError(
        f"cannot infer the geometry of an index file of {size} bytes: pass hash_slot_num and index_num"
    )


def _probe(fd: int, slots: int, count: int, end_phy: int) -> bool:
    """True when an index file read through ``fd`` looks written with ``slots`` slots: its last item (``count`` - 1)
    is the one that set the header's endPhyOffset, and the slot of that item's key hash points at it."""
    last = count - 1
    item = os.pread(fd, INDEX_ITEM_SIZE, INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE + last * INDEX_ITEM_SIZE)
    if len(item) < INDEX_ITEM_SIZE:
        return False
    h, phy = int.from_bytes(item[:4], "big", signed=True), int.from_bytes(item[4:12], "big", signed=True)
    if h < 0 or phy != end_phy:
        return False
    slot = os.pread(fd, INDEX_SLOT_SIZE, INDEX_HEADER_SIZE + (h % slots) * INDEX_SLOT_SIZE)
    return len(slot) == INDEX_SLOT_SIZE and int.from_bytes(slot, "big", signed=True) == last


def _check_count(path: str, size: int, slots: int, items: int) -> None:
    """Raise CorruptStoreError when the header's indexCount cannot be the file's: above its items, or below the
    items it holds (items are written in order from item 1; RocketMQ reads a count <= 0 as 1, a file never
    flushed; a writer trusting a count below them would overwrite those keys)."""
    with open(path, "rb") as f:
        fd = f.fileno()
        head = os.pread(fd, INDEX_HEADER_SIZE, 0)
        count = INDEX_HEADER.unpack(head)[5] if len(head) == INDEX_HEADER_SIZE else 0
        problem = None
        if count > items:
            problem = f"indexCount {count} exceeds its {items} items"
        else:
            items_at = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE
            if _nonzero(fd, items_at + max(count, 1) * INDEX_ITEM_SIZE, size):
                problem = f"indexCount {count} is below the items the file holds"
    if problem is not None:
        raise CorruptStoreError(f"index file {path}: {problem} (derived data: rebuilt from the commit log)")


def torn_index_write(path: str) -> bool:
    """True when an index file holds exactly one item past its header's indexCount: what a kill between an item's
    write and the count's update leaves (RocketMQ's IndexFile.putKey and localmq's write the item and its slot, then
    the count). A crash artifact, not damage: the open after an unclean exit rebuilds that file's keys from the log.
    False for any other file, or one that cannot be read."""
    try:
        size = os.path.getsize(path)
        fits = geometry_from_content(path)
        slots, items = fits if fits is not None else infer_geometry(size)
        with open(path, "rb") as f:
            fd = f.fileno()
            head = os.pread(fd, INDEX_HEADER_SIZE, 0)
            if len(head) < INDEX_HEADER_SIZE:
                return False
            count = max(INDEX_HEADER.unpack(head)[5], 1)
            if count >= items:
                return False
            at = INDEX_HEADER_SIZE + slots * INDEX_SLOT_SIZE + count * INDEX_ITEM_SIZE
            return _nonzero(fd, at, at + INDEX_ITEM_SIZE) and not _nonzero(fd, at + INDEX_ITEM_SIZE, size)
    except (OSError, CorruptStoreError):
        return False


def _nonzero(fd: int, start: int, end: int) -> bool:
    """Whether a byte of [start, end) of the file is not zero (holes are not read)."""
    for lo, hi in _data_ranges(fd, start, end):
        while lo < hi:
            chunk = os.pread(fd, min(hi - lo, 1 << 20), lo)
            if not chunk:
                break
            if chunk.count(0) != len(chunk):
                return True
            lo += len(chunk)
    return False


def _written_with(path: str, slots: int) -> bool:
    """False when the file's last item and its slot show it was not written with ``slots`` slots (True when it
    holds no item: nothing tells)."""
    with open(path, "rb") as f:
        head = os.pread(f.fileno(), INDEX_HEADER_SIZE, 0)
        if len(head) < INDEX_HEADER_SIZE:
            return True
        end_phy, count = INDEX_HEADER.unpack(head)[3], INDEX_HEADER.unpack(head)[5]
        return count < 2 or _probe(f.fileno(), slots, count, end_phy)


def _data_ranges(fd: int, start: int, end: int) -> List[tuple[int, int]]:
    """[lo, hi) pieces of [start, end) holding data (SEEK_DATA / SEEK_HOLE), or the whole range where unknown."""
    if not hasattr(os, "SEEK_DATA"):
        return [(start, end)]
    out: List[tuple[int, int]] = []
    pos = start
    while pos < end:
        try:
            lo = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data after pos
                break
            return [(start, end)]
        if lo >= end:
            break
        hi = min(os.lseek(fd, lo, os.SEEK_HOLE), end)
        out.append((lo, hi))
        pos = hi
    return out


def geometry_from_content(path: str) -> Optional[tuple[int, int]]:
    """(slots, items) of an index file, read off its content, or None when it cannot be told (no item, or more
    than one geometry fits). RocketMQ's files do not record their geometry and a size fits many; but the last
    item written holds the header's endPhyOffset, and its key's slot points at it. Candidates are tried in the
    order of their cost: RocketMQ's ratio of 4 items a slot (its defaults, localmq's growing files), then every
    geometry of that size, found by scanning the file's data for items whose offset is endPhyOffset (only the data:
    RocketMQ's files are sparse). A file of another geometry that a broker wrote is kept and read that way, and new
    files of a store that has none recorded take it (``settings.infer_settings``)."""
    size = os.path.getsize(path)
    body = size - INDEX_HEADER_SIZE
    with open(path, "rb") as f:
        fd = f.fileno()
        head = os.pread(fd, INDEX_HEADER_SIZE, 0)
        if len(head) < INDEX_HEADER_SIZE:
            return None
        end_phy, count = INDEX_HEADER.unpack(head)[3], INDEX_HEADER.unpack(head)[5]
        if count < 2:
            return None
        per = INDEX_SLOT_SIZE + INDEX_ITEMS_PER_SLOT * INDEX_ITEM_SIZE
        if (
            body % per == 0
            and count <= INDEX_ITEMS_PER_SLOT * (body // per)
            and _probe(fd, body // per, count, end_phy)
        ):
            return body // per, INDEX_ITEMS_PER_SLOT * (body // per)
        # every slot count s that leaves room for ``count`` items (a file a broker extended in place to its
        # configured size holds fewer items than its size allows): the last item of candidate s lies at p0 + 4 s,
        # so one strided read of the file's data finds every s whose item there holds endPhyOffset
        s_max = (body - INDEX_ITEM_SIZE * count) // INDEX_SLOT_SIZE
        if s_max < 1:
            return None
        p0 = INDEX_HEADER_SIZE + INDEX_ITEM_SIZE * (count - 1)
        fits = []
        for lo, hi in _data_ranges(fd, p0 + INDEX_SLOT_SIZE, p0 + INDEX_SLOT_SIZE * (s_max + 1) + INDEX_ITEM_SIZE):
            t = max(1, -(-(lo - p0) // INDEX_SLOT_SIZE))
            t_end = min(s_max + 1, (hi - INDEX_ITEM_SIZE - p0) // INDEX_SLOT_SIZE + 1)
            while t < t_end:
                step = min(t_end - t, 1 << 22)
                raw = os.pread(fd, INDEX_SLOT_SIZE * (step - 1) + INDEX_ITEM_SIZE, p0 + INDEX_SLOT_SIZE * t)
                n = (len(raw) - INDEX_ITEM_SIZE) // INDEX_SLOT_SIZE + 1
                if n <= 0:
                    break
                phys = np.ndarray((n,), ">i8", raw, 4, (INDEX_SLOT_SIZE,))  # the phy field of each candidate item
                for k in np.flatnonzero(phys == end_phy):
                    slots = t + int(k)
                    if _probe(fd, slots, count, end_phy):
                        fits.append((slots, (body - INDEX_SLOT_SIZE * slots) // INDEX_ITEM_SIZE))
                        if len(fits) > 1:
                            return None
                t += step
        return fits[0] if fits else None


@dataclass(frozen=True)
class IndexHeader:
    """The 40-byte header: times in ms, physical offsets, slots ever used, next item number (>= 1)."""

    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int


def _pages_with_blocks(mf: MappedFile) -> npt.NDArray[np.uint8]:
    """One byte per 4 KiB page of ``mf``: 1 where its data extents (SEEK_DATA) say it has blocks."""
    pages = np.zeros((mf.file_size + _PAGE - 1) // _PAGE, np.uint8)
    for lo, hi in mf.data_ranges():
        pages[lo // _PAGE : (hi + _PAGE - 1) // _PAGE] = 1
    return pages


_PAGE = 4096


def _time_matched(times: tuple[int, int], begin: int, end: int) -> bool:
    b, e = times
    return (begin < b and end > e) or b <= begin <= e or b <= end <= e


def _file_name(ms: int) -> str:
    t = time.localtime(ms / 1000.0)
    return time.strftime("%Y%m%d%H%M%S", t) + "%03d" % (ms % 1000)


def _name_ms(name: str) -> int:
    """Inverse of _file_name (local time)."""
    t = time.strptime(name[:14], "%Y%m%d%H%M%S")
    return int(time.mktime(t)) * 1000 + int(name[14:17])


class IndexFile:
    """One index file: a MappedFile with the header, the slot table and the items.

    Use ``IndexFile.create`` (a new file) or ``IndexFile.open`` (an existing one, geometry inferred or given).
    One thread writes; ``select_phy_offsets`` may run in any thread at the same time.
    """

    def __init__(self, mapped_file: MappedFile, hash_slot_num: int, index_num: int):
        self.mapped_file = mapped_file
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        # a byte per 4 KiB page, 1 where the file has blocks: an insert reserves a page before it reads or writes
        # it, a query takes a slot in a page without blocks for empty (a file is sparse: RocketMQ's default
        # geometry is 420 MB, of which a store with few keys uses a few pages)
        self.pages = _pages_with_blocks(mapped_file)

    @classmethod
    def create(
        cls, path: str, hash_slot_num: int, index_num: int, end_phy_offset: int = 0, end_timestamp: int = 0
    ) -> "IndexFile":
        """Create (reserve blocks, map) a new file whose begin and end values start from the previous file's
        end (RocketMQ's IndexFile constructor), with indexCount 1 in its header.

        Raises ConfigError for a bad geometry, OSError (ENOSPC...) when the file cannot be created.
        """
        check_geometry(hash_slot_num, index_num)
        if os.path.exists(path):
            raise FileExistsError(17, "index file exists", path)
        # sparse, its first page reserved (the header); the pages an insert touches are reserved as it goes
        mf = MappedFile(
            path, index_file_size(hash_slot_num, index_num), 0, create=True, reserve=True, reserve_step=_PAGE
        )
        f = cls(mf, hash_slot_num, index_num)
        begin_phy = end_phy_offset if end_phy_offset > 0 else 0
        begin_ts = end_timestamp if end_timestamp > 0 else 0
        mf.write_at(0, INDEX_HEADER.pack(begin_ts, begin_ts, begin_phy, begin_phy, 0, 1))
        return f

    @classmethod
    def open(
        cls, path: str, hash_slot_num: Optional[int] = None, index_num: Optional[int] = None, *, writable: bool = True
    ) -> "IndexFile":
        """Map an existing file. The geometry is checked against, or inferred from, the file size
        (``infer_geometry``). ``writable=False`` maps it read-only (a copy of a broker's store).

        Raises CorruptStoreError when no geometry fits the size, OSError when it cannot be opened.
        """
        size = os.path.getsize(path)
        fits = geometry_from_content(path) if hash_slot_num is None and index_num is None else None
        slots, items = fits if fits is not None else infer_geometry(size, hash_slot_num, index_num)
        _check_count(path, size, slots, items)
        if fits is None and not _written_with(path, slots):
            # the size fits the geometry asked for, the content does not (a broker extended a smaller file in
            # place to its configured size): read it as it was written, or not at all
            fits = geometry_from_content(path)
            if fits is None:
                raise CorruptStoreError(
                    f"index file {path}: its items do not fit {slots} slots, nor any geometry "
                    f"of its size (derived data: rebuilt from the commit log)"
                )
            log.warning(
                "index file %s was written with %d slots and %d items, not the %d and %d its size suggests; "
                "read that way (a RocketMQ broker misreads it)",
                path,
                fits[0],
                fits[1],
                slots,
                items,
            )
            slots, items = fits
            _check_count(path, size, slots, items)
        mf = MappedFile(path, size, 0, create=False, reserve=False, writable=writable)
        return cls(mf, slots, items)

    @property
    def path(self) -> str:
        return os.fspath(self.mapped_file.path)  # a str already: the stub types MappedFile.path wider

    @property
    def file_name(self) -> str:
        return os.path.basename(self.path)

    @property
    def header(self) -> IndexHeader:
        """The header as stored now (indexCount 0, a file never flushed by RocketMQ, reads as 1)."""
        v = list(INDEX_HEADER.unpack(self.mapped_file.read(0, INDEX_HEADER_SIZE)))
        if v[5] <= 0:
            v[5] = 1
        return IndexHeader(*v)

    def _times(self) -> tuple[int, int]:
        """(beginTimestamp, endTimestamp) straight from the mapping (the query path)."""
        return INDEX_HEADER.unpack(self.mapped_file.read(0, INDEX_HEADER_SIZE))[:2]

    @property
    def begin_timestamp(self) -> int:
        return self.header.begin_timestamp

    @property
    def end_timestamp(self) -> int:
        return self.header.end_timestamp

    @property
    def end_phy_offset(self) -> int:
        return self.header.end_phy_offset

    @property
    def index_count(self) -> int:
        return self.header.index_count

    def is_write_full(self) -> bool:
        """indexCount >= index_num: no item left."""
        return self.header.index_count >= self.index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        """RocketMQ's IndexFile.isTimeMatched: the file's [begin, end] times meet the range."""
        return _time_matched(self._times(), begin, end)

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Insert the full index key ``key`` (``"<topic>#<key>"`` in a store). False when the file is full."""
        return _index.put_key(
            self.mapped_file,
            self.hash_slot_num,
            self.index_num,
            _index.key_hash(key),
            phy_offset,
            store_timestamp,
            self.mapped_file.fileno,
            self.pages,
        )

    def select_phy_offsets(self, key: str, max_num: int, begin: int, end: int) -> List[int]:
        """Offsets of items of the full index key ``key`` in [begin, end], newest first (hash matches: the
        caller checks the records). Empty when the file is being destroyed."""
        offsets: List[int] = self._select(_index.key_hash(key), max_num, begin, end).tolist()
        return offsets

    def _select(self, h: int, max_num: int, begin: int, end: int) -> npt.NDArray[np.int64]:
        try:
            return _index.select_offsets(self.mapped_file, self.hash_slot_num, h, begin, end, max_num, self.pages)
        except ValueError:
            if self.mapped_file.closed:  # destroyed by retention after the caller's snapshot
                return np.empty(0, np.int64)
            raise

    def flush(self) -> None:
        """msync every written byte (items, slots and header) of the file."""
        mf = self.mapped_file
        # slots anywhere may be dirty: msync the whole mapping (only dirty pages are written)
        mf.flushed_position = 0
        mf.wrote_position = mf.file_size
        mf.flush(0)

    def close(self) -> None:
        self.mapped_file.close()

    def destroy(self, interval_forcibly_ms: int = DESTROY_FORCIBLY_MS) -> bool:
        """Delete the file (deferred while a query reads it). True when it is gone from the directory."""
        return self.mapped_file.destroy(interval_forcibly_ms)

    def __repr__(self) -> str:
        return f"IndexFile({self.path!r}, slots={self.hash_slot_num}, items={self.index_num})"


class IndexQueries:
    """Key lookups over ``files`` (IndexFile list, oldest first): shared by the writer's IndexService and by the
    IndexReader of another process."""

    files: List[IndexFile]

    # -- queries ----------------------------------------------------------------------------------------------

    def query_messages(
        self,
        commit_log_files: List[MappedFile],
        seg_size: int,
        topic: str,
        key: str,
        max_num: int,
        begin: int,
        end: int,
        uniq_only: bool,
    ) -> List[Message]:
        """Messages of ``topic`` whose KEYS hold ``key`` (unless ``uniq_only``) or whose UNIQ_KEY is ``key``, stored
        within [begin, end] ms: candidates from ``query_offsets``, each read from the commit log (its MappedFiles,
        ``seg_size`` bytes each) and kept only on an exact match, so hash collisions never show. At most
        ``max_num``, the newest matches, returned in log order."""
        cap = max_num + 16
        while True:
            offsets = self.query_offsets(topic, key, cap, begin, end)
            found: List[Message] = []
            for off in offsets:
                m = read_record(commit_log_files, seg_size, off, True)
                if m is None or m.physical_offset != off or m.topic != topic or not begin <= m.store_timestamp <= end:
                    continue  # a hash collision, or a record retention removed
                if (not uniq_only and key in m.keys) or m.uniq_key == key:
                    found.append(m)
                    if len(found) >= max_num:
                        break
            if len(found) >= max_num or len(offsets) < cap:
                break
            cap *= 4  # collisions took places: walk further
        found.sort(key=lambda m: m.physical_offset)
        return found

    def query_offsets(self, topic: str, key: str, max_num: int, begin: int, end: int) -> List[int]:
        """Candidate physical offsets for ``key`` of ``topic`` stored in [begin, end] (ms), newest first,
        distinct, at most ``max_num``: RocketMQ's queryOffset walk with ``begin`` widened by one second (item
        times are whole seconds after the file's begin). Hash collisions are included: check each record.
        """
        h = _index.key_hash(f"{topic}#{key}")
        wbegin = begin - 1000 if begin > -(1 << 62) else begin
        out: List[int] = []
        seen = set()
        for f in reversed(self.files):
            try:
                times = f._times()
                found = (
                    f._select(h, max_num - len(out), wbegin, end).tolist() if _time_matched(times, wbegin, end) else ()
                )
            except StoreClosedError:
                continue  # deleted by retention after the snapshot
            if found:
                for off in found:
                    if off not in seen:
                        seen.add(off)
                        out.append(off)
                        if len(out) >= max_num:
                            return out
            if times[0] < wbegin:
                break
        return out


class IndexReader(IndexQueries):
    """The index files of a store another process writes (a shared store's housekeeper), mapped read-only for key
    lookups: ``refresh`` maps the files created since and forgets deleted ones. The queries are IndexService's; a
    candidate torn by a concurrent write only costs a record read (every match is checked against its record)."""

    def __init__(self, root: str) -> None:
        self.directory = os.path.join(os.fspath(root), INDEX_DIR)
        self.files: List[IndexFile] = []

    def refresh(self) -> None:
        if not os.path.isdir(self.directory):
            return
        names = sorted(n for n in os.listdir(self.directory) if len(n) == 17 and is_decimal(n))
        have = {os.path.basename(f.path): f for f in self.files}
        files = []
        for name in names:
            f = have.pop(name, None)
            if f is None:
                try:
                    f = IndexFile.open(os.path.join(self.directory, name), writable=False)
                except (CorruptStoreError, OSError):
                    continue  # being created right now (not sized yet), or deleted since the listing
            files.append(f)
        for f in have.values():
            f.close()
        self.files = files

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []


class IndexService(IndexQueries):
    """The index files of a store: load and recovery, the writer's current file and roll, queries, retention.

    :param root: the store directory (files in ``<root>/index``).
    :param hash_slot_num, index_num: geometry of new files (StoreConfig max_hash_slot_num / max_index_num).
    :param checkpoint: the StoreCheckpoint (``index_msg_timestamp`` is set after a full file is flushed).
    :param clock: () -> ms since the epoch, for file names; default the wall clock.
    Raises ConfigError for a bad geometry.
    """

    def __init__(
        self,
        root: str,
        hash_slot_num: int,
        index_num: int,
        checkpoint: StoreCheckpoint,
        clock: Optional[Callable[[], int]] = None,
        grow: bool = False,
    ):
        check_geometry(hash_slot_num, index_num)
        # grow: a store's first index file is 1/256 of the configured geometry (4 items a slot, so later opens
        # infer it from the size) and each next one 4 times its predecessor, up to the configured one: a small
        # store does not reserve 420 MB for its keys
        self.grow = grow
        self.directory = os.path.join(os.fspath(root), INDEX_DIR)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.checkpoint = checkpoint
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        # Guards changes of ``files`` (roll by the writer, retention, close); a reader only takes a snapshot.
        # Never held while flushing.
        self.lock = threading.Lock()
        self.files: List[IndexFile] = []
        self.deleted_on_load: List[str] = []
        self.rolls = 0
        self.deleted_files = 0
        self._last_name_ms = 0

    def _next_geometry(self, prev: Optional[IndexFile]) -> tuple[int, int]:
        """(slots, items) of the next file: the configured geometry, or with ``grow`` one that starts small and
        quadruples."""
        if not self.grow:
            return self.hash_slot_num, self.index_num
        slots = max(1024, self.hash_slot_num // 256) if prev is None else prev.hash_slot_num * 4
        if slots * 4 >= self.index_num or slots >= self.hash_slot_num:
            return self.hash_slot_num, self.index_num
        return slots, slots * INDEX_ITEMS_PER_SLOT

    # -- load / recovery ------------------------------------------------------------------------------------

    def load(self, last_exit_ok: bool, commit_log_max_offset: int, remove: Callable[[str], None] = os.unlink) -> None:
        """Map the files of ``<root>/index`` (sorted by name). After an unclean exit, delete those past the
        checkpoint's index time or not full; always delete those whose entries reach ``commit_log_max_offset``
        (see the module docstring). Names that are not 17 digits are ignored with a warning. ``remove`` deletes a
        file (an open that may fail sets it aside instead: OpenUndo.set_aside).

        Raises CorruptStoreError for a file whose size fits no geometry, OSError when one cannot be mapped.
        """
        if not os.path.isdir(self.directory):
            return
        names = sorted(os.listdir(self.directory))
        files: List[IndexFile] = []
        try:
            for name in names:
                path = os.path.join(self.directory, name)
                if len(name) != INDEX_NAME_DIGITS or not is_decimal(name) or not os.path.isfile(path):
                    log.warning("ignoring %s in the index directory: not an index file name", path)
                    continue
                if os.path.getsize(path) == 0:
                    log.warning("removing the empty index file %s (interrupted creation)", path)
                    remove(path)
                    self.deleted_on_load.append(path)
                    continue
                hs: Optional[int]
                n: Optional[int]
                hs = self.hash_slot_num
                n = self.index_num
                if os.path.getsize(path) != index_file_size(hs, n):
                    hs = n = None
                try:
                    files.append(IndexFile.open(path, hs, n))
                except CorruptStoreError as e:
                    # derived data: this file and every later one are deleted and indexed again from the log. After
                    # an unclean exit a torn index file is what a kill inside a key's write leaves (RocketMQ's own
                    # stores show it too): a warning then, an error after a clean exit
                    later = [
                        os.path.join(self.directory, m)
                        for m in names[names.index(name) :]
                        if len(m) == INDEX_NAME_DIGITS and is_decimal(m)
                    ]
                    (log.error if last_exit_ok else log.warning)(
                        "index file %s cannot be used (%s); deleting it and %d later file(s): their keys "
                        "are indexed again from the commit log",
                        path,
                        e,
                        len(later) - 1,
                    )
                    for p in later:
                        if os.path.isfile(p) and not os.path.islink(p):
                            remove(p)
                            self.deleted_on_load.append(p)
                    fsync_dir(self.directory)
                    break
        except BaseException:
            for f in files:
                f.close()
            raise
        index_ts = self.checkpoint.index_msg_timestamp
        keep = len(files)
        for i, f in enumerate(files):
            h = f.header
            if not last_exit_ok and (h.end_timestamp > index_ts or h.index_count < f.index_num):
                keep = i
                break
            if h.index_count > 1 and h.end_phy_offset >= commit_log_max_offset:
                keep = i
                break
        for f in files[keep:]:
            # routine after an unclean exit (RocketMQ does the same): nothing is lost, the keys come back
            (log.info if not last_exit_ok else log.warning)(
                "deleting index file %s (%s); its keys are indexed again from the commit log",
                f.path,
                "unclean exit" if not last_exit_ok else "it points past the commit log end",
            )
            self.deleted_on_load.append(f.path)
            f.close()  # nobody else holds it yet: unmapped now
            remove(f.path)
        if keep < len(files):
            fsync_dir(self.directory)
        self.files = files[:keep]
        if self.files:
            try:
                self._last_name_ms = _name_ms(self.files[-1].file_name)
            except (ValueError, OverflowError):
                self._last_name_ms = 0  # not a date: new names follow the clock

    def resume_offset(self, commit_log_min_offset: int) -> int:
        """Where indexing resumes: the last file's endPhyOffset (its record is checked key by key, so nothing is
        added twice), or the commit log's min offset when there is no file."""
        if self.files:
            h = self.files[-1].header
            if h.end_phy_offset > 0 or h.index_count > 1:
                return max(h.end_phy_offset, commit_log_min_offset)
        return commit_log_min_offset

    # -- writing ----------------------------------------------------------------------------------------------

    def last_file(self) -> Optional[IndexFile]:
        files = self.files
        return files[-1] if files else None

    def roll(self) -> IndexFile:
        """The writer's file after the current one is full (or when there is none): create the next file, then
        flush the full one and record its end time in the checkpoint.

        Raises OSError when the file cannot be created (the caller retries).
        """
        prev = self.last_file()
        if prev is not None and not prev.is_write_full():
            return prev
        end_phy = end_ts = 0
        if prev is not None:
            h = prev.header
            end_phy, end_ts = h.end_phy_offset, h.end_timestamp
        makedirs_durable(self.directory)
        ms = max(self._clock(), self._last_name_ms + 1)
        path = os.path.join(self.directory, _file_name(ms))
        while os.path.exists(path):
            ms += 1
            path = os.path.join(self.directory, _file_name(ms))
        slots, items = self._next_geometry(prev)
        f = IndexFile.create(path, slots, items, end_phy, end_ts)
        fsync_dir(self.directory)
        self._last_name_ms = ms
        with self.lock:
            self.files = self.files + [f]
        self.rolls += 1
        if prev is not None:
            # IndexService.flush(prev): the full file on disk, then its end time as the checkpoint's index time
            prev.flush()
            ts = prev.end_timestamp
            if ts > 0:
                self.checkpoint.index_msg_timestamp = ts
                self.checkpoint.flush()
        return f

    def build(self, data: ReadableBuffer, cols: RecordColumns) -> int:
        """Index every row of ``cols`` (RecordColumns decoded from ``data``). Returns keys added.

        Raises OSError when a new file cannot be created (rows before it are indexed; call again).
        """
        row = key = 0
        added = 0
        n = cols.count
        phys = cols["physical_offset"]
        sts = cols["store_timestamp"]
        sysf = cols["sys_flag"]
        tpos = cols["topic_pos"]
        tlen = cols["topic_len"]
        ppos = cols["props_pos"]
        plen = cols["props_len"]
        while True:
            f = self.last_file()
            mf = f.mapped_file if f is not None else None
            slots = f.hash_slot_num if f is not None else 1
            items = f.index_num if f is not None else 2
            outcome, row, key, k = _index.index_rows(
                mf,
                slots,
                items,
                data,
                phys,
                sts,
                sysf,
                tpos,
                tlen,
                ppos,
                plen,
                row,
                key,
                n,
                mf.fileno if mf is not None else -1,
                f.pages if f is not None else None,
            )
            added += k
            if outcome is Stop.END:
                return added
            self.roll()

    # -- retention / shutdown -------------------------------------------------------------------------------

    def delete_expired_file(self, min_offset: int) -> int:
        """Delete files (never the last) whose endPhyOffset < ``min_offset``, oldest first; stop at the first
        that is kept or whose deletion a reader defers. Returns how many left the list."""
        files = self.files
        victims = []
        for f in files[:-1]:
            if f.end_phy_offset < min_offset:
                victims.append(f)
            else:
                break
        if not victims:
            return 0
        gone = 0
        for f in victims:
            with self.lock:
                self.files = [x for x in self.files if x is not f]
            gone += 1
            if not f.destroy(DESTROY_FORCIBLY_MS):
                log.info("index file %s is still read; it is deleted when released", f.path)
                break
        fsync_dir(self.directory)
        self.deleted_files += gone
        return gone

    def flush(self) -> None:
        """msync every file (the last one is written in place; full ones were flushed when they rolled)."""
        for f in list(self.files):
            if not f.mapped_file.closed:
                f.flush()

    def close(self) -> None:
        """Unmap every file (no flush: call ``flush`` first)."""
        with self.lock:
            files, self.files = self.files, []
        for f in files:
            f.close()

    def stats(self) -> dict[str, int | List[str]]:
        files = self.files
        last = files[-1].header if files else None
        return {
            "files": len(files),
            "rolls": self.rolls,
            "deleted_files": self.deleted_files,
            "deleted_on_load": list(self.deleted_on_load),
            "last_file_index_count": last.index_count if last else 0,
            "end_phy_offset": last.end_phy_offset if last else 0,
            "end_timestamp": last.end_timestamp if last else 0,
        }
