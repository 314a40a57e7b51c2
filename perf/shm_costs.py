"""Costs of the multi-process primitives (localmq._shm) seen from Python, printed as a table.

    PYTHONPATH=$PWD python perf/shm_costs.py [--dir DIR] [--n N]

Rows: writer lock acquire+release (1 process; 2 processes hammering it), eventcount notify with and without a
sleeping waiter, cross-process wake-up latency (notify -> the waiter's wait() returns) beside a pipe's one-way
wake-up and round trip. Timestamps are CLOCK_MONOTONIC, one clock for all processes. Sizes, not exact values:
the machine's cores are shared.
"""

import argparse
import os
import statistics
import struct
import sys
import tempfile
import time

from localmq._shm import ControlFile

now = time.monotonic_ns


def fork(fn, *args):
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            fn(*args)
            code = 0
        finally:
            os._exit(code)
    return pid


def reap(*pids):
    for pid in pids:
        os.waitpid(pid, 0)


def lock_loop(path, n, r_go, w_done):
    with ControlFile(path) as c:
        acquire, release = c.lock.acquire, c.lock.release
        os.write(w_done, b"r")
        os.read(r_go, 1)
        t0 = now()
        for _ in range(n):
            acquire(10.0)
            release()
        os.write(w_done, struct.pack("=q", now() - t0))


def lock_procs(path, procs, n):
    """Aggregate ns per acquire+release with ``procs`` processes each doing ``n`` of them at once."""
    r_go, w_go = os.pipe()
    r_done, w_done = os.pipe()
    pids = [fork(lock_loop, path, n, r_go, w_done) for _ in range(procs)]
    for _ in pids:
        os.read(r_done, 1)
    t0 = now()
    os.write(w_go, b"g" * procs)
    for _ in pids:
        os.read(r_done, 8)
    wall = now() - t0
    reap(*pids)
    for fd in (r_go, w_go, r_done, w_done):
        os.close(fd)
    return wall / (procs * n), wall / n


def per_op(fn, n):
    t0 = now()
    for _ in range(n):
        fn()
    return (now() - t0) / n


def waiter_loop(path, rounds, w_out):
    with ControlFile(path) as c:
        ev = c.events
        for _ in range(rounds):
            s = ev.seq()
            ev.wait(s, 5.0)
            os.write(w_out, struct.pack("=q", now()))


def wake_latency(ctl, path, rounds):
    """One-way notify -> wake latencies (ns) and the cost of each notify that had a sleeping waiter."""
    r, w = os.pipe()
    pid = fork(waiter_loop, path, rounds, w)
    ev = ctl.events
    lat, cost = [], []
    for _ in range(rounds):
        deadline = time.monotonic() + 5
        while not ev.has_waiters:  # the waiter announced itself: it is asleep (or about to be) in FUTEX_WAIT
            if time.monotonic() > deadline:
                raise RuntimeError("waiter never slept")
            time.sleep(0.0002)
        time.sleep(0.0002)  # let it reach FUTEX_WAIT
        t0 = now()
        woke = ev.notify()
        t1 = now()
        (t,) = struct.unpack("=q", os.read(r, 8))
        if woke:
            lat.append(t - t0)
            cost.append(t1 - t0)
    reap(pid)
    os.close(r)
    os.close(w)
    return lat, cost


def pipe_echo(r_in, w_out, rounds):
    for _ in range(rounds):
        os.read(r_in, 1)
        t = now()
        os.write(w_out, struct.pack("=q", t))


def pipe_latency(rounds):
    """One-way pipe wake-up latencies and round trips (ns) between two processes."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = fork(pipe_echo, r1, w2, rounds)
    one_way, rtt = [], []
    for _ in range(rounds):
        time.sleep(0.0002)  # the echo process blocks in read(), as the futex waiter blocks in wait()
        t0 = now()
        os.write(w1, b"x")
        (t,) = struct.unpack("=q", os.read(r2, 8))
        t2 = now()
        one_way.append(t - t0)
        rtt.append(t2 - t0)
    reap(pid)
    for fd in (r1, w1, r2, w2):
        os.close(fd)
    return one_way, rtt


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p / 100))]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="directory for the control file (default: a temporary one under /tmp)")
    ap.add_argument("--n", type=int, default=200_000, help="operations per throughput row")
    ap.add_argument("--rounds", type=int, default=2000, help="samples per latency row")
    args = ap.parse_args(argv)
    d = args.dir or tempfile.mkdtemp(prefix="lmq_shm_costs_")
    path = os.path.join(d, "mpctl")
    rows = []
    with ControlFile(path) as ctl:
        lock, ev = ctl.lock, ctl.events

        def acq_rel():
            lock.acquire(10.0)
            lock.release()

        rows.append(("lock acquire+release, 1 process (this one)", per_op(acq_rel, args.n), "ns/op"))
        agg, per = lock_procs(path, 1, args.n)
        rows.append(("lock acquire+release, 1 forked process", agg, "ns/op"))
        agg, per = lock_procs(path, 2, args.n)
        rows.append(("lock acquire+release, 2 processes contended (aggregate)", agg, "ns/op"))
        rows.append(("lock acquire+release, 2 processes contended (per process)", per, "ns/op"))
        rows.append(("notify, nobody waiting (no system call)", per_op(ev.notify, args.n), "ns/op"))
        rows.append(("seq() (the waiter's first step)", per_op(ev.seq, args.n), "ns/op"))
        lat, cost = wake_latency(ctl, path, args.rounds)
        rows.append(("notify with a sleeping waiter (FUTEX_WAKE), median", statistics.median(cost), "ns/op"))
        rows.append((f"wake-up notify -> wait() returns, p50 ({len(lat)} samples)", pct(lat, 50), "ns"))
        rows.append(("wake-up notify -> wait() returns, p99", pct(lat, 99), "ns"))
    one_way, rtt = pipe_latency(args.rounds)
    rows.append(("pipe wake-up write -> read() returns, p50", pct(one_way, 50), "ns"))
    rows.append(("pipe wake-up write -> read() returns, p99", pct(one_way, 99), "ns"))
    rows.append(("pipe round trip, p50", pct(rtt, 50), "ns"))
    rows.append(("pipe round trip, p99", pct(rtt, 99), "ns"))
    if not args.dir:
        os.unlink(path)
        os.rmdir(d)
    width = max(len(r[0]) for r in rows)
    print(f"| {'operation (Python -> localmq._shm)'.ljust(width)} | {'value':>10} | unit  |")
    print(f"|{'-' * (width + 2)}|{'-' * 12}|-------|")
    for name, value, unit in rows:
        print(f"| {name.ljust(width)} | {value:10.0f} | {unit:5} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
