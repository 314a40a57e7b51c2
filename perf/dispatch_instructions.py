"""Instructions per dispatched record (callgrind): the dispatch loop ``ReputCore._run_nogil`` over a written log.

    PYTHONPATH=$PWD python perf/dispatch_instructions.py [--n 100000] [--dir DIR]

Writes a store of n (and of 2n) 100-byte messages with ``put_batch`` (outside valgrind), deletes its ConsumeQueues,
then opens it under ``valgrind --tool=callgrind``: the open re-dispatches the whole log in the main thread
(``ReputCore.run_until_caught_up``, no idle polling, so the count does not depend on timing). Prints the
instructions of ``_run_nogil`` (inclusive: its inlined helpers and the record parser) per record, the difference
between the two runs divided by n, so that opening, closing and the ConsumeQueue files' creation cancel out.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

BODY = b"x" * 100
RUN_FN = "ReputCore__run_nogil"


def write(path, n):
    import localmq

    with localmq.open(path, mapped_file_size_commit_log=64 << 20) as q:
        for i in range(0, n, 1000):
            q.put_batch("T", [BODY] * min(1000, n - i), queue_id=i // 1000 % 4)
        q.wait_for_dispatch(60.0)
    shutil.rmtree(os.path.join(path, "consumequeue"))


def reopen(path):
    import localmq

    localmq.open(path, mapped_file_size_commit_log=64 << 20).close()


def run_nogil(out):
    """Inclusive instructions of ``_run_nogil`` in a callgrind output file of the main thread."""
    text = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", "--auto=no", "--threshold=100", out],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = 0
    for line in text.splitlines():
        if RUN_FN in line:
            found = max(found, int(line.split()[0].replace(",", "")))
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100000)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        reopen(a.child)
        return
    root = tempfile.mkdtemp(prefix="lmq-dispatch-instr-", dir=a.dir)
    try:
        got = []
        for k in (a.n, 2 * a.n):
            path = os.path.join(root, f"s{k}")
            write(path, k)
            out = os.path.join(root, f"cg.{k}.out")
            subprocess.run(
                [
                    "valgrind",
                    "--tool=callgrind",
                    "--separate-threads=yes",
                    f"--callgrind-out-file={out}",
                    sys.executable,
                    __file__,
                    "--child",
                    path,
                ],
                check=True,
                capture_output=True,
            )
            got.append(run_nogil(out + "-01"))
            for f in glob.glob(out + "*"):
                os.unlink(f)
            shutil.rmtree(path)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"{(got[1] - got[0]) / a.n:.1f} instructions per record in _run_nogil "
        f"({got[0]:,} for {a.n:,} records, {got[1]:,} for {2 * a.n:,})"
    )


if __name__ == "__main__":
    main()
