"""Delayed messages: the SCHEDULE_TOPIC_XXXX rewrite, ScheduleMessageService delivery and delayOffset.json."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import localmq
from helpers import queue_messages
from localmq.config import parse_delay_levels
from localmq.errors import ConfigError, InvalidDelayError
from localmq.services.schedule import level_for_delay, read_delay_offsets
from localmq.store.config_json import read_config_json

LEVELS = "1s 2s 3s"
SMALL = {"mapped_file_size_commit_log": 1 << 20, "mapped_file_size_consume_queue": 6000}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _open(path, **kw):
    return localmq.open(path, message_delay_level=LEVELS, **SMALL, **kw)


def _now_ms():
    return int(time.time() * 1000)


def _wait_count(st, topic, queue_id, n, timeout=15.0):
    deadline = time.monotonic() + timeout
    while True:
        got = queue_messages(st, topic, queue_id)
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_delayed_message_invisible_before_its_time_and_delivered_after(tmp_path):
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=3)
        r = p.send("orders", b"late", tags="tagA", keys=["k1", "k2"], properties={"color": "red"}, delay_level=2)
        assert r.ok
        sched = queue_messages(st, "SCHEDULE_TOPIC_XXXX", 1)  # queue id = level - 1
        assert len(sched) == 1
        s = sched[0]
        assert s.topic == "SCHEDULE_TOPIC_XXXX" and s.queue_id == 1 and s.body == b"late"
        props = s.properties
        assert props["DELAY"] == "2" and props["REAL_TOPIC"] == "orders" and props["REAL_QID"] == "3"
        assert props["color"] == "red" and props["TAGS"] == "tagA" and props["KEYS"] == "k1 k2"
        assert "UNIQ_KEY" in props
        due = s.store_timestamp + 2000
        seen_at = None
        while seen_at is None:
            now = _now_ms()
            got = queue_messages(st, "orders", 3)
            if got:
                seen_at = now
                break
            assert now < due + 10_000, "not delivered within 10 s after its time"
            time.sleep(0.02)
        # never early: the first poll that saw it started at or after its deliver time
        assert seen_at >= due - 5  # 5 ms: the store's and this process's ms clocks truncate separately
        (m,) = got
        assert m.store_timestamp >= due
        assert (m.topic, m.queue_id, m.body, m.flag) == ("orders", 3, b"late", 0)
        assert m.tags == "tagA" and m.keys == ("k1", "k2")
        # RocketMQ's messageTimeup keeps the schedule record's property string: DELAY/REAL_* stay
        assert m.properties == props
        assert st.schedule_service.stats()["delivered"] == 1


def test_schedule_topic_cq_tags_code_is_deliver_time_default_levels(tmp_path):
    # the dispatcher computes the tags code from RocketMQ's default table (level 1 = 1 s, 18 = 2 h)
    with localmq.open(tmp_path, **SMALL) as st:
        p = st.create_producer(queue_id=0)
        p.send("t", b"a", delay_level=1)
        p.send("t", b"b", delay_level=99)  # clamped to the largest level (18), as RocketMQ does
        (a,) = queue_messages(st, "SCHEDULE_TOPIC_XXXX", 0)
        (b,) = queue_messages(st, "SCHEDULE_TOPIC_XXXX", 17)
        assert b.properties["DELAY"] == "18"
        assert st.consume_queue("SCHEDULE_TOPIC_XXXX", 0).unit(0)[2] == a.store_timestamp + 1000
        assert st.consume_queue("SCHEDULE_TOPIC_XXXX", 17).unit(0)[2] == b.store_timestamp + 7_200_000
        assert _wait_count(st, "t", 0, 1)[0].body == b"a"
    assert parse_delay_levels(localmq.StoreConfig().message_delay_level) == tuple(
        s * 1000 for s in (1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200)
    )


def test_schedule_topic_cq_tags_code_follows_the_stores_own_levels(tmp_path):
    # spec §3.3: tagsCode = store time + the delay of the level in the store's messageDelayLevel
    with localmq.open(tmp_path, message_delay_level="2s 1h 3d", **SMALL) as st:
        p = st.create_producer(queue_id=0)
        for level in (1, 2, 3, 7):
            p.send("t", b"%d" % level, delay_level=level)
        got = {lv: queue_messages(st, "SCHEDULE_TOPIC_XXXX", lv - 1) for lv in (1, 2, 3)}
        assert [len(v) for v in got.values()] == [1, 1, 2]  # level 7 clamped to 3
        for lv, ms in ((1, 2000), (2, 3_600_000), (3, 3 * 86_400_000)):
            cq = st.consume_queue("SCHEDULE_TOPIC_XXXX", lv - 1)
            for i, m in enumerate(got[lv]):
                assert cq.unit(i)[2] == m.store_timestamp + ms
    with localmq.open(tmp_path, message_delay_level="2s 1h 3d", **SMALL) as st:  # the units pass the open's check
        assert not st.recovery.cq_rebuilt and st.max_offset("SCHEDULE_TOPIC_XXXX", 2) == 2


def test_levels_deliver_in_due_order(tmp_path):
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=0)
        for level in (3, 2, 1):
            p.send("t", b"L%d" % level, delay_level=level)
        got = _wait_count(st, "t", 0, 3)
        assert [m.body for m in got] == [b"L1", b"L2", b"L3"]
        times = [m.store_timestamp for m in got]
        assert times == sorted(times)


def test_delay_offset_json_format_and_no_redelivery_after_reopen(tmp_path):
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=0)
        p.send("t", b"one", delay_level=1)
        p.send("t", b"two", delay_level=2)
        assert len(_wait_count(st, "t", 0, 2)) == 2
    path = tmp_path / "config" / "delayOffset.json"
    # fastjson's pretty layout, unquoted int keys on one line (RocketMQ's DelayOffsetSerializeWrapper)
    assert path.read_text() == '{\n\t"offsetTable":{1:1,2:1\n\t}\n}'
    assert read_config_json(str(path)) == {"offsetTable": {1: 1, 2: 1}}
    with _open(tmp_path) as st:
        assert st.schedule_service.offsets == {1: 1, 2: 1}
        time.sleep(1.5)  # one level-1 delay and many 100 ms passes: nothing may be delivered again
        assert [m.body for m in queue_messages(st, "t", 0)] == [b"one", b"two"]
        st.create_producer(queue_id=0).send("t", b"three", delay_level=1)
        assert [m.body for m in _wait_count(st, "t", 0, 3)] == [b"one", b"two", b"three"]
    assert read_config_json(str(path)) == {"offsetTable": {1: 2, 2: 1}}


@pytest.mark.parametrize(
    "text, want, bad",
    [
        ('{"offsetTable":{1:4,"2":7,"x":1,3:"y"}}', {1: 4, 2: 7}, [("x", 1), (3, "y")]),
        ('{"offsetTable":[1,2]}', {}, []),  # not a table: every level starts from its queue's beginning
        ("[]", {}, []),
    ],
)
def test_delay_offsets_keep_the_usable_levels_and_tell_the_others(tmp_path, text, want, bad):
    """One reader of delayOffset.json for the delivery service and for retention: entries that are not integers are
    skipped and told, an offsetTable that is not a table gives no level (the service used to raise on a list)."""
    path = tmp_path / "delayOffset.json"
    path.write_text(text)
    told = []
    assert read_delay_offsets(str(path), lambda k, v: told.append((k, v))) == want
    assert told == bad


_CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    import localmq
    st = localmq.open(sys.argv[1], message_delay_level="1s 2s 3s", mapped_file_size_commit_log=1 << 20,
                      mapped_file_size_consume_queue=6000, flush_delay_offset_interval=200)
    p = st.create_producer(queue_id=0)
    for i in range(60):
        p.send("t", b"m%d" % i, delay_level=1 + i % 3)
    st.flush()
    print("sent", flush=True)
    time.sleep(60)
""")


def test_sigkill_with_pending_delayed_messages_loses_none_and_repeats_none(tmp_path):
    store = tmp_path / "s"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(store), ROOT], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "sent"
        time.sleep(1.6)  # level 1 delivered (mostly), levels 2 and 3 pending
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    with _open(store) as st:
        got = _wait_count(st, "t", 0, 60, timeout=20)
        bodies = [m.body for m in got]
        assert sorted(bodies) == sorted(b"m%d" % i for i in range(60))  # none lost, none twice
        # the schedule queues hold each message once; every level's offset reached its end
        assert st.schedule_service.offsets == {1: 20, 2: 20, 3: 20}
        for m in got:
            assert int(m.properties["DELAY"]) == 1 + int(m.body[1:]) % 3


_CHILD_STEPS = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    import localmq
    k, groups, shared = int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    # the store's clock (due times and the write interval) is this list's value: ahead of every store time, so
    # that no record looks stored in the future, and 30 s before any record of level 1 (60 s) is due
    fake = [int(time.time() * 1000) + 30_000]
    st = localmq.open(sys.argv[1], message_delay_level="60s", clock=lambda: fake[0], shared=shared,
                      mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=6000)
    p = st.create_producer(queue_id=0)
    last = []
    for g in range(groups):
        while last and time.time() * 1000 < last[-1] + 150:  # groups stored >= 150 ms apart
            time.sleep(0.01)
        for i in range(k):
            r = p.send("t", b"g%d-%d" % (g, i), delay_level=1)
        last.append(r.store_timestamp)
    print("sent", flush=True)
    svc = st.schedule_service
    for g in range(groups):
        fake[0] = last[g] + 60_000   # group g due; group g + 1, stored >= 150 ms later, not yet
        svc.wakeup()
        print("step", g, flush=True)
        while svc.stats()["delivered"] < (g + 1) * k:
            time.sleep(0.002)
    print("done", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("shared", [False, True], ids=["local", "shared"])
@pytest.mark.parametrize("kill_step,pause", [(7, 0.0), (9, 0.004)])
def test_sigkill_redelivers_nothing_re_put_after_the_last_offset_write(tmp_path, shared, kill_step, pause):
    """After a SIGKILL a reopen does not deliver again what was re-put after the last write of delayOffset.json: it
    finds those re-puts in the real queue (ScheduleMessageService._delivered_before).

    The store's clock only takes the values the child gives it: group g (K messages) becomes due when the clock
    moves to group g's last store time + 60 s, at least 150 ms (> flush_delay_offset_interval, 100 ms by default)
    after the previous value, and only once group g - 1 is all delivered. ScheduleMessageService writes the
    offsets before any re-put made >= 100 ms of that clock after its previous write, so the re-puts not yet
    written (up to one group, wherever the kill lands: in a pass, a write or a sleep) are what a reopen must not
    repeat; with RocketMQ's 10 s and no look-up every group delivered so far came again.
    """
    k, groups = 20, 12
    store = tmp_path / "s"
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD_STEPS, str(store), ROOT, str(k), str(groups), "1" if shared else "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "sent"
        for g in range(kill_step + 1):
            assert child.stdout.readline().strip() == f"step {g}"
        time.sleep(pause)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    written = read_config_json(str(store / "config" / "delayOffset.json"), default={}).get("offsetTable", {})
    with localmq.open(
        store, message_delay_level="60s", clock=lambda: _now_ms() + 120_000, shared=shared, **SMALL
    ) as st:
        deadline = time.monotonic() + 20
        while st.schedule_service.offsets.get(1, 0) < groups * k and time.monotonic() < deadline:
            time.sleep(0.02)
        bodies = [m.body for m in queue_messages(st, "t", 0)]
        avoided = st.schedule_service.stats()["redeliveries_avoided"]
    # none lost, none twice: the re-puts the written offset did not cover (``avoided`` of them; how many depends on
    # where the kill landed) were found, not repeated
    assert sorted(bodies) == sorted(b"g%d-%d" % (g, i) for g in range(groups) for i in range(k)), (avoided, written)


def test_delay_seconds_maps_to_the_smallest_level_not_shorter(tmp_path):
    levels = parse_delay_levels(LEVELS)
    assert levels == (1000, 2000, 3000)
    assert [level_for_delay(levels, s) for s in (0, 0.2, 1, 1.001, 2, 2.5, 3)] == [1, 1, 1, 2, 2, 3, 3]
    with pytest.raises(InvalidDelayError):
        level_for_delay(levels, 3.01)
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=1)
        p.send("t", b"x", delay=1.5)
        (s,) = queue_messages(st, "SCHEDULE_TOPIC_XXXX", 1)
        assert s.properties["DELAY"] == "2" and s.properties["REAL_QID"] == "1"
        m = p.create_message("t", b"y", tags="tg", properties={"k": "v"})
        p.send(m, delay=0.5)
        (s2,) = queue_messages(st, "SCHEDULE_TOPIC_XXXX", 0)
        assert s2.properties["REAL_TOPIC"] == "t" and s2.tags == "tg" and s2.properties["k"] == "v"
        with pytest.raises(InvalidDelayError):
            p.send("t", b"x", delay=4)


@pytest.mark.parametrize(
    "kw",
    [
        {"delay_level": 0},
        {"delay_level": -1},
        {"delay_level": "2"},
        {"delay_level": True},
        {"delay_level": 1.0},
        {"delay": -1},
        {"delay": float("nan")},
        {"delay": "1"},
        {"delay_level": 1, "delay": 1},
    ],
)
def test_bad_delays_raise_typed_errors(tmp_path, kw):
    with _open(tmp_path) as st:
        p = st.create_producer()
        with pytest.raises(InvalidDelayError):
            p.send("t", b"x", **kw)
        assert st.topics() == {}


@pytest.mark.parametrize("text", ["", "1s  2s", "1x", "s", "0s", "1.5s", "-1s", "1s "])
def test_bad_message_delay_level_is_a_config_error(tmp_path, text):
    with pytest.raises(ConfigError):
        localmq.open(tmp_path, message_delay_level=text)


def test_shared_store_delivers_delayed_messages_from_its_housekeeper(tmp_path):
    with localmq.open(tmp_path, shared=True, **SMALL) as st:
        assert st.housekeeper and st.schedule_service is not None
        p = st.create_producer()
        t0 = time.time()
        r = p.send("t", b"x", delay_level=1)
        assert r.ok
        deadline = time.monotonic() + 10
        while st.max_offset("t", 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        m = st.get_message("t", 0, 0).messages[0]
        assert m.body == b"x" and m.store_timestamp >= r.store_timestamp + 1000
        assert time.time() - t0 >= 1.0


def test_delay_property_delays_a_send_and_refuses_a_batch(tmp_path):
    with _open(tmp_path) as st:
        p = st.create_producer(queue_id=0)
        r = p.send("t", b"x", properties={"DELAY": "1"})
        assert r.ok
        st.wait_for_dispatch(5)
        assert st.max_offset("t", 0) == 0 and st.max_offset("SCHEDULE_TOPIC_XXXX", 0) == 1
        r = p.send(localmq.Message("t", b"y", properties={"DELAY": "2"}))
        st.wait_for_dispatch(5)
        assert st.max_offset("SCHEDULE_TOPIC_XXXX", 1) == 1
        p.send("t", b"now", properties={"DELAY": "0"})  # level 0: not delayed (RocketMQ's rule)
        with pytest.raises(InvalidDelayError):
            p.send("t", b"z", properties={"DELAY": "soon"})
        with pytest.raises(InvalidDelayError):
            p.send_batch("t", [b"a", b"b"], properties={"DELAY": "1"})
        with pytest.raises(InvalidDelayError):
            p.send_batch([localmq.Message("t", b"a"), localmq.Message("t", b"b", properties={"DELAY": "3"})])
        got = _wait_count(st, "t", 0, 3)
        assert [m.body for m in got] == [b"now", b"x", b"y"]
