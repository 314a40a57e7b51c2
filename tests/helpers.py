"""What several test modules share: reference implementations written from the spec, waiting, killing a writer,
mounting powerfs, damaging a store's bytes."""

import contextlib
import errno
import importlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib

import pytest


def require(module):
    """Import ``module`` or fail the test saying what to install: a missing dependency is never a silent skip."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} is needed for this test ({e}): python -m pip install -e '.[test]'", pytrace=False)


def require_java():
    """Fail (never skip) when no Java runtime is there for Spark."""
    if not shutil.which("java") and not os.environ.get("JAVA_HOME"):
        pytest.fail(
            "Spark needs a Java runtime (JDK 17): apt-get install openjdk-17-jre-headless, or set JAVA_HOME",
            pytrace=False,
        )


def java_hash_reference(text):
    """Java's String.hashCode from its definition: s[0]*31^(n-1) + ... over UTF-16 code units, int32 wrap-around
    (written here from the Java spec, never from localmq's implementation)."""
    raw = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(raw), 2):
        h = (31 * h + int.from_bytes(raw[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def wait_until(pred, timeout=10.0, step=0.005):
    """Poll ``pred`` until it is true or ``timeout`` s pass; returns its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def kill_when_ready(args, env, delay):
    """Run ``python args...`` (a writer script that prints "ready" once it writes), SIGKILL it ``delay`` s after
    that line, and wait for it to die."""
    proc = subprocess.Popen([sys.executable, *map(str, args)], stdout=subprocess.PIPE, env=env)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    return proc


MAGIC = bytes.fromhex("daa320a7")


def golden_record(
    *,
    topic=b"abc",
    body=b"Once, there was a chance for me!",
    props=b"TAGS\x01TAG1",
    queue_id=3,
    flag=7,
    queue_offset=11,
    phys=4096,
    sys_flag=0,
    born_ts=1_600_000_000_123,
    born_host=bytes([127, 0, 0, 1]) + struct.pack(">i", 0),
    store_ts=1_600_000_000_456,
    store_host=bytes([192, 168, 71, 1]) + struct.pack(">i", 8123),
    reconsume=2,
    prepared=0,
):
    """Spec section 1.1, field by field (big-endian), independent of localmq's encoder."""
    crc = zlib.crc32(body) & 0x7FFFFFFF
    tail = (
        struct.pack(">i", reconsume)
        + struct.pack(">q", prepared)
        + struct.pack(">i", len(body))
        + body
        + struct.pack(">b", len(topic))
        + topic
        + struct.pack(">h", len(props))
        + props
    )
    head = (
        MAGIC
        + struct.pack(">i", crc)
        + struct.pack(">i", queue_id)
        + struct.pack(">i", flag)
        + struct.pack(">q", queue_offset)
        + struct.pack(">q", phys)
        + struct.pack(">i", sys_flag)
        + struct.pack(">q", born_ts)
        + born_host
        + struct.pack(">q", store_ts)
        + store_host
    )
    rec = head + tail
    return struct.pack(">i", len(rec) + 4) + rec


def queue_messages(st, topic, queue_id=0, wait=True, start=0, max_messages=32, **get_kw):
    """Every message of (topic, queue id) from ``start``, read with ``get_message`` a batch at a time (``get_kw``:
    a tag expression, say) to the queue's end: OFFSET_OVERFLOW_ONE, or a queue that does not exist or is empty.
    Any other outcome than FOUND / NO_MATCHED_MESSAGE, or a batch that does not move on, fails the test. First
    waits for the dispatcher to catch up when ``wait``."""
    from localmq.status import GetStatus

    if wait and not st.wait_for_dispatch(10):
        raise AssertionError("dispatch did not catch up")
    out, off = [], start
    while True:
        r = st.get_message(topic, queue_id, off, max_messages, **get_kw)
        if r.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE):
            return out
        assert r.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), (topic, queue_id, off, r)
        assert r.next_begin_offset > off, (topic, queue_id, off, r)
        out += r.messages
        off = r.next_begin_offset


@contextlib.contextmanager
def powerfs_mounted(backing, mountpoint, **kwargs):
    """A mounted PowerFS (tests/powerfs) on ``backing``, unmounted afterwards; a build or mount failure fails the
    test saying what to install (never a skip)."""
    from powerfs import PowerFS, PowerFSError

    fs = PowerFS(backing, mountpoint, **kwargs)
    try:
        fs.mount()
    except PowerFSError as e:
        pytest.fail(str(e), pytrace=False)
    try:
        yield fs
    finally:
        fs.unmount()


def cq_file(root, topic, qid, unit, file_size):
    """(path, position) of unit ``unit`` of queue (topic, qid) in a store whose ConsumeQueue files are ``file_size``
    bytes (RocketMQ's layout: files named by their first byte's logical offset)."""
    base = unit * 20 // file_size * file_size
    return root / "consumequeue" / topic / str(qid) / ("%020d" % base), unit * 20 - base


def patch(path, pos, data):
    """Overwrite ``data`` at ``pos`` of ``path`` (damage, or a repair by hand)."""
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def read_bytes(path, pos, n):
    with open(path, "rb") as f:
        f.seek(pos)
        return f.read(n)


def rmtree_on_fuse(path, timeout=30.0):
    """``shutil.rmtree`` of a tree on a powerfs mount, retried while a directory is not empty. libfuse's high-level
    API renames a file that is unlinked while still open to ``.fuse_hidden...`` in the same directory, and the kernel
    sends the last close of a mapped file (its RELEASE) asynchronously after the unmap: a store that has just closed
    can leave such an entry for a moment, which disappears once the release arrives. When it does not within
    ``timeout``, the error names what is left and which process still maps or holds it open."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            shutil.rmtree(path)
            return
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise
            if time.monotonic() > deadline:
                raise OSError(e.errno, f"{e.strerror}: {_left_behind(path)}", e.filename) from e
            time.sleep(0.05)


def _left_behind(path):
    """The files left under ``path``, and the processes whose mappings or descriptors name a file under it."""
    left = [os.path.relpath(os.path.join(d, n), path) for d, _, names in os.walk(path) for n in names]
    holders = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                maps = [line.split(None, 5)[-1].strip() for line in f if str(path) in line]
            fds = [
                t for t in (_readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")) if str(path) in t
            ]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            continue
        if maps or fds:
            holders.append(
                f"pid {pid} ({cmd}{', this process' if int(pid) == os.getpid() else ''}): maps {maps}, fds {fds}"
            )
    return f"left {left}; held by {holders or 'no process'}"


def _readlink(p):
    try:
        return os.readlink(p)
    except OSError:
        return ""


@contextlib.contextmanager
def mounted_tmpfs(tmp_path, size):
    """A real tmpfs of ``size`` (e.g. "8m") mounted at ``tmp_path / "tmpfs"`` in this process's mount namespace,
    unmounted after. The tests run as root: a mount that fails fails the test (never a skip)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "localmq-test", str(mnt)], capture_output=True, text=True
    )
    assert p.returncode == 0, f"cannot mount a tmpfs (the tests run as root): {p.stderr.strip() or p.returncode}"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def run_on_tmpfs(tmp_path, script_text, size, timeout=120):
    """Run ``script_text`` (written to a file under ``tmp_path``) with a fresh tmpfs of ``size`` (e.g. "6m") mounted
    at ``tmp_path / "mnt"``, in a private mount namespace (root), its mount point as the one argument; this
    interpreter and its import path. Returns the CompletedProcess (text output)."""
    script = tmp_path / "on_tmpfs.py"
    script.write_text(script_text)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    cmd = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs -o size={size} tmpfs "{mnt}" && exec "{sys.executable}" "{script}" "{mnt}"',
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
