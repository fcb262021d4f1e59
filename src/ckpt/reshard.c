/*
 * Box geometry: strided box copies, the intersection of two boxes, the stored
 * chunks a requested box overlaps (load planning) and the check that a
 * tensor's chunks tile its shape (save planning and decoded metadata).
 */
#include "reshard.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

void dcp__box_cstrides(int ndim, const int64_t *size, int64_t *stride)
{
    int64_t s = 1;
    int d;
    for (d = ndim - 1; d >= 0; d--) {
        stride[d] = s;
        s *= size[d];
    }
}

int64_t dcp__box_at(int ndim, const int64_t *pos, const int64_t *origin,
                    const int64_t *stride)
{
    int64_t at = 0;
    int d;
    for (d = 0; d < ndim; d++)
        at += (pos[d] - (origin ? origin[d] : 0)) * stride[d];
    return at;
}

void dcp__box_runs_init(struct box_runs *r, int ndim, const int64_t *size,
                        int64_t soff, const int64_t *sstride, int64_t doff,
                        const int64_t *dstride)
{
    int d, n = 0;
    r->src = soff;
    r->dst = doff;
    r->run = 1;
    r->state = 0;
    /* Keep the dimensions longer than 1, merging each into the one before
     * it when both layouts step over it whole. */
    for (d = 0; d < ndim; d++) {
        if (size[d] == 0) {
            r->state = 2;
            return;
        }
        if (size[d] == 1)
            continue;
        if (n && r->sstride[n - 1] == sstride[d] * size[d] &&
            r->dstride[n - 1] == dstride[d] * size[d]) {
            r->size[n - 1] *= size[d];
            r->sstride[n - 1] = sstride[d];
            r->dstride[n - 1] = dstride[d];
            continue;
        }
        r->size[n] = size[d];
        r->sstride[n] = sstride[d];
        r->dstride[n] = dstride[d];
        r->idx[n] = 0;
        n++;
    }
    /* The last one, when unit-stride in both, is the run. */
    if (n && r->sstride[n - 1] == 1 && r->dstride[n - 1] == 1)
        r->run = r->size[--n];
    r->nd = n;
}

void dcp__box_copy(int ndim, size_t esize, const int64_t *size, const void *src,
                   int64_t soff, const int64_t *sstride, void *dst,
                   int64_t doff, const int64_t *dstride)
{
    struct box_runs r;
    dcp__box_runs_init(&r, ndim, size, soff, sstride, doff, dstride);
    while (dcp__box_runs_next(&r))
        memcpy((uint8_t *)dst + (size_t)r.dst * esize,
               (const uint8_t *)src + (size_t)r.src * esize,
               (size_t)r.run * esize);
}

void dcp__box_gather(int ndim, size_t esize, const int64_t *size,
                     const int64_t *stride, const void *src, uint64_t off,
                     uint64_t len, void *dst)
{
    int64_t idx[DCP_MAX_NDIM] = {0};
    uint64_t e = off / esize, b = off % esize;
    uint8_t *out = dst;
    int d, last = ndim - 1;
    if (!len)
        return;
    if (ndim == 0) {
        memcpy(out, (const uint8_t *)src + b, (size_t)len);
        return;
    }
    for (d = last; d >= 0; d--) { /* the coordinates of element e */
        idx[d] = (int64_t)(e % (uint64_t)size[d]);
        e /= (uint64_t)size[d];
    }
    while (len && idx[0] < size[0]) {
        /* A run: the rest of the row when its elements are adjacent, one
         * element otherwise. */
        int64_t m = 0, cnt = stride[last] == 1 ? size[last] - idx[last] : 1;
        uint64_t n = (uint64_t)cnt * esize - b;
        for (d = 0; d < ndim; d++)
            m += idx[d] * stride[d];
        if (n > len)
            n = len;
        memcpy(out, (const uint8_t *)src + (size_t)m * esize + b, (size_t)n);
        out += n;
        len -= n;
        b = 0;
        idx[last] += cnt;
        for (d = last; d > 0 && idx[d] >= size[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

int dcp__box_intersect(int ndim, const int64_t *aoff, const int64_t *asize,
                       const int64_t *boff, const int64_t *bsize,
                       int64_t *ioff, int64_t *isize)
{
    int d;
    for (d = 0; d < ndim; d++) {
        int64_t lo = aoff[d] > boff[d] ? aoff[d] : boff[d];
        int64_t ae = aoff[d] + asize[d], be = boff[d] + bsize[d];
        int64_t hi = ae < be ? ae : be;
        if (hi <= lo)
            return 0;
        ioff[d] = lo;
        isize[d] = hi - lo;
    }
    return 1;
}


static int overlaps(int ndim, const int64_t *ao, const int64_t *as,
                    const int64_t *bo, const int64_t *bs)
{
    int d;
    for (d = 0; d < ndim; d++) {
        int64_t lo = ao[d] > bo[d] ? ao[d] : bo[d];
        int64_t hi = ao[d] + as[d] < bo[d] + bs[d] ? ao[d] + as[d]
                                                   : bo[d] + bs[d];
        if (hi <= lo)
            return 0;
    }
    return 1;
}

size_t dcp__meta_overlapping(const struct md_entry *e, const int64_t *off,
                             const int64_t *size, uint8_t *mark)
{
    size_t lo = 0, hi = e->nchunks, i, n = 0;
    if (!e->is_tensor)
        return 0;
    if (e->ndim == 0) { /* a 0-d tensor: its one chunk */
        if (e->nchunks && !mark[0]) {
            mark[0] = 1;
            n = 1;
        }
        return n;
    }
    if (e->sorted0) {
        /* First chunk that may reach the box: start > off[0] - maxlen0. */
        int64_t from = off[0] - e->maxlen0;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (e->chunks[mid].off[0] <= from)
                lo = mid + 1;
            else
                hi = mid;
        }
        hi = e->nchunks;
    }
    for (i = lo; i < hi; i++) {
        const struct md_chunk *c = &e->chunks[i];
        if (e->sorted0 && c->off[0] >= off[0] + size[0])
            break;
        if (!mark[i] && overlaps(e->ndim, c->off, c->size, off, size)) {
            mark[i] = 1;
            n++;
        }
    }
    return n;
}

/* ------------------------------------------------------------- tiling */

/* A chunk with its extent along the dimension at hand (qsort has no
 * context argument, so the key travels with the element). */
struct sweep {
    int64_t start;
    int64_t end;
    const struct md_chunk *c;
};

static int cmp_sweep(const void *a, const void *b)
{
    const struct sweep *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/*
 * Whether two of the non-empty chunks v[0..n) overlap, for the layouts
 * that are grids at every level (row, column, 2-D blocks, and bricks):
 * along the first dimension not in used, the chunks' extents must be equal
 * or disjoint; two chunks of different extents then cannot overlap, and
 * those of one extent overlap iff they do in the other dimensions (checked
 * recursively; equal in all of them, they do). O(n * ndim) when v arrives
 * sorted, as a plan's chunks do. Returns 1 (overlap), 0 (none), or 2 when
 * some extents overlap without being equal: the pairwise sweep decides.
 */
static int grid_overlap(struct sweep *v, size_t n, int ndim, unsigned used)
{
    size_t i, a;
    int64_t reach;
    int d, r;
    if (n < 2)
        return 0;
    for (d = 0; d < ndim && (used >> d & 1); d++)
        ;
    if (d == ndim)
        return 1;
    for (i = 0; i < n; i++) {
        v[i].start = v[i].c->off[d];
        v[i].end = v[i].start + v[i].c->size[d];
    }
    for (i = 1; i < n && cmp_sweep(&v[i - 1], &v[i]) <= 0; i++)
        ;
    if (i < n)
        qsort(v, n, sizeof(*v), cmp_sweep);
    reach = v[0].end;
    for (a = 0, i = 1; i <= n; i++) {
        if (i < n && v[i].start == v[a].start && v[i].end == v[a].end)
            continue;
        if (i < n && v[i].start < reach)
            return 2;
        if (i - a > 1) {
            r = grid_overlap(v + a, i - a, ndim, used | 1u << d);
            if (r)
                return r;
        }
        if (i < n && v[i].end > reach)
            reach = v[i].end;
        a = i;
    }
    return 0;
}

static int boxes_overlap(const struct md_chunk *a, const struct md_chunk *b,
                         int ndim)
{
    int d;
    for (d = 0; d < ndim; d++)
        if (a->off[d] >= b->off[d] + b->size[d] ||
            b->off[d] >= a->off[d] + a->size[d])
            return 0;
    return 1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Number of values in sorted s[0..n) below x. */
static size_t count_below(const int64_t *s, size_t n, int64_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/*
 * The dimension to sweep along: the one where the overlap scan below
 * compares the fewest pairs. Sweeping along d, a chunk is compared with the
 * chunks that start inside its extent along d; that count, summed over the
 * chunks, is exact and costs one sort per dimension. Row sharding picks
 * dim 0, column sharding dim 1, whatever the extents; the scan is then
 * O(n). Returns -1 when memory runs out.
 */
static int sweep_dim(const struct md_entry *e)
{
    int64_t *s;
    uint64_t best_cost = UINT64_MAX;
    size_t i, n = 0;
    int d, best = 0, cut = -1;
    if (e->ndim < 2)
        return 0;
    /* Shortcut: chunks that span every dimension but one (row, column
     * sharding) are cheapest to sweep along that one. */
    for (d = 0; d < e->ndim && cut != -2; d++) {
        for (i = 0; i < e->nchunks; i++)
            if (dcp__box_numel(e->ndim, e->chunks[i].size) &&
                (e->chunks[i].off[d] || e->chunks[i].size[d] != e->shape[d]))
                break;
        if (i < e->nchunks)
            cut = cut == -1 ? d : -2;
    }
    if (cut >= 0)
        return cut;
    s = dcp__malloc((e->nchunks ? e->nchunks : 1) * sizeof(*s));
    if (!s)
        return -1;
    for (d = 0; d < e->ndim; d++) {
        uint64_t cost = 0;
        n = 0;
        for (i = 0; i < e->nchunks; i++)
            if (dcp__box_numel(e->ndim, e->chunks[i].size))
                s[n++] = e->chunks[i].off[d];
        qsort(s, n, sizeof(*s), cmp_i64);
        for (i = 0; i < e->nchunks; i++) {
            const int64_t lo = e->chunks[i].off[d];
            const int64_t hi = lo + e->chunks[i].size[d];
            if (dcp__box_numel(e->ndim, e->chunks[i].size))
                cost += count_below(s, n, hi) - count_below(s, n, lo);
        }
        if (cost < best_cost) {
            best_cost = cost;
            best = d;
        }
    }
    dcp__free(s);
    return best;
}

int dcp__meta_check_tiling(const struct md_entry *e, struct dcp_err *err)
{
    struct sweep *v;
    uint64_t total, sum = 0;
    size_t i, j, n = 0;
    int best, r;
    if (!e->is_tensor)
        return DCP_OK;
    total = dcp__box_numel(e->ndim, e->shape);
    if (e->ndim == 0)
        return e->nchunks == 1 ? DCP_OK
                               : dcp__err(err, DCP_EFORMAT,
                                          "'%s': a 0-d tensor with %zu chunks",
                                          e->key, e->nchunks);
    v = dcp__malloc((e->nchunks ? e->nchunks : 1) * sizeof(*v));
    if (!v)
        return DCP_ENOMEM;
    for (i = 0; i < e->nchunks; i++) {
        uint64_t vol = dcp__box_numel(e->ndim, e->chunks[i].size);
        sum += vol;
        if (vol)
            v[n++].c = &e->chunks[i];
    }
    r = grid_overlap(v, n, e->ndim, 0);
    if (r == 2) { /* not a grid: sweep along the cheapest dimension */
        best = sweep_dim(e);
        if (best < 0) {
            dcp__free(v);
            return DCP_ENOMEM;
        }
        for (i = 0; i < n; i++) {
            v[i].start = v[i].c->off[best];
            v[i].end = v[i].start + v[i].c->size[best];
        }
        for (i = 1; i < n && v[i - 1].start <= v[i].start; i++)
            ;
        if (i < n) /* often sorted already: chunks listed by offsets */
            qsort(v, n, sizeof(*v), cmp_sweep);
        for (r = 0, i = 0; !r && i < n; i++)
            for (j = i + 1; !r && j < n && v[j].start < v[i].end; j++)
                r = boxes_overlap(v[i].c, v[j].c, e->ndim);
    }
    dcp__free(v);
    if (r)
        return dcp__err(err, DCP_EFORMAT, "'%s': stored chunks overlap",
                        e->key);
    if (sum != total)
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': stored chunks cover %" PRIu64 " of %" PRIu64
                        " elements",
                        e->key, sum, total);
    return DCP_OK;
}
