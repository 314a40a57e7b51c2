"""Disk and memory a store takes for 1, 1,000 and 1,000,000 messages of 100 bytes (issue 14): allocated blocks
(what ``du`` counts) while open and after close, and the resident memory the open store adds to the process.

Usage: python perf/footprint.py [rocketmq]   ("rocketmq": reserve whole segments and ConsumeQueue files up front,
as RocketMQ does and as localmq did before reservation steps; index files are sparse either way)
Each case runs in a fresh subprocess in a temporary directory that is deleted afterwards.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile

CASE = r"""
import json, os, sys, time
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) * 1024
def blocks(root):
    return sum(os.stat(os.path.join(d, n)).st_blocks * 512 for d, _, ns in os.walk(root) for n in ns)
import localmq
n, root, old = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
cfg = dict(reserve_step_commit_log=0, reserve_step_consume_queue=0) if old else {}
base = rss()
st = localmq.open(root, **cfg)
body = b"x" * 100
for i in range(0, n, 1000):
    st.put_batch("t", [body] * min(1000, n - i), keys=None)
st.put("t", body, keys="k")
st.wait_for_dispatch(120)
st.wait_for_index(120)
time.sleep(0.3)
out = {"open_blocks": blocks(root), "rss_added": rss() - base}
st.close()
out["closed_blocks"] = blocks(root)
print(json.dumps(out))
"""


def main():
    old = len(sys.argv) > 1 and sys.argv[1] == "rocketmq"
    print(
        f"{'messages':>10} {'open (du)':>12} {'closed (du)':>12} {'RSS added':>12}   "
        f"({'whole segments and queue files reserved, as RocketMQ' if old else 'defaults'})"
    )
    for n in (1, 1000, 1_000_000):
        d = tempfile.mkdtemp(prefix="lmq-footprint-")
        try:
            p = subprocess.run(
                [sys.executable, "-c", CASE, str(n - 1), os.path.join(d, "s"), "1" if old else "0"],
                capture_output=True,
                text=True,
                check=True,
            )
            r = json.loads(p.stdout.strip().splitlines()[-1])
        finally:
            shutil.rmtree(d, ignore_errors=True)
        mb = 1 << 20
        print(
            f"{n:>10,} {r['open_blocks'] / mb:>10.1f}MB {r['closed_blocks'] / mb:>10.1f}MB "
            f"{r['rss_added'] / mb:>10.1f}MB"
        )


if __name__ == "__main__":
    main()
