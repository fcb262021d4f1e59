/*
 * Planners (dcp_planner.h): the item hooks applied to an expanded state
 * before a save or load plans it, the post-load hook, the coordinator's
 * global hook. The default planner keeps every entry: then the state is
 * used as it is, with no copy.
 */
#ifndef DCP_PLANNER_H
#define DCP_PLANNER_H

#include "dcp/dcp_planner.h"
#include "plan.h"
#include "state.h"

/* A save's planned state: use itself, or x (owned, with the converted
 * copies it points to). */
struct pn_save {
    dcp_state *x;
    void **bufs; /* converted or transformed boxes, owned */
    size_t nbufs;
};

/*
 * Runs p's item hook over every entry of use; *out is use when the hook
 * kept every entry (or p is NULL, or has no item hook), else ps->x.
 * Returns DCP_OK, DCP_EINVAL (a bad planner, two entries renamed to one
 * key, a failing hook: its code and message), DCP_ENOTSUP, DCP_ENOMEM.
 * ps is released by dcp__planner_save_release, also on failure.
 */
int dcp__planner_save(const dcp_save_planner *p, int rank, int world,
                      const dcp_state *use, const dcp_state **out,
                      struct pn_save *ps, struct dcp_err *err);
void dcp__planner_save_release(struct pn_save *ps);

/* The planner of a save's or load's options (NULL when they do not
 * reach the member). */
const dcp_save_planner *dcp__save_opts_planner(const dcp_save_options *o);
const dcp_load_planner *dcp__load_opts_planner(const dcp_load_options *o);

/* Whether p plans without the plan cache (lowest-rank dedup, a global
 * hook); a NULL p does not. */
int dcp__planner_save_nocache(const dcp_save_planner *p);

/* 1 when p has a global hook (refused by a rank-local save, save.c). */
int dcp__planner_save_has_global(const dcp_save_planner *p);

/* dcp__plan_global with p's dedup policy and its global hook (run on the
 * plan before its records are listed, so it may move writers). Returns
 * dcp__plan_global's codes, or the hook's with its message. */
int dcp__planner_plan_global(const dcp_save_planner *p, const uint8_t *blobs,
                             const size_t *lens, const size_t *displs,
                             int nranks, struct pl_global *g,
                             struct dcp_err *err);

/* Dedup policy flags for dcp__plan_global_ex. */
unsigned dcp__planner_policy(const dcp_save_planner *p);

/* A load's planned state. */
struct pn_load {
    dcp_state *x; /* NULL: use itself is loaded */
    size_t *map;  /* per entry of use: its entry in x, or SIZE_MAX */
    size_t nmap;
};

/* Runs p's item hook over use; *out is use or pl->x. Same codes as
 * dcp__planner_save; several entries of use reading one stored key must
 * agree on kind, dtype, shape and memory (DCP_EINVAL otherwise). */
int dcp__planner_load(const dcp_load_planner *p, int rank, int world,
                      dcp_state *use, dcp_state **out, struct pn_load *pl,
                      struct dcp_err *err);

/* After the load of pl->x: the loaded values into use's entries, then the
 * post_load hook over use's loaded tensor boxes (not those whose stored
 * key is among the load's nmissing missing keys). DCP_OK or the hook's
 * code. */
int dcp__planner_loaded(const dcp_load_planner *p, int rank, int world,
                        dcp_state *use, struct pn_load *pl,
                        const char *const *missing, size_t nmissing,
                        struct dcp_err *err);

/* 0 when dcp__planner_loaded cannot fail with p and pl (no value to copy
 * back, no post_load hook): its outcome then needs no agreement. */
int dcp__planner_loaded_can_fail(const dcp_load_planner *p,
                                 const struct pn_load *pl);
void dcp__planner_load_release(struct pn_load *pl);

#endif /* DCP_PLANNER_H */
