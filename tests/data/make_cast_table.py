"""Makes tests/data/cast_table.bin: what PyTorch 2.13's Tensor.to() gives on
the CPU for every (source, target) dtype pair that dcp converts, so that
tests/unit/test_cast_table.c can check dcp__convert against torch itself
(and tests/interop/test_cast_table.py that the installed torch still agrees).
Run with a Python that has torch 2.13:

    .venv/bin/python tests/data/make_cast_table.py [out]

The output is deterministic (seeded), about 2 MB, and takes ~10 s.

Sources, per dtype:
  float16, bfloat16      every bit pattern to every float target of at most
                         two bytes; a sample (every 29th pattern) to all
  float8 (all five)      every bit pattern to every target
  float32, float64       NaN (with payloads), +-Inf, -0, subnormals, the
                         largest values; every representable value of each
                         small float target (a sample for 16-bit ones) with
                         the rounding midpoints to its neighbour, one ulp
                         either side and just past f32 resolution (double
                         rounding through float32); integer edges around
                         2**7 ... 2**64 with fractions; random bit patterns
  int64, uint64          around +-2**53 ... 2**63 (and 2**64 for uint64):
                         exact, +-1..3, float32/bfloat16/float16 rounding
                         midpoints +-1; random values; wrap-around values
  narrower ints, bool    every value for 8-bit ones; edges, midpoints and
                         random for the rest
  complex32/64/128       pairs of the special and ordinary values above

Rows where torch itself is not deterministic are marked: torch's CPU copy
kernel takes a vectorised path for the body of a tensor and a scalar one
for the tail, and for some out-of-range float -> integer casts (undefined
behaviour in C++, e.g. float -> uint32 of 2**40) the two give different
results. Each row is converted both as part of a large tensor and alone;
where they differ, the row is marked "unspecified" (not compared) or, when
both are NaN with different payloads, "NaN" (compared as "is a NaN").

Format (little-endian):
  "DCPCAST1"  u32 nsets
  per set:    u8 src dtype (dcp_dtype value), u8 ntargets, u16 flags, u32 n,
              n source elements (raw bytes); flags 1: not stored, the
              source is every 16-bit pattern 0 ... 65535 in order
    per target: u8 dst dtype, u8 0, u16 0, u32 nmark,
                nmark x u32 (row index | 0x80000000 when "NaN", else
                "unspecified"), n target elements (raw bytes, torch's
                vectorised result)
"""

import math
import os
import random
import struct
import sys
import warnings

import torch

warnings.filterwarnings("ignore")

# dcp_dtype values (include/dcp/dcp.h) and torch dtypes.
DT = [
    (1, torch.float64), (2, torch.float32), (3, torch.float16),
    (4, torch.bfloat16), (5, torch.float8_e4m3fn), (6, torch.float8_e5m2),
    (7, torch.int64), (8, torch.int32), (9, torch.int16), (10, torch.int8),
    (11, torch.uint8), (12, torch.bool), (13, torch.complex32),
    (14, torch.complex64), (15, torch.complex128), (16, torch.uint16),
    (17, torch.uint32), (18, torch.uint64), (19, torch.float8_e4m3fnuz),
    (20, torch.float8_e5m2fnuz), (21, torch.float8_e8m0fnu),
]
CODE = {d: c for c, d in DT}
ALL = [d for _, d in DT]
F8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
      torch.float8_e5m2fnuz, torch.float8_e8m0fnu]
SMALLF = [torch.float16, torch.bfloat16] + F8
FLOATS = [torch.float64, torch.float32] + SMALLF
INTS = {torch.int64: (64, True), torch.int32: (32, True),
        torch.int16: (16, True), torch.int8: (8, True),
        torch.uint8: (8, False), torch.uint16: (16, False),
        torch.uint32: (32, False), torch.uint64: (64, False)}

MARK_NAN = 0x80000000
ALL16 = b"".join(c.to_bytes(2, "little") for c in range(65536))


def raw(t):
    """The raw bytes of a contiguous tensor."""
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def from_raw(b, dt):
    return torch.frombuffer(bytearray(b), dtype=torch.uint8).view(dt)


def f64_bits(x):
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def f64_from_bits(b):
    return struct.unpack("<d", struct.pack("<Q", b))[0]


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def values_of(dt):
    """Every finite non-negative value of a small float dtype, sorted
    (for 16-bit ones, a sample plus the largest few)."""
    n = 1 << (8 * dt.itemsize)
    codes = range(n)
    if dt.itemsize == 2:
        codes = list(range(0, 0x8000, 193)) + list(range(0x7bf0, 0x7c00)) + \
            list(range(0x7f70, 0x7f80)) + list(range(0, 8))
    b = bytearray()
    for c in codes:
        b += c.to_bytes(dt.itemsize, "little")
    v = from_raw(b, dt).to(torch.float64).tolist()
    return sorted(set(x for x in v if math.isfinite(x) and x >= 0))


def midpoints(dt, as32):
    """Values around the rounding boundaries of dt, as float64 (as32: only
    those exact in float32, plus float32 neighbours)."""
    out = []
    v = values_of(dt)
    if dt == torch.float8_e8m0fnu:
        v = [0.0] + v
    for a, b in zip(v, v[1:] + [v[-1] * 2 if v[-1] else 1.0]):
        m = (a + b) / 2
        cands = [a, m]
        if as32:
            if abs(m) > 3.4e38:
                continue
            m32 = struct.unpack("<f", struct.pack("<f", m))[0]
            cands += [f32_step(m32, 1), f32_step(m32, -1)]
        else:
            cands += [math.nextafter(m, math.inf), math.nextafter(m, -math.inf),
                      m * (1 + 2.0**-30), m * (1 - 2.0**-30)]
        for j, x in enumerate(cands):
            out += [x, -x] if (len(out) + j) % 4 == 0 else [x]
    return out


def f32_step(x, d):
    b = f32_bits(x)
    if x == 0:
        return struct.unpack("<f", struct.pack("<I", 1))[0] * d
    b += d if x > 0 else -d
    return struct.unpack("<f", struct.pack("<I", b & 0xFFFFFFFF))[0]


def float_specials():
    s = [0.0, -0.0, math.inf, -math.inf, 1.0, -1.0, 0.5, 1.5, 2.5, -2.5,
         0.1, -0.1, 1 / 3, 100.25, -300.7, 65504.0, 65519.99, 65520.0,
         448.0, 464.0, 480.0, 57344.0, 61440.0, 240.0, 248.0, 256.0,
         2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-126, 2.0**-127, 2.0**-149,
         2.0**-150, 1e-40, 1e-45, 3.4028234663852886e38, 3.4028235677973366e38,
         3.5e38, 1e300, -1e300, 2.0**-1074, 2.0**-1022, 2.0**127, 2.0**128,
         1 + 2.0**-11 + 2.0**-40]
    for k in [7, 8, 15, 16, 31, 32, 53, 63, 64]:
        for base in [2.0**k, -(2.0**k)]:
            for d in [-1.5, -1, -0.5, 0, 0.5, 1, 1.5, 256, -256, 4096]:
                s.append(base + d)
    s += [3e9, -3e9, 1e10, -1e10, 1e19, -1e19, 1e20, 4e9, 70000.5, -70000.5,
          2.0**31 + 5, -(2.0**31) - 5, 2.0**40 + 7, -(2.0**40) - 7]
    return s


NAN64 = [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001,
         0x7FF8000000000123, 0xFFF4000000000000, 0x7FFFFFFFFFFFFFFF,
         0x7FF800002000000F]
NAN32 = [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FC00123, 0xFFA00000,
         0x7FFFFFFF, 0x7F802000]


def pack_f64(vals, nans=()):
    return b"".join(struct.pack("<d", x) for x in vals) + \
        b"".join(struct.pack("<Q", n) for n in nans)


def pack_f32(vals, nans=()):
    b = bytearray()
    for x in vals:
        try:
            b += struct.pack("<f", x)
        except OverflowError:
            b += struct.pack("<f", math.copysign(math.inf, x))
    return bytes(b) + b"".join(struct.pack("<I", n) for n in nans)


def int_edges(bits, signed, rng):
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else \
        (0, (1 << bits) - 1)
    s = set()
    if bits == 8:
        s.update(range(lo, hi + 1))
    for k in range(1, bits + 1):
        p = 1 << k
        offs = [0, 1, 2, 3, -1, -2, -3]
        for sh in (9, 12, 25, 54):  # bf16/f16/f32/f64 rounding midpoints
            if k > sh and (k > bits - 12 or k < sh + 4):
                h = 1 << (k - sh)
                offs += [h - 1, h, h + 1, -h, 3 * h]
        for o in offs:
            for v in (p + o, -p + o):
                if lo <= v <= hi:
                    s.add(v)
    s.update([lo, hi, 0, 1, -1 if signed else 2])
    for _ in range(100):
        s.add(rng.randint(lo, hi))
        s.add(rng.randint(lo, hi) >> rng.randint(0, bits - 1))
    if bits == 64 and signed:
        s.update([-201416554364499807, 2**60 + 2**36 + 1, 2**60 + 2**52 + 1,
                  0x123456789ABCDEF0, -0x123456789ABCDEF0])
    return sorted(v for v in s if lo <= v <= hi)


def int_bytes(vals, bits, signed):
    return b"".join(int(v).to_bytes(bits // 8, "little", signed=signed)
                    for v in vals)


def source_sets(rng):
    """[(src dtype, raw bytes, targets)]"""
    sets = []
    # 16-bit floats: every pattern to the small float targets, a sample to all
    for dt in (torch.float16, torch.bfloat16):
        sets.append((dt, ALL16, [d for d in SMALLF if d != dt]))
        sample = b"".join(c.to_bytes(2, "little") for c in
                          list(range(0, 65536, 61)) +
                          [0x7C00, 0xFC00, 0x7C01, 0x7E00, 0xFE00, 0x7FFF,
                           0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0x8000, 0x7BFF])
        sets.append((dt, sample, ALL))
    for dt in F8:
        sets.append((dt, bytes(range(256)), ALL))
    # float32 / float64: midpoints to the float targets; specials to all
    mids32, mids64 = [], []
    for dt in SMALLF:
        mids32 += midpoints(dt, True)
        mids64 += midpoints(dt, False)
    for x in [rng.uniform(-70000, 70000) for _ in range(400)]:
        m32 = struct.unpack("<f", struct.pack("<f", x))[0]
        mids64 += [m32, (m32 + f32_step(m32, 1)) / 2,
                   math.nextafter((m32 + f32_step(m32, 1)) / 2, math.inf)]
    sets.append((torch.float32, pack_f32(mids32, NAN32), FLOATS))
    sets.append((torch.float64, pack_f64(mids64, NAN64), FLOATS))
    spec = float_specials()
    r32 = [rng.getrandbits(32) for _ in range(300)]
    r64 = [rng.getrandbits(64) for _ in range(300)]
    rmod = [rng.uniform(-1e6, 1e6) for _ in range(150)] + \
        [rng.uniform(-300, 300) for _ in range(150)]
    b32 = pack_f32(spec + rmod, NAN32) + \
        b"".join(struct.pack("<I", x) for x in r32)
    b64 = pack_f64(spec + rmod, NAN64) + \
        b"".join(struct.pack("<Q", x) for x in r64)
    sets.append((torch.float32, b32, ALL))
    sets.append((torch.float64, b64, ALL))
    # integers and bool
    for dt, (bits, signed) in INTS.items():
        sets.append((dt, int_bytes(int_edges(bits, signed, rng), bits, signed),
                     ALL))
    sets.append((torch.bool, bytes([0, 1]), ALL))
    # complex: pairs of values
    cv = [0.0, -0.0, 1.0, -2.5, 0.1, 65520.0, 3e9, -3e9, 1e20, 300.7, 2.0**-25,
          1e-40, math.inf, -math.inf, math.nan, 1 + 2.0**-11 + 2.0**-40,
          2.0**31 + 5, 448.0, 464.0, 2.0**63]
    pairs = [(a, b) for a in cv for b in cv[:8] + [math.nan, math.inf]]
    pairs += [(rng.uniform(-1e4, 1e4), rng.uniform(-1e4, 1e4))
              for _ in range(200)]
    flat = [x for p in pairs for x in p]
    c128 = pack_f64(flat)
    sets.append((torch.complex128, c128, ALL))
    sets.append((torch.complex64, pack_f32(flat), ALL))
    h = [0x0000, 0x8000, 0x3C00, 0xC100, 0x7BFF, 0x7C00, 0xFC00, 0x7E00,
         0x7C01, 0x0001, 0x8001, 0x03FF, 0x5A00, 0x6400]
    h += [rng.getrandbits(16) for _ in range(16)]
    c32 = b"".join(struct.pack("<HH", a, b) for a in h for b in h[:14])
    sets.append((torch.complex32, c32, ALL))
    return sets


def convert(src, dt_src, dt_dst):
    """(vectorised result bytes, marks)"""
    t = from_raw(src, dt_src)
    vec = t.to(dt_dst)
    n = t.numel()
    vb = raw(vec)
    sd = dt_dst.itemsize
    # the same rows alone (the scalar path), and shifted by one (so that
    # every row is once in the body and once in the tail of a vector)
    shifted = raw(torch.cat([t[:1], t]).to(dt_dst))[sd:]
    marks = []
    suspects = [i for i in range(n)
                if vb[i * sd:(i + 1) * sd] != shifted[i * sd:(i + 1) * sd]]
    if n <= 5000 or suspects:
        check = range(n) if n <= 5000 else suspects
        for i in check:
            one = raw(t[i:i + 1].to(dt_dst))
            a = vb[i * sd:(i + 1) * sd]
            if one != a or shifted[i * sd:(i + 1) * sd] != a:
                both_nan = all(isnan_raw(x, dt_dst)
                               for x in (one, a, shifted[i * sd:(i + 1) * sd]))
                marks.append(i | (MARK_NAN if both_nan else 0))
    return vb, marks


def isnan_raw(b, dt):
    t = from_raw(b, dt)
    if dt.is_complex:
        return bool(torch.isnan(t).any())
    if dt.is_floating_point:
        return bool(torch.isnan(t.to(torch.float32)).any())
    return False


def build():
    rng = random.Random(18)
    sets = source_sets(rng)
    out = bytearray(b"DCPCAST1")
    out += struct.pack("<I", len(sets))
    for dt_src, src, targets in sets:
        ss = dt_src.itemsize
        assert len(src) % ss == 0
        n = len(src) // ss
        iota = n == 65536 and src == ALL16
        out += struct.pack("<BBHI", CODE[dt_src], len(targets), int(iota), n)
        if not iota:
            out += src
        for dt_dst in targets:
            vb, marks = convert(src, dt_src, dt_dst)
            out += struct.pack("<BBHI", CODE[dt_dst], 0, 0, len(marks))
            out += b"".join(struct.pack("<I", m) for m in marks)
            out += vb
    return bytes(out)


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else \
        os.path.join(os.path.dirname(os.path.abspath(__file__)),
                     "cast_table.bin")
    assert torch.__version__.startswith("2.13"), torch.__version__
    data = build()
    with open(path, "wb") as f:
        f.write(data)
    print(f"{path}: {len(data)} bytes")


if __name__ == "__main__":
    main()
