/*
 * forkcomm: a dcp communicator (dcp_comm.h) for N forked processes joined
 * by socket pairs in a star around rank 0, so the crash tests can run a
 * multi-rank save in one test program, kill any rank at any step and see
 * what the others do, without mpirun. Every collective goes through rank
 * 0. A peer that dies shows up as end-of-file or EPIPE: DCP_EIO (SIGPIPE
 * must be ignored). gatherv and scatterv support root 0 only (all dcp
 * uses); bcast any root.
 */
#ifndef DCP_FORKCOMM_H
#define DCP_FORKCOMM_H

#include <dcp/dcp.h>
#include <dcp/dcp_comm.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define FC_MAX 8

struct forkcomm {
    int rank, size;
    int fd[FC_MAX]; /* rank 0: fd[r] talks to rank r; others: fd[0] */
};

static inline int fc_send(int fd, const void *p, size_t n)
{
    const char *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return DCP_EIO;
        b += w;
        n -= (size_t)w;
    }
    return DCP_OK;
}

static inline int fc_recv(int fd, void *p, size_t n)
{
    char *b = p;
    while (n) {
        ssize_t r = read(fd, b, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return DCP_EIO;
        b += r;
        n -= (size_t)r;
    }
    return DCP_OK;
}

static inline int fc_bcast(void *impl, void *buf, size_t len, int root)
{
    struct forkcomm *c = impl;
    int r, rc = DCP_OK;
    if (c->rank != 0) {
        if (c->rank == root)
            return fc_send(c->fd[0], buf, len);
        return fc_recv(c->fd[0], buf, len);
    }
    if (root != 0)
        rc = fc_recv(c->fd[root], buf, len);
    for (r = 1; rc == DCP_OK && r < c->size; r++)
        if (r != root)
            rc = fc_send(c->fd[r], buf, len);
    return rc;
}

static inline int fc_gatherv(void *impl, const void *send, size_t len,
                             void *recv, const size_t *lens,
                             const size_t *displs, int root)
{
    struct forkcomm *c = impl;
    int r, rc = DCP_OK;
    if (root != 0)
        return DCP_ENOTSUP;
    if (c->rank != 0)
        return fc_send(c->fd[0], send, len);
    if (len)
        memcpy((char *)recv + displs[0], send, len);
    for (r = 1; rc == DCP_OK && r < c->size; r++)
        rc = fc_recv(c->fd[r], (char *)recv + displs[r], lens[r]);
    return rc;
}

static inline int fc_gather(void *impl, const void *send, size_t len,
                            void *recv, int root)
{
    struct forkcomm *c = impl;
    size_t lens[FC_MAX], displs[FC_MAX];
    char *tmp = NULL;
    int r, rc;
    for (r = 0; r < c->size; r++) {
        lens[r] = len;
        displs[r] = (size_t)r * len;
    }
    if (c->rank == 0 && root != 0) {
        tmp = malloc(len * (size_t)c->size + 1);
        if (!tmp)
            return DCP_ENOMEM;
    }
    if (c->rank == root && root != 0) {
        rc = fc_send(c->fd[0], send, len);
        if (rc == DCP_OK)
            rc = fc_recv(c->fd[0], recv, len * (size_t)c->size);
        return rc;
    }
    rc = fc_gatherv(impl, send, len, tmp ? tmp : recv, lens, displs, 0);
    if (rc == DCP_OK && tmp) {
        rc = fc_recv(c->fd[root], tmp + (size_t)root * len, len);
        if (rc == DCP_OK)
            rc = fc_send(c->fd[root], tmp, len * (size_t)c->size);
    }
    free(tmp);
    return rc;
}

static inline int fc_scatterv(void *impl, const void *send, const size_t *lens,
                              const size_t *displs, void *recv, size_t len,
                              int root)
{
    struct forkcomm *c = impl;
    int r, rc = DCP_OK;
    if (root != 0)
        return DCP_ENOTSUP;
    if (c->rank != 0)
        return fc_recv(c->fd[0], recv, len);
    if (len)
        memcpy(recv, (const char *)send + displs[0], len);
    for (r = 1; rc == DCP_OK && r < c->size; r++)
        rc = fc_send(c->fd[r], (const char *)send + displs[r], lens[r]);
    return rc;
}

static inline int fc_allreduce_min(void *impl, int64_t *vals, size_t n)
{
    struct forkcomm *c = impl;
    int64_t *tmp;
    size_t i;
    int r, rc = DCP_OK;
    if (c->rank != 0) {
        rc = fc_send(c->fd[0], vals, n * sizeof(*vals));
        return rc == DCP_OK ? fc_recv(c->fd[0], vals, n * sizeof(*vals)) : rc;
    }
    tmp = malloc(n * sizeof(*vals) + 1);
    if (!tmp)
        return DCP_ENOMEM;
    for (r = 1; rc == DCP_OK && r < c->size; r++) {
        rc = fc_recv(c->fd[r], tmp, n * sizeof(*vals));
        for (i = 0; rc == DCP_OK && i < n; i++)
            if (tmp[i] < vals[i])
                vals[i] = tmp[i];
    }
    free(tmp);
    for (r = 1; rc == DCP_OK && r < c->size; r++)
        rc = fc_send(c->fd[r], vals, n * sizeof(*vals));
    return rc;
}

static inline int fc_barrier(void *impl)
{
    int64_t v = 0;
    return fc_allreduce_min(impl, &v, 1);
}

static inline const struct dcp_comm_ops *fc_ops(void)
{
    static const struct dcp_comm_ops ops = {
        1, fc_bcast, fc_gather, fc_gatherv, fc_scatterv, fc_allreduce_min,
        fc_barrier, NULL,
        /* a version-1 communicator: no point-to-point, per-rank reads */
        NULL, NULL, NULL, NULL, 0};
    return &ops;
}

/*
 * Starts size processes that run fn(rank, comm, arg) and exit with its
 * result; the parent only waits. pids receives the children's ids (size
 * entries). Returns 0 or -1.
 */
static inline int fc_spawn(int size,
                           int (*fn)(int rank, dcp_comm *comm, void *arg),
                           void *arg, pid_t *pids)
{
    int sv[FC_MAX][2], r, k;
    if (size < 1 || size > FC_MAX)
        return -1;
    (void)fflush(NULL); /* or the children would write it again */
    for (r = 1; r < size; r++)
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv[r]) != 0)
            return -1;
    for (r = 0; r < size; r++) {
        pids[r] = fork();
        if (pids[r] < 0)
            return -1;
        if (pids[r] == 0) {
            struct forkcomm c;
            dcp_comm *comm = NULL;
            int res;
            c.rank = r;
            c.size = size;
            for (k = 1; k < size; k++) {
                if (r == 0) {
                    c.fd[k] = sv[k][0];
                    close(sv[k][1]);
                } else if (k == r) {
                    c.fd[0] = sv[k][1];
                    close(sv[k][0]);
                } else {
                    close(sv[k][0]);
                    close(sv[k][1]);
                }
            }
            if (size > 1 && dcp_comm_create(fc_ops(), &c, r, size, &comm))
                _exit(100);
            res = fn(r, comm, arg);
            dcp_comm_free(comm);
            exit(res);
        }
    }
    for (r = 1; r < size; r++) {
        close(sv[r][0]);
        close(sv[r][1]);
    }
    return 0;
}

#endif /* DCP_FORKCOMM_H */
