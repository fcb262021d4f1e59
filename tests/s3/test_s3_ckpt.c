/*
 * Checkpoints on s3:// paths against a real server (moto, started by
 * tests/s3/s3_env.py with the fault proxy): save and load bit-exact through
 * the S3 back end (multipart data objects, async save, export/import), the
 * storage contract v2 members the lock relies on (exclusive publish, list,
 * delete, multipart begin/complete/abort), and bad input: a failed or
 * killed save commits nothing and leaves the old checkpoint loadable, no
 * multipart upload left by a failed one, and the uploads a killed one left
 * are aborted by dcp_clean and by the next save (others' kept); a lying or cut or stalled server
 * gives a clear error naming the object, never a hang; odd object names; a
 * prefix that holds something else; a missing bucket; wrong credentials
 * (with --auth).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>
#include <dcp/dcp_manager.h>
#include <dcp/dcp_s3.h>

#include "load.h"
#include "manager.h"
#include "s3.h"
#include "storage.h"
#include "test.h"

static const char *bucket;
static char url[512];

static const char *at(const char *prefix)
{
    (void)snprintf(url, sizeof(url), "s3://%s/%s", bucket, prefix);
    return url;
}

/* The process's S3 settings: through the proxy or not, attempts, budget. */
static void cfg(int via_proxy, unsigned attempts, long budget_ms)
{
    dcp_s3_config c;
    memset(&c, 0, sizeof(c));
    c.struct_size = sizeof(c);
    c.endpoint = via_proxy ? getenv("DCP_S3_PROXY") : NULL;
    c.part_size = 5u << 20;
    c.max_attempts = attempts;
    c.retry_budget_ms = budget_ms;
    c.stall_timeout_ms = 1000;
    c.connect_timeout_ms = 2000;
    c.backoff_base_ms = 10;
    c.backoff_cap_ms = 200;
    if (dcp_s3_configure(&c) != DCP_OK)
        fprintf(stderr, "dcp_s3_configure failed\n");
}

/* The next n requests mode applies to get it, after skip of them pass. */
static void faults_after(const char *mode, int n, int skip)
{
    FILE *f = fopen(getenv("DCP_S3_FAULTS"), "w");
    if (!f)
        return;
    if (mode)
        fprintf(f, "%s %d %d\n", mode, n, skip);
    fclose(f);
}

static void faults(const char *mode, int n)
{
    faults_after(mode, n, 0);
}

static struct dcp__s3 *client(void)
{
    struct dcp__s3_config c = {0};
    struct dcp__s3 *s3 = NULL;
    struct dcp_err err = {0};
    if (dcp__s3_create(&c, bucket, &s3, &err) != DCP_OK)
        fprintf(stderr, "client: %s\n", err.msg);
    return s3;
}

static size_t uploads(const char *prefix)
{
    struct dcp__s3 *s3 = client();
    struct dcp_err err = {0};
    size_t n = 999;
    if (s3 && dcp__s3_count_uploads(s3, prefix, &n, &err) != DCP_OK)
        n = 998;
    dcp__s3_free(s3);
    return n;
}

/* Starts a multipart upload of key and leaves it in progress. */
static int begin_upload(const char *key)
{
    struct dcp__s3 *s3 = client();
    struct dcp_err err = {0};
    char upid[DCP__S3_UPID_MAX];
    int ok = s3 && dcp__s3_mpu_create(s3, key, upid, sizeof(upid), &err) ==
                       DCP_OK;
    if (!ok)
        fprintf(stderr, "begin_upload %s: %s\n", key, err.msg);
    dcp__s3_free(s3);
    return ok;
}

static int count_fn(const char *key, int64_t size, void *ud)
{
    (void)key;
    (void)size;
    (*(size_t *)ud)++;
    return 0;
}

static size_t nkeys(const char *prefix)
{
    struct dcp__s3 *s3 = client();
    struct dcp_err err = {0};
    size_t n = 0;
    if (!s3 || dcp__s3_list(s3, prefix, 100000, count_fn, &n, &err) != DCP_OK)
        n = 9999;
    dcp__s3_free(s3);
    return n;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ----------------------------------------------------------- the state */

/* A state of seed: "w" float32 of nw elements, "b" int64[7], value "step". */
struct st {
    dcp_state *st;
    float *w;
    int64_t *b;
    int64_t nw;
};

static void fill(struct st *s, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (int64_t i = 0; i < s->nw; i++) {
        x = x * 1664525u + 1013904223u;
        s->w[i] = (float)(x >> 8) * (1.0f / 16777216.0f) + (float)seed;
    }
    for (int i = 0; i < 7; i++)
        s->b[i] = (int64_t)seed * 1000 + i;
}

static int st_make(struct st *s, int64_t nw, unsigned seed, int for_load)
{
    int64_t off = 0, sw[1] = {nw}, sb[1] = {7};
    memset(s, 0, sizeof(*s));
    s->nw = nw;
    s->w = calloc((size_t)(nw ? nw : 1), sizeof(float));
    s->b = calloc(7, sizeof(int64_t));
    if (!s->w || !s->b || dcp_state_create(&s->st) != DCP_OK)
        return -1;
    if (!for_load)
        fill(s, seed);
    if (dcp_state_add_tensor(s->st, "w", DCP_F32, 1, sw, &off, sw, s->w,
                             DCP_MEM_HOST) != DCP_OK ||
        dcp_state_add_tensor(s->st, "b", DCP_I64, 1, sb, &off, sb, s->b,
                             DCP_MEM_HOST) != DCP_OK ||
        dcp_state_add_value(s->st, "step", dcp_value_int(for_load ? 0 : seed)))
        return -1;
    return 0;
}

static void st_free(struct st *s)
{
    dcp_state_free(s->st);
    free(s->w);
    free(s->b);
}

static int save(dcp_ctx *ctx, const char *path, int64_t nw, unsigned seed)
{
    struct st s;
    int rc = st_make(&s, nw, seed, 0);
    if (rc == 0)
        rc = dcp_save(ctx, s.st, path, NULL);
    if (rc != DCP_OK)
        fprintf(stderr, "  save %s: %s: %s\n", path, dcp_err_name(rc),
                dcp_errmsg(ctx));
    st_free(&s);
    return rc;
}

/* Loads path; *seed_out gets the seed it matches bit-exact, 0 for none. */
static int load(dcp_ctx *ctx, const char *path, int64_t nw, unsigned *seed_out)
{
    struct st s, want;
    int rc = st_make(&s, nw, 0, 1);
    *seed_out = 0;
    if (rc == 0)
        rc = dcp_load(ctx, s.st, path, NULL);
    if (rc == DCP_OK) {
        unsigned seed =
            (unsigned)dcp_value_as_int(dcp_state_value(s.st, "step"));
        if (st_make(&want, nw, seed, 0) == 0 &&
            memcmp(want.w, s.w, (size_t)nw * sizeof(float)) == 0 &&
            memcmp(want.b, s.b, 7 * sizeof(int64_t)) == 0)
            *seed_out = seed;
        st_free(&want);
    }
    st_free(&s);
    return rc;
}

#define BIG ((int64_t)3 * 1024 * 1024 + 77) /* 12 MiB + : 3 parts of 5 MiB */

/* A save of n elements to prefix (a checkpoint of seed old there) under
 * the fault mode (after skip requests pass) fails with want, its message
 * naming the prefix and text; nothing committed: no upload left, the old
 * checkpoint loads. */
static void save_fails(dcp_ctx *ctx, const char *prefix, int64_t n,
                       const char *mode, int skip, int want, const char *text,
                       unsigned old)
{
    char pfx[256];
    unsigned got;
    int rc;
    (void)snprintf(pfx, sizeof(pfx), "%s/", prefix);
    faults_after(mode, 100000, skip);
    rc = save(ctx, at(prefix), n, old + 100);
    faults(NULL, 0);
    ASSERT_EQ(rc, want);
    ASSERT(strstr(dcp_errmsg(ctx), prefix));
    ASSERT(strstr(dcp_errmsg(ctx), text));
    ASSERT_EQ(uploads(pfx), 0);
    ASSERT_EQ(load(ctx, at(prefix), n, &got), DCP_OK);
    ASSERT_EQ(got, old);
}

/* ---------------------------------------------- records fetched whole */

#define NREC 24

/* Elements of record i: small records, some across a part (8 MiB), one
 * above the 32 MiB a load hints whole. */
static int64_t rec_n(int i)
{
    static const int64_t n[] = {3, 2500, 70000, 300000, 800000,
                                (int64_t)2300000, 40000};
    return i == 5 ? (int64_t)9 << 20 : n[i % 7]; /* 36 MiB */
}

static int recs_make(dcp_state **st, float **bufs, unsigned seed, int for_load)
{
    int64_t off = 0;
    char key[16];
    if (dcp_state_create(st) != DCP_OK)
        return -1;
    for (int i = 0; i < NREC; i++) {
        int64_t n[1] = {rec_n(i)};
        bufs[i] = calloc((size_t)n[0], sizeof(float));
        if (!bufs[i])
            return -1;
        for (int64_t k = 0; !for_load && k < n[0]; k++)
            bufs[i][k] = (float)(seed * 131u + (unsigned)i * 7u) + (float)k;
        (void)snprintf(key, sizeof(key), "r%02d", i);
        if (dcp_state_add_tensor(*st, key, DCP_F32, 1, n, &off, n, bufs[i],
                                 DCP_MEM_HOST) != DCP_OK)
            return -1;
    }
    return 0;
}

static void recs_free(dcp_state *st, float **bufs)
{
    dcp_state_free(st);
    for (int i = 0; i < NREC; i++)
        free(bufs[i]);
}

/* Loads path into a fresh state: 1 when it is seed's bit-exact. */
static int recs_load(dcp_ctx *ctx, const char *path, unsigned seed, int *rc)
{
    dcp_state *st = NULL, *want = NULL;
    float *got[NREC] = {0}, *exp[NREC] = {0};
    int same = 0;
    if (recs_make(&st, got, 0, 1) == 0 && recs_make(&want, exp, seed, 0) == 0) {
        *rc = dcp_load(ctx, st, path, NULL);
        same = *rc == DCP_OK;
        for (int i = 0; same && i < NREC; i++)
            same = memcmp(got[i], exp[i], (size_t)rec_n(i) * 4) == 0;
        if (*rc != DCP_OK)
            fprintf(stderr, "  load %s: %s: %s\n", path, dcp_err_name(*rc),
                    dcp_errmsg(ctx));
    }
    recs_free(st, got);
    recs_free(want, exp);
    return same;
}

static int find_distcp(const char *key, int64_t size, void *ud)
{
    (void)size;
    if (strstr(key, ".distcp"))
        (void)snprintf(ud, 512, "%s", key);
    return 0;
}

/* A load fetches each record it reads whole with its headers in one
 * request, neighbouring records together: about one GET per part's worth
 * of bytes, not three per record; in rounds, bit-exact; a flipped byte in
 * fetched data is still a CRC error naming the key. */
TEST(whole_records)
{
    dcp_ctx *ctx;
    dcp_state *st = NULL;
    float *bufs[NREC] = {0};
    char key[512] = "";
    struct dcp__s3 *s3;
    struct dcp_err err = {0};
    uint64_t g0, total = 0;
    void *obj = NULL;
    size_t olen = 0;
    int rc;
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(recs_make(&st, bufs, 3, 0), 0);
    ASSERT_EQ(dcp_save(ctx, st, at("ck/whole"), NULL), DCP_OK);
    recs_free(st, bufs);
    for (int i = 0; i < NREC; i++)
        total += (uint64_t)rec_n(i) * 4;
    g0 = dcp__s3_requests(1);
    ASSERT(recs_load(ctx, at("ck/whole"), 3, &rc));
    /* A listing and .metadata, then the data in ranges of at most
     * 8 MiB cut at multiples of 8 MiB (two runs of records around the
     * 36 MiB one, which is read as its own 5 pieces): about one GET per
     * 8 MiB, where each record used to cost two or three. */
    {
        uint64_t gets = dcp__s3_requests(1) - g0;
        uint64_t bound = total / ((uint64_t)8 << 20) + 3 + 9;
        if (gets > bound)
            fprintf(stderr, "  %llu GETs for %d records, %llu bytes\n",
                    (unsigned long long)gets, NREC,
                    (unsigned long long)total);
        ASSERT(gets <= bound);
        ASSERT(gets < NREC);
    }
    /* .metadata is read with one bounded GET: over the context's limit,
     * DCP_ELIMIT */
    {
        dcp_ctx_options co;
        dcp_ctx *small;
        memset(&co, 0, sizeof(co));
        co.struct_size = sizeof(co);
        co.max_metadata_bytes = 64;
        ASSERT_EQ(dcp_ctx_create(&small, NULL, &co), DCP_OK);
        ASSERT(!recs_load(small, at("ck/whole"), 3, &rc));
        ASSERT_EQ(rc, DCP_ELIMIT);
        dcp_ctx_free(small);
    }
    /* in rounds of 1 MiB hinted: held memory bounded, the same bytes */
    dcp__load_hint_round = (uint64_t)1 << 20;
    ASSERT(recs_load(ctx, at("ck/whole"), 3, &rc));
    dcp__load_hint_round = 0;
    /* a byte of a record's data flipped on the server */
    s3 = client();
    ASSERT(s3);
    ASSERT_EQ(dcp__s3_list(s3, "ck/whole/", 1000, find_distcp, key, &err),
              DCP_OK);
    ASSERT(key[0]);
    ASSERT_EQ(dcp__s3_get(s3, key, (size_t)1 << 30, &obj, &olen, &err), DCP_OK);
    ASSERT(olen > total);
    /* r05 spans bytes 4.7 to 42.4 MiB: two thirds in are records after it,
     * hinted whole */
    ((uint8_t *)obj)[olen / 3 * 2] ^= 0x10;
    ASSERT_EQ(dcp__s3_put(s3, key, obj, olen, 0, &err), DCP_OK);
    dcp__free(obj);
    dcp__s3_free(s3);
    ASSERT(!recs_load(ctx, at("ck/whole"), 3, &rc));
    ASSERT_EQ(rc, DCP_ECORRUPT);
    ASSERT(strstr(dcp_errmsg(ctx), "CRC mismatch"));
    ASSERT(!strstr(dcp_errmsg(ctx), "'r05'"));
    dcp_ctx_free(ctx);
}

/* ---------------------------------------------------------------- tests */

TEST(roundtrip)
{
    dcp_ctx *ctx;
    dcp_request *req = NULL;
    struct st s;
    unsigned got;
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(save(ctx, at("ck/rt"), BIG, 1), DCP_OK);
    ASSERT_EQ(load(ctx, at("ck/rt"), BIG, &got), DCP_OK);
    ASSERT_EQ(got, 1);
    ASSERT_EQ(nkeys("ck/rt/"), 2); /* .metadata, __0_0.distcp */
    ASSERT_EQ(uploads("ck/rt/"), 0);
    /* with a trailing slash, and empty tensors */
    ASSERT_EQ(save(ctx, at("ck/rt0/"), 0, 5), DCP_OK);
    ASSERT_EQ(load(ctx, at("ck/rt0"), 0, &got), DCP_OK);
    ASSERT_EQ(got, 5);
    /* asynchronous */
    ASSERT_EQ(st_make(&s, BIG, 2, 0), 0);
    ASSERT_EQ(dcp_save_async(ctx, s.st, at("ck/async"), NULL, &req), DCP_OK);
    ASSERT_EQ(dcp_request_wait(req), DCP_OK);
    dcp_request_free(req);
    st_free(&s);
    ASSERT_EQ(load(ctx, at("ck/async"), BIG, &got), DCP_OK);
    ASSERT_EQ(got, 2);
    ASSERT_EQ(dcp_verify(ctx, at("ck/async")), DCP_OK);
    dcp_ctx_free(ctx);
}

TEST(export_import)
{
    dcp_ctx *ctx;
    char file[] = "/tmp/dcp-s3-exp-XXXXXX";
    unsigned got;
    int fd = mkstemp(file);
    ASSERT(fd >= 0);
    close(fd);
    unlink(file);
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(save(ctx, at("ck/exp"), 1000, 3), DCP_OK);
    ASSERT_EQ(dcp_export(ctx, at("ck/exp"), file, NULL, NULL), DCP_OK);
    ASSERT_EQ(dcp_import(ctx, file, at("ck/imp"), NULL, NULL), DCP_OK);
    unlink(file);
    ASSERT_EQ(load(ctx, at("ck/imp"), 1000, &got), DCP_OK);
    ASSERT_EQ(got, 3);
    /* a second import onto a checkpoint is refused */
    ASSERT_EQ(dcp_export(ctx, at("ck/exp"), file, NULL, NULL), DCP_OK);
    ASSERT_EQ(dcp_import(ctx, file, at("ck/imp"), NULL, NULL), DCP_EEXIST);
    unlink(file);
    ASSERT_EQ(load(ctx, at("ck/imp"), 1000, &got), DCP_OK); /* untouched */
    ASSERT_EQ(got, 3);
    dcp_ctx_free(ctx);
}

TEST(overwrite_and_failed_saves)
{
    dcp_ctx *ctx;
    unsigned got;
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(save(ctx, at("ck/ow"), BIG, 1), DCP_OK);
    ASSERT_EQ(save(ctx, at("ck/ow"), BIG, 2), DCP_OK);
    ASSERT_EQ(load(ctx, at("ck/ow"), BIG, &got), DCP_OK);
    ASSERT_EQ(got, 2);
    ASSERT_EQ(nkeys("ck/ow/"), 2); /* the old data object removed */
    /* every PUT (parts, whole objects) refused with SlowDown: fails, the
     * uploads aborted, the old checkpoint intact */
    cfg(1, 2, 5000);
    save_fails(ctx, "ck/ow", BIG, "slowdown_put", 0, DCP_EIO, "SlowDown", 2);
    ASSERT_EQ(nkeys("ck/ow/"), 2);
    /* the network cut during the save: every connection reset */
    save_fails(ctx, "ck/ow", BIG, "reset", 0, DCP_EIO, "reset", 2);
    /* a server that answers PUTs with a wrong ETag: the lock's exclusive
     * PUT (small: Content-MD5, the ETag checked) is sent again, refused as
     * existing, and found ours by its bytes; the parts (checksums: the CRC
     * was the check) go up and the completion refuses the part list;
     * without checksums every ETag must be the MD5 sent: not trusted */
    save_fails(ctx, "ck/ow", BIG, "badetag", 0, DCP_EINVAL, "InvalidPart", 2);
    setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required", 1);
    save_fails(ctx, "ck/ow", BIG, "badetag", 0, DCP_ECORRUPT, "ETag", 2);
    unsetenv("AWS_REQUEST_CHECKSUM_CALCULATION");
    /* a server that states a CRC32 other than the one sent */
    save_fails(ctx, "ck/ow", BIG, "badcrc", 0, DCP_ECORRUPT, "CRC32", 2);
    /* the server's own checksum refusing a body (400 BadDigest): sent
     * again; for ever, DCP_ECORRUPT naming it, nothing committed */
    save_fails(ctx, "ck/ow", BIG, "baddigest", 0, DCP_ECORRUPT, "BadDigest", 2);
    cfg(1, 8, 30000);
    faults("baddigest", 2);
    ASSERT_EQ(save(ctx, at("ck/ow"), BIG, 8), DCP_OK);
    faults(NULL, 0);
    ASSERT_EQ(load(ctx, at("ck/ow"), BIG, &got), DCP_OK);
    ASSERT_EQ(got, 8);
    /* SlowDown a few times: retried, the save goes through */
    cfg(1, 8, 30000);
    faults("slowdown", 3);
    ASSERT_EQ(save(ctx, at("ck/ow"), BIG, 5), DCP_OK);
    faults(NULL, 0);
    ASSERT_EQ(load(ctx, at("ck/ow"), BIG, &got), DCP_OK);
    ASSERT_EQ(got, 5);
    cfg(0, 4, 30000);
    dcp_ctx_free(ctx);
}

/* Parts go up from the file's senders while the writes go on: with two
 * senders a 30 MiB tensor (6 parts of 5 MiB, one write) waits for room;
 * parts failing after the first few fail the save with the server's
 * error, the parts still queued dropped, the upload aborted. */
TEST(parts_in_parallel)
{
    const int64_t n = (int64_t)15 << 19; /* 30 MiB of floats */
    dcp_s3_config c;
    dcp_ctx *ctx;
    unsigned got;
    memset(&c, 0, sizeof(c));
    c.struct_size = sizeof(c);
    c.endpoint = getenv("DCP_S3_PROXY");
    c.part_size = 5u << 20;
    c.max_inflight = 2;
    c.max_attempts = 2;
    c.retry_budget_ms = 5000;
    c.stall_timeout_ms = 1000;
    c.connect_timeout_ms = 2000;
    c.backoff_base_ms = 10;
    c.backoff_cap_ms = 100;
    ASSERT_EQ(dcp_s3_configure(&c), DCP_OK);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(save(ctx, at("ck/par"), n, 1), DCP_OK);
    ASSERT_EQ(load(ctx, at("ck/par"), n, &got), DCP_OK);
    ASSERT_EQ(got, 1);
    ASSERT_EQ(uploads("ck/par/"), 0);
    /* the lock's PUT and three parts pass, then every PUT is refused */
    save_fails(ctx, "ck/par", n, "slowdown_put", 4, DCP_EIO, "SlowDown", 1);
    ASSERT_EQ(nkeys("ck/par/"), 2);
    /* one sender, the server's checksum refusing the fifth part for good:
     * DCP_ECORRUPT, nothing committed */
    c.max_inflight = 1;
    ASSERT_EQ(dcp_s3_configure(&c), DCP_OK);
    save_fails(ctx, "ck/par", n, "baddigest", 5, DCP_ECORRUPT, "BadDigest", 1);
    ASSERT_EQ(save(ctx, at("ck/par"), n, 4), DCP_OK);
    ASSERT_EQ(load(ctx, at("ck/par"), n, &got), DCP_OK);
    ASSERT_EQ(got, 4);
    cfg(0, 4, 30000);
    dcp_ctx_free(ctx);
}

TEST(load_faults)
{
    static const char *const once[] = {"truncate", "badlen", "reset",
                                       "slowdown"};
    dcp_ctx *ctx;
    unsigned got;
    double t0;
    int rc;
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(save(ctx, at("ck/lf"), BIG, 7), DCP_OK);
    /* each fault twice: retried, bytes exact */
    cfg(1, 4, 30000);
    for (size_t i = 0; i < sizeof(once) / sizeof(once[0]); i++) {
        faults(once[i], 2);
        rc = load(ctx, at("ck/lf"), BIG, &got);
        faults(NULL, 0);
        if (rc != DCP_OK || got != 7)
            fprintf(stderr, "  %s: %s %s\n", once[i], dcp_err_name(rc),
                    dcp_errmsg(ctx));
        ASSERT_EQ(rc, DCP_OK);
        ASSERT_EQ(got, 7);
    }
    /* for ever: a clear error naming the object */
    cfg(1, 2, 5000);
    faults("truncate", 100000);
    rc = load(ctx, at("ck/lf"), BIG, &got);
    faults(NULL, 0);
    if (rc != DCP_ECORRUPT || !strstr(dcp_errmsg(ctx), "ck/lf"))
        fprintf(stderr, "  truncate: %s\n", dcp_errmsg(ctx));
    ASSERT_EQ(rc, DCP_ECORRUPT);
    ASSERT(strstr(dcp_errmsg(ctx), "ck/lf"));
    faults("reset", 100000);
    rc = load(ctx, at("ck/lf"), BIG, &got);
    faults(NULL, 0);
    if (rc != DCP_EIO || !strstr(dcp_errmsg(ctx), "ck/lf"))
        fprintf(stderr, "  reset: %s\n", dcp_errmsg(ctx));
    ASSERT_EQ(rc, DCP_EIO);
    ASSERT(strstr(dcp_errmsg(ctx), "ck/lf"));
    /* a server that stops answering: cut by the stall timeout, no hang */
    t0 = now_s();
    faults("stall", 100000);
    rc = load(ctx, at("ck/lf"), BIG, &got);
    faults(NULL, 0);
    ASSERT(rc == DCP_ETIMEOUT || rc == DCP_EIO);
    ASSERT(now_s() - t0 < 30);
    /* and a stalled save: nothing committed */
    t0 = now_s();
    faults("stall", 100000);
    rc = save(ctx, at("ck/lf"), BIG, 8);
    faults(NULL, 0);
    ASSERT(rc == DCP_ETIMEOUT || rc == DCP_EIO);
    ASSERT(now_s() - t0 < 60);
    cfg(0, 4, 30000);
    ASSERT_EQ(load(ctx, at("ck/lf"), BIG, &got), DCP_OK);
    ASSERT_EQ(got, 7);
    dcp_ctx_free(ctx);
}

TEST(bad_places)
{
    dcp_ctx *ctx;
    unsigned got;
    struct dcp__s3 *s3;
    struct dcp_err err = {0};
    const char *odd = "ck/odd name+\xc3\xbc=%~,;'()!*$&@";
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    /* a missing bucket */
    ASSERT_EQ(load(ctx, "s3://dcp-no-such-bucket/x", 10, &got), DCP_ENOENT);
    ASSERT(strstr(dcp_errmsg(ctx), "dcp-no-such-bucket"));
    ASSERT_EQ(save(ctx, "s3://dcp-no-such-bucket/x", 10, 1), DCP_ENOENT);
    /* not a bucket name, not a valid key */
    ASSERT_EQ(save(ctx, "s3://A_B/x", 10, 1), DCP_EINVAL);
    ASSERT_EQ(save(ctx, "s3://dcp-test/x\ny", 10, 1), DCP_EINVAL);
    /* no checkpoint at the prefix */
    ASSERT_EQ(load(ctx, at("ck/none"), 10, &got), DCP_ENOENT);
    ASSERT(strstr(dcp_errmsg(ctx), ".metadata"));
    /* odd characters */
    ASSERT_EQ(save(ctx, at(odd), 1000, 6), DCP_OK);
    ASSERT_EQ(load(ctx, at(odd), 1000, &got), DCP_OK);
    ASSERT_EQ(got, 6);
    /* a prefix that holds something else */
    s3 = client();
    ASSERT(s3);
    ASSERT_EQ(dcp__s3_put(s3, "ck/other/readme.txt", "hello", 5, 0, &err),
              DCP_OK);
    ASSERT_EQ(
        dcp__s3_put(s3, "ck/other/.metadata", "not a checkpoint", 16, 0, &err),
        DCP_OK);
    ASSERT_EQ(dcp__s3_put(s3, "ck/other/sub/__0_0.distcp", "x", 1, 0, &err),
              DCP_OK);
    ASSERT(load(ctx, at("ck/other"), 1000, &got) != DCP_OK);
    ASSERT(strstr(dcp_errmsg(ctx), ".metadata"));
    ASSERT_EQ(save(ctx, at("ck/other"), 1000, 9), DCP_OK);
    ASSERT_EQ(load(ctx, at("ck/other"), 1000, &got), DCP_OK);
    ASSERT_EQ(got, 9);
    ASSERT_EQ(nkeys("ck/other/"), 4); /* readme, sub/..., ours (2) */
    dcp__s3_free(s3);
    dcp_ctx_free(ctx);
}

/* The members the one-writer lock and cleanup rely on, through storage.c. */
TEST(storage_members)
{
    dcp_storage_entry ents[8];
    struct dcp_err err = {0};
    size_t n = 0;
    int d = -1, f = -1, vis = 0;
    uint64_t size = 0;
    uint8_t *big = malloc((size_t)11 << 20), *back = malloc((size_t)11 << 20);
    const size_t blen = ((size_t)11 << 20) + 0, piece = (size_t)3 << 20;
    ASSERT(big && back);
    for (size_t i = 0; i < blen; i++)
        big[i] = (uint8_t)(i * 7 + (i >> 13));
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp__fs_mkdirs(at("ck/lock"), &err), DCP_OK);
    ASSERT_EQ(dcp__fs_open_dir(at("ck/lock"), &d, &err), DCP_OK);
    /* A directory handle answers for its back end (the engine's depth). */
    ASSERT_EQ(dcp__fs_max_inflight(d), dcp__s3_max_inflight());
    {
        /* The bucket is checked (a listing) once a minute per prefix and
         * credentials, not at every open (a load opens twice). */
        int d2 = -1;
        uint64_t g0 = dcp__s3_requests(1);
        ASSERT_EQ(dcp__fs_open_dir(at("ck/lock"), &d2, &err), DCP_OK);
        ASSERT_EQ(dcp__s3_requests(1) - g0, 0);
        dcp__fs_release(d2);
        ASSERT_EQ(dcp__fs_open_dir(at("ck/lock2"), &d2, &err), DCP_OK);
        ASSERT_EQ(dcp__s3_requests(1) - g0, 1);
        dcp__fs_release(d2);
    }
    ASSERT_EQ(dcp__fs_publish(d, url, ".lock", "me", 2, DCP_PUBLISH_EXCLUSIVE,
                              &vis, &err),
              DCP_OK);
    ASSERT_EQ(vis, 1);
    ASSERT_EQ(dcp__fs_publish(d, url, ".lock", "you", 3, DCP_PUBLISH_EXCLUSIVE,
                              &vis, &err),
              DCP_EEXIST);
    ASSERT_EQ(vis, 0);
    ASSERT_EQ(dcp__fs_list(d, ".lo", 8, ents, &n, &err), DCP_OK);
    ASSERT_EQ(n, 1);
    ASSERT(strcmp(ents[0].name, ".lock") == 0 && ents[0].size == 2);
    ASSERT_EQ(dcp__fs_unlink(d, ".lock", &err), DCP_OK);
    ASSERT_EQ(dcp__fs_unlink(d, ".lock", &err), DCP_OK); /* missing: fine */
    ASSERT_EQ(dcp__fs_exists(d, ".lock"), 0);
    ASSERT_EQ(dcp__fs_publish(d, url, ".lock", "you", 3, DCP_PUBLISH_EXCLUSIVE,
                              &vis, &err),
              DCP_OK);
    ASSERT_EQ(dcp__fs_exists(d, ".lock"), 1);
    ASSERT_EQ(dcp__fs_put(d, "p1", "abc", 3, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_put(d, "p2", "", 0, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_list(d, "p", 1, ents, &n, &err), DCP_ELIMIT);
    ASSERT_EQ(dcp__fs_list(d, "p", 8, ents, &n, &err), DCP_OK);
    ASSERT_EQ(n, 2);
    /* multipart, pieces out of order and across part boundaries */
    ASSERT_EQ(dcp__fs_write_begin(d, "mp", &f, &err), DCP_OK);
    ASSERT(dcp__fs_max_inflight(f) > 1);
    for (size_t k = 4; k-- > 0;) {
        size_t o = k * piece, l = blen - o < piece ? blen - o : piece;
        ASSERT_EQ(dcp__fs_pwrite(f, big + o, l, o, "mp", &err), DCP_OK);
    }
    ASSERT_EQ(dcp__fs_write_complete(f, "mp", 0, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_open_read(d, "mp", &f, &size, &err), DCP_OK);
    ASSERT_U64_EQ(size, blen);
    ASSERT_EQ(dcp__fs_pread(f, back, blen, 0, "mp", &err), DCP_OK);
    ASSERT(memcmp(back, big, blen) == 0);
    ASSERT_EQ(dcp__fs_pread(f, back, 10, blen - 5, "mp", &err), DCP_ECORRUPT);
    ASSERT_EQ(dcp__fs_close(f, "mp", &err), DCP_OK);
    /* a hole: refused, aborted */
    ASSERT_EQ(dcp__fs_write_begin(d, "hole", &f, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_pwrite(f, big, (size_t)6 << 20, 0, "hole", &err), DCP_OK);
    ASSERT_EQ(dcp__fs_pwrite(f, big, 10, (size_t)7 << 20, "hole", &err),
              DCP_OK);
    ASSERT_EQ(dcp__fs_write_complete(f, "hole", 0, &err), DCP_EIO);
    ASSERT_EQ(dcp__fs_exists(d, "hole"), 0);
    /* abort after parts went up */
    ASSERT_EQ(dcp__fs_write_begin(d, "ab", &f, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_pwrite(f, big, blen, 0, "ab", &err), DCP_OK);
    dcp__fs_write_abort(d, f, "ab");
    ASSERT_EQ(dcp__fs_exists(d, "ab"), 0);
    /* a handle released on an error path aborts too */
    ASSERT_EQ(dcp__fs_create(d, "rel", &f, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_pwrite(f, big, blen, 0, "rel", &err), DCP_OK);
    dcp__fs_release(f);
    ASSERT_EQ(dcp__fs_exists(d, "rel"), 0);
    ASSERT_EQ(uploads("ck/lock/"), 0);
    ASSERT_EQ(dcp__fs_rename(d, "p1", "p3", &err), DCP_ENOTSUP);
    dcp__fs_release(d);
    free(big);
    free(back);
}

/* kill -9 of a saving process at several moments: never a partial commit,
 * the old checkpoint (or the new one, when it committed) loads. */
/* The object at key, whole, equals the n bytes at want. */
static int object_is(struct dcp__s3 *s3, const char *key, const char *want,
                     size_t n)
{
    void *b = NULL;
    size_t len = 0;
    struct dcp_err err = {0};
    int ok = dcp__s3_get(s3, key, 1 << 20, &b, &len, &err) == DCP_OK &&
             len == n && memcmp(b, want, n) == 0;
    dcp__free(b);
    return ok;
}

/* The save's read of .metadata through handle d (what a later publish of
 * it is conditional on): its code. */
static int reread(int d)
{
    uint8_t *got = NULL;
    size_t len = 0;
    struct dcp_err err = {0};
    int rc = dcp__fs_read_all(d, ".metadata", 1 << 20, &got, &len, &err);
    dcp__free(got);
    return rc;
}

/* The commit is conditional on what the save read of .metadata (absent:
 * If-None-Match, present: If-Match its ETag): another writer's commit in
 * between — one that did not take the lock — is never replaced. */
TEST(conditional_commit)
{
    struct dcp_err err = {0};
    struct dcp__s3 *s3 = client();
    const char *key = "ck/cond/.metadata";
    uint8_t *got = NULL;
    size_t len = 0;
    int d = -1, vis = 1;
    ASSERT(s3);
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp__fs_open_dir(at("ck/cond"), &d, &err), DCP_OK);
    /* absent when read, another's at the publish: refused, theirs kept */
    ASSERT_EQ(reread(d), DCP_ENOENT);
    ASSERT_EQ(dcp__s3_put(s3, key, "theirs", 6, 0, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_publish(d, url, ".metadata", "mine", 4, 0, &vis, &err),
              DCP_EBUSY);
    ASSERT_EQ(vis, 0);
    ASSERT(strstr(err.msg, key) && strstr(err.msg, "another writer"));
    ASSERT(object_is(s3, key, "theirs", 6));
    /* read, replaced by another, then published: refused */
    ASSERT_EQ(dcp__fs_read_all(d, ".metadata", 1 << 20, &got, &len, &err),
              DCP_OK);
    ASSERT(len == 6 && memcmp(got, "theirs", 6) == 0);
    dcp__free(got);
    ASSERT_EQ(dcp__s3_put(s3, key, "theirs2", 7, 0, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_publish(d, url, ".metadata", "mine", 4, 0, &vis, &err),
              DCP_EBUSY);
    ASSERT(object_is(s3, key, "theirs2", 7));
    /* read, removed by another, then published: refused */
    ASSERT_EQ(reread(d), DCP_OK);
    ASSERT_EQ(dcp__s3_delete(s3, key, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_publish(d, url, ".metadata", "mine", 4, 0, &vis, &err),
              DCP_EBUSY);
    ASSERT_EQ(dcp__fs_exists(d, ".metadata"), 0);
    /* read and unchanged: replaced; the condition held once, so a publish
     * after it without a read replaces whatever is there */
    ASSERT_EQ(dcp__s3_put(s3, key, "theirs3", 7, 0, &err), DCP_OK);
    ASSERT_EQ(reread(d), DCP_OK);
    ASSERT_EQ(dcp__fs_publish(d, url, ".metadata", "mine", 4, 0, &vis, &err),
              DCP_OK);
    ASSERT_EQ(vis, 1);
    ASSERT(object_is(s3, key, "mine", 4));
    ASSERT_EQ(dcp__s3_put(s3, key, "theirs4", 7, 0, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_publish(d, url, ".metadata", "mine2", 5, 0, &vis, &err),
              DCP_OK);
    ASSERT(object_is(s3, key, "mine2", 5));
    dcp__fs_release(d);
    /* A conditional PUT whose answer was lost after it landed: retried,
     * refused by its own object, recognised as ours (present and absent). */
    cfg(1, 4, 30000);
    ASSERT_EQ(dcp__fs_open_dir(at("ck/cond"), &d, &err), DCP_OK);
    ASSERT_EQ(reread(d), DCP_OK);
    faults("lostanswer", 1);
    ASSERT_EQ(dcp__fs_publish(d, url, ".metadata", "mine3", 5, 0, &vis, &err),
              DCP_OK);
    faults(NULL, 0);
    ASSERT(object_is(s3, key, "mine3", 5));
    ASSERT_EQ(dcp__s3_delete(s3, key, &err), DCP_OK);
    ASSERT_EQ(reread(d), DCP_ENOENT);
    faults("lostanswer", 1);
    ASSERT_EQ(dcp__fs_publish(d, url, ".metadata", "mine4", 5, 0, &vis, &err),
              DCP_OK);
    faults(NULL, 0);
    ASSERT(object_is(s3, key, "mine4", 5));
    /* A store without conditional writes (501 NotImplemented): the
     * commit goes unconditional; an exclusive publish is DCP_ENOTSUP
     * (the lock then takes none, as on a back end without publish). */
    ASSERT_EQ(reread(d), DCP_OK);
    faults("notimpl_cond", 100);
    ASSERT_EQ(dcp__fs_publish(d, url, ".metadata", "mine5", 5, 0, &vis, &err),
              DCP_OK);
    ASSERT(object_is(s3, key, "mine5", 5));
    ASSERT_EQ(dcp__fs_publish(d, url, ".lk", "x", 1, DCP_PUBLISH_EXCLUSIVE,
                              &vis, &err),
              DCP_ENOTSUP);
    faults(NULL, 0);
    dcp__fs_release(d);
    /* The outcome unknown (every request reset: the PUT and the read-back
     * fail): the error, and visible set, so that the caller keeps what
     * the object would make reachable. */
    cfg(1, 2, 1500);
    ASSERT_EQ(dcp__fs_open_dir(at("ck/cond"), &d, &err), DCP_OK);
    faults("reset", 100000);
    vis = 0;
    ASSERT_EQ(dcp__fs_publish(d, url, ".metadata", "mine6", 5, 0, &vis, &err),
              DCP_EIO);
    faults(NULL, 0);
    ASSERT_EQ(vis, 1);
    ASSERT(strstr(err.msg, "may be in place"));
    ASSERT(object_is(s3, key, "mine5", 5));
    dcp__fs_release(d);

    /* A save (async: planned, with .metadata read, when the call returns;
     * committed in dcp_request_wait) whose commit finds another writer's
     * .metadata: DCP_EBUSY naming it, theirs kept, nothing of ours left. */
    dcp_ctx *ctx = NULL;
    dcp_request *req = NULL;
    struct st s;
    unsigned seed = 0;
    void *theirs = NULL;
    size_t tlen = 0;
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    for (int fresh = 0; fresh < 2; fresh++) {
        const char *pfx = fresh ? "ck/race-new" : "ck/race";
        char mkey[64];
        (void)snprintf(mkey, sizeof(mkey), "%s/.metadata", pfx);
        if (!fresh) {
            ASSERT_EQ(save(ctx, at(pfx), BIG, 21), DCP_OK);
            /* the other writer's: another checkpoint's .metadata */
            ASSERT_EQ(save(ctx, at("ck/race-other"), 100, 22), DCP_OK);
            ASSERT_EQ(dcp__s3_get(s3, "ck/race-other/.metadata", 1 << 20,
                                  &theirs, &tlen, &err),
                      DCP_OK);
        }
        size_t before = nkeys(fresh ? "ck/race-new/" : "ck/race/");
        ASSERT_EQ(st_make(&s, BIG, 23, 0), 0);
        ASSERT_EQ(dcp_save_async(ctx, s.st, at(pfx), NULL, &req), DCP_OK);
        ASSERT_EQ(dcp__s3_put(s3, mkey, theirs, tlen, 0, &err), DCP_OK);
        ASSERT_EQ(dcp_request_wait(req), DCP_EBUSY);
        ASSERT(strstr(dcp_errmsg(ctx), mkey));
        ASSERT(strstr(dcp_errmsg(ctx), "another writer"));
        dcp_request_free(req);
        st_free(&s);
        ASSERT(object_is(s3, mkey, theirs, tlen));
        /* ours removed: the keys there before, theirs, none else */
        ASSERT_EQ(nkeys(fresh ? "ck/race-new/" : "ck/race/"),
                  before + (size_t)fresh);
        ASSERT_EQ(uploads(fresh ? "ck/race-new/" : "ck/race/"), 0);
    }
    /* and a save that finds the prefix as it read it commits */
    ASSERT_EQ(save(ctx, at("ck/race-new"), 100, 24), DCP_OK);
    ASSERT_EQ(load(ctx, at("ck/race-new"), 100, &seed), DCP_OK);
    ASSERT_EQ(seed, 24);
    dcp__free(theirs);
    dcp_ctx_free(ctx);
    dcp__s3_free(s3);
}

/* A bucket deleted after an open checked it (the check is kept a minute):
 * the next save and load fail with DCP_ENOENT "no such bucket", and the
 * next open checks again. */
TEST(bucket_gone)
{
    const char *py = getenv("DCP_S3_PYTHON");
    char cmd[1024];
    dcp_ctx *ctx;
    unsigned got;
    ASSERT(py);
    cfg(0, 2, 10000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(save(ctx, "s3://dcp-test-gone/x", 100, 1), DCP_OK);
    (void)snprintf(cmd, sizeof(cmd),
                   "'%s' -c \"import boto3; b = boto3.resource('s3').Bucket("
                   "'dcp-test-gone'); b.objects.all().delete(); b.delete()\"",
                   py);
    ASSERT_EQ(system(cmd), 0);
    ASSERT_EQ(save(ctx, "s3://dcp-test-gone/x", 100, 2), DCP_ENOENT);
    ASSERT(strstr(dcp_errmsg(ctx), "no such bucket"));
    ASSERT(strstr(dcp_errmsg(ctx), "dcp-test-gone"));
    ASSERT_EQ(load(ctx, "s3://dcp-test-gone/x", 100, &got), DCP_ENOENT);
    ASSERT(strstr(dcp_errmsg(ctx), "no such bucket"));
    dcp_ctx_free(ctx);
}

TEST(killed_save)
{
    static const int delays_ms[] = {150, 400, 900};
    dcp_ctx *ctx;
    dcp_clean_result res;
    size_t left;
    unsigned got;
    const int64_t nw = (int64_t)8 << 20; /* 32 MiB */
    int newer = 0;
    char self[4096];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    ASSERT(sl > 0);
    self[sl] = '\0';
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(save(ctx, at("ck/kill"), nw, 1), DCP_OK);
    for (size_t i = 0; i < sizeof(delays_ms) / sizeof(delays_ms[0]); i++) {
        int status = 0;
        pid_t pid = fork();
        ASSERT(pid >= 0);
        if (pid == 0) {
            execl(self, self, "--child-save", at("ck/kill"), (char *)NULL);
            _exit(127);
        }
        usleep((useconds_t)delays_ms[i] * 1000);
        kill(pid, SIGKILL);
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT_EQ(load(ctx, at("ck/kill"), nw, &got), DCP_OK);
        ASSERT(got == 1 || got == 2);
        newer += got == 2;
    }
    left = uploads("ck/kill/");
    fprintf(stderr,
            "  killed saves: %d of 3 had committed; %zu uploads "
            "left (invisible)\n",
            newer, left);
    /* Plus one of each kind by hand: a data file's and a temporary's
     * (leftovers), a user object's and another directory's (kept). */
    ASSERT(begin_upload("ck/kill/__1_0.0123456789abcdef.distcp"));
    ASSERT(begin_upload("ck/kill/.metadata.77-1-abc.tmp"));
    ASSERT(begin_upload("ck/kill/user.bin"));
    ASSERT(begin_upload("ck/kill/sub/__0_0.distcp"));
    ASSERT_EQ(uploads("ck/kill/"), left + 4);
    memset(&res, 0, sizeof(res));
    res.struct_size = sizeof(res);
    ASSERT_EQ(dcp_clean(ctx, at("ck/kill"), 0, &res), DCP_OK);
    ASSERT_EQ(uploads("ck/kill/"), 2); /* user.bin, sub/ */
    ASSERT(res.files >= left + 2);
    /* The next save aborts them too. */
    ASSERT(begin_upload("ck/kill/__0_0.0123456789abcdef.distcp"));
    ASSERT_EQ(save(ctx, at("ck/kill"), nw, 3), DCP_OK);
    ASSERT_EQ(uploads("ck/kill/"), 2);
    ASSERT_EQ(load(ctx, at("ck/kill"), nw, &got), DCP_OK);
    ASSERT_EQ(got, 3);
    dcp_ctx_free(ctx);
}

/* ------------------------------------------------- one writer per path */

static size_t named(const char *prefix, const char *name)
{
    struct dcp__s3 *s3 = client();
    struct dcp_err err = {0};
    char key[600];
    size_t n = 0;
    (void)snprintf(key, sizeof(key), "%s%s", prefix, name);
    if (!s3 || dcp__s3_list(s3, key, 100000, count_fn, &n, &err) != DCP_OK)
        n = 9999;
    dcp__s3_free(s3);
    return n;
}

/* The child of TEST(two_writers): waits for the byte on fd, saves seed,
 * exits 0 (saved), 1 (DCP_EBUSY naming the holder) or 2 (anything else). */
static int writer_child(int fd, const char *path, unsigned seed)
{
    dcp_ctx *ctx;
    struct st s;
    char c;
    int rc;
    cfg(0, 4, 30000);
    if (dcp_ctx_create(&ctx, NULL, NULL) != DCP_OK ||
        st_make(&s, 4096, seed, 0) != 0)
        return 2;
    if (read(fd, &c, 1) != 1)
        return 2;
    rc = dcp_save(ctx, s.st, path, NULL);
    /* DCP_EBUSY: the lock held by the other, or — where the store's
     * If-None-Match is not atomic (moto checks, then writes, in two
     * steps) and both took the lock — the other's commit seen by ours
     * (If-Match): refused, not replaced. */
    if (rc == DCP_EBUSY &&
        !strstr(dcp_errmsg(ctx), "locked by another writer (host ") &&
        !strstr(dcp_errmsg(ctx), "another writer committed here"))
        rc = -1;
    if (rc != DCP_OK && rc != DCP_EBUSY)
        fprintf(stderr, "  writer %u: %s: %s\n", seed, dcp_err_name(rc),
                dcp_errmsg(ctx));
    st_free(&s);
    dcp_ctx_free(ctx);
    return rc == DCP_OK ? 0 : rc == DCP_EBUSY ? 1 : 2;
}

/*
 * Two processes saving to one s3:// path at once, 20 rounds (the lock is
 * an exclusive PUT, If-None-Match: *): each round at least one saves, the
 * other saves after it or fails with DCP_EBUSY naming the holder (or, on
 * a store whose conditional PUT is not atomic, its commit refused by the
 * other's: DCP_EBUSY too); the path
 * then loads one of the savers bit-exact and holds no lock and no object
 * but `.metadata` and the data file it names. A lock left by a dead
 * process of this host is taken over; leftovers of an interrupted save are
 * removed by dcp_clean, the committed objects never.
 */
TEST(two_writers)
{
    dcp_ctx *ctx;
    dcp_clean_result cr;
    unsigned got;
    int round, busy = 0;
    const char *p = at("ck/writers");
    char path[512];
    (void)snprintf(path, sizeof(path), "%s", p);
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(save(ctx, path, 4096, 1), DCP_OK);
    for (round = 0; round < 20; round++) {
        int go[2], st[2] = {0, 0}, ok = 0, i;
        pid_t pid[2];
        unsigned seed[2] = {100u + 2u * (unsigned)round,
                            101u + 2u * (unsigned)round};
        ASSERT_EQ(pipe(go), 0);
        for (i = 0; i < 2; i++) {
            pid[i] = fork();
            ASSERT(pid[i] >= 0);
            if (pid[i] == 0) {
                close(go[1]);
                _exit(writer_child(go[0], path, seed[i]));
            }
        }
        close(go[0]);
        ASSERT_EQ(write(go[1], "gg", 2), 2); /* both start at once */
        close(go[1]);
        for (i = 0; i < 2; i++) {
            ASSERT_EQ(waitpid(pid[i], &st[i], 0), pid[i]);
            ASSERT(WIFEXITED(st[i]));
            ASSERT(WEXITSTATUS(st[i]) <= 1);
            ok += WEXITSTATUS(st[i]) == 0;
        }
        ASSERT(ok >= 1);
        busy += ok == 1;
        ASSERT_EQ(load(ctx, path, 4096, &got), DCP_OK);
        ASSERT((got == seed[0] && WEXITSTATUS(st[0]) == 0) ||
               (got == seed[1] && WEXITSTATUS(st[1]) == 0));
        ASSERT_EQ(named("ck/writers/", ".lock"), 0);
        ASSERT_EQ(nkeys("ck/writers/"), 2); /* .metadata + one data file */
    }
    fprintf(stderr, "  two writers: %d of 20 rounds one DCP_EBUSY\n", busy);
    ASSERT(busy >= 1);

    /* A dead holder's lock (a reaped child's pid, this host): taken over. */
    {
        char host[128] = "unknown", boot[64] = "-", lock[512];
        FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
        pid_t dead = fork();
        int d = -1, visible = 0, n;
        struct dcp_err err = {0};
        ASSERT(dead >= 0);
        if (dead == 0)
            _exit(0);
        ASSERT_EQ(waitpid(dead, NULL, 0), dead);
        if (f) {
            if (fscanf(f, "%63s", boot) != 1)
                (void)snprintf(boot, sizeof(boot), "-");
            fclose(f);
        }
        (void)gethostname(host, sizeof(host) - 1);
        n = snprintf(lock, sizeof(lock),
                     "dcp-lock 1\nhost=%s\nboot=%s\npid=%lld\nstart=1\n"
                     "token=deadbeef01\ntime=1\n",
                     host, boot, (long long)dead);
        ASSERT_EQ(dcp__fs_open_dir(path, &d, &err), DCP_OK);
        ASSERT_EQ(dcp__fs_publish(d, path, ".lock", lock, (size_t)n,
                                  DCP_PUBLISH_EXCLUSIVE, &visible, &err),
                  DCP_OK);
        /* Leftovers of an interrupted save beside the committed ones. */
        ASSERT_EQ(dcp__fs_publish(d, path, "__0_0.00000000deadbeef.distcp",
                                  "junk", 4, 0, &visible, &err),
                  DCP_OK);
        ASSERT_EQ(dcp__fs_publish(d, path, ".metadata.1-2-deadbeef.tmp",
                                  "junk", 4, 0, &visible, &err),
                  DCP_OK);
        dcp__fs_release(d);
        ASSERT_EQ(nkeys("ck/writers/"), 5);
        memset(&cr, 0, sizeof(cr));
        cr.struct_size = sizeof(cr);
        ASSERT_EQ(dcp_clean(ctx, path, 0, &cr), DCP_OK);
        ASSERT_EQ(cr.files, 2);
        ASSERT_EQ(nkeys("ck/writers/"), 2); /* the lock taken, released */
        ASSERT_EQ(load(ctx, path, 4096, &got), DCP_OK);
        ASSERT(got >= 100);
        /* Again, a dead holder's lock: the next save takes it over. */
        ASSERT_EQ(dcp__fs_open_dir(path, &d, &err), DCP_OK);
        ASSERT_EQ(dcp__fs_publish(d, path, ".lock", lock, (size_t)n,
                                  DCP_PUBLISH_EXCLUSIVE, &visible, &err),
                  DCP_OK);
        dcp__fs_release(d);
        ASSERT_EQ(save(ctx, path, 4096, 7), DCP_OK);
        ASSERT_EQ(load(ctx, path, 4096, &got), DCP_OK);
        ASSERT_EQ(got, 7);
        ASSERT_EQ(nkeys("ck/writers/"), 2);
    }
    dcp_ctx_free(ctx);
}

/* ------------------------------------------------ the manager on s3:// */

static int mgr_state(struct st *s, unsigned seed, int for_load)
{
    return st_make(s, 5000, seed, for_load);
}

/*
 * A manager over an s3:// root: steps saved with retention (keep_last 2),
 * the pruned steps leave no object; latest and load_latest find the newest
 * complete step; a step without .metadata is listed incomplete and never
 * latest; removal refuses a prefix holding a foreign object or a deeper
 * one (nothing removed) and a step whose writer is alive (DCP_EBUSY).
 */
TEST(manager)
{
    dcp_ctx *ctx;
    dcp_manager *m;
    dcp_manager_options o;
    dcp_manager_entry *e = NULL;
    struct st s, back;
    size_t n = 0;
    int64_t step = -1;
    int d = -1, visible = 0;
    unsigned got;
    struct dcp_err err = {0};
    char root[512], path[600];
    (void)snprintf(root, sizeof(root), "%s", at("mgr"));
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.keep_last = 2;
    ASSERT_EQ(dcp_manager_create(&m, ctx, root, &o), DCP_OK);
    ASSERT_EQ(dcp_manager_latest(m, &step), DCP_ENOENT);
    for (unsigned k = 1; k <= 4; k++) {
        ASSERT_EQ(mgr_state(&s, 10 + k, 0), 0);
        ASSERT_EQ(dcp_manager_save(m, s.st, (int64_t)k * 10), DCP_OK);
        st_free(&s);
    }
    ASSERT_EQ(nkeys("mgr/step-10/"), 0);
    ASSERT_EQ(nkeys("mgr/step-20/"), 0);
    ASSERT_EQ(nkeys("mgr/step-30/"), 2);
    ASSERT_EQ(dcp_manager_list(ctx, root, &o, &e, &n), DCP_OK);
    ASSERT_EQ(n, 2);
    ASSERT(e[0].step == 30 && e[1].step == 40);
    ASSERT(e[0].status == DCP_MANAGER_COMPLETE &&
           e[1].status == DCP_MANAGER_COMPLETE);
    dcp_manager_list_free(e, n);
    /* A half-written step 50: a data object, no .metadata. */
    (void)snprintf(path, sizeof(path), "%s/step-50", root);
    ASSERT_EQ(dcp__fs_open_dir(path, &d, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_publish(d, path, "__0_0.distcp", "half", 4, 0,
                              &visible, &err),
              DCP_OK);
    dcp__fs_release(d);
    ASSERT_EQ(dcp_manager_list(ctx, root, &o, &e, &n), DCP_OK);
    ASSERT_EQ(n, 3);
    ASSERT(e[2].step == 50 && e[2].status == DCP_MANAGER_INCOMPLETE);
    dcp_manager_list_free(e, n);
    ASSERT_EQ(dcp_manager_latest(m, &step), DCP_OK);
    ASSERT_EQ(step, 40);
    ASSERT_EQ(mgr_state(&back, 0, 1), 0);
    ASSERT_EQ(dcp_manager_load_latest(m, back.st, &step, NULL), DCP_OK);
    ASSERT_EQ(step, 40);
    ASSERT_EQ(mgr_state(&s, 14, 0), 0);
    ASSERT(memcmp(s.w, back.w, 5000 * sizeof(float)) == 0);
    st_free(&s);
    st_free(&back);
    /* The half step is removed whole. */
    ASSERT_EQ(dcp_manager_remove(ctx, path), DCP_OK);
    ASSERT_EQ(nkeys("mgr/step-50/"), 0);
    ASSERT_EQ(dcp_manager_remove(ctx, path), DCP_ENOENT);
    /* A foreign object, then a deeper one: refused, nothing removed. */
    (void)snprintf(path, sizeof(path), "%s/step-30", root);
    ASSERT_EQ(dcp__fs_open_dir(path, &d, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_publish(d, path, "notes.txt", "x", 1, 0, &visible,
                              &err),
              DCP_OK);
    ASSERT_EQ(dcp_manager_remove(ctx, path), DCP_EUNSAFE);
    ASSERT(strstr(dcp_errmsg(ctx), "notes.txt"));
    ASSERT_EQ(nkeys("mgr/step-30/"), 3);
    ASSERT_EQ(dcp__fs_unlink(d, "notes.txt", &err), DCP_OK);
    dcp__fs_release(d);
    (void)snprintf(path, sizeof(path), "%s/step-30/sub", root);
    ASSERT_EQ(dcp__fs_open_dir(path, &d, &err), DCP_OK);
    ASSERT_EQ(dcp__fs_publish(d, path, "x.distcp", "x", 1, 0, &visible,
                              &err),
              DCP_OK);
    dcp__fs_release(d);
    (void)snprintf(path, sizeof(path), "%s/step-30", root);
    ASSERT_EQ(dcp_manager_remove(ctx, path), DCP_EUNSAFE);
    ASSERT(strstr(dcp_errmsg(ctx), "sub"));
    ASSERT_EQ(nkeys("mgr/step-30/"), 3);
    ASSERT_EQ(load(ctx, path, 5000, &got), DCP_OK);
    ASSERT_EQ(got, 13);
    /* A live writer's lock (this process, another context's token). */
    {
        char host[128] = "unknown", lock[512];
        int ln;
        (void)gethostname(host, sizeof(host) - 1);
        ln = snprintf(lock, sizeof(lock),
                      "dcp-lock 1\nhost=%s\nboot=-\npid=%lld\nstart=0\n"
                      "token=live01\ntime=1\n",
                      host, (long long)getppid());
        (void)snprintf(path, sizeof(path), "%s/step-40", root);
        ASSERT_EQ(dcp__fs_open_dir(path, &d, &err), DCP_OK);
        ASSERT_EQ(dcp__fs_publish(d, path, ".lock", lock, (size_t)ln,
                                  DCP_PUBLISH_EXCLUSIVE, &visible, &err),
                  DCP_OK);
        ASSERT_EQ(dcp_manager_remove(ctx, path), DCP_EBUSY);
        ASSERT_EQ(nkeys("mgr/step-40/"), 3);
        ASSERT_EQ(dcp__fs_unlink(d, ".lock", &err), DCP_OK);
        dcp__fs_release(d);
        ASSERT_EQ(dcp_manager_remove(ctx, path), DCP_OK);
        ASSERT_EQ(nkeys("mgr/step-40/"), 0);
    }
    ASSERT_EQ(dcp_manager_latest(m, &step), DCP_OK);
    ASSERT_EQ(step, 30);
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
}

/*
 * A listing answer cut short (200, a matching length, the body ending
 * before its first entry) or a missing bucket: latest, load_latest, list
 * and prune fail -- never DCP_ENOENT, the "start afresh" answer -- and
 * prune removes nothing.
 */
TEST(manager_hostile_listing)
{
    dcp_ctx *ctx;
    dcp_manager *m;
    dcp_manager_options o;
    dcp_manager_entry *e = NULL;
    struct st s;
    size_t n = 0, removed = 9;
    int64_t step = 7;
    char root[512];
    (void)snprintf(root, sizeof(root), "%s", at("mgr_hostile"));
    cfg(1, 2, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    ASSERT_EQ(dcp_manager_create(&m, ctx, root, &o), DCP_OK);
    for (unsigned k = 1; k <= 2; k++) {
        ASSERT_EQ(mgr_state(&s, 20 + k, 0), 0);
        ASSERT_EQ(dcp_manager_save(m, s.st, (int64_t)k), DCP_OK);
        st_free(&s);
    }
    faults("list_cut", 100000);
    ASSERT_EQ(dcp_manager_latest(m, &step), DCP_EFORMAT);
    ASSERT(strstr(dcp_errmsg(ctx), "mgr_hostile"));
    ASSERT_EQ(mgr_state(&s, 0, 1), 0);
    ASSERT_EQ(dcp_manager_load_latest(m, s.st, &step, NULL), DCP_EFORMAT);
    ASSERT_EQ(step, -1);
    st_free(&s);
    ASSERT_EQ(dcp_manager_list(ctx, root, &o, &e, &n), DCP_EFORMAT);
    ASSERT(e == NULL && n == 0);
    o.keep_last = 1;
    ASSERT_EQ(dcp_manager_prune(ctx, root, &o, &removed), DCP_EFORMAT);
    ASSERT_EQ(removed, 0);
    faults(NULL, 0);
    ASSERT_EQ(nkeys("mgr_hostile/step-1/"), 2);
    ASSERT_EQ(dcp_manager_latest(m, &step), DCP_OK);
    ASSERT_EQ(step, 2);
    dcp_manager_free(m);
    /* A missing bucket: no listing, not an empty root. */
    ASSERT_EQ(dcp_manager_list(ctx, "s3://dcp-no-such-bucket/r", NULL, &e,
                               &n),
              DCP_EIO);
    ASSERT(strstr(dcp_errmsg(ctx), "dcp-no-such-bucket"));
    ASSERT_EQ(dcp_manager_prune(ctx, "s3://dcp-no-such-bucket/r", &o,
                                &removed),
              DCP_EIO);
    cfg(0, 4, 30000);
    dcp_ctx_free(ctx);
}

TEST(manager_async)
{
    dcp_ctx *ctx;
    dcp_manager *m = NULL;
    dcp_manager_options o;
    dcp_manager_entry *e = NULL;
    struct st x[3];
    size_t n = 0;
    int64_t step = -1;
    unsigned got;
    char root[512], p[600];
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    (void)snprintf(root, sizeof(root), "%s", at("mgr_async/run"));
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.keep_last = 1;
    o.async = 1;
    ASSERT_EQ(dcp_manager_create(&m, ctx, root, &o), DCP_OK);
    for (unsigned s = 1; s <= 3; s++) {
        ASSERT_EQ(st_make(&x[s - 1], 5000, s, 0), 0);
        ASSERT_EQ(dcp_manager_save(m, x[s - 1].st, s), DCP_OK);
    }
    ASSERT_EQ(dcp_manager_wait(m), DCP_OK);
    for (int i = 0; i < 3; i++)
        st_free(&x[i]);
    ASSERT_EQ(dcp_manager_latest(m, &step), DCP_OK);
    ASSERT(step == 3);
    ASSERT_EQ(dcp_manager_list(ctx, root, NULL, &e, &n), DCP_OK);
    ASSERT(n == 1 && e[0].step == 3 && e[0].status == DCP_MANAGER_COMPLETE);
    dcp_manager_list_free(e, n);
    ASSERT_EQ(nkeys("mgr_async/run/step-1/"), 0);
    ASSERT_EQ(nkeys("mgr_async/run/step-2/"), 0);
    (void)snprintf(p, sizeof(p), "%s/step-3", root);
    ASSERT_EQ(load(ctx, p, 5000, &got), DCP_OK);
    ASSERT(got == 3);
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
}

/* A removal killed before its k-th change (dcp__mgr_set_remove_hook), in
 * the child "--child-remove PATH K": the step loads bit-exact or is not
 * complete (no .metadata), never half; a later removal takes the dead
 * remover's lock over and leaves no object. */
static long remove_crash_at, remove_calls;

static void crash_hook(const char *what, void *arg)
{
    (void)what;
    (void)arg;
    if (++remove_calls == remove_crash_at)
        _exit(9);
}

TEST(killed_remove)
{
    dcp_ctx *ctx;
    dcp_metadata *md = NULL;
    unsigned got;
    char self[4096], kb[16];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    int done = 0, crashed_incomplete = 0;
    ASSERT(sl > 0);
    self[sl] = '\0';
    cfg(0, 4, 30000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    for (long k = 1; !done && k < 50; k++) {
        int st = 0;
        ASSERT_EQ(save(ctx, at("ck/rmcrash"), 1000, 20), DCP_OK);
        (void)snprintf(kb, sizeof(kb), "%ld", k);
        pid_t pid = fork();
        ASSERT(pid >= 0);
        if (pid == 0) {
            execl(self, self, "--child-remove", at("ck/rmcrash"), kb,
                  (char *)NULL);
            _exit(127);
        }
        ASSERT_EQ(waitpid(pid, &st, 0), pid);
        ASSERT(WIFEXITED(st));
        ASSERT(WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 9);
        done = WEXITSTATUS(st) == 0;
        int rc = dcp_metadata_open(ctx, at("ck/rmcrash"), &md);
        dcp_metadata_free(md);
        md = NULL;
        if (rc == DCP_OK) {
            ASSERT(!done);
            ASSERT_EQ(load(ctx, at("ck/rmcrash"), 1000, &got), DCP_OK);
            ASSERT(got == 20);
        } else {
            ASSERT_EQ(rc, DCP_ENOENT);
            crashed_incomplete += !done;
        }
        if (!done)
            ASSERT_EQ(dcp_manager_remove(ctx, at("ck/rmcrash")), DCP_OK);
        ASSERT_EQ(nkeys("ck/rmcrash/"), 0);
    }
    ASSERT(done);
    ASSERT(crashed_incomplete >= 1);
    dcp_ctx_free(ctx);
}


TEST(auth)
{
    dcp_ctx *ctx;
    dcp_s3_config c;
    unsigned got;
    cfg(0, 2, 10000);
    ASSERT_EQ(dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    ASSERT_EQ(save(ctx, at("ck/auth"), 100, 1), DCP_OK);
    ASSERT_EQ(load(ctx, at("ck/auth"), 100, &got), DCP_OK);
    ASSERT_EQ(got, 1);
    memset(&c, 0, sizeof(c));
    c.struct_size = sizeof(c);
    c.secret_key = "wrong-secret";
    c.max_attempts = 2;
    ASSERT_EQ(dcp_s3_configure(&c), DCP_OK);
    ASSERT_EQ(load(ctx, at("ck/auth"), 100, &got), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "access denied"));
    ASSERT(strstr(dcp_errmsg(ctx), "dcp-test"));
    ASSERT_EQ(save(ctx, at("ck/auth"), 100, 2), DCP_EINVAL);
    cfg(0, 2, 10000);
    ASSERT_EQ(load(ctx, at("ck/auth"), 100, &got), DCP_OK);
    ASSERT_EQ(got, 1);
    dcp_ctx_free(ctx);
}

TEST(config_checks)
{
    dcp_s3_config c;
    memset(&c, 0, sizeof(c));
    ASSERT_EQ(dcp_s3_configure(&c), DCP_EINVAL); /* struct_size 0 */
    c.struct_size = sizeof(c) + 8;
    ASSERT_EQ(dcp_s3_configure(&c), DCP_EINVAL);
    c.struct_size = sizeof(c);
    c.part_size = 1 << 20;
    ASSERT_EQ(dcp_s3_configure(&c), DCP_EINVAL);
    c.part_size = 0;
    c.addressing = 3;
    ASSERT_EQ(dcp_s3_configure(&c), DCP_EINVAL);
    c.addressing = 0;
    c.max_inflight = 1000;
    ASSERT_EQ(dcp_s3_configure(&c), DCP_EINVAL);
    ASSERT_EQ(dcp_s3_configure(NULL), DCP_OK);
    ASSERT_EQ(dcp_path_is_s3("s3://b/x"), 1);
    ASSERT_EQ(dcp_path_is_s3("/s3://b"), 0);
    ASSERT_EQ(dcp_path_is_s3(NULL), 0);
}

int main(int argc, char **argv)
{
    bucket = getenv("DCP_S3_BUCKET");
    if (!bucket || !getenv("DCP_S3_PROXY")) {
        printf("SKIP: run through tests/s3/s3_env.py\n");
        return 77;
    }
    if (argc == 3 && strcmp(argv[1], "--child-save") == 0) {
        dcp_ctx *ctx;
        cfg(0, 4, 30000);
        if (dcp_ctx_create(&ctx, NULL, NULL) != DCP_OK)
            return 1;
        int rc = save(ctx, argv[2], (int64_t)8 << 20, 2);
        dcp_ctx_free(ctx);
        (void)dcp_s3_configure(NULL);
        return rc == DCP_OK ? 0 : 1;
    }
    if (argc == 4 && strcmp(argv[1], "--child-remove") == 0) {
        dcp_ctx *ctx;
        cfg(0, 4, 30000);
        if (dcp_ctx_create(&ctx, NULL, NULL) != DCP_OK)
            return 1;
        remove_crash_at = atol(argv[3]);
        dcp__mgr_set_remove_hook(crash_hook, NULL);
        int rc = dcp_manager_remove(ctx, argv[2]);
        if (rc != DCP_OK)
            fprintf(stderr, "  remove: %s\n", dcp_errmsg(ctx));
        dcp_ctx_free(ctx);
        (void)dcp_s3_configure(NULL);
        return rc == DCP_OK ? 0 : 1;
    }
    if (getenv("DCP_S3_AUTH")) {
        RUN(auth);
        (void)dcp_s3_configure(NULL);
        return TEST_SUMMARY();
    }
    RUN(config_checks);
    RUN(roundtrip);
    RUN(whole_records);
    RUN(export_import);
    RUN(storage_members);
    RUN(bad_places);
    RUN(overwrite_and_failed_saves);
    RUN(parts_in_parallel);
    RUN(load_faults);
    RUN(conditional_commit);
    RUN(bucket_gone);
    RUN(killed_save);
    RUN(two_writers);
    RUN(manager);
    RUN(manager_hostile_listing);
    RUN(manager_async);
    RUN(killed_remove);
    if (getenv("DCP_S3_SIGCHECK")) /* radosgw checks every signature */
        RUN(auth);
    (void)dcp_s3_configure(NULL);
    return TEST_SUMMARY();
}
