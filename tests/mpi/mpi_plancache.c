/*
 * The save plan cache (save.c "plan cache"), over 1..4 ranks: a second
 * save with the same structure reuses the plan on every rank
 * (dcp_ctx_plan_cached) while values change and the path changes, and
 * writes exactly the files an uncached save writes (.metadata equal but
 * for the random save_id, data files equal); a change on ONE rank (an
 * added key, a global shape, a dtype, a box, a value's contents) makes
 * every rank plan afresh, with the plan's checks (DCP_EPLAN where the
 * change is invalid); asynchronous saves in a loop; an overwrite of the
 * same path (fresh file tag); a failed save leaves no cache;
 * DCP_SAVE_NO_PLAN_CACHE; repeated loads reusing the checked .metadata
 * until the boxes on one rank or the checkpoint change.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitest.h"
#include "mt_usercomm.h"

#include "../sidmask.h"
#include "save.h" /* dcp__save_write_fail_after */

static char root[256];
static dcp_comm *comm;
static const dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};
static const dcp_save_options nocache = {sizeof(dcp_save_options), 1,
                                         DCP_SAVE_NO_PLAN_CACHE, NULL};

enum variant { V_BASE, V_ADDKEY, V_SHAPE, V_DTYPE, V_BOX, V_VALUE };

#define ROWS 13
#define COLS 6
#define NB   8

/* One rank's state and its buffers. */
struct rs {
    dcp_state *st;
    float w[ROWS * COLS];
    float b[NB];
    double b64[NB];
    float extra[4];
    float w7[ROWS * 7];
};

static float wval(int step, int64_t i, int64_t j)
{
    return (float)(step * 1000 + i * 10 + j);
}

/* The state at a step; variant v applies on the last rank only. */
static void build(struct rs *s, int step, int v)
{
    int me = mt_rank == mt_size - 1 ? v : V_BASE;
    int64_t shape[2] = {ROWS, COLS}, off[2] = {0, 0}, size[2] = {0, COLS};
    int64_t bs = NB, bo = 0, bz = NB, four = 4, zero = 0;
    int64_t i, j;
    CHECK(dcp_state_create(&s->st) == DCP_OK);
    mt_split(ROWS, mt_size, mt_rank, &off[0], &size[0]);
    if (me == V_SHAPE) {
        shape[1] = size[1] = 7;
        for (i = 0; i < size[0]; i++)
            for (j = 0; j < 7; j++)
                s->w7[i * 7 + j] = wval(step, off[0] + i, j);
        CHECK(dcp_state_add_tensor(s->st, "w", DCP_F32, 2, shape, off, size,
                                   s->w7, DCP_MEM_HOST) == DCP_OK);
    } else {
        for (i = 0; i < size[0]; i++)
            for (j = 0; j < COLS; j++)
                s->w[i * COLS + j] = wval(step, off[0] + i, j);
        CHECK(dcp_state_add_tensor(s->st, "w", DCP_F32, 2, shape, off, size,
                                   s->w, DCP_MEM_HOST) == DCP_OK);
    }
    for (i = 0; i < NB; i++) {
        s->b[i] = (float)step + 0.5f * (float)i;
        s->b64[i] = s->b[i];
    }
    if (me == V_BOX)
        bz = 0;
    CHECK(dcp_state_add_tensor(s->st, "b", me == V_DTYPE ? DCP_F64 : DCP_F32, 1,
                               &bs, &bo, &bz,
                               me == V_DTYPE ? (void *)s->b64 : (void *)s->b,
                               DCP_MEM_HOST) == DCP_OK);
    if (me == V_ADDKEY) {
        for (i = 0; i < 4; i++)
            s->extra[i] = (float)(step + i);
        CHECK(dcp_state_add_tensor(s->st, "extra", DCP_F32, 1, &four, &zero,
                                   &four, s->extra, DCP_MEM_HOST) == DCP_OK);
    }
    CHECK(dcp_state_add_value(s->st, "step", dcp_value_int(step)) == DCP_OK);
    CHECK(dcp_state_add_value(s->st, "name",
                              dcp_value_str(me == V_VALUE ? "other" : "run")) ==
          DCP_OK);
}

static void drop(struct rs *s)
{
    dcp_state_free(s->st);
    s->st = NULL;
}

static const char *sub(const char *name)
{
    static char buf[4][400];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

/* Saves the base state at step into path; returns the code. */
static int save_step(dcp_ctx *ctx, int step, const char *path, int v,
                     const dcp_save_options *so)
{
    struct rs s;
    int rc;
    build(&s, step, v);
    rc = dcp_save(ctx, s.st, path, so);
    drop(&s);
    return rc;
}

/* Loads path into a fresh base layout and checks every byte and value. */
static void check_load(dcp_ctx *ctx, const char *path, int step)
{
    struct rs s, want;
    const dcp_value *v;
    size_t len;
    const char *str;
    memset(&want, 0xee, sizeof(want)); /* outside the shard: as s's */
    build(&want, step, V_BASE);
    drop(&want);
    memset(&s, 0, sizeof(s));
    build(&s, 0, V_BASE);
    memset(s.w, 0xee, sizeof(s.w));
    memset(s.b, 0xee, sizeof(s.b));
    CHECK_OK(ctx, dcp_load(ctx, s.st, path, NULL));
    CHECK(memcmp(s.w, want.w, sizeof(s.w)) == 0);
    CHECK(memcmp(s.b, want.b, sizeof(s.b)) == 0);
    v = dcp_state_value(s.st, "step");
    CHECK(v && dcp_value_as_int(v) == step);
    v = dcp_state_value(s.st, "name");
    str = v ? dcp_value_as_str(v, &len) : NULL;
    CHECK(str && len == 3 && !memcmp(str, "run", 3));
    drop(&s);
}

/* ------------------------------------------------ file comparison */

struct file {
    char name[256];
    unsigned char *p;
    size_t n;
};

static int read_dir(const char *dir, struct file *f, int cap)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d)
        return -1;
    while ((de = readdir(d)) != NULL && n < cap) {
        char p[600];
        FILE *fp;
        long len;
        if (de->d_name[0] == '.' && strcmp(de->d_name, ".metadata"))
            continue;
        snprintf(f[n].name, sizeof(f[n].name), "%.200s", de->d_name);
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        fp = fopen(p, "rb");
        if (!fp)
            continue;
        fseek(fp, 0, SEEK_END);
        len = ftell(fp);
        fseek(fp, 0, SEEK_SET);
        f[n].n = (size_t)len;
        f[n].p = malloc(f[n].n ? f[n].n : 1);
        if (f[n].p && fread(f[n].p, 1, f[n].n, fp) == f[n].n)
            n++;
        else
            free(f[n].p);
        fclose(fp);
    }
    closedir(d);
    return n;
}

static const struct file *find(const struct file *f, int n, const char *name)
{
    int i;
    for (i = 0; i < n; i++)
        if (!strcmp(f[i].name, name))
            return &f[i];
    return NULL;
}

/* The two directories hold the same files with the same bytes, but for
 * .metadata's save_id (16 hex digits: every difference within 16 bytes). */
static int same_files(const char *a, const char *b)
{
    struct file fa[16], fb[16];
    int na = read_dir(a, fa, 16), nb = read_dir(b, fb, 16), i, ok = 1;
    if (na <= 1 || na != nb)
        ok = 0;
    for (i = 0; ok && i < na; i++) {
        const struct file *o = find(fb, nb, fa[i].name);
        size_t k, lo = (size_t)-1, hi = 0;
        if (!o || o->n != fa[i].n) {
            ok = 0;
            break;
        }
        /* Each save's id is in its records (sidmask.h). */
        (void)dcp_test_mask_sids(o->p, o->n);
        (void)dcp_test_mask_sids(fa[i].p, fa[i].n);
        for (k = 0; k < o->n; k++)
            if (o->p[k] != fa[i].p[k]) {
                lo = lo < k ? lo : k;
                hi = k;
            }
        if (lo != (size_t)-1 &&
            (strcmp(fa[i].name, ".metadata") || hi - lo >= 16))
            ok = 0;
    }
    for (i = 0; i < na; i++)
        free(fa[i].p);
    for (i = 0; i < nb; i++)
        free(fb[i].p);
    return ok;
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[600];
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

static dcp_ctx *new_ctx(void)
{
    dcp_ctx *ctx = NULL;
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == DCP_OK);
    return ctx;
}

/* ------------------------------------------------------------ tests */

/* Second save: cached on every rank, new values, new path, and the same
 * bytes as a save planned afresh into the same path. */
static void test_hit_identical(void)
{
    dcp_ctx *ctx = new_ctx(), *ref = new_ctx();
    int same;
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 0);
    CHECK_OK(ctx, save_step(ctx, 1, sub("h1"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 0);
    CHECK_OK(ctx, save_step(ctx, 2, sub("h2"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
    CHECK(mt_same(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE)));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 0);
    check_load(ctx, sub("h2"), 2);
    CHECK_OK(ctx, save_step(ctx, 3, sub("h3"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
    /* The reference: the same state planned afresh into the same path. */
    if (mt_rank == 0)
        CHECK(rename(sub("h3"), sub("h3c")) == 0);
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK_OK(ref, save_step(ref, 3, sub("h3"), V_BASE, &nocache));
    CHECK(dcp_ctx_plan_cached(ref, DCP_IO_SAVE) == 0);
    MPI_Barrier(MPI_COMM_WORLD);
    /* checkpoint_id is the path: compare h3 with h3c moved back. */
    if (mt_rank == 0) {
        CHECK(rename(sub("h3"), sub("h3r")) == 0);
        CHECK(rename(sub("h3c"), sub("h3")) == 0);
        same = same_files(sub("h3"), sub("h3r"));
        CHECK(same);
        CHECK(rename(sub("h3r"), sub("h3c")) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    check_load(ctx, sub("h3"), 3);
    check_load(ctx, sub("h3c"), 3);
    /* A value's pickle grows (300 needs BININT2, 3 BININT1): its size is
     * part of the structure (it weighs in the writer choice), so planned. */
    CHECK_OK(ctx, save_step(ctx, 300, sub("h3"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 0);
    check_load(ctx, sub("h3"), 300);
    /* With the flag: planned, and no cache kept for the next save. */
    CHECK_OK(ctx, save_step(ctx, 4, sub("h4"), V_BASE, &nocache));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 0);
    CHECK_OK(ctx, save_step(ctx, 5, sub("h5"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 0);
    CHECK_OK(ctx, save_step(ctx, 6, sub("h6"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
    check_load(ctx, sub("h6"), 6);
    dcp_ctx_free(ref);
    dcp_ctx_free(ctx);
}

/* A change on the last rank only: every rank plans again (rc as a fresh
 * plan decides), then the next equal save is cached again. */
static void test_invalidate(void)
{
    static const int vs[] = {V_ADDKEY, V_SHAPE, V_DTYPE, V_BOX, V_VALUE};
    dcp_ctx *ctx = new_ctx();
    size_t k;
    for (k = 0; k < sizeof(vs) / sizeof(vs[0]); k++) {
        int v = vs[k], want = DCP_OK, rc;
        char name[32];
        /* Valid on one rank (the last rank's view is the whole tensor)
         * or with the others (another key, a replica dropped). */
        if (mt_size > 1 && (v == V_SHAPE || v == V_DTYPE || v == V_VALUE))
            want = DCP_EPLAN;
        if (mt_size == 1 && v == V_BOX)
            want = DCP_EPLAN; /* "b" no longer covered */
        snprintf(name, sizeof(name), "i%zu", k);
        CHECK_OK(ctx, save_step(ctx, 10, sub(name), V_BASE, &nosync));
        CHECK_OK(ctx, save_step(ctx, 11, sub(name), V_BASE, &nosync));
        CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
        rc = save_step(ctx, 12, sub(name), v, &nosync);
        CHECK_RC(ctx, rc, want);
        CHECK(mt_same(rc));
        CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 0);
        if (want != DCP_OK)
            check_load(ctx, sub(name), 11); /* nothing committed */
        CHECK_OK(ctx, save_step(ctx, 13, sub(name), V_BASE, &nosync));
        CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 0);
        CHECK_OK(ctx, save_step(ctx, 14, sub(name), V_BASE, &nosync));
        CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
        check_load(ctx, sub(name), 14);
    }
    dcp_ctx_free(ctx);
}

/* Asynchronous saves in a loop, buffers changed right after each call. */
static void test_async_loop(void)
{
    dcp_ctx *ctx = new_ctx();
    dcp_request *prev = NULL;
    int i;
    for (i = 0; i < 5; i++) {
        struct rs s;
        dcp_request *req = NULL;
        char name[32];
        snprintf(name, sizeof(name), "a%d", i);
        build(&s, 20 + i, V_BASE);
        CHECK_OK(ctx, dcp_save_async(ctx, s.st, sub(name), &nosync, &req));
        CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == (i > 0));
        memset(s.w, 0x5a, sizeof(s.w));
        memset(s.b, 0x5a, sizeof(s.b));
        drop(&s);
        if (prev) { /* completed inside this call's dcp_save_async */
            CHECK_OK(ctx, dcp_request_wait(prev));
            dcp_request_free(prev);
            prev = NULL;
        }
        if (i % 2 == 0) {
            CHECK_OK(ctx, dcp_request_wait(req));
            dcp_request_free(req);
        } else {
            prev = req; /* left for the next call to complete */
        }
    }
    if (prev) {
        CHECK_OK(ctx, dcp_request_wait(prev));
        dcp_request_free(prev);
    }
    for (i = 0; i < 5; i++) {
        char name[32];
        snprintf(name, sizeof(name), "a%d", i);
        check_load(ctx, sub(name), 20 + i);
    }
    dcp_ctx_free(ctx);
}

/* The same path saved twice (the second cached): fresh tag, old files
 * gone, the new checkpoint loads. */
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

static void test_overwrite(void)
{
    dcp_ctx *ctx = new_ctx();
    int n1 = 0;
    CHECK_OK(ctx, save_step(ctx, 30, sub("o"), V_BASE, &nosync));
    if (mt_rank == 0)
        n1 = count_files(sub("o"));
    CHECK_OK(ctx, save_step(ctx, 31, sub("o"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
    if (mt_rank == 0)
        CHECK(count_files(sub("o")) == n1);
    CHECK(access("/nonexistent", F_OK) != 0);
    check_load(ctx, sub("o"), 31);
    CHECK_OK(ctx, save_step(ctx, 32, sub("o"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
    if (mt_rank == 0)
        CHECK(count_files(sub("o")) == n1);
    check_load(ctx, sub("o"), 32);
    dcp_ctx_free(ctx);
}

/* A failed save between two saves: no cache survives it. */
static void test_fault(void)
{
    dcp_ctx *ctx = new_ctx();
    int rc;
    CHECK_OK(ctx, save_step(ctx, 40, sub("f"), V_BASE, &nosync));
    CHECK_OK(ctx, save_step(ctx, 41, sub("f"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
    if (mt_rank == mt_size - 1)
        (void)dcp__save_write_fail_after(1);
    rc = save_step(ctx, 42, sub("f"), V_BASE, &nosync);
    if (mt_rank == mt_size - 1)
        (void)dcp__save_write_fail_after(0);
    CHECK_RC(ctx, rc, DCP_EIO);
    CHECK(mt_same(rc));
    check_load(ctx, sub("f"), 41);
    CHECK_OK(ctx, save_step(ctx, 43, sub("f"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 0);
    CHECK_OK(ctx, save_step(ctx, 44, sub("f"), V_BASE, &nosync));
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
    check_load(ctx, sub("f"), 44);
    dcp_ctx_free(ctx);
}

/* Repeated loads of one checkpoint and layout reuse the checked
 * .metadata on every rank; a change of the boxes on the last rank only,
 * or a new checkpoint in the path, makes every rank check afresh. */
static void test_load_cache(void)
{
    dcp_ctx *ctx = new_ctx(), *wc = new_ctx();
    struct rs s;
    int rc;
    CHECK_OK(wc, save_step(wc, 50, sub("l"), V_BASE, &nosync));
    check_load(ctx, sub("l"), 50);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 0);
    check_load(ctx, sub("l"), 50);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 1);
    CHECK(mt_same(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD)));
    /* The last rank drops its replica of "b": valid, and not cached. */
    build(&s, 0, V_BOX);
    rc = dcp_load(ctx, s.st, sub("l"), NULL);
    drop(&s);
    CHECK_OK(ctx, rc);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 0);
    CHECK(mt_same(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD)));
    check_load(ctx, sub("l"), 50);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 0);
    check_load(ctx, sub("l"), 50);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 1);
    /* A new checkpoint in the same path (cached save: a new .metadata). */
    CHECK_OK(wc, save_step(wc, 51, sub("l"), V_BASE, &nosync));
    check_load(ctx, sub("l"), 51);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 0);
    check_load(ctx, sub("l"), 51);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 1);
    dcp_ctx_free(wc);
    dcp_ctx_free(ctx);
}

/* ------------------------------------------------ collective calls */

/* The collective calls of a user communicator (mt_usercomm.h), counted:
 * each costs milliseconds through torch.distributed (dcp_torch). */
static int ncoll;

static int n_bcast(void *impl, void *buf, size_t len, int r)
{
    ncoll++;
    return u_bcast(impl, buf, len, r);
}

static int n_gather(void *impl, const void *send, size_t len, void *recv,
                    int r)
{
    ncoll++;
    return u_gather(impl, send, len, recv, r);
}

static int n_gatherv(void *impl, const void *send, size_t len, void *recv,
                     const size_t *lens, const size_t *displs, int r)
{
    ncoll++;
    return u_gatherv(impl, send, len, recv, lens, displs, r);
}

static int n_scatterv(void *impl, const void *send, const size_t *lens,
                      const size_t *displs, void *recv, size_t len, int r)
{
    ncoll++;
    return u_scatterv(impl, send, lens, displs, recv, len, r);
}

static int n_allreduce_min(void *impl, int64_t *v, size_t n)
{
    ncoll++;
    return u_allreduce_min(impl, v, n);
}

static int n_barrier(void *impl)
{
    ncoll++;
    return u_barrier(impl);
}

static dcp_comm *count_comm(void)
{
    static const struct dcp_comm_ops ops = {
        DCP_COMM_OPS_VERSION, n_bcast, n_gather,  n_gatherv,
        n_scatterv,           n_allreduce_min,    n_barrier,
        u_destroy,            u_isend,            u_irecv,
        u_waitany,            u_cancel,           0};
    MPI_Comm *c = malloc(sizeof(*c));
    dcp_comm *out = NULL;
    (void)mt_user_comm; /* its ops are used, counted, not it */
    CHECK(c != NULL);
    MPI_Comm_dup(MPI_COMM_WORLD, c);
    CHECK(dcp_comm_create(&ops, c, mt_rank, mt_size, &out) == DCP_OK);
    return out;
}

/* Collective calls of one load of path with flags, checked. */
static int counted_load(dcp_ctx *ctx, const char *path, unsigned flags,
                        int step)
{
    dcp_load_options lo = {sizeof(dcp_load_options), flags, NULL};
    struct rs s;
    const dcp_value *v;
    int n;
    memset(&s, 0, sizeof(s));
    build(&s, 0, V_BASE);
    ncoll = 0;
    CHECK_OK(ctx, dcp_load(ctx, s.st, path, &lo));
    n = ncoll;
    v = dcp_state_value(s.st, "step");
    CHECK(v && dcp_value_as_int(v) == step);
    CHECK(s.b[NB - 1] == (float)step + 0.5f * (float)(NB - 1));
    drop(&s);
    return n;
}

/* The collective calls a save and a load make, first and with the plan
 * cached (the numbers of 2026-12, upper bounds: fewer is better): a
 * cached load agrees once at the start and once at the end; the
 * read-once exchange adds its point-to-point messages only (not
 * counted). */
static void test_collective_count(void)
{
    dcp_comm *cc = count_comm();
    dcp_ctx *ctx = NULL;
    int first, cached;
    CHECK(dcp_ctx_create(&ctx, cc, NULL) == DCP_OK);
    ncoll = 0;
    CHECK_OK(ctx, save_step(ctx, 60, sub("n"), V_BASE, &nosync));
    first = ncoll;
    ncoll = 0;
    CHECK_OK(ctx, save_step(ctx, 61, sub("n"), V_BASE, &nosync));
    cached = ncoll;
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_SAVE) == 1);
    if (mt_size > 1) {
        CHECK(first <= 15);
        CHECK(cached <= 7);
    }
    first = counted_load(ctx, sub("n"), DCP_LOAD_PER_RANK_READS, 61);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 0);
    cached = counted_load(ctx, sub("n"), DCP_LOAD_PER_RANK_READS, 61);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 1);
    if (mt_size > 1) {
        CHECK(first <= 10);
        CHECK(cached <= 2);
    }
    /* Read once ("b" is on every rank: shared), the plan cached too. */
    first = counted_load(ctx, sub("n"), 0, 61);
    cached = counted_load(ctx, sub("n"), 0, 61);
    CHECK(dcp_ctx_plan_cached(ctx, DCP_IO_LOAD) == 1);
    if (mt_size > 1) {
        CHECK(first <= 10);
        CHECK(cached <= 2);
    }
    dcp_ctx_free(ctx);
    dcp_comm_free(cc);
}

int main(int argc, char **argv)
{
    mt_init(&argc, &argv);
    mt_tmpdir(root, sizeof(root), "plancache");
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 2);
    RUN(hit_identical);
    RUN(invalidate);
    RUN(async_loop);
    RUN(overwrite);
    RUN(fault);
    RUN(load_cache);
    RUN(collective_count);
    dcp_comm_free(comm);
    if (mt_rank == 0) {
        static const char *dirs[] = {"h1", "h2", "h3", "h3c", "h4", "h5", "h6",
                                     "i0", "i1", "i2", "i3",  "i4", "a0", "a1",
                                     "a2", "a3", "a4", "o",   "f",  "l"};
        size_t i;
        for (i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
            rm_dir(sub(dirs[i]));
        (void)rmdir(root);
    }
    return mt_finish();
}
