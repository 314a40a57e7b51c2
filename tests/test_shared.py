"""One store, many processes (SharedMessageQueue): real processes, real SIGKILL and SIGSTOP, exact counts."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import localmq
from helpers import wait_until
from localmq.errors import ForkedStoreError, StoreBusyError, StoreLockedError
from localmq.store.files import StoreFiles

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shared_worker.py")
KW = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 4096)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Worker:
    """A shared_worker.py process; its stdout lines are collected by a thread (never blocks the test)."""

    def __init__(self, role, path, **args):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(
            [sys.executable, WORKER, role, str(path), json.dumps(args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.lines = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.split())

    def wait_open(self, timeout=30):
        assert wait_until(lambda: any(p[0] == "open" for p in self.lines) or self.proc.poll() is not None, timeout)
        assert any(p[0] == "open" for p in self.lines), self.proc.stderr.read()

    def acks(self):
        # a line cut by a SIGKILL is not an acknowledgement the test can rely on
        return [
            (int(p[1]), int(p[2]), p[3]) for p in list(self.lines) if p[0] == "ack" and len(p) == 4 and len(p[3]) == 40
        ]

    def msgs(self):
        return [(int(p[1]), int(p[2]), p[3]) for p in list(self.lines) if p[0] == "msg"]

    def finish(self, timeout=120):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        rc = self.proc.wait(timeout)
        self._t.join(5)
        err = self.proc.stderr.read()
        assert rc == 0, err
        return err

    def kill(self, sig=signal.SIGKILL):
        self.proc.send_signal(sig)
        if sig == signal.SIGKILL:
            self.proc.wait(10)
            self._t.join(5)

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            try:
                f.close()
            except OSError:
                pass


@pytest.fixture
def workers():
    started = []

    def start(role, path, **args):
        w = Worker(role, path, **args)
        started.append(w)
        return w

    yield start
    for w in started:
        w.close()


def read_all(q, queues=4, live=False):
    """Every message of topic T, queue by queue: {(qid, qoff): sha1}, checking offsets are dense from 0 (and, unless
    writers are still putting, that the reads reached the queue's end)."""
    out = {}
    for qid in range(queues):
        off = 0
        while True:
            r = q.get_message("T", qid, off, 256)
            if not r.messages:
                assert live or off == q.max_offset("T", qid)
                break
            for i, m in enumerate(r.messages):
                assert m.queue_offset == off + i
                out[(qid, m.queue_offset)] = hashlib.sha1(bytes(m.body)).hexdigest()
            off += len(r.messages)
    return out


def test_producers_and_consumers_in_many_processes(tmp_path, workers):
    path = tmp_path / "s"
    n, producers = 1500, 3
    base = localmq.open(path, shared=True, **KW)
    try:
        assert isinstance(base, localmq.SharedMessageQueue) and base.housekeeper
        consumers = [workers("consume", path, total=n * producers, timeout=90) for _ in range(2)]
        for c in consumers:
            c.wait_open()
        prods = [workers("produce", path, name=f"p{k}", n=n) for k in range(producers)]
        for p in prods:
            p.finish()
        for c in consumers:
            c.finish()
        acked = {(q, o): h for p in prods for (q, o, h) in p.acks()}
        assert len(acked) == n * producers  # unique (queue, offset) pairs: offsets never handed out twice
        for c in consumers:
            assert dict(((q, o), h) for q, o, h in c.msgs()) == acked  # everything, once, nothing else
        assert base.wait_for_dispatch(10)
        assert read_all(base) == acked
        # order per queue: a producer's messages keep their order within each queue
        for p in prods:
            for qid in range(4):
                offs = [o for q, o, _ in p.acks() if q == qid]
                assert offs == sorted(offs)
        assert base.stats()["shared"]["store_puts"] == n * producers
    finally:
        base.close()
    assert not (path / "abort").exists()  # the last process out closed the store cleanly
    with localmq.open(path, shared=False, **KW) as q:
        assert q.recovery.mode == "normal"
        assert len(read_all(q)) == n * producers


def test_sigkill_of_writers_mid_put_loses_no_acknowledged_message(tmp_path, workers):
    path = tmp_path / "s"
    survivor = localmq.open(path, shared=True, **KW)
    acked = {}
    try:
        for round_ in range(8):
            # 200 KiB bodies: most of a writer's time is the copy under the writer lock, so most kills land there
            w = workers("produce_forever", path, name=f"k{round_}", body=200_000)
            w.wait_open()
            assert wait_until(lambda w=w: len(w.acks()) >= 3, 30)
            time.sleep(0.01 * (round_ % 4))
            w.kill()
            acked.update({(q, o): h for q, o, h in w.acks()})
            # the survivor goes on at once: it takes the lock (repairing a torn put) and writes
            r = survivor.put("T", b"after kill %d" % round_, queue_id=round_ % 4)
            assert r.ok
            acked[(round_ % 4, r.queue_offset)] = hashlib.sha1(b"after kill %d" % round_).hexdigest()
        assert survivor.wait_for_dispatch(10), survivor.stats()
        got = read_all(survivor)
        for k, h in acked.items():
            assert got[k] == h, k
        # whatever is there beyond the acknowledged puts was written whole (a put killed after its commit)
        assert len(got) >= len(acked)
        st = survivor.stats()["shared"]
        assert st["writer_lock_recoveries"] >= 1, st  # at least one kill landed while the lock was held
    finally:
        survivor.close()
    with localmq.open(path, shared=False, **KW) as q:
        assert q.recovery.dropped_at is None  # no torn record was left behind for recovery to cut
        assert read_all(q) == got


def test_housekeeper_dies_and_another_process_takes_over(tmp_path, workers):
    path = tmp_path / "s"
    hk = workers("idle", path)
    hk.wait_open()
    assert hk.lines[0][2] == "1"  # the first opener is the housekeeper
    q = localmq.open(path, shared=True, **KW)
    try:
        assert not q.housekeeper
        assert q.put("T", b"one").ok
        assert q.wait_for_dispatch(10)  # dispatched by the other process
        assert q.get_message("T", 0, 0).messages[0].body == b"one"
        hk.kill()
        t0 = time.monotonic()
        assert wait_until(lambda: q.housekeeper, 5)
        takeover = time.monotonic() - t0
        assert q.put("T", b"two").ok
        assert q.wait_for_dispatch(10)
        assert [m.body for m in q.get_message("T", 0, 0).messages] == [b"one", b"two"]
        assert takeover < 1.0, takeover
    finally:
        q.close()


def test_stopped_lock_holder_makes_writers_wait_then_time_out(tmp_path, workers):
    path = tmp_path / "s"
    q = localmq.open(path, shared=True, shared_lock_timeout=0.5, **KW)
    w = workers("produce_forever", path, name="stopped", body=200_000)
    try:
        w.wait_open()
        busy = None
        for _ in range(50):
            w.kill(signal.SIGSTOP)
            time.sleep(0.01)
            try:
                q.put("T", b"x")
            except StoreBusyError as e:
                busy = e
            if busy is None:
                w.kill(signal.SIGCONT)
                time.sleep(0.01)
                continue
            break
        assert busy is not None, "never caught the writer holding the lock"
        assert busy.pid == w.proc.pid  # the live (stopped) holder is named, and never robbed of the lock
        w.kill(signal.SIGCONT)
        assert q.put("T", b"after").ok
    finally:
        w.kill(signal.SIGCONT)
        w.kill()
        q.close()


def test_processes_that_exit_without_close(tmp_path, workers):
    path = tmp_path / "s"
    q = localmq.open(path, shared=True, **KW)
    try:
        acked = {}
        for k in range(6):
            w = workers("produce", path, name=f"e{k}", n=50, exit_without_close=True)
            w.finish()
            acked.update({(a, b): h for a, b, h in w.acks()})
        assert q.wait_for_dispatch(10)
        assert read_all(q) == acked
    finally:
        q.close()


def test_wake_up_crosses_processes(tmp_path, workers):
    path = tmp_path / "s"
    q = localmq.open(path, shared=True, **KW)
    try:
        c = workers("consume", path, total=1, timeout=30)
        c.wait_open()
        time.sleep(0.3)  # the consumer sleeps in wait_for_new_messages
        assert q.put("T", b"wake").ok
        c.finish(30)
        assert [m[1] for m in c.msgs()] == [0]
    finally:
        q.close()


def test_exclusive_and_shared_opens_exclude_each_other(tmp_path):
    path = tmp_path / "s"
    with localmq.open(path, shared=True, **KW) as a:
        with pytest.raises(StoreLockedError) as ei:
            localmq.LocalMessageQueue(path, **KW)
        assert ei.value.shared_holders
        a.put("T", b"1")
    with localmq.open(path, shared=False, **KW):
        with pytest.raises(StoreLockedError) as ei:
            localmq.open(path, shared=True, **KW)
        assert not ei.value.shared_holders


def test_plain_open_joins_processes_that_share_the_store(tmp_path, workers):
    path = tmp_path / "s"
    w = workers("idle", path)
    w.wait_open()
    with localmq.open(path, **KW) as q:
        assert isinstance(q, localmq.SharedMessageQueue)
        assert q.put("T", b"joined").ok


def test_forked_child_refuses_the_inherited_store_and_opens_its_own(tmp_path):
    path = tmp_path / "s"
    q = localmq.open(path, shared=True, **KW)
    try:
        q.put("T", b"parent")
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child reports through the pipe and never returns into pytest
            code = 1
            try:
                try:
                    q.put("T", b"child via parent's object")
                    msg = b"inherited put worked"
                except ForkedStoreError:
                    with localmq.open(path, shared=True, **KW) as mine:
                        res = mine.put("T", b"child")
                        msg = b"ok %d" % res.queue_offset
                        code = 0
            except BaseException as e:  # noqa: BLE001 - reported to the parent
                msg = repr(e).encode()
            os.write(wfd, msg)
            os._exit(code)
        os.close(wfd)
        _, status = os.waitpid(pid, 0)
        out = os.read(r, 1000)
        os.close(r)
        assert os.waitstatus_to_exitcode(status) == 0, out
        assert out == b"ok 1"
        assert q.put("T", b"parent again").queue_offset == 2
        assert q.wait_for_dispatch(10)
        assert [m.body for m in q.get_message("T", 0, 0).messages] == [b"parent", b"child", b"parent again"]
    finally:
        q.close()


@pytest.mark.parametrize("flush", ["ASYNC_FLUSH", "SYNC_FLUSH"])
def test_random_sigkills_of_writers_and_the_housekeeper(tmp_path, workers, flush):
    # SYNC_FLUSH: the housekeeper killed while puts of other processes wait in its group commit; the next one's
    # C loop must answer them (a FLUSH_DISK_TIMEOUT would show as a "fail" line)
    import random

    rng = random.Random(20261123)
    path = tmp_path / "s"
    mode = dict(flush_disk_type=flush)
    hk = workers("idle", path, config=mode)
    hk.wait_open()
    q = localmq.open(path, shared=True, **KW, **mode)
    acked = {}
    live = []
    dead = []
    try:
        assert not q.housekeeper
        for round_ in range(12):
            while len(live) < 2:
                w = workers(
                    "produce_forever",
                    path,
                    name=f"r{round_}-{len(live)}",
                    body=rng.choice([100, 5000, 60000]),
                    config=mode,
                )
                w.wait_open()
                live.append(w)
            time.sleep(rng.uniform(0.02, 0.2))
            if round_ == 5:
                old = hk.proc.pid
                assert q.stats()["shared"]["housekeeper_pid"] == old
                hk.kill()  # the housekeeper dies mid-dispatch: a live process (any of them) takes over

                def taken_over(old=old):
                    pid = q.stats()["shared"]["housekeeper_pid"]
                    return pid != old and pid in [os.getpid()] + [w.proc.pid for w in live]

                assert wait_until(taken_over, 5)
            victim = live.pop(rng.randrange(len(live)))
            victim.kill()
            dead.append(victim)
            acked.update({(a, b): h for a, b, h in victim.acks()})
            assert q.put("T", b"round %d" % round_, queue_id=3).ok  # a survivor writes at once
        for w in live:
            w.kill()
            dead.append(w)
            acked.update({(a, b): h for a, b, h in w.acks()})
        assert not [p for w in dead for p in list(w.lines) if p[0] == "fail"]
        assert len(acked) > 100
        assert q.wait_for_dispatch(20)
        got = read_all(q)
        missing = [k for k, h in acked.items() if got.get(k) != h]
        assert not missing, missing[:5]
    finally:
        q.close()
    with localmq.open(path, shared=False, **KW) as again:
        assert again.recovery.dropped_at is None
        assert read_all(again) == got


def test_network_filesystems_are_refused(tmp_path, monkeypatch):
    from localmq.queues import shared

    assert shared.filesystem_type(str(tmp_path)) not in shared.NETWORK_FILESYSTEMS  # this machine's /tmp is local
    monkeypatch.setattr(shared, "filesystem_type", lambda path: "nfs4")
    with pytest.raises(localmq.UnsupportedFilesystemError) as ei:
        localmq.open(tmp_path / "s", shared=True, **KW)
    assert isinstance(ei.value, OSError) and "nfs4" in str(ei.value)
    with localmq.open(tmp_path / "s", shared=False, **KW) as q:  # the refused open left the store usable
        assert q.put("T", b"x").ok


def put_many(q, n, queues=4):
    acked = {}
    for i in range(n):
        body = b"g-%06d" % i
        r = q.put("T", body, queue_id=i % queues)
        assert r.ok
        acked[(i % queues, r.queue_offset)] = hashlib.sha1(body).hexdigest()
    return acked


def test_a_consumer_group_spans_processes(tmp_path, workers):
    path = tmp_path / "s"
    q = localmq.open(path, shared=True, **KW)
    try:
        acked = put_many(q, 2000)
        assert q.wait_for_dispatch(10)
        members = [workers("group", path, group="g", idle=1.5) for _ in range(2)]
        for w in members:
            w.finish(60)
        got = [m for w in members for m in w.msgs()]
        keys = [(a, b) for a, b, _ in got]
        assert len(keys) == len(set(keys)) == len(acked)  # every message once, across the two processes
        assert {(a, b): h for a, b, h in got} == acked
        # the group's committed offsets, written by both processes into the one file
        offs = q.consumer_offsets.group_offsets("g")
        assert offs == {("T", k): 500 for k in range(4)}
        doc = localmq.read_config_json(str(path / "config" / "consumerOffset.json"))
        assert doc["offsetTable"]["T@g"] == {k: 500 for k in range(4)}
    finally:
        q.close()


def test_group_queues_are_split_between_processes_and_taken_back_when_a_member_dies(tmp_path, workers):
    path = tmp_path / "s"
    q = localmq.open(path, shared=True, **KW)
    try:
        put_many(q, 400)
        assert q.wait_for_dispatch(10)
        other = workers("group", path, group="g", idle=120.0, retention_ms=60_000)
        assert wait_until(lambda: any(p[0] == "member" for p in other.lines), 30)
        c = q.create_consumer("g", ["T"], consumer_retention_ms=60_000)
        sched = q._client_state().scheduler

        def split():
            c.poll_batch(32, timeout=0.05)
            owners = sched.owners("g")
            return len(owners) == 4 and len(set(owners.values())) == 2

        assert wait_until(split, 20)  # two members in two processes: two queues each
        other.kill()  # its queues are free at once (its process slot died), not after the 60 s retention

        def all_mine():
            c.poll_batch(32, timeout=0.05)
            return len(set(sched.owners("g").values())) == 1 and len(sched.owners("g")) == 4

        t0 = time.monotonic()
        assert wait_until(all_mine, 10)
        assert time.monotonic() - t0 < 5
        c.close()
    finally:
        q.close()


def test_commits_of_two_processes_both_reach_the_offset_file(tmp_path, workers):
    path = tmp_path / "s"
    q = localmq.open(path, shared=True, **KW)
    try:
        put_many(q, 100)
        assert q.wait_for_dispatch(10)
        # each group has one member, which reads until it saw all 100 (no idle time ends it on a slow machine)
        a = workers("group", path, group="ga", first_wait=30.0, total=100)
        b = workers("group", path, group="gb", first_wait=30.0, total=100)
        a.finish(60)
        b.finish(60)
        doc = localmq.read_config_json(str(path / "config" / "consumerOffset.json"))
        assert doc["offsetTable"]["T@ga"] == {k: 25 for k in range(4)}
        assert doc["offsetTable"]["T@gb"] == {k: 25 for k in range(4)}
    finally:
        q.close()
    doc = localmq.read_config_json(str(path / "config" / "consumerOffset.json"))  # the last closer kept both
    assert set(doc["offsetTable"]) >= {"T@ga", "T@gb"}


def _store_fingerprint(path):
    """{relative path: (size, sha1)} of every file in the store."""
    out = {}
    for d, _, names in os.walk(path):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, path)] = (os.path.getsize(p), hashlib.sha1(f.read()).hexdigest())
    return out


def _open_write_fds(path):
    """Descriptors of this process open for writing on files under ``path`` (from /proc/self/fdinfo)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            with open(f"/proc/self/fdinfo/{fd}") as f:
                flags = int(next(line for line in f if line.startswith("flags:")).split()[1], 8)
        except (OSError, StopIteration):
            continue
        if target.startswith(str(path)) and flags & (os.O_WRONLY | os.O_RDWR):
            found.append(target)
    return found


def test_read_only_view_of_a_closed_store_writes_and_locks_nothing(tmp_path):
    path = tmp_path / "s"
    with localmq.open(path, **KW) as q:
        acked = put_many(q, 300)
    before = _store_fingerprint(path)
    with localmq.open(path, read_only=True, **KW) as ro:
        assert isinstance(ro, localmq.ReadOnlyMessageQueue)
        assert read_all(ro) == acked
        assert ro.topics() == {"T": [0, 1, 2, 3]}
        assert not _open_write_fds(path)
        with pytest.raises(localmq.ReadOnlyStoreError):
            ro.put("T", b"no")
        with pytest.raises(PermissionError):
            ro.create_consumer("g", ["T"])
    assert _store_fingerprint(path) == before  # not a byte changed, no file created
    with localmq.open(path, read_only=True, **KW) as ro:
        with localmq.open(path, **KW) as w:  # a writer opens beside a view: the view holds no lock
            w.put("T", b"beside a view")
    with localmq.open(path, read_only=True, **KW) as ro:
        assert len(read_all(ro)) == 301


def test_read_only_view_leaves_out_an_empty_last_segment(tmp_path):
    """A kill between a segment file's creation and its sizing (RocketMQ's allocator makes files so) leaves an
    empty last segment: it holds no record, and a view reads the store without it and changes nothing."""
    path = tmp_path / "s"
    with localmq.open(path, **KW) as q:
        acked = put_many(q, 300)
    segs = sorted((path / "commitlog").iterdir())
    size = KW["mapped_file_size_commit_log"]
    assert all(p.stat().st_size == size for p in segs)
    (path / "commitlog" / f"{int(segs[-1].name) + size:020d}").touch()
    before = _store_fingerprint(path)
    with localmq.open(path, read_only=True, **KW) as ro:
        assert read_all(ro) == acked
    assert _store_fingerprint(path) == before


def test_read_only_view_of_a_live_shared_store_sees_a_prefix(tmp_path, workers):
    path = tmp_path / "s"
    hk = workers("idle", path)
    hk.wait_open()
    w = workers("produce", path, name="live", n=3000)
    w.wait_open()
    ro = localmq.open(path, read_only=True, **KW)
    try:
        seen_sizes = []
        while w.proc.poll() is None:
            got = read_all(ro, live=True)
            acked_so_far = {(a, b): h for a, b, h in w.acks()}
            # every message the view returns was put by the writer: never garbage, never another message
            assert all(acked_so_far.get(k, h) == h for k, h in got.items())
            assert all(k[1] < 750 for k in got)
            seen_sizes.append(len(got))
        w.finish()
        assert ro.wait_for_dispatch(10)
        assert read_all(ro) == {(a, b): h for a, b, h in w.acks()}
        assert seen_sizes == sorted(seen_sizes)  # what it sees only grows
        assert not _open_write_fds(path)
        with pytest.raises(localmq.ReadOnlyStoreError):
            ro.put_batch("T", [b"x"])
    finally:
        ro.close()
    hk.finish()


def test_read_only_refuses_a_store_held_by_one_process(tmp_path, workers):
    path = tmp_path / "s"
    alone = workers("idle", path, shared=False)  # another process holds it alone: its end is in its memory
    alone.wait_open()
    with pytest.raises(StoreLockedError) as ei:
        localmq.open(path, read_only=True, **KW)
    assert "alone" in str(ei.value)
    alone.finish()
    with localmq.open(path, read_only=True, **KW) as ro:  # closed now: readable as it is
        assert ro.topics() == {}
    with pytest.raises(localmq.NotAStoreError):
        localmq.open(tmp_path / "nothing", read_only=True)


def test_key_lookups_answer_in_every_process(tmp_path, workers):
    path = tmp_path / "s"
    hk = workers("idle", path)  # the housekeeper builds the index
    hk.wait_open()
    q = localmq.open(path, shared=True, **KW)
    try:
        assert not q.housekeeper
        w = workers("produce", path, name="kp", n=200, keys=True)
        w.finish()
        assert q.wait_for_index(10)
        acks = w.acks()
        for i in (0, 77, 199):
            found = q.query_message("T", f"kp-{i}")
            assert [hashlib.sha1(bytes(m.body)).hexdigest() for m in found] == [acks[i][2]]
            assert found[0].queue_offset == acks[i][1]
        assert q.query_message("T", "kp-200") == []
    finally:
        q.close()
        hk.finish()


def test_a_full_disk_seen_by_the_housekeeper_stops_puts_in_every_process(tmp_path, workers):
    path = tmp_path / "s"
    usage = {"ratio": 0.5}
    q = localmq.open(path, shared=True, disk_usage=lambda p: usage["ratio"], disk_full_refuse_ratio=90, **KW)
    try:
        assert q.housekeeper
        w = workers("produce_forever", path, name="df")
        w.wait_open()
        assert wait_until(lambda: len(w.acks()) > 10, 30)
        usage["ratio"] = 0.99
        q.clean_service.run_once()
        assert q.put("T", b"here").status is localmq.PutStatus.SERVICE_NOT_AVAILABLE
        assert wait_until(lambda: any(p[0] == "fail" and "SERVICE_NOT_AVAILABLE" in p[1] for p in list(w.lines)), 5), (
            w.lines[-3:],
            q.stats()["shared"],
        )
        usage["ratio"] = 0.5
        q.clean_service.run_once()
        n = len(w.acks())
        assert wait_until(lambda: len(w.acks()) > n + 10, 5)  # accepted again in the other process
        assert q.put("T", b"here").ok
        w.kill()
    finally:
        q.close()


def test_sync_flush_puts_from_many_processes_are_acknowledged_flushed(tmp_path, workers):
    path = tmp_path / "s"
    sync = dict(flush_disk_type="SYNC_FLUSH")
    q = localmq.open(path, shared=True, **KW, **sync)
    try:
        ws = [workers("produce", path, name=f"sf{k}", n=300, config=sync) for k in range(2)]
        mine = put_many(q, 300)
        for w in ws:
            w.finish(120)
            assert len(w.acks()) == 300 and not [p for p in w.lines if p[0] == "fail"]  # all PUT_OK, none timed out
        assert q.wait_for_dispatch(10)
        got = read_all(q)
        assert len(got) == 900 and all(got[k] == h for k, h in mine.items())
        gc = q.stats()["shared"]["group_commit"]  # this process is the housekeeper: its C loop flushed for all
        assert 1 <= gc["flushes"] <= 900 and gc["fsync_ns"] > 0
    finally:
        q.close()


def test_sync_flush_across_segment_rolls_and_a_housekeeper_killed_while_puts_wait(tmp_path, workers):
    # The group commit runs in C in the housekeeper: it must step from segment to segment (1 MiB segments, ~3.5 MiB
    # written here), and when its process is SIGKILLed while puts of other processes wait for their flush, the
    # next housekeeper's group commit must answer them (PUT_OK, not FLUSH_DISK_TIMEOUT).
    path = tmp_path / "s"
    sync = dict(flush_disk_type="SYNC_FLUSH")
    hk = workers("idle", path, config=sync)
    hk.wait_open()
    assert hk.lines[0][2] == "1"
    q = localmq.open(path, shared=True, **KW, **sync)
    try:
        assert not q.housekeeper
        ws = [workers("produce", path, name=f"sr{k}", n=1500, body=1000, config=sync) for k in range(2)]
        assert wait_until(lambda: all(len(w.acks()) > 200 for w in ws), 60)
        hk.kill()  # puts of both workers are waiting for a flush the dead process was to do
        mine = put_many(q, 300)
        for w in ws:
            w.finish(120)
            assert len(w.acks()) == 1500 and not [p for p in w.lines if p[0] == "fail"]
        assert q.wait_for_dispatch(10)
        got = read_all(q)
        assert len(got) == 3300 and all(got[k] == h for k, h in mine.items())
        for w in ws:
            assert all(got[(qid, qoff)] == h for qid, qoff, h in w.acks())
        shared = q.stats()["shared"]
        assert shared["sync_flushed_end"] == shared["committed_end"] > 3 << 20  # every acknowledged byte, 3 rolls
    finally:
        q.close()


def test_the_housekeeper_creates_the_next_segment_ahead_and_a_crash_leaves_it_harmless(tmp_path, workers):
    path = tmp_path / "s"
    seg1 = path / "commitlog" / "00000000000001048576"
    hk = workers("idle", path)
    hk.wait_open()
    assert hk.lines[0][2] == "1"
    p = workers("produce", path, name="pa", n=300, body=1000, exit_without_close=True)  # ~0.33 MiB of segment 0
    p.finish(60)
    assert len(p.acks()) == 300
    assert wait_until(seg1.exists, 5)  # created by the housekeeper, not by a writer (nobody wrote past segment 0)
    assert seg1.stat().st_size == 1 << 20
    assert seg1.read_bytes() == bytes(1 << 20)
    hk.kill()  # every process is gone without closing: a crashed store with an empty segment after the end
    q = localmq.open(path, **KW)  # one process alone: RocketMQ's recovery
    try:
        got = read_all(q)
        assert sorted(got.values()) == sorted(h for _, _, h in p.acks())
        more = put_many_sized(q, 1200, 1000)  # rolls into segment 1, the file made ahead
        assert q.wait_for_dispatch(10)
        got = read_all(q)
        assert len(got) == 1500 and all(got[k] == h for k, h in more.items())
    finally:
        q.close()
    q = localmq.open(path, shared=True, **KW)
    try:
        assert len(read_all(q)) == 1500
        end = q.stats()["shared"]["committed_end"]
        assert 1 << 20 < end < 2 << 20
        assert wait_until((path / "commitlog" / "00000000000002097152").exists, 5)  # ahead of the writer
        put_many_sized(q, 1000, 1000)  # into segment 2
        assert wait_until(lambda: (path / "commitlog" / "00000000000003145728").exists(), 5)
        assert q.stats()["shared"]["segments_allocated_ahead"] >= 1  # this process, the housekeeper, made it
    finally:
        q.close()


@pytest.mark.parametrize(
    "end,expected", [(0, None), (1, 1024), (1023, 1024), (1024, 1024), (1025, 2048), (5 * 1024, 5 * 1024)]
)
def test_the_segment_made_ahead_follows_the_last_committed_byte(end, expected):
    from localmq.queues.shared import segment_ahead

    assert segment_ahead(end, 1024) == expected


def test_file_readers_leave_out_segments_past_the_live_committed_end(tmp_path):
    # a listing of a live store can show a segment made ahead while one before it is being created: past the
    # published committed end nothing is committed, so readers leave such files out instead of reporting a hole;
    # in a store nobody shares, the same hole is corruption
    path = tmp_path / "s"
    fs = KW["mapped_file_size_commit_log"]
    q = localmq.open(path, shared=True, **KW)
    try:
        put_many(q, 50)
        assert wait_until((path / "commitlog" / "00000000000001048576").exists, 5)  # made ahead
        (path / "commitlog" / "00000000000001048576").unlink()  # as if still being created
        (path / "commitlog" / "00000000000002097152").write_bytes(bytes(fs))
        files = StoreFiles(str(path), fs)
        assert [b for b, _ in files.segments] == [0] and files.live_end == q.stats()["shared"]["committed_end"]
        assert sum(1 for _ in localmq.read_commitlog(str(path / "commitlog"), mapped_file_size=fs)) == 50
    finally:
        q.close()  # (the housekeeper made segment 1 once; it does not make it again for the same committed end)
    assert not (path / "commitlog" / "00000000000001048576").exists()
    with pytest.raises(localmq.CorruptStoreError, match="gap"):
        StoreFiles(str(path), fs)


def put_many_sized(q, n, size, queues=4):
    acked = {}
    for i in range(n):
        body = (b"s-%06d-" % i) * (size // 9 + 1)
        body = body[:size]
        r = q.put("T", body, queue_id=i % queues)
        assert r.ok
        acked[(i % queues, r.queue_offset)] = hashlib.sha1(body).hexdigest()
    return acked


def test_file_readers_on_a_live_shared_store_see_a_growing_prefix(tmp_path, workers):
    # what the CLI and Spark use: localmq's file readers, no lock, no control file
    path = tmp_path / "s"
    w = workers("produce", path, name="fr", n=20000, body=3000)
    w.wait_open()
    # a store opened before its first put has no segment yet (it is made, sized and fdatasynced before it gets its
    # name): the readers start once one message is acknowledged
    assert wait_until(lambda: w.acks() or w.proc.poll() is not None, 30)
    counts, ends = [], []
    while w.proc.poll() is None or not counts:
        seen = [
            (m.queue_id, m.queue_offset)
            for m in localmq.read_commitlog(str(path / "commitlog"), mapped_file_size=KW["mapped_file_size_commit_log"])
        ]
        per_queue = {}
        for qid, qoff in seen:
            assert qoff == per_queue.get(qid, 0)  # each queue's messages in order, none missing before the end
            per_queue[qid] = qoff + 1
        counts.append(len(seen))
        ends.append(StoreFiles(str(path), KW["mapped_file_size_commit_log"]).walk_end())  # Spark's end of the log
    w.finish()
    assert ends == sorted(ends)
    assert counts == sorted(counts) and len(counts) >= 2
    final = sum(
        1 for _ in localmq.read_commitlog(str(path / "commitlog"), mapped_file_size=KW["mapped_file_size_commit_log"])
    )
    assert final == 20000 == len(w.acks())


_CLOSE_TOGETHER = """
import sys, localmq
st = localmq.open(sys.argv[1], shared=True, mapped_file_size_commit_log=1 << 20,
                  mapped_file_size_consume_queue=20 * 4096)
st.put("T", b"from %s" % sys.argv[2].encode())
print("ready", flush=True)
sys.stdin.readline()
st.close()
print("closed", flush=True)
"""


def test_processes_closing_at_the_same_moment_leave_the_store_clean(tmp_path):
    """Issue 24: two processes that closed at the same moment each saw the other still attached, and neither removed
    `abort` (17 of 20 runs): the next open ran crash recovery. Closes take turns on the store byte now."""
    script = tmp_path / "close_together.py"
    script.write_text(_CLOSE_TOGETHER)
    path = tmp_path / "s"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    for rnd in range(10):
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(path), f"{rnd}-{k}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                env=env,
            )
            for k in range(2)
        ]
        try:
            for p in procs:
                assert p.stdout.readline().strip() == "ready"
            for p in procs:  # both are told at once
                p.stdin.write("go\n")
                p.stdin.flush()
            for p in procs:
                assert p.wait(60) == 0 and p.stdout.read().strip() == "closed"
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
                p.stdin.close()
                p.stdout.close()
        assert not (path / "abort").exists(), f"round {rnd}: abort left behind"
    with localmq.open(path, shared=True, **KW) as st:
        assert st.recovery.mode == "normal"
        assert st.max_offset("T", 0) == 20


def _my_locks(path):
    """The POSIX record locks this process holds on ``path`` (lines of /proc/locks naming its pid and inode)."""
    st = os.stat(path)
    dev_ino = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    with open("/proc/locks") as f:
        return sorted(
            line.split(":", 1)[1].strip()
            for line in f
            if " POSIX " in line and line.split()[4] == str(os.getpid()) and line.split()[5] == dev_ino
        )


def test_reading_the_files_of_a_store_this_process_shares_keeps_its_locks(tmp_path):
    """StoreFiles (and the Spark readers' planning, which use ControlView) on a store this process holds open shared
    must not open and close a descriptor of its control file: that close drops every POSIX lock the process holds
    on it (its attachment, its slot, the housekeeper's byte). Found by the JVM reader's shared-store test."""
    from localmq.store.control_view import ControlView

    path = tmp_path / "s"
    with localmq.open(path, shared=True, **KW) as q:
        for i in range(20):
            q.put("T", b"m%d" % i, queue_id=i % 2)
        assert q.wait_for_dispatch(10)
        ctl = path / "mpctl"
        held = _my_locks(ctl)
        assert held, "the shared store holds no lock on its control file"
        view = ControlView.open(str(path))
        assert view is not None and view.load(0) is not None
        view.close()
        files = StoreFiles(str(path))  # reads the committed end through ControlView
        assert files.live_end == q.stats()["shared"]["committed_end"]
        assert sum(cq.max_offset() for cq in files.queues()) == 20
        assert _my_locks(ctl) == held
        assert q.put("T", b"after").status is localmq.PutStatus.PUT_OK
