/*
 * Storage contract version 2 (dcp_storage.h) beyond POSIX:
 *  - an in-memory version-2 back end (memstore.c) that declares
 *    max_inflight > 1 carries a full save and load, bit-exact, committed
 *    through its publish (no rename), and receives several requests in
 *    flight at once from the I/O engine, on save (also dcp_save_async)
 *    and on load; a request failing on a pool thread fails the call;
 *  - exclusive publish refuses an existing object (DCP_EEXIST), changing
 *    nothing; listing is bounded (DCP_ELIMIT) and sorted;
 *  - a failed publish commits nothing: the previous checkpoint still loads
 *    (memstore, and faultfs failing the rename of the version-1 adapter);
 *  - a version-1 back end (faultfs as it is) still saves and loads through
 *    the adapters, and refuses an exclusive publish (DCP_ENOTSUP).
 */
#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "faultfs.h"
#include "memstore.h"
#include "storage.h"
#include "test.h"
#include "../tmpnames.h"

#define N_A (1u << 20) /* 4 MiB of f32: 64 requests of 64 KiB */
#define N_B 1000

static char root[256];

static float *mk_a(unsigned seed)
{
    float *a = malloc(N_A * sizeof(*a));
    uint32_t x = seed * 2654435761u + 1;
    size_t i;
    for (i = 0; i < N_A; i++) {
        x = x * 1664525u + 1013904223u;
        a[i] = (float)(x >> 8) / 65536.0f;
    }
    return a;
}

static int64_t *mk_b(unsigned seed)
{
    int64_t *b = malloc(N_B * sizeof(*b));
    size_t i;
    for (i = 0; i < N_B; i++)
        b[i] = (int64_t)(i * 7919u + seed) - 500;
    return b;
}

static dcp_ctx *ctx_on(const dcp_storage_ops *ops, void *impl)
{
    dcp_ctx_options o = {0};
    dcp_ctx *ctx = NULL;
    o.struct_size = sizeof(o);
    o.io_depth = 8;
    o.io_block_bytes = 64 << 10;
    o.storage = ops;
    o.storage_impl = impl;
    if (dcp_ctx_create(&ctx, NULL, &o) != DCP_OK)
        abort();
    return ctx;
}

static int use_async; /* save_seed: dcp_save_async + dcp_request_wait */

/* Saves the state of seed into dir; returns dcp_save's code. */
static int save_seed(dcp_ctx *ctx, const char *dir, unsigned seed)
{
    float *a = mk_a(seed);
    int64_t *b = mk_b(seed);
    int64_t sa[1] = {N_A}, sb[1] = {N_B};
    dcp_state *st;
    int rc;
    if (dcp_state_create(&st) || !a || !b)
        abort();
    if (dcp_state_add_tensor(st, "a", DCP_F32, 1, sa, NULL, NULL, a,
                             DCP_MEM_HOST) ||
        dcp_state_add_tensor(st, "b", DCP_I64, 1, sb, NULL, NULL, b,
                             DCP_MEM_HOST))
        abort();
    if (use_async) {
        dcp_request *req = NULL;
        rc = dcp_save_async(ctx, st, dir, NULL, &req);
        if (rc == DCP_OK)
            rc = dcp_request_wait(req);
        dcp_request_free(req);
    } else {
        rc = dcp_save(ctx, st, dir, NULL);
    }
    dcp_state_free(st);
    free(a);
    free(b);
    return rc;
}

/* Loads dir and checks it holds seed's state bit for bit. */
static int load_is_seed(dcp_ctx *ctx, const char *dir, unsigned seed)
{
    float *a = mk_a(seed), *ga = calloc(N_A, sizeof(float));
    int64_t *b = mk_b(seed), *gb = calloc(N_B, sizeof(int64_t));
    int64_t sa[1] = {N_A}, sb[1] = {N_B};
    dcp_state *st;
    int rc;
    if (dcp_state_create(&st) || !a || !b || !ga || !gb)
        abort();
    if (dcp_state_add_tensor(st, "a", DCP_F32, 1, sa, NULL, NULL, ga,
                             DCP_MEM_HOST) ||
        dcp_state_add_tensor(st, "b", DCP_I64, 1, sb, NULL, NULL, gb,
                             DCP_MEM_HOST))
        abort();
    rc = dcp_load(ctx, st, dir, NULL);
    if (rc == DCP_OK && (memcmp(a, ga, N_A * sizeof(float)) ||
                         memcmp(b, gb, N_B * sizeof(int64_t))))
        rc = 99; /* not bit-exact */
    dcp_state_free(st);
    free(a);
    free(b);
    free(ga);
    free(gb);
    return rc;
}

TEST(memstore_round_trip_in_parallel)
{
    struct memstore m;
    dcp_ctx *ctx;
    size_t i;
    ms_init(&m, 4);
    m.delay_us = 500;
    ctx = ctx_on(ms_ops(&m), &m);
    ASSERT_OK(save_seed(ctx, "mem://ckpt", 1));
    /* Several writes were in flight at once, never more than declared. */
    ASSERT(atomic_load(&m.writes) >= 64);
    ASSERT(atomic_load(&m.max_seen) > 1);
    ASSERT(atomic_load(&m.max_seen) <= 4);
    /* Locked and committed through publish (the exclusive ".lock", then
     * ".metadata"): no temporary, no rename, the lock gone after. */
    ASSERT_EQ(m.publishes, 2);
    ASSERT_EQ(m.renames, 0);
    ASSERT(ms_find(&m, ".metadata") != NULL);
    ASSERT(ms_find(&m, ".lock") == NULL);
    for (i = 0; i < m.nobj; i++)
        ASSERT(strstr(m.obj[i].name, ".tmp") == NULL);
    atomic_store(&m.max_seen, 0);
    ASSERT_OK(load_is_seed(ctx, "mem://ckpt", 1));
    ASSERT(atomic_load(&m.reads) >= 64);
    ASSERT(atomic_load(&m.max_seen) > 1);
    ASSERT(atomic_load(&m.max_seen) <= 4);
    ASSERT_OK(dcp_verify(ctx, "mem://ckpt"));
    ASSERT_EQ(m.open_handles, 0);
    dcp_ctx_free(ctx);
    ms_free(&m);
}

/* The same through dcp_save_async: the engine's pool runs under the
 * context's writer thread. */
TEST(memstore_async_save_in_parallel)
{
    struct memstore m;
    dcp_ctx *ctx;
    ms_init(&m, 3);
    m.delay_us = 500;
    ctx = ctx_on(ms_ops(&m), &m);
    use_async = 1;
    ASSERT_OK(save_seed(ctx, "mem://ckpt", 10));
    ASSERT_OK(save_seed(ctx, "mem://ckpt", 11)); /* over it */
    use_async = 0;
    ASSERT(atomic_load(&m.max_seen) > 1);
    ASSERT(atomic_load(&m.max_seen) <= 3);
    ASSERT_OK(load_is_seed(ctx, "mem://ckpt", 11));
    ASSERT_EQ(m.open_handles, 0);
    dcp_ctx_free(ctx);
    ms_free(&m);
}

/* max_inflight 1: the version-1 rule, one request at a time. */
TEST(memstore_one_at_a_time)
{
    struct memstore m;
    dcp_ctx *ctx;
    ms_init(&m, 1);
    m.delay_us = 50;
    ctx = ctx_on(ms_ops(&m), &m);
    ASSERT_OK(save_seed(ctx, "mem://ckpt", 2));
    ASSERT_OK(load_is_seed(ctx, "mem://ckpt", 2));
    ASSERT_EQ(atomic_load(&m.max_seen), 1);
    dcp_ctx_free(ctx);
    ms_free(&m);
}

TEST(memstore_failed_publish_keeps_old_checkpoint)
{
    struct memstore m;
    dcp_ctx *ctx;
    const struct ms_object *md;
    uint8_t *before;
    size_t len;
    ms_init(&m, 4);
    ctx = ctx_on(ms_ops(&m), &m);
    ASSERT_OK(save_seed(ctx, "mem://ckpt", 3));
    md = ms_find(&m, ".metadata");
    ASSERT(md != NULL);
    len = md->len;
    before = malloc(len);
    memcpy(before, md->p, len);
    m.fail_publish = DCP_EIO;
    ASSERT_RC(save_seed(ctx, "mem://ckpt", 4), DCP_EIO);
    ASSERT(strstr(dcp_errmsg(ctx), "injected") != NULL);
    md = ms_find(&m, ".metadata");
    ASSERT(md != NULL && md->len == len && !memcmp(md->p, before, len));
    m.fail_publish = 0;
    ASSERT_OK(load_is_seed(ctx, "mem://ckpt", 3));
    free(before);
    dcp_ctx_free(ctx);
    ms_free(&m);
}

/* A request failing on a pool thread fails the save or load with the back
 * end's code and message; the committed checkpoint stays. */
TEST(memstore_concurrent_request_fails)
{
    struct memstore m;
    dcp_ctx *ctx;
    ms_init(&m, 4);
    m.delay_us = 200;
    ctx = ctx_on(ms_ops(&m), &m);
    ASSERT_OK(save_seed(ctx, "mem://ckpt", 8));
    atomic_store(&m.writes, 0);
    m.fail_write_at = 10;
    ASSERT_RC(save_seed(ctx, "mem://ckpt", 9), DCP_ENOSPC);
    ASSERT(strstr(dcp_errmsg(ctx), "injected") != NULL);
    ASSERT(strstr(dcp_errmsg(ctx), ".distcp") != NULL);
    m.fail_write_at = 0;
    atomic_store(&m.reads, 0);
    m.fail_read_at = 7;
    ASSERT_RC(load_is_seed(ctx, "mem://ckpt", 8), DCP_EIO);
    ASSERT(strstr(dcp_errmsg(ctx), "injected") != NULL);
    m.fail_read_at = 0;
    ASSERT_OK(load_is_seed(ctx, "mem://ckpt", 8));
    ASSERT_EQ(m.open_handles, 0);
    dcp_ctx_free(ctx);
    ms_free(&m);
}

TEST(memstore_exclusive_publish_and_list)
{
    struct memstore m;
    dcp_ctx *ctx;
    dcp_storage_entry ents[8];
    size_t n;
    int dirfd, vis;
    struct dcp_err *err = NULL;
    char name[32];
    int i;
    struct dcp__storage s;
    ms_init(&m, 2);
    ctx = ctx_on(ms_ops(&m), &m);
    ASSERT_OK(dcp__storage_init(&s, ms_ops(&m), &m));
    dcp__storage_use(&s);
    ASSERT_OK(dcp__fs_open_dir("mem://x", &dirfd, err));
    ASSERT_OK(dcp__fs_publish(dirfd, "mem://x", ".lock", "holder-1", 8,
                              DCP_PUBLISH_EXCLUSIVE, &vis, err));
    ASSERT_EQ(vis, 1);
    ASSERT_RC(dcp__fs_publish(dirfd, "mem://x", ".lock", "holder-2", 8,
                              DCP_PUBLISH_EXCLUSIVE, &vis, err),
              DCP_EEXIST);
    ASSERT_EQ(vis, 0);
    ASSERT(!memcmp(ms_find(&m, ".lock")->p, "holder-1", 8));
    /* Released (unlink), it can be taken again. */
    ASSERT_OK(dcp__fs_unlink(dirfd, ".lock", err));
    ASSERT_OK(dcp__fs_publish(dirfd, "mem://x", ".lock", "holder-2", 8,
                              DCP_PUBLISH_EXCLUSIVE, &vis, err));
    for (i = 5; i >= 0; i--) {
        snprintf(name, sizeof(name), "__%d_0.distcp", i);
        ASSERT_OK(dcp__fs_put(dirfd, name, name, strlen(name), err));
    }
    ASSERT_EQ(m.puts, 6);
    ASSERT_RC(dcp__fs_list(dirfd, "__", 4, ents, &n, err), DCP_ELIMIT);
    ASSERT_EQ(n, 4);
    ASSERT_OK(dcp__fs_list(dirfd, "__", 6, ents, &n, err));
    ASSERT_EQ(n, 6);
    ASSERT_STR_EQ(ents[0].name, "__0_0.distcp");
    ASSERT_STR_EQ(ents[1].name, "__1_0.distcp");
    ASSERT_U64_EQ(ents[1].size, 12);
    ASSERT_OK(dcp__fs_list(dirfd, ".lo", 4, ents, &n, err));
    ASSERT_EQ(n, 1);
    ASSERT_STR_EQ(ents[0].name, ".lock");
    dcp__fs_release(dirfd);
    dcp__storage_use(NULL);
    dcp_ctx_free(ctx);
    ms_free(&m);
}

/* A version-1 back end (faultfs) through the adapters. */
TEST(v1_backend_through_adapters)
{
    struct faultfs ff;
    dcp_ctx *ctx;
    char dir[300], p[400];
    dcp_storage_entry ents[2];
    size_t n;
    int dirfd, vis;
    FILE *f;
    struct dcp__storage s;
    ff_init(&ff);
    snprintf(dir, sizeof(dir), "%s/v1", root);
    ctx = ctx_on(ff_ops(), &ff);
    ASSERT_OK(save_seed(ctx, dir, 5));
    ASSERT_OK(load_is_seed(ctx, dir, 5));
    ASSERT_EQ(ff.op_count[FF_RENAME], 1); /* the commit, by rename */
    ASSERT_OK(dcp__storage_init(&s, ff_ops(), &ff));
    dcp__storage_use(&s);
    /* Exclusive publish needs a real no-replace primitive. */
    ASSERT_OK(dcp__fs_open_dir(dir, &dirfd, NULL));
    ASSERT_RC(dcp__fs_publish(dirfd, dir, ".lock", "x", 1,
                              DCP_PUBLISH_EXCLUSIVE, &vis, NULL),
              DCP_ENOTSUP);
    ASSERT_RC(dcp__fs_list(dirfd, "", 2, ents, &n, NULL), DCP_ENOTSUP);
    /* put through create, write_at, sync, close, rename. */
    ASSERT_OK(dcp__fs_put(dirfd, "obj", "hello", 5, NULL));
    snprintf(p, sizeof(p), "%s/obj", dir);
    f = fopen(p, "rb");
    ASSERT(f != NULL);
    if (f) {
        char buf[8] = {0};
        ASSERT_EQ(fread(buf, 1, 8, f), 5);
        ASSERT_STR_EQ(buf, "hello");
        fclose(f);
    }
    snprintf(p, sizeof(p), "%s/obj.tmp", dir);
    ASSERT(fopen(p, "rb") == NULL);
    dcp__fs_release(dirfd);
    dcp__storage_use(NULL);
    dcp_ctx_free(ctx);
    ff_release(&ff);
}

/* The publish of a version-1 back end fails at its rename: the old
 * checkpoint stays and loads, no temporary is left. */
TEST(v1_failed_publish_keeps_old_checkpoint)
{
    struct faultfs ff;
    dcp_ctx *ctx;
    char dir[300];
    ff_init(&ff);
    snprintf(dir, sizeof(dir), "%s/v1fail", root);
    ctx = ctx_on(ff_ops(), &ff);
    ASSERT_OK(save_seed(ctx, dir, 6));
    ff_reset(&ff);
    ff.fail_mask = 1u << FF_RENAME;
    ff.fail_at = 1;
    ff.fail_code = DCP_EIO;
    ASSERT_RC(save_seed(ctx, dir, 7), DCP_EIO);
    ff_reset(&ff);
    ASSERT_OK(load_is_seed(ctx, dir, 6));
    ASSERT_EQ(dcp_test_meta_tmps(dir), 0);
    dcp_ctx_free(ctx);
    ff_release(&ff);
}

int main(void)
{
    char cmd[300];
    int rc;
    strcpy(root, "/tmp/dcp-test-storage-v2-XXXXXX");
    if (!mkdtemp(root))
        return 1;
    RUN(memstore_round_trip_in_parallel);
    RUN(memstore_async_save_in_parallel);
    RUN(memstore_one_at_a_time);
    RUN(memstore_failed_publish_keeps_old_checkpoint);
    RUN(memstore_concurrent_request_fails);
    RUN(memstore_exclusive_publish_and_list);
    RUN(v1_backend_through_adapters);
    RUN(v1_failed_publish_keeps_old_checkpoint);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    rc = system(cmd);
    (void)rc;
    return TEST_SUMMARY();
}
