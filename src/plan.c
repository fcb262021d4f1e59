/*
 * Save planning (see plan.h).
 *
 * Local plan: each rank encodes what it holds with varints: per state entry
 * its kind, key, nesting path, dtype, global shape and boxes (tensors) or
 * pickled size and a 64-bit FNV-1a hash of the pickle (values). No data.
 *
 * Global plan, on the coordinator, in O(n log n) for n boxes over all
 * ranks: keys are interned in a hash table while the blobs are parsed
 * (checking that ranks agree on each key), boxes are bucketed by key
 * (counting sort), sorted by offsets within each key, and equal offsets
 * form one chunk: replicated boxes become one record with several possible
 * writers; empty boxes beside a non-empty one vanish; equal offsets with
 * different sizes are an overlap. Each tensor's chunks must then tile it
 * (dcp__meta_check_tiling). Writers: a record with one holder is written
 * by it; replicated records go, largest first, to the holder with the
 * fewest bytes so far (ties: lowest rank), so they spread over the ranks.
 */
#include "plan.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "value.h"

#define BLOB_VERSION 1
#define F_TENSOR     1

/* ------------------------------------------------------------ varints */

static int put_uv(struct dcp_buf *b, uint64_t v)
{
    uint8_t t[10];
    size_t n = 0;
    while (v >= 0x80) {
        t[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    t[n++] = (uint8_t)v;
    return dcp__buf_put(b, t, n);
}

struct rd {
    const uint8_t *p;
    const uint8_t *end;
    int bad;
};

static uint64_t get_uv(struct rd *r)
{
    uint64_t v = 0;
    int sh = 0;
    while (r->p < r->end && sh < 64) {
        uint8_t c = *r->p++;
        v |= (uint64_t)(c & 0x7f) << sh;
        if (!(c & 0x80))
            return v;
        sh += 7;
    }
    r->bad = 1;
    return 0;
}

static const uint8_t *get_bytes(struct rd *r, uint64_t n)
{
    const uint8_t *p = r->p;
    if (r->bad || n > (uint64_t)(r->end - r->p)) {
        r->bad = 1;
        return NULL;
    }
    r->p += n;
    return p;
}

static uint8_t get_u8(struct rd *r)
{
    const uint8_t *p = get_bytes(r, 1);
    return p ? *p : 0;
}

static uint64_t fnv64(const void *p, size_t n)
{
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ULL;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= b[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* ------------------------------------------------------ per-rank keys */

int dcp_state_push_rank(dcp_state *st, int rank)
{
    char name[24];
    if (!st || rank < 0)
        return DCP_EINVAL;
    (void)snprintf(name, sizeof(name), "rank%d", rank);
    return dcp_state_push(st, name);
}

/* --------------------------------------------------------- local plan */

/* Path components: a str as (length << 1), an int as 1 then its value. The
 * strings themselves are substrings of the key. */
static int enc_path(struct dcp_buf *b, const struct st_entry *se)
{
    size_t i;
    int rc = put_uv(b, se->npath);
    for (i = 0; rc == DCP_OK && i < se->npath; i++) {
        if (se->path[i].s) {
            rc = put_uv(b, (uint64_t)strlen(se->path[i].s) << 1);
        } else {
            rc = put_uv(b, 1);
            if (rc == DCP_OK)
                rc = put_uv(b, (uint64_t)se->path[i].i);
        }
    }
    return rc;
}

static int enc_entry(struct pl_local *lp, size_t i, const struct st_entry *se,
                     struct dcp_buf *path, struct dcp_err *err)
{
    struct dcp_buf *b = &lp->blob;
    size_t klen = strlen(se->key), j;
    int rc, d;
    path->len = 0;
    rc = enc_path(path, se);
    if (rc == DCP_OK)
        rc = dcp__buf_put_u8(b, se->is_tensor ? F_TENSOR : 0);
    if (rc == DCP_OK)
        rc = put_uv(b, klen);
    if (rc == DCP_OK)
        rc = dcp__buf_put(b, se->key, klen + 1);
    if (rc == DCP_OK)
        rc = put_uv(b, path->len);
    if (rc == DCP_OK)
        rc = dcp__buf_put(b, path->p, path->len);
    if (rc != DCP_OK)
        return dcp__err(err, DCP_ENOMEM, "out of memory planning the save");
    if (!se->is_tensor) {
        struct dcp_buf *pk = &lp->pickles[i];
        rc = dcp__value_pickle(se->value, pk);
        if (rc != DCP_OK)
            return dcp__err(err, rc, "cannot encode value '%s'", se->key);
        rc = put_uv(b, pk->len);
        if (rc == DCP_OK)
            rc = dcp__buf_put_le64(b, fnv64(pk->p, pk->len));
        return rc == DCP_OK ? DCP_OK
                            : dcp__err(err, rc,
                                       "out of memory planning "
                                       "the save");
    }
    rc = dcp__buf_put_u8(b, (uint8_t)se->dtype);
    if (rc == DCP_OK)
        rc = dcp__buf_put_u8(b, (uint8_t)se->ndim);
    for (d = 0; rc == DCP_OK && d < se->ndim; d++)
        rc = put_uv(b, (uint64_t)se->shape[d]);
    if (rc == DCP_OK)
        rc = put_uv(b, se->nboxes);
    for (j = 0; rc == DCP_OK && j < se->nboxes; j++) {
        for (d = 0; rc == DCP_OK && d < se->ndim; d++)
            rc = put_uv(b, (uint64_t)se->boxes[j].off[d]);
        for (d = 0; rc == DCP_OK && d < se->ndim; d++)
            rc = put_uv(b, (uint64_t)se->boxes[j].size[d]);
    }
    return rc == DCP_OK ? DCP_OK
                        : dcp__err(err, rc, "out of memory planning the save");
}

int dcp__plan_local(const dcp_state *st, struct pl_local *lp,
                    struct dcp_err *err)
{
    struct dcp_buf path = {0};
    size_t i;
    int rc = DCP_OK;
    memset(lp, 0, sizeof(*lp));
    lp->pickles = dcp__calloc(st->n ? st->n : 1, sizeof(*lp->pickles));
    if (!lp->pickles)
        return dcp__err(err, DCP_ENOMEM, "out of memory planning the save");
    lp->n = st->n;
    rc = dcp__buf_put_u8(&lp->blob, BLOB_VERSION);
    if (rc == DCP_OK)
        rc = put_uv(&lp->blob, st->n);
    if (rc != DCP_OK)
        rc = dcp__err(err, rc, "out of memory planning the save");
    for (i = 0; rc == DCP_OK && i < st->n; i++)
        rc = enc_entry(lp, i, &st->e[i], &path, err);
    dcp__buf_free(&path);
    if (rc != DCP_OK)
        dcp__plan_local_release(lp);
    return rc;
}

void dcp__plan_local_release(struct pl_local *lp)
{
    size_t i;
    for (i = 0; lp->pickles && i < lp->n; i++)
        dcp__buf_free(&lp->pickles[i]);
    dcp__free(lp->pickles);
    dcp__buf_free(&lp->blob);
    memset(lp, 0, sizeof(*lp));
}

/* -------------------------------------------------- coordinator: parse */

/* A key as the coordinator sees it while parsing (pointers into blobs). */
struct gkey {
    const char *key;
    const uint8_t *path;
    size_t pathlen;
    int64_t shape[DCP_MAX_NDIM];
    uint64_t vsize;
    uint64_t vhash;
    uint32_t ncand;
    int first_rank;
    int last_rank;
    int nholders;
    int is_tensor;
    int ndim;
    dcp_dtype dtype;
};

/* One box (or value) of one rank. */
struct cand {
    uint64_t ioff; /* tensors: offsets then sizes in the int pool */
    uint32_t g;
    uint32_t rank;
    uint32_t lent;
    uint32_t lbox;
};

struct gp {
    struct gkey *keys;
    size_t nkeys, capkeys;
    uint32_t *tab; /* key index + 1; 0 = empty */
    size_t tabcap;
    struct cand *cands;
    size_t ncands, capcands;
    int64_t *pool;
    size_t npool, cappool;
    uint32_t *hint; /* key of entry i on the previous rank: likely the same */
    size_t nhint, caphint;
    int nranks;
    struct dcp_err *err;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    size_t nc;
    void *np;
    if (need <= *cap)
        return DCP_OK;
    nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem)
            return DCP_ENOMEM;
        nc *= 2;
    }
    if (nc * elem < ((size_t)4 << 20)) {
        np = dcp__realloc(*p, nc * elem);
        if (!np)
            return DCP_ENOMEM;
    } else {
        /* Not realloc: the copy would be touched before the advice and
         * stay on small pages. */
        np = dcp__malloc(nc * elem);
        if (!np)
            return DCP_ENOMEM;
        dcp__advise_huge(np, nc * elem);
        if (*p)
            memcpy(np, *p, *cap * elem);
        dcp__free(*p);
    }
    *p = np;
    *cap = nc;
    return DCP_OK;
}

static uint64_t hash_key(const char *s)
{
    return fnv64(s, strlen(s));
}

static int tab_rebuild(struct gp *p, size_t cap)
{
    uint32_t *t = dcp__calloc(cap, sizeof(*t));
    size_t i;
    if (!t)
        return DCP_ENOMEM;
    for (i = 0; i < p->nkeys; i++) {
        size_t h = (size_t)hash_key(p->keys[i].key) & (cap - 1);
        while (t[h])
            h = (h + 1) & (cap - 1);
        t[h] = (uint32_t)(i + 1);
    }
    dcp__free(p->tab);
    p->tab = t;
    p->tabcap = cap;
    return DCP_OK;
}

/* Finds key, or adds a zeroed gkey for it (*added = 1). */
static int key_lookup(struct gp *p, const char *key, uint32_t *gi, int *added)
{
    size_t h;
    int rc;
    *added = 0;
    if ((p->nkeys + 1) * 2 > p->tabcap) {
        rc = tab_rebuild(p, p->tabcap ? p->tabcap * 2 : 1024);
        if (rc != DCP_OK)
            return rc;
    }
    h = (size_t)hash_key(key) & (p->tabcap - 1);
    while (p->tab[h]) {
        if (strcmp(p->keys[p->tab[h] - 1].key, key) == 0) {
            *gi = p->tab[h] - 1;
            return DCP_OK;
        }
        h = (h + 1) & (p->tabcap - 1);
    }
    if (p->nkeys >= UINT32_MAX - 1)
        return DCP_ELIMIT;
    rc = grow((void **)&p->keys, &p->capkeys, p->nkeys + 1, sizeof(*p->keys));
    if (rc != DCP_OK)
        return rc;
    memset(&p->keys[p->nkeys], 0, sizeof(*p->keys));
    p->keys[p->nkeys].key = key;
    p->keys[p->nkeys].last_rank = -1;
    p->tab[h] = (uint32_t)(p->nkeys + 1);
    *gi = (uint32_t)p->nkeys++;
    *added = 1;
    return DCP_OK;
}

static void shape_str(char *out, size_t cap, int ndim, const int64_t *s)
{
    size_t n = 0;
    int d;
    out[0] = '\0';
    n += (size_t)snprintf(out, cap, "[");
    for (d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(out + n, cap - n, d ? ", %" PRId64 : "%" PRId64,
                              s[d]);
    if (n < cap)
        (void)snprintf(out + n, cap - n, "]");
}

/* Checks a later rank's view of a key against the first rank's. */
static int key_agree(struct gp *p, const struct gkey *k, const struct gkey *n,
                     int r)
{
    char a[200], b[200];
    if (k->is_tensor != n->is_tensor)
        return dcp__err(p->err, DCP_EPLAN,
                        "'%s': rank %d saves a %s, rank %d a %s", k->key,
                        k->first_rank, k->is_tensor ? "tensor" : "value", r,
                        n->is_tensor ? "tensor" : "value");
    if (k->is_tensor && k->dtype != n->dtype)
        return dcp__err(p->err, DCP_EPLAN,
                        "'%s': ranks %d and %d disagree on the dtype (%s vs "
                        "%s)",
                        k->key, k->first_rank, r, dcp_dtype_name(k->dtype),
                        dcp_dtype_name(n->dtype));
    if (k->is_tensor &&
        (k->ndim != n->ndim ||
         memcmp(k->shape, n->shape, (size_t)k->ndim * sizeof(int64_t)))) {
        shape_str(a, sizeof(a), k->ndim, k->shape);
        shape_str(b, sizeof(b), n->ndim, n->shape);
        return dcp__err(p->err, DCP_EPLAN,
                        "'%s': ranks %d and %d disagree on the global shape "
                        "(%s vs %s)",
                        k->key, k->first_rank, r, a, b);
    }
    if (k->pathlen != n->pathlen || memcmp(k->path, n->path, k->pathlen))
        return dcp__err(p->err, DCP_EPLAN,
                        "'%s': ranks %d and %d nest the key differently",
                        k->key, k->first_rank, r);
    if (!k->is_tensor && (k->vsize != n->vsize || k->vhash != n->vhash))
        return dcp__err(p->err, DCP_EPLAN,
                        "value '%s' differs between ranks %d and %d (data "
                        "that differs per rank needs per-rank keys: "
                        "dcp_state_push_rank)",
                        k->key, k->first_rank, r);
    return DCP_OK;
}

static int corrupt(struct gp *p, int r)
{
    return dcp__err(p->err, DCP_EFORMAT, "corrupt save plan from rank %d", r);
}

/* Reads one tensor's header into n; boxes follow. */
static int parse_tensor_head(struct rd *rd, struct gkey *n)
{
    int d;
    n->dtype = (dcp_dtype)get_u8(rd);
    n->ndim = get_u8(rd);
    if (rd->bad || !dcp_dtype_size(n->dtype) || n->ndim > DCP_MAX_NDIM)
        return DCP_EFORMAT;
    for (d = 0; d < n->ndim; d++) {
        uint64_t v = get_uv(rd);
        if (v > INT64_MAX)
            return DCP_EFORMAT;
        n->shape[d] = (int64_t)v;
    }
    return rd->bad ? DCP_EFORMAT : DCP_OK;
}

static int parse_boxes(struct gp *p, struct rd *rd, uint32_t gi, int r,
                       uint32_t lent)
{
    const struct gkey *k = &p->keys[gi];
    int nd = k->ndim, slot = nd ? nd : 1, d;
    uint64_t nb = get_uv(rd), b;
    if (rd->bad || (nd && nb > (uint64_t)(rd->end - rd->p) / (2u * nd)))
        return corrupt(p, r);
    if (!nd && nb > 1)
        return dcp__err(p->err, DCP_EPLAN,
                        "'%s': rank %d holds the 0-d tensor twice", k->key, r);
    for (b = 0; b < nb; b++) {
        struct cand *c;
        int64_t *v;
        if (grow((void **)&p->pool, &p->cappool, p->npool + 2 * (size_t)slot,
                 sizeof(*p->pool)) != DCP_OK ||
            grow((void **)&p->cands, &p->capcands, p->ncands + 1,
                 sizeof(*p->cands)) != DCP_OK)
            return dcp__err(p->err, DCP_ENOMEM,
                            "out of memory planning "
                            "the save");
        v = p->pool + p->npool;
        memset(v, 0, 2 * (size_t)slot * sizeof(*v));
        for (d = 0; d < 2 * nd; d++) {
            uint64_t x = get_uv(rd);
            v[d < nd ? d : slot + d - nd] = (int64_t)(x > INT64_MAX ? 0 : x);
            if (x > INT64_MAX)
                rd->bad = 1;
        }
        for (d = 0; !rd->bad && d < nd; d++)
            if (v[d] > k->shape[d] || v[slot + d] > k->shape[d] - v[d])
                rd->bad = 1;
        if (rd->bad)
            return corrupt(p, r);
        c = &p->cands[p->ncands++];
        c->ioff = p->npool;
        c->g = gi;
        c->rank = (uint32_t)r;
        c->lent = lent;
        c->lbox = (uint32_t)b;
        p->npool += 2 * (size_t)slot;
        p->keys[gi].ncand++;
    }
    return DCP_OK;
}

static int parse_entry(struct gp *p, struct rd *rd, int r, uint32_t lent)
{
    struct gkey n;
    uint64_t klen;
    uint32_t gi;
    int added, rc;
    memset(&n, 0, sizeof(n));
    n.is_tensor = get_u8(rd) & F_TENSOR;
    klen = get_uv(rd);
    if (rd->bad || klen >= (uint64_t)(rd->end - rd->p))
        return corrupt(p, r);
    n.key = (const char *)get_bytes(rd, klen + 1);
    if (rd->bad || n.key[klen] != '\0' || strlen(n.key) != klen)
        return corrupt(p, r);
    n.pathlen = (size_t)get_uv(rd);
    n.path = get_bytes(rd, n.pathlen);
    if (rd->bad)
        return corrupt(p, r);
    if (n.is_tensor) {
        if (parse_tensor_head(rd, &n) != DCP_OK)
            return corrupt(p, r);
    } else {
        const uint8_t *h;
        n.vsize = get_uv(rd);
        h = get_bytes(rd, 8);
        if (!h)
            return corrupt(p, r);
        n.vhash = dcp__le64(h);
    }
    if (lent < p->nhint && strcmp(p->keys[p->hint[lent]].key, n.key) == 0) {
        gi = p->hint[lent];
        added = 0;
    } else {
        rc = key_lookup(p, n.key, &gi, &added);
        if (rc == DCP_OK && lent >= p->nhint) /* entries come in order */
            rc = grow((void **)&p->hint, &p->caphint, (size_t)lent + 1,
                      sizeof(*p->hint));
        if (rc != DCP_OK)
            return dcp__err(p->err, rc, "out of memory planning the save");
        if (lent >= p->nhint)
            p->nhint = (size_t)lent + 1;
        p->hint[lent] = gi;
    }
    if (added) {
        n.first_rank = r;
        n.last_rank = -1;
        p->keys[gi] = n;
    } else {
        rc = key_agree(p, &p->keys[gi], &n, r);
        if (rc != DCP_OK)
            return rc;
    }
    if (p->keys[gi].last_rank != r) {
        p->keys[gi].last_rank = r;
        p->keys[gi].nholders++;
    }
    if (n.is_tensor)
        return parse_boxes(p, rd, gi, r, lent);
    if (grow((void **)&p->cands, &p->capcands, p->ncands + 1,
             sizeof(*p->cands)) != DCP_OK)
        return dcp__err(p->err, DCP_ENOMEM,
                        "out of memory planning the "
                        "save");
    p->cands[p->ncands].ioff = 0;
    p->cands[p->ncands].g = gi;
    p->cands[p->ncands].rank = (uint32_t)r;
    p->cands[p->ncands].lent = lent;
    p->cands[p->ncands].lbox = 0;
    p->ncands++;
    p->keys[gi].ncand++;
    return DCP_OK;
}

static int parse_rank(struct gp *p, int r, const uint8_t *b, size_t len)
{
    struct rd rd = {b, b + len, 0};
    uint64_t n, i;
    int rc = DCP_OK;
    if (get_u8(&rd) != BLOB_VERSION)
        return corrupt(p, r);
    n = get_uv(&rd);
    if (rd.bad || n > len || n > UINT32_MAX)
        return corrupt(p, r);
    for (i = 0; rc == DCP_OK && i < n; i++)
        rc = parse_entry(p, &rd, r, (uint32_t)i);
    if (rc == DCP_OK && rd.p != rd.end)
        rc = corrupt(p, r);
    if (rc == DCP_OK && p->ncands >= UINT32_MAX)
        rc = dcp__err(p->err, DCP_ELIMIT,
                      "save plan has more than 2^32 "
                      "boxes");
    return rc;
}

/* -------------------------------------------------- coordinator: build */

struct sorted_key {
    const char *key;
    uint32_t g;
};

static int cmp_sorted_key(const void *a, const void *b)
{
    return strcmp(((const struct sorted_key *)a)->key,
                  ((const struct sorted_key *)b)->key);
}

/* A box while its key's boxes are sorted by offsets. */
struct srt {
    const int64_t *off;
    uint32_t ci;
    int ndim;
};

static int cmp_srt(const void *a, const void *b)
{
    const struct srt *x = a, *y = b;
    int d;
    for (d = 0; d < x->ndim; d++)
        if (x->off[d] != y->off[d])
            return x->off[d] < y->off[d] ? -1 : 1;
    return x->ci < y->ci ? -1 : x->ci > y->ci;
}

/* A chunk of the plan and its writer (a cand index). */
struct cref {
    uint32_t k;
    uint32_t j;
    uint32_t wc;
};

/* A replicated chunk awaiting its writer: holders hold[h0 .. h0+nh). */
struct rep {
    uint64_t weight;
    uint32_t gid;
    uint32_t h0;
    uint32_t nh;
};

static int cmp_rep(const void *a, const void *b)
{
    const struct rep *x = a, *y = b;
    if (x->weight != y->weight)
        return x->weight > y->weight ? -1 : 1;
    return x->gid < y->gid ? -1 : x->gid > y->gid;
}

struct build {
    struct gp *p;
    struct dcp_metadata *md;
    uint32_t *cstart; /* per md entry: first index into corder */
    uint32_t *corder; /* cand indices bucketed by md entry */
    struct srt *srt;
    struct cref *crefs;
    size_t ncrefs;
    struct rep *reps;
    size_t nreps;
    uint32_t *hold;
    size_t nhold;
    uint64_t *load;
    /* The chunks' offsets and sizes, copied in entry order as they are
     * made: the gathered pool is in rank order, so every later pass over
     * the chunks (tiling check, encoding twice) would otherwise miss the
     * cache on each chunk at scale. */
    int64_t *ints;
    size_t nints;
};

/* Rebuilds an entry's path from its encoding and key. */
static int decode_path(struct md_entry *e, const struct gkey *k)
{
    struct rd rd = {k->path, k->path + k->pathlen, 0};
    size_t klen = strlen(k->key), pos = 0, i;
    uint64_t n = get_uv(&rd);
    if (rd.bad || n > k->pathlen)
        return DCP_EFORMAT;
    e->path = dcp__calloc(n ? (size_t)n : 1, sizeof(*e->path));
    if (!e->path)
        return DCP_ENOMEM;
    e->npath = (size_t)n;
    for (i = 0; i < n; i++) {
        uint64_t tag = get_uv(&rd);
        if (i && (pos >= klen || k->key[pos++] != '.'))
            return DCP_EFORMAT;
        if (tag == 1) {
            uint64_t v = get_uv(&rd);
            char num[32];
            if (v > INT64_MAX)
                return DCP_EFORMAT;
            e->path[i].i = (int64_t)v;
            pos += (size_t)snprintf(num, sizeof(num), "%" PRId64, (int64_t)v);
        } else {
            size_t sl = (size_t)(tag >> 1);
            if ((tag & 1) || sl > klen - pos)
                return DCP_EFORMAT;
            e->path[i].s = dcp__strndup(k->key + pos, sl);
            if (!e->path[i].s)
                return DCP_ENOMEM;
            pos += sl;
        }
    }
    return rd.bad || pos != klen ? DCP_EFORMAT : DCP_OK;
}

/* Adds chunk j of entry k, first held by cand wc; returns its id. */
static uint32_t add_cref(struct build *b, uint32_t k, uint32_t j, uint32_t wc)
{
    b->crefs[b->ncrefs].k = k;
    b->crefs[b->ncrefs].j = j;
    b->crefs[b->ncrefs].wc = wc;
    return (uint32_t)b->ncrefs++;
}

/* Records the holders hold[h0..nhold) of chunk gid: one writes it now, or
 * several wait for the spreading pass. */
static void place(struct build *b, uint32_t gid, size_t h0, uint64_t weight)
{
    size_t nh = b->nhold - h0;
    if (nh == 1) {
        b->load[b->p->cands[b->hold[h0]].rank] += weight;
        b->nhold = h0;
        return;
    }
    b->reps[b->nreps].weight = weight;
    b->reps[b->nreps].gid = gid;
    b->reps[b->nreps].h0 = (uint32_t)h0;
    b->reps[b->nreps].nh = (uint32_t)nh;
    b->nreps++;
}

/* One group of boxes with equal offsets, srt[a..z): checks it and makes it
 * one chunk of entry k. */
static int group_chunk(struct build *b, uint32_t k, size_t a, size_t z)
{
    struct gp *p = b->p;
    struct md_entry *e = &b->md->e[k];
    int nd = e->ndim, slot = nd ? nd : 1;
    size_t m, h0 = b->nhold, first = SIZE_MAX, prev = SIZE_MAX;
    uint64_t numel = 0;
    uint32_t gid;
    struct md_chunk *c;
    for (m = a; m < z; m++) {
        const struct cand *cm = &p->cands[b->srt[m].ci], *cf, *cp;
        const int64_t *sz = p->pool + cm->ioff + slot;
        uint64_t vol = dcp__box_numel(nd, sz);
        if (!vol)
            continue;
        if (first == SIZE_MAX) {
            first = prev = m;
            numel = vol;
            continue;
        }
        cf = &p->cands[b->srt[first].ci];
        cp = &p->cands[b->srt[prev].ci];
        if (memcmp(sz, p->pool + cf->ioff + slot,
                   (size_t)nd * sizeof(int64_t)) != 0)
            return dcp__err(p->err, DCP_EPLAN,
                            "'%s': boxes of ranks %u and %u overlap (same "
                            "offsets, different sizes)",
                            e->key, cf->rank, cm->rank);
        if (cp->rank == cm->rank)
            return dcp__err(p->err, DCP_EPLAN,
                            "'%s': rank %u holds the same box twice", e->key,
                            cm->rank);
        prev = m;
    }
    for (m = a; m < z; m++) {
        const struct cand *cm = &p->cands[b->srt[m].ci];
        if (first != SIZE_MAX && !dcp__box_numel(nd, p->pool + cm->ioff + slot))
            continue; /* empty beside a non-empty box: nothing to store */
        if (b->nhold > h0 && p->cands[b->hold[b->nhold - 1]].rank == cm->rank)
            continue;
        b->hold[b->nhold++] = b->srt[m].ci;
    }
    c = &e->chunks[e->nchunks];
    c->off = b->ints + b->nints;
    c->size = c->off + slot;
    memcpy(c->off, p->pool + p->cands[b->hold[h0]].ioff,
           2 * (size_t)slot * sizeof(int64_t));
    b->nints += 2 * (size_t)slot;
    gid = add_cref(b, k, (uint32_t)e->nchunks, b->hold[h0]);
    e->nchunks++;
    place(b, gid, h0, numel * dcp_dtype_size(e->dtype) + 1);
    return DCP_OK;
}

static int build_tensor(struct build *b, uint32_t k, const struct gkey *gk)
{
    struct gp *p = b->p;
    struct md_entry *e = &b->md->e[k];
    size_t n = b->cstart[k + 1] - b->cstart[k], i, a, z;
    int nd = e->ndim, rc;
    for (i = 0; i < n; i++) {
        uint32_t ci = b->corder[b->cstart[k] + i];
        b->srt[i].off = p->pool + p->cands[ci].ioff;
        b->srt[i].ci = ci;
        b->srt[i].ndim = nd;
    }
    for (i = 1; i < n && cmp_srt(&b->srt[i - 1], &b->srt[i]) < 0; i++)
        ;
    if (i < n) /* row sharding arrives sorted: ranks in order */
        qsort(b->srt, n, sizeof(*b->srt), cmp_srt);
    for (a = 0; a < n; a = z) {
        for (z = a + 1; z < n; z++)
            if (nd && memcmp(b->srt[a].off, b->srt[z].off,
                             (size_t)nd * sizeof(int64_t)) != 0)
                break;
        rc = group_chunk(b, k, a, z);
        if (rc != DCP_OK)
            return rc;
    }
    rc = dcp__meta_check_tiling(e, p->err);
    if (rc == DCP_EFORMAT) {
        if (gk->nholders < p->nranks)
            (void)dcp__err_prefix(p->err,
                                  "invalid save plan (key held by %d of %d "
                                  "ranks)",
                                  gk->nholders, p->nranks);
        else
            (void)dcp__err_prefix(p->err, "invalid save plan");
        rc = p->err->code = DCP_EPLAN;
    } else if (rc == DCP_ENOMEM) {
        rc = dcp__err(p->err, rc, "out of memory planning the save");
    }
    return rc;
}

static int build_value(struct build *b, uint32_t k, const struct gkey *gk)
{
    struct md_entry *e = &b->md->e[k];
    size_t n = b->cstart[k + 1] - b->cstart[k], i, h0 = b->nhold;
    uint32_t gid;
    for (i = 0; i < n; i++)
        b->hold[b->nhold++] = b->corder[b->cstart[k] + i];
    e->nchunks = 1;
    gid = add_cref(b, k, 0, b->hold[h0]);
    place(b, gid, h0, gk->vsize + 1);
    return DCP_OK;
}

static int build_entry(struct build *b, uint32_t k, const struct gkey *gk)
{
    struct md_entry *e = &b->md->e[k];
    size_t n = b->cstart[k + 1] - b->cstart[k];
    int rc;
    e->key = dcp__strdup(gk->key);
    e->chunks = dcp__calloc(n ? n : 1, sizeof(*e->chunks));
    if (!e->key || !e->chunks)
        return dcp__err(b->p->err, DCP_ENOMEM,
                        "out of memory planning the "
                        "save");
    rc = decode_path(e, gk);
    if (rc != DCP_OK)
        return rc == DCP_ENOMEM ? dcp__err(b->p->err, rc,
                                           "out of memory planning the "
                                           "save")
                                : corrupt(b->p, gk->first_rank);
    e->is_tensor = gk->is_tensor;
    e->dtype = gk->dtype;
    e->ndim = gk->is_tensor ? gk->ndim : 0;
    memcpy(e->shape, gk->shape, sizeof(e->shape));
    return gk->is_tensor ? build_tensor(b, k, gk) : build_value(b, k, gk);
}

/* Gives each replicated chunk to its least-loaded holder, largest first. */
static void spread(struct build *b)
{
    size_t i, h;
    if (b->nreps > 1)
        qsort(b->reps, b->nreps, sizeof(*b->reps), cmp_rep);
    for (i = 0; i < b->nreps; i++) {
        const struct rep *r = &b->reps[i];
        uint32_t best = b->hold[r->h0];
        for (h = r->h0 + 1; h < (size_t)r->h0 + r->nh; h++) {
            uint32_t rb = b->p->cands[best].rank;
            uint32_t rh = b->p->cands[b->hold[h]].rank;
            if (b->load[rh] < b->load[rb] ||
                (b->load[rh] == b->load[rb] && rh < rb))
                best = b->hold[h];
        }
        b->load[b->p->cands[best].rank] += r->weight;
        b->crefs[r->gid].wc = best;
    }
}

/* Fills g->recs: each rank's records, values first, then tensors, each in
 * state order (as torch's writer orders an item list). The cands are in
 * (rank, entry, box) order already, so two passes over them list the
 * writers' records without sorting. */
static int make_recs(struct build *b, struct pl_global *g)
{
    const struct gp *p = b->p;
    uint32_t *wgid;
    size_t i, *fill;
    int r, pass;
    g->recbase = dcp__calloc((size_t)g->nranks + 1, sizeof(*g->recbase));
    g->recs = dcp__malloc((b->ncrefs ? b->ncrefs : 1) * sizeof(*g->recs));
    fill = dcp__calloc((size_t)g->nranks, sizeof(*fill));
    wgid = dcp__calloc(p->ncands ? p->ncands : 1, sizeof(*wgid));
    if (!g->recbase || !g->recs || !fill || !wgid) {
        dcp__free(fill);
        dcp__free(wgid);
        return DCP_ENOMEM;
    }
    for (i = 0; i < b->ncrefs; i++) {
        wgid[b->crefs[i].wc] = (uint32_t)i + 1;
        g->recbase[p->cands[b->crefs[i].wc].rank + 1]++;
    }
    for (r = 0; r < g->nranks; r++)
        g->recbase[r + 1] += g->recbase[r];
    for (pass = 0; pass < 2; pass++) {
        for (i = 0; i < p->ncands; i++) {
            const struct cand *c = &p->cands[i];
            const struct cref *cr;
            struct pl_rec *rec;
            if (!wgid[i] || p->keys[c->g].is_tensor != pass)
                continue;
            cr = &b->crefs[wgid[i] - 1];
            rec = &g->recs[g->recbase[c->rank] + fill[c->rank]++];
            rec->lent = c->lent;
            rec->lbox = c->lbox;
            rec->k = cr->k;
            rec->j = cr->j;
            rec->tensor = (uint32_t)pass;
        }
    }
    dcp__free(fill);
    dcp__free(wgid);
    return DCP_OK;
}

/* Buckets the cands by md entry (counting sort). */
static int bucket(struct build *b, const uint32_t *kof, size_t *maxn)
{
    struct gp *p = b->p;
    size_t i, k;
    b->cstart = dcp__calloc(p->nkeys + 2, sizeof(*b->cstart));
    b->corder = dcp__malloc((p->ncands ? p->ncands : 1) * sizeof(*b->corder));
    if (!b->cstart || !b->corder)
        return DCP_ENOMEM;
    dcp__advise_huge(b->corder, p->ncands * sizeof(*b->corder));
    for (i = 0; i < p->ncands; i++)
        b->cstart[kof[p->cands[i].g] + 2]++;
    *maxn = 0;
    for (k = 0; k < p->nkeys; k++) {
        if (b->cstart[k + 2] > *maxn)
            *maxn = b->cstart[k + 2];
        b->cstart[k + 2] += b->cstart[k + 1];
    }
    for (i = 0; i < p->ncands; i++)
        b->corder[b->cstart[kof[p->cands[i].g] + 1]++] = (uint32_t)i;
    return DCP_OK;
}

static int build_all(struct gp *p, struct pl_global *g)
{
    struct build b;
    struct sorted_key *sk = NULL;
    uint32_t *kof = NULL;
    size_t i, maxn = 0;
    int rc = DCP_ENOMEM;
    memset(&b, 0, sizeof(b));
    b.p = p;
    b.md = g->md;
    sk = dcp__malloc((p->nkeys ? p->nkeys : 1) * sizeof(*sk));
    kof = dcp__malloc((p->nkeys ? p->nkeys : 1) * sizeof(*kof));
    b.md->e = dcp__calloc(p->nkeys ? p->nkeys : 1, sizeof(*b.md->e));
    b.crefs = dcp__malloc((p->ncands ? p->ncands : 1) * sizeof(*b.crefs));
    b.reps = dcp__malloc((p->ncands ? p->ncands : 1) * sizeof(*b.reps));
    b.hold = dcp__malloc((p->ncands ? p->ncands : 1) * sizeof(*b.hold));
    b.load = dcp__calloc((size_t)p->nranks, sizeof(*b.load));
    if (!sk || !kof || !b.md->e || !b.crefs || !b.reps || !b.hold || !b.load)
        goto out;
    dcp__advise_huge(b.crefs, p->ncands * sizeof(*b.crefs));
    dcp__advise_huge(b.reps, p->ncands * sizeof(*b.reps));
    dcp__advise_huge(b.hold, p->ncands * sizeof(*b.hold));
    for (i = 0; i < p->nkeys; i++) {
        sk[i].key = p->keys[i].key;
        sk[i].g = (uint32_t)i;
    }
    if (p->nkeys > 1)
        qsort(sk, p->nkeys, sizeof(*sk), cmp_sorted_key);
    for (i = 0; i < p->nkeys; i++)
        kof[sk[i].g] = (uint32_t)i;
    if (bucket(&b, kof, &maxn) != DCP_OK)
        goto out;
    b.srt = dcp__malloc((maxn ? maxn : 1) * sizeof(*b.srt));
    /* Each chunk's ints come from one cand's: the pool's size bounds them. */
    b.ints = dcp__malloc((p->npool ? p->npool : 1) * sizeof(*b.ints));
    if (!b.srt || !b.ints)
        goto out;
    dcp__advise_huge(b.ints, p->npool * sizeof(*b.ints));
    rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < p->nkeys; i++) {
        b.md->n = i + 1;
        rc = build_entry(&b, (uint32_t)i, &p->keys[sk[i].g]);
    }
    if (rc != DCP_OK)
        goto out_rc;
    /* The chunks point into b.ints now: md owns it instead of the pool. */
    dcp__free(g->md->ints);
    g->md->ints = b.ints;
    b.ints = NULL;
    spread(&b);
    rc = make_recs(&b, g);
    if (rc == DCP_OK) {
        g->bytes = b.load;
        b.load = NULL;
    }
out:
    if (rc == DCP_ENOMEM)
        rc = dcp__err(p->err, rc, "out of memory planning the save");
out_rc:
    dcp__free(sk);
    dcp__free(kof);
    dcp__free(b.cstart);
    dcp__free(b.corder);
    dcp__free(b.srt);
    dcp__free(b.crefs);
    dcp__free(b.reps);
    dcp__free(b.hold);
    dcp__free(b.load);
    dcp__free(b.ints);
    return rc;
}

int dcp__plan_global(const uint8_t *blobs, const size_t *lens,
                     const size_t *displs, int nranks, struct pl_global *g,
                     struct dcp_err *err)
{
    struct gp p;
    int r, rc = DCP_OK;
    memset(g, 0, sizeof(*g));
    memset(&p, 0, sizeof(p));
    p.nranks = nranks;
    p.err = err;
    g->nranks = nranks;
    for (r = 0; rc == DCP_OK && r < nranks; r++)
        rc = parse_rank(&p, r, blobs + displs[r], lens[r]);
    if (rc == DCP_OK) {
        g->md = dcp__calloc(1, sizeof(*g->md));
        if (g->md)
            g->md->version = dcp__strdup("1.0.0");
        if (!g->md || !g->md->version)
            rc = dcp__err(err, DCP_ENOMEM, "out of memory planning the save");
    }
    if (rc == DCP_OK && !p.pool) {
        p.pool = dcp__malloc(sizeof(int64_t));
        if (!p.pool)
            rc = dcp__err(err, DCP_ENOMEM, "out of memory planning the save");
    }
    if (rc == DCP_OK) {
        /* Chunks point into the pool from here on: md owns it. */
        g->md->ints = p.pool;
        rc = build_all(&p, g);
    } else {
        dcp__free(p.pool);
    }
    dcp__free(p.keys);
    dcp__free(p.tab);
    dcp__free(p.cands);
    dcp__free(p.hint);
    if (rc != DCP_OK)
        dcp__plan_global_release(g);
    return rc;
}

void dcp__plan_global_release(struct pl_global *g)
{
    dcp__meta_free(g->md);
    dcp__free(g->recs);
    dcp__free(g->recbase);
    dcp__free(g->bytes);
    memset(g, 0, sizeof(*g));
}

/* -------------------------------------------------------- assignments */

int dcp__plan_assign_encode(const struct pl_global *g, int r, const char *file,
                            struct dcp_buf *out)
{
    size_t i, n = g->recbase[r + 1] - g->recbase[r], flen = strlen(file);
    int rc = put_uv(out, flen);
    if (rc == DCP_OK)
        rc = dcp__buf_put(out, file, flen);
    if (rc == DCP_OK)
        rc = put_uv(out, n);
    for (i = 0; rc == DCP_OK && i < n; i++) {
        const struct pl_rec *rec = &g->recs[g->recbase[r] + i];
        rc = put_uv(out, rec->lent);
        if (rc == DCP_OK)
            rc = put_uv(out, rec->lbox);
    }
    return rc;
}

int dcp__plan_assign_decode(const uint8_t *p, size_t len, const dcp_state *st,
                            struct pl_assign *a, struct dcp_err *err)
{
    struct rd rd = {p, p + len, 0};
    const uint8_t *f;
    uint64_t flen, n, i;
    memset(a, 0, sizeof(*a));
    flen = get_uv(&rd);
    f = get_bytes(&rd, flen);
    n = get_uv(&rd);
    if (rd.bad || n > len)
        goto out_bad;
    a->file = dcp__strndup((const char *)f, (size_t)flen);
    a->recs = dcp__calloc(n ? (size_t)n : 1, sizeof(*a->recs));
    if (!a->file || !a->recs) {
        dcp__plan_assign_release(a);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    if (strlen(a->file) != flen || (n && !dcp__safe_name(a->file)))
        goto out_bad;
    for (i = 0; i < n; i++) {
        struct pl_rec *rec = &a->recs[i];
        uint64_t lent = get_uv(&rd), lbox = get_uv(&rd);
        const struct st_entry *se;
        if (rd.bad || lent >= st->n)
            goto out_bad;
        se = &st->e[lent];
        if (se->is_tensor ? lbox >= se->nboxes : lbox != 0)
            goto out_bad;
        rec->lent = (uint32_t)lent;
        rec->lbox = (uint32_t)lbox;
        rec->tensor = (uint32_t)se->is_tensor;
    }
    a->n = (size_t)n;
    if (rd.p != rd.end)
        goto out_bad;
    return DCP_OK;
out_bad:
    dcp__plan_assign_release(a);
    return dcp__err(err, DCP_EFORMAT,
                    "corrupt write assignment (does every "
                    "rank pass its own state?)");
}

void dcp__plan_assign_release(struct pl_assign *a)
{
    dcp__free(a->file);
    dcp__free(a->recs);
    memset(a, 0, sizeof(*a));
}

/* ------------------------------------------------------------ results */

int dcp__plan_results_encode(const uint64_t *offlen, size_t n,
                             struct dcp_buf *out)
{
    size_t i;
    int rc = put_uv(out, n);
    for (i = 0; rc == DCP_OK && i < 2 * n; i++)
        rc = put_uv(out, offlen[i]);
    return rc;
}

int dcp__plan_results_apply(struct pl_global *g, int r, uint32_t file,
                            const uint8_t *p, size_t len, struct dcp_err *err)
{
    struct rd rd = {p, p + len, 0};
    size_t n = g->recbase[r + 1] - g->recbase[r], i;
    if (get_uv(&rd) != n || rd.bad)
        return dcp__err(err, DCP_EFORMAT,
                        "rank %d reported a wrong number of records", r);
    for (i = 0; i < n; i++) {
        const struct pl_rec *rec = &g->recs[g->recbase[r] + i];
        struct md_chunk *c = &g->md->e[rec->k].chunks[rec->j];
        c->file = file;
        c->offset = get_uv(&rd);
        c->length = get_uv(&rd);
        c->has_storage = 1;
    }
    if (rd.bad || rd.p != rd.end)
        return dcp__err(err, DCP_EFORMAT,
                        "corrupt write results from rank "
                        "%d",
                        r);
    return DCP_OK;
}
