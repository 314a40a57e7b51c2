"""Fuzz target: one CommitLog record (_record.decode_message, scan_record, walk_records, unknown_format) at any
position."""

from common import Input, check, commitlog_seeds, main
from localmq import _record


def TestOneInput(data):
    inp = Input(data)
    pos = inp.choice((0, 0, 0, 1, 8, -1, -8, inp.int(2)))
    end = inp.choice((-1, -1, 0, 64, inp.int(2)))
    crc = bool(inp.int(1) & 1)
    buf = inp.rest()
    check(_record.decode_message, buf, pos, check_crc=crc)
    check(_record.decode_message, bytearray(buf), pos, check_crc=crc, copy=False)
    check(_record.scan_record, buf, pos, crc)
    check(_record.walk_records, buf, pos, end, crc)
    check(_record.unknown_format, buf, pos, end)


def seeds():
    return [b"\0\0\0\0" + s for s in commitlog_seeds()]


if __name__ == "__main__":
    main(TestOneInput, seeds)
