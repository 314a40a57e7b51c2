"""Recovery time of a 1 GiB CommitLog: normal (last three segments, CRC checked) and abnormal (abort present:
walk from the checkpoint with CRC, then re-dispatch). Target (issue 2): abnormal < 2 s."""

import os
import shutil

import pytest

from conftest import QUICK

localmq = pytest.importorskip("localmq")

LOG_BYTES = (16 << 20) if QUICK else (1 << 30)
SEGMENT = (4 << 20) if QUICK else (256 << 20)


@pytest.fixture(scope="module")
def filled_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("recovery") / "store"
    bodies = [os.urandom(100) for _ in range(1000)]
    with localmq.open(path, mapped_file_size_commit_log=SEGMENT) as st:
        i = 0
        while st.commit_log_max_offset < LOG_BYTES - 200_000:
            st.put_batch(f"t{i % 8}", bodies, queue_id=i % 4)
            i += 1
        size = st.commit_log_max_offset
    yield path, size
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("mode", ["normal", "abnormal"])
def test_recovery_1gib(benchmark, filled_store, mode):
    path, size = filled_store
    reports = []

    def setup():
        if mode == "abnormal":
            (path / "abort").touch()

    def reopen():
        st = localmq.open(path, mapped_file_size_commit_log=SEGMENT)
        reports.append(st.recovery)
        st.close()

    benchmark.pedantic(reopen, setup=setup, rounds=3 if not QUICK else 1, iterations=1)
    rep = reports[-1]
    assert rep.mode == mode and rep.dropped_at is None
    benchmark.extra_info.update(log_bytes=size, records_checked=rep.records_checked, mode=mode)
    print(
        f"\nrecovery {mode}: {size / 2**20:.0f} MiB log, {rep.records_checked:,} records CRC-checked, "
        f"median {benchmark.stats.stats.median:.3f} s"
    )


def _drop_cache(root):
    """Evict the store's files from the page cache (clean pages): the next open reads them from disk."""
    for dirpath, _, names in os.walk(root):
        for n in names:
            fd = os.open(os.path.join(dirpath, n), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@pytest.mark.parametrize("cache", ["warm", "cold"])
@pytest.mark.parametrize("check_units", [True, False], ids=["unit-check", "no-unit-check"])
def test_open_unit_check_cost(benchmark, filled_store, check_units, cache):
    """What the open-time check of every ConsumeQueue unit against its record (issue 13,
    ``check_consume_queue_on_open``, on by default) adds to a normal open of the 1 GiB log, with the files in the
    page cache and evicted from it."""
    path, size = filled_store
    reports = []

    def setup():
        if cache == "cold":
            _drop_cache(path)

    def reopen():
        st = localmq.open(path, mapped_file_size_commit_log=SEGMENT, check_consume_queue_on_open=check_units)
        reports.append(st.recovery)
        st.close()

    benchmark.pedantic(reopen, setup=setup, rounds=3 if not QUICK else 1, iterations=1)
    assert reports[-1].mode == "normal" and reports[-1].dropped_at is None
    benchmark.extra_info.update(log_bytes=size, check_units=check_units, cache=cache)
    print(
        f"\nopen ({cache} cache, unit check {'on' if check_units else 'off'}): {size / 2**20:.0f} MiB log, "
        f"median {benchmark.stats.stats.median:.3f} s"
    )


@pytest.mark.parametrize("log_mib", [1, 4] if QUICK else [64, 256, 1024])
@pytest.mark.parametrize("mode", ["normal", "abnormal"])
def test_recovery_by_size(benchmark, tmp_path, mode, log_mib):
    """Open time against the size of the log (64 MiB segments, 100-byte bodies): perf/plots.py draws it."""
    seg = (1 << 20) if QUICK else (64 << 20)
    path = tmp_path / "store"
    bodies = [os.urandom(100) for _ in range(1000)]
    with localmq.open(path, mapped_file_size_commit_log=seg) as st:
        i = 0
        while st.commit_log_max_offset < (log_mib << 20) - 200_000:
            st.put_batch(f"t{i % 8}", bodies, queue_id=i % 4)
            i += 1
        size = st.commit_log_max_offset
    reports = []

    def setup():
        if mode == "abnormal":
            (path / "abort").touch()

    def reopen():
        st = localmq.open(path, mapped_file_size_commit_log=seg)
        reports.append(st.recovery)
        st.close()

    benchmark.pedantic(reopen, setup=setup, rounds=1 if QUICK else 3, iterations=1)
    assert reports[-1].mode == mode and reports[-1].dropped_at is None
    benchmark.extra_info.update(log_bytes=size, mode=mode, scenario="recovery_by_size")
    shutil.rmtree(path, ignore_errors=True)
