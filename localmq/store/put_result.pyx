# cython: boundscheck=False, wraparound=False, cdivision=True
"""PutResult: what a put or put_batch answers (RocketMQ's PutMessageResult), for the CommitLog and the other queues."""
cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.stdint cimport int64_t, uint8_t

from localmq._msg_id cimport msg_id_of

from localmq.status import PutStatus

cdef object PUT_OK = PutStatus.PUT_OK


@cython.freelist(256)
cdef class PutResult:
    """Result of a put or put_batch: ``status`` (PutStatus), ``physical_offset`` and ``queue_offset`` of the first
    message, ``wrote_bytes``, ``store_timestamp``, ``msg_num``, and ``msg_id`` (comma-joined ids for a batch).
    ``uniq_key``: the client message id (UNIQ_KEY) a Producer's ``send`` gave the message (RocketMQ's
    SendResult.getMsgId), None for a plain put."""

    @property
    def msg_id(self):
        if self.physical_offset < 0 or self._host is None:
            return None
        cdef const uint8_t *h = <const uint8_t *>PyBytes_AS_STRING(self._host)
        cdef int n = PyBytes_GET_SIZE(self._host)
        if self._offsets is None:
            return msg_id_of(h, n, self.physical_offset)
        cdef const int64_t *offs = <const int64_t *>PyBytes_AS_STRING(self._offsets)
        cdef Py_ssize_t i
        return ",".join([msg_id_of(h, n, offs[i]) for i in range(PyBytes_GET_SIZE(self._offsets) // sizeof(int64_t))])

    @property
    def ok(self):
        return self.status is PUT_OK

    def __repr__(self):
        return (f"PutResult(status={self.status.name}, physical_offset={self.physical_offset}, "
                f"queue_offset={self.queue_offset}, wrote_bytes={self.wrote_bytes}, msg_num={self.msg_num})")


cdef PutResult new_result():
    # the put path's allocation (from the freelist): here, where the type's tp_new is a direct call, not in the
    # cimporting module, which would call it through the type object and test the type of what it returns
    return PutResult.__new__(PutResult)


cdef PutResult failed_result(object status):
    cdef PutResult r = PutResult.__new__(PutResult)
    r.status = status
    r.physical_offset = -1
    r.queue_offset = -1
    return r


def make_put_result(status, long long physical_offset, long long queue_offset, long long wrote_bytes,
                    long long store_timestamp, int msg_num=1):
    """A PutResult for queues other than the CommitLog (Memory, Embedded): no store host, so ``msg_id`` is None."""
    cdef PutResult r = PutResult.__new__(PutResult)
    r.status = status
    r.physical_offset = physical_offset
    r.queue_offset = queue_offset
    r.wrote_bytes = wrote_bytes
    r.store_timestamp = store_timestamp
    r.msg_num = msg_num
    return r
