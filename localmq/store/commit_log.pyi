"""Stub for the compiled localmq.store.commit_log: the CommitLog put path."""

import logging
from typing import Any, Callable, Iterable, List, Mapping, Optional, Tuple, Union

from typing_extensions import Self, disjoint_base

from localmq._mapped_file import MappedFile
from localmq._native import Event
from localmq._shm import ControlFile
from localmq.status import PutStatus
from localmq.store.group_commit import GroupCommit
from localmq.store.mapped_file_queue import MappedFileQueue
from localmq.store.put_args import PutExtra as PutExtra
from localmq.store.put_args import TopicEntry as TopicEntry
from localmq.store.put_result import PutResult

log: logging.Logger

_Body = Union[bytes, bytearray, memoryview]
_Keys = Union[str, Iterable[str], None]

@disjoint_base
class CommitLog:
    """All topics' records in one log of fixed-size segments (RocketMQ's CommitLog)."""

    @property
    def mapped_file_queue(self) -> MappedFileQueue: ...
    @property
    def file_size(self) -> int: ...
    @property
    def max_message_size(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def forked(self) -> bool: ...
    create_failed_hook: Optional[Callable[..., Any]]
    topic_miss: Optional[Callable[[str], List[Tuple[int, int]]]]
    refuse_status: Optional[PutStatus]
    @property
    def puts(self) -> int: ...
    @property
    def put_failures(self) -> int: ...
    @property
    def last_failure(self) -> Optional[str]: ...
    @property
    def sync_failure(self) -> Optional[OSError]: ...
    def fail_sync(self, error: OSError) -> None: ...
    @property
    def ctl(self) -> Optional[ControlFile]: ...
    lock_timeout: float
    @property
    def repairs(self) -> int: ...
    def attach_control(self, ctl: ControlFile, lock_timeout: float = 10.0) -> None: ...
    def sync_view(self) -> int: ...
    def check_writer(self) -> bool: ...
    def set_shared_sync_flush(self, timeout_ms: int) -> None: ...
    def serve_shared_flush(self, mf: MappedFile, idle_us: int) -> Tuple[int, int, int]: ...
    def tune_shared_flush(self, gather_permille: int) -> None: ...
    def shared_flush_stats(self) -> dict[str, int]: ...
    def stop_shared_flush(self, stop: bool = ...) -> None: ...
    def __new__(
        cls, mapped_file_queue: MappedFileQueue, *, max_message_size: int, store_host: str, born_host: str
    ) -> Self: ...
    def set_group_commit(self, gc: Optional[GroupCommit], timeout_ms: int) -> None: ...
    def set_dispatch_event(self, event: Optional[Event]) -> None: ...
    def set_queue_offset(self, topic: str, queue_id: int, next_offset: int) -> None: ...
    def queue_offset(self, topic: str, queue_id: int) -> int: ...
    def topic_table(self) -> dict[Tuple[str, int], int]: ...
    def reset_write_segment(self) -> None: ...
    @property
    def max_offset(self) -> int: ...
    def put(
        self,
        topic: str,
        body: _Body,
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys: _Keys = None,
        properties: Optional[Mapping[str, str]] = None,
        flag: int = 0,
    ) -> PutResult: ...
    def put_batch(
        self,
        topic: str,
        bodies: Iterable[_Body],
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys: _Keys = None,
        properties: Optional[Mapping[str, str]] = None,
        flag: int = 0,
    ) -> PutResult: ...
    def put_ext(
        self,
        topic: str,
        body: _Body,
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys: _Keys = None,
        properties: Optional[Mapping[str, str]] = None,
        flag: int = 0,
        extra: PutExtra,
    ) -> PutResult: ...
    def close(self) -> None: ...

@disjoint_base
class CommitLogFront:
    """Base class of LocalMessageQueue: put and put_batch hand their arguments to ``commit_log`` at C level."""

    commit_log: Optional[CommitLog]
    def put(
        self,
        topic: str,
        body: _Body,
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys: _Keys = None,
        properties: Optional[Mapping[str, str]] = None,
        flag: int = 0,
    ) -> PutResult: ...
    def put_batch(
        self,
        topic: str,
        bodies: Iterable[_Body],
        *,
        queue_id: int = 0,
        tags: Optional[str] = None,
        keys: _Keys = None,
        properties: Optional[Mapping[str, str]] = None,
        flag: int = 0,
    ) -> PutResult: ...
