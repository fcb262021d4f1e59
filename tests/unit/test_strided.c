/*
 * Strided boxes (dcp_state_add_tensor_strided), single process: the
 * interior of 2-D and 3-D blocks with ghost cells saved without packing
 * (sync, async, with a staging budget that cuts pieces inside rows and
 * elements), byte-identical to a save of the packed copy; loaded into
 * another ghost layout, a contiguous buffer, a sub-box, with a cast,
 * through a planner's cast and through dcp_load_file — ghost cells never
 * touched; a last-dimension stride other than 1; bad strides refused.
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
#include "test.h"

/* 2-D: a 64 x 48 interior inside 66 x 50 (one ghost layer). */
#define R    64
#define C    48
#define G    1
#define RW   (R + 2 * G)
#define CW   (C + 2 * G)
#define SENT 0x7fc0dead /* a NaN pattern in the ghost cells */

static char root[256];

static const char *sub(const char *name)
{
    static char b[2][512];
    static int k;
    struct stat sb;
    if (!root[0]) {
        strcpy(root, stat("/dev/shm", &sb) == 0 ? "/dev/shm/dcp-strided-XXXXXX"
                                                : "/tmp/dcp-strided-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    k ^= 1;
    snprintf(b[k], sizeof b[k], "%s/%s", root, name);
    return b[k];
}

static float val(int64_t i, int64_t j)
{
    return (float)(i * 1000 + j) + 0.25f;
}

/* A ghosted block (rw x cw, ghost g) with interior (i, j) = val(i, j) and
 * the sentinel in the ghost cells. */
static uint32_t *ghosted(int64_t rw, int64_t cw, int64_t g)
{
    uint32_t *a = malloc((size_t)(rw * cw) * 4);
    int64_t i, j;
    if (!a)
        abort();
    for (i = 0; i < rw; i++)
        for (j = 0; j < cw; j++) {
            int in = i >= g && i < rw - g && j >= g && j < cw - g;
            float v = val(i - g, j - g);
            if (in)
                memcpy(&a[i * cw + j], &v, 4);
            else
                a[i * cw + j] = SENT;
        }
    return a;
}

/* Whether the interior of a ghosted block holds val() exactly (offset by
 * (oi, oj) in the global tensor) and every ghost cell the sentinel. */
static int check_ghosted(const uint32_t *a, int64_t rw, int64_t cw, int64_t g,
                         int64_t oi, int64_t oj)
{
    int64_t i, j;
    for (i = 0; i < rw; i++)
        for (j = 0; j < cw; j++) {
            int in = i >= g && i < rw - g && j >= g && j < cw - g;
            float v = val(i - g + oi, j - g + oj);
            uint32_t want;
            memcpy(&want, &v, 4);
            if (a[i * cw + j] != (in ? want : (uint32_t)SENT))
                return 0;
        }
    return 1;
}

static dcp_state *strided_state(uint32_t *a, int64_t g, int64_t cw)
{
    dcp_state *st = NULL;
    int64_t shape[2] = {R, C}, strides[2] = {cw, 1};
    if (dcp_state_create(&st) ||
        dcp_state_add_tensor_strided(st, "u", DCP_F32, 2, shape, NULL, NULL,
                                     strides, a + g * cw + g, DCP_MEM_HOST) ||
        dcp_state_add_value(st, "t", dcp_value_int(1)))
        abort();
    return st;
}

static dcp_state *packed_state(float *p)
{
    dcp_state *st = NULL;
    int64_t shape[2] = {R, C};
    if (dcp_state_create(&st) ||
        dcp_state_add_tensor(st, "u", DCP_F32, 2, shape, NULL, NULL, p,
                             DCP_MEM_HOST) ||
        dcp_state_add_value(st, "t", dcp_value_int(1)))
        abort();
    return st;
}

static float *packed(void)
{
    float *p = malloc(R * C * 4);
    int64_t i, j;
    if (!p)
        abort();
    for (i = 0; i < R; i++)
        for (j = 0; j < C; j++)
            p[i * C + j] = val(i, j);
    return p;
}

TEST(save_identical_to_packed)
{
    dcp_ctx *ctx = NULL, *small = NULL;
    dcp_ctx_options co;
    uint32_t *a = ghosted(RW, CW, G);
    float *p = packed();
    dcp_state *ss = strided_state(a, G, CW), *ps = packed_state(p);
    dcp_save_options so = {sizeof(so), 1, 0, NULL};
    dcp_request *req = NULL;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_save(ctx, ps, sub("packed"), &so));
    ASSERT_OK(dcp_save(ctx, ss, sub("stride"), &so));
    ASSERT(same_checkpoint(ctx, sub("packed"), sub("stride")));
    /* Async: the state may change once the call returned. */
    ASSERT_OK(dcp_save_async(ctx, ss, sub("strida"), &so, &req));
    memset(a, 0, (size_t)(RW * CW) * 4);
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    ASSERT(same_checkpoint(ctx, sub("packed"), sub("strida")));
    free(a);
    a = ghosted(RW, CW, G);
    dcp_state_free(ss);
    ss = strided_state(a, G, CW);
    ASSERT(check_ghosted(a, RW, CW, G, 0, 0)); /* never written */
    /* A staging budget (64 KiB, the least) below a 300 x 301 field: the
     * pieces end inside rows, each gathered from its offset. */
    {
        enum { BR = 300, BC = 301 };
        int64_t bshape[2] = {BR, BC}, bstr[2] = {BC + 2, 1}, i, j;
        uint32_t *big = malloc(sizeof(uint32_t) * (BR + 2) * (BC + 2));
        uint32_t *bp = malloc(sizeof(uint32_t) * BR * BC);
        dcp_state *bs = NULL, *bq = NULL;
        ASSERT(big && bp);
        for (i = 0; i < (BR + 2) * (BC + 2); i++)
            big[i] = SENT;
        for (i = 0; i < BR; i++)
            for (j = 0; j < BC; j++)
                big[(i + 1) * (BC + 2) + j + 1] = bp[i * BC + j] =
                    (uint32_t)(i * 7919 + j);
        memset(&co, 0, sizeof(co));
        co.struct_size = sizeof(co);
        co.staging_budget = 65536;
        ASSERT_OK(dcp_ctx_create(&small, NULL, &co));
        ASSERT_OK(dcp_state_create(&bs));
        ASSERT_OK(dcp_state_add_tensor_strided(bs, "u", DCP_U32, 2, bshape,
                                               NULL, NULL, bstr, big + BC + 3,
                                               DCP_MEM_HOST));
        ASSERT_OK(dcp_state_create(&bq));
        ASSERT_OK(dcp_state_add_tensor(bq, "u", DCP_U32, 2, bshape, NULL, NULL,
                                       bp, DCP_MEM_HOST));
        ASSERT_OK(dcp_save(small, bs, sub("bigst"), &so));
        ASSERT_OK(dcp_save(ctx, bq, sub("bigpk"), &so));
        ASSERT(same_checkpoint(ctx, sub("bigpk"), sub("bigst")));
        ASSERT_OK(dcp_save_async(small, bs, sub("bigsa"), &so, &req));
        ASSERT_OK(dcp_request_wait(req));
        dcp_request_free(req);
        ASSERT(same_checkpoint(ctx, sub("bigpk"), sub("bigsa")));
        dcp_state_free(bs);
        dcp_state_free(bq);
        dcp_ctx_free(small);
        free(big);
        free(bp);
    }
    dcp_state_free(ss);
    dcp_state_free(ps);
    dcp_ctx_free(ctx);
    free(a);
    free(p);
}

TEST(load_into_ghost_layouts)
{
    dcp_ctx *ctx = NULL;
    float *p = packed(), *flat = calloc(R * C, 4);
    dcp_state *ps = packed_state(p), *st = NULL;
    /* Two ghost layers this time, a wider row. */
    int64_t g2 = 2, rw2 = R + 4, cw2 = C + 7;
    uint32_t *b = malloc((size_t)(rw2 * cw2) * 4);
    int64_t shape[2] = {R, C}, strides[2] = {cw2, 1};
    int64_t i, j;
    ASSERT(flat && b);
    for (i = 0; i < rw2 * cw2; i++)
        b[i] = SENT;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_save(ctx, ps, sub("src"), NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor_strided(st, "u", DCP_F32, 2, shape, NULL,
                                           NULL, strides, b + g2 * cw2 + g2,
                                           DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_value(st, "t", dcp_value_int(0)));
    ASSERT_OK(dcp_load(ctx, st, sub("src"), NULL));
    for (i = 0; i < rw2; i++)
        for (j = 0; j < cw2; j++) {
            int in = i >= g2 && i < g2 + R && j >= g2 && j < g2 + C;
            float v = val(i - g2, j - g2);
            uint32_t want;
            memcpy(&want, &v, 4);
            ASSERT_EQ(b[i * cw2 + j], in ? want : (uint32_t)SENT);
        }
    dcp_state_free(st);
    /* A saved strided checkpoint loads packed too. */
    {
        uint32_t *a = ghosted(RW, CW, G);
        dcp_state *ss = strided_state(a, G, CW);
        ASSERT_OK(dcp_save(ctx, ss, sub("src2"), NULL));
        ASSERT_OK(dcp_state_create(&st));
        ASSERT_OK(dcp_state_add_tensor(st, "u", DCP_F32, 2, shape, NULL, NULL,
                                       flat, DCP_MEM_HOST));
        ASSERT_OK(dcp_state_add_value(st, "t", dcp_value_int(0)));
        ASSERT_OK(dcp_load(ctx, st, sub("src2"), NULL));
        ASSERT(!memcmp(flat, p, R * C * 4));
        dcp_state_free(st);
        dcp_state_free(ss);
        free(a);
    }
    dcp_state_free(ps);
    dcp_ctx_free(ctx);
    free(b);
    free(flat);
    free(p);
}

/* Two strided boxes of one tensor on one rank (the top and bottom halves
 * of a sub-box), a cast on load, the boxes in a ghosted double array. */
TEST(load_subboxes_cast)
{
    dcp_ctx *ctx = NULL;
    float *p = packed();
    dcp_state *ps = packed_state(p), *st = NULL;
    int64_t shape[2] = {R, C}, o1[2] = {10, 5}, o2[2] = {30, 5};
    int64_t sz[2] = {20, 35}, cw = 40, strides[2] = {cw, 1};
    double *d = malloc(sizeof(double) * 2 * 22 * 40);
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_CAST | DCP_LOAD_PARTIAL, NULL};
    int64_t i, j, k;
    ASSERT(d);
    for (i = 0; i < 2 * 22 * 40; i++)
        d[i] = -1.0;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_save(ctx, ps, sub("cast"), NULL));
    ASSERT_OK(dcp_state_create(&st));
    /* Box k at rows 1..20 of slab k (22 x 40 doubles), columns 2..36. */
    ASSERT_OK(dcp_state_add_tensor_strided(st, "u", DCP_F64, 2, shape, o1, sz,
                                           strides, d + 1 * cw + 2,
                                           DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor_strided(st, "u", DCP_F64, 2, shape, o2, sz,
                                           strides, d + 22 * 40 + cw + 2,
                                           DCP_MEM_HOST));
    ASSERT_OK(dcp_load(ctx, st, sub("cast"), &lo));
    for (k = 0; k < 2; k++)
        for (i = 0; i < 22; i++)
            for (j = 0; j < 40; j++) {
                double got = d[k * 22 * 40 + i * 40 + j];
                int in = i >= 1 && i < 21 && j >= 2 && j < 37;
                double want =
                    in ? (double)val((k ? 30 : 10) + i - 1, 5 + j - 2) : -1.0;
                ASSERT(got == want);
            }
    dcp_state_free(st);
    dcp_state_free(ps);
    dcp_ctx_free(ctx);
    free(d);
    free(p);
}

/* 3-D, ghost cells on every side, and a last-dimension stride of 2 (every
 * other element: gathered and scattered one element at a time). */
TEST(three_d_and_inner_stride)
{
    enum { X = 6, Y = 7, Z = 9 };
    dcp_ctx *ctx = NULL;
    int64_t shape[3] = {X, Y, Z};
    int64_t s3[3] = {(Y + 2) * (Z + 2), Z + 2, 1};
    int64_t s2[3] = {Y * Z * 2, Z * 2, 2};
    int32_t *a = malloc(sizeof(int32_t) * (X + 2) * (Y + 2) * (Z + 2));
    int32_t *b = malloc(sizeof(int32_t) * X * Y * Z * 2);
    int32_t *flat = malloc(sizeof(int32_t) * X * Y * Z);
    dcp_state *st = NULL;
    int64_t i, j, k, n;
    ASSERT(a && b && flat);
    for (n = 0; n < (X + 2) * (Y + 2) * (Z + 2); n++)
        a[n] = -7;
    for (i = 0; i < X; i++)
        for (j = 0; j < Y; j++)
            for (k = 0; k < Z; k++) {
                a[(i + 1) * s3[0] + (j + 1) * s3[1] + (k + 1)] =
                    (int32_t)(i * 10000 + j * 100 + k);
                flat[(i * Y + j) * Z + k] = (int32_t)(i * 10000 + j * 100 + k);
            }
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor_strided(st, "v", DCP_I32, 3, shape, NULL,
                                           NULL, s3, a + s3[0] + s3[1] + 1,
                                           DCP_MEM_HOST));
    ASSERT_OK(dcp_save(ctx, st, sub("three"), NULL));
    dcp_state_free(st);
    for (n = 0; n < X * Y * Z * 2; n++)
        b[n] = -9;
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor_strided(st, "v", DCP_I32, 3, shape, NULL,
                                           NULL, s2, b, DCP_MEM_HOST));
    ASSERT_OK(dcp_load(ctx, st, sub("three"), NULL));
    for (n = 0; n < X * Y * Z; n++) {
        ASSERT_EQ(b[2 * n], flat[n]);
        ASSERT_EQ(b[2 * n + 1], -9);
    }
    /* And saved from the every-other layout. */
    ASSERT_OK(dcp_save(ctx, st, sub("three2"), NULL));
    dcp_state_free(st);
    memset(a, 0, sizeof(int32_t) * (X + 2) * (Y + 2) * (Z + 2));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "v", DCP_I32, 3, shape, NULL, NULL, a,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_load(ctx, st, sub("three2"), NULL));
    ASSERT(!memcmp(a, flat, sizeof(int32_t) * X * Y * Z));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    free(a);
    free(b);
    free(flat);
}

static int to_bf16(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    return it->is_tensor ? dcp_plan_cast(d, DCP_BF16) : 0;
}

/* A planner's cast of a strided box equals the cast of the packed one;
 * dcp_load_file into a strided box. */
TEST(planner_cast_and_load_file)
{
    dcp_ctx *ctx = NULL;
    uint32_t *a = ghosted(RW, CW, G), *b = malloc((size_t)(RW * CW) * 4);
    float *p = packed();
    dcp_state *ss = strided_state(a, G, CW), *ps = packed_state(p), *st;
    dcp_save_planner pl = {DCP_PLANNER_VERSION, 0, NULL, to_bf16, NULL};
    dcp_save_options so = {sizeof(so), 1, 0, &pl};
    dcp_convert_options xo;
    int64_t shape[2] = {R, C}, strides[2] = {CW, 1};
    int64_t i;
    char out[600];
    ASSERT(b);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_save(ctx, ps, sub("bfpack"), &so));
    ASSERT_OK(dcp_save(ctx, ss, sub("bfstri"), &so));
    ASSERT(same_checkpoint(ctx, sub("bfpack"), sub("bfstri")));
    /* dcp_load_file: the packed checkpoint exported to safetensors. */
    memset(&xo, 0, sizeof(xo));
    xo.struct_size = sizeof(xo);
    snprintf(out, sizeof(out), "%s.safetensors", sub("export"));
    ASSERT_OK(dcp_export(ctx, sub("bfpack"), out, &xo, NULL));
    for (i = 0; i < RW * CW; i++)
        b[i] = SENT;
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor_strided(st, "u", DCP_F32, 2, shape, NULL,
                                           NULL, strides, b + G * CW + G,
                                           DCP_MEM_HOST));
    {
        dcp_load_options lo = {sizeof(lo), DCP_LOAD_CAST, NULL};
        int64_t r, c;
        ASSERT_OK(dcp_load_file(ctx, st, out, &lo));
        for (r = 0; r < RW; r++)
            for (c = 0; c < CW; c++) {
                int in = r >= G && r < RW - G && c >= G && c < CW - G;
                uint16_t h;
                uint32_t want = SENT;
                float v;
                if (in) { /* the bf16 copy, widened back */
                    v = val(r - G, c - G);
                    ASSERT_OK(
                        dcp_convert_elements(&h, DCP_BF16, &v, DCP_F32, 1));
                    ASSERT_OK(
                        dcp_convert_elements(&v, DCP_F32, &h, DCP_BF16, 1));
                    memcpy(&want, &v, 4);
                }
                ASSERT_EQ(b[r * CW + c], want);
            }
    }
    dcp_state_free(st);
    dcp_state_free(ss);
    dcp_state_free(ps);
    dcp_ctx_free(ctx);
    free(a);
    free(b);
    free(p);
}

TEST(bad_strides)
{
    dcp_state *st = NULL;
    float buf[64];
    int64_t shape[2] = {4, 4};
    int64_t alias[2] = {1, 1}, neg[2] = {-4, 1}, tight[2] = {3, 1};
    int64_t cols[2] = {1, 4}, ok1[2] = {4, 1}, huge[2] = {INT64_MAX / 2, 1};
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_EQ(dcp_state_add_tensor_strided(st, "a", DCP_F32, 2, shape, NULL,
                                           NULL, alias, buf, DCP_MEM_HOST),
              DCP_EINVAL);
    ASSERT_EQ(dcp_state_add_tensor_strided(st, "b", DCP_F32, 2, shape, NULL,
                                           NULL, neg, buf, DCP_MEM_HOST),
              DCP_EINVAL);
    ASSERT_EQ(dcp_state_add_tensor_strided(st, "c", DCP_F32, 2, shape, NULL,
                                           NULL, tight, buf, DCP_MEM_HOST),
              DCP_EINVAL);
    ASSERT_EQ(dcp_state_add_tensor_strided(st, "d", DCP_F32, 2, shape, NULL,
                                           NULL, huge, buf, DCP_MEM_HOST),
              DCP_EINVAL);
    ASSERT_EQ(dcp_state_add_tensor_strided(st, "e", DCP_F32, 2, shape, NULL,
                                           NULL, cols, buf, DCP_MEM_CUDA),
              DCP_ENOTSUP);
    /* Column-major (a transposed view) is fine; C strides are packed. */
    ASSERT_OK(dcp_state_add_tensor_strided(st, "f", DCP_F32, 2, shape, NULL,
                                           NULL, cols, buf, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor_strided(st, "g", DCP_F32, 2, shape, NULL,
                                           NULL, ok1, buf, DCP_MEM_CUDA));
    dcp_state_free(st);
}

int main(void)
{
    char cmd[600];
    RUN(save_identical_to_packed);
    RUN(load_into_ghost_layouts);
    RUN(load_subboxes_cast);
    RUN(three_d_and_inner_stride);
    RUN(planner_cast_and_load_file);
    RUN(bad_strides);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (root[0] && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return TEST_SUMMARY();
}
