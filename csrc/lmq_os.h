/* lmq_os.h: the POSIX calls localmq needs, in plain C (no Python.h).
 *
 * Contract for every int-returning function: 0 on success, -1 on failure with errno set
 * (posix_fallocate's returned error is moved into errno). Callers run them with the GIL
 * released and raise OSError(errno, strerror, path) once it is back.
 */
#ifndef LMQ_OS_H
#define LMQ_OS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* mmap(MAP_SHARED) `len` bytes of `fd` from offset 0; *out receives the address. */
int lmq_map(int fd, size_t len, int writable, void **out);
/* munmap. */
int lmq_unmap(void *addr, size_t len);
/* msync [addr+off, addr+off+len) rounded out to whole pages; MS_SYNC when sync != 0 else MS_ASYNC. */
int lmq_msync(void *addr, size_t off, size_t len, int sync);
/* fdatasync(fd); fsync(fd) when full != 0 (directories, metadata). */
int lmq_fdatasync(int fd, int full);
/* The calling thread's timer slack (prctl PR_SET_TIMERSLACK; the default 50 us stretches short timed waits). */
int lmq_set_timer_slack_ns(long ns);
/* posix_fallocate(fd, off, len): reserves the blocks so later writes through a mapping cannot SIGBUS on ENOSPC. */
int lmq_fallocate(int fd, int64_t off, int64_t len);
/* lmq_fallocate through a descriptor opened for the call (path checked to be inode dev/ino); *stage names the call
 * that failed (1 open, 2 fstat / ESTALE, 3 fallocate, 4 close: the blocks are reserved, the close failed). */
int lmq_fallocate_path(const char *path, uint64_t dev, uint64_t ino, int64_t off, int64_t len, int *stage);
/* mkdir -p of path (mode 0777 before the umask), parents first: how many directories it made, or -1 with errno.
 * *missing: how many levels of the path were missing (the last ones); *made: how many of them were made, from the
 * highest down (all of them on success). */
int lmq_mkdirs(const char *path, int *made, int *missing);

/* A new file created sized and named in one call, mapped shared read-write: an unnamed inode in dir (O_TMPFILE),
 * sized (reserve < 0: posix_fallocate of all of it; else ftruncate, then posix_fallocate of the first reserve bytes),
 * fdatasynced when sync_size, linked as path, fstat'ed and mapped (flags: LMQ_CR_ADVISE_RANDOM madvises the mapping
 * MADV_RANDOM, LMQ_CR_POPULATE_FIRST faults its first reserved page in writable; hints, their failures ignored); its
 * descriptor closed unless keep_fd.
 * 0: out has fd (or -1), addr, dev, ino. -1: errno, and out->stage names the call that failed:
 *   LMQ_CR_FALLBACK   no O_TMPFILE here, or the name exists or cannot be linked so: nothing was made (create by name)
 *   FTRUNCATE..LINK   nothing was made;  FSTAT, MMAP: the name was made, and is unlinked again
 *   LMQ_CR_CLOSE      made and mapped (out->addr), but the close of its descriptor failed */
enum { LMQ_CR_FALLBACK = 1, LMQ_CR_FTRUNCATE, LMQ_CR_FALLOCATE, LMQ_CR_FDATASYNC, LMQ_CR_LINK, LMQ_CR_FSTAT,
       LMQ_CR_MMAP, LMQ_CR_CLOSE };
enum { LMQ_CR_ADVISE_RANDOM = 1, LMQ_CR_POPULATE_FIRST = 2 };
typedef struct {
    int fd;
    void *addr;
    uint64_t dev, ino;
    int stage;
} lmq_created;
int lmq_create_mapped(const char *dir, const char *path, int64_t size, int64_t reserve, int sync_size, int keep_fd,
                      int flags, lmq_created *out);
/* ftruncate(fd, len). */
int lmq_ftruncate(int fd, int64_t len);
/* mlock / munlock of a page-rounded range. EPERM / ENOMEM when not permitted. */
int lmq_mlock(void *addr, size_t off, size_t len);
int lmq_munlock(void *addr, size_t off, size_t len);
/* madvise(addr+off, len, advice) on a page-rounded range; advice is one of LMQ_ADV_*. */
enum { LMQ_ADV_NORMAL = 0, LMQ_ADV_RANDOM = 1, LMQ_ADV_SEQUENTIAL = 2, LMQ_ADV_WILLNEED = 3, LMQ_ADV_DONTNEED = 4 };
int lmq_madvise(void *addr, size_t off, size_t len, int advice);
/* Touch one byte of every page of [addr+off, addr+off+len): write a 0 (write != 0) or read it.
 * Writing 0 is only safe on pages known to be zero (a fresh, reserved segment). Cannot fail: returns pages touched. */
size_t lmq_pretouch(void *addr, size_t off, size_t len, int write);
/* Prefault [addr+off, +len) writable without changing its bytes (madvise MADV_POPULATE_WRITE, Linux 5.14+),
 * so a writer racing ahead of it never sees a clobbered page. EINVAL on kernels without it. */
int lmq_populate_write(void *addr, size_t off, size_t len);
/* mincore over a page-rounded range; *resident receives the number of resident pages. */
int lmq_mincore(void *addr, size_t off, size_t len, size_t *resident);
/* Size of a page. */
size_t lmq_page_size(void);
/* 1 if [p, p+len) is all zero bytes, else 0. Cannot fail. */
int lmq_is_zero(const void *p, size_t len);
/* CLOCK_REALTIME in milliseconds. Cannot fail. */
int64_t lmq_now_ms(void);
/* Sleep for `us` microseconds (nanosleep; EINTR ends the sleep early). Cannot fail. */
void lmq_sleep_us(int64_t us);

/* A one-slot wake-up event (mutex + condition + flag) shared by a producer and one waiting thread.
 * The waiter sleeps in lmq_event_wait without the GIL; lmq_event_signal is cheap when nobody waits
 * (one atomic load). Returns are 0 / -1 + errno like the rest. */
typedef struct lmq_event lmq_event;
lmq_event *lmq_event_new(void);            /* NULL + errno ENOMEM on failure */
void lmq_event_free(lmq_event *ev);
/* Wait until signalled or `timeout_us` passed; returns 1 when signalled, 0 on timeout. Consumes the signal. */
int lmq_event_wait(lmq_event *ev, int64_t timeout_us);
/* Wake the waiter if one is sleeping (or make its next wait return at once). */
void lmq_event_signal(lmq_event *ev);
/* Same, but skips the mutex entirely when no thread is inside lmq_event_wait. */
void lmq_event_signal_if_waiting(lmq_event *ev);

/* Group commit (SYNC_FLUSH): putting threads wait until the flushed offset covers their bytes; one flusher
 * thread takes the highest requested offset, flushes, and publishes the new flushed offset to all waiters at
 * once, so concurrent requests share one flush. All waits are on CLOCK_MONOTONIC without the GIL. */
typedef struct lmq_gc lmq_gc;
lmq_gc *lmq_gc_new(int64_t flushed);     /* NULL + errno ENOMEM on failure */
void lmq_gc_free(lmq_gc *gc);
/* Block until the flushed offset is >= target. Returns 0, ETIMEDOUT after timeout_us, ESHUTDOWN when the
 * group commit was closed before the offset was covered, or the errno of a failed flush (lmq_gc_failed). */
int lmq_gc_wait(lmq_gc *gc, int64_t target, int64_t timeout_us);
/* A waiter whose bytes all lie in the current segment and finds no flush in progress flushes itself
 * (fdatasync of that segment's descriptor: the leader of its group). */
/* The segment the writer writes into now: descriptor and [base, end) offsets (set on every roll). */
void lmq_gc_set_file(lmq_gc *gc, int fd, int64_t base, int64_t end);
/* Flusher side: block until a request beyond the flushed offset exists and no flush runs, then claim the next
 * flush; returns the highest requested offset, 0 after timeout_us, or -1 once closed. */
int64_t lmq_gc_next(lmq_gc *gc, int64_t timeout_us);
/* Claim the flush unconditionally (after the running one ends): no flush happens until lmq_gc_done. */
void lmq_gc_pause(lmq_gc *gc);
/* End a claimed flush: publish the new flushed offset and wake every waiter. */
void lmq_gc_done(lmq_gc *gc, int64_t flushed);
/* Publish a new flushed offset (no claim involved) and wake every waiter it covers. */
void lmq_gc_publish(lmq_gc *gc, int64_t flushed);
/* Wake everyone for good: waiters not covered get ESHUTDOWN, the flusher gets -1. Returns 0 once no flush is
 * in progress (the caller may then close the segment files), or ETIMEDOUT if one still runs after timeout_us. */
int lmq_gc_close(lmq_gc *gc, int64_t timeout_us);
int64_t lmq_gc_flushed(lmq_gc *gc);
/* A flush of the segment at `base` failed with `err`: from now on no flushed offset is published (a retried
 * flush that succeeds proves nothing: the kernel may have dropped the pages the failed one could not write), every
 * waiter not covered yet returns `err` at once, and the flusher is never handed a request again. */
void lmq_gc_fail(lmq_gc *gc, int err, int64_t base);
/* The errno of the first failed flush (0: none) and, when `base` is not NULL, the base offset of its segment. */
int lmq_gc_failed(lmq_gc *gc, int64_t *base);
/* Anonymous private memory (transient store pool buffers): 0 or -1 + errno (ENOMEM). */
int lmq_map_anon(size_t len, void **out);

/* Big-endian loads and stores and the release/acquire publication of positions. */
static inline uint16_t lmq_be16(const void *p) { uint16_t v; __builtin_memcpy(&v, p, 2); return __builtin_bswap16(v); }
static inline uint32_t lmq_be32(const void *p) { uint32_t v; __builtin_memcpy(&v, p, 4); return __builtin_bswap32(v); }
static inline uint64_t lmq_be64(const void *p) { uint64_t v; __builtin_memcpy(&v, p, 8); return __builtin_bswap64(v); }
static inline void lmq_put16(void *p, uint16_t v) { v = __builtin_bswap16(v); __builtin_memcpy(p, &v, 2); }
static inline void lmq_put32(void *p, uint32_t v) { v = __builtin_bswap32(v); __builtin_memcpy(p, &v, 4); }
static inline void lmq_put64(void *p, uint64_t v) { v = __builtin_bswap64(v); __builtin_memcpy(p, &v, 8); }
static inline int64_t lmq_load_acq(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
static inline void lmq_store_rel(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_RELEASE); }
/* Sequentially consistent add and store: Dekker-style hand-shakes between processes (a counter bumped by one side, a
 * threshold published by the other) need both sides' writes ordered before their following loads. */
static inline int64_t lmq_fetch_add(int64_t *p, int64_t v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline void lmq_store_sc(int64_t *p, int64_t v) { __atomic_store_n(p, v, __ATOMIC_SEQ_CST); }
static inline int64_t lmq_load_sc(const int64_t *p) { return __atomic_load_n(p, __ATOMIC_SEQ_CST); }
/* Raise *p to v when v is larger (CAS loop, release on success); concurrent raisers never move it back. */
static inline void lmq_store_max(int64_t *p, int64_t v) {
    int64_t cur = __atomic_load_n(p, __ATOMIC_ACQUIRE);
    while (cur < v && !__atomic_compare_exchange_n(p, &cur, v, 1, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {
    }
}

#ifdef __cplusplus
}
#endif
#endif
