/*
 * Every dtype through dcp_save and dcp_load (public API): the 22 dtypes
 * round-trip bit-exact; a cast load converts as dcp_convert_elements; a
 * cast dcp cannot make (float4_e2m1fn_x2) is refused with DCP_ENOTSUP
 * naming the key, and the checkpoint's other keys still load.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define NDT 22

static char root[256];

static const char *dirpath(const char *name)
{
    static char buf[512];
    if (!root[0]) {
        strcpy(root, "/tmp/dcp-test-dtypes-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    snprintf(buf, sizeof(buf), "%s/%s", root, name);
    return buf;
}

static void pattern(unsigned char *b, size_t n, unsigned seed, int is_bool)
{
    size_t i;
    for (i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        b[i] = (unsigned char)(seed >> 16);
        if (is_bool)
            b[i] &= 1;
    }
}

static unsigned char *src[NDT + 1];
static const int64_t shape[2] = {3, 5};
#define N 15

/* Saves one tensor of every dtype, named after it, into "all". */
TEST(roundtrip_every_dtype)
{
    dcp_ctx *ctx;
    dcp_state *st, *st2;
    unsigned char *dst[NDT + 1];
    int dt;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_create(&st2));
    for (dt = 1; dt <= NDT; dt++) {
        size_t nb = N * dcp_dtype_size((dcp_dtype)dt);
        ASSERT(nb > 0);
        src[dt] = malloc(nb);
        dst[dt] = calloc(1, nb);
        pattern(src[dt], nb, (unsigned)dt, dt == DCP_BOOL);
        ASSERT_OK(dcp_state_add_tensor(st, dcp_dtype_name((dcp_dtype)dt),
                                       (dcp_dtype)dt, 2, shape, NULL, NULL,
                                       src[dt], DCP_MEM_HOST));
        ASSERT_OK(dcp_state_add_tensor(st2, dcp_dtype_name((dcp_dtype)dt),
                                       (dcp_dtype)dt, 2, shape, NULL, NULL,
                                       dst[dt], DCP_MEM_HOST));
    }
    ASSERT_OK(dcp_save(ctx, st, dirpath("all"), NULL));
    ASSERT_OK(dcp_load(ctx, st2, dirpath("all"), NULL));
    for (dt = 1; dt <= NDT; dt++) {
        ASSERT_MEM_EQ(src[dt], dst[dt], N * dcp_dtype_size((dcp_dtype)dt));
        free(dst[dt]);
    }
    dcp_state_free(st);
    dcp_state_free(st2);
    dcp_ctx_free(ctx);
}

/* Loads key (saved as dtype from) into a buffer of dtype to with
 * DCP_LOAD_CAST|DCP_LOAD_PARTIAL; returns the code. */
static int load_as(dcp_ctx *ctx, dcp_dtype from, dcp_dtype to, void *buf)
{
    dcp_state *st;
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_CAST | DCP_LOAD_PARTIAL, NULL};
    int rc;
    if (dcp_state_create(&st) != DCP_OK)
        return -1000;
    rc = dcp_state_add_tensor(st, dcp_dtype_name(from), to, 2, shape, NULL,
                              NULL, buf, DCP_MEM_HOST);
    if (rc == DCP_OK)
        rc = dcp_load(ctx, st, dirpath("all"), &lo);
    dcp_state_free(st);
    return rc;
}

TEST(cast_loads)
{
    dcp_ctx *ctx;
    unsigned char got[N * 16], want[N * 16];
    static const dcp_dtype pairs[][2] = {
        {DCP_C64, DCP_C128},         {DCP_C128, DCP_C32},
        {DCP_C64, DCP_F32},          {DCP_U64, DCP_F32},
        {DCP_I64, DCP_U16},          {DCP_F8_E8M0FNU, DCP_BF16},
        {DCP_F8_E4M3FNUZ, DCP_F16}, {DCP_F64, DCP_F8_E5M2FNUZ},
        {DCP_U32, DCP_C64},          {DCP_C32, DCP_BOOL},
    };
    size_t i;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    for (i = 0; i < sizeof(pairs) / sizeof(pairs[0]); i++) {
        dcp_dtype from = pairs[i][0], to = pairs[i][1];
        memset(got, 0xa5, sizeof(got));
        ASSERT_OK(load_as(ctx, from, to, got));
        ASSERT_OK(dcp_convert_elements(want, to, src[from], from, N));
        ASSERT_MEM_EQ(got, want, N * dcp_dtype_size(to));
    }
    dcp_ctx_free(ctx);
}

TEST(cast_refused_for_its_key_only)
{
    dcp_ctx *ctx;
    float f[N];
    unsigned char b[N];
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_RC(load_as(ctx, DCP_F4_E2M1FN_X2, DCP_F32, f), DCP_ENOTSUP);
    ASSERT(strstr(dcp_errmsg(ctx), "'float4_e2m1fn_x2'") != NULL);
    ASSERT_RC(load_as(ctx, DCP_U8, DCP_F4_E2M1FN_X2, b), DCP_ENOTSUP);
    ASSERT(strstr(dcp_errmsg(ctx), "'uint8'") != NULL);
    /* the same checkpoint: other keys, and float4 as itself */
    ASSERT_OK(load_as(ctx, DCP_C64, DCP_F32, f));
    ASSERT_OK(load_as(ctx, DCP_F4_E2M1FN_X2, DCP_F4_E2M1FN_X2, b));
    ASSERT_MEM_EQ(b, src[DCP_F4_E2M1FN_X2], N);
    dcp_ctx_free(ctx);
}

int main(void)
{
    int dt;
    RUN(roundtrip_every_dtype);
    RUN(cast_loads);
    RUN(cast_refused_for_its_key_only);
    for (dt = 1; dt <= NDT; dt++)
        free(src[dt]);
    if (root[0]) {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "cannot remove %s\n", root);
    }
    return TEST_SUMMARY();
}
