/*
 * The context: error detail, limits, the communicator and the last load's
 * report. Shared by save.c, load.c and inspect.c.
 */
#ifndef DCP_CTX_H
#define DCP_CTX_H

#include "util.h"
#include "comm.h"
#include "ioengine.h"
#include "storage.h"

/* Smallest staging budget accepted (dcp_ctx_options.staging_budget). */
#define DCP__STAGING_MIN ((uint64_t)64 << 10)

struct dcp_ctx {
    struct dcp_err err;
    dcp_comm *comm; /* borrowed; NULL: single process */
    int rank;
    int size;
    uint64_t max_metadata_bytes;
    uint64_t max_value_bytes;
    /* The I/O engine (created on first use, owned), its settings and the
     * last save's and load's figures (dcp_ctx_io_report). */
    struct io_eng *io;
    unsigned io_flags;
    uint32_t io_depth;
    uint32_t io_block;
    struct io_stats io_last[2];
    struct dcp__storage storage; /* the back end (dcp__ctx_begin uses it) */
    /* Last load's report (owned). */
    char **missing;
    size_t nmissing;
    char **unexpected;
    size_t nunexpected;
    /* Asynchronous save (request.c): staging budget (0: unbounded), the
     * staging buffers, the background writer (started at the first save),
     * the save in flight (NULL when none). Used on the caller's thread only;
     * the writer thread sees only the job it is given. */
    uint64_t staging_budget;
    struct stg_arena *arena;
    struct dcp_worker *worker;
    struct dcp_request *inflight;
};

/* At the start of an API call: clears err, makes the context's storage back
 * end the calling thread's current one. */
void dcp__ctx_begin(dcp_ctx *ctx);

/* The context's I/O engine, created on first use, with its statistics
 * cleared for a new save (op 0) or load (op 1). */
int dcp__ctx_io_begin(dcp_ctx *ctx, struct io_eng **out);
/* Keeps the engine's statistics as the report of op. */
void dcp__ctx_io_end(dcp_ctx *ctx, int op);
/* Resets the report of op to "no data file touched". */
void dcp__ctx_io_clear(dcp_ctx *ctx, int op);
void dcp__ctx_clear_report(dcp_ctx *ctx);

#endif /* DCP_CTX_H */
