/*
 * The I/O engine (design in ioengine.h).
 *
 * Requests live in a FIFO of depth slots. A request is started when it
 * enters the FIFO (io_uring: prepared and submitted; synchronous engine:
 * run to completion on the spot) and retired from the head, in the order
 * it was issued, once its completion has been seen; a completion that
 * arrives out of order just waits in its slot. Retiring in order is what
 * lets a reader fold a stream's CRC across several requests. Pool buffers
 * are owned by the writer's current buffer or by a request until it is
 * retired.
 *
 * A completion is handled by on_result(), the same for both engines: a
 * short transfer continues with the rest (on the buffered descriptor when
 * the rest is no longer aligned for O_DIRECT), EINTR/EAGAIN retry, EINVAL
 * from an O_DIRECT request moves the file to buffered I/O and redoes the
 * request, a read of 0 bytes is the end of the file. The test hooks
 * (dcp__io_test) are applied there too, so both engines see the same
 * faults.
 */
#define _GNU_SOURCE /* O_DIRECT, statx, fallocate */
#include "ioengine.h"

#include <errno.h>
#include <fcntl.h> /* openat, O_DIRECT */
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h> /* qsort */
#include <string.h>
#include <sys/stat.h> /* fstat, statx */
#include <unistd.h>

#include "crc32.h"
#include "storage.h"

#ifdef DCP_HAVE_LIBURING
#include <liburing.h>
#endif

struct io_test_hooks dcp__io_test;

#define ZC_MIN     ((size_t)64 << 10)    /* smaller tensor data is copied */
#define READ_GAP   ((uint64_t)128 << 10) /* gap read through to coalesce */
#define MAX_OALIGN 65536u

enum { REQ_FREE = 0, REQ_BUSY, REQ_DONE };

struct io_req {
    uint8_t *mem; /* pool buffer or the caller's memory */
    uint64_t off; /* file offset of mem[0] */
    size_t len, done;
    int fd;            /* descriptor used now */
    int bfd;           /* the buffered descriptor (fallbacks) */
    int direct;        /* fd is an O_DIRECT descriptor */
    int *owner_direct; /* the file's "direct" flag, cleared on EINVAL */
    uint32_t oalign, malign;
    int write;
    int blk; /* pool buffer index, or -1 */
    int state;
    int err; /* errno of a failure, or 0 */
    int via;   /* fd is a storage handle: through the back end */
    int async; /* via, run by a pool thread (the back end's max_inflight
                  > 1); state then changes under the pool's lock */
    int drc; /* via: the back end's DCP_E* code of a failure (message in
                the engine's serr) */
    const char *name;
    /* reads: the pieces covered, [p0:pos0, p1:pos1), and the bytes that
     * must be there (the rest may lie past the end of the file) */
    size_t p0, pos0, p1, pos1;
    uint64_t need_end;
};

/*
 * The threads that run via requests concurrently for a back end that
 * accepts more than one at a time (dcp_storage.h, max_inflight): started
 * on demand, up to that limit, and joined whenever the engine drains (its
 * FIFO empties), so none outlives a batch of requests. A queued request is
 * an index into the FIFO; its slot is not reused before it is retired,
 * which waits for it to be done.
 */
#define POOL_MAX 64

struct io_pool {
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t thr[POOL_MAX];
    uint32_t nthr;
    uint32_t *q; /* depth indices, a ring */
    uint32_t qhead, qcount;
    int stop;
    struct io_eng *e;
};

struct io_eng {
    unsigned flags;
    uint32_t depth;
    size_t block;
    int ring_ok; /* the ring is set up */
    int uring;   /* and in use */
#ifdef DCP_HAVE_LIBURING
    struct io_uring ring;
#endif
    struct io_req *req;
    uint32_t head, count;
    uint32_t busy;    /* requests started and not yet complete */
    uint8_t **blocks; /* depth pool buffers, allocated on first use */
    uint8_t *blk_busy;
    char why_uring[128];
    char why_direct[256];
    struct io_stats st;
    struct dcp_err serr; /* the message of a failed via request (under
                            pool.mu while pool threads run) */
    struct io_pool pool;
};

/* ------------------------------------------------------------ helpers */

static uint64_t round_down(uint64_t v, uint64_t a)
{
    return v - v % a;
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return round_down(v + a - 1, a);
}

static int errno_code(int e)
{
    switch (e) {
    case ENOSPC:
    case EDQUOT:
        return DCP_ENOSPC;
    case ENOMEM:
        return DCP_ENOMEM;
    default:
        return DCP_EIO;
    }
}

__attribute__((format(printf, 2, 3))) static void
set_why_direct(struct io_eng *e, const char *fmt, ...)
{
    va_list ap;
    if (e->why_direct[0])
        return; /* the first reason is reported */
    va_start(ap, fmt);
    (void)vsnprintf(e->why_direct, sizeof(e->why_direct), fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------- engine */

int dcp__io_eng_create(struct io_eng **out, unsigned flags, uint32_t depth,
                       size_t block, struct dcp_err *err)
{
    struct io_eng *e;
    *out = NULL;
    if (!depth)
        depth = IO_DEFAULT_DEPTH;
    if (!block)
        block = IO_DEFAULT_BLOCK;
    if (depth > IO_MAX_DEPTH || block < IO_MIN_BLOCK || block > IO_MAX_BLOCK ||
        block % IO_DATA_ALIGN)
        return dcp__err(err, DCP_EINVAL,
                        "bad I/O settings: depth %u (1 to %u), block %zu "
                        "bytes (a multiple of 4096 from 64 KiB to 64 MiB)",
                        depth, IO_MAX_DEPTH, block);
    e = dcp__calloc(1, sizeof(*e));
    if (e) {
        e->req = dcp__calloc(depth, sizeof(*e->req));
        e->blocks = dcp__calloc(depth, sizeof(*e->blocks));
        e->blk_busy = dcp__calloc(depth, 1);
        e->pool.q = dcp__calloc(depth, sizeof(*e->pool.q));
        e->pool.e = e;
        (void)pthread_mutex_init(&e->pool.mu, NULL);
        (void)pthread_cond_init(&e->pool.work, NULL);
        (void)pthread_cond_init(&e->pool.done, NULL);
    }
    if (!e || !e->req || !e->blocks || !e->blk_busy || !e->pool.q) {
        dcp__io_eng_free(e);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    e->flags = flags;
    e->depth = depth;
    e->block = block;

#ifdef DCP_HAVE_LIBURING
    if (flags & IO_NO_URING) {
        (void)snprintf(e->why_uring, sizeof(e->why_uring),
                       "io_uring disabled by DCP_IO_NO_URING");
    } else {
        int r = dcp__io_test.no_uring ? -ENOSYS
                                      : io_uring_queue_init(depth, &e->ring, 0);
        if (r == 0)
            e->ring_ok = e->uring = 1;
        else
            (void)snprintf(e->why_uring, sizeof(e->why_uring),
                           "io_uring unavailable (%s): synchronous I/O",
                           strerror(-r));
    }
#else
    (void)snprintf(e->why_uring, sizeof(e->why_uring),
                   "built without liburing: synchronous I/O");
#endif
    dcp__io_stats_begin(e);
    *out = e;
    return DCP_OK;
}

static void pool_join(struct io_eng *e);

void dcp__io_eng_free(struct io_eng *e)
{
    uint32_t i;
    if (!e)
        return;
    pool_join(e);
    (void)pthread_cond_destroy(&e->pool.done);
    (void)pthread_cond_destroy(&e->pool.work);
    (void)pthread_mutex_destroy(&e->pool.mu);
    dcp__free(e->pool.q);
#ifdef DCP_HAVE_LIBURING
    if (e->ring_ok)
        io_uring_queue_exit(&e->ring);
#endif
    if (e->blocks)
        for (i = 0; i < e->depth; i++)
            dcp__free(e->blocks[i]);
    dcp__free(e->blocks);
    dcp__free(e->blk_busy);
    dcp__free(e->req);
    dcp__free(e);
}

void dcp__io_stats_begin(struct io_eng *e)
{
    uint32_t i;
    uint64_t held = 0;
    memset(&e->st, 0, sizeof(e->st));
    e->st.direct = -1;
    e->st.uring = -1;
    e->why_direct[0] = '\0';
    dcp__err_clear(&e->serr);
    for (i = 0; i < e->depth; i++)
        if (e->blocks[i])
            held += e->block;
    e->st.buffer_bytes = held;
}

void dcp__io_stats_get(const struct io_eng *e, struct io_stats *out)
{
    *out = e->st;
    out->fallback[0] = '\0';
    if (e->st.direct == 0 && e->why_direct[0])
        (void)snprintf(out->fallback, sizeof(out->fallback), "%s",
                       e->why_direct);
    if (e->st.uring == 0)
        (void)snprintf(out->fallback + strlen(out->fallback),
                       sizeof(out->fallback) - strlen(out->fallback), "%s%s",
                       out->fallback[0] ? "; " : "", e->why_uring);
}

/* A free pool buffer (allocated on first use), or -1 when all are busy;
 * *rc is set when allocation fails. */
static int blk_get(struct io_eng *e, int *rc)
{
    uint32_t i;
    for (i = 0; i < e->depth; i++) {
        if (e->blk_busy[i])
            continue;
        if (!e->blocks[i]) {
            e->blocks[i] = dcp__malloc_aligned(MAX_OALIGN, e->block);
            if (!e->blocks[i]) {
                *rc = DCP_ENOMEM;
                return -1;
            }
            e->st.buffer_bytes += e->block;
        }
        e->blk_busy[i] = 1;
        return (int)i;
    }
    return -1;
}

static void blk_put(struct io_eng *e, int b)
{
    if (b >= 0)
        e->blk_busy[b] = 0;
}

/* ----------------------------------------------------------- requests */

/* The hooks of dcp__io_test, applied to a completion of res bytes. */
static int apply_hooks(const struct io_req *r, int res)
{
    const struct io_test_hooks *h = &dcp__io_test;
    uint64_t cur = r->off + r->done;
    if (r->write && h->fail_at && res >= 0) {
        uint64_t room = h->fail_at > cur ? h->fail_at - cur : 0;
        if (r->direct)
            room = round_down(room, r->oalign);
        if (room == 0)
            return -(h->fail_errno ? h->fail_errno : ENOSPC);
        if ((uint64_t)res > room)
            res = (int)room;
    }
    if (h->short_io && res > 0 && (size_t)res > h->short_io) {
        size_t cap = h->short_io;
        if (r->direct) {
            cap = (size_t)round_down(cap, r->oalign);
            if (cap == 0)
                cap = r->oalign;
        }
        if ((size_t)res > cap)
            res = (int)cap;
    }
    return res;
}

static void fall_back(struct io_eng *e, struct io_req *r)
{
    r->direct = 0;
    r->fd = r->bfd;
    if (r->owner_direct)
        *r->owner_direct = 0;
    e->st.direct = 0;
    set_why_direct(e, "'%s': O_DIRECT request refused (%s): buffered I/O",
                   r->name, strerror(EINVAL));
}

/* Handles a completion of res bytes (or -errno). Returns 1 when the rest
 * of the request must be started again, 0 when it is finished. */
static int on_result(struct io_eng *e, struct io_req *r, int res)
{
    res = apply_hooks(r, res);
    if (res == -EINTR || res == -EAGAIN)
        return 1;
    if (res == -EINVAL && r->direct) {
        fall_back(e, r);
        return 1;
    }
    if (res < 0) {
        r->err = -res;
        return 0;
    }
    if (res == 0) {
        if (r->write)
            r->err = EIO; /* no progress */
        return 0;         /* reads: end of file */
    }
    r->done += (size_t)res;
    e->st.bytes += (uint64_t)res;
    if (r->done >= r->len)
        return 0;
    /* Short: the rest, through the page cache if it is no longer aligned. */
    if (r->direct && ((r->off + r->done) % r->oalign ||
                      (uintptr_t)(r->mem + r->done) % r->malign ||
                      (r->len - r->done) % r->oalign)) {
        r->direct = 0;
        r->fd = r->bfd;
    }
    return 1;
}

static void mark_done(struct io_eng *e, struct io_req *r)
{
    r->state = REQ_DONE;
    e->busy--;
}

/* The rest of r, n bytes, through the storage back end's write_at/read_at,
 * which transfer everything or fail (dcp_storage.h): DCP_OK or its code
 * with err filled. No lock is held; the caller records the outcome. */
static int via_io(const struct io_req *r, size_t n, struct dcp_err *err)
{
    dcp__err_clear(err);
    if (r->write)
        return dcp__fs_pwrite(r->fd, r->mem + r->done, n, r->off + r->done,
                              r->name, err);
    return dcp__fs_pread(r->fd, r->mem + r->done, n, r->off + r->done,
                         r->name, err);
}

/* Runs r through the back end on the calling thread. */
static void exec_via(struct io_eng *e, struct io_req *r)
{
    size_t n = r->len - r->done;
    struct dcp_err err;
    int rc = via_io(r, n, &err);
    if (rc == DCP_OK) {
        r->done = r->len;
        e->st.bytes += n;
    } else {
        r->err = EIO;
        r->drc = rc;
        (void)pthread_mutex_lock(&e->pool.mu);
        if (!e->serr.msg[0])
            e->serr = err;
        (void)pthread_mutex_unlock(&e->pool.mu);
    }
    mark_done(e, r);
}

/* ------------------------------------------------------ the pool */

/* A pool thread: runs queued requests through the back end until told to
 * stop. Touches only the request it runs, and the engine's pool and serr
 * under the lock. */
static void *pool_main(void *arg)
{
    struct io_eng *e = arg;
    struct io_pool *p = &e->pool;
    (void)pthread_mutex_lock(&p->mu);
    for (;;) {
        struct io_req *r;
        struct dcp_err err;
        size_t n;
        int rc;
        while (!p->stop && p->qcount == 0)
            (void)pthread_cond_wait(&p->work, &p->mu);
        if (p->qcount == 0)
            break; /* stop, and nothing left */
        r = &e->req[p->q[p->qhead]];
        p->qhead = (p->qhead + 1) % e->depth;
        p->qcount--;
        (void)pthread_mutex_unlock(&p->mu);
        n = r->len - r->done;
        rc = via_io(r, n, &err);
        (void)pthread_mutex_lock(&p->mu);
        if (rc == DCP_OK) {
            r->done = r->len;
        } else {
            r->err = EIO;
            r->drc = rc;
            if (!e->serr.msg[0])
                e->serr = err;
        }
        r->state = REQ_DONE;
        (void)pthread_cond_broadcast(&p->done);
    }
    (void)pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Stops and joins the pool's threads (the FIFO is empty, or the engine is
 * going away). */
static void pool_join(struct io_eng *e)
{
    struct io_pool *p = &e->pool;
    uint32_t i, n;
    if (!p->e || p->nthr == 0)
        return;
    (void)pthread_mutex_lock(&p->mu);
    p->stop = 1;
    n = p->nthr;
    (void)pthread_cond_broadcast(&p->work);
    (void)pthread_mutex_unlock(&p->mu);
    for (i = 0; i < n; i++)
        (void)pthread_join(p->thr[i], NULL);
    p->nthr = 0;
    p->stop = 0;
}

/*
 * Queues r to the pool when its back end accepts more than one request at
 * a time, starting a thread if fewer than its limit run; returns 0 (r must
 * run synchronously) for a back end that accepts one, when no thread can
 * be started, or when more threads run than its limit allows (a back end
 * with a lower limit than one used before in this batch).
 */
static int pool_submit(struct io_eng *e, struct io_req *r)
{
    struct io_pool *p = &e->pool;
    uint32_t lim = dcp__fs_max_inflight(r->fd);
    if (lim > e->depth)
        lim = e->depth;
    if (lim > POOL_MAX)
        lim = POOL_MAX;
    if (lim <= 1 || p->nthr > lim)
        return 0;
    if (p->nthr < lim && p->nthr < e->busy) { /* busy counts r */
        /* The thread reads nothing of the engine before taking the lock. */
        if (pthread_create(&p->thr[p->nthr], NULL, pool_main, e) == 0)
            p->nthr++;
        else if (p->nthr == 0)
            return 0;
    }
    r->async = 1;
    (void)pthread_mutex_lock(&p->mu);
    p->q[(p->qhead + p->qcount) % e->depth] = (uint32_t)(r - e->req);
    p->qcount++;
    (void)pthread_cond_signal(&p->work);
    (void)pthread_mutex_unlock(&p->mu);
    return 1;
}

/* Waits for the pool to finish r, then counts it as the engine's. */
static void pool_wait(struct io_eng *e, struct io_req *r)
{
    struct io_pool *p = &e->pool;
    (void)pthread_mutex_lock(&p->mu);
    while (r->state != REQ_DONE)
        (void)pthread_cond_wait(&p->done, &p->mu);
    (void)pthread_mutex_unlock(&p->mu);
    e->busy--;
    if (!r->drc)
        e->st.bytes += r->len;
    r->async = 0; /* counted */
}

/* The refuse_direct == 2 hook: an O_DIRECT request refused with EINVAL
 * before any byte moves, as a filesystem refuses it. (Refusing it after the
 * transfer would leave a direct write racing the buffered redo of the same
 * bytes, which the kernel reports as EIO at fsync.) */
static int hook_refuses(const struct io_req *r)
{
    return r->direct && dcp__io_test.refuse_direct == 2;
}

/* Runs the rest of r with pread/pwrite. */
static void exec_sync(struct io_eng *e, struct io_req *r)
{
    if (r->via) {
        if (!pool_submit(e, r))
            exec_via(e, r);
        return;
    }
    for (;;) {
        size_t n = r->len - r->done;
        ssize_t k;
        int res;
        if (n > (size_t)1 << 30)
            n = (size_t)1 << 30; /* keeps res in an int */
        if (hook_refuses(r)) {
            if (!on_result(e, r, -EINVAL))
                break;
            continue;
        }
        if (r->write)
            k = pwrite(r->fd, r->mem + r->done, n, (off_t)(r->off + r->done));
        else
            k = pread(r->fd, r->mem + r->done, n, (off_t)(r->off + r->done));
        res = k < 0 ? -errno : (int)k;
        if (!on_result(e, r, res))
            break;
    }
    mark_done(e, r);
}

#ifdef DCP_HAVE_LIBURING
/* Prepares and submits the rest of r on the ring; runs it synchronously if
 * the ring refuses it. */
static void start_uring(struct io_eng *e, struct io_req *r)
{
    struct io_uring_sqe *sqe;
    size_t n = r->len - r->done;
    int tries = 0, ret;
    if (hook_refuses(r)) {
        exec_sync(e, r);
        return;
    }
    sqe = io_uring_get_sqe(&e->ring);
    if (!sqe) { /* cannot happen: one entry per slot, submitted at once */
        exec_sync(e, r);
        return;
    }
    if (n > (size_t)1 << 30)
        n = (size_t)1 << 30;
    if (r->write)
        io_uring_prep_write(sqe, r->fd, r->mem + r->done, (unsigned)n,
                            r->off + r->done);
    else
        io_uring_prep_read(sqe, r->fd, r->mem + r->done, (unsigned)n,
                           r->off + r->done);
    io_uring_sqe_set_data64(sqe, (uint64_t)(r - e->req));
    do {
        ret = io_uring_submit(&e->ring);
    } while ((ret == -EINTR || ret == -EAGAIN || ret == -EBUSY) &&
             ++tries < 1000);
    if (ret < 0) {
        /* The entry may still sit in the ring: never submit again (the
         * requests already in flight are still reaped). */
        e->uring = 0;
        (void)snprintf(e->why_uring, sizeof(e->why_uring),
                       "io_uring submission failed (%s): synchronous I/O",
                       strerror(-ret));
        r->err = -ret;
        mark_done(e, r);
    }
}
#endif

static void start(struct io_eng *e, struct io_req *r)
{
#ifdef DCP_HAVE_LIBURING
    if (e->uring && !r->via) {
        start_uring(e, r);
        return;
    }
#endif
    exec_sync(e, r);
}

/* The next free slot; the caller checked e->count < e->depth. */
static struct io_req *slot_next(struct io_eng *e)
{
    struct io_req *r = &e->req[(e->head + e->count) % e->depth];
    memset(r, 0, sizeof(*r));
    r->blk = -1;
    return r;
}

/* Starts r, which slot_next returned and the caller filled in. */
static void issue(struct io_eng *e, struct io_req *r)
{
    r->state = REQ_BUSY;
    e->count++;
    e->busy++;
    e->st.requests++;
    if (e->busy > e->st.max_in_flight)
        e->st.max_in_flight = e->busy;
    start(e, r);
}

/* Waits until the head request is done. */
static void wait_head(struct io_eng *e)
{
    struct io_req *h = &e->req[e->head];
    if (h->async) {
        pool_wait(e, h);
        return;
    }
    while (h->state != REQ_DONE) {
#ifdef DCP_HAVE_LIBURING
        struct io_uring_cqe *cqe;
        struct io_req *r;
        int ret = io_uring_wait_cqe(&e->ring, &cqe);
        if (ret == -EINTR || ret == -EAGAIN)
            continue;
        if (ret < 0) {
            /* Cannot happen with a working ring; give up on the head
             * rather than spin (its buffer stays busy). */
            h->err = -ret;
            mark_done(e, h);
            break;
        }
        r = &e->req[io_uring_cqe_get_data64(cqe) % e->depth];
        ret = cqe->res;
        io_uring_cqe_seen(&e->ring, cqe);
        if (on_result(e, r, ret))
            start(e, r);
        else
            mark_done(e, r);
#else
        h->state = REQ_DONE; /* synchronous: never reached */
#endif
    }
}

static void pop_head(struct io_eng *e)
{
    e->req[e->head].state = REQ_FREE;
    e->head = (e->head + 1) % e->depth;
    e->count--;
    if (e->count == 0)
        pool_join(e); /* drained: no thread outlives the batch */
}

/* Opens name again with O_DIRECT when the filesystem allows it: *dfd and
 * the alignments, or *dfd = -1 (buffered; the reason is recorded).
 * DCP_EUNSAFE when the name no longer is the file fd refers to. */
static int open_direct(struct io_eng *e, int dirfd, const char *name, int fd,
                       int mode, int *dfd, uint32_t *oalign, uint32_t *malign,
                       struct dcp_err *err)
{
    struct stat a, b;
    uint32_t oa = IO_DATA_ALIGN, ma = IO_DATA_ALIGN;
    int d;
    *dfd = -1;
    *oalign = *malign = 1;
    if (e->flags & IO_NO_DIRECT) {
        set_why_direct(e, "O_DIRECT disabled by DCP_IO_NO_DIRECT");
        return DCP_OK;
    }
#ifdef STATX_DIOALIGN
    {
        struct statx sx;
        if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
            (sx.stx_mask & STATX_DIOALIGN)) {
            if (sx.stx_dio_offset_align == 0) {
                set_why_direct(e,
                               "'%s': the filesystem does not support "
                               "O_DIRECT: buffered I/O",
                               name);
                return DCP_OK;
            }
            oa = sx.stx_dio_offset_align;
            ma = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : 1;
        }
    }
#endif
    if (oa > MAX_OALIGN || (oa & (oa - 1)) || ma > MAX_OALIGN ||
        (ma & (ma - 1)) || e->block % oa) {
        set_why_direct(e, "'%s': O_DIRECT alignment %u too large: buffered I/O",
                       name, oa);
        return DCP_OK;
    }
    if (dcp__io_test.refuse_direct == 1) {
        d = -1;
        errno = EINVAL;
    } else {
        d = openat(dirfd, name, mode | O_DIRECT | O_CLOEXEC | O_NOFOLLOW);
    }
    if (d < 0) {
        set_why_direct(e, "'%s': O_DIRECT refused (%s): buffered I/O", name,
                       strerror(errno));
        return DCP_OK;
    }
    if (fstat(fd, &a) != 0 || fstat(d, &b) != 0 || a.st_dev != b.st_dev ||
        a.st_ino != b.st_ino) {
        (void)close(d);
        return dcp__err(err, DCP_EUNSAFE, "'%s' was replaced while it was open",
                        name);
    }
    *dfd = d;
    *oalign = oa;
    *malign = ma;
    return DCP_OK;
}

static void note_file(struct io_eng *e, int direct)
{
    e->st.files++;
    if (e->st.direct != 0)
        e->st.direct = direct;
    if (e->st.uring < 0)
        e->st.uring = e->uring;
}

/* ------------------------------------------------------------ writing */

/* Retires the head request of a writer: its error becomes the writer's. */
static void w_retire(struct io_writer *w)
{
    struct io_eng *e = w->e;
    struct io_req *r = &e->req[e->head];
    wait_head(e);
    if (r->drc && w->rc == DCP_OK)
        w->rc = dcp__err(w->err, r->drc, "%s", e->serr.msg);
    else if (r->err && w->rc == DCP_OK)
        w->rc = dcp__err(w->err, errno_code(r->err),
                         "cannot write '%s' at byte %" PRIu64 ": %s", w->name,
                         r->off + r->done, strerror(r->err));
    blk_put(e, r->blk);
    pop_head(e);
}

int dcp__iow_open(struct io_writer *w, struct io_eng *e, int dirfd,
                  const char *name, int fd, uint64_t size_hint,
                  struct dcp_err *err)
{
    int rc;
    memset(w, 0, sizeof(*w));
    w->e = e;
    w->name = name;
    w->err = err;
    w->fd = fd;
    w->dfd = -1;
    w->blk = -1;
    w->oalign = w->malign = 1;
    if (dcp__fs_raw_fd(fd) < 0 || dcp__fs_raw_fd(dirfd) < 0) {
        /* Another storage back end: its write_at (concurrently when it
         * accepts several requests: pool_submit). */
        w->via = 1;
        set_why_direct(e, "'%s': storage back end without descriptors: "
                       "its own writes", name);
        note_file(e, 0);
        return DCP_OK;
    }
    w->fd = fd = dcp__fs_raw_fd(fd);
    rc = open_direct(e, dcp__fs_raw_fd(dirfd), name, fd, O_WRONLY, &w->dfd,
                     &w->oalign, &w->malign, err);
    if (rc != DCP_OK)
        return rc;
    w->direct = w->dfd >= 0;
    note_file(e, w->direct);
    /* Best effort: a filesystem without fallocate, or a full disk, shows
     * up in the writes themselves. */
    if (size_hint && size_hint <= INT64_MAX && !dcp__io_test.sparse_zeros &&
        fallocate(fd, 0, 0, (off_t)size_hint) == 0)
        w->truncate = 1;
    return DCP_OK;
}

static int w_direct(const struct io_writer *w)
{
    return w->direct;
}

/* Submits len bytes at mem for file offset off; blk is the pool buffer
 * that holds them (released when retired) or -1 for the caller's memory. */
static void w_submit(struct io_writer *w, uint8_t *mem, uint64_t off,
                     size_t len, int blk)
{
    struct io_eng *e = w->e;
    struct io_req *r;
    if (w->rc != DCP_OK) {
        blk_put(e, blk);
        return;
    }
    if (blk < 0 && dcp__io_test.sparse_zeros && !w->via && mem[0] == 0 &&
        memcmp(mem, mem + 1, len - 1) == 0) {
        w->truncate = 1; /* a hole; the file length is set at the end */
        return;
    }
    while (e->count >= e->depth)
        w_retire(w);
    r = slot_next(e);
    r->mem = mem;
    r->off = off;
    r->len = len;
    r->write = 1;
    r->blk = blk;
    r->name = w->name;
    r->bfd = w->fd;
    r->via = w->via;
    r->direct = w_direct(w);
    r->fd = r->direct ? w->dfd : w->fd;
    r->oalign = r->direct ? w->oalign : 1;
    r->malign = r->direct ? w->malign : 1;
    r->owner_direct = &w->direct;
    issue(e, r);
}

/* Sends the buffer being filled; with pad (the end of the file) an
 * O_DIRECT buffer is padded with zeros to the alignment, and the file is
 * truncated back at the end. */
static void w_flush_block(struct io_writer *w, int pad)
{
    size_t len = w->blk_len;
    int b = w->blk;
    if (b < 0)
        return;
    w->blk = -1;
    if (len == 0) {
        blk_put(w->e, b);
        return;
    }
    if (pad && w_direct(w) && len % w->oalign) {
        size_t padded = (size_t)round_up(len, w->oalign);
        memset(w->e->blocks[b] + len, 0, padded - len);
        len = padded;
        w->truncate = 1;
    }
    w_submit(w, w->e->blocks[b], w->blk_off, len, b);
}

/* Copies n bytes (zeros when p is NULL) into pool buffers, continuing
 * the CRCs over them when crc is set. */
static int w_copy(struct io_writer *w, const uint8_t *p, size_t n,
                  struct crc_blocks *crc)
{
    struct io_eng *e = w->e;
    while (n > 0 && w->rc == DCP_OK) {
        size_t k;
        uint8_t *dst;
        if (w->blk < 0) {
            int rc = DCP_OK;
            while ((w->blk = blk_get(e, &rc)) < 0 && rc == DCP_OK &&
                   e->count > 0)
                w_retire(w);
            if (w->blk < 0) {
                w->rc = dcp__err(w->err, DCP_ENOMEM,
                                 "out of memory for I/O buffers");
                break;
            }
            /* In O_DIRECT mode off is aligned here: buffers start where the
             * previous one ended (a multiple of the block) or where
             * zero-copy data ended (aligned). */
            w->blk_off = w->off;
            w->blk_len = 0;
        }
        k = e->block - w->blk_len;
        if (k > n)
            k = n;
        dst = e->blocks[w->blk] + w->blk_len;
        if (!p)
            memset(dst, 0, k);
        else if (crc)
            dcp__crcb_update(crc, dst, p, k);
        else
            memcpy(dst, p, k);
        if (p)
            p += k;
        w->blk_len += k;
        w->off += k;
        n -= k;
        e->st.bounce_bytes += k;
        if (w->blk_len == e->block)
            w_flush_block(w, 0);
    }
    return w->rc;
}

int dcp__iow_put(struct io_writer *w, const void *p, size_t n)
{
    return w->rc == DCP_OK ? w_copy(w, p, n, NULL) : w->rc;
}

int dcp__iow_zero(struct io_writer *w, size_t n)
{
    return w->rc == DCP_OK ? w_copy(w, NULL, n, NULL) : w->rc;
}

int dcp__iow_data(struct io_writer *w, const void *p, size_t n, uint32_t *crc)
{
    struct crc_blocks b;
    int rc;
    dcp__crcb_init(&b, 0, NULL, 0);
    b.cur = *crc;
    rc = dcp__iow_data_blocks(w, p, n, &b);
    *crc = b.cur;
    return rc;
}

int dcp__iow_data_blocks(struct io_writer *w, const void *p, size_t n,
                         struct crc_blocks *crc)
{
    struct io_eng *e = w->e;
    const uint8_t *q = p;
    size_t head = 0, body;
    if (w->rc != DCP_OK)
        return w->rc;
    if (w_direct(w)) {
        /* Up to the next aligned offset through the buffer, then the
         * aligned middle from the caller's memory if it is aligned too. */
        head = (size_t)((w->oalign - w->off % w->oalign) % w->oalign);
        if (head > n)
            head = n;
        if (w_copy(w, q, head, crc) != DCP_OK)
            return w->rc;
        q += head;
        n -= head;
        body = (size_t)round_down(n, w->oalign);
        if ((uintptr_t)q % w->malign)
            body = 0;
    } else {
        body = n;
    }
    if (body < ZC_MIN)
        return w_copy(w, q, n, crc);
    w_flush_block(w, 0); /* ends on an aligned offset when direct */
    while (body > 0 && w->rc == DCP_OK) {
        size_t k = body < e->block ? body : e->block;
        /* Cast: the engine writes from mem, it never modifies it. */
        w_submit(w, (uint8_t *)(uintptr_t)q, w->off, k, -1);
        dcp__crcb_update(crc, NULL, q, k); /* while it is in flight */
        e->st.zero_copy_bytes += k;
        w->off += k;
        q += k;
        n -= k;
        body -= k;
    }
    return w->rc == DCP_OK ? w_copy(w, q, n, crc) : w->rc;
}

int dcp__iow_wait(struct io_writer *w)
{
    while (w->e->count > 0)
        w_retire(w);
    return w->rc;
}

int dcp__iow_finish(struct io_writer *w)
{
    struct io_eng *e = w->e;
    if (w->rc == DCP_OK)
        w_flush_block(w, 1);
    blk_put(e, w->blk);
    w->blk = -1;
    while (e->count > 0)
        w_retire(w);
    if (w->rc == DCP_OK && w->truncate && ftruncate(w->fd, (off_t)w->off) != 0)
        w->rc = dcp__err(w->err, errno_code(errno),
                         "cannot set the length of '%s' to %" PRIu64 ": %s",
                         w->name, w->off, strerror(errno));
    if (w->dfd >= 0)
        (void)close(w->dfd);
    w->dfd = -1;
    return w->rc;
}

/* ------------------------------------------------------------ reading */

int dcp__io_rbatch_init(struct io_rbatch *b, int dirfd, size_t nfiles,
                        struct dcp_err *err)
{
    size_t i;
    memset(b, 0, sizeof(*b));
    b->dirfd = dirfd;
    b->files = dcp__calloc(nfiles ? nfiles : 1, sizeof(*b->files));
    if (!b->files)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    b->nfiles = nfiles;
    for (i = 0; i < nfiles; i++) {
        b->files[i].fd = -1;
        b->files[i].dfd = -1;
    }
    return DCP_OK;
}

void dcp__io_rbatch_release(struct io_rbatch *b)
{
    size_t i;
    for (i = 0; b->files && i < b->nfiles; i++)
        if (b->files[i].dfd >= 0)
            (void)close(b->files[i].dfd);
    dcp__free(b->files);
    dcp__free(b->streams);
    dcp__free(b->parts);
    dcp__free(b->bcrc);
    memset(b, 0, sizeof(*b));
}

void dcp__io_rbatch_file(struct io_rbatch *b, size_t idx, const char *name,
                         int fd, uint64_t size)
{
    struct io_rfile *f = &b->files[idx];
    if (f->fd >= 0)
        return;
    f->fd = fd;
    f->name = name;
    f->size = size;
}

static int grow(void **p, size_t *cap, size_t n, size_t size)
{
    size_t nc;
    void *np;
    if (n < *cap)
        return DCP_OK;
    nc = *cap ? *cap * 2 : 64;
    np = dcp__realloc(*p, nc * size);
    if (!np)
        return DCP_ENOMEM;
    *p = np;
    *cap = nc;
    return DCP_OK;
}

int dcp__io_rbatch_stream(struct io_rbatch *b, size_t idx, uint64_t off,
                          uint64_t len, uint32_t crc, int verify,
                          const char *key, uint64_t rec_off, uint32_t *id,
                          struct dcp_err *err)
{
    struct io_rstream *s;
    if (idx >= b->nfiles || b->files[idx].fd < 0 || b->nstreams >= UINT32_MAX)
        return dcp__err(err, DCP_EINVAL, "bad read stream");
    if (grow((void **)&b->streams, &b->capstreams, b->nstreams,
             sizeof(*b->streams)) != DCP_OK)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    s = &b->streams[b->nstreams];
    memset(s, 0, sizeof(*s));
    s->file = (uint32_t)idx;
    s->off = off;
    s->len = len;
    s->crc = crc;
    s->verify = verify;
    s->key = key;
    s->rec_off = rec_off;
    *id = (uint32_t)b->nstreams++;
    return DCP_OK;
}

int dcp__io_rbatch_stream_blocks(struct io_rbatch *b, uint32_t id,
                                 uint64_t bsize, uint64_t blk0,
                                 const uint32_t *crc, size_t n,
                                 struct dcp_err *err)
{
    struct io_rstream *s;
    size_t need;
    if (id >= b->nstreams || bsize == 0)
        return dcp__err(err, DCP_EINVAL, "bad read stream blocks");
    s = &b->streams[id];
    if (n != s->len / bsize + (s->len % bsize != 0) ||
        b->nbcrc > SIZE_MAX / 4 - n)
        return dcp__err(err, DCP_EINVAL, "bad read stream blocks");
    need = b->nbcrc + n;
    if (need > b->capbcrc) {
        size_t nc = b->capbcrc ? b->capbcrc : 256;
        uint32_t *np;
        while (nc < need)
            nc *= 2;
        np = dcp__realloc(b->bcrc, nc * sizeof(*np));
        if (!np)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        b->bcrc = np;
        b->capbcrc = nc;
    }
    memcpy(b->bcrc + b->nbcrc, crc, n * sizeof(*crc));
    s->bsize = bsize;
    s->bcrc_at = b->nbcrc;
    s->blk0 = blk0;
    b->nbcrc = need;
    return DCP_OK;
}

int dcp__io_rbatch_part(struct io_rbatch *b, uint32_t id, uint64_t rel,
                        uint64_t len, void *dst, struct dcp_err *err)
{
    struct io_rstream *s = &b->streams[id];
    struct io_rpart *pt;
    if (len == 0)
        return DCP_OK;
    if (rel > s->len || len > s->len - rel || b->nparts >= UINT32_MAX)
        return dcp__err(err, DCP_EINVAL, "bad read part");
    if (grow((void **)&b->parts, &b->capparts, b->nparts, sizeof(*b->parts)) !=
        DCP_OK)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    pt = &b->parts[b->nparts];
    pt->off = s->off + rel;
    pt->len = len;
    pt->dst = dst;
    pt->stream = id;
    pt->file = s->file;
    pt->seq = (uint32_t)b->nparts++;
    return DCP_OK;
}

/* A piece of a part: read straight into the caller's memory (zc) or
 * through a pool buffer. */
struct piece {
    uint64_t off, len;
    uint8_t *dst;
    uint32_t stream, file;
    int zc;
};

struct rrun {
    struct io_rbatch *b;
    struct io_eng *e;
    struct dcp_err *err;
    struct piece *pc;
    size_t npc;
    size_t pi, pos; /* next byte to request: pieces[pi], offset pos */
    int rc;
};

/* By file, then offset; parts of one stream keep their order. */
static int cmp_part(const void *pa, const void *pb)
{
    const struct io_rpart *a = pa, *b = pb;
    if (a->file != b->file)
        return a->file < b->file ? -1 : 1;
    if (a->off != b->off)
        return a->off < b->off ? -1 : 1;
    return a->seq < b->seq ? -1 : a->seq > b->seq;
}

/* Opens file f with O_DIRECT on first use. */
static int rfile_ready(struct rrun *u, struct io_rfile *f)
{
    int rc;
    if (f->tried)
        return DCP_OK;
    f->tried = 1;
    if (dcp__fs_raw_fd(f->fd) < 0 || dcp__fs_raw_fd(u->b->dirfd) < 0) {
        /* Another storage back end: its read_at (concurrently when it
         * accepts several requests: pool_submit). */
        f->via = 1;
        f->oalign = f->malign = 1;
        set_why_direct(u->e, "'%s': storage back end without descriptors: "
                       "its own reads", f->name);
        note_file(u->e, 0);
        return DCP_OK;
    }
    f->fd = dcp__fs_raw_fd(f->fd);
    rc = open_direct(u->e, dcp__fs_raw_fd(u->b->dirfd), f->name, f->fd,
                     O_RDONLY, &f->dfd, &f->oalign, &f->malign, u->err);
    if (rc != DCP_OK)
        return rc;
    f->direct = f->dfd >= 0;
    note_file(u->e, f->direct);
    return DCP_OK;
}

static void add_piece(struct rrun *u, const struct io_rpart *p, uint64_t off,
                      uint64_t len, int zc)
{
    struct piece *q = &u->pc[u->npc++];
    q->off = off;
    q->len = len;
    q->dst = p->dst ? p->dst + (off - p->off) : NULL;
    q->stream = p->stream;
    q->file = u->b->streams[p->stream].file;
    q->zc = zc;
}

/* Splits the sorted parts into pieces. */
static int make_pieces(struct rrun *u)
{
    struct io_rbatch *b = u->b;
    size_t i;
    u->pc = dcp__malloc((b->nparts * 3 + 1) * sizeof(*u->pc));
    if (!u->pc)
        return dcp__err(u->err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < b->nparts; i++) {
        const struct io_rpart *p = &b->parts[i];
        struct io_rfile *f = &b->files[b->streams[p->stream].file];
        uint64_t end = p->off + p->len, a, z;
        int rc = rfile_ready(u, f);
        if (rc != DCP_OK)
            return rc;
        if (!p->dst) {
            add_piece(u, p, p->off, p->len, 0);
            continue;
        }
        if (!f->direct) {
            add_piece(u, p, p->off, p->len, p->len >= ZC_MIN);
            continue;
        }
        a = round_up(p->off, f->oalign);
        z = round_down(end, f->oalign);
        if (z <= a || z - a < ZC_MIN ||
            (uintptr_t)(p->dst + (a - p->off)) % f->malign) {
            add_piece(u, p, p->off, p->len, 0);
            continue;
        }
        if (a > p->off)
            add_piece(u, p, p->off, a - p->off, 0);
        add_piece(u, p, a, z - a, 1);
        if (end > z)
            add_piece(u, p, z, end - z, 0);
    }
    return DCP_OK;
}

/* Fills r with the next request; 0 when a pool buffer is needed and none
 * is free (or on error, with u->rc set). */
static int next_request(struct rrun *u, struct io_req *r)
{
    struct io_eng *e = u->e;
    const struct piece *q = &u->pc[u->pi];
    struct io_rfile *f = &u->b->files[q->file];
    uint32_t oa = f->direct ? f->oalign : 1;
    r->name = f->name;
    r->bfd = f->fd;
    r->via = f->via;
    r->owner_direct = &f->direct;
    r->p0 = u->pi;
    r->pos0 = u->pos;
    if (q->zc) {
        uint64_t n = q->len - u->pos;
        if (n > e->block)
            n = e->block;
        r->mem = q->dst + u->pos;
        r->off = q->off + u->pos;
        r->len = (size_t)n;
        r->need_end = r->off + n;
        r->direct = f->direct;
        u->pos += n;
        e->st.zero_copy_bytes += n;
    } else {
        uint64_t start = q->off + u->pos, lo = round_down(start, oa);
        uint64_t limit = lo + e->block, end, take;
        int rc = DCP_OK;
        r->blk = blk_get(e, &rc);
        if (r->blk < 0) {
            if (rc != DCP_OK)
                u->rc = dcp__err(u->err, rc, "out of memory for I/O buffers");
            return 0;
        }
        take = q->len - u->pos;
        if (take > limit - start)
            take = limit - start;
        end = start + take;
        u->pos += take;
        /* Whole neighbours that fit in the buffer come along. */
        while (u->pos == q->len && u->pi + 1 < u->npc) {
            const struct piece *n = &u->pc[u->pi + 1];
            if (n->zc || n->file != q->file || n->off < lo ||
                n->off > end + READ_GAP ||
                round_up(n->off + n->len, oa) > limit)
                break;
            u->pi++;
            u->pos = n->len;
            q = n;
            if (n->off + n->len > end)
                end = n->off + n->len;
        }
        r->mem = e->blocks[r->blk];
        r->off = lo;
        r->len = (size_t)(round_up(end, oa) - lo);
        r->need_end = end;
        r->direct = f->direct;
    }
    if (u->pos == u->pc[u->pi].len) {
        u->pi++;
        u->pos = 0;
    }
    r->p1 = u->pi;
    r->pos1 = u->pos;
    r->fd = r->direct ? f->dfd : f->fd;
    r->oalign = r->direct ? f->oalign : 1;
    r->malign = r->direct ? f->malign : 1;
    return 1;
}

/* deliver() for a stream with block CRCs: each block's CRC is checked
 * when its last byte arrives. */
static int deliver_blocks(struct rrun *u, struct io_rstream *s, uint8_t *dst,
                          uint64_t n, const uint8_t *src)
{
    while (n > 0) {
        uint64_t in = s->seen % s->bsize, k = s->bsize - in, blk;
        if (k > n)
            k = n;
        if (src && dst) {
            s->acc = dcp__crc32_copy(s->acc, dst, src, (size_t)k);
            u->e->st.bounce_bytes += k;
        } else {
            s->acc = dcp__crc32(s->acc, src ? src : dst, (size_t)k);
        }
        if (src)
            src += k;
        if (dst)
            dst += k;
        n -= k;
        s->seen += k;
        if (in + k < s->bsize && s->seen < s->len)
            continue;
        blk = (s->seen - 1) / s->bsize;
        if (s->acc != u->b->bcrc[s->bcrc_at + blk])
            return dcp__err(u->err, DCP_ECORRUPT,
                            "'%s': CRC mismatch in block %" PRIu64
                            " of the data in '%s' (record at byte %" PRIu64
                            ", block at byte %" PRIu64 ", %" PRIu64
                            " bytes)",
                            s->key, s->blk0 + blk, u->b->files[s->file].name,
                            s->rec_off, s->off + blk * s->bsize,
                            in + k);
        s->acc = 0;
    }
    return DCP_OK;
}

/* Folds n bytes of a stream into its CRC (copying them to dst from src
 * when src is set) and checks the CRC at the stream's end. */
static int deliver(struct rrun *u, const struct piece *q, uint64_t pos,
                   uint64_t n, const uint8_t *src)
{
    struct io_rstream *s = &u->b->streams[q->stream];
    uint8_t *dst = q->dst ? q->dst + pos : NULL;
    if (s->verify && s->bsize)
        return deliver_blocks(u, s, dst, n, src);
    if (src && dst) {
        if (s->verify)
            s->acc = dcp__crc32_copy(s->acc, dst, src, (size_t)n);
        else
            memcpy(dst, src, (size_t)n);
        u->e->st.bounce_bytes += n;
    } else if (s->verify) {
        s->acc = dcp__crc32(s->acc, src ? src : dst, (size_t)n);
    }
    s->seen += n;
    if (s->verify && s->seen == s->len && s->acc != s->crc)
        return dcp__err(u->err, DCP_ECORRUPT,
                        "'%s': CRC mismatch in '%s' (record at byte %" PRIu64
                        ", data at byte %" PRIu64 ", %" PRIu64 " bytes)",
                        s->key, u->b->files[s->file].name, s->rec_off, s->off,
                        s->len);
    return DCP_OK;
}

/* Retires the head request: checks it, then hands its bytes over. */
static void retire_read(struct rrun *u)
{
    struct io_eng *e = u->e;
    struct io_req *r = &e->req[e->head];
    size_t pi = r->p0, pos = r->pos0;
    wait_head(e);
    if (u->rc == DCP_OK && r->drc)
        u->rc = dcp__err(u->err, r->drc, "%s", e->serr.msg);
    else if (u->rc == DCP_OK && r->err)
        u->rc = dcp__err(u->err, errno_code(r->err),
                         "cannot read '%s' at byte %" PRIu64 ": %s", r->name,
                         r->off + r->done, strerror(r->err));
    if (u->rc == DCP_OK && r->off + r->done < r->need_end)
        u->rc = dcp__err(u->err, DCP_ECORRUPT,
                         "'%s' is truncated: it ends at byte %" PRIu64
                         ", data runs to byte %" PRIu64,
                         r->name, r->off + r->done, r->need_end);
    while (u->rc == DCP_OK && (pi < r->p1 || (pi == r->p1 && pos < r->pos1))) {
        const struct piece *q = &u->pc[pi];
        uint64_t stop = pi < r->p1 ? q->len : r->pos1;
        const uint8_t *src =
            r->blk >= 0 ? r->mem + (q->off + pos - r->off) : NULL;
        u->rc = deliver(u, q, pos, stop - pos, src);
        pi++;
        pos = 0;
    }
    blk_put(e, r->blk);
    pop_head(e);
}

int dcp__io_rbatch_run(struct io_rbatch *b, struct io_eng *e,
                       struct dcp_err *err)
{
    struct rrun u;
    size_t i;
    memset(&u, 0, sizeof(u));
    u.b = b;
    u.e = e;
    u.err = err;
    if (b->nparts == 0)
        return DCP_OK;
    qsort(b->parts, b->nparts, sizeof(*b->parts), cmp_part);
    u.rc = make_pieces(&u);
    while (u.rc == DCP_OK && (u.pi < u.npc || e->count > 0)) {
        while (u.rc == DCP_OK && u.pi < u.npc && e->count < e->depth) {
            struct io_req *r = slot_next(e);
            if (!next_request(&u, r))
                break;
            issue(e, r);
        }
        if (e->count > 0)
            retire_read(&u);
        else if (u.rc == DCP_OK && u.pi < u.npc)
            u.rc = dcp__err(err, DCP_ENOMEM, "no I/O buffer free");
    }
    while (e->count > 0)
        retire_read(&u); /* after an error: wait, deliver nothing */
    for (i = 0; u.rc == DCP_OK && i < b->nstreams; i++)
        if (b->streams[i].verify && b->streams[i].seen != b->streams[i].len)
            u.rc = dcp__err(err, DCP_EIO,
                            "'%s': %" PRIu64 " of %" PRIu64
                            " bytes checked (internal error)",
                            b->streams[i].key, b->streams[i].seen,
                            b->streams[i].len);
    dcp__free(u.pc);
    return u.rc;
}
