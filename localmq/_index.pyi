"""Stub for the compiled localmq._index: RocketMQ index files (hash slots and linked items)."""

from typing import Tuple

import numpy as np
import numpy.typing as npt
from _typeshed import ReadableBuffer, WriteableBuffer

from localmq.status import Stop

# ``pages``: one byte per 4 KiB page of the file (a uint8 numpy array in localmq)
_Pages = npt.NDArray[np.uint8] | WriteableBuffer | None

def key_hash(key: str | bytes) -> int: ...
def put_key(
    buf: WriteableBuffer,
    slot_num: int,
    index_num: int,
    key_hash: int,
    phy: int,
    ts: int,
    fd: int = ...,
    pages: _Pages = ...,
) -> bool: ...
def select_offsets(
    buf: ReadableBuffer,
    slot_num: int,
    key_hash: int,
    begin: int,
    end: int,
    max_num: int,
    pages: npt.NDArray[np.uint8] | ReadableBuffer | None = ...,
) -> npt.NDArray[np.int64]: ...
def index_rows(
    buf: WriteableBuffer | None,
    slot_num: int,
    index_num: int,
    data: ReadableBuffer,
    phys: npt.NDArray[np.int64],
    store_ts: npt.NDArray[np.int64],
    sys_flag: npt.NDArray[np.int32],
    topic_pos: npt.NDArray[np.int64],
    topic_len: npt.NDArray[np.int32],
    props_pos: npt.NDArray[np.int64],
    props_len: npt.NDArray[np.int32],
    row: int,
    key: int,
    count: int,
    fd: int = ...,
    pages: _Pages = ...,
) -> Tuple[Stop, int, int, int]: ...
