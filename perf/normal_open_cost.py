"""What a normal open (clean exit, no ``abort``) pays for its check that every queue reaches the records of the
segments it walks (``recovery._first_unit_lost``: a queue whose last units were zeroed is re-dispatched): the open
timed with the check and with it replaced by a no-op, alternating, on the same store.

Usage: python perf/normal_open_cost.py [messages, default 1400000] [rounds, default 3]
(100-byte bodies, 8 topics x 4 queues, 64 MiB segments; the store lives in a temporary directory, removed after.)
"""

import shutil
import sys
import tempfile
import time

import localmq
from localmq.store import recovery

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1_400_000
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 3
SEGMENT = 64 << 20


def main() -> None:
    root = tempfile.mkdtemp(prefix="localmq-open-cost-")
    try:
        with localmq.open(root, mapped_file_size_commit_log=SEGMENT) as st:
            for i in range(0, N, 1000):
                st.put_batch("t%d" % (i // 1000 % 8), [b"x" * 100] * 1000, queue_id=i // 8000 % 4)
            st.wait_for_dispatch(120)
        check = recovery._first_unit_lost
        for _ in range(ROUNDS):
            for name, fn in (("without the check", lambda *a: None), ("with the check", check)):
                recovery._first_unit_lost = fn
                t = time.perf_counter()
                with localmq.open(root, mapped_file_size_commit_log=SEGMENT) as st:
                    took = time.perf_counter() - t
                    r = st.recovery
                print(f"{name:<18} {took:.3f} s  ({r.records_checked:,} records in the walked segments)")
        recovery._first_unit_lost = check
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
