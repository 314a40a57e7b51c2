"""Stub for the compiled localmq.store.put_result: what a put or put_batch answers."""

from typing import Optional

from typing_extensions import disjoint_base

from localmq.status import PutStatus

@disjoint_base
class PutResult:
    """Result of a put or put_batch."""

    status: PutStatus
    uniq_key: Optional[str]
    @property
    def physical_offset(self) -> int: ...
    @property
    def queue_offset(self) -> int: ...
    @property
    def wrote_bytes(self) -> int: ...
    @property
    def store_timestamp(self) -> int: ...
    @property
    def msg_num(self) -> int: ...
    @property
    def msg_id(self) -> Optional[str]: ...
    @property
    def ok(self) -> bool: ...

def make_put_result(
    status: PutStatus, physical_offset: int, queue_offset: int, wrote_bytes: int, store_timestamp: int, msg_num: int = 1
) -> PutResult: ...
