/*
 * powerfs's overlay model (see powerfs.c's opening comment): the per-inode overlay of unsynced data and size, the undo
 * journal of directory operations, fault injection and the power cut. Everything here runs with `big` held.
 */
#include "powerfs.h"

pthread_mutex_t big = PTHREAD_MUTEX_INITIALIZER;
struct state S;
const char *const kind_names[NKINDS] = {"write", "fsync", "fallocate", "truncate", "create", "mknod", "mkdir",
                                        "unlink", "rmdir", "rename", "link", "symlink", "fsyncdir"};

/* ---------------------------------------------------------------------------------------------------------------- */
/* Small helpers.                                                                                                    */

const char *rel(const char *path) { return path[1] ? path + 1 : "."; }

int is_hidden(const char *path) /* the trash is not part of the file system */
{
    size_t n = strlen("/" TRASH);
    return strncmp(path, "/" TRASH, n) == 0 && (path[n] == 0 || path[n] == '/');
}

int is_ctl(const char *path) { return path && strcmp(path, CTL) == 0; }

/* libfuse's high-level API keeps a file that is unlinked while open under a new name, ".fuse_hidden...", until its
 * last close (without that, fstat of such a file fails).  These names are not listed, and a cut removes them: after
 * a reboot an unlinked open file is gone. */
int is_fuse_hidden(const char *name) { return strncmp(name, ".fuse_hidden", 12) == 0; }
const char *base_name(const char *path) { return strrchr(path, '/') + 1; }

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
void rm_rf_at(int dirfd, const char *name)
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

/* 1 when directory NAME in DIRFD is empty but for hidden names of files no handle has open, 0 when it holds more,
 * -errno.  A hidden name of an open file counts (as with any libfuse high-level file system, rmdir fails until its
 * last close); one whose file is closed is an orphan: libfuse 3.14 leaves it behind for good when the last close's
 * RELEASE races the UNLINK that hid it (libfuse issue #746, fixed after 3.14), and nothing would ever remove it. */
static int orphan_hidden(int dirfd, const char *name)
{
    struct stat st;
    if (!is_fuse_hidden(name) || fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return 0;
    struct node *n = node_find(st.st_dev, st.st_ino);
    return n == NULL || n->opens == 0;
}

int dir_is_empty(int dirfd, const char *name)
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
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && !orphan_hidden(fd, de->d_name)) {
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
int inject_on(enum opkind kind, const struct node *n)
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
int inject(enum opkind kind) { return inject_on(kind, NULL); }

/* ---------------------------------------------------------------------------------------------------------------- */
/* Nodes: the per-inode overlay of unsynced file data and size.                                                      */

static struct node **bucket(dev_t dev, ino_t ino) { return &S.nodes[(ino ^ dev) % NBUCKETS]; }

struct node *node_find(dev_t dev, ino_t ino)
{
    for (struct node *n = *bucket(dev, ino); n; n = n->next)
        if (n->dev == dev && n->ino == ino)
            return n;
    return NULL;
}

int node_dirty(const struct node *n) { return n->npages || n->size != n->dsize || n->low != n->dsize; }

/* Node of the file open as FD (takes FD over), creating it if needed. */
struct node *node_get_fd(int fd)
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

int open_backing(int dirfd, const char *name)
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
void node_maybe_free(struct node *n)
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

int node_read(struct node *n, char *buf, size_t size, off_t off)
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
int check_capacity(struct node *n, off_t new_end)
{
    if (!S.capacity || new_end <= n->size)
        return 0;
    return tree_bytes(S.backing, 1) + (uint64_t)(new_end - n->size) > S.capacity ? -ENOSPC : 0;
}

int node_write(struct node *n, const char *buf, size_t size, off_t off)
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

void node_truncate(struct node *n, off_t size)
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
int node_zero(struct node *n, off_t off, off_t len)
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
int node_sync(struct node *n)
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
void node_failed_sync(struct node *n)
{
    if (S.fsync_error_keep)
        return;
    for (size_t i = 0; i < n->cap; i++)
        if (n->pages[i])
            n->pages[i]->orphan = 1;
}

/* ---------------------------------------------------------------------------------------------------------------- */
/* Directory records and the undo journal.                                                                           */

struct dirrec *dir_find(dev_t dev, ino_t ino)
{
    for (struct dirrec *d = S.dirs; d; d = d->next)
        if (d->dev == dev && d->ino == ino)
            return d;
    return NULL;
}

void dir_put(struct dirrec *d)
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
struct dirrec *dir_of(const char *path, const char **name)
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

void journal_add(enum jkind kind, struct dirrec *d1, const char *name1, struct dirrec *d2, const char *name2,
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

void new_trash_name(char *buf, size_t size) { snprintf(buf, size, "%" PRIu64, ++S.trash_seq); }

/* fsync of directory D: its entries become durable, and so (to keep each directory's journal a prefix-durable
 * sequence, as a journaling file system keeps metadata in order) every earlier entry of a directory that such an
 * entry also names (cross-directory renames), transitively.  Durable entries leave the journal; their trash is
 * deleted for real. */
void journal_pin(struct dirrec *d)
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

void undo(struct jent *e)
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

void power_cut(enum cutmode mode, uint64_t seed)
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
void clean_shutdown(void)
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
