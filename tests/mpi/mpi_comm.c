/*
 * The communicator: every collective of the MPI implementation checked
 * byte for byte, once as configured and once with the per-call limits
 * lowered (dcp__comm_mpi_test_limits) so that the paths for lengths beyond
 * INT_MAX (pieces, point-to-point gatherv/scatterv) run on small data; a
 * save and load through those paths; dcp_comm_create's argument checks and
 * a user communicator of one rank; several agreements in one allreduce.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_comm.h>
#include <dcp/dcp_mpi.h>

#include "comm.h" /* internal: the collectives and the test hook */
#include "mpitest.h"

static char root[256];

static void collectives(dcp_comm *c)
{
    struct dcp_err err;
    unsigned char b[1000], g[100], *all = NULL, *v = NULL, sc[200];
    size_t *lens = NULL, *displs = NULL, total = 0, mylen, i;
    int64_t mins[100];
    int r;
    memset(&err, 0, sizeof(err));
    for (i = 0; i < sizeof(b); i++)
        b[i] = mt_rank == 1 % mt_size ? (unsigned char)(i * 7) : 0;
    CHECK(dcp__comm_bcast(c, b, sizeof(b), 1 % mt_size, &err) == 0);
    for (i = 0; i < sizeof(b); i++)
        CHECK(b[i] == (unsigned char)(i * 7));

    for (i = 0; i < sizeof(g); i++)
        g[i] = (unsigned char)(mt_rank * 31 + i);
    if (mt_rank == 0)
        all = malloc(sizeof(g) * (size_t)mt_size);
    CHECK(dcp__comm_gather(c, g, sizeof(g), all, 0, &err) == 0);
    for (r = 0; mt_rank == 0 && r < mt_size; r++)
        for (i = 0; i < sizeof(g); i++)
            CHECK(all[(size_t)r * sizeof(g) + i] ==
                  (unsigned char)(r * 31 + i));
    free(all);
    all = NULL;

    /* gatherv and scatterv: rank r's block is r * 37 + 5 bytes. */
    if (mt_rank == 0) {
        lens = malloc((size_t)mt_size * sizeof(*lens));
        displs = malloc((size_t)mt_size * sizeof(*displs));
        for (r = 0; r < mt_size; r++) {
            lens[r] = (size_t)r * 37 + 5;
            displs[r] = total;
            total += lens[r];
        }
        all = malloc(total);
        v = malloc(total);
        for (i = 0; i < total; i++)
            v[i] = (unsigned char)(i * 13 + 1);
    }
    mylen = (size_t)mt_rank * 37 + 5;
    for (i = 0; i < mylen; i++)
        sc[i] = (unsigned char)(mt_rank + i);
    CHECK(dcp__comm_gatherv(c, sc, mylen, all, lens, displs, 0, &err) == 0);
    for (r = 0; mt_rank == 0 && r < mt_size; r++)
        for (i = 0; i < lens[r]; i++)
            CHECK(all[displs[r] + i] == (unsigned char)(r + i));
    memset(sc, 0, sizeof(sc));
    CHECK(dcp__comm_scatterv(c, v, lens, displs, sc, mylen, 0, &err) == 0);
    {
        size_t base = 0;
        for (r = 0; r < mt_rank; r++)
            base += (size_t)r * 37 + 5;
        for (i = 0; i < mylen; i++)
            CHECK(sc[i] == (unsigned char)((base + i) * 13 + 1));
    }
    free(all);
    free(v);
    free(lens);
    free(displs);

    for (i = 0; i < 100; i++)
        mins[i] = (int64_t)((i + (size_t)mt_rank) % 7) - 3;
    CHECK(dcp__comm_allreduce_min(c, mins, 100, &err) == 0);
    for (i = 0; i < 100; i++) {
        int64_t want = INT64_MAX;
        for (r = 0; r < mt_size; r++)
            if ((int64_t)((i + (size_t)r) % 7) - 3 < want)
                want = (int64_t)((i + (size_t)r) % 7) - 3;
        CHECK(mins[i] == want);
    }
    CHECK(c->ops.barrier(c->impl) == 0);
}

/* A row-sharded and a replicated tensor, saved and loaded back, as rank r
 * of n. */
static void save_load(dcp_comm *c, const char *name, int r, int n)
{
    char dir[400];
    int64_t shape[2] = {37, 5}, off[2], size[2], rshape = 300;
    unsigned char *rows, *rep, *got, *want;
    dcp_ctx *ctx;
    dcp_state *st, *ld;
    size_t nb;
    snprintf(dir, sizeof(dir), "%s/%s", root, name);
    off[1] = 0;
    size[1] = 5;
    mt_split(37, n, r, &off[0], &size[0]);
    nb = (size_t)size[0] * 5 * 8;
    rows = malloc(nb + 1);
    got = malloc(37 * 5 * 8); /* the load's box may be larger */
    want = malloc(37 * 5 * 8);
    rep = malloc(300 * 2);
    mt_fill(rows, 2, shape, off, size, 8, 21);
    mt_fill(rep, 1, &rshape, (const int64_t[]){0}, &rshape, 2, 22);
    CHECK(dcp_ctx_create(&ctx, c, NULL) == 0);
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "rows", DCP_F64, 2, shape, off, size, rows,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_tensor(st, "rep", DCP_BF16, 1, &rshape, NULL, NULL, rep,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_value(st, "step", dcp_value_int(3)) == 0);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, NULL));
    /* Load rows back reversed across the ranks. */
    mt_split(37, n, n - 1 - r, &off[0], &size[0]);
    CHECK(dcp_state_create(&ld) == 0);
    CHECK(dcp_state_add_tensor(ld, "rows", DCP_F64, 2, shape, off, size, got,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_tensor(ld, "rep", DCP_BF16, 1, &rshape, NULL, NULL, rep,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_value(ld, "step", dcp_value_none()) == 0);
    memset(rep, 0, 600);
    CHECK_OK(ctx, dcp_load(ctx, ld, dir, NULL));
    mt_fill(want, 2, shape, off, size, 8, 21);
    CHECK(memcmp(got, want, (size_t)size[0] * 40) == 0);
    mt_fill(want, 1, &rshape, (const int64_t[]){0}, &rshape, 2, 22);
    CHECK(memcmp(rep, want, 600) == 0);
    CHECK(dcp_value_as_int(dcp_state_value(ld, "step")) == 3);
    dcp_state_free(st);
    dcp_state_free(ld);
    dcp_ctx_free(ctx);
    free(rows);
    free(rep);
    free(got);
    free(want);
}

static void test_mpi_collectives(void)
{
    dcp_comm *c = NULL;
    CHECK(dcp_comm_mpi(&c, MPI_COMM_WORLD) == 0);
    if (!c)
        return;
    /* MPI_Init (not MPI_THREAD_MULTIPLE): no threaded point-to-point. */
    CHECK(c->ops.flags == 0 && c->ops.isend);
    collectives(c);
    save_load(c, "default", mt_rank, mt_size);
    dcp_comm_free(c);
}

static void test_split_paths(void)
{
    dcp_comm *c = NULL;
    /* 7-byte MPI calls, at most 50 bytes or elements per call. */
    dcp__comm_mpi_test_limits(7, 50);
    CHECK(dcp_comm_mpi(&c, MPI_COMM_WORLD) == 0);
    if (c) {
        collectives(c);
        save_load(c, "split", mt_rank, mt_size);
        dcp_comm_free(c);
    }
    dcp__comm_mpi_test_limits(0, 0);
}

/* ------------------------------------------- a user comm of one rank */

static int s_bcast(void *impl, void *buf, size_t len, int root_)
{
    (void)impl;
    (void)buf;
    (void)len;
    return root_ == 0 ? DCP_OK : DCP_EINVAL;
}

static int s_gather(void *impl, const void *send, size_t len, void *recv,
                    int root_)
{
    (*(int *)impl)++;
    memmove(recv, send, len);
    return root_ == 0 ? DCP_OK : DCP_EINVAL;
}

static int s_gatherv(void *impl, const void *send, size_t len, void *recv,
                     const size_t *lens, const size_t *displs, int root_)
{
    (*(int *)impl)++;
    if (lens[0] != len)
        return DCP_EINVAL;
    memmove((char *)recv + displs[0], send, len);
    return root_ == 0 ? DCP_OK : DCP_EINVAL;
}

static int s_scatterv(void *impl, const void *send, const size_t *lens,
                      const size_t *displs, void *recv, size_t len, int root_)
{
    (*(int *)impl)++;
    if (lens[0] != len)
        return DCP_EINVAL;
    memmove(recv, (const char *)send + displs[0], len);
    return root_ == 0 ? DCP_OK : DCP_EINVAL;
}

static int s_allreduce_min(void *impl, int64_t *v, size_t n)
{
    (void)impl;
    (void)v;
    (void)n;
    return DCP_OK;
}

static int s_barrier(void *impl)
{
    (void)impl;
    return DCP_OK;
}

static int destroyed;

static void s_destroy(void *impl)
{
    (void)impl;
    destroyed++;
}

static void test_user_comm(void)
{
    struct dcp_comm_ops ops = {
        1,         s_bcast,   s_gather, s_gatherv, s_scatterv, s_allreduce_min,
        s_barrier, s_destroy, NULL,     NULL,      NULL,       NULL,
        0};
    struct dcp_comm_ops bad = ops;
    dcp_comm *c = (dcp_comm *)&ops;
    int calls = 0;
    char name[32];
    CHECK(dcp_comm_create(&ops, &calls, 0, 1, NULL) == DCP_EINVAL);
    CHECK(dcp_comm_create(NULL, &calls, 0, 1, &c) == DCP_EINVAL && !c);
    CHECK(dcp_comm_create(&ops, &calls, 1, 1, &c) == DCP_EINVAL);
    CHECK(dcp_comm_create(&ops, &calls, -1, 2, &c) == DCP_EINVAL);
    CHECK(dcp_comm_create(&ops, &calls, 0, 0, &c) == DCP_EINVAL);
    bad.version = 0;
    CHECK(dcp_comm_create(&bad, &calls, 0, 1, &c) == DCP_EINVAL);
    bad = ops;
    bad.scatterv = NULL;
    CHECK(dcp_comm_create(&bad, &calls, 0, 1, &c) == DCP_EINVAL);
    /* A version-1 struct ends at destroy: what follows is never read. */
    bad = ops;
    bad.isend =
        (int (*)(void *, const void *, size_t, int, int, void **))(uintptr_t)1;
    CHECK(dcp_comm_create(&bad, &calls, 0, 1, &c) == DCP_OK);
    CHECK(c->ops.isend == NULL && c->ops.version == DCP_COMM_OPS_VERSION);
    dcp_comm_free(c);
    /* A version-2 struct ends at cancel: flags is never read; version 3
     * refuses an unknown flag and keeps DCP_COMM_P2P_THREAD. */
    bad = ops;
    bad.version = 2;
    bad.flags = 0xdead;
    CHECK(dcp_comm_create(&bad, &calls, 0, 1, &c) == DCP_OK);
    CHECK(c->ops.flags == 0);
    dcp_comm_free(c);
    bad.version = 3;
    CHECK(dcp_comm_create(&bad, &calls, 0, 1, &c) == DCP_EINVAL && !c);
    bad.flags = DCP_COMM_P2P_THREAD;
    CHECK(dcp_comm_create(&bad, &calls, 0, 1, &c) == DCP_OK);
    CHECK(c->ops.flags == DCP_COMM_P2P_THREAD);
    dcp_comm_free(c);
    bad = ops;
    bad.destroy = NULL; /* optional */
    CHECK(dcp_comm_create(&bad, &calls, 0, 1, &c) == DCP_OK);
    dcp_comm_free(c);
    CHECK(dcp_comm_mpi(NULL, MPI_COMM_WORLD) == DCP_EINVAL);
    CHECK(dcp_comm_mpi(&c, MPI_COMM_NULL) == DCP_EINVAL && !c);
    dcp_comm_free(NULL);

    /* Each MPI rank alone, through the user comm, into its own dir. */
    CHECK(dcp_comm_create(&ops, &calls, 0, 1, &c) == DCP_OK);
    snprintf(name, sizeof(name), "user-%d", mt_rank);
    save_load(c, name, 0, 1);
    CHECK(calls > 0); /* the gathers and scatters went through ops */
    destroyed = 0;
    dcp_comm_free(c);
    CHECK(destroyed == 1);
}

/* Several agreements in one allreduce (dcp__comm_agree_stage, _buf): the
 * earliest failing stage's verdict, as if each stage had been agreed in
 * turn; the values' minima either way. */
static void test_agree_stage(void)
{
    dcp_comm *c = NULL;
    struct dcp_err err;
    int64_t v[2], big[2 + 300];
    int last = mt_size - 1, fs = 7, rc, i;
    char want[DCP_ERRMSG_MAX];
    CHECK(dcp_comm_mpi(&c, MPI_COMM_WORLD) == 0);
    if (!c)
        return;
    /* Every rank succeeds: the minima, no stage. */
    memset(&err, 0, sizeof(err));
    v[0] = 100 + mt_rank;
    v[1] = -(100 + mt_rank);
    CHECK(dcp__comm_agree_stage(c, DCP_OK, 3, &err, v, 2, &fs) == DCP_OK);
    CHECK(v[0] == 100 && v[1] == -(100 + last) && fs == -1);
    /* The last rank fails at stage 0, the others at stage 1: the last
     * rank's verdict everywhere, as when stage 0 was agreed first. */
    memset(&err, 0, sizeof(err));
    if (mt_rank == last)
        rc = dcp__err(&err, DCP_EKEY, "early %d", mt_rank);
    else
        rc = dcp__err(&err, DCP_EIO, "late %d", mt_rank);
    rc = dcp__comm_agree_stage(c, rc, mt_rank == last ? 0 : 1, &err, v, 2,
                               &fs);
    CHECK(rc == DCP_EKEY && fs == 0);
    if (mt_size > 1) {
        snprintf(want, sizeof(want), "rank %d failed: early %d", last, last);
        CHECK(!strcmp(err.msg, want));
    }
    /* Ranks 0 and the last fail at stage 1, the others at stage 2: the
     * span names stage 1's ranks only. */
    memset(&err, 0, sizeof(err));
    i = mt_rank == 0 || mt_rank == last;
    rc = dcp__err(&err, i ? DCP_ENOMEM : DCP_EIO, "r%d", mt_rank);
    rc = dcp__comm_agree_stage(c, rc, i ? 1 : 2, &err, NULL, 0, &fs);
    CHECK(rc == DCP_ENOMEM && fs == 1);
    if (mt_size > 1)
        snprintf(want, sizeof(want), "ranks 0 to %d failed; rank 0: r0",
                 last);
    else
        snprintf(want, sizeof(want), "r0");
    CHECK(!strcmp(err.msg, want));
    /* Any number of values in the caller's buffer; rank 0 fails alone. */
    memset(&err, 0, sizeof(err));
    for (i = 0; i < 300; i++)
        big[2 + i] = (int64_t)i * 10 + (mt_rank + i) % mt_size;
    rc = mt_rank == 0 ? dcp__err(&err, DCP_EFORMAT, "bad") : DCP_OK;
    rc = dcp__comm_agree_buf(c, rc, 0, &err, big, 300, &fs);
    CHECK(rc == DCP_EFORMAT && fs == 0);
    for (i = 0; i < 300; i++)
        CHECK(big[2 + i] == (int64_t)i * 10);
    dcp_comm_free(c);
}

int main(int argc, char **argv)
{
    mt_init(&argc, &argv);
    mt_tmpdir(root, sizeof(root), "comm");
    RUN(mpi_collectives);
    RUN(split_paths);
    RUN(user_comm);
    RUN(agree_stage);
    return mt_finish();
}
