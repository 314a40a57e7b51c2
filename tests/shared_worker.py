"""A process that opens a shared store and plays one role in tests/test_shared.py (run as a script).

Every acknowledged put is reported on stdout as ``ack <queue id> <queue offset> <sha1 of body>`` (flushed at once),
so that a test that kills this process knows exactly what was acknowledged.
"""

import hashlib
import json
import os
import sys
import time

import localmq

KW = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 4096)


def say(*parts):
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


def produce(q, name, n, queues, body_size, keys=False):
    for i in range(n):
        body = (f"{name}-{i:08d}-".encode() * (body_size // 12 + 1))[: max(body_size, 16)]
        qid = i % queues
        r = q.put("T", body, queue_id=qid, keys=f"{name}-{i}" if keys else None)
        if not r.ok:
            say("fail", getattr(r.status, "name", r.status))
            continue
        say("ack", qid, r.queue_offset, hashlib.sha1(body).hexdigest())


def consume(q, total, queues, timeout):
    """Read every queue from offset 0 until ``total`` messages were read; print one line per message."""
    offs = [0] * queues
    deadline = time.monotonic() + timeout
    n = 0
    while n < total and time.monotonic() < deadline:
        since = q.progress
        got = 0
        for qid in range(queues):
            r = q.get_message("T", qid, offs[qid], 64)
            for m in r.messages:
                say("msg", qid, m.queue_offset, hashlib.sha1(bytes(m.body)).hexdigest())
            offs[qid] += len(r.messages)
            got += len(r.messages)
        n += got
        if not got:
            q.wait_for_new_messages(0.5, since)
    say("done", n)


def group_consume(q, group, idle_s, retention_ms, first_wait_s=None, total=None):
    """A member of ``group``: poll until nothing came for ``idle_s`` seconds (before the first message: for
    ``first_wait_s``, default ``idle_s``), commit durably after each batch, close. With ``total``: until that many
    messages came (or nothing for ``first_wait_s``), so that a slow machine cannot end it early. The quiet time is
    counted from the end of the last commit: a durable commit (the log's flush, the offset file's fsync) may take
    longer than ``idle_s`` on a loaded machine, and is not time in which nothing came."""
    c = q.create_consumer(group, ["T"], consumer_retention_ms=retention_ms)
    say("member")
    quiet_since = time.monotonic()
    wait_s = idle_s if first_wait_s is None else first_wait_s
    n = 0
    while time.monotonic() - quiet_since < wait_s and (total is None or n < total):
        batch = c.poll_batch(32, timeout=0.2)
        for m in batch:
            say("msg", m.queue_id, m.queue_offset, hashlib.sha1(bytes(m.body)).hexdigest())
        n += len(batch)
        if batch:
            c.commit(durable=True)
            quiet_since = time.monotonic()
            if total is None:
                wait_s = idle_s
    c.close()
    say("done", n)


def main():
    role, path = sys.argv[1], sys.argv[2]
    args = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    kw = dict(KW, **args.get("config", {}))
    q = localmq.open(path, shared=args.get("shared", True), **kw)
    say("open", os.getpid(), int(getattr(q, "housekeeper", True)))
    if role == "produce":
        produce(q, args["name"], args["n"], args.get("queues", 4), args.get("body", 100), args.get("keys", False))
    elif role == "produce_forever":
        produce(q, args["name"], 1 << 40, args.get("queues", 4), args.get("body", 100))
    elif role == "consume":
        consume(q, args["total"], args.get("queues", 4), args.get("timeout", 60))
    elif role == "group":
        group_consume(
            q,
            args["group"],
            args.get("idle", 2.0),
            args.get("retention_ms", 30000),
            args.get("first_wait"),
            args.get("total"),
        )
    elif role == "idle":
        sys.stdin.readline()  # until the test closes our stdin
    if args.get("exit_without_close"):
        os._exit(0)
    q.close()
    say("closed")


if __name__ == "__main__":
    main()
