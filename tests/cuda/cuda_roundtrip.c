/*
 * CUDA device buffers through dcp, self-verifying. Every check is
 * bit-exact against host copies of what the device held:
 *  - device -> checkpoint -> device with dcp_save and dcp_load, and the
 *    cross cases (saved from the device, loaded into host memory; saved
 *    from host memory, loaded into the device), several dtypes, a tensor in
 *    two boxes on two allocations, an empty tensor, a host tensor and a
 *    value in the same state;
 *  - the data file of a device save is byte-identical to that of a host
 *    save of the same values;
 *  - dcp_save_async with the device buffers overwritten right after the
 *    call returns, 20 iterations, with the whole state staged and with a
 *    64 KiB staging budget (staging in pieces); the checkpoint holds the
 *    values of the call.
 *
 *   cuda_roundtrip [--gpu | --fake | --expect-missing] [DIR]
 *
 * --gpu (default): the real libcudart (DCP_CUDART, else libcudart.so,
 *   .so.13, .so.12, .so.11.0) and a device. Exits 77 (ctest: skipped)
 *   with a message when libcudart or a device is missing.
 * --fake: DCP_CUDART names tests/cuda/fake_cudart.c's library (device
 *   memory there is inaccessible from the host, so any host dereference of
 *   a device pointer by dcp crashes). Also checks that every asynchronous
 *   device-to-host copy went into page-locked memory, that the staging
 *   buffers are unregistered when the context is freed, and that a failing
 *   cudaMemcpyAsync is reported by dcp_request_wait with nothing committed.
 * --expect-missing: DCP_CUDART names a missing file: saving or loading
 *   CUDA entries fails with DCP_ENOTSUP, naming the key and libcudart.
 * Prints "N passed, N failed"; exit status 0 when every check passed.
 */
#include <dcp/dcp.h>

#include <dlfcn.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../sidmask.h"

#define KIND_DEFAULT 4 /* cudaMemcpyDefault */

static struct {
    void *lib;
    int (*dev_count)(int *);
    int (*dmalloc)(void **, size_t);
    int (*dfree)(void *);
    int (*copy)(void *, const void *, size_t, int);
    int (*dsync)(void);
    void (*stats)(long *, long *, long *, long *);
    void (*fail_after)(long);
} cu;

static int npass, nfail, cur_fail;
static dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

#define CHECK(c)                                                             \
    do {                                                                     \
        if (!(c)) {                                                          \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                    #c);                                                     \
            cur_fail = 1;                                                    \
        }                                                                    \
    } while (0)

#define CHECK_RC(ctx, call, want)                                           \
    do {                                                                    \
        int rc_ = (call);                                                   \
        if (rc_ != (want)) {                                                \
            fprintf(stderr, "%s:%d: %s: got %s, want %s (%s)\n", __FILE__,  \
                    __LINE__, #call, dcp_err_name(rc_), dcp_err_name(want), \
                    dcp_errmsg(ctx));                                       \
            cur_fail = 1;                                                   \
        }                                                                   \
    } while (0)

#define RUN(fn)                                                      \
    do {                                                             \
        cur_fail = 0;                                                \
        fn();                                                        \
        fprintf(stderr, "%s %s\n", cur_fail ? "FAIL" : "ok  ", #fn); \
        if (cur_fail)                                                \
            nfail++;                                                 \
        else                                                         \
            npass++;                                                 \
    } while (0)

/* dlsym into a function pointer (POSIX guarantees the representation). */
static int sym(void *dst, const char *name, int required)
{
    void *s = dlsym(cu.lib, name);
    if (!s)
        return required ? -1 : 0;
    memcpy(dst, &s, sizeof(s));
    return 0;
}

static const char *open_cudart(void)
{
    static char why[1024];
    static const char *names[] = {"libcudart.so", "libcudart.so.13",
                                  "libcudart.so.12", "libcudart.so.11.0"};
    const char *env = getenv("DCP_CUDART");
    size_t i;
    if (env && *env) {
        cu.lib = dlopen(env, RTLD_NOW | RTLD_LOCAL);
    } else {
        for (i = 0; i < sizeof(names) / sizeof(names[0]) && !cu.lib; i++)
            cu.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    }
    if (!cu.lib) {
        snprintf(why, sizeof(why), "libcudart not found (%s)", dlerror());
        return why;
    }
    if (sym(&cu.dev_count, "cudaGetDeviceCount", 1) ||
        sym(&cu.dmalloc, "cudaMalloc", 1) || sym(&cu.dfree, "cudaFree", 1) ||
        sym(&cu.copy, "cudaMemcpy", 1) ||
        sym(&cu.dsync, "cudaDeviceSynchronize", 1) ||
        sym(&cu.stats, "fake_cudart_stats", 0) ||
        sym(&cu.fail_after, "fake_cudart_fail_async_after", 0))
        return "libcudart lacks a function this test needs";
    return NULL;
}

/* ------------------------------------------------------------ the data */

#define NT 6
static const struct {
    const char *name;
    dcp_dtype dt;
    int64_t rows, cols;
    int host; /* lives in host memory even in the device state */
} spec[NT] = {
    {"w", DCP_F32, 300, 257, 0}, {"b", DCP_BF16, 1, 4099, 0},
    {"e", DCP_I64, 64, 33, 0},   {"empty", DCP_F16, 0, 7, 0},
    {"h", DCP_U8, 1, 1000, 1},   {"big", DCP_F32, 256, 0, 0},
};
static int64_t big_cols; /* set by mode: 1 MiB (fake) or 64 MiB (gpu) */

struct bufs {
    void *p[NT]; /* device (or host) buffers; e: rows [0,20) */
    void *p2;    /* e: rows [20,64), a separate allocation */
    size_t n[NT];
    int on_device;
};

static int64_t cols_of(int i)
{
    return i == 5 ? big_cols : spec[i].cols;
}

static size_t bytes_of(int i)
{
    return (size_t)(spec[i].rows * cols_of(i)) * dcp_dtype_size(spec[i].dt);
}

static void *dev_alloc(size_t n)
{
    void *p = NULL;
    if (!n)
        return NULL;
    if (cu.dmalloc(&p, n) != 0) {
        fprintf(stderr, "cudaMalloc(%zu) failed\n", n);
        exit(1);
    }
    return p;
}

static void bufs_alloc(struct bufs *b, int on_device)
{
    int i;
    memset(b, 0, sizeof(*b));
    b->on_device = on_device;
    for (i = 0; i < NT; i++) {
        size_t n = bytes_of(i);
        b->n[i] = n;
        if (i == 2) {
            size_t first = 20 * 33 * 8;
            b->p[i] = on_device ? dev_alloc(first) : calloc(1, first);
            b->p2 = on_device ? dev_alloc(n - first) : calloc(1, n - first);
        } else if (on_device && !spec[i].host) {
            b->p[i] = dev_alloc(n);
        } else {
            b->p[i] = n ? calloc(1, n) : NULL;
        }
    }
}

static void bufs_free(struct bufs *b)
{
    int i;
    for (i = 0; i < NT; i++) {
        if (b->on_device && !spec[i].host)
            (void)cu.dfree(b->p[i]);
        else
            free(b->p[i]);
    }
    if (b->on_device)
        (void)cu.dfree(b->p2);
    else
        free(b->p2);
}

/* Tensor i of b as contiguous host bytes (into out) or from them. */
static void xfer(struct bufs *b, int i, unsigned char *host, int to_b)
{
    size_t first = 20 * 33 * 8;
    int dev = b->on_device && !spec[i].host;
    void *parts[2] = {b->p[i], b->p2};
    size_t lens[2] = {i == 2 ? first : b->n[i], i == 2 ? b->n[i] - first : 0};
    size_t k, off = 0;
    for (k = 0; k < 2; k++) {
        if (!lens[k])
            continue;
        if (dev && to_b)
            CHECK(cu.copy(parts[k], host + off, lens[k], KIND_DEFAULT) == 0);
        else if (dev)
            CHECK(cu.copy(host + off, parts[k], lens[k], KIND_DEFAULT) == 0);
        else if (to_b)
            memcpy(parts[k], host + off, lens[k]);
        else
            memcpy(host + off, parts[k], lens[k]);
        off += lens[k];
    }
}

static void pattern(unsigned char *p, size_t n, unsigned seed)
{
    uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
    size_t i;
    for (i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (unsigned char)x;
    }
}

/* gold[i] <- pattern(seed), and into b. */
static void fill(struct bufs *b, unsigned char **gold, unsigned seed)
{
    int i;
    for (i = 0; i < NT; i++) {
        pattern(gold[i], b->n[i], seed * 31 + (unsigned)i);
        xfer(b, i, gold[i], 1);
    }
}

/* b's contents equal gold? */
static int same(struct bufs *b, unsigned char **gold)
{
    int i, ok = 1;
    for (i = 0; i < NT; i++) {
        unsigned char *tmp = malloc(b->n[i] ? b->n[i] : 1);
        xfer(b, i, tmp, 0);
        if (memcmp(tmp, gold[i], b->n[i]) != 0) {
            fprintf(stderr, "tensor '%s' differs\n", spec[i].name);
            ok = 0;
        }
        free(tmp);
    }
    return ok;
}

static dcp_state *state_of(struct bufs *b, int64_t step)
{
    dcp_state *st;
    int i;
    if (dcp_state_create(&st) || dcp_state_push(st, "model"))
        exit(1);
    for (i = 0; i < NT; i++) {
        int64_t shape[2] = {spec[i].rows, cols_of(i)};
        dcp_mem mem =
            b->on_device && !spec[i].host ? DCP_MEM_CUDA : DCP_MEM_HOST;
        int rc;
        if (i == 2) {
            int64_t o0[2] = {0, 0}, s0[2] = {20, 33}, o1[2] = {20, 0},
                    s1[2] = {44, 33};
            rc = dcp_state_add_tensor(st, spec[i].name, spec[i].dt, 2, shape,
                                      o0, s0, b->p[i], mem);
            if (!rc)
                rc = dcp_state_add_tensor(st, spec[i].name, spec[i].dt, 2,
                                          shape, o1, s1, b->p2, mem);
        } else {
            rc = dcp_state_add_tensor(st, spec[i].name, spec[i].dt, 2, shape,
                                      NULL, NULL, b->p[i], mem);
        }
        if (rc) {
            fprintf(stderr, "add '%s': %s\n", spec[i].name, dcp_err_name(rc));
            exit(1);
        }
    }
    if (dcp_state_pop(st) ||
        dcp_state_add_value(st, "step", dcp_value_int(step)))
        exit(1);
    return st;
}

/* ------------------------------------------------------------- helpers */

static char root[256];

static const char *sub(const char *name)
{
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[800];
    if (!d)
        return;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        (void)unlink(p);
    }
    closedir(d);
    (void)rmdir(dir);
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *p;
    long len;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    p = malloc((size_t)len + 1);
    if (fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    fclose(f);
    *n = (size_t)len;
    /* Each save's id is in its records (sidmask.h): the rest compares. */
    if (p)
        (void)dcp_test_mask_sids(p, *n);
    return p;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned char *gold[NT];

static void gold_alloc(void)
{
    int i;
    for (i = 0; i < NT; i++)
        gold[i] = malloc(bytes_of(i) ? bytes_of(i) : 1);
}

/* --------------------------------------------------------------- tests */

static void sync_roundtrips(void)
{
    dcp_ctx *ctx;
    struct bufs dev, dev2, host;
    dcp_state *st, *st2, *sh;
    const char *d1 = sub("sync-dev"), *d2 = sub("sync-host");
    unsigned char *f1, *f2;
    size_t n1 = 0, n2 = 0;
    char p1[600], p2[600];
    CHECK_RC(NULL, dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    bufs_alloc(&dev, 1);
    bufs_alloc(&dev2, 1);
    bufs_alloc(&host, 0);
    fill(&dev, gold, 1);
    st = state_of(&dev, 5);
    st2 = state_of(&dev2, 0);
    sh = state_of(&host, 5);
    CHECK_RC(ctx, dcp_save(ctx, st, d1, NULL), DCP_OK);
    CHECK_RC(ctx, dcp_verify(ctx, d1), DCP_OK);
    /* device -> device */
    CHECK_RC(ctx, dcp_load(ctx, st2, d1, NULL), DCP_OK);
    CHECK(same(&dev2, gold));
    CHECK(dcp_value_as_int(dcp_state_value(st2, "step")) == 5);
    /* device -> host */
    CHECK_RC(ctx, dcp_load(ctx, sh, d1, NULL), DCP_OK);
    CHECK(same(&host, gold));
    /* host -> device, and the files of both saves are identical */
    CHECK_RC(ctx, dcp_save(ctx, sh, d2, NULL), DCP_OK);
    fill(&dev2, gold, 99); /* junk */
    fill(&host, gold, 1);  /* gold back to seed 1 */
    CHECK_RC(ctx, dcp_load(ctx, st2, d2, NULL), DCP_OK);
    CHECK(same(&dev2, gold));
    snprintf(p1, sizeof(p1), "%s/__0_0.distcp", d1);
    snprintf(p2, sizeof(p2), "%s/__0_0.distcp", d2);
    f1 = slurp(p1, &n1);
    f2 = slurp(p2, &n2);
    CHECK(f1 && f2 && n1 == n2 && memcmp(f1, f2, n1) == 0);
    free(f2);
    /* A synchronous save through a 64 KiB staging budget: the same file. */
    {
        dcp_ctx_options o;
        dcp_ctx *tight;
        const char *d3 = sub("sync-budget");
        char p3[600];
        memset(&o, 0, sizeof(o));
        o.struct_size = sizeof(o);
        o.staging_budget = 64 << 10;
        CHECK_RC(NULL, dcp_ctx_create(&tight, NULL, &o), DCP_OK);
        CHECK_RC(tight, dcp_save(tight, st, d3, NULL), DCP_OK);
        CHECK(dcp_ctx_staging_bytes(tight) == 64 << 10);
        snprintf(p3, sizeof(p3), "%s/__0_0.distcp", d3);
        f2 = slurp(p3, &n2);
        CHECK(f1 && f2 && n1 == n2 && memcmp(f1, f2, n1) == 0);
        free(f2);
        dcp_ctx_free(tight);
        rm_dir(d3);
    }
    free(f1);
    dcp_state_free(st);
    dcp_state_free(st2);
    dcp_state_free(sh);
    bufs_free(&dev);
    bufs_free(&dev2);
    bufs_free(&host);
    dcp_ctx_free(ctx);
    rm_dir(d1);
    rm_dir(d2);
}

static void async_overwrite_after_return(void)
{
    dcp_ctx_options o;
    dcp_ctx *full, *tight;
    struct bufs dev, dev2;
    dcp_state *st, *st2;
    unsigned char *junk[NT];
    const char *dir = sub("async");
    double block = 0, total = 0;
    int it, i;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.staging_budget = 64 << 10;
    CHECK_RC(NULL, dcp_ctx_create(&full, NULL, NULL), DCP_OK);
    CHECK_RC(NULL, dcp_ctx_create(&tight, NULL, &o), DCP_OK);
    bufs_alloc(&dev, 1);
    bufs_alloc(&dev2, 1);
    for (i = 0; i < NT; i++)
        junk[i] = malloc(bytes_of(i) ? bytes_of(i) : 1);
    st = state_of(&dev, 0);
    st2 = state_of(&dev2, 0);
    for (it = 0; it < 20 && !cur_fail; it++) {
        dcp_ctx *ctx = it % 2 ? tight : full;
        dcp_request *req = NULL;
        double t0, t1;
        fill(&dev, gold, 100 + (unsigned)it);
        (void)cu.dsync();
        t0 = now();
        CHECK_RC(ctx, dcp_save_async(ctx, st, dir, &nosync, &req), DCP_OK);
        t1 = now();
        /* Overwrite every device buffer at once. */
        for (i = 0; i < NT; i++) {
            pattern(junk[i], bytes_of(i), 7000 + (unsigned)it);
            xfer(&dev, i, junk[i], 1);
        }
        CHECK_RC(ctx, dcp_request_wait(req), DCP_OK);
        if (it % 2 == 0) {
            block += t1 - t0;
            total += now() - t0;
        }
        dcp_request_free(req);
        CHECK_RC(full, dcp_load(full, st2, dir, NULL), DCP_OK);
        if (!same(&dev2, gold)) {
            fprintf(stderr, "iteration %d (%s staging) differs\n", it,
                    it % 2 ? "budget" : "full");
            cur_fail = 1;
        }
    }
    CHECK(dcp_ctx_staging_bytes(tight) <= o.staging_budget);
    fprintf(stderr,
            "     async save of %.1f MiB from the device: %.2f ms blocking, "
            "%.2f ms to completion (mean of 10)\n",
            (double)(bytes_of(0) + bytes_of(1) + bytes_of(2) + bytes_of(5)) /
                1048576.0,
            block * 100, total * 100);
    for (i = 0; i < NT; i++)
        free(junk[i]);
    dcp_state_free(st);
    dcp_state_free(st2);
    bufs_free(&dev);
    bufs_free(&dev2);
    dcp_ctx_free(full);
    dcp_ctx_free(tight);
    rm_dir(dir);
}

/* Fake libcudart only: pinned copies, unregistration, copy failures. */
static void fake_checks(void)
{
    dcp_ctx *ctx;
    struct bufs dev;
    dcp_state *st;
    dcp_request *req = NULL;
    const char *dir = sub("fail");
    long copies, pageable, reg, bad;
    char meta[600];
    cu.stats(&copies, &pageable, &reg, &bad);
    CHECK(copies > 0);
    CHECK(pageable == 0);
    CHECK(reg == 0); /* every context freed so far unregistered its arena */
    CHECK(bad == 0);
    CHECK_RC(NULL, dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    bufs_alloc(&dev, 1);
    fill(&dev, gold, 3);
    st = state_of(&dev, 0);
    cu.fail_after(2);
    CHECK_RC(ctx, dcp_save_async(ctx, st, dir, &nosync, &req), DCP_OK);
    CHECK_RC(ctx, dcp_request_wait(req), DCP_EIO);
    CHECK(strstr(dcp_request_errmsg(req), "cudaMemcpyAsync failed") != NULL);
    CHECK(strstr(dcp_request_errmsg(req), "nothing committed") != NULL);
    dcp_request_free(req);
    cu.fail_after(0);
    snprintf(meta, sizeof(meta), "%s/.metadata", dir);
    CHECK(access(meta, F_OK) != 0);
    CHECK_RC(ctx, dcp_save(ctx, st, dir, &nosync), DCP_OK);
    CHECK(access(meta, F_OK) == 0);
    cu.stats(&copies, &pageable, &reg, &bad);
    CHECK(reg == 1);
    dcp_ctx_free(ctx);
    cu.stats(&copies, &pageable, &reg, &bad);
    CHECK(reg == 0 && bad == 0 && pageable == 0);
    dcp_state_free(st);
    bufs_free(&dev);
    rm_dir(dir);
}

static void expect_missing(void)
{
    dcp_ctx *ctx;
    dcp_state *st;
    dcp_request *req = NULL;
    int64_t shape[1] = {16};
    const char *dir = sub("missing");
    /* Never dereferenced: dcp must fail before touching it. */
    void *devptr = (void *)(uintptr_t)0x1000;
    CHECK_RC(NULL, dcp_ctx_create(&ctx, NULL, NULL), DCP_OK);
    CHECK_RC(NULL, dcp_state_create(&st), DCP_OK);
    CHECK_RC(NULL,
             dcp_state_add_tensor(st, "model.w", DCP_F32, 1, shape, NULL, NULL,
                                  devptr, DCP_MEM_CUDA),
             DCP_OK);
    CHECK_RC(ctx, dcp_save(ctx, st, dir, NULL), DCP_ENOTSUP);
    CHECK(strstr(dcp_errmsg(ctx), "'model.w'") != NULL);
    CHECK(strstr(dcp_errmsg(ctx), "libcudart") != NULL);
    fprintf(stderr, "     message: %s\n", dcp_errmsg(ctx));
    CHECK_RC(ctx, dcp_save_async(ctx, st, dir, NULL, &req), DCP_ENOTSUP);
    CHECK(req == NULL);
    CHECK_RC(ctx, dcp_load(ctx, st, dir, NULL), DCP_ENOTSUP);
    CHECK(access(dir, F_OK) != 0); /* nothing created */
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "--gpu";
    const char *why;
    int n = 0;
    if (argc > 2)
        snprintf(root, sizeof(root), "%s", argv[2]);
    else
        snprintf(root, sizeof(root), "/tmp/dcp-cuda-XXXXXX");
    if (argc <= 2 && !mkdtemp(root))
        return 1;
    (void)mkdir(root, 0755);
    if (!strcmp(mode, "--expect-missing")) {
        RUN(expect_missing);
        (void)rmdir(root);
        printf("%d passed, %d failed\n", npass, nfail);
        return nfail ? 1 : 0;
    }
    why = open_cudart();
    if (!why && (cu.dev_count(&n) != 0 || n < 1))
        why = "no CUDA device";
    if (why) {
        (void)rmdir(root);
        if (!strcmp(mode, "--gpu")) {
            printf("SKIP: %s: the CUDA round trips need libcudart and a "
                   "GPU\n",
                   why);
            return 77;
        }
        fprintf(stderr, "cuda_roundtrip: %s\n", why);
        return 1;
    }
    if (!strcmp(mode, "--fake") && (!cu.stats || !cu.fail_after)) {
        fprintf(stderr, "cuda_roundtrip: --fake needs DCP_CUDART to name "
                        "the fake libcudart\n");
        return 1;
    }
    big_cols = !strcmp(mode, "--gpu") ? 65536 : 1024; /* 64 MiB / 1 MiB */
    gold_alloc();
    RUN(sync_roundtrips);
    RUN(async_overwrite_after_return);
    if (cu.stats)
        RUN(fake_checks);
    (void)rmdir(root);
    printf("%d passed, %d failed\n", npass, nfail);
    return nfail ? 1 : 0;
}
