/*
 * Memory tiers (dcp_tier.h) with nodes simulated on one machine: ranks
 * grouped as nodes, one tier-0 directory per node (DIR/n0, DIR/n1), tier 1
 * in DIR/t1. Label tier.
 *   save DIR     4 ranks as 2 nodes: bad input and an empty stack refused
 *                alike on every rank; a step saved and drained (tier-1
 *                checkpoint loads bit-exact with plain dcp_load; each node
 *                directory holds .metadata and its own ranks' files only);
 *                a save while a drain is in flight with SKIP (skipped,
 *                nothing saved) and WAIT (waited); per-tier retention; a
 *                drain failing on rank 1 (agreed everywhere, tier 1 keeps
 *                the previous step, the step's directory never commits);
 *                restore from tier 0; a stale node file (another save's
 *                record under the step's name) falling back to tier 1
 *                whole; the drain's bandwidth limit
 *   restart DIR  3 ranks as 2 nodes (0,1 | 2): restores the newest step
 *                from tier 0 resharded 4 -> 3, saves and drains another;
 *                tier0_async: saves return once staged, committed and
 *                drained by the next call (save, test, wait, free)
 *   lost DIR     2 ranks, node n1 lost (its directory deleted): every
 *                tier-0 step lacks files, restore falls back to tier 1's
 *                newest, bit-exact
 *   kill DIR V K 2 ranks as 2 nodes: step 1 drained, then rank V killed
 *                (SIGKILL) at its K-th drain hook call of step 2's drain
 *                (tier_kill.sh runs every point)
 *   killcheck DIR  after kill: tier 1 holds step 1 only, restore never
 *                mixes; a new drain takes the dead holder's lock over
 *   interop DIR  4 ranks as 2 nodes: step 1 saved and drained, the same
 *                state in DIR/plain (tests/interop/test_tier_mpi.py)
 * Peer replicas (nodes P0..P3 under DIR, one rank each at first):
 *   peers DIR    4 ranks as 4 nodes, replicas 1 (pieces of 16 KiB):
 *                bad partners refused alike; failure domains steer the
 *                partner; step 1 drained, step 2's drain failed (tier 1
 *                holds step 1 only); each node holds its own file and,
 *                byte for byte, its ring predecessor's; node P2 lost: the
 *                restore loads step 2 from tier 0 (with a copy failing:
 *                tier 1's step 1, whole), bit-exact, rank 2
 *                (P2's replacement) getting P2's file over the
 *                communicator (a rank reads its own node's directory
 *                only); in DIR/q: node P2 lost, 3 ranks (P0, P1, P3)
 *                restore step 2 from tier 0 resharded 4 -> 3
 *   peers2 DIR   2 ranks as nodes P1 and P3 (P0 and P2 not named): step
 *                2 restored from tier 0 resharded 4 -> 2, from own and
 *                partner copies only; then in DIR/a: tier0_async saves
 *                replicated; a replica failing on one rank fails the save
 *                alike, no partial replica left; a/P3 lost: the newest
 *                step with every file surviving loads
 *   peerslost DIR  4 ranks: P1 lost too (two adjacent nodes, one
 *                replica): step 2 on no tier complete, step 1 from tier 1;
 *                tier 1 emptied: DCP_ENOENT on every rank; replicas 0 and
 *                a node lost: tier 1's newest, not the newer tier-0 step
 *   bgrepl DIR   2 ranks as 2 nodes B0, B1, replicas 1: replication off
 *                the save's path (issue 30 item 3): the save returns
 *                before any replica piece is written, the next collective
 *                call lands them (dcp_tier_replicated says so only then);
 *                an injected partner failure reported at that next call
 *                (drain_test, save) on every rank, the step kept locally;
 *                after a node loss the restore takes the newest step
 *                agreed replicated (kept by retention); dcp_tier_free
 *                with a replication in flight lands it; tier0_async too
 *   bgthread DIR 2 ranks as 2 nodes T0, T1, replicas 1, under
 *                MPI_THREAD_MULTIPLE (DCP_COMM_P2P_THREAD): the replica
 *                streams on its own thread after the save returned, whole
 *                on disk with no tier or MPI call made, the next call
 *                only agreeing and renaming; a write failing there fails
 *                the next call alike on every rank; dcp_tier_free with a
 *                replication in flight lands it
 *   rkill DIR V K  2 ranks as 2 nodes R0, R1, replicas 1: step 1 saved,
 *                replicated, drained; step 2's replication killed on rank
 *                V (SIGKILL) at its K-th replica hook call (before each
 *                piece it receives, before the rename after the agreement;
 *                tier_peers_kill.sh runs the points)
 *   rkillcheck DIR V  after rkill, node R<V> lost too: the restore loads
 *                step 2 from tier 0 if the survivor holds R<V>'s file of
 *                step 2 under its name, else step 1, whole, bit-exact;
 *                then a new step saves and restores
 * A node lost at each phase of the drain (tier_drainloss.sh):
 *   dkill DIR R P V  4 ranks as nodes n0 (0, 1), n1 (2, 3), replicas R,
 *                keep_last 1 per tier: step 1 drained, step 2 killed on
 *                rank V at phase P of its save (spread, replicate) or of
 *                its drain (start, data0, data1, prune0, metadata,
 *                committed, prune1: test_dkill)
 *   dcheck DIR R P V LOST  after dkill, on any number of ranks (two
 *                nodes): nodes LOST (none, one: V's, all) deleted; the
 *                restore loads step 2 from tier 0 when covered, else tier
 *                1's newest complete step (2 only after its commit),
 *                bit-exact, never a mix; a new step saves and drains
 */
#include <dcp/dcp.h>
#include <dcp/dcp_manager.h>
#include <dcp/dcp_mpi.h>
#include <dcp/dcp_tier.h>

#include <mpi.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "mpitest.h"
#include "tier.h"

static char dir[512], t0[600], t1[600];
static int node;
static long kill_victim = -1;
static const dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

static const int64_t wshape[2] = {12, 5}, bshape[2] = {64, 1024};
static float wbuf[12 * 5], bbuf[64 * 1024];
static int64_t woff[2], wsize[2], boff[2], bsize[2];

static dcp_state *make_state(int64_t step, int fill)
{
    dcp_state *st = NULL;
    mt_split(wshape[0], mt_size, mt_rank, &woff[0], &wsize[0]);
    mt_split(bshape[0], mt_size, mt_rank, &boff[0], &bsize[0]);
    woff[1] = boff[1] = 0;
    wsize[1] = wshape[1];
    bsize[1] = bshape[1];
    if (fill) {
        mt_fill((unsigned char *)wbuf, 2, wshape, woff, wsize, 4,
                (unsigned)step);
        mt_fill((unsigned char *)bbuf, 2, bshape, boff, bsize, 4,
                (unsigned)step + 1000);
    } else {
        memset(wbuf, 0, sizeof wbuf);
        memset(bbuf, 0, sizeof bbuf);
    }
    if (dcp_state_create(&st) != DCP_OK ||
        dcp_state_add_tensor(st, "w", DCP_F32, 2, wshape, woff, wsize, wbuf,
                             DCP_MEM_HOST) != DCP_OK ||
        dcp_state_add_tensor(st, "b", DCP_F32, 2, bshape, boff, bsize, bbuf,
                             DCP_MEM_HOST) != DCP_OK ||
        dcp_state_add_value(st, "step", dcp_value_int(step)) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    return st;
}

/* The buffers hold step's content, and the state's "step" value is step. */
static int holds(dcp_state *st, int64_t step)
{
    static unsigned char want[sizeof bbuf];
    mt_fill(want, 2, wshape, woff, wsize, 4, (unsigned)step);
    if (memcmp(want, wbuf, mt_numel(2, wsize) * 4) != 0)
        return 0;
    mt_fill(want, 2, bshape, boff, bsize, 4, (unsigned)step + 1000);
    if (memcmp(want, bbuf, mt_numel(2, bsize) * 4) != 0)
        return 0;
    const dcp_value *v = dcp_state_value(st, "step");
    return v && dcp_value_as_int(v) == step;
}

/* The drain hook: a slow first chunk of each file, or a failure on one
 * rank. */
/* slow_ms and fail_rank are read on the drain thread while the test's
 * thread may set them (ThreadSanitizer). */
static _Atomic int slow_ms, fail_rank = -1;
static int victim = -1, kill_at, calls;
static int hook(int rank, const char *file, uint64_t off, void *arg)
{
    (void)arg;
    if (file[0] == '.' && strcmp(file, ".metadata") != 0)
        return 0; /* the phase points (tier.h): dkill's */
    if (rank == victim && ++calls == kill_at)
        raise(SIGKILL);
    if (strcmp(file, ".metadata") == 0)
        return 0;
    if (rank == fail_rank && off > 0)
        return DCP_EIO;
    if (slow_ms && off == 0)
        usleep((useconds_t)slow_ms * 1000);
    return 0;
}

static int async0;
static uint32_t nrep; /* replicas */
static int fdom;      /* failure_domain */
static const int *parts;
static uint32_t keep0 = 3, keep1 = 2; /* retention */
static dcp_tier *mk(dcp_ctx *ctx, int busy, uint64_t bw)
{
    dcp_tier_options o;
    dcp_tier *t = NULL;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tier0_dir = t0;
    o.tier1_root = t1;
    o.keep_last0 = keep0;
    o.keep_last1 = keep1;
    o.busy = busy;
    o.drain_bytes_per_sec = bw;
    o.drain_buffer_bytes = 64 << 10;
    o.save_opts = &nosync;
    o.tier0_async = async0;
    o.replicas = nrep;
    o.failure_domain = fdom;
    o.partners = parts;
    CHECK_OK(ctx, dcp_tier_create(&t, ctx, &o));
    return t;
}

#define BIT(s) ((uint64_t)1 << (s))

/* Complete steps under root (0..63) as a mask. */
static uint64_t mask(dcp_ctx *ctx, const char *root)
{
    dcp_manager_entry *e = NULL;
    size_t n = 0;
    uint64_t m = 0;
    if (dcp_manager_list(ctx, root, NULL, &e, &n) != DCP_OK)
        return ~(uint64_t)0;
    for (size_t i = 0; i < n; i++)
        if (e[i].status == DCP_MANAGER_COMPLETE && e[i].step < 64)
            m |= BIT(e[i].step);
    dcp_manager_list_free(e, n);
    return m;
}

static int exists(const char *root, int64_t step, const char *name)
{
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof p, "%s/step-%lld/%s", root, (long long)step, name);
    return stat(p, &sb) == 0;
}

static dcp_comm *comm;
static dcp_ctx *ctx;

/* Bad input and nothing to restore: refused alike on every rank, named. */
static void test_errors(void)
{
    dcp_tier_options o;
    dcp_tier *t = (dcp_tier *)&o;
    char e0[700], e1[700];
    snprintf(e0, sizeof e0, "%s/e/n%d", dir, node);
    snprintf(e1, sizeof e1, "%s/e/t1", dir);
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tier0_dir = e0;
    o.tier1_root = e1;
    /* A keep_last1 differing on one rank. */
    o.keep_last1 = mt_rank == 3 ? 5 : 2;
    int rc = dcp_tier_create(&t, ctx, &o);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(t == NULL && mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    /* No tier0_dir on one rank. */
    o.keep_last1 = 2;
    o.tier0_dir = mt_rank == 1 ? NULL : e0;
    rc = dcp_tier_create(&t, ctx, &o);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "rank 1");
    /* A tier 0 that is not a local directory. */
    o.tier0_dir = "s3://bucket/t0";
    rc = dcp_tier_create(&t, ctx, &o);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK_MSG(ctx, "not a local directory");
    o.tier0_dir = e0;
    CHECK_OK(ctx, dcp_tier_create(&t, ctx, &o));
    /* Nothing saved yet. */
    dcp_state *st = make_state(0, 0);
    int64_t s = 7;
    int tier = 7;
    rc = dcp_tier_restore(t, st, NULL, &s, &tier);
    CHECK_RC(ctx, rc, DCP_ENOENT);
    CHECK(mt_same(rc) && s == -1 && tier == -1);
    /* Steps differing between ranks; a negative step. */
    int oc = -1;
    rc = dcp_tier_save(t, st, mt_rank == 2 ? 3 : 4, &oc);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    rc = dcp_tier_save(t, st, -1, &oc);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc));
    int64_t ds = 7;
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &ds));
    CHECK(ds == -1);
    /* A tier-0 failure names the node's directory, not the virtual root
     * the tier-0 context saves to ("@tier0/step-9"). */
    {
        char blk[800];
        snprintf(blk, sizeof blk, "%s/step-9/__0_0.distcp", e0);
        if (mt_rank == 0)
            CHECK(mkdir(e0, 0755) == 0 || errno == EEXIST);
        snprintf(blk, sizeof blk, "%s/step-9", e0);
        if (mt_rank == 0)
            CHECK(mkdir(blk, 0755) == 0);
        snprintf(blk, sizeof blk, "%s/step-9/__0_0.distcp", e0);
        if (mt_rank == 0)
            CHECK(mkdir(blk, 0755) == 0);
        rc = dcp_tier_save(t, st, 9, &oc);
        CHECK(rc != DCP_OK && mt_same(rc));
        if (mt_rank == 0) {
            snprintf(blk, sizeof blk, "%s/step-9", e0);
            CHECK_MSG(ctx, blk);
            CHECK(strstr(dcp_errmsg(ctx), "@tier0") == NULL);
        }
    }
    dcp_state_free(st);
    dcp_tier_free(t);
    CHECK(dcp_tier_create(NULL, ctx, &o) == DCP_EINVAL);
    CHECK(dcp_tier_save(NULL, NULL, 0, NULL) == DCP_EINVAL);
    dcp_tier_free(NULL);
}

static void test_save_drain(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(1, 1);
    int oc = -1;
    CHECK_OK(ctx, dcp_tier_save(t, st, 1, &oc));
    CHECK(oc == DCP_TIER_SAVED && mt_same(oc));
    memset(bbuf, 0x5a, sizeof bbuf); /* may change once save returns */
    int64_t s = -1;
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 1);
    /* A second wait reports nothing. */
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == -1);
    dcp_state_free(st);
    /* Each node directory: .metadata, and only its own ranks' files. */
    char own[32], other[600];
    snprintf(own, sizeof own, "__%d_0.distcp", mt_rank);
    snprintf(other, sizeof other, "%s/n%d", dir, 1 - node);
    CHECK(exists(t0, 1, ".metadata"));
    CHECK(exists(t0, 1, own));
    CHECK(!exists(other, 1, own));
    CHECK(exists(t1, 1, ".metadata"));
    CHECK(exists(t1, 1, own));
    /* Tier 1 is an ordinary checkpoint: plain dcp_load, bit-exact. */
    char p[700];
    snprintf(p, sizeof p, "%s/step-1", t1);
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_load(ctx, st, p, NULL));
    CHECK(holds(st, 1));
    dcp_state_free(st);
    dcp_tier_free(t);
}

static void test_skip(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_SKIP, 0);
    dcp_state *st = make_state(2, 1);
    int oc = -1, done = -1;
    slow_ms = 500;
    CHECK_OK(ctx, dcp_tier_save(t, st, 2, &oc));
    CHECK(oc == DCP_TIER_SAVED && mt_same(oc));
    dcp_state_free(st);
    st = make_state(3, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 3, &oc));
    CHECK(oc == DCP_TIER_SKIPPED && mt_same(oc));
    CHECK_OK(ctx, dcp_tier_drain_test(t, &done));
    CHECK(mt_same(done));
    int64_t s = -1;
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == (done ? -1 : 2));
    slow_ms = 0;
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(exists(t1, 2, ".metadata"));
    CHECK(!exists(t0, 3, ".metadata") && !exists(t1, 3, ".metadata"));
    dcp_tier_free(t);
}

static void test_wait_retention(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    int oc = -1;
    slow_ms = 500;
    dcp_state *st = make_state(4, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 4, &oc));
    CHECK(oc == DCP_TIER_SAVED && mt_same(oc));
    dcp_state_free(st);
    st = make_state(5, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 5, &oc));
    CHECK(oc == DCP_TIER_WAITED && mt_same(oc));
    slow_ms = 0;
    int64_t s = -1;
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 5);
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    /* keep_last1 2 on tier 1, keep_last0 3 in each node. */
    CHECK(mask(ctx, t1) == (BIT(4) | BIT(5)));
    CHECK(mask(ctx, t0) == (BIT(2) | BIT(4) | BIT(5)));
    dcp_tier_free(t);
}

static void test_drain_fault(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    int oc = -1;
    dcp__tier_set_drain_hook(hook, NULL);
    fail_rank = 1;
    dcp_state *st = make_state(6, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 6, &oc));
    CHECK(oc == DCP_TIER_SAVED);
    int64_t s = -1;
    int rc = dcp_tier_drain_wait(t, &s);
    CHECK_RC(ctx, rc, DCP_EIO);
    CHECK(mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    CHECK_MSG(ctx, "rank 1");
    CHECK(s == 6);
    fail_rank = -1;
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    /* Tier 1 keeps 4 and 5; step 6 never committed there. */
    CHECK(mask(ctx, t1) == (BIT(4) | BIT(5)));
    CHECK(!exists(t1, 6, ".metadata"));
    CHECK(!exists(t1, 6, ".lock"));
    /* Restore: 6 is complete on tier 0. */
    st = make_state(0, 0);
    int tier = -1;
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 6 && tier == 0);
    CHECK(holds(st, 6));
    dcp_state_free(st);
    dcp_tier_free(t);
}

/* A node directory holding another save's file under the step's name
 * (a stale node): tier 0 looks complete, its load refuses the record of
 * another save, and the restore falls back to tier 1's newest (5), whole:
 * never a mix of steps 6 and 5. */
static void test_stale(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0) {
        char cmd[2000];
        snprintf(cmd, sizeof cmd,
                 "cp '%s/n1/step-5/__2_0.distcp' '%s/n1/step-6/__2_0.distcp'",
                 dir, dir);
        CHECK(system(cmd) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    dcp_state *st = make_state(0, 0);
    int64_t s = -1;
    int tier = -1;
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 5 && tier == 1);
    CHECK(holds(st, 5));
    dcp_state_free(st);
    dcp_tier_free(t);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void test_throttle(void)
{
    const uint64_t bw = 512 << 10;
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, bw);
    dcp_state *st = make_state(8, 1);
    int oc = -1;
    double a = now();
    CHECK_OK(ctx, dcp_tier_save(t, st, 8, &oc));
    int64_t s = -1;
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    double el = now() - a;
    CHECK(s == 8);
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof p, "%s/step-8/__%d_0.distcp", t1, mt_rank);
    CHECK(stat(p, &sb) == 0);
    double lo = 0.9 * (double)sb.st_size / (double)bw;
    if (el < lo)
        fprintf(stderr, "[rank %d] drain of %lld bytes took %.3f s < %.3f\n",
                mt_rank, (long long)sb.st_size, el, lo);
    CHECK(el >= lo);
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == (BIT(5) | BIT(8)));
    dcp_tier_free(t);
}

static void test_restart(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(0, 0);
    int64_t s = -1;
    int tier = -1, oc = -1;
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 8 && tier == 0);
    CHECK(holds(st, 8));
    dcp_state_free(st);
    st = make_state(9, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 9, &oc));
    CHECK(oc == DCP_TIER_SAVED);
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 9);
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == (BIT(8) | BIT(9)));
    dcp_tier_free(t);
}

/* tier0_async: a save returns once staged (the buffers change at once);
 * the next save commits it in tier 0 and starts its drain; a wait settles
 * both. */
static void test_async(void)
{
    async0 = 1;
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    async0 = 0;
    int oc = -1, done = -1;
    dcp_state *st = make_state(10, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 10, &oc));
    CHECK(oc == DCP_TIER_SAVED);
    memset(wbuf, 0x77, sizeof wbuf);
    memset(bbuf, 0x77, sizeof bbuf);
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(!exists(t1, 10, ".metadata"));
    st = make_state(11, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 11, &oc));
    CHECK(oc == DCP_TIER_SAVED);
    memset(bbuf, 0x77, sizeof bbuf);
    dcp_state_free(st);
    /* 10 committed in tier 0, its drain started; 11 staged. */
    CHECK(exists(t0, 10, ".metadata"));
    CHECK_OK(ctx, dcp_tier_drain_test(t, &done));
    CHECK(mt_same(done) && done == 0);
    int64_t s = -1;
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 11);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == (BIT(10) | BIT(11)));
    char p[700];
    for (int64_t k = 10; k <= 11; k++) {
        snprintf(p, sizeof p, "%s/step-%lld", t1, (long long)k);
        st = make_state(0, 0);
        CHECK_OK(ctx, dcp_load(ctx, st, p, NULL));
        CHECK(holds(st, k));
        dcp_state_free(st);
    }
    st = make_state(0, 0);
    int tier = -1;
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 11 && tier == 0);
    CHECK(holds(st, 11));
    dcp_state_free(st);
    /* A staged save completed by free. */
    st = make_state(12, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 12, &oc));
    dcp_state_free(st);
    dcp_tier_free(t);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == (BIT(11) | BIT(12)));
}

static void test_lost(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(0, 0);
    int64_t s = -1;
    int tier = -1;
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 12 && tier == 1);
    CHECK(holds(st, 12));
    dcp_state_free(st);
    dcp_tier_free(t);
}

/* kill: step 1 drained; step 2 saved, its drain killed on rank victim at
 * its kill_at-th hook call (a chunk, or rank 0's commit point). */
static void test_kill(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(1, 1);
    int64_t s = -1;
    CHECK_OK(ctx, dcp_tier_save(t, st, 1, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    st = make_state(2, 1);
    calls = 0;
    victim = (int)kill_victim;
    CHECK_OK(ctx, dcp_tier_save(t, st, 2, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s)); /* the victim dies first */
    victim = -1;
    dcp_state_free(st);
    dcp_tier_free(t);
}

/* After the kill: tier 1 holds step 1 only (step 2 without .metadata);
 * tier 0 holds step 2; with tier 0 gone, tier 1's step 1 loads, never a
 * mix; a new drain of step 2 takes the dead holder's lock over. */
static void test_killcheck(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    CHECK(mask(ctx, t1) == BIT(1));
    CHECK(!exists(t1, 2, ".metadata"));
    dcp_state *st = make_state(0, 0);
    int64_t s = -1;
    int tier = -1;
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 2 && tier == 0);
    CHECK(holds(st, 2));
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s/n0' '%s/n1'", dir, dir);
        CHECK(system(cmd) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 1 && tier == 1);
    CHECK(holds(st, 1));
    dcp_state_free(st);
    st = make_state(2, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 2, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 2);
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == (BIT(1) | BIT(2)));
    char p[700];
    snprintf(p, sizeof p, "%s/step-2", t1);
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_load(ctx, st, p, NULL));
    CHECK(holds(st, 2));
    dcp_state_free(st);
    dcp_tier_free(t);
}

/* interop: step 1 saved and drained, and the same state saved plainly
 * into DIR/plain, for tests/interop/test_tier_mpi.py (torch reads the
 * union of the node directories, tier 1 and the plain one). */
static void test_interop(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(1, 1);
    int64_t s = -1;
    CHECK_OK(ctx, dcp_tier_save(t, st, 1, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 1);
    char p[700];
    snprintf(p, sizeof p, "%s/plain", dir);
    CHECK_OK(ctx, dcp_save(ctx, st, p, &nosync));
    dcp_state_free(st);
    dcp_tier_free(t);
}

/* An s3:// tier 1 (run by tests/s3/s3_env.py): steps drained to the
 * bucket, retention keeps 2 there, and with every node's tier 0 gone the
 * restore comes from the bucket, bit-exact. */
static void test_s3(void)
{
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    int oc = -1, tier = -1;
    int64_t s = -1;
    for (int k = 1; k <= 3; k++) {
        dcp_state *st = make_state(k, 1);
        CHECK_OK(ctx, dcp_tier_save(t, st, k, &oc));
        CHECK(mt_same(oc));
        dcp_state_free(st);
    }
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 3);
    dcp_tier_free(t); /* the tier-1 retention due runs here at the latest */
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == (BIT(2) | BIT(3)));
    if (mt_rank == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s/n0' '%s/n1'", dir, dir);
        if (system(cmd) != 0)
            MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 3 && tier == 1 && mt_same((int)s));
    CHECK(holds(st, 3));
    dcp_state_free(st);
    dcp_tier_free(t);
}

/* ---------------------------------------------------------------- peers */

/* Whether files a and b hold the same bytes (both must exist). */
static int same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int x = fgetc(fa), y = fgetc(fb);
        same = x == y;
        if (x == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

static void rm_node(const char *name)
{
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0) {
        char cmd[1200];
        snprintf(cmd, sizeof cmd, "rm -rf '%s/%s'", dir, name);
        CHECK(system(cmd) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* Bad partners refused alike on every rank; failure domains steer the
 * ring: domains {1, 1, 2, 2} put node 0's replica on node 2, not 1. */
static void test_peers_config(void)
{
    char saved[600], saved1[600];
    snprintf(saved, sizeof saved, "%s", t0);
    snprintf(saved1, sizeof saved1, "%s", t1);
    snprintf(t0, sizeof t0, "%s/dom/P%d", dir, node);
    snprintf(t1, sizeof t1, "%s/dom/t1", dir);
    nrep = 1;
    int self[1] = {node}, far[1] = {9};
    dcp_tier *t = NULL;
    dcp_tier_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = sizeof o;
    o.tier0_dir = t0;
    o.tier1_root = t1;
    o.replicas = 1;
    o.partners = self;
    int rc = dcp_tier_create(&t, ctx, &o);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(t == NULL && mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    CHECK_MSG(ctx, "partner");
    o.partners = mt_rank == 3 ? far : NULL;
    rc = dcp_tier_create(&t, ctx, &o);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    fdom = node < 2 ? 1 : 2;
    t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(1, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 1, NULL));
    dcp_state_free(st);
    dcp_tier_free(t);
    fdom = 0;
    char p0[700], p1[700];
    snprintf(p0, sizeof p0, "%s/dom/P2", dir);
    snprintf(p1, sizeof p1, "%s/dom/P1", dir);
    CHECK(exists(p0, 1, "__0_0.distcp") && !exists(p1, 1, "__0_0.distcp"));
    snprintf(p0, sizeof p0, "%s/dom/P0", dir);
    CHECK(exists(p0, 1, "__3_0.distcp") && !exists(p0, 1, "__1_0.distcp"));
    snprintf(t0, sizeof t0, "%s", saved);
    snprintf(t1, sizeof t1, "%s", saved1);
}

/* A copy's write failing on rank 2 at its second piece. */
static int rhook2(int rank, const char *file, uint64_t off, void *arg)
{
    (void)file;
    (void)arg;
    return rank == 2 && off > 0 ? DCP_EIO : 0;
}

static void test_peers(void)
{
    nrep = 1;
    dcp__tier_set_replica_piece(16 << 10);
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(1, 1);
    int64_t s = -1;
    int tier = -1;
    CHECK_OK(ctx, dcp_tier_save(t, st, 1, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    dcp_state_free(st);
    /* Step 2: saved with its replicas; its drain fails. */
    fail_rank = 1;
    st = make_state(2, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 2, NULL));
    CHECK(dcp_tier_drain_wait(t, &s) == DCP_EIO && s == 2);
    fail_rank = -1;
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == BIT(1));
    /* Own file, and the predecessor's replica byte for byte; nothing
     * else (no temporaries). */
    char own[32], pred[32], a[1024], b[1024];
    int pr = (mt_rank + 3) % 4;
    snprintf(own, sizeof own, "__%d_0.distcp", mt_rank);
    snprintf(pred, sizeof pred, "__%d_0.distcp", pr);
    CHECK(exists(t0, 2, ".metadata") && exists(t0, 2, own));
    snprintf(a, sizeof a, "%s/step-2/%s", t0, pred);
    snprintf(b, sizeof b, "%s/P%d/step-2/%s", dir, pr, pred);
    CHECK(same_file(a, b));
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s/step-2' | wc -l) = 3", t0);
    CHECK(system(cmd) == 0);
    /* Node P2 lost: tier 0 still has every file of step 2, on P3 (P2's
     * partner); rank 2, P2's replacement with an empty directory, sees
     * its own node's only and gets __2_0 over the communicator. Tier 1
     * holds step 1 only: step 2 came from tier 0. */
    rm_node("P2");
    /* A copy failing on rank 2 at its second piece: the tier-0 load of
     * step 2 fails alike everywhere and falls back to tier 1's step 1,
     * whole; no partial copy is left under the file's name. */
    dcp__tier_set_replica_hook(rhook2, NULL);
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    dcp__tier_set_replica_hook(NULL, NULL);
    CHECK(s == 1 && tier == 1);
    CHECK(holds(st, 1));
    dcp_state_free(st);
    if (mt_rank == 2)
        CHECK(!exists(t0, 2, "__2_0.distcp"));
    uint64_t f0 = dcp__tier_fetched_bytes();
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 2 && tier == 0);
    CHECK(holds(st, 2));
    dcp_state_free(st);
    CHECK(mask(ctx, t1) == BIT(1));
    if (mt_rank == 2) {
        CHECK(dcp__tier_fetched_bytes() > f0);
        CHECK(exists(t0, 2, ".metadata") && exists(t0, 2, "__2_0.distcp"));
        snprintf(a, sizeof a, "%s/step-2/__2_0.distcp", t0);
        snprintf(b, sizeof b, "%s/P3/step-2/__2_0.distcp", dir);
        CHECK(same_file(a, b));
    }
    dcp_tier_free(t);
    dcp__tier_set_replica_piece(0);
}

/* In DIR/q, 4 ranks as 4 nodes, replicas 1: step 1 drained, step 2's
 * drain failed; node q/P2 lost; ranks 0, 1, 3 (nodes q/P0, q/P1, q/P3)
 * restore step 2 from tier 0 resharded 4 -> 3, each seeing its own node's
 * directory only: the files a node lacks (__1_0 for P0, __2_0 for P1)
 * come over the communicator. */
static void test_peers3(void)
{
    char saved[600], saved1[600];
    snprintf(saved, sizeof saved, "%s", t0);
    snprintf(saved1, sizeof saved1, "%s", t1);
    snprintf(t0, sizeof t0, "%s/q/P%d", dir, node);
    snprintf(t1, sizeof t1, "%s/q/t1", dir);
    nrep = 1;
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    int64_t s = -1;
    int tier = -1;
    for (int k = 1; k <= 2; k++) {
        fail_rank = k == 2 ? 1 : -1;
        dcp_state *st = make_state(k, 1);
        CHECK_OK(ctx, dcp_tier_save(t, st, k, NULL));
        CHECK(dcp_tier_drain_wait(t, &s) == (k == 2 ? DCP_EIO : DCP_OK));
        dcp_state_free(st);
    }
    fail_rank = -1;
    dcp_tier_free(t);
    rm_node("q/P2");
    MPI_Comm sub;
    MPI_Comm_split(MPI_COMM_WORLD, mt_rank == 2, mt_rank, &sub);
    uint64_t f0 = dcp__tier_fetched_bytes(), got = 0, sum = 0;
    uint64_t x0 = dcp__tier_exchanged_bytes();
    if (mt_rank != 2) {
        dcp_comm *c3 = NULL;
        dcp_ctx *x3 = NULL;
        int wr = mt_rank, ws = mt_size;
        MPI_Comm_rank(sub, &mt_rank);
        MPI_Comm_size(sub, &mt_size);
        if (dcp_comm_mpi(&c3, sub) != DCP_OK ||
            dcp_ctx_create(&x3, c3, NULL) != DCP_OK)
            MPI_Abort(MPI_COMM_WORLD, 2);
        t = mk(x3, DCP_TIER_WAIT, 0);
        dcp_state *st = make_state(0, 0);
        CHECK_OK(x3, dcp_tier_restore(t, st, NULL, &s, &tier));
        CHECK(s == 2 && tier == 0);
        CHECK(holds(st, 2));
        dcp_state_free(st);
        dcp_tier_free(t);
        got = dcp__tier_fetched_bytes() - f0;
        MPI_Allreduce(&got, &sum, 1, MPI_UINT64_T, MPI_SUM, sub);
        CHECK(sum > 0);
        /* Resharded 4 -> 3, ranks share stored chunks: each read its own
         * node's copy, nothing forwarded (read once would send them). */
        CHECK(dcp__tier_exchanged_bytes() == x0);
        /* With DCP_LOAD_READ_ONCE asked, they are forwarded. */
        t = mk(x3, DCP_TIER_WAIT, 0);
        st = make_state(0, 0);
        dcp_load_options lo;
        memset(&lo, 0, sizeof lo);
        lo.struct_size = sizeof lo;
        lo.flags = DCP_LOAD_READ_ONCE;
        CHECK_OK(x3, dcp_tier_restore(t, st, &lo, &s, &tier));
        CHECK(s == 2 && tier == 0);
        CHECK(holds(st, 2));
        dcp_state_free(st);
        dcp_tier_free(t);
        got = dcp__tier_exchanged_bytes() - x0;
        MPI_Allreduce(&got, &sum, 1, MPI_UINT64_T, MPI_SUM, sub);
        CHECK(sum > 0);
        dcp_ctx_free(x3);
        dcp_comm_free(c3);
        mt_rank = wr;
        mt_size = ws;
    }
    MPI_Comm_free(&sub);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == BIT(1));
    char p0[700];
    snprintf(p0, sizeof p0, "%s/q/P0", dir);
    if (mt_rank == 0)
        CHECK(exists(p0, 2, "__1_0.distcp"));
    snprintf(t0, sizeof t0, "%s", saved);
    snprintf(t1, sizeof t1, "%s", saved1);
}

/* 2 ranks naming P1 and P3: every file of step 2 is on one of them (own
 * or replica), resharded 4 -> 2. */
static void test_peers2(void)
{
    nrep = 3; /* clamped to 1 with 2 nodes */
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(0, 0);
    int64_t s = -1;
    int tier = -1;
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 2 && tier == 0);
    CHECK(holds(st, 2));
    dcp_state_free(st);
    dcp_tier_free(t);
}

/* A replica's write failing on rank 1 at its second piece. */
static int rhook(int rank, const char *file, uint64_t off, void *arg)
{
    (void)file;
    (void)arg;
    return rank == 1 && off > 0 ? DCP_EIO : 0;
}

/* 2 ranks as nodes a/P1, a/P3 (tier 1 a/t1), replicas 1: tier0_async
 * saves replicated when completed; a replica failing on rank 1 fails the
 * save alike everywhere and leaves no partial replica; with a/P3 lost,
 * the newest step whose every file survives (4) loads from tier 0. */
static void test_peers_async(void)
{
    snprintf(t0, sizeof t0, "%s/a/P%d", dir, node);
    snprintf(t1, sizeof t1, "%s/a/t1", dir);
    nrep = 1;
    async0 = 1;
    dcp__tier_set_replica_piece(16 << 10);
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    async0 = 0;
    int64_t s = -1;
    int tier = -1;
    for (int k = 3; k <= 4; k++) {
        dcp_state *st = make_state(k, 1);
        CHECK_OK(ctx, dcp_tier_save(t, st, k, NULL));
        dcp_state_free(st);
    }
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 4);
    dcp_tier_free(t);
    char p1[700], p3[700];
    snprintf(p1, sizeof p1, "%s/a/P1", dir);
    snprintf(p3, sizeof p3, "%s/a/P3", dir);
    MPI_Barrier(MPI_COMM_WORLD);
    for (int k = 3; k <= 4; k++)
        CHECK(exists(p1, k, "__1_0.distcp") && exists(p3, k, "__0_0.distcp"));
    t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp__tier_set_replica_hook(rhook, NULL);
    dcp_state *st = make_state(5, 1);
    /* The save returns once tier 0 committed; its replication (and its
     * drain, failed here on rank 1 too) end at the next collective call,
     * which reports the replica's failure on every rank, once. */
    fail_rank = 1;
    CHECK_OK(ctx, dcp_tier_save(t, st, 5, NULL));
    int rc = dcp_tier_drain_wait(t, &s);
    fail_rank = -1;
    dcp__tier_set_replica_hook(NULL, NULL);
    CHECK_RC(ctx, rc, DCP_EIO);
    CHECK(mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    CHECK_MSG(ctx, "replica of '__0_0.distcp' from rank 0 (rank 1)");
    CHECK_MSG(ctx, "replication of step 5");
    int64_t rs = -2;
    CHECK_OK(ctx, dcp_tier_replicated(t, &rs));
    CHECK(rs == -1); /* a new stack: step 5's replication failed */
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "test $(ls -A '%s/step-5' | wc -l) = 2", t0);
    CHECK(system(cmd) == 0);
    rm_node("a/P3");
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 4 && tier == 0);
    CHECK(holds(st, 4));
    dcp_state_free(st);
    dcp_tier_free(t);
    dcp__tier_set_replica_piece(0);
}

/* ------------------------------------------------- bgrepl (issue 30 #3) */

static int count_tmp(const char *nodedir);

/* Replica pieces written on this rank (every call of the replica hook
 * but the renames), and a failure on rank bg_fail's writes. */
static int bg_pieces, bg_renames, bg_fail = -1;
static int bghook(int rank, const char *file, uint64_t off, void *arg)
{
    (void)arg;
    (void)off;
    if (strcmp(file, ".rename") == 0) {
        bg_renames++;
        return 0;
    }
    bg_pieces++;
    return rank == bg_fail && off > 0 ? DCP_EIO : 0;
}

/* The partner's file under its name in this rank's node, step s. */
static int has_replica(int64_t s)
{
    char f[32];
    snprintf(f, sizeof f, "__%d_0.distcp", 1 - mt_rank);
    return exists(t0, s, f);
}

static int64_t replicated(dcp_tier *t)
{
    int64_t s = -2;
    CHECK_OK(ctx, dcp_tier_replicated(t, &s));
    CHECK(mt_same((int)s));
    return s;
}

static void test_bgrepl(void)
{
    nrep = 1;
    keep0 = 1; /* retention keeps the newest replicated step too */
    keep1 = 4;
    dcp__tier_set_replica_piece(16 << 10);
    dcp__tier_set_replica_hook(bghook, NULL);
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    int64_t s = -1;
    int tier = -1, done = 0;
    CHECK(replicated(t) == -1);
    CHECK(dcp_tier_replicated(NULL, &s) == DCP_EINVAL);
    CHECK(dcp_tier_replicated(t, NULL) == DCP_EINVAL);

    /* 1. The save returns before its replicas land: no piece written, no
     * replica under its name, not counted replicated. The next collective
     * call (drain_test) ends the replication: every piece written, the
     * replica renamed on both nodes, then counted. */
    dcp_state *st = make_state(1, 1);
    bg_pieces = bg_renames = 0;
    CHECK_OK(ctx, dcp_tier_save(t, st, 1, NULL));
    CHECK(bg_pieces == 0 && bg_renames == 0);
    CHECK(!has_replica(1) && exists(t0, 1, ".metadata"));
    CHECK(replicated(t) == -1);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_OK(ctx, dcp_tier_drain_test(t, &done));
    CHECK(bg_pieces > 2 && bg_renames == 1);
    CHECK(has_replica(1));
    CHECK(replicated(t) == 1);
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    dcp_state_free(st);

    /* 2. A partner failing mid-replication (rank 1's write of its second
     * piece): the save returned DCP_OK; the next call (drain_test) fails
     * alike on every rank, naming the replica, once; no replica of step 2
     * under a file's name on either node (rank 0's arrived whole but is
     * removed: the agreement failed); step 2 is not counted replicated but
     * stays committed in tier 0 (own files) and its drain goes on. */
    st = make_state(2, 1);
    bg_fail = 1;
    CHECK_OK(ctx, dcp_tier_save(t, st, 2, NULL));
    int rc = dcp_tier_drain_test(t, &done);
    bg_fail = -1;
    CHECK_RC(ctx, rc, DCP_EIO);
    CHECK(mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    CHECK_MSG(ctx, "replication of step 2");
    CHECK_MSG(ctx, "replica of '__0_0.distcp' from rank 0 (rank 1)");
    CHECK(!has_replica(2) && exists(t0, 2, ".metadata"));
    CHECK(replicated(t) == 1);
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 2);
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == (BIT(1) | BIT(2)));
    /* Retention keeping 1 kept step 1 too: the newest replicated. */
    CHECK(exists(t0, 1, ".metadata") && has_replica(1));
    /* The local step is usable: no node lost, step 2 from tier 0. */
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 2 && tier == 0 && holds(st, 2));
    dcp_state_free(st);

    /* 3. The same failure reported by the next dcp_tier_save, which then
     * saves nothing (step 4 in no tier); the following save works. */
    st = make_state(3, 1);
    bg_fail = 0;
    CHECK_OK(ctx, dcp_tier_save(t, st, 3, NULL));
    dcp_state_free(st);
    st = make_state(4, 1);
    rc = dcp_tier_save(t, st, 4, NULL);
    bg_fail = -1;
    CHECK_RC(ctx, rc, DCP_EIO);
    CHECK(mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    CHECK_MSG(ctx, "replication of step 3");
    CHECK(!exists(t0, 4, ".metadata"));
    CHECK(replicated(t) == 1);
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 3);
    dcp_state_free(st);

    /* 4. Step 5 replicated (its drain failing, so tier 1 stops at step
     * 3), then node B1 and tier 1 lost: the restore loads step 5 from
     * tier 0, B1's file from B0's replica. */
    st = make_state(5, 1);
    fail_rank = 0;
    CHECK_OK(ctx, dcp_tier_save(t, st, 5, NULL));
    dcp_state_free(st);
    CHECK(!has_replica(5));
    int frc = dcp_tier_drain_wait(t, &s);
    fail_rank = -1;
    CHECK(frc == DCP_EIO && s == 5);
    CHECK(replicated(t) == 5);
    dcp_tier_free(t);
    rm_node("B1");
    rm_node("t1");
    t = mk(ctx, DCP_TIER_WAIT, 0);
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 5 && tier == 0 && holds(st, 5));
    dcp_state_free(st);
    dcp_tier_free(t);

    /* 5. Node loss after a failed replication: step 6's replication
     * fails, so after losing B1 the restore skips step 6 (its B1 file
     * exists nowhere) and loads step 5, the newest fully replicated, from
     * tier 0 (tier 1 empty: its drains failed). */
    t = mk(ctx, DCP_TIER_WAIT, 0);
    st = make_state(6, 1);
    bg_fail = 0;
    fail_rank = 0;
    CHECK_OK(ctx, dcp_tier_save(t, st, 6, NULL));
    dcp_state_free(st);
    rc = dcp_tier_drain_wait(t, &s);
    bg_fail = -1;
    fail_rank = -1;
    CHECK_RC(ctx, rc, DCP_EIO);
    CHECK_MSG(ctx, "replication of step 6");
    CHECK(exists(t0, 6, ".metadata") && !has_replica(6));
    /* B0 kept step 5 (keep_last0 1: the newest replicated) and its
     * replica of B1's file (B1's step 5 holds its own file only: the
     * restore copied what its rank reads). */
    if (mt_rank == 0)
        CHECK(exists(t0, 5, ".metadata") && has_replica(5));
    rm_node("B1");
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 5 && tier == 0 && holds(st, 5));
    dcp_state_free(st);
    dcp_tier_free(t);

    /* 6. dcp_tier_free with a replication in flight, sync and tier0_async:
     * it lands (renamed on both nodes, no temporary left). */
    for (int a = 0; a <= 1; a++) {
        int64_t k = 7 + a;
        async0 = a;
        t = mk(ctx, DCP_TIER_WAIT, 0);
        async0 = 0;
        st = make_state(k, 1);
        bg_pieces = 0;
        CHECK_OK(ctx, dcp_tier_save(t, st, k, NULL));
        CHECK(bg_pieces == 0);
        dcp_state_free(st);
        dcp_tier_free(t);
        MPI_Barrier(MPI_COMM_WORLD);
        CHECK(bg_pieces > 2 && has_replica(k) && count_tmp(t0) == 0);
    }
    dcp__tier_set_replica_hook(NULL, NULL);
    dcp__tier_set_replica_piece(0);
}

/* ----------------------------------- bgthread (issue 30 #3, threaded) */

/* The replica hook on the replication's own thread: pieces written on
 * this rank, renames, a failure on rank bt_fail's writes, a nap per
 * piece. */
static _Atomic int bt_pieces, bt_renames, bt_fail = -1, bt_nap_ms;
static int bthook(int rank, const char *file, uint64_t off, void *arg)
{
    (void)arg;
    if (strcmp(file, ".rename") == 0) {
        bt_renames++;
        return 0;
    }
    if (bt_nap_ms)
        usleep((useconds_t)bt_nap_ms * 1000);
    bt_pieces++;
    return rank == bt_fail && off > 0 ? DCP_EIO : 0;
}

/* The size of the partner's file of step s: its source in the partner's
 * node (src), or the temporary its replica is written into here (-1:
 * none). */
static long long partner_size(int64_t s, int src)
{
    char p[1024], f[32];
    struct stat sb;
    snprintf(f, sizeof f, "__%d_0.distcp", 1 - mt_rank);
    if (src) {
        snprintf(p, sizeof p, "%s/T%d/step-%lld/%s", dir, 1 - mt_rank,
                 (long long)s, f);
        return stat(p, &sb) == 0 ? (long long)sb.st_size : -1;
    }
    snprintf(p, sizeof p, "%s/step-%lld", t0, (long long)s);
    DIR *d = opendir(p);
    long long got = -1;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, f, strlen(f)) != 0 ||
            e->d_name[strlen(f)] != '.' || n < 4 ||
            strcmp(e->d_name + n - 4, ".tmp") != 0)
            continue;
        char q[1400];
        snprintf(q, sizeof q, "%s/%s", p, e->d_name);
        if (stat(q, &sb) == 0)
            got = (long long)sb.st_size;
    }
    if (d)
        closedir(d);
    return got;
}

/* MPI_THREAD_MULTIPLE: the replication runs on a thread of its own after
 * the save returned; no tier call (nor any MPI call) is made until its
 * temporary is complete on disk; the next call only agrees and renames. */
static void test_bgthread(void)
{
    enum { PIECE = 4 << 10 };
    nrep = 1;
    keep0 = 4;
    keep1 = 4;
    CHECK(comm->ops.flags == DCP_COMM_P2P_THREAD);
    dcp__tier_set_replica_piece(PIECE);
    dcp__tier_set_replica_hook(bthook, NULL);
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    int64_t s = -1;
    int done = 0;

    /* 1. Step 1, 2 ms per piece: the save returns; then 20 s at most of
     * naps without a call of the tier or of MPI until the partner's file
     * is whole in its temporary, every piece written here. Not counted
     * replicated, not under its name until the next call (drain_test),
     * which writes no piece, renames, and counts it. */
    dcp_state *st = make_state(1, 1);
    bt_nap_ms = 2;
    double t_save = now();
    CHECK_OK(ctx, dcp_tier_save(t, st, 1, NULL));
    t_save = now() - t_save;
    long long want = partner_size(1, 1);
    long long npieces = (want + PIECE - 1) / PIECE;
    CHECK(want > 8 * PIECE);
    double t_wait = now();
    while ((partner_size(1, 0) != want || bt_pieces != npieces) &&
           now() - t_wait < 20)
        usleep(10000);
    t_wait = now() - t_wait;
    CHECK(partner_size(1, 0) == want && bt_pieces == npieces);
    CHECK(bt_renames == 0 && !has_replica(1));
    CHECK(replicated(t) == -1);
    int before = bt_pieces;
    double t_end = now();
    CHECK_OK(ctx, dcp_tier_drain_test(t, &done));
    t_end = now() - t_end;
    CHECK(bt_pieces == before && bt_renames == 1);
    CHECK(has_replica(1) && count_tmp(t0) == 0);
    CHECK(replicated(t) == 1);
    if (mt_rank == 0)
        fprintf(stderr,
                "bgthread: %lld pieces of %d B; save %.1f ms, replica "
                "whole %.1f ms later with no call, next call %.1f ms\n",
                npieces, PIECE, t_save * 1e3, t_wait * 1e3, t_end * 1e3);
    CHECK(t_end < 2.0);
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    dcp_state_free(st);

    /* 2. Rank 1's write failing on the thread: the save returned DCP_OK;
     * the next call fails alike on every rank, naming the replica; no
     * replica of step 2 nor temporary on either node; step 2 stays in
     * tier 0, not counted replicated. */
    bt_nap_ms = 0;
    bt_fail = 1;
    st = make_state(2, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 2, NULL));
    usleep(200000);
    int rc = dcp_tier_drain_test(t, &done);
    bt_fail = -1;
    CHECK_RC(ctx, rc, DCP_EIO);
    CHECK(mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    CHECK_MSG(ctx, "replication of step 2");
    CHECK_MSG(ctx, "replica of '__0_0.distcp' from rank 0 (rank 1)");
    CHECK(!has_replica(2) && exists(t0, 2, ".metadata") && count_tmp(t0) == 0);
    CHECK(replicated(t) == 1);
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    dcp_state_free(st);

    /* 3. The next save after a replication done in the background (its
     * temporary whole before the call): the save lands step 3's first. */
    st = make_state(3, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 3, NULL));
    dcp_state_free(st);
    t_wait = now();
    while (partner_size(3, 0) != partner_size(3, 1) && now() - t_wait < 20)
        usleep(10000);
    CHECK(partner_size(3, 0) == want && !has_replica(3));
    st = make_state(4, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 4, NULL));
    CHECK(replicated(t) == 3 && has_replica(3));
    dcp_state_free(st);

    /* 4. dcp_tier_free with step 5's replication in flight (20 ms per
     * piece): it lands, renamed on both nodes, no temporary left. */
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    bt_nap_ms = 20;
    bt_pieces = 0;
    st = make_state(5, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 5, NULL));
    dcp_state_free(st);
    CHECK(bt_pieces < npieces);
    dcp_tier_free(t);
    bt_nap_ms = 0;
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(bt_pieces == npieces && has_replica(5) && count_tmp(t0) == 0);
    dcp__tier_set_replica_hook(NULL, NULL);
    dcp__tier_set_replica_piece(0);
}

/* rkill: the victim dies at its kill_at-th replica hook call. */
static int rkill_hook(int rank, const char *file, uint64_t off, void *arg)
{
    (void)file;
    (void)off;
    (void)arg;
    if (rank == victim && ++calls == kill_at)
        raise(SIGKILL);
    return 0;
}

static void test_rkill(void)
{
    nrep = 1;
    dcp__tier_set_replica_piece(16 << 10);
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(1, 1);
    int64_t s = -1;
    CHECK_OK(ctx, dcp_tier_save(t, st, 1, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    calls = 0;
    victim = (int)kill_victim;
    dcp__tier_set_replica_hook(rkill_hook, NULL);
    st = make_state(2, 1);
    /* The save returns before its replicas land; the replication runs to
     * its end in the next collective call, here dcp_tier_free, where the
     * victim dies. */
    CHECK_OK(ctx, dcp_tier_save(t, st, 2, NULL));
    dcp_state_free(st);
    dcp_tier_free(t); /* the victim dies */
    dcp__tier_set_replica_hook(NULL, NULL);
    victim = -1;
}

/* The temporaries ("*.tmp") in the step directories of a node's. */
static int count_tmp(const char *nodedir)
{
    int n = 0;
    for (int64_t s = 0; s < 16; s++) {
        char p[1024];
        DIR *d;
        struct dirent *de;
        snprintf(p, sizeof p, "%s/step-%lld", nodedir, (long long)s);
        if (!(d = opendir(p)))
            continue;
        while ((de = readdir(d))) {
            size_t l = strlen(de->d_name);
            n += l > 4 && !strcmp(de->d_name + l - 4, ".tmp");
        }
        closedir(d);
    }
    return n;
}

static void test_rkillcheck(void)
{
    int v = (int)kill_victim, w = 1 - v;
    char lost[40], surv[700], vfile[32];
    snprintf(lost, sizeof lost, "R%d", v);
    snprintf(surv, sizeof surv, "%s/R%d", dir, w);
    snprintf(vfile, sizeof vfile, "__%d_0.distcp", v);
    rm_node(lost);
    nrep = 1;
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(0, 0);
    int64_t s = -1;
    int tier = -1;
    int have = exists(surv, 2, vfile), ntmp = count_tmp(surv);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(tier == 0 && mt_same((int)s));
    CHECK(s == (have ? 2 : 1));
    CHECK(holds(st, s));
    dcp_state_free(st);
    /* A killed replication's temporaries are leftovers: the next save
     * removes them (retention keeps 3 here, step 2 stays), the drain
     * succeeds. */
    st = make_state(3, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 3, NULL));
    dcp_state_free(st);
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 3);
    if (node == w) {
        CHECK(count_tmp(surv) == 0);
        CHECK(exists(surv, 2, ".metadata"));
        printf("temporaries before: %d\n", ntmp);
    }
    dcp_tier_free(t);
    /* Retention keeping 1 removes the older steps, none refused. */
    keep0 = 1;
    t = mk(ctx, DCP_TIER_WAIT, 0);
    st = make_state(4, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 4, NULL));
    dcp_state_free(st);
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 4);
    if (node == w)
        CHECK(!exists(surv, 2, ".metadata") && !exists(surv, 3, ".metadata"));
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 4 && tier == 0);
    CHECK(holds(st, 4));
    dcp_state_free(st);
    dcp_tier_free(t);
}

static void test_peerslost(void)
{
    nrep = 1;
    rm_node("P1");
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(0, 0);
    int64_t s = -1;
    int tier = -1;
    /* P1 and P2 gone: __1_0 of step 2 is on neither survivor. */
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 1 && tier == 1 && mt_same((int)s));
    CHECK(holds(st, 1));
    dcp_state_free(st);
    dcp_tier_free(t);
    /* Nothing on tier 1 either: DCP_ENOENT, the same everywhere. */
    char old[600];
    snprintf(old, sizeof old, "%s", t1);
    snprintf(t1, sizeof t1, "%s/t1-empty", dir);
    t = mk(ctx, DCP_TIER_WAIT, 0);
    st = make_state(0, 0);
    int rc = dcp_tier_restore(t, st, NULL, &s, &tier);
    CHECK_RC(ctx, rc, DCP_ENOENT);
    CHECK(mt_same(rc) && mt_same_str(dcp_errmsg(ctx)));
    CHECK(s == -1 && tier == -1);
    CHECK_MSG(ctx, "__1_0.distcp");
    dcp_state_free(st);
    dcp_tier_free(t);
    snprintf(t1, sizeof t1, "%s", old);
    /* replicas 0: a lost node costs the steps after the last drained. */
    nrep = 0;
    snprintf(t0, sizeof t0, "%s/z/P%d", dir, node);
    t = mk(ctx, DCP_TIER_WAIT, 0);
    st = make_state(5, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 5, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    dcp_state_free(st);
    fail_rank = 1;
    st = make_state(6, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 6, NULL));
    CHECK(dcp_tier_drain_wait(t, &s) == DCP_EIO);
    fail_rank = -1;
    dcp_state_free(st);
    rm_node("z/P3");
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 5 && tier == 1);
    CHECK(holds(st, 5));
    dcp_state_free(st);
    dcp_tier_free(t);
}

/* A node lost at each phase of the drain (tier_drainloss.sh). dkill: 4
 * ranks as nodes n0 (ranks 0, 1) and n1 (2, 3), replicas dk_rep, keep_last
 * 1 on both tiers; step 1 saved and drained, then step 2 saved and killed
 * on rank dk_victim (SIGKILL) at the phase dk_phase, of its save:
 *   spread     step 2 committed in tier 0, `.metadata` in n0's only
 *   replicate  (replicas 1) `.metadata` in every node, no replica sent
 * or of its drain:
 *   start      step 2 committed in tier 0, its replication begun (it ends
 *              at the next collective call), drain not started
 *   data0      before the first chunk of the victim's data file
 *   data1      mid-copy: before its second chunk (64 KiB copied)
 *   prune0     the node's data copied, before the tier-0 retention
 *   metadata   rank 0: every data file in tier 1, .metadata not published
 *   committed  rank 0: .metadata published, lock and retention not done
 *   prune1     rank 0: before tier 1's retention drops step 1
 * mpiexec ends the job: every rank dies. A run that returns never reached
 * the phase. */
static const char *dk_phase = "";
static int dk_rep, dk_victim = -1;
static const char *dk_lost = "none";

static int dkill_hook(int rank, const char *file, uint64_t off, void *arg)
{
    (void)arg;
    if (rank != dk_victim)
        return 0;
    int hit;
    if (file[0] != '.')
        hit = strcmp(dk_phase, off ? "data1" : "data0") == 0;
    else
        hit = strcmp(dk_phase, file + 1) == 0;
    if (hit)
        raise(SIGKILL);
    return 0;
}

static void test_dkill(void)
{
    nrep = (uint32_t)dk_rep;
    keep0 = keep1 = 1;
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    dcp_state *st = make_state(1, 1);
    int64_t s = -1;
    CHECK_OK(ctx, dcp_tier_save(t, st, 1, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 1);
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    dcp__tier_set_drain_hook(dkill_hook, NULL);
    st = make_state(2, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 2, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s)); /* the victim dies first */
    dcp__tier_set_drain_hook(hook, NULL);
    dcp_state_free(st);
    dcp_tier_free(t);
}

/* dcheck, after dkill, on any number of ranks (node: rank * 2 / size, a
 * replacement's directory new and empty): the nodes dk_lost lost ("none",
 * "one": the victim's, "all": n0 and n1) and their directories deleted.
 * Tier 1 holds step 2 committed only when the kill came after its commit,
 * else step 1 only (step 2 without .metadata). The restore loads step 2
 * from tier 0 when every node survived or one replica covers the lost
 * node, else tier 1's newest complete step; bit-exact, the same step on
 * every rank, never a mix. Then step 2 saves again (drained, the dead
 * holder's lock of tier 1's step 2 taken over, unless tier 1 committed
 * it) and a step 3 saves, drains and restores. Rank 0 prints the row. */
static void test_dcheck(void)
{
    int one = strcmp(dk_lost, "one") == 0, all = strcmp(dk_lost, "all") == 0;
    CHECK(one || all || strcmp(dk_lost, "none") == 0);
    if (one || all)
        rm_node(all || dk_victim < 2 ? "n0" : "n1");
    if (all)
        rm_node("n1");
    int committed = dk_victim == 0 && (strcmp(dk_phase, "committed") == 0 ||
                                       strcmp(dk_phase, "prune1") == 0);
    /* Killed before step 2's replication began or ended (its save, the
     * drain's start: the save returns before its replicas land, which
     * end at the next collective call, here drain_wait's start): */
    int saving = strcmp(dk_phase, "spread") == 0 ||
                 strcmp(dk_phase, "replicate") == 0 ||
                 strcmp(dk_phase, "start") == 0;
    /* Killed on the drain thread while the caller's thread may be ending
     * step 2's replication: the survivor renamed its replica, or not. */
    int racing =
        dk_rep > 0 && one &&
        (strcmp(dk_phase, "data0") == 0 || strcmp(dk_phase, "data1") == 0 ||
         strcmp(dk_phase, "prune0") == 0);
    int from0 = !one && !all ? 1 : one && dk_rep > 0;
    /* Killed in the save: a lost node's files of step 2 are on no other
     * node, step 1 (replicated, drained; tier-0 retention keeps the newest
     * replicated step beside keep_last0) is the newest complete. */
    int64_t want = committed || (from0 && !(saving && one)) ? 2 : 1;
    nrep = (uint32_t)dk_rep;
    keep0 = keep1 = 1;
    dcp_tier *t = mk(ctx, DCP_TIER_WAIT, 0);
    if (committed) {
        CHECK(mask(ctx, t1) == (BIT(1) | BIT(2)));
    } else {
        CHECK(mask(ctx, t1) == BIT(1));
        CHECK(!exists(t1, 2, ".metadata"));
    }
    dcp_state *st = make_state(0, 0);
    int64_t s = -1;
    int tier = -1;
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(mt_same((int)s) && mt_same(tier));
    CHECK((s == want || (racing && s == 1)) && tier == (from0 ? 0 : 1));
    CHECK(holds(st, s));
    dcp_state_free(st);
    if (mt_rank == 0)
        printf("restored step %lld from tier %d\n", (long long)s, tier);
    /* Step 2 saved again: drained unless tier 1 committed it (the dead
     * holder's lock of tier 1's step 2 taken over). */
    int oc = -1;
    st = make_state(2, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 2, &oc));
    CHECK(oc == (committed ? DCP_TIER_SAVED_NO_DRAIN : DCP_TIER_SAVED));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == (committed ? -1 : 2));
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == (committed ? BIT(1) | BIT(2) : BIT(2)));
    char p[700];
    snprintf(p, sizeof p, "%s/step-2", t1);
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_load(ctx, st, p, NULL));
    CHECK(holds(st, 2));
    dcp_state_free(st);
    st = make_state(3, 1);
    CHECK_OK(ctx, dcp_tier_save(t, st, 3, NULL));
    CHECK_OK(ctx, dcp_tier_drain_wait(t, &s));
    CHECK(s == 3);
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(mask(ctx, t1) == BIT(3));
    st = make_state(0, 0);
    CHECK_OK(ctx, dcp_tier_restore(t, st, NULL, &s, &tier));
    CHECK(s == 3 && tier == 0);
    CHECK(holds(st, 3));
    dcp_state_free(st);
    dcp_tier_free(t);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "bgthread") == 0) {
        /* The replication's thread needs MPI_THREAD_MULTIPLE. */
        int provided = 0;
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
        MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
        if (provided != MPI_THREAD_MULTIPLE) {
            if (mt_rank == 0)
                fprintf(stderr, "skipped: no MPI_THREAD_MULTIPLE\n");
            MPI_Finalize();
            return 77;
        }
    } else {
        mt_init(&argc, &argv);
    }
    if (argc < 3 || (strcmp(argv[1], "kill") == 0 && argc != 5) ||
        (strcmp(argv[1], "rkill") == 0 && argc != 5) ||
        (strcmp(argv[1], "rkillcheck") == 0 && argc != 4) ||
        (strcmp(argv[1], "dkill") == 0 && argc != 6) ||
        (strcmp(argv[1], "dcheck") == 0 && argc != 7)) {
        if (mt_rank == 0)
            fprintf(stderr,
                    "usage: mpi_tier save|restart|lost|killcheck|"
                    "interop|peers|peers2|peerslost|bgrepl|bgthread DIR | "
                    "kill|rkill "
                    "DIR VICTIM K | "
                    "rkillcheck DIR VICTIM | "
                    "dkill DIR REPLICAS PHASE VICTIM | "
                    "dcheck DIR REPLICAS PHASE VICTIM none|one|all | "
                    "s3 DIR S3URL\n");
        MPI_Finalize();
        return 2;
    }
    const char *mode = argv[1];
    snprintf(dir, sizeof dir, "%s", argv[2]);
    if (strcmp(mode, "save") == 0 || strcmp(mode, "s3") == 0)
        node = mt_rank / 2;
    else if (strcmp(mode, "restart") == 0)
        node = mt_rank < 2 ? 0 : 1;
    else if (strcmp(mode, "lost") == 0)
        node = 0;
    else if (strcmp(mode, "peers") == 0 || strcmp(mode, "peerslost") == 0 ||
             strcmp(mode, "bgrepl") == 0 || strcmp(mode, "bgthread") == 0)
        node = mt_rank;
    else if (strcmp(mode, "peers2") == 0)
        node = mt_rank ? 3 : 1;
    else
        node = mt_rank; /* kill, killcheck: 2 ranks, 2 nodes */
    if (strcmp(mode, "kill") == 0 || strcmp(mode, "rkill") == 0) {
        kill_victim = strtol(argv[3], NULL, 10);
        kill_at = (int)strtol(argv[4], NULL, 10);
    }
    if (strcmp(mode, "rkillcheck") == 0)
        kill_victim = strtol(argv[3], NULL, 10);
    if (strcmp(mode, "dkill") == 0 || strcmp(mode, "dcheck") == 0) {
        dk_rep = (int)strtol(argv[3], NULL, 10);
        dk_phase = argv[4];
        dk_victim = (int)strtol(argv[5], NULL, 10);
        if (argc == 7)
            dk_lost = argv[6];
        node = mt_rank * 2 / mt_size; /* two nodes */
    }
    if (strcmp(mode, "interop") == 0)
        node = mt_rank / 2;
    if ((strcmp(mode, "save") == 0 || strcmp(mode, "kill") == 0 ||
         strcmp(mode, "peers") == 0 || strcmp(mode, "rkill") == 0 ||
         strcmp(mode, "interop") == 0 || strcmp(mode, "s3") == 0 ||
         strcmp(mode, "dkill") == 0 || strcmp(mode, "bgrepl") == 0 ||
         strcmp(mode, "bgthread") == 0) &&
        mt_rank == 0) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0)
            MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (strcmp(mode, "lost") == 0 && mt_rank == 0) {
        char cmd[700];
        snprintf(cmd, sizeof cmd, "rm -rf '%s/n1'", dir);
        if (system(cmd) != 0)
            MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    snprintf(t0, sizeof t0, "%s/n%d", dir, node);
    if (strncmp(mode, "peers", 5) == 0)
        snprintf(t0, sizeof t0, "%s/P%d", dir, node);
    if (strncmp(mode, "rkill", 5) == 0)
        snprintf(t0, sizeof t0, "%s/R%d", dir, node);
    if (strcmp(mode, "bgrepl") == 0)
        snprintf(t0, sizeof t0, "%s/B%d", dir, node);
    if (strcmp(mode, "bgthread") == 0)
        snprintf(t0, sizeof t0, "%s/T%d", dir, node);
    snprintf(t1, sizeof t1, "%s/t1", dir);
    if (strcmp(mode, "s3") == 0 && argc == 4)
        snprintf(t1, sizeof t1, "%s", argv[3]);
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK ||
        dcp_ctx_create(&ctx, comm, NULL) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    dcp__tier_set_drain_hook(hook, NULL);
    if (strcmp(mode, "save") == 0) {
        RUN(errors);
        RUN(save_drain);
        RUN(skip);
        RUN(wait_retention);
        RUN(drain_fault);
        RUN(stale);
        RUN(throttle);
    } else if (strcmp(mode, "restart") == 0) {
        RUN(restart);
        RUN(async);
    } else if (strcmp(mode, "lost") == 0) {
        RUN(lost);
    } else if (strcmp(mode, "kill") == 0) {
        RUN(kill);
    } else if (strcmp(mode, "interop") == 0) {
        RUN(interop);
    } else if (strcmp(mode, "peers") == 0) {
        RUN(peers_config);
        RUN(peers);
        RUN(peers3);
    } else if (strcmp(mode, "peers2") == 0) {
        RUN(peers2);
        RUN(peers_async);
    } else if (strcmp(mode, "peerslost") == 0) {
        RUN(peerslost);
    } else if (strcmp(mode, "bgrepl") == 0) {
        RUN(bgrepl);
    } else if (strcmp(mode, "bgthread") == 0) {
        RUN(bgthread);
    } else if (strcmp(mode, "rkill") == 0) {
        RUN(rkill);
    } else if (strcmp(mode, "rkillcheck") == 0) {
        RUN(rkillcheck);
    } else if (strcmp(mode, "dkill") == 0) {
        RUN(dkill);
    } else if (strcmp(mode, "dcheck") == 0) {
        RUN(dcheck);
    } else if (strcmp(mode, "s3") == 0) {
        RUN(s3);
    } else {
        RUN(killcheck);
    }
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    return mt_finish();
}
