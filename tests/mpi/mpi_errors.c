/*
 * Failures in collective save and load: whatever fails, on whichever rank,
 * every rank returns the same code with the same message (naming the rank
 * or the key), nothing is committed, and nobody hangs. Cases that need
 * several ranks are skipped (by every rank alike) on one.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>
#include <dcp/dcp_planner.h>
#include <dcp/dcp_storage.h>

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitest.h"

static dcp_comm *comm;
static dcp_ctx *ctx;
static char root[256];
static dcp_save_options so = {sizeof(dcp_save_options), 1, 0, NULL};

static const char *sub(const char *name)
{
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

static int exists(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* Entries of dir whose names start with prefix and end with suffix. */
static int count_names(const char *dir, const char *prefix, const char *suffix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name), ls = strlen(suffix);
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0 && l >= ls &&
             strcmp(e->d_name + l - ls, suffix) == 0;
    }
    if (d)
        closedir(d);
    return n;
}

/* The POSIX back end, except that creating rank 1's data file fails: data
 * file names are fresh for every overwrite, so no obstacle in the
 * directory can be placed ahead. */
static dcp_storage_ops failing;
static int fail_create(void *impl, void *dir, const char *name, void **file,
                       struct dcp_err *err)
{
    if (strncmp(name, "__1_0.", 6) == 0)
        return dcp_storage_set_error(err, DCP_EIO,
                                     "cannot create '%s': injected", name);
    return dcp_storage_posix()->create(impl, dir, name, file, err);
}

/* Same code and message everywhere, with the expected code. */
#define CHECK_AGREED(rc, want)               \
    do {                                     \
        CHECK_RC(ctx, rc, want);             \
        CHECK(mt_same(rc));                  \
        CHECK(mt_same_str(dcp_errmsg(ctx))); \
    } while (0)

/* Tensor "w", shape [size, 4], rank r holding row r, content by seed. */
static dcp_state *row_state(float *buf, unsigned seed)
{
    int64_t shape[2] = {mt_size, 4}, off[2] = {mt_rank, 0}, size[2] = {1, 4};
    dcp_state *st;
    mt_fill((unsigned char *)buf, 2, shape, off, size, 4, seed);
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off, size, buf,
                               DCP_MEM_HOST) == 0);
    return st;
}

/* Rank 1 cannot create its data file: the save fails on every rank with
 * rank 1's error, the new files are gone, and the checkpoint committed
 * before stays loadable. */
static void test_io_error_on_rank1(void)
{
    const char *dir = sub("io");
    float a[4], b[4], c[4], got[4], want[4];
    dcp_state *sa, *sb, *sc, *sl;
    int rc;
    char obstacle[600];
    if (mt_size < 2)
        return;
    sa = row_state(a, 1);
    sb = row_state(b, 2);
    sc = row_state(c, 3);
    sl = row_state(got, 0);
    CHECK_OK(ctx, dcp_save(ctx, sa, dir, &so)); /* __r_0.distcp */
    CHECK_OK(ctx, dcp_save(ctx, sb, dir, &so)); /* tagged names */
    CHECK(!exists(dir, "__0_0.distcp"));        /* a's files removed */
    CHECK(count_names(dir, "__", ".distcp") == mt_size);
    (void)obstacle;
    failing = *dcp_storage_posix();
    failing.create = fail_create;
    if (mt_rank == 1)
        CHECK(dcp_ctx_set_storage(ctx, &failing, NULL) == DCP_OK);
    MPI_Barrier(MPI_COMM_WORLD);
    rc = dcp_save(ctx, sc, dir, &so);
    CHECK_AGREED(rc, DCP_EIO);
    CHECK_MSG(ctx, "rank 1 failed");
    CHECK_MSG(ctx, "__1_0.");
    CHECK_MSG(ctx, ".distcp");
    CHECK_MSG(ctx, "nothing committed");
    if (mt_rank == 1)
        CHECK(dcp_ctx_set_storage(ctx, NULL, NULL) == DCP_OK);
    MPI_Barrier(MPI_COMM_WORLD);
    /* Rank 0's new file removed: b's files only, no temporary, no lock. */
    CHECK(count_names(dir, "__", ".distcp") == mt_size);
    CHECK(count_names(dir, "", ".tmp") == 0);
    CHECK(!exists(dir, ".lock"));
    /* b is still the checkpoint. */
    CHECK_OK(ctx, dcp_load(ctx, sl, dir, NULL));
    memcpy(want, b, sizeof(b));
    CHECK(memcmp(got, want, sizeof(got)) == 0);
    dcp_state_free(sa);
    dcp_state_free(sb);
    dcp_state_free(sc);
    dcp_state_free(sl);
}

/* Ranks disagree on a dtype, then on a global shape: DCP_EPLAN, found
 * before anything (even the directory) is written. */
static void test_disagreements(void)
{
    const char *dir = sub("disagree");
    int64_t shape[2] = {mt_size, 4}, off[2] = {mt_rank, 0}, size[2] = {1, 4};
    double buf[5] = {0};
    dcp_state *st;
    int rc;
    if (mt_size < 2)
        return;
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "w", mt_rank == 1 ? DCP_F64 : DCP_F32, 2,
                               shape, off, size, buf, DCP_MEM_HOST) == 0);
    rc = dcp_save(ctx, st, dir, &so);
    CHECK_AGREED(rc, DCP_EPLAN);
    CHECK_MSG(ctx, "'w'");
    CHECK_MSG(ctx, "dtype");
    CHECK(access(dir, F_OK) != 0);
    dcp_state_free(st);

    CHECK(dcp_state_create(&st) == 0);
    if (mt_rank == mt_size - 1) {
        shape[1] = 5;
        size[1] = 5;
    }
    CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off, size, buf,
                               DCP_MEM_HOST) == 0);
    rc = dcp_save(ctx, st, dir, &so);
    CHECK_AGREED(rc, DCP_EPLAN);
    CHECK_MSG(ctx, "'w'");
    CHECK_MSG(ctx, "global shape");
    dcp_state_free(st);

    /* A key saved as a tensor by one rank and a value by another. */
    CHECK(dcp_state_create(&st) == 0);
    if (mt_rank == 0)
        CHECK(dcp_state_add_value(st, "w", dcp_value_int(1)) == 0);
    else
        CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off, size, buf,
                                   DCP_MEM_HOST) == 0);
    rc = dcp_save(ctx, st, dir, &so);
    CHECK_AGREED(rc, DCP_EPLAN);
    CHECK_MSG(ctx, "'w'");
    dcp_state_free(st);
}

/* Rank 0 rows [0,3), rank 1 rows [2,6): overlap. */
static void test_overlap(void)
{
    int64_t shape[2] = {6, 2}, off[2] = {0, 0}, size[2] = {3, 2};
    float buf[12] = {0};
    dcp_state *st;
    int rc;
    if (mt_size < 2)
        return;
    CHECK(dcp_state_create(&st) == 0);
    if (mt_rank == 1) {
        off[0] = 2;
        size[0] = 4;
    }
    if (mt_rank < 2)
        CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off, size, buf,
                                   DCP_MEM_HOST) == 0);
    rc = dcp_save(ctx, st, sub("overlap"), &so);
    CHECK_AGREED(rc, DCP_EPLAN);
    CHECK_MSG(ctx, "'w'");
    CHECK_MSG(ctx, "overlap");
    dcp_state_free(st);
}

/* A box outside the global shape is refused when it is added. */
static void test_box_outside(void)
{
    int64_t shape = 6, off = 5, size = 2;
    float buf[2];
    dcp_state *st;
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &shape, &off, &size, buf,
                               DCP_MEM_HOST) == DCP_EINVAL);
    off = -1;
    size = 1;
    CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &shape, &off, &size, buf,
                               DCP_MEM_HOST) == DCP_EINVAL);
    dcp_state_free(st);
}

/* A key on rank 0 only, whose boxes do not cover the tensor. */
static void test_partial_key_gap(void)
{
    int64_t shape[2] = {4, 3}, off[2] = {0, 0}, size[2] = {2, 3};
    float buf[6] = {0};
    char held[64];
    dcp_state *st;
    int rc;
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_value(st, "step", dcp_value_int(7)) == 0);
    if (mt_rank == 0)
        CHECK(dcp_state_add_tensor(st, "part", DCP_F32, 2, shape, off, size,
                                   buf, DCP_MEM_HOST) == 0);
    rc = dcp_save(ctx, st, sub("partial"), &so);
    CHECK_AGREED(rc, DCP_EPLAN);
    CHECK_MSG(ctx, "'part'");
    CHECK_MSG(ctx, "cover 6 of 12");
    if (mt_size > 1) {
        snprintf(held, sizeof(held), "held by 1 of %d ranks", mt_size);
        CHECK_MSG(ctx, held);
    }
    dcp_state_free(st);
}

/* One name, different contents per rank: refused, pointing to per-rank
 * keys (torch would keep one rank's copy silently). */
static void test_value_differs(void)
{
    dcp_state *st;
    int rc;
    if (mt_size < 2)
        return;
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_value(st, "rng", dcp_value_int(mt_rank)) == 0);
    rc = dcp_save(ctx, st, sub("differs"), &so);
    CHECK_AGREED(rc, DCP_EPLAN);
    CHECK_MSG(ctx, "'rng'");
    CHECK_MSG(ctx, "dcp_state_push_rank");
    dcp_state_free(st);
}

/* A bad argument on the last rank only: everyone fails with its code,
 * nobody hangs. (The messages differ in the path each rank passed.) */
static void test_bad_argument_one_rank(void)
{
    char want[64];
    dcp_state *st;
    int rc;
    if (mt_size < 2)
        return;
    CHECK(dcp_state_create(&st) == 0);
    rc = dcp_save(ctx, st, mt_rank == mt_size - 1 ? NULL : sub("badarg"), &so);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc));
    snprintf(want, sizeof(want), "rank %d failed", mt_size - 1);
    CHECK_MSG(ctx, want);
    CHECK_OK(ctx, dcp_save(ctx, st, sub("badarg"), &so));
    rc = dcp_load(ctx, mt_rank == mt_size - 1 ? NULL : st, sub("badarg"), NULL);
    CHECK_AGREED(rc, DCP_EINVAL);
    CHECK_MSG(ctx, want);
    dcp_state_free(st);
}

/* Ranks passing different paths would write (or read) different
 * directories: refused on every rank. */
static void test_different_paths(void)
{
    char name[32];
    dcp_state *st;
    int rc;
    if (mt_size < 2)
        return;
    snprintf(name, sizeof(name), "path-%d", mt_rank);
    CHECK(dcp_state_create(&st) == 0);
    rc = dcp_save(ctx, st, sub(name), &so);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "not every rank passed the same checkpoint path");
    CHECK(access(sub(name), F_OK) != 0);
    rc = dcp_load(ctx, st, sub(name), NULL);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "not every rank passed the same checkpoint path");
    dcp_state_free(st);
}

static int failing_item(void *ud, const dcp_plan_item *it,
                        dcp_plan_decision *d)
{
    (void)ud;
    (void)it;
    (void)d;
    return -1;
}

/* The load's first allreduce agrees on several steps at once: a failure
 * of an earlier one (the last rank's load planner) still comes before a
 * later one's (the paths, then rank 0's read of a missing .metadata), as
 * when each was agreed in turn. */
static void test_load_precedence(void)
{
    dcp_load_planner lp = {DCP_PLANNER_VERSION, 0, NULL, failing_item, NULL};
    dcp_load_options lo = {sizeof(dcp_load_options), 0, NULL};
    char name[32];
    dcp_state *st;
    int rc;
    if (mt_size < 2)
        return;
    if (mt_rank == mt_size - 1)
        lo.planner = &lp;
    snprintf(name, sizeof(name), "prec-%d", mt_rank);
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_value(st, "x", dcp_value_int(1)) == 0);
    rc = dcp_load(ctx, st, sub(name), &lo);
    CHECK(rc != DCP_OK);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "load planner on key 'x'");
    CHECK(!strstr(dcp_errmsg(ctx), "same checkpoint path"));
    dcp_state_free(st);
}

/* Load: a key missing on one rank, a dtype mismatch on one rank,
 * unexpected keys (asked for by no rank), no checkpoint at all. */
static void test_load_failures(void)
{
    const char *dir = sub("load");
    int64_t n = 4;
    float x[4] = {1, 2, 3, 4}, y[4] = {5, 6, 7, 8}, gx[4], gy[4];
    double dx[4];
    dcp_load_options lo = {sizeof(dcp_load_options), DCP_LOAD_PARTIAL, NULL};
    const char *const *keys;
    char want[64];
    dcp_state *st;
    int rc;
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "x", DCP_F32, 1, &n, NULL, NULL, x,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_tensor(st, "y", DCP_F32, 1, &n, NULL, NULL, y,
                               DCP_MEM_HOST) == 0);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, &so));
    dcp_state_free(st);

    /* The last rank also asks for "nope". */
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "x", DCP_F32, 1, &n, NULL, NULL, gx,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_tensor(st, "y", DCP_F32, 1, &n, NULL, NULL, gy,
                               DCP_MEM_HOST) == 0);
    if (mt_rank == mt_size - 1)
        CHECK(dcp_state_add_tensor(st, "nope", DCP_F32, 1, &n, NULL, NULL, gy,
                                   DCP_MEM_HOST) == 0);
    rc = dcp_load(ctx, st, dir, NULL);
    CHECK_AGREED(rc, DCP_EKEY);
    CHECK_MSG(ctx, "'nope'");
    if (mt_size > 1) {
        snprintf(want, sizeof(want), "rank %d failed", mt_size - 1);
        CHECK_MSG(ctx, want);
    }
    dcp_state_free(st);

    /* Rank 0 asks for x as float64. */
    CHECK(dcp_state_create(&st) == 0);
    if (mt_rank == 0)
        CHECK(dcp_state_add_tensor(st, "x", DCP_F64, 1, &n, NULL, NULL, dx,
                                   DCP_MEM_HOST) == 0);
    else
        CHECK(dcp_state_add_tensor(st, "x", DCP_F32, 1, &n, NULL, NULL, gx,
                                   DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_tensor(st, "y", DCP_F32, 1, &n, NULL, NULL, gy,
                               DCP_MEM_HOST) == 0);
    rc = dcp_load(ctx, st, dir, NULL);
    CHECK_AGREED(rc, DCP_EMISMATCH);
    CHECK_MSG(ctx, "'x'");
    CHECK_MSG(ctx, "dtype");
    dcp_state_free(st);

    /* Nobody asks for y: unexpected, strict fails, partial reports it. */
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "x", DCP_F32, 1, &n, NULL, NULL, gx,
                               DCP_MEM_HOST) == 0);
    rc = dcp_load(ctx, st, dir, NULL);
    CHECK_AGREED(rc, DCP_EKEY);
    CHECK_MSG(ctx, "unexpected key 'y'");
    memset(gx, 0, sizeof(gx));
    CHECK_OK(ctx, dcp_load(ctx, st, dir, &lo));
    CHECK(memcmp(gx, x, sizeof(x)) == 0);
    CHECK(dcp_load_report(ctx, 1, &keys) == 1 && strcmp(keys[0], "y") == 0);
    CHECK(dcp_load_report(ctx, 0, &keys) == 0);
    dcp_state_free(st);

    /* Rank 1 alone asks for y, the others for x: nothing unexpected. */
    if (mt_size > 1) {
        CHECK(dcp_state_create(&st) == 0);
        if (mt_rank == 1)
            CHECK(dcp_state_add_tensor(st, "y", DCP_F32, 1, &n, NULL, NULL, gy,
                                       DCP_MEM_HOST) == 0);
        else
            CHECK(dcp_state_add_tensor(st, "x", DCP_F32, 1, &n, NULL, NULL, gx,
                                       DCP_MEM_HOST) == 0);
        memset(gx, 0, sizeof(gx));
        memset(gy, 0, sizeof(gy));
        CHECK_OK(ctx, dcp_load(ctx, st, dir, NULL));
        if (mt_rank == 1)
            CHECK(memcmp(gy, y, sizeof(y)) == 0);
        else
            CHECK(memcmp(gx, x, sizeof(x)) == 0);
        dcp_state_free(st);
    }

    CHECK(dcp_state_create(&st) == 0);
    rc = dcp_load(ctx, st, sub("does-not-exist"), NULL);
    CHECK_AGREED(rc, DCP_ENOENT);
    CHECK_MSG(ctx, "does-not-exist");
    dcp_state_free(st);
}

/* dcp_state_fail on one rank: save, async save and load fail on every
 * rank with its code and "rank R failed: <its message>", nothing written
 * (a previous checkpoint intact), and the next call works. */
static void test_state_fail_one_rank(void)
{
    char want[128];
    dcp_state *st, *bad;
    dcp_request *req = NULL;
    float x[4] = {1, 2, 3, 4}, y[4] = {0};
    int64_t shape = 4, off = 0, n = 4;
    int rc, files, r = mt_size - 1;
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "x", DCP_F32, 1, &shape, &off, &n, x,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_create(&bad) == 0);
    CHECK(dcp_state_add_tensor(bad, "x", DCP_F32, 1, &shape, &off, &n, x,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_fail(NULL, DCP_EINVAL, "x") == DCP_EINVAL);
    CHECK(dcp_state_fail(bad, 7, "first") == DCP_OK); /* not a code: EINVAL */
    CHECK(dcp_state_fail(bad, DCP_ENOTSUP, "'model.w': a sparse tensor") ==
          DCP_OK);
    CHECK_OK(ctx, dcp_save(ctx, st, sub("statefail"), &so));
    /* the coordinator's cleanup after its commit (the lock, the old
     * files) may still run when the other ranks return: counted after it */
    MPI_Barrier(MPI_COMM_WORLD);
    files = count_names(sub("statefail"), "", "");
    if (mt_size > 1)
        snprintf(want, sizeof(want), "rank %d failed: 'model.w': a sparse tensor",
                 r);
    else /* one rank: its own message */
        snprintf(want, sizeof(want), "'model.w': a sparse tensor");
    rc = dcp_save(ctx, mt_rank == r ? bad : st, sub("statefail"), &so);
    CHECK_AGREED(rc, DCP_ENOTSUP);
    CHECK_MSG(ctx, want);
    rc = dcp_save_async(ctx, mt_rank == r ? bad : st, sub("statefail"), &so,
                        &req);
    if (rc == DCP_OK)
        rc = dcp_request_wait(req);
    dcp_request_free(req);
    CHECK_AGREED(rc, DCP_ENOTSUP);
    CHECK_MSG(ctx, want);
    rc = dcp_load(ctx, mt_rank == r ? bad : st, sub("statefail"), NULL);
    CHECK_AGREED(rc, DCP_ENOTSUP);
    CHECK_MSG(ctx, want);
    /* nothing written over the previous checkpoint: it loads */
    {
        dcp_state *ld;
        CHECK(dcp_state_create(&ld) == 0);
        CHECK(dcp_state_add_tensor(ld, "x", DCP_F32, 1, &shape, &off, &n, y,
                                   DCP_MEM_HOST) == 0);
        CHECK_OK(ctx, dcp_load(ctx, ld, sub("statefail"), NULL));
        CHECK(memcmp(x, y, sizeof(x)) == 0);
        dcp_state_free(ld);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(count_names(sub("statefail"), "", "") == files);
    CHECK_OK(ctx, dcp_save(ctx, st, sub("statefail"), &so));
    dcp_state_free(bad);
    dcp_state_free(st);
}

int main(int argc, char **argv)
{
    int rc;
    mt_init(&argc, &argv);
    mt_tmpdir(root, sizeof(root), "errors");
    rc = dcp_comm_mpi(&comm, MPI_COMM_WORLD);
    if (rc == DCP_OK)
        rc = dcp_ctx_create(&ctx, comm, NULL);
    if (rc != DCP_OK) {
        fprintf(stderr, "setup failed: %s\n", dcp_strerror(rc));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    RUN(io_error_on_rank1);
    RUN(disagreements);
    RUN(overlap);
    RUN(box_outside);
    RUN(partial_key_gap);
    RUN(value_differs);
    RUN(bad_argument_one_rank);
    RUN(different_paths);
    RUN(load_precedence);
    RUN(load_failures);
    RUN(state_fail_one_rank);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    return mt_finish();
}
