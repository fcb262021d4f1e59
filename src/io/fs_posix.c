/*
 * The POSIX storage back end (dcp_storage_posix): openat-relative files
 * opened with O_NOFOLLOW, full-length pread/pwrite loops, fsync, rename and
 * directory fsync. Error messages name the file and the system error.
 *
 * Handles are descriptors carried in the void * (fd + 1, so that a valid
 * handle is never NULL). The system calls go through a table (struct
 * dcp__posix_sys, the impl; NULL for the real calls), so that tests can
 * make any of them fail, return short counts or EINTR, beneath the retry
 * loops.
 */
#include "storage.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h> /* NAME_MAX */
#include <stdatomic.h>
#include <fcntl.h> /* openat, O_NOFOLLOW, O_DIRECTORY */
#include <stdint.h>
#include <stdio.h> /* renameat */
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------- system call table */

static int sys_open(const char *path, int flags)
{
    return open(path, flags);
}

static int sys_openat(int dirfd, const char *name, int flags, mode_t mode)
{
    return openat(dirfd, name, flags, mode);
}

static const struct dcp__posix_sys real_sys = {
    sys_open, sys_openat, mkdir,    stat,     fstat,  fstatat, pread,
    pwrite,   fsync,      close,    renameat, unlinkat, linkat};

const struct dcp__posix_sys *dcp__posix_sys_default(void)
{
    return &real_sys;
}

static const struct dcp__posix_sys *sys_of(void *impl)
{
    return impl ? (const struct dcp__posix_sys *)impl : &real_sys;
}

static void *to_handle(int fd)
{
    return (void *)((intptr_t)fd + 1);
}

static int to_fd(void *h)
{
    return (int)((intptr_t)h - 1);
}

/* ------------------------------------------------------------ errors */

static int errno_code(int e)
{
    switch (e) {
    case ENOENT:
    case ENOTDIR:
        return DCP_ENOENT;
    case ENOSPC:
    case EDQUOT:
        return DCP_ENOSPC;
    case ENOMEM:
        return DCP_ENOMEM;
    case ELOOP:
        return DCP_EUNSAFE;
    case EEXIST:
        return DCP_EEXIST;
    default:
        return DCP_EIO;
    }
}

static int sys_err(struct dcp_err *err, const char *what, const char *name)
{
    int e = errno;
    if (e == ELOOP)
        return dcp__err(err, DCP_EUNSAFE,
                        "refusing to follow symbolic link '%s'", name);
    return dcp__err(err, errno_code(e), "cannot %s '%s': %s", what, name,
                    strerror(e));
}

/* dcp__unique_tmp (storage.h): here, below storage.c, so that both the
 * POSIX back end and the version-1 adapters use it. */
int dcp__unique_tmp(char *buf, size_t cap, const char *name,
                    struct dcp_err *err)
{
    static atomic_uint seq;
    struct timespec ts;
    uint64_t x;
    int n;
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^
        (uint64_t)(uintptr_t)buf;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    n = snprintf(buf, cap, "%s.%ld-%u-%08x.tmp", name, (long)getpid(),
                 atomic_fetch_add(&seq, 1u), (unsigned)(x & 0xffffffffu));
    if (n < 0 || (size_t)n >= cap || (size_t)n > DCP_STORAGE_NAME_MAX)
        return dcp__err(err, DCP_EINVAL, "object name '%.64s...' is too long",
                        name);
    return DCP_OK;
}

/* -------------------------------------------------------- operations */

/* Syncs the parent of the directory p[0..end) just created. */
static int sync_parent(const struct dcp__posix_sys *sys, char *p, char *end,
                       struct dcp_err *err)
{
    char *slash = end - 1;
    const char *parent = p;
    int fd, rc = DCP_OK;
    while (slash > p && *slash != '/')
        slash--;
    if (slash == p)
        parent = *p == '/' ? "/" : ".";
    else
        *slash = '\0';
    fd = sys->open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        rc = sys_err(err, "open directory", parent);
    else if (sys->fsync(fd) != 0 && errno != EINVAL)
        rc = sys_err(err, "fsync directory", parent);
    if (fd >= 0)
        (void)sys->close(fd);
    if (slash > p)
        *slash = '/';
    return rc;
}

/* Each directory created is synced into its parent, so a checkpoint
 * reported durable cannot lose its directory. */
static int px_mkdirs(void *impl, const char *path, struct dcp_err *err)
{
    const struct dcp__posix_sys *sys = sys_of(impl);
    char *p = dcp__strdup(path), *s;
    int rc = DCP_OK;
    struct stat sb;
    if (!p)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (s = p + 1; rc == DCP_OK; s++) {
        char c = *s;
        if (c != '/' && c != '\0')
            continue;
        *s = '\0';
        if (sys->mkdir(p, 0755) == 0)
            rc = sync_parent(sys, p, s, err);
        else if (errno != EEXIST)
            rc = sys_err(err, "create directory", p);
        *s = c;
        if (c == '\0')
            break;
    }
    if (rc == DCP_OK && (sys->stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        rc = dcp__err(err, DCP_EIO, "'%s' is not a directory", path);
    dcp__free(p);
    return rc;
}

static int px_open_dir(void *impl, const char *path, void **dir,
                       struct dcp_err *err)
{
    int fd = sys_of(impl)->open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return dcp__err(err, DCP_ENOENT,
                            "checkpoint directory '%s' does not exist", path);
        return sys_err(err, "open directory", path);
    }
    *dir = to_handle(fd);
    return DCP_OK;
}

static void px_close_dir(void *impl, void *dir)
{
    (void)sys_of(impl)->close(to_fd(dir));
}

static int px_create(void *impl, void *dir, const char *name, void **file,
                     struct dcp_err *err)
{
    int f = sys_of(impl)->openat(
        to_fd(dir), name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
        0644);
    if (f < 0)
        return sys_err(err, "create", name);
    *file = to_handle(f);
    return DCP_OK;
}

static int px_open_read(void *impl, void *dir, const char *name, void **file,
                        uint64_t *size, struct dcp_err *err)
{
    const struct dcp__posix_sys *sys = sys_of(impl);
    struct stat sb;
    /* O_NONBLOCK: opening a FIFO planted in a checkpoint must not block
     * (it is refused below); it changes nothing for a regular file. */
    int f = sys->openat(to_fd(dir), name,
                        O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0);
    if (f < 0)
        return sys_err(err, "open", name);
    if (sys->fstat(f, &sb) != 0) {
        int rc = sys_err(err, "stat", name);
        (void)sys->close(f);
        return rc;
    }
    if (!S_ISREG(sb.st_mode)) {
        (void)sys->close(f);
        return dcp__err(err, DCP_EUNSAFE, "'%s' is not a regular file", name);
    }
    *file = to_handle(f);
    *size = (uint64_t)sb.st_size;
    return DCP_OK;
}

static int px_write_at(void *impl, void *file, const char *name, const void *p,
                       size_t n, uint64_t off, struct dcp_err *err)
{
    const struct dcp__posix_sys *sys = sys_of(impl);
    const uint8_t *b = p;
    int fd = to_fd(file);
    while (n > 0) {
        ssize_t w = sys->pwrite(fd, b, n, (off_t)off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return sys_err(err, "write", name);
        }
        if (w == 0)
            return dcp__err(err, DCP_EIO, "cannot write '%s': no progress",
                            name);
        b += w;
        n -= (size_t)w;
        off += (uint64_t)w;
    }
    return DCP_OK;
}

static int px_read_at(void *impl, void *file, const char *name, void *p,
                      size_t n, uint64_t off, struct dcp_err *err)
{
    const struct dcp__posix_sys *sys = sys_of(impl);
    uint8_t *b = p;
    int fd = to_fd(file);
    while (n > 0) {
        ssize_t r = sys->pread(fd, b, n, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return sys_err(err, "read", name);
        }
        if (r == 0)
            return dcp__err(err, DCP_ECORRUPT,
                            "'%s' is truncated: %zu bytes missing at byte "
                            "%llu",
                            name, n, (unsigned long long)off);
        b += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return DCP_OK;
}

static int px_sync(void *impl, void *file, const char *name,
                   struct dcp_err *err)
{
    /* Never retried, not even on EINTR: after a failed fsync the state of
     * the page cache is unknown (PostgreSQL's lesson), so the save fails. */
    if (sys_of(impl)->fsync(to_fd(file)) != 0)
        return sys_err(err, "fsync", name);
    return DCP_OK;
}

static int px_close(void *impl, void *file, const char *name,
                    struct dcp_err *err)
{
    /* On Linux the descriptor is gone even when close fails with EINTR:
     * never retry (it could close a descriptor another thread just got). */
    if (sys_of(impl)->close(to_fd(file)) != 0 && errno != EINTR)
        return sys_err(err, "close", name);
    return DCP_OK;
}

static int px_rename(void *impl, void *dir, const char *from, const char *to,
                     struct dcp_err *err)
{
    int fd = to_fd(dir);
    if (sys_of(impl)->renameat(fd, from, fd, to) != 0)
        return sys_err(err, "rename", from);
    return DCP_OK;
}

static int px_sync_dir(void *impl, void *dir, const char *path,
                       struct dcp_err *err)
{
    /* EINVAL: a file system that cannot sync directories (nothing to do). */
    if (sys_of(impl)->fsync(to_fd(dir)) != 0 && errno != EINVAL)
        return sys_err(err, "fsync directory", path);
    return DCP_OK;
}

static int px_unlink(void *impl, void *dir, const char *name,
                     struct dcp_err *err)
{
    if (sys_of(impl)->unlinkat(to_fd(dir), name, 0) != 0 && errno != ENOENT)
        return sys_err(err, "remove", name);
    return DCP_OK;
}

static int px_exists(void *impl, void *dir, const char *name, int *found,
                     struct dcp_err *err)
{
    struct stat sb;
    *found = 0;
    if (sys_of(impl)->fstatat(to_fd(dir), name, &sb, AT_SYMLINK_NOFOLLOW) ==
        0) {
        *found = 1;
        return DCP_OK;
    }
    if (errno == ENOENT)
        return DCP_OK;
    return sys_err(err, "stat", name);
}

/* ------------------------------------------------ version 2 members */

/* The temporary of put and publish: "<name>.tmp". */
static int px_tmp(char *buf, size_t cap, const char *name, struct dcp_err *err)
{
    size_t len = strlen(name);
    if (len + sizeof(".tmp") > cap)
        return dcp__err(err, DCP_EINVAL, "object name '%.64s...' is too long",
                        name);
    memcpy(buf, name, len);
    memcpy(buf + len, ".tmp", sizeof(".tmp"));
    return DCP_OK;
}

/* Writes tmp whole: create, write, fsync (unless nosync), close; removes
 * it on failure when the caller will not (it always does here). */
static int px_write_tmp(void *impl, void *dir, const char *tmp, const void *p,
                        size_t n, int nosync, struct dcp_err *err)
{
    void *h = NULL;
    int rc = px_create(impl, dir, tmp, &h, err);
    if (rc != DCP_OK)
        return rc;
    rc = px_write_at(impl, h, tmp, p, n, 0, err);
    if (rc == DCP_OK && !nosync)
        rc = px_sync(impl, h, tmp, err);
    if (rc == DCP_OK)
        return px_close(impl, h, tmp, err);
    (void)px_close(impl, h, tmp, NULL);
    return rc;
}

/*
 * publish: a temporary unique to the call ("<name>.<pid>-<n>-<random>.tmp",
 * dcp__unique_tmp) created, written, fsynced, closed; renamed over name
 * (exclusive: linked to name, which refuses an existing one, then
 * unlinked); the directory fsynced; on failure the temporary unlinked.
 * The non-exclusive sequence is the commit's system calls before version 2,
 * call for call, but for the temporary's name (tests/fault/strace_commit.py).
 */
static int px_publish(void *impl, void *dir, const char *path,
                      const char *name, const void *p, size_t n,
                      uint32_t flags, int *visible, struct dcp_err *err)
{
    const struct dcp__posix_sys *sys = sys_of(impl);
    int nosync = (flags & DCP_PUBLISH_NOSYNC) != 0, fd = to_fd(dir);
    char tmp[NAME_MAX + 48];
    int rc;
    *visible = 0;
    /* Contenders must not share the temporary (one would write into the
     * other's, and its unlink could pull it from under the other's link
     * or rename): a name unique to this process and call, for every
     * publish (the lock excludes writers, but not on every back end). */
    rc = dcp__unique_tmp(tmp, sizeof(tmp), name, err);
    if (rc != DCP_OK)
        return rc;
    rc = px_write_tmp(impl, dir, tmp, p, n, nosync, err);
    if (rc == DCP_OK && (flags & DCP_PUBLISH_EXCLUSIVE)) {
        int (*lk)(int, const char *, int, const char *, int) =
            sys->linkat ? sys->linkat : linkat;
        if (lk(fd, tmp, fd, name, 0) != 0) {
            int e = errno;
            if (e == EEXIST)
                rc = dcp__err(err, DCP_EEXIST, "'%s' already exists in '%s'",
                              name, path);
            else if (e == EPERM || e == EOPNOTSUPP || e == ENOSYS)
                rc = dcp__err(err, DCP_ENOTSUP,
                              "cannot publish '%s' exclusively in '%s': the "
                              "file system has no hard links (%s)",
                              name, path, strerror(e));
            else
                rc = sys_err(err, "link", name);
        } else {
            *visible = 1;
            /* Best effort: a second name of the published file. */
            (void)sys->unlinkat(fd, tmp, 0);
        }
    } else if (rc == DCP_OK) {
        rc = px_rename(impl, dir, tmp, name, err);
        if (rc == DCP_OK)
            *visible = 1;
    }
    if (rc == DCP_OK && !nosync)
        rc = px_sync_dir(impl, dir, path, err);
    if (rc != DCP_OK)
        (void)px_unlink(impl, dir, tmp, NULL);
    return rc;
}

/* put: publish without the directory sync (its name becomes durable with
 * the next publish in the directory). */
static int px_put(void *impl, void *dir, const char *name, const void *p,
                  size_t n, struct dcp_err *err)
{
    char tmp[NAME_MAX + 8];
    int rc = px_tmp(tmp, sizeof(tmp), name, err);
    if (rc == DCP_OK)
        rc = px_write_tmp(impl, dir, tmp, p, n, 0, err);
    if (rc == DCP_OK)
        rc = px_rename(impl, dir, tmp, name, err);
    if (rc != DCP_OK)
        (void)px_unlink(impl, dir, tmp, NULL);
    return rc;
}

static int px_write_complete(void *impl, void *file, const char *name,
                             uint32_t flags, struct dcp_err *err)
{
    int rc = DCP_OK;
    if (!(flags & DCP_WRITE_NOSYNC))
        rc = px_sync(impl, file, name, err);
    if (rc == DCP_OK)
        return px_close(impl, file, name, err);
    (void)px_close(impl, file, name, NULL);
    return rc;
}

static void px_write_abort(void *impl, void *dir, void *file,
                           const char *name)
{
    (void)px_close(impl, file, name, NULL);
    (void)px_unlink(impl, dir, name, NULL);
}

static int px_list(void *impl, void *dir, const char *prefix, size_t max,
                   dcp_storage_entry *out, size_t *count, struct dcp_err *err)
{
    const struct dcp__posix_sys *sys = sys_of(impl);
    size_t plen = strlen(prefix), k = 0;
    int dfd = to_fd(dir), rc = DCP_OK;
    /* readdir needs its own descriptor (closedir closes it), with its own
     * position: reopen the directory rather than dup it. */
    int fd = sys->openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    DIR *d;
    struct dirent *de;
    *count = 0;
    if (fd < 0)
        return sys_err(err, "list", prefix[0] ? prefix : ".");
    d = fdopendir(fd);
    if (!d) {
        rc = sys_err(err, "list", prefix[0] ? prefix : ".");
        (void)sys->close(fd);
        return rc;
    }
    for (;;) {
        struct stat sb;
        size_t len;
        errno = 0;
        de = readdir(d);
        if (!de) {
            if (errno != 0)
                rc = sys_err(err, "list", prefix[0] ? prefix : ".");
            break;
        }
        len = strlen(de->d_name);
        if (len > DCP_STORAGE_NAME_MAX || strncmp(de->d_name, prefix, plen) ||
            !strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (sys->fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT)
                continue; /* removed meanwhile */
            rc = sys_err(err, "stat", de->d_name);
            break;
        }
        if (!S_ISREG(sb.st_mode))
            continue;
        if (k == max) {
            rc = dcp__err(err, DCP_ELIMIT,
                          "more than %zu objects start with '%s'", max,
                          prefix);
            break;
        }
        memcpy(out[k].name, de->d_name, len + 1);
        out[k].size = (uint64_t)sb.st_size;
        k++;
    }
    (void)closedir(d);
    *count = k;
    return rc;
}

const struct dcp__storage dcp__posix_storage = {
    {
        DCP_STORAGE_OPS_VERSION,
        px_mkdirs,
        px_open_dir,
        px_close_dir,
        px_create,
        px_open_read,
        px_write_at,
        px_read_at,
        px_sync,
        px_close,
        px_rename,
        px_sync_dir,
        px_unlink,
        px_exists,
        1, /* max_inflight: O_DIRECT and io_uring serve its files */
        0,
        px_put,
        px_create, /* write_begin */
        px_write_complete,
        px_write_abort,
        px_list,
        px_publish,
    },
    NULL,
};

void *dcp__posix_handle(int fd)
{
    return to_handle(fd);
}

int dcp__posix_fd(void *h)
{
    return to_fd(h);
}

const dcp_storage_ops *dcp_storage_posix(void)
{
    return &dcp__posix_storage.ops;
}
