/*
 * powerfs: a FUSE file system that simulates power loss, for the test suite (issue 24).
 *
 *   powerfs BACKING MOUNTPOINT [fuse options]
 *
 * Everything is passed through to the directory BACKING, except that what was written and not yet synced is kept
 * apart, so that a "power cut" can drop it (tests/powerfs/README.md describes the model):
 *
 *  - File data and size.  The backing file always holds exactly the DURABLE content of the file.  Writes, truncates
 *    and fallocate go into an in-memory overlay per inode (struct node: dirty 4 KiB pages + the current size), shared
 *    by every open of the file and keyed by the backing inode so that it survives renames.  Reads and getattr see
 *    the overlay over the backing file.  fsync/fdatasync (msync(MS_SYNC) reaches us as fsync) writes the file's
 *    overlay into the backing file and clears it.  No direct_io, so shared writable mmap works: the kernel sends the
 *    pages of a MAP_SHARED mapping at writeback, msync and fsync, exactly what it would have made durable.
 *
 *  - Directory entries.  create, mknod, mkdir, unlink, rmdir, rename, link and symlink are applied to the backing
 *    directory at once, and also appended to an undo journal (struct jent) tagged with the directory they change
 *    (both directories of a cross-directory rename).  A removed or replaced entry is moved into the hidden trash
 *    directory BACKING/.powerfs-trash instead of being deleted, so that it can be put back.  fsync of a directory
 *    makes that directory's entries durable: they leave the journal and their trash is really deleted.
 *
 *  - The control file /.powerfs (not listed by readdir) takes text commands and reads back the state:
 *        cut all|random|torn SEED        power cut: drop (some of) what is not durable; then every operation fails
 *                                         with EIO and BACKING holds exactly what a machine would find after reboot
 *        fail K ERRNO [OP,OP... [INO]]    fail the K-th mutating operation (of those kinds) from now with ERRNO;
 *                                         with INO, count only operations on the open file of that backing inode
 *        fail off
 *        fsync_error drop|keep            what a failed fsync leaves (node_failed_sync); default drop
 *        capacity BYTES|off               ENOSPC when the files' apparent sizes would grow past BYTES in total
 *
 * Concurrency: libfuse runs the operations on several threads.  One global mutex (big) is held for the whole of
 * every operation, control commands included, so the overlay, the journal and the backing directory are only ever
 * changed by one thread at a time and a cut happens between two operations, never inside one.  Nothing done under
 * the mutex waits for the kernel's FUSE side (we only call into the backing file system), so it cannot deadlock.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE

#include <fuse.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/time.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

#define PAGE 4096
#define SECTOR 512
#define TRASH ".powerfs-trash"
#define CTL "/.powerfs"

/* ---------------------------------------------------------------------------------------------------------------- */
/* State.  Everything below is protected by `big`.                                                                   */

static pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER;

struct page {
    unsigned char data[PAGE];
    int orphan; /* written, then an fsync failed under "fsync_error drop": readable, but never made durable */
};

/* The overlay of one regular file (one backing inode). */
struct node {
    dev_t dev;
    ino_t ino;
    int fd;              /* O_RDWR on the backing file: stays valid across renames and moves to the trash */
    int opens;           /* FUSE handles open on it */
    off_t size;          /* current (live) size */
    off_t dsize;         /* durable size: the backing file's size */
    off_t low;           /* lowest size since the last sync: bytes at or past it that no page holds read as zero */
    struct page **pages; /* indexed by page number, NULL when the backing file has the page's content */
    size_t cap;          /* length of pages[] */
    size_t npages;       /* non-NULL entries in pages[] */
    uint64_t dirty_seq;  /* when it last became dirty: a cut visits nodes in this order (deterministic per seed) */
    struct node *next;   /* hash chain */
};

/* A directory that has journal entries: an fd keeps it addressable across renames and removal. */
struct dirrec {
    dev_t dev;
    ino_t ino;
    int fd;
    int refs; /* journal entries that name it */
    int dead; /* removed for good (its rmdir became durable): its entries have nothing left to undo */
    /* scratch fields of a cut or a pin */
    int active, count, seen, keep, undoing, drawn;
    struct dirrec *next;
};

enum jkind { J_CREATE, J_MKDIR, J_UNLINK, J_RMDIR, J_RENAME, J_EXCHANGE, J_LINK, J_SYMLINK };

/* One directory operation since the last fsync of its directory (or directories), with what undoes it. */
struct jent {
    enum jkind kind;
    struct dirrec *d1; /* the directory of name1: the only one, or the source of a rename */
    char *name1;
    struct dirrec *d2; /* rename/exchange: the directory of name2, the destination (may be d1); else NULL */
    char *name2;
    char *trash;       /* unlink, rmdir, rename over a target: the removed entry's name in the trash */
    int pin, undo;     /* scratch */
};

/* Kinds of mutating operations, counted and subject to fault injection. */
enum opkind { K_WRITE, K_FSYNC, K_FALLOCATE, K_TRUNCATE, K_CREATE, K_MKNOD, K_MKDIR, K_UNLINK, K_RMDIR, K_RENAME,
              K_LINK, K_SYMLINK, K_FSYNCDIR, NKINDS };
static const char *kind_names[NKINDS] = {"write", "fsync", "fallocate", "truncate", "create", "mknod", "mkdir",
                                         "unlink", "rmdir", "rename", "link", "symlink", "fsyncdir"};

#define NBUCKETS 1024

static struct {
    int backing;      /* fd of the backing directory */
    int trash;        /* fd of BACKING/.powerfs-trash */
    uint64_t trash_seq;
    int cut;          /* after a power cut every operation fails with EIO */
    struct node *nodes[NBUCKETS];
    struct dirrec *dirs;
    struct jent **journal;
    size_t jlen, jcap;
    uint64_t dirty_seq;
    /* counters and fault injection */
    uint64_t ops, per_kind[NKINDS];
    uint64_t fail_k, fail_seen, injected;
    int fail_errno;
    unsigned fail_mask;
    ino_t fail_ino; /* 0: any file */
    int fsync_error_keep;
    /* capacity: 0 = off */
    uint64_t capacity;
} S;

static struct node ctl_node; /* fi->fh of an open control file */

/* ---------------------------------------------------------------------------------------------------------------- */
/* Small helpers.                                                                                                    */

static const char *rel(const char *path) { return path[1] ? path + 1 : "."; }

static int is_hidden(const char *path) /* the trash is not part of the file system */
{
    size_t n = strlen("/" TRASH);
    return strncmp(path, "/" TRASH, n) == 0 && (path[n] == 0 || path[n] == '/');
}

static int is_ctl(const char *path) { return path && strcmp(path, CTL) == 0; }

/* libfuse's high-level API keeps a file that is unlinked while open under a new name, ".fuse_hidden...", until its
 * last close (without that, fstat of such a file fails).  These names are not listed, and a cut removes them: after
 * a reboot an unlinked open file is gone. */
static int is_fuse_hidden(const char *name) { return strncmp(name, ".fuse_hidden", 12) == 0; }
static const char *base_name(const char *path) { return strrchr(path, '/') + 1; }

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n, size);
    if (!p) {
        fprintf(stderr, "powerfs: out of memory\n");
        abort();
    }
    return p;
}

static char *xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p) {
        fprintf(stderr, "powerfs: out of memory\n");
        abort();
    }
    return p;
}

/* splitmix64: the seeded generator of cuts */
static uint64_t rng;
static uint64_t rnd(void)
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}
static int coin(void) { return (int)(rnd() >> 63); }

/* Remove every .fuse_hidden entry of the tree under DIRFD. */
static void purge_hidden(int dirfd)
{
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (is_fuse_hidden(de->d_name)) {
            unlinkat(fd, de->d_name, 0);
        } else if (de->d_type == DT_DIR) {
            int sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                purge_hidden(sub);
                close(sub);
            }
        }
    }
    closedir(d);
}

/* Remove NAME in DIRFD, recursively if it is a directory. */
static void rm_rf_at(int dirfd, const char *name)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return;
    if (!S_ISDIR(st.st_mode)) {
        unlinkat(dirfd, name, 0);
        return;
    }
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0) {
        DIR *d = fdopendir(fd);
        if (d) {
            struct dirent *de;
            while ((de = readdir(d)) != NULL)
                if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                    rm_rf_at(fd, de->d_name);
            closedir(d);
        } else {
            close(fd);
        }
    }
    unlinkat(dirfd, name, AT_REMOVEDIR);
}

static int dir_is_empty(int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return -errno;
    }
    int empty = 1;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            empty = 0;
            break;
        }
    closedir(d);
    return empty;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Operation counters and fault injection (SQLite's "fail the K-th I/O" sweep).                                       */

/* Count one mutating operation of KIND (on the open file N, or NULL for an operation on a path); return the errno to
 * fail it with, or 0. */
static int inject_on(enum opkind kind, const struct node *n)
{
    S.ops++;
    S.per_kind[kind]++;
    if (S.fail_k && (S.fail_mask & (1u << kind)) && (!S.fail_ino || (n && n->ino == S.fail_ino))) {
        S.fail_seen++;
        if (S.fail_seen == S.fail_k) {
            S.injected++;
            S.fail_k = 0; /* one shot */
            return S.fail_errno;
        }
    }
    return 0;
}
static int inject(enum opkind kind) { return inject_on(kind, NULL); }

/* ---------------------------------------------------------------------------------------------------------------- */
/* Nodes: the per-inode overlay of unsynced file data and size.                                                      */

static struct node **bucket(dev_t dev, ino_t ino) { return &S.nodes[(ino ^ dev) % NBUCKETS]; }

static struct node *node_find(dev_t dev, ino_t ino)
{
    for (struct node *n = *bucket(dev, ino); n; n = n->next)
        if (n->dev == dev && n->ino == ino)
            return n;
    return NULL;
}

static int node_dirty(const struct node *n) { return n->npages || n->size != n->dsize || n->low != n->dsize; }

/* Node of the file open as FD (takes FD over), creating it if needed. */
static struct node *node_get_fd(int fd)
{
    struct stat st;
    if (fstat(fd, &st) < 0) {
        close(fd);
        return NULL;
    }
    struct node *n = node_find(st.st_dev, st.st_ino);
    if (n) {
        close(fd);
        return n;
    }
    n = xcalloc(1, sizeof *n);
    n->dev = st.st_dev;
    n->ino = st.st_ino;
    n->fd = fd;
    n->size = n->dsize = n->low = st.st_size;
    struct node **b = bucket(n->dev, n->ino);
    n->next = *b;
    *b = n;
    return n;
}

static int open_backing(int dirfd, const char *name)
{
    int fd = openat(dirfd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0 && (errno == EACCES || errno == EROFS || errno == ETXTBSY || errno == EPERM))
        fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    return fd < 0 ? -errno : fd;
}

static void node_free_pages(struct node *n, int keep_orphans)
{
    for (size_t i = 0; i < n->cap; i++)
        if (n->pages[i] && !(keep_orphans && n->pages[i]->orphan)) {
            free(n->pages[i]);
            n->pages[i] = NULL;
            n->npages--;
        }
}

static void node_free(struct node *n)
{
    struct node **p = bucket(n->dev, n->ino);
    while (*p != n)
        p = &(*p)->next;
    *p = n->next;
    node_free_pages(n, 0);
    free(n->pages);
    close(n->fd);
    free(n);
}

/* Forget a node nobody has open once it has nothing unsynced, or once its file is gone for good. */
static void node_maybe_free(struct node *n)
{
    if (n->opens)
        return;
    struct stat st;
    if (!node_dirty(n) || (fstat(n->fd, &st) == 0 && st.st_nlink == 0))
        node_free(n);
}

static void node_mark_dirty(struct node *n, int was_dirty)
{
    if (!was_dirty)
        n->dirty_seq = ++S.dirty_seq;
}

/* Page IDX of N, made from the current content if CREATE and absent (copy on write). */
static struct page *page_get(struct node *n, size_t idx, int create)
{
    if (idx < n->cap && n->pages[idx])
        return n->pages[idx];
    if (!create)
        return NULL;
    if (idx >= n->cap) {
        size_t cap = n->cap ? n->cap : 16;
        while (cap <= idx)
            cap *= 2;
        struct page **p = realloc(n->pages, cap * sizeof *p);
        if (!p)
            return NULL;
        memset(p + n->cap, 0, (cap - n->cap) * sizeof *p);
        n->pages = p;
        n->cap = cap;
    }
    struct page *pg = calloc(1, sizeof *pg);
    if (!pg)
        return NULL;
    off_t off = (off_t)idx * PAGE;
    if (off < n->low) { /* below `low` the backing file has the content; past it, zeros */
        size_t want = (size_t)(n->low - off < PAGE ? n->low - off : PAGE);
        ssize_t r = pread(n->fd, pg->data, want, off);
        if (r < 0) {
            free(pg);
            return NULL;
        }
    }
    n->pages[idx] = pg;
    n->npages++;
    return pg;
}

static int node_read(struct node *n, char *buf, size_t size, off_t off)
{
    if (off >= n->size)
        return 0;
    if ((off_t)size > n->size - off)
        size = (size_t)(n->size - off);
    size_t done = 0;
    while (done < size) {
        off_t o = off + (off_t)done;
        size_t idx = (size_t)(o / PAGE), in = (size_t)(o % PAGE);
        size_t len = PAGE - in < size - done ? PAGE - in : size - done;
        struct page *pg = page_get(n, idx, 0);
        if (pg) {
            memcpy(buf + done, pg->data + in, len);
        } else {
            memset(buf + done, 0, len);
            if (o < n->low) {
                size_t want = (size_t)(n->low - o) < len ? (size_t)(n->low - o) : len;
                if (pread(n->fd, buf + done, want, o) < 0)
                    return -errno;
            }
        }
        done += len;
    }
    return (int)size;
}

/* `capacity`: the apparent size of every regular file in the tree (trash left out), the overlay's size for the
 * files that have one.  Walked at each growing operation while a capacity is set: meant for small test trees. */
static uint64_t tree_bytes(int dirfd, int root)
{
    uint64_t total = 0;
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd < 0 ? NULL : fdopendir(fd);
    if (!d) {
        if (fd >= 0)
            close(fd);
        return 0;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || (root && !strcmp(de->d_name, TRASH)) ||
            fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (S_ISREG(st.st_mode)) {
            struct node *n = node_find(st.st_dev, st.st_ino);
            total += (uint64_t)(n ? n->size : st.st_size);
        } else if (S_ISDIR(st.st_mode)) {
            int sub = openat(fd, de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0) {
                total += tree_bytes(sub, 0);
                close(sub);
            }
        }
    }
    closedir(d);
    return total;
}

/* ENOSPC when growing N to NEW_END would take the tree past the capacity */
static int check_capacity(struct node *n, off_t new_end)
{
    if (!S.capacity || new_end <= n->size)
        return 0;
    return tree_bytes(S.backing, 1) + (uint64_t)(new_end - n->size) > S.capacity ? -ENOSPC : 0;
}

static int node_write(struct node *n, const char *buf, size_t size, off_t off)
{
    int was = node_dirty(n);
    size_t done = 0;
    int r = check_capacity(n, off + (off_t)size);
    if (r)
        return r;
    while (done < size) {
        off_t o = off + (off_t)done;
        size_t idx = (size_t)(o / PAGE), in = (size_t)(o % PAGE);
        size_t len = PAGE - in < size - done ? PAGE - in : size - done;
        struct page *pg = page_get(n, idx, 1);
        if (!pg)
            return done ? (int)done : -ENOMEM;
        memcpy(pg->data + in, buf + done, len);
        pg->orphan = 0; /* dirty again: the next fsync writes the whole page, as the kernel would */
        done += len;
        if (o + (off_t)len > n->size)
            n->size = o + (off_t)len;
    }
    node_mark_dirty(n, was);
    return (int)size;
}

static void node_truncate(struct node *n, off_t size)
{
    int was = node_dirty(n);
    if (size < n->size) {
        /* pages wholly past the new end go; the page holding it keeps zeros past it (pages are zero past size) */
        for (size_t i = (size_t)((size + PAGE - 1) / PAGE); i < n->cap; i++)
            if (n->pages[i]) {
                free(n->pages[i]);
                n->pages[i] = NULL;
                n->npages--;
            }
        struct page *pg = size % PAGE ? page_get(n, (size_t)(size / PAGE), 0) : NULL;
        if (pg)
            memset(pg->data + size % PAGE, 0, PAGE - (size_t)(size % PAGE));
        if (size < n->low)
            n->low = size;
    }
    n->size = size; /* growing: the new bytes are past `low`, so they read as zeros */
    node_mark_dirty(n, was);
}

/* Zero [off, off+len) within the current size (PUNCH_HOLE, ZERO_RANGE). */
static int node_zero(struct node *n, off_t off, off_t len)
{
    int was = node_dirty(n);
    off_t end = off + len < n->size ? off + len : n->size;
    for (off_t o = off; o < end;) {
        size_t idx = (size_t)(o / PAGE), in = (size_t)(o % PAGE);
        size_t l = (size_t)(PAGE - in < (size_t)(end - o) ? PAGE - in : (size_t)(end - o));
        /* a page not in the overlay and wholly past `low` already reads as zeros */
        struct page *pg = page_get(n, idx, o - (off_t)in < n->low);
        if (pg == NULL && o - (off_t)in < n->low)
            return -ENOMEM;
        if (pg) {
            memset(pg->data + in, 0, l);
            pg->orphan = 0;
        }
        o += (off_t)l;
    }
    node_mark_dirty(n, was);
    return 0;
}

/* fsync: make the overlay durable: the backing file gets exactly the current content.  Orphan pages (dropped by a
 * failed fsync) are not written: the backing file keeps what it had there. */
static int node_sync(struct node *n)
{
    if (!node_dirty(n))
        return 0;
    if (n->low < n->dsize && ftruncate(n->fd, n->low) < 0)
        return -errno;
    for (size_t i = 0; i < n->cap; i++) {
        struct page *pg = n->pages[i];
        if (!pg || pg->orphan)
            continue;
        off_t off = (off_t)i * PAGE;
        size_t len = n->size - off < PAGE ? (size_t)(n->size - off) : PAGE;
        if (pwrite(n->fd, pg->data, len, off) != (ssize_t)len)
            return errno ? -errno : -EIO;
    }
    if (ftruncate(n->fd, n->size) < 0)
        return -errno;
    n->dsize = n->low = n->size;
    node_free_pages(n, 1);
    return 0;
}

/* A failed fsync.  "keep": nothing changes, a later fsync may still make the data durable.  "drop" (default): what
 * Linux does on a writeback error: the dirty pages are marked clean (still readable until evicted) and a later
 * fsync succeeds without writing them, so they are lost at the next cut (PostgreSQL's "fsyncgate"). */
static void node_failed_sync(struct node *n)
{
    if (S.fsync_error_keep)
        return;
    for (size_t i = 0; i < n->cap; i++)
        if (n->pages[i])
            n->pages[i]->orphan = 1;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Directory records and the undo journal.                                                                           */

static struct dirrec *dir_find(dev_t dev, ino_t ino)
{
    for (struct dirrec *d = S.dirs; d; d = d->next)
        if (d->dev == dev && d->ino == ino)
            return d;
    return NULL;
}

static void dir_put(struct dirrec *d)
{
    if (d->refs)
        return;
    struct dirrec **p = &S.dirs;
    while (*p != d)
        p = &(*p)->next;
    *p = d->next;
    close(d->fd);
    free(d);
}

/* The directory holding PATH, and the last component of PATH in *NAME.  NULL with errno set on failure.  The caller
 * dir_put()s it unless a journal entry took it. */
static struct dirrec *dir_of(const char *path, const char **name)
{
    const char *slash = strrchr(path, '/');
    *name = slash + 1;
    char parent[PATH_MAX];
    size_t len = (size_t)(slash - path);
    if (len == 0) {
        strcpy(parent, ".");
    } else {
        if (len >= sizeof parent) {
            errno = ENAMETOOLONG;
            return NULL;
        }
        memcpy(parent, path + 1, len - 1);
        parent[len - 1] = 0;
    }
    int fd = openat(S.backing, parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    struct dirrec *d = dir_find(st.st_dev, st.st_ino);
    if (d) {
        close(fd);
        return d;
    }
    d = xcalloc(1, sizeof *d);
    d->dev = st.st_dev;
    d->ino = st.st_ino;
    d->fd = fd;
    d->next = S.dirs;
    S.dirs = d;
    return d;
}

static void journal_add(enum jkind kind, struct dirrec *d1, const char *name1, struct dirrec *d2, const char *name2,
                        const char *trash)
{
    struct jent *e = xcalloc(1, sizeof *e);
    e->kind = kind;
    e->d1 = d1;
    d1->refs++;
    e->name1 = xstrdup(name1);
    if (d2) {
        e->d2 = d2;
        d2->refs++;
        e->name2 = xstrdup(name2);
    }
    e->trash = trash ? xstrdup(trash) : NULL;
    if (S.jlen == S.jcap) {
        S.jcap = S.jcap ? 2 * S.jcap : 64;
        struct jent **j = realloc(S.journal, S.jcap * sizeof *j);
        if (!j) {
            fprintf(stderr, "powerfs: out of memory\n");
            abort();
        }
        S.journal = j;
    }
    S.journal[S.jlen++] = e;
}

static void jent_free(struct jent *e)
{
    e->d1->refs--;
    dir_put(e->d1);
    if (e->d2) {
        e->d2->refs--;
        dir_put(e->d2);
    }
    free(e->name1);
    free(e->name2);
    free(e->trash);
    free(e);
}

static void new_trash_name(char *buf, size_t size) { snprintf(buf, size, "%" PRIu64, ++S.trash_seq); }

/* fsync of directory D: its entries become durable, and so (to keep each directory's journal a prefix-durable
 * sequence, as a journaling file system keeps metadata in order) every earlier entry of a directory that such an
 * entry also names (cross-directory renames), transitively.  Durable entries leave the journal; their trash is
 * deleted for real. */
static void journal_pin(struct dirrec *d)
{
    for (struct dirrec *x = S.dirs; x; x = x->next)
        x->active = 0;
    d->active = 1;
    for (size_t i = S.jlen; i-- > 0;) {
        struct jent *e = S.journal[i];
        e->pin = e->d1->active || (e->d2 && e->d2->active);
        if (e->pin) {
            e->d1->active = 1;
            if (e->d2)
                e->d2->active = 1;
        }
    }
    size_t k = 0;
    for (size_t i = 0; i < S.jlen; i++) {
        struct jent *e = S.journal[i];
        if (!e->pin) {
            S.journal[k++] = e;
            continue;
        }
        if (e->trash) {
            struct stat st;
            if (fstatat(S.trash, e->trash, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
                struct dirrec *gone = dir_find(st.st_dev, st.st_ino);
                if (gone)
                    gone->dead = 1;
            }
            rm_rf_at(S.trash, e->trash);
        }
        jent_free(e);
    }
    S.jlen = k;
    /* a file whose last name went with the trash, and that nobody has open, can no longer be reached */
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct node *n = S.nodes[b], *next; n; n = next) {
            next = n->next;
            node_maybe_free(n);
        }
}

static void undo(struct jent *e)
{
    int r = 0;
    if (e->d1->dead || (e->d2 && e->d2->dead))
        return;
    switch (e->kind) {
    case J_CREATE:
    case J_LINK:
    case J_SYMLINK:
        r = unlinkat(e->d1->fd, e->name1, 0);
        break;
    case J_MKDIR:
        rm_rf_at(e->d1->fd, e->name1); /* whatever was made durable inside it is unreachable now */
        break;
    case J_UNLINK:
    case J_RMDIR:
        r = renameat(S.trash, e->trash, e->d1->fd, e->name1);
        break;
    case J_RENAME:
        r = renameat(e->d2->fd, e->name2, e->d1->fd, e->name1);
        if (r == 0 && e->trash)
            r = renameat(S.trash, e->trash, e->d2->fd, e->name2);
        break;
    case J_EXCHANGE:
        r = renameat2(e->d1->fd, e->name1, e->d2->fd, e->name2, RENAME_EXCHANGE);
        break;
    }
    if (r < 0)
        fprintf(stderr, "powerfs: cannot undo a journal entry (%d %s): %s\n", e->kind, e->name1, strerror(errno));
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* The power cut.                                                                                                   */

enum cutmode { CUT_ALL, CUT_RANDOM, CUT_TORN };

static int by_dirty_seq(const void *a, const void *b)
{
    const struct node *x = *(const struct node *const *)a, *y = *(const struct node *const *)b;
    return x->dirty_seq < y->dirty_seq ? -1 : x->dirty_seq > y->dirty_seq;
}

/* What of node N's overlay reaches the backing file. */
static void cut_node(struct node *n, enum cutmode mode)
{
    if (mode == CUT_ALL || !node_dirty(n))
        return;
    int size_changed = n->size != n->dsize || n->low != n->dsize;
    int keep_size = size_changed && coin();
    off_t limit = keep_size ? n->size : n->dsize; /* data past the durable end is not visible */
    if (keep_size && n->low < n->dsize && ftruncate(n->fd, n->low) < 0)
        fprintf(stderr, "powerfs: cut: ftruncate: %s\n", strerror(errno));
    for (size_t i = 0; i < n->cap; i++) {
        struct page *pg = n->pages[i];
        if (!pg || pg->orphan || !coin())
            continue;
        unsigned mask = 0xff; /* sectors of the page that reach the disk */
        if (mode == CUT_TORN && coin())
            mask = 1 + (unsigned)(rnd() % 254); /* torn: some of the 8 sectors, neither none nor all */
        for (int s = 0; s < PAGE / SECTOR; s++) {
            off_t off = (off_t)i * PAGE + s * SECTOR;
            if (!(mask & (1u << s)) || off >= limit)
                continue;
            size_t len = limit - off < SECTOR ? (size_t)(limit - off) : SECTOR;
            if (pwrite(n->fd, pg->data + s * SECTOR, len, off) != (ssize_t)len)
                fprintf(stderr, "powerfs: cut: pwrite: %s\n", strerror(errno));
        }
    }
    if (keep_size && ftruncate(n->fd, n->size) < 0)
        fprintf(stderr, "powerfs: cut: ftruncate: %s\n", strerror(errno));
}

static void power_cut(enum cutmode mode, uint64_t seed)
{
    rng = seed;
    /* 1. file data, in the order the files became dirty */
    size_t count = 0;
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct node *n = S.nodes[b]; n; n = n->next)
            count++;
    struct node **all = xcalloc(count + 1, sizeof *all);
    count = 0;
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct node *n = S.nodes[b]; n; n = n->next)
            all[count++] = n;
    qsort(all, count, sizeof *all, by_dirty_seq);
    for (size_t i = 0; i < count; i++)
        cut_node(all[i], mode);
    for (size_t i = 0; i < count; i++)
        node_free(all[i]);
    free(all);

    /* 2. directory entries: which entries are lost.  `all`: every one.  Otherwise each directory keeps a random
     * prefix of its journal; an entry is lost when it is past the prefix of one of its directories, or when an
     * earlier entry of one of its directories was lost (so a cross-directory rename is kept or lost as a whole) */
    for (struct dirrec *d = S.dirs; d; d = d->next)
        d->count = d->seen = d->undoing = d->drawn = 0;
    for (size_t i = 0; i < S.jlen; i++) {
        S.journal[i]->d1->count++;
        if (S.journal[i]->d2 && S.journal[i]->d2 != S.journal[i]->d1)
            S.journal[i]->d2->count++;
    }
    for (size_t i = 0; i < S.jlen; i++) {
        struct jent *e = S.journal[i];
        struct dirrec *ds[2] = {e->d1, e->d2 && e->d2 != e->d1 ? e->d2 : NULL};
        int lost = mode == CUT_ALL;
        for (int k = 0; k < 2; k++) {
            struct dirrec *d = ds[k];
            if (!d)
                continue;
            if (!d->drawn) { /* directories draw their prefix in the order they first appear: deterministic */
                d->drawn = 1;
                d->keep = (int)(rnd() % (uint64_t)(d->count + 1));
            }
            if (d->undoing || d->seen++ >= d->keep)
                lost = 1;
        }
        e->undo = lost;
        if (lost)
            for (int k = 0; k < 2; k++)
                if (ds[k])
                    ds[k]->undoing = 1;
    }
    /* 3. undo the lost entries, newest first */
    for (size_t i = S.jlen; i-- > 0;)
        if (S.journal[i]->undo)
            undo(S.journal[i]);
    for (size_t i = 0; i < S.jlen; i++)
        jent_free(S.journal[i]);
    S.jlen = 0;
    /* 4. the trash is not part of what the disk holds */
    close(S.trash);
    S.trash = -1;
    rm_rf_at(S.backing, TRASH);
    purge_hidden(S.backing);
    S.cut = 1;
}

/* Clean unmount: everything becomes durable, as a real unmount syncs the file system. */
static void clean_shutdown(void)
{
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct node *n = S.nodes[b], *next; n; n = next) {
            next = n->next;
            node_sync(n);
            node_free(n);
        }
    for (size_t i = 0; i < S.jlen; i++)
        jent_free(S.journal[i]);
    S.jlen = 0;
    if (S.trash >= 0)
        close(S.trash);
    S.trash = -1;
    rm_rf_at(S.backing, TRASH);
    purge_hidden(S.backing);
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* The control file.                                                                                                */

static int ctl_status(char *buf, size_t size)
{
    size_t dirty_nodes = 0, dirty_pages = 0;
    for (size_t b = 0; b < NBUCKETS; b++)
        for (struct node *n = S.nodes[b]; n; n = n->next) {
            dirty_nodes += node_dirty(n) != 0;
            dirty_pages += n->npages;
        }
    int len = snprintf(buf, size, "ops %" PRIu64 "\n", S.ops);
    for (int k = 0; k < NKINDS; k++)
        len += snprintf(buf + len, size - (size_t)len, "%s %" PRIu64 "\n", kind_names[k], S.per_kind[k]);
    len += snprintf(buf + len, size - (size_t)len,
                    "fail_k %" PRIu64 "\nfail_errno %d\nfail_seen %" PRIu64 "\ninjected %" PRIu64 "\n"
                    "fsync_error %s\ncapacity %" PRIu64 "\ndirty_nodes %zu\ndirty_pages %zu\njournal %zu\n",
                    S.fail_k, S.fail_errno, S.fail_seen, S.injected, S.fsync_error_keep ? "keep" : "drop",
                    S.capacity, dirty_nodes, dirty_pages, S.jlen);
    return len;
}

static int parse_errno(const char *s)
{
    static const struct { const char *name; int value; } names[] = {
        {"ENOSPC", ENOSPC}, {"EIO", EIO}, {"EDQUOT", EDQUOT}, {"EROFS", EROFS}, {"EFBIG", EFBIG},
        {"ENOMEM", ENOMEM}, {"EINTR", EINTR}, {"EAGAIN", EAGAIN}, {"EPERM", EPERM}, {"EACCES", EACCES}};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(s, names[i].name) == 0)
            return names[i].value;
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v > 0 && v < 4096 ? (int)v : 0;
}

static int ctl_command(char *line)
{
    char *argv[5] = {0};
    int argc = 0;
    for (char *tok = strtok(line, " \t\r"); tok && argc < 5; tok = strtok(NULL, " \t\r"))
        argv[argc++] = tok;
    if (argc == 0)
        return 0;
    if (strcmp(argv[0], "cut") == 0 && argc == 3) {
        enum cutmode mode;
        if (strcmp(argv[1], "all") == 0)
            mode = CUT_ALL;
        else if (strcmp(argv[1], "random") == 0)
            mode = CUT_RANDOM;
        else if (strcmp(argv[1], "torn") == 0)
            mode = CUT_TORN;
        else
            return -EINVAL;
        power_cut(mode, strtoull(argv[2], NULL, 10));
        return 0;
    }
    if (strcmp(argv[0], "fail") == 0 && argc == 2 && strcmp(argv[1], "off") == 0) {
        S.fail_k = 0;
        return 0;
    }
    if (strcmp(argv[0], "fail") == 0 && (argc == 3 || argc == 4 || argc == 5)) {
        char *end;
        unsigned long long k = strtoull(argv[1], &end, 10);
        int e = parse_errno(argv[2]);
        if (*end || k == 0 || e == 0)
            return -EINVAL;
        unsigned mask = 0;
        if (argc == 4) {
            for (char *kind = strtok(argv[3], ","); kind; kind = strtok(NULL, ",")) {
                int found = 0;
                for (int i = 0; i < NKINDS; i++)
                    if (strcmp(kind, kind_names[i]) == 0) {
                        mask |= 1u << i;
                        found = 1;
                    }
                if (!found)
                    return -EINVAL;
            }
        } else {
            mask = (1u << NKINDS) - 1;
        }
        ino_t ino = 0;
        if (argc == 5) {
            ino = (ino_t)strtoull(argv[4], &end, 10);
            if (*end || ino == 0)
                return -EINVAL;
        }
        S.fail_k = k;
        S.fail_errno = e;
        S.fail_mask = mask;
        S.fail_ino = ino;
        S.fail_seen = 0;
        return 0;
    }
    if (strcmp(argv[0], "fsync_error") == 0 && argc == 2) {
        if (strcmp(argv[1], "keep") == 0)
            S.fsync_error_keep = 1;
        else if (strcmp(argv[1], "drop") == 0)
            S.fsync_error_keep = 0;
        else
            return -EINVAL;
        return 0;
    }
    if (strcmp(argv[0], "capacity") == 0 && argc == 2) {
        if (strcmp(argv[1], "off") == 0) {
            S.capacity = 0;
            return 0;
        }
        char *end;
        unsigned long long c = strtoull(argv[1], &end, 10);
        if (*end || c == 0)
            return -EINVAL;
        S.capacity = c;
        return 0;
    }
    return -EINVAL;
}

static int ctl_write(const char *buf, size_t size)
{
    char text[4096];
    if (size >= sizeof text)
        return -EINVAL;
    memcpy(text, buf, size);
    text[size] = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (S.cut)
            return -EIO;
        int r = ctl_command(line);
        if (r)
            return r;
    }
    return (int)size;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* FUSE operations.  Each one takes the global mutex; after a cut every one answers EIO.                             */

#define LOCKED(call)                                                                                                   \
    do {                                                                                                               \
        int r_;                                                                                                        \
        pthread_mutex_lock(&big);                                                                                      \
        r_ = S.cut ? -EIO : (call);                                                                                    \
        pthread_mutex_unlock(&big);                                                                                    \
        return r_;                                                                                                     \
    } while (0)

/* fi->fh of a regular file is its node (or &ctl_node), of a directory a DIR *.  The kernel passes a file handle to
 * getattr and setattr (ftruncate) only for regular files, and fsync of a directory comes as fsyncdir. */
#define NODE(fi) ((struct node *)(uintptr_t)(fi)->fh)

static void *pf_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    (void)conn;
    cfg->use_ino = 1;       /* st_ino of the backing files */
    cfg->nullpath_ok = 1;   /* operations on an open handle use the handle, never its path */
    cfg->hard_remove = 0;   /* unlinked open files get a hidden name: with none, fstat of them fails (ESTALE) */
    cfg->entry_timeout = 0; /* sizes and names are always fresh */
    cfg->attr_timeout = 0;
    cfg->negative_timeout = 0;
    cfg->direct_io = 0;     /* the page cache stays on: shared writable mmap needs it */
    cfg->kernel_cache = 0;
    cfg->auto_cache = 0;
    return NULL;
}

static void pf_destroy(void *data)
{
    (void)data;
    pthread_mutex_lock(&big);
    if (!S.cut)
        clean_shutdown();
    pthread_mutex_unlock(&big);
}

static int size_view(struct stat *st) /* a regular file's size is the overlay's */
{
    if (!S_ISREG(st->st_mode))
        return 0;
    struct node *n = node_find(st->st_dev, st->st_ino);
    if (n) {
        st->st_size = n->size;
        blkcnt_t blocks = (n->size + 511) / 512;
        if (blocks > st->st_blocks)
            st->st_blocks = blocks;
    }
    return 0;
}

static int do_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    if (fi && NODE(fi) != &ctl_node) {
        if (fstat(NODE(fi)->fd, st) < 0)
            return -errno;
        return size_view(st);
    }
    if (is_ctl(path)) {
        memset(st, 0, sizeof *st);
        st->st_mode = S_IFREG | 0666;
        st->st_nlink = 1;
        st->st_uid = getuid();
        st->st_gid = getgid();
        return 0;
    }
    if (!path)
        return -EBADF;
    if (is_hidden(path))
        return -ENOENT;
    if (fstatat(S.backing, rel(path), st, AT_SYMLINK_NOFOLLOW) < 0)
        return -errno;
    return size_view(st);
}
static int pf_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    LOCKED(do_getattr(path, st, fi));
}

static int do_readlink(const char *path, char *buf, size_t size)
{
    if (is_hidden(path))
        return -ENOENT;
    ssize_t r = readlinkat(S.backing, rel(path), buf, size - 1);
    if (r < 0)
        return -errno;
    buf[r] = 0;
    return 0;
}
static int pf_readlink(const char *path, char *buf, size_t size) { LOCKED(do_readlink(path, buf, size)); }

/* Files made through us belong to the caller (the daemon may run as root for other users). */
static void own(int dirfd, const char *name)
{
    if (geteuid() != 0)
        return;
    struct fuse_context *c = fuse_get_context();
    if (fchownat(dirfd, name, c->uid, c->gid, AT_SYMLINK_NOFOLLOW) < 0)
        fprintf(stderr, "powerfs: chown %s: %s\n", name, strerror(errno));
}

/* The directory holding a new entry PATH, after the checks common to every operation that makes one. */
static int new_entry(const char *path, enum opkind kind, struct dirrec **d, const char **name)
{
    if (is_ctl(path) || is_hidden(path))
        return -EPERM;
    int e = inject(kind);
    if (e)
        return -e;
    *d = dir_of(path, name);
    return *d ? 0 : -errno;
}

static int do_mknod(const char *path, mode_t mode, dev_t rdev)
{
    struct dirrec *d;
    const char *name;
    int r = new_entry(path, K_MKNOD, &d, &name);
    if (r)
        return r;
    if (mknodat(d->fd, name, mode, rdev) < 0) {
        r = -errno;
        dir_put(d);
        return r;
    }
    own(d->fd, name);
    journal_add(J_CREATE, d, name, NULL, NULL, NULL);
    return 0;
}
static int pf_mknod(const char *path, mode_t mode, dev_t rdev) { LOCKED(do_mknod(path, mode, rdev)); }

static int do_mkdir(const char *path, mode_t mode)
{
    struct dirrec *d;
    const char *name;
    int r = new_entry(path, K_MKDIR, &d, &name);
    if (r)
        return r;
    if (mkdirat(d->fd, name, mode) < 0) {
        r = -errno;
        dir_put(d);
        return r;
    }
    own(d->fd, name);
    journal_add(J_MKDIR, d, name, NULL, NULL, NULL);
    return 0;
}
static int pf_mkdir(const char *path, mode_t mode) { LOCKED(do_mkdir(path, mode)); }

static int do_symlink(const char *target, const char *path)
{
    struct dirrec *d;
    const char *name;
    int r = new_entry(path, K_SYMLINK, &d, &name);
    if (r)
        return r;
    if (symlinkat(target, d->fd, name) < 0) {
        r = -errno;
        dir_put(d);
        return r;
    }
    own(d->fd, name);
    journal_add(J_SYMLINK, d, name, NULL, NULL, NULL);
    return 0;
}
static int pf_symlink(const char *target, const char *path) { LOCKED(do_symlink(target, path)); }

static int do_link(const char *from, const char *to)
{
    if (is_ctl(from) || is_hidden(from))
        return -EPERM;
    struct dirrec *d;
    const char *name;
    int r = new_entry(to, K_LINK, &d, &name);
    if (r)
        return r;
    if (linkat(S.backing, rel(from), d->fd, name, 0) < 0) {
        r = -errno;
        dir_put(d);
        return r;
    }
    journal_add(J_LINK, d, name, NULL, NULL, NULL);
    return 0;
}
static int pf_link(const char *from, const char *to) { LOCKED(do_link(from, to)); }

/* unlink and rmdir: move the entry into the trash, so that a cut can put it back */
static int do_remove(const char *path, int dir)
{
    if (is_ctl(path) || is_hidden(path))
        return -EPERM;
    /* the last close of an unlinked file (libfuse removes its hidden name): not an operation of the program */
    int e = is_fuse_hidden(base_name(path)) ? 0 : inject(dir ? K_RMDIR : K_UNLINK);
    if (e)
        return -e;
    const char *name;
    struct dirrec *d = dir_of(path, &name);
    if (!d)
        return -errno;
    struct stat st;
    int r = 0;
    if (fstatat(d->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        r = -errno;
    else if (dir && !S_ISDIR(st.st_mode))
        r = -ENOTDIR;
    else if (!dir && S_ISDIR(st.st_mode))
        r = -EISDIR;
    else if (dir && (r = dir_is_empty(d->fd, name)) >= 0)
        r = r ? 0 : -ENOTEMPTY;
    char trash[32];
    new_trash_name(trash, sizeof trash);
    if (r == 0 && renameat(d->fd, name, S.trash, trash) < 0)
        r = -errno;
    if (r) {
        dir_put(d);
        return r;
    }
    journal_add(dir ? J_RMDIR : J_UNLINK, d, name, NULL, NULL, trash);
    return 0;
}
static int pf_unlink(const char *path) { LOCKED(do_remove(path, 0)); }
static int pf_rmdir(const char *path) { LOCKED(do_remove(path, 1)); }

static int do_rename(const char *from, const char *to, unsigned int flags)
{
    if (is_ctl(from) || is_hidden(from) || is_ctl(to) || is_hidden(to))
        return -EPERM;
    if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE))
        return -EINVAL;
    /* libfuse hides an open file that is unlinked, or replaced by a rename, by renaming it: for the program that is
     * (part of) an unlink.  Journaled as a rename, so that a cut puts the name back */
    int e = inject(is_fuse_hidden(base_name(to)) ? K_UNLINK : K_RENAME);
    if (e)
        return -e;
    const char *n1, *n2;
    struct dirrec *d1 = dir_of(from, &n1);
    if (!d1)
        return -errno;
    struct dirrec *d2 = dir_of(to, &n2);
    if (!d2) {
        int r = -errno;
        dir_put(d1);
        return r;
    }
    int r = 0;
    char trash[32] = "";
    struct stat src, dst;
    if (flags & RENAME_EXCHANGE) {
        if (renameat2(d1->fd, n1, d2->fd, n2, RENAME_EXCHANGE) < 0)
            r = -errno;
        else
            journal_add(J_EXCHANGE, d1, n1, d2, n2, NULL);
    } else if (fstatat(d1->fd, n1, &src, AT_SYMLINK_NOFOLLOW) < 0) {
        r = -errno;
    } else if (fstatat(d2->fd, n2, &dst, AT_SYMLINK_NOFOLLOW) < 0) { /* no target */
        if (errno != ENOENT)
            r = -errno;
        else if (renameat2(d1->fd, n1, d2->fd, n2, flags) < 0)
            r = -errno;
        else
            journal_add(J_RENAME, d1, n1, d2, n2, NULL);
    } else if (flags & RENAME_NOREPLACE) {
        r = -EEXIST;
    } else if (src.st_dev == dst.st_dev && src.st_ino == dst.st_ino) {
        r = 0; /* two names of one file: POSIX says rename does nothing */
    } else if (S_ISDIR(src.st_mode) && !S_ISDIR(dst.st_mode)) {
        r = -ENOTDIR;
    } else if (!S_ISDIR(src.st_mode) && S_ISDIR(dst.st_mode)) {
        r = -EISDIR;
    } else if (S_ISDIR(dst.st_mode) && (r = dir_is_empty(d2->fd, n2)) <= 0) {
        r = r < 0 ? r : -ENOTEMPTY;
    } else {
        /* replace: the old target goes into the trash first, then the rename; the undo does the reverse */
        r = 0;
        new_trash_name(trash, sizeof trash);
        if (renameat(d2->fd, n2, S.trash, trash) < 0) {
            r = -errno;
        } else if (renameat(d1->fd, n1, d2->fd, n2) < 0) {
            r = -errno;
            if (renameat(S.trash, trash, d2->fd, n2) < 0)
                fprintf(stderr, "powerfs: cannot put back %s: %s\n", n2, strerror(errno));
        } else {
            journal_add(J_RENAME, d1, n1, d2, n2, trash);
        }
    }
    dir_put(d1);
    if (d2 != d1)
        dir_put(d2);
    return r;
}
static int pf_rename(const char *from, const char *to, unsigned int flags) { LOCKED(do_rename(from, to, flags)); }

static int do_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    if (fi && NODE(fi) != &ctl_node)
        return fchmod(NODE(fi)->fd, mode) < 0 ? -errno : 0;
    if (!path || is_ctl(path) || is_hidden(path))
        return -EPERM;
    return fchmodat(S.backing, rel(path), mode, 0) < 0 ? -errno : 0;
}
static int pf_chmod(const char *path, mode_t mode, struct fuse_file_info *fi) { LOCKED(do_chmod(path, mode, fi)); }

static int do_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
    if (fi && NODE(fi) != &ctl_node)
        return fchown(NODE(fi)->fd, uid, gid) < 0 ? -errno : 0;
    if (!path || is_ctl(path) || is_hidden(path))
        return -EPERM;
    return fchownat(S.backing, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}
static int pf_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
    LOCKED(do_chown(path, uid, gid, fi));
}

static int do_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    if ((fi && NODE(fi) == &ctl_node) || is_ctl(path))
        return 0; /* `echo cut all 1 > .powerfs` truncates first */
    if (size < 0)
        return -EINVAL;
    struct node *n;
    if (fi) {
        n = NODE(fi);
    } else {
        if (!path || is_hidden(path))
            return -ENOENT;
        int fd = open_backing(S.backing, rel(path));
        if (fd < 0)
            return fd;
        if (!(n = node_get_fd(fd)))
            return -errno;
    }
    int e = inject_on(K_TRUNCATE, n);
    int r = e ? -e : check_capacity(n, size);
    if (r == 0)
        node_truncate(n, size);
    node_maybe_free(n);
    return r;
}
static int pf_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    LOCKED(do_truncate(path, size, fi));
}

/* O_TRUNC reaches us in open/create (atomic_o_trunc): it changes the overlay's size, never the backing file */
static int open_node(int fd, struct fuse_file_info *fi, int truncate)
{
    struct node *n = node_get_fd(fd);
    if (!n)
        return -errno;
    if (truncate && n->size != 0)
        node_truncate(n, 0);
    n->opens++;
    fi->fh = (uintptr_t)n;
    return 0;
}

static int do_open(const char *path, struct fuse_file_info *fi)
{
    if (is_ctl(path)) {
        fi->fh = (uintptr_t)&ctl_node;
        fi->direct_io = 1; /* reads and writes of commands reach us as they are */
        return 0;
    }
    if (is_hidden(path))
        return -ENOENT;
    int truncate = (fi->flags & O_TRUNC) && (fi->flags & O_ACCMODE) != O_RDONLY;
    if (truncate) {
        int e = inject(K_TRUNCATE);
        if (e)
            return -e;
    }
    int fd = open_backing(S.backing, rel(path));
    if (fd < 0)
        return fd;
    return open_node(fd, fi, truncate);
}
static int pf_open(const char *path, struct fuse_file_info *fi) { LOCKED(do_open(path, fi)); }

static int do_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    struct dirrec *d;
    const char *name;
    int r = new_entry(path, K_CREATE, &d, &name);
    if (r)
        return r;
    int fd = openat(d->fd, name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC | O_NOFOLLOW, mode & 07777);
    if (fd < 0 && errno == EEXIST && !(fi->flags & O_EXCL)) { /* it exists: an open, not a creation */
        fd = open_backing(d->fd, name);
        r = fd < 0 ? fd : open_node(fd, fi, (fi->flags & O_TRUNC) != 0);
        dir_put(d);
        return r;
    }
    if (fd < 0) {
        r = -errno;
        dir_put(d);
        return r;
    }
    own(d->fd, name);
    journal_add(J_CREATE, d, name, NULL, NULL, NULL);
    return open_node(fd, fi, 0);
}
static int pf_create(const char *path, mode_t mode, struct fuse_file_info *fi) { LOCKED(do_create(path, mode, fi)); }

static int do_read(char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    if (NODE(fi) == &ctl_node) {
        char text[4096];
        int len = ctl_status(text, sizeof text);
        if (off >= len)
            return 0;
        size_t n = (size_t)(len - off) < size ? (size_t)(len - off) : size;
        memcpy(buf, text + off, n);
        return (int)n;
    }
    return node_read(NODE(fi), buf, size, off);
}
static int pf_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    (void)path;
    LOCKED(do_read(buf, size, off, fi));
}

static int do_write(const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    if (NODE(fi) == &ctl_node)
        return ctl_write(buf, size);
    int e = inject_on(K_WRITE, NODE(fi));
    if (e)
        return -e;
    return node_write(NODE(fi), buf, size, off);
}
static int pf_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
    (void)path;
    LOCKED(do_write(buf, size, off, fi));
}

static int do_statfs(struct statvfs *st) { return fstatvfs(S.backing, st) < 0 ? -errno : 0; }
static int pf_statfs(const char *path, struct statvfs *st)
{
    (void)path;
    LOCKED(do_statfs(st));
}

static int pf_flush(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    if (NODE(fi) == &ctl_node)
        return 0; /* closing the control file after a cut must not fail */
    LOCKED(0);
}

static int pf_release(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    pthread_mutex_lock(&big);
    struct node *n = NODE(fi);
    if (n != &ctl_node && !S.cut) { /* after a cut every node is gone already */
        n->opens--;
        node_maybe_free(n);
    }
    pthread_mutex_unlock(&big);
    return 0;
}

static int do_fsync(struct fuse_file_info *fi)
{
    struct node *n = NODE(fi);
    if (n == &ctl_node)
        return 0;
    int e = inject_on(K_FSYNC, n);
    if (e) {
        node_failed_sync(n);
        return -e;
    }
    return node_sync(n);
}
static int pf_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)path;
    (void)datasync; /* fdatasync makes the size durable too (it is needed to read the data back) */
    LOCKED(do_fsync(fi));
}

static int do_fallocate(int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
    struct node *n = NODE(fi);
    if (n == &ctl_node)
        return -EOPNOTSUPP;
    if (off < 0 || len <= 0)
        return -EINVAL;
    int known = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE;
    if (mode & ~known)
        return -EOPNOTSUPP;
    if ((mode & FALLOC_FL_PUNCH_HOLE) && !(mode & FALLOC_FL_KEEP_SIZE))
        return -EOPNOTSUPP;
    int e = inject_on(K_FALLOCATE, n);
    if (e)
        return -e;
    int grows = !(mode & FALLOC_FL_KEEP_SIZE) && off + len > n->size;
    int r = check_capacity(n, grows ? off + len : n->size);
    if (r)
        return r;
    if (mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE)) {
        r = node_zero(n, off, len);
        if (r)
            return r;
    }
    if (grows)
        node_truncate(n, off + len); /* mode 0 / ZERO_RANGE: the file grows with zeros */
    return 0;
}
static int pf_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
    (void)path;
    LOCKED(do_fallocate(mode, off, len, fi));
}

static int do_opendir(const char *path, struct fuse_file_info *fi)
{
    if (is_hidden(path) || is_ctl(path))
        return -ENOENT;
    int fd = openat(S.backing, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int r = -errno;
        close(fd);
        return r;
    }
    fi->fh = (uintptr_t)d;
    return 0;
}
static int pf_opendir(const char *path, struct fuse_file_info *fi) { LOCKED(do_opendir(path, fi)); }

static int do_readdir(void *buf, fuse_fill_dir_t filler, struct fuse_file_info *fi)
{
    DIR *d = (DIR *)(uintptr_t)fi->fh;
    struct stat dst, bst; /* the root lists everything but the trash */
    int root = fstat(dirfd(d), &dst) == 0 && fstat(S.backing, &bst) == 0 && bst.st_dev == dst.st_dev &&
               bst.st_ino == dst.st_ino;
    rewinddir(d);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if ((root && strcmp(de->d_name, TRASH) == 0) || is_fuse_hidden(de->d_name))
            continue;
        struct stat st;
        memset(&st, 0, sizeof st);
        st.st_ino = de->d_ino;
        st.st_mode = (mode_t)DTTOIF(de->d_type);
        if (filler(buf, de->d_name, &st, 0, 0))
            break;
    }
    return 0;
}
static int pf_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off, struct fuse_file_info *fi,
                      enum fuse_readdir_flags flags)
{
    (void)path;
    (void)off;
    (void)flags;
    LOCKED(do_readdir(buf, filler, fi));
}

static int pf_releasedir(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    pthread_mutex_lock(&big);
    closedir((DIR *)(uintptr_t)fi->fh);
    pthread_mutex_unlock(&big);
    return 0;
}

static int do_fsyncdir(struct fuse_file_info *fi)
{
    int e = inject(K_FSYNCDIR);
    if (e)
        return -e;
    struct stat st;
    if (fstat(dirfd((DIR *)(uintptr_t)fi->fh), &st) < 0)
        return -errno;
    struct dirrec *d = dir_find(st.st_dev, st.st_ino);
    if (d)
        journal_pin(d);
    return 0;
}
static int pf_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)path;
    (void)datasync;
    LOCKED(do_fsyncdir(fi));
}

static int do_access(const char *path, int mask)
{
    if (is_ctl(path))
        return 0;
    if (is_hidden(path))
        return -ENOENT;
    return faccessat(S.backing, rel(path), mask, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}
static int pf_access(const char *path, int mask) { LOCKED(do_access(path, mask)); }

static int do_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
    if (fi && NODE(fi) != &ctl_node)
        return futimens(NODE(fi)->fd, tv) < 0 ? -errno : 0;
    if (!path || is_ctl(path))
        return 0;
    if (is_hidden(path))
        return -ENOENT;
    return utimensat(S.backing, rel(path), tv, AT_SYMLINK_NOFOLLOW) < 0 ? -errno : 0;
}
static int pf_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
    LOCKED(do_utimens(path, tv, fi));
}

static const struct fuse_operations ops = {
    .init = pf_init,
    .destroy = pf_destroy,
    .getattr = pf_getattr,
    .readlink = pf_readlink,
    .mknod = pf_mknod,
    .mkdir = pf_mkdir,
    .unlink = pf_unlink,
    .rmdir = pf_rmdir,
    .symlink = pf_symlink,
    .rename = pf_rename,
    .link = pf_link,
    .chmod = pf_chmod,
    .chown = pf_chown,
    .truncate = pf_truncate,
    .open = pf_open,
    .read = pf_read,
    .write = pf_write,
    .statfs = pf_statfs,
    .flush = pf_flush,
    .release = pf_release,
    .fsync = pf_fsync,
    .opendir = pf_opendir,
    .readdir = pf_readdir,
    .releasedir = pf_releasedir,
    .fsyncdir = pf_fsyncdir,
    .access = pf_access,
    .create = pf_create,
    .utimens = pf_utimens,
    .fallocate = pf_fallocate,
};

int main(int argc, char *argv[])
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s BACKING MOUNTPOINT [fuse options]\n", argv[0]);
        return 2;
    }
    /* the test harness asks to be followed: the daemon unmounts (SIGTERM) when the process that started it dies */
    if (getenv("POWERFS_PDEATHSIG")) {
        pid_t parent = getppid();
        if (prctl(PR_SET_PDEATHSIG, SIGTERM) < 0 || getppid() != parent)
            return 1;
    }
    umask(0); /* the kernel already applied the caller's umask */
    S.backing = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (S.backing < 0) {
        fprintf(stderr, "powerfs: %s: %s\n", argv[1], strerror(errno));
        return 1;
    }
    rm_rf_at(S.backing, TRASH); /* left by a daemon that was killed: not part of the durable state */
    if (mkdirat(S.backing, TRASH, 0700) < 0 ||
        (S.trash = openat(S.backing, TRASH, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        fprintf(stderr, "powerfs: %s/%s: %s\n", argv[1], TRASH, strerror(errno));
        return 1;
    }
    argv[1] = argv[0]; /* fuse_main sees: powerfs MOUNTPOINT [options] */
    return fuse_main(argc - 1, argv + 1, &ops, NULL);
}
