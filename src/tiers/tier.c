/*
 * The tier stack (dcp_tier.h): tier 0 node-local, tier 1 any storage,
 * drained in the background.
 *
 * Design. A tier-0 step is one dcp_save through a context of our own whose
 * storage back end (t0fs.c) maps the virtual path "@tier0/step-N" onto the
 * node directories: each rank writes its data file into its own node's
 * "<tier0_dir>/step-N", rank 0 commits `.metadata` into its node's; then
 * rank 0 broadcasts the bytes and every other node's lowest rank publishes
 * them into its node's directory, so that every node directory of the step
 * is committed on its own. The drain copies, on one thread per rank, the
 * data files that rank wrote (named "__<rank>_..." by the save) from its
 * node's directory into "<tier1_root>/step-N" through the storage layer
 * (the user context's back end: POSIX, S3, a test's); rank 0 holds that
 * directory's one-writer lock from the start of the drain and publishes
 * the same `.metadata` bytes last, in the collective call that finds every
 * rank's thread done (drain_finish). The thread does file I/O only; every
 * communicator call is on the caller's thread.
 *
 * The restore (t0read.c) treats tier 0 as node-local: t0fs opens files in
 * the rank's own node's directory only; the listing of steps and the
 * files a node lacks travel over the communicator before dcp_load.
 *
 * State: `struct drain` is the drain in flight (at most one); its thread
 * writes rc, err and done (release) and nothing else; the caller's thread
 * reads them after seeing done (acquire) or after pthread_join. The result
 * of the last finished drain waits in last_* until dcp_tier_drain_test or
 * _wait reports it.
 */
#include "tier.h"

#include <dirent.h> /* opendir, fdopendir: the node's step directories */
#include <errno.h>
#include <fcntl.h> /* open, O_NOFOLLOW */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "ctx.h"
#include "lock.h"
#include "manager.h"
#include "meta.h"
#include "replica.h"
#include "storage.h"
#include "t0fs.h"
#include "t0read.h"
#include "util.h"

#define VROOT       "@tier0"
#define PREFIX      "step-"
#define DEFAULT_BUF (8u << 20)

static dcp__tier_hook_fn hook_fn;
static void *hook_arg;
static size_t replica_piece = (size_t)4 << 20;

void dcp__tier_set_replica_hook(dcp__tier_hook_fn fn, void *arg)
{
    dcp__replica_set_hook(fn, arg);
}

void dcp__tier_set_replica_piece(size_t bytes)
{
    replica_piece = bytes ? bytes : (size_t)4 << 20;
}

void dcp__tier_set_drain_hook(dcp__tier_hook_fn fn, void *arg)
{
    hook_fn = fn;
    hook_arg = arg;
}

/* The drain's phase points (tier.h): the hook told, its result ignored. */
static void phase(int rank, const char *name)
{
    if (hook_fn)
        (void)hook_fn(rank, name, 0, hook_arg);
}

struct drain {
    int active; /* a thread runs or ran and is not joined yet */
    pthread_t th;
    atomic_int done;
    atomic_int cancel;
    int64_t step;
    int rank;
    int nosync;
    uint64_t bw, bufsz;
    const struct dcp__storage *t1s;
    int rc; /* the thread's result */
    struct dcp_err err;
    char **files; /* this rank's data files */
    size_t nfiles;
    struct dcp_metadata *md;
    uint8_t *meta; /* the step's .metadata bytes */
    size_t metalen;
    char *src; /* own node's tier-0 step directory */
    char *dst; /* tier-1 step directory */
    int dirfd; /* rank 0: dst, open while the lock is held; -1 */
    struct dcp__lock lk;
    /* Tier-0 retention, run by each node's lowest rank's thread after its
     * copies: keep0 steps kept in root (its own node's), through pctx. */
    uint32_t keep0;
    int64_t keep_repl; /* the newest step agreed replicated (-1), kept */
    const char *root;
    dcp_ctx *pctx;
    /* Rank 0: the tier-1 retention left by the last commit (keep1 steps
     * kept in t1), run by its thread after its copies. */
    int prune1;
    uint32_t keep1;
    const char *t1;
};

struct dcp_tier {
    dcp_ctx *ctx; /* borrowed */
    dcp_ctx *c0;  /* tier 0's, owned */
    dcp_ctx *cp;  /* the drain thread's (no communicator), owned */
    int rank, size;
    dcp_tier_options o;
    dcp_save_options so;
    char *t1;
    char *root0; /* rank 0's node root */
    int leader;  /* lowest rank of its node */
    struct dcp__t0fs fs;
    struct dcp__nodes nd; /* the nodes and their replica partners */
    struct dcp__storage t1s;
    struct drain d;
    /* tier0_async: the tier-0 save in flight (staged, not committed). */
    dcp_request *req;
    int pending;
    int64_t pend_step;
    /* The replication in flight (begun after a tier-0 commit, ended at the
     * next collective call of the stack): NULL when none. */
    struct dcp__repl *repl;
    int64_t repl_step;
    int64_t replicated; /* newest step agreed replicated; -1: none */
    int prune1;   /* rank 0: a tier-1 retention is due (drain_finish) */
    int has_last; /* a finished drain not yet reported */
    int last_rc;
    struct dcp_err last_err;
    int64_t last_step;
};

static void step_name(char *buf, size_t cap, int64_t step)
{
    snprintf(buf, cap, PREFIX "%" PRId64, step);
}

static int agree(dcp_tier *t, int rc)
{
    return dcp__comm_agree_err(t->ctx->comm, rc, &t->ctx->err);
}

/* A failure on c (dcp_save, dcp_load, the manager's removal) onto the
 * user's context. */
/* c's failure as t's, the virtual tier-0 root of its paths ("@tier0/")
 * replaced by this node's tier-0 directory, which the user knows. */
static int from_ctx(dcp_tier *t, dcp_ctx *c, int rc)
{
    char msg[DCP_ERRMSG_MAX];
    const char *m, *v;
    size_t o = 0, vl = strlen(VROOT "/");
    if (rc == DCP_OK || c == t->ctx)
        return rc;
    if (!t->fs.roots || !t->fs.roots[0]) {
        dcp__err(&t->ctx->err, rc, "%s", dcp_errmsg(c));
        return rc;
    }
    for (m = dcp_errmsg(c); (v = strstr(m, VROOT "/")) && o < sizeof msg;
         m = v + vl) {
        int k = snprintf(msg + o, sizeof msg - o, "%.*s%s/", (int)(v - m), m,
                         t->fs.roots[0]);
        o += k > 0 ? (size_t)k : 0;
    }
    if (o < sizeof msg)
        (void)snprintf(msg + o, sizeof msg - o, "%s", m);
    dcp__err(&t->ctx->err, rc, "%s", msg);
    return rc;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------------- */
/* Creation                                                               */
/* ---------------------------------------------------------------------- */

static int take_opts(dcp_tier *t, const dcp_tier_options *opts,
                     struct dcp_err *err)
{
    if (!opts || opts->struct_size < offsetof(dcp_tier_options, keep_last0))
        return dcp__err(err, DCP_EINVAL, "dcp_tier_create: no options");
    size_t n =
        opts->struct_size < sizeof t->o ? opts->struct_size : sizeof t->o;
    memcpy(&t->o, opts, n);
    t->o.struct_size = sizeof t->o;
    if (!t->o.tier0_dir || !*t->o.tier0_dir || !t->o.tier1_root ||
        !*t->o.tier1_root)
        return dcp__err(err, DCP_EINVAL,
                        "dcp_tier_create: tier0_dir and tier1_root are "
                        "required (rank %d)",
                        t->rank);
    if (dcp__path_is_s3(t->o.tier0_dir) || t->o.tier0_dir[0] == '@')
        return dcp__err(err, DCP_EINVAL,
                        "dcp_tier_create: tier0_dir '%s' is not a local "
                        "directory (rank %d)",
                        t->o.tier0_dir, t->rank);
    if (t->o.busy != DCP_TIER_WAIT && t->o.busy != DCP_TIER_SKIP)
        return dcp__err(err, DCP_EINVAL, "dcp_tier_create: bad busy %d",
                        t->o.busy);
    if (!t->o.drain_buffer_bytes)
        t->o.drain_buffer_bytes = DEFAULT_BUF;
    if (t->o.drain_buffer_bytes < 4096)
        return dcp__err(err, DCP_EINVAL,
                        "dcp_tier_create: drain_buffer_bytes below 4096");
    t->o.drain_buffer_bytes &= ~(uint64_t)4095;
    if (t->o.replicas > 65535)
        return dcp__err(err, DCP_EINVAL,
                        "dcp_tier_create: replicas %u too large (rank %d)",
                        t->o.replicas, t->rank);
    memset(&t->so, 0, sizeof t->so);
    t->so.struct_size = sizeof t->so;
    if (t->o.save_opts) {
        const dcp_save_options *s = t->o.save_opts;
        size_t m =
            s->struct_size < sizeof t->so ? s->struct_size : sizeof t->so;
        memcpy(&t->so, s, m);
        t->so.struct_size = sizeof t->so;
    }
    t->o.save_opts = NULL;
    /* Complete steps, the drain and the replicas go by .metadata. */
    if (t->so.flags & DCP_SAVE_RANK_LOCAL)
        return dcp__err(err, DCP_EINVAL,
                        "dcp_tier_create: DCP_SAVE_RANK_LOCAL in save_opts: "
                        "a tier's complete steps, drain and replicas go by "
                        ".metadata, which a rank-local save does not write "
                        "(rank %d)",
                        t->rank);
    t->t1 = dcp__strdup(t->o.tier1_root);
    if (!t->t1)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    return DCP_OK;
}

/* This rank's replica spec: "<failure domain>[:<p0>,<p1>...]" (replica.h). */
static char *replica_spec(const dcp_tier *t)
{
    size_t cap = 24 + (t->o.partners ? 12 * (size_t)t->o.replicas : 0);
    char *s = dcp__malloc(cap);
    if (!s)
        return NULL;
    size_t n = (size_t)snprintf(s, cap, "%d", t->o.failure_domain);
    for (uint32_t j = 0; t->o.partners && j < t->o.replicas; j++)
        n += (size_t)snprintf(s + n, cap - n, "%c%d", j ? ',' : ':',
                              t->o.partners[j]);
    return s;
}

/* The node roots, own first, from the strings of every rank (dirs). */
static int take_roots(dcp_tier *t, const char *const *dirs, struct dcp_err *err)
{
    const char *mine = t->o.tier0_dir;
    t->fs.roots = dcp__calloc((size_t)t->size + 1, sizeof(char *));
    if (!t->fs.roots || !(t->fs.roots[0] = dcp__strdup(mine)) ||
        !(t->root0 = dcp__strdup(dirs[0])))
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    t->fs.n = 1;
    t->leader = 1;
    for (int r = 0; r < t->size; r++) {
        const char *s = dirs[r];
        if (r < t->rank && strcmp(s, mine) == 0)
            t->leader = 0;
        size_t i = 0;
        while (i < t->fs.n && strcmp(t->fs.roots[i], s) != 0)
            i++;
        if (i == t->fs.n && !(t->fs.roots[t->fs.n++] = dcp__strdup(s)))
            return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    return DCP_OK;
}

/* Every rank's tier0_dir and replica spec on every rank: the node roots,
 * own first, and the node map with its partners (t->nd). Collective; the
 * same result on every rank. */
static int find_nodes(dcp_tier *t, struct dcp_err *err)
{
    const dcp_comm *c = t->ctx->comm;
    const char *mine = t->o.tier0_dir;
    uint8_t *all = NULL, *got = NULL, *blob = NULL;
    size_t *lens = NULL, *displs = NULL, total = 0, glen = 0, dl = strlen(mine);
    const char **dirs = NULL, **specs = NULL;
    char *spec = replica_spec(t);
    int rc = DCP_OK;
    if (spec && (blob = dcp__malloc(dl + strlen(spec) + 2))) {
        memcpy(blob, mine, dl + 1);
        memcpy(blob + dl + 1, spec, strlen(spec) + 1);
    } else {
        rc = dcp__err(err, DCP_ENOMEM, "out of memory (rank %d)", t->rank);
    }
    rc = dcp__comm_agree_err(c, rc, err);
    if (rc == DCP_OK)
        rc = dcp__comm_gather_blob(c, blob, dl + strlen(spec) + 2, 0, &all,
                                   &lens, &displs, err);
    if (rc == DCP_OK && t->rank == 0)
        total = displs[t->size - 1] + lens[t->size - 1];
    if (rc == DCP_OK)
        rc = dcp__comm_bcast_blob(c, all, total, 0, &got, &glen, err);
    const char *p = t->rank == 0 ? (const char *)all : (const char *)got;
    size_t len = t->rank == 0 ? total : glen, off = 0;
    if (rc == DCP_OK) {
        dirs = dcp__calloc((size_t)t->size, sizeof(char *));
        specs = dcp__calloc((size_t)t->size, sizeof(char *));
        if (!dirs || !specs)
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    for (int r = 0; rc == DCP_OK && r < t->size; r++) {
        for (int k = 0; k < 2; k++) {
            const char *z = off < len ? memchr(p + off, 0, len - off) : NULL;
            if (!z) {
                rc = dcp__err(err, DCP_EIO, "tier-0 directories not received");
                break;
            }
            *(k ? &specs[r] : &dirs[r]) = p + off;
            off = (size_t)(z - p) + 1;
        }
    }
    if (rc == DCP_OK)
        rc = take_roots(t, dirs, err);
    rc = dcp__comm_agree_err(c, rc, err);
    if (rc == DCP_OK)
        rc = dcp__nodes_plan(&t->nd, dirs, specs, t->size, t->o.replicas, err);
    if (rc == DCP_OK && dcp__nodes_replicating(&t->nd) && !dcp__comm_has_p2p(c))
        rc = dcp__err(err, DCP_ENOTSUP,
                      "dcp_tier_create: replicas need a communicator with "
                      "point-to-point operations (dcp_comm.h version 2)");
    dcp__free((void *)dirs);
    dcp__free((void *)specs);
    dcp__free(spec);
    dcp__free(blob);
    dcp__free(all);
    dcp__free(got);
    dcp__free(lens);
    dcp__free(displs);
    return rc;
}

static void tier_release(dcp_tier *t)
{
    if (t->c0)
        dcp_ctx_free(t->c0);
    if (t->cp)
        dcp_ctx_free(t->cp);
    for (size_t i = 0; t->fs.roots && t->fs.roots[i]; i++)
        dcp__free(t->fs.roots[i]);
    dcp__free(t->fs.roots);
    dcp__nodes_release(&t->nd);
    dcp__free(t->root0);
    dcp__free(t->t1);
    dcp__free(t);
}

/* Options all ranks must share, as one string. */
static int same_opts(dcp_tier *t)
{
    char s[512];
    snprintf(s, sizeof s, "%s|%u|%u|%d|%" PRIu64 "|%" PRIu64 "|%d|%u|%u", t->t1,
             t->o.keep_last0, t->o.keep_last1, t->o.busy,
             t->o.drain_bytes_per_sec, t->o.drain_buffer_bytes, t->so.no_fsync,
             t->so.flags, t->o.replicas);
    return dcp__comm_same_string(t->ctx->comm, s, "tier1_root and tier options",
                                 &t->ctx->err);
}

int dcp_tier_create(dcp_tier **out, dcp_ctx *ctx, const dcp_tier_options *opts)
{
    if (!out)
        return DCP_EINVAL;
    *out = NULL;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    struct dcp_err *err = &ctx->err;
    int rc = DCP_OK;
    dcp_tier *t = dcp__calloc(1, sizeof *t);
    if (!t)
        rc = dcp__err(err, DCP_ENOMEM, "out of memory (rank %d)", ctx->rank);
    if (t) {
        t->ctx = ctx;
        t->rank = ctx->rank;
        t->size = ctx->size;
        t->d.dirfd = -1;
        t->d.lk.dirfd = -1;
        t->replicated = -1;
        t->t1s = ctx->storage;
        t->fs.vroot = VROOT;
        rc = take_opts(t, opts, err);
    }
    rc = dcp__comm_agree_err(ctx->comm, rc, err);
    if (rc == DCP_OK)
        rc = same_opts(t);
    if (rc == DCP_OK)
        rc = find_nodes(t, err);
    if (rc == DCP_OK) {
        dcp__storage_use(NULL);
        if (t->leader)
            rc = dcp__fs_mkdirs(t->fs.roots[0], err);
        if (rc == DCP_OK)
            rc = dcp_ctx_create(&t->c0, ctx->comm, t->o.ctx_opts);
        if (rc == DCP_OK)
            rc = dcp_ctx_set_storage(t->c0, &dcp__t0fs_ops, &t->fs);
        if (rc == DCP_OK)
            rc = dcp_ctx_create(&t->cp, NULL, NULL);
        if (rc != DCP_OK && !err->code)
            dcp__err(err, rc, "cannot make the tier-0 context (rank %d)",
                     t->rank);
        rc = agree(t, rc);
    }
    if (rc == DCP_OK) {
        if (t->rank == 0) {
            dcp__storage_use(&t->t1s);
            rc = dcp__fs_mkdirs(t->t1, err);
        }
        rc = dcp__comm_share_err(ctx->comm, rc, err, 0);
    }
    if (rc != DCP_OK) {
        if (t)
            tier_release(t);
        return rc;
    }
    t->o.ctx_opts = NULL; /* used during creation only */
    t->o.partners = NULL;
    *out = t;
    return DCP_OK;
}

/* ---------------------------------------------------------------------- */
/* The drain                                                              */
/* ---------------------------------------------------------------------- */

static int read_full(int fd, uint8_t *p, size_t n, uint64_t off)
{
    while (n) {
        ssize_t k = pread(fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return k < 0 ? errno : EIO;
        p += k;
        n -= (size_t)k;
        off += (uint64_t)k;
    }
    return 0;
}

/* Sleeps until moved bytes fit the bandwidth limit since t0. */
static void throttle(const struct drain *d, double t0, uint64_t moved)
{
    if (!d->bw)
        return;
    double due = t0 + (double)moved / (double)d->bw;
    double now = now_s();
    if (due <= now)
        return;
    double w = due - now;
    struct timespec ts = {(time_t)w, (long)((w - (double)(time_t)w) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int copy_file(struct drain *d, int dirfd, const char *name, uint8_t *buf,
                     double t0, uint64_t *moved)
{
    struct dcp_err *err = &d->err;
    char *src = dcp__t0_join(d->src, name);
    if (!src)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    int fd = open(src, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat sb;
    int rc = DCP_OK;
    if (fd < 0 || fstat(fd, &sb) != 0)
        rc = dcp__err(err, errno == ENOENT ? DCP_ENOENT : DCP_EIO,
                      "drain of step %" PRId64 ": cannot open tier-0 file "
                      "'%s' (rank %d): %s",
                      d->step, src, d->rank, strerror(errno));
    int out = -1;
    if (rc == DCP_OK)
        rc = dcp__fs_write_begin(dirfd, name, &out, err);
    uint64_t size = rc == DCP_OK ? (uint64_t)sb.st_size : 0;
    for (uint64_t off = 0; rc == DCP_OK && off < size;) {
        size_t n = (size_t)(size - off < d->bufsz ? size - off : d->bufsz);
        if (atomic_load(&d->cancel)) {
            rc = dcp__err(err, DCP_EPEER,
                          "drain of step %" PRId64 " cancelled (rank %d)",
                          d->step, d->rank);
            break;
        }
        if (hook_fn) {
            int h = hook_fn(d->rank, name, off, hook_arg);
            if (h) {
                rc = dcp__err(err, h,
                              "drain of step %" PRId64 ": cannot "
                              "copy '%s' to '%s' (rank %d): injected fault",
                              d->step, name, d->dst, d->rank);
                break;
            }
        }
        int e = read_full(fd, buf, n, off);
        if (e) {
            rc = dcp__err(err, DCP_EIO,
                          "drain of step %" PRId64 ": cannot "
                          "read '%s' (rank %d): %s",
                          d->step, src, d->rank, strerror(e));
            break;
        }
        rc = dcp__fs_pwrite(out, buf, n, off, name, err);
        off += n;
        *moved += n;
        throttle(d, t0, *moved);
    }
    if (out >= 0) {
        if (rc == DCP_OK)
            rc = dcp__fs_write_complete(out, name,
                                        d->nosync ? DCP_WRITE_NOSYNC : 0, err);
        else
            dcp__fs_write_abort(dirfd, out, name);
    }
    if (fd >= 0)
        close(fd);
    dcp__free(src);
    return rc;
}

/* Retention of a tier root (a node's tier-0 root, or tier 1's), keep
 * steps, never protect (the step being drained) nor also (-1: none; in
 * tier 0, the newest step agreed replicated, while a newer step's
 * replication may still be in flight: after a node loss it is the newest
 * step the restore finds whole); through pctx (the manager's removal:
 * POSIX, or the S3 back end for an s3:// root); pctx's message copied
 * into err. */
static int prune0(dcp_ctx *pctx, const char *root, uint32_t keep,
                  int64_t protect, int64_t also, struct dcp_err *err)
{
    int64_t pr[2] = {protect, also};
    dcp__ctx_begin(pctx);
    int rc = dcp__mgr_prune(pctx, root, PREFIX, "", keep, 0, pr, 2, NULL);
    if (rc != DCP_OK)
        dcp__err(err, rc, "retention in '%s': %s", root, dcp_errmsg(pctx));
    return rc;
}

static void *drain_main(void *arg)
{
    struct drain *d = arg;
    dcp__storage_use(d->t1s);
    int dirfd = -1, rc = DCP_OK;
    uint64_t moved = 0;
    double t0 = now_s();
    uint8_t *buf = dcp__malloc_aligned(4096, (size_t)d->bufsz);
    if (!buf)
        rc = dcp__err(&d->err, DCP_ENOMEM, "drain: out of memory (rank %d)",
                      d->rank);
    if (rc == DCP_OK && d->nfiles)
        rc = dcp__fs_open_dir(d->dst, &dirfd, &d->err);
    for (size_t i = 0; rc == DCP_OK && i < d->nfiles; i++)
        rc = copy_file(d, dirfd, d->files[i], buf, t0, &moved);
    if (dirfd >= 0)
        dcp__fs_release(dirfd);
    dcp__free(buf);
    dcp__storage_use(NULL);
    if (rc == DCP_OK && d->keep0) {
        phase(d->rank, ".prune0");
        rc = prune0(d->pctx, d->root, d->keep0, d->step, d->keep_repl, &d->err);
    }
    if (rc == DCP_OK && d->prune1) {
        phase(d->rank, ".prune1");
        rc = prune0(d->pctx, d->t1, d->keep1, d->step, -1, &d->err);
    }
    d->rc = rc;
    atomic_store_explicit(&d->done, 1, memory_order_release);
    return NULL;
}

static void drain_clear(struct drain *d)
{
    for (size_t i = 0; i < d->nfiles; i++)
        dcp__free(d->files[i]);
    dcp__free(d->files);
    dcp__meta_free(d->md);
    dcp__free(d->meta);
    dcp__free(d->src);
    dcp__free(d->dst);
    d->files = NULL;
    d->nfiles = 0;
    d->md = NULL;
    d->meta = NULL;
    d->src = d->dst = NULL;
    d->active = 0;
}

/* Rank 0's end of a drain: the lock released, the directory closed. */
static void drain_unlock(struct drain *d)
{
    dcp__lock_release(&d->lk);
    d->lk.dirfd = -1;
    if (d->dirfd >= 0)
        dcp__fs_release(d->dirfd);
    d->dirfd = -1;
}

/* Rank 0: every data file of the step in tier 1, then .metadata. */
static int drain_commit(dcp_tier *t, struct dcp_err *err)
{
    struct drain *d = &t->d;
    dcp__storage_use(&t->t1s);
    for (size_t i = 0; i < d->md->nfiles; i++)
        if (!dcp__fs_exists(d->dirfd, d->md->files[i]))
            return dcp__err(err, DCP_EIO,
                            "drain of step %" PRId64 ": data file '%s' "
                            "missing in '%s'",
                            d->step, d->md->files[i], d->dst);
    if (hook_fn) {
        int h = hook_fn(t->rank, ".metadata", 0, hook_arg);
        if (h)
            return dcp__err(err, h,
                            "drain of step %" PRId64 ": cannot publish "
                            "'.metadata' in '%s': injected fault",
                            d->step, d->dst);
    }
    int vis = 0;
    int rc = dcp__fs_publish(d->dirfd, d->dst, ".metadata", d->meta, d->metalen,
                             d->nosync ? DCP_PUBLISH_NOSYNC : 0, &vis, err);
    if (rc == DCP_OK)
        phase(t->rank, ".committed");
    return rc;
}

static void keep_result(dcp_tier *t, int rc, const struct dcp_err *e,
                        int64_t step);

/* Completes the drain in flight: joins, agrees, commits on rank 0, tier-1
 * retention; the result goes to last_*. Collective. */
static void drain_finish(dcp_tier *t, int now)
{
    struct drain *d = &t->d;
    if (d->active) {
        pthread_join(d->th, NULL);
        struct dcp_err e = d->err;
        int rc = dcp__comm_agree_err(t->ctx->comm, d->rc, &e);
        if (t->rank == 0) {
            if (rc != DCP_OK && d->prune1)
                t->prune1 = 1; /* not done: still due */
            if (rc == DCP_OK)
                rc = drain_commit(t, &e);
            drain_unlock(d);
            if (rc == DCP_OK && t->o.keep_last1)
                t->prune1 = 1;
        }
        rc = dcp__comm_share_err(t->ctx->comm, rc, &e, 0);
        keep_result(t, rc, &e, d->step);
        drain_clear(d);
    }
    if (now) {
        /* The tier-1 retention due, here (a wait, restore or free); on a
         * save's path the next drain's thread runs it instead. */
        struct dcp_err e = {0};
        int rc = DCP_OK;
        if (t->rank == 0 && t->prune1) {
            t->prune1 = 0;
            phase(t->rank, ".prune1");
            rc = prune0(t->cp, t->t1, t->o.keep_last1, -1, -1, &e);
        }
        rc = dcp__comm_share_err(t->ctx->comm, rc, &e, 0);
        if (rc != DCP_OK)
            keep_result(t, rc, &e, t->last_step);
    }
}

/* Whether the drain in flight still runs on some rank. Collective. */
static int drain_busy(dcp_tier *t, int *busy)
{
    int64_t v = atomic_load_explicit(&t->d.done, memory_order_acquire);
    int rc = dcp__comm_allreduce_min(t->ctx->comm, &v, 1, &t->ctx->err);
    *busy = v == 0;
    return rc;
}

/* The files of md this rank wrote: "__<rank>_...". */
static int own_files(struct drain *d, struct dcp_err *err)
{
    char pre[32];
    snprintf(pre, sizeof pre, "__%d_", d->rank);
    d->files = dcp__calloc(d->md->nfiles + 1, sizeof(char *));
    if (!d->files)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (size_t i = 0; i < d->md->nfiles; i++) {
        if (strncmp(d->md->files[i], pre, strlen(pre)) != 0)
            continue;
        if (!(d->files[d->nfiles] = dcp__strdup(d->md->files[i])))
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        d->nfiles++;
    }
    return DCP_OK;
}

/* Rank 0: the tier-1 step directory made, opened and locked; *have = 1
 * when it already holds a committed .metadata (nothing to drain). */
static int drain_lock(dcp_tier *t, int *have, struct dcp_err *err)
{
    struct drain *d = &t->d;
    dcp__storage_use(&t->t1s);
    DCP_RETURN_IF(dcp__fs_mkdirs(d->dst, err));
    DCP_RETURN_IF(dcp__fs_open_dir(d->dst, &d->dirfd, err));
    *have = dcp__fs_exists(d->dirfd, ".metadata");
    if (*have)
        return DCP_OK;
    const char *tok =
        d->md->save_id && *d->md->save_id ? d->md->save_id : "dcp-tier-drain";
    return dcp__lock_acquire(d->dirfd, d->dst, tok, 0, &d->lk, err);
}

/* Starts the drain of step (its .metadata bytes in d->meta). Collective. */
static int drain_start(dcp_tier *t, int64_t step, int *nodrain)
{
    struct drain *d = &t->d;
    struct dcp_err *err = &t->ctx->err;
    char name[40];
    step_name(name, sizeof name, step);
    *nodrain = 0;
    d->step = step;
    d->rank = t->rank;
    d->nosync = t->so.no_fsync;
    d->bw = t->o.drain_bytes_per_sec;
    d->bufsz = t->o.drain_buffer_bytes;
    d->t1s = &t->t1s;
    d->keep0 = t->leader ? t->o.keep_last0 : 0;
    d->keep_repl = t->replicated;
    d->prune1 = t->prune1;
    d->keep1 = t->o.keep_last1;
    d->t1 = t->t1;
    d->root = t->fs.roots[0];
    d->pctx = t->cp;
    d->rc = DCP_OK;
    memset(&d->err, 0, sizeof d->err);
    atomic_store(&d->done, 0);
    atomic_store(&d->cancel, 0);
    int rc = dcp__meta_decode(d->meta, d->metalen, &d->md, err);
    if (rc == DCP_OK && (!(d->src = dcp__t0_join(t->fs.roots[0], name)) ||
                         !(d->dst = dcp__t0_join(t->t1, name))))
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = own_files(d, err);
    if (rc == DCP_OK)
        phase(t->rank, ".start");
    rc = agree(t, rc);
    int64_t have = 0;
    if (rc == DCP_OK) {
        int h = 0;
        if (t->rank == 0)
            rc = drain_lock(t, &h, err);
        have = h;
        rc = dcp__comm_share_err(t->ctx->comm, rc, err, 0);
    }
    if (rc == DCP_OK)
        rc = dcp__comm_bcast(t->ctx->comm, &have, sizeof have, 0, err);
    if (rc == DCP_OK && !have) {
        int e = pthread_create(&d->th, NULL, drain_main, d);
        if (e)
            rc = dcp__err(err, DCP_ENOMEM,
                          "cannot start the drain thread (rank %d): %s",
                          t->rank, strerror(e));
        else
            d->active = 1;
        rc = agree(t, rc);
        if (d->active)
            t->prune1 = 0; /* the thread runs it (or drain_finish keeps it
                              due) */
        if (rc != DCP_OK && d->active) {
            atomic_store(&d->cancel, 1);
            pthread_join(d->th, NULL);
            t->prune1 = d->prune1; /* maybe not done: still due */
        }
    }
    if (rc != DCP_OK || have) {
        if (t->rank == 0)
            drain_unlock(d);
        drain_clear(d);
        *nodrain = rc == DCP_OK;
    }
    if (rc == DCP_OK && have) {
        /* No thread: the tier-0 retention here. */
        if (d->keep0)
            rc = prune0(t->cp, d->root, d->keep0, step, d->keep_repl,
                        &t->ctx->err);
        rc = agree(t, rc);
    }
    return rc;
}

/* ---------------------------------------------------------------------- */
/* Save                                                                   */
/* ---------------------------------------------------------------------- */

/* Rank 0: the .metadata bytes of its node's step directory. */
static int read_meta(dcp_tier *t, const char *dir, struct dcp_err *err)
{
    int fd = -1;
    dcp__storage_use(NULL);
    int rc = dcp__fs_open_dir(dir, &fd, err);
    if (rc == DCP_OK)
        rc = dcp__fs_read_all(fd, ".metadata", t->ctx->max_metadata_bytes,
                              &t->d.meta, &t->d.metalen, err);
    if (fd >= 0)
        dcp__fs_release(fd);
    return rc;
}

/* The committed step's .metadata into every node's directory. */
static int spread_meta(dcp_tier *t, const char *own)
{
    struct dcp_err *err = &t->ctx->err;
    int rc = DCP_OK;
    if (t->rank == 0)
        rc = read_meta(t, own, err);
    rc = dcp__comm_share_err(t->ctx->comm, rc, err, 0);
    if (rc != DCP_OK)
        return rc;
    uint8_t *got = NULL;
    size_t glen = 0;
    rc = dcp__comm_bcast_blob(t->ctx->comm, t->d.meta, t->d.metalen, 0, &got,
                              &glen, err);
    if (rc != DCP_OK)
        return rc;
    if (t->rank != 0) {
        t->d.meta = got;
        t->d.metalen = glen;
    }
    if (t->leader && strcmp(t->fs.roots[0], t->root0) != 0) {
        int fd = -1, vis = 0;
        dcp__storage_use(NULL);
        rc = dcp__fs_open_dir(own, &fd, err);
        if (rc == DCP_OK)
            rc = dcp__fs_publish(fd, own, ".metadata", t->d.meta, t->d.metalen,
                                 t->so.no_fsync ? DCP_PUBLISH_NOSYNC : 0, &vis,
                                 err);
        if (fd >= 0)
            dcp__fs_release(fd);
        if (rc != DCP_OK)
            dcp__err_prefix(err, "tier 0 of rank %d's node: ", t->rank);
    }
    return agree(t, rc);
}

/* The step's data files to the partner nodes (replica.c): begun here,
 * ended by repl_end at the next collective call. Collective. */
static int replicate(dcp_tier *t, const char *own, int64_t step)
{
    struct dcp_metadata *md = NULL;
    int rc = dcp__meta_decode(t->d.meta, t->d.metalen, &md, &t->ctx->err);
    rc = agree(t, rc);
    if (rc != DCP_OK) {
        dcp__meta_free(md);
        return rc;
    }
    dcp__storage_use(NULL);
    rc = dcp__repl_begin(&t->repl, t->ctx->comm, &t->nd, t->rank, own, md,
                         replica_piece, t->so.no_fsync, &t->ctx->err);
    if (rc == DCP_OK)
        t->repl_step = step;
    return rc;
}

/* The replication in flight, if any, to its end: every replica landed and
 * renamed, agreed (then the step counts as replicated), or its failure,
 * the same on every rank. Collective. */
static int repl_end(dcp_tier *t)
{
    if (!t->repl)
        return DCP_OK;
    struct dcp__repl *r = t->repl;
    t->repl = NULL;
    dcp__storage_use(NULL);
    int rc = dcp__repl_end(r, &t->ctx->err);
    if (rc == DCP_OK)
        t->replicated = t->repl_step;
    else
        dcp__err_prefix(&t->ctx->err, "replication of step %" PRId64 ": ",
                        t->repl_step);
    return rc;
}

/* After the tier-0 commit of step: .metadata in every node, then the
 * replicas when asked. (Tier-0 retention runs on the drain thread,
 * prune0.) Collective. */
static int post0(dcp_tier *t, int64_t step)
{
    char name[40];
    step_name(name, sizeof name, step);
    char *own = dcp__t0_join(t->fs.roots[0], name);
    int rc = own ? DCP_OK : dcp__err(&t->ctx->err, DCP_ENOMEM, "out of memory");
    rc = agree(t, rc);
    if (rc == DCP_OK) {
        phase(t->rank, ".spread");
        rc = spread_meta(t, own);
    }
    if (rc == DCP_OK && dcp__nodes_replicating(&t->nd)) {
        phase(t->rank, ".replicate");
        rc = replicate(t, own, step);
    }
    dcp__free(own);
    if (rc != DCP_OK) {
        dcp__free(t->d.meta);
        t->d.meta = NULL;
    }
    return rc;
}

/*
 * The temporaries a killed peer replication or restore copy left in this
 * node's step directories ("<data file>.<pid>-<n>-<hex>.tmp",
 * dcp__leftover_name), removed by the node's leader at the start of a
 * save, once the replication in flight ended (repl_end) and before the
 * next one begins. None of this stack's is being written then: restore
 * copies run inside their collective call, a replication's temporaries
 * are written between its begin and its end (both on the caller's
 * thread), and the drain thread only reads data files and removes whole
 * steps. Best effort: what stays
 * goes with its step (retention) or with dcp_clean.
 */
static void sweep_tmp(const dcp_tier *t)
{
    DIR *d = opendir(t->fs.roots[0]);
    struct dirent *de;
    if (!d)
        return;
    while ((de = readdir(d)) != NULL) {
        int fd;
        DIR *s;
        struct dirent *fe;
        if (strncmp(de->d_name, PREFIX, strlen(PREFIX)) != 0)
            continue;
        fd = openat(dirfd(d), de->d_name,
                    O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;
        s = fdopendir(fd);
        if (!s) {
            close(fd);
            continue;
        }
        while ((fe = readdir(s)) != NULL) {
            size_t n = strlen(fe->d_name);
            if (n > 4 && !strcmp(fe->d_name + n - 4, ".tmp") &&
                strstr(fe->d_name, ".distcp.") &&
                dcp__leftover_name(fe->d_name))
                (void)unlinkat(dirfd(s), fe->d_name, 0);
        }
        closedir(s);
    }
    closedir(d);
}

/* One step into tier 0: synchronous (committed, post0 done) or, with
 * tier0_async, staged (t->req pending). */
static int save0(dcp_tier *t, const dcp_state *st, int64_t step)
{
    char name[40], vpath[64];
    step_name(name, sizeof name, step);
    snprintf(vpath, sizeof vpath, VROOT "/%s", name);
    struct dcp_err *err = &t->ctx->err;
    char *own = dcp__t0_join(t->fs.roots[0], name);
    int rc = own ? DCP_OK : dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK) {
        dcp__storage_use(NULL);
        rc = dcp__fs_mkdirs(own, err);
    }
    dcp__free(own);
    rc = agree(t, rc);
    if (rc != DCP_OK)
        return rc;
    if (t->o.tier0_async) {
        rc = from_ctx(t, t->c0,
                      dcp_save_async(t->c0, st, vpath, &t->so, &t->req));
        if (rc == DCP_OK) {
            t->pending = 1;
            t->pend_step = step;
        }
        return rc;
    }
    rc = from_ctx(t, t->c0, dcp_save(t->c0, st, vpath, &t->so));
    if (rc == DCP_OK)
        rc = post0(t, step);
    return rc;
}

/* A failure to report once (dcp_tier_drain_test/_wait); an earlier one
 * not yet reported is kept. */
static void keep_result(dcp_tier *t, int rc, const struct dcp_err *e,
                        int64_t step)
{
    if (t->has_last && t->last_rc != DCP_OK)
        return;
    t->has_last = 1;
    t->last_rc = rc;
    t->last_err = *e;
    t->last_step = step;
}

/* Completes the asynchronous tier-0 save in flight, if any: its commit,
 * post0, and its drain started. No drain may be in flight. A failure is
 * returned and kept for dcp_tier_drain_test/_wait. Collective. */
static int complete0(dcp_tier *t)
{
    if (!t->pending)
        return DCP_OK;
    t->pending = 0;
    int64_t step = t->pend_step;
    int rc = dcp_request_wait(t->req);
    if (rc != DCP_OK)
        dcp__err(&t->ctx->err, rc, "%s", dcp_request_errmsg(t->req));
    dcp_request_free(t->req);
    t->req = NULL;
    if (rc == DCP_OK)
        rc = post0(t, step);
    int nodrain = 0;
    if (rc == DCP_OK)
        rc = drain_start(t, step, &nodrain);
    if (rc != DCP_OK)
        keep_result(t, rc, &t->ctx->err, step);
    return rc;
}

/* Everything in flight completed: the replication, the drain, a pending
 * tier-0 save, its replication and its drain (each replication ended
 * while its step's drain thread still copies: the two overlap). A
 * failure is kept for dcp_tier_drain_test/_wait. Collective. */
static void settle(dcp_tier *t)
{
    int rc = repl_end(t);
    if (rc != DCP_OK)
        keep_result(t, rc, &t->ctx->err, t->repl_step);
    drain_finish(t, 0);
    complete0(t);
    rc = repl_end(t);
    if (rc != DCP_OK)
        keep_result(t, rc, &t->ctx->err, t->repl_step);
    drain_finish(t, 1);
}

int dcp_tier_save(dcp_tier *t, const dcp_state *state, int64_t step,
                  int *outcome)
{
    if (!t)
        return DCP_EINVAL;
    dcp__ctx_begin(t->ctx);
    int oc = DCP_TIER_SAVED;
    if (outcome)
        *outcome = oc;
    int rc = DCP_OK;
    if (!state || step < 0)
        rc = dcp__err(&t->ctx->err, DCP_EINVAL, "dcp_tier_save: %s (rank %d)",
                      state ? "negative step" : "NULL state", t->rank);
    rc = agree(t, rc);
    int64_t v[2] = {step, -step};
    if (rc == DCP_OK)
        rc = dcp__comm_allreduce_min(t->ctx->comm, v, 2, &t->ctx->err);
    if (rc == DCP_OK && v[0] != -v[1])
        rc = dcp__err(&t->ctx->err, DCP_EINVAL,
                      "dcp_tier_save: not every rank passed the same step");
    /* The previous step's replication, if still in flight, ends here; its
     * failure is this call's (nothing new is saved). */
    if (rc == DCP_OK)
        rc = repl_end(t);
    if (rc == DCP_OK && t->leader)
        sweep_tmp(t);
    if (rc == DCP_OK && t->d.active) {
        int busy = 0;
        rc = drain_busy(t, &busy);
        if (rc == DCP_OK && busy && t->o.busy == DCP_TIER_SKIP) {
            if (outcome)
                *outcome = DCP_TIER_SKIPPED;
            return DCP_OK;
        }
        if (busy)
            oc = DCP_TIER_WAITED;
        if (rc == DCP_OK)
            drain_finish(t, 0);
    }
    if (rc == DCP_OK && t->pending) {
        rc = complete0(t);
        if (rc != DCP_OK)
            t->has_last = 0; /* reported here */
    }
    if (rc == DCP_OK)
        rc = save0(t, state, step);
    int nodrain = 0;
    if (rc == DCP_OK && !t->o.tier0_async)
        rc = drain_start(t, step, &nodrain);
    if (rc == DCP_OK && nodrain)
        oc = DCP_TIER_SAVED_NO_DRAIN;
    if (outcome)
        *outcome = oc;
    return rc;
}

/* ---------------------------------------------------------------------- */
/* Drain results                                                          */
/* ---------------------------------------------------------------------- */

/* rc, a failure complete0 kept, reported now. */
static int report_failed(dcp_tier *t, int rc)
{
    if (rc != DCP_OK)
        t->has_last = 0;
    return rc;
}

static int report(dcp_tier *t)
{
    if (!t->has_last)
        return DCP_OK;
    t->has_last = 0;
    if (t->last_rc != DCP_OK)
        t->ctx->err = t->last_err;
    return t->last_rc;
}

int dcp_tier_drain_test(dcp_tier *t, int *done)
{
    if (!t || !done)
        return DCP_EINVAL;
    dcp__ctx_begin(t->ctx);
    *done = 1;
    int rc = repl_end(t);
    if (rc != DCP_OK) {
        *done = !t->d.active && !t->pending;
        return rc;
    }
    if (t->d.active) {
        int busy = 0;
        DCP_RETURN_IF(drain_busy(t, &busy));
        if (busy) {
            *done = 0;
            return DCP_OK;
        }
        drain_finish(t, 1);
    }
    if (t->pending) {
        DCP_RETURN_IF(report_failed(t, complete0(t)));
        if (t->d.active) {
            *done = 0;
            return DCP_OK;
        }
    }
    return report(t);
}

int dcp_tier_drain_wait(dcp_tier *t, int64_t *step)
{
    if (!t)
        return DCP_EINVAL;
    dcp__ctx_begin(t->ctx);
    settle(t);
    if (step)
        *step = t->has_last ? t->last_step : -1;
    return report(t);
}

int dcp_tier_replicated(const dcp_tier *t, int64_t *step)
{
    if (!t || !step)
        return DCP_EINVAL;
    *step = t->replicated;
    return DCP_OK;
}

void dcp_tier_free(dcp_tier *t)
{
    if (!t)
        return;
    settle(t);
    drain_clear(&t->d);
    tier_release(t);
}

/* ---------------------------------------------------------------------- */
/* Restore                                                                */
/* ---------------------------------------------------------------------- */

/* Rank 0: the newest complete tier-1 step (-1: none). */
static void t1_newest(dcp_tier *t, int64_t *out)
{
    dcp_manager_entry *e = NULL;
    size_t ne = 0;
    *out = -1;
    if (dcp__mgr_list(t->ctx, t->t1, PREFIX, "", 1, &e, &ne) != DCP_OK)
        return;
    for (size_t i = ne; i-- > 0;)
        if (e[i].status == DCP_MANAGER_COMPLETE) {
            *out = e[i].step;
            break;
        }
    dcp_manager_list_free(e, ne);
}

static int load1(dcp_tier *t, dcp_state *st, const dcp_load_options *opts,
                 int64_t step)
{
    char name[40];
    step_name(name, sizeof name, step);
    char *p = dcp__t0_join(t->t1, name);
    int rc = p ? DCP_OK : dcp__err(&t->ctx->err, DCP_ENOMEM, "out of memory");
    rc = agree(t, rc);
    if (rc == DCP_OK)
        rc = dcp_load(t->ctx, st, p, opts);
    dcp__free(p);
    return rc;
}

static uint64_t fetched_bytes, exchanged_bytes;

uint64_t dcp__tier_fetched_bytes(void)
{
    return fetched_bytes;
}

uint64_t dcp__tier_exchanged_bytes(void)
{
    return exchanged_bytes;
}

/*
 * The options of the tier-0 load: opts with DCP_LOAD_PER_RANK_READS added
 * (into *lo) unless the caller asked for DCP_LOAD_READ_ONCE. After the
 * copies every node holds every file its ranks read, so a rank reads a
 * chunk it shares with another rank from its own node's tier 0; read once
 * (dcp_load's default) would have one rank read it and forward it to the
 * others over the communicator, across the network a second time for
 * bytes the copies just brought (on the cluster of docs/CLUSTER.md, 4
 * nodes, 64 MiB resharded onto 3: the load took 0.22 s after copies of
 * 0.17 s; reading per rank, 0.02-0.05 s).
 * opts too short to hold flags: passed as they are (dcp_load judges them).
 */
static const dcp_load_options *local_reads(const dcp_load_options *opts,
                                           dcp_load_options *lo)
{
    if (opts && opts->struct_size < offsetof(dcp_load_options, flags) +
                                        sizeof opts->flags)
        return opts;
    size_t n = opts && opts->struct_size < sizeof *lo ? opts->struct_size
                                                      : sizeof *lo;
    memset(lo, 0, sizeof *lo);
    if (opts)
        memcpy(lo, opts, n);
    lo->struct_size = (uint32_t)n;
    if (!(lo->flags & DCP_LOAD_READ_ONCE))
        lo->flags |= DCP_LOAD_PER_RANK_READS;
    return lo;
}

/* The tier-0 load of step (the decision pk): the files the node lacks
 * copied from the nodes holding them, then dcp_load on local files, each
 * rank reading its own (local_reads). Collective. */
static int load0(dcp_tier *t, const struct dcp__t0in *in,
                 const struct dcp__t0pick *pk, dcp_state *st,
                 const dcp_load_options *opts, int64_t step)
{
    uint64_t got = 0;
    dcp_load_options lo;
    int rc = dcp__t0_fetch(in, pk, step, st, opts, &got, &t->ctx->err);
    fetched_bytes += got;
    if (rc == DCP_OK) {
        char vpath[64];
        snprintf(vpath, sizeof vpath, VROOT "/" PREFIX "%" PRId64, step);
        rc = from_ctx(t, t->c0,
                      dcp_load(t->c0, st, vpath, local_reads(opts, &lo)));
        dcp_phase_report pr;
        memset(&pr, 0, sizeof pr);
        pr.struct_size = sizeof pr;
        if (dcp_ctx_phase_report(t->c0, DCP_IO_LOAD, &pr) == DCP_OK)
            exchanged_bytes += pr.bytes[DCP_PHASE_EXCHANGE];
    }
    return rc;
}

int dcp_tier_restore(dcp_tier *t, dcp_state *state,
                     const dcp_load_options *opts, int64_t *step, int *tier)
{
    if (!t)
        return DCP_EINVAL;
    if (step)
        *step = -1;
    if (tier)
        *tier = -1;
    settle(t);
    dcp__ctx_begin(t->ctx);
    int rc = state ? DCP_OK
                   : dcp__err(&t->ctx->err, DCP_EINVAL,
                              "dcp_tier_restore: NULL state");
    rc = agree(t, rc);
    if (rc != DCP_OK)
        return rc;
    /* v: tier-0 step, tier-1 step. Tier 1's is listed first (rank 0), so
     * that tier 0 looks only at steps at least as new. */
    int64_t v[2] = {-1, -1};
    struct dcp__t0in in;
    struct dcp__t0pick pk;
    memset(&in, 0, sizeof in);
    in.c = t->ctx->comm;
    in.nd = &t->nd;
    in.rank = t->rank;
    in.leader = t->leader;
    in.root = t->fs.roots[0];
    in.lctx = t->c0;
    in.max_meta = t->ctx->max_metadata_bytes;
    in.piece = replica_piece;
    in.nosync = t->so.no_fsync;
    if (t->rank == 0)
        t1_newest(t, &v[1]);
    rc = dcp__t0_decide(&in, v[1], &pk, &t->ctx->err);
    if (rc != DCP_OK)
        return rc;
    if (t->rank == 0) {
        v[0] = pk.step;
        dcp__err_clear(&t->ctx->err); /* unreadable node directories */
        if (v[0] < 0 && v[1] < 0)
            rc = dcp__err(&t->ctx->err, DCP_ENOENT,
                          "no complete step on tier 0 (%d node "
                          "directories%s) nor on tier 1 '%s'",
                          t->nd.nnodes, pk.miss, t->t1);
    }
    rc = dcp__comm_share_err(t->ctx->comm, rc, &t->ctx->err, 0);
    if (rc == DCP_OK)
        rc = dcp__comm_bcast(t->ctx->comm, v, sizeof v, 0, &t->ctx->err);
    if (rc != DCP_OK) {
        dcp__t0pick_release(&pk);
        return rc;
    }
    int64_t got = -1;
    int from = -1;
    if (v[0] >= 0 && v[0] >= v[1]) {
        rc = load0(t, &in, &pk, state, opts, v[0]);
        got = v[0];
        from = 0;
        if (rc != DCP_OK && v[1] >= 0) {
            rc = load1(t, state, opts, v[1]);
            got = v[1];
            from = 1;
        }
    } else {
        rc = load1(t, state, opts, v[1]);
        got = v[1];
        from = 1;
    }
    dcp__t0pick_release(&pk);
    if (rc == DCP_OK) {
        if (step)
            *step = got;
        if (tier)
            *tier = from;
    }
    return rc;
}
