/*
 * Peak memory of a streaming export: a GPT-2-small-sized training state
 * (the 124M float32 parameters of GPT-2 small plus Adam's exp_avg and
 * exp_avg_sq for each: 148 tensors x 3, 1.49 GB) saved as a DCP checkpoint,
 * then exported by dcp_export in a separate process, whose peak RSS
 * (VmHWM) and time are reported as JSON.
 *
 *   export_rss gen DIR                 write the checkpoint (holds 1.5 GB)
 *   export_rss export DIR OUT [DTYPE]  export; OUT's name picks the format
 *
 * Build (not a ctest test):
 *   cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -Iinclude \
 *      bench/export_rss.c build/libdcp.a -lm -lpthread -o export_rss
 */
#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LAYERS 12
#define D      768
#define VOCAB  50257
#define CTX    1024

struct param {
    char name[64];
    int ndim;
    int64_t shape[2];
};

static struct param params[4 + 12 * LAYERS + 2];
static int nparams;

static void add(const char *name, int ndim, int64_t a, int64_t b)
{
    struct param *p = &params[nparams++];
    (void)snprintf(p->name, sizeof(p->name), "%s", name);
    p->ndim = ndim;
    p->shape[0] = a;
    p->shape[1] = b;
}

/* GPT-2 small (transformers' GPT2LMHeadModel state dict, lm_head tied). */
static void gpt2(void)
{
    char n[64];
    int l;
    add("transformer.wte.weight", 2, VOCAB, D);
    add("transformer.wpe.weight", 2, CTX, D);
    for (l = 0; l < LAYERS; l++) {
        static const struct {
            const char *s;
            int ndim;
            int64_t a, b;
        } t[] = {{"ln_1.weight", 1, D, 0},
                 {"ln_1.bias", 1, D, 0},
                 {"attn.c_attn.weight", 2, D, 3 * D},
                 {"attn.c_attn.bias", 1, 3 * D, 0},
                 {"attn.c_proj.weight", 2, D, D},
                 {"attn.c_proj.bias", 1, D, 0},
                 {"ln_2.weight", 1, D, 0},
                 {"ln_2.bias", 1, D, 0},
                 {"mlp.c_fc.weight", 2, D, 4 * D},
                 {"mlp.c_fc.bias", 1, 4 * D, 0},
                 {"mlp.c_proj.weight", 2, 4 * D, D},
                 {"mlp.c_proj.bias", 1, D, 0}};
        size_t i;
        for (i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
            (void)snprintf(n, sizeof(n), "transformer.h.%d.%s", l, t[i].s);
            add(n, t[i].ndim, t[i].a, t[i].b);
        }
    }
    add("transformer.ln_f.weight", 1, D, 0);
    add("transformer.ln_f.bias", 1, D, 0);
}

static int64_t numel(const struct param *p)
{
    return p->ndim == 1 ? p->shape[0] : p->shape[0] * p->shape[1];
}

static int gen(const char *dir)
{
    static const char *const groups[] = {"model", "optim.exp_avg",
                                         "optim.exp_avg_sq"};
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    float **bufs = calloc((size_t)nparams * 3, sizeof(float *));
    uint32_t x = 1;
    int g, i, rc = dcp_ctx_create(&ctx, NULL, NULL);
    uint64_t total = 0;
    if (rc == DCP_OK)
        rc = dcp_state_create(&st);
    for (g = 0; rc == DCP_OK && g < 3; g++) {
        rc = dcp_state_push(st, strchr(groups[g], '.') ? "optim" : "model");
        if (rc == DCP_OK && strchr(groups[g], '.'))
            rc = dcp_state_push(st, strchr(groups[g], '.') + 1);
        for (i = 0; rc == DCP_OK && i < nparams; i++) {
            int64_t n = numel(&params[i]), k;
            float *b = malloc((size_t)n * sizeof(float));
            bufs[g * nparams + i] = b;
            if (!b)
                return 1;
            for (k = 0; k < n; k++) {
                x = x * 1664525u + 1013904223u;
                b[k] = (float)((int32_t)x >> 8) * (1.0f / 8388608.0f);
            }
            total += (uint64_t)n * 4;
            rc = dcp_state_add_tensor(st, params[i].name, DCP_F32,
                                      params[i].ndim, params[i].shape, NULL,
                                      NULL, b, DCP_MEM_HOST);
        }
        if (rc == DCP_OK && strchr(groups[g], '.'))
            rc = dcp_state_pop(st);
        if (rc == DCP_OK)
            rc = dcp_state_pop(st);
    }
    if (rc == DCP_OK)
        rc = dcp_save(ctx, st, dir, NULL);
    if (rc != DCP_OK)
        fprintf(stderr, "gen: %s\n", dcp_errmsg(ctx));
    else
        fprintf(stderr, "gen: %d tensors, %.3f GB in %s\n", 3 * nparams,
                (double)total / 1e9, dir);
    for (i = 0; i < 3 * nparams; i++)
        free(bufs[i]);
    free(bufs);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    return rc != DCP_OK;
}

static long vm_hwm_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %ld kB", &v) == 1)
            break;
    if (f)
        fclose(f);
    return v;
}

static int export(const char *dir, const char *out, const char *dtype)
{
    dcp_ctx *ctx = NULL;
    dcp_convert_options o;
    dcp_convert_result res;
    struct timespec t0, t1;
    int rc;
    memset(&o, 0, sizeof(o));
    memset(&res, 0, sizeof(res));
    o.struct_size = sizeof(o);
    res.struct_size = sizeof(res);
    if (dtype && dcp_dtype_from_name(dtype, &o.dtype) != DCP_OK)
        return 2;
    rc = dcp_ctx_create(&ctx, NULL, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (rc == DCP_OK)
        rc = dcp_export(ctx, dir, out, &o, &res);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (rc != DCP_OK) {
        fprintf(stderr, "export: %s\n", dcp_errmsg(ctx));
        dcp_ctx_free(ctx);
        return 1;
    }
    printf("{\"out\": \"%s\", \"dtype\": \"%s\", \"tensors\": %zu, "
           "\"bytes_written\": %llu, \"seconds\": %.2f, "
           "\"peak_rss_mib\": %.1f}\n",
           out, dtype ? dtype : "keep", res.tensors,
           (unsigned long long)res.bytes,
           (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
           (double)vm_hwm_kib() / 1024.0);
    dcp_ctx_free(ctx);
    return 0;
}

int main(int argc, char **argv)
{
    gpt2();
    if (argc == 3 && strcmp(argv[1], "gen") == 0)
        return gen(argv[2]);
    if ((argc == 4 || argc == 5) && strcmp(argv[1], "export") == 0)
        return export(argv[2], argv[3], argc == 5 ? argv[4] : NULL);
    fprintf(stderr, "usage: export_rss gen DIR | export DIR OUT [DTYPE]\n");
    return 2;
}
