"""Stub for the compiled localmq._frame: the frames of the embedded queue's partition files."""

from typing import AbstractSet, List, Optional, Tuple

from _typeshed import ReadableBuffer

from localmq._mapped_file import MappedFile
from localmq._record import Message
from localmq.status import Stop

def frame_size(body_len: int, props_len: int) -> int: ...
def write_frame(
    mf: MappedFile, pos: int, body: ReadableBuffer, props: bytes, store_ts: int, born_ts: int, flag: int = 0
) -> int: ...
def walk_frames(
    data: ReadableBuffer, start: int = 0, end: int = -1, check_crc: bool = True
) -> Tuple[List[int], int, Stop]: ...
def read_frames(
    data: ReadableBuffer,
    topic: str,
    queue_id: int,
    first_index: int,
    base_offset: int,
    max_messages: int,
    tag_names: Optional[AbstractSet[str]] = None,
    max_frames: int = -1,
    check_crc: bool = False,
) -> Tuple[List[Message], int]: ...
def stored_message(
    topic: str,
    body: bytes | memoryview,
    props: dict[str, str],
    queue_id: int,
    queue_offset: int,
    store_ts: int,
    born_ts: int,
    flag: int = 0,
    raw: Optional[bytes] = None,
) -> Message: ...
