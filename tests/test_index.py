"""IndexFile and queries by key: golden bytes from the spec (section 3), RocketMQ's own index file, the store's
query_message / look_message_by_id, rolls, recovery after clean and unclean exits and SIGKILL, retention.

Expectations come from the spec, not the code: ``jhash`` is Java's String.hashCode written here over UTF-16, and
``spec_lookup`` walks a file with struct as a RocketMQ broker would (so what localmq writes must read there).
"""

import os
import random
import struct
import sys
import time

import pytest

import localmq
from helpers import java_hash_reference, kill_when_ready, patch
from localmq import (
    IndexDisabledError,
    InvalidMessageIdError,
    InvalidPropertyError,
    InvalidTopicError,
    StoreClosedError,
)
from localmq.errors import CorruptStoreError
from localmq.store.index import IndexFile, IndexService, infer_geometry

FIXTURE_INDEX = "apache-rocketmq-65a086a2/store/100"
HEADER = struct.Struct(">qqqqii")
ITEM = struct.Struct(">iqii")
TS0 = 1_700_000_000_123


jhash = java_hash_reference  # Java's String.hashCode, from its definition (tests/helpers.py)


def rmq_hash(key):
    """IndexFile.indexKeyHashMethod: Math.abs, and MIN_VALUE (abs is negative in Java) -> 0."""
    h = abs(jhash(key))
    return 0 if h == 1 << 31 else h


def spec_lookup(data, slots, full_key):
    """Offsets of ``full_key`` by walking the slot chain with struct (spec 3.3/3.4), newest first."""
    count = HEADER.unpack_from(data)[5]
    h = rmq_hash(full_key)
    cur = struct.unpack_from(">i", data, 40 + (h % slots) * 4)[0]
    out = []
    while 0 < cur <= count:
        kh, off, diff, prev = ITEM.unpack_from(data, 40 + slots * 4 + cur * 20)
        if kh == h:
            out.append(off)
        if prev == cur:
            break
        cur = prev
    return out


def index_files(root):
    d = os.path.join(root, "index")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def read_file(root, name):
    with open(os.path.join(root, "index", name), "rb") as f:
        return f.read()


# -- hashing and byte layout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["0", "T#a", "topic#key-1", "Aa", "BB", "t#\u00e9t\u00e9", "t#\U0001f600", "x" * 300])
def test_key_hash_is_javas_abs_hash_code(key):
    from localmq._index import key_hash

    assert key_hash(key) == rmq_hash(key)


def test_min_value_hash_maps_to_zero():
    from localmq._index import key_hash

    assert jhash("polygenelubricants") == -(1 << 31)  # a known Integer.MIN_VALUE hashCode
    assert key_hash("polygenelubricants") == 0


def test_golden_bytes_of_a_new_file_with_three_keys(tmp_path):
    slots, items = 8, 6
    ha, hb = rmq_hash("T#a"), rmq_hash("T#b")
    assert ha % slots != hb % slots
    f = IndexFile.create(str(tmp_path / "20240101000000000"), slots, items)
    assert os.path.getsize(f.path) == 40 + slots * 4 + items * 20
    assert f.put_key("T#a", 100, TS0)
    assert f.put_key("T#b", 200, TS0 + 1500)
    assert f.put_key("T#a", 300, TS0 + 3999)
    expected = bytearray(40 + slots * 4 + items * 20)
    # header: begin from the first item, end from the last, 2 slots used, next item number 4
    HEADER.pack_into(expected, 0, TS0, TS0 + 3999, 100, 300, 2, 4)
    struct.pack_into(">i", expected, 40 + (ha % slots) * 4, 3)
    struct.pack_into(">i", expected, 40 + (hb % slots) * 4, 2)
    base = 40 + slots * 4
    ITEM.pack_into(expected, base + 1 * 20, ha, 100, 0, 0)
    ITEM.pack_into(expected, base + 2 * 20, hb, 200, 1, 0)  # 1.5 s -> 1 (whole seconds)
    ITEM.pack_into(expected, base + 3 * 20, ha, 300, 3, 1)  # 3.999 s -> 3; prev = item 1
    f.flush()
    f.close()
    assert (tmp_path / "20240101000000000").read_bytes() == bytes(expected)


def test_a_rolled_file_starts_from_the_previous_end_and_its_first_diff_uses_it(tmp_path):
    slots, items = 4, 3
    f = IndexFile.create(
        str(tmp_path / "20240101000000001"), slots, items, end_phy_offset=300, end_timestamp=TS0 + 3999
    )
    raw = f.mapped_file.read(0, 40)
    assert HEADER.unpack(raw) == (TS0 + 3999, TS0 + 3999, 300, 300, 0, 1)
    assert f.put_key("T#c", 400, TS0 + 6499)
    assert f.put_key("T#d", 500, TS0 + 6600)
    assert not f.put_key("T#e", 600, TS0 + 6700)  # indexCount 3 == items: full
    assert f.is_write_full()
    h = f.header
    # the first item's timeDiff is taken from the inherited begin time, then begin moves to the item (RocketMQ)
    assert (h.begin_timestamp, h.begin_phy_offset, h.end_phy_offset, h.index_count) == (TS0 + 6499, 400, 500, 3)
    item1 = ITEM.unpack_from(f.mapped_file.read(40 + slots * 4 + 20, 20))
    assert item1 == (rmq_hash("T#c"), 400, 2, 0)
    f.close()


def test_rocketmq_index_file_fixture(fixtures_dir, tmp_path):
    path = fixtures_dir / FIXTURE_INDEX
    data = path.read_bytes()
    assert len(data) == 8440
    # geometry from the size with RocketMQ's 4 items per slot: (8440 - 40) / 84 = 100 slots, 400 items
    assert infer_geometry(len(data)) == (100, 400)
    f = IndexFile.open(str(path), writable=False)
    try:
        assert (f.hash_slot_num, f.index_num) == (100, 400)
        h = f.header
        assert (h.hash_slot_count, h.index_count) == (1, 2)
        assert struct.unpack_from(">i", data, 40 + 48 * 4)[0] == 1
        assert ITEM.unpack_from(data, 40 + 400 + 20)[:2] == (48, 0)
        # IndexFileTest puts the bare key "0" (hash 48)
        assert f.select_phy_offsets("0", 10, 0, 1 << 62) == [0] == spec_lookup(data, 100, "0")
        assert f.select_phy_offsets("1", 10, 0, 1 << 62) == []
        assert f.is_time_matched(h.begin_timestamp, h.begin_timestamp)
    finally:
        f.close()
    g = IndexFile.open(str(path), 100, 400, writable=False)  # explicit geometry
    g.close()
    with pytest.raises(CorruptStoreError):
        IndexFile.open(str(path), 100, 401, writable=False)
    with pytest.raises(CorruptStoreError):
        infer_geometry(8441)
    assert path.read_bytes() == data  # read-only: the fixture is untouched


def test_store_written_files_read_back_with_the_spec_walk(store_factory, tmp_path):
    st = store_factory(max_hash_slot_num=64, max_index_num=1000)
    offs = {}
    for i in range(200):
        r = st.put("Tw", b"v%d" % i, keys=["k%d" % i, "all"])
        offs[i] = r.physical_offset
    assert st.wait_for_index(10)
    st.close()
    root = str(tmp_path / "store")
    (name,) = index_files(root)
    assert len(name) == 17 and name.isdigit()
    data = read_file(root, name)
    assert len(data) == 40 + 64 * 4 + 1000 * 20
    bts, ets, bphy, ephy, hsc, cnt = HEADER.unpack_from(data)
    assert cnt == 1 + 400 and bphy == offs[0] and ephy == offs[199] and 0 < hsc <= 64
    for i in (0, 7, 199):
        assert spec_lookup(data, 64, f"Tw#k{i}") == [offs[i]]
    assert spec_lookup(data, 64, "Tw#all") == [offs[i] for i in reversed(range(200))]


# -- queries through the store -----------------------------------------------------------------------------------


def test_query_keys_and_uniq_keys_over_topics(store_factory):
    st = store_factory(max_hash_slot_num=1024, max_index_num=4096)
    expect = {}
    for i in range(300):
        topic = ("A", "B", "C")[i % 3]
        uniq = "%032X" % (0xABC000 + i)
        r = st.put(topic, b"body-%d" % i, keys=[f"order-{i}", f"user-{i % 7}"], properties={"UNIQ_KEY": uniq})
        expect[i] = (topic, uniq, r.physical_offset)
    assert st.wait_for_index(10)
    for i in (0, 1, 2, 150, 299):
        topic, uniq, off = expect[i]
        (m,) = st.query_message(topic, f"order-{i}")
        assert m.body == b"body-%d" % i and m.physical_offset == off
        (m,) = st.query_message(topic, uniq)
        assert m.body == b"body-%d" % i
        assert st.query_message(("A", "B", "C")[(i + 1) % 3], f"order-{i}") == []  # topics are separate
    # a shared key: every match, in log order, only from the topic asked
    got = st.query_message("A", "user-3", max_num=1000)
    want = [i for i in range(300) if i % 3 == 0 and i % 7 == 3]
    assert [m.body for m in got] == [b"body-%d" % i for i in want]
    assert st.query_message("A", "nope") == []


def test_hash_collisions_are_filtered_exactly(store_factory):
    assert jhash("T#Aa") == jhash("T#BB") and jhash("T#AaAa") == jhash("T#BBBB") == jhash("T#AaBB")
    st = store_factory(max_hash_slot_num=16, max_index_num=400)
    st.put("T", b"aa", keys="Aa")
    st.put("T", b"bb", keys="BB")
    st.put("T", b"aaaa", keys=["AaAa", "x"])
    st.put("T", b"bbbb", keys="BBBB")
    st.put("T", b"aabb", keys="AaBB")
    assert st.wait_for_index(10)
    assert [m.body for m in st.query_message("T", "Aa")] == [b"aa"]
    assert [m.body for m in st.query_message("T", "BB")] == [b"bb"]
    assert [m.body for m in st.query_message("T", "BBBB")] == [b"bbbb"]
    assert [m.body for m in st.query_message("T", "AaBB", max_num=1)] == [b"aabb"]
    # many colliding newer entries do not hide an older exact match behind max_num
    for _ in range(100):
        st.put("T", b"other", keys="BB")
    assert st.wait_for_index(10)
    assert [m.body for m in st.query_message("T", "Aa", max_num=1)] == [b"aa"]


def test_time_range_and_max_num(store_factory):
    st = store_factory()
    early = [st.put("T", b"e%d" % i, keys="k") for i in range(5)]
    time.sleep(1.2)
    late = [st.put("T", b"l%d" % i, keys="k") for i in range(5)]
    assert st.wait_for_index(10)
    e_last = early[-1].store_timestamp
    l_first = late[0].store_timestamp
    assert l_first - e_last >= 1000
    bodies = lambda ms: [m.body for m in ms]  # noqa: E731
    assert bodies(st.query_message("T", "k", begin_ms=l_first)) == [b"l%d" % i for i in range(5)]
    assert bodies(st.query_message("T", "k", end_ms=e_last)) == [b"e%d" % i for i in range(5)]
    assert st.query_message("T", "k", begin_ms=e_last + 1, end_ms=l_first - 1) == []
    # exact store times (not the index's whole seconds): a range of one ms holds the messages of that ms
    one = st.query_message("T", "k", begin_ms=late[2].store_timestamp, end_ms=late[2].store_timestamp)
    assert b"l2" in bodies(one) and all(m.store_timestamp == late[2].store_timestamp for m in one)
    # max_num keeps the newest matches, returned in log order
    assert bodies(st.query_message("T", "k", max_num=3)) == [b"l2", b"l3", b"l4"]
    assert len(st.query_message("T", "k")) == 10  # default_query_max_num 32


def test_look_message_by_id(store_factory):
    st = store_factory()
    r1 = st.put("T1", b"one", keys="a")
    r2 = st.put("T2", b"two", properties={"UNIQ_KEY": "0A0B0C0D00010000000100000002ABCD"})
    m = st.look_message_by_id(r1.msg_id)
    assert m.body == b"one" and m.msg_id == r1.msg_id
    assert st.look_message_by_id(r1.msg_id.lower()).body == b"one"
    assert st.look_message_by_id(r1.msg_id, topic="T2") is None  # the id's record is in another topic
    assert st.wait_for_index(10)
    assert st.look_message_by_id("0A0B0C0D00010000000100000002ABCD").body == b"two"
    assert st.look_message_by_id("0A0B0C0D00010000000100000002ABCD", topic="T2").body == b"two"
    assert st.look_message_by_id("0A0B0C0D00010000000100000002ABCD", topic="T1") is None
    # an offset inside a record, or past the end, is no message
    host_hex = r2.msg_id[:16]
    assert st.look_message_by_id(host_hex + "%016X" % (r1.physical_offset + 1)) is None
    assert st.look_message_by_id(host_hex + "%016X" % (1 << 40)) is None
    for bad in ("", "xyz", "0" * 31, "G" * 32, 12, None):
        with pytest.raises(InvalidMessageIdError):
            st.look_message_by_id(bad)


def test_bad_input_and_disabled_index(store_factory, tmp_path):
    st = store_factory()
    for bad in ("", "a/b", "..", "x" * 256):
        with pytest.raises(InvalidTopicError):
            st.query_message(bad, "k")
    for bad in ("", "a b", None, 5):
        with pytest.raises(InvalidPropertyError):
            st.query_message("T", bad)
    with pytest.raises(ValueError):
        st.query_message("T", "k", max_num=0)
    with pytest.raises(ValueError):
        st.query_message("T", "k", begin_ms=10, end_ms=5)
    st.close()
    with pytest.raises(StoreClosedError):
        st.query_message("T", "k")
    off = store_factory(tmp_path / "off", message_index_enable=False)
    r = off.put("T", b"x", keys="k")
    with pytest.raises(IndexDisabledError):
        off.query_message("T", "k")
    with pytest.raises(IndexDisabledError):
        off.wait_for_index(1)
    assert off.look_message_by_id(r.msg_id).body == b"x"  # offset ids need no index
    assert off.stats()["index"] is None
    assert not os.path.exists(tmp_path / "off" / "index")


def test_records_without_keys_create_no_index_file(store_factory, tmp_path):
    st = store_factory()
    for _ in range(100):
        st.put("T", b"x")
    assert st.wait_for_index(10)
    assert index_files(str(tmp_path / "store")) == []
    assert st.stats()["index"]["records"] == 100


# -- rolls, recovery, retention ----------------------------------------------------------------------------------


SMALL = dict(max_hash_slot_num=8, max_index_num=25, mapped_file_size_commit_log=64 * 1024)


def _fill_keys(st, n, start=0, topic="T"):
    res = {}
    for i in range(start, start + n):
        r = st.put(topic, b"m%d" % i, keys=[f"k{i}", "all"], properties={"UNIQ_KEY": "%032X" % i})
        res[i] = r.physical_offset
    return res


def _check_all(st, offsets, topic="T"):
    for i, off in offsets.items():
        got = st.query_message(topic, f"k{i}")
        assert [m.physical_offset for m in got] == [off], i
    assert [m.physical_offset for m in st.query_message(topic, "all", max_num=10**6)] == sorted(offsets.values())


def test_files_roll_and_every_key_stays_findable(store_factory, tmp_path):
    st = store_factory(**SMALL)
    offs = _fill_keys(st, 100)
    assert st.wait_for_index(10)
    root = str(tmp_path / "store")
    names = index_files(root)
    # 300 keys, 24 items per file (item 0 unused): 13 files
    assert len(names) == 13 == st.stats()["index"]["files"]
    _check_all(st, offs)
    headers = [HEADER.unpack_from(read_file(root, n)) for n in names]
    for prev, cur in zip(headers, headers[1:]):
        assert prev[5] == 25  # full
        assert cur[2] >= prev[3] and cur[0] >= prev[1]  # begins where the previous ended
    # the checkpoint's index time: end time of the last full (flushed) file
    assert st.checkpoint.index_msg_timestamp == headers[-2][1]
    st.close()
    with localmq.open(tmp_path / "store", **SMALL) as st2:
        assert st2.wait_for_index(10)
        assert st2.stats()["index"]["keys"] == 0  # nothing indexed twice after a clean exit
        assert index_files(root) == names
        _check_all(st2, offs)
        more = _fill_keys(st2, 20, start=100)
        assert st2.wait_for_index(10)
        _check_all(st2, {**offs, **more})


def test_unclean_exit_drops_files_past_the_checkpoint_and_rebuilds(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        offs = _fill_keys(st, 100)
        assert st.wait_for_index(10)
    names = index_files(str(root))
    (root / "abort").touch()
    with localmq.open(root, **SMALL) as st:
        assert st.recovery.mode == "abnormal"
        dropped = st.stats()["index"]["deleted_on_load"]
        assert [os.path.basename(p) for p in dropped] == names[-1:]  # the file being written
        assert st.wait_for_index(10)
        _check_all(st, offs)
    # a checkpoint whose index time is 0 (as real brokers' files have): every file goes, all is rebuilt
    with open(root / "checkpoint", "r+b") as f:
        f.seek(16)
        f.write(b"\0" * 8)
    (root / "abort").touch()
    with localmq.open(root, **SMALL) as st:
        assert len(st.stats()["index"]["deleted_on_load"]) == len(names)
        assert st.wait_for_index(10)
        _check_all(st, offs)
        assert len(index_files(str(root))) == len(names)


@pytest.mark.parametrize("clean", [True, False])
def test_a_torn_index_file_is_an_error_after_a_clean_exit_and_a_warning_after_a_crash(tmp_path, caplog, clean):
    """The open deletes and re-indexes an index file whose header count is below its items either way; after an
    unclean exit that is what a kill inside a key's write leaves, so it is logged as a warning, not an error."""
    root = tmp_path / "s"
    with localmq.open(root, **SMALL) as st:
        offs = _fill_keys(st, 100)
        assert st.wait_for_index(10)
    first = os.path.join(str(root), "index", index_files(str(root))[0])
    with open(first, "r+b") as f:  # indexCount (offset 36, big-endian) one below the items written
        f.seek(36)
        (count,) = struct.unpack(">i", f.read(4))
        f.seek(36)
        f.write(struct.pack(">i", count - 1))
    if not clean:
        (root / "abort").touch()
    caplog.clear()
    with caplog.at_level("WARNING", logger="localmq.index"), localmq.open(root, **SMALL) as st:
        assert first in st.stats()["index"]["deleted_on_load"]
        assert st.wait_for_index(10)
        _check_all(st, offs)
    torn = [r for r in caplog.records if r.name == "localmq.index" and "cannot be used" in r.getMessage()]
    assert [r.levelname for r in torn] == (["ERROR"] if clean else ["WARNING"])


WRITER = r"""
import os, sys
import localmq
root, session = sys.argv[1], int(sys.argv[2])
st = localmq.open(root, max_hash_slot_num=64, max_index_num=500, mapped_file_size_commit_log=256 * 1024)
fd = os.open(os.path.join(root, "acked"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
print("ready", flush=True)
i = 0
while True:
    r = st.put("crash", b"%d:%d" % (session, i), keys=["s%d-%d" % (session, i), "s%d" % session],
               properties={"UNIQ_KEY": "%016X%016X" % (session, i)})
    if not r.ok:
        os._exit(5)
    os.write(fd, b"%d\n" % i)  # only after PUT_OK
    i += 1
"""


def test_sigkill_writer_every_acknowledged_key_is_found(tmp_path):
    rng = random.Random(5)
    root = tmp_path / "s"
    root.mkdir()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    cfg = dict(max_hash_slot_num=64, max_index_num=500, mapped_file_size_commit_log=256 * 1024)
    checked = 0
    for session in range(3):
        acked_path = root / "acked"
        if acked_path.exists():
            acked_path.unlink()
        kill_when_ready([script, root, session], env, rng.uniform(0.3, 0.8))
        with localmq.open(root, **cfg) as st:
            assert st.recovery.mode == "abnormal"
            assert st.wait_for_index(30)
            acked = [int(x) for x in acked_path.read_text().split()]
            assert acked
            for i in acked[:: max(1, len(acked) // 300)] + acked[-5:]:
                (m,) = st.query_message("crash", f"s{session}-{i}")
                assert m.body == b"%d:%d" % (session, i)
                assert st.look_message_by_id("%016X%016X" % (session, i)).body == m.body
            mine = st.query_message("crash", f"s{session}", max_num=10**7)
            assert [m.body for m in mine][: len(acked)] == [b"%d:%d" % (session, i) for i in acked]
            for old in range(session):  # earlier sessions are still complete
                assert st.query_message("crash", f"s{old}-0")
            checked += len(acked)
    print(f"acknowledged keys checked after 3 SIGKILLs: {checked}")


def test_retention_deletes_index_files_below_the_commit_log_min_offset(tmp_path):
    from test_store_retention import FakeClock, FakeDisk, local_ms, set_ages

    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    cfg = dict(
        mapped_file_size_commit_log=4096,
        mapped_file_size_consume_queue=200,
        clean_resource_interval=3_600_000,
        delete_commit_log_files_interval=0,
        delete_consume_queue_files_interval=0,
        preallocate_mapped_file=False,
        max_hash_slot_num=8,
        max_index_num=25,
    )
    root = tmp_path / "s"
    with localmq.open(root, clock=clock, disk_usage=disk, **cfg) as st:
        offs = {}
        for i in range(200):
            offs[i] = st.put("T", b"%0300d" % i, keys=[f"k{i}", "all"]).physical_offset
        assert st.wait_for_dispatch(10) and st.wait_for_index(10)
        st.flush()
        before = index_files(str(root))
        segs = sorted(os.listdir(root / "commitlog"))
        set_ages(root, clock, [100] * (len(segs) - 3) + [0])  # all but the last three segments expired
        st.clean_service.run_once()
        min_off = st.commit_log_min_offset
        assert min_off > 0
        after = index_files(str(root))
        gone = st.stats()["retention"]["deleted_index_files"]
        assert gone > 0 and len(after) == len(before) - gone
        # what is left covers the log from its min offset on; nothing older is returned
        for name in after[:1]:
            assert HEADER.unpack_from(read_file(str(root), name))[3] >= min_off
        kept = {i: o for i, o in offs.items() if o >= min_off}
        for i, o in kept.items():
            assert [m.physical_offset for m in st.query_message("T", f"k{i}")] == [o]
        assert [m.physical_offset for m in st.query_message("T", "all", max_num=1000)] == sorted(kept.values())
        assert all(st.query_message("T", f"k{i}") == [] for i in offs if i not in kept)


def test_index_service_never_deletes_the_last_file(tmp_path):
    class CP:
        index_msg_timestamp = 0

        def flush(self):
            pass

    svc = IndexService(str(tmp_path), 4, 3, CP())
    f = svc.roll()
    assert f.put_key("T#a", 10, TS0)
    assert svc.delete_expired_file(1 << 40) == 0
    assert index_files(str(tmp_path)) == [f.file_name]
    svc.close()


def test_offset_by_time_is_the_first_message_at_or_after(store_factory):
    st = store_factory()
    rs = [st.put("T", b"%d" % i) for i in range(3)]
    time.sleep(0.01)
    rs += [st.put("T", b"%d" % i) for i in range(3, 6)]
    assert st.wait_for_dispatch(10)
    ts = [r.store_timestamp for r in rs]
    assert st.offset_by_time("T", 0, ts[3]) == ts.index(ts[3])
    assert st.offset_by_time("T", 0, 0) == 0
    assert st.offset_by_time("T", 0, ts[-1] + 1) == 6  # all older: max offset (RocketMQ: the last, 5)
    assert st.offset_by_time("nope", 0, 0) == 0


def test_a_small_index_file_a_broker_extended_in_place_is_read_as_it_was_written(tmp_path):
    """RocketMQ maps every index file at its configured size: a smaller file (``grow_index_files=True``) is
    extended in place to 420,000,040 bytes by a plain load and shutdown. Its size then fits the default geometry
    while its content has the small one: localmq reads it by its content (it found 1 key of 2,000 before), and
    ``localmq verify`` checks a sample of items against the records they point at."""
    import subprocess
    import sys

    root = tmp_path / "s"
    with localmq.open(root, grow_index_files=True) as st:
        offsets = {f"k{i}": st.put("t", b"m%d" % i, keys=[f"k{i}"]).physical_offset for i in range(2000)}
        assert st.wait_for_index(30)
    (name,) = os.listdir(root / "index")
    path = root / "index" / name
    small = path.stat().st_size
    assert small < 420_000_040
    os.truncate(path, 420_000_040)  # what RocketMQ's MappedFile does to it
    with localmq.open(root) as st:
        missing = [k for k, off in offsets.items() if [m.physical_offset for m in st.query_message("t", k)] != [off]]
        assert not missing, f"{len(missing)} of 2000 keys not found, first {missing[:3]}"
    r = subprocess.run([sys.executable, "-m", "localmq", "verify", str(root)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_verify_reports_an_index_file_whose_items_do_not_match_their_records(tmp_path):
    import subprocess
    import sys

    root = tmp_path / "s"
    with localmq.open(root, max_hash_slot_num=100, max_index_num=400) as st:
        for i in range(300):
            st.put("t", b"m%d" % i, keys=[f"k{i}"])
        assert st.wait_for_index(30)
    (name,) = os.listdir(root / "index")
    path = root / "index" / name
    items_at = 40 + 100 * 4
    with open(path, "r+b") as f:  # the first 150 items' key hash changed: each points at a record without that key
        for i in range(1, 151):
            f.seek(items_at + i * 20)
            h = int.from_bytes(f.read(4), "big")
            f.seek(items_at + i * 20)
            f.write(((h + 1) % (1 << 31)).to_bytes(4, "big"))
    r = subprocess.run([sys.executable, "-m", "localmq", "verify", str(root)], capture_output=True, text=True)
    assert r.returncode != 0 and "sampled items do not hold the key hash" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("damage", [b"\0", b"\xaa"], ids=["zeros", "garbage"])
def test_an_index_that_ended_inside_a_recovered_gap_resumes_at_the_gap(tmp_path, damage):
    """The index resumes at its last file's endPhyOffset: the start of the last record that had a key. When
    an open (a clean exit's) replaces damaged bytes around that point by a gap record, the records after it being
    intact, the index thread read zeros there for good: every key put afterwards stayed unindexed and close() waited
    for the thread for 60 s; garbage there (a gap record keeps the damaged bytes after its 16-byte header) made it
    raise, at every later open again. It now checks its resume point once against the segment's records, steps to the
    gap's end and indexes on. (After a crash the file being written is dropped and indexed again from its start,
    which steps over the gap record from its head.)"""
    root = tmp_path / "s"
    cfg = dict(SMALL, max_index_num=5000)
    with localmq.open(root, **cfg) as st:
        keyed = [st.put("t", b"k%04d" % i + b"x" * 40, keys=f"k{i}") for i in range(200)]
        for i in range(50):
            assert st.put("t", b"p%04d" % i + b"y" * 40).ok
        assert st.wait_for_index(10)
    end = keyed[-1].physical_offset  # where the index resumes: endPhyOffset, the last keyed record's start
    seg = sorted((root / "commitlog").iterdir())[-1]
    base = int(seg.name)
    assert base < end - 16
    patch(seg, end - base - 16, damage * 32)  # the tail of the last keyed record but one and the head of the last
    with localmq.open(root, **cfg) as st:
        gaps = [(g["offset"], g["bytes"]) for g in st.recovery.gaps]
        assert len(gaps) == 1 and gaps[0][0] < end < gaps[0][0] + gaps[0][1], (gaps, end)
        assert st.put("t", b"after", keys="after").ok
        assert st.wait_for_index(10)
        assert [m.body for m in st.query_message("t", "after", 10)] == [b"after"]
        assert [m.body for m in st.query_message("t", "k0", 10)] == [b"k0000" + b"x" * 40]
