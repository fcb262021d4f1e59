/*
 * dcp_demo: save a small model's state (weights, AdamW moments, a step
 * counter and hyper-parameters) as a PyTorch DCP checkpoint, load it back
 * into fresh buffers, load one box that spans two stored chunks, and check
 * every byte.
 *
 *   usage: dcp_demo DIR
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <dcp/dcp.h>

#define CHECK(call)                                                            \
    do {                                                                       \
        int rc_ = (call);                                                      \
        if (rc_ != DCP_OK) {                                                   \
            fprintf(stderr, "dcp_demo: %s failed: %s (%s)\n", #call,           \
                    dcp_errmsg(ctx), dcp_strerror(rc_));                       \
            return 1;                                                          \
        }                                                                      \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct param {
    const char *name;
    int ndim;
    int64_t shape[2];
    float *w, *m, *v; /* weight, exp_avg, exp_avg_sq */
};

static float *filled(size_t n, unsigned seed)
{
    float *p = malloc(n * sizeof(float));
    size_t i;
    for (i = 0; p && i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        p[i] = (float)(seed >> 8) / (float)(1u << 24) - 0.5f;
    }
    return p;
}

static size_t numel(const struct param *p)
{
    return (size_t)p->shape[0] * (size_t)(p->ndim > 1 ? p->shape[1] : 1);
}

/* Adds model.<name> and optim.state.<name>.{exp_avg,exp_avg_sq,step}, the
 * layout torch's get_state_dict uses for a model with AdamW. With halves,
 * each weight is added as two row blocks (two chunks in the file). */
static int add_params(dcp_state *st, struct param *ps, size_t n, int halves,
                      float **bufs)
{
    size_t i;
    int rc = DCP_OK;
    rc |= dcp_state_push(st, "model");
    for (i = 0; i < n; i++) {
        struct param *p = &ps[i];
        float *w = bufs ? bufs[3 * i] : p->w;
        if (halves && p->ndim == 2) {
            int64_t rows = p->shape[0] / 2, cols = p->shape[1];
            int64_t o0[2] = {0, 0}, s0[2] = {rows, cols};
            int64_t o1[2] = {rows, 0}, s1[2] = {p->shape[0] - rows, cols};
            rc |= dcp_state_add_tensor(st, p->name, DCP_F32, 2, p->shape, o0,
                                       s0, w, DCP_MEM_HOST);
            rc |= dcp_state_add_tensor(st, p->name, DCP_F32, 2, p->shape, o1,
                                       s1, w + rows * cols, DCP_MEM_HOST);
        } else {
            rc |= dcp_state_add_tensor(st, p->name, DCP_F32, p->ndim,
                                       p->shape, NULL, NULL, w, DCP_MEM_HOST);
        }
    }
    rc |= dcp_state_pop(st);
    rc |= dcp_state_push(st, "optim");
    rc |= dcp_state_push(st, "state");
    for (i = 0; i < n; i++) {
        struct param *p = &ps[i];
        rc |= dcp_state_push(st, p->name);
        rc |= dcp_state_add_tensor(st, "exp_avg", DCP_F32, p->ndim, p->shape,
                                   NULL, NULL, bufs ? bufs[3 * i + 1] : p->m,
                                   DCP_MEM_HOST);
        rc |= dcp_state_add_tensor(st, "exp_avg_sq", DCP_F32, p->ndim,
                                   p->shape, NULL, NULL,
                                   bufs ? bufs[3 * i + 2] : p->v,
                                   DCP_MEM_HOST);
        rc |= dcp_state_pop(st);
    }
    rc |= dcp_state_pop(st);
    rc |= dcp_state_pop(st);
    return rc;
}

int main(int argc, char **argv)
{
    struct param ps[] = {
        {"fc1.weight", 2, {512, 256}, NULL, NULL, NULL},
        {"fc1.bias", 1, {512, 0}, NULL, NULL, NULL},
        {"fc2.weight", 2, {256, 512}, NULL, NULL, NULL},
        {"fc2.bias", 1, {256, 0}, NULL, NULL, NULL},
    };
    const size_t np = sizeof(ps) / sizeof(ps[0]);
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL, *st2 = NULL, *box = NULL;
    dcp_value *hp;
    float *bufs[3 * 4], boxbuf[4 * 3];
    size_t i, total = 0;
    double t0, t_save, t_load;
    const char *dir = argc > 1 ? argv[1] : "demo-ckpt";
    int64_t boff[2] = {254, 10}, bsize[2] = {4, 3};

    CHECK(dcp_ctx_create(&ctx, NULL, NULL));
    for (i = 0; i < np; i++) {
        ps[i].w = filled(numel(&ps[i]), 1 + (unsigned)i);
        ps[i].m = filled(numel(&ps[i]), 100 + (unsigned)i);
        ps[i].v = filled(numel(&ps[i]), 200 + (unsigned)i);
        total += 3 * numel(&ps[i]) * sizeof(float);
    }

    /* Save: weights in two row blocks each, moments whole, plus values. */
    CHECK(dcp_state_create(&st));
    CHECK(add_params(st, ps, np, 1, NULL));
    CHECK(dcp_state_add_value(st, "step", dcp_value_int(1000)));
    hp = dcp_value_dict();
    dcp_value_dict_set(hp, "lr", dcp_value_float(3e-4));
    dcp_value_dict_set(hp, "name", dcp_value_str("AdamW"));
    CHECK(dcp_state_add_value(st, "hparams", hp));
    t0 = now();
    CHECK(dcp_save(ctx, st, dir, NULL));
    t_save = now() - t0;
    printf("saved %zu keys, %.2f MiB of tensors, to %s in %.3f s\n",
           dcp_state_count(st), (double)total / (1 << 20), dir, t_save);

    /* Load everything into fresh buffers and compare. */
    for (i = 0; i < 3 * np; i++)
        bufs[i] = calloc(numel(&ps[i / 3]), sizeof(float));
    CHECK(dcp_state_create(&st2));
    CHECK(add_params(st2, ps, np, 0, bufs));
    CHECK(dcp_state_add_value(st2, "step", dcp_value_none()));
    CHECK(dcp_state_add_value(st2, "hparams.lr", dcp_value_none()));
    CHECK(dcp_state_add_value(st2, "hparams.name", dcp_value_none()));
    t0 = now();
    CHECK(dcp_load(ctx, st2, dir, NULL));
    t_load = now() - t0;
    for (i = 0; i < np; i++) {
        size_t nb = numel(&ps[i]) * sizeof(float);
        if (memcmp(bufs[3 * i], ps[i].w, nb) ||
            memcmp(bufs[3 * i + 1], ps[i].m, nb) ||
            memcmp(bufs[3 * i + 2], ps[i].v, nb)) {
            fprintf(stderr, "dcp_demo: %s differs after load\n", ps[i].name);
            return 1;
        }
    }
    if (dcp_value_as_int(dcp_state_value(st2, "step")) != 1000) {
        fprintf(stderr, "dcp_demo: step differs after load\n");
        return 1;
    }
    printf("loaded %zu keys in %.3f s: every byte matches, step = %lld, "
           "hparams.name = %s\n",
           dcp_state_count(st2), t_load,
           (long long)dcp_value_as_int(dcp_state_value(st2, "step")),
           dcp_value_as_str(dcp_state_value(st2, "hparams.name"), NULL));

    /* A box of rows 254..257 spans both stored row blocks of fc1.weight. */
    CHECK(dcp_state_create(&box));
    CHECK(dcp_state_push(box, "model"));
    CHECK(dcp_state_add_tensor(box, "fc1.weight", DCP_F32, 2, ps[0].shape,
                               boff, bsize, boxbuf, DCP_MEM_HOST));
    {
        dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, NULL};
        int r, c;
        CHECK(dcp_load(ctx, box, dir, &lo));
        for (r = 0; r < 4; r++)
            for (c = 0; c < 3; c++)
                if (boxbuf[r * 3 + c] !=
                    ps[0].w[(254 + r) * 256 + 10 + c]) {
                    fprintf(stderr, "dcp_demo: box differs\n");
                    return 1;
                }
    }
    printf("loaded a 4x3 box of model.fc1.weight spanning two stored "
           "chunks: matches\n");

    for (i = 0; i < np; i++) {
        free(ps[i].w);
        free(ps[i].m);
        free(ps[i].v);
    }
    for (i = 0; i < 3 * np; i++)
        free(bufs[i]);
    dcp_state_free(st);
    dcp_state_free(st2);
    dcp_state_free(box);
    dcp_ctx_free(ctx);
    return 0;
}
