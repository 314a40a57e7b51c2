"""Delayed messages delivered twice after a SIGKILL (issue 25 item 4): the re-delivery window, measured.

Usage (from the repository root, after ``python setup.py build_ext --inplace``):

    python perf/delay_redelivery.py [--messages 4000] [--kills 10] [--interval MS] [--shared] [--seed 1]

Each round runs a child process that opens a fresh store (one delay level of 3 s), sends ``--messages``
delayed messages with unique bodies, paced over 2 s, so that deliveries flow from 3 s to 5 s after the first
send; the parent SIGKILLs the child at a random moment of that flow (3.2 s to 4.8 s), reopens the store in the
parent with the same settings, waits until the schedule queue is delivered to its end, and counts per body how
often it is in the real topic: lost (must be 0) and duplicated. ``--interval`` sets
``flush_delay_offset_interval`` in the child (default: the store's default); ``--shared`` opens both with
``shared=True`` (the child is the housekeeper that delivers). Prints one line per kill, then min/median/max
of the duplicates. Stores live in a temporary directory that is deleted afterwards.
"""

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LEVELS = "3s"
SPREAD_S = 2.0
SMALL = {"mapped_file_size_commit_log": 1 << 24, "mapped_file_size_consume_queue": 300_000}

CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import localmq
path, n, spread, settings = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), json.loads(sys.argv[5])
st = localmq.open(path, **settings)
p = st.create_producer(queue_id=0)
print("start", flush=True)
t0 = time.monotonic()
chunk = max(1, n // 200)
for i in range(0, n, chunk):
    for j in range(i, min(n, i + chunk)):
        p.send("t", b"m%07d" % j, delay_level=1)
    wait = t0 + spread * (i + chunk) / n - time.monotonic()
    if wait > 0:
        time.sleep(wait)
print("sent", flush=True)
time.sleep(60)
"""


def _settings(args):
    s = dict(SMALL, message_delay_level=LEVELS)
    if args.interval is not None:
        s["flush_delay_offset_interval"] = args.interval
    if args.shared:
        s["shared"] = True
    return s


def one_round(args, rng, path):
    """Run, kill and reopen once. Returns (delivered before the kill, lost, duplicates)."""
    import json

    import localmq
    from localmq.status import GetStatus
    from localmq.store.config_json import read_config_json

    settings = _settings(args)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, ROOT, path, str(args.messages), str(SPREAD_S), json.dumps(settings)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        if child.stdout.readline().strip() != "start":
            raise RuntimeError("the child did not start")
        t0 = time.monotonic()
        if child.stdout.readline().strip() != "sent":
            raise RuntimeError("the child did not send everything")
        kill_at = t0 + rng.uniform(3.2, 4.8)
        time.sleep(max(0.0, kill_at - time.monotonic()))
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    doc = read_config_json(os.path.join(path, "config", "delayOffset.json"), default=None)
    persisted = (doc or {}).get("offsetTable", {}).get(1, 0)  # what the child had written when killed
    with localmq.open(path, **settings) as st:
        svc = st.schedule_service
        end = st.max_offset("SCHEDULE_TOPIC_XXXX", 0)
        if end != args.messages:
            raise RuntimeError(f"the schedule queue holds {end} units, not {args.messages}")
        deadline = time.monotonic() + 60
        while svc.offsets.get(1, 0) < end:
            if time.monotonic() > deadline:
                raise RuntimeError(f"not delivered within 60 s: {svc.offsets}")
            time.sleep(0.05)
        st.wait_for_dispatch(30)
        counts = {}
        off = 0
        while True:
            r = st.get_message("t", 0, off, max_messages=1000)
            if r.status is not GetStatus.FOUND:
                break
            for m in r.messages:
                counts[m.body] = counts.get(m.body, 0) + 1
            off = r.next_begin_offset
    lost = sum(1 for i in range(args.messages) if b"m%07d" % i not in counts)
    dups = sum(c - 1 for c in counts.values())
    return persisted, lost, dups


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=4000)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--interval", type=int, default=None, help="flush_delay_offset_interval (ms)")
    ap.add_argument("--shared", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    import localmq

    print(
        f"localmq from {localmq.__file__}; {args.messages} messages, delay {LEVELS}, "
        f"flush_delay_offset_interval={args.interval if args.interval is not None else 'default'}"
        f"{', shared' if args.shared else ''}"
    )
    rng = random.Random(args.seed)
    dups_all, lost_all = [], 0
    with tempfile.TemporaryDirectory(prefix="lmq-delay-") as tmp:
        for k in range(args.kills):
            path = os.path.join(tmp, f"s{k}")
            persisted, lost, dups = one_round(args, rng, path)
            print(f"kill {k + 1}: persisted offset {persisted}, lost {lost}, duplicates {dups}", flush=True)
            dups_all.append(dups)
            lost_all += lost
    print(f"duplicates min {min(dups_all)} median {statistics.median(dups_all)} max {max(dups_all)}; lost {lost_all}")
    return 1 if lost_all else 0


if __name__ == "__main__":
    sys.exit(main())
