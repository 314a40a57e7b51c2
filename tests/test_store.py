"""LocalMessageQueue: round trips across rolled segments and CQ files, reopen, batches, statuses, tags, lookups."""

import hashlib
import os
import random
import threading
import time
import zlib

import numpy as np
import pytest

import localmq
from helpers import queue_messages
from localmq import GetStatus, PutStatus

SMALL = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=200)


def read_all(st, topic, queue_id, start=0, **kw):
    return queue_messages(st, topic, queue_id, wait=False, start=start, **kw)


def make_body(topic, q, i, rng):
    return f"{topic}/{q}/{i}/".encode() + rng.randbytes(rng.randrange(0, 300))


def test_round_trip_many_topics_queues_rolled_files(tmp_path):
    rng = random.Random(7)
    topics = ["orders", "audit%log", "a|b", "t-1_x"]
    expected = {}
    with localmq.open(tmp_path / "s", **SMALL) as st:
        for i in range(3000):
            t = rng.choice(topics)
            q = rng.randrange(4)
            body = make_body(t, q, i, rng)
            r = st.put(t, body, queue_id=q, tags=f"tag{i % 3}", keys=[f"k{i}"])
            assert r.status is PutStatus.PUT_OK
            lst = expected.setdefault((t, q), [])
            assert r.queue_offset == len(lst)
            lst.append((body, r.physical_offset, r.msg_id))
        assert st.wait_for_dispatch(10)
        segs = sorted(os.listdir(tmp_path / "s" / "commitlog"))
        assert len(segs) > 10 and all(len(n) == 20 for n in segs)
        # spec 5.1: segments named by base offset, each exactly the configured size
        assert [int(n) for n in segs] == [i * 64 * 1024 for i in range(len(segs))]
        assert all(os.path.getsize(tmp_path / "s" / "commitlog" / n) == 64 * 1024 for n in segs)
        for (t, q), lst in expected.items():
            msgs = read_all(st, t, q)
            assert [m.body for m in msgs] == [b for b, _, _ in lst]
            assert [m.queue_offset for m in msgs] == list(range(len(lst)))
            assert [m.physical_offset for m in msgs] == [p for _, p, _ in lst]
            assert [m.msg_id for m in msgs] == [i for _, _, i in lst]
            assert all(m.topic == t and m.queue_id == q for m in msgs)
            assert all(m.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF for m in msgs)
            cq_dir = tmp_path / "s" / "consumequeue" / t / str(q)
            files = sorted(os.listdir(cq_dir))
            assert int(files[1]) == 200 if len(files) > 1 else True
    # reopen: everything is still there, offsets continue
    with localmq.open(tmp_path / "s", **SMALL) as st:
        assert st.recovery.mode == "normal"
        for (t, q), lst in expected.items():
            assert st.max_offset(t, q) == len(lst)
            msgs = read_all(st, t, q)
            assert (
                hashlib.sha256(b"".join(m.body for m in msgs)).digest()
                == hashlib.sha256(b"".join(b for b, _, _ in lst)).digest()
            )
        r = st.put("orders", b"after", queue_id=0)
        assert r.queue_offset == len(expected[("orders", 0)])


def test_consume_queue_units_match_spec_layout(store_factory, tmp_path):
    st = store_factory(**SMALL)
    rs = [st.put("abc", b"x" * 10, tags="TAG1") for _ in range(12)]
    st.wait_for_dispatch()
    # spec 2.2: 20-byte big-endian units (offset, size, tagsCode); files of 200 bytes = 10 units
    raw = (tmp_path / "store" / "consumequeue" / "abc" / "0" / "00000000000000000000").read_bytes()
    assert len(raw) == 200
    for i in range(10):
        u = raw[i * 20 : (i + 1) * 20]
        assert int.from_bytes(u[:8], "big") == rs[i].physical_offset
        assert int.from_bytes(u[8:12], "big") == rs[i].wrote_bytes
        assert int.from_bytes(u[12:], "big", signed=True) == 2567159
    units = st.consume_queue("abc", 0).units()
    # one dtype for every reader: RocketMQ's name tagsCode, with "tags" (this API's earlier name) as its title
    assert units.dtype.names == ("offset", "size", "tags_code")
    assert units.dtype.itemsize == 20 and units.dtype.isbuiltin == 0
    np.testing.assert_array_equal(units["offset"], [r.physical_offset for r in rs])
    np.testing.assert_array_equal(units["size"], [r.wrote_bytes for r in rs])
    np.testing.assert_array_equal(units["tags"], [2567159] * 12)
    np.testing.assert_array_equal(units["tags_code"], units["tags"])


def test_blank_record_at_segment_end(store_factory, tmp_path):
    st = store_factory(**SMALL)
    # (segments are created ahead of need, so count rolls by offset rather than by files on disk)
    while st.commit_log_max_offset <= 64 * 1024:
        st.put("t", os.urandom(1000))
    st.wait_for_dispatch()
    st.flush()
    seg0 = (tmp_path / "store" / "commitlog" / "00000000000000000000").read_bytes()
    recs = list(localmq.read_commitlog(tmp_path / "store" / "commitlog" / "00000000000000000000"))
    end = recs[-1].physical_offset + recs[-1].store_size
    # spec 1.5: an 8-byte blank (TOTALSIZE = rest of file, BLANK magic) fills the segment
    assert int.from_bytes(seg0[end : end + 4], "big") == 64 * 1024 - end
    assert seg0[end + 4 : end + 8] == bytes.fromhex("cbd43194")
    assert 64 * 1024 - end >= 8


def test_put_batch(store_factory):
    st = store_factory(**SMALL)
    st.put("b", b"first")
    bodies = [os.urandom(50 + i) for i in range(500)]
    r = st.put_batch("b", bodies, tags="T")
    assert r.status is PutStatus.PUT_OK and r.msg_num == 500 and r.queue_offset == 1
    ids = r.msg_id.split(",")
    assert len(ids) == 500 and localmq.decode_message_id(ids[0]) == ("127.0.0.1:10911", r.physical_offset)
    st.wait_for_dispatch()
    msgs = read_all(st, "b", 0)
    assert [m.body for m in msgs[1:]] == bodies
    assert len({m.store_timestamp for m in msgs[1:]}) == 1
    assert [m.msg_id for m in msgs[1:]] == ids
    assert r.wrote_bytes == sum(m.store_size for m in msgs[1:])
    with pytest.raises(ValueError):
        st.put_batch("b", [])
    # a batch with one oversize body is refused whole
    before = st.commit_log_max_offset
    with pytest.raises(localmq.MessageSizeError):
        st.put_batch("b", [b"ok", b"x" * (70 * 1024)])
    assert st.commit_log_max_offset == before


def test_get_status_found_overflow_and_next_offsets(store_factory):
    st = store_factory(**SMALL)
    g = st.get_message("none", 0, 0)
    assert g.status is GetStatus.NO_MATCHED_LOGIC_QUEUE and g.next_begin_offset == 0
    for i in range(5):
        st.put("s", b"%d" % i)
    st.wait_for_dispatch()
    g = st.get_message("s", 0, 1, 2)
    assert g.status is GetStatus.FOUND and [m.body for m in g.messages] == [b"1", b"2"]
    assert (g.next_begin_offset, g.min_offset, g.max_offset) == (3, 0, 5)
    g = st.get_message("s", 0, 5)
    assert g.status is GetStatus.OFFSET_OVERFLOW_ONE and g.next_begin_offset == 5
    g = st.get_message("s", 0, 9)
    assert g.status is GetStatus.OFFSET_OVERFLOW_BADLY and g.next_begin_offset == 5
    g = st.get_message("s", 0, 0, tags="nope")
    assert g.status is GetStatus.NO_MATCHED_MESSAGE and g.next_begin_offset == 5 and g.messages == []


def test_get_status_no_message_in_queue(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        st.put("other", b"x")
    # a queue that exists but never got a message (RocketMQ creates such CQs on first lookup)
    (tmp_path / "s" / "consumequeue" / "empty" / "0").mkdir(parents=True)
    with localmq.open(tmp_path / "s", **SMALL) as st:
        g = st.get_message("empty", 0, 0)
        assert g.status is GetStatus.NO_MESSAGE_IN_QUEUE and g.next_begin_offset == 0


def test_get_status_offset_too_small_after_first_segment_removed(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        rs = [st.put("t", os.urandom(2000)) for _ in range(100)]
    first_seg = tmp_path / "s" / "commitlog" / "00000000000000000000"
    first_seg.unlink()  # as retention would
    with localmq.open(tmp_path / "s", **SMALL) as st:
        mn = st.min_offset("t", 0)
        expect = next(r.queue_offset for r in rs if r.physical_offset >= 64 * 1024)
        assert mn == expect
        g = st.get_message("t", 0, 0)
        assert g.status is GetStatus.OFFSET_TOO_SMALL and g.next_begin_offset == mn
        g = st.get_message("t", 0, mn, 1)
        assert g.status is GetStatus.FOUND and g.messages[0].physical_offset == rs[mn].physical_offset


def test_get_status_message_was_removing_and_offset_found_null(store_factory):
    st = store_factory(**SMALL)
    rs = [st.put("t", os.urandom(2000)) for _ in range(100)]
    st.wait_for_dispatch()
    # a segment that disappears under a reader (what retention does while the CQ still points at it)
    segs = list(st._cl_mfq.files)
    st._cl_mfq.files.pop(0)
    # RocketMQ skips records that are gone and keeps scanning: the pull returns what follows them
    g = st.get_message("t", 0, 0, 4)
    first_kept = next(r for r in rs if r.physical_offset >= 64 * 1024)
    assert g.status is GetStatus.FOUND and g.messages[0].queue_offset == first_kept.queue_offset
    del st._cl_mfq.files[:]
    g = st.get_message("t", 0, 0, 4)
    assert g.status is GetStatus.MESSAGE_WAS_REMOVING and g.messages == [] and g.next_begin_offset > 0
    st._cl_mfq.files[:] = segs
    cq = st.consume_queue("t", 0)
    cqf = cq.mapped_file_queue.files.pop(1)  # units 10..19 gone
    g = st.get_message("t", 0, 12)
    assert g.status is GetStatus.OFFSET_FOUND_NULL and g.next_begin_offset == 20
    cq.mapped_file_queue.files.insert(1, cqf)
    assert st.get_message("t", 0, 12, 1).messages[0].physical_offset == rs[12].physical_offset


def test_tags_filter_hash_then_exact(store_factory):
    st = store_factory(**SMALL)
    # "Aa" and "BB" share Java hash 2112: the unit filter lets both through, the exact check must not
    assert localmq.java_hash("Aa") == localmq.java_hash("BB")
    tags = ["Aa", "BB", "C", None, "Aa"]
    for i in range(200):
        st.put("tf", b"%d" % i, tags=tags[i % 5])
    st.wait_for_dispatch()
    got = read_all(st, "tf", 0, tags="Aa")
    assert [int(m.body) for m in got] == [i for i in range(200) if tags[i % 5] == "Aa"]
    got = read_all(st, "tf", 0, tags="C || BB")
    assert [int(m.body) for m in got] == [i for i in range(200) if tags[i % 5] in ("C", "BB")]
    assert len(read_all(st, "tf", 0, tags="*")) == 200


def test_batch_transfer_limits(store_factory):
    st = store_factory()
    for _ in range(40):
        st.put("big", os.urandom(100 * 1024))
    st.wait_for_dispatch()
    g = st.get_message("big", 0, 0, 32)
    # RocketMQ's in-memory transfer limit: 256 KiB per pull (the first message is always taken)
    assert g.status is GetStatus.FOUND and len(g.messages) == 2
    g = st.get_message("big", 0, 0, 1)
    assert len(g.messages) == 1


def test_offset_by_time_and_lookup(store_factory):
    st = store_factory(**SMALL)
    stamps = []
    for i in range(30):
        r = st.put("time", b"%d" % i)
        stamps.append(r.store_timestamp)
        if i % 10 == 9:
            time.sleep(0.02)
    st.wait_for_dispatch()
    assert st.offset_by_time("time", 0, 0) == 0
    assert st.offset_by_time("time", 0, stamps[-1] + 10_000) == 30
    assert st.offset_by_time("time", 0, stamps[10]) == stamps.index(stamps[10])
    m = st.look_message_by_offset(st.consume_queue("time", 0).unit(7)[0])
    assert m.body == b"7" and m.queue_offset == 7
    assert st.look_message_by_offset(10**12) is None


def test_concurrent_producers_keep_per_queue_order(store_factory):
    st = store_factory(**SMALL)
    n_threads, per = 6, 1500

    def produce(k):
        for i in range(per):
            st.put("conc", b"%d:%d" % (k, i), queue_id=k % 3)

    ts = [threading.Thread(target=produce, args=(k,)) for k in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    st.wait_for_dispatch()
    seen = {}
    total = 0
    for q in range(3):
        for m in read_all(st, "conc", q):
            k, i = map(int, m.body.split(b":"))
            assert k % 3 == q
            assert seen.get(k, -1) == i - 1  # each producer's messages in order, none missing or doubled
            seen[k] = i
            total += 1
    assert total == n_threads * per


def test_zero_copy_bodies_outlive_close(tmp_path):
    st = localmq.open(tmp_path / "s", **SMALL)
    st.put("z", b"hello zero copy")
    st.wait_for_dispatch()
    body = st.get_message("z", 0, 0, zero_copy=True).messages[0].body
    assert isinstance(body, memoryview)
    st.close()
    # the mapping stays alive as long as the view does
    assert bytes(body) == b"hello zero copy"
    body.release()


def test_store_files_and_abort_marker(tmp_path):
    st = localmq.open(tmp_path / "s", **SMALL)
    assert (tmp_path / "s" / "abort").exists()
    assert (tmp_path / "s" / "lock").read_bytes() == b"lock"
    st.put("a", b"x")
    st.close()
    assert not (tmp_path / "s" / "abort").exists()
    cp = localmq.read_checkpoint(tmp_path / "s" / "checkpoint")
    assert cp.physic_msg_timestamp > 0 and cp.logics_msg_timestamp > 0
    st = localmq.open(tmp_path / "s", **SMALL)
    assert st.recovery.mode == "normal"
    st.close()
    st.close()  # idempotent


def test_consumers_inflate_bodies_a_rocketmq_producer_compressed(tmp_path):
    """A RocketMQ producer zlib-compresses bodies over 4 KiB and sets sysflag bit 0 (COMPRESSED): the store hands
    the bytes back as stored (as RocketMQ's store does), a Consumer inflates them (as RocketMQ's client does)."""
    import zlib

    from localmq.store.commit_log import PutExtra

    big = b"rocketmq " * 1000
    with localmq.open(tmp_path, mapped_file_size_commit_log=1 << 20) as st:
        st.put_ext("t", zlib.compress(big), extra=PutExtra(sys_flag=0x1))
        st.put("t", b"plain")
        st.put_ext("t", b"not zlib at all", extra=PutExtra(sys_flag=0x1))
        st.wait_for_dispatch(5)
        raw = st.get_message("t", 0, 0)
        assert raw.compressed == 2 and raw.messages[0].body == zlib.compress(big)
        with st.create_consumer("g", "t") as c:
            got = c.poll_batch(3, timeout=5)
        assert [m.body for m in got] == [big, b"plain", b"not zlib at all"]
        assert [m.sys_flag & 1 for m in got] == [1, 0, 1]
