"""Producer errors a Python programmer expects (issue 14): a send that is not stored raises SendError saying how
many messages were stored (or hands it to ``on_delivery``); ``send_batch(messages)`` makes one batched put per run."""

import os
import textwrap

import pytest

import localmq
from helpers import run_on_tmpfs
from localmq import PutStatus, SendError


class Disk:
    """disk_usage(path) -> the ratio a test sets (retention marks the store full above 90 %)."""

    def __init__(self, ratio):
        self.ratio = ratio

    def __call__(self, path):
        return self.ratio


def test_send_on_a_full_disk_raises_and_the_callback_gets_it_instead(tmp_path):
    disk = Disk(0.99)
    with localmq.open(
        tmp_path / "s",
        mapped_file_size_commit_log=64 * 1024,
        clean_resource_interval=3_600_000,
        preallocate_mapped_file=False,
        disk_usage=disk,
        disk_full_refuse_ratio=90,
    ) as st:
        p = st.create_producer()
        assert p.send("t", b"before").ok
        st.clean_service.run_once()  # retention sees the full disk and refuses puts
        with pytest.raises(SendError) as e:
            p.send("t", b"refused")
        assert e.value.status is PutStatus.SERVICE_NOT_AVAILABLE and e.value.stored == 0
        assert "0 of 1" in str(e.value) and isinstance(e.value, OSError)
        with pytest.raises(SendError) as e:
            p.send_batch("t", [b"a", b"b", b"c"])
        assert e.value.stored == 0 and "0 of 3" in str(e.value)
        seen = []
        q = st.create_producer(on_delivery=lambda r, err: seen.append((r.status, err)))
        r = q.send("t", b"fire and forget")
        assert r.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert seen[0][0] is PutStatus.SERVICE_NOT_AVAILABLE and isinstance(seen[0][1], SendError)
        disk.ratio = 0.5
        st.clean_service.run_once()
        assert p.send("t", b"after").ok
        q.send("t", b"delivered")
        assert seen[-1] == (PutStatus.PUT_OK, None)
        st.wait_for_dispatch()
        bodies = [m.body for m in st.get_message("t", p.queue_id, 0, 32).messages]
        assert b"before" in bodies and b"after" in bodies and b"refused" not in bodies


def test_send_batch_of_messages_is_one_put_per_run(tmp_path):
    with localmq.open(tmp_path / "s", mapped_file_size_commit_log=1 << 20) as st:
        p = st.create_producer(queue_id=0)
        msgs = [localmq.Message("t", b"%d" % i, tags="a") for i in range(50)]
        msgs += [localmq.Message("t", b"k%d" % i, tags="b") for i in range(30)]
        results = p.send_batch(msgs)
        # two runs (tags a, then tags b): two batched puts, each with consecutive offsets and one store time
        assert [r.msg_num for r in results] == [50, 30]
        assert [r.queue_offset for r in results] == [0, 50]
        st.wait_for_dispatch()
        got = []
        while len(got) < 80:
            g = st.get_message("t", 0, len(got), 32)
            assert g.messages
            got += g.messages
        assert [m.body for m in got] == [m.body for m in msgs]
        assert len({m.store_timestamp for m in got[:50]}) == 1 and len({m.store_timestamp for m in got[50:]}) == 1
        assert [m.tags for m in got] == ["a"] * 50 + ["b"] * 30


NEARLY_FULL = textwrap.dedent(r"""
    import os, sys
    import localmq
    from localmq import SendError, PutStatus
    root = os.path.join(sys.argv[1], "s")
    st = localmq.open(root, mapped_file_size_commit_log=4 << 20, mapped_file_size_consume_queue=40000,
                      reserve_step_commit_log=64 << 10, max_hash_slot_num=1024, max_index_num=4096,
                      preallocate_mapped_file=False)
    p = st.create_producer(queue_id=0)
    p.send("t", b"first")
    vfs = os.statvfs(sys.argv[1])
    with open(os.path.join(sys.argv[1], "filler"), "wb") as f:  # about 200 KB left
        f.write(b"\1" * (vfs.f_bavail * vfs.f_frsize - 200 * 1024))
    try:
        p.send_batch("t", [b"%05d" % i + b"z" * 1000 for i in range(1000)])
        raise SystemExit("send_batch on a full disk raised nothing")
    except SendError as e:
        assert e.status is PutStatus.CREATE_MAPPED_FILE_FAILED, e.status
        assert "cannot reserve" in str(e) and "bytes of commit log segment" in str(e) and root in str(e), str(e)
        stored = e.stored
    st.wait_for_dispatch(10)
    got, off = [], 1
    while True:
        g = st.get_message("t", 0, off, 32)
        if not g.messages:
            break
        got += g.messages
        off = g.next_begin_offset
    assert 0 < stored < 1000 and len(got) == stored, (stored, len(got))
    assert [int(m.body[:5]) for m in got] == list(range(stored))
    st.close()
    print("stored", stored, "of 1000; SendError said so")
""")


def test_send_batch_on_a_nearly_full_disk_says_how_many_were_stored(tmp_path):
    """Issue 14's finding: Producer.send on a nearly full disk stored 1 of 3 messages and raised nothing. On a real
    6 MB tmpfs (private mount namespace) a batch cut short raises SendError whose ``stored`` is exactly what the
    queue holds."""
    proc = run_on_tmpfs(tmp_path, NEARLY_FULL, "6m")
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    assert "SendError said so" in proc.stdout


def test_send_sets_a_rocketmq_uniq_key_that_finds_the_message(tmp_path):
    """Issue 14's finding: localmq never set UNIQ_KEY, so looking its own messages up by unique key failed. The
    layout is RocketMQ's MessageClientIDSetter (spec 8.2): IPv4, pid low 16 bits, 4 fixed bytes, ms since the start
    of the month, a 16-bit counter."""
    import time

    with localmq.open(tmp_path / "s", mapped_file_size_commit_log=1 << 20) as st:
        p = st.create_producer(queue_id=0)
        for i in range(300):
            p.send("t", b"m%d" % i)
        p.send(localmq.Message("t", b"own", properties={"UNIQ_KEY": "A" * 32}))
        st.create_producer(queue_id=1, uniq_keys=False).send("t", b"plain")
        st.wait_for_dispatch()
        assert st.wait_for_index(10)
        msgs = st.get_message("t", 0, 0, 32).messages + st.get_message("t", 0, 32, 32).messages
        keys = [m.uniq_key for m in msgs]
        assert len(set(keys)) == len(keys) and all(len(k) == 32 and int(k, 16) >= 0 for k in keys)
        raw = bytes.fromhex(keys[0])
        assert int.from_bytes(raw[4:6], "big") == os.getpid() & 0xFFFF
        t = time.localtime()
        month_start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        assert abs(int.from_bytes(raw[10:14], "big") / 1000 - (time.time() - month_start)) < 120
        counters = [int.from_bytes(bytes.fromhex(k)[14:16], "big") for k in keys]
        assert all((b - a) % 65536 == 1 for a, b in zip(counters, counters[1:]))
        # send returns the id it gave the message (RocketMQ's SendResult.getMsgId), and it finds the message
        r = p.send("t", b"by its id")
        assert len(r.uniq_key) == 32 and st.wait_for_index(10)
        assert st.look_message_by_id(r.uniq_key, topic="t").body == b"by its id"
        assert st.create_producer(uniq_keys=False).send("t", b"no id").uniq_key is None
        for m in (msgs[0], msgs[40]):
            assert st.look_message_by_id(m.uniq_key).body == m.body
            assert [x.body for x in st.query_message("t", m.uniq_key)] == [m.body]
        assert st.look_message_by_id("A" * 32).body == b"own"
        assert st.get_message("t", 1, 0, 1).messages[0].uniq_key is None
