/*
 * POSIX storage: openat-relative files, full-length pread/pwrite loops,
 * fsync, rename and directory fsync. Error messages name the file and the
 * system error.
 */
#include "storage.h"

#include <errno.h>
#include <fcntl.h> /* openat, O_NOFOLLOW, O_DIRECTORY */
#include <stdio.h> /* renameat */
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

int dcp__fs_mkdirs(const char *path, struct dcp_err *err)
{
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
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            rc = sys_err(err, "create directory", p);
        *s = c;
        if (c == '\0')
            break;
    }
    if (rc == DCP_OK && (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)))
        rc = dcp__err(err, DCP_EIO, "'%s' is not a directory", path);
    dcp__free(p);
    return rc;
}

int dcp__fs_open_dir(const char *path, int *dirfd, struct dcp_err *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return dcp__err(err, DCP_ENOENT,
                            "checkpoint directory '%s' does not exist", path);
        return sys_err(err, "open directory", path);
    }
    *dirfd = fd;
    return DCP_OK;
}

int dcp__fs_create(int dirfd, const char *name, int *fd, struct dcp_err *err)
{
    int f = openat(dirfd, name,
                   O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (f < 0)
        return sys_err(err, "create", name);
    *fd = f;
    return DCP_OK;
}

int dcp__fs_open_read(int dirfd, const char *name, int *fd, uint64_t *size,
                      struct dcp_err *err)
{
    struct stat sb;
    int f = openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (f < 0)
        return sys_err(err, "open", name);
    if (fstat(f, &sb) != 0) {
        int rc = sys_err(err, "stat", name);
        (void)close(f);
        return rc;
    }
    if (!S_ISREG(sb.st_mode)) {
        (void)close(f);
        return dcp__err(err, DCP_EUNSAFE, "'%s' is not a regular file", name);
    }
    *fd = f;
    *size = (uint64_t)sb.st_size;
    return DCP_OK;
}

int dcp__fs_pwrite(int fd, const void *p, size_t n, uint64_t off,
                   const char *name, struct dcp_err *err)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = pwrite(fd, b, n, (off_t)off);
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

int dcp__fs_pread(int fd, void *p, size_t n, uint64_t off, const char *name,
                  struct dcp_err *err)
{
    uint8_t *b = p;
    while (n > 0) {
        ssize_t r = pread(fd, b, n, (off_t)off);
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

int dcp__fs_fsync(int fd, const char *name, struct dcp_err *err)
{
    /* Never retried: after a failed fsync the page cache state is unknown
     * (PostgreSQL's lesson), so the save fails. */
    if (fsync(fd) != 0)
        return sys_err(err, "fsync", name);
    return DCP_OK;
}

int dcp__fs_close(int fd, const char *name, struct dcp_err *err)
{
    if (close(fd) != 0 && errno != EINTR)
        return sys_err(err, "close", name);
    return DCP_OK;
}

int dcp__fs_rename(int dirfd, const char *from, const char *to,
                   struct dcp_err *err)
{
    if (renameat(dirfd, from, dirfd, to) != 0)
        return sys_err(err, "rename", from);
    return DCP_OK;
}

int dcp__fs_fsync_dir(int dirfd, const char *path, struct dcp_err *err)
{
    if (fsync(dirfd) != 0 && errno != EINVAL)
        return sys_err(err, "fsync directory", path);
    return DCP_OK;
}

int dcp__fs_unlink(int dirfd, const char *name, struct dcp_err *err)
{
    if (unlinkat(dirfd, name, 0) != 0 && errno != ENOENT)
        return sys_err(err, "remove", name);
    return DCP_OK;
}

int dcp__fs_exists(int dirfd, const char *name)
{
    struct stat sb;
    return fstatat(dirfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0;
}

int dcp__fs_read_all(int dirfd, const char *name, uint64_t max, uint8_t **out,
                     size_t *len, struct dcp_err *err)
{
    uint64_t size;
    uint8_t *p;
    int fd, rc;
    *out = NULL;
    *len = 0;
    rc = dcp__fs_open_read(dirfd, name, &fd, &size, err);
    if (rc != DCP_OK)
        return rc;
    if (size > max || size > SIZE_MAX - 1) {
        (void)close(fd);
        return dcp__err(err, DCP_ELIMIT,
                        "'%s' is %llu bytes, over the limit of %llu", name,
                        (unsigned long long)size, (unsigned long long)max);
    }
    p = dcp__malloc((size_t)size + 1);
    if (!p) {
        (void)close(fd);
        return dcp__err(err, DCP_ENOMEM, "out of memory reading '%s'", name);
    }
    rc = dcp__fs_pread(fd, p, (size_t)size, 0, name, err);
    (void)close(fd);
    if (rc != DCP_OK) {
        dcp__free(p);
        return rc;
    }
    *out = p;
    *len = (size_t)size;
    return DCP_OK;
}
