/*
 * Allocation failure: for every k, the k-th allocation made by dcp fails
 * (dcp__alloc_fail_once: that one only; dcp__alloc_fail_after: it and all
 * later ones), in: a save over a committed checkpoint, a save into a new
 * directory, a load, a save and a load reusing cached plans, the
 * inspection API with dcp_verify, and each parser
 * alone (the pickle decoder, the metadata decoder and encoder, the
 * torch.save record reader, the value pickler and unpickler).
 * After each case: the call returned DCP_ENOMEM (or, where the failed
 * allocation's work was optional, DCP_OK with a correct result); a failed save
 * committed nothing (the old checkpoint loads bit-exact); no storage handle or
 * descriptor is left open. Memory leaks on these paths are caught by
 * LeakSanitizer in the ASan build. Prints "allocation failures: N handled (K
 * allocations ...)".
 */
#include <dcp/dcp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta.h"
#include "pickle.h"
#include "refstate.h"
#include "storage.h"
#include "torchzip.h"
#include "util.h"
#include "value.h"
#include "test.h"

static char root[256];
static long nhandled;
static int base_fds;

static const char *dirpath(const char *name)
{
    static char buf[512];
    if (!root[0]) {
        strcpy(root, "/tmp/dcp-alloc-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    snprintf(buf, sizeof(buf), "%s/%s", root, name);
    return buf;
}

/* One operation under test: prepare (no failure injected), run (counted),
 * check the outcome. */
struct op {
    const char *name;
    void (*prepare)(void);
    int (*run)(void);
    /* 0 or a description of what is wrong after run returned rc */
    const char *(*check)(int rc, int injected);
};

/* Runs op for every k, transient and persistent; fails the test on the
 * first bad outcome. Returns the clean run's allocation count. */
static uint64_t every_k(const struct op *op, char *why, size_t whylen,
                        const char **bad)
{
    uint64_t k, n;
    int mode;
    *bad = NULL;
    op->prepare();
    (void)dcp__alloc_fail_after(0);
    if (op->run() != DCP_OK) {
        *bad = "clean run failed";
        return 0;
    }
    n = dcp__alloc_fail_after(0);
    /* The clean run set up what a context keeps for the next call (its
     * I/O engine's io_uring descriptor): the count from here on. */
    base_fds = rs_nfds();
    for (mode = 0; mode < 2; mode++)
        for (k = 1; k <= n; k++) {
            const char *c;
            int rc;
            op->prepare();
            if (mode)
                (void)dcp__alloc_fail_after(k);
            else
                (void)dcp__alloc_fail_once(k);
            rc = op->run();
            (void)dcp__alloc_fail_after(0);
            nhandled++;
            /* Success is acceptable only when the failed allocation's
             * work was optional (freeing the replaced checkpoint's files
             * after the commit) and the result checks out. */
            c = rc != DCP_OK && rc != DCP_ENOMEM ? "not DCP_ENOMEM"
                : dcp__fs_open_handles() != 0    ? "storage handle leaked"
                : rs_nfds() != base_fds          ? "descriptor leaked"
                                                 : op->check(rc, 1);
            if (c) {
                snprintf(why, whylen,
                         "%s: allocation %llu of %llu (%s): %s "
                         "(rc %s)",
                         op->name, (unsigned long long)k, (unsigned long long)n,
                         mode ? "persistent" : "transient", c,
                         dcp_err_name(rc));
                *bad = why;
                return n;
            }
        }
    return n;
}

/* ------------------------------------------------------------- save */

static struct refstate news;
static dcp_ctx *ctx;
static int fresh;
static char last_msg[1024];

static void prep_save(void)
{
    const char *dir = dirpath("ckpt");
    rs_rmtree(dir);
    if (!fresh && rs_save(dir, RS_SEED_OLD, 0))
        abort();
}

static int run_save(void)
{
    int rc = dcp_save(ctx, news.st, dirpath("ckpt"), NULL);
    snprintf(last_msg, sizeof(last_msg), "%s", dcp_errmsg(ctx));
    return rc;
}

static const char *check_save(int rc, int injected)
{
    int got = rs_check(dirpath("ckpt"), NULL, 0);
    (void)injected;
    if (rc == DCP_OK)
        return got == RS_SEED_NEW ? NULL : "saved, but does not load";
    if (strstr(last_msg, "after .metadata was renamed"))
        return got == RS_SEED_NEW ? NULL : "renamed, but does not load";
    if (fresh)
        return got == DCP_ENOENT ? NULL : "failed, but committed";
    return got == RS_SEED_OLD ? NULL : "failed, old checkpoint lost";
}

/* ------------------------------------------------------------- load */

static struct refstate loaded, olds;

static void prep_load(void)
{
    memset(loaded.big, 0, sizeof(loaded.big));
}

static int run_load(void)
{
    return dcp_load(ctx, loaded.st, dirpath("base"), NULL);
}

static const char *check_load(int rc, int injected)
{
    (void)injected;
    if (rc == DCP_OK && !rs_equal(&loaded, &olds))
        return "loaded, but wrong data";
    return NULL;
}

/* ------------------------------------- with the plan caches in use */

/* A save and a load on the context first, so that the run reuses their
 * plans (save.c, load.c): a failure there must leave no cache that could
 * be wrong (the next clean run checks the result again). */
static int cached_runs; /* the first run is every_k's clean one */

static void prep_save_cached(void)
{
    dcp_save_options so = {sizeof(so), 1, 0, NULL};
    fresh = 0;
    prep_save();
    if (dcp_save(ctx, news.st, dirpath("warm"), &so) != DCP_OK)
        abort();
}

/* The clean run must use the cache (or the test tests nothing); an
 * injected failure may make it plan afresh instead (optional work). */
static int run_save_cached(void)
{
    int rc = run_save();
    if (cached_runs++ == 0 && !dcp_ctx_plan_cached(ctx, DCP_IO_SAVE))
        return DCP_EINVAL;
    return rc;
}

static void prep_load_cached(void)
{
    if (dcp_load(ctx, loaded.st, dirpath("base"), NULL) != DCP_OK)
        abort();
    prep_load();
}

static int run_load_cached(void)
{
    int rc = run_load();
    if (cached_runs++ == 0 && !dcp_ctx_plan_cached(ctx, DCP_IO_LOAD))
        return DCP_EINVAL;
    return rc;
}

/* ------------------------------------------------ inspection, verify */

static int run_inspect(void)
{
    dcp_metadata *md = NULL;
    dcp_value *v = NULL;
    static uint16_t big[256 * 160];
    long i;
    int rc = dcp_metadata_open(ctx, dirpath("base"), &md);
    if (rc == DCP_OK) {
        i = dcp_metadata_find(md, "model.big");
        rc = i < 0 ? DCP_EKEY
                   : dcp_metadata_read_box(ctx, md, (size_t)i, NULL, NULL, big,
                                           sizeof(big), 1);
    }
    if (rc == DCP_OK) {
        i = dcp_metadata_find(md, "note");
        rc = i < 0 ? DCP_EKEY : dcp_metadata_read_value(ctx, md, (size_t)i, &v);
    }
    dcp_value_free(v);
    dcp_metadata_free(md);
    if (rc == DCP_OK)
        rc = dcp_verify(ctx, dirpath("base"));
    return rc;
}

static const char *check_none(int rc, int injected)
{
    (void)rc;
    (void)injected;
    return NULL;
}

static void prep_none(void)
{
}

/* ---------------------------------------------------------- parsers */

static uint8_t *md_bytes, *rec_bytes;
static size_t md_len, rec_len;

static int run_meta_decode(void)
{
    struct dcp_metadata *md = NULL;
    struct dcp_buf b = {0};
    struct dcp_err err;
    int rc = dcp__meta_decode(md_bytes, md_len, &md, &err);
    if (rc == DCP_OK)
        rc = dcp__meta_encode(md, &b);
    dcp__buf_free(&b);
    dcp__meta_free(md);
    return rc;
}

static int run_pickle(void)
{
    static const struct pk_global allow[] = {
        {"torch.distributed.checkpoint.metadata", "Metadata"}};
    struct pk_arena *a = NULL;
    struct pk_node *root_node = NULL;
    struct dcp_err err;
    int rc =
        dcp__pk_decode(md_bytes, md_len, allow, 1, NULL, 0, &a, &root_node, &err);
    dcp__pk_arena_free(a);
    /* The metadata names classes beyond this one-entry list. */
    return rc == DCP_EUNSAFE ? DCP_OK : rc;
}

struct mem {
    const uint8_t *p;
    size_t n;
};

static int mem_read(void *o, uint64_t off, void *buf, size_t len,
                    struct dcp_err *err)
{
    const struct mem *m = o;
    if (off > m->n || len > m->n - off)
        return dcp__err(err, DCP_ECORRUPT, "past the end");
    memcpy(buf, m->p + off, len);
    return DCP_OK;
}

static int run_record(void)
{
    static struct tz_archive a;
    struct mem m = {rec_bytes, rec_len};
    const struct tz_entry *e;
    struct tz_tensor t;
    struct dcp_err err;
    uint8_t *pkl = NULL;
    int rc = dcp__tz_open(&a, rec_len, mem_read, &m, &err);
    if (rc != DCP_OK)
        return rc;
    e = dcp__tz_find(&a, "data.pkl");
    if (!e)
        return DCP_EFORMAT;
    rc = dcp__tz_read_entry(&a, e, 1 << 20, 1, mem_read, &m, &pkl, &err);
    if (rc == DCP_OK)
        rc = dcp__tz_parse_tensor_pickle(pkl, (size_t)e->size, &t, &err);
    dcp__free(pkl);
    return rc;
}

static dcp_value *sample_value;

static int run_value(void)
{
    struct dcp_buf b = {0};
    dcp_value *v = NULL, *c;
    struct dcp_err err;
    int rc = dcp__value_pickle(sample_value, &b);
    if (rc == DCP_OK)
        rc = dcp__value_unpickle(b.p, b.len, &v, &err);
    if (rc == DCP_OK && !dcp_value_equal(v, sample_value))
        rc = DCP_EFORMAT;
    c = rc == DCP_OK ? dcp_value_copy(v) : NULL;
    if (rc == DCP_OK && !c)
        rc = DCP_ENOMEM;
    dcp_value_free(c);
    dcp_value_free(v);
    dcp__buf_free(&b);
    return rc;
}

static uint8_t *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    uint8_t *p;
    long n;
    if (!f)
        abort();
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    p = malloc((size_t)n + 1);
    if (!p || fread(p, 1, (size_t)n, f) != (size_t)n)
        abort();
    fclose(f);
    *len = (size_t)n;
    return p;
}

/* ------------------------------------------------------------ tests */

#define EVERY_K(op)                                                     \
    do {                                                                \
        char why_[1024];                                                \
        const char *bad_;                                               \
        uint64_t n_ = every_k(&(op), why_, sizeof(why_), &bad_);        \
        if (bad_)                                                       \
            FAIL_AT_("%s", bad_);                                       \
        printf("allocations in %-22s %llu (each failed, transient and " \
               "persistent)\n",                                         \
               (op).name, (unsigned long long)n_);                      \
    } while (0)

TEST(save_over_committed)
{
    struct op op = {"save over a checkpoint", prep_save, run_save, check_save};
    fresh = 0;
    EVERY_K(op);
}

TEST(save_new_directory)
{
    struct op op = {"save, new directory", prep_save, run_save, check_save};
    fresh = 1;
    EVERY_K(op);
}

TEST(load)
{
    struct op op = {"load", prep_load, run_load, check_load};
    EVERY_K(op);
}

TEST(cached_plans)
{
    struct op ops[] = {{"save with a cached plan", prep_save_cached,
                        run_save_cached, check_save},
                       {"load with a cached plan", prep_load_cached,
                        run_load_cached, check_load}};
    size_t i;
    for (i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        cached_runs = 0;
        EVERY_K(ops[i]);
    }
}

TEST(inspect_and_verify)
{
    struct op op = {"inspect + verify", prep_none, run_inspect, check_none};
    EVERY_K(op);
}

TEST(parsers)
{
    struct op ops[] = {
        {"metadata decode+encode", prep_none, run_meta_decode, check_none},
        {"pickle decoder", prep_none, run_pickle, check_none},
        {"torch.save record", prep_none, run_record, check_none},
        {"value pickle round trip", prep_none, run_value, check_none}};
    size_t i;
    for (i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
        EVERY_K(ops[i]);
}

int main(void)
{
    char path[600];
    dcp_metadata *md;
    dcp_chunk_info c;
    uint8_t *data;
    size_t dlen;
    int rc;
    base_fds = rs_nfds();
    if (dcp_ctx_create(&ctx, NULL, NULL) || rs_build(&news, RS_SEED_NEW) ||
        rs_build(&loaded, 0) || rs_build(&olds, RS_SEED_OLD) ||
        rs_save(dirpath("base"), RS_SEED_OLD, 0))
        abort();
    snprintf(path, sizeof(path), "%s/.metadata", dirpath("base"));
    md_bytes = slurp(path, &md_len);
    if (dcp_metadata_open(ctx, dirpath("base"), &md) ||
        dcp_metadata_chunk(md, (size_t)dcp_metadata_find(md, "model.vec"), 0,
                           &c))
        abort();
    snprintf(path, sizeof(path), "%s/%s", dirpath("base"), c.file);
    data = slurp(path, &dlen);
    rec_len = (size_t)c.length;
    rec_bytes = malloc(rec_len);
    memcpy(rec_bytes, data + c.offset, rec_len);
    free(data);
    dcp_metadata_free(md);
    sample_value = dcp_value_dict();
    if (!sample_value ||
        dcp_value_dict_set(sample_value, "a", dcp_value_int(1)) ||
        dcp_value_dict_set(sample_value, "b", dcp_value_str("text")) ||
        dcp_value_dict_set(sample_value, "c", dcp_value_list()) ||
        dcp_value_dict_set(sample_value, "d", dcp_value_bytes("\x00\x01", 2)))
        abort();
    RUN(save_over_committed);
    RUN(save_new_directory);
    RUN(load);
    RUN(cached_plans);
    RUN(inspect_and_verify);
    RUN(parsers);
    printf("allocation failures: %ld handled\n", nhandled);
    dcp_value_free(sample_value);
    free(md_bytes);
    free(rec_bytes);
    rs_free(&news);
    rs_free(&loaded);
    rs_free(&olds);
    dcp_ctx_free(ctx);
    if (root[0])
        rs_rmtree(root);
    rc = TEST_SUMMARY();
    return rc;
}
