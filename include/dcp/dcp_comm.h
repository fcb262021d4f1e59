/*
 * dcp_comm.h: plugging your own communicator into dcp.
 *
 * dcp_save and dcp_load coordinate the ranks of a job through a dcp_comm.
 * dcp_mpi.h makes one from an MPI communicator; this header lets any other
 * transport (NCCL/gloo bootstrap, a job launcher's key-value store, sockets,
 * threads in one process in tests) provide the same few collectives through
 * a versioned vtable. It includes no MPI header.
 *
 * Contract for every member of struct dcp_comm_ops:
 *  - Collective: every rank of the communicator calls the same member in the
 *    same order with matching root and lengths. dcp only calls them from
 *    inside dcp_save, dcp_save_async, dcp_request_wait, dcp_request_test
 *    and dcp_load, on the thread that called those (never from the
 *    background thread of an asynchronous save), so an implementation
 *    needs no locking of its own for dcp's sake. The one exception is
 *    opt-in: a version-3 struct whose flags hold DCP_COMM_P2P_THREAD
 *    (below) lets dcp call the point-to-point members from a background
 *    thread of its own.
 *  - Return DCP_OK, or a negative DCP_E* code (DCP_EIO is the usual one) for
 *    a transport failure. A transport failure is not recoverable: dcp returns
 *    the code, but ranks whose transport succeeded may be left waiting in a
 *    later collective. Application errors (a failed write on one rank) never
 *    travel as transport failures: dcp exchanges them as data.
 *  - Lengths are size_t and may exceed INT_MAX (metadata of a large job can
 *    exceed 2 GiB): an implementation on a transport with int counts must
 *    split or use derived types.
 *  - Buffers are only valid during the call.
 */
#ifndef DCP_DCP_COMM_H
#define DCP_DCP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of struct dcp_comm_ops this header describes. A struct
 * filled against an older header (version 1 or 2) keeps working: dcp reads
 * only the members its version has. */
#define DCP_COMM_OPS_VERSION 3

/*
 * flags (version 3): DCP_COMM_P2P_THREAD says that isend, irecv, waitany
 * and cancel may be called from one background thread of dcp while the
 * thread that called dcp runs any member on the same communicator at the
 * same time: the collectives (bcast ... barrier), whose messages must
 * never match the background thread's (the MPI communicator, dcp_comm_mpi,
 * sends point-to-point messages over a duplicate communicator of their
 * own, and sets the flag only when MPI runs at MPI_THREAD_MULTIPLE), or
 * point-to-point messages with other tags (a read-once dcp_load: tags
 * below 24576; the background thread's are 24576 and above). Each
 * request is used by the thread that started it only. The flag must be
 * the same on every rank. dcp_tier.h uses it to stream a tier-0 save's
 * peer replicas after the save returned; without it they move only inside
 * the stack's calls.
 */
#define DCP_COMM_P2P_THREAD 1u

/*
 * A communicator's operations. Set version = DCP_COMM_OPS_VERSION; members
 * are only ever appended, each group marked with the version it appeared
 * in, and dcp never calls a member newer than the version a caller set.
 */
struct dcp_comm_ops {
    uint32_t version;
    /* --- valid since version 1; all required except destroy --- */
    /* Copies len bytes of buf on root into buf on every rank. */
    int (*bcast)(void *impl, void *buf, size_t len, int root);
    /* Every rank sends len bytes (the same len on every rank); root receives
     * size blocks, rank r's at recv + r * len. recv is NULL on other ranks. */
    int (*gather)(void *impl, const void *send, size_t len, void *recv,
                  int root);
    /* Rank r sends len bytes; root receives them at recv + displs[r], with
     * lens[r] == rank r's len. recv, lens and displs are NULL on other
     * ranks. */
    int (*gatherv)(void *impl, const void *send, size_t len, void *recv,
                   const size_t *lens, const size_t *displs, int root);
    /* Root sends lens[r] bytes at send + displs[r] to rank r; rank r
     * receives them into recv, whose len equals lens[r]. send, lens and
     * displs are NULL on other ranks. */
    int (*scatterv)(void *impl, const void *send, const size_t *lens,
                    const size_t *displs, void *recv, size_t len, int root);
    /* Element-wise minimum over all ranks of n int64 values, in place, the
     * result on every rank. */
    int (*allreduce_min)(void *impl, int64_t *vals, size_t n);
    int (*barrier)(void *impl);
    /* Called by dcp_comm_free with impl; may be NULL. Not collective unless
     * the implementation makes it so (the MPI one calls MPI_Comm_free). */
    void (*destroy)(void *impl);
    /* --- valid since version 2; optional: all four or none --- */
    /*
     * Point-to-point messages for the read-once load (dcp_load: a stored
     * chunk that several ranks need is read by one and forwarded). Not
     * collective: each is called by the one rank it names. With any of the
     * four NULL (or a version-1 struct) every rank reads its own chunks
     * (per-rank reads), as dcp did before.
     *  - isend/irecv start sending len bytes at buf to rank peer (receiving
     *    len bytes into buf from rank peer), with tag in [0, 32767]; *req
     *    receives the implementation's handle. Messages between two ranks
     *    with one tag must match in the order they were started (MPI's
     *    rule). len is at most 64 MiB. buf must stay valid until the
     *    request completes or is cancelled.
     *  - waitany blocks until one of the n requests completes (NULL entries
     *    are skipped; at least one is not NULL), releases it, sets that
     *    entry to NULL and its index in *index. It may give up with
     *    DCP_ETIMEOUT (the MPI communicator's dcp_comm_mpi_set_timeout);
     *    after a failure the communicator is not used again.
     *  - cancel releases a request that has not completed (after a failure:
     *    every pending one is cancelled before its buffer is freed).
     */
    int (*isend)(void *impl, const void *buf, size_t len, int peer, int tag,
                 void **req);
    int (*irecv)(void *impl, void *buf, size_t len, int peer, int tag,
                 void **req);
    int (*waitany)(void *impl, void **reqs, size_t n, size_t *index);
    void (*cancel)(void *impl, void *req);
    /* --- valid since version 3; optional (0: none) --- */
    /* DCP_COMM_P2P_THREAD or 0; other bits must be 0 (DCP_EINVAL). Read
     * only with the four point-to-point members set. */
    uint32_t flags;
};

/*
 * Wraps a user communicator. ops is copied (it need not outlive the call);
 * impl is passed to every member and, at dcp_comm_free, to ops->destroy,
 * which is how its ownership ends. rank and size describe this process.
 *  - out: receives the communicator, for dcp_ctx_create; NULL on failure.
 * Returns DCP_OK, DCP_EINVAL (NULL ops or out, ops->version 0, a required
 * member NULL, size < 1, rank outside [0, size), an unknown bit in a
 * version-3 flags), DCP_ENOMEM. On failure,
 * impl is not destroyed. Not collective. Thread safe.
 */
DCP_API int dcp_comm_create(const struct dcp_comm_ops *ops, void *impl,
                            int rank, int size, dcp_comm **out);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_COMM_H */
