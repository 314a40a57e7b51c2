"""Acknowledgements, retries and dead letters: manual_ack consumers, RocketMQ's send-back records, the DLQ."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import localmq
from helpers import golden_record, queue_messages, wait_until
from localmq import ConsumeStatus
from localmq._record import pack_host
from localmq.errors import AckError, DelayNotSupportedError, InvalidDelayError, InvalidTopicError

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
SEG = 1 << 20
SMALL = {"mapped_file_size_commit_log": SEG, "mapped_file_size_consume_queue": 6000}
LEVELS = "1s 1s 1s 1s 1s 1s"  # every retry waits 1 s (RocketMQ's table starts 1s 5s 10s 30s ...)


def _open(path, **kw):
    return localmq.open(path, message_delay_level=LEVELS, **SMALL, **kw)


def _record_bytes(root, m):
    """The stored bytes of ``m`` read straight from its segment file (not through localmq's decoder)."""
    seg = m.physical_offset // SEG * SEG
    with open(os.path.join(root, "commitlog", "%020d" % seg), "rb") as f:
        f.seek(m.physical_offset - seg)
        return f.read(m.store_size)


_all = queue_messages


def _poll_until(c, n, timeout=30.0):
    got, deadline = [], time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None:
            got.append(m)
    return got


def _spec_props(raw):
    """Properties as the spec writes them: name \\x01 value \\x02, parsed without localmq."""
    out = {}
    for item in raw.split(b"\x02"):
        if item:
            k, v = item.split(b"\x01", 1)
            out[k.decode()] = v.decode()
    return out


def test_send_back_writes_rocketmq_retry_records(tmp_path):
    """Spec §1.2-1.3: record A in SCHEDULE_TOPIC_XXXX (level 3 + reconsume times), record B in %RETRY%<group> with
    A's properties unchanged; body, flag, sysflag, born timestamp and host copied; RECONSUMETIMES + 1."""
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=2)
        sent = p.send("orders", b"payload", tags="created", keys=["k1", "k2"], properties={"color": "red"})
        orig = st.look_message_by_offset(sent.physical_offset)
        c = st.create_consumer("g1", "orders", manual_ack=True)
        (m,) = _poll_until(c, 1)
        assert (m.topic, m.queue_offset, m.reconsume_times) == ("orders", 0, 0)
        m.nack()
        assert c.retried == 1 and c.unacked() == 0
        (a,) = _all(st, "SCHEDULE_TOPIC_XXXX", 2)  # level 3 -> queue 2
        raw_a = _record_bytes(tmp_path, a)
        props_a = _spec_props(a.raw_properties)
        want_props = {
            "color": "red",
            "TAGS": "created",
            "KEYS": "k1 k2",
            "UNIQ_KEY": orig.properties["UNIQ_KEY"],
            "RETRY_TOPIC": "orders",
            "WAIT": "false",
            "ORIGIN_MESSAGE_ID": orig.msg_id,
            "DELAY": "3",
            "REAL_TOPIC": "%RETRY%g1",
            "REAL_QID": "0",
        }
        assert props_a == want_props
        assert raw_a == golden_record(
            topic=b"SCHEDULE_TOPIC_XXXX",
            body=b"payload",
            props=a.raw_properties,
            queue_id=2,
            flag=0,
            queue_offset=0,
            phys=a.physical_offset,
            sys_flag=0,
            born_ts=orig.born_timestamp,
            born_host=pack_host(orig.born_host),
            store_ts=a.store_timestamp,
            store_host=pack_host(orig.store_host),
            reconsume=1,
            prepared=0,
        )
        # record B: delivered by the schedule service after level 3's delay (1 s here)
        (b,) = _poll_until(c, 1, timeout=15)
        assert b.topic == "orders"  # shown under its business topic (RocketMQ's client does the same)
        assert b.reconsume_times == 1 and b.body == b"payload" and b.tags == "created"
        (stored_b,) = _all(st, "%RETRY%g1", 0)
        assert stored_b.store_timestamp >= a.store_timestamp + 1000  # never early
        assert stored_b.raw_properties == a.raw_properties  # "identical string to A"
        assert _record_bytes(tmp_path, stored_b) == golden_record(
            topic=b"%RETRY%g1",
            body=b"payload",
            props=a.raw_properties,
            queue_id=0,
            flag=0,
            queue_offset=0,
            phys=stored_b.physical_offset,
            sys_flag=0,
            born_ts=orig.born_timestamp,
            born_host=pack_host(orig.born_host),
            store_ts=stored_b.store_timestamp,
            store_host=pack_host(orig.store_host),
            reconsume=1,
            prepared=0,
        )
        b.ack()
        c.commit()
        assert c.committed("orders", 2) == 1 and c.committed("%RETRY%g1", 0) == 1
    with open(tmp_path / "config" / "consumerOffset.json") as f:
        text = f.read()
    assert '"%RETRY%g1@g1":{0:1}' in re.sub(r"\s", "", text)


def test_dead_letter_record_bytes(tmp_path):
    """Spec §2.2: a DLQ record is record A of §1.3 in %DLQ%<group> queue 0 with DELAY=0 and no schedule detour."""
    with _open(tmp_path) as st:
        sent = st.create_producer(queue_id=1).send("orders", b"bad", tags="x", properties={"k": "v"})
        orig = st.look_message_by_offset(sent.physical_offset)
        with st.create_consumer("g", "orders", manual_ack=True) as c:
            (m,) = _poll_until(c, 1)
            m.nack(delay_level=-1)
        (d,) = _all(st, "%DLQ%g", 0)
        assert _spec_props(d.raw_properties) == {
            "k": "v",
            "TAGS": "x",
            "UNIQ_KEY": orig.uniq_key,
            "RETRY_TOPIC": "orders",
            "WAIT": "false",
            "ORIGIN_MESSAGE_ID": orig.msg_id,
            "DELAY": "0",
        }
        assert _record_bytes(tmp_path, d) == golden_record(
            topic=b"%DLQ%g",
            body=b"bad",
            props=d.raw_properties,
            queue_id=0,
            flag=0,
            queue_offset=0,
            phys=d.physical_offset,
            sys_flag=0,
            born_ts=orig.born_timestamp,
            born_host=pack_host(orig.born_host),
            store_ts=d.store_timestamp,
            store_host=pack_host(orig.store_host),
            reconsume=1,
            prepared=0,
        )
        assert "SCHEDULE_TOPIC_XXXX" not in st.topics()


def test_a_message_failed_every_time_is_seen_1_plus_16_times_then_dead_lettered(tmp_path):
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=0)
        for i in range(3):
            p.send("jobs", b"job%d" % i, tags="t", properties={"n": str(i)})
        seen = {}
        with st.create_consumer("workers", "jobs", manual_ack=True) as c:
            deadline = time.monotonic() + 90
            while c.dead_lettered < 3 and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None:
                    continue
                assert m.topic == "jobs"
                seen.setdefault(m.body, []).append(m.reconsume_times)
                m.nack(delay_level=1)
            assert c.dead_lettered == 3 and c.retried == 3 * 16
            assert c.poll(2.5) is None  # nothing comes back from the dead letters
        assert seen == {b"job%d" % i: list(range(17)) for i in range(3)}
        dead = st.dead_letters("workers")
        assert sorted(m.body for m in dead) == [b"job0", b"job1", b"job2"]
        for m in dead:
            props = m.properties
            assert m.topic == "%DLQ%workers" and m.queue_id == 0 and m.reconsume_times == 17
            assert props["RETRY_TOPIC"] == "jobs" and props["DELAY"] == "0" and props["TAGS"] == "t"
            assert props["n"] == m.body.decode()[-1]  # the original properties
            assert props["ORIGIN_MESSAGE_ID"] != m.msg_id  # the first record's id, kept


def test_committed_offset_is_the_lowest_unfinished_message(tmp_path):
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=0)
        for i in range(6):
            p.send("t", b"%d" % i)
        c = st.create_consumer("g", "t", manual_ack=True)
        got = _poll_until(c, 6)
        assert [m.queue_offset for m in got] == list(range(6))
        for i in (0, 1, 3, 5):
            got[i].ack()
        got[0].ack()  # twice: nothing more
        c.commit()
        assert c.committed("t", 0) == 2 and c.unacked() == 2
        got[2].ack()
        c.commit()
        assert c.committed("t", 0) == 4
        c.close()  # offset 4 never acknowledged: delivered again
        c2 = st.create_consumer("g", "t", manual_ack=True)
        again = _poll_until(c2, 2)
        assert [m.queue_offset for m in again] == [4, 5]
        for m in again:
            m.ack()
        c2.commit()
        assert c2.committed("t", 0) == 6
        c2.close()


def test_max_unacked_holds_a_queue_back_until_the_oldest_is_done(tmp_path):
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=0)
        for i in range(10):
            p.send("t", b"%d" % i)
        with st.create_consumer("g", "t", manual_ack=True, max_unacked=3) as c:
            first = c.poll_batch(10, timeout=2)
            assert [m.queue_offset for m in first] == [0, 1, 2]
            assert c.poll_batch(10, timeout=0.3) == []
            first[1].ack()
            assert c.poll_batch(10, timeout=0.3) == []  # the span from offset 0 is still 3
            first[0].ack()
            nxt = c.poll_batch(10, timeout=2)
            assert [m.queue_offset for m in nxt] == [3, 4]


def test_listener_answers_ack_or_retry(tmp_path):
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=0)
        for i in range(8):
            p.send("t", b"%d" % i)
        calls = []

        def listener(msgs):
            calls.append([(m.body, m.reconsume_times) for m in msgs])
            if any(int(m.body) % 2 for m in msgs) and msgs[0].reconsume_times == 0:
                if int(msgs[0].body) == 3:
                    raise RuntimeError("a listener that throws asks for a retry")
                return ConsumeStatus.RECONSUME_LATER
            return None if int(msgs[0].body) == 0 else ConsumeStatus.CONSUME_SUCCESS

        with st.create_consumer("g", "t", manual_ack=True) as c:
            handled = c.listen(listener, batch_size=1, max_messages=12)
            assert handled == 12 and c.retried == 4 and c.acked == 8
            c.commit()
            assert c.committed("t", 0) == 8 and c.committed("%RETRY%g", 0) == 4
        firsts = sorted(b for ((b, n),) in calls if n == 0)
        assert firsts == [b"%d" % i for i in range(8)]
        assert sorted(b for ((b, n),) in calls if n == 1) == [b"1", b"3", b"5", b"7"]


def test_ack_misuse_raises_typed_errors(tmp_path):
    with _open(tmp_path) as st:
        st.put("t", b"x")
        st.wait_for_dispatch(5)
        m = st.get_message("t", 0, 0).messages[0]
        with pytest.raises(AckError):
            m.ack()
        with pytest.raises(AckError):
            m.nack()
        with pytest.raises(AckError):
            localmq.Message("t", b"y").ack()
        with st.create_consumer("g", "t") as plain:
            with pytest.raises(AckError):
                plain.listen(lambda msgs: None)
            (got,) = _poll_until(plain, 1)
            with pytest.raises(AckError):
                got.ack()
        with st.create_consumer("g2", "t", manual_ack=True) as c:
            (got,) = _poll_until(c, 1)
            with pytest.raises(InvalidDelayError):
                got.nack(delay_level=0)
            with pytest.raises(InvalidDelayError):
                got.nack(delay=1, delay_level=2)
            with pytest.raises(InvalidDelayError):
                got.nack(delay=10_000)  # longer than the largest level
            assert c.unacked() == 1 and c.retried == 0
            got.nack(delay_level=-1)  # straight to the dead letters
            assert c.dead_lettered == 1 and c.unacked() == 0
        with pytest.raises(ValueError):
            st.create_consumer("g3", "t", manual_ack=True, max_unacked=0)
        with pytest.raises(InvalidTopicError):
            st.create_consumer("g" * 249, "t")  # "%RETRY%" + group would pass 255 characters
        st.wait_for_dispatch(5)
        assert [m.body for m in st.dead_letters("g2")] == [b"x"]


def test_dead_letters_are_listed_and_redriven_by_api_and_cli(tmp_path):
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=0)
        for i in range(4):
            p.send("orders", b"o%d" % i, tags="tg", keys="key%d" % i)
        with st.create_consumer("g", "orders", manual_ack=True) as c:
            for m in _poll_until(c, 4):
                m.nack(delay_level=-1)
    out = subprocess.run(
        [sys.executable, "-m", "localmq", "dlq", str(tmp_path), "g", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["body"] for r in rows] == ["o0", "o1", "o2", "o3"]
    assert all(r["properties"]["RETRY_TOPIC"] == "orders" and r["reconsume_times"] == 1 for r in rows)
    none = subprocess.run(
        [sys.executable, "-m", "localmq", "dlq", str(tmp_path), "nobody"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert none.returncode == 1 and "no dead letters" in none.stderr
    red = subprocess.run(
        [sys.executable, "-m", "localmq", "dlq", str(tmp_path), "g", "--redrive", "--max", "3"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert red.returncode == 0 and "re-drove 3" in red.stdout, red.stderr
    with _open(tmp_path) as st:
        assert st.redrive_dead_letters("g") == 1  # only the one not re-driven before
        assert st.redrive_dead_letters("g") == 0
        back = _all(st, "orders", 0)[4:]
        assert [m.body for m in back] == [b"o0", b"o1", b"o2", b"o3"]
        for i, m in enumerate(back):
            props = m.properties
            assert m.tags == "tg" and m.keys == ("key%d" % i,) and m.reconsume_times == 0
            assert "ORIGIN_MESSAGE_ID" in props and "DELAY" not in props and "RETRY_TOPIC" not in props
        with st.create_consumer("g", "orders", manual_ack=True) as c:
            again = _poll_until(c, 4)
            assert sorted(m.body for m in again) == [b"o0", b"o1", b"o2", b"o3"]


def test_memory_queue_retries_at_once_only(tmp_path):
    with localmq.MemoryMessageQueue() as mq:
        mq.put("t", b"a")
        with mq.create_consumer("g", "t", manual_ack=True, max_reconsume_times=1) as c:
            (m,) = _poll_until(c, 1)
            with pytest.raises(DelayNotSupportedError):
                m.nack()
            m.nack(delay=0)
            (r,) = _poll_until(c, 1)
            assert r.topic == "t" and r.body == b"a" and r.properties["RECONSUME_TIME"] == "1"
            r.nack(delay=0)  # max_reconsume_times reached: the dead letters
            assert c.dead_lettered == 1 and c.retried == 1
        assert [m.body for m in mq.dead_letters("g")] == [b"a"]


def test_broadcast_nack_drops_without_send_back(tmp_path):
    with _open(tmp_path) as st:
        st.put("t", b"x")
        with st.create_consumer("g", "t", manual_ack=True, broadcast=True, client_id="c1") as c:
            (m,) = _poll_until(c, 1)
            m.nack()
            assert c.retried == 0 and c.unacked() == 0
            c.commit()
            assert c.committed("t", 0) == 1
        assert "%RETRY%g" not in st.topics()


_WORKER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    import localmq
    st = localmq.open(sys.argv[1], shared=True, message_delay_level="1s 1s 1s 1s",
                      mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=6000)
    c = st.create_consumer("g", "t", manual_ack=True, consumer_retention_ms=1000)
    got = []
    while len(got) < 20:
        m = c.poll(1)
        if m is not None:
            got.append(m)
    for m in got[:10]:
        m.ack()
    got[10].nack()
    c.commit()
    print("holding", flush=True)
    time.sleep(60)
""")


def test_sigkilled_consumer_process_loses_nothing_in_a_shared_store(tmp_path):
    """A consumer process acks 10 of 20 messages, fails one, then is killed holding the rest: another process's
    consumer of the group gets the 9 unfinished ones again after the lease, and the failed one from the retry
    topic; nothing acknowledged comes back, nothing is lost."""
    with _open(tmp_path, shared=True) as st:
        p = st.create_producer(queue_id=0)
        for i in range(20):
            p.send("t", b"%d" % i)
        child = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(tmp_path), str(REPO)], stdout=subprocess.PIPE, text=True, env=ENV
        )
        try:
            assert child.stdout.readline().strip() == "holding"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
            child.stdout.close()
        with st.create_consumer("g", "t", manual_ack=True, consumer_retention_ms=1000) as c:
            got = _poll_until(c, 10, timeout=30)
            for m in got:
                m.ack()
            assert c.poll(1.5) is None
            bodies = sorted(int(m.body) for m in got)
            assert bodies == [10] + list(range(11, 20)) and bodies.count(10) == 1
            retried = [m for m in got if m.reconsume_times == 1]
            assert [m.body for m in retried] == [b"10"] and retried[0].topic == "t"
            c.commit()
            assert wait_until(lambda: c.committed("t", 0) == 20 and c.committed("%RETRY%g", 0) == 1, 5)


def test_orderly_consumer_suspends_the_queue_and_retries_the_same_message(tmp_path):
    """Spec §7: one message per queue at a time, in order; a failure suspends the queue for the suspend time and
    hands the same message out again (no retry topic); after max_reconsume_times it goes to the dead letters."""
    with _open(tmp_path) as st:
        p0, p1 = st.create_producer(queue_id=0), st.create_producer(queue_id=1)
        for i in range(4):
            p0.send("t", b"a%d" % i)
            p1.send("t", b"b%d" % i)
        # both queues readable first: a new queue's messages become readable when its file is made, which may be
        # after the other queue's (QueueFileMaker)
        assert st.wait_for_dispatch(10)
        log = []
        with st.create_consumer("g", "t", orderly=True, suspend_ms=200, max_reconsume_times=2) as c:
            assert c.manual_ack and c.max_unacked == 1
            batch = c.poll_batch(10, timeout=2)
            assert sorted(m.body for m in batch) == [b"a0", b"b0"]  # one per queue
            assert c.poll_batch(10, timeout=0.2) == []  # nothing more until they are done
            deadline = time.monotonic() + 20
            pending = list(batch)
            while time.monotonic() < deadline and (pending or c.unacked()):
                for m in pending:
                    log.append((m.body, m.reconsume_times, time.monotonic()))
                    if m.body == b"a1":
                        m.nack()  # fails every time: DLQ after 1 + 2
                    elif m.body == b"b2" and m.reconsume_times == 0:
                        m.nack()  # fails once
                    else:
                        m.ack()
                pending = c.poll_batch(10, timeout=0.5)
            c.commit()
            assert c.committed("t", 0) == 4 and c.committed("t", 1) == 4
            assert c.dead_lettered == 1 and c.retried == 0
        order_a = [(b, n) for b, n, _ in log if b.startswith(b"a")]
        order_b = [(b, n) for b, n, _ in log if b.startswith(b"b")]
        assert order_a == [(b"a0", 0), (b"a1", 0), (b"a1", 1), (b"a1", 2), (b"a2", 0), (b"a3", 0)]
        assert order_b == [(b"b0", 0), (b"b1", 0), (b"b2", 0), (b"b2", 1), (b"b3", 0)]
        times = [t for b, _, t in log if b == b"a1"]
        assert all(t2 - t1 >= 0.19 for t1, t2 in zip(times, times[1:]))  # suspended between tries
        assert "%RETRY%g" not in st.topics()
        st.wait_for_dispatch(5)
        (dead,) = st.dead_letters("g")
        assert dead.body == b"a1" and dead.properties["RETRY_TOPIC"] == "t"
