"""Empty tags and empty property values (issue 25 item 5): stored as RocketMQ stores them (``name\\x01``, spec 1.7;
tagsCode 0, spec 2.2) by every put path and every queue kind, read back as RocketMQ's reader reads them (the pair
dropped), filtered as messages without a tag; what RocketMQ could not read back is still refused."""

import struct
import time

import pytest

import localmq
from helpers import golden_record
from localmq import GetStatus
from localmq.filter import compile_sql92
from localmq.store.readers import read_commitlog

KW = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 1024)
SEG0 = "0" * 20
JAVA_HASH_TAG1 = 2567159  # spec 2.2: "TAG1".hashCode(), confirmed in a RocketMQ fixture
# spec 1.1 with IPv4 hosts: the fields before BODYLEN take 84 bytes
BODY_LEN_AT = 84


def spec_messageProperties2String(pairs):
    """Spec 1.7 (MessageDecoder.messageProperties2String) written out: for each (name, value), name 0x01 value
    0x02; then the final 0x02 removed; UTF-8."""
    s = ""
    for name, value in pairs:
        s += name + "\x01" + value + "\x02"
    return s[:-1].encode("utf-8") if s else b""


def record_properties(rec):
    """PROPERTIES of one V1 record with IPv4 hosts, found through the length fields of spec 1.1."""
    body_len = struct.unpack_from(">i", rec, BODY_LEN_AT)[0]
    topic_at = BODY_LEN_AT + 4 + body_len
    props_at = topic_at + 1 + rec[topic_at] + 2
    props_len = struct.unpack_from(">h", rec, props_at - 2)[0]
    return rec[props_at : props_at + props_len]


def same_pairs(raw, expected):
    """raw is messageProperties2String of the (name, value) pairs in some order (a Java HashMap's order differs)."""
    segs = raw.split(b"\x02")
    assert not raw.endswith(b"\x02")
    assert sorted(segs) == sorted(spec_messageProperties2String([p]) for p in expected)
    assert len(raw) == len(spec_messageProperties2String(expected))


def cq_units(root, topic, queue_id=0):
    """The 20-byte ConsumeQueue units of spec 2.2 (offset, size, tagsCode) read from the file."""
    data = (root / "consumequeue" / topic / str(queue_id) / SEG0).read_bytes()
    out = []
    for i in range(0, len(data), 20):
        u = struct.unpack_from(">qiq", data, i)
        if u[1] <= 0:
            break
        out.append(u)
    return out


# ------------------------------------------------------------------------------------------------ the codec


def test_empty_values_serialise_as_messageProperties2String():
    assert localmq.properties_to_bytes({"a": "", "b": "x"}) == b"a\x01\x02b\x01x"
    assert localmq.properties_to_bytes({"b": "x", "a": ""}) == b"b\x01x\x02a\x01"
    assert localmq.properties_to_bytes({"a": ""}) == spec_messageProperties2String([("a", "")]) == b"a\x01"
    assert localmq.properties_to_bytes({"TAGS": "", "KEYS": "k"}) == b"TAGS\x01\x02KEYS\x01k"
    # a null value is left out (messageProperties2String skips it), an empty one is not
    assert localmq.properties_to_bytes({"a": None, "b": ""}) == b"b\x01"


def test_string2messageProperties_drops_the_empty_pairs():
    assert localmq.parse_properties(b"a\x01\x02b\x01x") == {"b": "x"}
    assert localmq.parse_properties(b"b\x01x\x02TAGS\x01") == {"b": "x"}
    assert localmq.parse_properties(b"TAGS\x01") == {}
    assert localmq.parse_properties(b"long_name\x01\x02TAGS\x01t") == {"TAGS": "t"}


@pytest.mark.parametrize("props", [{"": "x"}, {"": ""}, {"a\x01": ""}, {"a\x02": "x"}, {"a": "x\x01"}, {"a": "\x02"}])
def test_what_cannot_be_read_back_is_still_refused(props, tmp_path):
    with pytest.raises(localmq.InvalidPropertyError):
        localmq.properties_to_bytes(props)
    with localmq.open(tmp_path / "s", **KW) as st:
        with pytest.raises(localmq.InvalidPropertyError):
            st.put("t", b"x", properties=props)
        with pytest.raises(localmq.InvalidPropertyError):
            st.put("t", b"x", tags=props.get("a", "\x01"))
        assert st.put("t", b"x", tags="").ok


@pytest.mark.parametrize("props", [{1: "x"}, {"a": 1}, {b"a": "x"}])
def test_names_and_values_must_be_str(props):
    with pytest.raises(localmq.InvalidPropertyError):
        localmq.properties_to_bytes(props)


def test_tags_must_be_a_str(tmp_path):
    mq = localmq.MemoryMessageQueue()
    with pytest.raises(localmq.ArgumentTypeError):
        mq.put("t", b"x", tags=b"")
    mq.close()


# ------------------------------------------------------------------------------------------------ on disk


def test_local_store_writes_the_pairs_and_tags_code_0(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, **KW) as st:
        r0 = st.put("t", b"empty", tags="", properties={"a": "", "b": "x"})
        r1 = st.put("t", b"tagged", tags="TAG1", properties={"a": ""})
        r2 = st.put("t", b"batch", properties={"TAGS": ""})
        assert st.wait_for_dispatch(10)
        got = st.get_message("t", 0, 0, 8).messages
    log = (root / "commitlog" / SEG0).read_bytes()
    rec0 = log[r0.physical_offset : r0.physical_offset + r0.wrote_bytes]
    props0 = record_properties(rec0)
    same_pairs(props0, [("a", ""), ("b", "x"), ("TAGS", "")])
    m = got[0]
    # the whole record is spec 1.1 with those property bytes
    assert rec0 == golden_record(
        topic=b"t",
        body=b"empty",
        props=props0,
        queue_id=0,
        flag=0,
        queue_offset=0,
        phys=0,
        born_ts=m.born_timestamp,
        born_host=rec0[48:56],
        store_ts=m.store_timestamp,
        store_host=rec0[64:72],
        reconsume=0,
    )
    same_pairs(
        record_properties(log[r1.physical_offset : r1.physical_offset + r1.wrote_bytes]), [("a", ""), ("TAGS", "TAG1")]
    )
    assert record_properties(log[r2.physical_offset : r2.physical_offset + r2.wrote_bytes]) == b"TAGS\x01"
    # spec 2.2: no tags (a TAGS the reader drops) gives tagsCode 0
    assert cq_units(root, "t") == [
        (r0.physical_offset, r0.wrote_bytes, 0),
        (r1.physical_offset, r1.wrote_bytes, JAVA_HASH_TAG1),
        (r2.physical_offset, r2.wrote_bytes, 0),
    ]
    assert [(x.tags, x.properties) for x in got] == [(None, {"b": "x"}), ("TAG1", {"TAGS": "TAG1"}), (None, {})]
    assert got[0].raw_properties == props0
    # the offline reader, as RocketMQ's MessageDecoder
    with read_commitlog(root / "commitlog") as reader:
        offline = list(reader)
    assert [(x.tags, x.properties, x.raw_properties) for x in offline] == [
        (x.tags, x.properties, x.raw_properties) for x in got
    ]


def test_shared_store_and_put_batch(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, shared=True, **KW) as st:
        r = st.put_batch("t", [b"1", b"2"], tags="", properties={"a": "", "b": "x"})
        assert r.ok and r.msg_num == 2
        assert st.wait_for_dispatch(10)
        got = st.get_message("t", 0, 0, 8).messages
    assert [(m.tags, m.properties) for m in got] == [(None, {"b": "x"})] * 2
    for m in got:
        same_pairs(m.raw_properties, [("a", ""), ("b", "x"), ("TAGS", "")])
    assert [u[2] for u in cq_units(root, "t")] == [0, 0]


# ------------------------------------------------------------------------------------------------ every queue kind


def _open(kind, path):
    if kind == "memory":
        return localmq.MemoryMessageQueue()
    if kind == "embedded":
        return localmq.open(path, kind="embedded", partition_size=64 * 1024)
    return localmq.open(path, shared=kind == "shared", **KW)


def _all(mq, topic, queue_id, tags=None):
    if isinstance(mq, localmq.LocalMessageQueue):
        assert mq.wait_for_dispatch(10)
    r = mq.get_message(topic, queue_id, 0, 64, tags=tags)
    return r.messages if r.status is GetStatus.FOUND else []


@pytest.mark.parametrize("kind", ["memory", "embedded", "local", "shared"])
def test_every_put_path_reads_back_as_rocketmq(kind, tmp_path):
    mq = _open(kind, tmp_path / "q")
    try:
        mq.put("t", b"put", tags="", properties={"a": "", "b": "x"})
        mq.put_batch("t", [b"batch1", b"batch2"], tags="", properties={"a": ""})
        p = mq.create_producer(queue_id=0)
        p.send("t", b"send", tags="", properties={"a": "", "b": "x"})
        p.send(p.create_message("t", b"message", tags="", properties={"a": ""}))
        p.send_batch("t", [b"sb1"], tags="", properties={"b": ""})
        p.send_batch([p.create_message("t", b"sb2", tags="", properties={"b": "y", "a": ""})])
        p.send("t", b"tagged", tags="T")
        got = _all(mq, "t", 0)
        assert [m.body for m in got] == [b"put", b"batch1", b"batch2", b"send", b"message", b"sb1", b"sb2", b"tagged"]
        for m in got[:-1]:
            assert m.tags is None, m.body
            assert "a" not in m.properties and "TAGS" not in m.properties, m.body
            assert b"TAGS\x01" in m.raw_properties.split(b"\x02"), m.body
            assert b"a\x01" in m.raw_properties.split(b"\x02") or m.body == b"sb1", m.body
            assert m.properties.get("b") in (None, "x", "y"), m.body
        assert got[0].properties == {"b": "x"} and got[3].properties["b"] == "x"
        assert "b" not in got[5].properties and got[6].properties["b"] == "y"
        # tag filters: an empty tag is no tag (RocketMQ: tagsCode 0, the client's tag set has no null)
        assert [m.body for m in _all(mq, "t", 0, tags="T")] == [b"tagged"]
        assert [m.body for m in _all(mq, "t", 0, tags="T || x")] == [b"tagged"]
        assert len(_all(mq, "t", 0, tags="*")) == len(_all(mq, "t", 0, tags="")) == 8
        c = mq.create_consumer("g", "t", tags="T")
        deadline = time.monotonic() + 10
        seen = []
        while not seen and time.monotonic() < deadline:
            seen = c.poll_batch(16, timeout=0.2)
        assert [m.body for m in seen] == [b"tagged"]
        # SQL92: an empty value is a missing property, as on a RocketMQ broker (its map has no such key)
        assert compile_sql92("a IS NULL").matches(got[0].properties)
        assert not compile_sql92("a = ''").matches(got[0].properties)
        assert compile_sql92("b = 'x'").matches(got[0].properties)
    finally:
        mq.close()


def test_empty_delay_property_is_no_delay(tmp_path):
    # a broker's parsed properties have no DELAY then: the message is stored in its topic, DELAY\x01 kept
    with localmq.open(tmp_path / "s", message_delay_level="1s 2s", **KW) as st:
        p = st.create_producer(queue_id=1)
        assert p.send("t", b"now", properties={"DELAY": ""}).ok
        (m,) = _all(st, "t", 1)
        assert "DELAY" not in m.properties and b"DELAY\x01" in m.raw_properties.split(b"\x02")
        assert _all(st, "SCHEDULE_TOPIC_XXXX", 0) == []


def test_delayed_and_transactional_paths(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, message_delay_level="1s 2s", transaction_check_interval=60_000, **KW) as st:
        p = st.create_producer(queue_id=2)
        r = p.send("late", b"d", tags="", properties={"a": "", "b": "x"}, delay_level=1)
        assert r.ok
        (s,) = _all(st, "SCHEDULE_TOPIC_XXXX", 0)
        assert s.tags is None and "a" not in s.properties and s.properties["REAL_TOPIC"] == "late"
        assert {b"TAGS\x01", b"a\x01"} <= set(s.raw_properties.split(b"\x02"))
        # the schedule unit's tagsCode is the delivery time (spec 2.2), not a tag hash
        (unit,) = cq_units(root, "SCHEDULE_TOPIC_XXXX", 0)
        assert unit[2] == s.store_timestamp + 1000

        tp = st.create_transaction_producer("pg", lambda m: localmq.LocalTransactionState.UNKNOW, queue_id=3)
        t = tp.send_in_transaction(
            "paid",
            b"tx",
            lambda m, arg: localmq.LocalTransactionState.COMMIT_MESSAGE,
            tags="",
            properties={"a": "", "b": "x"},
        )
        assert t.commit is not None
        (c,) = _all(st, "paid", 3)
        assert c.tags is None and c.properties["b"] == "x" and "a" not in c.properties

        deadline = time.monotonic() + 15
        delivered = []
        while not delivered and time.monotonic() < deadline:
            delivered = _all(st, "late", 2)
            time.sleep(0.05)
        (d,) = delivered
        assert d.tags is None and d.properties["b"] == "x" and "a" not in d.properties
    assert [u[2] for u in cq_units(root, "paid", 3)] == [0]
    assert [u[2] for u in cq_units(root, "late", 2)] == [0]
