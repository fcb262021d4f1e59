/*
 * Commit-protocol trace test: saves traced through the storage back end
 * (faultfs with no faults), checked against the rules of commit_rules.h:
 * into a new directory, over a committed checkpoint using the same file
 * names (the new files get a tag), and over that one again. Negative
 * controls: the same checker must reject traces with a sync removed, the
 * rename moved before the metadata sync, an old file touched early and the
 * directory sync dropped, so a passing check means something.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commit_rules.h"
#include "faultfs.h"
#include "refstate.h"
#include "test.h"

static char root[256];
static struct faultfs ff;
static int nchecked;

static const char *dirpath(const char *name)
{
    static char buf[512];
    if (!root[0]) {
        strcpy(root, "/tmp/dcp-trace-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    snprintf(buf, sizeof(buf), "%s/%s", root, name);
    return buf;
}

static int traced_save(const char *dir, unsigned seed)
{
    struct refstate r;
    dcp_ctx *ctx;
    int rc;
    if (dcp_ctx_create(&ctx, NULL, NULL))
        abort();
    if (dcp_ctx_set_storage(ctx, ff_ops(), &ff))
        abort();
    ff_reset(&ff);
    ff.tracing = 1;
    rc = rs_build(&r, seed);
    if (!rc)
        rc = dcp_save(ctx, r.st, dir, NULL);
    rs_free(&r);
    dcp_ctx_free(ctx);
    return rc;
}

/* Saves seed into dir traced and checks the rules; the trace stays in ff. */
static const char *save_and_check(const char *dir, unsigned seed, char *why,
                                  size_t whylen)
{
    char old[1024];
    if (rs_files(dir, old, sizeof(old)))
        return "cannot list the old files";
    if (traced_save(dir, seed))
        return "save failed";
    nchecked++;
    if (getenv("DCP_TRACE_PRINT")) {
        size_t i;
        for (i = 0; i < ff.ntrace; i++)
            printf("  %-9s %-32s off %llu len %llu rc %d\n",
                   ff_op_name(ff.trace[i].op), ff.trace[i].name,
                   (unsigned long long)ff.trace[i].off,
                   (unsigned long long)ff.trace[i].len, ff.trace[i].rc);
        printf("\n");
    }
    return cr_check(ff.trace, ff.ntrace, old, why, whylen);
}

TEST(protocol_fresh_and_overwrite)
{
    const char *dir = dirpath("ckpt");
    char why[512];
    const char *bad;
    unsigned seeds[4] = {RS_SEED_OLD, RS_SEED_NEW, RS_SEED_OLD, RS_SEED_NEW};
    int i;
    for (i = 0; i < 4; i++) {
        bad = save_and_check(dir, seeds[i], why, sizeof(why));
        if (bad)
            FAIL_AT_("save %d: %s", i, bad);
        ASSERT_EQ(rs_check(dir, NULL, 0), (int)seeds[i]);
        ASSERT_EQ(rs_debris(dir), 0);
    }
}

/* Negative controls: break the recorded trace of a good save in each way
 * the rules forbid; the checker must notice every one. */
TEST(checker_rejects_broken_traces)
{
    const char *dir = dirpath("neg");
    struct ff_event *good;
    size_t n, i, kind;
    char why[512], old[1024];
    ASSERT_OK(rs_save(dir, RS_SEED_OLD, 0));
    ASSERT_OK(rs_files(dir, old, sizeof(old)));
    ASSERT_OK(traced_save(dir, RS_SEED_NEW));
    n = ff.ntrace;
    good = malloc(n * sizeof(*good));
    ASSERT(good);
    memcpy(good, ff.trace, n * sizeof(*good));
    ASSERT(cr_check(good, n, old, why, sizeof(why)) == NULL);
    for (kind = 0; kind < 5; kind++) {
        struct ff_event *t = malloc((n + 1) * sizeof(*t));
        size_t m = 0;
        int done = 0;
        ASSERT(t);
        for (i = 0; i < n; i++) {
            const struct ff_event *e = &good[i];
            if (!done && kind == 0 && e->op == FF_SYNC &&
                !cr_tmp_name(e->name)) {
                done = 1; /* a data file's sync dropped */
                continue;
            }
            if (!done && kind == 1 && e->op == FF_SYNC &&
                cr_tmp_name(e->name)) {
                done = 1; /* the metadata's sync dropped */
                continue;
            }
            if (!done && kind == 2 && e->op == FF_SYNC_DIR) {
                done = 1; /* the directory sync dropped */
                continue;
            }
            t[m++] = *e;
            if (!done && kind == 3 && e->op == FF_CREATE &&
                cr_tmp_name(e->name)) {
                /* an old file overwritten before the commit */
                t[m] = *e;
                snprintf(t[m].name, sizeof(t[m].name), "%.*s",
                         (int)(strchr(old + 1, '|') - old - 1), old + 1);
                t[m].op = FF_WRITE;
                m++;
                done = 1;
            }
            if (!done && kind == 4 && e->op == FF_CREATE &&
                !cr_tmp_name(e->name)) {
                /* metadata created before the data file is durable */
                t[m] = *e;
                snprintf(t[m].name, sizeof(t[m].name), "%s", CR_TMP);
                m++;
                done = 1;
            }
        }
        ASSERT(done);
        if (cr_check(t, m, old, why, sizeof(why)) == NULL) {
            free(t);
            free(good);
            FAIL_AT_("broken trace %zu passed the checker", kind);
        }
        free(t);
    }
    free(good);
}

int main(void)
{
    int rc;
    ff_init(&ff);
    RUN(protocol_fresh_and_overwrite);
    RUN(checker_rejects_broken_traces);
    ff_release(&ff);
    printf("commit traces checked: %d, tests failed: %d\n", nchecked,
           test_nfail_);
    if (root[0])
        rs_rmtree(root);
    rc = TEST_SUMMARY();
    return rc;
}
