/*
 * Communicator: the collectives save and load need, behind the versioned
 * vtable of dcp_comm.h. Implementations: the single process (a NULL
 * dcp_comm: every wrapper below handles it locally), MPI (comm_mpi.c) and
 * the user's own (dcp_comm_create). All calls are made on the caller's
 * thread. Every function returns DCP_OK or an error code; a code from the
 * transport itself is a transport failure, not a peer's application error.
 *
 * Application errors travel as data: a step of a collective operation ends
 * with dcp__comm_agree_err (every rank has a verdict) or dcp__comm_share_err
 * (rank 0 has the verdict), so that every rank returns the same code and the
 * same message.
 */
#ifndef DCP_COMM_H
#define DCP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "dcp/dcp_comm.h"
#include "util.h"

struct dcp_comm {
    struct dcp_comm_ops ops; /* copied; members newer than ops.version NULL */
    void *impl;
    int rank;
    int size;
};

/* Rank and size of c (0 and 1 for NULL). */
static inline int dcp__comm_rank(const dcp_comm *c)
{
    return c ? c->rank : 0;
}
static inline int dcp__comm_size(const dcp_comm *c)
{
    return c ? c->size : 1;
}

/*
 * The collectives of struct dcp_comm_ops, with NULL meaning the single
 * process (root must then be 0). A transport failure gets a message in err.
 */
int dcp__comm_bcast(const dcp_comm *c, void *buf, size_t len, int root,
                    struct dcp_err *err);
int dcp__comm_gather(const dcp_comm *c, const void *send, size_t len,
                     void *recv, int root, struct dcp_err *err);
int dcp__comm_gatherv(const dcp_comm *c, const void *send, size_t len,
                      void *recv, const size_t *lens, const size_t *displs,
                      int root, struct dcp_err *err);
int dcp__comm_scatterv(const dcp_comm *c, const void *send, const size_t *lens,
                       const size_t *displs, void *recv, size_t len, int root,
                       struct dcp_err *err);
int dcp__comm_allreduce_min(const dcp_comm *c, int64_t *vals, size_t n,
                            struct dcp_err *err);

/*
 * Point-to-point (version-2 ops, for the read-once load): whether c has
 * them (never for NULL or one rank), and the wrappers. A transport failure
 * gets a message in err; DCP_ETIMEOUT says a peer did not answer.
 */
int dcp__comm_has_p2p(const dcp_comm *c);
/* Has p2p and DCP_COMM_P2P_THREAD (dcp_comm.h): the point-to-point members
 * may run on a background thread beside the caller's collectives. */
int dcp__comm_p2p_thread(const dcp_comm *c);
int dcp__comm_isend(const dcp_comm *c, const void *buf, size_t len, int peer,
                    int tag, void **req, struct dcp_err *err);
int dcp__comm_irecv(const dcp_comm *c, void *buf, size_t len, int peer, int tag,
                    void **req, struct dcp_err *err);
int dcp__comm_waitany(const dcp_comm *c, void **reqs, size_t n, size_t *index,
                      struct dcp_err *err);
void dcp__comm_cancel(const dcp_comm *c, void *req);

/*
 * Agreement with an explanation: every rank passes its rc and its err (the
 * message of its failure). Returns DCP_OK when every rank passed DCP_OK;
 * otherwise, on every rank, the code of the lowest failing rank R, with err
 * holding "rank R failed: <R's message>" ("ranks R to S failed; rank R:
 * ..." when several did). With one rank it returns rc and leaves err alone.
 * Collective.
 */
int dcp__comm_agree_err(const dcp_comm *c, int rc, struct dcp_err *err);

/*
 * dcp__comm_agree_err with n (at most DCP_AGREE_VALS_MAX) more values
 * reduced by their minimum in the same allreduce: vals in, the minima out
 * (on every rank, also when some rank failed; with one rank unchanged).
 * Collective.
 */
#define DCP_AGREE_VALS_MAX 16
int dcp__comm_agree_err_vals(const dcp_comm *c, int rc, struct dcp_err *err,
                             int64_t *vals, size_t n);

/*
 * Several agreements in one allreduce: each rank passes its rc and the
 * stage (0, 1, ...: the step of the merged ones) it failed at. The verdict
 * is what agreeing on each stage in turn would have given: the earliest
 * failing stage's lowest rank R, "rank R failed: ..." or "ranks R to S
 * failed; rank R: ..." (S the highest rank failing at that stage). Its
 * stage goes to *failed_stage (-1 when every rank succeeded or on a
 * transport failure; failed_stage may be NULL), so that a check made on
 * every rank alike between two stages can still take precedence over a
 * later stage's failure. vals as dcp__comm_agree_err_vals. Collective.
 */
int dcp__comm_agree_stage(const dcp_comm *c, int rc, int stage,
                          struct dcp_err *err, int64_t *vals, size_t n,
                          int *failed_stage);

/*
 * dcp__comm_agree_stage with any number of values, in the caller's
 * buffer: r holds 2 + n values, the first two reserved for the agreement,
 * then the values, replaced by their minima once the allreduce ran (with
 * one rank unchanged). Collective.
 */
int dcp__comm_agree_buf(const dcp_comm *c, int rc, int stage,
                        struct dcp_err *err, int64_t *r, size_t n,
                        int *failed_stage);

/*
 * A verdict reached on root only (a plan check, the commit): root passes
 * its rc and err; every rank returns root's code, with root's message
 * (unchanged) in err on failure. Other ranks' rc is ignored. Collective.
 */
int dcp__comm_share_err(const dcp_comm *c, int rc, struct dcp_err *err,
                        int root);

/*
 * Checks that every rank passed the same string s (compared by a 63-bit
 * hash): DCP_OK, or DCP_EINVAL on every rank with "not every rank passed
 * the same <what>". Collective.
 */
int dcp__comm_same_string(const dcp_comm *c, const char *s, const char *what,
                          struct dcp_err *err);

/*
 * Gathers one byte string per rank on root. On success root gets *recv (a
 * dcp__malloc'd buffer), *lens and *displs (nranks entries each, also
 * dcp__malloc'd); other ranks get NULLs. Every rank returns the same code.
 * Collective.
 */
int dcp__comm_gather_blob(const dcp_comm *c, const void *send, size_t len,
                          int root, uint8_t **recv, size_t **lens,
                          size_t **displs, struct dcp_err *err);

/*
 * dcp__comm_agree_err(rc), then dcp__comm_gather_blob, in one collective
 * call fewer: root's allocation for the gather is agreed on together with
 * every rank's rc (a failure of rc first; root's own failure with its
 * message as dcp__comm_share_err gives it). Collective.
 */
int dcp__comm_gather_blob_rc(const dcp_comm *c, int rc, const void *send,
                             size_t len, int root, uint8_t **recv,
                             size_t **lens, size_t **displs,
                             struct dcp_err *err);

/*
 * Scatters one byte string per rank from root: rank r gets lens[r] bytes at
 * send + displs[r] (root's arguments; others pass NULLs) into *recv, a
 * dcp__malloc'd buffer of *len bytes. Every rank returns the same code.
 * Collective.
 */
int dcp__comm_scatter_blob(const dcp_comm *c, const void *send,
                           const size_t *lens, const size_t *displs, int root,
                           uint8_t **recv, size_t *len, struct dcp_err *err);

/*
 * Broadcasts a byte string of unknown length from root: root passes buf and
 * len; every other rank gets *out (dcp__malloc'd, *out_len bytes). On root,
 * *out is NULL. Every rank returns the same code. Collective.
 */
int dcp__comm_bcast_blob(const dcp_comm *c, const void *buf, size_t len,
                         int root, uint8_t **out, size_t *out_len,
                         struct dcp_err *err);

/*
 * dcp__comm_bcast_blob when every rank already knows the length (agreed
 * before): the receivers allocate, agree on that, and root broadcasts, in
 * two collectives instead of three. Collective.
 */
int dcp__comm_bcast_known(const dcp_comm *c, const void *buf, uint64_t n,
                          int root, uint8_t **out, struct dcp_err *err);

/*
 * Test hook (comm_mpi.c, MPI builds only): lowers the bytes per MPI call and
 * the largest count a single MPI call may carry, so that tests run the
 * paths for lengths beyond INT_MAX on small data. 0 restores the defaults.
 * Not thread safe; call it on every rank before the communicator is used.
 */
void dcp__comm_mpi_test_limits(size_t piece_bytes, size_t max_count);

#endif /* DCP_COMM_H */
