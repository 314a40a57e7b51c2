"""Retention through the store: small segments, a fake clock and a simulated disk usage.

Layout used by most tests (from the record format in the spec, not from the code): a message on topic "t"
with a 308-byte body and no properties is a 400-byte record (84 fixed bytes + 4 + 308 + 1 + 1 + 2). A 4096-byte
segment takes 10 of them (the 11th would leave less than the 8-byte END_OF_FILE blank), so message i is in
segment i // 10 at physical offset (i // 10) * 4096 + (i % 10) * 400. The 200-byte ConsumeQueue files hold 10
units, so CQ file k indexes exactly the messages of segment k.
"""

import gc
import logging
import os
import re
import subprocess
import sys
import threading
import time

import pytest

import localmq
from helpers import wait_until
from localmq import GetStatus, PutStatus, write_config_json

SEG = 4096
CQ_FILE = 200
RECORD = 400
PER_SEG = 10
BODY_LEN = RECORD - (84 + 4 + 1 + 1 + 2)
HOUR = 3_600_000
TOPIC = "t"


def local_ms(hour, minute=30, day=10):
    """ms since the epoch of 2024-01-<day> <hour>:<minute> local time (delete_when uses the local hour)."""
    return int(time.mktime((2024, 1, day, hour, minute, 0, 0, 0, -1)) * 1000)


class FakeClock:
    def __init__(self, ms):
        self.ms = ms

    def __call__(self):
        return self.ms


class FakeDisk:
    """disk_usage(path) -> the ratio set by the test; records the paths asked about."""

    def __init__(self, ratio=0.30):
        self.ratio = ratio
        self.paths = set()

    def __call__(self, path):
        self.paths.add(path)
        return self.ratio


def body(i):
    return (b"%06d" % i) * (BODY_LEN // 6) + b"#" * (BODY_LEN % 6)


def phys(i):
    return (i // PER_SEG) * SEG + (i % PER_SEG) * RECORD


@pytest.fixture
def make_store(tmp_path):
    opened = []

    def make(clock, disk, path=None, **config):
        cfg = dict(
            mapped_file_size_commit_log=SEG,
            mapped_file_size_consume_queue=CQ_FILE,
            clean_resource_interval=3_600_000,  # the thread stays idle: tests call run_once
            delete_commit_log_files_interval=0,
            delete_consume_queue_files_interval=0,
            # segments created ahead of need would show in the directory listings these tests compare
            preallocate_mapped_file=False,
        )
        cfg.update(config)
        st = localmq.open(path or tmp_path / "s", clock=clock, disk_usage=disk, **cfg)
        opened.append(st)
        return st

    yield make
    for st in opened:
        st.close()


def fill(st, n, start=0):
    for i in range(start, start + n):
        r = st.put(TOPIC, body(i))
        assert r.status is PutStatus.PUT_OK
        assert r.physical_offset == phys(i) and r.queue_offset == i
    assert st.wait_for_dispatch(10)
    # the index thread reads the records too: a segment it is still reading is not destroyed by this pass (its
    # deletion waits for the reader), which under load made the exact lists these tests compare flaky
    assert st.wait_for_index(20)
    st.flush()


def set_ages(root, clock, ages_h):
    """Give segment k an mtime ages_h[k] hours before the fake clock (missing entries: the last age)."""
    names = sorted(os.listdir(root / "commitlog"))
    for k, name in enumerate(names):
        age = ages_h[min(k, len(ages_h) - 1)]
        t = (clock.ms - age * HOUR) / 1000
        os.utime(root / "commitlog" / name, (t, t))


def segments(root):
    return [int(n) for n in sorted(os.listdir(root / "commitlog"))]


def cq_files(root, topic=TOPIC, q=0):
    return [int(n) for n in sorted(os.listdir(root / "consumequeue" / topic / str(q)))]


def run(st):
    return st.clean_service.run_once()


# -- when segments go ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("delete_when,hour", [("04", 4), ("04;05", 5), ("23;04", 4)])
def test_expired_segments_go_at_the_delete_hour_only(make_store, tmp_path, delete_when, hour):
    clock, disk = FakeClock(local_ms(10)), FakeDisk()
    st = make_store(clock, disk, delete_when=delete_when)
    fill(st, 65)  # segments 0..6, the last holding messages 60..64
    root = tmp_path / "s"
    assert segments(root) == [k * SEG for k in range(7)]
    set_ages(root, clock, [100])
    assert run(st) == ([], [])
    clock.ms = local_ms(3)
    set_ages(root, clock, [100])
    assert run(st) == ([], [])
    clock.ms = local_ms(hour)
    set_ages(root, clock, [100])
    deleted, cq_deleted = run(st)
    assert len(deleted) == 6 and len(cq_deleted) == 6
    assert segments(root) == [6 * SEG]  # the last (current) segment stays
    assert cq_files(root) == [6 * CQ_FILE]
    assert st.commit_log_min_offset == 6 * SEG
    assert st.min_offset(TOPIC, 0) == 60 and st.max_offset(TOPIC, 0) == 65
    ret = st.stats()["retention"]
    assert ret["deleted_commit_log_files"] == 6 and ret["deleted_consume_queue_files"] == 6
    assert ret["deleted_segments"] == [k * SEG for k in range(6)]
    assert disk.paths == {str(root / "commitlog"), str(root / "consumequeue")}


def test_young_segments_stay_and_nothing_is_deleted_after_a_young_one(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    st = make_store(clock, disk, file_reserved_time=48)
    fill(st, 65)
    root = tmp_path / "s"
    # segments 0, 1 are 49 h old, 2 is 47 h old, 3.. are old again: only 0 and 1 go
    set_ages(root, clock, [49, 49, 47, 100])
    deleted, _ = run(st)
    assert [int(os.path.basename(p)) for p in deleted] == [0, SEG]
    assert segments(root) == [k * SEG for k in range(2, 7)]
    assert st.min_offset(TOPIC, 0) == 20


def test_disk_ratio_lifts_the_hour_but_not_the_age(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(10)), FakeDisk(0.80)
    st = make_store(clock, disk)
    fill(st, 65)
    root = tmp_path / "s"
    set_ages(root, clock, [100, 100, 1])  # 0 and 1 expired, 2.. young
    deleted, _ = run(st)  # 80 % > 75 %: expired segments go at 10:30
    assert len(deleted) == 2 and segments(root)[0] == 2 * SEG
    assert run(st) == ([], [])  # young segments stay below the force-clean ratio
    assert st.stats()["retention"]["clean_immediately"] is False


def test_disk_ratio_threshold_is_the_configured_one(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(10)), FakeDisk(0.80)
    st = make_store(clock, disk, disk_max_used_space_ratio=85)
    fill(st, 65)
    set_ages(tmp_path / "s", clock, [100])
    assert run(st) == ([], [])
    disk.ratio = 0.851
    assert len(run(st)[0]) == 6


def test_force_clean_deletes_young_segments(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(10)), FakeDisk(0.86)
    st = make_store(clock, disk)
    fill(st, 65)
    set_ages(tmp_path / "s", clock, [0])
    deleted, _ = run(st)
    assert len(deleted) == 6 and segments(tmp_path / "s") == [6 * SEG]
    assert st.stats()["retention"]["clean_immediately"] is True


def test_force_clean_needs_clean_file_forcibly_enable(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(10)), FakeDisk(0.86)
    st = make_store(clock, disk, clean_file_forcibly_enable=False)
    fill(st, 65)
    set_ages(tmp_path / "s", clock, [0])
    assert run(st) == ([], [])


def test_at_most_ten_segments_per_pass_and_never_the_last(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    st = make_store(clock, disk)
    fill(st, 245)  # segments 0..24
    root = tmp_path / "s"
    assert len(segments(root)) == 25
    set_ages(root, clock, [100])
    assert [len(run(st)[0]) for _ in range(4)] == [10, 10, 4, 0]
    assert segments(root) == [24 * SEG]
    disk.ratio = 0.95  # even at once, the last segment stays
    assert run(st)[0] == []
    assert segments(root) == [24 * SEG]
    r = st.get_message(TOPIC, 0, 240)
    assert r.status is GetStatus.FOUND and [m.body for m in r.messages] == [body(i) for i in range(240, 245)]


def test_single_segment_is_never_deleted(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk(0.95)
    st = make_store(clock, disk)
    fill(st, 5)
    set_ages(tmp_path / "s", clock, [100])
    assert run(st) == ([], [])
    assert segments(tmp_path / "s") == [0]


# -- disk full --------------------------------------------------------------------------------------------------


def test_disk_full_refuses_puts_until_usage_drops(make_store, tmp_path, caplog):
    clock, disk = FakeClock(local_ms(10)), FakeDisk(0.91)
    st = make_store(clock, disk, disk_full_refuse_ratio=90)  # RocketMQ's level, opted into
    fill(st, 15)
    with caplog.at_level(logging.INFO, logger="localmq.clean"):
        run(st)
        run(st)
    assert st.stats()["retention"]["disk_full"] is True
    before = st.commit_log_max_offset
    r = st.put(TOPIC, b"x")
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert st.put_batch(TOPIC, [b"a", b"b"]).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert st.commit_log_max_offset == before  # nothing written
    assert sum("marked full" in rec.getMessage() for rec in caplog.records) == 1  # once per transition
    disk.ratio = 0.88  # below the warning level: accepted again (still cleaning at once)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="localmq.clean"):
        run(st)
        run(st)
    assert sum("no longer full" in rec.getMessage() for rec in caplog.records) == 1
    assert st.stats()["retention"]["disk_full"] is False
    r = st.put(TOPIC, body(15))
    assert r.status is PutStatus.PUT_OK and r.queue_offset == 15
    assert st.stats()["put_failures"] >= 2


def test_disk_usage_callable_failing_with_oserror_is_reported(make_store, tmp_path):
    clock = FakeClock(local_ms(4))

    def broken(path):
        raise PermissionError(13, "denied", path)

    st = make_store(clock, broken)
    fill(st, 25)
    set_ages(tmp_path / "s", clock, [100])
    # unknown usage: as RocketMQ, expired segments go (here it is the delete hour anyway)
    assert len(run(st)[0]) == 2
    assert "denied" in st.stats()["retention"]["disk_usage_error"]


# -- consumers ----------------------------------------------------------------------------------------------


def write_offsets(root, table):
    write_config_json(root / "config" / "consumerOffset.json", {"offsetTable": table})


def test_unconsumed_segments_are_kept_and_reported_per_group(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    st = make_store(clock, disk)
    fill(st, 65)
    root = tmp_path / "s"
    write_offsets(
        root,
        {
            "t@behind35": {0: 35},  # next message 35: in segment 3
            "t@behind45": {0: 45},  # next message 45: in segment 4
            "t@done": {0: 65},  # consumed everything
            "gone@g": {0: 0},  # a topic the store does not have
        },
    )
    set_ages(root, clock, [100])
    deleted, _ = run(st)
    assert [int(os.path.basename(p)) for p in deleted] == [0, SEG, 2 * SEG]
    assert segments(root) == [k * SEG for k in range(3, 7)]
    kept = st.stats()["retention"]["kept_for_consumers"]
    assert set(kept) == {"t@behind35", "t@behind45"}
    assert kept["t@behind35"] == {
        "segments": [3 * SEG, 4 * SEG, 5 * SEG],
        "queue_id": 0,
        "queue_offset": 35,
        "physical_offset": phys(35),
    }
    assert kept["t@behind45"]["segments"] == [4 * SEG, 5 * SEG]
    assert kept["t@behind45"]["physical_offset"] == phys(45)
    # the message 'behind35' has not consumed is still readable
    r = st.get_message(TOPIC, 0, 35, 1)
    assert r.status is GetStatus.FOUND and r.messages[0].body == body(35)
    # 'behind35' commits further: the segment only it held goes at the next pass
    write_offsets(root, {"t@behind35": {0: 65}, "t@behind45": {0: 45}})
    deleted, _ = run(st)
    assert [int(os.path.basename(p)) for p in deleted] == [3 * SEG]
    assert set(st.stats()["retention"]["kept_for_consumers"]) == {"t@behind45"}


def test_unconsumed_in_several_queues_the_lowest_bounds(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    st = make_store(clock, disk)
    # queue 0 gets messages 0..39 (segments 0..3); queue 1 gets 40..64 (segments 4..6)
    for i in range(65):
        r = st.put(TOPIC, body(i), queue_id=0 if i < 40 else 1)
        assert r.physical_offset == phys(i)
    assert st.wait_for_dispatch(10)
    st.flush()
    root = tmp_path / "s"
    write_offsets(root, {"t@g": {0: 40, 1: 3}})  # queue 0 done; queue 1 next is message 43 (segment 4)
    set_ages(root, clock, [100])
    deleted, _ = run(st)
    assert len(deleted) == 4
    kept = st.stats()["retention"]["kept_for_consumers"]["t@g"]
    assert kept["queue_id"] == 1 and kept["queue_offset"] == 3 and kept["physical_offset"] == phys(43)
    assert kept["segments"] == [4 * SEG, 5 * SEG]


def test_clean_unconsumed_true_deletes_them(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk, clean_unconsumed=True)
    fill(st, 65)
    write_offsets(root, {"t@behind35": {0: 35}})
    set_ages(root, clock, [100])
    assert len(run(st)[0]) == 6
    ret = st.stats()["retention"]
    assert ret["kept_for_consumers"] == {}
    assert ret["deleted_unconsumed"] == {"t@behind35": 3}  # segments 3, 4, 5 held unconsumed messages


def test_force_clean_ratio_overrides_consumer_protection(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk(0.80)
    root = tmp_path / "s"
    st = make_store(clock, disk)
    fill(st, 65)
    write_offsets(root, {"t@lazy": {0: 0}})
    set_ages(root, clock, [100])
    assert run(st) == ([], [])
    assert st.stats()["retention"]["kept_for_consumers"]["t@lazy"]["segments"] == [k * SEG for k in range(6)]
    disk.ratio = 0.86
    assert len(run(st)[0]) == 6
    ret = st.stats()["retention"]
    assert ret["deleted_unconsumed"] == {"t@lazy": 6}
    r = st.get_message(TOPIC, 0, 0)
    assert r.status is GetStatus.OFFSET_TOO_SMALL and r.next_begin_offset == 60


def test_corrupt_consumer_offsets_fall_back_to_the_backup(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk)
    fill(st, 65)
    write_offsets(root, {"t@g": {0: 20}})
    write_offsets(root, {"t@g": {0: 30}})  # the first document is now the .bak
    (root / "config" / "consumerOffset.json").write_text('{"offsetTable":{"t@g":{0:')
    set_ages(root, clock, [100])
    deleted, _ = run(st)
    assert len(deleted) == 2  # bounded by message 20 from the backup
    assert st.stats()["retention"]["consumer_offsets_error"] is None


def test_unusable_consumer_offsets_protect_nothing_and_are_reported(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk)
    fill(st, 65)
    (root / "config").mkdir(exist_ok=True)  # it holds localmq.json already
    (root / "config" / "consumerOffset.json").write_text("not json")
    (root / "config" / "consumerOffset.json.bak").write_text("{")
    set_ages(root, clock, [100])
    assert len(run(st)[0]) == 6
    assert "consumerOffset.json" in st.stats()["retention"]["consumer_offsets_error"]


@pytest.mark.parametrize("where", ["new_queue", "retry_topic"])
def test_queues_a_group_has_no_offset_for_are_kept_from_their_start(make_store, tmp_path, where):
    # a committed group reads a queue it has no offset for from its start (from_offset="earliest"): a queue of its
    # topic created after its last commit, and its retry topic %RETRY%<group> (a nacked message lands there first)
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk)
    fill(st, 30)  # queue 0: segments 0..2
    topic, qid = (TOPIC, 1) if where == "new_queue" else ("%RETRY%g", 0)
    for i in range(10):  # segment 3: 10 records of 400 (queue 1) or 407 bytes (the longer topic)
        r = st.put(topic, body(i), queue_id=qid)
        assert r.status is PutStatus.PUT_OK and r.physical_offset // SEG == 3
    for i in range(30, 60):  # queue 0 again: segments 4..6
        assert st.put(TOPIC, body(i)).status is PutStatus.PUT_OK
    assert st.wait_for_dispatch(10) and st.wait_for_index(20)
    st.flush()
    write_offsets(root, {"t@g": {0: 60}})  # queue 0 consumed to its end
    set_ages(root, clock, [100])
    deleted, _ = run(st)
    assert [int(os.path.basename(p)) for p in deleted] == [0, SEG, 2 * SEG]
    key = "t@g" if where == "new_queue" else "%RETRY%g@g"
    kept = st.stats()["retention"]["kept_for_consumers"]
    assert kept == {
        key: {"segments": [3 * SEG, 4 * SEG, 5 * SEG], "queue_id": qid, "queue_offset": 0, "physical_offset": 3 * SEG}
    }
    # the group commits that queue: the segment goes
    write_offsets(root, {"t@g": {0: 60, 1: 10}} if where == "new_queue" else {"t@g": {0: 60}, key: {0: 10}})
    deleted, _ = run(st)
    assert [int(os.path.basename(p)) for p in deleted] == [3 * SEG, 4 * SEG, 5 * SEG]  # never the last
    assert st.stats()["retention"]["kept_for_consumers"] == {}


@pytest.mark.parametrize("clean_unconsumed", [False, True])
def test_delayed_messages_not_yet_delivered_are_kept(make_store, tmp_path, clean_unconsumed):
    # a delayed message (or a retry waiting for its delay) is in SCHEDULE_TOPIC_XXXX queue <level - 1> until the
    # schedule service re-puts it; delayOffset.json holds each level's next unit (spec: ScheduleMessageService)
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk, clean_unconsumed=clean_unconsumed)
    fill(st, 30)  # segments 0..2
    # delay level 2 (5 s): not due on the fake clock (2024), so the service leaves it where it is
    r = st.create_producer(queue_id=0).send(TOPIC, b"later", delay_level=2)
    assert r.ok and r.physical_offset == 3 * SEG
    for i in range(30, 60):
        assert st.put(TOPIC, body(i)).status is PutStatus.PUT_OK
    assert st.wait_for_dispatch(10) and st.wait_for_index(20)
    st.flush()
    write_offsets(root, {"t@g": {0: 60}})
    set_ages(root, clock, [100])
    deleted, _ = run(st)
    ret = st.stats()["retention"]
    if clean_unconsumed:
        assert len(deleted) == 6  # every segment but the last
        assert ret["deleted_unconsumed"] == {"SCHEDULE_TOPIC_XXXX": 3}  # 3, 4, 5 were kept for it
        return
    assert [int(os.path.basename(p)) for p in deleted] == [0, SEG, 2 * SEG]
    assert ret["kept_for_consumers"] == {
        "SCHEDULE_TOPIC_XXXX": {
            "segments": [3 * SEG, 4 * SEG, 5 * SEG],
            "queue_id": 1,
            "queue_offset": 0,
            "physical_offset": 3 * SEG,
        }
    }
    # an unusable delayOffset.json keeps it too (and is reported); level 1's offset says nothing of level 2's
    (root / "config" / "delayOffset.json").write_text("{")
    assert run(st) == ([], [])
    assert "delayOffset.json" in st.stats()["retention"]["delay_offsets_error"]
    write_config_json(root / "config" / "delayOffset.json", {"offsetTable": {1: 7}})
    assert run(st) == ([], [])
    assert st.stats()["retention"]["delay_offsets_error"] is None
    # delivered: the service's offset of level 2 moved past it
    write_config_json(root / "config" / "delayOffset.json", {"offsetTable": {1: 7, 2: 1}})
    deleted, _ = run(st)
    assert [int(os.path.basename(p)) for p in deleted] == [3 * SEG, 4 * SEG, 5 * SEG]


# -- readers ----------------------------------------------------------------------------------------------------


def test_segment_held_by_a_zero_copy_read_is_deleted_once_released(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk)
    fill(st, 65)
    set_ages(root, clock, [100])
    g = st.get_message(TOPIC, 0, 0, 4, zero_copy=True)
    views = [m.body for m in g.messages]
    assert all(isinstance(v, memoryview) for v in views)
    deleted, _ = run(st)
    assert deleted == []  # deferred, and nothing after it is deleted while it is on disk
    assert segments(root) == [k * SEG for k in range(7)]
    assert st.stats()["retention"]["hanged_files"] == 1
    assert [bytes(v) for v in views] == [body(i) for i in range(4)]  # still mapped
    assert st.commit_log_min_offset == SEG  # no longer served
    r = st.get_message(TOPIC, 0, 0)
    assert r.status is GetStatus.OFFSET_TOO_SMALL and r.next_begin_offset == 10
    del g, views
    gc.collect()
    assert segments(root)[0] == SEG  # the last release unlinked it
    deleted, _ = run(st)
    assert sorted(int(os.path.basename(p)) for p in deleted) == [k * SEG for k in range(6)]
    ret = st.stats()["retention"]
    assert ret["hanged_files"] == 0 and ret["deleted_commit_log_files"] == 6


def test_held_segment_is_destroyed_forcibly_after_the_interval(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk, destroy_mapped_file_interval_forcibly=60_000, redelete_hanged_file_interval=1000)
    fill(st, 65)
    set_ages(root, clock, [100])
    first = st.commit_log.mapped_file_queue.files[0]
    assert first.hold()
    assert run(st)[0] == []
    clock.ms += 30_000
    assert run(st)[0] == []
    assert os.path.exists(first.path) and not first.closed
    clock.ms += 30_001  # the forcible interval since the first destroy has passed
    deleted, _ = run(st)
    assert not os.path.exists(first.path) and first.closed
    assert len(deleted) == 6  # the forced one, then the pass goes on
    first.release()


# -- after cleaning -------------------------------------------------------------------------------------------


def test_reads_after_cleaning_and_reopen(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk)
    fill(st, 65)
    set_ages(root, clock, [100, 100, 100, 1])
    run(st)
    assert segments(root) == [k * SEG for k in range(3, 7)]
    assert cq_files(root) == [k * CQ_FILE for k in range(3, 7)]
    for off in (0, 29):
        r = st.get_message(TOPIC, 0, off)
        assert r.status is GetStatus.OFFSET_TOO_SMALL
        assert r.next_begin_offset == r.min_offset == 30
    assert st.min_offset(TOPIC, 0) == 30
    r = st.get_message(TOPIC, 0, 30, 32)
    assert r.status is GetStatus.FOUND and r.messages[0].body == body(30)
    assert st.look_message_by_offset(phys(29)) is None
    assert st.offset_by_time(TOPIC, 0, 0) == 30
    st.close()
    st = make_store(clock, disk)
    assert st.recovery.mode == "normal" and st.recovery.missing_head == []  # retention recorded the new start
    assert st.commit_log_min_offset == 3 * SEG and st.min_offset(TOPIC, 0) == 30
    got = []
    off = 30
    while off < 65:
        r = st.get_message(TOPIC, 0, off, 32)
        assert r.status is GetStatus.FOUND
        got += [m.body for m in r.messages]
        off = r.next_begin_offset
    assert got == [body(i) for i in range(30, 65)]
    assert st.get_message(TOPIC, 0, 5).status is GetStatus.OFFSET_TOO_SMALL
    r = st.put(TOPIC, body(65))
    assert r.queue_offset == 65 and r.physical_offset == phys(65)
    st.close()
    # the first segment left now was not deleted by retention: reported, and only that one
    os.unlink(root / "commitlog" / ("%020d" % (3 * SEG)))
    st = make_store(clock, disk)
    assert st.recovery.missing_head == ["%020d" % (3 * SEG)]
    assert st.commit_log_min_offset == 4 * SEG and st.min_offset(TOPIC, 0) == 40
    st.close()
    st = make_store(clock, disk)
    assert st.recovery.missing_head == []  # reported once: the record moved to the log's new start
    st.close()


def _fill_alternating(st, n):
    """Message i on topic "a" (even i) or "b" (odd i), queue 0: 400-byte records, 10 a segment, at phys(i)."""
    for i in range(n):
        r = st.put("ab"[i % 2], body(i))
        assert r.status is PutStatus.PUT_OK and r.physical_offset == phys(i) and r.queue_offset == i // 2
    assert st.wait_for_dispatch(10) and st.wait_for_index(20)
    st.flush()


@pytest.mark.parametrize("abort", [False, True])
def test_reopen_after_consume_queue_retention_rebuilds_nothing(make_store, tmp_path, abort):
    # topics a and b alternate: a's unit j is message 2j, b's message 2j+1, so their 10-unit ConsumeQueue files
    # span two segments each. 110 messages: segments 0..10; retention leaves segment 10 (the last). The files 4
    # (units 40..49, segments 8-9) of both queues point below the log's min only. a's file 5 starts at the log's
    # min (message 100); b's starts past it (message 101), so b keeps file 4: a queue's first file then starts at
    # or below the log's min, which recovery tells apart from a lost file without reading the log
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk)
    _fill_alternating(st, 110)
    set_ages(root, clock, [100])
    run(st)
    assert segments(root) == [10 * SEG]
    assert cq_files(root, "a") == [5 * CQ_FILE]
    assert cq_files(root, "b") == [4 * CQ_FILE, 5 * CQ_FILE]
    st.close()
    if abort:
        (root / "abort").write_bytes(b"")
    st = make_store(clock, disk)
    assert st.recovery.mode == ("abnormal" if abort else "normal")
    assert st.recovery.cq_rebuilt == {}
    for t, first in (("a", 100), ("b", 101)):
        assert st.min_offset(t, 0) == 50 and st.max_offset(t, 0) == 55
        r = st.get_message(t, 0, 50, 32)
        assert [m.body for m in r.messages] == [body(i) for i in range(first, 110, 2)]
    st.close()


def test_files_a_foreign_retention_deleted_are_told_from_lost_ones_by_the_log(make_store, tmp_path):
    # RocketMQ (and localmq before the kept file above) deletes a queue file as soon as its units point below the
    # log's min: the first file left may start past it. Recovery then walks the log from its min to that unit:
    # no record of the queue below the file's first unit there, so nothing was lost and nothing is rebuilt.
    # (A record there proves a lost file: test_store_damage.py's test_deleted_consume_queue_file_is_rebuilt.)
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk)
    _fill_alternating(st, 110)
    set_ages(root, clock, [100])
    run(st)
    st.close()
    os.unlink(root / "consumequeue" / "b" / "0" / ("%020d" % (4 * CQ_FILE)))
    for _ in range(2):  # the walk decides the same way at every open
        st = make_store(clock, disk)
        assert st.recovery.cq_rebuilt == {}
        assert st.min_offset("b", 0) == 50
        assert [m.body for m in st.get_message("b", 0, 50, 32).messages] == [body(i) for i in range(101, 110, 2)]
        st.close()


def test_abnormal_recovery_with_the_first_segments_gone(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    st = make_store(clock, disk)
    fill(st, 65)
    set_ages(root, clock, [100])
    run(st)
    st.close()
    (root / "abort").write_bytes(b"")  # as if the process had died
    st = make_store(clock, disk)
    assert st.recovery.mode == "abnormal" and st.recovery.dropped_at is None
    assert st.min_offset(TOPIC, 0) == 60 and st.max_offset(TOPIC, 0) == 65
    r = st.get_message(TOPIC, 0, 60, 32)
    assert [m.body for m in r.messages] == [body(i) for i in range(60, 65)]


def test_undispatched_segments_are_never_deleted(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk(0.86)
    root = tmp_path / "s"
    st = make_store(clock, disk)
    fill(st, 45)  # dispatched up to message 44, in segment 4
    st._reput_service.shutdown()  # white-box: stop the dispatcher so that later puts stay undispatched
    for i in range(45, 85):
        assert st.put(TOPIC, body(i)).physical_offset == phys(i)
    set_ages(root, clock, [100])
    deleted, _ = run(st)
    assert [int(os.path.basename(p)) for p in deleted] == [k * SEG for k in range(4)]
    assert st.stats()["retention"]["kept_for_dispatch"] == [4 * SEG, 5 * SEG, 6 * SEG, 7 * SEG]


# -- the thread -------------------------------------------------------------------------------------------------


def clean_threads():
    return [t for t in threading.enumerate() if t.name == "localmq-CleanService"]


def test_the_service_thread_deletes_and_close_leaves_no_thread(make_store, tmp_path):
    clock, disk = FakeClock(local_ms(4)), FakeDisk()
    root = tmp_path / "s"
    before = set(clean_threads())  # a store another test left open (its failure is reported there) is not ours
    st = make_store(clock, disk, clean_resource_interval=10, delete_commit_log_files_interval=1)
    ours = [t for t in clean_threads() if t not in before]
    assert st.clean_service.alive and len(ours) == 1
    fill(st, 65)
    set_ages(root, clock, [100])
    assert wait_until(timeout=30.0, pred=lambda: segments(root) == [6 * SEG] and st.min_offset(TOPIC, 0) == 60)
    assert wait_until(timeout=30.0, pred=lambda: cq_files(root) == [6 * CQ_FILE])
    st.close()
    assert not st.clean_service.alive and not ours[0].is_alive()
    assert st.stats()["service_errors"]["CleanService"] == 0


def test_service_errors_are_counted_and_the_loop_goes_on(make_store, tmp_path, caplog):
    calls = []

    def flaky(path):
        calls.append(path)
        raise RuntimeError("boom")

    clock = FakeClock(local_ms(10))
    with caplog.at_level(logging.ERROR, logger="localmq.clean"):
        st = make_store(clock, flaky, clean_resource_interval=5)
        assert wait_until(timeout=30.0, pred=lambda: st.stats()["service_errors"]["CleanService"] >= 3)
        assert st.clean_service.alive
        st.close()
    assert any("CleanService" in rec.getMessage() for rec in caplog.records)
    assert isinstance(st.clean_service.last_error, RuntimeError)


# -- settings and helpers -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["", "24", "4;x", "-1", "04,05"])
def test_bad_delete_when_is_a_config_error(tmp_path, bad):
    with pytest.raises(localmq.ConfigError, match="delete_when"):
        localmq.open(tmp_path / "s", delete_when=bad)


def test_default_disk_usage_is_used_over_used_plus_available_rounded_up(tmp_path):
    import shutil

    from localmq.services.clean import disk_used_ratio

    # shutil.disk_usage: used = total - f_bfree, free = f_bavail; the ratio is RocketMQ's, rounded up to 1 %
    du = shutil.disk_usage(tmp_path)
    expected = -(-du.used * 100 // (du.used + du.free)) / 100
    assert disk_used_ratio(str(tmp_path)) == pytest.approx(expected, abs=0.011)  # the disk may move meanwhile


def test_delete_hour_uses_the_local_hour_of_the_clock():
    from localmq.services.clean import is_delete_hour

    assert is_delete_hour("04", local_ms(4, 0)) and is_delete_hour("04", local_ms(4, 59))
    assert not is_delete_hour("04", local_ms(5, 0)) and not is_delete_hour("04", local_ms(3, 59))
    assert is_delete_hour("1;4;22", local_ms(22)) and not is_delete_hour("1;4;22", local_ms(2))


def test_readers_and_writer_run_while_retention_deletes(make_store, tmp_path):
    """Producer, copying and zero-copy readers and back-to-back clean passes at once, all concurrent: every
    message read is intact, statuses are the documented ones, and the log keeps its shape."""
    clock, disk = FakeClock(local_ms(10)), FakeDisk(0.86)
    st = make_store(clock, disk)
    total = 1000
    done = threading.Event()
    failures = []
    read_counts = []

    def produce():
        try:
            for i in range(total):
                assert st.put(TOPIC, body(i), queue_id=i % 2).status is PutStatus.PUT_OK
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)
        finally:
            done.set()

    def read(zero_copy):
        offsets, n, kept = [0, 0], 0, None
        move = {
            GetStatus.FOUND,
            GetStatus.OFFSET_TOO_SMALL,
            GetStatus.OFFSET_FOUND_NULL,
            GetStatus.MESSAGE_WAS_REMOVING,
        }
        wait = {GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE}
        try:
            while not done.is_set():
                for q in (0, 1):
                    g = st.get_message(TOPIC, q, offsets[q], 8, zero_copy=zero_copy)
                    assert g.status in move or g.status in wait, g
                    for m in g.messages:
                        i = int(bytes(m.body[:6]))
                        assert bytes(m.body) == body(i) and i % 2 == q
                    n += len(g.messages)
                    if g.status in move:
                        assert g.next_begin_offset > offsets[q], g
                        offsets[q] = g.next_begin_offset
                    if zero_copy and n % 5 == 0:
                        kept = g  # keep some views alive across clean passes
            read_counts.append(n)
            del kept
        except BaseException as e:  # noqa: BLE001
            failures.append(e)

    threads = [threading.Thread(target=produce)] + [threading.Thread(target=read, args=(z,)) for z in (False, True)]
    for t in threads:
        t.start()
    passes = 0
    while not done.is_set():
        clock.ms += 1000
        run(st)
        passes += 1
    for t in threads:
        t.join(60)
    assert not failures, failures
    assert len(read_counts) == 2
    gc.collect()
    for _ in range(3):
        run(st)
    root = tmp_path / "s"
    names = segments(root)
    assert names == [names[0] + k * SEG for k in range(len(names))]  # contiguous, no gap
    assert st.commit_log_min_offset == names[0]
    assert st.wait_for_dispatch(10)
    for q in (0, 1):
        mn, mx = st.min_offset(TOPIC, q), st.max_offset(TOPIC, q)
        assert mx == total // 2
        g = st.get_message(TOPIC, q, mn, 32)
        assert g.status is GetStatus.FOUND and g.messages[0].physical_offset >= names[0]


def test_a_nearly_full_disk_does_not_refuse_puts_by_default(make_store, tmp_path):
    """Issue 14: on a laptop disk over 90 % full every put answered SERVICE_NOT_AVAILABLE, even for a tiny store.
    By default only a reservation that fails refuses a put (test_store_footprint.py, a real full tmpfs)."""
    clock, disk = FakeClock(local_ms(10)), FakeDisk(0.97)
    st = make_store(clock, disk)
    fill(st, 3)
    run(st)
    run(st)
    assert st.stats()["retention"]["disk_full"] is False
    assert st.put(TOPIC, body(3)).status is PutStatus.PUT_OK


def test_readers_never_touch_a_segment_being_unmapped(tmp_path):
    """Copying, zero-copy and by-offset readers of the oldest segment while retention deletes segments back to back,
    with a GIL switch every 10 µs and collections running finalizers at any allocation: a reader must pin the segment
    for as long as it touches the mapping. Reads of a segment being unmapped crashed (SIGSEGV in get_message's
    fault_in / parse_record) or failed (StoreClosedError building a zero-copy body), so the run is a subprocess."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "retention_stress.py")
    p = subprocess.run(
        [sys.executable, "-X", "faulthandler", script, str(tmp_path), "6"], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, (p.returncode, p.stderr[-6000:])
    read, deleted = map(int, re.fullmatch(r"read (\d+) messages, deleted (\d+) segments\n", p.stdout).groups())
    assert read > 0 and deleted > 0
