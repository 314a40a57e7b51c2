"""ControlView: a read-only look at a shared store's control file (no lock taken, nothing written)."""

from __future__ import annotations

import fcntl
import mmap
import os
import struct
from typing import Optional

from localmq import _shm
from localmq.errors import ControlFileError
from localmq.layout import (
    CTL_FILE,
    CTL_FILE_SIZE,
    CTL_H_MAGIC,
    CTL_H_VERSION,
    CTL_LOCK_BYTE_OPEN,
    CTL_MAGIC,
    CTL_ROWS_OFF,
    CTL_S_READY,
    CTL_S_WPOS,
    CTL_T_DISPATCHED,
    CTL_T_NAME,
    CTL_T_NAME_LEN,
    CTL_T_STATE,
    CTL_TOPIC_COUNT,
    CTL_TOPIC_QUEUES,
    CTL_TOPIC_ROW,
    CTL_TOPIC_SLOTS,
    CTL_TOPICS_OFF,
    CTL_VERSION,
)

_I64 = struct.Struct("=q")
_U32 = struct.Struct("=I")
# struct flock on Linux x86_64 / aarch64: short l_type, short l_whence, (pad), off_t l_start, off_t l_len, pid_t l_pid
_FLOCK = struct.Struct("hh4xqqi4x")


def _held_by_others(fd: int, byte: int) -> bool:
    """Does another process hold any lock on ``byte`` of ``fd``'s file (F_GETLK, which takes no lock)?"""
    req = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, byte, 1, 0)
    l_type: int = _FLOCK.unpack(fcntl.fcntl(fd, fcntl.F_GETLK, req))[0]
    return l_type != fcntl.F_UNLCK


class ControlView:
    """The control file of a store shared by live processes, mapped PROT_READ: the committed end and the per-queue
    unit counts its housekeeper publishes. ``open`` returns None when there is no such file or no live process
    is attached to it (then the files on disk are the whole truth)."""

    def __init__(self, fd: int, mm: mmap.mmap, path: str) -> None:
        self.fd = fd
        self.mm = mm
        self.path = path

    @classmethod
    def open(cls, root: str) -> Optional[ControlView | _OpenFileView]:
        path = os.path.join(root, CTL_FILE)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        if (st.st_dev, st.st_ino) in _shm._open_files:
            # open in this process by a shared store: read through its ControlFile. Never a descriptor of our own:
            # closing one would drop every lock this process holds on the file (its slot, its attachment, maybe
            # the housekeeper's byte), as POSIX record locks go with any close
            cf = _shm._by_key.get((st.st_dev, st.st_ino))
            if cf is None or cf.closed:
                raise ControlFileError(f"{path} is open in this process by a shared store: read through that one")
            return _OpenFileView(cf)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if not _held_by_others(fd, CTL_LOCK_BYTE_OPEN):
                os.close(fd)
                return None
            head = os.pread(fd, 8, 0)
            if len(head) == 8 and _U32.unpack_from(head, CTL_H_MAGIC)[0] == CTL_MAGIC:
                version = _U32.unpack_from(head, CTL_H_VERSION)[0]
                if version != CTL_VERSION:
                    # live processes of another localmq version: their committed end is not known here, and reading
                    # past it would take a put being copied for damage
                    raise ControlFileError(
                        f"{path} is version {version} (a process of another localmq version "
                        f"shares this store), this localmq reads {CTL_VERSION}: read it with "
                        f"that version, or once its processes have closed it"
                    )
            if st.st_size < CTL_FILE_SIZE:
                os.close(fd)
                return None
            mm = mmap.mmap(fd, CTL_FILE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        except BaseException:
            os.close(fd)
            raise
        view = cls(fd, mm, path)
        if (
            _U32.unpack_from(mm, CTL_H_MAGIC)[0] != CTL_MAGIC
            or _U32.unpack_from(mm, CTL_H_VERSION)[0] != CTL_VERSION
            or view.load(CTL_S_READY) != 1
        ):
            view.close()
            return None
        return view

    def load(self, off: int) -> int:
        """The int64 at byte ``off`` (an aligned 8-byte load: whole on every platform localmq runs on)."""
        value: int = _I64.unpack_from(self.mm, off)[0]
        return value

    def dispatched(self, topic: str, queue_id: int) -> Optional[int]:
        """Units in (topic, queue)'s ConsumeQueue as published by the housekeeper; None when the topic has no row."""
        if not 0 <= queue_id < CTL_TOPIC_QUEUES:
            return None
        name = topic.encode("ascii")
        h = 1469598103934665603
        for b in name:
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
        i = h % CTL_TOPIC_SLOTS
        mm = self.mm
        for _ in range(CTL_TOPIC_SLOTS):
            v = _U32.unpack_from(mm, CTL_TOPICS_OFF + 4 * i)[0]
            if v == 0:
                return None  # rows are never removed: an empty slot ends the probe sequence
            if v <= CTL_TOPIC_COUNT:
                row = CTL_ROWS_OFF + (v - 1) * CTL_TOPIC_ROW
                n = _U32.unpack_from(mm, row + CTL_T_NAME_LEN)[0]
                if (
                    _U32.unpack_from(mm, row + CTL_T_STATE)[0] == 1
                    and n == len(name)
                    and mm[row + CTL_T_NAME : row + CTL_T_NAME + n] == name
                ):
                    return self.load(row + CTL_T_DISPATCHED + 8 * queue_id)
            i = (i + 1) % CTL_TOPIC_SLOTS
        return None

    def close(self) -> None:
        # closing this descriptor drops no lock: a view never takes one
        if self.fd >= 0:
            self.mm.close()
            os.close(self.fd)
            self.fd = -1


class _OpenFileView:
    """ControlView's reads over the ControlFile this process already has open (a shared store of this process)."""

    def __init__(self, cf: _shm.ControlFile) -> None:
        self.cf = cf

    def load(self, off: int) -> int:
        return self.cf.load(off)

    def dispatched(self, topic: str, queue_id: int) -> Optional[int]:
        if not 0 <= queue_id < CTL_TOPIC_QUEUES:
            return None
        row = self.cf.topic_row(topic)
        return None if row < 0 else self.cf.load(row + CTL_T_DISPATCHED + 8 * queue_id)

    def close(self) -> None:
        pass  # the ControlFile belongs to the shared store


def committed_end(root: str) -> Optional[int]:
    """The committed end of the CommitLog that the live processes sharing the store at ``root`` publish in its
    control file, or None when no process shares it (read without a lock; nothing is written)."""
    try:
        view = ControlView.open(root)
    except (ControlFileError, OSError):
        return None
    if view is None:
        return None
    try:
        return view.load(CTL_S_WPOS)
    finally:
        view.close()
