/*
 * The checkpoint manager, single process: step names, the latest complete
 * checkpoint among half-written, uncommitted and corrupt steps, retention
 * (keep last k, keep every N, never the newest nor the save in flight),
 * the "save now" flag (set from a signal handler), one asynchronous save in
 * flight, crash-safe removal and the refusal to remove through a symbolic
 * link or outside a checkpoint, load of the latest bit-exact.
 */
#define _GNU_SOURCE
#include <dcp/dcp.h>
#include <dcp/dcp_manager.h>

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "manager.h"
#include "test.h"

static char base[256];
static const dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

static const char *mkroot(const char *name)
{
    static char buf[8][512];
    static int k;
    struct stat sb;
    if (!base[0]) {
        if (stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode))
            strcpy(base, "/dev/shm/dcp-test-manager-XXXXXX");
        else
            strcpy(base, "/tmp/dcp-test-manager-XXXXXX");
        if (!mkdtemp(base))
            abort();
    }
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", base, name);
    return buf[k];
}

static int exists(const char *root, const char *name)
{
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", root, name);
    return lstat(p, &sb) == 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        abort();
    fputs(text, f);
    fclose(f);
}

/* A state of one float tensor of 64 elements, filled from seed. */
static float buf[64];
static dcp_state *make_state(float seed)
{
    dcp_state *st = NULL;
    int64_t shape[1] = {64}, off[1] = {0};
    for (int i = 0; i < 64; i++)
        buf[i] = seed + (float)i * 0.5f;
    if (dcp_state_create(&st) != DCP_OK)
        abort();
    if (dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, off, shape, buf,
                             DCP_MEM_HOST) != DCP_OK)
        abort();
    return st;
}

/* Saves a plain checkpoint at root/name (outside any manager). */
static int save_plain(dcp_ctx *ctx, const char *root, const char *name,
                      float seed)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", root, name);
    dcp_state *st = make_state(seed);
    int rc = dcp_save(ctx, st, p, &nosync);
    dcp_state_free(st);
    return rc;
}

static dcp_manager_options mopts(int64_t interval, uint32_t keep_last,
                                 int64_t keep_every, int async)
{
    dcp_manager_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.interval = interval;
    o.keep_last = keep_last;
    o.keep_every = keep_every;
    o.async = async;
    o.save_opts = &nosync;
    return o;
}

TEST(naming)
{
    const char *p, *s;
    int64_t step = -5;
    struct dcp_err err = {0};
    ASSERT_OK(dcp__mgr_pattern(NULL, &p, &s, &err));
    ASSERT_STR_EQ(p, "step-");
    ASSERT_STR_EQ(s, "");
    ASSERT(dcp__mgr_parse("step-0", p, s, &step) && step == 0);
    ASSERT(dcp__mgr_parse("step-120", p, s, &step) && step == 120);
    ASSERT(dcp__mgr_parse("step-9223372036854775807", p, s, &step) &&
           step == INT64_MAX);
    ASSERT(!dcp__mgr_parse("step-9223372036854775808", p, s, &step));
    ASSERT(!dcp__mgr_parse("step-", p, s, &step));
    ASSERT(!dcp__mgr_parse("step-012", p, s, &step));
    ASSERT(!dcp__mgr_parse("step--1", p, s, &step));
    ASSERT(!dcp__mgr_parse("step-1x", p, s, &step));
    ASSERT(!dcp__mgr_parse("step-1.tmp", p, s, &step));
    ASSERT(!dcp__mgr_parse("xstep-1", p, s, &step));
    ASSERT(!dcp__mgr_parse(".", p, s, &step));
    ASSERT(dcp__mgr_parse("ckpt_7.dcp", "ckpt_", ".dcp", &step) && step == 7);
    ASSERT(!dcp__mgr_parse("ckpt_7", "ckpt_", ".dcp", &step));
    ASSERT(dcp__mgr_parse("42", "", "", &step) && step == 42);

    dcp_manager_options o = mopts(0, 0, 0, 0);
    o.prefix = "a/b-";
    ASSERT_RC(dcp__mgr_pattern(&o, &p, &s, &err), DCP_EINVAL);
    o.prefix = "v1";
    ASSERT_RC(dcp__mgr_pattern(&o, &p, &s, &err), DCP_EINVAL);
    o.prefix = "v";
    o.suffix = "2x";
    ASSERT_RC(dcp__mgr_pattern(&o, &p, &s, &err), DCP_EINVAL);
    /* A caller with an older, smaller struct gets the default pattern. */
    o.struct_size = sizeof(uint32_t);
    ASSERT_OK(dcp__mgr_pattern(&o, &p, &s, &err));
    ASSERT_STR_EQ(p, "step-");

    /* Creation refuses bad options with a message naming them. */
    dcp_ctx *ctx = NULL;
    dcp_manager *m = NULL;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    o = mopts(0, 0, 0, 0);
    o.prefix = "x/";
    ASSERT_RC(dcp_manager_create(&m, ctx, mkroot("naming"), &o), DCP_EINVAL);
    ASSERT(m == NULL);
    ASSERT(strstr(dcp_errmsg(ctx), "x/") != NULL);
    o = mopts(-1, 0, 0, 0);
    ASSERT_RC(dcp_manager_create(&m, ctx, mkroot("naming"), &o), DCP_EINVAL);
    /* The path of a save follows the pattern. */
    o = mopts(0, 0, 0, 0);
    o.prefix = "ckpt_";
    o.suffix = ".dcp";
    const char *root = mkroot("naming");
    ASSERT_OK(dcp_manager_create(&m, ctx, root, &o));
    dcp_state *st = make_state(1);
    ASSERT_OK(dcp_manager_save(m, st, 30));
    ASSERT(exists(root, "ckpt_30.dcp/.metadata"));
    int64_t latest = -1;
    ASSERT_OK(dcp_manager_latest(m, &latest));
    ASSERT_EQ(latest, 30);
    ASSERT_RC(dcp_manager_save(m, st, -1), DCP_EINVAL);
    dcp_state_free(st);
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
}

TEST(latest_skips_incomplete)
{
    dcp_ctx *ctx = NULL;
    dcp_manager *m = NULL;
    char p[1024];
    const char *root = mkroot("latest");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    dcp_manager_options o = mopts(0, 0, 0, 0);
    ASSERT_OK(dcp_manager_create(&m, ctx, root, &o));
    int64_t step = 99;
    /* An empty root: no checkpoint, on the API and the load. */
    ASSERT_RC(dcp_manager_latest(m, &step), DCP_ENOENT);
    ASSERT_EQ(step, -1);
    ASSERT(strstr(dcp_errmsg(ctx), root) != NULL);

    ASSERT_OK(save_plain(ctx, root, "step-10", 10));
    ASSERT_OK(save_plain(ctx, root, "step-20", 20));
    /* step-30: half-written (data file, no .metadata). */
    ASSERT_OK(save_plain(ctx, root, "step-30", 30));
    snprintf(p, sizeof p, "%s/step-30/.metadata", root);
    ASSERT_EQ(unlink(p), 0);
    /* step-40: uncommitted (.metadata.tmp only). */
    ASSERT_OK(save_plain(ctx, root, "step-40", 40));
    snprintf(p, sizeof p, "%s/step-40/.metadata", root);
    char q[1024];
    snprintf(q, sizeof q, "%s/step-40/.metadata.tmp", root);
    ASSERT_EQ(rename(p, q), 0);
    /* step-50: corrupt .metadata. */
    snprintf(p, sizeof p, "%s/step-50", root);
    ASSERT_EQ(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/step-50/.metadata", root);
    write_file(p, "not a pickle");
    /* step-60: a plain file; other names: ignored. */
    snprintf(p, sizeof p, "%s/step-60", root);
    write_file(p, "x");
    snprintf(p, sizeof p, "%s/notes.txt", root);
    write_file(p, "x");
    snprintf(p, sizeof p, "%s/step-070", root);
    ASSERT_EQ(mkdir(p, 0755), 0);

    ASSERT_OK(dcp_manager_latest(m, &step));
    ASSERT_EQ(step, 20);

    dcp_manager_entry *e = NULL;
    size_t n = 0;
    ASSERT_OK(dcp_manager_list(ctx, root, NULL, &e, &n));
    ASSERT_EQ(n, 6);
    int64_t want_step[6] = {10, 20, 30, 40, 50, 60};
    int want_status[6] = {DCP_MANAGER_COMPLETE,   DCP_MANAGER_COMPLETE,
                          DCP_MANAGER_INCOMPLETE, DCP_MANAGER_INCOMPLETE,
                          DCP_MANAGER_CORRUPT,    DCP_MANAGER_NOTDIR};
    for (size_t i = 0; i < n && i < 6; i++) {
        ASSERT_EQ(e[i].step, want_step[i]);
        ASSERT_EQ(e[i].status, want_status[i]);
        ASSERT_EQ(e[i].error != NULL, e[i].status == DCP_MANAGER_CORRUPT);
    }
    dcp_manager_list_free(e, n);

    /* The latest loads bit-exact. */
    float want[64];
    dcp_state *st = make_state(20);
    memcpy(want, buf, sizeof want);
    memset(buf, 0, sizeof buf);
    ASSERT_OK(dcp_manager_load_latest(m, st, &step, NULL));
    ASSERT_EQ(step, 20);
    ASSERT_MEM_EQ(buf, want, sizeof want);
    dcp_state_free(st);

    /* Retention leaves what is not complete alone. */
    size_t removed = 9;
    dcp_manager_options k1 = mopts(0, 1, 0, 0);
    ASSERT_OK(dcp_manager_prune(ctx, root, &k1, &removed));
    ASSERT_EQ(removed, 1);
    ASSERT(!exists(root, "step-10"));
    ASSERT(exists(root, "step-20/.metadata"));
    ASSERT(exists(root, "step-30"));
    ASSERT(exists(root, "step-40/.metadata.tmp"));
    ASSERT(exists(root, "step-50/.metadata"));
    ASSERT(exists(root, "step-60"));
    ASSERT(exists(root, "notes.txt"));

    /* A missing root. */
    ASSERT_RC(dcp_manager_list(ctx, mkroot("nothing-here"), NULL, &e, &n),
              DCP_ENOENT);
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
}

/* Complete steps of root, as a bit mask over steps 0..63. */
static uint64_t complete_mask(dcp_ctx *ctx, const char *root)
{
    dcp_manager_entry *e = NULL;
    size_t n = 0;
    uint64_t mask = 0;
    if (dcp_manager_list(ctx, root, NULL, &e, &n) != DCP_OK)
        return ~(uint64_t)0;
    for (size_t i = 0; i < n; i++)
        if (e[i].status == DCP_MANAGER_COMPLETE && e[i].step < 64)
            mask |= (uint64_t)1 << e[i].step;
    dcp_manager_list_free(e, n);
    return mask;
}

#define BIT(s) ((uint64_t)1 << (s))

TEST(retention)
{
    for (int async = 0; async < 2; async++) {
        dcp_ctx *ctx = NULL;
        dcp_manager *m = NULL;
        const char *root = mkroot(async ? "retain-async" : "retain-sync");
        ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
        /* Save every 2 steps, keep the last 2 and every multiple of 8. */
        dcp_manager_options o = mopts(2, 2, 8, async);
        ASSERT_OK(dcp_manager_create(&m, ctx, root, &o));
        dcp_state *st = make_state(0);
        int saves = 0;
        for (int64_t s = 1; s <= 20; s++) {
            int did = -1;
            ASSERT_OK(dcp_manager_step(m, st, s, &did));
            ASSERT_EQ(did, s % 2 == 0);
            saves += did;
        }
        ASSERT_EQ(saves, 10);
        ASSERT_OK(dcp_manager_wait(m));
        ASSERT_U64_EQ(complete_mask(ctx, root),
                      BIT(8) | BIT(16) | BIT(18) | BIT(20));
        dcp_state_free(st);
        dcp_manager_free(m);

        /* By hand: keep 1; keep_every stays. */
        dcp_manager_options k = mopts(0, 1, 8, 0);
        size_t removed = 0;
        ASSERT_OK(dcp_manager_prune(ctx, root, &k, &removed));
        ASSERT_EQ(removed, 1);
        ASSERT_U64_EQ(complete_mask(ctx, root), BIT(8) | BIT(16) | BIT(20));
        /* keep 1 without keep_every: only the newest is left. */
        k = mopts(0, 1, 0, 0);
        ASSERT_OK(dcp_manager_prune(ctx, root, &k, &removed));
        ASSERT_EQ(removed, 2);
        ASSERT_U64_EQ(complete_mask(ctx, root), BIT(20));
        /* The newest is always kept, whatever the options. */
        ASSERT_OK(dcp_manager_prune(ctx, root, &k, &removed));
        ASSERT_EQ(removed, 0);
        ASSERT_U64_EQ(complete_mask(ctx, root), BIT(20));
        dcp_ctx_free(ctx);
    }
}

static dcp_manager *sig_mgr;
static void on_sigusr1(int sig)
{
    (void)sig;
    dcp_manager_request_save(sig_mgr);
}

TEST(save_now)
{
    dcp_ctx *ctx = NULL;
    dcp_manager *m = NULL;
    const char *root = mkroot("save-now");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    dcp_manager_options o = mopts(100, 0, 0, 0);
    ASSERT_OK(dcp_manager_create(&m, ctx, root, &o));
    dcp_state *st = make_state(0);
    int did = -1;
    ASSERT_OK(dcp_manager_step(m, st, 7, &did));
    ASSERT_EQ(did, 0);
    ASSERT(!exists(root, "step-7"));
    /* Asked from a signal handler: the next step boundary saves, once. */
    sig_mgr = m;
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigusr1;
    sigemptyset(&sa.sa_mask);
    ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
    ASSERT_EQ(raise(SIGUSR1), 0);
    ASSERT_EQ(sigaction(SIGUSR1, &old, NULL), 0);
    ASSERT_OK(dcp_manager_step(m, st, 8, &did));
    ASSERT_EQ(did, 1);
    ASSERT(exists(root, "step-8/.metadata"));
    ASSERT_OK(dcp_manager_step(m, st, 9, &did));
    ASSERT_EQ(did, 0);
    ASSERT(!exists(root, "step-9"));
    /* The interval still applies. */
    ASSERT_OK(dcp_manager_step(m, st, 100, &did));
    ASSERT_EQ(did, 1);
    /* Interval 0: only requests save. */
    dcp_manager_free(m);
    o = mopts(0, 0, 0, 0);
    ASSERT_OK(dcp_manager_create(&m, ctx, root, &o));
    ASSERT_OK(dcp_manager_step(m, st, 200, &did));
    ASSERT_EQ(did, 0);
    dcp_manager_request_save(m);
    ASSERT_OK(dcp_manager_step(m, st, 201, &did));
    ASSERT_EQ(did, 1);
    dcp_manager_request_save(NULL); /* no-op */
    /* Negative steps, INT64_MIN included, are refused; a request made
     * before stays for the next step. */
    dcp_manager_request_save(m);
    ASSERT_RC(dcp_manager_step(m, st, -1, &did), DCP_EINVAL);
    ASSERT_RC(dcp_manager_step(m, st, INT64_MIN, &did), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "negative step") != NULL);
    ASSERT_EQ(did, 0);
    ASSERT_OK(dcp_manager_step(m, st, 202, &did));
    ASSERT_EQ(did, 1);
    ASSERT(exists(root, "step-202/.metadata"));
    dcp_state_free(st);
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
}

TEST(one_in_flight)
{
    dcp_ctx *ctx = NULL;
    dcp_manager *m = NULL;
    const char *root = mkroot("in-flight");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    dcp_manager_options o = mopts(1, 1, 0, 1);
    ASSERT_OK(dcp_manager_create(&m, ctx, root, &o));
    dcp_state *st = make_state(1);
    ASSERT_OK(dcp_manager_save(m, st, 1));
    /* The caller may change its buffers once the call returns. */
    float want1[64];
    memcpy(want1, buf, sizeof want1);
    for (int i = 0; i < 64; i++)
        buf[i] = 2.0f + (float)i * 0.5f;
    /* The next save completes step 1 first; retention (keep 1) then keeps
     * step 1, the newest complete, and never counts step 2 in flight. */
    ASSERT_OK(dcp_manager_save(m, st, 2));
    ASSERT(exists(root, "step-1/.metadata"));
    ASSERT_U64_EQ(complete_mask(ctx, root) & BIT(1), BIT(1));
    /* Completing step 2 lets retention remove step 1. */
    ASSERT_OK(dcp_manager_wait(m));
    ASSERT_U64_EQ(complete_mask(ctx, root), BIT(2));
    ASSERT_OK(dcp_manager_wait(m)); /* nothing in flight: OK */
    /* step 1's content was the buffers at its call. */
    ASSERT_OK(dcp_manager_save(m, st, 3));
    memset(buf, 0, sizeof buf);
    int64_t step = -1;
    /* latest completes the save in flight: it is 3, not 2. */
    ASSERT_OK(dcp_manager_load_latest(m, st, &step, NULL));
    ASSERT_EQ(step, 3);
    for (int i = 0; i < 64; i++)
        ASSERT(buf[i] == 2.0f + (float)i * 0.5f);
    (void)want1;
    /* A save left in flight is completed by free. */
    ASSERT_OK(dcp_manager_save(m, st, 4));
    dcp_manager_free(m);
    ASSERT_U64_EQ(complete_mask(ctx, root), BIT(4));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(remove_refusals)
{
    dcp_ctx *ctx = NULL;
    char p[1024], q[1024];
    const char *root = mkroot("refuse");
    const char *outside = mkroot("outside");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_EQ(mkdir(root, 0755), 0);
    ASSERT_OK(save_plain(ctx, outside, "ck", 5));
    ASSERT_OK(save_plain(ctx, root, "step-1", 1));
    /* step-99 is a link to a checkpoint outside the root. */
    snprintf(p, sizeof p, "%s/ck", outside);
    snprintf(q, sizeof q, "%s/step-99", root);
    ASSERT_EQ(symlink(p, q), 0);
    dcp_manager_entry *e = NULL;
    size_t n = 0;
    ASSERT_OK(dcp_manager_list(ctx, root, NULL, &e, &n));
    ASSERT_EQ(n, 2);
    ASSERT_EQ(e[1].step, 99);
    ASSERT_EQ(e[1].status, DCP_MANAGER_LINK);
    dcp_manager_list_free(e, n);
    /* Never the latest, never removed by retention or by hand. */
    dcp_manager *m = NULL;
    dcp_manager_options o = mopts(0, 1, 0, 0);
    ASSERT_OK(dcp_manager_create(&m, ctx, root, &o));
    int64_t step = -1;
    ASSERT_OK(dcp_manager_latest(m, &step));
    ASSERT_EQ(step, 1);
    dcp_state *st = make_state(2);
    ASSERT_OK(dcp_manager_save(m, st, 2));
    dcp_state_free(st);
    dcp_manager_free(m);
    ASSERT(!exists(root, "step-1"));
    ASSERT(exists(outside, "ck/.metadata"));
    ASSERT_RC(dcp_manager_remove(ctx, q), DCP_EUNSAFE);
    ASSERT(strstr(dcp_errmsg(ctx), "symbolic link") != NULL);
    ASSERT(exists(outside, "ck/.metadata"));
    ASSERT(exists(root, "step-99"));
    /* A directory holding a subdirectory is not a checkpoint: refused,
     * nothing removed. */
    snprintf(p, sizeof p, "%s/step-2/sub", root);
    ASSERT_EQ(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/step-2", root);
    ASSERT_RC(dcp_manager_remove(ctx, p), DCP_EUNSAFE);
    ASSERT(exists(root, "step-2/.metadata"));
    snprintf(p, sizeof p, "%s/step-2/sub", root);
    ASSERT_EQ(rmdir(p), 0);
    /* So is a directory holding a file that is not a checkpoint's. */
    snprintf(p, sizeof p, "%s/step-2/notes.txt", root);
    write_file(p, "keep me");
    snprintf(p, sizeof p, "%s/step-2", root);
    ASSERT_RC(dcp_manager_remove(ctx, p), DCP_EUNSAFE);
    ASSERT(strstr(dcp_errmsg(ctx), "notes.txt") != NULL);
    ASSERT(exists(root, "step-2/.metadata"));
    ASSERT(exists(root, "step-2/notes.txt"));
    snprintf(p, sizeof p, "%s/step-2/notes.txt", root);
    ASSERT_EQ(unlink(p), 0);
    /* Temporaries and tagged data files are a checkpoint's. */
    snprintf(p, sizeof p, "%s/step-2/.metadata.tmp", root);
    write_file(p, "x");
    snprintf(p, sizeof p, "%s/step-2/__0_0.0123abcd.distcp", root);
    write_file(p, "x");
    /* Removal: .metadata gone, files gone, directory gone. */
    snprintf(p, sizeof p, "%s/step-2", root);
    ASSERT_OK(dcp_manager_remove(ctx, p));
    ASSERT(!exists(root, "step-2"));
    ASSERT_RC(dcp_manager_remove(ctx, p), DCP_ENOENT);
    ASSERT(strstr(dcp_errmsg(ctx), "step-2") != NULL);
    snprintf(p, sizeof p, "%s/notes", root);
    write_file(p, "x");
    ASSERT_RC(dcp_manager_remove(ctx, p), DCP_EUNSAFE);
    ASSERT_RC(dcp_manager_remove(ctx, NULL), DCP_EINVAL);
    dcp_ctx_free(ctx);
}

/* dcp_manager_path: the step's checkpoint path, as saves write it, and
 * the resume idiom of the README (step N holds the state after step N). */
TEST(step_path)
{
    dcp_ctx *ctx = NULL;
    dcp_manager *m = NULL;
    char *p = NULL, want[600];
    const char *root = mkroot("paths");
    dcp_manager_options o = mopts(1, 0, 0, 0);
    int64_t step = -1, next;
    int rc;
    o.prefix = "ck_";
    o.suffix = ".dcp";
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_manager_create(&m, ctx, root, &o));
    ASSERT_OK(dcp_manager_path(m, 12, &p));
    snprintf(want, sizeof want, "%s/ck_12.dcp", root);
    ASSERT_STR_EQ(p, want);
    dcp_free(p);
    ASSERT_RC(dcp_manager_path(m, -1, &p), DCP_EINVAL);
    ASSERT(p == NULL);
    ASSERT_RC(dcp_manager_path(NULL, 1, &p), DCP_EINVAL);
    /* The README's loop: a fresh start runs steps 0..2, a resume 3..4. */
    dcp_state *st = make_state(0);
    rc = dcp_manager_load_latest(m, st, &step, NULL);
    ASSERT_RC(rc, DCP_ENOENT);
    for (next = 0; next < 3; next++) {
        buf[0] = (float)next; /* "train_one_step" */
        ASSERT_OK(dcp_manager_step(m, st, next, NULL));
    }
    buf[0] = -1;
    ASSERT_OK(dcp_manager_load_latest(m, st, &step, NULL));
    ASSERT_EQ(step, 2);
    ASSERT(buf[0] == 2.0f); /* the state after step 2 */
    ASSERT_OK(dcp_manager_path(m, step, &p));
    snprintf(want, sizeof want, "%s/ck_2.dcp", root);
    ASSERT_STR_EQ(p, want);
    ASSERT(exists(root, "ck_2.dcp/.metadata"));
    dcp_free(p);
    dcp_state_free(st);
    dcp_manager_free(m);
    dcp_ctx_free(ctx);
}

/*
 * A peer replica's temporary that a killed replication left
 * (<data file>.<pid>-<n>-<hex>.tmp, tiers/replica.c) is a leftover:
 * dcp_clean removes it, retention and dcp_manager_remove remove the step
 * holding it (never DCP_EUNSAFE); a name that only looks like one stays
 * and keeps its step.
 */
TEST(replica_temporaries)
{
    dcp_ctx *ctx = NULL;
    char p[1024];
    const char *root = mkroot("reptmp");
    static const char *const tmp = "__2_0.distcp.4242-0-0badcafe.tmp";
    static const char *const tagged =
        "__3_0.0123abcd.distcp.17-3-deadbeef.tmp";
    dcp_clean_result res;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_EQ(mkdir(root, 0755), 0);
    ASSERT_OK(save_plain(ctx, root, "step-1", 1));
    ASSERT_OK(save_plain(ctx, root, "step-2", 2));
    ASSERT_OK(save_plain(ctx, root, "step-3", 3));
    snprintf(p, sizeof p, "%s/step-1/%s", root, tmp);
    write_file(p, "replica");
    snprintf(p, sizeof p, "%s/step-3/%s", root, tagged);
    write_file(p, "replica");
    snprintf(p, sizeof p, "%s/step-3/__2_0.distcp.x-0-0badcafe.tmp", root);
    write_file(p, "not ours");
    /* dcp_clean: the temporary goes, the look-alike stays. */
    memset(&res, 0, sizeof res);
    res.struct_size = sizeof res;
    snprintf(p, sizeof p, "%s/step-3", root);
    ASSERT_OK(dcp_clean(ctx, p, 0, &res));
    ASSERT_EQ(res.files, 1);
    ASSERT_EQ(res.bytes, 7);
    ASSERT(!exists(root, "step-3/__3_0.0123abcd.distcp.17-3-deadbeef.tmp"));
    ASSERT(exists(root, "step-3/__2_0.distcp.x-0-0badcafe.tmp"));
    /* Retention (keep 1): step-1 with its temporary removed, step-2 too. */
    dcp_manager_options o = mopts(0, 1, 0, 0);
    size_t removed = 0;
    snprintf(p, sizeof p, "%s/step-3/__2_0.distcp.x-0-0badcafe.tmp", root);
    ASSERT_EQ(unlink(p), 0);
    ASSERT_OK(dcp_manager_prune(ctx, root, &o, &removed));
    ASSERT_EQ(removed, 2);
    ASSERT(!exists(root, "step-1") && !exists(root, "step-2"));
    /* By hand, and a look-alike refused. */
    ASSERT_OK(save_plain(ctx, root, "step-4", 4));
    snprintf(p, sizeof p, "%s/step-4/__0_0.distcp.12-0-0badcafeX.tmp", root);
    write_file(p, "x");
    snprintf(p, sizeof p, "%s/step-4", root);
    ASSERT_RC(dcp_manager_remove(ctx, p), DCP_EUNSAFE);
    ASSERT(strstr(dcp_errmsg(ctx), "0badcafeX") != NULL);
    snprintf(p, sizeof p, "%s/step-4/__0_0.distcp.12-0-0badcafeX.tmp", root);
    ASSERT_EQ(unlink(p), 0);
    snprintf(p, sizeof p, "%s/step-4/%s", root, tmp);
    write_file(p, "x");
    snprintf(p, sizeof p, "%s/step-4", root);
    ASSERT_OK(dcp_manager_remove(ctx, p));
    ASSERT(!exists(root, "step-4"));
    dcp_ctx_free(ctx);
}

int main(void)
{
    RUN(naming);
    RUN(latest_skips_incomplete);
    RUN(retention);
    RUN(save_now);
    RUN(one_in_flight);
    RUN(remove_refusals);
    RUN(replica_temporaries);
    RUN(step_path);
    if (base[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", base);
    }
    return TEST_SUMMARY();
}
