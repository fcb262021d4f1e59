/*
 * The context: error detail, limits, the communicator and the last load's
 * report. Shared by save.c, load.c and inspect.c.
 */
#ifndef DCP_CTX_H
#define DCP_CTX_H

#include "util.h"
#include "comm.h"
#include "storage.h"

struct dcp_ctx {
    struct dcp_err err;
    dcp_comm *comm; /* borrowed; NULL: single process */
    int rank;
    int size;
    uint64_t max_metadata_bytes;
    uint64_t max_value_bytes;
    struct dcp__storage storage; /* the back end (dcp__ctx_begin uses it) */
    /* Last load's report (owned). */
    char **missing;
    size_t nmissing;
    char **unexpected;
    size_t nunexpected;
};

/* At the start of an API call: clears err, makes the context's storage back
 * end the calling thread's current one. */
void dcp__ctx_begin(dcp_ctx *ctx);
void dcp__ctx_clear_report(dcp_ctx *ctx);

#endif /* DCP_CTX_H */
