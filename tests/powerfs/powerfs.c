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
#include "powerfs.h"

static struct node ctl_node; /* fi->fh of an open control file */

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
