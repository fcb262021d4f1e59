/*
 * dcp_uneven_1d: the global offset and length of an uneven 1-D array
 * across ranks (an exclusive prefix sum and the total). Lengths uneven,
 * zero on some ranks, zero everywhere; a bad argument on one rank is
 * DCP_EINVAL on every rank; an overflowing total DCP_ELIMIT on every rank;
 * and the offsets used for a save of an uneven array, loaded back whole.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include "mpitest.h"

static dcp_comm *comm;
static char root[256];

/* Rank r's length: 5, 0, 7, 0, 5, 0, 7, ... (zero on every odd rank). */
static int64_t len_of(int r)
{
    return r % 2 ? 0 : (r % 4 ? 7 : 5);
}

static void test_uneven_and_zero_lengths(void)
{
    int64_t off = -1, tot = -1, want_off = 0, want_tot = 0;
    int r;
    for (r = 0; r < mt_size; r++) {
        if (r < mt_rank)
            want_off += len_of(r);
        want_tot += len_of(r);
    }
    CHECK(dcp_uneven_1d(comm, len_of(mt_rank), &off, &tot) == DCP_OK);
    CHECK(off == want_off);
    CHECK(tot == want_tot);
    /* Zero everywhere. */
    CHECK(dcp_uneven_1d(comm, 0, &off, &tot) == DCP_OK);
    CHECK(off == 0 && tot == 0);
    /* Only the last rank holds anything. */
    CHECK(dcp_uneven_1d(comm, mt_rank == mt_size - 1 ? 3 : 0, &off, &tot) ==
          DCP_OK);
    CHECK(off == 0 && tot == 3);
}

static void test_bad_input_agreed(void)
{
    int64_t off = -1, tot = -1;
    int rc;
    /* A negative length on the last rank only. */
    rc = dcp_uneven_1d(comm, mt_rank == mt_size - 1 ? -1 : 4, &off, &tot);
    CHECK(rc == DCP_EINVAL);
    CHECK(mt_same(rc));
    CHECK(off == 0 && tot == 0);
    /* A NULL output on rank 0 only. */
    rc = dcp_uneven_1d(comm, 4, mt_rank == 0 ? NULL : &off, &tot);
    CHECK(rc == DCP_EINVAL);
    CHECK(mt_same(rc));
    /* A total beyond INT64_MAX (with more than one rank). */
    rc = dcp_uneven_1d(comm, INT64_MAX / 2 + 1, &off, &tot);
    CHECK(rc == (mt_size > 1 ? DCP_ELIMIT : DCP_OK));
    CHECK(mt_same(rc));
    /* Still usable afterwards. */
    CHECK(dcp_uneven_1d(comm, 1, &off, &tot) == DCP_OK);
    CHECK(off == mt_rank && tot == mt_size);
}

static void test_save_uneven_load_whole(void)
{
    char dir[512];
    dcp_ctx *ctx;
    dcp_state *st;
    int64_t n = len_of(mt_rank), off, tot, i;
    double x[8], *all;
    snprintf(dir, sizeof(dir), "%s/ck", root);
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == DCP_OK);
    CHECK(dcp_uneven_1d(comm, n, &off, &tot) == DCP_OK);
    for (i = 0; i < n; i++)
        x[i] = (double)(off + i) * 0.5;
    CHECK(dcp_state_create(&st) == DCP_OK);
    CHECK(dcp_state_add_tensor(st, "x", DCP_F64, 1, &tot, &off, &n, x,
                               DCP_MEM_HOST) == DCP_OK);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, NULL));
    dcp_state_free(st);
    /* Every rank loads the whole array. */
    all = calloc((size_t)tot + 1, sizeof(*all));
    CHECK(dcp_state_create(&st) == DCP_OK);
    CHECK(dcp_state_add_tensor(st, "x", DCP_F64, 1, &tot, NULL, NULL, all,
                               DCP_MEM_HOST) == DCP_OK);
    CHECK_OK(ctx, dcp_load(ctx, st, dir, NULL));
    for (i = 0; i < tot; i++)
        CHECK(all[i] == (double)i * 0.5);
    dcp_state_free(st);
    free(all);
    dcp_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    mt_init(&argc, &argv);
    mt_tmpdir(root, sizeof(root), "uneven");
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    RUN(uneven_and_zero_lengths);
    RUN(bad_input_agreed);
    RUN(save_uneven_load_whole);
    dcp_comm_free(comm);
    return mt_finish();
}
