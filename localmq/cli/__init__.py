"""The ``localmq`` command: look inside a store (stats, topics, lag, tail, query, dlq, verify, dump); run the demo."""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import tempfile
import threading
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

import localmq
from localmq._record import scan_record
from localmq.cli.common import (
    EXIT_BUSY,
    EXIT_DAMAGE,
    EXIT_FOUND_NOTHING,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    _emit,
    _files,
    _int_at_least,
    _iso,
    _lock_state,
    _message_dict,
    _message_line,
    _open,
    _queue_offsets,
    _say,
    _show_message,
    _time_ms,
)
from localmq.cli.verify import _verify
from localmq.errors import CorruptFrameError, CorruptStoreError, LocalMQError, NotAStoreError, StoreLockedError
from localmq.layout import (
    CONFIG_DIR,
    CQ_BLANK_UNIT_SIZE,
    CTL_S_FLUSHED,
    CTL_S_HOUSEKEEPER,
    CTL_S_INDEXED,
    CTL_S_PUTS,
    CTL_S_REPUT,
    CTL_S_WPOS,
)
from localmq.status import GetStatus, RecordStatus
from localmq.store.checkpoint import read_checkpoint
from localmq.store.config_json import read_offset_table
from localmq.store.control_view import ControlView
from localmq.store.files import ConsumeQueueFiles, StoreFiles
from localmq.store.readers import read_commitlog

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
        checkpoint: Optional[Dict[str, int]] = {
            "physic_msg_timestamp": cp.physic_msg_timestamp,
            "logics_msg_timestamp": cp.logics_msg_timestamp,
            "index_msg_timestamp": cp.index_msg_timestamp,
        }
    except (NotAStoreError, CorruptStoreError):
        checkpoint = None
    live: Optional[Dict[str, int]] = None
    view = ControlView.open(files.root)
    if view is not None:
        try:
            live = {
                "committed_end": view.load(CTL_S_WPOS),
                "dispatched_end": view.load(CTL_S_REPUT),
                "indexed_end": view.load(CTL_S_INDEXED),
                "sync_flushed_end": view.load(CTL_S_FLUSHED),
                "puts": view.load(CTL_S_PUTS),
                "housekeeper_pid": view.load(CTL_S_HOUSEKEEPER),
            }
        finally:
            view.close()
        dispatched = live["dispatched_end"]
        end = max(end, live["committed_end"])  # read after the queues: the log's end as of now
    out = {
        "store": files.root,
        "state": held,
        "clean_exit": not os.path.exists(files.abort) if held == "closed" else None,
        "commit_log": {
            "min_offset": files.min_offset,
            "end": end,
            "bytes": end - files.min_offset,
            "segments": len(files.segments),
            "segment_size": files.segment_size,
        },
        "messages": sum(mx - mn for _, _, mn, mx in queues),
        "topics": len({t for t, *_ in queues}),
        "queues": len(queues),
        "dispatch": {"dispatched_end": dispatched, "behind_bytes": max(0, end - dispatched)},
        "checkpoint": checkpoint,
        "live": live,
        "index_files": len(files.index_files()),
        "disk": {"apparent_bytes": apparent, "allocated_bytes": allocated},
    }
    if args.json:
        _emit(out)
        return EXIT_OK
    cl = out["commit_log"]
    exit_note = (
        ""
        if held != "closed"
        else ", last exit clean"
        if out["clean_exit"]
        else ", last exit NOT clean: abort present, the next writer recovers"
    )
    _say(f"store        {files.root} ({held}{exit_note})")
    _say(
        f"commit log   offsets {cl['min_offset']:,} .. {cl['end']:,} ({cl['bytes']:,} bytes) in "
        f"{cl['segments']} segment(s) of {cl['segment_size']:,} bytes"
    )
    _say(f"messages     {out['messages']:,} in {out['queues']} queue(s) of {out['topics']} topic(s)")
    _say(
        f"dispatch     ConsumeQueues reach offset {dispatched:,} ({out['dispatch']['behind_bytes']:,} bytes "
        "behind the log end)"
    )
    if checkpoint is not None:
        _say(
            f"flushed      checkpoint: commit log to {_iso(checkpoint['physic_msg_timestamp'])}, consume queues to "
            f"{_iso(checkpoint['logics_msg_timestamp'])}, index to {_iso(checkpoint['index_msg_timestamp'])}"
        )
    if live is not None:
        _say(
            f"live         committed end {live['committed_end']:,}, dispatched {live['dispatched_end']:,}, "
            f"indexed {live['indexed_end']:,}, {live['puts']:,} puts since the first opener, housekeeper pid "
            f"{live['housekeeper_pid']}"
            + (f", SYNC_FLUSH flushed {live['sync_flushed_end']:,}" if live["sync_flushed_end"] else "")
        )
    _say(f"index        {out['index_files']} file(s)")
    _say(f"disk         {allocated:,} bytes allocated ({apparent:,} apparent)")
    return EXIT_OK


# -- topics / lag ---------------------------------------------------------------------------------------------


def _topics(args) -> int:
    with _open(args.store) as mq:
        rows = [
            {"topic": t, "queue_id": q, "min_offset": mn, "max_offset": mx, "messages": mx - mn}
            for t, q, mn, mx in _queue_offsets(mq)
            if args.topic is None or t == args.topic
        ]
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
                rows.append(
                    {
                        "group": group,
                        "topic": topic,
                        "queue_id": q,
                        "committed": c,
                        "max_offset": mx,
                        "lag": None if c is None else max(0, mx - max(c, mn)),
                    }
                )
    if not rows:
        raise CliError(
            f"no committed offsets for group {args.group!r} in config/consumerOffset.json"
            if args.group
            else "no committed offsets in config/consumerOffset.json"
        )
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

        next_off = {q: max(mq.min_offset(args.topic, q), mq.max_offset(args.topic, q) - args.lines) for q in queues()}
        first = _pull(mq, args.topic, list(next_off), next_off)[-args.lines :] if args.lines else []
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
            found = [
                m
                for t in topics
                for m in mq.query_message(t, args.uniq_key, max_num=args.max)
                if m.uniq_key == args.uniq_key
            ]
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
                _say(
                    f"{_message_line(m, args.body_bytes)} topic={m.properties.get('RETRY_TOPIC')!r} "
                    f"reconsume_times={m.reconsume_times}"
                )
        if not msgs:
            print(f"no dead letters for group {args.group!r}", file=sys.stderr)
        return EXIT_OK if msgs else EXIT_FOUND_NOTHING
    # the one command that writes: it attaches as a shared writer (beside a live shared store) or opens a closed one
    try:
        st = localmq.open(args.store, shared=True)
    except StoreLockedError:
        raise CliError(
            f"{os.path.abspath(args.store)} is held by one live process alone (opened with "
            "shared=False): re-drive from that process (mq.redrive_dead_letters) or when it has closed",
            EXIT_BUSY,
        ) from None
    with st:
        sent = st.redrive_dead_letters(args.group, queue_id=args.queue, max_messages=args.max)
    if args.json:
        _emit({"group": args.group, "redriven": sent})
    else:
        _say(f"re-drove {sent} dead letter(s) of group {args.group!r}")
    return EXIT_OK


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
        raise CliError(
            f"{args.path}: {e.strerror} (give a store directory, its commitlog directory or a segment)"
        ) from None
    shown = 0
    try:
        with reader:
            for m in reader:
                if (
                    (args.topic is not None and m.topic != args.topic)
                    or (args.queue is not None and m.queue_id != args.queue)
                    or (args.offset is not None and m.queue_offset < args.offset)
                    or (args.since is not None and m.store_timestamp < args.since)
                    or (args.until is not None and m.store_timestamp > args.until)
                ):
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
        _say(
            f"{shown} record(s) shown; {reader.messages_read} read from {reader.segments_read} segment(s) "
            f"starting at offset {start:,}; stopped: {stop} at {reader.stop_offset}"
        )
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
        print(
            f"localmq {localmq.__version__} demo: {n:,} messages of {args.body_size} B over {nt} topics x {nq} "
            f"queues into {path}"
        )
    digests: Dict[Tuple[str, int], Any] = {}
    put_s = 0.0
    body_bytes = 0
    with localmq.open(path) as st:
        # a store kept from an earlier run (--path) already holds messages: this run reads from where it starts
        first = {(t, q): st.max_offset(t, q) for t in topics for q in range(nq)}
        put = st.put
        for chunk in range(0, n, 10_000):
            batch = [
                (topics[i % nt], (i // nt) % nq, body, "even" if i % 2 == 0 else "odd")
                for i, body in _demo_bodies(args, chunk, min(n, chunk + 10_000))
            ]
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
        _emit(
            {
                "store": path,
                "messages": n,
                "put_seconds": put_s,
                "dispatch_seconds": dispatch_s,
                "read": read,
                "read_seconds": read_s,
                "body_bytes": body_bytes,
                "segments": stats["segments"],
                "verified": ok,
            }
        )
        return 0 if ok else 1
    print(
        f"put     {n:>12,} msgs in {put_s:6.2f} s  {n / put_s:>12,.0f} msgs/s  {mb / put_s:8.1f} MB/s "
        "(the put calls alone, one per message from a Python loop; bodies built and checksummed outside the "
        "timing; dispatch not included)"
    )
    print(f"dispatch caught up {dispatch_s:.2f} s after the last put")
    print(
        f"read    {read:>12,} msgs in {read_s:6.2f} s  {read / read_s:>12,.0f} msgs/s  {mb / read_s:8.1f} MB/s "
        "(get_message batches of 32, sha256 of every body included)"
    )
    print(
        f"commit log {stats['commit_log_max_offset']:,} bytes in {stats['segments']} segment(s); "
        f"{stats['consume_queues']} consume queues"
    )
    print("verified: all messages read back in order with matching checksums" if ok else "VERIFICATION FAILED")
    return 0 if ok else 1


# -- the parser -----------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="localmq",
        description=__doc__,
        epilog="Every command but `dlq --redrive` opens the store read-only (no lock, no write): beside a live "
        "writer that opened it with shared=True, or a closed store. Exit codes: 0 ok, 1 damage found or "
        "nothing found, 2 usage error, 3 the store is held by one live process alone (dump and verify still "
        "read its files), 4 (verify) no damage but records of a format localmq does not know.",
    )
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
        c.add_argument(
            "--body-bytes",
            type=_int_at_least(0),
            default=60,
            metavar="N",
            help="body bytes shown per message in text output (default 60)",
        )

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
    how.add_argument(
        "--time",
        "-t",
        type=_time_ms,
        help="the first message stored at or after this time per queue (ms since the epoch or ISO 8601; needs --topic)",
    )
    c.add_argument("--topic", help="the topic (with --key and --time)")
    c.add_argument("--queue", type=_int_at_least(0), help="with --time: only this queue id")
    c.add_argument("--max", type=_int_at_least(1), default=32, help="most messages returned by --key (default 32)")
    body_bytes(c)
    c = command(
        "dlq",
        _dlq,
        "the dead letters of a consumer group (topic %%DLQ%%<group>); --redrive sends the ones "
        "not re-driven before to their topics again",
    )
    c.add_argument("group", help="the consumer group whose dead letters are shown")
    c.add_argument(
        "--redrive",
        action="store_true",
        help="send them again (the one command that writes: it opens "
        "the store with shared=True, beside a live shared store or on a closed one)",
    )
    c.add_argument("--queue", type=_int_at_least(0), default=0, help="with --redrive: the queue id they go to")
    c.add_argument("--max", type=_int_at_least(1), help="at most N messages")
    body_bytes(c)
    c = command(
        "verify",
        _verify,
        "walk every file: record CRCs and structure, ConsumeQueue units, index, "
        "checkpoint and config files; exit code 1 on damage, 4 on records of a format localmq "
        "does not know (not damage)",
    )
    c.add_argument("--no-progress", action="store_true", help="no progress bar (none is shown off a terminal)")
    c = command(
        "dump",
        _dump,
        "print commit log records (a localmq or RocketMQ store, its commitlog directory or a segment file)",
        store=False,
    )
    c.add_argument("path", help="a store, its commitlog directory or one segment file")
    c.add_argument("--topic", help="only this topic")
    c.add_argument("--queue", type=_int_at_least(0), help="only this queue id (with --topic)")
    c.add_argument(
        "--offset",
        type=_int_at_least(0),
        help="queue offsets from this one (with --topic and --queue it starts there directly)",
    )
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
