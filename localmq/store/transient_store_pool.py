"""TransientStorePool: locked write buffers that the CommitLog writes into before they are committed to a file."""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Optional

from localmq._mapped_file import WriteBuffer

log = logging.getLogger("localmq.transient_store_pool")


class TransientStorePool:
    """Up to ``pool_size`` buffers of ``file_size`` bytes (anonymous memory, mlocked when the OS allows).

    Unlike RocketMQ, which allocates every buffer at start-up, buffers are created on first use (up to the
    pool size) and then reused: opening a store does not lock gigabytes before the first put. An mlock refusal
    (no privilege, RLIMIT_MEMLOCK) leaves the buffer unlocked and logs one warning per pool.
    Thread-safe.
    """

    def __init__(self, pool_size: int, file_size: int, *, lock: bool = True):
        if pool_size < 1:
            raise ValueError("transient_store_pool_size must be at least 1")
        self.pool_size = pool_size
        self.file_size = file_size
        self.lock = lock
        self._free: deque[WriteBuffer] = deque()
        self._created = 0
        self._mutex = threading.Lock()
        self._warned = False
        self.borrow_failures = 0

    def borrow(self) -> Optional[WriteBuffer]:
        """A free buffer, a new one while fewer than ``pool_size`` exist, else None (the caller writes direct).

        Raises OSError (ENOMEM) when a new buffer cannot be mapped.
        """
        with self._mutex:
            if self._free:
                return self._free.popleft()
            if self._created >= self.pool_size:
                self.borrow_failures += 1
                return None
            self._created += 1
        try:
            buf = WriteBuffer(self.file_size, self.lock)
        except BaseException:
            with self._mutex:
                self._created -= 1
            raise
        if self.lock and not buf.locked and not self._warned:
            self._warned = True
            log.warning(
                "transient store pool: mlock of a %d-byte buffer refused (%s); buffers stay unlocked",
                self.file_size,
                buf.lock_error,
            )
        return buf

    def give_back(self, buf: WriteBuffer) -> None:
        """Return a buffer whose file is fully committed."""
        with self._mutex:
            self._free.append(buf)

    @property
    def available(self) -> int:
        """Buffers that borrow() can hand out without waiting (free plus not yet created)."""
        with self._mutex:
            return len(self._free) + self.pool_size - self._created

    def close(self) -> None:
        """Drop the free buffers (their memory is unmapped when the last reference goes)."""
        with self._mutex:
            self._free.clear()
