"""StoreLock: the ``lock`` file that keeps a second writer (localmq or a RocketMQ broker) off a store."""
from __future__ import annotations

import errno
import fcntl
import os

from localmq.errors import StoreLockedError
from localmq.layout import LOCK_FILE


class StoreLock:
    """The ``lock`` file: flock (other localmq stores, this process included) + a POSIX record lock on byte 0
    (what RocketMQ's FileChannel.tryLock takes, so a broker on the same directory is refused as well).

    Raises StoreLockedError when another writer holds it.
    """

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, LOCK_FILE)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise StoreLockedError(errno.EAGAIN, f"store {root} is already open by another writer",
                                       self.path) from None
            raise
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
