/*
 * The save and load plan caches in one process (no communicator): the
 * structure comparison of local plans (value contents ignored, value
 * sizes and boxes not), a cached second save writing the bytes of a fresh
 * one, a changed box planning afresh, a failed save leaving no cache; a
 * repeated load reusing the checked .metadata until the checkpoint, the
 * boxes, the path or the flags change or a load fails; DCP_SAVE_ZSTD
 * toggled on a cached plan. The
 * MPI side (a change on one rank, async loops, overwrite) is
 * tests/mpi/mpi_plancache.c.
 */
#include <dcp/dcp.h>

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "plan.h"

#include "../sidmask.h"
#include "save.h" /* dcp__save_write_fail_after */

static char root[256];
static const dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};
static const dcp_save_options nocache = {sizeof(dcp_save_options), 1,
                                         DCP_SAVE_NO_PLAN_CACHE, NULL};

static const char *sub(const char *name)
{
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

static float w[6 * 4];

/* "w" [6, 4] in two row boxes split at row cut, "step" = step. */
static dcp_state *make(int step, int64_t cut)
{
    int64_t shape[2] = {6, 4}, o1[2] = {0, 0}, s1[2] = {cut, 4};
    int64_t o2[2] = {cut, 0}, s2[2] = {6 - cut, 4};
    dcp_state *st = NULL;
    int i;
    for (i = 0; i < 24; i++)
        w[i] = (float)(step * 100 + i);
    if (dcp_state_create(&st) != DCP_OK)
        return NULL;
    if (dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, o1, s1, w,
                             DCP_MEM_HOST) != DCP_OK ||
        dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, o2, s2, w + cut * 4,
                             DCP_MEM_HOST) != DCP_OK ||
        dcp_state_add_value(st, "step", dcp_value_int(step)) != DCP_OK) {
        dcp_state_free(st);
        return NULL;
    }
    return st;
}

static int save(dcp_ctx *ctx, int step, int64_t cut, const char *path,
                const dcp_save_options *so)
{
    dcp_state *st = make(step, cut);
    int rc = st ? dcp_save(ctx, st, path, so) : DCP_ENOMEM;
    dcp_state_free(st);
    return rc;
}

static int read_file(const char *path, unsigned char **p, size_t *n)
{
    FILE *f = fopen(path, "rb");
    long len;
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *n = (size_t)len;
    *p = malloc(*n ? *n : 1);
    if (!*p || fread(*p, 1, *n, f) != *n) {
        fclose(f);
        return -1;
    }
    fclose(f);
    return 0;
}

/* Bytes equal, or (.metadata) differing only within 16 bytes: save_id;
 * data files: equal but for the records' save ids. */
static int same_bytes(const char *a, const char *b, int meta)
{
    unsigned char *pa = NULL, *pb = NULL;
    size_t na = 0, nb = 0, k, lo = (size_t)-1, hi = 0;
    int ok = read_file(a, &pa, &na) == 0 && read_file(b, &pb, &nb) == 0 &&
             na == nb && na > 0;
    if (ok && !meta) { /* each save's id is in its records (sidmask.h) */
        size_t ka = dcp_test_mask_sids(pa, na);
        ok = ka > 0 && ka == dcp_test_mask_sids(pb, nb); /* every record */
    }
    for (k = 0; ok && k < na; k++)
        if (pa[k] != pb[k]) {
            lo = lo < k ? lo : k;
            hi = k;
        }
    if (ok && lo != (size_t)-1 && (!meta || hi - lo >= 16))
        ok = 0;
    free(pa);
    free(pb);
    return ok;
}

static void check_load(dcp_ctx *ctx, const char *path, int step)
{
    dcp_state *st = make(0, 3);
    int i, bad = 0;
    if (!st || dcp_load(ctx, st, path, NULL) != DCP_OK)
        bad = 1;
    for (i = 0; !bad && i < 24; i++)
        bad = w[i] != (float)(step * 100 + i);
    if (!bad)
        bad = dcp_value_as_int(dcp_state_value(st, "step")) != step;
    dcp_state_free(st);
    if (bad)
        fprintf(stderr, "load of '%s' (step %d) wrong\n", path, step);
    test_failed_ |= bad;
}

TEST(structure_compare)
{
    struct pl_local a, b;
    struct dcp_buf s = {0};
    struct dcp_err err;
    dcp_state *st1 = make(1, 3), *st2 = make(2, 3), *st3 = make(2, 2),
              *st4 = make(1000, 3);
    ASSERT(st1 && st2 && st3 && st4);
    ASSERT_OK(dcp__plan_local(st1, &a, &err));
    ASSERT_OK(dcp__plan_local_structure(&a, &s));
    ASSERT_EQ(dcp__plan_local_same(&a, &s), 1);
    ASSERT_OK(dcp__plan_local(st2, &b, &err));
    ASSERT_EQ(dcp__plan_local_same(&b, &s), 1); /* another step value */
    ASSERT(a.vhash != b.vhash);
    dcp__plan_local_release(&b);
    ASSERT_OK(dcp__plan_local(st3, &b, &err));
    ASSERT_EQ(dcp__plan_local_same(&b, &s), 0); /* other boxes */
    dcp__plan_local_release(&b);
    ASSERT_OK(dcp__plan_local(st4, &b, &err));
    ASSERT_EQ(dcp__plan_local_same(&b, &s), 0); /* a longer pickle */
    dcp__plan_local_release(&b);
    dcp__plan_local_release(&a);
    dcp__buf_free(&s);
    dcp_state_free(st1);
    dcp_state_free(st2);
    dcp_state_free(st3);
    dcp_state_free(st4);
}

TEST(cached_save_bytes)
{
    dcp_ctx *ctx = NULL, *ref = NULL;
    char a[600], b[600];
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_ctx_create(&ref, NULL, NULL));
    ASSERT_OK(save(ctx, 1, 3, sub("c1"), &nosync));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 0);
    ASSERT_OK(save(ctx, 2, 3, sub("c2"), &nosync));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 1);
    /* The same state planned afresh into the same path (checkpoint_id is
     * the path). */
    ASSERT_EQ(rename(sub("c2"), sub("c2c")), 0);
    ASSERT_OK(save(ref, 2, 3, sub("c2"), &nocache));
    ASSERT_EQ(dcp_ctx_plan_cached(ref, DCP_IO_SAVE), 0);
    ASSERT_EQ(rename(sub("c2"), sub("c2r")), 0);
    ASSERT_EQ(rename(sub("c2c"), sub("c2")), 0);
    snprintf(a, sizeof(a), "%s/.metadata", sub("c2"));
    snprintf(b, sizeof(b), "%s/.metadata", sub("c2r"));
    ASSERT(same_bytes(a, b, 1));
    snprintf(a, sizeof(a), "%s/__0_0.distcp", sub("c2"));
    snprintf(b, sizeof(b), "%s/__0_0.distcp", sub("c2r"));
    ASSERT(same_bytes(a, b, 0));
    check_load(ctx, sub("c2"), 2);
    /* The same path again: cached, with a fresh tag. */
    ASSERT_OK(save(ctx, 3, 3, sub("c2"), &nosync));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 1);
    snprintf(a, sizeof(a), "%s/__0_0.distcp", sub("c2"));
    ASSERT(access(a, F_OK) != 0);
    check_load(ctx, sub("c2"), 3);
    /* Other boxes: planned afresh, then cached again. */
    ASSERT_OK(save(ctx, 4, 2, sub("c3"), &nosync));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 0);
    check_load(ctx, sub("c3"), 4);
    ASSERT_OK(save(ctx, 5, 2, sub("c3"), &nosync));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 1);
    check_load(ctx, sub("c3"), 5);
    dcp_ctx_free(ref);
    dcp_ctx_free(ctx);
}

/* Whether file path holds the bytes pat[0..n) (at its start: at0). */
static int file_has(const char *path, const void *pat, size_t n, int at0)
{
    unsigned char *p = NULL;
    size_t len = 0, k;
    int found = 0;
    if (read_file(path, &p, &len) != 0)
        return -1;
    for (k = 0; !found && k + n <= len && (!at0 || k == 0); k++)
        found = memcmp(p + k, pat, n) == 0;
    free(p);
    return found;
}

/* DCP_SAVE_ZSTD on and off on one context: the cached plan's metadata
 * names the transform exactly when the save compresses. */
TEST(zstd_flag_with_cache)
{
    static const unsigned char zmagic[4] = {0x28, 0xB5, 0x2F, 0xFD};
    const dcp_save_options zs = {sizeof(dcp_save_options), 1, DCP_SAVE_ZSTD, NULL};
    const char *td = "transform_descriptors";
    dcp_ctx *ctx = NULL;
    char m[600], d[600];
    int k;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    for (k = 0; k < 4; k++) {
        int z = k % 2 == 0;
        char name[16];
        snprintf(name, sizeof(name), "z%d", k);
        ASSERT_OK(save(ctx, 10 + k, 3, sub(name), z ? &zs : &nosync));
        ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), k > 0);
        snprintf(m, sizeof(m), "%s/.metadata", sub(name));
        snprintf(d, sizeof(d), "%s/__0_0.distcp", sub(name));
        ASSERT_EQ(file_has(m, td, strlen(td), 0), z);
        ASSERT_EQ(file_has(d, zmagic, 4, 1), z);
        ASSERT_EQ(file_has(d, "PK\003\004", 4, 1), !z);
        check_load(ctx, sub(name), 10 + k);
    }
    dcp_ctx_free(ctx);
}

TEST(failure_drops_cache)
{
    dcp_ctx *ctx = NULL;
    int rc;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save(ctx, 1, 3, sub("f"), &nosync));
    ASSERT_OK(save(ctx, 2, 3, sub("f"), &nosync));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 1);
    (void)dcp__save_write_fail_after(1);
    rc = save(ctx, 3, 3, sub("f"), &nosync);
    (void)dcp__save_write_fail_after(0);
    ASSERT_RC(rc, DCP_EIO);
    check_load(ctx, sub("f"), 2);
    ASSERT_OK(save(ctx, 4, 3, sub("f"), &nosync));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 0);
    ASSERT_OK(save(ctx, 5, 3, sub("f"), &nosync));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 1);
    check_load(ctx, sub("f"), 5);
    dcp_ctx_free(ctx);
}

/* The load plan cache: reused for the same checkpoint and layout, not
 * for a new .metadata, other boxes, another path or other flags, nor after
 * a failed load. */
TEST(load_cache)
{
    dcp_ctx *ctx = NULL, *wc = NULL;
    dcp_load_options nv = {sizeof(dcp_load_options), DCP_LOAD_NO_VERIFY, NULL};
    dcp_load_options nocache_load = {sizeof(dcp_load_options),
                                     DCP_LOAD_NO_PLAN_CACHE, NULL};
    dcp_state *st;
    int64_t four = 4, zero = 0;
    float extra[4];
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_ctx_create(&wc, NULL, NULL));
    ASSERT_OK(save(wc, 1, 3, sub("l"), &nosync));
    ASSERT_OK(save(wc, 1, 3, sub("l2"), &nosync));
    check_load(ctx, sub("l"), 1);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 0);
    check_load(ctx, sub("l"), 1);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 1);
    check_load(ctx, sub("l"), 1);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 1);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE), 0);
    /* A new checkpoint in the same path: a new .metadata. */
    ASSERT_OK(save(wc, 2, 3, sub("l"), &nosync));
    check_load(ctx, sub("l"), 2);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 0);
    check_load(ctx, sub("l"), 2);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 1);
    /* Another path holding the same bytes but for save_id. */
    check_load(ctx, sub("l2"), 1);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 0);
    /* Other flags. */
    st = make(0, 3);
    ASSERT(st);
    ASSERT_OK(dcp_load(ctx, st, sub("l2"), &nv));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 0);
    dcp_state_free(st);
    /* DCP_LOAD_NO_PLAN_CACHE: not used, and nothing kept. */
    check_load(ctx, sub("l2"), 1);
    check_load(ctx, sub("l2"), 1);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 1);
    st = make(0, 3);
    ASSERT(st);
    ASSERT_OK(dcp_load(ctx, st, sub("l2"), &nocache_load));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 0);
    dcp_state_free(st);
    check_load(ctx, sub("l2"), 1);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 0);
    /* Other boxes of the same tensor. */
    st = make(0, 2);
    ASSERT(st);
    ASSERT_OK(dcp_load(ctx, st, sub("l2"), NULL));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 0);
    ASSERT_OK(dcp_load(ctx, st, sub("l2"), NULL));
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 1);
    dcp_state_free(st);
    /* A failed load (a missing key) keeps nothing. */
    st = make(0, 3);
    ASSERT(st);
    ASSERT_OK(dcp_state_add_tensor(st, "extra", DCP_F32, 1, &four, &zero, &four,
                                   extra, DCP_MEM_HOST));
    ASSERT_RC(dcp_load(ctx, st, sub("l2"), NULL), DCP_EKEY);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 0);
    dcp_state_free(st);
    check_load(ctx, sub("l2"), 1);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 0);
    check_load(ctx, sub("l2"), 1);
    ASSERT_EQ(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD), 1);
    dcp_ctx_free(wc);
    dcp_ctx_free(ctx);
}

int main(void)
{
    char cmd[400];
    int rc;
    snprintf(root, sizeof(root), "/tmp/dcp-test-plancache-XXXXXX");
    if (!mkdtemp(root))
        return 2;
    RUN(structure_compare);
    RUN(cached_save_bytes);
    RUN(failure_drops_cache);
    RUN(load_cache);
    RUN(zstd_flag_with_cache);
    rc = TEST_SUMMARY();
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
    if (system(cmd) != 0)
        fprintf(stderr, "cannot remove %s\n", root);
    return rc;
}
