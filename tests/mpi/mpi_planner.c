/*
 * Planners over MPI (dcp_planner.h): the dedup policy (replicated tensors
 * spread over their holders by default, all written by rank 0 with
 * DCP_PLAN_DEDUP_LOWEST_RANK, as the global hook sees and the data files
 * show), torch's load-balanced DDP recipe (each rank saves its chunk of the
 * replicated keys; with --save, the checkpoints
 * tests/interop/test_planner_mpi.py compares with torch's own planners), a hook
 * failing on one rank failing the save or load on every rank with that rank's
 * message, and a renaming load resharded.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>
#include <dcp/dcp_planner.h>

#include <unistd.h>

#include "mpitest.h"

#define NREP 6
#define NEL  64

static dcp_comm *comm;
static char root[256];
static float rep[NREP][NEL];

static const char *dir(const char *name)
{
    static char b[512];
    snprintf(b, sizeof b, "%s/%s", root, name);
    return b;
}

static int has(const char *d, const char *f)
{
    char p[700];
    snprintf(p, sizeof p, "%s/%s", d, f);
    return access(p, F_OK) == 0;
}

/* NREP replicated tensors "rep<i>" (the same on every rank) and a value. */
static dcp_state *make_rep(void)
{
    dcp_state *st = NULL;
    int64_t shape[1] = {NEL};
    int i, j;
    char k[16];
    if (dcp_state_create(&st))
        return NULL;
    for (i = 0; i < NREP; i++) {
        for (j = 0; j < NEL; j++)
            rep[i][j] = (float)(i * 1000 + j);
        snprintf(k, sizeof k, "rep%d", i);
        if (dcp_state_add_tensor(st, k, DCP_F32, 1, shape, NULL, NULL, rep[i],
                                 DCP_MEM_HOST))
            return NULL;
    }
    if (dcp_state_add_value(st, "epoch", dcp_value_int(3)))
        return NULL;
    return st;
}

static int check_rep(dcp_ctx *ctx, const char *path)
{
    dcp_state *st = make_rep();
    int i, j, bad = !st;
    for (i = 0; !bad && i < NREP; i++)
        memset(rep[i], 0, sizeof rep[i]);
    if (!bad && dcp_load(ctx, st, path, NULL) != DCP_OK)
        bad = 1;
    for (i = 0; !bad && i < NREP; i++)
        for (j = 0; j < NEL; j++)
            bad |= rep[i][j] != (float)(i * 1000 + j);
    dcp_state_free(st);
    return !bad;
}

/* What the global hook saw: the writer of each entry's chunk 0. */
static int writers[NREP + 1];

static int see_writers(void *ud, dcp_global_plan *gp)
{
    const dcp_metadata *md = dcp_global_plan_metadata(gp);
    size_t i;
    (void)ud;
    for (i = 0; i < dcp_metadata_count(md) && i <= NREP; i++)
        writers[i] = dcp_global_plan_writer(gp, i, 0);
    return 0;
}

static void test_dedup_policy(void)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make_rep();
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, NULL, NULL, see_writers};
    dcp_save_options so = {sizeof(so), 1, 0, &p};
    int i, distinct = 0, seen[64] = {0};
    CHECK(st != NULL);
    CHECK_OK(ctx, dcp_ctx_create(&ctx, comm, NULL));
    /* Default: spread over the holders. */
    CHECK_OK(ctx, dcp_save(ctx, st, dir("spread"), &so));
    if (mt_rank == 0) {
        for (i = 0; i <= NREP; i++)
            if (writers[i] >= 0 && writers[i] < 64 && !seen[writers[i]]++)
                distinct++;
        CHECK(distinct == (mt_size < NREP ? mt_size : NREP));
    }
    CHECK(check_rep(ctx, dir("spread")));
    /* Lowest rank: rank 0 writes everything. */
    p.flags = DCP_PLAN_DEDUP_LOWEST_RANK;
    CHECK_OK(ctx, dcp_save(ctx, st, dir("lowest"), &so));
    if (mt_rank == 0) {
        for (i = 0; i <= NREP; i++)
            CHECK(writers[i] == 0);
        CHECK(has(dir("lowest"), "__0_0.distcp"));
        for (i = 1; i < mt_size; i++) {
            char f[32];
            snprintf(f, sizeof f, "__%d_0.distcp", i);
            CHECK(!has(dir("lowest"), f));
        }
    }
    CHECK(check_rep(ctx, dir("lowest")));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* A global hook that moves every chunk to its highest holder, and checks
 * that a non-holder is refused. */
static int bad_moves;

static int to_highest(void *ud, dcp_global_plan *gp)
{
    const dcp_metadata *md = dcp_global_plan_metadata(gp);
    size_t i;
    (void)ud;
    for (i = 0; i < dcp_metadata_count(md); i++) {
        int ranks[64];
        size_t n = dcp_global_plan_holders(gp, i, 0, ranks, 64), h;
        int best = -1;
        for (h = 0; h < n && h < 64; h++)
            if (ranks[h] > best)
                best = ranks[h];
        if (n != (size_t)mt_size ||
            dcp_global_plan_set_writer(gp, i, 0, best) != DCP_OK ||
            dcp_global_plan_writer(gp, i, 0) != best ||
            dcp_global_plan_set_writer(gp, i, 0, mt_size) != DCP_EINVAL ||
            dcp_global_plan_set_writer(gp, i, 9, best) != DCP_EINVAL)
            bad_moves++;
    }
    return 0;
}

static void test_move_writers(void)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make_rep();
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, NULL, NULL, to_highest};
    dcp_save_options so = {sizeof(so), 1, 0, &p};
    int r;
    bad_moves = 0;
    CHECK_OK(ctx, dcp_ctx_create(&ctx, comm, NULL));
    CHECK_OK(ctx, dcp_save(ctx, st, dir("moved"), &so));
    if (mt_rank == 0) {
        CHECK(bad_moves == 0);
        for (r = 0; r < mt_size; r++) {
            char f[32];
            snprintf(f, sizeof f, "__%d_0.distcp", r);
            CHECK(has(dir("moved"), f) == (r == mt_size - 1));
        }
    }
    CHECK(check_rep(ctx, dir("moved")));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* torch's DDPLoadBalancingPlanner recipe (SavePlanner docs): every rank
 * holds every key; the state's items, in order, are cut into world chunks
 * of ceil(n / world) and rank r saves chunk r only. The hook is called once
 * per entry in state order: the userdata counts the calls. */
struct ddp {
    size_t n; /* entries in the state */
    size_t i; /* entries seen */
};

static int ddp_chunk(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    struct ddp *c = ud;
    size_t per = (c->n + (size_t)it->world - 1) / (size_t)it->world;
    size_t i = c->i++;
    return i / per == (size_t)it->rank ? 0 : dcp_plan_skip(d);
}

static void test_ddp_load_balanced(void)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make_rep();
    struct ddp c = {NREP + 1, 0};
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, &c, ddp_chunk, see_writers};
    dcp_save_options so = {sizeof(so), 1, 0, &p};
    size_t per = (NREP + 1 + (size_t)mt_size - 1) / (size_t)mt_size;
    int i;
    CHECK_OK(ctx, dcp_ctx_create(&ctx, comm, NULL));
    CHECK_OK(ctx, dcp_save(ctx, st, dir("ddp"), &so));
    if (mt_rank == 0) { /* sorted: epoch, rep0, ...; state: rep0, ..., epoch */
        CHECK(writers[0] == (int)(NREP / per));
        for (i = 0; i < NREP; i++)
            CHECK(writers[i + 1] == (int)((size_t)i / per));
    }
    CHECK(check_rep(ctx, dir("ddp")));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* mpi_planner --save lowest|ddp DIR: one save of the replicated state
 * with that planner, for tests/interop/test_planner_mpi.py. */
static int save_for_torch(const char *mode, const char *path)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make_rep();
    struct ddp c = {NREP + 1, 0};
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, &c, NULL, NULL};
    dcp_save_options so = {sizeof(so), 0, 0, &p};
    int rc;
    if (!strcmp(mode, "lowest"))
        p.flags = DCP_PLAN_DEDUP_LOWEST_RANK;
    else if (!strcmp(mode, "ddp"))
        p.item = ddp_chunk;
    else
        return 2;
    rc = st ? dcp_ctx_create(&ctx, comm, NULL) : DCP_ENOMEM;
    if (rc == DCP_OK)
        rc = dcp_save(ctx, st, path, &so);
    if (rc != DCP_OK)
        fprintf(stderr, "[rank %d] save: %s\n", mt_rank,
                ctx ? dcp_errmsg(ctx) : dcp_strerror(rc));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    return rc == DCP_OK ? 0 : 1;
}

static int fail_last(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    if (it->rank != it->world - 1 || strcmp(it->key, "rep1"))
        return 0;
    dcp_plan_error(d, "refused on the last rank");
    return DCP_EKEY;
}

static int post_fail_1(void *ud, const dcp_plan_item *it, size_t box,
                       const int64_t *off, const int64_t *sz,
                       const int64_t *strides, void *buf)
{
    (void)strides;
    (void)ud;
    (void)box;
    (void)off;
    (void)sz;
    (void)buf;
    return it->rank == (it->world > 1 ? 1 : 0) && !strcmp(it->key, "rep2")
               ? DCP_ECORRUPT
               : 0;
}

static void test_hook_failure_agreed(void)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = make_rep();
    dcp_save_planner p = {DCP_PLANNER_VERSION, 0, NULL, fail_last, NULL};
    dcp_save_options so = {sizeof(so), 1, 0, &p};
    dcp_load_planner lp = {DCP_PLANNER_VERSION, 0, NULL, NULL, post_fail_1};
    dcp_load_options lo = {sizeof(lo), 0, &lp};
    int rc;
    char want[64];
    CHECK_OK(ctx, dcp_ctx_create(&ctx, comm, NULL));
    rc = dcp_save(ctx, st, dir("fail"), &so);
    CHECK_RC(ctx, rc, DCP_EKEY);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "refused on the last rank");
    if (mt_size > 1) {
        snprintf(want, sizeof want, "rank %d failed", mt_size - 1);
        CHECK_MSG(ctx, want);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(!has(dir("fail"), ".metadata"));
    rc = dcp_load(ctx, st, dir("spread"), &lo);
    CHECK_RC(ctx, rc, DCP_ECORRUPT);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "post_load on key 'rep2'");
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* Saved as "model.w" [12 x 5] in rows by rank; loaded as "net.w" in
 * columns, resharded. */
static int to_model(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    return strcmp(it->key, "net.w") ? 0 : dcp_plan_rename(d, "model.w");
}

static void test_rename_resharded(void)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    int64_t shape[2] = {12, 5}, off[2], sz[2];
    float mine[12 * 5], got[12 * 5];
    dcp_load_planner lp = {DCP_PLANNER_VERSION, 0, NULL, to_model, NULL};
    dcp_load_options lo = {sizeof(lo), 0, &lp};
    int64_t i, j;
    int bad = 0;
    CHECK_OK(ctx, dcp_ctx_create(&ctx, comm, NULL));
    mt_split(12, mt_size, mt_rank, &off[0], &sz[0]);
    off[1] = 0;
    sz[1] = 5;
    for (i = 0; i < sz[0] * 5; i++)
        mine[i] = (float)(off[0] * 5 + i);
    CHECK(dcp_state_create(&st) == DCP_OK);
    CHECK(dcp_state_add_tensor(st, "model.w", DCP_F32, 2, shape, off, sz, mine,
                               DCP_MEM_HOST) == DCP_OK);
    CHECK_OK(ctx, dcp_save(ctx, st, dir("rows"), NULL));
    dcp_state_free(st);
    mt_split(5, mt_size, mt_rank, &off[1], &sz[1]);
    off[0] = 0;
    sz[0] = 12;
    CHECK(dcp_state_create(&st) == DCP_OK);
    CHECK(dcp_state_add_tensor(st, "net.w", DCP_F32, 2, shape, off, sz, got,
                               DCP_MEM_HOST) == DCP_OK);
    CHECK_OK(ctx, dcp_load(ctx, st, dir("rows"), &lo));
    for (i = 0; i < 12; i++)
        for (j = 0; j < sz[1]; j++)
            bad |= got[i * sz[1] + j] != (float)(i * 5 + off[1] + j);
    CHECK(!bad);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    mt_init(&argc, &argv);
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    if (argc == 4 && !strcmp(argv[1], "--save")) {
        int rc = save_for_torch(argv[2], argv[3]);
        dcp_comm_free(comm);
        MPI_Finalize();
        return rc;
    }
    mt_tmpdir(root, sizeof(root), "planner");
    RUN(dedup_policy);
    RUN(ddp_load_balanced);
    RUN(move_writers);
    RUN(hook_failure_agreed);
    RUN(rename_resharded);
    dcp_comm_free(comm);
    return mt_finish();
}
