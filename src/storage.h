/*
 * Storage: the POSIX file operations save and load use, in one place (for
 * tracing and fault injection later). Files are always opened relative to
 * the checkpoint directory's descriptor, by single-component names, with
 * O_NOFOLLOW: a data file can never resolve outside the checkpoint.
 * Reads and writes complete fully or fail; EINTR is retried; a short read
 * at end of file is DCP_ECORRUPT (truncated).
 */
#ifndef DCP_STORAGE_H
#define DCP_STORAGE_H

#include <stddef.h>
#include <stdint.h>

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
/* close(2), reporting its error (a deferred write error shows up there). */
int dcp__fs_close(int fd, const char *name, struct dcp_err *err);
int dcp__fs_rename(int dirfd, const char *from, const char *to,
                   struct dcp_err *err);
int dcp__fs_fsync_dir(int dirfd, const char *path, struct dcp_err *err);
/* Unlinks name; a missing file is not an error. */
int dcp__fs_unlink(int dirfd, const char *name, struct dcp_err *err);
/* 1 if name exists in dirfd (without following a final symlink). */
int dcp__fs_exists(int dirfd, const char *name);

/* Reads a whole file of at most max bytes (DCP_ELIMIT beyond). *out is
 * freed with dcp__free. */
int dcp__fs_read_all(int dirfd, const char *name, uint64_t max, uint8_t **out,
                     size_t *len, struct dcp_err *err);

#endif /* DCP_STORAGE_H */
