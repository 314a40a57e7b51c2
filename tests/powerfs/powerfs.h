/*
 * powerfs's shared declarations: the overlay model (overlay.c: what was written and not yet synced, the undo journal
 * of directory operations, fault injection and the power cut) and its FUSE front (powerfs.c: the control file and
 * the file system operations). powerfs.c's opening comment describes the model.
 */
#ifndef POWERFS_H
#define POWERFS_H

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

extern pthread_mutex_t big;

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
extern const char *const kind_names[NKINDS];

#define NBUCKETS 1024

struct state {
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
};
extern struct state S;

enum cutmode { CUT_ALL, CUT_RANDOM, CUT_TORN };

/* overlay.c's interface to the FUSE front (each one is called with `big` held) */
const char *rel(const char *path);
int is_hidden(const char *path);
int is_ctl(const char *path);
int is_fuse_hidden(const char *name);
const char *base_name(const char *path);
void rm_rf_at(int dirfd, const char *name);
int dir_is_empty(int dirfd, const char *name);
int inject_on(enum opkind kind, const struct node *n);
int inject(enum opkind kind);
struct node *node_find(dev_t dev, ino_t ino);
int node_dirty(const struct node *n);
struct node *node_get_fd(int fd);
int open_backing(int dirfd, const char *name);
void node_maybe_free(struct node *n);
int node_read(struct node *n, char *buf, size_t size, off_t off);
int check_capacity(struct node *n, off_t new_end);
int node_write(struct node *n, const char *buf, size_t size, off_t off);
void node_truncate(struct node *n, off_t size);
int node_zero(struct node *n, off_t off, off_t len);
int node_sync(struct node *n);
void node_failed_sync(struct node *n);
struct dirrec *dir_find(dev_t dev, ino_t ino);
void dir_put(struct dirrec *d);
struct dirrec *dir_of(const char *path, const char **name);
void journal_add(enum jkind kind, struct dirrec *d1, const char *name1, struct dirrec *d2, const char *name2,
                 const char *trash);
void new_trash_name(char *buf, size_t size);
void journal_pin(struct dirrec *d);
void undo(struct jent *e);
void power_cut(enum cutmode mode, uint64_t seed);
void clean_shutdown(void);

#endif
