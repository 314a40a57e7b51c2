"""Transactional messages: half, commit and op records (golden bytes), check-back, discard, crashes (spec §4)."""

import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
import zlib

import pytest

import localmq
from helpers import queue_messages
from localmq import LocalTransactionState as S
from localmq.errors import InvalidTransactionError, TransactionNotSupportedError

SMALL = {"mapped_file_size_commit_log": 1 << 20, "mapped_file_size_consume_queue": 6000}
FAST = {"transaction_timeout": 200, "transaction_check_interval": 100}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HALF, OP, DISCARD = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"
MAGIC = bytes.fromhex("daa320a7")
BORN_HOST = bytes([127, 0, 0, 1]) + struct.pack(">i", 0)  # StoreConfig.born_host "127.0.0.1:0"
STORE_HOST = bytes([127, 0, 0, 1]) + struct.pack(">i", 10911)  # StoreConfig.store_host "127.0.0.1:10911"


def _open(path, **kw):
    return localmq.open(path, **SMALL, **{**FAST, **kw})


def golden_record(
    *,
    topic,
    body,
    props,
    queue_id,
    flag,
    queue_offset,
    phys,
    sys_flag,
    born_ts,
    born_host,
    store_ts,
    store_host=STORE_HOST,
    reconsume=0,
    prepared=0,
):
    """Store spec §1.1, field by field (big-endian), independent of localmq's encoder."""
    topic = topic.encode()
    tail = (
        struct.pack(">i", reconsume)
        + struct.pack(">q", prepared)
        + struct.pack(">i", len(body))
        + body
        + struct.pack(">b", len(topic))
        + topic
        + struct.pack(">h", len(props))
        + props
    )
    head = (
        MAGIC
        + struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF)
        + struct.pack(">i", queue_id)
        + struct.pack(">i", flag)
        + struct.pack(">q", queue_offset)
        + struct.pack(">q", phys)
        + struct.pack(">i", sys_flag)
        + struct.pack(">q", born_ts)
        + born_host
        + struct.pack(">q", store_ts)
        + store_host
    )
    rec = head + tail
    return struct.pack(">i", len(rec) + 4) + rec


def _stored_bytes(root, phys):
    """The record at commit-log offset ``phys`` as it is in the segment file (one 1 MiB segment)."""
    with open(os.path.join(root, "commitlog", "%020d" % 0), "rb") as f:
        f.seek(phys)
        size = struct.unpack(">i", f.read(4))[0]
        f.seek(phys)
        return f.read(size)


def _props(*pairs):
    return b"\x02".join(k.encode() + b"\x01" + v.encode() for k, v in pairs)


_messages = queue_messages


def _wait(cond, timeout=15.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def test_commit_writes_half_real_and_op_records_as_rocketmq(tmp_path):
    with _open(tmp_path, transaction_check_interval=60_000) as st:
        tp = st.create_transaction_producer("pg", lambda m: S.UNKNOW, queue_id=2)
        seen = []
        r = tp.send_in_transaction(
            "orders",
            b"pay 42",
            lambda m, arg: seen.append((m, arg)) or S.COMMIT_MESSAGE,
            "ARG",
            tags="tA",
            keys=["k1", "k2"],
            properties={"x": "1", "DELAY": "3"},
            flag=5,
        )
        assert r.state is S.COMMIT_MESSAGE and r.commit is not None and r.op is not None
        tid = r.transaction_id
        assert len(tid) == 32
        ((m, arg),) = seen
        assert arg == "ARG" and m.topic == "orders" and m.queue_id == 2 and m.body == b"pay 42"
        assert m.uniq_key == tid and m.tags == "tA" and m.keys == ("k1", "k2")
        (half,) = _messages(st, HALF)
        (real,) = _messages(st, "orders", 2)
        (op,) = _messages(st, OP)
    # §4.3: producer properties (DELAY dropped by the client), then TRAN_MSG, PGROUP, REAL_TOPIC, REAL_QID;
    # sysflag transaction bits NOT_TYPE; topic RMQ_SYS_TRANS_HALF_TOPIC queue 0
    half_props = _props(
        ("x", "1"),
        ("TAGS", "tA"),
        ("KEYS", "k1 k2"),
        ("UNIQ_KEY", tid),
        ("TRAN_MSG", "true"),
        ("PGROUP", "pg"),
        ("REAL_TOPIC", "orders"),
        ("REAL_QID", "2"),
    )
    assert r.half.physical_offset == 0 and half.physical_offset == 0
    assert _stored_bytes(tmp_path, 0) == golden_record(
        topic=HALF,
        body=b"pay 42",
        props=half_props,
        queue_id=0,
        flag=5,
        queue_offset=0,
        phys=0,
        sys_flag=0,
        born_ts=half.store_timestamp,
        born_host=BORN_HOST,
        store_ts=half.store_timestamp,
    )
    # §4.4 committed record: REAL_TOPIC/REAL_QID, body/flag/born copied, sysflag COMMIT 0x8, prepared offset =
    # the half's commit-log offset, the half's property bytes unchanged
    assert real.physical_offset == r.commit.physical_offset
    assert _stored_bytes(tmp_path, real.physical_offset) == golden_record(
        topic="orders",
        body=b"pay 42",
        props=half_props,
        queue_id=2,
        flag=5,
        queue_offset=0,
        phys=real.physical_offset,
        sys_flag=0x8,
        born_ts=half.born_timestamp,
        born_host=BORN_HOST,
        store_ts=real.store_timestamp,
        prepared=0,
    )
    # §4.4 op record: body = the half's queue offset, properties WAIT=true and TAGS=d (Java HashMap order), born
    # host = the store's address
    assert _stored_bytes(tmp_path, op.physical_offset) == golden_record(
        topic=OP,
        body=b"0",
        props=b"WAIT\x01true\x02TAGS\x01d",
        queue_id=0,
        flag=0,
        queue_offset=0,
        phys=op.physical_offset,
        sys_flag=0,
        born_ts=op.born_timestamp,
        born_host=STORE_HOST,
        store_ts=op.store_timestamp,
    )
    assert op.born_timestamp == op.store_timestamp and op.physical_offset > real.physical_offset


def test_rollback_writes_only_the_op_record(tmp_path):
    with _open(tmp_path, transaction_check_interval=60_000) as st:
        tp = st.create_transaction_producer("pg", lambda m: S.UNKNOW)
        r = tp.send_in_transaction("orders", b"no", lambda m, a: S.ROLLBACK_MESSAGE, queue_id=1)
        assert r.state is S.ROLLBACK_MESSAGE and r.commit is None and r.op is not None
        assert _messages(st, "orders", 1) == []
        (op,) = _messages(st, OP)
        assert op.body == b"0" and op.raw_properties == b"WAIT\x01true\x02TAGS\x01d"
        assert st.topics() == {HALF: [0], OP: [0]}


@pytest.mark.parametrize("answer", [S.COMMIT_MESSAGE, S.ROLLBACK_MESSAGE])
@pytest.mark.parametrize("local", ["unknow", "raises"])
def test_unknown_state_is_checked_back(tmp_path, answer, local):
    asked = []

    def check(m):
        asked.append(m)
        return answer

    def local_tx(m, arg):
        if local == "raises":
            raise RuntimeError("local transaction failed")
        return S.UNKNOW

    with _open(tmp_path) as st:
        tp = st.create_transaction_producer("pg", check, queue_id=3)
        r = tp.send_in_transaction("orders", b"later", local_tx)
        assert r.state is S.UNKNOW and r.commit is None and r.op is None
        _wait(lambda: len(_messages(st, OP)) == 1)
        time.sleep(0.3)  # a few more passes: nothing more is asked or written
        assert len(asked) == 1
        m = asked[0]
        assert (m.topic, m.queue_id, m.body, m.uniq_key) == ("orders", 3, b"later", r.transaction_id)
        assert m.properties["TRANSACTION_CHECK_TIMES"] == "1"
        halves = _messages(st, HALF)
        assert len(halves) == 2  # the original and the copy re-put for the check (§4.5 step 6)
        orig, copy = halves
        assert copy.born_timestamp == orig.born_timestamp and copy.body == orig.body
        assert copy.raw_properties == orig.raw_properties + b"\x02TRANSACTION_CHECK_TIMES\x011"
        (op,) = _messages(st, OP)
        assert op.body == b"1"  # the op names the copy the check described
        real = _messages(st, "orders", 3)
        if answer is S.COMMIT_MESSAGE:
            (c,) = real
            assert c.sys_flag & 0xC == 0x8 and c.prepared_transaction_offset == copy.physical_offset
            assert c.raw_properties == copy.raw_properties
        else:
            assert real == []
        _wait(lambda: st.consumer_offsets.query("CID_RMQ_SYS_TRANS", HALF, 0) == 2)
        assert st.consumer_offsets.query("CID_RMQ_SYS_TRANS", OP, 0) == 1
        assert st.transaction_service.stats()["checks"] == 1
    doc = localmq.read_config_json(str(tmp_path / "config" / "consumerOffset.json"))
    assert doc["offsetTable"]["RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS"] == {"0": 2} or doc["offsetTable"][
        "RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS"
    ] == {0: 2}


def test_check_max_discards_to_trans_check_max_time_topic(tmp_path):
    asked = []
    with _open(tmp_path, transaction_check_max=2) as st:
        tp = st.create_transaction_producer("pg", lambda m: asked.append(m) or S.UNKNOW, queue_id=0)
        r = tp.send_in_transaction("orders", b"stuck", lambda m, a: S.UNKNOW)
        _wait(lambda: len(_messages(st, DISCARD)) == 1)
        time.sleep(0.3)
        assert [m.properties["TRANSACTION_CHECK_TIMES"] for m in asked] == ["1", "2"]
        (d,) = _messages(st, DISCARD)
        halves = _messages(st, HALF)
        assert len(halves) == 3
        last = halves[-1]
        # every field and the property bytes of the half that reached the maximum
        assert (d.body, d.flag, d.born_timestamp, d.born_host, d.sys_flag, d.raw_properties) == (
            last.body,
            last.flag,
            last.born_timestamp,
            last.born_host,
            last.sys_flag,
            last.raw_properties,
        )
        assert d.uniq_key == r.transaction_id and d.properties["TRANSACTION_CHECK_TIMES"] == "2"
        assert _messages(st, "orders", 0) == [] and _messages(st, OP) == []
        assert st.transaction_service.stats()["discarded"] == 1


def test_half_of_a_group_without_listener_is_counted_then_discarded(tmp_path):
    with _open(tmp_path, transaction_check_max=2) as st:
        gone = st.create_transaction_producer("gone", lambda m: S.COMMIT_MESSAGE)
        gone.send_in_transaction("orders", b"orphan", lambda m, a: S.UNKNOW, queue_id=0)
        gone.close()  # its check listener leaves with it
        asked = []
        st.create_transaction_producer("here", lambda m: asked.append(m) or S.COMMIT_MESSAGE)
        _wait(lambda: len(_messages(st, DISCARD)) == 1)
        # as RocketMQ with no producer of the group online: each check re-puts the half, nobody answers
        assert asked == [] and st.transaction_service.stats()["unanswered"] == 2
        assert _messages(st, "orders", 0) == [] and len(_messages(st, HALF)) == 3


def test_check_immunity_time_defers_the_check(tmp_path):
    asked = []
    with _open(tmp_path, transaction_check_interval=300) as st:
        tp = st.create_transaction_producer("pg", lambda m: asked.append(time.time()) or S.COMMIT_MESSAGE)
        r = tp.send_in_transaction(
            "orders", b"slow", lambda m, a: S.UNKNOW, queue_id=0, properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "1"}
        )
        _wait(lambda: len(_messages(st, OP)) == 1)
        time.sleep(0.7)
        (orig, *copies) = _messages(st, HALF)
        assert len(asked) == 1 and asked[0] * 1000 - orig.born_timestamp >= 1000
        # §4.5 step 5: inside the immunity a copy naming the original's queue offset is re-put each pass
        assert "TRAN_PREPARED_QUEUE_OFFSET" not in orig.properties and len(copies) >= 2
        assert all(c.properties["TRAN_PREPARED_QUEUE_OFFSET"] == "0" for c in copies)
        (real,) = _messages(st, "orders", 0)
        assert real.uniq_key == r.transaction_id and len(_messages(st, OP)) == 1


def test_immunity_copy_of_an_ended_transaction_is_not_checked_again(tmp_path):
    asked = []
    with _open(tmp_path, transaction_check_interval=600_000) as st:
        tp = st.create_transaction_producer("pg", lambda m: asked.append(m) or S.COMMIT_MESSAGE)
        svc = st.transaction_service
        tp.send_in_transaction(
            "orders", b"slow", lambda m, a: S.UNKNOW, queue_id=0, properties={"CHECK_IMMUNITY_TIME_IN_SECONDS": "1"}
        )
        st.wait_for_dispatch(10)
        svc.check_once()  # inside the immunity: a copy naming queue offset 0 is re-put
        orig, copy = _messages(st, HALF)
        assert copy.properties["TRAN_PREPARED_QUEUE_OFFSET"] == "0"
        tp.end_transaction(orig, S.ROLLBACK_MESSAGE)  # the producer answers late, naming the original
        time.sleep(1.1)
        assert svc.check_once() == 0  # the copy, now past its immunity, is done: nobody is asked
        assert asked == [] and _messages(st, "orders", 0) == [] and len(_messages(st, HALF)) == 2
        assert st.consumer_offsets.query("CID_RMQ_SYS_TRANS", HALF, 0) == 2
        assert st.consumer_offsets.query("CID_RMQ_SYS_TRANS", OP, 0) == 1


def test_consumer_sees_committed_messages_once_and_never_a_half(tmp_path):
    answers = {}
    with _open(tmp_path) as st:
        tp = st.create_transaction_producer("pg", lambda m: answers[m.body], queue_id=0)
        expected = []
        for i in range(12):
            body = b"m%d" % i
            final = S.COMMIT_MESSAGE if i % 3 else S.ROLLBACK_MESSAGE
            answers[body] = final
            local = final if i % 2 else S.UNKNOW
            tp.send_in_transaction("orders", body, lambda m, a, s=local: s)
            if final is S.COMMIT_MESSAGE:
                expected.append(body)
        c = st.create_consumer("readers", ["orders"])
        got = []
        deadline = time.monotonic() + 15
        while len(got) < len(expected) and time.monotonic() < deadline:
            got += [m.body for m in c.poll_batch(32, timeout=0.2)]
        got += [m.body for m in c.poll_batch(32, timeout=0.5)]
        c.close()
        assert sorted(got) == sorted(expected)
        assert all(m.topic == "orders" for m in _messages(st, "orders", 0))


def test_end_transaction_commits_once_and_checks_the_record(tmp_path):
    with _open(tmp_path, transaction_check_interval=60_000) as st:
        tp = st.create_transaction_producer("pg", lambda m: S.UNKNOW)
        r = tp.send_in_transaction("orders", b"x", lambda m, a: S.UNKNOW, queue_id=0)
        (half,) = _messages(st, HALF)
        assert tp.end_transaction(half, S.COMMIT_MESSAGE).commit is not None
        again = tp.end_transaction(half, S.COMMIT_MESSAGE)  # a second answer: the commit is found
        assert again.commit is None and again.op is not None
        assert [m.body for m in _messages(st, "orders", 0)] == [b"x"]
        assert st.transaction_service.stats()["duplicates_avoided"] == 1
        assert r.transaction_id == half.uniq_key
        other = st.create_transaction_producer("other", lambda m: S.UNKNOW)
        with pytest.raises(InvalidTransactionError):
            other.end_transaction(half, S.COMMIT_MESSAGE)
        with pytest.raises(InvalidTransactionError):
            tp.end_transaction(_messages(st, "orders", 0)[0], S.COMMIT_MESSAGE)


def test_shared_and_memory_queues_refuse_transaction_producers(tmp_path):
    with localmq.open(tmp_path, shared=True, **SMALL) as st:
        with pytest.raises(TransactionNotSupportedError):
            st.create_transaction_producer("pg", lambda m: S.UNKNOW)
    with pytest.raises(TransactionNotSupportedError):
        localmq.MemoryMessageQueue().create_transaction_producer("pg", lambda m: S.UNKNOW)


def test_store_config_defaults_are_rocketmq_498():
    c = localmq.StoreConfig()
    assert (c.transaction_timeout, c.transaction_check_max, c.transaction_check_interval) == (6000, 15, 60_000)


_CHILD = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, sys.argv[2])
    import localmq
    from localmq import LocalTransactionState as S
    st = localmq.open(sys.argv[1], mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=6000,
                      transaction_timeout=100, transaction_check_interval=100)

    def check(m):  # the check-back's listener: killed while the store waits for its answer
        os.kill(os.getpid(), signal.SIGKILL)

    tp = st.create_transaction_producer("pg", check, queue_id=1)
    svc = st.transaction_service
    if sys.argv[3] == "during-check":
        def local(m, a):
            return S.UNKNOW
    elif sys.argv[3] == "before-commit":
        def local(m, a):
            os.kill(os.getpid(), signal.SIGKILL)
    else:
        def local(m, a):
            return S.COMMIT_MESSAGE
        def die(half):
            os.kill(os.getpid(), signal.SIGKILL)
        svc._put_op = die
    tp.send_in_transaction("orders", b"paid", local)
    import time
    time.sleep(30)
    print("not killed", flush=True)
""")


@pytest.mark.parametrize(
    "where, index", [("before-commit", True), ("before-op", True), ("before-op", False), ("during-check", True)]
)
def test_sigkill_between_the_steps_commits_exactly_once(tmp_path, where, index):
    store = tmp_path / "s"
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(store), ROOT, where], capture_output=True, text=True, timeout=60
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    asked = []
    # without the index the earlier commit is found by a scan of the real queue
    with _open(store, message_index_enable=index) as st:
        before = _messages(st, "orders", 1)
        assert len(before) == (1 if where == "before-op" else 0)
        assert _messages(st, OP) == []
        st.create_transaction_producer("pg", lambda m: asked.append(m) or S.COMMIT_MESSAGE)
        _wait(lambda: len(_messages(st, OP)) >= 1)
        time.sleep(0.4)  # later passes change nothing
        real = _messages(st, "orders", 1)
        assert [m.body for m in real] == [b"paid"]
        if where == "before-op":
            # the commit survived: the checker writes the op record without asking (RocketMQ would commit again)
            assert asked == [] and st.transaction_service.stats()["duplicates_avoided"] == 1
            assert len(_messages(st, HALF)) == 1
        elif where == "during-check":
            # the original and the first copy were both pending: one question, one commit, an op for each
            _wait(lambda: len(_messages(st, OP)) == 2)
            assert len(asked) == 1 and st.transaction_service.stats()["duplicates_avoided"] == 1
            assert sorted(int(m.body) for m in _messages(st, OP)) == [1, 2]
        else:
            assert len(asked) == 1 and asked[0].body == b"paid"
    with _open(store) as st:  # and after another reopen
        st.create_transaction_producer("pg", lambda m: asked.append(m) or S.COMMIT_MESSAGE)
        time.sleep(0.5)
        assert [m.body for m in _messages(st, "orders", 1)] == [b"paid"]
