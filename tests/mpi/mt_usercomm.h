/*
 * A user communicator for the MPI tests: struct dcp_comm_ops written the way
 * an application would (plain MPI collectives on a duplicate of
 * MPI_COMM_WORLD), through the public dcp_comm.h. mt_user_hook, when set, runs
 * on every call (mpi_async checks that all calls come from the caller's
 * thread). Include after mpitest.h.
 */
#ifndef DCP_MT_USERCOMM_H
#define DCP_MT_USERCOMM_H

#include <dcp/dcp_comm.h>

static void (*mt_user_hook)(void);

static int u_ok(int e)
{
    if (mt_user_hook)
        mt_user_hook();
    return e == MPI_SUCCESS ? DCP_OK : DCP_EIO;
}

static int u_bcast(void *impl, void *buf, size_t len, int root)
{
    return u_ok(MPI_Bcast(buf, (int)len, MPI_BYTE, root, *(MPI_Comm *)impl));
}

static int u_gather(void *impl, const void *send, size_t len, void *recv,
                    int root)
{
    return u_ok(MPI_Gather(send, (int)len, MPI_BYTE, recv, (int)len, MPI_BYTE,
                           root, *(MPI_Comm *)impl));
}

static void u_layout(const size_t *lens, const size_t *displs, int **c, int **d)
{
    int i;
    *c = *d = NULL;
    if (!lens)
        return;
    *c = malloc((size_t)mt_size * sizeof(int));
    *d = malloc((size_t)mt_size * sizeof(int));
    for (i = 0; i < mt_size; i++) {
        (*c)[i] = (int)lens[i];
        (*d)[i] = (int)displs[i];
    }
}

static int u_gatherv(void *impl, const void *send, size_t len, void *recv,
                     const size_t *lens, const size_t *displs, int root)
{
    int *c, *d, rc;
    u_layout(lens, displs, &c, &d);
    rc = u_ok(MPI_Gatherv(send, (int)len, MPI_BYTE, recv, c, d, MPI_BYTE, root,
                          *(MPI_Comm *)impl));
    free(c);
    free(d);
    return rc;
}

static int u_scatterv(void *impl, const void *send, const size_t *lens,
                      const size_t *displs, void *recv, size_t len, int root)
{
    int *c, *d, rc;
    u_layout(lens, displs, &c, &d);
    rc = u_ok(MPI_Scatterv(send, c, d, MPI_BYTE, recv, (int)len, MPI_BYTE, root,
                           *(MPI_Comm *)impl));
    free(c);
    free(d);
    return rc;
}

static int u_allreduce_min(void *impl, int64_t *v, size_t n)
{
    return u_ok(MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_INT64_T, MPI_MIN,
                              *(MPI_Comm *)impl));
}

static int u_barrier(void *impl)
{
    return u_ok(MPI_Barrier(*(MPI_Comm *)impl));
}

static void u_destroy(void *impl)
{
    MPI_Comm_free((MPI_Comm *)impl);
    free(impl);
}

/* Version 2: point-to-point for the read-once load; a request is a
 * malloc'd MPI_Request. */
static int u_start(int e, MPI_Request *r, void **req)
{
    if (e != MPI_SUCCESS) {
        free(r);
        return u_ok(e);
    }
    *req = r;
    return u_ok(e);
}

static int u_isend(void *impl, const void *buf, size_t len, int peer, int tag,
                   void **req)
{
    MPI_Request *r = malloc(sizeof(*r));
    if (!r)
        return DCP_ENOMEM;
    return u_start(
        MPI_Isend(buf, (int)len, MPI_BYTE, peer, tag, *(MPI_Comm *)impl, r), r,
        req);
}

static int u_irecv(void *impl, void *buf, size_t len, int peer, int tag,
                   void **req)
{
    MPI_Request *r = malloc(sizeof(*r));
    if (!r)
        return DCP_ENOMEM;
    return u_start(
        MPI_Irecv(buf, (int)len, MPI_BYTE, peer, tag, *(MPI_Comm *)impl, r), r,
        req);
}

static int u_waitany(void *impl, void **reqs, size_t n, size_t *index)
{
    MPI_Request *a = malloc((n ? n : 1) * sizeof(*a));
    size_t i;
    int idx = MPI_UNDEFINED, e;
    (void)impl;
    if (!a)
        return DCP_ENOMEM;
    for (i = 0; i < n; i++)
        a[i] = reqs[i] ? *(MPI_Request *)reqs[i] : MPI_REQUEST_NULL;
    e = MPI_Waitany((int)n, a, &idx, MPI_STATUS_IGNORE);
    free(a);
    if (e != MPI_SUCCESS || idx == MPI_UNDEFINED)
        return DCP_EIO;
    free(reqs[idx]);
    reqs[idx] = NULL;
    *index = (size_t)idx;
    return u_ok(e);
}

static void u_cancel(void *impl, void *req)
{
    (void)impl;
    MPI_Cancel(req);
    MPI_Request_free(req);
    free(req);
}

/* The user communicator over a duplicate of MPI_COMM_WORLD. Collective.
 * With mt_user_v1 set, a version-1 vtable (no point-to-point: per-rank
 * reads). */
static int mt_user_v1;

static int mt_user_comm(dcp_comm **out)
{
    static const struct dcp_comm_ops ops2 = {DCP_COMM_OPS_VERSION,
                                             u_bcast,
                                             u_gather,
                                             u_gatherv,
                                             u_scatterv,
                                             u_allreduce_min,
                                             u_barrier,
                                             u_destroy,
                                             u_isend,
                                             u_irecv,
                                             u_waitany,
                                             u_cancel,
                                             0};
    struct dcp_comm_ops ops = ops2;
    if (mt_user_v1) {
        ops.version = 1;
        ops.isend = NULL;
        ops.irecv = NULL;
        ops.waitany = NULL;
        ops.cancel = NULL;
    }
    MPI_Comm *c = malloc(sizeof(*c));
    int rc;
    *out = NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, c);
    rc = dcp_comm_create(&ops, c, mt_rank, mt_size, out);
    if (rc != DCP_OK)
        u_destroy(c);
    return rc;
}

#endif /* DCP_MT_USERCOMM_H */
