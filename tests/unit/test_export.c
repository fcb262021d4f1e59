/*
 * dcp_export / dcp_import / dcp_load_file in one process: tensors stored
 * in several chunks (column and row boxes) streamed through a 1 MiB memory
 * limit (many slabs per tensor, slabs cutting chunks), round trips through
 * both formats bit-exact, casts and their refusals, key filters and
 * renaming, a corrupted chunk, and a write failure in the middle of an
 * export or import (the file size limit, as a full disk would): a clean
 * error and no output left behind.
 */
#include "test.h"

#include <dcp/dcp_convert.h>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Built with ASan (the timing bound below is looser there). */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#ifndef TEST_SANITIZED
#define TEST_SANITIZED 0
#endif

static char root[256];

#define ROWS 700
#define COLS 300 /* 700 x 300 f32: 840 KB, several 128 KiB slabs */

static float big[ROWS][COLS];
static int64_t idx[1000];
static double tiny[3] = {1.0, -2.5, 1e10};

static void path(char *out, size_t cap, const char *name)
{
    (void)snprintf(out, cap, "%s/%s", root, name);
}

/* A checkpoint holding "big" as 4 boxes (2 row bands x 2 column bands),
 * "idx" in 3 row boxes, "tiny" (f64) and a value. */
static int make_ckpt(const char *dir)
{
    int64_t bs[2] = {ROWS, COLS}, is[1] = {1000}, ts[1] = {3};
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    int r, c, rc;
    static float boxes[4][ROWS / 2][COLS / 2];
    for (r = 0; r < ROWS; r++)
        for (c = 0; c < COLS; c++)
            big[r][c] = (float)(r * 1000 + c) * 0.5f;
    for (r = 0; r < 1000; r++)
        idx[r] = (int64_t)r * 7919 - 3;
    rc = dcp_ctx_create(&ctx, NULL, NULL);
    if (rc == DCP_OK)
        rc = dcp_state_create(&st);
    if (rc == DCP_OK)
        rc = dcp_state_push(st, "model");
    for (r = 0; rc == DCP_OK && r < 4; r++) {
        int64_t off[2] = {(r / 2) * (ROWS / 2), (r % 2) * (COLS / 2)};
        int64_t sz[2] = {ROWS / 2, COLS / 2}, i, j;
        for (i = 0; i < sz[0]; i++)
            for (j = 0; j < sz[1]; j++)
                boxes[r][i][j] = big[off[0] + i][off[1] + j];
        rc = dcp_state_add_tensor(st, "big", DCP_F32, 2, bs, off, sz, boxes[r],
                                  DCP_MEM_HOST);
    }
    for (r = 0; rc == DCP_OK && r < 3; r++) {
        int64_t off[1] = {r * 400}, sz[1] = {r < 2 ? 400 : 200};
        rc = dcp_state_add_tensor(st, "idx", DCP_I64, 1, is, off, sz,
                                  idx + off[0], DCP_MEM_HOST);
    }
    if (rc == DCP_OK)
        rc = dcp_state_pop(st);
    if (rc == DCP_OK)
        rc = dcp_state_add_tensor(st, "tiny", DCP_F64, 1, ts, NULL, NULL, tiny,
                                  DCP_MEM_HOST);
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "step", dcp_value_int(9));
    if (rc == DCP_OK)
        rc = dcp_save(ctx, st, dir, NULL);
    if (rc != DCP_OK)
        fprintf(stderr, "make_ckpt: %s\n", dcp_errmsg(ctx));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    return rc;
}

static dcp_convert_options opts(void)
{
    dcp_convert_options o;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.mem_limit = 1 << 20;
    o.flags = DCP_CONVERT_NO_FSYNC;
    return o;
}

/* Reads tensor key of the checkpoint in dir whole into buf. */
static int read_all(const char *dir, const char *key, void *buf, size_t len)
{
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    int rc = dcp_ctx_create(&ctx, NULL, NULL);
    if (rc == DCP_OK)
        rc = dcp_metadata_open(ctx, dir, &md);
    if (rc == DCP_OK) {
        long i = dcp_metadata_find(md, key);
        rc = i < 0 ? DCP_EKEY
                   : dcp_metadata_read_box(ctx, md, (size_t)i, NULL, NULL, buf,
                                           len, 1);
    }
    if (rc != DCP_OK)
        fprintf(stderr, "read_all '%s': %s\n", key, dcp_errmsg(ctx));
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return rc;
}

/* Names in dir containing needle. */
static int count_files(const char *needle)
{
    DIR *d = opendir(root);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL)
        if (strstr(e->d_name, needle))
            n++;
    if (d)
        closedir(d);
    return n;
}

TEST(roundtrip_both_formats)
{
    static const char *const outs[] = {"rt.safetensors", "rt.pt"};
    static float got[ROWS][COLS];
    static int64_t gi[1000];
    char ck[300], out[300], back[300];
    dcp_ctx *ctx = NULL;
    dcp_convert_options o = opts();
    dcp_convert_result res;
    size_t k;
    path(ck, sizeof(ck), "ck");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    for (k = 0; k < 2; k++) {
        path(out, sizeof(out), outs[k]);
        (void)snprintf(back, sizeof(back), "%s/back%zu", root, k);
        memset(&res, 0, sizeof(res));
        res.struct_size = sizeof(res);
        ASSERT_OK(dcp_export(ctx, ck, out, &o, &res));
        ASSERT_EQ(res.tensors, 3);
        ASSERT_EQ(res.values, k == 1 ? 1 : 0);
        ASSERT_EQ(res.skipped, k == 0 ? 1 : 0);
        ASSERT_OK(dcp_import(ctx, out, back, &o, &res));
        memset(got, 0, sizeof(got));
        ASSERT_OK(read_all(back, "model.big", got, sizeof(got)));
        ASSERT_MEM_EQ(got, big, sizeof(big));
        ASSERT_OK(read_all(back, "model.idx", gi, sizeof(gi)));
        ASSERT_MEM_EQ(gi, idx, sizeof(idx));
    }
    ASSERT_EQ(count_files(".tmp-"), 0);
    dcp_ctx_free(ctx);
}

TEST(load_file_single_process)
{
    static float got[100][COLS];
    int64_t shape[2] = {ROWS, COLS}, off[2] = {250, 0}, size[2] = {100, COLS};
    char file[300];
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, NULL};
    path(file, sizeof(file), "rt.pt");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "model.big", DCP_F32, 2, shape, off,
                                   size, got, DCP_MEM_HOST));
    ASSERT_OK(dcp_load_file(ctx, st, file, &lo));
    ASSERT_MEM_EQ(got, big[250], sizeof(got));
    ASSERT_EQ(dcp_load_report(ctx, 1, NULL), 3); /* idx, tiny, step */
    ASSERT_RC(dcp_load_file(ctx, st, file, NULL), DCP_EKEY);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(cast)
{
    static uint16_t got[ROWS][COLS], want[ROWS][COLS];
    char ck[300], out[300], back[300];
    dcp_ctx *ctx = NULL;
    dcp_convert_options o = opts();
    dcp_convert_result res = {sizeof(res), 0, 0, 0, 0, 0, 0, 0};
    path(ck, sizeof(ck), "ck");
    path(out, sizeof(out), "cast.safetensors");
    path(back, sizeof(back), "cast-back");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    /* an integer target is refused */
    o.dtype = DCP_I32;
    ASSERT_RC(dcp_export(ctx, ck, out, &o, NULL), DCP_EINVAL);
    /* float16 tops at 65504: big[131][40] = 65520 rounds to 65536, which
     * does not exist: refused, naming the element */
    o.dtype = DCP_F16;
    ASSERT_RC(dcp_export(ctx, ck, out, &o, NULL), DCP_EMISMATCH);
    ASSERT(strstr(dcp_errmsg(ctx), "'model.big': element 39340 cannot be "
                                   "represented in float16") != NULL);
    ASSERT(access(out, F_OK) != 0);
    ASSERT_EQ(count_files(".tmp-"), 0);
    /* bf16: everything fits; idx (int64) is kept */
    o.dtype = DCP_BF16;
    ASSERT_OK(dcp_export(ctx, ck, out, &o, &res));
    ASSERT_EQ(res.cast, 2);
    ASSERT_EQ(res.kept, 1);
    o.dtype = 0;
    ASSERT_OK(dcp_import(ctx, out, back, &o, NULL));
    ASSERT_OK(read_all(back, "model.big", got, sizeof(got)));
    ASSERT_OK(dcp_convert_elements(want, DCP_BF16, big, DCP_F32, ROWS * COLS));
    ASSERT_MEM_EQ(got, want, sizeof(got));
    /* a second import onto it is refused and leaves it whole (its data
     * file was once removed by the refused import) */
    ASSERT_RC(dcp_import(ctx, out, back, &o, NULL), DCP_EEXIST);
    ASSERT_OK(read_all(back, "model.big", got, sizeof(got)));
    ASSERT_MEM_EQ(got, want, sizeof(got));
    /* with overflow allowed, float16 is written (1e10 becomes inf) */
    o.dtype = DCP_F16;
    o.flags |= DCP_CONVERT_ALLOW_OVERFLOW;
    ASSERT_OK(dcp_export(ctx, ck, out, &o, NULL));
    dcp_ctx_free(ctx);
}

TEST(filter_and_rename)
{
    char ck[300], out[300], back[300];
    dcp_ctx *ctx = NULL;
    dcp_convert_options o = opts();
    dcp_metadata *md = NULL;
    const char *keys[2] = {"model.*", "nothing"};
    path(ck, sizeof(ck), "ck");
    path(out, sizeof(out), "f.pt");
    path(back, sizeof(back), "f-back");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    o.keys = keys + 1;
    o.nkeys = 1;
    ASSERT_RC(dcp_export(ctx, ck, out, &o, NULL), DCP_EKEY);
    ASSERT(access(out, F_OK) != 0);
    o.keys = keys;
    o.nkeys = 2;
    o.strip_prefix = "model.";
    o.add_prefix = "enc.";
    ASSERT_OK(dcp_export(ctx, ck, out, &o, NULL));
    memset(&o.keys, 0, sizeof(o.keys));
    o.nkeys = 0;
    o.strip_prefix = NULL;
    o.add_prefix = NULL;
    ASSERT_OK(dcp_import(ctx, out, back, &o, NULL));
    ASSERT_OK(dcp_metadata_open(ctx, back, &md));
    ASSERT_EQ(dcp_metadata_count(md), 2);
    ASSERT(dcp_metadata_find(md, "enc.big") >= 0);
    ASSERT(dcp_metadata_find(md, "enc.idx") >= 0);
    dcp_metadata_free(md);
    /* two keys renamed to one */
    o.strip_prefix = "model.";
    o.add_prefix = "x";
    o.keys = keys;
    o.nkeys = 1;
    {
        const char *k2[1] = {"*"};
        o.keys = k2;
        o.strip_prefix = "model.big";
        o.add_prefix = NULL;
        path(out, sizeof(out), "f2.safetensors");
        /* "model.big" -> "", refused */
        ASSERT_RC(dcp_export(ctx, ck, out, &o, NULL), DCP_EKEY);
    }
    dcp_ctx_free(ctx);
}

/* Flips one byte inside a stored chunk: the export fails on the CRC. */
TEST(corrupt_chunk)
{
    char ck[300], out[300], file[400];
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    dcp_chunk_info ci;
    dcp_convert_options o = opts();
    unsigned char b;
    int fd;
    long i;
    path(ck, sizeof(ck), "ck-corrupt");
    ASSERT_OK(make_ckpt(ck));
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_metadata_open(ctx, ck, &md));
    i = dcp_metadata_find(md, "model.big");
    ASSERT_OK(dcp_metadata_chunk(md, (size_t)i, 3, &ci));
    (void)snprintf(file, sizeof(file), "%s/%s", ck, ci.file);
    fd = open(file, O_RDWR);
    ASSERT(fd >= 0);
    /* a byte near the end of the record's data (before its descriptor
     * and directory) */
    ASSERT(pread(fd, &b, 1, (off_t)(ci.offset + ci.length - 2000)) == 1);
    b ^= 0x40;
    ASSERT(pwrite(fd, &b, 1, (off_t)(ci.offset + ci.length - 2000)) == 1);
    close(fd);
    path(out, sizeof(out), "corrupt.safetensors");
    ASSERT_RC(dcp_export(ctx, ck, out, &o, NULL), DCP_ECORRUPT);
    ASSERT(strstr(dcp_errmsg(ctx), "CRC mismatch") != NULL);
    ASSERT(access(out, F_OK) != 0);
    ASSERT_EQ(count_files(".tmp-"), 0);
    /* without verification it goes through */
    o.flags |= DCP_CONVERT_NO_VERIFY;
    ASSERT_OK(dcp_export(ctx, ck, out, &o, NULL));
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
}

/* A write failure half-way (RLIMIT_FSIZE: writes past 300 KB fail with
 * EFBIG, as they would with ENOSPC on a full disk). */
TEST(write_failure)
{
    char ck[300], out[400], back[300], in[300];
    dcp_ctx *ctx = NULL;
    dcp_convert_options o = opts();
    struct rlimit old, lim;
    int rc1, rc2, rc3;
    path(ck, sizeof(ck), "ck");
    path(in, sizeof(in), "rt.safetensors");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT(getrlimit(RLIMIT_FSIZE, &old) == 0);
    (void)signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = 300 << 10;
    ASSERT(setrlimit(RLIMIT_FSIZE, &lim) == 0);
    path(out, sizeof(out), "full.safetensors");
    rc1 = dcp_export(ctx, ck, out, &o, NULL);
    path(out, sizeof(out), "full.pt");
    rc2 = dcp_export(ctx, ck, out, &o, NULL);
    path(back, sizeof(back), "full-import");
    rc3 = dcp_import(ctx, in, back, &o, NULL);
    ASSERT(setrlimit(RLIMIT_FSIZE, &old) == 0);
    ASSERT_RC(rc1, DCP_EIO);
    ASSERT_RC(rc2, DCP_EIO);
    ASSERT_RC(rc3, DCP_EIO);
    ASSERT(strstr(dcp_errmsg(ctx), "File too large") != NULL);
    path(out, sizeof(out), "full.safetensors");
    ASSERT(access(out, F_OK) != 0);
    path(out, sizeof(out), "full.pt");
    ASSERT(access(out, F_OK) != 0);
    ASSERT_EQ(count_files(".tmp-"), 0);
    /* the import left no checkpoint and no data file */
    (void)snprintf(out, sizeof(out), "%s/.metadata", back);
    ASSERT(access(out, F_OK) != 0);
    (void)snprintf(out, sizeof(out), "%s/__0_0.distcp", back);
    ASSERT(access(out, F_OK) != 0);
    dcp_ctx_free(ctx);
}

TEST(bad_inputs)
{
    char f[300], back[300];
    dcp_ctx *ctx = NULL;
    int fd;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    path(back, sizeof(back), "bad-back");
    path(f, sizeof(f), "nope.safetensors");
    ASSERT_RC(dcp_import(ctx, f, back, NULL, NULL), DCP_ENOENT);
    /* a zip signature, then garbage: too short for an end record */
    path(f, sizeof(f), "bad.pt");
    fd = open(f, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT(fd >= 0);
    ASSERT(write(fd, "PK\3\4garbage", 11) == 11);
    close(fd);
    ASSERT_RC(dcp_import(ctx, f, back, NULL, NULL), DCP_ECORRUPT);
    /* a header length beyond the file */
    path(f, sizeof(f), "bad.safetensors");
    fd = open(f, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT(fd >= 0);
    ASSERT(write(fd, "\xff\xff\xff\xff\0\0\0\0{}", 10) == 10);
    close(fd);
    ASSERT_RC(dcp_import(ctx, f, back, NULL, NULL), DCP_EFORMAT);
    ASSERT(strstr(dcp_errmsg(ctx), "exceeds the file") != NULL);
    ASSERT_RC(dcp_export(ctx, "/nonexistent", f, NULL, NULL), DCP_ENOENT);
    /* Sharded into a directory that does not exist: DCP_ENOENT naming it,
     * and the shard's name is not leaked (LeakSanitizer, build-asan). */
    {
        dcp_convert_options o;
        char ck[300];
        memset(&o, 0, sizeof(o));
        o.struct_size = sizeof(o);
        o.max_shard_bytes = 4096;
        path(ck, sizeof(ck), "ck");
        path(f, sizeof(f), "no-such-dir/out.safetensors");
        ASSERT_RC(dcp_export(ctx, ck, f, &o, NULL), DCP_ENOENT);
        ASSERT(strstr(dcp_errmsg(ctx), "no-such-dir/out-00001-of-") != NULL);
    }
    dcp_ctx_free(ctx);
}

static double mono_s(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/*
 * An index of 60,000 tensors in one shard imports in about a second: each
 * shard's tensors were looked up in the index one by one (a linear scan
 * of the weight_map each), 100,000 tensors took 90 s. The bound is ten
 * times what the fixed code needs on a loaded 2-core machine, and a third
 * of what the quadratic one took (33 s).
 */
TEST(index_many_tensors)
{
    /* the bound holds in the plain build; under ASan, a smaller run */
    const int N = TEST_SANITIZED ? 20000 : 60000;
    char shard[300], index[300], back[300];
    dcp_ctx *ctx = NULL;
    dcp_convert_result res;
    uint64_t len;
    double t0, dt, bound;
    long hlen, pad;
    FILE *f;
    int i;
    path(shard, sizeof(shard), "many.safetensors");
    path(index, sizeof(index), "many.safetensors.index.json");
    path(back, sizeof(back), "many-back");
    f = fopen(shard, "wb");
    ASSERT(f != NULL);
    ASSERT(fwrite("\0\0\0\0\0\0\0\0{", 1, 9, f) == 9);
    for (i = 0; i < N; i++)
        fprintf(f,
                "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[0],"
                "\"data_offsets\":[0,0]}",
                i ? "," : "", i);
    fputc('}', f);
    hlen = ftell(f) - 8;
    for (pad = 0; (hlen + pad) % 8; pad++)
        fputc(' ', f);
    len = (uint64_t)(hlen + pad);
    ASSERT(fseek(f, 0, SEEK_SET) == 0);
    for (i = 0; i < 8; i++)
        fputc((int)((len >> (8 * i)) & 0xff), f);
    ASSERT(fclose(f) == 0);
    f = fopen(index, "w");
    ASSERT(f != NULL);
    fputs("{\"metadata\":{},\"weight_map\":{", f);
    /* in reverse, so neither order helps */
    for (i = N - 1; i >= 0; i--)
        fprintf(f, "\"t%d\":\"many.safetensors\"%s", i, i ? "," : "");
    fputs("}}", f);
    ASSERT(fclose(f) == 0);
    memset(&res, 0, sizeof(res));
    res.struct_size = sizeof(res);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    t0 = mono_s();
    ASSERT_OK(dcp_import(ctx, index, back, NULL, &res));
    dt = mono_s() - t0;
    ASSERT_EQ(res.tensors, N);
    bound = TEST_SANITIZED ? 60.0 : 10.0;
    fprintf(stderr, "index of %d tensors imported in %.2f s (bound %.0f s)\n",
            N, dt, bound);
    ASSERT(dt < bound);
    dcp_ctx_free(ctx);
}

int main(void)
{
    char ck[300];
    (void)snprintf(root, sizeof(root), "/tmp/dcp-test-export-%d",
                   (int)getpid());
    if (mkdir(root, 0755) != 0)
        return 1;
    path(ck, sizeof(ck), "ck");
    if (make_ckpt(ck) != DCP_OK)
        return 1;
    RUN(roundtrip_both_formats);
    RUN(load_file_single_process);
    RUN(cast);
    RUN(filter_and_rename);
    RUN(corrupt_chunk);
    RUN(write_failure);
    RUN(bad_inputs);
    RUN(index_many_tensors);
    if (!getenv("DCP_KEEP_TMP")) {
        char cmd[300];
        (void)snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", root);
    }
    return TEST_SUMMARY();
}
