/*
 * The read-once load (readonce.h): the plan every rank computes alike from
 * the gathered marks, and the exchange, an event loop over nonblocking
 * point-to-point messages in which every rank is reader and receiver.
 */
#include "readonce.h"

#include <stdlib.h> /* qsort */
#include <string.h>

#include "comm.h"
#include "dtype.h"
#include "reshard.h"

#define RO_PIECE     ((size_t)4 << 20)     /* bytes per data message */
#define RO_HELD      ((uint64_t)64 << 20)  /* staging held by sends, receives */
#define RO_MARKS_MAX ((uint64_t)256 << 20) /* ranks x chunks */
#define RO_HDRS      64                    /* header receives posted at once */
#define TAG_HDR      1
#define TAG_DATA     2 /* + chunk index mod TAG_SPAN */
#define TAG_SPAN     16384

/* A chunk this rank reads and sends (out) or receives (in). */
struct ro_job {
    size_t g, ei, ci;
    int peer;       /* in: the reader */
    int64_t hdr[2]; /* outcome, bytes */
    uint8_t *buf;   /* the chunk's elements */
    uint8_t *own;   /* buf when allocated here (else in a user buffer) */
    uint64_t bytes;
    uint64_t posted; /* in: bytes whose receive is posted */
    size_t pending;  /* requests in flight */
    int failed;      /* in: the reader failed, or this rank ran out */
    int sink;        /* in: pieces land in the sink, one at a time */
    size_t skip;     /* in: the destination received into directly */
};

void dcp__ro_release(struct ro_plan *p)
{
    dcp__free(p->base);
    dcp__free(p->reader);
    dcp__free(p->need);
    dcp__free(p->row);
    dcp__free(p->out);
    dcp__free(p->in);
    dcp__free(p->sink);
    memset(p, 0, sizeof(*p));
}

/* Bytes of chunk ci as C-contiguous elements in the stored dtype. */
static uint64_t chunk_bytes(const struct md_entry *e, size_t ci)
{
    return dcp__box_numel(e->ndim, e->chunks[ci].size) *
           dcp_dtype_size(e->dtype);
}

/* This rank's marks: 1 for a chunk its boxes overlap, 2 for one that a
 * CUDA box overlaps (read by each rank itself: such chunks go through a
 * host bounce buffer in load.c). row[nchunks] is 1 when this rank wants
 * per-rank reads, row[nchunks + 1] when it wants small chunks read per
 * rank. */
static int mark_row(const dcp_state *st, const struct dcp_metadata *md,
                    const size_t *base, size_t nchunks, unsigned flags,
                    uint8_t *row)
{
    size_t i, b, k;
    uint8_t *tmp = NULL;
    size_t cap = 0;
    memset(row, 0, nchunks + 2);
    row[nchunks] = (flags & DCP_LOAD_PER_RANK_READS) ? 1 : 0;
    row[nchunks + 1] = (flags & DCP_LOAD_SMALL_PER_RANK) ? 1 : 0;
    for (i = 0; i < st->n; i++) {
        const struct st_entry *se = &st->e[i];
        const struct md_entry *e;
        long ei;
        if (!se->is_tensor)
            continue;
        ei = dcp__meta_find(md, se->key);
        if (ei < 0 || !md->e[ei].is_tensor)
            continue;
        e = &md->e[ei];
        if (!e->nchunks)
            continue;
        if (e->nchunks > cap) {
            dcp__free(tmp);
            cap = e->nchunks;
            tmp = dcp__malloc(cap);
            if (!tmp)
                return DCP_ENOMEM;
        }
        memset(tmp, 0, e->nchunks);
        for (b = 0; b < se->nboxes; b++)
            if (dcp__box_numel(e->ndim, se->boxes[b].size))
                (void)dcp__meta_overlapping(e, se->boxes[b].off,
                                            se->boxes[b].size, tmp);
        for (k = 0; k < e->nchunks; k++)
            if (tmp[k]) {
                uint8_t *m = &row[base[ei] + k];
                *m = se->mem == DCP_MEM_CUDA ? 2 : (*m == 2 ? 2 : 1);
            }
    }
    dcp__free(tmp);
    return DCP_OK;
}

struct cand {
    uint64_t bytes;
    uint64_t off; /* the record's offset in its file */
    size_t g;
    uint32_t file;
};

/* In storage order: file, offset, then chunk (equal records). */
static int cmp_cand(const void *pa, const void *pb)
{
    const struct cand *a = pa, *b = pb;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    if (a->off != b->off)
        return a->off < b->off ? -1 : 1;
    return a->g < b->g ? -1 : a->g > b->g;
}

/* The plan from the marks: the same on every rank (readonce.h). */
static int assign(const struct dcp_metadata *md, struct ro_plan *p, int n,
                  uint64_t min_bytes)
{
    uint64_t *load = dcp__calloc((size_t)n, sizeof(*load));
    struct cand *cs = dcp__malloc((p->nchunks ? p->nchunks : 1) * sizeof(*cs));
    uint64_t total = 0, acc = 0, slice;
    size_t ei, ci, nc = 0, i;
    int r;
    if (!load || !cs) {
        dcp__free(load);
        dcp__free(cs);
        return DCP_ENOMEM;
    }
    for (ei = 0; ei < md->n; ei++) {
        const struct md_entry *e = &md->e[ei];
        if (!e->is_tensor)
            continue;
        for (ci = 0; ci < e->nchunks; ci++) {
            size_t g = p->base[ei] + ci, needers = 0, veto = 0;
            uint64_t nb = chunk_bytes(e, ci);
            p->reader[g] = -1;
            for (r = 0; r < n; r++) {
                uint8_t m = p->need[(size_t)r * p->nchunks + g];
                needers += m != 0;
                veto |= m == 2;
            }
            if (needers >= 2 && !veto && nb > 0 && nb >= min_bytes) {
                cs[nc].bytes = nb;
                cs[nc].off = e->chunks[ci].offset;
                cs[nc].g = g;
                cs[nc].file = e->chunks[ci].file;
                nc++;
                total += nb;
                continue;
            }
            for (r = 0; r < n; r++)
                if (p->need[(size_t)r * p->nchunks + g])
                    load[r] += nb;
        }
    }
    /* Storage order cut into n slices of about equal bytes: rank r reads
     * the chunks whose middle lies in slice r, when it needs them, so a
     * reader's records neighbour each other (one request for many on an
     * object store, sequential reads on files); a chunk its slice's rank
     * does not need goes to the rank that needs it with the fewest bytes
     * to read so far. */
    qsort(cs, nc, sizeof(*cs), cmp_cand);
    slice = total / (uint64_t)n + 1;
    for (i = 0; i < nc; i++) {
        uint64_t mid = acc + cs[i].bytes / 2, want = mid / slice;
        int best = -1;
        acc += cs[i].bytes;
        r = want < (uint64_t)n ? (int)want : n - 1;
        if (p->need[(size_t)r * p->nchunks + cs[i].g]) {
            best = r;
        } else {
            for (r = 0; r < n; r++)
                if (p->need[(size_t)r * p->nchunks + cs[i].g] &&
                    (best < 0 || load[r] < load[best]))
                    best = r;
        }
        p->reader[cs[i].g] = best;
        load[best] += cs[i].bytes;
    }
    p->nshared = nc;
    p->on = nc > 0;
    dcp__free(load);
    dcp__free(cs);
    return DCP_OK;
}

/* p's exchange jobs (their fields set by dcp__ro_run) and sink. */
static int run_alloc(struct ro_plan *p, int me)
{
    size_t i;
    for (i = 0; i < p->nchunks; i++) {
        if (p->reader[i] == me)
            p->nout++;
        else if (p->reader[i] >= 0 && p->need[(size_t)me * p->nchunks + i])
            p->nin++;
    }
    p->out = dcp__calloc(p->nout ? p->nout : 1, sizeof(*p->out));
    p->in = dcp__calloc(p->nin ? p->nin : 1, sizeof(*p->in));
    p->sink = dcp__malloc(RO_PIECE);
    return p->out && p->in && p->sink ? DCP_OK : DCP_ENOMEM;
}

/* The chunks of md's tensors (0: nothing to plan) and, with base, the
 * index of each entry's first chunk. */
static size_t count_chunks(const struct dcp_metadata *md, size_t *base)
{
    size_t ei, k = 0;
    for (ei = 0; ei < md->n; ei++) {
        if (base)
            base[ei] = k;
        if (md->e[ei].is_tensor)
            k += md->e[ei].nchunks;
    }
    return k;
}

/* Whether reads are planned at all: the same on every rank (one
 * communicator, one md). */
static int plannable(const dcp_ctx *ctx, size_t k)
{
    return dcp__comm_has_p2p(ctx->comm) && k > 0 &&
           (uint64_t)(k + 2) * (uint64_t)ctx->size <= RO_MARKS_MAX;
}

int dcp__ro_plan(dcp_ctx *ctx, const dcp_state *st,
                 const struct dcp_metadata *md, unsigned flags, int rc,
                 int skip, struct ro_plan *p, int *failed_stage)
{
    int n = ctx->size, r, stage = 1;
    uint8_t *all = NULL;
    size_t k = 0, w;
    memset(p, 0, sizeof(*p));
    if (rc == DCP_OK && !skip)
        k = count_chunks(md, NULL);
    if (rc != DCP_OK || skip || !plannable(ctx, k))
        return dcp__comm_agree_stage(ctx->comm, rc, 0, &ctx->err, NULL, 0,
                                     failed_stage);
    w = k + 2; /* marks, then the per-rank and small-per-rank flags */
    p->nchunks = k;
    p->base = dcp__calloc(md->n ? md->n : 1, sizeof(*p->base));
    p->reader = dcp__malloc(k * sizeof(*p->reader));
    p->need = dcp__malloc(k * (size_t)n);
    p->row = dcp__malloc(w);
    all = dcp__malloc(w * (size_t)n);
    if (!p->base || !p->reader || !p->need || !p->row || !all)
        rc = DCP_ENOMEM;
    if (rc == DCP_OK) {
        (void)count_chunks(md, p->base);
        rc = mark_row(st, md, p->base, k, flags, p->row);
    }
    if (rc == DCP_ENOMEM)
        rc = dcp__err(&ctx->err, rc, "out of memory planning the reads");
    /* The steps before (stage 0) and this allocation, agreed at once. */
    rc = dcp__comm_agree_stage(ctx->comm, rc, stage, &ctx->err, NULL, 0,
                               failed_stage);
    if (rc == DCP_OK)
        rc = dcp__comm_gather(ctx->comm, p->row, w, all, 0, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__comm_bcast(ctx->comm, all, w * (size_t)n, 0, &ctx->err);
    if (rc == DCP_OK) {
        int off = 0;
        uint64_t min = 0;
        for (r = 0; r < n; r++) {
            const uint8_t *rr = all + (size_t)r * w;
            memcpy(p->need + (size_t)r * p->nchunks, rr, p->nchunks);
            off |= rr[p->nchunks] != 0;
            if (rr[p->nchunks + 1])
                min = DCP_READ_ONCE_SMALL;
        }
        /* Allocation only: the same outcome on every rank, agreed. */
        if (!off && assign(md, p, n, min) != DCP_OK)
            rc = dcp__err(&ctx->err, DCP_ENOMEM,
                          "out of memory planning the reads");
        /* The exchange's jobs and sink: without them this rank could
         * not answer its peers (agreed here, so that dcp__ro_run, also
         * with a cached plan, needs no agreement of its own). */
        if (rc == DCP_OK && p->on && run_alloc(p, ctx->rank) != DCP_OK)
            rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
        rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
        if (rc != DCP_OK && failed_stage)
            *failed_stage = 1;
    }
    dcp__free(all);
    if (rc != DCP_OK) {
        dcp__ro_release(p);
    } else if (!p->on) {
        /* Only the marks are kept, for dcp__ro_same. */
        uint8_t *row = p->row;
        p->row = NULL;
        dcp__ro_release(p);
        p->row = row;
        p->nchunks = k;
    }
    return rc;
}

int dcp__ro_same(const struct ro_plan *p, const dcp_state *st,
                 const struct dcp_metadata *md, unsigned flags)
{
    size_t k = count_chunks(md, NULL), *base;
    uint8_t *row;
    int same;
    if (!p->row) /* nothing was planned: md and the communicator say so */
        return p->nchunks == 0 && !p->on;
    if (k != p->nchunks)
        return 0;
    base = dcp__calloc(md->n ? md->n : 1, sizeof(*base));
    row = dcp__malloc(k + 2);
    same = base && row;
    if (same) {
        (void)count_chunks(md, base);
        same = mark_row(st, md, base, k, flags, row) == DCP_OK &&
               !memcmp(row, p->row, k + 2);
    }
    dcp__free(base);
    dcp__free(row);
    return same;
}

/* ------------------------------------------------------------ exchange */


struct slot {
    struct ro_job *j;
    int kind; /* 0 send, 1 header receive, 2 data receive */
};

struct ex {
    dcp_ctx *ctx;
    const struct ro_plan *p;
    const dcp_state *st;
    const struct dcp_metadata *md;
    void **reqs;
    struct slot *sl;
    size_t nreq, capreq, live;
    uint64_t held;
    uint8_t *sink;
    uint64_t recv_bytes;
};

static int slot_add(struct ex *x, void *req, struct ro_job *j, int kind)
{
    size_t i;
    for (i = 0; i < x->nreq; i++)
        if (!x->reqs[i])
            break;
    if (i == x->nreq) {
        if (x->nreq == x->capreq) {
            size_t cap = x->capreq ? 2 * x->capreq : 256;
            void **r = dcp__realloc(x->reqs, cap * sizeof(*r));
            struct slot *s;
            if (!r)
                return DCP_ENOMEM;
            x->reqs = r;
            s = dcp__realloc(x->sl, cap * sizeof(*s));
            if (!s)
                return DCP_ENOMEM;
            x->sl = s;
            x->capreq = cap;
        }
        x->nreq++;
    }
    x->reqs[i] = req;
    x->sl[i].j = j;
    x->sl[i].kind = kind;
    x->live++;
    j->pending++;
    return DCP_OK;
}

/* The destinations of entry ei on this rank (NULL and 0: none). */
static int dests_of(const struct ex *x, size_t ei, struct rd_dest **d,
                    size_t *nd, const struct st_entry **out)
{
    const struct st_entry *se = dcp__state_find(x->st, x->md->e[ei].key);
    size_t i;
    *d = NULL;
    *nd = 0;
    *out = se;
    if (!se || !se->nboxes)
        return DCP_OK;
    *d = dcp__calloc(se->nboxes, sizeof(**d));
    if (!*d)
        return DCP_ENOMEM;
    for (i = 0; i < se->nboxes; i++) {
        (*d)[i].off = se->boxes[i].off;
        (*d)[i].size = se->boxes[i].size;
        (*d)[i].buf = se->boxes[i].buf;
        (*d)[i].stride = se->boxes[i].strided ? se->boxes[i].stride : NULL;
        (*d)[i].dtype = se->dtype;
    }
    *nd = se->nboxes;
    return DCP_OK;
}

/* Where chunk ci of e lands whole and contiguous in one of the
 * destinations, in the stored dtype: that address, else NULL. */
static uint8_t *direct(const struct md_entry *e, size_t ci,
                       const struct rd_dest *d, size_t nd, size_t *which)
{
    const struct md_chunk *c = &e->chunks[ci];
    size_t i;
    int k;
    for (i = 0; i < nd; i++) {
        int64_t row = (int64_t)dcp_dtype_size(e->dtype);
        if (d[i].dtype != e->dtype || d[i].stride)
            continue;
        for (k = 0; k < e->ndim; k++) {
            if (c->off[k] < d[i].off[k] ||
                c->off[k] + c->size[k] > d[i].off[k] + d[i].size[k])
                break;
            if (k > 0 &&
                (c->off[k] != d[i].off[k] || c->size[k] != d[i].size[k]))
                break;
            if (k > 0)
                row *= c->size[k];
        }
        if (k < e->ndim)
            continue;
        *which = i;
        return (uint8_t *)d[i].buf +
               (e->ndim ? (c->off[0] - d[i].off[0]) * row : 0);
    }
    return NULL;
}

/* The chunk's elements at src into every destination but skip (none when
 * skip >= nd): a rank's other boxes that the chunk overlaps. */
static void copy_except(const struct md_entry *e, size_t ci, const uint8_t *src,
                        struct rd_dest *d, size_t nd, size_t skip)
{
    size_t i;
    for (i = 0; i < nd; i++)
        if (i != skip)
            dcp__rd_copy_chunk(e, ci, src, &d[i], 1);
}

static int tag_of(size_t g)
{
    return TAG_DATA + (int)(g % TAG_SPAN);
}

/* Reads out-chunk j (unless failed) and posts its messages. */
static int send_job(struct ex *x, struct rd_files *f, struct ro_job *j,
                    int *local_rc, int verify, uint64_t *bytes_read)
{
    const struct md_entry *e = &x->md->e[j->ei];
    const struct st_entry *se;
    struct rd_dest *d = NULL, whole;
    size_t nd = 0, skip = (size_t)-1;
    uint64_t before = f->data_read, off;
    int r, rc = DCP_OK, n = x->ctx->size;
    j->bytes = chunk_bytes(e, j->ci);
    if (*local_rc == DCP_OK) {
        *local_rc = dests_of(x, j->ei, &d, &nd, &se);
        if (*local_rc != DCP_OK)
            *local_rc = dcp__err(&x->ctx->err, DCP_ENOMEM, "out of memory");
    }
    if (*local_rc == DCP_OK) {
        j->buf = direct(e, j->ci, d, nd, &skip);
        if (!j->buf) {
            j->own = dcp__malloc((size_t)j->bytes);
            j->buf = j->own;
            if (!j->own)
                *local_rc = dcp__err(&x->ctx->err, DCP_ENOMEM,
                                     "out of memory for '%s' (%llu bytes "
                                     "to forward)",
                                     e->key, (unsigned long long)j->bytes);
        }
    }
    if (*local_rc == DCP_OK) {
        whole.off = e->chunks[j->ci].off;
        whole.size = e->chunks[j->ci].size;
        whole.buf = j->buf;
        whole.stride = NULL;
        whole.dtype = e->dtype;
        *local_rc =
            dcp__rd_chunk(f, e, j->ci, &whole, 1, verify, NULL, &x->ctx->err);
        *bytes_read += f->data_read - before;
        if (*local_rc == DCP_OK)
            copy_except(e, j->ci, j->buf, d, nd, skip);
    }
    dcp__free(d);
    j->hdr[0] = *local_rc;
    j->hdr[1] = (int64_t)j->bytes;
    if (*local_rc != DCP_OK) {
        dcp__free(j->own);
        j->own = NULL;
        j->buf = NULL;
    }
    x->held += j->own ? j->bytes : 0;
    for (r = 0; rc == DCP_OK && r < n; r++) {
        void *req;
        if (r == x->ctx->rank || !x->p->need[(size_t)r * x->p->nchunks + j->g])
            continue;
        rc = dcp__comm_isend(x->ctx->comm, j->hdr, sizeof(j->hdr), r, TAG_HDR,
                             &req, &x->ctx->err);
        if (rc == DCP_OK)
            rc = slot_add(x, req, j, 0);
        for (off = 0; rc == DCP_OK && j->buf && off < j->bytes;
             off += RO_PIECE) {
            size_t len =
                j->bytes - off < RO_PIECE ? (size_t)(j->bytes - off) : RO_PIECE;
            rc = dcp__comm_isend(x->ctx->comm, j->buf + off, len, r,
                                 tag_of(j->g), &req, &x->ctx->err);
            if (rc == DCP_OK)
                rc = slot_add(x, req, j, 0);
        }
    }
    return rc;
}

static int post_hdr(struct ex *x, struct ro_job *j)
{
    void *req;
    int rc = dcp__comm_irecv(x->ctx->comm, j->hdr, sizeof(j->hdr), j->peer,
                             TAG_HDR, &req, &x->ctx->err);
    return rc == DCP_OK ? slot_add(x, req, j, 1) : rc;
}

/* Posts the next data receives of in-chunk j. */
static int post_data(struct ex *x, struct ro_job *j)
{
    int rc = DCP_OK;
    while (rc == DCP_OK && j->posted < j->bytes) {
        void *req;
        size_t len = j->bytes - j->posted < RO_PIECE
                         ? (size_t)(j->bytes - j->posted)
                         : RO_PIECE;
        rc = dcp__comm_irecv(x->ctx->comm,
                             j->sink ? x->sink : j->buf + j->posted, len,
                             j->peer, tag_of(j->g), &req, &x->ctx->err);
        if (rc == DCP_OK)
            rc = slot_add(x, req, j, 2);
        j->posted += len;
        if (j->sink)
            break; /* one at a time into the sink */
    }
    return rc;
}

/* A header arrived for in-chunk j. */
static int got_hdr(struct ex *x, struct ro_job *j, int *local_rc)
{
    const struct md_entry *e = &x->md->e[j->ei];
    const struct st_entry *se;
    struct rd_dest *d = NULL;
    size_t nd = 0;
    j->bytes = chunk_bytes(e, j->ci);
    j->skip = (size_t)-1;
    if (j->hdr[0] != DCP_OK) {
        j->failed = 1; /* the reader's message comes with the agreement */
        return DCP_OK;
    }
    if (j->hdr[1] != (int64_t)j->bytes && *local_rc == DCP_OK)
        *local_rc = dcp__err(&x->ctx->err, DCP_EIO,
                             "'%s': rank %d forwards %lld bytes of a chunk "
                             "of %llu bytes",
                             e->key, j->peer, (long long)j->hdr[1],
                             (unsigned long long)j->bytes);
    if (*local_rc == DCP_OK && dests_of(x, j->ei, &d, &nd, &se) == DCP_OK)
        j->buf = direct(e, j->ci, d, nd, &j->skip);
    dcp__free(d);
    if (!j->buf && *local_rc == DCP_OK) {
        j->own = dcp__malloc((size_t)j->bytes);
        j->buf = j->own;
        if (j->own)
            x->held += j->bytes;
        else
            *local_rc = dcp__err(&x->ctx->err, DCP_ENOMEM,
                                 "out of memory for '%s' (%llu bytes "
                                 "forwarded by rank %d)",
                                 e->key, (unsigned long long)j->bytes, j->peer);
    }
    if (!j->buf) { /* this rank failed: drain into the sink */
        j->sink = 1;
        j->failed = 1;
    }
    return post_data(x, j);
}

/* The last piece of in-chunk j arrived. */
static int got_data(struct ex *x, struct ro_job *j, int *local_rc)
{
    const struct md_entry *e = &x->md->e[j->ei];
    const struct st_entry *se;
    struct rd_dest *d = NULL;
    size_t nd = 0;
    if (j->sink && j->posted < j->bytes)
        return post_data(x, j);
    if (j->pending)
        return DCP_OK;
    x->recv_bytes += j->failed ? 0 : j->bytes;
    if (j->buf && !j->failed && *local_rc == DCP_OK) {
        if (dests_of(x, j->ei, &d, &nd, &se) != DCP_OK)
            *local_rc = dcp__err(&x->ctx->err, DCP_ENOMEM, "out of memory");
        else
            copy_except(e, j->ci, j->buf, d, nd, j->own ? (size_t)-1 : j->skip);
        dcp__free(d);
    }
    if (j->own)
        x->held -= j->bytes;
    dcp__free(j->own);
    j->own = NULL;
    return DCP_OK;
}

int dcp__ro_run(dcp_ctx *ctx, struct ro_plan *p, const dcp_state *st,
                struct rd_files *f, const struct dcp_metadata *md, int verify,
                int local_rc, uint64_t hint_round, uint64_t *bytes_read,
                uint64_t *bytes_recv, int *dropped)
{
    struct ex x;
    struct ro_job *out = p->out, *in = p->in;
    size_t nout = 0, nin = 0, ei, ci, i, no = 0, ni = 0, hdrs = 0;
    size_t hint_end = 0;
    uint64_t hinted = 0;
    int me = ctx->rank, rc = DCP_OK;
    memset(&x, 0, sizeof(x));
    x.ctx = ctx;
    x.p = p;
    x.st = st;
    x.md = md;
    x.sink = p->sink;
    /* The jobs were allocated with the plan (run_alloc); a plan reused
     * from the load plan cache runs again from a clean slate. */
    memset(out, 0, p->nout * sizeof(*out));
    memset(in, 0, p->nin * sizeof(*in));
    for (ei = 0; ei < md->n; ei++) {
        if (!md->e[ei].is_tensor)
            continue;
        for (ci = 0; ci < md->e[ei].nchunks; ci++) {
            size_t g = p->base[ei] + ci;
            struct ro_job *j = NULL;
            if (p->reader[g] == me)
                j = &out[nout++];
            else if (p->reader[g] >= 0 && p->need[(size_t)me * p->nchunks + g])
                j = &in[nin++];
            if (!j)
                continue;
            j->g = g;
            j->ei = ei;
            j->ci = ci;
            j->peer = p->reader[g];
        }
    }
    while (rc == DCP_OK) {
        size_t idx;
        struct ro_job *j;
        int kind;
        /* Headers expected, in order, a window at a time. */
        while (rc == DCP_OK && ni < nin && hdrs < RO_HDRS) {
            rc = post_hdr(&x, &in[ni++]);
            hdrs++;
        }
        /* The next chunk to read, unless too much is held in flight. On
         * a back end that takes hints (S3) the chunks to read are hinted
         * whole, about hint_round bytes at a time, so that they are
         * fetched together, in parallel, not one request each. */
        if (rc == DCP_OK && no < nout && (x.held == 0 || x.held < RO_HELD)) {
            if (f->hints && no == hint_end && local_rc == DCP_OK) {
                if (hinted)
                    dcp__rd_hints_drop(f);
                hinted = 0;
                for (;
                     hint_end < nout && (hint_end == no || hinted < hint_round);
                     hint_end++) {
                    const struct md_entry *e = &md->e[out[hint_end].ei];
                    hinted += dcp__rd_prefetch(f, e, out[hint_end].ci,
                                               e->member == NULL);
                }
            }
            rc = send_job(&x, f, &out[no++], &local_rc, verify, bytes_read);
            continue;
        }
        if (rc != DCP_OK || !x.live)
            break;
        rc = dcp__comm_waitany(ctx->comm, x.reqs, x.nreq, &idx, &ctx->err);
        if (rc != DCP_OK)
            break;
        x.live--;
        j = x.sl[idx].j;
        kind = x.sl[idx].kind;
        j->pending--;
        if (kind == 0) {
            if (!j->pending && j->own) {
                x.held -= j->bytes;
                dcp__free(j->own);
                j->own = NULL;
            }
        } else if (kind == 1) {
            hdrs--;
            rc = got_hdr(&x, j, &local_rc);
        } else {
            rc = got_data(&x, j, &local_rc);
        }
    }
    if (hinted)
        dcp__rd_hints_drop(f);
    /* After a transport failure: nothing in flight may outlive its buffer. */
    for (i = 0; i < x.nreq; i++)
        dcp__comm_cancel(ctx->comm, x.reqs[i]);
    for (i = 0; i < nout; i++) {
        dcp__free(out[i].own);
        out[i].own = NULL;
    }
    for (i = 0; i < nin; i++) {
        dcp__free(in[i].own);
        in[i].own = NULL;
        *dropped |= in[i].failed;
    }
    dcp__free(x.reqs);
    dcp__free(x.sl);
    *bytes_recv += x.recv_bytes;
    return rc != DCP_OK ? rc : local_rc;
}
