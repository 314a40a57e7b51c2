"""LocalMessageQueue.get_bodies: bodies (and the fields asked for) of a queue without a Message per body.

Expectations come from what the tests put (bodies, counts, SHA-256 of the stream) and from get_message over the same
range; damaged records must give get_message's typed errors.
"""

import hashlib
import random
import zlib

import pytest

import helpers
import localmq
from helpers import patch, read_bytes
from localmq import GetBodiesResult, GetStatus
from localmq.errors import ArgumentRangeError, ArgumentTypeError, CorruptMessageError, StoreClosedError
from localmq.store.commit_log import PutExtra
from localmq.store.get import BODY_FIELDS

SMALL = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=400)  # 20 units a CQ file
UNIT = 20


def fill(st, n=900, topics=("a", "b"), queues=2, seed=3):
    """Put ``n`` messages with distinct bodies of 0..300 bytes over topics x queues, tags t0..t2, some keys and
    properties; returns {(topic, qid): [bodies]}."""
    rng = random.Random(seed)
    written = {}
    for i in range(n):
        t = topics[i % len(topics)]
        q = (i // len(topics)) % queues
        body = b"%d:" % i + rng.randbytes(rng.randrange(0, 300))
        st.put(
            t,
            body,
            queue_id=q,
            tags="t%d" % (i % 3),
            keys=["k%d" % i] if i % 4 == 0 else None,
            properties={"n": str(i)} if i % 5 == 0 else None,
        )
        written.setdefault((t, q), []).append(body)
    st.wait_for_dispatch(10)
    return written


def all_bodies(st, topic, qid, max_messages=1024, **kw):
    """Every body of (topic, qid) from offset 0 through get_bodies, and how many calls it took."""
    out, off, calls = [], 0, 0
    while True:
        r = st.get_bodies(topic, qid, off, max_messages, **kw)
        calls += 1
        if r.status is not GetStatus.FOUND:
            assert r.status is GetStatus.OFFSET_OVERFLOW_ONE and not r.bodies, r
            return out, calls
        assert len(r.bodies) >= 1 and all(type(b) is bytes for b in r.bodies)
        out.extend(r.bodies)
        off = r.next_begin_offset


def test_every_body_comes_back_once_in_order(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        written = fill(st)
        for (t, q), bodies in written.items():
            got, calls = all_bodies(st, t, q)
            assert len(got) == len(bodies)
            assert hashlib.sha256(b"".join(got)).digest() == hashlib.sha256(b"".join(bodies)).digest()
            assert got == bodies
            # RocketMQ's 32-message transfer limit is get_message's; get_bodies takes up to max_messages at once
            assert calls < len(bodies) / 32


def test_a_batch_is_get_message_without_message_objects(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        written = fill(st)
        for (t, q), bodies in written.items():
            for off in (0, 1, 17, 19, 20, len(bodies) - 1):
                for n in (1, 7, 32):
                    for tags in (None, "t1", "t0 || t2", "nope"):
                        g = st.get_message(t, q, off, n, tags=tags)
                        r = st.get_bodies(t, q, off, n, tags=tags, fields=BODY_FIELDS)
                        assert isinstance(r, GetBodiesResult)
                        assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset, r.compressed) == (
                            g.status,
                            g.next_begin_offset,
                            g.min_offset,
                            g.max_offset,
                            g.compressed,
                        )
                        assert r.bodies == [m.body for m in g.messages]
                        assert sorted(r.fields) == sorted(BODY_FIELDS)
                        for name in BODY_FIELDS:
                            assert r.fields[name] == [getattr(m, name) for m in g.messages], name
        # the fields asked for, and only those
        r = st.get_bodies("a", 0, 0, 10, fields=("queue_offset", "tags"))
        assert sorted(r.fields) == ["queue_offset", "tags"]
        assert r.fields["queue_offset"] == list(range(10))
        assert r.fields["tags"] == ["t%d" % (i % 3) for i in range(0, 40, 4)]  # a-0 holds every 4th put
        assert st.get_bodies("a", 0, 0, 10).fields == {}


def test_statuses_at_the_edges_are_get_message_s(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        fill(st, 40)
        st.put("empty", b"x", queue_id=3)
        st.wait_for_dispatch(10)
        for args in (("nope", 0, 0), ("a", 5, 0), ("a", 0, 10), ("a", 0, 11), ("a", 0, 500)):
            g = st.get_message(*args)
            r = st.get_bodies(*args)
            assert (r.status, r.next_begin_offset, r.min_offset, r.max_offset, r.bodies) == (
                g.status,
                g.next_begin_offset,
                g.min_offset,
                g.max_offset,
                [],
            ), args
        assert st.get_bodies("a", 0, 10).status is GetStatus.OFFSET_OVERFLOW_ONE
        assert st.get_bodies("nope", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE


def test_max_bytes_bounds_a_batch_and_the_first_message_always_comes(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        bodies = [bytes([i]) * 1000 for i in range(50)]
        st.put_batch("t", bodies)
        st.wait_for_dispatch(10)
        r = st.get_bodies("t", 0, 0, 100, max_bytes=1)
        assert r.bodies == bodies[:1] and r.next_begin_offset == 1
        sizes = st.get_bodies("t", 0, 0, 100, fields=("store_size",)).fields["store_size"]
        r = st.get_bodies("t", 0, 0, 100, max_bytes=sum(sizes[:7]))
        assert r.bodies == bodies[:7]
        got, _ = all_bodies(st, "t", 0, max_bytes=3000)
        assert got == bodies


def test_compressed_bodies_come_as_stored_and_are_counted(tmp_path):
    raw = b"compress me " * 600
    with localmq.open(tmp_path / "s", **SMALL) as st:
        st.put("t", b"plain")
        st.put_ext("t", zlib.compress(raw), extra=PutExtra(sys_flag=1, reconsume_times=2))
        st.wait_for_dispatch(10)
        r = st.get_bodies("t", 0, 0, fields=("sys_flag",))
        assert r.compressed == 1 and r.fields["sys_flag"] == [0, 1]
        assert r.bodies[0] == b"plain" and zlib.decompress(r.bodies[1]) == raw


def test_bodies_stay_valid_after_the_store_is_closed_and_removed(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = fill(st, 200)
        got, _ = all_bodies(st, "a", 0)
    for p in sorted(root.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    assert got == written["a", 0]


def test_closed_store_and_bad_arguments_are_typed_errors(tmp_path):
    st = localmq.open(tmp_path / "s", **SMALL)
    fill(st, 20)
    with pytest.raises(ArgumentRangeError) as e:
        st.get_bodies("a", 0, 0, fields=("body",))
    assert e.value.argument == "fields"
    for bad in ("tags", 5, [1]):
        with pytest.raises((ArgumentTypeError, ArgumentRangeError)) as e:
            st.get_bodies("a", 0, 0, fields=bad)
        assert e.value.argument == "fields"
    with pytest.raises(ArgumentRangeError):
        st.get_bodies("a", 0, 0, max_bytes=0)
    with pytest.raises(ArgumentTypeError):
        st.get_bodies("a", 0, 0, max_bytes="1")
    with pytest.raises(ArgumentRangeError):
        st.get_bodies("a", 0, 0, 0)
    with pytest.raises(ArgumentTypeError):
        st.get_bodies("a", "0", 0)
    assert st.get_bodies("a", 0, 0, fields=["queue_offset"]).fields["queue_offset"] == list(range(5))
    st.close()
    with pytest.raises(StoreClosedError):
        st.get_bodies("a", 0, 0)


def cq_file(root, topic, qid, unit):
    return helpers.cq_file(root, topic, qid, unit, SMALL["mapped_file_size_consume_queue"])


def both_raise(st, *args):
    """The CorruptMessageError of get_message and of get_bodies for the same arguments, checked to be the same."""
    with pytest.raises(CorruptMessageError) as g:
        st.get_message(*args)
    with pytest.raises(CorruptMessageError) as r:
        st.get_bodies(*args)
    g, r = g.value, r.value
    assert (r.offset, r.path, r.topic, r.queue_id, r.queue_offset, r.next_offset, r.reason, str(r)) == (
        g.offset,
        g.path,
        g.topic,
        g.queue_id,
        g.queue_offset,
        g.next_offset,
        g.reason,
        str(g),
    )
    return r


def test_a_flipped_body_byte_is_get_message_s_crc_error(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = fill(st, 300, topics=("a",), queues=1)
        m = st.get_message("a", 0, 9, 1).messages[0]
        seg_size = SMALL["mapped_file_size_commit_log"]
        seg = root / "commitlog" / ("%020d" % (m.physical_offset - m.physical_offset % seg_size))
        rec_at = m.physical_offset % seg_size
        body_at = rec_at + read_bytes(seg, rec_at, m.store_size).index(m.body)
        patch(seg, body_at + 1, bytes([read_bytes(seg, body_at + 1, 1)[0] ^ 0x41]))  # the live mapping sees it
        r = st.get_bodies("a", 0, 0, 100)
        assert r.status is GetStatus.FOUND and r.bodies == written["a", 0][:9] and r.next_begin_offset == 9
        e = both_raise(st, "a", 0, 9, 100)
        assert e.queue_offset == 9 and e.next_offset == 10 and e.offset == m.physical_offset and "crc" in e.reason
        r = st.get_bodies("a", 0, 10, 1000)
        assert r.bodies == written["a", 0][10:]


def test_a_unit_pointing_at_another_record_or_nowhere_is_get_message_s_error(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = fill(st)
        patch(*cq_file(root, "a", 0, 5), read_bytes(*cq_file(root, "a", 0, 7), UNIT))  # another record of the queue
        patch(*cq_file(root, "a", 1, 3), read_bytes(*cq_file(root, "b", 1, 3), UNIT))  # a record of another topic
        path, pos = cq_file(root, "a", 1, 9)
        patch(path, pos + 8, (12345).to_bytes(4, "big"))  # a wrong size
        path, pos = cq_file(root, "a", 1, 12)
        patch(path, pos, (10**12).to_bytes(8, "big"))  # past the log's end
        assert st.get_bodies("a", 0, 0, 100).bodies == written["a", 0][:5]
        assert "queue offset 7" in both_raise(st, "a", 0, 5, 100).reason
        for bad in (3, 9, 12):
            both_raise(st, "a", 1, bad, 100)
        got, off = [], 0
        while off < len(written["a", 1]):
            try:
                r = st.get_bodies("a", 1, off, 100)
            except CorruptMessageError as e:
                off = e.next_offset
                continue
            got.extend(r.bodies)
            off = r.next_begin_offset
        assert got == [b for i, b in enumerate(written["a", 1]) if i not in (3, 9, 12)]


def test_read_only_and_shared_queues_read_bodies_too(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        written = fill(st, 100)
    with localmq.open(root, read_only=True) as ro:
        assert all_bodies(ro, "b", 1)[0] == written["b", 1]
    with localmq.open(root, shared=True) as sh:
        assert all_bodies(sh, "a", 1)[0] == written["a", 1]
