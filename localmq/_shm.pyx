"""The multi-process control file: a robust writer lock, an eventcount and liveness slots shared through one mapping."""
import os
import random
import sys
import weakref

from cpython.exc cimport PyErr_CheckSignals
from libc.errno cimport EAGAIN, errno
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

from localmq._layout cimport (
    CTL_DISPATCH_EVENT_OFF, CTL_EVENT_OFF, CTL_EVENT_SIZE, CTL_FLUSH_REQ_EVENT_OFF, CTL_FLUSHED_EVENT_OFF,
    CTL_GROUP_LOCK_OFF, CTL_ROWS_OFF, CTL_S_TOPIC_ROWS, CTL_T_NAME, CTL_T_NAME_LEN, CTL_T_NAME_MAX, CTL_T_STATE,
    CTL_TOPIC_COUNT, CTL_TOPIC_ROW, CTL_TOPIC_SLOTS, CTL_TOPICS_OFF, CTL_FILE_SIZE, CTL_H_FILE_SIZE, CTL_H_GENERATION,
    CTL_H_INIT_PID,
    CTL_H_INIT_TIME_MS, CTL_H_MAGIC, CTL_H_SLOT_COUNT, CTL_H_VERSION, CTL_LOCK_BYTE_OPEN, CTL_LOCK_OFF, CTL_LOCK_SIZE,
    CTL_MAGIC, CTL_SLOT_CLAIMED_MS, CTL_SLOT_COUNT, CTL_SLOT_LOCK_BASE, CTL_SLOT_PID, CTL_SLOT_SIZE, CTL_SLOTS_OFF,
    CTL_T_DISPATCHED, CTL_T_NEXT, CTL_TOPIC_QUEUES, CTL_VERSION,
)
from localmq._native cimport c_fallocate, c_ftruncate, c_map, c_unmap, raise_errno
from localmq._os cimport lmq_load_acq, lmq_now_ms, lmq_sleep_us, lmq_store_rel, lmq_unmap
from localmq.errors import (
    ControlFileError, CorruptStoreError, InvalidTopicError, LockNotRecoverableError, SlotsFullError, StoreBusyError,
    TopicTableFullError,
)

ACQUIRED = "acquired"
OWNER_DIED = "owner_died"

# Blocking waits run in slices of at most this long, so that Ctrl-C (a pending Python signal) ends them.
cdef int64_t SLICE_US = 1000000
cdef int RANGE_UNLOCK = 0
cdef int RANGE_READ = 1
cdef int RANGE_WRITE = 2

if CTL_LOCK_SIZE != LMQ_SHM_LOCK_BYTES or CTL_EVENT_SIZE != LMQ_SHM_EVENT_BYTES:
    raise ImportError("localmq.layout CTL_LOCK_SIZE / CTL_EVENT_SIZE disagree with csrc/lmq_shm.h")
if lmq_shm_lock_size() > CTL_LOCK_SIZE:
    raise ImportError(f"pthread mutex of {lmq_shm_lock_size()} bytes does not fit CTL_LOCK_SIZE")

# (st_dev, st_ino) of every control file open in this process. POSIX record locks belong to the process and
# closing ANY descriptor of the file drops them all, so a second open (and its close) would silently free this
# process's slot. A forked child holds no record locks and starts with an empty registry.
_open_files = set()


# Every ControlFile of this process. A forked child inherits their descriptors but none of the record locks; if the
# child closed one (explicitly, or when the inherited object is collected), the close would drop every lock the
# child takes on the same file later (its own attachment, slot, housekeeper byte). So in the child the inherited
# objects forget their descriptor (it stays open, unused) and count as closed.
_live_files = weakref.WeakSet()
# (st_dev, st_ino) -> the ControlFile open on it in this process (readers of the same store look through it rather
# than open a second descriptor, whose close would drop this process's locks)
_by_key = weakref.WeakValueDictionary()


def _forget_open_files():
    _open_files.clear()
    _by_key.clear()
    for cf in list(_live_files):
        (<ControlFile>cf).fd = -1
        (<ControlFile>cf).inherited = True


os.register_at_fork(after_in_child=_forget_open_files)


cdef inline int64_t timeout_us(object timeout) except? -2:
    """Seconds (None = forever) as microseconds (-1 = forever)."""
    if timeout is None:
        return -1
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, not {timeout!r}")
    return <int64_t>(timeout * 1e6)


cdef inline uint32_t load_u32(const char *p) noexcept nogil:
    return (<const uint32_t *>p)[0]


cdef class ControlFile:
    """The control file of a store directory (``<root>/mpctl``, layout.CTL_*), mapped MAP_SHARED.

    Opening attaches this process: the first process to attach (nobody else holds the file's open byte)
    initialises it afresh: header, writer lock, eventcount, empty slot table; it is a cache of shared state, never
    read back after all processes left. Others wait (at most ``timeout`` seconds) for a running initialisation.
    Open one ControlFile per file and process: closing a second descriptor of the file would drop this process's
    fcntl locks (its slot and its attachment).

    :param path: the control file; created when missing.
    :param timeout: seconds to wait for another process's initialisation.
    :raises ControlFileError: the file is already open in this process.
    :raises StoreBusyError: an initialisation by another process did not end within ``timeout``.
    :raises CorruptStoreError: the file is attached by live processes but has another magic or version.
    :raises OSError: open, lock, resize or map failed.
    """

    def __cinit__(self):
        self.fd = -1
        self.addr = NULL

    def __init__(self, path, *, timeout=10.0):
        self.path = os.fspath(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if key in _open_files:
            os.close(fd)
            raise ControlFileError(f"{self.path} is already open in this process (open it once per process)")
        self.fd = fd
        try:
            self._open(timeout)
        except BaseException:
            if self.addr != NULL:
                c_unmap(self.addr, CTL_FILE_SIZE, self.path)
                self.addr = NULL
            os.close(self.fd)  # drops this process's record locks on the file
            self.fd = -1
            raise
        self.key = key
        _open_files.add(key)
        _live_files.add(self)
        _by_key[key] = self
        self.lock = WriteLock.__new__(WriteLock)
        self.lock.ctl = self
        self.lock.p = self.addr + CTL_LOCK_OFF
        self.group_lock = WriteLock.__new__(WriteLock)
        self.group_lock.ctl = self
        self.group_lock.p = self.addr + CTL_GROUP_LOCK_OFF
        self.events = EventCount.__new__(EventCount)
        self.events.ctl = self
        self.events.p = self.addr + CTL_EVENT_OFF
        self.dispatched_events = EventCount.__new__(EventCount)
        self.dispatched_events.ctl = self
        self.dispatched_events.p = self.addr + CTL_DISPATCH_EVENT_OFF
        self.flushed_events = EventCount.__new__(EventCount)
        self.flushed_events.ctl = self
        self.flushed_events.p = self.addr + CTL_FLUSHED_EVENT_OFF
        self.flush_requests = EventCount.__new__(EventCount)
        self.flush_requests.ctl = self
        self.flush_requests.p = self.addr + CTL_FLUSH_REQ_EVENT_OFF
        self.slots = Slots.__new__(Slots)
        self.slots.ctl = self
        self.slots.mine_slot = -1

    cdef int _open(self, double timeout) except -1:
        cdef int rc, err = 0, fd = self.fd
        cdef void *addr = NULL
        cdef int64_t deadline = lmq_shm_monotonic_ns() + <int64_t>(timeout * 1e9)
        while True:
            with nogil:  # fcntl F_SETLK on the open byte: try to become the initialiser
                rc = lmq_shm_range_lock(fd, CTL_LOCK_BYTE_OPEN, 1, RANGE_WRITE)
                if rc < 0:
                    err = errno
            if rc < 0:
                raise_errno(err, self.path)
            if rc == 0:
                self._initialise()
                with nogil:  # downgrade to a shared attachment (atomic for POSIX record locks)
                    rc = lmq_shm_range_lock(fd, CTL_LOCK_BYTE_OPEN, 1, RANGE_READ)
                    if rc != 0:
                        err = errno
                if rc != 0:
                    raise_errno(err, self.path)
                self.initialised = True
                return 0
            with nogil:  # attach beside the live processes (refused while one initialises)
                rc = lmq_shm_range_lock(fd, CTL_LOCK_BYTE_OPEN, 1, RANGE_READ)
                if rc < 0:
                    err = errno
            if rc < 0:
                raise_errno(err, self.path)
            if rc == 0:
                if os.fstat(fd).st_size < CTL_FILE_SIZE:
                    # another version's file, live (its processes hold it): say so rather than wait for it
                    head = os.pread(fd, 8, 0)
                    if len(head) == 8 and int.from_bytes(head[:4], sys.byteorder) == CTL_MAGIC:
                        version = int.from_bytes(head[4:], sys.byteorder)
                        if version != CTL_VERSION:
                            lmq_shm_range_lock(fd, CTL_LOCK_BYTE_OPEN, 1, RANGE_UNLOCK)
                            raise CorruptStoreError(f"{self.path}: control file version {version} (a process of "
                                                    f"another localmq version shares this store), this localmq "
                                                    f"reads {CTL_VERSION}")
                else:
                    if self.addr == NULL:
                        c_map(fd, CTL_FILE_SIZE, True, &addr, self.path)
                        self.addr = <char *>addr
                    # the initialiser stores the magic last, with release ordering
                    if lmq_shm_load_u32_acq(self.addr + CTL_H_MAGIC) == CTL_MAGIC:
                        version = load_u32(self.addr + CTL_H_VERSION)
                        if version != CTL_VERSION or load_u32(self.addr + CTL_H_FILE_SIZE) != CTL_FILE_SIZE:
                            raise CorruptStoreError(
                                f"{self.path}: control file version {version}, this localmq reads {CTL_VERSION}")
                        return 0
                # An initialiser died between our two attempts: let go and try to initialise it ourselves.
                with nogil:  # fcntl F_UNLCK
                    lmq_shm_range_lock(fd, CTL_LOCK_BYTE_OPEN, 1, RANGE_UNLOCK)
            if lmq_shm_monotonic_ns() >= deadline:
                raise StoreBusyError(f"{self.path}: another process's initialisation of the control file did not "
                                     f"end within {timeout} s", timeout=timeout)
            with nogil:  # an initialisation takes microseconds; this wait is rare
                lmq_sleep_us(1000)

    cdef int _initialise(self) except -1:
        cdef void *addr = NULL
        cdef int err
        cdef char *a
        if os.fstat(self.fd).st_size > CTL_ROWS_OFF:
            # the topic arena of the last initialisation goes (nobody else has the file mapped now): cut to the fixed
            # sections and grown again, it is a hole that reads as zeros and holds no blocks
            c_ftruncate(self.fd, CTL_ROWS_OFF, self.path)
        c_ftruncate(self.fd, CTL_FILE_SIZE, self.path)
        # real blocks for the fixed sections, so a full disk cannot SIGBUS a store through the mapping (a topic row's
        # blocks are reserved when it is added: topic_row_add)
        c_fallocate(self.fd, 0, CTL_ROWS_OFF, self.path)
        if self.addr == NULL:
            c_map(self.fd, CTL_FILE_SIZE, True, &addr, self.path)
            self.addr = <char *>addr
        a = self.addr
        # nobody else is attached (we hold the open byte exclusively): a fresh start, whatever was there
        lmq_shm_store_u32_rel(a + CTL_H_MAGIC, 0)
        memset(a, 0, CTL_ROWS_OFF)
        (<uint32_t *>(a + CTL_H_VERSION))[0] = CTL_VERSION
        (<uint32_t *>(a + CTL_H_FILE_SIZE))[0] = CTL_FILE_SIZE
        (<uint32_t *>(a + CTL_H_SLOT_COUNT))[0] = CTL_SLOT_COUNT
        (<uint64_t *>(a + CTL_H_GENERATION))[0] = random.getrandbits(64)
        (<int32_t *>(a + CTL_H_INIT_PID))[0] = lmq_shm_pid()
        (<int64_t *>(a + CTL_H_INIT_TIME_MS))[0] = lmq_now_ms()
        if lmq_shm_lock_init(a + CTL_LOCK_OFF) != 0:
            err = errno
            raise_errno(err, self.path)
        if lmq_shm_lock_init(a + CTL_GROUP_LOCK_OFF) != 0:
            err = errno
            raise_errno(err, self.path)
        lmq_shm_event_init(a + CTL_EVENT_OFF)
        lmq_shm_event_init(a + CTL_DISPATCH_EVENT_OFF)
        lmq_shm_event_init(a + CTL_FLUSHED_EVENT_OFF)
        lmq_shm_event_init(a + CTL_FLUSH_REQ_EVENT_OFF)
        lmq_shm_store_u32_rel(a + CTL_H_MAGIC, CTL_MAGIC)
        return 0

    cdef int _check(self) except -1:
        if self.inherited:
            raise ControlFileError(f"{self.path}: this control file was opened by the process that forked this one; "
                                   "open the store again in this process")
        if self.addr == NULL:
            raise ControlFileError(f"{self.path}: control file closed")
        return 0

    @property
    def generation(self):
        """Random 64-bit number chosen at the last initialisation (a process that sees it change must re-attach)."""
        self._check()
        return (<uint64_t *>(self.addr + CTL_H_GENERATION))[0]

    @property
    def closed(self):
        return self.addr == NULL or self.inherited

    # -- shared words and the topic table (the store's use of the reserved sections, layout.CTL_S_* / CTL_T_*) --

    def load(self, long long off):
        """The int64 at byte ``off`` (acquire load)."""
        self._check()
        check_word(off)
        return lmq_load_acq(<int64_t *>(self.addr + off))

    def store(self, long long off, long long value):
        """Store ``value`` as the int64 at byte ``off`` (release store). Shared words are written under the writer
        lock unless layout says otherwise."""
        self._check()
        check_word(off)
        lmq_store_rel(<int64_t *>(self.addr + off), value)

    def read_bytes(self, long long off, long long n):
        """A copy of ``n`` bytes at ``off`` (callers hold the lock that guards them)."""
        self._check()
        if off < 0 or n < 0 or off + n > CTL_FILE_SIZE:
            raise ValueError(f"control file range [{off}, {off + n}) out of the file")
        return <bytes>(self.addr + off)[:n]

    def write_bytes(self, long long off, const unsigned char[:] data):
        """Copy ``data`` to ``off`` (callers hold the lock that guards the range)."""
        self._check()
        cdef Py_ssize_t n = data.shape[0]
        if off < 0 or off + n > CTL_FILE_SIZE:
            raise ValueError(f"control file range [{off}, {off + n}) out of the file")
        if n:
            memcpy(self.addr + off, &data[0], n)

    def topic_row(self, str topic, bint create=False):
        """Byte offset of ``topic``'s row in the topic table, or -1 when it has none (and ``create`` is false).

        :param create: add the row when missing; the caller holds the writer lock.
        :raises TopicTableFullError: ``create`` and all CTL_TOPIC_COUNT rows are taken.
        :raises InvalidTopicError: ``create`` and a name longer than a row holds (CTL_T_NAME_MAX bytes).
        """
        self._check()
        return self._row(topic, create, 0)

    def publish_queues(self, dict rows, dict next_offsets):
        """A first opener's queues kept as their snapshot rows, before any other process attaches (no writer lock
        needed): for each (topic, queue id) -> row (an object with ``max_offset``), the row's max offset written as
        the queue's unit count (CTL_T_DISPATCHED) and, or the put path's next offset in ``next_offsets`` when larger,
        as its next offset (CTL_T_NEXT), topic rows made as needed: one call for 100,000 queues.

        :raises ValueError: a queue id outside 0..CTL_TOPIC_QUEUES-1 (the caller checks them first).
        """
        cdef str topic, last = None
        cdef long long off = -1, qid, nxt, count
        cdef tuple key
        cdef int64_t used, adds = 0
        self._check()
        # the blocks of the rows it adds reserved in one call, not one a topic (a full disk raises here, before any
        # row is named; topic_row_add then reserves nothing)
        for topic in {key[0] for key in rows}:
            adds += topic_row_c(self.addr, topic.encode("ascii")) == NULL
        used = lmq_load_acq(<int64_t *>(self.addr + CTL_S_TOPIC_ROWS))
        adds = min(adds, CTL_TOPIC_COUNT - used) if 0 <= used < CTL_TOPIC_COUNT else 0
        if adds > 0:
            c_fallocate(self.fd, CTL_ROWS_OFF + used * CTL_TOPIC_ROW, adds * CTL_TOPIC_ROW, self.path)
        for key, row in rows.items():
            topic, qid = key
            if topic is not last and topic != last:
                off, last = self._row(topic, True, used + adds), topic
            if not 0 <= qid < CTL_TOPIC_QUEUES:
                raise ValueError(f"queue {topic}-{qid}: a shared store's queue ids are 0..{CTL_TOPIC_QUEUES - 1}")
            count = row.max_offset
            nxt = count
            if next_offsets:
                nxt = max(count, <long long>next_offsets.get(key, 0))
            lmq_store_rel(<int64_t *>(self.addr + off + CTL_T_NEXT + 8 * qid), nxt)
            lmq_store_rel(<int64_t *>(self.addr + off + CTL_T_DISPATCHED + 8 * qid), count)

    cdef long long _row(self, str topic, bint create, int64_t reserved) except -2:
        """``topic``'s row offset, or -1 when it has none and not ``create`` (else added, see ``topic_row_add`` for
        ``reserved``: the blocks of the rows below this index are reserved already)."""
        cdef bytes name = topic.encode("ascii")
        if create and len(name) > CTL_T_NAME_MAX:
            raise InvalidTopicError(f"topic {topic!r} is {len(name)} bytes: a store shared between processes holds "
                                    f"topic names of at most {CTL_T_NAME_MAX} bytes")
        cdef char *row = topic_row_c(self.addr, name)
        if row != NULL:
            return row - self.addr
        if not create:
            return -1
        return topic_row_add(self, name, reserved) - self.addr

    def range_lock(self, long long byte, int kind):
        """Try once to take (kind 2 write, 1 read) or drop (0) this process's fcntl lock on ``byte`` of the file.

        :returns: True when granted, False when another process holds a conflicting lock.
        """
        cdef int rc, err = 0, fd
        self._check()
        fd = self.fd
        with nogil:  # fcntl F_SETLK
            rc = lmq_shm_range_lock(fd, byte, 1, kind)
            if rc < 0:
                err = errno
        if rc < 0:
            raise_errno(err, self.path)
        return rc == 0

    def last_attached(self):
        """True when no other process is attached (this one's attachment becomes exclusive; it stays so until
        ``close``). The last process to leave a store closes it cleanly."""
        return self.range_lock(CTL_LOCK_BYTE_OPEN, RANGE_WRITE)

    def close(self):
        """Detach: release this process's slot, unmap, close the descriptor (which drops its fcntl locks).

        :raises ControlFileError: this process holds the writer lock, or another thread waits in this file (after
            an unmap a later death of this process could not be told apart from a clean exit).
        """
        if self.inherited:
            # a forked child: the parent's mapping goes, its descriptor stays (closing it would drop our own locks)
            if self.addr != NULL:
                c_unmap_quiet(self.addr)
                self.addr = NULL
            return
        if self.addr == NULL:
            return
        if self.lock.holds > 0:
            raise ControlFileError(f"{self.path}: close() while this process holds the writer lock")
        if self.busy > 0:
            raise ControlFileError(f"{self.path}: close() while another thread waits on this control file")
        if self.slots.mine() is not None:
            self.slots.release()
        addr, self.addr = self.addr, NULL
        try:
            c_unmap(addr, CTL_FILE_SIZE, self.path)
        finally:
            fd, self.fd = self.fd, -1
            _open_files.discard(self.key)
            os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        # no close(): unmap quietly (a holder's death is still detected: the kernel walks robust lists by address
        # only while mapped, which is why close() refuses while the lock is held)
        if self.addr != NULL:
            c_unmap_quiet(self.addr)
            self.addr = NULL
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __repr__(self):
        return f"<ControlFile {self.path!r}{' closed' if self.addr == NULL else ''}>"


cdef int _process_of(int32_t tid) except? -1:
    """The process (thread group) of thread ``tid`` (/proc/<tid>/status), ``tid`` itself when that cannot be read."""
    try:
        with open(f"/proc/{tid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return tid


cdef inline int check_word(long long off) except -1:
    if off < 0 or off + 8 > CTL_FILE_SIZE or off % 8 != 0:
        raise ValueError(f"control file word offset {off} out of range or unaligned")
    return 0


cdef inline uint64_t name_hash(const char *p, Py_ssize_t n) noexcept nogil:
    cdef uint64_t h = 1469598103934665603ULL
    cdef Py_ssize_t i
    for i in range(n):
        h = (h ^ <uint8_t>p[i]) * 1099511628211ULL
    return h


cdef char *topic_row_c(char *base, bytes name) noexcept:
    """The complete row of ``name`` in the topic table, or NULL. Lock-free: an index slot names a row only once the
    row is complete (the slot is release-stored last)."""
    cdef const char *p = name
    cdef Py_ssize_t n = len(name)
    cdef uint64_t i = name_hash(p, n) % CTL_TOPIC_SLOTS
    cdef Py_ssize_t _probe
    cdef uint32_t v
    cdef char *row
    if n > CTL_T_NAME_MAX:
        return NULL  # no row holds it
    for _probe in range(CTL_TOPIC_SLOTS):
        v = lmq_shm_load_u32_acq(base + CTL_TOPICS_OFF + 4 * i)
        if v == 0:
            return NULL  # rows are never removed: an empty slot ends the probe sequence
        if v <= CTL_TOPIC_COUNT:
            row = base + CTL_ROWS_OFF + <int64_t>(v - 1) * CTL_TOPIC_ROW
            if (lmq_shm_load_u32_acq(row + CTL_T_STATE) == 1 and (<uint32_t *>(row + CTL_T_NAME_LEN))[0] == n
                    and memcmp(row + CTL_T_NAME, p, n) == 0):
                return row
        i = (i + 1) % CTL_TOPIC_SLOTS
    return NULL


cdef char *topic_row_add(ControlFile ctl, bytes name, int64_t reserved=0) except NULL:
    """The row of ``name``, added when it has none: the caller holds the writer lock, so rows are added one at a
    time across processes. The row's blocks are reserved first (a full disk raises StoreIOError here, never a SIGBUS
    later), written, and only then named by its index slot; a writer that dies before that leaves an unnamed row
    that is never used. Raises TopicTableFullError when CTL_TOPIC_COUNT rows are in use, InvalidTopicError for a
    name longer than CTL_T_NAME_MAX. ``reserved``: the blocks of the rows below this index are reserved already
    (ControlFile.publish_queues reserved them in one call)."""
    cdef char *base = ctl.addr
    cdef const char *p = name
    cdef Py_ssize_t n = len(name)
    cdef uint64_t i = name_hash(p, n) % CTL_TOPIC_SLOTS
    cdef Py_ssize_t _probe
    cdef int64_t used
    cdef uint32_t v
    cdef char *row
    if n > CTL_T_NAME_MAX:
        raise InvalidTopicError(f"topic of {n} bytes: a store shared between processes holds topic names of at "
                                f"most {CTL_T_NAME_MAX} bytes")
    row = topic_row_c(base, name)
    if row != NULL:
        return row
    used = lmq_load_acq(<int64_t *>(base + CTL_S_TOPIC_ROWS))
    if not 0 <= used < CTL_TOPIC_COUNT:
        raise TopicTableFullError(f"{ctl.path}: the shared topic table holds {CTL_TOPIC_COUNT} topics; a store "
                                  f"shared between processes cannot hold more (open it with shared=False)")
    for _probe in range(CTL_TOPIC_SLOTS):
        v = lmq_shm_load_u32_acq(base + CTL_TOPICS_OFF + 4 * i)
        if v == 0:
            break
        i = (i + 1) % CTL_TOPIC_SLOTS
    else:
        raise TopicTableFullError(f"{ctl.path}: the shared topic index is full")
    if used >= reserved:
        c_fallocate(ctl.fd, CTL_ROWS_OFF + used * CTL_TOPIC_ROW, CTL_TOPIC_ROW, ctl.path)
    row = base + CTL_ROWS_OFF + used * CTL_TOPIC_ROW
    memset(row, 0, CTL_TOPIC_ROW)  # an unnamed row a dead writer left
    (<uint32_t *>(row + CTL_T_NAME_LEN))[0] = <uint32_t>n
    memcpy(row + CTL_T_NAME, p, n)
    lmq_shm_store_u32_rel(row + CTL_T_STATE, 1)
    lmq_store_rel(<int64_t *>(base + CTL_S_TOPIC_ROWS), used + 1)
    lmq_shm_store_u32_rel(base + CTL_TOPICS_OFF + 4 * i, <uint32_t>(used + 1))
    return row


cdef void c_unmap_quiet(char *addr) noexcept:
    with nogil:  # munmap; errors cannot be reported from __dealloc__
        lmq_unmap(addr, CTL_FILE_SIZE)


cdef class WriteLock:
    """The writer lock of the control file: a robust, process-shared mutex (see csrc/lmq_shm.h).

    A holder that dies (SIGKILL, crash, thread exit) hands it to the next acquirer with ``"owner_died"``: that
    caller holds the lock, must repair the state it protects, call ``consistent()``, then ``release()``. A
    stopped holder is alive: acquirers wait and time out with StoreBusyError; the lock is never taken from it.
    One thread of a process holds it at a time; acquiring it twice from one thread is an error (EDEADLK).
    """

    def acquire(self, timeout=10.0):
        """Take the lock.

        :param timeout: seconds to wait; 0 tries once; None waits forever (Ctrl-C still ends the wait).
        :returns: ``"acquired"``, or ``"owner_died"`` (held; repair, then ``consistent()``).
        :raises StoreBusyError: a live process kept it for ``timeout`` seconds; ``.pid`` is the holder's pid.
        :raises LockNotRecoverableError: a recoverer released it without ``consistent()``; every process must
            detach so that the next first opener re-initialises the control file.
        :raises OSError: EDEADLK when the calling thread holds it already.
        """
        cdef int rc, err = 0
        cdef int64_t us = timeout_us(timeout), step, deadline = 0
        cdef void *p = self.p
        self.ctl._check()
        rc = lmq_shm_lock_acquire(p, 0)  # uncontended: a trylock with the GIL held, no thread switch
        if rc < 0:
            err = errno
        elif rc == LMQ_SHM_TIMED_OUT and us != 0:
            if us > 0:
                deadline = lmq_shm_monotonic_ns() + us * 1000
            self.ctl.busy += 1
            try:
                while True:
                    step = SLICE_US
                    if us > 0:
                        step = min(SLICE_US, max(0, (deadline - lmq_shm_monotonic_ns()) // 1000))
                    with nogil:  # sleeps in the kernel (robust futex); the holder may be another thread of ours
                        rc = lmq_shm_lock_acquire(p, step if step > 0 else 0)
                        if rc < 0:
                            err = errno
                    if rc != LMQ_SHM_TIMED_OUT or (us > 0 and lmq_shm_monotonic_ns() >= deadline):
                        break
                    PyErr_CheckSignals()  # raises what a signal handler raised (KeyboardInterrupt)
            finally:
                self.ctl.busy -= 1
        if rc == LMQ_SHM_ACQUIRED:
            self.holds += 1
            return ACQUIRED
        if rc == LMQ_SHM_OWNER_DIED:
            self.holds += 1
            return OWNER_DIED
        if rc == LMQ_SHM_TIMED_OUT:
            pid = self._owner()
            raise StoreBusyError(f"{self.ctl.path}: the writer lock is held by pid {pid} (alive, maybe stopped) "
                                 f"for more than {timeout} s", pid=pid, timeout=timeout)
        if rc == LMQ_SHM_NOT_RECOVERABLE:
            raise LockNotRecoverableError(
                f"{self.ctl.path}: the writer lock is not recoverable (a process took it over from a dead holder "
                f"and released it without consistent()); detach every process to re-initialise it")
        raise_errno(err, self.ctl.path)

    def consistent(self):
        """After ``"owner_died"``, once the protected state is repaired: make the lock usable again.

        :raises OSError: EINVAL when the caller does not hold it after an owner death.
        """
        self.ctl._check()
        cdef int err
        if lmq_shm_lock_consistent(self.p) != 0:  # no system call: under the GIL
            err = errno
            raise_errno(err, self.ctl.path)

    def release(self):
        """Release the lock (releasing after ``"owner_died"`` without ``consistent()`` makes it unrecoverable).

        :raises OSError: EPERM when the calling thread does not hold it.
        """
        self.ctl._check()
        cdef int err
        if lmq_shm_lock_release(self.p) != 0:  # FUTEX_WAKE at most: under the GIL
            err = errno
            raise_errno(err, self.ctl.path)
        self.holds -= 1

    @property
    def owner(self):
        """Pid recorded by the holder (or by the holder that died), 0 when free. For messages only."""
        self.ctl._check()
        return self._owner()

    cdef int _owner(self) except? -1:
        # the pid the holder recorded; a holder stopped in the few instructions between taking the mutex and
        # recording it (or clearing it and releasing) is named by the mutex's own owner thread: its process
        cdef int32_t pid = lmq_shm_lock_owner(self.p)
        cdef int32_t tid
        if pid != 0:
            return pid
        tid = lmq_shm_lock_owner_tid(self.p)
        return _process_of(tid) if tid > 0 else 0

    @property
    def recoveries(self):
        """Owner deaths repaired (``consistent()`` calls) since the control file was initialised."""
        self.ctl._check()
        return lmq_shm_lock_recoveries(self.p)

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


cdef class EventCount:
    """A wake-up counter shared by every process attached to the control file.

    Waiter: ``s = ev.seq()``; look for work; if none, ``ev.wait(s, timeout)``. Notifier: publish the work, then
    ``ev.notify()``. A notify between ``seq()`` and ``wait()`` is never lost: ``wait`` returns at once. ``notify``
    costs one atomic operation and enters the kernel only when a process sleeps in ``wait``.
    """

    def seq(self):
        """The current sequence (an int to hand to ``wait``)."""
        self.ctl._check()
        return lmq_shm_event_seq(self.p)

    @property
    def has_waiters(self):
        """True while some process sleeps in ``wait`` (announced, not yet notified)."""
        self.ctl._check()
        return lmq_shm_event_has_waiters(self.p) != 0

    def notify(self):
        """Advance the sequence and wake every waiter.

        :returns: True when a waiter had announced itself (a FUTEX_WAKE was made), False when nobody waited.
        """
        self.ctl._check()
        return lmq_shm_event_notify(self.p) != 0

    def wait(self, seen, timeout=None):
        """Sleep until the sequence differs from ``seen`` (a ``seq()`` result) or ``timeout`` seconds passed.

        :param timeout: seconds, None = forever (Ctrl-C still ends it).
        :returns: True when the sequence moved (maybe before the call), False on timeout.
        :raises OSError: the futex call failed (EFAULT, ENOSYS).
        """
        cdef int rc, err = 0
        cdef uint32_t s = seen
        cdef int64_t us = timeout_us(timeout), step, deadline = 0
        cdef void *p = self.p
        self.ctl._check()
        if lmq_shm_event_seq(p) != (s & ~1u):
            return True
        if us == 0:
            return False
        if us > 0:
            deadline = lmq_shm_monotonic_ns() + us * 1000
        self.ctl.busy += 1
        try:
            while True:
                step = SLICE_US
                if us > 0:
                    step = min(SLICE_US, max(0, (deadline - lmq_shm_monotonic_ns()) // 1000))
                with nogil:  # FUTEX_WAIT on the shared word until a notify from any process
                    rc = lmq_shm_event_wait(p, s, step)
                    if rc < 0:
                        err = errno
                if rc != 0 or (us > 0 and lmq_shm_monotonic_ns() >= deadline):
                    break
                PyErr_CheckSignals()  # raises what a signal handler raised (KeyboardInterrupt)
        finally:
            self.ctl.busy -= 1
        if rc < 0:
            raise_errno(err, self.ctl.path)
        return rc == 1


cdef class Slots:
    """Participant slots: a process claims one and holds it (a classic POSIX fcntl lock on byte
    ``CTL_SLOT_LOCK_BASE + slot``) until it releases it, closes the control file or dies. ``alive`` asks the kernel,
    so a dead process's slot is free at once, a recycled pid never looks alive and a forked child holds nothing.
    """

    def claim(self):
        """Claim a free slot for this process (once: a second call returns the same slot).

        :returns: the slot number.
        :raises SlotsFullError: every slot is held by a live process.
        :raises OSError: fcntl failed.
        """
        cdef int rc, err = 0, fd
        cdef char *rec
        self.ctl._check()
        if self.mine() is not None:
            return self.mine_slot
        fd = self.ctl.fd
        with nogil:  # up to CTL_SLOT_COUNT fcntl calls
            rc = lmq_shm_slot_claim(fd, CTL_SLOT_LOCK_BASE, CTL_SLOT_COUNT)
            if rc < 0:
                err = errno
        if rc < 0:
            if err == EAGAIN:
                raise SlotsFullError(f"{self.ctl.path}: all {CTL_SLOT_COUNT} slots are held by live processes")
            raise_errno(err, self.ctl.path)
        rec = self.ctl.addr + CTL_SLOTS_OFF + rc * CTL_SLOT_SIZE
        (<int32_t *>(rec + CTL_SLOT_PID))[0] = lmq_shm_pid()
        (<int64_t *>(rec + CTL_SLOT_CLAIMED_MS))[0] = lmq_now_ms()
        self.mine_slot = rc
        self.mine_pid = lmq_shm_pid()
        return rc

    def mine(self):
        """The slot this process holds, or None (also in a forked child of the claimer)."""
        if self.mine_slot < 0 or self.mine_pid != lmq_shm_pid():
            return None
        return self.mine_slot

    def release(self):
        """Give this process's slot back (no-op when it holds none)."""
        cdef int rc, err = 0, fd, slot
        self.ctl._check()
        if self.mine() is None:
            self.mine_slot = -1
            return
        fd, slot = self.ctl.fd, self.mine_slot
        with nogil:  # fcntl F_SETLK F_UNLCK
            rc = lmq_shm_slot_release(fd, CTL_SLOT_LOCK_BASE, slot)
            if rc != 0:
                err = errno
        if rc != 0:
            raise_errno(err, self.ctl.path)
        self.mine_slot = -1

    def holder(self, slot):
        """Pid of the process holding ``slot`` (this process's own pid for its slot), 0 when free.

        The pid comes from the kernel's lock table at the time of the call (0 when the holder is in another pid
        namespace); liveness needs no pid: see ``alive``.
        """
        cdef int rc, err = 0, fd, s = slot
        cdef int32_t pid = 0
        self.ctl._check()
        if not 0 <= s < CTL_SLOT_COUNT:
            raise ValueError(f"slot {slot} outside [0, {CTL_SLOT_COUNT})")
        if self.mine() == s:
            return lmq_shm_pid()
        fd = self.ctl.fd
        with nogil:  # fcntl F_GETLK
            rc = lmq_shm_slot_held(fd, CTL_SLOT_LOCK_BASE, s, &pid)
            if rc < 0:
                err = errno
        if rc < 0:
            raise_errno(err, self.ctl.path)
        return pid if rc == 1 else 0

    def alive(self, slot):
        """True while some live process (this one included) holds ``slot``."""
        cdef int rc, err = 0, fd, s = slot
        cdef int32_t pid = 0
        self.ctl._check()
        if not 0 <= s < CTL_SLOT_COUNT:
            raise ValueError(f"slot {slot} outside [0, {CTL_SLOT_COUNT})")
        if self.mine() == s:
            return True  # POSIX locks never conflict with their own process: F_GETLK cannot see our own
        fd = self.ctl.fd
        with nogil:  # fcntl F_GETLK
            rc = lmq_shm_slot_held(fd, CTL_SLOT_LOCK_BASE, s, &pid)
            if rc < 0:
                err = errno
        if rc < 0:
            raise_errno(err, self.ctl.path)
        return rc == 1

    def claimed_pid(self, slot):
        """The pid the last claimer of ``slot`` wrote into its record (messages only: it stays after death)."""
        self.ctl._check()
        if not 0 <= slot < CTL_SLOT_COUNT:
            raise ValueError(f"slot {slot} outside [0, {CTL_SLOT_COUNT})")
        return (<int32_t *>(self.ctl.addr + CTL_SLOTS_OFF + <int>slot * CTL_SLOT_SIZE + CTL_SLOT_PID))[0]
