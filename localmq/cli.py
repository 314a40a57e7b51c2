"""The ``localmq`` command: look inside a store (stats, topics, lag, tail, query, dlq, verify, dump); run the demo."""
from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

import localmq
from localmq._record import decode_message, scan_record, unknown_format, walk_records
from localmq.errors import (
    CorruptFrameError, CorruptStoreError, LocalMQError, NotAStoreError, StoreLockedError, UnknownRecordFormatError,
)
from localmq.queues.readonly import _lock_holder  # the read-only view's F_GETLK probe (takes no lock)
from localmq._index import key_hash
from localmq.layout import (
    CONFIG_DIR, CONSUMEQUEUE_DIR, CQ_BLANK_UNIT_SIZE, CTL_S_FLUSHED, CTL_S_HOUSEKEEPER, CTL_S_INDEXED, CTL_S_PUTS,
    CTL_S_REPUT, CTL_S_WPOS, INDEX_HEADER_SIZE, INDEX_ITEM_SIZE, INDEX_SLOT_SIZE, REC_MIN_SIZE,
)
from localmq.status import GetStatus, RecordStatus, Stop
from localmq.store.checkpoint import read_checkpoint
from localmq.store.config_json import loads as config_loads, read_offset_table
from localmq.store.control_view import ControlView
from localmq.store.files import ConsumeQueueFiles, StoreFiles, not_understood, numbered_files
from localmq.store.index import IndexFile
from localmq.store.readers import load_consume_queue, read_commitlog
from localmq.store.settings import read_log_start, read_settings

EXIT_OK, EXIT_FOUND_NOTHING, EXIT_USAGE, EXIT_BUSY = 0, 1, 2, 3
EXIT_DAMAGE = 1
EXIT_UNKNOWN_FORMAT = 4   # verify: no damage, but records of a format localmq does not know (README, Recovery)
_CHUNK = 16 << 20  # bytes walked between two progress updates


class CliError(Exception):
    """A failure reported as one line on stderr (never a traceback) with an exit code."""

    def __init__(self, message: str, code: int = EXIT_FOUND_NOTHING):
        super().__init__(message)
        self.code = code


# -- argument types (a bad value is a usage error: exit code 2) -------------------------------------------------


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            v = int(text, 0)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {v}")
        return v
    parse.__name__ = "integer"
    return parse


def _time_ms(text: str) -> int:
    """Milliseconds since the epoch, or an ISO 8601 date/time (local time unless it names a zone)."""
    if text.isdigit():
        return int(text)
    try:
        return int(datetime.datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not ms since the epoch nor an ISO 8601 time: {text!r}") from None


def _iso(ms: int) -> str:
    if ms <= 0:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


# -- output ---------------------------------------------------------------------------------------------------


def _emit(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=False) + "\n")


def _say(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def _message_dict(m) -> Dict[str, Any]:
    body = bytes(m.body)
    try:
        text: Optional[str] = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "physical_offset": m.physical_offset, "store_size": m.store_size, "store_timestamp": m.store_timestamp,
            "born_timestamp": m.born_timestamp, "msg_id": m.msg_id, "tags": m.tags, "keys": list(m.keys),
            "properties": m.properties, "body": text, "body_base64": base64.b64encode(body).decode("ascii")}


def _message_line(m, body_bytes: int) -> str:
    body = bytes(m.body)
    shown = repr(body[:body_bytes]) + ("..." if len(body) > body_bytes else "")
    return (f"{m.physical_offset:>12} {m.topic}/{m.queue_id}@{m.queue_offset} {_iso(m.store_timestamp)} "
            f"size={m.store_size} tags={m.tags!r} keys={list(m.keys)} body={shown}")


def _show_message(args, m) -> None:
    if args.json:
        _emit(_message_dict(m))
    else:
        _say(_message_line(m, args.body_bytes))


class _Progress:
    """A one-line progress bar on stderr, only when stderr is a terminal (and not --json / --no-progress)."""

    def __init__(self, args, label: str, total: int):
        self.on = (not args.json and not getattr(args, "no_progress", False) and total > 0
                   and sys.stderr.isatty())
        self.label, self.total, self.last = label, total, 0.0

    def update(self, done: int) -> None:
        now = time.monotonic()
        if self.on and now - self.last >= 0.2:
            self.last = now
            frac = min(1.0, done / self.total)
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}%")
            sys.stderr.flush()

    def done(self) -> None:
        if self.on and self.last:
            sys.stderr.write("\r" + " " * (len(self.label) + 40) + "\r")
            sys.stderr.flush()


# -- opening a store ------------------------------------------------------------------------------------------


def _files(path: str) -> StoreFiles:
    try:
        files = StoreFiles(path)
        if not files.segments:
            # no segment to read the size off yet: the size the store was created with is in config/localmq.json
            recorded = read_settings(files.root) or {}
            if recorded.get("mapped_file_size_commit_log"):
                files = StoreFiles(path, recorded["mapped_file_size_commit_log"])
        return files
    except NotAStoreError as e:
        raise CliError(f"{path}: {e.strerror}") from None
    except CorruptStoreError as e:
        raise CliError(f"{path}: {e}", EXIT_DAMAGE) from None


def _cq_file_size(root: str) -> Optional[int]:
    cq_root = os.path.join(root, CONSUMEQUEUE_DIR)
    size = 0
    for t in os.listdir(cq_root) if os.path.isdir(cq_root) else ():
        tdir = os.path.join(cq_root, t)
        for q in os.listdir(tdir) if os.path.isdir(tdir) else ():
            size = max([size] + [f.size for f in numbered_files(os.path.join(tdir, q))])
    return size or None


def _open(path: str):
    """A ReadOnlyMessageQueue of ``path`` with the segment sizes its files have (it locks and writes nothing)."""
    files = _files(path)
    # sizes read off the files; a store without segments yet has them in config/localmq.json (the open reads it)
    sizes: Dict[str, int] = {"mapped_file_size_commit_log": files.segment_size} if files.segments else {}
    cq = _cq_file_size(files.root)
    if cq:
        sizes["mapped_file_size_consume_queue"] = cq
    try:
        return localmq.open(path, read_only=True, **sizes)
    except StoreLockedError:
        raise CliError(f"{os.path.abspath(path)} is held by one live process alone (opened with shared=False): "
                       "its end is in that process's memory. Open it with shared=True there to look inside while "
                       "it runs, or wait until it closes; `dump` and `verify` read the files alone.",
                       EXIT_BUSY) from None
    except (CorruptStoreError, NotAStoreError) as e:
        raise CliError(f"{path}: {e}") from None


def _queue_offsets(mq) -> List[Tuple[str, int, int, int]]:
    """(topic, queue id, min offset, max offset) of every queue."""
    return [(t, q, mq.min_offset(t, q), mq.max_offset(t, q)) for t, qs in mq.topics().items() for q in qs]


# -- stats ----------------------------------------------------------------------------------------------------


def _disk_use(root: str) -> Tuple[int, int]:
    apparent = allocated = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except FileNotFoundError:
                continue
            apparent += st.st_size
            allocated += st.st_blocks * 512
    return apparent, allocated


def _stats(args) -> int:
    files = _files(args.store)
    held = _lock_state(files.root)
    with _open(args.store) as mq:
        queues = _queue_offsets(mq)
        dispatched = 0
        for t, q, _, mx in queues:
            u = mq.consume_queue(t, q).unit(mx - 1) if mx > 0 else None
            if u is not None and u[1] != CQ_BLANK_UNIT_SIZE:
                dispatched = max(dispatched, u[0] + u[1])
    # the end recovery would find: a torn write past what the queues reach ends the log (a crashed store)
    end = files.walk_end(known_end=dispatched)
    apparent, allocated = _disk_use(files.root)
    try:
        cp = read_checkpoint(files.checkpoint)
        checkpoint: Optional[Dict[str, int]] = {"physic_msg_timestamp": cp.physic_msg_timestamp,
                                                "logics_msg_timestamp": cp.logics_msg_timestamp,
                                                "index_msg_timestamp": cp.index_msg_timestamp}
    except (NotAStoreError, CorruptStoreError):
        checkpoint = None
    live: Optional[Dict[str, int]] = None
    view = ControlView.open(files.root)
    if view is not None:
        try:
            live = {"committed_end": view.load(CTL_S_WPOS), "dispatched_end": view.load(CTL_S_REPUT),
                    "indexed_end": view.load(CTL_S_INDEXED), "sync_flushed_end": view.load(CTL_S_FLUSHED),
                    "puts": view.load(CTL_S_PUTS), "housekeeper_pid": view.load(CTL_S_HOUSEKEEPER)}
        finally:
            view.close()
        dispatched = live["dispatched_end"]
        end = max(end, live["committed_end"])  # read after the queues: the log's end as of now
    out = {
        "store": files.root, "state": held, "clean_exit": not os.path.exists(files.abort) if held == "closed" else None,
        "commit_log": {"min_offset": files.min_offset, "end": end, "bytes": end - files.min_offset,
                       "segments": len(files.segments), "segment_size": files.segment_size},
        "messages": sum(mx - mn for _, _, mn, mx in queues), "topics": len({t for t, *_ in queues}),
        "queues": len(queues),
        "dispatch": {"dispatched_end": dispatched, "behind_bytes": max(0, end - dispatched)},
        "checkpoint": checkpoint, "live": live, "index_files": len(files.index_files()),
        "disk": {"apparent_bytes": apparent, "allocated_bytes": allocated},
    }
    if args.json:
        _emit(out)
        return EXIT_OK
    cl = out["commit_log"]
    exit_note = "" if held != "closed" else ", last exit clean" if out["clean_exit"] else \
        ", last exit NOT clean: abort present, the next writer recovers"
    _say(f"store        {files.root} ({held}{exit_note})")
    _say(f"commit log   offsets {cl['min_offset']:,} .. {cl['end']:,} ({cl['bytes']:,} bytes) in "
         f"{cl['segments']} segment(s) of {cl['segment_size']:,} bytes")
    _say(f"messages     {out['messages']:,} in {out['queues']} queue(s) of {out['topics']} topic(s)")
    _say(f"dispatch     ConsumeQueues reach offset {dispatched:,} ({out['dispatch']['behind_bytes']:,} bytes "
         "behind the log end)")
    if checkpoint is not None:
        _say(f"flushed      checkpoint: commit log to {_iso(checkpoint['physic_msg_timestamp'])}, consume queues to "
             f"{_iso(checkpoint['logics_msg_timestamp'])}, index to {_iso(checkpoint['index_msg_timestamp'])}")
    if live is not None:
        _say(f"live         committed end {live['committed_end']:,}, dispatched {live['dispatched_end']:,}, "
             f"indexed {live['indexed_end']:,}, {live['puts']:,} puts since the first opener, housekeeper pid "
             f"{live['housekeeper_pid']}" + (f", SYNC_FLUSH flushed {live['sync_flushed_end']:,}"
                                              if live["sync_flushed_end"] else ""))
    _say(f"index        {out['index_files']} file(s)")
    _say(f"disk         {allocated:,} bytes allocated ({apparent:,} apparent)")
    return EXIT_OK


def _lock_state(root: str) -> str:
    """"closed", "shared by live processes" or "held by one live process" (asked without taking a lock)."""
    view = ControlView.open(root)
    if view is not None:
        view.close()
        return "live, shared"
    return "live, held by one process" if _lock_holder(root) == "exclusive" else "closed"


# -- topics / lag ---------------------------------------------------------------------------------------------


def _topics(args) -> int:
    with _open(args.store) as mq:
        rows = [{"topic": t, "queue_id": q, "min_offset": mn, "max_offset": mx, "messages": mx - mn}
                for t, q, mn, mx in _queue_offsets(mq) if args.topic is None or t == args.topic]
    if args.topic is not None and not rows:
        raise CliError(f"no topic {args.topic!r} in {args.store}")
    if args.json:
        _emit({"queues": rows})
        return EXIT_OK
    _say(f"{'topic':<24} {'queue':>5} {'min offset':>12} {'max offset':>12} {'messages':>12}")
    for r in rows:
        _say(f"{r['topic']:<24} {r['queue_id']:>5} {r['min_offset']:>12} {r['max_offset']:>12} {r['messages']:>12}")
    return EXIT_OK


def _lag(args) -> int:
    with _open(args.store) as mq:
        table, _ = read_offset_table(os.path.join(mq.root, CONFIG_DIR, "consumerOffset.json"))
        existing = mq.topics()
        rows = []
        for name, offsets in sorted(table.items()):
            topic, _, group = str(name).partition("@")
            if args.group is not None and group != args.group:
                continue
            committed = offsets
            for q in sorted(set(existing.get(topic, ())) | set(committed)):
                mx, mn = mq.max_offset(topic, q), mq.min_offset(topic, q)
                c = committed.get(q)
                rows.append({"group": group, "topic": topic, "queue_id": q, "committed": c, "max_offset": mx,
                             "lag": None if c is None else max(0, mx - max(c, mn))})
    if not rows:
        raise CliError(f"no committed offsets for group {args.group!r} in config/consumerOffset.json"
                       if args.group else "no committed offsets in config/consumerOffset.json")
    if args.json:
        _emit({"lag": rows, "total": sum(r["lag"] or 0 for r in rows)})
        return EXIT_OK
    _say(f"{'group':<16} {'topic':<20} {'queue':>5} {'committed':>10} {'max offset':>10} {'lag':>10}")
    for r in rows:
        c = "-" if r["committed"] is None else r["committed"]
        lag = "-" if r["lag"] is None else r["lag"]
        _say(f"{r['group']:<16} {r['topic']:<20} {r['queue_id']:>5} {c:>10} {r['max_offset']:>10} {lag:>10}")
    _say(f"total lag {sum(r['lag'] or 0 for r in rows):,}")
    return EXIT_OK


# -- tail -----------------------------------------------------------------------------------------------------


def _pull(mq, topic: str, queues: List[int], next_off: Dict[int, int]) -> list:
    """Every message of ``topic`` from ``next_off`` on (advancing it), in commit log order."""
    got = []
    for q in queues:
        off = next_off.setdefault(q, mq.min_offset(topic, q))
        while True:
            r = mq.get_message(topic, q, off, 32)
            if r.status is GetStatus.OFFSET_TOO_SMALL:
                off = r.next_begin_offset
                continue
            got.extend(r.messages)
            if not r.messages and r.status not in (GetStatus.NO_MATCHED_MESSAGE, GetStatus.MESSAGE_WAS_REMOVING):
                break
            off = r.next_begin_offset
        next_off[q] = off
    got.sort(key=lambda m: m.physical_offset)
    return got


def _tail(args) -> int:
    mq = _open(args.store)
    shown = 0
    try:
        existing = mq.topics()
        if args.topic not in existing and not args.follow:
            raise CliError(f"no topic {args.topic!r} in {args.store}")

        def queues() -> List[int]:
            qs = mq.topics().get(args.topic, [])
            return [q for q in qs if args.queue is None or q == args.queue]

        next_off = {q: max(mq.min_offset(args.topic, q), mq.max_offset(args.topic, q) - args.lines)
                    for q in queues()}
        first = _pull(mq, args.topic, list(next_off), next_off)[-args.lines:] if args.lines else []
        for m in first:
            if args.max is not None and shown >= args.max:
                return EXIT_OK
            _show_message(args, m)
            shown += 1
        sys.stdout.flush()
        if not args.follow:
            return EXIT_OK
        while args.max is None or shown < args.max:
            since = mq.progress
            batch = _pull(mq, args.topic, queues(), next_off)
            for m in batch:
                if args.max is not None and shown >= args.max:
                    break
                _show_message(args, m)
                shown += 1
            sys.stdout.flush()
            if not batch:
                mq.wait_for_new_messages(args.interval, since)
                if not mq.stats()["live"]:
                    time.sleep(args.interval)  # a closed store: nothing wakes us, look again now and then
                    mq.close()
                    mq = _open(args.store)
        return EXIT_OK
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: a normal way to stop following
        return EXIT_OK
    finally:
        mq.close()


# -- query ----------------------------------------------------------------------------------------------------


def _query(args) -> int:
    if (args.key is not None or args.time is not None) and args.topic is None:
        raise CliError("--key and --time need --topic", EXIT_USAGE)
    with _open(args.store) as mq:
        topics = [args.topic] if args.topic is not None else sorted(mq.topics())
        if args.key is not None:
            found = mq.query_message(args.topic, args.key, max_num=args.max)
        elif args.uniq_key is not None:
            found = [m for t in topics for m in mq.query_message(t, args.uniq_key, max_num=args.max)
                     if m.uniq_key == args.uniq_key]
        elif args.id is not None:
            try:
                m = mq.look_message_by_id(args.id, args.topic)
            except ValueError as e:
                raise CliError(str(e), EXIT_USAGE) from None
            found = [] if m is None else [m]
        else:
            found = []
            for q in mq.topics().get(args.topic, []):
                if args.queue is not None and q != args.queue:
                    continue
                off = mq.offset_by_time(args.topic, q, args.time)
                r = mq.get_message(args.topic, q, off, 1)
                found.extend(r.messages[:1])
        for m in found:
            _show_message(args, m)
    if not found:
        raise CliError("no message found")
    return EXIT_OK


# -- verify ---------------------------------------------------------------------------------------------------


def _dlq(args) -> int:
    if not args.redrive:
        mq = _open(args.store)
        try:
            msgs = mq.dead_letters(args.group, max_messages=args.max)
        finally:
            mq.close()
        for m in msgs:
            if args.json:
                d = _message_dict(m)
                d["reconsume_times"] = m.reconsume_times
                _emit(d)
            else:
                _say(f"{_message_line(m, args.body_bytes)} topic={m.properties.get('RETRY_TOPIC')!r} "
                     f"reconsume_times={m.reconsume_times}")
        if not msgs:
            print(f"no dead letters for group {args.group!r}", file=sys.stderr)
        return EXIT_OK if msgs else EXIT_FOUND_NOTHING
    # the one command that writes: it attaches as a shared writer (beside a live shared store) or opens a closed one
    try:
        st = localmq.open(args.store, shared=True)
    except StoreLockedError:
        raise CliError(f"{os.path.abspath(args.store)} is held by one live process alone (opened with "
                       "shared=False): re-drive from that process (mq.redrive_dead_letters) or when it has closed",
                       EXIT_BUSY) from None
    with st:
        sent = st.redrive_dead_letters(args.group, queue_id=args.queue, max_messages=args.max)
    if args.json:
        _emit({"group": args.group, "redriven": sent})
    else:
        _say(f"re-drove {sent} dead letter(s) of group {args.group!r}")
    return EXIT_OK


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


def _verify_commit_log(files: StoreFiles, end: int, progress: _Progress, problems: list, notes: list,
                       unknown: Optional[dict] = None, known_end: int = 0) -> int:
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
                found = (not_understood(mf, pos, outcome, limit)
                         if outcome in (RecordStatus.BAD_MAGIC, RecordStatus.BAD_TOPIC) else None)
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
                notes.append(f"commit log offset {at:,}: a torn record at the end of the data ({outcome}; what a "
                             "crash leaves, never dispatched: recovery cuts it)")
                data_ended_at = at
            else:
                problems.append(f"commit log offset {at:,} ({fpath}): {outcome} record" + (
                    " followed by more data" if at >= known_end else "; the rest of this segment is not walked"))
        finally:
            mf.close()
        done += files.segment_size
    return records


def _verify_queues(files: StoreFiles, end: int, live: bool, progress: _Progress, problems: list,
                   notes: list, unknown: dict) -> Tuple[int, int]:
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
                problems.append(f"consume queue {cq.topic}/{cq.queue_id}: {loaded.stop_reason} after queue offset "
                                f"{loaded.max_queue_offset:,} ({cq.path})")
            units = loaded.units
            for j in range(len(units)):
                phys, size = int(units["offset"][j]), int(units["size"][j])
                qoff = loaded.queue_offset_base + j
                if size == CQ_BLANK_UNIT_SIZE or phys < files.min_offset or phys + size > end:
                    if phys + size > end and size != CQ_BLANK_UNIT_SIZE and not live:
                        problems.append(f"consume queue {cq.topic}/{cq.queue_id}@{qoff}: points past the end of "
                                        f"the commit log ({phys:,})")
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
                    ok = (m is not None and m.topic == cq.topic and m.queue_id == cq.queue_id
                          and m.queue_offset == qoff and m.store_size == size)
                    m = None
                except CorruptFrameError:
                    ok = False
                if not ok and phys in unknown:
                    continue  # a record of a format localmq does not know: counted by the commit log walk
                units_checked += 1
                if not ok:
                    problems.append(f"consume queue {cq.topic}/{cq.queue_id}@{qoff}: unit ({phys:,}, {size}) does "
                                    "not point at that message's record")
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
    log_start = read_log_start(files.root)
    if log_start is not None and files.segments and files.min_offset > log_start:
        problems.append(f"commit log segments missing at the start of the log: it starts at {files.min_offset:,}, "
                        f"but localmq's retention moved it to {log_start:,} only (deleted by hand, lost, or by "
                        f"RocketMQ's retention); the next open reports and accepts it")
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
            problems.append(f"index file {f.path}: {e}")
            continue
        try:
            wrong, sampled = _verify_index_items(files, idx, end)
        finally:
            idx.close()
        if wrong:
            problems.append(f"index file {f.path}: {wrong} of {sampled} sampled items do not hold the key hash of the "
                            f"record they point at, read with {idx.hash_slot_num} slots and {idx.index_num} items "
                            f"(a file of another geometry, or damaged): queries would miss keys. It is derived "
                            f"data: delete it and the next open indexes its records again")
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
        notes.append(f"{lost} ConsumeQueue unit(s) mark messages lost to damage that recovery quarantined "
                     f"(recovery/commitlog-gap-*)")
    unknown_rows = [{"offset": off, "magic": f"0x{magic:08X}", "size": size, "what": what}
                    for off, (magic, size, what) in unknown.items()]
    summary = {"store": files.root, "ok": not problems and not unknown, "problems": problems, "notes": notes,
               "unknown_records": unknown_rows,
               "segments": len(files.segments), "records": records, "consume_queue_units": units,
               "consume_queues": len(files.queues()), "index_files": len(index_files), "config_files": len(cfg)}
    if args.json:
        _emit(summary)
    else:
        for p in problems:
            _say(f"DAMAGE: {p}")
        for n in notes:
            _say(f"note: {n}")
        for u in unknown_rows:
            _say(f"UNKNOWN FORMAT: commit log offset {u['offset']:,}: {u['what']} ({u['size']} bytes, magic "
                 f"{u['magic']}; not damage: a writable open refuses the store)")
        state = "damaged" if problems else "unknown format" if unknown else "ok"
        _say(f"{state}: {records:,} records in {len(files.segments)} segment(s), "
             f"{units:,} ConsumeQueue units in {summary['consume_queues']} queue(s), {len(index_files)} index "
             f"file(s), {len(cfg)} config file(s) checked; {len(problems)} problem(s)")
    return EXIT_DAMAGE if problems else EXIT_UNKNOWN_FORMAT if unknown else EXIT_OK


# -- dump -----------------------------------------------------------------------------------------------------


def _dump_start(args, files: Optional[StoreFiles]) -> int:
    """The commit log offset to start at: --start, or the unit of --offset / --since in --topic/--queue."""
    if args.start is not None:
        return args.start
    if files is None or args.topic is None or args.queue is None or (args.offset is None and args.since is None):
        return 0
    cq = ConsumeQueueFiles(args.topic, args.queue, os.path.join(files.consumequeue, args.topic, str(args.queue)))
    hi = cq.max_offset()
    lo = cq.min_offset(files.min_offset, hi)
    if args.offset is not None:
        lo = max(lo, args.offset)
    if args.since is not None:
        lo = cq.offset_for_time(files, args.since, lo, hi)
    u = cq.unit(lo) if lo < hi else None
    return files.walk_end() if u is None else u[0]


def _check_start(files: StoreFiles, start: int) -> None:
    seg = files.segment_of(start)
    if seg is None:
        return
    mf = files.map_segment(*seg)
    try:
        status, _ = scan_record(mf, start - seg[0], False)
    finally:
        mf.close()
    if status not in (RecordStatus.OK, RecordStatus.BLANK, RecordStatus.END, RecordStatus.GAP):
        raise CliError(f"no record starts at commit log offset {start} ({status})", EXIT_USAGE)


def _dump(args) -> int:
    path = args.path
    files = None
    if os.path.isdir(os.path.join(path, "commitlog")):
        files = _files(path)
        path = files.commitlog
    start = _dump_start(args, files)
    if files is not None and args.start is not None:
        _check_start(files, start)
    try:
        reader = read_commitlog(path, check_crc=not args.no_crc, start=start)
    except NotAStoreError as e:
        raise CliError(f"{args.path}: {e.strerror} (give a store directory, its commitlog directory or a "
                       "segment)") from None
    shown = 0
    try:
        with reader:
            for m in reader:
                if ((args.topic is not None and m.topic != args.topic)
                        or (args.queue is not None and m.queue_id != args.queue)
                        or (args.offset is not None and m.queue_offset < args.offset)
                        or (args.since is not None and m.store_timestamp < args.since)
                        or (args.until is not None and m.store_timestamp > args.until)):
                    continue
                if args.limit and shown >= args.limit:
                    break
                _show_message(args, m)
                shown += 1
    except CorruptFrameError as e:
        sys.stdout.flush()
        raise CliError(f"damaged record: {e}", EXIT_DAMAGE) from None
    stop = "limit" if args.limit and shown >= args.limit else reader.stop_reason
    if not args.json:
        _say(f"{shown} record(s) shown; {reader.messages_read} read from {reader.segments_read} segment(s) "
             f"starting at offset {start:,}; stopped: {stop} at {reader.stop_offset}")
    return EXIT_OK


# -- demo -----------------------------------------------------------------------------------------------------


def _demo(args) -> int:
    tmp = None
    path = args.path
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="localmq-demo-")
        path = tmp.name
    try:
        return _run_demo(args, path)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _demo_bodies(args, start: int, stop: int) -> Iterator[Tuple[int, bytes]]:
    pad = b"x" * args.body_size
    for i in range(start, stop):
        head = b"%d|" % i
        yield i, head + pad[: max(0, args.body_size - len(head))]


def _run_demo(args, path: str) -> int:
    topics = [f"demo-topic-{i}" for i in range(args.topics)]
    n, nq, nt = args.messages, args.queues, len(topics)
    if not args.json:
        print(f"localmq {localmq.__version__} demo: {n:,} messages of {args.body_size} B over {nt} topics x {nq} "
              f"queues into {path}")
    digests: Dict[Tuple[str, int], Any] = {}
    put_s = 0.0
    body_bytes = 0
    with localmq.open(path) as st:
        # a store kept from an earlier run (--path) already holds messages: this run reads from where it starts
        first = {(t, q): st.max_offset(t, q) for t in topics for q in range(nq)}
        put = st.put
        for chunk in range(0, n, 10_000):
            batch = [(topics[i % nt], (i // nt) % nq, body, "even" if i % 2 == 0 else "odd")
                     for i, body in _demo_bodies(args, chunk, min(n, chunk + 10_000))]
            t0 = time.perf_counter()
            for t, qid, body, tag in batch:
                r = put(t, body, queue_id=qid, tags=tag)
                if r.status is not localmq.PutStatus.PUT_OK:
                    print(f"put failed: {r.status.name}", file=sys.stderr)
                    return 1
            put_s += time.perf_counter() - t0
            for t, qid, body, _ in batch:
                digests.setdefault((t, qid), hashlib.sha256()).update(body)
                body_bytes += len(body)
        t0 = time.perf_counter()
        st.wait_for_dispatch()
        dispatch_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        read = bad = 0
        for (t, qid), want in sorted(digests.items()):
            h = hashlib.sha256()
            off = first[(t, qid)]
            while True:
                g = st.get_message(t, qid, off, 32)
                if g.status is GetStatus.OFFSET_OVERFLOW_ONE:
                    break
                if g.status is not GetStatus.FOUND:
                    print(f"{t}/{qid} at {off}: {g.status.name}", file=sys.stderr)
                    return 1
                for m in g.messages:
                    h.update(m.body)
                read += len(g.messages)
                off = g.next_begin_offset
            if h.digest() != want.digest():
                bad += 1
                print(f"{t}/{qid}: checksum mismatch", file=sys.stderr)
        read_s = time.perf_counter() - t1
        stats = st.stats()
    mb = body_bytes / 1e6
    ok = read == n and bad == 0
    if args.json:
        _emit({"store": path, "messages": n, "put_seconds": put_s, "dispatch_seconds": dispatch_s, "read": read,
               "read_seconds": read_s, "body_bytes": body_bytes, "segments": stats["segments"], "verified": ok})
        return 0 if ok else 1
    print(f"put     {n:>12,} msgs in {put_s:6.2f} s  {n / put_s:>12,.0f} msgs/s  {mb / put_s:8.1f} MB/s "
          "(the put calls alone, one per message from a Python loop; bodies built and checksummed outside the "
          "timing; dispatch not included)")
    print(f"dispatch caught up {dispatch_s:.2f} s after the last put")
    print(f"read    {read:>12,} msgs in {read_s:6.2f} s  {read / read_s:>12,.0f} msgs/s  {mb / read_s:8.1f} MB/s "
          "(get_message batches of 32, sha256 of every body included)")
    print(f"commit log {stats['commit_log_max_offset']:,} bytes in {stats['segments']} segment(s); "
          f"{stats['consume_queues']} consume queues")
    print("verified: all messages read back in order with matching checksums" if ok else "VERIFICATION FAILED")
    return 0 if ok else 1


# -- the parser -----------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="localmq", description=__doc__,
        epilog="Every command but `dlq --redrive` opens the store read-only (no lock, no write): beside a live "
               "writer that opened it with shared=True, or a closed store. Exit codes: 0 ok, 1 damage found or "
               "nothing found, 2 usage error, 3 the store is held by one live process alone (dump and verify still "
               "read its files), 4 (verify) no damage but records of a format localmq does not know.")
    p.add_argument("--version", action="version", version=f"localmq {localmq.__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", help="one JSON document (JSON lines for messages)")

    def command(name: str, func, help: str, store: bool = True) -> argparse.ArgumentParser:
        # the list of commands %-formats its help text, a command's own page shows its description as written
        c = sub.add_parser(name, parents=[common], help=help, description=help.replace("%%", "%"))
        if store:
            c.add_argument("store", help="the store directory")
        c.set_defaults(func=func)
        return c

    def body_bytes(c: argparse.ArgumentParser) -> None:
        c.add_argument("--body-bytes", type=_int_at_least(0), default=60, metavar="N",
                       help="body bytes shown per message in text output (default 60)")

    command("stats", _stats, "sizes, message counts, offsets, flush and dispatch progress")
    c = command("topics", _topics, "every queue's min and max offsets")
    c.add_argument("--topic", help="only this topic")
    c = command("lag", _lag, "consumer lag per queue from the durable commits (config/consumerOffset.json)")
    c.add_argument("--group", "-g", help="the consumer group (default: every group)")
    c = command("tail", _tail, "the last messages of a topic, in commit log order; -f follows new ones")
    c.add_argument("topic", help="the topic")
    c.add_argument("-f", "--follow", action="store_true", help="wait for new messages until Ctrl-C / SIGTERM")
    c.add_argument("-n", "--lines", type=_int_at_least(0), default=10, help="messages shown first (default 10)")
    c.add_argument("--queue", type=_int_at_least(0), help="only this queue id")
    c.add_argument("--max", type=_int_at_least(1), help="stop after N messages")
    c.add_argument("--interval", type=float, default=0.5, help="seconds between looks when idle (default 0.5)")
    body_bytes(c)
    c = command("query", _query, "find messages by key, message id, UNIQ_KEY or store time")
    how = c.add_mutually_exclusive_group(required=True)
    how.add_argument("--key", "-k", help="a KEYS entry (needs --topic)")
    how.add_argument("--id", help="a message id (32 or 56 hex digits)")
    how.add_argument("--uniq-key", "-u", help="a client UNIQ_KEY")
    how.add_argument("--time", "-t", type=_time_ms, help="the first message stored at or after this time per "
                     "queue (ms since the epoch or ISO 8601; needs --topic)")
    c.add_argument("--topic", help="the topic (with --key and --time)")
    c.add_argument("--queue", type=_int_at_least(0), help="with --time: only this queue id")
    c.add_argument("--max", type=_int_at_least(1), default=32, help="most messages returned by --key (default 32)")
    body_bytes(c)
    c = command("dlq", _dlq, "the dead letters of a consumer group (topic %%DLQ%%<group>); --redrive sends the ones "
                "not re-driven before to their topics again")
    c.add_argument("group", help="the consumer group whose dead letters are shown")
    c.add_argument("--redrive", action="store_true", help="send them again (the one command that writes: it opens "
                   "the store with shared=True, beside a live shared store or on a closed one)")
    c.add_argument("--queue", type=_int_at_least(0), default=0, help="with --redrive: the queue id they go to")
    c.add_argument("--max", type=_int_at_least(1), help="at most N messages")
    body_bytes(c)
    c = command("verify", _verify, "walk every file: record CRCs and structure, ConsumeQueue units, index, "
                "checkpoint and config files; exit code 1 on damage, 4 on records of a format localmq "
                "does not know (not damage)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar (none is shown off a terminal)")
    c = command("dump", _dump, "print commit log records (a localmq or RocketMQ store, its commitlog directory or a "
                "segment file)", store=False)
    c.add_argument("path", help="a store, its commitlog directory or one segment file")
    c.add_argument("--topic", help="only this topic")
    c.add_argument("--queue", type=_int_at_least(0), help="only this queue id (with --topic)")
    c.add_argument("--offset", type=_int_at_least(0),
                   help="queue offsets from this one (with --topic and --queue it starts there directly)")
    c.add_argument("--start", type=_int_at_least(0), help="the commit log offset of the first record to read")
    c.add_argument("--since", type=_time_ms, help="store time from (ms since the epoch or ISO 8601)")
    c.add_argument("--until", type=_time_ms, help="store time up to (ms since the epoch or ISO 8601)")
    c.add_argument("--limit", type=_int_at_least(0), default=20, help="records shown, then stop (default 20; 0: all)")
    c.add_argument("--no-crc", action="store_true", help="do not check body CRCs")
    body_bytes(c)
    d = command("demo", _demo, "write, read back and verify messages (a throughput demo)", store=False)
    d.add_argument("--path", help="store directory (default: a temporary directory, removed afterwards)")
    d.add_argument("--messages", type=_int_at_least(1), default=1_000_000, help="messages written (default 1,000,000)")
    d.add_argument("--topics", type=_int_at_least(1), default=4, help="topics they are spread over (default 4)")
    d.add_argument("--queues", type=_int_at_least(1), default=4, help="queue ids per topic (default 4)")
    d.add_argument("--body-size", type=_int_at_least(0), default=100, help="bytes per body (default 100)")
    return p


def _stop_on_sigterm(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: Optional[List[str]] = None) -> int:
    """Run the ``localmq`` command; returns its exit code.

    While a command runs, SIGTERM stops it as Ctrl-C does (``tail -f`` ends with exit 0). The handler is installed
    only from the main thread and the previous one is put back when ``main`` returns, so a program (or a test run)
    that calls ``main()`` keeps its own SIGTERM behaviour afterwards, and so do processes it forks later.
    """
    args = _parser().parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        return _run(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _run(args: argparse.Namespace) -> int:
    try:
        return args.func(args)
    except CliError as e:
        sys.stdout.flush()
        print(f"localmq {args.cmd}: {e}", file=sys.stderr)
        return e.code
    except LocalMQError as e:
        print(f"localmq {args.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_DAMAGE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader went away (`| head`): no traceback, and no second error when Python flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
