"""Fuzz target: the embedded queue's frames (_frame.walk_frames, read_frames)."""

import os
import shutil
import tempfile

from common import Input, check, main
from localmq import _frame


def TestOneInput(data):
    inp = Input(data)
    start = inp.choice((0, 0, 0, 4, -1, -4, inp.int(2)))
    end = inp.choice((-1, -1, 0, inp.int(2)))
    crc = bool(inp.int(1) & 1)
    buf = inp.rest()
    check(_frame.walk_frames, buf, start, end, crc)
    check(_frame.read_frames, buf, "t", 0, 0, 0, 8, {"a"} if crc else None, -1, crc)


def seeds():
    from localmq._mapped_file import MappedFile

    d = tempfile.mkdtemp(prefix="localmq-fuzz-frames-")
    mf = MappedFile(os.path.join(d, "p"), 4096, 0)
    try:
        end = 0
        for body, props in ((b"hello", b""), (b"", b"TAGS\x01a\x02"), (b"x" * 100, b"KEYS\x01k\x02")):
            end = _frame.write_frame(mf, end, body, props, 1, 2, 0)
        data = bytes(memoryview(mf)[:end])
    finally:
        mf.close()
        shutil.rmtree(d)
    return [b"\0\0\0" + data, b"\0\0\0" + data[:40]]


if __name__ == "__main__":
    main(TestOneInput, seeds)
