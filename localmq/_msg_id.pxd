# Offset message ids and stored hosts (_msg_id.pyx), for Message (_record) and PutResult (store/put_result).
from libc.stdint cimport int64_t, uint8_t

cdef str host_text(const uint8_t *p, int n)
cdef str msg_id_of(const uint8_t *host, int host_len, int64_t offset)
