/* memstore (memstore.h): an in-memory, concurrent version-2 back end. */
#include "memstore.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A handle: a file being written (its bytes private until close) or read
 * (a copy of the object taken at open). */
struct ms_file {
    char name[DCP_STORAGE_NAME_MAX + 1];
    uint8_t *p;
    size_t len, cap;
    int writing;
};

static int find(struct memstore *m, const char *name)
{
    size_t i;
    for (i = 0; i < m->nobj; i++)
        if (!strcmp(m->obj[i].name, name))
            return (int)i;
    return -1;
}

const struct ms_object *ms_find(struct memstore *m, const char *name)
{
    int i = find(m, name);
    return i < 0 ? NULL : &m->obj[i];
}

/* Installs (p, len) as name, replacing; takes p. Under mu. */
static int install(struct memstore *m, const char *name, uint8_t *p,
                   size_t len, struct dcp_err *err)
{
    int i = find(m, name);
    if (i < 0) {
        if (m->nobj == MS_MAX_OBJECTS) {
            free(p);
            return dcp_storage_set_error(err, DCP_ENOSPC,
                                         "cannot store '%s': memstore full",
                                         name);
        }
        i = (int)m->nobj++;
        strcpy(m->obj[i].name, name);
    } else {
        free(m->obj[i].p);
    }
    m->obj[i].p = p;
    m->obj[i].len = len;
    return DCP_OK;
}

static void drop(struct memstore *m, int i)
{
    free(m->obj[i].p);
    m->obj[i] = m->obj[--m->nobj];
}

static uint8_t *dup_bytes(const void *p, size_t n)
{
    uint8_t *q = malloc(n ? n : 1);
    if (q && n)
        memcpy(q, p, n);
    return q;
}

/* Counts a request in flight for its duration. */
static void enter(struct memstore *m)
{
    int now = atomic_fetch_add(&m->inflight, 1) + 1;
    int seen = atomic_load(&m->max_seen);
    while (now > seen && !atomic_compare_exchange_weak(&m->max_seen, &seen, now))
        ;
    if (m->delay_us)
        (void)usleep(m->delay_us);
}

static void leave(struct memstore *m)
{
    atomic_fetch_sub(&m->inflight, 1);
}

static int ms_mkdirs(void *impl, const char *path, struct dcp_err *err)
{
    (void)impl;
    (void)path;
    (void)err;
    return DCP_OK;
}

static int ms_open_dir(void *impl, const char *path, void **dir,
                       struct dcp_err *err)
{
    (void)path;
    (void)err;
    *dir = impl;
    return DCP_OK;
}

static void ms_close_dir(void *impl, void *dir)
{
    (void)impl;
    (void)dir;
}

static int ms_create(void *impl, void *dir, const char *name, void **file,
                     struct dcp_err *err)
{
    struct memstore *m = impl;
    struct ms_file *f = calloc(1, sizeof(*f));
    (void)dir;
    if (!f || strlen(name) > DCP_STORAGE_NAME_MAX) {
        free(f);
        return dcp_storage_set_error(err, DCP_ENOMEM, "cannot create '%s'",
                                     name);
    }
    strcpy(f->name, name);
    f->writing = 1;
    (void)pthread_mutex_lock(&m->mu);
    m->open_handles++;
    (void)pthread_mutex_unlock(&m->mu);
    *file = f;
    return DCP_OK;
}

static int ms_open_read(void *impl, void *dir, const char *name, void **file,
                        uint64_t *size, struct dcp_err *err)
{
    struct memstore *m = impl;
    struct ms_file *f;
    int i;
    (void)dir;
    (void)pthread_mutex_lock(&m->mu);
    i = find(m, name);
    if (i < 0) {
        (void)pthread_mutex_unlock(&m->mu);
        return dcp_storage_set_error(err, DCP_ENOENT,
                                     "cannot open '%s': no such object", name);
    }
    f = calloc(1, sizeof(*f));
    if (f)
        f->p = dup_bytes(m->obj[i].p, m->obj[i].len);
    if (!f || !f->p) {
        (void)pthread_mutex_unlock(&m->mu);
        if (f)
            free(f);
        return dcp_storage_set_error(err, DCP_ENOMEM, "cannot open '%s'",
                                     name);
    }
    strcpy(f->name, name);
    f->len = f->cap = m->obj[i].len;
    m->open_handles++;
    (void)pthread_mutex_unlock(&m->mu);
    *size = f->len;
    *file = f;
    return DCP_OK;
}

static int ms_write_at(void *impl, void *file, const char *name, const void *p,
                       size_t n, uint64_t off, struct dcp_err *err)
{
    struct memstore *m = impl;
    struct ms_file *f = file;
    int rc = DCP_OK;
    int k;
    enter(m);
    k = atomic_fetch_add(&m->writes, 1) + 1;
    (void)pthread_mutex_lock(&m->mu);
    if (k == m->fail_write_at) {
        rc = dcp_storage_set_error(err, DCP_ENOSPC,
                                   "cannot write '%s' at byte %llu: injected",
                                   name, (unsigned long long)off);
    } else if (off > SIZE_MAX - n || off + n > ((size_t)1 << 32)) {
        rc = dcp_storage_set_error(err, DCP_ENOSPC, "cannot write '%s'", name);
    } else {
        if (off + n > f->cap) {
            size_t cap = f->cap ? f->cap : 4096;
            uint8_t *q;
            while (cap < off + n)
                cap *= 2;
            q = realloc(f->p, cap);
            if (!q) {
                rc = dcp_storage_set_error(err, DCP_ENOMEM,
                                           "cannot write '%s'", name);
            } else {
                memset(q + f->cap, 0, cap - f->cap);
                f->p = q;
                f->cap = cap;
            }
        }
        if (rc == DCP_OK) {
            memcpy(f->p + off, p, n);
            if (off + n > f->len)
                f->len = (size_t)(off + n);
        }
    }
    (void)pthread_mutex_unlock(&m->mu);
    leave(m);
    return rc;
}

static int ms_read_at(void *impl, void *file, const char *name, void *p,
                      size_t n, uint64_t off, struct dcp_err *err)
{
    struct memstore *m = impl;
    struct ms_file *f = file;
    int k;
    enter(m);
    k = atomic_fetch_add(&m->reads, 1) + 1;
    leave(m);
    if (k == m->fail_read_at)
        return dcp_storage_set_error(err, DCP_EIO,
                                     "cannot read '%s' at byte %llu: injected",
                                     name, (unsigned long long)off);
    /* The copy is the handle's own and never changes: no lock. */
    if (off > f->len || n > f->len - off)
        return dcp_storage_set_error(err, DCP_ECORRUPT,
                                     "'%s' is truncated at byte %llu", name,
                                     (unsigned long long)off);
    memcpy(p, f->p + off, n);
    return DCP_OK;
}

static int ms_sync(void *impl, void *file, const char *name,
                   struct dcp_err *err)
{
    (void)impl;
    (void)file;
    (void)name;
    (void)err;
    return DCP_OK;
}

static int ms_close(void *impl, void *file, const char *name,
                    struct dcp_err *err)
{
    struct memstore *m = impl;
    struct ms_file *f = file;
    int rc = DCP_OK;
    (void)name;
    (void)pthread_mutex_lock(&m->mu);
    m->open_handles--;
    if (f->writing) {
        uint8_t *p = f->p ? f->p : malloc(1);
        f->p = NULL;
        rc = p ? install(m, f->name, p, f->len, err)
               : dcp_storage_set_error(err, DCP_ENOMEM, "cannot close '%s'",
                                       f->name);
    }
    (void)pthread_mutex_unlock(&m->mu);
    free(f->p);
    free(f);
    return rc;
}

static int ms_rename(void *impl, void *dir, const char *from, const char *to,
                     struct dcp_err *err)
{
    struct memstore *m = impl;
    int i, rc = DCP_OK;
    (void)dir;
    (void)pthread_mutex_lock(&m->mu);
    m->renames++;
    i = find(m, from);
    if (i < 0) {
        rc = dcp_storage_set_error(err, DCP_ENOENT, "cannot rename '%s'", from);
    } else {
        uint8_t *p = m->obj[i].p;
        size_t len = m->obj[i].len;
        m->obj[i].p = NULL;
        drop(m, i);
        rc = install(m, to, p, len, err);
    }
    (void)pthread_mutex_unlock(&m->mu);
    return rc;
}

static int ms_sync_dir(void *impl, void *dir, const char *path,
                       struct dcp_err *err)
{
    (void)impl;
    (void)dir;
    (void)path;
    (void)err;
    return DCP_OK;
}

static int ms_unlink(void *impl, void *dir, const char *name,
                     struct dcp_err *err)
{
    struct memstore *m = impl;
    int i;
    (void)dir;
    (void)err;
    (void)pthread_mutex_lock(&m->mu);
    i = find(m, name);
    if (i >= 0)
        drop(m, i);
    (void)pthread_mutex_unlock(&m->mu);
    return DCP_OK;
}

static int ms_exists(void *impl, void *dir, const char *name, int *found,
                     struct dcp_err *err)
{
    struct memstore *m = impl;
    (void)dir;
    (void)err;
    (void)pthread_mutex_lock(&m->mu);
    *found = find(m, name) >= 0;
    (void)pthread_mutex_unlock(&m->mu);
    return DCP_OK;
}

static int ms_put(void *impl, void *dir, const char *name, const void *p,
                  size_t n, struct dcp_err *err)
{
    struct memstore *m = impl;
    uint8_t *q = dup_bytes(p, n);
    int rc;
    (void)dir;
    if (!q)
        return dcp_storage_set_error(err, DCP_ENOMEM, "cannot put '%s'", name);
    (void)pthread_mutex_lock(&m->mu);
    m->puts++;
    rc = install(m, name, q, n, err);
    (void)pthread_mutex_unlock(&m->mu);
    return rc;
}

static int ms_write_complete(void *impl, void *file, const char *name,
                             uint32_t flags, struct dcp_err *err)
{
    (void)flags;
    return ms_close(impl, file, name, err);
}

static void ms_write_abort(void *impl, void *dir, void *file, const char *name)
{
    struct memstore *m = impl;
    struct ms_file *f = file;
    (void)dir;
    (void)name;
    (void)pthread_mutex_lock(&m->mu);
    m->open_handles--;
    (void)pthread_mutex_unlock(&m->mu);
    free(f->p);
    free(f);
}

static int ms_list(void *impl, void *dir, const char *prefix, size_t max,
                   dcp_storage_entry *out, size_t *count, struct dcp_err *err)
{
    struct memstore *m = impl;
    size_t i, k = 0, plen = strlen(prefix);
    int rc = DCP_OK;
    (void)dir;
    (void)pthread_mutex_lock(&m->mu);
    for (i = 0; i < m->nobj; i++) {
        if (strncmp(m->obj[i].name, prefix, plen))
            continue;
        if (k == max) {
            rc = dcp_storage_set_error(err, DCP_ELIMIT,
                                       "more than %zu objects", max);
            break;
        }
        strcpy(out[k].name, m->obj[i].name);
        out[k].size = m->obj[i].len;
        k++;
    }
    (void)pthread_mutex_unlock(&m->mu);
    *count = k;
    return rc;
}

static int ms_publish(void *impl, void *dir, const char *path,
                      const char *name, const void *p, size_t n,
                      uint32_t flags, int *visible, struct dcp_err *err)
{
    struct memstore *m = impl;
    uint8_t *q;
    int rc;
    (void)dir;
    *visible = 0;
    (void)pthread_mutex_lock(&m->mu);
    if (m->fail_publish) {
        rc = dcp_storage_set_error(err, m->fail_publish,
                                   "cannot publish '%s' in '%s': injected",
                                   name, path);
    } else if ((flags & DCP_PUBLISH_EXCLUSIVE) && find(m, name) >= 0) {
        rc = dcp_storage_set_error(err, DCP_EEXIST, "'%s' already exists",
                                   name);
    } else if (!(q = dup_bytes(p, n))) {
        rc = dcp_storage_set_error(err, DCP_ENOMEM, "cannot publish '%s'",
                                   name);
    } else {
        m->publishes++;
        rc = install(m, name, q, n, err);
        *visible = rc == DCP_OK;
    }
    (void)pthread_mutex_unlock(&m->mu);
    return rc;
}

void ms_init(struct memstore *m, uint32_t max_inflight)
{
    memset(m, 0, sizeof(*m));
    (void)pthread_mutex_init(&m->mu, NULL);
    m->max_inflight = max_inflight;
    m->ops = (dcp_storage_ops){
        .version = DCP_STORAGE_OPS_VERSION,
        .mkdirs = ms_mkdirs,
        .open_dir = ms_open_dir,
        .close_dir = ms_close_dir,
        .create = ms_create,
        .open_read = ms_open_read,
        .write_at = ms_write_at,
        .read_at = ms_read_at,
        .sync = ms_sync,
        .close = ms_close,
        .rename = ms_rename,
        .sync_dir = ms_sync_dir,
        .unlink = ms_unlink,
        .exists = ms_exists,
        .max_inflight = max_inflight,
        .put = ms_put,
        .write_begin = ms_create,
        .write_complete = ms_write_complete,
        .write_abort = ms_write_abort,
        .list = ms_list,
        .publish = ms_publish,
    };
}

void ms_free(struct memstore *m)
{
    size_t i;
    for (i = 0; i < m->nobj; i++)
        free(m->obj[i].p);
    m->nobj = 0;
    (void)pthread_mutex_destroy(&m->mu);
}

const dcp_storage_ops *ms_ops(struct memstore *m)
{
    m->ops.max_inflight = m->max_inflight;
    return &m->ops;
}
