"""Recovery of the CommitLog and ConsumeQueues after a clean (normal) or unclean (abnormal) exit."""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from localmq._columns import RecordColumns, decode_range, topic_codes
from localmq._native import fdatasync, fsync_dir
from localmq._record import (
    decode_message,
    encode_blank,
    encode_gap,
    find_record,
    scan_record,
    walk_records,
)
from localmq.errors import DamagedLogError, UnknownRecordFormatError, io_operation
from localmq.layout import (
    CQ_BLANK_UNIT_SIZE,
    CQ_DTYPE,
    CQ_UNIT_SIZE,
    END_FILE_MIN_BLANK_LENGTH,
    GAP_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    RECOVERY_DIR,
    SEGMENT_NAME_RE,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from localmq.status import RecordStatus, Stop
from localmq.store.files import not_understood, numbered_units
from localmq.store.mapped_file_queue import makedirs_durable
from localmq.store.readers import read_commitlog

if TYPE_CHECKING:  # annotations only: these modules import nothing of this one
    from localmq._mapped_file import MappedFile
    from localmq.store.consume_queue import ConsumeQueue
    from localmq.store.consume_queue_table import ConsumeQueueTable
    from localmq.store.mapped_file_queue import MappedFileQueue
    from localmq.store.undo import OpenUndo

    # get.first_bad_unit: (cq, commit log files, segment size, start, end, log end) -> (index or -1, why)
    _FirstBadUnit = Callable[[ConsumeQueue, List[MappedFile], int, int, int, int], Tuple[int, Optional[str]]]

log = logging.getLogger("localmq.recovery")

# queue -> (the commit log min offset its min_offset was corrected for, its max_offset then): see _verify_queues
MinCorrected = Dict[Tuple[str, int], Tuple[int, int]]


@dataclasses.dataclass
class RecoveryReport:
    """What recovery did. ``dropped_*`` describe the tail cut off the CommitLog (a torn write or corruption)."""

    mode: str = "none"  # "normal", "abnormal" or "none" (no segments)
    start_offset: int = 0  # where the walk began
    end_offset: int = 0  # end of the last valid record (the new max offset)
    records_checked: int = 0
    crc_checked: bool = True
    stop_reason: str = "end"  # why the walk stopped: end, torn, bad magic, bad length, bad crc
    dropped_at: Optional[int] = None  # absolute offset of the first byte dropped
    dropped_bytes: int = 0  # non-zero bytes after dropped_at that were cut
    dropped_records: int = 0  # whole records recognised in the dropped tail (lower bound)
    quarantine_path: Optional[str] = None  # copy of the dropped bytes, so nothing is lost for good
    deleted_segments: List[str] = dataclasses.field(default_factory=list)
    cq_units_truncated: Dict[str, int] = dataclasses.field(default_factory=dict)
    cq_damaged: List[str] = dataclasses.field(default_factory=list)
    cq_rebuilt: Dict[str, str] = dataclasses.field(default_factory=dict)  # queue -> what was wrong, what was done
    rebuilt: List[str] = dataclasses.field(default_factory=list)  # other derived files rebuilt (checkpoint, index)
    salvaged: List[str] = dataclasses.field(default_factory=list)  # log damage accepted with salvage=True
    # damaged regions in the middle of the log: each {"offset", "bytes", "reason", "quarantine_path"}; the records
    # after one are kept (resynchronised), its bytes copied aside and replaced by a gap record
    gaps: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    cq_lost_units: Dict[str, int] = dataclasses.field(default_factory=dict)  # queue -> units pointing into a gap
    reput_from: int = 0
    redispatched: int = 0
    # why re-dispatch stopped before the log's end (a full disk: a ConsumeQueue file could not be created); the open
    # went on, the dispatcher retries, the records are in the log and readable once it caught up
    dispatch_blocked: Optional[str] = None
    # commit log offsets of records whose topic or queue id the unit check found damaged (outvoted by their unit):
    # each such message is lost, and the dispatcher never indexes the record into the queue it names
    damaged_headers: List[int] = dataclasses.field(default_factory=list)
    # segments missing at the start of the log that localmq's retention did not delete (the settings record's
    # commit_log_start is below the first segment): deleted by hand, lost, or deleted by RocketMQ's retention
    missing_head: List[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def next_queue_offsets(commitlog_dir: str, segment_size: int, start: int) -> Dict[Tuple[str, int], int]:
    """{(topic, queue id): next queue offset} of the records from ``start`` to the log's end that a dispatcher
    indexes (PREPARED and ROLLBACK records take no queue offset): what the put path must continue from when they are
    not in their ConsumeQueues yet (re-dispatch stopped on a full disk). Bodies are not checked (recovery did)."""
    out: Dict[Tuple[str, int], int] = {}
    for m in read_commitlog(commitlog_dir, mapped_file_size=segment_size, check_crc=False, copy=False, start=start):
        txn = m.sys_flag & SYSFLAG_TRANSACTION_MASK
        if txn in (SYSFLAG_TRANSACTION_PREPARED, SYSFLAG_TRANSACTION_ROLLBACK):
            continue
        key = (m.topic, m.queue_id)
        out[key] = max(out.get(key, 0), m.queue_offset + 1)
    return out


def _first_unit_lost(
    commit_log: MappedFileQueue, queues: ConsumeQueueTable, start: int, end: int
) -> Optional[Tuple[int, str, int, int]]:
    """(physical offset, topic, queue id, queue offset) of the first record in [start, end) that its ConsumeQueue
    does not reach (its queue offset at or past the queue's end, or no queue), or None. A queue whose last units
    were zeroed reads as a queue that ends there: without this check, a normal open dispatches from where the
    longest queue ends and those messages are gone from the API although the log holds them. PREPARED and
    ROLLBACK records have no unit."""
    cols = RecordColumns(65536)
    size = commit_log.file_size
    for mf in commit_log.files:
        base = mf.file_from_offset
        if base + size <= start or base >= end:
            continue
        pos, stop = max(0, start - base), min(size, end - base)
        while pos < stop:
            n, pos, reason = decode_range(mf, cols, pos, stop, base, False)
            if n:
                codes, names = topic_codes(cols)
                txn = cols["sys_flag"] & SYSFLAG_TRANSACTION_MASK
                indexed = (txn != SYSFLAG_TRANSACTION_PREPARED) & (txn != SYSFLAG_TRANSACTION_ROLLBACK)
                qid, qoff = cols["queue_id"], cols["queue_offset"]
                # each record's queue end: one look-up per (topic, queue id) of the range, spread back by np.unique
                keys, where = np.unique(
                    codes.astype(np.int64) << 32 | (qid.astype(np.int64) & 0xFFFFFFFF), return_inverse=True
                )
                cqs = (
                    queues.queues.get((names[k >> 32], (k & 0xFFFFFFFF) - ((k & 0x80000000) << 1)))
                    for k in keys.tolist()
                )
                ends = np.array([-1 if cq is None else cq.max_offset for cq in cqs], np.int64)[where]
                lost = np.flatnonzero(indexed & (qoff >= ends))
                if lost.size:
                    i = int(lost[0])
                    return int(cols["physical_offset"][i]), names[codes[i]], int(qid[i]), int(qoff[i])
            if reason != Stop.FULL:
                break
    return None


def _count_tail_records(mf: MappedFile, pos: int) -> int:
    """Whole records (structure intact, CRC ignored) that follow a damaged one at ``pos`` in ``mf``."""
    status, size = scan_record(mf, pos, False)
    if status not in ("ok", "bad crc") or size <= 0:
        return 0
    count = 1
    p = pos + size
    _, _, n, _, _ = walk_records(mf, p, mf.data_end(p), False)
    return count + n


def _quarantine(root: str, mfq: MappedFileQueue, start: int) -> tuple[Optional[str], int]:
    """Copy the non-zero bytes from absolute offset ``start`` to the end of written data into
    ``<root>/recovery/`` before they are cut. Returns (path or None, bytes copied)."""
    chunks: List[Tuple[int, bytes]] = []
    for mf in mfq.files:
        base = mf.file_from_offset
        if base + mf.file_size <= start:
            continue
        lo = max(0, start - base)
        data = mf.read(lo, mf.file_size - lo)
        stripped = data.rstrip(b"\0")
        if not stripped:
            break
        chunks.append((base + lo, stripped))
    if not chunks:
        return None, 0
    qdir = os.path.join(root, RECOVERY_DIR)
    makedirs_durable(qdir)
    path = os.path.join(qdir, f"commitlog-tail-{start:020d}-{int(time.time() * 1000)}.bin")
    total = 0
    with io_operation("write", path), open(path, "wb") as f:
        for off, data in chunks:
            # each chunk: absolute offset and length headers, then the bytes, so the file can be inspected
            f.write(off.to_bytes(8, "big") + len(data).to_bytes(8, "big"))
            f.write(data)
            total += len(data)
        f.flush()
        fdatasync(f.fileno(), path=path)
    fsync_dir(qdir)
    return path, total


def _quarantine_gap(root: str, mfq: MappedFileQueue, start: int, end: int) -> str:
    """Copy the damaged bytes [start, end) of the log into ``<root>/recovery/commitlog-gap-<start>-<ms>.bin`` (same
    chunk format as a cut tail; all-zero pieces are left out) before a gap record replaces them; returns its path."""
    chunks: List[Tuple[int, bytes]] = []
    for mf in mfq.files:
        base = mf.file_from_offset
        lo, hi = max(start, base), min(end, base + mf.file_size)
        if lo >= hi:
            continue
        data = mf.read(lo - base, hi - lo)
        if data.strip(b"\0"):
            chunks.append((lo, data))
    # written even when every damaged byte is zero: readers of the files (Spark) learn of the gap from its name
    qdir = os.path.join(root, RECOVERY_DIR)
    makedirs_durable(qdir)
    path = os.path.join(qdir, f"commitlog-gap-{start:020d}-{int(time.time() * 1000)}.bin")
    with io_operation("write", path), open(path, "wb") as f:
        for off, data in chunks:
            f.write(off.to_bytes(8, "big") + len(data).to_bytes(8, "big"))
            f.write(data)
        f.flush()
        fdatasync(f.fileno(), path=path)
    fsync_dir(qdir)
    return path


def refuse_unknown(mf: MappedFile, pos: int, status: RecordStatus, data_end: int) -> None:
    """Raise UnknownRecordFormatError when the walk stopped (``status``) at ``mf`` + ``pos`` on a record localmq does
    not understand (``files.not_understood``: an unknown format, or a V2 record naming a topic longer than localmq's
    names): it is not damage, and nothing may replace it. Called before any byte of the damage handling is
    written."""
    found = not_understood(mf, pos, status, data_end)
    if found is None:
        return
    magic, size, what = found
    at = mf.file_from_offset + pos
    raise UnknownRecordFormatError(
        f"{mf.path}: {what} at commit log offset {at} (magic 0x{magic:08X}, {size} bytes; localmq reads RocketMQ's "
        f"V1 and V2 records): it is not damage, so the store is left as it is; open it with read_only=True to read "
        f"the records localmq knows",
        offset=at,
        path=mf.path,
        magic=magic,
        size=size,
    )


def _resync(
    files: List[MappedFile], i: int, pos: int, limit: int, agrees: Callable[[MappedFile, int], bool]
) -> Optional[Tuple[int, int]]:
    """The first record after the damage at ``files[i]`` + ``pos`` that was written where it lies (magic, length and
    body CRC valid, PHYSICALOFFSET equal to its place) and whose queue offset agrees with its ConsumeQueue, looking
    no further than ``limit`` (how far the log is known to reach); (segment index, position) or None."""
    size = files[i].file_size
    for j in range(i, len(files)):
        mf = files[j]
        base = mf.file_from_offset
        if base >= limit:
            break
        start = pos + 1 if j == i else 0
        # a record lies whole in the file's data: holes are not searched (nor read through the mapping)
        for lo, hi in mf.data_ranges(start, min(size, limit - base)):
            while lo < hi:
                q = find_record(mf, lo, hi, base)
                if q < 0:
                    break
                if agrees(mf, q):
                    return j, q
                lo = q + 1
    return None


def _mark_gap(files: List[MappedFile], i: int, pos: int, j: int, q: int) -> Optional[Tuple[int, ...]]:
    """Replace the damaged bytes from ``files[i]`` + ``pos`` to ``files[j]`` + ``q`` by records every walker steps
    over: gap records (RocketMQ reads one as a blank and goes on in the next segment), a blank record where fewer
    than a gap record's bytes are left before a segment's end. Returns (offset, size) of the last gap record written,
    or () when none was; None when a piece is too short to hold a record (nothing written).
    """
    size = files[i].file_size
    pieces: List[Tuple[MappedFile, int, bytes]] = []
    record: Tuple[int, ...] = ()
    for k in range(i, j + 1):
        lo = pos if k == i else 0
        hi = q if k == j else size
        if hi <= lo:
            continue
        if hi == size and hi - lo < GAP_RECORD_SIZE:
            # too short for a gap record, so too short to have held a message: a blank record ends the segment
            if hi - lo < END_FILE_MIN_BLANK_LENGTH:
                return None
            pieces.append((files[k], lo, encode_blank(hi - lo)))
        else:
            # a gap record, also where the damage runs to the segment's end (RocketMQ reads it as the segment's
            # blank record): the messages lost in it become lost units pointing at it, and their queues keep the
            # offsets of every later message (a blank record there lost that: tests/test_power_loss.py)
            if hi - lo < GAP_RECORD_SIZE:
                return None
            pieces.append((files[k], lo, encode_gap(hi - lo)))
            record = (files[k].file_from_offset + lo, hi - lo)
    for mf, lo, header in pieces:
        mf.write_at(lo, header)
        mf.fsync()
    return record


def _walk(
    root: str,
    mfq: MappedFileQueue,
    first_index: int,
    check_crc: bool,
    report: RecoveryReport,
    progress: Optional[Callable[[int, int], None]],
    known_end: int,
    agrees: Callable[[MappedFile, int], bool],
    undo: Optional["OpenUndo"] = None,
) -> int:
    """Walk records from segment ``first_index`` on; returns the end of the last valid record.

    Damage with valid records after it (below ``known_end``: how far the ConsumeQueues say the log reached) is
    resynchronised: its bytes are copied to ``recovery/``, replaced by a gap
    record, and the walk goes on. Damage with nothing valid after it is the end of the log (a torn tail)."""
    files = mfq.files
    size = mfq.file_size
    process = files[first_index].file_from_offset
    report.start_offset = process
    total_files = len(files)
    i, pos = first_index, 0
    while i < total_files:
        mf = files[i]
        base = mf.file_from_offset
        # up to the end of the data that pos lies in: a hole reads as zeros, i.e. the end of the records ("end"),
        # and is never read through the mapping (on a full tmpfs that read alone is a SIGBUS)
        data_end = mf.data_end(pos)
        pos, status, n, _, _ = walk_records(mf, pos, data_end, check_crc, True)
        report.records_checked += n
        if status == RecordStatus.END and data_end <= pos < size and mf.data_end(pos) > pos:
            # a gap record (an earlier recovery's) stepped over a hole into the next run of data: the walk goes on
            # there. Taking this for zeros where a record starts cut the log, or wrote a gap over the valid record
            # the gap ends at, at every later open (tests/test_power_loss.py)
            continue
        if status == RecordStatus.BLANK or pos >= size:
            # the segment ends with its blank record: it is complete
            if progress is not None:
                progress(i - first_index + 1, total_files - first_index)
            if total_files - first_index > 3:
                log.info(
                    "recovery: segment %d of %d checked (%s, %d records so far)",
                    i - first_index + 1,
                    total_files - first_index,
                    os.path.basename(mf.path),
                    report.records_checked,
                )
            process = base + size
            i, pos = i + 1, 0
            continue
        refuse_unknown(mf, pos, status, data_end)
        at = base + pos
        # Only below ``known_end`` is an invalid record damage: the dispatcher read valid records up to there. Past
        # it, the records were never dispatched and an invalid one is what a crash leaves (a torn write, or with
        # the transient pool a segment committed after an earlier one was not): the log ends there, as in RocketMQ.
        limit = known_end
        found = _resync(files, i, pos, limit, agrees) if limit > at else None
        if found is not None:
            j, q = found
            resume = files[j].file_from_offset + q
            path = _quarantine_gap(root, mfq, at, resume)
            if undo is not None:
                undo.repaired_log(mfq.directory, mfq.file_size, at, resume, path)
            record = _mark_gap(files, i, pos, j, q)
            if record is not None:
                report.gaps.append(
                    {
                        "offset": at,
                        "bytes": resume - at,
                        "reason": str(status),
                        "quarantine_path": path,
                        "record": record,
                    }
                )
                log.error(
                    "commit log: %s at offset %d; %d bytes up to the next valid record at %d replaced by a "
                    "gap record (copy kept in %s); the records after it are kept",
                    "zero bytes" if status == RecordStatus.END else f"{status} record",
                    at,
                    resume - at,
                    resume,
                    path,
                )
                i, pos = j, q
                continue
        process = at
        if progress is not None:
            progress(total_files - first_index, total_files - first_index)
        if status != RecordStatus.END:
            report.stop_reason = status
            report.dropped_at = process
            report.dropped_records = _count_tail_records(mf, pos)
        elif limit > at or any(files[k].read(0, 8) != b"\0" * 8 for k in range(i + 1, total_files)):
            # zeros where a record should start, but the queues or later segments say records followed, and none of
            # them could be resynchronised on: the tail is lost
            report.stop_reason = "gap"
            report.dropped_at = process
        break
    return process


def recover_commit_log(
    root: str,
    mfq: MappedFileQueue,
    *,
    abnormal: bool,
    check_crc: bool,
    checkpoint_min_ts: int,
    progress: Optional[Callable[[int, int], None]] = None,
    known_end: int = 0,
    agrees: Optional[Callable[[MappedFile, int], bool]] = None,
    keep_segment_names: bool = False,
    undo: Optional["OpenUndo"] = None,
) -> RecoveryReport:
    """Find the end of valid data in the commit log, quarantine and cut what follows it; damage in the middle
    (valid records after it, below ``known_end``: what the dispatcher had read) becomes a gap record instead
    (``report.gaps``), and the records after it are kept. Segments after the end are deleted, or with
    ``keep_segment_names`` left for the caller to delete (``report.deleted_segments``, ``mfq.delete_names``).

    Normal: walk from the third-last segment. Abnormal: from the newest segment whose first record is older
    than the checkpoint (RocketMQ's isMappedFileMatchedRecover), else the first one.
    """
    t0 = time.monotonic()
    report = RecoveryReport(mode="abnormal" if abnormal else "normal", crc_checked=check_crc)
    files = mfq.files
    if not files:
        report.mode = "none"
        report.seconds = time.monotonic() - t0
        return report
    if abnormal:
        first = 0
        for i in range(len(files) - 1, -1, -1):
            head = files[i].read(0, 8)
            magic = int.from_bytes(head[4:8], "big", signed=True)
            if magic not in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
                continue
            try:
                m = decode_message(files[i], 0, check_crc=False)
            except ValueError:
                continue
            if m is not None and m.store_timestamp != 0 and m.store_timestamp <= checkpoint_min_ts:
                first = i
                break
    else:
        first = max(0, len(files) - 3)
    end = _walk(
        root,
        mfq,
        first,
        check_crc,
        report,
        progress,
        known_end,
        agrees if agrees is not None else (lambda mf, q: True),
        undo,
    )
    report.end_offset = end
    if report.dropped_at is not None:
        report.quarantine_path, report.dropped_bytes = _quarantine(root, mfq, report.dropped_at)
        log.error(
            "commit log: %s record at offset %d; cutting the log there (%d bytes, %d whole records after "
            "it; copy kept in %s)",
            report.stop_reason,
            report.dropped_at,
            report.dropped_bytes,
            report.dropped_records,
            report.quarantine_path,
        )
    if undo is not None and files and end < files[-1].file_from_offset + mfq.file_size:
        # what is cut (zeroed, segments deleted) is in the quarantine copy: an open that fails writes it back
        undo.repaired_log(
            mfq.directory, mfq.file_size, end, files[-1].file_from_offset + mfq.file_size, report.quarantine_path
        )
    report.deleted_segments = mfq.truncate_dirty_files(end, keep_names=keep_segment_names)
    mfq.flushed_where = end
    mfq.committed_where = end
    if report.deleted_segments:
        # with nothing dropped they held no record: segments created ahead of need before an unclean exit
        (log.info if report.dropped_at is None else log.warning)(
            "commit log: deleted segments past offset %d: %s", end, report.deleted_segments
        )
    report.seconds = time.monotonic() - t0
    return report


def _repair_segment(
    root: str,
    mfq: MappedFileQueue,
    i: int,
    check_crc: bool,
    report: RecoveryReport,
    known_end: int,
    agrees: Callable[[MappedFile, int], bool],
    undo: Optional["OpenUndo"] = None,
) -> None:
    """Walk segment ``i`` (one the recovery walk did not cover: older than its start) and replace each damaged region
    by a gap record, as the walk does (quarantined copy, ``report.gaps``): up to the next record written where it
    lies in the segment, else to the segment's end (the next segment starts with a record)."""
    files = mfq.files
    mf = files[i]
    base, size = mf.file_from_offset, mfq.file_size
    pos = 0
    while pos < size:
        pos, status, n, _, _ = walk_records(mf, pos, mf.data_end(pos), check_crc, True)
        report.records_checked += n
        if status == RecordStatus.BLANK or pos >= size:
            return
        refuse_unknown(mf, pos, status, mf.data_end(pos))
        at = base + pos
        found = _resync(files, i, pos, min(known_end, base + size), agrees)
        j, q = found if found is not None else (i + 1, 0)
        resume = files[j].file_from_offset + q if j < len(files) else base + size
        path = _quarantine_gap(root, mfq, at, resume)
        if undo is not None:
            undo.repaired_log(mfq.directory, mfq.file_size, at, resume, path)
        record = _mark_gap(files, i, pos, j, q)
        if record is None:
            log.error("commit log: %s at offset %d in an old segment: too short to mark; left as it is", status, at)
            return
        report.gaps.append(
            {"offset": at, "bytes": resume - at, "reason": str(status), "quarantine_path": path, "record": record}
        )
        log.error(
            "commit log: %s at offset %d (segment %s, older than the recovery walk, found through the "
            "ConsumeQueues); replaced by a gap record, copy kept in %s; the records after it are kept",
            "zero bytes" if status == RecordStatus.END else f"{status} record",
            at,
            os.path.basename(mf.path),
            path,
        )
        if j != i:
            return
        pos = q


def _damaged_old_segments(
    commit_log: MappedFileQueue, queues: ConsumeQueueTable, walked_from: int, end: int
) -> List[int]:
    """Indexes of the commit log segments before ``walked_from`` (which the recovery walk did not cover) that hold
    the record of a ConsumeQueue's first bad unit, where that record does not parse: damage in an old segment, found
    through the queues (a zeroed page, a flipped length byte, a topic name no writer accepts), to be repaired before
    the queues are cut."""
    from localmq.store.get import first_bad_unit  # compiled, same layer

    files, seg_size = commit_log.files, commit_log.file_size
    if not files or walked_from <= files[0].file_from_offset:
        return []
    found: set[int] = set()
    for cq in queues.queues.values():
        if not cq.mapped_file_queue.files:
            continue
        first = cq.mapped_file_queue.files[0].file_from_offset // CQ_UNIT_SIZE
        idx, _ = first_bad_unit(cq, files, seg_size, first, cq.max_offset, end)
        unit = cq.unit(idx) if idx >= 0 else None
        if unit is None or unit[1] <= 0 or not files[0].file_from_offset <= unit[0] < walked_from:
            continue
        k = (unit[0] - files[0].file_from_offset) // seg_size
        mf = files[k]
        pos = unit[0] - mf.file_from_offset
        status, size = scan_record(mf, pos, False)
        if status == RecordStatus.OK:  # the structure holds: is the topic a name a writer accepts?
            status = walk_records(mf, pos, min(pos + size, mf.data_end(pos)), False, True)[1]
        if status not in ("ok", "end"):
            found.add(k)
    return sorted(found)


def _header_outvoted(commit_log: MappedFileQueue, queues: ConsumeQueueTable, cq: ConsumeQueue, idx: int) -> bool:
    """Whether unit ``idx`` of ``cq`` outvotes its record: the record lies where the unit says, has the unit's size,
    queue offset and a valid body, but names another topic or queue id, and that queue (if it exists) has no unit
    for it there. One header field the body CRC does not cover (QUEUEID, a topic letter) is damaged: the message is
    lost (a get at the unit raises CorruptMessageError), the queue keeps its other units, and the queue the record
    names never gets it (the dispatcher skips it as a duplicate of what that queue already holds)."""
    unit = cq.unit(idx)
    files, seg_size = commit_log.files, commit_log.file_size
    if unit is None or unit[1] <= 0 or unit[1] == CQ_BLANK_UNIT_SIZE or not files:
        return False
    phys, size = unit[0], unit[1]
    k = (phys - files[0].file_from_offset) // seg_size
    if not 0 <= k < len(files):
        return False
    mf = files[k]
    try:
        m = decode_message(mf, phys - mf.file_from_offset, check_crc=True)
    except ValueError:
        return False
    if m is None or m.physical_offset != phys or m.store_size != size or m.queue_offset != idx:
        return False
    if (m.topic, m.queue_id) == (cq.topic, cq.queue_id):
        return False
    other = queues.queues.get((m.topic, m.queue_id))
    if other is None or m.queue_offset >= other.max_offset:
        return True
    theirs = other.unit(m.queue_offset)
    return theirs is not None and theirs[0] != phys


def _first_bad_unit(
    first_bad_unit: _FirstBadUnit,
    cq: ConsumeQueue,
    files: List[MappedFile],
    seg_size: int,
    start: int,
    end: int,
    gaps: List[Dict[str, Any]],
) -> Tuple[int, Optional[str]]:
    """``get.first_bad_unit`` from ``start``, and also the first unit pointing inside a region that this recovery
    replaced by a gap record (other than a lost unit pointing at the gap record itself), whichever comes first.
    Such a unit may still find a whole record there (a record whose bytes in a lost page were zeros anyway, or one
    the resynchronisation refused), but every walker (the dispatcher, the index, the readers) steps over the gap:
    a queue that kept it would deliver a message that nothing else knows of (tests/test_power_loss.py)."""
    idx, why = first_bad_unit(cq, files, seg_size, start, cq.max_offset, end)
    if not gaps:
        return idx, why
    stop = cq.max_offset if idx < 0 else idx
    if stop <= start:
        return idx, why
    units = cq.units(start, stop)
    offsets, sizes = units["offset"].astype(np.int64), units["size"].astype(np.int64)
    first_hit, region = len(units), None
    for g in gaps:
        hit = (offsets >= g["offset"]) & (offsets < g["offset"] + g["bytes"]) & (sizes > 0)
        if g["record"]:
            hit &= ~((offsets == g["record"][0]) & (sizes == g["record"][1]))
        found = np.flatnonzero(hit[:first_hit])
        if len(found):
            first_hit, region = int(found[0]), g
    if region is None:
        return idx, why
    return start + first_hit, (
        f"offset {int(offsets[first_hit])} lies in the damaged region at {region['offset']} "
        f"({region['bytes']} bytes) that recovery replaced by a gap record"
    )


def _verify_queues(
    commit_log: MappedFileQueue,
    queues: ConsumeQueueTable,
    end: int,
    cl_min: int,
    report: RecoveryReport,
    min_corrected: Optional[MinCorrected] = None,
) -> List[int]:
    """Check every ConsumeQueue against the recovered log (derived data: the log is the truth) and cut each one
    at its first unit that does not match its record; returns the commit log offsets the dispatcher must start
    from (at the latest) so that the cut queues are rebuilt. Fills ``report.cq_rebuilt``. A queue found whole
    gets its ``min_offset`` corrected for ``cl_min`` at once, while its files are mapped (with more queues than
    the mapping budget a later pass would map each again), and is entered in ``min_corrected``."""
    from localmq.store.get import first_bad_unit  # compiled, same layer

    starts: List[int] = []
    files, seg_size = commit_log.files, commit_log.file_size
    missing_head = _missing_first_files(commit_log, queues, end, cl_min)
    for key, cq in queues.queues.items():
        name = f"{key[0]}-{key[1]}"
        mfq = cq.mapped_file_queue
        why = queues.damaged.get(key)
        if why is not None:
            report.cq_rebuilt[name] = f"files not loadable ({why}): rebuilt from the commit log"
            starts.append(cl_min)
            continue
        if not mfq.files:
            if files and end > cl_min:
                # a queue directory without units: its file was lost; everything it had is in the log
                report.cq_rebuilt[name] = "no unit file: rebuilt from the commit log"
                starts.append(cl_min)
            continue
        first = mfq.files[0].file_from_offset // CQ_UNIT_SIZE
        if key in missing_head:
            cq.destroy()
            report.cq_rebuilt[name] = (
                f"files before unit {first} missing while the log still holds records of "
                f"them before offset {missing_head[key]}: rebuilt from the commit log"
            )
            starts.append(cl_min)
            continue
        idx, why = _first_bad_unit(first_bad_unit, cq, files, seg_size, first, end, report.gaps)
        lost = 0
        while idx >= 0:
            # a unit whose record lay in a region that this recovery replaced by a gap record: its message is lost;
            # it becomes a lost unit (a get there raises CorruptMessageError) and the queue keeps its offsets
            unit = cq.unit(idx)
            # a real unit only: an empty one (offset 0, size 0: a unit never written, or lost with its page) says
            # nothing of a record, even when a gap starts at the log's offset 0 (it was made a lost unit there, and
            # the queue kept every empty unit after it: tests/test_power_loss.py)
            gap = (
                None
                if unit is None or unit[1] <= 0 or not report.gaps
                else next(
                    (g for g in report.gaps if g["record"] and g["offset"] <= unit[0] < g["offset"] + g["bytes"]), None
                )
            )
            if gap is not None and queues.before_rewrite is not None:
                _announce_unit(queues.before_rewrite, cq, idx)
            if gap is not None and cq.mark_lost(idx, *gap["record"]):
                lost += 1
            elif _header_outvoted(commit_log, queues, cq, idx):
                assert unit is not None  # _header_outvoted is False without a unit
                lost += 1
                report.damaged_headers.append(unit[0])
                log.error(
                    "consume queue %s: unit %d points at a record whose topic or queue id does not match while "
                    "its place, size, queue offset and body do: a damaged header, the message is lost",
                    name,
                    idx,
                )
            else:
                break
            idx, why = _first_bad_unit(first_bad_unit, cq, files, seg_size, idx + 1, end, report.gaps)
        if lost:
            report.cq_lost_units[name] = lost
            log.error(
                "consume queue %s: %d messages lost to damage in the commit log; a get at their offsets "
                "raises CorruptMessageError",
                name,
                lost,
            )
        if idx >= 0:
            n = cq.truncate_to(idx)
            report.cq_rebuilt[name] = f"unit {idx}: {why}; {n} units cut and rebuilt from the commit log"
            log.error(
                "consume queue %s: unit %d does not match the commit log (%s); rebuilding it from there", name, idx, why
            )
            starts.append(cq.max_physic_offset if cq.max_physic_offset >= cl_min else cl_min)
            continue
        last = mfq.files[-1]
        if cq.max_offset * CQ_UNIT_SIZE >= last.file_from_offset + mfq.file_size and cq.max_physic_offset >= 0:
            # the last file is full: a file after it may have been lost; dispatch again from its end (records
            # already in a queue are skipped as duplicates)
            starts.append(max(cl_min, cq.max_physic_offset))
        if min_corrected is not None:
            cq.correct_min_offset(cl_min)
            min_corrected[key] = (cl_min, cq.max_offset)
    return starts


def _missing_first_files(
    commit_log: MappedFileQueue, queues: ConsumeQueueTable, end: int, cl_min: int
) -> Dict[Tuple[str, int], int]:
    """The queues whose first files are gone although the log still holds records of them: {key: the log offset of
    the queue's first unit}.

    A queue's first file starts at unit ``first`` > 0 when retention deleted the files before it (their units all
    pointed below the log's min offset), when the queue was made at that offset (its first units are pre-blank
    units), or when files were lost. Retention keeps a queue's first file starting at or below the log's min
    offset (``ConsumeQueue.delete_expired_files``), so only a queue whose unit ``first`` is a message past the log's
    min offset is in doubt (a store written by RocketMQ or an earlier localmq after its retention, or a lost file).
    For those, the log from its min offset to their first units is walked once, record headers only: a record of
    such a queue with a queue offset below ``first`` proves files lost. A walk that cannot go on (a damaged or
    unknown record) counts every queue still in doubt as lost (it is rebuilt: the log is the truth).
    """
    doubt: Dict[Tuple[str, int], Tuple[int, int]] = {}
    for key, cq in queues.queues.items():
        mfq = cq.mapped_file_queue
        if key in queues.damaged or not mfq.files or not commit_log.files:
            continue
        first = mfq.files[0].file_from_offset // CQ_UNIT_SIZE
        if first == 0 or first >= cq.max_offset:
            continue
        unit = cq.unit(first)
        if unit is not None and 0 < unit[1] != CQ_BLANK_UNIT_SIZE and cl_min < unit[0] < end:
            doubt[key] = (first, unit[0])
    if not doubt:
        return {}
    from localmq._scan import RowFilter, scan_range  # compiled, one layer down

    stop = min(end, max(h for _, h in doubt.values()))
    flt = RowFilter(
        topics=sorted({t.encode() for t, _ in doubt}),
        bounds={(t.encode(), q): (0, first) for (t, q), (first, _) in doubt.items()},
    )
    lost: Dict[Tuple[str, int], int] = {}
    seg_size = commit_log.file_size
    pos, walked = cl_min, True
    while pos < stop and walked:
        mf = commit_log.find(pos)
        if mf is None:
            walked = False
            break
        base = mf.file_from_offset
        n, nxt, reason, out = scan_range(
            mf, pos - base, min(seg_size, stop - base), base, False, 4096, ("topic", "queue_id", "sys_flag"), flt
        )
        offs, data = out["topic"]
        for i in range(n):
            if int(out["sys_flag"][i]) & SYSFLAG_TRANSACTION_MASK in (
                SYSFLAG_TRANSACTION_PREPARED,
                SYSFLAG_TRANSACTION_ROLLBACK,
            ):
                continue  # not in any queue (its queue offset field is 0)
            key = (bytes(data[offs[i] : offs[i + 1]]).decode("utf-8", "replace"), int(out["queue_id"][i]))
            if key in doubt:
                lost[key] = doubt[key][1]
        if reason in ("end", "blank"):
            pos = base + seg_size
        elif reason == "full":
            pos = base + nxt
        else:
            walked = False
    if not walked:
        for key, (_, head) in doubt.items():
            lost.setdefault(key, head)
        log.warning(
            "consume queues %s: files before their first unit are missing and the commit log could not be "
            "walked to tell whether retention deleted them (%s at offset %d): rebuilt from the log",
            sorted(f"{t}-{q}" for t, q in doubt),
            reason if mf is not None else "no segment",
            pos,
        )
    return lost


def _announce_unit(before_rewrite: Callable[[str, int, int], None], cq: ConsumeQueue, idx: int) -> None:
    """Tell ``before_rewrite`` (an open that may fail: OpenUndo.save_derived) that unit ``idx`` is rewritten."""
    mf = cq.mapped_file_queue.find(idx * CQ_UNIT_SIZE)
    if mf is not None:
        before_rewrite(os.fspath(mf.path), idx * CQ_UNIT_SIZE - mf.file_from_offset, CQ_UNIT_SIZE)


def _rewrite_units(cq: ConsumeQueue, phy_offset: int) -> int:
    """After an unclean exit: write the units of the records at or past ``phy_offset`` (the recovery walk's start)
    again, byte for byte, and lower their files' flushed positions, so that the next flush writes them. A unit that a
    process wrote but could not flush (a failed msync is never retried, and Linux forgets the pages it could not
    write) reads back from the page cache without being on disk: the dispatcher skips it as a duplicate, and only a
    rewrite makes it durable. Their content is kept: it is what the unit check and the dispatcher trust. Returns the
    number of units."""
    total = 0
    end = cq.max_offset * CQ_UNIT_SIZE
    for mf in reversed(list(cq.mapped_file_queue.files)):
        if mf.file_from_offset >= end:
            continue
        n = min(mf.file_size, end - mf.file_from_offset) // CQ_UNIT_SIZE
        # numpy types its buffer argument as the buffer protocol (MappedFile.__buffer__) only from Python 3.12 on
        arr = np.frombuffer(mf, dtype=CQ_DTYPE)  # type: ignore[call-overload, unused-ignore]
        try:
            past = np.flatnonzero(arr["offset"][:n] >= phy_offset)
            first = int(past[0]) if len(past) else n
        finally:
            del arr
        if first < n:
            pos, size = first * CQ_UNIT_SIZE, (n - first) * CQ_UNIT_SIZE
            mf.write_at(pos, mf.read(pos, size))
            mf.flushed_position = min(mf.flushed_position, pos)
            mfq = cq.mapped_file_queue
            mfq.flushed_where = min(mfq.flushed_where, mf.file_from_offset + pos)
            total += n - first
        if first > 0:
            break
    return total


def sync_directories(root: str) -> int:
    """fsync the store's root and every directory below it; returns how many. After an unclean exit the names this
    process sees may come from the page cache only: made by a process that died before syncing them, or whose sync
    failed (a failed fsync is not retried by anyone else). Syncing them now makes what recovery trusts durable."""
    n = 0
    for dirpath, _, _ in os.walk(root):
        fsync_dir(dirpath)
        n += 1
    return n


def _check_segments_at_end(commit_log: "MappedFileQueue", queues: "ConsumeQueueTable", salvage: bool) -> None:
    """Units pointing past the last segment mean segments lost at the end: DamagedLogError naming the first one,
    unless ``salvage`` (then logged; the queues are cut to the log afterwards)."""
    log_end = commit_log.files[-1].file_from_offset + commit_log.file_size if commit_log.files else 0
    beyond = {
        f"{k[0]}-{k[1]}": cq.max_physic_offset for k, cq in queues.queues.items() if cq.max_physic_offset > log_end
    }
    if beyond and commit_log.files:
        first_missing = log_end // commit_log.file_size * commit_log.file_size
        msg = (
            f"consume queues {sorted(beyond)} point past the last commit log segment (up to offset "
            f"{max(beyond.values())}, the log ends at {log_end}): segment {first_missing:020d} and later are "
            f"missing"
        )
        if not salvage:
            raise DamagedLogError(msg + "; open with salvage=True to keep what is there", [f"{first_missing:020d}"])
        log.error("salvage: %s; the queues are cut to the log", msg)


def recover_store(
    root: str,
    commit_log: "MappedFileQueue",
    queues: "ConsumeQueueTable",
    *,
    abnormal: bool,
    check_crc: bool,
    checkpoint_min_ts: int,
    progress: Optional[Callable[[int, int], None]] = None,
    verify_queues: bool = True,
    salvage: bool = False,
    undo: Optional["OpenUndo"] = None,
    min_corrected: Optional[MinCorrected] = None,
) -> RecoveryReport:
    """Recover the commit log and bring every ConsumeQueue in line with it (RocketMQ's DefaultMessageStore.recover).

    Each queue is checked (``ConsumeQueue.recover``), the commit log is recovered (``recover_commit_log``), units
    past its end are cut, every unit is verified against its record (``_verify_queues``: a queue that is missing,
    whose files cannot be loaded, or whose unit does not carry its record's topic, queue id, queue offset and size
    is cut there and rebuilt from the log; ``cq_rebuilt`` says which and why), and ``reput_from`` in the report
    says where the dispatcher must start so that every record after it reaches its queue: where the queues end,
    at the latest the recovery start after an unclean exit, and no later than the end of a queue that was cut
    short by damage. With no commit log at all every queue is deleted (they could only point nowhere), as
    RocketMQ does (the caller refuses that unless salvaging). Units pointing past the last segment (segments lost
    at the end) raise DamagedLogError unless ``salvage``.
    """
    damaged = [key for key, cq in queues.queues.items() if cq.recover()]
    _check_segments_at_end(commit_log, queues, salvage)
    known_end = max((cq.max_physic_offset for k, cq in queues.queues.items() if k not in damaged), default=0)

    def agrees(mf: MappedFile, q: int) -> bool:
        # a resynchronisation candidate's queue offset must agree with its queue: a unit it has for that offset
        # points at this record (a unit that is blank or lost says nothing)
        try:
            m = decode_message(mf, q, check_crc=False)
        except ValueError:
            return False
        if m is None:
            return False
        cq = queues.queues.get((m.topic, m.queue_id))
        if cq is None or (m.topic, m.queue_id) in damaged or m.queue_offset >= cq.max_offset:
            return True
        unit = cq.unit(m.queue_offset)
        return unit is None or unit[1] <= 0 or unit[0] == mf.file_from_offset + q or unit[1] == CQ_BLANK_UNIT_SIZE

    report = recover_commit_log(
        root,
        commit_log,
        abnormal=abnormal,
        check_crc=check_crc,
        checkpoint_min_ts=checkpoint_min_ts,
        progress=progress,
        known_end=known_end,
        agrees=agrees,
        keep_segment_names=True,
        undo=undo,
    )
    end = report.end_offset
    cl_min = commit_log.min_offset()
    if not commit_log.files:
        queues.destroy_all()
    for key, cq in queues.queues.items():
        if cq.max_physic_offset >= end or cq.max_offset > 0 and cq.max_physic_offset < 0:
            n = cq.truncate_dirty(end)
            if n:
                report.cq_units_truncated[f"{key[0]}-{key[1]}"] = n
    # only now, with no unit pointing into them any more (the cuts above are durable), are the segments past the
    # end deleted: a power cut between the two must not leave queues pointing past the last segment, which the
    # next open refuses as lost segments (tests/test_power_loss.py)
    commit_log.delete_names(report.deleted_segments)
    if verify_queues:
        # damage in a segment the walk did not cover, met by a queue's unit: repaired as the walk repairs (a gap
        # record), so that the unit check marks the units in it lost instead of cutting every queue there and the
        # dispatcher failing on it (every open failed, and the failed open had cut the queues)
        for k in _damaged_old_segments(commit_log, queues, report.start_offset, end):
            _repair_segment(root, commit_log, k, check_crc, report, known_end, agrees, undo)
    starts = _verify_queues(commit_log, queues, end, cl_min, report, min_corrected) if verify_queues else []
    if abnormal:
        for key, cq in queues.queues.items():
            if cq.max_physic_offset > report.start_offset:
                n = _rewrite_units(cq, report.start_offset)
                if n:
                    log.info(
                        "consume queue %s-%s: the %d units of the records from offset %d on are written again",
                        key[0],
                        key[1],
                        n,
                        report.start_offset,
                    )
    reput_from = max((cq.max_physic_offset for cq in queues.queues.values()), default=cl_min)
    reput_from = max(reput_from, cl_min)
    if abnormal:
        reput_from = min(reput_from, report.start_offset)
    for key in damaged:
        # a queue cut short by damage in its middle is rebuilt from the log from where it now ends
        q = queues.queues.get(key)
        report.cq_damaged.append(f"{key[0]}-{key[1]}")
        if q is not None:
            reput_from = min(reput_from, max(cl_min, q.max_physic_offset if q.max_physic_offset >= 0 else cl_min))
    if starts:
        reput_from = max(cl_min, min(reput_from, min(starts)))
    if not abnormal and verify_queues and report.start_offset < reput_from:
        # the walked segments: a queue whose last units were zeroed ends early; its records are dispatched again
        lost = _first_unit_lost(commit_log, queues, report.start_offset, reput_from)
        if lost is not None:
            at, topic, qid, qoff = lost
            what = (
                f"ends before queue offset {qoff}, whose record is at commit log offset {at} (its last units "
                f"damaged): the records from there on are dispatched again"
            )
            log.error("consume queue %s-%d %s", topic, qid, what)
            report.cq_rebuilt.setdefault(f"{topic}-{qid}", what)
            reput_from = at
    report.reput_from = reput_from
    return report


def check_segments(root: str, directory: str, size: int, cq_root: str, salvage: bool) -> List[str]:
    """Refuse (DamagedLogError) a log whose segments are misnamed (not 20 digits), missing between others, or
    all gone while ConsumeQueues hold units. With ``salvage`` the store opens with what is there: misnamed
    files are ignored, segments after a gap are moved to ``recovery/``; returns what was accepted."""
    d = directory
    names = sorted(os.listdir(d))
    misnamed = [n for n in names if not SEGMENT_NAME_RE.fullmatch(n)]
    segs = sorted(int(n) for n in names if SEGMENT_NAME_RE.fullmatch(n))
    missing: List[str] = []
    gap_at = None
    for a, b in zip(segs, segs[1:]):
        if b > a + size and b % size == 0 and a % size == 0:
            missing += [f"{x:020d}" for x in range(a + size, min(b, a + 65 * size), size)]
            gap_at = b if gap_at is None else gap_at
    problems: List[str] = []
    if misnamed:
        problems.append(f"files that are not 20-digit segment names: {misnamed}")
    if missing:
        problems.append(f"missing segments between others: {missing}")
    if not segs and numbered_units(cq_root):
        problems.append("no segment at all while the consume queues hold units")
        missing.append("(every segment)")
    if not problems:
        return []
    msg = f"commit log {d}: " + "; ".join(problems)
    if not salvage:
        raise DamagedLogError(msg + "; open with salvage=True to keep what can be read", misnamed + missing)
    log.error("salvage: %s", msg)
    if gap_at is not None:
        qdir = os.path.join(root, RECOVERY_DIR, f"segments-after-gap-{int(time.time() * 1000)}")
        os.makedirs(qdir)
        for b in segs:
            if b >= gap_at:
                os.rename(os.path.join(d, f"{b:020d}"), os.path.join(qdir, f"{b:020d}"))
        fsync_dir(qdir)
        fsync_dir(d)
        problems.append(f"segments from {gap_at:020d} on moved to {qdir}")
    return problems
