# PutResult: the answer of a put (CommitLog._put / _put_batch fill it at C level; failed_result for a refused put).

cdef class PutResult:
    cdef public object status
    cdef public object uniq_key
    cdef readonly long long physical_offset
    cdef readonly long long queue_offset
    cdef readonly long long wrote_bytes
    cdef readonly long long store_timestamp
    cdef readonly int msg_num
    cdef bytes _host
    cdef bytes _offsets    # a batch's physical offsets (native int64 each), None for one message or > 4096

cdef PutResult new_result()
cdef PutResult failed_result(object status)
