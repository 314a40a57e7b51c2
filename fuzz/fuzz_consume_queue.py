"""Fuzz target: a ConsumeQueue file read by store.readers.read_consume_queue (and its ext file reader)."""

import os

from common import check, fixture_files, main, temp_file
from localmq.store import readers


def TestOneInput(data):
    d = os.path.dirname(temp_file(b"", "x"))
    q = os.path.join(d, "cq")
    os.makedirs(q, exist_ok=True)
    for name in os.listdir(q):
        os.unlink(os.path.join(q, name))
    with open(os.path.join(q, "00000000000000000000"), "wb") as f:
        f.write(data)
    for fn in (readers.read_consume_queue, readers.read_consume_queue_ext):
        out = check(fn, q)
        if out is not None and not isinstance(out, (list, tuple)):
            check(list, out)


def seeds():
    return fixture_files(lambda r: "/consumequeue" in r) or [bytes(20)]


if __name__ == "__main__":
    main(TestOneInput, seeds)
