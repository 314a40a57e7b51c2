"""StoreLock: the ``lock`` file that keeps a second writer (localmq or a RocketMQ broker) off a store."""

from __future__ import annotations

import errno
import fcntl
import logging
import os

from localmq.errors import StoreLockedError, io_operation
from localmq.layout import LOCK_FILE

log = logging.getLogger("localmq.store")

_BUSY = (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK)


class StoreLock:
    """The ``lock`` file: flock (other localmq stores, this process included) + a POSIX record lock on byte 0
    (what RocketMQ's FileChannel.tryLock takes, so a broker on the same directory is refused as well).

    ``shared=False``: this process alone writes the store (both locks exclusive). ``shared=True``: one of the
    processes sharing the store (both locks shared: any number of them, never beside an exclusive holder or a
    broker, whose exclusive byte-0 lock conflicts with ours).

    Raises StoreLockedError when a holder of the other kind (or a broker) holds it; its ``shared_holders`` tells
    whether the store is held by processes sharing it (then ``shared=True`` would attach).
    """

    # (st_dev, st_ino) of every lock file this process holds -> "exclusive" or "shared". Who asks about a lock file
    # must not open it when this process holds it: closing any descriptor of a file drops the process's POSIX locks
    # on it (fcntl's rule), which would let a broker or another process in.
    held: dict[tuple[int, int], str] = {}

    def __init__(self, root: str, shared: bool = False) -> None:
        self.path = os.path.join(root, LOCK_FILE)
        self.shared = shared
        self.created = False  # this lock created the file (a failed open removes it again)
        for _ in range(100):
            fd = self._acquire(root, shared)
            # a failed open removes the lock file it created, under the lock: a lock taken on that removed file
            # keeps nobody out, so take it again on the file now at the path
            st: os.stat_result | None
            now: os.stat_result | None
            try:
                st, now = os.fstat(fd), os.stat(self.path)
            except FileNotFoundError:
                st = now = None
            if st is not None and now is not None and (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino):
                break
            os.close(fd)
        else:
            raise StoreLockedError(errno.EAGAIN, f"the lock file of {root} keeps being replaced", self.path)
        self.fd = fd
        self._key = (st.st_dev, st.st_ino)
        StoreLock.held[self._key] = "shared" if shared else "exclusive"

    def _acquire(self, root: str, shared: bool) -> int:
        try:
            with io_operation("create", self.path):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            self.created = True
        except FileExistsError:
            with io_operation("open", self.path):
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        kind = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(fd, kind | fcntl.LOCK_NB)
            fcntl.lockf(fd, kind | fcntl.LOCK_NB, 1, 0)
        except OSError as e:
            if e.errno not in _BUSY:
                os.close(fd)
                raise
            holders_shared = False
            if not shared:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    holders_shared = True
                except OSError:
                    pass
            os.close(fd)
            if holders_shared:
                msg = (
                    f"store {root} is open by processes sharing it: open it with shared=True to join them "
                    f"(localmq.open(path) does so by itself)"
                )
            elif shared:
                msg = f"store {root} is open by a process that holds it alone (opened with shared=False) or a broker"
            else:
                msg = f"store {root} is already open by another writer"
            err = StoreLockedError(errno.EAGAIN, msg, self.path)
            err.shared_holders = holders_shared
            raise err from None
        return fd

    def stamp(self) -> None:
        """Write "lock" into the file, as a broker does, once the open succeeded (a failed open changes no byte)."""
        if not self.shared and self.fd >= 0:
            try:
                os.pwrite(self.fd, b"lock", 0)
            except OSError as e:  # only a broker's habit: the lock is the flock, the open stands
                log.warning("cannot write into %s: %s", self.path, e)

    def exclusive(self) -> bool:
        """Whether this process holds the store alone right now: the flock is (or can be made) exclusive.

        A shared holder asks before undoing a failed open; converting may drop its shared lock (it is about to
        release it anyway)."""
        if self.fd < 0:
            return False
        if not self.shared:
            return True
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    def release(self) -> None:
        """Drop both locks and close the file. Idempotent."""
        if self.fd >= 0:
            StoreLock.held.pop(self._key, None)
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = -1
