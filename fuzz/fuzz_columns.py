"""Fuzz target: columnar decode (_columns.decode_range / decode_positions) and every gather over its rows."""

import numpy as np

from common import Input, check, commitlog_seeds, main
from localmq import _columns

GATHERS = (
    lambda c: c.gather_bodies(),
    lambda c: _columns.gather_binary(c, "body"),
    lambda c: _columns.gather_binary(c, "topic"),
    _columns.topic_codes,
    _columns.gather_keys,
    _columns.gather_properties,
    _columns.gather_msg_ids,
    lambda c: _columns.gather_property(c, "TAGS"),
)


def TestOneInput(data):
    inp = Input(data)
    start = inp.choice((0, 0, 0, 1, -1, inp.int(2)))
    mode = inp.int(1, False)
    positions = [inp.int(2) for _ in range(inp.int(1, False) % 4)]
    buf = bytearray(inp.rest())
    cols = _columns.RecordColumns(8)
    if mode & 1:
        check(
            _columns.decode_positions,
            buf,
            cols,
            positions,
            None if mode & 2 else [len(buf)] * len(positions),
            0,
            bool(mode & 4),
        )
    else:
        check(_columns.decode_range, buf, cols, start, -1, 0, bool(mode & 4))
    for g in GATHERS:
        check(g, cols)
    if cols.count:
        check(_columns.gather_binary, cols, "body", np.arange(cols.count)[::-1])
        try:
            buf.clear()  # the columns hold the buffer: resizing must fail, never free their bytes
        except BufferError:
            pass
        else:
            raise AssertionError("the decoded buffer was resized under the columns")


def seeds():
    return [b"\0\0\0\0\0" + s for s in commitlog_seeds()]


if __name__ == "__main__":
    main(TestOneInput, seeds)
