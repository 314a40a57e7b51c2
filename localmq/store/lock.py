"""StoreLock: the ``lock`` file that keeps a second writer (localmq or a RocketMQ broker) off a store."""
from __future__ import annotations

import errno
import fcntl
import os

from localmq.errors import StoreLockedError
from localmq.layout import LOCK_FILE

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

    def __init__(self, root: str, shared: bool = False) -> None:
        self.path = os.path.join(root, LOCK_FILE)
        self.shared = shared
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
                msg = (f"store {root} is open by processes sharing it: open it with shared=True to join them "
                       f"(localmq.open(path) does so by itself)")
            elif shared:
                msg = f"store {root} is open by a process that holds it alone (opened with shared=False) or a broker"
            else:
                msg = f"store {root} is already open by another writer"
            err = StoreLockedError(errno.EAGAIN, msg, self.path)
            err.shared_holders = holders_shared
            raise err from None
        if not shared:
            os.pwrite(fd, b"lock", 0)
        self.fd = fd

    def release(self) -> None:
        """Drop both locks and close the file. Idempotent."""
        if self.fd >= 0:
            try:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = -1
