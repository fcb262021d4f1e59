/*
 * The MPI communicator: struct dcp_comm_ops over a duplicate of the
 * caller's MPI communicator (compiled only when MPI is found).
 *
 * MPI counts are int, dcp's lengths size_t (a large job's metadata exceeds
 * 2 GiB). Broadcasts and reductions go in pieces of at most 1 GiB. A
 * gatherv or scatterv whose every length and displacement fits in an int is
 * one MPI_Gatherv/MPI_Scatterv; otherwise it runs as point-to-point
 * messages of at most 1 GiB between root and each rank, in rank order (MPI
 * keeps messages between two ranks with one tag in order). Only root knows
 * every length, so root decides which way and broadcasts the choice first.
 * Everything runs on the caller's thread; nothing here needs more than
 * MPI_THREAD_SINGLE. With MPI at MPI_THREAD_MULTIPLE on every rank, the
 * point-to-point members may also run on one dcp background thread
 * (DCP_COMM_P2P_THREAD, dcp_comm.h: a tier's replicas streaming after
 * its save returned): they then use a second duplicate communicator,
 * p2p, so their messages never mix with the caller's collectives, their
 * waitany polls (MPI_Testany and short naps, not a spinning
 * MPI_Waitany, so the thread leaves the cores to the caller), and a
 * timeout there marks p2p broken, not the collectives' communicator.
 *
 * Every call is the non-blocking form (MPI_Ibcast, MPI_Isend, ...) and a
 * wait: MPI_Wait, or, with a timeout set (dcp_comm_mpi_set_timeout), a
 * MPI_Test loop that gives up at the deadline with DCP_ETIMEOUT. MPI cannot
 * cancel a collective, so the communicator is then marked broken: every
 * later call fails at once with DCP_ETIMEOUT and it is never freed (the
 * pending request would make MPI_Comm_free erroneous).
 */
#include "comm.h"

#include <limits.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "dcp/dcp_mpi.h"

#define TAG_BULK 0x4443 /* "DC": point-to-point gatherv/scatterv */

/* Bytes per MPI call, and the largest count or displacement one call may
 * carry. Fixed in production; tests lower them (dcp__comm_mpi_test_limits)
 * to run the split paths on small data. */
static size_t piece = (size_t)1 << 30;
static size_t int_max = INT_MAX;

void dcp__comm_mpi_test_limits(size_t piece_bytes, size_t max_count)
{
    piece = piece_bytes ? piece_bytes : (size_t)1 << 30;
    int_max = max_count && max_count < INT_MAX ? max_count : INT_MAX;
}

struct mpi_comm {
    MPI_Comm comm;
    MPI_Comm p2p; /* point-to-point: comm, or its own duplicate (threaded) */
    int rank;
    int size;
    int threaded;   /* p2p is a duplicate, usable from a second thread */
    double timeout; /* seconds per call; 0 = wait forever */
    int broken;     /* a call timed out: a request is left pending */
    _Atomic int p2p_broken; /* the same, of p2p when threaded */
};

/* The point-to-point side's broken flag: p2p's own when threaded. */
static int p2p_is_broken(const struct mpi_comm *m)
{
    return m->threaded ? m->p2p_broken : m->broken;
}

static int mpi_ok(int e)
{
    return e == MPI_SUCCESS ? DCP_OK : DCP_EIO;
}

static double mono(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Completes the request e started (e: the MPI_I* call's result). */
static int wait_req(struct mpi_comm *m, int e, MPI_Request *req)
{
    double deadline;
    long nap = 1000; /* ns, doubling to 1 ms */
    int done = 0;
    if (e != MPI_SUCCESS)
        return DCP_EIO;
    if (m->timeout <= 0)
        return mpi_ok(MPI_Wait(req, MPI_STATUS_IGNORE));
    deadline = mono() + m->timeout;
    for (;;) {
        struct timespec ts;
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
            return DCP_EIO;
        if (done)
            return DCP_OK;
        if (mono() >= deadline) {
            m->broken = 1;
            return DCP_ETIMEOUT;
        }
        ts.tv_sec = 0;
        ts.tv_nsec = nap;
        (void)nanosleep(&ts, NULL);
        if (nap < 1000000)
            nap *= 2;
    }
}

#define MPI_CALL(m, call)                                                      \
    ((m)->broken ? DCP_ETIMEOUT : wait_req((m), (call), &req))

static int m_bcast(void *impl, void *buf, size_t len, int root)
{
    struct mpi_comm *m = impl;
    MPI_Request req;
    size_t off;
    int rc = DCP_OK;
    for (off = 0; rc == DCP_OK && off < len; off += piece) {
        size_t n = len - off < piece ? len - off : piece;
        rc = MPI_CALL(m, MPI_Ibcast((char *)buf + off, (int)n, MPI_BYTE,
                                    root, m->comm, &req));
    }
    return rc;
}

/* Sends len bytes to dest in pieces (the big path). */
static int send_pieces(struct mpi_comm *m, const void *p, size_t len, int dest)
{
    MPI_Request req;
    size_t off;
    int rc = DCP_OK;
    for (off = 0; rc == DCP_OK && off < len; off += piece) {
        size_t n = len - off < piece ? len - off : piece;
        rc = MPI_CALL(m, MPI_Isend((const char *)p + off, (int)n, MPI_BYTE,
                                   dest, TAG_BULK, m->comm, &req));
    }
    return rc;
}

static int recv_pieces(struct mpi_comm *m, void *p, size_t len, int src)
{
    MPI_Request req;
    size_t off;
    int rc = DCP_OK;
    for (off = 0; rc == DCP_OK && off < len; off += piece) {
        size_t n = len - off < piece ? len - off : piece;
        rc = MPI_CALL(m, MPI_Irecv((char *)p + off, (int)n, MPI_BYTE, src,
                                   TAG_BULK, m->comm, &req));
    }
    return rc;
}

/*
 * Root's int counts and displacements for a one-call gatherv/scatterv, or
 * NULL arrays when some value does not fit in an int (or memory is short:
 * the point-to-point path needs none).
 */
static void int_layout(const struct mpi_comm *m, const size_t *lens,
                       const size_t *displs, int **cnt, int **dsp)
{
    int r;
    *cnt = dcp__malloc((size_t)m->size * sizeof(int));
    *dsp = dcp__malloc((size_t)m->size * sizeof(int));
    for (r = 0; *cnt && *dsp && r < m->size; r++) {
        if (lens[r] > int_max || displs[r] > int_max ||
            lens[r] > int_max - displs[r])
            break;
        (*cnt)[r] = (int)lens[r];
        (*dsp)[r] = (int)displs[r];
    }
    if (!*cnt || !*dsp || r < m->size) {
        dcp__free(*cnt);
        dcp__free(*dsp);
        *cnt = *dsp = NULL;
    }
}

static int m_gatherv(void *impl, const void *send, size_t len, void *recv,
                     const size_t *lens, const size_t *displs, int root)
{
    struct mpi_comm *m = impl;
    MPI_Request req;
    int *cnt = NULL, *dsp = NULL, one_call = 0, r, rc;
    if (m->rank == root) {
        int_layout(m, lens, displs, &cnt, &dsp);
        one_call = cnt != NULL && len <= int_max;
    }
    rc = MPI_CALL(m, MPI_Ibcast(&one_call, 1, MPI_INT, root, m->comm, &req));
    if (rc == DCP_OK && one_call) {
        rc = MPI_CALL(m, MPI_Igatherv(send, (int)len, MPI_BYTE, recv, cnt, dsp,
                                      MPI_BYTE, root, m->comm, &req));
    } else if (rc == DCP_OK && m->rank != root) {
        rc = send_pieces(m, send, len, root);
    } else if (rc == DCP_OK) {
        for (r = 0; rc == DCP_OK && r < m->size; r++) {
            if (r == root && len)
                memcpy((char *)recv + displs[r], send, len);
            else if (r != root)
                rc = recv_pieces(m, (char *)recv + displs[r], lens[r], r);
        }
    }
    dcp__free(cnt);
    dcp__free(dsp);
    return rc;
}

static int m_gather(void *impl, const void *send, size_t len, void *recv,
                    int root)
{
    struct mpi_comm *m = impl;
    MPI_Request req;
    int r, rc = DCP_OK;
    /* Every rank knows len and size, so every rank takes the same way. */
    if (len <= int_max / (size_t)m->size)
        return MPI_CALL(m, MPI_Igather(send, (int)len, MPI_BYTE, recv,
                                       (int)len, MPI_BYTE, root, m->comm,
                                       &req));
    if (m->rank != root)
        return send_pieces(m, send, len, root);
    for (r = 0; rc == DCP_OK && r < m->size; r++) {
        if (r == root)
            memcpy((char *)recv + (size_t)r * len, send, len);
        else
            rc = recv_pieces(m, (char *)recv + (size_t)r * len, len, r);
    }
    return rc;
}

static int m_scatterv(void *impl, const void *send, const size_t *lens,
                      const size_t *displs, void *recv, size_t len, int root)
{
    struct mpi_comm *m = impl;
    MPI_Request req;
    int *cnt = NULL, *dsp = NULL, one_call = 0, r, rc;
    if (m->rank == root) {
        int_layout(m, lens, displs, &cnt, &dsp);
        one_call = cnt != NULL;
    }
    rc = MPI_CALL(m, MPI_Ibcast(&one_call, 1, MPI_INT, root, m->comm, &req));
    if (rc == DCP_OK && one_call) {
        rc = MPI_CALL(m, MPI_Iscatterv(send, cnt, dsp, MPI_BYTE, recv,
                                       (int)len, MPI_BYTE, root, m->comm,
                                       &req));
    } else if (rc == DCP_OK && m->rank != root) {
        rc = recv_pieces(m, recv, len, root);
    } else if (rc == DCP_OK) {
        for (r = 0; rc == DCP_OK && r < m->size; r++) {
            if (r == root && len)
                memcpy(recv, (const char *)send + displs[r], len);
            else if (r != root)
                rc = send_pieces(m, (const char *)send + displs[r], lens[r], r);
        }
    }
    dcp__free(cnt);
    dcp__free(dsp);
    return rc;
}

static int m_allreduce_min(void *impl, int64_t *vals, size_t n)
{
    struct mpi_comm *m = impl;
    MPI_Request req;
    size_t off, step = piece / sizeof(int64_t) ? piece / sizeof(int64_t) : 1;
    int rc = DCP_OK;
    for (off = 0; rc == DCP_OK && off < n; off += step) {
        size_t k = n - off < step ? n - off : step;
        rc = MPI_CALL(m, MPI_Iallreduce(MPI_IN_PLACE, vals + off, (int)k,
                                        MPI_INT64_T, MPI_MIN, m->comm, &req));
    }
    return rc;
}

static int m_barrier(void *impl)
{
    struct mpi_comm *m = impl;
    MPI_Request req;
    return MPI_CALL(m, MPI_Ibarrier(m->comm, &req));
}

/*
 * Point-to-point (version 2): a request is a dcp__malloc'd MPI_Request.
 * waitany polls MPI_Testany (MPI_Waitany without a timeout); with a
 * timeout, no completion before the deadline marks the communicator broken.
 */
static int m_isend(void *impl, const void *buf, size_t len, int peer, int tag,
                   void **req)
{
    struct mpi_comm *m = impl;
    MPI_Request *r;
    if (p2p_is_broken(m))
        return DCP_ETIMEOUT;
    if (len > INT_MAX) /* dcp sends at most 64 MiB (dcp_comm.h) */
        return DCP_EINVAL;
    r = dcp__malloc(sizeof(*r));
    if (!r)
        return DCP_ENOMEM;
    if (MPI_Isend(buf, (int)len, MPI_BYTE, peer, tag, m->p2p, r) !=
        MPI_SUCCESS) {
        dcp__free(r);
        return DCP_EIO;
    }
    *req = r;
    return DCP_OK;
}

static int m_irecv(void *impl, void *buf, size_t len, int peer, int tag,
                   void **req)
{
    struct mpi_comm *m = impl;
    MPI_Request *r;
    if (p2p_is_broken(m))
        return DCP_ETIMEOUT;
    if (len > INT_MAX) /* dcp sends at most 64 MiB (dcp_comm.h) */
        return DCP_EINVAL;
    r = dcp__malloc(sizeof(*r));
    if (!r)
        return DCP_ENOMEM;
    if (MPI_Irecv(buf, (int)len, MPI_BYTE, peer, tag, m->p2p, r) !=
        MPI_SUCCESS) {
        dcp__free(r);
        return DCP_EIO;
    }
    *req = r;
    return DCP_OK;
}

static int m_waitany(void *impl, void **reqs, size_t n, size_t *index)
{
    struct mpi_comm *m = impl;
    MPI_Request *arr;
    double deadline = 0;
    long nap = 1000; /* ns, doubling to 1 ms */
    int idx = MPI_UNDEFINED, done = 0, e;
    size_t i;
    if (p2p_is_broken(m))
        return DCP_ETIMEOUT;
    if (n > (size_t)INT_MAX)
        return DCP_EINVAL;
    arr = dcp__malloc((n ? n : 1) * sizeof(*arr));
    if (!arr)
        return DCP_ENOMEM;
    for (i = 0; i < n; i++)
        arr[i] = reqs[i] ? *(MPI_Request *)reqs[i] : MPI_REQUEST_NULL;
    if (m->timeout <= 0 && !m->threaded) {
        e = MPI_Waitany((int)n, arr, &idx, MPI_STATUS_IGNORE);
    } else {
        /* Threaded: naps of at most 100 us, a piece's time or less. */
        long cap = m->threaded ? 100000 : 1000000;
        if (m->timeout > 0)
            deadline = mono() + m->timeout;
        for (;;) {
            struct timespec ts;
            e = MPI_Testany((int)n, arr, &idx, &done, MPI_STATUS_IGNORE);
            if (e != MPI_SUCCESS || done)
                break;
            if (m->timeout > 0 && mono() >= deadline) {
                if (m->threaded)
                    m->p2p_broken = 1;
                else
                    m->broken = 1;
                dcp__free(arr);
                return DCP_ETIMEOUT;
            }
            ts.tv_sec = 0;
            ts.tv_nsec = nap;
            (void)nanosleep(&ts, NULL);
            if (nap < cap)
                nap *= 2;
        }
    }
    dcp__free(arr);
    if (e != MPI_SUCCESS || idx == MPI_UNDEFINED || idx < 0 || (size_t)idx >= n)
        return DCP_EIO;
    dcp__free(reqs[idx]);
    reqs[idx] = NULL;
    *index = (size_t)idx;
    return DCP_OK;
}

static void m_cancel(void *impl, void *req)
{
    MPI_Request *r = req;
    (void)impl;
    if (!r)
        return;
    (void)MPI_Cancel(r);
    (void)MPI_Request_free(r);
    dcp__free(r);
}

static void m_destroy(void *impl)
{
    struct mpi_comm *m = impl;
    int fin = 0;
    (void)MPI_Finalized(&fin);
    if (!fin && m->threaded && !m->p2p_broken && m->p2p != MPI_COMM_NULL)
        (void)MPI_Comm_free(&m->p2p);
    if (!fin && !m->broken)
        (void)MPI_Comm_free(&m->comm);
    dcp__free(m);
}

static const struct dcp_comm_ops mpi_ops = {DCP_COMM_OPS_VERSION,
                                            m_bcast,
                                            m_gather,
                                            m_gatherv,
                                            m_scatterv,
                                            m_allreduce_min,
                                            m_barrier,
                                            m_destroy,
                                            m_isend,
                                            m_irecv,
                                            m_waitany,
                                            m_cancel,
                                            0};

int dcp_comm_mpi(dcp_comm **out, MPI_Comm comm)
{
    struct mpi_comm *m;
    MPI_Comm dup = MPI_COMM_NULL, dup2 = MPI_COMM_NULL;
    int init = 0, fin = 0, inter = 0, level = MPI_THREAD_SINGLE, mt, rc;
    if (!out)
        return DCP_EINVAL;
    *out = NULL;
    if (MPI_Initialized(&init) != MPI_SUCCESS || !init ||
        MPI_Finalized(&fin) != MPI_SUCCESS || fin || comm == MPI_COMM_NULL)
        return DCP_EINVAL;
    if (MPI_Comm_test_inter(comm, &inter) != MPI_SUCCESS || inter)
        return DCP_EINVAL;
    /* The collective step comes first, so a local failure below cannot
     * leave other ranks waiting in MPI_Comm_dup. */
    if (MPI_Comm_dup(comm, &dup) != MPI_SUCCESS)
        return DCP_EIO;
    /* Threaded point-to-point only where every rank has
     * MPI_THREAD_MULTIPLE (agreed: the flag must match everywhere), over
     * a second duplicate. Collective like the first. */
    if (MPI_Query_thread(&level) != MPI_SUCCESS)
        level = MPI_THREAD_SINGLE;
    mt = level == MPI_THREAD_MULTIPLE;
    if (MPI_Allreduce(MPI_IN_PLACE, &mt, 1, MPI_INT, MPI_MIN, dup) !=
            MPI_SUCCESS ||
        (mt && MPI_Comm_dup(dup, &dup2) != MPI_SUCCESS)) {
        (void)MPI_Comm_free(&dup);
        return DCP_EIO;
    }
    m = dcp__calloc(1, sizeof(*m));
    if (!m) {
        if (mt)
            (void)MPI_Comm_free(&dup2);
        (void)MPI_Comm_free(&dup);
        return DCP_ENOMEM;
    }
    m->comm = dup;
    m->threaded = mt;
    m->p2p = mt ? dup2 : dup;
    if (MPI_Comm_rank(dup, &m->rank) != MPI_SUCCESS ||
        MPI_Comm_size(dup, &m->size) != MPI_SUCCESS) {
        m_destroy(m);
        return DCP_EIO;
    }
    {
        /* dcp_comm_create copies the ops: the flag set on a local copy
         * (DCP_COMM_P2P_THREAD: MPI_THREAD_MULTIPLE on every rank) */
        struct dcp_comm_ops ops = mpi_ops;
        ops.flags = mt ? DCP_COMM_P2P_THREAD : 0;
        rc = dcp_comm_create(&ops, m, m->rank, m->size, out);
    }
    if (rc != DCP_OK)
        m_destroy(m);
    return rc;
}

int dcp_comm_mpi_set_timeout(dcp_comm *comm, double seconds)
{
    struct mpi_comm *m;
    /* Set before any point-to-point traffic is in flight (a tier's
     * replication runs between its save and its next call). */
    if (!comm || comm->ops.bcast != m_bcast || !(seconds >= 0) ||
        seconds > 1e9)
        return DCP_EINVAL;
    m = comm->impl;
    m->timeout = seconds;
    return DCP_OK;
}
