"""Recovery of the CommitLog and ConsumeQueues after a clean (normal) or unclean (abnormal) exit."""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

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
    CQ_UNIT_SIZE,
    END_FILE_MIN_BLANK_LENGTH,
    GAP_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    RECOVERY_DIR,
    SEGMENT_NAME_RE,
)
from localmq.status import RecordStatus
from localmq.store.durable_names import makedirs_durable
from localmq.store.files import not_understood, numbered_units
from localmq.store.queue_recovery import (
    MinCorrected,
    RecoveryReport,
    _first_unit_lost,
    _rewrite_units,
    _verify_queues,
)
from localmq.store.settings import read_log_start

if TYPE_CHECKING:  # annotations only: these modules import nothing of this one
    from localmq._mapped_file import MappedFile
    from localmq.store.consume_queue_table import ConsumeQueueTable
    from localmq.store.mapped_file_queue import MappedFileQueue
    from localmq.store.undo import OpenUndo

log = logging.getLogger("localmq.recovery")


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


def _any_record(mf: MappedFile, q: int) -> bool:
    return True


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


def _gap_over(
    root: str,
    mfq: MappedFileQueue,
    report: RecoveryReport,
    undo: Optional["OpenUndo"],
    status: Any,
    damaged: Tuple[int, int],
    found: Tuple[int, int],
    old_segment: str = "",
) -> bool:
    """Replace the damage from (segment index, position) ``damaged`` up to the valid record at ``found`` by a gap
    record, its bytes copied to ``recovery/`` first (``report.gaps``); False when it is too short to hold one.
    ``old_segment``: the name of a segment older than the recovery walk (``_repair_segment``), for the log."""
    files = mfq.files
    (i, pos), (j, q) = damaged, found
    at = files[i].file_from_offset + pos
    resume = files[j].file_from_offset + q if j < len(files) else files[i].file_from_offset + mfq.file_size
    path = _quarantine_gap(root, mfq, at, resume)
    if undo is not None:
        undo.repaired_log(mfq.directory, mfq.file_size, at, resume, path)
    record = _mark_gap(files, i, pos, j, q)
    if record is None:
        return False
    report.gaps.append(
        {"offset": at, "bytes": resume - at, "reason": str(status), "quarantine_path": path, "record": record}
    )
    what = "zero bytes" if status == RecordStatus.END else f"{status} record"
    if old_segment:
        log.error(
            "commit log: %s at offset %d (segment %s, older than the recovery walk, found through the "
            "ConsumeQueues); replaced by a gap record, copy kept in %s; the records after it are kept",
            what,
            at,
            old_segment,
            path,
        )
        return True
    log.error(
        "commit log: %s at offset %d; %d bytes up to the next valid record at %d replaced by a gap record (copy "
        "kept in %s); the records after it are kept",
        what,
        at,
        resume - at,
        resume,
        path,
    )
    return True


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
    widen: Optional[Callable[[], int]] = None,
) -> int:
    """Walk records from segment ``first_index`` on; returns the end of the last valid record.

    Damage with valid records after it (below ``known_end``: how far the ConsumeQueues say the log reached) is
    resynchronised: its bytes are copied to ``recovery/``, replaced by a gap
    record, and the walk goes on. Damage with nothing valid after it is the end of the log (a torn tail).

    ``widen``: with rows a running store's cut vouched for, ``known_end`` may be short of where the queues reach
    (rows end at the cut, and the queues written after it are still rows), and a row is no queue to check a
    resynchronisation against: at the first damage with a record written where it lies somewhere after it,
    ``widen()`` reads every queue and returns where they reach, and the walk goes on with that."""
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
        if widen is not None:
            # (also below known_end: the agreement check would build a row whose queue was written after the cut, and
            # its repair re-dispatch from the cut into this damage)
            if _resync(files, i, pos, files[-1].file_from_offset + size, _any_record) is not None:
                known_end = max(known_end, widen())
            widen = None
        limit = known_end
        found = _resync(files, i, pos, limit, agrees) if limit > at else None
        if found is not None and _gap_over(root, mfq, report, undo, status, (i, pos), found):
            i, pos = found
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
    widen: Optional[Callable[[], int]] = None,
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
        agrees if agrees is not None else _any_record,
        undo,
        widen,
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
        if not _gap_over(root, mfq, report, undo, status, (i, pos), (j, q), os.path.basename(mf.path)):
            log.error("commit log: %s at offset %d in an old segment: too short to mark; left as it is", status, at)
            return
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
    for key, cq in list(queues.built.items()):  # a queue not built yet is vouched for
        if key in queues.vouched or not cq.mapped_file_queue.files:
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


def _check_segments_at_end(commit_log: "MappedFileQueue", queues: "ConsumeQueueTable", salvage: bool) -> None:
    """Units pointing past the last segment mean segments lost at the end: DamagedLogError naming the first one,
    unless ``salvage`` (then logged; the queues are cut to the log afterwards)."""
    log_end = commit_log.files[-1].file_from_offset + commit_log.file_size if commit_log.files else 0
    beyond = {f"{k[0]}-{k[1]}": phys for k, _, phys in queues.ends(queues.rows_phys()[1] > log_end) if phys > log_end}
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
    vouched_end: int = -1,
    vouched_running: bool = False,
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

    The queues in ``queues.vouched`` (their state from a queue snapshot, ``vouched_end`` the log's end it recorded)
    are neither read nor checked, unless the log's recovery finds anything to repair or another end: then each is
    checked as every other queue. With ``vouched_running`` (after a crash: a running store's cut at
    ``vouched_end``) they hold every record before the cut and none after it: they stay vouched while the log
    reaches the cut without a gap, and re-dispatch starts at the cut at the latest.
    """
    vouched = queues.vouched  # state from a queue snapshot (store/queue_snapshot.py): not read, not checked
    # a queue not built yet is vouched for (ConsumeQueueTable.rows): only the built ones can need a check here
    damaged = [key for key, cq in list(queues.built.items()) if key not in vouched and cq.recover()]
    _check_segments_at_end(commit_log, queues, salvage)
    # a row is not damaged: vouched for, checked on first use
    known_end = max(_known_end(queues, damaged), queues.rows_phys()[1])

    agrees = _agreement(queues, damaged)

    check_vouched = functools.partial(_check_vouched, root, queues, damaged)
    widen = functools.partial(_widen, root, queues, damaged) if vouched and vouched_running else None
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
        widen=widen,
    )
    end = report.end_offset

    if vouched and _changed_since(report, vouched_end, vouched_running, abnormal):
        check_vouched()
    cl_min = commit_log.min_offset()
    if not commit_log.files:
        queues.destroy_all()
    rows = queues.rows
    lo, hi = queues.rows_phys()
    # the queues that can hold units past the end are built (the rows only when one may: their bounds say)
    for key, max_offset, phys in queues.ends(lo < 0 or hi > end):
        if key in rows and 0 <= phys <= end:
            continue  # a row whose units end at or before the log's end (a row is checked on its first use)
        if phys >= end or max_offset > 0 and phys < 0:
            n = queues.queues[key].truncate_dirty(end)
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
        if vouched and report.gaps:  # damage an unvouched queue met in an old segment: vouched ones may point there
            check_vouched()
            for k in _damaged_old_segments(commit_log, queues, report.start_offset, end):
                _repair_segment(root, commit_log, k, check_crc, report, known_end, agrees, undo)
    report.cq_vouched = len(vouched)
    starts = _verify_queues(commit_log, queues, end, cl_min, report, min_corrected) if verify_queues else []
    if abnormal:
        _rewrite_after(queues, report.start_offset)
    report.reput_from = _reput_from(commit_log, queues, report, cl_min, damaged, starts, abnormal, verify_queues)
    if vouched:  # (after a crash only a running store's cut is left vouched for: its records after the cut)
        report.reput_from = max(cl_min, min(report.reput_from, vouched_end))
    return report


def _known_end(queues: "ConsumeQueueTable", damaged: List[Tuple[str, int]]) -> int:
    """How far the built queues (but the damaged ones) say the log reached."""
    return max((phys for k, _, phys in queues.ends(False) if k not in damaged), default=0)


def _check_vouched(
    root: str,
    queues: "ConsumeQueueTable",
    damaged: List[Tuple[str, int]],
    why: str = "the commit log changed since its clean close",
) -> None:
    """The log is not as the snapshot saw it (``why``): no queue is vouched for, each is loaded from its files, as an
    open without a snapshot loads them, and checked as usual."""
    log.warning("recovery of %s: %s; checking every queue", root, why)
    late = queues.load_rows()
    queues.vouched.clear()
    damaged.extend(key for key in late if queues.built[key].recover())


def _widen(root: str, queues: "ConsumeQueueTable", damaged: List[Tuple[str, int]]) -> int:
    """Damage past a running store's cut with records after it (``_walk``'s ``widen``): every queue is read (the
    queues written after the cut are rows, which end at it), and where they reach is returned."""
    _check_vouched(
        root, queues, damaged, "damage in the commit log past the running store's cut, with records after it"
    )
    return _known_end(queues, damaged)


def _changed_since(report: RecoveryReport, vouched_end: int, running: bool, abnormal: bool) -> bool:
    """Whether the log is not as the snapshot saw it: a clean close's ends where it ended, without a repair, after a
    clean exit; a running store's cut (``running``) reaches the cut without a gap."""
    if running:
        return report.end_offset < vouched_end or bool(report.gaps)
    return (
        report.end_offset != vouched_end
        or bool(report.gaps)
        or report.dropped_at is not None
        or bool(report.deleted_segments)
        or abnormal
    )


def _agreement(queues: "ConsumeQueueTable", damaged: List[Tuple[str, int]]) -> Callable[[MappedFile, int], bool]:
    """The check of a resynchronisation candidate (the record at position ``q`` of segment ``mf``): its queue
    offset must agree with its queue, whose unit for that offset points at this record (a unit that is blank or
    lost, a queue that is damaged or shorter, says nothing)."""

    def agrees(mf: MappedFile, q: int) -> bool:
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

    return agrees


def _rewrite_after(queues: "ConsumeQueueTable", start: int) -> None:
    """After an unclean exit: the units of the records from the recovery start on are written again. A row is
    left alone: a running store's cut vouched for it, whose units were flushed before the cut was written."""
    for key, _, phys in queues.ends(False):
        if phys > start:
            n = _rewrite_units(queues.queues[key], start)
            if n:
                log.info(
                    "consume queue %s-%s: the %d units of the records from offset %d on are written again",
                    key[0],
                    key[1],
                    n,
                    start,
                )


def _reput_from(
    commit_log: MappedFileQueue,
    queues: ConsumeQueueTable,
    report: RecoveryReport,
    cl_min: int,
    damaged: List[Tuple[str, int]],
    starts: List[int],
    abnormal: bool,
    verify_queues: bool,
) -> int:
    """Where the dispatcher must start so that every record after it reaches its queue: where the queues end, at the
    latest the recovery start after an unclean exit, no later than the end of a queue cut short by damage or by the
    unit check (``starts``), nor than a queue whose last units were zeroed in the walked segments."""
    reput_from = max(max((phys for _, _, phys in queues.ends(False)), default=cl_min), queues.rows_phys()[1])
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
    return reput_from


def check_log_start(root: str, log_files: MappedFileQueue, cl_min: int, report: RecoveryReport) -> Optional[int]:
    """Segments below the first one that localmq's retention did not delete (the record's commit_log_start is
    below it) are reported (``report.missing_head``, an ERROR): their messages are gone, as after retention,
    but nobody asked for it. Returns the log start to record (the log's start, once the open succeeds), or None
    when the record stays."""
    recorded = read_log_start(root)
    missing = recorded is not None and bool(log_files.files) and cl_min > recorded
    if recorded is not None and missing:
        size = log_files.file_size
        report.missing_head = [f"{b:020d}" for b in range(recorded, cl_min, size)][:64]
        log.error(
            "commit log of %s: segments %s missing at the start of the log (%d bytes from offset %d): "
            "localmq's retention did not delete them (deleted by hand, lost, or by RocketMQ's retention); "
            "their messages are gone",
            root,
            report.missing_head,
            cl_min - recorded,
            recorded,
        )
    return cl_min if recorded is None or missing else None


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
