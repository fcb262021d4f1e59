/*
 * The checkpoint manager over MPI: `save DIR` on 3 ranks runs steps 1..10
 * with an interval of 2, a "save now" asked by rank 1 alone at step 5
 * (every rank must save), asynchronous saves (one in flight), retention
 * keep_last 2 + keep_every 4, and a step that differs between ranks
 * (refused on every rank). `restart DIR` on any number of ranks loads the
 * latest (step 10) bit-exact from the 3-rank checkpoint, resharded, then
 * goes on to step 12 with retention.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_manager.h>
#include <dcp/dcp_mpi.h>

#include <mpi.h>

#include "mpitest.h"

static const char *root;
static const int64_t shape[2] = {12, 5};
static const dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

/* This rank's rows of w, filled for step (or zero when fill is 0). */
static float rows[12 * 5];
static int64_t off[2], size[2];
static dcp_state *make_state(int64_t step, int fill)
{
    dcp_state *st = NULL;
    mt_split(shape[0], mt_size, mt_rank, &off[0], &size[0]);
    off[1] = 0;
    size[1] = shape[1];
    if (fill)
        mt_fill((unsigned char *)rows, 2, shape, off, size, sizeof(float),
                (unsigned)step);
    else
        memset(rows, 0, sizeof rows);
    if (dcp_state_create(&st) != DCP_OK ||
        dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off, size, rows,
                             DCP_MEM_HOST) != DCP_OK ||
        dcp_state_add_value(st, "step", dcp_value_int(step)) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    return st;
}

static int rows_hold(int64_t step)
{
    unsigned char want[sizeof rows];
    mt_fill(want, 2, shape, off, size, sizeof(float), (unsigned)step);
    return memcmp(want, rows, mt_numel(2, size) * sizeof(float)) == 0;
}

/* Complete steps under root as a mask of steps 0..63. */
static uint64_t complete_mask(dcp_ctx *ctx)
{
    dcp_manager_entry *e = NULL;
    size_t n = 0;
    uint64_t mask = 0;
    if (dcp_manager_list(ctx, root, NULL, &e, &n) != DCP_OK)
        return ~(uint64_t)0;
    for (size_t i = 0; i < n; i++)
        if (e[i].status == DCP_MANAGER_COMPLETE && e[i].step < 64)
            mask |= (uint64_t)1 << e[i].step;
    dcp_manager_list_free(e, n);
    return mask;
}

#define BIT(s) ((uint64_t)1 << (s))

static dcp_manager_options mopts(void)
{
    dcp_manager_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.interval = 2;
    o.keep_last = 2;
    o.keep_every = 4;
    o.async = 1;
    o.save_opts = &nosync;
    return o;
}

static void test_save(void)
{
    dcp_comm *comm = NULL;
    dcp_ctx *ctx = NULL;
    dcp_manager *m = NULL;
    CHECK_OK(ctx, dcp_comm_mpi(&comm, MPI_COMM_WORLD));
    CHECK_OK(ctx, dcp_ctx_create(&ctx, comm, NULL));
    dcp_manager_options o = mopts();
    CHECK_OK(ctx, dcp_manager_create(&m, ctx, root, &o));
    int64_t latest = 7;
    CHECK_RC(ctx, dcp_manager_latest(m, &latest), DCP_ENOENT);
    CHECK(latest == -1);
    for (int64_t s = 1; s <= 10; s++) {
        dcp_state *st = make_state(s, 1);
        int did = -1;
        if (s == 5 && mt_rank == 1)
            dcp_manager_request_save(m);
        CHECK_OK(ctx, dcp_manager_step(m, st, s, &did));
        CHECK(mt_same(did));
        CHECK(did == (s % 2 == 0 || s == 5));
        /* The buffers may change as soon as the step returns. */
        memset(rows, 0xa5, sizeof rows);
        dcp_state_free(st);
        /* latest completes the save in flight: every rank sees s. */
        if (s == 5) {
            CHECK_OK(ctx, dcp_manager_latest(m, &latest));
            CHECK(latest == 5);
            CHECK(mt_same((int)latest));
        }
    }
    /* A step that differs between ranks: refused on every rank, nothing
     * saved. */
    dcp_state *st = make_state(11, 1);
    int did = -1;
    int rc = dcp_manager_step(m, st, mt_rank == 2 ? 13 : 12, &did);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc));
    CHECK(mt_same_str(dcp_errmsg(ctx)));
    CHECK(did == 0);
    dcp_state_free(st);
    CHECK_OK(ctx, dcp_manager_wait(m));
    CHECK_OK(ctx, dcp_manager_latest(m, &latest));
    CHECK(latest == 10);
    /* Saves at 2, 4, 5, 6, 8, 10; kept: the last 2 (8, 10) and every
     * multiple of 4 (4, 8). */
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(complete_mask(ctx) == (BIT(4) | BIT(8) | BIT(10)));
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
}

static void test_restart(void)
{
    dcp_comm *comm = NULL;
    dcp_ctx *ctx = NULL;
    dcp_manager *m = NULL;
    CHECK_OK(ctx, dcp_comm_mpi(&comm, MPI_COMM_WORLD));
    CHECK_OK(ctx, dcp_ctx_create(&ctx, comm, NULL));
    dcp_manager_options o = mopts();
    CHECK_OK(ctx, dcp_manager_create(&m, ctx, root, &o));
    dcp_state *st = make_state(0, 0);
    int64_t step = -1;
    CHECK_OK(ctx, dcp_manager_load_latest(m, st, &step, NULL));
    CHECK(step == 10);
    CHECK(rows_hold(10));
    const dcp_value *v = dcp_state_value(st, "step");
    CHECK(v && dcp_value_as_int(v) == 10);
    dcp_state_free(st);
    for (int64_t s = step + 1; s <= 12; s++) {
        int did = -1;
        st = make_state(s, 1);
        CHECK_OK(ctx, dcp_manager_step(m, st, s, &did));
        CHECK(did == (s == 12));
        dcp_state_free(st);
    }
    CHECK_OK(ctx, dcp_manager_wait(m));
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(complete_mask(ctx) == (BIT(4) | BIT(8) | BIT(10) | BIT(12)));
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_manager_load_latest(m, st, &step, NULL));
    CHECK(step == 12);
    CHECK(rows_hold(12));
    dcp_state_free(st);
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
}

int main(int argc, char **argv)
{
    mt_init(&argc, &argv);
    if (argc != 3 || (strcmp(argv[1], "save") && strcmp(argv[1], "restart"))) {
        if (mt_rank == 0)
            fprintf(stderr, "usage: mpi_manager save|restart DIR\n");
        MPI_Finalize();
        return 2;
    }
    root = argv[2];
    if (!strcmp(argv[1], "save")) {
        if (mt_rank == 0) {
            char cmd[1024];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
            if (system(cmd) != 0)
                MPI_Abort(MPI_COMM_WORLD, 2);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        RUN(save);
    } else {
        RUN(restart);
    }
    return mt_finish();
}
