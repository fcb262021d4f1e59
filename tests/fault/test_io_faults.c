/*
 * Failures on the data path of dcp_save and dcp_load: a full disk (the
 * engine's fail_at hook, at many offsets, with and without O_DIRECT and
 * io_uring; and a real EFBIG from RLIMIT_FSIZE), a directory that cannot be
 * written, short transfers. Every failed save returns an error that names
 * the file and the reason, commits nothing, removes its data file, and
 * leaves a checkpoint committed before loadable with its old data.
 * Also a checkpoint with files over 4 GiB (zip64 records, 64-bit offsets),
 * kept quick and small on disk: the tensor's zero blocks are left as holes
 * (the sparse_zeros hook), so about 12 MiB are written.
 */
#include <dcp/dcp.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "ioengine.h"
#include "test.h"
#include "util.h" /* dcp__alloc_fail_after */

static char root[256];

static const char *dirpath(const char *name)
{
    static char buf[4][600];
    static int k;
    if (!root[0]) {
        strcpy(root, "dcp-test-iofault-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%.300s", root, name);
    return buf[k];
}

static int exists_in(const char *dir, const char *name)
{
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* Number of data files (*.distcp) in dir; 0 when dir does not exist. */
static int data_files(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d)
        return 0;
    while ((de = readdir(d)))
        n += strstr(de->d_name, ".distcp") != NULL;
    closedir(d);
    return n;
}

#define N1 (3 << 18) /* a 3 MiB tensor: several 1 MiB blocks */

struct two {
    float *a;
    uint8_t *b;
    dcp_state *st;
};

static int make_state(struct two *t, float seed)
{
    int64_t sa[1] = {N1}, sb[1] = {5000};
    memset(t, 0, sizeof(*t));
    if (posix_memalign((void **)&t->a, 4096, sizeof(float) * N1))
        return -1;
    t->b = malloc(5001);
    if (!t->b)
        return -1;
    for (int i = 0; i < N1; i++)
        t->a[i] = seed + (float)i;
    for (int i = 0; i < 5000; i++)
        t->b[i] = (uint8_t)(i * 7 + (int)seed);
    if (dcp_state_create(&t->st) ||
        dcp_state_add_value(t->st, "step", dcp_value_int((int64_t)seed)))
        return -1;
    if (dcp_state_add_tensor(t->st, "a", DCP_F32, 1, sa, NULL, NULL, t->a,
                             DCP_MEM_HOST) ||
        dcp_state_add_tensor(t->st, "b", DCP_U8, 1, sb, NULL, NULL, t->b + 1,
                             DCP_MEM_HOST))
        return -1;
    memmove(t->b + 1, t->b, 5000); /* misaligned on purpose */
    return 0;
}

static void free_state(struct two *t)
{
    dcp_state_free(t->st);
    free(t->a);
    free(t->b);
}

/* Loads dir and checks it holds the state saved with seed. */
static int holds(dcp_ctx *ctx, const char *dir, float seed)
{
    struct two t;
    int ok;
    if (make_state(&t, -1.0f) != 0)
        return 0;
    ok = dcp_load(ctx, t.st, dir, NULL) == DCP_OK;
    for (int i = 0; ok && i < N1; i++)
        ok = t.a[i] == seed + (float)i;
    for (int i = 0; ok && i < 5000; i++)
        ok = t.b[i + 1] == (uint8_t)(i * 7 + (int)seed);
    ok = ok && dcp_value_as_int(dcp_state_value(t.st, "step")) == (int64_t)seed;
    free_state(&t);
    return ok;
}

static dcp_ctx *ctx_with(uint32_t flags)
{
    dcp_ctx_options o;
    dcp_ctx *ctx = NULL;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.io_flags = flags;
    o.io_depth = 4;
    o.io_block_bytes = 1 << 20;
    return dcp_ctx_create(&ctx, NULL, &o) == DCP_OK ? ctx : NULL;
}

/* The disk fills up at byte fail_at of the data file: the save fails with
 * DCP_ENOSPC, commits nothing, and the old checkpoint stays. */
TEST(full_disk_at_every_stage)
{
    uint64_t at[] = {1,
                     100,
                     4096,
                     4097,
                     8192,
                     65536,
                     1 << 20,
                     (1 << 20) + 7,
                     2 << 20,
                     (3 << 20) + 1,
                     0 /* size - 100 */,
                     0 /* size - 1 */};
    static const uint32_t flags[] = {0, DCP_IO_NO_DIRECT, DCP_IO_NO_URING};
    struct two t;
    ASSERT_EQ(make_state(&t, 2.0f), 0);
    for (size_t f = 0; f < DCP_ARRAY_LEN(flags); f++) {
        dcp_ctx *ctx = ctx_with(flags[f]);
        char dir[600], fresh[600];
        ASSERT(ctx);
        snprintf(dir, sizeof(dir), "%s", dirpath("full"));
        snprintf(fresh, sizeof(fresh), "%s", dirpath("fresh"));
        /* A committed checkpoint with other data. */
        {
            struct two old;
            ASSERT_EQ(make_state(&old, 1.0f), 0);
            ASSERT_OK(dcp_save(ctx, old.st, dir, NULL));
            free_state(&old);
        }
        /* The last points: just before the end of the file. */
        {
            char cmd[700];
            FILE *p;
            unsigned long long size = 0;
            snprintf(cmd, sizeof(cmd), "stat -c %%s %s/*.distcp", dir);
            p = popen(cmd, "r");
            ASSERT(p && fscanf(p, "%llu", &size) == 1);
            pclose(p);
            ASSERT(size > (3u << 20) + 8192);
            at[DCP_ARRAY_LEN(at) - 2] = size - 100;
            at[DCP_ARRAY_LEN(at) - 1] = size - 1;
        }
        for (size_t i = 0; i < DCP_ARRAY_LEN(at); i++) {
            memset(&dcp__io_test, 0, sizeof(dcp__io_test));
            dcp__io_test.fail_at = at[i];
            dcp__io_test.fail_errno = ENOSPC;
            ASSERT_RC(dcp_save(ctx, t.st, dir, NULL), DCP_ENOSPC);
            ASSERT(strstr(dcp_errmsg(ctx), "No space left on device"));
            ASSERT(strstr(dcp_errmsg(ctx), ".distcp"));
            ASSERT(strstr(dcp_errmsg(ctx), "nothing committed"));
            ASSERT_RC(dcp_save(ctx, t.st, fresh, NULL), DCP_ENOSPC);
            memset(&dcp__io_test, 0, sizeof(dcp__io_test));
            ASSERT(!exists_in(fresh, ".metadata"));
            ASSERT_EQ(data_files(fresh), 0);
            ASSERT_EQ(data_files(dir), 1);
            ASSERT(holds(ctx, dir, 1.0f));
        }
        /* And with room again, the save goes through. */
        ASSERT_OK(dcp_save(ctx, t.st, dir, NULL));
        ASSERT(holds(ctx, dir, 2.0f));
        ASSERT_EQ(data_files(dir), 1);
        dcp_ctx_free(ctx);
    }
    free_state(&t);
}

/* A real kernel error on the write path: RLIMIT_FSIZE makes a write past
 * the limit short and the next one fail with EFBIG. */
TEST(file_size_limit)
{
    struct rlimit old, lim;
    struct two t;
    dcp_ctx *ctx = ctx_with(0);
    char dir[600];
    ASSERT(ctx);
    ASSERT_EQ(make_state(&t, 3.0f), 0);
    snprintf(dir, sizeof(dir), "%s", dirpath("fsize"));
    ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
    (void)signal(SIGXFSZ, SIG_IGN);
    lim = old;
    lim.rlim_cur = (1 << 20) + 1000;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &lim), 0);
    {
        int rc = dcp_save(ctx, t.st, dir, NULL);
        (void)setrlimit(RLIMIT_FSIZE, &old);
        ASSERT_RC(rc, DCP_EIO);
    }
    ASSERT(strstr(dcp_errmsg(ctx), "File too large") ||
           strstr(dcp_errmsg(ctx), "too large"));
    ASSERT(!exists_in(dir, ".metadata"));
    ASSERT_EQ(data_files(dir), 0);
    ASSERT_OK(dcp_save(ctx, t.st, dir, NULL));
    ASSERT(holds(ctx, dir, 3.0f));
    free_state(&t);
    dcp_ctx_free(ctx);
}

TEST(unwritable_directory)
{
    struct two t;
    dcp_ctx *ctx = ctx_with(0);
    char file[600], dir[700];
    FILE *f;
    ASSERT(ctx);
    ASSERT_EQ(make_state(&t, 4.0f), 0);
    /* A path through a regular file. */
    snprintf(file, sizeof(file), "%s", dirpath("plainfile"));
    f = fopen(file, "w");
    ASSERT(f);
    fclose(f);
    snprintf(dir, sizeof(dir), "%s/ckpt", file);
    {
        int rc = dcp_save(ctx, t.st, dir, NULL);
        ASSERT(rc == DCP_ENOENT || rc == DCP_EIO);
    }
    ASSERT(strstr(dcp_errmsg(ctx), "plainfile"));
    ASSERT(strstr(dcp_errmsg(ctx), "nothing committed"));
    /* A directory without write permission (root ignores it). */
    if (geteuid() != 0) {
        snprintf(dir, sizeof(dir), "%s", dirpath("readonly"));
        ASSERT_EQ(mkdir(dir, 0555), 0);
        ASSERT_RC(dcp_save(ctx, t.st, dir, NULL), DCP_EIO);
        ASSERT(strstr(dcp_errmsg(ctx), "Permission denied"));
        ASSERT(!exists_in(dir, ".metadata"));
        (void)chmod(dir, 0755);
    }
    free_state(&t);
    dcp_ctx_free(ctx);
}

TEST(short_transfers)
{
    static const uint32_t flags[] = {0, DCP_IO_NO_DIRECT, DCP_IO_NO_URING};
    struct two t;
    ASSERT_EQ(make_state(&t, 5.0f), 0);
    for (size_t f = 0; f < DCP_ARRAY_LEN(flags); f++) {
        dcp_ctx *ctx = ctx_with(flags[f]);
        ASSERT(ctx);
        memset(&dcp__io_test, 0, sizeof(dcp__io_test));
        dcp__io_test.short_io = 4096 * 3 + 100;
        ASSERT_OK(dcp_save(ctx, t.st, dirpath("short"), NULL));
        ASSERT(holds(ctx, dirpath("short"), 5.0f));
        memset(&dcp__io_test, 0, sizeof(dcp__io_test));
        ASSERT(holds(ctx, dirpath("short"), 5.0f));
        dcp_ctx_free(ctx);
    }
    free_state(&t);
}

/* Every allocation of a save and of a load failing in turn: a clean
 * DCP_ENOMEM (no leak: the sanitizer build checks), nothing committed by a
 * failed save, the old checkpoint intact. */
TEST(allocation_failures)
{
    dcp_save_options so;
    struct two t;
    char dir[600];
    int k, saved = 0, loaded = 0;
    ASSERT_EQ(make_state(&t, 6.0f), 0);
    snprintf(dir, sizeof(dir), "%s", dirpath("oom"));
    memset(&so, 0, sizeof(so));
    so.struct_size = sizeof(so);
    so.no_fsync = 1;
    for (k = 1; k < 2000 && !saved; k++) {
        dcp_ctx *ctx = ctx_with(0);
        int rc;
        ASSERT(ctx);
        (void)dcp__alloc_fail_after((uint64_t)k);
        rc = dcp_save(ctx, t.st, dir, &so);
        (void)dcp__alloc_fail_after(0);
        if (rc == DCP_OK) {
            saved = 1;
        } else {
            ASSERT_RC(rc, DCP_ENOMEM);
            ASSERT(!exists_in(dir, ".metadata"));
            ASSERT(data_files(dir) <= 0);
        }
        dcp_ctx_free(ctx);
    }
    ASSERT(saved);
    for (k = 1; k < 2000 && !loaded; k++) {
        dcp_ctx *ctx = ctx_with(0);
        struct two u;
        int rc;
        ASSERT(ctx);
        ASSERT_EQ(make_state(&u, -1.0f), 0);
        (void)dcp__alloc_fail_after((uint64_t)k);
        rc = dcp_load(ctx, u.st, dir, NULL);
        (void)dcp__alloc_fail_after(0);
        if (rc == DCP_OK)
            loaded = 1;
        else
            ASSERT_RC(rc, DCP_ENOMEM);
        free_state(&u);
        dcp_ctx_free(ctx);
    }
    ASSERT(loaded);
    {
        dcp_ctx *ctx = ctx_with(0);
        ASSERT(holds(ctx, dir, 6.0f));
        dcp_ctx_free(ctx);
    }
    free_state(&t);
}

/*
 * A data file over 4 GiB: a tensor of 2^30 + 2048 float32 (4 GiB + 8 KiB,
 * a zip64 record) whose memory is untouched anonymous pages (zeros, no
 * RSS) but for three marked elements, then a small tensor whose record
 * starts past 4 GiB. Loaded back: a box at the end of the big tensor
 * (reading, with the CRC check, the whole 4 GiB record from the holes)
 * and the small tensor.
 */
TEST(files_over_4gib)
{
    const uint64_t n = ((uint64_t)1 << 30) + 2048;
    const size_t bytes = (size_t)(n * sizeof(float));
    int64_t shape[1] = {(int64_t)n}, sshape[1] = {1000};
    int64_t boff[1] = {(int64_t)n - 3000}, bsize[1] = {3000};
    float *big, small[1000], box[3000], small2[1000];
    struct statvfs vfs;
    dcp_state *st = NULL;
    dcp_metadata *md = NULL;
    dcp_ctx *ctx = ctx_with(0);
    dcp_chunk_info ci;
    char dir[600], file[900];
    struct stat sb;
    long idx;
    ASSERT(ctx);
    snprintf(dir, sizeof(dir), "%s", dirpath("big"));
    /* The file is mostly holes; 64 MiB free is plenty. */
    if (statvfs(root, &vfs) == 0 &&
        (uint64_t)vfs.f_bavail * vfs.f_frsize < ((uint64_t)64 << 20)) {
        fprintf(stderr, "files_over_4gib: less than 64 MiB free\n");
        ASSERT(0);
    }
    big = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    ASSERT(big != MAP_FAILED);
    big[0] = 1.5f;
    big[(size_t)1 << 29] = 2.5f;
    big[n - 1] = 3.5f;
    for (int i = 0; i < 1000; i++)
        small[i] = (float)i * 0.25f;
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "big", DCP_F32, 1, shape, NULL, NULL,
                                   big, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st, "small", DCP_F32, 1, sshape, NULL, NULL,
                                   small, DCP_MEM_HOST));
    memset(&dcp__io_test, 0, sizeof(dcp__io_test));
    dcp__io_test.sparse_zeros = 1;
    {
        int rc = dcp_save(ctx, st, dir, NULL);
        memset(&dcp__io_test, 0, sizeof(dcp__io_test));
        ASSERT_OK(rc);
    }
    dcp_state_free(st);
    (void)munmap(big, bytes);

    ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
    idx = dcp_metadata_find(md, "small");
    ASSERT(idx >= 0);
    ASSERT_OK(dcp_metadata_chunk(md, (size_t)idx, 0, &ci));
    ASSERT(ci.offset > ((uint64_t)4 << 30)); /* a 64-bit offset */
    snprintf(file, sizeof(file), "%s/%s", dir, ci.file);
    ASSERT_EQ(stat(file, &sb), 0);
    ASSERT((uint64_t)sb.st_size > ((uint64_t)4 << 30) + 8192);
    ASSERT((uint64_t)sb.st_blocks * 512 < ((uint64_t)64 << 20)); /* holes */
    idx = dcp_metadata_find(md, "big");
    ASSERT_OK(dcp_metadata_chunk(md, (size_t)idx, 0, &ci));
    ASSERT(ci.length > ((uint64_t)4 << 30)); /* a zip64 record */
    dcp_metadata_free(md);

    memset(box, 0xFF, sizeof(box));
    memset(small2, 0xFF, sizeof(small2));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "big", DCP_F32, 1, shape, boff, bsize,
                                   box, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st, "small", DCP_F32, 1, sshape, NULL, NULL,
                                   small2, DCP_MEM_HOST));
    ASSERT_OK(dcp_load(ctx, st, dir, NULL));
    for (int i = 0; i < 2999; i++)
        ASSERT(box[i] == 0.0f);
    ASSERT(box[2999] == 3.5f);
    ASSERT_MEM_EQ(small2, small, sizeof(small));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    (void)unlink(file);
}

int main(void)
{
    char cmd[300];
    RUN(full_disk_at_every_stage);
    RUN(file_size_limit);
    RUN(unwritable_directory);
    RUN(short_transfers);
    RUN(allocation_failures);
    RUN(files_over_4gib);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
    if (root[0] && system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", root);
    return TEST_SUMMARY();
}
