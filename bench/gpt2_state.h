/*
 * The benchmark state: GPT-2 small (124M parameters, Hugging Face names)
 * with its AdamW state, fp32, every tensor sharded by rows over the ranks
 * the way DTensor's Shard(0) does (torch.chunk: ceil(rows / world) rows per
 * rank, the last ranks short or empty). Keys as torch's get_state_dict
 * flattens a model and its optimizer: model.<name>,
 * optim.state.<name>.{exp_avg,exp_avg_sq} (sharded) and
 * optim.state.<name>.step (a 0-d tensor, replicated), plus the
 * hyper-parameters of param group 0 (replicated values).
 *
 * bench/torch_dcp_bench.py builds the same tensors for PyTorch DCP.
 * Header-only, public API only; shared by the benchmark programs.
 */
#ifndef DCP_BENCH_GPT2_STATE_H
#define DCP_BENCH_GPT2_STATE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dcp/dcp.h>

struct g2_cfg {
    int layers;    /* 12 */
    int64_t vocab; /* 50257 */
    int64_t dim;   /* 768 */
    int64_t ctx;   /* 1024 */
};

struct g2_tensor {
    char name[96];
    int ndim;
    int64_t shape[2];
    int64_t row0, rows; /* this rank's rows */
    float *buf[3];      /* weight, exp_avg, exp_avg_sq (local rows) */
    void *base[3];      /* their allocations */
    float step;
};

struct g2_state {
    struct g2_tensor *t;
    size_t n;
    uint64_t total_bytes; /* global bytes of the sharded tensors */
    uint64_t local_bytes; /* this rank's */
};

static inline size_t g2_row_elems(const struct g2_tensor *t)
{
    return t->ndim > 1 ? (size_t)t->shape[1] : 1;
}

static inline void g2_add(struct g2_state *s, const char *name, int ndim,
                          int64_t d0, int64_t d1)
{
    struct g2_tensor *t = &s->t[s->n++];
    memset(t, 0, sizeof(*t));
    (void)snprintf(t->name, sizeof(t->name), "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
}

/* The parameter list of GPT-2 (no lm_head: it is tied to wte). */
static inline int g2_params(struct g2_state *s, const struct g2_cfg *c)
{
    char n[96];
    int l;
    s->t = calloc((size_t)c->layers * 12 + 4, sizeof(*s->t));
    s->n = 0;
    if (!s->t)
        return -1;
    g2_add(s, "transformer.wte.weight", 2, c->vocab, c->dim);
    g2_add(s, "transformer.wpe.weight", 2, c->ctx, c->dim);
    for (l = 0; l < c->layers; l++) {
#define G2(suffix, nd, a, b)                                            \
    do {                                                                \
        (void)snprintf(n, sizeof(n), "transformer.h.%d.%s", l, suffix); \
        g2_add(s, n, nd, a, b);                                         \
    } while (0)
        G2("ln_1.weight", 1, c->dim, 0);
        G2("ln_1.bias", 1, c->dim, 0);
        G2("attn.c_attn.weight", 2, c->dim, 3 * c->dim);
        G2("attn.c_attn.bias", 1, 3 * c->dim, 0);
        G2("attn.c_proj.weight", 2, c->dim, c->dim);
        G2("attn.c_proj.bias", 1, c->dim, 0);
        G2("ln_2.weight", 1, c->dim, 0);
        G2("ln_2.bias", 1, c->dim, 0);
        G2("mlp.c_fc.weight", 2, c->dim, 4 * c->dim);
        G2("mlp.c_fc.bias", 1, 4 * c->dim, 0);
        G2("mlp.c_proj.weight", 2, 4 * c->dim, c->dim);
        G2("mlp.c_proj.bias", 1, c->dim, 0);
#undef G2
    }
    g2_add(s, "transformer.ln_f.weight", 1, c->dim, 0);
    g2_add(s, "transformer.ln_f.bias", 1, c->dim, 0);
    return 0;
}

/* A deterministic value for element i of tensor k, kind m (0..2). */
static inline float g2_value(size_t k, int m, uint64_t i)
{
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ ((uint64_t)k << 40) ^
                 ((uint64_t)m << 56);
    x ^= x >> 29;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 32;
    return (float)(x >> 40) * (1.0f / 16777216.0f) - 0.5f;
}

/*
 * Allocates this rank's row shards (aligned to 4096 bytes, plus misalign
 * bytes to test the copying path) and fills them (fill = 1) or zeroes them
 * (fill = 0, for a load). Returns 0 or -1.
 */
static inline int g2_alloc(struct g2_state *s, int rank, int world, int fill,
                           size_t misalign)
{
    size_t k;
    int m;
    s->total_bytes = s->local_bytes = 0;
    for (k = 0; k < s->n; k++) {
        struct g2_tensor *t = &s->t[k];
        int64_t chunk = (t->shape[0] + world - 1) / world;
        size_t re = g2_row_elems(t), n;
        t->row0 = chunk * rank;
        if (t->row0 > t->shape[0])
            t->row0 = t->shape[0];
        t->rows = t->shape[0] - t->row0 < chunk ? t->shape[0] - t->row0 : chunk;
        n = (size_t)t->rows * re;
        s->total_bytes += 3 * (uint64_t)t->shape[0] * re * sizeof(float);
        s->local_bytes += 3 * (uint64_t)n * sizeof(float);
        t->step = 1000.0f;
        for (m = 0; m < 3; m++) {
            void *p = NULL;
            if (posix_memalign(&p, 4096, n * sizeof(float) + misalign + 1))
                return -1;
            t->base[m] = p;
            t->buf[m] = (float *)(void *)((char *)p + misalign);
            if (fill) {
                uint64_t base = (uint64_t)t->row0 * re;
                for (size_t i = 0; i < n; i++)
                    t->buf[m][i] = g2_value(k, m, base + i);
            } else {
                memset(t->buf[m], 0, n * sizeof(float));
            }
        }
    }
    return 0;
}

static inline void g2_free(struct g2_state *s)
{
    for (size_t k = 0; k < s->n; k++)
        for (int m = 0; m < 3; m++)
            free(s->t[k].base[m]);
    free(s->t);
    s->t = NULL;
    s->n = 0;
}

/* Number of elements that differ from g2_value (after a load). */
static inline uint64_t g2_check(const struct g2_state *s)
{
    uint64_t bad = 0;
    size_t k;
    int m;
    for (k = 0; k < s->n; k++) {
        const struct g2_tensor *t = &s->t[k];
        size_t n = (size_t)t->rows * g2_row_elems(t);
        uint64_t base = (uint64_t)t->row0 * g2_row_elems(t);
        for (m = 0; m < 3; m++)
            for (size_t i = 0; i < n; i++)
                bad += t->buf[m][i] != g2_value(k, m, base + i);
        bad += t->step != 1000.0f;
    }
    return bad;
}

/* Adds the state to st (after dcp_state_create). Returns a DCP code. */
static inline int g2_add_to(dcp_state *st, struct g2_state *s)
{
    static const char *const moments[] = {"exp_avg", "exp_avg_sq"};
    int rc = DCP_OK;
    size_t k;
    int m;
    rc = dcp_state_push(st, "model");
    for (k = 0; rc == DCP_OK && k < s->n; k++) {
        struct g2_tensor *t = &s->t[k];
        int64_t off[2] = {t->row0, 0}, sz[2] = {t->rows, t->shape[1]};
        rc = dcp_state_add_tensor(st, t->name, DCP_F32, t->ndim, t->shape, off,
                                  sz, t->rows ? t->buf[0] : NULL, DCP_MEM_HOST);
    }
    if (rc == DCP_OK)
        rc = dcp_state_pop(st);
    if (rc == DCP_OK)
        rc = dcp_state_push(st, "optim");
    if (rc == DCP_OK)
        rc = dcp_state_push(st, "state");
    for (k = 0; rc == DCP_OK && k < s->n; k++) {
        struct g2_tensor *t = &s->t[k];
        int64_t off[2] = {t->row0, 0}, sz[2] = {t->rows, t->shape[1]};
        rc = dcp_state_push(st, t->name);
        for (m = 0; rc == DCP_OK && m < 2; m++)
            rc = dcp_state_add_tensor(
                st, moments[m], DCP_F32, t->ndim, t->shape, off, sz,
                t->rows ? t->buf[m + 1] : NULL, DCP_MEM_HOST);
        if (rc == DCP_OK)
            rc = dcp_state_add_tensor(st, "step", DCP_F32, 0, NULL, NULL, NULL,
                                      &t->step, DCP_MEM_HOST);
        if (rc == DCP_OK)
            rc = dcp_state_pop(st);
    }
    if (rc == DCP_OK)
        rc = dcp_state_pop(st);
    if (rc == DCP_OK)
        rc = dcp_state_push(st, "param_groups");
    if (rc == DCP_OK)
        rc = dcp_state_push_index(st, 0);
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "lr", dcp_value_float(6e-4));
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "eps", dcp_value_float(1e-8));
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "weight_decay", dcp_value_float(0.1));
    if (rc == DCP_OK)
        rc = dcp_state_pop(st);
    if (rc == DCP_OK)
        rc = dcp_state_pop(st);
    if (rc == DCP_OK)
        rc = dcp_state_pop(st);
    return rc;
}

#endif /* DCP_BENCH_GPT2_STATE_H */
