/*
 * Strided boxes, the paths tests/unit/test_strided.c leaves out: stored
 * bytes read straight into a strided box run by run through the I/O
 * engine (rows of 4 KiB or more, verified block by block or not, rows and
 * columns cut by the load's boxes, a run just under 4 KiB copied instead),
 * a strided save compressed (DCP_SAVE_ZSTD), the plan cache across saves
 * of the same boxes with other strides, a stateful entry's strided box,
 * dcp_load_file from both file formats into a box with a column pitch and
 * a cast, a column-major box (strides {1, rows}) both ways.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../ckptcmp.h"
#include "test.h"

static char root[256];
static const dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

static const char *sub(const char *name)
{
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

#define SENTINEL (-7777.25)

/* A 2-D block with g ghost layers: an (r + 2g) x (c + 2g) allocation filled
 * with the sentinel; interior element (i, j) of global row base gets
 * val(base + i, j) when fill. */
static double val(int64_t i, int64_t j)
{
    return (double)(i * 1000 + j) + 0.5;
}

struct blk {
    double *a;
    int64_t r, c, g, ld; /* interior rows, columns, ghost width, row pitch */
};

static int blk_init(struct blk *b, int64_t r, int64_t c, int64_t g,
                    int64_t base, int fill)
{
    int64_t i, j;
    b->r = r;
    b->c = c;
    b->g = g;
    b->ld = c + 2 * g;
    b->a = malloc((size_t)((r + 2 * g) * b->ld) * sizeof(double));
    if (!b->a)
        return -1;
    for (i = 0; i < (r + 2 * g) * b->ld; i++)
        b->a[i] = SENTINEL;
    for (i = 0; fill && i < r; i++)
        for (j = 0; j < c; j++)
            b->a[(i + g) * b->ld + j + g] = val(base + i, j);
    return 0;
}

static double *blk_in(const struct blk *b)
{
    return b->a + b->g * b->ld + b->g;
}

/* Interior equal to val (rows from base, columns from cbase) and every
 * ghost cell still the sentinel. */
static int blk_check(const struct blk *b, int64_t base, int64_t cbase)
{
    int64_t i, j;
    for (i = 0; i < b->r + 2 * b->g; i++)
        for (j = 0; j < b->ld; j++) {
            int in =
                i >= b->g && i < b->r + b->g && j >= b->g && j < b->c + b->g;
            double want =
                in ? val(base + i - b->g, cbase + j - b->g) : SENTINEL;
            if (b->a[i * b->ld + j] != want) {
                fprintf(stderr, "element (%lld, %lld): %g, want %g\n",
                        (long long)i, (long long)j, b->a[i * b->ld + j], want);
                return 0;
            }
        }
    return 1;
}

/*
 * The 2-D state: global [2 * rows, cols] F64, one box per block (rows
 * [0, rows) and [rows, 2 rows)), each the interior of its own ghost-cell
 * allocation; packed: plain copies of the interiors instead.
 */
static dcp_state *state2d(struct blk *b, int64_t rows, int64_t cols,
                          double **packed)
{
    int64_t shape[2] = {2 * rows, cols}, size[2] = {rows, cols};
    dcp_state *st = NULL;
    int k;
    if (dcp_state_create(&st) != DCP_OK)
        return NULL;
    for (k = 0; k < 2; k++) {
        int64_t off[2] = {k * rows, 0}, stride[2] = {b[k].ld, 1};
        int rc;
        if (packed) {
            int64_t i;
            for (i = 0; i < rows; i++)
                memcpy(packed[k] + i * cols, blk_in(&b[k]) + i * b[k].ld,
                       (size_t)cols * sizeof(double));
            rc = dcp_state_add_tensor(st, "u", DCP_F64, 2, shape, off, size,
                                      packed[k], DCP_MEM_HOST);
        } else {
            rc = dcp_state_add_tensor_strided(st, "u", DCP_F64, 2, shape, off,
                                              size, stride, blk_in(&b[k]),
                                              DCP_MEM_HOST);
        }
        if (rc != DCP_OK) {
            dcp_state_free(st);
            return NULL;
        }
    }
    return st;
}

/* Saves the 2-D blocks strided to dir/s and packed to dir/p, the bytes
 * compared (not for DCP_SAVE_ZSTD: the compressed save ids differ). */
static int save2d(dcp_ctx *ctx, int64_t rows, int64_t cols, const char *s,
                  const char *p, const dcp_save_options *so)
{
    struct blk b[2];
    double *packed[2];
    dcp_state *st;
    int k, ok = 1;
    for (k = 0; k < 2; k++) {
        if (blk_init(&b[k], rows, cols, 1, k * rows, 1))
            return 0;
        packed[k] = malloc((size_t)(rows * cols) * sizeof(double));
    }
    st = state2d(b, rows, cols, NULL);
    ok = st && dcp_save(ctx, st, s, so) == DCP_OK;
    dcp_state_free(st);
    st = state2d(b, rows, cols, packed);
    ok = ok && st && dcp_save(ctx, st, p, so) == DCP_OK;
    dcp_state_free(st);
    ok = ok && ((so->flags & DCP_SAVE_ZSTD) || same_checkpoint(ctx, s, p));
    for (k = 0; k < 2; k++) {
        free(b[k].a);
        free(packed[k]);
    }
    return ok;
}

/* The I/O engine's report of the last load2d: bytes it read. */
static dcp_io_report last_io;

/* Loads path into one box of global [2 rows, cols] per destination
 * layout: boxes of nr rows x nc columns tiling it, each a block with g
 * ghost layers (g = 0: packed), and checks them. */
static int load2d(dcp_ctx *ctx, const char *path, int64_t rows, int64_t cols,
                  int64_t nr, int64_t nc, int64_t g, unsigned flags)
{
    int64_t shape[2] = {2 * rows, cols}, size[2] = {nr, nc};
    dcp_load_options lo = {sizeof(lo), flags, NULL};
    struct blk b[64];
    dcp_state *st = NULL;
    int n = 0, k, ok;
    int64_t i, j;
    ok = dcp_state_create(&st) == DCP_OK;
    for (i = 0; ok && i < 2 * rows; i += nr)
        for (j = 0; ok && j < cols; j += nc) {
            int64_t off[2] = {i, j}, stride[2];
            ok = blk_init(&b[n], nr, nc, g, 0, 0) == 0;
            stride[0] = b[n].ld;
            stride[1] = 1;
            ok = ok &&
                 dcp_state_add_tensor_strided(
                     st, "u", DCP_F64, 2, shape, off, size, g ? stride : NULL,
                     blk_in(&b[n]), DCP_MEM_HOST) == DCP_OK;
            n++;
        }
    ok = ok && dcp_load(ctx, st, path, &lo) == DCP_OK;
    if (!ok)
        fprintf(stderr, "load: %s\n", dcp_errmsg(ctx));
    memset(&last_io, 0, sizeof(last_io));
    last_io.struct_size = sizeof(last_io);
    (void)dcp_ctx_io_report(ctx, DCP_IO_LOAD, &last_io);
    for (k = 0, i = 0; ok && i < 2 * rows; i += nr)
        for (j = 0; ok && j < cols; j += nc)
            ok = blk_check(&b[k++], i, j);
    for (k = 0; k < n; k++)
        free(b[k].a);
    dcp_state_free(st);
    return ok;
}

TEST(long_rows_read_straight)
{
    /* 8 KiB rows: the strided destination takes the stored bytes run by
     * run through the I/O engine (which then reads at least the tensor's
     * bytes), verified block by block or not, whatever cuts the boxes */
    const uint64_t bytes = 80 * 1024 * sizeof(double);
    dcp_ctx *ctx = NULL;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT(save2d(ctx, 40, 1024, sub("lrs"), sub("lrp"), &nosync));
    ASSERT(load2d(ctx, sub("lrs"), 40, 1024, 40, 1024, 1, 0));
    ASSERT(last_io.bytes >= bytes);
    ASSERT(load2d(ctx, sub("lrs"), 40, 1024, 40, 1024, 2, DCP_LOAD_NO_VERIFY));
    ASSERT(last_io.bytes >= bytes);
    ASSERT(load2d(ctx, sub("lrs"), 40, 1024, 80, 1024, 1, 0));
    ASSERT(load2d(ctx, sub("lrs"), 40, 1024, 16, 1024, 3, DCP_LOAD_NO_VERIFY));
    /* runs of exactly 4 KiB (columns cut in two): still straight */
    ASSERT(load2d(ctx, sub("lrs"), 40, 1024, 40, 512, 1, 0));
    ASSERT(last_io.bytes >= bytes);
    ASSERT(load2d(ctx, sub("lrs"), 40, 1024, 8, 256, 1, DCP_LOAD_NO_VERIFY));
    dcp_ctx_free(ctx);
}

TEST(short_rows_copied)
{
    /* rows of 4088 bytes (511 doubles), a run just under 4 KiB: each chunk
     * is read once and copied into the strided box, not through the
     * engine's batch */
    dcp_ctx *ctx = NULL;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT(save2d(ctx, 20, 511, sub("srs"), sub("srp"), &nosync));
    ASSERT(load2d(ctx, sub("srs"), 20, 511, 20, 511, 1, 0));
    ASSERT(last_io.bytes < 40 * 511 * sizeof(double));
    ASSERT(load2d(ctx, sub("srs"), 20, 511, 40, 511, 2, DCP_LOAD_NO_VERIFY));
    /* the packed destination of the same chunks: through the batch */
    ASSERT(load2d(ctx, sub("srs"), 20, 511, 20, 511, 0, 0));
    ASSERT(last_io.bytes >= 40 * 511 * sizeof(double));
    dcp_ctx_free(ctx);
}

TEST(plan_cache_other_strides)
{
    /* a strided save then the packed one of the same boxes: the second
     * reuses the first's plan, and both checkpoints are the same */
    dcp_ctx *ctx = NULL;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT(save2d(ctx, 64, 48, sub("pc1"), sub("pc2"), &nosync));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 1);
    ASSERT(load2d(ctx, sub("pc1"), 64, 48, 64, 48, 2, 0));
    ASSERT(load2d(ctx, sub("pc2"), 64, 48, 32, 24, 1, 0));
    dcp_ctx_free(ctx);
}

TEST(zstd)
{
    dcp_ctx_options co;
    dcp_save_options z = {sizeof(z), 1, DCP_SAVE_ZSTD, NULL};
    dcp_ctx *ctx = NULL;
    /* compressed records (through a 64 KiB staging budget: pieces cut
     * inside rows), loaded resharded into another ghost layout */
    memset(&co, 0, sizeof(co));
    co.struct_size = sizeof(co);
    co.staging_budget = 64 << 10;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, &co));
    ASSERT(save2d(ctx, 60, 100, sub("zs"), sub("zp"), &z));
    ASSERT(load2d(ctx, sub("zs"), 60, 100, 120, 100, 2, 0));
    dcp_ctx_free(ctx);
}

/* A stateful entry adding a strided box. */
static struct blk sf_blk;

static int sf_state_dict(void *u, dcp_state *st)
{
    int64_t shape[2] = {8, 6}, stride[2] = {sf_blk.ld, 1};
    (void)u;
    return dcp_state_add_tensor_strided(st, "w", DCP_F64, 2, shape, NULL, NULL,
                                        stride, blk_in(&sf_blk), DCP_MEM_HOST);
}

static int sf_load(void *u, const dcp_state *st)
{
    (void)u;
    (void)st;
    return 0;
}

TEST(stateful)
{
    static const dcp_stateful_ops ops = {DCP_STATEFUL_OPS_VERSION,
                                         sf_state_dict, sf_load};
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT(blk_init(&sf_blk, 8, 6, 1, 0, 1) == 0);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_stateful(st, "obj", &ops, NULL));
    ASSERT_OK(dcp_save(ctx, st, sub("sf"), &nosync));
    free(sf_blk.a);
    ASSERT(blk_init(&sf_blk, 8, 6, 2, 0, 0) == 0);
    ASSERT_OK(dcp_load(ctx, st, sub("sf"), NULL));
    ASSERT(blk_check(&sf_blk, 0, 0));
    free(sf_blk.a);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(load_file)
{
    static const char *const outs[] = {"lf.safetensors", "lf.pt"};
    dcp_convert_options o;
    dcp_ctx *ctx = NULL;
    size_t f;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT(save2d(ctx, 64, 48, sub("lfs"), sub("lfp"), &nosync));
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    for (f = 0; f < 2; f++) {
        int64_t shape[2] = {128, 48}, off[2] = {8, 4}, size[2] = {100, 40};
        int64_t stride[2];
        dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, NULL};
        struct blk b;
        dcp_state *st = NULL;
        float *fb;
        int64_t i, j;
        int bad = 0;
        ASSERT_OK(dcp_export(ctx, sub("lfs"), sub(outs[f]), &o, NULL));
        /* a box cutting the stored chunk boundary, with 2 ghost layers */
        ASSERT(blk_init(&b, 100, 40, 2, 0, 0) == 0);
        stride[0] = b.ld;
        stride[1] = 1;
        ASSERT_OK(dcp_state_create(&st));
        ASSERT_OK(dcp_state_add_tensor_strided(st, "u", DCP_F64, 2, shape, off,
                                               size, stride, blk_in(&b),
                                               DCP_MEM_HOST));
        ASSERT_OK(dcp_load_file(ctx, st, sub(outs[f]), &lo));
        for (i = 0; i < 100 + 4 && !bad; i++)
            for (j = 0; j < b.ld; j++) {
                int in = i >= 2 && i < 102 && j >= 2 && j < 42;
                double want = in ? val(8 + i - 2, 4 + j - 2) : SENTINEL;
                bad |= b.a[i * b.ld + j] != want;
            }
        ASSERT(!bad);
        dcp_state_free(st);
        free(b.a);
        /* cast: float32 destination, a column pitch of 3 (every third) */
        fb = malloc(128 * 48 * 3 * sizeof(float));
        ASSERT(fb);
        for (i = 0; i < 128 * 48 * 3; i++)
            fb[i] = -1.0f;
        stride[0] = 48 * 3;
        stride[1] = 3;
        lo.flags = DCP_LOAD_CAST;
        ASSERT_OK(dcp_state_create(&st));
        ASSERT_OK(dcp_state_add_tensor_strided(st, "u", DCP_F32, 2, shape, NULL,
                                               NULL, stride, fb, DCP_MEM_HOST));
        ASSERT_OK(dcp_load_file(ctx, st, sub(outs[f]), &lo));
        for (i = 0; i < 128 && !bad; i++)
            for (j = 0; j < 48 * 3; j++)
                bad |= fb[i * 48 * 3 + j] !=
                       (j % 3 ? -1.0f : (float)val(i, j / 3));
        ASSERT(!bad);
        dcp_state_free(st);
        free(fb);
    }
    dcp_ctx_free(ctx);
}

/* A column-major box (strides {1, rows}) saves the C-order bytes. */
TEST(transposed)
{
    int64_t shape[2] = {5, 7}, cm[2] = {1, 5};
    double colmajor[35], rowmajor[35], got[35];
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    int i, j;
    for (i = 0; i < 5; i++)
        for (j = 0; j < 7; j++) {
            colmajor[j * 5 + i] = val(i, j);
            rowmajor[i * 7 + j] = val(i, j);
        }
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor_strided(st, "t", DCP_F64, 2, shape, NULL,
                                           NULL, cm, colmajor, DCP_MEM_HOST));
    ASSERT_OK(dcp_save(ctx, st, sub("tr"), &nosync));
    dcp_state_free(st);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "t", DCP_F64, 2, shape, NULL, NULL, got,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_load(ctx, st, sub("tr"), NULL));
    ASSERT_MEM_EQ(got, rowmajor, sizeof(got));
    dcp_state_free(st);
    /* and back into a column-major buffer */
    memset(colmajor, 0, sizeof(colmajor));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor_strided(st, "t", DCP_F64, 2, shape, NULL,
                                           NULL, cm, colmajor, DCP_MEM_HOST));
    ASSERT_OK(dcp_load(ctx, st, sub("tr"), NULL));
    for (i = 0; i < 5; i++)
        for (j = 0; j < 7; j++)
            ASSERT(colmajor[j * 5 + i] == val(i, j));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

int main(void)
{
    char cmd[300];
    int rc;
    snprintf(root, sizeof(root), "/tmp/dcp-test-strided-runs-XXXXXX");
    if (!mkdtemp(root))
        return 2;
    RUN(long_rows_read_straight);
    RUN(short_rows_copied);
    RUN(plan_cache_other_strides);
    RUN(zstd);
    RUN(stateful);
    RUN(load_file);
    RUN(transposed);
    rc = TEST_SUMMARY();
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (!getenv("DCP_TEST_KEEP") && system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", root);
    return rc;
}
