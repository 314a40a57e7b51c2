"""Fuzz target: the single-pass scans (_scan.scan_range with and without a RowFilter, scan_positions)."""

from common import Input, check, commitlog_seeds, main
from localmq import _scan

FIELDS = tuple(_scan.SCAN_FIELDS)


def TestOneInput(data):
    inp = Input(data)
    start = inp.choice((0, 0, 0, 1, -1, inp.int(2)))
    end = inp.choice((-1, -1, 0, inp.int(2)))
    mode = inp.int(1, False)
    positions = [inp.int(2) for _ in range(inp.int(1, False) % 4)]
    sizes = [inp.int(2) for _ in positions]
    buf = inp.rest()
    fields = FIELDS if mode & 1 else ("body", "topic")
    flt = _scan.RowFilter(topics=[b"abc", b"TopicTest"], bounds={(b"abc", 0): (1, 5)}, min_ts=1) if mode & 2 else None
    check(_scan.scan_range, buf, start, end, 0, bool(mode & 4), 4, fields, flt, 0)
    check(_scan.scan_positions, buf, positions, sizes, 0, bool(mode & 4), fields)


def seeds():
    return [b"\0" * 11 + s for s in commitlog_seeds()]


if __name__ == "__main__":
    main(TestOneInput, seeds)
