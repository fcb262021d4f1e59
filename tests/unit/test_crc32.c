/*
 * CRC-32: the standard check value, known vectors, incremental use and the
 * copying variant, against a bitwise reference over random lengths and
 * alignments.
 */
#include <stdint.h>
#include <string.h>

#include "crc32.h"
#include "test.h"

static uint32_t ref_crc32(uint32_t crc, const uint8_t *p, size_t n)
{
    crc = ~crc;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rnd(void)
{
    /* xorshift64*: deterministic across runs */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

TEST(check_value)
{
    ASSERT_EQ(dcp__crc32(0, "123456789", 9), 0xCBF43926u);
    ASSERT_EQ(ref_crc32(0, (const uint8_t *)"123456789", 9), 0xCBF43926u);
}

TEST(known_vectors)
{
    static const uint8_t zeros[32];
    static const uint8_t ones[32] = {
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    const char *fox = "The quick brown fox jumps over the lazy dog";

    ASSERT_EQ(dcp__crc32(0, NULL, 0), 0);
    ASSERT_EQ(dcp__crc32(0, "", 0), 0);
    ASSERT_EQ(dcp__crc32(0, "a", 1), 0xE8B7BE43u);
    ASSERT_EQ(dcp__crc32(0, fox, strlen(fox)), 0x414FA339u);
    ASSERT_EQ(dcp__crc32(0, zeros, 32), 0x190A55ADu);
    ASSERT_EQ(dcp__crc32(0, ones, 32), 0xFF6CAB0Bu);
    /* the records torch writes (CRCs seen in tests/data/torch_item_w.bin) */
    ASSERT_EQ(dcp__crc32(0, "1", 1), 0x83DCEFB7u);
    ASSERT_EQ(dcp__crc32(0, "64", 2), 0xE971773Fu);
    ASSERT_EQ(dcp__crc32(0, "little", 6), 0x19E33D85u);
    ASSERT_EQ(dcp__crc32(0, "3\n", 2), 0x55679ED1u);
}

TEST(incremental_equals_one_shot)
{
    enum { N = 5000 };
    static uint8_t buf[N];
    for (size_t i = 0; i < N; i++)
        buf[i] = (uint8_t)rnd();
    uint32_t whole = dcp__crc32(0, buf, N);
    ASSERT_EQ(whole, ref_crc32(0, buf, N));

    for (int trial = 0; trial < 500; trial++) {
        uint32_t c = 0;
        size_t off = 0;
        while (off < N) {
            size_t k = rnd() % 67;
            if (k > N - off)
                k = N - off;
            c = dcp__crc32(c, buf + off, k);
            off += k;
        }
        ASSERT_EQ(c, whole);
    }
    /* every split point of a short prefix */
    for (size_t s = 0; s <= 100; s++) {
        uint32_t c = dcp__crc32(dcp__crc32(0, buf, s), buf + s, 100 - s);
        ASSERT_EQ(c, dcp__crc32(0, buf, 100));
    }
}

TEST(random_lengths_and_alignments)
{
    enum { N = 4096 + 64 };
    static uint8_t buf[N];
    for (size_t i = 0; i < N; i++)
        buf[i] = (uint8_t)rnd();
    for (size_t off = 0; off < 16; off++)
        for (size_t len = 0; len < 80; len++)
            ASSERT_EQ(dcp__crc32(0, buf + off, len),
                      ref_crc32(0, buf + off, len));
    for (int trial = 0; trial < 3000; trial++) {
        size_t off = rnd() % 64;
        size_t len = rnd() % (N - off);
        uint32_t seed = rnd();
        ASSERT_EQ(dcp__crc32(seed, buf + off, len),
                  ref_crc32(seed, buf + off, len));
    }
}

TEST(copy_copies_and_matches)
{
    enum { N = 70000 }; /* more than one internal block */
    static uint8_t src[N + 16], dst[N + 16];
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)rnd();

    for (int trial = 0; trial < 200; trial++) {
        size_t so = rnd() % 16, d_o = rnd() % 16;
        size_t len = trial < 100 ? rnd() % 300 : rnd() % (N + 1);
        uint32_t seed = trial & 1 ? rnd() : 0;
        memset(dst, 0xA5, sizeof dst);
        uint32_t c = dcp__crc32_copy(seed, dst + d_o, src + so, len);
        ASSERT_EQ(c, dcp__crc32(seed, src + so, len));
        ASSERT_MEM_EQ(dst + d_o, src + so, len);
        for (size_t i = 0; i < d_o; i++)
            ASSERT_EQ(dst[i], 0xA5);
        for (size_t i = d_o + len; i < sizeof dst; i++)
            ASSERT_EQ(dst[i], 0xA5);
    }
    ASSERT_EQ(dcp__crc32_copy(0x1234u, NULL, NULL, 0), 0x1234u);
}

/* crc32_combine equals hashing the concatenation, for every split. */
TEST(combine_matches_concatenation)
{
    enum { N = 5000 };
    static uint8_t buf[N];
    for (size_t i = 0; i < N; i++)
        buf[i] = (uint8_t)rnd();
    for (int trial = 0; trial < 400; trial++) {
        size_t n = trial < 20 ? (size_t)trial : rnd() % (N + 1);
        size_t k = n ? rnd() % (n + 1) : 0;
        uint32_t a = dcp__crc32(0, buf, k), b = dcp__crc32(0, buf + k, n - k);
        ASSERT_EQ(dcp__crc32_combine(a, b, n - k), dcp__crc32(0, buf, n));
    }
    /* Zero-length pieces; lengths beyond 4 GiB (no data: combining is
     * associative, CRC(ABC) either way). */
    ASSERT_EQ(dcp__crc32_combine(0x12345678u, 0, 0), 0x12345678u);
    for (int trial = 0; trial < 50; trial++) {
        uint32_t a = rnd(), b = rnd(), c = rnd();
        uint64_t lb = ((uint64_t)rnd() << 8) + rnd(), lc = (uint64_t)rnd() << 4;
        ASSERT_EQ(dcp__crc32_combine(dcp__crc32_combine(a, b, lb), c, lc),
                  dcp__crc32_combine(a, dcp__crc32_combine(b, c, lc),
                                     lb + lc));
    }
}

/* Block CRCs fed in pieces of any size: each block's CRC, and the whole
 * CRC derived from them, equal hashing directly; with dst, the copy. */
TEST(blocks_in_any_pieces)
{
    enum { N = 40000 };
    static uint8_t src[N], dst[N];
    static const uint64_t sizes[] = {0, 1, 7, 4096, 5000, 65536};
    uint32_t crc[N + 1];
    for (size_t i = 0; i < N; i++)
        src[i] = (uint8_t)rnd();
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
        for (int trial = 0; trial < 40; trial++) {
            uint64_t bs = sizes[si];
            size_t n = trial < 4 && trial * bs <= N ? (size_t)(trial * bs)
                                                    : rnd() % (N + 1);
            size_t at = 0, nb = bs ? (size_t)((n + bs - 1) / bs) : 0;
            struct crc_blocks b;
            int copy = trial & 1;
            dcp__crcb_init(&b, bs, bs ? crc : NULL, N + 1);
            memset(dst, 0, sizeof dst);
            while (at < n) {
                size_t k = rnd() % 9000;
                if (k > n - at)
                    k = n - at;
                dcp__crcb_update(&b, copy ? dst + at : NULL, src + at, k);
                at += k;
            }
            ASSERT_EQ(dcp__crcb_finish(&b), dcp__crc32(0, src, n));
            ASSERT_U64_EQ(b.total, n);
            if (copy)
                ASSERT_MEM_EQ(dst, src, n);
            if (!bs)
                continue;
            ASSERT_U64_EQ(b.n, nb);
            for (size_t k = 0; k < nb; k++) {
                size_t len = n - k * bs < bs ? n - k * bs : (size_t)bs;
                ASSERT_EQ(crc[k], dcp__crc32(0, src + k * bs, len));
            }
            /* The whole CRC from the block CRCs alone. */
            dcp__crcb_init(&b, bs, NULL, 0);
            for (size_t k = 0; k < nb; k++)
                dcp__crcb_add_block(&b, crc[k],
                                    n - k * bs < bs ? n - k * bs : bs);
            ASSERT_EQ(dcp__crcb_finish(&b), dcp__crc32(0, src, n));
        }
    }
}

/* Every implementation this CPU has (tables, PCLMUL, VPCLMUL on 256-bit and
 * on 512-bit registers), with and without the fused copy (streaming stores
 * from 64 KiB to an aligned destination), against the bitwise reference. */
TEST(every_implementation)
{
    enum { N = (1 << 18) + 200 };
    static uint8_t src[N + 64], dst[N + 128] __attribute__((aligned(64)));
    static const size_t lens[] = {0,    1,     15,    16,    63,     64,  65,
                                  255,  256,   257,   511,   512,    513, 1000,
                                  4096, 65535, 65536, 65600, 100003, N};
    int top = dcp__crc32_impl(-1);
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (uint8_t)rnd();
    for (int level = 0; level <= top; level++) {
        ASSERT_EQ(dcp__crc32_impl(level), level);
        for (size_t k = 0; k < sizeof(lens) / sizeof(lens[0]); k++) {
            for (size_t off = 0; off < 3; off++) {
                size_t n = lens[k], so = off * 7, d_o = off ? off * 5 : 0;
                uint32_t seed = off == 2 ? 0x12345678u : 0;
                uint32_t want = ref_crc32(seed, src + so, n);
                ASSERT_EQ(dcp__crc32(seed, src + so, n), want);
                memset(dst, 0x5A, sizeof dst);
                ASSERT_EQ(dcp__crc32_copy(seed, dst + d_o, src + so, n), want);
                ASSERT_MEM_EQ(dst + d_o, src + so, n);
                ASSERT_EQ(dst[d_o + n], 0x5A);
            }
        }
    }
    dcp__crc32_impl(3); /* the default cap: the best there is */
}

int main(void)
{
    RUN(check_value);
    RUN(known_vectors);
    RUN(incremental_equals_one_shot);
    RUN(random_lengths_and_alignments);
    RUN(copy_copies_and_matches);
    RUN(combine_matches_concatenation);
    RUN(blocks_in_any_pieces);
    RUN(every_implementation);
    return TEST_SUMMARY();
}
