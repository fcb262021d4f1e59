/*
 * faultfs: see faultfs.h. Operations are counted and maybe failed or
 * crashed here, then forwarded to dcp_storage_posix() with a syscall table
 * whose members count and maybe fail the real system calls.
 */
#include "faultfs.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static struct faultfs *active;

static const char *const op_names[FF_NOPS] = {
    "mkdirs", "open_dir", "close_dir", "create",   "open_read", "write", "read",
    "sync",   "close",    "rename",    "sync_dir", "unlink",    "exists"};

const char *ff_op_name(enum ff_op op)
{
    return op < FF_NOPS ? op_names[op] : "?";
}

static int64_t now_ns(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void record(struct faultfs *f, enum ff_op op, const char *name,
                   uint64_t off, uint64_t len, int rc)
{
    struct ff_event *e;
    if (!f->tracing)
        return;
    if (f->ntrace == f->captrace) {
        size_t cap = f->captrace ? 2 * f->captrace : 256;
        struct ff_event *t = realloc(f->trace, cap * sizeof(*t));
        if (!t)
            abort();
        f->trace = t;
        f->captrace = cap;
    }
    e = &f->trace[f->ntrace++];
    e->op = op;
    (void)snprintf(e->name, sizeof(e->name), "%s", name ? name : "");
    e->off = off;
    e->len = len;
    e->rc = rc;
    e->t_ns = now_ns();
    e->worker = !pthread_equal(pthread_self(), f->owner);
}

/*
 * Before operation op: counts it, crashes or returns the injected error
 * (DCP_OK: go ahead).
 */
static int before(struct faultfs *f, enum ff_op op, const char *name,
                  struct dcp_err *err)
{
    unsigned mask = f->fail_mask ? f->fail_mask : ~0u;
    f->op_count[op]++;
    if (((f->hang_mask >> op) & 1) &&
        (!f->hang_name || (name && strstr(name, f->hang_name))) &&
        !(f->hang_skip && f->hang_skip--))
        for (;;)
            (void)sleep(1);
    if (!(mask & (1u << op)))
        return DCP_OK;
    f->nops++;
    if (f->crash_at && f->nops == f->crash_at)
        (void)kill(getpid(), SIGKILL);

    if (f->fail_at && (f->nops == f->fail_at ||
                       (f->fail_persistent && f->nops > f->fail_at))) {
        if (!f->injected++)
            f->first_op = (int)op;
        return dcp_storage_set_error(err, f->fail_code,
                                     "cannot %s '%s': injected fault",
                                     op_names[op], name ? name : "");
    }
    return DCP_OK;
}

/* -------------------------------------------------------- syscalls */

/* FFS_NONE: go ahead; else the fault to apply to this call. */
static enum ff_sys_fault sys_before(enum ff_sys s)
{
    struct faultfs *f = active;
    if (!f || f->sys_fault == FFS_NONE || !(f->sys_mask & (1u << s)))
        return FFS_NONE;
    f->nsys++;
    if (f->sys_at &&
        (f->nsys == f->sys_at || (f->sys_persistent && f->nsys > f->sys_at))) {
        if (!f->injected++)
            f->first_sys = (int)s;
        return f->sys_fault;
    }
    return FFS_NONE;
}

static int fail_errno(void)
{
    errno = active->sys_fault == FFS_EINTR ? EINTR : active->sys_errno;
    return -1;
}

static int h_open(const char *path, int flags)
{
    if (sys_before(FS_OPEN))
        return fail_errno();
    return dcp__posix_sys_default()->open(path, flags);
}

static int h_openat(int dirfd, const char *name, int flags, mode_t mode)
{
    if (sys_before(FS_OPENAT))
        return fail_errno();
    return dcp__posix_sys_default()->openat(dirfd, name, flags, mode);
}

static int h_mkdir(const char *path, mode_t mode)
{
    if (sys_before(FS_MKDIR))
        return fail_errno();
    return dcp__posix_sys_default()->mkdir(path, mode);
}

static int h_stat(const char *path, struct stat *sb)
{
    if (sys_before(FS_STAT))
        return fail_errno();
    return dcp__posix_sys_default()->stat(path, sb);
}

static int h_fstat(int fd, struct stat *sb)
{
    if (sys_before(FS_FSTAT))
        return fail_errno();
    return dcp__posix_sys_default()->fstat(fd, sb);
}

static int h_fstatat(int dirfd, const char *name, struct stat *sb, int flags)
{
    if (sys_before(FS_FSTATAT))
        return fail_errno();
    return dcp__posix_sys_default()->fstatat(dirfd, name, sb, flags);
}

static ssize_t h_pread(int fd, void *p, size_t n, off_t off)
{
    enum ff_sys_fault k = sys_before(FS_PREAD);
    if (k == FFS_SHORT && n > 1)
        n /= 2;
    else if (k != FFS_NONE && k != FFS_SHORT)
        return fail_errno();
    return dcp__posix_sys_default()->pread(fd, p, n, off);
}

static ssize_t h_pwrite(int fd, const void *p, size_t n, off_t off)
{
    enum ff_sys_fault k = sys_before(FS_PWRITE);
    if (k == FFS_SHORT && n > 1)
        n /= 2;
    else if (k != FFS_NONE && k != FFS_SHORT)
        return fail_errno();
    return dcp__posix_sys_default()->pwrite(fd, p, n, off);
}

static int h_fsync(int fd)
{
    struct faultfs *f = active;
    size_t i;
    if (f)
        for (i = 0; i < f->nfailed_sync; i++)
            if (f->failed_sync_fd[i] == fd)
                f->sync_retried = 1;
    if (sys_before(FS_FSYNC)) {
        if (f->nfailed_sync < DCP_ARRAY_LEN(f->failed_sync_fd))
            f->failed_sync_fd[f->nfailed_sync++] = fd;
        return fail_errno();
    }
    return dcp__posix_sys_default()->fsync(fd);
}

static int h_close(int fd)
{
    struct faultfs *f = active;
    size_t i;
    int rc;
    if (f)
        for (i = 0; i < f->nfailed_sync; i++)
            if (f->failed_sync_fd[i] == fd)
                f->failed_sync_fd[i] = -1; /* the number may be reused */
    /* A failing close still closes (Linux): close first, then report. */
    rc = dcp__posix_sys_default()->close(fd);
    if (sys_before(FS_CLOSE))
        return fail_errno();
    return rc;
}

static int h_renameat(int od, const char *from, int nd, const char *to)
{
    if (sys_before(FS_RENAMEAT))
        return fail_errno();
    return dcp__posix_sys_default()->renameat(od, from, nd, to);
}

static int h_unlinkat(int dirfd, const char *name, int flags)
{
    if (sys_before(FS_UNLINKAT))
        return fail_errno();
    return dcp__posix_sys_default()->unlinkat(dirfd, name, flags);
}

/* ------------------------------------------------------ operations */

#define POSIX dcp_storage_posix()

static int ff_mkdirs(void *impl, const char *path, struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_MKDIRS, path, err);
    if (rc == DCP_OK)
        rc = POSIX->mkdirs(&f->sys, path, err);
    record(f, FF_MKDIRS, path, 0, 0, rc);
    return rc;
}

static int ff_open_dir(void *impl, const char *path, void **dir,
                       struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_OPEN_DIR, path, err);
    if (rc == DCP_OK)
        rc = POSIX->open_dir(&f->sys, path, dir, err);
    record(f, FF_OPEN_DIR, path, 0, 0, rc);
    return rc;
}

static void ff_close_dir(void *impl, void *dir)
{
    struct faultfs *f = impl;
    (void)before(f, FF_CLOSE_DIR, NULL, NULL); /* cannot fail */
    POSIX->close_dir(&f->sys, dir);
    record(f, FF_CLOSE_DIR, "", 0, 0, 0);
}

static int ff_create(void *impl, void *dir, const char *name, void **file,
                     struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_CREATE, name, err);
    if (rc == DCP_OK)
        rc = POSIX->create(&f->sys, dir, name, file, err);
    record(f, FF_CREATE, name, 0, 0, rc);
    return rc;
}

static int ff_open_read(void *impl, void *dir, const char *name, void **file,
                        uint64_t *size, struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_OPEN_READ, name, err);
    if (rc == DCP_OK)
        rc = POSIX->open_read(&f->sys, dir, name, file, size, err);
    record(f, FF_OPEN_READ, name, 0, 0, rc);
    return rc;
}

static int ff_write_at(void *impl, void *file, const char *name, const void *p,
                       size_t n, uint64_t off, struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_WRITE, name, err);
    if (rc == DCP_OK)
        rc = POSIX->write_at(&f->sys, file, name, p, n, off, err);
    record(f, FF_WRITE, name, off, n, rc);
    return rc;
}

static int ff_read_at(void *impl, void *file, const char *name, void *p,
                      size_t n, uint64_t off, struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_READ, name, err);
    if (rc == DCP_OK)
        rc = POSIX->read_at(&f->sys, file, name, p, n, off, err);
    record(f, FF_READ, name, off, n, rc);
    return rc;
}

static int ff_sync(void *impl, void *file, const char *name,
                   struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_SYNC, name, err);
    if (rc == DCP_OK)
        rc = POSIX->sync(&f->sys, file, name, err);
    record(f, FF_SYNC, name, 0, 0, rc);
    return rc;
}

static int ff_close(void *impl, void *file, const char *name,
                    struct dcp_err *err)
{
    struct faultfs *f = impl;
    /* The handle goes away whatever happens: close it even when failing. */
    int rc = before(f, FF_CLOSE, name, err);
    int crc = POSIX->close(&f->sys, file, name, rc == DCP_OK ? err : NULL);
    if (rc == DCP_OK)
        rc = crc;
    record(f, FF_CLOSE, name, 0, 0, rc);
    return rc;
}

static int ff_rename(void *impl, void *dir, const char *from, const char *to,
                     struct dcp_err *err)
{
    struct faultfs *f = impl;
    char both[160];
    int rc = before(f, FF_RENAME, from, err);
    if (rc == DCP_OK)
        rc = POSIX->rename(&f->sys, dir, from, to, err);
    (void)snprintf(both, sizeof(both), "%s>%s", from, to);
    record(f, FF_RENAME, both, 0, 0, rc);
    return rc;
}

static int ff_sync_dir(void *impl, void *dir, const char *path,
                       struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_SYNC_DIR, path, err);
    if (rc == DCP_OK)
        rc = POSIX->sync_dir(&f->sys, dir, path, err);
    record(f, FF_SYNC_DIR, path, 0, 0, rc);
    return rc;
}

static int ff_unlink(void *impl, void *dir, const char *name,
                     struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_UNLINK, name, err);
    if (rc == DCP_OK)
        rc = POSIX->unlink(&f->sys, dir, name, err);
    record(f, FF_UNLINK, name, 0, 0, rc);
    return rc;
}

static int ff_exists(void *impl, void *dir, const char *name, int *found,
                     struct dcp_err *err)
{
    struct faultfs *f = impl;
    int rc = before(f, FF_EXISTS, name, err);
    if (rc == DCP_OK)
        rc = POSIX->exists(&f->sys, dir, name, found, err);
    record(f, FF_EXISTS, name, 0, 0, rc);
    return rc;
}

/* A version-1 table: dcp serves the version-2 members (publish, put,
 * multipart) through these, which is what the commit trace tests see. */
static const dcp_storage_ops ff_table = {.version = 1,
                                         .mkdirs = ff_mkdirs,
                                         .open_dir = ff_open_dir,
                                         .close_dir = ff_close_dir,
                                         .create = ff_create,
                                         .open_read = ff_open_read,
                                         .write_at = ff_write_at,
                                         .read_at = ff_read_at,
                                         .sync = ff_sync,
                                         .close = ff_close,
                                         .rename = ff_rename,
                                         .sync_dir = ff_sync_dir,
                                         .unlink = ff_unlink,
                                         .exists = ff_exists};

const dcp_storage_ops *ff_ops(void)
{
    return &ff_table;
}

void ff_init(struct faultfs *f)
{
    static const struct dcp__posix_sys hooks = {
        h_open,  h_openat, h_mkdir, h_stat,  h_fstat,    h_fstatat,
        h_pread, h_pwrite, h_fsync, h_close, h_renameat, h_unlinkat,
        NULL /* linkat: the real one */};
    memset(f, 0, sizeof(*f));
    f->sys = hooks;
    f->first_op = f->first_sys = -1;
    f->owner = pthread_self();
    active = f;
}

void ff_reset(struct faultfs *f)
{
    int tracing = f->tracing;
    struct ff_event *trace = f->trace;
    size_t cap = f->captrace;
    struct dcp__posix_sys sys = f->sys;
    pthread_t owner = f->owner;
    memset(f, 0, sizeof(*f));
    f->sys = sys;
    f->owner = owner;
    f->first_op = f->first_sys = -1;
    f->tracing = tracing;
    f->trace = trace;
    f->captrace = cap;
}

void ff_release(struct faultfs *f)
{
    free(f->trace);
    f->trace = NULL;
    f->ntrace = f->captrace = 0;
    if (active == f)
        active = NULL;
}
