/*
 * dcp: distributed checkpointing of sharded tensors, in PyTorch DCP's
 * on-disk format (torch.distributed.checkpoint, FileSystemWriter layout).
 *
 * This header is the reference manual. It does not include <mpi.h>: the MPI
 * entry points live in dcp_mpi.h, so programs that never use MPI (the CLI,
 * fuzzers, single-process tools) need no MPI at all.
 *
 * Conventions, for every function below unless its comment says otherwise:
 *  - Fallible functions return int: DCP_OK (0) or a negative DCP_E* code.
 *    Results come back through out-parameters, which are set to NULL/0 on
 *    failure. dcp_strerror() gives a static text for a code; dcp_errmsg()
 *    gives the detail of the last failed call on a context (file, key, rank,
 *    byte offset).
 *  - The library never prints, exits or aborts.
 *  - Handles (dcp_ctx, dcp_state, dcp_value, dcp_metadata) are not thread
 *    safe: use one handle from one thread at a time. Different handles may be
 *    used from different threads at once.
 *  - dcp_*_free(NULL) is a no-op.
 *  - "Collective" means every rank of the context's communicator must call
 *    the function, in the same order, with compatible arguments; every rank
 *    returns the same result code.
 */
#ifndef DCP_DCP_H
#define DCP_DCP_H

#include <stddef.h>
#include <stdint.h>

#include "dcp_version.h"

#ifdef __cplusplus
extern "C" {
#endif

#if defined(DCP_BUILDING_LIBRARY) && defined(__GNUC__)
#define DCP_API __attribute__((visibility("default")))
#else
#define DCP_API
#endif

/* ---------------------------------------------------------------------- */
/* Errors                                                                 */
/* ---------------------------------------------------------------------- */

/*
 * Every error code, with its static description. Values are fixed forever
 * and never reused.
 */
#define DCP_ERRNO_MAP(XX)                                                      \
    XX(EINVAL, -1, "invalid argument")                                         \
    XX(ENOMEM, -2, "out of memory")                                            \
    XX(EIO, -3, "input/output error")                                          \
    XX(ENOENT, -4, "no such file or directory")                                \
    XX(EFORMAT, -5, "malformed checkpoint")                                    \
    XX(EUNSAFE, -6, "refused unsafe input")                                    \
    XX(ECORRUPT, -7, "checksum mismatch or truncated data")                    \
    XX(EKEY, -8, "missing or unexpected key")                                  \
    XX(EMISMATCH, -9, "shape or dtype mismatch")                               \
    XX(ELIMIT, -10, "input exceeds a configured limit")                        \
    XX(EPEER, -11, "another rank failed")                                      \
    XX(ENOTSUP, -12, "not supported")                                          \
    XX(ENOSPC, -13, "no space left on device")                                 \
    XX(EEXIST, -14, "already exists")                                          \
    XX(ETIMEOUT, -15, "timed out")                                             \
    XX(EBUSY, -16, "resource busy")                                            \
    XX(EPLAN, -17, "invalid save plan")

enum dcp_error {
    DCP_OK = 0,
#define DCP_XX_ENUM(name, val, text) DCP_##name = (val),
    DCP_ERRNO_MAP(DCP_XX_ENUM)
#undef DCP_XX_ENUM
};

/* Static text for an error code ("unknown error" for unknown codes). */
DCP_API const char *dcp_strerror(int code);

/* Symbolic name of an error code, e.g. "DCP_EFORMAT". */
DCP_API const char *dcp_err_name(int code);

/* Library version as DCP_VERSION_NUMBER computes it, and as a string. */
DCP_API unsigned dcp_version_number(void);
DCP_API const char *dcp_version_string(void);

/* Frees memory that a dcp function handed to the caller (documented there). */
DCP_API void dcp_free(void *p);

/* ---------------------------------------------------------------------- */
/* Element types                                                          */
/* ---------------------------------------------------------------------- */

/*
 * Tensor element types: every dtype torch 2.13 can put in a DCP checkpoint
 * (torch names in dcp_dtype_name). Values are fixed forever; 13 and up
 * were appended after 0.1.0 (an older library returns 0 from
 * dcp_dtype_size for them). Multi-byte elements are little-endian.
 * Complex dtypes hold the real part first, then the imaginary part;
 * DCP_C32 is torch.complex32 (two float16), DCP_C64 two float32, DCP_C128
 * two float64. The float8 "fnuz" types have no infinity, no -0 and one NaN
 * (0x80); float8_e8m0fnu is an exponent only (2^(x-127), 0xFF NaN);
 * float4_e2m1fn_x2 packs two 4-bit floats in a byte and is loaded and saved
 * as bytes but never converted (torch does not convert it either).
 * Conversions (DCP_LOAD_CAST, dcp_convert_elements, export --dtype) are
 * torch's Tensor.to() on the CPU, bit for bit: see docs/FORMAT.md.
 */
typedef enum dcp_dtype {
    DCP_F64 = 1,
    DCP_F32 = 2,
    DCP_F16 = 3,
    DCP_BF16 = 4,
    DCP_F8_E4M3FN = 5,
    DCP_F8_E5M2 = 6,
    DCP_I64 = 7,
    DCP_I32 = 8,
    DCP_I16 = 9,
    DCP_I8 = 10,
    DCP_U8 = 11,
    DCP_BOOL = 12,
    DCP_C32 = 13,          /* complex32 (torch.chalf) */
    DCP_C64 = 14,          /* complex64 (torch.cfloat) */
    DCP_C128 = 15,         /* complex128 (torch.cdouble) */
    DCP_U16 = 16,          /* uint16 */
    DCP_U32 = 17,          /* uint32 */
    DCP_U64 = 18,          /* uint64 */
    DCP_F8_E4M3FNUZ = 19,  /* float8_e4m3fnuz */
    DCP_F8_E5M2FNUZ = 20,  /* float8_e5m2fnuz */
    DCP_F8_E8M0FNU = 21,   /* float8_e8m0fnu (MX block scales) */
    DCP_F4_E2M1FN_X2 = 22  /* float4_e2m1fn_x2 (bytes only) */
} dcp_dtype;

/* Bytes per element, or 0 for an unknown dtype. */
DCP_API size_t dcp_dtype_size(dcp_dtype dt);

/* PyTorch name without the "torch." prefix ("float32", "bfloat16", ...), or
 * NULL for an unknown dtype. */
DCP_API const char *dcp_dtype_name(dcp_dtype dt);

/* Parses a PyTorch dtype name ("float32" or "torch.float32"; torch's other
 * names half, float, double, long, int, short, chalf, cfloat, cdouble; the
 * short names f32, bf16, fp16, u16, c64, f8e4m3, f8e8m0, ...). Returns
 * DCP_OK or DCP_EINVAL (unknown name, or a NULL argument). Thread-safe. */
DCP_API int dcp_dtype_from_name(const char *name, dcp_dtype *out);

/* Largest number of tensor dimensions dcp accepts. */
#define DCP_MAX_NDIM 8

/* Bytes dcp_shape_format needs for any shape of up to DCP_MAX_NDIM
 * dimensions, the terminating NUL included. */
#define DCP_SHAPE_TEXT_MAX (2 + 21 * DCP_MAX_NDIM)

/*
 * Writes a shape as dcp prints it, "[4,1024]" ("[]" for 0 dimensions),
 * into buf, cap bytes, always NUL-terminated when cap > 0.
 *  - shape: ndim sizes (may be NULL when ndim is 0).
 * Returns DCP_OK; DCP_ELIMIT when cap is too small (buf holds as much of
 * the text as fits); DCP_EINVAL for a NULL buf or cap 0, ndim outside
 * 0..DCP_MAX_NDIM, or a NULL shape (buf is then "" when it can be). Thread
 * safe; not collective.
 */
DCP_API int dcp_shape_format(char *buf, size_t cap, int ndim,
                             const int64_t *shape);

/*
 * Where a tensor buffer lives.
 *  - DCP_MEM_HOST: ordinary host memory.
 *  - DCP_MEM_CUDA: CUDA device memory (any device; managed memory too),
 *    addressed with unified virtual addressing. dcp never dereferences such
 *    a pointer on the host: a save copies it device to host with
 *    cudaMemcpyAsync on the legacy default stream into page-locked staging
 *    buffers, a load copies host to device with cudaMemcpy. libcudart is
 *    opened at run time with dlopen (the library itself needs no CUDA to
 *    build or run): the environment variable DCP_CUDART names the library
 *    file to open, otherwise libcudart.so, then libcudart.so.13, .so.12 and
 *    .so.11.0 are tried. A save or load of a state with CUDA entries fails
 *    with DCP_ENOTSUP, naming the key and what was tried, when none opens.
 *    Work other streams issue on the buffers must be complete (synchronise
 *    them) before the save or load is called.
 */
typedef enum dcp_mem {
    DCP_MEM_HOST = 0,
    DCP_MEM_CUDA = 1
} dcp_mem;

/* ---------------------------------------------------------------------- */
/* Context                                                                */
/* ---------------------------------------------------------------------- */

typedef struct dcp_ctx dcp_ctx;

/*
 * A communicator: how the ranks of a job talk during dcp_save and dcp_load.
 * Made by dcp_comm_mpi (dcp_mpi.h) or, for any other transport,
 * dcp_comm_create (dcp_comm.h). NULL everywhere a dcp_comm is taken means a
 * single process (rank 0 of 1).
 */
typedef struct dcp_comm dcp_comm;

/*
 * Frees a communicator made by dcp_comm_mpi or dcp_comm_create, calling its
 * destroy operation (for MPI: MPI_Comm_free of dcp's duplicate, so call it
 * before MPI_Finalize, on every rank, as MPI requires). Every context
 * created with it must be freed first. NULL is a no-op.
 */
DCP_API void dcp_comm_free(dcp_comm *comm);

/*
 * Where this rank's part of an uneven 1-D array lies in the global array,
 * the array being the concatenation of every rank's part in rank order
 * (particles, samples, tokens: each rank holds local_len elements, any
 * number, zero included). *global_off receives the sum of local_len over
 * the lower ranks (an exclusive prefix sum), *global_len the sum over all
 * ranks; pass them as the offset and global shape of
 * dcp_state_add_tensor:
 *     dcp_uneven_1d(comm, n, &off, &total);
 *     dcp_state_add_tensor(st, "particles.x", DCP_F64, 1, &total, &off,
 *                          &n, x, DCP_MEM_HOST);
 * For a load on another number of ranks, call it with the lengths the new
 * ranks want (summing to the saved total). comm NULL: a single process
 * (*global_off = 0, *global_len = local_len).
 * Collective over comm (three small collectives; rank 0 holds 40 bytes per
 * rank for the call); every rank returns the same code: DCP_OK, DCP_EINVAL
 * (a rank passed local_len < 0 or a NULL output), DCP_ELIMIT (the total
 * exceeds INT64_MAX), DCP_ENOMEM (on rank 0), or the communicator's error
 * (DCP_ETIMEOUT, ...). On failure the outputs (when not NULL) are 0.
 * Thread safety: as any call on comm (one collective at a time).
 */
DCP_API int dcp_uneven_1d(dcp_comm *comm, int64_t local_len,
                          int64_t *global_off, int64_t *global_len);

/*
 * I/O engine flags (dcp_ctx_options.io_flags). By default data files are
 * written and read with O_DIRECT where the filesystem allows it (buffered
 * I/O otherwise, chosen per file), through io_uring with several requests
 * in flight where the kernel allows it (one synchronous request at a time
 * otherwise); dcp_ctx_io_report says what was used and why.
 */
enum dcp_io_flags {
    /* Never O_DIRECT: every data file goes through the page cache. */
    DCP_IO_NO_DIRECT = 1 << 0,
    /* Never io_uring: synchronous pread/pwrite, one request at a time. */
    DCP_IO_NO_URING = 1 << 1
};

/*
 * Context options. Zero-initialise, set struct_size = sizeof(dcp_ctx_options),
 * then set what you need; a zero field means its default. Fields are only
 * ever appended; a caller built against an older header passes a smaller
 * struct_size and gets the defaults for the fields it does not know.
 */
typedef struct dcp_ctx_options {
    uint32_t struct_size;
    /* Bound on the size of a .metadata file read (default 4 GiB). */
    uint64_t max_metadata_bytes;
    /* Bound on the size of one pickled value read (default 64 MiB). */
    uint64_t max_value_bytes;
    /*
     * Largest number of bytes of host staging buffers the context may hold
     * (dcp_save_async copies the state into them; CUDA tensors pass through
     * them). 0 (the default): as much as the largest save needs, the whole
     * state of this rank. Below the state's size, staging proceeds in pieces
     * as the background writer drains them (see dcp_save_async). At least
     * 64 KiB (DCP_EINVAL otherwise). Read when struct_size covers it.
     * (Besides the staging buffers, a save or load uses the context's I/O
     * buffers: io_depth x io_block_bytes, below.)
     */
    uint64_t staging_budget;
    /* enum dcp_io_flags (default 0). */
    uint32_t io_flags;
    /* Requests in flight per rank (at most 64; default: 8, or as many as
     * the storage back end of the first save or load takes when more:
     * 16 for S3, dcp_s3_config.max_inflight). */
    uint32_t io_depth;
    /* Bytes per request and per I/O buffer (default 4 MiB; a multiple of
     * 4096 from 64 KiB to 64 MiB). The context keeps io_depth such buffers
     * (32 MiB with the default depth of 8; 64 MiB when the first save or
     * load was on S3) once a save or load has used them, for the next
     * one; they are freed with the context. */
    uint32_t io_block_bytes;
    /* Storage back end (dcp_storage.h) and its instance; NULL storage: the
     * POSIX back end. The ops are copied; storage_impl must outlive the
     * context. */
    const struct dcp_storage_ops *storage;
    void *storage_impl;
    /*
     * Niceness added to the context's background writer thread, the one
     * that writes dcp_save_async's files (0 to 19; default 0: the
     * caller's). On Linux a thread's niceness is its own: above 0 the
     * writer yields the CPU to the program's threads (a training loop, or
     * other ranks on the same cores still copying their state) and takes
     * what they leave; its writes may take longer when the cores are
     * busy. It is set once, when the thread starts (at the first
     * asynchronous save), and cannot be lowered again without privilege.
     * Outside 0..19: DCP_EINVAL. Read when struct_size covers it.
     */
    int32_t worker_nice;
} dcp_ctx_options;

/*
 * Creates a context: the limits, the error message, cached buffers and the
 * communicator used by save and load.
 *  - comm: the communicator, or NULL for a single process (rank 0 of 1). The
 *    context borrows it: it must outlive the context. Several contexts may
 *    share one communicator as long as their collective calls do not
 *    interleave (one thread, or calls in the same order on every rank).
 *  - opts: NULL for defaults.
 * Returns DCP_OK, DCP_EINVAL (bad options, an invalid storage back end),
 * DCP_ENOMEM. Not collective (no communication happens).
 */
DCP_API int dcp_ctx_create(dcp_ctx **out, dcp_comm *comm,
                           const dcp_ctx_options *opts);

/*
 * Frees a context and everything it owns: its staging buffers, its
 * background writer thread (joined). Not collective. A save still in flight
 * (dcp_save_async without a completed dcp_request_wait) is abandoned: its
 * background writing is stopped, this rank's new data file is removed and
 * nothing is committed; the request stays valid, and dcp_request_wait on it
 * returns DCP_EINVAL ("context freed while the save was in flight"). Free
 * the context on every rank alike, or other ranks waiting on the save hang.
 */
DCP_API void dcp_ctx_free(dcp_ctx *ctx);

/*
 * Detail of the last failed call made with this context (names the file,
 * key, rank or byte offset), or "" when none failed. Owned by the context,
 * valid until the next call that takes it.
 */
DCP_API const char *dcp_errmsg(const dcp_ctx *ctx);

/* This process's rank and the world size of the context's communicator. */
DCP_API int dcp_ctx_rank(const dcp_ctx *ctx);
DCP_API int dcp_ctx_size(const dcp_ctx *ctx);

/*
 * Bytes of host staging buffers the context holds now (allocated at the
 * first save that needs them, reused by later ones, released by
 * dcp_ctx_free); never more than the staging_budget option when one is
 * set. Not collective.
 */
DCP_API uint64_t dcp_ctx_staging_bytes(const dcp_ctx *ctx);
/*
 * 1 when this rank's last save on ctx (op DCP_IO_SAVE: dcp_save or
 * dcp_save_async) reused the plan of the save before it instead of
 * planning (see "Plan cache" at dcp_save), or its last dcp_load (op
 * DCP_IO_LOAD) reused the checked .metadata of the load before it (see
 * "Plan cache" at dcp_load); the same answer on every rank. 0 when it
 * planned, failed before deciding, or none ran yet; 0 for a NULL ctx or
 * an unknown op. Not collective.
 */
DCP_API int dcp_ctx_plan_cached(const dcp_ctx *ctx, int op);

/* Which operation dcp_ctx_io_report describes. */
enum dcp_io_op { DCP_IO_SAVE = 0, DCP_IO_LOAD = 1 };

/* What the last save or load did with the data files, on this rank. */
typedef struct dcp_io_report {
    uint32_t struct_size;
    /* 1: every data file this rank touched used O_DIRECT; 0: at least one
     * went through the page cache (see fallback); -1: none touched. */
    int direct;
    /* 1: io_uring; 0: synchronous pread/pwrite (see fallback); -1: unused. */
    int uring;
    /* Why O_DIRECT or io_uring was not used ("" when both were), e.g.
     * "'__0_0.distcp': O_DIRECT refused (Invalid argument): buffered I/O". */
    char fallback[256];
    uint64_t bytes;           /* data-file bytes written or read */
    uint64_t zero_copy_bytes; /* tensor bytes moved between the caller's
                                 buffers and the files without a copy in dcp
                                 (the kernel copies when buffered) */
    uint64_t bounce_bytes;    /* bytes copied through dcp's I/O buffers
                                 (zip headers, unaligned tensor data) */
    uint64_t requests;        /* I/O requests issued */
    uint32_t max_in_flight;   /* most requests in flight at once */
    uint32_t files;           /* data files written or read (a load from
                                 S3 counts a file once per round of
                                 about 128 MiB that reads from it) */
    uint64_t buffer_bytes;    /* I/O buffer memory the context holds */
} dcp_io_report;

/*
 * Fills *out (whose struct_size the caller sets to sizeof(dcp_io_report))
 * with the report of this rank's last dcp_save (op DCP_IO_SAVE) or
 * dcp_load (DCP_IO_LOAD) on ctx; all zero but direct = uring = -1 before
 * the first one. Returns DCP_OK or DCP_EINVAL (NULL arguments, unknown op,
 * struct_size too small). Not collective.
 */
DCP_API int dcp_ctx_io_report(const dcp_ctx *ctx, int op, dcp_io_report *out);

/*
 * Phases of a save and of a load, for dcp_ctx_phase_report and the event
 * callback. Values are fixed; new phases are appended.
 *  save: PLAN   stateful callbacks, local plans, the global plan on rank 0,
 *               the assignments scattered (caller's thread);
 *        STAGE  tensors copied into the staging buffers (caller's thread;
 *               an async save's tensors, a sync save's CUDA tensors);
 *        WRITE  this rank's data file written (the writer thread);
 *        FSYNC  the data file synced and closed (the writer thread);
 *        AGREE  the ranks agree on the outcome, results gathered;
 *        COMMIT .metadata written and renamed on rank 0, its verdict shared.
 *  load: METADATA .metadata read on rank 0, broadcast, decoded;
 *        VERIFY   the request checked against it (keys, kinds, shapes,
 *                 dtypes, tiling), agreed;
 *        READ     values and tensor bytes read from the data files, each
 *                 record's CRC checked as its bytes pass (the CRC is fused
 *                 with the reads and counted here), boxes copied into the
 *                 caller's buffers as they arrive;
 *        COPY     the loaded entries handed back to stateful entries and
 *                 their load_state_dict run, agreed;
 *        EXCHANGE (read-once load, see dcp_load) chunks several ranks need
 *                 read by one and forwarded: planned, read, sent and
 *                 received (its time is also inside READ's).
 */
enum dcp_phase {
    DCP_PHASE_PLAN = 0,
    DCP_PHASE_STAGE = 1,
    DCP_PHASE_WRITE = 2,
    DCP_PHASE_FSYNC = 3,
    DCP_PHASE_AGREE = 4,
    DCP_PHASE_COMMIT = 5,
    DCP_PHASE_METADATA = 6,
    DCP_PHASE_READ = 7,
    DCP_PHASE_VERIFY = 8,
    DCP_PHASE_COPY = 9,
    DCP_PHASE_EXCHANGE = 10
};
/* Entries of the arrays of dcp_phase_report (room for appended phases). */
#define DCP_PHASE_MAX 16

/* "plan", "stage", ..., "copy"; "unknown" for any other value. */
DCP_API const char *dcp_phase_name(int phase);

/* Per-rank timings of the last save or load. */
typedef struct dcp_phase_report {
    uint32_t struct_size;
    /* Seconds (CLOCK_MONOTONIC) spent in each phase (indexed by enum
     * dcp_phase; phases of the other operation, and phases the operation
     * did not reach, are 0). A phase that runs more than once adds up. */
    double seconds[DCP_PHASE_MAX];
    /* Bytes of each phase where meaningful: STAGE bytes copied, WRITE and
     * FSYNC the data file's bytes, METADATA the .metadata's bytes, READ
     * tensor bytes this rank read from the data files (CRC-only reads
     * included; the read-once load's reads for other ranks too), EXCHANGE
     * tensor bytes received from other ranks; 0 elsewhere. */
    uint64_t bytes[DCP_PHASE_MAX];
    /* Wall time of the operation on this rank: a load from dcp_load's
     * entry to its return; a save from dcp_save's (dcp_save_async's) entry
     * to the end of its completion (for an async save this includes the
     * caller's time between the call and dcp_request_wait). The phases
     * run one after another, so they sum to at most this, except that an
     * async save whose staging budget is below its tensor bytes overlaps
     * STAGE with WRITE and FSYNC. */
    double wall_seconds;
    /* 1 once the operation has completed (a save in flight: 0). */
    int complete;
} dcp_phase_report;

/*
 * Fills *out (struct_size set by the caller to sizeof(dcp_phase_report))
 * with this rank's timings of the last dcp_save / dcp_save_async (op
 * DCP_IO_SAVE; the save completed most recently, or the one in flight with
 * complete = 0) or dcp_load (DCP_IO_LOAD); all zero before the first.
 * Returns DCP_OK or DCP_EINVAL (NULL arguments, unknown op, struct_size
 * too small). Not collective; call it on the context's thread.
 */
DCP_API int dcp_ctx_phase_report(const dcp_ctx *ctx, int op,
                                 dcp_phase_report *out);

/* What a phase event says. */
enum dcp_event_kind {
    DCP_EVENT_START = 0,   /* a phase begins (bytes 0) */
    DCP_EVENT_END = 1,     /* it ends: bytes and seconds of this run */
    DCP_EVENT_PROGRESS = 2 /* within WRITE of a save, or VERIFY of
                              dcp_verify: bytes done so far (monotone) */
};

typedef struct dcp_event {
    uint32_t struct_size; /* sizeof(dcp_event) of the library */
    int op;               /* DCP_IO_SAVE or DCP_IO_LOAD */
    int phase;            /* enum dcp_phase */
    int kind;             /* enum dcp_event_kind */
    uint64_t bytes;
    double seconds; /* END: the phase's duration; else 0 */
} dcp_event;

/*
 * The event callback: fn(ev, userdata) at the start and end of every phase
 * of every save and load on ctx, and as WRITE progresses (after each
 * record). dcp_verify reports its reading as one VERIFY phase of op
 * DCP_IO_LOAD with PROGRESS after each entry (bytes: the entries' bytes,
 * as dcp_entry_info.nbytes, so far); it does not change the load's
 * dcp_ctx_phase_report. ev is valid during the call only.
 * Threads: phases PLAN, STAGE, AGREE, COMMIT and all load phases call it
 * on the caller's thread (inside dcp_save, dcp_save_async,
 * dcp_request_wait/_test, dcp_load, dcp_verify); WRITE and FSYNC on the
 * context's writer thread, for sync and async saves alike. During an async save
 * whose staging budget is below its tensor bytes, STAGE (caller's thread)
 * and WRITE (writer thread) events come at the same time: fn must then be
 * thread safe. fn must be quick and must not call dcp on ctx (nor free
 * it, nor any state or request of it); it may record, print or post
 * elsewhere. A NULL fn removes the callback. Set it while no save is in
 * flight (DCP_EBUSY otherwise). Returns DCP_OK, DCP_EINVAL (NULL ctx),
 * DCP_EBUSY. Not collective.
 */
typedef void (*dcp_event_fn)(const dcp_event *ev, void *userdata);
DCP_API int dcp_ctx_set_event_callback(dcp_ctx *ctx, dcp_event_fn fn,
                                       void *userdata);

/* ---------------------------------------------------------------------- */
/* Values (non-tensor state: int, float, bool, str, bytes, None, lists,   */
/* tuples and dicts of them)                                              */
/* ---------------------------------------------------------------------- */

typedef struct dcp_value dcp_value;

typedef enum dcp_value_type {
    DCP_VALUE_NONE = 0,
    DCP_VALUE_BOOL = 1,
    DCP_VALUE_INT = 2,
    DCP_VALUE_FLOAT = 3,
    DCP_VALUE_STR = 4,
    DCP_VALUE_BYTES = 5,
    DCP_VALUE_LIST = 6,
    DCP_VALUE_TUPLE = 7,
    DCP_VALUE_DICT = 8
} dcp_value_type;

/*
 * Constructors. Each returns a new value owned by the caller (free it with
 * dcp_value_free, or hand it to a function that takes ownership), or NULL
 * when memory runs out. Strings are UTF-8 and copied; bytes are copied.
 * A str must be well-formed UTF-8 (no overlong form, surrogate, truncated
 * sequence or byte such as 0xff; NUL is allowed, as in a Python str) to be
 * saved: the constructors copy any bytes, and dcp_save refuses the value
 * (DCP_EINVAL naming its key), since neither dcp nor Python could read it
 * back. The same holds for str dict keys (dcp_value_dict_set).
 */
DCP_API dcp_value *dcp_value_none(void);
DCP_API dcp_value *dcp_value_bool(int b);
DCP_API dcp_value *dcp_value_int(int64_t i);
DCP_API dcp_value *dcp_value_float(double d);
DCP_API dcp_value *dcp_value_str(const char *s);
DCP_API dcp_value *dcp_value_strn(const char *s, size_t len);
DCP_API dcp_value *dcp_value_bytes(const void *p, size_t len);
DCP_API dcp_value *dcp_value_list(void);
DCP_API dcp_value *dcp_value_tuple(void);
DCP_API dcp_value *dcp_value_dict(void);

/*
 * Appends item to a list or tuple; takes ownership of item, also on failure.
 * Returns DCP_OK, DCP_EINVAL (not a list/tuple, or item NULL), DCP_ENOMEM.
 */
DCP_API int dcp_value_append(dcp_value *seq, dcp_value *item);

/*
 * Sets dict[key] = item, replacing an existing entry with the same str key;
 * takes ownership of item, also on failure. Returns DCP_OK, DCP_EINVAL,
 * DCP_ENOMEM.
 */
DCP_API int dcp_value_dict_set(dcp_value *dict, const char *key,
                               dcp_value *item);

/* Deep copy; NULL when memory runs out. */
DCP_API dcp_value *dcp_value_copy(const dcp_value *v);

DCP_API void dcp_value_free(dcp_value *v);

/* Accessors. They return the value's content, or 0/NULL for another type.
 * Returned pointers belong to the value. */
DCP_API dcp_value_type dcp_value_type_of(const dcp_value *v);
DCP_API int dcp_value_as_bool(const dcp_value *v);
DCP_API int64_t dcp_value_as_int(const dcp_value *v);
DCP_API double dcp_value_as_float(const dcp_value *v);
/* str and bytes; *len (may be NULL) receives the length. str is also
 * NUL-terminated. */
DCP_API const char *dcp_value_as_str(const dcp_value *v, size_t *len);
DCP_API const void *dcp_value_as_bytes(const dcp_value *v, size_t *len);
/* Items of a list, tuple or dict (number of entries for a dict). */
DCP_API size_t dcp_value_len(const dcp_value *v);
DCP_API const dcp_value *dcp_value_item(const dcp_value *v, size_t i);
/* Dict entry i: its key (any value type) and item. */
DCP_API const dcp_value *dcp_value_dict_key(const dcp_value *v, size_t i);
/* Dict lookup by str key; NULL when absent. */
DCP_API const dcp_value *dcp_value_dict_get(const dcp_value *v,
                                            const char *key);

/* Equality by structure and content (floats compared by bits). */
DCP_API int dcp_value_equal(const dcp_value *a, const dcp_value *b);

/*
 * Renders v as JSON (bytes as {"__bytes__": "<base64>"}, tuples as arrays,
 * non-finite floats as the strings "nan", "inf", "-inf"). On success *out is
 * a NUL-terminated string the caller frees with dcp_free().
 */
DCP_API int dcp_value_to_json(const dcp_value *v, char **out);

/* ---------------------------------------------------------------------- */
/* State: what a rank saves or loads                                      */
/* ---------------------------------------------------------------------- */

typedef struct dcp_state dcp_state;

DCP_API int dcp_state_create(dcp_state **out);
DCP_API void dcp_state_free(dcp_state *st);

/*
 * Marks st as failed on this rank: a rank that could not build its state
 * (an entry it cannot describe, a callback of the program's that threw)
 * still makes the collective call, and every rank fails alike. dcp_save,
 * dcp_save_async and dcp_load given st then fail on every rank, before
 * anything is written or read, with code and "rank R failed: msg" (R the
 * lowest failing rank; with one rank, msg), as for any failure of one
 * rank; the other ranks' states are not looked at beyond that. code: a negative DCP_E* code (any
 * other value is taken as DCP_EINVAL); msg is copied (NULL or empty: "state
 * failed"; cut at the error message's length). The mark stays until the
 * state is freed; a second call replaces it. Returns DCP_OK, DCP_EINVAL
 * (NULL st), DCP_ENOMEM. Not collective; thread safety as for the state.
 */
DCP_API int dcp_state_fail(dcp_state *st, int code, const char *msg);

/*
 * Keys. Every key (each pushed component, name and flattened dict key)
 * must be well-formed UTF-8 without NUL: the functions below take any
 * bytes, and dcp_save refuses a state holding a key that is not (DCP_EINVAL,
 * the message naming the key with its bad bytes escaped, e.g. "a\xff.w"),
 * before anything is written. Other characters, '.', '/', control
 * characters and non-ASCII text included, are allowed as torch allows them.
 *
 * Nesting. A state is a nested dict, like a PyTorch state_dict. Entries are
 * added under the current path: push a dict key with dcp_state_push, a list
 * index with dcp_state_push_index, go back up with dcp_state_pop. The saved
 * key (FQN) is the path joined with '.', and the path itself is recorded in
 * the checkpoint's planner_data, exactly as PyTorch's flatten_state_dict
 * does: {"model": {"fc.weight": t}} is key "model.fc.weight" with path
 * ("model", "fc.weight").
 * Returns DCP_OK, DCP_EINVAL (pop at the root, NULL name), DCP_ENOMEM.
 */
DCP_API int dcp_state_push(dcp_state *st, const char *name);
DCP_API int dcp_state_push_index(dcp_state *st, int64_t index);
DCP_API int dcp_state_pop(dcp_state *st);

/*
 * Per-rank data. A collective save treats equal keys on several ranks as
 * the same logical entry: a value (or a tensor box) present on several
 * ranks is replicated, written once, and loaded by every rank that asks for
 * it. State that differs from rank to rank under one logical name (an RNG
 * state, a data loader position: PyTorch issue #120356, where torch
 * silently keeps one rank's copy) must therefore carry the rank in its key.
 * dcp_state_push_rank pushes the dict key "rank<rank>" (e.g. "rank3"), so
 *     dcp_state_push_rank(st, dcp_ctx_rank(ctx));
 *     dcp_state_add_value(st, "rng", ...);   -- key "rank3.rng"
 *     dcp_state_pop(st);
 * saves one entry per rank, and a load on the same number of ranks asks
 * each rank for its own key the same way. (A value key whose contents
 * differ between ranks is refused at save time with DCP_EPLAN, so the
 * mistake cannot go unnoticed; replicated tensor boxes are not compared.)
 * Returns DCP_OK, DCP_EINVAL (st NULL, rank < 0), DCP_ENOMEM. Not
 * collective.
 */
DCP_API int dcp_state_push_rank(dcp_state *st, int rank);

/*
 * Adds one local box of a global tensor under the current path.
 *  - name: last path component (may contain '.', e.g. "fc1.weight"), or
 *    NULL to add at the current path itself: after
 *    dcp_state_push(st, "buffers"); dcp_state_push_index(st, 0);
 *    a NULL name adds key "buffers.0" with path ("buffers", 0), as torch
 *    flattens {"buffers": [t0, ...]}. NULL at the root is DCP_EINVAL.
 *  - ndim: 0..DCP_MAX_NDIM; global_shape, offsets and sizes have ndim
 *    elements (may be NULL when ndim is 0). offsets/sizes: the box this
 *    process holds; NULL offsets means all zeros, NULL sizes means the whole
 *    global shape.
 *  - buf: C-contiguous, little-endian elements of the box, borrowed. For a
 *    save it must stay valid and unchanged until the call returns (for
 *    dcp_save_async: until it returns, not until the save completes); for a
 *    load it receives the box's elements. May be NULL for an empty box.
 *  - mem: DCP_MEM_HOST or DCP_MEM_CUDA (every box of a tensor in the
 *    same one).
 * Call again with the same name and another box for a second box of the same
 * tensor: dtype and global shape must agree.
 * Returns DCP_OK, DCP_EINVAL (bad dtype, ndim or mem, box outside the
 * global shape, negative size, dtype/shape/mem disagreeing with an earlier
 * box, the key already used by a value), DCP_ENOMEM.
 */
DCP_API int dcp_state_add_tensor(dcp_state *st, const char *name,
                                 dcp_dtype dtype, int ndim,
                                 const int64_t *global_shape,
                                 const int64_t *offsets, const int64_t *sizes,
                                 void *buf, dcp_mem mem);

/*
 * As dcp_state_add_tensor, for a box whose elements are not packed in
 * memory: element (i0, i1, ...) of the box is at buf + (i0 * strides[0] +
 * i1 * strides[1] + ...) * element size. The interior of a block with
 * ghost cells is such a box: a 64 x 48 interior inside a 66 x 50 array
 * with one ghost layer is sizes {64, 48}, strides {50, 1}, buf at element
 * (1, 1). No packing by the caller: a save gathers the box's elements
 * (into the context's staging buffers, on the calling thread, as for
 * dcp_save_async; it does not write straight from buf as dcp_save does
 * for a packed box), a load scatters each stored chunk's overlap into it
 * and touches no other byte (the ghost cells keep their values). Every
 * other rule of dcp_state_add_tensor holds (the same buffer lifetime, a
 * second box of the same tensor may be packed or strided).
 *  - strides: ndim element strides (not bytes), each >= 0, such that no
 *    two elements of the box share memory (ordered by stride, each at
 *    least the previous dimension's stride times its size; dimensions of
 *    size 0 or 1 are free). NULL, or the C-contiguous strides, is
 *    dcp_state_add_tensor exactly. Negative strides are refused.
 * Returns the codes of dcp_state_add_tensor; DCP_EINVAL also for strides
 * that alias or overflow; DCP_ENOTSUP for a non-contiguous DCP_MEM_CUDA
 * box. Not collective; a state is not thread safe.
 */
DCP_API int dcp_state_add_tensor_strided(dcp_state *st, const char *name,
                                         dcp_dtype dtype, int ndim,
                                         const int64_t *global_shape,
                                         const int64_t *offsets,
                                         const int64_t *sizes,
                                         const int64_t *strides, void *buf,
                                         dcp_mem mem);

/*
 * Adds a non-tensor value under the current path (name as for
 * dcp_state_add_tensor, NULL included); takes ownership of value,
 * also on failure (NULL value gives DCP_ENOMEM, so constructors can be
 * passed straight in). A dict value, or a list holding a dict or a list that
 * would itself be expanded, is flattened into one entry per leaf the way
 * PyTorch's flatten_state_dict does it (an empty dict adds nothing). For a
 * load, the value is a template whose content is replaced by what was saved.
 * Returns DCP_OK, DCP_EINVAL (key already used; a flattened dict key that
 * is not an int or a str, or a str holding NUL, which a loaded dict may
 * have), DCP_ENOMEM.
 */
DCP_API int dcp_state_add_value(dcp_state *st, const char *name,
                                dcp_value *value);

/*
 * Stateful objects: an entry whose content an object produces when it is
 * saved and receives back when it is loaded, like PyTorch's Stateful
 * protocol (state_dict / load_state_dict). Set version =
 * DCP_STATEFUL_OPS_VERSION; members are only appended.
 */
#define DCP_STATEFUL_OPS_VERSION 1
typedef struct dcp_stateful_ops {
    uint32_t version;
    /* --- valid since version 1; both required --- */
    /*
     * Adds the object's entries to st, a fresh empty state, with
     * dcp_state_add_tensor / _add_value / _push / _pop, keys relative to
     * the object (key "pos" of an object added as "loader" is saved as
     * "loader.pos"). Called on the caller's thread by dcp_save and
     * dcp_save_async (once per save, while staging: the object may change
     * as soon as the save call returns; a tensor's buffer must stay valid
     * until then) and by dcp_load (to build the template the load fills:
     * tensor buffers receive the loaded elements, values are replaced).
     * Return 0, or nonzero to fail the save or load (on every rank, nothing
     * committed; the message names the entry and the value returned): a
     * negative DCP_E* code becomes the call's code, any other value
     * DCP_EINVAL. Stateful entries inside st are refused (DCP_EINVAL).
     */
    int (*state_dict)(void *userdata, dcp_state *st);
    /*
     * Called by dcp_load, on the caller's thread, once every rank's load
     * filled the template state_dict built: st holds the loaded values
     * (dcp_state_value with the relative keys) and the tensor buffers
     * state_dict gave hold the loaded elements. st is freed when the call
     * returns: copy what you keep. Nonzero fails the load on every rank,
     * with the code as for state_dict (buffers already hold the loaded
     * data).
     */
    int (*load_state_dict)(void *userdata, const dcp_state *st);
} dcp_stateful_ops;

/*
 * Adds a stateful entry under the current path (name as for
 * dcp_state_add_tensor, NULL included). ops is copied; userdata is passed
 * to both callbacks and must stay valid while the state is used.
 * Returns DCP_OK, DCP_EINVAL (NULL ops, a member NULL, version 0, key
 * already used), DCP_ENOMEM. Not collective.
 */
DCP_API int dcp_state_add_stateful(dcp_state *st, const char *name,
                                   const dcp_stateful_ops *ops, void *userdata);

/*
 * Which operation a stateful callback serves, asked from inside it with
 * the state it was handed: DCP_IO_SAVE (enum dcp_io_op) when state_dict
 * runs for dcp_save or dcp_save_async, DCP_IO_LOAD when state_dict builds
 * the template of dcp_load and in load_state_dict. An
 * object can so, for example, skip work that only a save needs, or
 * allocate the buffers a load fills. Any other state (one the caller
 * made, NULL) gives DCP_EINVAL. Not collective; thread safety as for the
 * state. (Added in place of a new callback signature, so existing
 * dcp_stateful_ops, version 1, need no change.)
 */
DCP_API int dcp_state_op(const dcp_state *st);

/* Number of keys (FQNs) in the state, and key i in insertion order. */
DCP_API size_t dcp_state_count(const dcp_state *st);
DCP_API const char *dcp_state_key(const dcp_state *st, size_t i);

/*
 * The value stored under fqn (after a load: the loaded value), or NULL when
 * there is none. Owned by the state.
 */
DCP_API const dcp_value *dcp_state_value(const dcp_state *st, const char *fqn);

/* ---------------------------------------------------------------------- */
/* Save and load                                                          */
/* ---------------------------------------------------------------------- */

/* Save flags (dcp_save_options.flags). */
enum dcp_save_flags {
    /* Plan this save from scratch, and keep no plan on the context for
     * the next one (see "Plan cache" at dcp_save). Pass the same flags on
     * every rank. */
    DCP_SAVE_NO_PLAN_CACHE = 1 << 0,
    /* Compress every record as torch's FileSystemWriter(_extensions=
     * [ZStandard()]) does: each record's archive as one zstd frame, the
     * metadata naming the "stream.zstd/1" transform (docs/FORMAT.md §9.1);
     * torch 2.13 reads it back (with the zstandard or pyzstd module).
     * Each record is built and compressed in memory (about twice its size
     * at a time), and a compressed record is read whole on load. Without
     * libzstd at build time the save fails with DCP_ENOTSUP. Pass the same
     * flags on every rank. */
    DCP_SAVE_ZSTD = 1 << 1,
    /*
     * Write a rank-local checkpoint, as torch 2.13's dcp.save(...,
     * use_collectives=False) does (docs/FORMAT.md §9.2): rank r writes
     * __<r>_0.distcp and its own __<r>.metadata listing only its own
     * items (a sharded tensor's global shape with rank r's chunks only;
     * every plain tensor and value rank r holds, a replicated one written
     * by every holder into its own file); no .metadata. torch's dcp.load
     * reads it on the same world size (each rank its own __<r>.metadata),
     * dcp_load on any (the ranks' files merged, resharded).
     *
     * The call stays collective, with dcp_save's arguments, planning
     * checks (kinds, dtypes, shapes agree; boxes tile over all ranks;
     * a value key several ranks hold has equal contents: DCP_EPLAN) and
     * agreed return code on every rank. The commit: once every rank's
     * data file is durable, each rank publishes its own __<r>.metadata
     * (temporary, fsync, rename, directory fsync), its own commit point:
     * every rank but 0 first, then, once they all succeeded, rank 0, so
     * __0.metadata appears last and the checkpoint is complete when it
     * does. A save killed in between leaves other ranks' files without
     * __0.metadata, which readers refuse (DCP_EFORMAT, a rank's metadata
     * missing), never loading some ranks' items only. The outcome is
     * agreed: when any rank's commit fails, every rank returns that
     * rank's code; rank 0 removes its __0.metadata (if renamed) first,
     * then the others theirs and their data files, so nothing is left
     * committed. When rank 0 cannot remove its file, every rank keeps
     * its own (a whole checkpoint rather than a part); a removal that
     * fails is named in the message.
     *
     * Refused, on every rank: the flag set on some ranks only
     * (DCP_EINVAL); a save planner with a global hook (DCP_EINVAL: there
     * is no one global plan to show it; item hooks work, the dedup policy
     * is moot as every holder writes); a path that already holds a
     * checkpoint (.metadata or any __<r>.metadata, whatever r):
     * DCP_EEXIST, as the old one could not stay loadable while the ranks
     * commit one by one (remove it first or save elsewhere). Rank 0
     * holds the path's one-writer lock from planning to the end of the
     * commit, as for dcp_save. The plan cache is neither used nor kept.
     * Combines with DCP_SAVE_ZSTD (torch writes rank-local with
     * ZStandard too) and with dcp_save_async (the ranks' commits happen
     * in dcp_request_wait / dcp_request_test). Pass the same flags on
     * every rank.
     *
     * The other way round, a plain dcp_save into a directory holding a
     * rank-local checkpoint (dcp's or torch's) replaces it as it replaces
     * any checkpoint: its data files get fresh names, the rank-local one
     * stays loadable until .metadata commits, then its __<r>.metadata and
     * data files are removed (best effort; dcp_clean removes what is left).
     */
    DCP_SAVE_RANK_LOCAL = 1 << 2
};

/* Options for dcp_save. Zero-initialise and set struct_size. */
typedef struct dcp_save_options {
    uint32_t struct_size;
    /* Skip fsync of data files, .metadata and the directory (faster, not
     * durable; for tests and scratch data only). */
    int no_fsync;
    /* enum dcp_save_flags (default 0); read when struct_size covers it. */
    unsigned flags;
    /* A save planner (dcp_planner.h: rename, skip, cast or transform
     * entries, the dedup policy, a hook on the coordinator's plan), or
     * NULL for the default planner. Borrowed for the call. Read when
     * struct_size covers it. */
    const struct dcp_save_planner *planner;
} dcp_save_options;

/*
 * Saves the state into directory path (created if missing, parents too) in
 * PyTorch DCP's format. Collective over the context's communicator: every
 * rank calls it with its own state and the same path (checked: DCP_EINVAL
 * otherwise) and options. All communication happens on the calling
 * thread.
 *
 * Planning. Each rank describes what it holds (keys, kinds, dtypes, global
 * shapes, boxes, value sizes; not the data) to rank 0, which checks the
 * whole plan before any byte is written:
 *  - every rank holding a key agrees on its kind (tensor or value), dtype,
 *    global shape and nesting path;
 *  - a tensor's boxes, over all ranks, tile its global shape: no overlap, no
 *    gap. A tensor key may be held by some ranks only (FSDP-style) as long
 *    as their boxes tile it;
 *  - a value key may be held by some ranks only; where several ranks hold
 *    it, its contents must be equal (see dcp_state_push_rank for per-rank
 *    data).
 * Replicated data (the same tensor box on several ranks, a value on several
 * ranks) is written once, by one of its holders: the holder with the fewest
 * bytes assigned so far, the largest items placed first, so replicated
 * tensors spread over the ranks instead of all landing on rank 0. Empty
 * boxes at the offsets of a non-empty one are dropped; replicated boxes are
 * assumed to hold equal data (they are not compared).
 *
 * Writing. Each rank that has records to write writes them into its data
 * file __<rank>_0.distcp (a rank with none writes no file) and fsyncs it;
 * then, once every rank's data is durable, rank 0 writes .metadata, the
 * commit record, through a temporary file, fsync, rename and an fsync of
 * the directory. A checkpoint already committed in path stays loadable
 * until the new one commits: when it uses the file names this save would
 * use, every rank writes __<rank>_0.<tag>.distcp instead (one random tag
 * chosen by rank 0), and the old data files are removed only after the
 * commit.
 *
 * Plan cache. The context keeps the plan of its last successful save.
 * When every rank's state has the same structure as then (keys, nesting
 * paths, kinds, dtypes, global shapes, boxes, the pickled size of each
 * value; not the tensors' data, not buffer addresses, not the values'
 * contents) and every rank holds the same values (equal keys and
 * contents on every rank, as a step counter usually is), the save reuses
 * it: one small agreement (an allreduce) replaces the gather of the local
 * plans, rank 0's global plan and the scatter of the assignments. The
 * checkpoint is byte for byte the one a fresh plan writes (but for its
 * random save_id): the values' current bytes, the record extents, the
 * path (another path is fine) and the file names are redone every save.
 * Any difference on any rank, a value held by some ranks only or with
 * different contents on different ranks, a failed previous save or
 * DCP_SAVE_NO_PLAN_CACHE on any rank makes every rank plan afresh, with
 * every check above. dcp_ctx_plan_cached says which happened. The kept
 * plan costs memory between saves: on each rank a copy of its local plan
 * (tens of bytes per box) and its assignment; on rank 0 the whole global
 * plan (about 1 GiB at 4096 ranks x 2000 tensors, bench/RESULTS.md);
 * a save with DCP_SAVE_NO_PLAN_CACHE, or dcp_ctx_free, frees it.
 *
 * Data goes to the files with O_DIRECT where the filesystem allows it
 * (dcp_ctx_io_report): a host tensor whose buffer is 4096-byte aligned
 * (posix_memalign, page-aligned allocations) is written straight from it;
 * others are copied through the context's I/O buffers (io_depth x
 * io_block_bytes, 32 MiB with the defaults on files), so a save needs
 * little memory beyond the state either way; CUDA tensors pass through the context's staging
 * buffers.
 *
 * The buffers are read during the call only. dcp_save is dcp_save_async
 * followed by dcp_request_wait, and the same rules hold: a save still in
 * flight on the context is completed first, all communication happens on
 * the calling thread, file I/O on the context's background thread.
 * Returns, on every rank the same code: DCP_OK, DCP_EINVAL (also: a key
 * that is not UTF-8 without NUL, a str in a value that is not UTF-8; the
 * message names the key), DCP_EPLAN (an
 * invalid plan: the message names the key and the ranks involved),
 * DCP_EIO, DCP_ENOSPC, DCP_ENOMEM, DCP_ELIMIT, DCP_EEXIST (only with
 * DCP_SAVE_RANK_LOCAL: path already holds a checkpoint), DCP_EBUSY
 * (another writer holds the path's one-writer lock; on S3 also another
 * writer's commit there during the save, below). When a rank fails (bad
 * argument, I/O error, out of memory), every rank returns that rank's code
 * and dcp_errmsg reads "rank R failed: <its message>" on every rank (the
 * lowest failing rank's message; "ranks R to S failed; rank R: ..." when
 * several failed). On failure nothing is committed and the new data files
 * are removed; a checkpoint committed before stays loadable.
 *
 * path may be "s3://bucket/prefix", here and in every call that takes a
 * checkpoint path (dcp_load, dcp_metadata_open, dcp_verify, dcp_export,
 * dcp_import, ...): the checkpoint is then the objects under prefix in an
 * S3 or S3-compatible store (dcp_s3.h; DCP_ENOTSUP in a build without
 * S3). The S3 errors: DCP_EINVAL (refused credentials, bad bucket or key
 * name), DCP_ENOENT (no such bucket or object), DCP_ECORRUPT (the server's
 * answer disagrees with the request), DCP_ETIMEOUT (a stalled server).
 * On S3 the commit is also conditional on the .metadata the save read
 * when it planned: its PUT carries If-None-Match: * when there was none,
 * If-Match with its ETag when there was one, so a checkpoint another
 * writer committed there in between (one that did not take the lock: a
 * writer that is not dcp, or one whose lock was removed as stale) is
 * never replaced: the save fails with DCP_EBUSY naming the object,
 * nothing of it is left, theirs stays (where the store honours the
 * conditions: AWS S3, Ceph's radosgw, moto; when the old .metadata could
 * not be read, or the store answers 501 to the condition, the PUT is
 * unconditional: docs/S3.md).
 */
DCP_API int dcp_save(dcp_ctx *ctx, const dcp_state *st, const char *path,
                     const dcp_save_options *opts);

/* ---------------------------------------------------------------------- */
/* Asynchronous save                                                      */
/* ---------------------------------------------------------------------- */

/* One save in flight: made by dcp_save_async, completed by
 * dcp_request_wait (or dcp_request_test), freed by dcp_request_free. Not
 * thread safe: use it from the thread that uses its context. */
typedef struct dcp_request dcp_request;

/*
 * Starts a save of st into path and returns once the state is staged: from
 * then on the caller may change or free its buffers, its values, its
 * stateful objects and st itself; the checkpoint holds exactly what they
 * held during the call. The data files are written by the context's
 * background thread; dcp_request_wait finishes the save. Collective, with
 * the arguments, checks and planning of dcp_save (all done before the call
 * returns, failures agreed on every rank).
 *
 * Planning happens during the call: the whole plan exchange, or, when
 * the plan of the previous save is reused (see "Plan cache" at dcp_save),
 * one small allreduce and rank 0's directory checks, so that the call's
 * blocking time is then little more than the staging copy.
 *
 * Threads and MPI. Every communication (the plan exchange here; the
 * agreement on the outcome and the commit of .metadata in
 * dcp_request_wait / dcp_request_test) runs on the calling thread. The
 * background thread only copies from staging buffers to files and fsyncs
 * them; it never calls the communicator. So dcp needs no more MPI thread
 * support than the caller's own calls (MPI_THREAD_FUNNELED or less, see
 * dcp_mpi.h).
 *
 * Staging. Host tensors are copied (memcpy) and CUDA tensors copied device
 * to host into the context's staging buffers, which are allocated once,
 * pre-faulted, reused by later saves and released by dcp_ctx_free (the
 * CRC of the records is computed by the background thread, not here). With
 * the staging_budget context option below this rank's tensor bytes, the
 * state is staged in pieces: the call copies as much as fits, then waits
 * for the background writer to drain pieces to the files, copying the next
 * ones as space frees; it returns when the last piece is staged (at most
 * the budget is left to write). Staging memory never exceeds the budget.
 * Values are pickled during the call.
 *
 * One save in flight per context: when a save started on ctx has not been
 * completed yet, this call (like dcp_save and dcp_load on ctx) first waits
 * for it and completes it (collectively: every rank has the same save in
 * flight); its result stays in its request for dcp_request_wait.
 *
 * On success *req receives the request (DCP_OK on every rank); a failure of
 * the background writing or of staging (an I/O error, a CUDA copy error) on
 * any rank is reported by dcp_request_wait on every rank. On failure *req
 * is NULL and nothing was started. Returns the codes of dcp_save's
 * planning: DCP_OK, DCP_EINVAL, DCP_EPLAN, DCP_EIO, DCP_ENOMEM, DCP_ELIMIT,
 * DCP_ENOTSUP (CUDA entries and no libcudart).
 */
DCP_API int dcp_save_async(dcp_ctx *ctx, const dcp_state *st, const char *path,
                           const dcp_save_options *opts, dcp_request **req);

/*
 * Waits for the save's background writing to end on this rank, agrees on
 * the outcome with every rank and, when every rank succeeded, commits the
 * checkpoint (rank 0 writes .metadata, as dcp_save). Collective: every rank
 * waits on its request of the same save. Returns on every rank the same
 * code, the result dcp_save would have returned (DCP_EIO, DCP_ENOSPC, ...
 * of the failing rank, with "rank R failed: ..." in the message); on
 * failure nothing is committed and the new data files are removed.
 * The message is in dcp_request_errmsg(req) and, when this call completed
 * the save, in dcp_errmsg of its context.
 * When the save was already completed (by dcp_request_test, or by a later
 * save or load on the context), returns its stored result without
 * communicating. A second wait on the same request returns DCP_EINVAL
 * ("already waited for"); a request whose context was freed while the save
 * was in flight returns DCP_EINVAL. NULL gives DCP_EINVAL.
 */
DCP_API int dcp_request_wait(dcp_request *req);

/*
 * Tests for completion without waiting for the background writing.
 * Collective: every rank calls it the same number of times (one small
 * agreement per call). When every rank's background writing has ended, it
 * completes the save exactly as dcp_request_wait does and returns its
 * result with *done = 1, on every rank; otherwise it returns DCP_OK with
 * *done = 0 on every rank. On a completed request: *done = 1 and the
 * stored result. NULL req or done: DCP_EINVAL.
 */
DCP_API int dcp_request_test(dcp_request *req, int *done);

/* The message of the save's failure, "" while none is known; owned by the
 * request. */
DCP_API const char *dcp_request_errmsg(const dcp_request *req);

/*
 * Frees a request. Not collective. On a request not yet completed, the
 * save is abandoned on this rank: background writing stopped, its data
 * file removed, nothing committed (do it on every rank alike; a rank
 * waiting on the same save would hang). NULL is a no-op.
 */
DCP_API void dcp_request_free(dcp_request *req);

enum dcp_load_flags {
    /* Missing keys (requested, not in the checkpoint) and unexpected keys (in
     * the checkpoint, not requested) are reported, not errors. */
    DCP_LOAD_PARTIAL = 1 << 0,
    /* Convert stored elements to the requested dtype on copy (otherwise a
     * dtype mismatch is an error). */
    DCP_LOAD_CAST = 1 << 1,
    /* Do not verify the CRC-32 of the stored records. */
    DCP_LOAD_NO_VERIFY = 1 << 2,
    /* Unexpected keys (in the checkpoint, asked for by no rank) are
     * reported by dcp_load_report, not errors; missing keys (asked for,
     * not in the checkpoint) still fail the load with DCP_EKEY. This is
     * PyTorch's default: dcp.load with DefaultLoadPlanner loads a subset
     * of a checkpoint but fails on a key it cannot find. (A library older
     * than this flag ignores the bit and stays strict.) */
    DCP_LOAD_ALLOW_UNEXPECTED = 1 << 3,
    /* Decode and check .metadata afresh, and keep nothing on the context
     * for the next load (see "Plan cache" at dcp_load). (A library older
     * than this flag ignores the bit and has no cache.) */
    DCP_LOAD_NO_PLAN_CACHE = 1 << 4,
    /* Every rank reads the stored chunks its boxes overlap itself, even
     * those other ranks need too (see "Read once" at dcp_load). Set on any
     * rank, it applies to all. (A library older than this flag ignores
     * the bit and always reads per rank.) */
    DCP_LOAD_PER_RANK_READS = 1 << 5,
    /* Requires the read-once load: with more than one rank and a
     * communicator without the point-to-point operations of dcp_comm.h
     * version 2, the load fails with DCP_ENOTSUP on every rank before
     * anything is read (DCP_EINVAL together with DCP_LOAD_PER_RANK_READS).
     * What is read once is the same as without it. (A library older than
     * this flag ignores the bit.) */
    DCP_LOAD_READ_ONCE = 1 << 6,
    /* A restart on more ranks than the save had, with per-rank keys
     * (dcp_state_push_rank): a key under this rank's own prefix
     * "rank<r>." that the checkpoint lacks (a rank the save did not have)
     * is reported missing by dcp_load_report, its buffer or template left
     * as it was, instead of failing the load; every other missing key
     * still fails it (DCP_EKEY). Each rank then starts its own per-rank
     * state afresh where dcp_load_report lists it. (On fewer ranks the
     * dropped ranks' keys are unexpected: DCP_LOAD_ALLOW_UNEXPECTED.) (A
     * library older than this flag ignores the bit and stays strict.) */
    DCP_LOAD_MISSING_RANK_KEYS = 1 << 7,
    /* Read once, small chunks excepted: a shared stored chunk of fewer
     * than DCP_READ_ONCE_SMALL bytes is read by every rank that needs it
     * instead of forwarded (forwarding costs a header and a data message,
     * more than reading a few bytes where messages are slow: a Python
     * communicator, a network). Set on any rank, it applies to all. (A
     * library older than this flag ignores the bit and forwards them.) */
    DCP_LOAD_SMALL_PER_RANK = 1 << 8
};

/* The size under which DCP_LOAD_SMALL_PER_RANK reads a shared chunk on
 * every rank that needs it. */
#define DCP_READ_ONCE_SMALL ((uint64_t)64 << 10)

/* Options for dcp_load. Zero-initialise and set struct_size. */
typedef struct dcp_load_options {
    uint32_t struct_size;
    unsigned flags; /* enum dcp_load_flags */
    /* A load planner (dcp_planner.h: which stored key each entry reads,
     * skips, a post-load hook per tensor box), or NULL for the default
     * planner. Borrowed for the call. Read when struct_size covers it. */
    const struct dcp_load_planner *planner;
} dcp_load_options;

/*
 * Loads the checkpoint in path into the state, in place: every tensor box
 * receives its elements whatever sharding and world size they were saved
 * with, every value template is replaced by the saved value. Collective over
 * the context's communicator, with the same path on every rank (checked:
 * DCP_EINVAL otherwise); each rank passes the state it wants filled
 * (ranks may ask for different keys and boxes; a replicated tensor or a
 * value lands on every rank that asks for it). Rank 0 reads .metadata once
 * and broadcasts it; the stored chunks that overlap a rank's boxes are
 * then read by that rank, or, when other ranks need them too, by one of
 * them and forwarded (see "Read once" below).
 *
 * Strict by default: a missing key (asked for by a rank, not in the
 * checkpoint), an unexpected key (in the checkpoint, asked for by no rank),
 * a kind, global shape or dtype mismatch is an error naming the key (and
 * the rank), found before any buffer is changed; so is a requested tensor
 * whose stored chunks do not tile its shape exactly (a gap or an overlap:
 * DCP_EFORMAT). With DCP_LOAD_PARTIAL,
 * missing keys (this rank's) and unexpected keys (no rank's) are listed by
 * dcp_load_report instead; with DCP_LOAD_ALLOW_UNEXPECTED only unexpected
 * keys are (missing keys remain DCP_EKEY, as in PyTorch's default load).
 * A CRC error is found while copying: the call fails, and the boxes read
 * so far may hold partial data. On S3 the tensors are read in rounds of
 * about 128 MiB (docs/S3.md), so a record that fails to parse (a damaged
 * archive, a record of another save) may likewise be found after earlier
 * rounds' boxes landed.
 *
 * Plan cache. The context keeps the decoded and checked .metadata of its
 * last successful load that reported no missing or unexpected key. A
 * load of the same path with the same flags, whose state has the same
 * structure on every rank (keys, kinds, dtypes, shapes, boxes, the
 * pickled size of each value template) and whose .metadata bytes (read
 * by rank 0 every time) are the same, skips the broadcast, the decoding,
 * the key checks and the planning of the read-once reads (below) after
 * one small agreement; any change anywhere (a new save into path writes a
 * new .metadata, a box moved to another kind of memory) makes every rank
 * decode, check and plan afresh. The data is read and verified as
 * always. The kept .metadata costs memory on every rank (about its
 * decoded size; the read-once plan, when chunks are shared, ranks x
 * chunks bytes and a 4 MiB buffer) until the next load or dcp_ctx_free;
 * DCP_LOAD_NO_PLAN_CACHE disables it.
 * dcp_ctx_plan_cached says which happened.
 *
 * Read once. A stored chunk that two or more ranks need (a replicated
 * tensor, or a chunk that several ranks' boxes overlap) is read and
 * verified by one of them, chosen to balance the bytes each rank reads,
 * and forwarded to the others over the communicator in pieces of 4 MiB,
 * nonblocking, while the reader goes on with its next reads; so a load
 * where every rank asks for everything reads each stored byte once, not
 * once per rank (with DCP_LOAD_SMALL_PER_RANK, chunks under 64 KiB
 * excepted). This needs a communicator with the point-to-point
 * operations of dcp_comm.h version 2 (the MPI one has them; with a user
 * communicator without them, or DCP_LOAD_PER_RANK_READS, every rank reads
 * its own chunks; DCP_LOAD_READ_ONCE makes a communicator without them an
 * error instead). Chunks that a CUDA box overlaps are read per rank. The
 * outcome is the same either way: a read or CRC error on the reading rank
 * fails the load on every rank with that rank's code and message; a rank
 * whose reader failed leaves the boxes of that chunk untouched. It costs a
 * small planning step (each rank's chunk marks, one byte per stored chunk,
 * gathered on rank 0 and broadcast) and staging memory: up to 64 MiB held
 * by a reader's sends in flight, and a buffer per forwarded chunk that
 * does not land whole and contiguous in one box (a resharded or cast
 * chunk). dcp_ctx_phase_report gives the bytes read from storage (READ)
 * and those received from other ranks (EXCHANGE).
 *
 * Returns, on every rank the same code: DCP_OK, DCP_EINVAL, DCP_ENOENT (no
 * checkpoint in path), DCP_EFORMAT, DCP_EUNSAFE, DCP_ECORRUPT, DCP_EKEY,
 * DCP_EMISMATCH, DCP_ELIMIT, DCP_EIO, DCP_ENOMEM, DCP_ENOTSUP (CUDA
 * entries and no libcudart). When ranks fail, every rank returns the
 * lowest failing rank's code and dcp_errmsg reads "rank R failed: <its
 * message>".
 *
 * Stateful entries: their state_dict builds the template before anything
 * is read; their load_state_dict runs after every rank's data landed, and
 * its failure fails the load on every rank. CUDA tensors are read into host
 * memory, then copied to the device. A save in flight on ctx
 * (dcp_save_async) is completed first.
 */
DCP_API int dcp_load(dcp_ctx *ctx, dcp_state *st, const char *path,
                     const dcp_load_options *opts);

/*
 * Keys the last dcp_load on this context reported: which = 0 for missing
 * keys, 1 for unexpected keys. Returns the count; *keys (may be NULL) gets an
 * array owned by the context, valid until the next load.
 */
DCP_API size_t dcp_load_report(const dcp_ctx *ctx, int which,
                               const char *const **keys);

/* ---------------------------------------------------------------------- */
/* Inspection (no communicator needed)                                    */
/* ---------------------------------------------------------------------- */

typedef struct dcp_metadata dcp_metadata;

/*
 * Reads and validates path/.metadata. Not collective; uses only the
 * context's limits and error message.
 * Returns DCP_OK, DCP_ENOENT, DCP_EFORMAT, DCP_EUNSAFE, DCP_ELIMIT, DCP_EIO,
 * DCP_ENOMEM.
 */
DCP_API int dcp_metadata_open(dcp_ctx *ctx, const char *path,
                              dcp_metadata **out);
DCP_API void dcp_metadata_free(dcp_metadata *md);

/* Number of entries, sorted by key. */
DCP_API size_t dcp_metadata_count(const dcp_metadata *md);

/* Information about one entry (index < count). Pointers belong to md. */
typedef struct dcp_entry_info {
    const char *key;
    int is_tensor;     /* 0: a non-tensor value (PyTorch bytes item) */
    dcp_dtype dtype;   /* tensors */
    int ndim;          /* tensors */
    const int64_t *shape; /* global shape, ndim elements */
    size_t nchunks;    /* stored boxes (1 for a value) */
    uint64_t nbytes;   /* element bytes for a tensor, record bytes for a
                          value */
    size_t npath;      /* planner_data path length (0 if absent) */
} dcp_entry_info;

DCP_API int dcp_metadata_entry(const dcp_metadata *md, size_t index,
                               dcp_entry_info *out);

/* Index of key, or -1. */
DCP_API long dcp_metadata_find(const dcp_metadata *md, const char *key);

/*
 * Tensor entries whose dtype dcp cannot read (torch's quantized qint8,
 * quint8, qint32, quint4x2, quint2x4; docs/FORMAT.md): refused per key, so
 * that the checkpoint's other keys stay readable. They are not among the
 * dcp_metadata_count entries (dcp_metadata_find gives -1, a strict load
 * does not call them unexpected); a load naming one fails with
 * DCP_ENOTSUP naming the key and its dtype, a partial one too. Listed
 * here, sorted by key: entry index (< dcp_metadata_unsupported_count) as
 * dcp_metadata_entry gives it, with dtype 0 and nbytes 0, and
 * *dtype_name (may be NULL) torch's name of its dtype ("qint8"); pointers
 * belong to md. Returns DCP_OK, DCP_EINVAL.
 */
DCP_API size_t dcp_metadata_unsupported_count(const dcp_metadata *md);
DCP_API int dcp_metadata_unsupported(const dcp_metadata *md, size_t index,
                                     dcp_entry_info *out,
                                     const char **dtype_name);

/*
 * Whether key can be read from md, with the reason in ctx's message when
 * not: DCP_OK (an entry), DCP_ENOTSUP (a dtype dcp cannot read, named),
 * DCP_EKEY (no such key), DCP_EINVAL. Not collective.
 */
DCP_API int dcp_metadata_check_key(dcp_ctx *ctx, const dcp_metadata *md,
                                   const char *key);

/* One stored box of a tensor entry (chunk < nchunks). offsets and sizes
 * belong to md. file is the data file name relative to the checkpoint. */
typedef struct dcp_chunk_info {
    const int64_t *offsets;
    const int64_t *sizes;
    const char *file;
    uint64_t offset; /* byte offset of the record in file */
    uint64_t length; /* record length in bytes */
} dcp_chunk_info;

DCP_API int dcp_metadata_chunk(const dcp_metadata *md, size_t index,
                               size_t chunk, dcp_chunk_info *out);

/* planner_data path element i of an entry: a str (*str set, *num 0) or an
 * int (*str NULL). */
DCP_API int dcp_metadata_path(const dcp_metadata *md, size_t index, size_t i,
                              const char **str, int64_t *num);

/* The format version string recorded in the checkpoint ("" if absent). */
DCP_API const char *dcp_metadata_version(const dcp_metadata *md);

/*
 * Reads a box of a tensor entry into buf (C-contiguous, little-endian, the
 * stored dtype; capacity len bytes, which must equal the box's byte size).
 * offsets/sizes: ndim elements; NULL means the whole tensor.
 * Returns DCP_OK, DCP_EINVAL, DCP_EFORMAT, DCP_ECORRUPT, DCP_EIO,
 * DCP_ENOMEM. verify: nonzero checks the CRC-32 of the records read.
 */
DCP_API int dcp_metadata_read_box(dcp_ctx *ctx, const dcp_metadata *md,
                                  size_t index, const int64_t *offsets,
                                  const int64_t *sizes, void *buf, size_t len,
                                  int verify);

/* Reads a value entry; *out is owned by the caller (dcp_value_free). */
DCP_API int dcp_metadata_read_value(dcp_ctx *ctx, const dcp_metadata *md,
                                    size_t index, dcp_value **out);

/*
 * Checks a checkpoint completely: every tensor tiled by its chunks (no gap,
 * no overlap, inside the shape), every record's byte range inside its file,
 * every record parsed and every CRC right. Returns DCP_OK or the first
 * problem's code with dcp_errmsg naming the key and file; DCP_ENOTSUP
 * naming the first key of a dtype dcp cannot read
 * (dcp_metadata_unsupported) when everything else verified.
 */
DCP_API int dcp_verify(dcp_ctx *ctx, const char *path);

/* Flags of dcp_clean. */
/* Also remove a lock whose holder cannot be checked (it runs on another
 * host, or the lock names no holder) and what a writer killed while
 * taking a lock over left (".lock.*"). Only when that writer is known to
 * be gone: a lock of a live writer on another host is removed too. */
#define DCP_CLEAN_FORCE 0x1u

/* What dcp_clean removed. Zero-initialise, set struct_size. */
typedef struct dcp_clean_result {
    uint32_t struct_size; /* sizeof(dcp_clean_result) */
    uint32_t reserved0;
    uint64_t files; /* files removed */
    uint64_t bytes; /* their sizes */
} dcp_clean_result;

/*
 * Removes the leftovers of interrupted writers from the checkpoint
 * directory dir: the data files (__<r>_<n>[.<tag>].distcp), their
 * temporaries (<data file>.<pid>-<n>-<hex>.tmp: a peer replica or restore
 * copy of a tier stack killed before its rename) and temporary metadata
 * files (.metadata.tmp, .metadata.<...>.tmp) that no committed .metadata
 * names, and rank-local metadata (__<r>.metadata) beside a
 * committed .metadata, which readers never use (a rank-local checkpoint
 * that a plain save replaced). Never a file the committed checkpoint names, never a
 * file whose name is not one dcp writes (a user's own files stay), never
 * through a symbolic link (links are not listed). On an object store
 * (s3://), also the incomplete multipart uploads of such names directly
 * under the prefix, which a killed writer leaves (counted in files, not
 * in bytes). Takes the directory's
 * one-writer lock (as dcp_save) for the time it runs, so a save or import
 * in progress there is never touched: DCP_EBUSY naming that writer.
 * A lock left by a dead writer of this host is taken over; one of another
 * host needs DCP_CLEAN_FORCE. flags: 0 or DCP_CLEAN_FORCE. res may be
 * NULL. Returns DCP_OK, DCP_EINVAL (NULL ctx or dir, unknown flag,
 * struct_size too small), DCP_ENOENT (no such directory), DCP_EBUSY,
 * DCP_ENOTSUP (the storage back end cannot list), the code of an
 * unreadable .metadata (nothing removed: which files it names is
 * unknown), or the back end's code of a failed removal. Not collective:
 * one process calls it; not thread safe (the context's rule).
 */
DCP_API int dcp_clean(dcp_ctx *ctx, const char *dir, unsigned flags,
                      dcp_clean_result *res);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_H */
