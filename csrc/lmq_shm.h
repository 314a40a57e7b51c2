/* lmq_shm.h: primitives shared between processes through a MAP_SHARED file mapping (no Python.h).
 *
 * Every pointer argument points into a MAP_SHARED mapping of a regular file (the control file), aligned to
 * 64 bytes; the same bytes are mapped by every process that uses them. Nothing here allocates.
 *
 * Contract for int-returning functions: a value >= 0 on success (an outcome code where documented), -1 on
 * failure with errno set. Callers run the blocking ones with the GIL released and raise once it is back.
 *
 * - Write lock: a PTHREAD_PROCESS_SHARED + PTHREAD_MUTEX_ROBUST (+ ERRORCHECK) mutex. When its holder dies the
 *   kernel walks the holder's robust list and the next locker gets LMQ_SHM_OWNER_DIED: it must repair the state
 *   the lock protects, call lmq_shm_lock_consistent, then unlock. A stopped (SIGSTOP) holder is alive: waiters
 *   time out. The owner pid kept beside the mutex is for error messages only, never for liveness.
 * - Eventcount: one 32-bit futex word, bit 0 = "someone sleeps", bits 1..31 = sequence (steps of 2). notify is
 *   one atomic read-modify-write and enters the kernel only when the waiter bit was set. The futex is the shared
 *   kind (no FUTEX_PRIVATE_FLAG): the kernel keys it on the file page, so every process's mapping matches.
 * - Slots: classic POSIX fcntl record locks (F_SETLK / F_GETLK, not OFD) on one byte per slot of a descriptor.
 *   The kernel drops them when the process dies (so a slot is free at once and a recycled pid never looks alive)
 *   and a forked child inherits none of them. Caution: closing ANY descriptor of that file in the process drops
 *   all of the process's locks on it, so open the file once per process.
 */
#ifndef LMQ_SHM_H
#define LMQ_SHM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes reserved for a lock (lmq_shm_lock_size() must not exceed it) and for an eventcount. */
#define LMQ_SHM_LOCK_BYTES 64
#define LMQ_SHM_EVENT_BYTES 64

/* Outcomes of lmq_shm_lock_acquire. */
enum {
    LMQ_SHM_ACQUIRED = 0,        /* the caller holds the lock */
    LMQ_SHM_OWNER_DIED = 1,      /* the caller holds the lock; the previous holder died holding it: repair, then
                                    lmq_shm_lock_consistent, then unlock (unlocking first makes it unusable) */
    LMQ_SHM_TIMED_OUT = 2,       /* not acquired: a live holder kept it for the whole timeout */
    LMQ_SHM_NOT_RECOVERABLE = 3, /* not acquired, never will be: a recoverer unlocked without marking it
                                    consistent; only lmq_shm_lock_init (with nobody attached) makes it usable */
};

/* Size of the lock structure on this platform (pthread_mutex_t + owner pid + counters). Cannot fail. */
size_t lmq_shm_lock_size(void);
/* Zero LMQ_SHM_LOCK_BYTES at p and initialise the robust process-shared mutex there. Only while no other
 * process uses the mapping. 0, or -1 + errno (from the pthread_mutexattr_* / pthread_mutex_init calls). */
int lmq_shm_lock_init(void *p);
/* Take the lock, waiting at most timeout_us (CLOCK_MONOTONIC; 0 = try once, < 0 = forever).
 * Returns LMQ_SHM_ACQUIRED / OWNER_DIED / TIMED_OUT / NOT_RECOVERABLE, or -1 + errno: EDEADLK when the calling
 * thread holds it already, EINVAL when p holds no initialised mutex. */
int lmq_shm_lock_acquire(void *p, int64_t timeout_us);
/* After LMQ_SHM_OWNER_DIED, once the protected state is repaired: the mutex is usable again (counts a recovery).
 * 0, or -1 + errno EINVAL (not held after an owner death). */
int lmq_shm_lock_consistent(void *p);
/* Release. 0, or -1 + errno EPERM (the calling thread does not hold it). */
int lmq_shm_lock_release(void *p);
/* Pid of the process holding the lock (or the one that died holding it), 0 when free. Messages only: the pid may
 * be stale or recycled. Cannot fail. */
int32_t lmq_shm_lock_owner(const void *p);
/* Thread id the mutex's futex word names as its holder (the robust futex ABI keeps it there), 0 when free or when
 * this C library's mutex layout is not known here (glibc's is). What names a holder stopped between taking the
 * mutex and recording its pid, or between clearing it and releasing. Messages only. Cannot fail. */
int32_t lmq_shm_lock_owner_tid(const void *p);
/* Times an owner death was repaired (lmq_shm_lock_consistent calls) since lmq_shm_lock_init. Cannot fail. */
uint32_t lmq_shm_lock_recoveries(const void *p);

/* Eventcount. Cannot fail. Typical use, consumer: s = lmq_shm_event_seq(p); check for work; if none,
 * lmq_shm_event_wait(p, s, timeout). Producer: publish work; lmq_shm_event_notify(p). */
void lmq_shm_event_init(void *p);
/* Current sequence (waiter bit masked off), loaded with acquire ordering. */
uint32_t lmq_shm_event_seq(const void *p);
/* 1 when a waiter has announced itself and no notify happened since, else 0. */
int lmq_shm_event_has_waiters(const void *p);
/* Advance the sequence; wake every waiter (FUTEX_WAKE, all) only when the waiter bit was set. Returns 1 when it
 * entered the kernel to wake, 0 when nobody waited (one atomic RMW, no system call). Cannot fail. */
int lmq_shm_event_notify(void *p);
/* Sleep until the sequence differs from `seen` or timeout_us passed (CLOCK_MONOTONIC; < 0 = forever).
 * Returns 1 when the sequence moved (possibly before the call), 0 on timeout, -1 + errno on a futex failure other
 * than EAGAIN / EINTR / ETIMEDOUT (EFAULT, ENOSYS). Signals do not end the wait early. */
int lmq_shm_event_wait(void *p, uint32_t seen, int64_t timeout_us);

/* Slots: byte `base + slot` of fd. */
/* Claim the first free slot in [0, count): a write lock (F_SETLK) on its byte. Returns the slot number, or -1 +
 * errno: EAGAIN when every slot is held by another process, else fcntl's errno (EBADF, ENOLCK). A slot this process
 * already holds counts as free (POSIX locks never conflict with their own process): claim once per process. */
int lmq_shm_slot_claim(int fd, int64_t base, int count);
/* Release this process's lock on a slot. 0, or -1 + errno. */
int lmq_shm_slot_release(int fd, int64_t base, int slot);
/* Is the slot held by ANOTHER process (F_GETLK)? 1 (and *pid = the holder's pid as this process's pid namespace
 * sees it, 0 when it cannot) or 0 when free or held by the caller itself; -1 + errno on failure. */
int lmq_shm_slot_held(int fd, int64_t base, int slot, int32_t *pid);
/* Byte-range lock helpers for the open protocol. kind: 0 unlock, 1 read (shared), 2 write (exclusive).
 * Try once (F_SETLK): 0 granted, 1 conflicting lock held elsewhere, -1 + errno. */
int lmq_shm_range_lock(int fd, int64_t off, int64_t len, int kind);

/* This process's pid, cached (refreshed in a forked child through pthread_atfork). Cannot fail. */
int32_t lmq_shm_pid(void);
/* CLOCK_MONOTONIC in nanoseconds. Cannot fail. */
int64_t lmq_shm_monotonic_ns(void);
/* Acquire load / release store of a shared 32-bit word (header fields published to other processes). */
static inline uint32_t lmq_shm_load_u32_acq(const void *p) { return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE); }
static inline void lmq_shm_store_u32_rel(void *p, uint32_t v) { __atomic_store_n((uint32_t *)p, v, __ATOMIC_RELEASE); }

#ifdef __cplusplus
}
#endif
#endif
