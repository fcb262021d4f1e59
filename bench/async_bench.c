/*
 * async_bench: how long dcp_save_async blocks the caller, against the
 * floor for a copy of the same bytes, measured in the same run; and the
 * memory a save with a staging budget uses, against that budget.
 *
 *   async_bench [DIR [MIB [RUNS [TENSORS]]]]  defaults:
 *                         /dev/shm/dcp-async-bench, 256 MiB, 7 runs, 16
 *
 * State: TENSORS float32 tensors of MIB MiB in all (random content,
 * faulted in) and a value. Each run does, back to back:
 *  - memcpy: copies every tensor into a buffer of the same total size that
 *    was faulted in beforehand (the floor: an async save must at least
 *    copy the state once);
 *  - async: dcp_save_async into DIR on a context whose staging buffers
 *    were allocated by a warm-up save, timing the call (the blocking time),
 *    then dcp_request_wait (the total, reported for information). The
 *    save reuses the context's cached plan (dcp_ctx_plan_cached, checked),
 *    as every save after the first with the same structure does;
 *  - planned: the same on a second context with DCP_SAVE_NO_PLAN_CACHE,
 *    so that the blocking time includes planning, as a first save's does
 *    (async_block_ratio_planned; with many tensors the plan is what a
 *    cached plan saves).
 * async_block_ratio = median(async) / median(memcpy); its min and max are
 * the ratios of the runs' pairs. The warm-up save's blocking time (which
 * allocates and pre-faults the staging buffers) is reported apart.
 * Budget: three times, a fresh context with staging_budget = MIB/8 saves
 * the same state; the peak resident memory during that save (VmHWM, reset
 * through /proc/self/clear_refs before it) minus the resident memory
 * before it is reported against the budget (async_budget_peak_ratio), with
 * the staging buffers it ended up with and its blocking time (staging in
 * pieces, behind the writer).
 * Prints the JSON entries for bench/results.json on stdout and a summary
 * on stderr. DIR should be on tmpfs for steady figures (the blocking time
 * of an unbudgeted save does not depend on the storage).
 */
#include <dcp/dcp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BRUNS 3 /* budgeted saves */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n)
{
    double *s = malloc((size_t)n * sizeof(*s));
    double m;
    memcpy(s, v, (size_t)n * sizeof(*s));
    qsort(s, (size_t)n, sizeof(*s), cmp_double);
    m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    free(s);
    return m;
}

static double vmin(const double *v, int n)
{
    double m = v[0];
    int i;
    for (i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

static double vmax(const double *v, int n)
{
    double m = v[0];
    int i;
    for (i = 1; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

/* VmRSS or VmHWM in KiB, from /proc/self/status (0 when unavailable). */
static long status_kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = 0;
    size_t n = strlen(field);
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, field, n) && line[n] == ':')
            v = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return v;
}

static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

#define DIE(what, ctx)                                                   \
    do {                                                                 \
        fprintf(stderr, "async_bench: %s: %s\n", what, dcp_errmsg(ctx)); \
        exit(1);                                                         \
    } while (0)

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/dev/shm/dcp-async-bench";
    long mib = argc > 2 ? strtol(argv[2], NULL, 10) : 256;
    int runs = argc > 3 ? (int)strtol(argv[3], NULL, 10) : 7;
    int nt = argc > 4 ? (int)strtol(argv[4], NULL, 10) : 16;
    size_t total = (size_t)mib << 20, each, i;
    int64_t shape[2] = {0, 1024};
    float **t;
    unsigned char *dst;
    double *cp, *blk, *tot, *ratio, *pblk, *pratio, warm, t0, t1;
    dcp_save_options nocache;
    dcp_ctx *pctx;
    double bblock[BRUNS], bpeak[BRUNS];
    uint64_t bstaged = 0;
    dcp_ctx *ctx, *bctx;
    dcp_ctx_options o;
    dcp_state *st;
    dcp_request *req;
    long rss0, peak;
    int r;
    if (mib < 16 || runs < 1 || nt < 1 || total / (size_t)nt < 4096) {
        fprintf(stderr, "usage: async_bench [DIR [MIB>=16 [RUNS [TENSORS, "
                        "at least 4 KiB each]]]]\n");
        return 2;
    }
    shape[0] = (int64_t)(total / (size_t)nt / 4 / 1024);
    each = (size_t)shape[0] * 1024 * 4;
    t = calloc((size_t)nt, sizeof(*t));
    pblk = calloc((size_t)runs, sizeof(double));
    pratio = calloc((size_t)runs, sizeof(double));
    memset(&nocache, 0, sizeof(nocache));
    nocache.struct_size = sizeof(nocache);
    nocache.flags = DCP_SAVE_NO_PLAN_CACHE;
    total = each * nt;
    cp = calloc((size_t)runs, sizeof(double));
    blk = calloc((size_t)runs, sizeof(double));
    tot = calloc((size_t)runs, sizeof(double));
    ratio = calloc((size_t)runs, sizeof(double));
    if (dcp_state_create(&st) != DCP_OK)
        return 1;
    for (i = 0; i < (size_t)nt; i++) {
        char name[32];
        size_t k;
        t[i] = malloc(each);
        for (k = 0; k < each / 4; k++)
            t[i][k] = (float)(k * 2654435761u % 1000003u) * 1e-3f;
        snprintf(name, sizeof(name), "layers.%zu.weight", i);
        if (dcp_state_add_tensor(st, name, DCP_F32, 2, shape, NULL, NULL, t[i],
                                 DCP_MEM_HOST) != DCP_OK)
            return 1;
    }
    (void)dcp_state_add_value(st, "step", dcp_value_int(1000));
    dst = malloc(total);
    memset(dst, 1, total); /* faulted in */

    /* ---- blocking time against memcpy */
    if (dcp_ctx_create(&ctx, NULL, NULL) != DCP_OK ||
        dcp_ctx_create(&pctx, NULL, NULL) != DCP_OK)
        return 1;
    t0 = now();
    if (dcp_save_async(ctx, st, dir, NULL, &req) != DCP_OK)
        DIE("warm-up save", ctx);
    warm = now() - t0;
    if (dcp_request_wait(req) != DCP_OK)
        DIE("warm-up wait", ctx);
    dcp_request_free(req);
    if (dcp_save_async(pctx, st, dir, &nocache, &req) != DCP_OK ||
        dcp_request_wait(req) != DCP_OK)
        DIE("warm-up save (planned)", pctx);
    dcp_request_free(req);
    for (r = 0; r < runs; r++) {
        t0 = now();
        for (i = 0; i < (size_t)nt; i++)
            memcpy(dst + i * each, t[i], each);
        cp[r] = now() - t0;
        t0 = now();
        if (dcp_save_async(ctx, st, dir, NULL, &req) != DCP_OK)
            DIE("save", ctx);
        t1 = now();
        if (dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) != 1)
            DIE("save did not reuse its plan", ctx);
        if (dcp_request_wait(req) != DCP_OK)
            DIE("wait", ctx);
        dcp_request_free(req);
        blk[r] = t1 - t0;
        tot[r] = now() - t0;
        ratio[r] = blk[r] / cp[r];
        t0 = now();
        if (dcp_save_async(pctx, st, dir, &nocache, &req) != DCP_OK)
            DIE("save (planned)", pctx);
        pblk[r] = now() - t0;
        pratio[r] = pblk[r] / cp[r];
        if (dcp_ctx_plan_cached(pctx, DCP_IO_SAVE) != 0 ||
            dcp_request_wait(req) != DCP_OK)
            DIE("wait (planned)", pctx);
        dcp_request_free(req);
    }
    dcp_ctx_free(pctx);
    if (dcp_ctx_staging_bytes(ctx) < total)
        DIE("staging buffers smaller than the state", ctx);
    dcp_ctx_free(ctx);

    /* ---- peak memory with a budget of an eighth of the state, three
     * times, each on a fresh context (its staging buffers included) */
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.staging_budget = total / 8;
    for (r = 0; r < BRUNS; r++) {
        if (dcp_ctx_create(&bctx, NULL, &o) != DCP_OK)
            return 1;
        rss0 = status_kib("VmRSS");
        reset_peak();
        t0 = now();
        if (dcp_save_async(bctx, st, dir, NULL, &req) != DCP_OK)
            DIE("budget save", bctx);
        bblock[r] = now() - t0;
        if (dcp_request_wait(req) != DCP_OK)
            DIE("budget wait", bctx);
        dcp_request_free(req);
        peak = status_kib("VmHWM");
        bpeak[r] = (double)(peak - rss0) * 1024.0 / (double)o.staging_budget;
        bstaged = dcp_ctx_staging_bytes(bctx);
        dcp_ctx_free(bctx);
    }

    fprintf(stderr,
            "state %.0f MiB in %d tensors, %d runs, into %s\n"
            "memcpy into faulted memory: median %.2f ms (%.2f..%.2f)\n"
            "dcp_save_async blocking:    median %.2f ms (%.2f..%.2f); "
            "to completion %.1f ms\n"
            "async_block_ratio:          %.3f (runs %.3f..%.3f)\n"
            "planned each save:          median %.2f ms, ratio %.3f "
            "(runs %.3f..%.3f)\n"
            "first save (allocates and pre-faults the staging buffers): "
            "%.2f ms blocking\n"
            "budget %.1f MiB: staging buffers %.1f MiB, peak RSS over the "
            "save %.3f x budget (%.3f..%.3f), blocking %.1f ms\n",
            (double)total / 1048576.0, nt, runs, dir, median(cp, runs) * 1e3,
            vmin(cp, runs) * 1e3, vmax(cp, runs) * 1e3, median(blk, runs) * 1e3,
            vmin(blk, runs) * 1e3, vmax(blk, runs) * 1e3,
            median(tot, runs) * 1e3, median(blk, runs) / median(cp, runs),
            vmin(ratio, runs), vmax(ratio, runs), median(pblk, runs) * 1e3,
            median(pblk, runs) / median(cp, runs), vmin(pratio, runs),
            vmax(pratio, runs), warm * 1e3,
            (double)o.staging_budget / 1048576.0,
            (double)bstaged / 1048576.0, median(bpeak, BRUNS),
            vmin(bpeak, BRUNS), vmax(bpeak, BRUNS),
            median(bblock, BRUNS) * 1e3);
    printf("  \"async_block_ratio\": {\"value\": %.3f, \"unit\": \"x memcpy\", "
           "\"min\": %.3f, \"max\": %.3f},\n",
           median(blk, runs) / median(cp, runs), vmin(ratio, runs),
           vmax(ratio, runs));
    printf("  \"async_block_ratio_planned\": {\"value\": %.3f, \"unit\": "
           "\"x memcpy\", \"min\": %.3f, \"max\": %.3f},\n",
           median(pblk, runs) / median(cp, runs), vmin(pratio, runs),
           vmax(pratio, runs));
    printf("  \"async_block_ms\": {\"value\": %.2f, \"unit\": \"ms\", "
           "\"min\": %.2f, \"max\": %.2f},\n",
           median(blk, runs) * 1e3, vmin(blk, runs) * 1e3,
           vmax(blk, runs) * 1e3);
    printf("  \"async_memcpy_ms\": {\"value\": %.2f, \"unit\": \"ms\", "
           "\"min\": %.2f, \"max\": %.2f},\n",
           median(cp, runs) * 1e3, vmin(cp, runs) * 1e3, vmax(cp, runs) * 1e3);
    printf("  \"async_budget_peak_ratio\": {\"value\": %.3f, \"unit\": "
           "\"x budget\", \"min\": %.3f, \"max\": %.3f}\n",
           median(bpeak, BRUNS), vmin(bpeak, BRUNS), vmax(bpeak, BRUNS));
    dcp_state_free(st);
    for (i = 0; i < (size_t)nt; i++)
        free(t[i]);
    free(t);
    free(pblk);
    free(pratio);
    free(dst);
    free(cp);
    free(blk);
    free(tot);
    free(ratio);
    return 0;
}
