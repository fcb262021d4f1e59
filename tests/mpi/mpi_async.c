/*
 * Asynchronous save across ranks: the checkpoint holds every rank's values
 * at the call even though every rank changes its buffers right after it
 * returns (whole state staged, and staged through a 64 KiB budget); every
 * communicator call happens on the calling thread (a communicator that
 * checks the thread of each call, over MPI initialised with
 * MPI_THREAD_FUNNELED); a background I/O failure on one rank is returned
 * by dcp_request_wait on every rank with the same code and message, and
 * nothing is committed; dcp_request_test completes on every rank at the
 * same call; freeing the contexts with a save in flight commits nothing.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_comm.h>
#include <dcp/dcp_mpi.h>

#include <dirent.h>
#include <pthread.h>
#include <unistd.h>

#include "mpitest.h"
#include "mt_usercomm.h"
#include "save.h" /* dcp__save_write_fail_after */
#include "../tmpnames.h"

static char root[256];
static dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

static const char *sub(const char *name)
{
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d)
        return -1;
    while ((de = readdir(d)) != NULL)
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return n;
}

/* Removes dir, its files and its subdirectories' files. */
static void rm_tree(const char *dir, int depth)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[800];
    if (!d)
        return;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        if (unlink(p) != 0 && depth > 0)
            rm_tree(p, depth - 1);
    }
    closedir(d);
    (void)rmdir(dir);
}

static int has_file(const char *dir, const char *name)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* ---------------------------------- a communicator that checks threads */

static pthread_t main_thread;
static long calls, wrong_thread;

static void on_thread(void)
{
    calls++;
    if (!pthread_equal(pthread_self(), main_thread))
        wrong_thread++;
}

/* The user communicator, checking every call's thread. */
static dcp_comm *checking_comm(void)
{
    dcp_comm *out = NULL;
    mt_user_hook = on_thread;
    (void)mt_user_comm(&out);
    return out;
}

/* ------------------------------------------------------------ the state */

#define ROWS 64
#define COLS 1000
#define REP  4096

struct data {
    float *w; /* rows [ROWS*rank, ROWS*(rank+1)) of [ROWS*size, COLS] */
    unsigned char *rep; /* replicated: the same on every rank */
    int64_t step;
};

static uint64_t rs = 1;

static uint64_t rnd(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return rs;
}

static void data_alloc(struct data *d)
{
    d->w = calloc(ROWS * COLS, sizeof(float));
    d->rep = calloc(REP, 1);
    d->step = 0;
}

static void data_free(struct data *d)
{
    free(d->w);
    free(d->rep);
}

/* Changes every buffer: a range of the rank's rows (rank-specific), the
 * replicated bytes (the same change on every rank), the step. */
static void data_mutate(struct data *d, unsigned it)
{
    uint64_t saved;
    size_t i, a, n;
    rs = (uint64_t)(it + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)mt_rank;
    a = (size_t)(rnd() % (ROWS * COLS));
    n = 1 + (size_t)(rnd() % (ROWS * COLS - a));
    for (i = 0; i < n; i++)
        d->w[a + i] += (float)(1 + rnd() % 7);
    saved = rs;
    rs = (uint64_t)(it + 1) * 0xC2B2AE3D27D4EB4FULL; /* same on all ranks */
    a = (size_t)(rnd() % REP);
    n = 1 + (size_t)(rnd() % (REP - a));
    for (i = 0; i < n; i++)
        d->rep[a + i] ^= (unsigned char)(1 + rnd() % 255);
    rs = saved;
    d->step += 1 + mt_rank;
}

static dcp_state *data_state(struct data *d)
{
    int64_t shape[2] = {(int64_t)ROWS * mt_size, COLS},
            off[2] = {(int64_t)ROWS * mt_rank, 0}, size[2] = {ROWS, COLS};
    int64_t rshape[1] = {REP};
    dcp_state *st;
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off, size, d->w,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_tensor(st, "rep", DCP_U8, 1, rshape, NULL, NULL, d->rep,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_push_rank(st, mt_rank) == 0);
    CHECK(dcp_state_add_value(st, "step", dcp_value_int(d->step)) == 0);
    CHECK(dcp_state_pop(st) == 0);
    return st;
}

/* Loads dir and compares with gold (this rank's view). */
static void data_check(dcp_ctx *ctx, const struct data *gold, const char *dir)
{
    struct data got;
    dcp_state *st;
    data_alloc(&got);
    st = data_state(&got);
    CHECK_OK(ctx, dcp_load(ctx, st, dir, NULL));
    CHECK(memcmp(got.w, gold->w, ROWS * COLS * sizeof(float)) == 0);
    CHECK(memcmp(got.rep, gold->rep, REP) == 0);
    {
        char key[32];
        snprintf(key, sizeof(key), "rank%d.step", mt_rank);
        CHECK(dcp_value_as_int(dcp_state_value(st, key)) == gold->step);
    }
    dcp_state_free(st);
    data_free(&got);
}

/* Evaluates call once; the same code on every rank, the expected one. */
#define CHECK_AGREED(ctx, call, want)    \
    do {                                 \
        int agreed_rc_ = (call);         \
        CHECK_RC(ctx, agreed_rc_, want); \
        CHECK(mt_same(agreed_rc_));      \
    } while (0)

/* ---------------------------------------------------------------- tests */

static void mutate_loop(dcp_comm *comm, int iters, const char *name)
{
    dcp_ctx_options o;
    dcp_ctx *full, *tight;
    struct data d, gold;
    dcp_state *st;
    const char *dir = sub(name);
    int it;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.staging_budget = 64 << 10; /* a quarter of a rank's state */
    CHECK(dcp_ctx_create(&full, comm, NULL) == 0);
    CHECK(dcp_ctx_create(&tight, comm, &o) == 0);
    data_alloc(&d);
    data_alloc(&gold);
    data_mutate(&d, 0);
    for (it = 1; it <= iters; it++) {
        dcp_ctx *ctx = it % 2 ? tight : full;
        dcp_request *req = NULL;
        int rc;
        memcpy(gold.w, d.w, ROWS * COLS * sizeof(float));
        memcpy(gold.rep, d.rep, REP);
        gold.step = d.step;
        st = data_state(&d);
        CHECK_AGREED(ctx, dcp_save_async(ctx, st, dir, &nosync, &req), 0);
        dcp_state_free(st); /* the state may go at once too */
        data_mutate(&d, (unsigned)it);
        rc = dcp_request_wait(req);
        CHECK_AGREED(ctx, rc, 0);
        CHECK(mt_same_str(dcp_request_errmsg(req)));
        dcp_request_free(req);
        data_check(full, &gold, dir);
    }
    CHECK(dcp_ctx_staging_bytes(tight) <= o.staging_budget);
    data_free(&d);
    data_free(&gold);
    dcp_ctx_free(full);
    dcp_ctx_free(tight);
}

static void test_mutate_after_return_checked_comm(void)
{
    dcp_comm *comm = checking_comm();
    main_thread = pthread_self();
    calls = wrong_thread = 0;
    mutate_loop(comm, 16, "mutate-checked");
    CHECK(calls > 0);
    CHECK(wrong_thread == 0);
    dcp_comm_free(comm);
}

static void test_mutate_after_return_mpi(void)
{
    dcp_comm *comm = NULL;
    CHECK(dcp_comm_mpi(&comm, MPI_COMM_WORLD) == 0);
    mutate_loop(comm, 10, "mutate-mpi");
    dcp_comm_free(comm);
}

/* The last rank's third data write fails in the background. */
static void test_background_failure_on_one_rank(void)
{
    dcp_comm *comm = NULL;
    dcp_ctx *ctx;
    struct data d, gold;
    dcp_state *st;
    dcp_request *req = NULL;
    const char *dir = sub("bgfail");
    char want[64];
    int before = 0, bad = mt_size - 1;
    CHECK(dcp_comm_mpi(&comm, MPI_COMM_WORLD) == 0);
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == 0);
    data_alloc(&d);
    data_alloc(&gold);
    data_mutate(&d, 1);
    memcpy(gold.w, d.w, ROWS * COLS * sizeof(float));
    memcpy(gold.rep, d.rep, REP);
    gold.step = d.step;
    st = data_state(&d);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, &nosync));
    dcp_state_free(st);
    if (mt_rank == 0)
        before = count_files(dir);
    data_mutate(&d, 2);
    st = data_state(&d);
    if (mt_rank == bad)
        (void)dcp__save_write_fail_after(1);
    CHECK_AGREED(ctx, dcp_save_async(ctx, st, dir, &nosync, &req), 0);
    dcp_state_free(st);
    CHECK_AGREED(ctx, dcp_request_wait(req), DCP_EIO);
    (void)dcp__save_write_fail_after(0);
    CHECK(mt_same_str(dcp_request_errmsg(req)));
    CHECK(mt_same_str(dcp_errmsg(ctx)));
    if (mt_rank == 0)
        fprintf(stderr, "     message: %s\n", dcp_request_errmsg(req));
    CHECK(strstr(dcp_request_errmsg(req), "injected failure") != NULL);
    CHECK(strstr(dcp_request_errmsg(req), "nothing committed") != NULL);
    snprintf(want, sizeof(want), "rank %d failed", bad);
    if (mt_size > 1)
        CHECK(strstr(dcp_request_errmsg(req), want) != NULL);
    dcp_request_free(req);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0) {
        CHECK(count_files(dir) == before);
        CHECK(dcp_test_meta_tmps(dir) == 0);
    }
    data_check(ctx, &gold, dir); /* the first checkpoint, intact */
    data_free(&d);
    data_free(&gold);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
}

/* dcp_request_test: every rank sees done at the same call. */
static void test_test_polls_agree(void)
{
    dcp_comm *comm = NULL;
    dcp_ctx *ctx;
    struct data d;
    dcp_state *st;
    dcp_request *req = NULL;
    const char *dir = sub("poll");
    int done = 0, polls = 0, rc = 0;
    CHECK(dcp_comm_mpi(&comm, MPI_COMM_WORLD) == 0);
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == 0);
    data_alloc(&d);
    data_mutate(&d, 5);
    st = data_state(&d);
    CHECK_AGREED(ctx, dcp_save_async(ctx, st, dir, &nosync, &req), 0);
    dcp_state_free(st);
    if (mt_rank == 0)
        usleep(20000); /* rank 0 lags: the others must keep polling */
    do {
        rc = dcp_request_test(req, &done);
        polls++;
    } while (rc == 0 && !done && polls < 1000000);
    CHECK_AGREED(ctx, rc, 0);
    CHECK(done == 1);
    CHECK(mt_same(polls));
    CHECK_AGREED(ctx, dcp_request_wait(req), 0);
    CHECK_AGREED(ctx, dcp_request_wait(req), DCP_EINVAL);
    dcp_request_free(req);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0)
        CHECK(has_file(dir, ".metadata"));
    data_free(&d);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
}

/* Every rank frees its context with the save in flight: no hang, nothing
 * committed, no data file left. */
static void test_free_ctx_in_flight(void)
{
    dcp_comm *comm = NULL;
    dcp_ctx *ctx;
    struct data d;
    dcp_state *st;
    dcp_request *req = NULL;
    const char *dir = sub("freectx");
    CHECK(dcp_comm_mpi(&comm, MPI_COMM_WORLD) == 0);
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == 0);
    data_alloc(&d);
    st = data_state(&d);
    CHECK_AGREED(ctx, dcp_save_async(ctx, st, dir, &nosync, &req), 0);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    CHECK_RC(NULL, dcp_request_wait(req), DCP_EINVAL);
    dcp_request_free(req);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0) {
        CHECK(!has_file(dir, ".metadata"));
        CHECK(count_files(dir) == 0);
    }
    data_free(&d);
    dcp_comm_free(comm);
}

int main(int argc, char **argv)
{
    int provided = 0;
    (void)mt_init; /* MPI_Init_thread instead: the caller's threads matter */
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
    mt_tmpdir(root, sizeof(root), "async");
    RUN(mutate_after_return_checked_comm);
    RUN(mutate_after_return_mpi);
    RUN(background_failure_on_one_rank);
    RUN(test_polls_agree);
    RUN(free_ctx_in_flight);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0)
        rm_tree(root, 1);
    return mt_finish();
}
