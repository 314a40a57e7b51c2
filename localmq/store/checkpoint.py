"""The store checkpoint: five big-endian int64 values at the start of the 4 KiB ``<root>/checkpoint`` file."""

import errno
import os
import threading
from dataclasses import dataclass
from typing import Any

from localmq._native import fdatasync, fsync_dir
from localmq.errors import CorruptStoreError, NotAStoreError, StoreClosedError, StoreIOError, io_operation
from localmq.layout import CHECKPOINT, CHECKPOINT_FILE_SIZE

__all__ = ["CHECKPOINT_FILE_SIZE", "Checkpoint", "StoreCheckpoint", "read_checkpoint"]

# Slack RocketMQ subtracts from the physic / logics times before using them as a recovery bound.
RECOVERY_SLACK_MS = 3000


def _min_timestamp(physic: int, logics: int) -> int:
    return max(0, min(physic, logics) - RECOVERY_SLACK_MS)


@dataclass(frozen=True)
class Checkpoint:
    """The five checkpoint values as read from a file (ms timestamps; offsets are 0 in files RocketMQ 4.x wrote)."""

    physic_msg_timestamp: int
    logics_msg_timestamp: int
    index_msg_timestamp: int
    master_flushed_offset: int = 0
    confirm_phy_offset: int = 0

    @property
    def min_timestamp(self) -> int:
        """max(0, min(physic, logics) - 3000): records stored before this time are known to be dispatched."""
        return _min_timestamp(self.physic_msg_timestamp, self.logics_msg_timestamp)

    @property
    def min_timestamp_index(self) -> int:
        """min(min_timestamp, index): the same bound when the index must be safe too."""
        return min(self.min_timestamp, self.index_msg_timestamp)


def _unpack(data: bytes, path: str) -> tuple[Any, ...]:
    if len(data) < CHECKPOINT.size:
        raise CorruptStoreError(f"checkpoint {path} holds {len(data)} bytes, fewer than {CHECKPOINT.size}")
    return CHECKPOINT.unpack_from(data, 0)


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read a checkpoint file without writing to it (works on read-only copies).

    :param path: the ``checkpoint`` file.
    :returns: a frozen ``Checkpoint``.
    :raises NotAStoreError: (a FileNotFoundError) when the file does not exist.
    :raises CorruptStoreError: when it is shorter than 40 bytes.
    :raises OSError: for other read failures.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read(CHECKPOINT.size)
    except FileNotFoundError:
        raise NotAStoreError(errno.ENOENT, "no checkpoint file", path) from None
    return Checkpoint(*_unpack(data, path))


class StoreCheckpoint:
    """The writable checkpoint of a store, opened or created at ``path``.

    A new file (or an empty one left by a crash during creation) is pre-sized to 4096 zero bytes and synced
    together with its directory; a shorter existing file of at least 40 bytes is extended to 4096. The five
    fields are plain attributes: update them, then call ``flush()`` to persist all of them at once.

    Threads: one writer thread at a time updates the fields (in localmq the flush service); ``flush()`` holds
    an internal lock, so concurrent ``flush()`` / ``close()`` calls are serialised and each writes one
    consistent snapshot of the fields.

    :param path: the ``checkpoint`` file; missing parent directories are created.
    :raises CorruptStoreError: when an existing file holds 1 to 39 bytes.
    :raises OSError: when the file cannot be opened, sized or synced (e.g. PermissionError on a read-only file).
    """

    physic_msg_timestamp: int
    logics_msg_timestamp: int
    index_msg_timestamp: int
    master_flushed_offset: int
    confirm_phy_offset: int

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        # Serialises flush() and close(); no other lock is taken while it is held.
        self._lock = threading.Lock()
        parent = os.path.dirname(os.path.abspath(self.path))
        with io_operation("mkdir", parent):
            os.makedirs(parent, exist_ok=True)
        with io_operation("open", self.path):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            if 0 < size < CHECKPOINT.size:
                raise CorruptStoreError(f"checkpoint {self.path} holds {size} bytes, fewer than {CHECKPOINT.size}")
            if size < CHECKPOINT_FILE_SIZE:
                with io_operation("ftruncate", self.path):
                    os.ftruncate(fd, CHECKPOINT_FILE_SIZE)
                # its block reserved now: a flush on a full disk (the one at close, say) must not need a new one
                with io_operation("fallocate", self.path):
                    os.posix_fallocate(fd, 0, CHECKPOINT_FILE_SIZE)
                fdatasync(fd, path=self.path)
                if size == 0:  # new, or created by a run that crashed before this sync
                    fsync_dir(parent)
            with io_operation("read", self.path):
                values = _unpack(os.pread(fd, CHECKPOINT.size, 0), self.path)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        (
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        ) = values

    @property
    def closed(self) -> bool:
        """True once ``close()`` has run."""
        return self._fd < 0

    @property
    def min_timestamp(self) -> int:
        """max(0, min(physic, logics) - 3000) from the current field values."""
        return _min_timestamp(self.physic_msg_timestamp, self.logics_msg_timestamp)

    @property
    def min_timestamp_index(self) -> int:
        """min(min_timestamp, index_msg_timestamp) from the current field values."""
        return min(self.min_timestamp, self.index_msg_timestamp)

    def snapshot(self) -> Checkpoint:
        """The current field values as a frozen ``Checkpoint`` (not necessarily flushed yet)."""
        return Checkpoint(
            self.physic_msg_timestamp,
            self.logics_msg_timestamp,
            self.index_msg_timestamp,
            self.master_flushed_offset,
            self.confirm_phy_offset,
        )

    def flush(self) -> None:
        """Write the five fields at offset 0 and fdatasync the file.

        :raises StoreClosedError: after ``close()``.
        :raises StoreIOError: (an OSError naming the file) when the write or the sync fails. A later flush writes
            the fields again, so retrying after a failed sync is safe here (unlike a mapped segment's flush).
        """
        with self._lock:
            if self._fd < 0:
                raise StoreClosedError(f"checkpoint {self.path} is closed")
            data = CHECKPOINT.pack(
                self.physic_msg_timestamp,
                self.logics_msg_timestamp,
                self.index_msg_timestamp,
                self.master_flushed_offset,
                self.confirm_phy_offset,
            )
            with io_operation("write", self.path):
                n = os.pwrite(self._fd, data, 0)
            if n != len(data):
                raise StoreIOError(
                    errno.EIO, f"short write to the checkpoint ({n} of {len(data)} bytes)", self.path, operation="write"
                )
            fdatasync(self._fd, path=self.path)

    def close(self) -> None:
        """Close the file without writing (call ``flush()`` first to persist the fields). Idempotent."""
        with self._lock:
            if self._fd >= 0:
                fd, self._fd = self._fd, -1
                os.close(fd)

    def __enter__(self) -> "StoreCheckpoint":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"StoreCheckpoint({self.path!r}, physic={self.physic_msg_timestamp}, "
            f"logics={self.logics_msg_timestamp}, index={self.index_msg_timestamp})"
        )
