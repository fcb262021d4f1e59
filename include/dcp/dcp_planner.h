/*
 * dcp planners: extension points of save and load planning, like
 * PyTorch's SavePlanner / LoadPlanner (issue 17).
 *
 * A save planner is passed in dcp_save_options.planner (dcp_save and
 * dcp_save_async), a load planner in dcp_load_options.planner. NULL is
 * the default planner, which is exactly today's behaviour; the default
 * planners below are built from the same hooks (every hook keeps every
 * entry as it is), and a save through them writes the same checkpoint,
 * byte for byte, as a save without a planner.
 *
 * Where the hooks run (docs/ARCHITECTURE.md §4 and §5):
 *
 *  save  state_dict of stateful entries
 *        -> save planner's item hook, per entry, on every rank (rename,
 *           skip, cast or transform; this rank's entries only)
 *        -> local plans, gathered on rank 0
 *        -> global plan on rank 0 (dedup policy)
 *        -> save planner's global hook on rank 0 (inspect the plan: every
 *           entry, chunk, holders and writer rank; move writers among
 *           holders; attach planner data; veto)
 *        -> writing, commit
 *  load  state_dict of stateful entries
 *        -> load planner's item hook, per entry, on every rank (which
 *           stored key each state entry reads, or skip it)
 *        -> checks, reads (read once), copies
 *        -> load planner's post_load hook, per tensor box, on every rank
 *        -> load_state_dict of stateful entries
 *
 * Every hook runs on the thread that called dcp_save / dcp_save_async /
 * dcp_load, never on the background thread; a hook may not call dcp on
 * the same context. A hook that returns nonzero fails the call on every
 * rank with its code (a dcp error code passes through, anything else is
 * DCP_EINVAL) and its message (dcp_plan_error), before anything is
 * written or committed (save), or before the stateful entries get their
 * data (post_load: the boxes already hold the checkpoint's data). A
 * failing item hook changes no buffer.
 *
 * A planner is collective in spirit: every rank passes a planner that
 * makes the same decisions for the same keys (a key renamed on one rank
 * and not on another is two keys), with the same flags.
 *
 * Versioning: set version = DCP_PLANNER_VERSION; members are only
 * appended, a library reads only the members of the version it is given.
 */
#ifndef DCP_DCP_PLANNER_H
#define DCP_DCP_PLANNER_H

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DCP_PLANNER_VERSION 1

/* One entry of the state as a hook sees it (pointers valid during the
 * hook only). */
typedef struct dcp_plan_item {
    const char *key;      /* flattened key (FQN), after stateful expansion */
    int is_tensor;        /* 0: a value */
    dcp_dtype dtype;      /* tensors: the dtype in memory */
    int ndim;             /* tensors */
    const int64_t *shape; /* tensors: global shape, ndim elements */
    size_t nboxes;        /* tensors: this rank's boxes of it */
    dcp_mem mem;          /* tensors */
    int rank;             /* the calling rank */
    int world;            /* ranks of the context */
} dcp_plan_item;

/* What an item hook decides about its item: nothing (keep it as it is)
 * unless it calls the functions below. Opaque, valid during the hook. */
typedef struct dcp_plan_decision dcp_plan_decision;

/*
 * Renames the item. Save: the key it is stored under (a tensor or value
 * saved from several ranks must be renamed alike on each). Load: the
 * stored key the state entry reads; several state entries may read one
 * stored key (tensors of the same dtype and shape, or values). The
 * renamed entry's nesting path (planner_data) is the one component key,
 * as torch records a key it did not flatten. key must be UTF-8 without
 * NUL (checked at save time like every key); it is copied.
 * Returns DCP_OK, DCP_EINVAL (NULL or empty key), DCP_ENOMEM.
 */
DCP_API int dcp_plan_rename(dcp_plan_decision *d, const char *key);

/* Drops the item: not saved (save), not loaded and not reported missing
 * (load; its buffers are not touched). Returns DCP_OK or DCP_EINVAL. */
DCP_API int dcp_plan_skip(dcp_plan_decision *d);

/*
 * Save only: stores the tensor in dtype, converted from its dtype exactly
 * as torch's Tensor.to(dtype) rounds on the CPU (the conversion of
 * dcp_convert_elements; an fp32 state saved as a bf16 copy). The
 * converted copy is made on the calling thread into memory owned by the
 * save (the tensor's bytes in dtype, per rank) and freed when the call
 * returns (dcp_save) or once the state is staged (dcp_save_async).
 * Returns DCP_OK, DCP_EINVAL (a value, an unknown dtype, a load
 * decision), DCP_ENOTSUP (a CUDA tensor; float4_e2m1fn_x2 to or from
 * another dtype).
 */
DCP_API int dcp_plan_cast(dcp_plan_decision *d, dcp_dtype dtype);

/*
 * A user transform of each box: fn(userdata, it, box, offsets, sizes,
 * src, dst, n) is called once per box of the item on the calling thread,
 * src the box's n elements (it->dtype, C order: a strided box is packed
 * first), dst room for n elements of dtype; it returns 0 or fails the
 * save (its code as for any hook).
 */
typedef int (*dcp_plan_box_fn)(void *userdata, const dcp_plan_item *it,
                               size_t box, const int64_t *offsets,
                               const int64_t *sizes, const void *src, void *dst,
                               size_t n);

/* Save only: stores the tensor as fn makes it, in dtype (it->dtype to
 * keep it), memory as for dcp_plan_cast. Returns DCP_OK, DCP_EINVAL (a
 * value, NULL fn, unknown dtype, a load decision), DCP_ENOTSUP (CUDA). */
DCP_API int dcp_plan_transform(dcp_plan_decision *d, dcp_dtype dtype,
                               dcp_plan_box_fn fn, void *userdata);

/* The message of a hook's failure (printf format), for the hook to set
 * before returning nonzero; the call's message then reads
 * "<hook> on key '<key>': <msg>". Returns DCP_OK. */
DCP_API int dcp_plan_error(dcp_plan_decision *d, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* The coordinator's view of a save: the global plan (opaque, valid
 * during the global hook). */
typedef struct dcp_global_plan dcp_global_plan;

/*
 * The plan as the checkpoint's metadata will hold it: every stored key
 * (sorted), its kind, dtype, shape, chunks (offsets and sizes; the file
 * fields are not known yet: file "" and offset 0) and paths, read with
 * the dcp_metadata_* functions of dcp.h. Owned by the plan.
 */
DCP_API const dcp_metadata *dcp_global_plan_metadata(const dcp_global_plan *gp);

/* The rank that writes chunk chunk of entry index (as dcp_metadata_chunk
 * counts them), or -1 for indices out of range. */
DCP_API int dcp_global_plan_writer(const dcp_global_plan *gp, size_t index,
                                   size_t chunk);

/* The ranks that hold that chunk (a replicated box or value: several;
 * otherwise its writer alone): how many, and the first cap of them into
 * ranks (may be NULL when cap is 0). 0 for indices out of range. */
DCP_API size_t dcp_global_plan_holders(const dcp_global_plan *gp, size_t index,
                                       size_t chunk, int *ranks, size_t cap);

/*
 * Adjusts the plan: rank, one of the chunk's holders, writes it instead
 * of the rank the dedup policy chose (every rank then writes what the
 * adjusted plan gives it). Returns DCP_OK, DCP_EINVAL (indices out of
 * range, rank not a holder).
 */
DCP_API int dcp_global_plan_set_writer(dcp_global_plan *gp, size_t index,
                                       size_t chunk, int rank);

/*
 * Attaches planner data to entry index: a value stored in the
 * checkpoint's metadata (Metadata.planner_data, under the key
 * "dcp.planner_data:<key>", beside the entry's path, which torch ignores)
 * and read back with dcp_metadata_planner_data. Takes ownership of v,
 * also on failure. Returns DCP_OK, DCP_EINVAL (index out of range, NULL
 * v), DCP_ENOMEM.
 */
DCP_API int dcp_global_plan_set_data(dcp_global_plan *gp, size_t index,
                                     dcp_value *v);

/* The global hook's failure message, as dcp_plan_error. */
DCP_API int dcp_global_plan_error(dcp_global_plan *gp, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/*
 * The planner data of entry index of a checkpoint (set by a save
 * planner's dcp_global_plan_set_data), or NULL when it has none. Owned by
 * md. Not collective.
 */
DCP_API const dcp_value *dcp_metadata_planner_data(const dcp_metadata *md,
                                                   size_t index);

/* Save planner flags. */
enum dcp_save_planner_flags {
    /* Replicated data (the same box or value on several ranks) is written
     * by the lowest rank holding it, as torch's dedup_save_to_lowest_rank
     * does; by default it goes to the holder with the fewest bytes so far.
     * A save with this flag or a global hook plans afresh every time (no
     * plan cache). */
    DCP_PLAN_DEDUP_LOWEST_RANK = 1 << 0
};

typedef struct dcp_save_planner {
    uint32_t version; /* DCP_PLANNER_VERSION */
    unsigned flags;   /* enum dcp_save_planner_flags */
    void *userdata;   /* passed to every hook */
    /* Per entry of this rank's (expanded) state, in state order; NULL
     * keeps every entry. May rename, skip, cast or transform. */
    int (*item)(void *userdata, const dcp_plan_item *it, dcp_plan_decision *d);
    /* On rank 0, after the global plan is built and checked, before
     * anything is written; NULL: none. May inspect, move writers among a
     * chunk's holders, attach planner data, or fail the save. */
    int (*global)(void *userdata, dcp_global_plan *gp);
} dcp_save_planner;

typedef struct dcp_load_planner {
    uint32_t version; /* DCP_PLANNER_VERSION */
    unsigned flags;   /* none yet: 0 */
    void *userdata;
    /* Per entry of this rank's (expanded) state, in state order; NULL
     * loads every entry from its own key. May rename (the stored key to
     * read) or skip. */
    int (*item)(void *userdata, const dcp_plan_item *it, dcp_plan_decision *d);
    /* After every rank's data landed: once per tensor box of this rank's
     * state entries that were loaded (under the state's key, it->dtype
     * the box's dtype), buf the box's memory (host, or a device pointer
     * for DCP_MEM_CUDA): C-contiguous when strides is NULL, else element
     * (i0, i1, ...) at buf + sum of i * strides (a box added with
     * dcp_state_add_tensor_strided). May change the box's bytes. NULL:
     * none. */
    int (*post_load)(void *userdata, const dcp_plan_item *it, size_t box,
                     const int64_t *offsets, const int64_t *sizes,
                     const int64_t *strides, void *buf);
} dcp_load_planner;

/* The default planners: every hook keeps what it is given (no flags).
 * Static; never freed. Thread safe. */
DCP_API const dcp_save_planner *dcp_default_save_planner(void);
DCP_API const dcp_load_planner *dcp_default_load_planner(void);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_PLANNER_H */
