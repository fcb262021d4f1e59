/*
 * The context: options, the storage back end, the I/O engine and its
 * reports, the last load's key report. dcp_ctx_free lives with the
 * requests (request.c): freeing a context settles its save in flight.
 */
#include "ctx.h"

#include <stddef.h> /* offsetof */
#include <stdio.h>  /* snprintf */
#include <string.h>
#include <time.h>

#include "meta.h"
#include "storage.h"

int dcp_ctx_create(dcp_ctx **out, dcp_comm *comm, const dcp_ctx_options *opts)
{
    dcp_ctx *ctx;
    if (!out)
        return DCP_EINVAL;
    *out = NULL;
    if (opts && opts->struct_size < sizeof(uint32_t))
        return DCP_EINVAL;
    ctx = dcp__calloc(1, sizeof(*ctx));
    if (!ctx)
        return DCP_ENOMEM;
    ctx->comm = comm;
    ctx->rank = comm ? comm->rank : 0;
    ctx->size = comm ? comm->size : 1;
    ctx->max_metadata_bytes = (uint64_t)4 << 30;
    ctx->max_value_bytes = (uint64_t)64 << 20;
    /* A field is read when struct_size covers it, so callers built against
     * an older, shorter struct keep working. */
#define HAS_OPT(field)            \
    (opts && opts->struct_size >= \
                 offsetof(dcp_ctx_options, field) + sizeof(opts->field))
    if (HAS_OPT(max_metadata_bytes) && opts->max_metadata_bytes)
        ctx->max_metadata_bytes = opts->max_metadata_bytes;
    if (HAS_OPT(max_value_bytes) && opts->max_value_bytes)
        ctx->max_value_bytes = opts->max_value_bytes;
    if (HAS_OPT(staging_budget))
        ctx->staging_budget = opts->staging_budget;
    if (ctx->staging_budget && ctx->staging_budget < DCP__STAGING_MIN) {
        dcp__free(ctx);
        return DCP_EINVAL;
    }
    if (HAS_OPT(worker_nice)) {
        if (opts->worker_nice < 0 || opts->worker_nice > 19) {
            dcp__free(ctx);
            return DCP_EINVAL;
        }
        ctx->worker_nice = (int)opts->worker_nice;
    }
    if (HAS_OPT(io_block_bytes)) {
        ctx->io_flags = opts->io_flags & (DCP_IO_NO_DIRECT | DCP_IO_NO_URING);
        ctx->io_depth = opts->io_depth;
        ctx->io_block = opts->io_block_bytes;
        if ((opts->io_flags &
             ~(uint32_t)(DCP_IO_NO_DIRECT | DCP_IO_NO_URING)) ||
            ctx->io_depth > IO_MAX_DEPTH ||
            (ctx->io_block &&
             (ctx->io_block < IO_MIN_BLOCK || ctx->io_block > IO_MAX_BLOCK ||
              ctx->io_block % IO_DATA_ALIGN))) {
            dcp__free(ctx);
            return DCP_EINVAL;
        }
    }
    dcp__ctx_io_clear(ctx, DCP_IO_SAVE);
    dcp__ctx_io_clear(ctx, DCP_IO_LOAD);
    if (dcp__storage_init(
            &ctx->storage, HAS_OPT(storage) ? opts->storage : NULL,
            HAS_OPT(storage_impl) ? opts->storage_impl : NULL) != DCP_OK) {
        dcp__free(ctx);
        return DCP_EINVAL;
    }
#undef HAS_OPT
    *out = ctx;
    return DCP_OK;
}

int dcp__ctx_io_begin(dcp_ctx *ctx, int dirfd, struct io_eng **out)
{
    int rc = DCP_OK;
    if (!ctx->io) {
        uint32_t depth = ctx->io_depth;
        if (!depth) {
            depth = dcp__fs_max_inflight(dirfd);
            depth = depth < IO_DEFAULT_DEPTH ? IO_DEFAULT_DEPTH
                    : depth > IO_MAX_DEPTH   ? IO_MAX_DEPTH
                                             : depth;
        }
        rc = dcp__io_eng_create(&ctx->io, ctx->io_flags, depth, ctx->io_block,
                                &ctx->err);
    }
    if (rc == DCP_OK)
        dcp__io_stats_begin(ctx->io);
    *out = ctx->io;
    return rc;
}

void dcp__ctx_io_clear(dcp_ctx *ctx, int op)
{
    struct io_stats *s = &ctx->io_last[op ? 1 : 0];
    memset(s, 0, sizeof(*s));
    s->direct = s->uring = -1;
}

void dcp__ctx_io_end(dcp_ctx *ctx, int op)
{
    if (ctx->io)
        dcp__io_stats_get(ctx->io, &ctx->io_last[op ? 1 : 0]);
}

int dcp_ctx_io_report(const dcp_ctx *ctx, int op, dcp_io_report *out)
{
    const struct io_stats *s;
    if (!ctx || !out || (op != DCP_IO_SAVE && op != DCP_IO_LOAD) ||
        out->struct_size < sizeof(dcp_io_report))
        return DCP_EINVAL;
    s = &ctx->io_last[op];
    memset(out, 0, sizeof(*out));
    out->struct_size = sizeof(*out);
    out->direct = s->direct;
    out->uring = s->uring;
    (void)snprintf(out->fallback, sizeof(out->fallback), "%s", s->fallback);
    out->bytes = s->bytes;
    out->zero_copy_bytes = s->zero_copy_bytes;
    out->bounce_bytes = s->bounce_bytes;
    out->requests = s->requests;
    out->max_in_flight = s->max_in_flight;
    out->files = s->files;
    out->buffer_bytes = s->buffer_bytes;
    return DCP_OK;
}

void dcp__ld_cache_free(struct ld_cache *lc)
{
    if (!lc)
        return;
    dcp__meta_free(lc->md);
    dcp__buf_free(&lc->sblob);
    dcp__free(lc->path);
    /* as dcp__ro_release (readonce.c, a file above this one) */
    dcp__free(lc->ro.base);
    dcp__free(lc->ro.reader);
    dcp__free(lc->ro.need);
    dcp__free(lc->ro.row);
    dcp__free(lc->ro.out);
    dcp__free(lc->ro.in);
    dcp__free(lc->ro.sink);
    dcp__free(lc);
}

int dcp_ctx_plan_cached(const dcp_ctx *ctx, int op)
{
    if (!ctx || (op != DCP_IO_SAVE && op != DCP_IO_LOAD))
        return 0;
    return ctx->plan_cached[op];
}

void dcp__ctx_clear_report(dcp_ctx *ctx)
{
    size_t i;
    for (i = 0; i < ctx->nmissing; i++)
        dcp__free(ctx->missing[i]);
    for (i = 0; i < ctx->nunexpected; i++)
        dcp__free(ctx->unexpected[i]);
    dcp__free(ctx->missing);
    dcp__free(ctx->unexpected);
    ctx->missing = ctx->unexpected = NULL;
    ctx->nmissing = ctx->nunexpected = 0;
}

int dcp__ctx_report_add(dcp_ctx *ctx, int which, const char *key)
{
    char ***list = which == DCP__REPORT_MISSING ? &ctx->missing
                                                : &ctx->unexpected;
    size_t *n = which == DCP__REPORT_MISSING ? &ctx->nmissing
                                             : &ctx->nunexpected;
    char **nl = dcp__realloc(*list, (*n + 1) * sizeof(**list));
    if (!nl)
        return DCP_ENOMEM;
    *list = nl;
    nl[*n] = dcp__strdup(key);
    if (!nl[*n])
        return DCP_ENOMEM;
    (*n)++;
    return DCP_OK;
}

void dcp__ctx_begin(dcp_ctx *ctx)
{
    dcp__err_clear(&ctx->err);
    dcp__storage_use(&ctx->storage);
}

int dcp_ctx_set_storage(dcp_ctx *ctx, const dcp_storage_ops *ops, void *impl)
{
    struct dcp__storage s;
    if (!ctx || dcp__storage_init(&s, ops, impl) != DCP_OK)
        return DCP_EINVAL;
    ctx->storage = s;
    return DCP_OK;
}

const char *dcp_errmsg(const dcp_ctx *ctx)
{
    if (!ctx)
        return "no context";
    return ctx->err.msg;
}

int dcp_ctx_rank(const dcp_ctx *ctx)
{
    return ctx ? ctx->rank : 0;
}

int dcp_ctx_size(const dcp_ctx *ctx)
{
    return ctx ? ctx->size : 1;
}

size_t dcp_load_report(const dcp_ctx *ctx, int which, const char *const **keys)
{
    if (!ctx) {
        if (keys)
            *keys = NULL;
        return 0;
    }
    if (which == 0) {
        if (keys)
            *keys = (const char *const *)ctx->missing;
        return ctx->nmissing;
    }
    if (keys)
        *keys = (const char *const *)ctx->unexpected;
    return ctx->nunexpected;
}

/* ---------------------------------------------------------------------- */
/* Phase timings and events                                               */
/* ---------------------------------------------------------------------- */

double dcp__now(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void dcp__ph_reset(struct dcp__phrec *r, int op, dcp_event_fn fn, void *arg)
{
    memset(r, 0, sizeof(*r));
    r->fn = fn;
    r->arg = arg;
    r->op = op;
}

static void emit(const struct dcp__phrec *r, int phase, int kind,
                 uint64_t bytes, double secs)
{
    dcp_event ev;
    if (!r->fn)
        return;
    memset(&ev, 0, sizeof(ev));
    ev.struct_size = sizeof(ev);
    ev.op = r->op;
    ev.phase = phase;
    ev.kind = kind;
    ev.bytes = bytes;
    ev.seconds = secs;
    r->fn(&ev, r->arg);
}

double dcp__ph_start(struct dcp__phrec *r, int phase)
{
    emit(r, phase, DCP_EVENT_START, 0, 0);
    return dcp__now();
}

void dcp__ph_end(struct dcp__phrec *r, int phase, double t0, uint64_t bytes)
{
    double d = dcp__now() - t0;
    if (d < 0)
        d = 0;
    if (phase >= 0 && phase < DCP_PHASE_MAX) {
        r->sec[phase] += d;
        r->bytes[phase] += bytes;
    }
    emit(r, phase, DCP_EVENT_END, bytes, d);
}

void dcp__ph_progress(const struct dcp__phrec *r, int phase, uint64_t bytes)
{
    emit(r, phase, DCP_EVENT_PROGRESS, bytes, 0);
}

void dcp__ctx_ph_begin(dcp_ctx *ctx, int op)
{
    dcp__ph_reset(&ctx->ph[op], op, ctx->ev_fn, ctx->ev_arg);
    ctx->ph_t0[op] = dcp__now();
    ctx->ph_wall[op] = 0;
    ctx->ph_done[op] = 0;
}

void dcp__ctx_ph_done(dcp_ctx *ctx, int op)
{
    ctx->ph_wall[op] = dcp__now() - ctx->ph_t0[op];
    ctx->ph_done[op] = 1;
}

const char *dcp_phase_name(int phase)
{
    static const char *const names[] = {"plan",   "stage",  "write",    "fsync",
                                        "agree",  "commit", "metadata", "read",
                                        "verify", "copy",   "exchange"};
    if (phase < 0 || phase >= (int)(sizeof(names) / sizeof(names[0])))
        return "unknown";
    return names[phase];
}

int dcp_ctx_phase_report(const dcp_ctx *ctx, int op, dcp_phase_report *out)
{
    if (!ctx || !out || (op != DCP_IO_SAVE && op != DCP_IO_LOAD) ||
        out->struct_size < sizeof(dcp_phase_report))
        return DCP_EINVAL;
    memset(out, 0, sizeof(*out));
    out->struct_size = sizeof(*out);
    memcpy(out->seconds, ctx->ph[op].sec, sizeof(out->seconds));
    memcpy(out->bytes, ctx->ph[op].bytes, sizeof(out->bytes));
    out->wall_seconds = ctx->ph_wall[op];
    out->complete = ctx->ph_done[op];
    return DCP_OK;
}

int dcp_ctx_set_event_callback(dcp_ctx *ctx, dcp_event_fn fn, void *userdata)
{
    if (!ctx)
        return DCP_EINVAL;
    if (ctx->inflight)
        return dcp__err(&ctx->err, DCP_EBUSY,
                        "event callback: a save is in flight on this context");
    ctx->ev_fn = fn;
    ctx->ev_arg = fn ? userdata : NULL;
    return DCP_OK;
}
