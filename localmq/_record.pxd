# RocketMQ CommitLog records (4.x V1, 5.x V2): the one decoder (parse_record) and encoder (write_record) of a record,
# shared by the put path, the dispatcher, the get path, recovery, the readers and the columnar decoder. Layout
# constants: _layout.pxd.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

# parse_record outcomes (localmq.status.RecordStatus.of maps them to names)
cdef enum:
    REC_OK = 0
    REC_BLANK = 1        # end-of-file blank record: move to the next segment
    REC_END = 2          # zero bytes where a record would start: the end of written data
    REC_TORN = 3         # a record that runs past the readable bytes
    REC_BAD_MAGIC = 4
    REC_BAD_LENGTH = 5   # TOTALSIZE disagrees with the fields (RocketMQ: size reported, record invalid)
    REC_BAD_CRC = 6
    REC_GAP = 7          # a gap record (damaged bytes recovery quarantined): skip TOTALSIZE bytes and go on
    REC_BAD_TOPIC = 8    # a topic name outside [%|a-zA-Z0-9_-]{1,127} (V2: {1,255}; walk_records / find_record)

cdef struct RecordView:
    int32_t total_size
    int32_t magic
    int32_t topic_len_size        # 1 (V1 record) or 2 (V2: int16 topic length); set for both magics only
    uint32_t body_crc
    int32_t queue_id
    int32_t flag
    int64_t queue_offset
    int64_t physical_offset
    int32_t sys_flag
    int64_t born_timestamp
    const uint8_t *born_host      # address bytes then int32 port, 8 or 20 bytes
    int32_t born_host_len
    int64_t store_timestamp
    const uint8_t *store_host
    int32_t store_host_len
    int32_t reconsume_times
    int64_t prepared_transaction_offset
    const uint8_t *body
    int32_t body_len
    const uint8_t *topic
    int32_t topic_len
    const uint8_t *props
    int32_t props_len

cdef int parse_record(const uint8_t *p, int64_t avail, RecordView *v, bint check_crc) noexcept nogil
cdef bint props_torn(const uint8_t *base, const RecordView *v) noexcept nogil
cdef int64_t calc_msg_length(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len) noexcept nogil
cdef int64_t calc_msg_length_v(int32_t sys_flag, int64_t body_len, int64_t topic_len, int64_t props_len,
                               int32_t topic_len_size) noexcept nogil
cdef uint32_t body_crc32(const uint8_t *p, int64_t n) noexcept nogil
cdef int32_t java_hash_utf8(const uint8_t *s, int64_t n) noexcept nogil
cdef bint find_property(const uint8_t *props, int32_t n, const char *key, int32_t keylen,
                        const uint8_t **val, int32_t *vlen) noexcept nogil
cdef int64_t tags_code_of(const RecordView *v, const int64_t *levels, int32_t n_levels) noexcept nogil
cdef bint is_schedule_record(const RecordView *v) noexcept nogil
cdef void write_record(uint8_t *dst, int32_t total, int32_t queue_id, int32_t flag, int64_t queue_offset,
                       int64_t physical_offset, int32_t sys_flag, int64_t born_timestamp,
                       const uint8_t *born_host, int32_t born_host_len, int64_t store_timestamp,
                       const uint8_t *store_host, int32_t store_host_len, int32_t reconsume_times,
                       int64_t prepared_transaction_offset, const uint8_t *body, int32_t body_len,
                       const uint8_t *topic, int32_t topic_len, const uint8_t *props, int32_t props_len) noexcept nogil
cdef int32_t encode_head(uint8_t *p, bint v2, int32_t queue_id, int32_t flag, int32_t sys_flag,
                         int64_t born_timestamp, const uint8_t *born_host, int32_t born_host_len,
                         int64_t store_timestamp, const uint8_t *store_host, int32_t store_host_len,
                         int32_t reconsume_times, int64_t prepared_transaction_offset) noexcept nogil
cdef void encode_own(uint8_t *p, int32_t head_len, int32_t total, int64_t queue_offset, int64_t physical_offset,
                     const uint8_t *body, int32_t body_len, bint v2, const uint8_t *topic, int32_t topic_len,
                     const uint8_t *props, int32_t props_len) noexcept nogil
# encode_head's longest head: 48 fixed bytes, IPv6 born and store hosts (20 each), store timestamp 8, 16 after
cdef enum:
    REC_HEAD_MAX = 112
cdef void write_blank(uint8_t *dst, int32_t size) noexcept nogil

cdef class Message:
    cdef readonly str topic
    cdef readonly int queue_id
    cdef readonly long long queue_offset
    cdef readonly long long physical_offset
    cdef readonly long long store_timestamp
    cdef readonly long long born_timestamp
    cdef readonly long long prepared_transaction_offset
    cdef readonly int flag
    cdef readonly int sys_flag
    cdef readonly int reconsume_times
    cdef readonly int store_size
    cdef readonly unsigned int body_crc
    cdef readonly object body
    cdef bytes _props_raw
    cdef dict _props
    cdef uint8_t _store_host[20]
    cdef uint8_t _born_host[20]
    cdef int _store_host_len
    cdef int _born_host_len
    cdef object _acker   # the consumer's queue cursor that handed it out (manual_ack), else None

cdef Message message_from_view(const RecordView *v, str topic, bint copy_body, object owner)
cdef int check_position(Py_ssize_t pos, Py_ssize_t n, str name) except -1
