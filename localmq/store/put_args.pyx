# cython: boundscheck=False, wraparound=False, cdivision=True
"""What a put is handed: a topic's queue offsets (TopicEntry), a re-put's record fields (PutExtra), their checks."""
cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memset

from localmq._layout cimport CTL_TOPIC_QUEUES, END_FILE_MIN_BLANK_LENGTH, HOST_V4_SIZE, HOST_V6_SIZE, MAX_QUEUE_ID
from localmq._record cimport calc_msg_length

from localmq._record import pack_host
from localmq.config import body_length, body_type_error
from localmq.errors import ArgumentOverflowError, InvalidQueueIdError, MessageSizeError
from localmq.status import PutStatus


cdef class TopicEntry:
    """Per-topic put state: the encoded name and the next queue offset of each queue id."""

    def __cinit__(self, str topic):
        self.topic = topic
        self.encoded = topic.encode("ascii")
        self.next_offsets = NULL
        self.n_queues = 0

    def __dealloc__(self):
        if not self.shared:
            PyMem_Free(self.next_offsets)

    cdef int ensure(self, int32_t queue_id) except -1:
        cdef int32_t n
        cdef int64_t *p
        if queue_id < self.n_queues:
            return 0
        if self.shared:
            raise InvalidQueueIdError(f"queue id {queue_id}: a store shared between processes has queue ids "
                                      f"0..{CTL_TOPIC_QUEUES - 1} per topic")
        n = queue_id + 1 if queue_id + 1 > self.n_queues * 2 else self.n_queues * 2
        if n < 8:
            n = 8
        if n > MAX_QUEUE_ID + 1:
            n = MAX_QUEUE_ID + 1
        p = <int64_t *>PyMem_Realloc(self.next_offsets, n * sizeof(int64_t))
        if p == NULL:
            raise MemoryError()
        memset(p + self.n_queues, 0, (n - self.n_queues) * sizeof(int64_t))
        self.next_offsets = p
        self.n_queues = n
        return 0

    def next_offset(self, int queue_id):
        if queue_id < self.n_queues:
            return self.next_offsets[queue_id]
        return 0

    def queue_ids(self):
        return [q for q in range(self.n_queues) if self.next_offsets[q] > 0]


cdef int get_body_buffer(object body, Py_buffer *view, str argument) except -1:
    """PyObject_GetBuffer for a message body, with a typed error naming ``argument`` when it is not bytes-like."""
    try:
        PyObject_GetBuffer(body, view, PyBUF_SIMPLE)
    except TypeError:
        raise body_type_error(body, argument) from None
    return 0


cdef object overflow_error(object queue_id, object flag):
    """The typed error for a queue id or flag too large for a C int (the conversion raised OverflowError)."""
    if not -(1 << 31) <= queue_id < (1 << 31):
        return InvalidQueueIdError(f"queue id {queue_id} outside 0..{MAX_QUEUE_ID}")
    return ArgumentOverflowError(f"flag {flag} does not fit an int32", argument="flag")


@cython.final
cdef class PutExtra:
    """The record fields of a broker-side re-put (``CommitLog.put_ext``): ``sys_flag`` (its host bits are
    recomputed from the hosts), ``born_timestamp`` (-1: the store time), ``born_host`` and ``store_host``
    ("ip:port" or packed bytes; None: this store's; a 4.9.8 broker's re-puts keep the record's store host),
    ``reconsume_times``, ``prepared_transaction_offset``, ``raw_properties`` (the exact stored properties bytes,
    RocketMQ's copy of a record's string; None: built from tags, keys and properties as ``put`` does)."""

    def __init__(self, *, int sys_flag=0, long long born_timestamp=-1, object born_host=None, object store_host=None,
                 int reconsume_times=0, long long prepared_transaction_offset=0, object raw_properties=None):
        """Raises ValueError (a negative reconsume count, a host of the wrong size), TypeError."""
        if reconsume_times < 0:
            raise ValueError("reconsume_times must be >= 0")
        if born_host is not None and not isinstance(born_host, bytes):
            born_host = pack_host(born_host)
        if born_host is not None and len(born_host) not in (HOST_V4_SIZE, HOST_V6_SIZE):
            raise ValueError(f"born_host must pack to {HOST_V4_SIZE} or {HOST_V6_SIZE} bytes, not {len(born_host)}")
        if store_host is not None and not isinstance(store_host, bytes):
            store_host = pack_host(store_host)
        if store_host is not None and len(store_host) not in (HOST_V4_SIZE, HOST_V6_SIZE):
            raise ValueError(f"store_host must pack to {HOST_V4_SIZE} or {HOST_V6_SIZE} bytes, not {len(store_host)}")
        if raw_properties is not None and not isinstance(raw_properties, bytes):
            raise TypeError("raw_properties must be bytes")
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.store_host = store_host
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.raw_properties = raw_properties

    def __repr__(self):
        return (f"PutExtra(sys_flag={self.sys_flag:#x}, born_timestamp={self.born_timestamp}, "
                f"reconsume_times={self.reconsume_times}, "
                f"prepared_transaction_offset={self.prepared_transaction_offset})")


cdef int check_batch(list blist, int64_t tlen, int64_t plen, int32_t sys_flag, int64_t max_message_size,
                     int64_t file_size) except -1:
    """Every body of a batch is bytes-like, at most ``max_message_size`` bytes, and its record fits a segment of
    ``file_size``: a batch is refused whole, never half-written because of bad input."""
    cdef Py_ssize_t i
    cdef int64_t blen
    cdef int64_t fixed = calc_msg_length(sys_flag, 0, tlen, plen) + END_FILE_MIN_BLANK_LENGTH  # + the body's length
    cdef object b
    for i in range(PyList_GET_SIZE(blist)):
        b = <object>PyList_GET_ITEM(blist, i)
        if type(b) is bytes:
            blen = PyBytes_GET_SIZE(b)
        else:
            blen = body_length(b, f"bodies[{i}]")
        if blen > max_message_size:
            raise MessageSizeError(f"body {i} of {blen} bytes exceeds max_message_size {max_message_size}",
                                   PutStatus.MESSAGE_ILLEGAL)
        if fixed + blen > file_size:
            raise MessageSizeError(f"body {i} cannot fit a segment of {file_size}", PutStatus.MESSAGE_ILLEGAL)
    return 0
