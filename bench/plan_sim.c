/*
 * plan_sim: the coordinator's side of a large collective save, simulated in
 * one process (no MPI, no data files).
 *
 * Every one of R ranks holds one row shard (torch.chunk-style, uneven, some
 * empty) of each of T tensors, FSDP-style, under nested keys
 * model.layers.<i>.<name>, plus two replicated values. Their local plans
 * are encoded as dcp_save encodes them (not timed). Then, per repetition:
 *  - plan_sim_seconds: what rank 0 does between gathering the plans and
 *    writing .metadata: the global plan (parse, agreement checks, dedup,
 *    tiling check, writer choice), the records' extents coming back, and
 *    the .metadata pickle encoding; plan_sim_peak_gib is the peak resident
 *    memory over that step (the gathered plans included, as on rank 0);
 *  - metadata_decode_seconds: decoding that .metadata, as every rank does
 *    at load;
 *  - load_plan_ms: one rank's load planning with the sharding it saved
 *    with: finding, for each of its T boxes, the stored chunks it overlaps.
 *  - plan_cached_seconds: rank 0's part of a second save with the same
 *    structure, which reuses the first save's plan (save.c's plan cache):
 *    its new local plan compared with the kept one, the file names redone;
 *    plan_cached_commit_seconds: that save's finish on rank 0 (extents,
 *    .metadata encoded: the same work as in every save), checked to give
 *    the first save's .metadata bytes; plan_cached_kept_gib: the resident
 *    memory the kept global plan holds on rank 0 between saves.
 * The JSON printed on stdout has those seven keys as
 * {"value": median, "unit", "min", "max"}.
 *
 * It uses the library's internals (plan.h, meta.h), so it links the static
 * library (CMake target plan_sim, with every layer's include folder). Build
 * and run (from the repository root):
 *   cmake -S . -B build-rel -DCMAKE_BUILD_TYPE=Release
 *   cmake --build build-rel -j2 --target plan_sim
 *   PLAN_SIM_CLOCK=cpu build-rel/plan_sim [ranks=4096] [tensors=2000] \
 *      [reps=3] > plan_sim.json
 * Environment:
 * PLAN_SIM_CLOCK=cpu (see sim_clock), PLAN_SIM_DUMP=FILE writes the first
 * repetition's .metadata (to compare bytes across versions),
 * PLAN_SIM_BLOBS=FILE keeps the gathered local plans (12 s to make) for
 * the next run, PLAN_SIM_MESH=1 shards as a 2-D mesh (box_of). Peak
 * memory is read from /proc/self/status (VmHWM), reset before the timed
 * step through /proc/self/clear_refs (Linux).
 */
#include <dcp/dcp.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hashtab.h"
#include "meta.h"
#include "reshard.h"
#include "plan.h"
#include "read.h"
#include "state.h"

static const char *names[20] = {
    "input_layernorm.weight",   "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",  "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",  "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",  "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",     "mlp.up_proj.weight",
    "mlp.down_proj.weight",     "mlp.gate_proj.bias",
    "mlp.up_proj.bias",         "mlp.down_proj.bias",
    "self_attn.q_proj.bias",    "self_attn.k_proj.bias",
    "self_attn.v_proj.bias",    "self_attn.o_proj.bias",
    "adapter.lora_a.weight",    "adapter.lora_b.weight"};

/* Wall clock by default; PLAN_SIM_CLOCK=cpu measures the process's CPU time
 * (user + system) instead, which a busy shared machine distorts far less:
 * the simulation is single-threaded and does no I/O, so on an idle machine
 * the two agree. */
static clockid_t sim_clock = CLOCK_MONOTONIC;

static double now(void)
{
    struct timespec ts;
    (void)clock_gettime(sim_clock, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wall time, printed beside CPU time (stderr) when that is measured. */
static double wall(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A field of /proc/self/status (VmHWM:, VmRSS:) in bytes. */
static double status_bytes(const char *field)
{
    char line[256];
    double kib = 0;
    size_t n = strlen(field);
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, n) == 0)
            kib = strtod(line + n, NULL);
    (void)fclose(f);
    return kib * 1024.0;
}

/* Peak resident set (VmHWM) in bytes, and its reset. */
static double peak_rss(void)
{
    return status_bytes("VmHWM:");
}

static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        (void)fputs("5", f);
        (void)fclose(f);
    }
}

/* Tensor t's global shape: about 2 rows per rank, uneven. */
static void shape_of(int t, int nranks, int64_t *shape)
{
    shape[0] = 2 * (int64_t)nranks - t % 7;
    shape[1] = 64 + t % 3;
}

/* torch.chunk-style row split. */
static void split(int64_t n, int p, int i, int64_t *off, int64_t *size)
{
    int64_t c = (n + p - 1) / p, o = c * i, e = c * (i + 1);
    *off = o > n ? n : o;
    *size = (e > n ? n : e) - *off;
}

/*
 * Rank r's box of a tensor of shape s: a row shard (FSDP), or with
 * PLAN_SIM_MESH=1 a block of a 64 x (ranks / 64) grid with ranks going
 * down the columns first, so that each tensor's boxes arrive out of
 * offset order (a 2-D mesh, as HSDP or TP x FSDP give).
 */
static int mesh;

static void box_of(const int64_t *s, int nranks, int r, int64_t *off,
                   int64_t *size)
{
    if (mesh && nranks >= 64) {
        split(s[0], 64, r % 64, &off[0], &size[0]);
        split(s[1], nranks / 64, r / 64, &off[1], &size[1]);
        return;
    }
    split(s[0], nranks, r, &off[0], &size[0]);
    off[1] = 0;
    size[1] = s[1];
}

/* Rank r's local plan appended to all; with keep, kept there (the value
 * "step" = step) instead of released. */
static int local_plan(int r, int nranks, int ntensors, struct dcp_buf *all,
                      int64_t step, struct pl_local *keep)
{
    static char dummy[1];
    struct pl_local lp;
    struct dcp_err err;
    dcp_state *st;
    int t, rc;
    if (dcp_state_create(&st) != DCP_OK)
        return DCP_ENOMEM;
    rc = dcp_state_push(st, "model");
    if (rc == DCP_OK)
        rc = dcp_state_push(st, "layers");
    for (t = 0; rc == DCP_OK && t < ntensors; t++) {
        int64_t shape[2], off[2] = {0, 0}, size[2];
        shape_of(t, nranks, shape);
        box_of(shape, nranks, r, off, size);
        if (t % 20 == 0 && t)
            rc = dcp_state_pop(st);
        if (rc == DCP_OK && t % 20 == 0)
            rc = dcp_state_push_index(st, t / 20);
        if (rc == DCP_OK)
            rc = dcp_state_add_tensor(st, names[t % 20], DCP_BF16, 2, shape,
                                      off, size, dummy, DCP_MEM_HOST);
    }
    while (rc == DCP_OK && dcp_state_pop(st) == DCP_OK)
        ;
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "step", dcp_value_int(step));
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "lr", dcp_value_float(3e-4));
    if (rc == DCP_OK)
        rc = dcp__plan_local(st, &lp, &err);
    if (rc == DCP_OK) {
        rc = dcp__buf_put(all, lp.blob.p, lp.blob.len);
        if (keep)
            *keep = lp;
        else
            dcp__plan_local_release(&lp);
    }
    dcp_state_free(st);
    return rc;
}

/* The data file names of a plan, as save.c names them (a cached plan's
 * are dropped first, as save.c's name_files does at every save). */
static void name_files(struct pl_global *g, int nranks)
{
    size_t i;
    int r;
    for (i = 0; i < g->md->nfiles; i++)
        dcp__free(g->md->files[i]);
    dcp__free(g->md->files);
    g->md->nfiles = 0;
    g->md->files = dcp__calloc((size_t)nranks, sizeof(*g->md->files));
    for (r = 0; r < nranks; r++) {
        char name[32];
        (void)snprintf(name, sizeof(name), "__%d_0.distcp", r);
        g->md->files[g->md->nfiles++] = dcp__strdup(name);
    }
}

/* Rank 0's work at the finish: every rank's extents, .metadata bytes. */
static int commit_side(struct pl_global *g, int nranks, struct dcp_buf *md_out)
{
    struct dcp_err err;
    struct dcp_buf res = {0};
    uint64_t *offlen = NULL;
    size_t cap = 0;
    int r, rc = DCP_OK;
    memset(&err, 0, sizeof(err));
    for (r = 0; rc == DCP_OK && r < nranks; r++) {
        size_t n = g->recbase[r + 1] - g->recbase[r], i;
        if (2 * n > cap) {
            cap = 2 * n;
            offlen = realloc(offlen, cap * sizeof(*offlen));
        }
        for (i = 0; i < n; i++) { /* a record of ~1 KiB each */
            offlen[2 * i] = (uint64_t)i * 1024;
            offlen[2 * i + 1] = 1024;
        }
        res.len = 0;
        rc = dcp__plan_results_encode(offlen, n, &res);
        if (rc == DCP_OK)
            rc = dcp__plan_results_apply(g, r, (uint32_t)r, res.p, res.len,
                                         &err);
    }
    dcp__free(g->md->save_id);
    dcp__free(g->md->checkpoint_id);
    g->md->save_id = dcp__strdup("plan-sim");
    g->md->checkpoint_id = dcp__strdup("/ckpt/step-100");
    if (rc == DCP_OK)
        rc = dcp__meta_encode(g->md, md_out);
    free(offlen);
    dcp__buf_free(&res);
    return rc;
}

/* Rank 0's work after the gather: plan, extents back, .metadata bytes.
 * With keep, the plan is kept there (as the plan cache keeps it). */
static int coordinate(const uint8_t *blobs, const size_t *lens,
                      const size_t *displs, int nranks, struct dcp_buf *md_out,
                      struct pl_global *keep)
{
    struct pl_global g;
    struct dcp_err err;
    int rc;
    double t0 = now();
    memset(&err, 0, sizeof(err));
    rc = dcp__plan_global(blobs, lens, displs, nranks, &g, &err);
    fprintf(stderr, "  global plan alone: %.2f s\n", now() - t0);
    if (rc != DCP_OK) {
        fprintf(stderr, "plan: %s\n", err.msg);
        return rc;
    }
    name_files(&g, nranks);
    rc = commit_side(&g, nranks, md_out);
    fprintf(stderr, "  + extents applied, encoded: %.2f s\n", now() - t0);
    if (keep)
        *keep = g;
    else
        dcp__plan_global_release(&g);
    return rc;
}

/* One rank's load planning, as dcp_load does it (load.c): for each of its
 * boxes, the stored chunks it overlaps (dcp__meta_overlapping). */
static size_t load_plan(const struct dcp_metadata *md, int r, int nranks,
                        int ntensors)
{
    static uint8_t *mark;
    static size_t cap;
    size_t hits = 0;
    char key[128];
    int t;
    for (t = 0; t < ntensors; t++) {
        int64_t shape[2], off[2] = {0, 0}, size[2];
        const struct md_entry *e;
        long k;
        shape_of(t, nranks, shape);
        box_of(shape, nranks, r, off, size);
        (void)snprintf(key, sizeof(key), "model.layers.%d.%s", t / 20,
                       names[t % 20]);
        k = dcp__meta_find(md, key);
        if (k < 0)
            return 0;
        e = &md->e[k];
        if (e->nchunks > cap) {
            cap = e->nchunks;
            free(mark);
            mark = malloc(cap);
            if (!mark)
                return 0;
        }
        memset(mark, 0, e->nchunks);
        hits += dcp__meta_overlapping(e, off, size, mark);
    }
    return hits;
}

/*
 * The second save with the plan cache (save.c): the first save's global
 * plan kept; rank 0's new local plan (another "step" value) compared with
 * the structure it kept, the data files named again (pc: what replaces
 * the gather, the global plan and the scatter on rank 0; the allreduce
 * that decides is not simulated); then the finish as in every save, the
 * extents applied and .metadata encoded (pcc), whose bytes must equal the
 * first save's (fresh_hash).
 */
static int second_save(const struct dcp_buf *all, const size_t *lens,
                       const size_t *displs, int nranks, int ntensors, int reps,
                       double *pc, double *pcc, uint64_t fresh_hash,
                       double *kept_gib)
{
    double rss;
    struct pl_global g;
    struct pl_local lp0, lp1;
    struct dcp_buf tmp = {0}, sblob = {0}, md = {0};
    int k, same, rc;
    rc = coordinate(all->p, lens, displs, nranks, &md, &g);
    dcp__buf_free(&md);
    if (rc != DCP_OK)
        return rc;
    if (local_plan(0, nranks, ntensors, &tmp, 1000, &lp0) != DCP_OK ||
        dcp__plan_local_structure(&lp0, &sblob) != DCP_OK)
        return DCP_ENOMEM;
    tmp.len = 0;
    if (local_plan(0, nranks, ntensors, &tmp, 1001, &lp1) != DCP_OK)
        return DCP_ENOMEM;
    for (k = 0; k < reps && rc == DCP_OK; k++) {
        double t1 = now();
        same = dcp__plan_local_same(&lp1, &sblob);
        name_files(&g, nranks);
        pc[k] = now() - t1;
        t1 = now();
        rc = commit_side(&g, nranks, &md);
        pcc[k] = now() - t1;
        if (!same || dcp__fnv1a64(md.p, md.len) != fresh_hash) {
            fprintf(stderr, "second save: %s\n",
                    !same ? "structure differs" : ".metadata differs");
            rc = DCP_EPLAN;
        }
        fprintf(stderr,
                "second save %d: cached plan %.2f ms, extents + encode "
                "%.2f s\n",
                k, pc[k] * 1e3, pcc[k]);
        dcp__buf_free(&md);
    }
    dcp__plan_local_release(&lp0);
    dcp__plan_local_release(&lp1);
    dcp__buf_free(&tmp);
    dcp__buf_free(&sblob);
    rss = status_bytes("VmRSS:");
    dcp__plan_global_release(&g);
    *kept_gib = (rss - status_bytes("VmRSS:")) / (1024.0 * 1024.0 * 1024.0);
    fprintf(stderr, "the kept global plan: %.2f GiB resident\n", *kept_gib);
    return rc;
}

/*
 * PLAN_SIM_BLOBS=FILE keeps the gathered local plans in FILE (ranks,
 * tensors, mesh, lengths, bytes), so that repeated runs skip making them.
 */
static int load_blobs(int nranks, int ntensors, struct dcp_buf *all,
                      size_t *lens, size_t *displs)
{
    const char *path = getenv("PLAN_SIM_BLOBS");
    uint64_t hd[3], len, total = 0;
    FILE *f;
    int r, ok = 1;
    if (!path || !(f = fopen(path, "rb")))
        return 0;
    if (fread(hd, sizeof(hd), 1, f) != 1 || hd[0] != (uint64_t)nranks ||
        hd[1] != (uint64_t)ntensors || hd[2] != (uint64_t)mesh)
        ok = 0;
    for (r = 0; ok && r < nranks; r++) {
        ok = fread(&len, sizeof(len), 1, f) == 1;
        displs[r] = (size_t)total;
        lens[r] = (size_t)len;
        total += len;
    }
    if (ok)
        ok = dcp__buf_reserve(all, (size_t)total) == DCP_OK &&
             fread(all->p, 1, (size_t)total, f) == total;
    if (ok)
        all->len = (size_t)total;
    (void)fclose(f);
    return ok;
}

static void save_blobs(int nranks, int ntensors, const struct dcp_buf *all,
                       const size_t *lens)
{
    const char *path = getenv("PLAN_SIM_BLOBS");
    uint64_t hd[3] = {(uint64_t)nranks, (uint64_t)ntensors, (uint64_t)mesh};
    uint64_t len;
    FILE *f;
    int r, ok;
    if (!path || !(f = fopen(path, "wb")))
        return;
    ok = fwrite(hd, sizeof(hd), 1, f) == 1;
    for (r = 0; ok && r < nranks; r++) {
        len = lens[r];
        ok = fwrite(&len, sizeof(len), 1, f) == 1;
    }
    if (ok)
        ok = fwrite(all->p, 1, all->len, f) == all->len;
    if (fclose(f) || !ok)
        fprintf(stderr, "cannot write %s\n", path);
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void stat_json(const char *key, double *v, int n, const char *unit,
                      int last)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    printf("  \"%s\": {\"value\": %.4g, \"unit\": \"%s\", \"min\": %.4g, "
           "\"max\": %.4g}%s\n",
           key, v[n / 2], unit, v[0], v[n - 1], last ? "" : ",");
}

int main(int argc, char **argv)
{
    int nranks = argc > 1 ? atoi(argv[1]) : 4096;
    int ntensors = argc > 2 ? atoi(argv[2]) : 2000;
    int reps = argc > 3 ? atoi(argv[3]) : 3, r, k;
    struct dcp_buf all = {0};
    size_t *lens, *displs;
    double t0, *ps, *pk, *ds, *lp, *pc, *pcc;
    uint64_t fresh_hash = 0;
    double kept = 0;
    const char *clk = getenv("PLAN_SIM_CLOCK");
    if (clk && strcmp(clk, "cpu") == 0)
        sim_clock = CLOCK_PROCESS_CPUTIME_ID;
    mesh = getenv("PLAN_SIM_MESH") && strcmp(getenv("PLAN_SIM_MESH"), "1") == 0;
    if (nranks < 1 || ntensors < 1 || reps < 1 || reps > 100) {
        fprintf(stderr, "usage: plan_sim [ranks] [tensors] [reps]\n");
        return 2;
    }
    lens = calloc((size_t)nranks, sizeof(*lens));
    displs = calloc((size_t)nranks, sizeof(*displs));
    ps = calloc((size_t)reps, sizeof(double));
    pk = calloc((size_t)reps, sizeof(double));
    ds = calloc((size_t)reps, sizeof(double));
    lp = calloc((size_t)reps, sizeof(double));
    pc = calloc((size_t)reps, sizeof(double));
    pcc = calloc((size_t)reps, sizeof(double));
    t0 = now();
    if (!load_blobs(nranks, ntensors, &all, lens, displs)) {
        for (r = 0; r < nranks; r++) {
            displs[r] = all.len;
            if (local_plan(r, nranks, ntensors, &all, 1000, NULL) != DCP_OK) {
                fprintf(stderr, "local plan of rank %d failed\n", r);
                return 1;
            }
            lens[r] = all.len - displs[r];
        }
        save_blobs(nranks, ntensors, &all, lens);
    }
    fprintf(stderr, "local plans: %d ranks x %d tensors, %.1f MiB, %.2f s\n",
            nranks, ntensors, (double)all.len / 1048576.0, now() - t0);
    for (k = 0; k < reps; k++) {
        struct dcp_buf md = {0};
        struct dcp_metadata *dec = NULL;
        struct dcp_err err;
        size_t hits;
        double t1, w1, pw, dw;
        reset_peak();
        t1 = now();
        w1 = wall();
        if (coordinate(all.p, lens, displs, nranks, &md, NULL) != DCP_OK)
            return 1;
        ps[k] = now() - t1;
        pw = wall() - w1;
        if (k == 0)
            fresh_hash = dcp__fnv1a64(md.p, md.len);
        if (k == 0 && getenv("PLAN_SIM_DUMP")) { /* for byte comparisons */
            FILE *f = fopen(getenv("PLAN_SIM_DUMP"), "wb");
            if (!f || fwrite(md.p, 1, md.len, f) != md.len || fclose(f))
                return 1;
        }
        pk[k] = peak_rss() / (1024.0 * 1024.0 * 1024.0);
        t1 = now();
        w1 = wall();
        if (dcp__meta_decode(md.p, md.len, &dec, &err) != DCP_OK) {
            fprintf(stderr, "decode: %s\n", err.msg);
            return 1;
        }
        ds[k] = now() - t1;
        dw = wall() - w1;
        t1 = now();
        hits = load_plan(dec, nranks / 2, nranks, ntensors);
        lp[k] = (now() - t1) * 1e3;
        fprintf(stderr,
                "rep %d: plan+encode %.2f s (wall %.2f s, peak %.2f GiB), "
                ".metadata %.1f MiB, decode %.2f s (wall %.2f s), load plan "
                "%.1f ms (%zu chunks)\n",
                k, ps[k], pw, pk[k], (double)md.len / 1048576.0, ds[k], dw,
                lp[k], hits);
        dcp__meta_free(dec);
        dcp__buf_free(&md);
    }
    if (second_save(&all, lens, displs, nranks, ntensors, reps, pc, pcc,
                    fresh_hash, &kept) != DCP_OK)
        return 1;
    printf("{\n");
    stat_json("plan_sim_seconds", ps, reps, "s", 0);
    stat_json("plan_sim_peak_gib", pk, reps, "GiB", 0);
    stat_json("metadata_decode_seconds", ds, reps, "s", 0);
    stat_json("load_plan_ms", lp, reps, "ms", 0);
    stat_json("plan_cached_seconds", pc, reps, "s", 0);
    stat_json("plan_cached_commit_seconds", pcc, reps, "s", 0);
    stat_json("plan_cached_kept_gib", &kept, 1, "GiB", 1);
    printf("}\n");
    dcp__buf_free(&all);
    free(lens);
    free(displs);
    free(ps);
    free(pk);
    free(ds);
    free(lp);
    free(pc);
    free(pcc);
    return 0;
}
