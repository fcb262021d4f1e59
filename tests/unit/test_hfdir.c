/*
 * Hugging Face safetensors directories (hfdir.c, srcfile.c's directory
 * route, docs/FORMAT.md §9.5): files written here as torch's
 * HuggingFaceStorageWriter writes them (a safetensors header whose
 * __metadata__ DCP_SHARDING_INFO places each tensor), read as a checkpoint
 * (dcp_metadata_open, dcp_metadata_read_box) and through srcfile (every
 * box and every linear range of a tensor cut into a 3-D grid of pieces);
 * hostile directories refused with DCP_EFORMAT naming file and tensor.
 */
#include "test.h"

#include <float.h> /* FLT_MAX */
#include <math.h>  /* ldexp, HUGE_VALF */
#include <sys/stat.h>
#include <unistd.h>

#include "dcp/dcp_convert.h"
#include "hfdir.h"
#include "safetensors.h"
#include "srcfile.h"
#include "storage.h"

static char root[256];
static unsigned seq;

/* A new empty directory under root. */
static void new_dir(char *out, size_t n, const char *what)
{
    (void)snprintf(out, n, "%s/%s-%u", root, what, seq++);
    if (mkdir(out, 0755) != 0)
        fprintf(stderr, "mkdir %s failed\n", out);
}

/* One tensor of a file and its saved_offsets (JSON; NULL: no entry in
 * the sharding info). */
struct tw {
    const char *name;
    dcp_dtype dt;
    int ndim;
    int64_t shape[DCP_MAX_NDIM];
    const char *off; /* JSON of saved_offsets, or NULL: no entry */
};

/* Writes dir/name: a safetensors file of the tensors t[0..n) with info as
 * DCP_SHARDING_INFO (NULL: built from t's offsets; "": none). Element i
 * of tensor k holds fill(k, i). */
static void write_file(const char *dir, const char *name, const struct tw *t,
                       size_t n, const char *info,
                       float (*fill)(size_t, int64_t))
{
    struct sf_out so[8];
    struct dcp_buf hdr = {0}, js = {0};
    const char *meta[6];
    uint64_t data_len = 0;
    size_t i, nmeta = 0;
    char path[512];
    FILE *f;
    for (i = 0; i < n; i++) {
        so[i].name = t[i].name;
        so[i].dtype = t[i].dt;
        so[i].ndim = t[i].ndim;
        so[i].shape = t[i].shape;
    }
    if (!info) {
        (void)dcp__buf_printf(&js, "{");
        for (i = 0; i < n; i++)
            if (t[i].off)
                (void)dcp__buf_printf(&js, "%s\"%s\": {\"saved_offsets\": %s}",
                                      js.len > 1 ? ", " : "", t[i].name,
                                      t[i].off);
        (void)dcp__buf_printf(&js, "}");
        (void)dcp__buf_put(&js, "", 1);
        info = (const char *)js.p;
    }
    meta[nmeta * 2] = "format";
    meta[nmeta++ * 2 + 1] = "pt";
    if (*info) {
        meta[nmeta * 2] = "DCP_SHARDING_INFO";
        meta[nmeta++ * 2 + 1] = info;
    }
    ASSERT_OK(dcp__sf_header_build(so, n, meta, nmeta, &hdr, &data_len));
    (void)snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(hdr.p, 1, hdr.len, f), hdr.len);
    /* data in header order: dcp__sf_header_build lays them out in t's
     * order */
    for (i = 0; i < n; i++) {
        int64_t k, cnt = 1;
        int d;
        for (d = 0; d < t[i].ndim; d++)
            cnt *= t[i].shape[d];
        for (k = 0; k < cnt; k++) {
            float v = fill(i, k);
            double w = v;
            if (t[i].dt == DCP_F64)
                ASSERT_EQ(fwrite(&w, 8, 1, f), 1);
            else
                ASSERT_EQ(fwrite(&v, 4, 1, f), 1);
        }
    }
    ASSERT_EQ(fclose(f), 0);
    dcp__buf_free(&hdr);
    dcp__buf_free(&js);
}

static float fill_zero(size_t k, int64_t i)
{
    (void)k;
    return (float)i;
}

/* dcp__hf_metadata of dir: its code, or 999 when the message lacks n1 or
 * n2 (each may be NULL). */
static int scan(const char *dir, const char *n1, const char *n2)
{
    struct dcp_metadata *md = NULL;
    struct dcp_err err = {0, ""};
    int dirfd = -1, rc;
    if (dcp__fs_open_dir(dir, &dirfd, &err) != DCP_OK)
        return 998;
    rc = dcp__hf_metadata(dirfd, dir, &md, &err);
    dcp__fs_release(dirfd);
    dcp__meta_free(md);
    if (rc != DCP_OK &&
        ((n1 && !strstr(err.msg, n1)) || (n2 && !strstr(err.msg, n2)))) {
        fprintf(stderr, "message \"%s\" lacks \"%s\" or \"%s\"\n", err.msg, n1,
                n2 ? n2 : "");
        return 999;
    }
    return rc;
}

/* The same through srcfile (dcp_load_file's and dcp_import's route). */
static int src_scan(const char *dir, const char *n1)
{
    struct src_index ix;
    struct dcp_err err = {0, ""};
    int rc = dcp__src_open(dir, DCP_FORMAT_AUTO, 1 << 20, &ix, &err);
    if (rc == DCP_OK)
        dcp__src_close(&ix);
    else if (n1 && !strstr(err.msg, n1)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", err.msg, n1);
        return 999;
    }
    return rc;
}

TEST(two_row_pieces)
{
    struct tw a[] = {{"w", DCP_F32, 2, {3, 4}, "[0, 0]"},
                     {"s", DCP_F64, 0, {0}, "[]"}};
    struct tw b[] = {{"w", DCP_F32, 2, {2, 4}, "[3, 0]"}};
    char dir[300];
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    dcp_entry_info e;
    float got[20];
    int64_t off[2] = {2, 1}, size[2] = {3, 2};
    int i;
    new_dir(dir, sizeof(dir), "rows");
    write_file(dir, "shard-00001.safetensors", a, 2, NULL, fill_zero);
    write_file(dir, "shard-00002.safetensors", b, 1, NULL, fill_zero);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
    ASSERT_EQ(dcp_metadata_count(md), 2);
    ASSERT_OK(dcp_metadata_entry(md, 1, &e));
    ASSERT_STR_EQ(e.key, "w");
    ASSERT_EQ(e.ndim, 2);
    ASSERT_EQ(e.shape[0], 5);
    ASSERT_EQ(e.shape[1], 4);
    ASSERT_EQ(e.nchunks, 2);
    /* rows 2..4, columns 1..2: row 2 from the first file, 3 and 4 from
     * the second (elements 0..7 there) */
    ASSERT_OK(dcp_metadata_read_box(ctx, md, 1, off, size, got,
                                    sizeof(float) * 6, 1));
    ASSERT(got[0] == 9.0f && got[1] == 10.0f);
    for (i = 0; i < 2; i++) {
        ASSERT(got[2 + 2 * i] == (float)(4 * i + 1));
        ASSERT(got[3 + 2 * i] == (float)(4 * i + 2));
    }
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    ASSERT_OK(src_scan(dir, NULL));
}

/* A 3-D tensor of 5 x 4 x 3 cut into a 2 x 2 x 1 grid over 4 files plus
 * an empty piece: every box and every linear range read through srcfile
 * equals the tensor. */
static float fill_grid_v[4][60];
static int grid_k; /* the piece fill_grid writes */
static float fill_grid(size_t k, int64_t i)
{
    (void)k;
    return fill_grid_v[grid_k][i];
}

TEST(grid_boxes_and_ranges)
{
    static const int64_t lo0[2] = {0, 2}, n0[2] = {2, 3};
    static const int64_t lo1[2] = {0, 1}, n1[2] = {1, 3};
    float full[60], got[60];
    struct src_index ix;
    struct dcp_err err = {0, ""};
    const struct src_entry *e;
    char dir[300];
    int p, q, i0, i1, i2;
    new_dir(dir, sizeof(dir), "grid");
    for (i0 = 0; i0 < 60; i0++)
        full[i0] = (float)i0 * 0.5f - 7.0f;
    for (p = 0; p < 2; p++)
        for (q = 0; q < 2; q++) {
            struct tw t = {"g", DCP_F32, 3, {n0[p], n1[q], 3}, NULL};
            char offs[64], name[64];
            int64_t k = 0;
            for (i0 = 0; i0 < n0[p]; i0++)
                for (i1 = 0; i1 < n1[q]; i1++)
                    for (i2 = 0; i2 < 3; i2++)
                        fill_grid_v[2 * p + q][k++] =
                            full[((lo0[p] + i0) * 4 + lo1[q] + i1) * 3 + i2];
            (void)snprintf(offs, sizeof(offs), "[%d, %d, 0]", (int)lo0[p],
                           (int)lo1[q]);
            t.off = offs;
            (void)snprintf(name, sizeof(name), "r%d.safetensors", 2 * p + q);
            grid_k = 2 * p + q;
            write_file(dir, name, &t, 1, NULL, fill_grid);
        }
    {
        struct tw t = {"g", DCP_F32, 3, {0, 4, 3}, "[5, 0, 0]"};
        write_file(dir, "r9.safetensors", &t, 1, NULL, fill_zero);
    }
    ASSERT_OK(dcp__src_open(dir, DCP_FORMAT_AUTO, 1 << 20, &ix, &err));
    e = dcp__src_find(&ix, "g");
    ASSERT(e != NULL);
    ASSERT_EQ(e->npieces, 5);
    ASSERT(e->shape[0] == 5 && e->shape[1] == 4 && e->shape[2] == 3);
    {
        int64_t o[3], s[3];
        for (o[0] = 0; o[0] < 5; o[0]++)
            for (s[0] = 1; o[0] + s[0] <= 5; s[0]++)
                for (o[1] = 0; o[1] < 4; o[1]++)
                    for (s[1] = 1; o[1] + s[1] <= 4; s[1]++)
                        for (o[2] = 0; o[2] < 3; o[2]++)
                            for (s[2] = 1; o[2] + s[2] <= 3; s[2]++) {
                                int64_t k = 0, a, b, c;
                                ASSERT_OK(dcp__src_read_box(&ix, e, o, s, got,
                                                            1 << 20, &err));
                                for (a = 0; a < s[0]; a++)
                                    for (b = 0; b < s[1]; b++)
                                        for (c = 0; c < s[2]; c++)
                                            ASSERT(got[k++] ==
                                                   full[((o[0] + a) * 4 + o[1] +
                                                         b) *
                                                            3 +
                                                        o[2] + c]);
                            }
    }
    {
        uint64_t first, count;
        for (first = 0; first < 60; first++)
            for (count = 1; first + count <= 60; count++) {
                ASSERT_OK(
                    dcp__src_read(&ix, e, first, count, got, 1 << 20, &err));
                ASSERT_MEM_EQ(got, full + first, count * sizeof(float));
            }
    }
    dcp__src_close(&ix);
    ASSERT_OK(scan(dir, NULL, NULL));
}

/* One hostile directory: a.safetensors holding t0 (sharding info i0, NULL:
 * from t0), b.safetensors t1 if not NULL; both readers must refuse it
 * with want (hostile: DCP_EFORMAT) and a message holding n1 and n2. */
static void hostile_rc(int want, const char *what, const struct tw *t0,
                       const char *i0, const struct tw *t1, const char *i1,
                       const char *n1, const char *n2)
{
    char dir[300];
    new_dir(dir, sizeof(dir), what);
    write_file(dir, "a.safetensors", t0, 1, i0, fill_zero);
    if (t1)
        write_file(dir, "b.safetensors", t1, 1, i1, fill_zero);
    if (scan(dir, n1, n2) != want || src_scan(dir, n1) != want)
        fprintf(stderr, "case %s\n", what);
    ASSERT_RC(scan(dir, n1, n2), want);
    ASSERT_RC(src_scan(dir, n1), want);
}

#define hostile(...) hostile_rc(DCP_EFORMAT, __VA_ARGS__)

TEST(hostile_directories)
{
    struct tw w0 = {"w", DCP_F32, 2, {3, 4}, "[0, 0]"};
    struct tw w2 = {"w", DCP_F32, 2, {3, 4}, "[2, 0]"};
    struct tw w4 = {"w", DCP_F32, 2, {3, 4}, "[4, 0]"};
    struct tw w3d = {"w", DCP_F64, 2, {3, 4}, "[3, 0]"};
    struct tw w3r = {"w", DCP_F32, 1, {4}, "[3]"};
    struct tw wn = {"w", DCP_F32, 2, {3, 4}, "[-1, 0]"};
    struct tw wh = {"w", DCP_F32, 2, {3, 4}, "[9223372036854775806, 0]"};
    struct tw wf = {"w", DCP_F32, 2, {3, 4}, "[0.5, 0]"};
    struct tw wr = {"w", DCP_F32, 2, {3, 4}, "[0]"};
    struct tw s0 = {"s", DCP_F32, 0, {0}, "[]"};
    struct tw wx = {"w", DCP_F32, 2, {3, 4}, NULL};
    hostile("overlap", &w0, NULL, &w2, NULL, "overlap", "b.safetensors");
    hostile("gap", &w0, NULL, &w4, NULL, "a gap", "'w'");
    hostile("dtype", &w0, NULL, &w3d, NULL, "float64", "b.safetensors");
    hostile("rank", &w0, NULL, &w3r, NULL, "dims", "'w'");
    hostile("negative", &wn, NULL, NULL, NULL, "saved_offsets[0]",
            "a.safetensors");
    hostile("huge", &wh, NULL, NULL, NULL, "saved_offsets[0]", "'w'");
    hostile("fraction", &wf, NULL, NULL, NULL, "saved_offsets[0]", "'w'");
    hostile("short", &wr, NULL, NULL, NULL, "saved_offsets of 2", "'w'");
    hostile("scalar-twice", &s0, NULL, &s0, NULL, "overlap", "'s'");
    hostile("no-entry", &wx, NULL, NULL, NULL, "no DCP_SHARDING_INFO", "'w'");
    hostile("bad-json", &w0, "{\"w\": {\"saved_offsets\": [0, 0]", NULL, NULL,
            "DCP_SHARDING_INFO", "a.safetensors");
    hostile("not-object", &w0, "[0, 0]", NULL, NULL, "not a JSON object",
            "a.safetensors");
    hostile("entry-not-object", &w0, "{\"w\": [0, 0]}", NULL, NULL,
            "not a DCP_SHARDING_INFO", "'w'");
    hostile("dup", &w0,
            "{\"w\": {\"saved_offsets\": [0, 0]}, \"w\": {\"saved_offsets\": "
            "[0, 0]}}",
            NULL, NULL, "twice", "a.safetensors");
    hostile_rc(DCP_ELIMIT, "deep", &w0,
               "{\"w\": {\"saved_offsets\": [[[[[0]]]], 0]}}", NULL, NULL,
               "DCP_SHARDING_INFO", "a.safetensors");
}

TEST(not_hf)
{
    char dir[300], path[400];
    struct dcp_err err = {0, ""};
    struct src_index ix;
    struct tw w2 = {"w", DCP_F32, 2, {3, 4}, "[2, 0]"};
    FILE *f;
    /* no safetensors file: not read as one (ENOENT, nothing said) */
    new_dir(dir, sizeof(dir), "none");
    (void)snprintf(path, sizeof(path), "%s/readme.txt", dir);
    f = fopen(path, "w");
    ASSERT(f != NULL);
    ASSERT_EQ(fclose(f), 0);
    ASSERT_RC(scan(dir, NULL, NULL), DCP_ENOENT);
    ASSERT_RC(src_scan(dir, "without *.safetensors"), DCP_ENOENT);
    /* a piece opened alone as a file is refused, naming it */
    new_dir(dir, sizeof(dir), "lone");
    write_file(dir, "b.safetensors", &w2, 1, NULL, fill_zero);
    (void)snprintf(path, sizeof(path), "%s/b.safetensors", dir);
    ASSERT_RC(dcp__src_open(path, DCP_FORMAT_AUTO, 1 << 20, &ix, &err),
              DCP_EFORMAT);
    ASSERT(strstr(err.msg, "'w' is a piece at [2,0]") != NULL);
}

/* dcp_save_hf of st to dir (flags) on one process: its code, or 999 when
 * the message lacks needle. */
static int save_hf(dcp_state *st, const char *dir, unsigned flags,
                   const char *needle)
{
    dcp_ctx *ctx = NULL;
    dcp_convert_options o;
    int rc;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.flags = flags | DCP_CONVERT_NO_FSYNC;
    if (dcp_ctx_create(&ctx, NULL, NULL) != DCP_OK)
        return 998;
    rc = dcp_save_hf(ctx, st, dir, &o);
    if (rc != DCP_OK && needle && !strstr(dcp_errmsg(ctx), needle)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", dcp_errmsg(ctx),
                needle);
        rc = 999;
    }
    dcp_ctx_free(ctx);
    return rc;
}

TEST(save_hf_one_process)
{
    static const int64_t shape[2] = {3, 4}, zero[2] = {0, 0};
    static const int64_t half[2] = {2, 4}, off1[2] = {1, 0};
    static const int64_t off2[2] = {2, 0}, one[2] = {1, 4};
    float w[12], got[12];
    double sc = 2.5, sg;
    char dir[300], path[400];
    dcp_state *st = NULL;
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    struct stat sb;
    int i;
    for (i = 0; i < 12; i++)
        w[i] = (float)i - 3.5f;
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, zero, shape, w,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st, "s", DCP_F64, 0, NULL, NULL, NULL, &sc,
                                   DCP_MEM_HOST));
    for (i = 0; i < 2; i++) {
        new_dir(dir, sizeof(dir), i ? "save-cons" : "save-sharded");
        ASSERT_OK(save_hf(st, dir, i ? DCP_CONVERT_HF_CONSOLIDATED : 0, NULL));
        (void)snprintf(path, sizeof(path), "%s/%s", dir,
                       i ? "model-00001-of-00001.safetensors"
                         : "shard-00001-model-00001-of-00001.safetensors");
        ASSERT_EQ(stat(path, &sb), 0);
        (void)snprintf(path, sizeof(path), "%s/model.safetensors.index.json",
                       dir);
        ASSERT_EQ(stat(path, &sb) == 0, i);
        ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
        ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
        ASSERT_EQ(dcp_metadata_count(md), 2);
        ASSERT_OK(
            dcp_metadata_read_box(ctx, md, 1, NULL, NULL, got, sizeof(got), 1));
        ASSERT_MEM_EQ(got, w, sizeof(w));
        ASSERT_OK(
            dcp_metadata_read_box(ctx, md, 0, NULL, NULL, &sg, sizeof(sg), 1));
        ASSERT(sg == 2.5);
        dcp_metadata_free(md);
        dcp_ctx_free(ctx);
        /* the directory now holds output: a second save is refused */
        ASSERT_RC(save_hf(st, dir, 0, "already holds"), DCP_EEXIST);
    }
    dcp_state_free(st);
    /* a strided box (rows of a 3x8 buffer, and its transpose) is written
     * packed: the file holds the elements, not the buffer's bytes */
    {
        static const int64_t sh34[2] = {3, 4}, st34[2] = {8, 1};
        static const int64_t sh43[2] = {4, 3}, st43[2] = {1, 8};
        float wide[24], want[12], wantt[12];
        int r, c;
        for (i = 0; i < 24; i++)
            wide[i] = (float)i * 0.5f + 1.0f;
        for (r = 0; r < 3; r++)
            for (c = 0; c < 4; c++) {
                want[r * 4 + c] = wide[r * 8 + c];
                wantt[c * 3 + r] = wide[r * 8 + c];
            }
        for (i = 0; i < 2; i++) {
            new_dir(dir, sizeof(dir), i ? "save-strided-c" : "save-strided");
            ASSERT_OK(dcp_state_create(&st));
            ASSERT_OK(dcp_state_add_tensor_strided(
                st, "w", DCP_F32, 2, sh34, zero, sh34, st34, wide,
                DCP_MEM_HOST));
            ASSERT_OK(dcp_state_add_tensor_strided(
                st, "t", DCP_F32, 2, sh43, zero, sh43, st43, wide,
                DCP_MEM_HOST));
            ASSERT_OK(
                save_hf(st, dir, i ? DCP_CONVERT_HF_CONSOLIDATED : 0, NULL));
            dcp_state_free(st);
            ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
            ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
            ASSERT_EQ(dcp_metadata_count(md), 2);
            ASSERT_OK(dcp_metadata_read_box(ctx, md, 1, NULL, NULL, got,
                                            sizeof(got), 1)); /* "w" */
            ASSERT_MEM_EQ(got, want, sizeof(want));
            ASSERT_OK(dcp_metadata_read_box(ctx, md, 0, NULL, NULL, got,
                                            sizeof(got), 1)); /* "t" */
            ASSERT_MEM_EQ(got, wantt, sizeof(wantt));
            dcp_metadata_free(md);
            dcp_ctx_free(ctx);
        }
    }
    /* two boxes of a tensor on one rank; boxes that overlap or leave a
     * gap; a value */
    new_dir(dir, sizeof(dir), "save-bad");
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, zero, one, w,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off1, half, w,
                                   DCP_MEM_HOST));
    ASSERT_RC(save_hf(st, dir, 0, "two boxes of 'w'"), DCP_ENOTSUP);
    ASSERT_RC(save_hf(st, dir, DCP_CONVERT_HF_CONSOLIDATED, "held whole"),
              DCP_ENOTSUP);
    dcp_state_free(st);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, zero, half, w,
                                   DCP_MEM_HOST));
    ASSERT_RC(save_hf(st, dir, 0, "cover 8 of its 12"), DCP_EINVAL);
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off2, one, w,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off1, one, w,
                                   DCP_MEM_HOST));
    ASSERT_RC(save_hf(st, dir, 0, "overlap"), DCP_EINVAL);
    ASSERT_OK(dcp_state_add_value(st, "step", dcp_value_int(3)));
    ASSERT_RC(save_hf(st, dir, 0, "'step' is not a tensor"), DCP_ENOTSUP);
    dcp_state_free(st);
    ASSERT_EQ(stat(dir, &sb), 0); /* made by new_dir; nothing written */
    (void)snprintf(path, sizeof(path),
                   "%s/shard-00001-model-00001-of-00001"
                   ".safetensors",
                   dir);
    ASSERT(stat(path, &sb) != 0);
}

/* Writes dir/name: tensors t[0..n) with the bytes data[k] each, no
 * sharding info. */
static void write_raw(const char *dir, const char *name, const struct tw *t,
                      size_t n, const void *const *data)
{
    struct sf_out so[8];
    struct dcp_buf hdr = {0};
    static const char *const meta[2] = {"format", "pt"};
    size_t i;
    char path[512];
    FILE *f;
    for (i = 0; i < n; i++) {
        so[i].name = t[i].name;
        so[i].dtype = t[i].dt;
        so[i].ndim = t[i].ndim;
        so[i].shape = t[i].shape;
    }
    ASSERT_OK(dcp__sf_header_build(so, n, meta, 1, &hdr, NULL));
    (void)snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    ASSERT(f != NULL);
    ASSERT_EQ(fwrite(hdr.p, 1, hdr.len, f), hdr.len);
    for (i = 0; i < n; i++) {
        size_t bytes = dcp_dtype_size(t[i].dt);
        int d;
        for (d = 0; d < t[i].ndim; d++)
            bytes *= (size_t)t[i].shape[d];
        ASSERT_EQ(fwrite(data[i], 1, bytes, f), bytes);
    }
    ASSERT_EQ(fclose(f), 0);
    dcp__buf_free(&hdr);
}

/* Every box of a dequantized tensor (3-D, or 2-D with a 1 in front) equals
 * the same part of the whole tensor. */
static void boxes_match(struct src_index *ix, const struct src_entry *e,
                        const float *whole, int64_t step)
{
    static float got[1 << 14];
    int64_t o[3], s[3], a, b, c, k, n0 = e->ndim == 3 ? e->shape[0] : 1;
    int64_t n1 = e->shape[e->ndim - 2], n2 = e->shape[e->ndim - 1];
    struct dcp_err err = {0, ""};
    for (o[0] = 0; o[0] < n0; o[0]++)
        for (s[0] = 1; o[0] + s[0] <= n0; s[0]++)
            for (o[1] = 0; o[1] < n1; o[1] += step)
                for (s[1] = 1; o[1] + s[1] <= n1; s[1] += step)
                    for (o[2] = 0; o[2] < n2; o[2] += step)
                        for (s[2] = 1; o[2] + s[2] <= n2; s[2] += step) {
                            const int64_t *po = e->ndim == 3 ? o : o + 1;
                            const int64_t *ps = e->ndim == 3 ? s : s + 1;
                            ASSERT_OK(dcp__src_read_box(ix, e, po, ps, got,
                                                        1 << 20, &err));
                            for (k = 0, a = 0; a < s[0]; a++)
                                for (b = 0; b < s[1]; b++)
                                    for (c = 0; c < s[2]; c++, k++)
                                        ASSERT(!memcmp(&got[k],
                                                       &whole[((o[0] + a) * n1 +
                                                               o[1] + b) *
                                                                  n2 +
                                                              o[2] + c],
                                                       4));
                        }
}

TEST(dequant)
{
    /* FP8: a 5 x 3 weight (float8_e4m3fn) with 2 x 2 scales, block 2 (the
     * internal call takes any block; the public flags use 128) */
    struct tw fp8[2] = {{"l.weight", DCP_F8_E4M3FN, 2, {5, 3}, NULL},
                        {"l.weight_scale_inv", DCP_F32, 2, {3, 2}, NULL}};
    /* MXFP4: blocks [2, 1, 3, 2] and exponents [2, 1, 3] */
    struct tw mx[2] = {{"e.p_blocks", DCP_U8, 4, {2, 1, 3, 2}, NULL},
                       {"e.p_scales", DCP_U8, 3, {2, 1, 3}, NULL}};
    static const float lut[16] = {0,     .5f,  1,  1.5f,  2,  3,  4,  6,
                                  -0.0f, -.5f, -1, -1.5f, -2, -3, -4, -6};
    uint8_t w8[15], blk[12], ex[6] = {127, 128, 0, 255, 126, 130};
    float sc[6] = {1.0f, -2.0f, 0.5f, 3.0f, 0.25f, 1e-3f}, want[24], wf[15];
    const void *d0[2] = {w8, sc}, *d1[2] = {blk, ex};
    struct src_index ix;
    struct dcp_err err = {0, ""};
    const struct src_entry *e;
    char dir[300];
    float got[24];
    int i, j;
    for (i = 0; i < 15; i++)
        w8[i] = (uint8_t)(i * 37 + 3);
    for (i = 0; i < 12; i++)
        blk[i] = (uint8_t)(i * 71 + 5);
    new_dir(dir, sizeof(dir), "dequant");
    write_raw(dir, "a.safetensors", fp8, 2, d0);
    write_raw(dir, "b.safetensors", mx, 2, d1);
    ASSERT_OK(dcp__src_open(dir, DCP_FORMAT_AUTO, 1 << 20, &ix, &err));
    ASSERT_OK(dcp__src_dequant(&ix, 2, &err));
    /* FP8: float32(w) * float32(scale of its 2 x 2 block) */
    ASSERT_OK(dcp_convert_elements(wf, DCP_F32, w8, DCP_F8_E4M3FN, 15));
    for (i = 0; i < 5; i++)
        for (j = 0; j < 3; j++)
            want[i * 3 + j] = wf[i * 3 + j] * sc[(i / 2) * 2 + j / 2];
    e = dcp__src_find(&ix, "l.weight");
    ASSERT(e && e->dtype == DCP_F32 && e->ndim == 2);
    {
        static const int64_t origin[2] = {0, 0};
        ASSERT_OK(
            dcp__src_read_box(&ix, e, origin, e->shape, got, 1 << 20, &err));
    }
    ASSERT_MEM_EQ(got, want, 15 * sizeof(float));
    boxes_match(&ix, e, want, 1);
    /* MXFP4: [2, 1, 12], code * 2^(e - 127) */
    for (i = 0; i < 24; i++) {
        int g = (i % 12) / 4, byte = blk[(i / 12) * 6 + g * 2 + (i % 4) / 2];
        double v = (double)lut[(i & 1) ? byte >> 4 : byte & 15] *
                   ldexp(1.0, ex[(i / 12) * 3 + g] - 127);
        want[i] = v > FLT_MAX    ? HUGE_VALF
                  : v < -FLT_MAX ? -HUGE_VALF
                                 : (float)v;
    }
    e = dcp__src_find(&ix, "e.p_blocks");
    ASSERT(e && e->dtype == DCP_F32 && e->ndim == 3 && e->shape[2] == 12);
    ASSERT_OK(dcp__src_read(&ix, e, 0, 24, got, 1 << 20, &err));
    ASSERT_MEM_EQ(got, want, sizeof(want));
    boxes_match(&ix, e, want, 1);
    /* the scales stay entries of their own */
    ASSERT(dcp__src_find(&ix, "e.p_scales")->dtype == DCP_U8);
    dcp__src_close(&ix);
}

/* dcp_load_file with DCP_LOAD_FILE_DEQUANT: a box of a 256 x 130 FP8
 * weight (block 128: 2 x 2 scales) into float32 and, with DCP_LOAD_CAST,
 * into bfloat16. */
TEST(dequant_load_file)
{
    static uint8_t w8[256 * 130];
    static float wf[256 * 130];
    struct tw t[2] = {{"m.weight", DCP_F8_E5M2, 2, {256, 130}, NULL},
                      {"m.weight_scale_inv", DCP_F32, 2, {2, 2}, NULL}};
    float sc[4] = {0.5f, 3.0f, -1.25f, 1e-30f}, box[10 * 6], want[10 * 6];
    uint16_t bf[10 * 6], wbf[10 * 6];
    const void *d[2] = {w8, sc};
    static const int64_t shape[2] = {256, 130}, off[2] = {125, 124},
                         size[2] = {10, 6};
    dcp_load_options lo;
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    char dir[300];
    int i, j;
    for (i = 0; i < 256 * 130; i++)
        w8[i] = (uint8_t)(i * 131 + 7);
    ASSERT_OK(dcp_convert_elements(wf, DCP_F32, w8, DCP_F8_E5M2, 256 * 130));
    for (i = 0; i < 10; i++)
        for (j = 0; j < 6; j++)
            want[i * 6 + j] = wf[(125 + i) * 130 + 124 + j] *
                              sc[((125 + i) / 128) * 2 + (124 + j) / 128];
    ASSERT_OK(dcp_convert_elements(wbf, DCP_BF16, want, DCP_F32, 60));
    new_dir(dir, sizeof(dir), "dq-load");
    write_raw(dir, "a.safetensors", t, 2, d);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = DCP_LOAD_FILE_DEQUANT | DCP_LOAD_PARTIAL;
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "m.weight", DCP_F32, 2, shape, off, size,
                                   box, DCP_MEM_HOST));
    ASSERT_OK(dcp_load_file(ctx, st, dir, &lo));
    ASSERT_MEM_EQ(box, want, sizeof(want));
    dcp_state_free(st);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "m.weight", DCP_BF16, 2, shape, off,
                                   size, bf, DCP_MEM_HOST));
    lo.flags |= DCP_LOAD_CAST;
    ASSERT_OK(dcp_load_file(ctx, st, dir, &lo));
    ASSERT_MEM_EQ(bf, wbf, sizeof(wbf));
    /* without the flag the weight is the stored float8 */
    lo.flags = DCP_LOAD_PARTIAL;
    ASSERT_RC(dcp_load_file(ctx, st, dir, &lo), DCP_EMISMATCH);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(dequant_refused)
{
    struct tw w3[2] = {{"l.weight", DCP_BF16, 3, {2, 2, 2}, NULL},
                       {"l.weight_scale_inv", DCP_F32, 2, {1, 1}, NULL}};
    struct tw small[2] = {{"l.weight", DCP_BF16, 2, {3, 3}, NULL},
                          {"l.weight_scale_inv", DCP_F32, 2, {1, 2}, NULL}};
    struct tw mx16[2] = {{"p_blocks", DCP_I16, 4, {1, 1, 1, 1}, NULL},
                         {"p_scales", DCP_U8, 3, {1, 1, 1}, NULL}};
    struct tw mxs[2] = {{"p_blocks", DCP_U8, 4, {1, 1, 2, 1}, NULL},
                        {"p_scales", DCP_U8, 3, {1, 1, 1}, NULL}};
    static const uint8_t zeros[64] = {0};
    const void *z[2] = {zeros, zeros};
    const struct {
        const struct tw *t;
        int rc;
        const char *needle;
    } cases[] = {{w3, DCP_ENOTSUP, "of 3 dims"},
                 {small, DCP_EFORMAT, "not at least [2,2]"},
                 {mx16, DCP_ENOTSUP, "uint8"},
                 {mxs, DCP_EFORMAT, "blocks' shape"}};
    size_t k;
    for (k = 0; k < DCP_ARRAY_LEN(cases); k++) {
        struct src_index ix;
        struct dcp_err err = {0, ""};
        char dir[300];
        new_dir(dir, sizeof(dir), "dq-bad");
        write_raw(dir, "a.safetensors", cases[k].t, 2, z);
        ASSERT_OK(dcp__src_open(dir, DCP_FORMAT_AUTO, 1 << 20, &ix, &err));
        ASSERT_RC(dcp__src_dequant(&ix, 2, &err), cases[k].rc);
        if (!strstr(err.msg, cases[k].needle))
            fprintf(stderr, "message \"%s\" lacks \"%s\"\n", err.msg,
                    cases[k].needle);
        ASSERT(strstr(err.msg, cases[k].needle) != NULL);
        dcp__src_close(&ix);
    }
}

int main(void)
{
    (void)snprintf(root, sizeof(root), "/tmp/dcp-test-hfdir-%d", (int)getpid());
    if (mkdir(root, 0755) != 0)
        return 1;
    RUN(two_row_pieces);
    RUN(grid_boxes_and_ranges);
    RUN(hostile_directories);
    RUN(not_hf);
    RUN(save_hf_one_process);
    RUN(dequant);
    RUN(dequant_refused);
    RUN(dequant_load_file);
    if (!getenv("DCP_KEEP_TMP")) {
        char cmd[300];
        (void)snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", root);
    }
    return TEST_SUMMARY();
}
