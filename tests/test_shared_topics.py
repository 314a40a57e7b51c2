"""A shared store's topic table (issue 27): more topics than the fixed table of control file version 3 held (1,024),
added by several processes at once, every message found again, and the control file's disk growing with the topics.

Two child processes and this one share the store; each child puts one message to each of its own 1,600 topics
(3,200 in all, queue ids 0..3) while the other does the same, so rows are added from two processes at the same
time. Expectations from outside the code: every (topic, queue) has exactly the one message its child put there, with
its body; the topics survive a close and an exclusive reopen; the control file holds blocks for its fixed sections
and about one row (1,280 bytes) per topic, not for its whole capacity (layout.CTL_TOPIC_COUNT rows).
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest

import localmq
from helpers import mounted_tmpfs
from localmq import layout

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KW = dict(mapped_file_size_commit_log=1 << 20, mapped_file_size_consume_queue=20 * 64)
PER_CHILD = 1600

CHILD = textwrap.dedent("""
    import sys
    import localmq
    root, k, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    st = localmq.open(root, shared=True, mapped_file_size_commit_log=1 << 20,
                      mapped_file_size_consume_queue=20 * 64)
    for i in range(n):
        r = st.put("c%d-t%d" % (k, i), b"child %d topic %d" % (k, i), queue_id=i % 4)
        assert r.status.name == "PUT_OK" and r.queue_offset == 0, (i, r)
    st.close()
    print("done", n, flush=True)
""")


def _body(k, i):
    return b"child %d topic %d" % (k, i)


@pytest.mark.timeout(600)
def test_more_topics_than_the_old_fixed_table_added_by_two_processes_at_once(tmp_path):
    root = str(tmp_path / "store")
    st = localmq.open(root, shared=True, **KW)  # keeps the control file attached while the children run
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])}
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", CHILD, root, str(k), str(PER_CHILD)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for k in range(2)
        ]
        for p in procs:
            out, err = p.communicate(timeout=400)
            assert p.returncode == 0, err[-3000:]
            assert out.split() == ["done", str(PER_CHILD)]
        assert st.wait_for_dispatch(120)
        total = 2 * PER_CHILD
        assert total > 1024
        for k in range(2):
            for i in range(PER_CHILD):
                topic, q = "c%d-t%d" % (k, i), i % 4
                assert st.max_offset(topic, q) == 1, topic
                msgs = st.get_message(topic, q, 0, 4).messages
                assert [bytes(m.body) for m in msgs] == [_body(k, i)], topic
        # a new topic from this process after the children's
        assert st.put("parent", b"p").queue_offset == 0
        ctl = os.path.join(root, layout.CTL_FILE)
        used = os.stat(ctl).st_blocks * 512
        # the fixed sections, one row per topic (rows span pages: allow a page per 3 rows more) and no more
        rows = total + 1
        assert used <= layout.CTL_ROWS_OFF + rows * layout.CTL_TOPIC_ROW + rows // 3 * 4096, used
        assert used < layout.CTL_FILE_SIZE // 4, used
    finally:
        st.close()
    with localmq.open(root, **KW) as st2:
        assert st2.wait_for_dispatch(60)
        for k in range(2):
            for i in range(0, PER_CHILD, 97):
                topic, q = "c%d-t%d" % (k, i), i % 4
                assert [bytes(m.body) for m in st2.get_message(topic, q, 0, 4).messages] == [_body(k, i)]


def test_topic_rows_are_found_again_and_refuse_a_name_too_long(tmp_path):
    from localmq import _shm

    cf = _shm.ControlFile(str(tmp_path / "mpctl"))
    try:
        rows = [cf.topic_row("t%d" % i, create=True) for i in range(3000)]
        assert len(set(rows)) == 3000
        assert all(layout.CTL_ROWS_OFF <= r < layout.CTL_FILE_SIZE for r in rows)
        assert [cf.topic_row("t%d" % i) for i in range(3000)] == rows
        assert cf.topic_row("t7", create=True) == rows[7]  # found, not added again
        assert cf.topic_row("absent") == -1
        with pytest.raises(localmq.InvalidTopicError):
            cf.topic_row("x" * (layout.CTL_T_NAME_MAX + 1), create=True)
        assert cf.load(layout.CTL_S_TOPIC_ROWS) == 3000
    finally:
        cf.close()


def test_a_full_disk_refuses_a_new_topic_with_a_typed_error_and_takes_it_once_there_is_room(tmp_path):
    """A new topic's row in the control file gets its blocks before it is written: on a full disk (a real 8 MiB
    tmpfs) a put to a new topic raises StoreIOError naming the control file and ENOSPC (or, when the row fits in
    blocks already reserved, is refused with CREATE_MAPPED_FILE_FAILED while the dispatcher cannot reserve the new
    queue's file), never SIGBUS; once the disk has room again, puts are taken again, to old and new topics."""
    with mounted_tmpfs(tmp_path, "8m") as mnt:
        st = localmq.open(mnt / "s", shared=True, **KW)
        try:
            assert st.put("old", b"before").status.name == "PUT_OK"
            with open(mnt / "ballast", "wb", buffering=0) as f:
                with pytest.raises(OSError):
                    while True:
                        f.write(bytes(4096))
            refused = []
            for i in range(8):  # rows share pages: the first ones may fit in blocks already reserved
                try:
                    r = st.put("new%d" % i, b"x")
                except localmq.StoreIOError as e:
                    # the row's blocks could not be reserved
                    assert "mpctl" in str(e) and e.errno == 28, e
                    refused.append(e)
                else:
                    # or the row fitted, and the store refuses puts while its dispatcher cannot reserve the new
                    # queue's file (the full disk every process sees)
                    if r.status.name != "PUT_OK":
                        assert r.status.name == "CREATE_MAPPED_FILE_FAILED", r
                        refused.append(r)
            assert refused, "nothing was refused on a full disk"
            os.unlink(mnt / "ballast")
            deadline = time.monotonic() + 30  # the dispatcher retries every 100 ms, then puts are taken again
            while st.put("old", b"after").status.name != "PUT_OK":
                assert time.monotonic() < deadline, "puts were not taken again once the disk had room"
                time.sleep(0.1)
            assert st.put("new-after", b"y").queue_offset == 0
            assert st.wait_for_dispatch(30)
            assert [bytes(m.body) for m in st.get_message("old", 0, 0, 4).messages][:2] == [b"before", b"after"]
        finally:
            st.close()


class _Row:
    def __init__(self, max_offset):
        self.max_offset = max_offset


def test_publish_reserves_the_rows_it_adds_at_once_and_a_full_disk_names_none(tmp_path):
    """A first opener's publication (ControlFile.publish_queues) writes each queue's unit count and next offset (the
    larger of its row's count and the put path's offset) into rows it adds, reserving their blocks in one call first:
    on a disk with room for some of them (a real tmpfs) it raises StoreIOError with ENOSPC and names no row (a row
    at a time would have named the first ones); once there is room it
    publishes them all, and the file holds blocks for about one row (1,280 bytes) a topic."""
    from localmq import _shm

    n = 2000
    rows = {("t%d" % i, q): _Row(i + q) for i in range(n) for q in range(4)}
    nxt = {("t%d" % i, 1): i + 100 for i in range(0, n, 2)}  # a put path's offset past the row's count
    with mounted_tmpfs(tmp_path, "8m") as mnt:
        cf = _shm.ControlFile(str(mnt / "mpctl"))
        try:
            before = os.stat(mnt / "mpctl").st_blocks * 512
            with open(mnt / "ballast", "wb", buffering=0) as f:
                with pytest.raises(OSError):
                    while True:
                        f.write(bytes(4096))
            os.truncate(mnt / "ballast", os.path.getsize(mnt / "ballast") - (64 << 10))  # room for about 50 rows
            free = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
            assert 32 * layout.CTL_TOPIC_ROW < free < n * layout.CTL_TOPIC_ROW
            with pytest.raises(localmq.StoreIOError) as e:
                cf.publish_queues(rows, nxt)
            assert e.value.errno == 28 and "mpctl" in str(e.value)
            assert cf.load(layout.CTL_S_TOPIC_ROWS) == 0 and cf.topic_row("t0") == -1
            os.unlink(mnt / "ballast")
            cf.publish_queues(rows, nxt)
            assert cf.load(layout.CTL_S_TOPIC_ROWS) == n
            for i in range(n):
                off = cf.topic_row("t%d" % i)
                assert off >= layout.CTL_ROWS_OFF
                for q in range(4):
                    want_next = i + 100 if (q == 1 and i % 2 == 0) else i + q
                    assert cf.load(off + layout.CTL_T_DISPATCHED + 8 * q) == i + q
                    assert cf.load(off + layout.CTL_T_NEXT + 8 * q) == want_next
            grown = os.stat(mnt / "mpctl").st_blocks * 512 - before
            assert n * layout.CTL_TOPIC_ROW <= grown <= n * layout.CTL_TOPIC_ROW + (1 << 20)
        finally:
            cf.close()
