/*
 * Loading (load.c): dcp_load completes a save in flight, expands stateful
 * entries and loads the plain state with dcp__load_state.
 */
#ifndef DCP_LOAD_H
#define DCP_LOAD_H

#include <stdint.h>

#include "ctx.h"

/* dcp_load on a state without stateful entries. Collective. */
int dcp__load_state(dcp_ctx *ctx, dcp_state *st, const char *path,
                    const dcp_load_options *opts);

/* For tests: the bytes a load hints at once on a back end that takes
 * hints (0: the default, 128 MiB). Set it while no load runs. */
extern uint64_t dcp__load_hint_round;

#endif /* DCP_LOAD_H */
