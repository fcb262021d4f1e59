/*
 * Asynchronous save, single process: the checkpoint holds the values of
 * the call even when every buffer changes right after it returns (1000
 * seeded iterations, half of them through a staging budget smaller than
 * the state), background failures reported by the wait with nothing
 * committed, the one-save-in-flight rule, cached staging buffers, stateful
 * entries, and misuse (freeing the context, the request or the state while
 * a save is in flight; waiting twice; failing callbacks).
 *
 * Environment: DCP_TEST_ASYNC_ITERS (default 1000) and DCP_TEST_SEED
 * (default 1) for the mutate-after-return loop; the sanitizer builds lower
 * the iterations (tests/CMakeLists.txt). Checkpoints go to /dev/shm when it
 * exists.
 */
#include <dcp/dcp.h>

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h> /* getpriority */
#include <sys/stat.h>
#include <unistd.h>

#include "ctx.h"  /* the staging arena */
#include "save.h" /* dcp__save_write_fail_after */
#include "stage.h"
#include "test.h"
#include "../tmpnames.h"

static char root[256];
static dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

static void make_root(void)
{
    struct stat sb;
    if (root[0])
        return;
    if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode))
        strcpy(root, "/dev/shm/dcp-test-async-XXXXXX");
    else
        strcpy(root, "/tmp/dcp-test-async-XXXXXX");
    if (!mkdtemp(root))
        abort();
}

static const char *dirpath(const char *name)
{
    static char buf[4][512];
    static int k;
    make_root();
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

/* Removes dir and the files in it (checkpoints have no subdirectories). */
static void rmdir_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[1024];
    if (!d)
        return;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' &&
            (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        (void)unlink(p);
    }
    closedir(d);
    (void)rmdir(dir);
}

/* Entries of dir, "." and ".." excluded; -1 when dir is missing. */
static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d)
        return -1;
    while ((de = readdir(d)) != NULL)
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return n;
}

static int has_file(const char *dir, const char *name)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static uint64_t rng_state = 1;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    rng_state = x;
    return x;
}

static void fill_random(void *p, size_t n)
{
    unsigned char *b = p;
    size_t i;
    for (i = 0; i < n; i++)
        b[i] = (unsigned char)rnd();
}

static long env_long(const char *name, long dflt)
{
    const char *s = getenv(name);
    return s && *s ? strtol(s, NULL, 10) : dflt;
}

/* ------------------------------------------------------------ a model */

/* A few MiB in tensors of several dtypes, one of them in two boxes, plus
 * a stateful object whose value changes every step. */
#define NT 5
struct model {
    void *buf[NT];
    size_t bytes[NT];
    void *gold[NT];
    int64_t step, gold_step;
    int state_dict_calls;
    int load_calls;
    int fail_state_dict, fail_load; /* return codes to use (0: none) */
    int nested;                     /* state_dict adds a stateful too */
    int64_t loaded_step;
    float *obj_tensor; /* the stateful's own tensor, 1024 floats */
};

static const struct {
    const char *name;
    dcp_dtype dt;
    int64_t rows, cols;
} specs[NT] = {
    {"layers.0.weight", DCP_F32, 512, 384}, /* 768 KiB */
    {"layers.0.bias", DCP_BF16, 1, 4099},   /* odd size */
    {"layers.1.weight", DCP_F64, 256, 200}, /* 400 KiB, two boxes */
    {"emb", DCP_I8, 1000, 777},             /* ~760 KiB */
    {"optim.exp_avg", DCP_F16, 300, 701},   /* ~410 KiB */
};

static int obj_load_state_dict(void *ud, const dcp_state *st);

static int obj_state_dict(void *ud, dcp_state *st)
{
    struct model *m = ud;
    int64_t shape[1] = {1024};
    int rc;
    m->state_dict_calls++;
    if (m->fail_state_dict)
        return m->fail_state_dict;
    if (m->nested) {
        dcp_stateful_ops ops = {DCP_STATEFUL_OPS_VERSION, obj_state_dict,
                                obj_load_state_dict};
        return dcp_state_add_stateful(st, "inner", &ops, m);
    }
    /* A dcp error code passes through as the save's code. */
    rc = dcp_state_add_value(st, "step", dcp_value_int(m->step));
    if (rc != DCP_OK)
        return rc;
    return dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, NULL, NULL,
                                m->obj_tensor, DCP_MEM_HOST);
}

static int obj_load_state_dict(void *ud, const dcp_state *st)
{
    struct model *m = ud;
    const dcp_value *v = dcp_state_value(st, "step");
    m->load_calls++;
    if (m->fail_load)
        return m->fail_load;
    if (!v || dcp_value_type_of(v) != DCP_VALUE_INT)
        return 4;
    m->loaded_step = dcp_value_as_int(v);
    return 0;
}

static const dcp_stateful_ops obj_ops = {DCP_STATEFUL_OPS_VERSION,
                                         obj_state_dict, obj_load_state_dict};

/* Buffers (random content when fill, else zeros). */
static void model_alloc(struct model *m, int fill)
{
    int i;
    memset(m, 0, sizeof(*m));
    for (i = 0; i < NT; i++) {
        m->bytes[i] = (size_t)(specs[i].rows * specs[i].cols) *
                      dcp_dtype_size(specs[i].dt);
        m->buf[i] = calloc(1, m->bytes[i]);
        m->gold[i] = calloc(1, m->bytes[i]);
        if (fill)
            fill_random(m->buf[i], m->bytes[i]);
    }
    m->obj_tensor = calloc(1024, sizeof(float));
    if (fill)
        fill_random(m->obj_tensor, 1024 * sizeof(float));
}

static void model_init(struct model *m)
{
    model_alloc(m, 1);
}

static void model_free(struct model *m)
{
    int i;
    for (i = 0; i < NT; i++) {
        free(m->buf[i]);
        free(m->gold[i]);
    }
    free(m->obj_tensor);
}

/* The state over m's buffers (tensor 2 as two row boxes). */
static dcp_state *model_state(struct model *m, int with_obj)
{
    dcp_state *st;
    int i;
    if (dcp_state_create(&st) != DCP_OK)
        abort();
    for (i = 0; i < NT; i++) {
        int64_t shape[2] = {specs[i].rows, specs[i].cols};
        dcp_dtype dt = specs[i].dt;
        int rc;
        if (i == 2) {
            int64_t o0[2] = {0, 0}, s0[2] = {100, 200}, o1[2] = {100, 0},
                    s1[2] = {156, 200};
            unsigned char *b = m->buf[i];
            rc = dcp_state_add_tensor(st, specs[i].name, dt, 2, shape, o0, s0,
                                      b, DCP_MEM_HOST);
            if (rc == DCP_OK)
                rc = dcp_state_add_tensor(st, specs[i].name, dt, 2, shape, o1,
                                          s1, b + 100 * 200 * 8, DCP_MEM_HOST);
        } else {
            rc = dcp_state_add_tensor(st, specs[i].name, dt, 2, shape, NULL,
                                      NULL, m->buf[i], DCP_MEM_HOST);
        }
        if (rc != DCP_OK)
            abort();
    }
    if (with_obj && dcp_state_add_stateful(st, "loader", &obj_ops, m) != 0)
        abort();
    return st;
}

static void model_snapshot(struct model *m)
{
    int i;
    for (i = 0; i < NT; i++)
        memcpy(m->gold[i], m->buf[i], m->bytes[i]);
    m->gold_step = m->step;
}

/* Random changes to every buffer: a random range of each is rewritten
 * (at least one byte changes), and the stateful's step moves on. */
static void model_mutate(struct model *m)
{
    int i;
    for (i = 0; i < NT; i++) {
        unsigned char *b = m->buf[i];
        size_t n = m->bytes[i], a = (size_t)(rnd() % n),
               len = 1 + (size_t)(rnd() % (n - a));
        unsigned char x = (unsigned char)(1 + rnd() % 255);
        size_t j;
        for (j = 0; j < len; j++)
            b[a + j] ^= x;
        b[rnd() % n] += 1; /* and one more anywhere */
    }
    m->obj_tensor[rnd() % 1024] += 1.0f;
    m->step++;
}

/* Loads dir into fresh buffers and compares with the snapshot. */
static int model_check_opts(dcp_ctx *ctx, struct model *m, const char *dir,
                            int with_obj, const dcp_load_options *lo)
{
    /* One set of load buffers for every check: no page faults each time. */
    static struct model got;
    static int got_ready;
    dcp_state *st;
    int i, rc, bad = 0;
    if (!got_ready) {
        model_alloc(&got, 0);
        got_ready = 1;
    }
    for (i = 0; i < NT; i++)
        memset(got.buf[i], 0, got.bytes[i]);
    got.loaded_step = -1;
    st = model_state(&got, with_obj);
    rc = dcp_load(ctx, st, dir, lo);
    if (rc != DCP_OK) {
        fprintf(stderr, "load: %s: %s\n", dcp_err_name(rc), dcp_errmsg(ctx));
        bad = 1;
    }
    for (i = 0; !bad && i < NT; i++)
        if (memcmp(got.buf[i], m->gold[i], m->bytes[i]) != 0) {
            fprintf(stderr, "tensor %s differs from the call's values\n",
                    specs[i].name);
            bad = 1;
        }
    if (!bad && with_obj && got.loaded_step != m->gold_step) {
        fprintf(stderr, "stateful step %lld, want %lld\n",
                (long long)got.loaded_step, (long long)m->gold_step);
        bad = 1;
    }
    dcp_state_free(st);
    return bad;
}

static int model_check_obj(dcp_ctx *ctx, struct model *m, const char *dir,
                           int with_obj)
{
    return model_check_opts(ctx, m, dir, with_obj, NULL);
}

static int model_check(dcp_ctx *ctx, struct model *m, const char *dir)
{
    return model_check_obj(ctx, m, dir, 1);
}

/* ---------------------------------------------------------- the tests */

TEST(mutate_after_return)
{
    long iters = env_long("DCP_TEST_ASYNC_ITERS", 1000), i;
    dcp_load_options fast = {sizeof(dcp_load_options), DCP_LOAD_NO_VERIFY, NULL};
    dcp_ctx_options o;
    dcp_ctx *full, *tight;
    struct model m;
    dcp_state *st;
    const char *dir = dirpath("mutate");
    float obj_gold[1024];
    rng_state = (uint64_t)env_long("DCP_TEST_SEED", 1) * 2654435761u + 1;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.staging_budget = 256 << 10; /* a tenth of the state */
    ASSERT_OK(dcp_ctx_create(&full, NULL, NULL));
    ASSERT_OK(dcp_ctx_create(&tight, NULL, &o));
    model_init(&m);
    st = model_state(&m, 1);
    for (i = 0; i < iters; i++) {
        dcp_ctx *ctx = i % 2 ? tight : full;
        dcp_request *req;
        model_snapshot(&m);
        memcpy(obj_gold, m.obj_tensor, sizeof(obj_gold));
        ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
        model_mutate(&m);
        ASSERT_OK(dcp_request_wait(req));
        dcp_request_free(req);
        /* Every byte is compared; the records' CRCs (chained over the
         * staging pieces with a budget) are verified in 2 of 8 saves, one
         * of each staging mode. */
        if (model_check_opts(full, &m, dir, 1, i % 8 < 2 ? NULL : &fast))
            FAIL_AT_("iteration %ld (%s staging): checkpoint differs", i,
                     i % 2 ? "budget" : "full");
        {
            /* The stateful's tensor too. */
            struct model g;
            dcp_state *s2;
            int64_t shape[1] = {1024};
            float got[1024];
            dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, NULL};
            if (i % 97 == 0) {
                model_init(&g);
                ASSERT_OK(dcp_state_create(&s2));
                ASSERT_OK(dcp_state_push(s2, "loader"));
                ASSERT_OK(dcp_state_add_tensor(s2, "w", DCP_F32, 1, shape, NULL,
                                               NULL, got, DCP_MEM_HOST));
                ASSERT_OK(dcp_load(full, s2, dir, &lo));
                ASSERT_MEM_EQ(got, obj_gold, sizeof(got));
                dcp_state_free(s2);
                model_free(&g);
            }
        }
    }
    ASSERT(dcp_ctx_staging_bytes(tight) <= o.staging_budget);
    ASSERT(iters < 2 || dcp_ctx_staging_bytes(tight) > 0);
    ASSERT_EQ(m.state_dict_calls, iters);
    dcp_state_free(st);
    model_free(&m);
    dcp_ctx_free(full);
    dcp_ctx_free(tight);
    rmdir_files(dir);
    fprintf(stderr, "     %ld async saves checked\n", iters);
}

/* Staging buffers: allocated once, reused, bounded by the budget; a
 * synchronous save of host memory stages nothing. */
TEST(staging_buffers_cached)
{
    dcp_ctx_options o;
    dcp_ctx *ctx, *tight;
    struct model m;
    dcp_state *st;
    dcp_request *req;
    const char *dir = dirpath("cached");
    uint8_t *p1;
    uint64_t cap1;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.staging_budget = 100000; /* not a page multiple */
    model_init(&m);
    st = model_state(&m, 0);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_ctx_create(&tight, NULL, &o));
    ASSERT_OK(dcp_save(ctx, st, dir, &nosync));
    ASSERT_U64_EQ(dcp_ctx_staging_bytes(ctx), 0); /* zero copy */
    ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    cap1 = dcp_ctx_staging_bytes(ctx);
    p1 = ctx->arena->p;
    ASSERT(cap1 >= 2 << 20);
    ASSERT(cap1 < 3 << 20);
    ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    ASSERT_U64_EQ(dcp_ctx_staging_bytes(ctx), cap1);
    ASSERT(ctx->arena->p == p1); /* the same buffer, not a new one */
    ASSERT_OK(dcp_save_async(tight, st, dir, &nosync, &req));
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    ASSERT(dcp_ctx_staging_bytes(tight) <= 100000);
    ASSERT(dcp_ctx_staging_bytes(tight) >= 64 << 10);
    model_snapshot(&m);
    ASSERT(!model_check_obj(ctx, &m, dir, 0));
    /* A state just under a budget that is not a page multiple: the
     * arena (whole pages) must still stay within the budget. */
    {
        dcp_ctx *c2;
        dcp_state *s2;
        dcp_request *r2;
        int64_t shape[1] = {99000};
        unsigned char *b = malloc(99000), *got = calloc(1, 99000),
                      *want = malloc(99000);
        fill_random(b, 99000);
        memcpy(want, b, 99000);
        ASSERT_OK(dcp_ctx_create(&c2, NULL, &o));
        ASSERT_OK(dcp_state_create(&s2));
        ASSERT_OK(dcp_state_add_tensor(s2, "b", DCP_U8, 1, shape, NULL, NULL,
                                       b, DCP_MEM_HOST));
        ASSERT_OK(dcp_save_async(c2, s2, dir, &nosync, &r2));
        memset(b, 0, 99000);
        ASSERT_OK(dcp_request_wait(r2));
        dcp_request_free(r2);
        ASSERT(dcp_ctx_staging_bytes(c2) <= 100000);
        dcp_state_free(s2);
        ASSERT_OK(dcp_state_create(&s2));
        ASSERT_OK(dcp_state_add_tensor(s2, "b", DCP_U8, 1, shape, NULL, NULL,
                                       got, DCP_MEM_HOST));
        ASSERT_OK(dcp_load(c2, s2, dir, NULL));
        ASSERT_MEM_EQ(got, want, 99000);
        dcp_state_free(s2);
        dcp_ctx_free(c2);
        free(b);
        free(got);
        free(want);
    }
    o.staging_budget = 4096;
    {
        dcp_ctx *bad = (dcp_ctx *)&o;
        ASSERT_RC(dcp_ctx_create(&bad, NULL, &o), DCP_EINVAL);
        ASSERT(bad == NULL);
    }
    dcp_state_free(st);
    model_free(&m);
    dcp_ctx_free(ctx);
    dcp_ctx_free(tight);
    rmdir_files(dir);
}

/* An I/O error in the background: the wait reports it, nothing is
 * committed, the checkpoint committed before stays loadable, no new data
 * file stays behind, and the next save works. With a budget the failure
 * comes while the stager waits for space: the call must not hang. */
static void background_failure(uint64_t budget, uint64_t fail_at)
{
    dcp_ctx_options o;
    dcp_ctx *ctx;
    struct model m;
    dcp_state *st;
    dcp_request *req;
    const char *dir = dirpath(budget ? "bgfail-budget" : "bgfail");
    int before;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.staging_budget = budget;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o));
    model_init(&m);
    st = model_state(&m, 1);
    model_snapshot(&m);
    ASSERT_OK(dcp_save(ctx, st, dir, &nosync));
    before = count_files(dir);
    model_mutate(&m);
    (void)dcp__save_write_fail_after(fail_at);
    ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
    ASSERT_RC(dcp_request_wait(req), DCP_EIO);
    (void)dcp__save_write_fail_after(0);
    ASSERT(strstr(dcp_request_errmsg(req), "injected failure") != NULL);
    ASSERT(strstr(dcp_request_errmsg(req), "nothing committed") != NULL);
    ASSERT_STR_EQ(dcp_errmsg(ctx), dcp_request_errmsg(req));
    dcp_request_free(req);
    ASSERT_EQ(count_files(dir), before); /* the new data file is gone */
    ASSERT_EQ(dcp_test_meta_tmps(dir), 0);
    ASSERT(!model_check(ctx, &m, dir)); /* still the first checkpoint */
    model_snapshot(&m);
    ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    ASSERT(!model_check(ctx, &m, dir));
    dcp_state_free(st);
    model_free(&m);
    dcp_ctx_free(ctx);
    rmdir_files(dir);
}

TEST(background_failure_full)
{
    background_failure(0, 1);
}

TEST(background_failure_budget)
{
    /* 64 KiB pieces are written straight from the ring: the third write
     * fails while the stager waits for space. */
    background_failure(256 << 10, 3);
}

TEST(background_failure_sync)
{
    dcp_ctx *ctx;
    struct model m;
    dcp_state *st;
    const char *dir = dirpath("bgfail-sync");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    model_init(&m);
    st = model_state(&m, 0);
    (void)dcp__save_write_fail_after(2);
    ASSERT_RC(dcp_save(ctx, st, dir, &nosync), DCP_EIO);
    (void)dcp__save_write_fail_after(0);
    ASSERT(strstr(dcp_errmsg(ctx), "injected failure") != NULL);
    ASSERT_EQ(count_files(dir), 0);
    dcp_state_free(st);
    model_free(&m);
    dcp_ctx_free(ctx);
    rmdir_files(dir);
}

TEST(wait_twice_and_test)
{
    dcp_ctx *ctx;
    struct model m;
    dcp_state *st;
    dcp_request *req;
    const char *dir = dirpath("twice");
    int done = 0, polls = 0, rc;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    model_init(&m);
    st = model_state(&m, 1);
    model_snapshot(&m);
    ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
    ASSERT_STR_EQ(dcp_request_errmsg(req), "");
    do {
        rc = dcp_request_test(req, &done);
        polls++;
        if (!done)
            usleep(100);
    } while (rc == DCP_OK && !done);
    ASSERT_OK(rc);
    ASSERT_EQ(done, 1);
    ASSERT_OK(dcp_request_test(req, &done)); /* still done */
    ASSERT_EQ(done, 1);
    ASSERT_OK(dcp_request_wait(req)); /* the stored result, once */
    ASSERT_RC(dcp_request_wait(req), DCP_EINVAL);
    ASSERT(strstr(dcp_request_errmsg(req), "called twice") != NULL);
    dcp_request_free(req);
    ASSERT(!model_check(ctx, &m, dir));
    ASSERT_RC(dcp_request_wait(NULL), DCP_EINVAL);
    ASSERT_RC(dcp_request_test(NULL, &done), DCP_EINVAL);
    ASSERT_RC(dcp_request_test(req = NULL, NULL), DCP_EINVAL);
    dcp_request_free(NULL);
    ASSERT_RC(dcp_save_async(ctx, st, dir, &nosync, NULL), DCP_EINVAL);
    ASSERT_RC(dcp_save_async(NULL, st, dir, &nosync, &req), DCP_EINVAL);
    ASSERT(req == NULL);
    ASSERT_RC(dcp_save_async(ctx, NULL, dir, &nosync, &req), DCP_EINVAL);
    ASSERT(req == NULL);
    ASSERT_RC(dcp_save_async(ctx, st, "", &nosync, &req), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "nothing committed") != NULL);
    (void)polls;
    dcp_state_free(st);
    model_free(&m);
    dcp_ctx_free(ctx);
    rmdir_files(dir);
}

/* Freeing the context with a save in flight: stopped, nothing committed,
 * no data file left, the request reports it. */
TEST(free_ctx_in_flight)
{
    dcp_ctx_options o;
    dcp_ctx *ctx;
    struct model m;
    dcp_state *st;
    dcp_request *req;
    const char *dir = dirpath("freectx");
    int k;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    for (k = 0; k < 2; k++) {
        o.staging_budget = k ? 64 << 10 : 0;
        ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o));
        model_init(&m);
        st = model_state(&m, 1);
        ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
        dcp_ctx_free(ctx);
        ASSERT_RC(dcp_request_wait(req), DCP_EINVAL);
        ASSERT(strstr(dcp_request_errmsg(req), "context was freed") != NULL);
        ASSERT(strstr(dcp_request_errmsg(req), "nothing committed") != NULL);
        ASSERT_RC(dcp_request_wait(req), DCP_EINVAL);
        dcp_request_free(req);
        ASSERT(!has_file(dir, ".metadata"));
        ASSERT_EQ(count_files(dir), 0);
        dcp_state_free(st);
        model_free(&m);
    }
    rmdir_files(dir);
}

/* Freeing the request with the save in flight abandons it; the context
 * goes on. */
TEST(free_request_in_flight)
{
    dcp_ctx *ctx;
    struct model m;
    dcp_state *st;
    dcp_request *req;
    const char *dir = dirpath("freereq");
    const char *dir2 = dirpath("freereq2");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    model_init(&m);
    st = model_state(&m, 1);
    ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
    dcp_request_free(req);
    ASSERT(!has_file(dir, ".metadata"));
    ASSERT_EQ(count_files(dir), 0);
    model_snapshot(&m);
    ASSERT_OK(dcp_save_async(ctx, st, dir2, &nosync, &req));
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    ASSERT(!model_check(ctx, &m, dir2));
    dcp_state_free(st);
    model_free(&m);
    dcp_ctx_free(ctx);
    rmdir_files(dir);
    rmdir_files(dir2);
}

/* The state and its buffers may go as soon as the call returns. */
TEST(free_state_in_flight)
{
    dcp_ctx_options o;
    dcp_ctx *ctx;
    struct model m, keep;
    dcp_state *st;
    dcp_request *req;
    const char *dir = dirpath("freestate");
    int i, k;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    for (k = 0; k < 2; k++) {
        o.staging_budget = k ? 128 << 10 : 0;
        ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o));
        model_init(&m);
        model_init(&keep);
        st = model_state(&m, 1);
        m.step = 42;
        model_snapshot(&m);
        for (i = 0; i < NT; i++)
            memcpy(keep.gold[i], m.gold[i], m.bytes[i]);
        keep.gold_step = 42;
        ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
        dcp_state_free(st);
        model_free(&m); /* the buffers themselves */
        ASSERT_OK(dcp_request_wait(req));
        dcp_request_free(req);
        ASSERT(!model_check(ctx, &keep, dir));
        model_free(&keep);
        dcp_ctx_free(ctx);
    }
    rmdir_files(dir);
}

/* A second save (or a load) on the context completes the first one. */
TEST(one_save_in_flight)
{
    dcp_ctx *ctx;
    struct model m;
    dcp_state *st;
    dcp_request *r1, *r2;
    const char *d1 = dirpath("inflight1"), *d2 = dirpath("inflight2");
    void *gold1[NT];
    int64_t step1;
    int i;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    model_init(&m);
    st = model_state(&m, 1);
    model_snapshot(&m);
    step1 = m.step;
    for (i = 0; i < NT; i++) {
        gold1[i] = malloc(m.bytes[i]);
        memcpy(gold1[i], m.gold[i], m.bytes[i]);
    }
    ASSERT_OK(dcp_save_async(ctx, st, d1, &nosync, &r1));
    model_mutate(&m);
    model_snapshot(&m);
    ASSERT_OK(dcp_save_async(ctx, st, d2, &nosync, &r2));
    /* r1 was completed by the second call. */
    ASSERT(has_file(d1, ".metadata"));
    model_mutate(&m);
    ASSERT_OK(dcp_request_wait(r2));
    ASSERT_OK(dcp_request_wait(r1));
    dcp_request_free(r1);
    dcp_request_free(r2);
    ASSERT(!model_check(ctx, &m, d2));
    for (i = 0; i < NT; i++) {
        memcpy(m.gold[i], gold1[i], m.bytes[i]);
        free(gold1[i]);
    }
    m.gold_step = step1;
    ASSERT(!model_check(ctx, &m, d1));
    /* A load of the path being saved sees the new checkpoint. */
    model_mutate(&m);
    model_snapshot(&m);
    ASSERT_OK(dcp_save_async(ctx, st, d1, &nosync, &r1));
    model_mutate(&m);
    ASSERT(!model_check(ctx, &m, d1));
    ASSERT_OK(dcp_request_wait(r1));
    dcp_request_free(r1);
    dcp_state_free(st);
    model_free(&m);
    dcp_ctx_free(ctx);
    rmdir_files(d1);
    rmdir_files(d2);
}

/* Stateful callbacks: keys, call counts, load_state_dict; failures. */
TEST(stateful_entries)
{
    dcp_ctx *ctx;
    struct model m, got;
    dcp_state *st, *st2;
    dcp_request *req;
    dcp_metadata *md;
    const char *dir = dirpath("stateful"), *dir2 = dirpath("stateful-bad");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    model_init(&m);
    st = model_state(&m, 1);
    m.step = 7;
    ASSERT_OK(dcp_save(ctx, st, dir, &nosync));
    ASSERT_EQ(m.state_dict_calls, 1);
    ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
    ASSERT(dcp_metadata_find(md, "loader.step") >= 0);
    ASSERT(dcp_metadata_find(md, "loader.w") >= 0);
    ASSERT(dcp_metadata_find(md, "loader") < 0);
    dcp_metadata_free(md);
    model_init(&got);
    st2 = model_state(&got, 1);
    ASSERT_OK(dcp_load(ctx, st2, dir, NULL));
    ASSERT_EQ(got.state_dict_calls, 1); /* the template */
    ASSERT_EQ(got.load_calls, 1);
    ASSERT_EQ(got.loaded_step, 7);
    ASSERT_MEM_EQ(got.obj_tensor, m.obj_tensor, 1024 * sizeof(float));
    /* A failing load_state_dict fails the load, naming the entry. */
    got.fail_load = 9;
    ASSERT_RC(dcp_load(ctx, st2, dir, NULL), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx),
                  "stateful 'loader': load_state_dict failed (returned 9)"));
    got.fail_load = 0;
    /* A failing state_dict fails the save: no request, nothing written. */
    m.fail_state_dict = -3;
    req = (dcp_request *)&m;
    ASSERT_RC(dcp_save_async(ctx, st, dir2, &nosync, &req), DCP_EIO);
    ASSERT(req == NULL);
    ASSERT(strstr(dcp_errmsg(ctx),
                  "stateful 'loader': state_dict failed (returned -3)"));
    ASSERT(strstr(dcp_errmsg(ctx), "nothing committed"));
    m.fail_state_dict = 12345; /* not a dcp code */
    ASSERT_RC(dcp_save(ctx, st, dir2, &nosync), DCP_EINVAL);
    ASSERT(count_files(dir2) <= 0);
    /* ... and a failing load-time state_dict fails the load. */
    got.fail_state_dict = 1;
    ASSERT_RC(dcp_load(ctx, st2, dir, NULL), DCP_EINVAL);
    got.fail_state_dict = 0;
    /* Nested stateful entries are refused. */
    m.fail_state_dict = 0;
    m.nested = 1;
    ASSERT_RC(dcp_save(ctx, st, dir2, &nosync), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "nested stateful"));
    m.nested = 0;
    /* Bad registrations. */
    {
        dcp_stateful_ops bad = {0, obj_state_dict, obj_load_state_dict};
        ASSERT_RC(dcp_state_add_stateful(st, "x", &bad, &m), DCP_EINVAL);
        bad.version = 1;
        bad.load_state_dict = NULL;
        ASSERT_RC(dcp_state_add_stateful(st, "x", &bad, &m), DCP_EINVAL);
        ASSERT_RC(dcp_state_add_stateful(st, "x", NULL, &m), DCP_EINVAL);
        ASSERT_RC(dcp_state_add_stateful(st, "loader", &obj_ops, &m),
                  DCP_EINVAL);
    }
    /* A stateful key colliding with a plain one. */
    {
        int64_t shape[1] = {4};
        float four[4] = {1, 2, 3, 4};
        dcp_state *s3;
        ASSERT_OK(dcp_state_create(&s3));
        ASSERT_OK(dcp_state_push(s3, "loader"));
        ASSERT_OK(dcp_state_add_tensor(s3, "w", DCP_F32, 1, shape, NULL, NULL,
                                       four, DCP_MEM_HOST));
        ASSERT_OK(dcp_state_pop(s3));
        ASSERT_OK(dcp_state_add_stateful(s3, "loader", &obj_ops, &m));
        ASSERT_RC(dcp_save(ctx, s3, dir2, &nosync), DCP_EINVAL);
        ASSERT(strstr(dcp_errmsg(ctx), "key 'w' (below a stateful entry) "
                                       "is used twice"));
        dcp_state_free(s3);
    }
    dcp_state_free(st);
    dcp_state_free(st2);
    model_free(&m);
    model_free(&got);
    dcp_ctx_free(ctx);
    rmdir_files(dir);
    rmdir_files(dir2);
}

/* Allocation failures anywhere (caller's thread or worker): a clean error
 * or success, never a hang, a leak or a committed partial checkpoint. */
TEST(allocation_failures)
{
    dcp_ctx *ctx;
    struct model m;
    dcp_state *st;
    dcp_request *req;
    const char *dir = dirpath("oom");
    uint64_t k;
    int ok = 0, failed = 0;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    model_init(&m);
    st = model_state(&m, 1);
    for (k = 1; k < 400 && ok < 3; k++) {
        int rc;
        (void)dcp__alloc_fail_after(k);
        rc = dcp_save_async(ctx, st, dir, &nosync, &req);
        if (rc == DCP_OK) {
            rc = dcp_request_wait(req);
            dcp_request_free(req);
        }
        (void)dcp__alloc_fail_after(0);
        if (rc == DCP_OK) {
            ok++;
            rmdir_files(dir);
        } else {
            failed++;
            ASSERT_RC(rc, DCP_ENOMEM);
            ASSERT(!has_file(dir, ".metadata"));
            ASSERT(count_files(dir) <= 0);
        }
    }
    ASSERT(failed > 10);
    dcp_state_free(st);
    model_free(&m);
    dcp_ctx_free(ctx);
    rmdir_files(dir);
}

/* A communicator whose every operation checks it runs on the thread that
 * created the context: the worker never communicates. */
static pthread_t main_thread;
static int comm_calls, comm_wrong_thread;

static int on_main(void)
{
    comm_calls++;
    if (!pthread_equal(pthread_self(), main_thread))
        comm_wrong_thread++;
    return DCP_OK;
}

static int c_bcast(void *impl, void *buf, size_t len, int rt)
{
    (void)impl, (void)buf, (void)len, (void)rt;
    return on_main();
}

static int c_gather(void *impl, const void *s, size_t len, void *r, int rt)
{
    (void)impl, (void)rt;
    if (len)
        memcpy(r, s, len);
    return on_main();
}

static int c_gatherv(void *impl, const void *s, size_t len, void *r,
                     const size_t *lens, const size_t *displs, int rt)
{
    (void)impl, (void)lens, (void)rt;
    if (len)
        memcpy((char *)r + displs[0], s, len);
    return on_main();
}

static int c_scatterv(void *impl, const void *s, const size_t *lens,
                      const size_t *displs, void *r, size_t len, int rt)
{
    (void)impl, (void)lens, (void)rt;
    if (len)
        memcpy(r, (const char *)s + displs[0], len);
    return on_main();
}

static int c_min(void *impl, int64_t *v, size_t n)
{
    (void)impl, (void)v, (void)n;
    return on_main();
}

static int c_barrier(void *impl)
{
    (void)impl;
    return on_main();
}

TEST(communicator_on_caller_thread)
{
    struct dcp_comm_ops ops = {1,          c_bcast, c_gather,  c_gatherv,
                               c_scatterv, c_min,   c_barrier, NULL,
                               NULL,       NULL,    NULL,      NULL,
                               0};
    dcp_comm *comm;
    dcp_ctx *ctx;
    struct model m;
    dcp_state *st;
    dcp_request *req;
    const char *dir = dirpath("thread");
    int i, done;
    main_thread = pthread_self();
    ASSERT_OK(dcp_comm_create(&ops, NULL, 0, 1, &comm));
    ASSERT_OK(dcp_ctx_create(&ctx, comm, NULL));
    model_init(&m);
    st = model_state(&m, 1);
    for (i = 0; i < 20; i++) {
        model_snapshot(&m);
        ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
        model_mutate(&m);
        do
            ASSERT_OK(dcp_request_test(req, &done));
        while (!done);
        ASSERT_OK(dcp_request_wait(req));
        dcp_request_free(req);
        ASSERT(!model_check(ctx, &m, dir));
    }
    ASSERT(comm_calls > 0);
    ASSERT_EQ(comm_wrong_thread, 0);
    dcp_state_free(st);
    model_free(&m);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    rmdir_files(dir);
}

/* The niceness of the thread of a task of this process (-100 when it
 * cannot be read): field 19 of /proc/self/task/<tid>/stat. */
static int task_nice(const char *tid)
{
    char path[320], buf[1024], *p;
    FILE *f;
    size_t n;
    int i, v = -100;
    snprintf(path, sizeof(path), "/proc/self/task/%s/stat", tid);
    f = fopen(path, "r");
    if (!f)
        return -100;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    p = strrchr(buf, ')'); /* after the thread's name, which may hold spaces */
    for (i = 0; p && i < 17; i++)
        p = strchr(p + 1, ' ');
    if (p)
        v = atoi(p + 1);
    return v;
}

/* How many threads of this process run at niceness nice. */
static int threads_at_nice(int nice)
{
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    int k = 0;
    if (!d)
        return -1;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.' && task_nice(e->d_name) == nice)
            k++;
    closedir(d);
    return k;
}

/* worker_nice: the background writer's thread (and it alone) runs at the
 * caller's niceness + worker_nice; outside 0..19 the context is refused;
 * a caller whose struct_size ends before the field is not read. */
TEST(worker_nice)
{
    dcp_ctx_options o;
    dcp_ctx *ctx;
    struct model m;
    dcp_state *st;
    dcp_request *req;
    const char *dir = dirpath("nice");
    int base;
    errno = 0;
    base = getpriority(PRIO_PROCESS, 0);
    ASSERT(errno == 0);
    if (base + 7 > 19) {
        fprintf(stderr, "     (skipped: niceness %d already)\n", base);
        return;
    }
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.worker_nice = 20;
    ASSERT_RC(dcp_ctx_create(&ctx, NULL, &o), DCP_EINVAL);
    o.worker_nice = -1;
    ASSERT_RC(dcp_ctx_create(&ctx, NULL, &o), DCP_EINVAL);
    o.struct_size = (uint32_t)offsetof(dcp_ctx_options, worker_nice);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o)); /* an older caller */
    dcp_ctx_free(ctx);
    o.struct_size = sizeof(o);
    o.worker_nice = 7;
    model_init(&m);
    st = model_state(&m, 0);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o));
    ASSERT(threads_at_nice(base + 7) == 0);
    ASSERT_OK(dcp_save_async(ctx, st, dir, &nosync, &req));
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    /* the worker thread stays for the next save (with the io_uring
     * workers it started, which inherit its niceness) */
    ASSERT(threads_at_nice(base + 7) >= 1);
    ASSERT(getpriority(PRIO_PROCESS, 0) == base); /* the caller's unchanged */
    model_snapshot(&m);
    ASSERT(!model_check_obj(ctx, &m, dir, 0));
    dcp_ctx_free(ctx);
    {
        /* joined with the context; io_uring's workers end soon after */
        int tries = 0;
        while (threads_at_nice(base + 7) != 0 && tries++ < 500)
            usleep(10000);
        ASSERT(threads_at_nice(base + 7) == 0);
    }
    dcp_state_free(st);
    model_free(&m);
}

int main(void)
{
    RUN(mutate_after_return);
    RUN(staging_buffers_cached);
    RUN(background_failure_full);
    RUN(background_failure_budget);
    RUN(background_failure_sync);
    RUN(wait_twice_and_test);
    RUN(free_ctx_in_flight);
    RUN(free_request_in_flight);
    RUN(free_state_in_flight);
    RUN(one_save_in_flight);
    RUN(stateful_entries);
    RUN(allocation_failures);
    RUN(communicator_on_caller_thread);
    RUN(worker_nice);
    make_root();
    (void)rmdir(root);
    return TEST_SUMMARY();
}
