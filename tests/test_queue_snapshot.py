"""The queue snapshot of a clean close (issue 27): the next open takes every queue it vouches for from it, unread,
and checks as before every queue whose files changed since, and every queue when the store changed."""

import os
import shutil
import stat
import subprocess
import threading
import time
import zlib

import pytest

import localmq
from helpers import cq_file, patch, queue_messages
from localmq.layout import (
    CHECKPOINT,
    CQ_UNIT_SIZE,
    QUEUE_SNAPSHOT_FILE_ROW,
    QUEUE_SNAPSHOT_HEADER,
    QUEUE_SNAPSHOT_META,
    QUEUE_SNAPSHOT_QUEUE_ROW,
    QUEUE_SNAPSHOT_TOPIC_ROW,
)
from localmq.store.queue_snapshot import FRESH_NS

SEG = 64 * 1024
CQ_FILE = 20 * CQ_UNIT_SIZE  # 20 units a file: queues of several files
KW = dict(mapped_file_size_commit_log=SEG, mapped_file_size_consume_queue=CQ_FILE)
TOPICS = [f"T{t}" for t in range(10)]
QUEUES = 4
PER_QUEUE = 25  # two files a queue, the second partly written
# retention at every hour, its passes run by the tests (idle otherwise), no pause between deletions
RETENTION = dict(
    delete_when=";".join(f"{h:02d}" for h in range(24)),
    clean_resource_interval=3_600_000,
    delete_commit_log_files_interval=0,
    delete_consume_queue_files_interval=0,
    preallocate_mapped_file=False,
)


def body(topic, q, i):
    return f"{topic}/{q}/{i}:".encode() * 40  # 240-360 bytes: the log spans several segments


def fill(root, **kw):
    with localmq.open(root, **KW, **kw) as st:
        for i in range(PER_QUEUE):
            for t in TOPICS:
                for q in range(QUEUES):
                    assert st.put(t, body(t, q, i), queue_id=q).status is localmq.PutStatus.PUT_OK
        assert st.wait_for_dispatch(10)
        # older than what a close leaves unvouched (a change within the same clock tick could keep its ctime)
        time.sleep(2 * FRESH_NS / 1e9)


def snapshot(root):
    return root / "config" / "queues.snapshot"


def _point_unit_at_another_record(path, pos):
    """The unit at ``pos`` of queue file ``path`` made a copy of the unit four after it (another record of the queue:
    the units at the queue's ends still agree with its row)."""
    with open(path, "rb") as f:
        f.seek(pos + 4 * CQ_UNIT_SIZE)
        other = f.read(CQ_UNIT_SIZE)
    patch(path, pos, other)


def every_queue(st):
    """{(topic, queue id): (min offset, max offset, [bodies])}: what a reader sees."""
    return {
        (t, q): (st.min_offset(t, q), st.max_offset(t, q), [m.body for m in queue_messages(st, t, q, wait=False)])
        for t in TOPICS
        for q in range(QUEUES)
    }


def expected():
    return {(t, q): (0, PER_QUEUE, [body(t, q, i) for i in range(PER_QUEUE)]) for t in TOPICS for q in range(QUEUES)}


def test_a_clean_close_vouches_for_every_queue_and_the_next_open_reads_none(tmp_path):
    root = tmp_path / "s"
    fill(root)
    assert snapshot(root).is_file()
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES
        assert st.recovery.cq_rebuilt == {} and st.recovery.cq_damaged == []
        # no queue file was mapped to recover or check it (a row is checked on its queue's first use)
        assert st.stats()["mapped_queue_files"] == 0
        assert not snapshot(root).exists()  # gone while the store is open: a crash never meets it
        assert every_queue(st) == expected()
        r = st.put("T3", b"after", queue_id=2)
        assert r.queue_offset == PER_QUEUE  # the next queue offset came from the snapshot's row
    # the same store opened with every queue checked (no snapshot) sees the same
    os.unlink(snapshot(root))
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == 0
        got = every_queue(st)
    want = expected()
    want[("T3", 2)] = (0, PER_QUEUE + 1, want[("T3", 2)][2] + [b"after"])
    assert got == want


def test_a_vouched_queue_is_made_on_its_first_use_and_a_queue_never_used_keeps_its_row(tmp_path):
    root = tmp_path / "s"
    fill(root)
    n = len(TOPICS) * QUEUES
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == n
        s = st.stats()
        assert s["consume_queues"] == n
        assert s["consume_queues_built"] == 0  # none made, none checked: each row is checked on its first use
        assert st.topics() == {t: list(range(QUEUES)) for t in TOPICS}  # every queue listed, none made
        assert st.stats()["consume_queues_built"] == 0
        assert [m.body for m in queue_messages(st, "T1", 1, wait=False)] == expected()[("T1", 1)][2]
        assert st.stats()["consume_queues_built"] == 1
        # a put to a queue not made yet: the put path asks its topic's queues for their next offsets (each row is
        # checked: made now) and the dispatcher appends after the last unit
        assert st.put("T2", b"after", queue_id=3).queue_offset == PER_QUEUE
        assert st.wait_for_dispatch(10)
        assert st.stats()["consume_queues_built"] == 1 + QUEUES
        assert st.max_offset("T2", 3) == PER_QUEUE + 1
        time.sleep(2 * FRESH_NS / 1e9)
    # the close wrote the rows of the queues never made as they were: the next open vouches for every queue again
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == n and st.recovery.cq_rebuilt == {}
        got = every_queue(st)
        assert st.stats()["consume_queues_built"] == n
    want = expected()
    want[("T2", 3)] = (0, PER_QUEUE + 1, want[("T2", 3)][2] + [b"after"])
    assert got == want


def test_a_session_that_uses_no_queue_writes_the_snapshot_back_byte_for_byte(tmp_path):
    """A close writes a topic none of whose queues was used as it read it (TopicRow.span), and a topic with one used
    queue row by row: the rows of the unused ones are the same bytes either way, and the next open vouches for all."""
    root = tmp_path / "s"
    fill(root)
    n = len(TOPICS) * QUEUES
    time.sleep(2 * FRESH_NS / 1e9)
    with localmq.open(root, **KW) as st:  # a close after a session that checked and made every queue
        every_queue(st)
    time.sleep(2 * FRESH_NS / 1e9)
    before = snapshot(root).read_bytes()
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == n
        assert len(st._cq_table.whole_topics()) == len(TOPICS)
    assert snapshot(root).read_bytes() == before
    with localmq.open(root, **KW) as st:
        assert [m.body for m in queue_messages(st, "T1", 1, wait=False)] == expected()[("T1", 1)][2]
        assert "T1" not in st._cq_table.whole_topics() and len(st._cq_table.whole_topics()) == len(TOPICS) - 1
    assert snapshot(root).read_bytes() == before  # T1-1's row made from its files' stamps: the same as its row
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == n and st.recovery.cq_rebuilt == {}
        assert every_queue(st) == expected()


def test_queues_made_on_first_use_by_many_readers_and_the_dispatcher_at_once_are_made_once(tmp_path):
    root = tmp_path / "s"
    fill(root)
    errors = []
    seen = {}

    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES

        def reader(k):
            try:
                for t in TOPICS[k % 2 :: 2] + TOPICS:
                    for q in range(QUEUES):
                        seen[(k, t, q)] = [m.body for m in queue_messages(st, t, q, wait=False)][:PER_QUEUE]
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=reader, args=(k,)) for k in range(6)]
        for th in threads:
            th.start()
        for t in reversed(TOPICS):  # puts to every queue meanwhile: the dispatcher makes the ones not made yet
            for q in range(QUEUES):
                assert st.put(t, b"more", queue_id=q).queue_offset == PER_QUEUE
        for th in threads:
            th.join(60)
            assert not th.is_alive(), "a reader did not finish in 60 s"
        assert st.wait_for_dispatch(10)
        assert errors == []
        assert st.stats()["consume_queues_built"] == len(TOPICS) * QUEUES
        for t in TOPICS:
            for q in range(QUEUES):
                assert [m.body for m in queue_messages(st, t, q, wait=False)] == expected()[(t, q)][2] + [b"more"]
    assert all(v == expected()[(t, q)][2] for (_, t, q), v in seen.items())
    assert len(seen) == 6 * len(TOPICS) * QUEUES


@pytest.mark.parametrize("damage", ["zeroed unit", "unit pointing elsewhere", "file deleted", "file truncated"])
def test_a_queue_file_changed_after_the_close_is_checked_as_before(tmp_path, damage):
    root = tmp_path / "s"
    fill(root)
    path, pos = cq_file(root, "T4", 1, 5, CQ_FILE)
    if damage == "zeroed unit":
        patch(path, pos, bytes(CQ_UNIT_SIZE))
    elif damage == "unit pointing elsewhere":
        _point_unit_at_another_record(path, pos)
    elif damage == "file deleted":
        os.unlink(cq_file(root, "T4", 1, 20, CQ_FILE)[0])
    else:
        os.truncate(path, 100)
    with localmq.open(root, **KW) as st:
        rec = st.recovery
        assert rec.cq_vouched == len(TOPICS) * QUEUES  # at the open; each row is checked on its queue's first use
        redispatched = rec.redispatched
        assert every_queue(st) == expected()  # rebuilt from the log on its first use: nothing lost
        if damage == "file deleted":
            # its last file's records, indexed again
            assert rec.redispatched - redispatched >= PER_QUEUE - CQ_FILE // CQ_UNIT_SIZE
        else:
            assert "T4-1" in rec.cq_rebuilt or "T4-1" in rec.cq_damaged or "T4-1" in rec.cq_units_truncated
        # a put takes the next offset (the put path asks the checked queue)
        assert st.put("T4", b"next", queue_id=1).queue_offset == PER_QUEUE


def test_a_queue_changed_behind_the_closed_store_and_not_used_in_the_next_session_is_still_checked(tmp_path):
    # a unit in the middle of T4-1 made to point at another record (the units at its ends still agree with its row):
    # only its file's stamp tells. A session that never uses T4-1 writes its row back with the stamps it had (not
    # the file's new ones), so the session after still checks it on its first use and rebuilds it from the log.
    root = tmp_path / "s"
    fill(root)
    _point_unit_at_another_record(*cq_file(root, "T4", 1, 5, CQ_FILE))
    time.sleep(2 * FRESH_NS / 1e9)
    with localmq.open(root, **KW) as st:
        assert [m.body for m in queue_messages(st, "T1", 1, wait=False)] == expected()[("T1", 1)][2]
        assert "T4-1" not in st.recovery.cq_rebuilt
    time.sleep(2 * FRESH_NS / 1e9)
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES
        assert every_queue(st) == expected()
        assert "T4-1" in st.recovery.cq_rebuilt, st.recovery


def _flip_snapshot_byte(root):
    patch(snapshot(root), QUEUE_SNAPSHOT_HEADER.size + 100, b"\xff")


def _newer_version(root):
    patch(snapshot(root), 4, (2).to_bytes(4, "big"))


def _checkpoint_changed(root):
    with open(root / "checkpoint", "rb") as f:
        first = f.read(8)
    patch(root / "checkpoint", 0, (int.from_bytes(first, "big") + 1).to_bytes(8, "big"))


def _old_segment_rewritten(root):
    # the same bytes written again: its ctime moves, so the snapshot cannot tell what happened to it
    path = root / "commitlog" / f"{0:020d}"
    with open(path, "rb") as f:
        data = f.read(64)
    patch(path, 0, data)


def _abort_left(root):
    open(root / "abort", "wb").close()


def _segments_copied_back(root):
    # a restore from a copy: the same bytes and names, other inodes
    for name in os.listdir(root / "commitlog"):
        path = root / "commitlog" / name
        shutil.copyfile(path, str(path) + ".copy")
        os.replace(str(path) + ".copy", path)


@pytest.mark.parametrize(
    "change",
    [
        _flip_snapshot_byte,
        _newer_version,
        _checkpoint_changed,
        _old_segment_rewritten,
        _abort_left,
        _segments_copied_back,
    ],
)
def test_a_snapshot_that_does_not_match_the_store_is_not_used(tmp_path, change):
    root = tmp_path / "s"
    fill(root)
    assert len(os.listdir(root / "commitlog")) > 3  # an old segment, which the recovery walk does not read
    change(root)
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == 0
        assert not snapshot(root).exists()
        assert every_queue(st) == expected()


def _forge_segment_ctime(root, base):
    """Write the segment's present ctime into the snapshot (CRC made again): as if the change had come within the
    clock tick of the close's last write, on a kernel with coarse timestamps."""
    data = bytearray(snapshot(root).read_bytes())
    body = QUEUE_SNAPSHOT_HEADER.size
    at = body + QUEUE_SNAPSHOT_META.size + CHECKPOINT.size
    n_segments = QUEUE_SNAPSHOT_META.unpack_from(data, body)[6]
    for k in range(n_segments):
        row = at + k * QUEUE_SNAPSHOT_FILE_ROW.size
        b, _, ino = QUEUE_SNAPSHOT_FILE_ROW.unpack_from(data, row)
        if b == base:
            ctime = os.stat(root / "commitlog" / f"{base:020d}").st_ctime_ns
            QUEUE_SNAPSHOT_FILE_ROW.pack_into(data, row, b, ctime, ino)
    magic, version, _, length = QUEUE_SNAPSHOT_HEADER.unpack_from(data, 0)
    QUEUE_SNAPSHOT_HEADER.pack_into(data, 0, magic, version, zlib.crc32(bytes(data[body:])), length)
    snapshot(root).write_bytes(bytes(data))


def test_damage_the_ctimes_miss_in_the_last_segments_turns_every_queue_back_to_the_checks(tmp_path, caplog):
    # a body byte in a segment the recovery walk reads, changed within the close's clock tick (forged here): the walk
    # finds the damage, and then no queue is taken from the snapshot; the damaged message alone is lost
    root = tmp_path / "s"
    fill(root)
    with localmq.open(root, **KW) as st:  # a reader: its close writes the snapshot again, nothing else changed
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES
        m = queue_messages(st, "T9", 3, wait=False)[-2]
    base = m.physical_offset // SEG * SEG
    assert base >= int(sorted(os.listdir(root / "commitlog"))[-3])  # a segment the walk reads
    patch(root / "commitlog" / f"{base:020d}", m.physical_offset - base + m.store_size - 10, b"\x00")
    _forge_segment_ctime(root, base)
    with localmq.open(root, **KW) as st:
        assert "the commit log changed since its clean close" in caplog.text  # the snapshot matched the store
        assert st.recovery.cq_vouched == 0
        assert st.recovery.gaps
        assert st.recovery.gaps[0]["record"] == (m.physical_offset, m.store_size)
        for (t, q), (lo, hi, bodies) in expected().items():
            assert (st.min_offset(t, q), st.max_offset(t, q)) == (lo, hi)
            for i, want in enumerate(bodies):
                if (t, q, i) == ("T9", 3, m.queue_offset):
                    with pytest.raises(localmq.CorruptMessageError):
                        st.get_message(t, q, i, 1)
                else:
                    assert st.get_message(t, q, i, 1).messages[0].body == want


def test_a_failed_open_gives_the_snapshot_back(tmp_path):
    root = tmp_path / "s"
    fill(root)
    with open(snapshot(root), "rb") as f:
        before = f.read()
    middle = root / "commitlog" / sorted(os.listdir(root / "commitlog"))[1]
    os.rename(middle, tmp_path / "aside")
    with pytest.raises(localmq.DamagedLogError):
        localmq.open(root, **KW)
    with open(snapshot(root), "rb") as f:
        assert f.read() == before


def test_min_offsets_after_retention_are_those_a_full_check_finds(tmp_path):
    root = tmp_path / "s"
    kw = dict(RETENTION, file_reserved_time=0)
    fill(root, **kw)
    with localmq.open(root, **KW, **kw) as st:
        for name in sorted(os.listdir(root / "commitlog"))[:-1]:
            old = time.time() - 3 * 3600
            os.utime(root / "commitlog" / name, (old, old))
        st.clean_service.run_once()
        assert st.min_offset("T0", 0) > 0  # retention moved the queues' starts
        time.sleep(2 * FRESH_NS / 1e9)
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched > 0 and st.recovery.cq_rebuilt == {}
        vouched = {(t, q): (st.min_offset(t, q), st.max_offset(t, q)) for t in TOPICS for q in range(QUEUES)}
    os.unlink(snapshot(root))
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == 0
        checked = {(t, q): (st.min_offset(t, q), st.max_offset(t, q)) for t in TOPICS for q in range(QUEUES)}
    assert vouched == checked


def _rows(data):
    """(topic, queue id, position of its row, positions of its file rows) of every queue row of a snapshot's bytes,
    walked by the layout (the format's one definition), not by the module under test."""
    at = QUEUE_SNAPSHOT_HEADER.size
    meta = QUEUE_SNAPSHOT_META.unpack_from(data, at)
    at += QUEUE_SNAPSHOT_META.size + CHECKPOINT.size + meta[6] * QUEUE_SNAPSHOT_FILE_ROW.size
    for _ in range(meta[7]):
        name_len, _, _, n_queues = QUEUE_SNAPSHOT_TOPIC_ROW.unpack_from(data, at)
        name = bytes(data[at + QUEUE_SNAPSHOT_TOPIC_ROW.size : at + QUEUE_SNAPSHOT_TOPIC_ROW.size + name_len]).decode()
        at += QUEUE_SNAPSHOT_TOPIC_ROW.size + name_len
        for _ in range(n_queues):
            q, *_, n_files = QUEUE_SNAPSHOT_QUEUE_ROW.unpack_from(data, at)
            files = [at + QUEUE_SNAPSHOT_QUEUE_ROW.size + i * QUEUE_SNAPSHOT_FILE_ROW.size for i in range(n_files)]
            yield name, q, at, files
            at += QUEUE_SNAPSHOT_QUEUE_ROW.size + n_files * QUEUE_SNAPSHOT_FILE_ROW.size
    assert at == len(data)


def _write_forged(root, data):
    """The changed snapshot with its CRC and length made right again: a lie only the files can tell."""
    magic, version, _, _ = QUEUE_SNAPSHOT_HEADER.unpack_from(data, 0)
    body = bytes(data[QUEUE_SNAPSHOT_HEADER.size :])
    QUEUE_SNAPSHOT_HEADER.pack_into(data, 0, magic, version, zlib.crc32(body), len(body))
    snapshot(root).write_bytes(bytes(data))


def _forge_queue_file_ctime(root, topic, qid, base):
    """Write the queue file's present ctime into the snapshot: bit rot, a change its ctime does not show."""
    data = bytearray(snapshot(root).read_bytes())
    forged = False
    for name, q, _, files in _rows(data):
        for at in files:
            b, _, ino = QUEUE_SNAPSHOT_FILE_ROW.unpack_from(data, at)
            if (name, q, b) == (topic, qid, base):
                path = root / "consumequeue" / topic / str(qid) / f"{base:020d}"
                QUEUE_SNAPSHOT_FILE_ROW.pack_into(data, at, b, os.stat(path).st_ctime_ns, ino)
                forged = True
    assert forged
    _write_forged(root, data)


def _only_t3_2_checked(root, caplog):
    """The forged row of T3-2 refused, every other queue vouched for; every message read back; a put takes the next
    offset (it writes over no unit)."""
    with localmq.open(root, **KW) as st:
        # at the open; each row is checked on its first use (the open's own use when the row puts its last record's
        # end before the log's start)
        assert st.recovery.cq_vouched >= len(TOPICS) * QUEUES - 1
        # the put first: the put path never takes a queue offset from a row before its check
        assert st.put("T3", b"next", queue_id=2).queue_offset == PER_QUEUE
        assert st.wait_for_dispatch(10)
        want = expected()
        want[("T3", 2)] = (0, PER_QUEUE + 1, want[("T3", 2)][2] + [b"next"])
        assert every_queue(st) == want
    assert "consume queue T3-2: its units are not where the queue snapshot says" in caplog.text


@pytest.mark.parametrize(
    "field, change",
    [
        (3, -1),  # the max offset one unit short: the last message hidden, and a put would write over its unit
        (3, -5),  # short by a whole file's tail: the last unit the row names lies in the file before
        (4, 5),  # a min offset past units retention never expired: five messages hidden
        (5, 1),  # the last record's end one byte off
        (5, -(10**6)),
    ],
)
def test_a_forged_row_the_units_disagree_with_is_refused_and_costs_nothing(tmp_path, caplog, field, change):
    # a snapshot with a right CRC that lies about one queue (a forgery, or a bug of the close that wrote it): the
    # units at the queue's ends tell, that queue is checked as if there were no snapshot, the others still vouched
    root = tmp_path / "s"
    fill(root)
    data = bytearray(snapshot(root).read_bytes())
    for name, q, at, _ in _rows(data):
        if (name, q) == ("T3", 2):
            row = list(QUEUE_SNAPSHOT_QUEUE_ROW.unpack_from(data, at))
            row[field] += change
            QUEUE_SNAPSHOT_QUEUE_ROW.pack_into(data, at, *row)
    _write_forged(root, data)
    _only_t3_2_checked(root, caplog)


@pytest.mark.parametrize("left_out", ["first", "last"])
def test_a_forged_row_that_leaves_out_a_file_is_refused_and_costs_nothing(tmp_path, caplog, left_out):
    # the row names the queue's files; one that names all but the first (its min offset moved to the second file's
    # start) or all but the last (its max offset and last record's end moved to the first file's end) agrees with
    # every unit it names: the file it leaves out tells
    root = tmp_path / "s"
    fill(root)
    data = bytearray(snapshot(root).read_bytes())
    for name, q, at, files in _rows(data):
        if (name, q) != ("T3", 2):
            continue
        row = list(QUEUE_SNAPSHOT_QUEUE_ROW.unpack_from(data, at))
        assert row[6] == 2 and len(files) == 2
        first_units = CQ_FILE // CQ_UNIT_SIZE
        if left_out == "first":
            row[4] = first_units
            drop = files[0]
        else:
            unit = cq_file(root, "T3", 2, first_units - 1, CQ_FILE)
            with open(unit[0], "rb") as f:
                f.seek(unit[1])
                phys, size = int.from_bytes(f.read(8), "big"), int.from_bytes(f.read(4), "big")
            row[3], row[5] = first_units, phys + size
            drop = files[1]
        row[6] = 1
        QUEUE_SNAPSHOT_QUEUE_ROW.pack_into(data, at, *row)
        del data[drop : drop + QUEUE_SNAPSHOT_FILE_ROW.size]
        break
    _write_forged(root, data)
    _only_t3_2_checked(root, caplog)


def test_a_damaged_unit_its_ctime_does_not_show_gives_a_typed_error_never_another_message(tmp_path):
    # what the snapshot cannot see: the get path checks each record against its unit
    root = tmp_path / "s"
    fill(root)
    _point_unit_at_another_record(*cq_file(root, "T4", 1, 5, CQ_FILE))
    _forge_queue_file_ctime(root, "T4", 1, 0)
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES  # the snapshot believed it
        with pytest.raises(localmq.CorruptMessageError):
            st.get_message("T4", 1, 5, 1)
        for i in [0, 4, 6, 9, 24]:
            assert st.get_message("T4", 1, i, 1).messages[0].body == body("T4", 1, i)


def _run(*cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError as e:
        pytest.fail(f"{cmd[0]} is needed for an ext4 of whole-second timestamps (e2fsprogs, util-linux): {e}")
    assert r.returncode == 0, f"{' '.join(map(str, cmd))}: {r.stderr.strip()}"
    return r.stdout.strip()


@pytest.fixture
def whole_seconds(tmp_path):
    """A directory on ext4 with 128-byte inodes, whose timestamps are whole seconds (as ext3's or HFS+'s), through a
    loop device (root)."""
    image, mnt = tmp_path / "ext4.img", tmp_path / "mnt"
    with open(image, "wb") as f:
        f.truncate(48 << 20)
    _run("mkfs.ext4", "-q", "-F", "-I", "128", str(image))
    mnt.mkdir()
    dev = _run("losetup", "-f", "--show", str(image))
    try:
        _run("mount", "-t", "ext4", dev, str(mnt))
        try:
            yield mnt
        finally:
            _run("umount", str(mnt))
    finally:
        _run("losetup", "-d", dev)


def test_on_whole_second_timestamps_a_queue_changed_in_the_second_of_the_close_is_checked(whole_seconds):
    root = whole_seconds / "s"
    fill(root)
    path, pos = cq_file(root, "T4", 1, 5, CQ_FILE)
    patch(path, pos, bytes(CQ_UNIT_SIZE))  # at once: most likely the same second as the queue's last write
    assert os.stat(path).st_ctime_ns % 10**9 == 0
    with localmq.open(root, **KW) as st:
        # written within three seconds before the close: nothing is vouched for on this file system
        assert st.recovery.cq_vouched == 0
        assert "T4-1" in st.recovery.cq_rebuilt or "T4-1" in st.recovery.cq_damaged
        assert every_queue(st) == expected()
        time.sleep(4.5)  # files older than three granules (whole seconds): the next close vouches for them
    with localmq.open(root, **KW) as st:
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES


@pytest.mark.parametrize("where", ["queues.snapshot", "queues.snapshot.tmp"])
@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_an_entry_that_is_not_a_regular_file_is_left_alone_and_the_store_opens(tmp_path, where, kind):
    root = tmp_path / "s"
    fill(root)
    os.unlink(snapshot(root))
    entry = root / "config" / where
    if kind == "directory":
        entry.mkdir()
    else:
        os.mkfifo(entry)  # a plain open for reading would wait for a writer forever
    for _ in range(2):  # the open, then the close (which cannot write its snapshot there), twice
        with localmq.open(root, **KW) as st:
            assert st.recovery.cq_vouched == 0
            assert every_queue(st) == expected()
        assert entry.is_dir() if kind == "directory" else stat.S_ISFIFO(os.lstat(entry).st_mode)


@pytest.mark.parametrize("where", ["queues.snapshot", "queues.snapshot.tmp"])
def test_a_symlink_there_is_refused_as_every_link_in_a_store(tmp_path, where):
    root = tmp_path / "s"
    fill(root)
    os.unlink(snapshot(root))
    (root / "config" / where).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(localmq.UnsafePathError):
        localmq.open(root, **KW)
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("planted", ["before the close", "after the first use"])
def test_a_link_where_a_vouched_queue_grows_is_never_written_through(tmp_path, caplog, planted):
    # a link at the name of a queue's next file, planted while the store ran (inside the directory's stamp, so the
    # close vouches for the queue), or after the queue's first use in the next session: the store refuses it (at
    # the queue's first use: UnsafePathError; where the dispatcher would make the file: dispatch blocked, logged,
    # puts refused), never writes through it
    root = tmp_path / "s"
    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    link = root / "consumequeue" / "t" / "0" / f"{CQ_FILE:020d}"  # the queue's second file
    with localmq.open(root, **KW) as st:
        for i in range(3):
            assert st.put("t", b"m%d" % i, queue_id=0).ok
        assert st.wait_for_dispatch(10)
        if planted == "before the close":
            os.symlink(victim, link)
        time.sleep(3 * FRESH_NS / 1e9)
    refused = []
    try:
        with localmq.open(root, **KW) as st:
            assert ("t", 0) in st._cq_table.rows  # vouched for by the close's snapshot
            try:
                assert len(queue_messages(st, "t", 0)) == 3
                if planted == "after the first use":
                    os.symlink(victim, link)
                for i in range(25):  # into the second file
                    st.put("t", b"n%d" % i, queue_id=0)
                assert not st.wait_for_dispatch(2)
                assert f"{link} is a symlink, which localmq never writes through" in caplog.text
                assert not st.put("t", b"refused", queue_id=0).ok
            except localmq.UnsafePathError as e:
                refused.append(e)
    finally:
        assert victim.read_bytes() == b"" and os.path.islink(link)
    if planted == "before the close":
        assert len(refused) == 1 and refused[0].path == str(link)
    else:
        assert not refused


def test_an_entry_the_open_skipped_in_a_topic_directory_is_reported_at_every_open(tmp_path):
    # the snapshot does not vouch for the names of a topic directory holding an entry that is not a queue id: the
    # next open lists that directory and reports the entry again, while the topic's queues are still vouched for
    root = tmp_path / "s"
    fill(root)
    odd = root / "consumequeue" / "T2" / "not-a-queue"
    odd.mkdir()
    for _ in range(2):
        with localmq.open(root, **KW) as st:
            assert st.stats()["skipped_directories"] == [str(odd)]
            assert every_queue(st) == expected()
        time.sleep(2 * FRESH_NS / 1e9)
    with localmq.open(root, **KW) as st:
        assert st.stats()["skipped_directories"] == [str(odd)]
        assert st.recovery.cq_vouched == len(TOPICS) * QUEUES


@pytest.mark.parametrize("name", ["²", "٣", "3x", "65536"])
def test_a_queue_directory_whose_name_is_not_an_ascii_queue_id_is_skipped(tmp_path, name):
    # "²" passes str.isdigit but not int() (every open raised a bare ValueError); "٣" passes both and was taken for
    # queue 3 (whose directory is "3"): only ASCII digits name a queue (layout.is_decimal)
    root = tmp_path / "s"
    fill(root)
    odd = root / "consumequeue" / "T1" / name
    odd.mkdir()
    (odd / f"{0:020d}").write_bytes(bytes(CQ_FILE))
    with localmq.open(root, **KW) as st:
        assert st.stats()["skipped_directories"] == [str(odd)]
        assert every_queue(st) == expected()
    assert (odd / f"{0:020d}").read_bytes() == bytes(CQ_FILE)  # not localmq's: left as it was


def test_no_queue_is_made_from_its_row_once_the_store_is_closed(tmp_path):
    """A reader that passed its open check before the close must not make (and map) a queue after it."""
    root = tmp_path / "s"
    fill(root)
    st = localmq.open(root, **KW)
    table = st._cq_table
    assert ("T1", 1) in table.rows
    st.close()
    with pytest.raises(localmq.StoreClosedError):
        table.get(("T1", 1))
    assert ("T1", 1) not in table.built
    with pytest.raises(localmq.StoreClosedError):
        st.get_message("T1", 1, 0, 1)


def test_a_retention_pass_for_the_log_start_the_rows_are_right_for_makes_no_queue(tmp_path):
    """After retention moved the log's start and a clean close, the next open's first retention pass (the same start)
    leaves the unused queues as rows; a pass for a later start makes and trims them."""
    root = tmp_path / "s"
    kw = dict(RETENTION, file_reserved_time=1)  # hours: the segments the test ages by 3 hours go
    fill(root, **kw)
    old = time.time() - 3 * 3600

    def age(names):
        for name in names:
            os.utime(root / "commitlog" / name, (old, old))

    with localmq.open(root, **KW, **kw) as st:
        age(sorted(os.listdir(root / "commitlog"))[:1])  # the first segment goes: later ones are left for below
        st.clean_service.run_once()
        assert st.min_offset("T0", 0) > 0
        time.sleep(2 * FRESH_NS / 1e9)
    with localmq.open(root, **KW, **kw) as st:
        n = st.recovery.cq_vouched
        assert n == len(TOPICS) * QUEUES
        built = st.stats()["consume_queues_built"]
        st.clean_service.run_once()
        assert st.stats()["consume_queues_built"] == built  # nothing to do for this start: no queue made
        age(sorted(os.listdir(root / "commitlog"))[:-1])
        st.clean_service.run_once()  # the start moves: every queue is made and trimmed
        assert st.stats()["consume_queues_built"] == n
        got = {(t, q): st.min_offset(t, q) for t in TOPICS for q in range(QUEUES)}
    os.unlink(snapshot(root))
    with localmq.open(root, **KW) as st:  # every queue checked: the same min offsets
        assert got == {(t, q): st.min_offset(t, q) for t in TOPICS for q in range(QUEUES)}


def _packed_topics(topics):
    """Topic rows as a close writes them (layout's struct formats): [(name, ctime, ino, [(qid, dctime, dino, max,
    min, max_phys, [(base, ctime, ino)])])]."""
    out = b""
    for name, ctime, ino, queues in topics:
        out += QUEUE_SNAPSHOT_TOPIC_ROW.pack(len(name.encode()), ctime, ino, len(queues)) + name.encode()
        for qid, dctime, dino, mx, mn, mp, files in queues:
            out += QUEUE_SNAPSHOT_QUEUE_ROW.pack(qid, dctime, dino, mx, mn, mp, len(files))
            out += b"".join(QUEUE_SNAPSHOT_FILE_ROW.pack(*f) for f in files)
    return out


def test_the_compiled_parse_reads_the_rows_the_layout_formats_write_and_refuses_any_other_shape():
    """The rows in one compiled pass (localmq._snapshot): every field as struct packed it, the vouched rows of valid
    ids apart from the rest; a cut anywhere, a trailing byte or a topic or queue listed twice is a ValueError (the
    open then uses no snapshot)."""
    import gc

    from localmq._snapshot import parse_topic_rows

    big = (1 << 62) + 12345  # ctimes and inodes past 32 bits
    topics = [
        ("tópico", big, 7, [(0, big + 1, 8, 5, 1, 9_000_000, [(0, big + 2, 9)]), (3, -1, 10, 0, 0, 0, [])]),
        (
            "T2",
            11,
            12,
            [(65535, 13, 14, 600_000, 0, 77, [(0, 15, 16), (6_000_000, 17, 18)]), (65536, 19, 20, 1, 0, 2, [])],
        ),
        ("T3", -1, 21, []),
    ]
    data = b"prefix" + _packed_topics(topics)
    parsed = parse_topic_rows(data, 6, len(topics))
    assert list(parsed) == ["tópico", "T2", "T3"]
    for name, ctime, ino, queues in topics:
        t = parsed[name]
        assert (t.dir_ctime, t.dir_ino) == (ctime, ino)
        vouched = [q for q in queues if q[1] != -1 and q[0] <= 65535]
        assert t.qids == tuple(q[0] for q in vouched) and t.keys == tuple((name, q[0]) for q in vouched)
        assert t.others == tuple(q[0] for q in queues if q not in vouched)
        for (qid, dctime, dino, mx, mn, mp, files), r in zip(vouched, t.rows):
            assert r is t.row(qid)
            assert (r.dir_ctime, r.dir_ino, r.max_offset, r.min_offset, r.max_physic_offset) == (
                dctime,
                dino,
                mx,
                mn,
                mp,
            )
            assert r.files == tuple(files) and r.n_files == len(files)
            assert r.file_rows == b"".join(QUEUE_SNAPSHOT_FILE_ROW.pack(*f) for f in files)
    assert parsed["tópico"].others == (3,) and parsed["tópico"].row(3) is None  # 3: not vouched for
    assert parsed["T2"].others == (65536,)  # past MAX_QUEUE_ID
    assert [r.max_offset for r in parsed["T2"].rows] == [600_000]
    # none of it is tracked by the cyclic GC (the collector's first look at 100,000 queues cost more than the parse)
    assert not any(gc.is_tracked(x) for t in parsed.values() for x in (t, t.keys, t.rows, t.qids, t.others, *t.keys))
    whole = _packed_topics(topics)
    for cut in range(len(whole)):
        with pytest.raises(ValueError):
            parse_topic_rows(whole[:cut], 0, len(topics))
    with pytest.raises(ValueError, match="trailing"):
        parse_topic_rows(whole + b"\0", 0, len(topics))
    with pytest.raises(ValueError, match="listed twice"):
        parse_topic_rows(_packed_topics([topics[2], topics[2]]), 0, 2)
    with pytest.raises(ValueError, match="listed twice"):
        parse_topic_rows(_packed_topics([("T", 1, 2, [topics[1][3][0], topics[1][3][0]])]), 0, 1)
    with pytest.raises(ValueError):  # not UTF-8
        parse_topic_rows(QUEUE_SNAPSHOT_TOPIC_ROW.pack(1, 1, 1, 0) + b"\xff", 0, 1)


def test_dir_stamps_agree_with_lstat_and_name_links_and_failures(tmp_path):
    """The compiled stamps of topic directories (what an open compares with the snapshot's topic rows) are what
    os.lstat sees; a symlink is ROW_LINK (even to a directory), a missing name -ENOENT; the store's own loader
    raises them as UnsafePathError and FileNotFoundError."""
    import errno

    from localmq._snapshot import ROW_LINK, dir_stamps
    from localmq.store.consume_queue_table import _stamps_of

    names = [f"t{i}" for i in range(700)]  # more than one chunk of _stamps_of's threads
    for n in names:
        (tmp_path / n).mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "t1")
    want = {n: (os.lstat(tmp_path / n).st_ctime_ns, os.lstat(tmp_path / n).st_ino) for n in names}
    assert _stamps_of(str(tmp_path), names) == want
    got = dir_stamps(os.fsencode(tmp_path), [b"t3", b"link", b"gone"])
    assert got == [want["t3"], ROW_LINK, -errno.ENOENT]
    with pytest.raises(localmq.UnsafePathError):
        _stamps_of(str(tmp_path), names + ["link"])
    with pytest.raises(FileNotFoundError):
        _stamps_of(str(tmp_path), ["gone"])
    with pytest.raises(TypeError):
        dir_stamps(os.fsencode(tmp_path), ["t3"])
    with pytest.raises(NotADirectoryError):
        (tmp_path / "file").write_bytes(b"")
        dir_stamps(os.fsencode(tmp_path / "file"), [b"t3"])
