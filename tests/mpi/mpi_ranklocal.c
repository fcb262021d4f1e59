/*
 * Rank-local saves (DCP_SAVE_RANK_LOCAL, docs/FORMAT.md §9.2): every rank
 * writes __<r>_0.distcp and its own __<r>.metadata, no .metadata; dcp
 * reads them back bit-exact on the same ranks (sync and async saves) and
 * resharded on a smaller communicator (3 -> 2 on 3 ranks, 1 -> 1 on one);
 * an interrupted save's __<r>.metadata temporary removed as a leftover;
 * a rank holding nothing (its metadata empty, no data file);
 * refusals agreed on every rank: a path holding a checkpoint
 * (DCP_EEXIST), the flag on some ranks only, a planner's global hook,
 * the flag in a manager's or a tier stack's save options (DCP_EINVAL).
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>
#include <dcp/dcp_manager.h>
#include <dcp/dcp_planner.h>
#include <dcp/dcp_tier.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitest.h"

static dcp_comm *comm;
static dcp_ctx *ctx;
static char root[256];

#define W_ROWS 7
#define W_COLS 5
#define B_LEN 6

/* The saved state of rank r of n: "model.w" [7, 5] f32 in row shards,
 * "model.b" [6] f64 replicated (whole on every rank), "rank<r>.x" [2] i64
 * (this rank's own key), value "step" 11 on every rank. */
struct sv {
    float w[W_ROWS * W_COLS];
    double b[B_LEN];
    int64_t x[2];
};

static const int64_t w_shape[2] = {W_ROWS, W_COLS};
static const int64_t b_shape[1] = {B_LEN};
static const int64_t x_shape[1] = {2};

static void rows_of(int r, int n, int64_t *off, int64_t *size)
{
    mt_split(W_ROWS, n, r, &off[0], &size[0]);
    off[1] = 0;
    size[1] = W_COLS;
}

static dcp_state *saved_state(struct sv *s, int r, int n)
{
    dcp_state *st;
    int64_t off[2], size[2], zero = 0;
    char key[32];
    rows_of(r, n, off, size);
    mt_fill((unsigned char *)s->w, 2, w_shape, off, size, 4, 11);
    mt_fill((unsigned char *)s->b, 1, b_shape, &zero, b_shape, 8, 12);
    mt_fill((unsigned char *)s->x, 1, x_shape, &zero, x_shape, 8,
            100u + (unsigned)r);
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "model.w", DCP_F32, 2, w_shape, off, size,
                               s->w, DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_tensor(st, "model.b", DCP_F64, 1, b_shape, NULL, NULL,
                               s->b, DCP_MEM_HOST) == 0);
    snprintf(key, sizeof(key), "rank%d.x", r);
    CHECK(dcp_state_add_tensor(st, key, DCP_I64, 1, x_shape, NULL, NULL, s->x,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_value(st, "step", dcp_value_int(11)) == 0);
    return st;
}

static int exists(const char *dir, const char *name)
{
    char p[512];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* The files of a rank-local checkpoint of n ranks. */
static void check_files(const char *dir, int n)
{
    char name[64];
    int r;
    CHECK(!exists(dir, ".metadata"));
    for (r = 0; r < n; r++) {
        snprintf(name, sizeof(name), "__%d.metadata", r);
        CHECK(exists(dir, name));
        snprintf(name, sizeof(name), "__%d_0.distcp", r);
        CHECK(exists(dir, name));
    }
    snprintf(name, sizeof(name), "__%d.metadata", n);
    CHECK(!exists(dir, name));
}

/*
 * Loads every key of a checkpoint saved on nsaved ranks through c (this
 * rank is rank r of n there): model.w in n row shards, the rest whole on
 * every rank; checks every byte.
 */
static void load_check(dcp_ctx *lc, const char *dir, int r, int n, int nsaved)
{
    float w[W_ROWS * W_COLS], wwant[W_ROWS * W_COLS];
    double b[B_LEN], bwant[B_LEN];
    int64_t x[8][2], xwant[2], off[2], size[2], zero = 0;
    dcp_state *st;
    const dcp_value *v;
    char key[32];
    int q;
    rows_of(r, n, off, size);
    memset(w, 0, sizeof(w));
    memset(b, 0, sizeof(b));
    memset(x, 0, sizeof(x));
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "model.w", DCP_F32, 2, w_shape, off, size,
                               w, DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_tensor(st, "model.b", DCP_F64, 1, b_shape, NULL, NULL,
                               b, DCP_MEM_HOST) == 0);
    for (q = 0; q < nsaved && q < 8; q++) {
        snprintf(key, sizeof(key), "rank%d.x", q);
        CHECK(dcp_state_add_tensor(st, key, DCP_I64, 1, x_shape, NULL, NULL,
                                   x[q], DCP_MEM_HOST) == 0);
    }
    CHECK(dcp_state_add_value(st, "step", dcp_value_none()) == 0);
    CHECK_OK(lc, dcp_load(lc, st, dir, NULL));
    mt_fill((unsigned char *)wwant, 2, w_shape, off, size, 4, 11);
    CHECK(memcmp(w, wwant, (size_t)(size[0] * size[1]) * sizeof(float)) == 0);
    mt_fill((unsigned char *)bwant, 1, b_shape, &zero, b_shape, 8, 12);
    CHECK(memcmp(b, bwant, sizeof(b)) == 0);
    for (q = 0; q < nsaved && q < 8; q++) {
        mt_fill((unsigned char *)xwant, 1, x_shape, &zero, x_shape, 8,
                100u + (unsigned)q);
        CHECK(memcmp(x[q], xwant, sizeof(xwant)) == 0);
    }
    v = dcp_state_value(st, "step");
    CHECK(v && dcp_value_as_int(v) == 11);
    dcp_state_free(st);
}

static dcp_save_options rl_opts(unsigned flags)
{
    dcp_save_options so;
    memset(&so, 0, sizeof(so));
    so.struct_size = sizeof(so);
    so.flags = flags;
    return so;
}

static void test_save_load(void)
{
    char dir[300];
    struct sv s;
    dcp_save_options so = rl_opts(DCP_SAVE_RANK_LOCAL);
    dcp_state *st;
    snprintf(dir, sizeof(dir), "%s/sync", root);
    st = saved_state(&s, mt_rank, mt_size);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, &so));
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    check_files(dir, mt_size);
    load_check(ctx, dir, mt_rank, mt_size, mt_size);
    /* Another world size: every rank loads everything. */
    load_check(ctx, dir, 0, 1, mt_size);
}

static void test_async(void)
{
    char dir[300];
    struct sv s;
    dcp_save_options so = rl_opts(DCP_SAVE_RANK_LOCAL);
    dcp_state *st;
    dcp_request *req = NULL;
    snprintf(dir, sizeof(dir), "%s/async", root);
    st = saved_state(&s, mt_rank, mt_size);
    CHECK_OK(ctx, dcp_save_async(ctx, st, dir, &so, &req));
    dcp_state_free(st);
    memset(&s, 0, sizeof(s)); /* staged: the checkpoint holds the old bytes */
    CHECK(!exists(dir, "__0.metadata") || mt_size == 0);
    CHECK(req && dcp_request_wait(req) == DCP_OK);
    dcp_request_free(req);
    MPI_Barrier(MPI_COMM_WORLD);
    check_files(dir, mt_size);
    load_check(ctx, dir, mt_rank, mt_size, mt_size);
}

/* Saved on every rank, loaded on a communicator of the first mt_size - 1
 * ranks (3 -> 2; on one rank, 1 -> 1). */
static void test_resharded(void)
{
    char dir[300];
    struct sv s;
    dcp_save_options so = rl_opts(DCP_SAVE_RANK_LOCAL);
    dcp_state *st;
    MPI_Comm sub;
    int m = mt_size > 1 ? mt_size - 1 : 1, in = mt_rank < m;
    snprintf(dir, sizeof(dir), "%s/reshard", root);
    st = saved_state(&s, mt_rank, mt_size);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, &so));
    dcp_state_free(st);
    MPI_Comm_split(MPI_COMM_WORLD, in ? 0 : MPI_UNDEFINED, mt_rank, &sub);
    if (in) {
        dcp_comm *c2 = NULL;
        dcp_ctx *x2 = NULL;
        CHECK(dcp_comm_mpi(&c2, sub) == DCP_OK);
        CHECK(c2 && dcp_ctx_create(&x2, c2, NULL) == DCP_OK);
        if (x2)
            load_check(x2, dir, mt_rank, m, mt_size);
        dcp_ctx_free(x2);
        dcp_comm_free(c2);
        MPI_Comm_free(&sub);
    }
}

/* The last rank holds nothing: it writes no data file, and a
 * __<r>.metadata without entries, which the merge reads as nothing. */
static void test_empty_rank(void)
{
    char dir[300], name[64];
    struct sv s;
    dcp_save_options so = rl_opts(DCP_SAVE_RANK_LOCAL);
    dcp_state *st;
    int n = mt_size - 1;
    if (mt_size < 2)
        return;
    snprintf(dir, sizeof(dir), "%s/empty", root);
    if (mt_rank < n)
        st = saved_state(&s, mt_rank, n);
    else
        CHECK(dcp_state_create(&st) == 0);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, &so));
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(name, sizeof(name), "__%d.metadata", n);
    CHECK(exists(dir, name));
    snprintf(name, sizeof(name), "__%d_0.distcp", n);
    CHECK(!exists(dir, name));
    load_check(ctx, dir, mt_rank, mt_size, n);
}

/* An interrupted rank-local save's temporary is a leftover the next save
 * removes (rank 0, holding the lock). */
static void test_leftovers(void)
{
    char dir[300], p[400];
    struct sv s;
    dcp_save_options so = rl_opts(DCP_SAVE_RANK_LOCAL);
    dcp_state *st;
    snprintf(dir, sizeof(dir), "%s/left", root);
    if (mt_rank == 0) {
        FILE *f;
        CHECK(mkdir(dir, 0755) == 0);
        snprintf(p, sizeof(p), "%s/__0.metadata.1-0-deadbeef.tmp", dir);
        f = fopen(p, "w");
        CHECK(f != NULL);
        if (f)
            fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    st = saved_state(&s, mt_rank, mt_size);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, &so));
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(!exists(dir, "__0.metadata.1-0-deadbeef.tmp"));
    check_files(dir, mt_size);
    load_check(ctx, dir, mt_rank, mt_size, mt_size);
}

/* A rank file of another save: a __<k>.metadata beyond this world size
 * (left by a larger save) refuses the save, nothing written. */
static void test_other_saves(void)
{
    char dir[300], p[400];
    struct sv s;
    dcp_save_options so = rl_opts(DCP_SAVE_RANK_LOCAL);
    dcp_state *st = saved_state(&s, mt_rank, mt_size);
    int rc;
    snprintf(dir, sizeof(dir), "%s/stale", root);
    if (mt_rank == 0) {
        FILE *f;
        CHECK(mkdir(dir, 0755) == 0);
        snprintf(p, sizeof(p), "%s/__%d.metadata", dir, mt_size + 3);
        f = fopen(p, "w");
        CHECK(f != NULL);
        if (f)
            fclose(f);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    rc = dcp_save(ctx, st, dir, &so);
    CHECK_RC(ctx, rc, DCP_EEXIST);
    CHECK(mt_same(rc));
    snprintf(p, sizeof(p), "__%d.metadata", mt_size + 3);
    CHECK_MSG(ctx, p);
    CHECK(!exists(dir, "__0.metadata"));
    /* A plain save over a rank-local checkpoint: its data files under
     * fresh names (the old checkpoint's files are not overwritten before
     * the commit), then the old one removed whole. */
    snprintf(dir, sizeof(dir), "%s/rl_then_plain", root);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, &so));
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, NULL));
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(exists(dir, ".metadata"));
    for (int k = 0; k < mt_size; k++) {
        char nm[48];
        snprintf(nm, sizeof(nm), "__%d.metadata", k);
        CHECK(!exists(dir, nm));
        snprintf(nm, sizeof(nm), "__%d_0.distcp", k);
        CHECK(!exists(dir, nm));
    }
    load_check(ctx, dir, mt_rank, mt_size, mt_size);
    dcp_state_free(st);
}

static int veto(void *ud, dcp_global_plan *gp)
{
    (void)ud;
    (void)gp;
    return 0;
}

static void test_refusals(void)
{
    char dir[300], plain[300];
    struct sv s;
    dcp_save_options so = rl_opts(DCP_SAVE_RANK_LOCAL);
    dcp_save_planner pl;
    dcp_state *st = saved_state(&s, mt_rank, mt_size);
    int rc;
    /* An existing rank-local checkpoint, and a plain one. */
    snprintf(dir, sizeof(dir), "%s/sync", root);
    rc = dcp_save(ctx, st, dir, &so);
    CHECK_RC(ctx, rc, DCP_EEXIST);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "__0.metadata");
    snprintf(plain, sizeof(plain), "%s/plain", root);
    CHECK_OK(ctx, dcp_save(ctx, st, plain, NULL));
    rc = dcp_save(ctx, st, plain, &so);
    CHECK_RC(ctx, rc, DCP_EEXIST);
    CHECK_MSG(ctx, ".metadata");
    /* The old checkpoints are untouched. */
    load_check(ctx, dir, mt_rank, mt_size, mt_size);
    load_check(ctx, plain, mt_rank, mt_size, mt_size);
    /* The flag on rank 0 only. */
    if (mt_size > 1) {
        dcp_save_options mixed = rl_opts(mt_rank == 0 ? DCP_SAVE_RANK_LOCAL
                                                      : 0);
        snprintf(dir, sizeof(dir), "%s/mixed", root);
        rc = dcp_save(ctx, st, dir, &mixed);
        CHECK_RC(ctx, rc, DCP_EINVAL);
        CHECK(mt_same(rc));
        CHECK_MSG(ctx, "DCP_SAVE_RANK_LOCAL");
        CHECK(!exists(dir, ".metadata") && !exists(dir, "__0.metadata"));
    }
    /* A planner with a global hook. */
    memset(&pl, 0, sizeof(pl));
    pl.version = DCP_PLANNER_VERSION;
    pl.global = veto;
    so.planner = &pl;
    snprintf(dir, sizeof(dir), "%s/hook", root);
    rc = dcp_save(ctx, st, dir, &so);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "global hook");
    dcp_state_free(st);
    so.planner = NULL;
    /* The manager and the tiers go by .metadata: refused. */
    {
        dcp_manager_options mo;
        dcp_manager *m = NULL;
        memset(&mo, 0, sizeof(mo));
        mo.struct_size = sizeof(mo);
        mo.save_opts = &so;
        snprintf(dir, sizeof(dir), "%s/mgr", root);
        rc = dcp_manager_create(&m, ctx, dir, &mo);
        CHECK_RC(ctx, rc, DCP_EINVAL);
        CHECK(mt_same(rc) && m == NULL);
        CHECK_MSG(ctx, "DCP_SAVE_RANK_LOCAL");
        dcp_manager_free(m);
    }
    {
        dcp_tier_options to;
        dcp_tier *t = NULL;
        char t0[300], t1[300];
        memset(&to, 0, sizeof(to));
        to.struct_size = sizeof(to);
        snprintf(t0, sizeof(t0), "%s/t0", root);
        snprintf(t1, sizeof(t1), "%s/t1", root);
        to.tier0_dir = t0;
        to.tier1_root = t1;
        to.save_opts = &so;
        rc = dcp_tier_create(&t, ctx, &to);
        CHECK_RC(ctx, rc, DCP_EINVAL);
        CHECK(mt_same(rc) && t == NULL);
        CHECK_MSG(ctx, "DCP_SAVE_RANK_LOCAL");
        dcp_tier_free(t);
    }
}

/* Removes dir and everything under it (rank 0, at the end). */
static void rmtree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[1024];
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(p, sizeof(p), "%.700s/%.255s", dir, de->d_name);
        if (unlink(p) != 0)
            rmtree(p);
    }
    if (d)
        closedir(d);
    (void)rmdir(dir);
}

int main(int argc, char **argv)
{
    int rc;
    mt_init(&argc, &argv);
    mt_tmpdir(root, sizeof(root), "ranklocal");
    rc = dcp_comm_mpi(&comm, MPI_COMM_WORLD);
    if (rc == DCP_OK)
        rc = dcp_ctx_create(&ctx, comm, NULL);
    if (rc != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    RUN(save_load);
    RUN(async);
    RUN(resharded);
    RUN(leftovers);
    RUN(empty_rank);
    RUN(refusals);
    RUN(other_saves);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0)
        rmtree(root);
    return mt_finish();
}
