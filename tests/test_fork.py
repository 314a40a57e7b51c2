"""A store inherited through fork refuses every use in the child (never a silent PUT_OK that is later lost), and a
store is never pickled to another process. Real os.fork and real multiprocessing (fork, spawn, forkserver)."""

import multiprocessing
import os
import pickle

import pytest

import localmq
from localmq import ForkedStoreError, StoreLockedError

SMALL = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=2000)


def _in_child(fn):
    """Run ``fn()`` in a forked child; returns what it wrote to the pipe (a short text), or raises on a crash."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(r)
        try:
            out = fn()
        except BaseException as e:  # noqa: BLE001 - reported to the parent as text
            out = f"{type(e).__name__}: {e}"
        os.write(w, str(out).encode()[:4000])
        os.close(w)
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return data


@pytest.mark.parametrize("kind", ["local", "embedded"])
def test_forked_child_cannot_put_and_the_parent_loses_nothing(tmp_path, kind):
    cfg = SMALL if kind == "local" else {}
    st = localmq.open(tmp_path / "s", kind=kind, **cfg)
    try:
        first = st.put("t", b"parent-0", queue_id=1)
        assert first.status is localmq.PutStatus.PUT_OK

        def child():
            outcomes = []
            for call in (
                lambda: st.put("t", b"child", queue_id=1),
                lambda: st.put_batch("t", [b"c1", b"c2"], queue_id=1),
                lambda: st.get_message("t", 1, 0),
                lambda: st.max_offset("t", 1),
            ):
                try:
                    call()
                    outcomes.append("ok")
                except ForkedStoreError as e:
                    assert "fork" in str(e) and "open the store in this process" in str(e)
                    outcomes.append("forked")
            st.close()  # a no-op in the child: the parent's lock and files stay as they are
            return ",".join(outcomes)

        assert _in_child(child) == "forked,forked,forked,forked"
        # the parent goes on: its queue offsets continue densely, nothing of the child is in the log
        rs = [st.put("t", b"parent-%d" % i, queue_id=1) for i in range(1, 5)]
        assert [r.queue_offset for r in rs] == [1, 2, 3, 4]
        if kind == "local":
            assert st.wait_for_dispatch(10)
        got = st.get_message("t", 1, 0, 32)
        assert [bytes(m.body) for m in got.messages] == [b"parent-%d" % i for i in range(5)]
        # the child's close() left the parent's lock in place
        with pytest.raises(StoreLockedError):
            localmq.open(tmp_path / "s", kind=kind, **cfg)
    finally:
        st.close()
    if kind == "local":
        bodies = [bytes(m.body) for m in localmq.read_commitlog(tmp_path / "s" / "commitlog")]
        assert bodies == [b"parent-%d" % i for i in range(5)]


def test_store_does_not_pickle(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        with pytest.raises(TypeError, match="open it there"):
            pickle.dumps(st)


def _put_from_worker(path):
    """multiprocessing target for spawn/forkserver: opens the store itself (the parent has closed it)."""
    with localmq.open(path, **SMALL) as st:
        return st.put("t", b"from-" + str(os.getpid()).encode()).status.name


_INHERITED = None


def _use_inherited(_):
    try:
        _INHERITED.put("t", b"inherited")
        return "ok"
    except ForkedStoreError:
        return "forked"


def test_multiprocessing_fork_pool_gets_the_error(tmp_path):
    global _INHERITED
    _INHERITED = localmq.open(tmp_path / "s", **SMALL)
    try:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            assert pool.map(_use_inherited, range(4)) == ["forked"] * 4
        assert _INHERITED.put("t", b"parent").queue_offset == 0
    finally:
        _INHERITED.close()
        _INHERITED = None


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_spawned_workers_open_the_store_themselves(tmp_path, method):
    path = str(tmp_path / "s")
    with localmq.open(path, **SMALL) as st:
        st.put("t", b"parent")
        with multiprocessing.get_context(method).Pool(1) as pool:
            # while this process holds the store, a worker's open is refused with a clear error
            with pytest.raises(StoreLockedError):
                pool.apply(_put_from_worker, (path,))
    with multiprocessing.get_context(method).Pool(1) as pool:
        assert pool.apply(_put_from_worker, (path,)) == "PUT_OK"
    with localmq.open(path, **SMALL) as st:
        assert st.wait_for_dispatch(10)
        bodies = [bytes(m.body) for m in st.get_message("t", 0, 0).messages]
    assert bodies[0] == b"parent" and len(bodies) == 2 and bodies[1].startswith(b"from-")


def _put_shared(path):
    with localmq.open(path, shared=True, **SMALL) as st:
        return st.put("t", b"from-%d" % os.getpid()).status.name


def _inherited_then_own(path):
    global _INHERITED
    try:
        _INHERITED.put("t", b"via the parent's handle")
        return "inherited put worked"
    except ForkedStoreError:
        pass
    return _put_shared(path)


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_workers_share_a_store_the_parent_holds_shared(tmp_path, method):
    global _INHERITED
    path = str(tmp_path / "s")
    _INHERITED = st = localmq.open(path, shared=True, **SMALL)
    try:
        st.put("t", b"parent")
        fn = _inherited_then_own if method == "fork" else _put_shared
        with multiprocessing.get_context(method).Pool(2) as pool:
            assert pool.map(fn, [path] * 6) == ["PUT_OK"] * 6
        assert st.put("t", b"parent again").queue_offset == 7  # offsets stayed dense across the processes
        assert st.wait_for_dispatch(10)
        bodies = [bytes(m.body) for m in st.get_message("t", 0, 0).messages]
        assert bodies[0] == b"parent" and bodies[-1] == b"parent again" and len(bodies) == 8
        assert all(b.startswith(b"from-") for b in bodies[1:-1])
    finally:
        st.close()
        _INHERITED = None
