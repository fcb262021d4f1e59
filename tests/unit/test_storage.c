/*
 * The storage vtable through the public API (dcp_storage.h): a back end
 * that wraps the POSIX one and counts its calls carries a save and a load;
 * every handle it opens is closed; invalid tables are refused; a context
 * created with an older, shorter dcp_ctx_options keeps its limits.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test.h"

struct counts {
    int opened, closed, writes, syncs, renames;
};

#define POSIX dcp_storage_posix()

static int c_mkdirs(void *i, const char *p, struct dcp_err *e)
{
    (void)i;
    return POSIX->mkdirs(NULL, p, e);
}
static int c_open_dir(void *i, const char *p, void **d, struct dcp_err *e)
{
    int rc = POSIX->open_dir(NULL, p, d, e);
    ((struct counts *)i)->opened += rc == DCP_OK;
    return rc;
}
static void c_close_dir(void *i, void *d)
{
    ((struct counts *)i)->closed++;
    POSIX->close_dir(NULL, d);
}
static int c_create(void *i, void *d, const char *n, void **f,
                    struct dcp_err *e)
{
    int rc = POSIX->create(NULL, d, n, f, e);
    ((struct counts *)i)->opened += rc == DCP_OK;
    return rc;
}
static int c_open_read(void *i, void *d, const char *n, void **f, uint64_t *s,
                       struct dcp_err *e)
{
    int rc = POSIX->open_read(NULL, d, n, f, s, e);
    ((struct counts *)i)->opened += rc == DCP_OK;
    return rc;
}
static int c_write_at(void *i, void *f, const char *n, const void *p,
                      size_t len, uint64_t off, struct dcp_err *e)
{
    ((struct counts *)i)->writes++;
    return POSIX->write_at(NULL, f, n, p, len, off, e);
}
static int c_read_at(void *i, void *f, const char *n, void *p, size_t len,
                     uint64_t off, struct dcp_err *e)
{
    (void)i;
    return POSIX->read_at(NULL, f, n, p, len, off, e);
}
static int c_sync(void *i, void *f, const char *n, struct dcp_err *e)
{
    ((struct counts *)i)->syncs++;
    return POSIX->sync(NULL, f, n, e);
}
static int c_close(void *i, void *f, const char *n, struct dcp_err *e)
{
    ((struct counts *)i)->closed++;
    return POSIX->close(NULL, f, n, e);
}
static int c_rename(void *i, void *d, const char *a, const char *b,
                    struct dcp_err *e)
{
    ((struct counts *)i)->renames++;
    return POSIX->rename(NULL, d, a, b, e);
}
static int c_sync_dir(void *i, void *d, const char *p, struct dcp_err *e)
{
    ((struct counts *)i)->syncs++;
    return POSIX->sync_dir(NULL, d, p, e);
}
static int c_unlink(void *i, void *d, const char *n, struct dcp_err *e)
{
    (void)i;
    return POSIX->unlink(NULL, d, n, e);
}
static int c_exists(void *i, void *d, const char *n, int *found,
                    struct dcp_err *e)
{
    (void)i;
    return POSIX->exists(NULL, d, n, found, e);
}

/* A version-1 table (served through dcp's adapters). */
static const dcp_storage_ops counting = {
    .version = 1,
    .mkdirs = c_mkdirs,
    .open_dir = c_open_dir,
    .close_dir = c_close_dir,
    .create = c_create,
    .open_read = c_open_read,
    .write_at = c_write_at,
    .read_at = c_read_at,
    .sync = c_sync,
    .close = c_close,
    .rename = c_rename,
    .sync_dir = c_sync_dir,
    .unlink = c_unlink,
    .exists = c_exists,
};

static char dir[256];

TEST(counting_backend_carries_save_and_load)
{
    struct counts n = {0};
    dcp_ctx_options o = {0};
    dcp_ctx *ctx;
    dcp_state *st, *st2;
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {0};
    int64_t shape[2] = {2, 3};
    o.struct_size = sizeof(o);
    o.storage = &counting;
    o.storage_impl = &n;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_create(&st2));
    ASSERT_OK(dcp_state_add_tensor(st, "t", DCP_F32, 2, shape, NULL, NULL, a,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st2, "t", DCP_F32, 2, shape, NULL, NULL, b,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    /* data file + .metadata.tmp written and synced, the directory synced,
     * one rename: the commit protocol through the back end */
    ASSERT(n.writes >= 2);
    ASSERT_EQ(n.syncs, 3);
    ASSERT_EQ(n.renames, 1);
    ASSERT_OK(dcp_load(ctx, st2, dir, NULL));
    ASSERT_MEM_EQ(a, b, sizeof(a));
    ASSERT_OK(dcp_verify(ctx, dir));
    ASSERT_EQ(n.opened, n.closed);
    ASSERT(n.opened > 0);
    /* Back to POSIX: the counts stop. */
    ASSERT_OK(dcp_ctx_set_storage(ctx, NULL, NULL));
    {
        int before = n.opened;
        ASSERT_OK(dcp_load(ctx, st2, dir, NULL));
        ASSERT_EQ(n.opened, before);
    }
    ASSERT_OK(dcp_ctx_set_storage(ctx, &counting, &n));
    ASSERT_OK(dcp_load(ctx, st2, dir, NULL));
    ASSERT_EQ(n.opened, n.closed);
    dcp_state_free(st);
    dcp_state_free(st2);
    dcp_ctx_free(ctx);
}

TEST(invalid_tables_refused)
{
    dcp_storage_ops bad = counting;
    dcp_ctx_options o = {0};
    dcp_ctx *ctx = NULL;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    bad.version = 0;
    ASSERT_RC(dcp_ctx_set_storage(ctx, &bad, NULL), DCP_EINVAL);
    bad = counting;
    bad.sync = NULL;
    ASSERT_RC(dcp_ctx_set_storage(ctx, &bad, NULL), DCP_EINVAL);
    ASSERT_RC(dcp_ctx_set_storage(NULL, &counting, NULL), DCP_EINVAL);
    dcp_ctx_free(ctx);
    o.struct_size = sizeof(o);
    o.storage = &bad;
    ctx = (dcp_ctx *)&o; /* must be reset to NULL on failure */
    ASSERT_RC(dcp_ctx_create(&ctx, NULL, &o), DCP_EINVAL);
    ASSERT(ctx == NULL);
}

/* A caller built against the first dcp_ctx_options (no storage fields)
 * passes a shorter struct_size: its limits still count. */
TEST(older_options_struct)
{
    dcp_ctx_options o = {0};
    dcp_metadata *md = NULL;
    dcp_ctx *ctx;
    o.struct_size = (uint32_t)(offsetof(dcp_ctx_options, max_value_bytes) +
                               sizeof(o.max_value_bytes));
    o.max_metadata_bytes = 16;
    o.storage = &counting; /* beyond struct_size: must be ignored */
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o));
    ASSERT_RC(dcp_metadata_open(ctx, dir, &md), DCP_ELIMIT);
    dcp_ctx_free(ctx);
}

int main(void)
{
    int rc;
    char cmd[300];
    strcpy(dir, "/tmp/dcp-test-storage-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    strcat(dir, "/ckpt");
    RUN(counting_backend_carries_save_and_load);
    RUN(invalid_tables_refused);
    RUN(older_options_struct);
    dir[strlen(dir) - 5] = '\0';
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    rc = system(cmd);
    (void)rc;
    return TEST_SUMMARY();
}
