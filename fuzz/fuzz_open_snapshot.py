"""Fuzz target: open a store whose queue snapshot (config/queues.snapshot, store/queue_snapshot.py) lies.

The snapshot lets a clean reopen take each queue's state from one file instead of reading the queue. A damaged
snapshot must be refused (its CRC-32), and a forged one (changed bytes with the CRC made right again: an offset one
unit off, a row of another queue, a count of files that is not the directory's) must be refused wherever it
disagrees with the files (the stamps of every file, the units at each queue's ends): the store then checks those
queues as if there were no snapshot. Either way nothing is lost: a lie costs the time of the full check, never a
message, a crash or a hang.

The store of ``fuzz_open_store`` (600 messages, 3 topics x 2 queues, 20-unit queue files) is written once per
process; for each input a fresh copy of it is opened and closed cleanly, which writes a snapshot that vouches for
every queue of that copy. The input then changes that snapshot (byte patches anywhere, 32-bit and 64-bit values,
small changes of 64-bit fields, cuts, copies of one part over another; the CRC made right again unless the input
says otherwise), may damage one queue file or leave ``abort`` behind, and the copy is opened and every queue read
to its end through ``get_message``, after one put to a queue the input picks (before any read: the put path must
take that queue's next offset from the checked queue). The rule: only LocalMQError subclasses come out; the put
takes the queue offset after the last written; every body read is one that was written to that queue; and unless a
queue file was damaged, every queue reads back exactly what was written, in order (the snapshot took or refused,
never lost). The rows are checked on each queue's first use (ConsumeQueueTable._build), after the open.
"""

import atexit
import os
import shutil
import struct
import tempfile
import time
import zlib

# common first: it imports localmq under atheris' instrumentation (see fuzz_open_store.py)
from common import Input, main, read_queue_to_end

# isort: split
import localmq
from fuzz_open_store import BODIES, CONFIG, _restore, _snapshot, _store_dir
from localmq.errors import LocalMQError
from localmq.layout import QUEUE_SNAPSHOT_HEADER

TOPICS = ("a", "b", "c")
# what each queue holds, in order: the oracle of every open but one after a queue file was damaged
EXPECTED = {
    (t, q): [b for i, b in enumerate(BODIES) if TOPICS[i % 3] == t and i % 2 == q] for t in TOPICS for q in (0, 1)
}
# the vouch rule (queue_snapshot.py) trusts no file changed within max(50 ms, 3 x the clock's step) of the close
SETTLE = 0.06
_state = None


def _fresh():
    """(pristine files, work directory): the base store written once per process."""
    global _state
    if _state is None:
        d = tempfile.mkdtemp(prefix="localmq-fuzz-snap-", dir=_store_dir())
        atexit.register(shutil.rmtree, d, True)
        root = os.path.join(d, "base")
        with localmq.open(root, **CONFIG) as st:
            for i, body in enumerate(BODIES):
                st.put(TOPICS[i % 3], body, queue_id=i % 2)
        _state = (_snapshot(root), os.path.join(d, "work"))
        shutil.rmtree(root)
    return _state


def _prepared(pristine, work):
    """A fresh copy at ``work`` with the snapshot its clean close wrote: the snapshot's bytes."""
    _restore(pristine, work)
    time.sleep(SETTLE)  # the copy's files must be older than the vouch window when the close stamps them
    with localmq.open(work, **CONFIG):
        pass
    with open(os.path.join(work, "config", "queues.snapshot"), "rb") as f:
        return f.read()


def _forge(inp, snap):
    """The snapshot changed as the input says; its CRC made right again unless the input's flag says not to."""
    header = QUEUE_SNAPSHOT_HEADER.size
    body = bytearray(snap[header:])
    for _ in range(inp.int(1, False) % 6):
        op = inp.int(1, False) % 6
        pos = inp.int(2, False) % (len(body) + 1)
        if op == 0:  # a run of bytes from the input
            patch = inp.data[inp.pos : inp.pos + 1 + inp.int(1, False) % 8]
            inp.pos += len(patch)
            body[pos : pos + len(patch)] = patch
        elif op == 1:  # a 32-bit value
            body[pos : pos + 4] = struct.pack(">i", inp.int(4))
        elif op == 2:  # a 64-bit value
            body[pos : pos + 8] = struct.pack(">q", inp.int(8))
        elif op == 3:  # a small change of a 64-bit field (an offset one unit off, a count one file off)
            if pos + 8 <= len(body):
                (v,) = struct.unpack_from(">q", body, pos)
                body[pos : pos + 8] = struct.pack(">q", max(-(1 << 63), min((1 << 63) - 1, v + inp.int(1))))
        elif op == 4:  # a cut
            del body[pos:]
        else:  # a copy of another part of the body (a row of another queue)
            src = inp.int(2, False) % (len(body) + 1)
            n = 1 + inp.int(1, False) % 64
            body[pos : pos + n] = body[src : src + n]
    magic, version, crc, length = QUEUE_SNAPSHOT_HEADER.unpack_from(snap, 0)
    if not inp.int(1, False) & 1:
        crc, length = zlib.crc32(bytes(body)), len(body)
    return QUEUE_SNAPSHOT_HEADER.pack(magic, version, crc, length) + bytes(body)


def TestOneInput(data):
    pristine, work = _fresh()
    snap = _prepared(pristine, work)
    inp = Input(data)
    forged = _forge(inp, snap)
    with open(os.path.join(work, "config", "queues.snapshot"), "wb") as f:
        f.write(forged)
    flags = inp.int(1, False)
    damaged = False
    if flags & 2:  # damage one queue file as well (its stamp changes: that queue is checked, the others trusted)
        qfiles = sorted(
            os.path.join(p, n) for p, _, ns in os.walk(os.path.join(work, "consumequeue")) for n in ns if n.isdigit()
        )
        if qfiles:
            path = qfiles[inp.int(1, False) % len(qfiles)]
            size = os.path.getsize(path)
            pos = inp.int(2, False) % (size + 1)
            patch = inp.data[inp.pos : inp.pos + 1 + inp.int(1, False) % 20]
            inp.pos += len(patch)
            with open(path, "r+b") as f:
                f.seek(pos)
                f.write(patch[: max(0, size - pos)])
            damaged = True
    if flags & 4:
        open(os.path.join(work, "abort"), "wb").close()
    try:
        st = localmq.open(work, **CONFIG)
    except LocalMQError:
        return
    with st:
        # a put before any read, to a queue the input picks: the put path takes its next queue offset from the queue
        # (its row checked first), never from a row alone (a forged row one short would reuse an offset)
        keys = sorted(EXPECTED)
        put_key = keys[(flags >> 3) % len(keys)]
        r = st.put(put_key[0], b"put after the open", queue_id=put_key[1])
        if r.queue_offset != len(EXPECTED[put_key]):
            raise AssertionError(f"{put_key}: a put took queue offset {r.queue_offset}, not {len(EXPECTED[put_key])}")
        st.wait_for_dispatch(10)
        for (topic, qid), bodies in EXPECTED.items():
            if (topic, qid) == put_key:
                bodies = bodies + [b"put after the open"]
            read = read_queue_to_end(st, topic, qid, bodies)
            if not damaged and read != bodies:
                raise AssertionError(
                    f"{topic}-{qid}: {len(read)} bodies read back in place of the {len(bodies)} written"
                )


def seeds():
    # the snapshot as written, with its CRC broken, one and several forged fields, a cut, a damaged queue file
    return [
        bytes([0, 0]),
        bytes([0, 1]),
        bytes([1, 3, 40, 0, 1, 0]),
        bytes([2, 2, 60, 0, 255, 255, 255, 255, 255, 255, 255, 127, 1, 100, 0, 16, 0]),
        bytes([1, 4, 200, 0, 0, 2, 0, 0, 5, 1, 2, 3, 4, 5]),
    ]


if __name__ == "__main__":
    main(TestOneInput, seeds)
