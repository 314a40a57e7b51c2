"""RocketMQ 5.x V2 records (magic 0xDAA320AB, int16 topic length; spec 1.4 and 1.10): golden bytes built here from
the spec, decoded by localmq; stores holding V1 and V2 records read by every reader, the CLI and a plain open that
changes no byte; long topics written as V2 records."""

import hashlib
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import localmq
from helpers import queue_messages
from localmq._record import decode_message, encode_message, scan_record, walk_records
from localmq.store.readers import read_commitlog

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
KW = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 1024)
SEG = 64 * 1024
LONG = "L" * 130 + "-v2"  # 133 chars: RocketMQ 5.x writes its records as V2
LONGEST = "x" * 255  # the longest topic a ConsumeQueue directory name can hold


def rocketmq_record(
    topic, body, props=b"", *, v2, queue_id=0, queue_offset=0, physical_offset=0, store_ts=1_700_000_000_123
):
    """One record as spec 1.1 / 1.10 lays it out, written field by field (not with localmq's encoder): IPv4 hosts
    127.0.0.1:5555 (born) and 10.0.0.7:10911 (store)."""
    t = topic.encode()
    topic_len = struct.pack(">h", len(t)) if v2 else struct.pack(">b", len(t))
    magic = 0xDAA320AB if v2 else 0xDAA320A7
    fields = (
        struct.pack(">i", queue_id)
        + struct.pack(">i", 7)
        + struct.pack(">q", queue_offset)
        + struct.pack(">q", physical_offset)
        + struct.pack(">i", 0)
        + struct.pack(">q", store_ts - 5)
        + bytes([127, 0, 0, 1])
        + struct.pack(">i", 5555)
        + struct.pack(">q", store_ts)
        + bytes([10, 0, 0, 7])
        + struct.pack(">i", 10911)
        + struct.pack(">i", 0)
        + struct.pack(">q", 0)
        + struct.pack(">i", len(body))
        + body
        + topic_len
        + t
        + struct.pack(">h", len(props))
        + props
    )
    total = 4 + 4 + 4 + len(fields)
    # calMsgLength with 5.x's topicLengthSize: 91 + body + topic + props, plus one for the int16 topic length
    assert total == 91 + len(body) + len(t) + len(props) + (1 if v2 else 0)
    crc = zlib.crc32(body) & 0x7FFFFFFF
    return struct.pack(">i", total) + struct.pack(">I", magic) + struct.pack(">i", crc) + fields


def test_golden_v2_record_decodes():
    props = b"KEYS\x01order-1 order-2\x02TAGS\x01created\x02UNIQ_KEY\x01ABC"
    rec = rocketmq_record(LONG, b"payload", props, v2=True, queue_id=3, queue_offset=41, physical_offset=4096)
    assert rec[4:8] == bytes.fromhex("daa320ab")
    # the topic length is two bytes, right after the body
    at = len(rec) - 2 - len(props) - len(LONG) - 2
    assert rec[at : at + 2] == struct.pack(">h", len(LONG)) and rec[at - 7 : at] == b"payload"
    m = decode_message(rec, base_offset=4096)
    assert (m.topic, m.queue_id, m.queue_offset, m.physical_offset) == (LONG, 3, 41, 4096)
    assert m.body == b"payload" and m.tags == "created" and m.keys == ("order-1", "order-2")
    assert m.store_size == len(rec) and m.flag == 7
    assert m.store_host == "10.0.0.7:10911" and m.born_host == "127.0.0.1:5555"
    assert scan_record(rec, 0, True) == ("ok", len(rec))
    assert walk_records(rec + bytes(64), 0, -1, True, True)[:3] == (len(rec), "end", 1)


def test_v2_record_with_a_short_topic_and_damage_checks():
    # RocketMQ's reader takes the topic length size from the magic, not from the topic: a V2 record of a short topic
    rec = rocketmq_record("short", b"b" * 10, b"", v2=True)
    assert decode_message(rec).topic == "short"
    # the same bytes under the V1 magic do not add up (one length byte fewer): damage, not a message
    bad = rec[:4] + bytes.fromhex("daa320a7") + rec[8:]
    assert scan_record(bad, 0, True)[0] == "bad length"
    # a body byte flipped: the CRC says so, as for V1
    flipped = bytearray(rec)
    flipped[rec.index(b"b" * 10)] ^= 1
    assert scan_record(bytes(flipped), 0, True)[0] == "bad crc"
    # a negative int16 topic length is a bad length, never a read out of the record
    neg = bytearray(rec)
    at = len(rec) - 2 - len("short") - 2
    neg[at : at + 2] = struct.pack(">h", -3)
    assert scan_record(bytes(neg), 0, False)[0] == "bad length"


def test_encode_writes_v2_for_long_topics_only():
    props = b"TAGS\x01t"
    kw = dict(
        queue_id=3,
        flag=7,
        queue_offset=41,
        physical_offset=4096,
        born_timestamp=1_700_000_000_118,
        born_host="127.0.0.1:5555",
        store_timestamp=1_700_000_000_123,
        store_host="10.0.0.7:10911",
        properties=props,
    )
    for topic, v2 in (("T" * 127, False), ("T" * 128, True), (LONG, True), (LONGEST, True)):
        want = rocketmq_record(topic, b"payload", props, v2=v2, queue_id=3, queue_offset=41, physical_offset=4096)
        assert encode_message(topic, b"payload", **kw) == want, topic
    with pytest.raises(ValueError):
        encode_message("y" * 256, b"x")


def get_all(st, topic, q):
    """Every message of queue (topic, q), through get_message (a batch at a time)."""
    return queue_messages(st, topic, q, wait=False)


def sha(path):
    out = {}
    for d, _, names in os.walk(path):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def cli(*args, rc=0):
    p = subprocess.run(
        [sys.executable, "-m", "localmq", *map(str, args)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == rc, (p.returncode, p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout


def write_mixed(path, n=150):
    """A closed store whose segments hold V1 and V2 records interleaved; returns {(topic, qid): [bodies]}."""
    written = {}
    with localmq.open(path, **KW) as st:
        for i in range(n):
            for topic in ("short", LONG, LONGEST):
                q = i % 2
                b = f"{topic[:8]}-{q}-{i:04d}".encode() * 4
                r = st.put(topic, b, queue_id=q, tags="even" if i % 2 == 0 else "odd", keys=[f"k-{topic[:3]}-{i}"])
                assert r.ok
                written.setdefault((topic, q), []).append(b)
        st.wait_for_dispatch()
        assert st.wait_for_index(60)
    return written


def v2_offsets(path):
    """Absolute offsets of the V2 records in the store's commit log (by their magic)."""
    out = []
    for m in read_commitlog(os.path.join(path, "commitlog"), mapped_file_size=SEG):
        if len(m.topic) > 127:
            out.append(m.physical_offset)
    return out


def test_mixed_store_every_reader(tmp_path):
    path = str(tmp_path / "s")
    written = write_mixed(path)
    assert len(os.listdir(os.path.join(path, "commitlog"))) >= 2
    # the long topics really are V2 records, the short one V1
    with open(os.path.join(path, "commitlog", f"{0:020d}"), "rb") as f:
        seg = f.read()
    magics = set()
    pos = 0
    while True:
        total, magic = struct.unpack_from(">iI", seg, pos)
        if magic == 0xCBD43194 or total == 0:
            break
        magics.add(magic)
        pos += total
    assert magics == {0xDAA320A7, 0xDAA320AB}
    before = sha(path)
    with localmq.open(path, **KW) as st:
        for (topic, q), bodies in written.items():
            got = get_all(st, topic, q)
            assert [bytes(m.body) for m in got] == bodies
            assert all(m.topic == topic for m in got)
        found = st.query_message(LONG, "k-LLL-17")
        assert [bytes(m.body) for m in found] == [written[(LONG, 1)][8]]
        assert [bytes(m.body) for m in st.query_message(LONGEST, "k-xxx-4")] == [written[(LONGEST, 0)][2]]
        with st.create_consumer("g", LONG) as c:
            seen = []
            while len(seen) < 150:
                batch = c.poll_batch(64, timeout=1.0)
                assert batch
                seen += batch
            assert sorted(bytes(m.body) for m in seen) == sorted(written[(LONG, 0)] + written[(LONG, 1)])
    after = sha(path)
    # a plain open rewrote nothing of the commit log: every V2 record is where it was
    assert {k: v for k, v in after.items() if k.startswith("commitlog")} == {
        k: v for k, v in before.items() if k.startswith("commitlog")
    }
    # the Spark-free readers
    msgs = list(read_commitlog(os.path.join(path, "commitlog"), mapped_file_size=SEG))
    assert len(msgs) == 450 and {m.topic for m in msgs} == {"short", LONG, LONGEST}
    # read-only view
    ro = localmq.open(path, read_only=True)
    try:
        for (topic, q), bodies in written.items():
            assert [bytes(m.body) for m in get_all(ro, topic, q)] == bodies
        assert ro.stats()["segments"] == len(os.listdir(os.path.join(path, "commitlog")))
    finally:
        ro.close()
    snap = sha(path)
    assert json.loads(cli("verify", path, "--json"))["ok"] is True
    s = json.loads(cli("stats", path, "--json"))
    assert s["messages"] == 450 and s["topics"] == 3
    lines = [json.loads(x) for x in cli("query", path, "--topic", LONG, "--key", "k-LLL-20", "--json").splitlines()]
    assert [m["body"].encode() for m in lines] == [written[(LONG, 0)][10]]
    assert sha(path) == snap


def test_hand_built_rocketmq_segment_with_v2_records(tmp_path):
    """A commit log written as RocketMQ 5.x writes it (records from the spec, not localmq's encoder): localmq builds
    its queues from it, reads every message, and changes no byte of the records."""
    path = tmp_path / "rmq"
    (path / "commitlog").mkdir(parents=True)
    seg = bytearray(SEG)
    pos, n, expect = 0, 0, {}
    qoff = {}
    while True:
        topic = LONG if n % 3 else "TopicTest"
        body = f"m{n:05d}".encode() * 5
        k = (topic, n % 2)
        rec = rocketmq_record(
            topic,
            body,
            f"KEYS\x01key{n}\x02TAGS\x01t{n % 4}".encode(),
            v2=len(topic) > 127,
            queue_id=n % 2,
            queue_offset=qoff.get(k, 0),
            physical_offset=pos,
            store_ts=1_700_000_000_000 + n,
        )
        if pos + len(rec) + 8 > SEG:
            seg[pos : pos + 8] = struct.pack(">iI", SEG - pos, 0xCBD43194)
            break
        seg[pos : pos + len(rec)] = rec
        qoff[k] = qoff.get(k, 0) + 1
        expect.setdefault(k, []).append(body)
        pos += len(rec)
        n += 1
    (path / "commitlog" / f"{0:020d}").write_bytes(bytes(seg))
    (path / "commitlog" / f"{SEG:020d}").write_bytes(bytes(SEG))
    records_before = hashlib.sha256(bytes(seg)).hexdigest()
    assert json.loads(cli("verify", path, "--json"))["ok"] is True
    with localmq.open(str(path), **KW) as st:
        for (topic, q), bodies in expect.items():
            assert [bytes(m.body) for m in get_all(st, topic, q)] == bodies
        assert st.wait_for_index(60)
        assert [bytes(m.body) for m in st.query_message(LONG, "key4")] == [b"m00004" * 5]
    with open(path / "commitlog" / f"{0:020d}", "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == records_before


# -- never repair what is not understood ----------------------------------------------------------------------------

FOREIGN_MAGIC = 0xDAA320AF  # what a later RocketMQ record version would look like: RocketMQ's scheme, one byte apart


def write_v1(path, n=120):
    """A closed store of V1 records in one topic, two queues; returns the PutResults."""
    out = []
    with localmq.open(path, **KW) as st:
        for i in range(n):
            r = st.put("orders", f"body-{i:04d}".encode() * 8, queue_id=i % 2, keys=[f"k{i}"])
            assert r.ok
            out.append(r)
        st.wait_for_dispatch()
    return out


def segment_of(path, offset):
    return os.path.join(path, "commitlog", f"{offset // SEG * SEG:020d}"), offset % SEG


def put_foreign(path, r):
    """Replace the record of PutResult ``r`` by a record of an unknown format: same TOTALSIZE (so it is framed by its
    neighbours), the foreign magic, and a layout that is neither V1 nor V2."""
    seg, pos = segment_of(path, r.physical_offset)
    with open(seg, "r+b") as f:
        f.seek(pos)
        f.write(struct.pack(">iI", r.wrote_bytes, FOREIGN_MAGIC) + bytes([7]) * (r.wrote_bytes - 8))


def test_unknown_format_record_refuses_a_writable_open_and_changes_no_byte(tmp_path):
    path = str(tmp_path / "s")
    puts = write_v1(path)
    victim = puts[40]
    put_foreign(path, victim)
    before = sha(path)
    with pytest.raises(localmq.UnknownRecordFormatError) as e:
        localmq.open(path, **KW)
    assert e.value.offset == victim.physical_offset and e.value.magic == FOREIGN_MAGIC
    assert e.value.path == segment_of(path, victim.physical_offset)[0] and e.value.size == victim.wrote_bytes
    assert f"0x{FOREIGN_MAGIC:08X}" in str(e.value) and str(victim.physical_offset) in str(e.value)
    assert isinstance(e.value, localmq.LocalMQError)
    assert sha(path) == before
    # a second attempt says the same and still writes nothing
    with pytest.raises(localmq.UnknownRecordFormatError):
        localmq.open(path, **KW)
    assert sha(path) == before
    # read-only: what localmq knows is read
    ro = localmq.open(path, read_only=True)
    try:
        bodies = [bytes(m.body) for m in get_all(ro, "orders", 1)]
        assert bodies == [f"body-{i:04d}".encode() * 8 for i in range(1, 120, 2)]
        first = ro.get_message("orders", 0, 0, max_messages=32)
        assert [bytes(m.body) for m in first.messages] == [f"body-{i:04d}".encode() * 8 for i in range(0, 40, 2)]
        # the unit at the unknown record: a typed error naming it, and the queue goes on after it
        with pytest.raises(localmq.CorruptMessageError) as e3:
            ro.get_message("orders", 0, 20)
        assert f"0x{FOREIGN_MAGIC:08X}" in str(e3.value) and "format localmq does not know" in str(e3.value)
        assert e3.value.next_offset == 21
    finally:
        ro.close()
    # the readers name it, never skip it
    with pytest.raises(localmq.UnknownRecordFormatError) as e2:
        list(read_commitlog(os.path.join(path, "commitlog"), mapped_file_size=SEG))
    assert e2.value.offset == victim.physical_offset
    rd = read_commitlog(os.path.join(path, "commitlog"), mapped_file_size=SEG, on_corrupt="stop")
    assert len(list(rd)) == 40 and rd.stop_reason == "unknown format"
    assert sha(path) == before


def test_unknown_format_record_at_the_end_of_the_log(tmp_path):
    """Records appended by a writer of a later format after localmq's: the last one is followed by zeros."""
    path = str(tmp_path / "s")
    puts = write_v1(path)
    last = puts[-1]
    seg, pos = segment_of(path, last.physical_offset + last.wrote_bytes)
    with open(seg, "r+b") as f:
        f.seek(pos)
        f.write(struct.pack(">iI", 300, FOREIGN_MAGIC) + bytes([9]) * 292)
    before = sha(path)
    with pytest.raises(localmq.UnknownRecordFormatError) as e:
        localmq.open(path, **KW)
    assert e.value.offset == last.physical_offset + last.wrote_bytes
    assert sha(path) == before


def test_a_damaged_v1_magic_is_still_damage(tmp_path):
    """One flipped byte of a V1 magic (the rest of the record intact) is damage: a gap record, one message lost."""
    path = str(tmp_path / "s")
    puts = write_v1(path)
    victim = puts[40]
    seg, pos = segment_of(path, victim.physical_offset)
    with open(seg, "r+b") as f:
        f.seek(pos + 7)
        f.write(bytes([0xC3]))  # da a3 20 a7 -> da a3 20 c3: differs from V1 in one byte, from V2 too
    with localmq.open(path, **KW) as st:
        report = st.recovery
        assert [g["offset"] for g in report.gaps] == [victim.physical_offset]
        got = get_all_skipping(st, "orders", 0)
        assert len(got) == 59 and f"body-{40:04d}".encode() * 8 not in got


def test_garbage_over_a_record_is_still_damage(tmp_path):
    """Random bytes over records (magic included): no length read from them frames a record, so it is damage."""
    path = str(tmp_path / "s")
    puts = write_v1(path)
    victim = puts[40]
    seg, pos = segment_of(path, victim.physical_offset)
    rnd = bytes((i * 131 + 17) % 251 for i in range(victim.wrote_bytes + 20))
    with open(seg, "r+b") as f:
        f.seek(pos)
        f.write(rnd)
    with localmq.open(path, **KW) as st:
        assert [g["offset"] for g in st.recovery.gaps] == [victim.physical_offset]


def get_all_skipping(st, topic, q):
    """Bodies of queue (topic, q), stepping over the messages whose get raises CorruptMessageError."""
    out, off = [], 0
    while True:
        try:
            got = st.get_message(topic, q, off, max_messages=32)
        except localmq.CorruptMessageError as e:
            off = e.next_offset
            continue
        if not got.messages:
            return out
        out += [bytes(m.body) for m in got.messages]
        off = got.next_begin_offset


def test_cli_on_an_unknown_format_record(tmp_path):
    """verify names the record (exit 4, not damage) and walks on after it; stats finds the log's end past it."""
    path = str(tmp_path / "s")
    puts = write_v1(path)
    victim = puts[40]
    put_foreign(path, victim)
    before = sha(path)
    v = json.loads(cli("verify", path, "--json", rc=4))
    assert v["problems"] == [] and v["ok"] is False
    assert v["unknown_records"] == [
        {
            "offset": victim.physical_offset,
            "magic": f"0x{FOREIGN_MAGIC:08X}",
            "size": victim.wrote_bytes,
            "what": "a record of a format localmq does not know",
        }
    ]
    assert v["records"] == 119
    text = cli("verify", path, rc=4)
    assert "UNKNOWN FORMAT" in text and "DAMAGE" not in text
    s = json.loads(cli("stats", path, "--json"))
    assert s["commit_log"]["end"] == puts[-1].physical_offset + puts[-1].wrote_bytes
    assert sha(path) == before


def test_unknown_format_rule_both_directions():
    from localmq._record import unknown_format

    a = rocketmq_record("TopicTest", b"a" * 40, b"TAGS\x01x", v2=False)
    b = rocketmq_record(LONG, b"b" * 40, b"", v2=True, physical_offset=len(a))
    foreign = struct.pack(">iI", 120, FOREIGN_MAGIC) + bytes(range(1, 113))
    seg = foreign + a + b + bytes(200)
    assert unknown_format(seg, 0) == FOREIGN_MAGIC  # framed by the V1 record after it
    assert unknown_format(foreign + b, 0) == FOREIGN_MAGIC  # ... by a V2 record
    assert unknown_format(foreign + foreign, 0) == FOREIGN_MAGIC  # ... by another of its kind
    assert unknown_format(foreign + bytes(64), 0) == FOREIGN_MAGIC  # ... by the end of the data
    assert unknown_format(foreign, 0) == FOREIGN_MAGIC  # ... by the segment's end
    assert unknown_format(seg, len(foreign)) is None  # a V1 record is known
    # damage: a length that lands inside a record, zeros with data after them, a magic with a zero byte (a lost
    # sector), a V1 record whose magic alone is damaged
    assert unknown_format(struct.pack(">iI", 96, FOREIGN_MAGIC) + bytes(92) + a, 0) is None
    assert unknown_format(foreign + bytes(64) + a, 0) is None
    assert unknown_format(struct.pack(">iI", 120, 0xDAA30000) + bytes(range(1, 113)) + a, 0) is None
    flipped = a[:7] + b"\xc3" + a[8:]
    assert unknown_format(flipped + b, 0) is None
    # ... also when the damage reaches the body (the lengths still add up: a known record, damaged)
    both = bytearray(flipped)
    both[a.index(b"a" * 40)] ^= 0x10
    assert unknown_format(bytes(both) + b, 0) is None
    assert scan_record(flipped + b, 0, True)[0] == "bad magic"
    # a length running past the data, or too short to hold its own header
    assert unknown_format(struct.pack(">iI", 4000, FOREIGN_MAGIC) + bytes(100), 0) is None
    assert unknown_format(struct.pack(">iI", 4, FOREIGN_MAGIC) + a, 0) is None


def test_columnar_decoders_read_v2_records():
    """The Spark path's decoders (_scan.scan_range, decode_range + gather_*) over V1 and V2 records mixed, built
    from the spec."""
    from localmq._columns import RecordColumns, decode_range, gather_binary, gather_keys
    from localmq._scan import scan_range

    recs, pos = [], 0
    topics = ["TopicTest", LONG, LONGEST, "x" * 128]
    for i in range(40):
        t = topics[i % 4]
        r = rocketmq_record(
            t, b"body%d" % i, b"KEYS\x01k%d" % i, v2=len(t) > 127, physical_offset=pos, queue_offset=i // 4
        )
        recs.append((t, b"body%d" % i, pos))
        pos += len(r)
        recs[-1] += (r,)
    data = b"".join(r[3] for r in recs) + bytes(64)
    rows, nxt, reason, cols = scan_range(data, 0, len(data), fields=("body", "topic", "physical_offset"))
    assert (rows, nxt, reason) == (40, pos, "end")
    offs, buf = cols["topic"]
    got_topics = [bytes(buf[offs[i] : offs[i + 1]]).decode() for i in range(rows)]
    assert got_topics == [r[0] for r in recs]
    boffs, bbuf = cols["body"]
    assert [bytes(bbuf[boffs[i] : boffs[i + 1]]) for i in range(rows)] == [r[1] for r in recs]
    assert list(cols["physical_offset"]) == [r[2] for r in recs]
    rc = RecordColumns(64)
    n, nxt2, reason2 = decode_range(data, rc)
    assert (n, nxt2, reason2) == (40, pos, "end")
    toffs, tbuf = gather_binary(rc, "topic")
    assert [bytes(tbuf[toffs[i] : toffs[i + 1]]) for i in range(n)] == [r[0].encode() for r in recs]
    lo, co, cd = gather_keys(rc)
    keys = [[bytes(cd[co[j] : co[j + 1]]).decode() for j in range(lo[i], lo[i + 1])] for i in range(n)]
    assert keys == [[f"k{i}"] for i in range(40)]


@pytest.mark.parametrize("mode", ["segment", "queue"])
def test_spark_decode_layer_reads_v2_records(tmp_path, mode):
    """localmq.spark's Arrow batches (the executors' decode, without a Spark session) over V1 and V2 records."""
    import pyarrow as pa

    from localmq.spark import decode
    from localmq.spark.read import arrow_batches

    path = str(tmp_path / "s")
    written = write_mixed(path, n=60)
    batches = list(arrow_batches(path, partitioning=mode, minPartitions=3, mapped_file_size_commit_log=SEG))
    t = pa.Table.from_batches(batches, schema=decode.arrow_schema(None))
    rows = sorted(
        zip(
            t.column("topic").to_pylist(),
            t.column("partition").to_pylist(),
            t.column("offset").to_pylist(),
            t.column("value").to_pylist(),
        )
    )
    want = sorted((topic, q, i, b) for (topic, q), bodies in written.items() for i, b in enumerate(bodies))
    assert rows == want


def test_shared_store_holds_topics_up_to_its_row(tmp_path):
    """A store shared between processes keeps each topic's queue offsets in a control-file row of 248 name bytes:
    a longer topic is refused with InvalidTopicError, never written over the row's next field."""
    with localmq.open(tmp_path / "s", shared=True, **KW) as st:
        ok = "y" * 248
        assert st.put(ok, b"fits", queue_id=1).ok
        with pytest.raises(localmq.InvalidTopicError):
            st.put("z" * 249, b"too long for the row")
        assert st.put(ok, b"again", queue_id=1).queue_offset == 1
        st.wait_for_dispatch()
        assert [bytes(m.body) for m in get_all(st, ok, 1)] == [b"fits", b"again"]


def test_v2_record_with_a_topic_longer_than_a_file_name_is_refused_not_repaired(tmp_path):
    """A valid V2 record naming a 300-byte topic (the int16 field allows it; no ConsumeQueue directory can hold it):
    not damage either. A writable open refuses the store and changes no byte; the readers still read it."""
    path = tmp_path / "rmq"
    (path / "commitlog").mkdir(parents=True)
    a = rocketmq_record("TopicTest", b"first", b"", v2=False)
    b = rocketmq_record("w" * 300, b"too long a name", b"", v2=True, physical_offset=len(a))
    c = rocketmq_record("TopicTest", b"third", b"", v2=False, queue_offset=1, physical_offset=len(a) + len(b))
    seg = bytearray(SEG)
    data = a + b + c
    seg[: len(data)] = data
    seg[len(data) : len(data) + 8] = struct.pack(">iI", SEG - len(data), 0xCBD43194)
    (path / "commitlog" / f"{0:020d}").write_bytes(bytes(seg))
    before = sha(path)
    with pytest.raises(localmq.UnknownRecordFormatError) as e:
        localmq.open(str(path), **KW)
    assert e.value.offset == len(a) and "300 bytes" in str(e.value)
    assert sha(path) == before
    v = json.loads(cli("verify", path, "--json", rc=4))
    assert v["problems"] == [] and [u["offset"] for u in v["unknown_records"]] == [len(a)]
    assert v["records"] == 2
    assert [m.topic for m in read_commitlog(str(path / "commitlog"), mapped_file_size=SEG)] == [
        "TopicTest",
        "w" * 300,
        "TopicTest",
    ]


def test_abnormal_recovery_over_segments_that_start_with_v2_records(tmp_path):
    """After an unclean exit recovery starts at the newest segment whose first record is older than the checkpoint:
    it reads that record's store time from V2 records too, and re-dispatches nothing twice."""
    path = str(tmp_path / "s")
    written = {}
    with localmq.open(path, **KW) as st:
        for i in range(400):
            b = f"v2-{i:04d}".encode() * 10
            assert st.put(LONGEST, b, queue_id=0).ok
            written.setdefault((LONGEST, 0), []).append(b)
        st.wait_for_dispatch()
    segs = sorted(os.listdir(os.path.join(path, "commitlog")))
    assert len(segs) >= 3
    for s in segs:
        with open(os.path.join(path, "commitlog", s), "rb") as f:
            head = f.read(8)
        assert head[4:8] in (bytes.fromhex("daa320ab"), bytes(4))  # every segment starts with a V2 record
    open(os.path.join(path, "abort"), "wb").close()
    # a checkpoint that says everything was flushed a day later: the walk may start at the last segment
    with open(os.path.join(path, "checkpoint"), "r+b") as f:
        later = struct.pack(">q", 1_700_000_000_000 * 2)
        f.write(later * 3)
    before = {k: v for k, v in sha(path).items() if k.startswith("commitlog")}
    with localmq.open(path, **KW) as st:
        assert st.recovery.mode == "abnormal"
        assert st.recovery.start_offset == int(segs[-1]), "the first V2 record of the last segment was read"
        assert not st.recovery.gaps and st.recovery.dropped_at is None
        assert [bytes(m.body) for m in get_all(st, LONGEST, 0)] == written[(LONGEST, 0)]
    assert {k: v for k, v in sha(path).items() if k.startswith("commitlog")} == before


def test_a_damaged_v2_record_is_damage_and_recovery_resyncs_on_v2_records(tmp_path):
    """A body byte flipped in a V2 record (CRC mismatch) costs that message; recovery resynchronises on the next
    record, a V2 one, and keeps every other message."""
    path = str(tmp_path / "s")
    puts = []
    with localmq.open(path, **KW) as st:
        for i in range(200):
            puts.append(st.put(LONG, f"m{i:04d}".encode() * 20, queue_id=0))
        st.wait_for_dispatch()
    victim = puts[60]
    seg, pos = segment_of(path, victim.physical_offset)
    with open(seg, "r+b") as f:
        f.seek(pos + 120)
        b = f.read(1)
        f.seek(pos + 120)
        f.write(bytes([b[0] ^ 0x40]))
    with localmq.open(path, **KW) as st:
        assert [g["offset"] for g in st.recovery.gaps] == [victim.physical_offset]
        got = get_all_skipping(st, LONG, 0)
        assert got == [f"m{i:04d}".encode() * 20 for i in range(200) if i != 60]
