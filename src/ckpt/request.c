/*
 * The entry points of saving and loading, around requests.
 *
 * A save is a job (save.c) that goes begin (collective, caller's thread)
 * -> staging (caller's thread) -> write (the context's worker thread) ->
 * finish (collective, caller's thread). dcp_save_async returns after the
 * staging; dcp_request_wait (or dcp_request_test) runs the finish.
 * dcp_save is the same path, waited for at once; only the copy differs:
 * it writes host tensors straight from the caller's buffers, which stay
 * valid until it returns, so it stages CUDA tensors only.
 *
 * Every communicator call happens in begin and finish, so on the caller's
 * thread; the worker thread only writes files. A context has at most one
 * save in flight (ctx->inflight): any later save or load on it completes
 * that one first, which is collective-safe because every rank has the same
 * save in flight. The request keeps the result.
 */
#include "request.h"

#include <stdio.h>
#include <string.h>

#include "cuda.h"
#include "keycheck.h"
#include "planner.h"
#include "save.h"
#include "stage.h"
#include "stateful.h"
#include "worker.h"

struct dcp_request {
    dcp_ctx *ctx;       /* while in flight, else NULL */
    struct sv_job *job; /* while in flight, else NULL */
    int completed;      /* rc and err hold the result */
    int waited;         /* dcp_request_wait returned it */
    int rc;
    struct dcp_err err;
    struct pn_save ps; /* a planner's converted copies, until complete */
};

/* Hands the job's writing to the worker (unless the job already failed:
 * then finish has nothing to wait for). */
static void post(dcp_ctx *ctx, struct sv_job *job)
{
    struct dcp_err e;
    int rc;
    if (dcp__save_failed(job) != DCP_OK)
        return;
    dcp__err_clear(&e);
    rc = dcp__worker_post(&ctx->worker, ctx->worker_nice, dcp__save_write,
                          job, &e);
    (void)dcp__save_fail(job, rc, &e);
}

/* Begin and staging; *out is the request in flight. Collective. */
static int start(dcp_ctx *ctx, const dcp_state *st, const char *path,
                 const dcp_save_options *opts, int copy_all, dcp_request **out)
{
    struct st_expansion ex;
    struct pn_save ps;
    const dcp_state *use = NULL;
    struct sv_job *job = NULL;
    dcp_request *req;
    int rc;
    double t;
    *out = NULL;
    dcp__async_settle(ctx);
    dcp__ctx_begin(ctx);
    dcp__ctx_ph_begin(ctx, DCP_IO_SAVE);
    t = dcp__ph_start(&ctx->ph[DCP_IO_SAVE], DCP_PHASE_PLAN);
    req = dcp__calloc(1, sizeof(*req));
    rc = req ? dcp__state_expand_io(st, DCP_IO_SAVE, &ex, &ctx->err)
             : dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    if (!req)
        memset(&ex, 0, sizeof(ex));
    memset(&ps, 0, sizeof(ps));
    if (rc == DCP_OK)
        rc = dcp__planner_save(dcp__save_opts_planner(opts), ctx->rank,
                               ctx->size, ex.use, &use, &ps, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__state_check_text(use, &ctx->err);
    rc = dcp__save_begin(ctx, use, path, opts, rc, &job);
    dcp__ph_end(&ctx->ph[DCP_IO_SAVE], DCP_PHASE_PLAN, t, 0);
    if (rc != DCP_OK) {
        dcp__planner_save_release(&ps);
        dcp__state_expand_release(&ex);
        dcp__free(req);
        dcp__ctx_ph_done(ctx, DCP_IO_SAVE);
        return rc;
    }
    (void)dcp__save_prepare_staging(ctx, job, copy_all);
    /* When everything fits in the staging buffers, the copy runs before
     * the worker wakes up: nothing competes with it for the CPU. With a
     * budget, the worker must drain while the copy runs. */
    if (dcp__save_stage_alone(job)) {
        dcp__save_stage(ctx, job);
        post(ctx, job);
    } else {
        post(ctx, job);
        dcp__save_stage(ctx, job);
    }
    /* From here on nothing of st is read: the records were described, the
     * values pickled and the staged tensors copied. A planner's converted
     * copies are read by the writing when they were not staged (dcp_save):
     * the request keeps them until the save completes. */
    dcp__state_expand_release(&ex);
    if (copy_all)
        dcp__planner_save_release(&ps);
    else
        req->ps = ps;
    req->ctx = ctx;
    req->job = job;
    ctx->inflight = req;
    *out = req;
    return DCP_OK;
}

/* Finish: waits for the worker, agrees, commits. Collective. */
static int complete(dcp_request *req)
{
    dcp_ctx *ctx = req->ctx;
    int rc;
    dcp__worker_wait(ctx->worker);
    dcp__ctx_begin(ctx);
    rc = dcp__save_finish(ctx, req->job);
    dcp__ctx_ph_done(ctx, DCP_IO_SAVE);
    dcp__save_job_free(req->job);
    dcp__planner_save_release(&req->ps);
    req->rc = rc;
    req->err = ctx->err;
    req->job = NULL;
    req->ctx = NULL;
    req->completed = 1;
    ctx->inflight = NULL;
    return rc;
}

/* Stops and drops the save in flight on this rank; nothing is committed. */
static void abandon(dcp_request *req, const char *why)
{
    dcp_ctx *ctx = req->ctx;
    struct dcp_err e;
    (void)dcp__err(&e, DCP_EINVAL,
                   "%s while the save to '%s' was in flight; nothing "
                   "committed",
                   why, dcp__save_path(req->job));
    (void)dcp__save_fail(req->job, DCP_EINVAL, &e);
    dcp__worker_wait(ctx->worker);
    dcp__save_job_free(req->job);
    dcp__planner_save_release(&req->ps);
    req->rc = DCP_EINVAL;
    req->err = e;
    req->job = NULL;
    req->ctx = NULL;
    req->completed = 1;
    ctx->inflight = NULL;
}

void dcp__async_settle(dcp_ctx *ctx)
{
    if (ctx->inflight)
        (void)complete(ctx->inflight);
}

void dcp__async_ctx_release(dcp_ctx *ctx)
{
    if (ctx->inflight)
        abandon(ctx->inflight, "the context was freed");
    dcp__worker_free(ctx->worker);
    ctx->worker = NULL;
    dcp__stage_arena_free(ctx->arena);
    ctx->arena = NULL;
}

/* ------------------------------------------------------------- API */

int dcp_save(dcp_ctx *ctx, const dcp_state *st, const char *path,
             const dcp_save_options *opts)
{
    dcp_request *req;
    int rc;
    if (!ctx)
        return DCP_EINVAL;
    rc = start(ctx, st, path, opts, 0, &req);
    if (rc != DCP_OK)
        return rc;
    rc = complete(req);
    dcp__free(req);
    return rc;
}

int dcp_save_async(dcp_ctx *ctx, const dcp_state *st, const char *path,
                   const dcp_save_options *opts, dcp_request **req)
{
    if (req)
        *req = NULL;
    if (!ctx)
        return DCP_EINVAL;
    if (!req) {
        /* Every rank passes the same arguments, so every rank returns
         * here: no collective is skipped by some ranks only. */
        dcp__ctx_begin(ctx);
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "dcp_save_async: no request pointer");
    }
    return start(ctx, st, path, opts, 1, req);
}

int dcp_request_wait(dcp_request *req)
{
    if (!req)
        return DCP_EINVAL;
    if (req->waited) {
        (void)dcp__err(&req->err, DCP_EINVAL,
                       "dcp_request_wait called twice on one request (it "
                       "returned the save's result the first time)");
        return DCP_EINVAL;
    }
    if (!req->completed)
        (void)complete(req);
    req->waited = 1;
    return req->rc;
}

int dcp_request_test(dcp_request *req, int *done)
{
    dcp_ctx *ctx;
    int64_t all;
    int rc;
    if (done)
        *done = 0;
    if (!req || !done)
        return DCP_EINVAL;
    if (req->completed) {
        *done = 1;
        return req->rc;
    }
    ctx = req->ctx;
    /* Done everywhere? The minimum over ranks of "my writing ended". */
    all = dcp__worker_idle(ctx->worker);
    rc = dcp__comm_allreduce_min(ctx->comm, &all, 1, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    if (!all)
        return DCP_OK;
    *done = 1;
    return complete(req);
}

const char *dcp_request_errmsg(const dcp_request *req)
{
    if (!req)
        return "no request";
    return req->completed ? req->err.msg : "";
}

void dcp_request_free(dcp_request *req)
{
    if (!req)
        return;
    if (!req->completed && req->ctx)
        abandon(req, "the request was freed");
    dcp__free(req);
}

uint64_t dcp_ctx_staging_bytes(const dcp_ctx *ctx)
{
    return ctx && ctx->arena ? ctx->arena->cap : 0;
}

void dcp_ctx_free(dcp_ctx *ctx)
{
    if (!ctx)
        return;
    dcp__async_ctx_release(ctx);
    dcp__save_cache_drop(ctx);
    dcp__ld_cache_free(ctx->load_cache);
    dcp__ctx_clear_report(ctx);
    dcp__io_eng_free(ctx->io);
    dcp__storage_forget(&ctx->storage);
    dcp__free(ctx);
}
