/*
 * dcp memory tiers (issue 19: first slice, peer replicas): a stack of two
 * tiers of step-named checkpoints ("step-<N>", as dcp_manager.h names them).
 *
 * Tier 0 is node-local: every rank names its node's tier-0 directory
 * (a tmpfs or a local disk); the ranks that pass the same string form one
 * node. dcp_tier_save is a dcp_save into tier 0: each rank's data file
 * lands in its own node's directory "<tier0_dir>/step-<N>", and the same
 * `.metadata` is committed into every node's directory (rank 0's first,
 * as dcp_save commits it, then each node's by its lowest rank). A tier-0
 * step is therefore an ordinary DCP checkpoint spread over the node
 * directories: their union (the files of every node's step-<N>, which are
 * disjoint but for the identical `.metadata`) is exactly what dcp_save
 * writes into one directory, and dcp, dcptool and torch read it as such
 * once the files are in one place or reachable under one path.
 *
 * Tier 1 is any path dcp accepts (a file system, "s3://bucket/prefix"
 * through the storage dispatch; the context's storage back end is used
 * for it). After each tier-0 save a background drain copies the step to
 * "<tier1_root>/step-<N>" as an ordinary checkpoint: every rank's thread
 * copies the data files it wrote (from its node's tier 0, through the
 * storage layer, under a bandwidth limit and a fixed buffer); rank 0 holds
 * the tier-1 directory's one-writer lock and publishes the step's
 * `.metadata` there last, at the next collective call that finds every
 * rank's copy done (dcp_tier_drain_test, dcp_tier_drain_wait, the next
 * dcp_tier_save, dcp_tier_restore, dcp_tier_free). A drain that fails or
 * is killed leaves tier 1's step without `.metadata`: not a checkpoint,
 * never loaded; the previous complete step stays the newest there.
 *
 * With the option tier0_async, dcp_tier_save returns once the state is
 * staged (a memcpy into cached buffers) and the tier-0 commit happens at
 * the next collective call of the stack.
 *
 * At most one drain is in flight. A save that finds the previous drain
 * still running on some rank waits for it (DCP_TIER_WAIT) or is skipped
 * (DCP_TIER_SKIP: nothing is saved), and says which (enum
 * dcp_tier_outcome).
 *
 * dcp_tier_restore finds the newest step complete on either tier — on
 * tier 0 a step is complete when a `.metadata` decodes in the directory
 * of some node of a current rank and every data file it names is held by
 * one of those nodes; on tier 1 when its `.metadata` decodes — decided by
 * rank 0 and broadcast, and loads it with dcp_load (resharded to any
 * world size). Tier 0 wins a tie. A tier-0 load that
 * fails (a file gone, a record of another save: every record carries its
 * save's id) falls back to the newest complete tier-1 step. A load reads
 * one `.metadata` and only records of that save, so two steps are never
 * mixed.
 *
 * Retention is per tier: keep the keep_last0 newest complete steps in
 * every node's tier-0 directory (each node's lowest rank prunes its own on
 * its drain thread after its copies, never the step being drained) and
 * keep_last1 on tier 1 (rank 0: after a drain commits, on its next drain
 * thread when the commit was on a save's path, else in the same call; a
 * local or an s3:// tier-1 root). Removal is the manager's (crash safe,
 * `.metadata` first).
 *
 * Peer replicas (option replicas = k > 0): nodes are numbered in the
 * order of their lowest rank; node n's partners are the next k nodes in
 * ring order (n+1, n+2, ... mod the node count) outside n's failure
 * domain, or the nodes the user names (option partners). After each
 * tier-0 commit (and after the `.metadata` reached every node) every rank
 * sends each data file it wrote, over the communicator (point-to-point,
 * pieces of 4 MiB), to one rank of each partner node, which writes it
 * into its own node's "<tier0_dir>/step-<N>" under the same name: a
 * temporary first, synced unless no_fsync, renamed only once every rank
 * agreed that every replica arrived. A node directory holding replicas is
 * therefore the step's `.metadata`, its own ranks' files and whole copies
 * of its partners' files: a subset of the step's checkpoint that dcp and
 * torch read like the others. What a restore survives: any set of lost
 * nodes that leaves, for every node, the node itself or one of its
 * partners; a node's replicas cost k times its data in the partners'
 * tier 0 and the same bytes on the communicator per save.
 *
 * Replication is off the save's path. The save (or, with tier0_async,
 * the call completing the save) returns once the local copy is committed
 * in tier 0: it only begins the replication (plans it: one allreduce of
 * the file sizes; opens the first files; posts their first pieces,
 * nonblocking) and starts the drain. How the rest moves depends on the
 * context's communicator:
 *  - With DCP_COMM_P2P_THREAD (dcp_comm.h; dcp_comm_mpi sets it when MPI
 *    runs at MPI_THREAD_MULTIPLE, see dcp_mpi.h): a thread of the tier's
 *    own streams the rest of the pieces from the moment the save returns,
 *    whatever the caller does meanwhile (training, other collectives;
 *    its messages go over a communicator of their own), alongside the
 *    step's drain thread. The next collective call of the stack —
 *    dcp_tier_save, dcp_tier_drain_test, dcp_tier_drain_wait,
 *    dcp_tier_restore or dcp_tier_free — waits for that thread (nothing,
 *    when the pieces already landed), then agrees on the outcome and
 *    renames.
 *  - Without (the default: MPI_Init, MPI_THREAD_FUNNELED, a user
 *    communicator without the flag): the replication ends at the next
 *    collective call of the stack on that call's thread, while the
 *    step's drain thread copies it to tier 1 (the two overlap): the rest
 *    of the pieces, the agreement, the renames. Between the calls the
 *    pieces already posted move only as far as the communicator
 *    progresses them on its own (MPI's, inside any MPI call of the
 *    process): communicator calls are then made only on the caller's
 *    thread.
 * Memory: at most 8 pieces (32 MiB) in flight per rank, either way. A
 * step counts as replicated (dcp_tier_replicated) only
 * once that call agreed every copy landed; a failure (a partner's write,
 * a partner that vanished: the transport's DCP_ETIMEOUT or DCP_EIO) is
 * returned by that call on every rank, the message naming the file and
 * ranks, no partial replica under a data file's name; the step stays
 * committed in tier 0 (its own node's files) and its drain goes on.
 * Tier-0 retention also keeps the newest replicated step (so up to
 * keep_last0 + 1 steps while a newer one is not replicated): after a node
 * loss it is the newest step the restore finds whole on tier 0.
 *
 * Restore with node-local tier 0: a rank opens files in its own node's
 * tier-0 directory only, never another node's. Each node's lowest rank
 * lists its own node's steps, complete or without `.metadata` (a node
 * the job died on before the step's `.metadata` reached it still holds
 * its files), and their files (names, sizes); the listings are gathered
 * on rank 0, which decides (the `.metadata` of a step sent to it by a
 * node holding one). Before a tier-0 load, each
 * node's lowest rank makes the step's directory in its node (a
 * replacement node's is new and empty) and publishes `.metadata` there;
 * every data file that some rank of a node reads (the files holding the
 * chunks its state's boxes overlap and its values; every file with a
 * load planner or stateful entries) and that the node lacks is copied
 * whole into the node's step directory from a node holding it, over the
 * communicator (point-to-point, pieces of 4 MiB, on the caller's thread,
 * a temporary renamed once every copy arrived); then dcp_load reads local
 * files. So survivors and replacement ranks load from own and partner
 * copies; the copies stay in tier 0 (a node that received a lost node's
 * file holds a replica of it again, until retention). A step is complete
 * on tier 0 only when every data file it names is on some surviving node,
 * else the newest complete tier-1 step is loaded (older, when the newest
 * was not drained; *step says which), or DCP_ENOENT names the missing
 * file when tier 1 has none. A copy that fails falls back to tier 1 as a
 * failed load does. A load reads one `.metadata` and records of its save
 * only: never a mix of two steps.
 *
 * Limitations: a node directory that no current rank names is not looked
 * at; a node receives whole files even when its ranks read part of one
 * (a restore at another world size); a communicator without
 * point-to-point operations can restore from tier 0 only what each node
 * holds itself.
 *
 * Threads: a dcp_tier is used by one thread at a time (its context's
 * rule); the drain thread does file I/O only; every communicator call
 * runs on the caller's thread, inside one of the collective calls above,
 * except the replication's point-to-point messages on its own thread
 * with DCP_COMM_P2P_THREAD (from a save to the next collective call of
 * the stack, which joins it). Between two calls of the stack the caller
 * may use the context (dcp_save, dcp_load) as usual: the replication's
 * messages have tags of their own (and, threaded, a communicator of
 * their own).
 */
#ifndef DCP_DCP_TIER_H
#define DCP_DCP_TIER_H

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a save does when the previous drain is still in flight. */
enum dcp_tier_busy {
    DCP_TIER_WAIT = 0, /* wait for it (it commits), then save */
    DCP_TIER_SKIP = 1  /* save nothing; the drain goes on */
};

/* What dcp_tier_save did. Appended values only. */
enum dcp_tier_outcome {
    DCP_TIER_SAVED = 0,   /* saved to tier 0, its drain started */
    DCP_TIER_WAITED = 1,  /* waited for the previous drain, then as SAVED */
    DCP_TIER_SKIPPED = 2, /* a drain was in flight: nothing saved */
    DCP_TIER_SAVED_NO_DRAIN = 3 /* saved to tier 0; tier 1 already held
                                   this step committed: no drain */
};

/*
 * Options. Zero-initialise, set struct_size = sizeof(dcp_tier_options);
 * zero fields take the defaults. A caller built against an older header
 * passes its smaller struct_size and gets the defaults for the fields it
 * does not know.
 */
typedef struct dcp_tier_options {
    uint32_t struct_size;
    /* This rank's node-local tier-0 root (required; created if missing):
     * a local directory (not s3://, not starting with '@'). Ranks passing
     * the same string are one node; get a node's path e.g. from
     * MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). Copied. */
    const char *tier0_dir;
    /* Tier-1 root, the same on every rank (required; created if missing).
     * Copied. */
    const char *tier1_root;
    /* Retention: complete steps kept per tier (0: all). */
    uint32_t keep_last0;
    uint32_t keep_last1;
    /* enum dcp_tier_busy. */
    int busy;
    /* Drain bandwidth limit of each rank, bytes per second (0: none). */
    uint64_t drain_bytes_per_sec;
    /* Each rank's drain copy buffer, bytes (0: 8 MiB; at least 4 KiB). */
    uint64_t drain_buffer_bytes;
    /* Options of every tier-0 save (NULL: defaults); copied. no_fsync
     * there also makes the drain's copies and commit unsynced.
     * DCP_SAVE_RANK_LOCAL is refused (DCP_EINVAL): complete steps, the
     * drain and the replicas go by .metadata. */
    const dcp_save_options *save_opts;
    /* Options of the tier-0 context the stack makes (NULL: defaults). */
    const dcp_ctx_options *ctx_opts;
    /* 1: dcp_tier_save returns once the state is staged (dcp_save_async
     * into tier 0: a copy into the tier-0 context's cached staging
     * buffers; the buffers may change on return); the tier-0 write runs
     * in the background and the step is committed in tier 0, spread to
     * every node and its drain started by the next collective call of the
     * stack (dcp_tier_save, _drain_test, _drain_wait, _restore, _free).
     * 0 (default): dcp_tier_save returns once tier 0 committed. */
    int tier0_async;
    /* --- peer replicas (issue 19, second slice) --- */
    /* k: how many partner nodes hold a replica of each node's tier-0 data
     * files (0, the default: none, as before). After each tier-0 commit
     * every rank sends each data file it wrote, over the communicator in
     * pieces of 4 MiB, to one rank of each of its node's k partner nodes,
     * which writes it under the same name into its own node's step
     * directory (synced unless no_fsync). Needs a communicator with
     * point-to-point operations (dcp_comm.h version 2; MPI's has them)
     * when there is more than one node. Clamped to the number of nodes
     * that may hold a partner's data (other nodes, other failure domains):
     * with one node there is nothing to replicate. The same on every rank.
     * Nodes are numbered 0, 1, ... in the order of their lowest rank. */
    uint32_t replicas;
    /* This rank's failure domain (a rack, a power domain): nodes in the
     * same domain (> 0) never hold each other's replicas. 0 (default): the
     * node is a domain of its own. The same on every rank of a node. */
    int failure_domain;
    /* Explicit partners of this rank's node: NULL (default: the next
     * `replicas` nodes in ring order of node index, skipping the node's
     * own failure domain), or `replicas` distinct node indices, none the
     * node's own, the same on every rank of a node. Copied. */
    const int *partners;
} dcp_tier_options;

typedef struct dcp_tier dcp_tier;

/*
 * Makes a tier stack for ctx (borrowed: it must outlive the stack; tier 1
 * is read and written through its storage back end, tier 0 through a
 * context the stack makes over the same communicator). Each node's lowest
 * rank creates its tier-0 root, rank 0 the tier-1 root. Collective over
 * ctx's communicator: every rank passes the same tier1_root and the same
 * options but tier0_dir; every rank returns the same code.
 * Returns DCP_OK, DCP_EINVAL (NULL argument, missing root, bad options,
 * options or tier1_root differing between ranks, failure_domain or
 * partners differing within a node, a partner that is not another node
 * or named twice), DCP_ENOTSUP (replicas on a communicator without
 * point-to-point operations), DCP_EIO (a root not creatable),
 * DCP_ENOMEM; the message (dcp_errmsg(ctx)) names the path, node and
 * rank. On failure *out is NULL.
 */
DCP_API int dcp_tier_create(dcp_tier **out, dcp_ctx *ctx,
                            const dcp_tier_options *opts);

/*
 * The newest step whose replicas (option replicas > 0) all landed on the
 * partner nodes, renamed under their files' names, as every rank agreed
 * at a collective call of this stack (the call that ended that step's
 * replication: see dcp_tier_save); -1 while none has (always, with no
 * partners). *step is the same on every rank. A step newer than it may
 * be committed in tier 0 with its replication still in flight or failed:
 * it is not counted as replicated (dcp_tier_restore counts a tier-0 step
 * complete only by the files the nodes hold under their names, and an
 * unfinished replica never has one). Not collective; no communication;
 * what this process learnt from its own calls (a new stack over the same
 * directories starts at -1).
 * Returns DCP_OK, DCP_EINVAL (NULL argument).
 */
DCP_API int dcp_tier_replicated(const dcp_tier *t, int64_t *step);

/*
 * Completes what is in flight, if anything (as dcp_tier_drain_wait; its
 * result is lost: a drain's, a replication's), and frees t. A
 * replication in flight is run to its end (not cancelled: its partners
 * are in the same call), so the step is replicated when it returns
 * unless that fails. Collective when something is in flight.
 * NULL: no-op.
 */
DCP_API void dcp_tier_free(dcp_tier *t);

/*
 * Saves state as step into tier 0 and starts its drain to tier 1.
 * First, when the previous drain is still running on some rank: with
 * DCP_TIER_SKIP returns DCP_OK with *outcome DCP_TIER_SKIPPED, nothing
 * saved; with DCP_TIER_WAIT completes it. A finished previous drain is
 * committed here; its result is kept for dcp_tier_drain_wait/_test, not
 * returned. Then dcp_save into tier 0 (the state's buffers may change
 * once this returns), `.metadata` committed into every node's directory,
 * tier-0 retention, and the drain started (or not, DCP_TIER_SAVED_NO_DRAIN,
 * when tier 1 already holds the step committed). *outcome (may be NULL)
 * is the same on every rank. Step must be >= 0 and the same on every rank.
 * With tier0_async, an earlier staged save is completed first (committed
 * in tier 0, spread, retention, its drain started: after the busy rule
 * above, which then concerns the drain before it), then this one is
 * staged (dcp_save_async) and the call returns; a failure of the earlier
 * one is returned here and nothing new is started.
 * With replicas, the replication of the step to the partner nodes is
 * begun (see "Replication is off the save's path" above: on a thread of
 * its own with DCP_COMM_P2P_THREAD) and the call returns without waiting
 * for it; the next collective call of the stack ends it. A replication in
 * flight from the previous save is ended first thing here (before the busy
 * rule); its failure (a peer's write, the transport) is returned here on every
 * rank, the message naming the step, file and ranks, and nothing new is saved;
 * that step stays committed in tier 0 without replicas (no partial replica is
 * left under a data file's name) and its drain goes on. Collective. Returns
 * DCP_OK, DCP_EINVAL, DCP_EBUSY (tier 1's step locked by another writer; tier 0
 * is committed), the codes of dcp_save (and of dcp_request_wait with
 * tier0_async), DCP_EIO, DCP_ENOSPC, DCP_ETIMEOUT (a peer did not answer during
 * replication), DCP_ENOMEM; every rank the same, the message in
 * dcp_errmsg(ctx).
 */
DCP_API int dcp_tier_save(dcp_tier *t, const dcp_state *state, int64_t step,
                          int *outcome);

/*
 * First ends a replication in flight, if any, on the calling thread
 * (it waits for the rest of its pieces, or for its thread); its failure is
 * returned here, on every rank, once, and nothing else is done (*done: 0 while
 * a drain or a staged save is still in flight, else 1). Then: whether the drain
 * has finished on every rank: *done = 1 (then it is committed here, and its
 * result returned) or 0 (still copying somewhere; DCP_OK). With
 * tier0_async, a staged save is then completed (committed in tier 0, its
 * replication begun, its drain started: *done = 0). With nothing in flight,
 * *done = 1 and the result of the last drain not yet reported is returned
 * (DCP_OK when none; a failure is kept until reported). Collective.
 * Returns DCP_OK, the replication's failure (DCP_EIO, DCP_ENOSPC,
 * DCP_ETIMEOUT, DCP_ENOMEM, ...) or the drain's (DCP_EIO, DCP_ENOSPC,
 * DCP_EBUSY, ...); the message names the rank, file and path; each
 * reported once.
 */
DCP_API int dcp_tier_drain_test(dcp_tier *t, int *done);

/*
 * Ends a replication in flight, waits for the drain in flight, if any,
 * and commits it; with tier0_async then completes a staged save, ends its
 * replication and drains it too. A replication's failure is reported as
 * a drain's (the first failure wins). *step (may be NULL) receives the
 * step of the drain or replication reported (-1: none).
 * Collective. Returns as dcp_tier_drain_test.
 */
DCP_API int dcp_tier_drain_wait(dcp_tier *t, int64_t *step);

/*
 * Loads the newest step complete on any tier into state (in place,
 * resharded; opts as dcp_load's, may be NULL), tier 0 first on a tie;
 * a failed tier-0 load falls back to the newest complete tier-1 step.
 * Completes a replication and a drain in flight first (their results kept
 * for dcp_tier_drain_wait). A tier-0 step whose replication did not end
 * (the job died first) or failed has no replica under a data file's name,
 * so after a node loss it is incomplete and an older, replicated step (or
 * tier 1's) is loaded. *step and *tier (may be NULL) receive what was
 * loaded (-1 and -1 on DCP_ENOENT). The choice is rank 0's, broadcast:
 * every rank loads the same step from the same tier. Each rank reads its
 * own node's tier-0 directory only; the data files its node's ranks read
 * and the node lacks are first copied into it from a node holding them
 * (own files or a partner's replica) over the communicator; they stay
 * there. Each rank then reads the stored chunks its state overlaps from
 * its own node's copy (DCP_LOAD_PER_RANK_READS is added to opts' flags:
 * read once would forward chunks two ranks share over the communicator,
 * across the network again), unless opts ask for DCP_LOAD_READ_ONCE.
 * Collective.
 * Returns DCP_OK, DCP_ENOENT (no complete step on any tier; the message
 * names a data file of tier 0's newest step missing on every node), the
 * codes of
 * dcp_load (of the tier-1 load after a fallback; the state's buffers are
 * then undefined), DCP_EIO, DCP_ENOSPC (a copy into tier 0, with no
 * tier-1 step to fall back to), DCP_ENOTSUP (files to copy between nodes
 * on a communicator without point-to-point operations, idem),
 * DCP_ETIMEOUT, DCP_ENOMEM.
 */
DCP_API int dcp_tier_restore(dcp_tier *t, dcp_state *state,
                             const dcp_load_options *opts, int64_t *step,
                             int *tier);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_TIER_H */
