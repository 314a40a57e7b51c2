"""Settings remembered: config/localmq.json, sizes read off a RocketMQ store's files, and failed opens that leave the
directory as they found it."""

import fcntl
import json
import os
import shutil

import pytest

import localmq
from helpers import queue_messages
from localmq.errors import (
    ConfigError,
    CorruptStoreError,
    DamagedLogError,
    StoreLockedError,
    StoreSettingsError,
    UnsafePathError,
)
from localmq.layout import CONFIG_DIR, SETTINGS_FILE, SETTINGS_VERSION
from localmq.queues.local import LocalMessageQueue

SEG = 8192
FIXTURE_BODY = b"Once, there was a chance for me!"
CQ = 200
SMALL = dict(
    mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=CQ, max_hash_slot_num=100, max_index_num=400
)


def record(root):
    with open(os.path.join(root, CONFIG_DIR, SETTINGS_FILE)) as f:
        return json.load(f)


def snapshot(root):
    """Every directory and every file's bytes under ``root`` (relative paths); None when it does not exist."""
    root = str(root)
    if not os.path.lexists(root):
        return None
    dirs, files = [], {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirs += [os.path.relpath(os.path.join(dirpath, d), root) for d in dirnames]
        for n in filenames:
            p = os.path.join(dirpath, n)
            with open(p, "rb") as f:
                files[os.path.relpath(p, root)] = f.read()
    return sorted(dirs), files


def read_queue(st, topic, qid):
    return [m.body for m in queue_messages(st, topic, qid, wait=False)]


def sizes(directory):
    return {n: os.path.getsize(os.path.join(directory, n)) for n in sorted(os.listdir(directory))}


def make_store(root, n=120):
    bodies = [b"m%04d" % i + b"x" * 200 for i in range(n)]
    with localmq.open(root, **SMALL) as st:
        st.put_batch("orders", bodies[: n // 2], queue_id=0)
        for b in bodies[n // 2 :]:
            st.put("orders", b, queue_id=1, keys=["k"])
        st.wait_for_dispatch()
    return bodies


# -- the record ---------------------------------------------------------------------------------------------------


def test_created_store_records_its_settings(tmp_path):
    root = tmp_path / "s"
    make_store(root)
    doc = record(root)
    assert doc["version"] == SETTINGS_VERSION
    assert doc["settings"] == {
        "mapped_file_size_commit_log": SEG,
        "mapped_file_size_consume_queue": CQ,
        "max_hash_slot_num": 100,
        "max_index_num": 400,
        "enable_consume_queue_ext": False,
        "mapped_file_size_consume_queue_ext": 48 * 1024 * 1024,
        "bit_map_length_consume_queue_ext": 64,
    }
    assert not os.path.exists(os.path.join(root, CONFIG_DIR, SETTINGS_FILE + ".tmp"))


def test_reopen_without_arguments_uses_the_record(tmp_path):
    root = tmp_path / "s"
    bodies = make_store(root)
    before = sizes(root / "commitlog")
    assert set(before.values()) == {SEG} and len(before) > 2
    with localmq.open(root) as st:
        assert (st.config.mapped_file_size_commit_log, st.config.mapped_file_size_consume_queue) == (SEG, CQ)
        assert (st.config.max_hash_slot_num, st.config.max_index_num) == (100, 400)
        assert read_queue(st, "orders", 0) + read_queue(st, "orders", 1) == bodies
        for i in range(60):
            st.put("orders", b"new%d" % i + b"y" * 300, queue_id=2)
        st.wait_for_dispatch()
        assert len(read_queue(st, "orders", 2)) == 60
        assert len(st.query_message("orders", "k", max_num=100)) in range(1, 101)
    after = sizes(root / "commitlog")
    assert set(after.values()) == {SEG} and len(after) > len(before)
    for topic_dir in (root / "consumequeue" / "orders").iterdir():
        assert set(sizes(topic_dir).values()) == {CQ}
    assert {os.path.getsize(p) for p in (root / "index").iterdir()} == {40 + 100 * 4 + 400 * 20}
    with localmq.open(root, read_only=True) as st:
        assert len(read_queue(st, "orders", 2)) == 60


def test_explicit_same_values_are_accepted(tmp_path):
    root = tmp_path / "s"
    make_store(root)
    with localmq.open(root, mapped_file_size_commit_log=SEG, max_index_num=400) as st:
        assert st.max_offset("orders", 0) == 60


@pytest.mark.parametrize(
    "name, value",
    [
        ("mapped_file_size_commit_log", 4096),
        ("mapped_file_size_consume_queue", 400),
        ("max_index_num", 800),
        ("mapped_file_size_commit_log", 1024 * 1024 * 1024),
    ],
)
def test_contradicting_setting_is_a_typed_error(tmp_path, name, value):
    root = tmp_path / "s"
    make_store(root)
    recorded = record(root)["settings"][name]
    before = snapshot(root)
    with pytest.raises(StoreSettingsError) as ei:
        localmq.open(root, **{name: value})
    e = ei.value
    assert isinstance(e, ConfigError)
    assert (e.setting, e.recorded, e.given, e.source) == (name, recorded, value, "record")
    assert f"{name}={value}" in str(e) and f"{name}={recorded}" in str(e)
    assert snapshot(root) == before


def test_store_config_object_fields_off_default_are_explicit(tmp_path):
    root = tmp_path / "s"
    make_store(root)
    with pytest.raises(StoreSettingsError):
        LocalMessageQueue(root, localmq.StoreConfig(mapped_file_size_commit_log=16384))
    with LocalMessageQueue(root, localmq.StoreConfig(flush_disk_type="SYNC_FLUSH")) as st:
        assert st.config.mapped_file_size_commit_log == SEG


def test_shared_and_read_only_openers_use_the_record(tmp_path):
    root = tmp_path / "s"
    with localmq.open(root, shared=True, mapped_file_size_commit_log=SEG) as st:
        st.put("t", b"a" * 5000)
        st.put("t", b"b" * 5000)
    assert record(root)["settings"]["mapped_file_size_commit_log"] == SEG
    with localmq.open(root, shared=True) as st:
        assert st.config.mapped_file_size_commit_log == SEG
        st.wait_for_dispatch()
        assert len(read_queue(st, "t", 0)) == 2
    with pytest.raises(StoreSettingsError):
        localmq.open(root, read_only=True, mapped_file_size_commit_log=4096)


def test_corrupt_record_is_refused(tmp_path):
    root = tmp_path / "s"
    make_store(root)
    with open(root / CONFIG_DIR / SETTINGS_FILE, "w") as f:
        f.write("{not json")
    before = snapshot(root)
    with pytest.raises(CorruptStoreError, match="not JSON"):
        localmq.open(root)
    assert snapshot(root) == before


@pytest.mark.parametrize("kwargs", [{}, {"mapped_file_size_commit_log": SEG}])
def test_record_that_contradicts_the_segments_is_damaged_and_the_segments_win(tmp_path, monkeypatch, kwargs):
    """A flipped digit in the record's segment size still parses (8192 -> 9192): the segments tell the size the
    data was written with, so the store opens with every message and the record is written again. A failed open
    puts the damaged record's bytes back."""
    root = tmp_path / "s"
    written = make_store(root)
    path = root / CONFIG_DIR / SETTINGS_FILE
    damaged = path.read_bytes().replace(b"8192", b"9192")
    assert damaged != path.read_bytes()
    path.write_bytes(damaged)
    with localmq.open(root, **kwargs) as st:
        assert st.config.mapped_file_size_commit_log == SEG
        got = [bytes(m.body) for q in (0, 1) for m in queue_messages(st, "orders", q)]
        assert got == written
    assert record(root)["settings"]["mapped_file_size_commit_log"] == SEG
    # the same damage, then an open that fails after the record was written again: the damaged bytes come back
    path.write_bytes(damaged)

    def boom(self):
        raise RuntimeError("clean service failed to start")

    monkeypatch.setattr(LocalMessageQueue, "_start_clean_service", boom)
    with pytest.raises(RuntimeError, match="clean service"):
        localmq.open(root, **kwargs)
    assert path.read_bytes() == damaged


# -- stores without the record ------------------------------------------------------------------------------------


def test_rocketmq_store_opens_without_size_arguments(fixtures_dir, tmp_path):
    shutil.copytree(fixtures_dir / "apache-rocketmq-4e25b979" / "store", tmp_path / "store")
    root = tmp_path / "store"
    before = snapshot(root)
    with localmq.open(root, read_only=True) as st:  # a view: the size from the files, nothing written
        assert st.config.mapped_file_size_commit_log == SEG
        assert st.look_message_by_offset(172).body == FIXTURE_BODY
    assert snapshot(root) == before
    with localmq.open(root) as st:
        assert st.config.mapped_file_size_commit_log == SEG
        assert st.max_offset("abc", 0) == 47
        r = st.put("abc", b"appended", tags="TAG1")
        assert r.physical_offset == SEG
    assert sizes(root / "commitlog") == {"00000000000000000000": SEG, "00000000000000008192": SEG}
    assert record(root)["settings"]["mapped_file_size_commit_log"] == SEG
    with localmq.open(root) as st:
        assert st.max_offset("abc", 0) == 48


def test_rocketmq_store_sizes_of_queues_and_ext_read_off_the_files(fixtures_dir, tmp_path):
    src = fixtures_dir / "EricPanGopher-rocketmq-9835cd5f" / "store" / "unit_test_store"
    shutil.copytree(src, tmp_path / "store")
    root = tmp_path / "store"
    with localmq.open(root) as st:
        assert (st.config.mapped_file_size_commit_log, st.config.mapped_file_size_consume_queue) == (SEG, 200)
        assert st.config.enable_consume_queue_ext and st.config.mapped_file_size_consume_queue_ext == 840
        assert st.max_offset("abc", 0) == 179
    assert record(root)["settings"]["mapped_file_size_consume_queue"] == 200


def test_rocketmq_store_contradicting_size_names_the_files(fixtures_dir, tmp_path):
    shutil.copytree(fixtures_dir / "apache-rocketmq-4e25b979" / "store", tmp_path / "store")
    root = tmp_path / "store"
    before = snapshot(root)
    with pytest.raises(StoreSettingsError) as ei:
        localmq.open(root, mapped_file_size_commit_log=4096)
    assert (ei.value.recorded, ei.value.given, ei.value.source) == (SEG, 4096, "files")
    assert "4096" in str(ei.value) and "8192" in str(ei.value)
    assert snapshot(root) == before


def test_store_of_an_older_localmq_gets_the_record(tmp_path):
    root = tmp_path / "s"
    bodies = make_store(root)
    os.unlink(root / CONFIG_DIR / SETTINGS_FILE)
    with localmq.open(root) as st:
        assert (st.config.mapped_file_size_commit_log, st.config.mapped_file_size_consume_queue) == (SEG, CQ)
        assert read_queue(st, "orders", 0) + read_queue(st, "orders", 1) == bodies
    # the index geometry cannot be told from a file size: the configured (default) values are recorded
    assert record(root)["settings"]["mapped_file_size_commit_log"] == SEG


# -- a failed open leaves the directory as it found it ------------------------------------------------------------


def _misnamed_segment(root):
    with open(root / "commitlog" / "junk", "wb") as f:
        f.write(b"x")


def _symlink(root):
    os.symlink("/tmp", root / "consumequeue" / "evil")


def _mixed_sizes(root):
    # segments of two sizes (and no record): nothing to read the size off, so the configured one is refused
    os.unlink(root / CONFIG_DIR / SETTINGS_FILE)
    with open(root / "commitlog" / "00000000000000000000", "r+b") as f:
        f.truncate(SEG * 2)


@pytest.mark.parametrize(
    "damage, error, kwargs",
    [
        (_misnamed_segment, DamagedLogError, {}),
        (_symlink, UnsafePathError, {}),
        (_mixed_sizes, CorruptStoreError, {}),
        (None, StoreSettingsError, {"mapped_file_size_commit_log": 4096}),
        (None, ConfigError, {"shared": True, "transient_store_pool_enable": True}),
    ],
)
def test_failed_open_leaves_the_directory_unchanged(tmp_path, damage, error, kwargs):
    root = tmp_path / "s"
    make_store(root)
    if damage is not None:
        damage(root)
    before = snapshot(root)
    with pytest.raises(error):
        localmq.open(root, **kwargs)
    assert snapshot(root) == before


def test_failed_open_of_a_rocketmq_store_without_checkpoint_or_queues(fixtures_dir, tmp_path):
    shutil.copytree(fixtures_dir / "apache-rocketmq-4e25b979" / "store", tmp_path / "store")
    root = tmp_path / "store"
    _misnamed_segment(root)
    os.unlink(root / "lock")
    before = snapshot(root)
    with pytest.raises(DamagedLogError):
        localmq.open(root)
    assert snapshot(root) == before  # no checkpoint, consumequeue/, lock or record left behind


def test_locked_store_is_unchanged(tmp_path):
    root = tmp_path / "s"
    make_store(root)
    before = snapshot(root)
    fd = os.open(root / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(StoreLockedError):
            localmq.open(root, shared=False)
    finally:
        os.close(fd)
    assert snapshot(root) == before


def test_regular_file_path_is_unchanged(tmp_path):
    path = tmp_path / "file"
    path.write_bytes(b"not a store")
    with pytest.raises(localmq.StorePathError) as e:  # issue 14: was a bare FileExistsError
        localmq.open(path)
    assert isinstance(e.value, NotADirectoryError) and str(path) in str(e.value)
    with pytest.raises(localmq.StorePathError):
        localmq.open(path / "below", shared=True)
    assert path.read_bytes() == b"not a store" and os.listdir(tmp_path) == ["file"]


def test_failure_after_the_services_started_is_undone(tmp_path, monkeypatch):
    root = tmp_path / "s"
    make_store(root)
    before = snapshot(root)

    def boom(self):
        raise RuntimeError("clean service failed to start")

    monkeypatch.setattr(LocalMessageQueue, "_start_clean_service", boom)
    with pytest.raises(RuntimeError, match="clean service"):
        localmq.open(root)
    assert snapshot(root) == before  # abort, segments allocated ahead, index file: gone; checkpoint as it was


@pytest.mark.parametrize(
    "kwargs",
    [{"shared": True, "transient_store_pool_enable": True}, {"mapped_file_size_commit_log": SEG, "boom": True}],
)
def test_failed_first_open_of_a_new_path_leaves_nothing(tmp_path, monkeypatch, kwargs):
    if kwargs.pop("boom", False):

        def boom(self):
            raise RuntimeError("clean service failed to start")

        monkeypatch.setattr(LocalMessageQueue, "_start_clean_service", boom)
    path = tmp_path / "a" / "b" / "store"
    with pytest.raises((ConfigError, RuntimeError)):
        localmq.open(path, **kwargs)
    assert os.listdir(tmp_path) == []


def test_record_is_not_written_by_a_failed_open(tmp_path):
    root = tmp_path / "s"
    make_store(root)
    os.unlink(root / CONFIG_DIR / SETTINGS_FILE)
    _misnamed_segment(root)
    with pytest.raises(DamagedLogError):
        localmq.open(root)
    assert not (root / CONFIG_DIR / SETTINGS_FILE).exists()
