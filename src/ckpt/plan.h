/*
 * Save planning: what each rank holds (local plan), the coordinator's
 * checked, deduplicated global plan (which rank writes which record), and
 * the compact encodings that travel between them. Knows nothing of files
 * or communicators: save.c moves the byte strings and names the files.
 */
#ifndef DCP_PLAN_H
#define DCP_PLAN_H

#include "util.h"
#include "meta.h"
#include "state.h"

/* A rank's local plan: the encoded description of its state (keys, kinds,
 * dtypes, shapes, boxes, value sizes and hashes; no data) and the pickles
 * of its values, kept for writing. */
struct pl_local {
    struct dcp_buf blob;
    struct dcp_buf *pickles; /* one per state entry; empty for tensors */
    size_t n;
    /* Where the 8-byte hash of each value's pickle lies in blob (ascending):
     * everything else in blob is the plan's structure, on which the global
     * plan depends (value sizes included: they weigh in the writer choice). */
    size_t *vpos;
    size_t nvpos;
    /* FNV-1a of every value's key and pickle hash, in state order: equal on
     * two ranks when they hold the same values with the same contents. */
    uint64_t vhash;
};

int dcp__plan_local(const dcp_state *st, struct pl_local *lp,
                    struct dcp_err *err);
void dcp__plan_local_release(struct pl_local *lp);

/* The structure of lp's blob (a copy with the value hashes zeroed) into
 * out (emptied first), for dcp__plan_local_same later. DCP_OK or
 * DCP_ENOMEM. */
int dcp__plan_local_structure(const struct pl_local *lp, struct dcp_buf *out);

/* 1 when lp's blob has the structure s (from dcp__plan_local_structure):
 * byte for byte equal but for the value hashes; else 0. */
int dcp__plan_local_same(const struct pl_local *lp, const struct dcp_buf *s);

/* One record a rank writes: its state entry and box (0 for a value), and
 * the metadata entry and chunk the record becomes. */
struct pl_rec {
    uint32_t lent;
    uint32_t lbox;
    uint32_t k;
    uint32_t j;
    uint32_t tensor;
};

/* The coordinator's plan. */
struct pl_global {
    /* Entries sorted by key, chunks with offsets and sizes (in md->ints),
     * storage fields unset; version set, files/ids left to the caller. */
    struct dcp_metadata *md;
    int nranks;
    struct pl_rec *recs; /* rank-major; each rank's in write order */
    size_t *recbase;     /* nranks + 1 offsets into recs */
    uint64_t *bytes;     /* per rank: bytes of data it writes */
};

/*
 * Builds the global plan from every rank's local plan blob (rank r's at
 * blobs + displs[r], lens[r] bytes). Checks that ranks agree on each key's
 * kind, dtype, global shape and path, that equal value keys have equal
 * contents, and that each tensor's boxes tile it; deduplicates replicated
 * boxes and values and spreads them over their holders by size.
 * Returns DCP_OK, DCP_EPLAN (message names the key and ranks), DCP_EFORMAT
 * (a corrupt blob), DCP_ELIMIT, DCP_ENOMEM. The blobs may be freed after.
 */
int dcp__plan_global(const uint8_t *blobs, const size_t *lens,
                     const size_t *displs, int nranks, struct pl_global *g,
                     struct dcp_err *err);

/* dcp__plan_global with a dedup policy: 0 (the least-loaded holder) or
 * PL_DEDUP_LOWEST (the lowest-ranked holder writes, as torch's
 * dedup_save_to_lowest_rank). */
#define PL_DEDUP_LOWEST 1u
/* Policy bit: the plan of one rank of a rank-local save (DCP_SAVE_RANK_LOCAL,
 * save.c): the boxes need not tile the global shape (the other ranks hold
 * the rest; the whole was checked by a plan over every rank first). */
#define PL_NO_TILING 2u

/*
 * The coordinator's hook (the save planner's global hook, planner.c):
 * called once the writers are chosen and before the records are listed,
 * with the plan's metadata (entries sorted, chunks set, no files yet) and
 * a view of its writers that it may change among each chunk's holders.
 * A nonzero return fails the plan with that code (message in err, set by
 * the hook). The view is valid during the call only.
 */
struct pl_view;
typedef int (*pl_hook_fn)(void *ud, struct pl_view *v,
                          struct dcp_metadata *md);
/* The rank writing chunk j of entry k, or -1 (out of range). */
int dcp__pl_view_writer(const struct pl_view *v, uint32_t k, uint32_t j);
/* The ranks holding chunk j of entry k (the writer alone when one rank
 * holds it): their number; the first cap of them into ranks. */
size_t dcp__pl_view_holders(const struct pl_view *v, uint32_t k, uint32_t j,
                            int *ranks, size_t cap);
/* Makes rank, a holder, the chunk's writer. DCP_OK or DCP_EINVAL (out of
 * range, not a holder). */
int dcp__pl_view_set_writer(struct pl_view *v, uint32_t k, uint32_t j,
                            int rank);

int dcp__plan_global_ex(const uint8_t *blobs, const size_t *lens,
                        const size_t *displs, int nranks, unsigned policy,
                        pl_hook_fn hook, void *hook_ud, struct pl_global *g,
                        struct dcp_err *err);
void dcp__plan_global_release(struct pl_global *g);

/* Rank r's assignment: the file it writes and its records, in order. */
int dcp__plan_assign_encode(const struct pl_global *g, int r, const char *file,
                            struct dcp_buf *out);

struct pl_assign {
    char *file;
    struct pl_rec *recs; /* lent, lbox, tensor set */
    size_t n;
};

/* Decodes an assignment and checks it against this rank's state. */
int dcp__plan_assign_decode(const uint8_t *p, size_t len, const dcp_state *st,
                            struct pl_assign *a, struct dcp_err *err);
void dcp__plan_assign_release(struct pl_assign *a);

/* What a rank wrote: (offset, length) per record of its assignment. */
int dcp__plan_results_encode(const uint64_t *offlen, size_t n,
                             struct dcp_buf *out);

/* Stores rank r's results in its chunks, in file index file. */
int dcp__plan_results_apply(struct pl_global *g, int r, uint32_t file,
                            const uint8_t *p, size_t len, struct dcp_err *err);

#endif /* DCP_PLAN_H */
