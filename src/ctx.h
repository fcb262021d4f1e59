/*
 * The context: error detail, limits, the communicator and the last load's
 * report. Shared by save.c, load.c and inspect.c.
 */
#ifndef DCP_CTX_H
#define DCP_CTX_H

#include "util.h"
#include "comm.h"

/* Smallest staging budget accepted (dcp_ctx_options.staging_budget). */
#define DCP__STAGING_MIN ((uint64_t)64 << 10)

struct dcp_ctx {
    struct dcp_err err;
    dcp_comm *comm; /* borrowed; NULL: single process */
    int rank;
    int size;
    uint64_t max_metadata_bytes;
    uint64_t max_value_bytes;
    /* Last load's report (owned). */
    char **missing;
    size_t nmissing;
    char **unexpected;
    size_t nunexpected;
    /* Asynchronous save (async.c): staging budget (0: unbounded), the
     * staging buffers, the background writer (started at the first save),
     * the save in flight (NULL when none). Used on the caller's thread only;
     * the writer thread sees only the job it is given. */
    uint64_t staging_budget;
    struct stg_arena *arena;
    struct dcp_worker *worker;
    struct dcp_request *inflight;
};

/* Clears err at the start of an API call. */
void dcp__ctx_begin(dcp_ctx *ctx);
void dcp__ctx_clear_report(dcp_ctx *ctx);

#endif /* DCP_CTX_H */
