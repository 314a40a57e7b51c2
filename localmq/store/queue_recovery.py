"""Recovery of the ConsumeQueues against the recovered CommitLog: every unit checked against its record
(``_verify_queues``: cut at the first bad unit, rebuilt from the log), the queues whose first files retention or damage
took (``_missing_first_files``), the units of an unclean exit written again (``_rewrite_units``), and the queue
offsets the put path continues from; and ``RecoveryReport``, what an open's recovery did. ``recovery.recover_store``
runs these after the log's own recovery."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple

import numpy as np

from localmq._columns import RecordColumns, decode_range, topic_codes
from localmq._native import fsync_dir
from localmq._record import decode_message
from localmq.layout import (
    CQ_BLANK_UNIT_SIZE,
    CQ_DTYPE,
    CQ_UNIT_SIZE,
    SYSFLAG_TRANSACTION_MASK,
    SYSFLAG_TRANSACTION_PREPARED,
    SYSFLAG_TRANSACTION_ROLLBACK,
)
from localmq.status import Stop
from localmq.store.durable_names import sync_each
from localmq.store.readers import read_commitlog

if TYPE_CHECKING:  # annotations only: these modules import nothing of this one at run time
    from localmq._mapped_file import MappedFile
    from localmq.store.consume_queue import ConsumeQueue
    from localmq.store.consume_queue_table import ConsumeQueueTable
    from localmq.store.mapped_file_queue import MappedFileQueue

    # get.first_bad_unit: (cq, commit log files, segment size, start, end, log end) -> (index or -1, why)
    _FirstBadUnit = Callable[[ConsumeQueue, List[MappedFile], int, int, int, int], Tuple[int, Optional[str]]]

log = logging.getLogger("localmq.recovery")


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
    # queues whose state the queue snapshot of the last clean close gave, neither read nor checked at this open
    # (store/queue_snapshot.py)
    cq_vouched: int = 0
    seconds: float = 0.0

    def add_repair(self, other: "RecoveryReport") -> None:
        """Add what the repair of a queue on its first use did (``repair_queue``'s report)."""
        self.cq_rebuilt.update(other.cq_rebuilt)
        self.cq_lost_units.update(other.cq_lost_units)
        self.cq_damaged.extend(other.cq_damaged)
        self.damaged_headers.extend(other.damaged_headers)
        self.redispatched += other.redispatched

    @property
    def repaired(self) -> bool:
        """Whether recovery cut, rebuilt, salvaged or walked over anything (the open logs it as a warning)."""
        return bool(
            self.dropped_at is not None
            or self.cq_units_truncated
            or self.cq_rebuilt
            or self.rebuilt
            or self.salvaged
            or self.gaps
        )

    def as_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


# queue -> (the commit log min offset its min_offset was corrected for, its max_offset then): see _verify_queues
MinCorrected = Dict[Tuple[str, int], Tuple[int, int]]


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
    rows = queues.rows
    # a row's end: a row is checked on its first use (ConsumeQueueTable._build), which indexes again what it lacks
    never = 1 << 62

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
                tcodes, qids = (keys >> 32).tolist(), (keys & 0xFFFFFFFF).astype(np.uint32).view(np.int32).tolist()
                ends = np.array(
                    [
                        never if (names[t], q) in rows else queues.max_offset((names[t], q))
                        for t, q in zip(tcodes, qids)
                    ],
                    np.int64,
                )[where]
                lost = np.flatnonzero(indexed & (qoff >= ends))
                if lost.size:
                    i = int(lost[0])
                    return int(cols["physical_offset"][i]), names[codes[i]], int(qid[i]), int(qoff[i])
            if reason != Stop.FULL:
                break
    return None


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


def _gap_holding(unit: Optional[Tuple[int, int, int]], gaps: List[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The gap record of this recovery whose region held ``unit``'s record, or None. A real unit only: an empty
    one (offset 0, size 0: a unit never written, or lost with its page) says nothing of a record, even when a gap
    starts at the log's offset 0 (it was made a lost unit there, and the queue kept every empty unit after it:
    tests/test_power_loss.py)."""
    if unit is None or unit[1] <= 0 or not gaps:
        return None
    return next((g for g in gaps if g["record"] and g["offset"] <= unit[0] < g["offset"] + g["bytes"]), None)


def _verify_queues(
    commit_log: MappedFileQueue,
    queues: ConsumeQueueTable,
    end: int,
    cl_min: int,
    report: RecoveryReport,
    min_corrected: Optional[MinCorrected] = None,
    only: Optional[Dict[Tuple[str, int], ConsumeQueue]] = None,
) -> List[int]:
    """Check every ConsumeQueue against the recovered log (derived data: the log is the truth) and cut each one
    at its first unit that does not match its record; returns the commit log offsets the dispatcher must start
    from (at the latest) so that the cut queues are rebuilt. Fills ``report.cq_rebuilt``. A queue found whole
    gets its ``min_offset`` corrected for ``cl_min`` at once, while its files are mapped (with more queues than
    the mapping budget a later pass would map each again), and is entered in ``min_corrected``. ``only``: check these
    queues instead (``repair_queue``)."""
    from localmq.store.get import first_bad_unit  # compiled, same layer

    starts: List[int] = []
    files, seg_size = commit_log.files, commit_log.file_size
    missing_head = _missing_first_files(commit_log, queues, end, cl_min, only)
    for key, cq in list((only if only is not None else queues.built).items()):  # a row is vouched for
        if key in queues.vouched:
            continue
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
            gap = _gap_holding(unit, report.gaps)
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
    commit_log: MappedFileQueue,
    queues: ConsumeQueueTable,
    end: int,
    cl_min: int,
    only: Optional[Dict[Tuple[str, int], ConsumeQueue]] = None,
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
    for key, cq in list((only if only is not None else queues.built).items()):  # a row is vouched for
        mfq = cq.mapped_file_queue
        if key in queues.damaged or key in queues.vouched or not mfq.files or not commit_log.files:
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


def repair_queue(
    commit_log: MappedFileQueue,
    queues: ConsumeQueueTable,
    key: Tuple[str, int],
    cq: ConsumeQueue,
    delay_levels: List[int],
    skip_offsets: Optional[Set[int]] = None,
    at: int = -1,
    row_max: int = -1,
) -> RecoveryReport:
    """A queue whose snapshot row no longer holds on its first use (its files changed behind the closed store, or the
    row lies): checked against the log as an open without a snapshot checks a queue (its end, files missing at its
    head, every unit against its record), cut at its first unit that does not match, and its records from its new
    end on dispatched again, this queue's only (a private dispatcher that skips every other queue's records). While
    the queue was a row, no dispatcher met a record of it past the snapshot's log end (``queues.rows_end``): its
    first one would have built the queue, so the log from the queue's end to the log's end is all it lacks. Costs
    a walk of the log from there (rare: someone changed its files); returns what was done (a RecoveryReport).

    ``at`` (>= 0): after a crash, the rows a running store's cut (``queues.rows_end``), the dispatcher at ``at``,
    past the cut, its first record of the queue since (``row_max`` the row's max offset): units after the cut
    were written before the crash (its files changed), and are checked as the open checks any queue after a crash,
    against the whole log. When the check keeps the row's units, the queue holds every record of it before ``at``
    (none lies between the cut and ``at``): no walk, the dispatcher goes on; else the walk as above."""
    from localmq.store.dispatch import ReputCore  # compiled, same layer

    report = RecoveryReport(mode="first use")
    name = f"{key[0]}-{key[1]}"
    cl_min = commit_log.min_offset()
    end = max(queues.rows_end, 0) if at < 0 else commit_log.max_offset()
    starts: List[int] = []
    if cq.recover():  # units after its end: damage in its middle, cut there (dispatched again from its end, below)
        report.cq_damaged.append(name)
    starts += _verify_queues(commit_log, queues, end, cl_min, report, None, {key: cq})
    queues.tell_built(cq)  # a failed open zeroes what is appended from here on, never a unit it kept
    if at >= 0 and cq.max_offset >= row_max >= 0 and name not in report.cq_damaged:
        # written after the cut: the units past it made durable again (a failed msync before the crash leaves them
        # in the page cache only, as the open's rewrite after a crash says)
        _rewrite_units(cq, queues.rows_end)
        cq.correct_min_offset(cl_min)
        report.end_offset = at
        log.info(
            "consume queue %s: written after the running store's cut, checked against the log on its first "
            "record past it (%s)",
            name,
            report.cq_rebuilt.get(name, "its units match the log"),
        )
        return report
    # from its end in any case: its last units may be the ones that went (a row says more than its files hold)
    starts.append(cq.max_physic_offset if cq.max_physic_offset >= cl_min else cl_min)
    core = ReputCore(commit_log, lambda t, q: cq if (t, q) == key else None, max(cl_min, min(starts)), 0)
    core.set_delay_levels(delay_levels)
    core.skip_offsets = skip_offsets
    core.register(cq)
    report.reput_from = max(cl_min, min(starts))
    ended = cq.max_offset
    report.redispatched = core.run_until_caught_up()
    if report.redispatched and name not in report.cq_rebuilt:
        report.cq_rebuilt[name] = (
            f"ends before queue offset {ended} (its files changed since the queue snapshot; checked on its first use): "
            f"the records from commit log offset {report.reput_from} on are dispatched again"
        )
    report.end_offset = core.reput_offset
    cq.correct_min_offset(cl_min)
    log.error(
        "consume queue %s: its files are not as the queue snapshot recorded them; checked against the commit log "
        "on its first use (%s), %d units indexed again from offset %d",
        name,
        report.cq_rebuilt.get(name, "its units match the log"),
        report.redispatched,
        report.reput_from,
    )
    return report


def sync_directories(root: str, vouched: Optional[Set[str]] = None) -> int:
    """fsync the store's root and every directory below it; returns how many. After an unclean exit the names this
    process sees may come from the page cache only: made by a process that died before syncing them, or whose sync
    failed (a failed fsync is not retried by anyone else). Syncing them now makes what recovery trusts durable.
    The directories in ``vouched`` (a running store's cut vouched for them: synced before the cut was written,
    unchanged since) are neither synced nor walked into.

    On several threads (``sync_each``): each fsync of a directory, even one with nothing to write, waits for a flush
    of the disk's cache (ext4: 0.2 ms here), and flushes that are asked for at the same time are done as one (2.8 s
    one after the other for the 12,500 directories of 10,000 queues). Raises the first failure (StoreIOError)."""
    dirs = []
    for dirpath, dirnames, _ in os.walk(root):
        dirs.append(dirpath)
        if vouched:
            dirnames[:] = [d for d in dirnames if f"{dirpath}/{d}" not in vouched]
    failures = sync_each(fsync_dir, dirs)
    if failures:
        raise failures[0][1]
    return len(dirs)
