/*
 * Communicator: the collectives save and load need, behind a small vtable.
 * Implementations: the single process (comm.c, used when the context has no
 * communicator) and MPI (comm_mpi.c, issue 3). All calls are made on the
 * caller's thread. Every function returns DCP_OK or an error code (a
 * transport failure, not a peer's application error).
 */
#ifndef DCP_COMM_H
#define DCP_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

struct dcp_comm_vtab {
    int (*bcast)(void *impl, void *buf, size_t len, int root);
    /* recv (root only) receives size concatenated blocks of len bytes. */
    int (*gather)(void *impl, const void *send, size_t len, void *recv,
                  int root);
    /* recv (root only) receives blocks of lens[r] bytes at displs[r]. */
    int (*gatherv)(void *impl, const void *send, size_t len, void *recv,
                   const size_t *lens, const size_t *displs, int root);
    /* Element-wise min over ranks of n int64 values, in place. */
    int (*allreduce_min)(void *impl, int64_t *vals, size_t n);
    int (*barrier)(void *impl);
    void (*destroy)(void *impl);
};

struct dcp_comm {
    const struct dcp_comm_vtab *vt;
    void *impl;
    int rank;
    int size;
};

/*
 * Agreement on an outcome: every rank passes its rc; every rank gets the
 * same result: DCP_OK when all were OK, else the lowest failing rank's code
 * for that rank and DCP_EPEER... (see comm.c). *bad_rank receives the lowest
 * failing rank or -1.
 */
int dcp__comm_agree(const dcp_comm *c, int rc, int *bad_rank);

#endif /* DCP_COMM_H */
