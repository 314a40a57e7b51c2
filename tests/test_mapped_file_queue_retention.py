"""Retention primitives: MappedFileQueue.delete_expired_files / retry_delete_hanged, MappedFile.destroy with
readers, ConsumeQueue.delete_expired_files. Times are explicit (fake) milliseconds."""

import os

import pytest

from localmq.store.consume_queue import ConsumeQueue
from localmq.store.mapped_file_queue import DELETE_FILES_BATCH_MAX, MappedFileQueue

SIZE = 4096
HOUR = 3_600_000
NOW = 1_700_000_000_000  # a fixed "now" in ms since the epoch


def make_queue(tmp_path, n, ages_h=None):
    """A queue of ``n`` full segments; segment i has mtime NOW - ages_h[i] hours (default: 100 h, all old)."""
    mfq = MappedFileQueue(str(tmp_path / "commitlog"), SIZE)
    for i in range(n):
        mf = mfq.create_file(i * SIZE)
        mf.append(bytes([i + 1]) * SIZE)
    for i, mf in enumerate(mfq.files):
        age = 100 if ages_h is None else ages_h[i]
        t = (NOW - age * HOUR) / 1000
        os.utime(mf.path, (t, t))
    return mfq


def names(tmp_path):
    return sorted(os.listdir(tmp_path / "commitlog"))


def test_expired_files_stop_at_first_young_file_and_never_take_the_last(tmp_path):
    mfq = make_queue(tmp_path, 6, ages_h=[80, 75, 10, 90, 90, 90])
    try:
        # 72 h reserved: the run is segments 0 and 1; segment 3 is old but after a young one
        assert [mf.file_from_offset for mf in mfq.expired_files(72 * HOUR, NOW)] == [0, SIZE]
        # clean at once: every segment but the last
        assert len(mfq.expired_files(72 * HOUR, NOW, clean_immediately=True)) == 5
        assert len(mfq.expired_files(72 * HOUR, NOW, clean_immediately=True, batch_max=2)) == 2
    finally:
        mfq.close()


def test_delete_expired_files_batch_max_and_atomic_list_replacement(tmp_path):
    mfq = make_queue(tmp_path, 14)
    try:
        before = mfq.files
        snapshot = list(before)
        res = mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=1000)
        assert len(res.deleted) == DELETE_FILES_BATCH_MAX == 10
        # readers holding the old list see it unchanged: the queue assigned a new one
        assert before == snapshot and mfq.files is not before
        assert [int(n) for n in names(tmp_path)] == [i * SIZE for i in range(10, 14)]
        assert mfq.min_offset() == 10 * SIZE
        res = mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=1000)
        assert len(res.deleted) == 3  # never the last segment
        assert [int(n) for n in names(tmp_path)] == [13 * SIZE]
        assert mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=1000).deleted == []
    finally:
        mfq.close()


def test_max_end_offset_holds_files_back(tmp_path):
    mfq = make_queue(tmp_path, 5)
    try:
        # files end at 4096, 8192, ...: an offset inside segment 2 keeps segments 2 and 3
        res = mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=1000, max_end_offset=2 * SIZE + 100)
        assert [os.path.basename(p) for p in res.deleted] == ["%020d" % 0, "%020d" % SIZE]
        assert [mf.file_from_offset for mf in res.held_back] == [2 * SIZE, 3 * SIZE]
    finally:
        mfq.close()


def test_between_can_stop_a_pass(tmp_path):
    mfq = make_queue(tmp_path, 5)
    try:
        calls = []
        res = mfq.delete_expired_files(
            72 * HOUR, NOW, forcibly_ms=1000, between=lambda: calls.append(1) or len(calls) < 2
        )
        assert len(res.deleted) == 2 and res.stopped
    finally:
        mfq.close()


def test_held_file_is_deferred_then_deleted_on_release(tmp_path):
    mfq = make_queue(tmp_path, 4)
    try:
        first = mfq.files[0]
        assert first.hold()
        res = mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=120_000)
        assert res.deleted == [] and res.hanged
        # out of the list at once, but still mapped and on disk while held
        assert mfq.files[0].file_from_offset == SIZE and mfq.hanged == [first]
        assert os.path.exists(first.path) and not first.closed
        assert first.read(0, 4) == b"\x01" * 4
        # nothing more is deleted while the file is on disk (no gap between names after a crash)
        assert mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=120_000).deleted == []
        first.release()
        assert first.closed and not os.path.exists(first.path)
        assert mfq.retry_delete_hanged(None, NOW) == [first.path]
        assert mfq.hanged == []
        assert len(mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=120_000).deleted) == 2
    finally:
        mfq.close()


def test_held_file_is_destroyed_forcibly_after_the_interval(tmp_path):
    mfq = make_queue(tmp_path, 3)
    try:
        first = mfq.files[0]
        assert first.hold()
        mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=5000)
        assert mfq.hanged == [first]
        assert mfq.retry_delete_hanged(5000, NOW + 4999) == []
        assert os.path.exists(first.path)
        assert mfq.retry_delete_hanged(None, NOW + 10_000) == []  # None never forces
        assert mfq.retry_delete_hanged(5000, NOW + 5000) == [first.path]
        assert first.closed and not os.path.exists(first.path) and mfq.hanged == []
        first.release()  # the late release of a forced reference is harmless
    finally:
        mfq.close()


def test_zero_copy_view_keeps_the_mapping_even_when_forced(tmp_path):
    mfq = make_queue(tmp_path, 3)
    try:
        first = mfq.files[0]
        view = first.view(0, 16)
        mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=5000)
        assert mfq.hanged == [first] and os.path.exists(first.path)
        assert bytes(view) == b"\x01" * 16
        # forced: the name goes, the mapping stays for the view
        assert mfq.retry_delete_hanged(5000, NOW + 6000) == [first.path]
        assert not os.path.exists(first.path)
        assert bytes(view) == b"\x01" * 16
        assert first.closed  # no new reader gets it
        view.release()
        assert first.exported == 0
    finally:
        mfq.close()


def test_released_view_completes_the_deferred_destroy(tmp_path):
    mfq = make_queue(tmp_path, 3)
    try:
        first = mfq.files[0]
        view = memoryview(first)
        mfq.delete_expired_files(72 * HOUR, NOW, forcibly_ms=120_000)
        assert os.path.exists(first.path)
        view.release()
        assert not os.path.exists(first.path)
        assert mfq.retry_delete_hanged(None, NOW) == [first.path]
    finally:
        mfq.close()


def unit_bytes(phys, size):
    return phys.to_bytes(8, "big") + size.to_bytes(4, "big") + (0).to_bytes(8, "big")


def test_consume_queue_delete_expired_files_follows_the_commit_log_min(tmp_path):
    # 10 units per file (200 bytes); unit i points at commit log offset 100 * i, 100 bytes long
    cq = ConsumeQueue("t", 0, str(tmp_path / "consumequeue"), 200)
    try:
        for i in range(35):
            assert cq.put_unit(i, 100 * i, 100, 0)
        d = tmp_path / "consumequeue" / "t" / "0"
        assert len(os.listdir(d)) == 4
        # the commit log now starts at 2550: units 0..25 point below it; files 0 and 1 (units 0..19) go
        gone = cq.delete_expired_files(2550, 60_000, NOW)
        assert sorted(os.path.basename(p) for p in gone) == ["%020d" % 0, "%020d" % 200]
        assert sorted(os.listdir(d)) == ["%020d" % 400, "%020d" % 600]
        assert cq.min_offset == 26  # first unit at or after offset 2550 is unit 26 (2600)
        assert cq.unit(25) is None and cq.unit(26)[0] == 2600
        # everything below the log: every file but the last (the dispatcher writes it) goes
        assert len(cq.delete_expired_files(10_000, 60_000, NOW)) == 1
        assert sorted(os.listdir(d)) == ["%020d" % 600]
        assert cq.min_offset == cq.max_offset == 35
    finally:
        cq.close()


def test_consume_queue_file_held_by_a_units_view_is_deleted_later(tmp_path):
    cq = ConsumeQueue("t", 0, str(tmp_path / "consumequeue"), 200)
    try:
        for i in range(25):
            cq.put_unit(i, 100 * i, 100, 0)
        arr = cq.units(0, 5)
        first_path = cq.mapped_file_queue.files[0].path
        assert cq.delete_expired_files(2000, 60_000, NOW) == []  # deferred by the numpy view
        assert os.path.exists(first_path)
        assert int(arr["offset"][4]) == 400
        del arr
        # the view is gone: the retry collects the first file, then the second is deleted too
        gone = cq.delete_expired_files(2000, 60_000, NOW)
        assert sorted(os.path.basename(p) for p in gone) == ["%020d" % 0, "%020d" % 200]
    finally:
        cq.close()


@pytest.mark.parametrize("blank_at_end", [True, False])
def test_consume_queue_blank_units_do_not_make_a_file_look_expired(tmp_path, blank_at_end):
    cq = ConsumeQueue("t", 0, str(tmp_path / "consumequeue"), 200)
    try:
        for i in range(9):
            cq.put_unit(i, 1000 + 100 * i, 100, 0)
        if blank_at_end:
            cq.put_unit(10, 1000 + 100 * 10, 100, 0)  # unit 9 becomes a blank gap unit (offset 0)
        else:
            cq.put_unit(9, 1900, 100, 0)
        for i in range(11, 15):
            cq.put_unit(i, 1000 + 100 * i, 100, 0)
        # min 1500: the first file still points at 1500..1900, so it stays
        assert cq.delete_expired_files(1500, 60_000, NOW) == []
        assert cq.min_offset == 5
    finally:
        cq.close()
