/*
 * Peer replicas of tier-0 data (dcp_tier.h, options replicas,
 * failure_domain, partners).
 *
 * The node map. Node n is the n-th distinct tier0_dir in rank order (so
 * rank 0's node is node 0). Its partners are given by the user (explicit
 * node indices) or are the next k nodes in ring order n+1, n+2, ... that
 * are not n and not in n's failure domain; fewer when fewer exist.
 *
 * The transfer (dcp__repl_begin, dcp__repl_end), after a step is
 * committed in tier 0. Every
 * rank knows the whole plan without a message: the data files are named
 * in the step's `.metadata` ("__<rank>_..."), their sizes are one
 * allreduce, and file i of the sender s goes to partner node P's rank at
 * s's position in its own node (modulo P's size), for each partner P of
 * s's node. A job is one file between two ranks; jobs are ordered by
 * (file, partner) on every rank, and each rank runs its own jobs in that
 * order, at most WINDOW at a time, each with DEPTH (2) pieces in flight. The
 * globally first unfinished job is always among the running ones of both
 * its ranks, so the exchange cannot deadlock. Messages of one job carry
 * one tag, TAG_BASE + the job's number among the jobs of its pair of
 * ranks (mod TAG_SPAN): the running jobs of a pair have distinct tags,
 * and the pieces of a job match in order (MPI's non-overtaking rule).
 *
 * The same machinery runs any shared list of whole-file transfers
 * (dcp__transfer): the restore's copies of files a node lacks (t0read.c).
 * The plan is a list every rank holds in the same order; each rank's jobs
 * are its entries in that order.
 *
 * A local I/O failure (a read on the sender, a write on the receiver) does
 * not stop the messages: the job goes on sending or receiving and writes
 * nothing, so that no peer waits for a message never sent; the failure is
 * agreed at the end. Receivers write into temporaries ("<name>.<pid>-
 * ...tmp", never read as data files) that are renamed to the files' names
 * only once every rank agreed, so a replica under a data file's name is
 * always whole. A transport failure ends the exchange at once (every
 * pending request cancelled before its buffer is freed).
 *
 * Where the communicator allows it (DCP_COMM_P2P_THREAD, dcp_comm.h), the
 * replication's exchange runs on a thread of its own from the end of
 * dcp__repl_begin: the same pump, blocking, on the thread, while the
 * caller's thread returns and runs whatever it likes (other collectives
 * on the communicator included: the messages travel apart). The thread
 * owns the transfer's state until dcp__repl_end joins it; the end then
 * only agrees and renames. Memory is the same NSLOT pieces. Without the
 * flag the exchange moves only inside the end, as before.
 */
#include "replica.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage.h"

#define TAG_BASE 24576 /* readonce.c uses 1 .. 16385 */
#define TAG_SPAN 8192
#define WINDOW   4
#define DEPTH    2 /* pieces in flight per job */
#define NSLOT    (DEPTH * WINDOW)

static dcp__replica_hook_fn hook_fn;
static void *hook_arg;

void dcp__replica_set_hook(dcp__replica_hook_fn fn, void *arg)
{
    hook_fn = fn;
    hook_arg = arg;
}

/* ------------------------------------------------------------ the nodes */

void dcp__nodes_release(struct dcp__nodes *nd)
{
    dcp__free(nd->node_of);
    dcp__free(nd->first);
    dcp__free(nd->count);
    dcp__free(nd->members);
    dcp__free(nd->kn);
    dcp__free(nd->part);
    memset(nd, 0, sizeof *nd);
}

int dcp__nodes_replicating(const struct dcp__nodes *nd)
{
    for (int n = 0; n < nd->nnodes; n++)
        if (nd->kn[n])
            return 1;
    return 0;
}

/* "<domain>[:<p0>,<p1>...]": the domain, and the partners into p (at most
 * cap; *np of them, -1 when none are given). */
static int parse_spec(const char *s, long *dom, int *p, uint32_t cap, int *np)
{
    char *end;
    *dom = strtol(s, &end, 10);
    *np = -1;
    if (end == s)
        return -1;
    if (!*end)
        return 0;
    if (*end != ':')
        return -1;
    *np = 0;
    s = end + 1;
    while (*s) {
        long v = strtol(s, &end, 10);
        if (end == s || (uint32_t)*np >= cap)
            return -1;
        p[(*np)++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return 0;
}

/* Node n's partners: explicit (checked) or the ring's. */
static int partners_of(struct dcp__nodes *nd, int n, const char *spec,
                       const long *dom, struct dcp_err *err)
{
    int *p = nd->part + (size_t)n * nd->k, np = -1;
    long d;
    if (parse_spec(spec, &d, p, nd->k, &np) != 0)
        return dcp__err(err, DCP_EINVAL,
                        "dcp_tier_create: bad partners of node %d "
                        "(rank %d): more than replicas (%u) or not node "
                        "indices",
                        n, nd->members[nd->first[n]], nd->k);
    if (np >= 0) {
        if ((uint32_t)np != nd->k)
            return dcp__err(err, DCP_EINVAL,
                            "dcp_tier_create: node %d (rank %d) names %d "
                            "partners, replicas is %u",
                            n, nd->members[nd->first[n]], np, nd->k);
        for (int j = 0; j < np; j++) {
            int bad = p[j] < 0 || p[j] >= nd->nnodes || p[j] == n;
            for (int i = 0; i < j; i++)
                bad |= p[i] == p[j];
            if (bad)
                return dcp__err(err, DCP_EINVAL,
                                "dcp_tier_create: partner %d of node %d "
                                "(rank %d) is not another node (of %d) or "
                                "named twice",
                                p[j], n, nd->members[nd->first[n]], nd->nnodes);
        }
        nd->kn[n] = np;
        return DCP_OK;
    }
    int got = 0;
    for (int i = 1; i < nd->nnodes && (uint32_t)got < nd->k; i++) {
        int m = (n + i) % nd->nnodes;
        if (dom[n] > 0 && dom[m] == dom[n])
            continue;
        p[got++] = m;
    }
    nd->kn[n] = got;
    return DCP_OK;
}

int dcp__nodes_plan(struct dcp__nodes *nd, const char *const *dirs,
                    const char *const *specs, int size, uint32_t k,
                    struct dcp_err *err)
{
    int rc = DCP_OK;
    size_t sz = (size_t)size;
    memset(nd, 0, sizeof *nd);
    nd->size = size;
    nd->k = k;
    nd->node_of = dcp__calloc(sz, sizeof(int));
    nd->first = dcp__calloc(sz, sizeof(int));
    nd->count = dcp__calloc(sz, sizeof(int));
    nd->members = dcp__calloc(sz, sizeof(int));
    nd->kn = dcp__calloc(sz, sizeof(int));
    nd->part = dcp__calloc(sz * (k ? k : 1), sizeof(int));
    long *dom = dcp__calloc(sz, sizeof(long));
    int *lead = dcp__calloc(sz, sizeof(int)); /* each node's lowest rank */
    if (!nd->node_of || !nd->first || !nd->count || !nd->members || !nd->kn ||
        !nd->part || !dom || !lead) {
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
        goto out;
    }
    for (int r = 0; r < size; r++) {
        int n = 0;
        while (n < nd->nnodes && strcmp(dirs[lead[n]], dirs[r]) != 0)
            n++;
        if (n == nd->nnodes)
            lead[nd->nnodes++] = r;
        nd->node_of[r] = n;
        nd->count[n]++;
        if (strcmp(specs[r], specs[lead[n]]) != 0) {
            rc = dcp__err(err, DCP_EINVAL,
                          "dcp_tier_create: rank %d passes failure_domain "
                          "or partners differing from rank %d of its node "
                          "'%s'",
                          r, lead[n], dirs[r]);
            goto out;
        }
    }
    for (int n = 1; n < nd->nnodes; n++)
        nd->first[n] = nd->first[n - 1] + nd->count[n - 1];
    for (int n = 0; n < nd->nnodes; n++)
        nd->count[n] = 0;
    for (int r = 0; r < size; r++) {
        int n = nd->node_of[r];
        nd->members[nd->first[n] + nd->count[n]++] = r;
    }
    for (int n = 0; n < nd->nnodes; n++)
        dom[n] = strtol(specs[lead[n]], NULL, 10);
    for (int n = 0; rc == DCP_OK && k && n < nd->nnodes; n++)
        rc = partners_of(nd, n, specs[lead[n]], dom, err);
out:
    dcp__free(dom);
    dcp__free(lead);
    if (rc != DCP_OK)
        dcp__nodes_release(nd);
    return rc;
}

/* ---------------------------------------------------------- the transfer */

struct job {
    size_t file; /* index in md->files */
    int peer, tag, send;
    uint64_t size, posted, done;
    int fd;     /* the source (send) or the temporary (recv); -1 */
    int failed; /* a local I/O failure: messages flow, nothing written */
    int kept;   /* recv: the temporary is complete, awaiting the rename */
    char tmp[DCP_STORAGE_NAME_MAX + 1];
};

struct slot {
    struct job *j;
    uint8_t *buf;
    uint64_t off;
    size_t len;
};

struct xfer {
    const dcp_comm *c;
    const struct dcp_metadata *md;
    int dirfd;
    size_t piece;
    int nosync;
    int rank;
    const char *what; /* "replica", "copy": for messages */
    struct slot sl[NSLOT];
    void *reqs[NSLOT];
    size_t live;
    int local_rc; /* the first local I/O failure, its message in lerr */
    struct dcp_err lerr;
    struct dcp_err *err; /* transport failures */
};

static void local_fail(struct xfer *x, struct job *j, int rc,
                       const struct dcp_err *e)
{
    j->failed = 1;
    if (x->local_rc == DCP_OK) {
        x->local_rc = rc;
        x->lerr = *e;
        dcp__err_prefix(&x->lerr, "%s of '%s' %s rank %d (rank %d): ",
                        x->what, x->md->files[j->file],
                        j->send ? "to" : "from", j->peer, x->rank);
    }
}

/* The rank that wrote file name ("__<rank>_..."), or -1. */
static int owner(const char *name, int size)
{
    if (strncmp(name, "__", 2) != 0)
        return -1;
    char *end;
    long r = strtol(name + 2, &end, 10);
    if (end == name + 2 || *end != '_' || r < 0 || r >= size)
        return -1;
    return (int)r;
}

/* Posts the next piece of j on slot s. */
static int post(struct xfer *x, int s, struct job *j)
{
    struct slot *sl = &x->sl[s];
    if (!sl->buf && !(sl->buf = dcp__calloc(1, x->piece)))
        return dcp__err(x->err, DCP_ENOMEM, "out of memory (rank %d)", x->rank);
    uint64_t left = j->size - j->posted;
    sl->j = j;
    sl->off = j->posted;
    sl->len = (size_t)(left < x->piece ? left : x->piece);
    j->posted += sl->len;
    int rc;
    if (j->send) {
        struct dcp_err e = {0};
        if (!j->failed) {
            int r = dcp__fs_pread(j->fd, sl->buf, sl->len, sl->off,
                                  x->md->files[j->file], &e);
            if (r != DCP_OK)
                local_fail(x, j, r, &e);
        }
        rc = dcp__comm_isend(x->c, sl->buf, sl->len, j->peer, j->tag,
                             &x->reqs[s], x->err);
    } else {
        rc = dcp__comm_irecv(x->c, sl->buf, sl->len, j->peer, j->tag,
                             &x->reqs[s], x->err);
    }
    if (rc == DCP_OK)
        x->live++;
    return rc;
}

static int free_slot(const struct xfer *x)
{
    for (int s = 0; s < NSLOT; s++)
        if (!x->sl[s].j)
            return s;
    return -1; /* cannot happen: WINDOW jobs use at most NSLOT slots */
}

/* The end of j's messages: the source closed, or the temporary synced. */
static void finish(struct xfer *x, struct job *j)
{
    struct dcp_err e = {0};
    if (j->fd >= 0 && j->send) {
        dcp__fs_release(j->fd);
    } else if (j->fd >= 0 && j->failed) {
        dcp__fs_write_abort(x->dirfd, j->fd, j->tmp);
    } else if (j->fd >= 0) {
        int rc = dcp__fs_write_complete(j->fd, j->tmp,
                                        x->nosync ? DCP_WRITE_NOSYNC : 0, &e);
        if (rc != DCP_OK) {
            (void)dcp__fs_unlink(x->dirfd, j->tmp, NULL);
            local_fail(x, j, rc, &e);
        } else {
            j->kept = 1;
        }
    }
    j->fd = -1;
}

/* Opens j's file and posts its first pieces; *running = 1 when messages
 * are pending. */
static int start(struct xfer *x, struct job *j, int *running)
{
    struct dcp_err e = {0};
    const char *name = x->md->files[j->file];
    int rc = DCP_OK;
    *running = 0;
    if (j->failed) {
        /* messages only */
    } else if (j->send) {
        uint64_t sz = 0;
        rc = dcp__fs_open_read(x->dirfd, name, &j->fd, &sz, &e);
        if (rc == DCP_OK && sz != j->size)
            rc = dcp__err(&e, DCP_EIO, "size changed");
    } else {
        rc = dcp__unique_tmp(j->tmp, sizeof j->tmp, name, &e);
        if (rc == DCP_OK)
            rc = dcp__fs_write_begin(x->dirfd, j->tmp, &j->fd, &e);
    }
    if (rc != DCP_OK) {
        j->fd = -1;
        local_fail(x, j, rc, &e);
    }
    if (!j->size) {
        finish(x, j);
        return DCP_OK;
    }
    for (int k = 0; k < DEPTH && j->posted < j->size; k++) {
        rc = post(x, free_slot(x), j);
        if (rc != DCP_OK)
            return rc;
    }
    *running = 1;
    return DCP_OK;
}

/* A piece done: written (recv), the next one posted or the job finished;
 * *ended = 1 when the job has no message left. */
static int piece_done(struct xfer *x, int s, int *ended)
{
    struct slot *sl = &x->sl[s];
    struct job *j = sl->j;
    *ended = 0;
    if (!j->send && !j->failed) {
        struct dcp_err e = {0};
        const char *name = x->md->files[j->file];
        int h = hook_fn ? hook_fn(x->rank, name, sl->off, hook_arg) : 0;
        int r =
            h ? dcp__err(&e, h, "injected fault")
              : dcp__fs_pwrite(j->fd, sl->buf, sl->len, sl->off, j->tmp, &e);
        if (r != DCP_OK)
            local_fail(x, j, r, &e);
    }
    j->done += sl->len;
    sl->j = NULL;
    if (j->posted < j->size)
        return post(x, s, j);
    if (j->done == j->size) {
        finish(x, j);
        *ended = 1;
    }
    return DCP_OK;
}

/* Runs the jobs (in the global order), WINDOW at a time, from *next
 * (the next job to start) and *active (jobs running): to the end (block),
 * or only as far as starting jobs and posting their first pieces goes
 * (!block: no wait; the replication's start, dcp__repl_begin). */
static int pump(struct xfer *x, struct job *jobs, size_t njobs, size_t *next,
                int *active, int block)
{
    int rc = DCP_OK;
    for (;;) {
        while (rc == DCP_OK && *active < WINDOW && *next < njobs) {
            int running = 0;
            rc = start(x, &jobs[(*next)++], &running);
            *active += running;
        }
        if (rc != DCP_OK || !x->live || !block)
            break;
        size_t idx = 0;
        rc = dcp__comm_waitany(x->c, x->reqs, NSLOT, &idx, x->err);
        if (rc != DCP_OK)
            break;
        x->live--;
        int ended = 0;
        rc = piece_done(x, (int)idx, &ended);
        *active -= ended;
    }
    if (rc != DCP_OK) {
        for (int s = 0; s < NSLOT; s++)
            if (x->reqs[s]) {
                dcp__comm_cancel(x->c, x->reqs[s]);
                x->reqs[s] = NULL;
            }
        x->live = 0;
        for (size_t i = 0; i < njobs; i++)
            if (jobs[i].fd >= 0) {
                jobs[i].failed = 1;
                finish(x, &jobs[i]);
            }
    }
    return rc;
}

/* Every transfer of the replication of md (sizes sz, negated, from the
 * allreduce), in the global order (file, partner): counted, and filled
 * into all unless NULL. */
static size_t each_job(const struct dcp_metadata *md,
                       const struct dcp__nodes *nd, struct dcp__xjob *all,
                       const int64_t *sz)
{
    size_t n = 0;
    for (size_t i = 0; i < md->nfiles; i++) {
        int s = owner(md->files[i], nd->size);
        if (s < 0)
            continue;
        int ns = nd->node_of[s];
        int pos = 0;
        while (nd->members[nd->first[ns] + pos] != s)
            pos++;
        for (int p = 0; p < nd->kn[ns]; p++) {
            int P = nd->part[(size_t)ns * nd->k + (size_t)p];
            if (all) {
                all[n].file = (uint32_t)i;
                all[n].src = s;
                all[n].dst = nd->members[nd->first[P] + pos % nd->count[P]];
                all[n].size = (uint64_t)-sz[i];
            }
            n++;
        }
    }
    return n;
}

/* The sizes of md's data files (each from its writer, one allreduce) and
 * every transfer of the replication, in the global order. Collective. */
static int plan_jobs(struct xfer *x, const struct dcp__nodes *nd,
                     struct dcp__xjob **out, size_t *nout)
{
    const struct dcp_metadata *md = x->md;
    size_t nf = md->nfiles, n = each_job(md, nd, NULL, NULL);
    int64_t *sz = dcp__calloc(nf ? nf : 1, sizeof *sz);
    struct dcp__xjob *all = dcp__calloc(n ? n : 1, sizeof *all);
    int rc = DCP_OK;
    if (!sz || !all)
        rc = dcp__err(x->err, DCP_ENOMEM, "out of memory (rank %d)", x->rank);
    rc = dcp__comm_agree_err(x->c, rc, x->err);
    for (size_t i = 0; rc == DCP_OK && i < nf; i++) {
        if (owner(md->files[i], nd->size) != x->rank || x->dirfd < 0)
            continue;
        int fd = -1;
        uint64_t s = 0;
        struct dcp_err e = {0};
        int r = dcp__fs_open_read(x->dirfd, md->files[i], &fd, &s, &e);
        dcp__fs_release(fd);
        if (r != DCP_OK && x->local_rc == DCP_OK) {
            x->local_rc = r;
            x->lerr = e;
            dcp__err_prefix(&x->lerr, "replicas (rank %d): ", x->rank);
        }
        sz[i] = -(int64_t)s;
    }
    if (rc == DCP_OK)
        rc = dcp__comm_allreduce_min(x->c, sz, nf, x->err);
    if (rc == DCP_OK)
        each_job(md, nd, all, sz);
    dcp__free(sz);
    if (rc != DCP_OK) {
        dcp__free(all);
        all = NULL;
        n = 0;
    }
    *out = all;
    *nout = n;
    return rc;
}

/* This rank's jobs of the shared list all, in its order; the tag of a
 * job is its number among the jobs of its pair of ranks (both ranks count
 * the same sequence). */
static int my_jobs(struct xfer *x, const struct dcp__xjob *all, size_t nall,
                   struct job **out, size_t *nout)
{
    int size = dcp__comm_size(x->c);
    int *to = dcp__calloc((size_t)size, sizeof(int));
    int *from = dcp__calloc((size_t)size, sizeof(int));
    size_t n = 0;
    for (size_t i = 0; i < nall; i++)
        n += all[i].src == x->rank || all[i].dst == x->rank;
    struct job *jobs = dcp__calloc(n ? n : 1, sizeof *jobs);
    *out = NULL;
    *nout = 0;
    if (!to || !from || !jobs) {
        dcp__free(to);
        dcp__free(from);
        dcp__free(jobs);
        return dcp__err(x->err, DCP_ENOMEM, "out of memory (rank %d)",
                        x->rank);
    }
    n = 0;
    for (size_t i = 0; i < nall; i++) {
        const struct dcp__xjob *a = &all[i];
        if (a->src != x->rank && a->dst != x->rank)
            continue;
        struct job *j = &jobs[n++];
        int send = a->src == x->rank;
        int *cnt = send ? &to[a->dst] : &from[a->src];
        memset(j, 0, sizeof *j);
        j->file = a->file;
        j->peer = send ? a->dst : a->src;
        j->send = send;
        j->tag = TAG_BASE + (*cnt)++ % TAG_SPAN;
        j->size = a->size;
        j->fd = -1;
    }
    dcp__free(to);
    dcp__free(from);
    *out = jobs;
    *nout = n;
    return DCP_OK;
}

/* After the agreement: the temporaries renamed (ok) or removed. */
static int settle(struct xfer *x, struct job *jobs, size_t n, int ok,
                  const char *stepdir, struct dcp_err *err)
{
    int rc = DCP_OK, any = 0;
    for (size_t i = 0; i < n; i++) {
        struct job *j = &jobs[i];
        if (!j->kept)
            continue;
        if (ok && rc == DCP_OK) {
            const char *name = x->md->files[j->file];
            int h = hook_fn ? hook_fn(x->rank, ".rename", 0, hook_arg) : 0;
            rc =
                h ? dcp__err(err, h, "cannot rename '%s': injected fault", name)
                  : dcp__fs_rename(x->dirfd, j->tmp, name, err);
            any = 1;
        } else {
            (void)dcp__fs_unlink(x->dirfd, j->tmp, NULL);
        }
    }
    if (rc == DCP_OK && any && !x->nosync)
        rc = dcp__fs_fsync_dir(x->dirfd, stepdir, err);
    if (rc != DCP_OK)
        dcp__err_prefix(err, "%ss in '%s' (rank %d): ", x->what, stepdir,
                        x->rank);
    return rc;
}

/* A transfer between its start and its end: x, this rank's jobs, how far
 * they went, and a transport failure met so far. */
struct dcp__repl {
    struct xfer x;
    struct job *jobs;
    size_t n, next;
    int active;
    int rc;
    struct dcp_err perr; /* rc's message, kept until the end */
    char *stepdir;
    struct dcp_metadata *md; /* owned (dcp__repl_begin) or NULL */
    int threaded;            /* th runs the exchange until joined */
    pthread_t th;
    struct dcp_err terr; /* the thread's transport messages */
};

/* The start of the shared list all (x's directory opened, maybe a local
 * failure recorded): this rank's jobs, agreed, the first ones posted, no
 * wait. r->rc: a failure of the start (the end still agrees). Collective. */
static void run_begin(struct dcp__repl *r, const struct dcp__xjob *all,
                      size_t nall)
{
    struct xfer *x = &r->x;
    int rc = my_jobs(x, all, nall, &r->jobs, &r->n);
    rc = dcp__comm_agree_err(x->c, rc, x->err);
    /* After a local failure so far (the step directory, a size): the
     * messages still flow, nothing is read or written. */
    for (size_t i = 0; x->local_rc != DCP_OK && i < r->n; i++)
        r->jobs[i].failed = 1;
    if (rc == DCP_OK)
        rc = pump(x, r->jobs, r->n, &r->next, &r->active, 0);
    r->rc = rc;
    if (rc != DCP_OK)
        r->perr = *x->err;
}

/* The end of r: the exchange to its last piece, the agreement, the
 * renames; everything r holds released (r itself not). Collective. */
static int run_end(struct dcp__repl *r)
{
    struct xfer *x = &r->x;
    int rc = r->rc;
    if (rc != DCP_OK)
        *x->err = r->perr;
    /* Transport failures end the exchange; local ones are agreed on.
     * After a thread (dcp__repl_end joined it) nothing is left to pump. */
    if (rc == DCP_OK)
        rc = pump(x, r->jobs, r->n, &r->next, &r->active, 1);
    if (rc == DCP_OK) {
        rc = x->local_rc;
        if (rc != DCP_OK)
            *x->err = x->lerr;
    }
    rc = dcp__comm_agree_err(x->c, rc, x->err);
    int rc2 = settle(x, r->jobs, r->n, rc == DCP_OK, r->stepdir, x->err);
    if (rc == DCP_OK)
        rc = dcp__comm_agree_err(x->c, rc2, x->err);
    for (int s = 0; s < NSLOT; s++)
        dcp__free(x->sl[s].buf);
    dcp__free(r->jobs);
    r->jobs = NULL;
    dcp__fs_release(x->dirfd);
    x->dirfd = -1;
    return rc;
}

static void xfer_init(struct xfer *x, const dcp_comm *c, int rank,
                      const char *stepdir, const struct dcp_metadata *md,
                      size_t piece, int nosync, const char *what,
                      struct dcp_err *err)
{
    memset(x, 0, sizeof *x);
    x->c = c;
    x->md = md;
    x->piece = piece;
    x->nosync = nosync;
    x->rank = rank;
    x->err = err;
    x->what = what;
    x->dirfd = -1;
    int rc = dcp__fs_open_dir(stepdir, &x->dirfd, &x->lerr);
    if (rc != DCP_OK) {
        x->local_rc = rc;
        dcp__err_prefix(&x->lerr, "%ss (rank %d): ", what, rank);
    }
}

/* The background exchange: every job of r to its last piece. */
static void *repl_main(void *arg)
{
    struct dcp__repl *r = arg;
    dcp__storage_use(NULL); /* tier 0 is POSIX */
    int rc = pump(&r->x, r->jobs, r->n, &r->next, &r->active, 1);
    if (rc != DCP_OK) {
        r->rc = rc;
        r->perr = r->terr;
    }
    return NULL;
}

int dcp__repl_begin(struct dcp__repl **out, const dcp_comm *c,
                    const struct dcp__nodes *nd, int rank, const char *stepdir,
                    struct dcp_metadata *md, size_t piece, int nosync,
                    struct dcp_err *err)
{
    struct dcp__repl *r = dcp__calloc(1, sizeof *r);
    char *dir = dcp__strdup(stepdir);
    int rc = r && dir
                 ? DCP_OK
                 : dcp__err(err, DCP_ENOMEM, "out of memory (rank %d)", rank);
    rc = dcp__comm_agree_err(c, rc, err);
    *out = NULL;
    if (rc != DCP_OK) {
        dcp__free(r);
        dcp__free(dir);
        dcp__meta_free(md);
        return rc;
    }
    r->stepdir = dir;
    r->md = md;
    xfer_init(&r->x, c, rank, stepdir, md, piece, nosync, "replica", err);
    struct dcp__xjob *all = NULL;
    size_t n = 0;
    rc = plan_jobs(&r->x, nd, &all, &n);
    if (rc == DCP_OK)
        run_begin(r, all, n);
    dcp__free(all);
    if (rc != DCP_OK) {
        /* The plan failed alike everywhere (agreed), nothing posted. */
        dcp__fs_release(r->x.dirfd);
        dcp__meta_free(md);
        dcp__free(dir);
        dcp__free(r);
        return rc;
    }
    /* The rest of the exchange on a thread, where the communicator lets
     * one run its point-to-point messages (a failed start: inline, at the
     * end, as without). */
    if (r->rc == DCP_OK && dcp__comm_p2p_thread(c) &&
        (r->next < r->n || r->x.live)) {
        r->x.err = &r->terr;
        if (pthread_create(&r->th, NULL, repl_main, r) == 0)
            r->threaded = 1;
        else
            r->x.err = err;
    }
    *out = r;
    return DCP_OK;
}

int dcp__repl_end(struct dcp__repl *r, struct dcp_err *err)
{
    if (!r)
        return DCP_OK;
    if (r->threaded)
        pthread_join(r->th, NULL);
    r->threaded = 0;
    r->x.err = err;
    int rc = run_end(r);
    dcp__meta_free(r->md);
    dcp__free(r->stepdir);
    dcp__free(r);
    return rc;
}

int dcp__transfer(const dcp_comm *c, int rank, const char *stepdir,
                  const struct dcp_metadata *md, const struct dcp__xjob *all,
                  size_t n, size_t piece, int nosync, struct dcp_err *err)
{
    struct dcp__repl r;
    memset(&r, 0, sizeof r);
    r.stepdir = (char *)(uintptr_t)stepdir;
    xfer_init(&r.x, c, rank, stepdir, md, piece, nosync, "copy", err);
    run_begin(&r, all, n);
    return run_end(&r);
}
