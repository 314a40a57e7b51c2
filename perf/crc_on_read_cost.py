"""get throughput with check_crc_on_read on and off (same store, reopened; best of 5 passes each), and the Spark
reader's decode path (``localmq.spark.read.arrow_batches``, what each Spark task runs) with checkCRC on and off.

Usage: python perf/crc_on_read_cost.py [body size, default 100] [messages, default 200000]
"""

import os
import shutil
import sys
import tempfile
import time

import localmq

SIZE = int(sys.argv[1]) if len(sys.argv) > 1 else 100
N = int(sys.argv[2]) if len(sys.argv) > 2 else 200_000
SEGMENT = 256 << 20


def fill(root):
    with localmq.open(root, mapped_file_size_commit_log=SEGMENT) as st:
        body = os.urandom(SIZE)
        for _ in range(0, N, 32):
            st.put_batch("t", [body] * 32)
        st.wait_for_dispatch(60)


def run(root, check):
    """Messages per second reading the whole queue, best of 5 passes."""
    best = 1e9
    got = 0
    with localmq.open(root, mapped_file_size_commit_log=SEGMENT, check_crc_on_read=check) as st:
        for _ in range(5):
            t0 = time.perf_counter()
            off = got = 0
            while True:
                r = st.get_message("t", 0, off, 32)
                if not r.messages:
                    break
                got += len(r.messages)
                off = r.next_begin_offset
            best = min(best, time.perf_counter() - t0)
    return got / best


def run_spark(root, check):
    """Rows per second decoding the whole store into Arrow batches as a Spark task does, best of 5 passes."""
    from localmq.spark.read import arrow_batches

    best = 1e9
    rows = 0
    for _ in range(5):
        t0 = time.perf_counter()
        rows = sum(
            b.num_rows for b in arrow_batches(root, checkCRC=str(check).lower(), mapped_file_size_commit_log=SEGMENT)
        )
        best = min(best, time.perf_counter() - t0)
    return rows / best


def main():
    root = tempfile.mkdtemp(prefix="crcbench")
    try:
        fill(root)
        for _ in range(2):
            off, on = run(root, False), run(root, True)
            print(
                f"body {SIZE} B, {N} msgs: crc off {off:,.0f} msg/s, crc on {on:,.0f} msg/s, "
                f"cost {100 * (1 - on / off):.1f}%"
            )
        for _ in range(2):
            off, on = run_spark(root, False), run_spark(root, True)
            print(
                f"spark decode, body {SIZE} B, {N} rows: checkCRC off {off:,.0f} rows/s, on {on:,.0f} rows/s, "
                f"cost {100 * (1 - on / off):.1f}%"
            )
    finally:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()
