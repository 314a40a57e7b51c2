"""Stub for the compiled localmq._snapshot: the queue snapshot's rows parsed in one pass."""

from typing import Dict, Iterable, List, Optional, Tuple, final

@final
class QueueRow:
    """One queue's row: its directory's stamps, its ends and its files' (base offset, ctime ns, inode)."""

    @property
    def dir_ctime(self) -> int: ...
    @property
    def dir_ino(self) -> int: ...
    @property
    def max_offset(self) -> int: ...
    @property
    def min_offset(self) -> int: ...
    @property
    def max_physic_offset(self) -> int: ...
    @property
    def files(self) -> Tuple[Tuple[int, int, int], ...]: ...
    @property
    def n_files(self) -> int: ...
    @property
    def file_rows(self) -> bytes: ...
    def __init__(
        self,
        dir_ctime: int,
        dir_ino: int,
        max_offset: int,
        min_offset: int,
        max_physic_offset: int,
        files: Iterable[Tuple[int, int, int]],
    ) -> None: ...

@final
class TopicRow:
    """One topic's row, its queues' rows, and its vouched rows of valid queue ids as parallel keys and rows."""

    @property
    def dir_ctime(self) -> int: ...
    @property
    def dir_ino(self) -> int: ...
    @property
    def queues(self) -> Dict[int, QueueRow]: ...
    @property
    def keys(self) -> List[Tuple[str, int]]: ...
    @property
    def rows(self) -> List[QueueRow]: ...
    @property
    def others(self) -> List[int]: ...
    def __init__(
        self,
        dir_ctime: int,
        dir_ino: int,
        queues: Optional[Dict[int, QueueRow]] = None,
        keys: Optional[List[Tuple[str, int]]] = None,
        rows: Optional[List[QueueRow]] = None,
        others: Optional[List[int]] = None,
    ) -> None: ...

def parse_topic_rows(body: bytes, pos: int, n_topics: int) -> Dict[str, TopicRow]: ...
