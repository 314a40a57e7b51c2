# What a put is handed (store/put_args.pyx): the per-topic put state, a re-put's record fields, argument checks.
from libc.stdint cimport int32_t, int64_t


cdef class TopicEntry:
    cdef readonly str topic
    cdef readonly bytes encoded
    cdef int64_t *next_offsets      # next queue offset per queue id (index = queue id)
    cdef int32_t n_queues
    cdef bint shared                # next_offsets lies in the control file's topic table (not ours to free)
    cdef int ensure(self, int32_t queue_id) except -1


cdef class PutExtra:
    cdef readonly int32_t sys_flag
    cdef readonly int64_t born_timestamp
    cdef readonly bytes born_host
    cdef readonly bytes store_host
    cdef readonly int32_t reconsume_times
    cdef readonly int64_t prepared_transaction_offset
    cdef readonly bytes raw_properties


cdef int get_body_buffer(object body, Py_buffer *view, str argument) except -1
cdef object overflow_error(object queue_id, object flag)
cdef int check_batch(list blist, int64_t tlen, int64_t plen, int32_t sys_flag, int64_t max_message_size,
                     int64_t file_size) except -1
