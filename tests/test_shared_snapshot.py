"""The queue snapshot of a store shared between processes (issue 27): the first opener checks every row the snapshot
kept and hands the rows to whichever process closes the store last (``config/queues.handover``); that process writes
``queues.snapshot`` from them and from what the processes changed since. Real processes, real SIGKILLs."""

import hashlib
import os
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest

import localmq
import localmq.queues.shared as shared_module
import localmq.store.queue_snapshot as queue_snapshot
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


def config_but_cut(root):
    """config/ without the housekeeper's running cut (queues.running, written beside the running store)."""
    return [n for n in config(root) if not n.startswith("queues.running")]


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


def close_other(p):
    """Tell a process of start_other (or LATE) to close the store, and wait for it."""
    p.stdin.write("close\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "closed"
    assert p.wait(30) == 0
    p.stdin.close()
    p.stdout.close()


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
        assert wait_until(lambda: config_but_cut(root) == ["localmq.json", "queues.handover"], 10)
        # another process writes to five queues and makes a topic; the first opener dispatches, and leaves first
        other = start_other(root, "t0/0:2", "t1/0:2", "t2/3:1", "t3/1:1", "t4/2:4", "new/0:1", "new/1:3")
        assert first.wait_for_dispatch(10)
    finally:
        first.close()
    assert "queues.handover" in config(root)  # not the last to leave: nothing written
    close_other(other)
    assert config_but_cut(root) == ["localmq.json", "queues.snapshot"]
    extra = {("t0", 0): 2, ("t1", 0): 2, ("t2", 3): 1, ("t3", 1): 1, ("t4", 2): 4, ("new", 0): 1, ("new", 1): 3}
    want = expected(extra)
    with localmq.open(root, shared=True, **KW) as st:
        # the queues nobody wrote are vouched for by the rows written back; the others are checked by the open
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES - 5
        assert not set(extra) & set(st._cq_table.vouched)
        # only the queues of those topics were built (a topic's next offsets are checked together): the closer (not
        # the first opener) made its queues' min offsets right for the log's start, so the open took the rows' as
        # they were instead of building every queue to correct them
        used = {(t, q) for t, _ in extra for q in range(QUEUES) if t in TOPICS} | {("new", 0), ("new", 1)}
        assert set(st._cq_table.built) == used
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


def crash_shared(root, kw=KW, cut=True):
    """A process opens the store shared (the first opener: it hands its rows over), puts to topic k, and is killed
    once its housekeeper wrote a running cut from the handover (``cut``; else at once)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    snapshot = root / "config" / "queues.snapshot"
    closed = snapshot.read_bytes()[4:] if snapshot.exists() else None  # kept by the open as its first cut
    running = root / "config" / "queues.running"
    p = subprocess.Popen(
        [sys.executable, "-c", KILLED, str(root), repr(kw)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    try:
        assert p.stdout.readline().strip() == b"ready"
        # (the cut is written once the log is flushed past it: the log's thorough flush comes every 10 s)
        assert not cut or wait_until(
            lambda: "queues.handover" in config(root) and running.exists() and running.read_bytes()[4:] != closed, 30
        ), config(root)
    finally:
        kill(p)


def test_after_a_crash_the_first_opener_hands_over_every_queue_it_checked(tmp_path):
    root = tmp_path / "s"
    fill(root)
    crash_shared(root)
    want = expected({})
    want.update({("k", q): [hashlib.sha1(b"killed-%d" % q).hexdigest()] for q in range(QUEUES)})
    filled = {(t, q) for t in TOPICS for q in range(QUEUES)}
    with localmq.open(root, shared=True, **KW) as st:
        assert st.recovery.mode == "abnormal"
        # the crashed housekeeper's running cut holds the handed-over rows of the queues nobody wrote; topic k, made
        # after the handover, was listed by it (its queues checked), unless a later cut vouched for them
        assert filled <= set(st._cq_table.vouched) and st.recovery.cq_vouched in (len(filled), len(want))
        assert read_all(st, want) == want
        # this open's, from every queue it checked
        assert wait_until(lambda: config_but_cut(root) == ["localmq.json", "queues.handover"], 10)
        time.sleep(2 * FRESH_NS / 1e9)
    with localmq.open(root, shared=True, **KW) as st:
        assert st.recovery.cq_vouched == len(want)
        assert read_all(st, want) == want
    # an exclusive open deletes a handover a crashed shared run left
    crash_shared(root)
    want.update({("k", q): want[("k", q)] * 2 for q in range(QUEUES)})
    with localmq.open(root, **KW) as st:
        assert "queues.handover" not in config(root)
        assert read_all(st, want) == want


def test_a_crash_before_the_housekeepers_first_cut_opens_from_the_clean_close_snapshot_kept_as_the_cut(tmp_path):
    # the first opener's open keeps the close's snapshot as the running store's first cut; its housekeeper's own
    # first cut is an hour away (its queue flush's first pass): the open after the crash takes every queue of the
    # snapshot from it, checks topic k's (made after it) and loses nothing
    root = tmp_path / "s"
    fill(root)
    crash_shared(root, dict(KW, flush_interval_consume_queue=3_600_000), cut=False)
    assert (root / "config" / "queues.running").read_bytes()[:4] == b"LMQR"
    want = expected({})
    want.update({("k", q): [hashlib.sha1(b"killed-%d" % q).hexdigest()] for q in range(QUEUES)})
    with localmq.open(root, shared=True, **KW) as st:
        assert st.recovery.mode == "abnormal"
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES
        assert read_all(st, want) == want


def test_after_a_crash_the_next_open_takes_the_queues_nobody_wrote_from_the_housekeepers_running_cut(tmp_path):
    # the first opener leaves first; the other process, housekeeper from then on, takes its cut from the first
    # opener's handover and is killed: the queues written since the handover are listed by the cut, not vouched for
    # (their unit counts in the control file moved), and checked by the open; every other queue is vouched for
    root = tmp_path / "s"
    fill(root)
    running = root / "config" / "queues.running"
    first = localmq.open(root, shared=True, **KW)
    try:
        assert wait_until(lambda: "queues.handover" in config(root), 10)
        other = start_other(root, "t0/0:2", "t1/3:1", "new/0:2")
        assert first.wait_for_dispatch(10)
    finally:
        first.close()
    try:
        if running.exists():
            running.unlink()  # the first opener's cut: the other process writes its own
        assert wait_until(running.exists, 30)
    finally:
        kill(other)
    extra = {("t0", 0): 2, ("t1", 3): 1, ("new", 0): 2}
    want = expected(extra)
    written = set(extra)
    with localmq.open(root, shared=True, **KW) as st:
        assert st.recovery.mode == "abnormal"
        assert set(st._cq_table.vouched) == {(t, q) for t in TOPICS for q in range(QUEUES)} - written
        assert read_all(st, want) == want
        assert st.put("t0", b"next", queue_id=0).queue_offset == PER_QUEUE + 2


KW2 = dict(
    mapped_file_size_commit_log=1 << 16,
    mapped_file_size_consume_queue=20 * CQ_UNIT_SIZE,
    flush_consume_queue_thorough_interval=300,
    flush_commit_log_thorough_interval=200,
)

FIRST = r"""
import os, sys, time, localmq
import localmq.queues.shared as sh
root, kw, gate = sys.argv[1], eval(sys.argv[2]), sys.argv[3]
take = sh.SharedMessageQueue._try_become_housekeeper
# the first opener loses the housekeeper's election (as a process that attaches between its open's end and its
# own try can make it lose; tests/test_shared_snapshot.py patches the same way)
sh.SharedMessageQueue._try_become_housekeeper = lambda self: take(self) if os.path.exists(gate) else False
st = localmq.open(root, shared=True, **kw)
assert st.first_opener and not st.housekeeper
print("open", ("t", 0) in st._cq_table.rows, flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "min":
        print("min", st.min_offset("t", 0), st.max_offset("t", 0), flush=True)
    elif cmd == "hk":
        t0 = time.monotonic()
        while not st.housekeeper and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        print("hk", st.housekeeper, flush=True)
"""

OTHER2 = r"""
import sys, time, localmq
root, kw = sys.argv[1], eval(sys.argv[2])
st = localmq.open(root, shared=True, **kw)
t0 = time.monotonic()
while not st.housekeeper and time.monotonic() - t0 < 10:
    time.sleep(0.05)
assert st.housekeeper
assert st.put("t", b"other", queue_id=0).ok
assert st.wait_for_dispatch(10)
print("put", st.min_offset("t", 0), st.max_offset("t", 0), flush=True)
sys.stdin.readline()
st.close()
print("closed", flush=True)
"""


def spawn_script(script, *args):
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])},
        text=True,
    )


def ask(p, cmd):
    p.stdin.write(cmd + "\n")
    p.stdin.flush()
    return p.stdout.readline().split()


def test_a_row_another_process_wrote_to_gets_its_min_offset_right_and_a_cut_keeps_it_right(tmp_path):
    # retention moved the log's start (queue t/0's min offset 3); the first opener loses the housekeeper's election,
    # the other process dispatches a put to t/0 (still a row in the first opener, so its check fails there and it
    # is loaded from its files), then leaves; the first opener, housekeeper from then on, takes a cut and is killed
    root = tmp_path / "s"
    with localmq.open(root, shared=True, disk_usage=lambda p: 0.9, **KW2) as st:
        for i in range(3):
            assert st.put("t", b"early-%d" % i, queue_id=0).ok
        for _ in range(150):
            assert st.put("t", b"x" * 1000, queue_id=1).ok
        for i in range(3):
            assert st.put("t", b"late-%d" % i, queue_id=0).ok
        assert st.wait_for_dispatch(10)
        st.clean_service.run_once()  # retention: the first segments go (the disk looks 90 % full)
        assert st.commit_log_min_offset > 0
        want_min = st.min_offset("t", 0)
        assert want_min == 3, want_min
        time.sleep(3 * FRESH_NS / 1e9)
    with localmq.open(root, shared=True, **KW2) as st:  # its snapshot's min offsets are right for the new start
        assert st.min_offset("t", 0) == want_min
        time.sleep(3 * FRESH_NS / 1e9)
    gate = tmp_path / "gate"
    first = spawn_script(FIRST, root, repr(KW2), gate)
    other = None
    try:
        assert first.stdout.readline().split() == ["open", "True"]
        other = spawn_script(OTHER2, root, repr(KW2))
        line = other.stdout.readline().split()
        assert line[0] == "put", line
        got = ask(first, "min")
        running_min = int(got[1])
        time.sleep(0.3)
        gate.write_text("")
        other.stdin.write("close\n")
        other.stdin.flush()
        assert other.stdout.readline().strip() == "closed"
        other.wait(30)
        assert ask(first, "hk") == ["hk", "True"]
        running = root / "config" / "queues.running"
        t0 = time.time()
        # a cut written after the first opener took the housekeeping over (well before its first retention pass)
        cut = wait_until(lambda: running.exists() and running.stat().st_mtime > t0 + 0.8, 8)
        assert cut
    finally:
        kill(first)
        if other is not None:
            kill(other)
    with localmq.open(root, shared=True, **KW2) as st:
        assert st.recovery.mode == "abnormal"
        vouched = ("t", 0) in st._cq_table.vouched
        after = st.min_offset("t", 0)
    assert running_min == want_min, f"first opener's min offset {running_min}, the queue's is {want_min}"
    assert after == want_min, f"after the crash the min offset is {after} (vouched={vouched}), not {want_min}"
    assert vouched  # taken from the cut


LATE = r"""
import sys, localmq
st = localmq.open(sys.argv[1], shared=True, **eval(sys.argv[2]))
assert st.housekeeper
for i in range(3):
    assert st.put("t", b"late-%d" % i, queue_id=5).ok
for i in range(400):  # records after it over more than three segments: recovery's walk does not reach it
    assert st.put("t", b"x" * 1000, queue_id=0).ok
assert st.wait_for_dispatch(10)
print("put", flush=True)
sys.stdin.readline()
st.close()
print("closed", flush=True)
"""


def test_a_queue_another_process_makes_while_the_handover_is_written_is_in_the_next_snapshot(tmp_path, monkeypatch):
    # the first opener lost the housekeeper's election; another process's dispatcher makes queue t/5 in an old topic
    # before the handover thread writes: the handover is stamped with the clock read before any other process came
    # in, so the topic's directory, changed later, is listed by the last closer, and t/5 is in the next snapshot
    kw = dict(mapped_file_size_commit_log=1 << 16, mapped_file_size_consume_queue=20 * CQ_UNIT_SIZE)
    root = tmp_path / "s"
    with localmq.open(root, shared=True, **kw) as st:
        for q in range(4):
            assert st.put("t", b"old-%d" % q, queue_id=q).ok
        assert st.wait_for_dispatch(10)
        time.sleep(2 * FRESH_NS / 1e9)
    go = threading.Event()
    write = queue_snapshot.write_snapshot

    def late_write(*a, **k):  # the handover thread, late (GIL, CPU)
        assert go.wait(30)
        return write(*a, **k)

    monkeypatch.setattr(queue_snapshot, "write_snapshot", late_write)
    lost = [True]
    take = shared_module.SharedMessageQueue._try_become_housekeeper
    monkeypatch.setattr(
        shared_module.SharedMessageQueue, "_try_become_housekeeper", lambda self: False if lost[0] else take(self)
    )
    first = localmq.open(root, shared=True, **kw)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    other = subprocess.Popen(
        [sys.executable, "-c", LATE, str(root), repr(kw)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    running = root / "config" / "queues.running"
    try:
        assert first.first_opener and not first.housekeeper
        carried = running.stat().st_ino  # the close's snapshot, kept by the first opener's open as the first cut
        assert other.stdout.readline().strip() == "put"
        # t/5 made well before the handover is written, and after the housekeeper's first (thorough) queue flush pass
        time.sleep(2.5)
        go.set()
        assert wait_until(lambda: "queues.handover" in config(root), 10)
        # the housekeeper (the other process) met no handover at its first thorough pass: it takes its first cut
        # once the handover is there, not a thorough interval (60 s) later (written once the log is flushed past it)
        assert running.stat().st_ino == carried
        assert wait_until(lambda: running.stat().st_ino != carried, 30)
        lost[0] = False
    finally:
        go.set()
        first.close()
    close_other(other)
    with localmq.open(root, shared=True, **kw) as st:
        assert [bytes(m.body) for m in queue_messages(st, "t", 5)] == [b"late-%d" % i for i in range(3)]
        assert st.put("t", b"after", queue_id=5).queue_offset == 3


def test_the_compiled_row_check_refuses_rows_no_close_writes_and_files_that_went(tmp_path):
    from localmq._snapshot import ROW_CHANGED, ROW_DISAGREES, ROW_HOLDS, QueueRow, check_rows

    fs = 10 * CQ_UNIT_SIZE
    q = tmp_path / "q"
    q.mkdir()
    units = b"".join(struct.pack(">qiq", 100 * i, 50, 0) for i in range(3))
    (q / ("%020d" % 0)).write_bytes(units.ljust(fs, b"\0"))
    d, f = os.lstat(q), os.lstat(q / ("%020d" % 0))
    dev = os.stat(tmp_path).st_dev

    def row(max_offset, max_phys=250):
        return QueueRow(d.st_ctime_ns, d.st_ino, max_offset, 0, max_phys, [(0, f.st_ctime_ns, f.st_ino)])

    qdir = os.fsencode(q)
    assert check_rows([qdir], [row(3)], fs, dev, 0) == [ROW_HOLDS]
    # offsets past what any close writes (their products would overflow 64 bits): not the row of these files; a last
    # record's end no unit has: a row that lies about its units
    assert check_rows([qdir, qdir], [row(2**62 + 3), row(3, 2**63 - 1)], fs, dev, 0) == [ROW_CHANGED, ROW_DISAGREES]
    (q / ("%020d" % 0)).unlink()
    assert check_rows([qdir], [row(3)], fs, dev, 0) == [ROW_CHANGED]
    with pytest.raises(TypeError):
        check_rows([str(q)], [row(3)], fs, dev, 0)
