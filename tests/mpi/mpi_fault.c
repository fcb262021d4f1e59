/*
 * Storage faults under MPI, through the fault-injecting back end
 * (tests/fault/faultfs.h) on one rank at a time.
 *   mpi_fault errors   every operation of a save over a committed
 *                      checkpoint fails (DCP_EIO, DCP_ENOSPC, transient;
 *                      DCP_EIO persistent; no ENOSPC under ASan, for
 *                      time) on rank 0, then on the last
 *                      rank: every rank returns the same code and
 *                      message naming the failing rank, nothing is
 *                      committed (the old checkpoint loads bit-exact), no
 *                      handle leaks; also every operation of a load,
 *                      and every allocation of a save failing on the
 *                      last rank.
 *                      A rank-local save (DCP_SAVE_RANK_LOCAL) with
 *                      every operation failing once on rank 0, then on
 *                      the last rank: the same code and message
 *                      everywhere, and a failed save leaves no rank's
 *                      __<r>.metadata nor data file (each rank removes
 *                      its own), a successful one loads bit-exact.
 *   mpi_fault trace    the commit protocol over all ranks: every rank's
 *                      trace, merged by CLOCK_MONOTONIC time on rank 0,
 *                      checked with tests/fault/commit_rules.h.
 *   mpi_fault count DIR VICTIM
 *                      saves into DIR (prepared by test_crash prepare)
 *                      cleanly and prints the victim's number
 *                      of operations and how many come before the commit
 *                      rename, for the crash driver (mpi_crash.sh).
 *   mpi_fault crash DIR VICTIM K
 *                      saves, the victim killing itself (SIGKILL) before
 *                      its K-th storage operation; mpiexec ends the job.
 *                      Each rank whose save returns writes DIR.done.RANK.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>
#include <dcp/dcp_storage.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commit_rules.h"
#include "faultfs.h"
#include "mpitest.h"
#include "refstate.h"
#include "storage.h"

static dcp_comm *comm;
static char root[256];
static struct faultfs ff;
static long ncases;

static const char *sub(const char *name)
{
    static char buf[400];
    snprintf(buf, sizeof(buf), "%s/%s", root, name);
    return buf;
}

/* A context on the world communicator using faultfs. */
static dcp_ctx *fault_ctx(void)
{
    dcp_ctx_options o = {0};
    dcp_ctx *ctx;
    o.struct_size = sizeof(o);
    o.storage = ff_ops();
    o.storage_impl = &ff;
    if (dcp_ctx_create(&ctx, comm, &o))
        MPI_Abort(MPI_COMM_WORLD, 3);
    return ctx;
}

/* Rank 0 (re)creates dir holding the old checkpoint (kind 1: plain names,
 * 2: tagged names, 0: nothing). */
static void prepare(const char *dir, int kind)
{
    if (mt_rank == 0) {
        rs_rmtree(dir);
        if (kind == 2 && rs_save(dir, RS_SEED_NEW, 0))
            MPI_Abort(MPI_COMM_WORLD, 4);
        if (kind >= 1 && rs_save(dir, RS_SEED_OLD, 0))
            MPI_Abort(MPI_COMM_WORLD, 4);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static int collective_save_opts(dcp_ctx *ctx, const char *dir,
                                const dcp_save_options *so)
{
    struct refstate r;
    int rc;
    if (rs_build_part(&r, RS_SEED_NEW, mt_rank, mt_size))
        MPI_Abort(MPI_COMM_WORLD, 5);
    rc = dcp_save(ctx, r.st, dir, so);
    rs_free(&r);
    return rc;
}

static int collective_save(dcp_ctx *ctx, const char *dir)
{
    return collective_save_opts(ctx, dir, NULL);
}

/* Names starting with "__" in dir (a rank-local checkpoint's files);
 * with mdonly, those ending in ".metadata". */
static int count_rank_files_of(const char *dir, int mdonly)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    while (d && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        n += !strncmp(de->d_name, "__", 2) &&
             (!mdonly ||
              (len > 9 && !strcmp(de->d_name + len - 9, ".metadata")));
    }
    if (d)
        closedir(d);
    return n;
}

static int count_rank_files(const char *dir)
{
    return count_rank_files_of(dir, 0);
}

/* A rank-local save with every operation failing once on rank 0, then
 * on the last rank. */
static void test_ranklocal_errors(void)
{
    const char *dir = sub("rlerrors");
    dcp_save_options so;
    int victims[2] = {0, mt_size - 1}, v;
    memset(&so, 0, sizeof(so));
    so.struct_size = sizeof(so);
    so.flags = DCP_SAVE_RANK_LOCAL;
    for (v = 0; v < (mt_size > 1 ? 2 : 1); v++) {
        int victim = victims[v];
        uint64_t m, k;
        dcp_ctx *ctx = fault_ctx();
        prepare(dir, 0);
        ff_reset(&ff);
        CHECK_OK(ctx, collective_save_opts(ctx, dir, &so));
        m = ff.nops;
        MPI_Bcast(&m, 1, MPI_UINT64_T, victim, MPI_COMM_WORLD);
        dcp_ctx_free(ctx);
        CHECK(m >= 5);
        for (k = 1; k <= m; k++) {
            int rc, got;
            ctx = fault_ctx();
            prepare(dir, 0);
            ff_reset(&ff);
            if (mt_rank == victim) {
                ff.fail_at = k;
                ff.fail_code = DCP_EIO;
            }
            rc = collective_save_opts(ctx, dir, &so);
            ncases++;
            CHECK(mt_same(rc));
            CHECK(mt_same_str(dcp_errmsg(ctx)));
            if (rc != DCP_OK && rc != DCP_EIO) {
                fprintf(stderr,
                        "[rank %d] rank-local: victim %d op %llu: %s (%s)\n",
                        mt_rank, victim, (unsigned long long)k,
                        dcp_err_name(rc), dcp_errmsg(ctx));
                mt_fail++;
            }
            CHECK(dcp__fs_open_handles() == 0);
            MPI_Barrier(MPI_COMM_WORLD);
            if (mt_rank == 0) {
                got = rs_check(dir, NULL, 0);
                if (rc == DCP_OK ? got != RS_SEED_NEW
                                 : got != DCP_ENOENT ||
                                       count_rank_files(dir) != 0) {
                    fprintf(stderr,
                            "rank-local: victim %d op %llu: rc %s, load "
                            "gives %d, %d rank files (%s)\n",
                            victim, (unsigned long long)k, dcp_err_name(rc),
                            got, count_rank_files(dir), dcp_errmsg(ctx));
                    mt_fail++;
                }
            }
            dcp_ctx_free(ctx);
        }
        /* Persistent: every operation from the k-th on fails, the
         * removals too. A rank whose __<r>.metadata was renamed and
         * cannot be removed is named on every rank; no other rank's is
         * left. (Failing from the directory fsync after its rename on,
         * the victim is named at least once.) */
        int nnamed = 0;
        for (k = 1; k <= m && !RS_SANITIZED; k++) {
            int rc, left, named;
            char want[96];
            ctx = fault_ctx();
            prepare(dir, 0);
            ff_reset(&ff);
            if (mt_rank == victim) {
                ff.fail_at = k;
                ff.fail_code = DCP_EIO;
                ff.fail_persistent = 1;
            }
            rc = collective_save_opts(ctx, dir, &so);
            ncases++;
            CHECK(mt_same(rc));
            CHECK(mt_same_str(dcp_errmsg(ctx)));
            CHECK(rc == DCP_OK || rc == DCP_EIO);
            MPI_Barrier(MPI_COMM_WORLD);
            snprintf(want, sizeof(want),
                     "rank %d could not remove its committed __%d.metadata",
                     victim, victim);
            named = strstr(dcp_errmsg(ctx), want) != NULL;
            nnamed += named;
            left = count_rank_files_of(dir, 1);
            /* __0.metadata is published last and removed first: when rank
             * 0 cannot remove it, every rank keeps its file (the
             * checkpoint stays whole, never some ranks' items only). */
            if (mt_rank == 0 && rc != DCP_OK &&
                left != (named ? (victim == 0 ? mt_size : 1) : 0)) {
                fprintf(stderr,
                        "rank-local persistent: victim %d op %llu: %d "
                        "metadata left (%s)\n",
                        victim, (unsigned long long)k, left,
                        dcp_errmsg(ctx));
                mt_fail++;
            }
            dcp_ctx_free(ctx);
        }
        CHECK(RS_SANITIZED || nnamed >= 1);
    }
}

/* The victim's operation count of a clean save, on every rank. */
static uint64_t clean_ops(const char *dir, int victim)
{
    dcp_ctx *ctx = fault_ctx();
    uint64_t n;
    prepare(dir, 1);
    ff_reset(&ff);
    CHECK_OK(ctx, collective_save(ctx, dir));
    n = ff.nops;
    MPI_Bcast(&n, 1, MPI_UINT64_T, victim, MPI_COMM_WORLD);
    dcp_ctx_free(ctx);
    return n;
}

static void test_save_errors(void)
{
    static const int codes[3] = {DCP_EIO, DCP_ENOSPC, DCP_EIO};
    const char *dir = sub("errors");
    int victims[2] = {0, mt_size - 1}, v, c;
    for (v = 0; v < (mt_size > 1 ? 2 : 1); v++) {
        int victim = victims[v];
        uint64_t m = clean_ops(dir, victim), k;
        CHECK(m >= 5);
        for (c = 0; c < 3; c++)
            for (k = 1; k <= m && !(RS_SANITIZED && c == 1); k++) {
                dcp_ctx *ctx = fault_ctx();
                char want[64];
                int rc, got = 0, after;
                prepare(dir, 1);
                ff_reset(&ff);
                if (mt_rank == victim) {
                    ff.fail_at = k;
                    ff.fail_code = codes[c];
                    ff.fail_persistent = c == 2;
                }
                rc = collective_save(ctx, dir);
                ncases++;
                CHECK(mt_same(rc));
                CHECK(mt_same_str(dcp_errmsg(ctx)));
                if (rc != 0 && rc != codes[c]) {
                    fprintf(stderr, "[rank %d] victim %d op %llu: %s (%s)\n",
                            mt_rank, victim, (unsigned long long)k,
                            dcp_err_name(rc), dcp_errmsg(ctx));
                    mt_fail++;
                }
                snprintf(want, sizeof(want), "rank %d failed", victim);
                if (rc != 0 && mt_size > 1)
                    CHECK_MSG(ctx, want);
                CHECK(dcp__fs_open_handles() == 0);
                after = strstr(dcp_errmsg(ctx), "after .metadata was") != 0;
                if (mt_rank == 0) {
                    got = rs_check(dir, NULL, 0);
                    if (got != (rc == 0 || after ? RS_SEED_NEW : RS_SEED_OLD)) {
                        fprintf(stderr,
                                "victim %d op %llu %s: rc %s, load gives "
                                "%d\n",
                                victim, (unsigned long long)k,
                                dcp_err_name(codes[c]), dcp_err_name(rc), got);
                        mt_fail++;
                    }
                }
                dcp_ctx_free(ctx);
            }
    }
}

/* An allocation failing on the last rank, at every allocation of its
 * save (transient): every rank returns the same result, DCP_ENOMEM or
 * success, and a failed save commits nothing. */
static void test_alloc_errors(void)
{
    const char *dir = sub("alloc");
    int victim = mt_size - 1;
    uint64_t n = 0, k;
    dcp_ctx *ctx;
    if (mt_rank == 0)
        rs_rmtree(dir);
    prepare(dir, 1);
    ctx = fault_ctx();
    ff_reset(&ff);
    (void)dcp__alloc_fail_after(0);
    CHECK_OK(ctx, collective_save(ctx, dir));
    n = dcp__alloc_fail_after(0);
    MPI_Bcast(&n, 1, MPI_UINT64_T, victim, MPI_COMM_WORLD);
    dcp_ctx_free(ctx);
    for (k = 1; k <= n; k++) {
        struct refstate r;
        int rc, got;
        ctx = fault_ctx();
        prepare(dir, 1);
        if (rs_build_part(&r, RS_SEED_NEW, mt_rank, mt_size))
            MPI_Abort(MPI_COMM_WORLD, 5);
        if (mt_rank == victim)
            (void)dcp__alloc_fail_once(k);
        rc = dcp_save(ctx, r.st, dir, NULL);
        (void)dcp__alloc_fail_after(0);
        ncases++;
        CHECK(mt_same(rc));
        CHECK(mt_same_str(dcp_errmsg(ctx)));
        CHECK(rc == 0 || rc == DCP_ENOMEM);
        CHECK(dcp__fs_open_handles() == 0);
        if (mt_rank == 0) {
            got = rs_check(dir, NULL, 0);
            if (got != (rc == 0 ? RS_SEED_NEW : RS_SEED_OLD)) {
                fprintf(stderr, "alloc %llu: rc %s, load gives %d\n",
                        (unsigned long long)k, dcp_err_name(rc), got);
                mt_fail++;
            }
        }
        rs_free(&r);
        dcp_ctx_free(ctx);
    }
}

static void test_load_errors(void)
{
    const char *dir = sub("load");
    int victim = mt_size - 1, pers;
    uint64_t m, k;
    dcp_ctx *ctx = fault_ctx();
    struct refstate r, o;
    prepare(dir, 1);
    if (rs_build_part(&r, 0, mt_rank, mt_size) ||
        rs_build_part(&o, RS_SEED_OLD, mt_rank, mt_size))
        MPI_Abort(MPI_COMM_WORLD, 6);
    ff_reset(&ff);
    CHECK_OK(ctx, dcp_load(ctx, r.st, dir, NULL));
    m = ff.nops;
    MPI_Bcast(&m, 1, MPI_UINT64_T, victim, MPI_COMM_WORLD);
    for (pers = 0; pers < 2; pers++)
        for (k = 1; k <= m; k++) {
            int rc;
            ff_reset(&ff);
            if (mt_rank == victim) {
                ff.fail_at = k;
                ff.fail_code = DCP_EIO;
                ff.fail_persistent = pers;
            }
            rc = dcp_load(ctx, r.st, dir, NULL);
            ncases++;
            CHECK(mt_same(rc));
            CHECK(mt_same_str(dcp_errmsg(ctx)));
            CHECK(rc == 0 || rc == DCP_EIO);
            CHECK(dcp__fs_open_handles() == 0);
        }
    rs_free(&r);
    rs_free(&o);
    dcp_ctx_free(ctx);
}

/* Gathers every rank's trace on rank 0, merged by time. */
static struct ff_event *merged_trace(size_t *n)
{
    int cnt = (int)ff.ntrace * (int)sizeof(struct ff_event), *cnts = NULL,
        *displs = NULL, r, total = 0;
    struct ff_event *all = NULL;
    if (mt_rank == 0) {
        cnts = calloc((size_t)mt_size, sizeof(int));
        displs = calloc((size_t)mt_size, sizeof(int));
    }
    MPI_Gather(&cnt, 1, MPI_INT, cnts, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (mt_rank == 0) {
        for (r = 0; r < mt_size; r++) {
            displs[r] = total;
            total += cnts[r];
        }
        all = malloc((size_t)total + 1);
    }
    MPI_Gatherv(ff.trace, cnt, MPI_BYTE, all, cnts, displs, MPI_BYTE, 0,
                MPI_COMM_WORLD);
    free(cnts);
    free(displs);
    *n = (size_t)total / sizeof(struct ff_event);
    if (mt_rank == 0) {
        /* Insertion sort by time: traces are short. */
        size_t i, j;
        for (i = 1; i < *n; i++) {
            struct ff_event e = all[i];
            for (j = i; j > 0 && all[j - 1].t_ns > e.t_ns; j--)
                all[j] = all[j - 1];
            all[j] = e;
        }
    }
    return all;
}

static void test_trace(void)
{
    const char *dir = sub("trace");
    int kind;
    for (kind = 0; kind < 3; kind++) {
        dcp_ctx *ctx = fault_ctx();
        char old[1024] = "", why[512];
        struct ff_event *all;
        size_t n;
        prepare(dir, kind);
        if (mt_rank == 0)
            CHECK(rs_files(dir, old, sizeof(old)) == 0);
        ff_reset(&ff);
        ff.tracing = 1;
        CHECK_OK(ctx, collective_save(ctx, dir));
        ff.tracing = 0;
        all = merged_trace(&n);
        if (mt_rank == 0) {
            const char *bad = cr_check(all, n, old, why, sizeof(why));
            if (bad) {
                fprintf(stderr, "trace kind %d: %s\n", kind, bad);
                mt_fail++;
            }
            CHECK(rs_check(dir, NULL, 0) == RS_SEED_NEW);
        }
        free(all);
        dcp_ctx_free(ctx);
    }
}

int main(int argc, char **argv)
{
    int rc;
    mt_init(&argc, &argv);
    ff_init(&ff);
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD))
        MPI_Abort(MPI_COMM_WORLD, 2);
    if (argc >= 4 && !strcmp(argv[1], "count")) {
        /* The victim's ops and how many precede the commit rename. */
        int victim = atoi(argv[3]);
        dcp_ctx *ctx = fault_ctx();
        struct ff_event *all;
        size_t n, i;
        uint64_t before = 0, nops;
        ff.tracing = 1;
        rc = collective_save(ctx, argv[2]);
        ff.tracing = 0;
        nops = ff.nops;
        MPI_Bcast(&nops, 1, MPI_UINT64_T, victim, MPI_COMM_WORLD);
        /* The victim's ops up to the rename (on rank 0: the rename
         * included): a crash before any later op comes after the commit. */
        {
            int64_t t_rename = INT64_MAX;
            for (i = 0; mt_rank == 0 && i < ff.ntrace; i++)
                if (ff.trace[i].op == FF_RENAME)
                    t_rename = ff.trace[i].t_ns;
            MPI_Bcast(&t_rename, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
            for (i = 0; mt_rank == victim && i < ff.ntrace; i++)
                before += ff.trace[i].t_ns <= t_rename;
            MPI_Bcast(&before, 1, MPI_UINT64_T, victim, MPI_COMM_WORLD);
        }
        all = merged_trace(&n);
        free(all);
        if (mt_rank == 0)
            printf("ops %llu commit_after %llu rc %d\n",
                   (unsigned long long)nops, (unsigned long long)before, rc);
        dcp_ctx_free(ctx);
        dcp_comm_free(comm);
        ff_release(&ff);
        MPI_Finalize();
        return rc ? 1 : 0;
    }
    if (argc >= 5 && !strcmp(argv[1], "crash")) {
        dcp_ctx *ctx = fault_ctx();
        char mark[600];
        FILE *f;
        if (mt_rank == atoi(argv[3]))
            ff.crash_at = (uint64_t)atoll(argv[4]);
        rc = collective_save(ctx, argv[2]);
        /* DIR.done.RANK: this rank's save returned (mpi_crash.sh tells a
         * rank that hangs from an mpiexec that does not notice the
         * victim's death). */
        (void)snprintf(mark, sizeof(mark), "%s.done.%d", argv[2], mt_rank);
        f = fopen(mark, "w");
        if (f) {
            fprintf(f, "%d\n", rc);
            fclose(f);
        }
        dcp_ctx_free(ctx);
        dcp_comm_free(comm);
        ff_release(&ff);
        MPI_Finalize();
        return rc ? 1 : 0;
    }
    mt_tmpdir(root, sizeof(root), "fault");
    if (argc >= 2 && !strcmp(argv[1], "trace")) {
        RUN(trace);
    } else {
        RUN(save_errors);
        RUN(load_errors);
        RUN(alloc_errors);
        RUN(ranklocal_errors);
        if (mt_rank == 0)
            printf("fault cases: %ld run (%d ranks)\n", ncases, mt_size);
    }
    if (mt_rank == 0)
        rs_rmtree(root);
    ff_release(&ff);
    dcp_comm_free(comm);
    return mt_finish();
}
