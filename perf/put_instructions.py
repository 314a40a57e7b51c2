"""Instructions per put (callgrind), exclusive and shared store, through a bound ``q.put`` of 100-byte bodies, or
per message of ``q.put_batch`` with ``--batch K`` (batches of K bodies; the call is ``CommitLogFront.put_batch``).

    PYTHONPATH=$PWD python perf/put_instructions.py [--n 20000] [--batch 1000] [--dir DIR]

Runs this file under ``valgrind --tool=callgrind`` twice per mode (n and 2n puts) and prints, per put, the
instructions of the main thread (the loop included) and of the put call alone (``CommitLogFront.put``, inclusive),
each as the difference between the two runs divided by n, so that opening and closing the store cancel out. The put
call's count repeats to a few instructions; the loop's moves by +-40 between runs (the main thread's share of the
close, which waits for the dispatcher to catch up, grows with n). Instruction counts do not depend on the
machine's load, unlike the timings of test_shared_bench.py; they do not see what an instruction costs (an atomic
read-modify-write, a cache line that another core wrote).
"""

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

BODY = b"x" * 100
PUT_FN = "CommitLogFront_1put"
PUT_BATCH_FN = "CommitLogFront_3put_batch"


def child(mode, n, root, batch):
    import localmq

    path = tempfile.mkdtemp(dir=root)
    q = localmq.open(path, shared=mode == "shared", mapped_file_size_commit_log=64 << 20)
    if batch:
        put_batch, bodies = q.put_batch, [BODY] * batch
        for _ in range(n // batch):
            put_batch("T", bodies)
    else:
        put = q.put
        for _ in range(n):
            put("T", BODY)
    q.close()
    shutil.rmtree(path)


def counts(out, fn):
    """(main thread total, the put call ``fn`` inclusive) of a callgrind output file of the main thread."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--auto=no", "--threshold=100", out],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total = int(re.search(r"([\d,]+)\s+\(100\.0%\)\s+PROGRAM TOTALS", text).group(1).replace(",", ""))
    put = 0
    for line in text.splitlines():
        if fn in line and "'" not in line.split(fn)[1][:2]:
            put = max(put, int(line.split()[0].replace(",", "")))
    return total, put


def measure(mode, n, root, batch):
    res = []
    for k in (n, 2 * n):
        out = os.path.join(root, f"cg.{mode}.{k}.out")
        subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--separate-threads=yes",
                f"--callgrind-out-file={out}",
                sys.executable,
                __file__,
                "--child",
                mode,
                "--n",
                str(k),
                "--dir",
                root,
                "--batch",
                str(batch),
            ],
            check=True,
            capture_output=True,
        )
        res.append(counts(out + "-01", PUT_BATCH_FN if batch else PUT_FN))
        for f in glob.glob(out + "*"):
            os.unlink(f)
    return (res[1][0] - res[0][0]) / n, (res[1][1] - res[0][1]) / n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.n, a.dir, a.batch)
        return
    root = tempfile.mkdtemp(prefix="lmq-put-instr-", dir=a.dir)
    try:
        got = {mode: measure(mode, a.n, root, a.batch) for mode in ("exclusive", "shared")}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    call = f"put_batch call (batches of {a.batch})" if a.batch else "put call"
    for mode, (loop, put) in got.items():
        print(f"{mode:<10} {loop:8.0f} instructions per message (loop), {put:8.0f} in the {call}")
    (el, ep), (sl, sp) = got["exclusive"], got["shared"]
    print(
        f"shared - exclusive: {sl - el:.0f} per put (loop), {sp - ep:.0f} in the put call; "
        f"exclusive/shared (loop): {el / sl:.3f}"
    )


if __name__ == "__main__":
    main()
