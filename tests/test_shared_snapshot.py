"""The queue snapshot of a store shared between processes (issue 27): the first opener checks every row the snapshot
kept and hands the rows to whichever process closes the store last (``config/queues.handover``); that process writes
``queues.snapshot`` from them and from what the processes changed since. Real processes, real SIGKILLs."""

import hashlib
import os
import signal
import subprocess
import sys
import time

import localmq
from helpers import cq_file, queue_messages, wait_until
from localmq.layout import CQ_UNIT_SIZE
from localmq.store.queue_snapshot import FRESH_NS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KW = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * CQ_UNIT_SIZE)
TOPICS = [f"t{i}" for i in range(12)]
QUEUES = 4
PER_QUEUE = 3


def body(topic, q, i):
    return f"{topic}/{q}/{i}".encode() * 8


def fill(root):
    """One run of one process: PER_QUEUE messages in each queue, then a clean close (it writes the snapshot)."""
    with localmq.open(root, shared=True, **KW) as st:
        for i in range(PER_QUEUE):
            for t in TOPICS:
                for q in range(QUEUES):
                    assert st.put(t, body(t, q, i), queue_id=q).ok
        assert st.wait_for_dispatch(10)
        time.sleep(2 * FRESH_NS / 1e9)  # older than what a close leaves unvouched


def config(root):
    return sorted(os.listdir(root / "config"))


# a second process: opens the store, puts what it is told (topic/queue:count ...), says "put", closes when told
OTHER = r"""
import sys, localmq
root, kw, plan = sys.argv[1], eval(sys.argv[2]), sys.argv[3:]
st = localmq.open(root, shared=True, **kw)
for item in plan:
    tq, n = item.split(":")
    t, q = tq.split("/")
    for i in range(int(n)):
        assert st.put(t, (f"{t}/{q}/x{i}").encode() * 8, queue_id=int(q)).ok
print("put", flush=True)
if sys.stdin.readline().strip() == "close":
    st.close()
    print("closed", flush=True)
"""


def start_other(root, *plan):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen(
        [sys.executable, "-c", OTHER, str(root), repr(KW), *plan],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert p.stdout.readline().strip() == "put"
    return p


def expected(extra):
    """{(topic, queue): [sha1 of each body]} after fill and the other process's puts ``extra``."""
    out = {(t, q): [body(t, q, i) for i in range(PER_QUEUE)] for t in TOPICS for q in range(QUEUES)}
    for (t, q), n in extra.items():
        out.setdefault((t, q), []).extend((f"{t}/{q}/x{i}").encode() * 8 for i in range(n))
    return {k: [hashlib.sha1(b).hexdigest() for b in v] for k, v in out.items()}


def read_all(st, keys):
    return {k: [hashlib.sha1(bytes(m.body)).hexdigest() for m in queue_messages(st, *k)] for k in keys}


def test_the_last_closer_writes_the_snapshot_from_the_first_openers_handover(tmp_path):
    root = tmp_path / "s"
    fill(root)
    assert "queues.snapshot" in config(root)
    first = localmq.open(root, shared=True, **KW)  # the first opener: every queue from the snapshot, checked
    try:
        assert first.recovery.cq_vouched == len(TOPICS) * QUEUES
        assert first.stats()["consume_queues_built"] == 0
        # the snapshot is gone, the rows handed over (by a thread of the first opener, once open)
        assert wait_until(lambda: config(root) == ["localmq.json", "queues.handover"], 10)
        # another process writes to five queues and makes a topic; the first opener dispatches, and leaves first
        other = start_other(root, "t0/0:2", "t1/0:2", "t2/3:1", "t3/1:1", "t4/2:4", "new/0:1", "new/1:3")
        assert first.wait_for_dispatch(10)
    finally:
        first.close()
    assert "queues.handover" in config(root)  # not the last to leave: nothing written
    other.stdin.write("close\n")
    other.stdin.flush()
    assert other.stdout.readline().strip() == "closed"
    assert other.wait(30) == 0
    other.stdin.close()
    other.stdout.close()
    assert config(root) == ["localmq.json", "queues.snapshot"]
    extra = {("t0", 0): 2, ("t1", 0): 2, ("t2", 3): 1, ("t3", 1): 1, ("t4", 2): 4, ("new", 0): 1, ("new", 1): 3}
    want = expected(extra)
    with localmq.open(root, shared=True, **KW) as st:
        # the queues nobody wrote are vouched for by the rows written back; the others are checked by the open
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES - 5
        assert not set(extra) & set(st._cq_table.vouched)
        assert read_all(st, want) == want
    with localmq.open(root, shared=True, **KW) as st:  # that close wrote every queue it read: all vouched
        assert st.recovery.cq_vouched == len(want)
        assert read_all(st, want) == want


def test_a_queue_file_changed_behind_a_closed_shared_store_is_repaired_before_another_process_reads_it(tmp_path):
    root = tmp_path / "s"
    fill(root)
    path, _ = cq_file(root, "t5", 2, 0, KW["mapped_file_size_consume_queue"])
    with open(path, "r+b") as f:  # the second unit points at the first record: a write behind the closed store
        first_unit = f.read(CQ_UNIT_SIZE)
        f.write(first_unit)
    want = expected({})
    with localmq.open(root, shared=True, **KW) as st:
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES
        # a process that attaches now loads the queue from its files: the repaired ones
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
        script = (
            "import sys, hashlib, localmq\n"
            "sys.path.insert(0, sys.argv[3])\n"
            "from helpers import queue_messages\n"
            "st = localmq.open(sys.argv[1], shared=True, **eval(sys.argv[2]))\n"
            "print(' '.join(hashlib.sha1(bytes(m.body)).hexdigest() for m in queue_messages(st, 't5', 2)))\n"
            "st.close()\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script, str(root), repr(KW), os.path.join(REPO, "tests")],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == want[("t5", 2)]
        # found by the first opener's check of every row, before anyone attached
        assert st.recovery.repaired and ("t5", 2) in st._cq_table.built
        assert read_all(st, want) == want


KILLED = r"""
import sys, localmq
st = localmq.open(sys.argv[1], shared=True, **eval(sys.argv[2]))
for q in range(4):
    assert st.put("k", b"killed-%d" % q, queue_id=q).ok
assert st.wait_for_dispatch(10)
print("ready", flush=True)
sys.stdin.readline()
"""


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait(10)
    p.stdin.close()
    p.stdout.close()


def test_after_a_crash_the_first_opener_hands_over_every_queue_it_checked(tmp_path):
    root = tmp_path / "s"
    fill(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    p = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(root), repr(KW)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert p.stdout.readline().strip() == b"ready"
        assert wait_until(lambda: "queues.handover" in config(root), 10)
    finally:
        kill(p)
    want = expected({})
    want.update({("k", q): [hashlib.sha1(b"killed-%d" % q).hexdigest()] for q in range(QUEUES)})
    with localmq.open(root, shared=True, **KW) as st:
        assert st.recovery.mode == "abnormal"
        assert st.recovery.cq_vouched == 0  # the crashed run's handover is not a snapshot: every queue checked
        # this open's, from every queue it checked
        assert wait_until(lambda: config(root) == ["localmq.json", "queues.handover"], 10)
        time.sleep(2 * FRESH_NS / 1e9)
    with localmq.open(root, shared=True, **KW) as st:
        assert st.recovery.cq_vouched == len(want)
        assert read_all(st, want) == want
    # an exclusive open deletes a handover a crashed shared run left
    p = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(root), repr(KW)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert p.stdout.readline().strip() == b"ready"
        assert wait_until(lambda: "queues.handover" in config(root), 10)
    finally:
        kill(p)
    want.update({("k", q): want[("k", q)] * 2 for q in range(QUEUES)})
    with localmq.open(root, **KW) as st:
        assert "queues.handover" not in config(root)
        assert read_all(st, want) == want
