/*
 * dcp_storage.h: storage back ends, the way dcp reaches files.
 *
 * Every byte dcp reads or writes, every fsync, rename and removal, goes
 * through a table of operations: a storage back end. The built-in one,
 * dcp_storage_posix(), is POSIX file I/O and is what a context uses unless
 * told otherwise. A program can supply its own (another file system API, a
 * tracing or fault-injecting wrapper around the POSIX one, an in-memory
 * store) per context, with dcp_ctx_options.storage or dcp_ctx_set_storage.
 * dcp's own tests use this to inject I/O errors and crashes at every
 * operation of a save (tests/fault/).
 *
 * The model is the one the format needs: a checkpoint is one directory of
 * flat files. A back end hands out opaque handles (void *) for the
 * directories and files it opens; dcp passes them back and closes every
 * handle it opened, on every path, errors included. File names passed to
 * the operations are single path components (no '/', never "." or ".."),
 * already checked by dcp; they are also what error messages should name.
 *
 * Contract, for every member:
 *  - Return DCP_OK or a negative DCP_E* code, and on failure record a
 *    message with dcp_storage_set_error naming the file and the cause, in
 *    dcp's style: "cannot write '__0_0.distcp': No space left on device".
 *    The usual codes: DCP_ENOENT (missing), DCP_ENOSPC (full or over
 *    quota), DCP_EIO (anything else the device or system reports),
 *    DCP_EUNSAFE (a symbolic link or a non-regular file where a file was
 *    asked for), DCP_EEXIST, DCP_ENOMEM.
 *  - write_at and read_at transfer all n bytes or fail: there are no short
 *    counts. Interrupted and partial system calls are the back end's to
 *    retry. read_at that meets the end of the file fails with
 *    DCP_ECORRUPT ("truncated"), naming the file and the byte offset.
 *  - sync makes the file's data and size durable. A failed sync is final:
 *    dcp never calls sync again on that file and never trusts it; the save
 *    fails (PostgreSQL's lesson: after a failed fsync the state of the
 *    page cache is unknown).
 *  - close releases the handle whatever it returns; an error it returns (a
 *    deferred write error) fails the save. close_dir cannot fail.
 *  - rename replaces `to` by `from` atomically, both in dir (the commit
 *    point of a save is the rename of ".metadata.tmp" to ".metadata").
 *    sync_dir makes the directory's entries durable (creations, renames,
 *    removals).
 *  - dcp calls the members of one context from the thread that made the
 *    API call. Several contexts may share one back end from several
 *    threads: make impl thread safe, or give each context its own.
 *
 * The order in which dcp calls these members during a save is the commit
 * protocol of docs/FORMAT.md: every data file is written, synced and
 * closed on every rank; then rank 0 writes ".metadata.tmp", syncs and
 * closes it, renames it to ".metadata" and syncs the directory.
 */
#ifndef DCP_DCP_STORAGE_H
#define DCP_DCP_STORAGE_H

#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of struct dcp_storage_ops this header describes. */
#define DCP_STORAGE_OPS_VERSION 1

/* Where a back end records the detail of a failure (owned by dcp). */
struct dcp_err;

/*
 * A storage back end's operations. Set version = DCP_STORAGE_OPS_VERSION;
 * members are only ever appended, each group marked with the version it
 * appeared in, and dcp never calls a member newer than the version the
 * back end set. impl is the pointer given with the ops (see
 * dcp_ctx_set_storage), passed to every member.
 */
typedef struct dcp_storage_ops {
    uint32_t version;
    /* --- valid since version 1; all required --- */
    /* Creates directory path and its parents; an existing directory is
     * fine, an existing non-directory is DCP_EIO. */
    int (*mkdirs)(void *impl, const char *path, struct dcp_err *err);
    /* Opens directory path; DCP_ENOENT when it does not exist (the
     * message should say "checkpoint directory '<path>' does not exist"). */
    int (*open_dir)(void *impl, const char *path, void **dir,
                    struct dcp_err *err);
    void (*close_dir)(void *impl, void *dir);
    /* Creates name in dir, or truncates it, for writing. Must not follow a
     * symbolic link named name (DCP_EUNSAFE). */
    int (*create)(void *impl, void *dir, const char *name, void **file,
                  struct dcp_err *err);
    /* Opens name in dir for reading; *size receives its length in bytes.
     * Must not follow a symbolic link and must refuse anything but a
     * regular file (DCP_EUNSAFE): a checkpoint never reaches outside its
     * directory. */
    int (*open_read)(void *impl, void *dir, const char *name, void **file,
                     uint64_t *size, struct dcp_err *err);
    /* Writes n bytes at byte offset off; name is the file's, for messages. */
    int (*write_at)(void *impl, void *file, const char *name, const void *p,
                    size_t n, uint64_t off, struct dcp_err *err);
    /* Reads n bytes at byte offset off (DCP_ECORRUPT past the end). */
    int (*read_at)(void *impl, void *file, const char *name, void *p, size_t n,
                   uint64_t off, struct dcp_err *err);
    int (*sync)(void *impl, void *file, const char *name, struct dcp_err *err);
    int (*close)(void *impl, void *file, const char *name, struct dcp_err *err);
    int (*rename)(void *impl, void *dir, const char *from, const char *to,
                  struct dcp_err *err);
    /* path is the directory's, for messages. */
    int (*sync_dir)(void *impl, void *dir, const char *path,
                    struct dcp_err *err);
    /* Removes name from dir; a missing name is not an error. */
    int (*unlink)(void *impl, void *dir, const char *name, struct dcp_err *err);
    /* *found = 1 when name exists in dir (a symbolic link counts, without
     * being followed), 0 when it does not. */
    int (*exists)(void *impl, void *dir, const char *name, int *found,
                  struct dcp_err *err);
} dcp_storage_ops;

/*
 * The built-in POSIX back end: openat(2)-relative files opened with
 * O_NOFOLLOW, pread/pwrite loops (EINTR and partial transfers retried),
 * fsync(2), renameat(2), fsync of the directory. Its impl is NULL. The
 * returned table is static and lives forever. Thread safe.
 */
DCP_API const dcp_storage_ops *dcp_storage_posix(void);

/*
 * Records the detail of a failure for the API call that made the storage
 * call: code and a printf-style message (lowercase, no full stop, subject
 * quoted). Returns code, so a member can end with
 *     return dcp_storage_set_error(err, DCP_EIO, "cannot ... '%s': %s", ...);
 * err may be NULL (dcp then does not want the detail). Thread safe for
 * distinct err.
 */
DCP_API int dcp_storage_set_error(struct dcp_err *err, int code,
                                  const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/*
 * Makes ctx use the storage back end ops with instance impl for its next
 * calls (the same as setting dcp_ctx_options.storage and storage_impl at
 * creation). ops NULL restores the POSIX back end. ops is copied (it need
 * not outlive the call); impl must outlive the context's use of it.
 * Returns DCP_OK, DCP_EINVAL (ctx NULL, ops->version 0, a required member
 * NULL). Not collective; not thread safe (the context's rule).
 */
DCP_API int dcp_ctx_set_storage(dcp_ctx *ctx, const dcp_storage_ops *ops,
                                void *impl);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_STORAGE_H */
