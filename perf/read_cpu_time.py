"""CPU time of the reading thread per message read back, localmq beside the peers of ``test_read_all``, rounds
alternating between the implementations.

    PYTHONPATH=$PWD python perf/read_cpu_time.py [--n 100000] [--rounds 9] [--impl localmq --impl lmdb ...]

Each round of each implementation (``localmq``, ``localmq_get_message``, ``lmdb``, ``mmap_log`` by default) is a
fresh store filled with n messages of 100 B by ``put_batch`` (batches of 1000), then read back with the benchmark's
own loop (``consume(store.read_all())`` of test_queue_bench.py); the reading thread's CPU time
(``time.thread_time``) and the wall time of the read are recorded. On a machine shared with other jobs the wall time
of a round includes the time the thread waited for a core; its CPU time does not, so the CPU figures are the ones to
compare there (they still include what a loaded machine's caches cost). Medians over the rounds; the ratio is
localmq / implementation in messages per CPU second.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_IMPLS = ("localmq", "localmq_get_message", "lmdb", "mmap_log")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--impl", action="append")
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    sys.path.insert(0, HERE)
    from conftest import BATCH, make_bodies
    from peers import IMPLEMENTATIONS, READ_VARIANTS
    from test_queue_bench import consume

    impls = a.impl or DEFAULT_IMPLS
    classes = {**IMPLEMENTATIONS, **READ_VARIANTS}
    bodies = make_bodies(a.n, 100)
    cpu = {name: [] for name in impls}
    wall = {name: [] for name in impls}
    root = tempfile.mkdtemp(prefix="lmq-read-cpu-", dir=a.dir)
    try:
        for r in range(a.rounds + 1):  # round 0: warm-up, not counted
            for name in impls:
                path = tempfile.mkdtemp(dir=root)
                store = classes[name]().open(path, a.n, 100)
                for i in range(0, a.n, BATCH):
                    store.put_batch(bodies[i : i + BATCH])
                store.wait_visible()
                c0, w0 = time.thread_time(), time.perf_counter()
                count, first, last, _ = consume(store.read_all())
                c1, w1 = time.thread_time(), time.perf_counter()
                assert count == a.n and bytes(first) == bodies[0] and bytes(last) == bodies[-1], name
                store.close()
                shutil.rmtree(path)
                if r:
                    cpu[name].append(c1 - c0)
                    wall[name].append(w1 - w0)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ref = a.n / statistics.median(cpu[impls[0]])
    print(f"{a.n:,} messages of 100 B, {a.rounds} rounds, medians; ratio = {impls[0]} / implementation (CPU)")
    for name in impls:
        c, w = a.n / statistics.median(cpu[name]), a.n / statistics.median(wall[name])
        print(
            f"{name:22s} CPU {c / 1e6:6.2f}M msgs/s   wall {w / 1e6:6.2f}M msgs/s "
            f"(range {a.n / max(wall[name]) / 1e6:.2f}-{a.n / min(wall[name]) / 1e6:.2f})   ratio {ref / c:.2f}"
        )


if __name__ == "__main__":
    main()
