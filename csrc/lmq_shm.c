/* lmq_shm.c: see lmq_shm.h for the errno contract of each function. */
#define _GNU_SOURCE
#include "lmq_shm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    pthread_mutex_t mutex;
    int32_t owner_pid;   /* written by the holder after it acquires, cleared before it releases; messages only */
    uint32_t recoveries; /* owner deaths repaired, written under the mutex */
} lmq_shm_lock;

_Static_assert(sizeof(lmq_shm_lock) <= LMQ_SHM_LOCK_BYTES, "lmq_shm_lock outgrew its section");
_Static_assert(sizeof(uint32_t) <= LMQ_SHM_EVENT_BYTES, "eventcount word");

/* -- pid cache: getpid() is a system call (glibc stopped caching it); the lock path records the owner on every
 * acquisition, so the pid is read once per process and refreshed in a forked child. */

static int32_t pid_cache;
static pthread_once_t pid_once = PTHREAD_ONCE_INIT;

static void pid_refresh(void) { __atomic_store_n(&pid_cache, (int32_t)getpid(), __ATOMIC_RELAXED); }

static void pid_setup(void) {
    /* the fork handler first: lmq_shm_pid trusts a nonzero cache without pthread_once */
    (void)pthread_atfork(NULL, NULL, pid_refresh); /* ENOMEM leaves the cache stale in children: messages only */
    pid_refresh();
}

int32_t lmq_shm_pid(void) {
    /* nonzero once pid_setup ran (and registered the fork handler that keeps it right in children) */
    int32_t pid = __atomic_load_n(&pid_cache, __ATOMIC_RELAXED);
    if (pid != 0) return pid;
    (void)pthread_once(&pid_once, pid_setup);
    return __atomic_load_n(&pid_cache, __ATOMIC_RELAXED);
}

int64_t lmq_shm_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static struct timespec deadline_after(int64_t timeout_us) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += (time_t)(timeout_us / 1000000);
    ts.tv_nsec += (long)(timeout_us % 1000000) * 1000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec += 1;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* -- write lock ------------------------------------------------------------------------------------------------- */

size_t lmq_shm_lock_size(void) { return sizeof(lmq_shm_lock); }

int lmq_shm_lock_init(void *p) {
    lmq_shm_lock *l = (lmq_shm_lock *)p;
    pthread_mutexattr_t a;
    int rc;
    memset(p, 0, LMQ_SHM_LOCK_BYTES);
    rc = pthread_mutexattr_init(&a);
    if (rc != 0) goto fail;
    rc = pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    if (rc == 0) rc = pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    /* ERRORCHECK: a thread locking twice gets EDEADLK instead of hanging until its timeout. */
    if (rc == 0) rc = pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ERRORCHECK);
    if (rc == 0) rc = pthread_mutex_init(&l->mutex, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) goto fail;
    return 0;
fail:
    errno = rc;
    return -1;
}

int lmq_shm_lock_acquire(void *p, int64_t timeout_us) {
    lmq_shm_lock *l = (lmq_shm_lock *)p;
    int rc;
    if (timeout_us == 0) {
        rc = pthread_mutex_trylock(&l->mutex);
        if (rc == EBUSY) return LMQ_SHM_TIMED_OUT;
    } else if (timeout_us < 0) {
        rc = pthread_mutex_lock(&l->mutex);
    } else {
        struct timespec ts = deadline_after(timeout_us);
        rc = pthread_mutex_clocklock(&l->mutex, CLOCK_MONOTONIC, &ts);
        if (rc == ETIMEDOUT) return LMQ_SHM_TIMED_OUT;
    }
    switch (rc) {
    case 0:
        __atomic_store_n(&l->owner_pid, lmq_shm_pid(), __ATOMIC_RELAXED);
        return LMQ_SHM_ACQUIRED;
    case EOWNERDEAD:
        /* owner_pid still names the dead holder; the caller may read it for its warning before it is replaced */
        return LMQ_SHM_OWNER_DIED;
    case ENOTRECOVERABLE:
        return LMQ_SHM_NOT_RECOVERABLE;
    default:
        errno = rc;
        return -1;
    }
}

int lmq_shm_lock_consistent(void *p) {
    lmq_shm_lock *l = (lmq_shm_lock *)p;
    int rc = pthread_mutex_consistent(&l->mutex);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    l->recoveries += 1; /* under the mutex */
    __atomic_store_n(&l->owner_pid, lmq_shm_pid(), __ATOMIC_RELAXED);
    return 0;
}

int lmq_shm_lock_release(void *p) {
    lmq_shm_lock *l = (lmq_shm_lock *)p;
    int32_t old = __atomic_load_n(&l->owner_pid, __ATOMIC_RELAXED);
    int rc;
    __atomic_store_n(&l->owner_pid, 0, __ATOMIC_RELAXED);
    rc = pthread_mutex_unlock(&l->mutex);
    if (rc != 0) {
        /* not ours (EPERM): put back what the real holder wrote */
        __atomic_store_n(&l->owner_pid, old, __ATOMIC_RELAXED);
        errno = rc;
        return -1;
    }
    return 0;
}

int32_t lmq_shm_lock_owner(const void *p) {
    const lmq_shm_lock *l = (const lmq_shm_lock *)p;
    return __atomic_load_n(&l->owner_pid, __ATOMIC_RELAXED);
}

int32_t lmq_shm_lock_owner_tid(const void *p) {
#if defined(__GLIBC__)
    const lmq_shm_lock *l = (const lmq_shm_lock *)p;
    return (int32_t)(__atomic_load_n(&l->mutex.__data.__lock, __ATOMIC_RELAXED) & FUTEX_TID_MASK);
#else
    (void)p;
    return 0;
#endif
}

uint32_t lmq_shm_lock_recoveries(const void *p) {
    const lmq_shm_lock *l = (const lmq_shm_lock *)p;
    return __atomic_load_n(&l->recoveries, __ATOMIC_RELAXED);
}

/* -- eventcount ------------------------------------------------------------------------------------------------- */

#define EC_WAITER 1u
#define EC_STEP 2u

void lmq_shm_event_init(void *p) { memset(p, 0, LMQ_SHM_EVENT_BYTES); }

uint32_t lmq_shm_event_seq(const void *p) {
    return __atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE) & ~EC_WAITER;
}

int lmq_shm_event_has_waiters(const void *p) {
    return (int)(__atomic_load_n((const uint32_t *)p, __ATOMIC_ACQUIRE) & EC_WAITER);
}

int lmq_shm_event_notify(void *p) {
    uint32_t *w = (uint32_t *)p;
    uint32_t old = __atomic_load_n(w, __ATOMIC_RELAXED);
    /* One RMW: advance by a step and clear the waiter bit ((old | 1) + 1 does both). seq_cst orders the
     * caller's published work before the new sequence a waiter compares against. */
    while (!__atomic_compare_exchange_n(w, &old, (old | EC_WAITER) + 1u, 1, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
    }
    if (!(old & EC_WAITER)) return 0;
    /* Everyone who set the bit sleeps on a value with the bit set, which no longer matches: wake them all. A
     * waiter that set the bit again after our RMW is woken too (spuriously) and goes back to sleep. */
    (void)syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    return 1;
}

int lmq_shm_event_wait(void *p, uint32_t seen, int64_t timeout_us) {
    uint32_t *w = (uint32_t *)p;
    struct timespec ts;
    int timed_out = 0;
    if (timeout_us >= 0) ts = deadline_after(timeout_us);
    seen &= ~EC_WAITER;
    for (;;) {
        uint32_t cur = __atomic_load_n(w, __ATOMIC_SEQ_CST);
        long rc;
        if ((cur & ~EC_WAITER) != seen) return 1;
        if (timed_out) return 0;
        if (!(cur & EC_WAITER)) {
            /* announce ourselves before sleeping so that notify enters the kernel */
            if (!__atomic_compare_exchange_n(w, &cur, cur | EC_WAITER, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
                continue;
            cur |= EC_WAITER;
        }
        /* shared futex (no FUTEX_PRIVATE_FLAG): waiters in every process mapping the file page; absolute
         * CLOCK_MONOTONIC deadline, so EINTR and spurious wake-ups do not stretch the timeout */
        rc = syscall(SYS_futex, w, FUTEX_WAIT_BITSET, cur, timeout_us >= 0 ? &ts : NULL, NULL,
                     FUTEX_BITSET_MATCH_ANY);
        if (rc == -1) {
            if (errno == ETIMEDOUT)
                timed_out = 1; /* one last look at the word before reporting the timeout */
            else if (errno != EAGAIN && errno != EINTR)
                return -1;
        }
    }
}

/* -- slots (classic POSIX record locks: owned by the process, dropped at its death, not inherited by fork) ---- */

static int set_lock(int fd, int64_t off, int64_t len, short type) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)off;
    fl.l_len = (off_t)len;
    if (fcntl(fd, F_SETLK, &fl) == 0) return 0;
    if (errno == EAGAIN || errno == EACCES) return 1;
    return -1;
}

int lmq_shm_range_lock(int fd, int64_t off, int64_t len, int kind) {
    static const short types[] = {F_UNLCK, F_RDLCK, F_WRLCK};
    if (kind < 0 || kind > 2) {
        errno = EINVAL;
        return -1;
    }
    return set_lock(fd, off, len, types[kind]);
}

int lmq_shm_slot_claim(int fd, int64_t base, int count) {
    int i;
    for (i = 0; i < count; i++) {
        int rc = set_lock(fd, base + i, 1, F_WRLCK);
        if (rc == 0) return i;
        if (rc < 0) return -1;
    }
    errno = EAGAIN;
    return -1;
}

int lmq_shm_slot_release(int fd, int64_t base, int slot) {
    return set_lock(fd, base + slot, 1, F_UNLCK) == 0 ? 0 : -1;
}

int lmq_shm_slot_held(int fd, int64_t base, int slot, int32_t *pid) {
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = (off_t)(base + slot);
    fl.l_len = 1;
    if (fcntl(fd, F_GETLK, &fl) != 0) return -1;
    if (fl.l_type == F_UNLCK) {
        *pid = 0;
        return 0;
    }
    *pid = (int32_t)fl.l_pid;
    return 1;
}
