/*
 * memfs: a read-only storage back end (dcp_storage.h) over byte strings in
 * memory, for the fuzz targets that run the real load path without files.
 * The input is split into parts at each MEMFS_SEP: part 0 is .metadata,
 * and the k-th distinct other name opened gets part k (empty when there
 * is none), so one input describes a whole checkpoint. Every write
 * operation fails with DCP_EIO. Single-threaded.
 */
#ifndef DCP_MEMFS_H
#define DCP_MEMFS_H

#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <stdint.h>
#include <string.h>

#define MEMFS_SEP \
    "\xff\xfe"    \
    "DCPFILE"
#define MEMFS_SEP_LEN 9
#define MEMFS_MAX     16

struct memfs {
    const uint8_t *part[MEMFS_MAX];
    size_t len[MEMFS_MAX];
    size_t nparts;
    char names[MEMFS_MAX][64]; /* names[k]: the name that got part k */
    size_t nnames;
    uint8_t dir_token, file_token[MEMFS_MAX];
};

/* Splits data into parts (kept by pointer: data must outlive the use). */
static inline void memfs_init(struct memfs *m, const uint8_t *data, size_t size)
{
    size_t start = 0, i;
    memset(m, 0, sizeof(*m));
    for (i = 0; i + MEMFS_SEP_LEN <= size && m->nparts < MEMFS_MAX - 1; i++) {
        /* First byte by hand: a memcmp per byte would flood libFuzzer's
         * comparison tracing. */
        if (data[i] != 0xff || memcmp(data + i, MEMFS_SEP, MEMFS_SEP_LEN))
            continue;
        m->part[m->nparts] = data + start;
        m->len[m->nparts++] = i - start;
        start = i + MEMFS_SEP_LEN;
        i = start - 1;
    }
    m->part[m->nparts] = data + start;
    m->len[m->nparts++] = size - start;
    strcpy(m->names[0], ".metadata");
    m->nnames = 1;
}

static inline int memfs_find(struct memfs *m, const char *name, int add)
{
    size_t k;
    for (k = 0; k < m->nnames; k++)
        if (!strcmp(m->names[k], name))
            return (int)k;
    if (!add || m->nnames == MEMFS_MAX || strlen(name) >= 64)
        return -1;
    strcpy(m->names[m->nnames], name);
    return (int)m->nnames++;
}

static inline int memfs_ro(struct dcp_err *err)
{
    return dcp_storage_set_error(err, DCP_EIO, "memfs is read-only");
}

static inline int memfs_mkdirs(void *impl, const char *path,
                               struct dcp_err *err)
{
    (void)impl;
    (void)path;
    return memfs_ro(err);
}

static inline int memfs_open_dir(void *impl, const char *path, void **dir,
                                 struct dcp_err *err)
{
    struct memfs *m = impl;
    (void)path;
    (void)err;
    *dir = &m->dir_token;
    return DCP_OK;
}

static inline void memfs_close_dir(void *impl, void *dir)
{
    (void)impl;
    (void)dir;
}

static inline int memfs_create(void *impl, void *dir, const char *name,
                               void **file, struct dcp_err *err)
{
    (void)impl;
    (void)dir;
    (void)name;
    (void)file;
    return memfs_ro(err);
}

static inline int memfs_open_read(void *impl, void *dir, const char *name,
                                  void **file, uint64_t *size,
                                  struct dcp_err *err)
{
    struct memfs *m = impl;
    int k = memfs_find(m, name, 1);
    (void)dir;
    if (k < 0)
        return dcp_storage_set_error(err, DCP_ENOENT, "cannot open '%s'", name);
    *file = &m->file_token[k];
    *size = (size_t)k < m->nparts ? m->len[k] : 0;
    return DCP_OK;
}

static inline int memfs_write_at(void *impl, void *file, const char *name,
                                 const void *p, size_t n, uint64_t off,
                                 struct dcp_err *err)
{
    (void)impl;
    (void)file;
    (void)name;
    (void)p;
    (void)n;
    (void)off;
    return memfs_ro(err);
}

static inline int memfs_read_at(void *impl, void *file, const char *name,
                                void *p, size_t n, uint64_t off,
                                struct dcp_err *err)
{
    struct memfs *m = impl;
    size_t k = (size_t)((uint8_t *)file - m->file_token);
    size_t len = k < m->nparts ? m->len[k] : 0;
    if (off > len || n > len - off)
        return dcp_storage_set_error(err, DCP_ECORRUPT,
                                     "'%s' is truncated at byte %llu", name,
                                     (unsigned long long)off);
    if (n)
        memcpy(p, m->part[k] + off, n);
    return DCP_OK;
}

static inline int memfs_sync(void *impl, void *file, const char *name,
                             struct dcp_err *err)
{
    (void)impl;
    (void)file;
    (void)name;
    return memfs_ro(err);
}

static inline int memfs_close(void *impl, void *file, const char *name,
                              struct dcp_err *err)
{
    (void)impl;
    (void)file;
    (void)name;
    (void)err;
    return DCP_OK;
}

static inline int memfs_rename(void *impl, void *dir, const char *from,
                               const char *to, struct dcp_err *err)
{
    (void)impl;
    (void)dir;
    (void)from;
    (void)to;
    return memfs_ro(err);
}

static inline int memfs_sync_dir(void *impl, void *dir, const char *path,
                                 struct dcp_err *err)
{
    (void)impl;
    (void)dir;
    (void)path;
    return memfs_ro(err);
}

static inline int memfs_unlink(void *impl, void *dir, const char *name,
                               struct dcp_err *err)
{
    (void)impl;
    (void)dir;
    (void)name;
    return memfs_ro(err);
}

static inline int memfs_exists(void *impl, void *dir, const char *name,
                               int *found, struct dcp_err *err)
{
    (void)dir;
    (void)err;
    *found = memfs_find(impl, name, 0) >= 0;
    return DCP_OK;
}

static inline const dcp_storage_ops *memfs_ops(void)
{
    static const dcp_storage_ops ops = {
        .version = 1,
        .mkdirs = memfs_mkdirs,
        .open_dir = memfs_open_dir,
        .close_dir = memfs_close_dir,
        .create = memfs_create,
        .open_read = memfs_open_read,
        .write_at = memfs_write_at,
        .read_at = memfs_read_at,
        .sync = memfs_sync,
        .close = memfs_close,
        .rename = memfs_rename,
        .sync_dir = memfs_sync_dir,
        .unlink = memfs_unlink,
        .exists = memfs_exists,
    };
    return &ops;
}

#endif /* DCP_MEMFS_H */
