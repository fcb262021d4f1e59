/*
 * Crash injection: a save is killed (SIGKILL, as kill -9) right before each
 * of its storage operations in turn, on one rank at a time, in one process
 * and across 2 and 3 forked ranks joined by forkcomm.h (the other ranks
 * see the victim vanish and must give up cleanly). Scenarios: a save into
 * a new directory, over a committed checkpoint with the same file names,
 * and over one whose files carry a tag. The async series run the same
 * with dcp_save_async and a 64 KiB staging budget below each rank's
 * tensor bytes, so the writer thread drains pieces while the caller's
 * thread still stages: the crash points there fall in the writer thread,
 * at every operation it makes; each rank scrambles its buffers and frees
 * its state as soon as dcp_save_async returns, then waits.
 *
 * After each crash, invariant (I) of the reliability plan:
 *  (a) the directory loads the previous checkpoint bit-exact; or the new
 *      one bit-exact, exactly when the crash came after the commit rename
 *      (then, if any rank reported success, it must be the new one);
 *  (b) a new directory with no commit is refused: DCP_ENOENT, "no
 *      checkpoint" or "does not exist" (never partially loaded);
 *  (c) no rank hangs; survivors return DCP_OK or a transport error and
 *      exit cleanly (under ASan, LeakSanitizer checks their exit);
 *  (d) a new save into the directory then succeeds and loads bit-exact.
 * Usage: test_crash [--quick] (every third crash point; the default in
 * ASan builds).
 * Helpers for the MPI crash driver (tests/mpi/mpi_crash.sh):
 *   test_crash prepare DIR KIND     KIND 0 new, 1 overwrite, 2 tagged
 *   test_crash save DIR SEED        one durable save (strace_commit.py)
 *   test_crash check DIR KIND COMMITTED
 *                                   (a), (b) and (d) after a crash; COMMITTED
 *                                   1 when it came after the commit rename
 */
#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "commit_rules.h"
#include "faultfs.h"
#include "forkcomm.h"
#include "refstate.h"
#include "test.h"

static char root[256];
static int quick;
static long npoints, nmutating, nwriter, nasync;

static const char *dirpath(const char *name)
{
    static char buf[512];
    if (!root[0]) {
        strcpy(root, "/tmp/dcp-crash-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    snprintf(buf, sizeof(buf), "%s/%s", root, name);
    return buf;
}

/* What each rank reports back (shared memory). */
struct rank_result {
    int done;    /* reached the end of the save call */
    int rc;      /* its result */
    int renamed; /* rank 0: the commit rename succeeded */
    uint64_t nops;
    uint64_t rename_op;   /* rank 0: index of the rename operation */
    uint64_t mut_mask[4]; /* bit per op index < 256: a mutating op */
    uint64_t wrk_mask[4]; /* bit per op index < 256: on the writer thread */
    uint64_t staged;      /* dcp_ctx_staging_bytes after the save */
};

struct job {
    const char *dir;
    int victim;
    uint64_t crash_at;
    int async; /* dcp_save_async with a staging budget, then wait */
    struct rank_result *res; /* FC_MAX entries */
};

/* The async series: each rank's tensor bytes (big has 640 rows: 200 KiB,
 * 67 KiB on each of 3 ranks) above the staging budget. */
#define ASYNC_BUDGET   ((uint64_t)64 << 10)
#define ASYNC_BIG_ROWS 640

/* dcp_save_async, the sources scrambled and freed at once, then wait. */
static int save_async(dcp_ctx *ctx, struct refstate *r, const char *dir)
{
    dcp_request *req = NULL;
    int rc = dcp_save_async(ctx, r->st, dir, NULL, &req);
    if (rc != DCP_OK)
        return rc;
    rs_fill(r->big, sizeof(r->big), 77);
    rs_fill(r->mat, sizeof(r->mat), 78);
    rs_fill(r->vec, sizeof(r->vec), 79);
    rs_free(r);
    rc = dcp_request_wait(req);
    dcp_request_free(req);
    return rc;
}

static int rank_main(int rank, dcp_comm *comm, void *arg)
{
    struct job *j = arg;
    struct rank_result *me = &j->res[rank];
    struct faultfs ff;
    struct refstate r;
    dcp_ctx_options o = {0};
    dcp_ctx *ctx;
    size_t i;
    signal(SIGPIPE, SIG_IGN);
    ff_init(&ff);
    ff.tracing = 1;
    if (rank == j->victim)
        ff.crash_at = j->crash_at;
    o.struct_size = sizeof(o);
    o.storage = ff_ops();
    o.storage_impl = &ff;
    if (j->async)
        o.staging_budget = ASYNC_BUDGET;
    if (dcp_ctx_create(&ctx, comm, &o))
        return 101;
    if (rs_build_part(&r, RS_SEED_NEW, rank, dcp_ctx_size(ctx)))
        return 102;
    if (j->async)
        me->rc = save_async(ctx, &r, j->dir);
    else
        me->rc = dcp_save(ctx, r.st, j->dir, NULL);
    me->done = 1;
    me->nops = ff.nops;
    me->staged = dcp_ctx_staging_bytes(ctx);
    for (i = 0; i < ff.ntrace; i++) {
        const struct ff_event *e = &ff.trace[i];
        if (e->op == FF_RENAME && e->rc == 0 &&
            cr_commit_rename(e->name)) {
            me->renamed = 1;
            me->rename_op = i + 1;
        }
        if (i < 256 && ((FF_MUTATING >> e->op) & 1))
            me->mut_mask[i / 64] |= (uint64_t)1 << (i % 64);
        if (i < 256 && e->worker)
            me->wrk_mask[i / 64] |= (uint64_t)1 << (i % 64);
    }
    rs_free(&r);
    dcp_ctx_free(ctx);
    ff_release(&ff);
    return 0;
}

/* Runs the job on n ranks; fills status per rank. Returns 0, or -1 when a
 * rank hung (all are killed). */
static int run_job(struct job *j, int n, int *status)
{
    pid_t pids[FC_MAX];
    time_t t0 = time(NULL);
    int r, left = n;
    memset(j->res, 0, FC_MAX * sizeof(*j->res));
    if (fc_spawn(n, rank_main, j, pids))
        abort();
    for (r = 0; r < n; r++)
        status[r] = -1;
    while (left) {
        int st;
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            for (r = 0; r < n; r++)
                if (pids[r] == p)
                    status[r] = st;
            left--;
            continue;
        }
        if (time(NULL) - t0 > 30) {
            for (r = 0; r < n; r++)
                if (status[r] == -1)
                    kill(pids[r], SIGKILL);
            while (waitpid(-1, NULL, 0) > 0)
                ;
            return -1;
        }
        (void)usleep(1000);
    }
    return 0;
}

/* Prepares dir: 0 new, 1 committed old with plain names, 2 committed old
 * with tagged names. */
static int prepare(const char *dir, int kind)
{
    rs_rmtree(dir);
    if (kind == 0)
        return 0;
    if (kind == 2 && rs_save(dir, RS_SEED_NEW, 0))
        return -1;
    return rs_save(dir, RS_SEED_OLD, 0);
}

static const char *const kind_names[3] = {"new dir", "overwrite",
                                          "overwrite tagged"};

/* All crash points of one (scenario, ranks, victim, sync or async);
 * returns a failure description or NULL. */
static const char *crash_series(int kind, int n, int victim, int async,
                                char *why, size_t whylen)
{
    const char *dir = dirpath("ckpt");
    struct rank_result *res;
    struct job j;
    int status[FC_MAX], r;
    uint64_t m, rename_op, k;
    uint64_t mut[4], wrk[4];
    res = mmap(NULL, FC_MAX * sizeof(*res), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        abort();
    j.dir = dir;
    j.res = res;
    j.victim = victim;
    j.crash_at = 0;
    j.async = async;
    /* A clean run counts the victim's operations. */
    if (prepare(dir, kind) || run_job(&j, n, status))
        return "clean run failed";
    for (r = 0; r < n; r++)
        if (!res[r].done || res[r].rc != 0 || status[r] != 0) {
            snprintf(why, whylen, "clean run: rank %d rc %d status %d", r,
                     res[r].rc, status[r]);
            return why;
        }
    if (rs_check(dir, NULL, 0) != RS_SEED_NEW)
        return "clean run: the checkpoint does not load bit-exact";
    /* Staging in pieces: the arena stayed within the budget, below the
     * rank's tensor bytes (more than 64 KiB on every rank). */
    for (r = 0; async && r < n; r++)
        if (res[r].staged == 0 || res[r].staged > ASYNC_BUDGET) {
            snprintf(why, whylen, "async clean run: rank %d staged %llu bytes",
                     r, (unsigned long long)res[r].staged);
            return why;
        }
    m = res[victim].nops;
    rename_op = res[0].rename_op;
    memcpy(mut, res[victim].mut_mask, sizeof(mut));
    memcpy(wrk, res[victim].wrk_mask, sizeof(wrk));
    if (async && !(wrk[0] | wrk[1] | wrk[2] | wrk[3]))
        return "async clean run: no operation on the writer thread";
    for (k = 1; k <= m; k++) {
        int committed, got, anyok = 0, survivors_ok = 1;
        char lmsg[1024];
        if (quick && k % 3 != 1 && k != m)
            continue;
        j.crash_at = k;
        if (prepare(dir, kind))
            return "prepare failed";
        if (run_job(&j, n, status)) {
            snprintf(why, whylen,
                     "%s%s, %d ranks, crash of rank %d at op %llu: "
                     "a rank hung",
                     kind_names[kind], async ? " (async)" : "", n, victim,
                     (unsigned long long)k);
            return why;
        }
        npoints++;
        nasync += async;
        if (k - 1 < 256 && ((mut[(k - 1) / 64] >> ((k - 1) % 64)) & 1))
            nmutating++;
        if (k - 1 < 256 && ((wrk[(k - 1) / 64] >> ((k - 1) % 64)) & 1))
            nwriter++;
        if (!WIFSIGNALED(status[victim]) ||
            WTERMSIG(status[victim]) != SIGKILL) {
            snprintf(why, whylen, "op %llu: victim not killed",
                     (unsigned long long)k);
            return why;
        }
        for (r = 0; r < n; r++) {
            if (r == victim)
                continue;
            if (status[r] != 0 || !res[r].done ||
                (res[r].rc != 0 && res[r].rc != DCP_EIO))
                survivors_ok = 0;
            anyok |= res[r].done && res[r].rc == 0;
        }
        committed = victim == 0 ? k > rename_op : res[0].renamed;
        got = rs_check(dir, lmsg, sizeof(lmsg));
        if (!survivors_ok) {
            snprintf(why, whylen,
                     "%s%s, %d ranks, rank %d killed at op %llu: a "
                     "survivor failed (status/rc)",
                     kind_names[kind], async ? " (async)" : "", n, victim,
                     (unsigned long long)k);
            return why;
        }
        if ((anyok && !committed) || (committed && got != RS_SEED_NEW) ||
            (!committed && kind > 0 && got != RS_SEED_OLD) ||
            (!committed && kind == 0 &&
             (got != DCP_ENOENT || (!strstr(lmsg, "no checkpoint") &&
                                    !strstr(lmsg, "does not exist"))))) {
            snprintf(why, whylen,
                     "%s%s, %d ranks, rank %d killed at op %llu (rename at "
                     "%llu, committed %d, success reported %d): load gives "
                     "%d (%.300s)",
                     kind_names[kind], async ? " (async)" : "", n, victim,
                     (unsigned long long)k, (unsigned long long)rename_op,
                     committed, anyok, got, lmsg);
            return why;
        }
        /* (d) a new save over the debris. */
        if (rs_save(dir, RS_SEED_NEW, 1) ||
            rs_check(dir, NULL, 0) != RS_SEED_NEW) {
            snprintf(why, whylen, "op %llu: recovery save failed",
                     (unsigned long long)k);
            return why;
        }
    }
    munmap(res, FC_MAX * sizeof(*res));
    return NULL;
}

#define SERIES_(kind, n, victim, async)                               \
    do {                                                              \
        char why_[1024];                                              \
        const char *bad_ =                                            \
            crash_series(kind, n, victim, async, why_, sizeof(why_)); \
        if (bad_)                                                     \
            FAIL_AT_("%s", bad_);                                     \
    } while (0)
#define SERIES(kind, n, victim)       SERIES_(kind, n, victim, 0)
#define ASYNC_SERIES(kind, n, victim) SERIES_(kind, n, victim, 1)

TEST(single_process)
{
    SERIES(0, 1, 0);
    SERIES(1, 1, 0);
    SERIES(2, 1, 0);
}

TEST(three_ranks_rank0)
{
    SERIES(0, 3, 0);
    SERIES(1, 3, 0);
    SERIES(2, 3, 0);
}

TEST(three_ranks_other)
{
    SERIES(0, 3, 1);
    SERIES(1, 3, 1);
    SERIES(2, 3, 1);
    SERIES(0, 3, 2);
    SERIES(1, 3, 2);
    SERIES(2, 3, 2);
}

TEST(two_ranks)
{
    SERIES(0, 2, 0);
    SERIES(1, 2, 0);
    SERIES(2, 2, 0);
    SERIES(0, 2, 1);
    SERIES(1, 2, 1);
    SERIES(2, 2, 1);
}

/* The async writer: one process, and 3 ranks with the victim rank 0 and
 * rank 2, in every scenario (rs_big_rows raised so that each rank's
 * tensors exceed the staging budget). */
TEST(async_writer)
{
    int rows = rs_big_rows;
    rs_big_rows = ASYNC_BIG_ROWS;
    ASYNC_SERIES(0, 1, 0);
    ASYNC_SERIES(1, 1, 0);
    ASYNC_SERIES(2, 1, 0);
    ASYNC_SERIES(0, 3, 0);
    ASYNC_SERIES(1, 3, 0);
    ASYNC_SERIES(2, 3, 0);
    ASYNC_SERIES(0, 3, 2);
    ASYNC_SERIES(1, 3, 2);
    ASYNC_SERIES(2, 3, 2);
    rs_big_rows = rows;
}

/* test_crash check: exit status 0 when the invariant holds. */
static int check_main(const char *dir, int kind, int committed)
{
    char lmsg[1024];
    int got = rs_check(dir, lmsg, sizeof(lmsg));
    int want = committed ? RS_SEED_NEW : kind ? RS_SEED_OLD : DCP_ENOENT;
    if (got != want) {
        fprintf(stderr, "%s: load gives %d, want %d (%s)\n", dir, got, want,
                lmsg);
        return 1;
    }
    if (got == DCP_ENOENT && !strstr(lmsg, "no checkpoint") &&
        !strstr(lmsg, "does not exist")) {
        fprintf(stderr, "%s: unclear refusal: %s\n", dir, lmsg);
        return 1;
    }
    if (rs_save(dir, RS_SEED_NEW, 1) || rs_check(dir, NULL, 0) != RS_SEED_NEW) {
        fprintf(stderr, "%s: recovery save failed\n", dir);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    int rc;
    if (argc == 4 && !strcmp(argv[1], "prepare"))
        return prepare(argv[2], atoi(argv[3])) ? 1 : 0;
    if (argc == 4 && !strcmp(argv[1], "save")) { /* durable, for strace */
        rs_io_flags = DCP_IO_NO_URING;           /* writes strace can see */
        return rs_save(argv[2], (unsigned)atoi(argv[3]), 1) ? 1 : 0;
    }
    if (argc == 5 && !strcmp(argv[1], "check"))
        return check_main(argv[2], atoi(argv[3]), atoi(argv[4]));
    /* Under ASan every third point (the plain build runs all). */
    quick = RS_SANITIZED || (argc > 1 && !strcmp(argv[1], "--quick"));
    RUN(single_process);
    RUN(three_ranks_rank0);
    RUN(three_ranks_other);
    RUN(two_ranks);
    RUN(async_writer);
    printf("crash points: %ld run (%ld before a mutating operation; %ld in "
           "async saves, %ld of them on the writer thread)%s\n",
           npoints, nmutating, nasync, nwriter, quick ? ", quick mode" : "");
    if (root[0])
        rs_rmtree(root);
    rc = TEST_SUMMARY();
    return rc;
}
