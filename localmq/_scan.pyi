"""Stub for the compiled localmq._scan: the single-pass Arrow scan of CommitLog records."""

from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple

import numpy.typing as npt
from _typeshed import ReadableBuffer
from typing_extensions import disjoint_base

from localmq.status import Stop

SCAN_FIELDS: dict[str, int]

@disjoint_base
class RowFilter:
    """The row filters of a segment scan, judged in C while ``scan_range`` walks."""

    def __init__(
        self,
        topics: Optional[Iterable[bytes]] = None,
        bounds: Optional[Mapping[Tuple[bytes, int], Tuple[int, int]]] = None,
        min_ts: Optional[int] = None,
        max_ts: Optional[int] = None,
    ) -> None: ...

def scan_range(
    data: ReadableBuffer,
    start: int,
    end: int,
    base_offset: int = 0,
    check_crc: bool = False,
    capacity: int = 65536,
    fields: Sequence[str] = ("body",),
    row_filter: Optional[RowFilter] = None,
    body_hint: int = 0,
) -> Tuple[int, int, Stop, dict[str, Any]]: ...
def scan_positions(
    data: ReadableBuffer,
    positions: npt.ArrayLike,
    sizes: npt.ArrayLike,
    base_offset: int = 0,
    check_crc: bool = False,
    fields: Sequence[str] = ("body",),
    body_hint: int = 0,
) -> Tuple[int, int, Stop, dict[str, Any]]: ...
