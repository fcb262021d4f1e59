/*
 * gpt2_demo: a GPT-2-small-sized training state saved by 4 MPI ranks and
 * loaded back, resharded, by 3.
 *
 *   mpiexec -n 4 gpt2_demo save DIR [options]   each rank saves its rows
 *   mpiexec -n 3 gpt2_demo load DIR [options]   each rank loads other rows
 *                                               and checks every byte
 * options (give the same ones to save and load):
 *   --layers N (12)  --dim N (768)  --vocab N (50257)  --positions N (1024)
 *
 * The state is what PyTorch's get_state_dict(model, optimizer) gives for
 * Hugging Face's GPT2LMHeadModel trained with AdamW, as
 * torch.distributed.checkpoint flattens it:
 *   model.<fqn>                       fp32 parameter
 *   optim.state.<fqn>.exp_avg         fp32, the parameter's shape
 *   optim.state.<fqn>.exp_avg_sq      fp32, the parameter's shape
 *   optim.state.<fqn>.step            fp32 0-d tensor, the same on every rank
 *   optim.param_groups.0.<field>      lr, betas, eps, weight_decay, params
 * with <fqn> = transformer.wte.weight, transformer.h.0.attn.c_attn.weight,
 * ... (lm_head.weight is tied to wte and left out, as in the 124M count).
 *
 * Sharding: every tensor, 1-D ones too, is split by rows (dimension 0):
 * rank r of n holds rows [R*r/n, R*(r+1)/n) of a tensor with R rows, which
 * is uneven where n does not divide R (wte's 50257 rows over 4 or 3 ranks).
 * The 0-d steps and the param_groups values are replicated: every rank adds
 * them, dcp writes each once. Element i of a tensor (in row-major order)
 * holds a value computed from the tensor's key and i, so each rank fills
 * and checks its own rows without ever holding a whole tensor.
 *
 * Only the public API is used (dcp.h, dcp_mpi.h). MPI calls are not
 * checked: MPI_COMM_WORLD's default error handler ends the job on error.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h> /* statvfs: free space before saving */

#include <mpi.h>

#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#define GB   1e9
#define STEP 1000.0f /* the optimizer step every rank saves */

struct param {
    char fqn[64]; /* e.g. "transformer.h.0.attn.c_attn.weight" */
    int ndim;     /* 1 or 2 */
    int64_t shape[2];
};

/* The three fp32 tensors kept per parameter. A value is u * scale - shift
 * with u uniform in [0, 1): plausible magnitudes, exp_avg_sq >= 0. */
static const struct kind {
    const char *name; /* NULL: the parameter itself */
    float scale, shift;
} kinds[3] = {{NULL, 0.08f, 0.04f},
              {"exp_avg", 2e-3f, 1e-3f},
              {"exp_avg_sq", 1e-6f, 0.0f}};

/* One tensor box this rank holds: kind k of parameter p, rows
 * [row0, row0 + nrows). */
struct shard {
    const struct param *p;
    int k;
    int64_t row0, nrows;
    size_t first, count; /* row-major index of the first element; elements */
    uint64_t seed;       /* from the tensor's key */
    float *buf;          /* count elements; NULL when count is 0 */
};

struct demo {
    int rank, nranks;
    const char *dir;
    dcp_ctx *ctx;
    struct param *ps;
    size_t np;
    struct shard *shards; /* 3 per parameter */
    float *steps;         /* one 0-d tensor per parameter */
    uint64_t bytes;       /* all tensor bytes of the checkpoint */
};

/* Reports a failed dcp call; returns 1. Collective calls (dcp_save,
 * dcp_load) fail with the same code and message on every rank, the message
 * naming the failing rank(s), so rank 0 alone prints dcp_errmsg; a local
 * call (building the state) is reported by the rank it failed on. */
static int fail(const struct demo *d, const char *what, int rc, int coll)
{
    if (coll && d->rank == 0)
        fprintf(stderr, "gpt2_demo: %s failed: %s (%s)\n", what,
                dcp_errmsg(d->ctx), dcp_strerror(rc));
    else if (!coll)
        fprintf(stderr, "gpt2_demo: rank %d: %s failed: %s\n", d->rank, what,
                dcp_strerror(rc));
    return 1;
}

#define TRY(d, call)                         \
    do {                                     \
        int rc_ = (call);                    \
        if (rc_ != DCP_OK)                   \
            return fail((d), #call, rc_, 0); \
    } while (0)

static double wall_sync(void)
{
    MPI_Barrier(MPI_COMM_WORLD);
    return MPI_Wtime();
}

/* ---------------------------------------------------------------- data */

static uint64_t fnv1a(const char *s)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(0x100000001b3);
    return h;
}

/* splitmix64: a well-mixed 64-bit value for each (seed, index). */
static uint64_t mix(uint64_t seed, uint64_t i)
{
    uint64_t z = seed + (i + 1) * UINT64_C(0x9e3779b97f4a7c15);
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* The value of element i of the tensor with this seed and kind. */
static float expected(const struct kind *k, uint64_t seed, uint64_t i)
{
    float u = (float)(mix(seed, i) >> 40) * (1.0f / 16777216.0f);
    return u * k->scale - k->shift;
}

/* ---------------------------------------------------------------- model */

static void add_param(struct param *ps, size_t *n, const char *fqn, int ndim,
                      int64_t rows, int64_t cols)
{
    struct param *p = &ps[(*n)++];
    snprintf(p->fqn, sizeof(p->fqn), "%s", fqn);
    p->ndim = ndim;
    p->shape[0] = rows;
    p->shape[1] = cols;
}

/* GPT-2's parameters in state_dict order. Hugging Face's Conv1D stores
 * weights as (in, out): c_attn is dim x 3*dim, c_fc dim x 4*dim. Returns
 * the count; ps (NULL: count only) needs room for it. */
static size_t gpt2_params(struct param *ps, int64_t layers, int64_t dim,
                          int64_t vocab, int64_t positions)
{
    static const struct {
        const char *name;
        int ndim;
        int rows, cols; /* multiples of dim */
    } block[] = {
        {"ln_1.weight", 1, 1, 0},        {"ln_1.bias", 1, 1, 0},
        {"attn.c_attn.weight", 2, 1, 3}, {"attn.c_attn.bias", 1, 3, 0},
        {"attn.c_proj.weight", 2, 1, 1}, {"attn.c_proj.bias", 1, 1, 0},
        {"ln_2.weight", 1, 1, 0},        {"ln_2.bias", 1, 1, 0},
        {"mlp.c_fc.weight", 2, 1, 4},    {"mlp.c_fc.bias", 1, 4, 0},
        {"mlp.c_proj.weight", 2, 4, 1},  {"mlp.c_proj.bias", 1, 1, 0},
    };
    const size_t nblock = sizeof(block) / sizeof(block[0]);
    size_t n = 0, b;
    int64_t l;
    char fqn[64];

    if (!ps)
        return 4 + (size_t)layers * nblock;
    add_param(ps, &n, "transformer.wte.weight", 2, vocab, dim);
    add_param(ps, &n, "transformer.wpe.weight", 2, positions, dim);
    for (l = 0; l < layers; l++) {
        for (b = 0; b < nblock; b++) {
            snprintf(fqn, sizeof(fqn), "transformer.h.%" PRId64 ".%s", l,
                     block[b].name);
            add_param(ps, &n, fqn, block[b].ndim, block[b].rows * dim,
                      block[b].cols * dim);
        }
    }
    add_param(ps, &n, "transformer.ln_f.weight", 1, dim, 0);
    add_param(ps, &n, "transformer.ln_f.bias", 1, dim, 0);
    return n;
}

static size_t numel(const struct param *p)
{
    return (size_t)p->shape[0] * (size_t)(p->ndim == 2 ? p->shape[1] : 1);
}

/* The key of kind k of parameter p, as torch flattens it. */
static void key_of(char *out, size_t len, const struct param *p, int k)
{
    if (kinds[k].name)
        snprintf(out, len, "optim.state.%s.%s", p->fqn, kinds[k].name);
    else
        snprintf(out, len, "model.%s", p->fqn);
}

/* This rank's rows of every tensor, with buffers allocated (not filled). */
static int plan_shards(struct demo *d)
{
    size_t i;
    char key[128];

    d->shards = calloc(3 * d->np, sizeof(*d->shards));
    d->steps = calloc(d->np, sizeof(*d->steps));
    if (!d->shards || !d->steps)
        return fail(d, "calloc", DCP_ENOMEM, 0);
    for (i = 0; i < 3 * d->np; i++) {
        struct shard *s = &d->shards[i];
        int64_t rows, end;
        size_t row_len;

        s->p = &d->ps[i / 3];
        s->k = (int)(i % 3);
        rows = s->p->shape[0];
        row_len = numel(s->p) / (size_t)rows;
        s->row0 = rows * d->rank / d->nranks;
        end = rows * (d->rank + 1) / d->nranks;
        s->nrows = end - s->row0;
        s->first = (size_t)s->row0 * row_len;
        s->count = (size_t)s->nrows * row_len;
        key_of(key, sizeof(key), s->p, s->k);
        s->seed = fnv1a(key);
        if (s->count) {
            s->buf = malloc(s->count * sizeof(float));
            if (!s->buf)
                return fail(d, "malloc", DCP_ENOMEM, 0);
        }
    }
    return 0;
}

/* AdamW's param group, as get_state_dict gives it (params by FQN). */
static const char *const group_fields[] = {"lr", "betas", "eps", "weight_decay",
                                           "params"};
#define NFIELDS (sizeof(group_fields) / sizeof(group_fields[0]))

/* A new value for one field of the param group; NULL when out of memory.
 * Constructors return NULL on failure and _append/_dict_set take
 * ownership, also on failure, so calls can be nested. */
static dcp_value *group_value(const struct demo *d, size_t field)
{
    dcp_value *v;
    size_t i;
    int rc = DCP_OK;

    switch (field) {
    case 0:
        return dcp_value_float(6e-4);
    case 1:
        v = dcp_value_tuple();
        rc = dcp_value_append(v, dcp_value_float(0.9));
        if (rc == DCP_OK)
            rc = dcp_value_append(v, dcp_value_float(0.95));
        break;
    case 2:
        return dcp_value_float(1e-8);
    case 3:
        return dcp_value_float(0.1);
    default:
        v = dcp_value_list();
        for (i = 0; rc == DCP_OK && i < d->np; i++)
            rc = dcp_value_append(v, dcp_value_str(d->ps[i].fqn));
        break;
    }
    if (rc != DCP_OK) {
        dcp_value_free(v);
        return NULL;
    }
    return v;
}

/* [{field: value, ...}], the param_groups list; with templ every field
 * is None (a load template: dcp_load replaces it). NULL when out of
 * memory. */
static dcp_value *param_groups(const struct demo *d, int templ)
{
    dcp_value *list = dcp_value_list(), *g = dcp_value_dict();
    int rc = list && g ? DCP_OK : DCP_ENOMEM;
    size_t i;

    for (i = 0; rc == DCP_OK && i < NFIELDS; i++)
        rc = dcp_value_dict_set(g, group_fields[i],
                                templ ? dcp_value_none() : group_value(d, i));
    if (rc == DCP_OK) {
        rc = dcp_value_append(list, g);
        g = NULL;
    }
    dcp_value_free(g);
    if (rc != DCP_OK) {
        dcp_value_free(list);
        return NULL;
    }
    return list;
}

/* ---------------------------------------------------------------- state */

static int add_shard(dcp_state *st, const struct shard *s, const char *name)
{
    int64_t off[2] = {s->row0, 0}, size[2] = {s->nrows, s->p->shape[1]};
    return dcp_state_add_tensor(st, name, DCP_F32, s->p->ndim, s->p->shape, off,
                                size, s->buf, DCP_MEM_HOST);
}

/* Adds this rank's part of the state to st: its rows of every tensor and
 * the replicated steps and param_groups (None templates when loading).
 * st borrows the buffers. */
static int build_state(const struct demo *d, dcp_state *st, int load)
{
    size_t i;

    TRY(d, dcp_state_push(st, "model"));
    for (i = 0; i < d->np; i++)
        TRY(d, add_shard(st, &d->shards[3 * i], d->ps[i].fqn));
    TRY(d, dcp_state_pop(st));

    TRY(d, dcp_state_push(st, "optim"));
    TRY(d, dcp_state_push(st, "state"));
    for (i = 0; i < d->np; i++) {
        TRY(d, dcp_state_push(st, d->ps[i].fqn));
        TRY(d, dcp_state_add_tensor(st, "step", DCP_F32, 0, NULL, NULL, NULL,
                                    &d->steps[i], DCP_MEM_HOST));
        TRY(d, add_shard(st, &d->shards[3 * i + 1], kinds[1].name));
        TRY(d, add_shard(st, &d->shards[3 * i + 2], kinds[2].name));
        TRY(d, dcp_state_pop(st));
    }
    TRY(d, dcp_state_pop(st));
    TRY(d, dcp_state_add_value(st, "param_groups", param_groups(d, load)));
    TRY(d, dcp_state_pop(st));
    return 0;
}

/* Every rank's local failures, combined: nonzero when any rank failed.
 * Called before each collective dcp call, so that no rank enters it
 * alone while another has given up. */
static int any_failed(int failed)
{
    int any;
    MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return any;
}

#define MAX_REPORTS 5 /* mismatches each rank prints */

/* Elements of s that differ from what was saved, bit for bit; the first
 * one is reported while *reported < MAX_REPORTS. */
static size_t check_shard(const struct demo *d, const struct shard *s,
                          int *reported)
{
    size_t j, bad = 0;
    char key[128];

    for (j = 0; j < s->count; j++) {
        float want = expected(&kinds[s->k], s->seed, s->first + j);
        uint32_t got_bits, want_bits;
        memcpy(&got_bits, &s->buf[j], sizeof(got_bits));
        memcpy(&want_bits, &want, sizeof(want_bits));
        if (got_bits != want_bits && bad++ == 0 &&
            (*reported)++ < MAX_REPORTS) {
            key_of(key, sizeof(key), s->p, s->k);
            fprintf(stderr,
                    "gpt2_demo: rank %d: %s: element %zu: loaded 0x%08" PRIx32
                    ", expected 0x%08" PRIx32 "\n",
                    d->rank, key, s->first + j, got_bits, want_bits);
        }
    }
    return bad;
}

/* Mismatches in the loaded values (steps and param_groups), reported. */
static size_t check_values(const struct demo *d, const dcp_state *st)
{
    size_t i, bad = 0;
    char key[64];

    for (i = 0; i < d->np; i++)
        if (d->steps[i] != STEP && bad++ == 0)
            fprintf(stderr, "gpt2_demo: rank %d: optim.state.%s.step is %g\n",
                    d->rank, d->ps[i].fqn, (double)d->steps[i]);
    for (i = 0; i < NFIELDS; i++) {
        dcp_value *want = group_value(d, i);
        snprintf(key, sizeof(key), "optim.param_groups.0.%s", group_fields[i]);
        if (!want || !dcp_value_equal(dcp_state_value(st, key), want)) {
            fprintf(stderr, "gpt2_demo: rank %d: %s differs\n", d->rank, key);
            bad++;
        }
        dcp_value_free(want);
    }
    return bad;
}

/* ---------------------------------------------------------------- files */

/* Free bytes for an unprivileged user on the file system that holds dir,
 * or that will hold it: the nearest existing parent's. -1 on error. */
static int free_bytes(const char *dir, uint64_t *out)
{
    char path[4096];
    struct statvfs sv;
    char *slash;

    snprintf(path, sizeof(path), "%s", dir);
    while (statvfs(path, &sv) != 0) {
        if (errno != ENOENT)
            return -1;
        slash = strrchr(path, '/');
        if (!slash || slash == path) {
            snprintf(path, sizeof(path), "%s", slash ? "/" : ".");
            continue;
        }
        *slash = '\0';
    }
    *out = (uint64_t)sv.f_bavail * sv.f_frsize;
    return 0;
}

/* Bytes in dir's regular files, and how many of them are data files. */
static uint64_t dir_bytes(const char *dir, int *ndata)
{
    char path[4096];
    struct dirent *e;
    struct stat sb;
    uint64_t sum = 0;
    DIR *dh = opendir(dir);

    *ndata = 0;
    while (dh && (e = readdir(dh)) != NULL) {
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        sum += (uint64_t)sb.st_size;
        if (strstr(e->d_name, ".distcp"))
            (*ndata)++;
    }
    if (dh)
        closedir(dh);
    return sum;
}

/* ---------------------------------------------------------------- runs */

static void phase(const char *name, double secs, uint64_t bytes,
                  const char *note)
{
    printf("  %-9s %6.2f s  %6.3f GB  %5.2f GB/s%s%s\n", name, secs,
           (double)bytes / GB, secs > 0 ? (double)bytes / GB / secs : 0.0,
           *note ? "  " : "", note);
}

static int run_save(struct demo *d)
{
    dcp_state *st = NULL;
    uint64_t avail = 0, need = d->bytes + d->bytes / 10 + (64u << 20);
    double t0, t1, t2, t3;
    size_t i, j;
    int bad = 0, rc, ndata;
    char note[128];

    /* Rank 0 checks the space once, before any rank writes. */
    if (d->rank == 0) {
        if (free_bytes(d->dir, &avail) != 0) {
            fprintf(stderr, "gpt2_demo: cannot check free space for %s: %s\n",
                    d->dir, strerror(errno));
            bad = 1;
        } else if (avail < need) {
            fprintf(stderr,
                    "gpt2_demo: not enough free disk space for %s: need "
                    "%.2f GB, %.2f GB free\n",
                    d->dir, (double)need / GB, (double)avail / GB);
            bad = 1;
        } else {
            printf("save on %d ranks, each its rows of every tensor, into %s "
                   "(%.1f GB free)\n",
                   d->nranks, d->dir, (double)avail / GB);
        }
    }
    if (any_failed(bad))
        return 1;

    bad = plan_shards(d);
    t0 = wall_sync();
    for (i = 0; !bad && i < 3 * d->np; i++) {
        const struct shard *s = &d->shards[i];
        for (j = 0; j < s->count; j++)
            s->buf[j] = expected(&kinds[s->k], s->seed, s->first + j);
    }
    for (i = 0; !bad && i < d->np; i++)
        d->steps[i] = STEP;
    t1 = wall_sync();
    if (!bad && dcp_state_create(&st) != DCP_OK)
        bad = fail(d, "dcp_state_create", DCP_ENOMEM, 0);
    if (!bad)
        bad = build_state(d, st, 0);
    if (any_failed(bad)) {
        dcp_state_free(st);
        return 1;
    }

    t2 = wall_sync();
    rc = dcp_save(d->ctx, st, d->dir, NULL);
    t3 = wall_sync();
    dcp_state_free(st);
    if (rc != DCP_OK)
        return fail(d, "dcp_save", rc, 1);
    if (d->rank == 0) {
        uint64_t on_disk = dir_bytes(d->dir, &ndata);
        phase("fill", t1 - t0, d->bytes, "values computed from key, index");
        snprintf(note, sizeof(note), "%d data files + .metadata: %.3f GB",
                 ndata, (double)on_disk / GB);
        phase("dcp_save", t3 - t2, d->bytes, note);
    }
    return 0;
}

static int run_load(struct demo *d)
{
    dcp_state *st = NULL;
    double t0, t1, t2;
    size_t i;
    uint64_t bad_local = 0, bad_all = 0;
    int bad, rc, reported = 0;

    if (d->rank == 0)
        printf("load on %d ranks, each its rows of every tensor "
               "(resharded), from %s\n",
               d->nranks, d->dir);
    /* Fresh buffers, poisoned (all bits set: a NaN), so that an element
     * the load missed cannot pass the check by luck. */
    bad = plan_shards(d);
    for (i = 0; !bad && i < 3 * d->np; i++)
        if (d->shards[i].count)
            memset(d->shards[i].buf, 0xff, d->shards[i].count * sizeof(float));
    for (i = 0; !bad && i < d->np; i++)
        d->steps[i] = -1.0f;
    if (!bad && dcp_state_create(&st) != DCP_OK)
        bad = fail(d, "dcp_state_create", DCP_ENOMEM, 0);
    if (!bad)
        bad = build_state(d, st, 1);
    if (any_failed(bad)) {
        dcp_state_free(st);
        return 1;
    }

    t0 = wall_sync();
    rc = dcp_load(d->ctx, st, d->dir, NULL);
    t1 = wall_sync();
    if (rc != DCP_OK) {
        dcp_state_free(st);
        return fail(d, "dcp_load", rc, 1);
    }
    for (i = 0; i < 3 * d->np; i++)
        bad_local += check_shard(d, &d->shards[i], &reported);
    bad_local += check_values(d, st);
    MPI_Allreduce(&bad_local, &bad_all, 1, MPI_UINT64_T, MPI_SUM,
                  MPI_COMM_WORLD);
    t2 = wall_sync();
    dcp_state_free(st);
    if (d->rank == 0) {
        char note[96];
        if (bad_all)
            snprintf(note, sizeof(note), "%" PRIu64 " elements DIFFER",
                     bad_all);
        else
            snprintf(note, sizeof(note), "every byte matches");
        phase("dcp_load", t1 - t0, d->bytes, "");
        phase("verify", t2 - t1, d->bytes, note);
    }
    return bad_all != 0;
}

/* ---------------------------------------------------------------- main */

/* The value of an option, an integer in [lo, hi], or -1. */
static int64_t opt_value(const char *s, int64_t lo, int64_t hi)
{
    char *end;
    long long v;

    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    return v;
}

int main(int argc, char **argv)
{
    struct demo d = {0};
    dcp_comm *comm = NULL;
    int64_t dims[4] = {12, 768, 50257, 1024}; /* GPT-2 small */
    static const char *const names[4] = {"--layers", "--dim", "--vocab",
                                         "--positions"};
    static const int64_t lim[4] = {1000, 1 << 16, 1 << 24, 1 << 20};
    size_t elems = 0, j;
    int i, n, save = 0, rc = 2;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &d.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &d.nranks);

    if (argc >= 3 && (!strcmp(argv[1], "save") || !strcmp(argv[1], "load")))
        rc = 0;
    for (i = 3; rc == 0 && i < argc; i += 2) {
        for (n = 0; n < 4 && strcmp(argv[i], names[n]); n++)
            ;
        if (n == 4 || i + 1 >= argc ||
            (dims[n] = opt_value(argv[i + 1], n ? 1 : 0, lim[n])) < 0)
            rc = 2;
    }
    if (rc != 0) {
        if (d.rank == 0)
            fprintf(stderr, "usage: mpiexec -n N gpt2_demo save|load DIR "
                            "[--layers N] [--dim N] [--vocab N] "
                            "[--positions N]\n");
        MPI_Finalize();
        return 2;
    }
    save = !strcmp(argv[1], "save");
    d.dir = argv[2];

    /* The communicator and context: collective, every rank fails alike. */
    rc = dcp_comm_mpi(&comm, MPI_COMM_WORLD);
    if (rc == DCP_OK)
        rc = dcp_ctx_create(&d.ctx, comm, NULL);
    if (rc != DCP_OK)
        fail(&d, "dcp_comm_mpi or dcp_ctx_create", rc, 0);
    if (any_failed(rc != DCP_OK)) {
        rc = 1;
        goto out;
    }

    d.np = gpt2_params(NULL, dims[0], dims[1], dims[2], dims[3]);
    d.ps = calloc(d.np, sizeof(*d.ps));
    if (!d.ps)
        fail(&d, "calloc", DCP_ENOMEM, 0);
    if (any_failed(!d.ps)) {
        rc = 1;
        goto out;
    }
    gpt2_params(d.ps, dims[0], dims[1], dims[2], dims[3]);
    for (j = 0; j < d.np; j++)
        elems += numel(&d.ps[j]);
    d.bytes = (elems * 3 + d.np) * sizeof(float); /* + a 0-d step each */
    if (d.rank == 0 && save) {
        printf("GPT-2: %" PRId64 " layers, dim %" PRId64 ", vocab %" PRId64
               ", %" PRId64 " positions: %.2fM parameters (%zu tensors)\n",
               dims[0], dims[1], dims[2], dims[3], (double)elems / 1e6, d.np);
        printf("state with AdamW: %zu fp32 tensors (parameter, exp_avg, "
               "exp_avg_sq, step), %.3f GB\n",
               4 * d.np, (double)d.bytes / GB);
    }
    rc = save ? run_save(&d) : run_load(&d);

out:
    for (j = 0; d.shards && j < 3 * d.np; j++)
        free(d.shards[j].buf);
    free(d.shards);
    free(d.steps);
    free(d.ps);
    dcp_ctx_free(d.ctx);
    dcp_comm_free(comm);
    MPI_Finalize();
    return rc;
}
