/*
 * dcp_comm_mpi_set_timeout: a rank that stops answering, in each phase of
 * a save and a load. Run on 3 ranks: all save checkpoint A (refstate.h,
 * seed "old"); then, on a communicator with a 1 s timeout, the ranks save
 * the "new" state over A (or load A) while one rank, the victim, hangs at
 * the point the phase names: it never calls dcp, or it sleeps forever
 * before one storage operation (tests/fault/faultfs.h hang_mask), on the
 * caller's thread or on dcp's writer thread.
 *   mpi_timeout DIR PHASE       (PHASE from the table below; "list")
 * Every survivor must return DCP_ETIMEOUT, after the timeout and within a
 * few seconds, with "timed out" in the message; a later call on the broken
 * communicator must fail at once; nothing of the new save may be
 * committed: A loads bit-exact as the old state (a fresh single-process
 * context on the lowest survivor). MPI cannot cancel the pending
 * collectives, so the test ends the job the documented way: the lowest
 * survivor collects the verdicts over a communicator without the victim
 * and calls MPI_Abort with 0 when every check passed (1 otherwise).
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "faultfs.h"
#include "refstate.h"

static int rank, fails;

#define CHECK(c)                                                         \
    do {                                                                 \
        if (!(c)) {                                                      \
            fprintf(stderr, "[rank %d] %s:%d: check failed: %s\n", rank, \
                    __FILE__, __LINE__, #c);                             \
            fails++;                                                     \
        }                                                                \
    } while (0)

enum action { SAVE, SAVE_ASYNC, LOAD };

static const struct phase {
    const char *name;
    enum action act;
    int victim;
    int absent;      /* the victim never calls dcp */
    unsigned hang;   /* else it hangs before this operation (bit mask) */
    const char *obj; /* ... on a name containing this (NULL: any) */
    const char *what;
    const char *msg; /* the survivors' message says this too */
} phases[] = {
    {"save-absent", SAVE, 2, 1, 0, NULL,
     "rank 2 never calls dcp_save (the plan agreement waits)",
     "nothing committed"},
    {"save-plan", SAVE, 0, 0, 1u << FF_MKDIRS, NULL,
     "rank 0 hangs creating the directory, after gathering the plans "
     "(planning)",
     "nothing committed"},
    {"save-write", SAVE, 1, 0, 1u << FF_WRITE, ".distcp",
     "rank 1's writer thread hangs in its first data write",
     "nothing committed"},
    {"save-fsync", SAVE, 0, 0, 1u << FF_SYNC, ".distcp",
     "rank 0's writer thread hangs in the fsync of its data file",
     "nothing committed"},
    {"save-close", SAVE, 2, 0, 1u << FF_CLOSE, ".distcp",
     "rank 2 hangs closing its data file, written and synced (before the "
     "commit agreement)",
     "nothing committed"},
    {"save-commit", SAVE, 0, 0, 1u << FF_SYNC, ".metadata.",
     "rank 0 hangs in the fsync of the metadata's temporary, every rank's data "
     "durable (commit, before the rename)",
     "rank 0 did not say whether it committed"},
    {"save-async", SAVE_ASYNC, 1, 0, 1u << FF_WRITE, ".distcp",
     "dcp_save_async with a staging budget: rank 1's writer hangs while its "
     "caller stages; the others time out in dcp_request_wait",
     "nothing committed"},
    {"load-absent", LOAD, 2, 1, 0, NULL, "rank 2 never calls dcp_load",
     "timed out"},
    {"load-metadata", LOAD, 0, 0, 1u << FF_OPEN_READ, ".metadata",
     "rank 0 hangs opening .metadata (before the metadata broadcast)",
     "timed out"},
    {"load-data", LOAD, 1, 0, 1u << FF_READ, ".distcp",
     "rank 1 hangs reading a data file (after the metadata broadcast)",
     "timed out"},
    {"load-replicated", LOAD, 1, 0, 1u << FF_READ, ".distcp",
     "every rank loads everything (read once: each chunk read by one rank "
     "and forwarded); rank 1 hangs in its first read, the others wait for "
     "its chunks",
     "timed out"},
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static struct faultfs ff;

/* A context on a fresh MPI communicator with a 1 s timeout, storing
 * through faultfs (armed on the victim only). */
static dcp_ctx *timed_ctx(dcp_comm **c, int async)
{
    dcp_ctx_options o;
    dcp_ctx *x = NULL;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.storage = ff_ops();
    o.storage_impl = &ff;
    if (async)
        o.staging_budget = (uint64_t)64 << 10;
    CHECK(dcp_comm_mpi(c, MPI_COMM_WORLD) == DCP_OK);
    CHECK(dcp_comm_mpi_set_timeout(*c, 1.0) == DCP_OK);
    CHECK(dcp_ctx_create(&x, *c, &o) == DCP_OK);
    if (!x)
        MPI_Abort(MPI_COMM_WORLD, 3);
    return x;
}

/* The phase's call on this rank. */
static int act(const struct phase *p, dcp_ctx *x, const char *dir)
{
    struct refstate r;
    dcp_request *req = NULL;
    int rc;
    /* load-replicated: the whole state on every rank. */
    int whole = !strcmp(p->name, "load-replicated");
    if (rs_build_part(&r, p->act == LOAD ? 0 : RS_SEED_NEW, whole ? 0 : rank,
                      whole ? 1 : 3))
        MPI_Abort(MPI_COMM_WORLD, 4);
    if (p->act == SAVE) {
        rc = dcp_save(x, r.st, dir, NULL);
    } else if (p->act == LOAD) {
        rc = dcp_load(x, r.st, dir, NULL);
    } else {
        rc = dcp_save_async(x, r.st, dir, NULL, &req);
        if (rc == DCP_OK) {
            rs_fill(r.big, sizeof(r.big), 99);
            rc = dcp_request_wait(req);
            dcp_request_free(req);
        }
    }
    rs_free(&r);
    return rc;
}

int main(int argc, char **argv)
{
    const struct phase *p = NULL;
    const char *dir = argc > 2 ? argv[1] : NULL;
    dcp_comm *c0 = NULL, *c1 = NULL;
    dcp_ctx *x0, *x1;
    MPI_Comm surv;
    size_t i;
    int size, rc, leader, all = 0;
    double t0, dt;
    if (argc == 2 && !strcmp(argv[1], "list")) {
        for (i = 0; i < DCP_ARRAY_LEN(phases); i++)
            printf("%-14s victim %d: %s\n", phases[i].name, phases[i].victim,
                   phases[i].what);
        return 0;
    }
    for (i = 0; dir && i < DCP_ARRAY_LEN(phases); i++)
        if (!strcmp(argv[2], phases[i].name))
            p = &phases[i];
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 3 || !p) {
        if (rank == 0)
            fprintf(stderr, "usage: mpiexec -n 3 mpi_timeout DIR PHASE "
                            "(mpi_timeout list)\n");
        MPI_Finalize();
        return 2;
    }
    ff_init(&ff);
    /* 200 KiB of tensors, 67 KiB per rank: above save-async's budget. */
    rs_big_rows = RS_MAX_ROWS;
    leader = p->victim == 0 ? 1 : 0;
    MPI_Comm_split(MPI_COMM_WORLD, rank == p->victim, rank, &surv);
    CHECK(dcp_comm_mpi_set_timeout(NULL, 1.0) == DCP_EINVAL);

    /* Everyone answers: checkpoint A, the old state, under the timeout. */
    if (rank == 0)
        rs_rmtree(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    x0 = timed_ctx(&c0, 0);
    CHECK(dcp_comm_mpi_set_timeout(c0, -1.0) == DCP_EINVAL);
    {
        struct refstate r;
        if (rs_build_part(&r, RS_SEED_OLD, rank, 3))
            MPI_Abort(MPI_COMM_WORLD, 4);
        rc = dcp_save(x0, r.st, dir, NULL);
        if (rc != DCP_OK)
            fprintf(stderr, "[rank %d] save A: %s\n", rank, dcp_errmsg(x0));
        CHECK(rc == DCP_OK);
        rs_free(&r);
    }
    dcp_ctx_free(x0);
    dcp_comm_free(c0);
    MPI_Barrier(MPI_COMM_WORLD);

    /* The phase, with the victim stopping where it says. */
    x1 = timed_ctx(&c1, p->act == SAVE_ASYNC);
    if (rank == p->victim) {
        if (p->absent)
            for (;;)
                (void)sleep(1); /* ended by the leader's MPI_Abort */
        ff.hang_mask = p->hang;
        ff.hang_name = p->obj;
        /* load-replicated: past the reads of the two value records (each
         * read whole in one window), into the chunks it reads for the
         * others, who time out waiting for them (in the exchange's
         * waitany; what they report is the agreement after it, on the
         * broken communicator). */
        if (!strcmp(p->name, "load-replicated"))
            ff.hang_skip = 2;
    }
    t0 = now();
    rc = act(p, x1, dir);
    dt = now() - t0;
    /* Only survivors get here (the victim hangs inside act). */
    fprintf(stderr, "[rank %d] %s, %s: %s after %.2f s: %s\n", rank, p->name,
            p->what, dcp_err_name(rc), dt, dcp_errmsg(x1));
    CHECK(rc == DCP_ETIMEOUT);
    CHECK(dt >= 0.9 && dt < 10.0);
    CHECK(strstr(dcp_errmsg(x1), "timed out") != NULL);
    CHECK(strstr(dcp_errmsg(x1), p->msg) != NULL);
    /* The broken communicator fails at once. */
    t0 = now();
    CHECK(act(p, x1, dir) == DCP_ETIMEOUT);
    CHECK(now() - t0 < 0.5);

    /* Nothing of the new save committed: A loads bit-exact, the old
     * state, in a single process. */
    if (rank == leader) {
        char msg[512];
        int got = rs_check(dir, msg, sizeof(msg));
        if (got != RS_SEED_OLD)
            fprintf(stderr, "[rank %d] %s: A gives %d (%s)\n", rank, p->name,
                    got, got < 0 ? msg : "");
        CHECK(got == RS_SEED_OLD);
    }
    dcp_ctx_free(x1);
    dcp_comm_free(c1);

    /* The verdicts to the leader, over a communicator without the victim. */
    MPI_Reduce(&fails, &all, 1, MPI_INT, MPI_SUM, 0, surv);
    if (rank == leader) {
        printf("%s: %s: %d failures on the survivors\n", all ? "FAIL" : "ok",
               p->name, all);
        printf("%d passed, %d failed\n", all ? 0 : 1, all ? 1 : 0);
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, all ? 1 : 0);
    }
    for (;;)
        (void)sleep(1); /* ended by the leader's MPI_Abort */
}
