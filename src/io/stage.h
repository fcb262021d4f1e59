/*
 * Staging: the context's cached host buffer (the arena) and the pipe that
 * moves a save's tensor bytes through it, from the caller's thread (the
 * stager, copying from the caller's buffers, host or CUDA) to the worker
 * thread (the writer, draining to the data file).
 *
 * The pipe cuts the sources into pieces placed in the arena used as a ring.
 * Both sides walk the same deterministic piece sequence (stg_iter), so the
 * only shared state is two counters: pieces published by the stager, and
 * the ring position up to which the writer has released. When the arena
 * holds every source, each source is one piece and nothing wraps; the
 * stager then publishes once, at the end, so the writer does not compete
 * with the copy. Otherwise (a budget below the state) pieces are at most a
 * quarter of the ring, published one by one, and the stager waits for
 * space: backpressure. A piece never straddles the ring's end.
 */
#ifndef DCP_STAGE_H
#define DCP_STAGE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* The context's staging buffer: allocated with mmap(MAP_POPULATE), so its
 * pages are faulted in once; page-locked with cudaHostRegister when a save
 * first stages CUDA memory through it. */
struct stg_arena {
    uint8_t *p;
    size_t cap;
    int pinned;
};

/* Reserves at least need bytes (need > 0; a smaller arena is replaced,
 * a larger one kept), pinned when asked. Creates *a when NULL. Returns
 * DCP_OK, DCP_ENOMEM, DCP_ENOTSUP/DCP_EIO (pinning). */
int dcp__stage_arena_reserve(struct stg_arena **a, size_t need, int pinned,
                             struct dcp_err *err);
void dcp__stage_arena_free(struct stg_arena *a);

/* One source: bytes of a tensor box, n > 0. */
struct stg_src {
    const void *p;
    uint64_t n;
    int cuda; /* p is CUDA memory */
    /* When set (host memory), the source is not n bytes at p: gather(ud,
     * off, len, dst) copies bytes [off, off + len) of it to dst (a strided
     * box, ckpt/save.c). */
    void (*gather)(const void *ud, uint64_t off, uint64_t len, void *dst);
    const void *ud;
};

/* Bytes the arena needs to hold every source at once (64-byte aligned
 * pieces). */
uint64_t dcp__stage_need(const struct stg_src *src, size_t n);

struct stg_iter {
    size_t src;   /* source of the next piece */
    uint64_t off; /* bytes of it already cut */
    uint64_t end; /* ring position (monotonic) after the last piece */
    size_t k;     /* pieces cut */
};

struct stg_piece {
    size_t src;
    uint64_t off; /* offset in the source */
    uint64_t len;
    uint64_t pos; /* monotonic ring position; pos % cap in the arena */
    size_t k;
};

struct stg_pipe {
    const struct stg_src *src;
    size_t nsrc;
    uint8_t *ring;
    uint64_t cap;
    uint64_t maxpiece;
    int eager; /* publish every piece (the ring cannot hold everything) */
    /* writer side only */
    struct stg_iter wit;
    struct stg_piece wcur;
    /* shared */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic size_t published;  /* pieces the writer may take */
    _Atomic uint64_t consumed; /* ring position released by the writer */
    _Atomic int stop;          /* set by either side: give up */
    _Atomic int waiters;       /* threads inside a wait */
};

/*
 * Prepares a pipe over src (nsrc sources, borrowed until dcp__stage_run
 * returns) through ring[0, cap) (cap a multiple of 64, at least 64 KiB
 * unless every source fits). Returns DCP_OK or DCP_ENOMEM.
 */
int dcp__stage_pipe_init(struct stg_pipe *p, const struct stg_src *src,
                         size_t nsrc, uint8_t *ring, uint64_t cap,
                         struct dcp_err *err);
void dcp__stage_pipe_destroy(struct stg_pipe *p);

/*
 * Stager, on the caller's thread: copies every piece into the ring,
 * waiting for space when it must. Returns DCP_OK once every piece is
 * published; on a copy failure its code (the pipe is stopped); when the
 * writer stopped the pipe, DCP_EIO "staging stopped".
 */
int dcp__stage_run(struct stg_pipe *p, struct dcp_err *err);

/*
 * Writer: the next piece, waiting until it is published. *src and *off
 * identify it (the writer checks they are what it expects). Returns
 * DCP_OK, or DCP_EIO when the pipe was stopped.
 */
int dcp__stage_next(struct stg_pipe *p, const void **data, size_t *len,
                    size_t *src, uint64_t *off, struct dcp_err *err);

/* Writer: the piece from the last dcp__stage_next is written; its space
 * may be reused. */
void dcp__stage_release(struct stg_pipe *p);

/* Either side, or a canceller: stop the pipe and wake both sides. */
void dcp__stage_stop(struct stg_pipe *p);

#endif /* DCP_STAGE_H */
