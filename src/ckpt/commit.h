/*
 * The commit of a checkpoint (commit.c): the one sequence that makes a
 * written checkpoint exist, for every writer (dcp_save in save.c,
 * dcp_import in import.c, and any later one). docs/FORMAT.md section 5
 * states the protocol; tests/fault/commit_rules.h checks it on a trace.
 */
#ifndef DCP_COMMIT_H
#define DCP_COMMIT_H

#include "meta.h"
#include "util.h"

/*
 * Commits md into the checkpoint directory dirfd (a storage handle,
 * storage.h; dir is its path, for messages): encodes md and publishes it
 * as .metadata through the back end's commit primitive (dcp_storage.h,
 * publish; DCP_PUBLISH_NOSYNC without sync). On POSIX, and for a back end
 * without publish, that is, in this order, every step through the storage
 * back end: create a temporary unique to the call
 * (.metadata.<pid>-<n>-<random>.tmp); write it; fsync it (when
 * sync); close it; rename it over .metadata (the commit point); fsync the
 * directory (when sync).
 * Before calling, every data file md names must be written, fsynced (when
 * sync) and closed: the commit makes them reachable.
 *
 * Returns DCP_OK, or the first failure's code with its message in err:
 * the encoder's (DCP_ENOMEM, DCP_EINVAL for an entry it cannot encode),
 * or the back end's code for a failed create,
 * write, fsync, close, rename or directory fsync (DCP_EIO, DCP_ENOSPC, ...).
 * No step is retried (a failed fsync is never repeated).
 *
 * *renamed: set to 0 on entry, to 1 once the rename succeeded. It tells
 * a failure before the commit point (0: the previous .metadata, if any,
 * is untouched, the directory holds the old checkpoint or none) from one
 * after it (1: only the directory fsync failed; the new .metadata is in
 * place and visible, but may not survive a crash).
 *
 * Durable on DCP_OK with sync: .metadata's bytes and its name in dir
 * (and so, given the data files' fsyncs, the whole checkpoint). Without
 * sync: in place and visible, with no promise across a crash.
 *
 * Clean-up on failure: the temporary is closed and removed (ignoring
 * errors) whenever a storage step failed, the rename included; a failed
 * encoding touches no file. Data files are the caller's to remove (only
 * while *renamed is 0).
 *
 * Threads: callable from any thread (handles reach their back end from
 * any thread, the current-back-end setting is not used); not collective,
 * one process commits. Two commits into one directory at once must not
 * happen: every caller holds the directory's one-writer lock (lock.h).
 */
int dcp__commit_metadata(int dirfd, const char *dir,
                         const struct dcp_metadata *md, int sync, int *renamed,
                         struct dcp_err *err);

/* The same sequence publishing md under name instead of .metadata: a
 * rank's own __<r>.metadata in a rank-local save (DCP_SAVE_RANK_LOCAL,
 * save.c), each rank its own commit point; the temporary is
 * <name>.<pid>-<n>-<random>.tmp. */
int dcp__commit_metadata_as(int dirfd, const char *dir, const char *name,
                            const struct dcp_metadata *md, int sync,
                            int *renamed, struct dcp_err *err);

#endif /* DCP_COMMIT_H */
