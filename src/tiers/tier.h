/*
 * The tier stack's internal pieces (dcp_tier.h is the API): test hooks
 * (the drain's, the replicas' piece size), for white-box tests
 * (tests/mpi/mpi_tier.c).
 */
#ifndef DCP_TIER_H
#define DCP_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "dcp/dcp_tier.h"

/*
 * Test hook: fn(rank, file, off, arg) is called on the drain thread of
 * each rank before each chunk of a data file is copied to tier 1 (off: the
 * chunk's byte offset in file), and on rank 0's caller thread before it
 * publishes the step's `.metadata` in tier 1 (file ".metadata", off 0),
 * the drain's commit point. A non-zero return fails the drain with
 * that code (a negative DCP_E*), as a storage failure would; fn may also
 * kill the process there. NULL: none (the default). Set it while no drain
 * is in flight; not thread safe.
 * fn is also told the drain's other phases, for tests that kill a rank at
 * each (tests/mpi/mpi_tier.c dkill); its result is ignored there:
 *   ".spread"    every rank, caller thread: the step committed by
 *                dcp_save in tier 0 (`.metadata` in rank 0's node only),
 *                before it is published in every node's directory;
 *   ".replicate" every rank, caller thread (replicas > 0): `.metadata`
 *                in every node, before the replication begins;
 *   ".start"     every rank, caller thread: the step committed in tier 0
 *                (its replication begun, not ended: that is at the next
 *                collective call), the drain not started (tier 1's step
 *                neither made nor locked);
 *   ".prune0"    each node's lowest rank, drain thread: its data files
 *                copied, before the tier-0 retention (keep_last0 > 0);
 *   ".committed" rank 0, caller thread: tier 1's `.metadata` published,
 *                before its lock is released and tier 1's retention;
 *   ".prune1"    rank 0 (caller or drain thread): before tier 1's
 *                retention (keep_last1 > 0).
 */
typedef int (*dcp__tier_hook_fn)(int rank, const char *file, uint64_t off,
                                 void *arg);
void dcp__tier_set_drain_hook(dcp__tier_hook_fn fn, void *arg);

/* Test hook: the size of the pieces replicas travel in (0: the default,
 * 4 MiB), so that tests run many pieces on small files. Set it while no
 * save is in flight; not thread safe. */
void dcp__tier_set_replica_piece(size_t bytes);

/* Test hook: fn as dcp__tier_set_drain_hook's, called on the receiving
 * rank before each piece of a replica is written (file: the data file's
 * name, off: the piece's offset) and before each replica is renamed to
 * its name once every rank agreed (file ".rename", off 0); a non-zero
 * return fails that replica (the replication fails on every rank, at the
 * call that ends it); fn may also kill the process. Pieces are written
 * only while a replication ends (the collective call after the save), or
 * in a restore's copies, never in the save that begins one. NULL: none. */
void dcp__tier_set_replica_hook(dcp__tier_hook_fn fn, void *arg);

/* Test hook: the bytes of tier-0 data files this rank received from
 * other nodes over the communicator in restores (t0read.c), since the
 * process started. */
uint64_t dcp__tier_fetched_bytes(void);

/* Test hook: the tensor bytes this rank received from other ranks in the
 * tier-0 loads of restores (their EXCHANGE phase), since the process
 * started: 0 unless the caller asked for DCP_LOAD_READ_ONCE. */
uint64_t dcp__tier_exchanged_bytes(void);

#endif /* DCP_TIER_H */
