"""powerfs (tests/powerfs/): the power-loss file system itself, with real processes and real files.

Each expectation comes from what a power cut may do to a POSIX file system (tests/powerfs/README.md): what was
fsynced is there, what was not may be gone; a new name is durable once its directory was fsynced.  Nothing here
uses localmq."""

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import subprocess
import sys

import pytest

from helpers import powerfs_mounted as mounted
from helpers import rmtree_on_fuse
from powerfs import PowerFS, PowerFSError, build, run_then_kill

try:  # the per-test limit, where pytest-timeout is installed (every wait below has its own timeout too)
    import pytest_timeout  # noqa: F401

    pytestmark = pytest.mark.timeout(300)
except ImportError:
    pass

PAGE = 4096
SECTOR = 512
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


_libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def renameat2(old, new, flags):
    if _libc.renameat2(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def fallocate(fd, mode, offset, length):
    if _libc.fallocate(fd, mode, offset, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


# -- fixtures and helpers ------------------------------------------------------------------------------------------


@pytest.fixture
def disk(tmp_path):
    """The backing directory: what the disk holds, durable state only."""
    return tmp_path / "disk"


@pytest.fixture
def mnt(tmp_path):
    return tmp_path / "mnt"


def fresh_disk(disk, files=None):
    """An empty backing directory holding ``files`` (name -> bytes) as durable content."""
    shutil.rmtree(disk, ignore_errors=True)
    disk.mkdir(parents=True)
    for name, data in (files or {}).items():
        (disk / name).write_bytes(data)


def write_file(path, data, *, sync=False, datasync=False, flags=os.O_TRUNC):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | flags, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
        if datasync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def names(path):
    return sorted(os.listdir(path))


def powerfs_mounts(under):
    """The powerfs mounts below ``under`` (the test's own directory: other runs on the machine may hold theirs)."""
    prefix = os.path.realpath(under).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as f:
        return [line for line in f if " fuse.powerfs " in line and (line.split()[4] + "/").startswith(prefix)]


# -- the live view -------------------------------------------------------------------------------------------------


def test_the_mount_shows_every_write_and_the_disk_only_what_was_synced(disk, mnt):
    fresh_disk(disk, {"old": b"d" * 10000})
    with mounted(disk, mnt) as fs:
        write_file(mnt / "f", b"x" * 10000)
        assert (mnt / "f").read_bytes() == b"x" * 10000
        assert os.stat(mnt / "f").st_size == 10000
        assert (disk / "f").read_bytes() == b""  # the name is there at once, the data only in memory
        os.truncate(mnt / "f", 5000)
        os.truncate(mnt / "f", 9000)  # grows back with zeros, not with the old bytes
        assert (mnt / "f").read_bytes() == b"x" * 5000 + bytes(4000)
        os.truncate(mnt / "old", 0)
        os.truncate(mnt / "old", 8192)
        assert (mnt / "old").read_bytes() == bytes(8192)
        assert (disk / "old").read_bytes() == b"d" * 10000
        with open(mnt / "old", "r+b") as f:
            f.seek(100)
            f.write(b"hi")
            f.flush()
            os.fsync(f.fileno())
        assert (disk / "old").read_bytes() == bytes(100) + b"hi" + bytes(8090)
        assert names(mnt) == ["f", "old"]  # neither the control file nor the trash is listed
        assert ".powerfs-trash" in names(disk)
        counters = fs.counters()
        assert counters["create"] == 1 and counters["truncate"] == 4 and counters["fsync"] == 1
    assert (disk / "f").read_bytes() == b"x" * 5000 + bytes(4000)  # a clean unmount makes everything durable
    assert names(disk) == ["f", "old"]
    assert not powerfs_mounts(mnt.parent)


def test_o_tmpfile_is_refused_so_callers_fall_back_to_o_creat(disk, mnt):
    with mounted(disk, mnt):
        with pytest.raises(OSError) as e:
            os.close(os.open(mnt, os.O_TMPFILE | os.O_WRONLY, 0o600))
        assert e.value.errno in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL)


# -- file data -----------------------------------------------------------------------------------------------------


def test_cut_all_loses_unsynced_writes_and_keeps_fsynced_and_fdatasynced_ones(disk, mnt):
    fresh_disk(disk, {"overwritten": b"o" * 6000})
    with mounted(disk, mnt) as fs:
        write_file(mnt / "fsynced", b"S" * 5000, sync=True)
        write_file(mnt / "fdatasynced", b"D" * 5000, datasync=True)
        write_file(mnt / "unsynced", b"U" * 5000)
        fsync_dir(mnt)  # the three names are durable from here on
        write_file(mnt / "fsynced", b"late", flags=os.O_APPEND)
        with open(mnt / "overwritten", "r+b") as f:
            f.write(b"N" * 100)
        fs.cut("all")
    assert (disk / "fsynced").read_bytes() == b"S" * 5000
    assert (disk / "fdatasynced").read_bytes() == b"D" * 5000
    assert (disk / "unsynced").read_bytes() == b""
    assert (disk / "overwritten").read_bytes() == b"o" * 6000
    assert names(disk) == ["fdatasynced", "fsynced", "overwritten", "unsynced"]  # and no trash


MMAP_WRITER = """
import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, 4 * 4096, mmap.MAP_SHARED)
m[0:6] = b"synced"
m.flush()                      # msync(MS_SYNC): reaches powerfs as fsync
m[8192:8200] = b"unsynced"     # dirty in the page cache only
print("ready", flush=True)
time.sleep(120)
"""


def test_unsynced_data_belongs_to_the_inode_shared_by_every_open_and_name(disk, mnt):
    with mounted(disk, mnt) as fs:
        fd1 = os.open(mnt / "a", os.O_CREAT | os.O_RDWR, 0o644)
        fd2 = os.open(mnt / "a", os.O_RDWR)
        os.write(fd1, b"one")
        assert os.pread(fd2, 10, 0) == b"one"
        os.rename(mnt / "a", mnt / "b")
        os.link(mnt / "b", mnt / "c")
        fsync_dir(mnt)
        os.pwrite(fd1, b"two", 3)
        assert (mnt / "c").read_bytes() == b"onetwo"
        os.close(fd1)
        os.fsync(fd2)  # makes the writes made through fd1 durable too
        os.close(fd2)
        fs.cut("all")
    assert names(disk) == ["b", "c"]
    assert (disk / "b").read_bytes() == b"onetwo"
    assert os.stat(disk / "b").st_ino == os.stat(disk / "c").st_ino


def test_mmap_writes_are_durable_after_msync_and_lost_without(disk, mnt):
    fresh_disk(disk, {"map": bytes(4 * PAGE)})
    with mounted(disk, mnt) as fs:
        run_then_kill(MMAP_WRITER, mnt / "map")  # SIGKILLed: its files are closed, its dirty pages written back
        live = (mnt / "map").read_bytes()
        assert live[:6] == b"synced" and live[8192:8200] == b"unsynced"
        assert fs.counters()["fsync"] >= 1
        fs.cut("all")
    data = (disk / "map").read_bytes()
    assert data[:6] == b"synced"
    assert data[6:] == bytes(4 * PAGE - 6)


def test_size_changes_are_lost_unless_synced(disk, mnt):
    fresh_disk(
        disk,
        {
            "grown": b"g" * 100,
            "shrunk": b"s" * 10000,
            "allocated": b"a" * 100,
            "kept": b"k" * 100,
            "punched": b"p" * 3 * PAGE,
            "keep_size": b"z" * 100,
        },
    )
    with mounted(disk, mnt) as fs:
        os.truncate(mnt / "grown", 50000)
        os.truncate(mnt / "shrunk", 10)
        fd = os.open(mnt / "allocated", os.O_RDWR)
        os.posix_fallocate(fd, 0, 1 << 20)
        assert os.fstat(fd).st_size == 1 << 20
        os.close(fd)
        fd = os.open(mnt / "keep_size", os.O_RDWR)
        fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 1 << 20)
        assert os.fstat(fd).st_size == 100
        os.close(fd)
        fd = os.open(mnt / "punched", os.O_RDWR)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, PAGE)
        assert os.pread(fd, 3 * PAGE, 0) == b"p" * 1000 + bytes(PAGE) + b"p" * (2 * PAGE - 1000)
        os.close(fd)
        fd = os.open(mnt / "kept", os.O_RDWR)
        os.ftruncate(fd, 3)
        os.posix_fallocate(fd, 0, 5000)
        os.fsync(fd)
        os.close(fd)
        assert fs.counters()["fallocate"] == 4
        fs.cut("all")
    assert (disk / "grown").read_bytes() == b"g" * 100
    assert (disk / "shrunk").read_bytes() == b"s" * 10000
    assert (disk / "allocated").read_bytes() == b"a" * 100
    assert (disk / "keep_size").read_bytes() == b"z" * 100
    assert (disk / "punched").read_bytes() == b"p" * 3 * PAGE
    assert (disk / "kept").read_bytes() == b"kkk" + bytes(4997)


def test_a_punched_hole_is_durable_after_fsync(disk, mnt):
    fresh_disk(disk, {"punched": b"p" * 3 * PAGE})
    with mounted(disk, mnt) as fs:
        fd = os.open(mnt / "punched", os.O_RDWR)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, PAGE)
        os.fsync(fd)
        os.close(fd)
        fs.cut("all")
    assert (disk / "punched").read_bytes() == b"p" * 1000 + bytes(PAGE) + b"p" * (2 * PAGE - 1000)


# -- directory entries ---------------------------------------------------------------------------------------------


def test_a_fsynced_file_vanishes_when_its_directory_was_not_fsynced(disk, mnt):
    with mounted(disk, mnt) as fs:
        write_file(mnt / "lost", b"data", sync=True)
        os.mkdir(mnt / "sub")
        write_file(mnt / "sub" / "inner", b"data", sync=True)
        fsync_dir(mnt / "sub")  # the entry in sub is durable, but sub's own entry in the root is not
        fs.cut("all")
    assert names(disk) == []


def test_a_fsynced_file_stays_when_its_directory_was_fsynced(disk, mnt):
    with mounted(disk, mnt) as fs:
        write_file(mnt / "kept", b"data", sync=True)
        os.mkdir(mnt / "sub")
        write_file(mnt / "sub" / "inner", b"inner", sync=True)
        fsync_dir(mnt / "sub")
        fsync_dir(mnt)
        fs.cut("all")
    assert names(disk) == ["kept", "sub"]
    assert (disk / "kept").read_bytes() == b"data"
    assert (disk / "sub" / "inner").read_bytes() == b"inner"


def test_unlink_rename_link_and_symlink_come_undone_without_a_directory_fsync(disk, mnt):
    fresh_disk(disk, {"unlinked": b"u" * 5000, "renamed": b"r", "target": b"t", "source": b"s"})
    (disk / "dir").mkdir()
    with mounted(disk, mnt) as fs:
        os.unlink(mnt / "unlinked")
        os.rename(mnt / "renamed", mnt / "dir" / "moved")
        os.rename(mnt / "source", mnt / "target")  # replaces target
        os.link(mnt / "target", mnt / "hard")
        os.symlink("target", mnt / "soft")
        os.rename(mnt / "dir", mnt / "dir2")
        assert names(mnt) == ["dir2", "hard", "soft", "target"]
        assert (mnt / "target").read_bytes() == b"s"
        assert fs.counters()["journal"] >= 6
        fs.cut("all")
    assert names(disk) == ["dir", "renamed", "source", "target", "unlinked"]
    assert names(disk / "dir") == []
    assert (disk / "unlinked").read_bytes() == b"u" * 5000
    assert (disk / "target").read_bytes() == b"t"
    assert (disk / "source").read_bytes() == b"s"


def test_rename_exchange_is_undone_and_noreplace_refuses(disk, mnt):
    fresh_disk(disk, {"a": b"A", "b": b"B"})
    with mounted(disk, mnt) as fs:
        renameat2(mnt / "a", mnt / "b", RENAME_EXCHANGE)
        assert (mnt / "a").read_bytes() == b"B"
        with pytest.raises(OSError) as e:
            renameat2(mnt / "a", mnt / "b", RENAME_NOREPLACE)
        assert e.value.errno == errno.EEXIST
        renameat2(mnt / "a", mnt / "c", RENAME_NOREPLACE)
        fs.cut("all")
    assert (disk / "a").read_bytes() == b"A"
    assert (disk / "b").read_bytes() == b"B"
    assert names(disk) == ["a", "b"]


def test_unlink_and_rmdir_are_durable_after_a_directory_fsync(disk, mnt):
    fresh_disk(disk, {"unlinked": b"u", "kept": b"k"})
    (disk / "empty").mkdir()
    with mounted(disk, mnt) as fs:
        os.unlink(mnt / "unlinked")
        os.rmdir(mnt / "empty")
        fsync_dir(mnt)
        assert ".powerfs-trash" in names(disk) and os.listdir(disk / ".powerfs-trash") == []  # deleted for real
        os.unlink(mnt / "kept")
        fs.cut("all")
    assert names(disk) == ["kept"]


def test_changes_inside_a_removed_directory_are_forgotten_once_its_removal_is_durable(disk, mnt):
    with mounted(disk, mnt) as fs:
        os.mkdir(mnt / "d")
        fsync_dir(mnt)
        write_file(mnt / "d" / "f", b"x")
        os.unlink(mnt / "d" / "f")
        os.rmdir(mnt / "d")
        fsync_dir(mnt)  # the rmdir is durable; d's own journal (create f, unlink f) was never synced
        fs.cut("all")
        assert "cannot undo" not in fs.log()
    assert names(disk) == []


def test_an_open_unlinked_file_keeps_working(disk, mnt):
    with mounted(disk, mnt) as fs:
        fd = os.open(mnt / "tmp", os.O_RDWR | os.O_CREAT, 0o600)
        os.unlink(mnt / "tmp")
        fsync_dir(mnt)
        os.write(fd, b"still here")
        os.fsync(fd)
        assert os.pread(fd, 100, 0) == b"still here"
        assert os.fstat(fd).st_size == 10
        os.close(fd)
        fs.cut("all")
    assert names(disk) == []


def test_a_hidden_name_counts_in_rmdir_while_its_file_is_open_and_not_once_it_is_orphaned(disk, mnt):
    """libfuse keeps a file unlinked while open under a hidden name (not listed): rmdir of its directory fails with
    ENOTEMPTY until the last close, as on any libfuse high-level file system. libfuse 3.14 can also leave such a name
    behind for good, its file closed (the last close's RELEASE racing the UNLINK, libfuse issue #746): such an
    orphan, made here in the backing directory before the mount, does not keep its directory from being removed."""
    fresh_disk(disk)
    (disk / "orphaned").mkdir()
    (disk / "orphaned" / ".fuse_hidden0000002a00000001").write_bytes(b"left by the race")
    with mounted(disk, mnt) as fs:
        assert os.listdir(mnt / "orphaned") == []
        os.rmdir(mnt / "orphaned")
        (mnt / "d").mkdir()
        fd = os.open(mnt / "d" / "f", os.O_RDWR | os.O_CREAT, 0o600)
        os.unlink(mnt / "d" / "f")
        assert os.listdir(mnt / "d") == []
        with pytest.raises(OSError) as e:
            os.rmdir(mnt / "d")
        assert e.value.errno == errno.ENOTEMPTY
        os.write(fd, b"still here")
        assert os.pread(fd, 100, 0) == b"still here"
        os.close(fd)
        rmtree_on_fuse(mnt / "d")  # once the last close's release reached the daemon (asynchronously)
        fsync_dir(mnt)
        fs.cut("all")
    assert names(disk) == []


def test_random_cuts_keep_a_prefix_of_each_directorys_changes(disk, mnt):
    kept = set()
    for seed in range(12):
        fresh_disk(disk)
        with mounted(disk, mnt) as fs:
            for i in range(8):
                write_file(mnt / f"f{i}", b"x", sync=True)
            fs.cut("random", seed)
        found = names(disk)
        assert found == [f"f{i}" for i in range(len(found))]
        assert all((disk / name).read_bytes() == b"x" for name in found)
        kept.add(len(found))
    assert len(kept) >= 3  # the seed chooses where each directory's history stops


def test_a_cross_directory_rename_is_kept_or_lost_as_a_whole(disk, mnt):
    outcomes = set()
    for seed in range(16):
        fresh_disk(disk, {"a0": b"0", "a1": b"1", "a2": b"2"})
        (disk / "b").mkdir()
        with mounted(disk, mnt) as fs:
            for i in range(3):
                os.rename(mnt / f"a{i}", mnt / "b" / f"b{i}")
            fs.cut("random", seed)
        here = [n for n in names(disk) if n != "b"]
        there = names(disk / "b")
        assert len(here) + len(there) == 3  # each file is in exactly one place
        assert there == [f"b{i}" for i in range(len(there))]  # the renames are kept in order
        outcomes.add(len(there))
    assert len(outcomes) >= 2


# -- rename over a file, the classic atomic replace -----------------------------------------------------------------

OLD = b"o" * 3 * PAGE + b"old"
NEW = b"n" * 5 * PAGE + b"new!"


def replace(mnt, steps, fsync_new=True):
    """Write tmp, fsync it, rename it over target, fsync the directory: the first ``steps`` of those."""
    if steps >= 1:
        write_file(mnt / "tmp", NEW)
    if steps >= 2 and fsync_new:
        fd = os.open(mnt / "tmp", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    if steps >= 3:
        os.rename(mnt / "tmp", mnt / "target")
    if steps >= 4:
        fsync_dir(mnt)


@pytest.mark.parametrize("mode", ["random", "torn"])
def test_rename_over_gives_the_old_or_the_new_content_never_a_mix(disk, mnt, mode):
    seen = set()
    for seed in range(8):
        for steps in range(5):
            fresh_disk(disk, {"target": OLD})
            with mounted(disk, mnt) as fs:
                replace(mnt, steps)
                fs.cut(mode, seed)
            content = (disk / "target").read_bytes()
            assert content in (OLD, NEW), (seed, steps, len(content))
            if steps < 3:
                assert content == OLD
            if steps == 4:
                assert content == NEW
            seen.add(content)
    assert seen == {OLD, NEW}


def test_rename_over_without_fsync_of_the_new_file_is_caught(disk, mnt):
    """The classic bug: the new name is durable, the new data is not.  powerfs must show it."""
    bad = []
    for mode, seed in [("all", 0)] + [("torn", s) for s in range(6)]:
        fresh_disk(disk, {"target": OLD})
        with mounted(disk, mnt) as fs:
            replace(mnt, 4, fsync_new=False)
            fs.cut(mode, seed)
        content = (disk / "target").read_bytes()
        if content not in (OLD, NEW):
            bad.append((mode, seed, len(content)))
    assert ("all", 0, 0) in bad
    assert len(bad) >= 5


# -- torn and random writes ----------------------------------------------------------------------------------------

OLD_PAGES = b"\x55" * 8 * PAGE
NEW_PAGES = b"\xaa" * 8 * PAGE


def overwrite_and_cut(disk, mnt, mode, seed):
    fresh_disk(disk, {"f": OLD_PAGES})
    with mounted(disk, mnt) as fs:
        write_file(mnt / "f", NEW_PAGES, flags=0)
        fs.cut(mode, seed)
    return (disk / "f").read_bytes()


def sectors_of(data):
    assert len(data) == len(OLD_PAGES)
    marks = []
    for off in range(0, len(data), SECTOR):
        sector = data[off : off + SECTOR]
        assert sector in (OLD_PAGES[:SECTOR], NEW_PAGES[:SECTOR]), f"a sector torn inside, at {off}"
        marks.append(sector == NEW_PAGES[:SECTOR])
    return [marks[i : i + PAGE // SECTOR] for i in range(0, len(marks), PAGE // SECTOR)]


def test_torn_cuts_tear_pages_at_sector_granularity_deterministically(disk, mnt):
    torn = whole = lost = 0
    for seed in range(10):
        data = overwrite_and_cut(disk, mnt, "torn", seed)
        assert overwrite_and_cut(disk, mnt, "torn", seed) == data  # seeded: the same cut again
        for page in sectors_of(data):
            torn += 0 < sum(page) < len(page)
            whole += all(page)
            lost += not any(page)
    assert torn and whole and lost


def test_random_cuts_keep_or_lose_whole_pages(disk, mnt):
    results = set()
    for seed in range(8):
        data = overwrite_and_cut(disk, mnt, "random", seed)
        pages = sectors_of(data)
        assert all(all(page) or not any(page) for page in pages)
        results.add(data)
    assert len(results) >= 4  # different seeds, different survivors


def test_a_second_crash_during_recovery(disk, mnt):
    fresh_disk(disk, {"log": b"A" * PAGE})
    with mounted(disk, mnt) as fs:
        write_file(mnt / "log", b"B" * PAGE, flags=os.O_APPEND, sync=True)
        write_file(mnt / "log", b"C" * PAGE, flags=os.O_APPEND)
        fs.cut("all")
    assert (disk / "log").read_bytes() == b"A" * PAGE + b"B" * PAGE
    with mounted(disk, mnt) as fs:  # recovery runs on the same disk, and the power goes again
        assert (mnt / "log").read_bytes() == b"A" * PAGE + b"B" * PAGE
        os.truncate(mnt / "log", PAGE)
        write_file(mnt / "new", b"x", sync=True)
        fs.cut("all")
    assert names(disk) == ["log"]
    assert (disk / "log").read_bytes() == b"A" * PAGE + b"B" * PAGE


# -- fault injection -----------------------------------------------------------------------------------------------


def workload_steps(mnt):
    """A small workload as named steps; each step is one system call."""
    fds = {}
    steps = [
        ("create", lambda: fds.setdefault("f", os.open(mnt / "data", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644))),
        ("write", lambda: os.write(fds["f"], b"a" * PAGE)),
        ("write", lambda: os.pwrite(fds["f"], b"b" * 100, 10000)),
        ("fallocate", lambda: os.posix_fallocate(fds["f"], 0, 5 * PAGE)),
        ("truncate", lambda: os.ftruncate(fds["f"], 3 * PAGE)),
        ("fsync", lambda: os.fsync(fds["f"])),
        ("fdatasync", lambda: os.fdatasync(fds["f"])),
        ("mkdir", lambda: os.mkdir(mnt / "sub")),
        ("rename", lambda: os.rename(mnt / "data", mnt / "sub" / "data")),
        ("link", lambda: os.link(mnt / "sub" / "data", mnt / "hard")),
        ("symlink", lambda: os.symlink("sub/data", mnt / "soft")),
        ("unlink", lambda: os.unlink(mnt / "hard")),
        ("fsyncdir", lambda: fsync_dir(mnt / "sub")),
        ("mkdir", lambda: os.mkdir(mnt / "gone")),
        ("rmdir", lambda: os.rmdir(mnt / "gone")),
    ]
    return steps, fds


def run_steps(steps, fds):
    """Run the steps until one fails: (index of the failed step or None, its errno)."""
    try:
        for i, (_, step) in enumerate(steps):
            try:
                step()
            except OSError as e:
                return i, e.errno
        return None, None
    finally:
        for fd in fds.values():
            os.close(fd)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EIO])
def test_every_operation_of_a_workload_can_be_failed_and_the_error_reaches_that_call(disk, mnt, err):
    # count: the operations of each step
    fresh_disk(disk)
    with mounted(disk, mnt) as fs:
        steps, fds = workload_steps(mnt)
        ends = []
        try:
            for _, step in steps:
                step()
                ends.append(fs.counters()["ops"])
        finally:
            for fd in fds.values():
                os.close(fd)
        counters = fs.counters()
    assert ends == list(range(1, len(steps) + 1))  # one operation per step
    assert counters["fsync"] == 2 and counters["mkdir"] == 2 and counters["fsyncdir"] == 1
    # sweep: fail the k-th operation
    for k in range(1, ends[-1] + 1):
        fresh_disk(disk)
        with mounted(disk, mnt) as fs:
            fs.fail(k, err)
            steps, fds = workload_steps(mnt)
            failed, got = run_steps(steps, fds)
            counters = fs.counters()
        assert failed == k - 1, f"failing operation {k} ({steps[k - 1][0]}) failed step {failed}"
        assert got == err
        assert counters["injected"] == 1


def test_fault_injection_can_count_only_some_kinds(disk, mnt):
    with mounted(disk, mnt) as fs:
        fs.fail(2, "EIO", ["fsync"])
        fd = os.open(mnt / "f", os.O_CREAT | os.O_RDWR, 0o644)
        os.write(fd, b"1")
        os.fsync(fd)
        os.write(fd, b"2")
        with pytest.raises(OSError) as e:
            os.fsync(fd)
        assert e.value.errno == errno.EIO
        os.write(fd, b"3")
        os.fsync(fd)  # one shot
        os.close(fd)
        fs.fail(1, errno.ENOSPC, ["write"])
        fs.fail_off()
        write_file(mnt / "g", b"fine")
        assert fs.counters()["injected"] == 1


def test_fault_injection_can_count_only_the_operations_on_one_file(disk, mnt):
    with mounted(disk, mnt) as fs:
        fds = {}
        for name in ("a", "b"):
            fds[name] = os.open(mnt / name, os.O_CREAT | os.O_RDWR, 0o644)
        fs.fail(2, "EIO", ["write", "fsync"], path=mnt / "b")
        for _ in range(3):
            os.write(fds["a"], b"a")
            os.fsync(fds["a"])  # not counted: another file
        os.write(fds["b"], b"1")
        with pytest.raises(OSError) as e:
            os.fsync(fds["b"])
        assert e.value.errno == errno.EIO
        os.write(fds["a"], b"a")
        os.fsync(fds["a"])
        for fd in fds.values():
            os.close(fd)
        assert fs.counters()["injected"] == 1
        assert (mnt / "a").read_bytes() == b"aaaa"


def test_a_failed_fsync_drops_the_pages_by_default_as_linux_does(disk, mnt):
    fresh_disk(disk, {"f": b"x" * PAGE})
    with mounted(disk, mnt) as fs:
        fd = os.open(mnt / "f", os.O_RDWR)
        os.pwrite(fd, b"y" * PAGE, 0)
        fs.fail(1, "EIO", ["fsync"])
        with pytest.raises(OSError) as e:
            os.fsync(fd)
        assert e.value.errno == errno.EIO
        os.fsync(fd)  # succeeds: the pages are no longer dirty, nothing is written
        assert os.pread(fd, PAGE, 0) == b"y" * PAGE  # still what reads see
        os.close(fd)
        fs.cut("all")
    assert (disk / "f").read_bytes() == b"x" * PAGE


def test_a_failed_fsync_can_keep_the_pages_for_a_retry(disk, mnt):
    fresh_disk(disk, {"f": b"x" * PAGE})
    with mounted(disk, mnt) as fs:
        fs.fsync_error("keep")
        fd = os.open(mnt / "f", os.O_RDWR)
        os.pwrite(fd, b"y" * PAGE, 0)
        fs.fail(1, "EIO", ["fsync"])
        with pytest.raises(OSError):
            os.fsync(fd)
        os.fsync(fd)
        os.close(fd)
        fs.cut("all")
    assert (disk / "f").read_bytes() == b"y" * PAGE


def test_capacity_answers_enospc(disk, mnt):
    fresh_disk(disk, {"old": b"o" * 1000})
    with mounted(disk, mnt) as fs:
        fs.capacity(10000)
        write_file(mnt / "a", b"a" * 8000)
        with pytest.raises(OSError) as e:
            write_file(mnt / "b", b"b" * 2000)
        assert e.value.errno == errno.ENOSPC
        fd = os.open(mnt / "a", os.O_RDWR)
        with pytest.raises(OSError) as e:
            os.ftruncate(fd, 20000)
        assert e.value.errno == errno.ENOSPC
        os.pwrite(fd, b"rewrite", 0)  # within the size: no growth
        os.close(fd)
        fs.capacity(None)
        write_file(mnt / "b", b"b" * 2000)


# -- the harness ---------------------------------------------------------------------------------------------------


def test_after_a_cut_every_operation_fails_and_nothing_stays_mounted(disk, mnt):
    with mounted(disk, mnt) as fs:
        write_file(mnt / "f", b"x", sync=True)
        fd = os.open(mnt / "f", os.O_RDONLY)
        fs.command("cut all 0")
        for call in (lambda: os.pread(fd, 10, 0), lambda: os.stat(mnt / "f"), lambda: os.listdir(mnt)):
            with pytest.raises(OSError) as e:
                call()
            assert e.value.errno == errno.EIO
        with pytest.raises(OSError) as e:
            os.close(fd)  # the flush of close fails too; the descriptor is closed all the same
        assert e.value.errno == errno.EIO
        fs.unmount()
        assert not fs.mounted
    assert not powerfs_mounts(mnt.parent)


def test_no_mount_is_left_behind_when_the_test_fails_or_a_file_stays_open(disk, mnt):
    with pytest.raises(RuntimeError, match="the test fails"):
        with mounted(disk, mnt):
            fd = os.open(mnt / "f", os.O_CREAT | os.O_WRONLY, 0o644)
            os.write(fd, b"open")
            raise RuntimeError("the test fails")
    with pytest.raises(OSError):
        os.write(fd, b"!")  # the file system is gone (ENOTCONN)
    with contextlib.suppress(OSError):
        os.close(fd)
    assert not powerfs_mounts(mnt.parent)
    assert (disk / "f").read_bytes() == b"open"  # the daemon was stopped cleanly: a clean unmount


def test_a_hung_test_is_aborted_by_the_deadline(disk, mnt):
    fs = PowerFS(disk, mnt, deadline=1.0)
    try:
        fs.mount()
    except PowerFSError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        pid = fs._proc.pid
        os.kill(pid, signal.SIGSTOP)  # the daemon hangs
        proc = subprocess.Popen([sys.executable, "-c", "import os, sys; os.stat(sys.argv[1])", str(mnt / "x")])
        assert proc.wait(30) != 0  # the watchdog aborted the connection: the stat fails instead of hanging
    finally:
        with pytest.raises(PowerFSError, match="aborted"):
            fs.unmount()
    assert not powerfs_mounts(mnt.parent)


def test_a_missing_toolchain_fails_saying_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    with pytest.raises(PowerFSError, match="apt-get install"):
        build(cache_dir=tmp_path / "cache")


def test_concurrent_writers_in_several_processes(disk, mnt):
    code = """
import os, sys
path, tag = sys.argv[1], sys.argv[2].encode()
fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o644)
for i in range(200):
    os.write(fd, tag * 1000)
    if i % 50 == 49:
        os.fsync(fd)
os.close(fd)
"""
    with mounted(disk, mnt) as fs:
        procs = [subprocess.Popen([sys.executable, "-c", code, str(mnt / f"w{i}"), str(i)]) for i in range(4)]
        try:
            assert [p.wait(60) for p in procs] == [0] * 4
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(30)
        fsync_dir(mnt)
        fs.cut("all")
    for i in range(4):
        assert (disk / f"w{i}").read_bytes() == str(i).encode() * 200 * 1000
