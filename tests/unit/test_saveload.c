/*
 * Single-process save and load through the public API: every dtype, 0-d and
 * empty tensors, several boxes per tensor, boxes spanning stored chunks,
 * values, strictness, partial loads, casts, verify, overwrite safety and
 * bad input.
 */
#include <dcp/dcp.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

static char root[256];

static void make_root(void)
{
    if (!root[0]) {
        strcpy(root, "/tmp/dcp-test-saveload-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
}

static const char *dirpath(const char *name)
{
    static char buf[4][512];
    static int k;
    make_root();
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

static void pattern(void *p, size_t n, unsigned seed, int is_bool)
{
    unsigned char *b = p;
    size_t i;
    for (i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        b[i] = (unsigned char)(seed >> 16);
        if (is_bool)
            b[i] &= 1;
    }
}

static const dcp_dtype all_dtypes[] = {
    DCP_F64, DCP_F32, DCP_F16, DCP_BF16, DCP_F8_E4M3FN, DCP_F8_E5M2,
    DCP_I64, DCP_I32, DCP_I16, DCP_I8,  DCP_U8,        DCP_BOOL};

TEST(roundtrip_all_dtypes)
{
    dcp_ctx *ctx;
    dcp_state *st, *st2;
    const char *dir = dirpath("dtypes");
    unsigned char *src[12], *dst[12];
    int64_t shape[3] = {3, 4, 5};
    size_t i, n = 60;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_create(&st2));
    for (i = 0; i < 12; i++) {
        size_t nb = n * dcp_dtype_size(all_dtypes[i]);
        src[i] = malloc(nb);
        dst[i] = calloc(1, nb);
        pattern(src[i], nb, (unsigned)i + 7, all_dtypes[i] == DCP_BOOL);
        ASSERT_OK(dcp_state_add_tensor(st, dcp_dtype_name(all_dtypes[i]),
                                       all_dtypes[i], 3, shape, NULL, NULL,
                                       src[i], DCP_MEM_HOST));
        ASSERT_OK(dcp_state_add_tensor(st2, dcp_dtype_name(all_dtypes[i]),
                                       all_dtypes[i], 3, shape, NULL, NULL,
                                       dst[i], DCP_MEM_HOST));
    }
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    ASSERT_OK(dcp_load(ctx, st2, dir, NULL));
    for (i = 0; i < 12; i++) {
        ASSERT_MEM_EQ(src[i], dst[i], n * dcp_dtype_size(all_dtypes[i]));
        free(src[i]);
        free(dst[i]);
    }
    ASSERT_OK(dcp_verify(ctx, dir));
    dcp_state_free(st);
    dcp_state_free(st2);
    dcp_ctx_free(ctx);
}

TEST(scalar_empty_and_8d)
{
    dcp_ctx *ctx;
    dcp_state *st, *st2;
    const char *dir = dirpath("shapes");
    double s = 3.25, s2 = 0;
    int64_t eshape[2] = {0, 5};
    int64_t shape8[8] = {2, 1, 2, 1, 2, 1, 2, 3};
    int32_t big[48], big2[48];
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_create(&st2));
    pattern(big, sizeof(big), 3, 0);
    memset(big2, 0, sizeof(big2));
    ASSERT_OK(dcp_state_add_tensor(st, "s", DCP_F64, 0, NULL, NULL, NULL, &s,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st, "e", DCP_F32, 2, eshape, NULL, NULL,
                                   NULL, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st, "d8", DCP_I32, 8, shape8, NULL, NULL,
                                   big, DCP_MEM_HOST));
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    ASSERT_OK(dcp_state_add_tensor(st2, "s", DCP_F64, 0, NULL, NULL, NULL, &s2,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st2, "e", DCP_F32, 2, eshape, NULL, NULL,
                                   NULL, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st2, "d8", DCP_I32, 8, shape8, NULL, NULL,
                                   big2, DCP_MEM_HOST));
    ASSERT_OK(dcp_load(ctx, st2, dir, NULL));
    ASSERT(s2 == 3.25);
    ASSERT_MEM_EQ(big, big2, sizeof(big));
    ASSERT_OK(dcp_verify(ctx, dir));
    dcp_state_free(st);
    dcp_state_free(st2);
    dcp_ctx_free(ctx);
}

/* A 10x6 tensor saved as rows 3/4/3 and loaded as a box spanning all. */
TEST(boxes_and_reshard)
{
    dcp_ctx *ctx;
    dcp_state *st, *st2, *st3;
    const char *dir = dirpath("boxes");
    float full[60], box[4 * 5], col[10 * 2];
    int64_t shape[2] = {10, 6};
    int64_t o[3][2] = {{0, 0}, {3, 0}, {7, 0}}, s[3][2] = {{3, 6}, {4, 6}, {3, 6}};
    int64_t bo[2] = {2, 1}, bs[2] = {4, 5}, co[2] = {0, 4}, cs[2] = {10, 2};
    int i, r, c;
    for (i = 0; i < 60; i++)
        full[i] = (float)i * 0.5f;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    for (i = 0; i < 3; i++)
        ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, o[i], s[i],
                                       full + o[i][0] * 6, DCP_MEM_HOST));
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    ASSERT_OK(dcp_verify(ctx, dir));
    /* Two boxes of one tensor in one load: a block and a column strip. */
    ASSERT_OK(dcp_state_create(&st2));
    ASSERT_OK(dcp_state_add_tensor(st2, "w", DCP_F32, 2, shape, bo, bs, box,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st2, "w", DCP_F32, 2, shape, co, cs, col,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_load(ctx, st2, dir, NULL));
    for (r = 0; r < 4; r++)
        for (c = 0; c < 5; c++)
            ASSERT(box[r * 5 + c] == full[(2 + r) * 6 + 1 + c]);
    for (r = 0; r < 10; r++)
        for (c = 0; c < 2; c++)
            ASSERT(col[r * 2 + c] == full[r * 6 + 4 + c]);
    /* Boxes that leave a gap cannot be saved. */
    ASSERT_OK(dcp_state_create(&st3));
    ASSERT_OK(dcp_state_add_tensor(st3, "w", DCP_F32, 2, shape, o[0], s[0],
                                   full, DCP_MEM_HOST));
    ASSERT_RC(dcp_save(ctx, st3, dirpath("gap"), NULL), DCP_EPLAN);
    ASSERT(strstr(dcp_errmsg(ctx), "'w'") != NULL);
    /* Overlapping boxes cannot be saved either. */
    ASSERT_OK(dcp_state_add_tensor(st3, "w", DCP_F32, 2, shape, o[0], s[1],
                                   full, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st3, "w", DCP_F32, 2, shape, o[2], s[2],
                                   full, DCP_MEM_HOST));
    ASSERT_RC(dcp_save(ctx, st3, dirpath("overlap"), NULL), DCP_EPLAN);
    dcp_state_free(st);
    dcp_state_free(st2);
    dcp_state_free(st3);
    dcp_ctx_free(ctx);
}

TEST(values_and_nesting)
{
    dcp_ctx *ctx;
    dcp_state *st, *st2;
    dcp_metadata *md;
    const char *dir = dirpath("values");
    dcp_value *d = dcp_value_dict(), *l = dcp_value_list(), *t;
    dcp_value *groups = dcp_value_list(), *g = dcp_value_dict();
    const dcp_value *got;
    const char *s;
    int64_t num;
    long idx;
    t = dcp_value_tuple();
    dcp_value_append(t, dcp_value_float(0.9));
    dcp_value_append(t, dcp_value_float(0.999));
    dcp_value_append(l, dcp_value_int(-5));
    dcp_value_append(l, dcp_value_bytes("\x00\xff\x80", 3));
    dcp_value_append(l, dcp_value_none());
    dcp_value_dict_set(d, "lst", l);
    dcp_value_dict_set(d, "betas", t);
    dcp_value_dict_set(d, "name", dcp_value_str("h\xc3\xa9llo"));
    dcp_value_dict_set(d, "big", dcp_value_int(INT64_MIN));
    dcp_value_dict_set(d, "flag", dcp_value_bool(1));
    dcp_value_dict_set(g, "lr", dcp_value_float(1e-3));
    dcp_value_append(groups, g);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_push(st, "optim"));
    ASSERT_OK(dcp_state_add_value(st, "hp", d));
    ASSERT_OK(dcp_state_add_value(st, "param_groups", groups));
    ASSERT_OK(dcp_state_pop(st));
    ASSERT_RC(dcp_state_pop(st), DCP_EINVAL);
    ASSERT_EQ(dcp_state_count(st), 6);
    ASSERT_STR_EQ(dcp_state_key(st, 5), "optim.param_groups.0.lr");
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    /* planner_data records the nesting, with an int for the list index. */
    ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
    idx = dcp_metadata_find(md, "optim.param_groups.0.lr");
    ASSERT(idx >= 0);
    ASSERT_OK(dcp_metadata_path(md, (size_t)idx, 2, &s, &num));
    ASSERT(s == NULL && num == 0);
    ASSERT_OK(dcp_metadata_path(md, (size_t)idx, 3, &s, &num));
    ASSERT_STR_EQ(s, "lr");
    dcp_metadata_free(md);
    /* Load into templates and compare. */
    ASSERT_OK(dcp_state_create(&st2));
    ASSERT_OK(dcp_state_add_value(st2, "optim.hp.lst", dcp_value_none()));
    ASSERT_OK(dcp_state_add_value(st2, "optim.hp.betas", dcp_value_none()));
    ASSERT_OK(dcp_state_add_value(st2, "optim.hp.name", dcp_value_none()));
    ASSERT_OK(dcp_state_add_value(st2, "optim.hp.big", dcp_value_none()));
    ASSERT_OK(dcp_state_add_value(st2, "optim.hp.flag", dcp_value_none()));
    ASSERT_OK(dcp_state_add_value(st2, "optim.param_groups.0.lr",
                                  dcp_value_none()));
    ASSERT_OK(dcp_load(ctx, st2, dir, NULL));
    got = dcp_state_value(st2, "optim.hp.lst");
    ASSERT_EQ(dcp_value_type_of(got), DCP_VALUE_LIST);
    ASSERT_EQ(dcp_value_len(got), 3);
    ASSERT_EQ(dcp_value_as_int(dcp_value_item(got, 0)), -5);
    {
        size_t n;
        const void *b = dcp_value_as_bytes(dcp_value_item(got, 1), &n);
        ASSERT_EQ(n, 3);
        ASSERT_MEM_EQ(b, "\x00\xff\x80", 3);
    }
    ASSERT_EQ(dcp_value_type_of(dcp_value_item(got, 2)), DCP_VALUE_NONE);
    got = dcp_state_value(st2, "optim.hp.betas");
    ASSERT_EQ(dcp_value_type_of(got), DCP_VALUE_TUPLE);
    ASSERT(dcp_value_as_float(dcp_value_item(got, 1)) == 0.999);
    ASSERT_STR_EQ(dcp_value_as_str(dcp_state_value(st2, "optim.hp.name"), NULL),
                  "h\xc3\xa9llo");
    ASSERT(dcp_value_as_int(dcp_state_value(st2, "optim.hp.big")) ==
           INT64_MIN);
    ASSERT_EQ(dcp_value_as_bool(dcp_state_value(st2, "optim.hp.flag")), 1);
    ASSERT_OK(dcp_verify(ctx, dir));
    dcp_state_free(st);
    dcp_state_free(st2);
    dcp_ctx_free(ctx);
}

static int save_simple(dcp_ctx *ctx, const char *dir, float *w, int64_t n)
{
    dcp_state *st;
    int rc;
    if (dcp_state_create(&st))
        return DCP_ENOMEM;
    rc = dcp_state_add_tensor(st, "w", DCP_F32, 1, &n, NULL, NULL, w,
                              DCP_MEM_HOST);
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "step", dcp_value_int(7));
    if (rc == DCP_OK)
        rc = dcp_save(ctx, st, dir, NULL);
    dcp_state_free(st);
    return rc;
}

TEST(strict_partial_and_cast)
{
    dcp_ctx *ctx;
    dcp_state *st;
    const char *dir = dirpath("strict");
    float w[4] = {1.5f, -2.0f, 3.0f, 1e10f}, got[4] = {0};
    uint16_t bf[4] = {0};
    int64_t n = 4, n5 = 5;
    const char *const *keys;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_simple(ctx, dir, w, 4));
    /* Missing key. */
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &n, NULL, NULL, got,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_value(st, "step", dcp_value_none()));
    ASSERT_OK(dcp_state_add_value(st, "nope", dcp_value_none()));
    ASSERT_RC(dcp_load(ctx, st, dir, NULL), DCP_EKEY);
    ASSERT(strstr(dcp_errmsg(ctx), "'nope'") != NULL);
    ASSERT(got[0] == 0.0f); /* nothing changed */
    {
        dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, NULL};
        ASSERT_OK(dcp_load(ctx, st, dir, &lo));
        ASSERT_EQ(dcp_load_report(ctx, 0, &keys), 1);
        ASSERT_STR_EQ(keys[0], "nope");
        ASSERT_EQ(dcp_load_report(ctx, 1, &keys), 0);
        ASSERT_MEM_EQ(got, w, sizeof(w));
    }
    dcp_state_free(st);
    /* Unexpected key: the checkpoint has "step", the state does not. */
    memset(got, 0, sizeof(got));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &n, NULL, NULL, got,
                                   DCP_MEM_HOST));
    ASSERT_RC(dcp_load(ctx, st, dir, NULL), DCP_EKEY);
    ASSERT(strstr(dcp_errmsg(ctx), "'step'") != NULL);
    ASSERT(got[0] == 0.0f);
    dcp_state_free(st);
    /* Shape mismatch, found before any buffer changes. */
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_value(st, "step", dcp_value_none()));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &n5, NULL, NULL, got,
                                   DCP_MEM_HOST));
    ASSERT_RC(dcp_load(ctx, st, dir, NULL), DCP_EMISMATCH);
    ASSERT(strstr(dcp_errmsg(ctx), "shape") != NULL);
    ASSERT(dcp_value_type_of(dcp_state_value(st, "step")) == DCP_VALUE_NONE);
    dcp_state_free(st);
    /* dtype mismatch is an error unless a cast is asked for. */
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_value(st, "step", dcp_value_none()));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_BF16, 1, &n, NULL, NULL, bf,
                                   DCP_MEM_HOST));
    ASSERT_RC(dcp_load(ctx, st, dir, NULL), DCP_EMISMATCH);
    ASSERT(strstr(dcp_errmsg(ctx), "dtype") != NULL);
    {
        dcp_load_options lo = {sizeof(lo), DCP_LOAD_CAST, NULL};
        ASSERT_OK(dcp_load(ctx, st, dir, &lo));
        ASSERT_EQ(bf[0], 0x3FC0); /* 1.5 */
        ASSERT_EQ(bf[1], 0xC000); /* -2 */
        ASSERT_EQ(bf[2], 0x4040); /* 3 */
        ASSERT_EQ(bf[3], 0x5015); /* 1e10 rounded to nearest even */
    }
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

static void flip_byte(const char *path, long off)
{
    int fd = open(path, O_RDWR);
    unsigned char b;
    if (fd < 0 || pread(fd, &b, 1, off) != 1)
        abort();
    b ^= 0x10;
    if (pwrite(fd, &b, 1, off) != 1)
        abort();
    close(fd);
}

static long file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

TEST(verify_catches_every_flipped_data_byte)
{
    dcp_ctx *ctx;
    dcp_metadata *md;
    dcp_chunk_info ci;
    const char *dir = dirpath("flip");
    char file[600];
    float w[16];
    long idx, off, tested = 0;
    int i;
    for (i = 0; i < 16; i++)
        w[i] = (float)i;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_simple(ctx, dir, w, 16));
    ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
    idx = dcp_metadata_find(md, "w");
    ASSERT_OK(dcp_metadata_chunk(md, (size_t)idx, 0, &ci));
    snprintf(file, sizeof(file), "%s/%s", dir, ci.file);
    /* Flip each byte of the record's stored tensor data in turn. */
    for (off = (long)ci.offset; off < (long)(ci.offset + ci.length); off++) {
        float probe[16];
        flip_byte(file, off);
        memset(probe, 0, sizeof(probe));
        if (dcp_metadata_read_box(ctx, md, (size_t)idx, NULL, NULL, probe,
                                  sizeof(probe), 0) == DCP_OK &&
            memcmp(probe, w, sizeof(w)) != 0) {
            /* this byte is tensor data: verify must catch it */
            ASSERT_RC(dcp_verify(ctx, dir), DCP_ECORRUPT);
            ASSERT(strstr(dcp_errmsg(ctx), "'w'") != NULL);
            ASSERT(strstr(dcp_errmsg(ctx), ci.file) != NULL);
            tested++;
        } else {
            /* any other byte: verify must not pass silently with wrong
             * data, and must not crash */
            (void)dcp_verify(ctx, dir);
        }
        flip_byte(file, off);
    }
    ASSERT(tested >= 64); /* the 64 data bytes, at least */
    ASSERT_OK(dcp_verify(ctx, dir));
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
}

/* The file offset of the first n bytes equal to pat in path, or -1. */
static long find_bytes(const char *path, const void *pat, size_t n)
{
    long size = file_size(path), off = -1, i;
    unsigned char *b = malloc(size > 0 ? (size_t)size : 1);
    FILE *fp = fopen(path, "rb");
    if (!b || !fp || fread(b, 1, (size_t)size, fp) != (size_t)size)
        abort();
    fclose(fp);
    for (i = 0; off < 0 && i + (long)n <= size; i++)
        if (memcmp(b + i, pat, n) == 0)
            off = i;
    free(b);
    return off;
}

/* Loads rows [r0, r0 + nr) of the 1280 x 1024 tensor "w" into out, through
 * dcp_load (batched reads) or dcp_metadata_read_box. */
static int load_rows(dcp_ctx *ctx, const char *dir, int64_t r0, int64_t nr,
                     float *out, int via_box)
{
    int64_t shape[2] = {1280, 1024}, o[2] = {r0, 0}, s[2] = {nr, 1024};
    dcp_metadata *md;
    dcp_state *st;
    int rc;
    if (via_box) {
        rc = dcp_metadata_open(ctx, dir, &md);
        if (rc != DCP_OK)
            return rc;
        rc = dcp_metadata_read_box(ctx, md, (size_t)dcp_metadata_find(md, "w"),
                                   o, s, out,
                                   (size_t)nr * 1024 * sizeof(float), 1);
        dcp_metadata_free(md);
        return rc;
    }
    if (dcp_state_create(&st))
        return DCP_ENOMEM;
    rc = dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, o, s, out,
                              DCP_MEM_HOST);
    if (rc == DCP_OK)
        rc = dcp_load(ctx, st, dir, NULL);
    dcp_state_free(st);
    return rc;
}

/*
 * Block CRCs (docs/FORMAT.md §4): a box overlapping part of a stored chunk
 * reads and checks only the 1 MiB blocks it overlaps. A corrupted block
 * outside the box goes unnoticed by that load (it is not read), is caught
 * by a load that overlaps it and by dcp_verify, both naming the file, the
 * block and its byte offset.
 */
TEST(partial_reads_check_only_their_blocks)
{
    dcp_ctx *ctx;
    dcp_metadata *md;
    dcp_chunk_info ci;
    dcp_state *st;
    const char *dir = dirpath("blocks");
    const int64_t rows = 1280, cols = 1024; /* 5 MiB: 5 blocks */
    int64_t shape[2] = {1280, 1024};
    float *w = malloc((size_t)(rows * cols) * sizeof(float));
    float *got = malloc((size_t)(rows * cols) * sizeof(float));
    char file[600], want[128];
    long data, bad;
    int via;
    ASSERT(w && got);
    pattern(w, (size_t)(rows * cols) * sizeof(float), 77, 0);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, NULL, NULL, w,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    dcp_state_free(st);
    ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
    ASSERT_OK(dcp_metadata_chunk(md, (size_t)dcp_metadata_find(md, "w"), 0,
                                 &ci));
    snprintf(file, sizeof(file), "%s/%s", dir, ci.file);
    data = find_bytes(file, w, 64);
    ASSERT(data > 0 && data % 4096 == 0);
    /* Block 3 holds rows 768..1023; flip a byte in row 800. */
    bad = data + (3L << 20) + 32L * 4096 + 5;
    flip_byte(file, bad);
    for (via = 0; via < 2; via++) {
        /* Rows 0..255 (block 0) and 1024..1279 (block 4): fine. */
        memset(got, 0, (size_t)(rows * cols) * sizeof(float));
        ASSERT_OK(load_rows(ctx, dir, 0, 256, got, via));
        ASSERT_MEM_EQ(got, w, 256 * 1024 * sizeof(float));
        ASSERT_OK(load_rows(ctx, dir, 1100, 180, got, via));
        ASSERT_MEM_EQ(got, w + 1100 * 1024, 180 * 1024 * sizeof(float));
        /* Rows 700..799 (blocks 2 and 3): block 3 is bad. */
        ASSERT_RC(load_rows(ctx, dir, 700, 100, got, via), DCP_ECORRUPT);
        ASSERT(strstr(dcp_errmsg(ctx), "'w'") != NULL);
        ASSERT(strstr(dcp_errmsg(ctx), ci.file) != NULL);
        ASSERT(strstr(dcp_errmsg(ctx), "block 3 ") != NULL);
        snprintf(want, sizeof(want), "block at byte %ld,", data + (3L << 20));
        ASSERT(strstr(dcp_errmsg(ctx), want) != NULL);
    }
    /* The whole tensor, and dcp_verify: the same block. */
    ASSERT_RC(load_rows(ctx, dir, 0, rows, got, 0), DCP_ECORRUPT);
    ASSERT(strstr(dcp_errmsg(ctx), want) != NULL);
    ASSERT_RC(dcp_verify(ctx, dir), DCP_ECORRUPT);
    ASSERT(strstr(dcp_errmsg(ctx), ci.file) != NULL);
    ASSERT(strstr(dcp_errmsg(ctx), want) != NULL);
    flip_byte(file, bad);
    ASSERT_OK(dcp_verify(ctx, dir));
    ASSERT_OK(load_rows(ctx, dir, 0, rows, got, 0));
    ASSERT_MEM_EQ(got, w, (size_t)(rows * cols) * sizeof(float));
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    free(w);
    free(got);
}

TEST(overwrite_keeps_old_until_commit)
{
    dcp_ctx *ctx;
    dcp_state *st;
    const char *dir = dirpath("overwrite");
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, got[4];
    int64_t n = 4;
    char path[600];
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_simple(ctx, dir, a, 4));
    snprintf(path, sizeof(path), "%s/__0_0.distcp", dir);
    ASSERT(file_size(path) > 0);
    /* A second save must not touch the committed files. */
    ASSERT_OK(save_simple(ctx, dir, b, 4));
    ASSERT(file_size(path) < 0); /* old data file removed after commit */
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &n, NULL, NULL, got,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_value(st, "step", dcp_value_none()));
    ASSERT_OK(dcp_load(ctx, st, dir, NULL));
    ASSERT_MEM_EQ(got, b, sizeof(b));
    /* Third save goes back to the plain name; still correct. */
    ASSERT_OK(save_simple(ctx, dir, a, 4));
    ASSERT_OK(dcp_load(ctx, st, dir, NULL));
    ASSERT_MEM_EQ(got, a, sizeof(a));
    ASSERT_OK(dcp_verify(ctx, dir));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(bad_input)
{
    dcp_ctx *ctx;
    dcp_metadata *md = NULL;
    const char *dir = dirpath("bad");
    char path[600];
    float w[4] = {1, 2, 3, 4};
    int fd;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_RC(dcp_metadata_open(ctx, dirpath("does-not-exist"), &md),
              DCP_ENOENT);
    ASSERT(strstr(dcp_errmsg(ctx), "does-not-exist") != NULL);
    ASSERT_OK(save_simple(ctx, dir, w, 4));
    /* Truncated data file. */
    snprintf(path, sizeof(path), "%s/__0_0.distcp", dir);
    ASSERT_EQ(truncate(path, file_size(path) - 10), 0);
    ASSERT_RC(dcp_verify(ctx, dir), DCP_ECORRUPT);
    ASSERT(strstr(dcp_errmsg(ctx), "truncated") != NULL);
    /* Truncated .metadata. */
    snprintf(path, sizeof(path), "%s/.metadata", dir);
    ASSERT_EQ(truncate(path, file_size(path) / 2), 0);
    ASSERT_RC(dcp_verify(ctx, dir), DCP_EFORMAT);
    /* Missing .metadata: an interrupted save. */
    ASSERT_EQ(unlink(path), 0);
    ASSERT_RC(dcp_verify(ctx, dir), DCP_ENOENT);
    /* A pickle that names os.system is refused; nothing runs. */
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT(fd >= 0);
    {
        static const char evil[] = "\x80\x02" "cos\nsystem\n"
                                   "X\x05\x00\x00\x00touch"
                                   "\x85R.";
        ASSERT_EQ(write(fd, evil, sizeof(evil) - 1), (long)sizeof(evil) - 1);
    }
    close(fd);
    ASSERT_RC(dcp_metadata_open(ctx, dir, &md), DCP_EUNSAFE);
    ASSERT(strstr(dcp_errmsg(ctx), "os.system") != NULL);
    ASSERT(md == NULL);
    dcp_ctx_free(ctx);
}

/* {"buffers": [t0, t1]}: leaves at list indices, path ("buffers", i). */
TEST(list_index_leaves)
{
    dcp_ctx *ctx;
    dcp_state *st;
    dcp_metadata *md;
    const char *s = "x";
    int64_t num = -1, n = 2;
    float t0[2] = {1, 2}, t1[2] = {3, 4};
    long idx;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_RC(dcp_state_add_tensor(st, NULL, DCP_F32, 1, &n, NULL, NULL, t0,
                                   DCP_MEM_HOST),
              DCP_EINVAL);
    ASSERT_OK(dcp_state_push(st, "buffers"));
    ASSERT_OK(dcp_state_push_index(st, 0));
    ASSERT_OK(dcp_state_add_tensor(st, NULL, DCP_F32, 1, &n, NULL, NULL, t0,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_pop(st));
    ASSERT_OK(dcp_state_push_index(st, 1));
    ASSERT_OK(dcp_state_add_tensor(st, NULL, DCP_F32, 1, &n, NULL, NULL, t1,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_pop(st));
    ASSERT_OK(dcp_state_push_index(st, 2));
    ASSERT_OK(dcp_state_add_value(st, NULL, dcp_value_int(5)));
    ASSERT_OK(dcp_state_pop(st));
    ASSERT_OK(dcp_state_pop(st));
    ASSERT_STR_EQ(dcp_state_key(st, 1), "buffers.1");
    ASSERT_STR_EQ(dcp_state_key(st, 2), "buffers.2");
    ASSERT_OK(dcp_save(ctx, st, dirpath("listidx"), NULL));
    ASSERT_OK(dcp_metadata_open(ctx, dirpath("listidx"), &md));
    idx = dcp_metadata_find(md, "buffers.1");
    ASSERT(idx >= 0);
    ASSERT_OK(dcp_metadata_path(md, (size_t)idx, 1, &s, &num));
    ASSERT(s == NULL);
    ASSERT_EQ(num, 1);
    dcp_metadata_free(md);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(bad_arguments)
{
    dcp_state *st;
    int64_t shape[2] = {4, 4}, off[2] = {2, 0}, size[2] = {3, 4};
    float buf[16];
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_RC(dcp_state_add_tensor(st, "x", DCP_F32, 2, shape, off, size, buf,
                                   DCP_MEM_HOST),
              DCP_EINVAL);
    ASSERT_RC(dcp_state_add_tensor(st, "x", (dcp_dtype)99, 2, shape, NULL,
                                   NULL, buf, DCP_MEM_HOST),
              DCP_EINVAL);
    ASSERT_RC(dcp_state_add_tensor(st, "x", DCP_F32, 9, shape, NULL, NULL,
                                   buf, DCP_MEM_HOST),
              DCP_EINVAL);
    ASSERT_OK(dcp_state_add_tensor(st, "x", DCP_F32, 2, shape, NULL, NULL,
                                   buf, DCP_MEM_HOST));
    ASSERT_RC(dcp_state_add_tensor(st, "x", DCP_I32, 2, shape, NULL, NULL,
                                   buf, DCP_MEM_HOST),
              DCP_EINVAL);
    ASSERT_RC(dcp_state_add_value(st, "x", dcp_value_int(1)), DCP_EINVAL);
    ASSERT_RC(dcp_state_add_value(st, "y", NULL), DCP_ENOMEM);
    dcp_state_free(st);
    ASSERT_RC(dcp_save(NULL, NULL, NULL, NULL), DCP_EINVAL);
    ASSERT_STR_EQ(dcp_err_name(DCP_EUNSAFE), "DCP_EUNSAFE");
    ASSERT_STR_EQ(dcp_strerror(DCP_ECORRUPT),
                  "checksum mismatch or truncated data");
}

int main(void)
{
    RUN(roundtrip_all_dtypes);
    RUN(scalar_empty_and_8d);
    RUN(boxes_and_reshard);
    RUN(values_and_nesting);
    RUN(strict_partial_and_cast);
    RUN(verify_catches_every_flipped_data_byte);
    RUN(partial_reads_check_only_their_blocks);
    RUN(overwrite_keeps_old_until_commit);
    RUN(bad_input);
    RUN(list_index_leaves);
    RUN(bad_arguments);
    return TEST_SUMMARY();
}
