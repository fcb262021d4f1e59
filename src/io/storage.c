/*
 * Storage dispatch: int handles over the back ends' opaque ones, the
 * calling thread's current back end, and whole-file reads built on the
 * back end's members.
 *
 * The handle table is process-wide: slots live in chunks that are
 * allocated once and never move or go away, so a lookup needs no lock (a
 * handle is published to its user only after its slot is filled, and
 * whoever passes a handle to another thread synchronises with it).
 * Allocating and freeing slots takes a mutex; free slots are reused through
 * a free list.
 */
#include "storage.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h> /* offsetof */
#include <stdlib.h> /* qsort */
#include <string.h>

#define CHUNK_SLOTS 256
#define MAX_CHUNKS  4096 /* 1M handles open at once */

struct slot {
    const struct dcp__storage *s; /* NULL: free */
    void *h;                      /* the back end's handle */
    int is_dir;
    int next_free; /* free-list link (slot index), -1 at the end */
};

static _Atomic(struct slot *) chunks[MAX_CHUNKS];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int nslots; /* slots ever handed out (high-water mark) */
static int free_head = -1; /* under table_lock */
static size_t nopen;       /* under table_lock */

static _Thread_local const struct dcp__storage *current;

static struct slot *slot_at(int idx)
{
    struct slot *c =
        atomic_load_explicit(&chunks[idx / CHUNK_SLOTS], memory_order_acquire);
    return c ? &c[idx % CHUNK_SLOTS] : NULL;
}

/* The slot of an open handle, or NULL. */
static struct slot *lookup(int h, int is_dir)
{
    struct slot *sl;
    if (h < DCP__HANDLE_BASE || h - DCP__HANDLE_BASE >= atomic_load(&nslots))
        return NULL;
    sl = slot_at(h - DCP__HANDLE_BASE);
    return sl && sl->s && (is_dir < 0 || sl->is_dir == is_dir) ? sl : NULL;
}

/*
 * The slot of a handle, or for a plain descriptor (below DCP__HANDLE_BASE)
 * a slot filled in *tmp that serves it with the POSIX back end; NULL when
 * h is neither.
 */
static struct slot *lookup_any(int h, int is_dir, struct slot *tmp)
{
    if (h >= 0 && h < DCP__HANDLE_BASE) {
        tmp->s = &dcp__posix_storage;
        tmp->h = dcp__posix_handle(h);
        tmp->is_dir = is_dir;
        tmp->next_free = -1;
        return tmp;
    }
    return lookup(h, is_dir);
}

int dcp__fs_raw_fd(int fd)
{
    struct slot tmp, *sl = lookup_any(fd, -1, &tmp);
    if (!sl || sl->s->impl != NULL ||
        sl->s->ops.write_at != dcp__posix_storage.ops.write_at ||
        sl->s->ops.read_at != dcp__posix_storage.ops.read_at ||
        sl->s->ops.open_dir != dcp__posix_storage.ops.open_dir ||
        sl->s->ops.create != dcp__posix_storage.ops.create)
        return -1;
    return dcp__posix_fd(sl->h);
}

static int handle_new(const struct dcp__storage *s, void *h, int is_dir,
                      int *out)
{
    struct slot *sl = NULL;
    int idx = -1, rc = DCP_OK;
    (void)pthread_mutex_lock(&table_lock);
    if (free_head >= 0) {
        idx = free_head;
        sl = slot_at(idx);
        free_head = sl->next_free;
    } else if (atomic_load(&nslots) < MAX_CHUNKS * CHUNK_SLOTS) {
        idx = atomic_load(&nslots);
        sl = slot_at(idx);
        if (!sl) {
            struct slot *c = dcp__calloc(CHUNK_SLOTS, sizeof(*c));
            if (c)
                atomic_store_explicit(&chunks[idx / CHUNK_SLOTS], c,
                                      memory_order_release);
            sl = c;
        }
        if (sl)
            atomic_store(&nslots, idx + 1);
        else
            rc = DCP_ENOMEM;
    } else {
        rc = DCP_ELIMIT;
    }
    if (rc == DCP_OK) {
        sl->s = s;
        sl->h = h;
        sl->is_dir = is_dir;
        sl->next_free = -1;
        nopen++;
        *out = DCP__HANDLE_BASE + idx;
    }
    (void)pthread_mutex_unlock(&table_lock);
    return rc;
}

static void handle_free(struct slot *sl, int h)
{
    (void)pthread_mutex_lock(&table_lock);
    sl->s = NULL;
    sl->h = NULL;
    sl->next_free = free_head;
    free_head = h - DCP__HANDLE_BASE;
    nopen--;
    (void)pthread_mutex_unlock(&table_lock);
}

size_t dcp__fs_open_handles(void)
{
    size_t n;
    (void)pthread_mutex_lock(&table_lock);
    n = nopen;
    (void)pthread_mutex_unlock(&table_lock);
    return n;
}

/* A handle the back end opened, registered; on failure the back end's
 * handle is closed again. */
static int publish(const struct dcp__storage *s, void *h, int is_dir,
                   const char *name, int *out, struct dcp_err *err)
{
    int rc = handle_new(s, h, is_dir, out);
    if (rc == DCP_OK)
        return DCP_OK;
    if (is_dir)
        s->ops.close_dir(s->impl, h);
    else
        (void)s->ops.close(s->impl, h, name, NULL);
    return dcp__err(err, rc, "cannot open '%s': %s", name,
                    rc == DCP_ENOMEM ? "out of memory"
                                     : "too many open handles");
}

static int bad_handle(struct dcp_err *err, const char *name)
{
    /* A bug in dcp, never the input's fault. */
    return dcp__err(err, DCP_EINVAL, "'%s': invalid storage handle",
                    name ? name : "?");
}

/* ------------------------------------------------------- back ends */

int dcp__storage_init(struct dcp__storage *s, const dcp_storage_ops *ops,
                      void *impl)
{
    if (!ops) {
        *s = dcp__posix_storage;
        return DCP_OK;
    }
    if (ops->version < 1 || !ops->mkdirs || !ops->open_dir || !ops->close_dir ||
        !ops->create || !ops->open_read || !ops->write_at || !ops->read_at ||
        !ops->sync || !ops->close || !ops->rename || !ops->sync_dir ||
        !ops->unlink || !ops->exists)
        return DCP_EINVAL;
    /* Only the prefix of the version the caller compiled against exists in
     * its memory: a version-1 table ends at exists. Newer members stay
     * NULL (0) and are served from the version-1 ones. A version above
     * ours is read as our prefix. */
    if (ops->version >= 2 &&
        (ops->reserved0 != 0 ||
         /* Multipart comes as a whole or not at all. */
         (ops->write_begin != NULL) != (ops->write_complete != NULL) ||
         (ops->write_begin != NULL) != (ops->write_abort != NULL)))
        return DCP_EINVAL;
    memset(&s->ops, 0, sizeof(s->ops));
    if (ops->version == 1)
        memcpy(&s->ops, ops, offsetof(dcp_storage_ops, max_inflight));
    else
        s->ops = *ops;
    s->ops.version = DCP_STORAGE_OPS_VERSION;
    if (s->ops.max_inflight == 0)
        s->ops.max_inflight = 1;
    s->impl = impl;
    return DCP_OK;
}

void dcp__storage_use(const struct dcp__storage *s)
{
    current = s;
}

void dcp__storage_forget(const struct dcp__storage *s)
{
    if (current == s)
        current = NULL;
}

static const struct dcp__storage *cur(void)
{
    return current ? current : &dcp__posix_storage;
}

int dcp_storage_set_error(struct dcp_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    (void)dcp__verr(err, code, fmt, ap);
    va_end(ap);
    return code;
}

/* -------------------------------------------------------- operations */

/* The back end of a path: the one dispatch point of "s3://". */
static const struct dcp__storage *for_path(const char *path)
{
    return dcp__path_is_s3(path) ? &dcp__s3_storage : cur();
}

int dcp__fs_mkdirs(const char *path, struct dcp_err *err)
{
    const struct dcp__storage *s = for_path(path);
    return s->ops.mkdirs(s->impl, path, err);
}

int dcp__fs_open_dir(const char *path, int *dirfd, struct dcp_err *err)
{
    const struct dcp__storage *s = for_path(path);
    void *h = NULL;
    int rc = s->ops.open_dir(s->impl, path, &h, err);
    if (rc != DCP_OK)
        return rc;
    return publish(s, h, 1, path, dirfd, err);
}

int dcp__fs_create(int dirfd, const char *name, int *fd, struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    void *h = NULL;
    int rc;
    if (!d)
        return bad_handle(err, name);
    rc = d->s->ops.create(d->s->impl, d->h, name, &h, err);
    if (rc != DCP_OK)
        return rc;
    return publish(d->s, h, 0, name, fd, err);
}

int dcp__fs_open_read(int dirfd, const char *name, int *fd, uint64_t *size,
                      struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    void *h = NULL;
    int rc;
    if (!d)
        return bad_handle(err, name);
    rc = d->s->ops.open_read(d->s->impl, d->h, name, &h, size, err);
    if (rc != DCP_OK)
        return rc;
    return publish(d->s, h, 0, name, fd, err);
}

int dcp__fs_pwrite(int fd, const void *p, size_t n, uint64_t off,
                   const char *name, struct dcp_err *err)
{
    struct slot tmp, *f = lookup_any(fd, 0, &tmp);
    if (!f)
        return bad_handle(err, name);
    return f->s->ops.write_at(f->s->impl, f->h, name, p, n, off, err);
}

int dcp__fs_pread(int fd, void *p, size_t n, uint64_t off, const char *name,
                  struct dcp_err *err)
{
    struct slot tmp, *f = lookup_any(fd, 0, &tmp);
    if (!f)
        return bad_handle(err, name);
    return f->s->ops.read_at(f->s->impl, f->h, name, p, n, off, err);
}

int dcp__fs_fsync(int fd, const char *name, struct dcp_err *err)
{
    struct slot tmp, *f = lookup_any(fd, 0, &tmp);
    if (!f)
        return bad_handle(err, name);
    return f->s->ops.sync(f->s->impl, f->h, name, err);
}

int dcp__fs_close(int fd, const char *name, struct dcp_err *err)
{
    struct slot tmp, *f = lookup_any(fd, -1, &tmp);
    const struct dcp__storage *s;
    void *h;
    if (!f)
        return bad_handle(err, name);
    if (f == &tmp) /* a plain descriptor: close(2) */
        return tmp.s->ops.close(tmp.s->impl, tmp.h, name, err);
    s = f->s;
    h = f->h;
    if (f->is_dir) {
        handle_free(f, fd);
        s->ops.close_dir(s->impl, h);
        return DCP_OK;
    }
    handle_free(f, fd);
    return s->ops.close(s->impl, h, name, err);
}

void dcp__fs_release(int fd)
{
    if (fd >= 0)
        (void)dcp__fs_close(fd, "?", NULL);
}

int dcp__fs_rename(int dirfd, const char *from, const char *to,
                   struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    if (!d)
        return bad_handle(err, from);
    return d->s->ops.rename(d->s->impl, d->h, from, to, err);
}

int dcp__fs_fsync_dir(int dirfd, const char *path, struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    if (!d)
        return bad_handle(err, path);
    return d->s->ops.sync_dir(d->s->impl, d->h, path, err);
}

int dcp__fs_unlink(int dirfd, const char *name, struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    if (!d)
        return bad_handle(err, name);
    return d->s->ops.unlink(d->s->impl, d->h, name, err);
}

int dcp__fs_exists(int dirfd, const char *name)
{
    struct slot *d = lookup(dirfd, 1);
    int found = 1;
    if (!d)
        return 1;
    if (d->s->ops.exists(d->s->impl, d->h, name, &found, NULL) != DCP_OK)
        return 1; /* unsure: the caller must assume it is there */
    return found;
}

int dcp__fs_exists_err(int dirfd, const char *name, int *found,
                       struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    int rc;
    *found = 1;
    if (!d)
        return bad_handle(err, name);
    if (err)
        err->msg[0] = '\0';
    rc = d->s->ops.exists(d->s->impl, d->h, name, found, err);
    if (rc == DCP_OK)
        return DCP_OK;
    *found = 1;
    if (err && err->msg[0]) {
        (void)dcp__err_prefix(err, "cannot check whether '%s' exists", name);
        err->code = rc;
        return rc;
    }
    return dcp__err(err, rc, "cannot check whether '%s' exists: %s", name,
                    dcp_strerror(rc));
}

int dcp__fs_read_all(int dirfd, const char *name, uint64_t max, uint8_t **out,
                     size_t *len, struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    uint64_t size;
    uint8_t *p;
    int fd, rc;
    *out = NULL;
    *len = 0;
    if (d && d->s == &dcp__s3_storage) /* one request, not HEAD + GET */
        return dcp__s3_read_all(d->h, name, max, out, len, err);
    rc = dcp__fs_open_read(dirfd, name, &fd, &size, err);
    if (rc != DCP_OK)
        return rc;
    if (size > max || size > SIZE_MAX - 1) {
        dcp__fs_release(fd);
        return dcp__err(err, DCP_ELIMIT,
                        "'%s' is %llu bytes, over the limit of %llu", name,
                        (unsigned long long)size, (unsigned long long)max);
    }
    p = dcp__malloc((size_t)size + 1);
    if (!p) {
        dcp__fs_release(fd);
        return dcp__err(err, DCP_ENOMEM, "out of memory reading '%s'", name);
    }
    rc = dcp__fs_pread(fd, p, (size_t)size, 0, name, err);
    dcp__fs_release(fd);
    if (rc != DCP_OK) {
        dcp__free(p);
        return rc;
    }
    *out = p;
    *len = (size_t)size;
    return DCP_OK;
}

int dcp__fs_read_into(int dirfd, const char *name, void *buf, size_t cap,
                      size_t *len, struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    uint64_t size;
    int fd, rc;
    *len = 0;
    if (d && d->s == &dcp__s3_storage) { /* one request, not HEAD + GET */
        uint8_t *p = NULL;
        size_t n = 0;
        rc = dcp__s3_read_all(d->h, name, cap, &p, &n, err);
        if (rc == DCP_OK && n)
            memcpy(buf, p, n);
        if (rc == DCP_OK)
            *len = n;
        dcp__free(p);
        return rc;
    }
    rc = dcp__fs_open_read(dirfd, name, &fd, &size, err);
    if (rc != DCP_OK)
        return rc;
    if (size > cap) {
        dcp__fs_release(fd);
        return dcp__err(err, DCP_ELIMIT,
                        "'%s' is %llu bytes, over the limit of %zu", name,
                        (unsigned long long)size, cap);
    }
    rc = dcp__fs_pread(fd, buf, (size_t)size, 0, name, err);
    dcp__fs_release(fd);
    if (rc == DCP_OK)
        *len = (size_t)size;
    return rc;
}

/* ---------------------------------------------- version 2 of the contract */

uint32_t dcp__fs_max_inflight(int fd)
{
    struct slot *f = lookup(fd, -1); /* a file or a directory */
    if (!f || f->s->ops.max_inflight < 1)
        return 1;
    if (f->s == &dcp__s3_storage)
        return dcp__s3_max_inflight();
    return f->s->ops.max_inflight;
}

void dcp__fs_hint(int fd, uint64_t off, uint64_t len)
{
    struct slot *f = lookup(fd, 0);
    if (f && f->s == &dcp__s3_storage)
        dcp__s3_hint(f->h, off, len);
}

int dcp__fs_takes_hints(int fd)
{
    struct slot *f = lookup(fd, -1); /* a file or a directory */
    return f && f->s == &dcp__s3_storage;
}

void dcp__fs_hint_drop(int fd)
{
    struct slot *f = lookup(fd, 0);
    if (f && f->s == &dcp__s3_storage)
        dcp__s3_hint_drop(f->h);
}

/* The temporary of the version-1 adapters: unique (dcp__unique_tmp). */
static int tmp_name(char *buf, size_t cap, const char *name,
                    struct dcp_err *err)
{
    return dcp__unique_tmp(buf, cap, name, err);
}

/*
 * The version-1 sequence of publish and put: a temporary unique to the
 * call ("<name>.<pid>-<n>-<random>.tmp", dcp__unique_tmp) created,
 * written, synced (unless nosync), closed and renamed over name; for
 * publish (path not NULL) the directory synced (unless nosync); on any
 * failure the temporary removed, ignoring errors. These are exactly the
 * calls, in exactly the order, of dcp's commit before version 2
 * (tests/fault/test_commit_trace.c checks them).
 */
static int v1_publish(const struct slot *d, const char *path, const char *name,
                      const void *p, size_t n, int nosync, int *visible,
                      struct dcp_err *err)
{
    const struct dcp__storage *s = d->s;
    char tmp[DCP_STORAGE_NAME_MAX + 1];
    void *h = NULL;
    int rc = tmp_name(tmp, sizeof(tmp), name, err);
    if (rc != DCP_OK)
        return rc;
    rc = s->ops.create(s->impl, d->h, tmp, &h, err);
    if (rc == DCP_OK) {
        rc = s->ops.write_at(s->impl, h, tmp, p, n, 0, err);
        if (rc == DCP_OK && !nosync)
            rc = s->ops.sync(s->impl, h, tmp, err);
        if (rc == DCP_OK)
            rc = s->ops.close(s->impl, h, tmp, err);
        else
            (void)s->ops.close(s->impl, h, tmp, NULL);
    }
    if (rc == DCP_OK)
        rc = s->ops.rename(s->impl, d->h, tmp, name, err);
    if (rc == DCP_OK)
        *visible = 1;
    if (rc == DCP_OK && path && !nosync)
        rc = s->ops.sync_dir(s->impl, d->h, path, err);
    if (rc != DCP_OK)
        (void)s->ops.unlink(s->impl, d->h, tmp, NULL);
    return rc;
}

int dcp__fs_put(int dirfd, const char *name, const void *p, size_t n,
                struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    int visible = 0;
    if (!d)
        return bad_handle(err, name);
    if (d->s->ops.put)
        return d->s->ops.put(d->s->impl, d->h, name, p, n, err);
    return v1_publish(d, NULL, name, p, n, 0, &visible, err);
}

int dcp__fs_write_begin(int dirfd, const char *name, int *fd,
                        struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    void *h = NULL;
    int rc;
    if (!d)
        return bad_handle(err, name);
    if (d->s->ops.write_begin)
        rc = d->s->ops.write_begin(d->s->impl, d->h, name, &h, err);
    else
        rc = d->s->ops.create(d->s->impl, d->h, name, &h, err);
    if (rc != DCP_OK)
        return rc;
    rc = handle_new(d->s, h, 0, fd);
    if (rc == DCP_OK)
        return DCP_OK;
    if (d->s->ops.write_abort) {
        d->s->ops.write_abort(d->s->impl, d->h, h, name);
    } else {
        (void)d->s->ops.close(d->s->impl, h, name, NULL);
        (void)d->s->ops.unlink(d->s->impl, d->h, name, NULL);
    }
    return dcp__err(err, rc, "cannot open '%s': %s", name,
                    rc == DCP_ENOMEM ? "out of memory"
                                     : "too many open handles");
}

int dcp__fs_write_complete(int fd, const char *name, uint32_t flags,
                           struct dcp_err *err)
{
    struct slot *f = lookup(fd, 0);
    const struct dcp__storage *s;
    void *h;
    int rc = DCP_OK;
    if (!f)
        return bad_handle(err, name);
    s = f->s;
    h = f->h;
    handle_free(f, fd);
    if (s->ops.write_complete)
        return s->ops.write_complete(s->impl, h, name, flags, err);
    if (!(flags & DCP_WRITE_NOSYNC))
        rc = s->ops.sync(s->impl, h, name, err);
    if (rc == DCP_OK)
        return s->ops.close(s->impl, h, name, err);
    (void)s->ops.close(s->impl, h, name, NULL);
    return rc;
}

void dcp__fs_write_abort(int dirfd, int fd, const char *name)
{
    struct slot *d = lookup(dirfd, 1), *f = lookup(fd, 0);
    const struct dcp__storage *s;
    void *h;
    if (!f)
        return;
    s = f->s;
    h = f->h;
    handle_free(f, fd);
    if (!d || d->s != s) { /* cannot remove it: at least release it */
        (void)s->ops.close(s->impl, h, name, NULL);
        return;
    }
    if (s->ops.write_abort) {
        s->ops.write_abort(s->impl, d->h, h, name);
        return;
    }
    (void)s->ops.close(s->impl, h, name, NULL);
    (void)s->ops.unlink(s->impl, d->h, name, NULL);
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const dcp_storage_entry *)a)->name,
                  ((const dcp_storage_entry *)b)->name);
}

int dcp__fs_list(int dirfd, const char *prefix, size_t max,
                 dcp_storage_entry *out, size_t *count, struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    size_t i, k = 0, plen = strlen(prefix);
    int rc;
    *count = 0;
    if (!d)
        return bad_handle(err, prefix);
    if (!d->s->ops.list)
        return dcp__err(err, DCP_ENOTSUP,
                        "the storage back end cannot list objects "
                        "(no list member)");
    rc = d->s->ops.list(d->s->impl, d->h, prefix, max, out, &k, err);
    if (rc != DCP_OK && rc != DCP_ELIMIT)
        return rc;
    /* The back end is code we did not write: check what it returned. */
    if (k > max)
        return dcp__err(err, DCP_EIO,
                        "the storage back end listed %zu objects into room "
                        "for %zu",
                        k, max);
    for (i = 0; i < k; i++) {
        const char *nm = out[i].name;
        if (!memchr(nm, '\0', sizeof(out[i].name)) || !nm[0] ||
            strchr(nm, '/') || strncmp(nm, prefix, plen) != 0)
            return dcp__err(err, DCP_EIO,
                            "the storage back end listed a malformed name "
                            "for prefix '%s'",
                            prefix);
    }
    if (k > 1)
        qsort(out, k, sizeof(*out), cmp_entry);
    *count = k;
    if (rc == DCP_ELIMIT)
        return dcp__err(err, DCP_ELIMIT,
                        "more than %zu objects start with '%s'", max, prefix);
    return DCP_OK;
}

int dcp__fs_list_dirs(int dirfd, const char *prefix, size_t max,
                      dcp_storage_entry *out, size_t *count,
                      struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    size_t i, k = 0;
    int rc;
    *count = 0;
    if (!d)
        return bad_handle(err, prefix);
    if (d->s != &dcp__s3_storage)
        return dcp__err(err, DCP_ENOTSUP,
                        "the storage back end cannot list directories");
    rc = dcp__s3_list_dirs(d->h, prefix, max, out, &k, err);
    if (rc != DCP_OK)
        return rc;
    if (k > 1)
        qsort(out, k, sizeof(*out), cmp_entry);
    /* Each name once (a server may send a range out of order). */
    for (i = 1, *count = k ? 1 : 0; i < k; i++)
        if (strcmp(out[i].name, out[*count - 1].name) != 0)
            out[(*count)++] = out[i];
    return DCP_OK;
}

int dcp__fs_abort_uploads(int dirfd, int (*leftover)(const char *name),
                          uint64_t *n, struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    *n = 0;
    if (!d)
        return bad_handle(err, "directory");
    if (d->s != &dcp__s3_storage)
        return DCP_OK;
    return dcp__s3_abort_uploads(d->h, leftover, n, err);
}

int dcp__fs_publish(int dirfd, const char *path, const char *name,
                    const void *p, size_t n, uint32_t flags, int *visible,
                    struct dcp_err *err)
{
    struct slot *d = lookup(dirfd, 1);
    *visible = 0;
    if (!d)
        return bad_handle(err, name);
    if (d->s->ops.publish)
        return d->s->ops.publish(d->s->impl, d->h, path, name, p, n, flags,
                                 visible, err);
    if (flags & DCP_PUBLISH_EXCLUSIVE)
        return dcp__err(err, DCP_ENOTSUP,
                        "cannot publish '%s' exclusively: the storage back "
                        "end has no publish member (rename cannot refuse to "
                        "replace)",
                        name);
    return v1_publish(d, path, name, p, n, (flags & DCP_PUBLISH_NOSYNC) != 0,
                      visible, err);
}
