/*
 * Peer replicas of tier-0 data files (replica.c): the node map and its
 * partners, and the transfer of a committed step's data files to the
 * partner nodes over the communicator's point-to-point operations.
 */
#ifndef DCP_REPLICA_H
#define DCP_REPLICA_H

#include <stddef.h>
#include <stdint.h>

#include "comm.h"
#include "meta.h"
#include "util.h"

/*
 * The nodes of a tier stack: node n is the n-th distinct tier0_dir in rank
 * order. members[first[n] .. first[n] + count[n]) are node n's ranks,
 * ascending; node_of[r] is rank r's node. Node n's partners (the nodes
 * holding its replicas) are part[n * k .. n * k + kn[n]).
 */
struct dcp__nodes {
    int size; /* ranks */
    int nnodes;
    int *node_of;
    int *first, *count, *members;
    uint32_t k;
    int *kn, *part;
};

/*
 * Builds nd from every rank's tier0_dir (dirs[r]) and replica spec
 * (specs[r]: "<failure domain>" or "<failure domain>:<p0>,<p1>,..." for
 * explicit partners), k replicas asked. Deterministic (every rank passing
 * the same arrays gets the same result and message): DCP_OK, DCP_EINVAL
 * (a node whose ranks disagree on the spec, bad explicit partners; named),
 * DCP_ENOMEM.
 */
int dcp__nodes_plan(struct dcp__nodes *nd, const char *const *dirs,
                    const char *const *specs, int size, uint32_t k,
                    struct dcp_err *err);
void dcp__nodes_release(struct dcp__nodes *nd);

/* Whether some node has a partner (replication has work to do). */
int dcp__nodes_replicating(const struct dcp__nodes *nd);

/*
 * The replication of step md (dcp__repl_begin, dcp__repl_end below)
 * sends md's data files over c: each rank sends every file of md
 * it wrote ("__<rank>_*", read from stepdir, its own node's step
 * directory) to one rank of each partner node of its node (the one at the
 * sender's position in its node, modulo the partner's size), in pieces of
 * at most piece bytes, at most 4 files in flight; the receiver writes it
 * into a temporary in its own stepdir, synced unless nosync. Once every
 * rank agreed that every transfer succeeded, the temporaries are renamed
 * to the files' names and stepdir synced; on a failure they are removed.
 * Every rank returns the same code: DCP_OK, DCP_EIO, DCP_ENOSPC, DCP_ENOMEM,
 * a transport failure (DCP_ETIMEOUT, ...), the message naming rank and
 * file. Collective; uses the calling thread's storage back end (POSIX).
 *
 * It runs in two calls, so that a save returns before its replicas
 * land: dcp__repl_begin plans (one allreduce of the file sizes), agrees,
 * opens this rank's first WINDOW jobs (sources, temporaries) and posts
 * their first pieces, nonblocking, and returns without waiting. With a
 * communicator that allows it (dcp__comm_p2p_thread: DCP_COMM_P2P_THREAD)
 * a thread it starts then runs the whole exchange in the background;
 * without, the pieces move as far as the communicator progresses them on
 * its own (MPI's inside any later MPI call of the process). Memory: at most
 * NSLOT (8) pieces per rank, from start to end. md is owned by the
 * transfer (freed by the end, or by the begin on failure). *out is
 * NULL only on a failure returned here (every rank the same); a later
 * failure of the begin is kept and returned by the end.
 * dcp__repl_end (collective: every rank that began calls it, at the same
 * point of its sequence of collective calls) joins the thread, or runs
 * the rest of the exchange on the calling thread, agrees, renames the
 * temporaries (or removes them), frees r, and returns the outcome above (every
 * rank the same; the message in err). r NULL: DCP_OK. Both are called on one
 * thread (the thread's err is its own); between them no other transfer may run
 * on c (tags would mix) — the read-once load's tags are apart.
 */
struct dcp__repl;
int dcp__repl_begin(struct dcp__repl **out, const dcp_comm *c,
                    const struct dcp__nodes *nd, int rank, const char *stepdir,
                    struct dcp_metadata *md, size_t piece, int nosync,
                    struct dcp_err *err);
int dcp__repl_end(struct dcp__repl *r, struct dcp_err *err);

/*
 * One whole-file transfer of a shared plan: md->files[file], size bytes,
 * from rank src (read from its own node's step directory) to rank dst
 * (written into its own).
 */
struct dcp__xjob {
    uint32_t file;
    int src, dst;
    uint64_t size;
};

/*
 * Runs the transfers all[0 .. n), the same list in the same order on every
 * rank, with the replication's machinery: pieces of at most piece bytes,
 * at most 4 files in flight per rank, the receiver writing a temporary in
 * its stepdir that is renamed to the file's name once every rank agreed
 * that every transfer succeeded (removed otherwise); stepdir synced unless
 * nosync. Every rank returns the same code: DCP_OK, DCP_EIO, DCP_ENOSPC,
 * DCP_ENOMEM, a transport failure, the message naming rank and file.
 * Collective; uses the calling thread's storage back end (POSIX).
 */
int dcp__transfer(const dcp_comm *c, int rank, const char *stepdir,
                  const struct dcp_metadata *md, const struct dcp__xjob *all,
                  size_t n, size_t piece, int nosync, struct dcp_err *err);

/* Test hook (tier.h's dcp__tier_set_replica_hook): fn(rank, file, off,
 * arg) is called on the receiving rank before each piece of a replica is
 * written, and with file ".rename" (off 0) before each replica is renamed
 * to its file's name after the agreement; a non-zero return (a negative
 * DCP_E*) fails that replica as a write (rename) error would; fn may also
 * kill the process. NULL: none. Not thread safe. */
typedef int (*dcp__replica_hook_fn)(int rank, const char *file, uint64_t off,
                                    void *arg);
void dcp__replica_set_hook(dcp__replica_hook_fn fn, void *arg);

#endif /* DCP_REPLICA_H */
