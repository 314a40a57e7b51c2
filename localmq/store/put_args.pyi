"""Stub for the compiled localmq.store.put_args: a topic's queue offsets and a re-put's record fields."""

from typing import Optional, Union

from typing_extensions import Self, disjoint_base, final

@disjoint_base
class TopicEntry:
    """Per-topic put state: the encoded name and the next queue offset of each queue id."""

    @property
    def topic(self) -> str: ...
    @property
    def encoded(self) -> bytes: ...
    def __new__(cls, topic: str) -> Self: ...
    def next_offset(self, queue_id: int) -> int: ...
    def queue_ids(self) -> list[int]: ...

@final
class PutExtra:
    """The record fields of a broker-side re-put (``CommitLog.put_ext``)."""

    @property
    def sys_flag(self) -> int: ...
    @property
    def born_timestamp(self) -> int: ...
    @property
    def born_host(self) -> Optional[bytes]: ...
    @property
    def store_host(self) -> Optional[bytes]: ...
    @property
    def reconsume_times(self) -> int: ...
    @property
    def prepared_transaction_offset(self) -> int: ...
    @property
    def raw_properties(self) -> Optional[bytes]: ...
    def __init__(
        self,
        *,
        sys_flag: int = 0,
        born_timestamp: int = -1,
        born_host: Union[str, bytes, None] = None,
        store_host: Union[str, bytes, None] = None,
        reconsume_times: int = 0,
        prepared_transaction_offset: int = 0,
        raw_properties: Optional[bytes] = None,
    ) -> None: ...
