"""The writer of the power-cut tests (tests/test_power_loss.py): a fork server that runs seeded localmq workloads.

Run as ``python tests/power_writer.py``: the server imports localmq once, then reads one JSON job per line on stdin.
For each job it forks a child, prints ``P <pid>``, waits for the child and prints ``E <pid> <wait status>``; the
test SIGKILLs the child (never the server) at a moment of its choosing, so a cut costs a fork, not a Python start.

The child opens the store of the job (``localmq.open(root, **config)``), prints ``R ...`` once open, then puts the
job's seeded workload from ``threads`` threads until it is killed, printing one line per outcome on stdout (fd 1,
one ``os.write`` per line: a pipe write of under PIPE_BUF bytes is atomic, so lines of several threads never mix):

* ``A <thread> <i> <topic> <queue id> <queue offset> <physical offset> <size>``: put number ``i`` of ``thread``
  returned PUT_OK (an acknowledgement); written before that thread starts its next put.
* ``N <thread> <i> <status>``: that put returned another status (the record may still be in the log).
* ``D <offset>``: ``st.stats()["flushed_offset"]`` moved there: the commit log is durable below it (ASYNC_FLUSH:
  ``MappedFileQueue.flushed_where``, set after the msync(MS_SYNC) of the bytes below it returned; SYNC_FLUSH: the
  group commit's flushed offset, the same kind of number).
* ``C <topic> <queue id> <offset>``: a consumer of group ``PG`` committed that offset (``Consumer.commit()``, durable
  by contract) and ``commit`` returned.
* ``Y <i> <status>``: delayed put number ``i`` (topic ``pdelay``, queue 0, ``delay_level`` 1) returned that status
  (jobs with ``special``; thread number 90 in its body). ``special: "delay"`` leaves the transactions out (shared
  stores refuse them).
* ``T <i> <state> <committed>``: transactional send number ``i`` (topic ``ptxn``, queue 0, producer group ``PTG``;
  thread 91) returned: the local transaction answered ``state`` (COMMIT_MESSAGE for even ``i``, ROLLBACK_MESSAGE for
  odd), ``committed`` 1 when the real message was put by it (``TransactionSendResult.commit``).
* ``W <i> <status> <queue offset>``: put number ``i`` to topic ``pretry`` (queue 0; thread 92) returned (jobs with
  ``special``). A consumer of group ``PRG`` reads ``pretry`` in the same thread: it sends back (``nack(delay=1)``, a
  retry through the schedule service to ``%RETRY%PRG``) every even ``i`` read for the first time and acknowledges
  the rest; ``B <i>`` once that send-back returned (its retry record stored, SYNC_FLUSH: on disk), ``V <i>`` for a
  retry delivered, ``K <offset>`` once the group's offset of ``pretry`` queue 0 was committed there.
* ``F <repr>``: the open failed and the job allows it (``open_may_fail``: a fault injected by the test); the child
  then waits for the kill.
* ``X <repr>``: the child failed (then exits 3).

The body of put ``i`` of ``thread`` in session ``s`` is ``b"<s>:<thread>:<i>:<crc32 of payload, 8 hex>:" +
payload``; ``message(seed, s, thread, i)`` regenerates topic, queue id, body and key, so the test checks every
message it finds against what was put, byte for byte.
"""

import ctypes
import json
import os
import random
import signal
import sys
import threading
import time
import traceback
import zlib

GROUP = "PG"
PR_SET_PDEATHSIG = 1


def _die_with_parent():
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


class Workload:
    """The seeded messages of one thread of one session: ``next()`` gives (i, topic, queue id, body, key)."""

    def __init__(self, seed, session, thread, topics, queues, sizes):
        self.rng = random.Random(f"{seed}/{session}/{thread}")
        self.session, self.thread = session, thread
        self.topics, self.queues, self.sizes = topics, queues, sizes
        self.i = -1

    def next(self):
        rng = self.rng
        self.i += 1
        topic = self.topics[rng.randrange(len(self.topics))]
        qid = rng.randrange(self.queues)
        payload = rng.randbytes(rng.randrange(*self.sizes))
        body = b"%d:%d:%d:%08x:" % (self.session, self.thread, self.i, zlib.crc32(payload)) + payload
        return self.i, topic, qid, body, "k%dx%dx%d" % (self.session, self.thread, self.i)


def messages(seed, session, thread, topics, queues, sizes, n):
    """The first ``n`` messages of a thread's workload, as the writer put them."""
    w = Workload(seed, session, thread, topics, queues, sizes)
    return [w.next() for _ in range(n)]


def parse_body(body):
    """(session, thread, i) of a body written by a Workload, or None when it is not one (never put by it)."""
    parts = bytes(body).split(b":", 4)
    if len(parts) != 5:
        return None
    try:
        s, t, i, crc = int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3], 16)
    except ValueError:
        return None
    if zlib.crc32(parts[4]) != crc:
        return None
    return s, t, i


def _out(line):
    os.write(1, (line + "\n").encode())


def run_job(job):
    """The child: open, put until killed. Never returns."""
    import localmq
    import localmq.store.mapped_file_queue as mfq

    if job["seed"] % 2:
        # odd seeds sync new queue files and directories on several threads even for a few (the path a store with
        # thousands of queues takes: sync_each), so the cuts meet it
        mfq.SYNC_PARALLEL_MIN = 2

    try:
        try:
            st = localmq.open(job["root"], **job["config"])
        except Exception as e:  # noqa: BLE001 - an injected I/O error: reported, then wait for the kill
            if not job.get("open_may_fail"):
                raise
            _out("F " + repr(repr(e)))
            time.sleep(job.get("max_seconds", 30))
            os._exit(3)
        rep = st.recovery
        _out(f"R {rep.mode} {rep.end_offset} {len(rep.gaps)} {int(rep.dropped_at is not None)}")
        stop = threading.Event()
        failed = []

        def guard(fn, *args):
            try:
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - reported, then the child ends
                failed.append(e)
                _out("X " + repr(traceback.format_exc()))
                os._exit(3)

        def writer(k):
            w = Workload(job["seed"], job["session"], k, job["topics"], job["queues"], tuple(job["sizes"]))
            ok = localmq.PutStatus.PUT_OK
            while not stop.is_set():
                i, topic, qid, body, key = w.next()
                r = st.put(topic, body, queue_id=qid, keys=key)
                if r.status is ok:
                    _out(f"A {k} {i} {topic} {qid} {r.queue_offset} {r.physical_offset} {r.wrote_bytes}")
                else:
                    _out(f"N {k} {i} {r.status.name}")
                if job.get("pace_us"):
                    time.sleep(job["pace_us"] / 1e6)

        def special():
            # delayed and transactional messages, alternately, in their own topics
            # special == "delay": no transactions (a shared store refuses them)
            states = localmq.LocalTransactionState
            txns = job["special"] != "delay"
            tp = st.create_transaction_producer("PTG", lambda m: states.UNKNOW) if txns else None
            producer = st.create_producer(queue_id=0)
            wd = Workload(job["seed"], job["session"], 90, ["pdelay"], 1, tuple(job["sizes"]))
            wt = Workload(job["seed"], job["session"], 91, ["ptxn"], 1, tuple(job["sizes"]))
            wr = Workload(job["seed"], job["session"], 92, ["pretry"], 1, tuple(job["sizes"]))
            rc = st.create_consumer("PRG", ["pretry"], from_offset="earliest", manual_ack=True)
            while not stop.is_set():
                retries(wr, rc)
                i, topic, qid, body, key = wd.next()
                try:
                    r = producer.send(topic, body, keys=key, delay_level=1)
                    _out(f"Y {i} {r.status.name}")
                except localmq.SendError as e:
                    _out(f"Y {i} {e.status.name if e.status is not None else 'SEND_ERROR'}")
                if not txns:
                    continue
                i, topic, qid, body, key = wt.next()
                answer = states.COMMIT_MESSAGE if i % 2 == 0 else states.ROLLBACK_MESSAGE
                try:
                    t = tp.send_in_transaction(topic, body, lambda m, a, s=answer: s, queue_id=qid, keys=key)
                except localmq.SendError:
                    continue  # not stored (or its end not stored): nothing is claimed for it
                _out(f"T {i} {t.state.name} {int(t.commit is not None and t.commit.ok)}")
                if job.get("pace_us"):
                    time.sleep(job["pace_us"] / 1e6)

        def retries(wr, rc):
            # one put to pretry, then what the consumer has: first reads of even messages sent back, the rest acked
            i, topic, qid, body, key = wr.next()
            r = st.put(topic, body, queue_id=qid, keys=key)
            _out(f"W {i} {r.status.name} {r.queue_offset}")
            for m in rc.poll_batch(16, timeout=0.01):
                who = parse_body(bytes(m.body))
                if m.topic == "pretry" and who is not None and who[2] % 2 == 0 and m.reconsume_times == 0:
                    try:
                        m.nack(delay=1.0)
                    except localmq.SendError:
                        continue  # not sent back: it stays unacknowledged, the committed offset stays before it
                    _out(f"B {who[2]}")
                else:
                    m.ack()
                    if m.topic != "pretry" and who is not None:
                        _out(f"V {who[2]}")
            rc.commit()
            _out(f"K {rc.committed('pretry', 0)}")

        def reporter():
            last = -1
            while not stop.is_set():
                flushed = st.stats()["flushed_offset"]
                if flushed != last:
                    _out(f"D {flushed}")
                    last = flushed
                time.sleep(job.get("report_ms", 5) / 1000)

        def consumer():
            c = st.create_consumer(GROUP, job["topics"], from_offset="earliest")
            while not stop.is_set():
                batch = c.poll_batch(64, timeout=0.05)
                if not batch:
                    continue
                c.commit()
                for topic, qid in sorted({(m.topic, m.queue_id) for m in batch}):
                    _out(f"C {topic} {qid} {c.committed(topic, qid)}")

        threads = [threading.Thread(target=guard, args=(writer, k), daemon=True) for k in range(job["threads"])]
        threads.append(threading.Thread(target=guard, args=(reporter,), daemon=True))
        if job.get("consumer"):
            threads.append(threading.Thread(target=guard, args=(consumer,), daemon=True))
        if job.get("special"):
            threads.append(threading.Thread(target=guard, args=(special,), daemon=True))
        for t in threads:
            t.start()
        time.sleep(job.get("max_seconds", 30))
        _out("X 'ran out of time before the kill'")
    except BaseException:  # noqa: BLE001 - the test reads the line
        _out("X " + repr(traceback.format_exc()))
    os._exit(3)


def serve():
    """The fork server: one job per stdin line; for each, ``P <pid>`` then ``E <pid> <status>`` on stdout."""
    import localmq  # noqa: F401 - imported once here, inherited by every forked child

    _die_with_parent()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                _die_with_parent()
                os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
                run_job(job)
            finally:
                os._exit(4)
        _out(f"P {pid}")
        _, status = os.waitpid(pid, 0)
        _out(f"E {pid} {status}")


if __name__ == "__main__":
    serve()
