/*
 * Strided boxes across two runs of ranks (mpi_strided.c does one run): a
 * 2-D and a 3-D field, each rank's block the interior of an allocation
 * with ghost cells, saved on N ranks without packing (sync, and async with
 * the buffers changed as soon as the call returns), then loaded by another
 * world size into other ghost-cell layouts (rows cut elsewhere, columns,
 * every rank the whole of both: the read-once exchange into strided
 * boxes), read once and per rank, every ghost cell checked untouched; and
 * dcp_load_file of the exported field into strided boxes, each rank
 * reading its own ranges or rank 0 reading for all.
 *
 *   mpi_strided_io save DIR    on N ranks: DIR/s (sync), DIR/a (async)
 *   mpi_strided_io load DIR    on M ranks: checks both
 */
#include "mpitest.h"

#include <dcp/dcp_convert.h>

#include <unistd.h> /* access */

#define ROWS    96
#define COLS    40
#define D0      12
#define D1      10
#define D2      18
#define GHOST_V (-31.5)

static const dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

static double val(int64_t i, int64_t j)
{
    return (double)(i * 1000 + j) + 0.25;
}

static float val3(int64_t i, int64_t j, int64_t k)
{
    return (float)(i * 10000 + j * 100 + k);
}

/* A block: the box (off, size) of a field inside an allocation with g
 * ghost layers on every side. */
struct blk {
    int nd;
    int64_t off[3], size[3], dim[3], stride[3], g;
    size_t es, total;
    unsigned char *a;
};

static void blk_init(struct blk *b, int nd, const int64_t *off,
                     const int64_t *size, int64_t g, size_t es)
{
    int d;
    b->nd = nd;
    b->g = g;
    b->es = es;
    b->total = 1;
    for (d = 0; d < nd; d++) {
        b->off[d] = off[d];
        b->size[d] = size[d];
        b->dim[d] = size[d] + 2 * g;
        b->total *= (size_t)b->dim[d];
    }
    for (d = nd - 1; d >= 0; d--)
        b->stride[d] = d == nd - 1 ? 1 : b->stride[d + 1] * b->dim[d + 1];
    b->a = malloc(b->total * es + 1);
}

/* Element offset of allocation position p. */
static size_t blk_at(const struct blk *b, const int64_t *p)
{
    size_t at = 0;
    int d;
    for (d = 0; d < b->nd; d++)
        at += (size_t)(p[d] * b->stride[d]);
    return at;
}

static void *blk_in(const struct blk *b)
{
    int64_t p[3] = {b->g, b->g, b->g};
    return b->a + blk_at(b, p) * b->es;
}

/* The expected value of allocation position p: the field's, or the ghost
 * value. */
static double want(const struct blk *b, const int64_t *p, int *in)
{
    int64_t q[3];
    int d;
    *in = 1;
    for (d = 0; d < b->nd; d++) {
        q[d] = b->off[d] + p[d] - b->g;
        if (p[d] < b->g || p[d] >= b->g + b->size[d])
            *in = 0;
    }
    if (!*in)
        return GHOST_V;
    return b->nd == 2 ? val(q[0], q[1]) : (double)val3(q[0], q[1], q[2]);
}

/* Fills the interior (fill) or checks every element; returns mismatches. */
static int blk_walk(struct blk *b, int fill)
{
    int64_t p[3] = {0, 0, 0};
    size_t k;
    int bad = 0, d;
    for (k = 0; k < b->total; k++) {
        int in;
        double w = want(b, p, &in);
        size_t at = blk_at(b, p);
        if (fill) {
            double v = in ? w : GHOST_V;
            if (b->es == 8)
                ((double *)(void *)b->a)[at] = v;
            else
                ((float *)(void *)b->a)[at] = (float)v;
        } else {
            double got =
                b->es == 8 ? ((double *)(void *)b->a)[at] : (double)((float *)(void *)b->a)[at];
            if (got != w && bad++ < 3)
                fprintf(stderr, "[rank %d] element %zu: %g, want %g\n", mt_rank,
                        at, got, w);
        }
        for (d = b->nd - 1; d >= 0; d--) {
            if (++p[d] < b->dim[d])
                break;
            p[d] = 0;
        }
    }
    return bad;
}

/* Fills every element (ghosts too) with the ghost value. */
static void blk_ghosts(struct blk *b)
{
    size_t k;
    for (k = 0; k < b->total; k++) {
        if (b->es == 8)
            ((double *)(void *)b->a)[k] = GHOST_V;
        else
            ((float *)(void *)b->a)[k] = (float)GHOST_V;
    }
}

static int add(dcp_state *st, const char *key, const struct blk *b)
{
    static const int64_t s2[2] = {ROWS, COLS}, s3[3] = {D0, D1, D2};
    return dcp_state_add_tensor_strided(
        st, key, b->es == 8 ? DCP_F64 : DCP_F32, b->nd, b->nd == 2 ? s2 : s3,
        b->off, b->size, b->stride, blk_in(b), DCP_MEM_HOST);
}

/* Saving ranks: rows of the 2-D field (ghost 1), the 3-D field split
 * along its middle dimension (ghost 1). */
static void save_blocks(struct blk *u, struct blk *phi)
{
    int64_t o2[2], z2[2], o3[3] = {0, 0, 0}, z3[3] = {D0, 0, D2};
    mt_split(ROWS, mt_size, mt_rank, &o2[0], &z2[0]);
    o2[1] = 0;
    z2[1] = COLS;
    mt_split(D1, mt_size, mt_rank, &o3[1], &z3[1]);
    blk_init(u, 2, o2, z2, 1, 8);
    blk_init(phi, 3, o3, z3, 1, 4);
    blk_walk(u, 1);
    blk_walk(phi, 1);
}

static void do_save(dcp_ctx *ctx, const char *dir)
{
    char s[512], a[512];
    struct blk u, phi;
    dcp_state *st = NULL;
    dcp_request *req = NULL;
    snprintf(s, sizeof(s), "%s/s", dir);
    snprintf(a, sizeof(a), "%s/a", dir);
    save_blocks(&u, &phi);
    CHECK_OK(ctx, dcp_state_create(&st));
    CHECK_OK(ctx, add(st, "u", &u));
    CHECK_OK(ctx, add(st, "phi", &phi));
    CHECK_OK(ctx, dcp_save(ctx, st, s, &nosync));
    CHECK_OK(ctx, dcp_save_async(ctx, st, a, &nosync, &req));
    blk_ghosts(&u); /* changed as soon as the call returns */
    blk_ghosts(&phi);
    CHECK_OK(ctx, dcp_request_wait(req));
    dcp_request_free(req);
    dcp_state_free(st);
    free(u.a);
    free(phi.a);
}

/*
 * Loads path into this rank's boxes of one layout and checks them:
 * layout 0: rows cut for this world size (ghost 2) and the 3-D field by
 * its last dimension (ghost 3); 1: columns (ghost 1) and the 3-D field
 * by its first; 2: every rank the whole of both (ghost 2).
 */
static void load_layout(dcp_ctx *ctx, const char *path, int layout,
                        unsigned flags)
{
    int64_t o2[2] = {0, 0}, z2[2] = {ROWS, COLS};
    int64_t o3[3] = {0, 0, 0}, z3[3] = {D0, D1, D2};
    dcp_load_options lo = {sizeof(lo), flags, NULL};
    struct blk u, phi;
    dcp_state *st = NULL;
    int64_t g2 = 2, g3 = 2;
    if (layout == 0) {
        mt_split(ROWS, mt_size, mt_rank, &o2[0], &z2[0]);
        mt_split(D2, mt_size, mt_rank, &o3[2], &z3[2]);
        g3 = 3;
    } else if (layout == 1) {
        mt_split(COLS, mt_size, mt_rank, &o2[1], &z2[1]);
        mt_split(D0, mt_size, mt_rank, &o3[0], &z3[0]);
        g2 = 1;
    }
    blk_init(&u, 2, o2, z2, g2, 8);
    blk_init(&phi, 3, o3, z3, g3, 4);
    blk_ghosts(&u);
    blk_ghosts(&phi);
    CHECK_OK(ctx, dcp_state_create(&st));
    CHECK_OK(ctx, add(st, "u", &u));
    CHECK_OK(ctx, add(st, "phi", &phi));
    CHECK_OK(ctx, dcp_load(ctx, st, path, &lo));
    CHECK(blk_walk(&u, 0) == 0);
    CHECK(blk_walk(&phi, 0) == 0);
    dcp_state_free(st);
    free(u.a);
    free(phi.a);
}

static void load_file(dcp_ctx *ctx, const char *dir, unsigned flags)
{
    char ck[512], file[512];
    int64_t o2[2] = {0, 0}, z2[2] = {ROWS, COLS};
    dcp_load_options lo = {sizeof(lo), flags | DCP_LOAD_PARTIAL, NULL};
    struct blk u;
    dcp_state *st = NULL;
    int rc = DCP_OK;
    snprintf(ck, sizeof(ck), "%s/s", dir);
    snprintf(file, sizeof(file), "%s/u%d.safetensors", dir, mt_size);
    if (mt_rank == 0 && access(file, F_OK) != 0) {
        dcp_ctx *one = NULL;
        dcp_convert_options o;
        memset(&o, 0, sizeof(o));
        o.struct_size = sizeof(o);
        rc = dcp_ctx_create(&one, NULL, NULL);
        if (rc == DCP_OK)
            rc = dcp_export(one, ck, file, &o, NULL);
        dcp_ctx_free(one);
    }
    MPI_Bcast(&rc, 1, MPI_INT, 0, MPI_COMM_WORLD);
    CHECK_OK(ctx, rc);
    mt_split(ROWS, mt_size, mt_rank, &o2[0], &z2[0]);
    blk_init(&u, 2, o2, z2, 2, 8);
    blk_ghosts(&u);
    CHECK_OK(ctx, dcp_state_create(&st));
    CHECK_OK(ctx, add(st, "u", &u));
    CHECK_OK(ctx, dcp_load_file(ctx, st, file, &lo));
    CHECK(blk_walk(&u, 0) == 0);
    dcp_state_free(st);
    free(u.a);
}

static dcp_ctx *g_ctx;
static const char *g_dir;

static void test_save(void)
{
    do_save(g_ctx, g_dir);
}

static void test_load(void)
{
    static const unsigned fl[2] = {0, DCP_LOAD_PER_RANK_READS};
    char p[512];
    int w, layout, f;
    for (w = 0; w < 2; w++) {
        snprintf(p, sizeof(p), "%s/%s", g_dir, w ? "a" : "s");
        for (layout = 0; layout < 3; layout++)
            for (f = 0; f < 2; f++)
                load_layout(g_ctx, p, layout, fl[f]);
    }
}

static void test_load_file(void)
{
    load_file(g_ctx, g_dir, 0);
    load_file(g_ctx, g_dir, DCP_LOAD_FILE_ROOT_READS);
}

int main(int argc, char **argv)
{
    dcp_comm *comm = NULL;
    mt_init(&argc, &argv);
    if (argc < 3 || dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK ||
        dcp_ctx_create(&g_ctx, comm, NULL) != DCP_OK) {
        fprintf(stderr, "usage: mpi_strided_io save|load DIR\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    g_dir = argv[2];
    if (strcmp(argv[1], "save") == 0) {
        RUN(save);
    } else {
        RUN(load);
        RUN(load_file);
    }
    dcp_ctx_free(g_ctx);
    dcp_comm_free(comm);
    return mt_finish();
}
