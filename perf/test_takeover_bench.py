"""Takeover times after SIGKILL in a store shared by many processes (issue 12): how long the survivors wait.

- Writer-lock holder killed: the test process opens the store first (it is the housekeeper) and starts one child
  per kill that puts in a loop, a third of them 256 KiB bodies (the copy into the mapping under the writer lock is
  most of their time), the others 100 B bodies (caught outside the lock more often). It SIGKILLs the child at a
  random moment and at once times its own 100-byte put until it is acknowledged. A sample counts as "recovered" when
  the robust mutex's recovery count (kept in the control file: store-wide, so it also counts a takeover by this
  process's election thread, ``check_writer``; the put waited for it either way) moved between the kill and the
  acknowledgement: the child died holding the lock. After all kills every acknowledged put of the test process is
  read back and queue 0 is checked dense from offset 0 to its max offset (every child body intact too), then the
  store is reopened by one process and checked again, so a broken store cannot look fast.
- Housekeeper killed: a child opens a fresh store first (it is the housekeeper), the test process attaches, puts one
  message and waits for its dispatch; then SIGKILLs the child and times until it is the housekeeper itself, and until
  a put made right after the kill is dispatched and readable.

Each scenario is one pytest-benchmark round (``pedantic``, 1 round, the whole series of kills); the figures are in
``extra_info`` (with every sample) and in the table printed at the end (conftest.pytest_terminal_summary).
"""

import multiprocessing
import os
import random
import shutil
import signal
import tempfile
import threading
import time

import pytest

from conftest import QUICK, localmq_missing

LOCK_KILLS = 9 if QUICK else 60  # writer-lock holder killed: one child per kill, one store
HK_KILLS = 3 if QUICK else 12  # housekeeper killed: one child and one store per kill
BIG = 256 << 10  # a third of the children put these: most of their time is the copy under the writer lock
SMALL = 100  # the others: more of their time is outside the lock (the interpreter, the put's checks)
KW = dict(mapped_file_size_commit_log=64 << 20, mapped_file_size_consume_queue=20 * 300_000)
FILLER = random.Random(12).randbytes(BIG)
CHILD_LIMIT_S = 60  # a child left alone (the test process died) stops by itself
RESULTS = []


def table_lines():
    """The same-run table (conftest.pytest_terminal_summary prints it at the end of the run)."""
    return [f"{r['what']:<44} {r['figures']}" for r in RESULTS]


def _pct(xs):
    """p50 / p90 / max in milliseconds of samples in seconds (None when there are none)."""
    if not xs:
        return None
    s = sorted(xs)
    return {
        "p50": s[len(s) // 2] * 1e3,
        "p90": s[min(len(s) - 1, int(len(s) * 0.9))] * 1e3,
        "max": s[-1] * 1e3,
        "n": len(s),
    }


def _fmt(p):
    if p is None:
        return "no sample"
    return f"n={p['n']:>2}  p50 {p['p50']:8.3f} ms  p90 {p['p90']:8.3f} ms  max {p['max']:8.3f} ms"


def _child_body(tag, size):
    return tag.to_bytes(8, "big") + FILLER[8:size]


def _stopped(t_end, parent):
    return time.monotonic() > t_end or os.getppid() != parent


# -- workers (module level: spawn imports this module in the child) ------------------------------------------


def _writer(path, size, started, parent):
    """Puts ``size``-byte bodies into queue 0 until killed (or CHILD_LIMIT_S, or the test process gone)."""
    import localmq

    q = localmq.open(path, shared=True, **KW)
    body = _child_body(os.getpid(), size)
    put = q.put
    t_end = time.monotonic() + CHILD_LIMIT_S
    assert put("T", body).ok
    started.set()
    while not _stopped(t_end, parent):
        for _ in range(64):
            put("T", body)
    q.close()


def _keeper(path, out, parent):
    """Opens the store first (so it is the housekeeper), says so, then idles until killed."""
    import localmq

    q = localmq.open(path, shared=True, **KW)
    out.put((os.getpid(), q.housekeeper))
    t_end = time.monotonic() + CHILD_LIMIT_S
    while not _stopped(t_end, parent):
        time.sleep(0.05)
    q.close()


def _shared(q):
    return q.stats()["shared"]


# -- writer-lock holder killed -----------------------------------------------------------------------------------


def _verify_queue(q, acked):
    """Queue 0 of T is dense from 0 to its max offset, every acknowledged put of ours is there with its body, and
    every other body is a child's intact body (BIG or SMALL bytes). Returns the number of messages."""
    end = q.max_offset("T", 0)
    off = 0
    while off < end:
        r = q.get_message("T", 0, off, 32)
        assert r.messages, (off, end, r.status)
        for m in r.messages:
            assert m.queue_offset == off, (m.queue_offset, off)  # dense: no hole, no duplicate
            body = bytes(m.body)
            if off in acked:
                assert body == acked[off], off
            else:
                assert len(body) in (BIG, SMALL) and body[8:] == FILLER[8 : len(body)], (off, len(body))
            off += 1
    assert all(o < end for o in acked), (max(acked), end)
    return end


def _run_lock_kills(kills):
    import localmq

    ctx = multiprocessing.get_context("spawn")
    rng = random.Random()
    path = tempfile.mkdtemp(prefix="lmq-takeover-lock-")
    samples = []  # (child body size, seconds kill -> ack, lock recovered, torn put repaired, kill -> reaped)
    acked = {}
    failures = []
    try:
        q = localmq.open(path, shared=True, **KW)  # the first opener: this process is the housekeeper
        try:
            for k in range(kills):
                size = BIG if k % 3 == 0 else SMALL  # a 100 B putter is caught outside the lock more often
                started = ctx.Event()
                p = ctx.Process(target=_writer, args=(path, size, started, os.getpid()), daemon=True)
                p.start()
                try:
                    assert started.wait(60), "the writer did not start"
                    time.sleep(rng.uniform(0.002, 0.03))
                    body = b"parent-%06d-" % k + b"p" * 88
                    before = _shared(q)
                    t0 = time.perf_counter()
                    os.kill(p.pid, signal.SIGKILL)
                    r = q.put("T", body)
                    t1 = time.perf_counter()
                    p.join(30)  # for comparison: when the kernel had the child dead
                    t2 = time.perf_counter()
                    after = _shared(q)
                finally:
                    if p.is_alive():
                        p.kill()
                    p.join(30)
                assert p.exitcode == -signal.SIGKILL, p.exitcode
                if not r.ok:
                    failures.append((k, r.status))
                    continue
                acked[r.queue_offset] = body
                samples.append(
                    (
                        size,
                        t1 - t0,
                        after["writer_lock_recoveries"] > before["writer_lock_recoveries"],
                        after["torn_puts_repaired"] > before["torn_puts_repaired"],
                        t2 - t0,
                    )
                )
            assert q.wait_for_dispatch(120)
            n = _verify_queue(q, acked)
        finally:
            q.close()
        # the store as the next run finds it: recovered by one process, the same records
        q = localmq.open(path, **KW)
        try:
            assert q.max_offset("T", 0) == n, (q.max_offset("T", 0), n)
            _verify_queue(q, acked)
        finally:
            q.close()
        return {"samples": samples, "failures": failures, "messages": n}
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _require_localmq():
    why = localmq_missing()
    if why:
        pytest.skip(why)


def test_writer_lock_holder_killed(benchmark):
    _require_localmq()
    out = benchmark.pedantic(_run_lock_kills, args=(LOCK_KILLS,), rounds=1, iterations=1)
    s = out["samples"]
    held = _pct([x[1] for x in s if x[2]])
    free = _pct([x[1] for x in s if not x[2]])
    every = _pct([x[1] for x in s])
    reaped = _pct([x[4] for x in s])
    inside = {size: sum(1 for x in s if x[2] and x[0] == size) for size in (BIG, SMALL)}
    kills = {size: sum(1 for x in s if x[0] == size) for size in (BIG, SMALL)}
    torn = sum(1 for x in s if x[3])
    benchmark.extra_info.update(
        kills=LOCK_KILLS,
        kills_inside_lock_256k=inside[BIG],
        kills_256k=kills[BIG],
        kills_inside_lock_100b=inside[SMALL],
        kills_100b=kills[SMALL],
        torn_puts_repaired=torn,
        failed_puts=len(out["failures"]),
        messages_verified=out["messages"],
        recovered_ms=held,
        free_ms=free,
        all_ms=every,
        reaped_ms=reaped,
        samples=[
            {"body": z, "ms": round(t * 1e3, 3), "recovered": rec, "torn": rep, "reaped_ms": round(dead * 1e3, 3)}
            for z, t, rec, rep, dead in s
        ],
    )
    RESULTS.append(
        {
            "what": f"lock holder killed ({LOCK_KILLS} kills)",
            "figures": f"inside the lock: {inside[BIG]}/{kills[BIG]} of the 256 KiB putters, "
            f"{inside[SMALL]}/{kills[SMALL]} of the 100 B putters; torn puts repaired {torn}; "
            f"failed puts {len(out['failures'])}; {out['messages']:,} messages verified",
        }
    )
    RESULTS.append({"what": "  kill -> next put acked, lock recovered", "figures": _fmt(held)})
    RESULTS.append({"what": "  kill -> next put acked, lock was free", "figures": _fmt(free)})
    RESULTS.append({"what": "  kill -> next put acked, all", "figures": _fmt(every)})
    RESULTS.append({"what": "  kill -> child reaped (after that put)", "figures": _fmt(reaped)})
    assert not out["failures"], out["failures"]


# -- housekeeper killed ------------------------------------------------------------------------------------------


def _watch_housekeeper(q, seen, deadline):
    """Polls ``q.housekeeper`` every 0.2 ms (the flag is the first thing set when this process takes over)."""
    while time.perf_counter() < deadline:
        if q.housekeeper:
            seen.append(time.perf_counter())
            return
        time.sleep(0.0002)


def _hk_round(ctx, path, rng):
    import localmq

    out = ctx.Queue()
    p = ctx.Process(target=_keeper, args=(path, out, os.getpid()), daemon=True)
    p.start()
    try:
        pid, is_hk = out.get(timeout=60)
        assert is_hk, "the first opener is the housekeeper"
        q = localmq.open(path, shared=True, **KW)
        try:
            assert not q.housekeeper
            assert q.put("T", b"one").ok
            assert q.wait_for_dispatch(10)  # by the child
            assert [bytes(m.body) for m in q.get_message("T", 0, 0).messages] == [b"one"]
            assert _shared(q)["housekeeper_pid"] == pid
            time.sleep(rng.uniform(0, 0.1))  # a random phase of this process's election interval
            seen = []
            poller = threading.Thread(target=_watch_housekeeper, args=(q, seen, time.perf_counter() + 10))
            poller.start()
            tb = time.perf_counter()
            assert q.put("T", b"base").ok  # the same put with the housekeeper alive, for comparison
            t_base = time.perf_counter() - tb
            t0 = time.perf_counter()
            os.kill(pid, signal.SIGKILL)
            try:
                assert q.put("T", b"two").ok
                t_put = time.perf_counter()
                assert q.wait_for_dispatch(10), "not dispatched within 10 s"
                got = [bytes(m.body) for m in q.get_message("T", 0, 0).messages]
                t_read = time.perf_counter()
                assert got == [b"one", b"base", b"two"], got
            finally:
                poller.join(15)
            assert seen, "no takeover within 10 s"
            t_hk = seen[0]
            assert _shared(q)["housekeeper_pid"] == os.getpid()
        finally:
            q.close()
    finally:
        if p.is_alive():
            p.kill()
        p.join(30)
    assert p.exitcode == -signal.SIGKILL, p.exitcode
    return t_put - t0, t_hk - t0, t_read - t0, t_base


def _run_hk_kills(kills):
    ctx = multiprocessing.get_context("spawn")
    rng = random.Random()
    root = tempfile.mkdtemp(prefix="lmq-takeover-hk-")
    try:
        return [_hk_round(ctx, os.path.join(root, f"s{k}"), rng) for k in range(kills)]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_housekeeper_killed(benchmark):
    _require_localmq()
    s = benchmark.pedantic(_run_hk_kills, args=(HK_KILLS,), rounds=1, iterations=1)
    put, hk, read, base = (_pct([x[i] for x in s]) for i in range(4))
    benchmark.extra_info.update(
        kills=HK_KILLS,
        put_acked_ms=put,
        housekeeper_ms=hk,
        dispatched_readable_ms=read,
        put_before_kill_ms=base,
        samples_ms=[[round(v * 1e3, 3) for v in x] for x in s],
    )
    RESULTS.append({"what": f"housekeeper killed ({HK_KILLS} kills)", "figures": ""})
    RESULTS.append({"what": "  put just before the kill (for comparison)", "figures": _fmt(base)})
    RESULTS.append({"what": "  kill -> put acked (no housekeeper)", "figures": _fmt(put)})
    RESULTS.append({"what": "  kill -> this process is the housekeeper", "figures": _fmt(hk)})
    RESULTS.append({"what": "  kill -> put dispatched and readable", "figures": _fmt(read)})
