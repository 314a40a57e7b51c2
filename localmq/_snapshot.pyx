# cython: boundscheck=False, wraparound=False, cdivision=True
"""The rows of a queue snapshot (store/queue_snapshot.py) parsed in one compiled pass: an open of 100,000 queues reads
every row (about 70 bytes a queue) before it uses any, and a Python call per field cost most of a second there."""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t

from libc.errno cimport EINTR, ENOENT, errno
from libc.stdio cimport snprintf
from posix.fcntl cimport O_NONBLOCK, O_RDONLY
from posix.fcntl cimport open as c_open
from posix.unistd cimport close as c_close
from posix.unistd cimport pread

from localmq._layout cimport (
    CQ_BLANK_UNIT_SIZE, CQ_UNIT_SIZE, MAX_QUEUE_ID, QUEUE_SNAPSHOT_FILE_ROW_SIZE, QUEUE_SNAPSHOT_NOT_VOUCHED,
    QUEUE_SNAPSHOT_QUEUE_ROW_SIZE, QUEUE_SNAPSHOT_TOPIC_ROW_SIZE,
)

import os


cdef extern from "<fcntl.h>" nogil:
    enum: O_NOFOLLOW
    enum: O_CLOEXEC


cdef extern from "<sys/stat.h>" nogil:
    cdef struct timespec:
        long tv_sec
        long tv_nsec
    cdef struct stat:
        unsigned long long st_dev
        unsigned long long st_ino
        unsigned int st_mode
        long long st_size
        timespec st_ctim
    int c_lstat "lstat"(const char *path, stat *buf)
    bint S_ISLNK(unsigned int mode)


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)  # safe on an object already untracked


@cython.final
@cython.no_gc  # holds ints and bytes: never part of a cycle; 100,000 of them are not traversed
cdef class QueueRow:
    """One queue's row: its directory's ctime (ns; QUEUE_SNAPSHOT_NOT_VOUCHED: not vouched for) and inode, its ends,
    and its files as ((base offset, ctime ns, inode), ...). A store keeps one for each queue it has not used since
    the open (ConsumeQueueTable.rows)."""

    cdef readonly int64_t dir_ctime, dir_ino, max_offset, min_offset, max_physic_offset
    cdef bytes _files  # the file rows as the snapshot holds them: no object a file until they are read

    def __init__(self, int64_t dir_ctime, int64_t dir_ino, int64_t max_offset, int64_t min_offset,
                 int64_t max_physic_offset, files):
        self.dir_ctime, self.dir_ino = dir_ctime, dir_ino
        self.max_offset, self.min_offset, self.max_physic_offset = max_offset, min_offset, max_physic_offset
        self._files = b"".join([_file_row(base, ctime, ino) for base, ctime, ino in files])

    @property
    def files(self):
        """((base offset, ctime ns, inode), ...) of the queue's files, in order."""
        cdef const uint8_t *p = <const uint8_t *>PyBytes_AS_STRING(self._files)
        cdef Py_ssize_t i, n = PyBytes_GET_SIZE(self._files) // QUEUE_SNAPSHOT_FILE_ROW_SIZE
        cdef Py_ssize_t w = QUEUE_SNAPSHOT_FILE_ROW_SIZE
        return tuple([(_q(p + i * w), _q(p + i * w + 8), _q(p + i * w + 16)) for i in range(n)])

    @property
    def n_files(self):
        """How many files the row lists."""
        return PyBytes_GET_SIZE(self._files) // QUEUE_SNAPSHOT_FILE_ROW_SIZE

    @property
    def file_rows(self):
        """The files as the snapshot's file rows (layout.QUEUE_SNAPSHOT_FILE_ROW each): what a close writes back."""
        return self._files

    def __repr__(self):
        return (f"QueueRow(dir_ctime={self.dir_ctime}, dir_ino={self.dir_ino}, max_offset={self.max_offset}, "
                f"min_offset={self.min_offset}, max_physic_offset={self.max_physic_offset}, files={self.files})")


@cython.final
@cython.no_gc  # holds tuples of strings, ints and QueueRows: never part of a cycle
cdef class TopicRow:
    """One topic's row: its directory's ctime (ns) and inode, and its queues' rows: those vouched for with a valid
    queue id as ``keys`` ((topic, queue id)), ``rows`` and ``qids`` in parallel, in the file's order, and the ids of
    the others (not vouched for, or past MAX_QUEUE_ID) in ``others``: what the open takes a topic by. Its tuples are
    not tracked by the cyclic GC (nothing in them can form a cycle): at 100,000 queues the collector's first look at
    them cost more than the parse."""

    cdef readonly int64_t dir_ctime, dir_ino
    cdef readonly tuple keys, rows, qids, others
    # its queue rows and their file rows as the snapshot holds them, in its order: what a close writes back for a
    # topic whose queues were all vouched for and none used since (b"" when made from QueueRows)
    cdef readonly bytes span

    def __init__(self, str topic, int64_t dir_ctime, int64_t dir_ino, queues):
        """``queues``: {queue id: QueueRow}."""
        cdef list keys = [], rows = [], qids = [], others = []
        self.dir_ctime, self.dir_ino = dir_ctime, dir_ino
        for qid, row in queues.items():
            _sort_row(topic, qid, row, keys, rows, qids, others)
        _set_rows(self, keys, rows, qids, others)
        self.span = b""

    def row(self, qid):
        """The vouched row of queue ``qid``, or None."""
        try:
            return self.rows[self.qids.index(qid)]
        except ValueError:
            return None


cdef inline int _sort_row(str topic, uint32_t qid, QueueRow row, list keys, list rows, list qids,
                          list others) except -1:
    if row.dir_ctime != QUEUE_SNAPSHOT_NOT_VOUCHED and qid <= MAX_QUEUE_ID:
        key = (topic, qid)
        PyObject_GC_UnTrack(<void *>key)
        keys.append(key)
        rows.append(row)
        qids.append(qid)
    else:
        others.append(qid)
    return 0


cdef inline tuple _untracked(list items):
    cdef tuple out = tuple(items)
    PyObject_GC_UnTrack(<void *>out)
    return out


cdef int _set_rows(TopicRow t, list keys, list rows, list qids, list others) except -1:
    t.keys, t.rows, t.qids, t.others = _untracked(keys), _untracked(rows), _untracked(qids), _untracked(others)
    return 0


cdef inline uint64_t _be64(const uint8_t *p) noexcept nogil:
    return ((<uint64_t>p[0] << 56) | (<uint64_t>p[1] << 48) | (<uint64_t>p[2] << 40) | (<uint64_t>p[3] << 32)
            | (<uint64_t>p[4] << 24) | (<uint64_t>p[5] << 16) | (<uint64_t>p[6] << 8) | <uint64_t>p[7])


cdef inline uint32_t _be32(const uint8_t *p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef inline int64_t _q(const uint8_t *p) noexcept nogil:
    return <int64_t>_be64(p)


cdef bytes _file_row(int64_t base, int64_t ctime, int64_t ino):
    cdef uint8_t out[QUEUE_SNAPSHOT_FILE_ROW_SIZE]
    cdef int k
    for k in range(8):
        out[k] = (<uint64_t>base >> (56 - 8 * k)) & 0xFF
        out[8 + k] = (<uint64_t>ctime >> (56 - 8 * k)) & 0xFF
        out[16 + k] = (<uint64_t>ino >> (56 - 8 * k)) & 0xFF
    return <bytes>out[:QUEUE_SNAPSHOT_FILE_ROW_SIZE]


def parse_topic_rows(bytes body, Py_ssize_t pos, Py_ssize_t n_topics):
    """The ``n_topics`` topic rows of ``body`` from ``pos``, each followed by its queue rows and theirs by their file
    rows (layout.QUEUE_SNAPSHOT_TOPIC_ROW, _QUEUE_ROW, _FILE_ROW), to the end of ``body``.

    Returns {topic name: TopicRow}.

    Raises ValueError when a row runs past the end, the rows end before it, or a topic or a queue is listed twice
    (no close writes that); UnicodeDecodeError (a ValueError) for a name that is not UTF-8."""
    return _parse(body, pos, n_topics)


cdef dict _parse(bytes body, Py_ssize_t pos, Py_ssize_t n_topics):
    cdef const uint8_t *b = <const uint8_t *>PyBytes_AS_STRING(body)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(body)
    cdef Py_ssize_t _t, _i, name_len, start
    cdef uint32_t n_queues, n_files, qid
    cdef int64_t tctime, tino
    cdef const uint8_t *p
    cdef dict topics = {}
    cdef set seen = set()
    cdef list keys, rows, qids, others
    cdef QueueRow row
    cdef TopicRow entry
    if pos < 0 or pos > end:
        raise ValueError("truncated")
    for _t in range(n_topics):
        if end - pos < QUEUE_SNAPSHOT_TOPIC_ROW_SIZE:
            raise ValueError("truncated")
        p = b + pos
        name_len = (<uint16_t>p[0] << 8) | p[1]
        n_queues = _be32(p + 18)
        tctime, tino = _q(p + 2), _q(p + 10)
        pos += QUEUE_SNAPSHOT_TOPIC_ROW_SIZE
        if end - pos < name_len:
            raise ValueError("truncated")
        topic = (<bytes>b[pos:pos + name_len]).decode("utf-8")
        pos += name_len
        if topic in topics:
            raise ValueError(f"topic {topic!r} listed twice")
        seen.clear()
        keys, rows, qids, others = [], [], [], []
        start = pos
        for _i in range(n_queues):
            if end - pos < QUEUE_SNAPSHOT_QUEUE_ROW_SIZE:
                raise ValueError("truncated")
            p = b + pos
            qid = _be32(p)
            n_files = _be32(p + 44)
            pos += QUEUE_SNAPSHOT_QUEUE_ROW_SIZE
            if <uint64_t>(end - pos) < <uint64_t>n_files * QUEUE_SNAPSHOT_FILE_ROW_SIZE:
                raise ValueError("truncated")
            row = QueueRow.__new__(QueueRow)
            row._files = <bytes>b[pos:pos + n_files * QUEUE_SNAPSHOT_FILE_ROW_SIZE]
            pos += n_files * QUEUE_SNAPSHOT_FILE_ROW_SIZE
            row.dir_ctime, row.dir_ino = _q(p + 4), _q(p + 12)
            row.max_offset, row.min_offset, row.max_physic_offset = _q(p + 20), _q(p + 28), _q(p + 36)
            if qid in seen:
                raise ValueError(f"queue {topic}/{qid} listed twice")
            seen.add(qid)
            _sort_row(topic, qid, row, keys, rows, qids, others)
        entry = TopicRow.__new__(TopicRow)
        entry.dir_ctime, entry.dir_ino = tctime, tino
        _set_rows(entry, keys, rows, qids, others)
        entry.span = <bytes>b[start:pos]
        topics[topic] = entry
    if pos != end:
        raise ValueError("trailing bytes")
    return topics


# what check_rows finds for a row (ConsumeQueueTable._row_holds)
cdef enum:
    ROW_CHANGED_ = 0  # a file or the directory is not the one the row stamped (or is gone), or the row's shape is wrong
    ROW_HOLDS_ = 1  # the queue's files are those of its row and its units are where the row says
    ROW_DISAGREES_ = 2  # the stamps hold, the units are not where the row says (a row that lies: the caller logs it)
    ROW_LINK_ = 3  # the queue's directory is a symlink
    PATH_MAX = 4096
    ENAMETOOLONG_ = 36
    UNITS_GONE = 1  # _units: the file is gone or shorter (not an error, not a success)
# the largest offsets a close writes (far below what overflows int64 in the checks' arithmetic)
cdef int64_t MAX_ROW_OFFSET = (<int64_t>1) << 56
ROW_CHANGED = ROW_CHANGED_
ROW_HOLDS = ROW_HOLDS_
ROW_DISAGREES = ROW_DISAGREES_
ROW_LINK = ROW_LINK_


cdef inline int64_t _ctime_ns(const stat *st) noexcept nogil:
    return <int64_t>st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec


cdef int _units(const char *qdir, int64_t base0, int64_t file_size, int64_t pos, uint8_t *out, int n) noexcept nogil:
    """``n`` bytes from logical position ``pos`` (within one file) with pread: 0, UNITS_GONE for a file gone or
    short, -errno for an error."""
    cdef char path[PATH_MAX]
    cdef int64_t base = pos - (pos - base0) % file_size
    cdef int fd, err
    cdef Py_ssize_t got
    if snprintf(path, PATH_MAX, "%s/%020lld", qdir, <long long>base) >= PATH_MAX:
        return -ENAMETOOLONG_
    while True:
        fd = c_open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
        if fd >= 0 or errno != EINTR:
            break
    if fd < 0:
        return UNITS_GONE if errno == ENOENT else -errno
    while True:
        got = pread(fd, out, n, pos - base)
        if got >= 0 or errno != EINTR:
            break
    err = errno
    c_close(fd)
    if got < 0:
        return -err
    return 0 if got == n else UNITS_GONE


cdef inline bint _exists(const char *qdir, int64_t base) noexcept nogil:
    cdef char path[PATH_MAX]
    cdef stat st
    if base < 0 or snprintf(path, PATH_MAX, "%s/%020lld", qdir, <long long>base) >= PATH_MAX:
        return False
    return c_lstat(path, &st) == 0


cdef int _row_check(const char *qdir, const uint8_t *files, Py_ssize_t n_files, int64_t dir_ctime, int64_t dir_ino,
                    int64_t max_offset, int64_t min_offset, int64_t max_phys, int64_t file_size,
                    unsigned long long dev, int64_t log_min) noexcept nogil:
    cdef char path[PATH_MAX]
    cdef stat st
    cdef Py_ssize_t i, w = QUEUE_SNAPSHOT_FILE_ROW_SIZE
    cdef int64_t base0, last_base, base, last, first, phys, rc
    cdef int32_t size
    cdef uint8_t data[3 * CQ_UNIT_SIZE]
    cdef int n
    cdef bint tail_in_file
    # the shape a close writes: consecutive files, the end in the last one, offsets no close comes near
    if n_files <= 0 or file_size <= 0 or n_files > MAX_ROW_OFFSET // file_size:
        return ROW_CHANGED_
    if not 0 <= max_offset <= MAX_ROW_OFFSET:
        return ROW_CHANGED_
    base0 = _q(files)
    if not 0 <= base0 <= MAX_ROW_OFFSET:
        return ROW_CHANGED_
    for i in range(n_files):
        if _q(files + i * w) != base0 + i * file_size:
            return ROW_CHANGED_
    last_base = base0 + (n_files - 1) * file_size
    if not last_base <= max_offset * CQ_UNIT_SIZE <= last_base + file_size:
        return ROW_CHANGED_
    # the stamps: the directory and every file still those the row saw (inode, ctime, size, on the table's device)
    if c_lstat(qdir, &st) != 0:
        return ROW_CHANGED_ if errno == ENOENT else -errno
    if S_ISLNK(st.st_mode):
        return ROW_LINK_
    if _ctime_ns(&st) != dir_ctime or <int64_t>st.st_ino != dir_ino:
        return ROW_CHANGED_
    for i in range(n_files):
        base = _q(files + i * w)
        if snprintf(path, PATH_MAX, "%s/%020lld", qdir, <long long>base) >= PATH_MAX:
            return -ENAMETOOLONG_
        if c_lstat(path, &st) != 0:
            return ROW_CHANGED_ if errno == ENOENT else -errno
        if (_ctime_ns(&st) != _q(files + i * w + 8) or <int64_t>st.st_ino != _q(files + i * w + 16)
                or st.st_size != file_size or st.st_dev != dev):
            return ROW_CHANGED_
    # the units: no file before the first or after a full last one, the last unit a real one ending at max_phys, the
    # one after it zeros, and a min offset past the first file's start after a unit retention expired
    if not 0 <= min_offset <= MAX_ROW_OFFSET:
        return ROW_DISAGREES_
    last = max_offset * CQ_UNIT_SIZE - CQ_UNIT_SIZE
    first = min_offset * CQ_UNIT_SIZE
    if last < base0 or not base0 <= first <= last + CQ_UNIT_SIZE:
        return ROW_DISAGREES_
    if base0 > 0 and _exists(qdir, base0 - file_size):
        return ROW_DISAGREES_
    if last + CQ_UNIT_SIZE == last_base + file_size and _exists(qdir, last_base + file_size):
        return ROW_DISAGREES_
    tail_in_file = (last - base0) % file_size + 2 * CQ_UNIT_SIZE <= file_size
    n = 2 * CQ_UNIT_SIZE if tail_in_file else CQ_UNIT_SIZE
    rc = _units(qdir, base0, file_size, last, data, n)
    if rc != 0:
        return ROW_CHANGED_ if rc == UNITS_GONE else <int>rc
    if not tail_in_file and last + CQ_UNIT_SIZE < last_base + file_size:
        rc = _units(qdir, base0, file_size, last + CQ_UNIT_SIZE, data + CQ_UNIT_SIZE, CQ_UNIT_SIZE)
        if rc != 0:
            return ROW_CHANGED_ if rc == UNITS_GONE else <int>rc
        n = 2 * CQ_UNIT_SIZE
    phys = _q(data)
    size = <int32_t>_be32(data + 8)
    if not (0 <= phys <= MAX_ROW_OFFSET and 0 < size < CQ_BLANK_UNIT_SIZE and phys + size == max_phys):
        return ROW_DISAGREES_
    for i in range(CQ_UNIT_SIZE, n):
        if data[i]:
            return ROW_DISAGREES_
    if first > base0:
        rc = _units(qdir, base0, file_size, first - CQ_UNIT_SIZE, data, CQ_UNIT_SIZE)
        if rc != 0:
            return ROW_CHANGED_ if rc == UNITS_GONE else <int>rc
        size = <int32_t>_be32(data + 8)
        if size != CQ_BLANK_UNIT_SIZE and _q(data) >= log_min:
            return ROW_DISAGREES_
    return ROW_HOLDS_


def check_rows(list qdirs, list rows, int64_t file_size, unsigned long long dev, int64_t log_min):
    """What ``row_check`` finds for each (queue directory (bytes), QueueRow), as a list of ints. The GIL is released
    once for the whole list while the files are looked at (not once a row: a thread that takes the GIL back for every
    row waits for it behind any other running Python thread), so a list checked on several threads, or beside other
    Python work, runs in parallel. A negative int is -errno of a failed look (the caller raises it: ``row_check``)."""
    cdef Py_ssize_t i, n = len(qdirs)
    cdef QueueRow row
    cdef bytes q
    cdef list out = [0] * n
    cdef int *rcs
    cdef const char **qps
    cdef const uint8_t **fps
    cdef Py_ssize_t *nfs
    cdef int64_t *ints
    if len(rows) != n:
        raise ValueError("qdirs and rows differ in length")
    if n == 0:
        return out
    # held here while the GIL is released: a list the caller shares could drop an item (and its bytes) meanwhile
    cdef tuple held_q = tuple(qdirs), held_r = tuple(rows)
    rcs = <int *>PyMem_Malloc(n * sizeof(int))
    qps = <const char **>PyMem_Malloc(n * sizeof(const char *))
    fps = <const uint8_t **>PyMem_Malloc(n * sizeof(const uint8_t *))
    nfs = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t))
    ints = <int64_t *>PyMem_Malloc(5 * n * sizeof(int64_t))
    try:
        if rcs == NULL or qps == NULL or fps == NULL or nfs == NULL or ints == NULL:
            raise MemoryError()
        # the pointers stay valid while the GIL is released: the tuples hold the bytes objects, and a QueueRow's
        # fields are read here, not while the files are looked at
        for i in range(n):
            q = held_q[i]  # (typed: anything else raises TypeError)
            row = held_r[i]
            qps[i] = PyBytes_AS_STRING(q)
            fps[i] = <const uint8_t *>PyBytes_AS_STRING(row._files)
            nfs[i] = PyBytes_GET_SIZE(row._files) // QUEUE_SNAPSHOT_FILE_ROW_SIZE
            ints[5 * i], ints[5 * i + 1] = row.dir_ctime, row.dir_ino
            ints[5 * i + 2], ints[5 * i + 3], ints[5 * i + 4] = row.max_offset, row.min_offset, row.max_physic_offset
        with nogil:
            for i in range(n):
                rcs[i] = _row_check(qps[i], fps[i], nfs[i], ints[5 * i], ints[5 * i + 1], ints[5 * i + 2],
                                    ints[5 * i + 3], ints[5 * i + 4], file_size, dev, log_min)
        for i in range(n):
            out[i] = rcs[i]
    finally:
        PyMem_Free(rcs)
        PyMem_Free(qps)
        PyMem_Free(fps)
        PyMem_Free(nfs)
        PyMem_Free(ints)
    return out


cdef extern from "<fcntl.h>" nogil:
    enum: AT_SYMLINK_NOFOLLOW
    enum: O_DIRECTORY
    int c_fstatat "fstatat"(int dirfd, const char *path, stat *buf, int flags)


def dir_stamps(bytes root, list names):
    """The stamps of each ``root/name`` (names as bytes) as a topic row holds them: ``(ctime ns, inode)`` from its
    lstat, ``ROW_LINK`` when it is a symlink (never the directory the snapshot saw), or ``-errno`` when the lstat
    failed. One release of the GIL for the whole list, and each name looked up in ``root`` opened once (an open of
    25,000 topics looks at every topic directory before it uses any): a loop of ``os.lstat`` calls paid about 3 us
    a path in Python. Raises OSError when ``root`` cannot be opened as a directory."""
    cdef Py_ssize_t i, n = len(names)
    cdef list out = [None] * n
    cdef const char **ps
    cdef int *rcs
    cdef int64_t *vals
    cdef stat st
    cdef int dfd
    if n == 0:
        return out
    cdef tuple held = tuple(names)  # the bytes stay alive while the GIL is released
    for i in range(n):
        if type(held[i]) is not bytes:
            raise TypeError(f"names[{i}] is not bytes")
    ps = <const char **>PyMem_Malloc(n * sizeof(const char *))
    rcs = <int *>PyMem_Malloc(n * sizeof(int))
    vals = <int64_t *>PyMem_Malloc(2 * n * sizeof(int64_t))
    dfd = -1
    try:
        if ps == NULL or rcs == NULL or vals == NULL:
            raise MemoryError()
        for i in range(n):
            ps[i] = PyBytes_AS_STRING(<bytes>held[i])
        dfd = c_open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        if dfd < 0:
            raise OSError(errno, os.strerror(errno), os.fsdecode(root))
        with nogil:
            for i in range(n):
                if c_fstatat(dfd, ps[i], &st, AT_SYMLINK_NOFOLLOW) != 0:
                    rcs[i] = -errno
                elif S_ISLNK(st.st_mode):
                    rcs[i] = ROW_LINK_
                else:
                    rcs[i] = 0
                    vals[2 * i] = <int64_t>st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec
                    vals[2 * i + 1] = <int64_t>st.st_ino
        for i in range(n):
            if rcs[i] == 0:
                out[i] = (vals[2 * i], vals[2 * i + 1])
            else:
                out[i] = rcs[i]
    finally:
        if dfd >= 0:
            c_close(dfd)
        PyMem_Free(ps)
        PyMem_Free(rcs)
        PyMem_Free(vals)
    return out
