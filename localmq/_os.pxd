# The only cdef extern block for csrc/: every declaration is nogil; see csrc/lmq_os.h for each errno contract.
from libc.stdint cimport int64_t, uint16_t, uint32_t, uint64_t

cdef extern from "lmq_os.h" nogil:
    int lmq_map(int fd, size_t length, int writable, void **out)
    int lmq_unmap(void *addr, size_t length)
    int lmq_msync(void *addr, size_t off, size_t length, int sync)
    int lmq_fdatasync(int fd, int full)
    int lmq_set_timer_slack_ns(long ns)
    int lmq_fallocate(int fd, int64_t off, int64_t length)
    int lmq_fallocate_path(const char *path, uint64_t dev, uint64_t ino, int64_t off, int64_t length, int *stage)
    int lmq_mkdirs(const char *path, int *made, int *missing)
    enum:
        LMQ_CR_FALLBACK, LMQ_CR_FTRUNCATE, LMQ_CR_FALLOCATE, LMQ_CR_FDATASYNC, LMQ_CR_LINK, LMQ_CR_FSTAT,
        LMQ_CR_MMAP, LMQ_CR_CLOSE
    enum:
        LMQ_CR_ADVISE_RANDOM, LMQ_CR_POPULATE_FIRST
    ctypedef struct lmq_created:
        int fd
        void *addr
        uint64_t dev, ino
        int stage
    int lmq_create_mapped(const char *dir, const char *path, int64_t size, int64_t reserve, int sync_size,
                          int keep_fd, int flags, lmq_created *out)
    int lmq_ftruncate(int fd, int64_t length)
    int lmq_mlock(void *addr, size_t off, size_t length)
    int lmq_munlock(void *addr, size_t off, size_t length)
    int lmq_madvise(void *addr, size_t off, size_t length, int advice)
    size_t lmq_pretouch(void *addr, size_t off, size_t length, int write)
    int lmq_populate_write(void *addr, size_t off, size_t length)
    int lmq_mincore(void *addr, size_t off, size_t length, size_t *resident)
    size_t lmq_page_size()
    int lmq_is_zero(const void *p, size_t length)
    int64_t lmq_now_ms()
    void lmq_sleep_us(int64_t us)

    ctypedef struct lmq_event:
        pass
    lmq_event *lmq_event_new()
    void lmq_event_free(lmq_event *ev)
    int lmq_event_wait(lmq_event *ev, int64_t timeout_us)
    void lmq_event_signal(lmq_event *ev)
    void lmq_event_signal_if_waiting(lmq_event *ev)

    ctypedef struct lmq_gc:
        pass
    lmq_gc *lmq_gc_new(int64_t flushed)
    void lmq_gc_free(lmq_gc *gc)
    int lmq_gc_wait(lmq_gc *gc, int64_t target, int64_t timeout_us)
    int64_t lmq_gc_next(lmq_gc *gc, int64_t timeout_us)
    void lmq_gc_publish(lmq_gc *gc, int64_t flushed)
    void lmq_gc_done(lmq_gc *gc, int64_t flushed)
    void lmq_gc_pause(lmq_gc *gc)
    void lmq_gc_set_file(lmq_gc *gc, int fd, int64_t base, int64_t end)
    int lmq_gc_close(lmq_gc *gc, int64_t timeout_us)
    int64_t lmq_gc_flushed(lmq_gc *gc)
    void lmq_gc_fail(lmq_gc *gc, int err, int64_t base)
    int lmq_gc_failed(lmq_gc *gc, int64_t *base)
    int lmq_map_anon(size_t length, void **out)

    enum:
        LMQ_ADV_NORMAL
        LMQ_ADV_RANDOM
        LMQ_ADV_SEQUENTIAL
        LMQ_ADV_WILLNEED
        LMQ_ADV_DONTNEED

    uint16_t lmq_be16(const void *p)
    uint32_t lmq_be32(const void *p)
    uint64_t lmq_be64(const void *p)
    void lmq_put16(void *p, uint16_t v)
    void lmq_put32(void *p, uint32_t v)
    void lmq_put64(void *p, uint64_t v)
    int64_t lmq_load_acq(const int64_t *p)
    void lmq_store_rel(int64_t *p, int64_t v)
    int64_t lmq_fetch_add(int64_t *p, int64_t v)
    void lmq_store_sc(int64_t *p, int64_t v)
    int64_t lmq_load_sc(const int64_t *p)
    void lmq_store_max(int64_t *p, int64_t v)

cdef extern from "lmq_crc.h" nogil:
    # zlib's CRC-32 (crc32_z semantics, chaining, any length); cannot fail. See csrc/lmq_crc.h.
    uint32_t lmq_crc32(uint32_t crc, const void *buf, size_t length)
    uint32_t lmq_crc32_portable(uint32_t crc, const void *buf, size_t length)
    int lmq_crc32_accelerated()

cdef extern from "zlib.h" nogil:
    unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned int length)
