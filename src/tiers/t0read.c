/*
 * The tier-0 side of a restore with node-local directories (t0read.h).
 * A rank opens files in its own node's tier-0 directory only (t0fs.c);
 * what it needs from another node travels over the communicator.
 *
 * The decision (dcp__t0_decide). Each node's lowest rank lists its own
 * node's complete steps ("step-N" holding a `.metadata` that decodes) and
 * every file in them with its size, as text lines ("S <step>", then
 * "F <size> <name>"), gathered on rank 0. Rank 0 takes the steps newest
 * first (none below floor, tier 1's newest: tier 0 wins a tie only); for
 * each it broadcasts the step and the lowest rank of the first node
 * holding its `.metadata`, which sends the bytes to rank 0 (a gather in
 * which only that rank has bytes); rank 0 decodes them and checks that
 * each data file named is held by some node; the first step that passes
 * is the decision, with, per file, the first node holding it (the server)
 * and its size. A broadcast of step -1 ends the rounds; there are as many
 * rounds as steps looked at, at most the steps tier 0 keeps.
 *
 * The copies (dcp__t0_fetch). Every rank gets the `.metadata` bytes; each
 * node's lowest rank makes the step directory (a replacement node has
 * none) and publishes `.metadata` in it; each rank marks the data files
 * its state reads (the chunks overlapping its boxes, the values' files;
 * every file with a load planner or stateful entries, whose keys are
 * known only inside dcp_load); the marks are gathered on rank 0, which
 * plans one whole-file copy per (node, file) that some rank of the node
 * needs and the node lacks: from a rank of the serving node (its ranks
 * taken in turn) to the first rank of the node needing it. The plan is
 * broadcast and run by replica.c's machinery (dcp__transfer: nonblocking
 * pieces on the caller's thread, a deadlock-free order, temporaries
 * renamed once every rank agreed). The load that follows reads local
 * files only. The copies stay: they are whole, committed files of the
 * step, so a node that received them holds them as replicas (the lost
 * node's data is copied again to where it is needed).
 *
 * Cost: a node receives whole files, even when its ranks need a part of
 * one (the resharded case); no node receives a file no rank of it reads.
 */
#include "t0read.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manager.h"
#include "meta.h"
#include "reshard.h"
#include "state.h"
#include "storage.h"
#include "t0fs.h"

#define PREFIX "step-"

void dcp__t0pick_release(struct dcp__t0pick *pk)
{
    dcp__free(pk->meta);
    dcp__free(pk->held);
    dcp__free(pk->server);
    dcp__free(pk->size);
    memset(pk, 0, sizeof *pk);
    pk->step = -1;
}

/* ------------------------------------------------------------ listing */

struct sbuf {
    char *p;
    size_t n, cap;
    int oom;
};

static void sb_add(struct sbuf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void sb_add(struct sbuf *b, const char *fmt, ...)
{
    char tmp[DCP_STORAGE_NAME_MAX + 64];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (b->oom)
        return;
    if (k < 0 || (size_t)k >= sizeof tmp) { /* never drop an entry silently */
        b->oom = 1;
        return;
    }
    if (b->n + (size_t)k + 1 > b->cap) {
        size_t nc = b->cap ? 2 * b->cap : 4096;
        while (nc < b->n + (size_t)k + 1)
            nc *= 2;
        char *np = dcp__realloc(b->p, nc);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, tmp, (size_t)k);
    b->n += (size_t)k;
}

/* The files of one step directory of the own node into b; a directory
 * that cannot be read adds nothing. */
static void list_step(const struct dcp__t0in *in, int64_t step,
                      struct sbuf *b)
{
    char name[40];
    snprintf(name, sizeof name, PREFIX "%" PRId64, step);
    char *dir = dcp__t0_join(in->root, name);
    int fd = -1;
    struct dcp_err e = {0};
    size_t max = 1024, n = 0;
    dcp_storage_entry *ent = NULL;
    if (!dir) {
        b->oom = 1;
        return;
    }
    dcp__storage_use(NULL);
    if (dcp__fs_open_dir(dir, &fd, &e) != DCP_OK)
        goto out;
    for (;;) {
        ent = dcp__calloc(max, sizeof *ent);
        if (!ent) {
            b->oom = 1;
            goto out;
        }
        int rc = dcp__fs_list(fd, "", max, ent, &n, &e);
        if (rc == DCP_OK)
            break;
        dcp__free(ent);
        ent = NULL;
        if (rc != DCP_ELIMIT || max >= ((size_t)1 << 22))
            goto out;
        max *= 4;
    }
    sb_add(b, "S %" PRId64 "\n", step);
    for (size_t i = 0; i < n; i++)
        if (!strpbrk(ent[i].name, " \n"))
            sb_add(b, "F %" PRIu64 " %s\n", ent[i].size, ent[i].name);
out:
    dcp__free(ent);
    if (fd >= 0)
        dcp__fs_release(fd);
    dcp__free(dir);
}

/* A node's lowest rank: its steps and their files, as text: the complete
 * ones and those without `.metadata` (a node whose ranks wrote their files
 * but that had not received the step's `.metadata` when the job died
 * holds data files of a step complete on another node). */
static int list_own(const struct dcp__t0in *in, struct sbuf *b,
                    struct dcp_err *err)
{
    dcp_manager_entry *e = NULL;
    size_t ne = 0;
    if (dcp__mgr_list(in->lctx, in->root, PREFIX, "", 0, &e, &ne) == DCP_OK)
        for (size_t i = 0; i < ne; i++)
            if (e[i].status == DCP_MANAGER_COMPLETE ||
                e[i].status == DCP_MANAGER_INCOMPLETE)
                list_step(in, e[i].step, b);
    dcp_manager_list_free(e, ne);
    if (b->oom)
        return dcp__err(err, DCP_ENOMEM, "out of memory (rank %d)", in->rank);
    return DCP_OK;
}

/* One file of a node's listing (rank 0). */
struct ent {
    int64_t step;
    int node;
    uint64_t size;
    const char *name; /* into the gathered buffer */
};

struct table {
    struct ent *e;
    size_t n;
    int64_t *steps; /* distinct, newest first */
    size_t nsteps;
};

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Rank 0: the gathered listings parsed (lines cut in place). */
static int parse(const struct dcp__t0in *in, uint8_t *all, const size_t *lens,
                 const size_t *displs, struct table *tb, struct dcp_err *err)
{
    size_t cap = 0;
    for (int r = 0; r < in->nd->size; r++)
        for (size_t k = 0; k < lens[r]; k++)
            cap += all[displs[r] + k] == '\n';
    tb->e = dcp__calloc(cap ? cap : 1, sizeof *tb->e);
    tb->steps = dcp__calloc(cap ? cap : 1, sizeof *tb->steps);
    if (!tb->e || !tb->steps)
        return dcp__err(err, DCP_ENOMEM, "out of memory (rank 0)");
    for (int r = 0; r < in->nd->size; r++) {
        char *p = (char *)all + displs[r], *end = p + lens[r];
        int64_t step = -1;
        while (p < end) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            if (!nl)
                break;
            *nl = 0;
            char *q = NULL;
            if (p[0] == 'S' && p[1] == ' ') {
                step = strtoll(p + 2, NULL, 10);
                tb->steps[tb->nsteps++] = step;
            } else if (p[0] == 'F' && p[1] == ' ' && step >= 0) {
                uint64_t sz = strtoull(p + 2, &q, 10);
                if (q && *q == ' ') {
                    struct ent *x = &tb->e[tb->n++];
                    x->step = step;
                    x->node = in->nd->node_of[r];
                    x->size = sz;
                    x->name = q + 1;
                }
            }
            p = nl + 1;
        }
    }
    if (tb->nsteps)
        qsort(tb->steps, tb->nsteps, sizeof *tb->steps, cmp_desc);
    size_t u = 0;
    for (size_t i = 0; i < tb->nsteps; i++)
        if (!u || tb->steps[u - 1] != tb->steps[i])
            tb->steps[u++] = tb->steps[i];
    tb->nsteps = u;
    return DCP_OK;
}

/* ----------------------------------------------------------- decision */

struct fidx {
    const char *name;
    size_t i;
};

static int cmp_fidx(const void *a, const void *b)
{
    return strcmp(((const struct fidx *)a)->name,
                  ((const struct fidx *)b)->name);
}

/* Rank 0: whether every data file of md (step s) is held by some node;
 * when so, pk is filled (held, server, size). */
static int check(const struct dcp__t0in *in, const struct table *tb,
                 int64_t s, const struct dcp_metadata *md,
                 struct dcp__t0pick *pk, int *ok, struct dcp_err *err)
{
    size_t nf = md->nfiles, nn = (size_t)in->nd->nnodes;
    struct fidx *fx = dcp__calloc(nf ? nf : 1, sizeof *fx);
    uint8_t *held = dcp__calloc(nn * (nf ? nf : 1), 1);
    int *server = dcp__calloc(nf ? nf : 1, sizeof(int));
    uint64_t *size = dcp__calloc(nf ? nf : 1, sizeof(uint64_t));
    *ok = 0;
    if (!fx || !held || !server || !size) {
        dcp__free(fx);
        dcp__free(held);
        dcp__free(server);
        dcp__free(size);
        return dcp__err(err, DCP_ENOMEM, "out of memory (rank 0)");
    }
    for (size_t i = 0; i < nf; i++) {
        fx[i].name = md->files[i];
        fx[i].i = i;
        server[i] = -1;
    }
    qsort(fx, nf, sizeof *fx, cmp_fidx);
    for (size_t k = 0; k < tb->n; k++) {
        const struct ent *x = &tb->e[k];
        if (x->step != s)
            continue;
        struct fidx key = {x->name, 0};
        const struct fidx *f = nf ? bsearch(&key, fx, nf, sizeof *fx,
                                            cmp_fidx)
                                  : NULL;
        if (!f)
            continue;
        held[(size_t)x->node * nf + f->i] = 1;
        if (server[f->i] < 0 || x->node < server[f->i]) {
            server[f->i] = x->node;
            size[f->i] = x->size;
        }
    }
    *ok = 1;
    for (size_t i = 0; *ok && i < nf; i++) {
        if (server[i] >= 0)
            continue;
        *ok = 0;
        if (!pk->miss[0])
            snprintf(pk->miss, sizeof pk->miss,
                     "; step %" PRId64 " lacks '%s' on every node", s,
                     md->files[i]);
    }
    dcp__free(fx);
    if (*ok) {
        pk->held = held;
        pk->server = server;
        pk->size = size;
        pk->nfiles = nf;
        pk->nnodes = (int)nn;
    } else {
        dcp__free(held);
        dcp__free(server);
        dcp__free(size);
    }
    return DCP_OK;
}

/* Rank 0: the next round's step (the next one some node holds the
 * .metadata of) and the rank sending its .metadata. */
static void next_round(const struct dcp__t0in *in, const struct table *tb,
                       size_t *ci, int64_t floor, int64_t v[2])
{
    v[0] = v[1] = -1;
    while (*ci < tb->nsteps && tb->steps[*ci] >= floor) {
        int64_t s = tb->steps[(*ci)++];
        int node = -1;
        for (size_t k = 0; k < tb->n; k++)
            if (tb->e[k].step == s && strcmp(tb->e[k].name, ".metadata") == 0 &&
                (node < 0 || tb->e[k].node < node))
                node = tb->e[k].node;
        if (node < 0)
            continue; /* no node holds its .metadata: not complete */
        v[0] = s;
        v[1] = in->nd->members[in->nd->first[node]];
        return;
    }
}

/* The own node's .metadata of step s (empty when unreadable). */
static void read_meta(const struct dcp__t0in *in, int64_t s, uint8_t **buf,
                      size_t *len)
{
    char name[40];
    snprintf(name, sizeof name, PREFIX "%" PRId64, s);
    char *dir = dcp__t0_join(in->root, name);
    struct dcp_err e = {0};
    int fd = -1;
    *buf = NULL;
    *len = 0;
    dcp__storage_use(NULL);
    if (dir && dcp__fs_open_dir(dir, &fd, &e) == DCP_OK &&
        dcp__fs_read_all(fd, ".metadata", in->max_meta, buf, len, &e) !=
            DCP_OK) {
        *buf = NULL;
        *len = 0;
    }
    if (fd >= 0)
        dcp__fs_release(fd);
    dcp__free(dir);
}

/* The rounds: one step looked at per round, until one passes. */
static int rounds(const struct dcp__t0in *in, const struct table *tb,
                  int64_t floor, struct dcp__t0pick *pk, struct dcp_err *err)
{
    size_t ci = 0;
    int done = 0, rc = DCP_OK;
    for (;;) {
        int64_t v[2] = {-1, -1};
        if (in->rank == 0 && !done)
            next_round(in, tb, &ci, floor, v);
        rc = dcp__comm_bcast(in->c, v, sizeof v, 0, err);
        if (rc != DCP_OK || v[0] < 0)
            break;
        uint8_t *mine = NULL, *all = NULL;
        size_t mlen = 0, *lens = NULL, *displs = NULL;
        if (in->rank == (int)v[1])
            read_meta(in, v[0], &mine, &mlen);
        rc = dcp__comm_gather_blob(in->c, mine, mlen, 0, &all, &lens, &displs,
                                   err);
        dcp__free(mine);
        int rc0 = DCP_OK;
        if (rc == DCP_OK && in->rank == 0) {
            struct dcp_metadata *md = NULL;
            struct dcp_err e = {0};
            const uint8_t *p = all + displs[(size_t)v[1]];
            size_t n = lens[(size_t)v[1]];
            int ok = 0;
            if (n && dcp__meta_decode(p, n, &md, &e) == DCP_OK)
                rc0 = check(in, tb, v[0], md, pk, &ok, err);
            if (rc0 == DCP_OK && ok) {
                pk->meta = dcp__malloc(n);
                if (pk->meta) {
                    memcpy(pk->meta, p, n);
                    pk->metalen = n;
                    pk->step = v[0];
                } else {
                    rc0 = dcp__err(err, DCP_ENOMEM, "out of memory (rank 0)");
                }
                done = 1;
            }
            dcp__meta_free(md);
        }
        dcp__free(all);
        dcp__free(lens);
        dcp__free(displs);
        if (rc == DCP_OK)
            rc = dcp__comm_share_err(in->c, rc0, err, 0);
        if (rc != DCP_OK)
            break;
    }
    return rc;
}

int dcp__t0_decide(const struct dcp__t0in *in, int64_t floor,
                   struct dcp__t0pick *pk, struct dcp_err *err)
{
    struct sbuf b;
    struct table tb;
    uint8_t *all = NULL;
    size_t *lens = NULL, *displs = NULL;
    memset(&b, 0, sizeof b);
    memset(&tb, 0, sizeof tb);
    memset(pk, 0, sizeof *pk);
    pk->step = -1;
    int rc = in->leader ? list_own(in, &b, err) : DCP_OK;
    rc = dcp__comm_agree_err(in->c, rc, err);
    if (rc == DCP_OK)
        rc = dcp__comm_gather_blob(in->c, b.p, b.n, 0, &all, &lens, &displs,
                                   err);
    dcp__free(b.p);
    int rc0 = DCP_OK;
    if (rc == DCP_OK && in->rank == 0)
        rc0 = parse(in, all, lens, displs, &tb, err);
    if (rc == DCP_OK)
        rc = dcp__comm_share_err(in->c, rc0, err, 0);
    if (rc == DCP_OK)
        rc = rounds(in, &tb, floor, pk, err);
    dcp__free(tb.e);
    dcp__free(tb.steps);
    dcp__free(all);
    dcp__free(lens);
    dcp__free(displs);
    if (rc != DCP_OK)
        dcp__t0pick_release(pk);
    return rc;
}

/* -------------------------------------------------------------- copies */

/* The data files this rank's load reads, marked in need (md->nfiles). */
static int mark_needs(const dcp_state *st, const dcp_load_options *opts,
                      const struct dcp_metadata *md, uint8_t *need,
                      struct dcp_err *err)
{
    int every = opts &&
                opts->struct_size >= offsetof(dcp_load_options, planner) +
                                         sizeof opts->planner &&
                opts->planner;
    for (size_t i = 0; !every && i < st->n; i++)
        every = st->e[i].is_stateful;
    if (every) {
        memset(need, 1, md->nfiles);
        return DCP_OK;
    }
    for (size_t i = 0; i < st->n; i++) {
        const struct st_entry *se = &st->e[i];
        long ei = dcp__meta_find(md, se->key);
        if (ei < 0)
            continue;
        const struct md_entry *e = &md->e[ei];
        if (!e->is_tensor || !se->is_tensor) {
            if (!e->is_tensor && e->nchunks)
                need[e->chunks[0].file] = 1;
            continue;
        }
        if (e->ndim != se->ndim)
            continue; /* the load fails on the shape */
        uint8_t *mark = dcp__calloc(e->nchunks ? e->nchunks : 1, 1);
        if (!mark)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        for (size_t k = 0; k < se->nboxes; k++)
            if (dcp__box_numel(e->ndim, se->boxes[k].size))
                dcp__meta_overlapping(e, se->boxes[k].off, se->boxes[k].size,
                                      mark);
        for (size_t c = 0; c < e->nchunks; c++)
            if (mark[c])
                need[e->chunks[c].file] = 1;
        dcp__free(mark);
    }
    return DCP_OK;
}

/* Rank 0: the copies (file, src, dst, size quadruples) from the gathered
 * marks (needs of rank r at displs[r], nf bytes each). */
static int plan(const struct dcp__t0in *in, const struct dcp__t0pick *pk,
                const uint8_t *needs, const size_t *lens, const size_t *displs,
                int64_t **out, size_t *nout, struct dcp_err *err)
{
    const struct dcp__nodes *nd = in->nd;
    size_t nf = pk->nfiles, n = 0, cap = 16;
    int64_t *q = dcp__malloc(cap * 4 * sizeof *q);
    int *turn = dcp__calloc((size_t)nd->nnodes, sizeof(int));
    *out = NULL;
    *nout = 0;
    if (!q || !turn) {
        dcp__free(q);
        dcp__free(turn);
        return dcp__err(err, DCP_ENOMEM, "out of memory (rank 0)");
    }
    for (int N = 0; N < nd->nnodes; N++) {
        for (size_t i = 0; i < nf; i++) {
            if (pk->held[(size_t)N * nf + i] || pk->server[i] < 0)
                continue;
            int dst = -1;
            for (int k = 0; dst < 0 && k < nd->count[N]; k++) {
                int r = nd->members[nd->first[N] + k];
                if (lens[r] == nf && needs[displs[r] + i])
                    dst = r;
            }
            if (dst < 0)
                continue;
            if (n == cap) {
                int64_t *nq = dcp__realloc(q, 2 * cap * 4 * sizeof *q);
                if (!nq) {
                    dcp__free(q);
                    dcp__free(turn);
                    return dcp__err(err, DCP_ENOMEM, "out of memory (rank 0)");
                }
                q = nq;
                cap *= 2;
            }
            int S = pk->server[i];
            q[4 * n] = (int64_t)i;
            q[4 * n + 1] = nd->members[nd->first[S] + turn[S]++ % nd->count[S]];
            q[4 * n + 2] = dst;
            q[4 * n + 3] = (int64_t)pk->size[i];
            n++;
        }
    }
    dcp__free(turn);
    *out = q;
    *nout = n;
    return DCP_OK;
}

/* Each node's lowest rank: the step directory made, `.metadata` published
 * in it when absent. */
static int ensure_dir(const struct dcp__t0in *in, const char *dir,
                      const uint8_t *meta, size_t len, struct dcp_err *err)
{
    int fd = -1, vis = 0;
    dcp__storage_use(NULL);
    int rc = dcp__fs_mkdirs(dir, err);
    if (rc == DCP_OK)
        rc = dcp__fs_open_dir(dir, &fd, err);
    if (rc == DCP_OK && !dcp__fs_exists(fd, ".metadata"))
        rc = dcp__fs_publish(fd, dir, ".metadata", meta, len,
                             in->nosync ? DCP_PUBLISH_NOSYNC : 0, &vis, err);
    if (fd >= 0)
        dcp__fs_release(fd);
    if (rc != DCP_OK)
        dcp__err_prefix(err, "tier 0 of rank %d's node: ", in->rank);
    return rc;
}

/* Every rank's marks gathered, the plan made on rank 0 and broadcast:
 * *all (n jobs), this rank's. Collective. */
static int share_plan(const struct dcp__t0in *in, const struct dcp__t0pick *pk,
                      const uint8_t *need, size_t nf, struct dcp__xjob **all,
                      size_t *n, struct dcp_err *err)
{
    uint8_t *needs = NULL, *got = NULL;
    size_t *lens = NULL, *displs = NULL, glen = 0, nq = 0;
    int64_t *q = NULL;
    *all = NULL;
    *n = 0;
    int rc = dcp__comm_gather_blob(in->c, need, nf, 0, &needs, &lens, &displs,
                                   err);
    int rc0 = DCP_OK;
    if (rc == DCP_OK && in->rank == 0)
        rc0 = plan(in, pk, needs, lens, displs, &q, &nq, err);
    if (rc == DCP_OK)
        rc = dcp__comm_share_err(in->c, rc0, err, 0);
    if (rc == DCP_OK)
        rc = dcp__comm_bcast_blob(in->c, q, nq * 4 * sizeof *q, 0, &got, &glen,
                                  err);
    const int64_t *p = in->rank == 0 ? q : (const int64_t *)(void *)got;
    size_t m = in->rank == 0 ? nq : glen / (4 * sizeof *q);
    if (rc == DCP_OK) {
        *all = dcp__calloc(m ? m : 1, sizeof **all);
        if (!*all)
            rc = dcp__err(err, DCP_ENOMEM, "out of memory (rank %d)",
                          in->rank);
    }
    for (size_t k = 0; rc == DCP_OK && k < m; k++) {
        (*all)[k].file = (uint32_t)p[4 * k];
        (*all)[k].src = (int)p[4 * k + 1];
        (*all)[k].dst = (int)p[4 * k + 2];
        (*all)[k].size = (uint64_t)p[4 * k + 3];
        if (p[4 * k] < 0 || (*all)[k].file >= nf || p[4 * k + 1] < 0 ||
            p[4 * k + 1] >= dcp__comm_size(in->c) || p[4 * k + 2] < 0 ||
            p[4 * k + 2] >= dcp__comm_size(in->c) || p[4 * k + 1] == p[4 * k + 2] ||
            p[4 * k + 3] < 0)
            rc = dcp__err(err, DCP_EIO, "bad copy plan received (rank %d)",
                          in->rank);
    }
    rc = dcp__comm_agree_err(in->c, rc, err);
    if (rc == DCP_OK) {
        *n = m;
    } else {
        dcp__free(*all);
        *all = NULL;
    }
    dcp__free(needs);
    dcp__free(lens);
    dcp__free(displs);
    dcp__free(q);
    dcp__free(got);
    return rc;
}

int dcp__t0_fetch(const struct dcp__t0in *in, const struct dcp__t0pick *pk,
                  int64_t step, const dcp_state *st,
                  const dcp_load_options *opts, uint64_t *fetched,
                  struct dcp_err *err)
{
    uint8_t *got = NULL, *need = NULL;
    size_t glen = 0, n = 0;
    struct dcp_metadata *md = NULL;
    struct dcp__xjob *all = NULL;
    char name[40];
    snprintf(name, sizeof name, PREFIX "%" PRId64, step);
    char *dir = dcp__t0_join(in->root, name);
    *fetched = 0;
    int rc = dcp__comm_bcast_blob(in->c, pk->meta, pk->metalen, 0, &got, &glen,
                                  err);
    const uint8_t *meta = in->rank == 0 ? pk->meta : got;
    size_t mlen = in->rank == 0 ? pk->metalen : glen;
    if (rc == DCP_OK)
        rc = dir ? dcp__meta_decode(meta, mlen, &md, err)
                 : dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK && !(need = dcp__calloc(md->nfiles + 1, 1)))
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = mark_needs(st, opts, md, need, err);
    if (rc == DCP_OK && in->leader)
        rc = ensure_dir(in, dir, meta, mlen, err);
    rc = dcp__comm_agree_err(in->c, rc, err);
    if (rc == DCP_OK)
        rc = share_plan(in, pk, need, md->nfiles, &all, &n, err);
    if (rc == DCP_OK && n && !dcp__comm_has_p2p(in->c))
        rc = dcp__err(err, DCP_ENOTSUP,
                      "%zu files must be copied between nodes, and the "
                      "communicator has no point-to-point operations",
                      n);
    if (rc == DCP_OK) {
        dcp__storage_use(NULL);
        rc = dcp__transfer(in->c, in->rank, dir, md, all, n, in->piece,
                           in->nosync, err);
    }
    for (size_t k = 0; rc == DCP_OK && k < n; k++)
        if (all[k].dst == in->rank)
            *fetched += all[k].size;
    if (rc != DCP_OK)
        dcp__err_prefix(err, "tier-0 step %" PRId64 ": ", step);
    dcp__free(all);
    dcp__free(need);
    dcp__meta_free(md);
    dcp__free(got);
    dcp__free(dir);
    return rc;
}
