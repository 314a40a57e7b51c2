"""``localmq verify``: walk a store's files alone and report damage (commit log, ConsumeQueues, index)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from localmq._index import key_hash
from localmq._record import decode_message, scan_record, unknown_format, walk_records
from localmq.cli.common import (
    _CHUNK,
    EXIT_DAMAGE,
    EXIT_OK,
    EXIT_UNKNOWN_FORMAT,
    _emit,
    _files,
    _lock_state,
    _Progress,
    _say,
)
from localmq.errors import CorruptFrameError, CorruptStoreError, NotAStoreError, UnknownRecordFormatError
from localmq.layout import CQ_BLANK_UNIT_SIZE, INDEX_HEADER_SIZE, INDEX_ITEM_SIZE, INDEX_SLOT_SIZE, REC_MIN_SIZE
from localmq.status import RecordStatus, Stop
from localmq.store.checkpoint import read_checkpoint
from localmq.store.config_json import loads as config_loads
from localmq.store.files import StoreFiles, not_understood
from localmq.store.index import IndexFile, torn_index_write
from localmq.store.readers import load_consume_queue
from localmq.store.settings import read_log_start


def _has_data(mf, start: int, end: int) -> bool:
    while start < end:
        stop = min(end, start + _CHUNK)
        arr = np.frombuffer(mf, np.uint8, count=stop - start, offset=start)
        try:
            if arr.any():
                return True
        finally:
            del arr  # a view of the mapping: gone before it is closed
        start = stop
    return False


def _record_extent(mf, pos: int, size: int) -> int:
    """Where the record at ``pos`` ends by its TOTALSIZE (the segment's end when that is not a possible size)."""
    total = int.from_bytes(mf.read(pos, 4), "big", signed=True) if pos + 4 <= size else 0
    return pos + total if REC_MIN_SIZE <= total <= size - pos else size


def _verify_commit_log(
    files: StoreFiles,
    end: int,
    progress: _Progress,
    problems: list,
    notes: list,
    unknown: Optional[dict] = None,
    known_end: int = 0,
) -> int:
    """Walk every record of every segment below ``end`` with CRCs and header checks; returns records walked. A record
    localmq does not understand (``files.not_understood``: an unknown format, a V2 record naming a topic longer than
    localmq's names) is no problem: it goes to ``unknown`` ({offset: (magic, size, what)}) and the walk goes on after
    it. An invalid record at or past ``known_end`` (how far the ConsumeQueues reach) with nothing after it is the
    torn tail a crash leaves: a note, as recovery cuts it without loss."""
    if unknown is None:
        unknown = {}
    records = 0
    done = 0
    data_ended_at: Optional[int] = None
    for base, fpath in files.segments:
        mf = files.map_segment(base, fpath)
        try:
            size = files.segment_size
            if data_ended_at is not None:
                if _has_data(mf, 0, size):
                    problems.append(f"commit log {fpath}: data after the end of the log at {data_ended_at:,}")
                continue
            limit = min(size, max(0, end - base)) if files.live_end is not None else size
            pos, stop = 0, min(limit, _CHUNK)
            while True:
                pos, outcome, n, _, _ = walk_records(mf, pos, stop, True, True)
                records += n
                progress.update(done + pos)
                if stop < limit and (pos >= stop or outcome == RecordStatus.TORN):
                    stop = min(limit, max(pos, stop) + _CHUNK)  # the chunk ended (maybe inside a record): go on
                    continue
                found = (
                    not_understood(mf, pos, outcome, limit)
                    if outcome in (RecordStatus.BAD_MAGIC, RecordStatus.BAD_TOPIC)
                    else None
                )
                if found is not None:
                    # framed by its TOTALSIZE: the walk goes on after it (never a repair, never damage)
                    magic, rsize, what = found
                    unknown[base + pos] = (magic, rsize, what)
                    pos += rsize
                    stop = min(limit, max(pos, stop))
                    if pos < limit:
                        continue
                    outcome = RecordStatus.END
                break
            at = base + pos
            if files.live_end is not None and at >= files.live_end:
                break  # a live store's committed end: past it a put may be half-copied
            if outcome == RecordStatus.BLANK or pos >= size:
                pass
            elif outcome == RecordStatus.END:
                if _has_data(mf, pos, size):
                    problems.append(f"commit log offset {at:,} ({fpath}): zero bytes followed by more data")
                else:
                    data_ended_at = at
            elif at >= known_end and not _has_data(mf, _record_extent(mf, pos, size), size):
                # past what the ConsumeQueues reach, with nothing after it: a write a crash cut short, which the
                # dispatcher never read (a SIGKILLed writer, RocketMQ's or ours). Recovery ends the log there
                notes.append(
                    f"commit log offset {at:,}: a torn record at the end of the data ({outcome}; what a "
                    "crash leaves, never dispatched: recovery cuts it)"
                )
                data_ended_at = at
            else:
                problems.append(
                    f"commit log offset {at:,} ({fpath}): {outcome} record"
                    + (" followed by more data" if at >= known_end else "; the rest of this segment is not walked")
                )
        finally:
            mf.close()
        done += files.segment_size
    return records


def _verify_queues(
    files: StoreFiles, end: int, live: bool, progress: _Progress, problems: list, notes: list, unknown: dict
) -> Tuple[int, int]:
    """Every ConsumeQueue unit must point at the record of its topic, queue id and queue offset."""
    maps: Dict[int, Any] = {}
    units_checked = lost = 0
    gap_at = {}
    for g in files.gap_offsets():
        seg = files.segment_of(g)
        if seg is not None:
            mf = maps.setdefault(seg[0], files.map_segment(*seg))
            status, size = scan_record(mf, g - seg[0], False)
            if status == RecordStatus.GAP:
                gap_at[g] = size
    try:
        queues = files.queues()
        for i, cq in enumerate(queues):
            progress.update(i)
            loaded = load_consume_queue(cq.path)
            if loaded.stop_reason != Stop.END and not live:
                problems.append(
                    f"consume queue {cq.topic}/{cq.queue_id}: {loaded.stop_reason} after queue offset "
                    f"{loaded.max_queue_offset:,} ({cq.path})"
                )
            units = loaded.units
            for j in range(len(units)):
                phys, size = int(units["offset"][j]), int(units["size"][j])
                qoff = loaded.queue_offset_base + j
                if size == CQ_BLANK_UNIT_SIZE or phys < files.min_offset or phys + size > end:
                    if phys + size > end and size != CQ_BLANK_UNIT_SIZE and not live:
                        problems.append(
                            f"consume queue {cq.topic}/{cq.queue_id}@{qoff}: points past the end of "
                            f"the commit log ({phys:,})"
                        )
                    continue
                if gap_at.get(phys) == size:
                    lost += 1
                    continue
                seg = files.segment_of(phys)
                if seg is None:
                    continue
                mf = maps.get(seg[0])
                if mf is None:
                    mf = maps[seg[0]] = files.map_segment(*seg)
                try:
                    m = decode_message(mf, phys - seg[0], check_crc=False, base_offset=seg[0], copy=False)
                    ok = (
                        m is not None
                        and m.topic == cq.topic
                        and m.queue_id == cq.queue_id
                        and m.queue_offset == qoff
                        and m.store_size == size
                    )
                    m = None
                except CorruptFrameError:
                    ok = False
                if not ok and phys in unknown:
                    continue  # a record of a format localmq does not know: counted by the commit log walk
                units_checked += 1
                if not ok:
                    problems.append(
                        f"consume queue {cq.topic}/{cq.queue_id}@{qoff}: unit ({phys:,}, {size}) does "
                        "not point at that message's record"
                    )
    finally:
        for mf in maps.values():
            mf.close()
    return units_checked, lost


def _verify_index_items(files, idx, end: int, samples: int = 512) -> Tuple[int, int]:
    """(items whose key hash is none of the record's keys, items checked): up to ``samples`` items spread over the
    file, each pointing at a record below ``end`` in a segment still there."""
    count = idx.header.index_count
    if count <= 1:
        return 0, 0
    step = max(1, (count - 1) // samples)
    items_at = INDEX_HEADER_SIZE + idx.hash_slot_num * INDEX_SLOT_SIZE
    mf = idx.mapped_file
    wrong = checked = 0
    for i in range(1, count, step):
        raw = mf.read(items_at + i * INDEX_ITEM_SIZE, INDEX_ITEM_SIZE)
        h, phy = int.from_bytes(raw[:4], "big", signed=True), int.from_bytes(raw[4:12], "big", signed=True)
        seg = files.segment_of(phy)
        if seg is None or phy >= end:
            continue  # deleted by retention, or past what recovery keeps
        checked += 1
        seg_mf = files.map_segment(*seg)
        try:
            try:
                msg = decode_message(seg_mf, phy - seg[0], check_crc=False, base_offset=seg[0])
            except (CorruptFrameError, UnknownRecordFormatError):
                msg = None
            if msg is None and unknown_format(seg_mf, phy - seg[0]) is not None:
                checked -= 1  # a record of another format (reported by the walk): not the index's fault
                continue
        finally:
            seg_mf.close()
        if msg is None:
            wrong += 1
            continue
        props = msg.properties
        keys = [props.get("UNIQ_KEY")] + (props.get("KEYS") or "").split(" ")
        if h not in {key_hash(f"{msg.topic}#{k}") for k in keys if k}:
            wrong += 1
    return wrong, checked


def _verify(args) -> int:
    files = _files(args.store)
    problems: List[str] = []
    notes: List[str] = []
    state = _lock_state(files.root)
    if state == "live, held by one process":
        notes.append("the store is held by one live process: its last records may be in flux")
    dispatched = files.dispatched_end()
    try:
        end = files.walk_end(known_end=dispatched)
    except CorruptFrameError:
        end = files.segments[-1][0] + files.segment_size if files.segments else 0
    live = files.live_end is not None or state != "closed"
    if files.empty_last is not None and not live:
        notes.append(
            f"{files.empty_last} is empty: the creation of the last segment was cut short (a crash between "
            f"creating the file and sizing it). It holds no record; a writer's open sizes it, RocketMQ 5 deletes it "
            f"and RocketMQ 4.9 refuses to load the store until it is deleted"
        )
    log_start = read_log_start(files.root)
    if log_start is not None and files.segments and files.min_offset > log_start:
        problems.append(
            f"commit log segments missing at the start of the log: it starts at {files.min_offset:,}, "
            f"but localmq's retention moved it to {log_start:,} only (deleted by hand, lost, or by "
            f"RocketMQ's retention); the next open reports and accepts it"
        )
    total = sum(files.segment_size for _ in files.segments)
    progress = _Progress(args, "verify: commit log", total)
    unknown: Dict[int, Tuple[int, int, str]] = {}
    records = _verify_commit_log(files, end, progress, problems, notes, unknown, dispatched)
    progress.done()
    progress = _Progress(args, "verify: consume queues", len(files.queues()))
    units, lost = _verify_queues(files, end, live, progress, problems, notes, unknown)
    progress.done()
    index_files = files.index_files()
    for f in index_files:
        try:
            idx = IndexFile.open(f.path, writable=False)
        except (CorruptStoreError, OSError) as e:
            if not live and os.path.exists(files.abort) and torn_index_write(f.path):
                notes.append(
                    f"index file {f.path}: one key's item past the header's count, the torn write of an unclean "
                    f"exit (the item is written before the count); the next open indexes those records again"
                )
            else:
                problems.append(str(e) if str(e).startswith(f"index file {f.path}") else f"index file {f.path}: {e}")
            continue
        try:
            wrong, sampled = _verify_index_items(files, idx, end)
        finally:
            idx.close()
        if wrong:
            problems.append(
                f"index file {f.path}: {wrong} of {sampled} sampled items do not hold the key hash of the "
                f"record they point at, read with {idx.hash_slot_num} slots and {idx.index_num} items "
                f"(a file of another geometry, or damaged): queries would miss keys. It is derived "
                f"data: delete it and the next open indexes its records again"
            )
    try:
        read_checkpoint(files.checkpoint)
    except NotAStoreError:
        notes.append("no checkpoint file")
    except CorruptStoreError as e:
        problems.append(str(e))
    cfg = [n for n in sorted(os.listdir(files.config)) if n.endswith(".json")] if os.path.isdir(files.config) else []
    for name in cfg:
        try:
            with open(os.path.join(files.config, name), "rb") as fh:
                config_loads(fh.read())
        except ValueError as e:
            problems.append(f"config/{name} does not parse: {e}")
    if lost:
        notes.append(
            f"{lost} ConsumeQueue unit(s) mark messages lost to damage that recovery quarantined "
            f"(recovery/commitlog-gap-*)"
        )
    unknown_rows = [
        {"offset": off, "magic": f"0x{magic:08X}", "size": size, "what": what}
        for off, (magic, size, what) in unknown.items()
    ]
    summary = {
        "store": files.root,
        "ok": not problems and not unknown,
        "problems": problems,
        "notes": notes,
        "unknown_records": unknown_rows,
        "segments": len(files.segments),
        "records": records,
        "consume_queue_units": units,
        "consume_queues": len(files.queues()),
        "index_files": len(index_files),
        "config_files": len(cfg),
    }
    if args.json:
        _emit(summary)
    else:
        for p in problems:
            _say(f"DAMAGE: {p}")
        for n in notes:
            _say(f"note: {n}")
        for u in unknown_rows:
            _say(
                f"UNKNOWN FORMAT: commit log offset {u['offset']:,}: {u['what']} ({u['size']} bytes, magic "
                f"{u['magic']}; not damage: a writable open refuses the store)"
            )
        state = "damaged" if problems else "unknown format" if unknown else "ok"
        _say(
            f"{state}: {records:,} records in {len(files.segments)} segment(s), "
            f"{units:,} ConsumeQueue units in {summary['consume_queues']} queue(s), {len(index_files)} index "
            f"file(s), {len(cfg)} config file(s) checked; {len(problems)} problem(s)"
        )
    return EXIT_DAMAGE if problems else EXIT_UNKNOWN_FORMAT if unknown else EXIT_OK
