/*
 * tier_bench: how long dcp_tier_save blocks the caller (tier 0 committed),
 * against a memcpy of the same bytes, measured in the same run; and the
 * drain's throughput against its bandwidth limit.
 *
 *   tier_bench [T0DIR [T1DIR [MIB [RUNS [TENSORS [LIMIT_MBS]]]]]]
 *       defaults: /dev/shm/dcp-tier-bench, /tmp/dcp-tier-bench, 256 MiB,
 *                 7 runs, 16 tensors, 200 MB/s
 *
 * One process (no communicator), so one node. State: TENSORS float32
 * tensors of MIB MiB in all (random content, faulted in) and a value.
 * Each run, back to back:
 *  - memcpy: every tensor copied into a buffer of the same total size that
 *    was faulted in beforehand;
 *  - tier0: dcp_tier_save of the next step, timed (the blocking time: the
 *    save into tier 0, committed, and tier-0 retention keep_last0 2, which
 *    removes the step before last); the drain then runs unlimited and is
 *    waited for, not timed.
 * tier0_block_vs_memcpy = median(tier0) / median(memcpy); min and max are
 * the ratios of the runs' pairs. A warm-up save first (plan, directories).
 * Then three saves on a stack whose drain is limited to LIMIT_MBS MB/s:
 * each drain's throughput (bytes of data files / time from the save's
 * return to dcp_tier_drain_wait's) against the limit, median
 * (tier_drain_vs_limit, at most 1 plus rounding).
 * Prints the JSON entries for bench/results.json on stdout and a summary
 * on stderr. T0DIR should be on tmpfs (what tier 0 is meant to be).
 */
#include <dcp/dcp.h>
#include <dcp/dcp_tier.h>

#include <dirent.h>
#include <fcntl.h> /* posix_fadvise */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Reads of the copies, so that no compiler drops a memcpy. */
static volatile unsigned char sink;

/* Drops the page cache of every file in dir (they are synced): a read
 * from tier 1 then comes from its device. */
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

static double median(double *v, int n)
{
    double *c = malloc(sizeof(double) * (size_t)n);
    if (!c)
        exit(1);
    memcpy(c, v, sizeof(double) * (size_t)n);
    qsort(c, (size_t)n, sizeof(double), cmp_dbl);
    double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

#define DIE(ctx, what)                                                  \
    do {                                                                \
        fprintf(stderr, "tier_bench: %s: %s\n", what, dcp_errmsg(ctx)); \
        exit(1);                                                        \
    } while (0)

static dcp_tier *make(dcp_ctx *ctx, const char *t0, const char *t1, uint64_t bw,
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
    o.busy = DCP_TIER_WAIT;
    o.drain_bytes_per_sec = bw;
    o.tier0_async = async0;
    if (dcp_tier_create(&t, ctx, &o) != DCP_OK)
        DIE(ctx, "dcp_tier_create");
    return t;
}

int main(int argc, char **argv)
{
    const char *t0 = argc > 1 ? argv[1] : "/dev/shm/dcp-tier-bench";
    const char *t1 = argc > 2 ? argv[2] : "/tmp/dcp-tier-bench";
    size_t mib = argc > 3 ? (size_t)atol(argv[3]) : 256;
    int runs = argc > 4 ? atoi(argv[4]) : 7;
    size_t nt = argc > 5 ? (size_t)atol(argv[5]) : 16;
    double limit = argc > 6 ? atof(argv[6]) * 1e6 : 200e6;
    if (mib < 1 || runs < 1 || nt < 1 || mib * 1024 * 1024 / 4 < nt ||
        limit <= 0) {
        fprintf(stderr, "usage: tier_bench [T0DIR [T1DIR [MIB [RUNS "
                        "[TENSORS [LIMIT_MBS]]]]]]\n");
        return 2;
    }
    {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", t0, t1);
        if (system(cmd) != 0)
            return 1;
    }
    size_t total = mib << 20, per = total / nt / 4 * 4;
    total = per * nt;
    unsigned char *state = malloc(total), *dst = malloc(total);
    if (!state || !dst)
        return 1;
    srand(1);
    for (size_t i = 0; i < total; i++)
        state[i] = (unsigned char)rand();
    memset(dst, 1, total);

    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    if (dcp_ctx_create(&ctx, NULL, NULL) != DCP_OK ||
        dcp_state_create(&st) != DCP_OK)
        return 1;
    for (size_t i = 0; i < nt; i++) {
        char name[64];
        int64_t shape[1] = {(int64_t)(per / 4)}, off[1] = {0};
        snprintf(name, sizeof name, "layers.%zu.weight", i);
        if (dcp_state_add_tensor(st, name, DCP_F32, 1, shape, off, shape,
                                 state + i * per, DCP_MEM_HOST) != DCP_OK)
            DIE(ctx, "add tensor");
    }
    if (dcp_state_add_value(st, "step", dcp_value_int(0)) != DCP_OK)
        DIE(ctx, "add value");

    dcp_tier *t = make(ctx, t0, t1, 0, 0);
    int64_t step = 0;
    int oc = 0;
    if (dcp_tier_save(t, st, step++, &oc) != DCP_OK ||
        dcp_tier_drain_wait(t, NULL) != DCP_OK)
        DIE(ctx, "warm-up save");
    double *mc = calloc((size_t)runs, sizeof(double));
    double *sv = calloc((size_t)runs, sizeof(double));
    double *dr = calloc((size_t)runs, sizeof(double));
    if (!mc || !sv || !dr)
        return 1;
    for (int r = 0; r < runs; r++) {
        double a = now();
        for (size_t i = 0; i < nt; i++)
            memcpy(dst + i * per, state + i * per, per);
        mc[r] = now() - a;
        sink = (unsigned char)(sink + dst[(size_t)r * 4099 % total]);
        a = now();
        if (dcp_tier_save(t, st, step++, &oc) != DCP_OK)
            DIE(ctx, "dcp_tier_save");
        sv[r] = now() - a;
        if (oc != DCP_TIER_SAVED)
            DIE(ctx, "outcome");
        a = now();
        if (dcp_tier_drain_wait(t, NULL) != DCP_OK)
            DIE(ctx, "dcp_tier_drain_wait");
        dr[r] = now() - a;
    }
    dcp_tier_free(t);

    /* tier0_async, steady state: each save also completes the previous
     * one (tier-0 commit, spread, retention, its drain started, the drain
     * before it committed), after a gap in which the background work
     * ends, as a training step's compute would give it. */
    double gap = 1.5 * (median(sv, runs) + median(dr, runs)) + 0.1;
    double *as = calloc((size_t)runs, sizeof(double));
    double *am = calloc((size_t)runs, sizeof(double));
    if (!as || !am)
        return 1;
    t = make(ctx, t0, t1, 0, 1);
    for (int r = 0; r < 2; r++)
        if (dcp_tier_save(t, st, step++, &oc) != DCP_OK)
            DIE(ctx, "async warm-up");
    if (dcp_tier_drain_wait(t, NULL) != DCP_OK)
        DIE(ctx, "async warm-up wait");
    for (int r = 0; r < runs; r++) {
        double a = now();
        for (size_t i = 0; i < nt; i++)
            memcpy(dst + i * per, state + i * per, per);
        am[r] = now() - a;
        sink = (unsigned char)(sink + dst[(size_t)r * 4099 % total]);
        a = now();
        if (dcp_tier_save(t, st, step++, &oc) != DCP_OK)
            DIE(ctx, "dcp_tier_save (async)");
        as[r] = now() - a;
        struct timespec ts = {(time_t)gap,
                              (long)((gap - (double)(time_t)gap) * 1e9)};
        nanosleep(&ts, NULL);
    }
    if (dcp_tier_drain_wait(t, NULL) != DCP_OK)
        DIE(ctx, "dcp_tier_drain_wait (async)");
    dcp_tier_free(t);

    /* Restore: the newest step from tier 0 (dcp_tier_restore), against
     * a plain dcp_load of the same step from tier 1 with its page cache
     * dropped; into a second state over dst. */
    dcp_state *st2 = NULL;
    if (dcp_state_create(&st2) != DCP_OK)
        return 1;
    for (size_t i = 0; i < nt; i++) {
        char name[64];
        int64_t shape[1] = {(int64_t)(per / 4)}, off[1] = {0};
        snprintf(name, sizeof name, "layers.%zu.weight", i);
        if (dcp_state_add_tensor(st2, name, DCP_F32, 1, shape, off, shape,
                                 dst + i * per, DCP_MEM_HOST) != DCP_OK)
            DIE(ctx, "add tensor");
    }
    if (dcp_state_add_value(st2, "step", dcp_value_int(0)) != DCP_OK)
        DIE(ctx, "add value");
    t = make(ctx, t0, t1, 0, 0);
    int64_t last = step++;
    if (dcp_tier_save(t, st, last, &oc) != DCP_OK ||
        dcp_tier_drain_wait(t, NULL) != DCP_OK)
        DIE(ctx, "restore's save");
    double r0[3], r1[3];
    char t1step[1200];
    snprintf(t1step, sizeof t1step, "%s/step-%lld", t1, (long long)last);
    for (int r = 0; r < 3; r++) {
        int64_t got = -1;
        int tier = -1;
        double a = now();
        if (dcp_tier_restore(t, st2, NULL, &got, &tier) != DCP_OK)
            DIE(ctx, "dcp_tier_restore");
        r0[r] = now() - a;
        if (got != last || tier != 0 || memcmp(dst, state, total) != 0)
            DIE(ctx, "restore from tier 0: wrong step, tier or bytes");
        evict(t1step);
        memset(dst, 0, total);
        a = now();
        if (dcp_load(ctx, st2, t1step, NULL) != DCP_OK)
            DIE(ctx, "dcp_load from tier 1");
        r1[r] = now() - a;
        if (memcmp(dst, state, total) != 0)
            DIE(ctx, "load from tier 1: wrong bytes");
    }
    dcp_tier_free(t);
    dcp_state_free(st2);

    /* The drain under a limit. */
    t = make(ctx, t0, t1, (uint64_t)limit, 0);
    double thr[3];
    for (int r = 0; r < 3; r++) {
        if (dcp_tier_save(t, st, step++, &oc) != DCP_OK)
            DIE(ctx, "dcp_tier_save (limited)");
        double a = now();
        if (dcp_tier_drain_wait(t, NULL) != DCP_OK)
            DIE(ctx, "dcp_tier_drain_wait (limited)");
        thr[r] = (double)total / (now() - a);
    }
    dcp_tier_free(t);

    double rmin = 1e300, rmax = 0, amin = 1e300, amax = 0;
    for (int r = 0; r < runs; r++) {
        double q = sv[r] / mc[r], qa = as[r] / am[r];
        rmin = q < rmin ? q : rmin;
        rmax = q > rmax ? q : rmax;
        amin = qa < amin ? qa : amin;
        amax = qa > amax ? qa : amax;
    }
    double mas = median(as, runs), mam = median(am, runs);
    double msv = median(sv, runs), mmc = median(mc, runs);
    double mdr = median(dr, runs), mthr = median(thr, 3);
    fprintf(stderr,
            "tier_bench: tier0_async: save blocks %.1f ms, memcpy %.1f ms "
            "(x%.3f, runs %.3f..%.3f; gap %.2f s)\n",
            mas * 1e3, mam * 1e3, mas / mam, amin, amax, gap);
    fprintf(stderr,
            "tier_bench: %zu MiB in %zu tensors, %d runs: tier-0 save "
            "blocks %.1f ms, memcpy %.1f ms (x%.3f, runs %.3f..%.3f); "
            "unlimited drain %.1f ms (%.2f GB/s); drain limited to "
            "%.0f MB/s: %.1f MB/s (x%.3f)\n",
            mib, nt, runs, msv * 1e3, mmc * 1e3, msv / mmc, rmin, rmax,
            mdr * 1e3, (double)total / mdr / 1e9, limit / 1e6, mthr / 1e6,
            mthr / limit);
    printf("  \"tier0_block_vs_memcpy\": {\"value\": %.3f, \"unit\": \"x "
           "memcpy\", \"min\": %.3f, \"max\": %.3f},\n",
           mas / mam, amin, amax);
    printf("  \"tier0_block_ms\": {\"value\": %.2f, \"unit\": \"ms\"},\n",
           mas * 1e3);
    printf("  \"tier0_block_vs_memcpy_sync\": {\"value\": %.3f, \"unit\": "
           "\"x memcpy\", \"min\": %.3f, \"max\": %.3f},\n",
           msv / mmc, rmin, rmax);
    printf("  \"tier0_block_ms_sync\": {\"value\": %.2f, \"unit\": "
           "\"ms\"},\n",
           msv * 1e3);
    printf("  \"tier0_memcpy_ms\": {\"value\": %.2f, \"unit\": \"ms\"},\n",
           mmc * 1e3);
    double mr0 = median(r0, 3), mr1 = median(r1, 3);
    fprintf(stderr,
            "tier_bench: restore from tier 0 %.1f ms, load from tier 1 "
            "(page cache dropped) %.1f ms (x%.2f)\n",
            mr0 * 1e3, mr1 * 1e3, mr1 / mr0);
    printf("  \"tier_restore_t0_ms\": {\"value\": %.2f, \"unit\": "
           "\"ms\"},\n",
           mr0 * 1e3);
    printf("  \"tier_restore_t1_ms\": {\"value\": %.2f, \"unit\": "
           "\"ms\"},\n",
           mr1 * 1e3);
    printf("  \"tier_restore_speedup\": {\"value\": %.3f, \"unit\": "
           "\"x tier-1 load\"},\n",
           mr1 / mr0);
    printf("  \"tier_drain_gbps_unlimited\": {\"value\": %.3f, \"unit\": "
           "\"GB/s\"},\n",
           (double)total / mdr / 1e9);
    printf("  \"tier_drain_vs_limit\": {\"value\": %.3f, \"unit\": \"x "
           "limit\", \"limit_mbs\": %.0f}\n",
           mthr / limit, limit / 1e6);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    free(mc);
    free(sv);
    free(dr);
    free(as);
    free(am);
    free(state);
    free(dst);
    return 0;
}
