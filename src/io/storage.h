/*
 * Storage: the one place every file operation of save and load goes
 * through, dispatched to the context's back end (dcp_storage.h; POSIX by
 * default, fs_posix.c), so tracing and fault injection see the real code
 * paths.
 *
 * Callers hold int handles for directories and files (dirfd, fd), as they
 * would POSIX descriptors; a handle records the back end that opened it, so
 * every operation on it reaches the same back end from any thread. Handles
 * are numbered from DCP__HANDLE_BASE up, far above any real descriptor, so
 * one mistakenly passed to close(2) fails with EBADF instead of closing an
 * unrelated file: release them with dcp__fs_close or dcp__fs_release.
 *
 * The file operations also take a plain POSIX descriptor (below
 * DCP__HANDLE_BASE), served by the POSIX back end with the real system
 * calls: the single files that dcp_export, dcp_import and dcp_load_file
 * open by path (outside any checkpoint directory, following symbolic links
 * as the user's path asks) go through the same read/write/sync code.
 *
 * The I/O engine (ioengine.h) needs real descriptors for O_DIRECT and
 * io_uring: dcp__fs_raw_fd gives the descriptor behind a handle of the
 * built-in POSIX back end, and the engine goes through the back end's
 * read_at/write_at for any other.
 *
 * The two operations that start from a path (dcp__fs_mkdirs and
 * dcp__fs_open_dir) use the calling thread's current back end, which every
 * API call sets from its context on entry (dcp__ctx_begin calls
 * dcp__storage_use); a background thread working for a context calls
 * dcp__storage_use itself.
 *
 * Contracts (the back end's, dcp_storage.h): files are opened relative to
 * the checkpoint directory by single-component names without following
 * symbolic links; reads and writes complete fully or fail; a short read at
 * end of file is DCP_ECORRUPT (truncated); a failed fsync is never retried.
 */
#ifndef DCP_STORAGE_H
#define DCP_STORAGE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>  /* struct stat, mode_t */
#include <sys/types.h> /* ssize_t, off_t */

#include "dcp/dcp_storage.h"
#include "util.h"

/* Creates path and its parents (mode 0755); an existing directory is fine. */
int dcp__fs_mkdirs(const char *path, struct dcp_err *err);

/* Opens a directory; DCP_ENOENT if missing, DCP_EIO otherwise. */
int dcp__fs_open_dir(const char *path, int *dirfd, struct dcp_err *err);

/* Creates or truncates name in dirfd for writing. */
int dcp__fs_create(int dirfd, const char *name, int *fd, struct dcp_err *err);

/* Opens a regular file for reading; *size receives its length. */
int dcp__fs_open_read(int dirfd, const char *name, int *fd, uint64_t *size,
                      struct dcp_err *err);

int dcp__fs_pwrite(int fd, const void *p, size_t n, uint64_t off,
                   const char *name, struct dcp_err *err);
int dcp__fs_pread(int fd, void *p, size_t n, uint64_t off, const char *name,
                  struct dcp_err *err);
int dcp__fs_fsync(int fd, const char *name, struct dcp_err *err);
/* Closes a file or directory handle, reporting a file's close error (a
 * deferred write error shows up there). The handle is gone either way. */
int dcp__fs_close(int fd, const char *name, struct dcp_err *err);
int dcp__fs_rename(int dirfd, const char *from, const char *to,
                   struct dcp_err *err);
int dcp__fs_fsync_dir(int dirfd, const char *path, struct dcp_err *err);
/* Unlinks name; a missing file is not an error. */
int dcp__fs_unlink(int dirfd, const char *name, struct dcp_err *err);
/* 1 if name exists in dirfd (without following a final symlink), or if
 * that cannot be determined (an I/O error); 0 if it does not exist. */
int dcp__fs_exists(int dirfd, const char *name);
/* Whether name exists in dirfd, *found 1 or 0; an error that leaves it
 * unknown is returned (the back end's code, message in err) with *found
 * 1. */
int dcp__fs_exists_err(int dirfd, const char *name, int *found,
                       struct dcp_err *err);

/* ---- version 2 of the contract (dcp_storage.h), served from the
 * version-1 members where the back end leaves a member NULL ---- */

/* How many read_at/write_at calls the back end of handle fd (a file or a
 * directory) accepts at once (>= 1; 1 for a plain descriptor or a
 * version-1 back end). */
uint32_t dcp__fs_max_inflight(int fd);

/* Writes the whole object name in dirfd, atomically visible (put). */
int dcp__fs_put(int dirfd, const char *name, const void *p, size_t n,
                struct dcp_err *err);

/* Multipart write: begin hands out a file handle for dcp__fs_pwrite at any
 * offsets; complete (flags DCP_WRITE_NOSYNC) or abort releases it. */
int dcp__fs_write_begin(int dirfd, const char *name, int *fd,
                        struct dcp_err *err);
int dcp__fs_write_complete(int fd, const char *name, uint32_t flags,
                           struct dcp_err *err);
void dcp__fs_write_abort(int dirfd, int fd, const char *name);

/* Lists the regular objects of dirfd whose names start with prefix: at most
 * max into out, sorted by name; DCP_ELIMIT when more match; DCP_ENOTSUP
 * when the back end cannot list. Entries the back end returns malformed
 * (not NUL-terminated, holding '/', not matching prefix) are DCP_EIO. */
int dcp__fs_list(int dirfd, const char *prefix, size_t max,
                 dcp_storage_entry *out, size_t *count, struct dcp_err *err);

/*
 * Aborts the writes in progress in directory dirfd that a killed writer
 * left: on an object store, the incomplete multipart uploads of objects
 * directly in the directory whose names leftover() accepts (they hold
 * storage but are no object; S3 keeps them until aborted). Other back
 * ends have none: DCP_OK with *n 0. Call with the directory's lock held.
 * *n: uploads aborted. Returns DCP_OK or the listing's or an abort's
 * failure.
 */
int dcp__fs_abort_uploads(int dirfd, int (*leftover)(const char *name),
                          uint64_t *n, struct dcp_err *err);

/* Lists the immediate subdirectories of dirfd whose names start with
 * prefix (on S3: the distinct first components of the keys below the
 * directory that go deeper), at most max into out (size 0), sorted by
 * name, each once; DCP_ELIMIT when more match. Only the S3 back end lists
 * directories: DCP_ENOTSUP on any other (the manager reads POSIX
 * directories itself). */
int dcp__fs_list_dirs(int dirfd, const char *prefix, size_t max,
                      dcp_storage_entry *out, size_t *count,
                      struct dcp_err *err);

/* Publishes the n bytes at p as name in dirfd (path: the directory's, for
 * messages), the commit primitive of dcp_storage.h: flags
 * DCP_PUBLISH_EXCLUSIVE, DCP_PUBLISH_NOSYNC; *visible set to 1 once the
 * object is visible under name. */
int dcp__fs_publish(int dirfd, const char *path, const char *name,
                    const void *p, size_t n, uint32_t flags, int *visible,
                    struct dcp_err *err);

/* A temporary name unique to the call, for publishing name:
 * "<name>.<pid>-<n>-<8 random hex>.tmp" (DCP_EINVAL when longer than
 * DCP_STORAGE_NAME_MAX or cap - 1). Used by every publish, so that two
 * writers never share a temporary (not even on a back end without the
 * lock). Thread safe. */
int dcp__unique_tmp(char *buf, size_t cap, const char *name,
                    struct dcp_err *err);

/* A hint that len bytes at off of file handle fd will be read soon (a
 * stored record's zip directory and headers): the S3 back end fetches the
 * hinted ranges together, in parallel, at the next small read; other back
 * ends ignore it (POSIX gets posix_fadvise from the caller instead). */
void dcp__fs_hint(int fd, uint64_t off, uint64_t len);

/* Whether the back end of handle fd (a file or a directory) takes hints
 * (S3): a reader then hints the records it reads whole, not only their
 * headers, and bounds the bytes hinted at once (fetched ranges are held
 * until dropped). */
int dcp__fs_takes_hints(int fd);

/* Drops the hinted ranges of file handle fd, fetched or not (their
 * memory); later reads go to the back end. No-op for other back ends. */
void dcp__fs_hint_drop(int fd);

/* Closes a file or directory handle on an error path, ignoring errors;
 * -1 is a no-op. */
void dcp__fs_release(int fd);

/* The real descriptor behind fd when the built-in POSIX back end, with the
 * real system calls, serves it (fd itself for a plain descriptor); -1 for
 * a handle of any other back end. */
int dcp__fs_raw_fd(int fd);

/* Reads a whole file of at most max bytes (DCP_ELIMIT beyond). *out is
 * freed with dcp__free. */
int dcp__fs_read_all(int dirfd, const char *name, uint64_t max, uint8_t **out,
                     size_t *len, struct dcp_err *err);

/* Reads a whole file of at most cap bytes into buf (DCP_ELIMIT beyond),
 * its length in *len. Allocates nothing on the POSIX back end; one GET on
 * S3. */
int dcp__fs_read_into(int dirfd, const char *name, void *buf, size_t cap,
                      size_t *len, struct dcp_err *err);

/* ----------------------------------------------------- back ends */

#define DCP__HANDLE_BASE (1 << 28)

/* A back end as a context holds it: a copy of the ops and the instance. */
struct dcp__storage {
    dcp_storage_ops ops;
    void *impl;
};

/* The POSIX back end with the real system calls (fs_posix.c), and its
 * handle for a descriptor and back. */
extern const struct dcp__storage dcp__posix_storage;
void *dcp__posix_handle(int fd);
int dcp__posix_fd(void *h);

/* The S3 back end (fs_s3.c): every path that starts with "s3://" is its,
 * whatever the thread's current back end (dcp__fs_mkdirs,
 * dcp__fs_open_dir); built as a stub that refuses with DCP_ENOTSUP
 * without libcurl and libcrypto. dcp__s3_max_inflight is its max_inflight
 * as dcp_s3_configure set it. */
extern const struct dcp__storage dcp__s3_storage;
int dcp__path_is_s3(const char *path);
uint32_t dcp__s3_max_inflight(void);
/* The S3 back end's prefetch hint for a file it opened for reading. */
void dcp__s3_hint(void *file, uint64_t off, uint64_t len);
void dcp__s3_hint_drop(void *file);
/* dcp__fs_read_all of an S3 directory handle: one bounded GET. */
int dcp__s3_read_all(void *dir, const char *name, uint64_t max, uint8_t **out,
                     size_t *len, struct dcp_err *err);
/* dcp__fs_list_dirs of an S3 directory handle (unsorted). */
int dcp__s3_list_dirs(void *dir, const char *prefix, size_t max,
                      dcp_storage_entry *out, size_t *count,
                      struct dcp_err *err);

/* The S3 back end's half of dcp__fs_abort_uploads. */
int dcp__s3_abort_uploads(void *dir, int (*leftover)(const char *name),
                          uint64_t *n, struct dcp_err *err);

/* Validates and copies ops into s (ops NULL: the POSIX back end).
 * Returns DCP_OK or DCP_EINVAL. */
int dcp__storage_init(struct dcp__storage *s, const dcp_storage_ops *ops,
                      void *impl);

/* Makes s (NULL: POSIX) the calling thread's current back end; s must stay
 * valid while it is current. */
void dcp__storage_use(const struct dcp__storage *s);

/* If s is the calling thread's current back end, makes POSIX current (for
 * a context being freed). */
void dcp__storage_forget(const struct dcp__storage *s);

/* Number of handles open now, in the whole process (leak checks). */
size_t dcp__fs_open_handles(void);

/*
 * The system calls of the POSIX back end, replaceable for fault-injection
 * tests, after SQLite's unix VFS syscall table: pass a table (every member
 * set; dcp__posix_sys_default() gives the real ones to start from) as the
 * impl of dcp_storage_posix()'s ops. Each member behaves as its namesake,
 * returning -1 with errno set on failure.
 */
struct dcp__posix_sys {
    int (*open)(const char *path, int flags);
    int (*openat)(int dirfd, const char *name, int flags, mode_t mode);
    int (*mkdir)(const char *path, mode_t mode);
    int (*stat)(const char *path, struct stat *sb);
    int (*fstat)(int fd, struct stat *sb);
    int (*fstatat)(int dirfd, const char *name, struct stat *sb, int flags);
    ssize_t (*pread)(int fd, void *p, size_t n, off_t off);
    ssize_t (*pwrite)(int fd, const void *p, size_t n, off_t off);
    int (*fsync)(int fd);
    int (*close)(int fd);
    int (*renameat)(int olddirfd, const char *from, int newdirfd,
                    const char *to);
    int (*unlinkat)(int dirfd, const char *name, int flags);
    /* Appended (exclusive publish); NULL in an older table: linkat(2). */
    int (*linkat)(int olddirfd, const char *from, int newdirfd,
                  const char *to, int flags);
};

const struct dcp__posix_sys *dcp__posix_sys_default(void);

#endif /* DCP_STORAGE_H */
