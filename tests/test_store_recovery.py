"""Recovery: RocketMQ's own stores, torn tails, corrupted bodies, unclean exits and SIGKILLed writers."""
import os
import random
import shutil
import sys
import textwrap
import zlib

import pytest

from helpers import kill_when_ready

import localmq
from localmq import GetStatus

SMALL = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=200)
FIXTURE_BODY = b"Once, there was a chance for me!"


def read_all(st, topic, queue_id, **kw):
    out, off = [], 0
    while True:
        g = st.get_message(topic, queue_id, off, 32, **kw)
        if g.status is GetStatus.OFFSET_OVERFLOW_ONE or g.status is GetStatus.NO_MATCHED_LOGIC_QUEUE:
            return out
        assert g.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), g
        out.extend(g.messages)
        off = g.next_begin_offset


def test_open_store_written_by_rocketmq(fixtures_dir, tmp_path):
    src = fixtures_dir / "apache-rocketmq-4e25b979" / "store"
    shutil.copytree(src, tmp_path / "store")
    with localmq.open(tmp_path / "store", mapped_file_size_commit_log=8192) as st:
        # PROVENANCE: 47 records of 172 bytes, then a 108-byte blank; no consumequeue: it is rebuilt
        assert st.recovery.end_offset == 8192
        assert st.max_offset("abc", 0) == 47
        msgs = read_all(st, "abc", 0)
        assert len(msgs) == 47 and all(m.body == FIXTURE_BODY for m in msgs)
        assert [m.physical_offset for m in msgs] == [172 * i for i in range(47)]
        assert msgs[1].msg_id == "C0A8470100001FBB00000000000000AC"
        assert all(m.tags == "TAG1" for m in msgs)
        assert len(read_all(st, "abc", 0, tags="TAG1")) == 47
        units = st.consume_queue("abc", 0).units()
        assert list(units["size"]) == [172] * 47 and set(units["tags"]) == {2567159}
        r = st.put("abc", b"appended by localmq", tags="TAG1")
        assert (r.queue_offset, r.physical_offset) == (47, 8192)  # the first segment is full: a new one
    assert sorted(os.listdir(tmp_path / "store" / "commitlog")) == ["00000000000000000000", "00000000000000008192"]
    with localmq.open(tmp_path / "store", mapped_file_size_commit_log=8192) as st:
        msgs = read_all(st, "abc", 0)
        assert len(msgs) == 48 and msgs[-1].body == b"appended by localmq"
    # and RocketMQ's own reader view of what localmq appended: a valid V1 record
    recs = list(localmq.read_commitlog(tmp_path / "store" / "commitlog"))
    assert len(recs) == 48 and recs[-1].store_host == "127.0.0.1:10911"


def test_open_rocketmq_store_with_ext_addresses_and_dirty_tail(fixtures_dir, tmp_path):
    src = fixtures_dir / "EricPanGopher-rocketmq-9835cd5f" / "store" / "unit_test_store"
    shutil.copytree(src, tmp_path / "store")
    with localmq.open(tmp_path / "store", mapped_file_size_commit_log=8192,
                      mapped_file_size_consume_queue=200) as st:
        # abort present: the abnormal path; the dirty tail of file 4 (zeros at 6536) ends the log
        assert st.recovery.mode == "abnormal"
        assert st.recovery.end_offset == 3 * 8192 + 6536
        assert st.recovery.dropped_at is None
        msgs = read_all(st, "abc", 0)
        assert len(msgs) == 179 and [m.queue_offset for m in msgs] == list(range(179))
        # units 0..55 carry ext addresses as tagsCode: the tag filter must still match by the record's tag
        assert len(read_all(st, "abc", 0, tags="TAG1")) == 179
        assert read_all(st, "abc", 0, tags="OTHER") == []


def _fill(st, n, topics=("a", "b"), size=(10, 400), seed=1):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        t = topics[i % len(topics)]
        body = b"%d|" % i + rng.randbytes(rng.randrange(*size))
        r = st.put(t, body, queue_id=i % 2)
        out.append((t, i % 2, r.queue_offset, r.physical_offset, r.wrote_bytes, body))
    return out


def _segment_of(root, phys, size=64 * 1024):
    return os.path.join(root, "commitlog", "%020d" % (phys - phys % size)), phys % size


@pytest.mark.parametrize("abort", [False, True])
def test_torn_tail_is_cut_and_reported(tmp_path, abort):
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = _fill(st, 600)
    last = written[-1]
    seg, pos = _segment_of(root, last[3])
    cut = random.Random(3).randrange(9, last[4])
    with open(seg, "r+b") as f:  # the last record's write was torn: only its first `cut` bytes reached the file
        f.seek(pos + cut)
        f.write(bytes(last[4] - cut))
    if abort:
        (root / "abort").touch()
    with localmq.open(root, **SMALL) as st:
        rep = st.recovery
        assert rep.mode == ("abnormal" if abort else "normal")
        assert rep.dropped_at == last[3] and rep.end_offset == last[3]
        assert rep.stop_reason in ("bad crc", "bad length", "torn")
        assert st.stats()["recovery"]["dropped_at"] == last[3]
        assert os.path.exists(rep.quarantine_path)
        for t in ("a", "b"):
            for q in (0, 1):
                want = [w[5] for w in written[:-1] if w[0] == t and w[1] == q]
                assert [m.body for m in read_all(st, t, q)] == want
        r = st.put(last[0], b"replacement", queue_id=last[1])
        assert r.queue_offset == last[2] and r.physical_offset == last[3]
    with localmq.open(root, **SMALL) as st:
        assert st.recovery.dropped_at is None
        assert read_all(st, last[0], last[1])[-1].body == b"replacement"


def test_flipped_body_byte_in_the_middle_is_reported_not_skipped(tmp_path, caplog):
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = _fill(st, 800)
    victim_index = 700
    victim = written[victim_index]
    seg, pos = _segment_of(root, victim[3])
    body_pos = pos + victim[4] - 2 - 1 - len(victim[0]) - len(victim[5]) + 3  # a byte inside the body
    with open(seg, "r+b") as f:
        f.seek(body_pos)
        b = f.read(1)
        f.seek(body_pos)
        f.write(bytes([b[0] ^ 0x55]))
    (root / "abort").touch()
    with localmq.open(root, **SMALL) as st:
        rep = st.recovery
        assert rep.stop_reason == "bad crc" and rep.dropped_at == victim[3]
        # the records after the damage are counted and kept aside, not silently dropped
        assert rep.dropped_records == len(written) - victim_index
        assert rep.dropped_bytes >= sum(w[4] for w in written[victim_index:]) - 64 * 1024
        with open(rep.quarantine_path, "rb") as f:
            qdata = f.read()
        assert written[-1][5] in qdata
        assert any("bad crc" in r.getMessage() for r in caplog.records)
        kept = sum(len(read_all(st, t, q)) for t in ("a", "b") for q in (0, 1))
        assert kept == victim_index
        for w in written[:victim_index]:
            assert st.look_message_by_offset(w[3]).body == w[5]


def test_clean_close_takes_normal_path_and_abort_takes_abnormal(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        _fill(st, 100)
    with localmq.open(root, **SMALL) as st:
        assert st.recovery.mode == "normal"
    (root / "abort").touch()
    with localmq.open(root, **SMALL) as st:
        assert st.recovery.mode == "abnormal" and st.recovery.dropped_at is None
        assert sum(len(read_all(st, t, q)) for t in ("a", "b") for q in (0, 1)) == 100


def test_lost_consume_queue_is_rebuilt(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = _fill(st, 300)
    shutil.rmtree(root / "consumequeue" / "a")
    (root / "abort").touch()
    # an unclean exit and a missing queue directory: the log is re-dispatched into a new queue
    with localmq.open(root, **SMALL) as st:
        got = [m.body for m in read_all(st, "a", 0)]
        assert got == [w[5] for w in written if w[0] == "a" and w[1] == 0]


WRITER = textwrap.dedent("""
    import os, sys, threading, zlib, localmq
    root, mode, n_threads, session = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    extra = {"flush_disk_type": mode}
    if mode == "TRANSIENT_POOL":
        extra = {"transient_store_pool_enable": True, "transient_store_pool_size": 2,
                 "commit_interval_commit_log": 20}
    st = localmq.open(root, mapped_file_size_commit_log=256 * 1024, mapped_file_size_consume_queue=2000, **extra)
    def run(k):
        fd = os.open(os.path.join(root, "acked-%d" % k), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        i = 0
        while True:
            payload = os.urandom(20 + (i * 7919) % 300)
            body = b"%d:%d:%d:%d:" % (session, k, i, zlib.crc32(payload)) + payload
            r = st.put("crash", body, queue_id=k)
            if r.status is not localmq.PutStatus.PUT_OK:
                os._exit(5)
            os.write(fd, b"%d\\n" % i)  # written only after the put returned PUT_OK
            i += 1
    for k in range(n_threads):
        threading.Thread(target=run, args=(k,), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()
""")


@pytest.mark.parametrize("mode", ["ASYNC_FLUSH", "SYNC_FLUSH", "TRANSIENT_POOL"])
def test_sigkill_writer_loses_no_acknowledged_message(tmp_path, mode):
    """ASYNC and SYNC: every acknowledged message survives. The transient pool's contract is weaker (records
    not yet committed from the write buffer die with the process): what survives must still be intact, in
    order and without holes, and the loss is counted."""
    rng = random.Random(11)
    root = tmp_path / "s"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    n_threads, kills, checked, lost = 3, 6, 0, 0
    for kill in range(kills):
        for k in range(n_threads):
            p = root / f"acked-{k}"
            if p.exists():
                p.unlink()
        kill_when_ready([script, root, mode, n_threads, kill], env, rng.uniform(0.05, 0.4))
        with localmq.open(root, mapped_file_size_commit_log=256 * 1024,
                          mapped_file_size_consume_queue=2000) as st:
            assert st.recovery.mode == "abnormal"
            for k in range(n_threads):
                acked = [int(x) for x in (root / f"acked-{k}").read_text().split()]
                msgs = read_all(st, "crash", k)
                sessions = {}
                for m in msgs:
                    sess, kk, i, crc, payload = m.body.split(b":", 4)
                    assert int(kk) == k and zlib.crc32(payload) == int(crc)  # intact
                    sessions.setdefault(int(sess), []).append(int(i))
                # sessions in order; within each, in order with no duplicates and no holes
                assert list(sessions) == sorted(sessions)
                assert all(seqs == list(range(len(seqs))) for seqs in sessions.values())
                mine = sessions.get(kill, [])
                if mode != "TRANSIENT_POOL":
                    assert mine[:len(acked)] == acked  # every acknowledged message is there
                else:
                    lost += max(0, len(acked) - len(mine))
                checked += len(acked)
            assert st.put("crash", b"after-recovery", queue_id=n_threads).ok
    assert checked > 0
    print(f"{mode}: kills survived: {kills}, acknowledged messages checked: {checked}, lost (pool only): {lost}")


def test_zeroed_page_in_the_middle_of_a_consume_queue_is_rebuilt(tmp_path):
    root = tmp_path / "s"
    cfg = dict(mapped_file_size_commit_log=256 * 1024, mapped_file_size_consume_queue=20 * 1000)
    with localmq.open(root, **cfg) as st:
        bodies = [b"%d" % i + os.urandom(30) for i in range(2500)]
        for b in bodies:
            st.put("cqd", b)
    cq_file = root / "consumequeue" / "cqd" / "0" / ("%020d" % 20000)  # units 1000..1999
    with open(cq_file, "r+b") as f:
        f.seek(4096)
        f.write(bytes(4096))  # a page of units in the middle of the queue is lost
    with localmq.open(root, **cfg) as st:
        assert st.recovery.cq_damaged == ["cqd-0"]
        assert [m.body for m in read_all(st, "cqd", 0)] == bodies
        units = st.consume_queue("cqd", 0).units()
        assert len(units) == 2500 and (units["size"] > 0).all()


def _record_at(written, offset):
    """Index of the record holding commit log byte ``offset`` (from the put results), or None."""
    for i, w in enumerate(written):
        if w[3] <= offset < w[3] + w[4]:
            return i
    return None


@pytest.mark.parametrize("trial", range(12))
def test_random_torn_and_corrupted_tails(tmp_path, trial):
    """Damage near the end of the log at a random place (a truncated last segment file, or bytes overwritten
    in a record's size, magic or body: the fields the format protects); recovery keeps every record before
    the damaged one, cuts from it on, reports where, and the store takes new puts."""
    rng = random.Random(1000 + trial)
    root = tmp_path / "s"
    with localmq.open(root, preallocate_mapped_file=False, **SMALL) as st:
        written = _fill(st, 260, seed=trial)
    last_seg_base = written[-1][3] - written[-1][3] % (64 * 1024)
    tail = [w for w in written[-25:] if w[3] >= last_seg_base]
    kind = ("truncate", "size", "magic", "body")[trial % 4]
    victim = rng.choice(tail)
    seg, pos = _segment_of(root, victim[3])
    if kind == "truncate":
        cut = rng.randrange(pos + 1, pos + victim[4])  # inside the victim record
        os.truncate(seg, cut)
        damaged = _record_at(written, victim[3])
    else:
        field = {"size": 0, "magic": 4, "body": victim[4] - 2 - 1 - len(victim[0]) - len(victim[5])}[kind]
        off = pos + field + (rng.randrange(len(victim[5])) if kind == "body" else rng.randrange(4))
        with open(seg, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ (1 << rng.randrange(8))]))
        damaged = _record_at(written, victim[3])
    if trial % 3 == 0:
        (root / "abort").touch()
    with localmq.open(root, **SMALL) as st:
        rep = st.recovery
        assert rep.dropped_at == written[damaged][3], (kind, rep)
        assert st.stats()["recovery"]["dropped_at"] == written[damaged][3]
        assert rep.end_offset == written[damaged][3]
        for t in ("a", "b"):
            for q in (0, 1):
                want = [w[5] for w in written[:damaged] if w[0] == t and w[1] == q]
                assert [m.body for m in read_all(st, t, q)] == want
        r = st.put("a", b"after", queue_id=0)
        assert r.ok and r.physical_offset == written[damaged][3]
