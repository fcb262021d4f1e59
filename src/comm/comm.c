/*
 * Communicators: the user-pluggable wrapper (dcp_comm_create/_free), the
 * single-process case (a NULL dcp_comm, handled here by local copies so
 * save and load run one code path for one rank or many), and the protocol
 * pieces save and load build on: agreement on an outcome with the failing
 * rank's message, and byte strings of any length gathered, scattered or
 * broadcast in two steps (lengths first, so every receiver can allocate,
 * and an allocation failure is agreed on before the bulk transfer).
 */
#include "comm.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "hashtab.h"

int dcp_comm_create(const struct dcp_comm_ops *ops, void *impl, int rank,
                    int size, dcp_comm **out)
{
    dcp_comm *c;
    if (!out)
        return DCP_EINVAL;
    *out = NULL;
    if (!ops || ops->version < 1 || size < 1 || rank < 0 || rank >= size)
        return DCP_EINVAL;
    if (!ops->bcast || !ops->gather || !ops->gatherv || !ops->scatterv ||
        !ops->allreduce_min || !ops->barrier)
        return DCP_EINVAL;
    if (ops->version >= 3 && (ops->flags & ~DCP_COMM_P2P_THREAD))
        return DCP_EINVAL;
    c = dcp__calloc(1, sizeof(*c));
    if (!c)
        return DCP_ENOMEM;
    /* An older caller's struct ends at its version's last member: only
     * that prefix is read, newer members stay NULL (flags 0). */
    if (ops->version == 1)
        memcpy(&c->ops, ops, offsetof(struct dcp_comm_ops, isend));
    else if (ops->version == 2)
        memcpy(&c->ops, ops, offsetof(struct dcp_comm_ops, flags));
    else
        c->ops = *ops;
    c->ops.version = DCP_COMM_OPS_VERSION;
    c->impl = impl;
    c->rank = rank;
    c->size = size;
    *out = c;
    return DCP_OK;
}

void dcp_comm_free(dcp_comm *comm)
{
    if (!comm)
        return;
    if (comm->ops.destroy)
        comm->ops.destroy(comm->impl);
    dcp__free(comm);
}

/* ------------------------------------------------------ collectives */

static int transport(struct dcp_err *err, int rc, const char *what)
{
    if (rc == DCP_OK)
        return DCP_OK;
    if (rc == DCP_ETIMEOUT)
        return dcp__err(err, rc,
                        "communicator %s timed out: another rank did not "
                        "answer (the communicator is now unusable)",
                        what);
    return dcp__err(err, rc, "communicator %s failed: %s", what,
                    dcp_strerror(rc));
}

int dcp__comm_bcast(const dcp_comm *c, void *buf, size_t len, int root,
                    struct dcp_err *err)
{
    if (!c)
        return DCP_OK;
    return transport(err, c->ops.bcast(c->impl, buf, len, root), "bcast");
}

int dcp__comm_gather(const dcp_comm *c, const void *send, size_t len,
                     void *recv, int root, struct dcp_err *err)
{
    if (!c) {
        if (len)
            memmove(recv, send, len);
        return DCP_OK;
    }
    return transport(err, c->ops.gather(c->impl, send, len, recv, root),
                     "gather");
}

int dcp__comm_gatherv(const dcp_comm *c, const void *send, size_t len,
                      void *recv, const size_t *lens, const size_t *displs,
                      int root, struct dcp_err *err)
{
    if (!c) {
        if (len)
            memmove((uint8_t *)recv + displs[0], send, len);
        return DCP_OK;
    }
    return transport(
        err, c->ops.gatherv(c->impl, send, len, recv, lens, displs, root),
        "gatherv");
}

int dcp__comm_scatterv(const dcp_comm *c, const void *send, const size_t *lens,
                       const size_t *displs, void *recv, size_t len, int root,
                       struct dcp_err *err)
{
    if (!c) {
        if (len)
            memmove(recv, (const uint8_t *)send + displs[0], len);
        return DCP_OK;
    }
    return transport(
        err, c->ops.scatterv(c->impl, send, lens, displs, recv, len, root),
        "scatterv");
}

int dcp__comm_allreduce_min(const dcp_comm *c, int64_t *vals, size_t n,
                            struct dcp_err *err)
{
    if (!c)
        return DCP_OK;
    return transport(err, c->ops.allreduce_min(c->impl, vals, n), "allreduce");
}

int dcp__comm_has_p2p(const dcp_comm *c)
{
    return c && c->size > 1 && c->ops.version >= 2 && c->ops.isend &&
           c->ops.irecv && c->ops.waitany && c->ops.cancel;
}

int dcp__comm_p2p_thread(const dcp_comm *c)
{
    return dcp__comm_has_p2p(c) && (c->ops.flags & DCP_COMM_P2P_THREAD);
}

int dcp__comm_isend(const dcp_comm *c, const void *buf, size_t len, int peer,
                    int tag, void **req, struct dcp_err *err)
{
    *req = NULL;
    return transport(err, c->ops.isend(c->impl, buf, len, peer, tag, req),
                     "isend");
}

int dcp__comm_irecv(const dcp_comm *c, void *buf, size_t len, int peer, int tag,
                    void **req, struct dcp_err *err)
{
    *req = NULL;
    return transport(err, c->ops.irecv(c->impl, buf, len, peer, tag, req),
                     "irecv");
}

int dcp__comm_waitany(const dcp_comm *c, void **reqs, size_t n, size_t *index,
                      struct dcp_err *err)
{
    int rc = c->ops.waitany(c->impl, reqs, n, index);
    if (rc == DCP_OK && (*index >= n || reqs[*index]))
        rc = DCP_EIO; /* the implementation broke its contract */
    return transport(err, rc, "waitany");
}

void dcp__comm_cancel(const dcp_comm *c, void *req)
{
    if (req)
        c->ops.cancel(c->impl, req);
}

/* -------------------------------------------------------- agreement */

/* What travels when a rank's failure is explained to the others. */
struct verdict {
    int64_t code;
    char msg[DCP_ERRMSG_MAX];
};

/* The agreements below; *reduced is set once the allreduce succeeded. */
static int agree(const dcp_comm *c, int rc, int stage, struct dcp_err *err,
                 int64_t *r, size_t n, int *failed_stage, int *reduced)
{
    struct verdict v;
    int lo, hi, trc;
    *reduced = 0;
    if (failed_stage)
        *failed_stage = rc == DCP_OK ? -1 : stage;
    if (dcp__comm_size(c) == 1)
        return rc;
    /* The earliest failing stage's lowest rank in r[0] (stage in the high
     * half, rank in the low one) and its highest rank in r[1] (as
     * INT32_MAX - rank), then the caller's values, in one allreduce. */
    r[0] = rc == DCP_OK ? INT64_MAX : ((int64_t)stage << 32) | c->rank;
    r[1] = rc == DCP_OK ? INT64_MAX
                        : ((int64_t)stage << 32) | (INT32_MAX - c->rank);
    trc = dcp__comm_allreduce_min(c, r, 2 + n, err);
    if (failed_stage)
        *failed_stage = -1;
    if (trc != DCP_OK)
        return trc;
    *reduced = 1;
    if (r[0] == INT64_MAX)
        return DCP_OK;
    if (failed_stage)
        *failed_stage = (int)(r[0] >> 32);
    lo = (int)(r[0] & 0xffffffff);
    hi = INT32_MAX - (int)(r[1] & 0xffffffff);
    memset(&v, 0, sizeof(v));
    if (c->rank == lo) {
        v.code = rc;
        if (err && err->msg[0])
            memcpy(v.msg, err->msg, sizeof(v.msg));
        else
            (void)snprintf(v.msg, sizeof(v.msg), "%s", dcp_strerror(rc));
    }
    trc = dcp__comm_bcast(c, &v, sizeof(v), lo, err);
    if (trc != DCP_OK)
        return trc;
    v.msg[sizeof(v.msg) - 1] = '\0';
    if (v.code >= 0 || v.code < INT32_MIN)
        v.code = DCP_EIO; /* cannot happen: only failures are sent */
    if (lo == hi)
        return dcp__err(err, (int)v.code, "rank %d failed: %s", lo, v.msg);
    return dcp__err(err, (int)v.code, "ranks %d to %d failed; rank %d: %s", lo,
                    hi, lo, v.msg);
}

int dcp__comm_agree_err(const dcp_comm *c, int rc, struct dcp_err *err)
{
    return dcp__comm_agree_err_vals(c, rc, err, NULL, 0);
}

int dcp__comm_agree_err_vals(const dcp_comm *c, int rc, struct dcp_err *err,
                             int64_t *vals, size_t n)
{
    return dcp__comm_agree_stage(c, rc, 0, err, vals, n, NULL);
}

int dcp__comm_agree_stage(const dcp_comm *c, int rc, int stage,
                          struct dcp_err *err, int64_t *vals, size_t n,
                          int *failed_stage)
{
    int64_t r[2 + DCP_AGREE_VALS_MAX];
    int trc, reduced;
    if (n > DCP_AGREE_VALS_MAX) {
        if (failed_stage)
            *failed_stage = -1;
        return dcp__err(err, DCP_EINVAL, "internal: %zu values to agree", n);
    }
    if (n)
        memcpy(r + 2, vals, n * sizeof(*vals));
    trc = agree(c, rc, stage, err, r, n, failed_stage, &reduced);
    if (n && reduced)
        memcpy(vals, r + 2, n * sizeof(*vals));
    return trc;
}

int dcp__comm_agree_buf(const dcp_comm *c, int rc, int stage,
                        struct dcp_err *err, int64_t *r, size_t n,
                        int *failed_stage)
{
    int reduced;
    return agree(c, rc, stage, err, r, n, failed_stage, &reduced);
}

int dcp__comm_share_err(const dcp_comm *c, int rc, struct dcp_err *err,
                        int root)
{
    struct verdict v;
    int64_t code = rc;
    int trc;
    if (dcp__comm_size(c) == 1)
        return rc;
    trc = dcp__comm_bcast(c, &code, sizeof(code), root, err);
    if (trc != DCP_OK)
        return trc;
    if (code == DCP_OK)
        return DCP_OK;
    memset(&v, 0, sizeof(v));
    if (c->rank == root && err)
        memcpy(v.msg, err->msg, sizeof(v.msg));
    trc = dcp__comm_bcast(c, v.msg, sizeof(v.msg), root, err);
    if (trc != DCP_OK)
        return trc;
    v.msg[sizeof(v.msg) - 1] = '\0';
    if (code > 0 || code < INT32_MIN)
        code = DCP_EIO;
    if (c->rank == root)
        return (int)code;
    return dcp__err(err, (int)code, "%s", v.msg);
}

int dcp__comm_same_string(const dcp_comm *c, const char *s, const char *what,
                          struct dcp_err *err)
{
    uint64_t h;
    int64_t v[2];
    int rc;
    if (dcp__comm_size(c) == 1)
        return DCP_OK;
    h = dcp__fnv1a64(s, strlen(s));
    /* min(x) == max(x) over ranks, with max(x) = -min(-x). */
    v[0] = (int64_t)(h >> 1);
    v[1] = -v[0];
    rc = dcp__comm_allreduce_min(c, v, 2, err);
    if (rc == DCP_OK && v[0] != -v[1])
        rc = dcp__err(err, DCP_EINVAL, "not every rank passed the same %s",
                      what);
    return rc;
}

/* ------------------------------------------------------ byte strings */

/* dcp__comm_gather_blob from its second step on: root's ul, *lens and
 * *displs allocated and agreed on. */
static int gather_rest(const dcp_comm *c, const void *send, size_t len,
                       int root, uint64_t *ul, uint8_t **recv, size_t **lens,
                       size_t **displs, struct dcp_err *err)
{
    int n = dcp__comm_size(c), me = dcp__comm_rank(c), i, rc;
    uint64_t mylen = len, total = 0;
    rc = dcp__comm_gather(c, &mylen, sizeof(mylen), ul, root, err);
    if (rc != DCP_OK)
        return rc;
    if (me == root) {
        for (i = 0; i < n; i++) {
            (*lens)[i] = (size_t)ul[i];
            (*displs)[i] = (size_t)total;
            if (ul[i] > SIZE_MAX ||
                dcp__add_overflow_u64(total, ul[i], &total) ||
                total > SIZE_MAX) {
                rc = dcp__err(err, DCP_ELIMIT,
                              "gathered plans exceed "
                              "the address space");
                break;
            }
        }
        if (rc == DCP_OK) {
            *recv = dcp__malloc(total ? (size_t)total : 1);
            dcp__advise_huge(*recv, (size_t)total); /* planned out of order */
            if (!*recv)
                rc = dcp__err(err, DCP_ENOMEM,
                              "out of memory receiving %llu bytes",
                              (unsigned long long)total);
        }
    }
    rc = dcp__comm_share_err(c, rc, err, root);
    if (rc == DCP_OK)
        rc = dcp__comm_gatherv(c, send, len, *recv, *lens, *displs, root, err);
    return rc;
}

/* Root's arrays of the gather (ul and the caller's *lens, *displs). */
static int gather_alloc(const dcp_comm *c, uint64_t **ul, size_t **lens,
                        size_t **displs, struct dcp_err *err)
{
    size_t n = (size_t)dcp__comm_size(c);
    *ul = dcp__malloc(n * sizeof(**ul));
    *lens = dcp__malloc(n * sizeof(**lens));
    *displs = dcp__malloc(n * sizeof(**displs));
    if (!*ul || !*lens || !*displs)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    return DCP_OK;
}

static void gather_end(int rc, uint64_t *ul, uint8_t **recv, size_t **lens,
                       size_t **displs)
{
    dcp__free(ul);
    if (rc != DCP_OK) {
        dcp__free(*recv);
        dcp__free(*lens);
        dcp__free(*displs);
        *recv = NULL;
        *lens = *displs = NULL;
    }
}

int dcp__comm_gather_blob(const dcp_comm *c, const void *send, size_t len,
                          int root, uint8_t **recv, size_t **lens,
                          size_t **displs, struct dcp_err *err)
{
    uint64_t *ul = NULL;
    int rc = DCP_OK;
    *recv = NULL;
    *lens = *displs = NULL;
    if (dcp__comm_rank(c) == root)
        rc = gather_alloc(c, &ul, lens, displs, err);
    rc = dcp__comm_share_err(c, rc, err, root);
    if (rc == DCP_OK)
        rc = gather_rest(c, send, len, root, ul, recv, lens, displs, err);
    gather_end(rc, ul, recv, lens, displs);
    return rc;
}

int dcp__comm_gather_blob_rc(const dcp_comm *c, int rc, const void *send,
                             size_t len, int root, uint8_t **recv,
                             size_t **lens, size_t **displs,
                             struct dcp_err *err)
{
    uint64_t *ul = NULL;
    int stage = 0, fstage;
    *recv = NULL;
    *lens = *displs = NULL;
    if (rc == DCP_OK && dcp__comm_rank(c) == root) {
        stage = 1;
        rc = gather_alloc(c, &ul, lens, displs, err);
    }
    rc = dcp__comm_agree_stage(c, rc, stage, err, NULL, 0, &fstage);
    /* Root's own failure reads as dcp__comm_share_err gives it. */
    if (rc != DCP_OK && fstage == 1)
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = gather_rest(c, send, len, root, ul, recv, lens, displs, err);
    gather_end(rc, ul, recv, lens, displs);
    return rc;
}

int dcp__comm_scatter_blob(const dcp_comm *c, const void *send,
                           const size_t *lens, const size_t *displs, int root,
                           uint8_t **recv, size_t *len, struct dcp_err *err)
{
    int n = dcp__comm_size(c), me = dcp__comm_rank(c), i, rc = DCP_OK;
    uint64_t *ul = NULL, mylen = 0;
    size_t *eights = NULL, *eoffs = NULL;
    *recv = NULL;
    *len = 0;
    if (me == root) {
        ul = dcp__malloc((size_t)n * sizeof(*ul));
        eights = dcp__malloc((size_t)n * sizeof(*eights));
        eoffs = dcp__malloc((size_t)n * sizeof(*eoffs));
        if (!ul || !eights || !eoffs)
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
        for (i = 0; rc == DCP_OK && i < n; i++) {
            ul[i] = lens[i];
            eights[i] = sizeof(uint64_t);
            eoffs[i] = (size_t)i * sizeof(uint64_t);
        }
    }
    rc = dcp__comm_share_err(c, rc, err, root);
    if (rc == DCP_OK)
        rc = dcp__comm_scatterv(c, ul, eights, eoffs, &mylen, sizeof(mylen),
                                root, err);
    if (rc != DCP_OK)
        goto out;
    if (mylen > SIZE_MAX)
        rc = dcp__err(err, DCP_ELIMIT, "plan exceeds the address space");
    else if (!(*recv = dcp__malloc(mylen ? (size_t)mylen : 1)))
        rc = dcp__err(err, DCP_ENOMEM, "out of memory receiving %llu bytes",
                      (unsigned long long)mylen);
    rc = dcp__comm_agree_err(c, rc, err);
    if (rc == DCP_OK)
        rc = dcp__comm_scatterv(c, send, lens, displs, *recv, (size_t)mylen,
                                root, err);
    if (rc == DCP_OK)
        *len = (size_t)mylen;
out:
    dcp__free(ul);
    dcp__free(eights);
    dcp__free(eoffs);
    if (rc != DCP_OK) {
        dcp__free(*recv);
        *recv = NULL;
    }
    return rc;
}

int dcp__comm_bcast_blob(const dcp_comm *c, const void *buf, size_t len,
                         int root, uint8_t **out, size_t *out_len,
                         struct dcp_err *err)
{
    uint64_t n = len;
    int rc;
    *out = NULL;
    *out_len = 0;
    if (dcp__comm_size(c) == 1)
        return DCP_OK;
    rc = dcp__comm_bcast(c, &n, sizeof(n), root, err);
    if (rc != DCP_OK)
        return rc;
    rc = dcp__comm_bcast_known(c, buf, n, root, out, err);
    if (rc == DCP_OK && c->rank != root)
        *out_len = (size_t)n;
    return rc;
}

int dcp__comm_bcast_known(const dcp_comm *c, const void *buf, uint64_t n,
                          int root, uint8_t **out, struct dcp_err *err)
{
    int rc = DCP_OK;
    *out = NULL;
    if (dcp__comm_size(c) == 1)
        return DCP_OK;
    if (c->rank != root) {
        if (n > SIZE_MAX)
            rc = dcp__err(err, DCP_ELIMIT,
                          "metadata exceeds the address "
                          "space");
        else if (!(*out = dcp__malloc(n ? (size_t)n : 1)))
            rc = dcp__err(err, DCP_ENOMEM, "out of memory receiving %llu bytes",
                          (unsigned long long)n);
    }
    rc = dcp__comm_agree_err(c, rc, err);
    if (rc == DCP_OK)
        rc = dcp__comm_bcast(c, c->rank == root ? (void *)(uintptr_t)buf : *out,
                             (size_t)n, root, err);
    if (rc != DCP_OK) {
        dcp__free(*out);
        *out = NULL;
    }
    return rc;
}

/* ------------------------------------------------- uneven 1-D arrays */

/*
 * Rank 0 gathers (length, arguments ok) from every rank, computes each
 * rank's exclusive prefix sum and the total once, and scatters (code,
 * offset, total) back, so every rank returns the same code. Rank 0 alone
 * holds O(ranks) memory; its allocation failure is agreed on first.
 */
int dcp_uneven_1d(dcp_comm *comm, int64_t local_len, int64_t *global_off,
                  int64_t *global_len)
{
    int64_t mine[2], back[3] = {DCP_OK, 0, 0};
    int64_t *all = NULL, *out = NULL, sum = 0;
    size_t *lens = NULL, *displs = NULL, n = (size_t)dcp__comm_size(comm), r;
    struct dcp_err err;
    int rc = DCP_OK;
    dcp__err_clear(&err);
    mine[0] = local_len;
    mine[1] = global_off && global_len && local_len >= 0;
    if (dcp__comm_rank(comm) == 0) {
        all = dcp__calloc(n, sizeof(mine));
        out = dcp__calloc(n, sizeof(back));
        lens = dcp__calloc(n, sizeof(*lens));
        displs = dcp__calloc(n, sizeof(*displs));
        if (!all || !out || !lens || !displs)
            rc = DCP_ENOMEM;
    }
    rc = dcp__comm_agree_err(comm, rc, &err);
    if (rc == DCP_OK)
        rc = dcp__comm_gather(comm, mine, sizeof(mine), all, 0, &err);
    if (rc == DCP_OK && dcp__comm_rank(comm) == 0) {
        int64_t code = DCP_OK;
        for (r = 0; r < n; r++) {
            out[3 * r + 1] = sum;
            if (!all[2 * r + 1])
                code = code == DCP_OK ? DCP_EINVAL : code;
            else if (dcp__add_overflow_i64(sum, all[2 * r], &sum))
                code = code == DCP_OK ? DCP_ELIMIT : code;
        }
        for (r = 0; r < n; r++) {
            out[3 * r] = code;
            out[3 * r + 2] = sum;
            lens[r] = sizeof(back);
            displs[r] = r * sizeof(back);
        }
    }
    if (rc == DCP_OK)
        rc = dcp__comm_scatterv(comm, out, lens, displs, back, sizeof(back), 0,
                                &err);
    if (rc == DCP_OK)
        rc = (int)back[0];
    if (global_off)
        *global_off = rc == DCP_OK ? back[1] : 0;
    if (global_len)
        *global_len = rc == DCP_OK ? back[2] : 0;
    dcp__free(all);
    dcp__free(out);
    dcp__free(lens);
    dcp__free(displs);
    return rc;
}
