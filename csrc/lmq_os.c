/* lmq_os.c: see lmq_os.h for the errno contract of each function. */
#define _GNU_SOURCE
#include "lmq_os.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static size_t page_size_cached = 0;

size_t lmq_page_size(void) {
    if (page_size_cached == 0) {
        long ps = sysconf(_SC_PAGESIZE);
        page_size_cached = ps > 0 ? (size_t)ps : 4096;
    }
    return page_size_cached;
}

/* Round [addr+off, +len) out to page boundaries; returns the aligned start, *alen the aligned length. */
static char *page_range(void *addr, size_t off, size_t len, size_t *alen) {
    size_t ps = lmq_page_size();
    uintptr_t start = (uintptr_t)addr + off;
    uintptr_t astart = start & ~(uintptr_t)(ps - 1);
    uintptr_t end = start + len;
    uintptr_t aend = (end + ps - 1) & ~(uintptr_t)(ps - 1);
    *alen = (size_t)(aend - astart);
    return (char *)astart;
}

int lmq_map(int fd, size_t len, int writable, void **out) {
    int prot = PROT_READ | (writable ? PROT_WRITE : 0);
    void *p = mmap(NULL, len, prot, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        *out = NULL;
        return -1;
    }
    *out = p;
    return 0;
}

int lmq_unmap(void *addr, size_t len) { return munmap(addr, len); }

int lmq_msync(void *addr, size_t off, size_t len, int sync) {
    size_t alen;
    char *a;
    if (len == 0) return 0;
    a = page_range(addr, off, len, &alen);
    return msync(a, alen, sync ? MS_SYNC : MS_ASYNC);
}

int lmq_fdatasync(int fd, int full) { return full ? fsync(fd) : fdatasync(fd); }

int lmq_set_timer_slack_ns(long ns) { return prctl(PR_SET_TIMERSLACK, (unsigned long)ns, 0, 0, 0); }

int lmq_fallocate(int fd, int64_t off, int64_t len) {
    int rc;
    if (len <= 0) return 0;
    do {
        rc = posix_fallocate(fd, (off_t)off, (off_t)len);
    } while (rc == EINTR);
    if (rc != 0) {
        errno = rc;
        return -1;
    }
    return 0;
}

/* open(path) for writing, checked to be the inode (dev, ino) a caller mapped, posix_fallocate(off, len), close:
 * one reservation for a file whose descriptor is not kept. On a failure *stage says which call failed (1 open, 2 fstat
 * or another inode (errno ESTALE), 3 fallocate, 4 close) and errno is its error; stages 1-3 leave nothing open, and
 * after a failed close (4) the blocks are reserved but the close reported a failed write-back of the file. */
int lmq_fallocate_path(const char *path, uint64_t dev, uint64_t ino, int64_t off, int64_t len, int *stage) {
    struct stat st;
    int fd, err;
    do {
        fd = open(path, O_RDWR | O_CLOEXEC);
    } while (fd < 0 && errno == EINTR);
    if (fd < 0) {
        *stage = 1;
        return -1;
    }
    if (fstat(fd, &st) != 0)
        err = errno;
    else
        err = ((uint64_t)st.st_dev != dev || (uint64_t)st.st_ino != ino) ? ESTALE : 0;
    if (err != 0) {
        close(fd);
        *stage = 2;
        errno = err;
        return -1;
    }
    if (lmq_fallocate(fd, off, len) != 0) {
        err = errno;
        close(fd);
        *stage = 3;
        errno = err;
        return -1;
    }
    if (close(fd) != 0) {
        *stage = 4;
        return -1;
    }
    return 0;
}

int lmq_mkdirs(const char *path, int *made, int *missing) {
    char buf[PATH_MAX];
    size_t n = strlen(path), cut[256]; /* the missing levels: a deeper path fails (ENOENT) */
    int k = 0, i;
    struct stat st;
    *made = *missing = 0;
    if (n == 0 || n >= sizeof buf) {
        errno = n ? ENAMETOOLONG : ENOENT;
        return -1;
    }
    memcpy(buf, path, n + 1);
    while (n > 1 && buf[n - 1] == '/') buf[--n] = '\0';
    /* up from the path to the deepest directory that exists; each missing level's end is remembered */
    for (;;) {
        if (stat(buf, &st) == 0) {
            if (!S_ISDIR(st.st_mode)) {
                errno = ENOTDIR;
                return -1;
            }
            break;
        }
        if (errno != ENOENT) return -1;
        char *slash = strrchr(buf, '/');
        if (slash == NULL || slash == buf || k == (int)(sizeof cut / sizeof cut[0])) {
            errno = ENOENT;
            return -1;
        }
        cut[k++] = (size_t)(slash - buf);
        *slash = '\0';
    }
    *missing = k;
    /* down again, parents first */
    for (i = k - 1; i >= 0; i--) {
        buf[cut[i]] = '/';
        if (mkdir(buf, 0777) != 0 && !(errno == EEXIST && stat(buf, &st) == 0 && S_ISDIR(st.st_mode))) return -1;
        (*made)++;
    }
    return k;
}

int lmq_create_mapped(const char *dir, const char *path, int64_t size, int64_t reserve, int sync_size, int keep_fd,
                      int flags, lmq_created *out) {
    char src[64];
    struct stat st;
    int fd, err;
    void *p;
    out->fd = -1;
    out->addr = NULL;
    out->stage = LMQ_CR_FALLBACK;
    if (access(path, F_OK) == 0) {
        errno = EEXIST; /* an existing file is opened by name (its inode would be made and thrown away here) */
        return -1;
    }
#ifdef O_TMPFILE
    do {
        fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
    } while (fd < 0 && errno == EINTR);
#else
    fd = -1;
    errno = EOPNOTSUPP;
#endif
    if (fd < 0) return -1;
    if (reserve < 0) {
        out->stage = LMQ_CR_FALLOCATE;
        if (lmq_fallocate(fd, 0, size) != 0) goto unnamed;
    } else {
        out->stage = LMQ_CR_FTRUNCATE;
        if (ftruncate(fd, (off_t)size) != 0) goto unnamed;
        out->stage = LMQ_CR_FALLOCATE;
        if (reserve > 0 && lmq_fallocate(fd, 0, reserve) != 0) goto unnamed;
    }
    out->stage = LMQ_CR_FDATASYNC;
    if (sync_size && fdatasync(fd) != 0) goto unnamed;
    snprintf(src, sizeof src, "/proc/self/fd/%d", fd);
    if (linkat(AT_FDCWD, src, AT_FDCWD, path, AT_SYMLINK_FOLLOW) != 0) {
        err = errno;
        out->stage = (err == ENOSPC || err == EDQUOT || err == EFBIG || err == EIO) ? LMQ_CR_LINK : LMQ_CR_FALLBACK;
        close(fd);
        errno = err;
        return -1;
    }
    out->stage = LMQ_CR_FSTAT;
    if (fstat(fd, &st) != 0) goto named;
    out->dev = (uint64_t)st.st_dev;
    out->ino = (uint64_t)st.st_ino;
    out->stage = LMQ_CR_MMAP;
    p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) goto named;
    out->addr = p;
    out->fd = fd;
    /* hints only: a failure changes nothing the caller relies on */
    if (flags & LMQ_CR_ADVISE_RANDOM) (void)lmq_madvise(p, 0, (size_t)size, LMQ_ADV_RANDOM);
    if ((flags & LMQ_CR_POPULATE_FIRST) && reserve > 0)
        (void)lmq_populate_write(p, 0, (size_t)(reserve < 4096 ? reserve : 4096));
    if (!keep_fd) {
        out->fd = -1;
        if (close(fd) != 0) {
            out->stage = LMQ_CR_CLOSE;
            return -1;
        }
    }
    out->stage = 0;
    return 0;
named:
    err = errno;
    close(fd);
    unlink(path);
    errno = err;
    return -1;
unnamed:
    err = errno;
    close(fd);
    errno = err;
    return -1;
}

int lmq_ftruncate(int fd, int64_t len) { return ftruncate(fd, (off_t)len); }

int lmq_mlock(void *addr, size_t off, size_t len) {
    size_t alen;
    char *a = page_range(addr, off, len, &alen);
    return mlock(a, alen);
}

int lmq_munlock(void *addr, size_t off, size_t len) {
    size_t alen;
    char *a = page_range(addr, off, len, &alen);
    return munlock(a, alen);
}

int lmq_madvise(void *addr, size_t off, size_t len, int advice) {
    static const int table[] = {MADV_NORMAL, MADV_RANDOM, MADV_SEQUENTIAL, MADV_WILLNEED, MADV_DONTNEED};
    size_t alen;
    char *a;
    if (advice < 0 || advice > LMQ_ADV_DONTNEED) {
        errno = EINVAL;
        return -1;
    }
    a = page_range(addr, off, len, &alen);
    return madvise(a, alen, table[advice]);
}

size_t lmq_pretouch(void *addr, size_t off, size_t len, int write) {
    size_t ps = lmq_page_size();
    volatile char *p = (volatile char *)addr + off;
    size_t i, n = 0;
    unsigned sink = 0;
    for (i = 0; i < len; i += ps, n++) {
        if (write)
            p[i] = 0;
        else
            sink += (unsigned)p[i];
    }
    (void)sink;
    return n;
}

int lmq_populate_write(void *addr, size_t off, size_t len) {
#ifdef MADV_POPULATE_WRITE
    size_t alen;
    char *a;
    if (len == 0) return 0;
    a = page_range(addr, off, len, &alen);
    return madvise(a, alen, MADV_POPULATE_WRITE);
#else
    (void)addr;
    (void)off;
    (void)len;
    errno = EINVAL;
    return -1;
#endif
}

int lmq_mincore(void *addr, size_t off, size_t len, size_t *resident) {
    size_t alen, ps = lmq_page_size(), npages, i, count = 0;
    char *a;
    unsigned char *vec;
    *resident = 0;
    if (len == 0) return 0;
    a = page_range(addr, off, len, &alen);
    npages = alen / ps;
    vec = (unsigned char *)malloc(npages);
    if (vec == NULL) {
        errno = ENOMEM;
        return -1;
    }
    if (mincore(a, alen, vec) != 0) {
        int saved = errno;
        free(vec);
        errno = saved;
        return -1;
    }
    for (i = 0; i < npages; i++) count += vec[i] & 1u;
    free(vec);
    *resident = count;
    return 0;
}

int lmq_is_zero(const void *p, size_t len) {
    const unsigned char *c = (const unsigned char *)p;
    size_t i = 0;
    uint64_t acc = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t v;
        memcpy(&v, c + i, 8);
        acc |= v;
        if ((i & 4095) == 4088 && acc) return 0;
    }
    for (; i < len; i++) acc |= c[i];
    return acc == 0;
}

int64_t lmq_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void lmq_sleep_us(int64_t us) {
    struct timespec ts;
    if (us <= 0) return;
    ts.tv_sec = us / 1000000;
    ts.tv_nsec = (long)(us % 1000000) * 1000;
    nanosleep(&ts, NULL);
}

struct lmq_event {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int signalled;
    int waiting; /* read without the mutex by lmq_event_signal_if_waiting */
};

lmq_event *lmq_event_new(void) {
    pthread_condattr_t attr;
    lmq_event *ev = (lmq_event *)calloc(1, sizeof(lmq_event));
    if (ev == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&ev->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&ev->cv, &attr);
    pthread_condattr_destroy(&attr);
    return ev;
}

void lmq_event_free(lmq_event *ev) {
    if (ev == NULL) return;
    pthread_cond_destroy(&ev->cv);
    pthread_mutex_destroy(&ev->mu);
    free(ev);
}

int lmq_event_wait(lmq_event *ev, int64_t timeout_us) {
    struct timespec deadline;
    int got;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += timeout_us / 1000000;
    deadline.tv_nsec += (long)(timeout_us % 1000000) * 1000;
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&ev->mu);
    __atomic_store_n(&ev->waiting, 1, __ATOMIC_SEQ_CST);
    while (!ev->signalled) {
        if (pthread_cond_timedwait(&ev->cv, &ev->mu, &deadline) == ETIMEDOUT) break;
    }
    got = ev->signalled;
    ev->signalled = 0;
    __atomic_store_n(&ev->waiting, 0, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&ev->mu);
    return got;
}

void lmq_event_signal(lmq_event *ev) {
    pthread_mutex_lock(&ev->mu);
    ev->signalled = 1;
    pthread_cond_signal(&ev->cv);
    pthread_mutex_unlock(&ev->mu);
}

void lmq_event_signal_if_waiting(lmq_event *ev) {
    if (__atomic_load_n(&ev->waiting, __ATOMIC_SEQ_CST)) lmq_event_signal(ev);
}

struct lmq_gc {
    pthread_mutex_t mu;
    pthread_cond_t done;   /* waiters sleep here until flushed covers them or a flush ends */
    pthread_cond_t req;    /* the flusher thread sleeps here until a request arrives */
    int64_t requested;     /* highest offset asked for (under mu); every byte below it is written */
    int64_t flushed;       /* highest offset on disk: read without mu on the fast path */
    int flusher_waiting;
    int flushing;          /* a flush (leader or flusher thread) is in progress: one at a time */
    int waiters;           /* threads inside lmq_gc_wait's slow path */
    int closed;
    int failed;            /* errno of a failed flush: no flushed offset is published after it, waiters get it */
    int64_t failed_base;   /* the base offset of the segment whose flush failed */
    int fd;                /* the segment being written, -1 before the first put */
    int64_t fd_base, fd_end;
};

static void deadline_after(struct timespec *ts, int64_t timeout_us) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += timeout_us / 1000000;
    ts->tv_nsec += (long)(timeout_us % 1000000) * 1000;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec += 1;
        ts->tv_nsec -= 1000000000L;
    }
}

lmq_gc *lmq_gc_new(int64_t flushed) {
    pthread_condattr_t attr;
    lmq_gc *gc = (lmq_gc *)calloc(1, sizeof(lmq_gc));
    if (gc == NULL) {
        errno = ENOMEM;
        return NULL;
    }
    pthread_mutex_init(&gc->mu, NULL);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&gc->done, &attr);
    pthread_cond_init(&gc->req, &attr);
    pthread_condattr_destroy(&attr);
    gc->flushed = flushed;
    gc->requested = flushed;
    gc->fd = -1;
    return gc;
}

void lmq_gc_free(lmq_gc *gc) {
    if (gc == NULL) return;
    pthread_cond_destroy(&gc->done);
    pthread_cond_destroy(&gc->req);
    pthread_mutex_destroy(&gc->mu);
    free(gc);
}

void lmq_gc_set_file(lmq_gc *gc, int fd, int64_t base, int64_t end) {
    pthread_mutex_lock(&gc->mu);
    gc->fd = fd;
    gc->fd_base = base;
    gc->fd_end = end;
    pthread_mutex_unlock(&gc->mu);
}

static void publish_locked(lmq_gc *gc, int64_t flushed) {
    /* after a failed flush nothing more is published: a later flush that "succeeds" may not have written the
     * pages the failed one lost (Linux forgets them once it reported the error), so it proves nothing */
    if (flushed > gc->flushed && !gc->failed) __atomic_store_n(&gc->flushed, flushed, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&gc->done);
}

static void fail_locked(lmq_gc *gc, int err, int64_t base) {
    if (!gc->failed) {
        gc->failed = err ? err : EIO;
        gc->failed_base = base;
    }
    pthread_cond_broadcast(&gc->done);
    pthread_cond_broadcast(&gc->req);
}

void lmq_gc_fail(lmq_gc *gc, int err, int64_t base) {
    pthread_mutex_lock(&gc->mu);
    fail_locked(gc, err, base);
    pthread_mutex_unlock(&gc->mu);
}

int lmq_gc_failed(lmq_gc *gc, int64_t *base) {
    int err;
    pthread_mutex_lock(&gc->mu);
    err = gc->failed;
    if (base != NULL) *base = gc->failed_base;
    pthread_mutex_unlock(&gc->mu);
    return err;
}

int lmq_gc_wait(lmq_gc *gc, int64_t target, int64_t timeout_us) {
    struct timespec deadline;
    int rc = 0, fd;
    int64_t goal;
    if (__atomic_load_n(&gc->flushed, __ATOMIC_ACQUIRE) >= target) return 0;
    deadline_after(&deadline, timeout_us);
    pthread_mutex_lock(&gc->mu);
    if (target > gc->requested) gc->requested = target;
    gc->waiters++;
    while (gc->flushed < target) {
        if (gc->failed) {
            rc = gc->failed;
            break;
        }
        if (gc->closed) {
            rc = ESHUTDOWN;
            break;
        }
        /* Leader: a lone waiter (no other put waiting, nobody flushing) whose unflushed bytes all lie in the
         * current segment flushes itself (one fdatasync covers every byte written so far) instead of handing
         * over to the flusher thread and back: two context switches less per put for a single producer.
         * With several waiters the flusher thread runs the groups: measured here, putting threads that lead
         * groups themselves lose to it (each leader must win the GIL back before its next put). */
        if (!gc->flushing && gc->waiters == 1 && gc->fd >= 0 && gc->flushed >= gc->fd_base &&
            target <= gc->fd_end) {
            gc->flushing = 1;
            fd = gc->fd;
            goal = gc->requested;
            pthread_mutex_unlock(&gc->mu);
            int r = fdatasync(fd);
            int err = r == 0 ? 0 : errno;
            pthread_mutex_lock(&gc->mu);
            gc->flushing = 0;
            if (r == 0) publish_locked(gc, goal);
            else fail_locked(gc, err, gc->fd_base); /* never retried: every waiter not covered gets the error */
            if (gc->flusher_waiting && gc->requested > gc->flushed) pthread_cond_signal(&gc->req);
            continue;
        }
        if (gc->flusher_waiting && !gc->flushing) pthread_cond_signal(&gc->req);
        if (pthread_cond_timedwait(&gc->done, &gc->mu, &deadline) == ETIMEDOUT) {
            rc = gc->flushed >= target ? 0 : ETIMEDOUT;
            break;
        }
    }
    gc->waiters--;
    pthread_mutex_unlock(&gc->mu);
    return rc;
}

int64_t lmq_gc_next(lmq_gc *gc, int64_t timeout_us) {
    struct timespec deadline;
    int64_t out = 0;
    deadline_after(&deadline, timeout_us);
    pthread_mutex_lock(&gc->mu);
    while (!gc->closed && (gc->failed || gc->requested <= gc->flushed || gc->flushing)) {
        gc->flusher_waiting = 1;
        int r = pthread_cond_timedwait(&gc->req, &gc->mu, &deadline);
        gc->flusher_waiting = 0;
        if (r == ETIMEDOUT) break;
    }
    if (gc->closed) out = -1;
    else if (!gc->failed && gc->requested > gc->flushed && !gc->flushing) {
        gc->flushing = 1;
        out = gc->requested;
    }
    pthread_mutex_unlock(&gc->mu);
    return out;
}

void lmq_gc_pause(lmq_gc *gc) {
    pthread_mutex_lock(&gc->mu);
    while (gc->flushing && !gc->closed) pthread_cond_wait(&gc->done, &gc->mu);
    gc->flushing = 1;
    pthread_mutex_unlock(&gc->mu);
}

void lmq_gc_done(lmq_gc *gc, int64_t flushed) {
    pthread_mutex_lock(&gc->mu);
    gc->flushing = 0;
    publish_locked(gc, flushed);
    pthread_mutex_unlock(&gc->mu);
}

void lmq_gc_publish(lmq_gc *gc, int64_t flushed) {
    pthread_mutex_lock(&gc->mu);
    publish_locked(gc, flushed);
    pthread_mutex_unlock(&gc->mu);
}

int lmq_gc_close(lmq_gc *gc, int64_t timeout_us) {
    struct timespec deadline;
    int rc = 0;
    deadline_after(&deadline, timeout_us);
    pthread_mutex_lock(&gc->mu);
    gc->closed = 1;
    pthread_cond_broadcast(&gc->done);
    pthread_cond_broadcast(&gc->req);
    /* a leader may be inside fdatasync on the segment's descriptor: the caller closes files after this.
     * Bounded, so that a flush stuck in the kernel (or a claim never given back) cannot hang close() */
    while (gc->flushing) {
        if (pthread_cond_timedwait(&gc->done, &gc->mu, &deadline) == ETIMEDOUT) {
            rc = gc->flushing ? ETIMEDOUT : 0;
            break;
        }
    }
    gc->fd = -1;
    pthread_mutex_unlock(&gc->mu);
    return rc;
}

int64_t lmq_gc_flushed(lmq_gc *gc) {
    return __atomic_load_n(&gc->flushed, __ATOMIC_ACQUIRE);
}

int lmq_map_anon(size_t len, void **out) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -1;
    *out = p;
    return 0;
}
