/*
 * Box geometry (reshard.c): what resharding needs to know about boxes of a
 * global tensor and the stored chunks that cover it.
 */
#ifndef DCP_RESHARD_H
#define DCP_RESHARD_H

#include "util.h"
#include "meta.h"

/* Overlap of two boxes: 1 and the intersection (global coordinates) when
 * they overlap with nonzero volume, else 0. 0-d boxes always overlap. */
int dcp__box_intersect(int ndim, const int64_t *aoff, const int64_t *asize,
                       const int64_t *boff, const int64_t *bsize,
                       int64_t *ioff, int64_t *isize);

/* C-contiguous element strides of a box of sizes size. */
void dcp__box_cstrides(int ndim, const int64_t *size, int64_t *stride);

/* Element offset of position pos in a layout with strides stride whose
 * first element is at origin (NULL: all zeros): sum (pos - origin) * stride. */
int64_t dcp__box_at(int ndim, const int64_t *pos, const int64_t *origin,
                    const int64_t *stride);

/*
 * The runs of a strided box copy. A box of sizes size is walked in C order
 * through two layouts, a source and a destination, each given by the
 * element offset of the box's first element and one element stride per
 * dimension (any int64 strides, such as a torch view's). Dimensions of
 * size 1 are dropped and neighbours merged wherever both layouts are
 * contiguous across them, so each run is a longest stretch contiguous in
 * both: a box whose rows are whole in both layouts is one run, and a
 * source strided in its last dimension gives runs of one element.
 *
 *     struct box_runs r;
 *     dcp__box_runs_init(&r, nd, size, soff, sstride, doff, dstride);
 *     while (dcp__box_runs_next(&r))
 *         use r.src, r.dst (element offsets) and r.run (elements);
 *
 * Caller-allocated; nothing to release. An empty box has no runs.
 */
struct box_runs {
    int64_t src, dst; /* the current run's element offsets */
    int64_t run;      /* elements per run */
    int nd;           /* outer dimensions walked, after merging */
    int state;        /* 0 before the first run, 1 walking, 2 done */
    int64_t size[DCP_MAX_NDIM], sstride[DCP_MAX_NDIM], dstride[DCP_MAX_NDIM];
    int64_t idx[DCP_MAX_NDIM];
};

void dcp__box_runs_init(struct box_runs *r, int ndim, const int64_t *size,
                        int64_t soff, const int64_t *sstride, int64_t doff,
                        const int64_t *dstride);

/* Moves r to its next run: 1, or 0 when there are no more. Inline: with
 * short runs (a narrow column shard) the copy takes a run per few bytes. */
static inline int dcp__box_runs_next(struct box_runs *r)
{
    int d;
    if (r->state != 1) {
        if (r->state == 2)
            return 0;
        r->state = 1;
        return 1;
    }
    for (d = r->nd - 1; d >= 0; d--) {
        r->src += r->sstride[d];
        r->dst += r->dstride[d];
        if (++r->idx[d] < r->size[d])
            return 1;
        r->src -= r->sstride[d] * r->size[d];
        r->dst -= r->dstride[d] * r->size[d];
        r->idx[d] = 0;
    }
    r->state = 2;
    return 0;
}

/*
 * Copies the box of sizes size, elements of esize bytes, from src to dst:
 * both point at element 0 of their layout, and the box starts at element
 * offset soff (doff) with strides sstride (dstride), as for box_runs.
 * One memcpy per run.
 */
void dcp__box_copy(int ndim, size_t esize, const int64_t *size, const void *src,
                   int64_t soff, const int64_t *sstride, void *dst,
                   int64_t doff, const int64_t *dstride);

/*
 * Copies bytes [off, off + len) of the packed (C-order) image of a strided
 * box into dst: the box has sizes size, elements of esize bytes at src +
 * (sum of index * stride) * esize. off and len need not fall on element
 * boundaries (a staging piece may cut an element). One memcpy per row when
 * the last dimension's stride is 1.
 */
void dcp__box_gather(int ndim, size_t esize, const int64_t *size,
                     const int64_t *stride, const void *src, uint64_t off,
                     uint64_t len, void *dst);

/*
 * Load planning: marks (mark[i] = 1) every chunk i of tensor entry e that
 * overlaps the box (off, size), and returns how many it newly marked. mark
 * has e->nchunks bytes. With chunks sorted along dim 0 (dcp__meta_index), a
 * binary search limits the scan to chunks starting within maxlen0 before
 * the box: row sharding costs O(log n + k); otherwise every chunk is tested.
 */
size_t dcp__meta_overlapping(const struct md_entry *e, const int64_t *off,
                             const int64_t *size, uint8_t *mark);

/* Checks that the chunks of tensor entry e tile its shape exactly: inside
 * the shape, no two overlapping, volumes summing to the tensor's. */
int dcp__meta_check_tiling(const struct md_entry *e, struct dcp_err *err);

#endif /* DCP_RESHARD_H */
