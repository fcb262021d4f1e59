/*
 * One writer per checkpoint path (lock.c), and the removal of what
 * interrupted writers left behind.
 *
 * The lock is the object ".lock" in the checkpoint directory, published
 * with DCP_PUBLISH_EXCLUSIVE (dcp_storage.h: POSIX link(2), S3
 * If-None-Match), holding the holder's identity as text lines:
 *     dcp-lock 1
 *     host=<hostname>  boot=<boot id>  pid=<pid>  start=<process start>
 *     token=<the save id>  time=<unix seconds>
 * (one "key=value" per line). The coordinator of a save (rank 0) or an
 * import takes it before it plans and releases it after its commit or
 * failure. A second writer finds it and gets DCP_EBUSY naming the holder
 * and the path.
 *
 * A holder that died is taken over: same host and boot (hostname and
 * /proc/sys/kernel/random/boot_id equal) and its pid gone, exited but not
 * yet reaped (a zombie), or running another process (a different start
 * time in /proc/<pid>/stat), or same
 * host name and another boot id (the machine rebooted). A holder on
 * another host cannot be checked: its lock stays until it releases it or
 * `dcptool clean --force` removes it (DCP_CLEAN_FORCE; the message says
 * so). The take-over is race-free between takers: the taker publishes
 * ".lock.takeover-<token>" exclusively (token: the dead holder's), and
 * only the one that got it checks that ".lock" still holds that token,
 * removes it and removes the marker; then every contender publishes
 * ".lock" exclusively again, and one wins. A marker left by a taker that
 * died in those few steps makes later takers of that lock fail with
 * DCP_EBUSY until `dcptool clean --force` removes it.
 *
 * A back end whose exclusive publish is DCP_ENOTSUP (a version-1 back
 * end; POSIX without hard links) gets no lock: the writer proceeds
 * unexcluded, as before the lock existed (documented in dcp_storage.h).
 */
#ifndef DCP_LOCK_H
#define DCP_LOCK_H

#include <stdint.h>

#include "meta.h"
#include "util.h"

#define DCP__LOCK_NAME ".lock"

struct dcp__lock {
    int dirfd; /* borrowed; -1: not held */
    char token[72];
};

/* Flags of dcp__lock_acquire. */
/* Also remove a lock whose holder cannot be checked (another host) or
 * whose content cannot be read, and a take-over marker: dcptool clean
 * --force. */
#define DCP__LOCK_FORCE 0x1u

/*
 * Takes the lock of the directory dirfd (path: for messages) for a writer
 * whose token is token (its save id: printable ASCII, at most 64 bytes).
 * lk receives the lock (lk->dirfd = -1 when the back end has none).
 * Returns DCP_OK, DCP_EBUSY (another writer holds it: the message names
 * the holder, its host and pid, and the path; or a take-over is in
 * progress), DCP_EINVAL (bad token), or the back end's code.
 * Not collective (the coordinator alone).
 */
int dcp__lock_acquire(int dirfd, const char *path, const char *token,
                      unsigned flags, struct dcp__lock *lk,
                      struct dcp_err *err);

/* Releases lk (removes ".lock" when it still holds lk's token); a lock
 * not held is a no-op. Never fails (a lock left behind is taken over as
 * stale by the next writer of this host). */
void dcp__lock_release(struct dcp__lock *lk);

/*
 * Whether name looks like a file dcp writes into a checkpoint directory
 * and may remove as a leftover: a data file (__<r>_<n>.distcp or
 * __<r>_<n>.<tag>.distcp), a data file's temporary (a peer replica not
 * yet renamed: <data file>.<pid>-<n>-<hex>.tmp) or a temporary of a
 * publication (.metadata.tmp, .metadata.<...>.tmp). Never ".metadata" or
 * the lock.
 */
int dcp__leftover_name(const char *name);

/*
 * Removes the leftovers of interrupted writers from dirfd: every regular
 * file that dcp__leftover_name accepts and that the committed checkpoint
 * md (NULL: none) does not name; with md NULL and a __0.metadata present
 * (torch's rank-local checkpoint), no data file is removed; with md, also
 * rank-local metadata __<r>.metadata (shadowed by .metadata). Call with the
 * lock held (no live writer).
 * Symbolic links are never listed nor followed. *files and *bytes (may be
 * NULL) receive what was removed. With force, also the lock's temporaries
 * and take-over markers (".lock.*"). Returns DCP_OK, DCP_ENOTSUP (the back
 * end cannot list), or the first failure's code (listing, removal).
 */
int dcp__clean_leftovers(int dirfd, const char *path,
                         const struct dcp_metadata *md, int force,
                         uint64_t *files, uint64_t *bytes,
                         struct dcp_err *err);

#endif /* DCP_LOCK_H */
