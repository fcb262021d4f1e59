/*
 * Planners (dcp_planner.h), single process: the default planners write
 * byte-identical checkpoints to no planner; save-side rename, skip, cast
 * (bit-exact with dcp_convert_elements, i.e. torch's Tensor.to) and a user
 * transform; the global hook's view (writers), planner data stored and read
 * back, a veto; load-side rename (many state keys reading one stored key,
 * tensors and values), skip, post_load (and not on missing keys); every
 * hook's failure with its code and message, nothing committed and no
 * buffer changed.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>
#include <dcp/dcp_planner.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../ckptcmp.h"
#include "meta.h"
#include "test.h"

#define ROWS 4
#define COLS 6
#define NEL  (ROWS * COLS)

static char root[256];
static float w[NEL];
static double b2[3];

static const char *sub(const char *name)
{
    static char b[2][512];
    static int k;
    struct stat sb;
    if (!root[0]) {
        strcpy(root, stat("/dev/shm", &sb) == 0 ? "/dev/shm/dcp-planner-XXXXXX"
                                                : "/tmp/dcp-planner-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    k ^= 1;
    snprintf(b[k], sizeof b[k], "%s/%s", root, name);
    return b[k];
}

/* {"model": {"w": f32[4,6], "b": f64[3]}, "tmp": 7, "step": 5} */
static dcp_state *make(void)
{
    dcp_state *st = NULL;
    int64_t shape[2] = {ROWS, COLS}, s1[1] = {3};
    if (dcp_state_create(&st) || dcp_state_push(st, "model") ||
        dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, NULL, NULL, w,
                             DCP_MEM_HOST) ||
        dcp_state_add_tensor(st, "b", DCP_F64, 1, s1, NULL, NULL, b2,
                             DCP_MEM_HOST) ||
        dcp_state_pop(st) || dcp_state_add_value(st, "tmp", dcp_value_int(7)) ||
        dcp_state_add_value(st, "step", dcp_value_int(5)))
        abort();
    return st;
}

static void fill(void)
{
    int i;
    /* Values that round differently to bf16: midpoints, tiny, huge. */
    for (i = 0; i < NEL; i++)
        w[i] = (float)(i - 11) * 1.00390625f + (i % 3 ? 1e-3f : 0.f);
    w[0] = 3.4e38f;
    w[1] = -0.0f;
    w[2] = 1.0f + 1.0f / 256.0f; /* a bf16 midpoint: ties to even */
    for (i = 0; i < 3; i++)
        b2[i] = 0.5 * i;
}

static int exists(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

TEST(default_planner_identical)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make();
    dcp_save_options so = {sizeof(so), 1, 0, NULL};
    dcp_load_options lo = {sizeof(lo), 0, NULL};
    float back[NEL];
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    fill();
    ASSERT_OK(dcp_save(ctx, st, sub("d-none"), &so));
    so.planner = dcp_default_save_planner();
    ASSERT_OK(dcp_save(ctx, st, sub("d-dflt"), &so));
    ASSERT(same_checkpoint(ctx, sub("d-none"), sub("d-dflt")));
    /* And a second save reuses the plan through the default planner. */
    ASSERT_OK(dcp_save(ctx, st, sub("d-dfl2"), &so));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 1);
    ASSERT(same_checkpoint(ctx, sub("d-none"), sub("d-dfl2")));
    memcpy(back, w, sizeof w);
    memset(w, 0, sizeof w);
    lo.planner = dcp_default_load_planner();
    ASSERT_OK(dcp_load(ctx, st, sub("d-dflt"), &lo));
    ASSERT(!memcmp(back, w, sizeof w));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* ---------------------------------------------------------- save side */

static int save_item(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    if (!strcmp(it->key, "tmp"))
        return dcp_plan_skip(d);
    if (!strcmp(it->key, "model.w")) {
        int rc = dcp_plan_rename(d, "m.w");
        return rc ? rc : dcp_plan_cast(d, DCP_BF16);
    }
    return 0;
}

TEST(save_rename_skip_cast)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make();
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, NULL, save_item, NULL};
    dcp_save_options so = {sizeof(so), 1, 0, &p};
    dcp_metadata *md = NULL;
    dcp_entry_info info;
    uint16_t want[NEL], got[NEL];
    float orig[NEL];
    const char *s;
    int64_t num;
    long i;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    fill();
    memcpy(orig, w, sizeof w);
    ASSERT_OK(dcp_save(ctx, st, sub("s-cast"), &so));
    ASSERT(!memcmp(orig, w, sizeof w)); /* the caller's buffer untouched */
    ASSERT_OK(dcp_metadata_open(ctx, sub("s-cast"), &md));
    ASSERT_EQ(dcp_metadata_count(md), 3);
    ASSERT_EQ(dcp_metadata_find(md, "tmp"), -1);
    ASSERT_EQ(dcp_metadata_find(md, "model.w"), -1);
    i = dcp_metadata_find(md, "m.w");
    ASSERT(i >= 0);
    ASSERT_OK(dcp_metadata_entry(md, (size_t)i, &info));
    ASSERT_EQ(info.dtype, DCP_BF16);
    ASSERT_EQ(info.npath, 1);
    ASSERT_OK(dcp_metadata_path(md, (size_t)i, 0, &s, &num));
    ASSERT(s && !strcmp(s, "m.w"));
    /* Stored bytes: exactly the conversion torch's Tensor.to makes. */
    ASSERT_OK(dcp_convert_elements(want, DCP_BF16, w, DCP_F32, NEL));
    ASSERT_OK(dcp_metadata_read_box(ctx, md, (size_t)i, NULL, NULL, got,
                                    sizeof got, 1));
    ASSERT(!memcmp(want, got, sizeof got));
    /* Other entries keep their paths. */
    i = dcp_metadata_find(md, "model.b");
    ASSERT(i >= 0);
    ASSERT_OK(dcp_metadata_entry(md, (size_t)i, &info));
    ASSERT_EQ(info.npath, 2);
    dcp_metadata_free(md);
    /* The same through dcp_save_async: the copy is made during the call. */
    {
        dcp_request *req = NULL;
        ASSERT_OK(dcp_save_async(ctx, st, sub("s-casa"), &so, &req));
        memset(w, 0x7f, sizeof w);
        ASSERT_OK(dcp_request_wait(req));
        dcp_request_free(req);
        memcpy(w, orig, sizeof w);
        ASSERT_OK(dcp_metadata_open(ctx, sub("s-casa"), &md));
        i = dcp_metadata_find(md, "m.w");
        ASSERT(i >= 0);
        ASSERT_OK(dcp_metadata_read_box(ctx, md, (size_t)i, NULL, NULL, got,
                                        sizeof got, 1));
        ASSERT(!memcmp(want, got, sizeof got));
        dcp_metadata_free(md);
    }
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

static int twice_f64(void *ud, const dcp_plan_item *it, size_t box,
                     const int64_t *off, const int64_t *sz, const void *src,
                     void *dst, size_t n)
{
    const float *s = src;
    double *d = dst;
    size_t i;
    (void)ud;
    (void)box;
    (void)off;
    (void)sz;
    if (it->dtype != DCP_F32)
        return DCP_EINVAL;
    for (i = 0; i < n; i++)
        d[i] = 2.0 * s[i];
    return 0;
}

static int xform_item(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    return strcmp(it->key, "model.w")
               ? 0
               : dcp_plan_transform(d, DCP_F64, twice_f64, NULL);
}

TEST(save_transform)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make();
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, NULL, xform_item, NULL};
    dcp_save_options so = {sizeof(so), 1, 0, &p};
    dcp_metadata *md = NULL;
    double got[NEL];
    long i;
    int k;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    fill();
    ASSERT_OK(dcp_save(ctx, st, sub("s-xf"), &so));
    ASSERT_OK(dcp_metadata_open(ctx, sub("s-xf"), &md));
    i = dcp_metadata_find(md, "model.w");
    ASSERT(i >= 0);
    ASSERT_OK(dcp_metadata_read_box(ctx, md, (size_t)i, NULL, NULL, got,
                                    sizeof got, 1));
    for (k = 0; k < NEL; k++)
        ASSERT(got[k] == 2.0 * w[k]);
    dcp_metadata_free(md);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

static int fail_item(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    if (strcmp(it->key, "step"))
        return 0;
    dcp_plan_error(d, "no steps here");
    return DCP_EKEY;
}

static int bad_cast_item(void *ud, const dcp_plan_item *it,
                         dcp_plan_decision *d)
{
    (void)ud;
    return it->is_tensor ? 0 : dcp_plan_cast(d, DCP_BF16); /* a value */
}

TEST(save_hook_failure)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make();
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, NULL, fail_item, NULL};
    dcp_save_options so = {sizeof(so), 1, 0, &p};
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    fill();
    ASSERT_EQ(dcp_save(ctx, st, sub("s-fail"), &so), DCP_EKEY);
    ASSERT(
        strstr(dcp_errmsg(ctx), "save planner on key 'step': no steps here"));
    ASSERT(!exists(sub("s-fail"), ".metadata"));
    p.item = bad_cast_item;
    ASSERT_EQ(dcp_save(ctx, st, sub("s-fail"), &so), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "key 'tmp'"));
    ASSERT(!exists(sub("s-fail"), ".metadata"));
    p.version = 0;
    p.item = save_item;
    ASSERT_EQ(dcp_save(ctx, st, sub("s-fail"), &so), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "DCP_PLANNER_VERSION"));
    ASSERT(!exists(sub("s-fail"), ".metadata"));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

static int collide_item(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    return strcmp(it->key, "tmp") ? 0 : dcp_plan_rename(d, "step");
}

TEST(save_rename_collision)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make();
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, NULL, collide_item, NULL};
    dcp_save_options so = {sizeof(so), 1, 0, &p};
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_EQ(dcp_save(ctx, st, sub("s-coll"), &so), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "'step'"));
    ASSERT(!exists(sub("s-coll"), ".metadata"));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* ------------------------------------------------------- global hook */

struct gseen {
    size_t n;
    int writer;
    int veto;
};

static int global_hook(void *ud, dcp_global_plan *gp)
{
    struct gseen *g = ud;
    const dcp_metadata *md = dcp_global_plan_metadata(gp);
    long i = dcp_metadata_find(md, "model.w");
    dcp_value *v;
    g->n = dcp_metadata_count(md);
    g->writer = i >= 0 ? dcp_global_plan_writer(gp, (size_t)i, 0) : -2;
    if (dcp_global_plan_writer(gp, 99, 0) != -1)
        return DCP_EINVAL;
    if (g->veto) {
        dcp_global_plan_error(gp, "vetoed by the test");
        return 1;
    }
    v = dcp_value_dict();
    if (!v ||
        dcp_value_dict_set(v, "note", dcp_value_str("fp32 master")) != DCP_OK)
        return DCP_ENOMEM;
    return i >= 0 ? dcp_global_plan_set_data(gp, (size_t)i, v) : DCP_EINVAL;
}

TEST(global_hook)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make();
    struct gseen g = {0, -3, 0};
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, &g, NULL, global_hook};
    dcp_save_options so = {sizeof(so), 1, 0, &p};
    dcp_metadata *md = NULL;
    const dcp_value *pd, *note;
    long i;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    fill();
    ASSERT_OK(dcp_save(ctx, st, sub("g-data"), &so));
    ASSERT_EQ(g.n, 4);
    ASSERT_EQ(g.writer, 0);
    ASSERT_OK(dcp_metadata_open(ctx, sub("g-data"), &md));
    i = dcp_metadata_find(md, "model.w");
    ASSERT(i >= 0);
    pd = dcp_metadata_planner_data(md, (size_t)i);
    ASSERT(pd && dcp_value_type_of(pd) == DCP_VALUE_DICT);
    note = dcp_value_dict_get(pd, "note");
    ASSERT(note && !strcmp(dcp_value_as_str(note, NULL), "fp32 master"));
    ASSERT(
        !dcp_metadata_planner_data(md, (size_t)dcp_metadata_find(md, "step")));
    dcp_metadata_free(md);
    /* The data does not disturb a load; a second save plans afresh. */
    ASSERT_OK(dcp_load(ctx, st, sub("g-data"), NULL));
    ASSERT_OK(dcp_save(ctx, st, sub("g-data"), &so));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 0);
    /* A veto: nothing committed, the previous checkpoint intact. */
    g.veto = 1;
    ASSERT_EQ(dcp_save(ctx, st, sub("g-veto"), &so), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "vetoed by the test"));
    ASSERT(!exists(sub("g-veto"), ".metadata"));
    ASSERT(!exists(sub("g-veto"), "__0_0.distcp"));
    ASSERT_OK(dcp_verify(ctx, sub("g-data")));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* ---------------------------------------------------------- load side */

static int load_item(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    if (!strcmp(it->key, "new.w") || !strcmp(it->key, "copy.w"))
        return dcp_plan_rename(d, "model.w");
    if (!strcmp(it->key, "s1") || !strcmp(it->key, "s2"))
        return dcp_plan_rename(d, "step");
    if (!strcmp(it->key, "junk"))
        return dcp_plan_skip(d);
    return 0;
}

static int post_count;

static int post_scale(void *ud, const dcp_plan_item *it, size_t box,
                      const int64_t *off, const int64_t *sz,
                      const int64_t *strides, void *buf)
{
    (void)strides;
    float *f = buf;
    size_t i, n = (size_t)(sz[0] * sz[1]);
    (void)ud;
    (void)off;
    if (box != 0 || it->dtype != DCP_F32 || it->ndim != 2)
        return DCP_EINVAL;
    post_count++;
    if (!strcmp(it->key, "copy.w"))
        for (i = 0; i < n; i++)
            f[i] *= 2.0f;
    return 0;
}

TEST(load_rename_many_to_one)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make(), *ld = NULL;
    dcp_load_planner p = {DCP_PLANNER_VERSION, 0, NULL, load_item, post_scale};
    dcp_load_options lo = {sizeof(lo), 0, &p};
    float a[NEL], c[NEL], junk[NEL];
    int64_t shape[2] = {ROWS, COLS};
    int k;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    fill();
    ASSERT_OK(dcp_save(ctx, st, sub("l-src"), NULL));
    memset(a, 0, sizeof a);
    memset(c, 0, sizeof c);
    memset(junk, 0x55, sizeof junk);
    ASSERT_OK(dcp_state_create(&ld));
    ASSERT_OK(dcp_state_add_tensor(ld, "new.w", DCP_F32, 2, shape, NULL, NULL,
                                   a, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(ld, "copy.w", DCP_F32, 2, shape, NULL, NULL,
                                   c, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(ld, "junk", DCP_F32, 2, shape, NULL, NULL,
                                   junk, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_value(ld, "s1", dcp_value_int(0)));
    ASSERT_OK(dcp_state_add_value(ld, "s2", dcp_value_int(0)));
    post_count = 0;
    /* Unexpected keys (model.b, tmp) allowed. */
    lo.flags = DCP_LOAD_ALLOW_UNEXPECTED;
    ASSERT_OK(dcp_load(ctx, ld, sub("l-src"), &lo));
    ASSERT(!memcmp(a, w, sizeof a));
    for (k = 0; k < NEL; k++)
        ASSERT(c[k] == 2.0f * w[k]);
    for (k = 0; k < NEL; k++)
        ASSERT(((unsigned char *)junk)[k] == 0x55);
    ASSERT_EQ(post_count, 2); /* new.w, copy.w; not the skipped junk */
    ASSERT_EQ(dcp_value_as_int(dcp_state_value(ld, "s1")), 5);
    ASSERT_EQ(dcp_value_as_int(dcp_state_value(ld, "s2")), 5);
    dcp_state_free(ld);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

static int post_fail(void *ud, const dcp_plan_item *it, size_t box,
                     const int64_t *off, const int64_t *sz,
                     const int64_t *strides, void *buf)
{
    (void)strides;
    (void)ud;
    (void)box;
    (void)off;
    (void)sz;
    (void)buf;
    post_count++;
    return strcmp(it->key, "model.b") ? 0 : DCP_ECORRUPT;
}

TEST(load_post_failure_and_missing)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make(), *ld = NULL;
    dcp_load_planner p = {DCP_PLANNER_VERSION, 0, NULL, NULL, post_fail};
    dcp_load_options lo = {sizeof(lo), 0, &p};
    float extra[2];
    int64_t s2[1] = {2};
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    fill();
    ASSERT_OK(dcp_save(ctx, st, sub("p-src"), NULL));
    post_count = 0;
    ASSERT_EQ(dcp_load(ctx, st, sub("p-src"), &lo), DCP_ECORRUPT);
    ASSERT(strstr(dcp_errmsg(ctx), "post_load on key 'model.b'"));
    /* A missing key (DCP_LOAD_PARTIAL) gets no post_load call. */
    ASSERT_OK(dcp_state_create(&ld));
    ASSERT_OK(dcp_state_add_tensor(ld, "absent", DCP_F32, 1, s2, NULL, NULL,
                                   extra, DCP_MEM_HOST));
    lo.flags = DCP_LOAD_PARTIAL;
    post_count = 0;
    ASSERT_OK(dcp_load(ctx, ld, sub("p-src"), &lo));
    ASSERT_EQ(post_count, 0);
    ASSERT_EQ(dcp_load_report(ctx, 0, NULL), 1);
    dcp_state_free(ld);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

static int load_conflict(void *ud, const dcp_plan_item *it,
                         dcp_plan_decision *d)
{
    (void)ud;
    return strcmp(it->key, "model.b") ? 0 : dcp_plan_rename(d, "model.w");
}

static int load_conflict_first(void *ud, const dcp_plan_item *it,
                               dcp_plan_decision *d)
{
    (void)ud;
    return strcmp(it->key, "model.w") ? 0 : dcp_plan_rename(d, "model.b");
}

static int load_fails(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    if (strcmp(it->key, "model.w"))
        return 0;
    dcp_plan_error(d, "nope");
    return DCP_EKEY;
}

static int load_casts(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    return it->is_tensor ? dcp_plan_cast(d, DCP_BF16) : 0;
}

TEST(load_rename_conflict)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make();
    dcp_load_planner p = {DCP_PLANNER_VERSION, 0, NULL, load_conflict, NULL};
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, &p};
    double keep[3];
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    fill();
    ASSERT_OK(dcp_save(ctx, st, sub("c-src"), NULL));
    memcpy(keep, b2, sizeof b2);
    ASSERT_EQ(dcp_load(ctx, st, sub("c-src"), &lo), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "stored key 'model.w'"));
    ASSERT(!memcmp(keep, b2, sizeof b2));
    /* The first reader renamed (model.w read from model.b): the message
     * names the two state keys, not the stored key twice. */
    p.item = load_conflict_first;
    ASSERT_EQ(dcp_load(ctx, st, sub("c-src"), &lo), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "keys 'model.w' and 'model.b' both read "
                                   "stored key 'model.b'"));
    p.item = load_conflict;
    /* A failing load item hook, and a cast asked of a load decision:
     * refused before anything is read, every buffer as it was. */
    {
        float wkeep[NEL];
        memset(w, 0x33, sizeof w);
        memcpy(wkeep, w, sizeof w);
        p.item = load_fails;
        ASSERT_EQ(dcp_load(ctx, st, sub("c-src"), &lo), DCP_EKEY);
        ASSERT(strstr(dcp_errmsg(ctx), "load planner on key 'model.w': nope"));
        ASSERT(!memcmp(wkeep, w, sizeof w));
        p.item = load_casts;
        ASSERT_EQ(dcp_load(ctx, st, sub("c-src"), &lo), DCP_EINVAL);
        ASSERT(!memcmp(wkeep, w, sizeof w));
    }
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

int main(void)
{
    char cmd[600];
    RUN(default_planner_identical);
    RUN(save_rename_skip_cast);
    RUN(save_transform);
    RUN(save_hook_failure);
    RUN(save_rename_collision);
    RUN(global_hook);
    RUN(load_rename_many_to_one);
    RUN(load_post_failure_and_missing);
    RUN(load_rename_conflict);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (root[0] && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return TEST_SUMMARY();
}
