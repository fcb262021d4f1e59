/*
 * Element conversion for DCP_LOAD_CAST, against references produced by
 * PyTorch 2.13 (Tensor.to from float64), embedded below.
 */
#include <math.h>
#include <string.h>

#include "dtype.h"
#include "test.h"

static const double cv_in[] = {0.0, -0.0, 1.0, -2.0, 0.1, 0.3333333333333333, 65504.0, 65520.0, 1e-07, 6e-08, 3e-05, 448.0, 464.0, 480.0, 1000000000.0, -1e-40, 1e-45, INFINITY, -INFINITY, 57344.0, 61440.0, 0.0009765625, 2.5, -1.75, 300.7, 0.007};
static const unsigned cv_f16[] = {0x0, 0x8000, 0x3c00, 0xc000, 0x2e66, 0x3555, 0x7bff, 0x7c00, 0x2, 0x1, 0x1f7, 0x5f00, 0x5f40, 0x5f80, 0x7c00, 0x8000, 0x0, 0x7c00, 0xfc00, 0x7b00, 0x7b80, 0x1400, 0x4100, 0xbf00, 0x5cb3, 0x1f2b};
static const unsigned cv_bf16[] = {0x0, 0x8000, 0x3f80, 0xc000, 0x3dcd, 0x3eab, 0x4780, 0x4780, 0x33d7, 0x3381, 0x37fc, 0x43e0, 0x43e8, 0x43f0, 0x4e6e, 0x8001, 0x0, 0x7f80, 0xff80, 0x4760, 0x4770, 0x3a80, 0x4020, 0xbfe0, 0x4396, 0x3be5};
static const unsigned cv_e4m3[] = {0x0, 0x80, 0x38, 0xc0, 0x1d, 0x2b, 0x7e, 0x7e, 0x0, 0x0, 0x0, 0x7e, 0x7e, 0x7e, 0x7e, 0x80, 0x0, 0x7e, 0xfe, 0x7e, 0x7e, 0x0, 0x42, 0xbe, 0x79, 0x4};
static const unsigned cv_e5m2[] = {0x0, 0x80, 0x3c, 0xc0, 0x2e, 0x35, 0x7c, 0x7c, 0x0, 0x0, 0x2, 0x5f, 0x5f, 0x60, 0x7c, 0x80, 0x0, 0x7c, 0xfc, 0x7b, 0x7c, 0x14, 0x41, 0xbf, 0x5d, 0x1f};
static const int8_t cv_i8[] = {0, 1, -2, 0, 0, -32, 0, -64, 44, 0};
static const int32_t cv_i32[] = {0, 1, -2, 0, 0, 65504, 0, 448, 300, 0};
static const int cv_int_idx[] = {0, 2, 3, 4, 5, 6, 9, 11, 24, 25};

#define NV (sizeof(cv_in) / sizeof(cv_in[0]))

static void check_small(dcp_dtype dt, const unsigned *want, int *bad)
{
    size_t i, sz = dcp_dtype_size(dt);
    for (i = 0; i < NV; i++) {
        uint8_t out[2] = {0, 0};
        unsigned got;
        dcp__convert(out, dt, &cv_in[i], DCP_F64, 1);
        got = sz == 2 ? (unsigned)(out[0] | (out[1] << 8)) : out[0];
        if (got != want[i]) {
            fprintf(stderr, "%s(%g): got 0x%x want 0x%x\n",
                    dcp_dtype_name(dt), cv_in[i], got, want[i]);
            (*bad)++;
        }
    }
}

TEST(floats_match_torch)
{
    int bad = 0;
    check_small(DCP_F16, cv_f16, &bad);
    check_small(DCP_BF16, cv_bf16, &bad);
    check_small(DCP_F8_E4M3FN, cv_e4m3, &bad);
    check_small(DCP_F8_E5M2, cv_e5m2, &bad);
    ASSERT_EQ(bad, 0);
}

TEST(ints_match_torch)
{
    size_t i;
    for (i = 0; i < sizeof(cv_int_idx) / sizeof(cv_int_idx[0]); i++) {
        int8_t a;
        int32_t b;
        dcp__convert(&a, DCP_I8, &cv_in[cv_int_idx[i]], DCP_F64, 1);
        dcp__convert(&b, DCP_I32, &cv_in[cv_int_idx[i]], DCP_F64, 1);
        ASSERT_EQ(a, cv_i8[i]);
        ASSERT_EQ(b, cv_i32[i]);
    }
}

/* Every f16 and bf16 bit pattern survives a trip through float32. */
TEST(half_roundtrip_exhaustive)
{
    uint32_t x;
    for (x = 0; x < 65536; x++) {
        uint16_t h = (uint16_t)x, back = 0;
        float f;
        dcp__convert(&f, DCP_F32, &h, DCP_F16, 1);
        dcp__convert(&back, DCP_F16, &f, DCP_F32, 1);
        if (!isnan(f))
            ASSERT_EQ(back, h);
        dcp__convert(&f, DCP_F32, &h, DCP_BF16, 1);
        dcp__convert(&back, DCP_BF16, &f, DCP_F32, 1);
        if (!isnan(f))
            ASSERT_EQ(back, h);
    }
}

TEST(f8_decode_all)
{
    uint32_t x;
    for (x = 0; x < 256; x++) {
        uint8_t v = (uint8_t)x, back = 0;
        float f;
        dcp__convert(&f, DCP_F32, &v, DCP_F8_E4M3FN, 1);
        ASSERT(isnan(f) == ((x & 0x7f) == 0x7f));
        if (!isnan(f)) {
            dcp__convert(&back, DCP_F8_E4M3FN, &f, DCP_F32, 1);
            ASSERT_EQ(back, v);
        }
        dcp__convert(&f, DCP_F32, &v, DCP_F8_E5M2, 1);
        if (!isnan(f)) {
            dcp__convert(&back, DCP_F8_E5M2, &f, DCP_F32, 1);
            ASSERT_EQ(back, v);
        }
    }
}

TEST(bool_and_same_type)
{
    float f[3] = {0.0f, -0.5f, NAN};
    uint8_t b[3];
    int64_t big = INT64_MAX, big2 = 0;
    dcp__convert(b, DCP_BOOL, f, DCP_F32, 3);
    ASSERT(b[0] == 0 && b[1] == 1 && b[2] == 1);
    dcp__convert(&big2, DCP_I64, &big, DCP_I64, 1);
    ASSERT(big2 == INT64_MAX);
}

int main(void)
{
    RUN(floats_match_torch);
    RUN(ints_match_torch);
    RUN(half_roundtrip_exhaustive);
    RUN(f8_decode_all);
    RUN(bool_and_same_type);
    return TEST_SUMMARY();
}
