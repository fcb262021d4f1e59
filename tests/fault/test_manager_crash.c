/*
 * The checkpoint manager under kill -9: a root holds committed step-2 and
 * step-4; a manager (keep_last 2) saves step-6, whose commit makes
 * retention remove step-2. A forked child does it and is killed (SIGKILL)
 * right before each of its storage operations in turn (faultfs: the save,
 * and the .metadata reads of retention's listing), and right before each
 * change retention's removal makes (unlink .metadata, sync, unlink a data
 * file, rmdir, sync the parent: dcp__mgr_set_remove_hook). Sync and async
 * saves (async: the buffers scrambled as soon as the save returns), in
 * one process and on 3 forked ranks joined by forkcomm.h (victim rank 0,
 * or rank 2 with an async save; retention runs on rank 0 only), where
 * the other ranks see the victim vanish and must not hang.
 *
 * After each kill:
 *  (a) every step listed complete loads bit-exact (a half-written or
 *      half-removed step is never complete);
 *  (b) step-4 is complete; step-2 is complete unless step-6 is (retention
 *      runs only after the commit): nothing committed is lost beyond what
 *      retention removed;
 *  (c) the latest (a fresh manager's) is step-6 when it is complete, else
 *      step-4, and dcp_manager_load_latest loads it bit-exact;
 *  (d) a manager then saves step-8 over the debris, retention runs, and
 *      the latest is step-8, bit-exact.
 * Usage: test_manager_crash [--full]: every crash point (scripts/
 * reliability.sh); the default, for make check, takes every third.
 */
#define _GNU_SOURCE
#include <dcp/dcp.h>
#include <dcp/dcp_manager.h>
#include <dcp/dcp_storage.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "faultfs.h"
#include "forkcomm.h"
#include "manager.h"
#include "test.h"

#define NEL 4096 /* floats per checkpoint: 16 KiB */

static char root[512];
static int full;
static long npoints;
static float buf[NEL];
static const dcp_save_options durable = {sizeof(dcp_save_options), 0, 0, NULL};

struct shared {
    int done;
    int rc;
    uint64_t nops;    /* storage operations of the rank */
    uint64_t nremove; /* changes retention's removal made */
};
static struct shared *sh; /* FC_MAX entries, one per rank */
static struct shared *me; /* this rank's, in a rank's process */

static void fill(int64_t step)
{
    for (int i = 0; i < NEL; i++)
        buf[i] = (float)(step * 100000 + i);
}

static int holds(int64_t step)
{
    for (int i = 0; i < NEL; i++)
        if (buf[i] != (float)(step * 100000 + i))
            return 0;
    return 1;
}

/* The whole tensor, or rank's rows of it out of n. */
static dcp_state *make_part(int rank, int n)
{
    dcp_state *st = NULL;
    int64_t shape[1] = {NEL}, off[1], size[1];
    off[0] = (int64_t)rank * (NEL / n);
    size[0] = rank == n - 1 ? NEL - off[0] : NEL / n;
    if (dcp_state_create(&st) ||
        dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, off, size,
                             buf + off[0], DCP_MEM_HOST))
        abort();
    return st;
}

static dcp_state *make_state(void)
{
    return make_part(0, 1);
}

static dcp_manager_options mopts(int async)
{
    dcp_manager_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.interval = 2;
    o.keep_last = 2;
    o.async = async;
    o.save_opts = &durable;
    return o;
}

/* root with committed step-2 and step-4. */
static void prepare(void)
{
    char cmd[600], p[600];
    dcp_ctx *ctx = NULL;
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0 || mkdir(root, 0755) != 0 ||
        dcp_ctx_create(&ctx, NULL, NULL))
        abort();
    for (int64_t s = 2; s <= 4; s += 2) {
        dcp_state *st = make_state();
        fill(s);
        snprintf(p, sizeof p, "%s/step-%d", root, (int)s);
        if (dcp_save(ctx, st, p, &durable))
            abort();
        dcp_state_free(st);
    }
    dcp_ctx_free(ctx);
}

static uint64_t remove_crash_at;
static void on_remove(const char *what, void *arg)
{
    (void)what;
    (void)arg;
    if (++me->nremove == remove_crash_at)
        raise(SIGKILL);
}

struct job {
    int async;
    int mode; /* 0: storage operation k; 1: removal change k */
    int victim;
    uint64_t k; /* 0: no crash */
};

/* One rank: a manager saves step-6 (and retention runs on rank 0); the
 * victim is killed at its storage operation k (mode 0) or removal change
 * k (mode 1). */
static int rank_main(int rank, dcp_comm *comm, void *arg)
{
    const struct job *j = arg;
    struct faultfs ff;
    dcp_ctx_options o = {0};
    dcp_ctx *ctx = NULL;
    dcp_manager *m = NULL;
    me = &sh[rank];
    signal(SIGPIPE, SIG_IGN);
    ff_init(&ff);
    if (rank == j->victim && j->mode == 0)
        ff.crash_at = j->k;
    remove_crash_at = rank == j->victim && j->mode == 1 ? j->k : 0;
    dcp__mgr_set_remove_hook(on_remove, NULL);
    o.struct_size = sizeof o;
    o.storage = ff_ops();
    o.storage_impl = &ff;
    if (dcp_ctx_create(&ctx, comm, &o))
        return 101;
    dcp_manager_options mo = mopts(j->async);
    int rc = dcp_manager_create(&m, ctx, root, &mo);
    fill(6);
    dcp_state *st = make_part(rank, dcp_ctx_size(ctx));
    if (rc == DCP_OK)
        rc = dcp_manager_save(m, st, 6);
    if (rc == DCP_OK && j->async) {
        memset(buf, 0x5a, sizeof buf);
        dcp_state_free(st);
        st = NULL;
        rc = dcp_manager_wait(m);
    }
    me->rc = rc;
    me->nops = ff.nops;
    me->done = 1;
    dcp_state_free(st);
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
    ff_release(&ff);
    return 0;
}

/* Runs the job on n forked ranks; the victim's wait status in *vst.
 * Returns 0, or -1 when a rank hung (all are killed). */
static int run_ranks(struct job *j, int n, int *vst)
{
    pid_t pids[FC_MAX];
    int left = n, st;
    time_t t0 = time(NULL);
    memset(sh, 0, FC_MAX * sizeof *sh);
    if (fc_spawn(n, rank_main, j, pids))
        abort();
    while (left) {
        pid_t p = waitpid(-1, &st, WNOHANG);
        if (p > 0) {
            if (p == pids[j->victim])
                *vst = st;
            left--;
            continue;
        }
        if (time(NULL) - t0 > 30) {
            for (int r = 0; r < n; r++)
                kill(pids[r], SIGKILL);
            while (waitpid(-1, NULL, 0) > 0)
                ;
            return -1;
        }
        (void)usleep(1000);
    }
    return 0;
}

/* (a) to (d) after a kill; a message and 1 on a violation. */
static int check(const char *what)
{
    dcp_ctx *ctx = NULL;
    dcp_manager *m = NULL;
    dcp_manager_entry *e = NULL;
    size_t n = 0;
    int complete[9] = {0}, bad = 0;
    char p[600];
    if (dcp_ctx_create(&ctx, NULL, NULL))
        abort();
    if (dcp_manager_list(ctx, root, NULL, &e, &n)) {
        fprintf(stderr, "%s: list: %s\n", what, dcp_errmsg(ctx));
        bad = 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (e[i].status != DCP_MANAGER_COMPLETE)
            continue;
        if (e[i].step < 0 || e[i].step > 8) {
            fprintf(stderr, "%s: unexpected step %d\n", what, (int)e[i].step);
            bad = 1;
            continue;
        }
        complete[e[i].step] = 1;
        /* (a) */
        dcp_state *st = make_state();
        memset(buf, 0, sizeof buf);
        snprintf(p, sizeof p, "%s/%s", root, e[i].name);
        int rc = dcp_load(ctx, st, p, NULL);
        dcp_state_free(st);
        if (rc || !holds(e[i].step)) {
            fprintf(stderr, "%s: complete %s does not load bit-exact: %s\n",
                    what, e[i].name, rc ? dcp_errmsg(ctx) : "data differ");
            bad = 1;
        }
    }
    dcp_manager_list_free(e, n);
    /* (b) */
    if (!complete[4] || (!complete[2] && !complete[6])) {
        fprintf(stderr, "%s: committed lost: step-2 %d step-4 %d step-6 %d\n",
                what, complete[2], complete[4], complete[6]);
        bad = 1;
    }
    /* (c) */
    dcp_manager_options mo = mopts(0);
    int64_t step = -1;
    dcp_state *st = make_state();
    memset(buf, 0, sizeof buf);
    if (dcp_manager_create(&m, ctx, root, &mo) ||
        dcp_manager_load_latest(m, st, &step, NULL) ||
        step != (complete[6] ? 6 : 4) || !holds(step)) {
        fprintf(stderr, "%s: latest %d: %s\n", what, (int)step,
                dcp_errmsg(ctx));
        bad = 1;
    }
    /* (d) */
    fill(8);
    if (m && (dcp_manager_save(m, st, 8) || dcp_manager_latest(m, &step) ||
              step != 8)) {
        fprintf(stderr, "%s: save over the debris: %s\n", what,
                dcp_errmsg(ctx));
        bad = 1;
    }
    memset(buf, 0, sizeof buf);
    if (m && (dcp_manager_load_latest(m, st, &step, NULL) || !holds(8))) {
        fprintf(stderr, "%s: step-8 does not load: %s\n", what,
                dcp_errmsg(ctx));
        bad = 1;
    }
    dcp_state_free(st);
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
    return bad;
}

/* One series on n ranks: every (or every third) crash point of mode on
 * the victim. */
static void series(int n, int victim, int async, int mode)
{
    struct job j = {async, mode, victim, 0};
    int st = -1;
    prepare();
    ASSERT_EQ(run_ranks(&j, n, &st), 0);
    for (int r = 0; r < n; r++) {
        ASSERT(sh[r].done);
        ASSERT_OK(sh[r].rc);
    }
    uint64_t count = mode == 0 ? sh[victim].nops : sh[victim].nremove;
    ASSERT(count >= 3);
    ASSERT(!check(async ? "no crash (async)" : "no crash"));
    printf("%d rank%s, victim %d, %s, %s: %llu crash points%s\n", n,
           n > 1 ? "s" : "", victim, async ? "async" : "sync",
           mode == 0 ? "storage operations of the save and retention"
                     : "changes of retention's removal",
           (unsigned long long)count, full ? "" : " (every third run)");
    for (uint64_t k = 1; k <= count; k++) {
        if (!full && k % 3 != 1 && k != count)
            continue;
        char what[160];
        snprintf(what, sizeof what, "%d ranks, victim %d, %s, %s %llu of %llu",
                 n, victim, async ? "async" : "sync",
                 mode == 0 ? "storage op" : "removal change",
                 (unsigned long long)k, (unsigned long long)count);
        prepare();
        j.k = k;
        st = -1;
        if (run_ranks(&j, n, &st) != 0)
            FAIL_AT_("%s: a rank hung", what);
        if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
            FAIL_AT_("%s: the victim was not killed (status %d)", what, st);
        npoints++;
        if (check(what))
            FAIL_AT_("%s: invariant violated", what);
    }
}

TEST(save_sync)
{
    series(1, 0, 0, 0);
}
TEST(save_async)
{
    series(1, 0, 1, 0);
}
TEST(prune_sync)
{
    series(1, 0, 0, 1);
}
TEST(prune_async)
{
    series(1, 0, 1, 1);
}
/* Three forked ranks joined by sockets (forkcomm.h): the others see the
 * victim vanish. Retention runs on rank 0 only. */
TEST(three_ranks_save)
{
    series(3, 0, 0, 0);
    series(3, 2, 1, 0);
}
TEST(three_ranks_prune)
{
    series(3, 0, 0, 1);
}

int main(int argc, char **argv)
{
    char base[] = "/tmp/dcp-mgr-crash-XXXXXX";
    full = argc > 1 && !strcmp(argv[1], "--full");
    sh = mmap(NULL, FC_MAX * sizeof *sh, PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED || !mkdtemp(base))
        abort();
    snprintf(root, sizeof root, "%s/root", base);
    RUN(save_sync);
    RUN(save_async);
    RUN(prune_sync);
    RUN(prune_async);
    RUN(three_ranks_save);
    RUN(three_ranks_prune);
    printf("manager crash points: %ld run%s\n", npoints,
           full ? "" : " (every third; --full for all)");
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", base);
    return TEST_SUMMARY();
}
