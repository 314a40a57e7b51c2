"""The worker of tests/test_fault_sweep.py: a small store workload run under injected I/O errors on a powerfs mount.

    python tests/fault_sweep_worker.py MOUNTPOINT

It imports localmq once, then reads jobs from stdin (one JSON object a line) and answers each with one JSON line on
stdout. Each job forks two children, one after the other, so that a job costs a fork and not an interpreter start:

* the workload child arms the fault (``fail K ERRNO KIND`` on the mount's control file: the K-th operation of that
  kind from now fails), opens a store in a fresh directory, puts (keys on some, so that the index is written;
  Producer.send and st.put; a batch), consumes and commits, closes, and reports every outcome of every call;
* then the fault is disarmed and the verify child opens the same store (no salvage) and checks it against those
  outcomes: every acknowledged message present and exact (a CRC-32 in each body), nothing else but messages whose
  put failed, each queue's offsets dense, the durable commit kept, new puts taken, a clean close.

A child that dies of a signal, or outlives its timeout (then SIGKILLed), is reported as such; this process never
opens a store itself, so it cannot be taken down by one. Nothing here asserts: the test judges the reports.
"""

import json
import logging
import os
import select
import shutil
import signal
import sys
import time
import traceback
import zlib

import localmq
from localmq import LocalMQError, PutStatus, SendError

CTL = ".powerfs"
KINDS = (
    "write",
    "fsync",
    "fallocate",
    "truncate",
    "create",
    "mknod",
    "mkdir",
    "unlink",
    "rmdir",
    "rename",
    "link",
    "symlink",
    "fsyncdir",
)

TOPICS = ("t0", "t1", "t2")
QUEUES = 2
MESSAGES = 36  # about 2 KiB each: the 64 KiB segments roll
GROUP = "g"


def config(mode):
    return dict(
        flush_disk_type=mode,
        mapped_file_size_commit_log=64 << 10,
        mapped_file_size_consume_queue=20 * 8,  # 8 units a file: the ConsumeQueues roll too
        max_hash_slot_num=256 * 16,
        max_index_num=256 * 32,  # first index file: 16 slots, 32 items (rolls)
        sync_flush_timeout=2000,
        flush_consumer_offset_interval=60_000,
        clean_file_forcibly_enable=False,
    )


def body(i):
    b = b"msg%06d:" % i + bytes([i % 251]) * (1900 + (i * 37) % 300)
    return b + zlib.crc32(b).to_bytes(4, "big")


def body_id(b):
    """The message number of a body, or None when its CRC does not match."""
    b = bytes(b)
    if len(b) < 14 or zlib.crc32(b[:-4]).to_bytes(4, "big") != b[-4:]:
        return None
    return int(b[3:9])


def ctl(mnt, line):
    fd = os.open(os.path.join(mnt, CTL), os.O_WRONLY)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def counters(mnt):
    with open(os.path.join(mnt, CTL), "rb", buffering=0) as f:
        text = f.read(65536).decode()
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def describe(e):
    """An exception as the report records it."""
    chain = []
    c = e.__cause__ or e.__context__
    while c is not None and len(chain) < 3:
        chain.append(f"{type(c).__name__}: {c}")
        c = c.__cause__ or c.__context__
    return {
        "type": type(e).__name__,
        "module": type(e).__module__,
        "localmq": isinstance(e, LocalMQError),
        "send_error": isinstance(e, SendError),
        "oserror": isinstance(e, OSError),
        "errno": getattr(e, "errno", None),
        "filename": getattr(e, "filename", None),
        "msg": str(e)[:600],
        "cause": chain,
        "where": "".join(traceback.format_tb(e.__traceback__)[-2:])[-800:],
    }


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.records = []

    def emit(self, record):
        if len(self.records) < 40:
            self.records.append(f"{record.levelname} {record.name}: {record.getMessage()}"[:400])


# -- the workload ----------------------------------------------------------------------------------------------------


def workload(mnt, root, mode, fault, out):
    """Runs in the workload child; appends events to ``out`` (a list) as it goes, and the caller prints them."""
    handler = _Collect()
    logging.getLogger("localmq").addHandler(handler)
    ev = out.append
    before = counters(mnt)
    if fault:
        ctl(mnt, f"fail {fault['k']} {fault['errno']} {fault['kind']}")

    def call(what, fn, *a, **kw):
        """(True, result) or (False, the exception), the exception reported."""
        try:
            return True, fn(*a, **kw)
        except Exception as e:  # noqa: BLE001 - every exception is reported
            ev({"ev": "exc", "call": what, **describe(e)})
            return False, e

    def outcome(ids, topic, qid, good, r):
        """An acknowledged put, or one that may or may not be in the log (with its queue offset when known)."""
        if good and r.status is PutStatus.PUT_OK:
            ev({"ev": "ack", "ids": ids, "topic": topic, "queue": qid, "qoff": r.queue_offset})
            return
        if good:
            ev({"ev": "status", "call": "put", "status": r.status.name, "ids": ids})
        result = r if good else getattr(r, "result", None)
        qoff = getattr(result, "queue_offset", -1)
        ev(
            {
                "ev": "unsure",
                "ids": ids,
                "topic": topic,
                "queue": qid,
                "qoff": qoff if qoff is not None and qoff >= 0 else None,
            }
        )

    ok, st = call("open", localmq.open, root, **config(mode))
    if ok:
        producer = st.create_producer()
        i = 0
        while i < MESSAGES:
            topic, qid = TOPICS[i % len(TOPICS)], (i // len(TOPICS)) % QUEUES
            if i % 9 == 4:  # a batch of three through send_batch
                ids = [i, i + 1, i + 2]
                p2 = st.create_producer(queue_id=qid)
                good, r = call("send_batch", p2.send_batch, topic, [body(j) for j in ids], keys=f"batch{i}")
                p2.close()
                outcome(ids, topic, qid, good, r)
                i += 3
                continue
            if i % 3 == 0:  # Producer.send with keys: SendError on failure; the index is written
                producer.queue_id = qid
                good, r = call("send", producer.send, topic, body(i), keys=[f"k{i}", f"o{i % 5}"])
            else:
                good, r = call("put", st.put, topic, body(i), queue_id=qid, tags=f"tag{i % 2}")
            outcome([i], topic, qid, good, r)
            i += 1
        producer.close()
        # a consumer reads t0 and commits durably (consumerOffset.json: tmp file, fsync, rename, directory fsync)
        ok, consumer = call("create_consumer", st.create_consumer, GROUP, ["t0"])
        if ok:
            got = []
            while len(got) < 6:
                good, ms = call("poll_batch", consumer.poll_batch, 6 - len(got), 0.05)
                if not good or not ms:
                    break
                got.extend(ms)
            positions = {}
            for m in got:
                positions[m.queue_id] = max(positions.get(m.queue_id, 0), m.queue_offset + 1)
            good, _ = call("commit", consumer.commit)
            if good and positions:
                ev({"ev": "committed", "topic": "t0", "positions": {str(q): p for q, p in positions.items()}})
            call("consumer.close", consumer.close)
        good, _ = call("close", st.close)
        if good:
            ev({"ev": "closed"})
    after = counters(mnt)
    ev(
        {
            "ev": "done",
            "ops": {k: after[k] - before[k] for k in KINDS + ("ops",)},
            "injected": after["injected"] - before["injected"],
            "log": handler.records,
        }
    )


# -- the verification ------------------------------------------------------------------------------------------------

NEW_PUT_BASE = 900000


def expectations(events):
    """What the workload's events promise: {id: (topic, queue, queue offset)} acknowledged, {id: position or None}
    whose put failed (they may or may not be in the log), the durably committed positions, and whether close()
    returned (so that every acknowledged message was flushed, also in ASYNC_FLUSH)."""
    acked, unsure, committed = {}, {}, {}
    closed = False
    for e in events:
        if e["ev"] == "ack":
            for n, i in enumerate(e["ids"]):
                acked[i] = (e["topic"], e["queue"], e["qoff"] + n)
        elif e["ev"] == "unsure":
            for n, i in enumerate(e["ids"]):
                unsure[i] = None if e.get("qoff") is None else (e["topic"], e["queue"], e["qoff"] + n)
        elif e["ev"] == "committed":
            committed = {int(q): p for q, p in e["positions"].items()}
        elif e["ev"] == "closed":
            closed = True
    return acked, unsure, committed, closed


def verify(mnt, root, mode, expect, out):
    """Runs in a verify child on the store the workload left (the fault disarmed): ``expect`` = (acknowledged
    {id: position}, may be missing {id: position or None}, committed {queue: offset}, excused {id: position}:
    acknowledged, but their loss was reported to the workload). Reports "problems"."""
    ev = out.append
    acked, maybe, committed, excused = expect
    acked = {int(k): tuple(v) for k, v in acked.items()}
    excused = {int(k): tuple(v) for k, v in excused.items()}
    maybe = {int(k): (tuple(v) if v else None) for k, v in maybe.items()}
    maybe.update(excused)
    at = {pos: i for i, pos in list(maybe.items()) + list(acked.items()) if pos}
    problems = []
    if not os.path.isdir(root) and acked:
        problems.append("lost: the store directory is missing")
    try:
        st = localmq.open(root, **config(mode))
    except Exception as e:  # noqa: BLE001
        ev({"ev": "reopen_failed", **describe(e)})
        return
    new = {}
    closed = False
    try:
        rec = st.recovery
        ev(
            {
                "ev": "recovery",
                "mode": rec.mode,
                "dropped_bytes": rec.dropped_bytes,
                "gaps": len(rec.gaps),
                "cq_rebuilt": len(rec.cq_rebuilt),
                "rebuilt": rec.rebuilt,
            }
        )
        found, lost_units = {}, []
        for t in TOPICS:
            for q in range(QUEUES):
                lo, hi = st.min_offset(t, q), st.max_offset(t, q)
                if lo != 0:
                    problems.append(f"queue {t}/{q}: min offset {lo}, not 0")
                off = lo
                while off < hi:
                    try:
                        r = st.get_message(t, q, off, max_messages=32)
                    except localmq.CorruptMessageError as e:  # a unit whose message was lost to damage
                        i = at.get((t, q, off))
                        if i is None or i in acked:
                            problems.append(f"get {t}/{q}@{off} (message {i}): {e}"[:300])
                        lost_units.append(i)
                        off += 1
                        continue
                    except Exception as e:  # noqa: BLE001
                        problems.append(f"get {t}/{q}@{off}: {type(e).__name__}: {e}"[:300])
                        off += 1
                        continue
                    if not r.messages:
                        problems.append(f"queue {t}/{q}: get at {off} below max {hi} answered {r.status.name}")
                        break
                    for m in r.messages:
                        if m.queue_offset != off:
                            problems.append(f"queue {t}/{q}: offset {m.queue_offset} where {off} was expected")
                        i = body_id(m.body)
                        if i is None:
                            problems.append(f"queue {t}/{q}@{m.queue_offset}: a body whose CRC does not match")
                        else:
                            if i in found:
                                problems.append(f"message {i} twice")
                            found[i] = (t, q, m.queue_offset)
                        off = m.queue_offset + 1
        lost = sorted(i for i in acked if i not in found)
        moved = sorted(i for i in acked if i in found and found[i] != acked[i])
        phantom = sorted(i for i in found if i not in acked and i not in maybe)
        if lost:
            problems.append(f"lost: {len(lost)} acknowledged messages missing, first {lost[:6]}")
        if moved:
            problems.append(
                f"moved: {len(moved)} acknowledged messages elsewhere, first "
                f"{[(i, acked[i], found[i]) for i in moved[:3]]}"
            )
        if phantom:
            problems.append(f"phantom: {len(phantom)} messages never put, first {phantom[:6]}")
        if committed:
            c = st.create_consumer(GROUP, ["t0"])
            try:
                for q, pos in committed.items():
                    have = c.committed("t0", q)
                    if have is None or have < pos:
                        problems.append(f"lost: the committed offset of t0/{q}, {pos}, came back as {have}")
            finally:
                c.close()
        # new puts
        for n, t in enumerate(TOPICS):
            i = NEW_PUT_BASE + n
            r = st.put(t, body(i), queue_id=0)
            if r.status is PutStatus.PUT_OK:
                new[i] = (t, 0, r.queue_offset)
            else:
                problems.append(f"reopen: a new put to {t} answered {r.status.name}")
        if not st.wait_for_dispatch(10):
            problems.append("reopen: the new puts were not dispatched within 10 s")
        for i, (t, q, off) in new.items():
            r = st.get_message(t, q, off, max_messages=1)
            if not r.messages or body_id(r.messages[0].body) != i:
                problems.append(f"reopen: new message {i} does not read back at {t}/{q}@{off}")
        ev(
            {
                "ev": "counts",
                "acked": len(acked),
                "found": len(found),
                "maybe": len(maybe),
                "lost_units": len(lost_units),
                "lost_reported": len([i for i in excused if i not in found]),
            }
        )
    except Exception as e:  # noqa: BLE001
        ev({"ev": "verify_error", **describe(e)})
    finally:
        try:
            st.close()
            closed = True
        except Exception as e:  # noqa: BLE001
            ev({"ev": "verify_close_failed", **describe(e)})
    ev({"ev": "new_puts", "acked": {str(i): p for i, p in new.items()}, "closed": closed})
    ev({"ev": "problems", "problems": problems})


# -- the job loop ----------------------------------------------------------------------------------------------------


def run_child(fn, timeout, *args):
    """Fork, run ``fn(*args, out)`` in the child, collect ``out`` through a pipe. Returns (events, how): how is
    "exit 0", "exit N", "signal NAME" or "timeout"."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(r)
        code = 0
        out = []
        try:
            fn(*args, out)
        except BaseException as e:  # noqa: BLE001
            out.append({"ev": "crash", **describe(e)})
            code = 3
        finally:
            try:
                data = json.dumps(out).encode()
                view = memoryview(data)
                while view:
                    view = view[os.write(w, view) :]
                os.close(w)
            finally:
                os._exit(code)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    how = None
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                how = "timeout"
                os.kill(pid, signal.SIGKILL)
                break
            ready, _, _ = select.select([r], [], [], left)
            if ready:
                chunk = os.read(r, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(r)
    status = None
    end = time.monotonic() + (30 if how is None else 10)
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
        elif time.monotonic() > end:
            os.kill(pid, signal.SIGKILL)
            how = how or "timeout"
            status = os.waitpid(pid, 0)[1]
        else:
            time.sleep(0.01)
    if how is None:
        if os.WIFSIGNALED(status):
            how = f"signal {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            how = f"exit {os.WEXITSTATUS(status)}"
    try:
        events = json.loads(b"".join(chunks)) if chunks else []
    except ValueError:
        events = []
    return events, how


_state = {}  # name -> (workload events, what the first verification added)


def reported_log_flush_failure(events):
    """The workload was told that a flush of the commit log failed (close() or a send said so, naming it)."""
    return any(
        e["ev"] == "exc" and "/commitlog/" in e["msg"] and any(w in e["msg"] for w in ("msync", "fdatasync", "flush"))
        for e in events
    )


def run_job(mnt, spec):
    """The workload with its fault, then (fault disarmed) the first verification on the same mount. In
    ASYNC_FLUSH an acknowledged message was only in the page cache: when the workload was told that a flush of the
    commit log failed, its loss is excused (and counted, "lost_reported")."""
    root = os.path.join(mnt, spec["name"])
    t0 = time.monotonic()
    events, how = run_child(workload, spec.get("timeout", 90), mnt, root, spec["mode"], spec.get("fault"))
    ctl(mnt, "fail off")
    t1 = time.monotonic()
    acked, unsure, committed, _ = expectations(events)
    excused = {}
    if spec["mode"] != "SYNC_FLUSH" and reported_log_flush_failure(events):
        excused, acked = acked, {}
    checks, vhow = run_child(
        verify, spec.get("timeout", 90), mnt, root, spec["mode"], (acked, unsure, committed, excused)
    )
    _state[spec["name"]] = (events, checks)
    lost_reported = sum(e.get("lost_reported", 0) for e in checks if e["ev"] == "counts")
    return {
        "name": spec["name"],
        "fault": spec.get("fault"),
        "mode": spec["mode"],
        "workload": how,
        "events": events,
        "verify": vhow,
        "checks": checks,
        "lost_reported": lost_reported,
        "seconds": [round(t1 - t0, 2), round(time.monotonic() - t1, 2)],
    }


def after_cut_job(mnt, spec):
    """After a power cut that kept only what was synced: what the workload and the first verification were
    promised on disk. SYNC_FLUSH: every acknowledged message; ASYNC_FLUSH: those too when close() returned (it
    flushes); the new puts of the verification when its close() returned; a durable commit always."""
    name, mode = spec["name"], spec["mode"]
    events, checks = _state.pop(name)
    root = os.path.join(mnt, name)
    acked, unsure, committed, closed = expectations(events)
    maybe = dict(unsure)
    if mode != "SYNC_FLUSH" and not closed:
        maybe.update(acked)
        acked = {}
    for e in checks:
        if e["ev"] == "new_puts":
            new = {int(i): tuple(p) for i, p in e["acked"].items()}
            (acked if e["closed"] else maybe).update(new)
    t0 = time.monotonic()
    checks2, vhow = run_child(verify, spec.get("timeout", 90), mnt, root, mode, (acked, maybe, committed, {}))
    return {"name": name, "verify": vhow, "checks": checks2, "seconds": round(time.monotonic() - t0, 2)}


def main():
    mnt = sys.argv[1]
    print(json.dumps({"localmq": localmq.__file__}), flush=True)
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        spec = json.loads(line)
        op = spec.get("op", "run")
        if op == "run":
            answer = run_job(mnt, spec)
        elif op == "after_cut":
            answer = after_cut_job(mnt, spec)
        elif op == "cleanup":
            for name in spec["names"]:
                _state.pop(name, None)
                shutil.rmtree(os.path.join(mnt, name), ignore_errors=True)
            answer = {"cleaned": spec["names"]}
        else:
            answer = {"error": f"unknown op {op!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
