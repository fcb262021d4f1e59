/*
 * .metadata: the model (struct dcp_metadata) shared by the encoder
 * (meta_encode.c) and the decoders (meta_decode.c, meta_fast.c): sorting,
 * lookup, the file table, freeing, the load-planning index and the
 * repr of planner_data paths.
 */
#include "meta.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct md_entry *)a)->key,
                  ((const struct md_entry *)b)->key);
}

int dcp__meta_sort(struct dcp_metadata *md, struct dcp_err *err)
{
    size_t i;
    if (md->n > 1)
        qsort(md->e, md->n, sizeof(*md->e), cmp_entry);
    for (i = 1; i < md->n; i++)
        if (strcmp(md->e[i - 1].key, md->e[i].key) == 0)
            return dcp__err(err, DCP_EPLAN, "duplicate key '%s'",
                            md->e[i].key);
    return DCP_OK;
}

/* Index of key in e[0..n), sorted by key (strcmp), or -1. */
static long find_key(const struct md_entry *e, size_t n, const char *key)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(e[mid].key, key);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

long dcp__meta_find(const struct dcp_metadata *md, const char *key)
{
    return find_key(md->e, md->n, key);
}

int dcp__safe_name(const char *name)
{
    const char *p;
    if (!name || !*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return 0;
    if (strlen(name) > 255)
        return 0;
    for (p = name; *p; p++)
        if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20)
            return 0;
    return 1;
}

/* Data file i's name, for the decoders' tables. */
static const void *file_name(const void *arr, uint32_t i, size_t *len)
{
    char *const *files = arr;
    *len = strlen(files[i]);
    return files[i];
}

/* Index of a data file name in md->files, added if new. A hash table: a
 * checkpoint has a file or more per rank, and every storage item names
 * one (8 Mi items x 4096 files for 4096 ranks x 2000 tensors). */
int dcp__meta_file_index(struct dcp_metadata *md, struct dcp_htab *t,
                         const char *name, size_t len, uint32_t *out)
{
    size_t h;
    char **nf;
    int rc = dcp__htab_reserve(t, md->nfiles + 1, file_name, md->files);
    if (rc != DCP_OK)
        return rc;
    h = dcp__htab_slot(t, name, len, file_name, md->files);
    if (t->slot[h]) {
        *out = t->slot[h] - 1;
        return DCP_OK;
    }
    if (md->nfiles >= UINT32_MAX - 1)
        return DCP_ELIMIT;
    nf = dcp__realloc(md->files, (md->nfiles + 1) * sizeof(*nf));
    if (!nf)
        return DCP_ENOMEM;
    md->files = nf;
    md->files[md->nfiles] = dcp__strndup(name, len);
    if (!md->files[md->nfiles])
        return DCP_ENOMEM;
    dcp__htab_set(t, h, (uint32_t)md->nfiles);
    *out = (uint32_t)md->nfiles++;
    return DCP_OK;
}

/* Finds the chunk of e whose offsets equal off, trying the hint first. */
void dcp__meta_entry_release(const struct dcp_metadata *md,
                             struct md_entry *e)
{
    size_t j;
    if (e->member) { /* ckpt/unflat.c's: owns its chunk */
        dcp__free(e->chunks ? e->chunks[0].off : NULL);
        dcp__free(e->chunks);
        for (j = 0; j < e->nmember; j++)
            dcp__free(e->member[j].s);
        dcp__free(e->member);
    } else {
        /* With a pool (md->ints), chunks' offsets and sizes live in it. */
        for (j = 0; !md->ints && e->chunks && j < e->nchunks; j++)
            dcp__free(e->chunks[j].off);
        if (!md->chunk_block)
            dcp__free(e->chunks);
    }
    dcp__free(e->bad);
    dcp__free(e->unsup);
    for (j = 0; j < e->npath; j++)
        dcp__free(e->path[j].s);
    dcp__free(e->path);
    dcp__free(e->key);
    dcp_value_free(e->pdata);
    memset(e, 0, sizeof(*e));
}

void dcp__meta_free(struct dcp_metadata *md)
{
    size_t i;
    if (!md)
        return;
    for (i = 0; i < md->n; i++)
        dcp__meta_entry_release(md, &md->e[i]);
    dcp__free(md->e);
    for (i = 0; i < md->nunsup; i++)
        dcp__meta_entry_release(md, &md->unsup[i]);
    dcp__free(md->unsup);
    for (i = 0; i < md->nfiles; i++)
        dcp__free(md->files[i]);
    dcp__free(md->files);
    dcp__free(md->version);
    dcp__free(md->checkpoint_id);
    dcp__free(md->save_id);
    dcp__free(md->ints);
    dcp__free(md->chunk_block);
    dcp__free(md->dir);
    dcp__free(md);
}

long dcp__meta_find_unsup(const struct dcp_metadata *md, const char *key)
{
    return md ? find_key(md->unsup, md->nunsup, key) : -1;
}

int dcp__meta_unsup_err(const struct dcp_metadata *md, const char *key,
                        struct dcp_err *err)
{
    long i = dcp__meta_find_unsup(md, key);
    if (i < 0)
        return DCP_OK;
    return dcp__err(err, DCP_ENOTSUP,
                    "key '%s': dtype torch.%s is not supported (the "
                    "checkpoint's other keys load)",
                    key, md->unsup[i].unsup);
}

/* ------------------------------------------------------- load planning */

void dcp__meta_index(struct dcp_metadata *md)
{
    size_t i, j;
    for (i = 0; i < md->n; i++) {
        struct md_entry *e = &md->e[i];
        e->sorted0 = e->is_tensor && e->ndim > 0;
        e->maxlen0 = 0;
        for (j = 0; e->sorted0 && j < e->nchunks; j++) {
            const struct md_chunk *c = &e->chunks[j];
            if (j && c->off[0] < e->chunks[j - 1].off[0])
                e->sorted0 = 0;
            if (c->size[0] > e->maxlen0)
                e->maxlen0 = c->size[0];
        }
    }
}

int dcp__path_repr(const struct md_pathel *p, size_t n, struct dcp_buf *out)
{
    size_t i;
    int rc = dcp__buf_put_u8(out, '(');
    for (i = 0; rc == DCP_OK && i < n; i++) {
        if (i)
            rc = dcp__buf_put(out, ", ", 2);
        if (rc != DCP_OK)
            break;
        rc = p[i].s ? dcp__buf_printf(out, "'%s'", p[i].s)
                    : dcp__buf_printf(out, "%" PRId64, p[i].i);
    }
    if (rc == DCP_OK && n == 1)
        rc = dcp__buf_put_u8(out, ',');
    return rc == DCP_OK ? dcp__buf_put_u8(out, ')') : rc;
}
