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
 *    point of a save is the rename of its temporary to ".metadata").
 *    sync_dir makes the directory's entries durable (creations, renames,
 *    removals).
 *  - dcp calls the members of one context from the thread that made the
 *    API call (or the context's writer thread for an async save, never
 *    both at once); read_at and write_at also from the I/O engine's
 *    threads when max_inflight > 1 (version 2). Several contexts may share
 *    one back end from several threads: make impl thread safe, or give
 *    each context its own.
 *
 * The order in which dcp calls these members during a save is the commit
 * protocol of docs/FORMAT.md: every data file is written, synced and
 * closed on every rank; then rank 0 publishes ".metadata" (see publish
 * below; on POSIX: writes a temporary unique to the call
 * (".metadata.<pid>-<n>-<random>.tmp"), syncs and closes it, renames it
 * to ".metadata" and syncs the directory).
 *
 * Version 2 (DCP_STORAGE_OPS_VERSION 2) appends what an object store and
 * the node-local and peer tiers need: concurrency (max_inflight), whole-
 * object writes (put), multipart writes (write_begin, write_complete,
 * write_abort), listing by prefix (list) and the commit primitive
 * (publish), which replaces rename + sync_dir as the way dcp commits. Every
 * version-2 member is optional: left NULL (or in a table that says
 * version 1), dcp serves it from the version-1 members, as described at
 * each member; a version-1 back end works unchanged. Today dcp calls
 * publish (every commit) and honours max_inflight (every data transfer);
 * put, the multipart members and list are there for the lifecycle work
 * (the lock, removing leftovers) and the object-store back ends (the
 * built-in S3 one, dcp_s3.h, implements every member), and
 * dcp's data files are still written with create, write_at, sync and
 * close, which is what the multipart adapter does. A back end that
 * cannot rename (an object store) implements publish and may give rename
 * and sync_dir that fail with DCP_ENOTSUP: dcp_save and dcp_import commit
 * only through publish and never call them (dcp_export still syncs the
 * directory of its output file through sync_dir).
 *
 * One writer per path is an exclusive publish: the coordinator of a save
 * or import publishes ".lock" (holding the holder's identity) with
 * DCP_PUBLISH_EXCLUSIVE (and DCP_PUBLISH_NOSYNC) before it plans, and
 * DCP_EEXIST means another writer holds the path (DCP_EBUSY for the
 * caller); the holder removes it with unlink after its commit or failure
 * (docs/FORMAT.md §5). Every back end that implements publish with a real
 * no-replace primitive (POSIX: link(2); S3: If-None-Match) excludes across
 * processes and nodes; the version-1 adapter cannot, and refuses an
 * exclusive publish with DCP_ENOTSUP: such a back end gets no lock (the
 * writer proceeds unexcluded). With list, the holder removes what
 * interrupted writers left (data files and temporaries no committed
 * .metadata names); without it (DCP_ENOTSUP) leftovers stay.
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
#define DCP_STORAGE_OPS_VERSION 2

/* Flags of publish (version 2). */
/* Fail with DCP_EEXIST, changing nothing, when name already exists. */
#define DCP_PUBLISH_EXCLUSIVE 0x1u
/* Visibility without durability: skip the syncs (a save made with
 * dcp_save_options.no_fsync, an import with DCP_CONVERT_NO_FSYNC). */
#define DCP_PUBLISH_NOSYNC 0x2u

/* Flags of write_complete (version 2). */
/* Skip the sync (as DCP_PUBLISH_NOSYNC). */
#define DCP_WRITE_NOSYNC 0x2u

/* The longest object name list returns, in bytes without the NUL. */
#define DCP_STORAGE_NAME_MAX 255

/* One object found by list (version 2). */
typedef struct dcp_storage_entry {
    char name[DCP_STORAGE_NAME_MAX + 1]; /* NUL-terminated, one component */
    uint64_t size;                       /* bytes */
} dcp_storage_entry;

/* Where a back end records the detail of a failure (owned by dcp). */
struct dcp_err;

/*
 * A storage back end's operations. Set version = DCP_STORAGE_OPS_VERSION
 * (or the version whose members the table fills: a table written for
 * version 1 says 1); members are only ever appended, each group marked
 * with the version it appeared in, and dcp never calls a member newer than
 * the version the back end set. Fill the table with designated
 * initializers (.create = my_create, ...): members appended later then
 * start NULL without a -Wmissing-field-initializers warning. impl is the
 * pointer given with the ops (see dcp_ctx_set_storage), passed to every
 * member.
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

    /* --- valid since version 2; each optional (NULL or 0: dcp serves it
     * from the version-1 members as said) --- */

    /* How many requests the back end serves at once. 0 or 1: one at a
     * time, from one thread at a time (the version-1 rule). N > 1: dcp's
     * I/O engine may call read_at and write_at from up to N threads at
     * once, on the same or different files, and the back end must be
     * thread safe for those (the other members keep the one-thread rule
     * of their context). The engine queues every request and keeps at
     * most min(N, its queue depth io_depth, 64) in flight; this is how a remote back
     * end gets the batching and parallelism the POSIX one gets from
     * io_uring. The POSIX back end says 1: it is driven through O_DIRECT
     * and io_uring on its descriptors instead. */
    uint32_t max_inflight;
    uint32_t reserved0; /* 0 */

    /* Writes the whole object name in dir with the n bytes at p, with
     * atomic visibility: a reader sees the old object (or none) or all n
     * bytes, never a part; the bytes are durable when it returns. Its
     * name is durable only after a later publish in dir (POSIX: the
     * directory sync). Replaces an existing object. NULL: dcp writes
     * "<name>.tmp" (create, write_at, sync, close) and renames it,
     * removing the temporary on failure. Returns DCP_OK or the code of
     * the failed step (DCP_ENOSPC, DCP_EIO, ...). */
    int (*put)(void *impl, void *dir, const char *name, const void *p,
               size_t n, struct dcp_err *err);

    /* Multipart write: write_begin starts object name in dir and hands
     * out *file; its bytes are then sent with write_at at any offsets, in
     * any order, concurrently up to max_inflight, each byte once (a part
     * is a write_at; a back end with a minimum part size buffers);
     * write_complete makes the object whole under name (durable unless
     * DCP_WRITE_NOSYNC) and releases *file whatever it returns;
     * write_abort discards it (name is then absent, or what it was before
     * write_begin where the back end can keep that) and releases *file; it
     * cannot fail. POSIX: create; write_at; fsync + close; close + unlink
     * (the name exists, growing, from write_begin on: on a file system an
     * object is visible before it is complete, which is why a checkpoint
     * is committed by publish, never by the presence of a data file).
     * NULL: create, sync + close, close + unlink. write_begin and
     * write_complete return DCP_OK or the back end's code (as create,
     * sync and close). Set all three or none (DCP_EINVAL otherwise). */
    int (*write_begin)(void *impl, void *dir, const char *name, void **file,
                       struct dcp_err *err);
    int (*write_complete)(void *impl, void *file, const char *name,
                          uint32_t flags, struct dcp_err *err);
    void (*write_abort)(void *impl, void *dir, void *file, const char *name);

    /* Lists the regular objects of dir whose names start with prefix (""
     * for all), with their sizes, in no particular order: at most max
     * entries into out[0..max), *count receiving how many. More than max
     * matches is DCP_ELIMIT (out then holds max of them, *count = max):
     * the listing is bounded, never an unbounded allocation. Names longer
     * than DCP_STORAGE_NAME_MAX are skipped; a symbolic link is not
     * followed and not listed, nor anything else that is not a regular
     * object. NULL: DCP_ENOTSUP (there is no version-1 equivalent).
     * Returns DCP_OK, DCP_ELIMIT, or the back end's code (DCP_EIO). */
    int (*list)(void *impl, void *dir, const char *prefix, size_t max,
                dcp_storage_entry *out, size_t *count, struct dcp_err *err);

    /* The commit primitive: makes the n bytes at p visible atomically
     * under name in dir, and durable with every object completed in dir
     * before it (unless DCP_PUBLISH_NOSYNC). A reader sees the old object
     * or the new one, never a part or neither. With DCP_PUBLISH_EXCLUSIVE
     * it fails with DCP_EEXIST, changing nothing, when name exists, and
     * that check and the publication are one atomic step against every
     * other writer. *visible receives 1 once the new object is visible
     * under name (a later failure, e.g. of the directory sync, leaves it
     * visible but maybe not durable), 0 before. On failure no temporary
     * object is left behind. POSIX: a temporary unique to the call
     * ("<name>.<pid>-<n>-<random>.tmp", so that two writers never share
     * it) created, written, fsync, close; renameat over name (exclusive:
     * linkat'ed to name, which fails with EEXIST, then unlinked); fsync
     * of the directory; on failure the temporary is unlinked. NULL: the
     * same sequence through create, write_at, sync, close, rename,
     * sync_dir and unlink (the calls and order of version 1, with the
     * unique temporary), and an exclusive publish is DCP_ENOTSUP, since rename
     * cannot refuse to replace. Returns DCP_OK, DCP_EEXIST (exclusive,
     * name exists), DCP_ENOTSUP (exclusive where the back end or file
     * system has no no-replace primitive: POSIX without hard links),
     * DCP_EINVAL (name too long for the temporary), or the code of the
     * failed step. */
    int (*publish)(void *impl, void *dir, const char *path, const char *name,
                   const void *p, size_t n, uint32_t flags, int *visible,
                   struct dcp_err *err);
} dcp_storage_ops;

/*
 * The built-in POSIX back end (version 2, every member set): openat(2)-
 * relative files opened with O_NOFOLLOW, pread/pwrite loops (EINTR and
 * partial transfers retried), fsync(2), renameat(2), fsync of the
 * directory; publish as described there (linkat(2) for an exclusive one),
 * list through readdir(3) and fstatat(2). max_inflight is 1: dcp drives
 * its files with O_DIRECT and io_uring. Its impl is NULL. The returned
 * table is static and lives forever. Thread safe.
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
 * NULL: every version-1 member is required, every version-2 one optional;
 * a table of a version above DCP_STORAGE_OPS_VERSION is read as this
 * version's prefix; only one of write_begin, write_complete, write_abort
 * set, or reserved0 not 0). Not collective; not thread safe (the context's rule).
 */
DCP_API int dcp_ctx_set_storage(dcp_ctx *ctx, const dcp_storage_ops *ops,
                                void *impl);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_STORAGE_H */
