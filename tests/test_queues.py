"""The three queues behind one interface: every test runs on the Memory, Embedded and Local queues."""

import os
import threading
import time

import pytest

import localmq
from localmq import GetStatus, QueueReassignedError, StoreClosedError
from localmq.queues.base import MessageStore
from localmq.store.config_json import read_config_json

KINDS = ["memory", "embedded", "local"]
LOCAL_CONFIG = dict(
    mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 4096, flush_consumer_offset_interval=200
)
EMBEDDED_CONFIG = dict(partition_size=64 * 1024, flush_interval_ms=50, flush_consumer_offset_interval=200)


class Harness:
    """Opens one kind of queue at a fixed path; ``reopen`` closes and opens it again (the Memory queue, which has
    nothing to reopen, stays the same object: its consumers are closed and created again)."""

    def __init__(self, kind, path):
        self.kind = kind
        self.path = path
        self.mq = None

    @property
    def persistent(self):
        return self.kind != "memory"

    def open(self):
        if self.kind == "memory":
            self.mq = localmq.MemoryMessageQueue(flush_consumer_offset_interval=200)
        elif self.kind == "embedded":
            self.mq = localmq.open(self.path, kind="embedded", **EMBEDDED_CONFIG)
        else:
            self.mq = localmq.open(self.path, **LOCAL_CONFIG)
        return self.mq

    def reopen(self):
        if self.kind == "memory":
            self.mq._close_clients()
            self.mq._clients = _fresh_clients(self.mq)
            return self.mq
        self.mq.close()
        return self.open()

    def close(self):
        if self.mq is not None:
            self.mq.close()


def _fresh_clients(mq):
    # the Memory queue keeps its offsets in its ClientState: reuse the offset table, renew the rest
    old = mq._clients
    from localmq.client.state import ClientState

    st = ClientState(mq, 200)
    st.offsets._table = old.offsets._table
    return st


@pytest.fixture(params=KINDS)
def harness(request, tmp_path):
    h = Harness(request.param, tmp_path / "q")
    h.open()
    yield h
    h.close()


def drain(consumer, expected, deadline_s=20.0, batch=64):
    """Poll until ``expected`` messages came (or the deadline); returns them."""
    out = []
    end = time.monotonic() + deadline_s
    while len(out) < expected and time.monotonic() < end:
        out += consumer.poll_batch(batch, timeout=0.2)
    return out


def wait_dispatched(mq):
    if isinstance(mq, localmq.LocalMessageQueue):
        assert mq.wait_for_dispatch(10)


# ------------------------------------------------------------------------------------------------ interface


def test_implements_the_interface(harness):
    assert isinstance(harness.mq, MessageStore)


def test_get_message_statuses(harness):
    mq = harness.mq
    assert mq.get_message("T", 0, 0).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
    for i in range(5):
        assert mq.put("T", b"m%d" % i, queue_id=1).ok
    wait_dispatched(mq)
    r = mq.get_message("T", 1, 0, 3)
    assert r.status is GetStatus.FOUND
    assert [m.body for m in r.messages] == [b"m0", b"m1", b"m2"]
    assert [m.queue_offset for m in r.messages] == [0, 1, 2]
    assert r.next_begin_offset == 3 and r.max_offset == 5
    assert mq.get_message("T", 1, 5).status is GetStatus.OFFSET_OVERFLOW_ONE
    bad = mq.get_message("T", 1, 9)
    assert bad.status is GetStatus.OFFSET_OVERFLOW_BADLY and bad.next_begin_offset == 5
    assert mq.max_offset("T", 1) == 5 and mq.min_offset("T", 1) == 0
    assert mq.topics() == {"T": [1]}
    with pytest.raises(localmq.InvalidQueueIdError):
        mq.get_message("T", 70000, 0)
    with pytest.raises(localmq.InvalidTopicError):
        mq.put("../x", b"")


def test_batch_and_properties_round_trip(harness):
    mq = harness.mq
    p = mq.create_producer(queue_id=2)
    r = p.send_batch("T", [b"a", b"b", b"c"], tags="t1", keys=["k1", "k2"], properties={"x": "y"})
    assert r.ok and r.msg_num == 3 and r.queue_offset == 0
    m = p.create_message("T", b"d", tags="t2", keys="k3", properties={"p": "q"})
    assert p.send(m).queue_offset == 3
    c = mq.create_consumer("g", "T")
    got = drain(c, 4)
    assert [x.body for x in got] == [b"a", b"b", b"c", b"d"]
    assert got[0].tags == "t1" and got[0].keys == ("k1", "k2") and got[0].properties["x"] == "y"
    assert got[3].tags == "t2" and got[3].keys == ("k3",) and got[3].properties["p"] == "q"
    assert all(x.queue_id == 2 and x.topic == "T" for x in got)
    assert got[0].store_timestamp > 0


def test_offset_by_time_and_seek_to_time(harness):
    mq = harness.mq
    p = mq.create_producer(queue_id=0)
    for i in range(3):
        p.send("T", b"old%d" % i)
    wait_dispatched(mq)
    time.sleep(0.01)
    cut = int(time.time() * 1000)
    time.sleep(0.01)
    for i in range(2):
        p.send("T", b"new%d" % i)
    wait_dispatched(mq)
    assert mq.offset_by_time("T", 0, cut) == 3
    assert mq.offset_by_time("T", 0, 0) == 0
    c = mq.create_consumer("g", "T")
    assert drain(c, 5)[0].body == b"old0"
    c.seek_to_time(cut)
    assert [m.body for m in drain(c, 2)] == [b"new0", b"new1"]
    c.seek("T", 0, 1)
    assert [m.body for m in drain(c, 4)] == [b"old1", b"old2", b"new0", b"new1"]


# ------------------------------------------------------------------------------------------------ producers


def test_producers_take_their_own_queue_and_a_selector_overrides(harness):
    mq = harness.mq
    ps = [mq.create_producer() for _ in range(3)]
    assert len({p.queue_id for p in ps}) == 3
    for p in ps:
        p.send("T", b"x")
    sel = mq.create_producer(queue_selector=lambda m, n: int(m.keys[0]) % n, queue_nums=4)
    for k in range(8):
        assert sel.send("S", b"v", keys=str(k)).ok
    wait_dispatched(mq)
    assert mq.topics()["S"] == [0, 1, 2, 3]
    assert all(mq.max_offset("S", q) == 2 for q in range(4))
    sel.close()
    with pytest.raises(StoreClosedError):
        sel.send("S", b"v")


def test_exactly_once_and_per_producer_order_with_concurrent_producers_and_consumers(harness):
    mq = harness.mq
    n_prod, per_prod, n_cons = 4, 600, 3
    received = [[] for _ in range(n_cons)]
    done = threading.Event()
    errors = []

    def produce(i):
        with mq.create_producer() as p:
            for s in range(0, per_prod, 3):
                if s % 2:
                    p.send_batch("T", [b"%d:%d" % (i, s + k) for k in range(3)])
                else:
                    for k in range(3):
                        p.send("T", b"%d:%d" % (i, s + k))

    def consume(j):
        try:
            with mq.create_consumer("g", "T", batch_size=16, rebalance_interval_ms=20) as c:
                while not done.is_set():
                    got = c.poll_batch(50, timeout=0.05)
                    received[j].extend((m.queue_id, m.queue_offset, m.body) for m in got)
                    c.commit(durable=False)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    consumers = [threading.Thread(target=consume, args=(j,)) for j in range(n_cons)]
    producers = [threading.Thread(target=produce, args=(i,)) for i in range(n_prod)]
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.join()
    deadline = time.monotonic() + 30
    while sum(map(len, received)) < n_prod * per_prod and time.monotonic() < deadline and not errors:
        time.sleep(0.02)
    time.sleep(0.1)  # a duplicate would arrive now
    done.set()
    for t in consumers:
        t.join()
    assert not errors
    everything = [b for r in received for (_, _, b) in r]
    assert len(everything) == n_prod * per_prod, "lost or duplicated messages"
    assert set(everything) == {b"%d:%d" % (i, s) for i in range(n_prod) for s in range(per_prod)}
    # each consumer saw each queue in offset order, and a producer's messages are in its queue in send order
    by_queue = {}
    for r in received:
        last = {}
        for q, off, body in r:
            assert off > last.get(q, -1)
            last[q] = off
            by_queue.setdefault(q, []).append((off, body))
    for q, items in by_queue.items():
        seqs = {}
        for _off, body in sorted(items):
            i, s = map(int, body.split(b":"))
            assert s > seqs.get(i, -1), f"producer {i} out of order in queue {q}"
            seqs[i] = s


# ------------------------------------------------------------------------------------------------ offsets


def test_committed_offsets_survive_a_reopen(harness):
    mq = harness.mq
    p = mq.create_producer(queue_id=0)
    for i in range(10):
        p.send("T", b"%d" % i)
    c = mq.create_consumer("g", "T", batch_size=4)
    got = [c.poll(5) for _ in range(4)]
    assert [m.body for m in got] == [b"0", b"1", b"2", b"3"]
    c.commit()
    c.poll(5)  # handed out but not committed: delivered again after the reopen
    mq = harness.reopen()
    c = mq.create_consumer("g", "T")
    assert c.committed("T", 0) == 4
    assert [m.body for m in drain(c, 6)] == [b"%d" % i for i in range(4, 10)]
    assert mq.consumer_lag("g") == {("T", 0): 6}
    c.commit()
    assert mq.consumer_lag("g") == {("T", 0): 0}
    if harness.persistent:
        doc = read_config_json(mq.offset_store_path)
        assert doc == {"offsetTable": {"T@g": {0: 10}}}
        assert os.path.exists(str(mq.offset_store_path) + ".bak")


def test_auto_commit_commits_what_earlier_polls_handed_out(harness):
    mq = harness.mq
    p = mq.create_producer(queue_id=0)
    for i in range(6):
        p.send("T", b"%d" % i)
    c = mq.create_consumer("g", "T", auto_commit=True)
    assert c.poll(5).body == b"0"
    assert c.committed("T", 0) is None
    assert c.poll(5).body == b"1"
    assert c.committed("T", 0) == 1  # the poll of "1" committed "0"
    c.close()  # close commits what was handed out
    assert mq.consumer_lag("g") == {("T", 0): 4}
    c = mq.create_consumer("g", "T", auto_commit=True)
    assert c.poll(5).body == b"2"


def test_consumer_lag_is_unknown_not_zero_and_never_negative(harness):
    mq = harness.mq
    p = mq.create_producer(queue_id=0)
    for _ in range(3):
        p.send("T", b"x")
    mq.create_producer(queue_id=1).send("T", b"y")
    wait_dispatched(mq)
    assert mq.consumer_lag("nobody") == {}
    c = mq.create_consumer("g", "T")
    assert mq.consumer_lag("g") == {("T", 0): None, ("T", 1): None}
    drain(c, 4)
    c.commit()
    assert mq.consumer_lag("g") == {("T", 0): 0, ("T", 1): 0}
    c.seek("T", 0, 2)
    c.commit()
    assert mq.consumer_lag("g")[("T", 0)] == 1
    mq.consumer_offsets.commit("g", {("T", 1): 50})  # beyond the end (a store cut short): 0, not negative
    assert mq.consumer_lag("g")[("T", 1)] == 0


# ------------------------------------------------------------------------------------------------ scheduling


def test_queues_are_balanced_and_released_on_close(harness):
    mq = harness.mq
    for q in range(4):
        mq.create_producer(queue_id=q).send("T", b"x")
    wait_dispatched(mq)
    a = mq.create_consumer("g", "T", rebalance_interval_ms=1)
    b = mq.create_consumer("g", "T", rebalance_interval_ms=1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        a.poll_batch(10, 0.01)
        b.poll_batch(10, 0.01)
        if len(a.assignment()) == 2 and len(b.assignment()) == 2:
            break
    assert sorted(a.assignment() + b.assignment()) == [("T", q) for q in range(4)]
    a.close()
    deadline = time.monotonic() + 10
    while len(b.assignment()) < 4 and time.monotonic() < deadline:
        b.poll_batch(10, 0.01)
    assert len(b.assignment()) == 4


def test_handover_after_retention_without_duplicates(harness):
    mq = harness.mq
    p = mq.create_producer(queue_id=0)
    for i in range(100):
        p.send("T", b"%d" % i)
    a = mq.create_consumer("g", "T", consumer_retention_ms=300, rebalance_interval_ms=10)
    first = [a.poll(5) for _ in range(3)]  # prefetches a batch, hands out 3
    a.commit()
    b = mq.create_consumer("g", "T", consumer_retention_ms=300, rebalance_interval_ms=10)
    assert b.poll_batch(10, timeout=0.05) == []  # a still holds the queue
    got_b = drain(b, 97, deadline_s=20)  # a stopped polling: b takes over after the retention
    assert [m.body for m in got_b] == [b"%d" % i for i in range(3, 100)]
    with pytest.raises(QueueReassignedError) as ei:
        a.poll(0.1)
    assert ei.value.queues == [("T", 0)]
    # a never hands out what it had prefetched, and cannot take the queue back while b polls
    p.send("T", b"100")
    late = []
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline:
        late += a.poll_batch(10, 0.02)
        got_b += b.poll_batch(10, 0.02)
    assert late == []
    assert got_b[-1].body == b"100"
    assert [m.body for m in first] == [b"0", b"1", b"2"]
    assert a.assignment() == []


def test_a_stale_consumer_cannot_commit_over_the_new_owner(harness):
    mq = harness.mq
    p = mq.create_producer(queue_id=0)
    for i in range(10):
        p.send("T", b"%d" % i)
    a = mq.create_consumer("g", "T", consumer_retention_ms=200, rebalance_interval_ms=10)
    a.poll_batch(5, 5)
    b = mq.create_consumer("g", "T", consumer_retention_ms=200, rebalance_interval_ms=10)
    got = drain(b, 10)
    b.commit()
    assert len(got) == 10
    with pytest.raises(QueueReassignedError):
        a.commit()
    assert b.committed("T", 0) == 10


def test_broadcasting_delivers_everything_to_every_consumer(harness):
    mq = harness.mq
    for q in range(3):
        p = mq.create_producer(queue_id=q)
        for i in range(20):
            p.send("T", b"%d-%d" % (q, i))
    cs = [mq.create_consumer("g", "T", broadcast=True, client_id=f"c{i}") for i in range(3)]
    for c in cs:
        got = drain(c, 60)
        assert sorted(m.body for m in got) == sorted(b"%d-%d" % (q, i) for q in range(3) for i in range(20))
        c.commit()
    assert mq.consumer_offsets.group_offsets("g%c1") == {("T", q): 20 for q in range(3)}
    anon = mq.create_consumer("g", "T", broadcast=True)
    assert len(drain(anon, 60)) == 60


# ------------------------------------------------------------------------------------------------ polling


def test_long_poll_wakes_a_waiting_consumer(harness):
    mq = harness.mq
    c = mq.create_consumer("g", "T")
    result = []
    waiting = threading.Event()

    def wait():
        waiting.set()
        result.append(c.poll(timeout=30))

    t = threading.Thread(target=wait)
    t.start()
    waiting.wait()
    time.sleep(0.05)
    mq.create_producer().send("T", b"hello")
    t.join(30)
    assert not t.is_alive()
    assert result[0] is not None and result[0].body == b"hello"
    # a batch poll also wakes for a queue that did not exist while it waited
    out = []
    t = threading.Thread(target=lambda: out.append(c.poll_batch(10, timeout=30)))
    t.start()
    time.sleep(0.05)
    mq.create_producer(queue_id=7).send("T", b"new queue")
    t.join(30)
    assert [m.body for m in out[0]] == [b"new queue"]


def test_poll_times_out_empty(harness):
    c = harness.mq.create_consumer("g", "T")
    assert c.poll(0.05) is None
    assert c.poll_batch(5, 0.01) == []


def test_iteration_ends_when_closed(harness):
    mq = harness.mq
    p = mq.create_producer()
    for i in range(5):
        p.send("T", b"%d" % i)
    c = mq.create_consumer("g", "T")
    seen = []

    def run():
        for m in c:
            seen.append(m.body)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while len(seen) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    c.close()
    t.join(10)
    assert not t.is_alive()
    assert seen == [b"%d" % i for i in range(5)]
    with pytest.raises(StoreClosedError):
        c.poll(0)


def test_closing_the_queue_closes_its_clients(harness):
    mq = harness.mq
    p = mq.create_producer()
    p.send("T", b"x")
    c = mq.create_consumer("g", "T", auto_commit=True)
    assert c.poll(5) is not None
    harness.close()
    assert c.closed and p.closed
    with pytest.raises(StoreClosedError):
        p.send("T", b"y")


def test_tag_filtering(harness):
    mq = harness.mq
    p = mq.create_producer(queue_id=0)
    for i in range(30):
        p.send("T", b"%d" % i, tags=["a", "b", "c"][i % 3])
    p.send("T", b"untagged")
    c = mq.create_consumer("g", "T", tags="a || c")
    got = drain(c, 20)
    assert [m.body for m in got] == [b"%d" % i for i in range(30) if i % 3 != 1]
    assert c.poll(0.05) is None
    c.commit()
    assert mq.consumer_lag("g") == {("T", 0): 0}  # filtered-out messages count as consumed
    star = mq.create_consumer("g2", "T", tags="*")
    assert len(drain(star, 31)) == 31
