/*
 * dcp__convert against PyTorch 2.13 itself: every row of
 * tests/data/cast_table.bin (made by tests/data/make_cast_table.py with
 * torch's Tensor.to(); the format is described there) is converted and
 * compared bit for bit. Rows torch marks as "NaN" (its vectorised and
 * scalar paths give NaNs with different payloads) must give a NaN; rows
 * marked "unspecified" (out-of-range float -> uint32, undefined behaviour
 * in C++, where torch's two paths disagree) are not compared. Every pair
 * of supported dtypes but float4_e2m1fn_x2 must appear in the table.
 */
#include <math.h>
#include <string.h>

#include "dtype.h"
#include "dcp/dcp_convert.h"
#include "test.h"

#define MARK_NAN 0x80000000u
#define NDT      22 /* dtypes 1 .. 21 are converted; 22 is bytes only */

static uint8_t *table;
static size_t table_len;

static int load_table(void)
{
    const char *dir = getenv("DCP_TEST_DATA");
    char path[4096];
    FILE *f;
    long n;
    snprintf(path, sizeof(path), "%s/cast_table.bin",
             dir ? dir : "../tests/data");
    f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open '%s'\n", path);
        return -1;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 12 ||
        fseek(f, 0, SEEK_SET) != 0 || !(table = malloc((size_t)n)) ||
        fread(table, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        return -1;
    }
    fclose(f);
    table_len = (size_t)n;
    return memcmp(table, "DCPCAST1", 8) == 0 ? 0 : -1;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static int is_nan(const uint8_t *p, dcp_dtype dt)
{
    double d[2] = {0, 0};
    if (dt == DCP_C32 || dt == DCP_C64 || dt == DCP_C128) {
        size_t h = dcp_dtype_size(dt) / 2;
        dcp_dtype part = dt == DCP_C32 ? DCP_F16
                         : dt == DCP_C64 ? DCP_F32 : DCP_F64;
        dcp__convert(&d[0], DCP_F64, p, part, 1);
        dcp__convert(&d[1], DCP_F64, p + h, part, 1);
    } else if (dcp__dtype_is_float(dt)) {
        dcp__convert(&d[0], DCP_F64, p, dt, 1);
    }
    return isnan(d[0]) || isnan(d[1]);
}

static void hex(const uint8_t *p, size_t n, char *out)
{
    size_t i;
    for (i = 0; i < n; i++) /* little-endian: most significant first */
        sprintf(out + 2 * i, "%02x", p[n - 1 - i]);
}

TEST(every_row_matches_torch)
{
    size_t p = 12, nsets = rd32(table + 8), s, rows = 0, marked = 0;
    int seen[NDT + 1][NDT + 1], bad = 0, a, b;
    uint8_t *iota = malloc(2 * 65536), *out = malloc(16 * 65536);
    memset(seen, 0, sizeof(seen));
    ASSERT(iota && out);
    for (s = 0; s < 65536; s++) {
        iota[2 * s] = (uint8_t)s;
        iota[2 * s + 1] = (uint8_t)(s >> 8);
    }
    for (s = 0; s < nsets; s++) {
        dcp_dtype src = (dcp_dtype)table[p];
        unsigned nt = table[p + 1], flags = table[p + 2], t;
        size_t n = rd32(table + p + 4), ss = dcp_dtype_size(src);
        const uint8_t *sv;
        ASSERT(ss > 0 && n <= 65536);
        p += 8;
        if (flags & 1) {
            ASSERT(ss == 2 && n == 65536);
            sv = iota;
        } else {
            sv = table + p;
            p += n * ss;
        }
        for (t = 0; t < nt; t++) {
            dcp_dtype dst = (dcp_dtype)table[p];
            size_t nm = rd32(table + p + 4), sd = dcp_dtype_size(dst), i, m;
            const uint8_t *marks = table + p + 8, *want;
            ASSERT(sd > 0 && p + 8 + 4 * nm + n * sd <= table_len);
            want = marks + 4 * nm;
            p += 8 + 4 * nm + n * sd;
            ASSERT(dcp__can_convert(dst, src));
            seen[src][dst] = 1;
            dcp__convert(out, dst, sv, src, n); /* the whole set at once */
            for (i = 0, m = 0; i < n; i++) {
                const uint8_t *g = out + i * sd, *w = want + i * sd;
                uint32_t mk = m < nm ? rd32(marks + 4 * m) : UINT32_MAX;
                rows++;
                if ((mk & ~MARK_NAN) == i) {
                    m++;
                    marked++;
                    if (!(mk & MARK_NAN))
                        continue;
                    if (is_nan(g, dst))
                        continue;
                } else if (memcmp(g, w, sd) == 0) {
                    continue;
                }
                if (bad++ < 40) {
                    char hs[40], hg[40], hw[40];
                    hex(sv + i * ss, ss, hs);
                    hex(g, sd, hg);
                    hex(w, sd, hw);
                    fprintf(stderr, "%s 0x%s -> %s: got 0x%s, torch 0x%s%s\n",
                            dcp_dtype_name(src), hs, dcp_dtype_name(dst), hg,
                            hw, mk == (i | MARK_NAN) ? " (a NaN)" : "");
                }
            }
            ASSERT_EQ(m, nm);
        }
    }
    ASSERT_EQ(p, table_len);
    fprintf(stderr, "%zu rows, %zu marked, %d differ\n", rows, marked, bad);
    ASSERT_EQ(bad, 0);
    for (a = 1; a < NDT; a++)
        for (b = 1; b < NDT; b++)
            if (a != b && !seen[a][b]) {
                fprintf(stderr, "no rows for %s -> %s\n",
                        dcp_dtype_name((dcp_dtype)a),
                        dcp_dtype_name((dcp_dtype)b));
                bad++;
            }
    ASSERT_EQ(bad, 0);
    free(iota);
    free(out);
}

/* torch converts float4_e2m1fn_x2 to nothing else, and neither does dcp. */
TEST(float4_refused)
{
    uint8_t x = 0x21, y = 0;
    float f = 1.0f;
    int dt;
    ASSERT(dcp__can_convert(DCP_F4_E2M1FN_X2, DCP_F4_E2M1FN_X2));
    for (dt = 1; dt < NDT; dt++) {
        ASSERT(!dcp__can_convert(DCP_F4_E2M1FN_X2, (dcp_dtype)dt));
        ASSERT(!dcp__can_convert((dcp_dtype)dt, DCP_F4_E2M1FN_X2));
    }
    ASSERT_EQ(dcp_convert_elements(&f, DCP_F32, &x, DCP_F4_E2M1FN_X2, 1),
              DCP_ENOTSUP);
    ASSERT_EQ(dcp_convert_elements(&y, DCP_F4_E2M1FN_X2, &f, DCP_F32, 1),
              DCP_ENOTSUP);
    ASSERT_EQ(dcp_convert_elements(&y, DCP_F4_E2M1FN_X2, &x,
                                   DCP_F4_E2M1FN_X2, 1),
              DCP_OK);
    ASSERT_EQ(y, 0x21);
}

/* The dtype table: torch names, aliases, sizes, storage classes. */
TEST(dtype_table)
{
    static const struct {
        dcp_dtype dt;
        const char *name, *alias;
        size_t size;
    } want[] = {
        {DCP_C32, "complex32", "chalf", 4},
        {DCP_C64, "complex64", "cfloat", 8},
        {DCP_C128, "complex128", "cdouble", 16},
        {DCP_U16, "uint16", "u16", 2},
        {DCP_U32, "uint32", "u32", 4},
        {DCP_U64, "uint64", "u64", 8},
        {DCP_F8_E4M3FNUZ, "float8_e4m3fnuz", "f8e4m3fnuz", 1},
        {DCP_F8_E5M2FNUZ, "float8_e5m2fnuz", "f8e5m2fnuz", 1},
        {DCP_F8_E8M0FNU, "float8_e8m0fnu", "f8e8m0", 1},
        {DCP_F4_E2M1FN_X2, "float4_e2m1fn_x2", "f4e2m1x2", 1},
    };
    size_t i;
    dcp_dtype dt;
    char buf[64];
    for (i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        ASSERT_EQ(dcp_dtype_size(want[i].dt), want[i].size);
        ASSERT(strcmp(dcp_dtype_name(want[i].dt), want[i].name) == 0);
        snprintf(buf, sizeof(buf), "torch.%s", want[i].name);
        ASSERT_EQ(dcp_dtype_from_name(buf, &dt), DCP_OK);
        ASSERT_EQ(dt, want[i].dt);
        ASSERT_EQ(dcp_dtype_from_name(want[i].alias, &dt), DCP_OK);
        ASSERT_EQ(dt, want[i].dt);
    }
    ASSERT_EQ(dcp_dtype_size((dcp_dtype)23), 0);
    ASSERT(dcp_dtype_name((dcp_dtype)23) == NULL);
    ASSERT(strcmp(dcp__dtype_storage(DCP_C64), "ComplexFloatStorage") == 0);
    ASSERT(strcmp(dcp__dtype_storage(DCP_C128), "ComplexDoubleStorage") == 0);
    ASSERT(dcp__dtype_storage(DCP_U16) == NULL);
    ASSERT(dcp__dtype_from_storage("ComplexFloatStorage", &dt) && dt == DCP_C64);
    ASSERT(!dcp__dtype_from_storage("QInt8Storage", &dt));
}

int main(void)
{
    if (load_table() != 0) {
        fprintf(stderr, "tests/data/cast_table.bin is missing or bad\n");
        return 1;
    }
    RUN(every_row_matches_torch);
    RUN(float4_refused);
    RUN(dtype_table);
    free(table);
    return TEST_SUMMARY();
}
