"""Stub for the compiled localmq._columns: columnar decode of CommitLog ranges into numpy and Arrow buffers."""

from typing import Any, Optional, Tuple

import numpy as np
import numpy.typing as npt
from _typeshed import ReadableBuffer
from typing_extensions import disjoint_base

from localmq.status import Stop

_Int32s = npt.NDArray[np.int32]
_Int64s = npt.NDArray[np.int64]
_UInt8s = npt.NDArray[np.uint8]
_Rows = Optional[npt.ArrayLike]

COLUMN_DTYPES: Tuple[Tuple[str, type[np.generic]], ...]

@disjoint_base
class RecordColumns:
    """Preallocated numpy columns that ``decode_range`` fills: one row per record."""

    def release(self) -> None: ...
    @property
    def capacity(self) -> int: ...
    @property
    def count(self) -> int: ...
    @property
    def buffer(self) -> Any: ...
    @property
    def arrays(self) -> dict[str, npt.NDArray[Any]]: ...
    def __init__(self, capacity: int) -> None: ...
    def __getitem__(self, name: str) -> npt.NDArray[Any]: ...
    def body(self, i: int) -> memoryview: ...
    def topic(self, i: int) -> str: ...
    def properties(self, i: int) -> dict[str, str]: ...
    def gather_bodies(
        self, data_out: Optional[_UInt8s] = None, offsets_out: Optional[_Int32s] = None
    ) -> Tuple[_Int32s, _UInt8s]: ...

def decode_range(
    data: ReadableBuffer,
    cols: RecordColumns,
    start: int = 0,
    end: int = -1,
    base_offset: int = 0,
    check_crc: bool = False,
    append: bool = False,
) -> Tuple[int, int, Stop]: ...
def decode_positions(
    data: ReadableBuffer,
    cols: RecordColumns,
    positions: npt.ArrayLike,
    sizes: Optional[npt.ArrayLike] = None,
    base_offset: int = 0,
    check_crc: bool = False,
    append: bool = False,
) -> Tuple[int, int, Stop]: ...
def topic_codes(cols: RecordColumns) -> Tuple[_Int32s, list[str]]: ...
def gather_binary(cols: RecordColumns, field: str, rows: _Rows = None) -> Tuple[_Int32s, _UInt8s]: ...
def gather_property(
    cols: RecordColumns, name: str, rows: _Rows = None
) -> Tuple[Optional[_UInt8s], int, _Int32s, _UInt8s]: ...
def gather_keys(cols: RecordColumns, rows: _Rows = None) -> Tuple[_Int32s, _Int32s, _UInt8s]: ...
def gather_properties(
    cols: RecordColumns, rows: _Rows = None
) -> Tuple[_Int32s, _Int32s, _UInt8s, _Int32s, _UInt8s]: ...
def gather_msg_ids(cols: RecordColumns, rows: _Rows = None) -> Tuple[_Int32s, _UInt8s]: ...
