"""Stub for the compiled localmq.store.shared_commit: the commit protocol of a store shared between processes."""

import logging
from typing import Any

from typing_extensions import Self, disjoint_base

from localmq._shm import ControlFile

log: logging.Logger

@disjoint_base
class SharedCommit:
    """A CommitLog's side of a store shared between processes (``CommitLog.attach_control``)."""

    @property
    def ctl(self) -> ControlFile: ...
    lock_timeout: float
    @property
    def repairs(self) -> int: ...
    def __new__(cls, ctl: ControlFile, mapped_file_queue: Any, lock_timeout: float) -> Self: ...
    def committed_end(self) -> int: ...
