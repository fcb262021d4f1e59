/*
 * Strided boxes over MPI (dcp_state_add_tensor_strided): a 2-D field
 * saved as each rank's row block with a ghost layer, loaded resharded
 * into column blocks with two ghost layers and, on every rank, whole into
 * a ghosted array (a replicated load: read once and forwarded, or per
 * rank) — bit-exact, ghost cells untouched.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include "mpitest.h"

#define NR   41
#define NC   29
#define SENT 0x7fc0beefu

static dcp_comm *comm;
static char root[256];

static uint32_t val(int64_t i, int64_t j)
{
    return (uint32_t)(i * 100003 + j * 7 + 1);
}

/* A ghosted array for the box (off, size) with g ghost layers and rows of
 * size[1] + 2g + pad elements: the box at val(), the rest SENT. */
static uint32_t *ghosted(const int64_t *off, const int64_t *size, int64_t g,
                         int64_t pad, int fill, int64_t *cw)
{
    int64_t rw = size[0] + 2 * g, i, j;
    uint32_t *a;
    *cw = size[1] + 2 * g + pad;
    a = malloc(sizeof(*a) * (size_t)(rw * *cw + 1));
    if (!a)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (i = 0; i < rw; i++)
        for (j = 0; j < *cw; j++) {
            int in = i >= g && i < g + size[0] && j >= g && j < g + size[1];
            a[i * *cw + j] =
                in && fill ? val(off[0] + i - g, off[1] + j - g) : SENT;
        }
    return a;
}

static int check(const uint32_t *a, const int64_t *off, const int64_t *size,
                 int64_t g, int64_t cw)
{
    int64_t rw = size[0] + 2 * g, i, j;
    for (i = 0; i < rw; i++)
        for (j = 0; j < cw; j++) {
            int in = i >= g && i < g + size[0] && j >= g && j < g + size[1];
            uint32_t want = in ? val(off[0] + i - g, off[1] + j - g) : SENT;
            if (a[i * cw + j] != want)
                return 0;
        }
    return 1;
}

static dcp_state *state_of(const int64_t *off, const int64_t *size, uint32_t *a,
                           int64_t g, int64_t cw)
{
    dcp_state *st = NULL;
    int64_t shape[2] = {NR, NC}, strides[2] = {cw, 1};
    if (dcp_state_create(&st) ||
        dcp_state_add_tensor_strided(st, "field", DCP_U32, 2, shape, off, size,
                                     strides, a + g * cw + g, DCP_MEM_HOST))
        MPI_Abort(MPI_COMM_WORLD, 1);
    return st;
}

static void test_rows_to_columns(void)
{
    dcp_ctx *ctx = NULL;
    int64_t off[2], size[2], cw;
    uint32_t *a, *b;
    dcp_state *st;
    char path[400];
    int per_rank;
    snprintf(path, sizeof path, "%s/field", root);
    CHECK_OK(ctx, dcp_ctx_create(&ctx, comm, NULL));
    mt_split(NR, mt_size, mt_rank, &off[0], &size[0]);
    off[1] = 0;
    size[1] = NC;
    a = ghosted(off, size, 1, 0, 1, &cw);
    st = state_of(off, size, a, 1, cw);
    CHECK_OK(ctx, dcp_save(ctx, st, path, NULL));
    CHECK(check(a, off, size, 1, cw)); /* the save wrote nothing there */
    dcp_state_free(st);
    free(a);
    for (per_rank = 0; per_rank < 2; per_rank++) {
        dcp_load_options lo;
        memset(&lo, 0, sizeof(lo));
        lo.struct_size = sizeof(lo);
        lo.flags = per_rank ? DCP_LOAD_PER_RANK_READS : 0;
        /* Columns, two ghost layers, padded rows. */
        mt_split(NC, mt_size, mt_rank, &off[1], &size[1]);
        off[0] = 0;
        size[0] = NR;
        b = ghosted(off, size, 2, 3, 0, &cw);
        st = state_of(off, size, b, 2, cw);
        CHECK_OK(ctx, dcp_load(ctx, st, path, &lo));
        CHECK(check(b, off, size, 2, cw));
        dcp_state_free(st);
        free(b);
        /* The whole field on every rank (replicated: read once). */
        off[0] = off[1] = 0;
        size[0] = NR;
        size[1] = NC;
        b = ghosted(off, size, 1, 1, 0, &cw);
        st = state_of(off, size, b, 1, cw);
        CHECK_OK(ctx, dcp_load(ctx, st, path, &lo));
        CHECK(check(b, off, size, 1, cw));
        dcp_state_free(st);
        free(b);
    }
    dcp_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    mt_init(&argc, &argv);
    mt_tmpdir(root, sizeof(root), "strided");
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    RUN(rows_to_columns);
    dcp_comm_free(comm);
    return mt_finish();
}
