"""Processes of a shared store SIGKILLed at chosen points of the put and dispatch protocol; whatever was acknowledged,
and everything put after, is dispatched and read back, each queue's offsets dense.

A put writes its record, or the blank record that closes a full segment, into the writer's own view of the log and
publishes it there before the commit moves the shared end. When the writer is also the housekeeper, its dispatcher
must not read that far: a writer killed before the commit leaves bytes that the next writer's repair zeroes and
writes over. A dispatcher that had stepped over the blank into the next segment, and published that position as
dispatched, made the next housekeeper start there: every record written over the torn tail of the old segment was
never indexed (a random SIGKILL test met it as queue offsets skipped by 3 or 4 in every queue at a segment's start;
``test_a_process_killed_at_a_point_of_the_protocol_loses_nothing[housekeeper-roll]`` fails without the fix).

Each point is a Python-level step of the protocol that the worker (a real process) wraps to announce itself and then
wait forever, so the test kills it exactly there:
- ``roll``: a put (or a batch, whose records before the roll are published in the view too) rolls the log into a new
  segment (``MappedFileQueue.last_or_create``, called after the blank that closes the old segment was written and
  published in the view, with the writer lock held and nothing committed);
- ``repair``: a writer repairing the put of a writer that died (``MappedFileQueue.zero_range`` done: the torn bytes
  zeroed, the queue's next offset not yet restored, the intent not cleared), so that the next one repairs again;
- ``new queue``: the housekeeper's dispatcher meets the first record of a topic it has no queue for
  (``ConsumeQueueTable.find_or_load``), so that the next housekeeper makes the queue.
"""

import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

import localmq
from helpers import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KW = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 4096)

WORKER = """
import hashlib, json, sys, threading, time, localmq
root, plan = sys.argv[1], json.loads(sys.argv[2])
q = localmq.open(root, shared=True, mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 4096)
print("open", int(q.housekeeper), flush=True)

def stop_here(what, *args):
    print("at", what, *args, flush=True)
    time.sleep(3600)

point = plan["point"]
if point == "roll":
    orig_roll = q._cl_mfq.last_or_create
    def rolling(start_offset=0):
        mf = orig_roll(start_offset)
        if threading.current_thread() is threading.main_thread() and start_offset > 0:
            stop_here("roll", start_offset)
        return mf
    q._cl_mfq.last_or_create = rolling
elif point == "repair":
    orig_zero = q._cl_mfq.zero_range
    def zeroing(start, end):
        orig_zero(start, end)
        stop_here("repair", start, end)
    q._cl_mfq.zero_range = zeroing
elif point == "new queue":
    orig_load = q._cq_table.find_or_load
    def loading(topic, queue_id, adopt):
        if topic == "N":
            stop_here("new-queue")
        return orig_load(topic, queue_id, adopt)
    q._cq_table.find_or_load = loading
batch = plan.get("batch", 1)
for i in range(0, plan["puts"], batch):
    topic = "N" if i == plan.get("new_at") else "T"
    qid = i // batch % 4
    bodies = [b"w-%06d-" % (i + k) + b"x" * plan["body"] for k in range(batch)]
    r = q.put_batch(topic, bodies, queue_id=qid) if batch > 1 else q.put(topic, bodies[0], queue_id=qid)
    for k, body in enumerate(bodies):
        print("ack", topic, qid, r.queue_offset + k, hashlib.sha1(body).hexdigest(), flush=True)
if plan["puts"]:
    print("done", flush=True)
time.sleep(3600)
"""


class Worker:
    def __init__(self, root, **plan):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(root), json.dumps(plan)], stdout=subprocess.PIPE, env=env, text=True
        )
        self.acks = {}

    def opened(self):
        line = self.proc.stdout.readline().split()
        assert line[:1] == ["open"], line
        return line[1] == "1"

    def _take(self, line):
        # a line cut by the SIGKILL is not an acknowledgement the test can rely on
        if line[:1] == ["ack"] and len(line) == 5 and len(line[4]) == 40:
            self.acks[(line[1], int(line[2]), int(line[3]))] = line[4]

    def until(self, what):
        """Collect acknowledgements until the worker announces ``what`` (its stop point, or "done")."""
        while True:
            line = self.proc.stdout.readline().split()
            assert line, f"the worker ended before {what}"
            self._take(line)
            if line[0] in ("at", "done"):
                assert line[1:2] == [what] or line[0] == what, line
                return line

    def kill(self):
        """SIGKILL; the acknowledgements it wrote before are collected."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
            for line in self.proc.stdout:
                self._take(line.split())

    def close(self):
        self.kill()
        self.proc.stdout.close()


def read_every_queue(q, topics):
    got = {}
    for topic in topics:
        for qid in range(4):
            off = 0
            while True:
                r = q.get_message(topic, qid, off, 256)
                if not r.messages:
                    break
                for m in r.messages:
                    assert m.queue_offset == off
                    got[(topic, qid, off)] = hashlib.sha1(bytes(m.body)).hexdigest()
                    off += 1
            assert off == max(0, q.max_offset(topic, qid))
    return got


@pytest.mark.parametrize("point", ["housekeeper-roll", "housekeeper-batch-roll", "writer-roll", "repair", "new-queue"])
def test_a_process_killed_at_a_point_of_the_protocol_loses_nothing(tmp_path, point):
    root = tmp_path / "s"
    workers = []
    q = None

    def worker(**plan):
        w = Worker(root, **plan)
        workers.append(w)
        return w

    try:
        hk = None
        if point == "housekeeper-roll":
            hk = worker(point="roll", puts=10**6, body=1000)  # opens first: the housekeeper, and it writes
        elif point == "housekeeper-batch-roll":
            hk = worker(point="roll", puts=10**6, body=1000, batch=16)  # records before the roll in its view
        elif point == "new-queue":
            hk = worker(point="new-queue", puts=2000, body=1000, new_at=50)
        elif point == "repair":
            hk = worker(point="repair", puts=0, body=0)  # its housekeeping repairs the dead writer's put
        if hk is not None:
            assert hk.opened()
        q = localmq.open(root, shared=True, **KW)
        assert q.housekeeper == (hk is None)
        if point in ("writer-roll", "repair"):
            writer = worker(point="roll", puts=10**6, body=1000)
            assert not writer.opened()
        else:
            writer = hk
        if point == "new-queue":
            # the housekeeper's dispatcher waits at the new topic's first record; its writer goes on to the end
            writer.until("done")
        else:
            writer.until("roll")
            # what was committed is dispatched; then time for a dispatcher that would read further
            assert wait_until(lambda: q.dispatch_behind_bytes == 0, 20)
            time.sleep(0.5)
        writer.kill()
        if point == "repair":
            hk.until("repair")  # the torn put's bytes zeroed, its queue offset not restored yet, the intent kept
            hk.kill()
        expected = {k: v for w in workers for k, v in w.acks.items()}
        assert sum(k[0] == "N" for k in expected) == (1 if point == "new-queue" else 0)
        assert wait_until(lambda: q.housekeeper, 10)  # the survivor dispatches from here on
        for i in range(40):
            body = b"q-%06d-" % i + b"y" * 100
            r = q.put("T", body, queue_id=i % 4)
            assert r.ok
            expected[("T", i % 4, r.queue_offset)] = hashlib.sha1(body).hexdigest()
        # a killed writer's put (or repair) was repaired here, once
        assert q.commit_log.repairs == (0 if point == "new-queue" else 1)
        assert q.wait_for_dispatch(20)
        assert read_every_queue(q, ["T", "N"]) == expected
    finally:
        for w in workers:
            w.close()
        if q is not None:
            q.close()
