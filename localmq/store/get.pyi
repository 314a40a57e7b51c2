"""Stub for the compiled localmq.store.get: the read path (ConsumeQueue units -> CommitLog records)."""

from typing import AbstractSet, List, Optional, Tuple

from typing_extensions import Self, disjoint_base

from localmq._mapped_file import MappedFile
from localmq._record import Message
from localmq.status import GetBodiesResult, GetResult
from localmq.store.consume_queue import ConsumeQueue

@disjoint_base
class GetLimits:
    """The pull limits of one get (RocketMQ's maxTransfer{Count,Bytes}OnMessageIn{Memory,Disk})."""

    @property
    def max_count_mem(self) -> int: ...
    @property
    def max_bytes_mem(self) -> int: ...
    @property
    def max_count_disk(self) -> int: ...
    @property
    def max_bytes_disk(self) -> int: ...
    @property
    def disk_threshold(self) -> int: ...
    def __new__(
        cls, max_count_mem: int, max_bytes_mem: int, max_count_disk: int, max_bytes_disk: int, disk_threshold: int
    ) -> Self: ...

def get_message(
    cq: ConsumeQueue,
    commit_log_files: List[MappedFile],
    seg_size: int,
    offset: int,
    max_messages: int,
    tag_hashes: Tuple[int, ...],
    tag_names: Optional[AbstractSet[str]],
    limits: GetLimits,
    commit_log_max: int,
    copy_body: bool,
    min_offset: int,
    max_offset: int,
    check_crc: bool = False,
) -> GetResult[Message]: ...

BODY_FIELDS: Tuple[str, ...]

def get_bodies(
    cq: ConsumeQueue,
    commit_log_files: List[MappedFile],
    seg_size: int,
    offset: int,
    max_messages: int,
    tag_hashes: Tuple[int, ...],
    tag_names: Optional[AbstractSet[str]],
    limits: GetLimits,
    commit_log_max: int,
    min_offset: int,
    max_offset: int,
    check_crc: bool,
    fields: Tuple[str, ...],
) -> GetBodiesResult: ...
def check_unit(
    cq: ConsumeQueue, commit_log_files: List[MappedFile], seg_size: int, index: int, phys: int, size: int
) -> Optional[str]: ...
def first_bad_unit(
    cq: ConsumeQueue, commit_log_files: List[MappedFile], seg_size: int, start: int, end: int, log_end: int
) -> Tuple[int, Optional[str]]: ...
def read_record(
    commit_log_files: List[MappedFile], seg_size: int, phys: int, copy_body: bool = True
) -> Optional[Message]: ...
def record_store_timestamp(commit_log_files: List[MappedFile], seg_size: int, phys: int) -> int: ...
