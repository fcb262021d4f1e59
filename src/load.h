/*
 * dcp_load's body, for the entry point in async.c (which completes a save
 * in flight and expands stateful entries around it).
 */
#ifndef DCP_LOAD_H
#define DCP_LOAD_H

#include "ctx.h"

/* dcp_load on a state without stateful entries. Collective. */
int dcp__load_state(dcp_ctx *ctx, dcp_state *st, const char *path,
                    const dcp_load_options *opts);

#endif /* DCP_LOAD_H */
