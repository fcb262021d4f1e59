/*
 * tier_peers_bench: peer replicas of tier 0 (dcp_tier.h, replicas 1) on
 * 2 ranks as 2 nodes (one tier-0 directory each) on one machine.
 *
 *   mpiexec -n 2 tier_peers_bench [DIR0 [DIR1 [MIB [RUNS]]]]
 *       defaults: /dev/shm/dcp-peers-bench (tier 0: DIR0/n<rank>),
 *                 /tmp/dcp-peers-bench (tier 1), 128 MiB per rank, 5 runs
 *   DCP_BENCH_MT=1: MPI_Init_thread(MPI_THREAD_MULTIPLE): the replication
 *       then streams on a thread of its own (DCP_COMM_P2P_THREAD) from
 *       each save's return ("thread_multiple": 1 in the JSON)
 *
 * Each rank holds MIB MiB (16 float32 tensors, random). Each run, back to
 * back on both ranks:
 *  - memcpy of the rank's bytes;
 *  - the communicator: each rank sends its bytes to the other and
 *    receives the other's (MPI_Isend/Irecv in 4 MiB pieces, as the
 *    replication does): bytes per rank / time;
 *  - dcp_tier_save with replicas 0, then with replicas 1, each
 *    synchronous (returns once tier 0 committed) and with tier0_async
 *    (returns once the state is staged): the blocking times. Between
 *    saves dcp_tier_drain_wait completes what the save left in flight
 *    (the tier-0 commit with tier0_async, the replication, the drain):
 *    timed apart ("settle"), not in the blocking time.
 * The save returns before its replicas land (they end at the next
 * collective call of the stack, here the drain_wait), so the local copy
 * is what blocks: tier0_block_vs_memcpy_replica1 = median(save,
 * tier0_async, replicas 1) / median(memcpy); beside it the replicas-0
 * ratio (same mode), the synchronous ratios (a write into tmpfs, about
 * 4x a memcpy here, is their local copy), the settle times and the
 * communicator's bandwidth. Then a training loop's view ("loop",
 * "loop_replicas0"): tier0_async saves 1 s apart with no other call of
 * the stack, each of which completes the previous step (with replicas 1,
 * ends its replication; the same with synchronous saves, "loop_sync",
 * "loop_sync_replicas0", whose replication begins in the save). Then
 * restore after losing node 1 (its directory
 * deleted before each run): dcp_tier_restore from tier 0 (node 0's own and
 * replica files; node 1's rank reads its own node's directory only, so
 * the file it reads is first copied there over the communicator) against
 * a plain dcp_load of the same step from tier 1 with its page cache
 * dropped (tier_restore_peers_speedup). Prints JSON entries for
 * bench/results.json on rank 0's stdout and a summary on stderr. On this
 * machine both "nodes" share the cores and memory: the communicator is
 * shared memory, not a network.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>
#include <dcp/dcp_tier.h>

#include <dirent.h>
#include <fcntl.h> /* posix_fadvise */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NT    16
#define PIECE ((size_t)4 << 20)

static int rank;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static volatile unsigned char sink;

static void evict(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d))) {
        char p[2048];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        int fd = open(p, O_RDONLY);
        if (fd < 0)
            continue;
        (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    closedir(d);
}

static int cmp_dbl(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double c[64];
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_dbl);
    return n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
}

/* The slowest rank's time. */
static double slowest(double t)
{
    double m = 0;
    MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return m;
}

#define DIE(ctx, what)                                                      \
    do {                                                                    \
        fprintf(stderr, "tier_peers_bench (rank %d): %s: %s\n", rank, what, \
                dcp_errmsg(ctx));                                           \
        MPI_Abort(MPI_COMM_WORLD, 1);                                       \
    } while (0)

static dcp_tier *make(dcp_ctx *ctx, const char *t0, const char *t1, uint32_t k,
                      int async0)
{
    dcp_tier_options o;
    dcp_tier *t = NULL;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tier0_dir = t0;
    o.tier1_root = t1;
    o.keep_last0 = 2;
    o.keep_last1 = 2;
    o.replicas = k;
    o.tier0_async = async0;
    if (dcp_tier_create(&t, ctx, &o) != DCP_OK)
        DIE(ctx, "dcp_tier_create");
    return t;
}

/* Each rank's n bytes to the other, the other's into in. */
static void exchange(const unsigned char *out, unsigned char *in, size_t n)
{
    int peer = 1 - rank;
    for (size_t off = 0; off < n; off += 4 * PIECE) {
        MPI_Request r[8];
        int k = 0;
        for (size_t o = off; o < n && o < off + 4 * PIECE; o += PIECE) {
            int len = (int)(n - o < PIECE ? n - o : PIECE);
            MPI_Irecv(in + o, len, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &r[k++]);
            MPI_Isend(out + o, len, MPI_BYTE, peer, 7, MPI_COMM_WORLD, &r[k++]);
        }
        MPI_Waitall(k, r, MPI_STATUSES_IGNORE);
    }
}

static dcp_state *mkstate(dcp_ctx *ctx, unsigned char *buf, size_t per)
{
    dcp_state *st = NULL;
    if (dcp_state_create(&st) != DCP_OK)
        DIE(ctx, "state");
    for (int i = 0; i < NT; i++) {
        char name[64];
        int64_t shape[2] = {2, (int64_t)(per / 4)};
        int64_t off[2] = {rank, 0}, sz[2] = {1, (int64_t)(per / 4)};
        snprintf(name, sizeof name, "layers.%d.weight", i);
        if (dcp_state_add_tensor(st, name, DCP_F32, 2, shape, off, sz,
                                 buf + (size_t)i * per, DCP_MEM_HOST) != DCP_OK)
            DIE(ctx, "add tensor");
    }
    return st;
}

int main(int argc, char **argv)
{
    /* DCP_BENCH_MT=1: MPI_THREAD_MULTIPLE, so the replication streams on
     * a thread of its own (DCP_COMM_P2P_THREAD) after each save. */
    const char *mtenv = getenv("DCP_BENCH_MT");
    int mt = mtenv && strcmp(mtenv, "1") == 0, provided = MPI_THREAD_SINGLE;
    if (mt)
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    else
        MPI_Init(&argc, &argv);
    mt = provided == MPI_THREAD_MULTIPLE;
    int size = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *d0 = argc > 1 ? argv[1] : "/dev/shm/dcp-peers-bench";
    const char *t1 = argc > 2 ? argv[2] : "/tmp/dcp-peers-bench";
    size_t mib = argc > 3 ? (size_t)atol(argv[3]) : 128;
    int runs = argc > 4 ? atoi(argv[4]) : 5;
    if (size != 2 || mib < 1 || runs < 1 || runs > 64) {
        if (rank == 0)
            fprintf(stderr, "usage: mpiexec -n 2 tier_peers_bench [DIR0 "
                            "[DIR1 [MIB [RUNS]]]]\n");
        MPI_Finalize();
        return 2;
    }
    if (rank == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", d0, t1);
        if (system(cmd) != 0)
            MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    char t0[1100];
    snprintf(t0, sizeof t0, "%s/n%d", d0, rank);
    size_t per = (mib << 20) / NT / 4 * 4, total = per * NT;
    unsigned char *buf = malloc(total), *dst = malloc(total);
    unsigned char *in = malloc(total);
    if (!buf || !dst || !in)
        MPI_Abort(MPI_COMM_WORLD, 1);
    srand(1 + (unsigned)rank);
    for (size_t i = 0; i < total; i++)
        buf[i] = (unsigned char)rand();
    memset(dst, 1, total);
    memset(in, 1, total);

    dcp_comm *comm = NULL;
    dcp_ctx *ctx = NULL;
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK ||
        dcp_ctx_create(&ctx, comm, NULL) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    dcp_state *st = mkstate(ctx, buf, per);
    /* The stacks: replicas 0 and 1, synchronous and tier0_async. */
    dcp_tier *tk[4] = {make(ctx, t0, t1, 0, 0), make(ctx, t0, t1, 1, 0),
                       make(ctx, t0, t1, 0, 1), make(ctx, t0, t1, 1, 1)};
    dcp_tier *t1k = tk[1];
    static const char *const what[4] = {"replicas 0", "replicas 1",
                                        "replicas 0, tier0_async",
                                        "replicas 1, tier0_async"};
    int64_t step = 0;
    /* Warm-up: every stack once. */
    for (int k = 0; k < 4; k++)
        if (dcp_tier_save(tk[k], st, step++, NULL) != DCP_OK ||
            dcp_tier_drain_wait(tk[k], NULL) != DCP_OK)
            DIE(ctx, "warm-up");
    exchange(buf, in, total);
    double mc[64], cm[64], sv[4][64], se[4][64];
    for (int r = 0; r < runs; r++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double a = now();
        memcpy(dst, buf, total);
        mc[r] = slowest(now() - a);
        sink = (unsigned char)(sink + dst[(size_t)r * 4099 % total]);
        MPI_Barrier(MPI_COMM_WORLD);
        a = now();
        exchange(buf, in, total);
        cm[r] = slowest(now() - a);
        for (int k = 0; k < 4; k++) {
            MPI_Barrier(MPI_COMM_WORLD);
            a = now();
            if (dcp_tier_save(tk[k], st, step++, NULL) != DCP_OK)
                DIE(ctx, what[k]);
            sv[k][r] = slowest(now() - a);
            a = now();
            if (dcp_tier_drain_wait(tk[k], NULL) != DCP_OK)
                DIE(ctx, what[k]);
            se[k][r] = slowest(now() - a);
        }
    }
    /* A training loop's view: tier0_async saves, replicas 0 then 1, a
     * 1 s "step" between them (longer than a drain here) and no other
     * call of the stack, so each save also ends what the previous one
     * left (its tier-0 commit, spread and drain start, and with replicas
     * its replication, which the communicator did not progress alone). */
    /* lp[0..1]: tier0_async (tk[2], tk[3]); lp[2..3]: synchronous (tk[0],
     * tk[1]), whose replication begins in the save itself: under
     * MPI_THREAD_MULTIPLE it streams during the 1 s, so the next save's
     * blocking is its own local copy plus the agreement. */
    double lp[4][64];
    for (int k = 0; k < 4; k++) {
        dcp_tier *tl = k < 2 ? tk[2 + k] : tk[k - 2];
        for (int r = 0; r < runs; r++) {
            MPI_Barrier(MPI_COMM_WORLD);
            usleep(1000000);
            double a = now();
            if (dcp_tier_save(tl, st, step++, NULL) != DCP_OK)
                DIE(ctx, "loop");
            lp[k][r] = slowest(now() - a);
        }
        if (dcp_tier_drain_wait(tl, NULL) != DCP_OK)
            DIE(ctx, "loop");
    }
    for (int k = 0; k < 4; k++)
        if (k != 1)
            dcp_tier_free(tk[k]);
    int64_t last = step - 1;

    /* Node 1 lost, before each run (a restore copies what node 1's rank
     * reads into node 1's directory, over the communicator): restore
     * from node 0's own and replica files. */
    dcp_state *st2 = mkstate(ctx, dst, per);
    char t1step[1200];
    snprintf(t1step, sizeof t1step, "%s/step-%lld", t1, (long long)last);
    double r0[3], r1[3];
    for (int r = 0; r < 3; r++) {
        int64_t got = -1;
        int tier = -1;
        memset(dst, 0, total);
        MPI_Barrier(MPI_COMM_WORLD);
        if (rank == 0) {
            char cmd[1200];
            snprintf(cmd, sizeof cmd, "rm -rf '%s/n1'", d0);
            if (system(cmd) != 0)
                MPI_Abort(MPI_COMM_WORLD, 1);
        }
        MPI_Barrier(MPI_COMM_WORLD);
        double a = now();
        if (dcp_tier_restore(t1k, st2, NULL, &got, &tier) != DCP_OK)
            DIE(ctx, "dcp_tier_restore");
        r0[r] = slowest(now() - a);
        if (got != last || tier != 0 || memcmp(dst, buf, total) != 0)
            DIE(ctx, "restore from peers: wrong step, tier or bytes");
        if (rank == 0)
            evict(t1step);
        memset(dst, 0, total);
        MPI_Barrier(MPI_COMM_WORLD);
        a = now();
        if (dcp_load(ctx, st2, t1step, NULL) != DCP_OK)
            DIE(ctx, "dcp_load from tier 1");
        r1[r] = slowest(now() - a);
        if (memcmp(dst, buf, total) != 0)
            DIE(ctx, "load from tier 1: wrong bytes");
    }
    dcp_tier_free(t1k);
    dcp_state_free(st2);
    dcp_state_free(st);

    double mmc = median(mc, runs), mcm = median(cm, runs);
    double ms[4], me[4];
    double ml0 = median(lp[0], runs), mlp = median(lp[1], runs);
    double mls0 = median(lp[2], runs), mlsp = median(lp[3], runs);
    for (int k = 0; k < 4; k++) {
        ms[k] = median(sv[k], runs);
        me[k] = median(se[k], runs);
    }
    double mr0 = median(r0, 3), mr1 = median(r1, 3);
    double gbps = (double)total / mcm / 1e9;
    if (rank == 0) {
        fprintf(stderr,
                "tier_peers_bench: 2 ranks as 2 nodes, %zu MiB per rank, "
                "%d runs: memcpy %.1f ms; communicator exchange %.1f ms "
                "(%.2f GB/s per rank each way)\n",
                mib, runs, mmc * 1e3, mcm * 1e3, gbps);
        for (int k = 0; k < 4; k++)
            fprintf(stderr,
                    "  tier-0 save, %s: blocks %.1f ms (x%.2f memcpy); "
                    "then drain_wait %.1f ms\n",
                    what[k], ms[k] * 1e3, ms[k] / mmc, me[k] * 1e3);
        fprintf(stderr,
                "  tier0_async, saves 1 s apart and no other call: each "
                "blocks %.1f ms (x%.2f memcpy) with replicas 0, %.1f ms "
                "(x%.2f) with replicas 1; synchronous: %.1f ms (x%.2f) "
                "with replicas 0, %.1f ms (x%.2f) with replicas 1\n"
                "  node 1 lost: restore from tier 0 (own + replica) %.1f ms, "
                "load from tier 1 (page cache dropped) %.1f ms (x%.2f)\n",
                ml0 * 1e3, ml0 / mmc, mlp * 1e3, mlp / mmc, mls0 * 1e3,
                mls0 / mmc, mlsp * 1e3, mlsp / mmc, mr0 * 1e3, mr1 * 1e3,
                mr1 / mr0);
        printf("  \"tier0_block_vs_memcpy_replica1\": {\"value\": %.3f, "
               "\"unit\": \"x memcpy\", \"mode\": \"tier0_async\", "
               "\"replicas0\": %.3f, \"sync\": %.3f, "
               "\"sync_replicas0\": %.3f, \"loop\": %.3f, "
               "\"loop_replicas0\": %.3f, \"loop_sync\": %.3f, "
               "\"loop_sync_replicas0\": %.3f, "
               "\"settle_ms\": %.1f, "
               "\"settle_ms_replicas0\": %.1f, \"sync_settle_ms\": %.1f, "
               "\"memcpy_ms\": %.2f, \"comm_gbps\": %.3f, "
               "\"mib_per_rank\": %zu, \"thread_multiple\": %d},\n",
               ms[3] / mmc, ms[2] / mmc, ms[1] / mmc, ms[0] / mmc, mlp / mmc,
               ml0 / mmc, mlsp / mmc, mls0 / mmc, me[3] * 1e3, me[2] * 1e3,
               me[1] * 1e3, mmc * 1e3, gbps, mib, mt);
        printf("  \"tier_replica_comm_gbps\": {\"value\": %.3f, \"unit\": "
               "\"GB/s per rank each way\"},\n",
               gbps);
        printf("  \"tier_restore_peers_speedup\": {\"value\": %.3f, "
               "\"unit\": \"x tier-1 load\", \"t0_ms\": %.2f, "
               "\"t1_ms\": %.2f}\n",
               mr1 / mr0, mr0 * 1e3, mr1 * 1e3);
    }
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    free(buf);
    free(dst);
    free(in);
    MPI_Finalize();
    return 0;
}
