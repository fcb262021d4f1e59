/*
 * faultfs: a storage back end for tests that wraps dcp's POSIX back end and
 * injects faults into the real code paths, at two levels:
 *  - operations (the dcp_storage_ops members dcp calls): fail the k-th
 *    operation with an error code, transiently (that one only) or
 *    persistently (it and every later one), or kill the process with
 *    SIGKILL right before it (a crash point);
 *  - system calls beneath the POSIX back end's retry loops (its syscall
 *    table): make the k-th call of a chosen kind fail with an errno, return
 *    EINTR, or transfer only part of its bytes (a short read or write that
 *    really happened).
 * It also records a trace of every operation (kind, name, result,
 * CLOCK_MONOTONIC time), for the commit-protocol checks, and watches for a
 * sync retried on a file whose sync failed.
 *
 * One faultfs is active per process at a time (the syscall hooks find it
 * through a global). dcp calls it from the caller's thread and from the
 * context's writer thread, never from both at once (the writer runs
 * between the save's collective steps, handed over through the worker's
 * queue), so its counters need no lock; each event records which thread
 * ran it.
 */
#ifndef DCP_FAULTFS_H
#define DCP_FAULTFS_H

#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "storage.h" /* struct dcp__posix_sys */

enum ff_op {
    FF_MKDIRS,
    FF_OPEN_DIR,
    FF_CLOSE_DIR,
    FF_CREATE,
    FF_OPEN_READ,
    FF_WRITE,
    FF_READ,
    FF_SYNC,
    FF_CLOSE,
    FF_RENAME,
    FF_SYNC_DIR,
    FF_UNLINK,
    FF_EXISTS,
    FF_NOPS
};

/* System calls of the POSIX back end, for syscall-level faults. */
enum ff_sys {
    FS_OPEN,
    FS_OPENAT,
    FS_MKDIR,
    FS_STAT,
    FS_FSTAT,
    FS_FSTATAT,
    FS_PREAD,
    FS_PWRITE,
    FS_FSYNC,
    FS_CLOSE,
    FS_RENAMEAT,
    FS_UNLINKAT,
    FS_NSYS
};

/* Ops that change the file system (crash points that matter). */
#define FF_MUTATING                                             \
    ((1u << FF_MKDIRS) | (1u << FF_CREATE) | (1u << FF_WRITE) | \
     (1u << FF_SYNC) | (1u << FF_CLOSE) | (1u << FF_RENAME) |   \
     (1u << FF_SYNC_DIR) | (1u << FF_UNLINK))

/* What to do at the k-th system call of a kind in sys_mask. */
enum ff_sys_fault {
    FFS_NONE = 0,
    FFS_ERRNO, /* fail with sys_errno, nothing done */
    FFS_EINTR, /* fail with EINTR, nothing done (the caller must retry) */
    FFS_SHORT  /* pread/pwrite: transfer half the bytes (at least 1) */
};

struct ff_event {
    enum ff_op op;
    char name[80];
    uint64_t off, len; /* write/read */
    int rc;
    int64_t t_ns; /* CLOCK_MONOTONIC */
    int worker;   /* not on the thread that called ff_init (dcp's writer) */
};

struct faultfs {
    /* ---- configuration (ff_init zeroes it: no faults) ---- */
    uint64_t fail_at;    /* 1-based operation index to fail; 0: none */
    int fail_persistent; /* fail every operation from fail_at on */
    int fail_code;       /* e.g. DCP_EIO, DCP_ENOSPC */
    unsigned fail_mask;  /* ops counted for fail_at/crash_at (0: all) */
    uint64_t crash_at;   /* SIGKILL before this operation; 0: none */
    /* Hang (sleep until killed) before the first operation of a kind in
     * hang_mask (bits of enum ff_op) whose name contains hang_name (NULL:
     * any): a rank that stops answering (tests/mpi/mpi_timeout.c). */
    unsigned hang_mask;
    const char *hang_name;
    uint64_t hang_skip; /* matching operations let through first */
    enum ff_sys_fault sys_fault;
    unsigned sys_mask; /* syscall kinds counted (bits of enum ff_sys) */
    uint64_t sys_at;   /* 1-based index among those; 0: none */
    int sys_persistent;
    int sys_errno;
    int tracing; /* record ff_event per operation */
    /* ---- state ---- */
    uint64_t nops; /* operations counted so far (fail_mask) */
    uint64_t nsys; /* syscalls counted so far (sys_mask) */
    uint64_t op_count[FF_NOPS];
    uint64_t injected; /* faults injected so far */
    int first_op;      /* kind of the first failed operation, or -1 */
    int first_sys;     /* kind of the first failed syscall, or -1 */
    int sync_retried;  /* a sync came again on a file whose sync failed */
    struct ff_event *trace;
    size_t ntrace, captrace;
    /* ---- internals ---- */
    struct dcp__posix_sys sys;
    int failed_sync_fd[64];
    size_t nfailed_sync;
    pthread_t owner; /* the thread that called ff_init */
};

/* Initialises f (no faults, no tracing) and makes it the active faultfs. */
void ff_init(struct faultfs *f);
/* Frees the trace; deactivates f. */
void ff_release(struct faultfs *f);
/* Clears counters, trace and configuration (keeps tracing as it was). */
void ff_reset(struct faultfs *f);
/* The operations; impl is the struct faultfs. */
const dcp_storage_ops *ff_ops(void);
const char *ff_op_name(enum ff_op op);

#endif /* DCP_FAULTFS_H */
