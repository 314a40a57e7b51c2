"""SYNC_FLUSH keeps the range ahead of the log written once and flushed (MappedFile.prepare), so that a group commit's
fdatasync does not also commit an extent conversion. Checked from outside localmq: the file's bytes, and the extent
flags the kernel reports through FIEMAP (FIEMAP_EXTENT_UNWRITTEN) on file systems that answer it."""

import errno
import fcntl
import os
import struct

import pytest

import localmq
from helpers import queue_messages
from localmq._mapped_file import MappedFile

FS_IOC_FIEMAP = 0xC020660B
FIEMAP_FLAG_SYNC = 0x1
FIEMAP_EXTENT_UNWRITTEN = 0x800
_HEAD = struct.Struct("=QQIIII")  # struct fiemap
_EXTENT = struct.Struct("=QQQQQIIII")  # struct fiemap_extent


def unwritten_ranges(path):
    """[(start, end)] of the file's unwritten (fallocated, never written) extents, or None when the file system does
    not answer FIEMAP."""
    n = 256
    buf = bytearray(_HEAD.size + n * _EXTENT.size)
    _HEAD.pack_into(buf, 0, 0, 0xFFFFFFFFFFFFFFFF, FIEMAP_FLAG_SYNC, 0, n, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, FS_IOC_FIEMAP, buf)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.ENOTTY):
            return None
        raise
    finally:
        os.close(fd)
    mapped = _HEAD.unpack_from(buf, 0)[3]
    out = []
    for i in range(mapped):
        logical, _phys, length, _r1, _r2, flags, _a, _b, _c = _EXTENT.unpack_from(buf, _HEAD.size + i * _EXTENT.size)
        if flags & FIEMAP_EXTENT_UNWRITTEN:
            out.append((logical, logical + length))
    return out


def overlap(ranges, start, end):
    return [(a, b) for a, b in ranges if a < end and b > start]


def test_prepare_changes_no_byte_and_leaves_no_unwritten_extent(tmp_path):
    path = tmp_path / "00000000000000000000"
    mf = MappedFile(str(path), 1 << 20, 0, create=True, reserve=True)
    try:
        assert mf.prepared_pos == 0
        assert mf.append(b"hello")
        before = unwritten_ranges(str(path))
        assert mf.prepare(4096, 512 << 10) == 512 << 10
        assert mf.prepared_pos == 512 << 10
        with open(path, "rb") as f:
            data = f.read()
        assert data[:5] == b"hello" and data[5:] == bytes((1 << 20) - 5)  # nothing written but zeros
        after = unwritten_ranges(str(path))
        if before is not None:  # ext4 / xfs: the fallocated file was unwritten; the prepared range no longer is
            assert overlap(before, 4096, 512 << 10)
            assert not overlap(after, 4096, 512 << 10)
            assert overlap(after, 512 << 10, 1 << 20)  # beyond it nothing was touched
        with pytest.raises(ValueError):
            mf.prepare(0, (1 << 20) + 1)
    finally:
        mf.close()
    with pytest.raises(localmq.StoreClosedError):
        mf.prepare(0, 4096)


@pytest.mark.parametrize("shared", [False, True])
def test_sync_flush_prepares_ahead_of_the_log(tmp_path, shared):
    seg = 1 << 20
    q = localmq.open(
        tmp_path / "s",
        shared=shared,
        flush_disk_type="SYNC_FLUSH",
        mapped_file_size_commit_log=seg,
        mapped_file_size_consume_queue=20 * 4096,
    )
    try:
        bodies = [os.urandom(700) for _ in range(2000)]  # ~1.6 MiB: the second segment is prepared too
        for b in bodies:
            assert q.put("T", b).ok
        mfq = q._cl_mfq
        last = mfq.last()
        assert len(mfq.files) == 2
        assert last.prepared_pos >= min(seg, last.wrote_position + (256 << 10))
        assert [bytes(m.body) for m in queue_messages(q, "T")] == bodies
        ranges = unwritten_ranges(last.path)
        if ranges is not None:
            assert not overlap(ranges, 0, last.prepared_pos)
    finally:
        q.close()
