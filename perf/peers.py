"""localmq and the stores a Python user would pick instead, behind one small interface for the benchmarks."""

import mmap
import os
import sqlite3
import struct
from array import array

import numpy as np

TOPIC = "bench"
# Frame header of the hand-written mmap log: little-endian uint32 body length (0 = end of log).
_LEN = struct.Struct("<I")
_KEY = struct.Struct(">Q")  # lmdb keys: big-endian, so byte order == integer order and append=True is valid


class Store:
    """One implementation under test.

    ``open(directory, count, body_size)`` creates a fresh store in ``directory`` (count and body_size are
    sizing hints for stores that preallocate); ``put(body)`` appends one message; ``put_batch(bodies)``
    appends a list through the store's batch API (``batch_api`` says which, or "loop" when it has none);
    ``wait_visible()`` returns when everything put is visible to a reader (the end of every timed write);
    ``read_all()`` yields every body in put order (``read_api`` says how); ``close()``.
    """

    name = ""
    batch_api = "loop"
    read_api = ""
    slow = False  # True: the benchmarks give it fewer messages per round (the metric is per message)

    def open(self, directory, count=0, body_size=0):
        raise NotImplementedError

    def put(self, body):
        raise NotImplementedError

    def put_batch(self, bodies):
        put = self.put
        for body in bodies:
            put(body)

    def wait_visible(self):
        pass

    def read_all(self):
        raise NotImplementedError

    def close(self):
        raise NotImplementedError


class LocalMQ(Store):
    """``localmq.open`` with its defaults (ASYNC_FLUSH, no warm-up), one CommitLog segment large enough for a round."""

    name = "localmq"
    batch_api = "put_batch(topic, bodies)"
    read_api = "get_bodies(topic, 0, offset, 1024): lists of bytes bodies"

    def open(self, directory, count=0, body_size=0):
        import localmq

        # One segment holds the whole round (the decode benchmark reads a single segment); RocketMQ's V1
        # record is ~90 bytes + topic + properties around the body.
        need = int(count * (body_size + 160) * 1.25)
        segment = min(max(need, 64 << 20), (1 << 31) - 8) // 8 * 8
        self.st = localmq.open(str(directory), mapped_file_size_commit_log=segment)
        self._ok = None
        return self

    def put(self, body):
        r = self.st.put(TOPIC, body)
        if r.status is not self._ok:
            self._check(r)

    def put_batch(self, bodies):
        r = self.st.put_batch(TOPIC, bodies)
        if r.status is not self._ok:
            self._check(r)

    def _check(self, r):
        if r.status.name != "PUT_OK":
            raise RuntimeError(f"localmq put failed: {r.status.name}")
        self._ok = r.status

    def wait_visible(self):
        self.st.wait_for_dispatch()

    def read_all(self):
        get = self.st.get_bodies
        offset = 0
        while True:
            g = get(TOPIC, 0, offset, 1024)
            if not g.bodies:
                return
            yield from g.bodies
            offset = g.next_begin_offset

    def read_all_messages(self):
        """Every body through ``get_message`` in batches of 32 (RocketMQ's pull), one Message per body."""
        get = self.st.get_message
        offset = 0
        while True:
            g = get(TOPIC, 0, offset, 32)
            msgs = g.messages
            if not msgs:
                return
            for m in msgs:
                yield m.body
            offset = g.next_begin_offset

    def close(self):
        self.st.close()


class LocalMQGetMessage(LocalMQ):
    """localmq read back through ``get_message`` (Message objects, batches of 32), the read API before get_bodies;
    only ``test_read_all_localmq_get_message`` and perf/read_instructions.py use it."""

    name = "localmq get_message"
    read_api = "get_message(topic, 0, offset, 32), every .body"

    def read_all(self):
        return self.read_all_messages()


class PersistQueueFile(Store):
    """``persistqueue.Queue`` with its defaults: pickle serializer, chunksize=100 (fsync each full chunk),
    autosave=False (each put rewrites the info file via a temp file + rename). tempdir is set inside the
    round's directory (default: the system temp dir, the same filesystem here) so nothing is left behind."""

    name = "persistqueue.Queue"
    read_api = "get_nowait() until Empty, one task_done() at the end"
    slow = True

    def open(self, directory, count=0, body_size=0):
        import persistqueue

        self._empty = persistqueue.Empty
        tmp = os.path.join(directory, "tmp")
        os.makedirs(tmp, exist_ok=True)
        self.q = persistqueue.Queue(os.path.join(directory, "q"), tempdir=tmp)
        return self

    def put(self, body):
        self.q.put(body)

    def read_all(self):
        get, empty = self.q.get_nowait, self._empty
        n = 0
        while True:
            try:
                item = get()
            except empty:
                break
            n += 1
            yield item
        if n:
            self.q.task_done()

    def close(self):
        # persistqueue.Queue has no close(): its files are closed by __del__.
        for f in (self.q.headf, self.q.tailf):
            if f and not f.closed:
                f.close()


class PersistQueueSQLite(Store):
    """``persistqueue.SQLiteQueue`` with auto_commit=True (its default): one transaction per put and per get,
    WAL journal, sqlite's default synchronous=FULL (an fsync of the WAL per commit), pickle serializer."""

    name = "persistqueue.SQLiteQueue"
    read_api = "get(block=False) until Empty (auto_commit: each get deletes its row)"
    slow = True

    def open(self, directory, count=0, body_size=0):
        import persistqueue

        self._empty = persistqueue.Empty
        self.q = persistqueue.SQLiteQueue(str(directory), auto_commit=True)
        return self

    def put(self, body):
        self.q.put(body)

    def read_all(self):
        get, empty = self.q.get, self._empty
        while True:
            try:
                yield get(block=False)
            except empty:
                return

    def close(self):
        self.q.close()


class DiskcacheDeque(Store):
    """``diskcache.Deque`` with diskcache's defaults (sqlite WAL, synchronous=NORMAL; bytes stored raw
    below 32 KiB). Each append and popleft is its own sqlite transaction."""

    name = "diskcache.Deque"
    batch_api = "with deque.transact(): deque.extend(bodies)"
    read_api = "popleft() until IndexError"
    slow = True

    def open(self, directory, count=0, body_size=0):
        import diskcache

        self.d = diskcache.Deque(directory=str(directory))
        return self

    def put(self, body):
        self.d.append(body)

    def put_batch(self, bodies):
        with self.d.transact():
            self.d.extend(bodies)

    def read_all(self):
        popleft = self.d.popleft
        while True:
            try:
                yield popleft()
            except IndexError:
                return

    def close(self):
        self.d.cache.close()


class QueuelibFifo(Store):
    """``queuelib.FifoDiskQueue`` with its defaults (chunksize=100000; one os.write per push, no fsync)."""

    name = "queuelib.FifoDiskQueue"
    read_api = "pop() until None"

    def open(self, directory, count=0, body_size=0):
        from queuelib import FifoDiskQueue

        self.q = FifoDiskQueue(os.path.join(directory, "q"))
        return self

    def put(self, body):
        self.q.push(body)

    def read_all(self):
        pop = self.q.pop
        while True:
            item = pop()
            if item is None:
                return
            yield item

    def close(self):
        self.q.close()


class SqliteWal(Store):
    """A sqlite3 table ``q(id INTEGER PRIMARY KEY, body BLOB)`` in WAL mode with synchronous=NORMAL (no fsync
    per commit: the durability of localmq's ASYNC_FLUSH). Autocommit connection: one transaction per put."""

    name = "sqlite3 WAL"
    batch_api = "BEGIN; executemany(INSERT); COMMIT"
    read_api = "SELECT id, body WHERE id > ? ORDER BY id LIMIT 32 (non-destructive, like get_message)"

    def open(self, directory, count=0, body_size=0):
        self.db = sqlite3.connect(os.path.join(directory, "q.db"), isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        return self

    def put(self, body):
        self.db.execute("INSERT INTO q (body) VALUES (?)", (body,))

    def put_batch(self, bodies):
        db = self.db
        db.execute("BEGIN")
        db.executemany("INSERT INTO q (body) VALUES (?)", [(b,) for b in bodies])
        db.execute("COMMIT")

    def read_all(self):
        execute = self.db.execute
        last = 0
        while True:
            rows = execute("SELECT id, body FROM q WHERE id > ? ORDER BY id LIMIT 32", (last,)).fetchall()
            if not rows:
                return
            for row in rows:
                yield row[1]
            last = rows[-1][0]

    def close(self):
        self.db.close()


class LmdbLog(Store):
    """py-lmdb as an append log: 8-byte big-endian integer keys, sync=False (no fsync per commit, as
    ASYNC_FLUSH), writemap and every other option at lmdb's default. One write transaction per put."""

    name = "lmdb"
    batch_api = "one write txn: cursor.putmulti(items, append=True)"
    read_api = "one read txn, cursor iteration"

    def open(self, directory, count=0, body_size=0):
        import lmdb

        # map_size is only address space (the file grows as written); leaf pages hold few 1 KiB values.
        map_size = max(256 << 20, count * (body_size + 64) * 4)
        self.env = lmdb.open(str(directory), map_size=map_size, sync=False)
        self.next_key = 0
        return self

    def put(self, body):
        with self.env.begin(write=True) as txn:
            txn.put(_KEY.pack(self.next_key), body, append=True)
        self.next_key += 1

    def put_batch(self, bodies):
        k = self.next_key
        pack = _KEY.pack
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti([(pack(k + i), b) for i, b in enumerate(bodies)], append=True)
        self.next_key = k + len(bodies)

    def read_all(self):
        with self.env.begin() as txn:
            for _, value in txn.cursor():
                yield value

    def close(self):
        self.env.close()


class MmapLog(Store):
    """A hand-written log: one preallocated file (posix_fallocate, untimed), ``mmap`` + ``struct.pack_into``
    of a uint32 length prefix, then the body bytes; a zero length marks the end."""

    name = "mmap+struct log"
    batch_api = "one slice assignment of the joined frames"
    read_api = "struct.unpack_from + slice per frame"

    def open(self, directory, count=0, body_size=0):
        size = max(1 << 20, count * (body_size + _LEN.size) + _LEN.size)
        path = os.path.join(directory, "log")
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        os.posix_fallocate(self.fd, 0, size)
        self.mm = mmap.mmap(self.fd, size)
        self.size = size
        self.pos = 0
        return self

    def put(self, body):
        pos, n = self.pos, len(body)
        end = pos + _LEN.size + n
        if end + _LEN.size > self.size or not n:
            raise ValueError("log full or empty body")
        _LEN.pack_into(self.mm, pos, n)
        self.mm[pos + _LEN.size : end] = body
        self.pos = end

    def put_batch(self, bodies):
        pack = _LEN.pack
        data = b"".join([part for b in bodies for part in (pack(len(b)), b)])
        pos = self.pos
        end = pos + len(data)
        if end + _LEN.size > self.size or 0 in map(len, bodies):
            raise ValueError("log full or empty body")
        self.mm[pos:end] = data
        self.pos = end

    def read_all(self):
        mm, unpack_from, hdr = self.mm, _LEN.unpack_from, _LEN.size
        pos, limit = 0, self.size - hdr
        while pos <= limit:
            (n,) = unpack_from(mm, pos)
            if not n:
                return
            pos += hdr
            yield mm[pos : pos + n]
            pos += n

    def close(self):
        self.mm.close()
        os.close(self.fd)


def mmap_decode_struct(buf):
    """Columns of a mmap log, the way a Python user would write it: a loop of ``struct.unpack_from`` filling
    two ``array`` columns (body position int64, body length int32); stops at a zero length."""
    unpack_from, hdr = _LEN.unpack_from, _LEN.size
    pos_col, len_col = array("q"), array("i")
    add_pos, add_len = pos_col.append, len_col.append
    pos, limit = 0, len(buf) - hdr
    while pos <= limit:
        (n,) = unpack_from(buf, pos)
        if not n:
            break
        add_pos(pos + hdr)
        add_len(n)
        pos += hdr + n
    return pos_col, len_col


def mmap_decode_numpy_fixed(buf, count, body_size):
    """Columns of a mmap log with numpy alone. Only possible because every frame has the same size: one
    ``frombuffer`` with a (length, body) record dtype, a check that every length is ``body_size``, and
    an ``arange`` for the body positions. Not a general decoder: variable-size frames need the loop."""
    frame = _LEN.size + body_size
    recs = np.frombuffer(buf, dtype=np.dtype([("len", "<u4"), ("body", f"V{body_size}")]), count=count)
    lens = recs["len"]
    if not (lens == body_size).all():
        raise ValueError("frames are not all body_size long")
    positions = np.arange(count, dtype=np.int64) * frame + _LEN.size
    return positions, lens.astype(np.int32)


PEERS = {
    "persistqueue_file": PersistQueueFile,
    "persistqueue_sqlite": PersistQueueSQLite,
    "diskcache_deque": DiskcacheDeque,
    "queuelib_fifo": QueuelibFifo,
    "sqlite_wal": SqliteWal,
    "lmdb": LmdbLog,
    "mmap_log": MmapLog,
}
IMPLEMENTATIONS = {"localmq": LocalMQ, **PEERS}
# read-only variants, outside the parametrized scenarios (test_read_all_localmq_get_message, read_instructions.py)
READ_VARIANTS = {"localmq_get_message": LocalMQGetMessage}
