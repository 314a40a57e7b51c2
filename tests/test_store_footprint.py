"""Right-sized stores (issue 14): disk use grows with the data, not with the segment size, and a full disk refuses
puts with a status instead of a SIGBUS."""

import os
import textwrap

import localmq
from helpers import run_on_tmpfs
from localmq import PutStatus

MB = 1 << 20


def allocated(root):
    """Bytes of disk blocks the files under ``root`` hold (what ``du`` counts), and their apparent sizes."""
    blocks = size = 0
    for d, _, names in os.walk(root):
        for n in names:
            st = os.stat(os.path.join(d, n))
            blocks += st.st_blocks * 512
            size += st.st_size
    return blocks, size


def test_one_message_store_uses_under_10_mb_with_rocketmqs_segment_size(tmp_path):
    """Default settings (1 GiB segments, 6 MB ConsumeQueue files, the 420 MB index geometry): a store holding one
    message holds under 10 MB of blocks, open and closed, while its segment files keep RocketMQ's sizes."""
    root = tmp_path / "s"
    with localmq.open(root) as st:
        st.put("orders", b"x" * 100, keys="k1")
        st.wait_for_dispatch()
        assert st.wait_for_index(10)
        blocks, size = allocated(root)
        assert blocks < 10 * MB, (blocks, size)
        assert os.path.getsize(root / "commitlog" / ("%020d" % 0)) == 1 << 30
        assert st.query_message("orders", "k1")[0].body == b"x" * 100
    blocks, _ = allocated(root)
    assert blocks < 10 * MB
    with localmq.open(root) as st:
        assert st.get_message("orders", 0, 0, 1).messages[0].body == b"x" * 100


def test_blocks_follow_the_data_in_steps(tmp_path):
    """The segment's blocks are reserved a step (1 MiB by default) ahead of the writer; with step 0 the whole
    segment is reserved when it is created, as RocketMQ does."""
    root = tmp_path / "s"
    cfg = dict(mapped_file_size_commit_log=16 * MB, preallocate_mapped_file=False)
    with localmq.open(root, **cfg) as st:
        st.put("t", b"first")  # the first put creates the segment
        seg = root / "commitlog" / ("%020d" % 0)
        first = os.stat(seg).st_blocks * 512
        assert first <= 2 * MB
        for _ in range(3 * 1024):
            st.put("t", b"y" * 1000)
        grown = os.stat(seg).st_blocks * 512
        assert st.commit_log_max_offset <= grown <= st.commit_log_max_offset + 2 * MB
    whole = tmp_path / "whole"
    with localmq.open(whole, reserve_step_commit_log=0, **cfg) as st:
        st.put("t", b"first")
        assert os.stat(whole / "commitlog" / ("%020d" % 0)).st_blocks * 512 >= 16 * MB


def test_a_busy_queues_blocks_follow_its_units_reserved_without_leaving_the_dispatch_loop(tmp_path):
    """A ConsumeQueue file is sparse and reserved in steps (4 KiB doubling to ``reserve_step_consume_queue``) ahead of
    the dispatcher. The steps after the first are reserved in the dispatcher's loop itself (``stats()``:
    ``dispatch_nogil_reserves``): the file's blocks cover every unit written and at most two steps more, and every
    message is read back in order."""
    root = tmp_path / "s"
    n, step = 20_000, 64 << 10
    with localmq.open(root, mapped_file_size_commit_log=16 * MB, mapped_file_size_consume_queue=20 * 60_000) as st:
        for i in range(0, n, 500):
            assert st.put_batch("t", [b"%06d" % j for j in range(i, i + 500)]).ok
        assert st.wait_for_dispatch(30)
        stats = st.stats()
        cq = root / "consumequeue" / "t" / "0" / ("%020d" % 0)
        blocks = os.stat(cq).st_blocks * 512
        assert 20 * n <= blocks <= 20 * n + 2 * step, blocks
        # 400,000 bytes of units: steps of 4 KiB doubling to 64 KiB, each reaching a step past the unit that needs
        # it (about 8 reservations); the first ones come with the file, on the maker's and the slow path's turn
        assert stats["dispatch_nogil_reserves"] >= 3, stats["dispatch_nogil_reserves"]
        got, off = [], 0
        while True:
            bodies = st.get_bodies("t", 0, off, 1024)
            if not bodies:
                break
            got += bodies
            off += len(bodies)
        assert got == [b"%06d" % j for j in range(n)]


FULL_DISK = textwrap.dedent(r"""
    import os, sys
    import localmq
    from localmq import PutStatus
    root = os.path.join(sys.argv[1], "s")
    filler = os.path.join(sys.argv[1], "filler")
    acked = []
    st = localmq.open(root, mapped_file_size_commit_log=4 << 20, mapped_file_size_consume_queue=4000,
                      reserve_step_commit_log=256 << 10, reserve_step_consume_queue=4000,
                      max_hash_slot_num=1024, max_index_num=4096, preallocate_mapped_file=False)
    with open(filler, "wb") as f:  # leave about 1.5 MB free on the 6 MB file system
        free = os.statvfs(sys.argv[1]).f_bavail * os.statvfs(sys.argv[1]).f_frsize
        f.write(b"\1" * (free - 1536 * 1024))
    status = None
    for i in range(10000):
        r = st.put("t", b"%05d" % i + b"z" * 1000)
        if not r.ok:
            status = r.status
            break
        acked.append(i)
    assert status is PutStatus.CREATE_MAPPED_FILE_FAILED, status
    assert 500 < len(acked) < 2000, len(acked)
    st.wait_for_dispatch(10)
    got = []
    off = 0
    while True:
        g = st.get_message("t", 0, off, 64)
        if not g.messages:
            break
        got += [int(m.body[:5]) for m in g.messages]
        off = g.next_begin_offset
    assert got == acked, (len(got), len(acked))
    os.unlink(filler)  # space returns: puts work again
    r = st.put("t", b"after")
    assert r.ok, r.status
    st.close()
    print("refused after", len(acked), "puts; every one read back")
""")


def test_full_disk_refuses_the_put_that_cannot_be_reserved_never_sigbus(tmp_path):
    """On a real 6 MB tmpfs (a private mount namespace), puts into a sparse segment are refused with
    CREATE_MAPPED_FILE_FAILED when the next step cannot be reserved: no SIGBUS, every acknowledged message reads
    back, and puts work again once space returns."""
    proc = run_on_tmpfs(tmp_path, FULL_DISK, "6m")
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    assert "every one read back" in proc.stdout
    assert PutStatus.CREATE_MAPPED_FILE_FAILED  # the status the worker asserted
