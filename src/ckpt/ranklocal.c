/*
 * Rank-local checkpoints: the per-rank metadata files found and merged into
 * one struct dcp_metadata (docs/FORMAT.md §9.2).
 */
#include "ranklocal.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hashtab.h"
#include "storage.h"

#define RL_LIST_MAX ((size_t)16384) /* names listed: about 4 MiB */

static void rank_file(char *out, size_t n, size_t r)
{
    (void)snprintf(out, n, "__%zu.metadata", r);
}

/* The rank of a name "__<digits>.metadata" (no sign, no leading zero
 * unless 0), else -1. */
long dcp__rl_name_rank(const char *s)
{
    long r = 0;
    const char *p = s + 2;
    if (strncmp(s, "__", 2) != 0 || !(*p >= '0' && *p <= '9'))
        return -1;
    if (*p == '0' && p[1] != '.')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) { /* saturating: any length */
        r = r * 10 + (*p - '0');
        if (r > RL_MAX_RANKS)
            r = RL_MAX_RANKS;
    }
    return strcmp(p, ".metadata") == 0 ? r : -1;
}

/*
 * Finds N: __0 .. __<N-1>.metadata exist, __N does not. Where the back end
 * lists, a rank file beyond the first missing one is a gap: DCP_EFORMAT.
 */
static int count_ranks(int dirfd, const char *path, size_t *n,
                       struct dcp_err *err)
{
    char name[64];
    dcp_storage_entry *ls;
    size_t r = 0, cnt = 0, cap, i;
    int rc;
    for (;;) {
        rank_file(name, sizeof(name), r);
        if (!dcp__fs_exists(dirfd, name))
            break;
        if (++r > RL_MAX_RANKS)
            return dcp__err(err, DCP_ELIMIT,
                            "'%s': more than %d rank-local metadata files",
                            path, RL_MAX_RANKS);
    }
    *n = r;
    /* Every rank writes a metadata file and at most a few data files;
     * past RL_LIST_MAX names the gap check is skipped (DCP_ELIMIT). */
    cap = 8 * r + 64 < RL_LIST_MAX ? 8 * r + 64 : RL_LIST_MAX;
    ls = dcp__malloc(cap * sizeof(*ls));
    if (!ls)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    rc = dcp__fs_list(dirfd, "__", cap, ls, &cnt, NULL);
    if (rc == DCP_OK) {
        for (i = 0; i < cnt; i++) {
            long k = dcp__rl_name_rank(ls[i].name);
            if (k >= 0 && (size_t)k >= r) {
                rank_file(name, sizeof(name), r);
                rc = dcp__err(err, DCP_EFORMAT,
                              "'%s': rank-local checkpoint without '%s' "
                              "(found '%s'): a rank's metadata is missing",
                              path, name, ls[i].name);
                dcp__free(ls);
                return rc;
            }
        }
    }
    /* DCP_ELIMIT, DCP_ENOTSUP: no listing, no gap check. */
    dcp__free(ls);
    return r ? DCP_OK : DCP_ENOENT;
}

int dcp__rl_find_any(int dirfd, uint32_t nprobe, char *name, size_t cap,
                     struct dcp_err *err)
{
    dcp_storage_entry *ls = dcp__malloc(RL_LIST_MAX * sizeof(*ls));
    char probe[64];
    size_t cnt = 0, i;
    int rc;
    if (cap)
        name[0] = '\0';
    if (!ls)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    rc = dcp__fs_list(dirfd, "__", RL_LIST_MAX, ls, &cnt, err);
    if (rc == DCP_OK) {
        for (i = 0; i < cnt; i++)
            if (dcp__rl_name_rank(ls[i].name) >= 0) {
                (void)snprintf(name, cap, "%s", ls[i].name);
                break;
            }
        dcp__free(ls);
        return DCP_OK;
    }
    dcp__free(ls);
    if (rc != DCP_ENOTSUP && rc != DCP_ELIMIT)
        return rc;
    dcp__err_clear(err);
    if (nprobe < 1024)
        nprobe = 1024;
    for (i = 0; i < nprobe; i++) {
        int found;
        rank_file(probe, sizeof(probe), i);
        rc = dcp__fs_exists_err(dirfd, probe, &found, err);
        if (rc != DCP_OK)
            return rc;
        if (found) {
            (void)snprintf(name, cap, "%s", probe);
            break;
        }
    }
    return DCP_OK;
}

/* One entry of one rank, for sorting by key then rank. */
struct ref {
    const struct md_entry *e;
    uint32_t rank;
};

/* One chunk of a merged tensor, for sorting and deduplication. */
struct cref {
    const struct md_chunk *c;
    uint32_t rank;
    int ndim;
};

static int cmp_ref(const void *pa, const void *pb)
{
    const struct ref *a = pa, *b = pb;
    int k = strcmp(a->e->key, b->e->key);
    return k ? k : (a->rank > b->rank) - (a->rank < b->rank);
}

static int cmp_cref(const void *pa, const void *pb)
{
    const struct cref *a = pa, *b = pb;
    int d;
    for (d = 0; d < a->ndim; d++)
        if (a->c->off[d] != b->c->off[d])
            return a->c->off[d] < b->c->off[d] ? -1 : 1;
    for (d = 0; d < a->ndim; d++)
        if (a->c->size[d] != b->c->size[d])
            return a->c->size[d] < b->c->size[d] ? -1 : 1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

static int same_box(const struct cref *a, const struct cref *b)
{
    size_t n = (size_t)a->ndim * sizeof(int64_t);
    return !n || (!memcmp(a->c->off, b->c->off, n) &&
                  !memcmp(a->c->size, b->c->size, n));
}

struct merge {
    struct dcp_metadata **rk; /* per rank */
    struct dcp_metadata *md;  /* the result */
    struct dcp_htab ftab;
    const char *path;
    struct dcp_err *err;
};

/* Copies chunk c of rank rank into *d (offsets, sizes, file re-indexed). */
static int copy_chunk(struct merge *m, struct md_chunk *d,
                      const struct md_chunk *c, uint32_t rank, int ndim)
{
    const char *fname = m->rk[rank]->files[c->file];
    size_t n = (size_t)(ndim ? ndim : 1);
    *d = *c;
    d->off = d->size = NULL;
    if (ndim || c->off) {
        d->off = dcp__calloc(2 * n, sizeof(int64_t));
        if (!d->off)
            return DCP_ENOMEM;
        d->size = d->off + n;
        if (ndim) {
            memcpy(d->off, c->off, (size_t)ndim * sizeof(int64_t));
            memcpy(d->size, c->size, (size_t)ndim * sizeof(int64_t));
        }
    }
    return dcp__meta_file_index(m->md, &m->ftab, fname, strlen(fname),
                                &d->file);
}

/* Merges the entries refs[0..n) (one key, ascending rank) into *d. */
static int merge_key(struct merge *m, struct md_entry *d,
                     const struct ref *refs, size_t n)
{
    const struct md_entry *e0 = refs[0].e;
    struct cref *cr;
    size_t i, j, nc = 0, kept = 0;
    int rc = DCP_OK;
    *d = *e0;
    d->chunks = NULL;
    d->nchunks = 0;
    d->path = NULL;
    d->npath = 0;
    d->key = dcp__strdup(e0->key);
    if (!d->key)
        return DCP_ENOMEM;
    if (e0->path) {
        d->path = dcp__calloc(e0->npath, sizeof(*d->path));
        if (!d->path)
            return DCP_ENOMEM;
        d->npath = e0->npath;
        for (i = 0; i < e0->npath; i++) {
            d->path[i].i = e0->path[i].i;
            if (e0->path[i].s && !(d->path[i].s = dcp__strdup(e0->path[i].s)))
                return DCP_ENOMEM;
        }
    }
    for (i = 1; i < n; i++) {
        const struct md_entry *e = refs[i].e;
        if (e->is_tensor != e0->is_tensor ||
            (e0->is_tensor &&
             (e->dtype != e0->dtype || e->ndim != e0->ndim ||
              memcmp(e->shape, e0->shape, (size_t)e0->ndim * sizeof(int64_t)) !=
                  0)))
            return dcp__err(m->err, DCP_EFORMAT,
                            "'%s': rank-local checkpoint: '%s' differs "
                            "between __%" PRIu32 ".metadata and __%" PRIu32
                            ".metadata (kind, dtype or global shape)",
                            m->path, e0->key, refs[0].rank, refs[i].rank);
    }
    if (!e0->is_tensor) { /* the lowest rank's value */
        d->chunks = dcp__calloc(1, sizeof(*d->chunks));
        if (!d->chunks)
            return DCP_ENOMEM;
        d->nchunks = 1;
        return copy_chunk(m, d->chunks, &e0->chunks[0], refs[0].rank, 0);
    }
    for (i = 0; i < n; i++)
        nc += refs[i].e->nchunks;
    cr = dcp__malloc((nc ? nc : 1) * sizeof(*cr));
    d->chunks = dcp__calloc(nc ? nc : 1, sizeof(*d->chunks));
    if (!cr || !d->chunks) {
        dcp__free(cr);
        return DCP_ENOMEM;
    }
    for (i = 0, nc = 0; i < n; i++)
        for (j = 0; j < refs[i].e->nchunks; j++) {
            cr[nc].c = &refs[i].e->chunks[j];
            cr[nc].rank = refs[i].rank;
            cr[nc++].ndim = e0->ndim;
        }
    qsort(cr, nc, sizeof(*cr), cmp_cref);
    for (i = 0; rc == DCP_OK && i < nc; i++) {
        if (kept && same_box(&cr[i], &cr[i - 1]))
            continue; /* a replicated chunk: the lowest rank's is kept */
        rc = copy_chunk(m, &d->chunks[kept], cr[i].c, cr[i].rank, e0->ndim);
        kept++; /* freed with the entry, even half made */
    }
    d->nchunks = kept;
    dcp__free(cr);
    return rc;
}

static int merge(struct merge *m, size_t nranks)
{
    struct ref *refs;
    size_t i, j, n = 0, k;
    int rc = DCP_OK;
    for (i = 0; i < nranks; i++)
        n += m->rk[i]->n;
    refs = dcp__malloc((n ? n : 1) * sizeof(*refs));
    m->md->e = dcp__calloc(n ? n : 1, sizeof(*m->md->e));
    if (!refs || !m->md->e) {
        dcp__free(refs);
        return DCP_ENOMEM;
    }
    for (i = 0, n = 0; i < nranks; i++)
        for (j = 0; j < m->rk[i]->n; j++) {
            refs[n].e = &m->rk[i]->e[j];
            refs[n++].rank = (uint32_t)i;
        }
    qsort(refs, n, sizeof(*refs), cmp_ref);
    for (i = 0; rc == DCP_OK && i < n; i = k) {
        for (k = i + 1; k < n && !strcmp(refs[k].e->key, refs[i].e->key); k++)
            ;
        rc = merge_key(m, &m->md->e[m->md->n++], refs + i, k - i);
    }
    dcp__free(refs);
    return rc;
}

int dcp__rl_metadata(int dirfd, const char *path, uint64_t max_bytes,
                     struct dcp_metadata **out, struct dcp_err *err)
{
    struct merge m;
    size_t n = 0, i;
    int rc;
    *out = NULL;
    rc = count_ranks(dirfd, path, &n, err);
    if (rc != DCP_OK)
        return rc;
    memset(&m, 0, sizeof(m));
    m.path = path;
    m.err = err;
    m.rk = dcp__calloc(n, sizeof(*m.rk));
    m.md = dcp__calloc(1, sizeof(*m.md));
    if (!m.rk || !m.md) {
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
        goto done;
    }
    for (i = 0; i < n; i++) {
        char name[64];
        uint8_t *p = NULL;
        size_t len = 0;
        rank_file(name, sizeof(name), i);
        rc = dcp__fs_read_all(dirfd, name, max_bytes, &p, &len, err);
        if (rc == DCP_OK)
            rc = dcp__meta_decode(p, len, &m.rk[i], err);
        dcp__free(p);
        if (rc != DCP_OK) {
            rc = dcp__err_prefix(err, "'%s/%s'", path, name);
            goto done;
        }
    }
    rc = merge(&m, n);
    if (rc == DCP_ENOMEM)
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK &&
        (!(m.md->version = dcp__strdup(m.rk[0]->version)) ||
         (m.rk[0]->checkpoint_id &&
          !(m.md->checkpoint_id = dcp__strdup(m.rk[0]->checkpoint_id))) ||
         (m.rk[0]->save_id &&
          !(m.md->save_id = dcp__strdup(m.rk[0]->save_id)))))
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = dcp__meta_sort(m.md, err);
    if (rc == DCP_OK)
        dcp__meta_index(m.md);
done:
    for (i = 0; m.rk && i < n; i++)
        dcp__meta_free(m.rk[i]);
    dcp__free(m.rk);
    dcp__htab_release(&m.ftab);
    if (rc != DCP_OK)
        dcp__meta_free(m.md);
    else
        *out = m.md;
    return rc;
}

int dcp__rl_metadata_bytes(int dirfd, const char *path, uint64_t max_bytes,
                           uint8_t **out, size_t *len, struct dcp_err *err)
{
    struct dcp_metadata *md = NULL;
    struct dcp_buf b = {0};
    int rc = dcp__rl_metadata(dirfd, path, max_bytes, &md, err);
    *out = NULL;
    *len = 0;
    if (rc != DCP_OK)
        return rc;
    rc = dcp__meta_encode(md, &b);
    dcp__meta_free(md);
    if (rc != DCP_OK) {
        dcp__buf_free(&b);
        return dcp__err(err, rc,
                        "'%s': encoding the merged rank-local "
                        "metadata",
                        path);
    }
    *out = b.p;
    *len = b.len;
    return DCP_OK;
}
