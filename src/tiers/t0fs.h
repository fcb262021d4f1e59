/*
 * The tier-0 storage back end (t0fs.c): the virtual path "<vroot>/<rel>"
 * over "<roots[0]>/<rel>", roots[0] this rank's own node's root: every
 * call, reads included, acts on the own node's directory only. Other
 * paths are the POSIX back end's.
 */
#ifndef DCP_T0FS_H
#define DCP_T0FS_H

#include <stddef.h>

#include "dcp/dcp_storage.h"
#include "util.h"

/* The instance (impl) of dcp__t0fs_ops; borrowed strings, owned by the
 * tier stack, which outlives the context using it. */
struct dcp__t0fs {
    const char *vroot; /* no trailing '/' */
    char **roots;      /* n node roots, own first; only roots[0] is used */
    size_t n;
};

extern const dcp_storage_ops dcp__t0fs_ops;

/* "<a>/<b>" in a new string (dcp__free), NULL when out of memory. */
char *dcp__t0_join(const char *a, const char *b);

#endif /* DCP_T0FS_H */
