/*
 * Save planning (see plan.h).
 *
 * Local plan: each rank encodes what it holds with varints: per state entry
 * its kind, key, nesting path, dtype, global shape and boxes (tensors) or
 * pickled size and a 64-bit FNV-1a hash of the pickle (values). No data.
 *
 * Global plan, on the coordinator, in O(n log n) for n boxes over all
 * ranks: keys are interned in a hash table while the blobs are parsed
 * (checking that ranks agree on each key), boxes are copied to their key's
 * slice of one array in a second pass over the blobs (a counting sort,
 * which turns the rank-major input key-major), sorted by offsets within
 * each key (they usually arrive sorted), and equal offsets form one chunk:
 * replicated boxes become one record with several possible writers; empty boxes
 * beside a non-empty one vanish; equal offsets with different sizes are an
 * overlap. Each tensor's chunks must then tile it (dcp__meta_check_tiling).
 * Writers: a record with one holder is written by it; replicated records go,
 * largest first, to the holder with the fewest bytes so far (ties: lowest
 * rank), so they spread over the ranks.
 */
#include "plan.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hashtab.h"
#include "value.h"

#define BLOB_VERSION 1
#define F_TENSOR     1

/* ------------------------------------------------------------ varints */

#define UV_MAX 10 /* bytes of a varint */

static inline uint8_t *put_uv_raw(uint8_t *p, uint64_t v)
{
    while (v >= 0x80) {
        *p++ = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    *p++ = (uint8_t)v;
    return p;
}

static int put_uv(struct dcp_buf *b, uint64_t v)
{
    uint8_t t[UV_MAX];
    return dcp__buf_put(b, t, (size_t)(put_uv_raw(t, v) - t));
}

struct rd {
    const uint8_t *p;
    const uint8_t *end;
    int bad;
};

static uint64_t get_uv_slow(struct rd *r)
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

static inline uint64_t get_uv(struct rd *r)
{
    if (r->p < r->end && *r->p < 0x80)
        return *r->p++;
    return get_uv_slow(r);
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
                     struct dcp_buf *path, size_t *capv, struct dcp_err *err)
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
            rc = dcp__grow_huge((void **)&lp->vpos, capv, *capv, lp->nvpos + 1,
                                sizeof(*lp->vpos), 64);
        if (rc == DCP_OK) {
            uint64_t h = dcp__fnv1a64(pk->p, pk->len);
            uint8_t le[8];
            int k;
            for (k = 0; k < 8; k++)
                le[k] = (uint8_t)(h >> (8 * k));
            lp->vpos[lp->nvpos++] = b->len;
            lp->vhash = dcp__fnv1a64_add(lp->vhash, se->key, klen + 1);
            lp->vhash = dcp__fnv1a64_add(lp->vhash, le, sizeof(le));
            rc = dcp__buf_put(b, le, sizeof(le));
        }
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
    size_t i, capv = 0;
    int rc = DCP_OK;
    memset(lp, 0, sizeof(*lp));
    lp->vhash = DCP__FNV1A64_INIT;
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
        rc = enc_entry(lp, i, &st->e[i], &path, &capv, err);
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
    dcp__free(lp->vpos);
    dcp__buf_free(&lp->blob);
    memset(lp, 0, sizeof(*lp));
}

int dcp__plan_local_structure(const struct pl_local *lp, struct dcp_buf *out)
{
    size_t i;
    out->len = 0;
    if (dcp__buf_put(out, lp->blob.p, lp->blob.len) != DCP_OK)
        return DCP_ENOMEM;
    for (i = 0; i < lp->nvpos; i++)
        memset(out->p + lp->vpos[i], 0, 8);
    return DCP_OK;
}

/*
 * The blob is read front to back by one grammar, so when every byte but
 * those of lp's value hashes equals s's, s has its value hashes at the
 * same places: comparing the stretches between them compares structures.
 */
int dcp__plan_local_same(const struct pl_local *lp, const struct dcp_buf *s)
{
    size_t i, at = 0;
    if (lp->blob.len != s->len)
        return 0;
    for (i = 0; i <= lp->nvpos; i++) {
        size_t end = i < lp->nvpos ? lp->vpos[i] : lp->blob.len;
        if (memcmp(lp->blob.p + at, s->p + at, end - at))
            return 0;
        at = end + 8;
    }
    return 1;
}

/* -------------------------------------------------- coordinator: parse */

/* A key as the coordinator sees it while parsing (pointers into blobs). */
struct gkey {
    const char *key;
    /* The first holder's encoded entry up to its box count (tensors) or
     * its end (values): a later rank that sends the same bytes agrees. */
    const uint8_t *head;
    size_t headlen;
    const uint8_t *path;
    size_t pathlen;
    int64_t shape[DCP_MAX_NDIM];
    uint64_t vsize;
    uint64_t vhash;
    size_t ncand; /* its boxes (values: holders) over all ranks */
    size_t base;  /* where they start in gp.box */
    int first_rank;
    int last_rank;
    int nholders;
    int is_tensor;
    int ndim;
    dcp_dtype dtype;
};

/* A rank's entry, as the first pass leaves it for the second. */
struct pent {
    uint32_t g;
    uint32_t headlen; /* bytes before its box count (tensor) or end */
};

/* What a rank's records need of one of its boxes (or values); the cands
 * are numbered in (rank, entry, box) order. */
struct cand {
    uint32_t lent;
    uint32_t lbox;
};

/*
 * The blobs are read twice. The first pass checks everything (the ranks'
 * agreement on each key, boxes inside the shape) and counts each key's
 * boxes; the second copies every box into its key's slice of gp.box, keys
 * in sorted order (a counting sort from rank-major to key-major), so that
 * the passes after it read each key's boxes in sequence instead of taking
 * a cache miss on every box. A box there is BOX_WORDS(slot) words: its
 * rank << 32 | its cand index, then its offsets and its sizes (slot each;
 * a value is the first word only).
 */
#define BOX_WORDS(slot) (1 + 2 * (size_t)(slot))
#define BOX_RANK(w)     ((uint32_t)((uint64_t)(w)[0] >> 32))
#define BOX_CAND(w)     ((uint32_t)(w)[0])

struct gp {
    unsigned policy; /* PL_DEDUP_* */
    pl_hook_fn hook; /* the coordinator's hook (planner.c), or NULL */
    void *hook_ud;
    struct gkey *keys;
    size_t nkeys, capkeys;
    struct dcp_htab tab; /* keys by name */
    struct pent *ents; /* every rank's entries, rank-major */
    size_t nents, capents;
    size_t ncands;  /* boxes and values over all ranks */
    size_t nwords;  /* of gp.box */
    size_t *rbase;  /* per rank: its first cand; nranks + 1 */
    uint32_t *hint; /* key of entry i on the previous rank: likely the same */
    size_t nhint, caphint;
    int64_t *box;       /* second pass: per key, its boxes */
    struct cand *cands; /* second pass */
    int nranks;
    struct dcp_err *err;
};

/* Room for need elements (all in use are kept), on huge pages when large. */
static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    return dcp__grow_huge(p, cap, *cap, need, elem, 64);
}

/* An array of n elements on huge pages where it is large; NULL when out
 * of memory (n == 0 allocates one). */
static void *huge_array(size_t n, size_t elem, int zero)
{
    void *p;
    if (!n)
        n = 1;
    if (n > SIZE_MAX / elem)
        return NULL;
    p = zero ? dcp__calloc(n, elem) : dcp__malloc(n * elem);
    dcp__advise_huge(p, n * elem);
    return p;
}

/* The name of key i, for p->tab. */
static const void *gkey_name(const void *arr, uint32_t i, size_t *len)
{
    const struct gkey *k = arr;
    *len = strlen(k[i].key);
    return k[i].key;
}

/* Finds key, or adds a zeroed gkey for it (*added = 1). */
static int key_lookup(struct gp *p, const char *key, size_t len, uint32_t *gi,
                      int *added)
{
    size_t h;
    int rc;
    *added = 0;
    rc = dcp__htab_reserve(&p->tab, p->nkeys + 1, gkey_name, p->keys);
    if (rc != DCP_OK)
        return rc;
    h = dcp__htab_slot(&p->tab, key, len, gkey_name, p->keys);
    if (p->tab.slot[h]) {
        *gi = p->tab.slot[h] - 1;
        return DCP_OK;
    }
    if (p->nkeys >= UINT32_MAX - 1)
        return DCP_ELIMIT;
    rc = grow((void **)&p->keys, &p->capkeys, p->nkeys + 1, sizeof(*p->keys));
    if (rc != DCP_OK)
        return rc;
    memset(&p->keys[p->nkeys], 0, sizeof(*p->keys));
    p->keys[p->nkeys].key = key;
    p->keys[p->nkeys].last_rank = -1;
    dcp__htab_set(&p->tab, h, (uint32_t)p->nkeys);
    *gi = (uint32_t)p->nkeys++;
    *added = 1;
    return DCP_OK;
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
        (void)dcp_shape_format(a, sizeof(a), k->ndim, k->shape);
        (void)dcp_shape_format(b, sizeof(b), n->ndim, n->shape);
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

/* First pass over a tensor's boxes: checks them and counts them. */
static int parse_boxes(struct gp *p, struct rd *rd, uint32_t gi, int r)
{
    struct gkey *k = &p->keys[gi];
    int nd = k->ndim, d;
    uint64_t nb = get_uv(rd), b;
    if (rd->bad || (nd && nb > (uint64_t)(rd->end - rd->p) / (2u * nd)))
        return corrupt(p, r);
    if (!nd && nb > 1)
        return dcp__err(p->err, DCP_EPLAN,
                        "'%s': rank %d holds the 0-d tensor twice", k->key, r);
    for (b = 0; b < nb; b++) {
        uint64_t v[2 * DCP_MAX_NDIM];
        for (d = 0; d < 2 * nd; d++) {
            v[d] = get_uv(rd);
            if (v[d] > INT64_MAX)
                rd->bad = 1;
        }
        for (d = 0; !rd->bad && d < nd; d++)
            if (v[d] > (uint64_t)k->shape[d] ||
                v[nd + d] > (uint64_t)k->shape[d] - v[d])
                rd->bad = 1;
        if (rd->bad)
            return corrupt(p, r);
    }
    k->ncand += (size_t)nb;
    p->ncands += (size_t)nb;
    p->nwords += (size_t)nb * BOX_WORDS(nd ? nd : 1);
    return DCP_OK;
}

/* The full parse of an entry's head, for a key first seen or sent in
 * other bytes than its first holder's: *gi receives its key. */
static int parse_head(struct gp *p, struct rd *rd, int r, uint32_t lent,
                      uint32_t *gi)
{
    const uint8_t *start = rd->p;
    struct gkey n;
    uint64_t klen;
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
    n.head = start;
    n.headlen = (size_t)(rd->p - start);
    if (lent < p->nhint && strcmp(p->keys[p->hint[lent]].key, n.key) == 0) {
        *gi = p->hint[lent];
        added = 0;
    } else {
        rc = key_lookup(p, n.key, (size_t)klen, gi, &added);
        if (rc == DCP_OK && lent >= p->nhint) /* entries come in order */
            rc = grow((void **)&p->hint, &p->caphint, (size_t)lent + 1,
                      sizeof(*p->hint));
        if (rc != DCP_OK)
            return dcp__err(p->err, rc, "out of memory planning the save");
        if (lent >= p->nhint)
            p->nhint = (size_t)lent + 1;
        p->hint[lent] = *gi;
    }
    if (added) {
        n.first_rank = r;
        n.last_rank = -1;
        p->keys[*gi] = n;
        return DCP_OK;
    }
    return key_agree(p, &p->keys[*gi], &n, r);
}

static int parse_entry(struct gp *p, struct rd *rd, int r, uint32_t lent)
{
    const uint8_t *start = rd->p;
    struct gkey *k;
    uint32_t gi = 0;
    int rc;
    /* Usually the same key as this entry on the previous rank, in the
     * same bytes as its first holder's: then it agrees. */
    k = lent < p->nhint ? &p->keys[p->hint[lent]] : NULL;
    if (k && k->headlen <= (size_t)(rd->end - rd->p) &&
        memcmp(rd->p, k->head, k->headlen) == 0) {
        gi = p->hint[lent];
        rd->p += k->headlen;
    } else {
        rc = parse_head(p, rd, r, lent, &gi);
        if (rc != DCP_OK)
            return rc;
        k = &p->keys[gi];
    }
    if ((size_t)(rd->p - start) > UINT32_MAX)
        return dcp__err(p->err, DCP_ELIMIT,
                        "'%s': key or path of rank %d too long", k->key, r);
    if (grow((void **)&p->ents, &p->capents, p->nents + 1, sizeof(*p->ents)) !=
        DCP_OK)
        return dcp__err(p->err, DCP_ENOMEM, "out of memory planning the save");
    p->ents[p->nents].g = gi;
    p->ents[p->nents].headlen = (uint32_t)(rd->p - start);
    p->nents++;
    if (k->last_rank != r) {
        k->last_rank = r;
        k->nholders++;
    }
    if (k->is_tensor)
        return parse_boxes(p, rd, gi, r);
    k->ncand++;
    p->ncands++;
    p->nwords++;
    return DCP_OK;
}

static int parse_rank(struct gp *p, int r, const uint8_t *b, size_t len)
{
    struct rd rd = {b, b + len, 0};
    uint64_t n, i;
    int rc = DCP_OK;
    p->rbase[r] = p->ncands;
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
    p->rbase[r + 1] = p->ncands;
    return rc;
}

/* Second pass over rank r's blob, which the first found sound: each box
 * to its key's next place (cur), its cand to the next one (*ci). */
static void fill_rank(struct gp *p, int r, const uint8_t *b, size_t len,
                      size_t *cur, size_t *eip, uint32_t *cip)
{
    struct rd rd = {b, b + len, 0};
    const struct pent *pe = p->ents ? p->ents + *eip : NULL;
    struct cand *cd = p->cands;
    int64_t *box = p->box;
    uint64_t n, i, nb, j, rk = (uint64_t)r << 32;
    uint32_t ci = *cip;
    int d;
    (void)get_u8(&rd);
    n = get_uv(&rd);
    for (i = 0; i < n; i++, pe++) {
        const struct gkey *k = &p->keys[pe->g];
        int nd = k->ndim, slot = nd ? nd : 1;
        rd.p += pe->headlen;
        if (!k->is_tensor) {
            box[cur[pe->g]++] = (int64_t)(rk | ci);
            cd[ci].lent = (uint32_t)i;
            cd[ci++].lbox = 0;
            continue;
        }
        nb = get_uv(&rd);
        for (j = 0; j < nb; j++) {
            int64_t *w = box + cur[pe->g];
            cur[pe->g] += BOX_WORDS(slot);
            /* The next rank's box of this key goes next to this one, about
             * a rank's worth of boxes later: fetching its line now hides
             * the miss (2000 keys, 2000 lines: they stay in cache). */
            __builtin_prefetch(w + 16, 1);
            w[0] = (int64_t)(rk | ci);
            w[1] = w[1 + slot] = 0;
            for (d = 0; d < nd; d++)
                w[1 + d] = (int64_t)get_uv(&rd);
            for (d = 0; d < nd; d++)
                w[1 + slot + d] = (int64_t)get_uv(&rd);
            cd[ci].lent = (uint32_t)i;
            cd[ci++].lbox = (uint32_t)j;
        }
    }
    *eip += (size_t)n;
    *cip = ci;
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

/* A box while its key's boxes are sorted by offsets (then cand). */
struct srt {
    int64_t *w;
    int ndim;
};

static int cmp_srt(const void *a, const void *b)
{
    const struct srt *x = a, *y = b;
    const int64_t *xo = x->w + 1, *yo = y->w + 1;
    int d;
    for (d = 0; d < x->ndim; d++)
        if (xo[d] != yo[d])
            return xo[d] < yo[d] ? -1 : 1;
    return BOX_CAND(x->w) < BOX_CAND(y->w)   ? -1
           : BOX_CAND(x->w) > BOX_CAND(y->w) ? 1
                                             : 0;
}

/* A holder of a replicated chunk. */
struct hold {
    uint32_t ci;
    uint32_t rank;
};

/* A replicated chunk (entry k, chunk j; id: its place among all chunks)
 * awaiting its writer: holders hold[h0 .. h0+nh). */
struct rep {
    uint64_t weight;
    uint32_t id;
    uint32_t h0;
    uint32_t nh;
    uint32_t k;
    uint32_t j;
};

static int cmp_rep(const void *a, const void *b)
{
    const struct rep *x = a, *y = b;
    if (x->weight != y->weight)
        return x->weight > y->weight ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

struct build {
    struct gp *p;
    struct dcp_metadata *md;
    struct sorted_key *sk;
    size_t *cbase; /* per md entry: its chunks' place in md->chunk_block */
    struct srt *srt;
    /* Radix sort buffers (sort_boxes), as many as srt. */
    struct srt *srt2;
    uint64_t *rkey[2];
    uint32_t *ridx[2];
    /* Per cand: (md entry + 1) << 32 | chunk of the chunk it writes, or
     * 0: what make_recs lists. */
    uint64_t *kj;
    size_t *nrec; /* per rank: records it writes (at r + 1) */
    struct rep *reps;
    size_t nreps;
    struct hold *hold;
    size_t nhold;
    uint32_t nchunk; /* chunks made so far */
    uint64_t dsize;  /* the current entry's dtype size */
    uint64_t *load;
    /* Only with a hook (gp.hook), per chunk id (cbase[k] + j): the
     * writer's cand and rank, and the chunk's rep + 1 (0: one holder). */
    uint32_t *wci;
    int32_t *wrank;
    uint32_t *crep;
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

/* Gives chunk j of entry k to the writer h. */
static void set_writer(struct build *b, uint32_t k, uint32_t j,
                       const struct hold *h, uint64_t weight)
{
    b->load[h->rank] += weight;
    b->kj[h->ci] = ((uint64_t)k + 1) << 32 | j;
    b->nrec[h->rank + 1]++;
    if (b->wci) {
        b->wci[b->cbase[k] + j] = h->ci;
        b->wrank[b->cbase[k] + j] = (int32_t)h->rank;
    }
}

/* ------------------------------------------------- the hook's view */

int dcp__pl_view_writer(const struct pl_view *v, uint32_t k, uint32_t j)
{
    const struct build *b = (const struct build *)v;
    if (k >= b->md->n || j >= b->md->e[k].nchunks)
        return -1;
    return b->wrank[b->cbase[k] + j];
}

size_t dcp__pl_view_holders(const struct pl_view *v, uint32_t k, uint32_t j,
                            int *ranks, size_t cap)
{
    const struct build *b = (const struct build *)v;
    size_t cid, n, i;
    const struct rep *r;
    if (k >= b->md->n || j >= b->md->e[k].nchunks)
        return 0;
    cid = b->cbase[k] + j;
    if (!b->crep[cid]) {
        if (cap)
            ranks[0] = b->wrank[cid];
        return 1;
    }
    r = &b->reps[b->crep[cid] - 1];
    n = r->nh;
    for (i = 0; i < n && i < cap; i++)
        ranks[i] = (int)b->hold[r->h0 + i].rank;
    return n;
}

int dcp__pl_view_set_writer(struct pl_view *v, uint32_t k, uint32_t j,
                            int rank)
{
    struct build *b = (struct build *)v;
    size_t cid, i;
    const struct rep *r;
    int old;
    if (k >= b->md->n || j >= b->md->e[k].nchunks)
        return DCP_EINVAL;
    cid = b->cbase[k] + j;
    old = b->wrank[cid];
    if (rank == old)
        return DCP_OK;
    if (!b->crep[cid])
        return DCP_EINVAL; /* one holder: no choice */
    r = &b->reps[b->crep[cid] - 1];
    for (i = 0; i < r->nh; i++)
        if ((int)b->hold[r->h0 + i].rank == rank)
            break;
    if (i == r->nh)
        return DCP_EINVAL; /* rank does not hold that chunk */
    b->load[old] -= r->weight;
    b->kj[b->wci[cid]] = 0;
    b->nrec[old + 1]--;
    set_writer(b, k, j, &b->hold[r->h0 + i], r->weight);
    return DCP_OK;
}

/* After spread: each replicated chunk's rep, then the hook. */
static int run_hook(struct build *b)
{
    size_t i;
    for (i = 0; i < b->nreps; i++)
        b->crep[b->cbase[b->reps[i].k] + b->reps[i].j] = (uint32_t)i + 1;
    return b->p->hook(b->p->hook_ud, (struct pl_view *)b, b->md);
}

/* Records the holders hold[h0..nhold) of chunk j of entry k: one writes it
 * now, or several wait for the spreading pass. */
static void place(struct build *b, uint32_t k, uint32_t j, size_t h0,
                  uint64_t weight)
{
    size_t nh = b->nhold - h0;
    uint32_t id = b->nchunk++;
    if (nh == 1) {
        set_writer(b, k, j, &b->hold[h0], weight);
        b->nhold = h0;
        return;
    }
    b->reps[b->nreps].weight = weight;
    b->reps[b->nreps].id = id;
    b->reps[b->nreps].h0 = (uint32_t)h0;
    b->reps[b->nreps].nh = (uint32_t)nh;
    b->reps[b->nreps].k = k;
    b->reps[b->nreps].j = j;
    b->nreps++;
}

/* Appends to e a chunk with the offsets and sizes of box w: they stay in
 * the box array (md->ints), in entry order, so every later pass over the
 * chunks (tiling check, encoding twice) reads them in sequence. */
static void add_chunk(struct md_entry *e, int64_t *w, int slot)
{
    struct md_chunk *c = &e->chunks[e->nchunks++];
    c->off = w + 1;
    c->size = c->off + slot;
}

/* One group of boxes with equal offsets, srt[a..z): checks it and makes it
 * one chunk of entry k. */
static int group_chunk(struct build *b, uint32_t k, size_t a, size_t z)
{
    struct gp *p = b->p;
    struct md_entry *e = &b->md->e[k];
    int nd = e->ndim, slot = nd ? nd : 1;
    size_t m, h0 = b->nhold, first = SIZE_MAX, prev = SIZE_MAX;
    int64_t *src = NULL;
    uint64_t numel = 0;
    for (m = a; m < z; m++) {
        const int64_t *w = b->srt[m].w, *wf, *wp;
        uint64_t vol = dcp__box_numel(nd, w + 1 + slot);
        if (!vol)
            continue;
        if (first == SIZE_MAX) {
            first = prev = m;
            numel = vol;
            continue;
        }
        wf = b->srt[first].w;
        wp = b->srt[prev].w;
        if (!dcp__same_ints(w + 1 + slot, wf + 1 + slot, nd))
            return dcp__err(p->err, DCP_EPLAN,
                            "'%s': boxes of ranks %u and %u overlap (same "
                            "offsets, different sizes)",
                            e->key, BOX_RANK(wf), BOX_RANK(w));
        if (BOX_RANK(wp) == BOX_RANK(w))
            return dcp__err(p->err, DCP_EPLAN,
                            "'%s': rank %u holds the same box twice", e->key,
                            BOX_RANK(w));
        prev = m;
    }
    for (m = a; m < z; m++) {
        int64_t *w = b->srt[m].w;
        if (first != SIZE_MAX && !dcp__box_numel(nd, w + 1 + slot))
            continue; /* empty beside a non-empty box: nothing to store */
        if (b->nhold > h0 && b->hold[b->nhold - 1].rank == BOX_RANK(w))
            continue;
        if (b->nhold == h0)
            src = w;
        b->hold[b->nhold].ci = BOX_CAND(w);
        b->hold[b->nhold++].rank = BOX_RANK(w);
    }
    add_chunk(e, src, slot);
    place(b, k, (uint32_t)e->nchunks - 1, h0, numel * b->dsize + 1);
    return DCP_OK;
}

/* A group of one box, w: the chunk, written by its holder. */
static void one_chunk(struct build *b, uint32_t k, struct md_entry *e,
                      int64_t *w, int slot)
{
    struct hold h;
    h.ci = BOX_CAND(w);
    h.rank = BOX_RANK(w);
    add_chunk(e, w, slot);
    b->nchunk++;
    set_writer(b, k, (uint32_t)e->nchunks - 1, &h,
               dcp__box_numel(e->ndim, w + 1 + slot) * b->dsize + 1);
}

/*
 * Sorts srt[0..n), in cand order, by offsets then cand (cmp_srt): a stable
 * LSD radix sort, a byte at a time, of the offsets read as one mixed-radix
 * number (offset d is at most shape[d], so the digits have shape[d] + 1
 * values and equal offsets make equal numbers). In O(n) where qsort took
 * most of the plan's time for 2-D meshes whose ranks list the boxes out of
 * order; qsort still serves shapes too large for 64 bits.
 */
static void sort_boxes(struct build *b, size_t n, const struct md_entry *e)
{
    uint64_t mult[DCP_MAX_NDIM], top = 1, *rk = b->rkey[0], *rk2 = b->rkey[1];
    uint32_t *ri = b->ridx[0], *ri2 = b->ridx[1];
    size_t i, cnt[256];
    int d, sh;
    for (d = e->ndim - 1; d >= 0; d--) {
        mult[d] = top;
        if (dcp__mul_overflow_u64(top, (uint64_t)e->shape[d] + 1, &top)) {
            qsort(b->srt, n, sizeof(*b->srt), cmp_srt);
            return;
        }
    }
    for (i = 0; i < n; i++) {
        uint64_t v = 0;
        for (d = 0; d < e->ndim; d++)
            v += (uint64_t)b->srt[i].w[1 + d] * mult[d];
        rk[i] = v;
        ri[i] = (uint32_t)i;
    }
    for (sh = 0; sh < 64 && (top - 1) >> sh; sh += 8) {
        uint64_t *tk;
        uint32_t *ti;
        size_t at = 0;
        memset(cnt, 0, sizeof(cnt));
        for (i = 0; i < n; i++)
            cnt[(rk[i] >> sh) & 0xff]++;
        for (i = 0; i < 256; i++) {
            size_t c = cnt[i];
            cnt[i] = at;
            at += c;
        }
        for (i = 0; i < n; i++) {
            size_t to = cnt[(rk[i] >> sh) & 0xff]++;
            rk2[to] = rk[i];
            ri2[to] = ri[i];
        }
        tk = rk, rk = rk2, rk2 = tk;
        ti = ri, ri = ri2, ri2 = ti;
    }
    for (i = 0; i < n; i++)
        b->srt2[i] = b->srt[ri[i]];
    memcpy(b->srt, b->srt2, n * sizeof(*b->srt));
}

static int build_tensor(struct build *b, uint32_t k, const struct gkey *gk)
{
    struct gp *p = b->p;
    struct md_entry *e = &b->md->e[k];
    int64_t *w = p->box + gk->base;
    size_t n = gk->ncand, i, a, z, sw = BOX_WORDS(e->ndim ? e->ndim : 1);
    int nd = e->ndim, rc;
    for (i = 0; i < n; i++) {
        b->srt[i].w = w + i * sw;
        b->srt[i].ndim = nd;
    }
    /* The boxes are in cand order: sorted when their offsets are (row
     * sharding, ranks in order); else sort them. */
    for (i = 1; i < n && cmp_srt(&b->srt[i - 1], &b->srt[i]) < 0; i++)
        ;
    if (i < n)
        sort_boxes(b, n, e);
    b->dsize = dcp_dtype_size(e->dtype);
    for (a = 0; a < n; a = z) {
        for (z = a + 1; z < n; z++)
            if (!dcp__same_ints(b->srt[a].w + 1, b->srt[z].w + 1, nd))
                break;
        if (z == a + 1) { /* the usual case: no replicas */
            one_chunk(b, k, e, b->srt[a].w, nd ? nd : 1);
            continue;
        }
        rc = group_chunk(b, k, a, z);
        if (rc != DCP_OK)
            return rc;
    }
    if (p->policy & PL_NO_TILING)
        return DCP_OK; /* one rank of a rank-local save (plan.h) */
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
    const int64_t *w = b->p->box + gk->base;
    size_t i, h0 = b->nhold;
    for (i = 0; i < gk->ncand; i++) {
        b->hold[b->nhold].ci = BOX_CAND(w + i);
        b->hold[b->nhold++].rank = BOX_RANK(w + i);
    }
    e->nchunks = 1;
    place(b, k, 0, h0, gk->vsize + 1);
    return DCP_OK;
}

static int build_entry(struct build *b, uint32_t k, const struct gkey *gk)
{
    struct md_entry *e = &b->md->e[k];
    int rc;
    e->key = dcp__strdup(gk->key);
    e->chunks = b->md->chunk_block + b->cbase[k];
    if (!e->key)
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

/* Gives each replicated chunk to its least-loaded holder, largest first
 * (or, with PL_DEDUP_LOWEST, to its lowest holder). */
static void spread(struct build *b)
{
    int lowest = (b->p->policy & PL_DEDUP_LOWEST) != 0;
    size_t i, h;
    if (b->nreps > 1)
        qsort(b->reps, b->nreps, sizeof(*b->reps), cmp_rep);
    for (i = 0; i < b->nreps; i++) {
        const struct rep *r = &b->reps[i];
        const struct hold *best = &b->hold[r->h0];
        for (h = r->h0 + 1; h < (size_t)r->h0 + r->nh; h++) {
            const struct hold *o = &b->hold[h];
            if (lowest) {
                if (o->rank < best->rank)
                    best = o;
            } else if (b->load[o->rank] < b->load[best->rank] ||
                (b->load[o->rank] == b->load[best->rank] &&
                 o->rank < best->rank))
                best = o;
        }
        set_writer(b, r->k, r->j, best, r->weight);
    }
}

/* Fills g->recs: each rank's records, values first, then tensors, each in
 * state order (as torch's writer orders an item list). The cands are in
 * (rank, entry, box) order already, so two passes over each rank's list
 * its records without sorting. */
static int make_recs(struct build *b, struct pl_global *g)
{
    const struct gp *p = b->p;
    size_t i, n = 0;
    int r, pass;
    for (r = 0; r < g->nranks; r++)
        b->nrec[r + 1] += b->nrec[r];
    g->recs = huge_array(b->nrec[g->nranks], sizeof(*g->recs), 0);
    if (!g->recs)
        return DCP_ENOMEM;
    g->recbase = b->nrec;
    b->nrec = NULL;
    for (r = 0; r < g->nranks; r++) {
        for (pass = 0; pass < 2; pass++) {
            for (i = p->rbase[r]; i < p->rbase[r + 1]; i++) {
                uint64_t kj = b->kj[i];
                uint32_t k = (uint32_t)(kj >> 32) - 1;
                struct pl_rec *rec;
                if (!kj || b->md->e[k].is_tensor != pass)
                    continue;
                rec = &g->recs[n++];
                rec->lent = p->cands[i].lent;
                rec->lbox = p->cands[i].lbox;
                rec->k = k;
                rec->j = (uint32_t)kj;
                rec->tensor = (uint32_t)pass;
            }
        }
    }
    return DCP_OK;
}

/*
 * Bytes left free after the i-th slice (of n bytes) of an array that is
 * written or read at the same place of every slice in turn, such as rank
 * r's box (or chunk) of every key: slices of equal sizes, multiples of a
 * power of two, would put all those places in a few cache sets and take a
 * miss on each. A few cache lines, varying with i, spread them.
 */
static size_t slice_pad(size_t i, size_t n)
{
    return n < 2048 ? 0 : 64 * (1 + i % 13);
}

/* Sorts the keys (b->sk) and gives each its place in the box array. */
static int sort_keys(struct build *b)
{
    struct gp *p = b->p;
    size_t i, at = 0, ch = 0;
    b->sk = dcp__malloc((p->nkeys ? p->nkeys : 1) * sizeof(*b->sk));
    if (!b->sk)
        return DCP_ENOMEM;
    for (i = 0; i < p->nkeys; i++) {
        b->sk[i].key = p->keys[i].key;
        b->sk[i].g = (uint32_t)i;
    }
    if (p->nkeys > 1)
        qsort(b->sk, p->nkeys, sizeof(*b->sk), cmp_sorted_key);
    b->cbase = dcp__malloc((p->nkeys + 1) * sizeof(*b->cbase));
    if (!b->cbase)
        return DCP_ENOMEM;
    for (i = 0; i < p->nkeys; i++) {
        struct gkey *k = &p->keys[b->sk[i].g];
        size_t n =
            k->ncand * (k->is_tensor ? BOX_WORDS(k->ndim ? k->ndim : 1) : 1);
        k->base = at;
        at += n + slice_pad(i, n * sizeof(int64_t)) / sizeof(int64_t);
        /* Entry i's chunks (at most one per box; a value has one). */
        b->cbase[i] = ch;
        n = k->ncand ? k->ncand : 1;
        ch += n + (slice_pad(i, n * sizeof(struct md_chunk)) +
                   sizeof(struct md_chunk) - 1) /
                      sizeof(struct md_chunk);
    }
    b->cbase[p->nkeys] = ch;
    p->nwords = at;
    return DCP_OK;
}

/* The second pass: the box array and the cands. */
static int fill_all(struct gp *p, const uint8_t *blobs, const size_t *lens,
                    const size_t *displs)
{
    size_t *cur, i, ei = 0;
    uint32_t ci = 0;
    int r;
    p->box = huge_array(p->nwords, sizeof(*p->box), 0);
    p->cands = huge_array(p->ncands, sizeof(*p->cands), 0);
    cur = dcp__malloc((p->nkeys ? p->nkeys : 1) * sizeof(*cur));
    if (!p->box || !p->cands || !cur) {
        dcp__free(cur);
        return DCP_ENOMEM;
    }
    for (i = 0; i < p->nkeys; i++)
        cur[i] = p->keys[i].base;
    for (r = 0; r < p->nranks; r++)
        fill_rank(p, r, blobs + displs[r], lens[r], cur, &ei, &ci);
    dcp__free(cur);
    return DCP_OK;
}

static int build_all(struct gp *p, const uint8_t *blobs, const size_t *lens,
                     const size_t *displs, struct pl_global *g)
{
    struct build b;
    size_t i, maxn = 1;
    int rc = DCP_ENOMEM;
    memset(&b, 0, sizeof(b));
    b.p = p;
    b.md = g->md;
    if (sort_keys(&b) != DCP_OK || fill_all(p, blobs, lens, displs) != DCP_OK)
        goto out;
    dcp__free(p->ents);
    p->ents = NULL;
    for (i = 0; i < p->nkeys; i++)
        if (p->keys[i].ncand > maxn)
            maxn = p->keys[i].ncand;
    b.md->e = dcp__calloc(p->nkeys ? p->nkeys : 1, sizeof(*b.md->e));
    b.md->chunk_block =
        huge_array(b.cbase[p->nkeys], sizeof(struct md_chunk), 1);
    b.srt = dcp__malloc(maxn * sizeof(*b.srt));
    b.srt2 = dcp__malloc(maxn * sizeof(*b.srt2));
    b.rkey[0] = dcp__malloc(2 * maxn * sizeof(*b.rkey[0]));
    b.ridx[0] = dcp__malloc(2 * maxn * sizeof(*b.ridx[0]));
    b.kj = huge_array(p->ncands, sizeof(*b.kj), 1);
    b.nrec = dcp__calloc((size_t)p->nranks + 1, sizeof(*b.nrec));
    b.reps = huge_array(p->ncands, sizeof(*b.reps), 0);
    b.hold = huge_array(p->ncands, sizeof(*b.hold), 0);
    b.load = dcp__calloc((size_t)p->nranks, sizeof(*b.load));
    if (p->hook) {
        b.wci = huge_array(b.cbase[p->nkeys], sizeof(*b.wci), 1);
        b.wrank = huge_array(b.cbase[p->nkeys], sizeof(*b.wrank), 1);
        b.crep = huge_array(b.cbase[p->nkeys], sizeof(*b.crep), 1);
    }
    if (!b.md->e || !b.md->chunk_block || !b.srt || !b.srt2 || !b.rkey[0] ||
        !b.ridx[0] || !b.kj || !b.nrec || !b.reps || !b.hold || !b.load ||
        (p->hook && (!b.wci || !b.wrank || !b.crep)))
        goto out;
    b.rkey[1] = b.rkey[0] + maxn;
    b.ridx[1] = b.ridx[0] + maxn;
    /* The chunks will point into the box array: md owns it (gp.box still
     * reads it). */
    g->md->ints = p->box;
    rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < p->nkeys; i++) {
        b.md->n = i + 1;
        rc = build_entry(&b, (uint32_t)i, &p->keys[b.sk[i].g]);
    }
    if (rc != DCP_OK)
        goto out_rc;
    spread(&b);
    if (p->hook)
        rc = run_hook(&b);
    if (rc == DCP_OK)
        rc = make_recs(&b, g);
    if (rc == DCP_OK) {
        g->bytes = b.load;
        b.load = NULL;
    }
out:
    if (rc == DCP_ENOMEM)
        rc = dcp__err(p->err, rc, "out of memory planning the save");
out_rc:
    dcp__free(b.sk);
    dcp__free(b.cbase);
    dcp__free(b.srt);
    dcp__free(b.srt2);
    dcp__free(b.rkey[0]);
    dcp__free(b.ridx[0]);
    dcp__free(b.kj);
    dcp__free(b.nrec);
    dcp__free(b.reps);
    dcp__free(b.hold);
    dcp__free(b.load);
    dcp__free(b.wci);
    dcp__free(b.wrank);
    dcp__free(b.crep);
    return rc;
}

int dcp__plan_global(const uint8_t *blobs, const size_t *lens,
                     const size_t *displs, int nranks, struct pl_global *g,
                     struct dcp_err *err)
{
    return dcp__plan_global_ex(blobs, lens, displs, nranks, 0, NULL, NULL, g,
                               err);
}

int dcp__plan_global_ex(const uint8_t *blobs, const size_t *lens,
                        const size_t *displs, int nranks, unsigned policy,
                        pl_hook_fn hook, void *hook_ud, struct pl_global *g,
                        struct dcp_err *err)
{
    struct gp p;
    int r, rc = DCP_OK;
    memset(g, 0, sizeof(*g));
    memset(&p, 0, sizeof(p));
    p.policy = policy;
    p.hook = hook;
    p.hook_ud = hook_ud;
    p.nranks = nranks;
    p.err = err;
    g->nranks = nranks;
    p.rbase = dcp__calloc((size_t)nranks + 1, sizeof(*p.rbase));
    if (!p.rbase)
        rc = dcp__err(err, DCP_ENOMEM, "out of memory planning the save");
    for (r = 0; rc == DCP_OK && r < nranks; r++)
        rc = parse_rank(&p, r, blobs + displs[r], lens[r]);
    if (rc == DCP_OK) {
        g->md = dcp__calloc(1, sizeof(*g->md));
        if (g->md)
            g->md->version = dcp__strdup("1.0.0");
        if (!g->md || !g->md->version)
            rc = dcp__err(err, DCP_ENOMEM, "out of memory planning the save");
    }
    if (rc == DCP_OK)
        rc = build_all(&p, blobs, lens, displs, g);
    dcp__free(p.keys);
    dcp__htab_release(&p.tab);
    dcp__free(p.ents);
    dcp__free(p.rbase);
    dcp__free(p.hint);
    if (!g->md || g->md->ints != p.box)
        dcp__free(p.box);
    dcp__free(p.cands);
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
    uint8_t *p;
    if (n > (SIZE_MAX / UV_MAX - 1) / 2 ||
        dcp__buf_reserve(out, (2 * n + 1) * UV_MAX) != DCP_OK)
        return DCP_ENOMEM;
    p = put_uv_raw(out->p + out->len, n);
    for (i = 0; i < 2 * n; i++)
        p = put_uv_raw(p, offlen[i]);
    out->len = (size_t)(p - out->p);
    return DCP_OK;
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
        /* The next rank's record of this key is often the next chunk, a
         * rank's worth of records later (see fill_rank). */
        __builtin_prefetch(c + 2, 1);
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
