/*
 * dcp_load_file: one torch.save or safetensors file straight into the
 * sharded buffers of every rank.
 *
 *  1. Every rank checks the file name is the same; each tries to open and
 *     parse the file and computes a fingerprint of what it parsed (keys,
 *     dtypes, shapes, byte offsets); rank 0's is broadcast. When every rank
 *     parsed the same file (and DCP_LOAD_FILE_ROOT_READS is not set), each
 *     rank reads its own byte ranges ("own" mode); otherwise rank 0 reads
 *     for everyone ("root" mode).
 *  2. Each rank describes its request (keys, kinds, dtypes, shapes, boxes)
 *     to rank 0, which checks every request against the file (missing and
 *     unexpected keys, kinds, shapes, dtypes) and answers each rank: per
 *     entry, found or missing, the stored dtype, a value's pickle; the
 *     unexpected keys; the number of data rounds. The verdict is shared.
 *  3. Data. Each box is cut into slabs that span the box's whole extent
 *     after a split dimension (contiguous in the box's C order) of at most
 *     S bytes. Own mode: each rank reads its slabs itself. Root mode: in
 *     each round rank 0 reads the next slab of every rank (S = 64 MiB /
 *     ranks, so a round holds at most 64 MiB) and scatters them (scatterv);
 *     a rank receives straight into its buffer when no cast is needed.
 *  4. All ranks agree on the outcome.
 */
#include "ctx.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "comm.h"
#include "dtype.h"
#include "dcp/dcp_convert.h"
#include "srcfile.h"
#include "state.h"
#include "value.h"

#define ROUND_BYTES ((uint64_t)64 << 20)
#define MAX_PICKLE  ((uint64_t)1 << 30)

/* ----------------------------------------------------- wire helpers */

struct rdr {
    const uint8_t *p;
    size_t len, pos;
    int bad;
};

static uint64_t get_u64(struct rdr *r)
{
    uint64_t v;
    if (r->len - r->pos < 8) {
        r->bad = 1;
        return 0;
    }
    v = dcp__le64(r->p + r->pos);
    r->pos += 8;
    return v;
}

static const uint8_t *get_bytes(struct rdr *r, size_t n)
{
    const uint8_t *p = r->p + r->pos;
    if (r->len - r->pos < n) {
        r->bad = 1;
        return NULL;
    }
    r->pos += n;
    return p;
}

/* A request entry as rank 0 sees it. */
struct req {
    char *key;
    int is_tensor;
    dcp_dtype dtype;
    int ndim;
    int64_t shape[DCP_MAX_NDIM];
    size_t nboxes;
    int64_t *boxes; /* per box: off[ndim], size[ndim] */
};

static int put_request(const dcp_state *st, struct dcp_buf *b)
{
    size_t i, j;
    int d, rc = dcp__buf_put_le64(b, st->n);
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        const struct st_entry *e = &st->e[i];
        size_t kl = strlen(e->key);
        rc = dcp__buf_put_le64(b, kl);
        if (rc == DCP_OK)
            rc = dcp__buf_put(b, e->key, kl);
        if (rc == DCP_OK)
            rc = dcp__buf_put_le64(b, (uint64_t)e->is_tensor |
                                          ((uint64_t)e->dtype << 8) |
                                          ((uint64_t)e->ndim << 16));
        for (d = 0; rc == DCP_OK && d < e->ndim; d++)
            rc = dcp__buf_put_le64(b, (uint64_t)e->shape[d]);
        if (rc == DCP_OK)
            rc = dcp__buf_put_le64(b, e->is_tensor ? e->nboxes : 0);
        for (j = 0; rc == DCP_OK && e->is_tensor && j < e->nboxes; j++)
            for (d = 0; rc == DCP_OK && d < 2 * e->ndim; d++)
                rc = dcp__buf_put_le64(
                    b, (uint64_t)(d < e->ndim ? e->boxes[j].off[d]
                                              : e->boxes[j].size[d - e->ndim]));
    }
    return rc;
}

static void free_reqs(struct req *r, size_t n)
{
    size_t i;
    for (i = 0; r && i < n; i++) {
        dcp__free(r[i].key);
        dcp__free(r[i].boxes);
    }
    dcp__free(r);
}

static int get_request(const uint8_t *p, size_t len, struct req **out,
                       size_t *n, struct dcp_err *err)
{
    struct rdr r = {p, len, 0, 0};
    uint64_t cnt = get_u64(&r), i, j;
    struct req *q;
    int d;
    *out = NULL;
    *n = 0;
    if (r.bad || cnt > len / 24)
        return dcp__err(err, DCP_EFORMAT, "malformed load request");
    q = dcp__calloc(cnt ? (size_t)cnt : 1, sizeof(*q));
    if (!q)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < cnt && !r.bad; i++) {
        uint64_t kl = get_u64(&r), bits, nb;
        const uint8_t *k = get_bytes(&r, (size_t)kl);
        if (!k || !(q[i].key = dcp__strndup((const char *)k, (size_t)kl)))
            break;
        bits = get_u64(&r);
        q[i].is_tensor = (int)(bits & 1);
        q[i].dtype = (dcp_dtype)((bits >> 8) & 0xFF);
        q[i].ndim = (int)((bits >> 16) & 0xFF);
        if (q[i].ndim > DCP_MAX_NDIM) {
            r.bad = 1;
            break;
        }
        for (d = 0; d < q[i].ndim; d++)
            q[i].shape[d] = (int64_t)get_u64(&r);
        nb = get_u64(&r);
        if (r.bad || nb > (len - r.pos) / 8 + 1)
            break;
        q[i].nboxes = (size_t)nb;
        q[i].boxes = dcp__calloc((size_t)nb * 2 * (size_t)q[i].ndim + 1,
                                 sizeof(int64_t));
        if (!q[i].boxes)
            break;
        for (j = 0; j < nb * 2 * (uint64_t)q[i].ndim; j++)
            q[i].boxes[j] = (int64_t)get_u64(&r);
    }
    if (r.bad || i < cnt) {
        free_reqs(q, (size_t)cnt);
        return dcp__err(err, r.bad ? DCP_EFORMAT : DCP_ENOMEM,
                        "malformed load request");
    }
    *out = q;
    *n = (size_t)cnt;
    return DCP_OK;
}

/* ------------------------------------------------------------ slabs */

/* Sub-boxes of a box of sizes size (element size es) of at most cap
 * bytes, spanning the box after a split dimension k: each is contiguous
 * in the box's C order, and they follow each other. */
struct slab_it {
    int nd, k;
    int64_t size[DCP_MAX_NDIM];
    int64_t off[DCP_MAX_NDIM];
    int64_t sz[DCP_MAX_NDIM];
    int64_t m;
    uint64_t lin; /* linear element offset of the slab in the box */
    uint64_t n;   /* elements in the slab */
    int done;
};

static void slab_fix(struct slab_it *it)
{
    if (it->nd)
        it->sz[it->k] = it->size[it->k] - it->off[it->k] < it->m
                            ? it->size[it->k] - it->off[it->k]
                            : it->m;
    it->n = dcp__box_numel(it->nd, it->sz);
}

static void slab_first(struct slab_it *it, int nd, const int64_t *size,
                       size_t es, uint64_t cap)
{
    int64_t row = 1;
    int d;
    memset(it, 0, sizeof(*it));
    it->nd = nd;
    memcpy(it->size, size, (size_t)nd * sizeof(int64_t));
    for (d = 0; d < nd; d++)
        if (size[d] == 0)
            it->done = 1;
    if (it->done)
        return;
    for (it->k = 0; it->k < nd; it->k++) {
        row = 1;
        for (d = it->k + 1; d < nd; d++)
            row *= size[d];
        if ((uint64_t)row * es <= cap)
            break;
    }
    it->m = nd ? (int64_t)(cap / ((uint64_t)row * es)) : 1;
    if (it->m < 1)
        it->m = 1;
    for (d = 0; d < nd; d++)
        it->sz[d] = d < it->k ? 1 : size[d];
    slab_fix(it);
}

static void slab_next(struct slab_it *it)
{
    int d;
    it->lin += it->n;
    if (!it->nd) {
        it->done = 1;
        return;
    }
    it->off[it->k] += it->sz[it->k];
    if (it->off[it->k] >= it->size[it->k]) {
        it->off[it->k] = 0;
        for (d = it->k - 1; d >= 0; d--) {
            if (++it->off[d] < it->size[d])
                break;
            it->off[d] = 0;
        }
        if (d < 0) {
            it->done = 1;
            return;
        }
    }
    slab_fix(it);
}

/* --------------------------------------------------------- the call */

struct lf {
    dcp_ctx *ctx;
    struct dcp_err *err;
    dcp_state *st;
    unsigned flags;
    int rank, size;
    struct src_index ix;
    int have;     /* ix is open */
    int own;      /* own mode */
    uint64_t cap; /* slab bytes */
    /* per state entry, from rank 0's answer */
    uint8_t *found;
    dcp_dtype *fdt;
    uint64_t rounds;
    uint8_t *stage;
};

static uint64_t fingerprint(const struct src_index *ix)
{
    uint64_t h = 1469598103934665603ull;
    size_t i;
    int d;
#define MIX(v) (h = (h ^ (uint64_t)(v)) * 1099511628211ull)
    for (i = 0; i < ix->n; i++) {
        const struct src_entry *e = &ix->e[i];
        const char *k = e->key;
        while (*k)
            MIX((unsigned char)*k++);
        MIX(e->is_tensor);
        MIX(e->dtype);
        MIX(e->ndim);
        for (d = 0; d < e->ndim; d++)
            MIX(e->shape[d]);
        MIX(e->base);
        MIX(e->storage_bytes);
    }
#undef MIX
    return h ? h : 1;
}

/* Rank 0: checks rank r's requests and writes its answer. */
static int answer(struct lf *lf, int r, const struct req *q, size_t nq,
                  uint8_t *asked, uint64_t *slabs, struct dcp_buf *out)
{
    struct dcp_err *err = lf->err;
    size_t i, j;
    int d, rc = dcp__buf_put_le64(out, nq);
    for (i = 0; rc == DCP_OK && i < nq; i++) {
        const struct src_entry *e = dcp__src_find(&lf->ix, q[i].key);
        struct dcp_buf pkl = {0};
        if (!e) {
            if (!(lf->flags & DCP_LOAD_PARTIAL))
                return dcp__err(err, DCP_EKEY,
                                "rank %d: missing key '%s' in '%s' "
                                "(DCP_LOAD_PARTIAL allows it)",
                                r, q[i].key, lf->ix.files[0]);
            rc = dcp__buf_put_le64(out, 0);
            continue;
        }
        asked[e - lf->ix.e] = 1;
        if (e->is_tensor != q[i].is_tensor)
            return dcp__err(err, DCP_EMISMATCH,
                            "rank %d: '%s' is a %s in the file, a %s in the "
                            "state",
                            r, q[i].key, e->is_tensor ? "tensor" : "value",
                            q[i].is_tensor ? "tensor" : "value");
        if (e->is_tensor) {
            int same = e->ndim == q[i].ndim;
            for (d = 0; same && d < e->ndim; d++)
                same = e->shape[d] == q[i].shape[d];
            if (!same)
                return dcp__err(err, DCP_EMISMATCH,
                                "rank %d: '%s': shape mismatch between the "
                                "file and the state",
                                r, q[i].key);
            if (e->dtype != q[i].dtype && !(lf->flags & DCP_LOAD_CAST))
                return dcp__err(err, DCP_EMISMATCH,
                                "rank %d: '%s': dtype mismatch: saved %s, "
                                "requested %s (DCP_LOAD_CAST converts)",
                                r, q[i].key, dcp_dtype_name(e->dtype),
                                dcp_dtype_name(q[i].dtype));
            if (!dcp__can_convert(q[i].dtype, e->dtype))
                return dcp__err(err, DCP_ENOTSUP,
                                "rank %d: '%s': cannot cast saved %s to "
                                "requested %s (torch does not convert it "
                                "either)",
                                r, q[i].key, dcp_dtype_name(e->dtype),
                                dcp_dtype_name(q[i].dtype));
            for (j = 0; j < q[i].nboxes; j++) {
                struct slab_it it;
                const int64_t *b = q[i].boxes + 2 * (size_t)q[i].ndim * j;
                for (slab_first(&it, q[i].ndim, b + q[i].ndim,
                                dcp_dtype_size(e->dtype), lf->cap);
                     !it.done; slab_next(&it))
                    (*slabs)++;
            }
            rc = dcp__buf_put_le64(out, 1 | ((uint64_t)e->dtype << 8));
            continue;
        }
        rc = dcp__value_pickle(e->value, &pkl);
        if (rc == DCP_OK)
            rc = dcp__buf_put_le64(out, 1 | ((uint64_t)pkl.len << 8));
        if (rc == DCP_OK)
            rc = dcp__buf_put(out, pkl.p, pkl.len);
        dcp__buf_free(&pkl);
    }
    return rc == DCP_OK ? DCP_OK : dcp__err(err, rc, "out of memory");
}

/* Rank 0: parses every rank's request, checks it, writes the answers
 * (each followed by the rounds and the unexpected keys). */
static int plan(struct lf *lf, const uint8_t *all, const size_t *lens,
                const size_t *displs, struct dcp_buf *ans, size_t *alens,
                size_t *adispl)
{
    uint8_t *asked = dcp__calloc(lf->ix.n ? lf->ix.n : 1, 1);
    uint64_t *slabs = dcp__calloc((size_t)lf->size, sizeof(uint64_t));
    struct dcp_buf tail = {0};
    uint64_t rounds = 0, nun = 0;
    size_t i;
    int r, rc = asked && slabs ? DCP_OK
                               : dcp__err(lf->err, DCP_ENOMEM, "out of memory");
    struct dcp_buf *parts = dcp__calloc((size_t)lf->size, sizeof(*parts));
    if (!parts && rc == DCP_OK)
        rc = dcp__err(lf->err, DCP_ENOMEM, "out of memory");
    for (r = 0; rc == DCP_OK && r < lf->size; r++) {
        struct req *q = NULL;
        size_t nq = 0;
        rc = get_request(all + displs[r], lens[r], &q, &nq, lf->err);
        if (rc == DCP_OK)
            rc = answer(lf, r, q, nq, asked, &slabs[r], &parts[r]);
        free_reqs(q, nq);
        if (rc == DCP_OK && slabs[r] > rounds)
            rounds = slabs[r];
    }
    for (i = 0; rc == DCP_OK && i < lf->ix.n; i++)
        nun += !asked[i];
    if (rc == DCP_OK && nun &&
        !(lf->flags & (DCP_LOAD_PARTIAL | DCP_LOAD_ALLOW_UNEXPECTED))) {
        for (i = 0; asked[i]; i++)
            ;
        rc = dcp__err(lf->err, DCP_EKEY,
                      "unexpected key '%s' in '%s' (%" PRIu64
                      " unexpected%s; DCP_LOAD_ALLOW_UNEXPECTED allows it)",
                      lf->ix.e[i].key, lf->ix.files[0], nun,
                      lf->size > 1 ? ", asked for by no rank" : "");
    }
    if (rc == DCP_OK) {
        rc = dcp__buf_put_le64(&tail, rounds);
        if (rc == DCP_OK)
            rc = dcp__buf_put_le64(&tail, nun);
        for (i = 0; rc == DCP_OK && i < lf->ix.n; i++) {
            if (asked[i])
                continue;
            rc = dcp__buf_put_le64(&tail, strlen(lf->ix.e[i].key));
            if (rc == DCP_OK)
                rc = dcp__buf_put(&tail, lf->ix.e[i].key,
                                  strlen(lf->ix.e[i].key));
        }
        for (r = 0; rc == DCP_OK && r < lf->size; r++) {
            alens[r] = parts[r].len + tail.len;
            adispl[r] = ans->len;
            rc = dcp__buf_put(ans, parts[r].p, parts[r].len);
            if (rc == DCP_OK)
                rc = dcp__buf_put(ans, tail.p, tail.len);
        }
        if (rc != DCP_OK)
            rc = dcp__err(lf->err, DCP_ENOMEM, "out of memory");
    }
    for (r = 0; parts && r < lf->size; r++)
        dcp__buf_free(&parts[r]);
    dcp__free(parts);
    dcp__buf_free(&tail);
    dcp__free(asked);
    dcp__free(slabs);
    return rc;
}

/* Every rank: applies rank 0's answer to its state. */
static int apply(struct lf *lf, const uint8_t *p, size_t len)
{
    struct rdr r = {p, len, 0, 0};
    dcp_ctx *ctx = lf->ctx;
    uint64_t n = get_u64(&r), i, nun;
    int rc = DCP_OK;
    if (r.bad || n != lf->st->n)
        return dcp__err(lf->err, DCP_EFORMAT, "malformed load answer");
    for (i = 0; rc == DCP_OK && i < n; i++) {
        struct st_entry *se = &lf->st->e[i];
        uint64_t bits = get_u64(&r);
        lf->found[i] = (uint8_t)(bits & 1);
        if (!lf->found[i]) {
            rc = dcp__ctx_report_add(ctx, DCP__REPORT_MISSING, se->key);
        } else if (se->is_tensor) {
            lf->fdt[i] = (dcp_dtype)(bits >> 8);
        } else {
            const uint8_t *pk = get_bytes(&r, (size_t)(bits >> 8));
            dcp_value *v = NULL;
            if (!pk)
                break;
            rc = dcp__value_unpickle(pk, (size_t)(bits >> 8), &v, lf->err);
            if (rc == DCP_OK) {
                dcp_value_free(se->value);
                se->value = v;
            }
        }
    }
    lf->rounds = get_u64(&r);
    nun = get_u64(&r);
    for (i = 0; rc == DCP_OK && !r.bad && i < nun; i++) {
        uint64_t kl = get_u64(&r);
        const uint8_t *k = get_bytes(&r, (size_t)kl);
        char *key;
        if (!k)
            break;
        key = dcp__strndup((const char *)k, (size_t)kl);
        rc = key ? dcp__ctx_report_add(ctx, DCP__REPORT_UNEXPECTED, key)
                 : DCP_ENOMEM;
        dcp__free(key);
    }
    if (rc == DCP_ENOMEM)
        return dcp__err(lf->err, rc, "out of memory");
    if (rc == DCP_OK && r.bad)
        return dcp__err(lf->err, DCP_EFORMAT, "malformed load answer");
    return rc;
}

/* Places a slab's bytes (stored dtype) into the box buffer; into a
 * strided box (dcp_state_add_tensor_strided) run by run. */
static void place(struct lf *lf, const struct st_entry *se, size_t i,
                  const struct st_box *b, const struct slab_it *it,
                  const void *src)
{
    size_t ds = dcp_dtype_size(se->dtype), ss = dcp_dtype_size(lf->fdt[i]);
    uint8_t *dst = (uint8_t *)b->buf + it->lin * ds;
    if (b->strided) {
        int64_t sstride[DCP_MAX_NDIM];
        struct box_runs r;
        dcp__box_cstrides(se->ndim, it->sz, sstride);
        dcp__box_runs_init(&r, se->ndim, it->sz, 0, sstride,
                           dcp__box_at(se->ndim, it->off, NULL, b->stride),
                           b->stride);
        while (dcp__box_runs_next(&r))
            dcp__convert((uint8_t *)b->buf + (size_t)r.dst * ds, se->dtype,
                         (const uint8_t *)src + (size_t)r.src * ss,
                         lf->fdt[i], (size_t)r.run);
        return;
    }
    if (src != dst)
        dcp__convert(dst, se->dtype, src, lf->fdt[i], (size_t)it->n);
}

/* Where a slab of box b is read: straight into b, or into the stage (a
 * cast, or a strided box). */
static uint8_t *slab_dst(struct lf *lf, const struct st_entry *se, size_t i,
                         const struct st_box *b, const struct slab_it *it)
{
    return lf->fdt[i] == se->dtype && !b->strided
               ? (uint8_t *)b->buf + it->lin * dcp_dtype_size(se->dtype)
               : lf->stage;
}

/* Own mode: this rank reads its slabs. */
static int read_own(struct lf *lf)
{
    size_t i, j;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < lf->st->n; i++) {
        const struct st_entry *se = &lf->st->e[i];
        const struct src_entry *e;
        if (!se->is_tensor || !lf->found[i])
            continue;
        e = dcp__src_find(&lf->ix, se->key);
        for (j = 0; rc == DCP_OK && j < se->nboxes; j++) {
            const struct st_box *b = &se->boxes[j];
            int64_t goff[DCP_MAX_NDIM];
            struct slab_it it;
            int d;
            for (slab_first(&it, se->ndim, b->size, dcp_dtype_size(lf->fdt[i]),
                            lf->cap);
                 rc == DCP_OK && !it.done; slab_next(&it)) {
                uint8_t *dst = slab_dst(lf, se, i, b, &it);
                for (d = 0; d < se->ndim; d++)
                    goff[d] = b->off[d] + it.off[d];
                rc = dcp__src_read_box(&lf->ix, e, goff, it.sz, dst,
                                       lf->cap * 4, lf->err);
                if (rc == DCP_OK)
                    place(lf, se, i, b, &it, dst);
            }
        }
    }
    return rc;
}

/* Root mode: the slab cursor of one rank. */
struct cursor {
    size_t entry, box;
    struct slab_it it;
    int active;
    /* root: the request being served */
    struct req *q;
    size_t nq;
};

/* Moves c to its next slab (or the first one); 0 when none is left.
 * boxes/dtypes come from the state (own rank) or the request (root). */
static int cur_advance(struct cursor *c, size_t n,
                       int (*box_of)(void *, size_t, size_t, int *,
                                     const int64_t **, size_t *),
                       void *arg, uint64_t cap)
{
    if (c->active) {
        slab_next(&c->it);
        if (!c->it.done)
            return 1;
        c->box++;
    }
    for (; c->entry < n; c->entry++, c->box = 0) {
        int nd;
        const int64_t *size;
        size_t es;
        while (box_of(arg, c->entry, c->box, &nd, &size, &es)) {
            slab_first(&c->it, nd, size, es, cap);
            if (!c->it.done) {
                c->active = 1;
                return 1;
            }
            c->box++;
        }
    }
    c->active = 0;
    return 0;
}

/* Box (entry, box) of this rank's state, for the cursor: 0 when none. */
static int own_box(void *arg, size_t i, size_t j, int *nd, const int64_t **size,
                   size_t *es)
{
    struct lf *lf = arg;
    const struct st_entry *se = &lf->st->e[i];
    if (!se->is_tensor || !lf->found[i] || j >= se->nboxes)
        return 0;
    *nd = se->ndim;
    *size = se->boxes[j].size;
    *es = dcp_dtype_size(lf->fdt[i]);
    return 1;
}

struct root_arg {
    struct lf *lf;
    struct req *q;
};

static int req_box(void *arg, size_t i, size_t j, int *nd, const int64_t **size,
                   size_t *es)
{
    struct root_arg *ra = arg;
    const struct req *q = &ra->q[i];
    const struct src_entry *e;
    if (!q->is_tensor || j >= q->nboxes)
        return 0;
    e = dcp__src_find(&ra->lf->ix, q->key);
    if (!e)
        return 0;
    *nd = q->ndim;
    *size = q->boxes + 2 * (size_t)q->ndim * j + q->ndim;
    *es = dcp_dtype_size(e->dtype);
    return 1;
}

static int root_rounds(struct lf *lf, const uint8_t *all, const size_t *lens,
                       const size_t *displs)
{
    struct cursor mine, *cs = NULL;
    struct root_arg *ra = NULL;
    size_t *slen = NULL, *sdis = NULL;
    uint8_t *send = NULL;
    uint64_t k;
    int r, rc = DCP_OK, rrc = DCP_OK;
    memset(&mine, 0, sizeof(mine));
    if (lf->rank == 0) {
        cs = dcp__calloc((size_t)lf->size, sizeof(*cs));
        ra = dcp__calloc((size_t)lf->size, sizeof(*ra));
        slen = dcp__calloc((size_t)lf->size, sizeof(*slen));
        sdis = dcp__calloc((size_t)lf->size, sizeof(*sdis));
        send = dcp__malloc((size_t)(lf->cap * (uint64_t)lf->size));
        if (!cs || !ra || !slen || !sdis || !send)
            rrc = dcp__err(lf->err, DCP_ENOMEM, "out of memory");
        for (r = 0; rrc == DCP_OK && r < lf->size; r++) {
            ra[r].lf = lf;
            rrc = get_request(all + displs[r], lens[r], &cs[r].q, &cs[r].nq,
                              lf->err);
            ra[r].q = cs[r].q;
        }
    }
    /* Every rank runs every round, even after a failure, so that no rank
     * waits forever; the failure is agreed on at the end. */
    for (k = 0; k < lf->rounds; k++) {
        int have = cur_advance(&mine, lf->st->n, own_box, lf, lf->cap);
        const struct st_entry *se = have ? &lf->st->e[mine.entry] : NULL;
        const struct st_box *b = have ? &se->boxes[mine.box] : NULL;
        size_t es = have ? dcp_dtype_size(lf->fdt[mine.entry]) : 0;
        uint8_t *dst = NULL;
        if (lf->rank == 0) {
            size_t pos = 0;
            for (r = 0; r < lf->size; r++) {
                struct cursor *c = &cs[r];
                slen[r] = 0;
                sdis[r] = pos;
                if (rrc != DCP_OK ||
                    !cur_advance(c, c->nq, req_box, &ra[r], lf->cap))
                    continue;
                {
                    const struct req *q = &c->q[c->entry];
                    const int64_t *bo = q->boxes + 2 * (size_t)q->ndim * c->box;
                    const struct src_entry *e = dcp__src_find(&lf->ix, q->key);
                    int64_t goff[DCP_MAX_NDIM];
                    int d;
                    for (d = 0; d < q->ndim; d++)
                        goff[d] = bo[d] + c->it.off[d];
                    slen[r] = (size_t)c->it.n * dcp_dtype_size(e->dtype);
                    rrc = dcp__src_read_box(&lf->ix, e, goff, c->it.sz,
                                            send + pos, lf->cap * 4, lf->err);
                    pos += slen[r];
                }
            }
        }
        if (have)
            dst = slab_dst(lf, se, mine.entry, b, &mine.it);
        rc = dcp__comm_scatterv(lf->ctx->comm, send, slen, sdis,
                                dst ? (void *)dst : (void *)lf->stage,
                                have ? (size_t)mine.it.n * es : 0, 0, lf->err);
        if (rc != DCP_OK)
            break; /* a transport failure: nothing more can be agreed */
        if (have)
            place(lf, se, mine.entry, b, &mine.it, dst);
    }
    for (r = 0; cs && r < lf->size; r++)
        free_reqs(cs[r].q, cs[r].nq);
    dcp__free(cs);
    dcp__free(ra);
    dcp__free(slen);
    dcp__free(sdis);
    dcp__free(send);
    return rc != DCP_OK ? rc : rrc;
}

static int lf_run(struct lf *lf, const char *file)
{
    dcp_ctx *ctx = lf->ctx;
    const dcp_comm *c = ctx->comm;
    struct dcp_buf req = {0}, ans = {0};
    uint8_t *all = NULL, *mine = NULL;
    size_t *lens = NULL, *displs = NULL, *alens = NULL, *adispl = NULL;
    size_t mlen = 0;
    int64_t fp[2] = {0, 0}, vis[1];
    struct dcp_err lerr;
    int rc, lrc;

    dcp__err_clear(&lerr);
    rc = dcp__comm_same_string(c, file, "file", lf->err);
    if (rc != DCP_OK)
        return rc;
    /* 1. who sees the file */
    lrc =
        (lf->flags & DCP_LOAD_FILE_ROOT_READS) && lf->rank != 0
            ? DCP_ENOENT
            : dcp__src_open(file, DCP_FORMAT_AUTO, MAX_PICKLE, &lf->ix, &lerr);
    if (lrc == DCP_OK && (lf->flags & DCP_LOAD_FILE_DEQUANT)) {
        lrc = dcp__src_dequant(&lf->ix, 128, &lerr);
        if (lrc != DCP_OK)
            dcp__src_close(&lf->ix);
    }
    lf->have = lrc == DCP_OK;
    if (lf->rank == 0)
        *lf->err = lerr;
    rc = dcp__comm_share_err(c, lf->rank == 0 ? lrc : DCP_OK, lf->err, 0);
    if (rc != DCP_OK)
        return rc;
    if (lf->have)
        fp[0] = (int64_t)(fingerprint(&lf->ix) >> 1);
    if (lf->rank == 0)
        fp[1] = fp[0];
    rc = dcp__comm_bcast(c, &fp[1], sizeof(fp[1]), 0, lf->err);
    if (rc != DCP_OK)
        return rc;
    vis[0] =
        lf->have && fp[0] == fp[1] && !(lf->flags & DCP_LOAD_FILE_ROOT_READS);
    rc = dcp__comm_allreduce_min(c, vis, 1, lf->err);
    if (rc != DCP_OK)
        return rc;
    lf->own = vis[0] != 0;
    lf->cap = lf->own ? ROUND_BYTES / 4 : ROUND_BYTES / (uint64_t)lf->size;
    lf->stage = dcp__malloc((size_t)lf->cap);
    lf->found = dcp__calloc(lf->st->n + 1, 1);
    lf->fdt = dcp__calloc(lf->st->n + 1, sizeof(*lf->fdt));
    /* 2. requests and answers */
    rc = lf->stage && lf->found && lf->fdt ? put_request(lf->st, &req)
                                           : DCP_ENOMEM;
    if (rc != DCP_OK)
        rc = dcp__err(lf->err, DCP_ENOMEM, "out of memory");
    rc = dcp__comm_agree_err(c, rc, lf->err);
    if (rc == DCP_OK)
        rc = dcp__comm_gather_blob(c, req.p, req.len, 0, &all, &lens, &displs,
                                   lf->err);
    if (rc == DCP_OK && lf->rank == 0) {
        alens = dcp__calloc((size_t)lf->size, sizeof(*alens));
        adispl = dcp__calloc((size_t)lf->size, sizeof(*adispl));
        lrc = alens && adispl ? plan(lf, all, lens, displs, &ans, alens, adispl)
                              : dcp__err(lf->err, DCP_ENOMEM, "out of memory");
    } else {
        lrc = DCP_OK;
    }
    if (rc == DCP_OK)
        rc = dcp__comm_share_err(c, lrc, lf->err, 0);
    if (rc == DCP_OK)
        rc = dcp__comm_scatter_blob(c, ans.p, alens, adispl, 0, &mine, &mlen,
                                    lf->err);
    if (rc == DCP_OK)
        rc = dcp__comm_agree_err(c, apply(lf, mine, mlen), lf->err);
    /* 3. data */
    if (rc == DCP_OK && lf->own)
        rc = dcp__comm_agree_err(c, read_own(lf), lf->err);
    else if (rc == DCP_OK)
        rc =
            dcp__comm_agree_err(c, root_rounds(lf, all, lens, displs), lf->err);
    dcp__buf_free(&req);
    dcp__buf_free(&ans);
    dcp__free(all);
    dcp__free(lens);
    dcp__free(displs);
    dcp__free(alens);
    dcp__free(adispl);
    dcp__free(mine);
    return rc;
}

int dcp_load_file(dcp_ctx *ctx, dcp_state *st, const char *file,
                  const dcp_load_options *opts)
{
    struct lf lf;
    int rc;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    dcp__ctx_clear_report(ctx);
    if (!st || !file)
        return dcp__err(&ctx->err, DCP_EINVAL, "no state or file");
    if (opts && (opts->struct_size == 0 || opts->struct_size > sizeof(*opts)))
        return dcp__err(&ctx->err, DCP_EINVAL, "bad load options");
    memset(&lf, 0, sizeof(lf));
    lf.ctx = ctx;
    lf.err = &ctx->err;
    lf.st = st;
    lf.flags = opts ? opts->flags : 0;
    lf.rank = dcp__comm_rank(ctx->comm);
    lf.size = dcp__comm_size(ctx->comm);
    rc = lf_run(&lf, file);
    if (lf.have)
        dcp__src_close(&lf.ix);
    dcp__free(lf.found);
    dcp__free(lf.fdt);
    dcp__free(lf.stage);
    return rc;
}
