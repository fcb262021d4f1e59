/*
 * ioengine: the data path of save and load, between the caller's tensor
 * buffers and the data files.
 *
 * An engine holds an io_uring (when liburing was found at build time and
 * the kernel allows one; otherwise requests run synchronously with
 * pread/pwrite) and a small pool of aligned buffers, depth x block bytes
 * (8 x 4 MiB by default), allocated on first use and kept for the next
 * save or load. It is owned by a context and used by one thread at a
 * time.
 *
 * Each data file is opened a second time with O_DIRECT when the
 * filesystem allows it (statx's STATX_DIOALIGN where the kernel reports it,
 * else the open itself decides); tmpfs on older kernels, FUSE and others
 * refuse, and the file then goes through the page cache. A filesystem that
 * accepts the open but fails a direct request with EINVAL is switched to
 * buffered I/O for the rest of that file, the failed request redone. The
 * descriptor the caller opened (buffered) stays the one that is fsynced,
 * truncated and closed; the engine never closes it.
 *
 * Files are storage handles (storage.h). Those of the built-in POSIX back
 * end are served as above, through their descriptors (dcp__fs_raw_fd);
 * those of any other back end (a user's, the tests' fault-injecting ones)
 * go through the back end's write_at/read_at, with the back end's error
 * codes and messages: one request at a time on the caller's thread, or,
 * for a back end that declares max_inflight > 1 (dcp_storage.h v2), up to
 * that many at once on the engine's own threads (started on demand and
 * joined whenever the FIFO drains), through the same FIFO, so such a back
 * end gets the same batching and depth of requests as io_uring gives POSIX.
 * Requests still retire in issue order.
 *
 * Writing (io_writer): small pieces (zip headers) are copied into the
 * current pool buffer, which goes out as one request when full. Tensor
 * bytes that start on an aligned file offset (the format pads them to
 * 4096) from a buffer aligned as O_DIRECT wants are written straight from
 * the caller's memory in block-sized requests, several in flight, while
 * the CPU computes their CRC; unaligned heads and tails, and whole tensors
 * from unaligned buffers, are copied into the pool with the CRC fused with
 * the copy. With O_DIRECT the last buffer is padded to the alignment and
 * the file truncated back to its length at the end. Buffered files take
 * large tensors straight from the caller's memory too (the kernel copies).
 *
 * Reading (io_rbatch): the caller registers streams (a stored chunk's data
 * bytes and their CRC) and parts (a byte range of a stream and where it
 * goes: a caller's buffer, or nowhere when it is only read to check the
 * CRC). The run sorts the parts by file and offset, reads aligned ranges
 * straight into the caller's buffers where both the file offset and the
 * memory allow it, and coalesces the rest into pool-buffer requests
 * (neighbouring ranges up to a block, small gaps read through); requests
 * are retired in file order so each stream's CRC is folded in order (fused
 * with the copy out of a pool buffer).
 *
 * Every request completes fully or fails: short transfers are resubmitted
 * for the rest (a short read at the end of a file is a truncated file:
 * DCP_ECORRUPT), EINTR/EAGAIN retried. Errors name the file and the byte
 * offset; the first one is kept and later requests are not started, but
 * every request in flight is waited for before a call returns, so no
 * caller memory is referenced afterwards.
 */
#ifndef DCP_IOENGINE_H
#define DCP_IOENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "crc32.h"
#include "util.h"

/* The file offset tensor data is aligned to (docs/FORMAT.md). */
#define IO_DATA_ALIGN 4096u

/* Engine flags (the public DCP_IO_* flags have the same values). */
#define IO_NO_DIRECT 1u
#define IO_NO_URING  2u

#define IO_DEFAULT_DEPTH 8u
#define IO_DEFAULT_BLOCK ((size_t)4 << 20)
#define IO_MAX_DEPTH     64u
#define IO_MIN_BLOCK     ((size_t)64 << 10)
#define IO_MAX_BLOCK     ((size_t)64 << 20)

/* What one save or load did on this rank (dcp_io_report). */
struct io_stats {
    int direct;         /* -1 no data file, 0 some buffered, 1 all direct */
    int uring;          /* -1 unused, 0 synchronous, 1 io_uring */
    char fallback[256]; /* why not O_DIRECT / io_uring, "" if both */
    uint64_t bytes;     /* data-file bytes transferred */
    uint64_t zero_copy_bytes;
    uint64_t bounce_bytes;
    uint64_t requests;
    uint32_t max_in_flight;
    uint32_t files;
    uint64_t buffer_bytes;
};

struct io_eng;

/*
 * Creates an engine: flags IO_NO_DIRECT / IO_NO_URING, depth requests in
 * flight (0: default; at most IO_MAX_DEPTH), block bytes per request and
 * per pool buffer (0: default; a multiple of 4096 within IO_MIN_BLOCK ..
 * IO_MAX_BLOCK). No memory for buffers is taken yet. Returns DCP_OK,
 * DCP_EINVAL, DCP_ENOMEM. An io_uring that cannot be set up is not an
 * error: the engine runs synchronously and says why in its stats.
 */
int dcp__io_eng_create(struct io_eng **out, unsigned flags, uint32_t depth,
                       size_t block, struct dcp_err *err);
void dcp__io_eng_free(struct io_eng *e);

/* Clears the statistics at the start of a save or load; *out receives a
 * copy of them at its end. */
void dcp__io_stats_begin(struct io_eng *e);
void dcp__io_stats_get(const struct io_eng *e, struct io_stats *out);

/* ------------------------------------------------------------ writing */

struct io_writer {
    struct io_eng *e;
    const char *name; /* for messages */
    struct dcp_err *err;
    int fd;           /* the caller's buffered descriptor (borrowed) */
    int dfd;          /* O_DIRECT descriptor, or -1 */
    int direct;       /* requests go through dfd (cleared on EINVAL) */
    uint32_t oalign;  /* file offset alignment (direct) */
    uint32_t malign;  /* memory alignment (direct) */
    uint64_t off;     /* bytes written so far (logical end) */
    int blk;          /* pool buffer being filled, or -1 */
    uint64_t blk_off; /* file offset of its first byte */
    size_t blk_len;
    int truncate; /* the file may end past off: truncate at finish */
    int via;      /* fd is a handle of a storage back end without
                     descriptors: everything through its write_at */
    int rc;       /* first error; sticky */
};

/*
 * Starts writing the data file name, created empty by the caller as fd in
 * dirfd (the engine opens it again with O_DIRECT when it can). size_hint,
 * when nonzero, is an upper bound of the file's final length: the file is
 * allocated that long first (fallocate; its length is set right at the
 * end), so that O_DIRECT writes land inside the file and the filesystem
 * can run them in parallel (ext4 serialises writes that extend a file).
 * Returns DCP_OK or DCP_EUNSAFE; on failure nothing needs finishing.
 */
int dcp__iow_open(struct io_writer *w, struct io_eng *e, int dirfd,
                  const char *name, int fd, uint64_t size_hint,
                  struct dcp_err *err);

/* Appends n bytes copied from p (p may be reused on return). */
int dcp__iow_put(struct io_writer *w, const void *p, size_t n);

/* Appends n zero bytes. */
int dcp__iow_zero(struct io_writer *w, size_t n);

/*
 * Appends n bytes of tensor data from p, continuing *crc over them. p is
 * borrowed until dcp__iow_finish returns and must not change until then.
 */
int dcp__iow_data(struct io_writer *w, const void *p, size_t n, uint32_t *crc);

/* As dcp__iow_data, continuing the per-block and whole CRCs of crc
 * (crc32.h) over the bytes. */
int dcp__iow_data_blocks(struct io_writer *w, const void *p, size_t n,
                         struct crc_blocks *crc);

/*
 * Waits for the requests in flight (not for the bytes still gathered in a
 * pool buffer), so that the memory given to dcp__iow_data so far may be
 * reused. Returns the writer's first error, or DCP_OK.
 */
int dcp__iow_wait(struct io_writer *w);

/*
 * Writes what is pending, waits for every request, truncates the file to
 * its length when O_DIRECT padded it, and closes the O_DIRECT descriptor
 * (not the caller's). Must be called once after a successful open, also
 * after an error. Returns the first error of the whole file, or DCP_OK.
 */
int dcp__iow_finish(struct io_writer *w);

/* ------------------------------------------------------------ reading */

struct io_rfile {
    int fd;     /* the caller's buffered descriptor (borrowed), -1 unset */
    int dfd;    /* O_DIRECT descriptor (owned), -1 */
    int direct; /* requests go through dfd (cleared on EINVAL) */
    int tried;  /* dfd decided */
    int via;    /* fd is a handle of a storage back end without
                   descriptors: everything through its read_at */
    uint32_t oalign, malign;
    uint64_t size; /* at open: a read past it is a truncated file */
    const char *name;
};

struct io_rstream {
    uint32_t file;
    uint64_t off, len; /* the stored bytes in the file */
    uint32_t crc;      /* their expected CRC-32 */
    int verify;        /* parts then cover [off, off+len) in order */
    uint32_t acc;      /* CRC so far */
    uint64_t seen;     /* bytes folded so far */
    const char *key;   /* for messages */
    uint64_t rec_off;  /* the record's offset, for messages */
    uint64_t bsize;    /* nonzero: crc is unused; each bsize bytes (the
                          last may be shorter) are checked against their
                          own CRC, the batch's bcrc[bcrc_at + k] */
    size_t bcrc_at;
    uint64_t blk0;     /* the record's block number of the first one */
};

struct io_rpart {
    uint64_t off; /* file offset */
    uint64_t len;
    uint8_t *dst; /* NULL: read only for the CRC */
    uint32_t stream;
    uint32_t file;
    uint32_t seq; /* order added (keeps a stream's order) */
};

struct io_rbatch {
    int dirfd;
    struct io_rfile *files;
    size_t nfiles;
    struct io_rstream *streams;
    size_t nstreams, capstreams;
    struct io_rpart *parts;
    size_t nparts, capparts;
    uint32_t *bcrc; /* block CRCs of the streams that have them */
    size_t nbcrc, capbcrc;
};

/* An empty batch over nfiles data files in dirfd (borrowed). */
int dcp__io_rbatch_init(struct io_rbatch *b, int dirfd, size_t nfiles,
                        struct dcp_err *err);
void dcp__io_rbatch_release(struct io_rbatch *b);

/* Declares data file idx: its name (borrowed), open buffered descriptor
 * (borrowed) and size. Idempotent. */
void dcp__io_rbatch_file(struct io_rbatch *b, size_t idx, const char *name,
                         int fd, uint64_t size);

/*
 * Adds a stream: len bytes at off of file idx whose CRC-32 is crc. With
 * verify, the parts added next must cover the stream exactly, in order.
 * *id receives the stream's number for dcp__io_rbatch_part.
 */
int dcp__io_rbatch_stream(struct io_rbatch *b, size_t idx, uint64_t off,
                          uint64_t len, uint32_t crc, int verify,
                          const char *key, uint64_t rec_off, uint32_t *id,
                          struct dcp_err *err);

/*
 * Makes stream id (verified) check a CRC per block instead of one for the
 * whole stream: crc[k] is the CRC-32 of bytes [k bsize, (k+1) bsize) of the
 * stream (the last block ends with the stream), n = ceil(len / bsize); the
 * CRCs are copied. blk0 numbers the first block in messages (the block of
 * the record's data the stream starts at). DCP_EINVAL, DCP_ENOMEM.
 */
int dcp__io_rbatch_stream_blocks(struct io_rbatch *b, uint32_t id,
                                 uint64_t bsize, uint64_t blk0,
                                 const uint32_t *crc, size_t n,
                                 struct dcp_err *err);

/* Adds len bytes at offset rel of stream id, going to dst (NULL: only
 * checked). Parts of a stream are added in increasing, disjoint order. */
int dcp__io_rbatch_part(struct io_rbatch *b, uint32_t id, uint64_t rel,
                        uint64_t len, void *dst, struct dcp_err *err);

/* Reads everything; checks the CRCs of verified streams (DCP_ECORRUPT).
 * Returns DCP_OK, DCP_ECORRUPT, DCP_EIO, DCP_ENOMEM. */
int dcp__io_rbatch_run(struct io_rbatch *b, struct io_eng *e,
                       struct dcp_err *err);

/* ------------------------------------------------------------ testing */

/*
 * Fault and shape hooks for tests; zero means off. Not thread safe: set
 * them while no engine is running.
 */
struct io_test_hooks {
    int refuse_direct; /* 1: O_DIRECT opens fail (EINVAL); 2: the first
                          direct request of each file fails (EINVAL) */
    int no_uring;      /* io_uring setup fails (ENOSYS) */
    size_t short_io;   /* a request transfers at most this many bytes per
                          completion (rounded down to the alignment when
                          direct, at least one unit) */
    uint64_t fail_at;  /* a write reaching this file offset fails with
                          fail_errno (short first, then the error) */
    int fail_errno;
    int sparse_zeros; /* zero-copy writes of all-zero requests are
                         skipped, leaving holes (for files over 4 GiB) */
};
extern struct io_test_hooks dcp__io_test;

#endif /* DCP_IOENGINE_H */
