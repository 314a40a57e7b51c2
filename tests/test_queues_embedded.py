"""EmbeddedMessageQueue specifics: the frame on disk, partitions rolled / flushed / unmapped, torn tails, lock."""

import os
import struct
import time
import zlib

import pytest

import localmq
from localmq.errors import CorruptStoreError, MessageSizeError, StoreLockedError
from localmq.layout import FRAME_MAGIC, FRAME_OVERHEAD

SIZE = 8192


def open_q(path, **kw):
    kw.setdefault("partition_size", SIZE)
    kw.setdefault("flush_interval_ms", 20)
    return localmq.open(path, kind="embedded", **kw)


def partitions(path, topic="T", qid=0):
    d = path / "buckets" / topic / str(qid)
    return sorted(d.iterdir())


def test_frame_layout_on_disk(tmp_path):
    with open_q(tmp_path / "q") as mq:
        mq.put("T", b"hello", tags="t", flag=7)
    raw = partitions(tmp_path / "q")[0].read_bytes()
    total, magic, blen = struct.unpack_from(">iii", raw, 0)
    props = b"TAGS\x01t"
    assert (magic, blen, raw[12:17]) == (FRAME_MAGIC, 5, b"hello")
    hlen, store_ts, born_ts, flag, crc = struct.unpack_from(">hqqiI", raw, 17)
    assert hlen == 24 and flag == 7 and store_ts >= born_ts > 0
    assert crc == zlib.crc32(props, zlib.crc32(b"hello")) & 0x7FFFFFFF
    (plen,) = struct.unpack_from(">h", raw, 17 + 2 + 24)
    assert raw[17 + 2 + 24 + 2 : 17 + 2 + 24 + 2 + plen] == props
    assert total == FRAME_OVERHEAD + 5 + len(props) == 17 + 2 + 24 + 2 + plen
    assert raw[total : total + 4] == b"\0\0\0\0"


def test_partitions_roll_are_unmapped_and_offsets_resume_inside_one(tmp_path):
    path = tmp_path / "q"
    body = b"x" * 1000
    with open_q(path) as mq:
        for i in range(30):
            assert mq.put("T", body + b"%02d" % i).queue_offset == i
        assert len(partitions(path)) >= 4
        deadline = time.monotonic() + 10
        while mq.stats()["unmapped_partitions"] < len(partitions(path)) - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        st = mq.stats()
        assert st["unmapped_partitions"] == len(partitions(path)) - 1 and st["mapped_partitions"] == 1
        c = mq.create_consumer("g", "T")
        got = [c.poll(5) for _ in range(13)]
        assert [m.queue_offset for m in got] == list(range(13))
        c.commit()
    with open_q(path) as mq:
        assert mq.max_offset("T", 0) == 30 and mq.stats()["recovered_messages"] == 30
        c = mq.create_consumer("g", "T")
        rest = []
        while len(rest) < 17:
            rest += c.poll_batch(5, timeout=5)
        assert [m.body[-2:] for m in rest] == [b"%02d" % i for i in range(13, 30)]
        assert mq.put("T", b"more").queue_offset == 30


def test_a_torn_tail_is_cut_and_zeroed(tmp_path):
    path = tmp_path / "q"
    with open_q(path) as mq:
        for i in range(5):
            mq.put("T", b"m%d" % i)
    part = partitions(path)[0]
    raw = bytearray(part.read_bytes())
    ends = []
    pos = 0
    while struct.unpack_from(">i", raw, pos)[0]:
        pos += struct.unpack_from(">i", raw, pos)[0]
        ends.append(pos)
    # the last frame lost part of its body (a power loss between flushes): its CRC no longer matches
    raw[ends[-2] + 12] ^= 0xFF
    part.write_bytes(bytes(raw))
    with open_q(path) as mq:
        assert mq.max_offset("T", 0) == 4 and mq.stats()["cut_frames"] == 1
        assert mq.put("T", b"after").queue_offset == 4
        assert [m.body for m in mq.get_message("T", 0, 0, 10).messages] == [b"m0", b"m1", b"m2", b"m3", b"after"]
    with open_q(path) as mq:
        assert mq.stats()["cut_frames"] == 0 and mq.max_offset("T", 0) == 5


def test_a_frame_written_without_its_totalsize_is_the_end(tmp_path):
    path = tmp_path / "q"
    with open_q(path) as mq:
        mq.put("T", b"a")
        mq.put("T", b"b")
    part = partitions(path)[0]
    raw = bytearray(part.read_bytes())
    first = struct.unpack_from(">i", raw, 0)[0]
    raw[first : first + 4] = b"\0\0\0\0"  # the writer died before storing TOTALSIZE
    part.write_bytes(bytes(raw))
    with open_q(path) as mq:
        assert mq.max_offset("T", 0) == 1 and mq.stats()["cut_frames"] == 0


def test_damage_before_later_data_is_refused(tmp_path):
    path = tmp_path / "q"
    with open_q(path) as mq:
        for _ in range(20):
            mq.put("T", b"y" * 1000)
    first = partitions(path)[0]
    raw = bytearray(first.read_bytes())
    raw[4] ^= 0xFF  # the magic of the first frame
    first.write_bytes(bytes(raw))
    with pytest.raises(CorruptStoreError):
        open_q(path)


def test_wrong_partition_size_and_second_writer_are_refused(tmp_path):
    path = tmp_path / "q"
    with open_q(path) as mq:
        mq.put("T", b"x")
        with pytest.raises(StoreLockedError):
            open_q(path)
    with pytest.raises(CorruptStoreError):
        open_q(path, partition_size=2 * SIZE)


def test_sizes_are_checked(tmp_path):
    with open_q(tmp_path / "q", max_message_size=100_000) as mq:
        with pytest.raises(MessageSizeError):
            mq.put("T", b"z" * SIZE)
        with pytest.raises(MessageSizeError):
            mq.put("T", b"z" * 100_001)
    with pytest.raises(localmq.ConfigError):
        open_q(tmp_path / "q2", partition_size=100)
    with pytest.raises(localmq.ConfigError):
        localmq.open(tmp_path / "q3", kind="nope")


def test_many_buckets_keep_their_own_files(tmp_path):
    path = tmp_path / "q"
    with open_q(path) as mq:
        for t in range(20):
            for q in range(2):
                mq.put(f"T{t}", b"%d" % q, queue_id=q)
        assert len(mq.topics()) == 20
        assert mq.stats()["buckets"] == 40
    assert sorted(os.listdir(path / "buckets")) == sorted(f"T{t}" for t in range(20))
    with open_q(path) as mq:
        assert all(mq.max_offset(f"T{t}", q) == 1 for t in range(20) for q in range(2))


def test_a_partition_that_cannot_be_created_is_a_status_and_writes_nothing(tmp_path, monkeypatch):
    import errno

    from localmq.queues import embedded

    with open_q(tmp_path / "q") as mq:
        mq.put_batch("T", [b"a" * 1000] * 6)  # most of the first 8 KiB partition
        real = embedded.MappedFile

        def no_space(*a, **kw):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(embedded, "MappedFile", no_space)
        r = mq.put_batch("T", [b"b" * 1000] * 3)  # needs the next partition
        assert r.status is localmq.PutStatus.CREATE_MAPPED_FILE_FAILED and not r.ok
        assert mq.put("T", b"c" * 3000).status is localmq.PutStatus.CREATE_MAPPED_FILE_FAILED
        assert mq.max_offset("T", 0) == 6
        monkeypatch.setattr(embedded, "MappedFile", real)
        assert mq.put_batch("T", [b"b" * 1000] * 3).queue_offset == 6
        assert [len(m.body) for m in mq.get_message("T", 0, 0, 32).messages] == [1000] * 6
        assert [m.queue_offset for m in mq.get_message("T", 0, 6, 32).messages] == [6, 7, 8]
