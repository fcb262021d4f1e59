/*
 * async_train: a training loop that checkpoints every few steps. Run once
 * with the blocking dcp_save and once with dcp_save_async, which returns
 * as soon as the state is copied into dcp's staging buffers: the next
 * steps compute while the checkpoint is written in the background. At the
 * end, the last checkpoint is loaded back and compared with the values the
 * model had when that save was called.
 *
 *   usage: async_train DIR [MIB [STEPS [EVERY]]]
 *          (defaults: 64 MiB of weights and moments, 24 steps, a
 *          checkpoint every 4 steps)
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dcp/dcp.h>

#define NP 8 /* parameters */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct model {
    size_t n; /* floats per tensor */
    float *w[NP], *m[NP];
    int64_t step;
};

/* One "training step": a momentum update of every weight. */
static void train_step(struct model *md)
{
    size_t p, i;
    for (p = 0; p < NP; p++) {
        float *w = md->w[p], *m = md->m[p];
        for (i = 0; i < md->n; i++) {
            float g = sinf(w[i] * 0.5f + (float)md->step) * 0.01f;
            m[i] = 0.9f * m[i] + 0.1f * g;
            w[i] -= 0.1f * m[i];
        }
    }
    md->step++;
}

static dcp_state *state_of(struct model *md)
{
    int64_t shape[1] = {(int64_t)md->n};
    dcp_state *st;
    char name[32];
    size_t p;
    if (dcp_state_create(&st) != DCP_OK)
        return NULL;
    for (p = 0; p < NP; p++) {
        snprintf(name, sizeof(name), "model.layer%zu.weight", p);
        dcp_state_add_tensor(st, name, DCP_F32, 1, shape, NULL, NULL, md->w[p],
                             DCP_MEM_HOST);
        snprintf(name, sizeof(name), "optim.layer%zu.momentum", p);
        dcp_state_add_tensor(st, name, DCP_F32, 1, shape, NULL, NULL, md->m[p],
                             DCP_MEM_HOST);
    }
    dcp_state_add_value(st, "step", dcp_value_int(md->step));
    return st;
}

static void model_init(struct model *md, size_t n)
{
    size_t p, i;
    md->n = n;
    md->step = 0;
    for (p = 0; p < NP; p++) {
        md->w[p] = malloc(n * sizeof(float));
        md->m[p] = calloc(n, sizeof(float));
        for (i = 0; i < n; i++)
            md->w[p][i] = (float)((i * 2654435761u + p) % 1000) * 1e-3f;
    }
}

static void model_free(struct model *md)
{
    size_t p;
    for (p = 0; p < NP; p++) {
        free(md->w[p]);
        free(md->m[p]);
    }
}

/* Trains for steps, saving every `every` steps. *blocked: seconds the
 * loop spent in the save calls; *tail: in the final wait; *total: all.
 * The model as it was at the last save is copied into last. */
static int run(const char *dir, size_t n, int steps, int every, int async,
               double *blocked, double *tail, double *total, struct model *last)
{
    dcp_ctx *ctx;
    dcp_request *req = NULL, *prev;
    dcp_state *st;
    struct model md;
    double t0 = now(), t;
    int s, rc = DCP_OK;
    size_t p;
    *blocked = *tail = 0;
    if (dcp_ctx_create(&ctx, NULL, NULL) != DCP_OK)
        return DCP_ENOMEM;
    model_init(&md, n);
    for (s = 1; s <= steps && rc == DCP_OK; s++) {
        train_step(&md);
        if (s % every)
            continue;
        st = state_of(&md);
        for (p = 0; p < NP; p++) {
            memcpy(last->w[p], md.w[p], n * sizeof(float));
            memcpy(last->m[p], md.m[p], n * sizeof(float));
        }
        last->step = md.step;
        t = now();
        if (async) {
            /* The call first completes the previous save if it is still
             * in flight; that save's result stays in its request. */
            prev = req;
            rc = dcp_save_async(ctx, st, dir, NULL, &req);
            if (prev) {
                int prc = dcp_request_wait(prev); /* no waiting left */
                rc = rc == DCP_OK ? prc : rc;
                dcp_request_free(prev);
            }
        } else {
            rc = dcp_save(ctx, st, dir, NULL);
        }
        *blocked += now() - t;
        dcp_state_free(st); /* the save no longer needs it */
    }
    if (req) {
        t = now();
        if (rc == DCP_OK)
            rc = dcp_request_wait(req);
        *tail = now() - t;
        dcp_request_free(req);
    }
    *total = now() - t0;
    if (rc != DCP_OK)
        fprintf(stderr, "async_train: %s\n", dcp_errmsg(ctx));
    model_free(&md);
    dcp_ctx_free(ctx);
    return rc;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : NULL;
    long mib = argc > 2 ? strtol(argv[2], NULL, 10) : 64;
    int steps = argc > 3 ? atoi(argv[3]) : 24;
    int every = argc > 4 ? atoi(argv[4]) : 4;
    size_t n, p;
    struct model last, got;
    double b_sync, w_sync, t_sync, b_async, w_async, t_async;
    dcp_ctx *ctx;
    dcp_state *st;
    int rc, same = 1;
    if (!dir || mib < 1 || steps < 1 || every < 1) {
        fprintf(stderr, "usage: async_train DIR [MIB [STEPS [EVERY]]]\n");
        return 2;
    }
    n = ((size_t)mib << 20) / (2 * NP * sizeof(float));
    model_init(&last, n);
    model_init(&got, n);
    printf("%ld MiB of state, %d steps, a checkpoint every %d steps\n", mib,
           steps, every);
    if (run(dir, n, steps, every, 0, &b_sync, &w_sync, &t_sync, &last) !=
        DCP_OK)
        return 1;
    printf("dcp_save:       %.2f s in all, %.2f s of it blocked in %d saves\n",
           t_sync, b_sync, steps / every);
    if (run(dir, n, steps, every, 1, &b_async, &w_async, &t_async, &last) !=
        DCP_OK)
        return 1;
    printf("dcp_save_async: %.2f s in all, %.2f s of it blocked in %d saves "
           "(staging; the first one also allocates the staging buffers), "
           "%.2f s in the final dcp_request_wait\n",
           t_async, b_async, steps / every, w_async);
    printf("overlap: %.2f s of checkpoint writing hidden behind training\n",
           (t_sync - t_async) > 0 ? t_sync - t_async : 0.0);

    /* The last checkpoint holds the model as it was when saved. */
    dcp_ctx_create(&ctx, NULL, NULL);
    st = state_of(&got);
    rc = dcp_load(ctx, st, dir, NULL);
    for (p = 0; rc == DCP_OK && p < NP; p++)
        same &= !memcmp(got.w[p], last.w[p], n * sizeof(float)) &&
                !memcmp(got.m[p], last.m[p], n * sizeof(float));
    if (rc == DCP_OK)
        same &= dcp_value_as_int(dcp_state_value(st, "step")) == last.step;
    printf("last checkpoint (step %lld): %s\n", (long long)last.step,
           rc != DCP_OK ? dcp_errmsg(ctx)
           : same       ? "loaded back bit-exact"
                        : "DIFFERS");
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    model_free(&last);
    model_free(&got);
    return rc == DCP_OK && same ? 0 : 1;
}
