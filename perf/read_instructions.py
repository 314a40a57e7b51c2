"""Instructions per message of reading every body back (callgrind), localmq beside the peers of ``test_read_all``.

    PYTHONPATH=$PWD python perf/read_instructions.py [--n 100000] [--impl localmq --impl lmdb ...] [--dir DIR]

Each implementation of ``perf/peers.py`` (``localmq``, ``localmq_get_message``, ``lmdb``, ``mmap_log`` by default)
is filled with n messages of 100 B by ``put_batch`` (batches of 1000) and read back with the benchmark's own loop
(``consume(store.read_all())`` of test_queue_bench.py) under ``valgrind --tool=callgrind``, once with one read pass
and once with three; the main thread's instruction count of the difference, divided by 2n, is one read of one
message (filling, opening and closing cancel out). Instruction counts do not depend on the machine's load, unlike the
timings of test_queue_bench.py; they do not see what an instruction costs (a cache miss, a page fault).
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_IMPLS = ("localmq", "localmq_get_message", "lmdb", "mmap_log")


def child(impl, n, passes, root):
    sys.path.insert(0, HERE)
    from conftest import BATCH, make_bodies
    from peers import IMPLEMENTATIONS, READ_VARIANTS
    from test_queue_bench import consume

    bodies = make_bodies(n, 100)
    path = tempfile.mkdtemp(dir=root)
    store = {**IMPLEMENTATIONS, **READ_VARIANTS}[impl]().open(path, n, 100)
    for i in range(0, n, BATCH):
        store.put_batch(bodies[i : i + BATCH])
    store.wait_visible()
    for _ in range(passes):
        count, _, _, _ = consume(store.read_all())
        assert count == n, (count, n)
    store.close()
    shutil.rmtree(path)


def main_thread_total(out):
    text = subprocess.run(
        ["callgrind_annotate", "--auto=no", "--threshold=100", out], capture_output=True, text=True, check=True
    ).stdout
    return int(re.search(r"([\d,]+)\s+\(100\.0%\)\s+PROGRAM TOTALS", text).group(1).replace(",", ""))


def measure(impl, n, root):
    totals = []
    for passes in (1, 3):
        out = os.path.join(root, f"cg.{impl}.{passes}.out")
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--child",
                impl,
                "--n",
                str(n),
                "--passes",
                str(passes),
                "--dir",
                root,
            ],
            check=True,
            capture_output=True,
        )
        totals.append(main_thread_total(out + "-01"))
        for f in glob.glob(out + "*"):
            os.unlink(f)
    return (totals[1] - totals[0]) / (2 * n)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--impl", action="append")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.n, a.passes, a.dir)
        return
    root = tempfile.mkdtemp(prefix="lmq-read-instr-", dir=a.dir)
    try:
        for impl in a.impl or DEFAULT_IMPLS:
            print(f"{impl:<22} {measure(impl, a.n, root):8.1f} instructions per message read")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
