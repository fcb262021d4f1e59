/*
 * The version-2 members of the POSIX back end (dcp_storage.h) through the
 * storage layer: put, publish (replacing, exclusive, without sync), the
 * multipart write (complete, abort), list by prefix (bounded, sorted,
 * sizes, only regular files) and max_inflight; and a version-1 table built
 * from the POSIX members is accepted and served through the adapters.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "storage.h"
#include "test.h"

static char dir[256];

/* The contents of dir/name into buf (NUL-terminated); -1 when missing. */
static long slurp(const char *name, char *buf, size_t cap)
{
    char p[512];
    FILE *f;
    size_t n;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    f = fopen(p, "rb");
    if (!f)
        return -1;
    n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return (long)n;
}

static int present(const char *name)
{
    char p[512];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return lstat(p, &sb) == 0;
}

TEST(posix_table_is_version_2)
{
    const dcp_storage_ops *o = dcp_storage_posix();
    ASSERT_EQ(o->version, 2);
    ASSERT_EQ(o->max_inflight, 1);
    ASSERT(o->put && o->write_begin && o->write_complete && o->write_abort &&
           o->list && o->publish);
}

TEST(put_and_publish)
{
    char buf[64];
    int d, vis = -1;
    ASSERT_OK(dcp__fs_open_dir(dir, &d, NULL));
    ASSERT_OK(dcp__fs_put(d, "a.bin", "first", 5, NULL));
    ASSERT_EQ(slurp("a.bin", buf, sizeof(buf)), 5);
    ASSERT_STR_EQ(buf, "first");
    ASSERT_OK(dcp__fs_put(d, "a.bin", "second", 6, NULL));
    ASSERT_STR_EQ((slurp("a.bin", buf, sizeof(buf)), buf), "second");
    ASSERT(!present("a.bin.tmp"));
    /* publish replaces */
    ASSERT_OK(dcp__fs_publish(d, dir, "m", "v1", 2, 0, &vis, NULL));
    ASSERT_EQ(vis, 1);
    ASSERT_OK(dcp__fs_publish(d, dir, "m", "v2!", 3, DCP_PUBLISH_NOSYNC, &vis,
                              NULL));
    ASSERT_EQ(slurp("m", buf, sizeof(buf)), 3);
    ASSERT_STR_EQ(buf, "v2!");
    ASSERT(!present("m.tmp"));
    /* exclusive: refused over an existing object, nothing changed, no
     * temporary left */
    ASSERT_RC(dcp__fs_publish(d, dir, "m", "v3", 2, DCP_PUBLISH_EXCLUSIVE,
                              &vis, NULL),
              DCP_EEXIST);
    ASSERT_EQ(vis, 0);
    ASSERT_STR_EQ((slurp("m", buf, sizeof(buf)), buf), "v2!");
    ASSERT(!present("m.tmp"));
    /* exclusive on a new name: the lock of one writer per path */
    ASSERT_OK(dcp__fs_publish(d, dir, ".lock", "pid 1", 5,
                              DCP_PUBLISH_EXCLUSIVE, &vis, NULL));
    ASSERT_EQ(vis, 1);
    ASSERT_STR_EQ((slurp(".lock", buf, sizeof(buf)), buf), "pid 1");
    ASSERT(!present(".lock.tmp"));
    ASSERT_RC(dcp__fs_publish(d, dir, ".lock", "pid 2", 5,
                              DCP_PUBLISH_EXCLUSIVE, &vis, NULL),
              DCP_EEXIST);
    ASSERT_STR_EQ((slurp(".lock", buf, sizeof(buf)), buf), "pid 1");
    /* a symbolic link counts as existing, and is not followed */
    {
        char p[512];
        snprintf(p, sizeof(p), "%s/link", dir);
        ASSERT_EQ(symlink("/nonexistent-target", p), 0);
        ASSERT_RC(dcp__fs_publish(d, dir, "link", "x", 1,
                                  DCP_PUBLISH_EXCLUSIVE, &vis, NULL),
                  DCP_EEXIST);
        ASSERT_OK(dcp__fs_unlink(d, "link", NULL));
    }
    ASSERT_OK(dcp__fs_unlink(d, ".lock", NULL));
    ASSERT_OK(dcp__fs_unlink(d, "m", NULL));
    ASSERT_OK(dcp__fs_unlink(d, "a.bin", NULL));
    dcp__fs_release(d);
}

TEST(multipart_complete_and_abort)
{
    char buf[64];
    int d, f;
    ASSERT_OK(dcp__fs_open_dir(dir, &d, NULL));
    ASSERT_OK(dcp__fs_write_begin(d, "mp", &f, NULL));
    /* parts out of order */
    ASSERT_OK(dcp__fs_pwrite(f, "world", 5, 6, "mp", NULL));
    ASSERT_OK(dcp__fs_pwrite(f, "hello ", 6, 0, "mp", NULL));
    ASSERT_OK(dcp__fs_write_complete(f, "mp", 0, NULL));
    ASSERT_EQ(slurp("mp", buf, sizeof(buf)), 11);
    ASSERT_STR_EQ(buf, "hello world");
    ASSERT_OK(dcp__fs_write_begin(d, "gone", &f, NULL));
    ASSERT_OK(dcp__fs_pwrite(f, "partial", 7, 0, "gone", NULL));
    dcp__fs_write_abort(d, f, "gone");
    ASSERT(!present("gone"));
    ASSERT_OK(dcp__fs_unlink(d, "mp", NULL));
    ASSERT_EQ(dcp__fs_open_handles(), 1); /* d */
    dcp__fs_release(d);
}

TEST(list_by_prefix_bounded)
{
    dcp_storage_entry e[8];
    size_t n = 99;
    char name[32], p[512];
    int d, i;
    ASSERT_OK(dcp__fs_open_dir(dir, &d, NULL));
    for (i = 4; i >= 0; i--) {
        snprintf(name, sizeof(name), "__%d_0.distcp", i);
        ASSERT_OK(dcp__fs_put(d, name, "0123456789", (size_t)i, NULL));
    }
    ASSERT_OK(dcp__fs_put(d, ".metadata", "md", 2, NULL));
    /* neither a directory nor a symbolic link is listed */
    snprintf(p, sizeof(p), "%s/__sub", dir);
    ASSERT_EQ(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/__link", dir);
    ASSERT_EQ(symlink("__0_0.distcp", p), 0);
    ASSERT_OK(dcp__fs_list(d, "__", 8, e, &n, NULL));
    ASSERT_EQ(n, 5);
    for (i = 0; i < 5 && (size_t)i < n; i++) {
        snprintf(name, sizeof(name), "__%d_0.distcp", i);
        ASSERT_STR_EQ(e[i].name, name);
        ASSERT_U64_EQ(e[i].size, (uint64_t)i);
    }
    ASSERT_RC(dcp__fs_list(d, "__", 3, e, &n, NULL), DCP_ELIMIT);
    ASSERT_EQ(n, 3);
    ASSERT_OK(dcp__fs_list(d, "", 8, e, &n, NULL));
    ASSERT_EQ(n, 6);
    ASSERT_STR_EQ(e[0].name, ".metadata");
    ASSERT_OK(dcp__fs_list(d, "nothing", 8, e, &n, NULL));
    ASSERT_EQ(n, 0);
    ASSERT_OK(dcp__fs_list(d, "x", 0, e, &n, NULL));
    ASSERT_RC(dcp__fs_list(d, "", 0, e, &n, NULL), DCP_ELIMIT);
    dcp__fs_release(d);
}

/* Exclusive publish between processes: of 8 racing for one name, exactly
 * one wins, the others get DCP_EEXIST, and the object holds the winner's
 * bytes; no temporary is left. 20 rounds. */
TEST(exclusive_publish_race)
{
    int round;
    for (round = 0; round < 20; round++) {
        pid_t kids[8];
        int i, wins = 0, losses = 0, winner = -1;
        char buf[64], want[64];
        for (i = 0; i < 8; i++) {
            kids[i] = fork();
            if (kids[i] == 0) {
                int d, vis, rc;
                char me[32];
                snprintf(me, sizeof(me), "holder %d", i);
                if (dcp__fs_open_dir(dir, &d, NULL) != DCP_OK)
                    _exit(3);
                rc = dcp__fs_publish(d, dir, ".lock", me, strlen(me),
                                     DCP_PUBLISH_EXCLUSIVE, &vis, NULL);
                _exit(rc == DCP_OK ? 0 : rc == DCP_EEXIST ? 1 : 2);
            }
        }
        for (i = 0; i < 8; i++) {
            int status = 0;
            ASSERT(kids[i] > 0 && waitpid(kids[i], &status, 0) == kids[i]);
            ASSERT(WIFEXITED(status));
            if (WEXITSTATUS(status) == 0) {
                wins++;
                winner = i;
            } else if (WEXITSTATUS(status) == 1) {
                losses++;
            }
        }
        ASSERT_EQ(wins, 1);
        ASSERT_EQ(losses, 7);
        snprintf(want, sizeof(want), "holder %d", winner);
        ASSERT(slurp(".lock", buf, sizeof(buf)) > 0);
        ASSERT_STR_EQ(buf, want);
        {
            dcp_storage_entry e[4];
            size_t n = 0;
            int d;
            ASSERT_OK(dcp__fs_open_dir(dir, &d, NULL));
            ASSERT_OK(dcp__fs_list(d, ".lock", 4, e, &n, NULL));
            ASSERT_EQ(n, 1); /* no temporary left */
            ASSERT_OK(dcp__fs_unlink(d, ".lock", NULL));
            dcp__fs_release(d);
        }
        if (test_failed_)
            break;
    }
}

/* A version-1 table made of the POSIX members: accepted, the new members
 * served through the adapters, the commit by rename. */
TEST(v1_table_through_adapters)
{
    dcp_storage_ops v1;
    struct dcp__storage s;
    dcp_ctx_options o = {0};
    dcp_ctx *ctx;
    dcp_state *st;
    float a[4] = {1, 2, 3, 4}, b[4] = {0};
    int64_t shape[1] = {4};
    char sub[300];
    memcpy(&v1, dcp_storage_posix(), sizeof(v1));
    v1.version = 1;
    v1.publish = NULL; /* beyond a version-1 table: ignored anyway */
    ASSERT_OK(dcp__storage_init(&s, &v1, NULL));
    ASSERT(s.ops.publish == NULL && s.ops.list == NULL && s.ops.put == NULL);
    ASSERT_EQ(s.ops.max_inflight, 1);
    memcpy(&v1, dcp_storage_posix(), sizeof(v1));
    v1.reserved0 = 1;
    ASSERT_RC(dcp__storage_init(&s, &v1, NULL), DCP_EINVAL);
    memcpy(&v1, dcp_storage_posix(), sizeof(v1));
    v1.write_abort = NULL; /* multipart is all or nothing */
    ASSERT_RC(dcp__storage_init(&s, &v1, NULL), DCP_EINVAL);
    memcpy(&v1, dcp_storage_posix(), sizeof(v1));
    v1.version = 1;
    o.struct_size = sizeof(o);
    o.storage = &v1;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o));
    snprintf(sub, sizeof(sub), "%s/ck", dir);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "t", DCP_F32, 1, shape, NULL, NULL, a,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_save(ctx, st, sub, NULL));
    dcp_state_free(st);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "t", DCP_F32, 1, shape, NULL, NULL, b,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_load(ctx, st, sub, NULL));
    ASSERT_MEM_EQ(a, b, sizeof(a));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

int main(void)
{
    int rc;
    char cmd[300];
    strcpy(dir, "/tmp/dcp-test-storage-posix-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    RUN(posix_table_is_version_2);
    RUN(put_and_publish);
    RUN(multipart_complete_and_abort);
    RUN(list_by_prefix_bounded);
    RUN(exclusive_publish_race);
    RUN(v1_table_through_adapters);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    rc = system(cmd);
    (void)rc;
    return TEST_SUMMARY();
}
