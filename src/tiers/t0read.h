/*
 * The tier-0 side of a restore when each rank sees only its own node's
 * tier-0 directory (t0read.c): the newest complete step decided over the
 * communicator, and the files a node lacks copied to it from a node that
 * holds them.
 */
#ifndef DCP_T0READ_H
#define DCP_T0READ_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "ctx.h"
#include "replica.h"
#include "util.h"

/* What the restore knows of this rank; borrowed. */
struct dcp__t0in {
    const dcp_comm *c;
    const struct dcp__nodes *nd;
    int rank;
    int leader;        /* the lowest rank of its node */
    const char *root;  /* its node's tier-0 root */
    dcp_ctx *lctx;     /* for the manager's listing (no communicator use) */
    uint64_t max_meta; /* bound on a .metadata's bytes */
    size_t piece;      /* bytes per message of a copy */
    int nosync;
};

/* Rank 0's decision (other ranks: step -1, nothing held). */
struct dcp__t0pick {
    int64_t step;  /* the newest complete tier-0 step, -1: none */
    uint8_t *meta; /* its .metadata bytes */
    size_t metalen;
    int nnodes;
    size_t nfiles;
    uint8_t *held;  /* held[node * nfiles + i]: node holds file i */
    int *server;    /* per file: the node serving it */
    uint64_t *size; /* per file: bytes */
    char miss[400]; /* "; step N lacks 'F' on every node", or "" */
};

void dcp__t0pick_release(struct dcp__t0pick *pk);

/*
 * The newest tier-0 step at least floor (rank 0's argument; -1: any)
 * whose every data file, named by its .metadata, is held by some node of
 * a current rank: each node's lowest rank lists its own node's steps,
 * complete or without .metadata, and their files (names, sizes),
 * gathered on rank 0; rank 0 takes the steps some node holds the
 * .metadata of, newest first, and has it sent by such a node. The result
 * is rank 0's, in *pk. A node directory that cannot be listed counts as
 * empty (a lost node). Collective; returns DCP_OK or a transport failure
 * or DCP_ENOMEM, the same on every rank.
 */
int dcp__t0_decide(const struct dcp__t0in *in, int64_t floor,
                   struct dcp__t0pick *pk, struct dcp_err *err);

/*
 * Prepares the load of step (rank 0's pk from dcp__t0_decide, the same
 * step on every rank) with node-local files only: rank 0's .metadata
 * bytes are sent to every rank; each node's lowest rank makes its node's
 * step directory and publishes `.metadata` there when absent; each rank
 * names the data files its state (st, opts as dcp_load's) reads (every
 * file with a load planner or stateful entries); rank 0 plans, for every
 * file a node's ranks need and the node lacks, a copy from a rank of the
 * serving node to the first rank of the node needing it; the copies run
 * over the communicator (dcp__transfer) into temporaries renamed once
 * every copy arrived. *fetched: bytes this rank received. Collective;
 * every rank returns the same code (DCP_OK, DCP_EIO, DCP_ENOSPC,
 * DCP_ENOMEM, a transport failure), the message naming rank and file.
 */
int dcp__t0_fetch(const struct dcp__t0in *in, const struct dcp__t0pick *pk,
                  int64_t step, const dcp_state *st,
                  const dcp_load_options *opts, uint64_t *fetched,
                  struct dcp_err *err);

#endif /* DCP_T0READ_H */
