/*
 * train_mlp: a C training run that checkpoints the way PyTorch does, and
 * resumes on any number of ranks, or in PyTorch.
 *
 *   mpiexec -n 2 train_mlp --steps 60 --every 20 --dir ckpt
 *   mpiexec -n 3 train_mlp --steps 60 --dir ckpt2 --resume ckpt/step-000040
 *
 * The model is a small MLP (16 -> 64 -> 64 -> 8, ReLU, cross-entropy),
 * trained with AdamW on synthetic data that depends only on the seed and
 * the step, data parallel over MPI: each rank takes its share of the batch
 * and owns a slice of one flat parameter space, whose AdamW moments only it
 * keeps and whose parameters only it updates, then shares (ZeRO-1). Every
 * --every steps it saves asynchronously with dcp: training goes on while
 * the checkpoint is written.
 *
 * The checkpoint is what PyTorch's get_state_dict(model, optim) saves for
 * the same nn.Module and torch.optim.AdamW (dcp_statedict.h): model.<fqn>,
 * optim.state.<fqn>.{step,exp_avg,exp_avg_sq}, optim.param_groups.<g>.*
 * (weights decay, biases do not: two groups), plus the run's own settings
 * under trainer.*. So it loads in PyTorch with dcp.load + set_state_dict
 * (tests/interop/test_train_torch_mpi.py does, and trains on), and a
 * checkpoint PyTorch saves that way resumes here.
 *
 * Bit-identical resumption on any number of ranks: each sample's gradient
 * is rounded to a 64-bit fixed-point number (2^-36 resolution) before the
 * ranks sum them, and integer sums do not depend on their order. So the
 * gradient, the update and the loss are the same bits whatever the number
 * of ranks and whichever rank held which sample; the rest of the step
 * (the forward pass of one sample, AdamW on one element) never depended on
 * it. --log writes one line per step with the loss's bits; --expect
 * compares them, and the final parameters' digest, with an earlier log.
 *
 * options: --steps N (60)  --every K (20, 0: never)  --dir DIR (train-ckpt)
 *          --resume CKPT  --batch B (32)  --seed S (1)  --log FILE
 *          --expect FILE  --quiet
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>
#include <dcp/dcp_statedict.h>

/* ------------------------------------------------------------- model */

enum { D_IN = 16, HIDDEN = 64, N_CLASS = 8, N_LAYER = 3 };

static const struct layer {
    const char *w, *b; /* FQNs, as nn.Module names them */
    int out, in;
} layers[N_LAYER] = {{"fc1.weight", "fc1.bias", HIDDEN, D_IN},
                     {"fc2.weight", "fc2.bias", HIDDEN, HIDDEN},
                     {"fc3.weight", "fc3.bias", N_CLASS, HIDDEN}};

/* AdamW as torch.optim.AdamW([{"params": weights, "weight_decay": 0.1},
 * {"params": biases, "weight_decay": 0.0}], lr=3e-3, betas=(0.9, 0.95)). */
static const double LR = 3e-3, BETA1 = 0.9, BETA2 = 0.95, EPS = 1e-8;
static const double WEIGHT_DECAY[2] = {0.1, 0.0};

struct cfg {
    int steps, every, batch, quiet;
    uint64_t seed;
    const char *dir, *resume, *log, *expect;
};

struct run {
    struct cfg c;
    int rank, size;
    int64_t P, lo, hi; /* flat parameters; this rank's slice */
    int64_t woff[N_LAYER], boff[N_LAYER];
    float *params;        /* all P, the same on every rank */
    float *m, *v;         /* AdamW moments of [lo, hi) only */
    int64_t *gq;          /* per-sample gradients, fixed point */
    int64_t *gslice;      /* their sum over ranks, [lo, hi) */
    int *counts, *displs; /* slices of all ranks */
    int64_t step;
    dcp_ctx *ctx;
    dcp_sd *sd;
    dcp_state *st;
    dcp_request *req; /* the checkpoint being written */
    FILE *log;
};

/* ------------------------------------------------------------- data */

static uint64_t mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t hash3(uint64_t seed, uint64_t a, uint64_t b)
{
    return mix(mix(mix(seed) ^ a) ^ b);
}

/*
 * Sample n: 16 features in {-1, -7/8, ..., 1}, and the class a fixed
 * integer "teacher" matrix scores highest (exact arithmetic, so Python
 * computes the same labels). Step s trains on samples (s-1)*B .. s*B-1.
 */
static int sample(uint64_t seed, uint64_t n, float *x)
{
    int j, c, best = 0;
    long score[N_CLASS], xi[D_IN];
    for (j = 0; j < D_IN; j++) {
        xi[j] = (long)(hash3(seed, n, (uint64_t)j) % 17) - 8;
        x[j] = (float)xi[j] / 8.0f;
    }
    for (c = 0; c < N_CLASS; c++) {
        score[c] = 0;
        for (j = 0; j < D_IN; j++)
            score[c] +=
                ((long)(hash3(seed ^ 0x7eac4e5ULL, (uint64_t)c, (uint64_t)j) %
                        7) -
                 3) *
                xi[j];
        if (score[c] > score[best])
            best = c;
    }
    return best;
}

static void init_params(struct run *r)
{
    int l, o, i;
    memset(r->params, 0, (size_t)r->P * sizeof(float));
    for (l = 0; l < N_LAYER; l++) {
        float scale = 1.0f / sqrtf((float)layers[l].in);
        float *w = r->params + r->woff[l];
        for (o = 0; o < layers[l].out; o++)
            for (i = 0; i < layers[l].in; i++) {
                uint64_t h = hash3(r->c.seed ^ 0x1417ULL,
                                   (uint64_t)(l * 1000 + o), (uint64_t)i);
                w[o * layers[l].in + i] =
                    (float)((int)(h % 2001) - 1000) / 1000.0f * scale;
            }
    }
}

/* --------------------------------------------------- forward, backward */

/* Fixed point: 2^-36 resolution; |value| < 2^16 keeps a sum of up to 2^10
 * samples inside int64. */
static const double QSCALE = 68719476736.0; /* 2^36 */

static int quantize(float g, int64_t *acc)
{
    double x = (double)g * QSCALE;
    if (!(fabs(x) < 4503599627370496.0)) /* 2^52 = 2^16 * 2^36 */
        return -1;
    *acc += llrint(x);
    return 0;
}

/* out[o] = b[o] + sum_i w[o][i] in[i], then ReLU when relu. */
static void linear(const float *w, const float *b, const float *in, float *out,
                   int nout, int nin, int relu)
{
    int o, i;
    for (o = 0; o < nout; o++) {
        float a = b[o];
        for (i = 0; i < nin; i++)
            a += w[o * nin + i] * in[i];
        out[o] = relu && a < 0.0f ? 0.0f : a;
    }
}

/*
 * One sample: forward, cross-entropy, backward; the gradient of every
 * parameter added (fixed point) to r->gq, the loss to *lq. Returns 0, or
 * -1 when a value leaves the fixed-point range.
 */
static int sample_grad(struct run *r, const float *x, int y, int64_t *lq)
{
    const float *p = r->params;
    float h1[HIDDEN], h2[HIDDEN], z[N_CLASS], dz[N_CLASS];
    float d2[HIDDEN], d1[HIDDEN], zmax, sum = 0.0f;
    const float *acts[N_LAYER] = {x, h1, h2};
    float *deltas[N_LAYER] = {d1, d2, dz};
    int l, o, i, c, bad = 0;
    linear(p + r->woff[0], p + r->boff[0], x, h1, HIDDEN, D_IN, 1);
    linear(p + r->woff[1], p + r->boff[1], h1, h2, HIDDEN, HIDDEN, 1);
    linear(p + r->woff[2], p + r->boff[2], h2, z, N_CLASS, HIDDEN, 0);
    zmax = z[0];
    for (c = 1; c < N_CLASS; c++)
        zmax = z[c] > zmax ? z[c] : zmax;
    for (c = 0; c < N_CLASS; c++) {
        dz[c] = expf(z[c] - zmax);
        sum += dz[c];
    }
    for (c = 0; c < N_CLASS; c++)
        dz[c] = dz[c] / sum - (c == y ? 1.0f : 0.0f);
    bad |= quantize(zmax + logf(sum) - z[y], lq);
    /* Deltas of the hidden layers: W^T delta, through the ReLU. */
    for (l = N_LAYER - 1; l > 0; l--) {
        const float *w = p + r->woff[l];
        const struct layer *L = &layers[l];
        for (i = 0; i < L->in; i++) {
            float a = 0.0f;
            for (o = 0; o < L->out; o++)
                a += w[o * L->in + i] * deltas[l][o];
            deltas[l - 1][i] = acts[l][i] > 0.0f ? a : 0.0f;
        }
    }
    for (l = 0; l < N_LAYER; l++) {
        const struct layer *L = &layers[l];
        int64_t *gw = r->gq + r->woff[l], *gb = r->gq + r->boff[l];
        for (o = 0; o < L->out; o++) {
            for (i = 0; i < L->in; i++)
                bad |= quantize(deltas[l][o] * acts[l][i], &gw[o * L->in + i]);
            bad |= quantize(deltas[l][o], &gb[o]);
        }
    }
    return bad;
}

/* ------------------------------------------------------------- AdamW */

/*
 * torch.optim.AdamW's update (_single_tensor_adam, decoupled weight
 * decay), in the same float32 operations, on this rank's slice. g: the
 * mean gradient of element e.
 */
static void adamw(struct run *r, int64_t e, float g, int group, double t)
{
    float *p = &r->params[e], *m = &r->m[e - r->lo], *v = &r->v[e - r->lo];
    double bc1 = 1.0 - pow(BETA1, t), bc2 = 1.0 - pow(BETA2, t);
    double step_size = LR / bc1, bc2_sqrt = sqrt(bc2);
    float denom;
    if (WEIGHT_DECAY[group] != 0.0)
        *p = *p * (float)(1.0 - LR * WEIGHT_DECAY[group]);
    *m = *m + (float)(1.0 - BETA1) * (g - *m); /* lerp, weight < 0.5 */
    *v = *v * (float)BETA2;
    *v = *v + (float)(1.0 - BETA2) * g * g;
    denom = sqrtf(*v) / (float)bc2_sqrt + (float)EPS;
    *p = *p + (float)(-step_size) * *m / denom;
}

/* Group of flat element e: 0 for weights, 1 for biases. */
static int group_of(const struct run *r, int64_t e)
{
    int l;
    for (l = 0; l < N_LAYER; l++)
        if (e >= r->boff[l] && e < r->boff[l] + layers[l].out)
            return 1;
    return 0;
}

/* Step r->step + 1 on batch r->step + 1: returns its loss (before the
 * update), the same on every rank. */
static double train_step(struct run *r)
{
    int64_t n0 = r->step * r->c.batch, e, lq = 0, lsum = 0;
    int64_t first = (int64_t)r->c.batch * r->rank / r->size;
    int64_t last = (int64_t)r->c.batch * (r->rank + 1) / r->size;
    int64_t i, bad = 0, anybad = 0;
    float x[D_IN];
    memset(r->gq, 0, (size_t)r->P * sizeof(*r->gq));
    for (i = first; i < last; i++) {
        int y = sample(r->c.seed, (uint64_t)(n0 + i), x);
        bad |= sample_grad(r, x, y, &lq);
    }
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT64_T, MPI_BOR, MPI_COMM_WORLD);
    if (anybad) {
        if (r->rank == 0)
            fprintf(stderr,
                    "train_mlp: a gradient left the fixed-point "
                    "range at step %" PRId64 "\n",
                    r->step + 1);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Integer sums: the same bits whatever the number of ranks. Each rank
     * receives the sum of its own slice only (ZeRO-1). */
    MPI_Reduce_scatter(r->gq, r->gslice, r->counts, MPI_INT64_T, MPI_SUM,
                       MPI_COMM_WORLD);
    MPI_Allreduce(&lq, &lsum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    r->step++;
    for (e = r->lo; e < r->hi; e++) {
        float g =
            (float)((double)r->gslice[e - r->lo] / QSCALE / (double)r->c.batch);
        adamw(r, e, g, group_of(r, e), (double)r->step);
    }
    MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, r->params, r->counts, r->displs,
                   MPI_FLOAT, MPI_COMM_WORLD);
    return (double)lsum / QSCALE / (double)r->c.batch;
}

/* ------------------------------------------------------- checkpoints */

static void fail(struct run *r, const char *what, int rc)
{
    if (r->rank == 0)
        fprintf(stderr, "train_mlp: %s failed: %s (%s)\n", what,
                dcp_strerror(rc), dcp_errmsg(r->ctx));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/*
 * The description of model and optimizer (the same on every rank) and
 * the state one checkpoint holds: the sd's entries under "model" and
 * "optim", and the run's settings under "trainer".
 */
static void make_state(struct run *r)
{
    dcp_adamw hp;
    int64_t shape[2];
    int l, g, rc;
    rc = dcp_sd_create(&r->sd, DCP_F32);
    for (g = 0; rc == DCP_OK && g < 2; g++) {
        dcp_adamw_defaults(&hp);
        hp.lr = LR;
        hp.beta1 = BETA1;
        hp.beta2 = BETA2;
        hp.eps = EPS;
        hp.weight_decay = WEIGHT_DECAY[g];
        rc = dcp_sd_add_group(r->sd, &hp);
    }
    /* The flat space in the order the parameters lie in r->params. */
    for (l = 0; rc == DCP_OK && l < N_LAYER; l++) {
        shape[0] = layers[l].out;
        shape[1] = layers[l].in;
        rc = dcp_sd_add_param(r->sd, 0, layers[l].w, 2, shape);
        if (rc == DCP_OK)
            rc = dcp_sd_add_param(r->sd, 1, layers[l].b, 1, shape);
    }
    if (rc == DCP_OK)
        rc = dcp_state_create(&r->st);
    if (rc == DCP_OK)
        rc = dcp_sd_add_to_state(r->sd, r->st, "model", "optim");
    if (rc == DCP_OK)
        rc = dcp_state_push(r->st, "trainer");
    if (rc == DCP_OK)
        rc = dcp_state_add_value(r->st, "batch", dcp_value_int(r->c.batch));
    if (rc == DCP_OK)
        rc = dcp_state_add_value(r->st, "seed",
                                 dcp_value_int((int64_t)r->c.seed));
    if (rc == DCP_OK)
        rc = dcp_state_pop(r->st);
    if (rc != DCP_OK)
        fail(r, "building the state", rc);
}

/* Saving: each rank writes its slice of the parameters and moments. */
static void bind_for_save(struct run *r)
{
    int rc = dcp_sd_bind_model(r->sd, r->lo, r->hi, r->params + r->lo);
    if (rc == DCP_OK)
        rc = dcp_sd_bind_optim(r->sd, r->lo, r->hi, r->m, r->v);
    if (rc == DCP_OK)
        rc = dcp_sd_set_step(r->sd, r->step);
    if (rc != DCP_OK)
        fail(r, "binding the buffers", rc);
}

/* Starts the save of step r->step; the previous one must be finished. */
static void checkpoint(struct run *r)
{
    char path[4096];
    int rc;
    if (r->req) {
        rc = dcp_request_wait(r->req);
        if (rc != DCP_OK)
            fail(r, "the previous checkpoint", rc);
        dcp_request_free(r->req);
        r->req = NULL;
    }
    snprintf(path, sizeof(path), "%s/step-%06" PRId64, r->c.dir, r->step);
    bind_for_save(r);
    rc = dcp_save_async(r->ctx, r->st, path, NULL, &r->req);
    if (rc != DCP_OK)
        fail(r, "dcp_save_async", rc);
    if (r->rank == 0 && !r->c.quiet)
        printf("step %4" PRId64 "  checkpoint %s (written in the "
               "background)\n",
               r->step, path);
}

/* Loading: every rank needs all parameters, and its slice of the moments,
 * whatever slicing and number of ranks the checkpoint was saved with. */
static void resume(struct run *r)
{
    int rc = dcp_sd_bind_model(r->sd, 0, r->P, r->params);
    if (rc == DCP_OK)
        rc = dcp_sd_bind_optim(r->sd, r->lo, r->hi, r->m, r->v);
    if (rc == DCP_OK)
        rc = dcp_sd_load(r->ctx, r->sd, r->st, r->c.resume, NULL, 0);
    if (rc != DCP_OK)
        fail(r, "dcp_sd_load", rc);
    if (dcp_value_as_int(dcp_state_value(r->st, "trainer.batch")) !=
            r->c.batch ||
        dcp_value_as_int(dcp_state_value(r->st, "trainer.seed")) !=
            (int64_t)r->c.seed) {
        if (r->rank == 0)
            fprintf(stderr,
                    "train_mlp: %s was trained with --batch %" PRId64
                    " --seed %" PRId64 "\n",
                    r->c.resume,
                    dcp_value_as_int(dcp_state_value(r->st, "trainer.batch")),
                    dcp_value_as_int(dcp_state_value(r->st, "trainer.seed")));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    r->step = dcp_sd_step(r->sd);
    if (r->rank == 0 && !r->c.quiet)
        printf("resumed from %s at step %" PRId64 " on %d rank%s\n",
               r->c.resume, r->step, r->size, r->size == 1 ? "" : "s");
}

/* ------------------------------------------------------- logs, setup */

static uint64_t digest(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    size_t i;
    for (i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

static uint64_t bits(double x)
{
    uint64_t u;
    memcpy(&u, &x, sizeof(u));
    return u;
}

/* Compares this run's log with an earlier one: every step both have
 * must have the same loss bits, and the final parameters the same digest
 * when both ended at the same step. Returns the number of differences. */
static int compare_logs(const char *mine, const char *theirs, int quiet)
{
    FILE *a = fopen(mine, "r"), *b = fopen(theirs, "r");
    char line[256];
    static uint64_t want[1 << 16], wdig;
    static char have[1 << 16];
    long s, same = 0, diff = 0, wstep = -1, dstep;
    unsigned long long u;
    if (!a || !b) {
        fprintf(stderr, "train_mlp: cannot open %s or %s\n", mine, theirs);
        if (a)
            fclose(a);
        if (b)
            fclose(b);
        return 1;
    }
    while (fgets(line, sizeof(line), b)) {
        if (sscanf(line, "step %ld loss %*s %llx", &s, &u) == 2 && s >= 0 &&
            s < (1 << 16)) {
            want[s] = u;
            have[s] = 1;
        } else if (sscanf(line, "params %ld %llx", &s, &u) == 2) {
            wstep = s;
            wdig = u;
        }
    }
    while (fgets(line, sizeof(line), a)) {
        if (sscanf(line, "step %ld loss %*s %llx", &s, &u) == 2 && s >= 0 &&
            s < (1 << 16) && have[s]) {
            if (want[s] == u) {
                same++;
            } else {
                diff++;
                fprintf(stderr,
                        "step %ld: loss bits %016llx, expected "
                        "%016" PRIx64 "\n",
                        s, u, want[s]);
            }
        } else if (sscanf(line, "params %ld %llx", &dstep, &u) == 2 &&
                   dstep == wstep) {
            if (u != wdig) {
                diff++;
                fprintf(stderr,
                        "parameters at step %ld: digest %016llx, "
                        "expected %016" PRIx64 "\n",
                        dstep, u, wdig);
            } else if (!quiet) {
                printf("parameters at step %ld: bit-identical (digest "
                       "%016llx)\n",
                       dstep, u);
            }
        }
    }
    fclose(a);
    fclose(b);
    if (!same && !diff)
        diff = 1;
    if (!quiet || diff)
        printf("compared with %s: %ld steps with bit-identical losses, %ld "
               "different\n",
               theirs, same, diff);
    return diff ? 1 : 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: train_mlp [--steps N] [--every K] [--dir DIR] "
                    "[--resume CKPT]\n"
                    "                 [--batch B] [--seed S] [--log FILE] "
                    "[--expect FILE] [--quiet]\n");
    exit(2);
}

static void parse(int argc, char **argv, struct cfg *c)
{
    int i;
    memset(c, 0, sizeof(*c));
    c->steps = 60;
    c->every = 20;
    c->batch = 32;
    c->seed = 1;
    c->dir = "train-ckpt";
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--quiet")) {
            c->quiet = 1;
            continue;
        }
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--steps"))
            c->steps = atoi(v);
        else if (!strcmp(a, "--every"))
            c->every = atoi(v);
        else if (!strcmp(a, "--batch"))
            c->batch = atoi(v);
        else if (!strcmp(a, "--seed"))
            c->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--dir"))
            c->dir = v;
        else if (!strcmp(a, "--resume"))
            c->resume = v;
        else if (!strcmp(a, "--log"))
            c->log = v;
        else if (!strcmp(a, "--expect"))
            c->expect = v;
        else
            usage();
    }
    if (c->steps < 0 || c->steps >= (1 << 16) || c->every < 0 || c->batch < 1 ||
        c->batch > 1024)
        usage();
}

static void setup(struct run *r)
{
    int64_t off = 0;
    int l, k;
    for (l = 0; l < N_LAYER; l++) {
        r->woff[l] = off;
        off += (int64_t)layers[l].out * layers[l].in;
        r->boff[l] = off;
        off += layers[l].out;
    }
    r->P = off;
    r->lo = r->P * r->rank / r->size;
    r->hi = r->P * (r->rank + 1) / r->size;
    r->params = malloc((size_t)r->P * sizeof(float));
    r->m = calloc((size_t)(r->hi - r->lo) + 1, sizeof(float));
    r->v = calloc((size_t)(r->hi - r->lo) + 1, sizeof(float));
    r->gq = malloc((size_t)r->P * sizeof(int64_t));
    r->gslice = malloc((size_t)(r->hi - r->lo + 1) * sizeof(int64_t));
    r->counts = malloc((size_t)r->size * sizeof(int));
    r->displs = malloc((size_t)r->size * sizeof(int));
    if (!r->params || !r->m || !r->v || !r->gq || !r->gslice || !r->counts ||
        !r->displs) {
        fprintf(stderr, "train_mlp: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (k = 0; k < r->size; k++) {
        r->displs[k] = (int)(r->P * k / r->size);
        r->counts[k] = (int)(r->P * (k + 1) / r->size) - r->displs[k];
    }
    init_params(r);
}

int main(int argc, char **argv)
{
    struct run r;
    dcp_comm *comm = NULL;
    double t0, loss;
    int provided, rc, status = 0;
    memset(&r, 0, sizeof(r));
    /* dcp's background writer never calls MPI: FUNNELED is enough. */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &r.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &r.size);
    parse(argc, argv, &r.c);
    setup(&r);
    rc = dcp_comm_mpi(&comm, MPI_COMM_WORLD);
    if (rc == DCP_OK)
        rc = dcp_ctx_create(&r.ctx, comm, NULL);
    if (rc != DCP_OK)
        fail(&r, "dcp_comm_mpi or dcp_ctx_create", rc);
    make_state(&r);
    if (r.c.resume)
        resume(&r);
    if (r.rank == 0 && r.c.log && !(r.log = fopen(r.c.log, "w"))) {
        fprintf(stderr, "train_mlp: cannot write %s\n", r.c.log);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (r.rank == 0 && !r.c.quiet)
        printf("training %" PRId64 " parameters on %d rank%s, batch %d, "
               "steps %" PRId64 "..%d, AdamW state sharded %" PRId64
               "..%" PRId64 " on rank 0\n",
               r.P, r.size, r.size == 1 ? "" : "s", r.c.batch, r.step + 1,
               r.c.steps, r.lo, r.hi);
    t0 = MPI_Wtime();
    while (r.step < r.c.steps) {
        loss = train_step(&r);
        if (r.log)
            fprintf(r.log, "step %" PRId64 " loss %.9f %016" PRIx64 "\n",
                    r.step, loss, bits(loss));
        if (r.rank == 0 && !r.c.quiet &&
            (r.step % 10 == 0 || r.step == r.c.steps))
            printf("step %4" PRId64 "  loss %.6f\n", r.step, loss);
        if (r.c.every && r.step % r.c.every == 0)
            checkpoint(&r);
    }
    if (r.req) {
        rc = dcp_request_wait(r.req);
        if (rc != DCP_OK)
            fail(&r, "the last checkpoint", rc);
        dcp_request_free(r.req);
    }
    if (r.log) {
        fprintf(r.log, "params %" PRId64 " %016" PRIx64 "\n", r.step,
                digest(r.params, (size_t)r.P * sizeof(float)));
        fclose(r.log);
    }
    if (r.rank == 0 && !r.c.quiet)
        printf("%.3f s for the steps and checkpoints on rank 0\n",
               MPI_Wtime() - t0);
    if (r.rank == 0 && r.c.expect && r.c.log)
        status = compare_logs(r.c.log, r.c.expect, r.c.quiet);
    MPI_Bcast(&status, 1, MPI_INT, 0, MPI_COMM_WORLD);
    dcp_state_free(r.st);
    dcp_sd_free(r.sd);
    dcp_ctx_free(r.ctx);
    dcp_comm_free(comm);
    free(r.params);
    free(r.m);
    free(r.v);
    free(r.gq);
    free(r.gslice);
    free(r.counts);
    free(r.displs);
    MPI_Finalize();
    return status;
}
