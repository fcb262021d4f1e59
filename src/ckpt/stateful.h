/*
 * Stateful entries: before a save or a load plans anything, the state is
 * expanded: each stateful entry's state_dict fills a fresh sub-state,
 * whose entries join the others under the stateful's path. After a load,
 * the loaded values go back where they came from and each load_state_dict
 * runs with its sub-state.
 */
#ifndef DCP_STATEFUL_H
#define DCP_STATEFUL_H

#include "state.h"

/* Where an entry of the expanded state came from. */
struct sf_origin {
    long sub;   /* index into subs, or -1: the original state */
    size_t idx; /* entry index there */
};

struct st_expansion {
    const dcp_state *use; /* what to save or load: st itself, or x */
    dcp_state *x;         /* owned; NULL when st has no stateful entry */
    dcp_state **subs;     /* one sub-state per stateful entry, owned */
    size_t *sfidx;        /* their entry indices in st */
    size_t nsubs;
    struct sf_origin *origin; /* per entry of x */
    size_t norigin;           /* capacity of origin */
};

/*
 * Expands st (no copy at all when it has no stateful entry). Calls every
 * state_dict, telling it op (enum dcp_io_op: the save or load it serves,
 * for dcp_state_op). Returns DCP_OK, DCP_EINVAL (a failing state_dict, a
 * stateful entry inside a sub-state, a key used twice), DCP_ENOMEM, with a
 * message naming the entry. ex is released by dcp__state_expand_release, also
 * on failure.
 */
int dcp__state_expand(const dcp_state *st, int op, struct st_expansion *ex,
                      struct dcp_err *err);

/* After a load into ex->use: moves the loaded values back into st and the
 * sub-states, then calls every load_state_dict. Returns DCP_OK or
 * DCP_EINVAL (a failing load_state_dict, named). */
int dcp__state_expand_loaded(struct st_expansion *ex, dcp_state *st,
                             struct dcp_err *err);

void dcp__state_expand_release(struct st_expansion *ex);

/* dcp__state_expand (ex zeroed first; a NULL st expands to nothing), then
 * checks that CUDA tensor entries can be copied (libcudart loads): what
 * every save and load does before planning. Same return codes, or those of
 * dcp__cuda_open naming the tensor. */
int dcp__state_expand_io(const dcp_state *st, int op, struct st_expansion *ex,
                         struct dcp_err *err);

#endif /* DCP_STATEFUL_H */
