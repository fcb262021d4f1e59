/*
 * ZStandard frames (src/format/zframe.c), the "stream.zstd/1" record
 * transform: round trip, and hostile frames refused with DCP_ECORRUPT --
 * damaged, truncated, trailing garbage, not zstd at all, a stated content
 * size past the bound, and frames that expand past the bound without
 * stating it (a zip bomb). Skipped (passes) when built without libzstd.
 */
#include <stdint.h>
#include <string.h>

#include "util.h"
#include "zframe.h"
#include "test.h"

static uint8_t plain[300000];

static void fill(void)
{
    size_t i;
    uint32_t x = 12345;
    for (i = 0; i < sizeof(plain); i++) {
        x = x * 1103515245u + 12345u;
        /* compressible, but not trivially */
        plain[i] = (uint8_t)(i % 7 == 0 ? (x >> 24) : (i / 1000));
    }
}

static int have_zstd(void)
{
    struct dcp_buf b = {0};
    int rc = dcp__zstd_encode(plain, 10, 3, &b, NULL);
    dcp__buf_free(&b);
    return rc == DCP_OK;
}

static int decode(const struct dcp_buf *b, size_t len, uint64_t max, size_t *n)
{
    uint8_t *out = NULL;
    struct dcp_err err = {0};
    int rc = dcp__zstd_decode(b->p, len, max, &out, n, &err);
    /* what came out is the plain text; nothing comes out of a failure */
    if (rc == DCP_OK && *n && memcmp(out, plain, *n) != 0)
        rc = 1;
    if (rc != DCP_OK && out)
        rc = 2;
    dcp__free(out);
    return rc;
}

TEST(descriptor)
{
    ASSERT(dcp__zstd_descriptor_ok("stream.zstd/1"));
    ASSERT(dcp__zstd_descriptor_ok("stream.zstd/1.2"));
    ASSERT(!dcp__zstd_descriptor_ok("stream.zstd/2"));
    ASSERT(!dcp__zstd_descriptor_ok("stream.zstd/10"));
    ASSERT(!dcp__zstd_descriptor_ok("stream.zstd"));
    ASSERT(!dcp__zstd_descriptor_ok("stream.gzip/1"));
}

TEST(round_trip_and_bound)
{
    struct dcp_buf b = {0};
    size_t n = 0;
    if (!have_zstd())
        return;
    ASSERT_OK(dcp__zstd_encode(plain, sizeof(plain), 3, &b, NULL));
    ASSERT(b.len < sizeof(plain));
    ASSERT_EQ(decode(&b, b.len, sizeof(plain), &n), DCP_OK);
    ASSERT_U64_EQ(n, sizeof(plain));
    /* the frame states its size: one byte less is refused up front */
    ASSERT_EQ(decode(&b, b.len, sizeof(plain) - 1, &n), DCP_ECORRUPT);
    dcp__buf_free(&b);
    /* an empty record */
    ASSERT_OK(dcp__zstd_encode(plain, 0, 3, &b, NULL));
    ASSERT_EQ(decode(&b, b.len, 0, &n), DCP_OK);
    ASSERT_U64_EQ(n, 0);
    dcp__buf_free(&b);
}

TEST(hostile_frames)
{
    struct dcp_buf b = {0};
    size_t n = 0, len;
    if (!have_zstd())
        return;
    ASSERT_OK(dcp__zstd_encode(plain, sizeof(plain), 3, &b, NULL));
    len = b.len;
    /* truncated: every cut is refused */
    ASSERT_EQ(decode(&b, len - 1, sizeof(plain), &n), DCP_ECORRUPT);
    ASSERT_EQ(decode(&b, len / 2, sizeof(plain), &n), DCP_ECORRUPT);
    ASSERT_EQ(decode(&b, 3, sizeof(plain), &n), DCP_ECORRUPT);
    ASSERT_EQ(decode(&b, 0, sizeof(plain), &n), DCP_ECORRUPT);
    /* trailing garbage after the frame */
    ASSERT_OK(dcp__buf_put(&b, "garbage!", 8));
    ASSERT_EQ(decode(&b, b.len, sizeof(plain) + 100, &n), DCP_ECORRUPT);
    b.len = len;
    /* a damaged byte in the middle: the frame checksum (or the entropy
     * decoder) catches it */
    b.p[len / 2] ^= 0x40;
    ASSERT_EQ(decode(&b, len, sizeof(plain), &n), DCP_ECORRUPT);
    b.p[len / 2] ^= 0x40;
    /* not zstd at all */
    b.p[0] ^= 0xFF;
    ASSERT_EQ(decode(&b, len, sizeof(plain), &n), DCP_ECORRUPT);
    b.p[0] ^= 0xFF;
    ASSERT_EQ(decode(&b, len, sizeof(plain), &n), DCP_OK);
    dcp__buf_free(&b);
}

TEST(bomb_without_stated_size)
{
    /* Two frames: the first states 1000 bytes (within the bound), the
     * second expands past it; only streaming output can tell. */
    static uint8_t zeros[1 << 20];
    struct dcp_buf b = {0};
    uint8_t *out = NULL;
    size_t n = 0;
    if (!have_zstd())
        return;
    ASSERT_OK(dcp__zstd_encode(zeros, 1000, 3, &b, NULL));
    ASSERT_OK(dcp__zstd_encode(zeros, sizeof(zeros), 19, &b, NULL));
    ASSERT(b.len < 1000);
    ASSERT_EQ(dcp__zstd_decode(b.p, b.len, 4096, &out, &n, NULL), DCP_ECORRUPT);
    ASSERT(out == NULL);
    ASSERT_EQ(
        dcp__zstd_decode(b.p, b.len, 1000 + sizeof(zeros), &out, &n, NULL),
        DCP_OK);
    ASSERT_U64_EQ(n, 1000 + sizeof(zeros));
    dcp__free(out);
    dcp__buf_free(&b);
}

int main(void)
{
    fill();
    RUN(descriptor);
    RUN(round_trip_and_bound);
    RUN(hostile_frames);
    RUN(bomb_without_stated_size);
    return TEST_SUMMARY();
}
