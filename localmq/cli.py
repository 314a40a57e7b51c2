"""The ``localmq`` command: ``demo`` (write, read back and verify a million messages) and ``dump``."""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time

import localmq
from localmq.status import GetStatus


def _demo(args) -> int:
    tmp = None
    path = args.path
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="localmq-demo-")
        path = tmp.name
    topics = [f"demo-topic-{i}" for i in range(args.topics)]
    n, q = args.messages, args.queues
    print(f"localmq {localmq.__version__} demo: {n:,} messages of {args.body_size} B over {len(topics)} topics x "
          f"{q} queues into {path}")
    pad = os.urandom(max(0, args.body_size))
    digests = {}
    t0 = time.perf_counter()
    with localmq.open(path) as st:
        put = st.put
        for i in range(n):
            t = topics[i % len(topics)]
            qid = (i // len(topics)) % q
            head = b"%d|" % i
            body = head + pad[: max(0, args.body_size - len(head))]
            r = put(t, body, queue_id=qid, tags="even" if i % 2 == 0 else "odd")
            if r.status is not localmq.PutStatus.PUT_OK:
                print(f"put {i} failed: {r.status.name}", file=sys.stderr)
                return 1
            digests.setdefault((t, qid), hashlib.sha256()).update(body)
        st.wait_for_dispatch()
        t1 = time.perf_counter()
        read = 0
        bad = 0
        for (t, qid), want in sorted(digests.items()):
            h = hashlib.sha256()
            off = 0
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
        t2 = time.perf_counter()
        stats = st.stats()
    body_mb = n * args.body_size / 1e6
    print(f"wrote   {n:>12,} msgs in {t1 - t0:6.2f} s  {n / (t1 - t0):>12,.0f} msgs/s  "
          f"{body_mb / (t1 - t0):8.1f} MB/s (dispatch included)")
    print(f"read    {read:>12,} msgs in {t2 - t1:6.2f} s  {read / (t2 - t1):>12,.0f} msgs/s  "
          f"{body_mb / (t2 - t1):8.1f} MB/s (get_message batches of 32)")
    print(f"commit log {stats['commit_log_max_offset']:,} bytes in {stats['segments']} segment(s); "
          f"{stats['consume_queues']} consume queues")
    ok = read == n and bad == 0
    print("verified: all messages read back in order with matching checksums" if ok else "VERIFICATION FAILED")
    if tmp is not None:
        tmp.cleanup()
    return 0 if ok else 1


def _dump(args) -> int:
    reader = localmq.read_commitlog(args.path, check_crc=not args.no_crc)
    shown = 0
    for m in reader:
        if shown < args.limit:
            print(f"{m.physical_offset:>14} {m.topic}/{m.queue_id}@{m.queue_offset} size={m.store_size} "
                  f"tags={m.tags!r} keys={list(m.keys)} stored={m.store_timestamp} body={bytes(m.body[:40])!r}")
        shown += 1
    print(f"{reader.messages_read} records in {reader.segments_read} segment(s); stopped: {reader.stop_reason} at "
          f"{reader.stop_offset}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="localmq", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="write, read back and verify messages on the default embedded store")
    d.add_argument("--path", help="store directory (default: a temporary directory, removed afterwards)")
    d.add_argument("--messages", type=int, default=1_000_000)
    d.add_argument("--topics", type=int, default=4)
    d.add_argument("--queues", type=int, default=4)
    d.add_argument("--body-size", type=int, default=100)
    d.set_defaults(func=_demo)
    u = sub.add_parser("dump", help="print the records of CommitLog segments (localmq's or RocketMQ's)")
    u.add_argument("path")
    u.add_argument("--limit", type=int, default=20)
    u.add_argument("--no-crc", action="store_true")
    u.set_defaults(func=_dump)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
