/*
 * A value record holding tensors: torch.save of a nested state, as torch
 * 2.13 writes a top-level dict or list with flatten_state_dict=False
 * (docs/FORMAT.md §9.4). Its data.pkl is decoded with the value
 * allow-list plus the tensor one (nothing executed), and its leaves are
 * named as torch's flatten_state_dict names them: dict keys str(key), list
 * items by index, a list expanded when it holds a tensor, a dict or an
 * expandable list, tuples and other objects leaves.
 */
#ifndef DCP_NESTED_H
#define DCP_NESTED_H

#include <stddef.h>
#include <stdint.h>

#include "meta.h"
#include "pickle.h"
#include "util.h"

/* Leaves one value may expand to, and nodes one walk may visit (memo
 * references share nodes: a small pickle can describe a huge tree). */
#define NEST_MAX_LEAVES ((size_t)1 << 16)
#define NEST_MAX_VISITS ((size_t)1 << 20)
#define NEST_MAX_DEPTH 64
/* Objects one data.pkl may decode to (a tensor takes about 15). */
#define NEST_MAX_NODES ((size_t)1 << 22)

/*
 * Decodes a value's data.pkl with the value and tensor allow-lists. On
 * success *arena owns the tree (dcp__pk_arena_free). At most
 * NEST_MAX_NODES objects (DCP_ELIMIT). Returns the decoder's
 * codes (DCP_EFORMAT, DCP_EUNSAFE, DCP_ELIMIT, DCP_ENOTSUP, DCP_ENOMEM).
 */
int dcp__nest_decode(const void *pkl, size_t len, struct pk_arena **arena,
                     struct pk_node **root, struct dcp_err *err);

/* Whether n rebuilds a tensor (_rebuild_tensor_v2/v3, _rebuild_qtensor). */
int dcp__nest_is_tensor(const struct pk_node *n);

/* One step of a leaf's path below the root: a dict key as torch's str()
 * writes it (s), or a list index (s NULL, i). */
struct nest_el {
    const char *s;
    int64_t i;
};

/* Called for each leaf with its path and node. */
typedef int (*nest_leaf_fn)(void *arg, const struct nest_el *path,
                            size_t npath, const struct pk_node *leaf,
                            struct dcp_err *err);

/*
 * Calls fn for every leaf of root in torch's flatten order. The root must
 * be a dict or an expandable list (DCP_EINVAL otherwise: not a nested
 * state). A dict key that is not a str, int, bool or None is DCP_ENOTSUP,
 * two keys of one dict with one str() (a hostile pickle) DCP_EFORMAT;
 * more than NEST_MAX_LEAVES leaves, NEST_MAX_VISITS visits or
 * NEST_MAX_DEPTH levels DCP_ELIMIT. fn's error stops the walk.
 */
int dcp__nest_walk(const struct pk_node *root, nest_leaf_fn fn, void *arg,
                   struct dcp_err *err);

/* The node at path below root (as dcp__nest_walk names it), or NULL. */
const struct pk_node *dcp__nest_find(const struct pk_node *root,
                                     const struct md_pathel *path,
                                     size_t npath);

/* Appends ".".join(str(p) for p in path) to out (no NUL). */
int dcp__nest_name(const struct nest_el *path, size_t npath,
                   struct dcp_buf *out);

#endif /* DCP_NESTED_H */
