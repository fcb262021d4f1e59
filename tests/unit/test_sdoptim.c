/*
 * The generic optimizer description of dcp_statedict.h in one process:
 * presets and bad arguments; the nested layout with a frozen parameter, a
 * per-parameter scalar and sliced bindings, loaded into other slices; the
 * flattened layout, its hyper-parameter check and DCP_SD_LOAD_HPARAMS;
 * a checkpoint of another variant (amsgrad or not) fails with DCP_EKEY
 * naming the key, and changes no buffer; Adafactor's factors, in their
 * own flat space. (Interop with torch, every
 * optimizer both ways: tests/interop/test_optim_kinds.py.)
 */
#include <dcp/dcp.h>
#include <dcp/dcp_statedict.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

static char root[256];

static const char *dirpath(const char *name)
{
    static char buf[4][512];
    static int k;
    if (!root[0]) {
        strcpy(root, "/tmp/dcp-test-sdoptim-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

/* In helpers returning int: a failed call returns -1000 (never a DCP_*
 * code, nor 0 or 1). */
#define TRY(x)                                                                 \
    do {                                                                       \
        int r_ = (x);                                                          \
        if (r_ != DCP_OK) {                                                    \
            fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #x, r_);   \
            return -1000;                                                      \
        }                                                                      \
    } while (0)

TEST(presets_and_bad_args)
{
    static const unsigned ok[][2] = {
        {DCP_OPTIM_SGD, 0},      {DCP_OPTIM_SGD, DCP_OPTIM_MOMENTUM},
        {DCP_OPTIM_ADAM, 0},     {DCP_OPTIM_ADAMW, DCP_OPTIM_AMSGRAD},
        {DCP_OPTIM_ADAGRAD, 0},  {DCP_OPTIM_RMSPROP, 7 & ~2u},
        {DCP_OPTIM_ADADELTA, 0}, {DCP_OPTIM_ADAMAX, 0},
        {DCP_OPTIM_NADAM, 0},    {DCP_OPTIM_RADAM, 0}};
    dcp_sd_optim l;
    dcp_value *g;
    dcp_sd *sd, *adamw;
    dcp_adamw hp;
    size_t i;
    int64_t shape[1] = {4};
    float buf[4];
    void *bufs[1] = {buf};
    for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        ASSERT_OK(dcp_sd_optim_preset((dcp_optim_kind)ok[i][0], ok[i][1], &l,
                                      &g));
        ASSERT_EQ(dcp_value_type_of(g), DCP_VALUE_DICT);
        ASSERT(dcp_value_dict_get(g, "lr") != NULL);
        ASSERT(dcp_value_dict_get(g, "params") == NULL);
        ASSERT_OK(dcp_sd_create_optim(&sd, DCP_F32, &l));
        ASSERT_OK(dcp_sd_add_group_values(sd, g));
        dcp_sd_free(sd);
        dcp_value_free(g);
    }
    /* torch's types: SGD's momentum the int 0, with MOMENTUM the float. */
    ASSERT_OK(dcp_sd_optim_preset(DCP_OPTIM_SGD, 0, &l, &g));
    ASSERT_EQ(l.ntensors, 0);
    ASSERT_EQ(l.step, 0);
    ASSERT_EQ(dcp_value_type_of(dcp_value_dict_get(g, "momentum")),
              DCP_VALUE_INT);
    ASSERT_EQ(dcp_value_type_of(dcp_value_dict_get(g, "fused")),
              DCP_VALUE_NONE);
    dcp_value_free(g);
    ASSERT_OK(dcp_sd_optim_preset(DCP_OPTIM_RMSPROP,
                                  DCP_OPTIM_MOMENTUM | DCP_OPTIM_CENTERED, &l,
                                  &g));
    ASSERT_EQ(l.ntensors, 3);
    ASSERT_STR_EQ(l.tensors[2], "grad_avg");
    ASSERT(dcp_value_as_float(dcp_value_dict_get(g, "momentum")) == 0.9);
    ASSERT(dcp_value_as_bool(dcp_value_dict_get(g, "centered")));
    dcp_value_free(g);
    /* Variants a kind has not, unknown kinds. */
    ASSERT_RC(dcp_sd_optim_preset(DCP_OPTIM_ADAM, DCP_OPTIM_MOMENTUM, &l, &g),
              DCP_EINVAL);
    ASSERT(g == NULL);
    ASSERT_RC(dcp_sd_optim_preset((dcp_optim_kind)0, 0, &l, NULL),
              DCP_EINVAL);
    ASSERT_RC(dcp_sd_optim_preset((dcp_optim_kind)99, 0, &l, NULL),
              DCP_EINVAL);
    ASSERT_RC(dcp_sd_optim_preset(DCP_OPTIM_ADAM, 0, NULL, NULL), DCP_EINVAL);
    /* Bad layouts: "step", a dot, a repeat, too many, no struct_size. */
    ASSERT_OK(dcp_sd_optim_preset(DCP_OPTIM_ADAM, 0, &l, NULL));
    l.tensors[1] = "step";
    ASSERT_RC(dcp_sd_create_optim(&sd, DCP_F32, &l), DCP_EINVAL);
    ASSERT(sd == NULL);
    l.tensors[1] = "a.b";
    ASSERT_RC(dcp_sd_create_optim(&sd, DCP_F32, &l), DCP_EINVAL);
    l.tensors[1] = "exp_avg";
    ASSERT_RC(dcp_sd_create_optim(&sd, DCP_F32, &l), DCP_EINVAL);
    l.tensors[1] = "exp_avg_sq";
    l.nscalars = 1;
    l.scalars[0] = "exp_avg";
    ASSERT_RC(dcp_sd_create_optim(&sd, DCP_F32, &l), DCP_EINVAL);
    l.nscalars = DCP_SD_OPTIM_MAX_STATE + 1;
    ASSERT_RC(dcp_sd_create_optim(&sd, DCP_F32, &l), DCP_EINVAL);
    l.nscalars = 0;
    l.flags = 2;
    ASSERT_RC(dcp_sd_create_optim(&sd, DCP_F32, &l), DCP_EINVAL);
    l.flags = 0;
    l.struct_size = 4;
    ASSERT_RC(dcp_sd_create_optim(&sd, DCP_F32, &l), DCP_EINVAL);
    l.struct_size = sizeof(l);
    /* The AdamW calls refuse a generic sd, the generic ones an AdamW sd. */
    ASSERT_OK(dcp_sd_create_optim(&sd, DCP_F32, &l));
    ASSERT_OK(dcp_sd_create(&adamw, DCP_F32));
    dcp_adamw_defaults(&hp);
    ASSERT_RC(dcp_sd_add_group(sd, &hp), DCP_EINVAL);
    ASSERT_OK(dcp_sd_add_group(adamw, &hp));
    ASSERT_OK(dcp_sd_add_param(adamw, 0, "w", 1, shape));
    ASSERT_OK(dcp_sd_optim_preset(DCP_OPTIM_ADAM, 0, &l, &g));
    ASSERT_RC(dcp_sd_add_group_values(adamw, g), DCP_EINVAL);
    ASSERT(dcp_sd_group_values(adamw, 0) == NULL);
    ASSERT_RC(dcp_sd_bind_state(adamw, 0, 4, bufs), DCP_EINVAL);
    ASSERT_RC(dcp_sd_set_param_frozen(adamw, 0, 1), DCP_EINVAL);
    /* Group dicts: no "params", no dotted keys, not another type. */
    ASSERT_OK(dcp_value_dict_set(g, "params", dcp_value_list()));
    ASSERT_RC(dcp_sd_add_group_values(sd, g), DCP_EINVAL);
    dcp_value_free(g);
    ASSERT_OK(dcp_sd_optim_preset(DCP_OPTIM_ADAM, 0, &l, &g));
    ASSERT_OK(dcp_value_dict_set(g, "a.b", dcp_value_int(1)));
    ASSERT_RC(dcp_sd_add_group_values(sd, g), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_group_values(sd, dcp_value_dict_key(g, 0)),
              DCP_EINVAL);
    dcp_value_free(g);
    ASSERT_OK(dcp_sd_optim_preset(DCP_OPTIM_ADAM, 0, &l, &g));
    ASSERT_OK(dcp_sd_add_group_values(sd, g));
    ASSERT_OK(dcp_sd_add_param(sd, 0, "w", 1, shape));
    ASSERT_RC(dcp_sd_hparams(sd, 0, &hp), DCP_EINVAL);
    ASSERT_RC(dcp_sd_bind_optim(sd, 0, 4, buf, buf), DCP_EINVAL);
    /* set_group_values: the same keys, no others. */
    ASSERT_OK(dcp_value_dict_set(g, "lr", dcp_value_float(0.5)));
    ASSERT_OK(dcp_sd_set_group_values(sd, 0, g));
    ASSERT(dcp_value_as_float(
               dcp_value_dict_get(dcp_sd_group_values(sd, 0), "lr")) == 0.5);
    ASSERT_OK(dcp_value_dict_set(g, "extra", dcp_value_int(1)));
    ASSERT_RC(dcp_sd_set_group_values(sd, 0, g), DCP_EINVAL);
    ASSERT_RC(dcp_sd_set_group_values(sd, 1, g), DCP_EINVAL);
    dcp_value_free(g);
    /* Scalars: only the layout's names. */
    ASSERT_RC(dcp_sd_set_scalar(sd, "mu_product", 0, 1.0f), DCP_EINVAL);
    ASSERT_RC(dcp_sd_bind_state(sd, 0, 4, NULL), DCP_EINVAL);
    ASSERT_OK(dcp_sd_bind_state(sd, 0, 0, NULL));
    dcp_sd_free(sd);
    dcp_sd_free(adamw);
}

/* NAdam over three parameters, "frozen" frozen; the state binding holds
 * [olo, ohi), the model binding everything. */
struct nadam {
    dcp_sd *sd;
    float model[20], avg[20], sq[20];
};

static const int64_t w_shape[2] = {3, 4}, b_shape[1] = {3},
                     f_shape[1] = {5};

static int nadam_make(struct nadam *n, unsigned flags, double lr)
{
    dcp_sd_optim l;
    dcp_value *g;
    memset(n, 0, sizeof(*n));
    TRY(dcp_sd_optim_preset(DCP_OPTIM_NADAM, 0, &l, &g));
    l.flags = flags;
    TRY(dcp_value_dict_set(g, "lr", dcp_value_float(lr)));
    TRY(dcp_sd_create_optim(&n->sd, DCP_F32, &l));
    TRY(dcp_sd_add_group_values(n->sd, g));
    TRY(dcp_sd_add_param(n->sd, 0, "w", 2, w_shape));
    TRY(dcp_sd_add_param(n->sd, 0, "frozen", 1, f_shape));
    TRY(dcp_sd_set_param_frozen(n->sd, 1, 1));
    TRY(dcp_sd_add_param(n->sd, 0, "b", 1, b_shape));
    dcp_value_free(g);
    return dcp_sd_numel(n->sd) == 20 ? DCP_OK : -1000;
}

static int nadam_save(const char *dir, unsigned flags)
{
    struct nadam n;
    dcp_ctx *ctx;
    dcp_state *st;
    void *bufs[2];
    int i, rc;
    TRY(nadam_make(&n, flags, 0.01));
    for (i = 0; i < 20; i++) {
        n.model[i] = (float)i;
        n.avg[i] = 100.0f + (float)i;
        n.sq[i] = 200.0f + (float)i;
    }
    bufs[0] = n.avg;
    bufs[1] = n.sq;
    TRY(dcp_sd_bind_model(n.sd, 0, 20, n.model));
    TRY(dcp_sd_bind_state(n.sd, 0, 20, bufs));
    TRY(dcp_sd_set_step(n.sd, 5));
    TRY(dcp_sd_set_scalar(n.sd, "mu_product", 0, 0.25f));
    TRY(dcp_sd_set_scalar(n.sd, "mu_product", 2, 0.5f));
    TRY(dcp_state_create(&st));
    TRY(dcp_sd_add_to_state(n.sd, st, "model", "optim"));
    TRY(dcp_ctx_create(&ctx, NULL, NULL));
    rc = dcp_save(ctx, st, dir, NULL);
    dcp_ctx_free(ctx);
    dcp_state_free(st);
    dcp_sd_free(n.sd);
    return rc;
}

/* Loads dir into a NAdam sd (lr, flags) with the state bound to [lo, hi);
 * returns dcp_sd_load's code, its message in msg. */
static int nadam_load(const char *dir, unsigned flags, double lr, int64_t lo,
                      int64_t hi, unsigned sdflags, struct nadam *n,
                      char *msg)
{
    dcp_ctx *ctx;
    dcp_state *st;
    void *bufs[2];
    int rc;
    TRY(nadam_make(n, flags, lr));
    memset(n->avg, 0xa5, sizeof(n->avg));
    memset(n->sq, 0xa5, sizeof(n->sq));
    memset(n->model, 0xa5, sizeof(n->model));
    bufs[0] = n->avg;
    bufs[1] = n->sq;
    TRY(dcp_sd_bind_model(n->sd, 0, 20, n->model));
    TRY(dcp_sd_bind_state(n->sd, lo, hi, bufs));
    TRY(dcp_state_create(&st));
    TRY(dcp_sd_add_to_state(n->sd, st, "model", "optim"));
    TRY(dcp_ctx_create(&ctx, NULL, NULL));
    rc = dcp_sd_load(ctx, n->sd, st, dir, NULL, sdflags);
    snprintf(msg, 1024, "%s", dcp_errmsg(ctx));
    dcp_ctx_free(ctx);
    dcp_state_free(st);
    return rc;
}

/* Still the 0xa5 bytes nadam_load put there. */
static int untouched(const float *x)
{
    static const unsigned char a5[4] = {0xa5, 0xa5, 0xa5, 0xa5};
    return memcmp(x, a5, sizeof(*x)) == 0;
}

static int has_key(const char *dir, const char *key)
{
    dcp_ctx *ctx;
    dcp_metadata *md;
    long idx;
    TRY(dcp_ctx_create(&ctx, NULL, NULL));
    TRY(dcp_metadata_open(ctx, dir, &md));
    idx = dcp_metadata_find(md, key);
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return idx >= 0;
}

TEST(nested_frozen_scalars_slices)
{
    const char *dir = dirpath("nested");
    struct nadam n;
    char msg[1024];
    float mu;
    int i;
    ASSERT_OK(nadam_save(dir, 0));
    ASSERT(has_key(dir, "optim.state.w.mu_product") == 1);
    ASSERT(has_key(dir, "optim.state.b.exp_avg_sq") == 1);
    ASSERT(has_key(dir, "optim.state.b.step") == 1);
    ASSERT(has_key(dir, "model.frozen") == 1);
    ASSERT(has_key(dir, "optim.state.frozen.step") == 0);
    ASSERT(has_key(dir, "optim.state.frozen.exp_avg") == 0);
    ASSERT(has_key(dir, "optim.param_groups.0.momentum_decay") == 1);
    ASSERT(has_key(dir, "optim.param_groups.0.params") == 1);
    ASSERT(has_key(dir, "optim.param_groups.w.lr") == 0);
    /* A slice cutting w's rows: what it covers, nothing else. */
    ASSERT_OK(nadam_load(dir, 0, 0.01, 5, 18, 0, &n, msg));
    for (i = 0; i < 20; i++) {
        int j = i + 5; /* w is [0, 12), frozen [12, 17), b [17, 20) */
        ASSERT(n.model[i] == (float)i);
        if (i >= 13 || (j >= 12 && j < 17)) {
            ASSERT(untouched(&n.avg[i]) && untouched(&n.sq[i]));
            continue;
        }
        ASSERT(n.avg[i] == 100.0f + (float)j && n.sq[i] == 200.0f + (float)j);
    }
    ASSERT_EQ(dcp_sd_step(n.sd), 5);
    ASSERT_OK(dcp_sd_scalar(n.sd, "mu_product", 0, &mu));
    ASSERT(mu == 0.25f);
    ASSERT_OK(dcp_sd_scalar(n.sd, "mu_product", 2, &mu));
    ASSERT(mu == 0.5f);
    dcp_sd_free(n.sd);
    /* Another lr: EMISMATCH naming the key, no buffer changed. */
    ASSERT_RC(nadam_load(dir, 0, 0.02, 0, 20, 0, &n, msg), DCP_EMISMATCH);
    ASSERT(strstr(msg, "'optim.param_groups.0.lr'") != NULL);
    ASSERT(untouched(&n.model[0]) && untouched(&n.avg[0]));
    dcp_sd_free(n.sd);
    /* ...taken from the checkpoint when asked. */
    ASSERT_OK(nadam_load(dir, 0, 0.02, 0, 20, DCP_SD_LOAD_HPARAMS, &n, msg));
    ASSERT(dcp_value_as_float(dcp_value_dict_get(dcp_sd_group_values(n.sd, 0),
                                                 "lr")) == 0.01);
    ASSERT(n.sq[19] == 219.0f);
    dcp_sd_free(n.sd);
    /* A plain dcp_load: the callback checks the values once they landed. */
    {
        dcp_ctx *ctx;
        dcp_state *st;
        void *bufs[2];
        ASSERT_OK(nadam_make(&n, 0, 0.02));
        bufs[0] = n.avg;
        bufs[1] = n.sq;
        ASSERT_OK(dcp_sd_bind_model(n.sd, 0, 20, n.model));
        ASSERT_OK(dcp_sd_bind_state(n.sd, 0, 20, bufs));
        ASSERT_OK(dcp_state_create(&st));
        ASSERT_OK(dcp_sd_add_to_state(n.sd, st, "model", "optim"));
        ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
        ASSERT_RC(dcp_load(ctx, st, dir, NULL), DCP_EMISMATCH);
        ASSERT(strstr(dcp_sd_errmsg(n.sd), "'param_groups.0.lr'") != NULL);
        dcp_ctx_free(ctx);
        dcp_state_free(st);
        dcp_sd_free(n.sd);
    }
    /* The flat description does not read a nested checkpoint. */
    ASSERT_RC(nadam_load(dir, DCP_SD_FLAT, 0.01, 0, 20, 0, &n, msg), DCP_EKEY);
    ASSERT(strstr(msg, "optim.param_groups.w.lr") != NULL);
    dcp_sd_free(n.sd);
}

TEST(flat_layout)
{
    const char *dir = dirpath("flat");
    struct nadam n;
    char msg[1024];
    ASSERT_OK(nadam_save(dir, DCP_SD_FLAT));
    ASSERT(has_key(dir, "optim.param_groups.w.lr") == 1);
    ASSERT(has_key(dir, "optim.param_groups.b.betas") == 1);
    ASSERT(has_key(dir, "optim.param_groups.frozen.lr") == 0);
    ASSERT(has_key(dir, "optim.param_groups.0.lr") == 0);
    ASSERT(has_key(dir, "optim.param_groups.0.params") == 0);
    ASSERT(has_key(dir, "optim.state.w.exp_avg") == 1);
    ASSERT_OK(nadam_load(dir, DCP_SD_FLAT, 0.01, 0, 20, 0, &n, msg));
    ASSERT(n.avg[0] == 100.0f && n.sq[19] == 219.0f && n.model[7] == 7.0f);
    dcp_sd_free(n.sd);
    ASSERT_RC(nadam_load(dir, DCP_SD_FLAT, 0.5, 0, 20, 0, &n, msg),
              DCP_EMISMATCH);
    ASSERT(strstr(msg, "'optim.param_groups.w.lr'") != NULL);
    ASSERT(untouched(&n.model[19]) && untouched(&n.avg[0]));
    dcp_sd_free(n.sd);
    ASSERT_OK(nadam_load(dir, DCP_SD_FLAT, 0.5, 0, 20, DCP_SD_LOAD_HPARAMS, &n,
                         msg));
    ASSERT(dcp_value_as_float(dcp_value_dict_get(dcp_sd_group_values(n.sd, 0),
                                                 "lr")) == 0.01);
    dcp_sd_free(n.sd);
    ASSERT_RC(nadam_load(dir, 0, 0.01, 0, 20, 0, &n, msg), DCP_EKEY);
    ASSERT(strstr(msg, "optim.param_groups.0.lr") != NULL);
    dcp_sd_free(n.sd);
}

/* Adam with or without amsgrad over one parameter: saved, then loaded
 * with the other variant. */
static int adam_run(const char *dir, unsigned variant, int save, char *msg)
{
    dcp_sd_optim l;
    dcp_value *g;
    dcp_sd *sd;
    dcp_ctx *ctx;
    dcp_state *st;
    float bufs_[3][6], model[6];
    void *bufs[3] = {bufs_[0], bufs_[1], bufs_[2]};
    int64_t shape[2] = {2, 3};
    int rc;
    memset(bufs_, 0, sizeof(bufs_));
    memset(model, 0, sizeof(model));
    TRY(dcp_sd_optim_preset(DCP_OPTIM_ADAM, variant, &l, &g));
    TRY(dcp_sd_create_optim(&sd, DCP_F32, &l));
    TRY(dcp_sd_add_group_values(sd, g));
    TRY(dcp_sd_add_param(sd, 0, "w", 2, shape));
    TRY(dcp_sd_bind_model(sd, 0, 6, model));
    TRY(dcp_sd_bind_state(sd, 0, 6, bufs));
    TRY(dcp_state_create(&st));
    TRY(dcp_sd_add_to_state(sd, st, "model", "optim"));
    TRY(dcp_ctx_create(&ctx, NULL, NULL));
    rc = save ? dcp_save(ctx, st, dir, NULL)
              : dcp_sd_load(ctx, sd, st, dir, NULL, DCP_SD_LOAD_HPARAMS);
    snprintf(msg, 1024, "%s", dcp_errmsg(ctx));
    dcp_ctx_free(ctx);
    dcp_state_free(st);
    dcp_sd_free(sd);
    dcp_value_free(g);
    return rc;
}

TEST(other_variant)
{
    const char *plain = dirpath("adam"), *ams = dirpath("adam_ams");
    char msg[1024];
    ASSERT_OK(adam_run(plain, 0, 1, msg));
    ASSERT_OK(adam_run(ams, DCP_OPTIM_AMSGRAD, 1, msg));
    ASSERT_OK(adam_run(plain, 0, 0, msg));
    ASSERT_OK(adam_run(ams, DCP_OPTIM_AMSGRAD, 0, msg));
    ASSERT_RC(adam_run(plain, DCP_OPTIM_AMSGRAD, 0, msg), DCP_EKEY);
    ASSERT(strstr(msg, "missing key") &&
           strstr(msg, "'optim.state.w.max_exp_avg_sq'"));
    ASSERT_RC(adam_run(ams, 0, 0, msg), DCP_EKEY);
    ASSERT(strstr(msg, "unexpected key") &&
           strstr(msg, "'optim.state.w.max_exp_avg_sq'"));
}

/* The shape of key in dir's metadata into shape; its ndim, or -1. */
static int shape_of(const char *dir, const char *key, int64_t *shape)
{
    dcp_ctx *ctx;
    dcp_metadata *md;
    dcp_entry_info e;
    long idx;
    int nd = -1;
    TRY(dcp_ctx_create(&ctx, NULL, NULL));
    TRY(dcp_metadata_open(ctx, dir, &md));
    idx = dcp_metadata_find(md, key);
    if (idx >= 0 && dcp_metadata_entry(md, (size_t)idx, &e) == DCP_OK) {
        nd = e.ndim;
        memcpy(shape, e.shape, (size_t)nd * sizeof(*shape));
    }
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return nd;
}

/* Adafactor: row_var / col_var in their own spaces for parameters of 2
 * or more dims, variance for the others; a frozen parameter's factors
 * still take their place in the space; a state slice saves the factors
 * of every parameter it reaches, whole. */
TEST(adafactor_factors)
{
    static const int64_t a[3] = {2, 3, 4}, b[1] = {3}, c[2] = {4, 2};
    const char *dir = dirpath("adafactor");
    dcp_sd_optim l;
    dcp_value *g;
    dcp_sd *sd;
    dcp_ctx *ctx;
    dcp_state *st;
    float model[35], row[12], col[16], var[35];
    void *bufs[3] = {row, col, var};
    int64_t sh[DCP_MAX_NDIM];
    int i;
    ASSERT_OK(dcp_sd_optim_preset(DCP_OPTIM_ADAFACTOR, 0, &l, &g));
    ASSERT_EQ(l.ntensors, 3);
    ASSERT_EQ(l.tensor_kinds[0], DCP_SD_STATE_ROW);
    ASSERT_EQ(l.tensor_kinds[2], DCP_SD_STATE_UNFACTORED);
    ASSERT_EQ(dcp_value_type_of(dcp_value_item(dcp_value_dict_get(g, "eps"),
                                               0)),
              DCP_VALUE_NONE);
    l.tensor_kinds[1] = (dcp_sd_state_kind)9;
    ASSERT_RC(dcp_sd_create_optim(&sd, DCP_F32, &l), DCP_EINVAL);
    l.tensor_kinds[1] = DCP_SD_STATE_COL;
    ASSERT_OK(dcp_sd_create_optim(&sd, DCP_F32, &l));
    ASSERT_OK(dcp_sd_add_group_values(sd, g));
    dcp_value_free(g);
    ASSERT_OK(dcp_sd_add_param(sd, 0, "a", 3, a)); /* [0, 24) */
    ASSERT_OK(dcp_sd_add_param(sd, 0, "c", 2, c)); /* [24, 32), frozen */
    ASSERT_OK(dcp_sd_add_param(sd, 0, "b", 1, b)); /* [32, 35) */
    ASSERT_OK(dcp_sd_set_param_frozen(sd, 1, 1));
    /* row_var: a [2,3,1] 6, c [4,1] 4; col_var: a [2,1,4] 8, c [1,2] 2. */
    ASSERT_EQ(dcp_sd_state_numel(sd, 0), 10);
    ASSERT_EQ(dcp_sd_state_numel(sd, 1), 10);
    ASSERT_EQ(dcp_sd_state_numel(sd, 2), 35);
    ASSERT_EQ(dcp_sd_state_offset(sd, 0, 1), 6);
    ASSERT_EQ(dcp_sd_state_offset(sd, 1, 1), 8);
    ASSERT_EQ(dcp_sd_state_offset(sd, 0, 2), -1);
    ASSERT_EQ(dcp_sd_state_offset(sd, 2, 0), -1);
    ASSERT_EQ(dcp_sd_state_offset(sd, 2, 2), 32);
    for (i = 0; i < 35; i++)
        model[i] = var[i] = (float)i;
    for (i = 0; i < 12; i++)
        row[i] = 100.0f + (float)i;
    for (i = 0; i < 16; i++)
        col[i] = 200.0f + (float)i;
    /* The slice [20, 33) reaches a (whole factors saved) and b (its
     * variance element 32 only). */
    ASSERT_OK(dcp_sd_bind_model(sd, 0, 35, model));
    ASSERT_OK(dcp_sd_bind_state(sd, 20, 33, bufs));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_sd_add_to_state(sd, st, "model", "optim"));
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    /* One rank: the rest of b's variance is missing from the save
     * (a box not covered: DCP_EPLAN). */
    ASSERT_RC(dcp_save(ctx, st, dir, NULL), DCP_EPLAN);
    ASSERT_OK(dcp_sd_bind_state(sd, 20, 35, bufs));
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    ASSERT_EQ(shape_of(dir, "optim.state.a.row_var", sh), 3);
    ASSERT(sh[0] == 2 && sh[1] == 3 && sh[2] == 1);
    ASSERT_EQ(shape_of(dir, "optim.state.a.col_var", sh), 3);
    ASSERT(sh[0] == 2 && sh[1] == 1 && sh[2] == 4);
    ASSERT_EQ(shape_of(dir, "optim.state.b.variance", sh), 1);
    ASSERT_EQ(shape_of(dir, "optim.state.a.variance", sh), -1);
    ASSERT_EQ(shape_of(dir, "optim.state.b.row_var", sh), -1);
    ASSERT_EQ(shape_of(dir, "optim.state.c.row_var", sh), -1);
    /* Loaded back whole: the factors of a, b's variance. */
    memset(row, 0, sizeof(row));
    memset(col, 0, sizeof(col));
    memset(var, 0, sizeof(var));
    ASSERT_OK(dcp_sd_bind_state(sd, 0, 35, bufs));
    ASSERT_OK(dcp_sd_load(ctx, sd, st, dir, NULL, 0));
    for (i = 0; i < 6; i++)
        ASSERT(row[i] == 100.0f + (float)i);
    for (i = 0; i < 8; i++)
        ASSERT(col[i] == 200.0f + (float)i);
    ASSERT(row[6] == 0.0f && col[8] == 0.0f); /* c's: frozen */
    for (i = 32; i < 35; i++) /* saved from var[12..15): slice-relative */
        ASSERT(var[i] == (float)(i - 20));
    ASSERT(var[0] == 0.0f);
    dcp_ctx_free(ctx);
    dcp_state_free(st);
    dcp_sd_free(sd);
}

int main(void)
{
    RUN(presets_and_bad_args);
    RUN(nested_frozen_scalars_slices);
    RUN(flat_layout);
    RUN(other_variant);
    RUN(adafactor_factors);
    return TEST_SUMMARY();
}
