/*
 * The tier-0 storage back end: one checkpoint path over a node's tier-0
 * directory (dcp_tier.h). A tier-0 step is saved and loaded under the
 * virtual path "<vroot>/step-N", the same string on every rank (dcp_save
 * and dcp_load check that); this back end maps it onto "<root>/step-N" of
 * this rank's own node root, and nothing else: every call (writes,
 * listings, renames, publishing, syncs, and the reads: open_read, exists)
 * acts on the own node's directory only, as on a cluster whose tier 0 is
 * node-local (a tmpfs). Each rank's data file lands in its node, rank 0's
 * lock, leftover cleaning and `.metadata` in rank 0's node; a load reads
 * the files its rank's node holds, which the restore (t0read.c) has made
 * complete for what the node's ranks read, copying the others over the
 * communicator first.
 * Paths outside the virtual root go straight to the POSIX back end (the
 * manager's removal, which the tier stack runs through the same context).
 * Every call is the POSIX back end's, on its own handles; the file handles
 * it hands out are POSIX ones. max_inflight is 8: the POSIX read_at and
 * write_at are pread/pwrite loops on the descriptor, safe from several
 * threads, and a back end other than the built-in one gets no io_uring
 * path (dcp__fs_raw_fd), so the I/O engine's pool runs tier-0 reads and
 * writes in parallel instead (tier 0 is page-cache speed: tmpfs).
 */
#include "t0fs.h"

#include <string.h>

static const dcp_storage_ops *px(void)
{
    return dcp_storage_posix();
}

/* A directory: the own node's POSIX handle (n is 1; the array form is
 * kept so that a directory spanning several roots stays possible). */
struct t0dir {
    size_t n;
    void *h[];
};

/* The part of path after "<vroot>/", or NULL when path is not virtual. */
static const char *rel_of(const struct dcp__t0fs *fs, const char *path)
{
    size_t n = strlen(fs->vroot);
    if (strncmp(path, fs->vroot, n) != 0 || path[n] != '/' || !path[n + 1])
        return NULL;
    return path + n + 1;
}

char *dcp__t0_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = dcp__malloc(la + lb + 2);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    s[la] = '/';
    memcpy(s + la + 1, b, lb + 1);
    return s;
}

static int t_mkdirs(void *impl, const char *path, struct dcp_err *err)
{
    struct dcp__t0fs *fs = impl;
    const char *rel = rel_of(fs, path);
    if (!rel)
        return px()->mkdirs(NULL, path, err);
    char *p = dcp__t0_join(fs->roots[0], rel);
    if (!p)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    int rc = px()->mkdirs(NULL, p, err);
    dcp__free(p);
    return rc;
}

static void t_close_dir(void *impl, void *dir)
{
    (void)impl;
    struct t0dir *d = dir;
    for (size_t i = 0; i < d->n; i++)
        if (d->h[i])
            px()->close_dir(NULL, d->h[i]);
    dcp__free(d);
}

static int t_open_dir(void *impl, const char *path, void **dir,
                      struct dcp_err *err)
{
    struct dcp__t0fs *fs = impl;
    const char *rel = rel_of(fs, path);
    size_t n = 1;
    struct t0dir *d = dcp__calloc(1, sizeof *d + n * sizeof(void *));
    if (!d)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    d->n = n;
    if (!rel) {
        int rc = px()->open_dir(NULL, path, &d->h[0], err);
        if (rc != DCP_OK) {
            dcp__free(d);
            return rc;
        }
        *dir = d;
        return DCP_OK;
    }
    size_t found = 0;
    for (size_t i = 0; i < n; i++) {
        char *p = dcp__t0_join(fs->roots[i], rel);
        if (!p) {
            t_close_dir(impl, d);
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        }
        struct dcp_err e2 = {0};
        int rc = px()->open_dir(NULL, p, &d->h[i], &e2);
        dcp__free(p);
        if (rc == DCP_OK)
            found++;
        else
            d->h[i] = NULL;
    }
    if (!found) {
        t_close_dir(impl, d);
        return dcp__err(err, DCP_ENOENT,
                        "checkpoint directory '%s' does not exist in this "
                        "node's tier-0 directory '%s'",
                        path, fs->roots[0]);
    }
    *dir = d;
    return DCP_OK;
}

/* The own node's handle, or DCP_ENOENT. */
static int own(void *dir, void **h, const char *name, struct dcp_err *err)
{
    struct t0dir *d = dir;
    *h = d->h[0];
    if (!*h)
        return dcp__err(err, DCP_ENOENT,
                        "cannot write '%s': this node's tier-0 directory "
                        "does not exist",
                        name);
    return DCP_OK;
}

static int t_create(void *impl, void *dir, const char *name, void **file,
                    struct dcp_err *err)
{
    (void)impl;
    void *h;
    DCP_RETURN_IF(own(dir, &h, name, err));
    return px()->create(NULL, h, name, file, err);
}

static int t_exists(void *impl, void *dir, const char *name, int *found,
                    struct dcp_err *err)
{
    (void)impl;
    struct t0dir *d = dir;
    *found = 0;
    for (size_t i = 0; i < d->n && !*found; i++) {
        if (!d->h[i])
            continue;
        DCP_RETURN_IF(px()->exists(NULL, d->h[i], name, found, err));
    }
    return DCP_OK;
}

static int t_open_read(void *impl, void *dir, const char *name, void **file,
                       uint64_t *size, struct dcp_err *err)
{
    (void)impl;
    struct t0dir *d = dir;
    void *first = NULL;
    for (size_t i = 0; i < d->n; i++) {
        if (!d->h[i])
            continue;
        if (!first)
            first = d->h[i];
        int found = 0;
        DCP_RETURN_IF(px()->exists(NULL, d->h[i], name, &found, err));
        if (found)
            return px()->open_read(NULL, d->h[i], name, file, size, err);
    }
    /* Nowhere: the POSIX back end's own message for a missing file. */
    return px()->open_read(NULL, first, name, file, size, err);
}

static int t_write_at(void *impl, void *file, const char *name, const void *p,
                      size_t n, uint64_t off, struct dcp_err *err)
{
    (void)impl;
    return px()->write_at(NULL, file, name, p, n, off, err);
}

static int t_read_at(void *impl, void *file, const char *name, void *p,
                     size_t n, uint64_t off, struct dcp_err *err)
{
    (void)impl;
    return px()->read_at(NULL, file, name, p, n, off, err);
}

static int t_sync(void *impl, void *file, const char *name, struct dcp_err *err)
{
    (void)impl;
    return px()->sync(NULL, file, name, err);
}

static int t_close(void *impl, void *file, const char *name,
                   struct dcp_err *err)
{
    (void)impl;
    return px()->close(NULL, file, name, err);
}

static int t_rename(void *impl, void *dir, const char *from, const char *to,
                    struct dcp_err *err)
{
    (void)impl;
    void *h;
    DCP_RETURN_IF(own(dir, &h, to, err));
    return px()->rename(NULL, h, from, to, err);
}

static int t_sync_dir(void *impl, void *dir, const char *path,
                      struct dcp_err *err)
{
    (void)impl;
    void *h;
    DCP_RETURN_IF(own(dir, &h, path, err));
    return px()->sync_dir(NULL, h, path, err);
}

static int t_unlink(void *impl, void *dir, const char *name,
                    struct dcp_err *err)
{
    (void)impl;
    void *h;
    DCP_RETURN_IF(own(dir, &h, name, err));
    return px()->unlink(NULL, h, name, err);
}

static int t_put(void *impl, void *dir, const char *name, const void *p,
                 size_t n, struct dcp_err *err)
{
    (void)impl;
    void *h;
    DCP_RETURN_IF(own(dir, &h, name, err));
    return px()->put(NULL, h, name, p, n, err);
}

static int t_write_begin(void *impl, void *dir, const char *name, void **file,
                         struct dcp_err *err)
{
    (void)impl;
    void *h;
    DCP_RETURN_IF(own(dir, &h, name, err));
    return px()->write_begin(NULL, h, name, file, err);
}

static int t_write_complete(void *impl, void *file, const char *name,
                            uint32_t flags, struct dcp_err *err)
{
    (void)impl;
    return px()->write_complete(NULL, file, name, flags, err);
}

static void t_write_abort(void *impl, void *dir, void *file, const char *name)
{
    (void)impl;
    struct t0dir *d = dir;
    px()->write_abort(NULL, d->h[0], file, name);
}

static int t_list(void *impl, void *dir, const char *prefix, size_t max,
                  dcp_storage_entry *out, size_t *count, struct dcp_err *err)
{
    (void)impl;
    void *h;
    DCP_RETURN_IF(own(dir, &h, prefix, err));
    return px()->list(NULL, h, prefix, max, out, count, err);
}

static int t_publish(void *impl, void *dir, const char *path, const char *name,
                     const void *p, size_t n, uint32_t flags, int *visible,
                     struct dcp_err *err)
{
    (void)impl;
    void *h;
    *visible = 0;
    DCP_RETURN_IF(own(dir, &h, name, err));
    return px()->publish(NULL, h, path, name, p, n, flags, visible, err);
}

const dcp_storage_ops dcp__t0fs_ops = {
    .version = DCP_STORAGE_OPS_VERSION,
    .max_inflight = 8,
    .mkdirs = t_mkdirs,
    .open_dir = t_open_dir,
    .close_dir = t_close_dir,
    .create = t_create,
    .open_read = t_open_read,
    .write_at = t_write_at,
    .read_at = t_read_at,
    .sync = t_sync,
    .close = t_close,
    .rename = t_rename,
    .sync_dir = t_sync_dir,
    .unlink = t_unlink,
    .exists = t_exists,
    .put = t_put,
    .write_begin = t_write_begin,
    .write_complete = t_write_complete,
    .write_abort = t_write_abort,
    .list = t_list,
    .publish = t_publish,
};
