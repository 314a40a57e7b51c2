"""Stub for the compiled localmq._native (checked, GIL-free wrappers over csrc/)."""

from _typeshed import StrOrBytesPath
from typing_extensions import disjoint_base

ADV_NORMAL: int
ADV_RANDOM: int
ADV_SEQUENTIAL: int
ADV_WILLNEED: int
ADV_DONTNEED: int
PAGE_SIZE: int

@disjoint_base
class Event:
    """A wake-up event in C (mutex + condition variable); only the compiled modules use it."""

def fdatasync(fd: int, *, full: bool = False, path: StrOrBytesPath | None = None) -> None: ...
def fsync_dir(path: StrOrBytesPath) -> None: ...
def mkdirs(path: StrOrBytesPath) -> tuple[int, int]: ...
def fallocate(fd: int, offset: int, length: int, *, path: StrOrBytesPath | None = None) -> None: ...
def now_ms() -> int: ...
