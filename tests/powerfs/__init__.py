"""powerfs: a FUSE file system that simulates power loss, for the test suite (README.md beside this file).

    from powerfs import PowerFS

    with PowerFS(tmp_path / "disk", tmp_path / "mnt") as fs:
        ...                       # run the workload on tmp_path / "mnt", in child processes
        <SIGKILL the workload's processes and wait for them>
        fs.cut("random", seed=7)  # power cut: the mount is gone, tmp_path / "disk" is what a reboot would find

The daemon (powerfs.c, overlay.c) is compiled on first use with gcc and libfuse3 into a cache directory keyed by the
sources' hash (``$POWERFS_CACHE``, else ``$XDG_CACHE_HOME/localmq-powerfs``, else ``~/.cache/localmq-powerfs``).
It needs /dev/fuse, gcc, pkg-config and Debian's fuse3 + libfuse3-dev; anything missing raises PowerFSError saying
what to install (tests turn it into a failure, never a skip).
"""

import errno as _errno
import hashlib
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

__all__ = ["PowerFS", "PowerFSError", "build", "run_then_kill", "INSTALL_HINT"]

SOURCE = Path(__file__).resolve().with_name("powerfs.c")
# the daemon's sources: the FUSE front (powerfs.c), the overlay model (overlay.c) and what they share (powerfs.h)
SOURCES = [SOURCE, SOURCE.with_name("overlay.c"), SOURCE.with_name("powerfs.h")]
INSTALL_HINT = (
    "powerfs needs /dev/fuse, gcc and libfuse3: apt-get install -y fuse3 libfuse3-dev pkg-config gcc "
    "(.ci/run installs them)"
)
FSTYPE = "fuse.powerfs"
CTL_NAME = ".powerfs"
MODES = ("all", "random", "torn")


class PowerFSError(RuntimeError):
    """powerfs could not be built, mounted or unmounted."""


def _cache_dir():
    if os.environ.get("POWERFS_CACHE"):
        return Path(os.environ["POWERFS_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "localmq-powerfs"


def build(cache_dir=None):
    """Path of the daemon compiled from powerfs.c and overlay.c, compiling it first if these sources were never
    compiled here.

    The binary goes to ``cache_dir/<source hash>/powerfs`` (renamed into place, so concurrent builds are safe);
    builds of older sources in that directory are removed."""
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in SOURCES)).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir is not None else _cache_dir()
    binary = cache / digest / "powerfs"
    if binary.is_file() and os.access(binary, os.X_OK):
        return binary
    for tool in ("gcc", "pkg-config"):
        if shutil.which(tool) is None:
            raise PowerFSError(f"cannot build powerfs: {tool} is not installed. {INSTALL_HINT}")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True, text=True, timeout=60)
    if flags.returncode != 0:
        raise PowerFSError(f"cannot build powerfs: pkg-config finds no fuse3 ({flags.stderr.strip()}). {INSTALL_HINT}")
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_name(f"powerfs.{os.getpid()}.{threading.get_ident()}.tmp")
    sources = [str(p) for p in SOURCES if p.suffix == ".c"]
    cmd = [
        "gcc",
        "-O2",
        "-g",
        "-std=gnu11",
        "-Wall",
        "-Wextra",
        "-Werror",
        *sources,
        "-o",
        str(tmp),
        *flags.stdout.split(),
    ]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise PowerFSError(f"cannot build powerfs ({' '.join(cmd)}):\n{done.stderr}\n{INSTALL_HINT}")
        os.replace(tmp, binary)
    finally:
        if tmp.exists():
            tmp.unlink()
    for old in cache.iterdir():
        if old.is_dir() and old.name != digest:
            shutil.rmtree(old, ignore_errors=True)
    return binary


def _unescape(field):
    r"""/proc/self/mountinfo escapes space, tab, newline and backslash as \ooo."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1 : i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _powerfs_mounts(mountpoint):
    """The major:minor of each powerfs mount on ``mountpoint`` (normally none or one)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            head, _, tail = line.partition(" - ")
            fields = head.split()
            if len(fields) >= 5 and tail.split()[:1] == [FSTYPE] and _unescape(fields[4]) == mountpoint:
                found.append(fields[2])
    return found


def _wait(pred, timeout, step=0.01):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(step)


class PowerFS:
    """A powerfs mount of ``backing_dir`` on ``mountpoint``, as a context manager.

    On entry the daemon is built if needed and started in the foreground (``-f``) as a child process; entry returns
    once the mount shows in /proc/self/mountinfo (or raises PowerFSError after ``mount_timeout`` s).  On exit, and
    by :meth:`cut`, it is unmounted; the daemon is waited for, then terminated, then killed, and the mount detached
    lazily, every step with a timeout: no mount is left behind, even when the test fails.  A watchdog aborts the
    mount (kills the daemon, so that every pending operation fails with ENOTCONN) if it is still there ``deadline``
    s after entry: a hung daemon makes the test fail, not hang.

    Without a cut, leaving the context is a clean unmount: everything becomes durable, as when a real file system is
    unmounted.

    The power cut, :meth:`cut`, is meant to be used as: SIGKILL every process of the workload and wait for them to
    die, THEN cut.  A process still running during the cut would have its later operations fail with EIO, and the
    kernel writes back the dirty pages of a killed process's shared mappings when its files are closed, which
    happens before it is reaped: only after the wait is everything it did visible to the cut.  After the cut
    ``backing_dir`` holds exactly what a machine would find after a reboot; mount a new PowerFS on it to run the
    recovery through the file system again.
    """

    def __init__(self, backing_dir, mountpoint, *, mount_timeout=10.0, deadline=600.0):
        self.backing = Path(backing_dir)
        self.mountpoint = Path(mountpoint)
        self.ctl = self.mountpoint / CTL_NAME
        self.mount_timeout = mount_timeout
        self.deadline = deadline
        self.aborted = False
        self._proc = None
        self._log = None
        self._watchdog = None
        self._proc_rc = None
        self._final_log = ""
        self._lock = threading.Lock()

    # -- mounting ---------------------------------------------------------------------------------------------------

    def __enter__(self):
        self.mount()
        return self

    def __exit__(self, *exc):
        self.unmount()
        return False

    def mount(self):
        if self._proc is not None:
            raise PowerFSError("already mounted")
        if not os.path.exists("/dev/fuse"):
            raise PowerFSError(f"/dev/fuse is missing (modprobe fuse). {INSTALL_HINT}")
        binary = build()
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        mnt = os.path.realpath(self.mountpoint)
        for _ in _powerfs_mounts(mnt):  # left by an earlier run that was killed
            self._detach(mnt)
        self._log = tempfile.TemporaryFile()
        env = dict(os.environ, POWERFS_PDEATHSIG="1")
        opts = "fsname=powerfs,subtype=powerfs,default_permissions,max_threads=8"
        self._proc = subprocess.Popen(
            [str(binary), os.path.realpath(self.backing), mnt, "-f", "-o", opts],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.aborted = False
        mounted = _wait(lambda: _powerfs_mounts(mnt) or self._proc.poll() is not None, self.mount_timeout)
        if not mounted or self._proc.poll() is not None:
            log = self._read_log()
            self._stop_daemon()
            self._detach(mnt)
            raise PowerFSError(
                f"powerfs did not mount on {mnt} within {self.mount_timeout} s "
                f"(daemon exit code {self._proc_rc}): {log.strip()}\n{INSTALL_HINT}"
            )
        self._watchdog = threading.Timer(self.deadline, self._abort)
        self._watchdog.daemon = True
        self._watchdog.start()

    def _read_log(self):
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def log(self):
        """What the daemon printed (its stderr), also after the unmount."""
        return self._read_log() if self._log is not None else self._final_log

    def _abort(self):
        """Watchdog: the deadline passed with the file system still mounted."""
        self.aborted = True
        with self._lock:
            proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()  # closing /dev/fuse aborts the connection: every waiting operation fails with ENOTCONN
        self._detach(os.path.realpath(self.mountpoint))

    @staticmethod
    def _detach(mnt):
        """Unmount ``mnt`` lazily, whatever state the daemon is in."""
        for cmd in (["fusermount3", "-u", "-z", mnt], ["umount", "-l", mnt]):
            if not _powerfs_mounts(mnt):
                return
            try:
                subprocess.run(
                    cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10
                )
            except (OSError, subprocess.TimeoutExpired):
                pass

    @staticmethod
    def _abort_connection(dev):
        """Abort through fusectl, when it is mounted (it makes the kernel fail every pending request)."""
        minor = dev.split(":")[-1]
        try:
            with open(f"/sys/fs/fuse/connections/{minor}/abort", "w") as f:
                f.write("1")
        except OSError:
            pass

    def _stop_daemon(self, first_wait=10):
        """Wait for the daemon to exit, then SIGTERM it (libfuse leaves its loop, unmounts and runs destroy), then
        abort the connection and SIGKILL it."""
        proc = self._proc
        if proc is None:
            return
        for sig, wait in ((None, first_wait), (signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            if sig is not None and proc.poll() is None:
                if sig == signal.SIGKILL:
                    for dev in _powerfs_mounts(os.path.realpath(self.mountpoint)):
                        self._abort_connection(dev)
                proc.send_signal(sig)
            try:
                proc.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._proc_rc = proc.poll()

    def unmount(self):
        """Unmount (a clean unmount unless a cut came first) and wait for the daemon to exit.  Idempotent."""
        with self._lock:
            proc = self._proc
        if proc is None:
            return
        if self._watchdog is not None:
            self._watchdog.cancel()
        mnt = os.path.realpath(self.mountpoint)
        try:
            if _powerfs_mounts(mnt):
                # a plain unmount first: when it succeeds the kernel has written back the page cache and the daemon
                # has answered DESTROY (made everything durable) before it returns; busy: detach lazily
                try:
                    done = subprocess.run(
                        ["fusermount3", "-u", mnt], stdin=subprocess.DEVNULL, capture_output=True, timeout=30
                    )
                    ok = done.returncode == 0
                except (OSError, subprocess.TimeoutExpired):
                    ok = False
                if not ok:  # busy (a file still open): detached now, the daemon would wait for the last close
                    self._detach(mnt)
                self._stop_daemon(10 if ok else 1)
            else:
                self._stop_daemon(1)
        finally:
            self._detach(mnt)
            with self._lock:
                self._proc = None
            if self._log is not None:
                self._final_log = self._read_log()
                self._log.close()
                self._log = None
        if _powerfs_mounts(mnt):
            raise PowerFSError(f"powerfs is still mounted on {mnt}")
        if self.aborted:
            raise PowerFSError(f"powerfs on {mnt} was aborted: still mounted {self.deadline} s after it was mounted")

    @property
    def mounted(self):
        return self._proc is not None and bool(_powerfs_mounts(os.path.realpath(self.mountpoint)))

    # -- the control file -------------------------------------------------------------------------------------------

    def command(self, line):
        """Write one command line to the control file (EINVAL: the daemon did not understand it)."""
        fd = os.open(self.ctl, os.O_WRONLY)
        try:
            os.write(fd, (line.rstrip("\n") + "\n").encode())
        finally:
            os.close(fd)

    def cut(self, mode="all", seed=0):
        """Power cut, then unmount.  Kill the workload's processes (and wait for them) BEFORE calling this.

        ``all``: everything not synced is lost.  ``random``: each unsynced page, and each file's size change, is
        kept or lost (a seeded coin); each directory keeps a random prefix of its unsynced entry changes.  ``torn``:
        as random, and a kept page may be written in part, at 512-byte sector granularity."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.command(f"cut {mode} {int(seed)}")
        self.unmount()

    def fail(self, k, errno, ops=None, path=None):
        """Fail the ``k``-th (1-based) mutating operation from now with ``errno`` (a number or a name such as
        "ENOSPC"), counting only the kinds in ``ops`` (e.g. ["write", "fsync"]) if given, and with ``path`` (a file
        under the mount point) only the writes, fsyncs, fallocates and truncates of that file.  One shot."""
        if isinstance(errno, int):
            errno = _errno.errorcode.get(errno, str(errno))
        line = f"fail {int(k)} {errno}"
        if ops or path is not None:
            line += " " + ",".join(ops or ("write", "fsync", "fallocate", "truncate"))
        if path is not None:
            line += f" {os.stat(self.backing / Path(path).relative_to(self.mountpoint)).st_ino}"
        self.command(line)

    def fail_off(self):
        self.command("fail off")

    def fsync_error(self, policy):
        """What an injected fsync failure leaves: "drop" (default, as Linux: the pages are no longer dirty, a later
        fsync does not write them) or "keep" (they stay dirty, a retried fsync writes them)."""
        self.command(f"fsync_error {policy}")

    def capacity(self, nbytes):
        """ENOSPC for writes, truncates and fallocates that would take the files past ``nbytes`` in total (None:
        no limit)."""
        self.command("capacity off" if nbytes is None else f"capacity {int(nbytes)}")

    def counters(self):
        """The control file's state: "ops" (every counted operation since the mount), one count per kind ("write",
        "fsync", "fallocate", "truncate", "create", "mknod", "mkdir", "unlink", "rmdir", "rename", "link",
        "symlink", "fsyncdir"), the armed failure, "injected", "dirty_pages", "journal" (pending entry changes)."""
        with open(self.ctl, "rb", buffering=0) as f:
            text = f.read(65536).decode()
        out = {}
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            out[key] = int(value) if value.lstrip("-").isdigit() else value
        return out


def run_then_kill(code, *args, timeout=30.0, cwd=None):
    """Run ``python -c code args...`` until it prints a line "ready", then SIGKILL it and wait for it to die.

    Every wait has a timeout (AssertionError when it passes); the child is killed whatever happens.  Returns what
    the child printed before "ready"."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
    )
    out = b""
    try:
        end = time.monotonic() + timeout
        while b"ready\n" not in out:
            left = end - time.monotonic()
            if left <= 0:
                raise AssertionError(f"the child did not get ready within {timeout} s: {out!r}")
            ready, _, _ = select.select([proc.stdout], [], [], left)
            if ready:
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    err = proc.stderr.read().decode(errors="replace") if proc.wait(timeout) is not None else ""
                    raise AssertionError(f"the child exited ({proc.returncode}) before ready: {out!r} {err}")
                out += chunk
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout)
        proc.stdout.close()
        proc.stderr.close()
    return out.split(b"ready\n")[0].decode()
