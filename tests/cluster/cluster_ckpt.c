/*
 * cluster_ckpt: the MPI program the cluster tests and benchmarks run on the
 * nodes of scripts/cluster/cluster.sh (public headers only).
 *
 *   cluster_ckpt save PATH MIB STEP [TIMEOUT]
 *   cluster_ckpt load PATH MIB STEP shard|readonce|perrank [TIMEOUT]
 *   cluster_ckpt tier-save T0ROOT T1ROOT MIB STEP REPLICAS [TIMEOUT]
 *   cluster_ckpt tier-restore T0ROOT T1ROOT MIB STEP WANT_TIER
 *
 * The state: 8 float32 tensors "layers.K.weight" of 960 rows, MIB MiB in
 * all; element (row, col) of tensor K at step S holds
 * (row * 131 + col * 7 + K * 1009 + S * 7919) mod 2^20, so a load checks
 * every byte and the step it came from. Each rank holds the rows
 * [r * 960 / W, (r + 1) * 960 / W) (shard), or, for readonce / perrank,
 * the whole of every tensor (a replicated load: DCP_LOAD_READ_ONCE or
 * DCP_LOAD_PER_RANK_READS).
 *  - save: dcp_save to PATH (s3://... or a directory);
 *  - load: dcp_load from PATH, every element checked;
 *  - tier-save: dcp_tier_save of STEP (or of steps FIRST-LAST, one after
 *    another in the process) with REPLICAS partner copies, tier 0
 *    in T0ROOT/<hostname> (the node's tmpfs on the cluster: ranks of a
 *    node share it, no other node sees it), tier 1 T1ROOT; the drain and
 *    the replication are waited for (dcp_tier_drain_wait);
 *  - tier-restore: dcp_tier_restore at this world size, resharded; the
 *    step must be STEP, the tier WANT_TIER (-1: any), every element checked.
 * With CLUSTER_CKPT_RUNS=n (2..16; save, load, tier-restore), the
 * operation runs n times in the process (a save's runs after the first
 * into PATH.run1, PATH.run2, ...: fresh paths, as a trainer's steps) and
 * s= is the median of runs 2..n (the first pays the cold start:
 * connections, the plan); min= their minimum.
 * TIMEOUT (seconds, 0: none) bounds each communication step
 * (dcp_comm_mpi_set_timeout). Rank 0 prints one line
 *   ok MODE s=SECONDS mib=MIB ranks=W [tier=T step=S replicated=P]
 * with the slowest rank's time (P: dcp_tier_replicated, the newest step
 * every replica of which landed, -1: none). On a dcp failure every rank
 * prints
 *   rank R: FAIL MODE: ERRNAME: message [replicated=P]
 * and exits 3 at once (after a timeout the communicator is broken); wrong
 * bytes exit 4 (rank-local line "rank R: WRONG ...").
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>
#include <dcp/dcp_tier.h>

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NT   8
#define ROWS 960

static int rank, world;
static dcp_tier *tier_stack; /* tier modes: for fail()'s replicated= */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static float val(int k, int64_t row, int64_t col, int64_t step)
{
    uint64_t v = (uint64_t)row * 131u + (uint64_t)col * 7u +
                 (uint64_t)k * 1009u + (uint64_t)step * 7919u;
    return (float)(v & 0xFFFFFu);
}

static void fail(dcp_ctx *ctx, const char *mode, int rc)
{
    int64_t rep = -1;
    printf("rank %d: FAIL %s: %s: %s", rank, mode, dcp_err_name(rc),
           ctx ? dcp_errmsg(ctx) : "");
    if (tier_stack && dcp_tier_replicated(tier_stack, &rep) == DCP_OK)
        printf(" replicated=%lld", (long long)rep);
    printf("\n");
    fflush(stdout);
    fflush(stderr);
    _exit(3);
}

struct box {
    int64_t r0, nrows, cols;
    float *buf[NT];
};

/* The rows this rank holds: its shard, or all of them. */
static void box_make(struct box *b, size_t mib, int whole)
{
    b->cols = (int64_t)((mib << 20) / NT / 4 / ROWS);
    if (b->cols < 1)
        b->cols = 1;
    b->r0 = whole ? 0 : (int64_t)rank * ROWS / world;
    b->nrows = whole ? ROWS : (int64_t)(rank + 1) * ROWS / world - b->r0;
    for (int k = 0; k < NT; k++) {
        size_t n = (size_t)(b->nrows * b->cols);
        b->buf[k] = malloc(n ? n * 4 : 4);
        if (!b->buf[k]) {
            fprintf(stderr, "rank %d: out of memory\n", rank);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
}

static void box_fill(struct box *b, int64_t step)
{
    for (int k = 0; k < NT; k++)
        for (int64_t r = 0; r < b->nrows; r++)
            for (int64_t c = 0; c < b->cols; c++)
                b->buf[k][r * b->cols + c] = val(k, b->r0 + r, c, step);
}

static void box_clear(struct box *b)
{
    for (int k = 0; k < NT; k++)
        memset(b->buf[k], 0xAB, (size_t)(b->nrows * b->cols) * 4);
}

static int box_check(const struct box *b, int64_t step)
{
    for (int k = 0; k < NT; k++)
        for (int64_t r = 0; r < b->nrows; r++)
            for (int64_t c = 0; c < b->cols; c++)
                if (b->buf[k][r * b->cols + c] != val(k, b->r0 + r, c, step)) {
                    printf("rank %d: WRONG tensor %d row %lld col %lld: %g, "
                           "step %lld wants %g\n",
                           rank, k, (long long)(b->r0 + r), (long long)c,
                           (double)b->buf[k][r * b->cols + c], (long long)step,
                           (double)val(k, b->r0 + r, c, step));
                    return -1;
                }
    return 0;
}

static dcp_state *box_state(struct box *b)
{
    dcp_state *st = NULL;
    if (dcp_state_create(&st) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    for (int k = 0; k < NT; k++) {
        char name[64];
        int64_t shape[2] = {ROWS, b->cols};
        int64_t off[2] = {b->r0, 0}, sz[2] = {b->nrows, b->cols};
        snprintf(name, sizeof name, "layers.%d.weight", k);
        if (dcp_state_add_tensor(st, name, DCP_F32, 2, shape, off, sz,
                                 b->buf[k], DCP_MEM_HOST) != DCP_OK)
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    return st;
}

static double slowest(double t)
{
    double m = 0;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

static int usage(void)
{
    if (rank == 0)
        fprintf(stderr,
                "usage: cluster_ckpt save PATH MIB STEP [TIMEOUT]\n"
                "       cluster_ckpt load PATH MIB STEP "
                "shard|readonce|perrank [TIMEOUT]\n"
                "       cluster_ckpt tier-save T0ROOT T1ROOT MIB STEP "
                "REPLICAS [TIMEOUT]\n"
                "       cluster_ckpt tier-restore T0ROOT T1ROOT MIB STEP "
                "WANT_TIER\n");
    MPI_Finalize();
    return 2;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc < 5)
        return usage();
    const char *mode = argv[1];
    int tier_mode = !strncmp(mode, "tier-", 5);
    if (tier_mode && argc != 7 && !(argc == 8 && !strcmp(mode, "tier-save")))
        return usage();
    size_t mib = (size_t)atol(argv[tier_mode ? 4 : 3]);
    int64_t step = atoll(argv[tier_mode ? 5 : 4]), first = step;
    const char *dash = strchr(argv[tier_mode ? 5 : 4], '-');
    if (dash && !strcmp(mode, "tier-save")) { /* FIRST-LAST */
        step = atoll(dash + 1);
        if (step < first)
            return usage();
    }
    const char *how = "shard";
    double tmo = 0;
    if (!strcmp(mode, "save")) {
        tmo = argc > 5 ? atof(argv[5]) : 0;
    } else if (!strcmp(mode, "load")) {
        if (argc < 6)
            return usage();
        how = argv[5];
        tmo = argc > 6 ? atof(argv[6]) : 0;
        if (strcmp(how, "shard") && strcmp(how, "readonce") &&
            strcmp(how, "perrank"))
            return usage();
    } else if (!tier_mode) {
        return usage();
    } else if (argc == 8) {
        tmo = atof(argv[7]);
    }
    if (mib < 1)
        return usage();

    dcp_comm *comm = NULL;
    dcp_ctx *ctx = NULL;
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    if (tmo > 0 && dcp_comm_mpi_set_timeout(comm, tmo) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    int rc = dcp_ctx_create(&ctx, comm, NULL);
    if (rc != DCP_OK)
        fail(NULL, "ctx", rc);

    struct box b;
    box_make(&b, mib, strcmp(how, "shard") != 0);
    dcp_state *st = box_state(&b);
    int tier = -1;
    int64_t got = step;
    dcp_tier *tk = NULL;
    if (tier_mode) {
        char host[256], t0[1300];
        if (gethostname(host, sizeof host) != 0)
            MPI_Abort(MPI_COMM_WORLD, 1);
        host[sizeof host - 1] = 0;
        snprintf(t0, sizeof t0, "%s/%s", argv[2], host);
        dcp_tier_options o;
        memset(&o, 0, sizeof o);
        o.struct_size = sizeof o;
        o.tier0_dir = t0;
        o.tier1_root = argv[3];
        o.replicas = (uint32_t)atoi(argv[6]);
        if (!strcmp(mode, "tier-restore"))
            o.replicas = 0;
        rc = dcp_tier_create(&tk, ctx, &o);
        if (rc != DCP_OK)
            fail(ctx, mode, rc);
        tier_stack = tk;
    }
    double t = 0, ts[16], tmin = -1;
    const char *re = getenv("CLUSTER_CKPT_RUNS");
    int runs = re && strcmp(mode, "tier-save") ? atoi(re) : 1;
    if (runs < 1 || runs > 16)
        runs = 1;
    if (!strcmp(mode, "save") || !strcmp(mode, "tier-save"))
        box_fill(&b, first);
    for (int run = 0; run < runs; run++) {
        if (strcmp(mode, "save") && strcmp(mode, "tier-save"))
            box_clear(&b);
        MPI_Barrier(MPI_COMM_WORLD);
        double a = now();
        if (!strcmp(mode, "save")) {
            /* runs after the first: fresh paths, as a trainer's steps */
            char p[1200];
            snprintf(p, sizeof p, "%s%s%d", argv[2], run ? ".run" : "", run);
            rc = dcp_save(ctx, st, run ? p : argv[2], NULL);
        } else if (!strcmp(mode, "load")) {
            dcp_load_options lo;
            memset(&lo, 0, sizeof lo);
            lo.struct_size = sizeof lo;
            if (!strcmp(how, "readonce"))
                lo.flags = DCP_LOAD_READ_ONCE;
            else if (!strcmp(how, "perrank"))
                lo.flags = DCP_LOAD_PER_RANK_READS;
            rc = dcp_load(ctx, st, argv[2], &lo);
        } else if (!strcmp(mode, "tier-save")) {
            rc = DCP_OK;
            for (int64_t k = first; rc == DCP_OK && k <= step; k++) {
                if (k > first)
                    box_fill(&b, k);
                rc = dcp_tier_save(tk, st, k, NULL);
                if (rc == DCP_OK)
                    rc = dcp_tier_drain_wait(tk, NULL);
            }
        } else {
            int want = atoi(argv[6]);
            rc = dcp_tier_restore(tk, st, NULL, &got, &tier);
            if (rc == DCP_OK && (got != step || (want >= 0 && tier != want))) {
                printf("rank %d: WRONG restore: step %lld tier %d, want step "
                       "%lld tier %d\n",
                       rank, (long long)got, tier, (long long)step, want);
                fflush(stdout);
                _exit(4);
            }
        }
        t = now() - a;
        if (rc != DCP_OK)
            fail(ctx, mode, rc);
        if (strcmp(mode, "save") && strcmp(mode, "tier-save") &&
            box_check(&b, step) != 0) {
            fflush(stdout);
            _exit(4);
        }
        ts[run] = slowest(t);
    }
    /* one run: its time; more: the median of those after the first (the
     * first pays the process's cold start: connections, plan) */
    if (runs == 1) {
        t = ts[0];
    } else {
        double v[16];
        int n = runs - 1;
        memcpy(v, ts + 1, sizeof(double) * (size_t)n);
        for (int i = 1; i < n; i++)
            for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
                double x = v[j];
                v[j] = v[j - 1];
                v[j - 1] = x;
            }
        t = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
        tmin = v[0];
    }
    if (rank == 0) {
        printf("ok %s%s%s s=%.3f mib=%zu ranks=%d", mode,
               strcmp(mode, "load") ? "" : " ", strcmp(mode, "load") ? "" : how,
               t, mib, world);
        if (runs > 1) {
            printf(" min=%.3f runs=", tmin);
            for (int i = 0; i < runs; i++)
                printf("%s%.3f", i ? "," : "", ts[i]);
        }
        if (tier_mode) {
            int64_t rep = -1;
            dcp_tier_replicated(tk, &rep);
            printf(" tier=%d step=%lld replicated=%lld", tier, (long long)got,
                   (long long)rep);
        }
        printf("\n");
        fflush(stdout);
    }
    dcp_tier_free(tk);
    dcp_state_free(st);
    for (int k = 0; k < NT; k++)
        free(b.buf[k]);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    MPI_Finalize();
    return 0;
}
