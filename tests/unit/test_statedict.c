/*
 * dcp_statedict.h in one process: dcp_range_boxes over every range of
 * small shapes; the keys, layout and values a dcp_sd writes (those of
 * PyTorch's get_state_dict for a model with AdamW); loads into other flat
 * slices; asynchronous saves; and bad input: a checkpoint of another
 * model (missing or extra parameters, other shapes, dtypes, groups) or of
 * other hyper-parameters fails with the exact code, names the keys and
 * changes no buffer.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_statedict.h>

#include <math.h>
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
        strcpy(root, "/tmp/dcp-test-statedict-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

/* ------------------------------------------------------ range boxes */

/* Checks the boxes of [s, e): row-major order, contiguous, inside the
 * shape, at most 2 * ndim - 1. Returns 0 or the line of the failed
 * check. */
static int check_range(int ndim, const int64_t *shape, int64_t s, int64_t e)
{
    dcp_box b[DCP_RANGE_MAX_BOXES];
    size_t n, k;
    int64_t next = s, stride[DCP_MAX_NDIM];
    int d;
    if (dcp_range_boxes(ndim, shape, s, e, b, DCP_RANGE_MAX_BOXES, &n))
        return __LINE__;
    if (n > (size_t)(ndim ? 2 * ndim - 1 : 1) || (s == e) != (n == 0))
        return __LINE__;
    for (d = ndim - 1; d >= 0; d--)
        stride[d] = d == ndim - 1 ? 1 : stride[d + 1] * shape[d + 1];
    for (k = 0; k < n; k++) {
        int64_t idx[DCP_MAX_NDIM] = {0}, count = 1, i;
        if (b[k].begin != next)
            return __LINE__;
        for (d = 0; d < ndim; d++) {
            if (b[k].offsets[d] < 0 || b[k].sizes[d] < 1 ||
                b[k].offsets[d] + b[k].sizes[d] > shape[d])
                return __LINE__;
            count *= b[k].sizes[d];
        }
        /* Every element of the box, in C order, is the next flat index. */
        for (i = 0; i < count; i++) {
            int64_t flat = 0, rem = i;
            for (d = ndim - 1; d >= 0; d--) {
                idx[d] = rem % b[k].sizes[d];
                rem /= b[k].sizes[d];
            }
            for (d = 0; d < ndim; d++)
                flat += (b[k].offsets[d] + idx[d]) * stride[d];
            if (flat != next++)
                return __LINE__;
        }
    }
    return next == e ? 0 : __LINE__;
}

TEST(range_boxes_every_range)
{
    static const int64_t shapes[][5] = {
        {0},       {1, 7},    {2, 3, 4},    {3, 2, 3, 4},    {4, 2, 1, 3, 2},
        {2, 1, 1}, {2, 5, 1}, {3, 3, 0, 2}, {4, 1, 2, 3, 1}, {2, 4, 5}};
    size_t i;
    for (i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        int ndim = (int)shapes[i][0], d, line;
        int64_t numel = 1, s, e;
        for (d = 0; d < ndim; d++)
            numel *= shapes[i][1 + d];
        for (s = 0; s <= numel; s++)
            for (e = s; e <= numel; e++) {
                line = check_range(ndim, &shapes[i][1], s, e);
                if (line)
                    FAIL_AT_("shape #%zu range [%lld, %lld): check at line %d",
                             i, (long long)s, (long long)e, line);
            }
    }
}

TEST(range_boxes_shapes_and_bad_args)
{
    dcp_box b[DCP_RANGE_MAX_BOXES];
    int64_t sh[2] = {4, 5}, big[2] = {INT64_MAX, 2}, neg[1] = {-1};
    size_t n = 99;
    /* Row 1 from column 2 to row 3 column 1: a partial row, a whole row, a
     * partial row. */
    ASSERT_OK(dcp_range_boxes(2, sh, 7, 16, b, DCP_RANGE_MAX_BOXES, &n));
    ASSERT_EQ(n, 3);
    ASSERT(b[0].offsets[0] == 1 && b[0].offsets[1] == 2);
    ASSERT(b[0].sizes[0] == 1 && b[0].sizes[1] == 3);
    ASSERT(b[1].offsets[0] == 2 && b[1].sizes[0] == 1 && b[1].sizes[1] == 5);
    ASSERT(b[2].offsets[0] == 3 && b[2].sizes[1] == 1 && b[2].begin == 15);
    /* Whole rows: one box. */
    ASSERT_OK(dcp_range_boxes(2, sh, 5, 20, b, 1, &n));
    ASSERT_EQ(n, 1);
    ASSERT(b[0].offsets[0] == 1 && b[0].sizes[0] == 3 && b[0].sizes[1] == 5);
    ASSERT_RC(dcp_range_boxes(2, sh, 7, 16, b, 2, &n), DCP_EINVAL);
    ASSERT_EQ(n, 0);
    ASSERT_RC(dcp_range_boxes(2, sh, 3, 2, b, 3, &n), DCP_EINVAL);
    ASSERT_RC(dcp_range_boxes(2, sh, 0, 21, b, 3, &n), DCP_EINVAL);
    ASSERT_RC(dcp_range_boxes(2, sh, -1, 2, b, 3, &n), DCP_EINVAL);
    ASSERT_RC(dcp_range_boxes(2, big, 0, 1, b, 3, &n), DCP_EINVAL);
    ASSERT_RC(dcp_range_boxes(1, neg, 0, 0, b, 3, &n), DCP_EINVAL);
    ASSERT_RC(dcp_range_boxes(DCP_MAX_NDIM + 1, sh, 0, 0, b, 3, &n),
              DCP_EINVAL);
    ASSERT_RC(dcp_range_boxes(2, NULL, 0, 0, b, 3, &n), DCP_EINVAL);
    ASSERT_RC(dcp_range_boxes(2, sh, 0, 1, NULL, 3, &n), DCP_EINVAL);
    ASSERT_RC(dcp_range_boxes(2, sh, 0, 1, b, 3, NULL), DCP_EINVAL);
    ASSERT_OK(dcp_range_boxes(0, NULL, 0, 1, b, 1, &n));
    ASSERT_EQ(n, 1);
    ASSERT_OK(dcp_range_boxes(0, NULL, 1, 1, b, 1, &n));
    ASSERT_EQ(n, 0);
}

/* ------------------------------------------------------------ model */

/*
 * The test model, flat order: fc1.weight [4,3] (group 0), fc1.bias [4]
 * (group 1), emb [2,3,2] (group 0), scale [] (group 1), none [0,3]
 * (group 1), fc2.weight [2,4] (group 0): 12 + 4 + 12 + 1 + 0 + 8 = 37.
 */
#define NUMEL 37
struct pdesc {
    const char *fqn;
    size_t group;
    int ndim;
    int64_t shape[3];
};
static const struct pdesc net[] = {
    {"fc1.weight", 0, 2, {4, 3}}, {"fc1.bias", 1, 1, {4}},
    {"emb", 0, 3, {2, 3, 2}},     {"scale", 1, 0, {0}},
    {"none", 1, 2, {0, 3}},       {"fc2.weight", 0, 2, {2, 4}}};
#define NPARAM (sizeof(net) / sizeof(net[0]))

static void hp_of(size_t g, dcp_adamw *hp)
{
    dcp_adamw_defaults(hp);
    hp->lr = g ? 3e-4 : 1e-3;
    hp->weight_decay = g ? 0.0 : 0.1;
    hp->beta2 = 0.95;
}

/* The model, with nparam of net's parameters (the last one's shape
 * replaced by alt when given), as dtype. */
static dcp_sd *make_sd(size_t nparam, dcp_dtype dtype, const int64_t *alt)
{
    dcp_sd *sd;
    dcp_adamw hp;
    size_t i, g;
    if (dcp_sd_create(&sd, dtype))
        return NULL;
    for (g = 0; g < 2; g++) {
        hp_of(g, &hp);
        if (dcp_sd_add_group(sd, &hp))
            abort();
    }
    for (i = 0; i < nparam; i++) {
        const int64_t *shape = alt && i == nparam - 1 ? alt : net[i].shape;
        if (dcp_sd_add_param(sd, net[i].group, net[i].fqn, net[i].ndim, shape))
            abort();
    }
    return sd;
}

static void fill(float *p, size_t n, float base)
{
    size_t i;
    for (i = 0; i < n; i++)
        p[i] = base + (float)i * 0.25f;
}

/* Saves the test model (nparam parameters), step 7, with a "trainer"
 * value beside it. */
static int save_net(dcp_ctx *ctx, const char *dir, size_t nparam,
                    const int64_t *alt,
                    dcp_sd *(*maker)(size_t, dcp_dtype, const int64_t *))
{
    float w[64], m[64], v[64];
    dcp_sd *sd = maker(nparam, DCP_F32, alt);
    dcp_state *st;
    int rc;
    int64_t n = dcp_sd_numel(sd);
    fill(w, 64, 1.0f);
    fill(m, 64, -2.0f);
    fill(v, 64, 0.5f);
    if (dcp_state_create(&st))
        abort();
    rc = dcp_sd_bind_model(sd, 0, n, w);
    if (rc == DCP_OK)
        rc = dcp_sd_bind_optim(sd, 0, n, m, v);
    if (rc == DCP_OK)
        rc = dcp_sd_set_step(sd, 7);
    if (rc == DCP_OK)
        rc = dcp_sd_add_to_state(sd, st, "model", "optim");
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "trainer", dcp_value_int(42));
    if (rc == DCP_OK)
        rc = dcp_save(ctx, st, dir, NULL);
    dcp_state_free(st);
    dcp_sd_free(sd);
    return rc;
}

TEST(describe_and_bind)
{
    dcp_sd *sd = make_sd(NPARAM, DCP_F32, NULL);
    dcp_adamw hp, bad;
    dcp_state *st;
    int64_t sh[1] = {3}, neg[1] = {-3};
    float buf[NUMEL];
    dcp_adamw_defaults(&hp);
    ASSERT(sd != NULL);
    ASSERT_EQ(dcp_sd_numel(sd), NUMEL);
    ASSERT_EQ(dcp_sd_param_count(sd), NPARAM);
    ASSERT_EQ(dcp_sd_group_count(sd), 2);
    ASSERT_EQ(dcp_sd_param_offset(sd, 2), 16);
    ASSERT_EQ(dcp_sd_param_offset(sd, 5), 29);
    ASSERT_EQ(dcp_sd_param_offset(sd, 6), -1);
    ASSERT_RC(dcp_sd_add_param(sd, 0, "emb", 1, sh), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_param(sd, 2, "x", 1, sh), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_param(sd, 0, "", 1, sh), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_param(sd, 0, "x", 1, neg), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_param(sd, 0, "x", 9, sh), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_param(sd, 0, "x", 1, NULL), DCP_EINVAL);
    dcp_adamw_defaults(&bad);
    bad.beta1 = 1.0;
    ASSERT_RC(dcp_sd_add_group(sd, &bad), DCP_EINVAL);
    bad.beta1 = 0.9;
    bad.lr = NAN;
    ASSERT_RC(dcp_sd_add_group(sd, &bad), DCP_EINVAL);
    bad.lr = 1e-3;
    bad.struct_size = 4;
    ASSERT_RC(dcp_sd_add_group(sd, &bad), DCP_EINVAL);
    ASSERT_RC(dcp_sd_bind_model(sd, 0, NUMEL + 1, buf), DCP_EINVAL);
    ASSERT_RC(dcp_sd_bind_model(sd, 5, 4, buf), DCP_EINVAL);
    ASSERT_RC(dcp_sd_bind_model(sd, 0, 4, NULL), DCP_EINVAL);
    ASSERT_RC(dcp_sd_bind_optim(sd, 0, 4, buf, NULL), DCP_EINVAL);
    ASSERT_OK(dcp_sd_bind_model(sd, 3, 3, NULL));
    /* Bound: the description is fixed. */
    ASSERT_RC(dcp_sd_add_param(sd, 0, "late", 1, sh), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_group(sd, &hp), DCP_EINVAL);
    ASSERT_RC(dcp_sd_set_step(sd, -1), DCP_EINVAL);
    ASSERT_RC(dcp_sd_set_step(sd, ((int64_t)1 << 24) + 1), DCP_EINVAL);
    ASSERT_OK(dcp_sd_set_step(sd, (int64_t)1 << 24));
    ASSERT_EQ(dcp_sd_step(sd), (int64_t)1 << 24);
    hp.struct_size = sizeof(hp);
    ASSERT_OK(dcp_sd_hparams(sd, 1, &hp));
    ASSERT(hp.lr == 3e-4 && hp.beta2 == 0.95 && hp.weight_decay == 0.0);
    ASSERT_RC(dcp_sd_hparams(sd, 2, &hp), DCP_EINVAL);
    hp.lr = 5e-5;
    ASSERT_OK(dcp_sd_set_hparams(sd, 1, &hp));
    hp.eps = -1;
    ASSERT_RC(dcp_sd_set_hparams(sd, 1, &hp), DCP_EINVAL);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_RC(dcp_sd_add_to_state(sd, st, NULL, NULL), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_to_state(sd, st, "", "optim"), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_to_state(sd, st, "x", "x"), DCP_EINVAL);
    ASSERT_OK(dcp_sd_add_to_state(sd, st, "model", NULL));
    ASSERT_RC(dcp_sd_add_to_state(sd, st, "model", NULL), DCP_EINVAL);
    ASSERT_RC(dcp_sd_add_to_state(sd, st, "optim", "model"), DCP_EINVAL);
    ASSERT_EQ(dcp_state_count(st), 1); /* left as it was */
    ASSERT_OK(dcp_state_push(st, "nested"));
    ASSERT_OK(dcp_state_push_index(st, 3));
    ASSERT_OK(dcp_sd_add_to_state(sd, st, "model", "optim"));
    ASSERT_RC(dcp_sd_add_to_state(sd, st, "optim", NULL), DCP_EINVAL);
    ASSERT_STR_EQ(dcp_state_key(st, 2), "nested.3.optim");
    dcp_state_free(st);
    dcp_sd_free(sd);
    dcp_sd_free(NULL);
    ASSERT_RC(dcp_sd_create(&sd, (dcp_dtype)99), DCP_EINVAL);
    ASSERT(sd == NULL);
}

/* Every key torch's get_state_dict gives this model with its AdamW. */
static int expected_keys(char keys[][64], size_t cap)
{
    static const char *const hp[12] = {"lr",
                                       "betas",
                                       "eps",
                                       "weight_decay",
                                       "amsgrad",
                                       "maximize",
                                       "foreach",
                                       "capturable",
                                       "differentiable",
                                       "fused",
                                       "decoupled_weight_decay",
                                       "params"};
    size_t n = 0, i, k, g;
    for (i = 0; i < NPARAM && n + 4 <= cap; i++) {
        snprintf(keys[n++], 64, "model.%s", net[i].fqn);
        snprintf(keys[n++], 64, "optim.state.%s.step", net[i].fqn);
        snprintf(keys[n++], 64, "optim.state.%s.exp_avg", net[i].fqn);
        snprintf(keys[n++], 64, "optim.state.%s.exp_avg_sq", net[i].fqn);
    }
    for (g = 0; g < 2; g++)
        for (k = 0; k < 12 && n < cap; k++)
            snprintf(keys[n++], 64, "optim.param_groups.%zu.%s", g, hp[k]);
    return (int)n;
}

TEST(layout_is_torchs)
{
    const char *dir = dirpath("layout");
    char keys[64][64];
    dcp_ctx *ctx;
    dcp_metadata *md;
    dcp_entry_info e;
    dcp_value *v;
    const char *s;
    int64_t num;
    int i, n = expected_keys(keys, 64);
    long idx;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_net(ctx, dir, NPARAM, NULL, make_sd));
    ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
    ASSERT_EQ(dcp_metadata_count(md), n + 1); /* + "trainer" */
    for (i = 0; i < n; i++) {
        idx = dcp_metadata_find(md, keys[i]);
        if (idx < 0)
            FAIL_AT_("key '%s' not saved", keys[i]);
    }
    /* Tensors with their real shapes; steps 0-d float32. */
    idx = dcp_metadata_find(md, "optim.state.emb.exp_avg_sq");
    ASSERT_OK(dcp_metadata_entry(md, (size_t)idx, &e));
    ASSERT(e.is_tensor && e.dtype == DCP_F32 && e.ndim == 3);
    ASSERT(e.shape[0] == 2 && e.shape[1] == 3 && e.shape[2] == 2);
    ASSERT_EQ(e.npath, 4);
    ASSERT_OK(dcp_metadata_path(md, (size_t)idx, 2, &s, &num));
    ASSERT_STR_EQ(s, "emb");
    idx = dcp_metadata_find(md, "optim.state.fc1.bias.step");
    ASSERT_OK(dcp_metadata_entry(md, (size_t)idx, &e));
    ASSERT(e.is_tensor && e.dtype == DCP_F32 && e.ndim == 0);
    {
        float step = 0;
        ASSERT_OK(dcp_metadata_read_box(ctx, md, (size_t)idx, NULL, NULL, &step,
                                        sizeof(step), 1));
        ASSERT(step == 7.0f);
    }
    idx = dcp_metadata_find(md, "model.none");
    ASSERT_OK(dcp_metadata_entry(md, (size_t)idx, &e));
    ASSERT(e.ndim == 2 && e.shape[0] == 0 && e.shape[1] == 3);
    /* Group values with torch's types. */
    idx = dcp_metadata_find(md, "optim.param_groups.1.betas");
    ASSERT_OK(dcp_metadata_path(md, (size_t)idx, 2, &s, &num));
    ASSERT(s == NULL && num == 1);
    ASSERT_OK(dcp_metadata_read_value(ctx, md, (size_t)idx, &v));
    ASSERT_EQ(dcp_value_type_of(v), DCP_VALUE_TUPLE);
    ASSERT(dcp_value_as_float(dcp_value_item(v, 1)) == 0.95);
    dcp_value_free(v);
    idx = dcp_metadata_find(md, "optim.param_groups.1.params");
    ASSERT_OK(dcp_metadata_read_value(ctx, md, (size_t)idx, &v));
    ASSERT_EQ(dcp_value_type_of(v), DCP_VALUE_LIST);
    ASSERT_EQ(dcp_value_len(v), 3);
    ASSERT_STR_EQ(dcp_value_as_str(dcp_value_item(v, 0), NULL), "fc1.bias");
    ASSERT_STR_EQ(dcp_value_as_str(dcp_value_item(v, 2), NULL), "none");
    dcp_value_free(v);
    idx = dcp_metadata_find(md, "optim.param_groups.0.decoupled_weight_decay");
    ASSERT_OK(dcp_metadata_read_value(ctx, md, (size_t)idx, &v));
    ASSERT(dcp_value_type_of(v) == DCP_VALUE_BOOL && dcp_value_as_bool(v));
    dcp_value_free(v);
    idx = dcp_metadata_find(md, "optim.param_groups.0.fused");
    ASSERT_OK(dcp_metadata_read_value(ctx, md, (size_t)idx, &v));
    ASSERT_EQ(dcp_value_type_of(v), DCP_VALUE_NONE);
    dcp_value_free(v);
    idx = dcp_metadata_find(md, "optim.param_groups.0.weight_decay");
    ASSERT_OK(dcp_metadata_read_value(ctx, md, (size_t)idx, &v));
    ASSERT(dcp_value_type_of(v) == DCP_VALUE_FLOAT &&
           dcp_value_as_float(v) == 0.1);
    dcp_value_free(v);
    dcp_metadata_free(md);
    ASSERT_OK(dcp_verify(ctx, dir));
    dcp_ctx_free(ctx);
}

/* Loads dir into a model bound to [lo, hi) of both spaces; 0 on success
 * with the slice equal to what save_net saved and step 7. */
static int load_slice(dcp_ctx *ctx, const char *dir, int64_t lo, int64_t hi)
{
    float w[64], m[64], v[64], want[64];
    dcp_sd *sd = make_sd(NPARAM, DCP_F32, NULL);
    dcp_state *st;
    int rc;
    memset(w, 0xab, sizeof(w));
    memset(m, 0xab, sizeof(m));
    memset(v, 0xab, sizeof(v));
    if (dcp_state_create(&st))
        abort();
    rc = dcp_sd_bind_model(sd, lo, hi, w);
    if (rc == DCP_OK)
        rc = dcp_sd_bind_optim(sd, lo, hi, m, v);
    if (rc == DCP_OK)
        rc = dcp_sd_add_to_state(sd, st, "model", "optim");
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "trainer", dcp_value_none());
    if (rc == DCP_OK) {
        dcp_load_options lo_ = {sizeof(lo_), DCP_LOAD_PARTIAL, NULL};
        /* Partial: with a slice, keys outside it are asked by nobody. */
        rc = dcp_sd_load(ctx, sd, st, dir, &lo_, 0);
    }
    if (rc == DCP_OK) {
        size_t n = (size_t)(hi - lo);
        fill(want, 64, 1.0f);
        if (memcmp(w, want + lo, n * 4) != 0)
            rc = -100;
        fill(want, 64, -2.0f);
        if (memcmp(m, want + lo, n * 4) != 0)
            rc = -101;
        fill(want, 64, 0.5f);
        if (memcmp(v, want + lo, n * 4) != 0)
            rc = -102;
        /* Beyond the slice: untouched. */
        if (n < 64 && ((uint8_t *)w)[n * 4] != 0xab)
            rc = -103;
        if (dcp_sd_step(sd) != 7)
            rc = -104;
        if (dcp_value_as_int(dcp_state_value(st, "trainer")) != 42)
            rc = -105;
    }
    dcp_state_free(st);
    dcp_sd_free(sd);
    return rc;
}

TEST(load_any_slice)
{
    const char *dir = dirpath("slices");
    dcp_ctx *ctx;
    int64_t lo, hi;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_net(ctx, dir, NPARAM, NULL, make_sd));
    for (lo = 0; lo <= NUMEL; lo += 3)
        for (hi = lo; hi <= NUMEL; hi += 5) {
            int rc = load_slice(ctx, dir, lo, hi);
            if (rc)
                FAIL_AT_("slice [%lld, %lld): %d (%s)", (long long)lo,
                         (long long)hi, rc, dcp_errmsg(ctx));
        }
    ASSERT_OK(load_slice(ctx, dir, 0, NUMEL));
    ASSERT_OK(load_slice(ctx, dir, 13, 17));
    dcp_ctx_free(ctx);
}

/* A state bound to sentinel buffers, for the bad-input cases. */
struct target {
    dcp_sd *sd;
    dcp_state *st;
    float w[64], m[64], v[64];
};

static void target_make(struct target *t, dcp_sd *sd)
{
    t->sd = sd;
    memset(t->w, 0xab, sizeof(t->w));
    memset(t->m, 0xab, sizeof(t->m));
    memset(t->v, 0xab, sizeof(t->v));
    if (!sd || dcp_state_create(&t->st) ||
        dcp_sd_bind_model(sd, 0, dcp_sd_numel(sd), t->w) ||
        dcp_sd_bind_optim(sd, 0, dcp_sd_numel(sd), t->m, t->v) ||
        dcp_sd_set_step(sd, 3) ||
        dcp_sd_add_to_state(sd, t->st, "model", "optim") ||
        dcp_state_add_value(t->st, "trainer", dcp_value_none()))
        abort();
}

/* 1 when no buffer, value or step changed. */
static int target_untouched(const struct target *t)
{
    size_t i;
    for (i = 0; i < sizeof(t->w); i++)
        if (((const uint8_t *)t->w)[i] != 0xab ||
            ((const uint8_t *)t->m)[i] != 0xab ||
            ((const uint8_t *)t->v)[i] != 0xab)
            return 0;
    return dcp_sd_step(t->sd) == 3 &&
           dcp_value_type_of(dcp_state_value(t->st, "trainer")) ==
               DCP_VALUE_NONE;
}

static void target_free(struct target *t)
{
    dcp_state_free(t->st);
    dcp_sd_free(t->sd);
}

#define ASSERT_MSG(ctx, needle)                                      \
    do {                                                             \
        if (!strstr(dcp_errmsg(ctx), (needle)))                      \
            FAIL_AT_("message \"%s\" lacks \"%s\"", dcp_errmsg(ctx), \
                     (needle));                                      \
    } while (0)

TEST(other_model_missing_and_extra)
{
    const char *dir = dirpath("fewer"), *dir2 = dirpath("more");
    const char *const *keys;
    struct target t;
    dcp_ctx *ctx;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    /* Saved without fc2.weight; loaded with it. */
    ASSERT_OK(save_net(ctx, dir, NPARAM - 1, NULL, make_sd));
    target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
    ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dir, NULL, 0), DCP_EKEY);
    ASSERT_MSG(ctx, "4 missing keys ('model.fc2.weight', "
                    "'optim.state.fc2.weight.step', "
                    "'optim.state.fc2.weight.exp_avg', "
                    "'optim.state.fc2.weight.exp_avg_sq')");
    ASSERT(strstr(dcp_errmsg(ctx), "unexpected") == NULL);
    ASSERT_MSG(ctx, "'optim.param_groups.0.params': 'fc2.weight' of group 0 "
                    "missing");
    ASSERT_EQ(dcp_load_report(ctx, 0, &keys), 4);
    ASSERT_STR_EQ(keys[3], "optim.state.fc2.weight.exp_avg_sq");
    ASSERT_EQ(dcp_load_report(ctx, 1, &keys), 0);
    ASSERT(target_untouched(&t));
    target_free(&t);
    /* Saved with it; loaded without: unexpected keys. */
    ASSERT_OK(save_net(ctx, dir2, NPARAM, NULL, make_sd));
    target_make(&t, make_sd(NPARAM - 1, DCP_F32, NULL));
    ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dir2, NULL, 0), DCP_EKEY);
    ASSERT_MSG(ctx, "optimizer: 4 unexpected keys ('model.fc2.weight', "
                    "'optim.state.fc2.weight.exp_avg', ");
    ASSERT_MSG(ctx, "'optim.param_groups.0.params': 'fc2.weight' is not a "
                    "parameter of the model");
    ASSERT_EQ(dcp_load_report(ctx, 1, &keys), 4);
    ASSERT_EQ(dcp_load_report(ctx, 0, &keys), 0);
    ASSERT(target_untouched(&t));
    target_free(&t);
    dcp_ctx_free(ctx);
}

TEST(other_shapes_and_dtypes)
{
    const char *dir = dirpath("shapes");
    int64_t alt[2] = {4, 2};
    struct target t;
    dcp_ctx *ctx;
    uint16_t bw[64], bm[64], bv[64];
    dcp_state *st;
    dcp_sd *sd;
    dcp_load_options cast = {sizeof(cast), DCP_LOAD_CAST, NULL};
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_net(ctx, dir, NPARAM, alt, make_sd));
    target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
    ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dir, NULL, 0), DCP_EMISMATCH);
    ASSERT_MSG(ctx, "optimizer: 3 mismatches "
                    "('model.fc2.weight': shape [4,2] saved, [2,4] "
                    "expected; 'optim.state.fc2.weight.exp_avg': shape");
    ASSERT(target_untouched(&t));
    target_free(&t);
    /* The right shapes as bfloat16: a dtype mismatch, unless cast. */
    ASSERT_OK(save_net(ctx, dir, NPARAM, NULL, make_sd));
    sd = make_sd(NPARAM, DCP_BF16, NULL);
    memset(bw, 0, sizeof(bw));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_sd_bind_model(sd, 0, NUMEL, bw));
    ASSERT_OK(dcp_sd_bind_optim(sd, 0, NUMEL, bm, bv));
    ASSERT_OK(dcp_sd_add_to_state(sd, st, "model", "optim"));
    ASSERT_OK(dcp_state_add_value(st, "trainer", dcp_value_none()));
    ASSERT_RC(dcp_sd_load(ctx, sd, st, dir, NULL, 0), DCP_EMISMATCH);
    ASSERT_MSG(ctx, "'model.fc1.weight': dtype float32 saved, bfloat16 "
                    "expected");
    ASSERT_MSG(ctx, "18 mismatches");
    ASSERT_EQ(bw[0], 0);
    ASSERT_OK(dcp_sd_load(ctx, sd, st, dir, &cast, 0));
    ASSERT_EQ(bw[0], 0x3f80); /* 1.0 */
    ASSERT_EQ(bw[1], 0x3fa0); /* 1.25 */
    ASSERT_EQ(dcp_sd_step(sd), 7);
    dcp_state_free(st);
    dcp_sd_free(sd);
    dcp_ctx_free(ctx);
}

/* The same model with other hyper-parameters or groups. */
static int hp_variant;
static dcp_sd *make_variant(size_t nparam, dcp_dtype dtype, const int64_t *alt)
{
    dcp_sd *sd;
    dcp_adamw hp;
    size_t i, g;
    (void)alt;
    if (dcp_sd_create(&sd, dtype))
        return NULL;
    for (g = 0; g < (hp_variant == 3 ? 3u : 2u); g++) {
        hp_of(g, &hp);
        if (hp_variant == 1 && g == 0)
            hp.lr = 2e-3;
        if (hp_variant == 1 && g == 1)
            hp.beta1 = 0.8;
        if (dcp_sd_add_group(sd, &hp))
            abort();
    }
    for (i = 0; i < nparam; i++) {
        /* Variant 2: fc1.bias in group 0. */
        size_t g2 = hp_variant == 2 && i == 1 ? 0 : net[i].group;
        if (dcp_sd_add_param(sd, g2, net[i].fqn, net[i].ndim, net[i].shape))
            abort();
    }
    return sd;
}

TEST(other_hyperparameters)
{
    const char *dir = dirpath("hp"), *dir2 = dirpath("groups"),
               *dir3 = dirpath("three");
    struct target t;
    dcp_adamw hp;
    dcp_ctx *ctx;
    const char *const *keys;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    hp_variant = 1;
    ASSERT_OK(save_net(ctx, dir, NPARAM, NULL, make_variant));
    target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
    ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dir, NULL, 0), DCP_EMISMATCH);
    ASSERT_MSG(ctx, "optimizer: 2 mismatches ('optim.param_groups.0.lr': saved "
                    "0.002, expected 0.001; 'optim.param_groups.1.betas'[0]: "
                    "saved 0.80000000000000004, expected 0.90000000000000002)");
    ASSERT(target_untouched(&t));
    /* Taking the checkpoint's instead. */
    ASSERT_OK(dcp_sd_load(ctx, t.sd, t.st, dir, NULL, DCP_SD_LOAD_HPARAMS));
    hp.struct_size = sizeof(hp);
    ASSERT_OK(dcp_sd_hparams(t.sd, 0, &hp));
    ASSERT(hp.lr == 2e-3 && hp.beta1 == 0.9);
    ASSERT_OK(dcp_sd_hparams(t.sd, 1, &hp));
    ASSERT(hp.lr == 3e-4 && hp.beta1 == 0.8);
    ASSERT_EQ(dcp_sd_step(t.sd), 7);
    ASSERT(t.w[0] == 1.0f);
    ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dir, NULL, 1u << 5), DCP_EINVAL);
    target_free(&t);
    /* A plain dcp_load finds it only after the data landed. */
    target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
    ASSERT_RC(dcp_load(ctx, t.st, dir, NULL), DCP_EMISMATCH);
    if (!strstr(dcp_sd_errmsg(t.sd), "'param_groups.0.lr': saved 0.002"))
        FAIL_AT_("sd message \"%s\"", dcp_sd_errmsg(t.sd));
    ASSERT_MSG(ctx, "load_state_dict failed");
    target_free(&t);
    /* fc1.bias in another group. */
    hp_variant = 2;
    ASSERT_OK(save_net(ctx, dir2, NPARAM, NULL, make_variant));
    target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
    ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dir2, NULL, DCP_SD_LOAD_HPARAMS),
              DCP_EMISMATCH);
    ASSERT_MSG(ctx, "'optim.param_groups.0.params': 'fc1.bias' belongs to "
                    "another group; 'optim.param_groups.1.params': "
                    "'fc1.bias' of group 1 missing");
    ASSERT(target_untouched(&t));
    target_free(&t);
    /* A third (empty) group in the checkpoint. */
    hp_variant = 3;
    ASSERT_OK(save_net(ctx, dir3, NPARAM, NULL, make_variant));
    target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
    ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dir3, NULL, 0), DCP_EKEY);
    ASSERT_MSG(ctx, "12 unexpected keys ('optim.param_groups.2.amsgrad', ");
    ASSERT_EQ(dcp_load_report(ctx, 1, &keys), 12);
    ASSERT(target_untouched(&t));
    target_free(&t);
    dcp_ctx_free(ctx);
}

/* A checkpoint written by hand in torch's layout, with one twist. */
static int save_by_hand(dcp_ctx *ctx, const char *dir, int twist)
{
    float w[64], steps[NPARAM];
    dcp_state *st;
    size_t i, g;
    int rc = dcp_state_create(&st);
    fill(w, 64, 1.0f);
    for (i = 0; rc == DCP_OK && i < NPARAM; i++) {
        const struct pdesc *p = &net[i];
        int64_t s[3];
        memcpy(s, p->shape, sizeof(s));
        steps[i] = twist == 1 && i == 2 ? 6.0f : twist == 2 ? 2.5f : 7.0f;
        rc = dcp_state_push(st, "model");
        rc = rc ? rc
                : dcp_state_add_tensor(st, p->fqn, DCP_F32, p->ndim, s, NULL,
                                       NULL, w, DCP_MEM_HOST);
        rc = rc ? rc : dcp_state_pop(st);
        rc = rc ? rc : dcp_state_push(st, "optim");
        rc = rc ? rc : dcp_state_push(st, "state");
        rc = rc ? rc : dcp_state_push(st, p->fqn);
        rc = rc ? rc
                : dcp_state_add_tensor(st, "step", DCP_F32, 0, NULL, NULL, NULL,
                                       &steps[i], DCP_MEM_HOST);
        rc = rc ? rc
                : dcp_state_add_tensor(st, "exp_avg", DCP_F32, p->ndim, s, NULL,
                                       NULL, w, DCP_MEM_HOST);
        rc = rc ? rc
                : dcp_state_add_tensor(st, "exp_avg_sq", DCP_F32, p->ndim, s,
                                       NULL, NULL, w, DCP_MEM_HOST);
        rc = rc ? rc : dcp_state_pop(st);
        rc = rc ? rc : dcp_state_pop(st);
        rc = rc ? rc : dcp_state_pop(st);
    }
    for (g = 0; rc == DCP_OK && g < 2; g++) {
        dcp_value *grp = dcp_value_dict(), *betas = dcp_value_tuple(),
                  *params = dcp_value_list();
        dcp_adamw hp;
        hp_of(g, &hp);
        dcp_value_append(betas, dcp_value_float(hp.beta1));
        dcp_value_append(betas, dcp_value_float(hp.beta2));
        for (i = 0; i < NPARAM; i++)
            if (net[i].group == g)
                dcp_value_append(params, dcp_value_str(net[i].fqn));
        dcp_value_dict_set(grp, "lr", dcp_value_float(hp.lr));
        dcp_value_dict_set(grp, "betas", betas);
        dcp_value_dict_set(grp, "eps", dcp_value_float(hp.eps));
        dcp_value_dict_set(grp, "weight_decay",
                           dcp_value_float(hp.weight_decay));
        dcp_value_dict_set(grp, "amsgrad", dcp_value_bool(twist == 3));
        dcp_value_dict_set(grp, "maximize", dcp_value_bool(0));
        dcp_value_dict_set(grp, "foreach", dcp_value_bool(1));
        dcp_value_dict_set(grp, "capturable", dcp_value_bool(0));
        dcp_value_dict_set(grp, "differentiable", dcp_value_bool(0));
        dcp_value_dict_set(grp, "fused", dcp_value_none());
        dcp_value_dict_set(grp, "decoupled_weight_decay",
                           dcp_value_bool(twist != 4));
        dcp_value_dict_set(grp, "params", params);
        /* {"optim": {"param_groups": [..., grp]}}: a list index path. */
        rc = dcp_state_push(st, "optim");
        rc = rc ? rc : dcp_state_push(st, "param_groups");
        rc = rc ? rc : dcp_state_push_index(st, (int64_t)g);
        rc = rc ? rc : dcp_state_add_value(st, NULL, grp);
        rc = rc ? rc : dcp_state_pop(st);
        rc = rc ? rc : dcp_state_pop(st);
        rc = rc ? rc : dcp_state_pop(st);
    }
    rc = rc ? rc : dcp_state_add_value(st, "trainer", dcp_value_int(42));
    rc = rc ? rc : dcp_save(ctx, st, dir, NULL);
    dcp_state_free(st);
    return rc;
}

TEST(by_hand_layout_loads_and_bad_steps_and_flags)
{
    const char *dir = dirpath("hand");
    struct target t;
    dcp_ctx *ctx;
    int twist;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    /* The layout itself (foreach True, which is not compared) loads. */
    ASSERT_OK(save_by_hand(ctx, dir, 0));
    target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
    ASSERT_OK(dcp_sd_load(ctx, t.sd, t.st, dir, NULL, 0));
    ASSERT_EQ(dcp_sd_step(t.sd), 7);
    ASSERT(t.w[0] == 1.0f && t.w[12] == 1.0f && t.m[13] == 1.25f);
    target_free(&t);
    for (twist = 1; twist <= 4; twist++) {
        static const char *const want[5] = {
            "",
            "'optim.state.emb.step': step 6, but "
            "'optim.state.fc1.weight.step' has 7",
            "'optim.state.fc1.weight.step': saved 2.5, not a step count",
            "'optim.param_groups.0.amsgrad': saved True, expected False",
            "'optim.param_groups.0.decoupled_weight_decay': saved False, "
            "expected True"};
        ASSERT_OK(save_by_hand(ctx, dir, twist));
        target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
        ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dir, NULL, DCP_SD_LOAD_HPARAMS),
                  DCP_EMISMATCH);
        ASSERT_MSG(ctx, want[twist]);
        ASSERT(target_untouched(&t));
        target_free(&t);
    }
    /* No sd entry in the state; no checkpoint. */
    target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
    {
        dcp_state *other;
        ASSERT_OK(dcp_state_create(&other));
        ASSERT_RC(dcp_sd_load(ctx, t.sd, other, dir, NULL, 0), DCP_EINVAL);
        dcp_state_free(other);
    }
    ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dirpath("nothing"), NULL, 0),
              DCP_ENOENT);
    ASSERT_RC(dcp_sd_load(NULL, t.sd, t.st, dir, NULL, 0), DCP_EINVAL);
    ASSERT(target_untouched(&t));
    target_free(&t);
    dcp_ctx_free(ctx);
}

TEST(async_save_and_schedule)
{
    const char *dir = dirpath("async");
    float w[NUMEL], m[NUMEL], v[NUMEL];
    dcp_sd *sd = make_sd(NPARAM, DCP_F32, NULL);
    struct target t;
    dcp_state *st;
    dcp_request *req;
    dcp_adamw hp;
    dcp_ctx *ctx;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    fill(w, NUMEL, 1.0f);
    fill(m, NUMEL, -2.0f);
    fill(v, NUMEL, 0.5f);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_sd_bind_model(sd, 0, NUMEL, w));
    ASSERT_OK(dcp_sd_bind_optim(sd, 0, NUMEL, m, v));
    ASSERT_OK(dcp_sd_add_to_state(sd, st, "model", "optim"));
    ASSERT_OK(dcp_state_add_value(st, "trainer", dcp_value_int(42)));
    hp.struct_size = sizeof(hp);
    ASSERT_OK(dcp_sd_hparams(sd, 0, &hp));
    hp.lr = 5e-4; /* a schedule moved it */
    ASSERT_OK(dcp_sd_set_hparams(sd, 0, &hp));
    ASSERT_OK(dcp_sd_set_step(sd, 7));
    ASSERT_OK(dcp_save_async(ctx, st, dir, NULL, &req));
    /* Training goes on while the save is written. */
    memset(w, 0, sizeof(w));
    memset(m, 0, sizeof(m));
    ASSERT_OK(dcp_sd_set_step(sd, 8));
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    target_make(&t, make_sd(NPARAM, DCP_F32, NULL));
    ASSERT_RC(dcp_sd_load(ctx, t.sd, t.st, dir, NULL, 0), DCP_EMISMATCH);
    ASSERT_MSG(ctx, "'optim.param_groups.0.lr': saved 0.0005");
    ASSERT_OK(dcp_sd_load(ctx, t.sd, t.st, dir, NULL, DCP_SD_LOAD_HPARAMS));
    fill(v, NUMEL, 1.0f);
    ASSERT_MEM_EQ(t.w, v, sizeof(v));
    fill(v, NUMEL, -2.0f);
    ASSERT_MEM_EQ(t.m, v, sizeof(v));
    ASSERT_EQ(dcp_sd_step(t.sd), 7);
    ASSERT_OK(dcp_sd_hparams(t.sd, 0, &hp));
    ASSERT(hp.lr == 5e-4);
    target_free(&t);
    dcp_state_free(st);
    dcp_sd_free(sd);
    dcp_ctx_free(ctx);
}

int main(void)
{
    RUN(range_boxes_every_range);
    RUN(range_boxes_shapes_and_bad_args);
    RUN(describe_and_bind);
    RUN(layout_is_torchs);
    RUN(load_any_slice);
    RUN(other_model_missing_and_extra);
    RUN(other_shapes_and_dtypes);
    RUN(other_hyperparameters);
    RUN(by_hand_layout_loads_and_bad_steps_and_flags);
    RUN(async_save_and_schedule);
    if (root[0]) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", root);
    }
    return TEST_SUMMARY();
}
