/*
 * Element conversion. Every value goes through double, which holds every
 * supported dtype exactly except int64 beyond 2^53 (int64 to int64 copies
 * bytes, so only cross-type casts of huge integers round).
 */
#include "dtype.h"

#include "util.h"
#include "dcp/dcp_convert.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------- table */
static const struct {
    dcp_dtype dt;
    size_t size;
    const char *name;
    const char *alias;
} dtypes[] = {
    {DCP_F64, 8, "float64", "f64"},
    {DCP_F32, 4, "float32", "f32"},
    {DCP_F16, 2, "float16", "f16"},
    {DCP_BF16, 2, "bfloat16", "bf16"},
    {DCP_F8_E4M3FN, 1, "float8_e4m3fn", "f8e4m3"},
    {DCP_F8_E5M2, 1, "float8_e5m2", "f8e5m2"},
    {DCP_I64, 8, "int64", "i64"},
    {DCP_I32, 4, "int32", "i32"},
    {DCP_I16, 2, "int16", "i16"},
    {DCP_I8, 1, "int8", "i8"},
    {DCP_U8, 1, "uint8", "u8"},
    {DCP_BOOL, 1, "bool", "bool"},
};

size_t dcp_dtype_size(dcp_dtype dt)
{
    size_t i;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++)
        if (dtypes[i].dt == dt)
            return dtypes[i].size;
    return 0;
}

const char *dcp_dtype_name(dcp_dtype dt)
{
    size_t i;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++)
        if (dtypes[i].dt == dt)
            return dtypes[i].name;
    return NULL;
}

int dcp_dtype_from_name(const char *name, dcp_dtype *out)
{
    static const struct {
        const char *name;
        dcp_dtype dt;
    } extra[] = {{"fp32", DCP_F32}, {"fp16", DCP_F16},   {"half", DCP_F16},
                 {"float", DCP_F32}, {"double", DCP_F64}, {"fp64", DCP_F64},
                 {"long", DCP_I64},  {"int", DCP_I32},    {"bfloat", DCP_BF16}};
    size_t i;
    if (!name || !out)
        return DCP_EINVAL;
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++) {
        if (strcmp(name, dtypes[i].name) == 0 ||
            strcmp(name, dtypes[i].alias) == 0) {
            *out = dtypes[i].dt;
            return DCP_OK;
        }
    }
    for (i = 0; i < DCP_ARRAY_LEN(extra); i++) {
        if (strcmp(name, extra[i].name) == 0) {
            *out = extra[i].dt;
            return DCP_OK;
        }
    }
    return DCP_EINVAL;
}

/* ------------------------------------------------------- conversion */

static float f32_from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, 4);
    return f;
}

static uint32_t f32_bits(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

/* Small float (1 sign bit, ebits, mbits, bias) to double. */
static double small_to_double(uint32_t v, int ebits, int mbits, int bias,
                              int has_inf)
{
    uint32_t sign = v >> (ebits + mbits);
    uint32_t e = (v >> mbits) & ((1u << ebits) - 1);
    uint32_t m = v & ((1u << mbits) - 1);
    double r;
    if (e == (1u << ebits) - 1) {
        if (has_inf) {
            r = m ? NAN : INFINITY;
            return sign ? -r : r;
        }
        if (m == (1u << mbits) - 1) /* e4m3fn: only S.1111.111 is NaN */
            return NAN;
    }
    if (e == 0)
        r = ldexp((double)m, 1 - bias - mbits);
    else
        r = ldexp((double)(m | (1u << mbits)), (int)e - bias - mbits);
    return sign ? -r : r;
}

/* double to small float with round to nearest even. */
static uint32_t double_to_small(double x, int ebits, int mbits, int bias,
                                int has_inf)
{
    uint32_t sign = signbit(x) ? 1u << (ebits + mbits) : 0;
    uint32_t emax = (1u << ebits) - 1, nan, maxfin;
    double a = fabs(x), scaled, fl;
    int e;
    uint64_t q;
    if (has_inf) {
        nan = (emax << mbits) | (1u << (mbits - 1));
        maxfin = ((emax - 1) << mbits) | ((1u << mbits) - 1);
    } else {
        nan = (emax << mbits) | ((1u << mbits) - 1);
        maxfin = (emax << mbits) | ((1u << mbits) - 2);
    }
    if (isnan(x))
        return sign | nan;
    if (isinf(x))
        return sign | (has_inf ? emax << mbits : maxfin);
    if (a == 0.0)
        return sign;
    (void)frexp(a, &e); /* a = f * 2^e, f in [0.5, 1) */
    e -= 1;             /* a = 1.x * 2^e */
    if (e < 1 - bias)
        e = 1 - bias; /* subnormal range: fixed exponent */
    scaled = ldexp(a, mbits - e);
    fl = floor(scaled);
    q = (uint64_t)fl;
    if (scaled - fl > 0.5 || (scaled - fl == 0.5 && (q & 1)))
        q++;
    /* q now holds the significand (with the implicit bit) at exponent e. */
    if (q >= (2ull << mbits)) {
        q >>= 1;
        e++;
    }
    {
        uint32_t bits;
        if (q < (1ull << mbits)) {
            bits = (uint32_t)q; /* subnormal (or rounded up to normal) */
        } else {
            int be = e + bias;
            if (be >= (int)emax + (has_inf ? 0 : 1))
                return sign | (has_inf ? emax << mbits : maxfin);
            bits = ((uint32_t)be << mbits) | ((uint32_t)q & ((1u << mbits) - 1));
        }
        if (bits > maxfin)
            return sign | (has_inf ? emax << mbits : maxfin);
        return sign | bits;
    }
}

static double load_elem(const uint8_t *p, dcp_dtype dt)
{
    switch (dt) {
    case DCP_F64: {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    case DCP_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case DCP_F16:
        return small_to_double((uint32_t)(p[0] | (p[1] << 8)), 5, 10, 15, 1);
    case DCP_BF16:
        return f32_from_bits((uint32_t)(p[0] | (p[1] << 8)) << 16);
    case DCP_F8_E4M3FN:
        return small_to_double(p[0], 4, 3, 7, 0);
    case DCP_F8_E5M2:
        return small_to_double(p[0], 5, 2, 15, 1);
    case DCP_I64: {
        int64_t v;
        memcpy(&v, p, 8);
        return (double)v;
    }
    case DCP_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        return v;
    }
    case DCP_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        return v;
    }
    case DCP_I8:
        return (int8_t)p[0];
    case DCP_U8:
        return p[0];
    case DCP_BOOL:
        return p[0] != 0;
    }
    return 0.0;
}

static int64_t to_int(double d, int64_t lo, int64_t hi)
{
    if (isnan(d))
        return 0;
    d = trunc(d);
    if (d <= (double)lo)
        return lo;
    if (d >= (double)hi)
        return hi;
    return (int64_t)d;
}

static void store_elem(uint8_t *p, dcp_dtype dt, double d)
{
    switch (dt) {
    case DCP_F64:
        memcpy(p, &d, 8);
        return;
    case DCP_F32: {
        float f = (float)d;
        memcpy(p, &f, 4);
        return;
    }
    case DCP_F16: {
        uint32_t h = double_to_small(d, 5, 10, 15, 1);
        p[0] = (uint8_t)h;
        p[1] = (uint8_t)(h >> 8);
        return;
    }
    case DCP_BF16: {
        uint32_t b = f32_bits((float)d), r;
        if (isnan(d))
            r = (b >> 16) | 0x40;
        else
            r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16;
        p[0] = (uint8_t)r;
        p[1] = (uint8_t)(r >> 8);
        return;
    }
    case DCP_F8_E4M3FN:
        p[0] = (uint8_t)double_to_small(d, 4, 3, 7, 0);
        return;
    case DCP_F8_E5M2:
        p[0] = (uint8_t)double_to_small(d, 5, 2, 15, 1);
        return;
    case DCP_I64: {
        int64_t v = to_int(d, INT64_MIN, INT64_MAX);
        memcpy(p, &v, 8);
        return;
    }
    case DCP_I32: {
        uint32_t v = (uint32_t)to_int(d, INT64_MIN, INT64_MAX);
        memcpy(p, &v, 4);
        return;
    }
    case DCP_I16: {
        uint16_t v = (uint16_t)to_int(d, INT64_MIN, INT64_MAX);
        memcpy(p, &v, 2);
        return;
    }
    case DCP_I8:
    case DCP_U8:
        p[0] = (uint8_t)to_int(d, INT64_MIN, INT64_MAX);
        return;
    case DCP_BOOL:
        p[0] = d != 0.0;
        return;
    }
}

void dcp__convert(void *dst, dcp_dtype dt_dst, const void *src,
                  dcp_dtype dt_src, size_t n)
{
    size_t sd = dcp_dtype_size(dt_dst), ss = dcp_dtype_size(dt_src), i;
    uint8_t *d = dst;
    const uint8_t *s = src;
    if (dt_dst == dt_src) {
        memcpy(dst, src, n * sd);
        return;
    }
    if (dt_src == DCP_F32 && dt_dst == DCP_BF16) {
        /* The common export cast, without the trip through double: the
         * same rounding as store_elem (nearest even, NaN kept quiet). */
        for (i = 0; i < n; i++) {
            uint32_t b = (uint32_t)s[4 * i] | ((uint32_t)s[4 * i + 1] << 8) |
                         ((uint32_t)s[4 * i + 2] << 16) |
                         ((uint32_t)s[4 * i + 3] << 24);
            uint32_t r = (b & 0x7FFFFFFFu) > 0x7F800000u
                             ? (b >> 16) | 0x40
                             : (b + 0x7FFF + ((b >> 16) & 1)) >> 16;
            d[2 * i] = (uint8_t)r;
            d[2 * i + 1] = (uint8_t)(r >> 8);
        }
        return;
    }
    for (i = 0; i < n; i++)
        store_elem(d + i * sd, dt_dst, load_elem(s + i * ss, dt_src));
}

static int is_float(dcp_dtype dt)
{
    return dt == DCP_F64 || dt == DCP_F32 || dt == DCP_F16 ||
           dt == DCP_BF16 || dt == DCP_F8_E4M3FN || dt == DCP_F8_E5M2;
}

size_t dcp__convert_overflow(const void *dst, dcp_dtype dt_dst,
                             const void *src, dcp_dtype dt_src, size_t n)
{
    size_t sd = dcp_dtype_size(dt_dst), ss = dcp_dtype_size(dt_src), i;
    const uint8_t *d = dst, *s = src;
    if (dt_dst == dt_src || !is_float(dt_dst) || !is_float(dt_src))
        return n;
    for (i = 0; i < n; i++) {
        double x = load_elem(s + i * ss, dt_src), y;
        if (!isfinite(x))
            continue;
        y = load_elem(d + i * sd, dt_dst);
        if (!isfinite(y))
            return i;
        /* float8_e4m3fn saturates at 448: beyond the rounding boundary of
         * its largest value (464) the result is not x rounded. */
        if (dt_dst == DCP_F8_E4M3FN && fabs(x) >= 464.0)
            return i;
    }
    return n;
}

int dcp_convert_elements(void *dst, dcp_dtype dst_dt, const void *src,
                         dcp_dtype src_dt, size_t n)
{
    if (!dcp_dtype_size(dst_dt) || !dcp_dtype_size(src_dt) ||
        (n && (!dst || !src)))
        return DCP_EINVAL;
    dcp__convert(dst, dst_dt, src, src_dt, n);
    return DCP_OK;
}
