"""Fuzz target: open a damaged store and read every queue (recovery, resynchronisation, the unit checks, get).

A small store (64 KiB segments, 20-unit ConsumeQueue files, 3 topics, 600 messages with unique bodies) is written
once per process; beside it, the power-cut images of fuzz/power_images.py (the same messages put on powerfs, the
power cut at a seeded moment: stores as a crash left them, made once per machine and cached). Each input picks one
of these bases (its first byte), then lists damages to a fresh copy of it: (file, position, bytes) writes, zeroed
runs and truncations; then the copy is opened and every queue is read to its end through ``get_message``. The rule:
only LocalMQError subclasses come out (a CorruptMessageError is skipped with its ``next_offset``), and every body
read is one that was written (damage never turns into wrong data).
"""

import atexit
import os
import shutil
import tempfile

# common first: it imports localmq under atheris' instrumentation, which an earlier `import localmq` would bypass (the
# coverage guidance then sees no localmq code at all)
from common import Input, main, read_queue_to_end

# isort: split
import localmq
import power_images
from localmq.errors import LocalMQError

CONFIG = dict(
    mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=400, max_hash_slot_num=512, max_index_num=2048
)
_base = None
_work = None


def _store_dir():
    """Where the stores go: ``LOCALMQ_FUZZ_STORE_DIR``, else /dev/shm when it is a writable tmpfs (an input costs
    about 5 times less there: the fsyncs and directory syncs of every open are free, and what is fuzzed is the
    recovery logic, not the disk), else the temporary directory."""
    d = os.environ.get("LOCALMQ_FUZZ_STORE_DIR")
    if d:
        return d
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return "/dev/shm"
    return None


BODIES = [b"m%04d-" % i + bytes([i % 251]) * (i % 97) for i in range(600)]


def _snapshot(root):
    """(directories, [(file, bytes)]) of a base, read once: writing a copy from memory costs about a third of
    ``shutil.copytree``, which stats, copies metadata and extended attributes of every file (15 % of an input)."""
    dirs, files = [], []
    for p, ds, ns in os.walk(root):
        dirs += [os.path.relpath(os.path.join(p, d), root) for d in ds]
        for n in ns:
            with open(os.path.join(p, n), "rb") as f:
                files.append((os.path.relpath(os.path.join(p, n), root), f.read()))
    return sorted(dirs), files


def _restore(snapshot, work):
    """A fresh copy of a base at ``work`` (the last input's copy removed first)."""
    shutil.rmtree(work, ignore_errors=True)
    os.mkdir(work)
    dirs, files = snapshot
    for d in dirs:
        os.mkdir(os.path.join(work, d))
    for rel, data in files:
        fd = os.open(os.path.join(work, rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)


def _bases():
    """([(snapshot, files)] of the pristine store and of the power-cut images, written bodies), built on first
    use."""
    global _base, _work
    if _base is None:
        d = _work = tempfile.mkdtemp(prefix="localmq-fuzz-open-", dir=_store_dir())
        atexit.register(shutil.rmtree, d, True)
        root = os.path.join(d, "base")
        with localmq.open(root, **CONFIG) as st:
            for i, body in enumerate(BODIES):
                st.put(("a", "b", "c")[i % 3], body, queue_id=i % 2, keys=f"k{i}" if i % 5 == 0 else None)
        roots = [root] + power_images.images(CONFIG, BODIES)
        snapshots = [_snapshot(r) for r in roots]
        # the files an input may damage: every file of the base but the lock
        _base = (
            [(s, sorted(rel for rel, _ in s[1] if os.path.basename(rel) != "lock")) for s in snapshots],
            set(BODIES),
        )
    return _base


def TestOneInput(data):
    bases, written = _bases()
    inp = Input(data)
    snapshot, files = bases[inp.int(1, False) % len(bases)]
    work = os.path.join(_work, "work")
    _restore(snapshot, work)
    for _ in range(inp.int(1, False) % 5):  # none: the base as it is (a power-cut image opened as the cut left it)
        if not files:
            break
        path = os.path.join(work, inp.choice(files))
        if not os.path.exists(path):
            continue
        size = os.path.getsize(path)
        op = inp.int(1, False) % 8
        pos = inp.int(4, False) % (size + 1)
        if op == 7:
            os.truncate(path, pos)
        elif op == 6:
            with open(path, "r+b") as f:
                f.seek(pos)
                f.write(bytes(min(size - pos, inp.int(2, False))))
        else:
            patch = inp.data[inp.pos : inp.pos + 1 + op * 3]
            inp.pos += len(patch)
            with open(path, "r+b") as f:
                f.seek(pos)
                f.write(patch[: max(0, size - pos)])
    if inp.int(1, False) & 1:
        open(os.path.join(work, "abort"), "wb").close()
    try:
        st = localmq.open(work, **CONFIG)
    except LocalMQError:
        return
    with st:
        for topic in ("a", "b", "c"):
            for qid in (0, 1):
                read_queue_to_end(st, topic, qid, written)


def seeds():
    # every base opened as it is, then with damage
    return [bytes([k, 0]) for k in range(1 + power_images.COUNT)] + [
        bytes([0, 1, 0, 0, 0, 0, 0, 0]),
        bytes([0]) + bytes(16),
        bytes(range(64)),
    ]


if __name__ == "__main__":
    main(TestOneInput, seeds)
