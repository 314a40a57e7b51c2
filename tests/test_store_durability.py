"""Background services: flush modes, group commit, the transient store pool, allocation ahead and warm-up."""

import logging
import os
import subprocess
import sys
import threading
import time

import pytest

import localmq
from helpers import mounted_tmpfs, queue_messages, wait_until
from localmq import PutStatus
from localmq.store.checkpoint import read_checkpoint
from localmq.store.group_commit import GroupCommit

SMALL = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=2000)


def _local_threads():
    return [t for t in threading.enumerate() if t.name.startswith("localmq-")]


# -- group commit ----------------------------------------------------------------------------------------------


def test_group_commit_releases_many_waiters_with_one_publish():
    gc = GroupCommit(0)
    targets = [100 * (i + 1) for i in range(8)]
    results = {}

    def waiter(t):
        results[t] = gc.wait(t, 10.0)

    threads = [threading.Thread(target=waiter, args=(t,)) for t in targets]
    for t in threads:
        t.start()

    # the flusher sees the highest offset asked for once every waiter has registered (a positive answer
    # claims the flush: give it back while not everyone is there)
    def claimed_all():
        t = gc.next_request(1000)
        if 0 < t < max(targets):
            gc.done(0)
        return t == max(targets)

    assert wait_until(claimed_all)
    assert not results  # nobody returns before a flush covers it
    gc.done(max(targets))  # one flush for all eight
    for t in threads:
        t.join(5)
    assert results == {t: 0 for t in targets}
    assert gc.flushed == max(targets)


def test_group_commit_wait_times_out_and_close_releases():
    import errno

    gc = GroupCommit(50)
    assert gc.wait(50, 0.01) == 0  # already covered: the fast path
    assert gc.wait(51, 0.02) == errno.ETIMEDOUT
    out = []
    t = threading.Thread(target=lambda: out.append(gc.wait(500, 10.0)))
    t.start()

    def claimed_500():
        t = gc.next_request(1000)  # a positive answer claims the flush; 51 is left over from the timed-out wait
        if 0 < t != 500:
            gc.done(50)
        return t == 500

    assert wait_until(claimed_500)
    gc.done(0)  # the flush failed: nothing published, the claim given back
    gc.close()
    t.join(5)
    assert out == [errno.ESHUTDOWN]
    assert gc.next_request(1000) == -1


def test_sync_flush_put_returns_after_its_bytes_are_flushed(store_factory):
    st = store_factory(flush_disk_type=localmq.FlushDiskType.SYNC_FLUSH, **SMALL)
    for i in range(300):  # rolls several 64 KiB segments
        r = st.put("s", os.urandom(500), queue_id=i % 3)
        assert r.status is PutStatus.PUT_OK
        assert st.stats()["flushed_offset"] >= r.physical_offset + r.wrote_bytes
    rb = st.put_batch("s", [b"x" * 300] * 50)
    assert rb.ok and st.stats()["flushed_offset"] >= st.commit_log_max_offset


def test_sync_flush_requests_from_many_threads_share_flushes(store_factory):
    st = store_factory(flush_disk_type="SYNC_FLUSH", **SMALL)
    n_threads, per = 8, 150
    statuses = []

    def run(k):
        for i in range(per):
            statuses.append(st.put("g", b"%d:%d" % (k, i), queue_id=k).status)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert statuses.count(PutStatus.PUT_OK) == n_threads * per
    st.wait_for_dispatch()
    for k in range(n_threads):
        r = st.get_message("g", k, 0, 32)
        assert r.messages[0].body == b"%d:0" % k
        assert st.max_offset("g", k) == per
    assert st.stats()["flushed_offset"] == st.commit_log_max_offset


def test_sync_flush_slower_than_timeout_gives_flush_disk_timeout(store_factory):
    st = store_factory(flush_disk_type="SYNC_FLUSH", sync_flush_timeout=50, **SMALL)
    assert st.put("t", b"first").ok
    gc = st._group_commit
    gc.pause()  # no flush can run (neither the service nor a put leading its group): a stuck disk
    try:
        t0 = time.monotonic()
        r = st.put("t", b"stuck")
        waited = time.monotonic() - t0
    finally:
        gc.done(gc.flushed)
    assert r.status is PutStatus.FLUSH_DISK_TIMEOUT
    assert waited >= 0.045  # it did wait for sync_flush_timeout (a lower bound, not a speed check)
    # the message is in the log all the same (RocketMQ's contract) and the next flush covers it
    assert st.put("t", b"after").ok
    st.wait_for_dispatch()
    assert [m.body for m in st.get_message("t", 0, 0).messages] == [b"first", b"stuck", b"after"]


# -- ASYNC_FLUSH and the consume queue flush -----------------------------------------------------------------


def test_async_flush_service_flushes_and_moves_the_checkpoint(tmp_path):
    root = tmp_path / "s"
    st = localmq.open(
        root,
        flush_interval_commit_log=10,
        flush_commit_log_least_pages=0,
        flush_interval_consume_queue=10,
        flush_consume_queue_thorough_interval=0,
        **SMALL,
    )
    try:
        results = [st.put("a", os.urandom(200)) for _ in range(500)]
        last_ts = results[-1].store_timestamp
        assert wait_until(lambda: st.stats()["flushed_offset"] == st.commit_log_max_offset)

        # the CQ service's thorough pass records the logical time and syncs the checkpoint file itself
        # (the two services set their fields independently: wait until a synced checkpoint holds both)
        def synced():
            cp = read_checkpoint(root / "checkpoint")
            return (cp.physic_msg_timestamp, cp.logics_msg_timestamp) == (last_ts, last_ts)

        assert wait_until(synced)
        assert st.stats()["flushes"] > 0 and st.stats()["service_errors"]["FlushRealTimeService"] == 0
    finally:
        st.close()


def test_service_errors_are_logged_and_counted(store_factory, caplog):
    st = store_factory(flush_interval_consume_queue=10, flush_consume_queue_thorough_interval=0, **SMALL)

    class BrokenQueue:
        last_store_timestamp = 0

        def flush(self, least_pages):
            raise OSError(5, "Input/output error", "fake-cq")

    svc = st._cq_flush_service
    real = svc.queues
    with caplog.at_level(logging.ERROR, logger="localmq.flush"):
        svc.queues = lambda: [BrokenQueue()]
        assert wait_until(lambda: st.stats()["service_errors"]["FlushConsumeQueueService"] >= 2)
        svc.queues = real
    assert any(
        "FlushConsumeQueueService" in r.getMessage() and "Input/output error" in r.getMessage() for r in caplog.records
    )
    assert svc.alive  # an error does not kill the service


def test_close_leaves_no_thread_behind(tmp_path):
    before = set(_local_threads())
    for mode in (
        {},
        {"flush_disk_type": "SYNC_FLUSH"},
        {"transient_store_pool_enable": True},
        {"warm_mapped_file_enable": True},
    ):
        st = localmq.open(tmp_path / "s", **SMALL, **mode)
        assert len(set(_local_threads()) - before) >= 4
        st.put("t", b"x")
        st.close()
        assert set(_local_threads()) - before == set()


# -- transient store pool -------------------------------------------------------------------------------------


def test_transient_pool_records_are_visible_once_committed(store_factory):
    st = store_factory(
        transient_store_pool_enable=True,
        transient_store_pool_size=2,
        commit_interval_commit_log=60_000,
        commit_commit_log_thorough_interval=60_000,
        commit_commit_log_least_pages=10_000,
        **SMALL,
    )
    mf_before = st.commit_log_max_offset
    assert mf_before == 0
    st.put("p", b"one")  # the first segment takes a pool buffer: the record sits in process memory
    assert st.commit_log_max_offset == 0
    assert st.stats()["committed_offset"] == 0
    assert st.wait_for_dispatch(5)  # commits what was put, then waits for the dispatcher
    assert [m.body for m in st.get_message("p", 0, 0).messages] == [b"one"]
    for i in range(400):  # fill several segments: buffers go back to the pool as segments complete
        st.put("p", b"%d" % i + bytes(400))
    st.wait_for_dispatch(5)
    assert st.max_offset("p", 0) == 401
    assert st.stats()["transient_store_pool"]["available"] >= 1


def test_transient_pool_is_refused_with_sync_flush(tmp_path):
    with pytest.raises(localmq.ConfigError, match="ASYNC_FLUSH"):
        localmq.open(tmp_path / "s", transient_store_pool_enable=True, flush_disk_type="SYNC_FLUSH")


# -- allocation ahead ------------------------------------------------------------------------------------------


def _segments(root):
    return sorted(os.listdir(root / "commitlog"))


def test_segments_are_created_ahead_and_unclaimed_ones_removed_at_close(tmp_path):
    root = tmp_path / "s"
    seg = 64 * 1024
    st = localmq.open(root, **SMALL)
    try:
        st.put("t", b"x")
        # the first segment was created on demand; the next two are created ahead of need
        assert wait_until(lambda: _segments(root) == ["%020d" % (i * seg) for i in range(3)])
        while st.commit_log_max_offset < seg + 100:
            st.put("t", bytes(1000))
        assert wait_until(lambda: _segments(root) == ["%020d" % (i * seg) for i in range(4)])
        assert st.stats()["allocate"]["served_ready"] >= 1
        for name in _segments(root):
            assert os.path.getsize(root / "commitlog" / name) == seg  # full size, blocks reserved
            assert os.stat(root / "commitlog" / name).st_blocks * 512 >= seg
    finally:
        st.close()
    assert _segments(root) == ["%020d" % (i * seg) for i in range(2)]


CRASH_AFTER_ALLOCATION = """
import os, sys, time, localmq
st = localmq.open(sys.argv[1], mapped_file_size_commit_log=64 * 1024)
r = st.put("t", b"kept")
deadline = time.monotonic() + 10
while len(os.listdir(os.path.join(sys.argv[1], "commitlog"))) < 3 and time.monotonic() < deadline:
    time.sleep(0.01)
os._exit(0)  # no close(): the segments created ahead stay on disk
"""


def test_segments_created_ahead_are_cut_by_recovery_after_a_crash(tmp_path):
    root = tmp_path / "s"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    subprocess.run([sys.executable, "-c", CRASH_AFTER_ALLOCATION, str(root)], check=True, env=env, timeout=60)
    assert len(_segments(root)) == 3 and (root / "abort").exists()
    with localmq.open(root, mapped_file_size_commit_log=64 * 1024) as st:
        assert st.recovery.mode == "abnormal"
        assert len(st.recovery.deleted_segments) == 2
        assert [m.body for m in st.get_message("t", 0, 0).messages] == [b"kept"]
        assert st.put("t", b"next").physical_offset == st.get_message("t", 0, 0).messages[0].store_size


def test_warm_segments_are_resident_and_locked(store_factory, tmp_path):
    st = store_factory(warm_mapped_file_enable=True, **SMALL)
    st.put("w", b"x")
    svc = st._allocate_service
    assert wait_until(lambda: svc.created_ahead >= 2)
    reqs = [r for r in svc._requests.values() if r.mf is not None]
    assert reqs
    for r in reqs:
        assert r.mf.resident_pages() == 64 * 1024 // 4096
    assert st.stats()["allocate"]["mlock"] is True


MLOCK_REFUSED = """
import logging, sys, time, localmq
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
st = localmq.open(sys.argv[1], mapped_file_size_commit_log=16 * 1024 * 1024, warm_mapped_file_enable=True)
for i in range(40):
    st.put("t", bytes(1024 * 1024 - 400))  # rolls ~3 segments: several warm-ups
deadline = time.monotonic() + 20
while st.stats()["allocate"]["created_ahead"] < 4 and time.monotonic() < deadline:
    time.sleep(0.01)
print("mlock", st.stats()["allocate"]["mlock"], "created_ahead", st.stats()["allocate"]["created_ahead"])
st.close()
"""


def test_mlock_refused_degrades_to_one_warning(tmp_path):
    """Without CAP_IPC_LOCK and with an 8 MiB RLIMIT_MEMLOCK, locking a 16 MiB segment is refused."""
    import shutil

    if shutil.which("setpriv") is None or os.geteuid() != 0:
        pytest.skip("needs root and setpriv to run a child without CAP_IPC_LOCK")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cmd = [
        "setpriv",
        "--inh-caps=-ipc_lock",
        "--bounding-set=-ipc_lock",
        "prlimit",
        "--memlock=8388608",
        sys.executable,
        "-c",
        MLOCK_REFUSED,
        str(tmp_path / "s"),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "mlock False" in p.stdout
    warnings = [line for line in p.stderr.splitlines() if "mlock refused" in line]
    assert len(warnings) == 1, p.stderr


# -- disk full --------------------------------------------------------------------------------------------------


def _read_all(st, topic):
    return [m.body for m in queue_messages(st, topic, 0, wait=False)]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A real 640 KiB tmpfs mounted for the test."""
    with mounted_tmpfs(tmp_path, "640k") as mnt:
        yield mnt


def test_full_disk_gives_create_failed_stays_readable_and_recovers(small_tmpfs):
    root = small_tmpfs / "s"
    ballast = small_tmpfs / "ballast"
    with open(ballast, "wb") as f:  # room that the test gives back later
        f.write(os.urandom(256 * 1024))
    cfg = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=400)
    st = localmq.open(root, **cfg)
    acked, failed = [], None
    try:
        for i in range(2000):
            body = b"%d:" % i + os.urandom(900)
            r = st.put("full", body)
            if r.status is PutStatus.PUT_OK:
                acked.append(body)
            else:
                failed = r
                break
        assert failed is not None, "the 640 KiB tmpfs never filled"
        assert failed.status is PutStatus.CREATE_MAPPED_FILE_FAILED and failed.physical_offset == -1
        assert st.stats()["put_failures"] >= 1
        # what is indexed is readable and in order; when even a ConsumeQueue file could not be created the
        # dispatcher says so (and retries), it does not stop or skip
        dispatched = st.wait_for_dispatch(2)
        got = _read_all(st, "full")
        assert got == acked[: len(got)]
        blocked = st.stats()["dispatch_blocked"]
        print(f"acked {len(acked)}, indexed {len(got)}, dispatch blocked: {blocked}")
        assert (got == acked) == dispatched == (blocked is None)
        if blocked is not None:
            assert "No space left" in blocked
        # still full: refused again, no crash. A put may fit first: a refusal while the dispatcher waited for room
        # ends when room comes back (the allocator's failed file ahead of need gives its blocks back), and the
        # segment being written still had some
        for _ in range(700):  # 630 KB: more than the 640 KiB tmpfs holds
            body = os.urandom(900)
            again = st.put("full", body)
            if not again.ok:
                break
            acked.append(body)
        assert again.status is PutStatus.CREATE_MAPPED_FILE_FAILED, again
        os.unlink(ballast)  # space returns
        # while the dispatcher waited for space puts were refused (the space goes to indexing what the log holds
        # first); it retries every 100 ms, then takes puts again
        assert st.wait_for_dispatch(10), st.stats()["dispatch_blocked"]
        more = [b"again-%d" % i for i in range(50)]
        assert all(st.put("full", b).ok for b in more)
        assert st.wait_for_dispatch(10)
        assert st.stats()["dispatch_blocked"] is None
        assert _read_all(st, "full") == acked + more
    finally:
        st.close()
    with localmq.open(root, **cfg) as st:
        assert st.max_offset("full", 0) == len(acked) + len(more)
        assert st.get_message("full", 0, len(acked)).messages[0].body == b"again-0"


# -- many files synced at once ---------------------------------------------------------------------------------


def test_sync_each_tries_every_item_and_returns_the_failures_in_order():
    from localmq.store.durable_names import SYNC_PARALLEL_MIN, sync_each

    for n in (SYNC_PARALLEL_MIN - 1, 500):  # the calling thread alone, then the threads
        seen, lock = [], threading.Lock()

        def fn(i, seen=seen, lock=lock):
            with lock:
                seen.append(i)
            if i % 97 == 13:
                raise OSError(5, f"item {i}")

        failed = sync_each(fn, list(range(n)))
        assert sorted(seen) == list(range(n))
        assert [i for i, _ in failed] == [i for i in range(n) if i % 97 == 13]
        assert all(isinstance(e, OSError) and str(i) in str(e) for i, e in failed)


@pytest.mark.parametrize("startable", [0, 3])
def test_sync_each_works_on_the_calling_thread_when_no_thread_starts(monkeypatch, startable):
    # Thread.start raises RuntimeError when no thread is left, and at interpreter shutdown on Python 3.12+ (a store
    # closed by an atexit hook): every item is still synced, by the threads that started and the caller
    from localmq.store.durable_names import sync_each

    real_start, started = threading.Thread.start, []

    def start(self):
        if self.name == "localmq-sync" and len(started) >= startable:
            raise RuntimeError("can't create new thread at interpreter shutdown")
        started.append(self)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    seen, lock = [], threading.Lock()

    def fn(i):
        with lock:
            seen.append((i, threading.current_thread()))
        if i == 77:
            raise OSError(5, "item 77")

    failed = sync_each(fn, list(range(300)))
    assert sorted(i for i, _ in seen) == list(range(300))
    assert [i for i, _ in failed] == [77]
    assert {t for _, t in seen} <= set(started) | {threading.current_thread()}
    assert threading.current_thread() in {t for _, t in seen} or startable


def test_close_after_writes_to_many_queues_syncs_every_new_file_and_reports_a_failed_one(tmp_path, monkeypatch):
    """A close after the first put to 300 queues syncs the new ConsumeQueue files on several threads: every file's
    fdatasync is called once, one that fails (EIO, injected) is raised naming its file, and the store opens again
    with every message."""
    root = tmp_path / "s"
    st = localmq.open(
        root, mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 64, max_mapped_queue_files=64
    )
    for t in range(75):
        for q in range(4):
            assert st.put(f"t{t}", b"m%d/%d" % (t, q), queue_id=q).status is PutStatus.PUT_OK
    assert st.wait_for_dispatch(60)
    real, synced, lock = os.fdatasync, [], threading.Lock()
    bad = str(root / "consumequeue" / "t41" / "2" / "00000000000000000000")

    def fdatasync(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        with lock:
            synced.append(path)
        if path == bad:
            raise OSError(5, "Input/output error (injected)")
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with pytest.raises(localmq.StoreIOError) as ei:
        st.close()
    monkeypatch.setattr(os, "fdatasync", real)
    assert bad in str(ei.value)
    new_files = [p for p in synced if "/consumequeue/" in p]
    assert len(new_files) == len(set(new_files)) == 300, len(new_files)
    with localmq.open(root, mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 64) as st2:
        for t in range(75):
            for q in range(4):
                assert [bytes(m.body) for m in st2.get_message(f"t{t}", q, 0, 4).messages] == [b"m%d/%d" % (t, q)]
