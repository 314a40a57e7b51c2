"""Recovery: RocketMQ's own stores, torn tails, corrupted bodies, unclean exits and SIGKILLed writers."""

import os
import random
import shutil
import sys
import textwrap
import zlib

import pytest

import localmq
from helpers import kill_when_ready, queue_messages
from localmq import GetStatus

SMALL = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=200)
FIXTURE_BODY = b"Once, there was a chance for me!"


def read_all(st, topic, queue_id, **kw):
    return queue_messages(st, topic, queue_id, wait=False, **kw)


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
    with localmq.open(tmp_path / "store", mapped_file_size_commit_log=8192, mapped_file_size_consume_queue=200) as st:
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


def _read_with_errors(st, topic, queue_id):
    """Every message of the queue, and the queue offsets whose get raised CorruptMessageError (skipped)."""
    out, errors, off = [], [], 0
    while True:
        try:
            g = st.get_message(topic, queue_id, off, 32)
        except localmq.CorruptMessageError as e:
            assert e.queue_offset == off and e.next_offset == off + 1
            errors.append(e)
            off = e.next_offset
            continue
        if g.status is GetStatus.OFFSET_OVERFLOW_ONE or g.status is GetStatus.NO_MATCHED_LOGIC_QUEUE:
            return out, errors
        assert g.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), g
        out.extend(g.messages)
        off = g.next_begin_offset


def _check_kept(st, written, lost):
    """Every written message except the ``lost`` indexes is read back exactly, in order, once; each lost one is a
    CorruptMessageError at its own queue offset, naming the loss."""
    for t in ("a", "b"):
        for q in (0, 1):
            msgs, errors = _read_with_errors(st, t, q)
            mine = [w for i, w in enumerate(written) if w[0] == t and w[1] == q]
            assert [m.body for m in msgs] == [w[5] for w in mine if written.index(w) not in lost]
            assert [(e.queue_offset, e.offset) for e in errors] == [
                (w[2], e.offset) for w, e in zip([w for w in mine if written.index(w) in lost], errors)
            ]
            assert all("lost to damage" in e.reason for e in errors)
            assert len(errors) == sum(1 for w in mine if written.index(w) in lost)


@pytest.mark.parametrize("abort", [False, True])
@pytest.mark.parametrize("field", ["body", "size", "magic", "topic"])
def test_damaged_record_in_the_middle_keeps_every_record_after_it(tmp_path, caplog, abort, field):
    """Issue 13: one damaged record in the middle of the log no longer ends the log there. Recovery
    resynchronises on the next record written where it lies, copies the damaged bytes to recovery/, replaces them
    by a gap record, and keeps every record after it; the lost message is a typed error at its own queue offset."""
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = _fill(st, 800)
    victim_index = 700
    victim = written[victim_index]
    seg, pos = _segment_of(root, victim[3])
    # a topic byte with its high bit set: no writer accepts such a name, so the header is known damaged
    at = {
        "body": victim[4] - 2 - 1 - len(victim[0]) - len(victim[5]) + 3,
        "size": 1,
        "magic": 6,
        "topic": victim[4] - 2 - len(victim[0]),
    }[field]
    with open(seg, "r+b") as f:
        f.seek(pos + at)
        b = f.read(1)
        f.seek(pos + at)
        f.write(bytes([b[0] ^ (0x80 if field == "topic" else 0x55)]))
        f.seek(pos)
        damaged = f.read(victim[4])
    if abort:
        (root / "abort").touch()
    with localmq.open(root, **SMALL) as st:
        rep = st.recovery
        assert rep.dropped_at is None and rep.end_offset == written[-1][3] + written[-1][4]
        assert [(g["offset"], g["bytes"]) for g in rep.gaps] == [(victim[3], victim[4])], rep.gaps
        with open(rep.gaps[0]["quarantine_path"], "rb") as f:
            qdata = f.read()
        assert qdata == victim[3].to_bytes(8, "big") + victim[4].to_bytes(8, "big") + damaged
        assert any("gap record" in r.getMessage() for r in caplog.records)
        _check_kept(st, written, {victim_index})
        for w in written[:victim_index] + written[victim_index + 1 :]:
            assert st.look_message_by_offset(w[3]).body == w[5]
        # RocketMQ reads the gap record as a blank record (it goes on in the next segment)
        with open(seg, "rb") as f:
            f.seek(pos)
            head = f.read(8)
        assert head == victim[4].to_bytes(4, "big") + (0xCBD43194).to_bytes(4, "big")
        # every reader steps over it
        recs = list(localmq.read_commitlog(root / "commitlog"))
        assert [r.body for r in recs] == [w[5] for w in written if w is not victim]
        r = st.put("a", b"after", queue_id=0)
        assert r.ok
        written.append(("a", 0, r.queue_offset, r.physical_offset, r.wrote_bytes, b"after"))
        with st.create_consumer("g", "a") as c:
            got = []
            while True:
                batch = c.poll_batch(64, timeout=0.5)
                if not batch:
                    break
                got.extend(m.body for m in batch)
            assert c.skipped_corrupt == (1 if victim[0] == "a" else 0)
        assert sorted(got) == sorted([w[5] for w in written if w[0] == "a" and w is not victim])
    with localmq.open(root, **SMALL) as st:
        # the second open finds the gap record and nothing new to repair
        assert st.recovery.gaps == [] and st.recovery.dropped_at is None and not st.recovery.cq_rebuilt
        _check_kept(st, written, {victim_index})


def test_zeroed_region_spanning_records_keeps_what_follows(tmp_path):
    """A zeroed page in the middle of the log (several records, the last ones of a queue among them): the records
    after it are kept; each lost message is a typed error at its own queue offset, also at a queue's end, and the
    queue's offsets are never handed out again."""
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = _fill(st, 300, topics=("a", "b"))
        # queue b-1's last message sits inside the region that is zeroed below
        tail = st.put("b", b"last of b-1", queue_id=1)
        written.append(("b", 1, tail.queue_offset, tail.physical_offset, tail.wrote_bytes, b"last of b-1"))
        for i in range(40):
            r = st.put("a", b"after %d" % i, queue_id=i % 2)
            written.append(("a", i % 2, r.queue_offset, r.physical_offset, r.wrote_bytes, b"after %d" % i))
    first = next(i for i, w in enumerate(written) if w[3] >= tail.physical_offset - 600)
    end = next(w[3] for w in written if w[3] >= tail.physical_offset + tail.wrote_bytes + 200) + 40  # past its magic
    last = max(i for i, w in enumerate(written) if w[3] < end)
    lost = set(range(first, last + 1))
    start = written[first][3] + 5
    seg, pos = _segment_of(root, start)
    seg_end, _ = _segment_of(root, end)
    assert seg == seg_end, "the test wants one segment"
    with open(seg, "r+b") as f:
        f.seek(pos)
        f.write(bytes(end - start))
    with localmq.open(root, **SMALL) as st:
        rep = st.recovery
        assert rep.dropped_at is None and len(rep.gaps) == 1
        g = rep.gaps[0]
        assert g["offset"] == written[first][3] and g["offset"] + g["bytes"] == written[last + 1][3]
        _check_kept(st, written, lost)
        assert st.max_offset("b", 1) == tail.queue_offset + 1
        r = st.put("b", b"new", queue_id=1)
        assert r.queue_offset == tail.queue_offset + 1
    with localmq.open(root, **SMALL) as st:
        assert st.recovery.gaps == [] and not st.recovery.cq_rebuilt and not st.recovery.cq_lost_units
        msgs, errors = _read_with_errors(st, "b", 1)
        assert msgs[-1].body == b"new" and errors


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


@pytest.mark.parametrize("victim_index", [0, 2])
def test_lost_consume_queue_whose_first_record_is_damaged_starts_with_a_lost_unit(tmp_path, victim_index):
    """A power cut can lose a queue's file and the page of the log holding its first records: recovery re-dispatches
    the log into a new queue and finds a gap record where those records were. The queue still starts at offset 0:
    its first units are lost units (a get there raises CorruptMessageError), not blank padding that would move its
    min offset and hide the loss (found by tests/test_power_loss.py)."""
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = _fill(st, 300)
    victim = written[victim_index]  # ("a", 0, 0, ...) and ("a", 0, 1, ...): the first or second record of a-0
    assert victim[:2] == ("a", 0)
    seg, pos = _segment_of(root, victim[3])
    with open(seg, "r+b") as f:  # a body byte: the CRC fails, recovery replaces the record by a gap record
        at = pos + victim[4] - 2 - 1 - len(victim[0]) - len(victim[5]) + 3
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x55]))
    shutil.rmtree(root / "consumequeue" / "a")
    (root / "abort").touch()
    with localmq.open(root, **SMALL) as st:
        assert [(g["offset"], g["bytes"]) for g in st.recovery.gaps] == [(victim[3], victim[4])]
        assert st.min_offset("a", 0) == 0
        _check_kept(st, written, {victim_index})


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
        with localmq.open(root, mapped_file_size_commit_log=256 * 1024, mapped_file_size_consume_queue=2000) as st:
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
                    assert mine[: len(acked)] == acked  # every acknowledged message is there
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
        assert [m.body for m in read_all(st, "cqd", 0)] == bodies
        assert st.recovery.cq_damaged == ["cqd-0"]  # at the open, or at the first use of a queue the close vouched for
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
        if kind == "truncate" or damaged == len(written) - 1:
            # nothing valid after the damaged record: it is the end of the log (a torn tail), cut and reported
            assert rep.dropped_at == written[damaged][3], (kind, rep)
            assert st.stats()["recovery"]["dropped_at"] == written[damaged][3]
            assert rep.end_offset == written[damaged][3] and rep.gaps == []
            for t in ("a", "b"):
                for q in (0, 1):
                    want = [w[5] for w in written[:damaged] if w[0] == t and w[1] == q]
                    assert [m.body for m in read_all(st, t, q)] == want
            r = st.put("a", b"after", queue_id=0)
            assert r.ok and r.physical_offset == written[damaged][3]
        else:
            # valid records follow: the damaged one becomes a gap record, every other one is kept
            assert rep.dropped_at is None, (kind, rep)
            assert [(g["offset"], g["bytes"]) for g in rep.gaps] == [(written[damaged][3], written[damaged][4])]
            _check_kept(st, written, {damaged})
            r = st.put("a", b"after", queue_id=0)
            assert r.ok and r.physical_offset == written[-1][3] + written[-1][4]


@pytest.mark.parametrize("delta", [1 << 40, -3, 1, 2])
def test_damaged_queue_offset_field_is_bounded_and_reported(tmp_path, delta):
    """A record whose QUEUEOFFSET field was damaged (the body CRC does not cover it) once made the dispatcher pad
    its queue up to that offset: millions of blank units and ConsumeQueue files. A queue offset the log cannot hold
    (more records than fit since the queue's last unit) or one the queue is already past is indexed where the
    record lies instead, and a get there raises CorruptMessageError; every other message reads back exactly."""
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = _fill(st, 400)
    victim_index = 301
    victim = written[victim_index]
    seg, pos = _segment_of(root, victim[3])
    with open(seg, "r+b") as f:
        f.seek(pos + 20)
        f.write((victim[2] + delta).to_bytes(8, "big", signed=True))
    with localmq.open(root, **SMALL) as st:
        assert st.recovery.cq_rebuilt  # the unit no longer matches its record: rebuilt from the log
        t, q = victim[0], victim[1]
        msgs, errors = _read_with_errors(st, t, q)
        mine = [w for w in written if w[0] == t and w[1] == q]
        assert [m.body for m in msgs] == [w[5] for w in mine if w is not victim]
        assert [e.queue_offset for e in errors] == [victim[2]] and "queue offset" in errors[0].reason
        assert st.max_offset(t, q) <= len(mine) + 1
        assert len(os.listdir(root / "consumequeue" / t / str(q))) <= 400 * 20 // 200 + 1
        for tt in ("a", "b"):
            for qq in (0, 1):
                if (tt, qq) != (t, q):
                    assert [m.body for m in read_all(st, tt, qq)] == [w[5] for w in written if w[:2] == (tt, qq)]
