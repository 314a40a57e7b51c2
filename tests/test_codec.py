"""Frame codec: golden bytes written from the spec's field table, hashes, properties, ids, range decode."""

import struct
import zlib

import numpy as np
import pytest

import localmq
from helpers import golden_record, java_hash_reference

BLANK = bytes.fromhex("cbd43194")


def test_golden_bytes_match_encoder():
    want = golden_record()
    # spec 1.2: with IPv4 hosts total = 91 + body + topic + props
    assert len(want) == 91 + 32 + 3 + len(b"TAGS\x01TAG1")
    got = localmq.encode_message(
        "abc",
        b"Once, there was a chance for me!",
        queue_id=3,
        flag=7,
        queue_offset=11,
        physical_offset=4096,
        born_timestamp=1_600_000_000_123,
        born_host="127.0.0.1:0",
        store_timestamp=1_600_000_000_456,
        store_host="192.168.71.1:8123",
        reconsume_times=2,
        properties=b"TAGS\x01TAG1",
    )
    assert got == want


def test_golden_bytes_decode():
    m = localmq.decode_message(golden_record())
    assert (m.topic, m.queue_id, m.flag, m.queue_offset, m.physical_offset) == ("abc", 3, 7, 11, 4096)
    assert (m.born_timestamp, m.store_timestamp, m.reconsume_times) == (1_600_000_000_123, 1_600_000_000_456, 2)
    assert m.body == b"Once, there was a chance for me!"
    assert m.tags == "TAG1" and m.keys == ()
    assert m.born_host == "127.0.0.1:0" and m.store_host == "192.168.71.1:8123"
    assert m.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF
    # spec 1.8: offset message id = store ip, port, offset as uppercase hex
    assert m.msg_id == "C0A8470100001FBB" + "%016X" % 4096


def test_ipv6_hosts_set_sysflag_and_widths():
    born6 = bytes(15) + b"\x01" + struct.pack(">i", 9)
    store6 = bytes.fromhex("fe800000000000000000000000000001") + struct.pack(">i", 10911)
    want = golden_record(sys_flag=0x30, born_host=born6, store_host=store6)
    assert len(want) == 91 + 24 + 32 + 3 + 9
    got = localmq.encode_message(
        "abc",
        b"Once, there was a chance for me!",
        queue_id=3,
        flag=7,
        queue_offset=11,
        physical_offset=4096,
        born_timestamp=1_600_000_000_123,
        born_host="[::1]:9",
        store_timestamp=1_600_000_000_456,
        store_host="[fe80::1]:10911",
        reconsume_times=2,
        properties=b"TAGS\x01TAG1",
    )
    assert got == want
    m = localmq.decode_message(want)
    assert m.sys_flag == 0x30 and m.store_timestamp == 1_600_000_000_456
    assert m.born_host == "[::1]:9" and m.store_host == "[fe80::1]:10911"
    assert len(m.msg_id) == 56
    assert localmq.decode_message_id(m.msg_id) == ("[fe80::1]:10911", 4096)


@pytest.mark.parametrize("hosts", [("127.0.0.1:0", "127.0.0.1:10911"), ("[::2]:7", "[::1]:10911")], ids=["v4", "v6"])
@pytest.mark.parametrize("topic", ["bench", "T" * 200], ids=["v1", "v2"])
def test_put_batch_records_are_the_single_record_encoding(tmp_path, hosts, topic):
    """put_batch encodes the fields its records share once and copies them to each record: every record it writes is
    byte for byte what the single-record encoder (checked above against the spec's golden bytes) gives for the same
    fields, for V1 and V2 (a topic over 127 bytes) records, IPv4 and IPv6 hosts, empty and buffer bodies."""
    born, store = hosts
    bodies = [b"abc", b"", bytearray(b"xyz" * 50), memoryview(b"q" * 7), b"z" * 1000]
    path = tmp_path / "s"
    with localmq.open(path, born_host=born, store_host=store, mapped_file_size_commit_log=1 << 20) as st:
        st.put_batch(topic, [b"first"], queue_id=1)
        r = st.put_batch(topic, bodies, queue_id=1, flag=5, tags="tg", keys=["k1", "k2"], properties={"a": "1"})
        assert r.msg_num == len(bodies)
    data = (path / "commitlog" / ("0" * 20)).read_bytes()
    pos = r.physical_offset
    for i, body in enumerate(bodies):
        m = localmq.decode_message(data, pos)
        assert (m.topic, m.queue_id, m.queue_offset, m.physical_offset) == (topic, 1, 1 + i, pos)
        assert m.properties == {"a": "1", "TAGS": "tg", "KEYS": "k1 k2"}
        want = localmq.encode_message(
            topic,
            bytes(body),
            queue_id=1,
            flag=5,
            queue_offset=1 + i,
            physical_offset=pos,
            born_timestamp=m.born_timestamp,
            born_host=born,
            store_timestamp=m.store_timestamp,
            store_host=store,
            properties=m.raw_properties,
        )
        assert data[pos : pos + len(want)] == want, f"record {i}"
        pos += len(want)
    assert pos == r.physical_offset + r.wrote_bytes


def test_blank_record_bytes():
    assert localmq.encode_blank(108) == struct.pack(">i", 108) + BLANK
    assert localmq.decode_message(localmq.encode_blank(108) + bytes(100)) is None


def test_crc_mismatch_and_bad_lengths_raise():
    rec = bytearray(golden_record())
    rec[90] ^= 0xFF  # a body byte
    with pytest.raises(localmq.CorruptFrameError, match="bad crc"):
        localmq.decode_message(bytes(rec))
    assert localmq.decode_message(bytes(rec), check_crc=False).body != b"Once, there was a chance for me!"
    rec = bytearray(golden_record())
    rec[0:4] = struct.pack(">i", len(rec) + 5)  # TOTALSIZE beyond the bytes present: torn
    with pytest.raises(localmq.CorruptFrameError, match="torn"):
        localmq.decode_message(bytes(rec))
    rec = bytearray(golden_record()) + bytes(16)
    rec[0:4] = struct.pack(">i", len(rec) - 16 + 4)  # TOTALSIZE disagrees with the fields
    with pytest.raises(localmq.CorruptFrameError, match="bad length"):
        localmq.decode_message(bytes(rec))
    with pytest.raises(localmq.CorruptFrameError, match="bad magic"):
        localmq.decode_message(b"\x00\x00\x00\x80" + b"\x01\x02\x03\x04" + bytes(120))


@pytest.mark.parametrize(
    "text,expected",
    [
        ("", 0),
        ("a", 97),
        ("TAG1", 2567159),
        ("hello", 99162322),
        ("\u4e2d\u6587", 20013 * 31 + 25991),
        ("\U0001f600", 0xD83D * 31 + 0xDE00),
    ],
)
def test_java_hash(text, expected):
    assert localmq.java_hash(text) == expected == java_hash_reference(text)


@pytest.mark.parametrize("text", ["abc#k1", "topic#" + "x" * 100, "\u00e9t\u00e9 \U0001f600 tags", "Aa", "BB"])
def test_java_hash_matches_definition(text):
    assert localmq.java_hash(text) == java_hash_reference(text)


def test_java_hash_wraps_negative():
    # "polygenelubricants".hashCode() == Integer.MIN_VALUE, a well-known Java example
    assert localmq.java_hash("polygenelubricants") == -2147483648
    assert localmq.tags_hash("polygenelubricants") == -2147483648


def test_properties_rules():
    raw = "TAGS\x01A\x02KEYS\x01k1 k2\x02\x02x\x01\x02\x01y\x02ab\x02UNIQ_KEY\x01U1\x02"
    # spec 1.7: segments < 3 chars skipped, empty key or value dropped, trailing 0x02 tolerated
    assert localmq.parse_properties(raw.encode()) == {"TAGS": "A", "KEYS": "k1 k2", "UNIQ_KEY": "U1"}
    assert localmq.properties_to_bytes({"A": "1", "B": "2"}) == b"A\x011\x02B\x012"
    with pytest.raises(localmq.InvalidPropertyError):
        localmq.properties_to_bytes({"A": "x\x02y"})
    with pytest.raises(localmq.PropertiesSizeError):
        localmq.properties_to_bytes({"A": "x" * 40000})


def test_decode_range_columns():
    recs = b"".join(golden_record(queue_offset=i, phys=1000 + i * 138, body=bytes([i]) * 32) for i in range(5))
    size = len(golden_record())
    data = recs + localmq.encode_blank(64) + bytes(56)
    cols = localmq.RecordColumns(16)
    n, pos, reason = localmq.decode_range(data, cols, 0, -1, 1000)
    assert (n, pos, reason) == (5, 5 * size, "blank")
    assert list(cols["queue_offset"]) == [0, 1, 2, 3, 4]
    assert list(cols["physical_offset"]) == [1000 + i * size for i in range(5)]
    assert list(cols["tags_code"]) == [2567159] * 5
    assert bytes(cols.body(3)) == bytes([3]) * 32
    offs, blob = cols.gather_bodies()
    assert list(offs) == [0, 32, 64, 96, 128, 160]
    assert bytes(blob) == b"".join(bytes([i]) * 32 for i in range(5))
    small = localmq.RecordColumns(2)
    assert localmq.decode_range(data, small, 0, -1, 0)[2] == "full"
    assert localmq.decode_range(data[: size * 2 + 10], cols)[1:] == (size * 2, "torn")
    np.testing.assert_array_equal(cols["body_crc"], [zlib.crc32(bytes([i]) * 32) & 0x7FFFFFFF for i in range(2)])
