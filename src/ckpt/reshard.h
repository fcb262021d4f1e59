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
