"""A shared store's dispatcher reads the log only up to the committed end (the control file's), never this process's
view of it past that end.

A put writes its record, or the blank record that closes a full segment, into the writer's own view of the log and
publishes it there before the commit moves the shared end. When the writer is also the housekeeper, its dispatcher
must not read that far: a writer killed before the commit leaves bytes that the next writer's repair zeroes and
writes over. A dispatcher that had stepped over the blank into the next segment, and published that position as
dispatched, made the next housekeeper start there: every record written over the torn tail of the old segment was
never indexed (a random SIGKILL test met it as queue offsets skipped by 3 or 4 in every queue, at a segment's start).
"""

import hashlib
import os
import subprocess
import sys
import time

import localmq
from helpers import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KW = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 4096)

# The first opener (the housekeeper) puts until its put rolls the log into a new segment; there, after the blank that
# closes the old segment was written and published in its view and the new segment exists, the put waits forever
# (the writer lock held, nothing committed) so that the test kills it at exactly that point.
ROLLER = """
import hashlib, sys, threading, time, localmq
q = localmq.open(sys.argv[1], shared=True, mapped_file_size_commit_log=1 << 20,
                 mapped_file_size_consume_queue=20 * 4096)
print("open", int(q.housekeeper), flush=True)
mfq = q._cl_mfq
orig = mfq.last_or_create
def rolling(start_offset=0):
    mf = orig(start_offset)
    if threading.current_thread() is threading.main_thread() and start_offset > 0:
        print("rolling", start_offset, flush=True)
        time.sleep(3600)
    return mf
mfq.last_or_create = rolling
i = 0
while True:
    body = b"w-%06d-" % i + b"x" * 1000
    r = q.put("T", body, queue_id=i % 4)
    print("ack", i % 4, r.queue_offset, hashlib.sha1(body).hexdigest(), flush=True)
    i += 1
"""


def test_a_housekeeper_killed_while_its_put_rolls_the_log_leaves_every_later_message_dispatched(tmp_path):
    root = tmp_path / "s"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
    w = subprocess.Popen([sys.executable, "-c", ROLLER, str(root)], stdout=subprocess.PIPE, env=env, text=True)
    q = None
    try:
        assert w.stdout.readline().split() == ["open", "1"]
        q = localmq.open(root, shared=True, **KW)
        assert not q.housekeeper
        expected = {}
        while True:
            line = w.stdout.readline().split()
            assert line, "the writer ended before its put rolled the log"
            if line[0] == "rolling":
                assert int(line[1]) == 1 << 20
                break
            expected[(int(line[1]), int(line[2]))] = line[3]
        # the writer's dispatcher has what was committed; give it time to read further if it would
        assert wait_until(lambda: q.dispatch_behind_bytes == 0, 20)
        time.sleep(0.5)
        w.kill()
        w.wait(10)
        assert wait_until(lambda: q.housekeeper, 10)  # the survivor takes the dispatch over
        for i in range(40):
            body = b"q-%06d-" % i + b"y" * 100
            r = q.put("T", body, queue_id=i % 4)  # the first repairs the dead writer's put (zeroes its bytes)
            assert r.ok
            expected[(i % 4, r.queue_offset)] = hashlib.sha1(body).hexdigest()
        assert q.commit_log.repairs == 1
        assert q.wait_for_dispatch(20)
        got = {}
        for qid in range(4):
            off = 0
            while True:
                r = q.get_message("T", qid, off, 256)
                if not r.messages:
                    break
                for m in r.messages:
                    assert m.queue_offset == off
                    got[(qid, off)] = hashlib.sha1(bytes(m.body)).hexdigest()
                    off += 1
            assert off == q.max_offset("T", qid)
        assert got == expected
    finally:
        if w.poll() is None:
            w.kill()
            w.wait(10)
        w.stdout.close()
        if q is not None:
            q.close()
