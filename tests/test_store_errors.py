"""Bad input and misuse: typed errors (also the matching builtins), nothing written, nothing lost."""

import os
import subprocess
import sys
import textwrap

import pytest

import localmq
from helpers import run_on_tmpfs

SMALL = dict(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=200)


@pytest.mark.parametrize("topic", ["", "a/b", "..", "../x", "t" * 256, "caf\u00e9", "a b", "x\x00", 5, None])
def test_invalid_topic(store_factory, topic):
    st = store_factory(**SMALL)
    with pytest.raises(localmq.InvalidTopicError if isinstance(topic, str) else TypeError):
        st.put(topic, b"x")
    assert st.commit_log_max_offset == 0
    assert not os.path.exists(os.path.join(st.root, "consumequeue", "x"))


def _queue_of_kind(kind, tmp_path):
    if kind == "memory":
        return localmq.MemoryMessageQueue()
    return localmq.open(tmp_path / kind, kind=kind, **(SMALL if kind == "local" else {}))


# (call, the argument the error names, the error): the put side answers a wrong type or value as the get side does
_PUT_MISUSE = [
    (lambda q: q.put("t", "hello"), "body", localmq.ArgumentTypeError),
    (lambda q: q.put("t", 12345), "body", localmq.ArgumentTypeError),
    (lambda q: q.put("t", None), "body", localmq.ArgumentTypeError),
    (lambda q: q.put_batch("t", ["a", "b"]), "bodies[0]", localmq.ArgumentTypeError),
    (lambda q: q.put_batch("t", [b"a", 7]), "bodies[1]", localmq.ArgumentTypeError),
    (lambda q: q.put_batch("t", b"one body"), "bodies", localmq.ArgumentTypeError),
    (lambda q: q.put_batch("t", 5), "bodies", localmq.ArgumentTypeError),
    (lambda q: q.put_batch("t", []), "bodies", localmq.ArgumentRangeError),
    (lambda q: q.put("t", b"x", queue_id="1"), "queue_id", localmq.ArgumentTypeError),
    (lambda q: q.put_batch("t", [b"x"], queue_id=1.0), "queue_id", localmq.ArgumentTypeError),
    (lambda q: q.put("t", b"x", flag="1"), "flag", localmq.ArgumentTypeError),
    (lambda q: q.put(5, b"x"), "topic", localmq.ArgumentTypeError),
    (lambda q: q.put_batch(None, [b"x"]), "topic", localmq.ArgumentTypeError),
    (lambda q: q.put("t", b"x", tags=5), "tags", localmq.ArgumentTypeError),
    (lambda q: q.put("t", b"x", keys=5), "keys", localmq.ArgumentTypeError),
    (lambda q: q.put("t", b"x", keys=["k", 5]), "keys", localmq.ArgumentTypeError),
    (lambda q: q.put("t", b"x", properties=["a", "b"]), "properties", localmq.ArgumentTypeError),
    (lambda q: q.get_message("t", 0, 0, max_messages=0), "max_messages", localmq.ArgumentRangeError),
    (lambda q: q.create_producer().send("t", "text"), "body", localmq.ArgumentTypeError),
    (lambda q: q.create_producer().send_batch("t", ["text"]), "bodies[0]", localmq.ArgumentTypeError),
]


@pytest.mark.parametrize("kind", ["local", "embedded", "memory"])
def test_put_misuse_raises_typed_errors_naming_the_argument(tmp_path, kind):
    """Issue 23: the put side raised bare builtins (``TypeError: a bytes-like object is required``, ``an integer is
    required``) where the get side names the argument. Each error is a LocalMQError and the matching builtin, and
    nothing was written."""
    with _queue_of_kind(kind, tmp_path) as q:
        for i, (call, argument, error) in enumerate(_PUT_MISUSE):
            with pytest.raises(error) as e:
                call(q)
            assert isinstance(e.value, localmq.LocalMQError), (i, e.value)
            assert isinstance(e.value, TypeError if error is localmq.ArgumentTypeError else ValueError), (i, e.value)
            assert e.value.argument == argument, (i, e.value)
            assert argument.split("[")[0] in str(e.value), (i, e.value)
        assert "encode" in str(pytest.raises(TypeError, q.put, "t", "text").value)  # says how to mend it
        r = q.put("t", b"first")
        assert r.queue_offset == 0  # every refused call wrote nothing


def test_invalid_topic_is_value_error(store_factory):
    with pytest.raises(ValueError):
        store_factory(**SMALL).put("no/slash", b"x")


@pytest.mark.parametrize("qid", [-1, 65536, 2**31 - 1])
def test_invalid_queue_id(store_factory, qid):
    st = store_factory(**SMALL)
    with pytest.raises(localmq.InvalidQueueIdError):
        st.put("t", b"x", queue_id=qid)
    with pytest.raises(ValueError):
        st.put_batch("t", [b"x"], queue_id=qid)


def test_sizes(store_factory):
    st = store_factory(mapped_file_size_commit_log=64 * 1024, max_message_size=1000)
    with pytest.raises(localmq.MessageSizeError) as e:
        st.put("t", b"x" * 1001)
    assert e.value.status is localmq.PutStatus.MESSAGE_ILLEGAL
    assert isinstance(e.value, ValueError)
    st.put("t", b"x" * 1000)
    with pytest.raises(localmq.PropertiesSizeError) as e:
        st.put("t", b"x", properties={"p": "v" * 33000})
    assert e.value.status is localmq.PutStatus.PROPERTIES_SIZE_EXCEEDED
    with pytest.raises(localmq.InvalidPropertyError):
        st.put("t", b"x", keys=["has space"])
    with pytest.raises(localmq.InvalidPropertyError):
        st.put("t", b"x", properties={"k": "a\x01b"})
    with pytest.raises(localmq.InvalidPropertyError):
        st.put("t", b"x", properties={"": "v"})
    with pytest.raises(TypeError):
        st.put("t", 12345)
    with pytest.raises(TypeError):
        st.put("t", "text is not bytes")
    st.wait_for_dispatch()
    assert st.max_offset("t", 0) == 1


def test_record_larger_than_segment(store_factory):
    st = store_factory(mapped_file_size_commit_log=4096)
    with pytest.raises(localmq.MessageSizeError):
        st.put("t", b"x" * 4096)
    r = st.put("t", b"x" * 3900)
    assert r.status is localmq.PutStatus.PUT_OK


def test_closed_store(tmp_path):
    st = localmq.open(tmp_path / "s", **SMALL)
    st.put("t", b"x")
    st.close()
    for call in (
        lambda: st.put("t", b"x"),
        lambda: st.put_batch("t", [b"x"]),
        lambda: st.get_message("t", 0, 0),
        lambda: st.max_offset("t", 0),
        lambda: st.wait_for_dispatch(),
        lambda: st.flush(),
    ):
        with pytest.raises(localmq.StoreClosedError):
            call()
    with pytest.raises(ValueError):
        st.get_message("t", 0, 0)


def test_second_writer_same_process(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL):
        with pytest.raises(localmq.StoreLockedError) as e:
            localmq.open(tmp_path / "s", **SMALL)
        assert isinstance(e.value, BlockingIOError)
    # released on close
    localmq.open(tmp_path / "s", **SMALL).close()


def test_second_writer_other_process(tmp_path):
    code = textwrap.dedent(f"""
        import sys, localmq
        try:
            localmq.open({str(tmp_path / "s")!r}, mapped_file_size_commit_log=65536)
        except localmq.StoreLockedError as e:
            print("LOCKED", e)
            sys.exit(3)
        sys.exit(0)
    """)
    with localmq.open(tmp_path / "s", **SMALL) as st:
        st.put("t", b"keep")
        p = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert p.returncode == 3, p.stderr
        assert "LOCKED" in p.stdout
        st.put("t", b"still")
    with localmq.open(tmp_path / "s", **SMALL) as st:
        assert [m.body for m in st.get_message("t", 0, 0).messages] == [b"keep", b"still"]


def test_wrong_segment_size_refused(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        st.put("t", b"x")
    # the store recorded its segment size at creation: another one passed explicitly is a typed error
    with pytest.raises(localmq.StoreSettingsError, match="mapped_file_size_commit_log=8192.*=65536"):
        localmq.open(tmp_path / "s", mapped_file_size_commit_log=8192)
    # nothing was changed by the refused open
    with localmq.open(tmp_path / "s", **SMALL) as st:
        assert st.get_message("t", 0, 0).messages[0].body == b"x"


def test_bad_config(tmp_path):
    with pytest.raises(localmq.ConfigError):
        localmq.open(tmp_path / "s", no_such_setting=1)
    with pytest.raises(localmq.ConfigError):
        localmq.open(tmp_path / "s", mapped_file_size_commit_log=100)
    with pytest.raises(localmq.ConfigError):
        localmq.open(tmp_path / "s", flush_disk_type="SOMETIMES")
    assert localmq.StoreConfig(flush_disk_type="sync_flush").flush_disk_type is localmq.FlushDiskType.SYNC_FLUSH
    assert localmq.StoreConfig.from_options({"mapped_file_size_commit_log": "8192"}).mapped_file_size_commit_log == 8192
    assert localmq.StoreConfig(mapped_file_size_consume_queue=1001).mapped_file_size_consume_queue == 1020


def test_max_messages_validation(store_factory):
    st = store_factory(**SMALL)
    with pytest.raises(ValueError):
        st.get_message("t", 0, 0, 0)
    with pytest.raises(localmq.InvalidQueueIdError):
        st.get_message("t", -1, 0)


def test_not_a_store_for_readers(tmp_path):
    with pytest.raises(localmq.NotAStoreError):
        localmq.read_commitlog(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError):
        localmq.read_commitlog(tmp_path / "empty")


def test_native_errors_carry_errno_and_path(tmp_path):
    from localmq import _native

    p = tmp_path / "ro"
    p.write_bytes(b"")
    fd = os.open(p, os.O_RDONLY)
    try:
        with pytest.raises(localmq.StoreIOError) as e:
            _native.fallocate(fd, 0, 4096, path=str(p))
        assert e.value.errno == 9 and e.value.filename == str(p)  # EBADF: not open for writing
        assert e.value.operation == "fallocate" and isinstance(e.value, OSError)
        assert str(e.value) == f"fallocate {p}: [Errno 9] EBADF Bad file descriptor"
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError) as e:  # still the builtin an ENOENT gives
        _native.fsync_dir(tmp_path / "nope")
    assert isinstance(e.value, localmq.StoreIOError) and e.value.filename == str(tmp_path / "nope")


def test_store_io_error_is_the_builtin_of_its_errno_and_pickles():
    import errno
    import pickle

    from localmq.errors import store_io_error

    e = store_io_error(OSError(errno.ENOSPC, "No space left on device"), "write", "/s/config/x.json")
    assert type(e) is localmq.StoreIOError and isinstance(e, localmq.LocalMQError) and isinstance(e, OSError)
    assert (e.errno, e.strerror, e.filename, e.operation) == (
        errno.ENOSPC,
        "No space left on device",
        "/s/config/x.json",
        "write",
    )
    assert "ENOSPC" in str(e) and "/s/config/x.json" in str(e)
    for err, builtin in [
        (errno.ENOENT, FileNotFoundError),
        (errno.EEXIST, FileExistsError),
        (errno.EACCES, PermissionError),
        (errno.ENOTDIR, NotADirectoryError),
    ]:
        e = store_io_error(err, "open", "/s/f")
        assert isinstance(e, builtin) and isinstance(e, localmq.StoreIOError)
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and (back.errno, back.filename, back.operation) == (err, "/s/f", "open")
    typed = localmq.StoreClosedError("closed")
    assert store_io_error(typed, "write") is typed  # already typed: unchanged


def test_a_dispatch_error_keeps_the_errno_and_the_file_of_its_cause():
    import errno
    import pickle

    from localmq.errors import store_io_error

    cause = store_io_error(errno.EIO, "write", "/s/consumequeue/t/0/00000000000000000000")
    e = localmq.DispatchError.stopped(cause)
    assert isinstance(e, localmq.LocalMQError) and isinstance(e, RuntimeError)
    assert (e.errno, e.filename) == (errno.EIO, cause.filename)
    assert str(e).startswith("the dispatch service stopped: write /s/consumequeue/t/0/") and "EIO" in str(e)
    back = pickle.loads(pickle.dumps(e))
    assert (type(back), back.errno, back.filename, str(back)) == (type(e), e.errno, e.filename, str(e))
    damage = localmq.CorruptFrameError("dispatch found a end record at commit log offset 0")
    flush = store_io_error(errno.EIO, "fdatasync", "/s/commitlog/00000000000000000000")
    e = localmq.DispatchError.stopped(damage, io_failure=flush)  # zeros where a write-back failed
    assert (e.errno, e.filename) == (errno.EIO, flush.filename)
    assert "end record" in str(e) and "after a failed flush of the commit log: fdatasync /s/commitlog/" in str(e)
    bare = localmq.DispatchError.stopped(None, "the dispatch service is not running")
    assert (bare.errno, bare.filename, str(bare)) == (None, None, "the dispatch service is not running")


@pytest.mark.parametrize("call", ["put", "put_batch"])
def test_put_arguments_out_of_range_raise_typed_errors(tmp_path, call):
    with localmq.open(tmp_path / "s", mapped_file_size_commit_log=64 * 1024) as st:

        def put(**kw):
            return st.put("t", b"x", **kw) if call == "put" else st.put_batch("t", [b"x", b"y"], **kw)

        with pytest.raises(localmq.InvalidQueueIdError):
            put(queue_id=2**70)
        with pytest.raises(localmq.InvalidQueueIdError):
            put(queue_id=65536)
        with pytest.raises(localmq.ArgumentOverflowError) as e:
            put(flag=2**40)
        assert e.value.argument == "flag" and isinstance(e.value, OverflowError)
        with pytest.raises(TypeError):
            put(queue_id="1")
        # nothing was written by the refused calls; the next put is the queue's first message
        r = put(queue_id=65535, flag=-(2**31))
        assert r.status is localmq.PutStatus.PUT_OK and r.queue_offset == 0
        assert st.wait_for_dispatch(10)
        assert [m.flag for m in st.get_message("t", 65535, 0).messages][0] == -(2**31)


def test_reopened_store_keeps_its_posix_byte_lock(tmp_path):
    """The byte-0 POSIX lock is what a RocketMQ broker and localmq's read-only views test. Closing any descriptor of
    the lock file drops it (fcntl's rule): an open that read the lock file's bytes for its undo list once lost it
    on every reopen of an existing store."""
    import subprocess
    import sys

    root = tmp_path / "s"
    with localmq.open(root, mapped_file_size_commit_log=64 * 1024) as st:
        st.put("t", b"x")
    probe = (
        "import fcntl, os, struct, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
        "got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack('hhqqi', fcntl.F_WRLCK, 0, 0, 1, 0)); "
        "print(struct.unpack('hhqqi', got)[0] == fcntl.F_WRLCK)"
    )
    for _ in range(2):
        with localmq.open(root, mapped_file_size_commit_log=64 * 1024):
            out = subprocess.run([sys.executable, "-c", probe, str(root / "lock")], capture_output=True, text=True)
            assert out.stdout.strip() == "True", out
        with localmq.open(root, read_only=True):
            pass


def test_statuses_print_their_names():
    """Python 3.11 prints an IntEnum as its number: ``print(r.status)`` showed ``0``. Statuses print their names and
    still compare and convert as ints."""
    assert str(localmq.PutStatus.PUT_OK) == "PutStatus.PUT_OK"
    assert f"{localmq.GetStatus.NO_MESSAGE_IN_QUEUE}" == "GetStatus.NO_MESSAGE_IN_QUEUE"
    assert f"{localmq.ConsumeStatus.RECONSUME_LATER:>32}".strip() == "ConsumeStatus.RECONSUME_LATER"
    assert str(localmq.LocalTransactionState.COMMIT_MESSAGE) == "LocalTransactionState.COMMIT_MESSAGE"
    assert localmq.GetStatus.NO_MESSAGE_IN_QUEUE == 8 and int(localmq.PutStatus.PUT_OK) == 0


def test_read_commitlog_on_a_store_root_says_which_directory_to_pass(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        st.put("t", b"x")
    with pytest.raises(localmq.NotAStoreError) as e:
        list(localmq.read_commitlog(tmp_path / "s"))
    assert f"pass {tmp_path / 's' / 'commitlog'}" in str(e.value)
    assert [m.body for m in localmq.read_commitlog(tmp_path / "s" / "commitlog")] == [b"x"]


def test_listen_on_a_closed_consumer_raises_as_poll_does(tmp_path):
    with localmq.open(tmp_path / "s", **SMALL) as st:
        c = st.create_consumer("g", "t", manual_ack=True)
        c.close()
        with pytest.raises(localmq.StoreClosedError):
            c.poll(0)
        with pytest.raises(localmq.StoreClosedError):
            c.listen(lambda msgs: None, idle_timeout=0.1)


def _run_script(code, *args, extra_env=None):
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__))), **(extra_env or {})}
    return subprocess.run(
        [sys.executable, "-W", "default", "-c", textwrap.dedent(code), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_a_store_left_open_is_closed_at_exit_with_a_resource_warning(tmp_path):
    """A program that forgets close(): the exit hook closes the store (dispatch caught up, files flushed, ``abort``
    gone, so the next open needs no crash recovery) and says so with a ResourceWarning."""
    p = _run_script(
        """
        import sys, localmq
        st = localmq.open(sys.argv[1], mapped_file_size_commit_log=64 * 1024)
        for i in range(100):
            st.put("t", b"m%d" % i)
    """,
        tmp_path / "s",
    )
    assert p.returncode == 0, p.stderr
    assert "ResourceWarning" in p.stderr and "was never closed: closing it at exit" in p.stderr, p.stderr
    assert not (tmp_path / "s" / "abort").exists()
    with localmq.open(tmp_path / "s") as st:
        assert st.recovery.mode == "normal"
        assert st.max_offset("t", 0) == 100


def test_the_spark_module_says_how_to_install_what_it_needs(tmp_path):
    """Without pyarrow (hidden here through sys.modules), ``localmq.spark`` entry points raise ModuleNotFoundError
    naming the extra to install, not a bare ``No module named 'pyarrow'`` from deep inside."""
    p = _run_script(
        """
        import sys
        sys.modules["pyarrow"] = None  # `import pyarrow` now fails as it does where pyarrow is not installed
        import localmq.spark
        try:
            localmq.spark.arrow_batches(sys.argv[1])
        except ModuleNotFoundError as e:
            print(e.name, "|", e)
    """,
        tmp_path,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("pyarrow | ") and "pip install 'localmq[spark]'" in p.stdout, p.stdout


def test_a_store_on_a_read_only_mount_says_so_and_opens_read_only(tmp_path):
    """Issue 24: a store on a read-only file system raised a bare OSError (EROFS) from deep inside the open. Opening it
    for writing (either queue kind, existing or new) raises ReadOnlyFilesystemError before anything is touched;
    ``read_only=True`` reads it. A real tmpfs remounted read-only, in a private mount namespace."""
    script = tmp_path / "ro.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys, localmq
        mnt = sys.argv[1]
        for kind in ("local", "embedded"):
            for path in (mnt + "/s", mnt + "/new/store"):
                try:
                    localmq.open(path, kind=kind)
                    print("opened for writing:", kind, path)
                except localmq.ReadOnlyFilesystemError as e:
                    assert e.errno == 30 and isinstance(e, OSError) and "read_only=True" in str(e), e
                    print("refused", kind, os.path.basename(path))
        with localmq.open(mnt + "/s", read_only=True) as st:
            print("read", [m.body for m in st.get_message("t", 0, 0).messages])
    """)
    )
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    setup = f'import localmq\\nwith localmq.open("{mnt}/s") as st: st.put("t", b"hello")'
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    p = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'mount -t tmpfs -o size=8m localmq-ro "{mnt}" || exit 90; '
            f'printf \'{setup}\' | "{sys.executable}" - && mount -o remount,ro "{mnt}" && '
            f'"{sys.executable}" "{script}" "{mnt}"',
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.split("\n") == [
        "refused local s",
        "refused local store",
        "refused embedded s",
        "refused embedded store",
        "read [b'hello']",
        "",
    ], p.stdout + p.stderr


NEW_FILES = textwrap.dedent(r"""
    import errno, os, sys
    from localmq._mapped_file import MappedFile
    from localmq._native import mkdirs
    from localmq.errors import StoreIOError
    mnt = sys.argv[1]
    d = os.path.join(mnt, "q")
    assert mkdirs(os.path.join(d, "a", "b")) == (3, 3) and mkdirs(os.path.join(d, "a", "b")) == (0, 0)
    a = os.path.join(d, "%020d" % 0)
    # a segment reserved whole, its descriptor kept
    mf = MappedFile(a, 1 << 20, create=True, reserve=True, reserve_step=0)
    st = os.stat(a)
    assert (st.st_size, st.st_blocks * 512) == (1 << 20, 1 << 20), st
    mf.write_at(4096, b"made")  # mapped shared and writable: the file sees a write through the mapping
    with open(a, "rb") as f:
        assert os.pread(f.fileno(), 4, 4096) == b"made"
    ino = st.st_ino
    # a file that cannot be reserved: the error names the call, the file and the errno; nothing is left behind
    b = os.path.join(d, "%020d" % (4 << 20))
    free = os.statvfs(mnt).f_bavail
    try:
        MappedFile(b, 4 << 20, create=True, reserve=True, reserve_step=0)
        raise AssertionError("a 4 MiB file was reserved on a 2 MiB file system")
    except StoreIOError as e:
        assert (e.errno, e.operation, e.filename) == (errno.ENOSPC, "fallocate", b), (e.errno, e.operation, e.filename)
    assert sorted(os.listdir(d)) == ["%020d" % 0, "a"], os.listdir(d)
    assert os.statvfs(mnt).f_bavail == free
    # an existing name is opened, not made again
    again = MappedFile(a, 1 << 20, create=True, reserve=True, reserve_step=0)
    assert os.stat(a).st_ino == ino
    again.close()
    mf.close()
    # a ConsumeQueue file: sparse, its first page reserved, no descriptor kept
    c = os.path.join(d, "a", "b", "%020d" % 0)
    before = set(os.listdir("/proc/self/fd"))
    cq = MappedFile(c, 6000000, create=True, reserve=True, reserve_step=65536, reserve_first=4096, keep_fd=False,
                    sync_size=False)
    st = os.stat(c)
    assert (st.st_size, st.st_blocks * 512, cq.reserved) == (6000000, 4096, 4096), (st, cq.reserved)
    assert set(os.listdir("/proc/self/fd")) == before
    cq.close()
    # a directory path through a file: typed, naming the path
    try:
        mkdirs(os.path.join(a, "x"))
        raise AssertionError("a directory was made below a file")
    except StoreIOError as e:
        assert (e.errno, e.operation) == (errno.ENOTDIR, "mkdir"), e
    print("new files ok")
""")


def test_new_files_are_made_in_one_call_and_a_failed_one_leaves_nothing(tmp_path):
    """A new segment or ConsumeQueue file is made by one native call (csrc lmq_create_mapped: O_TMPFILE, size,
    reserve, link, map) where the file system has O_TMPFILE (a real 2 MiB tmpfs, in a private mount namespace): made
    sized and reserved as asked, its descriptor closed unless kept; a file that cannot be reserved raises a
    StoreIOError naming the call, the file and ENOSPC and leaves no name and no blocks behind; an existing name is
    opened instead; a directory below a file is refused with ENOTDIR (lmq_mkdirs)."""
    proc = run_on_tmpfs(tmp_path, NEW_FILES, "2m")
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    assert "new files ok" in proc.stdout
