/*
 * The context: error detail, limits, the communicator and the last load's
 * report. Shared by the checkpoint code (save, load, inspect, ...) and the
 * layers above it.
 */
#ifndef DCP_CTX_H
#define DCP_CTX_H

#include "util.h"
#include "comm.h"
#include "ioengine.h"
#include "storage.h"

/* Smallest staging budget accepted (dcp_ctx_options.staging_budget). */
#define DCP__STAGING_MIN ((uint64_t)64 << 10)

/*
 * Phase timings and events (dcp_ctx_phase_report, dcp_ctx_set_event_callback).
 * A recorder belongs to one thread at a time: the context's two (save, load)
 * to the caller's thread, a save job's own to the writer thread while it
 * writes (merged into the context's by dcp__save_finish).
 */
struct dcp__phrec {
    dcp_event_fn fn; /* NULL: no events */
    void *arg;
    int op; /* DCP_IO_SAVE or DCP_IO_LOAD */
    double sec[DCP_PHASE_MAX];
    uint64_t bytes[DCP_PHASE_MAX];
};

/* Seconds of CLOCK_MONOTONIC. */
double dcp__now(void);
/* Empties r for op, with the callback fn(arg). */
void dcp__ph_reset(struct dcp__phrec *r, int op, dcp_event_fn fn, void *arg);
/* A phase begins: emits START; returns its start time. */
double dcp__ph_start(struct dcp__phrec *r, int phase);
/* It ends: adds the time since t0 and bytes; emits END. */
void dcp__ph_end(struct dcp__phrec *r, int phase, double t0, uint64_t bytes);
/* Emits PROGRESS with bytes done so far. */
void dcp__ph_progress(const struct dcp__phrec *r, int phase, uint64_t bytes);

struct sv_cache;
struct dcp_metadata;

/* The read-once plan of a load (readonce.h; here because the load plan
 * cache keeps one). */
struct ro_job;
struct ro_plan {
    int on;          /* some chunk is shared */
    size_t nchunks;  /* chunks of the checkpoint (tensor entries) */
    size_t *base;    /* per md entry: index of its first chunk */
    int32_t *reader; /* per chunk: its reader, -1 when not shared */
    uint8_t *need;   /* size * nchunks: need[r * nchunks + g] */
    size_t nshared;  /* chunks shared */
    uint8_t *row;    /* this rank's marks as gathered (NULL: none were) */
    /* When on, the exchange's chunks this rank reads and sends (out) and
     * receives (in), and its sink for pieces (readonce.c): allocated,
     * and agreed on, with the plan. */
    struct ro_job *out, *in;
    size_t nout, nin;
    uint8_t *sink;
};

/* The load plan cache (load.c): the decoded .metadata of the last
 * successful load, identified by its bytes' hash and length (id), with
 * the path, flags and state structure it was checked against and the
 * read-once plan made for it. */
struct ld_cache {
    int64_t id[2];
    struct dcp_metadata *md;
    struct dcp_buf sblob; /* the state's structure (plan.h) */
    unsigned flags;
    char *path;
    struct ro_plan ro;
};

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
    int worker_nice; /* dcp_ctx_options.worker_nice */
    struct stg_arena *arena;
    struct dcp_worker *worker;
    struct dcp_request *inflight;
    /* Phase timings of the last save and load, their start and wall time,
     * whether they completed; the event callback. */
    struct dcp__phrec ph[2];
    double ph_t0[2];
    double ph_wall[2];
    int ph_done[2];
    dcp_event_fn ev_fn;
    void *ev_arg;
    /* Plan cache (save.c): the last successful save's plan, the count of
     * successful saves (equal on every rank) and whether the last save
     * (op 0) or load (op 1) reused a cached plan. */
    struct sv_cache *plan_cache;
    struct ld_cache *load_cache;
    uint64_t saves;
    int plan_cached[2];
};

/* At the start of an API call: clears err, makes the context's storage back
 * end the calling thread's current one. */
void dcp__ctx_begin(dcp_ctx *ctx);

/* The context's I/O engine, created on first use, with its statistics
 * cleared for a new save (op 0) or load (op 1). dirfd is the directory
 * handle the call reads or writes: when the context's io_depth is the
 * default, the engine is created with as many slots as its back end
 * takes requests in flight (dcp__fs_max_inflight: S3's 16), at least the
 * default 8 and at most IO_MAX_DEPTH. */
int dcp__ctx_io_begin(dcp_ctx *ctx, int dirfd, struct io_eng **out);
/* Keeps the engine's statistics as the report of op. */
void dcp__ctx_io_end(dcp_ctx *ctx, int op);
/* Resets the report of op to "no data file touched". */
void dcp__ctx_io_clear(dcp_ctx *ctx, int op);
/* Frees a load plan cache (NULL: no-op). */
void dcp__ld_cache_free(struct ld_cache *lc);

/* Empties the last load's report (dcp_load_report). */
void dcp__ctx_clear_report(dcp_ctx *ctx);
/* The report's lists, numbered as dcp_load_report's which. */
enum { DCP__REPORT_MISSING = 0, DCP__REPORT_UNEXPECTED = 1 };
/* Appends a copy of key to the report's list which. DCP_OK or DCP_ENOMEM
 * (no message set; the list stays valid, without key). Used by dcp_load
 * (load.c) and dcp_load_file (loadfile.c). */
int dcp__ctx_report_add(dcp_ctx *ctx, int which, const char *key);

/* A new save (op DCP_IO_SAVE) or load begins on ctx: its report emptied,
 * its wall clock started. */
void dcp__ctx_ph_begin(dcp_ctx *ctx, int op);
/* It completed: its wall time kept. */
void dcp__ctx_ph_done(dcp_ctx *ctx, int op);

#endif /* DCP_CTX_H */
