/*
 * The dtype table (sizes, torch names, aliases, the torch.save storage
 * class and the safetensors name of each dtype) and element conversion,
 * which does what PyTorch 2.13's Tensor.to() does on the CPU, bit for bit
 * (tests/unit/test_cast_table.c checks it against a table torch made,
 * tests/data/cast_table.bin):
 *
 *  - float64 <-> float32 and integer -> float64/float32 round once, to
 *    nearest even (from the 64-bit integer, not through a double);
 *  - every target narrower than float32 (float16, bfloat16, the float8s) is
 *    reached through float32, as c10's types are constructed from a float:
 *    a float64 or an int64 source is rounded twice, then torch's own
 *    float32 -> small routines (ported below) round to nearest even;
 *  - float -> integer follows the x86-64 instructions torch's kernels
 *    compile to: int64 and uint8 truncate to int64 (out of range or NaN:
 *    INT64_MIN), int32, int16, int8 and uint16 truncate to int32 (out of
 *    range or NaN: INT32_MIN) and keep the low bits, uint32 keeps the low 32
 *    bits of the int64, uint64 handles [2^63, 2^64) by subtracting 2^63;
 *  - integer -> integer keeps the low bits (two's complement);
 *  - anything -> bool is x != 0 (NaN is true; complex: either part);
 *  - complex -> real takes the real part, real -> complex has imaginary 0,
 *    complex -> complex converts each part;
 *  - float4_e2m1fn_x2 converts to nothing else (torch refuses it too).
 */
#include "dtype.h"

#include "util.h"
#include "dcp/dcp_convert.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------- table */

enum {
    C_FLOAT = 1, /* a real floating type */
    C_INT,       /* a signed integer */
    C_UINT,      /* an unsigned integer */
    C_BOOL,
    C_COMPLEX,
    C_OPAQUE /* stored and loaded as bytes, never converted */
};

static const struct dtype_info {
    dcp_dtype dt;
    size_t size;
    int cls;
    const char *name;    /* torch.<name> */
    const char *alias;   /* short name */
    const char *alias2;  /* torch's other attribute name, or NULL */
    const char *storage; /* torch.<storage> that torch.save writes, or NULL
                            (then torch.storage.UntypedStorage + dtype) */
    const char *st;      /* safetensors dtype, or NULL */
} dtypes[] = {
    {DCP_F64, 8, C_FLOAT, "float64", "f64", "double", "DoubleStorage", "F64"},
    {DCP_F32, 4, C_FLOAT, "float32", "f32", "float", "FloatStorage", "F32"},
    {DCP_F16, 2, C_FLOAT, "float16", "f16", "half", "HalfStorage", "F16"},
    {DCP_BF16, 2, C_FLOAT, "bfloat16", "bf16", NULL, "BFloat16Storage",
     "BF16"},
    {DCP_F8_E4M3FN, 1, C_FLOAT, "float8_e4m3fn", "f8e4m3", NULL, NULL,
     "F8_E4M3"},
    {DCP_F8_E5M2, 1, C_FLOAT, "float8_e5m2", "f8e5m2", NULL, NULL, "F8_E5M2"},
    {DCP_I64, 8, C_INT, "int64", "i64", "long", "LongStorage", "I64"},
    {DCP_I32, 4, C_INT, "int32", "i32", "int", "IntStorage", "I32"},
    {DCP_I16, 2, C_INT, "int16", "i16", "short", "ShortStorage", "I16"},
    {DCP_I8, 1, C_INT, "int8", "i8", NULL, "CharStorage", "I8"},
    {DCP_U8, 1, C_UINT, "uint8", "u8", NULL, "ByteStorage", "U8"},
    {DCP_BOOL, 1, C_BOOL, "bool", "bool", NULL, "BoolStorage", "BOOL"},
    {DCP_C32, 4, C_COMPLEX, "complex32", "c32", "chalf", NULL, NULL},
    {DCP_C64, 8, C_COMPLEX, "complex64", "c64", "cfloat", "ComplexFloatStorage",
     "C64"},
    {DCP_C128, 16, C_COMPLEX, "complex128", "c128", "cdouble",
     "ComplexDoubleStorage", NULL},
    {DCP_U16, 2, C_UINT, "uint16", "u16", NULL, NULL, "U16"},
    {DCP_U32, 4, C_UINT, "uint32", "u32", NULL, NULL, "U32"},
    {DCP_U64, 8, C_UINT, "uint64", "u64", NULL, NULL, "U64"},
    {DCP_F8_E4M3FNUZ, 1, C_FLOAT, "float8_e4m3fnuz", "f8e4m3fnuz", NULL, NULL,
     NULL},
    {DCP_F8_E5M2FNUZ, 1, C_FLOAT, "float8_e5m2fnuz", "f8e5m2fnuz", NULL, NULL,
     NULL},
    {DCP_F8_E8M0FNU, 1, C_FLOAT, "float8_e8m0fnu", "f8e8m0", NULL, NULL,
     "F8_E8M0"},
    {DCP_F4_E2M1FN_X2, 1, C_OPAQUE, "float4_e2m1fn_x2", "f4e2m1x2", NULL, NULL,
     NULL},
};

static const struct dtype_info *info(dcp_dtype dt)
{
    size_t i;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++)
        if (dtypes[i].dt == dt)
            return &dtypes[i];
    return NULL;
}

size_t dcp_dtype_size(dcp_dtype dt)
{
    const struct dtype_info *d = info(dt);
    return d ? d->size : 0;
}

const char *dcp_dtype_name(dcp_dtype dt)
{
    const struct dtype_info *d = info(dt);
    return d ? d->name : NULL;
}

int dcp_dtype_from_name(const char *name, dcp_dtype *out)
{
    static const struct {
        const char *name;
        dcp_dtype dt;
    } extra[] = {{"fp32", DCP_F32}, {"fp16", DCP_F16}, {"fp64", DCP_F64},
                 {"bfloat", DCP_BF16}};
    size_t i;
    if (!name || !out)
        return DCP_EINVAL;
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++) {
        if (strcmp(name, dtypes[i].name) == 0 ||
            strcmp(name, dtypes[i].alias) == 0 ||
            (dtypes[i].alias2 && strcmp(name, dtypes[i].alias2) == 0)) {
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

int dcp__dtype_from_torch(const char *name, size_t len, dcp_dtype *out)
{
    size_t i;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++) {
        if (strlen(dtypes[i].name) == len &&
            memcmp(name, dtypes[i].name, len) == 0) {
            *out = dtypes[i].dt;
            return 1;
        }
    }
    return 0;
}

const char *dcp__dtype_storage(dcp_dtype dt)
{
    const struct dtype_info *d = info(dt);
    return d ? d->storage : NULL;
}

int dcp__dtype_from_storage(const char *name, dcp_dtype *out)
{
    size_t i;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++) {
        if (dtypes[i].storage && strcmp(name, dtypes[i].storage) == 0) {
            *out = dtypes[i].dt;
            return 1;
        }
    }
    return 0;
}

const char *dcp__dtype_st_name(dcp_dtype dt)
{
    const struct dtype_info *d = info(dt);
    return d ? d->st : NULL;
}

int dcp__dtype_from_st_name(const char *name, dcp_dtype *out)
{
    size_t i;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++) {
        if (dtypes[i].st && strcmp(name, dtypes[i].st) == 0) {
            *out = dtypes[i].dt;
            return 1;
        }
    }
    return 0;
}

int dcp__dtype_is_float(dcp_dtype dt)
{
    const struct dtype_info *d = info(dt);
    return d && d->cls == C_FLOAT;
}

int dcp__can_convert(dcp_dtype dst, dcp_dtype src)
{
    const struct dtype_info *d = info(dst), *s = info(src);
    if (!d || !s)
        return 0;
    return dst == src || (d->cls != C_OPAQUE && s->cls != C_OPAQUE);
}

/* ------------------------------------------------ float32 <-> small */

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

static int clz32(uint32_t x)
{
    int n = 0;
    if (!x)
        return 32;
    while (!(x & 0x80000000u)) {
        x <<= 1;
        n++;
    }
    return n;
}

/* float16 -> float32, as the F16C instruction (NaN: quieted, payload kept). */
static uint32_t f16_to_f32(uint32_t h)
{
    uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    int sh;
    if (e == 0x1F)
        return sign | 0x7F800000u | (m ? 0x400000u | (m << 13) : 0);
    if (e != 0)
        return sign | ((e + 112) << 23) | (m << 13);
    if (m == 0)
        return sign;
    sh = clz32(m) - 21; /* bring the leading 1 to bit 10 */
    return sign | ((uint32_t)(113 - sh) << 23) | ((m << sh) & 0x3FF) << 13;
}

/* float32 -> float16, round to nearest even, as the F16C instruction
 * (overflow to infinity; NaN: quieted, the top payload bits kept). */
static uint32_t f32_to_f16(uint32_t f)
{
    uint32_t sign = (f >> 16) & 0x8000u, a = f & 0x7FFFFFFFu, r;
    if (a > 0x7F800000u)
        return sign | 0x7E00u | ((a >> 13) & 0x3FF);
    if (a >= 0x477FF000u) /* 65520 and up round to infinity */
        return sign | 0x7C00u;
    if (a >= 0x38800000u) { /* normal: 2^-14 and up */
        r = a - (112u << 23);
        r = (r + 0xFFF + ((r >> 13) & 1)) >> 13;
        return sign | r;
    }
    if (a < 0x33000000u) /* below half the smallest subnormal: 0 */
        return sign;
    {
        /* subnormal: shift the significand, round to nearest even */
        uint32_t e = a >> 23, m = (a & 0x7FFFFF) | 0x800000;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift, rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1)))
            q++;
        return sign | q;
    }
}

/* bfloat16: c10::detail::round_to_nearest_even (NaN: 0x7FC0), or torch's
 * vectorised float32 -> bfloat16 kernel (NaN: 0xFFFF, what a float32
 * tensor cast to bfloat16 gives). */
static uint32_t f32_to_bf16(uint32_t b, uint32_t nan)
{
    if ((b & 0x7FFFFFFFu) > 0x7F800000u)
        return nan;
    return (b + 0x7FFF + ((b >> 16) & 1)) >> 16;
}

/* c10::detail::fp8e4m3fn_to_fp32_value */
static uint32_t e4m3fn_to_f32(uint32_t x)
{
    uint32_t w = x << 24, sign = w & 0x80000000u, nonsign = w & 0x7FFFFFFFu;
    uint32_t renorm = (uint32_t)clz32(nonsign);
    uint32_t inf_nan, zero;
    renorm = renorm > 4 ? renorm - 4 : 0;
    /* only S.1111.111 (NaN) carries into bit 31 */
    inf_nan = (nonsign + 0x01000000u) & 0x80000000u ? 0x7F800000u : 0;
    zero = nonsign == 0 ? 0xFFFFFFFFu : 0;
    return sign |
           ((((nonsign << renorm >> 4) + ((0x78 - renorm) << 23)) | inf_nan) &
            ~zero);
}

/* c10::detail::fp8e4m3fn_from_fp32_value: saturates at 448. */
static uint32_t f32_to_e4m3fn(uint32_t f)
{
    uint32_t sign = f & 0x80000000u, r;
    f ^= sign;
    if (f >= 1087u << 20) {
        r = f > 0x7F800000u ? 0x7F : 0x7E;
    } else if (f < 121u << 23) {
        uint32_t dm = 141u << 23;
        r = (uint8_t)(f32_bits(f32_from_bits(f) + f32_from_bits(dm)) - dm);
    } else {
        uint32_t odd = (f >> 20) & 1;
        f += ((uint32_t)(7 - 127) << 23) + 0x7FFFF;
        f += odd;
        r = (uint8_t)(f >> 20);
        if (r == 0x7F)
            r = 0x7E;
    }
    return r | (sign >> 24);
}

/* c10::detail::fp8e5m2_from_fp32_value */
static uint32_t f32_to_e5m2(uint32_t f)
{
    uint32_t sign = f & 0x80000000u, r;
    f ^= sign;
    if (f >= 143u << 23) {
        r = f > 0x7F800000u ? 0x7F : 0x7C;
    } else if (f < 113u << 23) {
        uint32_t dm = 134u << 23;
        r = (uint8_t)(f32_bits(f32_from_bits(f) + f32_from_bits(dm)) - dm);
    } else {
        uint32_t odd = (f >> 21) & 1;
        f += ((uint32_t)(15 - 127) << 23) + 0xFFFFF;
        f += odd;
        r = (uint8_t)(f >> 21);
    }
    return r | (sign >> 24);
}

/* c10::detail::fp8_fnuz_to_fp32_value<we, wm> */
static uint32_t fnuz_to_f32(uint32_t x, uint32_t we, uint32_t wm)
{
    uint32_t m = x & ((1u << wm) - 1), e = (x & 0x7F) >> wm;
    if (x == 0)
        return 0;
    if (x == 0x80)
        return 0x7F800001u;
    if (e == 0) {
        uint32_t sh = 1 + (uint32_t)clz32(m) - (32 - wm);
        m <<= sh;
        e += 1 - sh;
        m &= (1u << wm) - 1;
    }
    e += (1u << 7) - (1u << (we - 1)) - 1;
    return ((x >> 7) << 31) | (e << 23) | (m << (23 - wm));
}

/* c10::detail::fp8e4m3fnuz_from_fp32_value and the e5m2fnuz one:
 * overflow and NaN give NaN (0x80), -0 gives 0. */
static uint32_t f32_to_fnuz(uint32_t f, uint32_t max, uint32_t dm,
                            uint32_t minnorm, int bias, int mshift)
{
    uint32_t sign = f & 0x80000000u, r;
    f ^= sign;
    if (f >= max)
        return 0x80;
    if (f < minnorm) {
        r = (uint8_t)(f32_bits(f32_from_bits(f) + f32_from_bits(dm)) - dm);
        if (r == 0)
            return 0;
    } else {
        uint32_t odd = (f >> mshift) & 1;
        f += ((uint32_t)(bias - 127) << 23) + ((1u << (mshift - 1)) - 1);
        f += odd;
        r = (uint8_t)(f >> mshift);
    }
    return r | (sign >> 24);
}

/* c10 Float8_e8m0fnu -> float: 0 is 2^-127, 0xFF is NaN. */
static uint32_t e8m0_to_f32(uint32_t x)
{
    if (x == 0)
        return 0x00400000u;
    if (x == 0xFF)
        return 0x7F800001u;
    return x << 23;
}

/* c10::detail::fp8e8m0fnu_from_fp32_value: the exponent, rounded to
 * nearest even on the significand; the sign is dropped. */
static uint32_t f32_to_e8m0(uint32_t f)
{
    uint32_t e = (f >> 23) & 0xFF;
    int g, rs;
    if (e == 0xFF)
        return 0xFF;
    g = (f & 0x400000) != 0;
    rs = (f & 0x3FFFFF) != 0;
    if (g && (rs || e > 0))
        e++;
    return e;
}

/* ------------------------------------------------------- conversion */

/* One element on its way: an integer (two's complement bits; is_u for
 * uint64) or a float/complex value, kept both as float32 (what a narrower
 * target is made from) and as float64. */
struct num {
    int is_int, is_u;
    int nan_int0; /* a NaN that torch turns into integer 0 (see num_int) */
    uint64_t v;
    double re, im;
    float re32, im32;
};

static uint64_t rd_le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    memcpy(&v, p, n); /* little-endian host */
    return v;
}

static void set_f32(struct num *x, uint32_t re, uint32_t im)
{
    x->re32 = f32_from_bits(re);
    x->im32 = f32_from_bits(im);
    x->re = x->re32;
    x->im = x->im32;
}

static void set_int(struct num *x, int64_t v)
{
    x->is_int = 1;
    x->v = (uint64_t)v;
}

static void load_num(const uint8_t *p, dcp_dtype dt, struct num *x)
{
    memset(x, 0, sizeof(*x));
    switch (dt) {
    case DCP_F64:
    case DCP_C128: {
        memcpy(&x->re, p, 8);
        if (dt == DCP_C128)
            memcpy(&x->im, p + 8, 8);
        x->re32 = (float)x->re;
        x->im32 = (float)x->im;
        return;
    }
    case DCP_F32:
    case DCP_C64:
        set_f32(x, (uint32_t)rd_le(p, 4),
                dt == DCP_C64 ? (uint32_t)rd_le(p + 4, 4) : 0);
        return;
    case DCP_F16:
        set_f32(x, f16_to_f32((uint32_t)rd_le(p, 2)), 0);
        return;
    case DCP_C32:
        set_f32(x, f16_to_f32((uint32_t)rd_le(p, 2)),
                f16_to_f32((uint32_t)rd_le(p + 2, 2)));
        return;
    case DCP_BF16:
        set_f32(x, (uint32_t)rd_le(p, 2) << 16, 0);
        return;
    case DCP_F8_E4M3FN:
        set_f32(x, e4m3fn_to_f32(p[0]), 0);
        return;
    case DCP_F8_E5M2:
        set_f32(x, f16_to_f32((uint32_t)p[0] << 8), 0);
        return;
    case DCP_F8_E4M3FNUZ:
        set_f32(x, fnuz_to_f32(p[0], 4, 3), 0);
        x->nan_int0 = p[0] == 0x80;
        return;
    case DCP_F8_E5M2FNUZ:
        set_f32(x, fnuz_to_f32(p[0], 5, 2), 0);
        x->nan_int0 = p[0] == 0x80;
        return;
    case DCP_F8_E8M0FNU:
        set_f32(x, e8m0_to_f32(p[0]), 0);
        x->nan_int0 = p[0] == 0xFF;
        return;
    case DCP_I64:
        set_int(x, (int64_t)rd_le(p, 8));
        return;
    case DCP_I32:
        set_int(x, (int32_t)(uint32_t)rd_le(p, 4));
        return;
    case DCP_I16:
        set_int(x, (int16_t)(uint16_t)rd_le(p, 2));
        return;
    case DCP_I8:
        set_int(x, (int8_t)p[0]);
        return;
    case DCP_U8:
    case DCP_U16:
    case DCP_U32:
    case DCP_U64:
        x->is_int = 1;
        x->is_u = dt == DCP_U64;
        x->v = rd_le(p, dcp_dtype_size(dt));
        return;
    case DCP_BOOL:
        set_int(x, p[0] != 0);
        return;
    case DCP_F4_E2M1FN_X2:
        return;
    }
}

static double num_f64(const struct num *x)
{
    if (!x->is_int)
        return x->re;
    return x->is_u ? (double)x->v : (double)(int64_t)x->v;
}

static float num_f32(const struct num *x)
{
    if (!x->is_int)
        return x->re32;
    return x->is_u ? (float)x->v : (float)(int64_t)x->v;
}

/* cvttsd2si with a 64-bit and a 32-bit destination: out of range and NaN
 * give the "integer indefinite" value. */
static int64_t cvt_i64(double d)
{
    if (!(d > -9223372036854777856.0 && d < 9223372036854775808.0))
        return INT64_MIN;
    return (int64_t)d;
}

static int32_t cvt_i32(double d)
{
    if (!(d > -2147483649.0 && d < 2147483648.0))
        return INT32_MIN;
    return (int32_t)d;
}

static uint64_t cvt_u64(double d)
{
    if (d >= 9223372036854775808.0)
        return (uint64_t)cvt_i64(d - 9223372036854775808.0) ^
               0x8000000000000000u;
    return (uint64_t)cvt_i64(d);
}

/* The low bits of the integer an element becomes, for an integer target of
 * the given class and size. */
static uint64_t num_int(const struct num *x, dcp_dtype dt)
{
    double d;
    if (x->is_int)
        return x->v;
    /* The NaN of the fnuz and e8m0 float8s is a constant in c10's
     * conversion to float, and the compiler folds its conversion to an
     * integer to 0 where the instruction would give INT_MIN. */
    if (x->nan_int0)
        return 0;
    d = x->re;
    if (dt == DCP_I64 || dt == DCP_U8 || dt == DCP_U32)
        return (uint64_t)cvt_i64(d);
    if (dt == DCP_U64)
        return cvt_u64(d);
    return (uint64_t)(int64_t)cvt_i32(d); /* int32, int16, int8, uint16 */
}

static void wr_le(uint8_t *p, uint64_t v, size_t n)
{
    memcpy(p, &v, n); /* little-endian host */
}

static uint32_t small_from_f32(dcp_dtype dt, float f)
{
    uint32_t b = f32_bits(f);
    if (dt == DCP_F16 || dt == DCP_C32)
        return f32_to_f16(b);
    if (dt == DCP_BF16)
        return f32_to_bf16(b, 0x7FC0u);
    if (dt == DCP_F8_E4M3FN)
        return f32_to_e4m3fn(b);
    if (dt == DCP_F8_E5M2)
        return f32_to_e5m2(b);
    if (dt == DCP_F8_E4M3FNUZ)
        return f32_to_fnuz(b, 0x87u << 23, 0x8Cu << 23, 0x78u << 23, 8, 20);
    if (dt == DCP_F8_E5M2FNUZ)
        return f32_to_fnuz(b, 0x8Fu << 23, 0x85u << 23, 0x70u << 23, 16, 21);
    return f32_to_e8m0(b); /* DCP_F8_E8M0FNU */
}

static void store_num(uint8_t *p, dcp_dtype dt, const struct num *x)
{
    switch (dt) {
    case DCP_F64: {
        double d = num_f64(x);
        memcpy(p, &d, 8);
        return;
    }
    case DCP_C128: {
        double d[2];
        d[0] = num_f64(x);
        d[1] = x->is_int ? 0.0 : x->im;
        memcpy(p, d, 16);
        return;
    }
    case DCP_F32: {
        float f = num_f32(x);
        memcpy(p, &f, 4);
        return;
    }
    case DCP_C64: {
        float f[2];
        f[0] = num_f32(x);
        f[1] = x->is_int ? 0.0f : x->im32;
        memcpy(p, f, 8);
        return;
    }
    case DCP_F16:
    case DCP_BF16:
        wr_le(p, small_from_f32(dt, num_f32(x)), 2);
        return;
    case DCP_C32:
        wr_le(p, small_from_f32(dt, num_f32(x)), 2);
        wr_le(p + 2, x->is_int ? 0 : small_from_f32(dt, x->im32), 2);
        return;
    case DCP_F8_E4M3FN:
    case DCP_F8_E5M2:
    case DCP_F8_E4M3FNUZ:
    case DCP_F8_E5M2FNUZ:
    case DCP_F8_E8M0FNU:
        p[0] = (uint8_t)small_from_f32(dt, num_f32(x));
        return;
    case DCP_I64:
    case DCP_I32:
    case DCP_I16:
    case DCP_I8:
    case DCP_U8:
    case DCP_U16:
    case DCP_U32:
    case DCP_U64:
        wr_le(p, num_int(x, dt), dcp_dtype_size(dt));
        return;
    case DCP_BOOL:
        p[0] = x->is_int ? x->v != 0 : (x->re != 0.0 || x->im != 0.0);
        return;
    case DCP_F4_E2M1FN_X2:
        return;
    }
}

void dcp__convert(void *dst, dcp_dtype dt_dst, const void *src,
                  dcp_dtype dt_src, size_t n)
{
    size_t sd = dcp_dtype_size(dt_dst), ss = dcp_dtype_size(dt_src), i;
    uint8_t *d = dst;
    const uint8_t *s = src;
    struct num x;
    if (n == 0)
        return; /* dst and src may be NULL */
    if (dt_dst == dt_src) {
        memcpy(dst, src, n * sd);
        return;
    }
    if (!dcp__can_convert(dt_dst, dt_src))
        return;
    if (dt_src == DCP_F32 && dt_dst == DCP_BF16) {
        /* The common export cast; torch has its own kernel for it. */
        for (i = 0; i < n; i++)
            wr_le(d + 2 * i,
                  f32_to_bf16((uint32_t)rd_le(s + 4 * i, 4), 0xFFFFu), 2);
        return;
    }
    if (dt_src == DCP_C32 && dt_dst == DCP_F16) {
        /* the real part as it is (a NaN keeps its payload) */
        for (i = 0; i < n; i++)
            memcpy(d + 2 * i, s + 4 * i, 2);
        return;
    }
    for (i = 0; i < n; i++) {
        load_num(s + i * ss, dt_src, &x);
        store_num(d + i * sd, dt_dst, &x);
    }
}

size_t dcp__convert_overflow(const void *dst, dcp_dtype dt_dst,
                             const void *src, dcp_dtype dt_src, size_t n)
{
    size_t sd = dcp_dtype_size(dt_dst), ss = dcp_dtype_size(dt_src), i;
    const uint8_t *d = dst, *s = src;
    struct num x, y;
    if (dt_dst == dt_src || !dcp__dtype_is_float(dt_dst) ||
        !dcp__dtype_is_float(dt_src))
        return n;
    for (i = 0; i < n; i++) {
        load_num(s + i * ss, dt_src, &x);
        if (!isfinite(x.re))
            continue;
        load_num(d + i * sd, dt_dst, &y);
        if (!isfinite(y.re))
            return i;
        /* float8_e4m3fn saturates at 448: beyond the rounding boundary of
         * its largest value (464) the result is not x rounded. */
        if (dt_dst == DCP_F8_E4M3FN && fabs(x.re) >= 464.0)
            return i;
        /* float8_e8m0fnu holds neither zero nor a sign */
        if (dt_dst == DCP_F8_E8M0FNU && x.re <= 0.0)
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
    if (!dcp__can_convert(dst_dt, src_dt))
        return DCP_ENOTSUP;
    dcp__convert(dst, dst_dt, src, src_dt, n);
    return DCP_OK;
}
