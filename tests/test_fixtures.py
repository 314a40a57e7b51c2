"""Decode every real RocketMQ store file in tests/fixtures/rocketmq and check it against PROVENANCE.md / spec 13."""

import hashlib
import json
import logging
import os
import shutil
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from localmq.errors import CorruptFrameError, CorruptStoreError, NotAStoreError, StoreClosedError
from localmq.store.checkpoint import CHECKPOINT_FILE_SIZE, Checkpoint, StoreCheckpoint, read_checkpoint
from localmq.store.config_json import dumps, loads, read_config_json, write_config_json
from localmq.store.readers import (
    CQ_DTYPE,
    ext_offset,
    is_ext_address,
    load_consume_queue,
    read_commitlog,
    read_consume_queue,
    read_consume_queue_ext,
)

# Facts from PROVENANCE.md and spec sections 1, 2, 4 and 13, checked against hexdumps of the files.
MESSAGE_MAGIC = -626843481  # da a3 20 a7
BLANK_MAGIC = -875286124  # cb d4 31 94
RECORD_SIZE = 172
RECORDS_PER_FILE = 47
BLANK_AT = RECORDS_PER_FILE * RECORD_SIZE  # 8084
SEGMENT = 8192
BODY = b"Once, there was a chance for me!"
TAG1_HASH = 2567159
LONG_MIN = -(2**63)

APACHE = "apache-rocketmq-4e25b979/store"
ERIC = "EricPanGopher-rocketmq-9835cd5f/store/unit_test_store"
SHAOXUBAO = "Shaoxubao-rocketmq-study-c4dcaab0/store"
LIU = "liushangqing9803-rocketmq-tech-0818900c/store"
INDEX = "apache-rocketmq-65a086a2/store/100"


@pytest.fixture(scope="module")
def fixtures(fixtures_dir):
    """The RocketMQ fixture directory (tests/fixtures/rocketmq, or LOCALMQ_FIXTURES)."""
    return fixtures_dir


def java_hash(text):
    """Java String.hashCode over UTF-16 code units, as an int32 (written here from its definition)."""
    h = 0
    units = text.encode("utf-16-be")
    for i in range(0, len(units), 2):
        h = (31 * h + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def copy_segment(src, dst_dir, name=None, length=None):
    """Copy (a prefix of) a fixture segment into dst_dir; returns the new path (writable)."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    data = src.read_bytes()
    dst = dst_dir / (name or src.name)
    dst.write_bytes(data if length is None else data[:length])
    return dst


def flip_byte(path, pos):
    data = bytearray(path.read_bytes())
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------------------------------------- inventory


def listed_files(fixtures):
    lines = (fixtures / "SHA256SUMS").read_text().splitlines()
    return [
        (digest, line.split(None, 1)[1].removeprefix("./"))
        for digest, line in ((line.split()[0], line) for line in lines if line.strip())
    ]


def test_checksums_match_and_cover_every_file(fixtures):
    listed = listed_files(fixtures)
    for digest, rel in listed:
        assert hashlib.sha256((fixtures / rel).read_bytes()).hexdigest() == digest, rel
    on_disk = {p.relative_to(fixtures).as_posix() for p in fixtures.rglob("*") if p.is_file()}
    assert on_disk - {"PROVENANCE.md", "SHA256SUMS"} == {rel for _, rel in listed}


def test_every_fixture_file_is_decoded(fixtures):
    """Each file is handed to the reader of its kind; a file of no known kind fails the test."""
    for _, rel in listed_files(fixtures):
        path = fixtures / rel
        parts = Path(rel).parts
        if "commitlog" in parts:
            reader = read_commitlog(path)
            messages = list(reader)
            assert reader.stop_reason == "end", rel
            assert all(m.topic == "abc" and m.store_size == RECORD_SIZE for m in messages), rel
            expected = 0 if path.stat().st_size == 0 else 38 if path.name == f"{3 * SEGMENT:020d}" else 47
            assert len(messages) == expected, rel
        elif "consumequeue" in parts:
            units = read_consume_queue(path)
            assert len(units) in (6, 10) and (units["size"] == RECORD_SIZE).all(), rel
        elif "consumequeue_ext" in parts:
            units = read_consume_queue_ext(path)
            assert len(units) in (41, 15) and {u.tags_code for u in units} == {TAG1_HASH}, rel
        elif parts[-1] == "checkpoint":
            assert isinstance(read_checkpoint(path), Checkpoint)
        elif "config" in parts:
            doc = loads(path.read_text(encoding="utf-8"))
            assert isinstance(doc, dict) and doc, rel
            if rel.endswith(".json"):
                assert read_config_json(path) == doc
        elif parts[-1] == "lock":
            assert path.read_bytes() == b"lock"
        elif parts[-1] == "abort":
            assert path.stat().st_size == 0
        elif rel == INDEX:
            pass  # no localmq index reader yet: its layout is checked with struct in test_index_file_header
        else:
            pytest.fail(f"fixture file of an unknown kind: {rel}")


# ---------------------------------------------------------------------------------------------- commit log


def test_apache_4e25b979_commitlog(fixtures):
    seg = fixtures / APACHE / "commitlog" / "00000000000000000000"
    raw = seg.read_bytes()
    assert len(raw) == SEGMENT
    reader = read_commitlog(seg.parent)
    messages = list(reader)
    assert len(messages) == RECORDS_PER_FILE == reader.messages_read
    assert [m.queue_offset for m in messages] == list(range(47))
    assert [m.physical_offset for m in messages] == [i * RECORD_SIZE for i in range(47)]
    for m in messages:
        assert m.store_size == RECORD_SIZE
        assert m.topic == "abc" and m.queue_id == 0
        assert m.body == BODY
        assert m.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF
        assert m.born_host == "127.0.0.1:0"
        assert m.store_host == "192.168.71.1:8123"
        assert m.tags == "TAG1"
        assert m.sys_flag == 0 and m.flag == 0 and m.reconsume_times == 0
        assert m.born_timestamp <= m.store_timestamp
        # the same values straight from the bytes at the spec's field offsets
        pos = m.physical_offset
        assert struct.unpack_from(">ii", raw, pos) == (RECORD_SIZE, MESSAGE_MAGIC)
        assert struct.unpack_from(">q", raw, pos + 20)[0] == m.queue_offset
        assert struct.unpack_from(">q", raw, pos + 56)[0] == m.store_timestamp
    assert messages[1].msg_id == "C0A8470100001FBB00000000000000AC"
    assert messages[0].msg_id == "C0A8470100001FBB0000000000000000"
    assert java_hash(messages[0].tags) == TAG1_HASH
    store_times = [m.store_timestamp for m in messages]
    assert store_times == sorted(store_times)
    # then the 108-byte blank record that fills the file
    assert struct.unpack_from(">ii", raw, BLANK_AT) == (SEGMENT - BLANK_AT, BLANK_MAGIC) == (108, BLANK_MAGIC)
    assert reader.stop_reason == "end"
    assert reader.stop_offset == SEGMENT
    assert reader.segments_read == 1 and reader.gaps == []


def test_ericpangopher_commitlog_four_files_and_dirty_tail(fixtures):
    directory = fixtures / ERIC / "commitlog"
    files = sorted(directory.iterdir())
    assert [f.name for f in files] == [f"{i * SEGMENT:020d}" for i in range(5)]
    assert [f.stat().st_size for f in files] == [SEGMENT] * 4 + [0]
    for f in files[:3]:
        assert struct.unpack_from(">ii", f.read_bytes(), BLANK_AT) == (108, BLANK_MAGIC)
    fourth = files[3].read_bytes()
    dirty_at = 38 * RECORD_SIZE
    assert dirty_at == 6536 and not any(fourth[dirty_at:])

    reader = read_commitlog(directory)
    messages = list(reader)
    assert len(messages) == 3 * RECORDS_PER_FILE + 38 == 179
    assert [m.queue_offset for m in messages] == list(range(179))
    expected_offsets = [f * SEGMENT + i * RECORD_SIZE for f in range(4) for i in range(47 if f < 3 else 38)]
    assert [m.physical_offset for m in messages] == expected_offsets
    assert all(m.body == BODY and m.tags == "TAG1" and m.topic == "abc" for m in messages)
    assert all(m.body_crc == zlib.crc32(BODY) & 0x7FFFFFFF for m in messages)
    assert reader.stop_reason == "end"
    assert reader.stop_offset == 3 * SEGMENT + dirty_at
    assert reader.segments_read == 4 and reader.gaps == []


def test_shaoxubao_test_commitlog(fixtures):
    reader = read_commitlog(fixtures / SHAOXUBAO / "unit_test_store" / "commitlog")
    messages = list(reader)
    assert len(messages) == RECORDS_PER_FILE
    assert [m.queue_offset for m in messages] == list(range(47))
    assert all(m.body == BODY and m.tags == "TAG1" and m.born_host == "127.0.0.1:0" for m in messages)
    assert reader.stop_reason == "end" and reader.stop_offset == SEGMENT


def test_copy_false_gives_views_of_the_mapping(fixtures):
    with read_commitlog(fixtures / APACHE / "commitlog", copy=False) as reader:
        bodies = [m.body for m in reader]
    assert all(isinstance(b, memoryview) and b == BODY for b in bodies)
    del bodies


def test_single_segment_base_comes_from_its_name(fixtures, tmp_path):
    src = fixtures / ERIC / "commitlog" / f"{SEGMENT:020d}"
    named = list(read_commitlog(src))
    assert named[0].physical_offset == SEGMENT and named[0].queue_offset == 47
    # a file renamed away from its 20-digit name is read with base 0, whatever the records store
    renamed = copy_segment(src, tmp_path, name="segment.bin")
    moved = list(read_commitlog(renamed))
    assert [m.physical_offset for m in moved] == [i * RECORD_SIZE for i in range(47)]
    assert moved[1].msg_id == "C0A8C77C00001FBB00000000000000AC"


# ---------------------------------------------------------------------------------------------- damaged copies


def test_truncated_segment_stops_torn(fixtures, tmp_path, caplog):
    src = fixtures / APACHE / "commitlog" / "00000000000000000000"
    cut = 10 * RECORD_SIZE + 100
    copy_segment(src, tmp_path / "commitlog", length=cut)
    with caplog.at_level(logging.WARNING, logger="localmq.readers"):
        reader = read_commitlog(tmp_path / "commitlog")
        messages = list(reader)
    assert [m.queue_offset for m in messages] == list(range(10))
    assert reader.stop_reason == "torn"
    assert reader.stop_offset == 10 * RECORD_SIZE
    assert any(r.name == "localmq.readers" and r.levelno == logging.WARNING for r in caplog.records)


def test_segment_cut_on_a_record_boundary_ends_cleanly(fixtures, tmp_path):
    src = fixtures / APACHE / "commitlog" / "00000000000000000000"
    copy_segment(src, tmp_path, length=10 * RECORD_SIZE)
    reader = read_commitlog(tmp_path)
    assert len(list(reader)) == 10
    assert reader.stop_reason == "end" and reader.stop_offset == 10 * RECORD_SIZE


def test_flipped_body_byte_raises_with_offset(fixtures, tmp_path):
    src = fixtures / APACHE / "commitlog" / "00000000000000000000"
    seg = copy_segment(src, tmp_path)
    bad = 5 * RECORD_SIZE
    flip_byte(seg, bad + 88)  # first body byte (body length at 84, IPv4 hosts)
    reader = read_commitlog(tmp_path)
    seen = []
    with pytest.raises(CorruptFrameError) as info:
        for m in reader:
            seen.append(m.queue_offset)
    assert seen == [0, 1, 2, 3, 4]
    assert info.value.offset == bad
    assert Path(info.value.path) == seg
    assert isinstance(info.value, ValueError)

    stopping = read_commitlog(tmp_path, on_corrupt="stop")
    assert len(list(stopping)) == 5
    assert stopping.stop_reason == "corrupt" and stopping.stop_offset == bad

    assert len(list(read_commitlog(tmp_path, check_crc=False))) == RECORDS_PER_FILE


def test_damaged_last_record_before_zeros_is_a_torn_tail(fixtures, tmp_path):
    src = fixtures / ERIC / "commitlog" / f"{3 * SEGMENT:020d}"
    seg = copy_segment(src, tmp_path)
    last = 37 * RECORD_SIZE
    flip_byte(seg, last + 100)
    reader = read_commitlog(seg)
    assert len(list(reader)) == 37
    assert reader.stop_reason == "torn" and reader.stop_offset == 3 * SEGMENT + last


def test_zeroed_record_followed_by_data_is_corrupt(fixtures, tmp_path):
    src = fixtures / APACHE / "commitlog" / "00000000000000000000"
    seg = copy_segment(src, tmp_path)
    data = bytearray(seg.read_bytes())
    data[3 * RECORD_SIZE : 4 * RECORD_SIZE] = bytes(RECORD_SIZE)
    seg.write_bytes(bytes(data))
    with pytest.raises(CorruptFrameError) as info:
        list(read_commitlog(tmp_path))
    assert info.value.offset == 3 * RECORD_SIZE


def test_gap_between_segment_names_is_reported(fixtures, tmp_path, caplog):
    src = fixtures / APACHE / "commitlog" / "00000000000000000000"
    copy_segment(src, tmp_path)
    copy_segment(src, tmp_path, name=f"{2 * SEGMENT:020d}")
    with caplog.at_level(logging.WARNING, logger="localmq.readers"):
        reader = read_commitlog(tmp_path)
    assert reader.gaps == [(SEGMENT, 2 * SEGMENT)]
    assert any("gap" in r.getMessage() for r in caplog.records)
    messages = list(reader)
    assert len(messages) == 2 * RECORDS_PER_FILE
    assert messages[47].physical_offset == 2 * SEGMENT  # file base + position, not the stored 0
    assert reader.segments_read == 2 and reader.stop_offset == 3 * SEGMENT


def test_close_midway_and_missing_stores(fixtures, tmp_path):
    reader = read_commitlog(fixtures / APACHE / "commitlog")
    assert next(reader).queue_offset == 0
    reader.close()
    assert list(reader) == []
    with pytest.raises(NotAStoreError):
        read_commitlog(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("x")
    with pytest.raises(FileNotFoundError):
        read_commitlog(tmp_path / "empty")
    for reader_fn in (read_consume_queue, read_consume_queue_ext):
        with pytest.raises(NotAStoreError):
            reader_fn(tmp_path / "empty")
    with pytest.raises(ValueError):
        read_commitlog(fixtures / APACHE / "commitlog", on_corrupt="skip")


# ---------------------------------------------------------------------------------------------- consume queue


def test_ericpangopher_consume_queue(fixtures):
    directory = fixtures / ERIC / "consumequeue" / "abc" / "0"
    files = sorted(directory.iterdir())
    assert [f.name for f in files] == [f"{i * 200:020d}" for i in range(6)]
    assert all(f.stat().st_size == 200 for f in files)
    cq = load_consume_queue(directory)
    units = cq.units
    assert units.dtype == CQ_DTYPE and units.dtype.itemsize == 20
    assert len(units) == 5 * 10 + 6 == 56
    assert cq.queue_offset_base == 0 and cq.max_queue_offset == 56 and cq.stop_reason == "end"
    assert not any(files[-1].read_bytes()[6 * 20 :])
    # unit i points at the record whose queue offset is i
    by_queue_offset = {m.queue_offset: m for m in read_commitlog(fixtures / ERIC / "commitlog")}
    assert units["offset"].tolist() == [by_queue_offset[i].physical_offset for i in range(56)]
    assert (units["size"] == RECORD_SIZE).all()
    # every tagsCode is an ext address: real ext offset + Long.MIN_VALUE
    codes = units["tags_code"]
    assert is_ext_address(codes).all()
    assert all(is_ext_address(int(c)) for c in codes)
    offsets = ext_offset(codes)
    assert offsets.tolist() == [int(c) - LONG_MIN for c in codes]
    assert offsets.tolist() == [20 * i for i in range(41)] + [840 + 20 * i for i in range(15)]
    assert not is_ext_address(TAG1_HASH)

    one = load_consume_queue(files[1])
    assert one.queue_offset_base == 10 and len(one) == 10
    assert one.units["offset"][0] == by_queue_offset[10].physical_offset


def test_consume_queue_unit_rules(tmp_path):
    units = np.zeros(6, CQ_DTYPE)
    units[0] = (0, 0x7FFFFFFF, 0)  # the blank padding unit counts as valid
    units[1] = (0, 172, 5)  # offset 0 with a size is a real unit
    units[2] = (172, 172, LONG_MIN + 40)
    qdir = tmp_path / "q"
    qdir.mkdir()
    (qdir / f"{40 * 20:020d}").write_bytes(units.tobytes())
    cq = load_consume_queue(qdir)
    assert len(cq) == 3 and cq.queue_offset_base == 40 and cq.stop_reason == "end"
    assert cq.units["tags_code"].tolist() == [0, 5, LONG_MIN + 40]
    assert ext_offset(cq.units["tags_code"]).tolist() == [-1, -1, 40]


def test_ericpangopher_consume_queue_ext(fixtures):
    directory = fixtures / ERIC / "consumequeue_ext" / "abc" / "0"
    first, second = sorted(directory.iterdir())
    assert (first.name, second.name) == (f"{0:020d}", f"{840:020d}")
    raw = first.read_bytes()
    assert struct.unpack_from(">h", raw, 820)[0] == -1
    units = read_consume_queue_ext(directory)
    assert len(units) == 41 + 15
    assert [u.address for u in units] == [20 * i for i in range(41)] + [840 + 20 * i for i in range(15)]
    assert {u.tags_code for u in units} == {TAG1_HASH} == {java_hash("TAG1")}
    assert all(u.bitmap == b"" for u in units)
    for u in units[:3]:
        assert struct.unpack_from(">hqqh", raw, u.address) == (20, u.tags_code, u.msg_store_time, 0)
    # the CQ's ext addresses resolve to these units, whose store time is the referenced record's
    cq = read_consume_queue(fixtures / ERIC / "consumequeue" / "abc" / "0")
    ext_by_address = {u.address: u for u in units}
    by_offset = {m.physical_offset: m for m in read_commitlog(fixtures / ERIC / "commitlog")}
    for unit in cq:
        ext = ext_by_address[int(ext_offset(int(unit["tags_code"])))]
        assert ext.msg_store_time == by_offset[int(unit["offset"])].store_timestamp
    assert [u.address for u in read_consume_queue_ext(second)] == [840 + 20 * i for i in range(15)]


# ---------------------------------------------------------------------------------------------- index file


def test_index_file_header(fixtures):
    """Layout facts of spec 3 (no localmq reader involved): 100 slots, 400 items, one key "0"."""
    raw = (fixtures / INDEX).read_bytes()
    assert len(raw) == 40 + 100 * 4 + 400 * 20 == 8440
    begin_ts, end_ts, begin_phy, end_phy, slot_count, index_count = struct.unpack_from(">qqqqii", raw, 0)
    assert (slot_count, index_count) == (1, 2)
    assert begin_ts == end_ts > 0 and begin_phy == end_phy == 0
    slots = struct.unpack_from(">100i", raw, 40)
    assert [(i, v) for i, v in enumerate(slots) if v] == [(48, 1)] and java_hash("0") % 100 == 48
    key_hash, phy, time_diff, prev = struct.unpack_from(">iqii", raw, 440 + 20)
    assert (key_hash, phy, time_diff, prev) == (java_hash("0"), 0, 0, 0)


# ---------------------------------------------------------------------------------------------- checkpoint


@pytest.mark.parametrize("store, stamp", [(SHAOXUBAO, 1551626238066), (LIU, 1692930262254), (ERIC, 0)])
def test_fixture_checkpoints(fixtures, store, stamp):
    path = fixtures / store / "checkpoint"
    assert path.stat().st_size == CHECKPOINT_FILE_SIZE
    cp = read_checkpoint(path)
    assert cp == Checkpoint(stamp, stamp, 0, 0, 0)
    assert cp.min_timestamp == max(0, stamp - 3000)
    assert cp.min_timestamp_index == 0
    assert not any(path.read_bytes()[24:])


def test_checkpoint_write_read_round_trip(fixtures, tmp_path):
    path = tmp_path / "store" / "checkpoint"
    with StoreCheckpoint(path) as cp:
        assert path.stat().st_size == CHECKPOINT_FILE_SIZE and not any(path.read_bytes())
        assert cp.snapshot() == Checkpoint(0, 0, 0, 0, 0)
        cp.physic_msg_timestamp = 1551626238066
        cp.logics_msg_timestamp = 1551626237000
        cp.index_msg_timestamp = 1551626000000
        cp.master_flushed_offset = 1 << 33
        cp.confirm_phy_offset = 12345
        cp.flush()
        assert cp.min_timestamp == 1551626234000
        assert cp.min_timestamp_index == 1551626000000
    assert cp.closed
    with pytest.raises(StoreClosedError):
        cp.flush()
    raw = path.read_bytes()
    assert len(raw) == CHECKPOINT_FILE_SIZE and not any(raw[40:])
    assert struct.unpack_from(">5q", raw) == (1551626238066, 1551626237000, 1551626000000, 1 << 33, 12345)
    assert read_checkpoint(path) == Checkpoint(1551626238066, 1551626237000, 1551626000000, 1 << 33, 12345)
    reopened = StoreCheckpoint(path)
    try:
        assert reopened.physic_msg_timestamp == 1551626238066 and reopened.confirm_phy_offset == 12345
    finally:
        reopened.close()

    copy = tmp_path / "copy" / "checkpoint"
    copy.parent.mkdir()
    shutil.copyfile(fixtures / SHAOXUBAO / "checkpoint", copy)
    with StoreCheckpoint(copy) as cp:
        assert cp.snapshot() == read_checkpoint(fixtures / SHAOXUBAO / "checkpoint")
        cp.flush()
    assert copy.read_bytes() == (fixtures / SHAOXUBAO / "checkpoint").read_bytes()


def test_short_or_missing_checkpoint(tmp_path):
    short = tmp_path / "checkpoint"
    short.write_bytes(bytes(39))
    with pytest.raises(CorruptStoreError):
        read_checkpoint(short)
    with pytest.raises(CorruptStoreError):
        StoreCheckpoint(short)
    with pytest.raises(NotAStoreError):
        read_checkpoint(tmp_path / "absent")


# ---------------------------------------------------------------------------------------------- config JSON


def config_files(fixtures):
    return sorted(p for p in fixtures.rglob("*") if p.parent.name == "config" and p.is_file())


def test_config_files_round_trip_byte_for_byte(fixtures):
    files = config_files(fixtures)
    assert len(files) == 12
    for path in files:
        text = path.read_text(encoding="utf-8")
        doc = loads(text)
        assert dumps(doc) == text, path
        assert loads(dumps(doc)) == doc, path


def test_shaoxubao_broker_config(fixtures):
    config = fixtures / SHAOXUBAO / "config"
    offsets = read_config_json(config / "consumerOffset.json")["offsetTable"]
    assert offsets["TopicTest@please_rename_unique_group_name_4"] == {0: 250, 1: 250, 2: 250, 3: 250}
    assert offsets["%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4"] == {0: 0}
    topics = read_config_json(config / "topics.json")
    assert topics["dataVersion"]["counter"] == 3
    test_topic = topics["topicConfigTable"]["TopicTest"]
    assert test_topic == {
        "order": False,
        "perm": 6,
        "readQueueNums": 4,
        "topicFilterType": "SINGLE_TAG",
        "topicName": "TopicTest",
        "topicSysFlag": 0,
        "writeQueueNums": 4,
    }
    assert list(test_topic) == sorted(test_topic)  # bean fields in alphabetical order
    backup = loads((config / "topics.json.bak").read_text(encoding="utf-8"))
    assert backup["dataVersion"]["counter"] == 2
    assert set(topics["topicConfigTable"]) - set(backup["topicConfigTable"]) == {
        "%RETRY%please_rename_unique_group_name_4"
    }
    groups = read_config_json(config / "subscriptionGroup.json")["subscriptionGroupTable"]
    assert groups["please_rename_unique_group_name_4"]["retryMaxTimes"] == 16
    assert read_config_json(config / "delayOffset.json") == {"offsetTable": {}}
    assert read_config_json(config / "consumerFilter.json") == {"filterDataByTopic": {}}


def test_liushangqing_broker_config(fixtures):
    config = fixtures / LIU / "config"
    offsets = read_config_json(config / "consumerOffset.json")["offsetTable"]
    assert offsets["lsqTopic1@lsqGroup"] == {0: 8, 1: 15, 2: 14, 3: 12}
    assert offsets["%RETRY%lsqGroup@lsqGroup"] == {0: 0}
    topic = read_config_json(config / "topics.json")["topicConfigTable"]["lsqTopic1"]
    assert (topic["readQueueNums"], topic["writeQueueNums"], topic["perm"]) == (4, 4, 6)
    group = read_config_json(config / "subscriptionGroup.json")["subscriptionGroupTable"]["lsqGroup"]
    assert group["groupName"] == "lsqGroup" and group["consumeEnable"] is True
    assert read_config_json(fixtures / APACHE / "config" / "delayOffset.json") == {"offsetTable": {}}


def test_int_keys_are_written_unquoted():
    text = dumps({"offsetTable": {"TopicTest@g": {0: 250, 1: 250}}})
    assert "{0:250,1:250" in text and '"0"' not in text
    assert text == '{\n\t"offsetTable":{\n\t\t"TopicTest@g":{0:250,1:250\n\t\t}\n\t}\n}'
    assert loads(text) == {"offsetTable": {"TopicTest@g": {0: 250, 1: 250}}}
    assert dumps({0: 250}) == "{0:250\n}"
    assert dumps({"a": None, "b": []}) == '{\n\t"b":[]\n}'


def test_loads_scanner_leaves_strings_alone():
    doc = loads('{"k":"{0:250,1:\\"x\\"}", "0":1, 0:2, -1:3, "l":[1.5,true,null]}')
    assert doc == {"k": '{0:250,1:"x"}', "0": 1, 0: 2, -1: 3, "l": [1.5, True, None]}
    for bad in ("{0:}", "{a:1}", '{"a":1} x', "", '{"a":1', "{1.5:2}"):
        with pytest.raises(ValueError):
            loads(bad)
    assert json.loads(dumps({"s": 'q"\\\t\u00e9'})) == {"s": 'q"\\\t\u00e9'}


def test_read_config_json_falls_back_to_the_backup(fixtures, tmp_path):
    src = fixtures / SHAOXUBAO / "config"
    target = tmp_path / "topics.json"
    shutil.copyfile(src / "topics.json.bak", tmp_path / "topics.json.bak")
    assert read_config_json(target)["dataVersion"]["counter"] == 2  # main missing
    target.write_text("")
    assert read_config_json(target)["dataVersion"]["counter"] == 2  # main empty
    target.write_text('{\n\t"dataVersion":{')
    assert read_config_json(target)["dataVersion"]["counter"] == 2  # main torn
    shutil.copyfile(src / "topics.json", target)
    assert read_config_json(target)["dataVersion"]["counter"] == 3
    (tmp_path / "topics.json.bak").write_text("garbage")
    target.write_text("")
    with pytest.raises(CorruptStoreError):
        read_config_json(target)
    with pytest.raises(NotAStoreError):
        read_config_json(tmp_path / "absent.json")
    with pytest.raises(FileNotFoundError):
        read_config_json(tmp_path / "absent.json")
    assert read_config_json(tmp_path / "absent.json", default={}) == {}


def test_write_config_json_keeps_a_backup(fixtures, tmp_path):
    path = tmp_path / "config" / "consumerOffset.json"
    first = read_config_json(fixtures / SHAOXUBAO / "config" / "consumerOffset.json")
    write_config_json(path, first)
    assert path.read_bytes() == (fixtures / SHAOXUBAO / "config" / "consumerOffset.json").read_bytes()
    assert not (tmp_path / "config" / "consumerOffset.json.bak").exists()
    second = {"offsetTable": {"TopicTest@g": {0: 251}}}
    write_config_json(path, second)
    assert read_config_json(path) == second
    assert loads((tmp_path / "config" / "consumerOffset.json.bak").read_text()) == first
    assert sorted(p.name for p in path.parent.iterdir()) == ["consumerOffset.json", "consumerOffset.json.bak"]
    with pytest.raises(TypeError):
        write_config_json(path, {"bad": object()})
    assert read_config_json(path) == second


def test_fixture_lock_and_abort_files(fixtures):
    for store in (APACHE, ERIC, SHAOXUBAO, LIU):
        assert (fixtures / store / "lock").read_bytes() == b"lock"
    for store in (ERIC, SHAOXUBAO):
        assert (fixtures / store / "abort").stat().st_size == 0
    assert os.listdir(fixtures / APACHE / "config") == ["delayOffset.json"]


def test_fixture_files_are_the_ones_rocketmq_wrote(fixtures_dir):
    """Every file listed in SHA256SUMS (copied byte for byte from RocketMQ's repositories) is unchanged."""
    import hashlib

    lines = (fixtures_dir / "SHA256SUMS").read_text().split("\n")
    checked = 0
    for line in filter(None, lines):
        digest, name = line.split(None, 1)
        assert hashlib.sha256((fixtures_dir / name.lstrip("*")).read_bytes()).hexdigest() == digest, name
        checked += 1
    assert checked >= 20
