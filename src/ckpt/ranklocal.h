/*
 * Rank-local checkpoints (docs/FORMAT.md §9.2): what torch 2.13's
 * dcp.save(..., use_collectives=False) writes -- no .metadata, but one
 * __<rank>.metadata per rank describing only that rank's items, each
 * pointing into that rank's own __<rank>_<k>.distcp files. dcp reads them
 * as one checkpoint: the union of the ranks' metadata.
 */
#ifndef DCP_RANKLOCAL_H
#define DCP_RANKLOCAL_H

#include "util.h"
#include "meta.h"

/* Most per-rank metadata files read. */
#define RL_MAX_RANKS 65536

/*
 * Reads __0.metadata .. __<N-1>.metadata of the open directory dirfd (path
 * for messages; each file at most max_bytes) and merges them into *out:
 * every key of every rank; a tensor's chunks are the union of the ranks'
 * chunks, a chunk that several ranks saved with the same offsets and sizes
 * (a replicated tensor) kept once, from the lowest rank; a value is the
 * lowest rank's. Returns DCP_OK; DCP_ENOENT when the directory holds no
 * __<rank>.metadata (nothing set in err: the caller reports its own
 * message); DCP_EFORMAT when a rank's file is missing between others
 * (naming it), or the ranks disagree on a key's kind, dtype or global
 * shape (naming the key and both ranks); DCP_ELIMIT past RL_MAX_RANKS
 * ranks; the decoder's codes (prefixed with the file); DCP_EIO, DCP_ENOMEM.
 * Not collective.
 */
int dcp__rl_metadata(int dirfd, const char *path, uint64_t max_bytes,
                     struct dcp_metadata **out, struct dcp_err *err);

/* As dcp__rl_metadata, but the merged metadata encoded as .metadata bytes
 * (dcp__meta_encode), *out freed with dcp__free: what a load broadcasts. */
int dcp__rl_metadata_bytes(int dirfd, const char *path, uint64_t max_bytes,
                           uint8_t **out, size_t *len, struct dcp_err *err);

/*
 * Whether the open directory dirfd holds any rank-local metadata file
 * __<k>.metadata, for any k (listed; where the back end cannot list, or
 * past RL_LIST_MAX names, probed for k below the larger of 1024 and
 * nprobe): DCP_OK with the first name found in name (cap bytes), "" when
 * none; the listing's storage errors otherwise.
 */
int dcp__rl_find_any(int dirfd, uint32_t nprobe, char *name, size_t cap,
                     struct dcp_err *err);

/* k when name is a rank-local metadata file "__<k>.metadata" (k capped at
 * the largest rank count read), else -1. */
long dcp__rl_name_rank(const char *name);

#endif /* DCP_RANKLOCAL_H */
