"""Read-only scanners of RocketMQ store files: CommitLog segments, ConsumeQueue units and ConsumeQueueExt units."""

import errno
import logging
import mmap
import os
from collections import namedtuple
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

import numpy as np
import numpy.typing as npt

from localmq import _record
from localmq.errors import CorruptFrameError, CorruptStoreError, UnknownRecordFormatError
from localmq.layout import CQ_DTYPE, CQ_EXT_ADDRESS_MAX, CQ_EXT_HEAD, CQ_EXT_SIZE, CQ_UNIT_SIZE
from localmq.status import RecordStatus
from localmq.store.control_view import committed_end
from localmq.store.files import SegmentFile, list_segments

__all__ = [
    "CQ_DTYPE",
    "CQ_UNIT_SIZE",
    "EXT_ADDRESS_MAX",
    "CommitLogReader",
    "ConsumeQueueUnits",
    "CqExtUnit",
    "read_commitlog",
    "read_consume_queue",
    "load_consume_queue",
    "read_consume_queue_ext",
    "is_ext_address",
    "ext_offset",
]

log = logging.getLogger("localmq.readers")

EXT_ADDRESS_MAX = CQ_EXT_ADDRESS_MAX
_SIGN_BIT = 1 << 63
_EXT_HEAD = CQ_EXT_HEAD
_EXT_MIN_UNIT = _EXT_HEAD.size
_SCAN_CHUNK = 64 << 20

CqExtUnit = namedtuple("CqExtUnit", "address tags_code msg_store_time bitmap")
CqExtUnit.__doc__ = "One ConsumeQueueExt unit: absolute ext address, tagsCode, store time (ms), filter bitmap bytes."


# ---------------------------------------------------------------------------------------------- segment files


def _find_gaps(segments: Sequence[SegmentFile], file_size: int, what: str) -> list[tuple[int, int]]:
    """(expected base, actual base) for each neighbour pair whose names are not ``file_size`` apart."""
    gaps: list[tuple[int, int]] = []
    if file_size <= 0:
        return gaps
    for prev, cur in zip(segments, segments[1:]):
        expected = prev.base + file_size
        if cur.base != expected:
            gaps.append((expected, cur.base))
            log.warning(
                "%s gap: after %s the next file should start at %d but %s starts at %d",
                what,
                prev.path,
                expected,
                cur.path,
                cur.base,
            )
    return gaps


class _MappedSegment:
    """A read-only mapping of one segment file (no mapping for an empty file)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        try:
            self.size = os.fstat(self.fd).st_size
            self.mm: mmap.mmap | None = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_READ) if self.size else None
        except BaseException:
            os.close(self.fd)
            raise

    def _any_nonzero(self, start: int, end: int) -> bool:
        assert self.mm is not None  # called for data found in the file: it is not empty, so it is mapped
        while start < end:
            stop = min(end, start + _SCAN_CHUNK)
            # the array is a view of the mapping; it is dropped before the mapping can be closed
            if np.frombuffer(self.mm, np.uint8, count=stop - start, offset=start).any():
                return True
            start = stop
        return False

    def has_data(self, start: int = 0, end: int | None = None) -> bool:
        """True when any byte in [start, end) is non-zero. File holes are skipped without being read."""
        end = self.size if end is None else min(end, self.size)
        pos = start
        while pos < end:
            data_at, hole_at = pos, end
            if hasattr(os, "SEEK_DATA"):
                try:
                    data_at = os.lseek(self.fd, pos, os.SEEK_DATA)
                    hole_at = os.lseek(self.fd, data_at, os.SEEK_HOLE)
                except OSError as exc:
                    if exc.errno == errno.ENXIO:  # only holes from pos to the end of the file
                        return False
                    data_at, hole_at = pos, end  # the file system cannot tell: read everything
            if data_at >= end:
                return False
            stop = min(hole_at, end)
            if self._any_nonzero(data_at, stop):
                return True
            pos = stop
        return False

    def close(self) -> None:
        mm, self.mm = self.mm, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                # Messages read with copy=False still hold views of it: the mapping goes when the last one does.
                pass
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            os.close(fd)


def _relocated(msg: _record.Message, offset: int) -> _record.Message:
    """A copy of ``msg`` whose physical offset (and so msg id) is ``offset``."""
    rebuild: Callable[..., _record.Message]
    rebuild, fields = msg.__reduce__()
    args = list(fields)
    # Message's rebuild arguments (_record.pyx) start: topic, body, properties, queue id, queue offset, physical offset
    args[5] = offset
    return rebuild(*args)


# ---------------------------------------------------------------------------------------------- commit log


class CommitLogReader:
    """Iterator of the messages of a commit log directory or segment file, in offset order.

    Build it with ``read_commitlog``. After the iterator is exhausted (or ``close()`` ran):

    - ``stop_reason``: "end" (zero bytes, or the last segment ended with its blank record), "torn" (a record cut
      short or damaged at the very end of the written data: what a crash leaves), "corrupt" (a bad record with
      more data after it) or "unknown format" (a record of a format localmq does not know, README Recovery; the
      reader raises UnknownRecordFormatError there), these two only with ``on_corrupt="stop"``; None while
      reading;
    - ``stop_offset``: the absolute offset where reading stopped (the end of the last good record, or the next
      segment's base after a blank record);
    - ``segments_read``: segment files whose records were walked (not those after the end of the data);
    - ``messages_read``: messages yielded;
    - ``gaps``: (expected base, actual base) pairs of neighbouring segments whose names are not a file size apart;
    - ``gap_records``: (offset, size) of the gap records stepped over (damage that recovery quarantined).

    Not thread-safe: iterate it from one thread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        mapped_file_size: int | None = None,
        check_crc: bool = True,
        copy: bool = True,
        on_corrupt: Literal["raise", "stop"] = "raise",
        start: int = 0,
    ) -> None:
        if on_corrupt not in ("raise", "stop"):
            raise ValueError(f"on_corrupt must be 'raise' or 'stop', not {on_corrupt!r}")
        self.path = os.fspath(path)
        self._segments = list_segments(self.path, "commit log segment")
        sizes = [s.size for s in self._segments]
        self.mapped_file_size = int(mapped_file_size) if mapped_file_size else max(sizes)
        self.check_crc = bool(check_crc)
        self.copy = bool(copy)
        self.on_corrupt = on_corrupt
        self.start = int(start)
        # a store that processes share while it is read: stop at the committed end they publish (past it a put
        # may be half-copied, which would look like damage); None: the files are the whole truth
        self.end = committed_end(os.path.dirname(os.path.abspath(self.path))) if os.path.isdir(self.path) else None
        self.gaps = _find_gaps(self._segments, self.mapped_file_size, "commit log")
        self.stop_reason: str | None = None
        self.stop_offset: int | None = None
        self.segments_read = 0
        self.messages_read = 0
        self.gap_records: list[tuple[int, int]] = []  # (offset, size) of gap records stepped over
        self._relocation_logged = False
        self._gen = self._run()

    @property
    def segments(self) -> list[str]:
        """Paths of the segment files, in offset order."""
        return [s.path for s in self._segments]

    def __iter__(self) -> "CommitLogReader":
        return self

    def __next__(self) -> _record.Message:
        return next(self._gen)

    def close(self) -> None:
        """Stop reading and release the open segment. Idempotent."""
        self._gen.close()

    def __enter__(self) -> "CommitLogReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _later_segments_hold_data(self, index: int) -> bool:
        for seg_file in self._segments[index + 1 :]:
            if seg_file.size == 0:
                continue
            seg = _MappedSegment(seg_file.path)
            try:
                if seg.has_data():
                    return True
            finally:
                seg.close()
        return False

    def _run(self) -> Generator[_record.Message, None, None]:
        end = self.end
        start = self.start
        for index, seg_file in enumerate(self._segments):
            if end is not None and seg_file.base >= end:
                break
            if seg_file.base + max(seg_file.size, 1) <= start:
                continue  # before the first record asked for: never mapped
            seg = _MappedSegment(seg_file.path)
            try:
                self.segments_read += 1
                base, n = seg_file.base, seg.size
                self.stop_offset = base
                if n == 0:
                    continue
                assert seg.mm is not None  # not empty, so mapped
                limit = n if end is None else min(n, end - base)
                pos = max(0, start - base)
                self.stop_offset = base + pos
                while pos < limit:
                    try:
                        msg = _record.decode_message(
                            seg.mm, pos, check_crc=self.check_crc, base_offset=base, copy=self.copy
                        )
                    except CorruptFrameError:
                        status, size = _record.scan_record(seg.mm, pos, False)
                        if status == RecordStatus.GAP and pos + size <= n:
                            # damaged bytes recovery quarantined; the records after them are valid
                            self.gap_records.append((base + pos, size))
                            pos += size
                            self.stop_offset = base + pos
                            continue
                        break  # classified below
                    if msg is None:  # blank record
                        break
                    if msg.physical_offset != base + pos:
                        msg = self._relocate(msg, base + pos, seg_file.path)
                    pos += msg.store_size
                    self.messages_read += 1
                    self.stop_offset = base + pos
                    yield msg
                msg = None  # with copy=False it would keep the mapping exported
                if pos == n:  # the records fill the file exactly: roll to the next one as after a blank
                    continue
                if end is not None and base + pos >= end:
                    # a live shared store's committed end: what lies past it is being written
                    self.stop_offset = end
                    break
                # Why did the walk stop at pos? Torn and corrupt records are told apart by what follows them.
                status, size = _record.scan_record(seg.mm, pos, self.check_crc)
                if status == RecordStatus.BLANK:
                    self.stop_offset = base + n
                    continue
                if status == RecordStatus.END:
                    tail = pos
                elif status == RecordStatus.TORN:
                    tail = n
                elif status in ("bad length", "bad crc"):
                    tail = pos + size
                else:  # bad magic: the claimed size cannot be trusted
                    tail = min(n, pos + 8)
                offset = base + pos
                self.stop_offset = offset
                if status == RecordStatus.BAD_MAGIC and self._unknown_format(seg, seg_file.path, pos, limit, offset):
                    return
                if not seg.has_data(tail) and not self._later_segments_hold_data(index):
                    if status == RecordStatus.END:
                        self.stop_reason = "end"
                    else:
                        self.stop_reason = "torn"
                        log.warning(
                            "commit log %s: %s record at the end of the data (offset %d); stopping there",
                            seg_file.path,
                            status,
                            offset,
                        )
                    return
                self.stop_reason = "corrupt"
                what = "zero bytes" if status == RecordStatus.END else f"{status} record"
                text = f"{what} at offset {offset} of the commit log, followed by more data ({seg_file.path})"
                if self.on_corrupt == "stop":
                    log.warning("commit log: %s; stopping there", text)
                    return
                raise CorruptFrameError(text, offset=offset, path=seg_file.path)
            finally:
                seg.close()
        self.stop_reason = "end"

    def _unknown_format(self, seg: _MappedSegment, path: str, pos: int, limit: int, offset: int) -> bool:
        """Whether the record at ``pos`` is of a format localmq does not know (README, Recovery): not damage, and
        not skipped. True: the walk stops there (``on_corrupt="stop"``); otherwise raises UnknownRecordFormatError.
        False: not such a record."""
        assert seg.mm is not None
        magic = _record.unknown_format(seg.mm, pos, limit)
        if magic is None:
            return False
        self.stop_reason = "unknown format"
        text = (
            f"a record of a format localmq does not know at offset {offset} of the commit log "
            f"(magic 0x{magic:08X}; {path})"
        )
        if self.on_corrupt == "stop":
            log.warning("commit log: %s; stopping there", text)
            return True
        size = int.from_bytes(seg.mm[pos : pos + 4], "big", signed=True)
        raise UnknownRecordFormatError(text, offset=offset, path=path, magic=magic, size=size)

    def _relocate(self, msg: _record.Message, offset: int, path: str) -> _record.Message:
        if not self._relocation_logged:
            self._relocation_logged = True
            log.warning(
                "commit log %s: stored physical offset %d differs from the file position %d; using file positions",
                path,
                msg.physical_offset,
                offset,
            )
        return _relocated(msg, offset)


def read_commitlog(
    path: str | os.PathLike[str],
    *,
    mapped_file_size: int | None = None,
    check_crc: bool = True,
    copy: bool = True,
    on_corrupt: Literal["raise", "stop"] = "raise",
    start: int = 0,
) -> CommitLogReader:
    """Iterate the messages of a RocketMQ commit log, read-only.

    :param path: a ``commitlog`` directory (segment files named by their 20-digit base offset) or one segment
        file (its base is its name when that is 20 digits, else 0).
    :param mapped_file_size: the configured segment size, used to check that segment names are contiguous;
        by default the largest segment file's size.
    :param check_crc: verify each body CRC (a mismatch is a corrupt record).
    :param copy: copy bodies to bytes; with False bodies are memoryviews of the read-only mapping, which stays
        mapped while any of them lives.
    :param on_corrupt: "raise" (default) or "stop" at a corrupt record that has more data after it.
    :param start: the absolute offset of the first record to read (a record boundary: a ConsumeQueue unit's
        offset, a segment base, a ``stop_offset``); the segments before it are not opened.
    :returns: a ``CommitLogReader`` yielding ``localmq._record.Message`` objects whose ``physical_offset`` is the
        segment base plus the record position. A blank record moves to the next segment. Zero bytes end the
        walk ("end"); a torn or damaged record with only zeros after it ends it too ("torn", logged as a
        warning on the "localmq.readers" logger). Telling these apart reads the bytes after the stop point
        (file holes are skipped without reading), which happens once per reader.
    :raises NotAStoreError: (a FileNotFoundError) when the path is missing or holds no segment files.
    :raises CorruptFrameError: while iterating, at a bad record (or zero bytes) followed by more data, with the
        absolute ``offset`` and the segment ``path``; never skipped.
    :raises ValueError: for an unknown ``on_corrupt``.
    """
    return CommitLogReader(
        path, mapped_file_size=mapped_file_size, check_crc=check_crc, copy=copy, on_corrupt=on_corrupt, start=start
    )


# ---------------------------------------------------------------------------------------------- consume queue


@dataclass(frozen=True)
class ConsumeQueueUnits:
    """The valid units of one consume queue, as read from its files.

    ``units`` is a structured array (``CQ_DTYPE``: offset, size, tags_code, big-endian); unit i has queue offset
    ``queue_offset_base + i``. ``stop_reason`` is "end" (a zero unit or the end of the last file), "invalid" (a
    non-zero unit with a negative offset or a size <= 0), "gap" (the next file's name is not contiguous) or
    "partial" (a file length that is not a multiple of 20).
    """

    units: npt.NDArray[np.void]
    queue_offset_base: int
    files: tuple[str, ...]
    stop_reason: str

    def __len__(self) -> int:
        return len(self.units)

    @property
    def max_queue_offset(self) -> int:
        """The queue offset after the last valid unit (RocketMQ's maxOffsetInQueue)."""
        return self.queue_offset_base + len(self.units)

    def queue_offsets(self) -> npt.NDArray[np.int64]:
        """int64 array of the queue offsets of ``units``."""
        return np.arange(self.queue_offset_base, self.max_queue_offset, dtype=np.int64)


def load_consume_queue(path: str | os.PathLike[str]) -> ConsumeQueueUnits:
    """Read the valid units of a consume queue with their queue offsets.

    Units are read while valid (offset >= 0 and size > 0, so the blank padding unit ``(0, 0x7FFFFFFF, 0)``
    counts), file after file, as RocketMQ's recovery does.

    :param path: a ``consumequeue/<topic>/<queueId>`` directory (files named by their 20-digit logical byte
        offset, i.e. queue offset x 20) or one such file (base 0 when its name is not 20 digits).
    :returns: ``ConsumeQueueUnits``.
    :raises NotAStoreError: when the path is missing or holds no CQ files.
    :raises CorruptStoreError: when a file name is not a multiple of 20.
    """
    segments = list_segments(path, "consume queue")
    arrays: list[npt.NDArray[np.void]] = []
    files: list[str] = []
    reason = "end"
    expected: int | None = None
    for seg in segments:
        if seg.base % CQ_UNIT_SIZE:
            raise CorruptStoreError(f"consume queue file {seg.path}: name is not a multiple of {CQ_UNIT_SIZE}")
        if expected is not None and seg.base != expected:
            log.warning("consume queue gap: %s starts at %d, expected %d; stopping there", seg.path, seg.base, expected)
            reason = "gap"
            break
        with open(seg.path, "rb") as f:
            data = f.read()
        files.append(seg.path)
        count = len(data) // CQ_UNIT_SIZE
        arr = np.frombuffer(data, CQ_DTYPE, count=count)
        bad = np.flatnonzero((arr["offset"] < 0) | (arr["size"] <= 0))
        if bad.size:
            first = int(bad[0])
            arrays.append(arr[:first])
            unit = data[first * CQ_UNIT_SIZE : (first + 1) * CQ_UNIT_SIZE]
            if any(unit):
                reason = "invalid"
                log.warning(
                    "consume queue %s: invalid unit %r at position %d; stopping there",
                    seg.path,
                    tuple(arr[first].tolist()),
                    first * CQ_UNIT_SIZE,
                )
            break
        arrays.append(arr)
        if len(data) != count * CQ_UNIT_SIZE:
            reason = "partial"
            log.warning("consume queue %s: length %d is not a multiple of %d", seg.path, len(data), CQ_UNIT_SIZE)
            break
        expected = seg.base + len(data)
    # filled by hand: np.concatenate would convert the big-endian fields to native order
    units = np.empty(sum(len(a) for a in arrays), CQ_DTYPE)
    at = 0
    for a in arrays:
        units[at : at + len(a)] = a
        at += len(a)
    return ConsumeQueueUnits(units, segments[0].base // CQ_UNIT_SIZE, tuple(files), reason)


def read_consume_queue(path: str | os.PathLike[str]) -> npt.NDArray[np.void]:
    """The valid units of a consume queue directory or file as a numpy structured array.

    :param path: as for ``load_consume_queue``.
    :returns: a new array of ``CQ_DTYPE`` (``offset`` >i8, ``size`` >i4, ``tags_code`` >i8); use
        ``load_consume_queue`` to also get the queue offset of the first unit.
    :raises NotAStoreError, CorruptStoreError: as ``load_consume_queue``.
    """
    return load_consume_queue(path).units


@overload
def is_ext_address(tags_code: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.bool_]: ...
@overload
def is_ext_address(tags_code: int | np.integer[Any]) -> bool: ...
def is_ext_address(tags_code: int | np.integer[Any] | npt.NDArray[np.integer[Any]]) -> bool | npt.NDArray[np.bool_]:
    """Whether a CQ tagsCode is a ConsumeQueueExt address (<= -2**31 - 1) rather than a tag hash.

    :param tags_code: an int, a numpy integer or an integer array.
    :returns: bool, or a bool array for an array.
    """
    if isinstance(tags_code, np.ndarray):
        return tags_code <= EXT_ADDRESS_MAX
    return bool(tags_code <= EXT_ADDRESS_MAX)


@overload
def ext_offset(tags_code: npt.NDArray[np.integer[Any]]) -> npt.NDArray[np.int64]: ...
@overload
def ext_offset(tags_code: int | np.integer[Any]) -> int: ...
def ext_offset(tags_code: int | np.integer[Any] | npt.NDArray[np.integer[Any]]) -> int | npt.NDArray[np.int64]:
    """The absolute ConsumeQueueExt offset that an ext address encodes (tags_code - Long.MIN_VALUE).

    :param tags_code: an ext address (int or numpy integer), or an integer array.
    :returns: an int; for an array, an int64 array with -1 where the value is not an ext address.
    :raises ValueError: for a scalar that is not an ext address.
    """
    if isinstance(tags_code, np.ndarray):
        codes = tags_code.astype(np.int64)
        # adding 2**63 is flipping the sign bit, which cannot overflow
        offsets = (codes.view(np.uint64) ^ np.uint64(_SIGN_BIT)).view(np.int64)
        return np.where(codes <= EXT_ADDRESS_MAX, offsets, np.int64(-1))
    value = int(tags_code)
    if value > EXT_ADDRESS_MAX:
        raise ValueError(f"{value} is a tag hash, not a consume queue ext address")
    return value + _SIGN_BIT


def read_consume_queue_ext(path: str | os.PathLike[str]) -> list[CqExtUnit]:
    """The units of a ConsumeQueueExt directory or file, in address order.

    Each unit is int16 size, int64 tagsCode, int64 msgStoreTime, int16 bitMapSize and the bitmap. In each file
    units are read until a size <= 0: -1 marks a full file (reading goes on with the next one), 0 the end of
    the written data (reading stops).

    :param path: a ``consumequeue_ext/<topic>/<queueId>`` directory (files named by their 20-digit base offset)
        or one such file (base 0 when its name is not 20 digits).
    :returns: a list of ``CqExtUnit(address, tags_code, msg_store_time, bitmap)`` tuples; ``address`` is the
        absolute ext offset (file base + position), the value a CQ unit refers to through ``ext_offset``.
    :raises NotAStoreError: when the path is missing or holds no ext files.
    :raises CorruptFrameError: for a unit whose size or bitmap size is impossible (with offset and path).
    """
    out: list[CqExtUnit] = []
    segments = list_segments(path, "consume queue ext")
    for index, seg in enumerate(segments):
        with open(seg.path, "rb") as f:
            data = f.read()
        pos, n = 0, len(data)
        size = None
        while pos + 2 <= n:
            size = CQ_EXT_SIZE.unpack_from(data, pos)[0]
            if size <= 0:
                break
            where = seg.base + pos
            if size < _EXT_MIN_UNIT or pos + size > n:
                raise CorruptFrameError(
                    f"consume queue ext unit of size {size} at offset {where} ({seg.path})", offset=where, path=seg.path
                )
            _, tags_code, store_time, bitmap_size = _EXT_HEAD.unpack_from(data, pos)
            if bitmap_size < 0 or _EXT_MIN_UNIT + bitmap_size > size:
                raise CorruptFrameError(
                    f"consume queue ext unit at offset {where}: bitmap of {bitmap_size} bytes "
                    f"in a unit of {size} ({seg.path})",
                    offset=where,
                    path=seg.path,
                )
            start = pos + _EXT_MIN_UNIT
            out.append(CqExtUnit(where, tags_code, store_time, bytes(data[start : start + bitmap_size])))
            pos += size
        if size == 0 and pos + 2 <= n:  # the end of the written data
            later = [s.path for s in segments[index + 1 :] if s.size]
            if any(data[pos:]) or later:
                log.warning(
                    "consume queue ext %s: data after the end at offset %d is ignored (later files: %s)",
                    seg.path,
                    seg.base + pos,
                    later,
                )
            break
    return out
