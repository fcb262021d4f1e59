/*
 * The recipes of PyTorch's planner documentation, with dcp_planner.h
 * (tests/interop/test_planner.py checks each against torch 2.13):
 *
 *   planner_recipes save DIR      a small model state, as it is
 *   planner_recipes bf16 DIR      the same state with every float32
 *                                 tensor stored as a bfloat16 copy
 *                                 (torch's FP16Planner recipe, rounding
 *                                 exactly as Tensor.to)
 *   planner_recipes extra DIR     the state with planner data attached by
 *                                 the coordinator's hook (SaveExtraData-
 *                                 Planner): {"dtype": "float32", "note":
 *                                 "master weights"} on every tensor
 *   planner_recipes filter DIR    the state without model.layer.bias and
 *                                 step (skipped), model.layer.weight
 *                                 stored as float64 twice its value (a
 *                                 user transform of each box)
 *   planner_recipes postload DIR OUTDIR
 *                                 loads model.layer.weight (float32 [8,16])
 *                                 of DIR with a post-load hook adding 1 to
 *                                 every element, written as
 *                                 OUTDIR/model.layer.weight
 *   planner_recipes rename DIR FROM TO OUTDIR
 *                                 loads every tensor of DIR whose key
 *                                 starts with FROM into a state whose keys
 *                                 start with TO instead (RenamePlanner on
 *                                 load), and writes each as OUTDIR/<key>
 *                                 (raw little-endian bytes)
 *
 * The load-balanced DDP recipe needs several ranks: see
 * tests/mpi/mpi_planner.c (ddp_share), a skip per rank in the item hook.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_planner.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float weight[8 * 16], bias[16];

/* {"model": {"layer.weight": f32[8,16], "layer.bias": f32[16]},
 *  "step": 42}; values a Python test can recompute exactly. */
static dcp_state *model_state(void)
{
    dcp_state *st = NULL;
    int64_t ws[2] = {8, 16}, bs[1] = {16};
    int i;
    for (i = 0; i < 8 * 16; i++)
        weight[i] = (float)((i * 37) % 101 - 50) / 7.0f;
    for (i = 0; i < 16; i++)
        bias[i] = (float)i / 3.0f;
    if (dcp_state_create(&st) || dcp_state_push(st, "model") ||
        dcp_state_add_tensor(st, "layer.weight", DCP_F32, 2, ws, NULL, NULL,
                             weight, DCP_MEM_HOST) ||
        dcp_state_add_tensor(st, "layer.bias", DCP_F32, 1, bs, NULL, NULL, bias,
                             DCP_MEM_HOST) ||
        dcp_state_pop(st) ||
        dcp_state_add_value(st, "step", dcp_value_int(42))) {
        dcp_state_free(st);
        return NULL;
    }
    return st;
}

/* FP16Planner: float32 tensors stored as bfloat16. */
static int to_bf16(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    return it->is_tensor && it->dtype == DCP_F32 ? dcp_plan_cast(d, DCP_BF16)
                                                 : 0;
}

/* SaveExtraDataPlanner: planner data on every tensor entry. */
static int extra_data(void *ud, dcp_global_plan *gp)
{
    const dcp_metadata *md = dcp_global_plan_metadata(gp);
    size_t i;
    (void)ud;
    for (i = 0; i < dcp_metadata_count(md); i++) {
        dcp_entry_info e;
        dcp_value *v;
        if (dcp_metadata_entry(md, i, &e) != DCP_OK || !e.is_tensor)
            continue;
        v = dcp_value_dict();
        if (!v ||
            dcp_value_dict_set(v, "dtype",
                               dcp_value_str(dcp_dtype_name(e.dtype))) ||
            dcp_value_dict_set(v, "note", dcp_value_str("master weights"))) {
            dcp_value_free(v);
            return DCP_ENOMEM;
        }
        if (dcp_global_plan_set_data(gp, i, v) != DCP_OK)
            return DCP_ENOMEM;
    }
    return 0;
}

static int save(const char *dir, const dcp_save_planner *p)
{
    dcp_save_options so;
    dcp_ctx *ctx = NULL;
    dcp_state *st = model_state();
    int rc;
    memset(&so, 0, sizeof(so));
    so.struct_size = sizeof(so);
    so.planner = p;
    rc = st ? dcp_ctx_create(&ctx, NULL, NULL) : DCP_ENOMEM;
    if (rc == DCP_OK)
        rc = dcp_save(ctx, st, dir, &so);
    if (rc != DCP_OK)
        fprintf(stderr, "save %s: %s\n", dir,
                ctx ? dcp_errmsg(ctx) : dcp_strerror(rc));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    return rc == DCP_OK ? 0 : 1;
}

/* A filter and a transform: two entries skipped, one stored as float64
 * twice its value. */
static int twice_f64(void *ud, const dcp_plan_item *it, size_t box,
                     const int64_t *off, const int64_t *sz, const void *src,
                     void *dst, size_t n)
{
    const float *s = src;
    double *d = dst;
    size_t i;
    (void)ud;
    (void)it;
    (void)box;
    (void)off;
    (void)sz;
    for (i = 0; i < n; i++)
        d[i] = 2.0 * (double)s[i];
    return 0;
}

static int filter(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    if (!strcmp(it->key, "model.layer.bias") || !strcmp(it->key, "step"))
        return dcp_plan_skip(d);
    if (!strcmp(it->key, "model.layer.weight"))
        return dcp_plan_transform(d, DCP_F64, twice_f64, NULL);
    return 0;
}

/* A post-load hook: 1 added to every element of a float32 box. */
static int add_one(void *ud, const dcp_plan_item *it, size_t box,
                   const int64_t *off, const int64_t *sz,
                   const int64_t *strides, void *buf)
{
    (void)strides;
    float *f = buf;
    int64_t i, n = 1;
    int k;
    (void)ud;
    (void)box;
    (void)off;
    if (it->dtype != DCP_F32)
        return DCP_EINVAL;
    for (k = 0; k < it->ndim; k++)
        n *= sz[k];
    for (i = 0; i < n; i++)
        f[i] += 1.0f;
    return 0;
}

static int post_load(const char *dir, const char *outdir)
{
    dcp_load_planner lp = {DCP_PLANNER_VERSION, 0, NULL, NULL, add_one};
    dcp_load_options lo;
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    int64_t ws[2] = {8, 16};
    float w[8 * 16];
    char path[2048];
    FILE *f;
    int rc = dcp_ctx_create(&ctx, NULL, NULL);
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = DCP_LOAD_ALLOW_UNEXPECTED;
    lo.planner = &lp;
    if (rc == DCP_OK)
        rc = dcp_state_create(&st);
    if (rc == DCP_OK)
        rc = dcp_state_add_tensor(st, "model.layer.weight", DCP_F32, 2, ws,
                                  NULL, NULL, w, DCP_MEM_HOST);
    if (rc == DCP_OK)
        rc = dcp_load(ctx, st, dir, &lo);
    snprintf(path, sizeof path, "%s/model.layer.weight", outdir);
    if (rc == DCP_OK) {
        f = fopen(path, "wb");
        if (!f || fwrite(w, 1, sizeof w, f) != sizeof w)
            rc = DCP_EIO;
        if (f && fclose(f) != 0)
            rc = DCP_EIO;
    }
    if (rc != DCP_OK)
        fprintf(stderr, "post-load %s: %s\n", dir,
                ctx && *dcp_errmsg(ctx) ? dcp_errmsg(ctx) : dcp_strerror(rc));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    return rc == DCP_OK ? 0 : 1;
}

/* RenamePlanner on load: state key TO... reads stored key FROM... */
struct prefixes {
    const char *from, *to;
};

static int rename_prefix(void *ud, const dcp_plan_item *it,
                         dcp_plan_decision *d)
{
    const struct prefixes *p = ud;
    size_t n = strlen(p->to);
    char key[1024];
    if (strncmp(it->key, p->to, n) != 0)
        return 0;
    if (snprintf(key, sizeof key, "%s%s", p->from, it->key + n) >=
        (int)sizeof key) {
        dcp_plan_error(d, "key too long");
        return DCP_EINVAL;
    }
    return dcp_plan_rename(d, key);
}

static int rename_load(const char *dir, const char *from, const char *to,
                       const char *outdir)
{
    struct prefixes px = {from, to};
    dcp_load_planner lp = {DCP_PLANNER_VERSION, 0, &px, rename_prefix, NULL};
    dcp_load_options lo;
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    dcp_state *st = NULL;
    void **bufs = NULL;
    size_t i, n = 0;
    int rc = dcp_ctx_create(&ctx, NULL, NULL);
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = DCP_LOAD_ALLOW_UNEXPECTED; /* values and other keys stay */
    lo.planner = &lp;
    if (rc == DCP_OK)
        rc = dcp_metadata_open(ctx, dir, &md);
    if (rc == DCP_OK)
        rc = dcp_state_create(&st);
    if (rc == DCP_OK) {
        n = dcp_metadata_count(md);
        bufs = calloc(n ? n : 1, sizeof(*bufs));
        rc = bufs ? DCP_OK : DCP_ENOMEM;
    }
    for (i = 0; rc == DCP_OK && i < n; i++) {
        dcp_entry_info e;
        char key[1024];
        rc = dcp_metadata_entry(md, i, &e);
        if (rc != DCP_OK || !e.is_tensor ||
            strncmp(e.key, from, strlen(from)) != 0)
            continue;
        snprintf(key, sizeof key, "%s%s", to, e.key + strlen(from));
        bufs[i] = malloc(e.nbytes ? e.nbytes : 1);
        rc = bufs[i] ? dcp_state_add_tensor(st, key, e.dtype, e.ndim, e.shape,
                                            NULL, NULL, bufs[i], DCP_MEM_HOST)
                     : DCP_ENOMEM;
    }
    if (rc == DCP_OK)
        rc = dcp_load(ctx, st, dir, &lo);
    for (i = 0; rc == DCP_OK && i < n; i++) {
        dcp_entry_info e;
        char path[2048];
        FILE *f;
        if (!bufs[i] || dcp_metadata_entry(md, i, &e) != DCP_OK)
            continue;
        snprintf(path, sizeof path, "%s/%s%s", outdir, to,
                 e.key + strlen(from));
        f = fopen(path, "wb");
        if (!f || fwrite(bufs[i], 1, e.nbytes, f) != e.nbytes)
            rc = DCP_EIO;
        if (f && fclose(f) != 0)
            rc = DCP_EIO;
    }
    if (rc != DCP_OK)
        fprintf(stderr, "rename load %s: %s\n", dir,
                ctx && *dcp_errmsg(ctx) ? dcp_errmsg(ctx) : dcp_strerror(rc));
    for (i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    dcp_state_free(st);
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return rc == DCP_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    static const dcp_save_planner bf16 = {DCP_PLANNER_VERSION, 0, NULL, to_bf16,
                                          NULL};
    static const dcp_save_planner extra = {DCP_PLANNER_VERSION, 0, NULL, NULL,
                                           extra_data};
    if (argc == 3 && !strcmp(argv[1], "save"))
        return save(argv[2], NULL);
    if (argc == 3 && !strcmp(argv[1], "bf16"))
        return save(argv[2], &bf16);
    if (argc == 3 && !strcmp(argv[1], "extra"))
        return save(argv[2], &extra);
    static const dcp_save_planner filt = {DCP_PLANNER_VERSION, 0, NULL, filter,
                                          NULL};
    if (argc == 3 && !strcmp(argv[1], "filter"))
        return save(argv[2], &filt);
    if (argc == 4 && !strcmp(argv[1], "postload"))
        return post_load(argv[2], argv[3]);
    if (argc == 6 && !strcmp(argv[1], "rename"))
        return rename_load(argv[2], argv[3], argv[4], argv[5]);
    fprintf(stderr, "usage: planner_recipes save|bf16|extra|filter DIR\n"
                    "       planner_recipes postload DIR OUTDIR\n"
                    "       planner_recipes rename DIR FROM TO OUTDIR\n");
    return 2;
}
