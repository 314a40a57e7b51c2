"""A new queue's first file is made off the dispatcher's thread (issue 27: no other queue's dispatch waits for a new
queue's file system work). While it is made, the new queue's units wait in memory: its messages are not readable, the
dispatched offset (``progress``, ``wait_for_dispatch``) stays before the first of them, and the checkpoint claims
nothing from there on, so a kill then loses nothing. Every other queue is dispatched meanwhile.

The maker is slowed down through its ``make`` hook (a gate the test opens), or made to fail; the files, units and
checkpoint are read back from disk and compared with what the puts returned.
"""

import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import localmq
from helpers import cq_file, queue_messages, read_bytes, wait_until
from localmq.layout import CHECKPOINT, CQ_UNIT_SIZE

REPO = Path(__file__).resolve().parent.parent
KW = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 1024)


def _gated(st):
    """Hold the maker before it makes a file until the returned event is set; returns (gate, entered)."""
    maker = st._queue_file_maker
    real = maker.make
    gate, entered = threading.Event(), threading.Event()

    def make(cq, base):
        entered.set()
        assert gate.wait(30)
        real(cq, base)

    maker.make = make
    return gate, entered


def _logics_ts(root):
    return CHECKPOINT.unpack(read_bytes(os.path.join(root, "checkpoint"), 0, CHECKPOINT.size))[1]


def _unit(root, topic, qid, index):
    path, pos = cq_file(Path(root), topic, qid, index, KW["mapped_file_size_consume_queue"])
    return struct.unpack(">qiq", read_bytes(path, pos, CQ_UNIT_SIZE))


def test_other_queues_are_dispatched_while_a_new_queue_file_is_made(tmp_path):
    root = str(tmp_path / "s")
    with localmq.open(root, **KW) as st:
        st.put("busy", b"b0")
        assert st.wait_for_dispatch(10)
        made = st.stats()["queue_file_maker"]["queue_files_made_ahead"]  # busy's file
        gate, entered = _gated(st)
        before = st.progress
        r_new = st.put("fresh", b"first message of a new queue", queue_id=2, keys="k1")
        for i in range(1, 6):
            st.put("busy", b"b%d" % i)
        assert entered.wait(10)
        # the busy queue's messages are readable although the new queue's file is not made yet
        assert wait_until(lambda: st.max_offset("busy", 0) == 6)
        assert [m.body for m in queue_messages(st, "busy", wait=False)] == [b"b%d" % i for i in range(6)]
        assert st.max_offset("fresh", 2) == 0
        assert not os.path.exists(os.path.join(root, "consumequeue", "fresh"))
        # what waiters and the checkpoint see stays before the waiting record
        assert before <= st.progress <= r_new.physical_offset
        assert not st.wait_for_dispatch(0.3)
        assert st.stats()["dispatch_waiting_queues"] == 1
        st._cq_flush_service.flush_once(0)  # a thorough pass: moves the checkpoint's logical time
        # the busy queue's units are flushed, and stored no earlier than the waiting one: the checkpoint still claims
        # only what is before the waiting record
        assert 0 < _logics_ts(root) < r_new.store_timestamp

        gate.set()
        assert st.wait_for_dispatch(10)
        assert st.progress == st.stats()["commit_log_max_offset"]
        assert st.stats()["dispatch_waiting_queues"] == 0
        assert st.stats()["queue_file_maker"]["queue_files_made_ahead"] == made + 1
        [m] = queue_messages(st, "fresh", 2)
        assert (m.body, m.keys, m.queue_offset) == (b"first message of a new queue", ("k1",), 0)
        assert _unit(root, "fresh", 2, 0)[:2] == (r_new.physical_offset, r_new.wrote_bytes)
    with localmq.open(root, **KW) as st:  # a clean close wrote it where it belongs
        [m] = queue_messages(st, "fresh", 2)
        assert m.body == b"first message of a new queue"


def test_a_file_the_maker_could_not_make_is_made_by_the_dispatcher(tmp_path):
    root = str(tmp_path / "s")
    with localmq.open(root, **KW) as st:
        maker = st._queue_file_maker

        def fail(cq, base):
            raise OSError(5, "Input/output error (injected)")

        maker.make = fail
        for q in range(3):
            st.put("t", b"m%d" % q, queue_id=q)
        assert st.wait_for_dispatch(10)
        assert st.stats()["queue_file_maker"] == {"queue_files_made_ahead": 0, "queue_files_not_made_ahead": 3}
        for q in range(3):
            assert [m.body for m in queue_messages(st, "t", q)] == [b"m%d" % q]


def test_a_queue_file_nobody_can_make_blocks_dispatch_and_loses_nothing(tmp_path):
    root = str(tmp_path / "s")
    with localmq.open(root, **KW) as st:
        st.put("a", b"a0")
        assert st.wait_for_dispatch(10)
        # a plain file where the topic's directory must go: mkdir fails for the maker and for the dispatcher
        obstacle = os.path.join(root, "consumequeue", "blocked")
        with open(obstacle, "wb"):
            pass
        gate, entered = _gated(st)
        st.put("blocked", b"x0")
        assert st.put("a", b"a1").ok
        assert entered.wait(10)
        assert wait_until(lambda: st.max_offset("a", 0) == 2)  # not held up by the queue waiting for its file
        gate.set()  # the maker fails; the dispatcher tries itself, fails too and blocks (puts are refused)
        assert wait_until(lambda: st.stats()["dispatch_blocked"] is not None)
        assert not st.wait_for_dispatch(0.3)
        assert st.max_offset("blocked", 0) == 0
        assert st.stats()["queue_file_maker"]["queue_files_not_made_ahead"] == 1
        os.unlink(obstacle)
        assert st.wait_for_dispatch(10), st.stats()["dispatch_blocked"]
        assert wait_until(lambda: st.stats()["dispatch_blocked"] is None)
        assert [m.body for m in queue_messages(st, "blocked")] == [b"x0"]
        assert [m.body for m in queue_messages(st, "a")] == [b"a0", b"a1"]


CHILD = textwrap.dedent("""
    import sys, threading, time
    import localmq
    root = sys.argv[1]
    st = localmq.open(root, mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 1024)
    st.put("old", b"o" * 100)
    assert st.wait_for_dispatch(10)
    gate = threading.Event()
    real = st._queue_file_maker.make
    st._queue_file_maker.make = lambda cq, base: (gate.wait(120), real(cq, base))
    r = st.put("fresh", b"waiting for its file", queue_id=1)
    # later records in later segments, more than the checkpoint's 3 s slack after it: a checkpoint that claimed the
    # busy queue's time would start a recovery past the waiting record's segment (three batches: the checkpoint's
    # log time may lag one flush behind)
    for k in range(3):
        time.sleep(3.2)
        for i in range(40):
            st.put("old", b"%d" % k * 2000)
    t = time.monotonic()
    while st.max_offset("old", 0) < 121 and time.monotonic() - t < 10:
        time.sleep(0.01)
    st._cq_flush_service.flush_once(0)
    st._flush_service.wakeup()
    time.sleep(1.0)  # the commit log's flush (500 ms)
    print(r.physical_offset, flush=True)
    time.sleep(60)
""")


def test_a_kill_while_a_queue_file_is_made_loses_no_message(tmp_path):
    root = str(tmp_path / "s")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-c", CHILD, root], stdout=subprocess.PIPE, env=env, text=True)
    try:
        line = p.stdout.readline()
        assert line, "the child died"
        wrote = int(line)
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        p.wait(30)
        p.stdout.close()
    assert wrote < 64 * 1024  # in the first segment; later segments hold the later records
    assert _logics_ts(root) > 0
    with localmq.open(root, **KW) as st:
        assert st.recovery.mode == "abnormal"
        fresh = [(m.body, m.physical_offset) for m in queue_messages(st, "fresh", 1)]
        assert fresh == [(b"waiting for its file", wrote)]
        assert st.max_offset("old", 0) == 121
